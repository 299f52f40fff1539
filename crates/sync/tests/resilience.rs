//! Data planes ride out control-plane restarts, leadership changes and certificate expiry on
//! their own: real TCP and mTLS on 127.0.0.1.

mod support;

use gatehouse_sync::{Ca, ConfigServer, Credentials, ServerOptions};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use support::*;

#[tokio::test]
async fn a_restarted_control_plane_does_not_make_the_data_plane_apply_again() {
    let ca = ca();
    let gateway = identity("apps", "public");
    let snapshot = config(&gateway, "stable");
    let control = ControlPlane::start(&ca, ServerOptions::default()).await;
    let address = control.address;
    control.server.publish(&gateway, Some(snapshot.clone()));
    let data = DataPlane::start(
        address,
        &ca.issue_dataplane(&gateway, Duration::from_secs(3600)),
        "public-0",
    );
    tokio::time::timeout(SOON, data.state.first_applied())
        .await
        .unwrap();
    control.stop().await;
    eventually("the data plane notices", SOON, || !data.state.connected()).await;

    // A new process: the CA from its Secret, the same objects, so the same snapshot.
    let ca = Arc::new(Ca::from_pem(ca.cert_pem(), ca.key_pem()).unwrap());
    let control = ControlPlane::start_on(&ca, ServerOptions::default(), address).await;
    control
        .server
        .publish(&gateway, Some(config(&gateway, "stable")));
    eventually(
        "the replica is back and reports what it serves",
        SOON,
        || {
            control
                .server
                .reports()
                .get(&gateway)
                .and_then(|report| report.replicas.get("public-0").cloned())
                .is_some_and(|replica| {
                    replica.acked == Some(version(&snapshot))
                        && replica.diagnostics == ["applied 1 clusters"]
                })
        },
    )
    .await;
    // The Hello and Ack are queued before the stream opens: the server can report them a
    // moment before the client has the response head that marks it connected.
    eventually("the data plane says it is connected", SOON, || {
        data.state.connected()
    })
    .await;
    assert_eq!(data.applier.applied().len(), 1, "not applied again");
    assert_eq!(control.server.counters().snapshots_sent, 0, "not even sent");

    data.stop().await;
    control.stop().await;
}

#[tokio::test]
async fn a_replica_that_is_not_the_leader_sends_data_planes_away() {
    let ca = ca();
    let gateway = identity("apps", "public");
    let options = ServerOptions {
        accepting: false,
        ..ServerOptions::default()
    };
    let control = ControlPlane::start(&ca, options).await;
    control
        .server
        .publish(&gateway, Some(config(&gateway, "one")));
    let data = DataPlane::start(
        control.address,
        &ca.issue_dataplane(&gateway, Duration::from_secs(3600)),
        "public-0",
    );
    eventually("the data plane is told", SOON, || {
        data.state
            .last_error()
            .is_some_and(|e| e.contains("Unavailable") && e.contains("not the leader"))
    })
    .await;
    assert!(!data.state.connected());
    assert!(control.server.reports()[&gateway].replicas.is_empty());

    // Elected: the data plane's next attempt gets through.
    control.server.set_accepting(true);
    tokio::time::timeout(SOON, data.state.first_applied())
        .await
        .expect("connects once the replica leads");
    assert!(data.state.connected());

    // Deposed: open streams are sent away too, and come back on re-election.
    control.server.set_accepting(false);
    eventually("the stream is closed", SOON, || {
        !data.state.connected()
            && data
                .state
                .last_error()
                .is_some_and(|e| e.contains("not the leader"))
    })
    .await;
    control.server.set_accepting(true);
    eventually("it is back", SOON, || data.state.connected()).await;
    assert_eq!(data.applier.applied().len(), 1);

    data.stop().await;
    control.stop().await;
}

#[tokio::test]
async fn renewed_credentials_arrive_before_expiry_and_outlive_the_bootstrap_certificate() {
    const VALIDITY: Duration = Duration::from_secs(6);
    let ca = ca();
    let gateway = identity("apps", "public");
    let options = ServerOptions {
        dataplane_cert_validity: VALIDITY,
        ..ServerOptions::default()
    };
    let server = ConfigServer::new(ca.clone(), options.clone());
    server.publish(&gateway, Some(config(&gateway, "one")));
    let control = ControlPlane::serve(server, &ca, (LOCALHOST, 0).into()).await;
    let address = control.address;

    let bootstrap = ca.issue_dataplane(&gateway, VALIDITY);
    let dir = tempfile::tempdir().unwrap();
    bootstrap.write_dir(dir.path()).unwrap();
    // As on a Secret volume: what the data plane keeps, it keeps in memory.
    make_unwritable(dir.path());
    let data = DataPlane::start_in(address, dir, "public-0");
    tokio::time::timeout(SOON, data.state.first_applied())
        .await
        .unwrap();

    eventually("renewed credentials arrive before expiry", SOON, || {
        data.state
            .certificate_not_after()
            .is_some_and(|not_after| not_after > bootstrap.not_after)
    })
    .await;
    assert!(SystemTime::now() < bootstrap.not_after);
    assert!(control.server.counters().credentials_issued >= 1);

    // Past the bootstrap certificate's end (X.509 times have whole seconds).
    let expired = bootstrap.not_after + Duration::from_secs(1);
    tokio::time::sleep(
        expired
            .duration_since(SystemTime::now())
            .unwrap_or_default(),
    )
    .await;
    assert!(
        !tls_accepted(address, ca.cert_pem(), Some(&bootstrap)).await,
        "the bootstrap certificate alone no longer gets in"
    );
    let on_disk = Credentials::read_dir(data.dir.path()).unwrap();
    assert_eq!(on_disk, bootstrap, "nothing was written");

    // A control-plane restart forces a new connection: it must use the renewed certificate.
    control.stop().await;
    let control = ControlPlane::start_on(&ca, options, address).await;
    control
        .server
        .publish(&gateway, Some(config(&gateway, "one")));
    eventually(
        "the data plane is back on the new control plane",
        SOON,
        || {
            control
                .server
                .reports()
                .get(&gateway)
                .is_some_and(|report| report.replicas.contains_key("public-0"))
        },
    )
    .await;
    // The server reports the replica from its Hello, a moment before the client has the
    // response head that marks it connected (as in the first test).
    eventually("the data plane says it is connected", SOON, || {
        data.state.connected()
    })
    .await;
    assert_eq!(data.applier.applied().len(), 1);

    data.stop().await;
    control.stop().await;
}
