//! Gateway API objects to IR and status, as a pure function.
//!
//! All Gateway API semantics live here and nowhere else: which objects are ours, listener
//! validity and conflicts, route attachment and hostname intersection, ReferenceGrant, route
//! precedence, redirect defaults, and every status condition with the spec's reasons. The same
//! [`Input`] always gives the same [`Output`], whatever order the objects arrive in.

mod attach;
mod backends;
mod certificates;
pub mod conditions;
mod gateways;
pub mod hostname;
mod http_routes;
mod http_rules;
mod input;
mod listener_tls;
mod objects;
mod precedence;
mod refs;
mod tls_routes;

pub use conditions::stamp_status;
pub use input::Input;
pub use objects::ObjectKey;

use gatehouse_ir as ir;
use gateway_api::apis::standard::{
    backendtlspolicies::{BackendTlsPolicyStatus, BackendTlsPolicyStatusAncestors},
    gatewayclasses::GatewayClassStatus,
    gateways::GatewayStatus,
    httproutes::HttpRouteStatus,
    tlsroutes::TlsRouteStatus,
};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

/// The controllerName Gatehouse answers to.
pub const CONTROLLER_NAME: &str = "gatehouse.dev/gateway-controller";

/// Features listed in GatewayClass status.supportedFeatures: only what passes the official
/// conformance suite here (`make conformance`; conformance/reports/). The suite reads this list
/// to decide what to test, so a feature that is listed but broken fails the run.
pub const SUPPORTED_FEATURES: &[&str] = &[
    "BackendTLSPolicy",
    "BackendTLSPolicySANValidation",
    "Gateway",
    "GatewayAddressEmpty",
    "GatewayBackendClientCertificate",
    "GatewayFrontendClientCertificateValidation",
    "GatewayFrontendClientCertificateValidationInsecureFallback",
    "GatewayHTTPListenerIsolation",
    "GatewayHTTPSListenerDetectMisdirectedRequests",
    "GatewayPort8080",
    "HTTPRoute",
    "HTTPRoute303RedirectStatusCode",
    "HTTPRoute307RedirectStatusCode",
    "HTTPRoute308RedirectStatusCode",
    "HTTPRouteBackendProtocolH2C",
    "HTTPRouteBackendProtocolWebSocket",
    "HTTPRouteBackendRequestHeaderModification",
    "HTTPRouteBackendTimeout",
    "HTTPRouteDestinationPortMatching",
    "HTTPRouteHostRewrite",
    "HTTPRouteMethodMatching",
    "HTTPRouteNamedRouteRule",
    "HTTPRouteParentRefPort",
    "HTTPRoutePathRedirect",
    "HTTPRoutePathRewrite",
    "HTTPRoutePortRedirect",
    "HTTPRouteQueryParamMatching",
    "HTTPRouteRequestTimeout",
    "HTTPRouteResponseHeaderModification",
    "HTTPRouteSchemeRedirect",
    "ReferenceGrant",
    "TLSRoute",
    "TLSRouteModeMixed",
    "TLSRouteModeTerminate",
];

#[derive(Clone, Debug)]
pub struct Options {
    pub controller_name: String,
    /// Address for Gateways that request none.
    pub default_address: IpAddr,
    /// Addresses assigned from outside (e.g. one loopback address per Gateway); they win over
    /// the Gateway's own spec.addresses.
    pub gateway_addresses: BTreeMap<ObjectKey, IpAddr>,
    /// What status.addresses reports when it differs from where the data plane binds (in a
    /// cluster: the data-plane Service's load-balancer ingress or cluster IP), as (type, value).
    pub published_addresses: Option<Vec<(String, String)>>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            controller_name: CONTROLLER_NAME.to_string(),
            default_address: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            gateway_addresses: BTreeMap::new(),
            published_addresses: None,
        }
    }
}

/// Status of every object Gatehouse is responsible for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Status {
    pub gateway_classes: BTreeMap<String, GatewayClassStatus>,
    pub gateways: BTreeMap<ObjectKey, GatewayStatus>,
    pub http_routes: BTreeMap<ObjectKey, HttpRouteStatus>,
    pub tls_routes: BTreeMap<ObjectKey, TlsRouteStatus>,
    pub backend_tls_policies: BTreeMap<ObjectKey, BackendTlsPolicyStatus>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Output {
    pub config: ir::Config,
    pub status: Status,
}

pub fn translate(input: &Input, options: &Options) -> Output {
    let (class_status, our_classes) =
        gateways::classes(&input.gateway_classes, &options.controller_name);
    let refs = refs::Refs::new(&input.secrets, &input.config_maps, &input.reference_grants);
    let mut certificates: BTreeMap<String, ir::Certificate> = BTreeMap::new();
    let mut gws = gateways::gateways(
        &input.gateways,
        &our_classes,
        options,
        &refs,
        &mut certificates,
    );
    let namespace_labels: BTreeMap<String, BTreeMap<String, String>> = input
        .namespaces
        .iter()
        .map(|n| {
            (
                n.metadata.name.clone().unwrap_or_default(),
                n.metadata.labels.clone().unwrap_or_default(),
            )
        })
        .collect();
    let mut backends = backends::Backends::new(
        &input.services,
        &input.endpoint_slices,
        &input.backend_tls_policies,
        &refs,
    );
    let (attachments, route_status) = http_routes::attach(
        &input.http_routes,
        &mut gws,
        &mut backends,
        &namespace_labels,
        &options.controller_name,
    );
    let (tls_attachments, tls_route_status) = tls_routes::attach(
        &input.tls_routes,
        &mut gws,
        &mut backends,
        &namespace_labels,
        &options.controller_name,
    );

    let mut clusters = std::mem::take(&mut backends.clusters);
    // Which Gateways send traffic to which clusters, for BackendTLSPolicy ancestors.
    let mut cluster_users: BTreeMap<String, std::collections::BTreeSet<ObjectKey>> =
        BTreeMap::new();
    let mut config_gateways = Vec::new();
    for (gi, gw) in gws.iter().enumerate() {
        let Some(address) = gw.address else { continue };
        let client_cert = gw.backend_client_certificate.clone().ok().flatten();
        let mut listeners = Vec::new();
        for (li, l) in gw.listeners.iter().enumerate() {
            if !l.programmable() {
                continue;
            }
            let protocol = l.ir_protocol();
            let scheme = if protocol == ir::ListenerProtocol::Http {
                "http"
            } else {
                "https"
            };
            let mut rules = Vec::new();
            let mut candidates = Vec::new();
            for a in attachments
                .iter()
                .filter(|a| a.gateway == gi && a.listener == li)
            {
                for (rule_index, template) in a.rules.iter() {
                    let rule = rules.len();
                    for b in template
                        .backends
                        .iter()
                        .filter_map(|b| b.policy_cluster.as_ref())
                    {
                        cluster_users
                            .entry(b.clone())
                            .or_default()
                            .insert(gw.key.clone());
                    }
                    let mut resolved = template.resolve(scheme, l.port);
                    for b in &mut resolved.backends {
                        use_cluster(
                            &mut b.target,
                            client_cert.as_deref(),
                            &mut clusters,
                            &mut cluster_users,
                            &gw.key,
                        );
                    }
                    rules.push(resolved);
                    for hostname in &a.hostnames {
                        for (match_index, m) in template.matches.iter().enumerate() {
                            candidates.push(precedence::Candidate {
                                hostname: hostname.clone(),
                                matcher: m.clone(),
                                rule,
                                route_age: a.route_age.clone(),
                                rule_index: *rule_index,
                                match_index,
                            });
                        }
                    }
                }
            }
            let mut tls_routes: Vec<ir::TlsRoute> = Vec::new();
            for a in tls_attachments
                .iter()
                .filter(|a| a.gateway == gi && a.listener == li)
            {
                let mut route = a.route.clone();
                for b in &mut route.backends {
                    use_cluster(
                        &mut b.target,
                        None,
                        &mut clusters,
                        &mut cluster_users,
                        &gw.key,
                    );
                }
                tls_routes.push(route);
            }
            listeners.push(ir::Listener {
                name: l.name.clone(),
                address,
                port: l.port,
                protocol,
                hostname: l.hostname.clone(),
                rules,
                virtual_hosts: precedence::virtual_hosts(candidates),
                tls: l.tls.clone(),
                tls_routes,
            });
        }
        config_gateways.push(ir::Gateway {
            namespace: gw.key.namespace.clone(),
            name: gw.key.name.clone(),
            listeners,
        });
    }
    // Certificates only some Gateway's listener or backend TLS uses reach the data plane.
    let used: std::collections::BTreeSet<&String> = config_gateways
        .iter()
        .flat_map(|g| &g.listeners)
        .filter_map(|l| l.tls.as_ref())
        .flat_map(|t| &t.certificates)
        .chain(
            clusters
                .values()
                .filter_map(|c| c.tls.as_ref())
                .filter_map(|t| t.client_certificate.as_ref()),
        )
        .collect();
    let certificates: Vec<ir::Certificate> = certificates
        .into_values()
        .filter(|c| used.contains(&c.name))
        .collect();

    let policy_status = policy_status(
        &backends.policy_outcomes,
        &cluster_users,
        &input.backend_tls_policies,
        &options.controller_name,
    );
    let gateway_status = gws
        .iter()
        .map(|g| {
            (
                g.key.clone(),
                gateways::status(g, options.published_addresses.as_deref()),
            )
        })
        .collect();
    Output {
        config: ir::Config {
            gateways: config_gateways,
            clusters: clusters
                .into_values()
                .filter(|c| cluster_users.contains_key(&c.name))
                .collect(),
            certificates,
        },
        status: Status {
            gateway_classes: class_status,
            gateways: gateway_status,
            http_routes: route_status,
            tls_routes: tls_route_status,
            backend_tls_policies: policy_status,
        },
    }
}

/// Record that `gateway` uses the target cluster. A Gateway with a backend client certificate
/// gets its own copy of each TLS cluster, presenting that certificate.
fn use_cluster(
    target: &mut ir::BackendTarget,
    client_cert: Option<&str>,
    clusters: &mut BTreeMap<String, ir::Cluster>,
    users: &mut BTreeMap<String, std::collections::BTreeSet<ObjectKey>>,
    gateway: &ObjectKey,
) {
    let ir::BackendTarget::Cluster(name) = target else {
        return;
    };
    let tls_base = clusters
        .get(name.as_str())
        .filter(|c| c.tls.is_some())
        .cloned();
    if let (Some(cert), Some(base)) = (client_cert, tls_base) {
        let variant = format!("{name}+client={cert}");
        clusters.entry(variant.clone()).or_insert_with(|| {
            let mut c = base;
            c.name = variant.clone();
            if let Some(tls) = c.tls.as_mut() {
                tls.client_certificate = Some(cert.to_string());
            }
            c
        });
        // The base name also counts as used so its policy reports this Gateway.
        users
            .entry(name.clone())
            .or_default()
            .insert(gateway.clone());
        *name = variant;
    }
    users
        .entry(name.clone())
        .or_default()
        .insert(gateway.clone());
}

fn policy_status(
    outcomes: &BTreeMap<ObjectKey, backends::PolicyOutcome>,
    cluster_users: &BTreeMap<String, std::collections::BTreeSet<ObjectKey>>,
    policies: &[gateway_api::apis::standard::backendtlspolicies::BackendTlsPolicy],
    controller: &str,
) -> BTreeMap<ObjectKey, BackendTlsPolicyStatus> {
    use conditions::{condition, names::*};
    let mut out = BTreeMap::new();
    for (key, o) in outcomes {
        let generation = policies
            .iter()
            .find(|p| ObjectKey::of(&p.metadata) == *key)
            .and_then(|p| p.metadata.generation);
        let ancestors: std::collections::BTreeSet<&ObjectKey> = o
            .clusters
            .iter()
            .chain(&o.conflicted)
            .filter_map(|c| cluster_users.get(c))
            .flatten()
            .collect();
        // A policy with a problem has no usable CA (policy_ca fails as a whole): it cannot
        // validate anything, and the backends it targets are not sent traffic (fail closed).
        let accepted = if o.clusters.is_empty() && !o.conflicted.is_empty() {
            condition(
                ACCEPTED,
                false,
                CONFLICTED_POLICY,
                "an older BackendTLSPolicy targets the same Service port",
                generation,
            )
        } else if let Some((_, message)) = &o.problem {
            condition(
                ACCEPTED,
                false,
                NO_VALID_CA_CERTIFICATE,
                message.clone(),
                generation,
            )
        } else {
            condition(ACCEPTED, true, ACCEPTED, "Accepted", generation)
        };
        let resolved = match &o.problem {
            Some((reason, message)) => {
                condition(RESOLVED_REFS, false, reason, message.clone(), generation)
            }
            None => condition(RESOLVED_REFS, true, RESOLVED_REFS, "Resolved", generation),
        };
        let status = BackendTlsPolicyStatus {
            ancestors: ancestors
                .into_iter()
                .map(|gw| BackendTlsPolicyStatusAncestors {
                    ancestor_ref: serde_json::from_value(serde_json::json!({
                        "group": gateways::GATEWAY_GROUP, "kind": "Gateway", "name": gw.name, "namespace": gw.namespace,
                    }))
                    .unwrap_or_default(),
                    conditions: vec![accepted.clone(), resolved.clone()],
                    controller_name: controller.to_string(),
                })
                .collect(),
        };
        out.insert(key.clone(), status);
    }
    out
}
