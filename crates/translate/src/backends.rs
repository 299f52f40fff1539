//! backendRefs: ReferenceGrant checks, Service port lookup and EndpointSlice resolution.

use crate::conditions::names::*;
use crate::objects::{ObjectKey, age_key};
use crate::refs::{Referrer, Refs, unsupported_ca_kind};
use gatehouse_ir as ir;
use gateway_api::apis::standard::backendtlspolicies::{
    BackendTlsPolicy, BackendTlsPolicyValidationSubjectAltNamesType,
};
use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// How Kubernetes spells a transport in Service and EndpointSlice ports.
fn transport_name(transport: ir::Transport) -> &'static str {
    match transport {
        ir::Transport::Tcp => "TCP",
        ir::Transport::Udp => "UDP",
    }
}

/// Why a reference cannot be used, as a ResolvedRefs reason and a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefProblem {
    pub reason: &'static str,
    pub message: String,
    /// Set when the Service port resolved but its BackendTLSPolicy did not: the cluster the
    /// backend would have used, so the policy can still report the Gateways it affects.
    pub policy_cluster: Option<String>,
}

/// A backendRef as every route kind spells it.
pub struct BackendRef<'a> {
    pub group: Option<&'a str>,
    pub kind: Option<&'a str>,
    pub name: &'a str,
    pub namespace: Option<&'a str>,
    pub port: Option<i32>,
}

/// A [`BackendRef`] borrowing a generated backendRef's fields (every route kind's has them).
macro_rules! backend_ref_of {
    ($b:expr) => {{
        let b = &$b;
        $crate::backends::BackendRef {
            group: b.group.as_deref(),
            kind: b.kind.as_deref(),
            name: &b.name,
            namespace: b.namespace.as_deref(),
            port: b.port,
        }
    }};
}
pub(crate) use backend_ref_of;

pub struct Backends<'a> {
    services: BTreeMap<ObjectKey, &'a Service>,
    slices: BTreeMap<ObjectKey, Vec<&'a EndpointSlice>>,
    refs: &'a Refs<'a>,
    /// BackendTLSPolicies by the Service they target, oldest first.
    policies: BTreeMap<ObjectKey, Vec<&'a BackendTlsPolicy>>,
    /// Clusters referenced so far, by name.
    pub clusters: BTreeMap<String, ir::Cluster>,
    /// What became of each BackendTLSPolicy that a referenced Service port uses.
    pub policy_outcomes: BTreeMap<ObjectKey, PolicyOutcome>,
}

/// A BackendTLSPolicy's effect: the clusters it secures, or why it could not.
#[derive(Clone, Debug, Default)]
pub struct PolicyOutcome {
    /// Clusters whose TLS this policy decides.
    pub clusters: Vec<String>,
    pub problem: Option<(&'static str, String)>,
    /// Clusters where another, older policy targets the same Service port and wins.
    pub conflicted: Vec<String>,
}

impl<'a> Backends<'a> {
    pub fn new(
        services: &'a [Arc<Service>],
        slices: &'a [Arc<EndpointSlice>],
        policies: &'a [Arc<BackendTlsPolicy>],
        refs: &'a Refs<'a>,
    ) -> Self {
        let services = services
            .iter()
            .map(|s| (ObjectKey::of(&s.metadata), &**s))
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
        let mut ordered: Vec<&BackendTlsPolicy> = policies.iter().map(|p| &**p).collect();
        ordered.sort_by_key(|p| age_key(&p.metadata));
        let mut by_target: BTreeMap<ObjectKey, Vec<&BackendTlsPolicy>> = BTreeMap::new();
        for p in ordered {
            let ns = crate::objects::namespace(&p.metadata);
            for t in p
                .spec
                .target_refs
                .iter()
                .filter(|t| t.group.is_empty() && t.kind == "Service")
            {
                let list = by_target
                    .entry(ObjectKey::new(ns.clone(), t.name.clone()))
                    .or_default();
                if !list.iter().any(|x| std::ptr::eq(*x, p)) {
                    list.push(p);
                }
            }
        }
        Backends {
            services,
            slices: by_service,
            refs,
            policies: by_target,
            clusters: BTreeMap::new(),
            policy_outcomes: BTreeMap::new(),
        }
    }

    /// Resolve a backendRef of an HTTP or TLS route to the name of a cluster (registering the
    /// cluster), or say why not.
    pub fn resolve(&mut self, from: Referrer, r: &BackendRef) -> Result<String, RefProblem> {
        self.resolve_http(from, r, false)
    }

    /// Resolve a backendRef of a GRPCRoute: like [`Backends::resolve`], but the backend is
    /// always spoken to over HTTP/2 (gRPC has no HTTP/1.1 mapping), in cleartext with prior
    /// knowledge or, with a BackendTLSPolicy, over TLS with ALPN h2. A Service port that does
    /// not say `kubernetes.io/h2c` gets a cluster of its own (`ns/svc:port+h2`), so an
    /// HTTPRoute to the same port keeps speaking HTTP/1.1 to it.
    pub fn resolve_grpc(&mut self, from: Referrer, r: &BackendRef) -> Result<String, RefProblem> {
        self.resolve_http(from, r, true)
    }

    fn resolve_http(
        &mut self,
        from: Referrer,
        r: &BackendRef,
        grpc: bool,
    ) -> Result<String, RefProblem> {
        let (key, port, service_port) = self.service_port(from, r, ir::Transport::Tcp)?;
        let app_protocol = service_port.app_protocol.as_deref();
        let protocol = match app_protocol {
            None | Some("http") | Some("HTTP") | Some("kubernetes.io/http") => {
                ir::UpstreamProtocol::Http1
            }
            // HTTP/1.1 over TLS: the TLS itself comes from a BackendTLSPolicy (checked below).
            Some("https") | Some("HTTPS") => ir::UpstreamProtocol::Http1,
            Some("kubernetes.io/h2c") => ir::UpstreamProtocol::H2c,
            Some("kubernetes.io/ws") if !grpc => ir::UpstreamProtocol::WebSocket,
            Some(other) => {
                return Err(RefProblem {
                    reason: UNSUPPORTED_PROTOCOL,
                    message: format!(
                        "appProtocol {other} of Service {key} port {port} is not supported{}",
                        if grpc { " for gRPC" } else { "" }
                    ),
                    policy_cluster: None,
                });
            }
        };
        let (protocol, name) = if grpc && protocol != ir::UpstreamProtocol::H2c {
            (ir::UpstreamProtocol::H2c, format!("{key}:{port}+h2"))
        } else {
            (protocol, format!("{key}:{port}"))
        };
        if !self.clusters.contains_key(&name) {
            let tls = self.backend_tls(&key, service_port, &name)?;
            if tls.is_none()
                && matches!(
                    service_port.app_protocol.as_deref(),
                    Some("https" | "HTTPS")
                )
            {
                return Err(RefProblem {
                    reason: UNSUPPORTED_PROTOCOL,
                    message: format!(
                        "Service {key} port {port} speaks HTTPS (appProtocol) but no \
                         BackendTLSPolicy targets it, so Gatehouse cannot verify the backend"
                    ),
                    policy_cluster: None,
                });
            }
            let endpoints = self.endpoints(&key, service_port, ir::Transport::Tcp);
            self.clusters.insert(
                name.clone(),
                ir::Cluster {
                    name: name.clone(),
                    protocol,
                    endpoints,
                    tls,
                },
            );
        }
        Ok(name)
    }

    /// Resolve a backendRef of a TCPRoute or UDPRoute: the Service port of that transport,
    /// forwarded as it is. Its appProtocol says what the bytes are, which a layer-4 route does
    /// not look at, and BackendTLSPolicy does not apply (the gateway adds no TLS to a byte
    /// stream it does not terminate). The cluster is its own (`ns/svc:port/tcp`), so an
    /// HTTPRoute to the same Service port keeps its pools and backend TLS.
    pub fn resolve_l4(
        &mut self,
        from: Referrer,
        r: &BackendRef,
        transport: ir::Transport,
    ) -> Result<String, RefProblem> {
        let (key, port, service_port) = self.service_port(from, r, transport)?;
        let (suffix, protocol) = match transport {
            ir::Transport::Tcp => ("tcp", ir::UpstreamProtocol::Tcp),
            ir::Transport::Udp => ("udp", ir::UpstreamProtocol::Udp),
        };
        let name = format!("{key}:{port}/{suffix}");
        if !self.clusters.contains_key(&name) {
            let endpoints = self.endpoints(&key, service_port, transport);
            self.clusters.insert(
                name.clone(),
                ir::Cluster {
                    name: name.clone(),
                    protocol,
                    endpoints,
                    tls: None,
                },
            );
        }
        Ok(name)
    }

    /// The Service port a backendRef names, after the checks every route kind shares: a core
    /// Service, allowed by ReferenceGrant, existing, with a port of that number and transport.
    fn service_port(
        &self,
        from: Referrer,
        r: &BackendRef,
        transport: ir::Transport,
    ) -> Result<(ObjectKey, i32, &'a ServicePort), RefProblem> {
        let group = r.group.unwrap_or("");
        let kind = r.kind.unwrap_or("Service");
        if !group.is_empty() || kind != "Service" {
            return Err(RefProblem {
                reason: INVALID_KIND,
                message: format!(
                    "backendRef kind {group}/{kind} is not supported; use a core Service"
                ),
                policy_cluster: None,
            });
        }
        let namespace = r.namespace.unwrap_or(from.namespace);
        if !self.refs.permitted(from, "", "Service", namespace, r.name) {
            return Err(RefProblem {
                reason: REF_NOT_PERMITTED,
                message: format!(
                    "no ReferenceGrant in namespace {namespace} allows {} from {} to use Service {}",
                    from.kind, from.namespace, r.name
                ),
                policy_cluster: None,
            });
        }
        let key = ObjectKey::new(namespace, r.name);
        let Some(service) = self.services.get(&key).copied() else {
            return Err(RefProblem {
                reason: BACKEND_NOT_FOUND,
                message: format!("Service {key} not found"),
                policy_cluster: None,
            });
        };
        let Some(port) = r.port else {
            return Err(RefProblem {
                reason: BACKEND_NOT_FOUND,
                message: format!("backendRef to Service {key} has no port"),
                policy_cluster: None,
            });
        };
        let ports = service.spec.as_ref().and_then(|s| s.ports.as_ref());
        let wanted = transport_name(transport);
        let Some(service_port) = ports
            .into_iter()
            .flatten()
            .find(|p| p.port == port && p.protocol.as_deref().unwrap_or("TCP") == wanted)
        else {
            return Err(RefProblem {
                reason: BACKEND_NOT_FOUND,
                message: format!("Service {key} has no {wanted} port {port}"),
                policy_cluster: None,
            });
        };
        Ok((key, port, service_port))
    }

    /// Ready endpoints of the Service port; when none is ready, the serving ones that are
    /// terminating, so that a rollout's last pods still get traffic (as kube-proxy does).
    fn endpoints(
        &self,
        service: &ObjectKey,
        port: &ServicePort,
        transport: ir::Transport,
    ) -> Vec<SocketAddr> {
        let wanted = transport_name(transport);
        let mut ready = BTreeSet::new();
        let mut serving_terminating = BTreeSet::new();
        for slice in self.slices.get(service).into_iter().flatten() {
            if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
                continue;
            }
            let slice_port = slice.ports.iter().flatten().find(|p| {
                p.name.as_deref().unwrap_or("") == port.name.as_deref().unwrap_or("")
                    && p.protocol.as_deref().unwrap_or("TCP") == wanted
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

    /// TLS to the Service port from the oldest BackendTLSPolicy that targets it (by port name
    /// or the whole Service). A policy whose CA cannot be used makes the backend invalid rather
    /// than silently trusting other roots.
    fn backend_tls(
        &mut self,
        service: &ObjectKey,
        port: &ServicePort,
        cluster: &str,
    ) -> Result<Option<ir::UpstreamTls>, RefProblem> {
        let port_name = port.name.as_deref().unwrap_or("");
        let applicable: Vec<&BackendTlsPolicy> = self
            .policies
            .get(service)
            .into_iter()
            .flatten()
            .copied()
            .filter(|p| {
                p.spec.target_refs.iter().any(|t| {
                    t.group.is_empty()
                        && t.kind == "Service"
                        && t.name == service.name
                        && t.section_name.as_deref().is_none_or(|s| s == port_name)
                })
            })
            .collect();
        let Some((policy, losers)) = applicable.split_first() else {
            return Ok(None);
        };
        for loser in losers {
            let o = self
                .policy_outcomes
                .entry(ObjectKey::of(&loser.metadata))
                .or_default();
            o.conflicted.push(cluster.to_string());
        }
        let key = ObjectKey::of(&policy.metadata);
        let v = &policy.spec.validation;
        let result = self.policy_ca(policy).map(|ca_pem| ir::UpstreamTls {
            server_name: v.hostname.to_ascii_lowercase(),
            ca_pem,
            subject_alt_names: v
                .subject_alt_names
                .iter()
                .flatten()
                .filter_map(|san| match san.r#type {
                    BackendTlsPolicyValidationSubjectAltNamesType::Hostname => {
                        san.hostname.clone().map(ir::SubjectAltName::Dns)
                    }
                    BackendTlsPolicyValidationSubjectAltNamesType::Uri => {
                        san.uri.clone().map(ir::SubjectAltName::Uri)
                    }
                })
                .collect(),
            client_certificate: None,
        });
        let outcome = self.policy_outcomes.entry(key.clone()).or_default();
        outcome.clusters.push(cluster.to_string());
        match result {
            Ok(tls) => Ok(Some(tls)),
            Err(problem) => {
                outcome.problem = Some(problem.clone());
                Err(RefProblem {
                    reason: problem.0,
                    message: format!("BackendTLSPolicy {key}: {}", problem.1),
                    policy_cluster: Some(cluster.to_string()),
                })
            }
        }
    }

    fn policy_ca(
        &self,
        policy: &BackendTlsPolicy,
    ) -> Result<Option<String>, (&'static str, String)> {
        let v = &policy.spec.validation;
        let ns = crate::objects::namespace(&policy.metadata);
        let refs = v.ca_certificate_refs.as_deref().unwrap_or_default();
        if refs.is_empty() {
            return match v.well_known_ca_certificates.as_deref() {
                Some("System") => Ok(None),
                other => Err((
                    NO_VALID_CA_CERTIFICATE,
                    format!(
                        "no caCertificateRefs and wellKnownCACertificates {other:?} is not System"
                    ),
                )),
            };
        }
        let mut bundle = String::new();
        for r in refs {
            let pem = if crate::refs::is_cluster_trust_bundle(&r.group, &r.kind) {
                self.refs
                    .trust_bundle(&r.name)
                    .map_err(|e| (INVALID_CA_CERTIFICATE_REF, e))?
            } else if r.group.is_empty() && r.kind == "ConfigMap" {
                self.refs
                    .config_map_bundle(&ObjectKey::new(ns.clone(), r.name.clone()))
                    .map_err(|e| (INVALID_CA_CERTIFICATE_REF, e))?
            } else {
                return Err((INVALID_KIND, unsupported_ca_kind(&r.group, &r.kind)));
            };
            bundle.push_str(&pem);
            if !bundle.ends_with('\n') {
                bundle.push('\n');
            }
        }
        Ok(Some(bundle))
    }
}
