//! Shared harness for the end-to-end tests: real echo backends, a real gateway on real sockets,
//! manifests in a temporary directory, and a client that resolves test hostnames to loopback.
#![allow(dead_code, unused_imports)]

use gatehouse::run::{RunOptions, Running};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub const HOST: &str = "cafe.example.com";

pub use gatehouse_testkit::manifests::service;
pub use gatehouse_testkit::{echo, free_port};

/// GatewayClass + Gateway `gw` with HTTP listeners on the given (name, port) pairs, open to
/// routes from every namespace.
pub fn gateway(listeners: &[(&str, u16)]) -> String {
    use gatehouse_testkit::manifests::{self, Listener};
    let listeners: Vec<Listener> = listeners
        .iter()
        .map(|(n, p)| Listener::http(n, *p).from_all())
        .collect();
    format!(
        "{}---\n{}",
        manifests::gateway_class(),
        manifests::gateway("gw", &listeners)
    )
}

/// An HTTPRoute named `name` on `gw` whose spec continues with `body` (indented two spaces).
pub fn route(name: &str, body: &str) -> String {
    gatehouse_testkit::manifests::http_route(name, "gw", body)
}

pub struct Gateway {
    pub running: Option<Running>,
    pub dir: tempfile::TempDir,
}

impl Gateway {
    /// Write `files` into a fresh directory and start a gateway on it.
    pub async fn start(files: &[(&str, String)]) -> Gateway {
        Self::start_with(files, |_| {}).await
    }

    /// As [`Gateway::start`], with data-plane options changed by `tune` (timeouts, limits).
    pub async fn start_with(
        files: &[(&str, String)],
        tune: impl FnOnce(&mut gatehouse_dataplane::Options),
    ) -> Gateway {
        // As the binary serves: connections on two worker threads of their own.
        let mut dataplane = gatehouse_dataplane::Options {
            workers: 2,
            dedicated_workers: true,
            ..Default::default()
        };
        tune(&mut dataplane);
        let dir = tempfile::tempdir().unwrap();
        for (name, content) in files {
            std::fs::write(dir.path().join(name), content).unwrap();
        }
        let running = gatehouse::run::start(RunOptions {
            path: dir.path().to_path_buf(),
            admin_address: "127.0.0.1:0".parse().unwrap(),
            default_address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            drain_delay: Duration::ZERO,
            shutdown_grace: Duration::from_secs(5),
            dataplane,
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
            .control
            .published
            .load()
            .generation
    }

    pub fn errors(&self) -> Vec<String> {
        self.running
            .as_ref()
            .unwrap()
            .state
            .control
            .published
            .load()
            .errors
            .clone()
    }

    /// What the admin endpoint's `/status` reports (objects, errors, warnings).
    pub async fn status(&self) -> serde_json::Value {
        client()
            .get(format!("http://{}/status", self.admin()))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
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

/// The status of a response and, for a 200, the name of the echo backend that answered.
pub async fn status_and_backend(resp: reqwest::Response) -> (u16, String) {
    let status = resp.status().as_u16();
    let name = if status == 200 {
        echo_json(resp).await["name"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    } else {
        String::new()
    };
    (status, name)
}

pub mod kube;

/// The value of the first line of the gateway's `/metrics` that starts with `line_start` (a
/// metric name with its labels); 0 when there is none yet.
pub async fn metric(admin: SocketAddr, line_start: &str) -> u64 {
    metrics_text(admin)
        .await
        .lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The gateway's `/metrics` page.
pub async fn metrics_text(admin: SocketAddr) -> String {
    reqwest::get(format!("http://{admin}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// (status, reason, message) of listener `name`'s `type_` condition, in the admin `/status`
/// of a standalone gateway.
pub fn listener_condition(
    status: &serde_json::Value,
    name: &str,
    type_: &str,
) -> (String, String, String) {
    let gw = status["objects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["kind"] == "Gateway")
        .unwrap();
    let l = gw["status"]["listeners"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == name)
        .unwrap();
    let c = l["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap();
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    (s("status"), s("reason"), s("message"))
}
