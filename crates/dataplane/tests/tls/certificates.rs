//! Certificates over time: rotation under load, an expired certificate and its expiry metric,
//! and broken certificates that affect only their own listeners.

use crate::support::*;
use bytes::Bytes;
use gatehouse_dataplane::Options;
use gatehouse_ir::*;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_rotation_under_load() {
    let be = start_http_backend("a").await;
    let ca = Ca::new("test ca");
    let port = free_port();
    let host = "rot.example.com";
    let cfg = |pair: &Pair| {
        config_with_certificates(
            vec![https_listener("rot", port, Some(host), "default/rot", "a")],
            vec![http1("a", vec![be])],
            vec![pair.certificate("default/rot")],
        )
    };
    let (dp, registry) = dataplane(Options::default()).await;
    apply_ok(&dp, &cfg(&ca.server(&[host], 1))).await;
    let client = client_config(&[&ca.pem], &[b"http/1.1"], None);

    // A connection opened before any rotation, kept alive throughout.
    let kept = connect(port, host, &client).await.unwrap();
    assert_eq!(leaf_of(&kept).serial, 1);
    let (mut kept_sender, kept_conn) = hyper::client::conn::http1::handshake(TokioIo::new(kept))
        .await
        .unwrap();
    tokio::spawn(kept_conn);

    let stop = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(AtomicUsize::new(0));
    let serials = Arc::new(Mutex::new(BTreeSet::new()));
    let new_connections = {
        let (stop, failed, serials, client) = (
            stop.clone(),
            failed.clone(),
            serials.clone(),
            client.clone(),
        );
        tokio::spawn(async move {
            let mut done = 0usize;
            while !stop.load(Ordering::Relaxed) {
                match connect(port, host, &client).await {
                    Ok(stream) => {
                        serials.lock().unwrap().insert(leaf_of(&stream).serial);
                        match get_on(stream, host, "/").await {
                            Ok(a) if a.status == 200 => done += 1,
                            other => {
                                eprintln!("request failed: {other:?}");
                                failed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    Err(e) => {
                        eprintln!("handshake failed: {e}");
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            done
        })
    };
    let kept_alive = {
        let (stop, failed) = (stop.clone(), failed.clone());
        tokio::spawn(async move {
            let mut done = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let req = Request::get("/")
                    .header("host", host)
                    .body(Empty::<Bytes>::new())
                    .unwrap();
                match kept_sender.send_request(req).await {
                    Ok(resp) if resp.status() == 200 => {
                        resp.into_body().collect().await.unwrap();
                        done += 1;
                    }
                    other => {
                        eprintln!("kept-alive request failed: {other:?}");
                        failed.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            done
        })
    };

    for serial in 2..=21u64 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        apply_ok(&dp, &cfg(&ca.server(&[host], serial))).await;
        // The very next handshake gets the new certificate.
        let stream = connect(port, host, &client).await.unwrap();
        assert_eq!(leaf_of(&stream).serial, serial);
    }
    stop.store(true, Ordering::Relaxed);
    let fresh = new_connections.await.unwrap();
    let kept = kept_alive.await.unwrap();
    let seen = serials.lock().unwrap().clone();
    eprintln!(
        "rotation: {fresh} requests on new connections, {kept} on the kept-alive one, serials seen {seen:?}"
    );
    assert_eq!(failed.load(Ordering::Relaxed), 0);
    assert!(kept >= 50, "only {kept} kept-alive requests");
    assert!(fresh >= 20, "only {fresh} new-connection requests");
    assert!(seen.len() >= 10, "new connections saw serials {seen:?}");
    for reason in [
        "no_certificate",
        "bad_client_certificate",
        "protocol_version",
        "timeout",
        "other",
        "no_route",
    ] {
        assert_eq!(failures(&registry, reason), 0.0, "{reason}");
    }
    dp.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_certificate_is_served_and_its_expiry_exported() {
    let be = start_http_backend("a").await;
    let ca = Ca::new("test ca");
    let port = free_port();
    let mut params = Ca::server_params(&["old.example.com"], 1);
    params.not_before = rcgen::date_time_ymd(2019, 1, 1);
    params.not_after = rcgen::date_time_ymd(2020, 1, 1);
    let expired = ca.issue(params);
    let with = |certs: Vec<Certificate>| {
        config_with_certificates(
            vec![https_listener(
                "old",
                port,
                Some("old.example.com"),
                "default/old",
                "a",
            )],
            vec![http1("a", vec![be])],
            certs,
        )
    };
    let (dp, registry) = dataplane(Options::default()).await;
    apply_ok(&dp, &with(vec![expired.certificate("default/old")])).await;

    let sample = r#"gatehouse_tls_certificate_expiry_timestamp_seconds{certificate="default/old"}"#;
    assert_eq!(metric(&registry, sample), 1_577_836_800.0);

    let mut lenient = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnything::all_schemes()))
        .with_no_client_auth();
    lenient.alpn_protocols = vec![b"http/1.1".to_vec()];
    let lenient = Arc::new(lenient);
    let stream = connect(port, "old.example.com", &lenient).await.unwrap();
    assert_eq!(leaf_of(&stream).not_after, 1_577_836_800);
    assert_eq!(
        get_on(stream, "old.example.com", "/").await.unwrap().status,
        200
    );
    // A verifying client refuses it, of course.
    let strict = client_config(&[&ca.pem], &[], None);
    let err = connect(port, "old.example.com", &strict).await.unwrap_err();
    assert!(err.to_string().contains("expired"), "{err}");

    // The gauge goes away with the certificate.
    apply_ok(&dp, &with(vec![])).await;
    assert!(!metrics_text(&registry).contains(sample));
    dp.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_certificates_only_affect_their_listeners() {
    let be = start_http_backend("a").await;
    let ca = Ca::new("test ca");
    let port = free_port();
    let good = ca.server(&["good.example.com"], 1);
    let other = ca.server(&["mismatch.example.com"], 2);
    let mismatched = Pair {
        cert_pem: ca.server(&["mismatch.example.com"], 3).cert_pem,
        key_pem: other.key_pem,
    };
    let garbage = Pair {
        cert_pem: "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n".into(),
        key_pem: good.key_pem.clone(),
    };
    let cfg = config_with_certificates(
        vec![
            https_listener("good", port, Some("good.example.com"), "default/good", "a"),
            https_listener(
                "mismatch",
                port,
                Some("mismatch.example.com"),
                "default/mismatch",
                "a",
            ),
            https_listener(
                "garbage",
                port,
                Some("garbage.example.com"),
                "default/garbage",
                "a",
            ),
            https_listener(
                "missing",
                port,
                Some("missing.example.com"),
                "default/missing",
                "a",
            ),
        ],
        vec![http1("a", vec![be])],
        vec![
            good.certificate("default/good"),
            mismatched.certificate("default/mismatch"),
            garbage.certificate("default/garbage"),
        ],
    );
    let (dp, registry) = dataplane(Options::default()).await;
    apply_ok(&dp, &cfg).await;
    let client = client_config(&[&ca.pem], &[], None);
    for name in [
        "mismatch.example.com",
        "garbage.example.com",
        "missing.example.com",
    ] {
        let err = connect(port, name, &client).await.unwrap_err();
        assert!(
            err.to_string().contains("HandshakeFailure"),
            "{name}: {err}"
        );
    }
    assert_eq!(
        failures_reaching(&registry, "no_certificate", 3.0).await,
        3.0
    );
    let answer = https_get(port, "good.example.com", &client, "/")
        .await
        .unwrap();
    assert_eq!(answer.status, 200);
    let text = metrics_text(&registry);
    assert!(text.contains(r#"certificate="default/good""#));
    assert!(!text.contains(r#"certificate="default/mismatch""#));
    dp.shutdown(Duration::from_secs(1)).await;
}
