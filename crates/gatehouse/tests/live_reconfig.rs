//! Live reconfiguration under load: files change every 200 ms while clients send requests on
//! kept-alive connections; not one request may fail and every change must become visible.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use support::*;

fn routes(backend: &str, version: u32) -> String {
    route(
        "live",
        &format!(
            "  rules:\n  - backendRefs: [{{name: {backend}, port: 80}}]\n    filters:\n    - type: ResponseHeaderModifier\n      responseHeaderModifier: {{set: [{{name: x-config-version, value: \"{version}\"}}]}}"
        ),
    )
}

/// A gateway on one HTTP port with echo backends `a` and `b`, its route to `a` at `version`.
async fn two_backends(version: u32) -> (Gateway, u16) {
    let a = echo("a").await;
    let b = echo("b").await;
    let port = free_port();
    let backends = format!("{}{}", service("a", &[a], None), service("b", &[b], None));
    let gw = Gateway::start(&[
        ("gateway.yaml", gateway(&[("http", port)])),
        ("backends.yaml", backends),
        ("routes.yaml", routes("a", version)),
    ])
    .await;
    (gw, port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_apply_under_load_without_failed_requests() {
    let (gw, port) = two_backends(0).await;
    let extra_port = free_port();

    // Load: 4 workers, each with its own kept-alive connection, until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for _ in 0..4 {
        let (stop, sent, failed) = (stop.clone(), sent.clone(), failed.clone());
        workers.push(tokio::spawn(async move {
            let c = builder().pool_max_idle_per_host(1).build().unwrap();
            while !stop.load(Ordering::Relaxed) {
                let ok = match c.get(url(port, "/load")).send().await {
                    Ok(r) => r.status() == 200 && r.bytes().await.is_ok(),
                    Err(_) => false,
                };
                sent.fetch_add(1, Ordering::Relaxed);
                if !ok {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }

    let probe = client();
    let mut visible_after = Vec::new();
    for i in 1..=20u32 {
        let started = Instant::now();
        let backend = if i % 2 == 1 { "b" } else { "a" };
        gw.write("routes.yaml", &routes(backend, i));
        let want = i.to_string();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let r = probe.get(url(port, "/probe")).send().await.unwrap();
            let version = r
                .headers()
                .get("x-config-version")
                .map(|v| v.to_str().unwrap().to_string());
            let name = echo_json(r).await["name"].as_str().unwrap().to_string();
            if version.as_deref() == Some(want.as_str()) {
                assert_eq!(name, backend, "the new backend arrives with the new filter");
                break;
            }
            assert!(Instant::now() < deadline, "change {i} never became visible");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        visible_after.push(started.elapsed());
        tokio::time::sleep(Duration::from_millis(200).saturating_sub(started.elapsed())).await;
    }

    // A second listener appears, serves, and goes away, while the first keeps serving.
    gw.write(
        "gateway.yaml",
        &gateway(&[("http", port), ("extra", extra_port)]),
    );
    eventually("the new listener serves", Duration::from_secs(5), || {
        let c = probe.clone();
        async move { matches!(c.get(url(extra_port, "/x")).send().await, Ok(r) if r.status() == 200) }
    })
    .await;
    gw.write("gateway.yaml", &gateway(&[("http", port)]));
    eventually(
        "the removed listener refuses connections",
        Duration::from_secs(5),
        || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", extra_port))
                .await
                .is_err()
        },
    )
    .await;

    // Keep the load going long enough to count as several thousand requests.
    let deadline = Instant::now() + Duration::from_secs(30);
    while sent.load(Ordering::Relaxed) < 5000 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    let (sent, failed) = (sent.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    visible_after.sort();
    eprintln!(
        "{sent} requests, {failed} failed; change visible after: median {:?}, max {:?}; generation {}",
        visible_after[visible_after.len() / 2],
        visible_after.last().unwrap(),
        gw.generation()
    );
    assert_eq!(failed, 0, "requests failed during reconfiguration");
    assert!(sent >= 5000, "only {sent} requests were sent");
    assert!(gw.generation() >= 22, "every change produced a generation");
    gw.stop().await;
}

/// A file rewritten with nothing translate reads changed (a comment, the same objects in new
/// copies) reuses the last translation: a pass runs, nothing is applied, and traffic is
/// untouched; the next real change is translated and applied as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewrite_that_changes_nothing_reuses_the_last_translation() {
    let (gw, port) = two_backends(1).await;
    let admin = gw.admin();
    let reused = || {
        metric(
            admin,
            "gatehouse_config_reconciles_total{result=\"reused\"}",
        )
    };
    let (before, generation) = (reused().await, gw.generation());

    // The same route, a comment and a resourceVersion added: neither is read by translate.
    let rewritten = routes("a", 1).replacen(
        "metadata: {name: live,",
        "metadata: {resourceVersion: \"7\", name: live,",
        1,
    );
    assert_ne!(rewritten, routes("a", 1));
    gw.write("routes.yaml", &format!("# a comment added\n{rewritten}"));
    // /status shows the objects as they are now, not as the last translation saw them. Both
    // are waited for: a reused pass may also come from a file event of the start, before the
    // rewrite is read.
    let route_version = || async {
        let status = gw.status().await;
        let route = status["objects"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["kind"] == "HTTPRoute" && o["metadata"]["name"] == "live")
            .cloned()
            .expect("the route in /status");
        route["metadata"]["resourceVersion"].clone()
    };
    eventually(
        "a reused pass, and /status showing resourceVersion 7",
        Duration::from_secs(5),
        || async { reused().await > before && route_version().await == "7" },
    )
    .await;
    assert_eq!(gw.generation(), generation, "nothing was applied");
    let r = client().get(url(port, "/x")).send().await.unwrap();
    assert_eq!(echo_json(r).await["name"], "a");

    gw.write("routes.yaml", &routes("b", 2));
    eventually("the real change serves", Duration::from_secs(5), || async {
        let r = client().get(url(port, "/x")).send().await.unwrap();
        echo_json(r).await["name"] == "b"
    })
    .await;
    assert_eq!(gw.generation(), generation + 1);
    gw.stop().await;
}
