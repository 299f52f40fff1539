//! HTTPRoute attachment to listeners and the route's per-parent status.

use crate::backends::{Backends, RefProblem};
use crate::conditions::{condition, names::*};
use crate::gateways::{GATEWAY_GROUP, GatewayCtx};
use crate::hostname;
use crate::http_rules::{self, RuleTemplate};
use crate::objects::{ObjectKey, age_key, namespace};
use gatehouse_ir as ir;
use gateway_api::apis::standard::httproutes::{
    HttpRoute, HttpRouteStatus, HttpRouteStatusParents, HttpRouteStatusParentsParentRef,
};
use k8s_openapi::jiff::Timestamp;
use std::collections::BTreeMap;
use std::rc::Rc;

/// A route attached to one listener with the hostnames it serves there.
pub struct Attachment {
    pub gateway: usize,
    pub listener: usize,
    pub hostnames: Vec<String>,
    pub route_age: (Timestamp, ObjectKey),
    pub rules: Rc<Vec<(usize, RuleTemplate)>>,
}

/// Attach every HTTPRoute, in age order, and return each route's status (only routes with at
/// least one parent that is one of our Gateways get one).
pub fn attach(
    routes: &[HttpRoute],
    gateways: &mut [GatewayCtx],
    backends: &mut Backends,
    namespace_labels: &BTreeMap<String, BTreeMap<String, String>>,
    controller: &str,
) -> (Vec<Attachment>, BTreeMap<ObjectKey, HttpRouteStatus>) {
    let mut ordered: Vec<&HttpRoute> = routes.iter().collect();
    ordered.sort_by_key(|r| age_key(&r.metadata));
    let mut attachments = Vec::new();
    let mut statuses = BTreeMap::new();
    for route in ordered {
        if let Some(status) = attach_route(
            route,
            gateways,
            backends,
            namespace_labels,
            controller,
            &mut attachments,
        ) {
            statuses.insert(ObjectKey::of(&route.metadata), status);
        }
    }
    (attachments, statuses)
}

fn attach_route(
    route: &HttpRoute,
    gateways: &mut [GatewayCtx],
    backends: &mut Backends,
    namespace_labels: &BTreeMap<String, BTreeMap<String, String>>,
    controller: &str,
    attachments: &mut Vec<Attachment>,
) -> Option<HttpRouteStatus> {
    let key = ObjectKey::of(&route.metadata);
    let route_ns = namespace(&route.metadata);
    let generation = route.metadata.generation;

    // Resolve which parentRefs are ours first: a route that names none of our Gateways is none
    // of our business, and its backends must not show up in our configuration.
    let parents: Vec<(usize, usize)> = route
        .spec
        .parent_refs
        .iter()
        .flatten()
        .enumerate()
        .filter_map(|(i, p)| {
            let group = p.group.as_deref().unwrap_or(GATEWAY_GROUP);
            let kind = p.kind.as_deref().unwrap_or("Gateway");
            if group != GATEWAY_GROUP || kind != "Gateway" {
                return None;
            }
            let ns = p.namespace.clone().unwrap_or_else(|| route_ns.clone());
            let gw = gateways
                .iter()
                .position(|g| g.key == ObjectKey::new(ns.clone(), p.name.clone()))?;
            Some((i, gw))
        })
        .collect();
    if parents.is_empty() {
        return None;
    }

    let mut ref_problems: Vec<RefProblem> = Vec::new();
    let mut rule_problems: Vec<String> = Vec::new();
    let mut rules: Vec<(usize, RuleTemplate)> = Vec::new();
    let spec_rules = route.spec.rules.as_deref().unwrap_or_default();
    for (index, r) in spec_rules.iter().enumerate() {
        let rref = ir::RouteRef {
            kind: "HTTPRoute".into(),
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            rule: index,
        };
        match http_rules::rule(rref, r, backends, &mut ref_problems) {
            Ok(t) => rules.push((index, t)),
            Err(p) => rule_problems.push(format!("rule {index}: {}", p.0)),
        }
    }
    let all_rules_invalid = !spec_rules.is_empty() && rules.is_empty();
    let rules = Rc::new(rules);
    let hostnames = route.spec.hostnames.clone().unwrap_or_default();
    let parent_refs = route.spec.parent_refs.as_deref().unwrap_or_default();

    let mut parent_statuses = Vec::new();
    let mut counted: std::collections::BTreeSet<(usize, usize)> = Default::default();
    for (i, gw_index) in parents {
        let pref = &parent_refs[i];
        let gw = &mut gateways[gw_index];
        let port = pref.port.and_then(|p| u16::try_from(p).ok());
        let candidates: Vec<usize> = gw
            .listeners
            .iter()
            .enumerate()
            .filter(|(_, l)| pref.section_name.as_ref().is_none_or(|s| *s == l.name))
            .filter(|(_, l)| pref.port.is_none() || port == Some(l.port))
            .map(|(i, _)| i)
            .collect();
        let gw_ns = gw.key.namespace.clone();
        let allowed: Vec<usize> = candidates
            .iter()
            .copied()
            .filter(|&i| {
                let l = &gw.listeners[i];
                l.allows_kind(GATEWAY_GROUP, "HTTPRoute")
                    && l.allows_namespace(&gw_ns, &route_ns, namespace_labels)
            })
            .collect();
        let mut hosts_matched = false;
        for &li in &allowed {
            let listener = &mut gw.listeners[li];
            // attachedRoutes depends only on allowedRoutes and parentRefs, not on hostnames.
            if counted.insert((gw_index, li)) {
                listener.attached_routes += 1;
            }
            let Some(hosts) = hostname::intersect(listener.hostname.as_deref(), &hostnames) else {
                continue;
            };
            hosts_matched = true;
            if all_rules_invalid {
                continue;
            }
            match attachments
                .iter_mut()
                .find(|a| a.gateway == gw_index && a.listener == li && Rc::ptr_eq(&a.rules, &rules))
            {
                Some(existing) => {
                    existing.hostnames.extend(hosts);
                    existing.hostnames.sort();
                    existing.hostnames.dedup();
                }
                None => attachments.push(Attachment {
                    gateway: gw_index,
                    listener: li,
                    hostnames: hosts,
                    route_age: age_key(&route.metadata),
                    rules: Rc::clone(&rules),
                }),
            }
        }
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
                "no listener allows this route (kind or namespace)",
                generation,
            )
        } else if !hosts_matched {
            condition(
                ACCEPTED,
                false,
                NO_MATCHING_LISTENER_HOSTNAME,
                "no listener hostname intersects the route's hostnames",
                generation,
            )
        } else if all_rules_invalid {
            condition(
                ACCEPTED,
                false,
                UNSUPPORTED_VALUE,
                rule_problems.join("; "),
                generation,
            )
        } else {
            condition(ACCEPTED, true, ACCEPTED, "Accepted", generation)
        };
        let resolved = match ref_problems.first() {
            Some(p) => condition(
                RESOLVED_REFS,
                false,
                p.reason,
                p.message.clone(),
                generation,
            ),
            None => condition(
                RESOLVED_REFS,
                true,
                RESOLVED_REFS,
                "Resolved all references",
                generation,
            ),
        };
        let mut conditions = vec![accepted, resolved];
        if !rule_problems.is_empty() && !all_rules_invalid {
            conditions.push(condition(
                PARTIALLY_INVALID,
                true,
                UNSUPPORTED_VALUE,
                format!("dropped {}", rule_problems.join("; ")),
                generation,
            ));
        }
        parent_statuses.push(HttpRouteStatusParents {
            conditions,
            controller_name: controller.to_string(),
            parent_ref: HttpRouteStatusParentsParentRef {
                group: pref.group.clone(),
                kind: pref.kind.clone(),
                name: pref.name.clone(),
                namespace: pref.namespace.clone(),
                port: pref.port,
                section_name: pref.section_name.clone(),
            },
        });
    }
    Some(HttpRouteStatus {
        parents: parent_statuses,
    })
}
