//! Status conditions with the Gateway API's types and reasons.
//!
//! Translate is pure, so it cannot read the clock: every condition it builds carries the Unix
//! epoch as lastTransitionTime. Whoever publishes status calls [`stamp`] with the previous
//! conditions and the current time, which keeps the old time for unchanged conditions.

use crate::Status;
use crate::routes::RouteStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

pub fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: if ok { "True" } else { "False" }.to_string(),
        reason: reason.to_string(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
    }
}

/// Give every condition in `new` its lastTransitionTime: the previous one's when the status did
/// not change, otherwise `now`.
pub fn stamp(new: &mut [Condition], previous: &[Condition], now: Timestamp) {
    for c in new {
        c.last_transition_time = match previous.iter().find(|p| p.type_ == c.type_) {
            Some(p) if p.status == c.status => p.last_transition_time.clone(),
            _ => Time(now),
        };
    }
}

/// The condition types Gatehouse sets on GatewayClasses, Gateways and listeners. Any other type
/// found there belongs to someone else and is kept as it is.
const OWN_TYPES: [&str; 7] = [
    names::ACCEPTED,
    names::ADDRESSES_ASSIGNED,
    names::INSECURE_FRONTEND_VALIDATION_MODE,
    names::PROGRAMMED,
    names::RESOLVED_REFS,
    names::CONFLICTED,
    names::PARTIALLY_INVALID,
];

/// Append the conditions of `previous` whose type is not ours, unchanged: status is shared,
/// and another controller's condition must survive our writes.
fn keep_foreign(new: &mut Vec<Condition>, previous: &[Condition]) {
    for p in previous {
        if !OWN_TYPES.contains(&p.type_.as_str()) && !new.iter().any(|c| c.type_ == p.type_) {
            new.push(p.clone());
        }
    }
}

/// Give each condition of `status` its lastTransitionTime: kept from `previous` while the
/// condition's status is unchanged, else `now`; on GatewayClasses, Gateways and listeners,
/// conditions of types Gatehouse does not set are carried over from `previous`. Publishers
/// call this; translate itself never reads the clock.
pub fn stamp_status(status: &mut Status, previous: &Status, now: Timestamp) {
    stamp_status_since(status, previous, &[], now)
}

/// [`stamp_status`], told what each route status of `previous` was stamped from:
/// `unstamped[i]` is the unstamped status (as translate gave it) of the i-th entry of
/// `previous.routes`, in key order. A route whose status is that same `Arc` again (its
/// translation was reused) stamps to the previous entry itself, without comparing its
/// conditions: thousands of routes on every pass, each compared string by string otherwise.
/// Entries beyond `unstamped` (or an empty slice) are compared as [`stamp_status`] does.
pub fn stamp_status_since(
    status: &mut Status,
    previous: &Status,
    unstamped: &[std::sync::Arc<RouteStatus>],
    now: Timestamp,
) {
    fn each(new: Option<&mut Vec<Condition>>, old: Option<&Vec<Condition>>, now: Timestamp) {
        if let Some(new) = new {
            stamp(new, old.map(Vec::as_slice).unwrap_or_default(), now);
        }
    }
    fn shared(new: Option<&mut Vec<Condition>>, old: Option<&Vec<Condition>>, now: Timestamp) {
        if let Some(new) = new {
            let old = old.map(Vec::as_slice).unwrap_or_default();
            stamp(new, old, now);
            keep_foreign(new, old);
        }
    }
    for (name, s) in &mut status.gateway_classes {
        let old = previous
            .gateway_classes
            .get(name)
            .and_then(|p| p.conditions.as_ref());
        shared(s.conditions.as_mut(), old, now);
    }
    // Gateways and ListenerSets: distinct generated status types of the same shape, conditions
    // on the object and on each listener (matched by name).
    macro_rules! with_listeners {
        ($new:expr, $old:expr) => {
            for (key, s) in $new {
                let old = $old.get(key);
                shared(
                    s.conditions.as_mut(),
                    old.and_then(|p| p.conditions.as_ref()),
                    now,
                );
                for l in s.listeners.iter_mut().flatten() {
                    let old_l = old
                        .and_then(|p| p.listeners.as_ref())
                        .and_then(|ls| ls.iter().find(|o| o.name == l.name));
                    shared(Some(&mut l.conditions), old_l.map(|o| &o.conditions), now);
                }
            }
        };
    }
    with_listeners!(&mut status.gateways, previous.gateways);
    with_listeners!(&mut status.listener_sets, previous.listener_sets);
    // Both maps are walked in key order together, so each route's previous status is found
    // without a lookup: there is one per route, thousands, on every pass.
    let mut before = previous.routes.iter().enumerate().peekable();
    for (key, s) in &mut status.routes {
        while before.next_if(|(_, (k, _))| *k < key).is_some() {}
        let found = before.next_if(|(_, (k, _))| *k == key);
        let old = found.map(|(_, (_, o))| o);
        // What the previous entry was stamped from, if it is this very status: stamping it
        // again gives the previous entry (the same conditions, so the same times).
        let restamp = found
            .and_then(|(i, _)| unstamped.get(i))
            .is_some_and(|u| std::sync::Arc::ptr_eq(u, s));
        // A route whose status stamps to what it was keeps that `Arc`: nothing is copied for
        // the thousands of routes a change does not touch, and the status writer sees by
        // pointer that they are unchanged.
        if let Some(old) = old
            && (restamp || stamps_to(s, old))
        {
            *s = std::sync::Arc::clone(old);
            continue;
        }
        for p in &mut std::sync::Arc::make_mut(s).parents {
            let old_p = old.and_then(|o| o.parents.iter().find(|op| op.parent_ref == p.parent_ref));
            each(Some(&mut p.conditions), old_p.map(|o| &o.conditions), now);
        }
    }
    for (key, s) in &mut status.backend_tls_policies {
        let old = previous.backend_tls_policies.get(key);
        for a in &mut s.ancestors {
            let old_a = old.and_then(|o| {
                o.ancestors
                    .iter()
                    .find(|oa| oa.ancestor_ref == a.ancestor_ref)
            });
            each(Some(&mut a.conditions), old_a.map(|o| &o.conditions), now);
        }
    }
}

/// Whether stamping `new` against `old` (as [`stamp_status`] does) gives `old` itself: the same
/// parents in the same order, each with the same conditions but for their times, each found in
/// `old` where it stands (stamping looks parents up by parentRef and conditions by type, first
/// match). Then every time comes from `old`, and so does everything else.
fn stamps_to(new: &RouteStatus, old: &RouteStatus) -> bool {
    new.parents.len() == old.parents.len()
        && new
            .parents
            .iter()
            .zip(&old.parents)
            .enumerate()
            .all(|(i, (p, op))| {
                p.parent_ref == op.parent_ref
                    && p.controller_name == op.controller_name
                    // No earlier parent has the parentRef (stamping takes the first).
                    && old.parents[..i].iter().all(|x| x.parent_ref != p.parent_ref)
                    && p.conditions.len() == op.conditions.len()
                    && p.conditions
                        .iter()
                        .zip(&op.conditions)
                        .enumerate()
                        .all(|(j, (c, oc))| {
                            c.type_ == oc.type_
                                && c.status == oc.status
                                && c.reason == oc.reason
                                && c.message == oc.message
                                && c.observed_generation == oc.observed_generation
                                && op.conditions[..j].iter().all(|x| x.type_ != c.type_)
                        })
            })
}

/// Condition types and reasons used across the crate, spelled once.
pub mod names {
    pub const ACCEPTED: &str = "Accepted";
    pub const PROGRAMMED: &str = "Programmed";
    pub const RESOLVED_REFS: &str = "ResolvedRefs";
    pub const CONFLICTED: &str = "Conflicted";
    pub const PARTIALLY_INVALID: &str = "PartiallyInvalid";

    pub const INVALID: &str = "Invalid";
    pub const PENDING: &str = "Pending";
    pub const PORT_UNAVAILABLE: &str = "PortUnavailable";
    pub const INVALID_PARAMETERS: &str = "InvalidParameters";
    pub const LISTENERS_NOT_VALID: &str = "ListenersNotValid";
    pub const UNSUPPORTED_ADDRESS: &str = "UnsupportedAddress";
    pub const ADDRESS_NOT_USABLE: &str = "AddressNotUsable";
    pub const ADDRESS_NOT_ASSIGNED: &str = "AddressNotAssigned";
    /// Gateway condition type and its True reason: every spec.addresses entry was given an
    /// address of the routability it asks for.
    pub const ADDRESSES_ASSIGNED: &str = "AddressesAssigned";
    pub const PARTIALLY_ASSIGNED: &str = "PartiallyAssigned";
    pub const NOT_ASSIGNED: &str = "NotAssigned";
    /// spec.addresses[].routability: a Service cluster IP.
    pub const ROUTABILITY_CLUSTER: &str = "Cluster";
    pub const UNSUPPORTED_PROTOCOL: &str = "UnsupportedProtocol";
    pub const INVALID_ROUTE_KINDS: &str = "InvalidRouteKinds";
    pub const HOSTNAME_CONFLICT: &str = "HostnameConflict";
    pub const PROTOCOL_CONFLICT: &str = "ProtocolConflict";
    pub const NO_CONFLICTS: &str = "NoConflicts";
    pub const NOT_ALLOWED: &str = "NotAllowed";
    pub const PARENT_NOT_ACCEPTED: &str = "ParentNotAccepted";
    pub const NOT_ALLOWED_BY_LISTENERS: &str = "NotAllowedByListeners";
    pub const NO_MATCHING_LISTENER_HOSTNAME: &str = "NoMatchingListenerHostname";
    pub const NO_MATCHING_PARENT: &str = "NoMatchingParent";
    pub const UNSUPPORTED_VALUE: &str = "UnsupportedValue";
    pub const REF_NOT_PERMITTED: &str = "RefNotPermitted";
    pub const INVALID_KIND: &str = "InvalidKind";
    pub const BACKEND_NOT_FOUND: &str = "BackendNotFound";
    pub const INVALID_CERTIFICATE_REF: &str = "InvalidCertificateRef";
    pub const INVALID_CA_CERTIFICATE_REF: &str = "InvalidCACertificateRef";
    pub const INVALID_CA_CERTIFICATE_KIND: &str = "InvalidCACertificateKind";
    pub const INVALID_CLIENT_CERTIFICATE_REF: &str = "InvalidClientCertificateRef";
    pub const CONFLICTED_POLICY: &str = "Conflicted";
    pub const NO_VALID_CA_CERTIFICATE: &str = "NoValidCACertificate";
    pub const INSECURE_FRONTEND_VALIDATION_MODE: &str = "InsecureFrontendValidationMode";
    pub const CONFIGURATION_CHANGED: &str = "ConfigurationChanged";
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(c: &[Condition], type_: &str) -> Option<Condition> {
        c.iter().find(|c| c.type_ == type_).cloned()
    }

    /// A route's status with one parent (Gateway `gw`) and one condition.
    fn route_status(c: Condition) -> crate::routes::RouteStatus {
        use crate::routes::{ParentRef, RouteParentStatus, RouteStatus};
        RouteStatus {
            parents: vec![RouteParentStatus {
                parent_ref: ParentRef {
                    group: None,
                    kind: None,
                    name: "gw".into(),
                    namespace: None,
                    port: None,
                    section_name: None,
                },
                controller_name: "c".into(),
                conditions: vec![c],
            }],
        }
    }

    /// The key of HTTPRoute `ns/name`.
    fn route_key(name: &str) -> std::sync::Arc<crate::routes::RouteKey> {
        std::sync::Arc::new(crate::routes::RouteKey {
            kind: "HTTPRoute".into(),
            key: crate::ObjectKey::new("ns", name),
        })
    }

    /// Routes are matched to their previous status by key while both maps are walked in
    /// order: routes only in the old status, or only in the new one, must not shift the match.
    #[test]
    fn each_route_keeps_the_times_of_its_own_previous_status() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(2_000).unwrap();
        let key = route_key;
        let status = |accepted: bool, at: Option<Timestamp>| {
            let mut c = condition(names::ACCEPTED, accepted, names::ACCEPTED, "", Some(1));
            if let Some(at) = at {
                c.last_transition_time = Time(at);
            }
            route_status(c)
        };
        let mut previous = Status::default();
        for (name, accepted) in [("a", true), ("b", true), ("d", false), ("e", true)] {
            previous
                .routes
                .insert(key(name), std::sync::Arc::new(status(accepted, Some(t0))));
        }
        let mut now = Status::default();
        for (name, accepted) in [
            ("a", true),
            ("c", true),
            ("d", false),
            ("e", false),
            ("f", true),
        ] {
            now.routes
                .insert(key(name), std::sync::Arc::new(status(accepted, None)));
        }
        stamp_status(&mut now, &previous, t1);
        let time = |name: &str| {
            now.routes[&key(name)].parents[0].conditions[0]
                .last_transition_time
                .clone()
        };
        assert_eq!(time("a"), Time(t0), "unchanged: kept");
        assert_eq!(time("c"), Time(t1), "new route");
        assert_eq!(time("d"), Time(t0), "unchanged after a route that went");
        assert_eq!(time("e"), Time(t1), "its status changed");
        assert_eq!(time("f"), Time(t1), "new, after the last previous route");
        // What stamps to what it was is what it was: shared, not copied.
        let shared = |name: &str| {
            std::sync::Arc::ptr_eq(&now.routes[&key(name)], &previous.routes[&key(name)])
        };
        assert!(shared("a") && shared("d"));
        assert!(!shared("e"));
    }

    /// A condition whose reason or message changed keeps its time (its status did not change)
    /// but is not taken for the previous one.
    #[test]
    fn a_route_whose_message_changed_keeps_its_time_in_a_new_status() {
        use crate::routes::RouteKey;
        use std::sync::Arc;
        let t0 = Timestamp::from_second(1_000).unwrap();
        let key = Arc::new(RouteKey {
            kind: "HTTPRoute".into(),
            key: crate::ObjectKey::new("ns", "r"),
        });
        let status = |message: &str| {
            route_status(condition(
                names::RESOLVED_REFS,
                false,
                "BackendNotFound",
                message,
                Some(1),
            ))
        };
        let mut previous = Status::default();
        let mut before = status("Service a not found");
        before.parents[0].conditions[0].last_transition_time = Time(t0);
        previous.routes.insert(key.clone(), Arc::new(before));
        let mut now = Status::default();
        now.routes
            .insert(key.clone(), Arc::new(status("Service b not found")));
        stamp_status(&mut now, &previous, Timestamp::from_second(2_000).unwrap());
        let c = &now.routes[&key].parents[0].conditions[0];
        assert_eq!(c.message, "Service b not found");
        assert_eq!(c.last_transition_time, Time(t0));
        assert!(!Arc::ptr_eq(&now.routes[&key], &previous.routes[&key]));
    }

    /// Told what the previous statuses were stamped from, stamping gives what
    /// [`stamp_status`] gives: the previous entry for a route handed the same `Arc` again,
    /// and nothing borrowed from a route whose `Arc` now sits under another key.
    #[test]
    fn stamping_knows_a_reused_status_by_pointer_and_by_key() {
        use std::sync::Arc;
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(2_000).unwrap();
        let key = route_key;
        let unstamped = |accepted: bool| {
            Arc::new(route_status(condition(
                names::ACCEPTED,
                accepted,
                names::ACCEPTED,
                "",
                Some(1),
            )))
        };
        let (a, b, c) = (unstamped(true), unstamped(false), unstamped(true));
        let mut first = Status::default();
        for (name, s) in [("a", &a), ("b", &b), ("c", &c)] {
            first.routes.insert(key(name), Arc::clone(s));
        }
        let first_unstamped: Vec<_> = first.routes.values().cloned().collect();
        stamp_status_since(&mut first, &Status::default(), &[], t0);

        // a and b swap their statuses (each flips), c is handed its own again, d is new.
        let mut second = Status::default();
        for (name, s) in [("a", &b), ("b", &a), ("c", &c), ("d", &unstamped(true))] {
            second.routes.insert(key(name), Arc::clone(s));
        }
        let mut expected = second.clone();
        stamp_status(&mut expected, &first, t1);
        stamp_status_since(&mut second, &first, &first_unstamped, t1);
        assert_eq!(second, expected);
        let time = |name: &str| {
            second.routes[&key(name)].parents[0].conditions[0]
                .last_transition_time
                .clone()
        };
        assert_eq!(time("a"), Time(t1), "flipped: a new time");
        assert_eq!(time("b"), Time(t1), "flipped: a new time");
        assert_eq!(time("c"), Time(t0));
        assert_eq!(time("d"), Time(t1));
        assert!(Arc::ptr_eq(
            &second.routes[&key("c")],
            &first.routes[&key("c")]
        ));
    }

    #[test]
    fn foreign_conditions_survive_and_stale_own_ones_go() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(2_000).unwrap();
        let mut foreign = condition(
            "example.com/Audited",
            true,
            "Seen",
            "by someone else",
            Some(1),
        );
        foreign.last_transition_time = Time(t0);
        let mut stale_conflict =
            condition(names::CONFLICTED, true, "HostnameConflict", "", Some(1));
        stale_conflict.last_transition_time = Time(t0);
        let mut accepted = condition(names::ACCEPTED, true, names::ACCEPTED, "", Some(1));
        accepted.last_transition_time = Time(t0);
        // Set while the Gateway had spec.addresses; they were removed since.
        let stale_assigned = condition(
            names::ADDRESSES_ASSIGNED,
            false,
            names::NOT_ASSIGNED,
            "",
            Some(1),
        );
        let previous = vec![accepted, foreign.clone(), stale_conflict, stale_assigned];

        // Our new conditions: Accepted unchanged, Programmed new, Conflicted and
        // AddressesAssigned no longer set.
        let mut new = vec![
            condition(names::ACCEPTED, true, names::ACCEPTED, "", Some(2)),
            condition(names::PROGRAMMED, true, names::PROGRAMMED, "", Some(2)),
        ];
        stamp(&mut new, &previous, t1);
        keep_foreign(&mut new, &previous);

        assert_eq!(
            at(&new, names::ACCEPTED).unwrap().last_transition_time,
            Time(t0)
        );
        assert_eq!(
            at(&new, names::PROGRAMMED).unwrap().last_transition_time,
            Time(t1)
        );
        assert_eq!(
            at(&new, "example.com/Audited"),
            Some(foreign),
            "kept byte for byte"
        );
        assert_eq!(
            at(&new, names::CONFLICTED),
            None,
            "our own stale type is not carried"
        );
        assert_eq!(at(&new, names::ADDRESSES_ASSIGNED), None);
        assert_eq!(new.len(), 3);
    }
}
