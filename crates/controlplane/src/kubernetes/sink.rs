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
use std::time::Duration;
use tokio::sync::watch;

/// Provisioned mode: the leader keeps every Gateway's data-plane objects in step and is the
/// one replica whose sync server accepts data planes.
pub struct Provisioning {
    pub provisioner: Provisioner,
    pub publisher: Arc<RemotePublisher>,
    pub server: Arc<ConfigServer>,
}

impl Provisioning {
    /// Returns whether some Gateway's objects could not be applied (to be tried again).
    async fn sync(
        &mut self,
        input: &Input,
        infrastructure: &BTreeMap<ObjectKey, Infrastructure>,
    ) -> bool {
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
        let failed = !provisioned.errors.is_empty();
        for (key, e) in provisioned.errors {
            problems.insert(key, e);
        }
        self.publisher.set_provisioning_errors(problems);
        failed
    }
}

/// When a failed apply of data-plane objects (a provisioned Gateway's, or the shared data
/// plane's Service) is tried again. Nothing else would try it: the loop runs on changes, and a
/// second failure that reads like the first changes nothing (the status already says it). A
/// Gateway scaled while the API server was slow to answer stayed at its old replica count
/// until some unrelated change came along; a listener added then stayed off the Service.
#[derive(Debug)]
struct ProvisionRetry {
    next: Duration,
    at: Option<tokio::time::Instant>,
}

impl ProvisionRetry {
    const FIRST: Duration = Duration::from_millis(500);
    const MAX: Duration = Duration::from_secs(30);

    fn new() -> Self {
        ProvisionRetry {
            next: Self::FIRST,
            at: None,
        }
    }

    /// After a sync: on failure the next try is due after the current delay, which doubles
    /// up to [`Self::MAX`]; on success nothing is due and the delay starts over.
    fn after(&mut self, failed: bool) {
        if failed {
            self.at = Some(tokio::time::Instant::now() + self.next);
            self.next = (self.next * 2).min(Self::MAX);
        } else {
            *self = Self::new();
        }
    }
}

pub struct KubeStatus {
    writer: StatusWriter,
    /// `None`: leader election is off and this replica always writes.
    leader: Option<(LeaderElection, watch::Receiver<bool>)>,
    /// The data plane's Service, when the controller keeps it.
    service: Option<ServiceKeeper>,
    provisioning: Option<Provisioning>,
    retry: ProvisionRetry,
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
            retry: ProvisionRetry::new(),
        }
    }

    pub fn provisioning(mut self, provisioning: Provisioning) -> Self {
        self.provisioning = Some(provisioning);
        self
    }
}

impl StatusSink for KubeStatus {
    fn changed(&mut self) -> BoxFuture<'_, ()> {
        let retry_at = self.retry.at;
        Box::pin(async move {
            let leadership = async {
                match self.leader.as_mut() {
                    Some((_, rx)) => {
                        if rx.changed().await.is_err() {
                            std::future::pending::<()>().await;
                        }
                    }
                    None => std::future::pending().await,
                }
            };
            let retry = async {
                match retry_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = leadership => {}
                _ = retry => {}
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
                self.retry = ProvisionRetry::new();
                if let Some(service) = self.service.as_mut() {
                    service.stand_down();
                }
                return;
            }
            let mut failed = false;
            if let Some(p) = self.provisioning.as_mut() {
                failed |= p.sync(input, infrastructure).await;
            }
            if let Some(service) = self.service.as_mut() {
                failed |= !service.sync(config).await;
            }
            self.retry.after(failed);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_failed_apply_is_retried_sooner_first_and_no_longer_once_it_succeeds() {
        let mut r = ProvisionRetry::new();
        assert_eq!(r.at, None, "nothing is due before a failure");
        let mut delays = Vec::new();
        for _ in 0..9 {
            let now = tokio::time::Instant::now();
            r.after(true);
            delays.push(r.at.expect("a failure makes a retry due") - now);
        }
        let secs: Vec<f64> = delays.iter().map(Duration::as_secs_f64).collect();
        assert_eq!(secs, [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]);
        r.after(false);
        assert_eq!(r.at, None, "a success leaves nothing due");
        let now = tokio::time::Instant::now();
        r.after(true);
        assert_eq!(
            r.at.unwrap() - now,
            ProvisionRetry::FIRST,
            "and starts the delays over"
        );
    }
}
