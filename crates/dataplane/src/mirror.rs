//! `RequestMirror`: a copy of a request goes to another cluster, on a task of its own, and
//! its response is read and thrown away.
//!
//! The real request must never wait for or fail because of a mirror, so:
//! - a mirror's request runs on its own task, after the real request has been prepared; the
//!   real request goes on at once;
//! - a request body is copied frame by frame as the real request's body is read (the frames
//!   are reference-counted `Bytes`, so a copy costs no memcpy) into a buffer of at most
//!   [`MIRROR_BUFFER`] bytes per mirror. A mirror that falls that far behind is abandoned
//!   at once (its request is aborted, never sent short, and its task ends even while its
//!   connection is blocked writing to a backend that does not read), and the real body keeps
//!   flowing;
//! - at most [`MAX_IN_FLIGHT`] mirror requests run at once per data plane; beyond that new
//!   mirror copies are dropped, so a slow mirror backend cannot pile up tasks and memory;
//! - a mirror exchange (its response body included) is bounded by the rule's timeout, or
//!   [`DEFAULT_MIRROR_TIMEOUT`].
//!
//! Mirrored rules are served on the hyper path (the HTTP/1 path hands such requests over),
//! where bodies are streams of frames that can be copied; see `h1::session`.
//! `gatehouse_mirror_requests_total{cluster, result}` counts what became of each copy.

use crate::Shared;
use crate::filters::Filter;
use crate::limits::IdleBody;
use crate::metrics::MirrorMetrics;
use crate::table::{ClusterState, Endpoint};
use bytes::Bytes;
use http::header::HOST;
use http::{HeaderValue, Request, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::debug;

/// Request body bytes buffered per mirror copy before the copy is abandoned.
pub(crate) const MIRROR_BUFFER: usize = 256 * 1024;
/// Mirror requests in flight per data plane beyond which new copies are dropped.
pub(crate) const MAX_IN_FLIGHT: usize = 1024;
/// The bound of a mirror exchange when its rule sets no timeout.
pub(crate) const DEFAULT_MIRROR_TIMEOUT: Duration = Duration::from_secs(30);

/// A compiled `RequestMirror` filter.
#[derive(Debug)]
pub(crate) struct MirrorSpec {
    pub cluster: Arc<ClusterState>,
    /// Mirrors `numerator` requests in `denominator`.
    pub numerator: u32,
    pub denominator: u32,
    pub metrics: MirrorMetrics,
}

impl MirrorSpec {
    fn sampled(&self) -> bool {
        self.numerator >= self.denominator || fastrand::u32(0..self.denominator) < self.numerator
    }
}

/// The copies of a request body on their way to mirrors, fed by the real request's body as it
/// is read (see [`IdleBody`]).
#[derive(Debug, Default)]
pub(crate) struct Taps(Vec<Tap>);

#[derive(Debug)]
struct Tap {
    tx: mpsc::UnboundedSender<Bytes>,
    state: Arc<TapState>,
}

/// Shared by a tap and the mirror body it feeds.
#[derive(Debug, Default)]
struct TapState {
    /// Bytes sent and not yet taken by the mirror's request.
    queued: AtomicUsize,
    /// The whole body was sent: the end of the channel is the end of the body, not a copy
    /// cut short.
    complete: AtomicBool,
    /// The copy was abandoned because it fell [`MIRROR_BUFFER`] behind.
    overflowed: AtomicBool,
    /// Notified when it was: the mirror's request ends then, even while its client is blocked
    /// writing to a backend that does not read (and so never polls the body to see it fail).
    abandoned: tokio::sync::Notify,
}

impl Taps {
    /// A data frame of the real body.
    pub(crate) fn data(&mut self, data: &Bytes) {
        self.0.retain(|tap| {
            let queued = tap.state.queued.load(Ordering::Acquire);
            if queued + data.len() > MIRROR_BUFFER {
                tap.state.overflowed.store(true, Ordering::Release);
                tap.state.abandoned.notify_one();
                return false;
            }
            tap.state.queued.fetch_add(data.len(), Ordering::AcqRel);
            // A closed channel: the mirror's request is already over (its task counted how).
            tap.tx.send(data.clone()).is_ok()
        });
    }

    /// The real body ended: every mirror body ends too. (Dropping `Taps` without this, when
    /// the real body fails or is abandoned, makes the mirror bodies fail.)
    pub(crate) fn end(&mut self) {
        for tap in self.0.drain(..) {
            tap.state.complete.store(true, Ordering::Release);
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A mirror's request body: the frames its tap copied. Ends when the tap saw the real body
/// end, fails when the tap was dropped before (real body failed, or the copy fell behind).
#[derive(Debug)]
pub(crate) struct MirrorBody {
    rx: Option<mpsc::UnboundedReceiver<Bytes>>,
    state: Arc<TapState>,
    size: SizeHint,
}

impl MirrorBody {
    /// A body of nothing, for bodiless requests.
    fn empty() -> Self {
        MirrorBody {
            rx: None,
            state: Arc::default(),
            size: SizeHint::with_exact(0),
        }
    }
}

impl Body for MirrorBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let Some(rx) = this.rx.as_mut() else {
            return Poll::Ready(None);
        };
        match rx.poll_recv(cx) {
            Poll::Ready(Some(data)) => {
                this.state.queued.fetch_sub(data.len(), Ordering::AcqRel);
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Poll::Ready(None) => {
                this.rx = None;
                if this.state.complete.load(Ordering::Acquire) {
                    Poll::Ready(None)
                } else {
                    Poll::Ready(Some(
                        Err("mirror copy of the request body abandoned".into()),
                    ))
                }
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rx.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        self.size
    }
}

/// Whether any filter of the rule or of its backends mirrors.
pub(crate) fn any(filters: &[Filter]) -> bool {
    filters.iter().any(|f| matches!(f, Filter::Mirror(_)))
}

/// Starts the mirrors among `filters` for `req`, the real request as prepared for its backend
/// (filters applied, forwarding fields set). Returns the taps to feed with the real body as it
/// is read (empty for a bodiless request, or when no mirror was sampled or had room).
pub(crate) fn start<'f>(
    shared: &Arc<Shared>,
    filters: impl Iterator<Item = &'f Filter>,
    req: &Request<impl Body>,
    timeout: Option<Duration>,
) -> Taps {
    let mut taps = Taps::default();
    let has_body = !req.body().is_end_stream();
    for filter in filters {
        let Filter::Mirror(spec) = filter else {
            continue;
        };
        if !spec.sampled() {
            continue;
        }
        if shared.mirrors_in_flight.fetch_add(1, Ordering::AcqRel) >= MAX_IN_FLIGHT {
            shared.mirrors_in_flight.fetch_sub(1, Ordering::AcqRel);
            spec.metrics.dropped.inc();
            continue;
        }
        let in_flight = InFlight(shared.clone());
        let body = if has_body {
            let (tx, rx) = mpsc::unbounded_channel();
            let state = Arc::new(TapState::default());
            taps.0.push(Tap {
                tx,
                state: state.clone(),
            });
            MirrorBody {
                rx: Some(rx),
                state,
                size: req.body().size_hint(),
            }
        } else {
            MirrorBody::empty()
        };
        let head = Head {
            method: req.method().clone(),
            uri: req.uri().clone(),
            headers: req.headers().clone(),
        };
        let cluster = spec.cluster.clone();
        let metrics = spec.metrics.clone();
        let limit = timeout.unwrap_or(DEFAULT_MIRROR_TIMEOUT);
        let kill = shared.kill.clone();
        shared.tasks.spawn(async move {
            let state = body.state.clone();
            let exchange =
                tokio::time::timeout(limit, exchange(&in_flight.0, &cluster, head, body));
            let result = tokio::select! {
                r = exchange => r,
                () = state.abandoned.notified() => {
                    metrics.dropped.inc();
                    return;
                }
                () = kill.cancelled() => return,
            };
            match result {
                Ok(Ok(())) => {
                    metrics.ok.inc();
                }
                _ if state.overflowed.load(Ordering::Acquire) => {
                    metrics.dropped.inc();
                }
                Ok(Err(error)) => {
                    debug!(cluster = &*cluster.name, %error, "mirror request failed");
                    metrics.error.inc();
                }
                Err(_) => {
                    debug!(cluster = &*cluster.name, "mirror request timed out");
                    metrics.error.inc();
                }
            }
        });
    }
    taps
}

/// Counts a mirror request in flight until dropped.
struct InFlight(Arc<Shared>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.mirrors_in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The parts of the real request a mirror copies.
struct Head {
    method: http::Method,
    uri: Uri,
    headers: http::HeaderMap,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Sends the copy to an endpoint of `cluster` and reads its response to the end (so that a
/// pooled connection can be reused), discarding it.
async fn exchange(
    shared: &Arc<Shared>,
    cluster: &ClusterState,
    head: Head,
    body: MirrorBody,
) -> Result<(), BoxError> {
    let endpoint = cluster.pick().ok_or("no endpoints")?;
    if cluster.tls_broken {
        return Err("upstream TLS is misconfigured".into());
    }
    let parts = retarget(head, endpoint)?;
    if endpoint.pool.is_some() && body.is_end_stream() {
        let response = crate::h1::client::send(cluster, endpoint, &parts)
            .await
            .map_err(|e| format!("{e:?}"))?;
        drain(response.into_body()).await
    } else {
        let req = Request::from_parts(parts, body)
            .map(|b| IdleBody::mirror(b, shared.limits.request_body, shared.metrics.clone()));
        let response = shared
            .upstreams
            .send(endpoint, req)
            .await
            .map_err(|e| format!("{e:?}"))?;
        drain(response.into_body()).await
    }
}

async fn drain<B>(mut body: B) -> Result<(), BoxError>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    while let Some(frame) = body.frame().await {
        frame.map_err(Into::into)?;
    }
    Ok(())
}

/// The real request's head, re-addressed to a mirror endpoint: its URI points at the endpoint
/// (HTTP/1) or carries the host as authority (h2c), by the same [`crate::hyper_path::address`]
/// as the real backend's.
fn retarget(head: Head, endpoint: &Endpoint) -> Result<http::request::Parts, BoxError> {
    let Head {
        method,
        uri,
        mut headers,
    } = head;
    let host = headers.get(HOST).cloned().or_else(|| {
        uri.authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    });
    let (version, uri) =
        crate::hyper_path::address(endpoint, host, &mut headers, uri.path_and_query().cloned())?;
    let (mut parts, ()) = Request::new(()).into_parts();
    parts.method = method;
    parts.uri = uri;
    parts.version = version;
    parts.headers = headers;
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tap() -> (Taps, MirrorBody) {
        let (tx, rx) = mpsc::unbounded_channel();
        let state = Arc::new(TapState::default());
        let taps = Taps(vec![Tap {
            tx,
            state: state.clone(),
        }]);
        let body = MirrorBody {
            rx: Some(rx),
            state,
            size: SizeHint::default(),
        };
        (taps, body)
    }

    #[tokio::test]
    async fn a_copied_body_ends_when_the_real_one_does() {
        let (mut taps, body) = tap();
        taps.data(&Bytes::from_static(b"hello "));
        taps.data(&Bytes::from_static(b"mirror"));
        taps.end();
        let collected = body.collect().await.unwrap().to_bytes();
        assert_eq!(&collected[..], b"hello mirror");
    }

    #[tokio::test]
    async fn a_real_body_that_fails_fails_the_copy() {
        let (mut taps, body) = tap();
        taps.data(&Bytes::from_static(b"partial"));
        drop(taps);
        assert!(body.collect().await.is_err());
    }

    #[tokio::test]
    async fn a_copy_that_falls_behind_is_abandoned_and_the_real_body_goes_on() {
        let (mut taps, body) = tap();
        let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
        for _ in 0..(MIRROR_BUFFER / chunk.len()) {
            taps.data(&chunk);
        }
        assert!(!taps.is_empty(), "exactly the buffer still fits");
        taps.data(&chunk);
        assert!(taps.is_empty(), "one byte more and the copy is dropped");
        assert!(body.state.overflowed.load(Ordering::Acquire));
        // The mirror's task is told at once, not when its client next polls the body.
        tokio::time::timeout(Duration::from_secs(1), body.state.abandoned.notified())
            .await
            .expect("the mirror's task is woken");
        taps.end();
        // What was buffered drains, then the copy fails rather than ending short.
        assert!(body.collect().await.is_err());
    }

    #[tokio::test]
    async fn taking_frames_frees_the_buffer() {
        let (mut taps, mut body) = tap();
        let chunk = Bytes::from(vec![b'x'; MIRROR_BUFFER]);
        taps.data(&chunk);
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap().len(), MIRROR_BUFFER);
        taps.data(&chunk);
        assert!(!taps.is_empty());
    }

    #[test]
    fn sampling_follows_the_fraction() {
        let spec = |numerator, denominator| MirrorSpec {
            cluster: Arc::new(ClusterState {
                name: "c".into(),
                endpoints: crate::balancer::RoundRobin::new(vec![]),
                connect_failures: Default::default(),
                retries: Default::default(),
                ejections: Default::default(),
                route_retries: Default::default(),
                tls_broken: false,
            }),
            numerator,
            denominator,
            metrics: MirrorMetrics::default(),
        };
        let count = |s: &MirrorSpec| (0..10_000).filter(|_| s.sampled()).count();
        assert_eq!(count(&spec(1, 1)), 10_000);
        assert_eq!(count(&spec(0, 100)), 0);
        let half = count(&spec(25, 50));
        assert!((4_500..5_500).contains(&half), "{half}");
    }
}
