//! `GatehouseParameters` (gatehouse.dev/v1alpha1): how the data plane that Gatehouse provisions
//! for a Gateway runs. A GatewayClass's `parametersRef` gives the defaults of its Gateways; a
//! Gateway's `spec.infrastructure.parametersRef` overrides them field by field.
//!
//! The CRD is generated from [`GatehouseParametersSpec`] ([`crd`]) and committed at
//! `deploy/crds/gatehouse.dev_gatehouseparameters.yaml`; a test compares the two. The spec keeps
//! enumerations and durations as strings on purpose: a value the API server did not check (a
//! manifest file, an older CRD) then still parses, and translate names the exact field in the
//! status instead of the object failing to load as a whole.

use crate::names;
use crate::objects::ObjectKey;
use k8s_openapi::api::core::v1::{
    Affinity, ResourceRequirements, Toleration, TopologySpreadConstraint,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, CustomResourceExt as _, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// The group of [`GatehouseParameters`], as parametersRefs name it.
pub const PARAMETERS_GROUP: &str = "gatehouse.dev";
/// The kind of [`GatehouseParameters`], as parametersRefs name it.
pub const PARAMETERS_KIND: &str = "GatehouseParameters";

/// Defaults, chosen to match the `gatehouse` binary's own flags (`--drain-delay 5s`,
/// `--shutdown-grace 30s`, `--log-format text`), so a provisioned data plane behaves like one
/// started by hand.
pub const DEFAULT_REPLICAS: u32 = 1;
pub const DEFAULT_TARGET_CPU_UTILIZATION_PERCENTAGE: u8 = 80;
pub const DEFAULT_DRAIN_DELAY: Duration = Duration::from_secs(5);
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
const MAX_WORKERS: i32 = 256;

/// A Go duration (`time.ParseDuration`) that is not negative: "0", "500ms", "5s", "1m30s",
/// "1.5h". The CRD carries this pattern; [`parse_duration`] accepts the same strings (a test
/// checks both on the same examples).
pub const DURATION_PATTERN: &str =
    r"^\+?(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$";

/// How the data plane that Gatehouse provisions for a Gateway runs: its Deployment, Service,
/// PodDisruptionBudget and HorizontalPodAutoscaler, and the data plane's own settings.
///
/// Named by a GatewayClass (`spec.parametersRef`, with its namespace) for all of the class's
/// Gateways, or by a Gateway (`spec.infrastructure.parametersRef`, in the Gateway's namespace).
/// A field that the Gateway's object leaves unset comes from the class's object, then from the
/// default. `autoscaling`, `podDisruptionBudget`, `resources`, `affinity`, `nodeSelector`,
/// `tolerations` and `topologySpreadConstraints` are taken whole from one object, because
/// their parts only make sense together; `service` is merged field by field.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "gatehouse.dev",
    version = "v1alpha1",
    kind = "GatehouseParameters",
    plural = "gatehouseparameters",
    namespaced,
    derive = "Default",
    derive = "PartialEq",
    doc = "Settings of the data planes Gatehouse provisions for Gateways, named by a \
           GatewayClass's spec.parametersRef or a Gateway's spec.infrastructure.parametersRef."
)]
#[serde(rename_all = "camelCase")]
pub struct GatehouseParametersSpec {
    /// Data-plane Pods of the Gateway (default 1). Ignored when `autoscaling` is set, in this
    /// object or in the class's: the HorizontalPodAutoscaler then sets the count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub replicas: Option<i32>,
    /// Scale the data plane with a HorizontalPodAutoscaler on CPU utilisation instead of a
    /// fixed `replicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<AutoscalingParameters>,
    /// A PodDisruptionBudget for the data-plane Pods (none by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_disruption_budget: Option<PodDisruptionBudgetParameters>,
    /// CPU and memory of the data-plane container (none by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// The Service in front of the data plane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceParameters>,
    /// Worker threads serving traffic in each data-plane Pod, 1 to 256 (default: one per CPU
    /// the Pod may use).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 256))]
    pub workers: Option<i32>,
    /// How long a stopping data-plane Pod keeps accepting connections while load balancers
    /// take it out of rotation (a Go duration such as "5s"; default 5s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(DURATION_PATTERN))]
    pub drain_delay: Option<String>,
    /// After the drain delay, how long in-flight requests may take to finish (a Go duration
    /// such as "30s"; default 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(DURATION_PATTERN))]
    pub shutdown_grace: Option<String>,
    /// Log format of the data plane: `text` (default) or `json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["text", "json"]))]
    pub log_format: Option<String>,
    /// Node labels the data-plane Pods must run on (Pod spec.nodeSelector).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Pod spec.tolerations of the data-plane Pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// Pod spec.affinity of the data-plane Pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Pod spec.topologySpreadConstraints of the data-plane Pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_spread_constraints: Option<Vec<TopologySpreadConstraint>>,
}

/// A HorizontalPodAutoscaler on the data plane's CPU utilisation.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = kube::core::Rule::new(
    "!has(self.minReplicas) || self.maxReplicas >= self.minReplicas"
).message("maxReplicas must be at least minReplicas"))]
#[serde(rename_all = "camelCase")]
pub struct AutoscalingParameters {
    /// The fewest Pods, at least 1 (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub min_replicas: Option<i32>,
    // Required, but an `Option`: a manifest that omits it still loads, and the status says
    // what is missing. Without `default`, serde still reads a missing `Option` as `None`, and
    // schemars keeps the field required in the schema.
    /// The most Pods, at least `minReplicas`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(required, range(min = 1))]
    pub max_replicas: Option<i32>,
    /// Average CPU utilisation to keep, in percent of the CPU request, 1 to 100 (default 80).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "targetCPUUtilizationPercentage"
    )]
    #[schemars(range(min = 1, max = 100))]
    pub target_cpu_utilization_percentage: Option<i32>,
}

/// A PodDisruptionBudget: exactly one of `minAvailable` and `maxUnavailable`, each a number of
/// Pods or a percentage ("50%").
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = kube::core::Rule::new(
    "has(self.minAvailable) != has(self.maxUnavailable)"
).message("set exactly one of minAvailable and maxUnavailable"))]
#[serde(rename_all = "camelCase")]
pub struct PodDisruptionBudgetParameters {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_available: Option<IntOrString>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
}

/// The Service in front of the data plane.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ServiceParameters {
    /// `LoadBalancer` (default), `ClusterIP` or `NodePort`.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "type")]
    #[schemars(extend("enum" = ["LoadBalancer", "ClusterIP", "NodePort"]))]
    pub type_: Option<String>,
    /// Annotations of the Service only (cloud load-balancer settings, say); the Gateway's
    /// spec.infrastructure.annotations go on every generated object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// `Cluster` or `Local` (Service spec.externalTrafficPolicy); NodePort and LoadBalancer
    /// Services only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["Cluster", "Local"]))]
    pub external_traffic_policy: Option<String>,
    /// Service spec.loadBalancerClass, such as `example.com/internal`; LoadBalancer Services
    /// only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer_class: Option<String>,
}

/// The CustomResourceDefinition of [`GatehouseParameters`], as committed at
/// `deploy/crds/gatehouse.dev_gatehouseparameters.yaml`.
pub fn crd() -> CustomResourceDefinition {
    GatehouseParameters::crd()
}

/// The parameters of one Gateway, merged (Gateway over class over defaults) and checked, in
/// the types the provisioner renders objects from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedParameters {
    pub replicas: Replicas,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_disruption_budget: Option<DisruptionBudget>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    pub service: ResolvedService,
    /// `None`: one worker per CPU the Pod may use (the binary's own default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<u16>,
    #[serde(with = "go_duration")]
    pub drain_delay: Duration,
    #[serde(with = "go_duration")]
    pub shutdown_grace: Duration,
    pub log_format: LogFormat,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
}

impl Default for ResolvedParameters {
    fn default() -> Self {
        ResolvedParameters {
            replicas: Replicas::Fixed(DEFAULT_REPLICAS),
            pod_disruption_budget: None,
            resources: None,
            service: ResolvedService::default(),
            workers: None,
            drain_delay: DEFAULT_DRAIN_DELAY,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            log_format: LogFormat::Text,
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
            affinity: None,
            topology_spread_constraints: Vec::new(),
        }
    }
}

/// How many data-plane Pods run. Serialised untagged (`3`, or the autoscaler's fields), as
/// the objects it becomes spell it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Replicas {
    /// The Deployment's replicas; no HorizontalPodAutoscaler.
    Fixed(u32),
    /// A HorizontalPodAutoscaler owns the count (the Deployment leaves replicas unset).
    #[serde(rename_all = "camelCase")]
    Autoscaled {
        min_replicas: u32,
        max_replicas: u32,
        #[serde(rename = "targetCPUUtilizationPercentage")]
        target_cpu_utilization_percentage: u8,
    },
}

/// A PodDisruptionBudget's one bound, serialised as the PodDisruptionBudget field it becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DisruptionBudget {
    MinAvailable {
        #[serde(rename = "minAvailable")]
        min_available: PodCount,
    },
    MaxUnavailable {
        #[serde(rename = "maxUnavailable")]
        max_unavailable: PodCount,
    },
}

/// A number of Pods or a percentage of them; serialised as Kubernetes does (`2`, `"50%"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "IntOrString", try_from = "IntOrString")]
pub enum PodCount {
    Pods(u32),
    Percent(u8),
}

impl PodCount {
    /// As PodDisruptionBudget fields spell it: `2` or `"50%"`.
    pub fn to_int_or_string(self) -> IntOrString {
        self.into()
    }
}

impl From<PodCount> for IntOrString {
    fn from(c: PodCount) -> Self {
        match c {
            PodCount::Pods(n) => IntOrString::Int(i32::try_from(n).unwrap_or(i32::MAX)),
            PodCount::Percent(p) => IntOrString::String(format!("{p}%")),
        }
    }
}

impl TryFrom<IntOrString> for PodCount {
    type Error = String;
    fn try_from(v: IntOrString) -> Result<Self, String> {
        pod_count(&v)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedService {
    #[serde(rename = "type")]
    pub type_: ServiceType,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_traffic_policy: Option<ExternalTrafficPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer_class: Option<String>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServiceType {
    #[default]
    LoadBalancer,
    ClusterIP,
    NodePort,
}

impl ServiceType {
    /// Service spec.type.
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceType::LoadBalancer => "LoadBalancer",
            ServiceType::ClusterIP => "ClusterIP",
            ServiceType::NodePort => "NodePort",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExternalTrafficPolicy {
    Cluster,
    Local,
}

impl ExternalTrafficPolicy {
    /// Service spec.externalTrafficPolicy.
    pub fn as_str(self) -> &'static str {
        match self {
            ExternalTrafficPolicy::Cluster => "Cluster",
            ExternalTrafficPolicy::Local => "Local",
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl LogFormat {
    /// The value of the binary's `--log-format`.
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

/// One GatehouseParameters object taking part in a Gateway's parameters.
#[derive(Clone, Copy)]
pub(crate) struct Layer<'a> {
    pub key: &'a ObjectKey,
    pub spec: &'a GatehouseParametersSpec,
}

/// GatehouseParameters by namespace/name.
pub(crate) type Index<'a> = BTreeMap<ObjectKey, &'a GatehouseParameters>;

pub(crate) fn index(objects: &[Arc<GatehouseParameters>]) -> Index<'_> {
    objects
        .iter()
        .map(|p| (ObjectKey::of(&p.metadata), &**p))
        .collect()
}

/// Finds the object a parametersRef names: `Err` says what is wrong with the reference.
pub(crate) fn lookup<'a>(
    index: &'a Index<'a>,
    group: &str,
    kind: &str,
    namespace: Option<&str>,
    name: &str,
) -> Result<Layer<'a>, String> {
    if group != PARAMETERS_GROUP || kind != PARAMETERS_KIND {
        let group = if group.is_empty() { "core" } else { group };
        return Err(format!(
            "kind {kind} of group {group} is not supported; Gatehouse reads \
             {PARAMETERS_GROUP}/{PARAMETERS_KIND}"
        ));
    }
    let Some(namespace) = namespace.filter(|ns| !ns.is_empty()) else {
        return Err(format!(
            "{PARAMETERS_KIND} {name} has no namespace; {PARAMETERS_KIND} is namespaced, so \
             parametersRef.namespace is required"
        ));
    };
    match index.get_key_value(&ObjectKey::new(namespace, name)) {
        Some((key, object)) => Ok(Layer {
            key,
            spec: &object.spec,
        }),
        None => Err(format!(
            "{PARAMETERS_KIND} {namespace}/{name} does not exist"
        )),
    }
}

/// A field value and the object it comes from.
struct Picked<'a, T: ?Sized> {
    value: &'a T,
    from: &'a ObjectKey,
}

/// The value of the last layer that sets the field (a Gateway's object comes after its
/// class's).
fn pick<'a, T: ?Sized>(
    layers: &[Layer<'a>],
    field: impl Fn(&'a GatehouseParametersSpec) -> Option<&'a T>,
) -> Option<Picked<'a, T>> {
    layers
        .iter()
        .rev()
        .find_map(|l| field(l.spec).map(|value| Picked { value, from: l.key }))
}

/// Problems, each naming the object and field it is about.
#[derive(Default)]
struct Problems(Vec<String>);

impl Problems {
    fn add(&mut self, from: &ObjectKey, field: &str, problem: impl std::fmt::Display) {
        self.0
            .push(format!("{PARAMETERS_KIND} {from}: spec.{field} {problem}"));
    }
}

/// Merges `layers` (later ones win, field by field) over the defaults and checks every value.
/// `Err` lists every problem, each naming its object and field.
pub(crate) fn resolve(layers: &[Layer<'_>]) -> Result<ResolvedParameters, String> {
    let mut p = Problems::default();
    let mut out = ResolvedParameters::default();

    let replicas = pick(layers, |s| s.replicas.as_ref()).and_then(|r| {
        non_negative(*r.value)
            .map_err(|why| p.add(r.from, "replicas", why))
            .ok()
    });
    let autoscaling = pick(layers, |s| s.autoscaling.as_ref());
    out.replicas = match autoscaling {
        Some(a) => autoscaled(a.value, a.from, &mut p),
        None => Replicas::Fixed(replicas.unwrap_or(DEFAULT_REPLICAS)),
    };
    if let Some(b) = pick(layers, |s| s.pod_disruption_budget.as_ref()) {
        out.pod_disruption_budget = disruption_budget(b.value, b.from, &mut p);
    }
    if let Some(r) = pick(layers, |s| s.resources.as_ref()) {
        check_resources(r.value, r.from, &mut p);
        out.resources = Some(r.value.clone());
    }
    service(layers, &mut out.service, &mut p);
    if let Some(w) = pick(layers, |s| s.workers.as_ref()) {
        match u16::try_from(*w.value) {
            Ok(n) if (1..=MAX_WORKERS).contains(w.value) => out.workers = Some(n),
            _ => p.add(
                w.from,
                "workers",
                format_args!("is {}; it must be 1 to {MAX_WORKERS}", w.value),
            ),
        }
    }
    if let Some(d) = duration(
        pick(layers, |s| s.drain_delay.as_ref()),
        "drainDelay",
        &mut p,
    ) {
        out.drain_delay = d;
    }
    if let Some(d) = duration(
        pick(layers, |s| s.shutdown_grace.as_ref()),
        "shutdownGrace",
        &mut p,
    ) {
        out.shutdown_grace = d;
    }
    if let Some(f) = pick(layers, |s| s.log_format.as_ref()) {
        match f.value.as_str() {
            "text" => out.log_format = LogFormat::Text,
            "json" => out.log_format = LogFormat::Json,
            other => p.add(
                f.from,
                "logFormat",
                format_args!("is {other:?}; it must be text or json"),
            ),
        }
    }
    if let Some(n) = pick(layers, |s| s.node_selector.as_ref()) {
        out.node_selector = n.value.clone();
    }
    if let Some(t) = pick(layers, |s| s.tolerations.as_ref()) {
        out.tolerations = t.value.clone();
    }
    if let Some(a) = pick(layers, |s| s.affinity.as_ref()) {
        out.affinity = Some(a.value.clone());
    }
    if let Some(t) = pick(layers, |s| s.topology_spread_constraints.as_ref()) {
        out.topology_spread_constraints = t.value.clone();
    }
    if p.0.is_empty() {
        Ok(out)
    } else {
        Err(p.0.join("; "))
    }
}

fn duration(picked: Option<Picked<'_, String>>, field: &str, p: &mut Problems) -> Option<Duration> {
    let d = picked?;
    parse_duration(d.value)
        .map_err(|why| p.add(d.from, field, format_args!("{:?} {why}", d.value)))
        .ok()
}

fn non_negative(n: i32) -> Result<u32, String> {
    u32::try_from(n).map_err(|_| format!("is {n}; it must not be negative"))
}

fn autoscaled(a: &AutoscalingParameters, from: &ObjectKey, p: &mut Problems) -> Replicas {
    let min = match a.min_replicas {
        None => Some(1),
        Some(n) if n >= 1 => Some(n),
        Some(n) => {
            p.add(
                from,
                "autoscaling.minReplicas",
                format_args!("is {n}; it must be at least 1"),
            );
            None
        }
    };
    let max = match a.max_replicas {
        None => {
            p.add(from, "autoscaling.maxReplicas", "is required");
            None
        }
        Some(n) if n >= 1 => Some(n),
        Some(n) => {
            p.add(
                from,
                "autoscaling.maxReplicas",
                format_args!("is {n}; it must be at least 1"),
            );
            None
        }
    };
    if let (Some(min), Some(max)) = (min, max)
        && max < min
    {
        p.add(
            from,
            "autoscaling.maxReplicas",
            format_args!("is {max}; it must be at least minReplicas ({min})"),
        );
    }
    let target = match a.target_cpu_utilization_percentage {
        None => DEFAULT_TARGET_CPU_UTILIZATION_PERCENTAGE,
        Some(n) => u8::try_from(n)
            .ok()
            .filter(|n| (1..=100).contains(n))
            .unwrap_or_else(|| {
                p.add(
                    from,
                    "autoscaling.targetCPUUtilizationPercentage",
                    format_args!("is {n}; it must be 1 to 100"),
                );
                DEFAULT_TARGET_CPU_UTILIZATION_PERCENTAGE
            }),
    };
    // Values are only used when there was no problem; 1 stands in for a refused one.
    let count = |n: Option<i32>| n.and_then(|n| u32::try_from(n).ok()).unwrap_or(1);
    Replicas::Autoscaled {
        min_replicas: count(min),
        max_replicas: count(max),
        target_cpu_utilization_percentage: target,
    }
}

fn disruption_budget(
    b: &PodDisruptionBudgetParameters,
    from: &ObjectKey,
    p: &mut Problems,
) -> Option<DisruptionBudget> {
    let count = |field: &str, v: &IntOrString, p: &mut Problems| match pod_count(v) {
        Ok(c) => Some(c),
        Err(why) => {
            p.add(from, &format!("podDisruptionBudget.{field}"), why);
            None
        }
    };
    match (&b.min_available, &b.max_unavailable) {
        (Some(v), None) => count("minAvailable", v, p)
            .map(|min_available| DisruptionBudget::MinAvailable { min_available }),
        (None, Some(v)) => count("maxUnavailable", v, p)
            .map(|max_unavailable| DisruptionBudget::MaxUnavailable { max_unavailable }),
        (Some(_), Some(_)) => {
            p.add(
                from,
                "podDisruptionBudget",
                "sets both minAvailable and maxUnavailable; set exactly one",
            );
            None
        }
        (None, None) => {
            p.add(
                from,
                "podDisruptionBudget",
                "sets neither minAvailable nor maxUnavailable; set exactly one",
            );
            None
        }
    }
}

fn pod_count(v: &IntOrString) -> Result<PodCount, String> {
    match v {
        IntOrString::Int(n) => non_negative(*n).map(PodCount::Pods),
        IntOrString::String(s) => s
            .strip_suffix('%')
            .and_then(|n| n.parse::<u8>().ok())
            .filter(|n| *n <= 100)
            .map(PodCount::Percent)
            .ok_or_else(|| {
                format!("is {s:?}; it must be a number of Pods or a percentage from 0% to 100%")
            }),
    }
}

/// Quantities are strings in the CRD (the API server does not parse them there), so a typo
/// would only surface when the provisioner's Deployment is refused.
fn check_resources(r: &ResourceRequirements, from: &ObjectKey, p: &mut Problems) {
    for (which, list) in [("limits", &r.limits), ("requests", &r.requests)] {
        for (name, Quantity(q)) in list.iter().flatten() {
            if !quantity(q) {
                p.add(
                    from,
                    &format!("resources.{which}.{name}"),
                    format_args!(
                        "is {q:?}; it must be a Kubernetes quantity such as 500m, 2, 128Mi or 1G"
                    ),
                );
            }
        }
    }
}

/// Kubernetes' quantity syntax, non-negative: a decimal number, then a binary suffix (Ki..Ei),
/// a decimal one (m, k, M..E) or an exponent (e3, E-2).
fn quantity(s: &str) -> bool {
    let s = s.strip_prefix('+').unwrap_or(s);
    let number_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(number_end);
    let number_ok = match number.split_once('.') {
        None => !number.is_empty(),
        Some((int, frac)) => (!int.is_empty() || !frac.is_empty()) && !frac.contains('.'),
    };
    let suffix_ok = matches!(
        suffix,
        "" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" | "m" | "k" | "M" | "G" | "T" | "P" | "E"
    ) || suffix
        .strip_prefix(['e', 'E'])
        .map(|e| e.strip_prefix(['+', '-']).unwrap_or(e))
        .is_some_and(|e| !e.is_empty() && e.chars().all(|c| c.is_ascii_digit()));
    number_ok && suffix_ok
}

/// `service` is merged field by field; then the fields are checked together, as the API
/// server would check the Service.
fn service(layers: &[Layer<'_>], out: &mut ResolvedService, p: &mut Problems) {
    let type_ = service_field(layers, |s| s.type_.as_ref());
    if let Some(t) = &type_ {
        match t.value.as_str() {
            "LoadBalancer" => out.type_ = ServiceType::LoadBalancer,
            "ClusterIP" => out.type_ = ServiceType::ClusterIP,
            "NodePort" => out.type_ = ServiceType::NodePort,
            other => p.add(
                t.from,
                "service.type",
                format_args!("is {other:?}; it must be LoadBalancer, ClusterIP or NodePort"),
            ),
        }
    }
    if let Some(a) = pick(layers, |s| {
        s.service.as_ref().and_then(|s| s.annotations.as_ref())
    }) {
        for key in a.value.keys() {
            if let Err(why) = names::qualified_name(key) {
                p.add(
                    a.from,
                    &format!("service.annotations[{key:?}]"),
                    format_args!("is not a valid annotation key: {why}"),
                );
            }
        }
        out.annotations = a.value.clone();
    }
    // Which object decided the type, for messages about fields that depend on it.
    let type_origin = |out: &ResolvedService| match &type_ {
        Some(t) => format!(
            "service.type is {} (from {PARAMETERS_KIND} {})",
            t.value, t.from
        ),
        None => format!("service.type is {} (the default)", out.type_.as_str()),
    };
    if let Some(e) = service_field(layers, |s| s.external_traffic_policy.as_ref()) {
        match e.value.as_str() {
            "Cluster" => out.external_traffic_policy = Some(ExternalTrafficPolicy::Cluster),
            "Local" => out.external_traffic_policy = Some(ExternalTrafficPolicy::Local),
            other => p.add(
                e.from,
                "service.externalTrafficPolicy",
                format_args!("is {other:?}; it must be Cluster or Local"),
            ),
        }
        if out.type_ == ServiceType::ClusterIP {
            p.add(
                e.from,
                "service.externalTrafficPolicy",
                format_args!(
                    "applies to NodePort and LoadBalancer Services only, but {}",
                    type_origin(out)
                ),
            );
        }
    }
    if let Some(c) = service_field(layers, |s| s.load_balancer_class.as_ref()) {
        if let Err(why) = names::qualified_name(c.value) {
            p.add(
                c.from,
                "service.loadBalancerClass",
                format_args!(
                    "is {:?}; it must be a label-style name such as example.com/internal: {why}",
                    c.value
                ),
            );
        }
        if out.type_ != ServiceType::LoadBalancer {
            p.add(
                c.from,
                "service.loadBalancerClass",
                format_args!(
                    "applies to LoadBalancer Services only, but {}",
                    type_origin(out)
                ),
            );
        }
        out.load_balancer_class = Some(c.value.clone());
    }
}

fn service_field<'a>(
    layers: &[Layer<'a>],
    get: fn(&ServiceParameters) -> Option<&String>,
) -> Option<Picked<'a, String>> {
    pick(layers, move |s: &'a GatehouseParametersSpec| {
        s.service.as_ref().and_then(get)
    })
}

/// A Go duration (`time.ParseDuration`) that is not negative: decimal numbers, each with a unit
/// (ns, us, µs, μs, ms, s, m, h), or a bare "0". Fractions are cut at the nanosecond, as in Go.
/// The same strings as [`DURATION_PATTERN`], and no larger than Go's limit (about 292 years).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    const UNITS: [(&str, u128); 8] = [
        ("ns", 1),
        ("us", 1_000),
        ("µs", 1_000),
        ("μs", 1_000),
        ("ms", 1_000_000),
        ("s", 1_000_000_000),
        ("m", 60_000_000_000),
        ("h", 3_600_000_000_000),
    ];
    const LIMIT: u128 = i64::MAX as u128;
    const WANT: &str = "is not a duration; write it as Go does, such as 5s, 500ms or 1m30s";
    if s.starts_with('-') {
        return Err("is negative; it must be 0 or more".to_string());
    }
    let mut rest = s.strip_prefix('+').unwrap_or(s);
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(WANT.to_string());
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (int, after) = rest.split_at(int_len);
        let (frac, after) = match after.strip_prefix('.') {
            Some(a) => {
                let len = a.find(|c: char| !c.is_ascii_digit()).unwrap_or(a.len());
                a.split_at(len)
            }
            None => ("", after),
        };
        if int.is_empty() && frac.is_empty() {
            return Err(WANT.to_string());
        }
        // The longest unit that the text starts with: "ms" before "m".
        let Some((unit, scale)) = UNITS
            .iter()
            .filter(|(u, _)| after.starts_with(u))
            .max_by_key(|(u, _)| u.len())
        else {
            return Err(WANT.to_string());
        };
        let too_long = || "is too long; at most about 292 years are allowed".to_string();
        let whole = int
            .chars()
            .try_fold(0u128, |n, c| {
                n.checked_mul(10)?
                    .checked_add(u128::from(c.to_digit(10)?))
                    .filter(|&n| n <= LIMIT)
            })
            .ok_or_else(too_long)?;
        let mut part = whole.checked_mul(*scale).ok_or_else(too_long)?;
        // Digits past the nanosecond cannot change the result.
        let mut frac_scale = *scale;
        for c in frac.chars() {
            frac_scale /= 10;
            if frac_scale == 0 {
                break;
            }
            part += u128::from(c.to_digit(10).unwrap_or(0)) * frac_scale;
        }
        total = total
            .checked_add(part)
            .filter(|&t| t <= LIMIT)
            .ok_or_else(too_long)?;
        rest = &after[unit.len()..];
    }
    let secs = u64::try_from(total / 1_000_000_000).unwrap_or(u64::MAX);
    let nanos = u32::try_from(total % 1_000_000_000).unwrap_or(0);
    Ok(Duration::new(secs, nanos))
}

/// A duration as Go prints it ("1m30s", "500ms", "0s"), which [`parse_duration`] reads back.
pub fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_string();
    }
    if nanos < 1_000_000_000 {
        return if nanos.is_multiple_of(1_000_000) {
            format!("{}ms", nanos / 1_000_000)
        } else if nanos.is_multiple_of(1_000) {
            format!("{}us", nanos / 1_000)
        } else {
            format!("{nanos}ns")
        };
    }
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, secs % 3600 / 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if h > 0 || m > 0 {
        out.push_str(&format!("{m}m"));
    }
    out.push_str(&s.to_string());
    if d.subsec_nanos() > 0 {
        let frac = format!("{:09}", d.subsec_nanos());
        out.push('.');
        out.push_str(frac.trim_end_matches('0'));
    }
    out.push('s');
    out
}

/// Durations serialise as Go writes them, so snapshots and the provisioner's flags read "5s".
mod go_duration {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format_duration(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        super::parse_duration(&s).map_err(|why| serde::de::Error::custom(format!("{s:?} {why}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_as_go_reads_them() {
        let ms = Duration::from_millis;
        for (text, want) in [
            ("0", Duration::ZERO),
            ("+0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("5s", ms(5_000)),
            ("+5s", ms(5_000)),
            ("500ms", ms(500)),
            ("2m", ms(120_000)),
            ("1m30s", ms(90_000)),
            ("1.5h", ms(5_400_000)),
            (".5s", ms(500)),
            ("5.s", ms(5_000)),
            ("1.004s", ms(1_004)),
            ("10.5s4m", ms(250_500)),
            ("11us", Duration::from_micros(11)),
            ("12µs", Duration::from_micros(12)),
            ("12μs", Duration::from_micros(12)),
            ("10ns", Duration::from_nanos(10)),
            ("1h2m3s4ms5us6ns", Duration::new(3723, 4_005_006)),
            ("0.1234567891s", Duration::from_nanos(123_456_789)),
        ] {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn durations_go_refuses_or_that_are_negative() {
        for text in [
            "", "5", "s", ".s", "-5s", "-0", "5x", "5 s", "1.2.3s", "5S", "1e3s", "inf", "NaNs",
            "5s ", " 5s", "++5s",
        ] {
            assert!(parse_duration(text).is_err(), "{text:?}");
        }
        assert!(parse_duration("2562047h").is_ok());
        assert!(parse_duration("2562048h").is_err(), "over Go's limit");
        assert!(parse_duration("99999999999999999999999999999999999999999h").is_err());
    }

    /// The CRD's pattern and the parser agree, so the API server refuses what translate would.
    #[test]
    fn the_crd_pattern_accepts_what_the_parser_accepts() {
        let pattern = regex::Regex::new(DURATION_PATTERN).unwrap();
        for text in [
            "0", "+0", "0s", "5s", "+5s", "500ms", "2m", "1m30s", "1.5h", ".5s", "5.s", "1.004s",
            "10.5s4m", "11us", "12µs", "12μs", "10ns", "", "5", "s", ".s", "-5s", "-0", "5x",
            "5 s", "1.2.3s", "5S", "1e3s", "inf", "++5s", "0.0s", "00s",
        ] {
            assert_eq!(
                pattern.is_match(text),
                parse_duration(text).is_ok(),
                "{text:?}"
            );
        }
    }

    #[test]
    fn durations_round_trip_through_their_text() {
        for d in [
            Duration::ZERO,
            Duration::from_nanos(7),
            Duration::from_micros(250),
            Duration::from_millis(500),
            Duration::from_secs(5),
            Duration::from_millis(1_500),
            Duration::from_secs(90),
            Duration::from_secs(3600),
            Duration::new(3723, 4_005_006),
        ] {
            let text = format_duration(d);
            assert_eq!(parse_duration(&text), Ok(d), "{text}");
        }
        assert_eq!(format_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(format_duration(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(format_duration(Duration::from_millis(1_500)), "1.5s");
    }

    #[test]
    fn quantities() {
        for ok in [
            "1", "500m", "0.5", ".5", "5.", "128Mi", "1G", "1e3", "1E-2", "+1", "2Ki", "100k",
        ] {
            assert!(quantity(ok), "{ok}");
        }
        for bad in [
            "", "-1", "1 CPU", "1mi", "1KB", ".", "1.2.3", "1e", "e3", "Mi", "1Mib", "1e1.5",
        ] {
            assert!(!quantity(bad), "{bad}");
        }
    }
}
