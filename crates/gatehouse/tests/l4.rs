//! `gatehouse run` with TCP and UDP listeners: TCPRoute and UDPRoute from manifests, traffic
//! both ways on real sockets, a live edit that keeps an established connection, a UDP
//! listener that is Programmed only once its socket is bound, weighted backends, UDP sessions
//! per client address and port, idle timeouts on both, and the status of invalid routes.

mod support;

use serde_json::Value;
use std::collections::BTreeMap;
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

/// A UDP backend that answers `name:<client port it saw>`, so a client can tell which session
/// (which socket of the gateway's) carried its datagram.
async fn udp_session_backend(name: &'static str) -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65536];
        while let Ok((_, peer)) = socket.recv_from(&mut buf).await {
            let _ = socket
                .send_to(format!("{name}:{}", peer.port()).as_bytes(), peer)
                .await;
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

/// A route whose one rule splits between `backends` (name, weight).
fn weighted_route(kind: &str, name: &str, section: &str, backends: &[(&str, u32)]) -> String {
    let refs: Vec<String> = backends
        .iter()
        .map(|(b, w)| format!("{{name: {b}, port: 7000, weight: {w}}}"))
        .collect();
    format!(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: {kind}\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  parentRefs: [{{name: gw, sectionName: {section}}}]\n  rules: [{{backendRefs: [{}]}}]\n",
        refs.join(", ")
    )
}

/// Which backend each of `n` new connections reached, counted by name.
async fn tcp_names(port: u16, n: usize) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for _ in 0..n {
        *seen.entry(tcp_name(port).await.1).or_default() += 1;
    }
    seen
}

/// One datagram from `client` to the gateway's `port`, and the answer.
async fn udp_from(client: &UdpSocket, port: u16, payload: &str) -> Option<String> {
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

/// The `type_` condition of route `name`'s first parent, as (status, reason).
fn route_condition(status: &Value, kind: &str, name: &str, type_: &str) -> (String, String) {
    let route = status["objects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{kind} {name} in /status"));
    let c = route["status"]["parents"][0]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("{kind} {name} has no {type_} condition: {route}"));
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    (s("status"), s("reason"))
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
    udp_from(&client, port, payload).await
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
    let s = gw.status().await;
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
        listener_condition(&gw.status().await, "busy", "Programmed").0 == "True"
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_backends_split_tcp_connections_and_udp_sessions() {
    let (a, b, c) = (
        tcp_backend("a").await,
        tcp_backend("b").await,
        tcp_backend("c").await,
    );
    let (x, y, z) = (
        udp_session_backend("x").await,
        udp_session_backend("y").await,
        udp_session_backend("z").await,
    );
    let port = free_port();
    let listeners = format!(
        "  - {{name: tcp, port: {port}, protocol: TCP}}\n  - {{name: udp, port: {port}, protocol: UDP}}\n"
    );
    let backends = [
        l4_service("a", "TCP", a),
        l4_service("b", "TCP", b),
        l4_service("c", "TCP", c),
        l4_service("x", "UDP", x),
        l4_service("y", "UDP", y),
        l4_service("z", "UDP", z),
    ]
    .concat();
    let routes = weighted_route("TCPRoute", "db", "tcp", &[("a", 3), ("b", 1), ("c", 0)])
        + &weighted_route("UDPRoute", "dns", "udp", &[("x", 3), ("y", 1), ("z", 0)]);
    let gw = Gateway::start(&[
        ("gateway.yaml", gateway_with(&listeners)),
        ("backends.yaml", backends),
        ("routes.yaml", routes),
    ])
    .await;

    // 200 connections at 3:1:0: a gets about 150 (±5 standard deviations if the pick were
    // random), b the rest, c none.
    let tcp = tcp_names(port, 200).await;
    let (on_a, on_b) = (tcp.get("a").copied(), tcp.get("b").copied());
    assert!(!tcp.contains_key("c"), "weight 0 got connections: {tcp:?}");
    assert!(matches!(on_a, Some(120..=180)), "{tcp:?}");
    assert_eq!(on_a.unwrap() + on_b.unwrap_or(0), 200, "{tcp:?}");

    // 200 UDP clients, each its own session: the same split.
    let mut udp: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..200 {
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let answer = udp_from(&client, port, &format!("q{i}"))
            .await
            .expect("an answer for every new session");
        let name = answer.split(':').next().unwrap().to_string();
        *udp.entry(name).or_default() += 1;
    }
    assert!(!udp.contains_key("z"), "weight 0 got sessions: {udp:?}");
    assert!(matches!(udp.get("x"), Some(120..=180)), "{udp:?}");
    assert_eq!(udp.values().sum::<usize>(), 200, "{udp:?}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_sessions_follow_the_client_port_and_idle_sessions_and_connections_end() {
    const UDP_IDLE: Duration = Duration::from_millis(400);
    const TCP_IDLE: Duration = Duration::from_millis(600);
    let (db, dns) = (tcp_backend("db").await, udp_session_backend("dns").await);
    let port = free_port();
    let listeners = format!(
        "  - {{name: tcp, port: {port}, protocol: TCP}}\n  - {{name: udp, port: {port}, protocol: UDP}}\n"
    );
    let gw = Gateway::start_with(
        &[
            ("gateway.yaml", gateway_with(&listeners)),
            (
                "backends.yaml",
                l4_service("db", "TCP", db) + &l4_service("dns", "UDP", dns),
            ),
            (
                "routes.yaml",
                route("TCPRoute", "db", "tcp", "db") + &route("UDPRoute", "dns", "udp", "dns"),
            ),
        ],
        |o| {
            o.udp_idle_timeout = UDP_IDLE;
            o.tunnel_idle_timeout = TCP_IDLE;
        },
    )
    .await;

    // A session is one client address and port: the same client socket keeps its session (the
    // backend sees one gateway socket), another client port gets another.
    let one = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let two = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let first = udp_from(&one, port, "a").await.expect("answer");
    // Datagrams closer together than the idle timeout keep the session alive past it.
    for _ in 0..6 {
        tokio::time::sleep(UDP_IDLE / 4).await;
        assert_eq!(
            udp_from(&one, port, "b").await.as_deref(),
            Some(first.as_str())
        );
    }
    let other = udp_from(&two, port, "c").await.expect("answer");
    assert_ne!(first, other, "two client ports shared a session");

    // Idle past the timeout, the session ends: the next datagram starts a new one.
    tokio::time::sleep(UDP_IDLE * 3).await;
    let again = udp_from(&one, port, "d")
        .await
        .expect("answer after the idle end");
    assert_ne!(first, again, "the idle session was still there");

    // TCP: a connection that moves bytes more often than the idle timeout stays open past it;
    // once quiet, the gateway closes it (and the backend side with it).
    let (mut conn, name) = tcp_name(port).await;
    assert_eq!(name, "db");
    let mut back = [0u8; 1];
    for _ in 0..6 {
        tokio::time::sleep(TCP_IDLE / 3).await;
        conn.write_all(b"k").await.unwrap();
        conn.read_exact(&mut back).await.unwrap();
    }
    let quiet = std::time::Instant::now();
    let mut rest = Vec::new();
    let end = tokio::time::timeout(PATIENCE, conn.read_to_end(&mut rest)).await;
    assert!(end.is_ok(), "an idle TCP connection stayed open");
    assert!(rest.is_empty(), "unexpected bytes {rest:?}");
    assert!(
        quiet.elapsed() >= TCP_IDLE - Duration::from_millis(50),
        "closed after {:?}, before the idle timeout",
        quiet.elapsed()
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_l4_routes_get_conditions_and_serving_follows_the_fix() {
    let (db, dns) = (tcp_backend("db").await, udp_backend("dns").await);
    let (port, web) = (free_port(), free_port());
    let listeners = format!(
        "  - {{name: web, port: {web}, protocol: HTTP}}\n  - {{name: tcp, port: {port}, protocol: TCP}}\n  - {{name: udp, port: {port}, protocol: UDP}}\n"
    );
    let broken = route("TCPRoute", "db", "tcp", "nonexistent")
        + &route("UDPRoute", "dns", "udp", "dns")
        + &route("UDPRoute", "astray", "web", "dns");
    let gw = Gateway::start(&[
        ("gateway.yaml", gateway_with(&listeners)),
        (
            "backends.yaml",
            l4_service("db", "TCP", db) + &l4_service("dns", "UDP", dns),
        ),
        ("routes.yaml", broken),
    ])
    .await;

    let s = gw.status().await;
    // A backend that does not exist: Accepted, refs not resolved.
    assert_eq!(
        route_condition(&s, "TCPRoute", "db", "ResolvedRefs"),
        ("False".into(), "BackendNotFound".into())
    );
    assert_eq!(route_condition(&s, "TCPRoute", "db", "Accepted").0, "True");
    // A UDPRoute on an HTTP listener is not allowed there.
    assert_eq!(
        route_condition(&s, "UDPRoute", "astray", "Accepted"),
        ("False".into(), "NotAllowedByListeners".into())
    );
    assert_eq!(route_condition(&s, "UDPRoute", "dns", "Accepted").0, "True");

    // The TCP listener has a route but no backend: connections are closed, nothing sent. The
    // valid UDPRoute on the same port number serves.
    let mut conn = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut rest = Vec::new();
    let end = tokio::time::timeout(PATIENCE, conn.read_to_end(&mut rest)).await;
    assert!(end.is_ok(), "a connection without a backend stayed open");
    assert!(rest.is_empty());
    assert_eq!(udp_ask(port, "q").await.as_deref(), Some("dns:q"));

    // Fixed: the route resolves and serves.
    gw.write(
        "routes.yaml",
        &(route("TCPRoute", "db", "tcp", "db") + &route("UDPRoute", "dns", "udp", "dns")),
    );
    eventually("the fixed TCPRoute serves", PATIENCE, || async {
        tokio::time::timeout(Duration::from_secs(2), tcp_name(port))
            .await
            .is_ok_and(|(_, name)| name == "db")
    })
    .await;
    assert_eq!(
        route_condition(&gw.status().await, "TCPRoute", "db", "ResolvedRefs").0,
        "True"
    );
    gw.stop().await;
}
