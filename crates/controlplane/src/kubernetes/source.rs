//! The Kubernetes source: a reflector for every kind of the registry, one consistent snapshot
//! on demand, and a change notification that coalesces bursts (no debounce timer).
//!
//! Kinds watched `Referenced` (Secrets, ConfigMaps) are not mirrored wholesale: only the
//! objects the other kinds reference are watched, each with a field selector on its namespace
//! and name, so the controller never holds every Secret of the cluster in memory.
//!
//! Every watch decodes object by object ([`Lenient`]): an object our types reject is logged and
//! left out, instead of failing its kind's whole list.

use super::echoes::{Echoes, object_ref};
use super::lenient::Lenient;
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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;

/// Shared by all watch tasks: whether the API server answers, and who to tell about changes.
struct Signals {
    changed: mpsc::Sender<()>,
    /// Cleared by a watch whose request the API server did not answer; set again only by the
    /// prober (`probe`). A watch that resumes yields nothing until an object changes, so the
    /// watches alone cannot tell that the server is back; and a count of failing watches
    /// cleared by their next event said "connected" during an outage whenever a watch
    /// started a relist (kube yields `Init` before the list request is even sent).
    connected: AtomicBool,
    /// Wakes the prober after a watch failed.
    lost: Notify,
    /// Our own status writes: their events start no pass (see `echoes.rs`).
    echoes: Arc<Echoes>,
}

impl Signals {
    fn notify(&self) {
        // A full channel already holds a pending change: this one is folded into it.
        let _ = self.changed.try_send(());
    }

    fn connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    /// A watch's request went unanswered.
    fn failed(&self, what: &str, e: &watcher::Error) {
        if self.connected.swap(false, Ordering::AcqRel) {
            tracing::warn!(
                "watching {what} failed: {e}; serving the last configuration and retrying"
            );
        } else {
            tracing::debug!("watching {what} failed: {e}");
        }
        self.lost.notify_one();
    }
}

/// How often the prober asks while the API server does not answer.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// While the API server is not known to answer, asks it once a second for one Namespace: a
/// read that reaches storage, as the watches' lists do (a `/version` answers while etcd is
/// down). The first answer restores connectivity; the watches resume on their own backoff
/// (`WatchBackoff`), within a few seconds.
async fn probe(client: Client, signals: Arc<Signals>) {
    let api = Api::<k8s_openapi::api::core::v1::Namespace>::all(client);
    let one = kube::api::ListParams::default().limit(1);
    loop {
        signals.lost.notified().await;
        while !signals.connected() {
            tokio::time::sleep(PROBE_INTERVAL).await;
            if api.list_metadata(&one).await.is_ok() {
                signals.connected.store(true, Ordering::Release);
                tracing::info!("the API server answers again; watches resume");
            }
        }
    }
}

/// Whether a watch error means the API server did not answer, or answered that it cannot
/// serve (5xx: starting, storage down). Other answers are about the request, not about the
/// server: 404 for a kind whose CRD is not installed, 403 for a kind RBAC does not grant, 410
/// for a resourceVersion too old to resume from (the watcher lists again).
fn unanswered(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.code >= 500,
        watcher::Error::WatchError(status) => status.code >= 500,
        watcher::Error::NoResourceVersion => false,
        _ => true,
    }
}

/// The pause before a failed watch tries again: 0.5 s, doubling up to 4 s, each plus up to
/// half of it again at random so that the watches of many replicas do not retry in step.
/// kube's default (client-go's) doubles up to 30 s with up to as much again at random: after
/// an API server outage of half a minute, a watch could sleep most of another minute before
/// noticing the server was back, with readiness saying "unreachable" and changes not applied
/// all that time. A retry every few seconds while the server is down is one request per
/// watched kind: cheap for one controller, and recovery is seen within 6 s.
///
/// A kind the API server does not serve (its CRD is not installed: the experimental route
/// kinds, GatehouseParameters) is looked for again every 30 s instead, as before: each try is
/// a 404 that kube's client logs as a warning.
struct WatchBackoff {
    next: Duration,
    absent: watch::Receiver<bool>,
}

impl WatchBackoff {
    const FIRST: Duration = Duration::from_millis(500);
    const MAX: Duration = Duration::from_secs(4);
    const ABSENT: Duration = Duration::from_secs(30);

    fn new(absent: watch::Receiver<bool>) -> WatchBackoff {
        WatchBackoff {
            next: Self::FIRST,
            absent,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        use std::hash::{BuildHasher, RandomState};
        let delay = if *self.absent.borrow() {
            Self::ABSENT
        } else {
            let delay = self.next;
            self.next = (delay * 2).min(Self::MAX);
            delay
        };
        // A fresh RandomState is randomly keyed: a random number without a crate for it.
        let random = RandomState::new().hash_one(delay);
        let jitter = delay.mul_f64((random % 1000) as f64 / 2000.0);
        Some(delay + jitter)
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

/// The API server answered that it does not serve the kind (404: no such resource, its CRD
/// is not installed). kube's client reports a plain-text 404 with the code only, so the code
/// is what is looked at.
fn kind_not_served(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status)) => status.code == 404,
        _ => false,
    }
}

/// Keep `writer`'s store in sync with `api`, notifying on every change, until aborted.
/// `absent` says whether the API server does not serve the kind (a 404 on list or watch).
fn spawn_reflector<K: Kind>(
    api: Api<Lenient<K>>,
    config: watcher::Config,
    writer: reflector::store::Writer<Lenient<K>>,
    signals: Arc<Signals>,
    absent: watch::Sender<bool>,
) -> JoinHandle<()> {
    let what = K::kind_name();
    tokio::spawn(async move {
        let backoff = WatchBackoff::new(absent.subscribe());
        let stream = reflector::reflector(writer, watcher(api, config)).backoff(backoff);
        futures_util::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            match event {
                // Yielded before each (re)list is requested: nothing has changed yet.
                Ok(watcher::Event::Init) => {}
                Ok(event) => {
                    match &event {
                        watcher::Event::Apply(o) => {
                            let meta = kube::Resource::meta(o);
                            let key = object_ref(K::kind_name(), meta);
                            if signals.echoes.quiet(&key, meta.resource_version.as_deref()) {
                                continue;
                            }
                        }
                        watcher::Event::Delete(o) => {
                            signals
                                .echoes
                                .deleted(&object_ref(K::kind_name(), kube::Resource::meta(o)));
                        }
                        _ => {}
                    }
                    if let watcher::Event::Apply(o) | watcher::Event::InitApply(o) = &event
                        && let Err(why) = &o.object
                    {
                        // Once per version of the object: left out of every snapshot until
                        // it changes into something that decodes.
                        tracing::warn!(
                            "{what} {}/{} cannot be read and is ignored: {why}",
                            kube::ResourceExt::namespace(o).unwrap_or_default(),
                            kube::ResourceExt::name_any(o),
                        );
                    }
                    absent.send_if_modified(std::mem::take);
                    signals.notify();
                }
                Err(e) if kind_not_served(&e) => {
                    if !absent.send_replace(true) {
                        tracing::debug!("{what} is not served (CRD not installed?): {e}");
                    }
                }
                Err(e) if unanswered(&e) => signals.failed(&what, &e),
                // A resourceVersion too old to resume from (every watch, after the API server
                // restarts): the watcher lists again, nothing is lost.
                Err(watcher::Error::WatchError(status)) if status.code == 410 => {
                    tracing::debug!("watching {what}: {status}; listing again");
                }
                Err(e) => tracing::warn!("watching {what} failed: {e}; retrying"),
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
    store: Store<Lenient<K>>,
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
        // The store's own objects, shared: a snapshot costs a pointer per object, not a copy.
        K::of_mut(input).extend(decoded(&self.store));
    }

    fn stop(&self) {
        self.task.abort();
    }
}

/// The store and the watch task of one referenced object, and whether the API server serves
/// its kind at all (a ClusterTrustBundle on a cluster without that API): an object of a kind
/// that is not served is absent, not pending, so readiness does not wait for it forever.
type OneObject<K> = (Store<Lenient<K>>, JoinHandle<()>, watch::Receiver<bool>);

/// The objects of `store` that decoded.
fn decoded<K: Kind>(store: &Store<Lenient<K>>) -> impl Iterator<Item = Arc<K>> {
    store
        .state()
        .into_iter()
        .filter_map(|o| o.object.as_ref().ok().cloned())
}

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
        watches.retain(|key, (_, task, _)| {
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
            let api = api_in::<Lenient<K>>(&self.client, &key.namespace);
            let (absent, not_served) = watch::channel(false);
            let task = spawn_reflector(api, config, writer, Arc::clone(&self.signals), absent);
            watches.insert(key, (reader, task, not_served));
        }
        K::of_mut(input).extend(watches.values().flat_map(|(store, _, _)| decoded(store)));
    }

    fn pending(&self) -> Vec<String> {
        let watches = self.watches.lock().expect("not poisoned");
        watches
            .iter()
            .filter(|(_, (store, _, not_served))| {
                !*not_served.borrow() && store.wait_until_ready().now_or_never().is_none()
            })
            .map(|(key, _)| format!("{} {key}", K::kind_name()))
            .collect()
    }

    fn wait_synced(&self) -> BoxFuture<'_, ()> {
        let stores: Vec<(Store<Lenient<K>>, watch::Receiver<bool>)> = {
            let watches = self.watches.lock().expect("not poisoned");
            watches
                .values()
                .map(|(store, _, not_served)| (store.clone(), not_served.clone()))
                .collect()
        };
        Box::pin(async move {
            for (store, mut not_served) in stores {
                // Until listed, or until the API server says the kind is not served (a 404
                // takes one round trip).
                tokio::select! {
                    _ = store.wait_until_ready() => {}
                    _ = not_served.wait_for(|absent| *absent) => {}
                }
            }
        })
    }

    fn stop(&self) {
        let mut watches = self.watches.lock().expect("not poisoned");
        for (_, (_, task, _)) in std::mem::take(&mut *watches) {
            task.abort();
        }
    }
}

/// A client for `K` in `namespace` (cluster-wide for cluster-scoped kinds).
pub(crate) fn api_in<K>(client: &Client, namespace: &str) -> Api<K>
where
    K: kube::Resource<DynamicType = (), Scope: KindScope>,
{
    struct In<'a>(&'a Client, &'a str);
    impl<K: kube::Resource<DynamicType = ()>> ScopeVisitor<K> for In<'_> {
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
    prober: JoinHandle<()>,
}

impl Drop for KubeSource {
    fn drop(&mut self) {
        for m in &self.mirrors {
            m.stop();
        }
        self.prober.abort();
    }
}

impl KubeSource {
    /// Start watching. Call [`KubeSource::ready`] before the first snapshot, so that a
    /// half-listed cluster is never mistaken for a configuration.
    pub fn start(client: Client) -> KubeSource {
        let (tx, rx) = mpsc::channel(1);
        let signals = Arc::new(Signals {
            echoes: Arc::new(Echoes::new(tx.clone())),
            changed: tx,
            connected: AtomicBool::new(true),
            lost: Notify::new(),
        });
        let prober = tokio::spawn(probe(client.clone(), Arc::clone(&signals)));
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
                            Api::<Lenient<K>>::all(self.client.clone()),
                            watcher::Config::default(),
                            writer,
                            Arc::clone(self.signals),
                            watch::channel(false).0,
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
            prober,
        }
    }

    /// Where the status writer reports its writes, so that their watch events start no pass.
    pub fn echoes(&self) -> Arc<Echoes> {
        Arc::clone(&self.signals.echoes)
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
            let names: Vec<String> = optional
                .iter()
                .filter(|m| m.wait_until_ready().now_or_never().is_none())
                .map(|m| m.kind())
                .collect();
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

    /// False from a watch request the API server did not answer until it answers again.
    pub fn connected(&self) -> bool {
        self.signals.connected()
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
            input: std::sync::Arc::new(input),
            errors: Vec::new(),
            warnings: Vec::new(),
            pending: self.mirrors.iter().flat_map(|m| m.pending()).collect(),
        }
    }

    fn connected(&self) -> Option<bool> {
        Some(KubeSource::connected(self))
    }
}

#[cfg(test)]
mod tests {
    use super::{WatchBackoff, kind_not_served, unanswered};
    use kube::core::Status;
    use kube::runtime::utils::Backoff;
    use kube::runtime::watcher;
    use std::time::Duration;

    #[test]
    fn watch_retries_back_off_to_a_few_seconds_and_start_over_after_a_success() {
        let (absent, not_served) = tokio::sync::watch::channel(false);
        let mut b = WatchBackoff::new(not_served);
        let delays: Vec<Duration> = b.by_ref().take(8).collect();
        let bases = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0, 4.0];
        for (d, base) in delays.iter().zip(bases) {
            let base = Duration::from_secs_f64(base);
            assert!(*d >= base && *d <= base.mul_f64(1.5), "{d:?} for {base:?}");
        }
        assert!(
            delays[4..].windows(2).any(|w| w[0] != w[1]),
            "jittered: {delays:?}"
        );
        b.reset();
        assert!(b.next().unwrap() <= Duration::from_millis(750));
        absent.send_replace(true);
        let slow = b.next().unwrap();
        assert!(slow >= Duration::from_secs(30), "{slow:?}");
    }

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(
            Status::failure("page not found", "Failed to parse error data")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn only_a_404_says_the_kind_is_not_served() {
        assert!(kind_not_served(&watcher::Error::InitialListFailed(api(
            404
        ))));
        assert!(kind_not_served(&watcher::Error::WatchStartFailed(api(404))));
        assert!(!kind_not_served(&watcher::Error::InitialListFailed(api(
            403
        ))));
        assert!(!kind_not_served(&watcher::Error::InitialListFailed(api(
            503
        ))));
        assert!(!kind_not_served(&watcher::Error::NoResourceVersion));
    }

    /// Connectivity is lost on what the server did not answer or could not serve, never on
    /// an answer about the request.
    #[test]
    fn transport_errors_and_5xx_are_unanswered_4xx_are_answers() {
        let transport = || kube::Error::Service("client error (Connect)".into());
        assert!(unanswered(&watcher::Error::InitialListFailed(transport())));
        assert!(unanswered(&watcher::Error::WatchFailed(transport())));
        assert!(unanswered(&watcher::Error::WatchStartFailed(api(503))));
        assert!(unanswered(&watcher::Error::WatchError(
            Status::failure("etcd", "InternalError")
                .with_code(500)
                .boxed()
        )));
        for code in [403, 404, 410] {
            assert!(!unanswered(&watcher::Error::InitialListFailed(api(code))));
        }
        assert!(!unanswered(&watcher::Error::WatchError(
            Status::failure("too old", "Expired").with_code(410).boxed()
        )));
    }
}
