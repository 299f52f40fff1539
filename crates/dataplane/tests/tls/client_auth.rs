//! Frontend mTLS: client certificates validated against the listener's CA, and
//! AllowInsecureFallback.

use crate::support::*;
use gatehouse_dataplane::Options;
use gatehouse_ir::*;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_validated() {
    let be = start_http_backend("a").await;
    let ca = Ca::new("server ca");
    let client_ca = Ca::new("client ca");
    let stranger_ca = Ca::new("stranger ca");
    let port = free_port();
    let cfg = |fallback: bool| {
        let mut listener =
            https_listener("mtls", port, Some("mtls.example.com"), "default/mtls", "a");
        listener.tls.as_mut().unwrap().client_validation = Some(ClientValidation {
            ca_pem: client_ca.pem.clone(),
            allow_insecure_fallback: fallback,
        });
        config_with_certificates(
            vec![listener],
            vec![http1("a", vec![be])],
            vec![
                ca.server(&["mtls.example.com"], 1)
                    .certificate("default/mtls"),
            ],
        )
    };
    let (dp, registry) = dataplane(Options::default()).await;
    apply_ok(&dp, &cfg(false)).await;

    let with_cert = client_config(&[&ca.pem], &[], Some(&client_ca.client("alice")));
    let without = client_config(&[&ca.pem], &[], None);
    let wrong_cert = client_config(&[&ca.pem], &[], Some(&stranger_ca.client("mallory")));

    let ok = https_get(port, "mtls.example.com", &with_cert, "/")
        .await
        .unwrap();
    assert_eq!(ok.status, 200);
    let refused = https_get(port, "mtls.example.com", &without, "/").await;
    assert!(
        refused.is_err(),
        "served without a client certificate: {refused:?}"
    );
    let refused = https_get(port, "mtls.example.com", &wrong_cert, "/").await;
    assert!(
        refused.is_err(),
        "served with an untrusted client certificate: {refused:?}"
    );
    assert_eq!(
        failures_reaching(&registry, "bad_client_certificate", 2.0).await,
        2.0
    );

    // AllowInsecureFallback: served without a certificate, with a valid one, and with one
    // from an unknown CA (the mode's point: validation is reported, not enforced).
    apply_ok(&dp, &cfg(true)).await;
    assert_eq!(
        https_get(port, "mtls.example.com", &wrong_cert, "/")
            .await
            .unwrap()
            .status,
        200
    );
    assert_eq!(
        https_get(port, "mtls.example.com", &without, "/")
            .await
            .unwrap()
            .status,
        200
    );
    assert_eq!(
        https_get(port, "mtls.example.com", &with_cert, "/")
            .await
            .unwrap()
            .status,
        200
    );
    dp.shutdown(Duration::from_secs(1)).await;
}
