//! Translate's resolved infrastructure of a Gateway in the provisioner's terms.

use super::render::{Autoscaling, Budget, PortSpec, ProxySpec, ServiceSettings};
use gatehouse_translate::Infrastructure;
use gatehouse_translate::infrastructure::AddressType;
use gatehouse_translate::parameters::{DisruptionBudget, LogFormat, Replicas, ServiceType};

/// The Service type: the parameters' unless every `spec.addresses` entry asks for
/// routability `Cluster`, which a ClusterIP Service gives and nothing more (a load balancer
/// or node ports would make an internal Gateway reachable from outside).
fn service_type(infra: &Infrastructure) -> ServiceType {
    let requested = &infra.requested_addresses;
    if !requested.is_empty() && requested.iter().all(|a| a.cluster) {
        ServiceType::ClusterIP
    } else {
        infra.parameters.service.type_
    }
}

/// What the Gateway's data plane should be. A requested IPAddress becomes the Service's
/// `loadBalancerIP` when the Service is a LoadBalancer (the only type that can ask for one),
/// a requested cluster IP its `clusterIP`; the first of each wins, the rest are reported by
/// [`unsupported_addresses`].
pub fn proxy_spec(infra: &Infrastructure) -> ProxySpec {
    let p = &infra.parameters;
    let (replicas, autoscaling) = match p.replicas {
        Replicas::Fixed(n) => (i32::try_from(n).unwrap_or(i32::MAX), None),
        Replicas::Autoscaled {
            min_replicas,
            max_replicas,
            target_cpu_utilization_percentage,
        } => (
            i32::try_from(min_replicas).unwrap_or(i32::MAX),
            Some(Autoscaling {
                min_replicas: i32::try_from(min_replicas).unwrap_or(i32::MAX),
                max_replicas: i32::try_from(max_replicas).unwrap_or(i32::MAX),
                target_cpu_utilization: i32::from(target_cpu_utilization_percentage),
            }),
        ),
    };
    let pod_disruption_budget = p.pod_disruption_budget.map(|b| match b {
        DisruptionBudget::MinAvailable { min_available } => {
            Budget::MinAvailable(min_available.to_int_or_string())
        }
        DisruptionBudget::MaxUnavailable { max_unavailable } => {
            Budget::MaxUnavailable(max_unavailable.to_int_or_string())
        }
    });
    let type_ = service_type(infra);
    let first_value = |cluster: bool| {
        infra
            .requested_addresses
            .iter()
            .filter(|a| a.cluster == cluster)
            .find(|a| a.type_ == AddressType::IPAddress)
            .and_then(|a| a.value.clone())
    };
    let load_balancer_ip = (type_ == ServiceType::LoadBalancer)
        .then(|| first_value(false))
        .flatten();
    ProxySpec {
        labels: infra.labels.clone(),
        annotations: infra.annotations.clone(),
        replicas,
        autoscaling,
        pod_disruption_budget,
        resources: p.resources.clone(),
        service: ServiceSettings {
            type_: type_.as_str().to_string(),
            annotations: p.service.annotations.clone(),
            external_traffic_policy: p
                .service
                .external_traffic_policy
                .map(|e| e.as_str().to_string()),
            load_balancer_class: p.service.load_balancer_class.clone(),
            load_balancer_ip,
            cluster_ip: first_value(true),
        },
        workers: p.workers.map(u32::from),
        drain_delay: p.drain_delay,
        shutdown_grace: p.shutdown_grace,
        log_format: (p.log_format != LogFormat::Text).then(|| p.log_format.as_str().to_string()),
        node_selector: (!p.node_selector.is_empty()).then(|| p.node_selector.clone()),
        tolerations: (!p.tolerations.is_empty()).then(|| p.tolerations.clone()),
        affinity: p.affinity.clone(),
        topology_spread_constraints: (!p.topology_spread_constraints.is_empty())
            .then(|| p.topology_spread_constraints.clone()),
        ports: infra
            .ports
            .iter()
            .map(|port| PortSpec {
                port: port.port,
                protocol: port.protocol.as_str().to_string(),
            })
            .collect(),
    }
}

/// Requested addresses the Service cannot carry, with why (status says so instead of
/// pretending): every address when the Service type cannot request one, all but the first
/// IPAddress otherwise, and every address of another type. Of cluster IPs, the first is
/// asked for and the rest refused.
pub fn unsupported_addresses(infra: &Infrastructure) -> Vec<String> {
    let type_ = service_type(infra);
    let lb = type_ == ServiceType::LoadBalancer;
    let mut first_ip = true;
    let mut first_cluster_ip = true;
    let mut out = Vec::new();
    for a in &infra.requested_addresses {
        let Some(value) = &a.value else { continue };
        if a.cluster {
            if !std::mem::take(&mut first_cluster_ip) {
                out.push(format!(
                    "IPAddress {value} of routability Cluster: a Service requests one cluster IP"
                ));
            }
            continue;
        }
        let type_name = String::from(a.type_.clone());
        if !lb {
            out.push(format!(
                "{type_name} {value}: a {} Service cannot request an address",
                type_.as_str()
            ));
        } else if a.type_ != AddressType::IPAddress {
            out.push(format!(
                "{type_name} {value}: a LoadBalancer Service can request an IPAddress only"
            ));
        } else if !first_ip {
            out.push(format!(
                "IPAddress {value}: a Service requests one load-balancer address"
            ));
        } else {
            first_ip = false;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatehouse_translate::infrastructure::{RequestedAddress, ServicePort, TransportProtocol};
    use gatehouse_translate::parameters::ResolvedParameters;

    fn infra() -> Infrastructure {
        Infrastructure {
            gateway_class_name: "gatehouse".into(),
            labels: [("team".to_string(), "a".to_string())].into(),
            annotations: Default::default(),
            parameters: ResolvedParameters::default(),
            requested_addresses: vec![
                RequestedAddress {
                    type_: AddressType::IPAddress,
                    value: Some("10.0.0.7".into()),
                    cluster: false,
                },
                RequestedAddress {
                    type_: AddressType::IPAddress,
                    value: Some("10.0.0.8".into()),
                    cluster: false,
                },
                RequestedAddress {
                    type_: AddressType::Hostname,
                    value: Some("gw.example".into()),
                    cluster: false,
                },
            ],
            ports: vec![ServicePort {
                port: 80,
                protocol: TransportProtocol::Tcp,
                listeners: vec!["http".into()],
            }],
        }
    }

    #[test]
    fn the_first_requested_ip_becomes_the_load_balancer_ip_and_the_rest_are_refused() {
        let i = infra();
        let spec = proxy_spec(&i);
        assert_eq!(spec.service.load_balancer_ip.as_deref(), Some("10.0.0.7"));
        assert_eq!(spec.service.type_, "LoadBalancer");
        assert_eq!(
            spec.ports,
            vec![PortSpec {
                port: 80,
                protocol: "TCP".into()
            }]
        );
        assert_eq!(spec.replicas, 1);
        let refused = unsupported_addresses(&i);
        assert_eq!(refused.len(), 2, "{refused:?}");
        assert!(refused[0].contains("10.0.0.8"), "{refused:?}");
        assert!(refused[1].contains("gw.example"), "{refused:?}");
    }

    #[test]
    fn a_cluster_ip_service_requests_no_address() {
        let mut i = infra();
        i.parameters.service.type_ = ServiceType::ClusterIP;
        assert_eq!(proxy_spec(&i).service.load_balancer_ip, None);
        assert_eq!(unsupported_addresses(&i).len(), 3);
    }

    fn cluster_ip(value: Option<&str>) -> RequestedAddress {
        RequestedAddress {
            type_: AddressType::IPAddress,
            value: value.map(str::to_string),
            cluster: true,
        }
    }

    #[test]
    fn only_cluster_routability_makes_a_cluster_ip_service_whatever_the_parameters() {
        let mut i = infra();
        i.requested_addresses = vec![
            cluster_ip(Some("10.96.0.50")),
            cluster_ip(Some("10.96.0.51")),
        ];
        let spec = proxy_spec(&i);
        assert_eq!(spec.service.type_, "ClusterIP");
        assert_eq!(spec.service.cluster_ip.as_deref(), Some("10.96.0.50"));
        assert_eq!(spec.service.load_balancer_ip, None);
        let refused = unsupported_addresses(&i);
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert!(refused[0].contains("10.96.0.51"), "{refused:?}");
    }

    #[test]
    fn cluster_and_default_routability_keep_the_load_balancer_and_ask_for_both() {
        let mut i = infra();
        i.requested_addresses = vec![
            cluster_ip(Some("10.96.0.50")),
            RequestedAddress {
                type_: AddressType::IPAddress,
                value: Some("10.0.0.7".into()),
                cluster: false,
            },
        ];
        let spec = proxy_spec(&i);
        assert_eq!(spec.service.type_, "LoadBalancer");
        assert_eq!(spec.service.load_balancer_ip.as_deref(), Some("10.0.0.7"));
        assert_eq!(spec.service.cluster_ip.as_deref(), Some("10.96.0.50"));
        assert!(unsupported_addresses(&i).is_empty());
        // Without a value, the API server picks the cluster IP.
        i.requested_addresses = vec![cluster_ip(None)];
        let spec = proxy_spec(&i);
        assert_eq!(spec.service.type_, "ClusterIP");
        assert_eq!(spec.service.cluster_ip, None);
    }

    #[test]
    fn an_autoscaled_data_plane_starts_at_its_minimum() {
        let mut i = infra();
        i.parameters.replicas = Replicas::Autoscaled {
            min_replicas: 2,
            max_replicas: 9,
            target_cpu_utilization_percentage: 70,
        };
        let spec = proxy_spec(&i);
        assert_eq!(spec.replicas, 2);
        assert_eq!(
            spec.autoscaling,
            Some(Autoscaling {
                min_replicas: 2,
                max_replicas: 9,
                target_cpu_utilization: 70
            })
        );
    }
}
