//! The Kubernetes source: a reflector for every kind of the registry, one consistent snapshot
//! on demand, and a change notification that coalesces bursts (no debounce timer).
//!
//! Kinds watched `Referenced` (Secrets, ConfigMaps) are not mirrored wholesale: only the
//! objects the other kinds reference are watched, each with a field selector on its namespace
//! and name, so the controller never holds every Secret of the cluster in memory.

use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};
use gatehouse_translate::kinds::{
    Kind, KindScope, KindVisitor, ScopeVisitor, Watch, for_each_kind,
};
use gatehouse_translate::{Input, ObjectKey};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Shared by all watch tasks: whether the API answers, and who to tell about changes.
struct Signals {
    changed: mpsc::Sender<()>,
    failing: AtomicUsize,
    connected: AtomicBool,
}

impl Signals {
    fn notify(&self) {
        // A full channel already holds a pending change: this one is folded into it.
        let _ = self.changed.try_send(());
    }

    fn ok(&self, was_failing: &mut bool) {
        if *was_failing {
            *was_failing = false;
            if self.failing.fetch_sub(1, Ordering::AcqRel) == 1 {
                self.connected.store(true, Ordering::Release);
                tracing::info!("the API server answers again; watches resumed");
            }
        }
    }

    fn err(&self, was_failing: &mut bool, what: &str, e: &watcher::Error) {
        if !*was_failing {
            *was_failing = true;
            if self.failing.fetch_add(1, Ordering::AcqRel) == 0 {
                self.connected.store(false, Ordering::Release);
                tracing::warn!(
                    "watching {what} failed: {e}; serving the last configuration and retrying with backoff"
                );
            } else {
                tracing::debug!("watching {what} failed: {e}");
            }
        }
    }
}

/// Keep `writer`'s store in sync with `api`, notifying on every change, until aborted.
fn spawn_reflector<K: Kind>(
    api: Api<K>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
    signals: Arc<Signals>,
) -> JoinHandle<()> {
    let what = K::kind_name();
    tokio::spawn(async move {
        let mut was_failing = false;
        let stream = reflector::reflector(writer, watcher(api, config)).default_backoff();
        futures_util::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => {
                    signals.ok(&mut was_failing);
                    signals.notify();
                }
                Err(e) => signals.err(&mut was_failing, &what, &e),
            }
        }
    })
}

/// One kind's objects as the source keeps them, whatever the kind.
trait Mirror: Send + Sync {
    fn kind(&self) -> String;
    /// `Some(required)` for kinds listed wholesale, `None` for referenced ones.
    fn required(&self) -> Option<bool>;
    fn wait_until_ready(&self) -> BoxFuture<'_, bool>;
    /// Adds the kind's objects to `input`. Referenced kinds first adjust their watches to
    /// what `input` references (a newly referenced object arrives with a later change).
    fn fill(&self, input: &mut Input);
    /// Referenced objects whose watch has not listed yet (`Secret ns/name`).
    fn pending(&self) -> Vec<String> {
        Vec::new()
    }
    /// Resolves once every current watch has listed.
    fn wait_synced(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
    fn stop(&self);
}

/// Every object of a kind, cluster-wide.
struct All<K: Kind> {
    store: Store<K>,
    task: JoinHandle<()>,
    required: bool,
}

impl<K: Kind> Mirror for All<K> {
    fn kind(&self) -> String {
        K::kind_name()
    }

    fn required(&self) -> Option<bool> {
        Some(self.required)
    }

    fn wait_until_ready(&self) -> BoxFuture<'_, bool> {
        Box::pin(async { self.store.wait_until_ready().await.is_ok() })
    }

    fn fill(&self, input: &mut Input) {
        K::of_mut(input).extend(self.store.state().into_iter().map(|o| (*o).clone()));
    }

    fn stop(&self) {
        self.task.abort();
    }
}

/// The store and the watch task of one referenced object.
type OneObject<K> = (Store<K>, JoinHandle<()>);

/// Only the objects of a kind that the rest of the snapshot references, each watched alone.
struct Referenced<K: Kind> {
    wanted: fn(&Input) -> BTreeSet<ObjectKey>,
    client: Client,
    signals: Arc<Signals>,
    watches: Mutex<BTreeMap<ObjectKey, OneObject<K>>>,
}

impl<K: Kind> Mirror for Referenced<K> {
    fn kind(&self) -> String {
        K::kind_name()
    }

    fn required(&self) -> Option<bool> {
        None
    }

    fn wait_until_ready(&self) -> BoxFuture<'_, bool> {
        Box::pin(async { true })
    }

    fn fill(&self, input: &mut Input) {
        let wanted = (self.wanted)(input);
        let mut watches = self.watches.lock().expect("not poisoned");
        watches.retain(|key, (_, task)| {
            let keep = wanted.contains(key);
            if !keep {
                task.abort();
            }
            keep
        });
        for key in wanted {
            if watches.contains_key(&key) {
                continue;
            }
            let (reader, writer) = reflector::store();
            let config = watcher::Config::default().fields(&format!("metadata.name={}", key.name));
            // In the object's namespace: RBAC may grant reading Secrets in some namespaces only.
            let api = api_in::<K>(&self.client, &key.namespace);
            let task = spawn_reflector(api, config, writer, Arc::clone(&self.signals));
            watches.insert(key, (reader, task));
        }
        K::of_mut(input).extend(
            watches
                .values()
                .flat_map(|(store, _)| store.state())
                .map(|o| (*o).clone()),
        );
    }

    fn pending(&self) -> Vec<String> {
        let watches = self.watches.lock().expect("not poisoned");
        watches
            .iter()
            .filter(|(_, (store, _))| store.wait_until_ready().now_or_never().is_none())
            .map(|(key, _)| format!("{} {key}", K::kind_name()))
            .collect()
    }

    fn wait_synced(&self) -> BoxFuture<'_, ()> {
        let stores: Vec<Store<K>> = {
            let watches = self.watches.lock().expect("not poisoned");
            watches.values().map(|(store, _)| store.clone()).collect()
        };
        Box::pin(async move {
            for store in stores {
                let _ = store.wait_until_ready().await;
            }
        })
    }

    fn stop(&self) {
        let mut watches = self.watches.lock().expect("not poisoned");
        for (_, (_, task)) in std::mem::take(&mut *watches) {
            task.abort();
        }
    }
}

/// A client for `K` in `namespace` (cluster-wide for cluster-scoped kinds).
pub(crate) fn api_in<K: Kind>(client: &Client, namespace: &str) -> Api<K> {
    struct In<'a>(&'a Client, &'a str);
    impl<K: Kind> ScopeVisitor<K> for In<'_> {
        type Output = Api<K>;
        fn namespaced(self) -> Api<K>
        where
            K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        {
            Api::namespaced(self.0.clone(), self.1)
        }
        fn cluster(self) -> Api<K>
        where
            K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope>,
        {
            Api::all(self.0.clone())
        }
    }
    <K::Scope as KindScope>::with_scope::<K, _>(In(client, namespace))
}

/// How long a snapshot waits for the watches of newly referenced objects to list.
const REFERENCED_SYNC_WAIT: Duration = Duration::from_secs(5);

pub struct KubeSource {
    client: Client,
    signals: Arc<Signals>,
    changes: mpsc::Receiver<()>,
    /// In registry order; referenced kinds are filled after the others.
    mirrors: Vec<Box<dyn Mirror>>,
}

impl Drop for KubeSource {
    fn drop(&mut self) {
        for m in &self.mirrors {
            m.stop();
        }
    }
}

impl KubeSource {
    /// Start watching. Call [`KubeSource::ready`] before the first snapshot, so that a
    /// half-listed cluster is never mistaken for a configuration.
    pub fn start(client: Client) -> KubeSource {
        let (tx, rx) = mpsc::channel(1);
        let signals = Arc::new(Signals {
            changed: tx,
            failing: AtomicUsize::new(0),
            connected: AtomicBool::new(true),
        });
        struct Start<'a> {
            client: &'a Client,
            signals: &'a Arc<Signals>,
            mirrors: Vec<Box<dyn Mirror>>,
        }
        impl KindVisitor for Start<'_> {
            fn visit<K: Kind>(&mut self) {
                let mirror: Box<dyn Mirror> = match K::WATCH {
                    Watch::All { required } => {
                        let (store, writer) = reflector::store();
                        let task = spawn_reflector(
                            Api::<K>::all(self.client.clone()),
                            watcher::Config::default(),
                            writer,
                            Arc::clone(self.signals),
                        );
                        Box::new(All {
                            store,
                            task,
                            required,
                        })
                    }
                    Watch::Referenced(wanted) => Box::new(Referenced::<K> {
                        wanted,
                        client: self.client.clone(),
                        signals: Arc::clone(self.signals),
                        watches: Mutex::new(BTreeMap::new()),
                    }),
                };
                self.mirrors.push(mirror);
            }
        }
        let mut start = Start {
            client: &client,
            signals: &signals,
            mirrors: Vec::new(),
        };
        for_each_kind(&mut start);
        let mut mirrors = start.mirrors;
        mirrors.sort_by_key(|m| m.required().is_none());
        KubeSource {
            client,
            signals,
            changes: rx,
            mirrors,
        }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Wait until the kinds Gatehouse cannot work without have been listed once. Optional
    /// kinds (TLSRoute, BackendTLSPolicy, ReferenceGrant) may have no CRD installed; they are
    /// given `optional_wait` and then treated as empty until they appear.
    pub async fn ready(&self, optional_wait: Duration) -> anyhow::Result<()> {
        for m in self.mirrors.iter().filter(|m| m.required() == Some(true)) {
            if !m.wait_until_ready().await {
                anyhow::bail!("the watch of {} stopped before listing", m.kind());
            }
        }
        let optional: Vec<&dyn Mirror> = self
            .mirrors
            .iter()
            .filter(|m| m.required() == Some(false))
            .map(AsRef::as_ref)
            .collect();
        let all = futures_util::future::join_all(optional.iter().map(|m| m.wait_until_ready()));
        if tokio::time::timeout(optional_wait, all).await.is_err() {
            let names: Vec<String> = optional.iter().map(|m| m.kind()).collect();
            tracing::warn!(
                "some of {} could not be listed (CRD not installed?); continuing without them",
                names.join(", ")
            );
        }
        Ok(())
    }

    /// Waits for the next change (returns at once if one is pending). Cancel-safe.
    pub async fn changed(&mut self) {
        if self.changes.recv().await.is_none() {
            std::future::pending::<()>().await;
        }
    }

    /// False while any watch is failing (the API server is unreachable or refusing).
    pub fn connected(&self) -> bool {
        self.signals.connected.load(Ordering::Acquire)
    }

    /// The current objects, and the Secrets/ConfigMaps they reference.
    pub fn snapshot(&self) -> Input {
        let mut input = Input::default();
        for m in &self.mirrors {
            m.fill(&mut input);
        }
        input
    }
}

impl crate::source::Source for KubeSource {
    /// The kinds Gatehouse cannot work without must list within a minute.
    async fn ready(&mut self) -> anyhow::Result<()> {
        use anyhow::Context as _;
        tokio::time::timeout(
            Duration::from_secs(60),
            KubeSource::ready(self, Duration::from_secs(5)),
        )
        .await
        .context("the Kubernetes API did not list the Gateway API objects within 60s")?
    }

    async fn changed(&mut self) {
        KubeSource::changed(self).await;
    }

    /// Blocks (briefly) for the watches of newly referenced objects, so that a Secret is
    /// read before the listener that needs it is first translated: without the wait the
    /// listener would say InvalidCertificateRef for one generation, and readiness would turn
    /// green before its certificate serves.
    fn snapshot(&mut self) -> crate::source::SourceSnapshot {
        let mut input = KubeSource::snapshot(self);
        let unsynced = self.mirrors.iter().any(|m| !m.pending().is_empty());
        if unsynced {
            let all = futures_util::future::join_all(self.mirrors.iter().map(|m| m.wait_synced()));
            let _ = tokio::runtime::Handle::current()
                .block_on(async { tokio::time::timeout(REFERENCED_SYNC_WAIT, all).await });
            input = KubeSource::snapshot(self);
        }
        crate::source::SourceSnapshot {
            input,
            errors: Vec::new(),
            warnings: Vec::new(),
            pending: self.mirrors.iter().flat_map(|m| m.pending()).collect(),
        }
    }

    fn connected(&self) -> Option<bool> {
        Some(KubeSource::connected(self))
    }
}
