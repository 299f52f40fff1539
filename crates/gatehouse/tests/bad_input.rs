//! Broken files: each gives an error that names the file and line, the last good configuration
//! keeps serving, and fixing the file applies it.

mod support;

use std::time::Duration;
use support::*;

fn good_route(version: &str) -> String {
    route(
        "r",
        &format!(
            "  rules:\n  - backendRefs: [{{name: svc, port: 80}}]\n    filters:\n    - type: ResponseHeaderModifier\n      responseHeaderModifier: {{set: [{{name: x-version, value: {version}}}]}}"
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_files_keep_the_last_good_configuration() {
    let backend = echo("svc").await;
    let port = free_port();
    let gw = Gateway::start(&[
        ("gateway.yaml", gateway(&[("http", port)])),
        ("backends.yaml", service("svc", &[backend], None)),
        ("routes.yaml", good_route("good")),
    ])
    .await;
    let c = client();
    let version = |c: reqwest::Client| async move {
        let r = c.get(url(port, "/")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        r.headers()["x-version"].to_str().unwrap().to_string()
    };
    assert_eq!(version(c.clone()).await, "good");

    // (description, file content, expected line of the error, a word the message must contain)
    let valid = good_route("broken-but-never-served");
    let cases: Vec<(&str, String, usize, &str)> = vec![
        (
            "bad YAML",
            format!("{valid}\tindented: with-a-tab\n"),
            11,
            "",
        ),
        (
            "wrong type",
            valid.replace("port: 80", "port: eighty"),
            7,
            "port",
        ),
        (
            "invalid regex",
            route(
                "r",
                "  rules:\n  - matches:\n    - path: {type: RegularExpression, value: '/(open'}\n    backendRefs: [{name: svc, port: 80}]",
            ),
            8,
            "regular expression",
        ),
        (
            "unsupported apiVersion of a known kind",
            valid.replace(
                "gateway.networking.k8s.io/v1",
                "gateway.networking.k8s.io/v9",
            ),
            1,
            "apiVersion",
        ),
        (
            "missing kind",
            format!("{valid}---\napiVersion: v1\nmetadata: {{name: t}}\n"),
            12,
            "kind",
        ),
    ];
    let file = gw.path("routes.yaml");
    for (what, content, line, word) in cases {
        let before = gw.errors().len();
        assert_eq!(before, 0, "{what}: clean start");
        gw.write("routes.yaml", &content);
        let want_prefix = format!("{}:{line}:", file.display());
        eventually(
            &format!("{what}: error reported"),
            Duration::from_secs(5),
            || {
                let errors = gw.errors();
                async move { !errors.is_empty() }
            },
        )
        .await;
        let errors = gw.errors();
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with(&want_prefix)
                    && e.to_lowercase().contains(&word.to_lowercase())),
            "{what}: want an error at {want_prefix} mentioning {word:?}, got {errors:?}"
        );
        // Traffic keeps flowing on the last good configuration.
        for _ in 0..20 {
            assert_eq!(version(c.clone()).await, "good", "{what}");
        }
        let status = gw.status().await;
        assert!(
            status["errors"][0]
                .as_str()
                .unwrap()
                .starts_with(&want_prefix),
            "{what}: /status shows it"
        );

        // Fixing the file clears the error; the good content comes back.
        gw.write("routes.yaml", &good_route("good"));
        eventually(&format!("{what}: fixed"), Duration::from_secs(5), || {
            let errors = gw.errors();
            async move { errors.is_empty() }
        })
        .await;
        assert_eq!(version(c.clone()).await, "good");
    }

    // A kind Gatehouse does not read (an app's Deployment next to its route) is skipped with
    // a warning; the route in the same file applies.
    gw.write(
        "routes.yaml",
        &format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: web}}\nspec: {{}}\n---\n{}",
            good_route("beside-a-deployment")
        ),
    );
    eventually(
        "the route beside a Deployment applies",
        Duration::from_secs(5),
        || {
            let c = c.clone();
            async move { version(c).await == "beside-a-deployment" }
        },
    )
    .await;
    assert!(gw.errors().is_empty(), "{:?}", gw.errors());
    let status = gw.status().await;
    let warning = status["warnings"][0]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        warning.starts_with(&format!("{}:2:", file.display())) && warning.contains("Deployment"),
        "{status}"
    );

    // And a real fix with new content is applied.
    gw.write("routes.yaml", &good_route("fixed"));
    eventually("the fixed file applies", Duration::from_secs(5), || {
        let c = c.clone();
        async move { version(c).await == "fixed" }
    })
    .await;
    gw.stop().await;
}
