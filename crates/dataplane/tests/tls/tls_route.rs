//! TLSRoute: Passthrough to a TLS backend, Terminate to a TCP backend, and both beside an
//! HTTPS listener on one port.

use crate::support::*;
use gatehouse_dataplane::Options;
use gatehouse_ir::*;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_reaches_a_tls_backend_untouched() {
    let backend_ca = Ca::new("backend ca");
    let echo_addr = start_tls_echo(&backend_ca.server(&["pass.example.com"], 77)).await;
    let port = free_port();
    let cfg = config_with_certificates(
        vec![tls_listener(
            "pass",
            port,
            None,
            TlsMode::Passthrough,
            &[],
            vec![tls_route("pass", &["pass.example.com"], "echo")],
        )],
        vec![http1("echo", vec![echo_addr])],
        vec![],
    );
    let (dp, registry) = dataplane(Options::default()).await;
    apply_ok(&dp, &cfg).await;

    // The client trusts only the backend's CA: the handshake is with the backend itself.
    let client = client_config(&[&backend_ca.pem], &[], None);
    let mut stream = connect(port, "pass.example.com", &client).await.unwrap();
    assert_eq!(leaf_of(&stream).serial, 77);
    for msg in [&b"hello"[..], b"through the gateway"] {
        stream.write_all(msg).await.unwrap();
        let mut got = vec![0u8; msg.len() + 4];
        stream.read_exact(&mut got).await.unwrap();
        assert_eq!(&got[..4], b"tls:");
        assert_eq!(&got[4..], msg);
    }
    // No TLSRoute for the name: refused.
    assert!(connect(port, "other.example.com", &client).await.is_err());
    assert_eq!(failures_reaching(&registry, "no_route", 1.0).await, 1.0);
    // Passthrough is not a handshake of the gateway's.
    assert!(!metrics_text(&registry).contains(r#"listener="pass""#));
    dp.shutdown(Duration::from_secs(1)).await;
}

/// A TLS listener on `port` terminating term.example.com (certificate serial 5 from `ca`) and
/// forwarding the decrypted stream to `endpoints` over TCP.
fn terminate_to(port: u16, ca: &Ca, endpoints: Vec<std::net::SocketAddr>) -> Config {
    config_with_certificates(
        vec![tls_listener(
            "term",
            port,
            Some("term.example.com"),
            TlsMode::Terminate,
            &["default/term"],
            vec![tls_route("term", &["term.example.com"], "echo")],
        )],
        vec![http1("echo", endpoints)],
        vec![
            ca.server(&["term.example.com"], 5)
                .certificate("default/term"),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_terminate_forwards_decrypted_stream_over_tcp() {
    let echo_addr = start_tcp_echo().await;
    let ca = Ca::new("test ca");
    let port = free_port();
    let cfg = terminate_to(port, &ca, vec![echo_addr]);
    let (dp, registry) = dataplane(Options::default()).await;
    apply_ok(&dp, &cfg).await;
    let client = client_config(&[&ca.pem], &[b"h2", b"http/1.1"], None);
    let mut stream = connect(port, "term.example.com", &client).await.unwrap();
    assert_eq!(leaf_of(&stream).serial, 5);
    // A TLS listener offers no ALPN.
    assert_eq!(stream.get_ref().1.alpn_protocol(), None);
    stream.write_all(b"plain bytes").await.unwrap();
    let mut got = [0u8; 15];
    stream.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"tcp:plain bytes");
    assert_eq!(
        metric(
            &registry,
            r#"gatehouse_tls_handshakes_total{gateway="default/gw",listener="term"}"#
        ),
        1.0
    );
    dp.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_terminate_and_https_share_one_port() {
    let backend_ca = Ca::new("backend ca");
    let tls_echo = start_tls_echo(&backend_ca.server(&["pass.example.com"], 10)).await;
    let tcp_echo = start_tcp_echo().await;
    let web = start_http_backend("web").await;
    let ca = Ca::new("gateway ca");
    let port = free_port();
    let cfg = config_with_certificates(
        vec![
            tls_listener(
                "pass",
                port,
                Some("pass.example.com"),
                TlsMode::Passthrough,
                &[],
                vec![tls_route("pass", &["pass.example.com"], "tls-echo")],
            ),
            tls_listener(
                "term",
                port,
                Some("term.example.com"),
                TlsMode::Terminate,
                &["default/term"],
                vec![tls_route("term", &["term.example.com"], "tcp-echo")],
            ),
            https_listener("web", port, Some("www.example.com"), "default/www", "web"),
        ],
        vec![
            http1("tls-echo", vec![tls_echo]),
            http1("tcp-echo", vec![tcp_echo]),
            http1("web", vec![web]),
        ],
        vec![
            ca.server(&["term.example.com"], 20)
                .certificate("default/term"),
            ca.server(&["www.example.com"], 30)
                .certificate("default/www"),
        ],
    );
    let (dp, _) = dataplane(Options::default()).await;
    apply_ok(&dp, &cfg).await;
    let client = client_config(&[&ca.pem, &backend_ca.pem], &[], None);

    for _ in 0..3 {
        let mut pass = connect(port, "pass.example.com", &client).await.unwrap();
        assert_eq!(leaf_of(&pass).serial, 10);
        pass.write_all(b"p").await.unwrap();
        let mut got = [0u8; 5];
        pass.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"tls:p");

        let mut term = connect(port, "term.example.com", &client).await.unwrap();
        assert_eq!(leaf_of(&term).serial, 20);
        term.write_all(b"t").await.unwrap();
        let mut got = [0u8; 5];
        term.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"tcp:t");

        let answer = https_get(port, "www.example.com", &client, "/")
            .await
            .unwrap();
        assert_eq!(answer.field("backend"), "web");
        assert_eq!(answer.field("proto"), "https");
    }
    dp.shutdown(Duration::from_secs(1)).await;
}

/// A TLSRoute backend endpoint whose connects hang (a deleted pod) costs a client a short
/// delay, not the connect timeout: another endpoint is connected alongside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_route_hedges_a_dark_endpoint() {
    let echo_addr = start_tcp_echo().await;
    let (dark, _fillers, _listener) = dark_address();
    let ca = Ca::new("test ca");
    let port = free_port();
    let cfg = terminate_to(port, &ca, vec![dark, echo_addr]);
    let options = Options {
        connect_timeout: Duration::from_secs(60),
        ..Options::default()
    };
    let (dp, registry) = dataplane(options).await;
    apply_ok(&dp, &cfg).await;
    let client = client_config(&[&ca.pem], &[], None);
    for i in 0..4 {
        let mut stream = connect(port, "term.example.com", &client).await.unwrap();
        stream.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 8];
        tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut got))
            .await
            .unwrap_or_else(|_| panic!("connection {i}: no echo within 5 s"))
            .unwrap();
        assert_eq!(&got, b"tcp:ping");
    }
    assert!(
        metric(
            &registry,
            r#"gatehouse_upstream_ejections_total{cluster="echo"}"#
        ) >= 1.0,
        "the dark endpoint was ejected"
    );
    dp.shutdown(Duration::from_secs(1)).await;
}
