//! GatewayClasses and Gateways: which are ours, their addresses, and every listener's conditions.

use crate::conditions::{condition, names::*};
use crate::generated::gateways::{
    Gateway, GatewayListeners, GatewayListenersAllowedRoutesNamespacesFrom,
    GatewayListenersFiltersRequests, GatewayListenersFiltersRequestsType, GatewayStatus,
    GatewayStatusListeners, GatewayStatusListenersSupportedKinds,
};
use crate::generated::listenersets::ListenerSet;
use crate::infrastructure::{self, Propagated};
use crate::listener_sets::{self, ListenerSetCtx};
use crate::listener_tls::{self, Owner, Problem, TlsProblem};
use crate::objects::{GATEWAY_GROUP, ObjectKey, age_key, selector_matches};
use crate::parameters::{self, Layer, ResolvedParameters};
use crate::refs::Refs;
use crate::{Options, PublishedAddress, gateway_addresses, supported_features};
use gatehouse_ir as ir;
use gateway_api::apis::standard::gatewayclasses::{
    GatewayClass, GatewayClassStatus, GatewayClassStatusSupportedFeatures,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

/// The accepted GatewayClasses of our controller by name, with the GatehouseParameters their
/// parametersRef names (already checked on their own).
pub type OurClasses<'a> = BTreeMap<String, Option<Layer<'a>>>;

/// Statuses of the GatewayClasses that name our controller, and the accepted ones.
pub fn classes<'a>(
    classes: &[Arc<GatewayClass>],
    controller: &str,
    parameters: &'a parameters::Index<'a>,
    provisioned: bool,
) -> (BTreeMap<String, GatewayClassStatus>, OurClasses<'a>) {
    let mut statuses = BTreeMap::new();
    let mut accepted = BTreeMap::new();
    for class in classes
        .iter()
        .filter(|c| c.spec.controller_name == controller)
    {
        let name = class.metadata.name.clone().unwrap_or_default();
        let generation = class.metadata.generation;
        // A class's parameters are the defaults of every Gateway of the class, so they must
        // hold on their own, whatever a Gateway's parameters would override.
        let layer = match &class.spec.parameters_ref {
            None => Ok(None),
            Some(r) => parameters::lookup(
                parameters,
                &r.group,
                &r.kind,
                r.namespace.as_deref(),
                &r.name,
            )
            .map_err(|why| format!("spec.parametersRef: {why}"))
            .and_then(|layer| parameters::resolve(&[layer]).map(|_| Some(layer))),
        };
        let cond = match layer {
            Err(why) => condition(ACCEPTED, false, INVALID_PARAMETERS, why, generation),
            Ok(layer) => {
                accepted.insert(name.clone(), layer);
                condition(
                    ACCEPTED,
                    true,
                    ACCEPTED,
                    "Accepted by Gatehouse",
                    generation,
                )
            }
        };
        let supported_features = supported_features(provisioned)
            .into_iter()
            .map(|f| GatewayClassStatusSupportedFeatures {
                name: f.to_string(),
            })
            .collect();
        statuses.insert(
            name,
            GatewayClassStatus {
                conditions: Some(vec![cond]),
                supported_features: Some(supported_features),
            },
        );
    }
    (statuses, accepted)
}

/// Which namespaces a listener admits routes from (allowedRoutes), or a Gateway admits
/// ListenerSets from (allowedListeners).
#[derive(Clone, Debug)]
pub enum AllowedNamespaces {
    Same,
    All,
    Selector {
        labels: Option<BTreeMap<String, String>>,
        expressions: Vec<(String, String, Vec<String>)>,
    },
}

impl AllowedNamespaces {
    /// Does this admit an object in `namespace`, for an owner in `own_namespace`?
    pub fn admits(
        &self,
        own_namespace: &str,
        namespace: &str,
        namespace_labels: &BTreeMap<String, BTreeMap<String, String>>,
    ) -> bool {
        match self {
            AllowedNamespaces::Same => own_namespace == namespace,
            AllowedNamespaces::All => true,
            AllowedNamespaces::Selector {
                labels,
                expressions,
            } => {
                let empty = BTreeMap::new();
                let ns_labels = namespace_labels.get(namespace).unwrap_or(&empty);
                selector_matches(labels.as_ref(), expressions, ns_labels)
            }
        }
    }
}

/// A generated namespace selector as [`AllowedNamespaces::Selector`]: allowedRoutes' and
/// allowedListeners' are distinct generated types with the same fields.
macro_rules! namespace_selector {
    ($selector:expr) => {{
        let sel = $selector;
        $crate::gateways::AllowedNamespaces::Selector {
            labels: sel.and_then(|s| s.match_labels.clone()),
            expressions: sel
                .and_then(|s| s.match_expressions.as_ref())
                .into_iter()
                .flatten()
                .map(|e| {
                    (
                        e.key.clone(),
                        e.operator.clone(),
                        e.values.clone().unwrap_or_default(),
                    )
                })
                .collect(),
        }
    }};
}
pub(crate) use namespace_selector;

/// One listener as translate sees it while attaching routes.
#[derive(Debug)]
pub struct ListenerCtx {
    pub name: String,
    pub port: u16,
    pub protocol: String,
    pub hostname: Option<String>,
    /// Route kinds this listener accepts (group, kind).
    pub kinds: Vec<(String, String)>,
    pub namespaces: AllowedNamespaces,
    /// The namespace of the object that declares the listener (the Gateway or a ListenerSet):
    /// allowedRoutes `Same` means this one.
    pub namespace: String,
    /// The ListenerSet that declares it (index in [`GatewayCtx::listener_sets`]), or `None`
    /// for the Gateway's own listeners. A parentRef reaches a listener only through the
    /// object that declares it.
    pub set: Option<usize>,
    pub attached_routes: i32,
    /// HTTPS and TLS listeners whose references all resolved.
    pub tls: Option<ir::ListenerTls>,
    /// `filters.requests` as written; [`resolve_filters`] makes [`ListenerCtx::filters`] of
    /// them once backends can be resolved.
    raw_filters: Vec<GatewayListenersFiltersRequests>,
    /// Pre-routing filters, in order (only `ExternalAuth`).
    pub filters: Vec<ir::HttpFilter>,
    conditions: ListenerConditions,
}

#[derive(Debug, Default)]
struct ListenerConditions {
    unsupported_protocol: Option<String>,
    /// Pre-routing filters Gatehouse cannot run (GatewayListenerFilters): the listener is not
    /// served, because its routes would see requests the filters were meant to stop.
    unsupported_filters: Option<String>,
    /// The first backendRef of a pre-routing filter that cannot be used (its filter refuses
    /// every request): (reason, message) for ResolvedRefs.
    filter_ref: Option<(&'static str, String)>,
    invalid_kinds: Vec<String>,
    conflict: Option<&'static str>,
    /// A listener of an older Gateway already serves this address, port and hostname (or
    /// speaks another protocol there): who, for the messages of this listener and its routes.
    taken_by: Option<String>,
    tls_problem: Option<TlsProblem>,
}

impl ListenerCtx {
    /// Accepted, free of conflicts, references resolved: traffic can be served.
    pub fn programmable(&self) -> bool {
        self.conditions.unsupported_protocol.is_none()
            && self.conditions.unsupported_filters.is_none()
            && self.conditions.conflict.is_none()
            && self.conditions.tls_problem.is_none()
    }

    /// The listener's protocol is one Gatehouse serves (whatever else is wrong with it).
    pub fn protocol_served(&self) -> bool {
        self.conditions.unsupported_protocol.is_none()
    }

    /// Why routes attached here get no traffic because another Gateway holds the socket.
    pub fn taken_by(&self) -> Option<&str> {
        self.conditions.taken_by.as_deref()
    }

    pub fn ir_protocol(&self) -> ir::ListenerProtocol {
        match self.protocol.as_str() {
            "HTTPS" => ir::ListenerProtocol::Https,
            "TLS" => ir::ListenerProtocol::Tls,
            "TCP" => ir::ListenerProtocol::Tcp,
            "UDP" => ir::ListenerProtocol::Udp,
            _ => ir::ListenerProtocol::Http,
        }
    }

    pub fn allows_kind(&self, group: &str, kind: &str) -> bool {
        self.kinds.iter().any(|(g, k)| g == group && k == kind)
    }

    /// The conflict this ListenerSet listener lost to a listener before it on the same
    /// Gateway ([`mark_set_conflicts`]): it is refused outright (Accepted=False), while the
    /// winner is served as if there were no conflict. A clash with another Gateway's listener
    /// (`taken_by`) is reported as that instead.
    fn lost_precedence(&self) -> Option<&'static str> {
        let c = &self.conditions;
        self.set.and(c.conflict).filter(|_| c.taken_by.is_none())
    }

    pub fn allows_namespace(
        &self,
        route_namespace: &str,
        namespace_labels: &BTreeMap<String, BTreeMap<String, String>>,
    ) -> bool {
        self.namespaces
            .admits(&self.namespace, route_namespace, namespace_labels)
    }
}

pub struct GatewayCtx<'a> {
    pub key: ObjectKey,
    pub object: &'a Gateway,
    /// `None` when the Gateway cannot be served: it asks for an address Gatehouse cannot serve
    /// on, or its parameters are invalid ([`GatewayCtx::problem`]).
    pub address: Option<IpAddr>,
    problem: Option<GatewayProblem>,
    /// `None` when they are invalid.
    pub parameters: Option<ResolvedParameters>,
    /// spec.infrastructure labels and annotations, checked.
    pub(crate) propagated: Propagated,
    /// The Gateway's own listeners, then those of each allowed ListenerSet in
    /// [`listener_sets`](Self::listener_sets) order ([`ListenerCtx::set`]).
    pub listeners: Vec<ListenerCtx>,
    /// Every ListenerSet that names this Gateway, allowed or not, in precedence order.
    pub listener_sets: Vec<ListenerSetCtx<'a>>,
    /// spec.tls.backend.clientCertificateRef, resolved to a certificate name.
    pub backend_client_certificate: Result<Option<String>, Problem>,
}

/// Why a whole Gateway cannot be served.
#[derive(Debug)]
enum GatewayProblem {
    /// Its parametersRef does not resolve, or the merged parameters are invalid.
    Parameters(String),
    /// It asks for an address of a type (or a value) Gatehouse cannot serve on: not
    /// Accepted (UnsupportedAddress).
    Address(String),
    /// Its addresses are of a supported type but cannot all be used (more than one): Accepted,
    /// not Programmed (AddressNotUsable), and nothing is bound until spec.addresses changes.
    UnusableAddress(String),
}

/// What every Gateway's listeners are built from besides the Gateway itself.
pub struct GatewayInputs<'i, 'a> {
    pub listener_sets: &'a [Arc<ListenerSet>],
    pub namespace_labels: &'i BTreeMap<String, BTreeMap<String, String>>,
    pub refs: &'i Refs<'i>,
}

/// Our Gateways (class accepted and ours), oldest first.
pub fn gateways<'a>(
    gateways: &'a [Arc<Gateway>],
    our_classes: &OurClasses<'_>,
    parameters: &parameters::Index<'_>,
    options: &Options,
    inputs: &GatewayInputs<'_, 'a>,
    certificates: &mut BTreeMap<String, ir::Certificate>,
) -> Vec<GatewayCtx<'a>> {
    let mut ours: Vec<(&Gateway, Option<Layer>)> = gateways
        .iter()
        .filter_map(|g| {
            our_classes
                .get(&g.spec.gateway_class_name)
                .map(|class| (&**g, *class))
        })
        .collect();
    ours.sort_by_key(|(g, _)| age_key(&g.metadata));
    let mut gateways: Vec<GatewayCtx> = ours
        .into_iter()
        .map(|(g, class)| gateway(g, class, parameters, options, inputs, certificates))
        .collect();
    mark_cross_gateway_conflicts(&mut gateways);
    gateways
}

/// Listeners of different Gateways that land on one address and port share its socket when
/// they speak the same protocol family with distinct hostnames. Otherwise the older Gateway
/// keeps the socket (creation time, then namespace/name) and the newer one's listener is
/// refused, naming the winner, instead of being shadowed in silence.
fn mark_cross_gateway_conflicts(gateways: &mut [GatewayCtx]) {
    // (address, port, transport) -> listeners that hold it: (gateway, listener). A UDP
    // listener's socket is not a TCP one, so they never clash.
    let mut claims: BTreeMap<(IpAddr, u16, ir::Transport), Vec<(usize, usize)>> = BTreeMap::new();
    for gi in 0..gateways.len() {
        let Some(address) = gateways[gi].address else {
            continue;
        };
        for li in 0..gateways[gi].listeners.len() {
            let l = &gateways[gi].listeners[li];
            if !l.programmable() {
                continue;
            }
            let holders = claims
                .entry((address, l.port, l.ir_protocol().transport()))
                .or_default();
            let clash = holders.iter().find_map(|&(hg, hl)| {
                let h = &gateways[hg].listeners[hl];
                if hg == gi {
                    return None;
                }
                if family(&h.protocol) != family(&l.protocol) {
                    Some((PROTOCOL_CONFLICT, hg, hl))
                } else if h.hostname == l.hostname {
                    Some((HOSTNAME_CONFLICT, hg, hl))
                } else {
                    None
                }
            });
            match clash {
                None => holders.push((gi, li)),
                Some((reason, hg, hl)) => {
                    let holder = &gateways[hg];
                    let what = match reason {
                        PROTOCOL_CONFLICT => format!(
                            "speaks {} on {address}:{}",
                            holder.listeners[hl].protocol, l.port
                        ),
                        _ => format!(
                            "serves hostname {} on {address}:{}",
                            l.hostname.as_deref().unwrap_or("*"),
                            l.port
                        ),
                    };
                    let message = format!(
                        "listener {} of the older Gateway {} already {what}",
                        holder.listeners[hl].name, holder.key
                    );
                    let c = &mut gateways[gi].listeners[li].conditions;
                    c.conflict = Some(reason);
                    c.taken_by = Some(message);
                }
            }
        }
    }
}

fn family(protocol: &str) -> &'static str {
    match protocol {
        "HTTP" => "http",
        "HTTPS" | "TLS" => "tls",
        "UDP" => "udp",
        "TCP" => "tcp",
        // Unsupported protocols never reach a socket.
        _ => "other",
    }
}

fn gateway<'a>(
    gw: &'a Gateway,
    class: Option<Layer<'_>>,
    index: &parameters::Index<'_>,
    options: &Options,
    inputs: &GatewayInputs<'_, 'a>,
    certificates: &mut BTreeMap<String, ir::Certificate>,
) -> GatewayCtx<'a> {
    let refs = inputs.refs;
    let key = ObjectKey::of(&gw.metadata);
    let (parameters, problem, address) = match gateway_parameters(gw, &key, class, index) {
        // Invalid parameters leave nothing to provision, so nothing to bind either.
        Err(why) => (None, Some(GatewayProblem::Parameters(why)), None),
        Ok(parameters) => match address(gw, &key, options) {
            Ok(address) => (Some(parameters), None, Some(address)),
            Err(problem) => (Some(parameters), Some(problem), None),
        },
    };
    let mut with_tls = |l: &GatewayListeners, owner: Owner<'_>, set: Option<usize>| {
        let mut ctx = listener(l, owner.namespace, set);
        if ctx.conditions.unsupported_protocol.is_none() {
            match listener_tls::listener_tls(gw, owner, l, refs, certificates) {
                Ok(tls) => ctx.tls = tls,
                Err(problem) => ctx.conditions.tls_problem = Some(problem),
            }
        }
        ctx
    };
    let own = Owner {
        kind: "Gateway",
        namespace: &key.namespace,
    };
    let mut listeners: Vec<ListenerCtx> = gw
        .spec
        .listeners
        .iter()
        .map(|l| with_tls(l, own, None))
        .collect();
    mark_conflicts(&mut listeners);
    let own_count = listeners.len();
    let mut listener_sets = Vec::new();
    for ls in listener_sets::naming(inputs.listener_sets, &key) {
        let set_key = ObjectKey::of(&ls.metadata);
        let allowed = listener_sets::allowed(
            gw,
            &key.namespace,
            &set_key.namespace,
            inputs.namespace_labels,
        );
        if allowed {
            let owner = Owner {
                kind: "ListenerSet",
                namespace: &set_key.namespace,
            };
            for l in &ls.spec.listeners {
                let l = listener_sets::as_gateway_listener(l);
                listeners.push(with_tls(&l, owner, Some(listener_sets.len())));
            }
        }
        listener_sets.push(ListenerSetCtx {
            key: set_key,
            object: ls,
            allowed,
        });
    }
    mark_set_conflicts(&mut listeners, own_count);
    let client_ref = gw
        .spec
        .tls
        .as_ref()
        .and_then(|t| t.backend.as_ref())
        .and_then(|b| b.client_certificate_ref.as_ref());
    let backend_client_certificate = match client_ref {
        None => Ok(None),
        Some(r) => listener_tls::secret_ref(
            Owner {
                kind: "Gateway",
                namespace: &key.namespace,
            },
            r.group.as_deref(),
            r.kind.as_deref(),
            &r.name,
            r.namespace.as_deref(),
            refs,
            certificates,
        )
        .map(Some)
        .map_err(|(reason, message)| match reason {
            // A missing ReferenceGrant keeps its own reason; everything else about the Secret
            // is an invalid client certificate reference.
            REF_NOT_PERMITTED => (REF_NOT_PERMITTED, message),
            _ => (INVALID_CLIENT_CERTIFICATE_REF, message),
        }),
    };
    GatewayCtx {
        key,
        object: gw,
        address,
        problem,
        parameters,
        propagated: infrastructure::propagated(gw),
        listeners,
        listener_sets,
        backend_client_certificate,
    }
}

/// The Gateway's own GatehouseParameters (spec.infrastructure.parametersRef, always in its
/// namespace) over its class's, over the defaults.
fn gateway_parameters(
    gw: &Gateway,
    key: &ObjectKey,
    class: Option<Layer<'_>>,
    index: &parameters::Index<'_>,
) -> Result<ResolvedParameters, String> {
    let mut layers: Vec<Layer> = class.into_iter().collect();
    if let Some(r) = gw
        .spec
        .infrastructure
        .as_ref()
        .and_then(|i| i.parameters_ref.as_ref())
    {
        let own = parameters::lookup(index, &r.group, &r.kind, Some(&key.namespace), &r.name)
            .map_err(|why| format!("spec.infrastructure.parametersRef: {why}"))?;
        layers.push(own);
    }
    parameters::resolve(&layers)
}

/// Where the Gateway is served, or why it cannot be. Address types are checked whatever
/// assigns the address (a provisioned Gateway's bind address comes from outside, yet its
/// spec.addresses still asks its Service for one): only IPAddress is served, and only one
/// besides cluster IPs.
///
/// Routability (GEP-5093) is checked first, because an address that cannot be given the
/// reachability asked for must not be replaced by one that can: serving a Gateway meant to be
/// internal on a public address is worse than not serving it. `Cluster` is a Service cluster
/// IP, which only a provisioned data plane has a Service of its own for; any other value is
/// unknown to Gatehouse.
fn address(gw: &Gateway, key: &ObjectKey, options: &Options) -> Result<IpAddr, GatewayProblem> {
    let requested = gw.spec.addresses.as_deref().unwrap_or_default();
    let mut ips = Vec::with_capacity(requested.len());
    for one in requested {
        let kind = one.r#type.as_deref().unwrap_or("IPAddress");
        let value = one.value.as_deref().unwrap_or_default();
        let cluster = match one.routability.as_deref().unwrap_or_default() {
            "" => false,
            ROUTABILITY_CLUSTER if options.provisioned => true,
            ROUTABILITY_CLUSTER => {
                return Err(GatewayProblem::Address(
                    "routability Cluster (a Service cluster IP) needs a data plane provisioned \
                     per Gateway (the controller's --provision mode); this Gatehouse binds its \
                     addresses itself"
                        .to_string(),
                ));
            }
            other => {
                return Err(GatewayProblem::Address(format!(
                    "routability {other} is not one Gatehouse knows (it knows Cluster)"
                )));
            }
        };
        if kind != "IPAddress" {
            return Err(GatewayProblem::Address(format!(
                "address type {kind} is not supported (IPAddress only)"
            )));
        }
        // No value: any address of the type will do (GatewayAddressEmpty).
        if value.is_empty() {
            continue;
        }
        match value.parse::<IpAddr>() {
            // A cluster IP is the Service's, not one more address to bind or ask a load
            // balancer for.
            Ok(_) if cluster => {}
            Ok(ip) => ips.push(ip),
            Err(_) => {
                return Err(GatewayProblem::Address(format!(
                    "address {value:?} is not an IP address"
                )));
            }
        }
    }
    if ips.len() > 1 {
        let list: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
        return Err(GatewayProblem::UnusableAddress(format!(
            "Gatehouse serves a Gateway on one address; spec.addresses asks for {}",
            list.join(", ")
        )));
    }
    if let Some(assigned) = options.gateway_addresses.get(key) {
        return Ok(*assigned);
    }
    Ok(ips.first().copied().unwrap_or(options.default_address))
}

fn listener(l: &GatewayListeners, namespace: &str, set: Option<usize>) -> ListenerCtx {
    let protocol = l.protocol.clone();
    let supported = crate::routes::kinds_for_protocol(&protocol);
    let passthrough = l.tls.as_ref().and_then(|t| t.mode.as_ref())
        == Some(&crate::generated::gateways::GatewayListenersTlsMode::Passthrough);
    let unsupported_protocol = if supported.is_empty() {
        Some(format!("protocol {} is not supported yet", protocol))
    } else if protocol == "HTTPS" && passthrough {
        Some("HTTPS listeners terminate TLS; use protocol TLS for passthrough".to_string())
    } else {
        None
    };
    let mut conditions = ListenerConditions {
        unsupported_protocol,
        unsupported_filters: unsupported_filters(l),
        ..Default::default()
    };
    let raw_filters = l
        .filters
        .as_ref()
        .and_then(|f| f.requests.clone())
        .unwrap_or_default();
    let requested = l.allowed_routes.as_ref().and_then(|a| a.kinds.as_ref());
    let kinds = match requested {
        None => supported
            .iter()
            .map(|k| (GATEWAY_GROUP.to_string(), k.to_string()))
            .collect(),
        Some(list) => {
            let mut kinds = Vec::new();
            for k in list {
                let group = k.group.clone().unwrap_or_else(|| GATEWAY_GROUP.to_string());
                if group == GATEWAY_GROUP && supported.contains(&k.kind) {
                    kinds.push((group, k.kind.clone()));
                } else {
                    conditions.invalid_kinds.push(format!("{group}/{}", k.kind));
                }
            }
            kinds
        }
    };
    let namespaces = match l
        .allowed_routes
        .as_ref()
        .and_then(|a| a.namespaces.as_ref())
    {
        None => AllowedNamespaces::Same,
        Some(ns) => match ns.from {
            Some(GatewayListenersAllowedRoutesNamespacesFrom::All) => AllowedNamespaces::All,
            Some(GatewayListenersAllowedRoutesNamespacesFrom::Selector) => {
                namespace_selector!(ns.selector.as_ref())
            }
            _ => AllowedNamespaces::Same,
        },
    };
    ListenerCtx {
        name: l.name.clone(),
        port: u16::try_from(l.port).unwrap_or(0),
        protocol,
        hostname: l.hostname.as_ref().map(|h| h.to_ascii_lowercase()),
        kinds,
        namespaces,
        namespace: namespace.to_string(),
        set,
        attached_routes: 0,
        tls: None,
        raw_filters,
        filters: Vec::new(),
        conditions,
    }
}

/// Listener filters run before routing. Gatehouse runs ExternalAuth (see [`resolve_filters`])
/// and has no extensions; ignoring a filter would serve every request it was there to
/// refuse, so a listener with one Gatehouse cannot run is not accepted. Filters see HTTP
/// requests, so only HTTP and HTTPS listeners may have them.
fn unsupported_filters(l: &GatewayListeners) -> Option<String> {
    let requests = l.filters.as_ref()?.requests.as_deref().unwrap_or_default();
    if requests.is_empty() {
        return None;
    }
    if !matches!(l.protocol.as_str(), "HTTP" | "HTTPS") {
        return Some(format!(
            "listener filters apply to HTTP requests; a {} listener has none to run them on",
            l.protocol
        ));
    }
    let unsupported: Vec<String> = requests
        .iter()
        .filter(|f| f.r#type != GatewayListenersFiltersRequestsType::ExternalAuth)
        .map(|f| format!("{:?}", f.r#type))
        .collect();
    if unsupported.is_empty() {
        return None;
    }
    Some(format!(
        "listener filters not supported by Gatehouse ({}): requests would reach routes without them",
        unsupported.join(", ")
    ))
}

/// Makes the pre-routing filters of every listener whose filters are all supported, now that
/// backendRefs can be resolved (from the Gateway's namespace, or the ListenerSet's, under
/// ReferenceGrants to that kind). A filter whose backendRef cannot be used stays, with an
/// invalid target that refuses every request, and the listener says why in ResolvedRefs.
pub fn resolve_filters(gws: &mut [GatewayCtx], backends: &mut crate::backends::Backends) {
    use crate::generated::gateways::GatewayListenersFiltersRequestsExternalAuthProtocol as Protocol;
    for gw in gws.iter_mut() {
        for l in gw.listeners.iter_mut() {
            if l.raw_filters.is_empty() || l.conditions.unsupported_filters.is_some() {
                continue;
            }
            let from = crate::refs::Referrer {
                group: GATEWAY_GROUP,
                kind: if l.set.is_some() {
                    "ListenerSet"
                } else {
                    "Gateway"
                },
                namespace: &l.namespace,
            };
            let mut filters = Vec::new();
            let mut problem = None;
            for (i, f) in l.raw_filters.iter().enumerate() {
                let Some(a) = f.external_auth.as_ref() else {
                    l.conditions.unsupported_filters = Some(format!(
                        "listener filter {i} (ExternalAuth) needs externalAuth"
                    ));
                    break;
                };
                let raw = crate::routes::http::external_auth::raw_external_auth!(a, Protocol);
                let made = crate::routes::http::external_auth::filter(&raw, |b, h2| {
                    let resolved = if h2 {
                        backends.resolve_grpc(from, b)
                    } else {
                        backends.resolve(from, b)
                    };
                    let target = match resolved {
                        Ok(cluster) => ir::BackendTarget::Cluster(cluster),
                        Err(p) => {
                            let target = ir::BackendTarget::Invalid {
                                reason: p.message.clone(),
                            };
                            problem.get_or_insert((p.reason, p.message));
                            target
                        }
                    };
                    crate::routes::ResolvedBackend {
                        target,
                        policy_cluster: None,
                    }
                });
                match made {
                    Ok(filter) => filters.push(ir::HttpFilter::ExternalAuth(filter)),
                    Err(why) => {
                        l.conditions.unsupported_filters = Some(why);
                        break;
                    }
                }
            }
            if l.conditions.unsupported_filters.is_none() {
                l.filters = filters;
                l.conditions.filter_ref = problem;
            }
        }
    }
}

/// Listeners sharing a port must agree on the protocol family and have distinct hostnames;
/// every listener involved in a conflict is marked, because none of them can be served as asked.
/// A UDP listener shares its port number with no socket of the TCP-based ones, so only another
/// UDP listener conflicts with it; TCP and UDP listeners have no hostname, so two of them on
/// one port are not distinct (the spec: "TCP, UDP: Port").
fn mark_conflicts(listeners: &mut [ListenerCtx]) {
    for i in 0..listeners.len() {
        for j in 0..listeners.len() {
            if i == j
                || listeners[i].port != listeners[j].port
                || listeners[i].ir_protocol().transport() != listeners[j].ir_protocol().transport()
            {
                continue;
            }
            let (a, b) = (&listeners[i], &listeners[j]);
            let reason = if family(&a.protocol) != family(&b.protocol) {
                Some(PROTOCOL_CONFLICT)
            } else if a.hostname == b.hostname {
                Some(HOSTNAME_CONFLICT)
            } else {
                None
            };
            if let Some(r) = reason {
                // Protocol conflicts outrank hostname conflicts when both apply.
                if listeners[i].conditions.conflict != Some(PROTOCOL_CONFLICT) {
                    listeners[i].conditions.conflict = Some(r);
                }
            }
        }
    }
}

/// Listeners of ListenerSets come after the Gateway's own and lose to every listener before
/// them: the Gateway's own listeners, then the listeners of older sets, then earlier ones of
/// the same set (the spec's precedence). A listener that lost is refused (Conflicted) and
/// keeps nothing from the listeners after it; the Gateway's own listeners are judged among
/// themselves by [`mark_conflicts`] and are never displaced by a ListenerSet.
fn mark_set_conflicts(listeners: &mut [ListenerCtx], own: usize) {
    for i in own..listeners.len() {
        if listeners[i].conditions.unsupported_protocol.is_some() {
            continue;
        }
        let l = &listeners[i];
        let mut reason = None;
        for (j, earlier) in listeners[..i].iter().enumerate() {
            // The Gateway's own listeners hold their port even when they conflict among
            // themselves; a ListenerSet's only when it can be served.
            let holds = if j < own {
                earlier.protocol_served()
            } else {
                earlier.programmable()
            };
            if !holds
                || earlier.port != l.port
                || earlier.ir_protocol().transport() != l.ir_protocol().transport()
            {
                continue;
            }
            if family(&earlier.protocol) != family(&l.protocol) {
                reason = Some(PROTOCOL_CONFLICT);
                break;
            } else if earlier.hostname == l.hostname {
                reason = Some(HOSTNAME_CONFLICT);
            }
        }
        listeners[i].conditions.conflict = reason;
    }
}

impl GatewayCtx<'_> {
    /// Why no listener of the Gateway (or of its ListenerSets) can be programmed, if so.
    pub(crate) fn problem_message(&self) -> Option<String> {
        self.problem.as_ref().map(|p| match p {
            GatewayProblem::Parameters(why) => {
                format!("the Gateway's parameters are invalid: {why}")
            }
            GatewayProblem::Address(why) | GatewayProblem::UnusableAddress(why) => {
                format!("the Gateway's address cannot be used: {why}")
            }
        })
    }
}

/// The Gateway's status once routes have been attached (attachedRoutes is known). Only its
/// own listeners are reported here; those of ListenerSets are in theirs
/// ([`listener_sets::status`]), and attachedListenerSets is filled in once those are known.
/// `published`: the data plane's Service's addresses (default, cluster), when one is
/// published ([`gateway_addresses::assign`]).
pub fn status(
    gw: &GatewayCtx,
    published: Option<(&[PublishedAddress], &[PublishedAddress])>,
) -> GatewayStatus {
    let generation = gw.object.metadata.generation;
    let assignment = gw
        .address
        .map(|bind| gateway_addresses::assign(gw.object, bind, published));
    // Programmed on each listener says why not with the Gateway's own problem first.
    let gateway_problem = gw.problem_message();
    let own: Vec<&ListenerCtx> = gw.listeners.iter().filter(|l| l.set.is_none()).collect();
    let listeners: Vec<GatewayStatusListeners> = own
        .iter()
        .map(|l| listener_status(l, gateway_problem.as_deref(), generation))
        .collect();
    let programmed = own.iter().filter(|l| l.programmable()).count();
    let all_valid = programmed == own.len();

    let (accepted, programmed_cond) = match &gw.problem {
        Some(GatewayProblem::Parameters(problem)) => (
            condition(
                ACCEPTED,
                false,
                INVALID_PARAMETERS,
                problem.clone(),
                generation,
            ),
            condition(PROGRAMMED, false, INVALID, problem.clone(), generation),
        ),
        Some(GatewayProblem::Address(problem)) => (
            condition(
                ACCEPTED,
                false,
                UNSUPPORTED_ADDRESS,
                problem.clone(),
                generation,
            ),
            condition(
                PROGRAMMED,
                false,
                ADDRESS_NOT_USABLE,
                problem.clone(),
                generation,
            ),
        ),
        None | Some(GatewayProblem::UnusableAddress(_)) => {
            let accepted = if all_valid {
                condition(
                    ACCEPTED,
                    true,
                    ACCEPTED,
                    with_propagation_problems("Accepted by Gatehouse".to_string(), gw),
                    generation,
                )
            } else {
                condition(
                    ACCEPTED,
                    programmed > 0,
                    LISTENERS_NOT_VALID,
                    with_propagation_problems(
                        format!(
                            "{} of {} listeners are not valid",
                            own.len() - programmed,
                            own.len()
                        ),
                        gw,
                    ),
                    generation,
                )
            };
            let prog = if let Some(GatewayProblem::UnusableAddress(why)) = &gw.problem {
                condition(
                    PROGRAMMED,
                    false,
                    ADDRESS_NOT_USABLE,
                    why.clone(),
                    generation,
                )
            } else if programmed > 0 && assignment.as_ref().is_some_and(|a| a.waiting) {
                // Its own Service has no address yet (a load balancer still assigning one):
                // clients cannot reach it, so it is not Programmed yet.
                condition(
                    PROGRAMMED,
                    false,
                    ADDRESS_NOT_ASSIGNED,
                    "waiting for an address: the data plane's Service has none yet",
                    generation,
                )
            } else if programmed > 0 {
                condition(PROGRAMMED, true, PROGRAMMED, "Programmed", generation)
            } else {
                condition(
                    PROGRAMMED,
                    false,
                    INVALID,
                    "no listener can be served",
                    generation,
                )
            };
            (accepted, prog)
        }
    };
    let mut conditions = vec![accepted, programmed_cond];
    if listener_tls::uses_insecure_fallback(gw.object) {
        conditions.push(condition(
            INSECURE_FRONTEND_VALIDATION_MODE,
            true,
            CONFIGURATION_CHANGED,
            "client certificate validation allows clients without a valid certificate \
             (AllowInsecureFallback)",
            generation,
        ));
    }
    if gw
        .object
        .spec
        .tls
        .as_ref()
        .and_then(|t| t.backend.as_ref())
        .is_some()
    {
        conditions.push(match &gw.backend_client_certificate {
            Ok(_) => condition(RESOLVED_REFS, true, RESOLVED_REFS, "Resolved", generation),
            Err((reason, message)) => {
                condition(RESOLVED_REFS, false, reason, message.clone(), generation)
            }
        });
    }
    if let Some((ok, reason, message)) = assignment.as_ref().and_then(|a| a.assigned.clone()) {
        conditions.push(condition(
            ADDRESSES_ASSIGNED,
            ok,
            reason,
            message,
            generation,
        ));
    }
    GatewayStatus {
        addresses: assignment.map(|a| a.addresses),
        attached_listener_sets: None,
        conditions: Some(conditions),
        listeners: Some(listeners),
    }
}

/// Labels and annotations that cannot be propagated leave the Gateway Accepted (Gateway API
/// defines no condition for them, and traffic does not depend on them), but the Accepted
/// message names each one, so the omission is never silent.
fn with_propagation_problems(message: String, gw: &GatewayCtx) -> String {
    if gw.propagated.problems.is_empty() {
        return message;
    }
    format!(
        "{message}; not propagated to the data plane's objects: {}",
        gw.propagated.problems.join("; ")
    )
}

/// Accepted=True: the Gateway is served and, where Gatehouse provisions data planes, gets one.
pub fn accepted(status: &GatewayStatus) -> bool {
    status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == ACCEPTED && c.status == "True")
}

pub(crate) fn listener_status(
    l: &ListenerCtx,
    gateway_problem: Option<&str>,
    generation: Option<i64>,
) -> GatewayStatusListeners {
    let c = &l.conditions;
    let lost = l.lost_precedence();
    let lost_message = || {
        format!(
            "a listener with higher precedence (the Gateway's own, or of an older ListenerSet) \
             already uses port {} ({})",
            l.port,
            c.conflict.unwrap_or_default()
        )
    };
    let accepted = if let Some(reason) = lost {
        condition(ACCEPTED, false, reason, lost_message(), generation)
    } else if let Some(taken) = &c.taken_by {
        condition(ACCEPTED, false, PORT_UNAVAILABLE, taken.clone(), generation)
    } else if let Some(why) = &c.unsupported_protocol {
        condition(
            ACCEPTED,
            false,
            UNSUPPORTED_PROTOCOL,
            why.clone(),
            generation,
        )
    } else if let Some(why) = &c.unsupported_filters {
        condition(ACCEPTED, false, UNSUPPORTED_VALUE, why.clone(), generation)
    } else if let Some(TlsProblem {
        no_valid_ca: true,
        problem: (_, message),
    }) = &c.tls_problem
    {
        condition(
            ACCEPTED,
            false,
            NO_VALID_CA_CERTIFICATE,
            format!("client certificate validation has no usable CA certificate: {message}"),
            generation,
        )
    } else {
        condition(ACCEPTED, true, ACCEPTED, "Accepted", generation)
    };
    let conflicted = match c.conflict {
        Some(reason) if c.taken_by.is_some() => condition(
            CONFLICTED,
            true,
            reason,
            c.taken_by.clone().unwrap_or_default(),
            generation,
        ),
        Some(reason) => condition(
            CONFLICTED,
            true,
            reason,
            format!(
                "another listener on port {} conflicts with this one ({reason})",
                l.port
            ),
            generation,
        ),
        None => condition(CONFLICTED, false, NO_CONFLICTS, "No conflicts", generation),
    };
    let resolved = if let Some(TlsProblem {
        problem: (reason, message),
        ..
    }) = &c.tls_problem
    {
        condition(RESOLVED_REFS, false, reason, message.clone(), generation)
    } else if let Some((reason, message)) = &c.filter_ref {
        condition(
            RESOLVED_REFS,
            false,
            reason,
            format!("listener filter ExternalAuth: {message}; its requests are refused"),
            generation,
        )
    } else if c.invalid_kinds.is_empty() {
        condition(RESOLVED_REFS, true, RESOLVED_REFS, "Resolved", generation)
    } else {
        condition(
            RESOLVED_REFS,
            false,
            INVALID_ROUTE_KINDS,
            format!(
                "route kinds not supported on this listener: {}",
                c.invalid_kinds.join(", ")
            ),
            generation,
        )
    };
    // Programmed says why not with the first cause, so that it reads on its own.
    let not_programmed: Option<String> = if let Some(problem) = gateway_problem {
        Some(problem.to_string())
    } else if let Some(why) = c
        .unsupported_protocol
        .as_ref()
        .or(c.taken_by.as_ref())
        .or(c.unsupported_filters.as_ref())
    {
        Some(why.clone())
    } else if let Some(reason) = c.conflict {
        Some(format!(
            "conflicts with another listener of this Gateway on port {} ({reason})",
            l.port
        ))
    } else {
        c.tls_problem
            .as_ref()
            .map(|t| format!("TLS cannot be served: {}", t.problem.1))
    };
    let programmed = match (not_programmed, lost) {
        (_, Some(reason)) if gateway_problem.is_none() => {
            condition(PROGRAMMED, false, reason, lost_message(), generation)
        }
        (None, _) => condition(PROGRAMMED, true, PROGRAMMED, "Programmed", generation),
        (Some(why), _) => condition(PROGRAMMED, false, INVALID, why, generation),
    };
    let conditions: Vec<Condition> = vec![accepted, programmed, resolved, conflicted];
    GatewayStatusListeners {
        attached_routes: l.attached_routes,
        conditions,
        name: l.name.clone(),
        supported_kinds: Some(
            l.kinds
                .iter()
                .map(|(g, k)| GatewayStatusListenersSupportedKinds {
                    group: Some(g.clone()),
                    kind: k.clone(),
                })
                .collect(),
        ),
    }
}
