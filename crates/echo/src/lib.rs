//! `gatehouse echo`: a small, fast test backend.
//!
//! Serves HTTP/1.1 (keep-alive) and HTTP/2 with prior knowledge (h2c) on one port. Every
//! request gets a JSON description of itself:
//!
//! ```json
//! {"name":"coffee-v1","method":"GET","path":"/coffee","query":"a=1","host":"cafe.example.com",
//!  "proto":"HTTP/1.1","headers":{"accept":["*/*"]},"body_bytes":0}
//! ```
//!
//! The request body is read as a stream and only counted. Control headers:
//! - `x-echo-status: 418` sets the status;
//! - `x-echo-response-bytes: N` answers with a streamed body of N bytes (a fixed pattern in
//!   64 KiB chunks, made lazily and never copied) instead of JSON, with `content-length: N`
//!   and `x-echo-body-bytes` giving the request body size;
//! - `x-echo-delay-ms: N` waits N ms (after reading the body) before answering;
//! - `x-echo-set-response-header: name=value` adds a response header (repeatable).
//!
//! Invalid control values get a 400 that says why. `Upgrade: websocket` requests get a real
//! WebSocket handshake, and every text or binary message is echoed back.
//!
//! HTTP/2 requests with `content-type: application/grpc…` are answered as a unary gRPC call
//! that echoes its request: the request's length-prefixed messages come back as they were
//! sent, with `grpc-status: 0` in the trailers (the gRPC workload of bench/dataplane, and a
//! backend for GRPCRoutes without a protobuf toolchain). A request body over 4 MiB gets
//! RESOURCE_EXHAUSTED (8) instead.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use futures_util::{SinkExt as _, StreamExt as _};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};
use http_body_util::BodyExt as _;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde::Serialize;
use serde::ser::{SerializeMap as _, SerializeSeq as _};
use tokio::net::TcpListener;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

/// Options of `gatehouse echo`.
#[derive(Clone, Debug)]
pub struct EchoOptions {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Name reported in every JSON response (e.g. the Service it stands in for).
    pub name: String,
}

/// Binds `opts.listen` and serves until Ctrl-C or SIGTERM.
pub async fn run(opts: EchoOptions) -> anyhow::Result<()> {
    let listener = TcpListener::bind(opts.listen)
        .await
        .with_context(|| format!("echo: cannot listen on {}", opts.listen))?;
    tracing::info!(listen = %listener.local_addr()?, name = %opts.name, "echo backend serving");
    tokio::select! {
        () = serve(listener, opts.name) => {}
        () = shutdown_signal() => tracing::info!("echo backend stopping"),
    }
    Ok(())
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Serves forever on an already-bound listener (tests spawn this on `127.0.0.1:0`).
pub async fn serve(listener: TcpListener, name: String) {
    let name: Arc<str> = name.into();
    let builder = auto::Builder::new(TokioExecutor::new());
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!("echo: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let name = name.clone();
        let builder = builder.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| handle(name.clone(), req));
            let _ = builder
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .await;
        });
    }
}

const STATUS: &str = "x-echo-status";
const RESPONSE_BYTES: &str = "x-echo-response-bytes";
const DELAY_MS: &str = "x-echo-delay-ms";
const SET_RESPONSE_HEADER: &str = "x-echo-set-response-header";
const BODY_BYTES: &str = "x-echo-body-bytes";

/// What the control headers ask for.
struct Control {
    status: StatusCode,
    response_bytes: Option<u64>,
    delay: Option<Duration>,
    set_headers: Vec<(HeaderName, HeaderValue)>,
}

fn parse_control(headers: &HeaderMap) -> Result<Control, String> {
    fn number<T: std::str::FromStr>(headers: &HeaderMap, name: &str) -> Result<Option<T>, String> {
        let Some(v) = headers.get(name) else {
            return Ok(None);
        };
        v.to_str()
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .map(Some)
            .ok_or_else(|| format!("{name}: not a valid number: {v:?}"))
    }
    let status = match number::<u16>(headers, STATUS)? {
        None => StatusCode::OK,
        Some(code) => StatusCode::from_u16(code)
            .ok()
            .filter(|s| !s.is_informational())
            .ok_or_else(|| format!("{STATUS}: not a final status code: {code}"))?,
    };
    let mut set_headers = Vec::new();
    for v in headers.get_all(SET_RESPONSE_HEADER) {
        let pair = v
            .to_str()
            .ok()
            .and_then(|s| s.split_once('='))
            .and_then(|(n, v)| {
                Some((
                    HeaderName::from_bytes(n.trim().as_bytes()).ok()?,
                    HeaderValue::from_str(v.trim()).ok()?,
                ))
            })
            .ok_or_else(|| format!("{SET_RESPONSE_HEADER}: expected name=value, got {v:?}"))?;
        set_headers.push(pair);
    }
    Ok(Control {
        status,
        response_bytes: number(headers, RESPONSE_BYTES)?,
        delay: number(headers, DELAY_MS)?.map(Duration::from_millis),
        set_headers,
    })
}

async fn handle(
    name: Arc<str>,
    mut req: Request<Incoming>,
) -> Result<Response<EchoBody>, Infallible> {
    if is_websocket(&req) {
        return Ok(websocket(&mut req));
    }
    if is_grpc(&req) {
        return Ok(grpc_echo(req).await);
    }
    let control = match parse_control(req.headers()) {
        Ok(c) => c,
        Err(message) => return Ok(text(StatusCode::BAD_REQUEST, message)),
    };

    let (parts, mut body) = req.into_parts();
    let mut body_bytes: u64 = 0;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Some(data) = frame.data_ref() {
                    body_bytes += data.len() as u64;
                }
            }
            // The client went away or broke framing; hyper closes the connection.
            Err(_) => break,
        }
    }

    if let Some(delay) = control.delay {
        tokio::time::sleep(delay).await;
    }

    let mut response = match control.response_bytes {
        Some(n) => {
            let mut r = Response::new(EchoBody::pattern(n));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            r.headers_mut()
                .insert(BODY_BYTES, HeaderValue::from(body_bytes));
            r
        }
        None => {
            let echo = Echo {
                name: &name,
                method: parts.method.as_str(),
                path: parts.uri.path(),
                query: parts.uri.query().unwrap_or(""),
                host: host(&parts),
                proto: proto(parts.version),
                headers: Headers(&parts.headers),
                body_bytes,
            };
            let mut json = Vec::with_capacity(256 + 64 * parts.headers.len());
            // Serializing borrowed strings into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut json, &echo);
            let mut r = Response::new(EchoBody::full(json));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            r
        }
    };
    *response.status_mut() = control.status;
    for (n, v) in control.set_headers {
        response.headers_mut().append(n, v);
    }
    Ok(response)
}

fn host(parts: &http::request::Parts) -> &str {
    parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| parts.uri.authority().map(|a| a.as_str()))
        .unwrap_or("")
}

fn proto(version: Version) -> &'static str {
    match version {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_2 => "HTTP/2.0",
        Version::HTTP_3 => "HTTP/3.0",
        _ => "HTTP/1.1",
    }
}

#[derive(Serialize)]
struct Echo<'a> {
    name: &'a str,
    method: &'a str,
    path: &'a str,
    query: &'a str,
    host: &'a str,
    proto: &'static str,
    headers: Headers<'a>,
    body_bytes: u64,
}

/// `{"lower-name":["v1","v2"]}`, in the order names first appear.
struct Headers<'a>(&'a HeaderMap);

impl Serialize for Headers<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.keys_len()))?;
        for name in self.0.keys() {
            map.serialize_entry(name.as_str(), &Values(self.0.get_all(name)))?;
        }
        map.end()
    }
}

/// The values of one header, serialized without collecting them first.
struct Values<'a>(http::header::GetAll<'a, HeaderValue>);

impl Serialize for Values<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(None)?;
        for v in self.0.iter() {
            seq.serialize_element(&String::from_utf8_lossy(v.as_bytes()))?;
        }
        seq.end()
    }
}

fn text(status: StatusCode, message: String) -> Response<EchoBody> {
    let mut r = Response::new(EchoBody::full(message.into_bytes()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r
}

/// The largest gRPC request body echoed back (messages and their 5-byte prefixes).
const GRPC_MAX_BODY: usize = 4 << 20;

fn is_grpc(req: &Request<Incoming>) -> bool {
    req.version() == Version::HTTP_2
        && req
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// A unary gRPC call answered with its own request messages and `grpc-status: 0`. The body
/// is echoed as received: it is already a sequence of length-prefixed messages.
async fn grpc_echo(req: Request<Incoming>) -> Response<EchoBody> {
    let mut body = req.into_body();
    let mut echoed = Vec::new();
    let mut status = "0";
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Some(data) = frame.data_ref() {
                    if echoed.len() + data.len() > GRPC_MAX_BODY {
                        status = "8"; // RESOURCE_EXHAUSTED
                        echoed.clear();
                        break;
                    }
                    echoed.extend_from_slice(data);
                }
            }
            Err(_) => {
                status = "1"; // CANCELLED: the client went away or broke framing
                echoed.clear();
                break;
            }
        }
    }
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static(status));
    let mut r = Response::new(EchoBody(BodyKind::Grpc {
        data: Some(Bytes::from(echoed)).filter(|d| !d.is_empty()),
        trailers: Some(trailers),
    }));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    r
}

fn header_has_token(headers: &HeaderMap, name: HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|v| {
        v.to_str()
            .is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    })
}

fn is_websocket(req: &Request<Incoming>) -> bool {
    req.method() == Method::GET
        && req.version() == Version::HTTP_11
        && header_has_token(req.headers(), header::UPGRADE, "websocket")
}

/// Answers the handshake with 101 and echoes messages on the upgraded connection.
fn websocket(req: &mut Request<Incoming>) -> Response<EchoBody> {
    let headers = req.headers();
    if !header_has_token(headers, header::CONNECTION, "upgrade") {
        return text(
            StatusCode::BAD_REQUEST,
            "websocket: missing Connection: upgrade".into(),
        );
    }
    let Some(key) = headers.get(header::SEC_WEBSOCKET_KEY) else {
        return text(
            StatusCode::BAD_REQUEST,
            "websocket: missing Sec-WebSocket-Key".into(),
        );
    };
    if headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .map(|v| v.as_bytes())
        != Some(b"13")
    {
        let mut r = text(StatusCode::BAD_REQUEST, "websocket: only version 13".into());
        r.headers_mut().insert(
            header::SEC_WEBSOCKET_VERSION,
            HeaderValue::from_static("13"),
        );
        return r;
    }
    let accept = derive_accept_key(key.as_bytes());
    // Accept the first subprotocol offered, so that clients that require one connect.
    let protocol = headers
        .get(header::SEC_WEBSOCKET_PROTOCOL)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.split(',').next())
        .and_then(|p| HeaderValue::from_str(p.trim()).ok());

    let on_upgrade = hyper::upgrade::on(req);
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(u) => u,
            Err(e) => {
                tracing::debug!("echo: websocket upgrade failed: {e}");
                return;
            }
        };
        let mut ws =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        while let Some(message) = ws.next().await {
            match message {
                Ok(m) if m.is_text() || m.is_binary() => {
                    if ws.send(m).await.is_err() {
                        break;
                    }
                }
                // Pings are answered and Close is completed by tungstenite itself.
                Ok(_) => {}
                Err(_) => break,
            }
        }
    });

    let mut r = Response::new(EchoBody::empty());
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    h.insert(
        header::SEC_WEBSOCKET_ACCEPT,
        HeaderValue::from_str(&accept).expect("base64 is a valid header value"),
    );
    if let Some(p) = protocol {
        h.insert(header::SEC_WEBSOCKET_PROTOCOL, p);
    }
    r
}

const CHUNK: usize = 64 * 1024;

/// 64 KiB of `0123456789abcdef...` lines, shared by every streamed response.
static PATTERN: [u8; CHUNK] = {
    let alphabet = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ\n";
    let mut p = [0u8; CHUNK];
    let mut i = 0;
    while i < CHUNK {
        p[i] = alphabet[i % alphabet.len()];
        i += 1;
    }
    p
};

/// A response body: JSON/text in one frame, or N pattern bytes made chunk by chunk.
struct EchoBody(BodyKind);

enum BodyKind {
    Full(Option<Bytes>),
    Pattern {
        remaining: u64,
    },
    /// Data (if any), then trailers.
    Grpc {
        data: Option<Bytes>,
        trailers: Option<HeaderMap>,
    },
}

impl EchoBody {
    fn full(data: Vec<u8>) -> Self {
        EchoBody(BodyKind::Full(Some(Bytes::from(data))))
    }

    fn empty() -> Self {
        EchoBody(BodyKind::Full(None))
    }

    fn pattern(n: u64) -> Self {
        EchoBody(BodyKind::Pattern { remaining: n })
    }
}

impl Body for EchoBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let frame = match &mut self.get_mut().0 {
            BodyKind::Grpc { data, trailers } => {
                let frame = match data.take() {
                    Some(d) => Some(Frame::data(d)),
                    None => trailers.take().map(Frame::trailers),
                };
                return Poll::Ready(frame.map(Ok));
            }
            BodyKind::Full(data) => data.take().filter(|d| !d.is_empty()),
            BodyKind::Pattern { remaining } => {
                if *remaining == 0 {
                    None
                } else {
                    let n = (*remaining).min(CHUNK as u64) as usize;
                    *remaining -= n as u64;
                    Some(Bytes::from_static(&PATTERN[..n]))
                }
            }
        };
        Poll::Ready(frame.map(|d| Ok(Frame::data(d))))
    }

    fn is_end_stream(&self) -> bool {
        match &self.0 {
            BodyKind::Full(data) => data.as_ref().is_none_or(|d| d.is_empty()),
            BodyKind::Pattern { remaining } => *remaining == 0,
            BodyKind::Grpc { data, trailers } => data.is_none() && trailers.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            BodyKind::Full(data) => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            BodyKind::Pattern { remaining } => SizeHint::with_exact(*remaining),
            BodyKind::Grpc { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_tungstenite::tungstenite::Message;

    async fn start(name: &str) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, name.to_owned()));
        addr
    }

    #[tokio::test]
    async fn json_describes_the_request() {
        let addr = start("coffee-v1").await;
        let client = reqwest::Client::new();
        let response = client
            .post(format!("http://{addr}/coffee/latte?a=1&b=%20x"))
            .header("Host", "cafe.example.com")
            .header("X-Multi", "one")
            .header("x-multi", "two")
            .body(vec![7u8; 100_000])
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "application/json");
        let v: serde_json::Value =
            serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        assert_eq!(v["name"], "coffee-v1");
        assert_eq!(v["method"], "POST");
        assert_eq!(v["path"], "/coffee/latte");
        assert_eq!(v["query"], "a=1&b=%20x");
        assert_eq!(v["host"], "cafe.example.com");
        assert_eq!(v["proto"], "HTTP/1.1");
        assert_eq!(v["headers"]["x-multi"], serde_json::json!(["one", "two"]));
        assert_eq!(
            v["headers"]["content-length"],
            serde_json::json!(["100000"])
        );
        assert_eq!(v["body_bytes"], 100_000);
    }

    #[tokio::test]
    async fn control_headers() {
        let addr = start("tea").await;
        let client = reqwest::Client::new();
        let started = std::time::Instant::now();
        let response = client
            .get(format!("http://{addr}/"))
            .header(STATUS, "418")
            .header(DELAY_MS, "150")
            .header(SET_RESPONSE_HEADER, "x-one=1")
            .header(SET_RESPONSE_HEADER, "x-two = 2")
            .send()
            .await
            .unwrap();
        assert!(started.elapsed() >= Duration::from_millis(150));
        assert_eq!(response.status(), 418);
        assert_eq!(response.headers()["x-one"], "1");
        assert_eq!(response.headers()["x-two"], "2");
        let v: serde_json::Value =
            serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        assert_eq!(v["name"], "tea");

        let bad = client
            .get(format!("http://{addr}/"))
            .header(STATUS, "teapot")
            .send()
            .await
            .unwrap();
        assert_eq!(bad.status(), 400);
        assert!(bad.text().await.unwrap().contains(STATUS));

        // A status without a body keeps the connection usable.
        for status in ["204", "304", "200"] {
            let r = client
                .head(format!("http://{addr}/"))
                .header(STATUS, status)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_str(), status);
            let r = client
                .get(format!("http://{addr}/"))
                .header(STATUS, status)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_str(), status);
            r.bytes().await.unwrap();
        }
    }

    #[tokio::test]
    async fn streams_n_bytes_and_counts_the_request_body() {
        let addr = start("big").await;
        let n = 3 * CHUNK as u64 + 123;
        let response = reqwest::Client::new()
            .put(format!("http://{addr}/big"))
            .header(RESPONSE_BYTES, n.to_string())
            .body(vec![1u8; 70_000])
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.content_length(), Some(n));
        assert_eq!(response.headers()[BODY_BYTES], "70000");
        let mut stream = response.bytes_stream();
        let mut total = 0u64;
        let mut first = None;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.unwrap();
            first.get_or_insert_with(|| chunk.slice(..10));
            total += chunk.len() as u64;
        }
        assert_eq!(total, n);
        assert_eq!(first.unwrap().as_ref(), b"0123456789");
    }

    #[tokio::test]
    async fn zero_response_bytes() {
        let addr = start("empty").await;
        let response = reqwest::Client::new()
            .get(format!("http://{addr}/"))
            .header(RESPONSE_BYTES, "0")
            .send()
            .await
            .unwrap();
        assert_eq!(response.content_length(), Some(0));
        assert!(response.bytes().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn websocket_echo_round_trip() {
        let addr = start("ws").await;
        let (mut ws, response) = tokio_tungstenite::connect_async(format!("ws://{addr}/chat"))
            .await
            .unwrap();
        assert_eq!(response.status(), 101);
        ws.send(Message::text("hello")).await.unwrap();
        assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("hello"));
        let blob: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        ws.send(Message::binary(blob.clone())).await.unwrap();
        assert_eq!(ws.next().await.unwrap().unwrap(), Message::binary(blob));
        ws.send(Message::Ping(Bytes::from_static(b"p")))
            .await
            .unwrap();
        assert_eq!(
            ws.next().await.unwrap().unwrap(),
            Message::Pong(Bytes::from_static(b"p"))
        );
        ws.close(None).await.unwrap();
        // The server completes the close handshake.
        while let Some(m) = ws.next().await {
            if m.is_err() {
                break;
            }
        }
    }

    #[tokio::test]
    async fn h2_prior_knowledge() {
        let addr = start("h2").await;
        let client = reqwest::Client::builder()
            .http2_prior_knowledge()
            .build()
            .unwrap();
        for _ in 0..3 {
            let response = client
                .get(format!("http://{addr}/two?x=y"))
                .send()
                .await
                .unwrap();
            assert_eq!(response.version(), reqwest::Version::HTTP_2);
            let v: serde_json::Value =
                serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
            assert_eq!(v["proto"], "HTTP/2.0");
            assert_eq!(v["path"], "/two");
            assert_eq!(v["query"], "x=y");
            assert_eq!(v["host"], addr.to_string());
        }
    }

    /// A gRPC call over h2c: the request's framed message comes back with grpc-status 0 in
    /// the trailers (hyper's client, which exposes trailers).
    #[tokio::test]
    async fn grpc_calls_are_echoed_with_trailers() {
        use http_body_util::Full;
        let addr = start("grpc").await;
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        // One message: not compressed, 3 bytes.
        let message = Bytes::from_static(&[0, 0, 0, 0, 3, 0x0a, 0x01, 0x41]);
        let req = Request::post(format!("http://{addr}/bench.Echo/Unary"))
            .header(header::CONTENT_TYPE, "application/grpc")
            .header("te", "trailers")
            .body(Full::new(message.clone()))
            .unwrap();
        let response = sender.send_request(req).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/grpc");
        let collected = response.into_body().collect().await.unwrap();
        let trailers = collected.trailers().cloned().expect("trailers");
        assert_eq!(trailers["grpc-status"], "0");
        assert_eq!(collected.to_bytes(), message);
    }

    #[tokio::test]
    async fn http1_keep_alive_on_one_connection() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let addr = start("ka").await;
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut buf = vec![0u8; 4096];
        for i in 0..3 {
            conn.write_all(format!("GET /{i} HTTP/1.1\r\nHost: h\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let n = conn.read(&mut buf).await.unwrap();
            let text = String::from_utf8_lossy(&buf[..n]);
            assert!(text.starts_with("HTTP/1.1 200"), "{text}");
            assert!(text.contains(&format!("\"path\":\"/{i}\"")), "{text}");
        }
    }
}
