//! What a handshake negotiates and what it refuses: ALPN (h2 over TLS), TLS versions, RSA
//! and ECDSA keys on one listener, and plaintext or slow clients on a TLS port.

use crate::support::*;
use bytes::Bytes;
use gatehouse_dataplane::Options;
use http::{Request, StatusCode};
use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::KeyPair;
use rustls::{ClientConfig, SignatureScheme};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alpn_negotiates_h2_and_http2_works_over_tls() {
    let be = start_http_backend("a").await;
    let ca = Ca::new("test ca");
    let port = free_port();
    let cfg = config_with_certificates(
        vec![https_listener(
            "web",
            port,
            Some("cafe.example.com"),
            "default/cafe",
            "a",
        )],
        vec![http1("a", vec![be])],
        vec![
            ca.server(&["cafe.example.com"], 1)
                .certificate("default/cafe"),
        ],
    );
    let (dp, _) = dataplane(Options::default()).await;
    apply_ok(&dp, &cfg).await;

    let h2 = client_config(&[&ca.pem], &[b"h2", b"http/1.1"], None);
    let stream = connect(port, "cafe.example.com", &h2).await.unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    for _ in 0..3 {
        let resp = sender
            .send_request(
                Request::get("https://cafe.example.com/tea")
                    .body(Empty::<Bytes>::new())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(resp.version(), http::Version::HTTP_2);
        let answer = read_answer(resp).await.unwrap();
        assert_eq!(answer.status, 200);
        assert_eq!(answer.field("proto"), "https");
        assert_eq!(answer.field("host"), "cafe.example.com");
    }

    let h1 = client_config(&[&ca.pem], &[b"http/1.1"], None);
    let stream = connect(port, "cafe.example.com", &h1).await.unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    assert_eq!(
        get_on(stream, "cafe.example.com", "/")
            .await
            .unwrap()
            .status,
        200
    );

    // A connection that negotiated h2 is HTTP/2 from its first byte: an invalid preface is
    // an HTTP/2 connection error (GOAWAY or close), never answered as HTTP/1 (h2spec 3.5/2).
    let mut stream = connect(port, "cafe.example.com", &h2).await.unwrap();
    stream
        .write_all(b"INVALID CONNECTION PREFACE\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer))
        .await
        .expect("the connection is closed");
    assert!(
        !answer.starts_with(b"HTTP/1"),
        "answered as HTTP/1: {:?}",
        String::from_utf8_lossy(&answer)
    );
    dp.shutdown(Duration::from_secs(1)).await;
}

fn openssl_s_client(port: u16, version_flag: &str) -> Option<std::process::Output> {
    let output = std::process::Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &format!("127.0.0.1:{port}"),
            "-servername",
            "cafe.example.com",
            version_flag,
            // OpenSSL 3 refuses to offer TLS 1.1 at its default security level.
            "-cipher",
            "DEFAULT@SECLEVEL=0",
        ])
        .stdin(std::process::Stdio::null())
        .output();
    match output {
        Ok(o) => Some(o),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => panic!("openssl: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_1_1_is_rejected_1_2_and_1_3_accepted() {
    let be = start_http_backend("a").await;
    let ca = Ca::new("test ca");
    let port = free_port();
    let cfg = config_with_certificates(
        vec![https_listener(
            "web",
            port,
            Some("cafe.example.com"),
            "default/cafe",
            "a",
        )],
        vec![http1("a", vec![be])],
        vec![
            ca.server(&["cafe.example.com"], 1)
                .certificate("default/cafe"),
        ],
    );
    let (dp, registry) = dataplane(Options::default()).await;
    apply_ok(&dp, &cfg).await;

    // rustls clients: TLS 1.2 only and TLS 1.3 only both work.
    for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
        let config = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[version])
            .unwrap()
            .with_root_certificates(roots(&[&ca.pem]))
            .with_no_client_auth();
        let stream = connect(port, "cafe.example.com", &Arc::new(config))
            .await
            .unwrap();
        assert_eq!(stream.get_ref().1.protocol_version(), Some(version.version));
    }

    let Some(tls11) = tokio::task::spawn_blocking(move || openssl_s_client(port, "-tls1_1"))
        .await
        .unwrap()
    else {
        eprintln!("NOTE: openssl is not installed; the TLS 1.1 sub-case is skipped");
        dp.shutdown(Duration::from_secs(1)).await;
        return;
    };
    let stderr = String::from_utf8_lossy(&tls11.stderr);
    assert!(
        !tls11.status.success(),
        "TLS 1.1 handshake succeeded: {stderr}"
    );
    assert_eq!(
        failures_reaching(&registry, "protocol_version", 1.0).await,
        1.0,
        "the server did not see a TLS 1.1 ClientHello: {stderr}\n{}",
        metrics_text(&registry)
    );
    for flag in ["-tls1_2", "-tls1_3"] {
        let out = tokio::task::spawn_blocking(move || openssl_s_client(port, flag))
            .await
            .unwrap()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{flag}: {stdout}");
        assert!(
            stdout.contains("CN=cafe.example.com") || stdout.contains("CN = cafe.example.com"),
            "{stdout}"
        );
    }
    dp.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rsa_and_ecdsa_certificates_share_a_listener() {
    let ca = Ca::new("dual-ca");
    let name = "dual.example.com";
    let ecdsa = ca.server(&[name], 1);
    let rsa = ca.issue_with(
        Ca::server_params(&[name], 2),
        KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).unwrap(),
    );
    let be = start_http_backend("dual").await;
    let port = free_port();
    let mut listener = https_listener("dual", port, Some(name), "rsa", "be");
    // RSA listed first: the client's signature algorithms decide, the order only breaks ties.
    listener.tls.as_mut().unwrap().certificates = vec!["rsa".into(), "ecdsa".into()];
    let (dp, _) = dataplane(Options::default()).await;
    apply_ok(
        &dp,
        &config_with_certificates(
            vec![listener],
            vec![http1("be", vec![be])],
            vec![rsa.certificate("rsa"), ecdsa.certificate("ecdsa")],
        ),
    )
    .await;
    let leaf_serial = |schemes: Vec<SignatureScheme>| async move {
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnything(schemes)))
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let stream = connect(port, name, &Arc::new(config)).await.unwrap();
        let serial = leaf_of(&stream).serial;
        let answer = get_on(stream, name, "/").await.unwrap();
        assert_eq!(answer.status, StatusCode::OK);
        serial
    };
    let ecdsa_only = vec![
        SignatureScheme::ECDSA_NISTP256_SHA256,
        SignatureScheme::ECDSA_NISTP384_SHA384,
    ];
    let rsa_only = vec![
        SignatureScheme::RSA_PSS_SHA256,
        SignatureScheme::RSA_PKCS1_SHA256,
    ];
    assert_eq!(leaf_serial(ecdsa_only).await, 1, "ECDSA-only client");
    assert_eq!(leaf_serial(rsa_only).await, 2, "RSA-only client");
    let both = provider()
        .signature_verification_algorithms
        .supported_schemes();
    assert_eq!(leaf_serial(both).await, 2, "either works: the first listed");

    // The server's suite order wins over the client's (rustls clients list AES-256 first).
    let stream = connect(port, name, &client_config(&[&ca.pem], &[b"http/1.1"], None))
        .await
        .unwrap();
    assert_eq!(
        stream
            .get_ref()
            .1
            .negotiated_cipher_suite()
            .map(|s| s.suite()),
        Some(rustls::CipherSuite::TLS13_AES_128_GCM_SHA256)
    );
    dp.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_and_slow_clients_on_a_tls_port_are_cut_off() {
    let be = start_http_backend("a").await;
    let ca = Ca::new("test ca");
    let port = free_port();
    let cfg = config_with_certificates(
        vec![https_listener("web", port, None, "default/web", "a")],
        vec![http1("a", vec![be])],
        vec![
            ca.server(&["web.example.com"], 1)
                .certificate("default/web"),
        ],
    );
    let (dp, registry) = dataplane(Options {
        tls_handshake_timeout: Duration::from_millis(300),
        ..Options::default()
    })
    .await;
    apply_ok(&dp, &cfg).await;

    // Plain HTTP to a TLS port: an alert and a close.
    let mut plain = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    plain
        .write_all(b"GET / HTTP/1.1\r\nHost: web\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    assert!(out.first().is_none_or(|&b| b == 0x15), "{out:?}");
    assert_eq!(failures_reaching(&registry, "other", 1.0).await, 1.0);

    // Half a ClientHello, then silence: closed after the handshake timeout.
    let mut slow = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    slow.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .await
        .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), slow.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(failures_reaching(&registry, "timeout", 1.0).await, 1.0);

    // A connection that says nothing and leaves is not a failed handshake.
    drop(TcpStream::connect(("127.0.0.1", port)).await.unwrap());
    let client = client_config(&[&ca.pem], &[], None);
    assert_eq!(
        https_get(port, "web.example.com", &client, "/")
            .await
            .unwrap()
            .status,
        200
    );
    assert_eq!(failures_reaching(&registry, "other", 1.0).await, 1.0);
    dp.shutdown(Duration::from_secs(1)).await;
}
