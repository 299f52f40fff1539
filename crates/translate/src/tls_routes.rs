//! TLSRoutes: attachment to TLS listeners, backends, and per-parent status.

use crate::attach::{self, ParentRef};
use crate::backends::{BackendRef, Backends, From, RefProblem};
use crate::conditions::{condition, names::*};
use crate::gateways::{GATEWAY_GROUP, GatewayCtx};
use crate::objects::{ObjectKey, age_key};
use gatehouse_ir as ir;
use gateway_api::apis::standard::tlsroutes::{TlsRoute, TlsRouteStatus, TlsRouteStatusParents};
use std::collections::BTreeMap;

/// One TLSRoute rule served on one listener.
pub struct TlsAttachment {
    pub gateway: usize,
    pub listener: usize,
    pub route: ir::TlsRoute,
}

pub fn attach(
    routes: &[TlsRoute],
    gateways: &mut [GatewayCtx],
    backends: &mut Backends,
    namespace_labels: &BTreeMap<String, BTreeMap<String, String>>,
    controller: &str,
) -> (Vec<TlsAttachment>, BTreeMap<ObjectKey, TlsRouteStatus>) {
    let mut ordered: Vec<&TlsRoute> = routes.iter().collect();
    ordered.sort_by_key(|r| age_key(&r.metadata));
    let mut attachments = Vec::new();
    let mut statuses = BTreeMap::new();
    for route in ordered {
        let key = ObjectKey::of(&route.metadata);
        let generation = route.metadata.generation;
        let parents: Vec<ParentRef> = route
            .spec
            .parent_refs
            .iter()
            .flatten()
            .filter_map(ParentRef::from_any)
            .collect();
        let ours = parents.iter().any(|p| {
            let ns = p.namespace.as_deref().unwrap_or(&key.namespace);
            gateways
                .iter()
                .any(|g| g.key == ObjectKey::new(ns, p.name.clone()))
        });
        if !ours {
            continue;
        }
        let mut problems: Vec<RefProblem> = Vec::new();
        let from = From {
            group: GATEWAY_GROUP,
            kind: "TLSRoute",
            namespace: &key.namespace,
        };
        let rules: Vec<(usize, Vec<ir::WeightedBackend>)> = route
            .spec
            .rules
            .iter()
            .enumerate()
            .map(|(i, rule)| {
                let backends = rule
                    .backend_refs
                    .iter()
                    .map(|b| {
                        let target = match backends.resolve(
                            from,
                            &BackendRef {
                                group: b.group.as_deref(),
                                kind: b.kind.as_deref(),
                                name: &b.name,
                                namespace: b.namespace.as_deref(),
                                port: b.port,
                            },
                        ) {
                            Ok(cluster) => ir::BackendTarget::Cluster(cluster),
                            Err(p) => {
                                let reason = p.message.clone();
                                problems.push(p);
                                ir::BackendTarget::Invalid { reason }
                            }
                        };
                        ir::WeightedBackend {
                            weight: u32::try_from(b.weight.unwrap_or(1)).unwrap_or(0),
                            target,
                            filters: Vec::new(),
                        }
                    })
                    .collect();
                (i, backends)
            })
            .collect();
        let hostnames: Vec<String> = route.spec.hostnames.clone();
        let outcomes = attach::attach(
            "TLSRoute",
            &route.metadata,
            &parents,
            &hostnames,
            None,
            gateways,
            namespace_labels,
        );
        let mut parent_statuses = Vec::new();
        for o in outcomes {
            for (li, hosts) in &o.listeners {
                for (rule, backends) in &rules {
                    attachments.push(TlsAttachment {
                        gateway: o.gateway,
                        listener: *li,
                        route: ir::TlsRoute {
                            route: ir::RouteRef {
                                kind: "TLSRoute".into(),
                                namespace: key.namespace.clone(),
                                name: key.name.clone(),
                                rule: *rule,
                            },
                            hostnames: hosts.clone(),
                            backends: backends.clone(),
                        },
                    });
                }
            }
            let resolved = match problems.first() {
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
            parent_statuses.push(TlsRouteStatusParents {
                conditions: vec![o.accepted, resolved],
                controller_name: controller.to_string(),
                parent_ref: serde_json::from_value(
                    serde_json::to_value(&o.parent).unwrap_or_default(),
                )
                .unwrap_or_default(),
            });
        }
        statuses.insert(
            key,
            TlsRouteStatus {
                parents: parent_statuses,
            },
        );
    }
    (attachments, statuses)
}
