//! A header condition of a route match.

use super::value::{InvalidRegex, ValueMatcher};
use gatehouse_ir as ir;
use http::HeaderName;
use http::header::InvalidHeaderName;

#[derive(Debug)]
pub(crate) struct HeaderMatcher {
    pub name: HeaderName,
    pub value: ValueMatcher,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum HeaderMatchError {
    #[error("header name {name:?}: {source}")]
    Name {
        name: String,
        source: InvalidHeaderName,
    },
    #[error("header {name:?}: {source}")]
    Value { name: String, source: InvalidRegex },
}

impl TryFrom<&ir::HeaderMatch> for HeaderMatcher {
    type Error = HeaderMatchError;

    fn try_from(h: &ir::HeaderMatch) -> Result<Self, HeaderMatchError> {
        Ok(HeaderMatcher {
            name: HeaderName::from_bytes(h.name.as_bytes()).map_err(|source| {
                HeaderMatchError::Name {
                    name: h.name.clone(),
                    source,
                }
            })?,
            value: ValueMatcher::try_from(&h.value).map_err(|source| HeaderMatchError::Value {
                name: h.name.clone(),
                source,
            })?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_and_refuses_bad_names_and_regexes() {
        let ok = HeaderMatcher::try_from(&ir::HeaderMatch {
            name: "x-version".into(),
            value: ir::StringMatch::Exact("v2".into()),
        })
        .unwrap();
        assert_eq!(ok.name, "x-version");
        assert!(ok.value.matches_bytes(b"v2"));
        let bad_name = HeaderMatcher::try_from(&ir::HeaderMatch {
            name: "x version".into(),
            value: ir::StringMatch::Exact("v2".into()),
        });
        assert!(matches!(bad_name, Err(HeaderMatchError::Name { .. })));
        let bad_value = HeaderMatcher::try_from(&ir::HeaderMatch {
            name: "x-user".into(),
            value: ir::StringMatch::Regex("(".into()),
        });
        assert!(matches!(bad_value, Err(HeaderMatchError::Value { .. })));
    }
}
