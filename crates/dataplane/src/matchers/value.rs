//! A header or query value as a route matches it: exactly, or by an anchored regex.

use gatehouse_ir as ir;
use regex::Regex;

#[derive(Debug)]
pub(crate) enum ValueMatcher {
    Exact(Box<str>),
    Regex(Regex),
}

/// A regular expression of the IR that does not compile (translate checks them all, so this
/// only happens with an IR from elsewhere).
#[derive(Debug, thiserror::Error)]
#[error("invalid regular expression {pattern:?}: {source}")]
pub(crate) struct InvalidRegex {
    pub pattern: String,
    pub source: regex::Error,
}

/// Compiles `re` so that it must match a whole path or value (see `ir::anchored_regex`).
pub(crate) fn anchored(re: &str) -> Result<Regex, InvalidRegex> {
    Regex::new(&ir::anchored_regex(re)).map_err(|source| InvalidRegex {
        pattern: re.to_string(),
        source,
    })
}

impl TryFrom<&ir::StringMatch> for ValueMatcher {
    type Error = InvalidRegex;

    fn try_from(m: &ir::StringMatch) -> Result<Self, InvalidRegex> {
        Ok(match m {
            ir::StringMatch::Exact(v) => ValueMatcher::Exact(v.as_str().into()),
            ir::StringMatch::Regex(re) => ValueMatcher::Regex(anchored(re)?),
        })
    }
}

impl ValueMatcher {
    pub(crate) fn matches_bytes(&self, value: &[u8]) -> bool {
        match self {
            ValueMatcher::Exact(v) => value == v.as_bytes(),
            ValueMatcher::Regex(re) => std::str::from_utf8(value).is_ok_and(|v| re.is_match(v)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_and_anchored_regex() {
        let exact = ValueMatcher::try_from(&ir::StringMatch::Exact("v2".into())).unwrap();
        assert!(exact.matches_bytes(b"v2"));
        assert!(!exact.matches_bytes(b"v22"));
        let re = ValueMatcher::try_from(&ir::StringMatch::Regex("adm.n|root".into())).unwrap();
        assert!(re.matches_bytes(b"admin"));
        assert!(re.matches_bytes(b"root"));
        assert!(!re.matches_bytes(b"administrator"), "anchored at the end");
        assert!(
            !re.matches_bytes(b"xroot"),
            "the alternation stays inside the anchors"
        );
        assert!(
            !re.matches_bytes(b"\xff"),
            "non-UTF-8 values never match a regex"
        );
    }

    #[test]
    fn a_bad_regex_is_a_typed_error() {
        let err = ValueMatcher::try_from(&ir::StringMatch::Regex("(".into())).unwrap_err();
        assert_eq!(err.pattern, "(");
        assert!(
            err.to_string()
                .starts_with("invalid regular expression \"(\"")
        );
    }
}
