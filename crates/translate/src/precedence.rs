//! Route precedence and virtual hosts for one listener.
//!
//! The spec orders candidate matches first by hostname specificity (exact names, then longer
//! wildcards), then by the match itself: exact path, longest prefix (regular expressions sit
//! between them, longest first: the spec leaves them open and this keeps a catch-all prefix `/`
//! from hiding them), method, most header matches, most query matches, then the oldest route,
//! then namespace/name, then rule and match order.

use crate::hostname;
use crate::objects::ObjectKey;
use gatehouse_ir as ir;
use k8s_openapi::jiff::Timestamp;
use std::cmp::Reverse;

/// One (hostname, match) pair of an attached rule.
pub struct Candidate {
    pub hostname: String,
    pub matcher: ir::HttpMatch,
    /// Index into the listener's rules.
    pub rule: usize,
    pub route_age: (Timestamp, ObjectKey),
    pub rule_index: usize,
    pub match_index: usize,
}

type MatchKey = (
    u8,
    Reverse<usize>,
    bool,
    Reverse<usize>,
    Reverse<usize>,
    (Timestamp, ObjectKey),
    usize,
    usize,
);

fn match_key(c: &Candidate) -> MatchKey {
    let (rank, len) = match &c.matcher.path {
        ir::PathMatch::Exact(p) => (0, p.len()),
        ir::PathMatch::Regex(p) => (1, p.len()),
        ir::PathMatch::Prefix(p) => (2, p.len()),
    };
    (
        rank,
        Reverse(len),
        c.matcher.method.is_none(),
        Reverse(c.matcher.headers.len()),
        Reverse(c.matcher.query_params.len()),
        c.route_age.clone(),
        c.rule_index,
        c.match_index,
    )
}

/// Build the listener's virtual hosts. Each host's list ends with the entries of the less
/// specific hosts that also cover it, so the data plane never falls through between hosts.
pub fn virtual_hosts(mut candidates: Vec<Candidate>) -> Vec<ir::VirtualHost> {
    candidates.sort_by_cached_key(match_key);
    let mut hosts: Vec<String> = candidates.iter().map(|c| c.hostname.clone()).collect();
    hosts.sort_by(|a, b| {
        hostname::specificity(a)
            .cmp(&hostname::specificity(b))
            .then(a.cmp(b))
    });
    hosts.dedup();
    hosts
        .iter()
        .map(|host| {
            let mut routes = Vec::new();
            for general in hosts
                .iter()
                .filter(|g| *g == host || hostname::covers(g, host))
            {
                routes.extend(
                    candidates
                        .iter()
                        .filter(|c| &c.hostname == general)
                        .map(|c| ir::RouteEntry {
                            matcher: c.matcher.clone(),
                            rule: c.rule,
                        }),
                );
            }
            ir::VirtualHost {
                hostname: host.clone(),
                routes,
            }
        })
        .collect()
}
