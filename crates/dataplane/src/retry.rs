//! HTTPRoute rule retries (`retry`): the same request sent again, after a backoff, when the
//! backend answered one of the rule's retry codes, when no connection could be made, or when
//! an attempt ran past the rule's `backendRequest` timeout.
//!
//! **Which requests.** A request is retried only if it can be sent again exactly: no body, or
//! a body whose declared length is at most [`MAX_REPLAY_BODY`], read whole before the first
//! attempt. Longer bodies and bodies of unknown length (chunked, HTTP/2 without
//! `content-length`) go out once, streamed, as on a rule without retries: holding them would
//! cost memory per request and delay the backend's first byte. Upgrades are never retried.
//!
//! **Which failures.** A retry code, a failed connect (nothing reached the backend) and a
//! `backendRequest` timeout. A connection that fails after the request was written (a reset,
//! a close before the response) is not retried: the backend may have acted on the request,
//! and the Gateway API asks not to retry that by default.
//!
//! **Where.** Each retry goes to another endpoint of the same backend when one is in rotation
//! (not ejected), else to the same one. The backend (and so its filters) stays the one chosen
//! for the first attempt.
//!
//! **When.** Retry `n` waits `backoff·2^(n−1)`, at most `MAX_GROWTH·backoff`, plus up to a
//! quarter of that at random so that clients failed together do not come back together.
//!
//! **Timeouts.** The rule's request timeout bounds every attempt and wait together (the caller
//! wraps [`send`] in it); `backendRequest` bounds each attempt.
//!
//! Only the hyper path retries: the HTTP/1 path hands over requests of rules with a retry
//! policy, so its own code (and its instruction count) stays as it is for every other rule.

use crate::Shared;
use crate::h1;
use crate::hyper_path::ResponseBody;
use crate::limits::IdleBody;
use crate::table::{ClusterState, Endpoint};
use crate::upstream::{BoxError, UpstreamError};
use bytes::{Bytes, BytesMut};
use gatehouse_ir as ir;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::BodyExt;
use prometheus_client::metrics::counter::Counter;
use std::time::Duration;

/// The longest request body kept for replay (64 KiB).
pub(crate) const MAX_REPLAY_BODY: u64 = 64 * 1024;

/// The backoff when the rule gives none.
pub(crate) const DEFAULT_BACKOFF: Duration = Duration::from_millis(25);

/// The longest wait is this many backoffs.
const MAX_GROWTH: u32 = 10;

/// `gatehouse_route_retries` of one cluster, by reason.
#[derive(Clone, Debug, Default)]
pub(crate) struct RetryCounters {
    pub status: Counter,
    pub connect: Counter,
    pub timeout: Counter,
}

/// A rule's retry policy, compiled.
#[derive(Debug)]
pub(crate) struct RetryPolicy {
    /// Bit `code - 400` is set for every retried status (400–599).
    codes: [u64; 4],
    /// Retries after the first attempt.
    attempts: u32,
    backoff: Duration,
    /// Bounds every attempt together: the rule's request timeout, or the default when the rule
    /// has no timeout at all.
    pub total: Option<Duration>,
    /// Bounds each attempt: the rule's `backendRequest` timeout.
    per_attempt: Option<Duration>,
}

impl RetryPolicy {
    pub(crate) fn new(
        retry: &ir::Retry,
        timeouts: &ir::Timeouts,
        default_timeout: Option<Duration>,
    ) -> Self {
        let mut codes = [0u64; 4];
        for &code in &retry.codes {
            if let Some(bit) = code.checked_sub(400).filter(|&b| b < 200) {
                codes[usize::from(bit / 64)] |= 1 << (bit % 64);
            }
        }
        let positive = |ms: Option<u64>| ms.filter(|&ms| ms > 0).map(Duration::from_millis);
        let total = match (timeouts.request_ms, timeouts.backend_request_ms) {
            (None, None) => default_timeout,
            (request, _) => positive(request),
        };
        RetryPolicy {
            codes,
            attempts: retry.attempts,
            backoff: retry
                .backoff_ms
                .map_or(DEFAULT_BACKOFF, Duration::from_millis),
            total,
            per_attempt: positive(timeouts.backend_request_ms),
        }
    }

    pub(crate) fn retries_status(&self, status: StatusCode) -> bool {
        let Some(bit) = status.as_u16().checked_sub(400).filter(|&b| b < 200) else {
            return false;
        };
        self.codes[usize::from(bit / 64)] & (1 << (bit % 64)) != 0
    }

    /// The wait before retry `n` (from 1), without the random part.
    fn base_wait(&self, n: u32) -> Duration {
        let growth = 1u32
            .checked_shl(n.saturating_sub(1))
            .unwrap_or(u32::MAX)
            .min(MAX_GROWTH);
        self.backoff.saturating_mul(growth)
    }

    fn wait(&self, n: u32) -> Duration {
        let base = self.base_wait(n);
        let jitter = u64::try_from(base.as_nanos() / 4).unwrap_or(u64::MAX);
        base + Duration::from_nanos(fastrand::u64(0..=jitter))
    }
}

/// A request body that can be sent more than once.
#[derive(Debug)]
pub(crate) struct Replay {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl Replay {
    fn body(&self, shared: &Shared) -> IdleBody {
        IdleBody::replay(
            self.data.clone(),
            self.trailers.clone(),
            shared.limits.request_body,
            shared.metrics.clone(),
        )
    }

    fn is_empty(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }
}

/// Whether a request with this body can be retried: none, or one declared short enough to
/// keep (see the module).
pub(crate) fn replayable(body: &impl Body) -> bool {
    body.is_end_stream()
        || body
            .size_hint()
            .upper()
            .is_some_and(|n| n <= MAX_REPLAY_BODY)
}

/// Reads a body that [`replayable`] accepted (through `IdleBody`, so its stall limit and any
/// mirror taps apply as when it streams).
pub(crate) async fn buffer(mut body: IdleBody) -> Result<Replay, BoxError> {
    let mut data = BytesMut::new();
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        let frame = match frame?.into_data() {
            Ok(chunk) => {
                data.extend_from_slice(&chunk);
                if data.len() as u64 > MAX_REPLAY_BODY {
                    // hyper holds a body to its declared length, so this is a safeguard.
                    return Err("request body longer than it declared".into());
                }
                continue;
            }
            Err(frame) => frame,
        };
        if let Ok(t) = frame.into_trailers() {
            trailers = Some(t);
        }
    }
    Ok(Replay {
        data: (!data.is_empty()).then(|| data.freeze()),
        trailers,
    })
}

/// How the attempts ended.
pub(crate) enum Outcome<'t> {
    /// The backend's response: a success, a status not retried, or the last attempt's.
    Response(Response<ResponseBody>),
    /// The last attempt got no response.
    Failed(&'t Endpoint, UpstreamError),
    /// The last attempt ran past `backendRequest`.
    TimedOut,
}

/// Why an attempt is retried.
#[derive(Clone, Copy)]
enum Reason {
    Status,
    Connect,
    Timeout,
}

/// Sends the request (`parts` addressed to `first`, as `hyper_path` prepares it) up to
/// `1 + attempts` times.
pub(crate) async fn send<'t>(
    shared: &Shared,
    policy: &RetryPolicy,
    cluster: &'t ClusterState,
    first: &'t Endpoint,
    parts: &mut http::request::Parts,
    body: &Replay,
) -> Outcome<'t> {
    let mut endpoint = first;
    let mut retries = 0;
    loop {
        let attempt = attempt(shared, cluster, endpoint, parts, body);
        let result = match policy.per_attempt {
            Some(limit) => tokio::time::timeout(limit, attempt).await.ok(),
            None => Some(attempt.await),
        };
        let reason = match &result {
            Some(Ok(resp)) if policy.retries_status(resp.status()) => Some(Reason::Status),
            Some(Err(UpstreamError::Connect(_))) => Some(Reason::Connect),
            None => Some(Reason::Timeout),
            Some(_) => None,
        };
        let Some(reason) = reason.filter(|_| retries < policy.attempts) else {
            return match result {
                Some(Ok(resp)) => Outcome::Response(resp),
                Some(Err(error)) => Outcome::Failed(endpoint, error),
                None => Outcome::TimedOut,
            };
        };
        // The response (if any) is dropped unread: its connection is not reused.
        drop(result);
        retries += 1;
        let counters = &cluster.route_retries;
        match reason {
            Reason::Status => counters.status.inc(),
            Reason::Connect => counters.connect.inc(),
            Reason::Timeout => counters.timeout.inc(),
        };
        tokio::time::sleep(policy.wait(retries)).await;
        if let Some(other) = cluster.pick_other(endpoint.addr) {
            endpoint = other;
            readdress(parts, endpoint);
        }
    }
}

/// One attempt: bodiless requests to HTTP/1 backends over the HTTP/1 path's pool (which also
/// tries other endpoints when a connect fails), the rest over hyper's clients.
async fn attempt(
    shared: &Shared,
    cluster: &ClusterState,
    endpoint: &Endpoint,
    parts: &http::request::Parts,
    body: &Replay,
) -> Result<Response<ResponseBody>, UpstreamError> {
    if endpoint.pool.is_some() && body.is_empty() {
        let resp = Box::pin(h1::client::send(cluster, endpoint, parts)).await?;
        return Ok(resp.map(ResponseBody::Pooled));
    }
    let mut req = Request::new(body.body(shared));
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = parts.uri.clone();
    *req.version_mut() = parts.version;
    *req.headers_mut() = parts.headers.clone();
    let resp = crate::hyper_path::send_upstream(shared, cluster, endpoint, req).await?;
    Ok(resp.map(ResponseBody::Upstream))
}

/// Points a prepared request at another endpoint of the same cluster. HTTP/1 requests name
/// the endpoint in the URI (the host stays in Host); HTTP/2 ones carry the host as authority
/// and go over the endpoint's connection, so they need no change.
fn readdress(parts: &mut http::request::Parts, endpoint: &Endpoint) {
    if endpoint.h2.is_some() {
        return;
    }
    let mut uri = std::mem::take(&mut parts.uri).into_parts();
    uri.authority = Some(endpoint.authority.clone());
    if let Ok(new) = http::Uri::from_parts(uri) {
        parts.uri = new;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(codes: &[u16], backoff_ms: Option<u64>, timeouts: ir::Timeouts) -> RetryPolicy {
        let retry = ir::Retry {
            codes: codes.to_vec(),
            attempts: 3,
            backoff_ms,
        };
        RetryPolicy::new(&retry, &timeouts, Some(Duration::from_secs(15)))
    }

    #[test]
    fn only_listed_codes_are_retried() {
        let p = policy(&[400, 500, 503, 599], None, ir::Timeouts::default());
        for code in [400, 500, 503, 599] {
            assert!(
                p.retries_status(StatusCode::from_u16(code).unwrap()),
                "{code}"
            );
        }
        for code in [200, 399, 401, 499, 501, 502, 504] {
            assert!(
                !p.retries_status(StatusCode::from_u16(code).unwrap()),
                "{code}"
            );
        }
        assert!(
            !policy(&[], None, ir::Timeouts::default()).retries_status(StatusCode::BAD_GATEWAY)
        );
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_with_bounded_jitter() {
        let p = policy(&[500], Some(100), ir::Timeouts::default());
        let ms = |n| p.base_wait(n).as_millis();
        assert_eq!(
            [ms(1), ms(2), ms(3), ms(4), ms(5), ms(40)],
            [100, 200, 400, 800, 1000, 1000]
        );
        for n in 1..6 {
            let base = p.base_wait(n);
            let wait = p.wait(n);
            assert!(
                wait >= base && wait <= base + base / 4,
                "{wait:?} for {base:?}"
            );
        }
        assert_eq!(
            policy(&[500], None, ir::Timeouts::default()).base_wait(1),
            DEFAULT_BACKOFF
        );
        assert_eq!(
            policy(&[500], Some(0), ir::Timeouts::default()).wait(3),
            Duration::ZERO
        );
    }

    #[test]
    fn request_timeout_bounds_all_attempts_and_backend_timeout_each() {
        let t = |request_ms, backend_request_ms| {
            let p = policy(
                &[500],
                None,
                ir::Timeouts {
                    request_ms,
                    backend_request_ms,
                },
            );
            (p.total, p.per_attempt)
        };
        let ms = |n| Some(Duration::from_millis(n));
        // No timeout at all: the default bounds the whole request.
        assert_eq!(t(None, None), (Some(Duration::from_secs(15)), None));
        assert_eq!(t(Some(500), None), (ms(500), None));
        assert_eq!(t(Some(15_000), Some(500)), (ms(15_000), ms(500)));
        // Only backendRequest: each attempt is bounded, the whole by attempts and waits.
        assert_eq!(t(None, Some(500)), (None, ms(500)));
    }

    #[tokio::test]
    async fn buffered_bodies_replay_whole() {
        let replay = Replay {
            data: Some(Bytes::from_static(b"hello")),
            trailers: Some(HeaderMap::new()),
        };
        let metrics = std::sync::Arc::new(crate::metrics::Metrics::new(&mut Default::default()));
        for _ in 0..2 {
            let body = IdleBody::replay(
                replay.data.clone(),
                replay.trailers.clone(),
                Duration::from_secs(1),
                metrics.clone(),
            );
            assert_eq!(body.size_hint().exact(), Some(5));
            let collected = body.collect().await.unwrap();
            assert!(collected.trailers().is_some());
            assert_eq!(collected.to_bytes(), Bytes::from_static(b"hello"));
        }
    }
}
