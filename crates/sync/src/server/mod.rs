//! The control plane's end: one gRPC service, one stream per data-plane replica, each
//! receiving only the snapshot of the Gateway its client certificate names.

mod registry;
mod service;
mod session;
mod tls_listener;

use crate::ca::Ca;
use crate::credentials::Credentials;
use crate::identity::DataPlaneIdentity;
use crate::keepalive;
use crate::rpc::config_sync_server::ConfigSyncServer;
use crate::wire::UnboundListener;
use anyhow::Context;
use gatehouse_ir as ir;
use registry::Registry;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};
use tls_listener::ServerCertResolver;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::codec::CompressionEncoding;

#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Lifetime of the client certificates issued to data planes on their streams (renewed at
    /// two thirds of it).
    pub dataplane_cert_validity: Duration,
    /// Whether streams are accepted from the start (see [`ConfigServer::set_accepting`]). A
    /// controller that elects a leader starts with `false`.
    pub accepting: bool,
    /// How long a TLS handshake may take before the connection is dropped.
    pub handshake_timeout: Duration,
    /// How long a new stream may take to send its Hello.
    pub hello_timeout: Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            dataplane_cert_validity: Duration::from_secs(24 * 3600),
            accepting: true,
            handshake_timeout: Duration::from_secs(10),
            hello_timeout: Duration::from_secs(10),
        }
    }
}

/// What every replica of one Gateway reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayReport {
    /// The version of the snapshot published for the Gateway, `None` before the first.
    pub published_version: Option<String>,
    /// Connected replicas by pod name.
    pub replicas: BTreeMap<String, ReplicaReport>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaReport {
    /// The version the replica serves (acknowledged, or named in its Hello).
    pub acked: Option<String>,
    /// The last version it rejected, with why, until it acknowledges another.
    pub rejected: Option<(String, String)>,
    /// Listeners it could not bind (as of its last Ack or Serving message).
    pub unbound: Vec<UnboundListener>,
    /// What it contained instead of rejecting, as of its last Ack.
    pub diagnostics: Vec<String>,
    pub connected_since: SystemTime,
    /// The data plane's build, from its Hello (an addition to the brief).
    pub build: String,
}

/// Counters for the controller's metrics registry (this crate keeps no registry of its own).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerCounters {
    /// Streams connected now.
    pub connected_streams: u64,
    /// Snapshots sent, over all streams.
    pub snapshots_sent: u64,
    /// Of those, sent as `config_gzip` (compressed once per snapshot, not per stream).
    pub snapshots_sent_gzip: u64,
    pub acks: u64,
    pub nacks: u64,
    /// Client certificates issued on streams (renewals).
    pub credentials_issued: u64,
    /// TLS handshakes that failed (a certificate the CA did not issue, none, a timeout).
    pub handshake_failures: u64,
}

#[derive(Default)]
struct Counters {
    snapshots_sent: AtomicU64,
    snapshots_sent_gzip: AtomicU64,
    acks: AtomicU64,
    nacks: AtomicU64,
    credentials_issued: AtomicU64,
    handshake_failures: AtomicU64,
}

impl Counters {
    fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

pub struct ConfigServer {
    ca: Arc<Ca>,
    options: ServerOptions,
    registry: Registry,
    certificate: Arc<ServerCertResolver>,
    accepting: watch::Sender<bool>,
    counters: Counters,
}

/// The status of a stream refused or ended because this replica is not the leader.
pub const NOT_LEADER: &str = "not the leader";
/// The status of the streams a stopping control-plane replica ends.
pub const STOPPING: &str = "control plane stopping";

impl ConfigServer {
    pub fn new(ca: Arc<Ca>, options: ServerOptions) -> Arc<Self> {
        Arc::new(ConfigServer {
            ca,
            accepting: watch::Sender::new(options.accepting),
            options,
            registry: Registry::default(),
            certificate: Arc::new(ServerCertResolver::default()),
            counters: Counters::default(),
        })
    }

    /// The snapshot for one Gateway; `None` when the Gateway is gone (its streams are
    /// closed). Publishing the same content again is a no-op.
    pub fn publish(&self, gateway: &DataPlaneIdentity, config: Option<Arc<ir::Config>>) {
        self.registry.publish(gateway, config);
    }

    /// Serves on `listener` with `server` credentials (client certificates required and
    /// verified against the CA) until `stop`, which also ends every stream (data planes
    /// reconnect, to this replica or another). Stop it with `stop`, not by dropping the
    /// future: connections run in tasks of their own.
    pub async fn serve(
        self: Arc<Self>,
        listener: tokio::net::TcpListener,
        server: Credentials,
        stop: CancellationToken,
    ) -> anyhow::Result<()> {
        self.certificate
            .set(&server)
            .context("server credentials")?;
        let tls = tls_listener::server_config(&self.ca, self.certificate.clone())?;
        let local = listener.local_addr().ok();
        let incoming = tls_listener::incoming(
            listener,
            tls,
            self.options.handshake_timeout,
            self.clone(),
            stop.clone(),
        );
        // gRPC's own compression is for data planes that do not read `config_gzip` (older
        // builds): it compresses every message again on every stream. Newer ones do not ask
        // for it.
        let service = ConfigSyncServer::new(service::SyncService::new(self.clone(), stop.clone()))
            .send_compressed(CompressionEncoding::Gzip)
            .accept_compressed(CompressionEncoding::Gzip);
        tracing::info!(address = ?local, "config sync serving");
        tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(keepalive::INTERVAL))
            .http2_keepalive_timeout(Some(keepalive::TIMEOUT))
            .serve_with_incoming_shutdown(service, incoming, stop.cancelled_owned())
            .await
            .context("config sync server")?;
        tracing::info!(address = ?local, "config sync stopped");
        Ok(())
    }

    /// Replaces the serving certificate for new connections; open ones keep theirs. Invalid
    /// credentials are logged and the previous ones kept.
    pub fn set_server_credentials(&self, credentials: Credentials) {
        if let Err(e) = self.certificate.set(&credentials) {
            tracing::error!(error = %e, "server credentials refused; keeping the previous ones");
        }
    }

    /// Whether streams are accepted: only the elected leader serves; others answer
    /// UNAVAILABLE "not the leader" (also to the streams they had), so data planes retry
    /// elsewhere.
    pub fn set_accepting(&self, accepting: bool) {
        self.accepting.send_if_modified(|current| {
            let changed = *current != accepting;
            *current = accepting;
            changed
        });
    }

    /// What every Gateway's data planes report.
    pub fn reports(&self) -> BTreeMap<DataPlaneIdentity, GatewayReport> {
        self.registry.reports()
    }

    /// Resolves when [`ConfigServer::reports`] may have changed. Cancel-safe.
    pub async fn changed(&self) {
        self.registry.changed().await;
    }

    pub fn counters(&self) -> ServerCounters {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ServerCounters {
            connected_streams: self.registry.connected() as u64,
            snapshots_sent: read(&self.counters.snapshots_sent),
            snapshots_sent_gzip: read(&self.counters.snapshots_sent_gzip),
            acks: read(&self.counters.acks),
            nacks: read(&self.counters.nacks),
            credentials_issued: read(&self.counters.credentials_issued),
            handshake_failures: read(&self.counters.handshake_failures),
        }
    }
}
