//! Hostile input, each case a finding of the hostile-input review reproduced against a
//! backend that records every byte it receives: what reaches the backend, and what the client
//! gets, on the HTTP/1 path and over HTTP/2.

mod common;

use bytes::Bytes;
use common::raw::*;
use common::*;
use gatehouse_dataplane::Options;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One request on a new connection, the raw response.
async fn raw_exchange(port: u16, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut pending = Vec::new();
    read_response(&mut stream, &mut pending, false).await
}

/// A GET over HTTP/2 (prior knowledge): status and body.
async fn h2_get(port: u16, path: &str) -> (u16, String) {
    let stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = Request::get(format!("http://h{path}"))
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// `/public` goes to the `public` backend, everything else to `other`; both answer with
/// their name and record the raw requests.
async fn public_and_other() -> (u16, RawBackend, RawBackend) {
    let public = raw_backend(|_, _| ok("public")).await;
    let other = raw_backend(|_, _| ok("other")).await;
    let port = free_port();
    let cfg = config(
        vec![listener(
            port,
            None,
            vec![
                rule("public", vec![to_cluster("public")], vec![]),
                rule("other", vec![to_cluster("other")], vec![]),
            ],
            vec![prefix("/public", 0), prefix("/", 1)],
        )],
        vec![
            http1("public", vec![public.addr]),
            http1("other", vec![other.addr]),
        ],
    );
    let (dp, _) = dataplane(Options::default()).await;
    apply_ok(&dp, &cfg).await;
    std::mem::forget(dp);
    (port, public, other)
}

/// Finding 1 (high): paths are normalised once, before matching, and forwarded normalised; a
/// path that cannot be normalised safely is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_are_normalised_before_matching_and_forwarded_normalised() {
    let (port, public, other) = public_and_other().await;
    // (request path, who serves it, the path the backend receives)
    let routed = [
        ("/public/../admin", "other", "/admin"),
        ("/public/%2e%2e/admin", "other", "/admin"),
        ("/public/%2E%2E/admin", "other", "/admin"),
        ("/public/./x", "public", "/public/x"),
        ("//public//x", "public", "/public/x"),
        ("/%70ublic/x", "public", "/public/x"),
        ("/public/a/../b?q=/../x", "public", "/public/b?q=/../x"),
    ];
    for (path, who, forwarded) in routed {
        let h1 = raw_exchange(
            port,
            format!("GET {path} HTTP/1.1\r\nhost: h\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await;
        assert!(h1.starts_with("HTTP/1.1 200"), "{path}: {h1}");
        assert!(h1.ends_with(who), "HTTP/1 {path} served by {who}: {h1}");
        let (status, body) = h2_get(port, path).await;
        assert_eq!((status, body.as_str()), (200, who), "HTTP/2 {path}");
        let backend = if who == "public" { &public } else { &other };
        let seen = backend.requests.lock().unwrap().clone();
        let last_two: Vec<String> = seen.iter().rev().take(2).map(|r| path_of(r)).collect();
        assert_eq!(
            last_two,
            [forwarded, forwarded],
            "{path} reaches {who} as {forwarded}"
        );
    }
    // Nothing of those reached `public` with a path outside it.
    assert!(
        public
            .requests
            .lock()
            .unwrap()
            .iter()
            .all(|r| path_of(r).starts_with("/public/")),
        "the public backend only ever saw /public/..."
    );

    let refused = [
        "/public/..%2fadmin",
        "/public/..%2Fadmin",
        "/public/..%5cadmin",
        "/public/..\\admin",
        "/public/%zz",
        "/../etc/passwd",
    ];
    let before = public.requests.lock().unwrap().len() + other.requests.lock().unwrap().len();
    for path in refused {
        let h1 = raw_exchange(
            port,
            format!("GET {path} HTTP/1.1\r\nhost: h\r\n\r\n").as_bytes(),
        )
        .await;
        assert!(h1.starts_with("HTTP/1.1 400"), "HTTP/1 {path}: {h1}");
        let (status, _) = h2_get(port, &path.replace('\\', "%5C")).await;
        assert_eq!(status, 400, "HTTP/2 {path}");
    }
    let after = public.requests.lock().unwrap().len() + other.requests.lock().unwrap().len();
    assert_eq!(before, after, "no refused request reached a backend");
}

/// Short limits, so that the timeout tests take milliseconds.
fn short_limits() -> Options {
    Options {
        http2_idle_timeout: Duration::from_millis(300),
        request_body_timeout: Duration::from_millis(300),
        backend_read_timeout: Duration::from_millis(300),
        client_write_timeout: Duration::from_millis(300),
        tunnel_idle_timeout: Duration::from_millis(300),
        ..Options::default()
    }
}

/// A backend that reads one request head, then runs `script` on the connection; the
/// returned receiver gets a message when the gateway closes that connection.
async fn scripted_backend<F, Fut>(
    script: F,
) -> (std::net::SocketAddr, tokio::sync::mpsc::Receiver<()>)
where
    F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = TcpStream> + Send,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (closed_tx, closed_rx) = tokio::sync::mpsc::channel(16);
    let script = std::sync::Arc::new(script);
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let (script, closed) = (script.clone(), closed_tx.clone());
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if stream.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let mut stream = script(stream).await;
                // Wait for the gateway to close its side.
                let mut sink = [0u8; 4096];
                while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
                let _ = closed.send(()).await;
            });
        }
    });
    (addr, closed_rx)
}

async fn gateway_to(
    backend: std::net::SocketAddr,
    options: Options,
) -> (
    u16,
    std::sync::Arc<gatehouse_dataplane::DataPlane>,
    prometheus_client::registry::Registry,
) {
    let port = free_port();
    let cfg = config(
        vec![listener(
            port,
            None,
            vec![rule("r", vec![to_cluster("b")], vec![])],
            vec![prefix("/", 0)],
        )],
        vec![http1("b", vec![backend])],
    );
    let (dp, registry) = dataplane(options).await;
    apply_ok(&dp, &cfg).await;
    (port, dp, registry)
}

/// Finding 2 (high): an HTTP/2 connection that only sent its preface and SETTINGS is closed
/// after the idle timeout (GOAWAY), instead of being held forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http2_connections_are_closed() {
    let backend = raw_backend(|_, _| ok("x")).await;
    let (port, _dp, registry) = gateway_to(backend.addr, short_limits()).await;
    let stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (_sender, conn) = hyper::client::conn::http2::handshake::<_, _, Empty<Bytes>>(
        TokioExecutor::new(),
        TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::time::timeout(Duration::from_secs(3), conn)
        .await
        .expect("the idle connection was closed")
        .expect("closed with a GOAWAY, not an error");
    assert_eq!(
        metric(&registry, r#"gatehouse_timeouts_total{kind="http2_idle"}"#),
        1.0
    );

    // A connection in use is not idle: one long request keeps it open past the timeout.
    let slow = raw_backend(|_, _| {
        std::thread::sleep(Duration::from_millis(600));
        ok("slow")
    })
    .await;
    let (port, _dp2, _) = gateway_to(slow.addr, short_limits()).await;
    let (status, body) = h2_get(port, "/").await;
    assert_eq!((status, body.as_str()), (200, "slow"));
}

/// Finding 3 (medium-high): after the response head, a backend that stalls mid-body, a client
/// that never reads and a client that leaves are all noticed, on both request paths.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalls_after_the_response_head_are_cut_off() {
    // A backend that sends half its body and stalls.
    let (stalling, mut backend_closed) = scripted_backend(|mut s: TcpStream| async move {
        s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\nhalf")
            .await
            .unwrap();
        s
    })
    .await;
    let (port, _dp, registry) = gateway_to(stalling, short_limits()).await;
    // HTTP/1 path: the client gets the head and part of the body, then the close.
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nhost: h\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(3), c.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the client connection was closed");
    assert!(
        String::from_utf8_lossy(&got).ends_with("half"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    tokio::time::timeout(Duration::from_secs(3), backend_closed.recv())
        .await
        .expect("the backend connection was closed too");
    assert_eq!(
        metric(
            &registry,
            r#"gatehouse_timeouts_total{kind="backend_read"}"#
        ),
        1.0
    );
    // HTTP/2 (hyper path): the stream ends with an error rather than hanging.
    let stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let resp = sender
        .send_request(
            Request::get("http://h/")
                .body(Empty::<Bytes>::new())
                .unwrap(),
        )
        .await
        .unwrap();
    let body = tokio::time::timeout(Duration::from_secs(3), resp.into_body().collect()).await;
    assert!(matches!(body, Ok(Err(_))), "the stream was reset: {body:?}");
    tokio::time::timeout(Duration::from_secs(3), backend_closed.recv())
        .await
        .expect("its backend connection was closed");

    // A client that disconnects while the backend is stalled is noticed at once, and the
    // backend connection is released (it used to be held for as long as the backend waited).
    let (silent, mut silent_closed) = scripted_backend(|s: TcpStream| async move { s }).await;
    let (port, _dp3, _) = gateway_to(silent, Options::default()).await;
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nhost: h\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(c);
    tokio::time::timeout(Duration::from_secs(2), silent_closed.recv())
        .await
        .expect("the gateway let go of the backend when the client left");

    // A client that never reads a large body is cut off; the backend connection goes too.
    let (firehose, mut fire_closed) = scripted_backend(|mut s: TcpStream| async move {
        s.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            .await
            .unwrap();
        let chunk = vec![b'x'; 64 * 1024];
        let mut framed = format!("{:x}\r\n", chunk.len()).into_bytes();
        framed.extend_from_slice(&chunk);
        framed.extend_from_slice(b"\r\n");
        // Until the gateway stops taking it.
        while tokio::time::timeout(Duration::from_secs(2), s.write_all(&framed))
            .await
            .is_ok_and(|r| r.is_ok())
        {}
        s
    })
    .await;
    let (port, _dp4, registry4) = gateway_to(firehose, short_limits()).await;
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nhost: h\r\n\r\n")
        .await
        .unwrap();
    // Never read.
    tokio::time::timeout(Duration::from_secs(10), fire_closed.recv())
        .await
        .expect("the gateway closed the backend of a client that does not read");
    assert_eq!(
        metric(
            &registry4,
            r#"gatehouse_timeouts_total{kind="client_write"}"#
        ),
        1.0
    );
    drop(c);
}

/// A client that stops sending its request body mid-way is cut off (408) even when the rule
/// sets no response timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_that_stops_is_cut_off() {
    let backend = raw_backend(|_, _| ok("x")).await;
    let options = Options {
        default_request_timeout: None,
        ..short_limits()
    };
    let (port, _dp, registry) = gateway_to(backend.addr, options).await;
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    c.write_all(b"POST / HTTP/1.1\r\nhost: h\r\ncontent-length: 100\r\n\r\nonly a part")
        .await
        .unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(3), c.read_to_end(&mut got))
        .await
        .expect("closed")
        .unwrap();
    assert!(
        String::from_utf8_lossy(&got).starts_with("HTTP/1.1 408"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    assert_eq!(
        metric(
            &registry,
            r#"gatehouse_timeouts_total{kind="request_body"}"#
        ),
        1.0
    );
}

/// Connections beyond the per-worker limit are closed at once; the established ones are
/// still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_limit_are_shed() {
    let backend = raw_backend(|_, _| ok("x")).await;
    let options = Options {
        max_connections_per_worker: 2,
        ..Options::default()
    };
    let (port, _dp, registry) = gateway_to(backend.addr, options).await;
    let mut kept = Vec::new();
    for _ in 0..2 {
        let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nhost: h\r\n\r\n")
            .await
            .unwrap();
        let mut pending = Vec::new();
        assert!(
            read_response(&mut c, &mut pending, false)
                .await
                .starts_with("HTTP/1.1 200")
        );
        kept.push(c);
    }
    let mut third = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let _ = third.write_all(b"GET / HTTP/1.1\r\nhost: h\r\n\r\n").await;
    assert!(closed(&mut third).await, "the third connection was shed");
    assert_eq!(metric(&registry, "gatehouse_connections_shed_total"), 1.0);
    for c in &mut kept {
        c.write_all(b"GET / HTTP/1.1\r\nhost: h\r\n\r\n")
            .await
            .unwrap();
        let mut pending = Vec::new();
        assert!(
            read_response(c, &mut pending, false)
                .await
                .starts_with("HTTP/1.1 200"),
            "established connections keep being served"
        );
    }
}

/// A gateway whose one rule carries `filters`, to `backend`.
async fn gateway_with_filters(
    backend: std::net::SocketAddr,
    filters: Vec<gatehouse_ir::HttpFilter>,
) -> (u16, std::sync::Arc<gatehouse_dataplane::DataPlane>) {
    let port = free_port();
    let cfg = config(
        vec![listener(
            port,
            None,
            vec![rule("r", vec![to_cluster("b")], filters)],
            vec![prefix("/", 0)],
        )],
        vec![http1("b", vec![backend])],
    );
    let (dp, _) = dataplane(Options::default()).await;
    apply_ok(&dp, &cfg).await;
    (port, dp)
}

fn set_header(name: &str, value: &str) -> gatehouse_ir::HeaderModifier {
    gatehouse_ir::HeaderModifier {
        set: vec![gatehouse_ir::HeaderValue {
            name: name.into(),
            value: value.into(),
        }],
        ..Default::default()
    }
}

/// Finding 4 (medium): `Connection: x-route` no longer removes the header the route's filter
/// adds (hop-by-hop fields go before the filters), on the HTTP/1 path, on hyper's (an
/// absolute-form request is handed over), and for response headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cannot_delete_headers_the_gateway_adds() {
    let backend = raw_backend(|_, _| {
        Some((
            b"HTTP/1.1 200 OK\r\nconnection: x-resp\r\nx-resp: backend\r\ncontent-length: 2\r\n\r\nok"
                .to_vec(),
            false,
        ))
    })
    .await;
    let (port, _dp) = gateway_with_filters(
        backend.addr,
        vec![
            gatehouse_ir::HttpFilter::RequestHeaders(set_header("x-route", "gateway")),
            gatehouse_ir::HttpFilter::ResponseHeaders(set_header("x-resp", "gateway")),
        ],
    )
    .await;
    for target in ["/", "http://h/"] {
        let answer = raw_exchange(
            port,
            format!(
                "GET {target} HTTP/1.1\r\nhost: h\r\nconnection: x-route\r\nx-route: client\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .to_ascii_lowercase();
        let seen = String::from_utf8_lossy(backend.requests.lock().unwrap().last().unwrap())
            .to_ascii_lowercase();
        assert!(
            seen.contains("x-route: gateway\r\n"),
            "{target}: the backend gets the filter's header: {seen}"
        );
        assert!(!seen.contains("x-route: client"), "{target}: {seen}");
        assert!(
            answer.contains("x-resp: gateway\r\n"),
            "{target}: the client gets the response filter's header: {answer}"
        );
    }
}

/// Finding 5 (medium): a rewrite path with CR/LF or a space, in an IR that did not come
/// through translate (which refuses it), is contained: the rule answers 500 and nothing
/// reaches the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewrite_paths_cannot_inject_into_the_request_line() {
    let backend = raw_backend(|_, _| ok("x")).await;
    for bad in ["/x HTTP/1.1\r\nx-injected: 1\r\n\r\nGET /admin", "/a b"] {
        let (port, dp) = gateway_with_filters(
            backend.addr,
            vec![gatehouse_ir::HttpFilter::UrlRewrite(
                gatehouse_ir::UrlRewrite {
                    hostname: None,
                    path: Some(gatehouse_ir::PathModifier::ReplaceFullPath(bad.into())),
                },
            )],
        )
        .await;
        let answer = raw_exchange(
            port,
            b"GET / HTTP/1.1\r\nhost: h\r\nconnection: close\r\n\r\n",
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 500"), "{bad:?}: {answer}");
        dp.shutdown(Duration::from_millis(100)).await;
    }
    assert!(
        backend.requests.lock().unwrap().is_empty(),
        "nothing reached the backend"
    );
}

/// Finding 6 (low-medium): requests the HTTP/1 path hands to hyper (absolute-form here) are
/// held to the same rules, and so is every later request of that connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_over_connection_keeps_the_strict_rules() {
    let backend = raw_backend(|_, _| ok("x")).await;
    let (port, _dp) = proxy_to(backend.addr).await;
    let cases: [(&str, &str); 4] = [
        ("host: a\r\nhost: b\r\n", "400"),
        ("", "400"),
        ("host: h\r\ntransfer-encoding: gzip, chunked\r\n", "501"),
        ("host: user@h\r\n", "400"),
    ];
    for (fields, status) in cases {
        for first in [
            "GET http://h/ HTTP/1.1\r\nhost: h\r\n\r\n",
            "OPTIONS * HTTP/1.1\r\nhost: h\r\n\r\n",
        ] {
            let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            c.write_all(first.as_bytes()).await.unwrap();
            let mut pending = Vec::new();
            let _ = read_response(&mut c, &mut pending, false).await;
            c.write_all(format!("GET http://h/ HTTP/1.1\r\n{fields}\r\n").as_bytes())
                .await
                .unwrap();
            let answer = read_response(&mut c, &mut pending, false).await;
            assert!(
                answer.starts_with(&format!("HTTP/1.1 {status}")),
                "after {first:?}, {fields:?}: {answer}"
            );
        }
    }
}

/// Finding 7 (low): a bare LF after the last chunk does not swallow the next pipelined
/// request; userinfo in Host is refused; `Upgrade: h2c` is not forwarded and opens no tunnel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn low_findings() {
    let backend = raw_backend(|_, _| ok("x")).await;
    let (port, _dp) = proxy_to(backend.addr).await;
    let answer = raw_exchange(
        port,
        b"POST / HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\nGET /smuggled HTTP/1.1\r\nhost: h\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(
        backend
            .requests
            .lock()
            .unwrap()
            .iter()
            .all(|r| !path_of(r).contains("smuggled")),
        "the pipelined request was not smuggled in as a trailer"
    );
    let answer = raw_exchange(port, b"GET / HTTP/1.1\r\nhost: user@h\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    let (status, _) = h2_get(port, "/").await;
    assert_eq!(status, 200);
    let before = backend.requests.lock().unwrap().len();
    let answer = raw_exchange(
        port,
        b"GET / HTTP/1.1\r\nhost: h\r\nconnection: upgrade, close\r\nupgrade: h2c\r\nhttp2-settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n",
    )
    .await;
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "an ordinary response: {answer}"
    );
    let seen =
        String::from_utf8_lossy(&backend.requests.lock().unwrap()[before]).to_ascii_lowercase();
    assert!(!seen.contains("upgrade"), "no upgrade forwarded: {seen}");
}

/// An upgraded tunnel with nothing moving is closed after the tunnel idle limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_tunnels_are_closed() {
    let (backend, mut backend_closed) = scripted_backend(|mut s: TcpStream| async move {
        s.write_all(b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n").await.unwrap();
        s
    })
    .await;
    let (port, _dp, registry) = gateway_to(backend, short_limits()).await;
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    c.write_all(
        b"GET /ws HTTP/1.1\r\nhost: h\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n",
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(3), c.read_to_end(&mut got))
        .await
        .expect("the idle tunnel was closed")
        .unwrap();
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 101"));
    tokio::time::timeout(Duration::from_secs(3), backend_closed.recv())
        .await
        .expect("both sides");
    assert_eq!(
        metric(&registry, r#"gatehouse_timeouts_total{kind="tunnel_idle"}"#),
        1.0
    );
}

/// A GET, or a POST with a body, over HTTP/2: the status.
async fn h2_status(port: u16, path: &str, body: Option<&'static str>) -> u16 {
    let stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    // Room for the 20 kB response head (hyper's client default is 16 KiB).
    let (mut sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .max_header_list_size(64 * 1024)
        .handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = match body {
        None => Request::get(format!("http://h{path}")),
        Some(_) => Request::post(format!("http://h{path}")),
    }
    .body(http_body_util::Full::new(Bytes::from(body.unwrap_or(""))))
    .unwrap();
    sender.send_request(req).await.unwrap().status().as_u16()
}

/// Both head size limits hold on every path: a request head over `max_header_bytes` gets 431,
/// a response head over `max_response_head_bytes` a 502 (the HTTP/1 path, the hyper path's
/// pooled client for bodiless requests and hyper's client for requests with bodies), and a
/// response head under the limit but over the HTTP/1 path's initial buffer is served. Every
/// refusal is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_over_their_limits_are_refused_and_counted() {
    let backend = raw_backend(|_, request| {
        let size = if path_of(request) == "/big" {
            40_000
        } else {
            20_000
        };
        Some((
            format!(
                "HTTP/1.1 200 OK\r\nx-big: {}\r\ncontent-length: 2\r\n\r\nok",
                "a".repeat(size)
            )
            .into_bytes(),
            false,
        ))
    })
    .await;
    let options = Options {
        max_header_bytes: 16 * 1024,
        max_response_head_bytes: 32 * 1024,
        ..Options::default()
    };
    let (port, _dp, registry) = gateway_to(backend.addr, options).await;

    // The HTTP/1 path: 20 kB fits (its buffer grows past the initial 16 KiB), 40 kB does not.
    let fits = raw_exchange(port, b"GET /fits HTTP/1.1\r\nhost: h\r\n\r\n").await;
    assert!(fits.starts_with("HTTP/1.1 200"), "{}", &fits[..40]);
    let big = raw_exchange(port, b"GET /big HTTP/1.1\r\nhost: h\r\n\r\n").await;
    assert!(big.starts_with("HTTP/1.1 502"), "{big}");
    assert!(big.contains("response head too large"), "{big}");
    // The hyper path, without and with a request body.
    assert_eq!(h2_status(port, "/fits", None).await, 200);
    assert_eq!(h2_status(port, "/big", None).await, 502);
    assert_eq!(h2_status(port, "/fits", Some("body")).await, 200);
    assert_eq!(h2_status(port, "/big", Some("body")).await, 502);
    assert_eq!(
        metric(
            &registry,
            r#"gatehouse_heads_too_large_total{side="response"}"#
        ),
        3.0
    );

    // A request head over the limit: 431 on the HTTP/1 path.
    let request = format!(
        "GET / HTTP/1.1\r\nhost: h\r\nx-big: {}\r\n\r\n",
        "a".repeat(20_000)
    );
    let refused = raw_exchange(port, request.as_bytes()).await;
    assert!(refused.starts_with("HTTP/1.1 431"), "{refused}");
    assert_eq!(
        metric(
            &registry,
            r#"gatehouse_heads_too_large_total{side="request"}"#
        ),
        1.0
    );
}

/// A cleartext connection whose first line names no HTTP version is not HTTP/1 (here, an
/// invalid HTTP/2 preface): closed without an HTTP/1 answer (h2spec 3.5/2). A request line with
/// a bad target but an HTTP version still gets its 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_not_speaking_http1_is_closed_without_an_answer() {
    let backend = raw_backend(|_, _| ok("x")).await;
    let (port, _dp, _) = gateway_to(backend.addr, Options::default()).await;
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    c.write_all(b"INVALID CONNECTION PREFACE\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut answer))
        .await
        .expect("closed")
        .unwrap();
    assert!(answer.is_empty(), "{:?}", String::from_utf8_lossy(&answer));

    let bad_target = raw_exchange(port, b"GET /a b HTTP/1.1\r\nhost: h\r\n\r\n").await;
    assert!(bad_target.starts_with("HTTP/1.1 400"), "{bad_target}");
    assert!(backend.requests.lock().unwrap().is_empty());
}

/// Found by fuzzing (fuzz/fuzz_targets/h1_response.rs): a backend whose status line has no
/// reason phrase (`HTTP/1.1 200`, allowed by RFC 9112) broke the HTTP/1 path's connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_line_without_reason_phrase_is_proxied() {
    let backend = raw_backend(|_, _| {
        Some((
            b"HTTP/1.1 200\r\ncontent-length: 2\r\n\r\nok".to_vec(),
            false,
        ))
    })
    .await;
    let (port, _dp, _) = gateway_to(backend.addr, Options::default()).await;
    let answer = raw_exchange(port, b"GET / HTTP/1.1\r\nhost: h\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("ok"), "{answer}");
    assert_eq!(h2_status(port, "/", None).await, 200);
}
