//! The real binary: graceful shutdown on SIGTERM, and `gatehouse status` on the bundled example.

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

const BIN: &str = env!("CARGO_BIN_EXE_gatehouse");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_requests_then_exits() {
    let backend = echo("slow").await;
    let port = free_port();
    let admin = free_port();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("gateway.yaml"), gateway(&[("http", port)])).unwrap();
    std::fs::write(
        dir.path().join("backends.yaml"),
        service("slow", &[backend], None),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("routes.yaml"),
        route("slow", "  rules: [{backendRefs: [{name: slow, port: 80}]}]"),
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["run", "-f"])
        .arg(dir.path())
        .args([
            "--admin-address",
            &format!("127.0.0.1:{admin}"),
            "--address",
            "127.0.0.1",
            "--shutdown-grace",
            "10s",
            "--drain-delay",
            "0s",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let c = client();
    eventually("the gateway is ready", Duration::from_secs(10), || {
        let c = c.clone();
        async move { matches!(c.get(format!("http://127.0.0.1:{admin}/readyz")).send().await, Ok(r) if r.status() == 200) }
    })
    .await;

    let slow = tokio::spawn({
        let c = c.clone();
        async move {
            let r = c
                .get(url(port, "/slow"))
                .header("x-echo-delay-ms", "1500")
                .send()
                .await
                .unwrap();
            (
                r.status().as_u16(),
                echo_json(r).await["name"].as_str().unwrap().to_string(),
            )
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let signalled = Instant::now();
    assert!(
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap()
            .success()
    );

    eventually(
        "new connections are refused once draining",
        Duration::from_secs(2),
        || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_err()
        },
    )
    .await;
    assert_eq!(
        slow.await.unwrap(),
        (200, "slow".to_string()),
        "the in-flight request finished"
    );

    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(10),
            "did not exit within the grace period"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "exit status {status}");
}

#[test]
fn status_command_reports_the_example_as_accepted() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/cafe");
    let out = Command::new(BIN)
        .args(["status", "-f", example])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let docs: Vec<serde_json::Value> = text
        .split("\n---\n")
        .map(|d| serde_yaml::from_str(d).unwrap())
        .collect();
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert!(
        kinds.contains(&"GatewayClass")
            && kinds.contains(&"Gateway")
            && kinds.contains(&"HTTPRoute"),
        "{kinds:?}"
    );
    for d in &docs {
        let conds = match d["kind"].as_str().unwrap() {
            "HTTPRoute" => d["status"]["parents"][0]["conditions"].clone(),
            _ => d["status"]["conditions"].clone(),
        };
        let accepted = conds
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Accepted")
            .unwrap();
        assert_eq!(
            accepted["status"], "True",
            "{} {} not accepted: {accepted}",
            d["kind"], d["metadata"]["name"]
        );
        assert!(
            accepted["lastTransitionTime"]
                .as_str()
                .unwrap()
                .starts_with("20"),
            "stamped with the current time"
        );
    }

    // A broken file makes the command fail and name the file and line.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bad.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  ports: [{port: many}]\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["status", "-f"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bad.yaml:5:"), "{stderr}");
}

/// Starts the binary on a gateway with one route to an echo backend; returns the child, the
/// traffic port and the admin port once it is ready.
async fn start_binary(extra: &[&str]) -> (std::process::Child, u16, u16, tempfile::TempDir) {
    let backend = echo("svc").await;
    let port = free_port();
    let admin = free_port();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("gateway.yaml"), gateway(&[("http", port)])).unwrap();
    std::fs::write(
        dir.path().join("backends.yaml"),
        service("svc", &[backend], None),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("routes.yaml"),
        route("r", "  rules: [{backendRefs: [{name: svc, port: 80}]}]"),
    )
    .unwrap();
    let child = Command::new(BIN)
        .args(["run", "-f"])
        .arg(dir.path())
        .args([
            "--admin-address",
            &format!("127.0.0.1:{admin}"),
            "--address",
            "127.0.0.1",
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let c = client();
    eventually("the gateway is ready", Duration::from_secs(10), || {
        let c = c.clone();
        async move { matches!(c.get(format!("http://127.0.0.1:{admin}/readyz")).send().await, Ok(r) if r.status() == 200) }
    })
    .await;
    (child, port, admin, dir)
}

/// The binary's compiled-in allocator settings are in force: jemalloc runs its background
/// thread, which gives freed pages back while the process is idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_allocator_gives_memory_back_from_a_background_thread() {
    let (mut child, _port, _admin, _dir) = start_binary(&[]).await;
    let tasks = format!("/proc/{}/task", child.id());
    let background_thread = || {
        std::fs::read_dir(&tasks)
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .any(|name| name.starts_with("jemalloc_bg_thd"))
    };
    // Started with the first arena's use; give it a moment on a loaded machine. Waited for
    // here rather than with `eventually`, which panics: the child must be killed first, or it
    // outlives a failed test holding the test's stderr.
    let found = tokio::time::timeout(Duration::from_secs(5), async {
        while !background_thread() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .is_ok();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(found, "no jemalloc background thread in {tasks}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_fails_readiness_first_and_keeps_accepting_for_the_drain_delay() {
    let (mut child, port, admin, _dir) =
        start_binary(&["--drain-delay", "2s", "--shutdown-grace", "5s"]).await;
    // A kept-alive connection from before the signal.
    let kept = client();
    assert_eq!(kept.get(url(port, "/")).send().await.unwrap().status(), 200);

    let signalled = Instant::now();
    assert!(
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
    let c = client();
    eventually("readiness fails at once", Duration::from_millis(500), || {
        let c = c.clone();
        async move {
            matches!(c.get(format!("http://127.0.0.1:{admin}/readyz")).send().await, Ok(r) if r.status() == 503)
        }
    })
    .await;
    // Within the drain delay: new connections are still served, and every response asks
    // the client to close, on new and kept-alive connections alike.
    for c in [client(), kept] {
        let r = c.get(url(port, "/")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["connection"], "close");
    }
    assert!(
        signalled.elapsed() < Duration::from_millis(1500),
        "still within the delay"
    );
    // After it, the sockets close and the process exits.
    eventually(
        "new connections are refused after the drain delay",
        Duration::from_secs(4),
        || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_err()
        },
    )
    .await;
    assert!(
        signalled.elapsed() >= Duration::from_secs(2),
        "not before the delay"
    );
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(10),
            "did not exit"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "exit status {status}");
}

#[test]
fn strict_status_fails_on_every_problem_with_its_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
    write("gateway.yaml", &gateway(&[("http", 8080)]));
    write(
        "orphan.yaml",
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: orphan}\nspec:\n  gatewayClassName: nosuchclass\n  listeners: [{name: http, port: 8081, protocol: HTTP}]\n",
    );
    write(
        "routes.yaml",
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\nspec:\n  parentRefs: [{name: gw}, {name: missing}]\n  rules:\n  - matches: [{pathh: {value: /x}}]\n    backendRef: [{name: a, port: 80}]\n    backendRefs: [{name: nosvc, port: 80}]\n",
    );
    let run = |args: &[&str]| {
        Command::new(BIN)
            .args(["status", "-f"])
            .arg(dir.path())
            .args(args)
            .env("RUST_LOG", "off")
            .output()
            .unwrap()
    };
    // Without --strict only files that do not load fail the command.
    assert!(run(&[]).status.success());
    let out = run(&["--strict"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let at = |file: &str, line: usize| format!("{}:{line}: ", dir.path().join(file).display());
    for (file, line, what) in [
        ("orphan.yaml", 3, "GatewayClass nosuchclass does not exist"),
        (
            "routes.yaml",
            3,
            "Gateway default/missing, which does not exist",
        ),
        ("routes.yaml", 3, "ResolvedRefs=False (BackendNotFound)"),
        (
            "routes.yaml",
            7,
            "unknown field spec.rules[0].matches[0].pathh",
        ),
        ("routes.yaml", 8, "unknown field spec.rules[0].backendRef"),
    ] {
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with(&at(file, line)) && l.contains(what)),
            "want {file}:{line} {what:?} in:\n{stderr}"
        );
    }
    assert!(stderr.contains("5 problem(s)"), "{stderr}");

    // The wide table shows the same state at a glance.
    let out = run(&["-o", "wide"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.starts_with("KIND"), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("HTTPRoute") && l.contains("!ResolvedRefs(BackendNotFound)")),
        "{table}"
    );

    // An empty directory is a problem too: nothing would be served.
    let empty = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["status", "--strict", "-f"])
        .arg(empty.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no Kubernetes objects found"));
}
