//! The HTTP/1 path end to end with scripted backends that speak raw bytes, so that framing,
//! connection reuse and odd-but-legal backend behaviour can be set up exactly: HTTP/1.0
//! clients, pipelining, chunked bodies both ways, close-delimited responses, interim
//! responses, responses without a body, and kept-alive connections the backend closed.

mod common;

use common::raw::*;
use common::*;
use gatehouse_dataplane::Options;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_alive_client_reuses_one_upstream_connection_and_pipelines_in_order() {
    let be = raw_backend(|_, req| ok(&path_of(req))).await;
    let (port, dp) = proxy_to(be.addr).await;
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut pending = Vec::new();
    for i in 0..10 {
        c.write_all(format!("GET /seq/{i} HTTP/1.1\r\nHost: h\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let resp = read_response(&mut c, &mut pending, false).await;
        assert!(resp.starts_with("HTTP/1.1 200 OK\r\n"), "{resp}");
        assert!(resp.ends_with(&format!("/seq/{i}")), "{resp}");
    }
    // Three requests in one write: three answers, in order.
    c.write_all(
        b"GET /p/1 HTTP/1.1\r\nHost: h\r\n\r\nGET /p/2 HTTP/1.1\r\nHost: h\r\n\r\nGET /p/3 HTTP/1.1\r\nHost: h\r\n\r\n",
    )
    .await
    .unwrap();
    for i in 1..=3 {
        let resp = read_response(&mut c, &mut pending, false).await;
        assert!(resp.ends_with(&format!("/p/{i}")), "{resp}");
    }
    assert_eq!(
        be.connections.load(Ordering::SeqCst),
        1,
        "sequential requests share one kept-alive upstream connection"
    );
    let first = String::from_utf8(be.requests.lock().unwrap()[0].clone()).unwrap();
    assert!(
        first.starts_with("GET /seq/0 HTTP/1.1\r\nhost: h\r\n"),
        "{first}"
    );
    assert!(first.contains("x-forwarded-for: 127.0.0.1\r\n"), "{first}");
    assert!(first.contains("x-forwarded-proto: http\r\n"), "{first}");
    dp.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http10_clients_get_lengths_or_a_close() {
    let be = raw_backend(|_, req| {
        if path_of(req) == "/chunked" {
            Some((
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n".to_vec(),
                false,
            ))
        } else {
            ok("fixed")
        }
    })
    .await;
    let (port, dp) = proxy_to(be.addr).await;

    // No keep-alive asked: answer, then close.
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    c.write_all(b"GET / HTTP/1.0\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    let mut all = String::new();
    c.read_to_string(&mut all).await.unwrap();
    assert!(all.starts_with("HTTP/1.1 200 OK\r\n"), "{all}");
    assert!(
        all.contains("connection: close\r\n") && all.ends_with("fixed"),
        "{all}"
    );

    // Keep-alive asked: a length and keep-alive, then a second request on the same connection.
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut pending = Vec::new();
    c.write_all(b"GET / HTTP/1.0\r\nHost: h\r\nConnection: keep-alive\r\n\r\n")
        .await
        .unwrap();
    let resp = read_response(&mut c, &mut pending, false).await;
    assert!(
        resp.contains("connection: keep-alive\r\n") && resp.contains("content-length: 5\r\n"),
        "{resp}"
    );
    // A chunked backend response has no length an HTTP/1.0 client understands: the body is
    // sent as is and the connection closes.
    c.write_all(b"GET /chunked HTTP/1.0\r\nHost: h\r\nConnection: keep-alive\r\n\r\n")
        .await
        .unwrap();
    let mut rest = String::new();
    c.read_to_string(&mut rest).await.unwrap();
    assert!(!rest.contains("transfer-encoding"), "{rest}");
    assert!(
        rest.contains("connection: close\r\n") && rest.ends_with("\r\n\r\nhello world"),
        "{rest}"
    );
    dp.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_bodies_are_reframed_both_ways() {
    let be = raw_backend(|_, req| {
        let text = String::from_utf8_lossy(req).into_owned();
        if text.starts_with("POST /eof") {
            // A response delimited by the close of the connection.
            Some((b"HTTP/1.1 200 OK\r\n\r\nuntil-close".to_vec(), true))
        } else {
            ok("got it")
        }
    })
    .await;
    let (port, dp) = proxy_to(be.addr).await;
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut pending = Vec::new();
    // Extensions, odd size case and a trailer: the backend gets plain chunks, no trailer.
    c.write_all(b"POST /up HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\nA\r\n0123456789\r\n0\r\nX-Trailer: t\r\n\r\n")
        .await
        .unwrap();
    let resp = read_response(&mut c, &mut pending, false).await;
    assert!(resp.ends_with("got it"), "{resp}");
    let seen = String::from_utf8(be.requests.lock().unwrap()[0].clone()).unwrap();
    assert!(seen.contains("transfer-encoding: chunked\r\n"), "{seen}");
    assert!(
        seen.ends_with("\r\n\r\n5\r\nhello\r\na\r\n0123456789\r\n0\r\n\r\n"),
        "{seen:?}"
    );
    assert!(
        !seen.contains("ext=1") && !seen.contains("X-Trailer"),
        "{seen:?}"
    );

    // A close-delimited response reaches an HTTP/1.1 client chunked, and the client
    // connection stays usable.
    c.write_all(b"POST /eof HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n")
        .await
        .unwrap();
    let resp = read_response(&mut c, &mut pending, false).await;
    assert!(resp.contains("transfer-encoding: chunked\r\n"), "{resp}");
    assert!(
        resp.ends_with("\r\n\r\nb\r\nuntil-close\r\n0\r\n\r\n"),
        "{resp:?}"
    );
    c.write_all(b"GET /again HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    assert!(
        read_response(&mut c, &mut pending, false)
            .await
            .ends_with("got it")
    );

    // Broken chunk framing: 400 and close.
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    c.write_all(b"POST /bad HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
        .await
        .unwrap();
    let mut all = String::new();
    let _ = c.read_to_string(&mut all).await;
    assert!(all.starts_with("HTTP/1.1 400 "), "{all}");
    dp.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_kept_alive_connection_is_retried_only_when_safe() {
    // The backend answers the first request of each connection and closes the connection
    // when a second one arrives, as if its keep-alive timeout had just fired.
    let be = raw_backend(|i, req| if i == 0 { ok(&path_of(req)) } else { None }).await;
    let (port, dp) = proxy_to(be.addr).await;
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut pending = Vec::new();
    for i in 0..5 {
        c.write_all(format!("GET /g{i} HTTP/1.1\r\nHost: h\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let resp = read_response(&mut c, &mut pending, false).await;
        assert!(
            resp.starts_with("HTTP/1.1 200 ") && resp.ends_with(&format!("/g{i}")),
            "{resp}"
        );
    }
    // A POST with a body is not sent twice: the client gets a 502.
    c.write_all(b"POST /once HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\nhi")
        .await
        .unwrap();
    let resp = read_response(&mut c, &mut pending, false).await;
    assert!(resp.starts_with("HTTP/1.1 502 "), "{resp}");
    let posts = be
        .requests
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.starts_with(b"POST"))
        .count();
    assert_eq!(posts, 1);
    dp.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interim_responses_and_bodiless_answers() {
    let be = raw_backend(|_, req| {
        let text = String::from_utf8_lossy(req).into_owned();
        let path = path_of(req);
        Some(match path.as_str() {
            "/continue" => {
                let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
                let answer = format!(
                    "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len(),
                );
                (answer.into_bytes(), false)
            }
            "/empty" => (b"HTTP/1.1 204 No Content\r\n\r\n".to_vec(), false),
            "/cached" => (b"HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n".to_vec(), false),
            _ => (b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n".to_vec(), false),
        })
    })
    .await;
    let (port, dp) = proxy_to(be.addr).await;
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut pending = Vec::new();

    // HEAD: the length of the GET, no body, and the connection goes on.
    c.write_all(b"HEAD /x HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    let resp = read_response(&mut c, &mut pending, true).await;
    // Field names keep the backend's case.
    assert!(
        resp.contains("Content-Length: 11\r\n") && resp.ends_with("\r\n\r\n"),
        "{resp}"
    );
    c.write_all(b"GET /empty HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    let resp = read_response(&mut c, &mut pending, false).await;
    assert!(resp.starts_with("HTTP/1.1 204 No Content\r\n"), "{resp}");
    assert!(
        !resp.to_ascii_lowercase().contains("content-length")
            && !resp.contains("transfer-encoding"),
        "{resp}"
    );
    c.write_all(b"GET /cached HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    let resp = read_response(&mut c, &mut pending, false).await;
    assert!(
        resp.starts_with("HTTP/1.1 304 ") && resp.contains("ETag: \"x\""),
        "{resp}"
    );

    // Expect: 100-continue: the backend's 100 reaches the client before the final answer.
    c.write_all(b"POST /continue HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\nbody")
        .await
        .unwrap();
    let interim = read_response(&mut c, &mut pending, false).await;
    assert_eq!(interim, "HTTP/1.1 100 Continue\r\n\r\n");
    let resp = read_response(&mut c, &mut pending, false).await;
    assert!(
        resp.starts_with("HTTP/1.1 200 OK\r\n") && resp.ends_with("body"),
        "{resp}"
    );
    let seen = String::from_utf8(be.requests.lock().unwrap().last().unwrap().clone()).unwrap();
    assert!(seen.contains("expect: 100-continue\r\n"), "{seen}");
    dp.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_connections_close_quietly() {
    let be = raw_backend(|_, _| ok("x")).await;
    let port = free_port();
    let cfg = config(
        vec![listener(
            port,
            None,
            vec![rule("r", vec![to_cluster("b")], vec![])],
            vec![prefix("/", 0)],
        )],
        vec![http1("b", vec![be.addr])],
    );
    let (dp, _) = dataplane(Options {
        header_read_timeout: Duration::from_millis(300),
        ..Options::default()
    })
    .await;
    apply_ok(&dp, &cfg).await;
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut pending = Vec::new();
    c.write_all(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    assert!(
        read_response(&mut c, &mut pending, false)
            .await
            .ends_with("x")
    );
    // Nothing more is sent: the connection is closed after the idle limit, without a 408.
    let started = std::time::Instant::now();
    assert!(closed(&mut c).await);
    assert!(started.elapsed() < Duration::from_secs(3));
    dp.shutdown(Duration::from_secs(1)).await;
}

/// An HTTP/2 connection to the proxy, and `GET`/`HEAD`/`POST` requests over it.
async fn h2_client(
    port: u16,
) -> hyper::client::conn::http2::SendRequest<http_body_util::Full<bytes::Bytes>> {
    let stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    sender
}

async fn h2_send(
    sender: &mut hyper::client::conn::http2::SendRequest<http_body_util::Full<bytes::Bytes>>,
    method: &str,
    path: &str,
    body: &'static str,
) -> (u16, http::HeaderMap, String) {
    use http_body_util::BodyExt;
    let req = http::Request::builder()
        .method(method)
        .uri(format!("http://h{path}"))
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            body.as_bytes(),
        )))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_clients_use_the_pooled_http1_connections() {
    // The backend closes a connection when its third request arrives (a keep-alive limit),
    // answers chunked on /chunked and echoes request bodies on POST.
    let be = raw_backend(|i, req| {
        if i == 2 {
            return None;
        }
        let text = String::from_utf8_lossy(req).into_owned();
        if text.starts_with("POST") {
            let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
            return ok(&format!("posted {body}"));
        }
        if path_of(req) == "/chunked" {
            return Some((
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n".to_vec(),
                false,
            ));
        }
        ok(&path_of(req))
    })
    .await;
    let (port, dp) = proxy_to(be.addr).await;
    let mut h2 = h2_client(port).await;
    for i in 0..12 {
        let (status, _, body) = h2_send(&mut h2, "GET", &format!("/n{i}"), "").await;
        assert_eq!((status, body.as_str()), (200, format!("/n{i}").as_str()));
    }
    // Two requests per backend connection, the third retried on a new one: 12 requests take
    // 6 connections, and no request failed.
    assert_eq!(be.connections.load(Ordering::SeqCst), 6);
    let (status, headers, body) = h2_send(&mut h2, "HEAD", "/head", "").await;
    assert_eq!((status, body.as_str()), (200, ""));
    assert_eq!(headers["content-length"], "5");
    let (_, _, body) = h2_send(&mut h2, "GET", "/chunked", "").await;
    assert_eq!(body, "abcdef");
    // A request body takes hyper's client; the answer is the same.
    let (status, _, body) = h2_send(&mut h2, "POST", "/p", "hello").await;
    assert_eq!((status, body.as_str()), (200, "posted hello"));
    let seen = String::from_utf8(be.requests.lock().unwrap()[0].clone()).unwrap();
    assert!(seen.starts_with("GET /n0 HTTP/1.1\r\n"), "{seen}");
    assert!(seen.contains("\r\nhost: h\r\n"), "{seen}");
    assert!(seen.contains("\r\nx-forwarded-proto: http\r\n"), "{seen}");
    dp.shutdown(Duration::from_secs(1)).await;
}
