//! One Gateway's share of a configuration: what its own data plane receives when every
//! Gateway has a data plane of its own. It holds that Gateway, the clusters its rules and
//! TLSRoutes reach and the certificates its listeners and those clusters use, and nothing of
//! any other Gateway: a data plane never holds another team's keys.

use crate::{BackendTarget, Config, Gateway, HttpRule};
use std::collections::BTreeSet;
use std::net::IpAddr;

impl Config {
    /// The part of this configuration that serves Gateway `namespace/name`, its listeners
    /// bound to `bind` (a data plane's pod listens on all its addresses; the Gateway's own
    /// addresses belong to its Service). `None` if the configuration has no such Gateway.
    pub fn for_gateway(&self, namespace: &str, name: &str, bind: IpAddr) -> Option<Config> {
        let gateway = self
            .gateways
            .iter()
            .find(|g| g.namespace == namespace && g.name == name)?;
        let mut gateway: Gateway = gateway.clone();
        for l in &mut gateway.listeners {
            l.address = bind;
        }
        // HTTP rules reach their backends' clusters, their mirrors' and their authorization
        // servers'; listeners their pre-routing filters' servers.
        let clusters: BTreeSet<&str> = gateway
            .listeners
            .iter()
            .flat_map(|l| {
                let tls = l.tls_routes.iter().flat_map(|r| &r.backends);
                let l4 = l.l4_route.iter().flat_map(|r| &r.backends);
                let stream = tls.chain(l4).filter_map(|b| match &b.target {
                    BackendTarget::Cluster(name) => Some(name.as_str()),
                    BackendTarget::Invalid { .. } => None,
                });
                let pre_routing = l.filters.iter().filter_map(crate::HttpFilter::cluster);
                l.rules
                    .iter()
                    .flat_map(HttpRule::clusters)
                    .chain(stream)
                    .chain(pre_routing)
            })
            .collect();
        let clusters: Vec<_> = self
            .clusters
            .iter()
            .filter(|c| clusters.contains(c.name.as_str()))
            .cloned()
            .collect();
        let certificates: BTreeSet<&str> = gateway
            .listeners
            .iter()
            .filter_map(|l| l.tls.as_ref())
            .flat_map(|t| t.certificates.iter().map(String::as_str))
            .chain(
                clusters
                    .iter()
                    .filter_map(|c| c.tls.as_ref()?.client_certificate.as_deref()),
            )
            .collect();
        let certificates = self
            .certificates
            .iter()
            .filter(|c| certificates.contains(c.name.as_str()))
            .cloned()
            .collect();
        Some(Config {
            gateways: vec![gateway],
            clusters,
            certificates,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::*;
    use std::net::Ipv4Addr;

    fn listener(port: u16, cluster: &str, cert: Option<&str>) -> Listener {
        Listener {
            name: format!("l{port}"),
            address: IpAddr::V4(Ipv4Addr::new(127, 1, 2, 3)),
            port,
            protocol: if cert.is_some() {
                ListenerProtocol::Https
            } else {
                ListenerProtocol::Http
            },
            hostname: None,
            rules: vec![HttpRule {
                route: RouteRef {
                    kind: "HTTPRoute".into(),
                    namespace: "a".into(),
                    name: "r".into(),
                    rule: 0,
                },
                filters: vec![],
                backends: vec![
                    WeightedBackend {
                        weight: 1,
                        target: BackendTarget::Cluster(cluster.into()),
                        filters: vec![],
                    },
                    WeightedBackend {
                        weight: 1,
                        target: BackendTarget::Invalid { reason: "x".into() },
                        filters: vec![],
                    },
                ],
                timeouts: Timeouts::default(),
                retry: None,
            }],
            virtual_hosts: vec![],
            tls: cert.map(|c| ListenerTls {
                mode: TlsMode::Terminate,
                certificates: vec![c.into()],
                client_validation: None,
            }),
            tls_routes: vec![],
            l4_route: None,
            filters: vec![],
        }
    }

    fn cluster(name: &str, client_cert: Option<&str>) -> Cluster {
        Cluster {
            name: name.into(),
            protocol: UpstreamProtocol::Http1,
            endpoints: vec![],
            tls: client_cert.map(|c| UpstreamTls {
                server_name: "b".into(),
                ca_pem: None,
                subject_alt_names: vec![],
                client_certificate: Some(c.into()),
            }),
        }
    }

    fn cert(name: &str) -> Certificate {
        Certificate {
            name: name.into(),
            cert_pem: String::new(),
            key_pem: format!("key of {name}"),
        }
    }

    #[test]
    fn a_gateway_gets_its_own_clusters_and_certificates_only() {
        let config = Config {
            gateways: vec![
                Gateway {
                    namespace: "a".into(),
                    name: "web".into(),
                    listeners: vec![listener(443, "a/x:80", Some("a/web-tls"))],
                },
                Gateway {
                    namespace: "b".into(),
                    name: "web".into(),
                    listeners: vec![listener(443, "b/y:80", Some("b/web-tls"))],
                },
            ],
            clusters: vec![cluster("a/x:80", Some("a/client")), cluster("b/y:80", None)],
            certificates: vec![cert("a/client"), cert("a/web-tls"), cert("b/web-tls")],
        };
        let any = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
        let a = config.for_gateway("a", "web", any).unwrap();
        assert_eq!(a.gateways.len(), 1);
        assert_eq!(a.gateways[0].namespace, "a");
        assert_eq!(a.gateways[0].listeners[0].address, any);
        let names = |v: &[Certificate]| v.iter().map(|c| c.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&a.certificates), ["a/client", "a/web-tls"]);
        assert_eq!(a.clusters.len(), 1);
        assert_eq!(a.clusters[0].name, "a/x:80");
        let b = config.for_gateway("b", "web", any).unwrap();
        assert_eq!(names(&b.certificates), ["b/web-tls"]);
        assert!(config.for_gateway("c", "web", any).is_none());
    }

    #[test]
    fn a_gateway_gets_the_clusters_its_mirrors_reach() {
        let mut l = listener(80, "a/x:80", None);
        let mirror = |cluster: &str| {
            HttpFilter::Mirror(Mirror {
                cluster: cluster.into(),
                numerator: 1,
                denominator: 1,
            })
        };
        l.rules[0].filters.push(mirror("a/rule-mirror:80"));
        l.rules[0].backends[0]
            .filters
            .push(mirror("a/backend-mirror:80"));
        let config = Config {
            gateways: vec![Gateway {
                namespace: "a".into(),
                name: "web".into(),
                listeners: vec![l],
            }],
            clusters: vec![
                cluster("a/backend-mirror:80", None),
                cluster("a/other:80", None),
                cluster("a/rule-mirror:80", None),
                cluster("a/x:80", None),
            ],
            certificates: vec![],
        };
        let any = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
        let a = config.for_gateway("a", "web", any).unwrap();
        let names: Vec<_> = a.clusters.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["a/backend-mirror:80", "a/rule-mirror:80", "a/x:80"]);
    }
}
