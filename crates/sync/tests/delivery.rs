//! Snapshots reach the data planes of their Gateway, and what the data planes make of them
//! comes back in `reports()`: real TCP and mTLS on 127.0.0.1.

mod support;

use gatehouse_sync::{ServerOptions, UnboundListener};
use std::time::Duration;
use support::*;

#[tokio::test]
async fn a_data_plane_gets_its_snapshots_acks_them_and_is_closed_with_its_gateway() {
    let ca = ca();
    let control = ControlPlane::start(&ca, ServerOptions::default()).await;
    let gateway = identity("apps", "public");
    let credentials = ca.issue_dataplane(&gateway, Duration::from_secs(3600));

    // Connected before anything is published: it waits on the open stream.
    let data = DataPlane::start(control.address, &credentials, "public-0");
    eventually("the stream is up", SOON, || data.state.connected()).await;
    eventually("the replica is reported", SOON, || {
        control
            .server
            .reports()
            .get(&gateway)
            .is_some_and(|report| {
                report.published_version.is_none() && report.replicas.contains_key("public-0")
            })
    })
    .await;
    assert!(data.applier.applied().is_empty());

    let first = config(&gateway, "first");
    control.server.publish(&gateway, Some(first.clone()));
    tokio::time::timeout(SOON, data.state.first_applied())
        .await
        .expect("the first snapshot is applied");
    assert_eq!(data.applier.applied(), vec![first.clone()]);
    assert_eq!(data.state.applied_version(), Some(version(&first)));
    eventually("the Ack is reported", SOON, || {
        let reports = control.server.reports();
        let report = &reports[&gateway];
        let replica = &report.replicas["public-0"];
        report.published_version == Some(version(&first))
            && replica.acked == Some(version(&first))
            && replica.diagnostics == ["applied 1 clusters"]
            && replica.build == "test-build"
    })
    .await;

    // The same content again, even in a new Arc, sends nothing.
    let sent = control.server.counters().snapshots_sent;
    control
        .server
        .publish(&gateway, Some(config(&gateway, "first")));
    let second = config(&gateway, "second");
    control.server.publish(&gateway, Some(second.clone()));
    eventually("the second snapshot is applied", SOON, || {
        data.state.applied_version() == Some(version(&second))
    })
    .await;
    assert_eq!(data.applier.applied(), vec![first, second.clone()]);
    assert_eq!(control.server.counters().snapshots_sent, sent + 1);
    eventually("the second Ack is reported", SOON, || {
        control.server.reports()[&gateway].replicas["public-0"].acked == Some(version(&second))
    })
    .await;

    // The Gateway is deleted: its stream closes and its report goes.
    control.server.publish(&gateway, None);
    eventually("the stream is closed", SOON, || {
        data.state
            .last_error()
            .is_some_and(|e| e.contains("NotFound"))
    })
    .await;
    // It keeps serving what it had, and reconnects to wait for a Gateway of its name.
    assert_eq!(data.state.applied_version(), Some(version(&second)));
    eventually("it is connected again, waiting", SOON, || {
        control
            .server
            .reports()
            .get(&gateway)
            .is_some_and(|report| report.published_version.is_none())
    })
    .await;

    data.stop().await;
    eventually("the report is gone with the stream", SOON, || {
        control.server.reports().is_empty()
    })
    .await;
    assert_eq!(control.server.counters().connected_streams, 0);
    control.stop().await;
}

#[tokio::test]
async fn each_gateway_gets_only_its_own_configuration() {
    let ca = ca();
    let control = ControlPlane::start(&ca, ServerOptions::default()).await;
    let red = identity("team-red", "edge");
    let blue = identity("team-blue", "edge");
    control
        .server
        .publish(&red, Some(config(&red, "red-cluster")));
    control
        .server
        .publish(&blue, Some(config(&blue, "blue-cluster")));

    let red_data = DataPlane::start(
        control.address,
        &ca.issue_dataplane(&red, Duration::from_secs(3600)),
        "red-0",
    );
    let blue_data = DataPlane::start(
        control.address,
        &ca.issue_dataplane(&blue, Duration::from_secs(3600)),
        "blue-0",
    );
    for data in [&red_data, &blue_data] {
        tokio::time::timeout(SOON, data.state.first_applied())
            .await
            .expect("a snapshot is applied");
    }
    assert_eq!(
        red_data.applier.applied(),
        vec![config(&red, "red-cluster")]
    );
    assert_eq!(
        blue_data.applier.applied(),
        vec![config(&blue, "blue-cluster")]
    );
    eventually("both are reported under their own Gateway", SOON, || {
        let reports = control.server.reports();
        reports.len() == 2
            && reports[&red].replicas.keys().eq(["red-0"])
            && reports[&blue].replicas.keys().eq(["blue-0"])
    })
    .await;

    // A change of one Gateway reaches only its data planes.
    control
        .server
        .publish(&red, Some(config(&red, "red-cluster-2")));
    eventually("red applies its change", SOON, || {
        red_data.applier.applied().len() == 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(blue_data.applier.applied().len(), 1);

    red_data.stop().await;
    blue_data.stop().await;
    control.stop().await;
}

/// A data plane that reads `config_gzip` gets the snapshot compressed once by the control
/// plane; one of an older build, beside it on the same Gateway, gets the JSON (compressed by
/// gRPC). Both serve the same configuration and acknowledge the same version.
#[tokio::test]
async fn older_and_newer_data_planes_serve_the_same_snapshot() {
    let ca = ca();
    let control = ControlPlane::start(&ca, ServerOptions::default()).await;
    let gateway = identity("apps", "public");
    let credentials = ca.issue_dataplane(&gateway, Duration::from_secs(3600));
    let first = config(&gateway, "first");
    control.server.publish(&gateway, Some(first.clone()));

    let newer = DataPlane::start(control.address, &credentials, "public-0");
    let older = DataPlane::start_older(control.address, &credentials, "public-1");
    for data in [&newer, &older] {
        tokio::time::timeout(SOON, data.state.first_applied())
            .await
            .expect("the snapshot is applied");
        assert_eq!(data.applier.applied(), vec![first.clone()]);
    }
    let counters = control.server.counters();
    assert_eq!(
        (counters.snapshots_sent, counters.snapshots_sent_gzip),
        (2, 1)
    );

    let second = config(&gateway, "second");
    control.server.publish(&gateway, Some(second.clone()));
    eventually("both ack the second version", SOON, || {
        let reports = control.server.reports();
        let replicas = &reports[&gateway].replicas;
        ["public-0", "public-1"]
            .iter()
            .all(|pod| replicas[*pod].acked == Some(version(&second)))
    })
    .await;
    for data in [&newer, &older] {
        assert_eq!(data.applier.applied(), vec![first.clone(), second.clone()]);
    }
    let counters = control.server.counters();
    assert_eq!(
        (counters.snapshots_sent, counters.snapshots_sent_gzip),
        (4, 2)
    );

    newer.stop().await;
    older.stop().await;
    control.stop().await;
}

#[tokio::test]
async fn a_rejected_snapshot_is_reported_and_the_previous_version_stays_acked() {
    let ca = ca();
    let control = ControlPlane::start(&ca, ServerOptions::default()).await;
    let gateway = identity("apps", "public");
    let good = config(&gateway, "good");
    control.server.publish(&gateway, Some(good.clone()));
    let data = DataPlane::start(
        control.address,
        &ca.issue_dataplane(&gateway, Duration::from_secs(3600)),
        "public-0",
    );
    tokio::time::timeout(SOON, data.state.first_applied())
        .await
        .unwrap();

    let bad = config(&gateway, REJECTED);
    control.server.publish(&gateway, Some(bad.clone()));
    eventually("the rejection is reported", SOON, || {
        let replica = control.server.reports()[&gateway].replicas["public-0"].clone();
        replica.rejected == Some((version(&bad), "rejected by the test applier".to_string()))
            && replica.acked == Some(version(&good))
    })
    .await;
    assert_eq!(data.state.applied_version(), Some(version(&good)));
    assert_eq!(control.server.counters().nacks, 1);

    // A version it accepts clears the rejection.
    let fixed = config(&gateway, "fixed");
    control.server.publish(&gateway, Some(fixed.clone()));
    eventually("the fix is acked", SOON, || {
        let replica = control.server.reports()[&gateway].replicas["public-0"].clone();
        replica.acked == Some(version(&fixed)) && replica.rejected.is_none()
    })
    .await;

    data.stop().await;
    control.stop().await;
}

#[tokio::test]
async fn unbound_listeners_are_reported_with_acks_and_serving_changes() {
    let ca = ca();
    let control = ControlPlane::start(&ca, ServerOptions::default()).await;
    let gateway = identity("apps", "public");
    let data = DataPlane::start(
        control.address,
        &ca.issue_dataplane(&gateway, Duration::from_secs(3600)),
        "public-0",
    );
    let busy = UnboundListener {
        port: 443,
        error: "Address already in use (os error 98)".into(),
        address_not_usable: false,
        address: "0.0.0.0".into(),
        udp: false,
    };
    let foreign = UnboundListener {
        port: 80,
        error: "Cannot assign requested address (os error 99)".into(),
        address_not_usable: true,
        address: "192.0.2.1".into(),
        udp: false,
    };
    data.applier
        .set_unbound(vec![busy.clone(), foreign.clone()]);
    eventually("the stream is up", SOON, || data.state.connected()).await;

    // With the Ack of a snapshot.
    control
        .server
        .publish(&gateway, Some(config(&gateway, "one")));
    eventually("the Ack carries the unbound listeners", SOON, || {
        control.server.reports()[&gateway]
            .replicas
            .get("public-0")
            .is_some_and(|replica| replica.unbound == [busy.clone(), foreign.clone()])
    })
    .await;

    // Without a snapshot: a retried bind succeeded.
    data.applier.set_unbound(vec![foreign.clone()]);
    eventually("a Serving message updates the report", SOON, || {
        control.server.reports()[&gateway].replicas["public-0"].unbound == [foreign.clone()]
    })
    .await;
    data.applier.set_unbound(Vec::new());
    eventually("everything is bound", SOON, || {
        control.server.reports()[&gateway].replicas["public-0"]
            .unbound
            .is_empty()
    })
    .await;

    data.stop().await;
    control.stop().await;
}
