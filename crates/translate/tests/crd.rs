//! The committed CRD of GatehouseParameters is the one the Rust type generates: the file at
//! `deploy/crds/gatehouse.dev_gatehouseparameters.yaml` is what clusters install, the Rust type
//! is what translate reads, and a field added to one but not the other would be pruned by the
//! API server or never read. `UPDATE_CRDS=1 cargo test -p gatehouse-translate --test crd`
//! rewrites the file, to be reviewed as a git diff.
//!
//! The other tests read one example object that sets every field through both sides: the Rust
//! type (every field must arrive) and the committed schema (every field must be declared).

use gatehouse_translate::parameters::{self, GatehouseParameters};
use serde_json::Value;

const CRD_PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deploy/crds/gatehouse.dev_gatehouseparameters.yaml"
);

const HEADER: &str = "\
# GatehouseParameters (gatehouse.dev/v1alpha1): generated from the Rust type
# gatehouse_translate::parameters::GatehouseParametersSpec, not written by hand:
# UPDATE_CRDS=1 cargo test -p gatehouse-translate --test crd
";

/// An object that sets every field of the spec.
const EXAMPLE: &str = r#"
apiVersion: gatehouse.dev/v1alpha1
kind: GatehouseParameters
metadata: {name: every-field, namespace: infra}
spec:
  replicas: 3
  autoscaling: {minReplicas: 2, maxReplicas: 10, targetCPUUtilizationPercentage: 70}
  podDisruptionBudget: {minAvailable: "50%"}
  resources:
    requests: {cpu: 500m, memory: 128Mi}
    limits: {memory: 256Mi}
  service:
    type: NodePort
    annotations: {example.com/lb: internal}
    externalTrafficPolicy: Local
    loadBalancerClass: example.com/internal
  workers: 4
  drainDelay: 10s
  shutdownGrace: 1m
  logFormat: json
  nodeSelector: {kubernetes.io/os: linux}
  tolerations: [{key: dedicated, operator: Equal, value: gateway, effect: NoSchedule}]
  affinity:
    podAntiAffinity:
      preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector: {matchLabels: {app: gatehouse}}
  topologySpreadConstraints:
  - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway}
"#;

fn generated() -> String {
    let yaml = serde_yaml::to_string(&parameters::crd()).expect("the CRD serialises");
    format!("{HEADER}{yaml}")
}

#[test]
fn committed_crd_is_the_generated_one() {
    let generated = generated();
    let committed = std::fs::read_to_string(CRD_PATH).ok();
    if committed.as_deref() == Some(generated.as_str()) {
        return;
    }
    if std::env::var("UPDATE_CRDS").is_ok_and(|v| !v.is_empty() && v != "0") {
        let dir = std::path::Path::new(CRD_PATH).parent().unwrap();
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(CRD_PATH, &generated).unwrap();
        eprintln!("updated {CRD_PATH}");
        return;
    }
    let first_difference = match &committed {
        None => "the file does not exist".to_string(),
        Some(committed) => committed
            .lines()
            .zip(generated.lines())
            .enumerate()
            .find(|(_, (a, b))| a != b)
            .map(|(i, (a, b))| format!("line {}: committed {a:?}, generated {b:?}", i + 1))
            .unwrap_or_else(|| "one is a prefix of the other".to_string()),
    };
    panic!(
        "deploy/crds/gatehouse.dev_gatehouseparameters.yaml is not what the Rust type \
         generates ({first_difference}); run UPDATE_CRDS=1 cargo test -p gatehouse-translate \
         --test crd and review the diff"
    );
}

/// Every field of the example survives a trip through the Rust type.
#[test]
fn the_rust_type_reads_every_field_of_the_example() {
    let example: Value = serde_yaml::from_str(EXAMPLE).unwrap();
    let object: GatehouseParameters = serde_json::from_value(example.clone()).unwrap();
    let back = serde_json::to_value(&object).unwrap();
    assert_eq!(back["spec"], example["spec"]);
}

/// Every field of the example is declared in the committed schema, with the type the example
/// gives it: the API server would otherwise prune it or refuse the object.
#[test]
fn the_committed_schema_declares_every_field_of_the_example() {
    let crd: Value = serde_yaml::from_str(&std::fs::read_to_string(CRD_PATH).unwrap()).unwrap();
    let version = &crd["spec"]["versions"][0];
    assert_eq!(version["name"], "v1alpha1");
    assert_eq!(crd["spec"]["scope"], "Namespaced");
    assert_eq!(crd["spec"]["group"], "gatehouse.dev");
    let schema = &version["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let example: Value = serde_yaml::from_str(EXAMPLE).unwrap();
    let mut problems = Vec::new();
    check(schema, &example["spec"], "spec", &mut problems);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Walks `value` along `schema`: objects by properties (or additionalProperties), arrays by
/// items, and leaves by type.
fn check(schema: &Value, value: &Value, path: &str, problems: &mut Vec<String>) {
    if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        if !(value.is_string() || value.is_i64()) {
            problems.push(format!("{path}: int-or-string, got {value}"));
        }
        return;
    }
    let ty = schema["type"].as_str().unwrap_or_default();
    match value {
        Value::Object(map) => {
            if ty != "object" {
                problems.push(format!("{path}: schema type {ty:?}, example has an object"));
                return;
            }
            for (k, v) in map {
                let field = schema["properties"]
                    .get(k)
                    .or_else(|| schema.get("additionalProperties").filter(|a| a.is_object()));
                match field {
                    Some(field) => check(field, v, &format!("{path}.{k}"), problems),
                    None => problems.push(format!("{path}.{k}: not declared in the schema")),
                }
            }
        }
        Value::Array(items) => {
            if ty != "array" {
                problems.push(format!("{path}: schema type {ty:?}, example has an array"));
                return;
            }
            for (i, v) in items.iter().enumerate() {
                check(&schema["items"], v, &format!("{path}[{i}]"), problems);
            }
        }
        Value::String(_) if ty != "string" => {
            problems.push(format!("{path}: schema type {ty:?}, example has a string"))
        }
        Value::Number(_) if ty != "integer" && ty != "number" => {
            problems.push(format!("{path}: schema type {ty:?}, example has a number"))
        }
        _ => {}
    }
}
