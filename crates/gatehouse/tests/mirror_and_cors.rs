//! End to end over real sockets: RequestMirror (a copy of each request, body included, reaches
//! the mirror backend; a mirror backend that is down or slow changes nothing for the real
//! request; percentages) and the CORS filter (preflights answered by the gateway, CORS fields on
//! the responses of allowed origins), over HTTP/1 and HTTP/2.

mod support;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use support::*;
use tokio::sync::mpsc;

/// A request as a mirror backend received it.
#[derive(Debug)]
struct Received {
    method: String,
    path: String,
    headers: http::HeaderMap,
    body: Bytes,
}

/// A backend that records every request (its whole body read) and answers `200 mirror`.
async fn recording_backend() -> (SocketAddr, mpsc::UnboundedReceiver<Received>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: http::Request<Incoming>| {
                    let tx = tx.clone();
                    async move {
                        let (parts, body) = req.into_parts();
                        let body = body.collect().await.map(|b| b.to_bytes());
                        if let Ok(body) = body {
                            let _ = tx.send(Received {
                                method: parts.method.to_string(),
                                path: parts.uri.path().to_string(),
                                headers: parts.headers,
                                body,
                            });
                        }
                        Ok::<_, Infallible>(http::Response::new(http_body_util::Full::new(
                            Bytes::from_static(b"mirror"),
                        )))
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    (addr, rx)
}

/// A backend that accepts connections and never reads from them nor answers.
async fn stuck_backend() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = listener.accept().await {
            held.push(tcp);
        }
    });
    addr
}

fn mirror_counter(cluster: &str, result: &str) -> String {
    format!(
        "gatehouse_mirror_requests_total{{cluster=\"default/{cluster}:80\",result=\"{result}\"}}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirrors_get_a_copy_of_each_request_and_the_real_one_never_waits_for_them() {
    let real = echo("real").await;
    let (mirror, mut received) = recording_backend().await;
    let (second, mut received_second) = recording_backend().await;
    let stuck = stuck_backend().await;
    let down: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let port = free_port();
    let mut services = service("real", &[real], None);
    services.push_str(&service("mirror", &[mirror], None));
    services.push_str(&service("second", &[second], None));
    services.push_str(&service("stuck", &[stuck], None));
    services.push_str(&service("down", &[down], None));
    let routes = route(
        "mirrors",
        r#"  hostnames: [cafe.example.com]
  rules:
  - matches: [{path: {value: /copy}}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {set: [{name: x-set, value: by-gateway}]}
    - {type: RequestMirror, requestMirror: {backendRef: {name: mirror, port: 80}}}
    - {type: RequestMirror, requestMirror: {backendRef: {name: second, port: 80}}}
    backendRefs: [{name: real, port: 80}]
  - matches: [{path: {value: /stuck}}]
    filters: [{type: RequestMirror, requestMirror: {backendRef: {name: stuck, port: 80}}}]
    backendRefs: [{name: real, port: 80}]
  - matches: [{path: {value: /down}}]
    filters: [{type: RequestMirror, requestMirror: {backendRef: {name: down, port: 80}}}]
    backendRefs: [{name: real, port: 80}]
  - matches: [{path: {value: /half}}]
    filters: [{type: RequestMirror, requestMirror: {backendRef: {name: mirror, port: 80}, percent: 50}}]
    backendRefs: [{name: real, port: 80}]
  - matches: [{path: {value: /plain}}]
    backendRefs: [{name: real, port: 80}]"#,
    );
    let gw = Gateway::start(&[
        ("gateway.yaml", gateway(&[("http", port)])),
        ("services.yaml", services),
        ("routes.yaml", routes),
    ])
    .await;
    let c = client();
    let h2 = builder().http2_prior_knowledge().build().unwrap();

    // A bodiless request and two with bodies (Content-Length over HTTP/1, DATA frames over
    // HTTP/2): the real backend answers, and each mirror receives the same request, body and
    // filters included.
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let cases: [(&reqwest::Client, reqwest::Method, &str, Vec<u8>); 3] = [
        (&c, reqwest::Method::GET, "/copy/get", Vec::new()),
        (&c, reqwest::Method::POST, "/copy/h1-body", big.clone()),
        (&h2, reqwest::Method::PUT, "/copy/h2-body", big.clone()),
    ];
    for (client, method, path, body) in cases {
        let resp = client
            .request(method.clone(), url(port, path))
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        let json = echo_json(resp).await;
        assert_eq!(json["name"], "real");
        assert_eq!(json["body_bytes"], body.len(), "{path}");
        for rx in [&mut received, &mut received_second] {
            let copy = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .expect("the mirror receives a copy")
                .unwrap();
            assert_eq!(copy.method, method.as_str());
            assert_eq!(copy.path, path);
            assert_eq!(copy.headers["x-set"], "by-gateway");
            assert_eq!(copy.headers["host"], format!("{HOST}:{port}"));
            assert!(copy.body == body, "{path}: the mirror got the whole body");
        }
    }
    // A route without mirrors mirrors nothing.
    let resp = c.get(url(port, "/plain")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(received.try_recv().is_err());

    // A mirror backend that never reads nor answers, and one nobody listens on: the real
    // requests are answered at once, a body larger than the mirror buffer and the socket
    // buffers towards the stuck backend included.
    let huge = vec![b'x'; 16 << 20];
    for path in ["/stuck", "/down"] {
        for body in [Vec::new(), huge.clone()] {
            let started = Instant::now();
            let resp = c
                .post(url(port, path))
                .body(body.clone())
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200, "{path}");
            assert_eq!(echo_json(resp).await["body_bytes"], body.len());
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "{path}: the real request took {:?}",
                started.elapsed()
            );
        }
    }
    let admin = gw.admin();
    // (The copy of the 16 MiB body may overflow its buffer before the connect fails: then it
    // counts as dropped.)
    eventually(
        "failed mirrors are counted",
        Duration::from_secs(10),
        || async {
            let error = metric(admin, &mirror_counter("down", "error")).await;
            let dropped = metric(admin, &mirror_counter("down", "dropped")).await;
            error >= 1 && error + dropped == 2
        },
    )
    .await;
    // The copy of the 16 MiB body fell behind the stuck backend and was abandoned.
    eventually(
        "abandoned mirrors are counted",
        Duration::from_secs(10),
        || async { metric(admin, &mirror_counter("stuck", "dropped")).await == 1 },
    )
    .await;
    assert_eq!(metric(admin, &mirror_counter("mirror", "ok")).await, 3);

    // percent: 50 mirrors about half of the requests.
    let before = metric(admin, &mirror_counter("mirror", "ok")).await;
    for _ in 0..200 {
        let resp = c.get(url(port, "/half")).send().await.unwrap();
        assert_eq!(resp.status(), 200);
    }
    let mut copies = 0;
    while tokio::time::timeout(Duration::from_millis(500), received.recv())
        .await
        .is_ok_and(|r| r.is_some())
    {
        copies += 1;
    }
    assert!(
        (60..=140).contains(&copies),
        "{copies} of 200 requests mirrored"
    );
    assert_eq!(
        metric(admin, &mirror_counter("mirror", "ok")).await - before,
        copies
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_preflights_are_answered_and_allowed_origins_get_cors_fields() {
    let real = echo("real").await;
    let port = free_port();
    let routes = route(
        "cors",
        r#"  hostnames: [cafe.example.com]
  rules:
  - matches: [{path: {value: /api}}]
    filters:
    - type: CORS
      cors:
        allowOrigins: ["https://www.foo.com", "https://*.bar.com"]
        allowMethods: [GET, PUT]
        allowHeaders: [x-header-1, x-header-2]
        exposeHeaders: [x-echo-extra]
        allowCredentials: true
        maxAge: 600
    - type: ResponseHeaderModifier
      responseHeaderModifier: {set: [{name: x-resp, value: modified}]}
    backendRefs: [{name: real, port: 80}]
  - matches: [{path: {value: /open}}]
    filters: [{type: CORS, cors: {allowOrigins: ["*"], allowMethods: ["*"], allowHeaders: ["*"]}}]
    backendRefs: [{name: real, port: 80}]
  - matches: [{path: {value: /broken}}]
    filters: [{type: CORS, cors: {allowOrigins: ["https://www.foo.com"]}}]
    backendRefs: [{name: missing, port: 80}]"#,
    );
    let gw = Gateway::start(&[
        ("gateway.yaml", gateway(&[("http", port)])),
        ("services.yaml", service("real", &[real], None)),
        ("routes.yaml", routes),
    ])
    .await;
    let h1 = client();
    let h2 = builder().http2_prior_knowledge().build().unwrap();
    for c in [&h1, &h2] {
        // A preflight from an allowed origin is answered by the gateway, with the lists.
        let resp = c
            .request(reqwest::Method::OPTIONS, url(port, "/api"))
            .header("origin", "https://app.bar.com")
            .header("access-control-request-method", "PUT")
            .header("access-control-request-headers", "x-header-1")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let h = resp.headers().clone();
        assert_eq!(h["access-control-allow-origin"], "https://app.bar.com");
        assert_eq!(h["access-control-allow-methods"], "GET, PUT");
        assert_eq!(h["access-control-allow-headers"], "x-header-1, x-header-2");
        assert_eq!(h["access-control-allow-credentials"], "true");
        assert_eq!(h["access-control-max-age"], "600");
        assert_eq!(h["vary"], "origin");
        assert_eq!(h["x-resp"], "modified");
        assert!(
            resp.bytes().await.unwrap().is_empty(),
            "the backend never saw it"
        );

        // From an origin that is not allowed: answered, without CORS fields.
        let resp = c
            .request(reqwest::Method::OPTIONS, url(port, "/api"))
            .header("origin", "https://foobar.com")
            .header("access-control-request-method", "GET")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert!(resp.headers().get("access-control-allow-origin").is_none());

        // An actual request from an allowed origin reaches the backend and gets the fields
        // (replacing the backend's own Access-Control-Allow-Origin).
        let resp = c
            .get(url(port, "/api"))
            .header("origin", "https://www.foo.com")
            .header(
                "x-echo-set-response-header",
                "access-control-allow-origin=https://evil.example",
            )
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let h = resp.headers().clone();
        assert_eq!(h["access-control-allow-origin"], "https://www.foo.com");
        assert_eq!(h["access-control-allow-credentials"], "true");
        assert_eq!(h["access-control-expose-headers"], "x-echo-extra");
        assert!(h.get("access-control-allow-methods").is_none());
        assert_eq!(echo_json(resp).await["name"], "real");

        // Other origins, and requests without Origin, pass untouched.
        for origin in [Some("https://foobar.com"), None] {
            let mut req = c.get(url(port, "/api"));
            if let Some(o) = origin {
                req = req.header("origin", o);
            }
            let resp = req.send().await.unwrap();
            assert_eq!(resp.status(), 200);
            assert!(resp.headers().get("access-control-allow-origin").is_none());
            assert_eq!(echo_json(resp).await["name"], "real");
        }
        // An OPTIONS without Access-Control-Request-Method is no preflight: forwarded.
        let resp = c
            .request(reqwest::Method::OPTIONS, url(port, "/api"))
            .header("origin", "https://www.foo.com")
            .send()
            .await
            .unwrap();
        assert_eq!(echo_json(resp).await["method"], "OPTIONS");

        // Wildcards without credentials answer `*`.
        let resp = c
            .request(reqwest::Method::OPTIONS, url(port, "/open"))
            .header("origin", "http://anything.example:8080")
            .header("access-control-request-method", "DELETE")
            .send()
            .await
            .unwrap();
        let h = resp.headers();
        assert_eq!(h["access-control-allow-origin"], "*");
        assert_eq!(h["access-control-allow-methods"], "*");
        assert_eq!(h["access-control-max-age"], "5");
        assert!(h.get("access-control-allow-credentials").is_none());

        // An error the gateway generates (here 500: the backend Service does not exist)
        // carries the fields too, or the page's script could not read it.
        let resp = c
            .get(url(port, "/broken"))
            .header("origin", "https://www.foo.com")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 500);
        assert_eq!(
            resp.headers()["access-control-allow-origin"],
            "https://www.foo.com"
        );
        let resp = c.get(url(port, "/broken")).send().await.unwrap();
        assert_eq!(resp.status(), 500);
        assert!(resp.headers().get("access-control-allow-origin").is_none());
    }
    gw.stop().await;
}
