//! The `CORS` filter: its fields checked as the CRD's patterns and rules would (manifest files
//! do not pass through the API server) and its defaults resolved.

use super::matches::is_token;
use gatehouse_ir as ir;

/// `Access-Control-Max-Age` when `maxAge` is left out, as the Gateway API defines it.
const DEFAULT_MAX_AGE: u32 = 5;

/// The methods `allowMethods` may name (besides `*`).
const METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

/// The filter's fields, borrowed from whichever generated type carries them.
pub struct RawCors<'a> {
    pub allow_origins: &'a [String],
    pub allow_credentials: bool,
    pub allow_methods: &'a [String],
    pub allow_headers: &'a [String],
    pub expose_headers: &'a [String],
    pub max_age: Option<i32>,
}

pub fn policy(c: &RawCors<'_>) -> Result<ir::Cors, String> {
    alone_if_wildcard("allowOrigins", c.allow_origins)?;
    alone_if_wildcard("allowMethods", c.allow_methods)?;
    alone_if_wildcard("allowHeaders", c.allow_headers)?;
    let allow_origins = c
        .allow_origins
        .iter()
        .map(|o| origin(o))
        .collect::<Result<_, _>>()?;
    for m in c.allow_methods {
        if m != "*" && !METHODS.contains(&m.as_str()) {
            return Err(format!(
                "CORS allowMethods: {m:?} is not one of {} or *",
                METHODS.join(", ")
            ));
        }
    }
    let max_age_seconds = match c.max_age {
        None => DEFAULT_MAX_AGE,
        Some(s) if s >= 1 => s as u32,
        Some(s) => return Err(format!("CORS maxAge {s} must be at least 1")),
    };
    Ok(ir::Cors {
        allow_origins,
        allow_credentials: c.allow_credentials,
        allow_methods: dedup(c.allow_methods.to_vec()),
        allow_headers: header_names("allowHeaders", c.allow_headers)?,
        expose_headers: header_names("exposeHeaders", c.expose_headers)?,
        max_age_seconds,
    })
}

/// `*` means everything, so it may not share a list with anything else (a CRD rule).
fn alone_if_wildcard(field: &str, list: &[String]) -> Result<(), String> {
    if list.len() > 1 && list.iter().any(|v| v == "*") {
        return Err(format!(
            "CORS {field}: * may not be listed with other values"
        ));
    }
    Ok(())
}

fn dedup(mut list: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::BTreeSet::new();
    list.retain(|v| seen.insert(v.clone()));
    list
}

/// Header names compare case-insensitively: kept in lower case, duplicates dropped.
fn header_names(field: &str, list: &[String]) -> Result<Vec<String>, String> {
    let names = list
        .iter()
        .map(|n| {
            if is_token(n) {
                Ok(n.to_ascii_lowercase())
            } else {
                Err(format!("CORS {field}: {n:?} is not a valid header name"))
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(dedup(names))
}

/// An `allowOrigins` entry: `*`, or `http(s)://host[:port]` whose host is `*`, DNS labels, or
/// DNS labels after a leading `*.`. The host is lower-cased (origins compare
/// case-insensitively there), the rest is kept as written.
fn origin(value: &str) -> Result<String, String> {
    if value == "*" {
        return Ok(value.to_string());
    }
    let bad = |why: &str| Err(format!("CORS allowOrigins: {value:?} {why}"));
    let Some((scheme, rest)) = value.split_once("://") else {
        return bad("is not * or scheme://host[:port]");
    };
    if scheme != "http" && scheme != "https" {
        return bad("must use the http or https scheme");
    }
    let (host, port) = match rest.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (rest, None),
    };
    let port_ok = |p: &str| {
        (1..=5).contains(&p.len())
            && p.bytes().all(|b| b.is_ascii_digit())
            && p.parse::<u32>().is_ok_and(|p| (1..=65535).contains(&p))
    };
    if port.is_some_and(|p| !port_ok(p)) {
        return bad("has a port that is not a number between 1 and 65535");
    }
    let labels = host.strip_prefix("*.").unwrap_or(host);
    let label_ok =
        |l: &str| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if host != "*" && !labels.split('.').all(label_ok) {
        return bad("has a host that is not *, DNS labels, or DNS labels after *.");
    }
    Ok(format!("{scheme}://{}", rest.to_ascii_lowercase()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn raw<'a>(origins: &'a [String], methods: &'a [String], headers: &'a [String]) -> RawCors<'a> {
        RawCors {
            allow_origins: origins,
            allow_credentials: false,
            allow_methods: methods,
            allow_headers: headers,
            expose_headers: &[],
            max_age: None,
        }
    }

    #[test]
    fn origins_follow_the_crd_pattern() {
        for ok in [
            "*",
            "https://www.foo.com",
            "http://foo.com:8080",
            "https://*.bar.com",
            "https://*",
            "https://*:8443",
        ] {
            assert!(origin(ok).is_ok(), "{ok}");
        }
        for bad in [
            "www.foo.com",
            "ftp://foo.com",
            "https://foo.*.com",
            "https://foo.com:0",
            "https://foo.com:123456",
            "https://foo.com/path",
            "https://",
            "https://foo..com",
        ] {
            assert!(origin(bad).is_err(), "{bad}");
        }
        assert_eq!(
            origin("https://WWW.Foo.com:8443").unwrap(),
            "https://www.foo.com:8443"
        );
    }

    #[test]
    fn defaults_and_normalisation() {
        let origins = strings(&["https://a.example"]);
        let methods = strings(&["GET", "GET", "OPTIONS"]);
        let headers = strings(&["X-Header-1", "x-header-1"]);
        let c = policy(&raw(&origins, &methods, &headers)).unwrap();
        assert_eq!(c.max_age_seconds, 5);
        assert_eq!(c.allow_methods, ["GET", "OPTIONS"]);
        assert_eq!(c.allow_headers, ["x-header-1"]);
        assert!(!c.allow_credentials);
    }

    #[test]
    fn invalid_fields_are_refused_with_the_field_named() {
        let none: Vec<String> = vec![];
        let star_and_more = strings(&["*", "https://a.example"]);
        let err = policy(&raw(&star_and_more, &none, &none)).unwrap_err();
        assert!(err.contains("allowOrigins"), "{err}");
        let lower = strings(&["get"]);
        let err = policy(&raw(&none, &lower, &none)).unwrap_err();
        assert!(err.contains("allowMethods"), "{err}");
        let spaced = strings(&["x header"]);
        let err = policy(&raw(&none, &none, &spaced)).unwrap_err();
        assert!(err.contains("allowHeaders"), "{err}");
        let mut zero = raw(&none, &none, &none);
        zero.max_age = Some(0);
        assert!(policy(&zero).unwrap_err().contains("maxAge"));
    }
}
