//! A backend endpoint that refuses connections (a pod that is gone or going): requests that
//! picked it go to another endpoint instead of failing, and the endpoint is ejected so that
//! later requests stop trying it. On the HTTP/1 path (with and without a body) and hyper's
//! (HTTP/2 clients).

mod common;

use bytes::Bytes;
use common::raw::*;
use common::*;
use gatehouse_dataplane::Options;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::net::SocketAddr;
use tokio::net::TcpStream;

/// An address nothing listens on: bound once to get a free port, then closed.
fn refusing_address() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_endpoint_costs_no_request_and_is_ejected() {
    let live = raw_backend(|_, _| ok("live")).await;
    let dead = refusing_address();
    // The dead endpoint first, twice: round-robin picks it often.
    let (port, _dp, registry) =
        proxy_to_endpoints(vec![dead, live.addr, dead], Options::default()).await;
    let failures = || {
        metric(
            &registry,
            r#"gatehouse_upstream_connect_failures_total{cluster="b"}"#,
        )
    };

    // The HTTP/1 path, a new connection per request, bodiless and with a body.
    for i in 0..30 {
        let request: &[u8] = if i % 2 == 0 {
            b"GET / HTTP/1.1\r\nhost: h\r\n\r\n"
        } else {
            b"POST / HTTP/1.1\r\nhost: h\r\ncontent-length: 4\r\n\r\nbody"
        };
        let response = exchange_once(port, request).await;
        assert!(
            response.starts_with("HTTP/1.1 200"),
            "request {i}: {response}"
        );
    }
    let retries = metric(
        &registry,
        r#"gatehouse_upstream_retries_total{cluster="b"}"#,
    );
    assert!(
        retries >= 1.0,
        "requests that picked the dead endpoint were retried"
    );
    assert!(
        metric(
            &registry,
            r#"gatehouse_upstream_ejections_total{cluster="b"}"#
        ) >= 1.0,
        "the dead endpoint was ejected"
    );
    // Once ejected (after two failures) it is skipped: the 30 requests, about 20 of which
    // picked it first, cost a couple of failed connects, not 20.
    let after_http1 = failures();
    assert!(after_http1 <= 3.0, "{after_http1} connect failures");

    // hyper's path (HTTP/2 client, bodiless and with a body): the endpoint is still ejected.
    let stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    for i in 0..20 {
        let req = if i % 2 == 0 {
            Request::get("http://h/").body(Full::new(Bytes::new()))
        } else {
            Request::post("http://h/").body(Full::new(Bytes::from_static(b"body")))
        }
        .unwrap();
        let resp = sender.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200, "h2 request {i}");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"live");
    }
    assert_eq!(
        failures(),
        after_http1,
        "no connect to the ejected endpoint"
    );
    assert_eq!(live.requests.lock().unwrap().len(), 50);
}

/// Every endpoint refusing: ejection cannot help, the client gets a clean 502 (not a hang),
/// after the allowed retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_endpoint_refuses_the_answer_is_502() {
    let (port, _dp, _) = proxy_to_endpoints(
        vec![refusing_address(), refusing_address()],
        Options::default(),
    )
    .await;
    for _ in 0..5 {
        let response = exchange_once(port, b"GET / HTTP/1.1\r\nhost: h\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 502"), "{response}");
    }
}

/// A backend killed between two requests of a kept-alive upstream connection: it answers
/// one request, stops listening, and closes the connection unanswered when the next request
/// arrives on it. Returns its address and how many requests reached it.
async fn dies_after_one_answer() -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = seen.clone();
    tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 4096];
        let mut got = Vec::new();
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = conn.read(&mut buf).await.unwrap();
            assert!(n > 0, "the gateway closed before its first request");
            got.extend_from_slice(&buf[..n]);
        }
        counter.fetch_add(1, Ordering::SeqCst);
        conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\ndying")
            .await
            .unwrap();
        drop(listener); // new connections are refused from now on
        if conn.read(&mut buf).await.is_ok_and(|n| n > 0) {
            counter.fetch_add(1, Ordering::SeqCst);
        }
        // Dropped unanswered.
    });
    (addr, seen)
}

/// The kept-alive connection to a backend that died is closed under the next request: that
/// request (idempotent, no body) goes on a new connection, and since the dead endpoint also
/// refuses connections, to another endpoint: the client sees only 200s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_dying_under_a_kept_alive_connection_costs_no_request() {
    let live = raw_backend(|_, _| ok("live")).await;
    let (dying, seen) = dies_after_one_answer().await;
    let (port, dp, registry) = proxy_to_endpoints(vec![dying, live.addr], Options::default()).await;

    // The HTTP/1 path, one client connection kept alive.
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut pending = Vec::new();
    let mut bodies = Vec::new();
    for i in 0..10 {
        tokio::io::AsyncWriteExt::write_all(&mut c, b"GET / HTTP/1.1\r\nhost: h\r\n\r\n")
            .await
            .unwrap();
        let response = read_response(&mut c, &mut pending, false).await;
        assert!(
            response.starts_with("HTTP/1.1 200"),
            "request {i}: {response}"
        );
        bodies.push(if response.ends_with("dying") {
            "dying"
        } else {
            "live"
        });
    }
    assert_eq!(
        bodies.iter().filter(|b| **b == "dying").count(),
        1,
        "{bodies:?}"
    );
    assert_eq!(
        seen.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "a second request was sent on the dead backend's kept-alive connection"
    );
    assert!(
        metric(
            &registry,
            r#"gatehouse_upstream_retries_total{cluster="b"}"#
        ) >= 1.0,
        "the request went to the other endpoint as a retry"
    );

    // hyper's path (HTTP/2 client), with a second backend that dies the same way.
    let (dying2, seen2) = dies_after_one_answer().await;
    let port2 = free_port();
    apply_ok(&dp, &all_to(port2, vec![dying2, live.addr])).await;
    let stream = TcpStream::connect(("127.0.0.1", port2)).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    for i in 0..10 {
        let req = Request::get("http://h/")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = sender.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200, "h2 request {i}");
    }
    assert_eq!(seen2.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// A connect that hangs does not hold the request for the connect timeout: after a short
/// wait another endpoint is tried alongside, and the dark endpoint is soon ejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dark_endpoint_delays_a_request_briefly_and_is_ejected() {
    let live = raw_backend(|_, _| ok("live")).await;
    let (dark, _fillers, _listener) = dark_address();
    // A connect timeout no request could sit out here: what the client sees below is the
    // hedge, not the timeout.
    let options = Options {
        connect_timeout: std::time::Duration::from_secs(60),
        ..Options::default()
    };
    let (port, _dp, registry) = proxy_to_endpoints(vec![dark, live.addr], options).await;
    let started = std::time::Instant::now();
    for i in 0..10 {
        let response = exchange_once(port, b"GET / HTTP/1.1\r\nhost: h\r\n\r\n").await;
        assert!(
            response.starts_with("HTTP/1.1 200"),
            "request {i}: {response}"
        );
    }
    let took = started.elapsed();
    assert!(
        took < std::time::Duration::from_secs(20),
        "10 requests took {took:?}: some waited for the connect timeout"
    );
    assert!(
        metric(
            &registry,
            r#"gatehouse_upstream_ejections_total{cluster="b"}"#
        ) >= 1.0,
        "the dark endpoint was ejected"
    );
    assert_eq!(live.requests.lock().unwrap().len(), 10);
}
