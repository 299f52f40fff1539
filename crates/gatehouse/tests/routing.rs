//! End to end over real sockets: every match type and filter, the 404/500/502/503 cases,
//! HTTP/2 with prior knowledge, h2c and WebSocket backends, proxy headers.

mod support;

use futures_util::{SinkExt, StreamExt};
use std::collections::HashMap;
use std::net::SocketAddr;
use support::*;
use tokio_tungstenite::tungstenite::Message;

struct Cafe {
    gw: Gateway,
    port: u16,
}

async fn cafe() -> Cafe {
    let port = free_port();
    let mut backends: HashMap<&str, SocketAddr> = HashMap::new();
    for name in ["coffee-v1", "coffee-v2", "tea", "tea-post", "h2", "ws"] {
        backends.insert(name, echo(name).await);
    }
    let dead: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut services = String::new();
    for name in ["coffee-v1", "coffee-v2", "tea", "tea-post"] {
        services.push_str(&service(name, &[backends[name]], None));
    }
    services.push_str(&service("h2", &[backends["h2"]], Some("kubernetes.io/h2c")));
    services.push_str(&service("ws", &[backends["ws"]], Some("kubernetes.io/ws")));
    services.push_str(&service("empty", &[], None));
    services.push_str(&service("dead", &[dead], None));

    let coffee = route(
        "coffee",
        r#"  hostnames: [cafe.example.com]
  rules:
  - matches:
    - {path: {value: /coffee}, headers: [{name: version, value: v2}]}
    - {path: {value: /coffee}, queryParams: [{name: TEST, value: v2}]}
    backendRefs: [{name: coffee-v2, port: 80}]
  - matches: [{path: {value: /coffee}}]
    backendRefs: [{name: coffee-v1, port: 80}]
  - matches: [{path: {type: RegularExpression, value: '/beans/[0-9]+'}}]
    backendRefs: [{name: coffee-v2, port: 80}]
  - matches: [{path: {value: /regex}, headers: [{name: x-re, type: RegularExpression, value: 'ab+c'}]}]
    backendRefs: [{name: coffee-v2, port: 80}]
  - matches: [{path: {value: /regex}, queryParams: [{name: q, type: RegularExpression, value: '[0-9]{3}'}]}]
    backendRefs: [{name: tea, port: 80}]
  - matches: [{path: {type: Exact, value: /exact}}]
    backendRefs: [{name: tea, port: 80}]"#,
    );
    let tea = route(
        "tea",
        r#"  hostnames: [cafe.example.com]
  rules:
  - matches: [{path: {value: /tea}, method: GET}]
    backendRefs: [{name: tea, port: 80}]
  - matches: [{path: {value: /tea}, method: POST}]
    backendRefs: [{name: tea-post, port: 80}]"#,
    );
    let filters = route(
        "filters",
        r#"  hostnames: [cafe.example.com]
  rules:
  - matches: [{path: {value: /headers}}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {set: [{name: x-set, value: set}], add: [{name: x-add, value: added}], remove: [x-remove]}
    - type: ResponseHeaderModifier
      responseHeaderModifier: {set: [{name: x-resp-set, value: s}], add: [{name: x-resp-add, value: a}], remove: [x-echo-extra]}
    backendRefs: [{name: coffee-v1, port: 80}]
  - matches: [{path: {value: /redirect}}]
    filters: [{type: RequestRedirect, requestRedirect: {scheme: https, hostname: other.example.com, statusCode: 301}}]
  - matches: [{path: {value: /moved}}]
    filters: [{type: RequestRedirect, requestRedirect: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /new}}}]
  - matches: [{path: {value: /port}}]
    filters: [{type: RequestRedirect, requestRedirect: {port: 8443, statusCode: 308}}]
  - matches: [{path: {value: /rewrite}}]
    filters: [{type: URLRewrite, urlRewrite: {hostname: rewritten.example.com, path: {type: ReplacePrefixMatch, replacePrefixMatch: /v2}}}]
    backendRefs: [{name: coffee-v1, port: 80}]
  - matches: [{path: {value: /full}}]
    filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplaceFullPath, replaceFullPath: /replaced}}}]
    backendRefs: [{name: coffee-v1, port: 80}]"#,
    );
    let errors = route(
        "errors",
        r#"  hostnames: [cafe.example.com]
  rules:
  - matches: [{path: {value: /invalid}}]
    backendRefs: [{name: does-not-exist, port: 80}]
  - matches: [{path: {value: /empty}}]
    backendRefs: [{name: empty, port: 80}]
  - matches: [{path: {value: /dead}}]
    backendRefs: [{name: dead, port: 80}]
  - matches: [{path: {value: /half}}]
    backendRefs: [{name: does-not-exist, port: 80}, {name: coffee-v1, port: 80}]
  - matches: [{path: {value: /weighted}}]
    backendRefs: [{name: coffee-v1, port: 80, weight: 1}, {name: coffee-v2, port: 80, weight: 3}, {name: tea, port: 80, weight: 0}]
  - matches: [{path: {value: /nobackends}}]
  - matches: [{path: {value: /h2c}}]
    backendRefs: [{name: h2, port: 80}]
  - matches: [{path: {value: /ws}}]
    backendRefs: [{name: ws, port: 80}]"#,
    );
    let gw = Gateway::start(&[
        ("gateway.yaml", gateway(&[("http", port)])),
        ("backends.yaml", services),
        ("routes.yaml", [coffee, tea, filters, errors].join("---\n")),
    ])
    .await;
    assert!(gw.errors().is_empty(), "{:?}", gw.errors());
    Cafe { gw, port }
}

async fn backend_of(c: &reqwest::Client, req: reqwest::RequestBuilder) -> (u16, String) {
    let _ = c;
    status_and_backend(req.send().await.unwrap()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn matches_route_to_the_right_backend() {
    let cafe = cafe().await;
    let c = client();
    let u = |p: &str| url(cafe.port, p);
    let cases: Vec<(reqwest::RequestBuilder, u16, &str)> = vec![
        (c.get(u("/coffee")), 200, "coffee-v1"),
        (c.get(u("/coffee/latte")), 200, "coffee-v1"),
        (
            c.get(u("/coffee")).header("version", "v2"),
            200,
            "coffee-v2",
        ),
        (
            c.get(u("/coffee")).header("Version", "v3"),
            200,
            "coffee-v1",
        ),
        (c.get(u("/coffee?TEST=v2")), 200, "coffee-v2"),
        (c.get(u("/coffee?other=1&TEST=v2")), 200, "coffee-v2"),
        (c.get(u("/coffee?TEST=v3")), 200, "coffee-v1"),
        (c.get(u("/coffeehouse")), 404, ""),
        (c.get(u("/beans/42")), 200, "coffee-v2"),
        (c.get(u("/beans/42x")), 404, ""),
        (c.get(u("/regex")).header("x-re", "abbbc"), 200, "coffee-v2"),
        (c.get(u("/regex")).header("x-re", "xabc"), 404, ""),
        (c.get(u("/regex?q=123")), 200, "tea"),
        (c.get(u("/regex?q=1234")), 404, ""),
        (c.get(u("/exact")), 200, "tea"),
        (c.get(u("/exact/")), 404, ""),
        (c.get(u("/tea")), 200, "tea"),
        (c.post(u("/tea")).body("milk"), 200, "tea-post"),
        (c.put(u("/tea")), 404, ""),
        (c.get(u("/nothing-here")), 404, ""),
        (
            c.get(format!("http://other.example.com:{}/coffee", cafe.port)),
            404,
            "",
        ),
    ];
    for (i, (req, status, backend)) in cases.into_iter().enumerate() {
        assert_eq!(
            backend_of(&c, req).await,
            (status, backend.to_string()),
            "case {i}"
        );
    }
    cafe.gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_statuses() {
    let cafe = cafe().await;
    let c = client();
    let status = |p: &str| {
        let c = c.clone();
        let u = url(cafe.port, p);
        async move { c.get(u).send().await.unwrap().status().as_u16() }
    };
    assert_eq!(status("/invalid").await, 500, "all backends invalid");
    assert_eq!(
        status("/nobackends").await,
        500,
        "no backendRefs and no filter"
    );
    assert_eq!(status("/empty").await, 503, "no ready endpoint");
    assert_eq!(status("/dead").await, 502, "endpoint refuses connections");

    // Half the weight is invalid: about half the requests get 500, the rest reach the backend.
    let mut failed = 0;
    for _ in 0..400 {
        match status("/half").await {
            500 => failed += 1,
            200 => {}
            other => panic!("unexpected {other}"),
        }
    }
    assert!((120..=280).contains(&failed), "{failed} of 400 got 500");
    cafe.gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_split_traffic_and_zero_gets_none() {
    let cafe = cafe().await;
    let c = client();
    let mut seen: HashMap<String, u32> = HashMap::new();
    for _ in 0..800 {
        let (status, name) = backend_of(&c, c.get(url(cafe.port, "/weighted"))).await;
        assert_eq!(status, 200);
        *seen.entry(name).or_default() += 1;
    }
    assert_eq!(seen.get("tea"), None, "weight 0 never gets traffic");
    let v2 = seen["coffee-v2"];
    assert!(
        (520..=680).contains(&v2),
        "1:3 split gave coffee-v2 {v2} of 800"
    );
    cafe.gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_filters_and_proxy_headers() {
    let cafe = cafe().await;
    let c = client();
    let resp = c
        .get(url(cafe.port, "/headers"))
        .header("x-set", "original")
        .header("x-add", "first")
        .header("x-remove", "gone")
        .header("connection", "keep-alive, x-hop")
        .header("x-hop", "1")
        .header("x-echo-set-response-header", "x-echo-extra=1")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-resp-set"], "s");
    assert_eq!(resp.headers()["x-resp-add"], "a");
    assert!(
        resp.headers().get("x-echo-extra").is_none(),
        "response header removed"
    );
    let body = echo_json(resp).await;
    let h = &body["headers"];
    assert_eq!(h["x-set"], serde_json::json!(["set"]));
    assert_eq!(h["x-add"], serde_json::json!(["first", "added"]));
    assert!(h.get("x-remove").is_none());
    assert!(
        h.get("x-hop").is_none(),
        "headers named in Connection are hop-by-hop"
    );
    assert_eq!(h["x-forwarded-for"], serde_json::json!(["127.0.0.1"]));
    assert_eq!(h["x-forwarded-proto"], serde_json::json!(["http"]));
    assert_eq!(
        h["x-forwarded-host"][0].as_str().unwrap().split(':').next(),
        Some(HOST)
    );
    assert_eq!(
        body["host"].as_str().unwrap().split(':').next(),
        Some(HOST),
        "Host is passed through"
    );
    cafe.gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_and_rewrites() {
    let cafe = cafe().await;
    let c = client();
    let r = c
        .get(url(cafe.port, "/redirect/x?a=1"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 301);
    assert_eq!(
        r.headers()["location"],
        "https://other.example.com/redirect/x?a=1"
    );

    let r = c
        .get(url(cafe.port, "/moved/deep/path"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 302);
    assert_eq!(
        r.headers()["location"],
        format!("http://{HOST}:{}/new/deep/path", cafe.port)
    );

    let r = c.get(url(cafe.port, "/port")).send().await.unwrap();
    assert_eq!(r.status(), 308);
    assert_eq!(r.headers()["location"], format!("http://{HOST}:8443/port"));

    let body = echo_json(
        c.get(url(cafe.port, "/rewrite/a/b?z=1"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(body["path"], "/v2/a/b");
    assert_eq!(body["query"], "z=1");
    assert_eq!(body["host"], "rewritten.example.com");

    let body = echo_json(
        c.get(url(cafe.port, "/full/anything"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(body["path"], "/replaced");
    cafe.gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_prior_knowledge_and_h2c_backend() {
    let cafe = cafe().await;
    let h2 = builder().http2_prior_knowledge().build().unwrap();
    let resp = h2
        .get(url(cafe.port, "/coffee"))
        .header("version", "v2")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.version(), reqwest::Version::HTTP_2);
    let body = echo_json(resp).await;
    assert_eq!(body["name"], "coffee-v2");
    assert_eq!(
        body["proto"], "HTTP/1.1",
        "an HTTP/2 client reaches an HTTP/1.1 backend"
    );
    assert_eq!(body["host"].as_str().unwrap().split(':').next(), Some(HOST));

    // The h2c Service port speaks HTTP/2 to its backend, whatever the client spoke.
    for c in [client(), h2] {
        let body = echo_json(
            c.post(url(cafe.port, "/h2c"))
                .body("x".repeat(1000))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(body["name"], "h2");
        assert_eq!(body["proto"], "HTTP/2.0");
        assert_eq!(body["body_bytes"], 1000);
    }
    cafe.gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_upgrade_echoes_both_ways() {
    let cafe = cafe().await;
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", cafe.port))
        .await
        .unwrap();
    let request = format!("ws://{HOST}:{}/ws", cafe.port);
    let (mut ws, resp) = tokio_tungstenite::client_async(request, stream)
        .await
        .expect("upgrade through the gateway");
    assert_eq!(resp.status(), 101);
    for i in 0..20 {
        let text = format!("hello {i}");
        ws.send(Message::text(text.clone())).await.unwrap();
        let got = ws.next().await.unwrap().unwrap();
        assert_eq!(got.into_text().unwrap().as_str(), text);
    }
    ws.send(Message::binary(vec![0u8, 1, 2, 255]))
        .await
        .unwrap();
    assert_eq!(
        ws.next().await.unwrap().unwrap().into_data().as_ref(),
        [0u8, 1, 2, 255]
    );
    ws.close(None).await.unwrap();
    cafe.gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoint_serves_health_metrics_config_and_status() {
    let cafe = cafe().await;
    let c = client();
    for _ in 0..3 {
        c.get(url(cafe.port, "/coffee")).send().await.unwrap();
    }
    c.get(url(cafe.port, "/dead")).send().await.unwrap();
    let admin = |p: &str| format!("http://{}{p}", cafe.gw.admin());
    assert_eq!(c.get(admin("/healthz")).send().await.unwrap().status(), 200);
    assert_eq!(c.get(admin("/readyz")).send().await.unwrap().status(), 200);
    let metrics = c
        .get(admin("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for needle in [
        "gatehouse_http_requests_total{",
        "route=\"default/coffee\"",
        "code=\"200\"",
        "gatehouse_http_request_duration_seconds_bucket",
        "gatehouse_config_generation 1",
        "gatehouse_config_apply_duration_seconds_count 1",
        // Each stage of the pass is timed; the data plane applied the one configuration once.
        "gatehouse_config_pass_stage_duration_seconds_count{stage=\"apply\"} 1",
        "gatehouse_config_pass_stage_duration_seconds_count{stage=\"translate\"}",
        // One pass at start-up: nothing to pace.
        "gatehouse_config_pacing_pause_seconds_count 0",
        "gatehouse_downstream_connections_active",
        "gatehouse_upstream_connect_failures_total",
    ] {
        assert!(
            metrics.contains(needle),
            "metrics lack {needle}:\n{metrics}"
        );
    }
    let dump: serde_json::Value = c
        .get(admin("/config_dump"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(dump["generation"], 1);
    assert_eq!(dump["config"]["gateways"][0]["name"], "gw");
    let status: serde_json::Value = c
        .get(admin("/status"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let objects = status["objects"].as_array().unwrap();
    let coffee = objects
        .iter()
        .find(|o| o["kind"] == "HTTPRoute" && o["metadata"]["name"] == "coffee")
        .unwrap();
    let conds = coffee["status"]["parents"][0]["conditions"]
        .as_array()
        .unwrap();
    assert!(
        conds
            .iter()
            .any(|c| c["type"] == "Accepted" && c["status"] == "True")
    );
    let errors_route = objects
        .iter()
        .find(|o| o["metadata"]["name"] == "errors")
        .unwrap();
    let conds = errors_route["status"]["parents"][0]["conditions"]
        .as_array()
        .unwrap();
    assert!(
        conds
            .iter()
            .any(|c| c["type"] == "ResolvedRefs" && c["reason"] == "BackendNotFound")
    );
    cafe.gw.stop().await;
}
