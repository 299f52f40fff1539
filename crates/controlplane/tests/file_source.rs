//! FileSource: loading, errors with file and line, last-good, deletion, watching.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use gatehouse_controlplane::{FileSource, LoadError, Loaded};

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "gatehouse-controlplane-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn write(&self, name: &str, content: &str) -> PathBuf {
        let path = self.0.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&path, content).unwrap();
        path
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn load_one(content: &str) -> (Loaded, PathBuf) {
    let dir = TempDir::new();
    let file = dir.write("m.yaml", content);
    let loaded = FileSource::new(dir.path()).load();
    (loaded, file)
}

/// The only error, checked for file and line; returns its message.
fn only_error(loaded: &Loaded, file: &Path, line: usize) -> String {
    assert_eq!(loaded.errors.len(), 1, "errors: {:#?}", loaded.errors);
    let e = &loaded.errors[0];
    assert_eq!(e.file, file, "{e}");
    assert_eq!(e.line, Some(line), "{e}");
    e.message.clone()
}

fn only_warning(loaded: &Loaded, file: &Path, line: usize) -> String {
    assert!(loaded.errors.is_empty(), "errors: {:#?}", loaded.errors);
    assert_eq!(loaded.warnings.len(), 1, "warnings: {:#?}", loaded.warnings);
    let w = &loaded.warnings[0];
    assert_eq!(w.file, file, "{w}");
    assert_eq!(w.line, Some(line), "{w}");
    w.message.clone()
}

fn route_names(loaded: &Loaded) -> Vec<String> {
    let mut names: Vec<String> = loaded
        .input
        .http_routes
        .iter()
        .map(|r| r.metadata.name.clone().unwrap())
        .collect();
    names.sort();
    names
}

fn route(name: &str, path: &str) -> String {
    format!(
        "\
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: {name}
spec:
  parentRefs:
  - name: gw
  rules:
  - matches:
    - path:
        type: PathPrefix
        value: {path}
    backendRefs:
    - name: svc
      port: 80
"
    )
}

const GATEWAY: &str = "\
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: gw
spec:
  gatewayClassName: gatehouse
  listeners:
  - name: http
    protocol: HTTP
    port: 8080
";

#[test]
fn multi_document_with_comments_and_leading_marker() {
    let content = format!(
        "# The cafe\n---\n# a GatewayClass\napiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\n\
         metadata:\n  name: gatehouse\nspec:\n  controllerName: gatehouse.dev/gateway-controller\n\
         ---\n---   # empty document\n# only a comment\n---\n{GATEWAY}...\n--- \n{}",
        route("r1", "/a")
    );
    let (loaded, _) = load_one(&content);
    assert!(loaded.is_ok(), "{:#?}", loaded.errors);
    assert_eq!(loaded.input.gateway_classes.len(), 1);
    assert_eq!(loaded.input.gateways.len(), 1);
    assert_eq!(route_names(&loaded), ["r1"]);
}

#[test]
fn namespaces_default_except_cluster_scoped() {
    let content = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: apps\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata:\n  name: gc\n\
         spec:\n  controllerName: x/y\n---\n{GATEWAY}---\n{}  \n---\n\
         apiVersion: v1\nkind: Service\nmetadata:\n  name: svc\n  namespace: apps\nspec:\n  ports:\n  - port: 80\n",
        route("r1", "/")
    );
    let (loaded, _) = load_one(&content);
    assert!(loaded.is_ok(), "{:#?}", loaded.errors);
    let input = &loaded.input;
    assert_eq!(input.namespaces[0].metadata.namespace, None);
    assert_eq!(input.gateway_classes[0].metadata.namespace, None);
    assert_eq!(
        input.gateways[0].metadata.namespace.as_deref(),
        Some("default")
    );
    assert_eq!(
        input.http_routes[0].metadata.namespace.as_deref(),
        Some("default")
    );
    assert_eq!(
        input.services[0].metadata.namespace.as_deref(),
        Some("apps")
    );
    // Creation timestamps stay absent.
    assert!(input.gateways[0].metadata.creation_timestamp.is_none());
}

#[test]
fn v1beta1_and_endpoint_slices_and_reference_grants() {
    let content = "\
apiVersion: gateway.networking.k8s.io/v1beta1
kind: HTTPRoute
metadata: {name: old}
spec: {}
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: rg, namespace: backends}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: default}]
  to: [{group: '', kind: Service}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: svc-abc
  labels: {kubernetes.io/service-name: svc}
addressType: IPv4
endpoints:
- addresses: [127.0.0.1]
  conditions: {ready: true}
ports:
- name: http
  port: 9001
";
    let (loaded, _) = load_one(content);
    assert!(loaded.is_ok(), "{:#?}", loaded.errors);
    assert_eq!(route_names(&loaded), ["old"]);
    assert_eq!(loaded.input.reference_grants.len(), 1);
    assert_eq!(loaded.input.endpoint_slices.len(), 1);
    assert_eq!(
        loaded.input.endpoint_slices[0]
            .metadata
            .namespace
            .as_deref(),
        Some("default")
    );
}

#[test]
fn kind_list_items() {
    let content = "\
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata:
    name: a
  spec:
    ports: [{port: 80}]
- apiVersion: v1
  kind: PersistentVolume
  metadata:
    name: b
";
    let (loaded, file) = load_one(content);
    let msg = only_warning(&loaded, &file, 10);
    assert!(msg.contains("kind \"PersistentVolume\""), "{msg}");
    assert!(msg.contains("skipped"), "{msg}");
    // A kind Gatehouse does not read is skipped; the rest of the file serves.
    assert_eq!(loaded.input.services.len(), 1);
}

#[test]
fn yaml_syntax_error_reports_the_file_line() {
    // The error is in the third document, on file line 9.
    let content = "\
apiVersion: v1
kind: Namespace
metadata: {name: a}
---
# comment
---
apiVersion: v1
kind: Namespace
metadata: {name: [b}
";
    let (loaded, file) = load_one(content);
    let msg = only_error(&loaded, &file, 9);
    // Positions inside the message are file-relative too (no stale document line).
    assert!(!msg.contains("line 3 "), "{msg}");
    assert!(
        loaded.input.namespaces.is_empty(),
        "a broken file contributes nothing new"
    );
}

#[test]
fn bad_indentation_is_a_syntax_error_on_its_line() {
    // route() is lines 1-15, the marker 16, the Namespace 17-21 with the bad line last.
    let content = format!(
        "{}---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: b\n   bad: indent\n",
        route("r", "/")
    );
    let (loaded, file) = load_one(&content);
    let msg = only_error(&loaded, &file, 21);
    assert_eq!(
        msg,
        "mapping values are not allowed in this context at column 7"
    );
    // The good route of the same file is not served either: the file never loaded.
    assert!(loaded.input.http_routes.is_empty());
}

#[test]
fn wrong_type_reports_the_value_line() {
    let content = format!(
        "{}---\n{}",
        route("r", "/"),
        GATEWAY.replace("port: 8080", "port: \"eighty\"")
    );
    // route() is 15 lines, the marker is 16, the Gateway starts on 17; port is its line 10.
    let (loaded, file) = load_one(&content);
    let msg = only_error(&loaded, &file, 26);
    assert!(msg.contains("spec.listeners[0].port"), "{msg}");
    assert!(msg.contains("eighty"), "{msg}");
    assert_eq!(
        loaded.errors[0].to_string(),
        format!("{}:26: {msg}", file.display())
    );
}

#[test]
fn missing_api_version_or_kind() {
    let content = "\
apiVersion: v1
kind: Namespace
metadata: {name: a}
---

# no kind here
apiVersion: v1
metadata: {name: b}
---
kind: Namespace
metadata: {name: c}
";
    let (loaded, file) = load_one(content);
    assert_eq!(loaded.errors.len(), 2, "{:#?}", loaded.errors);
    assert_eq!(loaded.errors[0].file, file);
    assert_eq!(loaded.errors[0].line, Some(7));
    assert_eq!(loaded.errors[0].message, "missing kind");
    assert_eq!(loaded.errors[1].line, Some(10));
    assert_eq!(loaded.errors[1].message, "missing apiVersion");
}

#[test]
fn a_kind_gatehouse_does_not_read_is_skipped_with_a_warning_at_its_kind_line() {
    let content = format!(
        "{GATEWAY}---\napiVersion: apps/v1\nmetadata:\n  name: web\n  labels: {{kind: x}}\nkind: Deployment\nspec: {{}}\n"
    );
    // GATEWAY is 10 lines, marker 11, Deployment document lines 12..; `kind:` on line 16.
    let (loaded, file) = load_one(&content);
    let msg = only_warning(&loaded, &file, 16);
    assert!(
        msg.contains("kind \"Deployment\" (apiVersion apps/v1)"),
        "{msg}"
    );
    // The Gateway of the same file is served: a foreign object never rejects its file.
    assert_eq!(loaded.input.gateways.len(), 1);
}

#[test]
fn an_app_manifest_with_a_deployment_before_the_route_keeps_the_route() {
    // What `kustomize build` or an application's manifest looks like.
    let content = "\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec: {replicas: 2}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web}
spec:
  parentRefs: [{name: gw}]
";
    let (loaded, _) = load_one(content);
    assert!(loaded.errors.is_empty(), "{:#?}", loaded.errors);
    assert_eq!(route_names(&loaded), ["web"]);
}

#[test]
fn json_manifests_in_a_directory_are_read() {
    let dir = TempDir::new();
    dir.write(
        "svc.json",
        r#"{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "from-json"},
  "spec": {"ports": [{"port": 80}]}}"#,
    );
    let loaded = FileSource::new(dir.path()).load();
    assert!(loaded.errors.is_empty(), "{:#?}", loaded.errors);
    assert_eq!(
        loaded.input.services[0].metadata.name.as_deref(),
        Some("from-json")
    );
}

#[test]
fn unsupported_version_of_a_known_kind() {
    let content = GATEWAY.replace(
        "gateway.networking.k8s.io/v1",
        "gateway.networking.k8s.io/v1alpha2",
    );
    let (loaded, file) = load_one(&content);
    let msg = only_error(&loaded, &file, 1);
    assert!(msg.contains("unsupported apiVersion"), "{msg}");
}

#[test]
fn invalid_regular_expressions_report_their_lines() {
    let content = "\
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: re
spec:
  rules:
  - matches:
    - path:
        type: RegularExpression
        value: /ok/[0-9]+
    - path:
        type: RegularExpression
        value: /broken/[a-
  - matches:
    - headers:
      - name: x-fine
        value: '(a|b'
      - name: x-bad
        type: RegularExpression
        value: \"(a|b\"
      queryParams:
      - name: q
        type: RegularExpression
        value: \"\\\\d{2,1}\"
";
    let (loaded, file) = load_one(content);
    let lines: Vec<_> = loaded.errors.iter().map(|e| e.line).collect();
    assert_eq!(
        lines,
        [Some(13), Some(20), Some(24)],
        "{:#?}",
        loaded.errors
    );
    assert!(loaded.errors.iter().all(|e| e.file == file));
    assert!(
        loaded.errors[0].message.starts_with(
            "spec.rules[0].matches[1].path.value: invalid regular expression \"/broken/[a-\""
        ),
        "{}",
        loaded.errors[0]
    );
    assert!(
        loaded.errors[1].message.contains("headers[1].value"),
        "{}",
        loaded.errors[1]
    );
    assert!(
        loaded.errors[2].message.contains("queryParams[0].value"),
        "{}",
        loaded.errors[2]
    );
    // One line each, no caret diagram.
    assert!(loaded.errors.iter().all(|e| !e.message.contains('\n')));
}

#[test]
fn duplicates_later_definition_is_the_error() {
    let dir = TempDir::new();
    dir.write("a.yaml", &route("dup", "/a"));
    let b = dir.write(
        "b.yaml",
        &format!("{}---\n{}", route("other", "/o"), route("dup", "/b")),
    );
    let loaded = FileSource::new(dir.path()).load();
    // b.yaml: route() is 15 lines, marker on 16, second route starts 17, name on its line 4.
    let msg = only_error(&loaded, &b, 20);
    assert!(msg.contains("duplicate HTTPRoute default/dup"), "{msg}");
    assert!(msg.contains("a.yaml:4"), "{msg}");
    // b.yaml never loaded: only a.yaml's route is served.
    assert_eq!(route_names(&loaded), ["dup"]);
    assert_eq!(
        loaded.input.http_routes[0].spec.rules.as_ref().unwrap()[0]
            .matches
            .as_ref()
            .unwrap()[0]
            .path
            .as_ref()
            .unwrap()
            .value
            .as_deref(),
        Some("/a")
    );
}

#[test]
fn duplicates_within_one_file() {
    let content = format!("{}---\n{}", route("dup", "/a"), route("dup", "/b"));
    let (loaded, file) = load_one(&content);
    let msg = only_error(&loaded, &file, 20);
    assert!(msg.contains("already defined at line 4"), "{msg}");
}

/// A duplicate within a file names the line of its first definition, also after an object
/// of the same file that was itself a duplicate of another file's.
#[test]
fn duplicates_within_one_file_after_one_across_files() {
    let dir = TempDir::new();
    dir.write("a.yaml", &route("x", "/x"));
    let content = ["y", "x", "z", "z"]
        .map(|name| route(name, "/p"))
        .join("---\n");
    let b = dir.write("b.yaml", &content);
    let loaded = FileSource::new(dir.path()).load();
    let messages: Vec<(Option<usize>, &str)> = loaded
        .errors
        .iter()
        .filter(|e| e.file == b)
        .map(|e| (e.line, e.message.as_str()))
        .collect();
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(messages[0].0, Some(20));
    assert!(messages[0].1.contains("a.yaml:4"), "{messages:?}");
    assert_eq!(messages[1].0, Some(52));
    assert!(
        messages[1].1.contains("already defined at line 36"),
        "{messages:?}"
    );
}

#[test]
fn same_name_in_other_namespace_or_kind_is_no_duplicate() {
    let content = format!(
        "{}---\n{}---\n{GATEWAY}",
        route("x", "/a"),
        route("x", "/b").replace("name: x", "name: x\n  namespace: other")
    )
    .replace(
        "name: gw\nspec:\n  gatewayClassName",
        "name: x\nspec:\n  gatewayClassName",
    );
    let (loaded, _) = load_one(&content);
    assert!(loaded.is_ok(), "{:#?}", loaded.errors);
    assert_eq!(loaded.input.http_routes.len(), 2);
}

#[test]
fn unknown_fields_are_warnings_with_lines() {
    let content = route("typo", "/a").replace(
        "    - path:\n",
        "    - pathh:\n        value: /x\n      path:\n",
    );
    let (loaded, file) = load_one(&content);
    assert!(loaded.is_ok(), "{:#?}", loaded.errors);
    assert_eq!(route_names(&loaded), ["typo"]);
    assert_eq!(
        loaded.warnings,
        [LoadError {
            file,
            line: Some(10),
            message: "unknown field spec.rules[0].matches[0].pathh (ignored)".into(),
        }]
    );
}

#[test]
fn last_good_is_kept_after_a_broken_edit_and_replaced_after_a_fix() {
    let dir = TempDir::new();
    let a = dir.write("a.yaml", &route("ra", "/a"));
    dir.write("b.yaml", &route("rb", "/b"));
    let mut source = FileSource::new(dir.path());
    let loaded = source.load();
    assert!(loaded.is_ok());
    assert_eq!(route_names(&loaded), ["ra", "rb"]);

    // Break a.yaml (and rename its route): its old content stays served.
    dir.write(
        "a.yaml",
        &route("ra2", "/a").replace("port: 80", "port: eighty"),
    );
    let loaded = source.load();
    assert_eq!(loaded.errors.len(), 1);
    assert_eq!(loaded.errors[0].file, a);
    assert_eq!(loaded.errors[0].line, Some(15));
    assert_eq!(loaded.stale_files, std::slice::from_ref(&a));
    assert_eq!(route_names(&loaded), ["ra", "rb"]);

    // Loading again without a change reports the same.
    let again = source.load();
    assert_eq!(again.errors, loaded.errors);
    assert_eq!(route_names(&again), ["ra", "rb"]);

    // Fix it: the new content replaces the old.
    dir.write("a.yaml", &route("ra2", "/a"));
    let loaded = source.load();
    assert!(loaded.is_ok(), "{:#?}", loaded.errors);
    assert!(loaded.stale_files.is_empty());
    assert_eq!(route_names(&loaded), ["ra2", "rb"]);
}

/// Whether a file changed is decided by its text's digest, not its time or size: a file
/// written again with the same text keeps its objects (the same `Arc`, which later stages
/// compare by pointer), and a different text of the same length is read again.
#[test]
fn a_file_is_read_again_only_when_its_text_changed() {
    let dir = TempDir::new();
    dir.write("a.yaml", &route("ra", "/a"));
    dir.write("b.yaml", &route("rb", "/b"));
    let mut source = FileSource::new(dir.path());
    let first = source.load();
    let by_name = |loaded: &Loaded, name: &str| {
        loaded
            .input
            .http_routes
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(name))
            .cloned()
            .unwrap()
    };

    dir.write("a.yaml", &route("ra", "/a"));
    let same = source.load();
    assert!(std::sync::Arc::ptr_eq(
        &by_name(&first, "ra"),
        &by_name(&same, "ra")
    ));
    assert!(std::sync::Arc::ptr_eq(
        &by_name(&first, "rb"),
        &by_name(&same, "rb")
    ));

    // "/a" becomes "/c": the same length, another text.
    let edited = route("ra", "/c");
    assert_eq!(edited.len(), route("ra", "/a").len());
    dir.write("a.yaml", &edited);
    let changed = source.load();
    let ra = by_name(&changed, "ra");
    assert!(!std::sync::Arc::ptr_eq(&by_name(&first, "ra"), &ra));
    let path = ra.spec.rules.as_ref().unwrap()[0].matches.as_ref().unwrap()[0]
        .path
        .as_ref()
        .unwrap()
        .value
        .clone();
    assert_eq!(path.as_deref(), Some("/c"));
    assert!(std::sync::Arc::ptr_eq(
        &by_name(&first, "rb"),
        &by_name(&changed, "rb")
    ));
}

#[test]
fn a_file_that_never_loaded_contributes_nothing() {
    let dir = TempDir::new();
    dir.write("a.yaml", &route("ra", "/a"));
    dir.write("b.yaml", "kind: [");
    let loaded = FileSource::new(dir.path()).load();
    assert_eq!(loaded.errors.len(), 1);
    assert!(loaded.stale_files.is_empty());
    assert_eq!(route_names(&loaded), ["ra"]);
}

#[test]
fn deleted_file_drops_its_objects() {
    let dir = TempDir::new();
    let a = dir.write("a.yaml", &route("ra", "/a"));
    dir.write("sub/b.yaml", &route("rb", "/b"));
    let mut source = FileSource::new(dir.path());
    assert_eq!(route_names(&source.load()), ["ra", "rb"]);
    std::fs::remove_file(&a).unwrap();
    let loaded = source.load();
    assert!(loaded.is_ok());
    assert_eq!(route_names(&loaded), ["rb"]);
    // Re-created with the same content: back again.
    dir.write("a.yaml", &route("ra", "/a"));
    assert_eq!(route_names(&source.load()), ["ra", "rb"]);
}

#[test]
fn a_missing_root_keeps_everything() {
    let dir = TempDir::new();
    let root = dir.path().join("cfg");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("a.yaml"), route("ra", "/a")).unwrap();
    let mut source = FileSource::new(&root);
    assert_eq!(route_names(&source.load()), ["ra"]);
    std::fs::rename(&root, dir.path().join("moved")).unwrap();
    let loaded = source.load();
    assert_eq!(loaded.errors.len(), 1);
    assert_eq!(loaded.errors[0].file, root);
    assert_eq!(loaded.errors[0].line, None);
    assert_eq!(route_names(&loaded), ["ra"]);
}

#[test]
fn skips_hidden_and_temp_files_and_reads_a_single_file() {
    let dir = TempDir::new();
    dir.write("a.yaml", &route("ra", "/a"));
    dir.write("b.yml", &route("rb", "/b"));
    for junk in [
        ".a.yaml.swp",
        ".#a.yaml",
        "a.yaml~",
        "#a.yaml#",
        "notes.txt",
        ".git/x.yaml",
    ] {
        dir.write(junk, "not: [valid");
    }
    let loaded = FileSource::new(dir.path()).load();
    assert!(loaded.is_ok(), "{:#?}", loaded.errors);
    assert_eq!(route_names(&loaded), ["ra", "rb"]);

    // A single file is read whatever its name.
    let single = dir.write("route.txt", &route("rs", "/s"));
    let loaded = FileSource::new(&single).load();
    assert!(loaded.is_ok());
    assert_eq!(route_names(&loaded), ["rs"]);
}

#[test]
fn error_display() {
    let e = LoadError {
        file: "x/a.yaml".into(),
        line: Some(3),
        message: "bad".into(),
    };
    assert_eq!(e.to_string(), "x/a.yaml:3: bad");
    let e = LoadError { line: None, ..e };
    assert_eq!(e.to_string(), "x/a.yaml: bad");
}

async fn expect_change(watch: &mut gatehouse_controlplane::Watch) {
    tokio::time::timeout(Duration::from_secs(10), watch.changed())
        .await
        .expect("a change notification");
}

/// Lets the event burst of the previous step arrive, then drops its notification.
async fn settle(watch: &mut gatehouse_controlplane::Watch) {
    tokio::time::sleep(Duration::from_millis(200)).await;
    watch.try_changed();
}

#[tokio::test]
async fn watch_directory_notifies_after_a_write() {
    let dir = TempDir::new();
    dir.write("a.yaml", &route("ra", "/a"));
    let mut source = FileSource::new(dir.path());
    let mut watch = source.watch().unwrap();
    assert_eq!(route_names(&source.load()), ["ra"]);
    // Our own reads are no change.
    settle(&mut watch).await;
    source.load();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!watch.try_changed(), "reading the files notified");

    dir.write("sub/b.yaml", &route("rb", "/b"));
    expect_change(&mut watch).await;
    assert_eq!(route_names(&source.load()), ["ra", "rb"]);

    // A burst of writes gives at most one pending notification.
    settle(&mut watch).await;
    for i in 0..20 {
        dir.write("a.yaml", &route("ra", &format!("/a{i}")));
    }
    expect_change(&mut watch).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    watch.try_changed();
    assert!(!watch.try_changed());
}

#[tokio::test]
async fn watch_single_file_survives_rename_replace() {
    let dir = TempDir::new();
    let file = dir.write("gw.yaml", &route("r1", "/a"));
    dir.write("other.yaml", &route("x", "/x"));
    let mut source = FileSource::new(&file);
    let mut watch = source.watch().unwrap();
    assert_eq!(route_names(&source.load()), ["r1"]);
    settle(&mut watch).await;

    // A sibling changing is no change.
    dir.write("other.yaml", &route("y", "/y"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!watch.try_changed(), "a sibling file notified");

    // Editors that save by writing a temp file and renaming it over the original.
    let tmp = dir.write(".gw.yaml.tmp", &route("r2", "/b"));
    std::fs::rename(&tmp, &file).unwrap();
    expect_change(&mut watch).await;
    assert_eq!(route_names(&source.load()), ["r2"]);

    // And again: the watch is on the directory, not on the replaced inode.
    settle(&mut watch).await;
    dir.write("gw.yaml", &route("r3", "/c"));
    expect_change(&mut watch).await;
    assert_eq!(route_names(&source.load()), ["r3"]);
}

#[test]
fn cafe_example_loads() {
    let cafe = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/cafe");
    let loaded = FileSource::new(&cafe).load();
    assert!(loaded.is_ok(), "{:#?}", loaded.errors);
    assert!(loaded.warnings.is_empty(), "{:#?}", loaded.warnings);
    let input = &loaded.input;
    assert_eq!(input.gateway_classes.len(), 1);
    assert_eq!(input.gateways.len(), 1);
    assert_eq!(route_names(&loaded), ["coffee", "latte", "tea"]);
    assert_eq!(input.services.len(), 4);
    assert_eq!(input.endpoint_slices.len(), 4);
}

#[test]
fn tls_kinds_load() {
    let content = "\
apiVersion: v1
kind: Secret
metadata: {name: cert}
type: kubernetes.io/tls
data: {tls.crt: aGVsbG8=, tls.key: d29ybGQ=}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: ca, namespace: certs}
data: {ca.crt: pem}
---
apiVersion: gateway.networking.k8s.io/v1
kind: TLSRoute
metadata: {name: t}
spec:
  parentRefs: [{name: gw}]
  hostnames: [a.example.com]
  rules: [{backendRefs: [{name: s, port: 443}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {name: p}
spec:
  targetRefs: [{group: '', kind: Service, name: s}]
  validation: {hostname: s.internal, wellKnownCACertificates: System}
";
    let (loaded, _file) = load_one(content);
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    let secret = &loaded.input.secrets[0];
    assert_eq!(
        secret.data.as_ref().unwrap()["tls.crt"].0,
        b"hello",
        "data is base64-decoded"
    );
    assert_eq!(secret.metadata.namespace.as_deref(), Some("default"));
    assert_eq!(
        loaded.input.config_maps[0].metadata.namespace.as_deref(),
        Some("certs")
    );
    assert_eq!(loaded.input.tls_routes[0].spec.hostnames, ["a.example.com"]);
    assert_eq!(
        loaded.input.backend_tls_policies[0]
            .spec
            .validation
            .hostname,
        "s.internal"
    );
}

/// ClusterTrustBundles load by name (cluster-scoped: a namespace is dropped with a warning on
/// its line); an apiVersion other than v1beta1 is an error that names the supported one.
#[test]
fn cluster_trust_bundles_load_cluster_scoped() {
    let (loaded, file) = load_one(
        "\
apiVersion: certificates.k8s.io/v1beta1
kind: ClusterTrustBundle
metadata: {name: corp-ca, namespace: ignored}
spec: {trustBundle: pem}
",
    );
    assert!(
        only_warning(&loaded, &file, 3).contains("ClusterTrustBundle is cluster-scoped"),
        "{:?}",
        loaded.warnings
    );
    let bundle = &loaded.input.cluster_trust_bundles[0];
    assert_eq!(bundle.metadata.name.as_deref(), Some("corp-ca"));
    assert_eq!(bundle.metadata.namespace, None);
    assert_eq!(bundle.spec.trust_bundle, "pem");

    let (loaded, file) = load_one(
        "\
apiVersion: certificates.k8s.io/v1alpha1
kind: ClusterTrustBundle
metadata: {name: old}
spec: {trustBundle: pem}
",
    );
    assert!(
        only_error(&loaded, &file, 1).contains("supported versions: v1beta1"),
        "{:?}",
        loaded.errors
    );
    assert!(loaded.input.cluster_trust_bundles.is_empty());
}

/// What a load serves, comparable between two sources: every route's name and path, the
/// errors and the stale files (the YAML text itself is what both parsed).
fn served(loaded: &Loaded) -> (Vec<String>, Vec<String>, Vec<PathBuf>) {
    let mut routes: Vec<String> = loaded
        .input
        .http_routes
        .iter()
        .map(|r| format!("{}:{:?}", r.metadata.name.clone().unwrap(), r.spec.rules))
        .collect();
    routes.sort();
    let errors = loaded.errors.iter().map(ToString::to_string).collect();
    (routes, errors, loaded.stale_files.clone())
}

/// A source that re-reads only what its watch names serves exactly what a source that walks
/// the folder every time serves, through writes, atomic renames, broken edits, duplicates, deletions and new
/// directories; and a write names just that file.
#[tokio::test]
async fn incremental_loads_equal_full_loads() {
    use gatehouse_controlplane::Changes;
    let dir = TempDir::new();
    dir.write("a.yaml", &route("ra", "/a"));
    dir.write("b.yaml", &route("rb", "/b"));
    let mut incremental = FileSource::new(dir.path());
    let mut watch = incremental.watch().unwrap();
    assert_eq!(watch.take_changes(), Changes::All, "the first load walks");
    incremental.load();
    // The same history, walked every time (last-good content depends on the history).
    let mut walking = FileSource::new(dir.path());
    walking.load();

    type Step = Box<dyn Fn(&TempDir)>;
    let steps: Vec<(&str, Step)> = vec![
        (
            "write",
            Box::new(|d| {
                d.write("a.yaml", &route("ra", "/a2"));
            }),
        ),
        (
            "create by rename",
            Box::new(|d| {
                let tmp = d.write(".c.yaml.tmp", &route("rc", "/c"));
                std::fs::rename(tmp, d.path().join("c.yaml")).unwrap();
            }),
        ),
        (
            "broken edit",
            Box::new(|d| {
                d.write("b.yaml", "kind: [");
            }),
        ),
        (
            "duplicate",
            Box::new(|d| {
                d.write("d.yaml", &route("ra", "/dup"));
            }),
        ),
        (
            "fix",
            Box::new(|d| {
                d.write("b.yaml", &route("rb", "/b3"));
            }),
        ),
        (
            "delete",
            Box::new(|d| {
                std::fs::remove_file(d.path().join("a.yaml")).unwrap();
            }),
        ),
        (
            "new directory",
            Box::new(|d| {
                d.write("sub/e.yaml", &route("re", "/e"));
            }),
        ),
        (
            "rename away",
            Box::new(|d| {
                std::fs::rename(d.path().join("c.yaml"), d.path().join("c.yaml.off")).unwrap();
            }),
        ),
    ];
    for (what, step) in steps {
        step(&dir);
        expect_change(&mut watch).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let changes = watch.take_changes();
        let got = incremental.load_changed(&changes);
        let want = walking.load();
        assert_eq!(served(&got), served(&want), "after {what} ({changes:?})");
        watch.try_changed();
    }

    // One write names one file, so the load reads one file.
    dir.write("b.yaml", &route("rb", "/b4"));
    expect_change(&mut watch).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        watch.take_changes(),
        Changes::Files([dir.path().join("b.yaml")].into()),
    );
}

/// A changed file list that a walk would not read as it is (a directory, a hidden or
/// non-manifest name) makes the load walk: nothing is missed.
#[test]
fn a_file_list_a_walk_would_not_read_falls_back_to_a_walk() {
    use gatehouse_controlplane::Changes;
    let dir = TempDir::new();
    dir.write("a.yaml", &route("ra", "/a"));
    let mut source = FileSource::new(dir.path());
    source.load();
    dir.write("sub/b.yaml", &route("rb", "/b"));
    dir.write("c.yaml", &route("rc", "/c"));
    // Named: only the directory; c.yaml is found by the walk it falls back to.
    let loaded = source.load_changed(&Changes::Files([dir.path().join("sub")].into()));
    assert_eq!(route_names(&loaded), ["ra", "rb", "rc"]);
    // Named: a file outside the folder.
    dir.write("d.yaml", &route("rd", "/d"));
    let loaded = source.load_changed(&Changes::Files(["/elsewhere/x.yaml".into()].into()));
    assert_eq!(route_names(&loaded), ["ra", "rb", "rc", "rd"]);
    // Named: exactly one file; the others keep what was read (the new e.yaml is not seen
    // until a change names it: the watch always does).
    dir.write("e.yaml", &route("re", "/e"));
    dir.write("a.yaml", &route("ra2", "/a"));
    let loaded = source.load_changed(&Changes::Files([dir.path().join("a.yaml")].into()));
    assert_eq!(route_names(&loaded), ["ra2", "rb", "rc", "rd"]);
}

/// The reconcile loop's source reads without locations: the same objects and the same
/// duplicate errors, with no location map built for every change.
#[test]
fn without_locations_the_objects_and_errors_are_the_same() {
    let dir = TempDir::new();
    dir.write(
        "a.yaml",
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r, namespace: ns}\nspec: {}\n",
    );
    dir.write(
        "b.yaml",
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r, namespace: ns}\nspec: {}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: s, namespace: ns}\nspec: {}\n",
    );
    let with = FileSource::new(dir.path()).load();
    let without = FileSource::new(dir.path()).without_locations().load();
    assert_eq!(route_names(&with), route_names(&without));
    assert_eq!(route_names(&without), ["r"]);
    let messages = |l: &Loaded| l.errors.iter().map(ToString::to_string).collect::<Vec<_>>();
    assert_eq!(messages(&with), messages(&without));
    assert!(
        messages(&without)[0].contains("already defined at"),
        "{:?}",
        messages(&without)
    );
    assert_eq!(with.locations.len(), 1);
    assert!(without.locations.is_empty());
}

/// An object that reads as before keeps its `Arc` when its file is parsed again: translation
/// reuses a route's work only for the same object, so one route edited in a file of many must
/// leave the others as they were.
#[test]
fn an_edit_keeps_the_objects_it_did_not_change() {
    let dir = TempDir::new();
    let text = |b_path: &str| {
        format!(
            "{GATEWAY}---\n{}---\n{}",
            route("a", "/a"),
            route("b", b_path)
        )
    };
    let find = |loaded: &Loaded, name: &str| {
        Arc::clone(
            loaded
                .input
                .http_routes
                .iter()
                .find(|r| r.metadata.name.as_deref() == Some(name))
                .unwrap(),
        )
    };
    dir.write("m.yaml", &text("/b"));
    let mut source = FileSource::new(dir.path());
    let before = source.load();
    dir.write("m.yaml", &text("/changed"));
    let after = source.load();
    assert!(Arc::ptr_eq(&find(&before, "a"), &find(&after, "a")));
    assert!(Arc::ptr_eq(
        &before.input.gateways[0],
        &after.input.gateways[0]
    ));
    assert!(!Arc::ptr_eq(&find(&before, "b"), &find(&after, "b")));
    let b = find(&after, "b");
    let path = &b.spec.rules.as_ref().unwrap()[0].matches.as_ref().unwrap()[0].path;
    assert_eq!(path.as_ref().unwrap().value.as_deref(), Some("/changed"));
    // A document inserted first moves every other one: they are found by name.
    dir.write(
        "m.yaml",
        &format!("{}---\n{}", route("new", "/new"), text("/changed")),
    );
    let moved = source.load();
    assert!(Arc::ptr_eq(&find(&after, "a"), &find(&moved, "a")));
    assert!(Arc::ptr_eq(&find(&after, "b"), &find(&moved, "b")));
    assert_eq!(route_names(&moved), ["a", "b", "new"]);
}
