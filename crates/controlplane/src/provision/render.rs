//! The objects of one Gateway's data plane, rendered from what translate resolved for it
//! ([`ProxySpec`]) and the controller's settings: pure, so that what the controller applies
//! is table-tested and the same input always gives the same objects (the applier compares
//! against what it applied last and sends nothing when they are equal).
//!
//! Every object lives in the Gateway's namespace, carries the Gateway as its controlling owner
//! (garbage collection deletes them with it) and the Gateway's `spec.infrastructure` labels
//! and annotations.

use super::names::Names;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy};
use k8s_openapi::api::autoscaling::v2::{
    CrossVersionObjectReference, HorizontalPodAutoscaler, HorizontalPodAutoscalerSpec, MetricSpec,
    MetricTarget, ResourceMetricSource,
};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction,
    ObjectFieldSelector, PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceRequirements,
    SeccompProfile, SecretVolumeSource, SecurityContext, Service, ServiceAccount, ServicePort,
    ServiceSpec, Sysctl, Toleration, TopologySpreadConstraint, Volume, VolumeMount,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;
use std::time::Duration;

/// The port of the data plane's admin endpoint (probes, metrics) inside its pod.
pub const ADMIN_PORT: u16 = 9901;
/// Where the bootstrap credentials are mounted.
pub const CREDENTIALS_DIR: &str = "/etc/gatehouse/credentials";

/// What one Gateway's data plane should look like: translate's resolved infrastructure
/// (parameters merged class-then-Gateway, defaults applied) in the provisioner's terms.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProxySpec {
    /// `spec.infrastructure.labels` / `annotations`: on every object and on the pods.
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub replicas: i32,
    pub autoscaling: Option<Autoscaling>,
    pub pod_disruption_budget: Option<Budget>,
    pub resources: Option<ResourceRequirements>,
    pub service: ServiceSettings,
    pub workers: Option<u32>,
    pub drain_delay: Duration,
    pub shutdown_grace: Duration,
    pub log_format: Option<String>,
    pub node_selector: Option<BTreeMap<String, String>>,
    pub tolerations: Option<Vec<Toleration>>,
    pub affinity: Option<Affinity>,
    pub topology_spread_constraints: Option<Vec<TopologySpreadConstraint>>,
    /// One per distinct listener port.
    pub ports: Vec<PortSpec>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Autoscaling {
    pub min_replicas: i32,
    pub max_replicas: i32,
    pub target_cpu_utilization: i32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Budget {
    MinAvailable(IntOrString),
    MaxUnavailable(IntOrString),
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceSettings {
    /// `LoadBalancer`, `ClusterIP` or `NodePort`.
    pub type_: String,
    pub annotations: BTreeMap<String, String>,
    pub external_traffic_policy: Option<String>,
    pub load_balancer_class: Option<String>,
    /// A static address from `spec.addresses` (type IPAddress), when the Service type can
    /// request one.
    pub load_balancer_ip: Option<String>,
    /// A cluster IP from `spec.addresses` (routability Cluster). The API server cannot change
    /// a Service's cluster IP: asking for another one than it has fails the apply, and the
    /// Gateway's status says so.
    pub cluster_ip: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PortSpec {
    pub port: u16,
    /// `TCP` or `UDP`.
    pub protocol: String,
}

/// The controller's side of every data plane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// The `gatehouse` image the data planes run (the controller's own by default).
    pub image: String,
    pub image_pull_policy: Option<String>,
    /// `https://host:port` of the control plane's config stream.
    pub control_plane_endpoint: String,
    /// The name the control plane's certificate carries.
    pub control_plane_server_name: String,
    /// The controllerName this controller answers to, written on every Deployment it makes
    /// ([`CONTROLLER_ANNOTATION`]) so that the sweep for leftovers touches only its own.
    pub controller_name: String,
}

/// The annotation naming the controller that provisioned a Deployment.
pub const CONTROLLER_ANNOTATION: &str = "gatehouse.dev/controller-name";

/// The Gateway the objects belong to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// Everything applied for one Gateway.
#[derive(Clone, Debug, PartialEq)]
pub struct Rendered {
    pub service_account: ServiceAccount,
    pub deployment: Deployment,
    pub service: Service,
    /// `None`: the parameters ask for none (an existing one is deleted).
    pub pod_disruption_budget: Option<PodDisruptionBudget>,
    pub autoscaler: Option<HorizontalPodAutoscaler>,
}

/// The objects of `owner`'s data plane.
pub fn render(owner: &Owner, spec: &ProxySpec, settings: &Settings) -> Rendered {
    let names = Names::of(&owner.name);
    Rendered {
        service_account: service_account(owner, spec, &names),
        deployment: deployment(owner, spec, settings, &names),
        service: service(owner, spec, &names),
        pod_disruption_budget: pod_disruption_budget(owner, spec, &names),
        autoscaler: autoscaler(owner, spec, &names),
    }
}

/// Labels that select this Gateway's pods. `gateway.networking.k8s.io/gateway-name` is the
/// label Gateway API asks implementations to set on generated resources.
pub fn selector_labels(names: &Names) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "gateway.networking.k8s.io/gateway-name".to_string(),
            names.gateway_label.clone(),
        ),
        (
            "app.kubernetes.io/name".to_string(),
            "gatehouse-proxy".to_string(),
        ),
    ])
}

fn meta(owner: &Owner, spec: &ProxySpec, names: &Names, name: &str) -> ObjectMeta {
    let mut labels = spec.labels.clone();
    labels.extend(selector_labels(names));
    labels.insert(
        "app.kubernetes.io/managed-by".into(),
        "gatehouse".to_string(),
    );
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(owner.namespace.clone()),
        labels: Some(labels),
        annotations: (!spec.annotations.is_empty()).then(|| spec.annotations.clone()),
        owner_references: Some(vec![OwnerReference {
            api_version: "gateway.networking.k8s.io/v1".into(),
            kind: "Gateway".into(),
            name: owner.name.clone(),
            uid: owner.uid.clone(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]),
        ..ObjectMeta::default()
    }
}

/// The bootstrap credentials Secret's metadata (its content comes from the CA).
pub fn credentials_meta(owner: &Owner, names: &Names) -> ObjectMeta {
    meta(owner, &ProxySpec::default(), names, &names.credentials)
}

fn service_account(owner: &Owner, spec: &ProxySpec, names: &Names) -> ServiceAccount {
    ServiceAccount {
        metadata: meta(owner, spec, names, &names.object),
        // The data plane never talks to the API server: no token is mounted, and the account
        // is bound to no role.
        automount_service_account_token: Some(false),
        ..ServiceAccount::default()
    }
}

fn duration_arg(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

fn deployment(owner: &Owner, spec: &ProxySpec, settings: &Settings, names: &Names) -> Deployment {
    let mut args = vec![
        "proxy".to_string(),
        format!("--control-plane={}", settings.control_plane_endpoint),
        format!(
            "--control-plane-name={}",
            settings.control_plane_server_name
        ),
        format!("--credentials={CREDENTIALS_DIR}"),
        format!("--admin-address=0.0.0.0:{ADMIN_PORT}"),
        format!("--drain-delay={}", duration_arg(spec.drain_delay)),
        format!("--shutdown-grace={}", duration_arg(spec.shutdown_grace)),
    ];
    if let Some(workers) = spec.workers {
        args.push(format!("--workers={workers}"));
    }
    let mut env = vec![EnvVar {
        name: "POD_NAME".into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: "metadata.name".into(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }];
    if let Some(format) = &spec.log_format {
        env.push(EnvVar {
            name: "GATEHOUSE_LOG_FORMAT".into(),
            value: Some(format.clone()),
            ..EnvVar::default()
        });
    }
    let probe = |path: &str, period: i32, failures: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("admin".into()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        timeout_seconds: Some(2),
        ..Probe::default()
    };
    let mut ports: Vec<ContainerPort> = spec
        .ports
        .iter()
        .map(|p| ContainerPort {
            container_port: i32::from(p.port),
            protocol: Some(p.protocol.clone()),
            ..ContainerPort::default()
        })
        .collect();
    ports.push(ContainerPort {
        name: Some("admin".into()),
        container_port: i32::from(ADMIN_PORT),
        protocol: Some("TCP".into()),
        ..ContainerPort::default()
    });
    let container = Container {
        name: "proxy".into(),
        image: Some(settings.image.clone()),
        image_pull_policy: settings.image_pull_policy.clone(),
        args: Some(args),
        env: Some(env),
        ports: Some(ports),
        readiness_probe: Some(probe("/readyz", 2, 1)),
        liveness_probe: Some(probe("/healthz", 10, 3)),
        resources: spec.resources.clone(),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Capabilities::default()
            }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(vec![VolumeMount {
            name: "credentials".into(),
            mount_path: CREDENTIALS_DIR.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        }]),
        ..Container::default()
    };
    // SIGKILL comes after the drain delay, the grace for in-flight requests and a margin.
    let termination = spec.drain_delay + spec.shutdown_grace + Duration::from_secs(5);
    let pod_labels = {
        let mut l = spec.labels.clone();
        l.extend(selector_labels(names));
        l
    };
    let mut pod_annotations = spec.annotations.clone();
    pod_annotations.insert("prometheus.io/scrape".into(), "true".into());
    pod_annotations.insert("prometheus.io/port".into(), ADMIN_PORT.to_string());
    let mut metadata = meta(owner, spec, names, &names.object);
    metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(
            CONTROLLER_ANNOTATION.to_string(),
            settings.controller_name.clone(),
        );
    Deployment {
        metadata,
        spec: Some(DeploymentSpec {
            // With an autoscaler the replica count is its to set.
            replicas: spec.autoscaling.is_none().then_some(spec.replicas),
            selector: LabelSelector {
                match_labels: Some(selector_labels(names)),
                ..LabelSelector::default()
            },
            // Never fewer ready pods than asked for while rolling: a new pod must be ready
            // (configured by the control plane) before an old one starts draining.
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(k8s_openapi::api::apps::v1::RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(1)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(pod_annotations),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(names.object.clone()),
                    automount_service_account_token: Some(false),
                    termination_grace_period_seconds: Some(
                        i64::try_from(termination.as_secs()).unwrap_or(i64::MAX),
                    ),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(65532),
                        run_as_group: Some(65532),
                        // The credentials volume's files are root's (mode 0440): the group
                        // is what lets the non-root data plane read them.
                        fs_group: Some(65532),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".into(),
                            ..SeccompProfile::default()
                        }),
                        // Listener ports below 1024 without any capability: a namespaced,
                        // safe sysctl.
                        sysctls: Some(vec![Sysctl {
                            name: "net.ipv4.ip_unprivileged_port_start".into(),
                            value: "0".into(),
                        }]),
                        ..PodSecurityContext::default()
                    }),
                    containers: vec![container],
                    volumes: Some(vec![Volume {
                        name: "credentials".into(),
                        secret: Some(SecretVolumeSource {
                            secret_name: Some(names.credentials.clone()),
                            default_mode: Some(0o440),
                            ..SecretVolumeSource::default()
                        }),
                        ..Volume::default()
                    }]),
                    node_selector: spec.node_selector.clone(),
                    tolerations: spec.tolerations.clone(),
                    affinity: spec.affinity.clone(),
                    topology_spread_constraints: spec.topology_spread_constraints.clone(),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        status: None,
    }
}

fn service(owner: &Owner, spec: &ProxySpec, names: &Names) -> Service {
    let mut metadata = meta(owner, spec, names, &names.object);
    if !spec.service.annotations.is_empty() {
        metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .extend(spec.service.annotations.clone());
    }
    let type_ = spec.service.type_.clone();
    let external = type_ == "LoadBalancer" || type_ == "NodePort";
    Service {
        metadata,
        spec: Some(ServiceSpec {
            type_: Some(type_.clone()),
            selector: Some(selector_labels(names)),
            ports: Some(
                spec.ports
                    .iter()
                    .map(|p| ServicePort {
                        name: Some(format!("{}-{}", p.protocol.to_lowercase(), p.port)),
                        port: i32::from(p.port),
                        target_port: Some(IntOrString::Int(i32::from(p.port))),
                        protocol: Some(p.protocol.clone()),
                        ..ServicePort::default()
                    })
                    .collect(),
            ),
            external_traffic_policy: spec
                .service
                .external_traffic_policy
                .clone()
                .filter(|_| external),
            load_balancer_class: spec
                .service
                .load_balancer_class
                .clone()
                .filter(|_| type_ == "LoadBalancer"),
            load_balancer_ip: spec
                .service
                .load_balancer_ip
                .clone()
                .filter(|_| type_ == "LoadBalancer"),
            cluster_ip: spec.service.cluster_ip.clone(),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

fn pod_disruption_budget(
    owner: &Owner,
    spec: &ProxySpec,
    names: &Names,
) -> Option<PodDisruptionBudget> {
    let budget = spec.pod_disruption_budget.as_ref()?;
    let (min_available, max_unavailable) = match budget {
        Budget::MinAvailable(v) => (Some(v.clone()), None),
        Budget::MaxUnavailable(v) => (None, Some(v.clone())),
    };
    Some(PodDisruptionBudget {
        metadata: meta(owner, spec, names, &names.object),
        spec: Some(PodDisruptionBudgetSpec {
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(names)),
                ..LabelSelector::default()
            }),
            min_available,
            max_unavailable,
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    })
}

fn autoscaler(owner: &Owner, spec: &ProxySpec, names: &Names) -> Option<HorizontalPodAutoscaler> {
    let a = spec.autoscaling.as_ref()?;
    Some(HorizontalPodAutoscaler {
        metadata: meta(owner, spec, names, &names.object),
        spec: Some(HorizontalPodAutoscalerSpec {
            scale_target_ref: CrossVersionObjectReference {
                api_version: Some("apps/v1".into()),
                kind: "Deployment".into(),
                name: names.object.clone(),
            },
            min_replicas: Some(a.min_replicas),
            max_replicas: a.max_replicas,
            metrics: Some(vec![MetricSpec {
                type_: "Resource".into(),
                resource: Some(ResourceMetricSource {
                    name: "cpu".into(),
                    target: MetricTarget {
                        type_: "Utilization".into(),
                        average_utilization: Some(a.target_cpu_utilization),
                        ..MetricTarget::default()
                    },
                }),
                ..MetricSpec::default()
            }]),
            ..HorizontalPodAutoscalerSpec::default()
        }),
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> Owner {
        Owner {
            namespace: "team-a".into(),
            name: "web".into(),
            uid: "uid-1".into(),
        }
    }

    fn settings() -> Settings {
        Settings {
            image: "gatehouse:1.0".into(),
            image_pull_policy: None,
            control_plane_endpoint: "https://gatehouse.gatehouse-system.svc:18000".into(),
            control_plane_server_name: "gatehouse.gatehouse-system.svc".into(),
            controller_name: "gatehouse.dev/gateway-controller".into(),
        }
    }

    fn spec() -> ProxySpec {
        ProxySpec {
            replicas: 2,
            drain_delay: Duration::from_secs(5),
            shutdown_grace: Duration::from_secs(30),
            service: ServiceSettings {
                type_: "LoadBalancer".into(),
                ..ServiceSettings::default()
            },
            ports: vec![
                PortSpec {
                    port: 80,
                    protocol: "TCP".into(),
                },
                PortSpec {
                    port: 443,
                    protocol: "TCP".into(),
                },
            ],
            ..ProxySpec::default()
        }
    }

    #[test]
    fn every_object_is_owned_by_the_gateway_and_selects_its_pods() {
        let r = render(&owner(), &spec(), &settings());
        for meta in [
            &r.service_account.metadata,
            &r.deployment.metadata,
            &r.service.metadata,
        ] {
            assert_eq!(meta.name.as_deref(), Some("web-gatehouse"));
            assert_eq!(meta.namespace.as_deref(), Some("team-a"));
            let o = &meta.owner_references.as_ref().unwrap()[0];
            assert_eq!((o.kind.as_str(), o.uid.as_str()), ("Gateway", "uid-1"));
            assert_eq!(o.controller, Some(true));
        }
        let d = r.deployment.spec.unwrap();
        let pod_labels = d.template.metadata.unwrap().labels.unwrap();
        for (k, v) in d.selector.match_labels.unwrap() {
            assert_eq!(pod_labels.get(&k), Some(&v));
        }
        assert_eq!(
            r.service.spec.as_ref().unwrap().selector,
            Some(selector_labels(&Names::of("web")))
        );
        assert!(r.pod_disruption_budget.is_none() && r.autoscaler.is_none());
    }

    #[test]
    fn the_data_plane_has_no_api_credentials_and_runs_unprivileged() {
        let r = render(&owner(), &spec(), &settings());
        assert_eq!(
            r.service_account.automount_service_account_token,
            Some(false)
        );
        let pod = r.deployment.spec.unwrap().template.spec.unwrap();
        assert_eq!(pod.automount_service_account_token, Some(false));
        assert_eq!(pod.service_account_name.as_deref(), Some("web-gatehouse"));
        let c = &pod.containers[0];
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop.as_deref(),
            Some(&["ALL".to_string()][..])
        );
        let args = c.args.as_ref().unwrap();
        assert_eq!(args[0], "proxy");
        assert!(args.contains(&"--drain-delay=5s".to_string()), "{args:?}");
        assert_eq!(pod.termination_grace_period_seconds, Some(40));
        assert_eq!(
            pod.volumes.unwrap()[0]
                .secret
                .as_ref()
                .unwrap()
                .secret_name
                .as_deref(),
            Some("web-gatehouse-credentials")
        );
    }

    #[test]
    fn service_ports_follow_the_listeners() {
        let mut s = spec();
        s.ports.push(PortSpec {
            port: 53,
            protocol: "UDP".into(),
        });
        s.service.external_traffic_policy = Some("Local".into());
        s.service.load_balancer_ip = Some("10.0.0.7".into());
        let svc = render(&owner(), &s, &settings()).service.spec.unwrap();
        let ports: Vec<(String, i32, String)> = svc
            .ports
            .unwrap()
            .into_iter()
            .map(|p| (p.name.unwrap(), p.port, p.protocol.unwrap()))
            .collect();
        assert_eq!(
            ports,
            [
                ("tcp-80".into(), 80, "TCP".into()),
                ("tcp-443".into(), 443, "TCP".into()),
                ("udp-53".into(), 53, "UDP".into())
            ]
        );
        assert_eq!(svc.external_traffic_policy.as_deref(), Some("Local"));
        assert_eq!(svc.load_balancer_ip.as_deref(), Some("10.0.0.7"));

        // A ClusterIP Service takes neither.
        s.service.type_ = "ClusterIP".into();
        let svc = render(&owner(), &s, &settings()).service.spec.unwrap();
        assert_eq!(svc.external_traffic_policy, None);
        assert_eq!(svc.load_balancer_ip, None);
    }

    #[test]
    fn parameters_reach_the_objects() {
        let mut s = spec();
        s.labels.insert("team".into(), "a".into());
        s.annotations.insert("cost-center".into(), "42".into());
        s.autoscaling = Some(Autoscaling {
            min_replicas: 2,
            max_replicas: 10,
            target_cpu_utilization: 70,
        });
        s.pod_disruption_budget = Some(Budget::MaxUnavailable(IntOrString::Int(1)));
        s.workers = Some(4);
        s.log_format = Some("json".into());
        let r = render(&owner(), &s, &settings());
        assert_eq!(r.service.metadata.labels.as_ref().unwrap()["team"], "a");
        assert_eq!(
            r.deployment.metadata.annotations.as_ref().unwrap()["cost-center"],
            "42"
        );
        let d = r.deployment.spec.unwrap();
        assert_eq!(d.replicas, None, "the autoscaler owns the replica count");
        let pod = d.template.spec.unwrap();
        assert!(
            pod.containers[0]
                .args
                .as_ref()
                .unwrap()
                .contains(&"--workers=4".into())
        );
        let hpa = r.autoscaler.unwrap().spec.unwrap();
        assert_eq!((hpa.min_replicas, hpa.max_replicas), (Some(2), 10));
        assert_eq!(hpa.scale_target_ref.name, "web-gatehouse");
        let pdb = r.pod_disruption_budget.unwrap().spec.unwrap();
        assert_eq!(pdb.max_unavailable, Some(IntOrString::Int(1)));
    }

    #[test]
    fn rendering_is_deterministic() {
        assert_eq!(
            render(&owner(), &spec(), &settings()),
            render(&owner(), &spec(), &settings())
        );
    }
}
