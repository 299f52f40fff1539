//! HTTPRoutes: rules to templates, attachment to listeners, and per-parent status.

use crate::attach::{self, ParentRef};
use crate::backends::{Backends, RefProblem};
use crate::conditions::{condition, names::*};
use crate::gateways::GatewayCtx;
use crate::http_rules::{self, RuleTemplate};
use crate::objects::{ObjectKey, age_key};
use gatehouse_ir as ir;
use gateway_api::apis::standard::httproutes::{HttpRoute, HttpRouteStatus, HttpRouteStatusParents};
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

fn is_ours(parents: &[ParentRef], route_ns: &str, gateways: &[GatewayCtx]) -> bool {
    parents.iter().any(|p| {
        let ns = p.namespace.as_deref().unwrap_or(route_ns);
        gateways
            .iter()
            .any(|g| g.key == ObjectKey::new(ns, p.name.clone()))
    })
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
    let generation = route.metadata.generation;
    let parents: Vec<ParentRef> = route
        .spec
        .parent_refs
        .iter()
        .flatten()
        .filter_map(ParentRef::from_any)
        .collect();
    // A route that names none of our Gateways is none of our business: its backends must not
    // show up in our configuration.
    if !is_ours(&parents, &key.namespace, gateways) {
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
    let all_invalid =
        (!spec_rules.is_empty() && rules.is_empty()).then(|| rule_problems.join("; "));
    let rules = Rc::new(rules);
    let hostnames = route.spec.hostnames.clone().unwrap_or_default();
    let outcomes = attach::attach(
        "HTTPRoute",
        &route.metadata,
        &parents,
        &hostnames,
        all_invalid.as_deref(),
        gateways,
        namespace_labels,
    );

    let mut parent_statuses = Vec::new();
    for o in outcomes {
        for (li, hosts) in o.listeners {
            // Two parentRefs may select the same listener: serve the rules once, for the union
            // of the hostnames.
            let same = |a: &&mut Attachment| {
                a.gateway == o.gateway && a.listener == li && Rc::ptr_eq(&a.rules, &rules)
            };
            match attachments.iter_mut().find(|a| same(a)) {
                Some(existing) => {
                    existing.hostnames.extend(hosts);
                    existing.hostnames.sort();
                    existing.hostnames.dedup();
                }
                None => attachments.push(Attachment {
                    gateway: o.gateway,
                    listener: li,
                    hostnames: hosts,
                    route_age: age_key(&route.metadata),
                    rules: Rc::clone(&rules),
                }),
            }
        }
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
        let mut conditions = vec![o.accepted, resolved];
        if !rule_problems.is_empty() && all_invalid.is_none() {
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
            parent_ref: serde_json::from_value(serde_json::to_value(&o.parent).unwrap_or_default())
                .unwrap_or_default(),
        });
    }
    Some(HttpRouteStatus {
        parents: parent_statuses,
    })
}
