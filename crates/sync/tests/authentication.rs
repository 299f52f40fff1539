//! Only data planes with a client certificate of the control plane's CA get a stream: real
//! TCP and mTLS on 127.0.0.1.

mod support;

use gatehouse_sync::{Ca, ServerOptions};
use std::time::Duration;
use support::*;

#[tokio::test]
async fn a_certificate_of_another_ca_is_refused_in_the_handshake() {
    let ca = ca();
    let control = ControlPlane::start(&ca, ServerOptions::default()).await;
    let gateway = identity("apps", "public");
    control
        .server
        .publish(&gateway, Some(config(&gateway, "secret")));

    // The same identity, issued by a CA the control plane does not trust; the data plane
    // trusts the real CA, so only the client certificate is wrong.
    let other = Ca::generate("someone else's CA");
    let mut forged = other.issue_dataplane(&gateway, Duration::from_secs(3600));
    forged.ca_pem = ca.cert_pem().to_string();
    assert!(!tls_accepted(control.address, ca.cert_pem(), Some(&forged)).await);
    let genuine = ca.issue_dataplane(&gateway, Duration::from_secs(3600));
    assert!(
        tls_accepted(control.address, ca.cert_pem(), Some(&genuine)).await,
        "the control: a certificate of the CA is accepted"
    );

    let data = DataPlane::start(control.address, &forged, "public-0");
    eventually("the client reports the failure", SOON, || {
        data.state.last_error().is_some()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!data.state.connected());
    assert!(data.applier.applied().is_empty());
    assert!(
        control.server.reports()[&gateway].replicas.is_empty(),
        "no replica appears"
    );
    assert!(control.server.counters().handshake_failures >= 2);

    data.stop().await;
    control.stop().await;
}

#[tokio::test]
async fn a_client_without_a_certificate_is_refused() {
    let ca = ca();
    let control = ControlPlane::start(&ca, ServerOptions::default()).await;
    assert!(!tls_accepted(control.address, ca.cert_pem(), None).await);
    assert!(control.server.reports().is_empty());
    assert_eq!(control.server.counters().handshake_failures, 1);
    control.stop().await;
}

#[tokio::test]
async fn a_server_certificate_of_the_ca_is_no_client_certificate() {
    let ca = ca();
    let control = ControlPlane::start(&ca, ServerOptions::default()).await;
    // Issued by the right CA, but for serving (serverAuth only): the control plane's own
    // certificate must not let anyone in as a data plane.
    let server = ca.issue_server(
        &[SERVER_NAME.into()],
        &[LOCALHOST],
        Duration::from_secs(3600),
    );
    assert!(!tls_accepted(control.address, ca.cert_pem(), Some(&server)).await);
    assert!(control.server.reports().is_empty());
    control.stop().await;
}

#[tokio::test]
async fn an_expired_certificate_is_refused() {
    let ca = ca();
    let control = ControlPlane::start(&ca, ServerOptions::default()).await;
    let gateway = identity("apps", "public");
    let short = ca.issue_dataplane(&gateway, Duration::from_secs(1));
    assert!(tls_accepted(control.address, ca.cert_pem(), Some(&short)).await);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert!(!tls_accepted(control.address, ca.cert_pem(), Some(&short)).await);
    control.stop().await;
}
