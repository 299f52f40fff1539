//! TLS towards backends (BackendTLSPolicy): CA, server name and subjectAltNames, the gateway's
//! client certificate, h2 by ALPN, and a TLSRoute's decrypted stream re-encrypted.

use crate::support::*;
use gatehouse_dataplane::Options;
use gatehouse_ir::*;
use rcgen::SanType;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_terminate_reencrypts_to_a_backend_under_backend_tls() {
    // TLSRoute on a Terminate listener, backend secured by a BackendTLSPolicy (private CA and
    // server name): the decrypted stream goes out over a new, verified TLS connection.
    let backend_ca = Ca::new("backend ca");
    let echo_addr = start_tls_echo(&backend_ca.server(&["backend.internal"], 31)).await;
    let ca = Ca::new("gateway ca");
    let port = free_port();
    let backend_tls = |server_name: &str| UpstreamTls {
        server_name: server_name.into(),
        ca_pem: Some(backend_ca.pem.clone()),
        subject_alt_names: vec![],
        client_certificate: None,
    };
    let cfg = |server_name: &str| {
        config_with_certificates(
            vec![tls_listener(
                "term",
                port,
                Some("term.example.com"),
                TlsMode::Terminate,
                &["default/term"],
                vec![tls_route("term", &["term.example.com"], "secure")],
            )],
            vec![http1_tls(
                "secure",
                vec![echo_addr],
                backend_tls(server_name),
            )],
            vec![
                ca.server(&["term.example.com"], 6)
                    .certificate("default/term"),
            ],
        )
    };
    let (dp, _registry) = dataplane(Options::default()).await;
    apply_ok(&dp, &cfg("backend.internal")).await;
    let client = client_config(&[&ca.pem], &[], None);
    let mut stream = connect(port, "term.example.com", &client).await.unwrap();
    assert_eq!(leaf_of(&stream).serial, 6, "the gateway's certificate");
    stream.write_all(b"re-encrypted").await.unwrap();
    let mut got = [0u8; 16];
    stream.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"tls:re-encrypted", "the TLS echo backend answered");

    // A server name the backend's certificate does not carry: the backend handshake fails and
    // the client's connection is closed, never forwarded in the clear.
    apply_ok(&dp, &cfg("wrong.internal")).await;
    let mut stream = connect(port, "term.example.com", &client).await.unwrap();
    let _ = stream.write_all(b"x").await;
    let mut buf = [0u8; 8];
    let n = stream.read(&mut buf).await.unwrap_or(0);
    assert_eq!(n, 0, "nothing comes back: {:?}", &buf[..n]);
    dp.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_tls_with_private_ca_names_and_client_certificate() {
    let backend_ca = Ca::new("backend ca");
    let gateway_client_ca = Ca::new("gateway client ca");
    let mut params = Ca::server_params(&["backend.internal"], 9);
    params.subject_alt_names.push(SanType::URI(
        "spiffe://cluster.local/ns/default/sa/backend"
            .try_into()
            .unwrap(),
    ));
    let backend =
        start_https_backend(&backend_ca.issue(params), Some(&gateway_client_ca.pem)).await;
    let port = free_port();

    let tls = |server_name: &str, sans: Vec<SubjectAltName>| UpstreamTls {
        server_name: server_name.into(),
        ca_pem: Some(backend_ca.pem.clone()),
        subject_alt_names: sans,
        client_certificate: None,
    };
    let cases: Vec<(&str, UpstreamTls, u16)> = vec![
        ("ok", tls("backend.internal", vec![]), 200),
        ("wrong-name", tls("wrong.internal", vec![]), 502),
        (
            "san-dns",
            tls(
                "whatever.internal",
                vec![SubjectAltName::Dns("backend.internal".into())],
            ),
            200,
        ),
        (
            "san-miss",
            tls(
                "backend.internal",
                vec![SubjectAltName::Dns("other.internal".into())],
            ),
            502,
        ),
        (
            "san-uri",
            tls(
                "backend.internal",
                vec![
                    SubjectAltName::Dns("nope.internal".into()),
                    SubjectAltName::Uri("spiffe://cluster.local/ns/default/sa/backend".into()),
                ],
            ),
            200,
        ),
        (
            "san-uri-miss",
            tls(
                "backend.internal",
                vec![SubjectAltName::Uri(
                    "spiffe://cluster.local/ns/default/sa/other".into(),
                )],
            ),
            502,
        ),
        (
            "client-cert",
            UpstreamTls {
                client_certificate: Some("default/gw-client".into()),
                ..tls("backend.internal", vec![])
            },
            200,
        ),
        (
            "system-roots",
            UpstreamTls {
                ca_pem: None,
                ..tls("backend.internal", vec![])
            },
            502,
        ),
    ];
    let mut listener = listener_base("http", port, None, ListenerProtocol::Http);
    let mut routes = Vec::new();
    let mut clusters = Vec::new();
    for (i, (name, settings, _)) in cases.iter().enumerate() {
        listener
            .rules
            .push(rule(name, vec![to_cluster(name)], vec![]));
        routes.push(prefix(&format!("/{name}"), i));
        clusters.push(http1_tls(name, vec![backend], settings.clone()));
    }
    // HTTP/2 over TLS (ALPN h2) for an h2 cluster.
    listener
        .rules
        .push(rule("h2", vec![to_cluster("h2")], vec![]));
    routes.push(prefix("/h2", cases.len()));
    clusters.push(Cluster {
        protocol: UpstreamProtocol::H2c,
        ..http1_tls("h2", vec![backend], tls("backend.internal", vec![]))
    });
    listener.virtual_hosts = vec![VirtualHost {
        hostname: "*".into(),
        routes,
    }];
    let cfg = config_with_certificates(
        vec![listener],
        clusters,
        vec![
            gateway_client_ca
                .client("gateway")
                .certificate("default/gw-client"),
        ],
    );
    let (dp, _) = dataplane(Options::default()).await;
    apply_ok(&dp, &cfg).await;

    for (name, settings, status) in &cases {
        let answer = http_get(port, "app.example.com", &format!("/{name}")).await;
        assert_eq!(answer.status.as_u16(), *status, "{name}: {}", answer.body);
        if *status == 200 {
            assert_eq!(answer.field("sni"), settings.server_name, "{name}");
            assert_eq!(answer.field("version"), "HTTP/1.1", "{name}");
            assert_eq!(answer.field("proto"), "http", "{name}");
            let expected_client = if *name == "client-cert" {
                "present"
            } else {
                "none"
            };
            assert_eq!(answer.field("client"), expected_client, "{name}");
        }
    }
    // Pooled connections are reused.
    assert_eq!(http_get(port, "app.example.com", "/ok").await.status, 200);
    for _ in 0..2 {
        let answer = http_get(port, "app.example.com", "/h2").await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(answer.field("version"), "HTTP/2.0");
        assert_eq!(answer.field("sni"), "backend.internal");
    }
    dp.shutdown(Duration::from_secs(1)).await;
}
