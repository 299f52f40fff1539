//! What the control plane knows per Gateway: the snapshot to serve (a watch channel, so every
//! stream reads the latest when it can send and stale snapshots are never queued) and what
//! each connected replica reports.

use super::{GatewayReport, ReplicaReport};
use crate::identity::DataPlaneIdentity;
use crate::{compression, version};
use bytes::Bytes;
use gatehouse_ir as ir;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;
use tokio::sync::{Notify, watch};

/// What a Gateway's streams should serve.
#[derive(Clone, Debug)]
pub(crate) enum Published {
    /// Nothing published yet: streams wait.
    Pending,
    Snapshot(Arc<Snapshot>),
    /// The Gateway is gone: its streams close.
    Removed,
}

#[derive(Debug)]
pub(crate) struct Snapshot {
    pub version: String,
    pub config: Arc<ir::Config>,
    pub json: Bytes,
    /// `json` gzip-compressed, for the streams whose data plane reads `config_gzip`.
    pub gzip: Bytes,
}

struct GatewayEntry {
    published: watch::Sender<Published>,
    /// By pod. A pod that reconnects before its old stream is noticed dead replaces the old
    /// stream's entry; `stream` tells the old stream not to remove the new one's.
    replicas: BTreeMap<String, Replica>,
}

impl GatewayEntry {
    fn new() -> Self {
        GatewayEntry {
            published: watch::Sender::new(Published::Pending),
            replicas: BTreeMap::new(),
        }
    }
}

struct Replica {
    stream: u64,
    report: ReplicaReport,
}

/// One stream's registration: how it reaches its replica's report.
#[derive(Clone, Debug)]
pub(crate) struct StreamKey {
    pub identity: DataPlaneIdentity,
    pub pod: String,
    pub id: u64,
}

#[derive(Default)]
pub(crate) struct Registry {
    gateways: Mutex<BTreeMap<DataPlaneIdentity, GatewayEntry>>,
    changed: Notify,
    next_stream: AtomicU64,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<DataPlaneIdentity, GatewayEntry>> {
        // A panic while holding the lock leaves plain data behind, still consistent enough to
        // report and serve.
        self.gateways.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes every current waiter, and the next one if nobody waits right now, so a change
    /// between a caller's `reports()` and its next `changed()` is not lost.
    fn notify(&self) {
        self.changed.notify_waiters();
        self.changed.notify_one();
    }

    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    pub fn publish(&self, identity: &DataPlaneIdentity, config: Option<Arc<ir::Config>>) {
        let Some(config) = config else {
            if let Some(entry) = self.lock().remove(identity) {
                entry.published.send_replace(Published::Removed);
                tracing::info!(gateway = %identity, "Gateway removed: its data-plane streams close");
            }
            self.notify();
            return;
        };
        let current = self.current(identity);
        if let Some(current) = &current
            && (Arc::ptr_eq(&current.config, &config) || *current.config == *config)
        {
            return;
        }
        // Serialise outside the lock: a large configuration must not stall the streams'
        // reports.
        let (json, version) = version::encode(&config);
        if current.is_some_and(|c| c.version == version) {
            return;
        }
        let gzip = compression::gzip(&json);
        tracing::debug!(gateway = %identity, %version, bytes = json.len(), gzip_bytes = gzip.len(), "snapshot published");
        let snapshot = Arc::new(Snapshot {
            version,
            config,
            json: Bytes::from(json),
            gzip: Bytes::from(gzip),
        });
        self.lock()
            .entry(identity.clone())
            .or_insert_with(GatewayEntry::new)
            .published
            .send_replace(Published::Snapshot(snapshot));
        self.notify();
    }

    fn current(&self, identity: &DataPlaneIdentity) -> Option<Arc<Snapshot>> {
        match &*self.lock().get(identity)?.published.borrow() {
            Published::Snapshot(snapshot) => Some(snapshot.clone()),
            Published::Pending | Published::Removed => None,
        }
    }

    /// Adds a replica's report; the receiver follows its Gateway's snapshots.
    pub fn register(
        &self,
        identity: &DataPlaneIdentity,
        pod: &str,
        report: ReplicaReport,
    ) -> (StreamKey, watch::Receiver<Published>) {
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let receiver = {
            let mut gateways = self.lock();
            let entry = gateways
                .entry(identity.clone())
                .or_insert_with(GatewayEntry::new);
            entry
                .replicas
                .insert(pod.to_string(), Replica { stream: id, report });
            entry.published.subscribe()
        };
        self.notify();
        let key = StreamKey {
            identity: identity.clone(),
            pod: pod.to_string(),
            id,
        };
        (key, receiver)
    }

    /// Changes a replica's report, if the stream still owns it.
    pub fn update(&self, key: &StreamKey, change: impl FnOnce(&mut ReplicaReport)) {
        {
            let mut gateways = self.lock();
            let Some(replica) = gateways
                .get_mut(&key.identity)
                .and_then(|entry| entry.replicas.get_mut(&key.pod))
                .filter(|replica| replica.stream == key.id)
            else {
                return;
            };
            change(&mut replica.report);
        }
        self.notify();
    }

    /// Removes the stream's report; forgets a Gateway that has neither a snapshot nor
    /// replicas any more, so identities that only ever connected leave nothing behind.
    pub fn unregister(&self, key: &StreamKey) {
        {
            let mut gateways = self.lock();
            let Some(entry) = gateways.get_mut(&key.identity) else {
                return;
            };
            if entry
                .replicas
                .get(&key.pod)
                .is_some_and(|replica| replica.stream == key.id)
            {
                entry.replicas.remove(&key.pod);
            }
            let unused = entry.replicas.is_empty()
                && matches!(*entry.published.borrow(), Published::Pending);
            if unused {
                gateways.remove(&key.identity);
            }
        }
        self.notify();
    }

    pub fn reports(&self) -> BTreeMap<DataPlaneIdentity, GatewayReport> {
        self.lock()
            .iter()
            .map(|(identity, entry)| {
                let published_version = match &*entry.published.borrow() {
                    Published::Snapshot(snapshot) => Some(snapshot.version.clone()),
                    Published::Pending | Published::Removed => None,
                };
                let replicas = entry
                    .replicas
                    .iter()
                    .map(|(pod, replica)| (pod.clone(), replica.report.clone()))
                    .collect();
                let report = GatewayReport {
                    published_version,
                    replicas,
                };
                (identity.clone(), report)
            })
            .collect()
    }

    pub fn connected(&self) -> usize {
        self.lock().values().map(|entry| entry.replicas.len()).sum()
    }
}

impl ReplicaReport {
    pub(crate) fn new(build: String, serving: Option<String>) -> Self {
        ReplicaReport {
            acked: serving,
            rejected: None,
            unbound: Vec::new(),
            diagnostics: Vec::new(),
            connected_since: SystemTime::now(),
            build,
        }
    }
}
