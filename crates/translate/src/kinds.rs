//! The registry: every kind Gatehouse reads, named once.
//!
//! Each line of [`registry!`] below gives a kind its field in [`Input`], the apiVersions read
//! from manifests, how the Kubernetes source watches it and whether it is a route kind. The file
//! source, the Kubernetes reflectors, the status writer, the status report and the tests all
//! walk this list ([`for_each_kind`], [`for_each_route_kind`]) instead of naming kinds
//! themselves, so a new route kind is one file (its [`RouteKind`](crate::RouteKind)
//! implementation) plus one line here.

use crate::generated::{
    gateways::Gateway, httproutes::HttpRoute, listenersets::ListenerSet, tcproutes::TcpRoute,
    udproutes::UdpRoute,
};
use crate::parameters::GatehouseParameters;
use crate::{ObjectKey, Status};
use gateway_api::apis::standard::{
    backendtlspolicies::BackendTlsPolicy, gatewayclasses::GatewayClass, grpcroutes::GrpcRoute,
    referencegrants::ReferenceGrant, tlsroutes::TlsRoute,
};
use k8s_openapi::api::certificates::v1beta1::ClusterTrustBundle;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::{ClusterResourceScope, NamespaceResourceScope};
use kube::Resource as _;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::{BTreeSet, HashMap};
use std::fmt::Debug;
use std::sync::Arc;

/// How the Kubernetes source keeps a kind in memory.
#[derive(Clone, Copy, Debug)]
pub enum Watch {
    /// Every object of the kind, cluster-wide. `required`: the kind must be listed before the
    /// first configuration is built (its CRD must exist); other kinds are waited for briefly
    /// and treated as empty while their CRD is missing.
    All { required: bool },
    /// Only the objects that other objects reference (Secrets, ConfigMaps): the function
    /// names them in a snapshot of the other kinds. Each is watched by name, so the controller
    /// never caches every Secret of the cluster.
    Referenced(fn(&Input) -> BTreeSet<ObjectKey>),
}

/// One segment of a field path inside an object (`spec.rules[0].matches[1]`), as serde names
/// the fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathSegment {
    Key(String),
    Index(usize),
}

/// A problem found in one object that a manifest check can point at (by field path) before
/// translating: e.g. a regular expression that does not compile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub path: Vec<PathSegment>,
    pub message: String,
    /// The offending value, when the path alone may not find its line (a value written in
    /// block style sits on a line of its own).
    pub value: Option<String>,
}

/// `spec.rules[0].matches`
pub fn display_path(path: &[PathSegment]) -> String {
    let mut s = String::new();
    for seg in path {
        match seg {
            PathSegment::Key(k) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(k);
            }
            PathSegment::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

/// Which part of an object's `status` Gatehouse writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusShape {
    /// None: Gatehouse only reads the kind.
    None,
    /// All of it (its own GatewayClasses and Gateways).
    Whole,
    /// `status.<field>` is a list shared with other controllers (route `parents`, policy
    /// `ancestors`): Gatehouse owns the entries that carry its `controllerName`.
    Shared(&'static str),
}

/// Code that needs to know at the type level whether a kind is namespaced: a Kubernetes API
/// client for one namespace only exists for namespaced kinds. [`KindScope::with_scope`] calls
/// the method that fits `K`.
pub trait ScopeVisitor<K: kube::Resource> {
    type Output;
    fn namespaced(self) -> Self::Output
    where
        K: kube::Resource<Scope = NamespaceResourceScope>;
    fn cluster(self) -> Self::Output
    where
        K: kube::Resource<Scope = ClusterResourceScope>;
}

/// The two scopes of the registry's kinds.
pub trait KindScope: Sized {
    fn with_scope<K: kube::Resource<Scope = Self>, V: ScopeVisitor<K>>(visitor: V) -> V::Output;
}

impl KindScope for NamespaceResourceScope {
    fn with_scope<K: kube::Resource<Scope = Self>, V: ScopeVisitor<K>>(visitor: V) -> V::Output {
        visitor.namespaced()
    }
}

impl KindScope for ClusterResourceScope {
    fn with_scope<K: kube::Resource<Scope = Self>, V: ScopeVisitor<K>>(visitor: V) -> V::Output {
        visitor.cluster()
    }
}

/// A kind of object Gatehouse reads. Implemented by the registry below, never by hand.
pub trait Kind:
    kube::Resource<DynamicType = (), Scope: KindScope>
    + Clone
    + Debug
    + PartialEq
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    /// The apiVersions accepted in manifests, newest first (the group is the Resource's).
    const VERSIONS: &'static [&'static str];
    const WATCH: Watch;
    const NAMESPACED: bool;
    const STATUS: StatusShape;
    /// Which route work a change of an object of this kind undoes ([`crate::Reuse`]).
    const READ_BY_ROUTE_WORK: ReadByRouteWork = ReadByRouteWork::All;

    fn of(input: &Input) -> &Vec<Arc<Self>>;
    fn of_mut(input: &mut Input) -> &mut Vec<Arc<Self>>;

    /// Problems a manifest check can name a line for (see [`Finding`]).
    fn findings(&self) -> Vec<Finding> {
        Vec::new()
    }

    /// Gatehouse's status for this object as written to it: all of `status` ([`StatusShape::Whole`])
    /// or Gatehouse's entries of the shared list ([`StatusShape::Shared`]). `None`: nothing of
    /// Gatehouse's (not ours, or a kind it only reads).
    fn computed_status(&self, _status: &Status) -> Option<serde_json::Value> {
        None
    }

    /// Adds the status this object carries now to `status`, so that conditions that did not
    /// change keep their lastTransitionTime ([`crate::stamp_status`]).
    fn carried_status(&self, _status: &mut Status) {}

    /// Copies this object's entry of `from` (a computed [`Status`]) into `to`, so that the
    /// status writer can stamp and compare one object without the others.
    fn copy_computed_status(&self, _from: &Status, _to: &mut Status) {}

    /// Whether this object's computed status is among `changed` ([`Status::changed_since`]).
    /// Allocation free: the status writer asks it for every object on every pass, to skip the
    /// objects whose status it already found written.
    fn computed_status_changed(&self, _changed: &crate::ChangedStatus<'_>) -> bool {
        false
    }

    /// The object's `status` as JSON, as the status writer compares it with what it would
    /// write (`Null` when there is none). Only the status is serialised: the whole object,
    /// managedFields and all, is many times larger, and this runs for every object with a
    /// status on every pass.
    fn status_json(&self) -> serde_json::Value {
        serde_json::Value::Null
    }

    /// Whether translate reads the same from `self` and `other`: the status Gatehouse writes
    /// (translate never reads it: a status is computed, not carried over) and the metadata
    /// every write changes (resourceVersion, managedFields) are left out. Kinds whose status
    /// someone else writes and translate may read (a Service's load balancer) compare whole.
    fn same_to_translate(&self, other: &Self) -> bool;

    /// `Kind` as manifests spell it (`HTTPRoute`).
    fn kind_name() -> String {
        Self::kind(&()).into_owned()
    }
}

/// Which route work a change of an object of a kind undoes: what [`crate::Reuse`] may keep
/// when the objects of the kind changed since the last pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadByRouteWork {
    /// Any route's work may read any of them (Gateways, ReferenceGrants, policies,
    /// Namespaces): a change undoes every route's work.
    All,
    /// A route's work reads one only through a backendRef that names it, by namespace and
    /// name (Services: nothing else in a route's work reads them). A change undoes the work of
    /// the routes whose backendRefs name a changed object, and keeps every other route's.
    Named,
    /// A route's work never reads them: the routes themselves (each route's work is kept for
    /// that route's own object) and EndpointSlices (they only fill a cluster, which every
    /// pass registers afresh from the current slices).
    None,
}

/// Something to do once per registered kind ([`for_each_kind`]).
pub trait KindVisitor {
    fn visit<K: Kind>(&mut self);
}

/// Something to do once per registered route kind ([`for_each_route_kind`]).
pub trait RouteKindVisitor {
    fn visit<R: crate::RouteKind>(&mut self);
}

macro_rules! registry {
    ($(
        $(#[$doc:meta])*
        $field:ident: $ty:ty, [$($version:literal),+], $watch:expr, $scope:ident, $role:ident;
    )+) => {
        /// Everything translate reads: one consistent snapshot of the store. Order does not
        /// matter: translate sorts what it reads, so the same objects always give the same
        /// output.
        #[derive(Clone, Debug, Default)]
        pub struct Input {
            $( $(#[$doc])* pub $field: Vec<Arc<$ty>>, )+
        }

        $(
            impl Kind for $ty {
                const VERSIONS: &'static [&'static str] = &[$($version),+];
                const WATCH: Watch = $watch;
                const NAMESPACED: bool = registry!(@namespaced $scope);
                fn of(input: &Input) -> &Vec<Arc<Self>> {
                    &input.$field
                }
                fn of_mut(input: &mut Input) -> &mut Vec<Arc<Self>> {
                    &mut input.$field
                }
                registry!(@role $role);
            }
        )+

        /// Calls `visitor.visit::<K>()` for every kind, in registry order.
        pub fn for_each_kind<V: KindVisitor>(visitor: &mut V) {
            $( visitor.visit::<$ty>(); )+
        }

        /// Calls `visitor.visit::<R>()` for every route kind, in registry order.
        pub fn for_each_route_kind<V: RouteKindVisitor>(visitor: &mut V) {
            $( registry!(@route $role, $ty, visitor); )+
        }
    };
    (@namespaced namespaced) => { true };
    (@namespaced cluster) => { false };
    (@role route) => {
        registry!(@written);
        const STATUS: StatusShape = StatusShape::Shared("parents");
        const READ_BY_ROUTE_WORK: ReadByRouteWork = ReadByRouteWork::None;
        fn findings(&self) -> Vec<Finding> {
            <Self as crate::RouteKind>::findings(self)
        }
        fn computed_status(&self, status: &Status) -> Option<serde_json::Value> {
            let key = crate::RouteKey::of::<Self>(ObjectKey::of(self.meta()));
            status.routes.get(&key).map(|s| json(&s.parents))
        }
        fn copy_computed_status(&self, from: &Status, to: &mut Status) {
            let key = crate::RouteKey::of::<Self>(ObjectKey::of(self.meta()));
            if let Some((key, s)) = from.routes.get_key_value(&key) {
                to.routes.insert(key.clone(), s.clone());
            }
        }
        fn computed_status_changed(&self, changed: &crate::ChangedStatus<'_>) -> bool {
            let (namespace, name) = crate::key_of(self.meta());
            changed.routes.contains(&(Self::kind(&()).as_ref(), namespace, name))
        }
        fn carried_status(&self, status: &mut Status) {
            if let Some(carried) = <Self as crate::RouteKind>::carried_status(self) {
                let key = crate::RouteKey::of::<Self>(ObjectKey::of(self.meta()));
                status
                    .routes
                    .insert(std::sync::Arc::new(key), std::sync::Arc::new(carried));
            }
        }
    };
    (@role class) => {
        registry!(@written);
        const STATUS: StatusShape = StatusShape::Whole;
        fn computed_status(&self, status: &Status) -> Option<serde_json::Value> {
            status.gateway_classes.get(&name(self.meta())).map(json)
        }
        fn copy_computed_status(&self, from: &Status, to: &mut Status) {
            let key = name(self.meta());
            if let Some(s) = from.gateway_classes.get(&key) {
                to.gateway_classes.insert(key, s.clone());
            }
        }
        fn computed_status_changed(&self, changed: &crate::ChangedStatus<'_>) -> bool {
            changed.gateway_classes.contains(crate::key_of(self.meta()).1)
        }
        fn carried_status(&self, status: &mut Status) {
            if let Some(s) = &self.status {
                status.gateway_classes.insert(name(self.meta()), s.clone());
            }
        }
    };
    (@role gateway) => {
        registry!(@written);
        const STATUS: StatusShape = StatusShape::Whole;
        fn computed_status(&self, status: &Status) -> Option<serde_json::Value> {
            status.gateways.get(&ObjectKey::of(self.meta())).map(json)
        }
        fn copy_computed_status(&self, from: &Status, to: &mut Status) {
            let key = ObjectKey::of(self.meta());
            if let Some(s) = from.gateways.get(&key) {
                to.gateways.insert(key, s.clone());
            }
        }
        fn computed_status_changed(&self, changed: &crate::ChangedStatus<'_>) -> bool {
            changed.gateways.contains(&crate::key_of(self.meta()))
        }
        fn carried_status(&self, status: &mut Status) {
            if let Some(s) = &self.status {
                status.gateways.insert(ObjectKey::of(self.meta()), s.clone());
            }
        }
    };
    (@role listener_set) => {
        registry!(@written);
        const STATUS: StatusShape = StatusShape::Whole;
        fn computed_status(&self, status: &Status) -> Option<serde_json::Value> {
            status.listener_sets.get(&ObjectKey::of(self.meta())).map(json)
        }
        fn copy_computed_status(&self, from: &Status, to: &mut Status) {
            let key = ObjectKey::of(self.meta());
            if let Some(s) = from.listener_sets.get(&key) {
                to.listener_sets.insert(key, s.clone());
            }
        }
        fn computed_status_changed(&self, changed: &crate::ChangedStatus<'_>) -> bool {
            changed.listener_sets.contains(&crate::key_of(self.meta()))
        }
        fn carried_status(&self, status: &mut Status) {
            if let Some(s) = &self.status {
                status.listener_sets.insert(ObjectKey::of(self.meta()), s.clone());
            }
        }
    };
    (@role policy) => {
        registry!(@written);
        const STATUS: StatusShape = StatusShape::Shared("ancestors");
        fn computed_status(&self, status: &Status) -> Option<serde_json::Value> {
            status
                .backend_tls_policies
                .get(&ObjectKey::of(self.meta()))
                .map(|s| json(&s.ancestors))
        }
        fn copy_computed_status(&self, from: &Status, to: &mut Status) {
            let key = ObjectKey::of(self.meta());
            if let Some(s) = from.backend_tls_policies.get(&key) {
                to.backend_tls_policies.insert(key, s.clone());
            }
        }
        fn computed_status_changed(&self, changed: &crate::ChangedStatus<'_>) -> bool {
            changed.backend_tls_policies.contains(&crate::key_of(self.meta()))
        }
        fn carried_status(&self, status: &mut Status) {
            if let Some(s) = &self.status {
                status
                    .backend_tls_policies
                    .insert(ObjectKey::of(self.meta()), s.clone());
            }
        }
    };
    // Kinds whose status Gatehouse writes: translate reads their spec and metadata only.
    (@written) => {
        fn status_json(&self) -> serde_json::Value {
            self.status.as_ref().map_or(serde_json::Value::Null, json)
        }
        fn same_to_translate(&self, other: &Self) -> bool {
            self.spec == other.spec && same_meta(self.meta(), other.meta())
        }
    };
    // Read only to fill clusters: see `ReadByRouteWork::None`.
    (@role endpoints) => {
        registry!(@role object);
        const READ_BY_ROUTE_WORK: ReadByRouteWork = ReadByRouteWork::None;
    };
    // Read by a route's work only where a backendRef names it: see `ReadByRouteWork::Named`.
    (@role backend) => {
        registry!(@role object);
        const READ_BY_ROUTE_WORK: ReadByRouteWork = ReadByRouteWork::Named;
    };
    (@role object) => {
        const STATUS: StatusShape = StatusShape::None;
        // Gatehouse writes nothing to these, so a new resourceVersion is a change of
        // someone else's; a relist that brings the same version back compares equal.
        fn same_to_translate(&self, other: &Self) -> bool {
            self == other
        }
    };
    (@route route, $ty:ty, $visitor:ident) => { $visitor.visit::<$ty>() };
    (@route $other:ident, $ty:ty, $visitor:ident) => {};
}

/// Metadata as translate reads it: all of it but resourceVersion and managedFields, which
/// change with every write (our own status writes among them). Destructured, so that a field
/// a newer k8s-openapi adds must be placed here before this compiles.
fn same_meta(
    a: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    b: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> bool {
    let k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        annotations,
        creation_timestamp,
        deletion_grace_period_seconds,
        deletion_timestamp,
        finalizers,
        generate_name,
        generation,
        labels,
        managed_fields: _,
        name,
        namespace,
        owner_references,
        resource_version: _,
        self_link,
        uid,
    } = a;
    *annotations == b.annotations
        && *creation_timestamp == b.creation_timestamp
        && *deletion_grace_period_seconds == b.deletion_grace_period_seconds
        && *deletion_timestamp == b.deletion_timestamp
        && *finalizers == b.finalizers
        && *generate_name == b.generate_name
        && *generation == b.generation
        && *labels == b.labels
        && *name == b.name
        && *namespace == b.namespace
        && *owner_references == b.owner_references
        && *self_link == b.self_link
        && *uid == b.uid
}

fn name(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

/// Status goes to the API as JSON; Gatehouse's status types always serialise.
fn json<T: Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).unwrap_or_default()
}

const REQUIRED: Watch = Watch::All { required: true };
const OPTIONAL: Watch = Watch::All { required: false };

registry! {
    gateway_classes: GatewayClass, ["v1", "v1beta1"], REQUIRED, cluster, class;
    gateways: Gateway, ["v1", "v1beta1"], REQUIRED, namespaced, gateway;
    /// More listeners for a Gateway that allows them (spec.allowedListeners). Optional: a
    /// cluster with Gateway API before v1.5 has no such CRD.
    listener_sets: ListenerSet, ["v1"], OPTIONAL, namespaced, listener_set;
    http_routes: HttpRoute, ["v1", "v1beta1"], REQUIRED, namespaced, route;
    /// After HTTPRoute: listeners list their default kinds in this order.
    grpc_routes: GrpcRoute, ["v1"], OPTIONAL, namespaced, route;
    tls_routes: TlsRoute, ["v1", "v1alpha3", "v1alpha2"], OPTIONAL, namespaced, route;
    /// v1 since Gateway API v1.5 (kopium types from the v1.7.0 CRD; v1alpha2 has the same
    /// fields and is still read from files).
    tcp_routes: TcpRoute, ["v1", "v1alpha2"], OPTIONAL, namespaced, route;
    udp_routes: UdpRoute, ["v1", "v1alpha2"], OPTIONAL, namespaced, route;
    reference_grants: ReferenceGrant, ["v1", "v1beta1"], OPTIONAL, namespaced, object;
    backend_tls_policies: BackendTlsPolicy, ["v1", "v1alpha3"], OPTIONAL, namespaced, policy;
    services: Service, ["v1"], REQUIRED, namespaced, backend;
    endpoint_slices: EndpointSlice, ["v1"], REQUIRED, namespaced, endpoints;
    namespaces: Namespace, ["v1"], REQUIRED, cluster, object;
    /// Only the Secrets that Gateways reference need to be here (certificates).
    secrets: Secret, ["v1"], Watch::Referenced(crate::refs::referenced_secrets), namespaced, object;
    /// Only the ConfigMaps that Gateways and policies reference need to be here (CA bundles).
    config_maps: ConfigMap, ["v1"], Watch::Referenced(crate::refs::referenced_config_maps), namespaced, object;
    /// CA bundles by name (certificates.k8s.io/v1beta1, Kubernetes 1.33 and later with the
    /// ClusterTrustBundle API enabled). Watched only when referenced, so a cluster without
    /// the API costs nothing until a policy or Gateway names one.
    cluster_trust_bundles: ClusterTrustBundle, ["v1beta1"], Watch::Referenced(crate::refs::referenced_cluster_trust_bundles), cluster, object;
    /// Gatehouse's own parameters kind (GatewayClass and Gateway parametersRefs). Watched
    /// whole: there are few, and a Gateway that names one must find it in its first snapshot.
    gatehouse_parameters: GatehouseParameters, ["v1alpha1"], OPTIONAL, namespaced, object;
}

impl Input {
    /// Adds one object of any registered kind.
    pub fn push<K: Kind>(&mut self, object: K) {
        K::of_mut(self).push(Arc::new(object));
    }

    /// Adds one object that a source keeps too (its cache or watch store): the snapshot
    /// shares it instead of holding a copy.
    pub fn push_shared<K: Kind>(&mut self, object: Arc<K>) {
        K::of_mut(self).push(object);
    }

    /// Whether translate reads the same from `self` and `other` (see
    /// [`Kind::same_to_translate`]): the same objects of every kind, in any order, differing at
    /// most in the status Gatehouse writes and the resourceVersions those writes bumped. Then
    /// `translate` gives the same output for both, and a pass may reuse the last one. Cheap
    /// when little changed: objects a store did not replace are the same `Arc`, and only the
    /// others are compared field by field.
    pub fn same_to_translate(&self, other: &Input) -> bool {
        struct Visit<'i> {
            a: &'i Input,
            b: &'i Input,
            same: bool,
        }
        impl KindVisitor for Visit<'_> {
            fn visit<K: Kind>(&mut self) {
                self.same = self.same && same_objects(K::of(self.a), K::of(self.b));
            }
        }
        let mut visit = Visit {
            a: self,
            b: other,
            same: true,
        };
        for_each_kind(&mut visit);
        visit.same
    }
}

/// Two lists of one kind hold the same objects as translate reads them, in any order.
pub(crate) fn same_objects<K: Kind>(a: &[Arc<K>], b: &[Arc<K>]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    // A store that replaced an object keeps its place: position by position first (the
    // comparison includes name and namespace).
    let in_place = a
        .iter()
        .zip(b)
        .all(|(x, y)| Arc::ptr_eq(x, y) || x.same_to_translate(y));
    if in_place {
        return true;
    }
    // Another order: by namespace and name. A list with one key twice is never the same (a
    // store cannot hold that; a folder of files may, and then translate decides).
    let (Some(a), Some(b)) = (by_key(a), by_key(b)) else {
        return false;
    };
    a.iter().all(|(key, x)| {
        b.get(key)
            .is_some_and(|y| std::ptr::eq(*x, *y) || x.same_to_translate(y))
    })
}

/// The objects by namespace and name; `None` when a key is there twice.
pub(crate) fn by_key<K: Kind>(list: &[Arc<K>]) -> Option<HashMap<(&str, &str), &K>> {
    let map: HashMap<_, _> = list
        .iter()
        .map(|o| (crate::key_of(o.meta()), &**o))
        .collect();
    (map.len() == list.len()).then_some(map)
}
