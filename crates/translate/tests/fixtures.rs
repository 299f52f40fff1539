//! Translate fixtures: every directory under `tests/fixtures/` is one case.
//!
//! A case is `input.yaml` (manifests, multi-document, a comment at the top saying what the case
//! shows), `output.yaml` (the snapshot: IR and status of `translate` with default [`Options`])
//! and optionally `options.yaml` ([`OptionsFile`]). The runner translates every case, renders
//! the output deterministically and compares it with the snapshot; a mismatch prints a line
//! diff. `UPDATE_FIXTURES=1 cargo test -p gatehouse-translate --test fixtures` rewrites the
//! snapshots instead, so a change in behaviour is reviewed as a git diff of `output.yaml`.
//! See `tests/fixtures/README.md` for what the snapshots normalise.
//!
//! The other tests here check what one snapshot cannot show: properties over every fixture
//! (independence of input order) and the list behind a snapshot marker.

use gatehouse_translate::kinds::{
    Kind, KindVisitor, RouteKindVisitor, for_each_kind, for_each_route_kind,
};
use gatehouse_translate::{
    Input, ObjectKey, Options, Output, ResolvedParameters, Reuse, RouteKind, SUPPORTED_FEATURES,
    ServiceAddresses, translate, translate_reusing,
};
use serde::Deserialize;
use serde_yaml::{Mapping, Value};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
const UPDATE_VAR: &str = "UPDATE_FIXTURES";
const CASE_FILES: [&str; 3] = ["input.yaml", "output.yaml", "options.yaml"];

const HEADER: &str = "\
# Snapshot of translate(input.yaml): the IR (config) and the status. Written by
# tests/fixtures.rs, not by hand: UPDATE_FIXTURES=1 cargo test -p gatehouse-translate --test fixtures
";

#[test]
fn fixtures() {
    let update = std::env::var(UPDATE_VAR).is_ok_and(|v| !v.is_empty() && v != "0");
    let dirs = case_dirs();
    assert!(!dirs.is_empty(), "no fixtures under {FIXTURES}");
    let mut failures = Vec::new();
    for dir in &dirs {
        let name = case_name(dir);
        let checked = std::panic::catch_unwind(|| check(dir, update));
        match checked {
            Ok(Ok(())) => {}
            Ok(Err(problem)) => failures.push(format!("{name}: {problem}")),
            Err(panic) => failures.push(format!("{name}: panicked: {}", panic_message(&panic))),
        }
    }
    if !failures.is_empty() {
        panic!(
            "{} of {} fixtures failed (rewrite the snapshots with {UPDATE_VAR}=1 if the change \
             is intended, then review the diff):\n\n{}",
            failures.len(),
            dirs.len(),
            failures.join("\n\n")
        );
    }
}

/// Every fixture gives the same output when each kind's objects come in reverse order, and
/// the same output twice (translate sorts what it reads and keeps no state).
#[test]
fn every_fixture_is_independent_of_input_order() {
    for dir in case_dirs() {
        let case = Case::load(&dir);
        let forward = translate(&case.input, &case.options);
        let mut reversed = case.input.clone();
        for_each_kind(&mut Reverse(&mut reversed));
        let backward = translate(&reversed, &case.options);
        if forward != backward {
            panic!(
                "{}: reversing the input changes the output:\n{}",
                case.name,
                diff(&case.render(&forward), &case.render(&backward))
            );
        }
        assert_eq!(
            forward,
            translate(&case.input, &case.options),
            "{}: translating twice gives different outputs",
            case.name
        );
    }
}

/// Translating with work kept from the last pass ([`translate_reusing`]) gives what
/// translating from nothing gives, for every fixture: on the first pass (nothing kept), when
/// nothing changed (every route reused), when one route of any kind changed or went away
/// (every other route reused), in another order, and with the fixtures one after another
/// through one [`Reuse`] (everything around the routes changes).
#[test]
fn every_fixture_translates_the_same_reusing_work() {
    let mut across = Reuse::default();
    for dir in case_dirs() {
        let case = Case::load(&dir);
        let same = |reuse: &mut Reuse, input: &Input, what: &str| {
            let fresh = translate(input, &case.options);
            let reused = translate_reusing(input, &case.options, reuse);
            if fresh != reused {
                panic!(
                    "{} ({what}): reusing work changes the output:\n{}",
                    case.name,
                    diff(&case.render(&fresh), &case.render(&reused))
                );
            }
        };
        same(&mut across, &case.input, "after the fixture before it");
        let mut reuse = Reuse::default();
        same(&mut reuse, &case.input, "first pass");
        let routes = route_count(&case.input);
        same(&mut reuse, &case.input, "unchanged");
        assert_eq!(
            (reuse.reused().routes, reuse.reused().worked),
            (routes, 0),
            "{}: an unchanged input reuses every route",
            case.name
        );
        for (what, input) in one_route_away(&case.input) {
            same(&mut reuse, &input, &what);
            if what.ends_with("copied") {
                assert_eq!(
                    (reuse.reused().routes, reuse.reused().worked),
                    (routes - 1, 1),
                    "{} ({what}): only the changed route is worked out again",
                    case.name
                );
            }
            same(&mut reuse, &case.input, &format!("back from {what}"));
        }
        let mut reversed = case.input.clone();
        for_each_kind(&mut Reverse(&mut reversed));
        same(&mut reuse, &reversed, "reversed");
    }
}

/// Each kind's objects in reverse order.
struct Reverse<'i>(&'i mut Input);
impl KindVisitor for Reverse<'_> {
    fn visit<K: Kind>(&mut self) {
        K::of_mut(self.0).reverse();
    }
}

fn route_count(input: &Input) -> usize {
    struct Count<'i>(&'i Input, usize);
    impl RouteKindVisitor for Count<'_> {
        fn visit<R: RouteKind>(&mut self) {
            self.1 += R::of(self.0).len();
        }
    }
    let mut count = Count(input, 0);
    for_each_route_kind(&mut count);
    count.1
}

/// Inputs one route away from `input`: each route of every kind replaced by a copy (a new
/// object with the same content, as a store gives a changed one), and each removed.
fn one_route_away(input: &Input) -> Vec<(String, Input)> {
    struct Visit<'i> {
        input: &'i Input,
        out: Vec<(String, Input)>,
    }
    impl RouteKindVisitor for Visit<'_> {
        fn visit<R: RouteKind>(&mut self) {
            for i in 0..R::of(self.input).len() {
                let mut copied = self.input.clone();
                let list = R::of_mut(&mut copied);
                list[i] = Arc::new((*list[i]).clone());
                self.out
                    .push((format!("{} {i} copied", R::kind_name()), copied));
                let mut removed = self.input.clone();
                R::of_mut(&mut removed).remove(i);
                self.out
                    .push((format!("{} {i} removed", R::kind_name()), removed));
            }
        }
    }
    let mut visit = Visit {
        input,
        out: Vec::new(),
    };
    for_each_route_kind(&mut visit);
    visit.out
}

/// Snapshots write the class's supportedFeatures as `<SUPPORTED_FEATURES>` (see the README);
/// this is the list behind it.
#[test]
fn gateway_class_lists_the_supported_features() {
    let case = Case::load(&Path::new(FIXTURES).join("gateway-class-conditions"));
    let out = translate(&case.input, &case.options);
    let names: Vec<&str> = out.status.gateway_classes["gatehouse"]
        .supported_features
        .iter()
        .flatten()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(names, SUPPORTED_FEATURES);
    assert!(names.contains(&"HTTPRoute"));
}

/// Snapshots write an Infrastructure's parameters equal to `ResolvedParameters::default()` as
/// `<DEFAULT_PARAMETERS>` (see the README); these are the values behind it.
#[test]
fn default_parameters_are_the_documented_ones() {
    let defaults = serde_yaml::to_string(&ResolvedParameters::default()).unwrap();
    assert_eq!(
        defaults,
        "\
replicas: 1
service:
  type: LoadBalancer
drainDelay: 5s
shutdownGrace: 30s
logFormat: text
"
    );
}

const DEFAULT_PARAMETERS: &str = "<DEFAULT_PARAMETERS>";

/// One fixture directory, loaded.
struct Case {
    name: String,
    input: Input,
    options: Options,
    /// PEM values of the input's Secrets and ConfigMaps, to name them in the snapshot.
    pems: BTreeMap<String, Vec<String>>,
}

impl Case {
    fn load(dir: &Path) -> Case {
        let read = |file: &str| {
            let path = dir.join(file);
            std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
        };
        let input = gatehouse_testkit::manifests::input(&read("input.yaml"));
        let options = if dir.join("options.yaml").exists() {
            let file: OptionsFile = serde_yaml::from_str(&read("options.yaml"))
                .unwrap_or_else(|e| panic!("options.yaml: {e}"));
            file.into_options()
        } else {
            Options::default()
        };
        let pems = input_pems(&input);
        Case {
            name: case_name(dir),
            input,
            options,
            pems,
        }
    }

    /// The snapshot text of `out`.
    fn render(&self, out: &Output) -> String {
        let keyed = |entries: Vec<(String, Value)>| {
            Value::Mapping(
                entries
                    .into_iter()
                    .map(|(k, v)| (Value::String(k), v))
                    .collect(),
            )
        };
        let status = &out.status;
        let mut doc = mapping([
            ("config", value(&out.config)),
            (
                "status",
                mapping([
                    (
                        "gatewayClasses",
                        keyed(
                            status
                                .gateway_classes
                                .iter()
                                .map(|(name, s)| (name.clone(), value(s)))
                                .collect(),
                        ),
                    ),
                    (
                        "gateways",
                        keyed(
                            status
                                .gateways
                                .iter()
                                .map(|(key, s)| (key.to_string(), value(s)))
                                .collect(),
                        ),
                    ),
                    (
                        "routes",
                        keyed(
                            status
                                .routes
                                .iter()
                                .map(|(key, s)| (format!("{} {}", key.kind, key.key), value(s)))
                                .collect(),
                        ),
                    ),
                    (
                        "backendTLSPolicies",
                        keyed(
                            status
                                .backend_tls_policies
                                .iter()
                                .map(|(key, s)| (key.to_string(), value(s)))
                                .collect(),
                        ),
                    ),
                ]),
            ),
        ]);
        // Written only where some ListenerSet names one of our Gateways, so that the snapshots
        // of cases without ListenerSets read as they did before the kind existed.
        if !status.listener_sets.is_empty() {
            let entries = status
                .listener_sets
                .iter()
                .map(|(key, s)| (key.to_string(), value(s)))
                .collect();
            if let Some(Value::Mapping(map)) = doc.get_mut("status") {
                map.insert(Value::String("listenerSets".into()), keyed(entries));
            }
        }
        // Written only where a Gateway has a data plane to provision, and with the parameters
        // equal to the defaults as a marker: every accepted Gateway has an entry, and spelling
        // out the defaults in each snapshot would hide the cases that change them.
        if !out.infrastructure.is_empty() {
            let entries = out
                .infrastructure
                .iter()
                .map(|(key, infra)| {
                    let mut v = value(infra);
                    if infra.parameters == ResolvedParameters::default() {
                        v["parameters"] = Value::String(DEFAULT_PARAMETERS.into());
                    }
                    (key.to_string(), v)
                })
                .collect();
            if let Value::Mapping(map) = &mut doc {
                map.insert(Value::String("infrastructure".into()), keyed(entries));
            }
        }
        self.normalise(&mut doc["config"], false);
        self.normalise(&mut doc["status"], true);
        format!(
            "{HEADER}{}",
            serde_yaml::to_string(&doc).expect("a snapshot serialises")
        )
    }

    /// PEM values become the names of the input values they are (private keys never appear),
    /// a supportedFeatures list equal to [`SUPPORTED_FEATURES`] becomes a marker, and in status
    /// (`in_status`) a condition's fields and a `name` come first.
    fn normalise(&self, value: &mut Value, in_status: bool) {
        match value {
            Value::String(s) if s.contains("-----BEGIN ") => *s = self.pem_name(s),
            Value::Sequence(items) => items.iter_mut().for_each(|v| self.normalise(v, in_status)),
            Value::Tagged(tagged) => self.normalise(&mut tagged.value, in_status),
            Value::Mapping(map) => {
                if in_status {
                    *map = status_order(std::mem::take(map));
                }
                for (k, v) in map.iter_mut() {
                    if k.as_str() == Some("supportedFeatures") && is_supported_features(v) {
                        *v = Value::String("<SUPPORTED_FEATURES>".into());
                    } else {
                        self.normalise(v, in_status);
                    }
                }
            }
            _ => {}
        }
    }

    /// `<PEM: Secret default/s tls.crt>`, `<redacted private key: Secret default/s tls.key>`; a
    /// bundle of several input values lists them all.
    fn pem_name(&self, pem: &str) -> String {
        let mut parts = Vec::new();
        let mut rest = pem;
        while !rest.is_empty() {
            let Some((value, names)) = self
                .pems
                .iter()
                .filter(|(value, _)| rest.starts_with(value.as_str()))
                .max_by_key(|(value, _)| value.len())
            else {
                let what = if pem.contains("PRIVATE KEY") {
                    "private key"
                } else {
                    "PEM"
                };
                return format!("<redacted {what}: not found in the input>");
            };
            parts.push(names.join(" = "));
            rest = &rest[value.len()..];
        }
        if pem.contains("PRIVATE KEY") {
            format!("<redacted private key: {}>", parts.join(" + "))
        } else {
            format!("<PEM: {}>", parts.join(" + "))
        }
    }
}

/// `options.yaml`: the [`Options`] fields a case may set; the rest keep their defaults.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct OptionsFile {
    controller_name: Option<String>,
    default_address: Option<IpAddr>,
    /// `namespace/name` of a Gateway to the address assigned to it.
    #[serde(default)]
    gateway_addresses: BTreeMap<String, IpAddr>,
    published_addresses: Option<Vec<PublishedAddress>>,
    /// `namespace/name` of a Gateway to its own Service's addresses (provisioned mode): what
    /// it reports by default (load-balancer ingress, or cluster IPs without a load balancer).
    #[serde(default)]
    gateway_published_addresses: BTreeMap<String, Vec<PublishedAddress>>,
    /// `namespace/name` of a Gateway to its own Service's cluster IPs (provisioned mode):
    /// what routability Cluster gets.
    #[serde(default)]
    gateway_cluster_addresses: BTreeMap<String, Vec<PublishedAddress>>,
    /// A controller that provisions a data plane per Gateway (`--provision`).
    #[serde(default)]
    provisioned: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PublishedAddress {
    #[serde(rename = "type")]
    type_: String,
    value: String,
    routability: Option<String>,
}

impl PublishedAddress {
    fn into_options(self) -> gatehouse_translate::PublishedAddress {
        gatehouse_translate::PublishedAddress {
            type_: self.type_,
            value: self.value,
            routability: self.routability,
        }
    }
}

fn gateway_key(key: &str) -> ObjectKey {
    let (ns, name) = key
        .split_once('/')
        .unwrap_or_else(|| panic!("Gateway key {key}: want ns/name"));
    ObjectKey::new(ns, name)
}

impl OptionsFile {
    fn into_options(self) -> Options {
        let defaults = Options::default();
        Options {
            provisioned: self.provisioned,
            controller_name: self.controller_name.unwrap_or(defaults.controller_name),
            default_address: self.default_address.unwrap_or(defaults.default_address),
            gateway_addresses: self
                .gateway_addresses
                .into_iter()
                .map(|(key, ip)| {
                    let (ns, name) = key
                        .split_once('/')
                        .unwrap_or_else(|| panic!("gatewayAddresses key {key}: want ns/name"));
                    (ObjectKey::new(ns, name), ip)
                })
                .collect(),
            published_addresses: self
                .published_addresses
                .map(|a| a.into_iter().map(PublishedAddress::into_options).collect()),
            gateway_published_addresses: {
                let mut map: BTreeMap<ObjectKey, ServiceAddresses> = BTreeMap::new();
                for (key, a) in self.gateway_published_addresses {
                    map.entry(gateway_key(&key)).or_default().default =
                        a.into_iter().map(PublishedAddress::into_options).collect();
                }
                for (key, a) in self.gateway_cluster_addresses {
                    map.entry(gateway_key(&key)).or_default().cluster =
                        a.into_iter().map(PublishedAddress::into_options).collect();
                }
                map
            },
        }
    }
}

/// Translates one case and compares (or, when updating, rewrites) its snapshot.
fn check(dir: &Path, update: bool) -> Result<(), String> {
    for entry in std::fs::read_dir(dir).map_err(|e| e.to_string())? {
        let file = entry.map_err(|e| e.to_string())?.file_name();
        let file = file.to_string_lossy();
        if !CASE_FILES.contains(&file.as_ref()) {
            return Err(format!(
                "unexpected file {file} (a case holds only {})",
                CASE_FILES.join(", ")
            ));
        }
    }
    let case = Case::load(dir);
    let actual = case.render(&translate(&case.input, &case.options));
    let snapshot = dir.join("output.yaml");
    let expected = std::fs::read_to_string(&snapshot).ok();
    if expected.as_deref() == Some(actual.as_str()) {
        return Ok(());
    }
    if update {
        std::fs::write(&snapshot, &actual).map_err(|e| e.to_string())?;
        eprintln!("updated {}", snapshot.display());
        return Ok(());
    }
    match expected {
        None => Err(format!(
            "no output.yaml yet; {UPDATE_VAR}=1 writes it, then review it"
        )),
        Some(expected) => Err(format!(
            "output differs from output.yaml (- snapshot, + now):\n{}",
            diff(&expected, &actual)
        )),
    }
}

fn case_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(FIXTURES)
        .unwrap_or_else(|e| panic!("cannot read {FIXTURES}: {e}"))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

fn case_name(dir: &Path) -> String {
    dir.file_name().unwrap().to_string_lossy().into_owned()
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

fn value<T: serde::Serialize>(v: &T) -> Value {
    serde_yaml::to_value(v).expect("translate output serialises")
}

fn mapping<const N: usize>(entries: [(&str, Value); N]) -> Value {
    Value::Mapping(
        entries
            .into_iter()
            .map(|(k, v)| (Value::String(k.into()), v))
            .collect::<Mapping>(),
    )
}

/// Status fields in the order people read them (serde writes Kubernetes types alphabetically):
/// a condition's type, status, reason and message, and the `name` of an entry with conditions
/// (a listener), come first; the rest keep their order.
fn status_order(map: Mapping) -> Mapping {
    const FIRST: [&str; 5] = ["name", "type", "status", "reason", "message"];
    let is_condition = ["type", "status", "reason"]
        .iter()
        .all(|k| map.contains_key(*k));
    let has_conditions = map.contains_key("conditions");
    let first = |k: &Value| {
        k.as_str()
            .and_then(|k| FIRST.iter().position(|f| *f == k))
            .filter(|&i| if i == 0 { has_conditions } else { is_condition })
    };
    let (mut leading, rest): (Vec<_>, Vec<_>) =
        map.into_iter().partition(|(k, _)| first(k).is_some());
    leading.sort_by_key(|(k, _)| first(k));
    leading.into_iter().chain(rest).collect()
}

fn is_supported_features(v: &Value) -> bool {
    let Some(items) = v.as_sequence() else {
        return false;
    };
    items.len() == SUPPORTED_FEATURES.len()
        && items
            .iter()
            .zip(SUPPORTED_FEATURES)
            .all(|(item, name)| item.get("name").and_then(Value::as_str) == Some(name))
}

/// Every PEM value of the input's Secrets and ConfigMaps, with the names of where it is
/// (`Secret default/s tls.crt`).
fn input_pems(input: &Input) -> BTreeMap<String, Vec<String>> {
    let mut pems: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut add = |kind: &str,
                   meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
                   key: &str,
                   value: String| {
        if value.contains("-----BEGIN ") {
            pems.entry(value).or_default().push(format!(
                "{kind} {} {key}",
                ObjectKey::new(
                    meta.namespace.as_deref().unwrap_or("default"),
                    meta.name.as_deref().unwrap_or_default()
                )
            ));
        }
    };
    for s in &input.secrets {
        for (key, v) in s.string_data.iter().flatten() {
            add("Secret", &s.metadata, key, v.clone());
        }
        for (key, v) in s.data.iter().flatten() {
            add(
                "Secret",
                &s.metadata,
                key,
                String::from_utf8_lossy(&v.0).into_owned(),
            );
        }
    }
    for c in &input.config_maps {
        for (key, v) in c.data.iter().flatten() {
            add("ConfigMap", &c.metadata, key, v.clone());
        }
    }
    // Cluster-scoped: named without a namespace.
    for b in &input.cluster_trust_bundles {
        if b.spec.trust_bundle.contains("-----BEGIN ") {
            pems.entry(b.spec.trust_bundle.clone())
                .or_default()
                .push(format!(
                    "ClusterTrustBundle {} trustBundle",
                    b.metadata.name.as_deref().unwrap_or_default()
                ));
        }
    }
    for names in pems.values_mut() {
        names.sort();
    }
    pems
}

/// A line diff of `old` and `new` (longest common subsequence) with three lines of context.
fn diff(old: &str, new: &str) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    // lcs[i][j]: length of the longest common subsequence of a[i..] and b[j..].
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    // (tag, line number in the snapshot, text); removals before additions.
    let mut ops: Vec<(char, usize, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            ops.push((' ', i + 1, a[i]));
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            ops.push(('-', i + 1, a[i]));
            i += 1;
        } else {
            ops.push(('+', i + 1, b[j]));
            j += 1;
        }
    }
    const CONTEXT: usize = 3;
    let changed: Vec<usize> = (0..ops.len()).filter(|&k| ops[k].0 != ' ').collect();
    let mut out = String::new();
    let mut last_printed: Option<usize> = None;
    for &k in &changed {
        let from = k.saturating_sub(CONTEXT);
        let to = (k + CONTEXT).min(ops.len() - 1);
        let start = match last_printed {
            Some(p) if p + 1 >= from => p + 1,
            _ => {
                out.push_str(&format!("@@ line {} @@\n", ops[from].1));
                from
            }
        };
        for (tag, _, text) in ops.iter().take(to + 1).skip(start) {
            out.push_str(&format!("{tag} {text}\n"));
        }
        last_printed = Some(last_printed.map_or(to, |p| p.max(to)));
    }
    out
}
