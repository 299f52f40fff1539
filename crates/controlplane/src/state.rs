//! What the control plane publishes: the configuration being served, its status and its
//! problems, for the admin endpoint, the CLI and the tests.

use crate::metrics::ControlMetrics;
use arc_swap::ArcSwap;
use gatehouse_ir as ir;
use gatehouse_translate::{Input, RouteStatus, Status};
use prometheus_client::registry::Registry;
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI8, Ordering};
use tokio::sync::watch;

/// What the gateway serves right now.
#[derive(Debug, Default)]
pub struct Published {
    /// Counts applied configuration changes (a reload that changes nothing keeps it).
    pub generation: u64,
    pub config: Arc<ir::Config>,
    /// Shared with the status writer: a pass that reuses the last translation hands it the
    /// same status without copying it, and the writer can tell.
    pub status: Arc<Status>,
    /// What each route status of `status` was stamped from, in key order: translate's own
    /// `Arc`s, which a route whose translation is reused hands back on the next pass. Stamping
    /// then knows such a route's status by pointer ([`gatehouse_translate::stamp_status_since`]).
    pub unstamped_routes: Vec<Arc<RouteStatus>>,
    /// The snapshot `status` was computed from. It shares its objects with the source, so
    /// keeping it costs a pointer per object; [`Published::objects`] builds the report from it
    /// when asked, instead of every pass building (and holding) a JSON copy of every object.
    pub input: Arc<Input>,
    /// Source errors (`file:line: message`); what they concern serves its last good content.
    pub errors: Vec<String>,
    /// Source warnings: problems that lose nothing (an unknown field, a foreign kind).
    pub warnings: Vec<String>,
    /// Listener addresses that could not be bound.
    pub bind_errors: Vec<String>,
    /// Problems the data plane contained instead of rejecting the configuration.
    pub diagnostics: Vec<String>,
}

impl Published {
    /// The same configuration, status and messages, computed from objects that read the same
    /// as `input` (a pass that reused its translation): the report shows the objects as they
    /// are now, and the versions they replaced are not kept alive here.
    pub fn with_input(&self, input: Arc<Input>) -> Published {
        Published {
            generation: self.generation,
            config: Arc::clone(&self.config),
            status: Arc::clone(&self.status),
            unstamped_routes: self.unstamped_routes.clone(),
            input,
            errors: self.errors.clone(),
            warnings: self.warnings.clone(),
            bind_errors: self.bind_errors.clone(),
            diagnostics: self.diagnostics.clone(),
        }
    }

    /// The objects Gatehouse owns, with status (`kubectl get -o yaml` shape).
    pub fn objects(&self) -> Vec<Value> {
        crate::status_report::objects(&self.input, &self.status)
    }
}

/// Shared between the reconcile loop (the only writer) and its readers.
pub struct ControlState {
    pub published: ArcSwap<Published>,
    /// The first configuration was applied.
    started: AtomicBool,
    /// What keeps the configuration from serving completely (unbound listeners, referenced
    /// objects not read yet); readiness waits for it to be empty.
    missing: ArcSwap<Vec<String>>,
    /// Shutting down: readiness fails so that load balancers stop sending here.
    draining: AtomicBool,
    /// -1: the source has nothing remote to reach; 0/1: whether it reaches it.
    connected: AtomicI8,
    /// What `connected` is about, for readiness text: the Kubernetes API, or (proxy mode)
    /// the control plane.
    remote_name: std::sync::OnceLock<&'static str>,
    pub metrics: ControlMetrics,
    generation_tx: watch::Sender<u64>,
}

impl ControlState {
    pub fn new(registry: &mut Registry) -> Arc<ControlState> {
        let (generation_tx, _) = watch::channel(0);
        Arc::new(ControlState {
            published: ArcSwap::from_pointee(Published::default()),
            started: AtomicBool::new(false),
            missing: ArcSwap::from_pointee(Vec::new()),
            draining: AtomicBool::new(false),
            connected: AtomicI8::new(-1),
            remote_name: std::sync::OnceLock::new(),
            metrics: ControlMetrics::new(registry),
            generation_tx,
        })
    }

    /// `Ok` when the whole configuration serves and the process is not shutting down;
    /// otherwise what is missing, one line each.
    pub fn readiness(&self) -> Result<(), Vec<String>> {
        if self.draining.load(Ordering::Acquire) {
            return Err(vec!["shutting down: draining connections".to_string()]);
        }
        if !self.started.load(Ordering::Acquire) {
            return Err(vec!["first configuration not applied yet".to_string()]);
        }
        let missing = self.missing.load();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(missing.to_vec())
        }
    }

    pub fn is_ready(&self) -> bool {
        self.readiness().is_ok()
    }

    pub fn set_started(&self) {
        self.started.store(true, Ordering::Release);
    }

    pub fn set_missing(&self, missing: Vec<String>) {
        self.missing.store(Arc::new(missing));
    }

    /// From now on readiness fails (SIGTERM: load balancers must stop sending here first).
    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Names what [`ControlState::api_connected`] is about (default: `kubernetes api`).
    pub fn set_remote_name(&self, name: &'static str) {
        let _ = self.remote_name.set(name);
    }

    pub fn remote_name(&self) -> &'static str {
        self.remote_name.get().copied().unwrap_or("kubernetes api")
    }

    /// Whether the source reaches the Kubernetes API (`None` for sources with nothing remote).
    pub fn api_connected(&self) -> Option<bool> {
        match self.connected.load(Ordering::Acquire) {
            -1 => None,
            c => Some(c == 1),
        }
    }

    pub fn set_connected(&self, connected: Option<bool>) {
        let v = connected.map_or(-1, i8::from);
        self.connected.store(v, Ordering::Release);
        if let Some(c) = connected {
            self.metrics.api_connected.set(i64::from(c));
        }
    }

    /// Records the generation now served: for waiters and for `gatehouse_config_generation`
    /// (one place, so a data plane fed over the sync stream reports it too).
    pub fn set_generation(&self, generation: u64) {
        self.metrics
            .generation
            .set(i64::try_from(generation).unwrap_or(i64::MAX));
        self.generation_tx.send_replace(generation);
    }

    /// Resolves once the served generation is at least `generation`.
    pub async fn wait_for_generation(&self, generation: u64) {
        let mut rx = self.generation_tx.subscribe();
        let _ = rx.wait_for(|g| *g >= generation).await;
    }
}

#[cfg(test)]
mod tests {
    use super::ControlState;
    use prometheus_client::registry::Registry;

    /// The data plane of provisioned mode sets its generation only through `set_generation`
    /// (no reconcile loop runs there): the metric must follow it.
    #[test]
    fn set_generation_is_what_the_metric_reports() {
        let mut registry = Registry::default();
        let state = ControlState::new(&mut registry);
        state.set_generation(7);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.lines().any(|l| l == "gatehouse_config_generation 7"),
            "{text}"
        );
    }
}
