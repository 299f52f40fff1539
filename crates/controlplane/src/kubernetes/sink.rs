//! Status to the API server, written only by the replica that holds the Lease.

use super::service::ServiceKeeper;
use super::{LeaderElection, StatusWriter, Written};
use crate::reconcile::StatusSink;
use futures_util::future::BoxFuture;
use gatehouse_ir as ir;
use gatehouse_translate::{Input, Status};
use tokio::sync::watch;

pub struct KubeStatus {
    writer: StatusWriter,
    /// `None`: leader election is off and this replica always writes.
    leader: Option<(LeaderElection, watch::Receiver<bool>)>,
    /// The data plane's Service, when the controller keeps it.
    service: Option<ServiceKeeper>,
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
        }
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
        status: Status,
        config: &'a ir::Config,
    ) -> BoxFuture<'a, Option<Written>> {
        Box::pin(async move {
            if !self.leader.as_ref().is_none_or(|(l, _)| l.is_leader()) {
                return None;
            }
            if let Some(service) = self.service.as_mut() {
                service.sync(config).await;
            }
            let w = self.writer.write(input, status).await;
            if w.patched + w.conflicts + w.failed > 0 {
                tracing::debug!(
                    patched = w.patched,
                    conflicts = w.conflicts,
                    failed = w.failed,
                    "status written"
                );
            }
            Some(w)
        })
    }

    fn stop(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            if let Some((l, _)) = self.leader {
                l.release().await;
            }
        })
    }
}
