//! The Gatehouse data plane: listeners, router, filters, balancer and upstream clients.
//!
//! [`DataPlane::apply`] compiles a [`gatehouse_ir::Config`] into per-socket routing tables off
//! the request path and swaps them in atomically; requests in flight finish on the table they
//! started with. Sockets are opened and closed as listener addresses come and go, and nothing
//! ever reloads.
//!
//! Module map: `table` (the compiled runtime tables), `compile` (IR -> tables, and the
//! contain-versus-reject policy), `matchers` (path, header, query and method matchers, each with
//! its conversion from the IR), `filters` (header modifiers, redirects, rewrites, likewise),
//! `cors` (the CORS filter), `mirror` (RequestMirror: copies of requests on tasks of their own),
//! `router` (host and rule selection), `conn` (a connection's context and the routing prologue
//! both request paths share), `forwarding` (filters, backend and endpoint choice), `h1` (the
//! HTTP/1.1 path and backend pools), `hyper_path` (HTTP/2 and what the HTTP/1 path hands over),
//! `grpc` (the gateway's own errors as gRPC statuses to gRPC calls), `balancer` (weighted and
//! round-robin choice), `upstream` (clients, backend TLS, hop-by-hop hygiene, upgrades),
//! `listeners` (sockets, accept, TLS handshakes by SNI, drain), `tls` (certificates, server and
//! client configurations, ClientHello peek), `stream` (TCP forwarding for TLSRoute), `l4` (TCP
//! and UDP listeners: TCPRoute and UDPRoute), `workers` (per-thread runtimes connections run
//! on), `metrics`.

mod balancer;
mod compile;
mod conn;
mod connect;
mod cors;
mod ext_auth;
mod filters;
mod forwarding;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod grpc;
mod h1;
mod headers;
mod health;
mod hyper_path;
mod l4;
mod limits;
mod listeners;
mod matchers;
mod metrics;
mod mirror;
pub mod path;
mod reclaim;
mod retry;
mod reuse;
mod router;
mod stream;
mod table;
mod tls;
mod upstream;
mod workers;

pub use compile::Diagnostic;
pub use gatehouse_ir::Transport;
pub use metrics::Metrics;

use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use listeners::BoundSocket;
use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use table::SocketTable;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

/// Tunables of the data plane.
#[derive(Clone, Debug)]
pub struct Options {
    /// TCP connect timeout towards backends.
    pub connect_timeout: Duration,
    /// How long an idle pooled backend connection is kept.
    pub pool_idle_timeout: Duration,
    /// Time to response headers when a rule sets no timeout. `None`: unbounded.
    pub default_request_timeout: Option<Duration>,
    /// Slowloris guard: an HTTP/1 client must send its request headers within this time.
    pub header_read_timeout: Duration,
    /// Largest request head accepted (HTTP/1 buffer, HTTP/2 header list). Bigger heads get a
    /// 431 or a clean close. Values below 8 KiB are raised to 8 KiB (hyper's minimum buffer).
    pub max_header_bytes: usize,
    /// Largest response head accepted from a backend (status line and fields); a bigger one
    /// answers 502. Values below 8 KiB are raised to 8 KiB.
    pub max_response_head_bytes: usize,
    /// A TLS client must finish its handshake (ClientHello included) within this time.
    pub tls_handshake_timeout: Duration,
    /// An HTTP/2 connection with no open stream for this long gets a GOAWAY and closes.
    pub http2_idle_timeout: Duration,
    /// HTTP/2: a PING to the client after this much silence (`None`: never); no answer within
    /// `http2_keepalive_timeout` closes the connection.
    pub http2_keepalive_interval: Option<Duration>,
    pub http2_keepalive_timeout: Duration,
    /// A request body with no byte from the client for this long aborts the exchange.
    pub request_body_timeout: Duration,
    /// A response body with no byte from the backend for this long (after its head) aborts the
    /// exchange and closes the client connection.
    pub backend_read_timeout: Duration,
    /// A write to a client that stays blocked this long (the client does not read) closes
    /// the connection.
    pub client_write_timeout: Duration,
    /// An upgraded connection (WebSocket), TLSRoute or TCPRoute stream with no byte in either
    /// direction for this long is closed.
    pub tunnel_idle_timeout: Duration,
    /// A UDP session (one client address and port) with no datagram either way for this long
    /// ends.
    pub udp_idle_timeout: Duration,
    /// UDP sessions per UDP listener; datagrams of new clients beyond it are dropped.
    pub udp_max_sessions: usize,
    /// Open client connections per worker beyond which new ones are closed at once (the
    /// established ones keep being served).
    pub max_connections_per_worker: usize,
    /// Worker threads serving connections: pooled upstream connections are kept per worker.
    pub workers: usize,
    /// Serve connections on `workers` dedicated threads, each running its own single-threaded
    /// runtime (the binary does); otherwise on the runtime that calls [`DataPlane::apply`].
    pub dedicated_workers: bool,
    /// Keep each virtual host's compiled table for the next apply, taken again while the
    /// host's matches are the same objects (`compile::CompiledHosts`). Worth it when the
    /// configurations come from an in-process translate, which shares them between passes;
    /// a data plane that decodes every configuration afresh shares nothing and turns it off.
    pub keep_compiled_hosts: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            connect_timeout: Duration::from_secs(5),
            pool_idle_timeout: Duration::from_secs(90),
            default_request_timeout: Some(Duration::from_secs(60)),
            header_read_timeout: Duration::from_secs(30),
            max_header_bytes: 64 * 1024,
            max_response_head_bytes: 64 * 1024,
            tls_handshake_timeout: Duration::from_secs(10),
            http2_idle_timeout: Duration::from_secs(120),
            http2_keepalive_interval: Some(Duration::from_secs(30)),
            http2_keepalive_timeout: Duration::from_secs(10),
            request_body_timeout: Duration::from_secs(60),
            backend_read_timeout: Duration::from_secs(60),
            client_write_timeout: Duration::from_secs(60),
            tunnel_idle_timeout: Duration::from_secs(3600),
            udp_idle_timeout: Duration::from_secs(60),
            udp_max_sessions: 16_384,
            max_connections_per_worker: 20_000,
            workers: std::thread::available_parallelism().map_or(1, usize::from),
            dedicated_workers: false,
            keep_compiled_hosts: true,
        }
    }
}

/// A socket of the data plane: TCP and UDP ports are apart, so a UDP listener and a TCP-based
/// one may share a port number.
pub(crate) type SocketKey = (Transport, SocketAddr);

/// An address `apply` could not bind. The data plane keeps retrying it with backoff while the
/// configuration lists it ([`DataPlane::unbound`] says which addresses are still waiting).
#[derive(Debug)]
pub struct BindError {
    pub address: SocketAddr,
    pub transport: Transport,
    pub error: std::io::Error,
}

impl fmt::Display for BindError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.transport {
            Transport::Tcp => write!(f, "cannot listen on {}: {}", self.address, self.error),
            Transport::Udp => write!(f, "cannot listen on {}/udp: {}", self.address, self.error),
        }
    }
}

impl std::error::Error for BindError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// An address of the configuration that is not listening yet, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unbound {
    pub address: SocketAddr,
    pub transport: Transport,
    /// The operating system's error (`Address already in use (os error 98)`).
    pub error: String,
    /// The host cannot use this address at all (EADDRNOTAVAIL: not one of its addresses);
    /// otherwise the bind may succeed later (the port is taken, a permission is missing).
    pub address_not_available: bool,
}

/// Sockets bound for one [`SocketKey`], not serving yet.
enum Bound {
    /// One listening socket per accepting runtime.
    Tcp(Vec<std::net::TcpListener>),
    Udp(std::net::UdpSocket),
}

/// Binds that failed, retried with backoff (control path only).
struct PendingBind {
    table: SocketTable,
    error: Unbound,
    attempts: u32,
    next_attempt: tokio::time::Instant,
}

/// The first retry of a failed bind comes after this, then twice as long each time up to
/// [`BIND_RETRY_MAX`]: a port freed by another process is taken within seconds.
const BIND_RETRY_FIRST: Duration = Duration::from_millis(250);
const BIND_RETRY_MAX: Duration = Duration::from_secs(5);

impl PendingBind {
    fn new(table: SocketTable, (transport, address): SocketKey, error: &std::io::Error) -> Self {
        PendingBind {
            table,
            error: Unbound {
                address,
                transport,
                error: error.to_string(),
                address_not_available: error.kind() == std::io::ErrorKind::AddrNotAvailable,
            },
            attempts: 0,
            next_attempt: tokio::time::Instant::now() + BIND_RETRY_FIRST,
        }
    }

    fn failed_again(&mut self, error: &std::io::Error) {
        self.attempts += 1;
        self.error.error = error.to_string();
        self.error.address_not_available = error.kind() == std::io::ErrorKind::AddrNotAvailable;
        let backoff = BIND_RETRY_FIRST
            .saturating_mul(1 << self.attempts.min(8))
            .min(BIND_RETRY_MAX);
        self.next_attempt = tokio::time::Instant::now() + backoff;
    }
}

/// What one [`DataPlane::apply`] did besides serving the configuration.
#[derive(Debug, Default)]
pub struct ApplyReport {
    /// Addresses that could not be bound; retried on the next apply that still lists them.
    pub bind_errors: Vec<BindError>,
    /// What the data plane contained instead of rejecting (see [`Diagnostic`]).
    pub diagnostics: Vec<Diagnostic>,
}

/// What every socket, connection and request shares.
pub(crate) struct Shared {
    /// Set by [`DataPlane::begin_drain`]: responses carry `Connection: close` and HTTP/2
    /// connections get a GOAWAY, while the sockets still accept.
    pub closing: std::sync::atomic::AtomicBool,
    /// Cancelled with `closing`: wakes HTTP/2 connections to send their GOAWAY.
    pub goaway: CancellationToken,
    pub metrics: Arc<Metrics>,
    pub upstreams: upstream::Upstreams,
    pub server: auto::Builder<TokioExecutor>,
    /// HTTP/2 alone (hyper's, not the auto builder: its `http2_only` does nothing for
    /// connections served with upgrades): for connections that negotiated h2 by ALPN or sent
    /// the HTTP/2 preface, so that a broken preface is an HTTP/2 connection error, never
    /// answered as HTTP/1.
    pub server_h2: hyper::server::conn::http2::Builder<TokioExecutor>,
    /// Accept loops, connections and upgraded tunnels, so that shutdown can wait for them.
    pub tasks: TaskTracker,
    /// Parent of every socket's stop token: cancelling it drains everything.
    pub draining: CancellationToken,
    /// Cancelled when the shutdown grace period is over: whatever is left is dropped.
    pub kill: CancellationToken,
    pub default_request_timeout: Option<Duration>,
    /// TCP connect timeout towards backends (also for TLSRoute forwarding).
    pub connect_timeout: Duration,
    pub tls_handshake_timeout: Duration,
    pub h1: h1::Settings,
    /// Limits after a request's head (timeouts of bodies, writes, tunnels, HTTP/2 idle).
    pub limits: limits::Limits,
    pub max_connections_per_worker: usize,
    /// The runtimes connections are served on; `None`: the caller's.
    pub workers: Option<workers::Workers>,
    pub udp: l4::udp::Settings,
    /// Mirror requests running now (`mirror::MAX_IN_FLIGHT` bounds it).
    pub mirrors_in_flight: std::sync::atomic::AtomicUsize,
}

/// The running data plane. Cheap to share; all methods take `&self`.
pub struct DataPlane {
    shared: Arc<Shared>,
    /// Control path only (apply, shutdown, readiness); requests never touch it.
    sockets: Mutex<HashMap<SocketKey, BoundSocket>>,
    /// Serialises applies so that binds and removals of two applies never interleave.
    apply_lock: tokio::sync::Mutex<()>,
    /// Certificates and TLS configurations kept across applies (control path only).
    tls: Mutex<tls::TlsCache>,
    /// Route tables kept across applies, by virtual host (control path only).
    hosts: Mutex<compile::CompiledHosts>,
    /// The idle upstream connection sweeper and the bind retrier run (started by the first
    /// apply).
    background: std::sync::Once,
    /// Addresses of the configuration that could not be bound, retried with backoff.
    pending: Mutex<HashMap<SocketKey, PendingBind>>,
    /// Wakes the bind retrier when `pending` changed.
    pending_changed: tokio::sync::watch::Sender<()>,
    /// Bumped whenever the set of unbound addresses changes.
    serving: tokio::sync::watch::Sender<u64>,
    this: std::sync::Weak<DataPlane>,
}

impl fmt::Debug for DataPlane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataPlane")
            .field("bound", &self.bound_addresses())
            .finish_non_exhaustive()
    }
}

/// Retries failed binds when they are due (backoff per address) or when an apply changed them;
/// runs until the data plane is dropped or shut down.
async fn retry_binds(
    dp: std::sync::Weak<DataPlane>,
    mut changed: tokio::sync::watch::Receiver<()>,
) {
    let mut next: Option<tokio::time::Instant> = None;
    loop {
        let woke = match next {
            Some(at) => tokio::select! {
                () = tokio::time::sleep_until(at) => Ok(()),
                r = changed.changed() => r,
            },
            None => changed.changed().await,
        };
        // The sender lives in the data plane: an error means it is gone.
        if woke.is_err() {
            return;
        }
        let Some(dp) = dp.upgrade() else { return };
        if dp.shared.draining.is_cancelled() {
            return;
        }
        next = dp.retry_due_binds().await;
    }
}

/// Closes pooled upstream connections that stayed idle past the idle timeout, so that they do
/// not hold sockets open on either side; runs until the data plane is dropped or killed.
async fn sweep_idle_upstreams(shared: std::sync::Weak<Shared>) {
    let period = match shared.upgrade() {
        Some(s) => (s.upstreams.pool_idle_timeout() / 4).max(Duration::from_millis(250)),
        None => return,
    };
    loop {
        tokio::time::sleep(period).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if shared.kill.is_cancelled() {
            return;
        }
        shared.upstreams.sweep_idle();
    }
}

/// HTTP/1 connections the HTTP/1 path hands over (absolute-form targets, upgrades, ...). The
/// auto builder would also take HTTP/2, but handed-over connections never start with the
/// preface: those go to [`h2_server_builder`].
fn server_builder(options: &Options) -> auto::Builder<TokioExecutor> {
    let max_head = options.max_header_bytes.max(8 * 1024);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .keep_alive(true)
        .header_read_timeout(options.header_read_timeout)
        // The read buffer bounds the request head: beyond it hyper answers 431 and closes.
        .max_buf_size(max_head);
    builder
}

/// Every HTTP/2 connection, cleartext (prior knowledge) or TLS (ALPN h2).
fn h2_server_builder(options: &Options) -> hyper::server::conn::http2::Builder<TokioExecutor> {
    let max_head = options.max_header_bytes.max(8 * 1024);
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .keep_alive_interval(options.http2_keepalive_interval)
        .keep_alive_timeout(options.http2_keepalive_timeout)
        .max_header_list_size(u32::try_from(max_head).unwrap_or(u32::MAX));
    builder
}

impl DataPlane {
    pub fn new(options: Options, metrics: Arc<Metrics>) -> Arc<Self> {
        let stalls = metrics.worker_stalls.clone();
        let shared = Shared {
            closing: std::sync::atomic::AtomicBool::new(false),
            goaway: CancellationToken::new(),
            upstreams: upstream::Upstreams::new(&options),
            server: server_builder(&options),
            server_h2: h2_server_builder(&options),
            metrics,
            tasks: TaskTracker::new(),
            draining: CancellationToken::new(),
            kill: CancellationToken::new(),
            default_request_timeout: options.default_request_timeout,
            connect_timeout: options.connect_timeout,
            tls_handshake_timeout: options.tls_handshake_timeout,
            h1: h1::Settings {
                header_read_timeout: options.header_read_timeout,
                max_head: options.max_header_bytes.max(8 * 1024),
            },
            limits: limits::Limits {
                request_body: options.request_body_timeout,
                backend_read: options.backend_read_timeout,
                client_write: options.client_write_timeout,
                tunnel_idle: options.tunnel_idle_timeout,
                http2_idle: options.http2_idle_timeout,
            },
            max_connections_per_worker: options.max_connections_per_worker.max(1),
            udp: l4::udp::Settings {
                idle_timeout: options.udp_idle_timeout,
                max_sessions: options.udp_max_sessions.max(1),
            },
            mirrors_in_flight: std::sync::atomic::AtomicUsize::new(0),
            workers: if options.dedicated_workers {
                workers::Workers::start(options.workers, &stalls)
                    .inspect_err(|error| {
                        warn!(%error, "cannot start worker threads; serving on the main runtime");
                    })
                    .ok()
            } else {
                None
            },
        };
        Arc::new_cyclic(|this| DataPlane {
            shared: Arc::new(shared),
            sockets: Mutex::new(HashMap::new()),
            apply_lock: tokio::sync::Mutex::new(()),
            tls: Mutex::new(tls::TlsCache::default()),
            hosts: Mutex::new(compile::CompiledHosts::new(options.keep_compiled_hosts)),
            background: std::sync::Once::new(),
            pending: Mutex::new(HashMap::new()),
            pending_changed: tokio::sync::watch::channel(()).0,
            serving: tokio::sync::watch::channel(0).0,
            this: this.clone(),
        })
    }

    fn sockets(&self) -> std::sync::MutexGuard<'_, HashMap<SocketKey, BoundSocket>> {
        // A panic while holding this lock cannot leave the map half-updated in a way that
        // matters more than refusing to serve, so poisoning is ignored.
        self.sockets.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Compile `config` off the request path, bind sockets for new listener addresses, swap the
    /// compiled tables into already-bound sockets atomically, stop accepting on addresses no
    /// longer present (their open connections drain gracefully). Returns one error per address
    /// it could not bind; everything else is still applied. Listeners that did not change keep
    /// their sockets and connections.
    ///
    /// Certificates and TLS settings are part of the compiled tables: the first handshake after
    /// the swap uses the new certificate, established TLS connections keep theirs. Unchanged
    /// certificates, listener TLS configurations and backend TLS clients are reused from the
    /// previous apply (so session caches and pooled backend connections survive).
    ///
    /// Parts of the configuration that cannot run here are contained and reported in the
    /// returned [`ApplyReport`], never rejected (the policy is in `compile`).
    pub async fn apply(&self, config: &gatehouse_ir::Config) -> ApplyReport {
        let _serial = self.apply_lock.lock().await;
        if self.shared.draining.is_cancelled() {
            warn!("apply after shutdown ignored");
            return ApplyReport::default();
        }
        self.background.call_once(|| {
            tokio::spawn(sweep_idle_upstreams(Arc::downgrade(&self.shared)));
            tokio::spawn(retry_binds(
                self.this.clone(),
                self.pending_changed.subscribe(),
            ));
        });
        let (tables, diagnostics) = {
            let mut tls = self.tls.lock().unwrap_or_else(|e| e.into_inner());
            let mut hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
            let mut compiler = compile::Compiler {
                hosts: &mut hosts,
                metrics: &self.shared.metrics,
                upstreams: &self.shared.upstreams,
                tls: &mut tls,
                default_timeout: self.shared.default_request_timeout,
                diagnostics: Vec::new(),
            };
            let tables = compiler.compile(config);
            (tables, compiler.diagnostics)
        };
        self.shared
            .metrics
            .config_diagnostics
            .set(diagnostics.len() as i64);

        // Close removed addresses first, so that an address moving between two listeners (or
        // from a wildcard to a specific IP) can be bound again in this same apply.
        let removed: Vec<(SocketKey, BoundSocket)> = {
            let mut sockets = self.sockets();
            let gone: Vec<SocketKey> = sockets
                .keys()
                .filter(|addr| !tables.contains_key(addr))
                .copied()
                .collect();
            gone.into_iter()
                .filter_map(|addr| sockets.remove(&addr).map(|s| (addr, s)))
                .collect()
        };
        let unbound_before = self.unbound();
        self.pending()
            .retain(|address, _| tables.contains_key(address));
        for (_, socket) in &removed {
            socket.remove();
        }
        for ((_, address), socket) in removed {
            socket.closed().await;
            info!(%address, "listener removed; its connections drain");
        }

        let mut bind_errors = Vec::new();
        {
            let mut sockets = self.sockets();
            let mut pending = self.pending();
            for (key, table) in tables {
                let (transport, address) = key;
                if let Some(socket) = sockets.get(&key) {
                    socket.state.swap(table);
                    continue;
                }
                match self.bind(key) {
                    Ok(bound) => {
                        pending.remove(&key);
                        sockets.insert(key, self.start(bound, table));
                        info!(%address, ?transport, "listening");
                    }
                    Err(error) => {
                        warn!(%address, ?transport, %error, "cannot bind listener; retrying with backoff");
                        match pending.get_mut(&key) {
                            Some(p) => {
                                p.table = table;
                                p.failed_again(&error);
                            }
                            None => {
                                pending.insert(key, PendingBind::new(table, key, &error));
                            }
                        }
                        bind_errors.push(BindError {
                            address,
                            transport,
                            error,
                        });
                    }
                }
            }
        }
        self.pending_changed.send_replace(());
        self.serving_changed_from(&unbound_before);
        ApplyReport {
            bind_errors,
            diagnostics,
        }
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<SocketKey, PendingBind>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Binds a socket (TCP: one per accepting runtime), counting failures.
    fn bind(&self, (transport, address): SocketKey) -> std::io::Result<Bound> {
        match transport {
            Transport::Tcp => listeners::bind_for(address, &self.shared).map(Bound::Tcp),
            Transport::Udp => l4::udp::bind(address).map(Bound::Udp),
        }
        .inspect_err(|_| self.shared.metrics.bind_failure(address))
    }

    /// Starts serving sockets from [`DataPlane::bind`], routing with `table`.
    fn start(&self, bound: Bound, table: SocketTable) -> BoundSocket {
        let stop = self.shared.draining.child_token();
        match bound {
            Bound::Tcp(listeners) => listeners::start(listeners, table, self.shared.clone(), stop),
            Bound::Udp(socket) => l4::udp::start(socket, table, self.shared.clone(), stop),
        }
    }

    /// Addresses of the configuration that are not listening, and why; sorted by address.
    pub fn unbound(&self) -> Vec<Unbound> {
        let mut list: Vec<Unbound> = self.pending().values().map(|p| p.error.clone()).collect();
        list.sort_by_key(|u| (u.address, u.transport));
        list
    }

    /// A receiver that sees a new value whenever [`DataPlane::unbound`] changes (a retried
    /// bind succeeded, or an apply added or removed a failing address).
    pub fn serving_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.serving.subscribe()
    }

    fn serving_changed_from(&self, before: &[Unbound]) {
        if self.unbound() != before {
            self.serving.send_modify(|v| *v += 1);
        }
    }

    /// Tries the failed binds that are due; returns when the next one is.
    async fn retry_due_binds(&self) -> Option<tokio::time::Instant> {
        let _serial = self.apply_lock.lock().await;
        if self.shared.draining.is_cancelled() {
            return None;
        }
        let before = self.unbound();
        let now = tokio::time::Instant::now();
        {
            let mut sockets = self.sockets();
            let mut pending = self.pending();
            let due: Vec<SocketKey> = pending
                .iter()
                .filter(|(_, p)| p.next_attempt <= now)
                .map(|(a, _)| *a)
                .collect();
            for key in due {
                let Some(p) = pending.remove(&key) else {
                    continue;
                };
                let attempts = p.attempts;
                let (transport, address) = key;
                match self.bind(key) {
                    Ok(bound) => {
                        info!(%address, ?transport, attempts = attempts + 1, "listening (bind retried)");
                        sockets.insert(key, self.start(bound, p.table));
                    }
                    Err(error) => {
                        let mut p = p;
                        p.failed_again(&error);
                        debug!(%address, ?transport, %error, "bind retry failed");
                        pending.insert(key, p);
                    }
                }
            }
        }
        self.serving_changed_from(&before);
        self.pending().values().map(|p| p.next_attempt).min()
    }

    /// Starts draining the way Kubernetes expects, while the sockets keep accepting (load
    /// balancers are still removing this instance): every response from now on carries
    /// `Connection: close` and HTTP/2 connections get a GOAWAY, so clients move their next
    /// requests to new connections. [`DataPlane::shutdown`] then closes the sockets.
    pub fn begin_drain(&self) {
        self.shared
            .closing
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.shared.goaway.cancel();
    }

    /// Stop accepting everywhere, let in-flight requests finish, close idle keep-alive
    /// connections, return when all connections are done or `grace` elapsed (then the rest,
    /// including upgraded tunnels, is dropped).
    pub async fn shutdown(&self, grace: Duration) {
        let _serial = self.apply_lock.lock().await;
        let sockets: Vec<BoundSocket> = self.sockets().drain().map(|(_, s)| s).collect();
        for socket in &sockets {
            socket.stop_accepting();
        }
        self.shared.draining.cancel();
        for socket in sockets {
            socket.closed().await;
        }
        self.shared.tasks.close();
        if tokio::time::timeout(grace, self.shared.tasks.wait())
            .await
            .is_err()
        {
            warn!(
                remaining = self.shared.tasks.len(),
                "shutdown grace elapsed; closing remaining connections"
            );
        }
        self.shared.kill.cancel();
    }

    /// Addresses currently bound, TCP and UDP (tests and /readyz use it).
    pub fn bound_addresses(&self) -> Vec<SocketAddr> {
        let mut addrs: Vec<SocketAddr> = self.sockets().keys().map(|(_, a)| *a).collect();
        addrs.sort();
        addrs.dedup();
        addrs
    }

    /// UDP addresses currently bound.
    pub fn bound_udp_addresses(&self) -> Vec<SocketAddr> {
        let mut addrs: Vec<SocketAddr> = self
            .sockets()
            .keys()
            .filter(|(t, _)| *t == Transport::Udp)
            .map(|(_, a)| *a)
            .collect();
        addrs.sort();
        addrs
    }
}
