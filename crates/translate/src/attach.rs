//! Route attachment shared by every route kind: which listeners a route's parentRefs select,
//! whether they allow it, the hostnames it serves there, and the Accepted condition per parent.

use crate::conditions::{condition, names::*};
use crate::gateways::{GATEWAY_GROUP, GatewayCtx};
use crate::hostname;
use crate::objects::{ObjectKey, namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use std::collections::{BTreeMap, BTreeSet};

/// A parentRef as every route kind spells it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
}

impl ParentRef {
    /// Read any generated parentRef type through its JSON shape.
    pub fn from_any<T: serde::Serialize>(r: &T) -> Option<ParentRef> {
        serde_json::to_value(r)
            .ok()
            .and_then(|v| serde_json::from_value(v).ok())
    }
}

/// Where one parentRef attached the route, and its Accepted condition.
pub struct ParentOutcome {
    pub parent: ParentRef,
    pub gateway: usize,
    pub accepted: Condition,
    /// (listener index, hostnames served there)
    pub listeners: Vec<(usize, Vec<String>)>,
}

/// Attach a route of `kind` to our Gateways. Parents that are not our Gateways are skipped (no
/// status is ours to write for them). `invalid` is the reason no rule of the route can be served,
/// if so: the route then attaches nowhere but still counts in attachedRoutes.
pub fn attach(
    kind: &str,
    meta: &ObjectMeta,
    parents: &[ParentRef],
    hostnames: &[String],
    invalid: Option<&str>,
    gateways: &mut [GatewayCtx],
    namespace_labels: &BTreeMap<String, BTreeMap<String, String>>,
) -> Vec<ParentOutcome> {
    let route_ns = namespace(meta);
    let generation = meta.generation;
    let mut counted: BTreeSet<(usize, usize)> = BTreeSet::new();
    let mut out = Vec::new();
    for pref in parents {
        let group = pref.group.as_deref().unwrap_or(GATEWAY_GROUP);
        if group != GATEWAY_GROUP || pref.kind.as_deref().unwrap_or("Gateway") != "Gateway" {
            continue;
        }
        let ns = pref.namespace.clone().unwrap_or_else(|| route_ns.clone());
        let key = ObjectKey::new(ns, pref.name.clone());
        let Some(gi) = gateways.iter().position(|g| g.key == key) else {
            continue;
        };
        let gw = &mut gateways[gi];
        let gw_ns = gw.key.namespace.clone();
        let candidates: Vec<usize> = (0..gw.listeners.len())
            .filter(|&i| {
                pref.section_name
                    .as_ref()
                    .is_none_or(|s| *s == gw.listeners[i].name)
            })
            .filter(|&i| {
                pref.port
                    .is_none_or(|p| i32::from(gw.listeners[i].port) == p)
            })
            .collect();
        let allowed: Vec<usize> = candidates
            .iter()
            .copied()
            .filter(|&i| {
                let l = &gw.listeners[i];
                l.allows_kind(GATEWAY_GROUP, kind)
                    && l.allows_namespace(&gw_ns, &route_ns, namespace_labels)
            })
            .collect();
        let mut listeners: Vec<(usize, Vec<String>)> = allowed
            .iter()
            .filter_map(|&li| {
                hostname::intersect(gw.listeners[li].hostname.as_deref(), hostnames)
                    .map(|hosts| (li, hosts))
            })
            .collect();
        let accepted = if candidates.is_empty() {
            condition(
                ACCEPTED,
                false,
                NO_MATCHING_PARENT,
                "no listener matches the parentRef's sectionName and port",
                generation,
            )
        } else if allowed.is_empty() {
            condition(
                ACCEPTED,
                false,
                NOT_ALLOWED_BY_LISTENERS,
                format!("no listener allows this {kind} (kind or namespace)"),
                generation,
            )
        } else if listeners.is_empty() {
            condition(
                ACCEPTED,
                false,
                NO_MATCHING_LISTENER_HOSTNAME,
                "no listener hostname intersects the route's hostnames",
                generation,
            )
        } else if let Some(why) = invalid {
            listeners.clear();
            condition(
                ACCEPTED,
                false,
                UNSUPPORTED_VALUE,
                why.to_string(),
                generation,
            )
        } else {
            condition(ACCEPTED, true, ACCEPTED, "Accepted", generation)
        };
        // attachedRoutes counts the routes Accepted on a listener, each once, whatever the
        // listener's own conditions (a listener with a bad certificate still counts them).
        if accepted.status == "True" {
            for &(li, _) in &listeners {
                if counted.insert((gi, li)) {
                    gw.listeners[li].attached_routes += 1;
                }
            }
        }
        out.push(ParentOutcome {
            parent: pref.clone(),
            gateway: gi,
            accepted,
            listeners,
        });
    }
    out
}
