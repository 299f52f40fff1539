//! Status and readiness never claim more than is true, with the controller on a real
//! kube-apiserver (cluster/up): a listener that cannot bind is Programmed=False in the
//! Gateway's status until it binds, a Gateway that shadows another on its port is told so,
//! readiness waits for the certificates of TLS listeners, and leader election is not fooled by
//! a replica whose clock is off.

mod support;

use gatehouse::controller::{ControllerOptions, start};
use gatehouse_controlplane::kubernetes::{LeaderElection, LeaseOptions};
use std::net::IpAddr;
use std::time::{Duration, Instant};
use support::kube::*;
use support::*;

struct Env {
    ns: String,
    class: String,
    controller: String,
}

impl Env {
    fn new() -> Env {
        let ns = unique("truth");
        kubectl(&["create", "namespace", &ns], None);
        let env = Env {
            class: unique("class"),
            controller: format!("gatehouse.dev/{}", unique("test")),
            ns,
        };
        apply(&format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: {}}}\nspec: {{controllerName: {}}}\n",
            env.class, env.controller
        ));
        env
    }

    /// A Gateway `name` with `listeners` (flow-style YAML list items).
    fn gateway(&self, name: &str, listeners: &[String]) {
        apply(&format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  gatewayClassName: {class}\n  listeners: [{listeners}]\n",
            ns = self.ns,
            class = self.class,
            listeners = listeners.join(", ")
        ));
    }

    fn options(&self) -> ControllerOptions {
        ControllerOptions {
            admin_address: "127.0.0.1:0".parse().unwrap(),
            default_address: "127.0.0.1".parse::<IpAddr>().unwrap(),
            local_addresses: false,
            drain_delay: Duration::ZERO,
            shutdown_grace: Duration::from_secs(2),
            dataplane: Default::default(),
            lease: None,
            controller_name: self.controller.clone(),
            publish_service: None,
            publish_service_template: None,
            provision: None,
        }
    }

    /// (status, reason, message) of condition `t` of listener `listener` of Gateway `gw`.
    fn listener_condition(
        &self,
        gw: &str,
        listener: &str,
        t: &str,
    ) -> Option<(String, String, String)> {
        let g = get("gateway", &self.ns, gw);
        let l = g["status"]["listeners"]
            .as_array()?
            .iter()
            .find(|l| l["name"] == listener)?
            .clone();
        let c = l["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == t)?
            .clone();
        let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
        Some((s("status"), s("reason"), s("message")))
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let k = kubectl_bin();
        let _ = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "{k} delete namespace {} --wait=false; {k} delete gatewayclass {} --wait=false",
                self.ns, self.class
            ))
            .output();
    }
}

async fn wait_for<F: FnMut() -> bool>(what: &str, timeout: Duration, mut check: F) {
    let deadline = Instant::now() + timeout;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bind_failures_and_shadowed_gateways_are_in_the_api_status() {
    if kubeconfig().is_none() {
        return;
    }
    let env = Env::new();
    let busy = free_port();
    let holder = std::net::TcpListener::bind(("127.0.0.1", busy)).unwrap();
    env.gateway(
        "first",
        &[format!("{{name: web, port: {busy}, protocol: HTTP}}")],
    );
    let running = start(env.options(), kube_client().await).await.unwrap();

    wait_for("Programmed=False Pending in the API", Duration::from_secs(20), || {
        matches!(env.listener_condition("first", "web", "Programmed"),
            Some((s, r, m)) if s == "False" && r == "Pending" && m.contains("Address already in use"))
    })
    .await;
    assert!(
        !running.state.control.is_ready(),
        "not ready while a listener is unbound"
    );

    // A second Gateway claims the same port and hostname: the older one keeps it.
    env.gateway(
        "second",
        &[format!("{{name: web, port: {busy}, protocol: HTTP}}")],
    );
    wait_for("the newer Gateway is told who holds the port", Duration::from_secs(20), || {
        matches!(env.listener_condition("second", "web", "Conflicted"),
            Some((s, r, m)) if s == "True" && r == "HostnameConflict" && m.contains(&format!("{}/first", env.ns)))
    })
    .await;
    assert_eq!(
        env.listener_condition("second", "web", "Accepted")
            .map(|c| c.1),
        Some("PortUnavailable".to_string())
    );

    // The port frees: the retried bind succeeds and the status follows with no API change.
    drop(holder);
    wait_for("Programmed=True once bound", Duration::from_secs(20), || {
        matches!(env.listener_condition("first", "web", "Programmed"), Some((s, _, _)) if s == "True")
    })
    .await;
    wait_for("ready", Duration::from_secs(5), || {
        running.state.control.is_ready()
    })
    .await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_only_once_the_tls_listeners_have_their_certificates() {
    if kubeconfig().is_none() {
        return;
    }
    let env = Env::new();
    let ca = gatehouse_testkit::certs::Ca::new("truth-ca");
    let pair = ca.server(&["secure.example.com"], 1);
    apply(&pair.secret_yaml(&env.ns, "cert"));
    let port = free_port();
    env.gateway(
        "tls",
        &[format!(
            "{{name: https, port: {port}, protocol: HTTPS, hostname: secure.example.com, tls: {{certificateRefs: [{{name: cert}}]}}}}"
        )],
    );
    let running = start(env.options(), kube_client().await).await.unwrap();
    let admin = running.admin_address;
    let c = client();
    // Poll readiness as a kubelet would; the moment it says ready, the HTTPS listener must
    // already serve its certificate.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ready = c
            .get(format!("http://{admin}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200);
        if ready {
            break;
        }
        assert!(Instant::now() < deadline, "never became ready");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let dump: serde_json::Value = c
        .get(format!("http://{admin}/config_dump"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let certificates: Vec<&str> = dump["config"]["certificates"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(certificates, [format!("{}/cert", env.ns)], "{dump}");
    // And a real handshake gets the certificate.
    let config = gatehouse_testkit::certs::client_config(&[&ca.pem], &[], None);
    let connector = tokio_rustls::TlsConnector::from(config);
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("secure.example.com").unwrap();
    connector.connect(name, tcp).await.expect("TLS handshake");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_with_a_skewed_clock_keeps_its_lease() {
    if kubeconfig().is_none() {
        return;
    }
    let ns = unique("lease");
    kubectl(&["create", "namespace", &ns], None);
    let lease = |id: &str, skew: i64| LeaseOptions {
        namespace: ns.clone(),
        name: "skew".into(),
        identity: id.into(),
        lease_duration: Duration::from_secs(2),
        renew_every: Duration::from_millis(400),
        clock_skew_secs: skew,
    };
    // The holder's clock is an hour behind: every renewTime it writes looks long expired to
    // anyone comparing it with their own clock.
    let behind = LeaderElection::start(kube_client().await, lease("behind", -3600));
    wait_for("the skewed replica leads", Duration::from_secs(10), || {
        behind.is_leader()
    })
    .await;
    let on_time = LeaderElection::start(kube_client().await, lease("on-time", 0));
    // Three lease durations: a candidate judging by renewTime would have taken over at once.
    let watch_until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < watch_until {
        assert!(
            !on_time.is_leader(),
            "the second replica took a Lease that is being renewed"
        );
        assert!(behind.is_leader(), "the holder lost its Lease");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Released, it moves at once.
    behind.release().await;
    wait_for(
        "the other replica takes over",
        Duration::from_secs(5),
        || on_time.is_leader(),
    )
    .await;
    on_time.release().await;
    kubectl(&["delete", "namespace", &ns, "--wait=false"], None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resigning_leader_hands_over_within_a_renewal() {
    if kubeconfig().is_none() {
        return;
    }
    let ns = unique("resign");
    kubectl(&["create", "namespace", &ns], None);
    let lease = |id: &str| LeaseOptions {
        namespace: ns.clone(),
        name: "resign".into(),
        identity: id.into(),
        lease_duration: Duration::from_secs(15),
        renew_every: Duration::from_millis(500),
        clock_skew_secs: 0,
    };
    let first = LeaderElection::start(kube_client().await, lease("first"));
    wait_for("the first replica leads", Duration::from_secs(10), || {
        first.is_leader()
    })
    .await;
    let second = LeaderElection::start(kube_client().await, lease("second"));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !second.is_leader(),
        "the standby took a Lease being renewed"
    );
    // Shutdown begins: the holder resigns while it still runs (it drains for seconds yet).
    let resigned = Instant::now();
    first.resign_token().cancel();
    wait_for(
        "the resigning replica to stop leading",
        Duration::from_secs(2),
        || !first.is_leader(),
    )
    .await;
    // Well inside the 15 s lease duration: only a Lease handed back moves this fast.
    wait_for("the standby takes over", Duration::from_secs(4), || {
        second.is_leader()
    })
    .await;
    assert!(resigned.elapsed() < Duration::from_secs(4));
    first.release().await;
    second.release().await;
    kubectl(&["delete", "namespace", &ns, "--wait=false"], None);
}
