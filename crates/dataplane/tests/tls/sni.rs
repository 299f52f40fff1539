//! Which listener and certificate a handshake gets: SNI among many listeners, exact over
//! wildcard over catch-all, and a Host of another listener on the connection (421).

use crate::support::*;
use gatehouse_dataplane::Options;
use http::StatusCode;
use rcgen::SanType;
use std::net::SocketAddr;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_selects_among_64_https_listeners() {
    let be = start_http_backend("a").await;
    let ca = Ca::new("test ca");
    let port = free_port();
    let mut listeners = Vec::new();
    let mut certs = Vec::new();
    for i in 0..64u64 {
        let host = format!("svc{i}.example.com");
        let name = format!("default/svc{i}");
        certs.push(ca.server(&[&host], 1000 + i).certificate(&name));
        listeners.push(https_listener(
            &format!("https-{i}"),
            port,
            Some(&host),
            &name,
            "a",
        ));
    }
    let cfg = config_with_certificates(listeners, vec![http1("a", vec![be])], certs);
    let (dp, registry) = dataplane(Options::default()).await;
    apply_ok(&dp, &cfg).await;
    assert_eq!(dp.bound_addresses(), vec![SocketAddr::new(LOCALHOST, port)]);

    let client = client_config(&[&ca.pem], &[b"http/1.1"], None);
    for i in [0u64, 1, 17, 42, 63] {
        let host = format!("svc{i}.example.com");
        let stream = connect(port, &host, &client).await.unwrap();
        let leaf = leaf_of(&stream);
        assert_eq!(leaf.dns_names, vec![host.clone()]);
        assert_eq!(leaf.serial, 1000 + i);
        let answer = get_on(stream, &host, "/").await.unwrap();
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(answer.field("backend"), "a");
        assert_eq!(answer.field("proto"), "https");
        assert_eq!(answer.field("host"), host);
    }
    // SNI is case-insensitive.
    let stream = connect(port, "SVC5.Example.COM", &client).await.unwrap();
    assert_eq!(leaf_of(&stream).serial, 1005);

    // A name no listener serves: the connection is closed without an answer.
    let err = connect(port, "svc64.example.com", &client)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.kind(),
            std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
        ),
        "{err:?}"
    );
    assert_eq!(
        failures_reaching(&registry, "no_certificate", 1.0).await,
        1.0
    );
    assert_eq!(
        metric(
            &registry,
            r#"gatehouse_tls_handshakes_total{gateway="default/gw",listener="https-17"}"#
        ),
        1.0
    );
    assert!(metrics_text(&registry).contains(
        r#"gatehouse_tls_certificate_expiry_timestamp_seconds{certificate="default/svc63"}"#
    ));
    dp.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wildcard_exact_and_catch_all_precedence() {
    let be = start_http_backend("a").await;
    let ca = Ca::new("test ca");
    let port = free_port();
    let mut catch_all = Ca::server_params(&["other.org", "127.0.0.1"], 3);
    catch_all
        .subject_alt_names
        .push(SanType::DnsName("default.test".try_into().unwrap()));
    let cfg = config_with_certificates(
        vec![
            https_listener("wild", port, Some("*.example.com"), "default/wild", "a"),
            https_listener("exact", port, Some("foo.example.com"), "default/exact", "a"),
            https_listener(
                "deeper",
                port,
                Some("*.bar.example.com"),
                "default/deeper",
                "a",
            ),
            https_listener("any", port, None, "default/any", "a"),
        ],
        vec![http1("a", vec![be])],
        vec![
            ca.server(&["foo.example.com"], 1)
                .certificate("default/exact"),
            ca.server(&["*.example.com"], 2).certificate("default/wild"),
            ca.server(&["*.bar.example.com"], 4)
                .certificate("default/deeper"),
            ca.issue(catch_all).certificate("default/any"),
        ],
    );
    let (dp, _) = dataplane(Options::default()).await;
    apply_ok(&dp, &cfg).await;
    let client = client_config(&[&ca.pem], &[], None);
    for (sni, serial) in [
        ("foo.example.com", 1),
        ("bar.example.com", 2),
        ("x.example.com", 2),
        ("x.bar.example.com", 4),
        ("other.org", 3),
        // An IP server name sends no SNI at all: the listener without hostname answers.
        ("127.0.0.1", 3),
    ] {
        let stream = connect(port, sni, &client)
            .await
            .unwrap_or_else(|e| panic!("{sni}: {e}"));
        assert_eq!(leaf_of(&stream).serial, serial, "{sni}");
    }
    // a.b.example.com matches the wildcard's name rule (one or more labels) but a
    // `*.example.com` certificate covers one label only: the right listener, a client-side
    // name error.
    let err = connect(port, "a.b.example.com", &client).await.unwrap_err();
    assert!(err.to_string().contains("not valid for name"), "{err}");
    dp.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_of_another_listener_gets_421() {
    let a = start_http_backend("a").await;
    let b = start_http_backend("b").await;
    let ca = Ca::new("test ca");
    let port = free_port();
    let cfg = config_with_certificates(
        vec![
            https_listener("a", port, Some("a.example.com"), "default/a", "a"),
            https_listener("b", port, Some("b.example.com"), "default/b", "b"),
            https_listener(
                "wild",
                port,
                Some("*.wild.example.com"),
                "default/wild",
                "a",
            ),
        ],
        vec![http1("a", vec![a]), http1("b", vec![b])],
        vec![
            ca.server(&["a.example.com"], 1).certificate("default/a"),
            ca.server(&["b.example.com"], 2).certificate("default/b"),
            ca.server(&["*.wild.example.com"], 3)
                .certificate("default/wild"),
        ],
    );
    let (dp, _) = dataplane(Options::default()).await;
    apply_ok(&dp, &cfg).await;
    let client = client_config(&[&ca.pem], &[b"http/1.1"], None);

    let same = get_on(
        connect(port, "a.example.com", &client).await.unwrap(),
        "a.example.com:443",
        "/",
    )
    .await
    .unwrap();
    assert_eq!(same.status, 200);
    assert_eq!(same.field("backend"), "a");
    let other = get_on(
        connect(port, "a.example.com", &client).await.unwrap(),
        "b.example.com",
        "/",
    )
    .await
    .unwrap();
    assert_eq!(other.status, StatusCode::MISDIRECTED_REQUEST);
    // Two names of one wildcard listener share it: no 421.
    let wild = get_on(
        connect(port, "x.wild.example.com", &client).await.unwrap(),
        "y.wild.example.com",
        "/",
    )
    .await
    .unwrap();
    assert_eq!(wild.status, 200);
    // A host no listener takes is a 404, as on plaintext.
    let none = get_on(
        connect(port, "b.example.com", &client).await.unwrap(),
        "nowhere.org",
        "/",
    )
    .await
    .unwrap();
    assert_eq!(none.status, 404);
    dp.shutdown(Duration::from_secs(1)).await;
}
