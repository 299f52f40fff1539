//! The request path on hyper: HTTP/2 (prior knowledge or ALPN) and whatever the HTTP/1 path
//! hands over (upgrades, non-origin-form targets, routes to h2c backends). Route, run filters,
//! pick a backend, forward, stream the answer back. Bodiless requests to HTTP/1 backends still
//! use the HTTP/1 path's pooled connections (`h1::client`).

use crate::Shared;
use crate::conn::ConnContext;
use crate::ext_auth;
use crate::filters::Filter;
use crate::forwarding::{self, Answer, Decision, RequestParts, ResponseEdits, Rewrite};
use crate::h1;
use crate::limits::{IdleBody, Limits, RequestBody, Stall, StreamGuard, TimeoutKind};
use crate::matchers::{LazyQuery, RequestView};
use crate::mirror::{self, Taps};
use crate::retry::{self, Outcome, RetryPolicy};
use crate::router::{self, MAX_HOST_LEN, Routed};
use crate::table::{
    ClusterState, CompiledListener, CompiledRoute, CompiledRule, Endpoint, SocketTable,
};
use crate::upstream::{self, BoxError, UpstreamError};
use bytes::Bytes;
use http::header::{
    CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, HOST, LOCATION, TRANSFER_ENCODING, UPGRADE,
};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tracing::debug;

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// The body of every response we send: the backend's body, streamed, or a small generated one.
/// An enum rather than a boxed body so that responses cost no extra allocation.
#[derive(Debug)]
pub(crate) enum ResponseBody {
    Upstream(Incoming),
    /// From a pooled connection of the HTTP/1 path's client.
    Pooled(h1::client::PooledBody),
    Static(Option<Bytes>),
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ResponseBody::Upstream(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
            ResponseBody::Pooled(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
            ResponseBody::Static(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ResponseBody::Upstream(body) => body.is_end_stream(),
            ResponseBody::Pooled(body) => body.is_end_stream(),
            ResponseBody::Static(data) => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ResponseBody::Upstream(body) => body.size_hint(),
            ResponseBody::Pooled(body) => body.size_hint(),
            ResponseBody::Static(data) => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

/// What a hyper connection sends as a response body: the [`ResponseBody`], the stream it
/// keeps open (for the HTTP/2 idle timeout), and the backend read limit: a backend body that
/// stalls for `backend_read_timeout` ends the stream with an error instead of holding it.
pub(crate) struct ClientBody {
    inner: ResponseBody,
    _stream: StreamGuard,
    /// Armed for bodies from a backend.
    stall: Option<Stall>,
    limit: std::time::Duration,
}

impl ClientBody {
    pub(crate) fn new(inner: ResponseBody, stream: StreamGuard, limits: Limits) -> Self {
        let stall = match inner {
            ResponseBody::Static(_) => None,
            _ => Some(Stall::new(limits.backend_read)),
        };
        ClientBody {
            inner,
            _stream: stream,
            stall,
            limit: limits.backend_read,
        }
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                if let Some(stall) = this.stall.as_mut() {
                    stall.touch(this.limit);
                }
                Poll::Ready(frame)
            }
            Poll::Pending => match this.stall.as_mut().map(|s| s.poll_expired(cx)) {
                Some(Poll::Ready(())) => {
                    debug!("backend response body stalled; aborting");
                    Poll::Ready(Some(Err(TimeoutKind::BackendRead.error().into())))
                }
                _ => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl std::fmt::Debug for ClientBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

/// A generated response: short text body, `content-type: text/plain`.
pub(crate) fn generated(status: StatusCode, text: &'static str) -> Response<ResponseBody> {
    let mut resp = Response::new(ResponseBody::Static(Some(Bytes::from_static(
        text.as_bytes(),
    ))));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    resp
}

/// The routing host of a request: the URI authority (HTTP/2, absolute-form HTTP/1) or the
/// Host header, normalised into `buf`.
fn request_host<'b, B>(req: &Request<B>, buf: &'b mut [u8; MAX_HOST_LEN]) -> Option<&'b str> {
    let raw = match req.uri().authority() {
        Some(authority) => authority.as_str(),
        None => req.headers().get(HOST)?.to_str().ok()?,
    };
    router::normalize_host(raw, buf)
}

/// The request rules of the HTTP/1 path, applied to the HTTP/1 requests it hands to hyper
/// (absolute-form targets, `OPTIONS *`, upgrades), so that no request is parsed more laxly
/// than the first of its connection: one Host (and one at all in HTTP/1.1), no userinfo in
/// it, `chunked` as the only transfer coding. HTTP/2 requests have their own rules, which
/// hyper's h2 enforces; userinfo is refused there too.
fn refuse_lax<B>(req: &Request<B>) -> Option<(StatusCode, &'static str)> {
    let bad = |why| Some((StatusCode::BAD_REQUEST, why));
    let userinfo = req
        .uri()
        .authority()
        .is_some_and(|a| a.as_str().contains('@'))
        || req
            .headers()
            .get_all(HOST)
            .iter()
            .any(|h| h.as_bytes().contains(&b'@'));
    if userinfo {
        return bad("userinfo in the request's authority\n");
    }
    if req.version() >= Version::HTTP_2 {
        return None;
    }
    match req.headers().get_all(HOST).iter().count() {
        0 if req.version() == Version::HTTP_11 => return bad("HTTP/1.1 request without Host\n"),
        0 | 1 => {}
        _ => return bad("more than one Host field\n"),
    }
    let codings = req.headers().get_all(TRANSFER_ENCODING);
    if codings.iter().next().is_some() {
        if req.headers().contains_key(CONTENT_LENGTH) {
            return bad("both Content-Length and Transfer-Encoding\n");
        }
        let only_chunked = codings
            .iter()
            .flat_map(|v| v.as_bytes().split(|&b| b == b','))
            .map(<[u8]>::trim_ascii)
            .filter(|t| !t.is_empty())
            .all(|t| t.eq_ignore_ascii_case(b"chunked"));
        if !only_chunked {
            return Some((StatusCode::NOT_IMPLEMENTED, "unsupported transfer coding\n"));
        }
    }
    None
}

/// Normalises the request's path in place (see `crate::path`); the reason when it cannot be.
fn normalize_path<B>(req: &mut Request<B>) -> Result<(), &'static str> {
    let path = req.uri().path();
    // `*` (OPTIONS) and authority-form targets have no path to normalise.
    if !path.starts_with('/') {
        return Ok(());
    }
    let Some(normal) = crate::path::normalize(path).map_err(|e| e.reason())? else {
        return Ok(());
    };
    let mut parts = req.uri().clone().into_parts();
    let path_and_query = match req.uri().query() {
        Some(q) => format!("{normal}?{q}"),
        None => normal,
    };
    parts.path_and_query =
        Some(PathAndQuery::try_from(path_and_query).map_err(|_| "invalid path")?);
    *req.uri_mut() = Uri::from_parts(parts).map_err(|_| "invalid path")?;
    Ok(())
}

pub(crate) async fn handle(
    conn: Arc<ConnContext>,
    mut req: Request<Incoming>,
) -> Response<ResponseBody> {
    let start = Instant::now();
    // One load per request: the request finishes on the table it started with, even if an
    // apply swaps in a new one meanwhile.
    let table: Arc<SocketTable> = conn.socket.table.load_full();
    // Read before the request is taken apart: the gateway's own errors are answered in gRPC's
    // terms to gRPC calls (see `crate::grpc`).
    let grpc = crate::grpc::is_grpc(req.version(), req.headers());
    if let Some((status, why)) = refuse_lax(&req) {
        let mut response = generated(status, why);
        if req.version() < Version::HTTP_2 {
            // The framing of what follows on this connection cannot be trusted.
            response
                .headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
        }
        table.unmatched.record(
            &conn.socket.shared.metrics,
            status.as_u16(),
            start.elapsed(),
        );
        return response;
    }
    if let Err(why) = normalize_path(&mut req) {
        let response = generated(StatusCode::BAD_REQUEST, "invalid request path\n");
        debug!(why, "request refused");
        table
            .unmatched
            .record(&conn.socket.shared.metrics, 400, start.elapsed());
        return if grpc {
            crate::grpc::answer_as_grpc(response)
        } else {
            response
        };
    }
    let mut buf = [0u8; MAX_HOST_LEN];
    let host = request_host(&req, &mut buf).unwrap_or("");
    let closing = conn.socket.closing() && req.version() <= Version::HTTP_11;
    let mut req = req.map(RequestBody::Streaming);
    let (metrics, mut response) = 'answered: {
        // The listener's filters run before routing, which sees what they changed. The
        // listener itself was chosen by Host (or SNI), which no filter may change.
        if table.pre_routing
            && let Some(listener) = conn.listener(&table, host)
            && !listener.filters.is_empty()
            && let Err(refused) = pre_routing(&conn, listener, &mut req, grpc).await
        {
            break 'answered (&listener.unmatched, refused);
        }
        let routed = {
            let mut view = RequestView {
                method: req.method(),
                path: req.uri().path(),
                headers: req.headers(),
                query: LazyQuery::new(req.uri().query()),
            };
            conn.route(&table, host, &mut view)
        };
        match routed {
            Routed::Matched(route, rule) => (
                &rule.metrics,
                forward(&conn, rule, route, host, req, grpc).await,
            ),
            Routed::Refused(refusal) => (refusal.metrics, generated(refusal.status, refusal.text)),
        }
    };
    metrics.record(
        &conn.socket.shared.metrics,
        response.status().as_u16(),
        start.elapsed(),
    );
    if closing && response.status() != StatusCode::SWITCHING_PROTOCOLS {
        // hyper closes an HTTP/1 connection after a response that says so.
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    // After the metrics, which count the HTTP status the gateway meant (404, 503, ...).
    if grpc {
        response = crate::grpc::answer_as_grpc(response);
    }
    response
}

fn answer(answer: Answer) -> Response<ResponseBody> {
    match answer {
        Answer::Text(status, text) => generated(status, text),
        Answer::Redirect(status, location) => {
            let mut resp = Response::new(ResponseBody::Static(None));
            *resp.status_mut() = status;
            resp.headers_mut().insert(LOCATION, location);
            resp
        }
        Answer::Preflight(fields) => {
            let mut resp = Response::new(ResponseBody::Static(None));
            fields.apply(resp.headers_mut());
            resp
        }
    }
}

/// Applies the CORS fields and the rule's and the backend's response header filters.
fn respond(mut resp: Response<ResponseBody>, edits: ResponseEdits<'_>) -> Response<ResponseBody> {
    edits.apply(resp.headers_mut());
    resp
}

/// Runs a listener's pre-routing filters (`ExternalAuth` checks) in order. `Err`: the answer
/// the client gets instead of routing.
async fn pre_routing(
    conn: &ConnContext,
    listener: &CompiledListener,
    req: &mut Request<RequestBody>,
    grpc: bool,
) -> Result<(), Response<ResponseBody>> {
    let deadline = match grpc {
        true => crate::grpc::deadline(req.headers()),
        false => None,
    };
    let timeout = crate::grpc::tighter(conn.socket.shared.default_request_timeout, deadline);
    let (mut parts, mut body) =
        std::mem::replace(req, Request::new(RequestBody::Buffered(None, None))).into_parts();
    let mut outcome = Ok(());
    for filter in &listener.filters {
        let Filter::ExternalAuth(spec) = filter else {
            continue;
        };
        let subject = ext_auth::Subject {
            parts: &mut parts,
            body: &mut body,
            rewritten_path: None,
            conn,
        };
        outcome = ext_auth::check(spec, &conn.socket.shared, subject, timeout).await;
        if outcome.is_err() {
            break;
        }
    }
    *req = Request::from_parts(parts, body);
    outcome
}

async fn forward(
    conn: &Arc<ConnContext>,
    rule: &CompiledRule,
    route: &CompiledRoute,
    host: &str,
    req: Request<RequestBody>,
    grpc: bool,
) -> Response<ResponseBody> {
    let (mut parts, mut body) = req.into_parts();
    // A gRPC call's own deadline bounds the wait as the rule's timeout does (`crate::grpc`).
    let deadline = match grpc {
        true => crate::grpc::deadline(&parts.headers),
        false => None,
    };
    let timeout = crate::grpc::tighter(rule.timeout, deadline);
    // Hop-by-hop fields belong to the client's connection: they go before the route's filters
    // run, so that a client cannot name (and so delete) a field a filter adds.
    let upgrade_requested = upstream::upgrade_protocol(parts.version, &parts.headers);
    upstream::strip_hop_by_hop(&mut parts.headers);
    let matched_prefix = route.matcher.path.replaceable_prefix();
    // A rule's ExternalAuth checks run where they stand among its filters: the filters before
    // each one first, so the check sees what they did.
    let mut rewrite = Rewrite::default();
    let mut done = 0;
    if rule.authorized {
        for (i, filter) in rule.filters.iter().enumerate() {
            let Filter::ExternalAuth(spec) = filter else {
                continue;
            };
            let before = forwarding::request_filters(
                &rule.filters[done..i],
                &RequestParts {
                    method: &parts.method,
                    host,
                    path: parts.uri.path(),
                    query: parts.uri.query(),
                    matched_prefix,
                },
                &mut parts.headers,
                &mut rewrite,
            );
            let edits = ResponseEdits {
                rule_filters: &rule.filters,
                backend_filters: &[],
                cors: rewrite.cors.as_ref(),
            };
            if let Some(a) = before {
                return respond(answer(a), edits);
            }
            let subject = ext_auth::Subject {
                parts: &mut parts,
                body: &mut body,
                rewritten_path: rewrite.path.as_deref(),
                conn,
            };
            if let Err(refused) = ext_auth::check(spec, &conn.socket.shared, subject, timeout).await
            {
                return respond(refused, edits);
            }
            done = i + 1;
        }
    }
    let decision = forwarding::decide_after(
        rule,
        done,
        rewrite,
        &RequestParts {
            method: &parts.method,
            host,
            path: parts.uri.path(),
            query: parts.uri.query(),
            matched_prefix,
        },
        &mut parts.headers,
    );
    let (cluster, endpoint, backend_filters, rewrite, cors) = match decision {
        Decision::Answer {
            answer: a,
            backend_filters,
            cors,
        } => {
            let edits = ResponseEdits {
                rule_filters: &rule.filters,
                backend_filters,
                cors: cors.as_ref(),
            };
            return respond(answer(a), edits);
        }
        Decision::Forward {
            cluster,
            endpoint,
            backend_filters,
            mut rewrite,
        } => {
            let cors = rewrite.cors.take();
            (cluster, endpoint, backend_filters, rewrite, cors)
        }
    };
    let edits = ResponseEdits {
        rule_filters: &rule.filters,
        backend_filters,
        cors: cors.as_ref(),
    };
    let mut req = Request::from_parts(parts, body);
    let fail = |status, text| respond(generated(status, text), edits);

    // HTTP/2 has no Upgrade; towards h2c the request goes out as a plain request.
    let upgrade = match endpoint.h2 {
        None => upgrade_requested,
        Some(_) => None,
    };
    if let Err(text) = prepare_upstream(&mut req, conn, endpoint, rewrite, &upgrade) {
        return fail(StatusCode::INTERNAL_SERVER_ERROR, text);
    }
    let downstream_upgrade = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut req));
    // Mirrors get a copy of the request as it leaves for its backend (not of upgrades: a
    // tunnel cannot be copied).
    let taps = if rule.mirrored && downstream_upgrade.is_none() {
        let filters = rule.filters.iter().chain(backend_filters);
        mirror::start(&conn.socket.shared, filters, &req, rule.timeout)
    } else {
        Taps::default()
    };

    if let Some(policy) = rule.retry.as_deref()
        && downstream_upgrade.is_none()
        && retry::replayable(req.body())
    {
        let shared = &conn.socket.shared;
        let total = crate::grpc::tighter(policy.total, deadline);
        return forward_with_retries(shared, policy, total, cluster, endpoint, req, taps, edits)
            .await;
    }

    // Bodiless requests to HTTP/1 backends go over the HTTP/1 path's pooled connections, in
    // this task; the rest (request bodies, upgrades, h2c) over hyper's clients.
    if endpoint.pool.is_some() && downstream_upgrade.is_none() && req.body().is_end_stream() {
        let (parts, _) = req.into_parts();
        let sent = Box::pin(h1::client::send(cluster, endpoint, &parts));
        let result = match timeout {
            Some(limit) => match tokio::time::timeout(limit, sent).await {
                Ok(result) => result,
                Err(_) => return fail(StatusCode::GATEWAY_TIMEOUT, "upstream timed out\n"),
            },
            None => sent.await,
        };
        return match result {
            Ok(mut resp) => {
                upstream::strip_hop_by_hop(resp.headers_mut());
                respond(resp.map(ResponseBody::Pooled), edits)
            }
            Err(error) => {
                upstream_failed(cluster, endpoint, error, &conn.socket.shared.metrics, fail)
            }
        };
    }

    let shared = &conn.socket.shared;
    let req = req.map(|body| {
        IdleBody::new(body, shared.limits.request_body, shared.metrics.clone()).tapped(taps)
    });
    let sent = send_upstream(shared, cluster, endpoint, req);
    let result = match timeout {
        Some(limit) => match tokio::time::timeout(limit, sent).await {
            Ok(result) => result,
            Err(_) => return fail(StatusCode::GATEWAY_TIMEOUT, "upstream timed out\n"),
        },
        None => sent.await,
    };
    // Requests with bodies, upgrades and h2c are not retried elsewhere: hyper's client has
    // taken the request by the time it reports the failed connect.
    let mut resp = match result {
        Ok(resp) => resp,
        Err(error) => return upstream_failed(cluster, endpoint, error, &shared.metrics, fail),
    };

    let upstream_upgrade = resp.headers().get(UPGRADE).cloned();
    strip_and_maybe_upgrade(conn, &mut resp, downstream_upgrade, upstream_upgrade);
    respond(resp.map(ResponseBody::Upstream), edits)
}

/// Sends `req` to `endpoint` over hyper's clients and keeps the endpoint's health: a response
/// counts as a success, a failed connect against it (passive ejection).
pub(crate) async fn send_upstream(
    shared: &Shared,
    cluster: &ClusterState,
    endpoint: &Endpoint,
    req: Request<IdleBody>,
) -> Result<Response<Incoming>, UpstreamError> {
    let result = shared.upstreams.send(endpoint, req).await;
    match &result {
        Ok(_) => endpoint.health.success(),
        Err(UpstreamError::Connect(_)) => cluster.connect_failed(endpoint),
        Err(_) => {}
    }
    result
}

/// [`forward`] for a rule with a retry policy and a request that can be sent again (see
/// `retry`): the body is read first, then the attempts run, all within the request timeout.
#[allow(clippy::too_many_arguments)]
async fn forward_with_retries(
    shared: &Shared,
    policy: &RetryPolicy,
    total: Option<Duration>,
    cluster: &ClusterState,
    endpoint: &Endpoint,
    req: Request<RequestBody>,
    taps: Taps,
    edits: ResponseEdits<'_>,
) -> Response<ResponseBody> {
    let fail = |status, text| respond(generated(status, text), edits);
    let (mut parts, body) = req.into_parts();
    let attempts = async {
        let body =
            IdleBody::new(body, shared.limits.request_body, shared.metrics.clone()).tapped(taps);
        let replay = retry::buffer(body).await?;
        Ok::<_, BoxError>(retry::send(shared, policy, cluster, endpoint, &mut parts, &replay).await)
    };
    let outcome = match total {
        Some(limit) => match tokio::time::timeout(limit, attempts).await {
            Ok(outcome) => outcome,
            Err(_) => return fail(StatusCode::GATEWAY_TIMEOUT, "upstream timed out\n"),
        },
        None => attempts.await,
    };
    match outcome {
        Ok(Outcome::Response(mut resp)) => {
            upstream::strip_hop_by_hop(resp.headers_mut());
            respond(resp, edits)
        }
        Ok(Outcome::Failed(endpoint, error)) => {
            upstream_failed(cluster, endpoint, error, &shared.metrics, fail)
        }
        Ok(Outcome::TimedOut) => fail(StatusCode::GATEWAY_TIMEOUT, "upstream timed out\n"),
        Err(error) => {
            debug!(%error, "request body could not be read");
            fail(StatusCode::BAD_REQUEST, "request body could not be read\n")
        }
    }
}

/// The 502 for a request the backend did not answer.
fn upstream_failed(
    cluster: &ClusterState,
    endpoint: &Endpoint,
    error: UpstreamError,
    metrics: &crate::metrics::Metrics,
    fail: impl FnOnce(StatusCode, &'static str) -> Response<ResponseBody>,
) -> Response<ResponseBody> {
    match error {
        // (Connect failures were counted against the endpoint where they happened.)
        UpstreamError::Connect(error) => {
            debug!(cluster = &*cluster.name, endpoint = %endpoint.addr, %error, "upstream connect failed");
            fail(StatusCode::BAD_GATEWAY, "upstream connect error\n")
        }
        UpstreamError::Failed(error) => {
            debug!(cluster = &*cluster.name, endpoint = %endpoint.addr, %error, "upstream request failed");
            fail(StatusCode::BAD_GATEWAY, "upstream request failed\n")
        }
        UpstreamError::HeadTooLarge => {
            metrics.head_too_large(crate::metrics::Side::Response);
            debug!(cluster = &*cluster.name, endpoint = %endpoint.addr, "upstream response head too large");
            fail(
                StatusCode::BAD_GATEWAY,
                "upstream response head too large\n",
            )
        }
    }
}

fn strip_and_maybe_upgrade(
    conn: &Arc<ConnContext>,
    resp: &mut Response<Incoming>,
    downstream: Option<hyper::upgrade::OnUpgrade>,
    protocol: Option<HeaderValue>,
) {
    upstream::strip_hop_by_hop(resp.headers_mut());
    let (Some(downstream), Some(protocol)) = (downstream, protocol) else {
        return;
    };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        return;
    }
    upstream::restore_upgrade(resp.headers_mut(), protocol);
    let upstream = hyper::upgrade::on(&mut *resp);
    let shared = conn.socket.shared.clone();
    let tasks = shared.tasks.clone();
    let conn = conn.clone();
    tasks.spawn(async move {
        tokio::select! {
            () = upstream::splice(downstream, upstream, shared.limits.tunnel_idle, &shared.metrics) => {}
            () = shared.kill.cancelled() => {}
        }
        drop(conn);
    });
}

/// Turns the client's request into the backend's: hop-by-hop fields out, forwarding fields in,
/// Host/authority and path as rewritten, URI pointing at the endpoint.
fn prepare_upstream<B>(
    req: &mut Request<B>,
    conn: &ConnContext,
    endpoint: &Endpoint,
    rewrite: Rewrite,
    upgrade: &Option<HeaderValue>,
) -> Result<(), &'static str> {
    let original_host = match req.uri().authority() {
        Some(authority) => HeaderValue::from_str(authority.as_str()).ok(),
        None => req.headers().get(HOST).cloned(),
    };
    let path_and_query = match rewrite.path {
        None => req
            .uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/")),
        Some(mut path) => {
            if let Some(query) = req.uri().query() {
                path.push('?');
                path.push_str(query);
            }
            PathAndQuery::try_from(path).map_err(|_| "rewritten path is not a valid URL path\n")?
        }
    };

    let client_ip = &conn.client_ip;
    let headers = req.headers_mut();
    upstream::strip_hop_by_hop(headers);
    if let Some(protocol) = upgrade {
        upstream::restore_upgrade(headers, protocol.clone());
    }
    let forwarded_for = match headers.get(&X_FORWARDED_FOR) {
        None => client_ip.clone(),
        Some(_) => {
            let mut joined = Vec::new();
            for value in headers.get_all(&X_FORWARDED_FOR) {
                joined.extend_from_slice(value.as_bytes());
                joined.extend_from_slice(b", ");
            }
            joined.extend_from_slice(client_ip.as_bytes());
            HeaderValue::from_bytes(&joined).unwrap_or_else(|_| client_ip.clone())
        }
    };
    headers.insert(X_FORWARDED_FOR.clone(), forwarded_for);
    headers.insert(X_FORWARDED_PROTO.clone(), conn.proto.clone());
    if let Some(host) = &original_host {
        headers.insert(X_FORWARDED_HOST.clone(), host.clone());
    }
    let upstream_host = rewrite.host.or(original_host);

    let (version, uri) = address(
        endpoint,
        upstream_host,
        req.headers_mut(),
        Some(path_and_query),
    )
    .map_err(|_| "cannot build upstream URI\n")?;
    *req.version_mut() = version;
    *req.uri_mut() = uri;
    Ok(())
}

/// Addresses a request to `endpoint`, for the real backend and for mirrors alike: HTTP/2
/// carries `host` as `:authority` (hyper takes it from the URI, so the Host field goes),
/// HTTP/1.1 keeps it in Host; the URI names the endpoint's scheme and address otherwise.
pub(crate) fn address(
    endpoint: &Endpoint,
    host: Option<HeaderValue>,
    headers: &mut http::HeaderMap,
    path_and_query: Option<http::uri::PathAndQuery>,
) -> Result<(Version, Uri), http::Error> {
    let (version, authority) = if endpoint.h2.is_some() {
        headers.remove(HOST);
        let authority = host
            .and_then(|h| Authority::try_from(h.as_bytes()).ok())
            .unwrap_or_else(|| endpoint.authority.clone());
        (Version::HTTP_2, authority)
    } else {
        if let Some(host) = host {
            headers.insert(HOST, host);
        }
        (Version::HTTP_11, endpoint.authority.clone())
    };
    let mut parts = http::uri::Parts::default();
    parts.scheme = Some(if endpoint.tls.is_some() {
        Scheme::HTTPS
    } else {
        Scheme::HTTP
    });
    parts.authority = Some(authority);
    parts.path_and_query = path_and_query;
    Ok((version, Uri::from_parts(parts)?))
}
