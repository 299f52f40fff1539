//! UDP listeners: datagrams from one client address and port form a session, and a session
//! goes to one backend endpoint picked by weight when it starts, through a UDP socket of its
//! own (connected to the endpoint, so the kernel filters what comes back and reports an ICMP
//! port unreachable as an error on it). Answers from the endpoint go back to the client from
//! the listener's address.
//!
//! - **One task per socket, one per session.** The socket's task owns the session table (no
//!   lock): it receives from clients and sends on the session's socket. Each session has a
//!   task that relays the endpoint's answers. Both reuse buffers: the socket's task owns one,
//!   session tasks share one per thread, borrowed only between an `await` and the next, so no
//!   datagram costs an allocation.
//! - **Every session has a limit.** No datagram either way for `udp_idle_timeout` ends it
//!   (checked by a sweep every quarter of that, which compares counters: no clock read per
//!   datagram); a socket holds at most `udp_max_sessions`, and datagrams of new clients beyond
//!   that are dropped and counted. A backend that refuses (ICMP) ends its session, counts
//!   against the endpoint's health, and the client's next datagram starts a new one elsewhere.
//! - **Swaps keep live sessions** whose route is still the socket's and whose endpoint is still
//!   one of the route's; the others end, and the next datagram picks again.
//! - **Drops, not queues.** A datagram that finds a full socket buffer is dropped and counted,
//!   as the network would; nothing waits.
//!
//! A UDP listener is one socket served by one worker: a `SO_REUSEPORT` group would spread
//! clients over workers, but unlike TCP a UDP port has no listening state to guard it with, so
//! a group could silently join another process's on the same port.

use super::{L4Route, Picked};
use crate::Shared;
use crate::listeners::{BoundSocket, SocketShared, accept_runtimes};
use crate::metrics::{L4Error, Metrics};
use crate::table::{ClusterState, SocketTable};
use gatehouse_ir::Transport;
use socket2::{Domain, Protocol, SockRef, Socket, Type};
use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// The largest UDP payload (IPv4: 65,535 less the IP and UDP headers).
const MAX_DATAGRAM: usize = 65_507;

/// Datagrams handled per wake-up of a socket's task before it lets other tasks run.
const BATCH: usize = 64;

/// Limits of UDP sessions.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    pub idle_timeout: Duration,
    /// Per listener socket.
    pub max_sessions: usize,
}

/// Binds a UDP socket on `addr`.
pub(crate) fn bind(addr: SocketAddr) -> io::Result<std::net::UdpSocket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// Starts serving a socket from [`bind`] with `table`, on one worker (picked by the address,
/// so that UDP listeners spread over the workers).
pub(crate) fn start(
    socket: std::net::UdpSocket,
    table: SocketTable,
    shared: Arc<Shared>,
    stop: CancellationToken,
) -> BoundSocket {
    let runtimes = accept_runtimes(&shared);
    let port = socket.local_addr().map_or(0, |a| usize::from(a.port()));
    let runtime = &runtimes[port % runtimes.len()];
    let state = Arc::new(SocketShared::new(table, shared.clone()));
    let task = shared
        .tasks
        .spawn_on(serve(socket, state.clone(), stop.clone()), runtime);
    BoundSocket {
        state,
        stop,
        accept: vec![task],
    }
}

/// What a session's two tasks share.
#[derive(Default)]
struct Activity {
    /// Datagrams either way; the sweep compares it with what it saw last time.
    datagrams: AtomicU64,
    /// The endpoint refused (ICMP port unreachable) or the session's socket failed: the session
    /// is over, and the client's next datagram starts another.
    ended: AtomicBool,
}

struct Session {
    upstream: Arc<UdpSocket>,
    route: Arc<L4Route>,
    cluster: Arc<ClusterState>,
    endpoint: SocketAddr,
    activity: Arc<Activity>,
    /// `activity.datagrams` at the last sweep, and how many sweeps in a row saw no change.
    seen: u64,
    quiet_sweeps: u32,
    relay: JoinHandle<()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.relay.abort();
        self.route.metrics.active.dec();
    }
}

/// Quiet sweeps after which a session ends: sweeps run every quarter of the idle timeout, so a
/// session ends between one idle timeout and one and a quarter after its last datagram.
const QUIET_SWEEPS: u32 = 4;

struct UdpListener {
    socket: Arc<UdpSocket>,
    state: Arc<SocketShared>,
    table: Arc<SocketTable>,
    sessions: HashMap<SocketAddr, Session>,
    settings: Settings,
    metrics: Arc<Metrics>,
}

async fn serve(socket: std::net::UdpSocket, state: Arc<SocketShared>, stop: CancellationToken) {
    let socket = match UdpSocket::from_std(socket) {
        Ok(s) => Arc::new(s),
        Err(error) => {
            warn!(%error, "cannot register UDP socket");
            return;
        }
    };
    let shared = state.shared.clone();
    let mut swaps = state.swaps();
    let mut this = UdpListener {
        table: state.table.load_full(),
        socket,
        state,
        sessions: HashMap::new(),
        settings: shared.udp,
        metrics: shared.metrics.clone(),
    };
    let period = (this.settings.idle_timeout / QUIET_SWEEPS).max(Duration::from_millis(10));
    let mut sweep = pin!(tokio::time::sleep(period));
    let mut buf = vec![0u8; MAX_DATAGRAM].into_boxed_slice();
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => break,
            () = shared.kill.cancelled() => break,
            changed = swaps.changed() => {
                if changed.is_err() {
                    break;
                }
                this.swapped();
            }
            () = &mut sweep, if !this.sessions.is_empty() => {
                this.sweep();
                sweep.as_mut().reset(tokio::time::Instant::now() + period);
            }
            ready = this.socket.readable() => {
                if let Err(error) = ready {
                    warn!(%error, "UDP socket failed");
                    break;
                }
                let was_empty = this.sessions.is_empty();
                for _ in 0..BATCH {
                    match this.socket.try_recv_from(&mut buf) {
                        Ok((n, peer)) => this.datagram(&buf[..n], peer),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        // An ICMP error for an earlier answer to a client, say: not this
                        // socket's problem.
                        Err(error) => {
                            debug!(%error, "UDP receive failed");
                            break;
                        }
                    }
                }
                if was_empty && !this.sessions.is_empty() {
                    sweep.as_mut().reset(tokio::time::Instant::now() + period);
                }
            }
        }
    }
    debug!(address = ?this.socket.local_addr().ok(), sessions = this.sessions.len(), "UDP listener closed");
}

impl UdpListener {
    /// One datagram from `peer`: to its session, or to a new one.
    fn datagram(&mut self, data: &[u8], peer: SocketAddr) {
        if let Some(session) = self.sessions.get(&peer) {
            if !session.activity.ended.load(Ordering::Relaxed) {
                forward(session, data, &self.metrics);
                return;
            }
            self.sessions.remove(&peer);
        }
        if self.sessions.len() >= self.settings.max_sessions {
            self.metrics.l4_error(Transport::Udp, L4Error::SessionLimit);
            return;
        }
        let Some(route) = self.table.l4_route().cloned() else {
            self.metrics.l4_error(Transport::Udp, L4Error::NoRoute);
            return;
        };
        let (cluster, endpoint) = match route.pick() {
            Ok(Picked { cluster, endpoint }) => (cluster.clone(), endpoint.addr),
            Err(error) => {
                self.metrics.l4_error(Transport::Udp, error);
                return;
            }
        };
        let upstream = match connect(endpoint) {
            Ok(u) => Arc::new(u),
            Err(error) => {
                debug!(%peer, %endpoint, %error, "cannot open a UDP socket to the backend");
                self.metrics.l4_error(Transport::Udp, L4Error::Dropped);
                return;
            }
        };
        let activity = Arc::new(Activity::default());
        let relay = tokio::spawn(relay(
            upstream.clone(),
            self.socket.clone(),
            peer,
            activity.clone(),
            route.clone(),
            cluster.clone(),
            endpoint,
            self.metrics.clone(),
        ));
        route.metrics.opened.inc();
        route.metrics.active.inc();
        let session = Session {
            upstream,
            route,
            cluster,
            endpoint,
            activity,
            seen: 0,
            quiet_sweeps: 0,
            relay,
        };
        forward(&session, data, &self.metrics);
        self.sessions.insert(peer, session);
    }

    /// The table changed: sessions whose route and endpoint are still the socket's go on (on
    /// the new table's route); the others end.
    fn swapped(&mut self) {
        self.table = self.state.table.load_full();
        let removed = self.state.is_removed();
        let route = self.table.l4_route().filter(|_| !removed);
        self.sessions.retain(|_, s| match route {
            Some(r) if r.route == s.route.route && r.reaches(&s.cluster.name, s.endpoint) => {
                s.route = r.clone();
                true
            }
            _ => false,
        });
    }

    /// Ends the sessions that stayed quiet for the idle timeout, and the refused ones.
    fn sweep(&mut self) {
        self.sessions.retain(|_, s| {
            let now = s.activity.datagrams.load(Ordering::Relaxed);
            if now != s.seen {
                s.seen = now;
                s.quiet_sweeps = 0;
            } else {
                s.quiet_sweeps += 1;
            }
            s.quiet_sweeps < QUIET_SWEEPS && !s.activity.ended.load(Ordering::Relaxed)
        });
    }
}

/// A UDP socket connected to `endpoint`, from an ephemeral port of the matching family.
fn connect(endpoint: SocketAddr) -> io::Result<UdpSocket> {
    let local = match endpoint.ip() {
        IpAddr::V4(_) => SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0),
        IpAddr::V6(_) => SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), 0),
    };
    let socket = std::net::UdpSocket::bind(local)?;
    socket.set_nonblocking(true)?;
    socket.connect(endpoint)?;
    UdpSocket::from_std(socket)
}

/// Client to endpoint, without waiting: a full buffer drops the datagram.
fn forward(session: &Session, data: &[u8], metrics: &Metrics) {
    // A plain send, not tokio's `try_send`: that one answers WouldBlock until the reactor has
    // seen the new socket writable, which would drop every session's first datagram.
    match SockRef::from(&*session.upstream).send(data) {
        Ok(_) => {
            session.activity.datagrams.fetch_add(1, Ordering::Relaxed);
            let m = &session.route.metrics;
            m.datagrams_to_backend.inc();
            m.bytes_to_backend.inc_by(data.len() as u64);
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            metrics.l4_error(Transport::Udp, L4Error::Dropped);
        }
        // An error the socket kept from an ICMP message (refused, unreachable): the session
        // is over, whichever task saw it first.
        Err(error) => session_failed(
            &session.activity,
            &session.cluster,
            session.endpoint,
            &error,
            metrics,
        ),
    }
}

/// Ends a session whose socket reported `error`; a refusal counts against the endpoint.
fn session_failed(
    activity: &Activity,
    cluster: &ClusterState,
    endpoint: SocketAddr,
    error: &io::Error,
    metrics: &Metrics,
) {
    if activity.ended.swap(true, Ordering::Relaxed) {
        return;
    }
    if error.kind() == io::ErrorKind::ConnectionRefused {
        metrics.l4_error(Transport::Udp, L4Error::Refused);
        if let Some(e) = cluster.endpoints_iter().find(|e| e.addr == endpoint) {
            cluster.connect_failed(e);
        }
    } else {
        metrics.l4_error(Transport::Udp, L4Error::Dropped);
    }
    debug!(%endpoint, %error, "UDP session to the backend failed; it ends");
}

thread_local! {
    /// The buffer sessions' relays receive into: a relay borrows it only between two awaits,
    /// so the tasks of one thread never hold it at the same time.
    static RELAY_BUFFER: RefCell<Box<[u8]>> = RefCell::new(vec![0u8; MAX_DATAGRAM].into_boxed_slice());
}

/// Endpoint to client, for one session, until the session ends (the task is aborted) or its
/// socket fails.
#[allow(clippy::too_many_arguments)]
async fn relay(
    upstream: Arc<UdpSocket>,
    listener: Arc<UdpSocket>,
    client: SocketAddr,
    activity: Arc<Activity>,
    route: Arc<L4Route>,
    cluster: Arc<ClusterState>,
    endpoint: SocketAddr,
    metrics: Arc<Metrics>,
) {
    loop {
        // ERROR too: an ICMP refusal makes the socket report an error, not readable data.
        let Ok(ready) = upstream.ready(Interest::READABLE | Interest::ERROR).await else {
            return;
        };
        if activity.ended.load(Ordering::Relaxed) {
            return;
        }
        if ready.is_error() {
            match upstream.take_error() {
                Ok(Some(error)) | Err(error) => {
                    session_failed(&activity, &cluster, endpoint, &error, &metrics);
                    return;
                }
                // Taken by the other task already: clear the readiness so it does not spin.
                Ok(None) => {
                    let _ = upstream.try_io(Interest::ERROR, || {
                        Err::<(), _>(io::ErrorKind::WouldBlock.into())
                    });
                }
            }
        }
        loop {
            let received = RELAY_BUFFER.with_borrow_mut(|buf| {
                let n = upstream.try_recv(buf)?;
                activity.datagrams.fetch_add(1, Ordering::Relaxed);
                route.metrics.datagrams_to_client.inc();
                route.metrics.bytes_to_client.inc_by(n as u64);
                if let Err(error) = SockRef::from(&*listener).send_to(&buf[..n], &client.into()) {
                    debug!(%client, %error, "UDP datagram to the client dropped");
                    metrics.l4_error(Transport::Udp, L4Error::Dropped);
                }
                Ok::<_, io::Error>(())
            });
            match received {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) => {
                    session_failed(&activity, &cluster, endpoint, &error, &metrics);
                    return;
                }
            }
        }
    }
}
