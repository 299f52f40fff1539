//! The request path: route, run filters, pick a backend, forward, stream the answer back.

use crate::compile::{CompiledRoute, CompiledRule, Endpoint, SocketTable, Target};
use crate::filters::Filter;
use crate::listeners::{ActiveConn, SocketShared};
use crate::router::{self, LazyQuery, MAX_HOST_LEN, RequestView, Routed};
use crate::upstream::{self, UpstreamError};
use bytes::Bytes;
use http::header::{CONTENT_TYPE, HOST, LOCATION, UPGRADE};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;
use tracing::debug;

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// One client connection, shared by its requests (and by an upgraded tunnel, which keeps the
/// connection counted as active until it closes).
pub(crate) struct ConnContext {
    pub socket: Arc<SocketShared>,
    /// The client IP, formatted once per connection for `X-Forwarded-For`.
    pub client_ip: HeaderValue,
    /// TLS connections: the SNI name (lower case, empty when the client sent none) that chose
    /// the listener whose certificate the connection got.
    pub sni: Option<Box<str>>,
    /// `X-Forwarded-Proto`.
    pub proto: HeaderValue,
    _active: ActiveConn,
}

impl ConnContext {
    pub(crate) fn new(
        socket: Arc<SocketShared>,
        client_ip: HeaderValue,
        sni: Option<Box<str>>,
        active: ActiveConn,
    ) -> Self {
        let proto = HeaderValue::from_static(if sni.is_some() { "https" } else { "http" });
        ConnContext {
            socket,
            client_ip,
            sni,
            proto,
            _active: active,
        }
    }
}

/// The body of every response we send: the backend's body, streamed, or a small generated one.
/// An enum rather than a boxed body so that responses cost no extra allocation.
#[derive(Debug)]
pub(crate) enum ResponseBody {
    Upstream(Incoming),
    Static(Option<Bytes>),
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            ResponseBody::Upstream(body) => Pin::new(body).poll_frame(cx),
            ResponseBody::Static(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ResponseBody::Upstream(body) => body.is_end_stream(),
            ResponseBody::Static(data) => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ResponseBody::Upstream(body) => body.size_hint(),
            ResponseBody::Static(data) => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
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

fn not_found() -> Response<ResponseBody> {
    generated(StatusCode::NOT_FOUND, "no route for this request\n")
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

pub(crate) async fn handle(
    conn: Arc<ConnContext>,
    req: Request<Incoming>,
) -> Response<ResponseBody> {
    let start = Instant::now();
    // One load per request: the request finishes on the table it started with, even if an
    // apply swaps in a new one meanwhile.
    let table: Arc<SocketTable> = conn.socket.table.load_full();
    let mut buf = [0u8; MAX_HOST_LEN];
    let host = request_host(&req, &mut buf).unwrap_or("");
    let listener = table.hosts.get(host).copied();
    // 421 Misdirected Request: on TLS, a Host that belongs to another listener than the one
    // the SNI chose (and whose certificate the client got) is not served on this connection.
    if let (Some(sni), Some(by_host)) = (&conn.sni, listener)
        && table.hosts.get(sni).copied() != Some(by_host)
    {
        let response = generated(
            StatusCode::MISDIRECTED_REQUEST,
            "request host does not match the TLS server name of this connection\n",
        );
        table.unmatched.record(
            &conn.socket.shared.metrics,
            response.status().as_u16(),
            start.elapsed(),
        );
        return response;
    }
    let routed = {
        let mut view = RequestView {
            method: req.method(),
            path: req.uri().path(),
            headers: req.headers(),
            query: LazyQuery::new(req.uri().query()),
        };
        router::route(&table, listener, host, &mut view)
    };
    let (metrics, response) = match routed {
        Routed::NoListener => (&table.unmatched, not_found()),
        Routed::NoRoute(listener) => (&listener.unmatched, not_found()),
        Routed::Matched(listener, route) => {
            let rule = &listener.rules[route.rule];
            (&rule.metrics, forward(&conn, rule, route, host, req).await)
        }
    };
    metrics.record(
        &conn.socket.shared.metrics,
        response.status().as_u16(),
        start.elapsed(),
    );
    response
}

/// What `UrlRewrite` filters decided, applied when the upstream request is built.
#[derive(Default)]
struct Rewrite {
    host: Option<HeaderValue>,
    path: Option<String>,
}

/// Runs request-side filters; `Some` when one of them answers (redirect, broken filter).
fn request_filters(
    filters: &[Filter],
    req: &mut Request<Incoming>,
    host: &str,
    prefix: Option<&str>,
    rewrite: &mut Rewrite,
) -> Option<Response<ResponseBody>> {
    for filter in filters {
        match filter {
            Filter::RequestHeaders(mods) => mods.apply(req.headers_mut()),
            Filter::ResponseHeaders(_) => {}
            Filter::Redirect(redirect) => {
                let path = rewrite.path.as_deref().unwrap_or(req.uri().path());
                let location = redirect.location(host, path, req.uri().query(), prefix);
                let Ok(location) = HeaderValue::try_from(location) else {
                    return Some(generated(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "redirect target is not a valid URL\n",
                    ));
                };
                let mut resp = Response::new(ResponseBody::Static(None));
                *resp.status_mut() = redirect.status;
                resp.headers_mut().insert(LOCATION, location);
                return Some(resp);
            }
            Filter::UrlRewrite(rw) => {
                if let Some(h) = &rw.hostname {
                    rewrite.host = Some(h.clone());
                }
                if let Some(modifier) = &rw.path {
                    let current = rewrite.path.as_deref().unwrap_or(req.uri().path());
                    rewrite.path = Some(modifier.apply(current, prefix).into_owned());
                }
            }
            Filter::Invalid => {
                return Some(generated(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "route filter is misconfigured\n",
                ));
            }
        }
    }
    None
}

/// Applies the `ResponseHeaders` filters of the rule and (once chosen) of the backend.
fn respond(
    mut resp: Response<ResponseBody>,
    rule_filters: &[Filter],
    backend_filters: &[Filter],
) -> Response<ResponseBody> {
    for filter in rule_filters.iter().chain(backend_filters) {
        if let Filter::ResponseHeaders(mods) = filter {
            mods.apply(resp.headers_mut());
        }
    }
    resp
}

async fn forward(
    conn: &Arc<ConnContext>,
    rule: &CompiledRule,
    route: &CompiledRoute,
    host: &str,
    mut req: Request<Incoming>,
) -> Response<ResponseBody> {
    let prefix = route.matcher.path.replaceable_prefix();
    let mut rewrite = Rewrite::default();
    if let Some(resp) = request_filters(&rule.filters, &mut req, host, prefix, &mut rewrite) {
        return respond(resp, &rule.filters, &[]);
    }
    let Some(backend) = rule.backends.pick() else {
        return respond(
            generated(
                StatusCode::INTERNAL_SERVER_ERROR,
                "no backend for this route\n",
            ),
            &rule.filters,
            &[],
        );
    };
    let cluster = match &backend.target {
        Target::Cluster(cluster) => cluster,
        Target::Invalid => {
            return respond(
                generated(StatusCode::INTERNAL_SERVER_ERROR, "backend is invalid\n"),
                &rule.filters,
                &backend.filters,
            );
        }
    };
    if let Some(resp) = request_filters(&backend.filters, &mut req, host, prefix, &mut rewrite) {
        return respond(resp, &rule.filters, &backend.filters);
    }
    let Some(endpoint) = cluster.endpoints.next() else {
        return respond(
            generated(StatusCode::SERVICE_UNAVAILABLE, "no healthy endpoints\n"),
            &rule.filters,
            &backend.filters,
        );
    };

    // HTTP/2 has no Upgrade; towards h2c the request goes out as a plain request.
    let upgrade = match endpoint.h2 {
        None => upstream::upgrade_protocol(&req),
        Some(_) => None,
    };
    if cluster.tls_broken {
        return respond(
            generated(StatusCode::BAD_GATEWAY, "upstream TLS is misconfigured\n"),
            &rule.filters,
            &backend.filters,
        );
    }
    if let Err(text) = prepare_upstream(&mut req, conn, endpoint, rewrite, &upgrade) {
        return respond(
            generated(StatusCode::INTERNAL_SERVER_ERROR, text),
            &rule.filters,
            &backend.filters,
        );
    }
    let downstream_upgrade = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut req));

    let sent = conn.socket.shared.upstreams.send(endpoint, req);
    let result = match rule.timeout {
        Some(limit) => match tokio::time::timeout(limit, sent).await {
            Ok(result) => result,
            Err(_) => {
                return respond(
                    generated(StatusCode::GATEWAY_TIMEOUT, "upstream timed out\n"),
                    &rule.filters,
                    &backend.filters,
                );
            }
        },
        None => sent.await,
    };
    let mut resp = match result {
        Ok(resp) => resp,
        Err(UpstreamError::Connect(error)) => {
            cluster.connect_failures.inc();
            debug!(cluster = &*cluster.name, endpoint = %endpoint.addr, %error, "upstream connect failed");
            return respond(
                generated(StatusCode::BAD_GATEWAY, "upstream connect error\n"),
                &rule.filters,
                &backend.filters,
            );
        }
        Err(UpstreamError::Failed(error)) => {
            debug!(cluster = &*cluster.name, endpoint = %endpoint.addr, %error, "upstream request failed");
            return respond(
                generated(StatusCode::BAD_GATEWAY, "upstream request failed\n"),
                &rule.filters,
                &backend.filters,
            );
        }
    };

    let upstream_upgrade = resp.headers().get(UPGRADE).cloned();
    strip_and_maybe_upgrade(conn, &mut resp, downstream_upgrade, upstream_upgrade);
    respond(
        resp.map(ResponseBody::Upstream),
        &rule.filters,
        &backend.filters,
    )
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
    let kill = shared.kill.clone();
    let conn = conn.clone();
    shared.tasks.spawn(async move {
        tokio::select! {
            () = upstream::splice(downstream, upstream) => {}
            () = kill.cancelled() => {}
        }
        drop(conn);
    });
}

/// Turns the client's request into the backend's: hop-by-hop fields out, forwarding fields in,
/// Host/authority and path as rewritten, URI pointing at the endpoint.
fn prepare_upstream(
    req: &mut Request<Incoming>,
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

    let authority = if endpoint.h2.is_some() {
        // HTTP/2 carries the host in `:authority`, which hyper takes from the URI.
        *req.version_mut() = Version::HTTP_2;
        req.headers_mut().remove(HOST);
        upstream_host
            .and_then(|h| Authority::try_from(h.as_bytes()).ok())
            .unwrap_or_else(|| endpoint.authority.clone())
    } else {
        *req.version_mut() = Version::HTTP_11;
        if let Some(host) = upstream_host {
            req.headers_mut().insert(HOST, host);
        }
        endpoint.authority.clone()
    };
    let mut parts = http::uri::Parts::default();
    parts.scheme = Some(if endpoint.tls.is_some() {
        Scheme::HTTPS
    } else {
        Scheme::HTTP
    });
    parts.authority = Some(authority);
    parts.path_and_query = Some(path_and_query);
    *req.uri_mut() = Uri::from_parts(parts).map_err(|_| "cannot build upstream URI\n")?;
    Ok(())
}
