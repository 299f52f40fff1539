//! Sockets: bind, accept, TLS handshakes, serve connections, drain.
//!
//! One accept loop per distinct address. Each socket holds an `ArcSwap` of its routing table,
//! which `apply` replaces without touching the socket or its connections. The table says
//! whether the socket speaks TLS; a TLS connection's ClientHello is read (not answered) first,
//! its SNI picks the listener with the same precedence as HTTP hosts, and the listener's mode
//! decides: terminate with the listener's certificates (then HTTP, or TCP to a TLSRoute
//! backend), or pass the untouched bytes through to a TLSRoute backend. Certificates live in
//! the table, so a swap changes what new handshakes see and nothing else.

use crate::conn::ConnContext;
use crate::hyper_path::{self, ClientBody};
use crate::limits::{Activity, Stall, TimeoutKind, WriteLimited};
use crate::table::{ListenerMode, SocketTable, Speaks};
use crate::tls::{self, FailureReason, HelloError};
use crate::{Metrics, Shared, h1, l4, stream};
use arc_swap::ArcSwap;
use bytes::Bytes;
use http::HeaderValue;
use hyper_util::rt::TokioIo;
use socket2::{Domain, Protocol, Socket, Type};
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::ReadBuf;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::StartHandshake;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// State shared by one socket's accept loop and connections.
pub(crate) struct SocketShared {
    pub table: ArcSwap<SocketTable>,
    pub shared: Arc<Shared>,
    /// Set before the socket's stop token is cancelled: connections read it after every
    /// request (the token itself is behind a mutex).
    pub draining: AtomicBool,
    /// Set when an apply removed the socket (not when the data plane shuts down): TCP
    /// connections and UDP sessions, which have no request to finish, end at once.
    removed: AtomicBool,
    /// Bumped on every swap of `table` (and on removal), for connections that must re-check
    /// their route (TCP and UDP forwarding).
    swapped: tokio::sync::watch::Sender<()>,
}

impl SocketShared {
    pub(crate) fn new(table: SocketTable, shared: Arc<Shared>) -> Self {
        SocketShared {
            table: ArcSwap::from_pointee(table),
            shared,
            draining: AtomicBool::new(false),
            removed: AtomicBool::new(false),
            swapped: tokio::sync::watch::channel(()).0,
        }
    }

    /// Serves `table` from now on; connections that watch swaps re-check their route.
    pub(crate) fn swap(&self, table: SocketTable) {
        self.table.store(Arc::new(table));
        self.swapped.send_replace(());
    }

    /// Sees every swap after this call.
    pub(crate) fn swaps(&self) -> tokio::sync::watch::Receiver<()> {
        self.swapped.subscribe()
    }

    pub(crate) fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Relaxed)
    }

    /// Whether a response should close its connection: this socket stops accepting, or the
    /// whole data plane drains ([`crate::DataPlane::begin_drain`]).
    pub(crate) fn closing(&self) -> bool {
        self.draining.load(Ordering::Relaxed) || self.shared.closing.load(Ordering::Relaxed)
    }
}

pub(crate) struct BoundSocket {
    pub state: Arc<SocketShared>,
    /// Cancelled to stop accepting; the socket's connections then drain gracefully.
    pub stop: CancellationToken,
    /// One accept loop per worker; they end (closing the listening socket) promptly after
    /// `stop`.
    pub accept: Vec<JoinHandle<()>>,
}

impl BoundSocket {
    /// The configuration no longer has this socket: it stops accepting, HTTP connections finish
    /// their current request, TCP connections and UDP sessions end now.
    pub fn remove(&self) {
        self.state.removed.store(true, Ordering::Relaxed);
        self.state.swapped.send_replace(());
        self.stop_accepting();
    }

    /// Stops accepting; the socket's connections finish their current request and close.
    pub fn stop_accepting(&self) {
        // The flag first: connections read it after each request, the token wakes idle ones.
        self.state.draining.store(true, Ordering::Relaxed);
        self.stop.cancel();
    }

    /// Waits until every accept loop has ended (after `stop`), so the address can be rebound.
    pub async fn closed(self) {
        for accept in self.accept {
            let _ = accept.await;
        }
    }
}

/// Binds `addr` once per accepting runtime: one socket when there is one, otherwise a
/// `SO_REUSEPORT` group with a socket per worker. The kernel then hands each new connection to
/// exactly one worker's socket, where a shared socket in every worker's epoll would wake all of
/// them for each connection (mio cannot ask for `EPOLLEXCLUSIVE`).
pub(crate) fn bind(addr: SocketAddr, count: usize) -> io::Result<Vec<std::net::TcpListener>> {
    if count <= 1 {
        return Ok(vec![listen(socket_for(addr, false)?, addr)?]);
    }
    // SO_REUSEPORT would also let us join a group some other process of this user is already
    // listening with, silently splitting its traffic. A plain socket bound first refuses that
    // (EADDRINUSE), holds the port (and picks it, for port 0) until the group is bound, and is
    // then closed without ever listening.
    let guard = socket_for(addr, false)?;
    guard.bind(&addr.into())?;
    let addr = guard
        .local_addr()?
        .as_socket()
        .ok_or_else(|| io::Error::other("bound address is not an IP address"))?;
    (0..count)
        .map(|_| listen(socket_for(addr, true)?, addr))
        .collect()
}

fn socket_for(addr: SocketAddr, reuse_port: bool) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    // Lets a restarted or re-applied listener bind while old connections sit in TIME_WAIT.
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(reuse_port)?;
    // Accepted connections inherit it (Linux, BSDs): one system call per socket, not per
    // connection.
    socket.set_tcp_nodelay(true)?;
    socket.set_nonblocking(true)?;
    Ok(socket)
}

fn listen(socket: Socket, addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

/// The runtimes sockets accept on: the workers, or the current runtime when there are none.
pub(crate) fn accept_runtimes(shared: &Shared) -> Vec<tokio::runtime::Handle> {
    match shared.workers.as_ref() {
        Some(w) => w.handles().to_vec(),
        None => vec![tokio::runtime::Handle::current()],
    }
}

/// Binds `addr` once per accepting runtime (see [`bind`]).
pub(crate) fn bind_for(
    addr: SocketAddr,
    shared: &Shared,
) -> io::Result<Vec<std::net::TcpListener>> {
    bind(addr, accept_runtimes(shared).len())
}

/// Starts accepting on sockets from [`bind_for`]: one accept loop per worker runtime, each on
/// its own socket (a connection stays on the worker that accepted it), or on the current
/// runtime when there are no workers.
pub(crate) fn start(
    listeners: Vec<std::net::TcpListener>,
    table: SocketTable,
    shared: Arc<Shared>,
    stop: CancellationToken,
) -> BoundSocket {
    let runtimes = accept_runtimes(&shared);
    let state = Arc::new(SocketShared::new(table, shared.clone()));
    let accept = listeners
        .into_iter()
        .zip(&runtimes)
        .map(|(socket, runtime)| {
            shared
                .tasks
                .spawn_on(accept_loop(socket, state.clone(), stop.clone()), runtime)
        })
        .collect();
    BoundSocket {
        state,
        stop,
        accept,
    }
}

async fn accept_loop(
    listener: std::net::TcpListener,
    socket: Arc<SocketShared>,
    stop: CancellationToken,
) {
    // Registered here, in the runtime (and so the epoll) of the worker that runs this loop.
    let listener = match TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(error) => {
            warn!(%error, "cannot register listening socket");
            return;
        }
    };
    // Connections this loop accepted that are still open: beyond the limit, new ones are
    // closed at once (shed) so that the established ones keep their worker's time and
    // descriptors.
    let open = Arc::new(AtomicUsize::new(0));
    let max = socket.shared.max_connections_per_worker;
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                if open.load(Ordering::Relaxed) >= max {
                    socket.shared.metrics.connections_shed.inc();
                    debug!(%peer, max, "connection shed: the worker is at its limit");
                    drop(stream);
                    continue;
                }
                open.fetch_add(1, Ordering::Relaxed);
                let slot = OpenSlot(open.clone());
                let (socket, stop) = (socket.clone(), stop.clone());
                socket.shared.tasks.clone().spawn(async move {
                    let _slot = slot;
                    connection(stream, peer, socket, stop).await;
                });
            }
            // A client that gave up before we accepted: nothing to do.
            Err(error)
                if matches!(
                    error.kind(),
                    io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
                ) =>
            {
                debug!(%error, "accept failed");
            }
            Err(error) => {
                // Typically EMFILE/ENFILE: back off instead of spinning on the error.
                warn!(%error, "accept failed; backing off");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    debug!(address = ?listener.local_addr().ok(), "listener closed");
}

/// One open connection of an accept loop, released when the connection task ends.
struct OpenSlot(Arc<AtomicUsize>);

impl Drop for OpenSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counts a client connection as active for as long as it lives (an upgraded tunnel included).
pub(crate) struct ActiveConn(Arc<Metrics>);

impl ActiveConn {
    pub(crate) fn new(metrics: &Arc<Metrics>) -> Self {
        metrics.connections_total.inc();
        metrics.connections_active.inc();
        ActiveConn(metrics.clone())
    }
}

impl Drop for ActiveConn {
    fn drop(&mut self) {
        self.0.connections_active.dec();
    }
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    socket: Arc<SocketShared>,
    drain: CancellationToken,
) {
    let active = ActiveConn::new(&socket.shared.metrics);
    let speaks = socket.table.load().speaks;
    match speaks {
        Speaks::Tls => Box::pin(serve_tls(stream, peer, socket, drain, active)).await,
        Speaks::Tcp => l4::tcp::serve(stream, peer, socket, active).await,
        Speaks::Http => serve_http(stream, peer, socket, drain, None, false, active).await,
        // A UDP socket has no connections, and a swap never changes what a socket speaks.
        Speaks::Udp => {}
    }
}

async fn serve_tls(
    mut stream: TcpStream,
    peer: SocketAddr,
    socket: Arc<SocketShared>,
    drain: CancellationToken,
    active: ActiveConn,
) {
    let shared = socket.shared.clone();
    let metrics = &shared.metrics;
    // One budget for the ClientHello and the rest of the handshake.
    let deadline = tokio::time::Instant::now() + shared.tls_handshake_timeout;
    let mut seen = Vec::new();
    let hello = tokio::select! {
        hello = tokio::time::timeout_at(deadline, tls::read_client_hello(&mut stream, &mut seen)) => hello,
        () = shared.kill.cancelled() => return,
    };
    let accepted = match hello {
        Ok(Ok(accepted)) => accepted,
        // A port probe or health check that connects and leaves: not a handshake.
        Ok(Err(HelloError::Closed { empty: true })) => return,
        Ok(Err(HelloError::Tls(error))) => {
            debug!(%peer, %error, "invalid ClientHello");
            metrics.tls_failure(FailureReason::of_tls(&error));
            return;
        }
        Ok(Err(HelloError::TooOld)) => {
            debug!(%peer, "client offered nothing newer than TLS 1.1");
            metrics.tls_failure(FailureReason::ProtocolVersion);
            return;
        }
        Ok(Err(HelloError::Closed { empty: false } | HelloError::TooLarge)) => {
            metrics.tls_failure(FailureReason::Other);
            return;
        }
        Err(_) => {
            metrics.tls_failure(FailureReason::Timeout);
            return;
        }
    };
    let sni = tls::sni_of(&accepted.client_hello());

    let table = socket.table.load_full();
    let Some(listener) = table.hosts.get(&sni).map(|&i| &table.listeners[i]) else {
        debug!(%peer, sni = &*sni, "no listener for this server name");
        metrics.tls_failure(FailureReason::NoCertificate);
        tls::refuse_name(&mut stream).await;
        return;
    };
    let (config, http) = match &listener.mode {
        ListenerMode::Terminate {
            config: Some(config),
            http,
        } => (config.clone(), *http),
        ListenerMode::Terminate { config: None, .. }
        | ListenerMode::Http
        | ListenerMode::Forward => {
            metrics.tls_failure(FailureReason::NoCertificate);
            tls::send_alert(&mut stream, tls::ALERT_HANDSHAKE_FAILURE).await;
            return;
        }
        ListenerMode::Passthrough => {
            let picked = stream::pick(listener, &sni);
            drop(table);
            match picked {
                Ok(target) => {
                    if stream::forward(&mut stream, &seen, target, false, &shared)
                        .await
                        .is_err()
                    {
                        tls::send_alert(&mut stream, tls::ALERT_HANDSHAKE_FAILURE).await;
                    }
                }
                Err(why) => {
                    debug!(%peer, sni = &*sni, why, "TLS passthrough refused");
                    metrics.tls_failure(FailureReason::NoRoute);
                    tls::refuse_name(&mut stream).await;
                }
            }
            return;
        }
    };
    // TLSRoute on a terminating listener: the backend is known before the handshake, and a
    // name without a route is refused without one.
    let tcp_backend = match (http, stream::pick(listener, &sni)) {
        (true, _) => None,
        (false, Ok(picked)) => Some(picked),
        (false, Err(why)) => {
            debug!(%peer, sni = &*sni, why, "TLS connection refused");
            metrics.tls_failure(FailureReason::NoRoute);
            tls::refuse_name(&mut stream).await;
            return;
        }
    };
    let handshakes = listener.handshakes.clone();
    drop(table);

    let handshake = StartHandshake::from_parts(accepted, stream).into_stream(config);
    let tls_stream = tokio::select! {
        result = tokio::time::timeout_at(deadline, handshake) => result,
        () = shared.kill.cancelled() => return,
    };
    let mut tls_stream = match tls_stream {
        Ok(Ok(s)) => s,
        Ok(Err(error)) => {
            debug!(%peer, sni = &*sni, %error, "TLS handshake failed");
            metrics.tls_failure(FailureReason::of_io(&error));
            return;
        }
        Err(_) => {
            metrics.tls_failure(FailureReason::Timeout);
            return;
        }
    };
    handshakes.inc();
    match tcp_backend {
        None => {
            let h2 = tls_stream.get_ref().1.alpn_protocol() == Some(b"h2");
            serve_http(tls_stream, peer, socket, drain, Some(sni), h2, active).await;
        }
        Some(target) => {
            let _ = stream::forward(&mut tls_stream, &[], target, true, &shared).await;
            let _ = tls_stream.shutdown().await;
        }
    }
}

/// Serves HTTP on a plaintext or decrypted stream: HTTP/1 on the HTTP/1 path (which hands the
/// connection to hyper for HTTP/2 prior knowledge and the requests it does not handle), HTTP/2
/// negotiated by ALPN on hyper. `sni`: the connection is TLS and its listener was chosen by
/// this name.
async fn serve_http<I>(
    io: I,
    peer: SocketAddr,
    socket: Arc<SocketShared>,
    drain: CancellationToken,
    sni: Option<Box<str>>,
    alpn_h2: bool,
    active: ActiveConn,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let shared = socket.shared.clone();
    let client_ip = HeaderValue::try_from(peer.ip().to_canonical().to_string())
        .unwrap_or_else(|_| HeaderValue::from_static("unknown"));
    let conn = Arc::new(ConnContext::new(socket, client_ip, sni, active));
    if alpn_h2 {
        return Box::pin(serve_hyper(io, peer, conn, drain, &shared, true)).await;
    }
    let outcome = tokio::select! {
        outcome = h1::serve(io, conn.clone(), drain.clone(), shared.h1) => outcome,
        () = shared.kill.cancelled() => return,
    };
    if let h1::Outcome::Handoff(io, pending) = outcome {
        let h2 = pending.starts_with(h1::H2_PREFACE);
        Box::pin(serve_hyper(
            Prefixed::new(pending, io),
            peer,
            conn,
            drain,
            &shared,
            h2,
        ))
        .await;
    }
}

/// Serves a connection with hyper: HTTP/2, and HTTP/1.1 requests the HTTP/1 path hands over.
async fn serve_hyper<I>(
    io: I,
    peer: SocketAddr,
    conn: Arc<ConnContext>,
    drain: CancellationToken,
    shared: &Shared,
    h2: bool,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let limits = shared.limits;
    let activity = Activity::new();
    // Boxed: hyper runs every HTTP/2 stream as a task of its own, and a task's future is moved
    // into the task and written back when it finishes. The request path's future is several
    // kilobytes; inline, those copies were a sixth of the CPU of an HTTP/2 benchmark.
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |req| {
            let conn = conn.clone();
            // The stream counts as open until its response body is done with.
            let stream = activity.start();
            Box::pin(async move {
                let resp = hyper_path::handle(conn, req).await;
                Ok::<_, Infallible>(resp.map(|body| ClientBody::new(body, stream, limits)))
            })
        })
    };
    let io = WriteLimited::new(io, limits.client_write, shared.metrics.clone());
    if h2 {
        let connection = shared.server_h2.serve_connection(TokioIo::new(io), service);
        drive(
            connection,
            |c| c.graceful_shutdown(),
            peer,
            drain,
            shared,
            Some(activity),
        )
        .await;
    } else {
        let connection = shared
            .server
            .serve_connection_with_upgrades(TokioIo::new(io), service);
        drive(
            connection,
            |c| c.graceful_shutdown(),
            peer,
            drain,
            shared,
            None,
        )
        .await;
    }
}

/// Runs a hyper connection to its end, or until the connection is drained, the data plane
/// starts closing (HTTP/2: GOAWAY) or an HTTP/2 connection has been idle for
/// `http2_idle_timeout` (`h2_activity`: its open streams); then shuts it down gracefully.
async fn drive<C, E>(
    connection: C,
    graceful_shutdown: impl FnOnce(Pin<&mut C>),
    peer: SocketAddr,
    drain: CancellationToken,
    shared: &Shared,
    h2_activity: Option<Arc<Activity>>,
) where
    C: std::future::Future<Output = Result<(), E>>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let limits = shared.limits;
    let h2 = h2_activity.is_some();
    tokio::pin!(connection);
    // HTTP/2 has no idle timeout of its own (PINGs only prove the peer alive): a connection
    // with no open stream for http2_idle_timeout is told to go (HTTP/1 idles are bounded by
    // hyper's header read timeout).
    let mut idle = Stall::new(limits.http2_idle);
    let idle_expired = std::future::poll_fn(|cx| {
        loop {
            let Some(activity) = &h2_activity else {
                return Poll::Pending;
            };
            std::task::ready!(idle.poll_expired(cx));
            match activity.idle_for() {
                Some(t) if t >= limits.http2_idle => return Poll::Ready(()),
                Some(t) => idle.touch(limits.http2_idle - t),
                None => idle.touch(limits.http2_idle),
            }
        }
    });
    tokio::pin!(idle_expired);
    tokio::select! {
        result = connection.as_mut() => {
            if let Err(error) = result {
                let error = error.into();
                if error
                    .downcast_ref::<hyper::Error>()
                    .is_some_and(hyper::Error::is_parse_too_large)
                {
                    shared.metrics.head_too_large(crate::metrics::Side::Request);
                }
                debug!(%peer, %error, "connection ended with an error");
            }
            return;
        }
        () = drain.cancelled() => {}
        // Draining the data plane (sockets still accept): an HTTP/2 client gets its GOAWAY now
        // and takes further requests to a new connection; HTTP/1 responses carry
        // `Connection: close` instead (hyper_path), so no idle connection is cut under a
        // client that is about to reuse it.
        () = shared.goaway.cancelled(), if h2 => {}
        () = &mut idle_expired => {
            shared.metrics.timeout(TimeoutKind::Http2Idle);
            debug!(%peer, "HTTP/2 connection idle; GOAWAY");
        }
        () = shared.kill.cancelled() => return,
    }
    // HTTP/1: finish the request in flight, then close (idle connections close now).
    // HTTP/2: GOAWAY, then finish the open streams.
    graceful_shutdown(connection.as_mut());
    tokio::select! {
        _ = connection => {}
        () = shared.kill.cancelled() => {}
    }
}

/// A transport whose first bytes were already read: they are replayed before the rest.
struct Prefixed<I> {
    prefix: Bytes,
    io: I,
}

impl<I> Prefixed<I> {
    fn new(prefix: Bytes, io: I) -> Self {
        Prefixed { prefix, io }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Prefixed<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix.split_to(n));
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Prefixed<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, data)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::bind;
    use std::io::{ErrorKind, Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};

    fn any_port() -> SocketAddr {
        "127.0.0.1:0".parse().unwrap()
    }

    #[test]
    fn a_worker_group_shares_one_port_and_each_socket_accepts() {
        let group = bind(any_port(), 3).unwrap();
        let addr = group[0].local_addr().unwrap();
        assert_ne!(addr.port(), 0);
        for socket in &group {
            assert_eq!(socket.local_addr().unwrap(), addr);
        }
        // The kernel spreads connections over the group by their addresses: with enough of
        // them, every socket gets some (the chance that one of three gets none of 60 is ~1e-10).
        let clients: Vec<TcpStream> = (0..60).map(|_| TcpStream::connect(addr).unwrap()).collect();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut accepted = 0;
        for socket in &group {
            let mut here = 0;
            while let Ok((mut conn, _)) = socket.accept() {
                assert!(conn.nodelay().unwrap(), "TCP_NODELAY is not inherited");
                conn.set_nonblocking(false).unwrap();
                conn.write_all(b"x").unwrap();
                here += 1;
            }
            assert!(here > 0, "a socket of the group accepted nothing");
            accepted += here;
        }
        assert_eq!(accepted, clients.len());
        let mut byte = [0u8; 1];
        for mut client in clients {
            client.read_exact(&mut byte).unwrap();
        }
    }

    #[test]
    fn a_worker_group_does_not_join_a_port_someone_listens_on() {
        // Another group (say, a second Gatehouse of the same user) on the port.
        let first = bind(any_port(), 2).unwrap();
        let taken = first[0].local_addr().unwrap();
        let error = bind(taken, 2).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::AddrInUse);
        // A plain listener.
        let plain = TcpListener::bind(any_port()).unwrap();
        let error = bind(plain.local_addr().unwrap(), 2).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::AddrInUse);
        // Once the first group is gone the port is free again.
        drop(first);
        assert_eq!(bind(taken, 2).unwrap().len(), 2);
    }
}
