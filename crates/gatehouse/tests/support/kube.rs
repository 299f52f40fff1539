//! Kubernetes test support: the local API server from cluster/up (KUBECONFIG), kubectl, and a
//! test host in its own network namespace, because the API server refuses loopback endpoint
//! addresses.
#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// The cluster's kubeconfig, or `None` (with a note) when no cluster was started. CI always
/// starts one (`make test`), so there a missing cluster is a failure, not a skip.
pub fn kubeconfig() -> Option<String> {
    match std::env::var("KUBECONFIG") {
        Ok(k) if std::path::Path::new(&k).exists() => Some(k),
        _ => {
            assert!(
                std::env::var("CI").is_err(),
                "CI runs these tests against cluster/up: KUBECONFIG must be set"
            );
            eprintln!(
                "note: no KUBECONFIG; run `eval \"$(cluster/up)\"` to run the Kubernetes tests"
            );
            None
        }
    }
}

pub async fn kube_client() -> kube::Client {
    let config = kube::Config::infer().await.expect("kubeconfig loads");
    kube::Client::try_from(config).expect("client")
}

/// The cluster's kubectl (cluster/up exports its directory), else the one on PATH.
pub fn kubectl_bin() -> String {
    std::env::var("GATEHOUSE_CLUSTER_BIN")
        .map(|b| format!("{b}/kubectl"))
        .unwrap_or_else(|_| "kubectl".into())
}

/// Run kubectl with `args`: its output, or its error output when it fails (for checks that
/// expect a refusal, or that an object is absent).
pub fn kubectl_try(args: &[&str]) -> Result<String, String> {
    let out = Command::new(kubectl_bin())
        .args(args)
        .output()
        .expect("kubectl runs");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Run kubectl with `args`, feeding `stdin`; panics with its output on failure.
pub fn kubectl(args: &[&str], stdin: Option<&str>) -> String {
    let mut child = Command::new(kubectl_bin())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    if let Some(input) = stdin {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

pub fn apply(yaml: &str) {
    kubectl(&["apply", "-f", "-"], Some(yaml));
}

/// `kubectl get -o json` of one object.
pub fn get(kind: &str, ns: &str, name: &str) -> serde_json::Value {
    serde_json::from_str(&kubectl(&["get", kind, "-n", ns, name, "-o", "json"], None)).unwrap()
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A short name unique to this test process.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}{}x{}",
        std::process::id() % 100_000,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A network namespace joined to this host by a veth pair: the backends' "pod" address.
pub struct TestHost {
    pub ns: String,
    veth: String,
    pub ip: Ipv4Addr,
    /// This host's end of the veth pair: a non-loopback address (EndpointSlices refuse
    /// loopback ones) for backends that run inside the test process.
    pub host_ip: Ipv4Addr,
    children: Vec<Child>,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("iproute2 is installed");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl TestHost {
    pub fn new() -> TestHost {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let ns = format!("gh{}n{n}", pid % 100_000);
        let veth = format!("gh{}v{n}", pid % 100_000);
        let (b, c) = (200 + (pid % 50) as u8, (n % 250) as u8);
        let host_ip = format!("10.{b}.{c}.1/30");
        let ip_addr = Ipv4Addr::new(10, b, c, 2);
        ip(&["netns", "add", &ns]);
        ip(&[
            "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ]);
        ip(&["addr", "add", &host_ip, "dev", &veth]);
        ip(&["link", "set", &veth, "up"]);
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{ip_addr}/30"),
            "dev",
            "eth0",
        ]);
        ip(&["-n", &ns, "link", "set", "eth0", "up"]);
        ip(&["-n", &ns, "link", "set", "lo", "up"]);
        TestHost {
            ns,
            veth,
            ip: ip_addr,
            host_ip: Ipv4Addr::new(10, b, c, 1),
            children: Vec::new(),
        }
    }

    /// Start `gatehouse echo` inside the namespace and wait until it answers.
    pub async fn echo(&mut self, port: u16, name: &str) -> SocketAddr {
        let addr = SocketAddr::from((self.ip, port));
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.ns,
                env!("CARGO_BIN_EXE_gatehouse"),
                "echo",
                "--listen",
                &addr.to_string(),
                "--name",
                name,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.children.push(child);
        for _ in 0..500 {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return addr;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("echo {name} did not start on {addr}");
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.veth])
            .output();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}

/// A ValidatingAdmissionPolicy (with its binding, both named `name`) that refuses CREATE and
/// UPDATE of `resource` (`group`, v1) in namespace `ns` unless `expression` (CEL) holds, with
/// `message`. The API server enforces it once its informer has it: wait with a dry run.
pub fn refuse_in_namespace(
    name: &str,
    ns: &str,
    group: &str,
    resource: &str,
    expression: &str,
    message: &str,
) {
    apply(&format!(
        "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\nmetadata: {{name: {name}}}\nspec:\n  failurePolicy: Fail\n  matchConstraints:\n    resourceRules: [{{apiGroups: [\"{group}\"], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [{resource}]}}]\n  validations: [{{expression: \"{expression}\", message: {message}}}]\n---\n\
         apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicyBinding\nmetadata: {{name: {name}}}\nspec:\n  policyName: {name}\n  validationActions: [Deny]\n  matchResources:\n    namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {ns}}}}}\n"
    ));
}

/// Removes what [`refuse_in_namespace`] made.
pub fn stop_refusing(name: &str) {
    kubectl(
        &[
            "delete",
            "validatingadmissionpolicybinding,validatingadmissionpolicy",
            name,
        ],
        None,
    );
}
