//! The Kubernetes source: reflectors of every kind translate reads, one consistent snapshot
//! on demand, and a change notification that coalesces bursts (no debounce timer).
//!
//! Secrets and ConfigMaps are not mirrored wholesale: only the ones that Gateways and
//! BackendTLSPolicies reference are watched, each with a name field selector, so the
//! controller never holds every Secret of the cluster in memory.

use futures_util::StreamExt;
use gatehouse_translate::{Input, ObjectKey};
use gateway_api::apis::standard::{
    backendtlspolicies::BackendTlsPolicy, gatewayclasses::GatewayClass, gateways::Gateway,
    httproutes::HttpRoute, referencegrants::ReferenceGrant, tlsroutes::TlsRoute,
};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
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
fn spawn_reflector<K>(
    api: Api<K>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
    signals: Arc<Signals>,
) -> JoinHandle<()>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let what = K::kind(&Default::default()).to_string();
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

fn watch_all<K>(
    client: &Client,
    signals: &Arc<Signals>,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, writer) = reflector::store();
    tasks.push(spawn_reflector(
        Api::<K>::all(client.clone()),
        watcher::Config::default(),
        writer,
        Arc::clone(signals),
    ));
    reader
}

/// Watches of single named objects (referenced Secrets and ConfigMaps).
struct Named<K: Resource + Clone + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    watches: BTreeMap<ObjectKey, (Store<K>, JoinHandle<()>)>,
}

impl<K> Named<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    fn new() -> Self {
        Named {
            watches: BTreeMap::new(),
        }
    }

    /// Watch exactly `wanted`: start what is new, stop what is no longer referenced.
    fn set(&mut self, wanted: &BTreeSet<ObjectKey>, client: &Client, signals: &Arc<Signals>) {
        self.watches.retain(|key, (_, task)| {
            let keep = wanted.contains(key);
            if !keep {
                task.abort();
            }
            keep
        });
        for key in wanted {
            if self.watches.contains_key(key) {
                continue;
            }
            let (reader, writer) = reflector::store();
            let api = Api::<K>::namespaced(client.clone(), &key.namespace);
            let config = watcher::Config::default().fields(&format!("metadata.name={}", key.name));
            let task = spawn_reflector(api, config, writer, Arc::clone(signals));
            self.watches.insert(key.clone(), (reader, task));
        }
    }

    fn objects(&self) -> Vec<K> {
        self.watches
            .values()
            .flat_map(|(store, _)| store.state())
            .map(|o| (*o).clone())
            .collect()
    }
}

pub struct KubeSource {
    client: Client,
    signals: Arc<Signals>,
    changes: mpsc::Receiver<()>,
    tasks: Vec<JoinHandle<()>>,
    gateway_classes: Store<GatewayClass>,
    gateways: Store<Gateway>,
    http_routes: Store<HttpRoute>,
    tls_routes: Store<TlsRoute>,
    reference_grants: Store<ReferenceGrant>,
    backend_tls_policies: Store<BackendTlsPolicy>,
    services: Store<Service>,
    endpoint_slices: Store<EndpointSlice>,
    namespaces: Store<Namespace>,
    secrets: Mutex<Named<Secret>>,
    config_maps: Mutex<Named<ConfigMap>>,
}

impl Drop for KubeSource {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        for (_, t) in self
            .secrets
            .get_mut()
            .map(|s| std::mem::take(&mut s.watches))
            .unwrap_or_default()
            .into_values()
        {
            t.abort();
        }
        for (_, t) in self
            .config_maps
            .get_mut()
            .map(|s| std::mem::take(&mut s.watches))
            .unwrap_or_default()
            .into_values()
        {
            t.abort();
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
        let mut tasks = Vec::new();
        KubeSource {
            gateway_classes: watch_all(&client, &signals, &mut tasks),
            gateways: watch_all(&client, &signals, &mut tasks),
            http_routes: watch_all(&client, &signals, &mut tasks),
            tls_routes: watch_all(&client, &signals, &mut tasks),
            reference_grants: watch_all(&client, &signals, &mut tasks),
            backend_tls_policies: watch_all(&client, &signals, &mut tasks),
            services: watch_all(&client, &signals, &mut tasks),
            endpoint_slices: watch_all(&client, &signals, &mut tasks),
            namespaces: watch_all(&client, &signals, &mut tasks),
            secrets: Mutex::new(Named::new()),
            config_maps: Mutex::new(Named::new()),
            client,
            signals,
            changes: rx,
            tasks,
        }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Wait until the kinds Gatehouse cannot work without have been listed once. Optional
    /// kinds (TLSRoute, BackendTLSPolicy, ReferenceGrant) may have no CRD installed; they are
    /// given `optional_wait` and then treated as empty until they appear.
    pub async fn ready(&self, optional_wait: Duration) -> anyhow::Result<()> {
        self.gateway_classes.wait_until_ready().await?;
        self.gateways.wait_until_ready().await?;
        self.http_routes.wait_until_ready().await?;
        self.services.wait_until_ready().await?;
        self.endpoint_slices.wait_until_ready().await?;
        self.namespaces.wait_until_ready().await?;
        let optional = async {
            let _ = self.tls_routes.wait_until_ready().await;
            let _ = self.reference_grants.wait_until_ready().await;
            let _ = self.backend_tls_policies.wait_until_ready().await;
        };
        if tokio::time::timeout(optional_wait, optional).await.is_err() {
            tracing::warn!(
                "TLSRoute, ReferenceGrant or BackendTLSPolicy could not be listed (CRD not installed?); continuing without them"
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

    /// The current objects, and the Secrets/ConfigMaps they reference (whose watches are
    /// adjusted here: a newly referenced object arrives with a later change notification).
    pub fn snapshot(&self) -> Input {
        fn all<K: Resource + Clone>(s: &Store<K>) -> Vec<K>
        where
            K::DynamicType: Eq + std::hash::Hash + Clone,
        {
            s.state().into_iter().map(|o| (*o).clone()).collect()
        }
        let mut input = Input {
            gateway_classes: all(&self.gateway_classes),
            gateways: all(&self.gateways),
            http_routes: all(&self.http_routes),
            tls_routes: all(&self.tls_routes),
            reference_grants: all(&self.reference_grants),
            backend_tls_policies: all(&self.backend_tls_policies),
            services: all(&self.services),
            endpoint_slices: all(&self.endpoint_slices),
            namespaces: all(&self.namespaces),
            secrets: Vec::new(),
            config_maps: Vec::new(),
        };
        let (secrets, config_maps) = referenced(&input);
        let mut s = self.secrets.lock().expect("not poisoned");
        s.set(&secrets, &self.client, &self.signals);
        input.secrets = s.objects();
        drop(s);
        let mut c = self.config_maps.lock().expect("not poisoned");
        c.set(&config_maps, &self.client, &self.signals);
        input.config_maps = c.objects();
        input
    }
}

/// Secrets and ConfigMaps that Gateways and BackendTLSPolicies refer to.
pub fn referenced(input: &Input) -> (BTreeSet<ObjectKey>, BTreeSet<ObjectKey>) {
    let mut secrets = BTreeSet::new();
    let mut config_maps = BTreeSet::new();
    for gw in &input.gateways {
        let ns = gw
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        for l in &gw.spec.listeners {
            for r in l
                .tls
                .iter()
                .flat_map(|t| t.certificate_refs.iter().flatten())
            {
                if r.kind.as_deref().unwrap_or("Secret") == "Secret"
                    && r.group.as_deref().unwrap_or("").is_empty()
                {
                    secrets.insert(ObjectKey::new(
                        r.namespace.clone().unwrap_or_else(|| ns.clone()),
                        r.name.clone(),
                    ));
                }
            }
        }
        let tls = gw.spec.tls.as_ref();
        if let Some(r) = tls
            .and_then(|t| t.backend.as_ref())
            .and_then(|b| b.client_certificate_ref.as_ref())
        {
            secrets.insert(ObjectKey::new(
                r.namespace.clone().unwrap_or_else(|| ns.clone()),
                r.name.clone(),
            ));
        }
        if let Some(f) = tls.and_then(|t| t.frontend.as_ref()) {
            let mut add = |v: serde_json::Value| {
                for r in v
                    .get("caCertificateRefs")
                    .and_then(|r| r.as_array())
                    .into_iter()
                    .flatten()
                {
                    if r.get("kind").and_then(|k| k.as_str()) == Some("ConfigMap") {
                        let name = r.get("name").and_then(|n| n.as_str()).unwrap_or_default();
                        let rns = r.get("namespace").and_then(|n| n.as_str()).unwrap_or(&ns);
                        config_maps.insert(ObjectKey::new(rns, name));
                    }
                }
            };
            if let Some(v) = &f.default.validation {
                add(serde_json::to_value(v).unwrap_or_default());
            }
            for p in f.per_port.iter().flatten() {
                if let Some(v) = &p.tls.validation {
                    add(serde_json::to_value(v).unwrap_or_default());
                }
            }
        }
    }
    for p in &input.backend_tls_policies {
        let ns = p
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        for r in p.spec.validation.ca_certificate_refs.iter().flatten() {
            if r.kind == "ConfigMap" && r.group.is_empty() {
                config_maps.insert(ObjectKey::new(ns.clone(), r.name.clone()));
            }
        }
    }
    (secrets, config_maps)
}
