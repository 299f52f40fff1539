//! Gateway API objects to IR and status, as a pure function.
//!
//! All Gateway API semantics live here and nowhere else: which objects are ours, listener
//! validity and conflicts, route attachment and hostname intersection, ReferenceGrant, route
//! precedence, redirect defaults, and every status condition with the spec's reasons. The same
//! [`Input`] always gives the same [`Output`], whatever order the objects arrive in.

mod backends;
pub mod conditions;
mod gateways;
pub mod hostname;
mod http_routes;
mod http_rules;
mod input;
mod objects;
mod precedence;

pub use input::Input;
pub use objects::ObjectKey;

use gatehouse_ir as ir;
use gateway_api::apis::standard::{
    gatewayclasses::GatewayClassStatus, gateways::GatewayStatus, httproutes::HttpRouteStatus,
};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

/// The controllerName Gatehouse answers to.
pub const CONTROLLER_NAME: &str = "gatehouse.dev/gateway-controller";

/// Features listed in GatewayClass status.supportedFeatures: only what is implemented and
/// tested end to end.
pub const SUPPORTED_FEATURES: &[&str] = &[
    "Gateway",
    "HTTPRoute",
    "ReferenceGrant",
    "HTTPRouteHostRewrite",
    "HTTPRouteMethodMatching",
    "HTTPRoutePathRedirect",
    "HTTPRoutePathRewrite",
    "HTTPRoutePortRedirect",
    "HTTPRouteQueryParamMatching",
    "HTTPRouteResponseHeaderModification",
    "HTTPRouteSchemeRedirect",
];

#[derive(Clone, Debug)]
pub struct Options {
    pub controller_name: String,
    /// Address for Gateways that request none.
    pub default_address: IpAddr,
    /// Addresses assigned from outside (e.g. one loopback address per Gateway); they win over
    /// the Gateway's own spec.addresses.
    pub gateway_addresses: BTreeMap<ObjectKey, IpAddr>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            controller_name: CONTROLLER_NAME.to_string(),
            default_address: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            gateway_addresses: BTreeMap::new(),
        }
    }
}

/// Status of every object Gatehouse is responsible for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Status {
    pub gateway_classes: BTreeMap<String, GatewayClassStatus>,
    pub gateways: BTreeMap<ObjectKey, GatewayStatus>,
    pub http_routes: BTreeMap<ObjectKey, HttpRouteStatus>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Output {
    pub config: ir::Config,
    pub status: Status,
}

pub fn translate(input: &Input, options: &Options) -> Output {
    let (class_status, our_classes) =
        gateways::classes(&input.gateway_classes, &options.controller_name);
    let mut gws = gateways::gateways(&input.gateways, &our_classes, options);
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
        &input.reference_grants,
    );
    let (attachments, route_status) = http_routes::attach(
        &input.http_routes,
        &mut gws,
        &mut backends,
        &namespace_labels,
        &options.controller_name,
    );

    let mut config_gateways = Vec::new();
    for (gi, gw) in gws.iter().enumerate() {
        let Some(address) = gw.address else { continue };
        let mut listeners = Vec::new();
        for (li, l) in gw.listeners.iter().enumerate() {
            if !l.programmable() {
                continue;
            }
            let mut rules = Vec::new();
            let mut candidates = Vec::new();
            for a in attachments
                .iter()
                .filter(|a| a.gateway == gi && a.listener == li)
            {
                for (rule_index, template) in a.rules.iter() {
                    let rule = rules.len();
                    rules.push(template.resolve("http", l.port));
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
            listeners.push(ir::Listener {
                name: l.name.clone(),
                address,
                port: l.port,
                protocol: ir::ListenerProtocol::Http,
                hostname: l.hostname.clone(),
                rules,
                virtual_hosts: precedence::virtual_hosts(candidates),
            });
        }
        config_gateways.push(ir::Gateway {
            namespace: gw.key.namespace.clone(),
            name: gw.key.name.clone(),
            listeners,
        });
    }

    let gateway_status = gws
        .iter()
        .map(|g| (g.key.clone(), gateways::status(g)))
        .collect();
    Output {
        config: ir::Config {
            gateways: config_gateways,
            clusters: backends.clusters.into_values().collect(),
        },
        status: Status {
            gateway_classes: class_status,
            gateways: gateway_status,
            http_routes: route_status,
        },
    }
}
