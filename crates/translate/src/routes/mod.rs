//! Routes of every kind: one attachment path and one status shape.
//!
//! A route kind ([`RouteKind`]) says what its parentRefs and hostnames are and turns its rules
//! into [`RouteRule`]s. Everything else is shared and lives here: whether the route is ours at
//! all, which listeners its parentRefs select and allow it, the hostnames it serves there,
//! backendRef resolution (through [`RuleCtx`]), and the Accepted, ResolvedRefs and
//! PartiallyInvalid conditions of every parent.

pub mod grpc;
pub mod http;
mod kind_conflicts;
mod l4;
pub mod tcp;
pub mod tls;
pub mod udp;

use crate::backends::{BackendRef, Backends, RefProblem};
use crate::conditions::{condition, names::*};
use crate::gateways::GatewayCtx;
use crate::hostname::{self, Origin};
use crate::kinds::{Finding, Kind};
use crate::objects::{GATEWAY_GROUP, ObjectKey, age_key, namespace};
use crate::refs::Referrer;
use gatehouse_ir as ir;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A route kind: HTTPRoute, TLSRoute, and whatever comes next. Implement it in one file and add
/// the kind to the registry (`kinds.rs`); attachment, backend resolution and status come with it.
pub trait RouteKind: Kind {
    /// Listener protocols that take this kind when `allowedRoutes.kinds` is not set.
    const PROTOCOLS: &'static [&'static str];
    /// Its HTTP backends are spoken to over HTTP/2 whatever their Service port's appProtocol
    /// (GRPCRoute: gRPC has no HTTP/1.1 mapping); [`RuleCtx::backend`] resolves accordingly.
    const HTTP2_BACKENDS: bool = false;

    fn parent_refs(&self) -> Vec<ParentRef>;
    fn hostnames(&self) -> &[String];
    /// One entry per rule of the spec, in order: the rule as the data plane serves it, or why
    /// it cannot be served as written (the rule is then dropped: PartiallyInvalid). Backend
    /// problems do not drop a rule; [`RuleCtx::backend`] records them for ResolvedRefs.
    fn rules(&self, ctx: &mut RuleCtx<'_, '_>) -> Vec<Result<RouteRule, String>>;
    /// The status the route carries now (every controller's entries).
    fn carried_status(&self) -> Option<RouteStatus>;
    /// Problems a manifest check can point at by field path (see [`Finding`]).
    fn findings(&self) -> Vec<Finding> {
        Vec::new()
    }
}

/// A translated rule, by the listener protocol that serves it.
#[derive(Clone, Debug)]
pub enum RouteRule {
    /// HTTP and HTTPS listeners: matches, filters and backends (redirect defaults still to be
    /// resolved per listener).
    Http(http::RuleTemplate),
    /// TLS listeners: the stream goes to one of these backends.
    Tls {
        route: ir::RouteRef,
        backends: Vec<ir::WeightedBackend>,
    },
    /// TCP and UDP listeners: each connection or client session goes to one of these backends.
    L4 {
        route: ir::RouteRef,
        backends: Vec<ir::WeightedBackend>,
    },
}

/// A parentRef as every route kind spells it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
}

/// `ParentRef` from a generated parentRef type: every route kind's has the same fields.
macro_rules! parent_ref_from {
    ($($ty:ty),+) => {$(
        impl From<&$ty> for ParentRef {
            fn from(r: &$ty) -> Self {
                ParentRef {
                    group: r.group.clone(),
                    kind: r.kind.clone(),
                    name: r.name.clone(),
                    namespace: r.namespace.clone(),
                    port: r.port,
                    section_name: r.section_name.clone(),
                }
            }
        }
    )+};
}
pub(crate) use parent_ref_from;

/// `RouteStatus` from a generated route status type (its parentRef type must have
/// [`parent_ref_from`]).
macro_rules! route_status_from {
    ($($ty:ty),+) => {$(
        impl From<&$ty> for $crate::routes::RouteStatus {
            fn from(s: &$ty) -> Self {
                $crate::routes::RouteStatus {
                    parents: s
                        .parents
                        .iter()
                        .map(|p| $crate::routes::RouteParentStatus {
                            parent_ref: (&p.parent_ref).into(),
                            controller_name: p.controller_name.clone(),
                            conditions: p.conditions.clone(),
                        })
                        .collect(),
                }
            }
        }
    )+};
}
pub(crate) use route_status_from;

/// What a route kind's status says (every kind has this shape): one entry per parentRef that
/// names one of our Gateways.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RouteStatus {
    pub parents: Vec<RouteParentStatus>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteParentStatus {
    pub parent_ref: ParentRef,
    pub controller_name: String,
    pub conditions: Vec<Condition>,
}

/// A route of some kind, by kind and namespace/name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RouteKey {
    pub kind: String,
    pub key: ObjectKey,
}

impl RouteKey {
    pub fn of<R: Kind>(key: ObjectKey) -> Self {
        RouteKey {
            kind: R::kind_name(),
            key,
        }
    }
}

/// A route's place in precedence, made once per pass and shared (behind an [`Age`]) by its
/// attachments and their match candidates, which sort thousands of times by it: older first,
/// then by namespace/name, as the spec asks. It carries the route's key, so an attachment
/// needs no copy of its own.
#[derive(Debug)]
pub struct RouteAge {
    /// The creation time; objects without one count as oldest.
    pub created: k8s_openapi::jiff::Timestamp,
    /// The key's first bytes ([`sort_prefix`]): compared before the key itself, it decides
    /// nearly every comparison without reaching the key's strings, which are cold by the time
    /// a pass sorts thousands of routes (a tenth of translating 5000 was those comparisons).
    prefix: Option<[u8; 16]>,
    /// Shared with the route's entry in the pass's status: a pass keys thousands of them.
    pub key: Arc<RouteKey>,
}

impl RouteAge {
    fn of<R: Kind>(route: &R) -> Self {
        let (created, key) = age_key(route.meta());
        RouteAge {
            created,
            prefix: sort_prefix(&key),
            key: Arc::new(RouteKey::of::<R>(key)),
        }
    }
}

/// The first 16 bytes of namespace, a NUL and name, padded with NULs. Where two differ they
/// order as (namespace, name) does: a NUL sorts below every other byte, so a namespace that is
/// a prefix of another sorts first, as it does on its own. `None` for a key that holds a NUL
/// itself (no Kubernetes name does): it is compared by its strings.
fn sort_prefix(key: &ObjectKey) -> Option<[u8; 16]> {
    if key.namespace.contains('\0') || key.name.contains('\0') {
        return None;
    }
    let mut prefix = [0; 16];
    let bytes = key.namespace.bytes().chain([0]).chain(key.name.bytes());
    for (slot, b) in prefix.iter_mut().zip(bytes) {
        *slot = b;
    }
    Some(prefix)
}

/// Precedence looks at the time and namespace/name only: two routes of different kinds with
/// one name and one creation time are equal here, and keep the order they were visited in.
impl Ord for RouteAge {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        let by_prefix = match (&self.prefix, &other.prefix) {
            (Some(a), Some(b)) => a.cmp(b),
            _ => std::cmp::Ordering::Equal,
        };
        self.created
            .cmp(&other.created)
            .then(by_prefix)
            .then_with(|| self.key.key.cmp(&other.key.key))
    }
}

impl PartialOrd for RouteAge {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for RouteAge {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for RouteAge {}

/// A route's [`RouteAge`], shared.
pub type Age = Arc<RouteAge>;

/// What a rule's translation may ask of the shared machinery.
pub struct RuleCtx<'b, 'a> {
    backends: &'b mut Backends<'a>,
    referrer: Referrer<'b>,
    /// backendRef problems, for ResolvedRefs (the first one is reported).
    problems: Vec<RefProblem>,
    /// Every resolution asked for, in order ([`BackendCall`]).
    calls: Vec<BackendCall>,
    route: ir::RouteRef,
    /// [`RouteKind::HTTP2_BACKENDS`] of the route's kind.
    http2_backends: bool,
}

/// How a backendRef is resolved ([`Backends`]'s three entry points).
#[derive(Clone, Copy, Debug)]
enum Resolution {
    Http,
    /// Always over HTTP/2 ([`Backends::resolve_grpc`]).
    Http2,
    L4(ir::Transport),
}

/// One backendRef resolution a route's rules asked for. Resolving registers the cluster and
/// the BackendTLSPolicy's outcome in [`Backends`], so a route whose rules are reused from an
/// earlier pass ([`crate::reuse`]) makes its calls again, in the same order: the pass then
/// registers exactly what translating every route afresh would have.
#[derive(Clone, Debug)]
pub(crate) struct BackendCall {
    how: Resolution,
    /// The cluster it resolved to, if it did.
    cluster: Option<String>,
    group: Option<String>,
    kind: Option<String>,
    name: String,
    namespace: Option<String>,
    port: Option<i32>,
}

impl BackendCall {
    fn of(r: &BackendRef<'_>, how: Resolution) -> Self {
        BackendCall {
            how,
            cluster: None,
            group: r.group.map(str::to_string),
            kind: r.kind.map(str::to_string),
            name: r.name.to_string(),
            namespace: r.namespace.map(str::to_string),
            port: r.port,
        }
    }

    /// Makes the call again for a reused route. A call that resolved to a cluster that is
    /// registered already would find it and change nothing (its Service and policies are as
    /// they were), so only the others are made.
    fn replay(&self, backends: &mut Backends<'_>, from: Referrer<'_>) {
        if let Some(cluster) = &self.cluster
            && backends.clusters.contains_key(cluster)
        {
            return;
        }
        let _ = self.resolve(backends, from);
    }

    /// The one place a rule's backendRef is resolved, whether first or again.
    fn resolve(
        &self,
        backends: &mut Backends<'_>,
        from: Referrer<'_>,
    ) -> Result<String, RefProblem> {
        let r = BackendRef {
            group: self.group.as_deref(),
            kind: self.kind.as_deref(),
            name: &self.name,
            namespace: self.namespace.as_deref(),
            port: self.port,
        };
        match self.how {
            Resolution::Http => backends.resolve(from, &r),
            Resolution::Http2 => backends.resolve_grpc(from, &r),
            Resolution::L4(transport) => backends.resolve_l4(from, &r, transport),
        }
    }
}

/// A resolved backendRef: where its traffic goes.
pub struct ResolvedBackend {
    pub target: ir::BackendTarget,
    /// The cluster a BackendTLSPolicy problem kept this backend from using: the policy still
    /// reports the Gateways it would have served.
    pub policy_cluster: Option<String>,
}

impl RuleCtx<'_, '_> {
    /// The route rule `index` of this route, for metrics and logs.
    pub fn route_ref(&self, index: usize) -> ir::RouteRef {
        ir::RouteRef {
            rule: index,
            ..self.route.clone()
        }
    }

    /// Resolves a backendRef (of a rule or a mirror), over HTTP/2 for a kind that asks for it
    /// ([`RouteKind::HTTP2_BACKENDS`], [`Backends::resolve_grpc`]). A reference that cannot be
    /// used becomes an invalid target (its share of the traffic is answered 500) and its
    /// problem is recorded for ResolvedRefs.
    pub fn backend(&mut self, r: &BackendRef<'_>) -> ResolvedBackend {
        let how = if self.http2_backends {
            Resolution::Http2
        } else {
            Resolution::Http
        };
        let resolved = self.call(r, how);
        self.resolved(resolved)
    }

    /// Resolves the backendRef of an `ExternalAuth` filter: over HTTP/2 for the gRPC protocol
    /// (`h2`), as the Service port says otherwise; problems are recorded as for a backend.
    pub fn auth_backend(&mut self, r: &BackendRef<'_>, h2: bool) -> ResolvedBackend {
        let resolved = self.call(
            r,
            if h2 {
                Resolution::Http2
            } else {
                Resolution::Http
            },
        );
        self.resolved(resolved)
    }

    /// Resolves a backendRef of a TCPRoute or UDPRoute to a Service port of `transport`
    /// (see [`Backends::resolve_l4`]), recording problems as [`RuleCtx::backend`] does.
    pub fn l4_backend(
        &mut self,
        r: &BackendRef<'_>,
        transport: ir::Transport,
    ) -> ir::BackendTarget {
        let resolved = self.call(r, Resolution::L4(transport));
        self.resolved(resolved).target
    }

    fn call(&mut self, r: &BackendRef<'_>, how: Resolution) -> Result<String, RefProblem> {
        let mut call = BackendCall::of(r, how);
        let resolved = call.resolve(self.backends, self.referrer);
        call.cluster = resolved.as_ref().ok().cloned();
        self.calls.push(call);
        resolved
    }

    fn resolved(&mut self, resolved: Result<String, RefProblem>) -> ResolvedBackend {
        match resolved {
            Ok(cluster) => ResolvedBackend {
                target: ir::BackendTarget::Cluster(cluster),
                policy_cluster: None,
            },
            Err(problem) => {
                let resolved = ResolvedBackend {
                    target: ir::BackendTarget::Invalid {
                        reason: problem.message.clone(),
                    },
                    policy_cluster: problem.policy_cluster.clone(),
                };
                self.problems.push(problem);
                resolved
            }
        }
    }
}

/// A route's rules attached to one listener with the hostnames it serves there.
pub struct Attachment {
    pub gateway: usize,
    pub listener: usize,
    /// Shared with the route's kept work ([`crate::reuse`]): a route whose work is reused
    /// attaches without copying its names.
    pub hostnames: Arc<[String]>,
    /// For each of `hostnames`, the specificity of the route hostname it came from
    /// ([`crate::hostname::origin_specificity`]), for precedence between routes that serve the
    /// same name. Worked out with the route's work and kept with it: comparing the names
    /// again on every pass was a tenth of translating 5000 routes.
    pub origins: Arc<[Origin]>,
    /// The entries of the route's status (`parents`) whose parentRefs chose this listener
    /// (for [`kind_conflicts`], which may take the listener away again).
    pub parents: smallvec::SmallVec<[usize; 2]>,
    /// The route's age and key ([`Attachment::route`]).
    pub route_age: Age,
    /// (index in the route's spec, rule)
    pub rules: Arc<[(usize, RouteRule)]>,
}

impl Attachment {
    /// The route attached.
    pub fn route(&self) -> &RouteKey {
        &self.route_age.key
    }
}

/// Everything the routes of all kinds attached, and their status.
#[derive(Default)]
pub struct Attached {
    pub attachments: Vec<Attachment>,
    pub status: BTreeMap<Arc<RouteKey>, Arc<RouteStatus>>,
    /// Each route's status as it is attached; made `status` at once when all are (a map
    /// built from sorted entries in one go, not thousands of inserts that each search it).
    statuses: Vec<(Arc<RouteKey>, Arc<RouteStatus>)>,
}

/// The shared inputs of attaching routes.
pub struct AttachCtx<'g, 'a> {
    pub gateways: &'g mut [GatewayCtx<'a>],
    pub backends: &'g mut Backends<'a>,
    pub namespace_labels: &'g BTreeMap<String, BTreeMap<String, String>>,
    pub controller: &'g str,
    /// Each route's [`RouteWork`] from earlier passes, where it still holds.
    pub reuse: &'g mut crate::reuse::RouteMemo,
}

/// What attaching a route works out from the route and the objects around it (Gateways and
/// their listeners, Services, ReferenceGrants, policies, Namespaces), before any of it is
/// added to the pass. It is the expensive part of a route, and it is the same in the next
/// pass when neither the route nor anything around it changed: [`crate::reuse`] keeps it.
pub(crate) struct RouteWork {
    /// (index in the route's spec, rule)
    rules: Arc<[(usize, RouteRule)]>,
    /// The route's own hostnames, lower case (empty: any): the origins of a union of names
    /// (two parentRefs on one listener) are worked out from them.
    route_hostnames: Arc<[String]>,
    /// Where each parent of the status placed the route (in the order of `status.parents`).
    placements: Box<[Placement]>,
    /// The route's status, shared with the pass's [`crate::Status`] (and, when it stamps to
    /// what it was, with the last published one).
    status: Arc<RouteStatus>,
    /// The backend resolutions the rules made, to be made again when reused.
    calls: Box<[BackendCall]>,
}

/// A route's entry in [`crate::reuse::RouteMemo`]: its precedence key and, when some
/// parentRef names one of our Gateways, its work.
pub(crate) struct Memo {
    pub age: Age,
    /// Boxed: every pass moves each route's entry from one of the memo's maps to the other,
    /// so entries are kept small.
    pub work: Option<Box<RouteWork>>,
}

impl Memo {
    /// Whether the route's backendRefs name any of `names` (namespace, name), resolved or not:
    /// its work read those objects, or their absence.
    pub(crate) fn names_any(&self, names: &foldhash::HashSet<(&str, &str)>) -> bool {
        let Some(work) = &self.work else {
            return false;
        };
        let namespace = self.age.key.key.namespace.as_str();
        work.calls.iter().any(|c| {
            names.contains(&(c.namespace.as_deref().unwrap_or(namespace), c.name.as_str()))
        })
    }
}

/// Attaches every route of kind `R`, oldest first. Only routes with at least one parentRef
/// naming one of our Gateways get a status: the others are none of our business, and their
/// backends must not show up in our configuration.
///
/// A route reused from the last pass skips its work but not its effects: its backend
/// resolutions are made again and its attachments, attachedRoutes counts and status are added
/// as a new route's are, in the same order.
pub fn attach_kind<R: RouteKind>(
    routes: &[Arc<R>],
    ctx: &mut AttachCtx<'_, '_>,
    out: &mut Attached,
) {
    let kind = R::kind_name();
    // One per kind, shared by the RouteRef of every rule of every route of the kind.
    let kind_ref: Arc<str> = Arc::from(kind.as_str());
    // Each route's age once (not once per comparison): it also orders its attachments.
    // (route, its memo, whether the memo's work is the last pass's)
    let mut ordered: Vec<(&Arc<R>, Memo, bool)> = routes
        .iter()
        .map(|r| match ctx.reuse.take(r) {
            Some(memo) => (r, memo, true),
            None => {
                let age = Arc::new(RouteAge::of(&**r));
                (r, Memo { age, work: None }, false)
            }
        })
        .collect();
    ordered.sort_by(|a, b| a.1.age.cmp(&b.1.age));
    for (route, mut memo, reused) in ordered {
        let age = &memo.age;
        let referrer = Referrer {
            group: GATEWAY_GROUP,
            kind: &kind,
            namespace: &age.key.key.namespace,
        };
        if reused {
            for call in memo.work.iter().flat_map(|w| &w.calls) {
                call.replay(ctx.backends, referrer);
            }
        } else {
            memo.work = work(&**route, &kind_ref, age, referrer, ctx).map(Box::new);
        }
        if let Some(work) = &memo.work {
            attach_route(work, age, ctx, out);
        }
        ctx.reuse.keep(route, memo);
    }
}

fn names_our_gateway(parents: &[ParentRef], route_ns: &str, gateways: &[GatewayCtx]) -> bool {
    parents
        .iter()
        .any(|p| resolve_parent(p, route_ns, gateways).is_some())
}

/// The Gateway a parentRef reaches (index in `gateways`) and, for a ListenerSet, which of the
/// Gateway's ListenerSets: a parentRef selects among the listeners of the object it names,
/// never those of the other (a Gateway parentRef does not see its ListenerSets' listeners).
fn resolve_parent(
    p: &ParentRef,
    route_ns: &str,
    gateways: &[GatewayCtx],
) -> Option<(usize, Option<usize>)> {
    if p.group.as_deref().unwrap_or(GATEWAY_GROUP) != GATEWAY_GROUP {
        return None;
    }
    // Compared in place: this runs for every parentRef of every route on every pass.
    let namespace = p.namespace.as_deref().unwrap_or(route_ns);
    let is = |key: &ObjectKey| key.name == p.name && key.namespace == namespace;
    match p.kind.as_deref().unwrap_or("Gateway") {
        "Gateway" => gateways
            .iter()
            .position(|g| is(&g.key))
            .map(|gi| (gi, None)),
        "ListenerSet" => gateways.iter().enumerate().find_map(|(gi, g)| {
            g.listener_sets
                .iter()
                .position(|s| is(&s.key))
                .map(|si| (gi, Some(si)))
        }),
        _ => None,
    }
}

/// A route's [`RouteWork`], or `None` when no parentRef names one of our Gateways. Reads the
/// Gateways and resolves backends (registering clusters), changes nothing else.
fn work<R: RouteKind>(
    route: &R,
    kind_ref: &Arc<str>,
    age: &Age,
    referrer: Referrer<'_>,
    ctx: &mut AttachCtx<'_, '_>,
) -> Option<RouteWork> {
    let parents = route.parent_refs();
    let key = &age.key.key;
    if !names_our_gateway(&parents, &key.namespace, ctx.gateways) {
        return None;
    }
    let meta = route.meta();
    let kind: &str = kind_ref;
    let mut rule_ctx = RuleCtx {
        backends: ctx.backends,
        referrer,
        problems: Vec::new(),
        calls: Vec::new(),
        route: ir::RouteRef {
            kind: Arc::clone(kind_ref),
            namespace: Arc::from(key.namespace.as_str()),
            name: Arc::from(key.name.as_str()),
            rule: 0,
        },
        http2_backends: R::HTTP2_BACKENDS,
    };
    let translated = route.rules(&mut rule_ctx);
    let RuleCtx {
        problems: ref_problems,
        calls,
        ..
    } = rule_ctx;
    let spec_rules = translated.len();
    let mut rules = Vec::new();
    let mut rule_problems = Vec::new();
    for (index, rule) in translated.into_iter().enumerate() {
        match rule {
            Ok(rule) => rules.push((index, rule)),
            Err(problem) => rule_problems.push(format!("rule {index}: {problem}")),
        }
    }
    let all_invalid = (spec_rules > 0 && rules.is_empty()).then(|| rule_problems.join("; "));
    let route_hostnames: Arc<[String]> = route
        .hostnames()
        .iter()
        .map(|h| h.to_ascii_lowercase())
        .collect();
    let outcomes = select_listeners(
        kind,
        meta,
        &parents,
        route.hostnames(),
        all_invalid.as_deref(),
        ctx.gateways,
        ctx.namespace_labels,
    );
    let resolved = match ref_problems.into_iter().next() {
        Some(p) => Verdict {
            ok: false,
            reason: p.reason,
            message: p.message.into(),
        },
        None => Verdict {
            ok: true,
            reason: RESOLVED_REFS,
            message: "Resolved all references".into(),
        },
    };
    let dropped = (!rule_problems.is_empty() && all_invalid.is_none())
        .then(|| format!("dropped {}", rule_problems.join("; ")));
    let generation = meta.generation;
    // The outcomes are in parentRef order: each takes its parentRef from here.
    let mut parent_refs = parents.into_iter().enumerate();
    let mut statuses = Vec::with_capacity(outcomes.len());
    let mut placements = Vec::with_capacity(outcomes.len());
    for o in outcomes {
        let mut conditions = Vec::with_capacity(2 + usize::from(dropped.is_some()));
        conditions.push(o.accepted.condition(ACCEPTED, generation));
        conditions.push(resolved.condition(RESOLVED_REFS, generation));
        if let Some(dropped) = &dropped {
            conditions.push(condition(
                PARTIALLY_INVALID,
                true,
                UNSUPPORTED_VALUE,
                dropped.clone(),
                generation,
            ));
        }
        let parent_ref = parent_refs
            .find_map(|(i, p)| (i == o.parent).then_some(p))
            .expect("an outcome's parentRef is the route's");
        statuses.push(RouteParentStatus {
            parent_ref,
            controller_name: ctx.controller.to_string(),
            conditions,
        });
        placements.push(Placement {
            gateway: o.gateway,
            accepted: o.accepted.ok,
            listeners: o
                .listeners
                .into_iter()
                .map(|(li, hosts)| {
                    let origins = origins(&hosts, &route_hostnames);
                    (li, hosts.into(), origins)
                })
                .collect(),
        });
    }
    Some(RouteWork {
        rules: Arc::from(rules),
        route_hostnames,
        placements: placements.into_boxed_slice(),
        status: Arc::new(RouteStatus { parents: statuses }),
        calls: calls.into_boxed_slice(),
    })
}

/// Adds a route's work to the pass: its attachments, the attachedRoutes of the listeners it
/// is Accepted on, and its status.
fn attach_route(work: &RouteWork, age: &Age, ctx: &mut AttachCtx<'_, '_>, out: &mut Attached) {
    let attachments = &mut out.attachments;
    // attachedRoutes counts the routes Accepted on a listener, each once, whatever the
    // listener's own conditions (a listener with a bad certificate still counts them). A route
    // is Accepted on a listener or two, so one counted already is found by a scan of those
    // before it, with no list made: this runs for every route on every pass.
    let accepted_on = || {
        work.placements
            .iter()
            .filter(|p| p.accepted)
            .flat_map(|p| p.listeners.iter().map(move |l| (p.gateway, l.0)))
    };
    for (k, (gi, li)) in accepted_on().enumerate() {
        if !accepted_on().take(k).any(|before| before == (gi, li)) {
            ctx.gateways[gi].listeners[li].attached_routes += 1;
        }
    }
    // This route's attachments are the ones pushed from here on: only they can hold its rules.
    let own_from = attachments.len();
    for (parent, p) in work.placements.iter().enumerate() {
        for (li, hosts, origins) in &p.listeners {
            // Two parentRefs may select the same listener: serve the rules once, for the union
            // of the hostnames.
            match attachments[own_from..]
                .iter_mut()
                .find(|a| a.gateway == p.gateway && a.listener == *li)
            {
                Some(existing) => {
                    let mut union = existing.hostnames.to_vec();
                    union.extend(hosts.iter().cloned());
                    union.sort();
                    union.dedup();
                    existing.origins = self::origins(&union, &work.route_hostnames);
                    existing.hostnames = union.into();
                    existing.parents.push(parent);
                }
                None => attachments.push(Attachment {
                    gateway: p.gateway,
                    listener: *li,
                    hostnames: Arc::clone(hosts),
                    origins: Arc::clone(origins),
                    parents: smallvec::smallvec![parent],
                    route_age: Arc::clone(age),
                    rules: Arc::clone(&work.rules),
                }),
            }
        }
    }
    out.statuses
        .push((Arc::clone(&age.key), Arc::clone(&work.status)));
}

/// The specificity of the route hostname each of `served` came from
/// ([`crate::hostname::origin_specificity`]; `route` lower case).
fn origins(served: &[String], route: &[String]) -> Arc<[Origin]> {
    served
        .iter()
        .map(|h| crate::hostname::origin_specificity(h, route))
        .collect()
}

/// (listener, hostnames the route serves there, their [`Attachment::origins`])
type ServedOn = (usize, Arc<[String]>, Arc<[Origin]>);

/// Where one parentRef placed a route: its Gateway, whether it is Accepted there, and the
/// listeners it serves on with the hostnames it serves there.
struct Placement {
    gateway: usize,
    accepted: bool,
    listeners: Box<[ServedOn]>,
}

/// Where one parentRef attached the route, and its Accepted condition.
struct ParentOutcome {
    /// Index of the parentRef in the route's.
    parent: usize,
    gateway: usize,
    accepted: Verdict,
    /// (listener index, hostnames served there)
    listeners: Vec<(usize, Vec<String>)>,
}

/// A condition's substance: what [`condition`] makes a Kubernetes condition of, for the
/// route's generation, when its status is built. Kept between passes in this form: a
/// `Condition` is four strings.
#[derive(Clone, Debug)]
struct Verdict {
    ok: bool,
    reason: &'static str,
    message: Cow<'static, str>,
}

impl Verdict {
    fn condition(&self, type_: &str, generation: Option<i64>) -> Condition {
        condition(
            type_,
            self.ok,
            self.reason,
            self.message.clone(),
            generation,
        )
    }
}

/// For each parentRef that names one of our Gateways: the listeners it selects that allow a
/// route of `kind` from the route's namespace and share a hostname with it, and the Accepted
/// condition. `invalid` is the reason no rule of the route can be served, if so: the route then
/// attaches nowhere. Reads the Gateways only: attachedRoutes is counted by [`attach_route`].
fn select_listeners(
    kind: &str,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    parents: &[ParentRef],
    hostnames: &[String],
    invalid: Option<&str>,
    gateways: &[GatewayCtx],
    namespace_labels: &BTreeMap<String, BTreeMap<String, String>>,
) -> Vec<ParentOutcome> {
    let route_ns = namespace(meta);
    let mut out = Vec::new();
    for (parent, pref) in parents.iter().enumerate() {
        let Some((gi, set)) = resolve_parent(pref, &route_ns, gateways) else {
            continue;
        };
        let gw = &gateways[gi];
        let set_refused = set
            .map(|si| &gw.listener_sets[si])
            .filter(|s| !s.allowed)
            .map(|s| {
                format!(
                    "ListenerSet {} is not allowed by its Gateway {}",
                    s.key, gw.key
                )
            });
        let candidates: Vec<usize> = (0..gw.listeners.len())
            .filter(|&i| gw.listeners[i].set == set)
            .filter(|&i| {
                pref.section_name
                    .as_ref()
                    .is_none_or(|s| *s == gw.listeners[i].name)
            })
            .filter(|&i| {
                pref.port
                    .is_none_or(|p| i32::from(gw.listeners[i].port) == p)
            })
            .collect();
        let allowed: Vec<usize> = candidates
            .iter()
            .copied()
            .filter(|&i| {
                let l = &gw.listeners[i];
                l.allows_kind(GATEWAY_GROUP, kind)
                    && l.allows_namespace(&route_ns, namespace_labels)
            })
            .collect();
        let mut listeners: Vec<(usize, Vec<String>)> = allowed
            .iter()
            .filter_map(|&li| {
                hostname::intersect(gw.listeners[li].hostname.as_deref(), hostnames)
                    .map(|hosts| (li, hosts))
            })
            .collect();
        // Listeners another Gateway holds the socket of serve nothing: a route that only
        // reaches those is not accepted, and says why.
        let all_taken = listeners
            .iter()
            .all(|(li, _)| gw.listeners[*li].taken_by().is_some());
        let taken = match listeners.first() {
            Some((first, _)) if all_taken => {
                let l = &gw.listeners[*first];
                let why = l.taken_by().unwrap_or_default();
                Some(format!("listener {} gets no traffic: {why}", l.name))
            }
            _ => None,
        };
        let refused = |reason, message: Cow<'static, str>| Verdict {
            ok: false,
            reason,
            message,
        };
        let accepted = if let Some(why) = set_refused {
            refused(NO_MATCHING_PARENT, why.into())
        } else if candidates.is_empty() {
            refused(
                NO_MATCHING_PARENT,
                "no listener matches the parentRef's sectionName and port".into(),
            )
        } else if allowed.is_empty() {
            refused(
                NOT_ALLOWED_BY_LISTENERS,
                format!("no listener allows this {kind} (kind or namespace)").into(),
            )
        } else if listeners.is_empty() {
            refused(
                NO_MATCHING_LISTENER_HOSTNAME,
                "no listener hostname intersects the route's hostnames".into(),
            )
        } else if let Some(why) = taken {
            listeners.clear();
            refused(PENDING, why.into())
        } else if let Some(why) = invalid {
            listeners.clear();
            refused(UNSUPPORTED_VALUE, why.to_string().into())
        } else {
            Verdict {
                ok: true,
                reason: ACCEPTED,
                message: "Accepted".into(),
            }
        };
        // Kept between passes, so held at its size.
        listeners.shrink_to_fit();
        out.push(ParentOutcome {
            parent,
            gateway: gi,
            accepted,
            listeners,
        });
    }
    out
}

/// Attaches the routes of every registered kind.
pub fn attach_all(input: &crate::Input, ctx: &mut AttachCtx<'_, '_>) -> Attached {
    struct Visit<'i, 'c, 'g, 'a> {
        input: &'i crate::Input,
        ctx: &'c mut AttachCtx<'g, 'a>,
        out: Attached,
    }
    impl crate::kinds::RouteKindVisitor for Visit<'_, '_, '_, '_> {
        fn visit<R: RouteKind>(&mut self) {
            attach_kind(R::of(self.input), self.ctx, &mut self.out);
        }
    }
    let mut visit = Visit {
        input,
        ctx,
        out: Attached::default(),
    };
    crate::kinds::for_each_route_kind(&mut visit);
    let mut out = visit.out;
    // The map sorts the entries (stably: a key seen twice keeps its last entry, as
    // inserting one by one would) and builds its nodes full, in one go.
    out.status = std::mem::take(&mut out.statuses).into_iter().collect();
    kind_conflicts::resolve(&mut out, ctx.gateways);
    out
}

/// The route kinds a listener of `protocol` takes by default, in registry order.
pub fn kinds_for_protocol(protocol: &str) -> Vec<String> {
    struct Visit<'p> {
        protocol: &'p str,
        kinds: Vec<String>,
    }
    impl crate::kinds::RouteKindVisitor for Visit<'_> {
        fn visit<R: RouteKind>(&mut self) {
            if R::PROTOCOLS.contains(&self.protocol) {
                self.kinds.push(R::kind_name());
            }
        }
    }
    let mut visit = Visit {
        protocol,
        kinds: Vec::new(),
    };
    crate::kinds::for_each_route_kind(&mut visit);
    visit.kinds
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn age(kind: &str, seconds: i64, namespace: &str, name: &str) -> RouteAge {
        let key = ObjectKey::new(namespace, name);
        RouteAge {
            created: Timestamp::from_second(seconds).unwrap(),
            prefix: sort_prefix(&key),
            key: Arc::new(RouteKey {
                kind: kind.to_string(),
                key,
            }),
        }
    }

    /// The prefix never orders two routes otherwise than (creation, namespace, name) would:
    /// names that are prefixes of each other, that part at the NUL, run past 16 bytes, are
    /// empty or hold a NUL, over every pair of a set built to have all of these.
    #[test]
    fn route_age_by_prefix_orders_as_by_namespace_and_name() {
        let parts = [
            "",
            "a",
            "a-b",
            "ab",
            "a\0",
            "b",
            "abcdefghijklmno",
            "abcdefghijklmnop",
            "abcdefghijklmnopq",
            "abcdefghijklmnopr",
            "x.y",
            "a/b",
        ];
        let mut ages = Vec::new();
        for seconds in [1, 2] {
            for ns in parts {
                for name in parts {
                    ages.push(age("HTTPRoute", seconds, ns, name));
                }
            }
        }
        for a in &ages {
            for b in &ages {
                let want = (a.created, &a.key.key.namespace, &a.key.key.name).cmp(&(
                    b.created,
                    &b.key.key.namespace,
                    &b.key.key.name,
                ));
                assert_eq!(a.cmp(b), want, "{:?} vs {:?}", a.key.key, b.key.key);
            }
        }
    }

    #[test]
    fn route_age_orders_by_creation_then_namespace_and_name_never_by_kind() {
        // Older first, whatever the names.
        assert!(age("HTTPRoute", 1, "z", "z") < age("GRPCRoute", 2, "a", "a"));
        // One creation time: namespace, then name.
        assert!(age("HTTPRoute", 1, "a", "z") < age("HTTPRoute", 1, "b", "a"));
        assert!(age("HTTPRoute", 1, "a", "a") < age("GRPCRoute", 1, "a", "b"));
        // The kind is carried, not compared: the visiting order decides between these.
        assert_eq!(
            age("HTTPRoute", 1, "a", "a").cmp(&age("GRPCRoute", 1, "a", "a")),
            std::cmp::Ordering::Equal
        );
        assert_eq!(age("GRPCRoute", 1, "a", "a").key.kind, "GRPCRoute");
    }
}
