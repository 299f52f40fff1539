//! Host and rule matching. Everything here runs per request, so it works on borrowed slices of
//! the request and on tables prepared by `compile`: no allocation except the one lazily built
//! list of query parameters when a query match is actually evaluated.

mod index;

pub(crate) use index::RouteTable;

use crate::compile::{CompiledListener, CompiledRoute, SocketTable};
use crate::headers::RequestHeaders;
use http::{HeaderName, Method};
use regex::Regex;
use std::borrow::Cow;
use std::collections::HashMap;

/// Longest host name we route on (DNS allows 253 characters; one more for a trailing dot).
pub(crate) const MAX_HOST_LEN: usize = 255;

/// foldhash: looked up on every request with short keys, where SipHash costs more than the
/// rest of the lookup; still seeded per map.
type HostMap<T> = HashMap<Box<str>, T, foldhash::fast::RandomState>;

/// Host names to values: exact names, then the longest matching `*.suffix`, then the catch-all.
#[derive(Debug)]
pub(crate) struct HostTable<T> {
    exact: HostMap<T>,
    /// Keyed by the suffix with its leading dot (`.example.com` for `*.example.com`), so a
    /// lookup is one hash probe per label of the request host rather than a scan of all
    /// wildcards.
    wildcard: HostMap<T>,
    any: Option<T>,
}

impl<T> Default for HostTable<T> {
    fn default() -> Self {
        HostTable {
            exact: HostMap::default(),
            wildcard: HostMap::default(),
            any: None,
        }
    }
}

impl<T> HostTable<T> {
    /// `None` and `*` are the catch-all. The first value inserted for a name wins, matching the
    /// IR's deterministic (oldest first) order. Returns false when the name was already taken.
    pub(crate) fn insert(&mut self, hostname: Option<&str>, value: T) -> bool {
        let name = hostname.map(|h| h.trim_end_matches('.').to_ascii_lowercase());
        let slot = match name.as_deref() {
            None | Some("*") => {
                if self.any.is_some() {
                    return false;
                }
                self.any = Some(value);
                return true;
            }
            Some(h) => match h.strip_prefix('*') {
                Some(suffix) if suffix.starts_with('.') => self.wildcard.entry(suffix.into()),
                _ => self.exact.entry(h.into()),
            },
        };
        match slot {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(value);
                true
            }
        }
    }

    /// `host` must already be normalised (see [`normalize_host`]).
    pub(crate) fn get(&self, host: &str) -> Option<&T> {
        if let Some(v) = self.exact.get(host) {
            return Some(v);
        }
        if !self.wildcard.is_empty() {
            // Leftmost dot first = longest suffix first; index 0 is skipped because a wildcard
            // needs at least one label in front of the suffix.
            for (i, _) in host.match_indices('.').filter(|&(i, _)| i > 0) {
                if let Some(v) = self.wildcard.get(&host[i..]) {
                    return Some(v);
                }
            }
        }
        self.any.as_ref()
    }
}

/// Strips the port (and userinfo, for authorities) and a trailing dot, and lower-cases into
/// `buf` so that routing never allocates. `None` for names too long to be DNS names.
pub(crate) fn normalize_host<'b>(raw: &str, buf: &'b mut [u8; MAX_HOST_LEN]) -> Option<&'b str> {
    let raw = match raw.rfind('@') {
        Some(at) => &raw[at + 1..],
        None => raw,
    };
    let host = if raw.starts_with('[') {
        // IPv6 literal: keep the brackets, drop what follows `]`.
        &raw[..=raw.find(']')?]
    } else {
        match raw.rfind(':') {
            Some(colon) if raw[colon + 1..].bytes().all(|b| b.is_ascii_digit()) => &raw[..colon],
            _ => raw,
        }
    };
    let host = host.strip_suffix('.').unwrap_or(host);
    let out = buf.get_mut(..host.len())?;
    for (o, b) in out.iter_mut().zip(host.bytes()) {
        *o = b.to_ascii_lowercase();
    }
    std::str::from_utf8(out).ok()
}

#[derive(Debug)]
pub(crate) enum PathMatcher {
    Exact(Box<str>),
    /// Stored without a trailing slash, so `/` becomes the empty string and matches every path.
    Prefix(Box<str>),
    Regex(Regex),
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

#[derive(Debug)]
pub(crate) enum ValueMatcher {
    Exact(Box<str>),
    Regex(Regex),
}

impl ValueMatcher {
    fn matches_bytes(&self, value: &[u8]) -> bool {
        match self {
            ValueMatcher::Exact(v) => value == v.as_bytes(),
            ValueMatcher::Regex(re) => std::str::from_utf8(value).is_ok_and(|v| re.is_match(v)),
        }
    }

    /// Compares a raw query component, percent-decoding only when it has escapes.
    fn matches_query(&self, raw: &str) -> bool {
        match self {
            ValueMatcher::Exact(v) if !needs_decoding(raw) => raw == &**v,
            ValueMatcher::Exact(v) => percent_decoded(raw).eq(v.bytes()),
            ValueMatcher::Regex(re) => re.is_match(&decode_query(raw)),
        }
    }
}

#[derive(Debug)]
pub(crate) struct HeaderMatcher {
    pub name: HeaderName,
    pub value: ValueMatcher,
}

#[derive(Debug)]
pub(crate) struct QueryMatcher {
    pub name: Box<str>,
    pub value: ValueMatcher,
}

#[derive(Debug)]
pub(crate) struct RequestMatcher {
    pub path: PathMatcher,
    pub method: Option<Method>,
    pub headers: Box<[HeaderMatcher]>,
    pub query: Box<[QueryMatcher]>,
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
            if !req
                .query
                .get(&q.name)
                .is_some_and(|raw| q.value.matches_query(raw))
            {
                return false;
            }
        }
        true
    }
}

/// Query parameters, read only when a rule matches on one. Each lookup scans the raw query:
/// routes match on one or two parameters, and a scan of a short query costs less than
/// allocating a list of them (which cost a query-routed request 6% more instructions than a
/// path-routed one). Names are compared percent-decoded on the fly.
pub(crate) struct LazyQuery<'r> {
    raw: Option<&'r str>,
}

impl<'r> LazyQuery<'r> {
    pub(crate) fn new(raw: Option<&'r str>) -> Self {
        LazyQuery { raw }
    }

    /// The raw value of the first parameter called `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&'r str> {
        self.raw?
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| p.split_once('=').unwrap_or((p, "")))
            .find(|(n, _)| {
                if needs_decoding(n) {
                    percent_decoded(n).eq(name.bytes())
                } else {
                    *n == name
                }
            })
            .map(|(_, v)| v)
    }
}

fn needs_decoding(s: &str) -> bool {
    s.bytes().any(|b| b == b'%' || b == b'+')
}

/// `application/x-www-form-urlencoded` decoding (`+` is a space, as browsers and most
/// frameworks read query strings); malformed escapes stay literal.
fn percent_decoded(s: &str) -> impl Iterator<Item = u8> + '_ {
    let bytes = s.as_bytes();
    let mut i = 0;
    std::iter::from_fn(move || {
        let b = *bytes.get(i)?;
        i += 1;
        Some(match b {
            b'+' => b' ',
            b'%' => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (
                    bytes.get(i).copied().and_then(hex),
                    bytes.get(i + 1).copied().and_then(hex),
                ) {
                    (Some(h), Some(l)) => {
                        i += 2;
                        (h * 16 + l) as u8
                    }
                    _ => b'%',
                }
            }
            b => b,
        })
    })
}

fn decode_query(s: &str) -> Cow<'_, str> {
    if needs_decoding(s) {
        Cow::Owned(String::from_utf8_lossy(&percent_decoded(s).collect::<Vec<u8>>()).into_owned())
    } else {
        Cow::Borrowed(s)
    }
}

/// The outcome of routing one request on one socket.
pub(crate) enum Routed<'t> {
    /// No listener on this socket serves the host.
    NoListener,
    /// A listener took the host but none of its routes matched.
    NoRoute(&'t CompiledListener),
    Matched(&'t CompiledListener, &'t CompiledRoute),
}

/// `host` must be normalised. Bounded: one host lookup per table plus the routes of one
/// virtual host, each matcher doing work bounded by the request's size.
/// `listener` is `table.hosts.get(host)`, looked up by the caller (which also needs it for
/// the 421 check).
pub(crate) fn route<'t, H: RequestHeaders + ?Sized>(
    table: &'t SocketTable,
    listener: Option<usize>,
    host: &str,
    req: &mut RequestView<'_, H>,
) -> Routed<'t> {
    let Some(listener) = listener.and_then(|i| table.listeners.get(i)) else {
        return Routed::NoListener;
    };
    let Some(vhost) = listener.vhosts.get(host) else {
        return Routed::NoRoute(listener);
    };
    match vhost.routes.find(req) {
        Some(route) => Routed::Matched(listener, route),
        None => Routed::NoRoute(listener),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    fn norm(raw: &str) -> Option<String> {
        let mut buf = [0u8; MAX_HOST_LEN];
        normalize_host(raw, &mut buf).map(str::to_owned)
    }

    #[test]
    fn host_normalisation() {
        assert_eq!(
            norm("Cafe.Example.COM:8080").as_deref(),
            Some("cafe.example.com")
        );
        assert_eq!(
            norm("cafe.example.com.").as_deref(),
            Some("cafe.example.com")
        );
        assert_eq!(norm("[::1]:80").as_deref(), Some("[::1]"));
        assert_eq!(norm("user@host:1").as_deref(), Some("host"));
        assert_eq!(norm(&"a".repeat(300)), None);
    }

    fn table() -> HostTable<&'static str> {
        let mut t = HostTable::default();
        assert!(t.insert(Some("foo.example.com"), "exact"));
        assert!(t.insert(Some("*.example.com"), "wild"));
        assert!(t.insert(Some("*.bar.example.com"), "longer-wild"));
        assert!(t.insert(None, "any"));
        assert!(!t.insert(Some("FOO.example.com"), "dup"));
        t
    }

    #[test]
    fn host_selection_exact_wildcard_any() {
        let t = table();
        assert_eq!(t.get("foo.example.com"), Some(&"exact"));
        assert_eq!(t.get("x.example.com"), Some(&"wild"));
        assert_eq!(t.get("a.b.example.com"), Some(&"wild"));
        assert_eq!(t.get("x.bar.example.com"), Some(&"longer-wild"));
        assert_eq!(t.get("a.b.bar.example.com"), Some(&"longer-wild"));
        // The wildcard never matches the bare suffix.
        assert_eq!(t.get("example.com"), Some(&"any"));
        assert_eq!(t.get("bar.example.com"), Some(&"wild"));
        assert_eq!(t.get("other.org"), Some(&"any"));

        let mut no_any = HostTable::default();
        no_any.insert(Some("*.example.com"), 1);
        assert_eq!(no_any.get("example.com"), None);
        assert_eq!(no_any.get(".example.com"), None);
        let mut star = HostTable::default();
        star.insert(Some("*"), 1);
        assert_eq!(star.get("anything"), Some(&1));
    }

    #[test]
    fn path_prefix_respects_element_boundaries() {
        let foo = PathMatcher::Prefix("/foo".into());
        assert!(foo.matches("/foo"));
        assert!(foo.matches("/foo/"));
        assert!(foo.matches("/foo/bar"));
        assert!(!foo.matches("/foobar"));
        assert!(!foo.matches("/fo"));
        assert!(!foo.matches("/"));
        let root = PathMatcher::Prefix("".into());
        assert!(root.matches("/"));
        assert!(root.matches("/anything/at/all"));
        assert!(!root.matches("*"));
    }

    #[test]
    fn exact_path() {
        let m = PathMatcher::Exact("/foo".into());
        assert!(m.matches("/foo"));
        assert!(!m.matches("/foo/"));
    }

    fn full_regex(re: &str) -> Regex {
        crate::compile::full_match_regex(re).unwrap()
    }

    #[test]
    fn regex_must_match_whole_path() {
        let m = PathMatcher::Regex(full_regex("/v[0-9]+"));
        assert!(m.matches("/v1"));
        assert!(m.matches("/v42"));
        assert!(!m.matches("/v1/extra"));
        assert!(!m.matches("/api/v1"));
        // Alternation must not escape the anchors.
        let alt = PathMatcher::Regex(full_regex("/a|/b"));
        assert!(alt.matches("/a"));
        assert!(!alt.matches("/a/x"));
        assert!(!alt.matches("/x/b"));
    }

    fn matcher(
        method: Option<Method>,
        headers: Vec<HeaderMatcher>,
        query: Vec<QueryMatcher>,
    ) -> RequestMatcher {
        RequestMatcher {
            path: PathMatcher::Prefix("".into()),
            method,
            headers: headers.into(),
            query: query.into(),
        }
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
        let m = matcher(Some(Method::POST), vec![], vec![]);
        let h = HeaderMap::new();
        assert!(check(&m, Method::POST, &h, None));
        assert!(!check(&m, Method::GET, &h, None));
    }

    #[test]
    fn header_match_exact_regex_and_repeated() {
        let m = matcher(
            None,
            vec![
                HeaderMatcher {
                    name: HeaderName::from_static("x-version"),
                    value: ValueMatcher::Exact("v2".into()),
                },
                HeaderMatcher {
                    name: HeaderName::from_static("x-user"),
                    value: ValueMatcher::Regex(full_regex("adm.n")),
                },
            ],
            vec![],
        );
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
    fn query_match_first_occurrence_and_decoding() {
        let m = matcher(
            None,
            vec![],
            vec![QueryMatcher {
                name: "animal".into(),
                value: ValueMatcher::Exact("whale shark".into()),
            }],
        );
        let h = HeaderMap::new();
        assert!(check(&m, Method::GET, &h, Some("animal=whale%20shark")));
        assert!(check(
            &m,
            Method::GET,
            &h,
            Some("x=1&animal=whale+shark&animal=dolphin")
        ));
        assert!(!check(
            &m,
            Method::GET,
            &h,
            Some("animal=dolphin&animal=whale+shark")
        ));
        assert!(check(&m, Method::GET, &h, Some("%61nimal=whale%20shark")));
        assert!(!check(&m, Method::GET, &h, Some("animals=whale%20shark")));
        assert!(!check(&m, Method::GET, &h, None));

        let re = matcher(
            None,
            vec![],
            vec![QueryMatcher {
                name: "id".into(),
                value: ValueMatcher::Regex(full_regex("[0-9]+")),
            }],
        );
        assert!(check(&re, Method::GET, &h, Some("id=123")));
        assert!(!check(&re, Method::GET, &h, Some("id=123a")));
        assert!(!check(&re, Method::GET, &h, Some("id")));
    }

    #[test]
    fn percent_decoding_keeps_malformed_escapes() {
        let d = |s: &str| String::from_utf8(percent_decoded(s).collect()).unwrap();
        assert_eq!(d("a%2Fb"), "a/b");
        assert_eq!(d("100%"), "100%");
        assert_eq!(d("%zz"), "%zz");
        assert_eq!(d("a+b"), "a b");
    }
}
