//! Proxy mode (`gatehouse proxy`): one Gateway's data plane, fed by the control plane over
//! the config sync stream (`gatehouse-sync`) instead of reading objects itself. It holds no
//! Kubernetes credentials: its client certificate names its Gateway, and that is all the
//! control plane sends it.
//!
//! Ready once the first configuration is applied and every listener is bound; while the
//! control plane is unreachable it keeps serving the last configuration and stays ready
//! (`/readyz` says so), reconnecting with backoff.

use crate::admin;
use crate::run::{Running, State};
use anyhow::Context as _;
use futures_util::future::BoxFuture;
use gatehouse_controlplane::Published;
use gatehouse_dataplane::Options as DataOptions;
use gatehouse_ir as ir;
use gatehouse_sync::{Applier, ClientOptions, ClientState, UnboundListener};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Debug)]
pub struct ProxyOptions {
    pub admin_address: SocketAddr,
    /// `https://host:port` of the control plane's config sync service.
    pub control_plane: String,
    /// The name the control plane's certificate carries.
    pub control_plane_name: String,
    /// The bootstrap credentials (`tls.crt`, `tls.key`, `ca.crt`).
    pub credentials: PathBuf,
    /// This pod, as the control plane reports it.
    pub pod: String,
    pub drain_delay: Duration,
    pub shutdown_grace: Duration,
    pub dataplane: DataOptions,
}

/// The data plane as the sync client's applier: each snapshot is applied and published to
/// the admin endpoint.
struct DataApplier {
    state: Arc<State>,
    changes: tokio::sync::Mutex<tokio::sync::watch::Receiver<u64>>,
}

impl DataApplier {
    fn unbound_now(&self) -> Vec<gatehouse_dataplane::Unbound> {
        self.state.dataplane.unbound()
    }

    /// Readiness: everything the configuration asks for is bound.
    fn publish_readiness(&self) {
        let missing: Vec<String> = self
            .unbound_now()
            .iter()
            .map(|u| match u.transport {
                gatehouse_dataplane::Transport::Tcp => {
                    format!("cannot listen on {}: {}", u.address, u.error)
                }
                gatehouse_dataplane::Transport::Udp => {
                    format!("cannot listen on {}/udp: {}", u.address, u.error)
                }
            })
            .collect();
        self.state.control.set_missing(missing);
    }
}

impl Applier for DataApplier {
    fn apply(&self, config: Arc<ir::Config>) -> BoxFuture<'_, Result<Vec<String>, String>> {
        Box::pin(async move {
            let report = self.state.dataplane.apply(&config).await;
            let diagnostics: Vec<String> =
                report.diagnostics.iter().map(ToString::to_string).collect();
            let previous = self.state.control.published.load_full();
            let generation = previous.generation + 1;
            self.state.control.published.store(Arc::new(Published {
                generation,
                config,
                bind_errors: report.bind_errors.iter().map(ToString::to_string).collect(),
                diagnostics: diagnostics.clone(),
                ..Published::default()
            }));
            self.publish_readiness();
            self.state.control.set_started();
            self.state.control.set_generation(generation);
            tracing::info!(generation, "configuration from the control plane applied");
            Ok(diagnostics)
        })
    }

    fn unbound(&self) -> Vec<UnboundListener> {
        self.unbound_now()
            .into_iter()
            .map(|u| UnboundListener {
                port: u32::from(u.address.port()),
                address: u.address.ip().to_string(),
                udp: u.transport == gatehouse_dataplane::Transport::Udp,
                error: u.error,
                address_not_usable: u.address_not_available,
            })
            .collect()
    }

    fn changed(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {
            let mut changes = self.changes.lock().await;
            if changes.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
            self.publish_readiness();
        })
    }
}

/// Starts the admin endpoint, the data plane and the sync client; returns at once (readiness
/// follows the first snapshot).
pub async fn start(opts: ProxyOptions) -> anyhow::Result<Running> {
    let state = State::new(opts.dataplane);
    state.control.set_remote_name("control plane");
    state.control.set_connected(Some(false));
    let admin_listener = tokio::net::TcpListener::bind(opts.admin_address)
        .await
        .with_context(|| format!("cannot bind the admin endpoint on {}", opts.admin_address))?;
    let admin_address = admin_listener.local_addr()?;
    let admin_task = tokio::spawn(admin::serve(admin_listener, Arc::clone(&state)));

    let applier = Arc::new(DataApplier {
        changes: tokio::sync::Mutex::new(state.dataplane.serving_changes()),
        state: Arc::clone(&state),
    });
    let client_state = Arc::new(ClientState::new());
    let stop = CancellationToken::new();
    let client = gatehouse_sync::run(
        ClientOptions {
            endpoint: opts.control_plane.clone(),
            server_name: opts.control_plane_name,
            credentials_dir: opts.credentials,
            pod: opts.pod,
            build: env!("CARGO_PKG_VERSION").to_string(),
            gzip_snapshots: true,
        },
        applier,
        Arc::clone(&client_state),
        stop.clone(),
    );
    let watched = Arc::clone(&state);
    let task = tokio::spawn(async move {
        // The stream's state, once a second, for readiness text and the metric.
        let follow = async {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                watched
                    .control
                    .set_connected(Some(client_state.connected()));
            }
        };
        tokio::select! {
            () = client => {}
            () = follow => {}
        }
    });
    tracing::info!(admin = %admin_address, control_plane = %opts.control_plane, "gatehouse proxy started");
    Ok(Running {
        admin_address,
        state,
        stop,
        task,
        admin_task,
        drain_delay: opts.drain_delay,
        grace: opts.shutdown_grace,
        also_stop: CancellationToken::new(),
        on_drain: CancellationToken::new(),
    })
}
