//! Wiring of the modes that serve traffic in this process: a [`Source`], the in-process data
//! plane as the reconcile loop's publisher, and the admin endpoint. `run` reads files;
//! `controller` (controller.rs) reads the Kubernetes API and adds a status sink.

use crate::admin;
use anyhow::Context as _;
use futures_util::future::BoxFuture;
use gatehouse_controlplane::kubernetes::service::MissingPorts;
use gatehouse_controlplane::{Applied, ControlState, Publisher, Reconciler, Source, WatchedFiles};
use gatehouse_dataplane::{DataPlane, Metrics as DataMetrics, Options as DataOptions};
use gatehouse_ir as ir;
use gatehouse_translate::Options as TranslateOptions;
use gatehouse_translate::serving::{BindProblem, Serving};
use prometheus_client::registry::Registry;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Debug)]
pub struct RunOptions {
    pub path: PathBuf,
    pub admin_address: SocketAddr,
    /// Where Gateways without spec.addresses listen.
    pub default_address: IpAddr,
    /// On SIGTERM: how long readiness fails while the sockets still accept (see [`Running::drain`]).
    pub drain_delay: Duration,
    pub shutdown_grace: Duration,
    pub dataplane: DataOptions,
}

/// A gateway in this process: what the control plane publishes, the data plane, and the
/// metrics of both.
pub struct State {
    pub control: Arc<ControlState>,
    pub dataplane: Arc<DataPlane>,
    pub registry: Registry,
}

impl State {
    pub(crate) fn new(dataplane: DataOptions) -> Arc<State> {
        let mut registry = Registry::default();
        let data_metrics = Arc::new(DataMetrics::new(&mut registry));
        let control = ControlState::new(&mut registry);
        let dataplane = DataPlane::new(dataplane, data_metrics);
        Arc::new(State {
            control,
            dataplane,
            registry,
        })
    }
}

/// The data plane of this process as the reconcile loop's publisher.
struct LocalDataPlane {
    dataplane: Arc<DataPlane>,
    changes: tokio::sync::Mutex<watch::Receiver<u64>>,
    /// The controller's data-plane Service (shared mode with `--publish-service-template`):
    /// listener ports it lacks, which status reports (`Serving::unreachable`). `now` is read by
    /// `serving`; `seen` is `changed`'s, one receiver for its whole life, so that each change
    /// wakes the loop once.
    service: Option<ServicePorts>,
}

struct ServicePorts {
    now: watch::Receiver<MissingPorts>,
    seen: tokio::sync::Mutex<watch::Receiver<MissingPorts>>,
}

impl LocalDataPlane {
    fn new(dataplane: Arc<DataPlane>, service: Option<watch::Receiver<MissingPorts>>) -> Self {
        let changes = tokio::sync::Mutex::new(dataplane.serving_changes());
        LocalDataPlane {
            dataplane,
            changes,
            service: service.map(|rx| ServicePorts {
                seen: tokio::sync::Mutex::new(rx.clone()),
                now: rx,
            }),
        }
    }
}

impl Publisher for LocalDataPlane {
    fn apply(&self, config: Arc<ir::Config>) -> BoxFuture<'_, Applied> {
        Box::pin(async move {
            let report = self.dataplane.apply(&config).await;
            Applied {
                diagnostics: report.diagnostics.iter().map(ToString::to_string).collect(),
            }
        })
    }

    fn serving(&self) -> Serving {
        let mut serving = Serving::default();
        for u in self.dataplane.unbound() {
            let problem = BindProblem {
                error: u.error,
                address_not_usable: u.address_not_available,
            };
            let unbound = match u.transport {
                gatehouse_dataplane::Transport::Tcp => &mut serving.unbound,
                gatehouse_dataplane::Transport::Udp => &mut serving.unbound_udp,
            };
            unbound.insert(u.address, problem);
        }
        if let Some(service) = &self.service {
            serving.unreachable = service.now.borrow().clone();
        }
        serving
    }

    fn changed(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {
            let data_plane = async {
                let mut changes = self.changes.lock().await;
                if changes.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            let service = async {
                match &self.service {
                    Some(s) => {
                        let mut seen = s.seen.lock().await;
                        if seen.changed().await.is_err() {
                            std::future::pending::<()>().await;
                        }
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = data_plane => {}
                _ = service => {}
            }
        })
    }
}

/// A gateway started in this process.
pub struct Running {
    pub admin_address: SocketAddr,
    pub state: Arc<State>,
    pub(crate) stop: CancellationToken,
    pub(crate) task: tokio::task::JoinHandle<()>,
    pub(crate) admin_task: tokio::task::JoinHandle<()>,
    pub(crate) drain_delay: Duration,
    pub(crate) grace: Duration,
    /// Cancelled on stop: services of the mode beside the reconcile loop (the sync server).
    pub(crate) also_stop: CancellationToken,
    /// Cancelled when the drain begins: what must not wait for it (leadership is resigned at
    /// once, so that a standby takes over while this replica drains).
    pub(crate) on_drain: CancellationToken,
}

impl Running {
    /// Shutting down the way Kubernetes expects (SIGTERM): readiness fails at once, so the
    /// endpoint leaves load balancers; for the drain delay the sockets keep accepting (the
    /// endpoint removal reaches kube-proxy and cloud load balancers only some time after
    /// SIGTERM) while every response carries `Connection: close` and HTTP/2 connections get
    /// a GOAWAY, moving clients off this instance; then [`Running::stop`].
    pub async fn drain(self) {
        self.on_drain.cancel();
        self.state.control.set_draining();
        self.state.dataplane.begin_drain();
        if !self.drain_delay.is_zero() {
            tracing::info!(
                delay = ?self.drain_delay,
                "draining: readiness fails, connections are asked to close, sockets still accept"
            );
            tokio::time::sleep(self.drain_delay).await;
        }
        self.stop().await;
    }

    /// Graceful stop: no new connections, in-flight requests finish (up to the grace period).
    pub async fn stop(self) {
        self.stop.cancel();
        self.also_stop.cancel();
        let _ = self.task.await;
        self.state.dataplane.shutdown(self.grace).await;
        self.admin_task.abort();
    }
}

/// Where a mode serves: admin address, data plane, grace period.
pub(crate) struct Serve {
    pub admin_address: SocketAddr,
    pub dataplane: DataOptions,
    pub drain_delay: Duration,
    pub shutdown_grace: Duration,
    /// Where configurations go instead of this process's data plane (provisioned mode: the
    /// Gateways' own data planes).
    pub publisher: Option<Arc<dyn Publisher>>,
    /// Ports the controller's data-plane Service lacks (see [`LocalDataPlane`]).
    pub service_ports: Option<watch::Receiver<MissingPorts>>,
}

/// Starts the admin endpoint and the reconcile loop (as `configure` completes it) on the
/// in-process data plane; returns once the first configuration serves.
pub(crate) async fn serve<S: Source>(
    serve: Serve,
    source: S,
    options: TranslateOptions,
    configure: impl FnOnce(Reconciler<S>) -> Reconciler<S>,
) -> anyhow::Result<Running> {
    let state = State::new(serve.dataplane);
    let admin_listener = tokio::net::TcpListener::bind(serve.admin_address)
        .await
        .with_context(|| format!("cannot bind the admin endpoint on {}", serve.admin_address))?;
    let admin_address = admin_listener.local_addr()?;
    let admin_task = tokio::spawn(admin::serve(admin_listener, Arc::clone(&state)));
    let publisher = match serve.publisher {
        Some(p) => p,
        None => Arc::new(LocalDataPlane::new(
            Arc::clone(&state.dataplane),
            serve.service_ports,
        )),
    };
    let reconciler = configure(Reconciler::new(
        source,
        options,
        publisher,
        Arc::clone(&state.control),
    ));
    let stop = CancellationToken::new();
    let task = match reconciler.start(stop.clone()).await {
        Ok(task) => task,
        Err(e) => {
            admin_task.abort();
            return Err(e);
        }
    };
    Ok(Running {
        admin_address,
        state,
        stop,
        task,
        admin_task,
        drain_delay: serve.drain_delay,
        grace: serve.shutdown_grace,
        also_stop: CancellationToken::new(),
        on_drain: CancellationToken::new(),
    })
}

/// Load the files once, start serving, then follow every change of them.
pub async fn start(opts: RunOptions) -> anyhow::Result<Running> {
    let source = WatchedFiles::new(&opts.path)
        .with_context(|| format!("cannot watch {}", opts.path.display()))?;
    let options = TranslateOptions {
        default_address: opts.default_address,
        ..TranslateOptions::default()
    };
    let serve_opts = Serve {
        admin_address: opts.admin_address,
        dataplane: opts.dataplane,
        drain_delay: opts.drain_delay,
        shutdown_grace: opts.shutdown_grace,
        publisher: None,
        service_ports: None,
    };
    let running = serve(serve_opts, source, options, |r| r).await?;
    tracing::info!(admin = %running.admin_address, path = %opts.path.display(), "gatehouse is serving");
    Ok(running)
}

/// Run until SIGINT/SIGTERM, then drain.
pub async fn run(opts: RunOptions) -> anyhow::Result<()> {
    serve_until_signal(start(opts).await?).await;
    Ok(())
}

pub async fn serve_until_signal(running: Running) {
    shutdown_signal().await;
    tracing::info!(
        "shutting down: readiness fails, then no new connections, in-flight requests finish"
    );
    running.drain().await;
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
