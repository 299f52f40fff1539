//! Route precedence and virtual hosts for one listener.
//!
//! The spec orders candidate matches first by hostname specificity (exact names, then longer
//! wildcards; among the candidates of one hostname, the specificity of the route hostname it
//! came from, before a listener hostname narrowed it), then by the match itself: exact path, longest prefix (regular expressions sit
//! between them, longest first: the spec leaves them open and this keeps a catch-all prefix `/`
//! from hiding them), method, most header matches, most query matches, then the oldest route,
//! then namespace/name, then rule and match order.

use crate::hostname;
use gatehouse_ir as ir;
use std::cmp::{Ordering, Reverse};
// foldhash: a fraction of SipHash's cost per hostname, still seeded per process (hashbrown's default).
use foldhash::{HashMap, HashMapExt};

/// One (hostname, match) pair of an attached rule, borrowed from the attachment: a listener
/// has one per hostname and match of every route, and only the winners' matches are copied
/// into the configuration.
pub struct Candidate<'a> {
    pub hostname: &'a str,
    /// The specificity of the route hostname `hostname` came from
    /// ([`hostname::origin_specificity`]): first in precedence among the candidates of one
    /// hostname.
    pub origin: (u8, Reverse<usize>),
    pub matcher: &'a std::sync::Arc<ir::HttpMatch>,
    /// Index into the listener's rules.
    pub rule: usize,
    pub route_age: &'a crate::routes::RouteAge,
    pub rule_index: usize,
    pub match_index: usize,
}

type MatchKey<'a> = (
    (u8, Reverse<usize>),
    u8,
    Reverse<usize>,
    bool,
    Reverse<usize>,
    Reverse<usize>,
    &'a crate::routes::RouteAge,
    usize,
    usize,
);

fn match_key<'a>(c: &Candidate<'a>) -> MatchKey<'a> {
    let (rank, len) = match &c.matcher.path {
        ir::PathMatch::Exact(p) => (0, p.len()),
        ir::PathMatch::Regex(p) => (1, p.len()),
        ir::PathMatch::Prefix(p) => (2, p.len()),
    };
    (
        c.origin,
        rank,
        Reverse(len),
        c.matcher.method.is_none(),
        Reverse(c.matcher.headers.len()),
        Reverse(c.matcher.query_params.len()),
        c.route_age,
        c.rule_index,
        c.match_index,
    )
}

/// Build the listener's virtual hosts. Each host's list ends with the entries of the less
/// specific hosts that also cover it, so the data plane never falls through between hosts.
///
/// Linear in the candidates (after the sort) and in the hosts times their labels: a host's
/// covering hosts are looked up by name (itself, the wildcards of its suffixes, `*`) instead of
/// testing every other host, which made a listener with thousands of hostnames quadratic.
pub fn virtual_hosts(candidates: Vec<Candidate<'_>>) -> Vec<ir::VirtualHost> {
    // Each hostname's candidates, in precedence order: grouped first, then each group sorted
    // (stably) on its own. Candidates of different hosts are never compared, and a listener
    // whose thousands of routes each have a name of their own sorts nothing (and, with groups
    // of one or two held inline, allocates nothing per host).
    let mut by_host: HashMap<&str, Group> = HashMap::with_capacity(candidates.len());
    for (i, c) in candidates.iter().enumerate() {
        by_host.entry(c.hostname).or_default().push(i);
    }
    for group in by_host.values_mut().filter(|g| g.len() > 1) {
        group.sort_by_cached_key(|&i| match_key(&candidates[i]));
    }
    let mut hosts: Vec<(&str, &Group)> = by_host.iter().map(|(h, g)| (*h, g)).collect();
    // Names are distinct: an unstable sort gives the one order.
    hosts.sort_unstable_by(|a, b| by_specificity(a.0, b.0));
    let wildcards = wildcards(hosts.iter().map(|(h, _)| *h));
    // With no wildcard host and no `*`, every host is covered by itself alone, and nothing
    // needs looking up.
    let alone = wildcards.is_empty() && !by_host.contains_key("*");
    // The hosts covering the one being built (with their candidates), in one buffer for all:
    // a listener has thousands of hosts, most covered by themselves alone.
    let mut general: Vec<(&str, &Group)> = Vec::new();
    hosts
        .iter()
        .map(|&(host, own)| {
            general.clear();
            if alone {
                general.push((host, own));
            } else {
                general.extend(
                    covering(host, &wildcards)
                        .filter_map(|g| by_host.get_key_value(g).map(|(g, c)| (*g, c))),
                );
                general.sort_unstable_by(|a, b| by_specificity(a.0, b.0));
            }
            let mut routes = Vec::with_capacity(general.iter().map(|(_, c)| c.len()).sum());
            routes.extend(
                general
                    .iter()
                    .flat_map(|(_, c)| c.iter())
                    .map(|&i| ir::RouteEntry {
                        matcher: candidates[i].matcher.clone(),
                        rule: candidates[i].rule,
                    }),
            );
            ir::VirtualHost {
                hostname: host.to_owned(),
                routes,
            }
        })
        .collect()
}

/// The candidates of one hostname (indices): most have one or two.
type Group = smallvec::SmallVec<[usize; 2]>;

/// Most specific first, then by name: the order hosts are listed and fall through in.
fn by_specificity(a: &str, b: &str) -> Ordering {
    hostname::specificity(a)
        .cmp(&hostname::specificity(b))
        .then(a.cmp(b))
}

/// The wildcard hosts by what follows their `*` (`.example.com`): [`covering`] then finds a
/// host's covering wildcards by slices of the host's own name, with no string built per host.
fn wildcards<'h>(hosts: impl Iterator<Item = &'h str>) -> HashMap<&'h str, &'h str> {
    hosts
        .filter_map(|h| {
            h.strip_prefix('*')
                .filter(|s| !s.is_empty())
                .map(|s| (s, h))
        })
        .collect()
}

/// Every hostname that [`hostname::covers`] `host` among the hosts: the host itself, the
/// wildcard of each of its proper label suffixes that is one of `wildcards` (keyed by what
/// follows the `*`), and `*`.
fn covering<'h>(
    host: &'h str,
    wildcards: &'h HashMap<&'h str, &'h str>,
) -> impl Iterator<Item = &'h str> {
    let rest = host.strip_prefix("*.").unwrap_or(host);
    let suffixes = rest
        .match_indices('.')
        .filter_map(move |(dot, _)| wildcards.get(&rest[dot..]).copied());
    std::iter::once(host)
        .chain(suffixes)
        .chain((host != "*").then_some("*"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lookup finds exactly the hosts the definition of covering accepts.
    #[test]
    fn covering_agrees_with_covers() {
        let hosts = [
            "*",
            "a.b.example.com",
            "b.example.com",
            "example.com",
            "*.example.com",
            "*.b.example.com",
            "*.com",
            "*.a.b.example.com",
            "other.org",
            "*.org",
        ];
        let wildcards = wildcards(hosts.iter().copied());
        for specific in hosts {
            let mut found: Vec<String> = covering(specific, &wildcards)
                .map(str::to_owned)
                .filter(|c| hosts.contains(&c.as_str()))
                .collect();
            found.sort();
            let mut expected: Vec<String> = hosts
                .iter()
                .filter(|g| **g == specific || hostname::covers(g, specific))
                .map(|g| g.to_string())
                .collect();
            expected.sort();
            assert_eq!(found, expected, "hosts covering {specific}");
        }
    }
}
