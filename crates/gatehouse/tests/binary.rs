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
