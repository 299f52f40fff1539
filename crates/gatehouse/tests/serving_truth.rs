//! Status and readiness never claim more than is true: a listener that cannot bind is not
//! Programmed (and recovers by itself once it can), readiness waits for every listener, and
//! two Gateways on one address and port either share it or the newer one is told why not.

mod support;

use serde_json::Value;
use std::time::Duration;
use support::*;

async fn admin_text(c: &reqwest::Client, gw: &Gateway, path: &str) -> (u16, String) {
    let r = c
        .get(format!("http://{}{path}", gw.admin()))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// The object of `kind` named `namespace/name` in /status.
fn object<'a>(status: &'a Value, kind: &str, namespace: &str, name: &str) -> &'a Value {
    status["objects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| {
            o["kind"] == kind
                && o["metadata"]["name"] == name
                && o["metadata"]["namespace"].as_str().unwrap_or("default") == namespace
        })
        .unwrap_or_else(|| panic!("{kind} {namespace}/{name} in {status}"))
}

/// (status, reason, message) of condition `type_` in `conditions`.
fn condition(conditions: &Value, type_: &str) -> (String, String, String) {
    let c = conditions
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("{type_} in {conditions}"));
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    (s("status"), s("reason"), s("message"))
}

fn listener<'a>(gateway: &'a Value, name: &str) -> &'a Value {
    gateway["status"]["listeners"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == name)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_that_cannot_bind_is_not_programmed_until_it_can() {
    let backend = echo("svc").await;
    let free = free_port();
    let busy = free_port();
    // Another process (here: this test) holds the port.
    let holder = std::net::TcpListener::bind(("127.0.0.1", busy)).unwrap();
    let gw = Gateway::start(&[
        ("gateway.yaml", gateway(&[("free", free), ("busy", busy)])),
        ("backends.yaml", service("svc", &[backend], None)),
        (
            "routes.yaml",
            route("r", "  rules: [{backendRefs: [{name: svc, port: 80}]}]"),
        ),
    ])
    .await;
    let c = client();

    let status = gw.status().await;
    let g = object(&status, "Gateway", "default", "gw");
    let (s, reason, message) = condition(&listener(g, "busy")["conditions"], "Programmed");
    assert_eq!(
        (s.as_str(), reason.as_str()),
        ("False", "Pending"),
        "{message}"
    );
    assert!(
        message.contains(&format!("cannot listen on 127.0.0.1:{busy}"))
            && message.contains("Address already in use"),
        "the OS error is in the message: {message}"
    );
    assert_eq!(
        condition(&listener(g, "free")["conditions"], "Programmed").0,
        "True"
    );
    let (code, body) = admin_text(&c, &gw, "/readyz").await;
    assert_eq!(code, 503, "not ready while a listener is not bound: {body}");
    assert!(body.contains(&format!("127.0.0.1:{busy}")), "{body}");
    let (_, metrics) = admin_text(&c, &gw, "/metrics").await;
    assert!(
        metrics
            .contains(r#"gatehouse_listener_programmed{gateway="default/gw",listener="busy"} 0"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            r#"gatehouse_listener_bind_failures_total{{address="127.0.0.1:{busy}"}}"#
        )),
        "{metrics}"
    );
    // The listener that is bound serves meanwhile.
    assert_eq!(c.get(url(free, "/")).send().await.unwrap().status(), 200);

    // The port frees: the bind is retried without any change of configuration.
    drop(holder);
    eventually("the retried bind succeeds", Duration::from_secs(10), || {
        let c = c.clone();
        async move { matches!(c.get(url(busy, "/")).send().await, Ok(r) if r.status() == 200) }
    })
    .await;
    eventually(
        "status and readiness follow",
        Duration::from_secs(5),
        || {
            let c = c.clone();
            let gw = &gw;
            async move {
                let status = gw.status().await;
                let g = object(&status, "Gateway", "default", "gw");
                condition(&listener(g, "busy")["conditions"], "Programmed").0 == "True"
                    && admin_text(&c, gw, "/readyz").await.0 == 200
            }
        },
    )
    .await;
    let (_, metrics) = admin_text(&c, &gw, "/metrics").await;
    assert!(
        metrics
            .contains(r#"gatehouse_listener_programmed{gateway="default/gw",listener="busy"} 1"#),
        "{metrics}"
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_the_host_does_not_own_is_not_usable() {
    let port = free_port();
    // TEST-NET-1: never an address of this host.
    let gateway = gateway(&[("http", port)]).replace(
        "  gatewayClassName: gatehouse\n",
        "  gatewayClassName: gatehouse\n  addresses: [{type: IPAddress, value: 192.0.2.10}]\n",
    );
    let gw = Gateway::start(&[("gateway.yaml", gateway)]).await;
    let c = client();
    let status = gw.status().await;
    let g = object(&status, "Gateway", "default", "gw");
    let (s, reason, message) = condition(&g["status"]["conditions"], "Programmed");
    assert_eq!(
        (s.as_str(), reason.as_str()),
        ("False", "AddressNotUsable"),
        "{message}"
    );
    assert!(
        message.contains("Cannot assign requested address"),
        "{message}"
    );
    let (s, reason, _) = condition(&listener(g, "http")["conditions"], "Programmed");
    assert_eq!((s.as_str(), reason.as_str()), ("False", "Invalid"));
    assert_eq!(admin_text(&c, &gw, "/readyz").await.0, 503);
    gw.stop().await;
}

/// GatewayClass + Gateway `name` in namespace `ns` with one HTTP listener on `port`.
fn team_gateway(name: &str, hostname: Option<&str>, port: u16) -> String {
    let hostname = hostname.map_or(String::new(), |h| format!(", hostname: {h}"));
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  gatewayClassName: gatehouse\n  listeners: [{{name: web, port: {port}, protocol: HTTP{hostname}}}]\n"
    )
}

fn team_route(name: &str, gateway: &str, hostname: &str, backend: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  parentRefs: [{{name: {gateway}}}]\n  hostnames: [{hostname}]\n  rules: [{{backendRefs: [{{name: {backend}, port: 80}}]}}]\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_one_port_share_it_or_the_newer_is_told_why_not() {
    let a = echo("team-a").await;
    let b = echo("team-b").await;
    let port = free_port();
    let class = "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: gatehouse}\nspec: {controllerName: gatehouse.dev/gateway-controller}\n";
    let gw = Gateway::start(&[
        ("class.yaml", class.to_string()),
        ("a.yaml", team_gateway("gw-a", Some("a.example.com"), port)),
        ("b.yaml", team_gateway("gw-b", Some("b.example.com"), port)),
        (
            "backends.yaml",
            format!(
                "{}---\n{}",
                service("svc-a", &[a], None),
                service("svc-b", &[b], None)
            ),
        ),
        (
            "routes.yaml",
            format!(
                "{}---\n{}",
                team_route("ra", "gw-a", "a.example.com", "svc-a"),
                team_route("rb", "gw-b", "b.example.com", "svc-b")
            ),
        ),
    ])
    .await;
    let lo: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    let c = builder()
        .resolve("a.example.com", lo)
        .resolve("b.example.com", lo)
        .build()
        .unwrap();
    let name_at = |host: &'static str| {
        let c = c.clone();
        async move {
            let r = c
                .get(format!("http://{host}:{port}/"))
                .send()
                .await
                .unwrap();
            echo_json(r).await["name"].as_str().unwrap().to_string()
        }
    };
    // Distinct hostnames: both Gateways serve on the one socket.
    assert_eq!(name_at("a.example.com").await, "team-a");
    assert_eq!(name_at("b.example.com").await, "team-b");
    let status = gw.status().await;
    for name in ["gw-a", "gw-b"] {
        let g = object(&status, "Gateway", "default", name);
        assert_eq!(
            condition(&listener(g, "web")["conditions"], "Programmed").0,
            "True"
        );
    }

    // gw-b claims the hostname gw-a serves: gw-a (older by name, at equal age) keeps it, and
    // gw-b and its route say so instead of being shadowed in silence.
    gw.write("b.yaml", &team_gateway("gw-b", Some("a.example.com"), port));
    gw.write(
        "routes.yaml",
        &format!(
            "{}---\n{}",
            team_route("ra", "gw-a", "a.example.com", "svc-a"),
            team_route("rb", "gw-b", "a.example.com", "svc-b")
        ),
    );
    // Two files, so possibly two passes: wait for the one that has read both (rb's new
    // hostname), or rb's status may still be the one of its old hostname.
    eventually("gw-b is refused", Duration::from_secs(5), || {
        let gw = &gw;
        async move {
            let status = gw.status().await;
            let g = object(&status, "Gateway", "default", "gw-b");
            let rb = object(&status, "HTTPRoute", "default", "rb");
            condition(&listener(g, "web")["conditions"], "Accepted").0 == "False"
                && rb["spec"]["hostnames"][0] == "a.example.com"
        }
    })
    .await;
    let status = gw.status().await;
    let b = object(&status, "Gateway", "default", "gw-b");
    let (s, reason, message) = condition(&listener(b, "web")["conditions"], "Conflicted");
    assert_eq!((s.as_str(), reason.as_str()), ("True", "HostnameConflict"));
    assert!(
        message.contains("default/gw-a"),
        "names the winner: {message}"
    );
    let (_, reason, _) = condition(&listener(b, "web")["conditions"], "Accepted");
    assert_eq!(reason, "PortUnavailable");
    assert_eq!(
        condition(&listener(b, "web")["conditions"], "Programmed").0,
        "False"
    );
    let rb = object(&status, "HTTPRoute", "default", "rb");
    let (s, reason, message) = condition(&rb["status"]["parents"][0]["conditions"], "Accepted");
    assert_eq!((s.as_str(), reason.as_str()), ("False", "Pending"));
    assert!(
        message.contains("gets no traffic") && message.contains("default/gw-a"),
        "{message}"
    );
    let a_gw = object(&status, "Gateway", "default", "gw-a");
    assert_eq!(
        condition(&listener(a_gw, "web")["conditions"], "Programmed").0,
        "True"
    );
    for _ in 0..10 {
        assert_eq!(
            name_at("a.example.com").await,
            "team-a",
            "the winner serves"
        );
    }
    gw.stop().await;
}
