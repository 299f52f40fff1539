//! HTTPRoute against GRPCRoute on one listener.
//!
//! Both kinds are served by the same HTTP router, and a gRPC call is an HTTP request: if an
//! HTTPRoute and a GRPCRoute served an overlapping hostname on one listener, which one takes
//! a call would depend on match details across kinds. The spec forbids it: of two such
//! routes exactly one is accepted there, the older (then the first by `namespace/name`); the
//! other is `Accepted=False` on the parentRef that chose the listener.
//!
//! This runs after every kind is attached, over the attachments of each listener oldest
//! first: an attachment that overlaps an already kept one of the other kind is dropped.

use super::{Attached, Attachment, RouteKey};
use crate::conditions::names::{ACCEPTED, NOT_ALLOWED_BY_LISTENERS};
use crate::gateways::GatewayCtx;
use crate::hostname;
use std::collections::BTreeMap;
use std::sync::Arc;

const HTTP_ROUTE: &str = "HTTPRoute";
const GRPC_ROUTE: &str = "GRPCRoute";

/// The kind that may not share a hostname with `kind` on one listener, if any.
fn rival_kind(kind: &str) -> Option<&'static str> {
    match kind {
        HTTP_ROUTE => Some(GRPC_ROUTE),
        GRPC_ROUTE => Some(HTTP_ROUTE),
        _ => None,
    }
}

/// Do two sets of served hostnames (exact, wildcard or `*`) share a name?
fn overlap(a: &[String], b: &[String]) -> bool {
    a.iter().any(|x| {
        b.iter()
            .any(|y| x == y || hostname::covers(x, y) || hostname::covers(y, x))
    })
}

/// Drops the younger of every HTTPRoute/GRPCRoute pair that overlaps on a listener, fixing
/// the listener's attachedRoutes and the loser's Accepted condition.
pub fn resolve(out: &mut Attached, gateways: &mut [GatewayCtx]) {
    // Oldest first, so each attachment is checked against the older ones already kept.
    let mut order: Vec<usize> = (0..out.attachments.len()).collect();
    order.sort_by(|&i, &j| {
        out.attachments[i]
            .route_age
            .cmp(&out.attachments[j].route_age)
    });
    // Kept attachments by (gateway, listener, kind), oldest first: an attachment is only
    // checked against the rival kind's on its own listener. Checking every kept attachment
    // made this quadratic in the routes (a fifth of a pass at 5000 HTTPRoutes, none of them
    // with a rival).
    let mut kept: BTreeMap<(usize, usize, &str), Vec<usize>> = BTreeMap::new();
    let mut dropped: Vec<(usize, usize)> = Vec::new(); // (attachment, the older rival)
    for i in order {
        let a = &out.attachments[i];
        let kind = a.route().kind.as_str();
        let rival = rival_kind(kind)
            .and_then(|other| kept.get(&(a.gateway, a.listener, other)))
            .and_then(|older| {
                older
                    .iter()
                    .copied()
                    .find(|&k| overlap(&a.hostnames, &out.attachments[k].hostnames))
            });
        match rival {
            Some(k) => dropped.push((i, k)),
            None => kept
                .entry((a.gateway, a.listener, kind))
                .or_default()
                .push(i),
        }
    }
    if dropped.is_empty() {
        return;
    }
    // Parent status entries that lost a listener, with why (the first loss names the rival).
    let mut lost: BTreeMap<(RouteKey, usize), String> = BTreeMap::new();
    for &(i, k) in &dropped {
        let a = &out.attachments[i];
        let winner = out.attachments[k].route();
        let listener = &mut gateways[a.gateway].listeners[a.listener];
        listener.attached_routes -= 1;
        let why = format!(
            "listener {} already serves these hostnames to the older {} {}: an HTTPRoute and a \
             GRPCRoute may not share a hostname on one listener",
            listener.name, winner.kind, winner.key
        );
        for &p in &a.parents {
            lost.entry((a.route().clone(), p))
                .or_insert_with(|| why.clone());
        }
    }
    let mut dropped_index: Vec<usize> = dropped.iter().map(|&(i, _)| i).collect();
    dropped_index.sort_unstable();
    for i in dropped_index.into_iter().rev() {
        out.attachments.remove(i);
    }
    // A parentRef is refused when none of the listeners it chose serves the route any more.
    let still_served = |route: &RouteKey, parent: usize, attachments: &[Attachment]| {
        attachments
            .iter()
            .any(|a| a.route() == route && a.parents.contains(&parent))
    };
    for ((route, parent), why) in lost {
        if still_served(&route, parent, &out.attachments) {
            continue;
        }
        // The status may be shared with the route's kept work (`Reuse`): changed in a copy.
        let Some(entry) = out
            .status
            .get_mut(&route)
            .and_then(|s| Arc::make_mut(s).parents.get_mut(parent))
        else {
            continue;
        };
        if let Some(accepted) = entry.conditions.iter_mut().find(|c| c.type_ == ACCEPTED) {
            accepted.status = "False".into();
            accepted.reason = NOT_ALLOWED_BY_LISTENERS.into();
            accepted.message = why;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn hostname_sets_overlap_through_wildcards() {
        assert!(overlap(&s(&["a.example.com"]), &s(&["a.example.com"])));
        assert!(overlap(&s(&["*.example.com"]), &s(&["a.example.com"])));
        assert!(overlap(&s(&["a.example.com"]), &s(&["*"])));
        assert!(overlap(&s(&["*.example.com"]), &s(&["*.a.example.com"])));
        assert!(!overlap(&s(&["a.example.com"]), &s(&["b.example.com"])));
        assert!(!overlap(&s(&["*.example.com"]), &s(&["example.com"])));
    }

    #[test]
    fn only_http_and_grpc_routes_are_rivals() {
        assert_eq!(rival_kind("HTTPRoute"), Some("GRPCRoute"));
        assert_eq!(rival_kind("GRPCRoute"), Some("HTTPRoute"));
        assert_eq!(rival_kind("TLSRoute"), None);
        assert_eq!(rival_kind("TCPRoute"), None);
    }
}
