//! `ExternalAuth`: an authorization server decides whether a request goes on. It runs at a
//! listener, before routing (GatewayListenerFilters), and at a rule, in the order of the rule's
//! filters. Both run on the hyper path (the HTTP/1 path hands such requests over, see
//! `h1::session`), because a check is a request of its own to await.
//!
//! - HTTP protocol: the request's method, its path behind the filter's prefix, Host,
//!   Authorization, the allowed headers and a correct Content-Length go to the server. A 2xx
//!   allows, and the response's headers (the allowed ones, or all but Host and the
//!   response's own framing) are set on the request; any other answer goes to the client as
//!   the server sent it (a 302 to a login page, a 401 with its challenge).
//! - gRPC protocol: Envoy's `envoy.service.auth.v3.Authorization/Check` (`wire`) over HTTP/2.
//!   Status OK allows and its `ok_response` edits the request's headers; any other status
//!   denies with its `denied_response` (403 when it names no status).
//! - Fail closed: a server that cannot be used (invalid backendRef, no endpoints, connect or
//!   protocol error, [`DEFAULT_TIMEOUT`] or the rule's tighter timeout) refuses the request:
//!   500 when the configuration is at fault, 503 otherwise. It never lets a request through.
//! - Host and `:authority` are never changed by a check, whatever the server answers.
//! - `forwardBody`: the body is read into memory up to `maxSize` (a longer one is refused
//!   with 413: an authorization decided on part of a body would cover bytes nobody checked),
//!   sent with the check, then forwarded from memory.
//!
//! `gatehouse_external_auth_checks_total{cluster, result}` counts the outcomes.

pub(crate) mod wire;

use crate::Shared;
use crate::conn::ConnContext;
use crate::hyper_path::{ResponseBody, generated};
use crate::limits::{IdleBody, RequestBody};
use crate::metrics::AuthMetrics;
use crate::table::{ClusterState, Endpoint};
use crate::upstream;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use gatehouse_ir as ir;
use http::header::{
    AUTHORIZATION, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, DATE, HOST, SERVER,
    TRANSFER_ENCODING,
};
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Version};
use http_body::Body;
use http_body_util::BodyExt;
use prost::Message;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tracing::debug;

/// The bound of one check when the rule sets none tighter.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest gRPC answer (and allow-response body, drained) read from a server.
const MAX_ANSWER: usize = 64 * 1024;
const CHECK_PATH: &str = "/envoy.service.auth.v3.Authorization/Check";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A compiled `ExternalAuth` filter.
#[derive(Debug)]
pub(crate) struct AuthSpec {
    /// `None`: the backendRef could not be used, and every request is refused.
    pub cluster: Option<Arc<ClusterState>>,
    pub protocol: Protocol,
    /// Bytes of body sent with the check; 0: none.
    pub forward_body: usize,
    pub metrics: AuthMetrics,
}

#[derive(Debug)]
pub(crate) enum Protocol {
    Http {
        path_prefix: Box<str>,
        allowed_headers: Box<[HeaderName]>,
        /// Empty: every header of the allow response but [`never_copied`] ones.
        allowed_response_headers: Box<[HeaderName]>,
    },
    Grpc {
        /// Empty: every header.
        allowed_headers: Box<[HeaderName]>,
    },
}

impl Protocol {
    pub(crate) fn compile(p: &ir::AuthProtocol) -> Result<Self, http::header::InvalidHeaderName> {
        let names = |list: &[String]| -> Result<Box<[HeaderName]>, _> {
            list.iter()
                .map(|n| HeaderName::from_bytes(n.as_bytes()))
                .collect()
        };
        Ok(match p {
            ir::AuthProtocol::Http {
                path_prefix,
                allowed_headers,
                allowed_response_headers,
            } => Protocol::Http {
                path_prefix: path_prefix.trim_end_matches('/').into(),
                allowed_headers: names(allowed_headers)?,
                allowed_response_headers: names(allowed_response_headers)?,
            },
            ir::AuthProtocol::Grpc { allowed_headers } => Protocol::Grpc {
                allowed_headers: names(allowed_headers)?,
            },
        })
    }
}

/// The request a check is about, as the filters before it left it.
pub(crate) struct Subject<'a> {
    pub parts: &'a mut http::request::Parts,
    pub body: &'a mut RequestBody,
    /// A path an earlier `URLRewrite` filter chose, sent instead of the request's.
    pub rewritten_path: Option<&'a str>,
    pub conn: &'a ConnContext,
}

/// What the server said.
pub(crate) enum Answer {
    Allow(Vec<HeaderChange>),
    Deny(Response<ResponseBody>),
}

/// An edit of the request's headers an allowing server asked for.
#[derive(Debug, PartialEq)]
pub(crate) enum HeaderChange {
    /// Replaces every value of the name.
    Set(HeaderName, HeaderValue),
    Append(HeaderName, HeaderValue),
    Remove(HeaderName),
}

/// Asks the server about the request. `Err`: the response the client gets instead.
pub(crate) async fn check(
    spec: &AuthSpec,
    shared: &Shared,
    subject: Subject<'_>,
    timeout: Option<Duration>,
) -> Result<(), Response<ResponseBody>> {
    let Some(cluster) = spec.cluster.as_deref() else {
        spec.metrics.error.inc();
        return Err(generated(
            StatusCode::INTERNAL_SERVER_ERROR,
            "external authorization is misconfigured\n",
        ));
    };
    let Subject {
        parts,
        body,
        rewritten_path,
        conn,
    } = subject;
    let forwarded = match spec.forward_body {
        0 => None,
        max => read_body(body, max, shared).await?,
    };
    let limit = timeout.map_or(DEFAULT_TIMEOUT, |t| t.min(DEFAULT_TIMEOUT));
    let request = Check {
        parts,
        rewritten_path,
        conn,
        body: forwarded,
    };
    let asked = async {
        match &spec.protocol {
            Protocol::Http {
                path_prefix,
                allowed_headers,
                allowed_response_headers,
            } => {
                let headers = Headers {
                    allowed: allowed_headers,
                    allowed_response: allowed_response_headers,
                };
                ask_http(shared, cluster, &request, path_prefix, headers).await
            }
            Protocol::Grpc { allowed_headers } => {
                ask_grpc(shared, cluster, &request, allowed_headers, limit).await
            }
        }
    };
    let answer = match tokio::time::timeout(limit, asked).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(error)) => {
            debug!(cluster = &*cluster.name, %error, "external authorization failed");
            spec.metrics.error.inc();
            return Err(generated(
                StatusCode::SERVICE_UNAVAILABLE,
                "external authorization failed\n",
            ));
        }
        Err(_) => {
            debug!(cluster = &*cluster.name, "external authorization timed out");
            spec.metrics.error.inc();
            return Err(generated(
                StatusCode::SERVICE_UNAVAILABLE,
                "external authorization timed out\n",
            ));
        }
    };
    match answer {
        Answer::Allow(changes) => {
            spec.metrics.allowed.inc();
            apply(&mut request.parts.headers, changes);
            Ok(())
        }
        Answer::Deny(response) => {
            spec.metrics.denied.inc();
            Err(response)
        }
    }
}

/// The parts of a check both protocols read.
struct Check<'a, 'p> {
    parts: &'p mut http::request::Parts,
    rewritten_path: Option<&'a str>,
    conn: &'a ConnContext,
    body: Option<Bytes>,
}

impl Check<'_, '_> {
    fn path_and_query(&self) -> String {
        let uri = &self.parts.uri;
        let path = self.rewritten_path.unwrap_or(uri.path());
        match uri.query() {
            Some(q) => format!("{path}?{q}"),
            None => path.to_string(),
        }
    }

    /// The request's Host (HTTP/1) or `:authority` (HTTP/2), as the client sent it.
    fn host(&self) -> Option<HeaderValue> {
        match self.parts.uri.authority() {
            Some(a) => HeaderValue::from_str(a.as_str()).ok(),
            None => self.parts.headers.get(HOST).cloned(),
        }
    }

    fn body_len(&self) -> usize {
        self.body.as_ref().map_or(0, Bytes::len)
    }
}

/// Reads the body ahead, up to `max` bytes, for the check and then the backend. `Ok(None)`:
/// there is none.
async fn read_body(
    body: &mut RequestBody,
    max: usize,
    shared: &Shared,
) -> Result<Option<Bytes>, Response<ResponseBody>> {
    let too_large = || {
        generated(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request body too large for external authorization\n",
        )
    };
    match body {
        // Read already, by an earlier check.
        RequestBody::Buffered(data, _) => return Ok(data.clone()),
        RequestBody::Streaming(b) if b.is_end_stream() => return Ok(None),
        RequestBody::Streaming(b) if b.size_hint().lower() > max as u64 => return Err(too_large()),
        RequestBody::Streaming(_) => {}
    }
    let taken = std::mem::replace(body, RequestBody::Buffered(None, None));
    // Through IdleBody, so that a client that stops sending is cut off as when it streams.
    let mut reading = IdleBody::new(taken, shared.limits.request_body, shared.metrics.clone());
    let mut data = BytesMut::new();
    let mut trailers = None;
    while let Some(frame) = reading.frame().await {
        let frame = frame.map_err(|error| {
            debug!(%error, "request body could not be read for external authorization");
            generated(StatusCode::BAD_REQUEST, "request body could not be read\n")
        })?;
        match frame.into_data() {
            Ok(chunk) if data.len() + chunk.len() > max => return Err(too_large()),
            Ok(chunk) => data.extend_from_slice(&chunk),
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    trailers = Some(t);
                }
            }
        }
    }
    let data = (!data.is_empty()).then(|| data.freeze());
    *body = RequestBody::Buffered(data.clone(), trailers);
    Ok(data)
}

/// An endpoint of the server's cluster, or why there is none to ask.
fn endpoint_of(cluster: &ClusterState) -> Result<&Endpoint, BoxError> {
    let endpoint = cluster.pick().ok_or("no endpoints")?;
    if cluster.tls_broken {
        return Err("TLS to the authorization server is misconfigured".into());
    }
    Ok(endpoint)
}

/// A request to the server, addressed (`hyper_path::address`).
struct Outgoing {
    method: Method,
    version: Version,
    uri: http::Uri,
    headers: HeaderMap,
    body: Option<Bytes>,
}

/// Sends it over the data plane's upstream clients, which keep the endpoint's health.
async fn send(
    shared: &Shared,
    cluster: &ClusterState,
    endpoint: &Endpoint,
    out: Outgoing,
) -> Result<Response<hyper::body::Incoming>, BoxError> {
    let body = IdleBody::replay(
        out.body,
        None,
        shared.limits.request_body,
        shared.metrics.clone(),
    );
    let mut req = Request::new(body);
    *req.method_mut() = out.method;
    *req.version_mut() = out.version;
    *req.uri_mut() = out.uri;
    *req.headers_mut() = out.headers;
    crate::hyper_path::send_upstream(shared, cluster, endpoint, req)
        .await
        .map_err(|e| format!("{e:?}").into())
}

struct Headers<'a> {
    allowed: &'a [HeaderName],
    allowed_response: &'a [HeaderName],
}

async fn ask_http(
    shared: &Shared,
    cluster: &ClusterState,
    check: &Check<'_, '_>,
    path_prefix: &str,
    names: Headers<'_>,
) -> Result<Answer, BoxError> {
    let endpoint = endpoint_of(cluster)?;
    let mut headers = HeaderMap::new();
    for name in std::iter::once(&AUTHORIZATION).chain(names.allowed) {
        if *name == HOST || *name == CONTENT_LENGTH {
            continue;
        }
        for value in check.parts.headers.get_all(name) {
            headers.append(name.clone(), value.clone());
        }
    }
    headers.insert(CONTENT_LENGTH, HeaderValue::from(check.body_len()));
    let target = PathAndQuery::try_from(format!("{path_prefix}{}", check.path_and_query()))?;
    let (version, uri) =
        crate::hyper_path::address(endpoint, check.host(), &mut headers, Some(target))?;
    let out = Outgoing {
        method: check.parts.method.clone(),
        version,
        uri,
        headers,
        body: check.body.clone(),
    };
    let resp = send(shared, cluster, endpoint, out).await?;
    let (mut head, body) = resp.into_parts();
    if !head.status.is_success() {
        upstream::strip_hop_by_hop(&mut head.headers);
        return Ok(Answer::Deny(Response::from_parts(
            head,
            ResponseBody::Upstream(body),
        )));
    }
    // Read to the end so that the connection can be reused; an allow needs no body.
    drain(body).await?;
    upstream::strip_hop_by_hop(&mut head.headers);
    let mut changes = Vec::new();
    let mut last: Option<&HeaderName> = None;
    for (name, value) in &head.headers {
        let copied = match names.allowed_response {
            [] => !never_copied(name),
            allowed => allowed.contains(name) && *name != HOST,
        };
        if copied {
            // The first value of a name replaces the request's, the rest join it.
            changes.push(if last == Some(name) {
                HeaderChange::Append(name.clone(), value.clone())
            } else {
                HeaderChange::Set(name.clone(), value.clone())
            });
            last = Some(name);
        }
    }
    Ok(Answer::Allow(changes))
}

/// Fields of an allow response that describe that response, not the request it allows: they
/// are not copied onto the request when the filter copies "all" of them.
fn never_copied(name: &HeaderName) -> bool {
    [
        &HOST,
        &CONTENT_LENGTH,
        &TRANSFER_ENCODING,
        &CONTENT_TYPE,
        &CONTENT_ENCODING,
        &DATE,
        &SERVER,
    ]
    .contains(&name)
}

async fn drain(mut body: hyper::body::Incoming) -> Result<(), BoxError> {
    let mut read = 0;
    while let Some(frame) = body.frame().await {
        if let Some(data) = frame?.data_ref() {
            read += data.len();
            if read > MAX_ANSWER {
                // Dropping the body closes the connection: nothing more is read.
                return Ok(());
            }
        }
    }
    Ok(())
}

async fn ask_grpc(
    shared: &Shared,
    cluster: &ClusterState,
    check: &Check<'_, '_>,
    allowed: &[HeaderName],
    limit: Duration,
) -> Result<Answer, BoxError> {
    let endpoint = endpoint_of(cluster)?;
    let message = check_request(check, allowed).encode_to_vec();
    let mut framed = BytesMut::with_capacity(5 + message.len());
    framed.put_u8(0);
    framed.put_u32(u32::try_from(message.len())?);
    framed.extend_from_slice(&message);
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("te", HeaderValue::from_static("trailers"));
    // Milliseconds, in at most the 8 digits gRPC allows.
    let millis = limit.as_millis().min(99_999_999);
    headers.insert(
        "grpc-timeout",
        HeaderValue::from_str(&format!("{millis}m"))?,
    );
    let (version, uri) = crate::hyper_path::address(
        endpoint,
        None,
        &mut headers,
        Some(PathAndQuery::from_static(CHECK_PATH)),
    )?;
    if version != Version::HTTP_2 {
        return Err("the authorization server's cluster does not speak HTTP/2".into());
    }
    let out = Outgoing {
        method: Method::POST,
        version,
        uri,
        headers,
        body: Some(framed.freeze()),
    };
    let resp = send(shared, cluster, endpoint, out).await?;
    if resp.status() != StatusCode::OK {
        return Err(format!("HTTP status {} from the Check call", resp.status()).into());
    }
    let (head, mut body) = resp.into_parts();
    let mut data = BytesMut::new();
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        match frame?.into_data() {
            Ok(chunk) if data.len() + chunk.len() > MAX_ANSWER + 5 => {
                return Err("the Check answer is too large".into());
            }
            Ok(chunk) => data.extend_from_slice(&chunk),
            Err(frame) => trailers = frame.into_trailers().ok(),
        }
    }
    // Trailers, or the headers of a trailers-only answer.
    let status_of = |h: &HeaderMap| h.get("grpc-status").map(|v| v.as_bytes().to_vec());
    let status = trailers
        .as_ref()
        .and_then(status_of)
        .or_else(|| status_of(&head.headers));
    match status.as_deref() {
        Some(b"0") => {}
        Some(code) => {
            let message = trailers
                .as_ref()
                .unwrap_or(&head.headers)
                .get("grpc-message")
                .and_then(|m| m.to_str().ok())
                .unwrap_or("");
            return Err(format!(
                "the Check call failed: grpc-status {} {message}",
                String::from_utf8_lossy(code)
            )
            .into());
        }
        None => return Err("the Check call ended without a grpc-status".into()),
    }
    Ok(grpc_answer(parse_answer(data.freeze())?))
}

/// The one message of a Check answer's body: a 5-byte gRPC frame head (not compressed, the
/// length of the rest), then the `CheckResponse`.
pub(crate) fn parse_answer(mut data: Bytes) -> Result<wire::CheckResponse, BoxError> {
    if data.len() < 5 || data[0] != 0 {
        return Err("the Check answer is not one uncompressed message".into());
    }
    data.advance(1);
    let len = data.get_u32() as usize;
    if data.len() != len {
        return Err("the Check answer's length does not match its message".into());
    }
    Ok(wire::CheckResponse::decode(data)?)
}

fn check_request(check: &Check<'_, '_>, allowed: &[HeaderName]) -> wire::CheckRequest {
    let mut headers = std::collections::BTreeMap::new();
    for (name, value) in &check.parts.headers {
        if !allowed.is_empty() && !allowed.contains(name) {
            continue;
        }
        let value = String::from_utf8_lossy(value.as_bytes());
        headers
            .entry(name.as_str().to_string())
            .and_modify(|v: &mut String| {
                v.push(',');
                v.push_str(&value);
            })
            .or_insert_with(|| value.into_owned());
    }
    let host = check
        .host()
        .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned())
        .unwrap_or_default();
    let size = match &check.body {
        Some(b) => b.len() as i64,
        None => check
            .parts
            .headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(if check.parts.method == Method::GET {
                0
            } else {
                -1
            }),
    };
    let (body, raw_body) = match &check.body {
        None => (String::new(), Vec::new()),
        Some(b) => match std::str::from_utf8(b) {
            Ok(text) => (text.to_string(), Vec::new()),
            Err(_) => (String::new(), b.to_vec()),
        },
    };
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let protocol = match check.parts.version {
        Version::HTTP_2 => "HTTP/2",
        Version::HTTP_10 => "HTTP/1.0",
        _ => "HTTP/1.1",
    };
    wire::CheckRequest {
        attributes: Some(wire::AttributeContext {
            source: Some(wire::Peer {
                address: Some(wire::Address {
                    socket_address: Some(wire::SocketAddress {
                        address: String::from_utf8_lossy(check.conn.client_ip.as_bytes())
                            .into_owned(),
                        port_value: 0,
                    }),
                }),
            }),
            destination: None,
            request: Some(wire::Request {
                time: Some(wire::Timestamp {
                    seconds: now.as_secs() as i64,
                    nanos: now.subsec_nanos() as i32,
                }),
                http: Some(wire::HttpRequest {
                    id: check
                        .parts
                        .headers
                        .get("x-request-id")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_string(),
                    method: check.parts.method.as_str().to_string(),
                    headers,
                    path: check.path_and_query(),
                    host,
                    scheme: String::from_utf8_lossy(check.conn.proto.as_bytes()).into_owned(),
                    size,
                    protocol: protocol.to_string(),
                    body,
                    raw_body,
                }),
            }),
        }),
    }
}

/// Status OK allows, with the `ok_response`'s header edits; anything else denies, with the
/// `denied_response`'s status (403 when it names none), headers and body.
pub(crate) fn grpc_answer(answer: wire::CheckResponse) -> Answer {
    let allowed = answer.status.as_ref().is_none_or(|s| s.code == 0);
    if allowed {
        let mut changes = Vec::new();
        if let Some(ok) = answer.ok_response {
            for option in &ok.headers {
                if let Some((name, value)) = header_of(option) {
                    let append = option.append.as_ref().is_some_and(|a| a.value);
                    changes.push(if append {
                        HeaderChange::Append(name, value)
                    } else {
                        HeaderChange::Set(name, value)
                    });
                }
            }
            for name in &ok.headers_to_remove {
                if let Ok(name) = HeaderName::from_bytes(name.as_bytes()) {
                    changes.push(HeaderChange::Remove(name));
                }
            }
        }
        return Answer::Allow(changes);
    }
    let denied = answer.denied_response.unwrap_or_default();
    let status = denied
        .status
        .and_then(|s| u16::try_from(s.code).ok())
        .and_then(|c| StatusCode::from_u16(c).ok())
        .filter(|s| s.as_u16() >= 200)
        .unwrap_or(StatusCode::FORBIDDEN);
    let body = (!denied.body.is_empty()).then(|| Bytes::from(denied.body));
    let mut response = Response::new(ResponseBody::Static(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    for option in &denied.headers {
        if let Some((name, value)) = header_of(option) {
            if never_copied(&name) && name != CONTENT_TYPE {
                continue;
            }
            if option.append.as_ref().is_some_and(|a| a.value) {
                headers.append(name, value);
            } else {
                headers.insert(name, value);
            }
        }
    }
    Answer::Deny(response)
}

fn header_of(option: &wire::HeaderValueOption) -> Option<(HeaderName, HeaderValue)> {
    let h = option.header.as_ref()?;
    let name = HeaderName::from_bytes(h.key.as_bytes()).ok()?;
    let value = if h.raw_value.is_empty() {
        HeaderValue::from_str(&h.value).ok()?
    } else {
        HeaderValue::from_bytes(&h.raw_value).ok()?
    };
    Some((name, value))
}

/// Applies an allowing server's edits. Host is the client's, whatever the server says: it
/// chose the listener and, for a listener's filters, is what routing matches.
pub(crate) fn apply(headers: &mut HeaderMap, changes: Vec<HeaderChange>) {
    for change in changes {
        match change {
            HeaderChange::Set(name, _)
            | HeaderChange::Append(name, _)
            | HeaderChange::Remove(name)
                if name == HOST => {}
            HeaderChange::Set(name, value) => {
                headers.insert(name, value);
            }
            HeaderChange::Append(name, value) => {
                headers.append(name, value);
            }
            HeaderChange::Remove(name) => {
                headers.remove(name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn option(key: &str, value: &str, append: Option<bool>) -> wire::HeaderValueOption {
        wire::HeaderValueOption {
            header: Some(wire::HeaderValue {
                key: key.into(),
                value: value.into(),
                raw_value: vec![],
            }),
            append: append.map(|value| wire::BoolValue { value }),
        }
    }

    #[test]
    fn grpc_ok_sets_appends_and_removes_but_never_touches_host() {
        let answer = wire::CheckResponse {
            status: Some(wire::RpcStatus::default()),
            denied_response: None,
            ok_response: Some(wire::OkHttpResponse {
                headers: vec![
                    option("x-user", "alice", None),
                    option("x-group", "b", Some(true)),
                    option("host", "evil.example", None),
                ],
                headers_to_remove: vec!["authorization".into(), "host".into()],
            }),
        };
        let Answer::Allow(changes) = grpc_answer(answer) else {
            panic!("status OK must allow");
        };
        let mut headers = HeaderMap::new();
        headers.insert(HOST, HeaderValue::from_static("app.example"));
        headers.insert("x-user", HeaderValue::from_static("mallory"));
        headers.insert("x-group", HeaderValue::from_static("a"));
        headers.insert(AUTHORIZATION, HeaderValue::from_static("Bearer t"));
        apply(&mut headers, changes);
        assert_eq!(headers["x-user"], "alice");
        let groups: Vec<_> = headers.get_all("x-group").iter().collect();
        assert_eq!(groups, ["a", "b"]);
        assert!(headers.get(AUTHORIZATION).is_none());
        assert_eq!(headers[HOST], "app.example");
    }

    #[test]
    fn grpc_denial_takes_its_status_or_403() {
        let denied = |code: Option<i32>| wire::CheckResponse {
            status: Some(wire::RpcStatus {
                code: 7,
                message: "no".into(),
            }),
            denied_response: Some(wire::DeniedHttpResponse {
                status: code.map(|code| wire::HttpStatus { code }),
                headers: vec![option("www-authenticate", "Bearer", None)],
                body: "go away".into(),
            }),
            ok_response: None,
        };
        let Answer::Deny(resp) = grpc_answer(denied(Some(401))) else {
            panic!("status 7 must deny");
        };
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(resp.headers()["www-authenticate"], "Bearer");
        let Answer::Deny(resp) = grpc_answer(denied(None)) else {
            panic!("status 7 must deny");
        };
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        // Not a final status: the default.
        let Answer::Deny(resp) = grpc_answer(denied(Some(100))) else {
            panic!("status 7 must deny");
        };
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    }

    #[test]
    fn a_check_response_decodes_from_the_field_numbers_of_the_proto() {
        // CheckResponse{status{code:0}, ok_response{headers[{header{key:"k",value:"v"}}]}}
        // written field by field: tag 1 (status, empty), tag 3 (ok_response) holding tag 2
        // (headers) holding tag 1 (header) holding tags 1 and 2.
        let header_value = [0x0a, 0x01, b'k', 0x12, 0x01, b'v'];
        let mut option = vec![0x0a, header_value.len() as u8];
        option.extend_from_slice(&header_value);
        let mut ok = vec![0x12, option.len() as u8];
        ok.extend_from_slice(&option);
        let mut bytes = vec![0x0a, 0x00, 0x1a, ok.len() as u8];
        bytes.extend_from_slice(&ok);
        let decoded = wire::CheckResponse::decode(&bytes[..]).unwrap();
        let ok = decoded.ok_response.unwrap();
        let header = ok.headers[0].header.as_ref().unwrap();
        assert_eq!((header.key.as_str(), header.value.as_str()), ("k", "v"));
    }
}
