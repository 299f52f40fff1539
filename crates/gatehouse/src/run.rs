//! Standalone mode: files -> translate -> data plane, reconciled on every file change.

use crate::admin;
use crate::status_report;
use crate::telemetry::{ControlMetrics, ResultLabel};
use anyhow::Context as _;
use arc_swap::ArcSwap;
use gatehouse_controlplane::FileSource;
use gatehouse_dataplane::{DataPlane, Metrics as DataMetrics, Options as DataOptions};
use gatehouse_ir as ir;
use gatehouse_translate::{Options as TranslateOptions, Status, translate};
use prometheus_client::registry::Registry;
use serde_json::Value;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Debug)]
pub struct RunOptions {
    pub path: PathBuf,
    pub admin_address: SocketAddr,
    /// Where Gateways without spec.addresses listen.
    pub default_address: IpAddr,
    pub shutdown_grace: Duration,
    pub dataplane: DataOptions,
}

/// What the gateway serves right now, as the admin endpoint shows it.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub generation: u64,
    pub config: Arc<ir::Config>,
    pub status: Status,
    /// The objects Gatehouse owns, with status (`kubectl get -o yaml` shape).
    pub objects: Vec<Value>,
    /// Source errors (`file:line: message`); those files serve their last good content.
    pub errors: Vec<String>,
    /// Listener addresses that could not be bound.
    pub bind_errors: Vec<String>,
}

pub struct State {
    pub snapshot: ArcSwap<Snapshot>,
    pub ready: AtomicBool,
    /// `Some` in controller mode: whether the Kubernetes API answers.
    pub api_connected: Option<AtomicBool>,
    pub registry: Registry,
    pub dataplane: Arc<DataPlane>,
    pub(crate) metrics: ControlMetrics,
    generation_tx: watch::Sender<u64>,
}

impl State {
    pub(crate) fn new(dataplane: DataOptions, kubernetes: bool) -> Arc<State> {
        let mut registry = Registry::default();
        let data_metrics = Arc::new(DataMetrics::new(&mut registry));
        let metrics = ControlMetrics::new(&mut registry);
        let dataplane = DataPlane::new(dataplane, data_metrics);
        let (generation_tx, _) = watch::channel(0);
        Arc::new(State {
            snapshot: ArcSwap::from_pointee(Snapshot::default()),
            ready: AtomicBool::new(false),
            api_connected: kubernetes.then(|| AtomicBool::new(false)),
            registry,
            dataplane,
            metrics,
            generation_tx,
        })
    }

    /// Resolves once the served generation is at least `generation`.
    pub async fn wait_for_generation(&self, generation: u64) {
        let mut rx = self.generation_tx.subscribe();
        let _ = rx.wait_for(|g| *g >= generation).await;
    }
}

/// A gateway started in this process.
pub struct Running {
    pub admin_address: SocketAddr,
    pub state: Arc<State>,
    pub(crate) stop: CancellationToken,
    pub(crate) task: tokio::task::JoinHandle<()>,
    pub(crate) admin_task: tokio::task::JoinHandle<()>,
    pub(crate) grace: Duration,
}

impl Running {
    /// Graceful stop: no new connections, in-flight requests finish (up to the grace period).
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
        self.state.dataplane.shutdown(self.grace).await;
        self.admin_task.abort();
    }
}

/// Load the sources once, start serving, then follow every change of the files.
pub async fn start(opts: RunOptions) -> anyhow::Result<Running> {
    let state = State::new(opts.dataplane.clone(), false);
    let admin_listener = tokio::net::TcpListener::bind(opts.admin_address)
        .await
        .with_context(|| format!("cannot bind the admin endpoint on {}", opts.admin_address))?;
    let admin_address = admin_listener.local_addr()?;
    let admin_task = tokio::spawn(admin::serve(admin_listener, Arc::clone(&state)));

    let mut source = FileSource::new(&opts.path);
    let mut watch = source
        .watch()
        .with_context(|| format!("cannot watch {}", opts.path.display()))?;
    let translate_options = TranslateOptions {
        default_address: opts.default_address,
        ..TranslateOptions::default()
    };
    source = reconcile(source, &state, &translate_options).await;
    state.ready.store(true, Ordering::Release);
    tracing::info!(admin = %admin_address, path = %opts.path.display(), "gatehouse is serving");

    let stop = CancellationToken::new();
    let task = {
        let state = Arc::clone(&state);
        let stop = stop.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = watch.changed() => {}
                }
                source = reconcile(source, &state, &translate_options).await;
            }
        })
    };
    Ok(Running {
        admin_address,
        state,
        stop,
        task,
        admin_task,
        grace: opts.shutdown_grace,
    })
}

/// One pass of the pipeline. Reading and translating run on the blocking pool so that a large
/// configuration never delays requests on the runtime's workers.
async fn reconcile(source: FileSource, state: &State, options: &TranslateOptions) -> FileSource {
    let started = Instant::now();
    let options = options.clone();
    let (source, loaded, output) = tokio::task::spawn_blocking(move || {
        let mut source = source;
        let loaded = source.load();
        let output = translate(&loaded.input, &options);
        (source, loaded, output)
    })
    .await
    .expect("the reconcile task never panics");

    let previous = state.snapshot.load_full();
    let errors: Vec<String> = loaded.errors.iter().map(ToString::to_string).collect();
    // Log a problem when it appears, not on every reload while it lasts.
    for e in loaded
        .errors
        .iter()
        .filter(|e| !previous.errors.contains(&e.to_string()))
    {
        if loaded.stale_files.contains(&e.file) {
            tracing::error!("{e} (the last good version of this file keeps serving)");
        } else {
            tracing::error!("{e} (this file has never loaded; its objects are not served)");
        }
    }
    if errors.is_empty() && !previous.errors.is_empty() {
        tracing::info!("all configuration errors are fixed");
    }
    publish(state, &loaded.input, output, errors, started).await;
    source
}

/// Apply a translated configuration to the data plane (only if it changed) and publish the
/// snapshot the admin endpoint serves. Returns the stamped status.
pub(crate) async fn publish(
    state: &State,
    input: &gatehouse_translate::Input,
    output: gatehouse_translate::Output,
    errors: Vec<String>,
    started: Instant,
) -> Status {
    state.metrics.source_errors.set(errors.len() as i64);
    let previous = state.snapshot.load_full();
    let config_changed = *previous.config != output.config;
    let bind_errors = if config_changed {
        let failed = state.dataplane.apply(&output.config).await;
        for e in &failed {
            tracing::error!(address = %e.address, "cannot listen: {}", e.error);
        }
        failed
            .iter()
            .map(|e| format!("{}: {}", e.address, e.error))
            .collect()
    } else {
        previous.bind_errors.clone()
    };

    let mut status = output.status;
    status_report::stamp(
        &mut status,
        &previous.status,
        k8s_openapi::jiff::Timestamp::now(),
    );
    let objects = status_report::objects(input, &status);
    let generation = previous.generation + u64::from(config_changed);
    state.snapshot.store(Arc::new(Snapshot {
        generation,
        config: if config_changed {
            Arc::new(output.config)
        } else {
            Arc::clone(&previous.config)
        },
        status: status.clone(),
        objects,
        errors: errors.clone(),
        bind_errors,
    }));

    let result = if config_changed {
        state
            .metrics
            .apply_duration
            .observe(started.elapsed().as_secs_f64());
        state.metrics.generation.set(generation as i64);
        tracing::info!(
            generation,
            elapsed_ms = started.elapsed().as_secs_f64() * 1000.0,
            "configuration applied"
        );
        "applied"
    } else if errors.is_empty() {
        "unchanged"
    } else {
        "error"
    };
    state
        .metrics
        .reconciles
        .get_or_create(&ResultLabel { result })
        .inc();
    state.generation_tx.send_replace(generation);
    status
}

/// Run until SIGINT/SIGTERM, then drain.
pub async fn run(opts: RunOptions) -> anyhow::Result<()> {
    serve_until_signal(start(opts).await?).await;
    Ok(())
}

pub async fn serve_until_signal(running: Running) {
    shutdown_signal().await;
    tracing::info!("shutting down: no new connections, finishing in-flight requests");
    running.stop().await;
    tracing::info!("stopped");
}

pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
