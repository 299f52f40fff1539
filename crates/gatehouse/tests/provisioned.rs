//! Provisioned mode against a real kube-apiserver (cluster/up): the controller creates each
//! Gateway's data-plane objects, owned by the Gateway, and a real `gatehouse proxy` holding
//! only the credentials from the provisioned Secret receives that Gateway's configuration over
//! mutual TLS and serves it; status says Programmed only once a replica applied it.

mod support;

use base64::Engine as _;
use gatehouse::controller::{ControllerOptions, ProvisionOptions, start};
use gatehouse::proxy::{self, ProxyOptions};
use gatehouse_controlplane::provision::Settings;
use gatehouse_translate::ObjectKey;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use support::kube::*;
use support::*;

fn condition(ns: &str, kind: &str, name: &str, t: &str) -> Option<(String, String, String)> {
    let v = get(kind, ns, name);
    let c = v["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == t)?
        .clone();
    Some((
        c["status"].as_str()?.to_string(),
        c["reason"].as_str()?.to_string(),
        c["message"].as_str().unwrap_or_default().to_string(),
    ))
}

fn exists(kind: &str, ns: &str, name: &str) -> bool {
    kubectl_try(&["get", kind, "-n", ns, name, "-o", "name"]).is_ok()
}

/// The GatehouseParameters CRD as the chart installs it, established.
fn install_parameters_crd() {
    let crd = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/crds/gatehouse.dev_gatehouseparameters.yaml"
    );
    kubectl(
        &["apply", "--server-side", "--force-conflicts", "-f", crd],
        None,
    );
    kubectl(
        &[
            "wait",
            "--for=condition=Established",
            "crd/gatehouseparameters.gatehouse.dev",
        ],
        None,
    );
}

async fn answer(c: &reqwest::Client, url: &str) -> (u16, String) {
    match c.get(url).header("host", "app.example").send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            let v: serde_json::Value = r.json().await.unwrap_or_default();
            (status, v["name"].as_str().unwrap_or_default().to_string())
        }
        Err(_) => (0, String::new()),
    }
}

/// A provisioning controller answering to `controller_name`, its CA in `ns`/`ca_secret`, its
/// config stream on 127.0.0.1:`sync_port`; no leader election, no load balancer.
fn provisioning(
    controller_name: &str,
    ns: &str,
    ca_secret: &str,
    sync_port: u16,
) -> ControllerOptions {
    ControllerOptions {
        admin_address: "127.0.0.1:0".parse().unwrap(),
        default_address: "127.0.0.1".parse::<IpAddr>().unwrap(),
        local_addresses: false,
        drain_delay: Duration::ZERO,
        shutdown_grace: Duration::from_secs(2),
        dataplane: Default::default(),
        lease: None,
        controller_name: controller_name.to_string(),
        publish_service: None,
        publish_service_template: None,
        provision: Some(ProvisionOptions {
            ca_secret: ObjectKey::new(ns, ca_secret),
            sync_address: SocketAddr::from(([127, 0, 0, 1], sync_port)),
            sync_dns_names: vec![],
            sync_ips: vec!["127.0.0.1".parse().unwrap()],
            settings: Settings {
                image: "gatehouse:test".into(),
                image_pull_policy: None,
                control_plane_endpoint: format!("https://127.0.0.1:{sync_port}"),
                control_plane_server_name: "127.0.0.1".into(),
                controller_name: controller_name.to_string(),
            },
            dataplane_bind: "127.0.0.1".parse().unwrap(),
        }),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_gets_its_own_data_plane_fed_over_the_sync_stream() {
    if kubeconfig().is_none() {
        return;
    }
    let ns = unique("prov");
    kubectl(&["create", "namespace", &ns], None);
    let class = unique("class");
    let controller_name = format!("gatehouse.dev/{}", unique("test"));
    let (listener_port, other_port, sync_port) = (free_port(), free_port(), free_port());
    // The class asks for ClusterIP Services (there is no load balancer in this cluster) and
    // two replicas.
    install_parameters_crd();
    let mut host = TestHost::new();
    let a = host.echo(9011, "a").await;
    apply(&format!(
        "apiVersion: gatehouse.dev/v1alpha1\nkind: GatehouseParameters\nmetadata: {{name: params, namespace: {ns}}}\nspec: {{replicas: 2, service: {{type: ClusterIP}}}}\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: {class}}}\nspec:\n  controllerName: {controller_name}\n  parametersRef: {{group: gatehouse.dev, kind: GatehouseParameters, name: params, namespace: {ns}}}\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: gw, namespace: {ns}}}\nspec:\n  gatewayClassName: {class}\n  listeners: [{{name: http, port: {listener_port}, protocol: HTTP}}]\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: other, namespace: {ns}}}\nspec:\n  gatewayClassName: {class}\n  listeners: [{{name: http, port: {other_port}, protocol: HTTP}}]\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {{name: svc, namespace: {ns}}}\nspec:\n  ports: [{{name: http, port: 80, targetPort: {p}}}]\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: svc\n  namespace: {ns}\n  labels: {{kubernetes.io/service-name: svc}}\naddressType: IPv4\nports: [{{name: http, port: {p}, protocol: TCP}}]\nendpoints:\n- addresses: [\"{ip}\"]\n  conditions: {{ready: true}}\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r, namespace: {ns}}}\nspec:\n  parentRefs: [{{name: gw}}, {{name: other}}]\n  hostnames: [app.example]\n  rules: [{{matches: [{{path: {{value: /one}}}}], backendRefs: [{{name: svc, port: 80}}]}}]\n",
        p = a.port(),
        ip = a.ip(),
    ));

    let endpoint = format!("https://127.0.0.1:{sync_port}");
    let options = || provisioning(&controller_name, &ns, "gatehouse-ca", sync_port);
    let running = start(options(), kube_client().await).await.unwrap();

    // Every Gateway's objects, owned by it; the data plane's account has no token.
    eventually(
        "the data-plane objects exist",
        Duration::from_secs(20),
        || async {
            ["deployment", "service", "serviceaccount"]
                .iter()
                .all(|k| exists(k, &ns, "gw-gatehouse") && exists(k, &ns, "other-gatehouse"))
                && exists("secret", &ns, "gw-gatehouse-credentials")
        },
    )
    .await;
    let gw_uid = get("gateway", &ns, "gw")["metadata"]["uid"].clone();
    for kind in ["deployment", "service", "serviceaccount", "secret"] {
        let name = if kind == "secret" {
            "gw-gatehouse-credentials"
        } else {
            "gw-gatehouse"
        };
        let o = get(kind, &ns, name);
        assert_eq!(
            o["metadata"]["ownerReferences"][0]["uid"], gw_uid,
            "{kind} owned by the Gateway"
        );
        assert_eq!(o["metadata"]["ownerReferences"][0]["kind"], "Gateway");
    }
    assert_eq!(
        get("serviceaccount", &ns, "gw-gatehouse")["automountServiceAccountToken"],
        false
    );
    let d = get("deployment", &ns, "gw-gatehouse");
    let args = d["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(
        args.contains(&format!("--control-plane={endpoint}")),
        "{args}"
    );
    let svc = get("service", &ns, "gw-gatehouse");
    assert_eq!(svc["spec"]["ports"][0]["port"], listener_port);
    assert_eq!(svc["spec"]["type"], "ClusterIP", "the class's parameters");
    assert_eq!(d["spec"]["replicas"], 2, "the class's parameters");
    // A parameters change reaches the Deployment.
    kubectl(
        &[
            "patch",
            "gatehouseparameters",
            "-n",
            &ns,
            "params",
            "--type=merge",
            "-p",
            r#"{"spec":{"replicas":3}}"#,
        ],
        None,
    );
    eventually(
        "the Deployment follows the parameters",
        Duration::from_secs(20),
        || async { get("deployment", &ns, "gw-gatehouse")["spec"]["replicas"] == 3 },
    )
    .await;
    // No replica yet: not Programmed, and status says why.
    eventually(
        "Programmed=False before any data plane",
        Duration::from_secs(20),
        || async {
            condition(&ns, "gateway", "gw", "Programmed").is_some_and(|(s, r, m)| {
                s == "False" && r == "Pending" && m.contains("no data-plane replica")
            })
        },
    )
    .await;

    // A data plane holding only the provisioned Secret's contents.
    let secret = get("secret", &ns, "gw-gatehouse-credentials");
    let dir = tempfile::tempdir().unwrap();
    for key in ["tls.crt", "tls.key", "ca.crt"] {
        let b64 = secret["data"][key].as_str().unwrap();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap();
        std::fs::write(dir.path().join(key), bytes).unwrap();
    }
    let proxy = proxy::start(ProxyOptions {
        admin_address: "127.0.0.1:0".parse().unwrap(),
        control_plane: endpoint.clone(),
        control_plane_name: "127.0.0.1".into(),
        credentials: dir.path().to_path_buf(),
        pod: "gw-pod-1".into(),
        drain_delay: Duration::ZERO,
        shutdown_grace: Duration::from_secs(2),
        dataplane: Default::default(),
    })
    .await
    .unwrap();
    let c = client();
    eventually(
        "the data plane serves its Gateway",
        Duration::from_secs(20),
        || {
            let (c, u) = (c.clone(), url(listener_port, "/one"));
            async move { answer(&c, &u).await == (200, "a".into()) }
        },
    )
    .await;
    // Only its own Gateway: nothing listens on the other Gateway's port.
    assert_eq!(
        answer(&c, &url(other_port, "/one")).await.0,
        0,
        "the other Gateway is not served here"
    );
    eventually(
        "Programmed=True once applied",
        Duration::from_secs(20),
        || async {
            condition(&ns, "gateway", "gw", "Programmed").is_some_and(|(s, _, _)| s == "True")
        },
    )
    .await;
    // A provisioning controller's class claims the features only it has.
    let claimed: Vec<String> = get("gatewayclass", &ns, &class)["status"]["supportedFeatures"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["name"].as_str().map(str::to_string))
        .collect();
    for feature in [
        "GatewayInfrastructure",
        "GatewayStaticAddresses",
        "HTTPRoute",
    ] {
        assert!(
            claimed.iter().any(|f| f == feature),
            "{feature} in {claimed:?}"
        );
    }
    let cluster_ip = get("service", &ns, "gw-gatehouse")["spec"]["clusterIP"].clone();
    assert_eq!(
        get("gateway", &ns, "gw")["status"]["addresses"][0]["value"],
        cluster_ip,
        "status.addresses is the Gateway's own Service"
    );
    assert!(
        condition(&ns, "gateway", "other", "Programmed").is_some_and(|(s, _, _)| s == "False"),
        "the other Gateway has no replica"
    );

    // A change reaches the data plane over the stream.
    apply(&format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r, namespace: {ns}}}\nspec:\n  parentRefs: [{{name: gw}}, {{name: other}}]\n  hostnames: [app.example]\n  rules: [{{matches: [{{path: {{value: /two}}}}], backendRefs: [{{name: svc, port: 80}}]}}]\n"
    ));
    eventually("the update applies", Duration::from_secs(20), || {
        let c = c.clone();
        let (old, new) = (url(listener_port, "/one"), url(listener_port, "/two"));
        async move { answer(&c, &old).await.0 == 404 && answer(&c, &new).await == (200, "a".into()) }
    })
    .await;

    // A Gateway that is no longer ours loses its data-plane objects.
    apply(&format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: other, namespace: {ns}}}\nspec:\n  gatewayClassName: not-ours\n  listeners: [{{name: http, port: {other_port}, protocol: HTTP}}]\n"
    ));
    eventually(
        "the other Gateway's objects are deleted",
        Duration::from_secs(20),
        || async {
            !exists("deployment", &ns, "other-gatehouse")
                && !exists("service", &ns, "other-gatehouse")
        },
    )
    .await;
    assert!(exists("deployment", &ns, "gw-gatehouse"));

    // The control plane goes away under load: the data plane keeps serving, every request
    // succeeds, and readiness stays (it says the control plane is unreachable).
    let load = {
        let (c, u) = (c.clone(), url(listener_port, "/two"));
        tokio::spawn(async move {
            let (mut ok, mut failed) = (0u32, 0u32);
            let until = std::time::Instant::now() + Duration::from_secs(4);
            while std::time::Instant::now() < until {
                if answer(&c, &u).await == (200, "a".into()) {
                    ok += 1;
                } else {
                    failed += 1;
                }
            }
            (ok, failed)
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    running.stop().await;
    let (ok, failed) = load.await.unwrap();
    eprintln!("control plane stopped under load: {ok} requests ok, {failed} failed");
    assert_eq!(failed, 0, "{ok} ok");
    assert!(ok > 10, "the load ran ({ok} requests)");
    let readyz = c
        .get(format!("http://{}/readyz", proxy.admin_address))
        .send()
        .await
        .unwrap();
    assert_eq!(readyz.status().as_u16(), 200);
    let text = readyz.text().await.unwrap();
    assert!(text.contains("unreachable"), "{text}");

    // Back: the same CA (from its Secret), the data plane reconnects and follows changes.
    let running = start(options(), kube_client().await).await.unwrap();
    apply(&format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r, namespace: {ns}}}\nspec:\n  parentRefs: [{{name: gw}}]\n  hostnames: [app.example]\n  rules: [{{matches: [{{path: {{value: /three}}}}], backendRefs: [{{name: svc, port: 80}}]}}]\n"
    ));
    eventually(
        "after the restart a change applies",
        Duration::from_secs(30),
        || {
            let (c, u) = (c.clone(), url(listener_port, "/three"));
            async move { answer(&c, &u).await == (200, "a".into()) }
        },
    )
    .await;
    eventually("Programmed=True again", Duration::from_secs(20), || async {
        condition(&ns, "gateway", "gw", "Programmed").is_some_and(|(s, _, _)| s == "True")
    })
    .await;

    proxy.stop().await;
    running.stop().await;
    kubectl(&["delete", "namespace", &ns, "--wait=false"], None);
    kubectl(&["delete", "gatewayclass", &class, "--wait=false"], None);
}

/// spec.addresses[].routability (GEP-5093) on the real API server, whose experimental Gateway
/// CRD carries the field: `Cluster` alone makes the data plane's Service a ClusterIP one even
/// though the class's default is LoadBalancer (an internal Gateway must not get a public
/// address), a value pins the cluster IP, and status reports each cluster IP with its
/// routability and says in AddressesAssigned what was not given. An unknown routability gets
/// no data plane at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routability_cluster_gets_a_cluster_ip_and_says_so() {
    if kubeconfig().is_none() {
        return;
    }
    let ns = unique("route");
    kubectl(&["create", "namespace", &ns], None);
    let class = unique("class");
    let controller_name = format!("gatehouse.dev/{}", unique("test"));
    let (port, sync_port) = (free_port(), free_port());
    // In the cluster's service range (cluster/up: 10.96.0.0/12), different on every run.
    let pinned = format!(
        "10.{}.{}.{}",
        100 + port % 8,
        port / 256 % 256,
        port % 254 + 1
    );
    let gateway = |name: &str, addresses: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  gatewayClassName: {class}\n  addresses: {addresses}\n  listeners: [{{name: http, port: {port}, protocol: HTTP}}]\n---\n"
        )
    };
    apply(&format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: {class}}}\nspec: {{controllerName: {controller_name}}}\n---\n{}{}{}{}",
        gateway("internal", "[{type: IPAddress, routability: Cluster}]"),
        gateway(
            "pinned",
            &format!("[{{type: IPAddress, value: \"{pinned}\", routability: Cluster}}]")
        ),
        gateway(
            "both",
            "[{type: IPAddress, routability: Cluster}, {type: IPAddress}]"
        ),
        gateway(
            "vendor",
            "[{type: IPAddress, routability: example.com/private}]"
        ),
    ));
    let options = provisioning(&controller_name, &ns, "gatehouse-ca", sync_port);
    let running = start(options, kube_client().await).await.unwrap();

    // The first status comes before the provisioned Services exist (NotAssigned); the one
    // that counts comes once the controller sees them.
    let settled = |name: &'static str, want: &'static str| {
        let ns = ns.clone();
        move || {
            let ns = ns.clone();
            async move {
                condition(&ns, "gateway", name, "AddressesAssigned").is_some_and(|c| c.1 == want)
            }
        }
    };
    for (name, want) in [
        ("internal", "AddressesAssigned"),
        ("pinned", "AddressesAssigned"),
        ("both", "PartiallyAssigned"),
    ] {
        eventually(
            &format!("{name}: AddressesAssigned reason {want}"),
            Duration::from_secs(30),
            settled(name, want),
        )
        .await;
    }
    // And it stays so: nothing in later passes takes the addresses back.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Only Cluster: a ClusterIP Service, although the class asks for nothing (LoadBalancer).
    let svc = get("service", &ns, "internal-gatehouse");
    assert_eq!(svc["spec"]["type"], "ClusterIP");
    let cluster_ip = svc["spec"]["clusterIP"].as_str().unwrap().to_string();
    let gw = get("gateway", &ns, "internal");
    assert_eq!(gw["status"]["addresses"][0]["value"], cluster_ip.as_str());
    assert_eq!(gw["status"]["addresses"][0]["routability"], "Cluster");
    let (status, reason, _) = condition(&ns, "gateway", "internal", "AddressesAssigned").unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "AddressesAssigned")
    );

    // A value is the Service's cluster IP.
    let svc = get("service", &ns, "pinned-gatehouse");
    assert_eq!(svc["spec"]["clusterIP"], pinned.as_str());
    assert_eq!(
        condition(&ns, "gateway", "pinned", "AddressesAssigned").map(|c| c.0),
        Some("True".into())
    );

    // Cluster and the default: the Service stays a LoadBalancer, whose cluster IP is reported;
    // no load balancer runs here, so the default entry is not assigned and status says so.
    let svc = get("service", &ns, "both-gatehouse");
    assert_eq!(svc["spec"]["type"], "LoadBalancer");
    let gw = get("gateway", &ns, "both");
    let addresses = gw["status"]["addresses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(addresses.len(), 1, "{addresses:?}");
    assert_eq!(addresses[0]["value"], svc["spec"]["clusterIP"]);
    assert_eq!(addresses[0]["routability"], "Cluster");
    let (status, reason, message) = condition(&ns, "gateway", "both", "AddressesAssigned").unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "PartiallyAssigned")
    );
    assert_eq!(message, "not assigned: an IPAddress");

    // An unknown routability: not Accepted, and no data plane to serve it anywhere else.
    eventually(
        "vendor: Accepted=False UnsupportedAddress",
        Duration::from_secs(30),
        || async {
            condition(&ns, "gateway", "vendor", "Accepted").is_some_and(|(s, r, m)| {
                s == "False" && r == "UnsupportedAddress" && m.contains("example.com/private")
            })
        },
    )
    .await;
    assert!(!exists("deployment", &ns, "vendor-gatehouse"));
    assert!(!exists("service", &ns, "vendor-gatehouse"));

    // Another installation in the same cluster (another controllerName, a class and a Gateway
    // of its own) starts: its sweep for leftovers must not take our data planes for its own.
    let other_class = unique("class");
    let other_name = format!("gatehouse.dev/{}", unique("other"));
    apply(&format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: {other_class}}}\nspec: {{controllerName: {other_name}}}\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: theirs, namespace: {ns}}}\nspec:\n  gatewayClassName: {other_class}\n  listeners: [{{name: http, port: {port}, protocol: HTTP}}]\n"
    ));
    let other_options = provisioning(&other_name, &ns, "other-ca", free_port());
    let other = start(other_options, kube_client().await).await.unwrap();
    eventually(
        "the other installation provisioned its Gateway (and swept)",
        Duration::from_secs(30),
        || async { exists("deployment", &ns, "theirs-gatehouse") },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    for name in ["internal", "pinned", "both"] {
        assert!(
            exists("deployment", &ns, &format!("{name}-gatehouse")),
            "{name}'s data plane survived the other installation's sweep"
        );
    }
    assert_eq!(
        get("deployment", &ns, "internal-gatehouse")["metadata"]["annotations"]["gatehouse.dev/controller-name"],
        controller_name.as_str()
    );

    other.stop().await;
    running.stop().await;
    kubectl(&["delete", "namespace", &ns, "--wait=false"], None);
    kubectl(
        &[
            "delete",
            "gatewayclass",
            &class,
            &other_class,
            "--wait=false",
        ],
        None,
    );
}

/// A Gateway's data-plane objects that the API server refused are applied again by
/// themselves: an admission policy refuses the Deployment at three replicas, status says so,
/// and once the policy is gone the Deployment gets its three replicas with nothing else
/// changing (before, the loop ran only on changes: a second failure that read like the first
/// left the Gateway at its old replica count until some unrelated change).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_data_plane_apply_is_tried_again_until_it_goes_through() {
    if kubeconfig().is_none() {
        return;
    }
    let ns = unique("retry");
    kubectl(&["create", "namespace", &ns], None);
    let class = unique("class");
    let policy = unique("three-refused");
    let controller_name = format!("gatehouse.dev/{}", unique("test"));
    let (listener_port, sync_port) = (free_port(), free_port());
    install_parameters_crd();
    // Deployments of three replicas are refused in this namespace only.
    refuse_in_namespace(
        &policy,
        &ns,
        "apps",
        "deployments",
        "object.spec.replicas != 3",
        "three replicas refused by the test",
    );
    // The API server enforces a policy once its informer has it.
    let refused = || {
        kubectl_try(&[
            "create",
            "deployment",
            "probe",
            "-n",
            &ns,
            "--image=x",
            "--replicas=3",
            "--dry-run=server",
        ])
        .is_err_and(|e| e.contains("three replicas refused"))
    };
    eventually(
        "the admission policy is in force",
        Duration::from_secs(30),
        || async { refused() },
    )
    .await;
    apply(&format!(
        "apiVersion: gatehouse.dev/v1alpha1\nkind: GatehouseParameters\nmetadata: {{name: params, namespace: {ns}}}\nspec: {{replicas: 3, service: {{type: ClusterIP}}}}\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: {class}}}\nspec:\n  controllerName: {controller_name}\n  parametersRef: {{group: gatehouse.dev, kind: GatehouseParameters, name: params, namespace: {ns}}}\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: gw, namespace: {ns}}}\nspec:\n  gatewayClassName: {class}\n  listeners: [{{name: http, port: {listener_port}, protocol: HTTP}}]\n"
    ));
    let running = start(
        provisioning(&controller_name, &ns, "gatehouse-ca", sync_port),
        kube_client().await,
    )
    .await
    .unwrap();
    eventually(
        "status says the Deployment was refused",
        Duration::from_secs(30),
        || async {
            condition(&ns, "gateway", "gw", "Programmed")
                .is_some_and(|(s, _, m)| s == "False" && m.contains("three replicas refused"))
        },
    )
    .await;
    assert!(
        !exists("deployment", &ns, "gw-gatehouse"),
        "the API server refused it"
    );
    // Several tries have failed by now; the policy goes, and nothing else changes.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop_refusing(&policy);
    eventually(
        "the Deployment is applied with three replicas",
        Duration::from_secs(60),
        || async {
            exists("deployment", &ns, "gw-gatehouse")
                && get("deployment", &ns, "gw-gatehouse")["spec"]["replicas"] == 3
        },
    )
    .await;
    eventually(
        "status no longer says it was refused",
        Duration::from_secs(30),
        || async {
            condition(&ns, "gateway", "gw", "Programmed")
                .is_some_and(|(_, _, m)| !m.contains("three replicas refused"))
        },
    )
    .await;

    running.stop().await;
    kubectl(&["delete", "namespace", &ns, "--wait=false"], None);
    kubectl(&["delete", "gatewayclass", &class, "--wait=false"], None);
}
