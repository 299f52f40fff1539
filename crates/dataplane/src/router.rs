//! Host and rule selection: which listener and virtual host a request's host picks, then the
//! first route of that virtual host whose matcher (`matchers`) accepts the request. Runs per
//! request on tables prepared by `compile`, without allocating.

mod index;

pub(crate) use index::RouteTable;

use crate::headers::RequestHeaders;
use crate::matchers::RequestView;
use crate::metrics::RouteMetrics;
use crate::table::{CompiledRoute, CompiledRule, SocketTable};
use http::StatusCode;
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
    /// Room for `exact` names without growing (a listener's virtual hosts are counted before
    /// they are compiled).
    pub(crate) fn with_capacity(exact: usize) -> Self {
        HostTable {
            exact: HostMap::with_capacity_and_hasher(exact, Default::default()),
            ..HostTable::default()
        }
    }

    /// `None` and `*` are the catch-all. The first value inserted for a name wins, matching the
    /// IR's deterministic (oldest first) order. Returns false when the name was already taken.
    pub(crate) fn insert(&mut self, hostname: Option<&str>, value: T) -> bool {
        let name = hostname.map(|h| h.trim_end_matches('.').to_ascii_lowercase());
        let Some(name) = name.filter(|h| h != "*") else {
            if self.any.is_some() {
                return false;
            }
            self.any = Some(value);
            return true;
        };
        let slot = match name.strip_prefix('*') {
            Some(suffix) if suffix.starts_with('.') => self.wildcard.entry(suffix.into()),
            // The lower-cased copy becomes the key itself (its capacity is its length): one
            // allocation per name, and a listener has thousands.
            _ => self.exact.entry(name.into_boxed_str()),
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

/// The outcome of routing one request on one socket.
pub(crate) enum Routed<'t> {
    Matched(&'t CompiledRoute, &'t CompiledRule),
    /// No route takes the request: Gatehouse answers it itself.
    Refused(Refusal<'t>),
}

/// Gatehouse's answer to a request no route takes, and the metrics it counts in.
pub(crate) struct Refusal<'t> {
    pub status: StatusCode,
    pub text: &'static str,
    pub metrics: &'t RouteMetrics,
}

const MISDIRECTED: &str = "request host does not match the TLS server name of this connection\n";
const NOT_FOUND: &str = "no route for this request\n";

impl<'t> Refusal<'t> {
    /// TLS: the Host belongs to another listener than the one the SNI chose.
    pub(crate) fn misdirected(table: &'t SocketTable) -> Self {
        Refusal {
            status: StatusCode::MISDIRECTED_REQUEST,
            text: MISDIRECTED,
            metrics: &table.unmatched,
        }
    }

    fn not_found(metrics: &'t RouteMetrics) -> Self {
        Refusal {
            status: StatusCode::NOT_FOUND,
            text: NOT_FOUND,
            metrics,
        }
    }
}

/// `host` must be normalised. Bounded: one host lookup per table plus the routes of one
/// virtual host, each matcher doing work bounded by the request's size. `listener` is
/// `table.hosts.get(host)`, looked up by the caller (`ConnContext::route`, which also needs it
/// for the 421 check).
pub(crate) fn route<'t, H: RequestHeaders + ?Sized>(
    table: &'t SocketTable,
    listener: Option<usize>,
    host: &str,
    req: &mut RequestView<'_, H>,
) -> Routed<'t> {
    let Some(listener) = listener.and_then(|i| table.listeners.get(i)) else {
        return Routed::Refused(Refusal::not_found(&table.unmatched));
    };
    let route = listener.vhosts.get(host).and_then(|vhost| {
        let route = vhost.routes.find(req)?;
        Some((route, vhost.rule(listener, route)))
    });
    match route {
        Some((route, rule)) => Routed::Matched(route, rule),
        None => Routed::Refused(Refusal::not_found(&listener.unmatched)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
