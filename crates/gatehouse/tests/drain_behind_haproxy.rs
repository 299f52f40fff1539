//! Draining the Kubernetes way, proven under load: two Gatehouse processes behind a real
//! haproxy that health-checks `/readyz` once a second and never retries a request; one of
//! them gets SIGTERM while clients keep sending. haproxy keeps sending to it until its next
//! health check sees readiness fail, and no request may fail meanwhile.

mod support;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use support::*;

const BIN: &str = env!("CARGO_BIN_EXE_gatehouse");

struct Instance {
    child: Child,
    port: u16,
    admin: u16,
    _dir: tempfile::TempDir,
}

/// A `gatehouse run` whose responses carry `x-instance: <name>`.
fn instance(name: &str, backend: std::net::SocketAddr) -> Instance {
    let port = free_port();
    let admin = free_port();
    let dir = tempfile::tempdir().unwrap();
    let write = |file: &str, text: &str| std::fs::write(dir.path().join(file), text).unwrap();
    write("gateway.yaml", &gateway(&[("http", port)]));
    write("backends.yaml", &service("svc", &[backend], None));
    write(
        "routes.yaml",
        &route(
            "r",
            &format!(
                "  rules:\n  - backendRefs: [{{name: svc, port: 80}}]\n    filters:\n    - type: ResponseHeaderModifier\n      responseHeaderModifier: {{set: [{{name: x-instance, value: {name}}}]}}"
            ),
        ),
    );
    let child = Command::new(BIN)
        .args(["run", "-f"])
        .arg(dir.path())
        .args([
            "--admin-address",
            &format!("127.0.0.1:{admin}"),
            "--address",
            "127.0.0.1",
            "--drain-delay",
            "2s",
            "--shutdown-grace",
            "5s",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Instance {
        child,
        port,
        admin,
        _dir: dir,
    }
}

struct Haproxy(Child);

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn haproxy(dir: &std::path::Path, listen: u16, servers: &[&Instance]) -> Haproxy {
    let servers: String = servers
        .iter()
        .enumerate()
        .map(|(i, s)| {
            format!(
                "  server g{i} 127.0.0.1:{} check port {} inter 1s fall 1 rise 1\n",
                s.port, s.admin
            )
        })
        .collect();
    // retries 0 and no redispatch: a refused or reset connection would reach the client, so
    // only Gatehouse's own draining can keep the count at zero.
    let config = format!(
        "global\n  maxconn 1000\ndefaults\n  mode http\n  timeout connect 2s\n  timeout client 10s\n  timeout server 10s\n  retries 0\n  option http-keep-alive\nfrontend web\n  bind 127.0.0.1:{listen}\n  default_backend gatehouse\nbackend gatehouse\n  balance roundrobin\n  option httpchk GET /readyz\n  http-check expect status 200\n{servers}"
    );
    let path = dir.join("haproxy.cfg");
    std::fs::write(&path, config).unwrap();
    let child = Command::new("haproxy")
        .args(["-db", "-f"])
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("haproxy is installed (Debian package haproxy)");
    Haproxy(child)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_behind_a_health_checking_load_balancer_loses_no_request() {
    if Command::new("haproxy").arg("-v").output().is_err() {
        assert!(
            std::env::var("CI").is_err(),
            "CI installs haproxy (.ci/run): it must be here"
        );
        eprintln!("note: haproxy is not installed (Debian package haproxy); skipping");
        return;
    }
    let backend = echo("svc").await;
    let mut g0 = instance("g0", backend);
    let g1 = instance("g1", backend);
    let c = client();
    for g in [&g0, &g1] {
        let admin = g.admin;
        eventually("the instance is ready", Duration::from_secs(10), || {
            let c = c.clone();
            async move { matches!(c.get(format!("http://127.0.0.1:{admin}/readyz")).send().await, Ok(r) if r.status() == 200) }
        })
        .await;
    }
    let dir = tempfile::tempdir().unwrap();
    let lb = free_port();
    let _haproxy = haproxy(dir.path(), lb, &[&g0, &g1]);
    eventually(
        "haproxy serves through both",
        Duration::from_secs(10),
        || {
            let c = c.clone();
            async move {
                let mut seen = std::collections::BTreeSet::new();
                for _ in 0..6 {
                    if let Ok(r) = c.get(url(lb, "/")).send().await
                        && let Some(i) = r.headers().get("x-instance")
                    {
                        seen.insert(i.to_str().unwrap().to_string());
                    }
                }
                seen.len() == 2
            }
        },
    )
    .await;

    // Clients on kept-alive connections, as fast as they can, for the whole test.
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let g0_after_term = Arc::new(AtomicU64::new(0));
    let terminated = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_at = Instant::now() + Duration::from_secs(6);
    let mut clients = Vec::new();
    for _ in 0..8 {
        let (ok, failed, g0_after_term, terminated) = (
            ok.clone(),
            failed.clone(),
            g0_after_term.clone(),
            terminated.clone(),
        );
        let c = client();
        clients.push(tokio::spawn(async move {
            while Instant::now() < stop_at {
                match c.get(url(lb, "/")).send().await {
                    Ok(r) if r.status() == 200 => {
                        if terminated.load(Ordering::Relaxed)
                            && r.headers().get("x-instance").is_some_and(|v| v == "g0")
                        {
                            g0_after_term.fetch_add(1, Ordering::Relaxed);
                        }
                        let _ = r.bytes().await;
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(r) => {
                        eprintln!("failed: {}", r.status());
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        eprintln!("failed: {e}");
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let term = Instant::now();
    assert!(
        Command::new("kill")
            .args(["-TERM", &g0.child.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
    terminated.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let exit = loop {
        if let Some(s) = g0.child.try_wait().unwrap() {
            break s;
        }
        assert!(term.elapsed() < Duration::from_secs(15), "g0 did not exit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (ok, failed, after) = (
        ok.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
        g0_after_term.load(Ordering::Relaxed),
    );
    eprintln!("{ok} requests ok, {failed} failed, {after} served by g0 after its SIGTERM");
    assert!(exit.success(), "g0 exit status {exit}");
    assert!(ok > 1000, "the load ran: {ok}");
    assert!(
        after > 0,
        "haproxy kept sending to the draining instance for a while (else the test proves nothing)"
    );
    assert_eq!(failed, 0, "requests failed while an instance drained");
    drop(g1);
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
