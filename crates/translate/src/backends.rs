//! backendRefs: ReferenceGrant checks, Service port lookup and EndpointSlice resolution.

use crate::conditions::names::*;
use crate::objects::ObjectKey;
use gatehouse_ir as ir;
use gateway_api::apis::standard::referencegrants::ReferenceGrant;
use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Why a reference cannot be used, as a ResolvedRefs reason and a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefProblem {
    pub reason: &'static str,
    pub message: String,
}

/// A reference from an object of (group, kind) in `namespace`.
#[derive(Clone, Copy)]
pub struct From<'a> {
    pub group: &'a str,
    pub kind: &'a str,
    pub namespace: &'a str,
}

/// A backendRef as every route kind spells it.
pub struct BackendRef<'a> {
    pub group: Option<&'a str>,
    pub kind: Option<&'a str>,
    pub name: &'a str,
    pub namespace: Option<&'a str>,
    pub port: Option<i32>,
}

pub struct Backends<'a> {
    services: BTreeMap<ObjectKey, &'a Service>,
    slices: BTreeMap<ObjectKey, Vec<&'a EndpointSlice>>,
    grants: &'a [ReferenceGrant],
    /// Clusters referenced so far, by name.
    pub clusters: BTreeMap<String, ir::Cluster>,
}

impl<'a> Backends<'a> {
    pub fn new(
        services: &'a [Service],
        slices: &'a [EndpointSlice],
        grants: &'a [ReferenceGrant],
    ) -> Self {
        let services = services
            .iter()
            .map(|s| (ObjectKey::of(&s.metadata), s))
            .collect();
        let mut by_service: BTreeMap<ObjectKey, Vec<&EndpointSlice>> = BTreeMap::new();
        for slice in slices {
            let owner = slice
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL));
            if let Some(svc) = owner {
                let ns = crate::objects::namespace(&slice.metadata);
                by_service
                    .entry(ObjectKey::new(ns, svc.clone()))
                    .or_default()
                    .push(slice);
            }
        }
        Backends {
            services,
            slices: by_service,
            grants,
            clusters: BTreeMap::new(),
        }
    }

    /// Resolve a backendRef to the name of a cluster (registering the cluster), or say why not.
    pub fn resolve(&mut self, from: From, r: &BackendRef) -> Result<String, RefProblem> {
        let group = r.group.unwrap_or("");
        let kind = r.kind.unwrap_or("Service");
        if !group.is_empty() || kind != "Service" {
            return Err(RefProblem {
                reason: INVALID_KIND,
                message: format!(
                    "backendRef kind {group}/{kind} is not supported; use a core Service"
                ),
            });
        }
        let namespace = r.namespace.unwrap_or(from.namespace);
        if namespace != from.namespace && !self.permitted(from, "", "Service", namespace, r.name) {
            return Err(RefProblem {
                reason: REF_NOT_PERMITTED,
                message: format!(
                    "no ReferenceGrant in namespace {namespace} allows {} from {} to use Service {}",
                    from.kind, from.namespace, r.name
                ),
            });
        }
        let key = ObjectKey::new(namespace, r.name);
        let Some(service) = self.services.get(&key) else {
            return Err(RefProblem {
                reason: BACKEND_NOT_FOUND,
                message: format!("Service {key} not found"),
            });
        };
        let Some(port) = r.port else {
            return Err(RefProblem {
                reason: BACKEND_NOT_FOUND,
                message: format!("backendRef to Service {key} has no port"),
            });
        };
        let ports = service.spec.as_ref().and_then(|s| s.ports.as_ref());
        let Some(service_port) = ports.into_iter().flatten().find(|p| p.port == port) else {
            return Err(RefProblem {
                reason: BACKEND_NOT_FOUND,
                message: format!("Service {key} has no port {port}"),
            });
        };
        let protocol = match service_port.app_protocol.as_deref() {
            None | Some("http") | Some("HTTP") | Some("kubernetes.io/http") => {
                ir::UpstreamProtocol::Http1
            }
            Some("kubernetes.io/h2c") => ir::UpstreamProtocol::H2c,
            Some("kubernetes.io/ws") => ir::UpstreamProtocol::WebSocket,
            Some(other) => {
                return Err(RefProblem {
                    reason: UNSUPPORTED_PROTOCOL,
                    message: format!(
                        "appProtocol {other} of Service {key} port {port} is not supported"
                    ),
                });
            }
        };
        let name = format!("{key}:{port}");
        if !self.clusters.contains_key(&name) {
            let endpoints = self.endpoints(&key, service_port);
            self.clusters.insert(
                name.clone(),
                ir::Cluster {
                    name: name.clone(),
                    protocol,
                    endpoints,
                },
            );
        }
        Ok(name)
    }

    /// Ready endpoints of the Service port; when none is ready, the serving ones that are
    /// terminating, so that a rollout's last pods still get traffic (as kube-proxy does).
    fn endpoints(&self, service: &ObjectKey, port: &ServicePort) -> Vec<SocketAddr> {
        let mut ready = BTreeSet::new();
        let mut serving_terminating = BTreeSet::new();
        for slice in self.slices.get(service).into_iter().flatten() {
            if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
                continue;
            }
            let slice_port = slice.ports.iter().flatten().find(|p| {
                p.name.as_deref().unwrap_or("") == port.name.as_deref().unwrap_or("")
                    && p.protocol.as_deref().unwrap_or("TCP") == "TCP"
            });
            let Some(number) = slice_port
                .and_then(|p| p.port)
                .and_then(|p| u16::try_from(p).ok())
            else {
                continue;
            };
            for endpoint in &slice.endpoints {
                let c = endpoint.conditions.as_ref();
                let is_ready = c.and_then(|c| c.ready).unwrap_or(true);
                let serving = c.and_then(|c| c.serving).unwrap_or(is_ready);
                let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
                for address in &endpoint.addresses {
                    let Ok(ip) = address.parse::<IpAddr>() else {
                        continue;
                    };
                    let addr = SocketAddr::new(ip, number);
                    if is_ready && !terminating {
                        ready.insert(addr);
                    } else if serving && terminating {
                        serving_terminating.insert(addr);
                    }
                }
            }
        }
        let chosen = if ready.is_empty() {
            serving_terminating
        } else {
            ready
        };
        chosen.into_iter().collect()
    }

    /// Does a ReferenceGrant in `to_namespace` let `from` refer to (group, kind, name)?
    pub fn permitted(
        &self,
        from: From,
        to_group: &str,
        to_kind: &str,
        to_namespace: &str,
        to_name: &str,
    ) -> bool {
        self.grants
            .iter()
            .filter(|g| crate::objects::namespace(&g.metadata) == to_namespace)
            .any(|g| {
                g.spec.from.iter().any(|f| {
                    f.group == from.group && f.kind == from.kind && f.namespace == from.namespace
                }) && g.spec.to.iter().any(|t| {
                    t.group == to_group
                        && t.kind == to_kind
                        && t.name.as_deref().is_none_or(|n| n == to_name)
                })
            })
    }
}
