//! What the provisioner needs to run one Gateway's data plane: the Gateway's
//! `spec.infrastructure` labels and annotations, its merged parameters, the addresses it asks
//! for and the ports its Service exposes. Only Accepted Gateways get one; a Gateway without one
//! has no data plane.

use crate::conditions::names::ROUTABILITY_CLUSTER;
use crate::gateways::ListenerCtx;
use crate::generated::gateways::Gateway;
use crate::names;
use crate::parameters::ResolvedParameters;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// GEP-1762 reserves this prefix for the labels Gateway API itself defines on generated
/// objects (`gateway.networking.k8s.io/gateway-name`, which the provisioner sets and selects
/// its Pods by); a Gateway may not set or override them.
pub const RESERVED_PREFIX: &str = "gateway.networking.k8s.io/";

/// One Gateway's data plane, as the provisioner renders it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Infrastructure {
    /// For the `gateway.networking.k8s.io/gateway-class-name` label GEP-1762 asks for.
    pub gateway_class_name: String,
    /// spec.infrastructure.labels, to put on every generated object. Entries that are not valid
    /// Kubernetes labels, or that use the reserved `gateway.networking.k8s.io/` prefix, are left
    /// out; the Gateway stays Accepted and its Accepted message names each one (Gateway API
    /// defines no condition for them: its CRD refuses them, so only files can carry them).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// spec.infrastructure.annotations, to put on every generated object; checked as the labels
    /// are (keys only: any string is a valid annotation value).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The Gateway's GatehouseParameters over its class's, over the defaults.
    pub parameters: ResolvedParameters,
    /// spec.addresses as requested, for the Service.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requested_addresses: Vec<RequestedAddress>,
    /// One entry per distinct (port, transport) of the listeners whose protocol Gatehouse
    /// serves, sorted, valid or not otherwise: a listener waiting for its certificate keeps its
    /// port, so the Service (and its node ports and load balancer) does not change under it.
    /// Listeners of a protocol Gatehouse does not serve get no port: nothing would listen
    /// there, and a UDP port would make the Service one of mixed protocols, which some load
    /// balancers refuse.
    pub ports: Vec<ServicePort>,
}

/// One entry of spec.addresses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestedAddress {
    #[serde(rename = "type")]
    pub type_: AddressType,
    /// `None`: the Gateway asks for an address of this type without naming one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// `true`: routability `Cluster`, a Service cluster IP (translate accepts no other
    /// routability on a Gateway it provisions for).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cluster: bool,
}

/// spec.addresses[].type; unset means IPAddress.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum AddressType {
    IPAddress,
    Hostname,
    NamedAddress,
    /// A domain-prefixed, implementation-specific type, as written.
    Other(String),
}

impl From<String> for AddressType {
    fn from(s: String) -> Self {
        match s.as_str() {
            "IPAddress" => AddressType::IPAddress,
            "Hostname" => AddressType::Hostname,
            "NamedAddress" => AddressType::NamedAddress,
            _ => AddressType::Other(s),
        }
    }
}

impl From<AddressType> for String {
    fn from(t: AddressType) -> Self {
        match t {
            AddressType::IPAddress => "IPAddress".into(),
            AddressType::Hostname => "Hostname".into(),
            AddressType::NamedAddress => "NamedAddress".into(),
            AddressType::Other(s) => s,
        }
    }
}

/// A port of the Gateway's Service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServicePort {
    pub port: u16,
    pub protocol: TransportProtocol,
    /// The listeners on this port, sorted by name.
    pub listeners: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TransportProtocol {
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "UDP")]
    Udp,
}

impl TransportProtocol {
    /// The transport of a listener protocol; `None` for one Gateway API does not define.
    pub fn of_listener(protocol: &str) -> Option<Self> {
        match protocol {
            "HTTP" | "HTTPS" | "TLS" | "TCP" => Some(TransportProtocol::Tcp),
            "UDP" => Some(TransportProtocol::Udp),
            _ => None,
        }
    }

    /// Service spec.ports[].protocol.
    pub fn as_str(self) -> &'static str {
        match self {
            TransportProtocol::Tcp => "TCP",
            TransportProtocol::Udp => "UDP",
        }
    }
}

/// spec.infrastructure labels and annotations of one Gateway, checked.
#[derive(Debug, Default)]
pub(crate) struct Propagated {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// One line per entry left out, naming it and why.
    pub problems: Vec<String>,
}

pub(crate) fn propagated(gw: &Gateway) -> Propagated {
    let mut out = Propagated::default();
    let Some(infra) = gw.spec.infrastructure.as_ref() else {
        return out;
    };
    for (key, value) in infra.labels.iter().flatten() {
        let problem = key_problem(key).or_else(|| {
            names::label_value(value)
                .err()
                .map(|why| format!("the value {value:?} is not a valid label value: {why}"))
        });
        match problem {
            None => {
                out.labels.insert(key.clone(), value.clone());
            }
            Some(why) => out
                .problems
                .push(format!("spec.infrastructure.labels[{key:?}]: {why}")),
        }
    }
    for (key, value) in infra.annotations.iter().flatten() {
        match key_problem(key) {
            None => {
                out.annotations.insert(key.clone(), value.clone());
            }
            Some(why) => out
                .problems
                .push(format!("spec.infrastructure.annotations[{key:?}]: {why}")),
        }
    }
    out
}

fn key_problem(key: &str) -> Option<String> {
    if key.starts_with(RESERVED_PREFIX) {
        return Some(format!(
            "the prefix {RESERVED_PREFIX} is reserved for the labels Gateway API defines \
             (GEP-1762)"
        ));
    }
    names::qualified_name(key)
        .err()
        .map(|why| format!("the key is not a valid Kubernetes key: {why}"))
}

pub(crate) fn requested_addresses(gw: &Gateway) -> Vec<RequestedAddress> {
    gw.spec
        .addresses
        .iter()
        .flatten()
        .map(|a| RequestedAddress {
            type_: AddressType::from(a.r#type.clone().unwrap_or_else(|| "IPAddress".into())),
            value: a.value.clone().filter(|v| !v.is_empty()),
            cluster: a.routability.as_deref() == Some(ROUTABILITY_CLUSTER),
        })
        .collect()
}

pub(crate) fn ports(listeners: &[ListenerCtx]) -> Vec<ServicePort> {
    let mut ports: BTreeMap<(u16, TransportProtocol), BTreeSet<&str>> = BTreeMap::new();
    for l in listeners {
        let Some(transport) = TransportProtocol::of_listener(&l.protocol) else {
            continue;
        };
        if l.port == 0 || !l.protocol_served() {
            continue;
        }
        ports
            .entry((l.port, transport))
            .or_default()
            .insert(l.name.as_str());
    }
    ports
        .into_iter()
        .map(|((port, protocol), names)| ServicePort {
            port,
            protocol,
            listeners: names.into_iter().map(String::from).collect(),
        })
        .collect()
}
