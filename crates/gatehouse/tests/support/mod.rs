//! Shared harness for the end-to-end tests: real echo backends, a real gateway on real sockets,
//! manifests in a temporary directory, and a client that resolves test hostnames to loopback.
#![allow(dead_code)]

use gatehouse::run::{RunOptions, Running};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub const HOST: &str = "cafe.example.com";

/// A port that was free a moment ago (bind :0, read it, release it).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Start an in-process `gatehouse echo` backend answering with `name`.
pub async fn echo(name: &str) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(gatehouse::echo::serve(listener, name.to_string()));
    addr
}

/// Manifests for a Service `name` with a port `80` (name `http`) backed by `endpoints`.
pub fn service(name: &str, endpoints: &[SocketAddr], app_protocol: Option<&str>) -> String {
    let port = endpoints.first().map(|e| e.port()).unwrap_or(1);
    let app = app_protocol
        .map(|p| format!(", appProtocol: {p}"))
        .unwrap_or_default();
    let eps: String = endpoints
        .iter()
        .map(|e| {
            format!(
                "- addresses: [\"{}\"]\n  conditions: {{ready: true}}\n",
                e.ip()
            )
        })
        .collect();
    format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  ports: [{{name: http, port: 80, targetPort: {port}{app}}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  namespace: default\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\nports: [{{name: http, port: {port}, protocol: TCP}}]\nendpoints:{}",
        if eps.is_empty() {
            " []\n".to_string()
        } else {
            format!("\n{eps}")
        }
    )
}

/// GatewayClass + Gateway `gw` with HTTP listeners on the given (name, port) pairs.
pub fn gateway(listeners: &[(&str, u16)]) -> String {
    let ls: String = listeners
        .iter()
        .map(|(n, p)| format!("  - {{name: {n}, port: {p}, protocol: HTTP, allowedRoutes: {{namespaces: {{from: All}}}}}}\n"))
        .collect();
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: gatehouse}}\nspec: {{controllerName: gatehouse.dev/gateway-controller}}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: gw, namespace: default}}\nspec:\n  gatewayClassName: gatehouse\n  listeners:\n{ls}"
    )
}

/// An HTTPRoute named `name` on `gw` whose spec continues with `body` (indented two spaces).
pub fn route(name: &str, body: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  parentRefs: [{{name: gw}}]\n{body}\n"
    )
}

pub struct Gateway {
    pub running: Option<Running>,
    pub dir: tempfile::TempDir,
}

impl Gateway {
    /// Write `files` into a fresh directory and start a gateway on it.
    pub async fn start(files: &[(&str, String)]) -> Gateway {
        let dir = tempfile::tempdir().unwrap();
        for (name, content) in files {
            std::fs::write(dir.path().join(name), content).unwrap();
        }
        let running = gatehouse::run::start(RunOptions {
            path: dir.path().to_path_buf(),
            admin_address: "127.0.0.1:0".parse().unwrap(),
            default_address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            shutdown_grace: Duration::from_secs(5),
            // As the binary serves: connections on two worker threads of their own.
            dataplane: gatehouse_dataplane::Options {
                workers: 2,
                dedicated_workers: true,
                ..Default::default()
            },
        })
        .await
        .expect("gateway starts");
        Gateway {
            running: Some(running),
            dir,
        }
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    pub fn write(&self, file: &str, content: &str) {
        write_atomically(&self.path(file), content);
    }

    pub fn admin(&self) -> SocketAddr {
        self.running.as_ref().unwrap().admin_address
    }

    pub fn generation(&self) -> u64 {
        self.running
            .as_ref()
            .unwrap()
            .state
            .snapshot
            .load()
            .generation
    }

    pub fn errors(&self) -> Vec<String> {
        self.running
            .as_ref()
            .unwrap()
            .state
            .snapshot
            .load()
            .errors
            .clone()
    }

    pub async fn stop(mut self) {
        if let Some(r) = self.running.take() {
            r.stop().await;
        }
    }
}

/// Editors and config-management tools replace files by rename; this is what they do.
pub fn write_atomically(path: &Path, content: &str) {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, content).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// An HTTP/1.1 client with keep-alive that sends every test hostname to loopback.
pub fn client() -> reqwest::Client {
    builder().build().unwrap()
}

pub fn builder() -> reqwest::ClientBuilder {
    let lo: SocketAddr = "127.0.0.1:0".parse().unwrap();
    reqwest::Client::builder()
        .resolve(HOST, lo)
        .resolve("other.example.com", lo)
        .resolve("rewritten.example.com", lo)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .timeout(Duration::from_secs(20))
}

pub fn url(port: u16, path: &str) -> String {
    format!("http://{HOST}:{port}{path}")
}

/// Poll `check` until it returns true or `timeout` passes; panics with `what` on timeout.
pub async fn eventually<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// The echo backend's JSON answer.
pub async fn echo_json(resp: reqwest::Response) -> serde_json::Value {
    resp.json().await.expect("echo answers JSON")
}

pub mod kube;
