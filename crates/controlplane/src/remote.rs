//! The publisher of provisioned mode: each Gateway's share of the configuration goes to that
//! Gateway's own data planes over the sync stream, and what they report (acked, rejected,
//! unbound listeners) is what status says serves.
//!
//! A Gateway is Programmed only when at least one of its replicas acknowledged the current
//! snapshot; before that (no replica connected, one still applying, one refusing it) it is
//! Programmed=False Pending with the reason, so status never claims a data plane that does not
//! serve. Problems provisioning the data plane's objects come in through
//! [`RemotePublisher::set_provisioning_errors`] and are reported the same way.

use crate::reconcile::{Applied, Publisher};
use arc_swap::ArcSwap;
use futures_util::future::BoxFuture;
use gatehouse_ir as ir;
use gatehouse_sync::{ConfigServer, DataPlaneIdentity, GatewayReport};
use gatehouse_translate::ObjectKey;
use gatehouse_translate::serving::{BindProblem, Serving};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

pub struct RemotePublisher {
    server: Arc<ConfigServer>,
    /// Where a data plane binds its listeners (all of the pod's addresses).
    bind: IpAddr,
    config: ArcSwap<ir::Config>,
    published: Mutex<BTreeSet<DataPlaneIdentity>>,
    provisioning: watch::Sender<BTreeMap<ObjectKey, String>>,
    /// What `changed` has seen of `provisioning`. One receiver for the publisher's life: the
    /// errors are set during a pass (by the status sink), before the loop asks `changed`
    /// again, and a receiver subscribed at that point would already count them as seen: the
    /// pass that reports them (or reports them gone) never came.
    provisioning_seen: tokio::sync::Mutex<watch::Receiver<BTreeMap<ObjectKey, String>>>,
}

impl RemotePublisher {
    pub fn new(server: Arc<ConfigServer>, bind: IpAddr) -> Arc<Self> {
        let provisioning = watch::Sender::new(BTreeMap::new());
        let seen = provisioning.subscribe();
        Arc::new(RemotePublisher {
            server,
            bind,
            config: ArcSwap::from_pointee(ir::Config::default()),
            published: Mutex::new(BTreeSet::new()),
            provisioning,
            provisioning_seen: tokio::sync::Mutex::new(seen),
        })
    }

    /// Gateways whose data-plane objects could not be applied, with why (replaces the
    /// previous set; only a change of the Gateways wakes the loop: `failures::replace`).
    pub fn set_provisioning_errors(&self, errors: BTreeMap<ObjectKey, String>) {
        crate::failures::replace(&self.provisioning, errors);
    }
}

fn identity(gateway: &ir::Gateway) -> Option<DataPlaneIdentity> {
    match DataPlaneIdentity::new(&gateway.namespace, &gateway.name) {
        Ok(id) => Some(id),
        Err(e) => {
            // Kubernetes names always make an identity; a file could carry others, and a
            // Gateway that cannot be named cannot be served remotely.
            tracing::warn!(gateway = %gateway.key(), "no data-plane identity: {e}");
            None
        }
    }
}

impl Publisher for RemotePublisher {
    fn apply(&self, config: Arc<ir::Config>) -> BoxFuture<'_, Applied> {
        Box::pin(async move {
            let mut now = BTreeSet::new();
            for gateway in &config.gateways {
                let Some(id) = identity(gateway) else {
                    continue;
                };
                let part = config.for_gateway(&gateway.namespace, &gateway.name, self.bind);
                self.server.publish(&id, part.map(Arc::new));
                now.insert(id);
            }
            let mut published = self.published.lock().expect("not poisoned");
            for gone in published.difference(&now) {
                self.server.publish(gone, None);
            }
            *published = now;
            drop(published);
            self.config.store(config);
            // Data planes apply on their own time; serving() says how far they got.
            Applied::default()
        })
    }

    fn serving(&self) -> Serving {
        let config = self.config.load();
        let reports = self.server.reports();
        let provisioning = self.provisioning.borrow().clone();
        serving_of(&config, &reports, &provisioning)
    }

    fn changed(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let mut provisioning = self.provisioning_seen.lock().await;
            tokio::select! {
                _ = self.server.changed() => {}
                // Marks the change seen: each change wakes the loop once.
                _ = provisioning.changed() => {}
            }
        })
    }
}

/// What serves, from the data planes' reports. Pure, so that it is table-tested.
pub fn serving_of(
    config: &ir::Config,
    reports: &BTreeMap<DataPlaneIdentity, GatewayReport>,
    provisioning: &BTreeMap<ObjectKey, String>,
) -> Serving {
    let mut serving = Serving::default();
    for gateway in &config.gateways {
        let key = ObjectKey::new(gateway.namespace.clone(), gateway.name.clone());
        if let Some(e) = provisioning.get(&key) {
            serving
                .not_serving
                .insert(key, format!("cannot provision the data plane: {e}"));
            continue;
        }
        let Some(id) = identity(gateway) else {
            continue;
        };
        let report = reports.get(&id);
        let replicas = report.map(|r| r.replicas.len()).unwrap_or(0);
        let version = report.and_then(|r| r.published_version.as_deref());
        let current: Vec<_> = report
            .into_iter()
            .flat_map(|r| r.replicas.values())
            .filter(|r| version.is_some() && r.acked.as_deref() == version)
            .collect();
        if current.is_empty() {
            let rejected =
                report
                    .into_iter()
                    .flat_map(|r| r.replicas.iter())
                    .find_map(|(pod, r)| match &r.rejected {
                        Some((v, why)) if Some(v.as_str()) == version => Some((pod, why)),
                        _ => None,
                    });
            let why = match (replicas, rejected) {
                (0, _) => "no data-plane replica is connected to the control plane yet".to_string(),
                (_, Some((pod, why))) => {
                    format!("data-plane replica {pod} refused the configuration: {why}")
                }
                (n, None) => format!(
                    "{n} data-plane replica(s) connected, none has applied the current \
                     configuration yet"
                ),
            };
            serving.not_serving.insert(key, why);
            continue;
        }
        // A listener counts as unbound when a replica that serves the current configuration
        // could not bind its port.
        for replica in &current {
            for u in &replica.unbound {
                let transport = if u.udp {
                    ir::Transport::Udp
                } else {
                    ir::Transport::Tcp
                };
                for listener in gateway
                    .listeners
                    .iter()
                    .filter(|l| u32::from(l.port) == u.port && l.transport() == transport)
                {
                    let unbound = match transport {
                        ir::Transport::Tcp => &mut serving.unbound,
                        ir::Transport::Udp => &mut serving.unbound_udp,
                    };
                    unbound
                        .entry(listener.socket_addr())
                        .or_insert_with(|| BindProblem {
                            error: u.error.clone(),
                            address_not_usable: u.address_not_usable,
                        });
                }
            }
        }
    }
    serving
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatehouse_sync::{ReplicaReport, UnboundListener};
    use std::net::Ipv4Addr;
    use std::time::SystemTime;

    #[tokio::test]
    async fn only_a_change_of_the_failing_gateways_wakes_the_loop() {
        let ca = Arc::new(gatehouse_sync::Ca::generate("test"));
        let server = ConfigServer::new(ca, Default::default());
        let publisher = RemotePublisher::new(server, IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        publisher.apply(Arc::new(config())).await;
        let wakes = || {
            let p = Arc::clone(&publisher);
            async move {
                tokio::time::timeout(std::time::Duration::from_millis(50), p.changed())
                    .await
                    .is_ok()
            }
        };
        // What publishing itself changed is seen first.
        for _ in 0..3 {
            if !wakes().await {
                break;
            }
        }
        assert!(!wakes().await, "nothing left to see");
        let gw = ObjectKey::new("ns", "gw");
        publisher.set_provisioning_errors([(gw.clone(), "refused at 10:00".into())].into());
        assert!(wakes().await, "a Gateway failed");
        publisher.set_provisioning_errors([(gw.clone(), "refused at 10:01".into())].into());
        assert!(!wakes().await, "the same Gateway, another text");
        let problems = publisher.serving().not_serving;
        assert!(problems[&gw].ends_with("refused at 10:01"), "{problems:?}");
        publisher.set_provisioning_errors(BTreeMap::new());
        assert!(wakes().await, "the Gateway's objects are applied");
    }

    fn config() -> ir::Config {
        let listener = |port| ir::Listener {
            name: format!("l{port}"),
            address: IpAddr::V4(Ipv4Addr::new(127, 1, 0, 1)),
            port,
            protocol: ir::ListenerProtocol::Http,
            hostname: None,
            rules: vec![],
            virtual_hosts: vec![],
            tls: None,
            tls_routes: vec![],
            l4_route: None,
            filters: vec![],
        };
        ir::Config {
            gateways: vec![ir::Gateway {
                namespace: "ns".into(),
                name: "gw".into(),
                listeners: vec![listener(80), listener(443)],
            }],
            ..ir::Config::default()
        }
    }

    fn replica(
        acked: Option<&str>,
        rejected: Option<(&str, &str)>,
        unbound: &[u32],
    ) -> ReplicaReport {
        ReplicaReport {
            acked: acked.map(Into::into),
            rejected: rejected.map(|(v, w)| (v.into(), w.into())),
            unbound: unbound
                .iter()
                .map(|p| UnboundListener {
                    port: *p,
                    error: "Address already in use".into(),
                    address_not_usable: false,
                    address: String::new(),
                    udp: false,
                })
                .collect(),
            diagnostics: vec![],
            connected_since: SystemTime::UNIX_EPOCH,
            build: String::new(),
        }
    }

    fn reports(replicas: Vec<(&str, ReplicaReport)>) -> BTreeMap<DataPlaneIdentity, GatewayReport> {
        [(
            DataPlaneIdentity::new("ns", "gw").unwrap(),
            GatewayReport {
                published_version: Some("v2".into()),
                replicas: replicas
                    .into_iter()
                    .map(|(p, r)| (p.to_string(), r))
                    .collect(),
            },
        )]
        .into()
    }

    fn key() -> ObjectKey {
        ObjectKey::new("ns", "gw")
    }

    #[test]
    fn no_replica_is_not_serving() {
        let s = serving_of(&config(), &BTreeMap::new(), &BTreeMap::new());
        assert!(
            s.not_serving[&key()].contains("no data-plane replica"),
            "{s:?}"
        );
    }

    #[test]
    fn a_replica_on_an_old_version_is_not_serving_and_a_refusal_says_why() {
        let s = serving_of(
            &config(),
            &reports(vec![("p1", replica(Some("v1"), None, &[]))]),
            &BTreeMap::new(),
        );
        assert!(s.not_serving[&key()].contains("none has applied"), "{s:?}");
        let s = serving_of(
            &config(),
            &reports(vec![(
                "p1",
                replica(Some("v1"), Some(("v2", "bad certificate")), &[]),
            )]),
            &BTreeMap::new(),
        );
        assert!(
            s.not_serving[&key()].contains("p1 refused the configuration: bad certificate"),
            "{s:?}"
        );
    }

    #[test]
    fn one_current_replica_serves_and_its_unbound_ports_are_reported() {
        let s = serving_of(
            &config(),
            &reports(vec![
                ("p1", replica(Some("v1"), None, &[80, 443])),
                ("p2", replica(Some("v2"), None, &[443])),
            ]),
            &BTreeMap::new(),
        );
        assert!(s.not_serving.is_empty(), "{s:?}");
        let unbound: Vec<u16> = s.unbound.keys().map(|a| a.port()).collect();
        assert_eq!(
            unbound,
            vec![443],
            "only the current replica's report counts"
        );
    }

    #[test]
    fn a_provisioning_error_wins() {
        let s = serving_of(
            &config(),
            &reports(vec![("p2", replica(Some("v2"), None, &[]))]),
            &[(key(), "forbidden".to_string())].into(),
        );
        assert!(s.not_serving[&key()].contains("cannot provision the data plane: forbidden"));
    }
}
