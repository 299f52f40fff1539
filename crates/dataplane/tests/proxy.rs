//! End-to-end tests of the data plane over real sockets: a tiny hyper backend, an IR built by
//! hand, real HTTP/1.1, HTTP/2 and raw TCP clients.

use bytes::Bytes;
use gatehouse_dataplane::Options;
use gatehouse_ir::*;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

mod common;
use common::*;

// ---------------------------------------------------------------------------------------------
// Backend

/// What the backend saw, echoed back as `key=value` lines.
#[derive(Debug)]
struct Seen {
    backend: String,
    version: String,
    uri: String,
    headers: BTreeMap<String, Vec<String>>,
}

impl Seen {
    fn parse(body: &str) -> Seen {
        let mut seen = Seen {
            backend: String::new(),
            version: String::new(),
            uri: String::new(),
            headers: BTreeMap::new(),
        };
        for line in body.lines() {
            let (k, v) = line.split_once('=').unwrap();
            match k {
                "backend" => seen.backend = v.into(),
                "version" => seen.version = v.into(),
                "uri" => seen.uri = v.into(),
                _ => {
                    let name = k.strip_prefix("header:").unwrap();
                    seen.headers.entry(name.into()).or_default().push(v.into());
                }
            }
        }
        seen
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v[0].as_str())
    }
}

type BackendBody = BoxBody<Bytes, Infallible>;

fn full(data: impl Into<Bytes>) -> BackendBody {
    Full::new(data.into()).boxed()
}

async fn backend(
    id: &'static str,
    req: Request<Incoming>,
) -> Result<Response<BackendBody>, Infallible> {
    let path = req.uri().path().to_owned();
    if req.headers().contains_key("upgrade") {
        let proto = req.headers()["upgrade"].clone();
        tokio::spawn(async move {
            let upgraded = hyper::upgrade::on(req).await.unwrap();
            let mut io = TokioIo::new(upgraded);
            let mut buf = [0u8; 1024];
            loop {
                match io.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if io.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                }
            }
        });
        return Ok(Response::builder()
            .status(101)
            .header("connection", "upgrade")
            .header("upgrade", proto)
            .body(full(Bytes::new()))
            .unwrap());
    }
    if path == "/slow" {
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    if path == "/count" {
        let mut body = req.into_body();
        let mut n = 0usize;
        let mut sum = 0u64;
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.unwrap().into_data() {
                n += data.len();
                sum += data.iter().map(|&b| u64::from(b)).sum::<u64>();
            }
        }
        return Ok(Response::new(full(format!("{n} {sum}"))));
    }
    if let Some(chunks) = path.strip_prefix("/big/") {
        // Produced lazily: the backend never holds the whole body either.
        let chunks: usize = chunks.parse().unwrap();
        let chunk = Bytes::from(vec![7u8; CHUNK]);
        let frames = futures_util::stream::iter(
            (0..chunks).map(move |_| Ok::<_, Infallible>(Frame::data(chunk.clone()))),
        );
        return Ok(Response::new(StreamBody::new(frames).boxed()));
    }
    let mut text = format!(
        "backend={id}\nversion={:?}\nuri={}\n",
        req.version(),
        req.uri()
    );
    for (name, value) in req.headers() {
        text.push_str(&format!(
            "header:{}={}\n",
            name,
            value.to_str().unwrap_or("?")
        ));
    }
    Ok(Response::builder()
        .header("x-backend", id)
        .header("x-remove-me", "1")
        .header("connection", "x-hop")
        .header("x-hop", "secret")
        .body(full(text))
        .unwrap())
}

async fn start_backend(id: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(
                        TokioIo::new(stream),
                        service_fn(move |r| backend(id, r)),
                    )
                    .await;
            });
        }
    });
    addr
}

// ---------------------------------------------------------------------------------------------
// Clients

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Answer {
    fn seen(&self) -> Seen {
        assert_eq!(self.status, StatusCode::OK, "body: {}", self.body);
        Seen::parse(&self.body)
    }
}

async fn send(port: u16, req: Request<Empty<Bytes>>) -> Answer {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let (mut parts, body) = req.into_parts();
    parts.uri = format!("http://127.0.0.1:{port}{}", parts.uri)
        .parse()
        .unwrap();
    let resp = client
        .request(Request::from_parts(parts, body))
        .await
        .unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

async fn get(port: u16, host: &str, path: &str) -> Answer {
    send(
        port,
        Request::get(path)
            .header("host", host)
            .body(Empty::new())
            .unwrap(),
    )
    .await
}

/// Raw bytes in, everything the server sends until it closes (or 5 s) out.
async fn raw(port: u16, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    // The server may answer and close before it has read everything (431).
    let _ = stream.write_all(request).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

// ---------------------------------------------------------------------------------------------
// Tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_and_generated_errors() {
    let be = start_backend("a").await;
    let port = free_port();
    let dead = SocketAddr::new(LOCALHOST, free_port());
    let rules = vec![
        rule("ok", vec![to_cluster("a")], vec![]),
        rule(
            "invalid",
            vec![WeightedBackend {
                weight: 1,
                target: BackendTarget::Invalid {
                    reason: "no such service".into(),
                },
                filters: vec![],
            }],
            vec![],
        ),
        rule("empty", vec![to_cluster("empty")], vec![]),
        rule("dead", vec![to_cluster("dead")], vec![]),
        rule("nothing", vec![], vec![]),
        rule(
            "zero",
            vec![WeightedBackend {
                weight: 0,
                ..to_cluster("a")
            }],
            vec![],
        ),
    ];
    let entries = vec![
        prefix("/ok", 0),
        prefix("/invalid", 1),
        prefix("/empty", 2),
        prefix("/dead", 3),
        prefix("/nothing", 4),
        prefix("/zero", 5),
    ];
    let cfg = config(
        vec![listener(port, None, rules, entries)],
        vec![
            http1("a", vec![be]),
            http1("dead", vec![dead]),
            http1("empty", vec![]),
        ],
    );
    let (dp, registry) = dataplane(Options::default()).await;
    apply_ok(&dp, &cfg).await;
    assert_eq!(dp.bound_addresses(), vec![SocketAddr::new(LOCALHOST, port)]);

    let ok = get(port, "Cafe.Example.com:8080", "/ok/x?y=1").await;
    let seen = ok.seen();
    assert_eq!(seen.backend, "a");
    assert_eq!(seen.uri, "/ok/x?y=1");
    assert_eq!(seen.version, "HTTP/1.1");
    assert_eq!(seen.header("host"), Some("Cafe.Example.com:8080"));
    assert_eq!(seen.header("x-forwarded-for"), Some("127.0.0.1"));
    assert_eq!(seen.header("x-forwarded-proto"), Some("http"));
    assert_eq!(
        seen.header("x-forwarded-host"),
        Some("Cafe.Example.com:8080")
    );
    assert_eq!(ok.headers["x-backend"], "a");
    // Hop-by-hop fields named in the backend's Connection header do not reach the client.
    assert!(!ok.headers.contains_key("x-hop"));

    let chained = send(
        port,
        Request::get("/ok")
            .header("host", "h")
            .header("x-forwarded-for", "10.0.0.1")
            .header("connection", "x-drop-me")
            .header("x-drop-me", "1")
            .body(Empty::new())
            .unwrap(),
    )
    .await
    .seen();
    assert_eq!(
        chained.header("x-forwarded-for"),
        Some("10.0.0.1, 127.0.0.1")
    );
    assert_eq!(chained.header("x-drop-me"), None);

    for (path, status) in [
        ("/", 404),
        ("/okay", 404),
        ("/invalid", 500),
        ("/nothing", 500),
        ("/zero", 500),
        ("/empty", 503),
        ("/dead", 502),
    ] {
        let answer = get(port, "h", path).await;
        assert_eq!(answer.status.as_u16(), status, "{path}: {}", answer.body);
        assert_eq!(answer.headers["content-type"], "text/plain", "{path}");
        assert!(!answer.body.is_empty());
    }

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for line in [
        r#"gatehouse_http_requests_total{gateway="default/gw",route="default/ok",code="200"} 2"#,
        r#"gatehouse_http_requests_total{gateway="default/gw",route="",code="404"} 2"#,
        r#"gatehouse_http_requests_total{gateway="default/gw",route="default/dead",code="502"} 1"#,
        r#"gatehouse_upstream_connect_failures_total{cluster="dead"} 1"#,
        r#"gatehouse_http_request_duration_seconds_count{gateway="default/gw",route="default/ok"} 2"#,
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
    assert!(text.contains("gatehouse_downstream_connections_total"));
    assert!(text.contains("gatehouse_downstream_connections_active"));
    dp.shutdown(Duration::from_secs(1)).await;
}

/// A route's series are made at its first request, not when its rule is compiled (5000 idle
/// routes held 2.5 MB of them), and survive a new configuration: the next table resolves the
/// same series, so counts go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_series_appear_at_the_first_request_and_outlive_a_change() {
    let be = start_backend("a").await;
    let port = free_port();
    let cfg = |extra: bool| {
        let mut rules = vec![
            rule("ok", vec![to_cluster("a")], vec![]),
            rule("idle", vec![to_cluster("a")], vec![]),
        ];
        let mut entries = vec![prefix("/ok", 0), prefix("/idle", 1)];
        if extra {
            rules.push(rule("new", vec![to_cluster("a")], vec![]));
            entries.push(prefix("/new", 2));
        }
        config(
            vec![listener(port, None, rules, entries)],
            vec![http1("a", vec![be])],
        )
    };
    let (dp, registry) = dataplane(Options::default()).await;
    apply_ok(&dp, &cfg(false)).await;
    let text = || {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text
    };
    let ok_count =
        r#"gatehouse_http_requests_total{gateway="default/gw",route="default/ok",code="200"}"#;
    let ok_duration =
        r#"gatehouse_http_request_duration_seconds_count{gateway="default/gw",route="default/ok"}"#;
    assert!(!text().contains(r#"route="default/ok""#), "{}", text());

    // `ok` has served `n` requests, and `idle` has no series.
    let served = |n: usize| {
        let text = text();
        assert!(text.contains(&format!("{ok_count} {n}")), "{text}");
        assert!(text.contains(&format!("{ok_duration} {n}")), "{text}");
        assert!(!text.contains(r#"route="default/idle""#), "{text}");
    };

    assert_eq!(get(port, "h", "/ok").await.status.as_u16(), 200);
    served(1);

    apply_ok(&dp, &cfg(true)).await;
    assert_eq!(get(port, "h", "/new").await.status.as_u16(), 200);
    assert_eq!(get(port, "h", "/ok").await.status.as_u16(), 200);
    served(2);
    dp.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_header_matches_take_the_first_in_precedence_order() {
    // Seed 001: 50 matches on one path that differ only by a header value, then a catch-all.
    // The data plane indexes them; the answer must still be the first entry that matches.
    let be = start_backend("a").await;
    let port = free_port();
    let tagged = |i: usize| {
        rule(
            &format!("m{i}"),
            vec![to_cluster("a")],
            vec![HttpFilter::ResponseHeaders(HeaderModifier {
                set: vec![gatehouse_ir::HeaderValue {
                    name: "x-entry".into(),
                    value: i.to_string(),
                }],
                ..HeaderModifier::default()
            })],
        )
    };
    let rules: Vec<HttpRule> = (0..=50).map(tagged).collect();
    let mut entries: Vec<RouteEntry> = (0..50)
        .map(|i| RouteEntry {
            matcher: std::sync::Arc::new(HttpMatch {
                headers: vec![HeaderMatch {
                    name: "X-Match".into(),
                    value: StringMatch::Exact(format!("value-{i}")),
                }],
                ..HttpMatch::default()
            }),
            rule: i,
        })
        .collect();
    entries.push(prefix("/", 50));
    let cfg = config(
        vec![listener(port, None, rules, entries)],
        vec![http1("a", vec![be])],
    );
    let (dp, _registry) = dataplane(Options::default()).await;
    apply_ok(&dp, &cfg).await;

    for (values, entry) in [
        (&["value-0"][..], "0"),
        (&["value-49"][..], "49"),
        (&["value-49", "value-7"][..], "7"),
        (&["Value-49"][..], "50"),
        (&["value-50"][..], "50"),
        (&[][..], "50"),
    ] {
        let mut req = Request::get("/x").header("host", "h");
        for v in values {
            req = req.header("x-match", *v);
        }
        let answer = send(port, req.body(Empty::new()).unwrap()).await;
        assert_eq!(answer.status, StatusCode::OK, "{values:?}: {}", answer.body);
        assert_eq!(answer.headers["x-entry"], entry, "{values:?}");
    }
    dp.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_and_virtual_host_selection() {
    let a = start_backend("a").await;
    let b = start_backend("b").await;
    let c = start_backend("c").await;
    let port = free_port();
    let exact = listener(
        port,
        Some("foo.example.com"),
        vec![rule("r-a", vec![to_cluster("a")], vec![])],
        vec![prefix("/", 0)],
    );
    let wild = listener(
        port,
        Some("*.example.com"),
        vec![rule("r-b", vec![to_cluster("b")], vec![])],
        vec![prefix("/", 0)],
    );
    // A listener without hostname whose virtual hosts split by host.
    let mut any = listener(
        port,
        None,
        vec![
            rule("r-c", vec![to_cluster("c")], vec![]),
            rule("r-a2", vec![to_cluster("a")], vec![]),
        ],
        vec![],
    );
    any.virtual_hosts = vec![
        VirtualHost {
            hostname: "*.org".into(),
            routes: vec![prefix("/", 0)],
        },
        VirtualHost {
            hostname: "exact.org".into(),
            routes: vec![prefix("/", 1)],
        },
    ];
    let cfg = config(
        vec![exact, wild, any],
        vec![
            http1("a", vec![a]),
            http1("b", vec![b]),
            http1("c", vec![c]),
        ],
    );
    let (dp, _) = dataplane(Options::default()).await;
    apply_ok(&dp, &cfg).await;

    assert_eq!(get(port, "foo.example.com", "/").await.seen().backend, "a");
    assert_eq!(
        get(port, "FOO.example.com:80", "/").await.seen().backend,
        "a"
    );
    assert_eq!(get(port, "bar.example.com", "/").await.seen().backend, "b");
    assert_eq!(get(port, "x.y.example.com", "/").await.seen().backend, "b");
    assert_eq!(get(port, "www.cafe.org", "/").await.seen().backend, "c");
    assert_eq!(get(port, "exact.org", "/").await.seen().backend, "a");
    // The hostless listener takes example.com itself, but it has no virtual host for it.
    assert_eq!(get(port, "example.com", "/").await.status, 404);
    dp.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_redirect_rewrite_and_headers() {
    let be = start_backend("a").await;
    let port = free_port();
    let hv = |name: &str, value: &str| gatehouse_ir::HeaderValue {
        name: name.into(),
        value: value.into(),
    };
    let rules = vec![
        rule(
            "headers",
            vec![WeightedBackend {
                weight: 1,
                target: BackendTarget::Cluster("a".into()),
                filters: vec![HttpFilter::ResponseHeaders(HeaderModifier {
                    set: vec![hv("x-from-backend-filter", "yes")],
                    ..HeaderModifier::default()
                })],
            }],
            vec![
                HttpFilter::RequestHeaders(HeaderModifier {
                    set: vec![hv("x-set", "set-value")],
                    add: vec![hv("x-add", "added")],
                    remove: vec!["x-remove".into()],
                }),
                HttpFilter::ResponseHeaders(HeaderModifier {
                    set: vec![hv("x-response", "r")],
                    add: vec![],
                    remove: vec!["x-remove-me".into()],
                }),
            ],
        ),
        rule(
            "redirect",
            vec![],
            vec![
                HttpFilter::Redirect(Redirect {
                    scheme: "https".into(),
                    hostname: None,
                    port: Some(8443),
                    path: Some(gatehouse_ir::PathModifier::ReplacePrefixMatch(
                        "/new".into(),
                    )),
                    status: 301,
                }),
                HttpFilter::ResponseHeaders(HeaderModifier {
                    set: vec![hv("x-on-redirect", "1")],
                    ..HeaderModifier::default()
                }),
            ],
        ),
        rule(
            "rewrite",
            vec![to_cluster("a")],
            vec![HttpFilter::UrlRewrite(UrlRewrite {
                hostname: Some("internal.example.com".into()),
                path: Some(gatehouse_ir::PathModifier::ReplacePrefixMatch("/".into())),
            })],
        ),
        rule(
            "missing-error",
            vec![to_cluster("nope")],
            vec![HttpFilter::ResponseHeaders(HeaderModifier {
                set: vec![hv("x-on-error", "1")],
                ..HeaderModifier::default()
            })],
        ),
    ];
    let entries = vec![
        prefix("/headers", 0),
        prefix("/old", 1),
        prefix("/strip", 2),
        prefix("/err", 3),
    ];
    let cfg = config(
        vec![listener(port, None, rules, entries)],
        vec![http1("a", vec![be])],
    );
    let (dp, _) = dataplane(Options::default()).await;
    apply_ok(&dp, &cfg).await;

    let answer = send(
        port,
        Request::get("/headers")
            .header("host", "h")
            .header("x-set", "client")
            .header("x-add", "client")
            .header("x-remove", "client")
            .body(Empty::new())
            .unwrap(),
    )
    .await;
    let seen = answer.seen();
    assert_eq!(seen.headers["x-set"], ["set-value"]);
    assert_eq!(seen.headers["x-add"], ["client", "added"]);
    assert_eq!(seen.header("x-remove"), None);
    assert_eq!(answer.headers["x-response"], "r");
    assert_eq!(answer.headers["x-from-backend-filter"], "yes");
    assert!(!answer.headers.contains_key("x-remove-me"));

    let redirect = get(port, "Cafe.example.com:9999", "/old/page?x=1").await;
    assert_eq!(redirect.status, 301);
    assert_eq!(
        redirect.headers["location"],
        "https://cafe.example.com:8443/new/page?x=1"
    );
    assert_eq!(redirect.headers["x-on-redirect"], "1");

    let rewritten = get(port, "h", "/strip/a/b?q=2").await.seen();
    assert_eq!(rewritten.uri, "/a/b?q=2");
    assert_eq!(rewritten.header("host"), Some("internal.example.com"));
    assert_eq!(rewritten.header("x-forwarded-host"), Some("h"));
    assert_eq!(get(port, "h", "/strip").await.seen().uri, "/");

    let error = get(port, "h", "/err").await;
    assert_eq!(error.status, 500);
    assert_eq!(error.headers["x-on-error"], "1");
    dp.shutdown(Duration::from_secs(1)).await;
}

/// HTTP/2 with prior knowledge towards the proxy; the backend speaks HTTP/1.1.
async fn h2_get(port: u16, uri: &str) -> Answer {
    let stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let resp = sender
        .send_request(Request::get(uri).body(Empty::<Bytes>::new()).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// Draining (`begin_drain`): the sockets still accept and serve, HTTP/1 responses carry
/// `Connection: close` on both request paths, and HTTP/2 connections get a GOAWAY.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_asks_every_client_to_leave_while_still_serving() {
    let be = start_backend("a").await;
    let port = free_port();
    let cfg = config(
        vec![listener(
            port,
            None,
            vec![rule("r", vec![to_cluster("a")], vec![])],
            vec![prefix("/", 0)],
        )],
        vec![http1("a", vec![be])],
    );
    let (dp, _) = dataplane(Options::default()).await;
    apply_ok(&dp, &cfg).await;
    // An HTTP/2 connection from before the drain.
    let stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    let resp = sender
        .send_request(
            Request::get("http://h/")
                .body(Empty::<Bytes>::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(
        get(port, "h", "/")
            .await
            .headers
            .get("connection")
            .is_none()
    );

    dp.begin_drain();
    // HTTP/2: GOAWAY, after which the idle connection ends.
    tokio::time::timeout(Duration::from_secs(2), conn)
        .await
        .expect("the HTTP/2 connection got a GOAWAY and closed")
        .unwrap()
        .unwrap();
    // HTTP/1, on the HTTP/1 path and on hyper's (an absolute-form target is handed over):
    // still served on new connections, each response asking to close.
    let answer = get(port, "h", "/").await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.headers["connection"], "close");
    let raw_answer = raw(port, b"GET http://h/ HTTP/1.1\r\nhost: h\r\n\r\n").await;
    assert!(raw_answer.starts_with("HTTP/1.1 200"), "{raw_answer}");
    assert!(
        raw_answer
            .to_ascii_lowercase()
            .contains("connection: close"),
        "{raw_answer}"
    );
    dp.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_downstream_and_h2c_upstream() {
    let be = start_backend("a").await;
    let port = free_port();
    let rules = vec![
        rule("h1", vec![to_cluster("a")], vec![]),
        rule("h2", vec![to_cluster("a-h2c")], vec![]),
    ];
    let cfg = config(
        vec![listener(
            port,
            Some("cafe.example.com"),
            rules,
            vec![prefix("/h2c", 1), prefix("/", 0)],
        )],
        vec![
            http1("a", vec![be]),
            cluster("a-h2c", UpstreamProtocol::H2c, vec![be]),
        ],
    );
    let (dp, _) = dataplane(Options::default()).await;
    apply_ok(&dp, &cfg).await;

    let answer = h2_get(port, "http://cafe.example.com/tea?x=1").await;
    let seen = answer.seen();
    assert_eq!(seen.version, "HTTP/1.1");
    assert_eq!(seen.uri, "/tea?x=1");
    assert_eq!(seen.header("host"), Some("cafe.example.com"));
    assert_eq!(h2_get(port, "http://other.example.com/").await.status, 404);

    // HTTP/1.1 in, h2c out: the host travels as :authority.
    for _ in 0..3 {
        let seen = get(port, "cafe.example.com", "/h2c/x").await.seen();
        assert_eq!(seen.version, "HTTP/2.0");
        assert_eq!(seen.uri, "http://cafe.example.com/h2c/x");
        assert_eq!(seen.header("host"), None);
    }
    let seen = h2_get(port, "http://cafe.example.com/h2c/y").await.seen();
    assert_eq!(seen.version, "HTTP/2.0");
    assert_eq!(seen.uri, "http://cafe.example.com/h2c/y");
    dp.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_is_spliced() {
    let be = start_backend("ws").await;
    let port = free_port();
    let cfg = config(
        vec![listener(
            port,
            None,
            vec![rule("ws", vec![to_cluster("ws")], vec![])],
            vec![prefix("/", 0)],
        )],
        vec![cluster("ws", UpstreamProtocol::WebSocket, vec![be])],
    );
    let (dp, registry) = dataplane(Options::default()).await;
    apply_ok(&dp, &cfg).await;

    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    // A plain request first: the upgrade then arrives on a connection the HTTP/1 path
    // already served, and is handed over with nothing lost.
    stream
        .write_all(b"GET /before HTTP/1.1\r\nHost: ws.example.com\r\n\r\n")
        .await
        .unwrap();
    let first = read_one_response(&mut stream).await;
    assert!(
        first.starts_with("HTTP/1.1 200 ") && first.contains("uri=/before"),
        "{first}"
    );
    stream
        .write_all(b"GET /chat HTTP/1.1\r\nHost: ws.example.com\r\nConnection: keep-alive, Upgrade\r\nUpgrade: echo\r\n\r\n")
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap().to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: echo"), "{head}");
    assert!(head.contains("connection: upgrade"), "{head}");

    for msg in [&b"hello"[..], b"world, a bit longer"] {
        stream.write_all(msg).await.unwrap();
        let mut echoed = vec![0u8; msg.len()];
        stream.read_exact(&mut echoed).await.unwrap();
        assert_eq!(echoed, msg);
    }
    // The tunnel keeps the connection counted as active.
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("gatehouse_downstream_connections_active 1"),
        "{text}"
    );
    drop(stream);
    dp.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reapply_moves_traffic_and_closes_removed_addresses() {
    reapply_scenario(Options::default()).await;
}

/// The same on dedicated worker runtimes (as the binary runs): every worker's accept loop
/// stops when an address is removed, and the address can be bound again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reapply_on_dedicated_workers() {
    reapply_scenario(Options {
        workers: 3,
        dedicated_workers: true,
        ..Options::default()
    })
    .await;
}

async fn reapply_scenario(options: Options) {
    let a = start_backend("a").await;
    let b = start_backend("b").await;
    let p1 = free_port();
    let p2 = free_port();
    let to = |name: &str, ports: &[u16]| {
        config(
            ports
                .iter()
                .map(|&p| {
                    listener(
                        p,
                        None,
                        vec![rule("r", vec![to_cluster(name)], vec![])],
                        vec![prefix("/", 0)],
                    )
                })
                .collect(),
            vec![http1("a", vec![a]), http1("b", vec![b])],
        )
    };
    let (dp, _) = dataplane(options).await;
    apply_ok(&dp, &to("a", &[p1, p2])).await;
    assert_eq!(get(p1, "h", "/").await.seen().backend, "a");
    assert_eq!(get(p2, "h", "/").await.seen().backend, "a");

    // A keep-alive connection opened before the apply sees the new table on its next request.
    let stream = TcpStream::connect(("127.0.0.1", p2)).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = || {
        Request::get("/")
            .header("host", "h")
            .body(Empty::<Bytes>::new())
            .unwrap()
    };
    let first = sender.send_request(req()).await.unwrap();
    assert_eq!(first.headers()["x-backend"], "a");
    first.into_body().collect().await.unwrap();

    apply_ok(&dp, &to("b", &[p1, p2])).await;
    assert_eq!(get(p1, "h", "/").await.seen().backend, "b");
    // The connection takes the next request once its task has finished the last response:
    // on a busy machine, not necessarily by now.
    sender.ready().await.unwrap();
    let second = sender.send_request(req()).await.unwrap();
    assert_eq!(second.headers()["x-backend"], "b");
    second.into_body().collect().await.unwrap();

    // Remove p1 while a request is in flight there: it stops accepting, the request finishes;
    // p2 and its open connection keep working.
    let in_flight = tokio::spawn(get(p1, "h", "/slow"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    apply_ok(&dp, &to("b", &[p2])).await;
    assert_eq!(dp.bound_addresses(), vec![SocketAddr::new(LOCALHOST, p2)]);
    assert!(TcpStream::connect(("127.0.0.1", p1)).await.is_err());
    assert_eq!(get(p2, "h", "/").await.seen().backend, "b");
    sender.ready().await.unwrap();
    let third = sender.send_request(req()).await.unwrap();
    assert_eq!(third.status(), 200);
    third.into_body().collect().await.unwrap();
    let finished = in_flight.await.unwrap();
    assert_eq!(finished.seen().backend, "b");

    // And it can come back.
    apply_ok(&dp, &to("a", &[p1, p2])).await;
    assert_eq!(get(p1, "h", "/").await.seen().backend, "a");
    dp.shutdown(Duration::from_secs(1)).await;
    assert!(dp.bound_addresses().is_empty());
    assert!(TcpStream::connect(("127.0.0.1", p2)).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bind_errors_are_reported_and_the_rest_applies() {
    let be = start_backend("a").await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port();
    let free = free_port();
    let l = |p| {
        listener(
            p,
            None,
            vec![rule("r", vec![to_cluster("a")], vec![])],
            vec![prefix("/", 0)],
        )
    };
    let cfg = config(vec![l(taken_port), l(free)], vec![http1("a", vec![be])]);
    let (dp, _) = dataplane(Options::default()).await;
    let errors = dp.apply(&cfg).await.bind_errors;
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].address, SocketAddr::new(LOCALHOST, taken_port));
    assert!(errors[0].to_string().contains(&taken_port.to_string()));
    assert_eq!(get(free, "h", "/").await.status, 200);

    // Once the port is free, the next apply binds it.
    drop(taken);
    apply_ok(&dp, &cfg).await;
    assert_eq!(get(taken_port, "h", "/").await.status, 200);
    dp.shutdown(Duration::from_secs(1)).await;
}

/// What the data plane cannot run is contained and reported, never rejected: a match whose
/// regex does not compile never matches, a filter that cannot compile makes its rule answer
/// 500, a backend naming an unknown cluster answers 500; the rest serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contained_problems_are_diagnostics_and_the_rest_serves() {
    let be = start_backend("a").await;
    let port = free_port();
    let bad_filter = HttpFilter::RequestHeaders(HeaderModifier {
        set: vec![HeaderValue {
            name: "bad name".into(),
            value: "x".into(),
        }],
        ..Default::default()
    });
    let regex_entry = RouteEntry {
        matcher: std::sync::Arc::new(HttpMatch {
            path: PathMatch::Regex("/(".into()),
            ..Default::default()
        }),
        rule: 0,
    };
    let mut l = listener(
        port,
        None,
        vec![
            rule("good", vec![to_cluster("a")], vec![]),
            rule("filtered", vec![to_cluster("a")], vec![bad_filter]),
            rule("lost", vec![to_cluster("missing")], vec![]),
        ],
        vec![prefix("/filtered", 1), prefix("/lost", 2), prefix("/", 0)],
    );
    l.virtual_hosts[0].routes.insert(0, regex_entry);
    let cfg = config(vec![l], vec![http1("a", vec![be])]);
    let (dp, registry) = dataplane(Options::default()).await;
    let report = dp.apply(&cfg).await;
    assert!(report.bind_errors.is_empty());
    let messages: Vec<String> = report.diagnostics.iter().map(ToString::to_string).collect();
    assert_eq!(messages.len(), 3, "{messages:#?}");
    assert!(
        messages
            .iter()
            .any(|m| m.contains("match cannot be compiled") && m.contains("it never matches")),
        "{messages:#?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.contains("filter cannot be compiled")),
        "{messages:#?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.contains("unknown cluster missing")),
        "{messages:#?}"
    );
    let mut metrics = String::new();
    prometheus_client::encoding::text::encode(&mut metrics, &registry).unwrap();
    assert!(
        metrics.contains("gatehouse_dataplane_config_diagnostics 3"),
        "{metrics}"
    );

    assert_eq!(get(port, "h", "/").await.status, 200);
    assert_eq!(get(port, "h", "/filtered").await.status, 500);
    assert_eq!(get(port, "h", "/lost").await.status, 500);
    dp.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_get_clean_errors() {
    let be = start_backend("a").await;
    let port = free_port();
    let cfg = config(
        vec![listener(
            port,
            None,
            vec![rule("r", vec![to_cluster("a")], vec![])],
            vec![prefix("/", 0)],
        )],
        vec![http1("a", vec![be])],
    );
    let (dp, _) = dataplane(Options {
        max_header_bytes: 16 * 1024,
        ..Options::default()
    })
    .await;
    apply_ok(&dp, &cfg).await;

    let smuggle = raw(
        port,
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    )
    .await;
    // RFC 9112 §6.3: Transfer-Encoding wins, Content-Length is dropped before forwarding, and
    // the connection is closed afterwards so that nothing can desynchronise. (hyper does this;
    // a 400 would be fine too.)
    let lower = smuggle.to_ascii_lowercase();
    assert!(
        lower.starts_with("http/1.1 400")
            || (lower.contains("connection: close") && !lower.contains("header:content-length")),
        "{smuggle}"
    );

    let double_length = raw(
        port,
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nabcde",
    )
    .await;
    assert!(double_length.starts_with("HTTP/1.1 400"), "{double_length}");

    let bad_uri = raw(port, b"GET /a b HTTP/1.1\r\nHost: h\r\n\r\n").await;
    assert!(bad_uri.starts_with("HTTP/1.1 400"), "{bad_uri}");

    let big = format!(
        "GET / HTTP/1.1\r\nHost: h\r\nX-Big: {}\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    let too_big = raw(port, big.as_bytes()).await;
    eprintln!("oversized head answered with: {:?}", too_big.lines().next());
    assert!(
        too_big.is_empty() || too_big.starts_with("HTTP/1.1 431"),
        "{too_big}"
    );

    // The proxy is still fine.
    assert_eq!(get(port, "h", "/").await.status, 200);
    dp.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_are_cut_off() {
    let be = start_backend("a").await;
    let port = free_port();
    let cfg = config(
        vec![listener(
            port,
            None,
            vec![rule("r", vec![to_cluster("a")], vec![])],
            vec![prefix("/", 0)],
        )],
        vec![http1("a", vec![be])],
    );
    let (dp, _) = dataplane(Options {
        header_read_timeout: Duration::from_millis(300),
        ..Options::default()
    })
    .await;
    apply_ok(&dp, &cfg).await;
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: h\r\n")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "connection still open after 5 s");
    assert!(started.elapsed() < Duration::from_secs(3));
    let answer = String::from_utf8_lossy(&out);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
        "{answer}"
    );
    dp.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_answer_504() {
    let be = start_backend("a").await;
    let port = free_port();
    let mut slow = rule("slow", vec![to_cluster("a")], vec![]);
    slow.timeouts.request_ms = Some(200);
    let mut fast_enough = rule("fast", vec![to_cluster("a")], vec![]);
    fast_enough.timeouts.backend_request_ms = Some(5_000);
    let cfg = config(
        vec![listener(
            port,
            None,
            vec![slow, fast_enough],
            vec![prefix("/slow", 0), prefix("/", 1)],
        )],
        vec![http1("a", vec![be])],
    );
    let (dp, _) = dataplane(Options {
        default_request_timeout: Some(Duration::from_millis(100)),
        ..Options::default()
    })
    .await;
    apply_ok(&dp, &cfg).await;
    let answer = get(port, "h", "/slow").await;
    assert_eq!(answer.status, 504);
    assert_eq!(answer.headers["content-type"], "text/plain");
    assert_eq!(get(port, "h", "/x").await.status, 200);
    dp.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_in_flight_requests_finish() {
    let be = start_backend("a").await;
    let port = free_port();
    let cfg = config(
        vec![listener(
            port,
            None,
            vec![rule("r", vec![to_cluster("a")], vec![])],
            vec![prefix("/", 0)],
        )],
        vec![http1("a", vec![be])],
    );
    let (dp, _) = dataplane(Options::default()).await;
    apply_ok(&dp, &cfg).await;
    let in_flight = tokio::spawn(get(port, "h", "/slow"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = std::time::Instant::now();
    dp.shutdown(Duration::from_secs(10)).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(in_flight.await.unwrap().status, 200);
    assert!(TcpStream::connect(("127.0.0.1", port)).await.is_err());
    // Applying after shutdown does nothing.
    assert!(dp.apply(&cfg).await.bind_errors.is_empty());
    assert!(dp.bound_addresses().is_empty());
}

const CHUNK: usize = 64 * 1024;

/// Peak resident set size of this test process.
fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Reads one response with a Content-Length body, byte by byte (nothing past it is consumed).
async fn read_one_response(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    let text = String::from_utf8(head).unwrap();
    let length: usize = text
        .to_ascii_lowercase()
        .lines()
        .find_map(|l| {
            l.strip_prefix("content-length: ")
                .map(|v| v.parse().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.unwrap();
    text + &String::from_utf8_lossy(&body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_continue_body_waits_for_the_backend() {
    let be = start_backend("a").await;
    let port = free_port();
    let cfg = config(
        vec![listener(
            port,
            None,
            vec![rule("r", vec![to_cluster("a")], vec![])],
            vec![prefix("/", 0)],
        )],
        vec![http1("a", vec![be])],
    );
    let (dp, _) = dataplane(Options::default()).await;
    apply_ok(&dp, &cfg).await;
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    // The client sends the body only after the 100 (Continue) that the backend (hyper) sends
    // once it starts reading the body.
    stream
        .write_all(
            b"POST /count HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n",
        )
        .await
        .unwrap();
    let interim = read_one_response(&mut stream).await;
    assert!(
        interim.starts_with("HTTP/1.1 100 Continue\r\n"),
        "{interim}"
    );
    stream.write_all(&[1, 2, 3]).await.unwrap();
    let answer = read_one_response(&mut stream).await;
    assert!(
        answer.starts_with("HTTP/1.1 200 ") && answer.ends_with("\r\n\r\n3 6"),
        "{answer}"
    );
    dp.shutdown(Duration::from_secs(1)).await;
}

/// Peak RSS is the process's: with the other tests of this file running beside it, their
/// allocations count too (68 MiB once, in CI). So it runs alone, as its own step of
/// scripts/test: `cargo test --workspace --test proxy -- --ignored --exact
/// large_bodies_stream_both_ways_in_bounded_memory`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measures the process's peak RSS: run alone (scripts/test does)"]
async fn large_bodies_stream_both_ways_in_bounded_memory() {
    let be = start_backend("a").await;
    let port = free_port();
    let cfg = config(
        vec![listener(
            port,
            None,
            vec![rule("r", vec![to_cluster("a")], vec![])],
            vec![prefix("/", 0)],
        )],
        vec![http1("a", vec![be])],
    );
    let (dp, _) = dataplane(Options::default()).await;
    apply_ok(&dp, &cfg).await;
    let before = peak_rss_bytes();

    // 100 MiB up, produced lazily, without Content-Length (chunked upstream).
    const CHUNKS: usize = 1600;
    let chunk = Bytes::from((0..CHUNK).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
    let expected_sum: u64 = chunk.iter().map(|&b| u64::from(b)).sum::<u64>() * CHUNKS as u64;
    let frames = futures_util::stream::iter(
        (0..CHUNKS).map(move |_| Ok::<_, Infallible>(Frame::data(chunk.clone()))),
    );
    let client = Client::builder(TokioExecutor::new()).build_http();
    let req = Request::post(format!("http://127.0.0.1:{port}/count"))
        .header("host", "h")
        .body(StreamBody::new(frames))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        String::from_utf8_lossy(&body),
        format!("{} {expected_sum}", CHUNKS * CHUNK)
    );

    // 100 MiB down, counted as it arrives.
    let resp = get_stream(port, &format!("/big/{CHUNKS}")).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut received = 0usize;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            received += data.len();
        }
    }
    assert_eq!(received, CHUNKS * CHUNK);

    // Buffering either body would add 100 MiB; streaming stays within a few buffers.
    let growth = peak_rss_bytes().saturating_sub(before);
    eprintln!(
        "peak RSS growth while streaming 2 x 100 MiB: {} KiB",
        growth >> 10
    );
    assert!(growth < 48 << 20, "peak RSS grew by {} MiB", growth >> 20);
    dp.shutdown(Duration::from_secs(1)).await;
}

async fn get_stream(port: u16, path: &str) -> Response<Incoming> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let req = Request::get(format!("http://127.0.0.1:{port}{path}"))
        .header("host", "h")
        .body(Empty::new())
        .unwrap();
    client.request(req).await.unwrap()
}

/// Reads one HTTP/1 response (head and a Content-Length body) from `stream`; `None` if the
/// connection ended first.
async fn read_response(stream: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if buf.len() >= end + 4 + len {
                return Some(String::from_utf8_lossy(&buf[..end + 4 + len]).into_owned());
            }
        }
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut chunk))
            .await
            .expect("no answer within 5 s")
            .ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A drain that begins while a request is in flight must not close the kept-alive connection
/// under the client: the response promised keep-alive, so the client's next request on it is
/// still answered (with `Connection: close`). Closing it instead is what made load balancers'
/// clients see read errors during rolling updates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_during_a_request_answers_the_next_request_on_that_connection() {
    let be = gatehouse_testkit::echo("a").await;
    let port = free_port();
    let cfg = config(
        vec![listener(
            port,
            None,
            vec![rule("r", vec![to_cluster("a")], vec![])],
            vec![prefix("/", 0)],
        )],
        vec![http1("a", vec![be])],
    );
    let (dp, _) = dataplane(Options::default()).await;
    apply_ok(&dp, &cfg).await;
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    stream
        .write_all(b"GET /slow HTTP/1.1\r\nhost: h\r\nx-echo-delay-ms: 300\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    dp.begin_drain();
    let first = read_response(&mut stream)
        .await
        .expect("the first response");
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    assert!(
        !first.to_ascii_lowercase().contains("connection: close"),
        "the drain began after this request was read: {first}"
    );
    stream
        .write_all(b"GET /next HTTP/1.1\r\nhost: h\r\n\r\n")
        .await
        .unwrap();
    let second = read_response(&mut stream)
        .await
        .expect("the connection was closed under the client's next request");
    assert!(second.starts_with("HTTP/1.1 200"), "{second}");
    assert!(
        second.to_ascii_lowercase().contains("connection: close"),
        "{second}"
    );
    dp.shutdown(Duration::from_secs(1)).await;
}
