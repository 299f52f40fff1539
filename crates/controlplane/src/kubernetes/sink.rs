//! Status to the API server, written only by the replica that holds the Lease.

use super::service::ServiceKeeper;
use super::{LeaderElection, StatusWriter};
use crate::metrics::ControlMetrics;
use crate::provision::spec::{proxy_spec, unsupported_addresses};
use crate::provision::{Desired, Provisioner};
use crate::reconcile::StatusSink;
use crate::remote::RemotePublisher;
use futures_util::future::BoxFuture;
use gatehouse_ir as ir;
use gatehouse_sync::ConfigServer;
use gatehouse_translate::{Infrastructure, Input, ObjectKey, Status};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::watch;

/// Provisioned mode: the leader keeps every Gateway's data-plane objects in step and is the
/// one replica whose sync server accepts data planes.
pub struct Provisioning {
    pub provisioner: Provisioner,
    pub publisher: Arc<RemotePublisher>,
    pub server: Arc<ConfigServer>,
}

impl Provisioning {
    async fn sync(&mut self, input: &Input, infrastructure: &BTreeMap<ObjectKey, Infrastructure>) {
        let mut desired = BTreeMap::new();
        let mut problems: BTreeMap<ObjectKey, String> = BTreeMap::new();
        for (key, infra) in infrastructure {
            let Some(uid) = input
                .gateways
                .iter()
                .find(|g| ObjectKey::of(&g.metadata) == *key)
                .and_then(|g| g.metadata.uid.clone())
            else {
                continue;
            };
            let refused = unsupported_addresses(infra);
            if !refused.is_empty() {
                problems.insert(
                    key.clone(),
                    format!("spec.addresses: {}", refused.join("; ")),
                );
            }
            desired.insert(
                key.clone(),
                Desired {
                    uid,
                    spec: proxy_spec(infra),
                },
            );
        }
        let provisioned = self.provisioner.sync(&desired).await;
        for (key, e) in provisioned.errors {
            problems.insert(key, e);
        }
        self.publisher.set_provisioning_errors(problems);
    }
}

pub struct KubeStatus {
    writer: StatusWriter,
    /// `None`: leader election is off and this replica always writes.
    leader: Option<(LeaderElection, watch::Receiver<bool>)>,
    /// The data plane's Service, when the controller keeps it.
    service: Option<ServiceKeeper>,
    provisioning: Option<Provisioning>,
}

impl KubeStatus {
    pub fn new(
        writer: StatusWriter,
        leader: Option<LeaderElection>,
        service: Option<ServiceKeeper>,
    ) -> KubeStatus {
        KubeStatus {
            writer,
            leader: leader.map(|l| {
                let rx = l.subscribe();
                (l, rx)
            }),
            service,
            provisioning: None,
        }
    }

    pub fn provisioning(mut self, provisioning: Provisioning) -> Self {
        self.provisioning = Some(provisioning);
        self
    }
}

impl StatusSink for KubeStatus {
    fn changed(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async {
            match self.leader.as_mut() {
                Some((_, rx)) => {
                    if rx.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                None => std::future::pending().await,
            }
        })
    }

    fn write<'a>(
        &'a mut self,
        input: &'a Input,
        status: Arc<Status>,
        config: &'a ir::Config,
        infrastructure: &'a BTreeMap<ObjectKey, Infrastructure>,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let leader = self.leader.as_ref().is_none_or(|(l, _)| l.is_leader());
            if let Some(p) = self.provisioning.as_ref() {
                // Data planes follow the leader: a replica that is not it sends them away.
                p.server.set_accepting(leader);
            }
            if !leader {
                // Whatever this replica queued as leader is the new leader's to write now.
                self.writer.forget_pending();
                return;
            }
            if let Some(p) = self.provisioning.as_mut() {
                p.sync(input, infrastructure).await;
            }
            if let Some(service) = self.service.as_mut() {
                service.sync(config).await;
            }
            let w = self.writer.write(input, status);
            if w.queued + w.stale > 0 {
                tracing::debug!(queued = w.queued, stale = w.stale, "status queued");
            }
        })
    }

    fn attach_metrics(&mut self, metrics: &ControlMetrics) {
        self.writer.count_in(metrics.status_writes.clone());
    }

    fn stop(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            if let Some((l, _)) = self.leader {
                l.release().await;
            }
        })
    }
}
