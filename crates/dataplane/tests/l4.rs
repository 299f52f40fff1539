//! TCP and UDP listeners (TCPRoute, UDPRoute) over real sockets: forwarding both ways,
//! half-close, weights, limits, backends that are down, and configuration swaps.

mod common;

use common::*;
use gatehouse_dataplane::{Options, Transport};
use gatehouse_ir::{Config, WeightedBackend};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

/// Long enough for anything that should happen on loopback; tests wait for events up to it,
/// they never assert how long something took.
const PATIENCE: Duration = Duration::from_secs(10);

/// A TCP backend that sends `name\n` on every connection, then echoes what it reads until the
/// client ends its side, then closes.
async fn tcp_backend(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                conn.write_all(format!("{name}\n").as_bytes()).await?;
                let (mut r, mut w) = conn.split();
                tokio::io::copy(&mut r, &mut w).await?;
                w.shutdown().await
            });
        }
    });
    addr
}

/// A UDP backend that answers every datagram with `name peer payload` (peer: the source
/// address it saw, which is the session's socket on the gateway).
async fn udp_backend(name: &'static str) -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65536];
        loop {
            let Ok((n, peer)) = socket.recv_from(&mut buf).await else {
                return;
            };
            let answer = format!("{name} {peer} {}", String::from_utf8_lossy(&buf[..n]));
            let _ = socket.send_to(answer.as_bytes(), peer).await;
        }
    });
    addr
}

/// A port nothing listens on (TCP: refused; UDP: ICMP port unreachable).
fn closed_port() -> SocketAddr {
    SocketAddr::new(LOCALHOST, free_port())
}

fn tcp_config(
    port: u16,
    backends: Vec<WeightedBackend>,
    clusters: Vec<(&str, Vec<SocketAddr>)>,
) -> Config {
    config(
        vec![tcp_listener(port, Some(("db", backends)))],
        clusters
            .into_iter()
            .map(|(n, e)| tcp_cluster(n, e))
            .collect(),
    )
}

fn udp_config(
    port: u16,
    route: &str,
    backends: Vec<WeightedBackend>,
    clusters: Vec<(&str, Vec<SocketAddr>)>,
) -> Config {
    config(
        vec![udp_listener(port, Some((route, backends)))],
        clusters
            .into_iter()
            .map(|(n, e)| udp_cluster(n, e))
            .collect(),
    )
}

/// Connects through the gateway and reads the backend's name line.
async fn tcp_connect(port: u16) -> (TcpStream, String) {
    let mut conn = TcpStream::connect((LOCALHOST, port)).await.unwrap();
    let mut name = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        let n = tokio::time::timeout(PATIENCE, conn.read(&mut byte))
            .await
            .expect("the backend's name in time")
            .unwrap();
        assert_eq!(n, 1, "connection closed before the backend's name");
        if byte[0] == b'\n' {
            break;
        }
        name.push(byte[0]);
    }
    (conn, String::from_utf8(name).unwrap())
}

async fn echo(conn: &mut TcpStream, message: &[u8]) -> Vec<u8> {
    conn.write_all(message).await.unwrap();
    let mut back = vec![0u8; message.len()];
    tokio::time::timeout(PATIENCE, conn.read_exact(&mut back))
        .await
        .expect("the echo in time")
        .unwrap();
    back
}

/// Waits until `conn` is closed by the other side (EOF or reset).
async fn closed(conn: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    loop {
        match tokio::time::timeout(PATIENCE, conn.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// Sends `payload` from `client` through the gateway and returns the answer, if one comes
/// within `wait`.
async fn udp_ask(client: &UdpSocket, port: u16, payload: &str, wait: Duration) -> Option<String> {
    client
        .send_to(payload.as_bytes(), (LOCALHOST, port))
        .await
        .unwrap();
    let mut buf = vec![0u8; 65536];
    let (n, from) = tokio::time::timeout(wait, client.recv_from(&mut buf))
        .await
        .ok()?
        .ok()?;
    assert_eq!(
        from,
        SocketAddr::new(LOCALHOST, port),
        "answers come from the listener"
    );
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

async fn udp_client() -> UdpSocket {
    UdpSocket::bind("127.0.0.1:0").await.unwrap()
}

/// Polls a metric until `done` holds for it.
async fn wait_metric(
    registry: &prometheus_client::registry::Registry,
    sample: &str,
    done: impl Fn(f64) -> bool,
) -> f64 {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let value = metric(registry, sample);
        if done(value) || tokio::time::Instant::now() > deadline {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn tcp_bytes_go_both_ways_and_are_counted() {
    let backend = tcp_backend("a").await;
    let port = free_port();
    let (dp, registry) = dataplane(Options::default()).await;
    apply_ok(
        &dp,
        &tcp_config(port, vec![to_cluster("a")], vec![("a", vec![backend])]),
    )
    .await;

    let (mut conn, name) = tcp_connect(port).await;
    assert_eq!(name, "a");
    let big = vec![7u8; 1 << 20];
    assert_eq!(echo(&mut conn, b"hello").await, b"hello");
    assert_eq!(echo(&mut conn, &big).await, big);
    let labels = r#"{gateway="default/gw",route="default/db""#;
    assert_eq!(
        metric(
            &registry,
            &format!("gatehouse_tcp_connections_total{labels}}}")
        ),
        1.0
    );
    assert_eq!(
        metric(
            &registry,
            &format!("gatehouse_tcp_connections_active{labels}}}")
        ),
        1.0
    );
    let to_backend = format!("gatehouse_tcp_bytes_total{labels},direction=\"to_backend\"}}");
    assert_eq!(metric(&registry, &to_backend), (5 + big.len()) as f64);
    drop(conn);
    let active = format!("gatehouse_tcp_connections_active{labels}}}");
    assert_eq!(wait_metric(&registry, &active, |v| v == 0.0).await, 0.0);
}

#[tokio::test]
async fn tcp_half_close_reaches_the_backend_and_its_answer_still_comes_back() {
    // A backend that reads to the end of the client's stream, then answers and closes.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut all = Vec::new();
        conn.read_to_end(&mut all).await.unwrap();
        conn.write_all(format!("read {} bytes", all.len()).as_bytes())
            .await
            .unwrap();
        conn.shutdown().await.unwrap();
    });
    let port = free_port();
    let (dp, _registry) = dataplane(Options::default()).await;
    apply_ok(
        &dp,
        &tcp_config(port, vec![to_cluster("a")], vec![("a", vec![backend])]),
    )
    .await;

    let mut conn = TcpStream::connect((LOCALHOST, port)).await.unwrap();
    conn.write_all(&[1u8; 100_000]).await.unwrap();
    conn.shutdown().await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(PATIENCE, conn.read_to_string(&mut answer))
        .await
        .expect("the answer after the half-close")
        .unwrap();
    assert_eq!(answer, "read 100000 bytes");
}

#[tokio::test]
async fn tcp_connections_split_by_weight_and_weight_zero_gets_none() {
    let (a, b, c) = (
        tcp_backend("a").await,
        tcp_backend("b").await,
        tcp_backend("c").await,
    );
    let port = free_port();
    let (dp, _registry) = dataplane(Options::default()).await;
    let backends = vec![weighted("a", 3), weighted("b", 1), weighted("c", 0)];
    let clusters = vec![("a", vec![a]), ("b", vec![b]), ("c", vec![c])];
    apply_ok(&dp, &tcp_config(port, backends, clusters)).await;

    let mut seen: HashMap<String, u32> = HashMap::new();
    for _ in 0..400 {
        let (_, name) = tcp_connect(port).await;
        *seen.entry(name).or_default() += 1;
    }
    // 300 expected for a (standard deviation under 9): far outside these bounds is a bug.
    let a = seen.get("a").copied().unwrap_or(0);
    assert!((250..=350).contains(&a), "{seen:?}");
    assert_eq!(seen.get("c"), None, "weight 0 was picked: {seen:?}");
    assert_eq!(a + seen.get("b").copied().unwrap_or(0), 400);
}

#[tokio::test]
async fn an_idle_tcp_connection_is_closed_on_both_sides() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = listener.local_addr().unwrap();
    let (backend_closed, closed_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 16];
        let end = conn.read(&mut buf).await;
        let _ = backend_closed.send(matches!(end, Ok(0) | Err(_)));
    });
    let port = free_port();
    let options = Options {
        tunnel_idle_timeout: Duration::from_millis(300),
        ..Options::default()
    };
    let (dp, registry) = dataplane(options).await;
    apply_ok(
        &dp,
        &tcp_config(port, vec![to_cluster("a")], vec![("a", vec![backend])]),
    )
    .await;

    let mut conn = TcpStream::connect((LOCALHOST, port)).await.unwrap();
    assert!(closed(&mut conn).await, "the idle connection stayed open");
    let backend_saw_close = tokio::time::timeout(PATIENCE, closed_rx)
        .await
        .unwrap()
        .unwrap();
    assert!(backend_saw_close);
    assert_eq!(
        metric(&registry, r#"gatehouse_timeouts_total{kind="tunnel_idle"}"#),
        1.0
    );
}

#[tokio::test]
async fn tcp_goes_to_another_endpoint_when_one_is_down_and_closes_when_all_are() {
    let live = tcp_backend("live").await;
    let down = closed_port();
    let port = free_port();
    let (dp, registry) = dataplane(Options::default()).await;
    apply_ok(
        &dp,
        &tcp_config(port, vec![to_cluster("a")], vec![("a", vec![down, live])]),
    )
    .await;
    for _ in 0..10 {
        let (_, name) = tcp_connect(port).await;
        assert_eq!(name, "live");
    }
    assert!(
        metric(
            &registry,
            r#"gatehouse_upstream_connect_failures_total{cluster="a"}"#
        ) >= 1.0
    );

    apply_ok(
        &dp,
        &tcp_config(port, vec![to_cluster("a")], vec![("a", vec![down])]),
    )
    .await;
    let mut conn = TcpStream::connect((LOCALHOST, port)).await.unwrap();
    assert!(closed(&mut conn).await);
    let errors = r#"gatehouse_l4_errors_total{protocol="tcp",reason="connect"}"#;
    assert_eq!(wait_metric(&registry, errors, |v| v >= 1.0).await, 1.0);
}

#[tokio::test]
async fn tcp_without_a_route_or_backend_is_closed_and_counted() {
    let port = free_port();
    let (dp, registry) = dataplane(Options::default()).await;
    apply_ok(&dp, &config(vec![tcp_listener(port, None)], vec![])).await;
    let mut conn = TcpStream::connect((LOCALHOST, port)).await.unwrap();
    assert!(closed(&mut conn).await);
    assert_eq!(
        metric(
            &registry,
            r#"gatehouse_l4_errors_total{protocol="tcp",reason="no_route"}"#
        ),
        1.0
    );

    // An invalid backend (translate reported it) or a cluster without endpoints.
    let invalid = WeightedBackend {
        weight: 1,
        target: gatehouse_ir::BackendTarget::Invalid {
            reason: "Service not found".into(),
        },
        filters: vec![],
    };
    apply_ok(
        &dp,
        &tcp_config(
            port,
            vec![invalid, to_cluster("empty")],
            vec![("empty", vec![])],
        ),
    )
    .await;
    for _ in 0..4 {
        let mut conn = TcpStream::connect((LOCALHOST, port)).await.unwrap();
        assert!(closed(&mut conn).await);
    }
    assert_eq!(
        metric(
            &registry,
            r#"gatehouse_l4_errors_total{protocol="tcp",reason="no_backend"}"#
        ),
        4.0
    );
}

#[tokio::test]
async fn a_swap_keeps_tcp_connections_whose_route_stays_and_closes_the_others() {
    let (a, b) = (tcp_backend("a").await, tcp_backend("b").await);
    let port = free_port();
    let (dp, _registry) = dataplane(Options::default()).await;
    apply_ok(
        &dp,
        &tcp_config(port, vec![to_cluster("a")], vec![("a", vec![a])]),
    )
    .await;
    let (mut kept, _) = tcp_connect(port).await;

    // Same route, other backends: established connections stay where they are, new ones
    // follow the new configuration.
    apply_ok(
        &dp,
        &tcp_config(port, vec![to_cluster("b")], vec![("b", vec![b])]),
    )
    .await;
    assert_eq!(echo(&mut kept, b"still here").await, b"still here");
    let (_, name) = tcp_connect(port).await;
    assert_eq!(name, "b");

    // Another route on the listener: the old route's connections end.
    let other = config(
        vec![tcp_listener(port, Some(("other", vec![to_cluster("b")])))],
        vec![tcp_cluster("b", vec![b])],
    );
    apply_ok(&dp, &other).await;
    assert!(
        closed(&mut kept).await,
        "a connection of a removed route stayed open"
    );
    let (mut new, _) = tcp_connect(port).await;

    // The listener removed: its connections end too.
    apply_ok(&dp, &config(vec![], vec![])).await;
    assert!(closed(&mut new).await);
}

#[tokio::test]
async fn udp_datagrams_go_both_ways_and_are_counted() {
    let backend = udp_backend("a").await;
    let port = free_port();
    let (dp, registry) = dataplane(Options::default()).await;
    apply_ok(
        &dp,
        &udp_config(
            port,
            "dns",
            vec![to_cluster("a")],
            vec![("a", vec![backend])],
        ),
    )
    .await;

    let client = udp_client().await;
    let answer = udp_ask(&client, port, "ping", PATIENCE)
        .await
        .expect("an answer");
    assert!(
        answer.starts_with("a ") && answer.ends_with(" ping"),
        "{answer}"
    );
    let big = "x".repeat(60_000);
    let answer = udp_ask(&client, port, &big, PATIENCE)
        .await
        .expect("a large answer");
    assert!(answer.ends_with(&big), "a large datagram was cut");

    let labels = r#"{gateway="default/gw",route="default/dns""#;
    assert_eq!(
        metric(
            &registry,
            &format!("gatehouse_udp_sessions_total{labels}}}")
        ),
        1.0
    );
    assert_eq!(
        metric(
            &registry,
            &format!("gatehouse_udp_sessions_active{labels}}}")
        ),
        1.0
    );
    let sample = format!("gatehouse_udp_datagrams_total{labels},direction=\"to_client\"}}");
    assert_eq!(metric(&registry, &sample), 2.0);
    let sample = format!("gatehouse_udp_bytes_total{labels},direction=\"to_backend\"}}");
    assert_eq!(metric(&registry, &sample), (4 + big.len()) as f64);
}

#[tokio::test]
async fn each_udp_client_is_a_session_with_its_own_socket_to_the_backend() {
    let backend = udp_backend("a").await;
    let port = free_port();
    let (dp, _registry) = dataplane(Options::default()).await;
    apply_ok(
        &dp,
        &udp_config(
            port,
            "dns",
            vec![to_cluster("a")],
            vec![("a", vec![backend])],
        ),
    )
    .await;

    let upstream_of = |answer: String| answer.split(' ').nth(1).unwrap().to_string();
    let (one, two) = (udp_client().await, udp_client().await);
    let first = upstream_of(udp_ask(&one, port, "1", PATIENCE).await.unwrap());
    let again = upstream_of(udp_ask(&one, port, "2", PATIENCE).await.unwrap());
    let other = upstream_of(udp_ask(&two, port, "3", PATIENCE).await.unwrap());
    assert_eq!(
        first, again,
        "one client's datagrams went through different sockets"
    );
    assert_ne!(first, other, "two clients shared a session");
}

#[tokio::test]
async fn an_idle_udp_session_ends_and_the_next_datagram_starts_another() {
    let backend = udp_backend("a").await;
    let port = free_port();
    let options = Options {
        udp_idle_timeout: Duration::from_millis(200),
        ..Options::default()
    };
    let (dp, registry) = dataplane(options).await;
    apply_ok(
        &dp,
        &udp_config(
            port,
            "dns",
            vec![to_cluster("a")],
            vec![("a", vec![backend])],
        ),
    )
    .await;

    let client = udp_client().await;
    udp_ask(&client, port, "1", PATIENCE).await.unwrap();
    let active = r#"gatehouse_udp_sessions_active{gateway="default/gw",route="default/dns"}"#;
    assert_eq!(metric(&registry, active), 1.0);
    assert_eq!(
        wait_metric(&registry, active, |v| v == 0.0).await,
        0.0,
        "the session never expired"
    );
    udp_ask(&client, port, "2", PATIENCE).await.unwrap();
    let total = r#"gatehouse_udp_sessions_total{gateway="default/gw",route="default/dns"}"#;
    assert_eq!(metric(&registry, total), 2.0);
}

#[tokio::test]
async fn udp_sessions_split_by_weight_and_weight_zero_gets_none() {
    let (a, b, c) = (
        udp_backend("a").await,
        udp_backend("b").await,
        udp_backend("c").await,
    );
    let port = free_port();
    let (dp, _registry) = dataplane(Options::default()).await;
    let backends = vec![weighted("a", 3), weighted("b", 1), weighted("c", 0)];
    let clusters = vec![("a", vec![a]), ("b", vec![b]), ("c", vec![c])];
    apply_ok(&dp, &udp_config(port, "dns", backends, clusters)).await;

    let mut seen: HashMap<String, u32> = HashMap::new();
    for _ in 0..400 {
        // A new socket per probe: a new client, a new session, a new pick.
        let answer = udp_ask(&udp_client().await, port, "w", PATIENCE)
            .await
            .unwrap();
        *seen
            .entry(answer.split(' ').next().unwrap().to_string())
            .or_default() += 1;
    }
    let a = seen.get("a").copied().unwrap_or(0);
    assert!((250..=350).contains(&a), "{seen:?}");
    assert_eq!(seen.get("c"), None, "weight 0 was picked: {seen:?}");
}

#[tokio::test]
async fn udp_sessions_are_bounded() {
    let backend = udp_backend("a").await;
    let port = free_port();
    let options = Options {
        udp_max_sessions: 2,
        ..Options::default()
    };
    let (dp, registry) = dataplane(options).await;
    apply_ok(
        &dp,
        &udp_config(
            port,
            "dns",
            vec![to_cluster("a")],
            vec![("a", vec![backend])],
        ),
    )
    .await;

    let clients = [udp_client().await, udp_client().await, udp_client().await];
    assert!(udp_ask(&clients[0], port, "1", PATIENCE).await.is_some());
    assert!(udp_ask(&clients[1], port, "2", PATIENCE).await.is_some());
    assert!(
        udp_ask(&clients[2], port, "3", Duration::from_millis(300))
            .await
            .is_none()
    );
    let limit = r#"gatehouse_l4_errors_total{protocol="udp",reason="session_limit"}"#;
    assert_eq!(metric(&registry, limit), 1.0);
    // The sessions in place keep working.
    assert!(udp_ask(&clients[0], port, "4", PATIENCE).await.is_some());
}

#[tokio::test]
async fn a_refusing_udp_backend_ends_the_session_and_the_client_moves_on() {
    let live = udp_backend("live").await;
    let down = closed_port();
    let port = free_port();
    let (dp, registry) = dataplane(Options::default()).await;
    apply_ok(
        &dp,
        &udp_config(port, "dns", vec![to_cluster("a")], vec![("a", vec![down])]),
    )
    .await;
    let client = udp_client().await;
    assert!(
        udp_ask(&client, port, "1", Duration::from_millis(300))
            .await
            .is_none()
    );
    let refused = r#"gatehouse_l4_errors_total{protocol="udp",reason="refused"}"#;
    assert!(
        wait_metric(&registry, refused, |v| v >= 1.0).await >= 1.0,
        "the ICMP refusal was not seen"
    );

    // Both endpoints: the refused one is ejected after its failures, and the same client's
    // datagrams reach the live one within a few tries.
    apply_ok(
        &dp,
        &udp_config(
            port,
            "dns",
            vec![to_cluster("a")],
            vec![("a", vec![down, live])],
        ),
    )
    .await;
    let mut answered = 0;
    for i in 0..20 {
        if let Some(answer) =
            udp_ask(&client, port, &i.to_string(), Duration::from_millis(300)).await
        {
            assert!(answer.starts_with("live "));
            answered += 1;
        }
    }
    assert!(answered >= 15, "only {answered} of 20 answered");
}

#[tokio::test]
async fn a_swap_keeps_udp_sessions_whose_route_and_endpoint_stay() {
    let (a, b) = (udp_backend("a").await, udp_backend("b").await);
    let port = free_port();
    let (dp, registry) = dataplane(Options::default()).await;
    let clusters = || vec![("a", vec![a]), ("b", vec![b])];
    apply_ok(
        &dp,
        &udp_config(
            port,
            "dns",
            vec![weighted("a", 1), weighted("b", 0)],
            clusters(),
        ),
    )
    .await;
    let client = udp_client().await;
    let first = udp_ask(&client, port, "1", PATIENCE).await.unwrap();
    assert!(first.starts_with("a "));

    // The same route still reaching a: the session (and its socket) stays, although new
    // sessions now go to b.
    apply_ok(
        &dp,
        &udp_config(
            port,
            "dns",
            vec![weighted("a", 1), weighted("b", 9)],
            clusters(),
        ),
    )
    .await;
    let kept = udp_ask(&client, port, "2", PATIENCE).await.unwrap();
    assert_eq!(
        kept.split(' ').nth(1),
        first.split(' ').nth(1),
        "the session was replaced"
    );

    // a no longer among the route's backends: the session ends, the next datagram goes to b.
    apply_ok(
        &dp,
        &udp_config(port, "dns", vec![weighted("b", 1)], clusters()),
    )
    .await;
    let moved = udp_ask(&client, port, "3", PATIENCE).await.unwrap();
    assert!(moved.starts_with("b "), "{moved}");

    // Another route: every session ends.
    apply_ok(
        &dp,
        &udp_config(port, "other", vec![weighted("b", 1)], clusters()),
    )
    .await;
    let active = r#"gatehouse_udp_sessions_active{gateway="default/gw",route="default/dns"}"#;
    assert_eq!(wait_metric(&registry, active, |v| v == 0.0).await, 0.0);
}

#[tokio::test]
async fn tcp_and_udp_listeners_share_a_port_number() {
    let (t, u) = (tcp_backend("tcp").await, udp_backend("udp").await);
    let port = free_port();
    let (dp, _registry) = dataplane(Options::default()).await;
    let cfg = config(
        vec![
            tcp_listener(port, Some(("t", vec![to_cluster("t")]))),
            udp_listener(port, Some(("u", vec![to_cluster("u")]))),
        ],
        vec![tcp_cluster("t", vec![t]), udp_cluster("u", vec![u])],
    );
    apply_ok(&dp, &cfg).await;
    assert_eq!(
        dp.bound_udp_addresses(),
        vec![SocketAddr::new(LOCALHOST, port)]
    );
    assert_eq!(tcp_connect(port).await.1, "tcp");
    let answer = udp_ask(&udp_client().await, port, "x", PATIENCE)
        .await
        .unwrap();
    assert!(answer.starts_with("udp "));
}

#[tokio::test]
async fn a_udp_port_in_use_is_reported_unbound_and_bound_once_free() {
    let port = free_port();
    let squatter = std::net::UdpSocket::bind((LOCALHOST, port)).unwrap();
    let (dp, _registry) = dataplane(Options::default()).await;
    let report = dp
        .apply(&config(vec![udp_listener(port, None)], vec![]))
        .await;
    assert_eq!(report.bind_errors.len(), 1);
    let unbound = dp.unbound();
    assert_eq!(unbound.len(), 1);
    assert_eq!(unbound[0].transport, Transport::Udp);
    assert_eq!(unbound[0].address, SocketAddr::new(LOCALHOST, port));
    drop(squatter);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !dp.unbound().is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(dp.unbound().is_empty(), "the retried bind never succeeded");
    assert_eq!(
        dp.bound_udp_addresses(),
        vec![SocketAddr::new(LOCALHOST, port)]
    );
}
