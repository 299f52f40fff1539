//! The API server goes away under load: traffic keeps flowing on the last configuration and
//! /readyz says so; when it comes back, changes apply again. Its own test binary, because it
//! stops the shared API server (cargo runs test binaries one after another).

mod support;

use gatehouse::controller::{ControllerOptions, start};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use support::kube::*;
use support::*;

fn state_dir() -> Option<String> {
    std::env::var("GATEHOUSE_CLUSTER_STATE")
        .ok()
        .filter(|d| std::path::Path::new(&format!("{d}/kube-apiserver.pid")).exists())
}

async fn readyz(admin: std::net::SocketAddr) -> String {
    reqwest::get(format!("http://{admin}/readyz"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_survives_an_api_server_outage() {
    if kubeconfig().is_none() {
        return;
    }
    let Some(state) = state_dir() else {
        assert!(
            std::env::var("CI").is_err(),
            "CI sets GATEHOUSE_CLUSTER_STATE for this test"
        );
        eprintln!("note: GATEHOUSE_CLUSTER_STATE not set; skipping the outage test");
        return;
    };
    // The controller runs in this process: its log (shown when the test fails) says what the
    // watches and the prober saw.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_test_writer()
        .try_init();
    let ns = unique("out");
    kubectl(&["create", "namespace", &ns], None);
    let class = unique("class");
    let controller = format!("gatehouse.dev/{}", unique("outage"));
    let port = free_port();
    let mut host = TestHost::new();
    let backend = host.echo(9001, "a").await;
    apply(&format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: {class}}}\nspec: {{controllerName: {controller}}}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: gw, namespace: {ns}}}\nspec:\n  gatewayClassName: {class}\n  listeners: [{{name: http, port: {port}, protocol: HTTP}}]\n---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc, namespace: {ns}}}\nspec: {{ports: [{{name: http, port: 80}}]}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: svc, namespace: {ns}, labels: {{kubernetes.io/service-name: svc}}}}\naddressType: IPv4\nports: [{{name: http, port: {p}}}]\nendpoints: [{{addresses: [\"{ip}\"]}}]\n",
        p = backend.port(),
        ip = backend.ip()
    ));
    let route = |path: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r, namespace: {ns}}}\nspec:\n  parentRefs: [{{name: gw}}]\n  rules: [{{matches: [{{path: {{value: {path}}}}}], backendRefs: [{{name: svc, port: 80}}]}}]\n"
        )
    };
    apply(&route("/before"));
    let running = start(
        ControllerOptions {
            admin_address: "127.0.0.1:0".parse().unwrap(),
            default_address: "127.0.0.1".parse().unwrap(),
            local_addresses: false,
            drain_delay: Duration::ZERO,
            shutdown_grace: Duration::from_secs(2),
            dataplane: Default::default(),
            lease: None,
            controller_name: controller.clone(),
            publish_service: None,
            publish_service_template: None,
            provision: None,
        },
        kube_client().await,
    )
    .await
    .unwrap();
    let admin = running.admin_address;
    let c = client();
    eventually("the route serves", Duration::from_secs(20), || {
        let c = c.clone();
        async move { matches!(c.get(url(port, "/before")).send().await, Ok(r) if r.status() == 200) }
    })
    .await;

    let stop = Arc::new(AtomicBool::new(false));
    let (sent, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut workers = Vec::new();
    for _ in 0..2 {
        let (stop, sent, failed, c) = (stop.clone(), sent.clone(), failed.clone(), client());
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let ok =
                    matches!(c.get(url(port, "/before")).send().await, Ok(r) if r.status() == 200);
                sent.fetch_add(1, Ordering::Relaxed);
                if !ok {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }

    // Kill the API server (as a crash would) and remember how to start it again.
    let pid_file = format!("{state}/kube-apiserver.pid");
    let pid = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .to_string();
    let cmdline: Vec<String> = std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap()
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    assert!(
        Command::new("kill")
            .args(["-KILL", &pid])
            .status()
            .unwrap()
            .success()
    );
    eventually(
        "/readyz reports the outage",
        Duration::from_secs(30),
        || async move { readyz(admin).await.contains("unreachable") },
    )
    .await;
    let metrics = reqwest::get(format!("http://{admin}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("gatehouse_kubernetes_api_connected 0"),
        "the outage shows in metrics"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during = (sent.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));

    // Start it again with the same command line; the watches resume and changes apply.
    let log = std::fs::OpenOptions::new()
        .append(true)
        .open(format!("{state}/kube-apiserver.log"))
        .unwrap();
    // Not waited for: it outlives this test as the cluster's API server; cluster/down stops it
    // by the pid written below.
    #[allow(clippy::zombie_processes)]
    let child = Command::new(&cmdline[0])
        .args(&cmdline[1..])
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    std::fs::write(&pid_file, child.id().to_string()).unwrap();
    eventually(
        "the API server is back",
        Duration::from_secs(60),
        || async { kubectl_try(&["get", "--raw", "/readyz"]).is_ok() },
    )
    .await;
    eventually(
        "/readyz reports the API connected",
        Duration::from_secs(60),
        || async move { readyz(admin).await.contains("connected") },
    )
    .await;
    let metrics = reqwest::get(format!("http://{admin}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("gatehouse_kubernetes_api_connected 1"),
        "and its end"
    );
    apply(&route("/after"));
    eventually("changes apply again", Duration::from_secs(30), || {
        let c = c.clone();
        async move { matches!(c.get(url(port, "/after")).send().await, Ok(r) if r.status() == 200) }
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    let (sent, failed) = (sent.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    eprintln!(
        "API outage: {} requests while the API was down, {sent} in all, {failed} failed",
        during.0
    );
    // Requests to /before fail only after the route moved to /after, which is the change itself.
    assert_eq!(
        during.1, 0,
        "no request failed while the API server was down"
    );
    assert!(
        during.0 > 100,
        "load kept running during the outage ({} requests)",
        during.0
    );
    running.stop().await;
    let k = kubectl_bin();
    let _ = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{k} delete namespace {ns} --wait=false; {k} delete gatewayclass {class} --wait=false"
        ))
        .output();
}
