//! Route matchers as the router runs them. Each type sits beside its conversion from the IR
//! (`TryFrom<&ir::…>` with a typed error) and its tests; the compiler only calls the
//! conversions. Everything here runs per request, on borrowed slices of the request: no
//! allocation, except decoding a query value that has escapes for a regex.

mod header;
mod path;
mod query;
mod value;

pub(crate) use header::{HeaderMatchError, HeaderMatcher};
pub(crate) use path::PathMatcher;
pub(crate) use query::{LazyQuery, QueryMatcher};
pub(crate) use value::{InvalidRegex, ValueMatcher};

use crate::headers::RequestHeaders;
use gatehouse_ir as ir;
use http::Method;
use http::method::InvalidMethod;

/// Every condition of one route match; all must hold.
#[derive(Debug)]
pub(crate) struct RequestMatcher {
    pub path: PathMatcher,
    pub method: Option<Method>,
    pub headers: Box<[HeaderMatcher]>,
    pub query: Box<[QueryMatcher]>,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum MatchError {
    #[error("path: {0}")]
    Path(InvalidRegex),
    #[error("method {method:?}: {source}")]
    Method {
        method: String,
        source: InvalidMethod,
    },
    #[error(transparent)]
    Header(#[from] HeaderMatchError),
    #[error("query parameter: {0}")]
    Query(InvalidRegex),
}

impl TryFrom<&ir::HttpMatch> for RequestMatcher {
    type Error = MatchError;

    fn try_from(m: &ir::HttpMatch) -> Result<Self, MatchError> {
        Ok(RequestMatcher {
            path: PathMatcher::try_from(&m.path).map_err(MatchError::Path)?,
            method: m
                .method
                .as_deref()
                .map(|s| {
                    Method::from_bytes(s.as_bytes()).map_err(|source| MatchError::Method {
                        method: s.to_string(),
                        source,
                    })
                })
                .transpose()?,
            headers: m
                .headers
                .iter()
                .map(HeaderMatcher::try_from)
                .collect::<Result<_, _>>()?,
            query: m
                .query_params
                .iter()
                .map(|q| QueryMatcher::try_from(q).map_err(MatchError::Query))
                .collect::<Result<_, _>>()?,
        })
    }
}

/// The parts of a request the matchers look at, from either request path.
pub(crate) struct RequestView<'r, H: ?Sized> {
    pub method: &'r Method,
    pub path: &'r str,
    pub headers: &'r H,
    pub query: LazyQuery<'r>,
}

impl RequestMatcher {
    /// The checks every request pays first; a run of entries that share them is checked once.
    #[inline(always)]
    pub(crate) fn method_and_path_match<H: ?Sized>(&self, req: &RequestView<'_, H>) -> bool {
        self.method.as_ref().is_none_or(|m| m == req.method) && self.path.matches(req.path)
    }

    #[inline(always)]
    pub(crate) fn matches<H: RequestHeaders + ?Sized>(&self, req: &mut RequestView<'_, H>) -> bool {
        if !self.method_and_path_match(req) {
            return false;
        }
        // A repeated header matches when any of its values does: the values of repeated
        // fields are one list (RFC 9110 §5.3), so which copy comes first is an accident of
        // intermediaries, and checking each value avoids joining them into a new string.
        // Plain loops: this runs for every entry a request passes, and `Iterator::all` with
        // a closure is not always inlined.
        for h in &self.headers {
            let mut values = req.headers.values_of(h.name.as_str());
            if !values.any(|v| h.value.matches_bytes(v)) {
                return false;
            }
        }
        for q in &self.query {
            if !q.matches(&req.query) {
                return false;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    fn matcher(m: ir::HttpMatch) -> RequestMatcher {
        RequestMatcher::try_from(&m).unwrap()
    }

    fn check(m: &RequestMatcher, method: Method, headers: &HeaderMap, query: Option<&str>) -> bool {
        m.matches(&mut RequestView {
            method: &method,
            path: "/",
            headers,
            query: LazyQuery::new(query),
        })
    }

    #[test]
    fn method_match() {
        let m = matcher(ir::HttpMatch {
            method: Some("POST".into()),
            ..Default::default()
        });
        let h = HeaderMap::new();
        assert!(check(&m, Method::POST, &h, None));
        assert!(!check(&m, Method::GET, &h, None));
    }

    #[test]
    fn header_match_exact_regex_and_repeated() {
        let m = matcher(ir::HttpMatch {
            headers: vec![
                ir::HeaderMatch {
                    name: "x-version".into(),
                    value: ir::StringMatch::Exact("v2".into()),
                },
                ir::HeaderMatch {
                    name: "x-user".into(),
                    value: ir::StringMatch::Regex("adm.n".into()),
                },
            ],
            ..Default::default()
        });
        let mut h = HeaderMap::new();
        h.insert("x-version", "v2".parse().unwrap());
        h.insert("x-user", "admin".parse().unwrap());
        assert!(check(&m, Method::GET, &h, None));
        h.insert("x-user", "administrator".parse().unwrap());
        assert!(!check(&m, Method::GET, &h, None));
        h.insert("x-user", "admin".parse().unwrap());
        h.insert("x-version", "v1".parse().unwrap());
        assert!(!check(&m, Method::GET, &h, None));
        h.append("x-version", "v2".parse().unwrap());
        assert!(
            check(&m, Method::GET, &h, None),
            "any value of a repeated header"
        );
        h.remove("x-version");
        assert!(!check(&m, Method::GET, &h, None));
    }

    #[test]
    fn query_conditions_all_hold() {
        let m = matcher(ir::HttpMatch {
            query_params: vec![
                ir::QueryParamMatch {
                    name: "a".into(),
                    value: ir::StringMatch::Exact("1".into()),
                },
                ir::QueryParamMatch {
                    name: "b".into(),
                    value: ir::StringMatch::Regex("[0-9]".into()),
                },
            ],
            ..Default::default()
        });
        let h = HeaderMap::new();
        assert!(check(&m, Method::GET, &h, Some("a=1&b=2")));
        assert!(!check(&m, Method::GET, &h, Some("a=1&b=x")));
        assert!(!check(&m, Method::GET, &h, Some("b=2")));
    }

    #[test]
    fn conversion_errors_say_which_part() {
        let bad = |m: ir::HttpMatch| RequestMatcher::try_from(&m).unwrap_err().to_string();
        assert!(
            bad(ir::HttpMatch {
                path: ir::PathMatch::Regex("(".into()),
                ..Default::default()
            })
            .starts_with("path: invalid regular expression")
        );
        assert!(
            bad(ir::HttpMatch {
                method: Some("G T".into()),
                ..Default::default()
            })
            .starts_with("method \"G T\"")
        );
        assert!(
            bad(ir::HttpMatch {
                query_params: vec![ir::QueryParamMatch {
                    name: "q".into(),
                    value: ir::StringMatch::Regex("[".into()),
                }],
                ..Default::default()
            })
            .starts_with("query parameter: invalid regular expression")
        );
    }
}
