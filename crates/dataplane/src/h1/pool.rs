//! Kept-alive HTTP/1.1 connections to one backend endpoint, used by the HTTP/1 path inside the
//! request's own task: no connection task, no channel, no wake-up of another task per request.
//!
//! Idle connections are kept per worker thread (a shard each, picked by a thread-local index)
//! so that a request reuses a connection registered with its own thread's reactor and the
//! shard's lock is never contended. Taking the most recently used connection first keeps a
//! small hot set and lets the rest reach the idle timeout. Whether an idle connection is still
//! open is read from the reactor's readiness without a system call: a backend that closed it
//! has made it readable.

use super::buf::ReadBuf;
use super::parse::ResponseHead;
use crate::connect::connect_with_retries;
use crate::table::{ClusterState, Endpoint};
use crate::upstream::{BoxError, TlsUpstream};
use std::cell::Cell;
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf as TokioReadBuf};
use tokio::net::TcpStream;

/// Read buffer of an upstream connection: response heads and bodies pass through it.
const READ_BUFFER: usize = 16 * 1024;
/// Idle connections kept per endpoint and worker beyond which the oldest is closed.
const MAX_IDLE_PER_SHARD: usize = 4096;

thread_local! {
    static SHARD: Cell<usize> = const { Cell::new(0) };
}

/// Tells the HTTP/1 pools which worker this thread is (`workers.rs` calls it when it starts a
/// worker thread). Threads that never call it share shard 0.
pub(crate) fn set_worker_index(index: usize) {
    SHARD.with(|s| s.set(index));
}

/// The transport of an upstream connection.
pub(crate) enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Io {
    fn tcp(&self) -> &TcpStream {
        match self {
            Io::Plain(s) => s,
            Io::Tls(s) => s.get_ref().0,
        }
    }
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut TokioReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write(cx, data),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, data),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// One upstream connection with its read buffer and the head of its current response.
pub(crate) struct Conn {
    pub io: Io,
    pub buf: ReadBuf,
    pub head: ResponseHead,
    /// Request heads written by the hyper path's client (reused).
    pub out: Vec<u8>,
    /// Came from the pool (it carried a request before): a failure before any response byte
    /// may be a close that raced the request.
    pub reused: bool,
    /// Largest response head accepted: the read buffer grows up to this while a head is
    /// incomplete.
    max_head: usize,
}

impl Conn {
    /// The read buffer is full of an incomplete response head: grows it (doubling) and says
    /// whether there is room to read more, or the head is over the limit.
    pub(crate) fn room_for_head(&mut self) -> bool {
        let capacity = self.buf.capacity();
        if capacity >= self.max_head {
            return false;
        }
        self.buf.grow_to((capacity * 2).min(self.max_head));
        true
    }

    /// Still open and silent: no end of stream, error or stray bytes since it was parked.
    fn looks_alive(&self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        let mut probe = [0u8; 1];
        matches!(self.io.tcp().try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}

struct Idle {
    conn: Box<Conn>,
    since: Instant,
}

/// The idle connections of one endpoint (and its backend TLS settings).
pub(crate) struct Pool {
    addr: SocketAddr,
    tls: Option<Arc<TlsUpstream>>,
    shards: Box<[Mutex<VecDeque<Idle>>]>,
    connect_timeout: Duration,
    idle_timeout: Duration,
    max_head: usize,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("addr", &self.addr)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl Pool {
    pub(crate) fn new(
        addr: SocketAddr,
        tls: Option<Arc<TlsUpstream>>,
        shards: usize,
        connect_timeout: Duration,
        idle_timeout: Duration,
        max_head: usize,
    ) -> Self {
        Pool {
            addr,
            tls,
            shards: (0..shards.max(1))
                .map(|_| Mutex::new(VecDeque::new()))
                .collect(),
            connect_timeout,
            idle_timeout,
            max_head,
        }
    }

    fn shard(&self) -> &Mutex<VecDeque<Idle>> {
        let i = SHARD.with(Cell::get) % self.shards.len();
        &self.shards[i]
    }

    /// The most recently parked connection that is still fresh and open.
    pub(crate) fn checkout(&self) -> Option<Box<Conn>> {
        let mut idle = self.shard().lock().unwrap_or_else(|e| e.into_inner());
        while let Some(Idle { mut conn, since }) = idle.pop_back() {
            if since.elapsed() < self.idle_timeout && conn.looks_alive() {
                conn.reused = true;
                return Some(conn);
            }
        }
        None
    }

    /// A new connection (TCP, then TLS when the cluster has backend TLS).
    pub(crate) async fn connect(&self) -> Result<Box<Conn>, BoxError> {
        let tcp = tokio::time::timeout(self.connect_timeout, TcpStream::connect(self.addr))
            .await
            .map_err(|_| "connect timed out")??;
        let _ = tcp.set_nodelay(true);
        let io = match &self.tls {
            None => Io::Plain(tcp),
            Some(tls) => {
                let stream = tokio::time::timeout(self.connect_timeout, tls.connect(tcp))
                    .await
                    .map_err(|_| "TLS handshake timed out")??;
                Io::Tls(Box::new(stream))
            }
        };
        Ok(Box::new(Conn {
            io,
            buf: ReadBuf::new(READ_BUFFER.min(self.max_head)),
            head: ResponseHead::default(),
            out: Vec::new(),
            reused: false,
            max_head: self.max_head,
        }))
    }

    /// Parks a connection whose last response was read to its end.
    pub(crate) fn checkin(&self, conn: Box<Conn>) {
        let mut idle = self.shard().lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() >= MAX_IDLE_PER_SHARD {
            idle.pop_front();
        }
        idle.push_back(Idle {
            conn,
            since: Instant::now(),
        });
    }

    /// Closes connections idle for longer than the timeout (oldest first in every shard).
    pub(crate) fn sweep(&self) {
        for shard in &self.shards {
            let mut idle = shard.lock().unwrap_or_else(|e| e.into_inner());
            while idle
                .front()
                .is_some_and(|i| i.since.elapsed() >= self.idle_timeout)
            {
                idle.pop_front();
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn idle_count(&self) -> usize {
        self.shards.iter().map(|s| s.lock().unwrap().len()).sum()
    }
}

/// A new connection from an endpoint's pool.
fn new_connection(
    endpoint: &Endpoint,
) -> Option<impl Future<Output = Result<Box<Conn>, BoxError>> + '_> {
    Some(endpoint.pool.as_deref()?.connect())
}

/// An idle pooled connection to the endpoint.
fn pooled(endpoint: &Endpoint) -> Option<Box<Conn>> {
    endpoint.pool.as_deref()?.checkout()
}

/// A connection for a request to `endpoint` of `cluster`: a pooled one, else a new one,
/// hedged and retried elsewhere as [`connect_with_retries`] does. Returns the connection and
/// the endpoint it goes to.
pub(crate) async fn checkout_or_connect<'e>(
    cluster: &'e ClusterState,
    endpoint: &'e Endpoint,
) -> Result<(Box<Conn>, &'e Endpoint), BoxError> {
    connect_with_retries(cluster, endpoint, pooled, new_connection).await
}

/// A new connection after a kept-alive one to `stale` turned out closed before answering: a
/// new connection to the same endpoint (none of its pooled ones: they may be as stale), or,
/// when that fails too (the backend died with the connection, as a killed pod does), one to
/// another endpoint. Nothing of the request reached a backend that answered, so the callers
/// only come here for requests they may send again.
pub(crate) async fn reconnect<'e>(
    cluster: &'e ClusterState,
    stale: &'e Endpoint,
) -> Result<(Box<Conn>, &'e Endpoint), BoxError> {
    let reuse = |endpoint: &'e Endpoint| {
        if std::ptr::eq(endpoint, stale) {
            None
        } else {
            pooled(endpoint)
        }
    };
    connect_with_retries(cluster, stale, reuse, new_connection).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn reuses_open_connections_and_drops_closed_or_stale_ones() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let pool = Pool::new(
            addr,
            None,
            2,
            Duration::from_secs(1),
            Duration::from_secs(60),
            64 * 1024,
        );
        let (a, accepted) = tokio::join!(pool.connect(), listener.accept());
        let (mut server_a, _) = accepted.unwrap();
        pool.checkin(a.unwrap());
        assert_eq!(pool.idle_count(), 1);
        let again = pool.checkout().expect("open connection is reused");
        assert!(again.reused);
        pool.checkin(again);

        // The backend closes the idle connection: it is not handed out again.
        server_a.shutdown().await.unwrap();
        drop(server_a);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(pool.checkout().is_none());
        assert_eq!(pool.idle_count(), 0);

        // Idle past the timeout: swept.
        let short = Pool::new(
            addr,
            None,
            1,
            Duration::from_secs(1),
            Duration::from_millis(10),
            64 * 1024,
        );
        let (b, _server_b) = tokio::join!(short.connect(), listener.accept());
        short.checkin(b.unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
        short.sweep();
        assert_eq!(short.idle_count(), 0);
    }
}
