//! ListenerSets: more listeners for a Gateway, declared by someone else (GEP-1713).
//!
//! A ListenerSet names its parent Gateway; the Gateway's `spec.allowedListeners` says which
//! namespaces may attach (none by default). The listeners of the attached sets are appended to
//! the Gateway's own, oldest set first, and from there on they are ordinary listeners: one
//! socket per port, conflicts, TLS, route attachment. What differs is where they are reported
//! (the ListenerSet's status, not the Gateway's) and which parentRefs reach them (a route must
//! name the ListenerSet; a parentRef to the Gateway only sees the Gateway's own listeners).

use crate::conditions::{condition, names::*};
use crate::gateways::{AllowedNamespaces, GatewayCtx, listener_status, namespace_selector};
use crate::generated::gateways::{
    Gateway, GatewayAllowedListenersNamespacesFrom, GatewayListeners,
};
use crate::generated::listenersets::{
    ListenerSet, ListenerSetListeners, ListenerSetStatus, ListenerSetStatusListeners,
    ListenerSetStatusListenersSupportedKinds,
};
use crate::objects::{GATEWAY_GROUP, ObjectKey, age_key, namespace};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A ListenerSet whose parentRef names one of our Gateways.
#[derive(Debug)]
pub struct ListenerSetCtx<'a> {
    pub key: ObjectKey,
    pub object: &'a ListenerSet,
    /// The Gateway's allowedListeners admits the set's namespace: its listeners were merged.
    pub allowed: bool,
}

/// Does the ListenerSet's parentRef name the Gateway `gateway`?
pub fn names_gateway(ls: &ListenerSet, gateway: &ObjectKey) -> bool {
    let p = &ls.spec.parent_ref;
    p.group.as_deref().unwrap_or(GATEWAY_GROUP) == GATEWAY_GROUP
        && p.kind.as_deref().unwrap_or("Gateway") == "Gateway"
        && p.name == gateway.name
        && p.namespace
            .clone()
            .unwrap_or_else(|| namespace(&ls.metadata))
            == gateway.namespace
}

/// The ListenerSets that name `gateway`, in listener precedence order: oldest first, then by
/// namespace/name (the spec's order for merging their listeners after the Gateway's own).
pub fn naming<'a>(sets: &'a [Arc<ListenerSet>], gateway: &ObjectKey) -> Vec<&'a ListenerSet> {
    let mut out: Vec<&ListenerSet> = sets
        .iter()
        .map(|s| &**s)
        .filter(|s| names_gateway(s, gateway))
        .collect();
    out.sort_by_key(|s| age_key(&s.metadata));
    out
}

/// May a ListenerSet in `set_namespace` attach to `gw`? `spec.allowedListeners` unset, or
/// `from: None`, admits none: a Gateway owner opts in.
pub fn allowed(
    gw: &Gateway,
    gw_namespace: &str,
    set_namespace: &str,
    namespace_labels: &BTreeMap<String, BTreeMap<String, String>>,
) -> bool {
    let Some(ns) = gw
        .spec
        .allowed_listeners
        .as_ref()
        .and_then(|a| a.namespaces.as_ref())
    else {
        return false;
    };
    let admits = match ns.from {
        Some(GatewayAllowedListenersNamespacesFrom::All) => AllowedNamespaces::All,
        Some(GatewayAllowedListenersNamespacesFrom::Same) => AllowedNamespaces::Same,
        Some(GatewayAllowedListenersNamespacesFrom::Selector) => {
            namespace_selector!(ns.selector.as_ref())
        }
        Some(GatewayAllowedListenersNamespacesFrom::None) | None => return false,
    };
    admits.admits(gw_namespace, set_namespace, namespace_labels)
}

/// A ListenerSet listener as a Gateway listener: the two generated types have the same fields
/// and the same JSON, so one listener code path serves both.
pub fn as_gateway_listener(l: &ListenerSetListeners) -> GatewayListeners {
    serde_json::to_value(l)
        .ok()
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_else(|| GatewayListeners {
            name: l.name.clone(),
            port: l.port,
            protocol: l.protocol.clone(),
            hostname: l.hostname.clone(),
            ..Default::default()
        })
}

/// The IR name of a ListenerSet's listener: listener names are only unique within the object
/// that declares them, and the data plane names listeners in logs and metrics.
pub fn ir_listener_name(set: &ObjectKey, listener: &str) -> String {
    format!("{}/{}/{listener}", set.namespace, set.name)
}

/// Accepted=True: at least one listener of the set can be served.
pub fn accepted(status: &ListenerSetStatus) -> bool {
    status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == ACCEPTED && c.status == "True")
}

/// The status of the set `index` of `gw` once routes are attached.
pub fn status(gw: &GatewayCtx, index: usize, gateway_accepted: bool) -> ListenerSetStatus {
    let set = &gw.listener_sets[index];
    let generation = set.object.metadata.generation;
    let both = |reason: &str, message: String| {
        vec![
            condition(ACCEPTED, false, reason, message.clone(), generation),
            condition(PROGRAMMED, false, reason, message, generation),
        ]
    };
    if !set.allowed {
        return ListenerSetStatus {
            conditions: Some(both(
                NOT_ALLOWED,
                format!(
                    "Gateway {} does not allow ListenerSets from namespace {} \
                     (spec.allowedListeners)",
                    gw.key, set.key.namespace
                ),
            )),
            listeners: None,
        };
    }
    let listeners: Vec<_> = gw
        .listeners
        .iter()
        .filter(|l| l.set == Some(index))
        .collect();
    let gateway_problem = gw.problem_message();
    let entries = listeners
        .iter()
        .map(|l| {
            let s = listener_status(l, gateway_problem.as_deref(), generation);
            ListenerSetStatusListeners {
                attached_routes: s.attached_routes,
                conditions: s.conditions,
                name: s.name,
                supported_kinds: s.supported_kinds.map(|kinds| {
                    kinds
                        .into_iter()
                        .map(|k| ListenerSetStatusListenersSupportedKinds {
                            group: k.group,
                            kind: k.kind,
                        })
                        .collect()
                }),
            }
        })
        .collect();
    let valid = listeners.iter().filter(|l| l.programmable()).count();
    let conditions = if !gateway_accepted {
        both(
            PARENT_NOT_ACCEPTED,
            format!("the parent Gateway {} is not accepted", gw.key),
        )
    } else if valid == 0 {
        both(
            LISTENERS_NOT_VALID,
            format!("none of its {} listeners is valid", listeners.len()),
        )
    } else {
        let accepted_message = if valid == listeners.len() {
            "Accepted by Gatehouse".to_string()
        } else {
            format!(
                "{} of {} listeners are not valid",
                listeners.len() - valid,
                listeners.len()
            )
        };
        let programmed = match gateway_problem {
            Some(why) => condition(PROGRAMMED, false, INVALID, why, generation),
            None => condition(PROGRAMMED, true, PROGRAMMED, "Programmed", generation),
        };
        vec![
            condition(ACCEPTED, true, ACCEPTED, accepted_message, generation),
            programmed,
        ]
    };
    ListenerSetStatus {
        conditions: Some(conditions),
        listeners: Some(entries),
    }
}
