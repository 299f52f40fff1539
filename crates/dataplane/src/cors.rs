//! The CORS filter: preflight requests answered by the gateway, CORS fields added to the
//! responses of the rest, as the Gateway API's `CORS` filter and the Fetch standard's CORS
//! protocol describe them.
//!
//! Everything that does not depend on the request (the joined method, header and exposed
//! header lists, `Access-Control-Max-Age`) is built once at compile time; a request costs an
//! origin comparison and, when the origin is allowed, the handful of fields it gets back.
//! Requests without `Origin` are not CORS requests and pass untouched.

use crate::headers::{HeaderEdit, RequestHeaders};
use gatehouse_ir as ir;
use http::header::{
    ACCESS_CONTROL_ALLOW_CREDENTIALS, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE, VARY,
};
use http::{HeaderName, HeaderValue, Method};

#[derive(Debug, thiserror::Error)]
pub(crate) enum CorsError {
    #[error("allowed origin {0:?} is not *, or scheme://host[:port]")]
    Origin(String),
    #[error("{field} {value:?} cannot be sent in a header field")]
    Value { field: &'static str, value: String },
}

/// A compiled CORS policy.
#[derive(Debug)]
pub(crate) struct CorsPolicy {
    origins: Origins,
    credentials: bool,
    methods: Allowed,
    headers: Allowed,
    /// `Access-Control-Expose-Headers`; without `*` when credentials are allowed (a
    /// credentialed response may not use the wildcard, so it would name a header called `*`).
    expose: Option<HeaderValue>,
    max_age: HeaderValue,
}

#[derive(Debug)]
enum Origins {
    Any,
    Listed(Box<[OriginPattern]>),
}

/// One `allowOrigins` entry other than `*`.
#[derive(Debug, PartialEq, Eq)]
struct OriginPattern {
    https: bool,
    host: HostPattern,
    /// Explicit, or the scheme's default: `https://a.example` and `https://a.example:443` are
    /// the same origin.
    port: u16,
}

#[derive(Debug, PartialEq, Eq)]
enum HostPattern {
    Exact(Box<str>),
    /// `*.example.com` as `.example.com`: one or more labels before the suffix.
    Suffix(Box<str>),
    Any,
}

/// `allowMethods` or `allowHeaders`.
#[derive(Debug)]
enum Allowed {
    None,
    /// `*`: answered with `*`, or with what the preflight asked for when credentials are
    /// allowed (the wildcard does not count for credentialed requests).
    Any,
    Listed(HeaderValue),
}

/// What the filter makes of a request.
#[derive(Debug)]
pub(crate) enum CorsOutcome {
    /// Not a CORS request, or one from an origin that is not allowed: forwarded as it is
    /// (with no CORS fields added to its response).
    Pass,
    /// A preflight: the gateway answers it with these fields (none when the origin is not
    /// allowed, which the browser takes as a refusal).
    Preflight(CorsFields),
    /// An allowed cross-origin request: forwarded, and its response gets these fields.
    Actual(CorsFields),
}

/// Response fields of one CORS answer: set, replacing what a backend sent under those names.
#[derive(Debug, Default)]
pub(crate) struct CorsFields(Vec<(HeaderName, HeaderValue)>);

impl CorsFields {
    pub(crate) fn apply<H: HeaderEdit + ?Sized>(&self, headers: &mut H) {
        for (name, value) in &self.0 {
            if *name == VARY {
                headers.add(name, value);
            } else {
                headers.set(name, value);
            }
        }
    }

    #[cfg(test)]
    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.to_str().ok())
    }
}

static ACCESS_CONTROL_REQUEST_METHOD: &str = "access-control-request-method";
static ACCESS_CONTROL_REQUEST_HEADERS: &str = "access-control-request-headers";

impl TryFrom<&ir::Cors> for CorsPolicy {
    type Error = CorsError;

    fn try_from(c: &ir::Cors) -> Result<Self, CorsError> {
        let origins = if c.allow_origins.iter().any(|o| o == "*") {
            Origins::Any
        } else {
            Origins::Listed(
                c.allow_origins
                    .iter()
                    .map(|o| parse_pattern(o).ok_or_else(|| CorsError::Origin(o.clone())))
                    .collect::<Result<_, _>>()?,
            )
        };
        let expose: Vec<&str> = c
            .expose_headers
            .iter()
            .map(String::as_str)
            .filter(|h| !(c.allow_credentials && *h == "*"))
            .collect();
        Ok(CorsPolicy {
            origins,
            credentials: c.allow_credentials,
            methods: allowed("allowMethods", &c.allow_methods)?,
            headers: allowed("allowHeaders", &c.allow_headers)?,
            expose: (!expose.is_empty())
                .then(|| joined("exposeHeaders", &expose))
                .transpose()?,
            max_age: HeaderValue::from(c.max_age_seconds),
        })
    }
}

fn joined(field: &'static str, list: &[&str]) -> Result<HeaderValue, CorsError> {
    let value = list.join(", ");
    HeaderValue::try_from(value.as_str()).map_err(|_| CorsError::Value { field, value })
}

fn allowed(field: &'static str, list: &[String]) -> Result<Allowed, CorsError> {
    Ok(match list {
        [] => Allowed::None,
        [only] if only == "*" => Allowed::Any,
        _ => {
            let list: Vec<&str> = list.iter().map(String::as_str).collect();
            Allowed::Listed(joined(field, &list)?)
        }
    })
}

/// `http(s)://host[:port]` (translate checked the form; the host is lower case there).
fn parse_pattern(value: &str) -> Option<OriginPattern> {
    let (https, host, port) = split_origin(value.as_bytes())?;
    let host = std::str::from_utf8(host).ok()?;
    let host = if host == "*" {
        HostPattern::Any
    } else if let Some(suffix) = host.strip_prefix('*') {
        HostPattern::Suffix(suffix.into())
    } else {
        HostPattern::Exact(host.into())
    };
    Some(OriginPattern { https, host, port })
}

/// An origin (`scheme://host[:port]`) as (is https, host, port with the scheme's default).
/// `None` for anything else, such as the opaque origin `null`.
fn split_origin(origin: &[u8]) -> Option<(bool, &[u8], u16)> {
    let (https, rest) = if let Some(rest) = strip_prefix_ignore_case(origin, b"https://") {
        (true, rest)
    } else {
        (false, strip_prefix_ignore_case(origin, b"http://")?)
    };
    let default_port = if https { 443 } else { 80 };
    // A bracketed IPv6 host has colons of its own: the port follows the `]`.
    let port_colon = match rest.iter().rposition(|&b| b == b':') {
        Some(i) if !rest[i..].contains(&b']') => Some(i),
        _ => None,
    };
    let (host, port) = match port_colon {
        Some(i) => {
            let digits = &rest[i + 1..];
            if digits.is_empty() || digits.len() > 5 || !digits.iter().all(u8::is_ascii_digit) {
                return None;
            }
            let port = std::str::from_utf8(digits).ok()?.parse::<u16>().ok()?;
            (&rest[..i], port)
        }
        None => (rest, default_port),
    };
    if host.is_empty() || host.contains(&b'/') {
        return None;
    }
    Some((https, host, port))
}

fn strip_prefix_ignore_case<'a>(s: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    (s.len() >= prefix.len() && s[..prefix.len()].eq_ignore_ascii_case(prefix))
        .then(|| &s[prefix.len()..])
}

impl OriginPattern {
    fn matches(&self, https: bool, host: &[u8], port: u16) -> bool {
        if self.https != https || self.port != port {
            return false;
        }
        match &self.host {
            HostPattern::Any => true,
            HostPattern::Exact(h) => host.eq_ignore_ascii_case(h.as_bytes()),
            HostPattern::Suffix(suffix) => {
                let suffix = suffix.as_bytes();
                host.len() > suffix.len()
                    && host[host.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
            }
        }
    }
}

impl CorsPolicy {
    fn allows(&self, origin: &[u8]) -> bool {
        match &self.origins {
            Origins::Any => true,
            Origins::Listed(patterns) => split_origin(origin).is_some_and(|(https, host, port)| {
                patterns.iter().any(|p| p.matches(https, host, port))
            }),
        }
    }

    /// What the filter does with a request of `method` and `headers`.
    pub(crate) fn evaluate<H: RequestHeaders + ?Sized>(
        &self,
        method: &Method,
        headers: &H,
    ) -> CorsOutcome {
        let Some(origin) = headers.values_of("origin").next() else {
            return CorsOutcome::Pass;
        };
        let requested_method = headers.values_of(ACCESS_CONTROL_REQUEST_METHOD).next();
        let preflight = *method == Method::OPTIONS && requested_method.is_some();
        if !self.allows(origin) {
            return if preflight {
                CorsOutcome::Preflight(CorsFields::default())
            } else {
                CorsOutcome::Pass
            };
        }
        let mut fields = Vec::with_capacity(if preflight { 7 } else { 4 });
        // `*` is only an answer for requests without credentials; otherwise, and whenever
        // specific origins are listed, the origin itself is echoed, and caches must know the
        // answer depends on it.
        let echo_origin = self.credentials || !matches!(self.origins, Origins::Any);
        if echo_origin {
            let Ok(origin) = HeaderValue::from_bytes(origin) else {
                return CorsOutcome::Pass;
            };
            fields.push((ACCESS_CONTROL_ALLOW_ORIGIN, origin));
            fields.push((VARY, HeaderValue::from_static("origin")));
        } else {
            fields.push((ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*")));
        }
        if self.credentials {
            fields.push((
                ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            ));
        }
        if let Some(expose) = &self.expose {
            fields.push((ACCESS_CONTROL_EXPOSE_HEADERS, expose.clone()));
        }
        if !preflight {
            return CorsOutcome::Actual(CorsFields(fields));
        }
        let requested_headers = headers.values_of(ACCESS_CONTROL_REQUEST_HEADERS).next();
        let answer = |allowed: &Allowed, requested: Option<&[u8]>| match allowed {
            Allowed::None => None,
            Allowed::Listed(list) => Some(list.clone()),
            Allowed::Any if !self.credentials => Some(HeaderValue::from_static("*")),
            Allowed::Any => requested.and_then(|r| HeaderValue::from_bytes(r).ok()),
        };
        if let Some(methods) = answer(&self.methods, requested_method) {
            fields.push((ACCESS_CONTROL_ALLOW_METHODS, methods));
        }
        if let Some(headers) = answer(&self.headers, requested_headers) {
            fields.push((ACCESS_CONTROL_ALLOW_HEADERS, headers));
        }
        fields.push((ACCESS_CONTROL_MAX_AGE, self.max_age.clone()));
        CorsOutcome::Preflight(CorsFields(fields))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    fn policy(origins: &[&str], credentials: bool, methods: &[&str], hdrs: &[&str]) -> CorsPolicy {
        let strings = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
        CorsPolicy::try_from(&ir::Cors {
            allow_origins: strings(origins),
            allow_credentials: credentials,
            allow_methods: strings(methods),
            allow_headers: strings(hdrs),
            expose_headers: strings(&["x-header-3", "x-header-4"]),
            max_age_seconds: 3600,
        })
        .unwrap()
    }

    fn request(fields: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (n, v) in fields {
            map.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        map
    }

    fn preflight(p: &CorsPolicy, origin: &str, fields: &[(&str, &str)]) -> Option<CorsFields> {
        let mut all = vec![("origin", origin), ("access-control-request-method", "GET")];
        all.extend_from_slice(fields);
        match p.evaluate(&Method::OPTIONS, &request(&all)) {
            CorsOutcome::Preflight(f) => Some(f),
            _ => None,
        }
    }

    #[test]
    fn origins_match_exactly_by_wildcard_or_default_port() {
        let p = policy(
            &["https://www.foo.com", "https://*.bar.com", "http://*:8080"],
            false,
            &[],
            &[],
        );
        for allowed in [
            "https://www.foo.com",
            "HTTPS://WWW.FOO.COM",
            "https://www.foo.com:443",
            "https://www.bar.com",
            "https://xpto.www.bar.com",
            "http://anything.example:8080",
        ] {
            assert!(p.allows(allowed.as_bytes()), "{allowed}");
        }
        for refused in [
            "https://foobar.com",
            "https://bar.com",
            "http://www.foo.com",
            "https://www.foo.com:8443",
            "http://anything.example",
            "null",
            "https://www.foo.com/path",
            "https://",
        ] {
            assert!(!p.allows(refused.as_bytes()), "{refused}");
        }
    }

    #[test]
    fn preflight_from_an_allowed_origin_gets_the_configured_lists() {
        let p = policy(
            &["https://www.foo.com"],
            true,
            &["GET", "OPTIONS"],
            &["x-header-1", "x-header-2"],
        );
        let f = preflight(&p, "https://www.foo.com", &[]).unwrap();
        assert_eq!(
            f.get("access-control-allow-origin"),
            Some("https://www.foo.com")
        );
        assert_eq!(f.get("access-control-allow-methods"), Some("GET, OPTIONS"));
        assert_eq!(
            f.get("access-control-allow-headers"),
            Some("x-header-1, x-header-2")
        );
        assert_eq!(
            f.get("access-control-expose-headers"),
            Some("x-header-3, x-header-4")
        );
        assert_eq!(f.get("access-control-max-age"), Some("3600"));
        assert_eq!(f.get("access-control-allow-credentials"), Some("true"));
        assert_eq!(f.get("vary"), Some("origin"));
    }

    #[test]
    fn preflight_from_another_origin_gets_no_cors_fields() {
        let p = policy(&["https://www.foo.com"], true, &["GET"], &[]);
        let f = preflight(&p, "https://foobar.com", &[]).unwrap();
        assert!(f.0.is_empty());
    }

    #[test]
    fn wildcards_are_echoed_when_credentials_are_allowed() {
        let with = policy(&["*"], true, &["*"], &["*"]);
        let f = preflight(
            &with,
            "https://other.foo.com",
            &[("access-control-request-headers", "x-header-1, x-header-2")],
        )
        .unwrap();
        assert_eq!(
            f.get("access-control-allow-origin"),
            Some("https://other.foo.com")
        );
        assert_eq!(f.get("access-control-allow-methods"), Some("GET"));
        assert_eq!(
            f.get("access-control-allow-headers"),
            Some("x-header-1, x-header-2")
        );
        // Nothing requested, nothing to echo: the field is left out rather than `*`.
        let f = preflight(&with, "https://other.foo.com", &[]).unwrap();
        assert_eq!(f.get("access-control-allow-headers"), None);

        let without = policy(&["*"], false, &["*"], &["*"]);
        let f = preflight(&without, "https://other.foo.com", &[]).unwrap();
        assert_eq!(f.get("access-control-allow-origin"), Some("*"));
        assert_eq!(f.get("access-control-allow-methods"), Some("*"));
        assert_eq!(f.get("access-control-allow-headers"), Some("*"));
        assert_eq!(f.get("access-control-allow-credentials"), None);
        assert_eq!(f.get("vary"), None);
    }

    #[test]
    fn credentialed_policies_do_not_expose_the_wildcard() {
        let strings = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
        let p = CorsPolicy::try_from(&ir::Cors {
            allow_origins: strings(&["*"]),
            allow_credentials: true,
            expose_headers: strings(&["*"]),
            max_age_seconds: 5,
            ..ir::Cors::default()
        })
        .unwrap();
        assert!(p.expose.is_none());
    }

    #[test]
    fn actual_requests_get_origin_fields_only_when_allowed() {
        let p = policy(&["https://www.foo.com"], false, &["GET"], &[]);
        let outcome = p.evaluate(&Method::GET, &request(&[("origin", "https://www.foo.com")]));
        let CorsOutcome::Actual(f) = outcome else {
            panic!("{outcome:?}")
        };
        assert_eq!(
            f.get("access-control-allow-origin"),
            Some("https://www.foo.com")
        );
        assert_eq!(f.get("access-control-max-age"), None);
        assert_eq!(f.get("access-control-allow-methods"), None);
        let other = p.evaluate(&Method::GET, &request(&[("origin", "https://foobar.com")]));
        assert!(matches!(other, CorsOutcome::Pass));
        // No Origin: not a CORS request; an OPTIONS without Access-Control-Request-Method
        // is not a preflight.
        assert!(matches!(
            p.evaluate(&Method::GET, &request(&[])),
            CorsOutcome::Pass
        ));
        assert!(matches!(
            p.evaluate(
                &Method::OPTIONS,
                &request(&[("origin", "https://www.foo.com")])
            ),
            CorsOutcome::Actual(_)
        ));
    }

    #[test]
    fn fields_replace_the_backends_and_vary_adds_to_it() {
        let p = policy(&["https://www.foo.com"], false, &[], &[]);
        let CorsOutcome::Actual(f) =
            p.evaluate(&Method::GET, &request(&[("origin", "https://www.foo.com")]))
        else {
            panic!()
        };
        let mut response = request(&[
            ("access-control-allow-origin", "https://evil.example"),
            ("vary", "accept-encoding"),
        ]);
        f.apply(&mut response);
        assert_eq!(
            response["access-control-allow-origin"],
            "https://www.foo.com"
        );
        let vary: Vec<_> = response.get_all("vary").iter().collect();
        assert_eq!(vary, ["accept-encoding", "origin"]);
    }
}
