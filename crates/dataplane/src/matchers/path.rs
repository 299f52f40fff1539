//! The path part of a route match: exact, element-wise prefix, or anchored regex.

use super::value::{InvalidRegex, anchored};
use gatehouse_ir as ir;
use regex::Regex;

#[derive(Debug)]
pub(crate) enum PathMatcher {
    Exact(Box<str>),
    /// Stored without a trailing slash, so `/` becomes the empty string and matches every path.
    Prefix(Box<str>),
    Regex(Regex),
}

impl TryFrom<&ir::PathMatch> for PathMatcher {
    type Error = InvalidRegex;

    fn try_from(m: &ir::PathMatch) -> Result<Self, InvalidRegex> {
        Ok(match m {
            ir::PathMatch::Exact(p) => PathMatcher::Exact(p.as_str().into()),
            ir::PathMatch::Prefix(p) => PathMatcher::Prefix(p.trim_end_matches('/').into()),
            ir::PathMatch::Regex(re) => PathMatcher::Regex(anchored(re)?),
        })
    }
}

impl PathMatcher {
    #[inline]
    pub(crate) fn matches(&self, path: &str) -> bool {
        match self {
            PathMatcher::Exact(p) => path == &**p,
            PathMatcher::Prefix(p) => {
                path.starts_with(&**p)
                    && (path.len() == p.len() || path.as_bytes()[p.len()] == b'/')
                    && path.starts_with('/')
            }
            PathMatcher::Regex(re) => re.is_match(path),
        }
    }

    /// Whether both match exactly the same paths because they are the same matcher.
    pub(crate) fn same_as(&self, other: &PathMatcher) -> bool {
        match (self, other) {
            (PathMatcher::Exact(a), PathMatcher::Exact(b))
            | (PathMatcher::Prefix(a), PathMatcher::Prefix(b)) => a == b,
            (PathMatcher::Regex(a), PathMatcher::Regex(b)) => a.as_str() == b.as_str(),
            _ => false,
        }
    }

    /// What `ReplacePrefixMatch` replaces: the prefix for prefix matches, the whole path for
    /// exact ones (it matched as a whole), nothing for regexes.
    pub(crate) fn replaceable_prefix(&self) -> Option<&str> {
        match self {
            PathMatcher::Exact(p) | PathMatcher::Prefix(p) => Some(p),
            PathMatcher::Regex(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(m: ir::PathMatch) -> PathMatcher {
        PathMatcher::try_from(&m).unwrap()
    }

    #[test]
    fn prefix_respects_element_boundaries() {
        let foo = of(ir::PathMatch::Prefix("/foo/".into()));
        assert!(foo.matches("/foo"));
        assert!(foo.matches("/foo/"));
        assert!(foo.matches("/foo/bar"));
        assert!(!foo.matches("/foobar"));
        assert!(!foo.matches("/fo"));
        assert!(!foo.matches("/"));
        let root = of(ir::PathMatch::Prefix("/".into()));
        assert!(root.matches("/"));
        assert!(root.matches("/anything/at/all"));
        assert!(!root.matches("*"));
        assert_eq!(foo.replaceable_prefix(), Some("/foo"));
    }

    #[test]
    fn exact_path() {
        let m = of(ir::PathMatch::Exact("/foo".into()));
        assert!(m.matches("/foo"));
        assert!(!m.matches("/foo/"));
        assert_eq!(m.replaceable_prefix(), Some("/foo"));
    }

    #[test]
    fn regex_must_match_whole_path() {
        let m = of(ir::PathMatch::Regex("/v[0-9]+".into()));
        assert!(m.matches("/v1"));
        assert!(m.matches("/v42"));
        assert!(!m.matches("/v1/extra"));
        assert!(!m.matches("/api/v1"));
        assert_eq!(m.replaceable_prefix(), None);
        // Alternation must not escape the anchors.
        let alt = of(ir::PathMatch::Regex("/a|/b".into()));
        assert!(alt.matches("/a"));
        assert!(!alt.matches("/a/x"));
        assert!(!alt.matches("/x/b"));
        assert!(alt.same_as(&of(ir::PathMatch::Regex("/a|/b".into()))));
        assert!(!alt.same_as(&m));
    }

    #[test]
    fn a_bad_regex_is_refused() {
        assert!(PathMatcher::try_from(&ir::PathMatch::Regex("/[a".into())).is_err());
    }
}
