//! Session resumption across applies and under many clients.

use crate::support::*;
use gatehouse_dataplane::Options;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_resume_across_unrelated_applies_but_not_across_a_new_certificate() {
    let a = start_http_backend("a").await;
    let b = start_http_backend("b").await;
    let ca = Ca::new("test ca");
    let port = free_port();
    let cfg = |backend: &str, pair: &Pair| {
        config_with_certificates(
            vec![https_listener(
                "web",
                port,
                Some("cafe.example.com"),
                "default/cafe",
                backend,
            )],
            vec![http1("a", vec![a]), http1("b", vec![b])],
            vec![pair.certificate("default/cafe")],
        )
    };
    let first = ca.server(&["cafe.example.com"], 1);
    let (dp, _) = dataplane(Options::default()).await;
    apply_ok(&dp, &cfg("a", &first)).await;
    let client = client_config(&[&ca.pem], &[b"http/1.1"], None);
    let kind = |s: &TlsStream<TcpStream>| s.get_ref().1.handshake_kind();

    // The request lets the client read the session tickets sent after the handshake.
    let stream = connect(port, "cafe.example.com", &client).await.unwrap();
    assert_eq!(kind(&stream), Some(rustls::HandshakeKind::Full));
    assert_eq!(
        get_on(stream, "cafe.example.com", "/")
            .await
            .unwrap()
            .field("backend"),
        "a"
    );

    // Routes change, TLS settings do not: the listener keeps its configuration and sessions.
    apply_ok(&dp, &cfg("b", &first)).await;
    let stream = connect(port, "cafe.example.com", &client).await.unwrap();
    assert_eq!(kind(&stream), Some(rustls::HandshakeKind::Resumed));
    assert_eq!(
        get_on(stream, "cafe.example.com", "/")
            .await
            .unwrap()
            .field("backend"),
        "b"
    );

    // A new certificate means a new configuration: full handshakes with the new certificate.
    apply_ok(&dp, &cfg("b", &ca.server(&["cafe.example.com"], 2))).await;
    let stream = connect(port, "cafe.example.com", &client).await.unwrap();
    assert_eq!(kind(&stream), Some(rustls::HandshakeKind::Full));
    assert_eq!(leaf_of(&stream).serial, 2);
    dp.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_resume_after_hundreds_of_other_clients() {
    let be = start_http_backend("a").await;
    let ca = Ca::new("test ca");
    let port = free_port();
    let cfg = config_with_certificates(
        vec![https_listener(
            "https",
            port,
            Some("svc.example.com"),
            "default/svc",
            "a",
        )],
        vec![http1("a", vec![be])],
        vec![
            ca.server(&["svc.example.com"], 1)
                .certificate("default/svc"),
        ],
    );
    let (dp, _) = dataplane(Options::default()).await;
    apply_ok(&dp, &cfg).await;
    // Each ClientConfig keeps its own sessions: these are distinct clients to the server.
    let first = client_config(&[&ca.pem], &[], None);
    let answer = https_get(port, "svc.example.com", &first, "/")
        .await
        .unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    let resumed = connect(port, "svc.example.com", &first).await.unwrap();
    assert_eq!(
        resumed.get_ref().1.handshake_kind(),
        Some(rustls::HandshakeKind::Resumed)
    );
    drop(resumed);
    // More clients than a server-side session cache of 256 entries (two tickets each) keeps.
    for _ in 0..300 {
        let other = client_config(&[&ca.pem], &[], None);
        https_get(port, "svc.example.com", &other, "/")
            .await
            .unwrap();
    }
    let stream = connect(port, "svc.example.com", &first).await.unwrap();
    assert_eq!(
        stream.get_ref().1.handshake_kind(),
        Some(rustls::HandshakeKind::Resumed),
        "the first client's session was forgotten"
    );
    let answer = get_on(stream, "svc.example.com", "/").await.unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    dp.shutdown(Duration::from_secs(1)).await;
}
