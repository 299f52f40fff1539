//! End to end over real sockets: HTTPRoute rule retries. Backends that fail on purpose (a
//! status for the first N requests of a key, or a slow first answer), a gateway whose rules
//! retry some codes, and checks of what the client gets, what each backend saw, how long it
//! took, and the retry counters.

mod support;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Requests a [`flaky`] backend saw, by key: the body length of each.
type Seen = Arc<Mutex<HashMap<String, Vec<usize>>>>;

/// A backend named `name` that fails on purpose. The query says how: `key` (required, counts
/// attempts), `fail=N` (the first N requests of the key fail), `code` (the failing status,
/// default 500), `delay` (ms before a failing answer). It answers `200 <name>` otherwise.
/// With `always`, every request fails with that status.
async fn flaky(name: &'static str, always: Option<u16>) -> (SocketAddr, Seen) {
    flaky_at("127.0.0.1:0".parse().unwrap(), name, always).await
}

/// [`flaky`] on `addr` (endpoints of one Service share a port: they differ by address).
async fn flaky_at(addr: SocketAddr, name: &'static str, always: Option<u16>) -> (SocketAddr, Seen) {
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: http::Request<Incoming>| {
                    let log = log.clone();
                    async move { Ok::<_, Infallible>(answer(name, always, &log, req).await) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    (addr, seen)
}

async fn answer(
    name: &'static str,
    always: Option<u16>,
    log: &Seen,
    req: http::Request<Incoming>,
) -> http::Response<http_body_util::Full<Bytes>> {
    let query: HashMap<String, String> = req
        .uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let key = query.get("key").cloned().unwrap_or_default();
    let attempt = {
        let mut log = log.lock().unwrap();
        let attempts = log.entry(key).or_default();
        attempts.push(body.len());
        attempts.len()
    };
    let fail = always.is_some()
        || query
            .get("fail")
            .is_some_and(|n| attempt <= n.parse().unwrap());
    let mut resp = http::Response::new(http_body_util::Full::new(Bytes::from(name)));
    if fail {
        if let Some(ms) = query.get("delay") {
            tokio::time::sleep(Duration::from_millis(ms.parse().unwrap())).await;
        }
        let code = always.unwrap_or_else(|| query.get("code").map_or(500, |c| c.parse().unwrap()));
        *resp.status_mut() = http::StatusCode::from_u16(code).unwrap();
    }
    resp
}

fn attempts(seen: &Seen, key: &str) -> Vec<usize> {
    seen.lock().unwrap().get(key).cloned().unwrap_or_default()
}

fn retries_metric(cluster: &str, reason: &str) -> String {
    format!("gatehouse_route_retries_total{{cluster=\"default/{cluster}:80\",reason=\"{reason}\"}}")
}

/// A chunked HTTP/1.1 POST (a body of unknown length) over a raw socket; the status code.
async fn chunked_post(port: u16, path: &str) -> u16 {
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {HOST}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    );
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    tcp.read_to_end(&mut response).await.unwrap();
    let text = String::from_utf8_lossy(&response);
    text.split(' ').nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_follow_the_codes_attempts_and_body_rules() {
    let (flaky_addr, seen) = flaky("flaky", None).await;
    let port = free_port();
    let routes = route(
        "retries",
        r#"  hostnames: [cafe.example.com]
  rules:
  - matches: [{path: {value: /codes}}]
    retry: {codes: [500, 503], attempts: 2, backoff: 10ms}
    backendRefs: [{name: flaky, port: 80}]
  - matches: [{path: {value: /off}}]
    retry: {codes: [500], attempts: 0}
    backendRefs: [{name: flaky, port: 80}]"#,
    );
    let gw = Gateway::start(&[
        ("gateway.yaml", gateway(&[("http", port)])),
        ("services.yaml", service("flaky", &[flaky_addr], None)),
        ("routes.yaml", routes),
    ])
    .await;
    let c = client();
    let h2 = builder().http2_prior_knowledge().build().unwrap();
    let get = |client: &reqwest::Client, query: String| {
        let request = client.get(url(port, &format!("/codes?{query}")));
        async move { request.send().await.unwrap().status().as_u16() }
    };

    // Two failures and two retries: the third attempt answers. Over HTTP/1 and HTTP/2.
    assert_eq!(get(&c, "key=a&fail=2&code=503".into()).await, 200);
    assert_eq!(attempts(&seen, "a").len(), 3);
    assert_eq!(get(&h2, "key=a2&fail=2&code=500".into()).await, 200);
    assert_eq!(attempts(&seen, "a2").len(), 3);
    // One failure more than the attempts: the client gets the last failure.
    assert_eq!(get(&c, "key=b&fail=3&code=503".into()).await, 503);
    assert_eq!(attempts(&seen, "b").len(), 3);
    // A status not listed is not retried.
    assert_eq!(get(&c, "key=c&fail=1&code=502".into()).await, 502);
    assert_eq!(attempts(&seen, "c").len(), 1);
    // `attempts: 0` disables retries.
    let off = c.get(url(port, "/off?key=d&fail=1")).send().await.unwrap();
    assert_eq!(off.status(), 500);
    assert_eq!(attempts(&seen, "d").len(), 1);

    // A short body is kept and sent whole with every attempt, over HTTP/1 and HTTP/2.
    for (client, key) in [(&c, "e"), (&h2, "e2")] {
        let body = vec![b'x'; 1000];
        let resp = client
            .post(url(port, &format!("/codes?key={key}&fail=1")))
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{key}");
        assert_eq!(attempts(&seen, key), [1000, 1000], "{key}");
    }
    // A body over 64 KiB, and one of unknown length, go out once, streamed.
    let resp = c
        .post(url(port, "/codes?key=f&fail=1"))
        .body(vec![b'y'; 64 * 1024 + 1])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 500);
    assert_eq!(attempts(&seen, "f"), [64 * 1024 + 1]);
    assert_eq!(chunked_post(port, "/codes?key=g&fail=1").await, 500);
    assert_eq!(attempts(&seen, "g"), [5]);
    // Exactly 64 KiB is still kept.
    let resp = c
        .post(url(port, "/codes?key=h&fail=1"))
        .body(vec![b'z'; 64 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(attempts(&seen, "h"), [64 * 1024, 64 * 1024]);

    // 2 + 2 + 2 (a, a2, b) + 1 (e) + 1 (e2) + 1 (h) status retries.
    assert_eq!(
        metric(gw.admin(), &retries_metric("flaky", "status")).await,
        9
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_go_to_another_endpoint_and_past_dead_ones() {
    // One port, three loopback addresses: a Service's endpoints share the target port.
    let shared = free_port();
    let at = |ip: &str| format!("{ip}:{shared}").parse::<SocketAddr>().unwrap();
    let (bad, bad_seen) = flaky_at(at("127.0.0.2"), "bad", Some(503)).await;
    let (good, _) = flaky_at(at("127.0.0.3"), "good", None).await;
    let dead = at("127.0.0.4");
    let port = free_port();
    let restarting = at("127.0.0.5");
    let mut services = service("mixed", &[bad, good], None);
    services.push_str(&service("halfdead", &[dead, good], None));
    services.push_str(&service("restarting", &[restarting], None));
    let routes = route(
        "spread",
        r#"  hostnames: [cafe.example.com]
  rules:
  - matches: [{path: {value: /mixed}}]
    retry: {codes: [503], attempts: 1, backoff: 1ms}
    backendRefs: [{name: mixed, port: 80}]
  - matches: [{path: {value: /halfdead}}]
    retry: {attempts: 3}
    backendRefs: [{name: halfdead, port: 80}]
  - matches: [{path: {value: /restarting}}]
    retry: {attempts: 20, backoff: 50ms}
    backendRefs: [{name: restarting, port: 80}]"#,
    );
    let gw = Gateway::start(&[
        ("gateway.yaml", gateway(&[("http", port)])),
        ("services.yaml", services),
        ("routes.yaml", routes),
    ])
    .await;
    let c = client();
    // An endpoint that always answers 503: its requests are retried on the other one, so
    // every client gets the good answer.
    for i in 0..20 {
        let resp = c
            .get(url(port, &format!("/mixed?key=m{i}")))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "request {i}");
        assert_eq!(resp.text().await.unwrap(), "good");
    }
    assert!(
        bad_seen.lock().unwrap().len() >= 5,
        "round-robin sent some first attempts to the bad endpoint"
    );
    // An endpoint nobody listens on: connections to it fail and the request goes elsewhere.
    for i in 0..20 {
        let resp = c.get(url(port, "/halfdead")).send().await.unwrap();
        assert_eq!(resp.status(), 200, "request {i}");
        assert_eq!(resp.text().await.unwrap(), "good");
    }
    // The only endpoint refuses connections and starts listening 300 ms later: the request
    // waits through the backoffs and gets its answer.
    let started = Instant::now();
    let request = tokio::spawn(c.get(url(port, "/restarting")).send());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = flaky_at(restarting, "restarted", None).await;
    let resp = request.await.unwrap().unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap(), "restarted");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(metric(gw.admin(), &retries_metric("restarting", "connect")).await >= 2);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_timeout_bounds_all_attempts_and_the_backend_timeout_each() {
    let (addr, seen) = flaky("slow", None).await;
    let port = free_port();
    let routes = route(
        "timeouts",
        r#"  hostnames: [cafe.example.com]
  rules:
  - matches: [{path: {value: /request}}]
    retry: {codes: [500], attempts: 5, backoff: 10ms}
    timeouts: {request: 500ms}
    backendRefs: [{name: slow, port: 80}]
  - matches: [{path: {value: /backend}}]
    retry: {codes: [500], attempts: 2, backoff: 10ms}
    timeouts: {request: 10s, backendRequest: 300ms}
    backendRefs: [{name: slow, port: 80}]"#,
    );
    let gw = Gateway::start(&[
        ("gateway.yaml", gateway(&[("http", port)])),
        ("services.yaml", service("slow", &[addr], None)),
        ("routes.yaml", routes),
    ])
    .await;
    let c = client();
    let timed = |path: String| {
        let request = c.get(url(port, &path));
        async move {
            let started = Instant::now();
            let status = request.send().await.unwrap().status().as_u16();
            (status, started.elapsed())
        }
    };
    // Failing attempts take 300 ms each: one retry fits in the 500 ms request timeout...
    let (status, took) = timed("/request?key=a&fail=1&delay=300".into()).await;
    assert_eq!(status, 200);
    assert!(took < Duration::from_millis(500), "{took:?}");
    // ...two do not: 504 at the request timeout, with attempts left.
    let (status, took) = timed("/request?key=b&fail=2&delay=300".into()).await;
    assert_eq!(status, 504);
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_millis(800),
        "{took:?}"
    );
    assert_eq!(attempts(&seen, "b").len(), 2);

    // Attempts slower than backendRequest (300 ms) are cut off and retried.
    let (status, took) = timed("/backend?key=c&fail=2&delay=1000".into()).await;
    assert_eq!(status, 200);
    assert!(
        took >= Duration::from_millis(600) && took < Duration::from_millis(1000),
        "{took:?}"
    );
    assert_eq!(attempts(&seen, "c").len(), 3);
    // When every attempt is: 504 after 1 + 2 attempts.
    let (status, took) = timed("/backend?key=d&fail=3&delay=1000".into()).await;
    assert_eq!(status, 504);
    assert!(took < Duration::from_millis(1300), "{took:?}");
    let admin = gw.admin();
    assert_eq!(metric(admin, &retries_metric("slow", "timeout")).await, 4);
    assert_eq!(metric(admin, &retries_metric("slow", "status")).await, 2);
    gw.stop().await;
}
