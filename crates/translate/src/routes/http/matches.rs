//! HTTPRoute matches to IR matches, and the regular expressions in them checked the way the
//! data plane compiles them.

use crate::generated::httproutes::{
    HttpRoute, HttpRouteRulesMatches, HttpRouteRulesMatchesHeadersType,
    HttpRouteRulesMatchesMethod, HttpRouteRulesMatchesPathType,
    HttpRouteRulesMatchesQueryParamsType,
};
use crate::kinds::{Finding, PathSegment};
use gatehouse_ir as ir;

/// Compile a user regex the way the data plane will, so an invalid one is caught here.
pub(crate) fn check_regex(what: &str, re: &str) -> Result<(), String> {
    regex::Regex::new(&ir::anchored_regex(re))
        .map(|_| ())
        .map_err(|e| format!("invalid regular expression in {what} {re:?}: {e}"))
}

fn method(m: &HttpRouteRulesMatchesMethod) -> &'static str {
    use HttpRouteRulesMatchesMethod::*;
    match m {
        Get => "GET",
        Head => "HEAD",
        Post => "POST",
        Put => "PUT",
        Delete => "DELETE",
        Connect => "CONNECT",
        Options => "OPTIONS",
        Trace => "TRACE",
        Patch => "PATCH",
    }
}

pub fn http_match(m: &HttpRouteRulesMatches) -> Result<ir::HttpMatch, String> {
    let path = match &m.path {
        None => ir::PathMatch::Prefix("/".into()),
        Some(p) => {
            let value = p.value.clone().unwrap_or_else(|| "/".into());
            match p.r#type {
                None | Some(HttpRouteRulesMatchesPathType::PathPrefix) => {
                    if !value.starts_with('/') {
                        return Err(format!("path prefix {value:?} must start with /"));
                    }
                    let trimmed = if value.len() > 1 {
                        value.trim_end_matches('/')
                    } else {
                        &value
                    };
                    ir::PathMatch::Prefix(if trimmed.is_empty() {
                        "/".into()
                    } else {
                        trimmed.into()
                    })
                }
                Some(HttpRouteRulesMatchesPathType::Exact) => {
                    if !value.starts_with('/') {
                        return Err(format!("exact path {value:?} must start with /"));
                    }
                    ir::PathMatch::Exact(value)
                }
                Some(HttpRouteRulesMatchesPathType::RegularExpression) => {
                    check_regex("path", &value)?;
                    ir::PathMatch::Regex(value)
                }
            }
        }
    };
    let headers = header_matches(m.headers.iter().flatten().map(|h| {
        let regex = h.r#type == Some(HttpRouteRulesMatchesHeadersType::RegularExpression);
        (h.name.as_str(), regex, h.value.as_str())
    }))?;
    let mut query_params: Vec<ir::QueryParamMatch> = Vec::new();
    for q in m.query_params.iter().flatten() {
        if query_params.iter().any(|x| x.name == q.name) {
            continue;
        }
        let value = match q.r#type {
            Some(HttpRouteRulesMatchesQueryParamsType::RegularExpression) => {
                check_regex("query parameter match", &q.value)?;
                ir::StringMatch::Regex(q.value.clone())
            }
            _ => ir::StringMatch::Exact(q.value.clone()),
        };
        query_params.push(ir::QueryParamMatch {
            name: q.name.clone(),
            value,
        });
    }
    Ok(ir::HttpMatch {
        path,
        method: m.method.as_ref().map(|m| method(m).to_string()),
        headers,
        query_params,
    })
}

/// Header matches, given as (name, is RegularExpression, value): HTTPRoute's and GRPCRoute's
/// have the same rules.
pub(crate) fn header_matches<'a>(
    list: impl Iterator<Item = (&'a str, bool, &'a str)>,
) -> Result<Vec<ir::HeaderMatch>, String> {
    let mut headers: Vec<ir::HeaderMatch> = Vec::new();
    for (name, regex, value) in list {
        // Gateway API's CRD allows only an RFC 9110 token here; manifests from files are not
        // checked by it, and a name with a space would never match a request (the data plane
        // refuses it).
        if !is_token(name) {
            return Err(format!(
                "header match name {name:?} is not a valid HTTP header name"
            ));
        }
        let name = name.to_ascii_lowercase();
        // The spec: only the first match for a given header name counts.
        if headers.iter().any(|x| x.name == name) {
            continue;
        }
        let value = if regex {
            check_regex("header match", value)?;
            ir::StringMatch::Regex(value.to_string())
        } else {
            ir::StringMatch::Exact(value.to_string())
        };
        headers.push(ir::HeaderMatch { name, value });
    }
    Ok(headers)
}

/// The one-line gist of a regex error (syntax errors print the pattern and a caret).
/// An RFC 9110 token (`tchar`s), as header field names are.
pub(crate) fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn regex_error(e: &regex::Error) -> String {
    match e {
        regex::Error::Syntax(s) => s
            .lines()
            .rev()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .map(|l| l.strip_prefix("error: ").unwrap_or(l).to_owned())
            .unwrap_or_else(|| s.clone()),
        other => other.to_string(),
    }
}

pub(crate) fn key(k: &str) -> PathSegment {
    PathSegment::Key(k.to_string())
}

/// A finding at `base` + `tail` when `value` is not a regular expression the data plane
/// compiles (HTTPRoute's and GRPCRoute's matches).
pub(crate) fn regex_finding(
    base: &[PathSegment],
    tail: &[PathSegment],
    value: &str,
) -> Option<Finding> {
    let e = regex::Regex::new(&ir::anchored_regex(value)).err()?;
    let path: Vec<PathSegment> = base.iter().chain(tail).cloned().collect();
    Some(Finding {
        message: format!(
            "{}: invalid regular expression {value:?}: {}",
            crate::kinds::display_path(&path),
            regex_error(&e)
        ),
        value: Some(value.to_string()),
        path,
    })
}

/// Every RegularExpression match of the route that does not compile, by field path.
pub fn regex_findings(route: &HttpRoute) -> Vec<Finding> {
    let mut out = Vec::new();
    let rules = route.spec.rules.as_deref().unwrap_or_default();
    for (r, rule) in rules.iter().enumerate() {
        for (m, matched) in rule
            .matches
            .as_deref()
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            let base = [
                key("spec"),
                key("rules"),
                PathSegment::Index(r),
                key("matches"),
                PathSegment::Index(m),
            ];
            let mut check =
                |value: &str, tail: &[PathSegment]| out.extend(regex_finding(&base, tail, value));
            if let Some(p) = &matched.path
                && p.r#type == Some(HttpRouteRulesMatchesPathType::RegularExpression)
                && let Some(v) = &p.value
            {
                check(v, &[key("path"), key("value")]);
            }
            for (h, header) in matched.headers.iter().flatten().enumerate() {
                if header.r#type == Some(HttpRouteRulesMatchesHeadersType::RegularExpression) {
                    check(
                        &header.value,
                        &[key("headers"), PathSegment::Index(h), key("value")],
                    );
                }
            }
            for (q, query) in matched.query_params.iter().flatten().enumerate() {
                if query.r#type == Some(HttpRouteRulesMatchesQueryParamsType::RegularExpression) {
                    check(
                        &query.value,
                        &[key("queryParams"), PathSegment::Index(q), key("value")],
                    );
                }
            }
        }
    }
    out
}
