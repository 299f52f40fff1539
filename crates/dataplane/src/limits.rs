//! Every connection state has a timeout: the ones that apply after a request's head, in one
//! place, with the metric that counts each cut.
//!
//! | state | limit | on expiry |
//! |---|---|---|
//! | waiting for a request head (HTTP/1, idle keep-alive included) | `header_read_timeout` | close (408 if a head had started) |
//! | HTTP/2 connection with no open stream | `http2_idle_timeout` | GOAWAY, then close |
//! | HTTP/2 peer not answering PINGs | `http2_keepalive_interval` + `http2_keepalive_timeout` | close |
//! | request body: no byte from the client | `request_body_timeout` | abort the exchange, close |
//! | response head from the backend | the rule's timeout, else `default_request_timeout` | 504 |
//! | response body: no byte from the backend | `backend_read_timeout` | abort, close the client connection |
//! | writing to a client that does not read | `client_write_timeout` | close |
//! | upgraded tunnel (WebSocket), TLSRoute or TCPRoute stream with no byte either way | `tunnel_idle_timeout` | close both sides |
//! | connecting to a backend (HTTP pools, TLSRoute, TCPRoute) | `connect_timeout` | next endpoint, then 502 / close |
//! | UDP session with no datagram either way | `udp_idle_timeout` | session dropped |
//! | TLS handshake | `tls_handshake_timeout` | close |
//!
//! Timers are re-armed lazily (one timer per connection or body, checked against the current
//! deadline when it fires), so a busy connection does not pay a timer operation per read.

use crate::Metrics;
use crate::mirror::{MirrorBody, Taps};
use prometheus_client::metrics::counter::Counter;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// Which limit cut a connection or an exchange short (the `kind` label of
/// `gatehouse_timeouts_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum TimeoutKind {
    HeaderRead,
    Http2Idle,
    RequestBody,
    BackendRead,
    ClientWrite,
    TunnelIdle,
}

impl TimeoutKind {
    pub(crate) const ALL: [TimeoutKind; 6] = [
        TimeoutKind::HeaderRead,
        TimeoutKind::Http2Idle,
        TimeoutKind::RequestBody,
        TimeoutKind::BackendRead,
        TimeoutKind::ClientWrite,
        TimeoutKind::TunnelIdle,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TimeoutKind::HeaderRead => "header_read",
            TimeoutKind::Http2Idle => "http2_idle",
            TimeoutKind::RequestBody => "request_body",
            TimeoutKind::BackendRead => "backend_read",
            TimeoutKind::ClientWrite => "client_write",
            TimeoutKind::TunnelIdle => "tunnel_idle",
        }
    }

    pub(crate) fn error(self) -> io::Error {
        io::Error::new(io::ErrorKind::TimedOut, self.as_str())
    }
}

/// The limits that apply after a request's head (see the module documentation).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub request_body: Duration,
    pub backend_read: Duration,
    pub client_write: Duration,
    pub tunnel_idle: Duration,
    pub http2_idle: Duration,
}

/// A deadline that moves with progress: `touch` pushes it back, `poll_expired` fires once it
/// passed. One timer, re-armed only when it fires early.
pub(crate) struct Stall {
    sleep: Pin<Box<Sleep>>,
    pub(crate) deadline: Instant,
}

impl Stall {
    pub(crate) fn new(after: Duration) -> Self {
        let deadline = Instant::now() + after;
        Stall {
            sleep: Box::pin(tokio::time::sleep_until(deadline)),
            deadline,
        }
    }

    /// Progress: the deadline is now `after` from now.
    pub(crate) fn touch(&mut self, after: Duration) {
        self.deadline = Instant::now() + after;
    }

    /// `Ready` once the current deadline has passed.
    pub(crate) fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if self.sleep.deadline() > self.deadline {
                self.sleep.as_mut().reset(self.deadline);
            }
            ready!(self.sleep.as_mut().poll(cx));
            if Instant::now() >= self.deadline {
                return Poll::Ready(());
            }
            self.sleep.as_mut().reset(self.deadline);
        }
    }
}

/// Watches an exchange for stalls: given the bytes moved so far and which side it waits for,
/// says when that side has not moved for its limit.
pub(crate) struct Watch<'a> {
    stall: &'a mut Stall,
    limits: Limits,
    /// Progress last seen, and when it changed.
    last: (u64, Instant),
}

impl<'a> Watch<'a> {
    pub(crate) fn new(stall: &'a mut Stall, limits: Limits, progress: u64) -> Self {
        Watch {
            stall,
            limits,
            last: (progress, Instant::now()),
        }
    }

    fn limit(&self, kind: TimeoutKind) -> Duration {
        match kind {
            TimeoutKind::RequestBody => self.limits.request_body,
            TimeoutKind::BackendRead => self.limits.backend_read,
            TimeoutKind::ClientWrite => self.limits.client_write,
            TimeoutKind::TunnelIdle => self.limits.tunnel_idle,
            TimeoutKind::Http2Idle => self.limits.http2_idle,
            TimeoutKind::HeaderRead => Duration::MAX,
        }
    }

    /// Call when the exchange is about to return `Pending` while waiting for `waiting_for`.
    /// `Ready(kind)`: nothing moved for that side's limit.
    pub(crate) fn poll(
        &mut self,
        cx: &mut Context<'_>,
        progress: u64,
        waiting_for: TimeoutKind,
    ) -> Poll<TimeoutKind> {
        if progress != self.last.0 {
            self.last = (progress, Instant::now());
        }
        self.stall.deadline = self.last.1 + self.limit(waiting_for);
        ready!(self.stall.poll_expired(cx));
        Poll::Ready(waiting_for)
    }
}

/// A request body on its way to a backend through hyper's clients: a client that stops
/// sending it for `request_body_timeout` makes it fail (the backend request is aborted)
/// instead of holding the stream and the backend connection. A mirrored request's body also
/// feeds the copies of its mirrors ([`Taps`]) as it is read; a mirror's own request body is a
/// [`MirrorBody`] (its pace is the real body's, so it has no stall limit of its own).
pub(crate) struct IdleBody {
    inner: Source,
    stall: Stall,
    limit: Duration,
    metrics: Arc<Metrics>,
    /// Mirrored requests only.
    taps: Option<Box<Taps>>,
}

enum Source {
    Client(hyper::body::Incoming),
    Mirror(MirrorBody),
    /// A body read ahead for retries (`retry`): the data, then the trailers.
    Replay(Option<bytes::Bytes>, Option<http::HeaderMap>),
}

/// A client's request body on the hyper path: as it arrives, or already read into memory (by
/// an `ExternalAuth` filter that forwards the body to its server, see `ext_auth`).
#[derive(Debug)]
pub(crate) enum RequestBody {
    Streaming(hyper::body::Incoming),
    /// The whole body: its data (`None`: empty), then its trailers.
    Buffered(Option<bytes::Bytes>, Option<http::HeaderMap>),
}

impl http_body::Body for RequestBody {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, hyper::Error>>> {
        match self.get_mut() {
            RequestBody::Streaming(body) => Pin::new(body).poll_frame(cx),
            RequestBody::Buffered(data, trailers) => {
                let frame = match data.take() {
                    Some(data) => Some(http_body::Frame::data(data)),
                    None => trailers.take().map(http_body::Frame::trailers),
                };
                Poll::Ready(frame.map(Ok))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Streaming(body) => body.is_end_stream(),
            RequestBody::Buffered(data, trailers) => data.is_none() && trailers.is_none(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            RequestBody::Streaming(body) => body.size_hint(),
            RequestBody::Buffered(data, _) => {
                http_body::SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

impl IdleBody {
    pub(crate) fn new(inner: RequestBody, limit: Duration, metrics: Arc<Metrics>) -> Self {
        let inner = match inner {
            RequestBody::Streaming(body) => Source::Client(body),
            // In memory already: nothing left to stall.
            RequestBody::Buffered(data, trailers) => Source::Replay(data, trailers),
        };
        IdleBody {
            inner,
            stall: Stall::new(limit),
            limit,
            metrics,
            taps: None,
        }
    }

    /// The body of a mirror's request.
    pub(crate) fn mirror(body: MirrorBody, limit: Duration, metrics: Arc<Metrics>) -> Self {
        IdleBody {
            inner: Source::Mirror(body),
            stall: Stall::new(limit),
            limit,
            metrics,
            taps: None,
        }
    }

    /// A body kept for retries, sent again from memory.
    pub(crate) fn replay(
        data: Option<bytes::Bytes>,
        trailers: Option<http::HeaderMap>,
        limit: Duration,
        metrics: Arc<Metrics>,
    ) -> Self {
        IdleBody {
            inner: Source::Replay(data, trailers),
            stall: Stall::new(limit),
            limit,
            metrics,
            taps: None,
        }
    }

    /// Copies the body to these mirrors as it is read.
    pub(crate) fn tapped(mut self, taps: Taps) -> Self {
        if !taps.is_empty() {
            self.taps = Some(Box::new(taps));
        }
        self
    }
}

impl http_body::Body for IdleBody {
    type Data = bytes::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let inner = match &mut this.inner {
            Source::Client(body) => body,
            Source::Mirror(body) => return Pin::new(body).poll_frame(cx),
            Source::Replay(data, trailers) => {
                let frame = match data.take() {
                    Some(data) => Some(http_body::Frame::data(data)),
                    None => trailers.take().map(http_body::Frame::trailers),
                };
                // A body read ahead (by an ExternalAuth filter) still feeds its mirrors.
                if let Some(taps) = this.taps.as_deref_mut() {
                    if let Some(d) = frame.as_ref().and_then(|f| f.data_ref()) {
                        taps.data(d);
                    }
                    if data.is_none() && trailers.is_none() {
                        taps.end();
                    }
                }
                return Poll::Ready(frame.map(Ok));
            }
        };
        match Pin::new(&mut *inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.stall.touch(this.limit);
                if let Some(taps) = this.taps.as_deref_mut() {
                    match &frame {
                        Some(Ok(f)) => {
                            if let Some(data) = f.data_ref() {
                                taps.data(data);
                            }
                            if inner.is_end_stream() {
                                taps.end();
                            }
                        }
                        None => taps.end(),
                        // Dropping the taps fails the copies: a mirror never gets a body cut
                        // short as if it were whole.
                        Some(Err(_)) => this.taps = None,
                    }
                }
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                ready!(this.stall.poll_expired(cx));
                this.metrics.timeout(TimeoutKind::RequestBody);
                this.taps = None;
                Poll::Ready(Some(Err(TimeoutKind::RequestBody.error().into())))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Source::Client(body) => body.is_end_stream(),
            Source::Mirror(body) => body.is_end_stream(),
            Source::Replay(data, trailers) => data.is_none() && trailers.is_none(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match &self.inner {
            Source::Client(body) => body.size_hint(),
            Source::Mirror(body) => body.size_hint(),
            Source::Replay(data, _) => {
                http_body::SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

impl std::fmt::Debug for IdleBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdleBody")
    }
}

/// A client transport whose writes may not stay blocked for longer than a limit: a client
/// that stops reading (its receive window full) is cut off instead of holding the connection
/// and its backend forever. Used on the hyper path; the HTTP/1 path times its own writes.
pub(crate) struct WriteLimited<I> {
    io: I,
    limit: Duration,
    /// Armed while a write is blocked.
    blocked: Option<Pin<Box<Sleep>>>,
    metrics: Arc<Metrics>,
}

impl<I> WriteLimited<I> {
    pub(crate) fn new(io: I, limit: Duration, metrics: Arc<Metrics>) -> Self {
        WriteLimited {
            io,
            limit,
            blocked: None,
            metrics,
        }
    }

    fn blocked(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let limit = self.limit;
        let sleep = self
            .blocked
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        ready!(sleep.as_mut().poll(cx));
        self.metrics.timeout(TimeoutKind::ClientWrite);
        Poll::Ready(TimeoutKind::ClientWrite.error())
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for WriteLimited<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for WriteLimited<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_write(cx, data) {
            Poll::Ready(r) => {
                this.blocked = None;
                Poll::Ready(r)
            }
            Poll::Pending => this.blocked(cx).map(Err),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_write_vectored(cx, bufs) {
            Poll::Ready(r) => {
                this.blocked = None;
                Poll::Ready(r)
            }
            Poll::Pending => this.blocked(cx).map(Err),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_flush(cx) {
            Poll::Ready(r) => {
                this.blocked = None;
                Poll::Ready(r)
            }
            Poll::Pending => this.blocked(cx).map(Err),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// A transport that counts the bytes read through it into a shared counter (the idle check)
/// and, when given, into a metric of its direction.
struct Counted<'a, I> {
    io: &'a mut I,
    moved: &'a AtomicU64,
    metric: Option<&'a Counter>,
}

impl<I: AsyncRead + Unpin> AsyncRead for Counted<'_, I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut *this.io).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            this.moved.fetch_add(n as u64, Ordering::Relaxed);
            if let Some(metric) = this.metric {
                metric.inc_by(n as u64);
            }
        }
        r
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Counted<'_, I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.get_mut().io).poll_write(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().io).poll_shutdown(cx)
    }
}

/// Bytes each direction of a tunnel or TCP stream copies per read and write. tokio's default
/// is 8 KiB: a 1 MiB response then costs 128 reads and 128 writes through the proxy, and the
/// syscalls, not the copying, set the pace of bulk transfers (nginx's stream proxy reads 16 KiB
/// at a time). Each direction holds its buffer for the connection's life, so this is also the
/// memory an idle WebSocket or TCP connection pins: 2 × this (figures: docs/architecture.md,
/// Layer 4).
const COPY_BUFFER: usize = 16 * 1024;

/// Copies both ways until both sides closed (a side that ends its stream gets the other's
/// write side shut down, so half-closed connections keep working), or until no byte moved in
/// either direction for `idle` (then both are dropped by the caller): an idle upgraded tunnel
/// or TCP stream does not hold its descriptors forever. `counted`: metrics for the bytes read
/// from `a` and from `b`.
pub(crate) async fn copy_bidirectional_idle<A, B>(
    a: &mut A,
    b: &mut B,
    idle: Duration,
    metrics: &Metrics,
    counted: Option<[&Counter; 2]>,
) -> io::Result<()>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let moved = AtomicU64::new(0);
    let mut a = Counted {
        io: a,
        moved: &moved,
        metric: counted.map(|[from_a, _]| from_a),
    };
    let mut b = Counted {
        io: b,
        moved: &moved,
        metric: counted.map(|[_, from_b]| from_b),
    };
    let copy = tokio::io::copy_bidirectional_with_sizes(&mut a, &mut b, COPY_BUFFER, COPY_BUFFER);
    tokio::pin!(copy);
    let mut stall = Stall::new(idle);
    let mut seen = 0;
    loop {
        tokio::select! {
            result = &mut copy => return result.map(|_| ()),
            () = std::future::poll_fn(|cx| stall.poll_expired(cx)) => {
                let now = moved.load(Ordering::Relaxed);
                if now == seen {
                    metrics.timeout(TimeoutKind::TunnelIdle);
                    return Err(TimeoutKind::TunnelIdle.error());
                }
                seen = now;
                stall.touch(idle);
            }
        }
    }
}

/// Streams in flight on one hyper connection, and since when there have been none: an
/// HTTP/2 connection with no open stream for `http2_idle_timeout` is sent a GOAWAY.
pub(crate) struct Activity {
    streams: AtomicUsize,
    /// Milliseconds since `epoch` at which the count last dropped to zero (0: the start).
    idle_since_ms: AtomicU64,
    epoch: Instant,
}

impl Activity {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Activity {
            streams: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A stream starts; the guard ends it when dropped (with its response body).
    pub(crate) fn start(self: &Arc<Self>) -> StreamGuard {
        self.streams.fetch_add(1, Ordering::Relaxed);
        StreamGuard(Arc::clone(self))
    }

    /// How long the connection has had no stream, if it has none.
    pub(crate) fn idle_for(&self) -> Option<Duration> {
        if self.streams.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let since = self.idle_since_ms.load(Ordering::Relaxed);
        Some(Duration::from_millis(self.now_ms().saturating_sub(since)))
    }
}

/// Counts one stream as in flight until dropped.
pub(crate) struct StreamGuard(Arc<Activity>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if self.0.streams.fetch_sub(1, Ordering::Relaxed) == 1 {
            let now = self.0.now_ms();
            self.0.idle_since_ms.store(now, Ordering::Relaxed);
        }
    }
}

impl std::fmt::Debug for StreamGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StreamGuard")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_stall_fires_only_after_its_latest_deadline() {
        let mut stall = Stall::new(Duration::from_secs(10));
        tokio::time::advance(Duration::from_secs(8)).await;
        stall.touch(Duration::from_secs(10));
        tokio::time::advance(Duration::from_secs(8)).await;
        assert!(
            std::future::poll_fn(|cx| Poll::Ready(stall.poll_expired(cx)))
                .await
                .is_pending()
        );
        tokio::time::advance(Duration::from_secs(3)).await;
        assert!(
            std::future::poll_fn(|cx| Poll::Ready(stall.poll_expired(cx)))
                .await
                .is_ready()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn activity_counts_streams_and_idle_time() {
        let a = Activity::new();
        assert_eq!(a.idle_for(), Some(Duration::ZERO));
        let g = a.start();
        assert_eq!(a.idle_for(), None);
        tokio::time::advance(Duration::from_secs(5)).await;
        drop(g);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(a.idle_for(), Some(Duration::from_secs(2)));
    }
}
