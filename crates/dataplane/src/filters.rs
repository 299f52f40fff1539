//! Rule and backend filters: header modifiers, redirects and URL rewrites, each beside its
//! conversion from the IR; CORS and mirrors in modules of their own (`cors`, `mirror`).

use crate::cors::{CorsError, CorsPolicy};
use crate::ext_auth::AuthSpec;
use crate::headers::HeaderEdit;
use crate::mirror::MirrorSpec;
use gatehouse_ir as ir;
use http::header::{InvalidHeaderName, InvalidHeaderValue};
use http::{HeaderName, HeaderValue, StatusCode};
use std::borrow::Cow;

/// Why a filter of the IR cannot run here (translate refuses these, so they only come from an
/// IR made elsewhere).
#[derive(Debug, thiserror::Error)]
pub(crate) enum FilterError {
    #[error("header name {name:?}: {source}")]
    HeaderName {
        name: String,
        source: InvalidHeaderName,
    },
    #[error("value of header {name:?}: {source}")]
    HeaderValue {
        name: String,
        source: InvalidHeaderValue,
    },
    #[error("redirect status {0} is not a redirection")]
    RedirectStatus(u16),
    #[error("path {path:?} {why}")]
    Path { path: String, why: String },
    #[error("rewrite hostname {hostname:?}: {source}")]
    RewriteHostname {
        hostname: String,
        source: InvalidHeaderValue,
    },
    #[error("CORS: {0}")]
    Cors(#[from] CorsError),
    /// A mirror needs the cluster it reaches: `compile` builds it, not this conversion.
    #[error("a mirror is compiled with the clusters of its configuration")]
    MirrorNeedsClusters,
    /// So does an authorization server.
    #[error("an ExternalAuth filter is compiled with the clusters of its configuration")]
    AuthNeedsClusters,
}

impl TryFrom<&ir::HttpFilter> for Filter {
    type Error = FilterError;

    fn try_from(f: &ir::HttpFilter) -> Result<Self, FilterError> {
        Ok(match f {
            ir::HttpFilter::RequestHeaders(m) => Filter::RequestHeaders(m.try_into()?),
            ir::HttpFilter::ResponseHeaders(m) => Filter::ResponseHeaders(m.try_into()?),
            ir::HttpFilter::Redirect(r) => Filter::Redirect(r.try_into()?),
            ir::HttpFilter::UrlRewrite(r) => Filter::UrlRewrite(r.try_into()?),
            ir::HttpFilter::Cors(c) => Filter::Cors(Box::new(c.try_into()?)),
            ir::HttpFilter::Mirror(_) => return Err(FilterError::MirrorNeedsClusters),
            ir::HttpFilter::ExternalAuth(_) => return Err(FilterError::AuthNeedsClusters),
        })
    }
}

#[derive(Debug)]
pub(crate) enum Filter {
    RequestHeaders(HeaderMods),
    ResponseHeaders(HeaderMods),
    Redirect(RedirectSpec),
    UrlRewrite(RewriteSpec),
    Cors(Box<CorsPolicy>),
    Mirror(Box<MirrorSpec>),
    /// Run by the hyper path before the filters after it (see `ext_auth`).
    ExternalAuth(Box<AuthSpec>),
    /// A filter the IR holds but that could not be compiled; its rule answers 500 rather than
    /// silently skipping it.
    Invalid,
}

#[derive(Debug, Default)]
pub(crate) struct HeaderMods {
    pub set: Box<[(HeaderName, HeaderValue)]>,
    pub add: Box<[(HeaderName, HeaderValue)]>,
    pub remove: Box<[HeaderName]>,
}

fn header_name(name: &str) -> Result<HeaderName, FilterError> {
    HeaderName::from_bytes(name.as_bytes()).map_err(|source| FilterError::HeaderName {
        name: name.to_string(),
        source,
    })
}

impl TryFrom<&ir::HeaderModifier> for HeaderMods {
    type Error = FilterError;

    fn try_from(m: &ir::HeaderModifier) -> Result<Self, FilterError> {
        let pair = |h: &ir::HeaderValue| -> Result<(HeaderName, HeaderValue), FilterError> {
            let value =
                HeaderValue::from_str(&h.value).map_err(|source| FilterError::HeaderValue {
                    name: h.name.clone(),
                    source,
                })?;
            Ok((header_name(&h.name)?, value))
        };
        Ok(HeaderMods {
            set: m.set.iter().map(pair).collect::<Result<_, _>>()?,
            add: m.add.iter().map(pair).collect::<Result<_, _>>()?,
            remove: m
                .remove
                .iter()
                .map(|n| header_name(n))
                .collect::<Result<_, _>>()?,
        })
    }
}

impl HeaderMods {
    pub(crate) fn apply<H: HeaderEdit + ?Sized>(&self, headers: &mut H) {
        for (name, value) in &self.set {
            headers.set(name, value);
        }
        for (name, value) in &self.add {
            headers.add(name, value);
        }
        for name in &self.remove {
            headers.remove(name);
        }
    }
}

#[derive(Debug)]
pub(crate) enum PathModifier {
    Full(Box<str>),
    Prefix(Box<str>),
}

impl TryFrom<&ir::PathModifier> for PathModifier {
    type Error = FilterError;

    fn try_from(p: &ir::PathModifier) -> Result<Self, FilterError> {
        let check = |path: &str| {
            ir::check_path_value(path).map_err(|why| FilterError::Path {
                path: path.to_string(),
                why,
            })
        };
        Ok(match p {
            ir::PathModifier::ReplaceFullPath(p) => {
                check(p)?;
                PathModifier::Full(p.as_str().into())
            }
            ir::PathModifier::ReplacePrefixMatch(p) => {
                if !p.is_empty() {
                    check(p)?;
                }
                PathModifier::Prefix(p.as_str().into())
            }
        })
    }
}

impl PathModifier {
    /// `matched_prefix` is what the route's path match covered (see
    /// `PathMatcher::replaceable_prefix`); without one, `ReplacePrefixMatch` leaves the path be.
    pub(crate) fn apply<'p>(&self, path: &'p str, matched_prefix: Option<&str>) -> Cow<'p, str> {
        match self {
            PathModifier::Full(p) => Cow::Owned(p.to_string()),
            PathModifier::Prefix(replacement) => match matched_prefix {
                Some(prefix) => replace_prefix(path, prefix, replacement)
                    .map_or(Cow::Borrowed(path), Cow::Owned),
                None => Cow::Borrowed(path),
            },
        }
    }
}

/// Gateway API `ReplacePrefixMatch`: swaps the matched path elements for `replacement` and
/// never yields an empty path or a `//` at the seam. `None` if `path` does not start with the
/// prefix (the match guarantees it does, up to an element boundary).
pub(crate) fn replace_prefix(path: &str, prefix: &str, replacement: &str) -> Option<String> {
    let prefix = prefix.trim_end_matches('/');
    let rest = path.strip_prefix(prefix)?;
    if !(rest.is_empty() || rest.starts_with('/')) {
        return None;
    }
    let replacement = replacement.trim_end_matches('/');
    let mut out = String::with_capacity(replacement.len() + rest.len() + 1);
    if !replacement.starts_with('/') {
        out.push('/');
    }
    out.push_str(replacement);
    if !rest.is_empty() {
        // `rest` brings its own leading slash.
        if out == "/" {
            out.clear();
        }
        out.push_str(rest);
    }
    Some(out)
}

#[derive(Debug)]
pub(crate) struct RedirectSpec {
    pub scheme: Box<str>,
    pub hostname: Option<Box<str>>,
    pub port: Option<u16>,
    pub path: Option<PathModifier>,
    pub status: StatusCode,
}

impl TryFrom<&ir::Redirect> for RedirectSpec {
    type Error = FilterError;

    fn try_from(r: &ir::Redirect) -> Result<Self, FilterError> {
        Ok(RedirectSpec {
            scheme: r.scheme.to_ascii_lowercase().into(),
            hostname: r.hostname.as_deref().map(Into::into),
            port: r.port,
            path: r.path.as_ref().map(TryInto::try_into).transpose()?,
            status: StatusCode::from_u16(r.status)
                .ok()
                .filter(StatusCode::is_redirection)
                .ok_or(FilterError::RedirectStatus(r.status))?,
        })
    }
}

impl RedirectSpec {
    /// `request_host` is the normalised request host (no port).
    pub(crate) fn location(
        &self,
        request_host: &str,
        path: &str,
        query: Option<&str>,
        matched_prefix: Option<&str>,
    ) -> String {
        let host = self.hostname.as_deref().unwrap_or(request_host);
        let path = match &self.path {
            Some(m) => m.apply(path, matched_prefix),
            None => Cow::Borrowed(path),
        };
        let mut out = String::with_capacity(
            self.scheme.len() + host.len() + path.len() + query.map_or(0, str::len) + 16,
        );
        out.push_str(&self.scheme);
        out.push_str("://");
        out.push_str(host);
        // The scheme's own port is left out, as Gateway API asks (and browsers would drop it).
        let well_known = match &*self.scheme {
            "http" => Some(80),
            "https" => Some(443),
            _ => None,
        };
        if let Some(port) = self.port.filter(|&p| Some(p) != well_known) {
            out.push(':');
            out.push_str(itoa_u16(port, &mut [0; 5]));
        }
        if !path.starts_with('/') {
            out.push('/');
        }
        out.push_str(&path);
        if let Some(q) = query {
            out.push('?');
            out.push_str(q);
        }
        out
    }
}

fn itoa_u16(mut n: u16, buf: &mut [u8; 5]) -> &str {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    std::str::from_utf8(&buf[i..]).unwrap_or("0")
}

#[derive(Debug)]
pub(crate) struct RewriteSpec {
    pub hostname: Option<HeaderValue>,
    pub path: Option<PathModifier>,
}

impl TryFrom<&ir::UrlRewrite> for RewriteSpec {
    type Error = FilterError;

    fn try_from(r: &ir::UrlRewrite) -> Result<Self, FilterError> {
        Ok(RewriteSpec {
            hostname: r
                .hostname
                .as_deref()
                .map(|h| {
                    HeaderValue::from_str(h).map_err(|source| FilterError::RewriteHostname {
                        hostname: h.to_string(),
                        source,
                    })
                })
                .transpose()?,
            path: r.path.as_ref().map(TryInto::try_into).transpose()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    #[test]
    fn replace_prefix_match_table() {
        let cases = [
            // (path, prefix, replacement, expected)
            ("/foo", "/foo", "/bar", "/bar"),
            ("/foo/", "/foo", "/bar", "/bar/"),
            ("/foo/x", "/foo", "/bar", "/bar/x"),
            ("/foo/x", "/foo", "/", "/x"),
            ("/foo", "/foo", "/", "/"),
            ("/foo/", "/foo", "/", "/"),
            // The Gateway API specification's table.
            ("/foo/bar", "/foo", "/xyz", "/xyz/bar"),
            ("/foo/bar", "/foo", "/xyz/", "/xyz/bar"),
            ("/foo/bar", "/foo/", "/xyz", "/xyz/bar"),
            ("/foo/bar", "/foo/", "/xyz/", "/xyz/bar"),
            ("/foo", "/foo", "/xyz", "/xyz"),
            ("/foo/", "/foo", "/xyz", "/xyz/"),
            ("/foo/bar", "/", "", "/foo/bar"),
            ("/foo/", "/", "", "/foo/"),
            ("/foo/", "/", "/", "/foo/"),
            ("/", "/", "/", "/"),
            ("/", "/", "/bar", "/bar/"),
            ("/x", "/", "/bar", "/bar/x"),
            ("/foo", "/foo", "", "/"),
            ("/foo/x", "/foo", "bar", "/bar/x"),
        ];
        for (path, prefix, replacement, expected) in cases {
            let got = replace_prefix(path, prefix, replacement).unwrap();
            assert_eq!(
                got, expected,
                "{path} with prefix {prefix} -> {replacement}"
            );
            assert!(!got.contains("//"), "{got}");
        }
        assert_eq!(replace_prefix("/other", "/foo", "/bar"), None);
        assert_eq!(replace_prefix("/foobar", "/foo", "/bar"), None);
    }

    fn redirect(
        hostname: Option<&str>,
        port: Option<u16>,
        path: Option<PathModifier>,
    ) -> RedirectSpec {
        RedirectSpec {
            scheme: "https".into(),
            hostname: hostname.map(Into::into),
            port,
            path,
            status: StatusCode::FOUND,
        }
    }

    #[test]
    fn redirect_location() {
        let r = redirect(None, None, None);
        assert_eq!(
            r.location("cafe.example.com", "/coffee", Some("a=1"), Some("/coffee")),
            "https://cafe.example.com/coffee?a=1"
        );
        let r = redirect(Some("tea.example.com"), Some(8443), None);
        assert_eq!(
            r.location("cafe.example.com", "/x", None, None),
            "https://tea.example.com:8443/x"
        );
        let r = redirect(None, Some(443), None);
        assert_eq!(r.location("h", "/", None, None), "https://h/");
        let r = redirect(None, None, Some(PathModifier::Full("/new".into())));
        assert_eq!(
            r.location("h", "/old/path", Some("q"), None),
            "https://h/new?q"
        );
        let r = redirect(None, None, Some(PathModifier::Prefix("/v2".into())));
        assert_eq!(
            r.location("h", "/v1/items", None, Some("/v1")),
            "https://h/v2/items"
        );
        let http = RedirectSpec {
            scheme: "http".into(),
            ..redirect(None, Some(8080), None)
        };
        assert_eq!(http.location("h", "/", None, None), "http://h:8080/");
    }

    #[test]
    fn header_mods_set_add_remove() {
        let mods = HeaderMods {
            set: vec![(
                HeaderName::from_static("x-set"),
                HeaderValue::from_static("new"),
            )]
            .into(),
            add: vec![(
                HeaderName::from_static("x-add"),
                HeaderValue::from_static("two"),
            )]
            .into(),
            remove: vec![HeaderName::from_static("x-gone")].into(),
        };
        let mut h = HeaderMap::new();
        h.append("x-set", HeaderValue::from_static("old1"));
        h.append("x-set", HeaderValue::from_static("old2"));
        h.insert("x-add", HeaderValue::from_static("one"));
        h.insert("x-gone", HeaderValue::from_static("bye"));
        mods.apply(&mut h);
        assert_eq!(h.get_all("x-set").iter().collect::<Vec<_>>(), ["new"]);
        assert_eq!(
            h.get_all("x-add").iter().collect::<Vec<_>>(),
            ["one", "two"]
        );
        assert!(!h.contains_key("x-gone"));
    }

    #[test]
    fn conversions_refuse_what_cannot_run() {
        let header = |name: &str, value: &str| ir::HeaderValue {
            name: name.into(),
            value: value.into(),
        };
        let mods = |set| {
            Filter::try_from(&ir::HttpFilter::RequestHeaders(ir::HeaderModifier {
                set,
                ..Default::default()
            }))
        };
        assert!(mods(vec![header("x-ok", "fine")]).is_ok());
        assert!(matches!(
            mods(vec![header("x bad", "v")]),
            Err(FilterError::HeaderName { .. })
        ));
        assert!(matches!(
            mods(vec![header("x-ok", "a\r\nb")]),
            Err(FilterError::HeaderValue { .. })
        ));
        let redirect = |status| {
            Filter::try_from(&ir::HttpFilter::Redirect(ir::Redirect {
                scheme: "HTTPS".into(),
                hostname: None,
                port: None,
                path: None,
                status,
            }))
        };
        match redirect(301) {
            Ok(Filter::Redirect(r)) => assert_eq!(&*r.scheme, "https"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            redirect(200),
            Err(FilterError::RedirectStatus(200))
        ));
        let rewrite = Filter::try_from(&ir::HttpFilter::UrlRewrite(ir::UrlRewrite {
            hostname: Some("a\nb".into()),
            path: None,
        }));
        assert!(matches!(rewrite, Err(FilterError::RewriteHostname { .. })));
    }

    #[test]
    fn small_itoa() {
        for n in [0u16, 7, 80, 8080, 65535] {
            assert_eq!(itoa_u16(n, &mut [0; 5]), n.to_string());
        }
    }
}
