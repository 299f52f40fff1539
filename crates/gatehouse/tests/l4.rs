//! `gatehouse run` with TCP and UDP listeners: TCPRoute and UDPRoute from manifests, traffic
//! both ways on real sockets, a live edit that keeps an established connection, and a UDP
//! listener that is Programmed only once its socket is bound.

mod support;

use serde_json::Value;
use std::net::SocketAddr;
use std::time::Duration;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

const PATIENCE: Duration = Duration::from_secs(20);

/// A TCP backend that sends `name\n`, then echoes.
async fn tcp_backend(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                conn.write_all(format!("{name}\n").as_bytes()).await?;
                let (mut r, mut w) = conn.split();
                tokio::io::copy(&mut r, &mut w).await
            });
        }
    });
    addr
}

/// A UDP backend that answers `name:payload`.
async fn udp_backend(name: &'static str) -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65536];
        while let Ok((n, peer)) = socket.recv_from(&mut buf).await {
            let answer = format!("{name}:{}", String::from_utf8_lossy(&buf[..n]));
            let _ = socket.send_to(answer.as_bytes(), peer).await;
        }
    });
    addr
}

/// A Service with one port of `protocol` and its EndpointSlice.
fn l4_service(name: &str, protocol: &str, endpoint: SocketAddr) -> String {
    format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  ports: [{{name: p, port: 7000, protocol: {protocol}, targetPort: {port}}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}, namespace: default, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: IPv4\nports: [{{name: p, port: {port}, protocol: {protocol}}}]\nendpoints: [{{addresses: [\"{ip}\"]}}]\n",
        port = endpoint.port(),
        ip = endpoint.ip(),
    )
}

fn gateway_with(listeners: &str) -> String {
    format!(
        "{}---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: gw, namespace: default}}\nspec:\n  gatewayClassName: gatehouse\n  listeners:\n{listeners}",
        gatehouse_testkit::manifests::gateway_class()
    )
}

fn route(kind: &str, name: &str, section: &str, backend: &str) -> String {
    format!(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: {kind}\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  parentRefs: [{{name: gw, sectionName: {section}}}]\n  rules: [{{backendRefs: [{{name: {backend}, port: 7000}}]}}]\n"
    )
}

async fn tcp_name(port: u16) -> (TcpStream, String) {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while tokio::time::timeout(PATIENCE, conn.read_exact(&mut byte))
        .await
        .expect("the backend's name")
        .is_ok()
        && byte[0] != b'\n'
    {
        line.push(byte[0]);
    }
    (conn, String::from_utf8(line).unwrap())
}

async fn udp_ask(port: u16, payload: &str) -> Option<String> {
    let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    client
        .send_to(payload.as_bytes(), ("127.0.0.1", port))
        .await
        .unwrap();
    let mut buf = vec![0u8; 65536];
    let n = tokio::time::timeout(Duration::from_millis(500), client.recv(&mut buf))
        .await
        .ok()?
        .ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

async fn status(gw: &Gateway) -> Value {
    client()
        .get(format!("http://{}/status", gw.admin()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// (status, reason, message) of listener `name`'s `type_` condition.
fn listener_condition(status: &Value, name: &str, type_: &str) -> (String, String, String) {
    let gw = status["objects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["kind"] == "Gateway")
        .unwrap();
    let l = gw["status"]["listeners"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == name)
        .unwrap();
    let c = l["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap();
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    (s("status"), s("reason"), s("message"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_and_udp_routes_serve_from_manifests_and_follow_edits() {
    let (db_a, db_b, dns) = (
        tcp_backend("a").await,
        tcp_backend("b").await,
        udp_backend("dns").await,
    );
    let port = free_port();
    let busy = free_port();
    let squatter = std::net::UdpSocket::bind(("127.0.0.1", busy)).unwrap();
    let listeners = format!(
        "  - {{name: tcp, port: {port}, protocol: TCP}}\n  - {{name: udp, port: {port}, protocol: UDP}}\n  - {{name: busy, port: {busy}, protocol: UDP}}\n"
    );
    let backends = [
        l4_service("db-a", "TCP", db_a),
        l4_service("db-b", "TCP", db_b),
        l4_service("dns", "UDP", dns),
    ]
    .concat();
    let gw = Gateway::start(&[
        ("gateway.yaml", gateway_with(&listeners)),
        ("backends.yaml", backends),
        (
            "routes.yaml",
            route("TCPRoute", "db", "tcp", "db-a") + &route("UDPRoute", "dns", "udp", "dns"),
        ),
    ])
    .await;

    // TCP and UDP on one port number, each to its own route.
    let (mut kept, name) = tcp_name(port).await;
    assert_eq!(name, "a");
    kept.write_all(b"ping").await.unwrap();
    let mut back = [0u8; 4];
    kept.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"ping");
    assert_eq!(udp_ask(port, "q").await.as_deref(), Some("dns:q"));

    // The UDP listener whose port another socket holds is not Programmed, and says why.
    let s = status(&gw).await;
    let (programmed, reason, message) = listener_condition(&s, "busy", "Programmed");
    assert_eq!(
        (programmed.as_str(), reason.as_str()),
        ("False", "Pending"),
        "{message}"
    );
    assert!(message.contains("Address already in use"), "{message}");
    assert_eq!(listener_condition(&s, "udp", "Programmed").0, "True");
    assert_eq!(listener_condition(&s, "tcp", "Programmed").0, "True");
    assert_eq!(listener_condition(&s, "tcp", "Conflicted").1, "NoConflicts");

    // Once the port is free it is bound, and the status follows by itself.
    drop(squatter);
    eventually("the freed UDP port is Programmed", PATIENCE, || async {
        listener_condition(&status(&gw).await, "busy", "Programmed").0 == "True"
    })
    .await;

    // An edit of the route: new connections go to b, the established one stays on a.
    gw.write(
        "routes.yaml",
        &(route("TCPRoute", "db", "tcp", "db-b") + &route("UDPRoute", "dns", "udp", "dns")),
    );
    eventually("new connections reach b", PATIENCE, || async {
        tcp_name(port).await.1 == "b"
    })
    .await;
    kept.write_all(b"pong").await.unwrap();
    kept.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"pong");

    // The route deleted: the listener has none, so its connections end.
    gw.write("routes.yaml", &route("UDPRoute", "dns", "udp", "dns"));
    let mut rest = Vec::new();
    let end = tokio::time::timeout(PATIENCE, kept.read_to_end(&mut rest)).await;
    assert!(end.is_ok(), "a connection of a deleted route stayed open");
    gw.stop().await;
}
