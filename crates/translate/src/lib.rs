//! Gateway API objects to IR and status, as a pure function.
//!
//! All Gateway API semantics live here and nowhere else: which objects are ours, listener
//! validity and conflicts, route attachment and hostname intersection, ReferenceGrant, route
//! precedence, redirect defaults, and every status condition with the spec's reasons. The same
//! [`Input`] always gives the same [`Output`], whatever order the objects arrive in.

mod assemble;
mod backends;
mod certificates;
pub mod conditions;
mod gateway_addresses;
mod gateways;
pub mod generated;
pub mod hostname;
pub mod infrastructure;
pub mod kinds;
mod listener_sets;
mod listener_tls;
mod names;
mod objects;
pub mod parameters;
mod policies;
mod precedence;
mod refs;
mod reuse;
pub mod routes;
pub mod serving;

pub use conditions::{stamp_status, stamp_status_since};
pub use infrastructure::Infrastructure;
pub use kinds::{Input, Kind};
pub use listener_tls::{FrontendValidation, frontend_validations};
pub use objects::{GATEWAY_GROUP, ObjectKey, key_of};
pub use parameters::{GatehouseParameters, ResolvedParameters};
pub use reuse::{Reuse, Reused};
pub use routes::{ParentRef, RouteKey, RouteKind, RouteParentStatus, RouteStatus};

use crate::generated::{gateways::GatewayStatus, listenersets::ListenerSetStatus};
use gatehouse_ir as ir;
use gateway_api::apis::standard::{
    backendtlspolicies::BackendTlsPolicyStatus, gatewayclasses::GatewayClassStatus,
};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

/// The controllerName Gatehouse answers to.
pub const CONTROLLER_NAME: &str = "gatehouse.dev/gateway-controller";

/// Features listed in GatewayClass status.supportedFeatures: only what passes the official
/// conformance suite here (`make conformance`; conformance/reports/). The suite reads this list
/// to decide what to test, so a feature that is listed but broken fails the run. A feature
/// the suite names but has no test for yet (ClusterTrustBundle, GatewayListenerFilters in
/// v1.7.0) is listed once
/// Gatehouse's own tests cover it: translate fixtures and the controller test against a real
/// API server (docs/architecture.md, "Features without conformance tests").
pub const SUPPORTED_FEATURES: &[&str] = &[
    "BackendTLSPolicy",
    "BackendTLSPolicySANValidation",
    "ClusterTrustBundle",
    "Gateway",
    "GatewayAddressEmpty",
    "GatewayBackendClientCertificate",
    "GatewayFrontendClientCertificateValidation",
    "GatewayFrontendClientCertificateValidationInsecureFallback",
    "GatewayHTTPListenerIsolation",
    "GatewayListenerFilters",
    "GatewayHTTPSListenerDetectMisdirectedRequests",
    "GatewayPort8080",
    "GatewayRouteHostnameIntersectionPrecedence",
    "GRPCRoute",
    "GRPCRouteNamedRouteRule",
    "GRPCRouteRequestHeaderModifier",
    "HTTPRoute",
    "HTTPRoute303RedirectStatusCode",
    "HTTPRoute307RedirectStatusCode",
    "HTTPRoute308RedirectStatusCode",
    "HTTPRouteBackendProtocolH2C",
    "HTTPRouteBackendProtocolWebSocket",
    "HTTPRouteBackendRequestHeaderModification",
    "HTTPRouteBackendTimeout",
    "HTTPRouteBackendURLRewrite",
    "HTTPRouteCORS",
    "HTTPRouteDestinationPortMatching",
    "HTTPRouteHostRewrite",
    "HTTPRouteMethodMatching",
    "HTTPRouteNamedRouteRule",
    "HTTPRouteParentRefPort",
    "HTTPRoutePathRedirect",
    "HTTPRoutePathRewrite",
    "HTTPRoutePortRedirect",
    "HTTPRouteQueryParamMatching",
    "HTTPRouteRequestMirror",
    "HTTPRouteRequestMultipleMirrors",
    "HTTPRouteRequestPercentageMirror",
    "HTTPRouteRequestTimeout",
    "HTTPRouteResponseHeaderModification",
    "HTTPRouteRetryCodes",
    "HTTPRouteRetryConnectionError",
    "HTTPRouteSchemeRedirect",
    "ListenerSet",
    "ReferenceGrant",
    "TCPRoute",
    "TLSRoute",
    "TLSRouteModeMixed",
    "TLSRouteModeTerminate",
    "UDPRoute",
];

/// Gateway API's name for `spec.infrastructure` support (labels and annotations on the
/// generated objects, per-Gateway parametersRef); v1.7.0's conformance suite calls it this
/// (earlier releases: GatewayInfrastructurePropagation).
pub const FEATURE_GATEWAY_INFRASTRUCTURE: &str = "GatewayInfrastructure";

/// Gateway API's name for serving a Gateway on the addresses its spec.addresses asks for.
pub const FEATURE_GATEWAY_STATIC_ADDRESSES: &str = "GatewayStaticAddresses";

/// Gateway API's names for spec.addresses[].routability (GEP-5093): honoured or refused,
/// reported per address in status, and `Cluster` given as a Service cluster IP. The v1.7.0
/// suite has no tests for them; the translate fixtures `gateway-address-routability*` and the
/// provisioned test against a real API server cover them.
pub const FEATURE_GATEWAY_ADDRESS_ROUTABILITY: &str = "GatewayAddressRoutability";
pub const FEATURE_GATEWAY_ADDRESS_ROUTABILITY_CLUSTER: &str = "GatewayAddressRoutabilityCluster";

/// Features only a controller that provisions data planes has ([`Options::provisioned`]):
/// there are generated objects to carry the infrastructure labels and annotations, a
/// LoadBalancer Service to ask for a static address, and a Service of the Gateway's own whose
/// cluster IP routability `Cluster` asks for. Without provisioning (one shared data plane,
/// addresses assigned from outside) none holds, so the class does not claim them.
pub const PROVISIONED_FEATURES: &[&str] = &[
    FEATURE_GATEWAY_ADDRESS_ROUTABILITY,
    FEATURE_GATEWAY_ADDRESS_ROUTABILITY_CLUSTER,
    FEATURE_GATEWAY_INFRASTRUCTURE,
    FEATURE_GATEWAY_STATIC_ADDRESSES,
];

/// The class's supportedFeatures: [`SUPPORTED_FEATURES`], plus [`PROVISIONED_FEATURES`] when
/// provisioning, sorted as Gateway API asks.
pub fn supported_features(provisioned: bool) -> Vec<&'static str> {
    let mut all: Vec<&'static str> = SUPPORTED_FEATURES.to_vec();
    if provisioned {
        all.extend_from_slice(PROVISIONED_FEATURES);
        // The order of SUPPORTED_FEATURES: alphabetical, ignoring case.
        all.sort_by_key(|f| f.to_ascii_lowercase());
    }
    all
}

#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    pub controller_name: String,
    /// Address for Gateways that request none.
    pub default_address: IpAddr,
    /// Addresses assigned from outside (e.g. one loopback address per Gateway); they win over
    /// the Gateway's own spec.addresses.
    pub gateway_addresses: BTreeMap<ObjectKey, IpAddr>,
    /// What status.addresses reports when it differs from where the data plane binds (in a
    /// cluster: the data-plane Service's load-balancer ingress or cluster IP).
    pub published_addresses: Option<Vec<PublishedAddress>>,
    /// Per Gateway, its own provisioned Service's addresses; wins over `published_addresses`.
    pub gateway_published_addresses: BTreeMap<ObjectKey, ServiceAddresses>,
    /// Every Gateway gets a data plane of its own (Deployment, Service, ServiceAccount): the
    /// class claims [`PROVISIONED_FEATURES`] too.
    pub provisioned: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            controller_name: CONTROLLER_NAME.to_string(),
            default_address: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            gateway_addresses: BTreeMap::new(),
            published_addresses: None,
            gateway_published_addresses: BTreeMap::new(),
            provisioned: false,
        }
    }
}

/// An address clients reach a data plane at, as status.addresses reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishedAddress {
    /// `IPAddress` or `Hostname`.
    pub type_: String,
    pub value: String,
    /// `Some("Cluster")` for a Service's cluster IP: reachable only from inside the cluster,
    /// and status says so (GEP-5093).
    pub routability: Option<String>,
}

/// A provisioned Gateway's Service's addresses, by what a `spec.addresses` entry can ask for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceAddresses {
    /// What a Gateway that asks for no routability reports: a LoadBalancer's ingress (empty
    /// while the load balancer is still assigning one), else the cluster IPs.
    pub default: Vec<PublishedAddress>,
    /// The cluster IPs: what routability `Cluster` is satisfied by.
    pub cluster: Vec<PublishedAddress>,
}

/// The objects whose status changed between two [`Status`]es ([`Status::changed_since`]),
/// by borrowed keys: looked up without building an owned key per object.
#[derive(Debug, Default)]
pub struct ChangedStatus<'a> {
    pub gateway_classes: std::collections::HashSet<&'a str>,
    /// (namespace, name)
    pub gateways: std::collections::HashSet<(&'a str, &'a str)>,
    pub listener_sets: std::collections::HashSet<(&'a str, &'a str)>,
    /// (kind, namespace, name)
    pub routes: std::collections::HashSet<(&'a str, &'a str, &'a str)>,
    pub backend_tls_policies: std::collections::HashSet<(&'a str, &'a str)>,
}

/// Status of every object Gatehouse is responsible for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Status {
    pub gateway_classes: BTreeMap<String, GatewayClassStatus>,
    pub gateways: BTreeMap<ObjectKey, GatewayStatus>,
    /// ListenerSets whose parentRef names one of our Gateways.
    pub listener_sets: BTreeMap<ObjectKey, ListenerSetStatus>,
    /// Routes of every kind. Shared: a route whose translation is reused from the last pass
    /// (`Reuse`) has the same status, and stamping keeps the last pass's where nothing changed.
    pub routes: BTreeMap<Arc<RouteKey>, Arc<RouteStatus>>,
    pub backend_tls_policies: BTreeMap<ObjectKey, BackendTlsPolicyStatus>,
}

impl Status {
    /// The status of the route of kind `R` named `key`, if it is ours.
    pub fn route<R: RouteKind>(&self, key: &ObjectKey) -> Option<&RouteStatus> {
        self.routes
            .get(&RouteKey::of::<R>(key.clone()))
            .map(|s| &**s)
    }

    /// The objects whose status differs between `self` and `previous` (or is in one of them
    /// only), found by walking each map of both in key order: linear, comparing neighbours,
    /// with no lookup per object. The status writer asks [`Kind::computed_status_changed`]
    /// of every object on every pass, and a new route changes two entries of thousands.
    pub fn changed_since<'a>(&'a self, previous: &'a Status) -> ChangedStatus<'a> {
        fn walk<'a, K: Ord, V, T>(
            now: &'a BTreeMap<K, V>,
            before: &'a BTreeMap<K, V>,
            key: impl Fn(&'a K) -> T,
            same: impl Fn(&V, &V) -> bool,
            out: &mut std::collections::HashSet<T>,
        ) where
            T: std::hash::Hash + Eq,
        {
            let (mut a, mut b) = (now.iter().peekable(), before.iter().peekable());
            loop {
                match (a.peek(), b.peek()) {
                    (None, None) => break,
                    (Some((k, _)), None) => {
                        out.insert(key(k));
                        a.next();
                    }
                    (None, Some((k, _))) => {
                        out.insert(key(k));
                        b.next();
                    }
                    (Some((ka, va)), Some((kb, vb))) => match ka.cmp(kb) {
                        std::cmp::Ordering::Less => {
                            out.insert(key(ka));
                            a.next();
                        }
                        std::cmp::Ordering::Greater => {
                            out.insert(key(kb));
                            b.next();
                        }
                        std::cmp::Ordering::Equal => {
                            if !same(va, vb) {
                                out.insert(key(ka));
                            }
                            a.next();
                            b.next();
                        }
                    },
                }
            }
        }
        let mut changed = ChangedStatus::default();
        let by_key = |k: &'a ObjectKey| (k.namespace.as_str(), k.name.as_str());
        walk(
            &self.gateway_classes,
            &previous.gateway_classes,
            |k: &'a String| k.as_str(),
            |a, b| a == b,
            &mut changed.gateway_classes,
        );
        walk(
            &self.gateways,
            &previous.gateways,
            by_key,
            |a, b| a == b,
            &mut changed.gateways,
        );
        walk(
            &self.listener_sets,
            &previous.listener_sets,
            by_key,
            |a, b| a == b,
            &mut changed.listener_sets,
        );
        walk(
            &self.routes,
            &previous.routes,
            |k: &'a Arc<RouteKey>| {
                (
                    k.kind.as_str(),
                    k.key.namespace.as_str(),
                    k.key.name.as_str(),
                )
            },
            // Shared statuses (a route whose translation was reused) are the same by
            // pointer, without comparing thousands of them field by field.
            |a, b| Arc::ptr_eq(a, b) || a == b,
            &mut changed.routes,
        );
        walk(
            &self.backend_tls_policies,
            &previous.backend_tls_policies,
            by_key,
            |a, b| a == b,
            &mut changed.backend_tls_policies,
        );
        changed
    }

    /// The routes of kind `R` that have a status.
    pub fn routes_of<R: RouteKind>(&self) -> impl Iterator<Item = (&ObjectKey, &RouteStatus)> {
        let kind = R::kind_name();
        self.routes
            .iter()
            .filter(move |(k, _)| k.kind == kind)
            .map(|(k, s)| (&k.key, &**s))
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Output {
    pub config: ir::Config,
    pub status: Status,
    /// Every Accepted Gateway of ours, and what its provisioned data plane needs. Computed in
    /// every mode; only a controller that provisions data planes uses it.
    pub infrastructure: BTreeMap<ObjectKey, Infrastructure>,
}

/// Objects to IR and status, in named steps: which classes and Gateways are ours (listeners,
/// addresses, TLS), which routes attach where (every kind through one path), the IR assembled
/// per listener, then the status of everything.
pub fn translate(input: &Input, options: &Options) -> Output {
    translate_reusing(input, options, &mut Reuse::default())
}

/// [`translate`], taking each route's work from `reuse` where the last pass's still holds
/// (see [`Reuse`]), and leaving this pass's there for the next. The output is the same as
/// [`translate`]'s: only the time differs.
pub fn translate_reusing(input: &Input, options: &Options, reuse: &mut Reuse) -> Output {
    let output = translate_with(input, options, reuse.begin(input, options));
    reuse.end(input, options);
    output
}

fn translate_with(input: &Input, options: &Options, memo: &mut reuse::RouteMemo) -> Output {
    let parameters = parameters::index(&input.gatehouse_parameters);
    let (class_status, our_classes) = gateways::classes(
        &input.gateway_classes,
        &options.controller_name,
        &parameters,
        options.provisioned,
    );
    let refs = refs::Refs::new(input);
    let mut certificates: BTreeMap<String, ir::Certificate> = BTreeMap::new();
    let namespace_labels = namespace_labels(input);
    let mut gws = gateways::gateways(
        &input.gateways,
        &our_classes,
        &parameters,
        options,
        &gateways::GatewayInputs {
            listener_sets: &input.listener_sets,
            namespace_labels: &namespace_labels,
            refs: &refs,
        },
        &mut certificates,
    );
    let mut backends = backends::Backends::new(
        &input.services,
        &input.endpoint_slices,
        &input.backend_tls_policies,
        &refs,
    );
    gateways::resolve_filters(&mut gws, &mut backends);
    let attached = routes::attach_all(
        input,
        &mut routes::AttachCtx {
            gateways: &mut gws,
            backends: &mut backends,
            namespace_labels: &namespace_labels,
            controller: &options.controller_name,
            reuse: memo,
        },
    );
    let assembled = assemble::gateways(
        &gws,
        &attached.attachments,
        std::mem::take(&mut backends.clusters),
    );
    let certificates = used_certificates(certificates, &assembled);
    let policy_status = policies::policy_status(
        &backends.policy_outcomes,
        &assembled.cluster_users,
        &input.backend_tls_policies,
        &options.controller_name,
    );
    let mut gateway_status: BTreeMap<ObjectKey, _> = gws
        .iter()
        .map(|g| {
            (
                g.key.clone(),
                gateways::status(
                    g,
                    options
                        .gateway_published_addresses
                        .get(&g.key)
                        .map(|a| (a.default.as_slice(), a.cluster.as_slice()))
                        .or(options.published_addresses.as_deref().map(|a| (a, &[][..]))),
                ),
            )
        })
        .collect();
    let listener_set_status = listener_set_status(&gws, &mut gateway_status);
    // Decided by the Accepted condition itself, so a Gateway has a data plane exactly when its
    // status says it is accepted.
    let infrastructure = gws
        .iter()
        .filter(|g| gateway_status.get(&g.key).is_some_and(gateways::accepted))
        .filter_map(|g| {
            Some((
                g.key.clone(),
                Infrastructure {
                    gateway_class_name: g.object.spec.gateway_class_name.clone(),
                    labels: g.propagated.labels.clone(),
                    annotations: g.propagated.annotations.clone(),
                    parameters: g.parameters.clone()?,
                    requested_addresses: infrastructure::requested_addresses(g.object),
                    ports: infrastructure::ports(&g.listeners),
                },
            ))
        })
        .collect();
    let cluster_users = assembled.cluster_users;
    Output {
        config: ir::Config {
            gateways: assembled.gateways,
            clusters: assembled
                .clusters
                .into_values()
                .filter(|c| cluster_users.contains_key(&c.name))
                .collect(),
            certificates,
        },
        status: Status {
            gateway_classes: class_status,
            gateways: gateway_status,
            listener_sets: listener_set_status,
            routes: attached.status,
            backend_tls_policies: policy_status,
        },
        infrastructure,
    }
}

/// The status of every ListenerSet that names one of our Gateways, and each Gateway's
/// attachedListenerSets (the accepted ones; left unset on Gateways no ListenerSet names, so
/// their status reads as before ListenerSets existed).
fn listener_set_status(
    gws: &[gateways::GatewayCtx],
    gateway_status: &mut BTreeMap<ObjectKey, GatewayStatus>,
) -> BTreeMap<ObjectKey, ListenerSetStatus> {
    let mut out = BTreeMap::new();
    for g in gws {
        let Some(gw_status) = gateway_status.get_mut(&g.key) else {
            continue;
        };
        let gateway_accepted = gateways::accepted(gw_status);
        let mut attached = 0;
        for (i, set) in g.listener_sets.iter().enumerate() {
            let status = listener_sets::status(g, i, gateway_accepted);
            if listener_sets::accepted(&status) {
                attached += 1;
            }
            out.insert(set.key.clone(), status);
        }
        if !g.listener_sets.is_empty() {
            gw_status.attached_listener_sets = Some(attached);
        }
    }
    out
}

fn namespace_labels(input: &Input) -> BTreeMap<String, BTreeMap<String, String>> {
    input
        .namespaces
        .iter()
        .map(|n| {
            (
                n.metadata.name.clone().unwrap_or_default(),
                n.metadata.labels.clone().unwrap_or_default(),
            )
        })
        .collect()
}

/// Certificates only some Gateway's listener or backend TLS uses reach the data plane.
fn used_certificates(
    certificates: BTreeMap<String, ir::Certificate>,
    assembled: &assemble::Assembled,
) -> Vec<ir::Certificate> {
    let used: std::collections::BTreeSet<&String> = assembled
        .gateways
        .iter()
        .flat_map(|g| &g.listeners)
        .filter_map(|l| l.tls.as_ref())
        .flat_map(|t| &t.certificates)
        .chain(
            assembled
                .clusters
                .values()
                .filter_map(|c| c.tls.as_ref())
                .filter_map(|t| t.client_certificate.as_ref()),
        )
        .collect();
    certificates
        .into_values()
        .filter(|c| used.contains(&c.name))
        .collect()
}
