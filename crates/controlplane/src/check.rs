//! A manifest check a CI can trust (`gatehouse status --strict`): every problem in a folder of
//! manifests, one line each, at the file and line of the object it concerns.
//!
//! A problem is anything that would make the manifests serve less than they say: a file that
//! does not load, a warning (an unknown field is usually a typo: `pathh`, `backendRef`), a
//! condition Gatehouse sets to the bad value (Accepted=False, ResolvedRefs=False,
//! Programmed=False, Conflicted=True, PartiallyInvalid=True), a route whose parentRef names no
//! Gateway, a Gateway whose GatewayClass does not exist, or nothing to serve at all.

use crate::file::Loaded;
use gatehouse_translate::kinds::{Kind, KindVisitor, StatusShape, for_each_kind};
use gatehouse_translate::{GATEWAY_GROUP, Input, ObjectKey, RouteKind, Status};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde_json::Value;
use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

/// One problem, at the object it concerns when there is one.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Problem {
    pub file: Option<PathBuf>,
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.file, self.line) {
            (Some(file), Some(line)) => write!(f, "{}:{line}: {}", file.display(), self.message),
            (Some(file), None) => write!(f, "{}: {}", file.display(), self.message),
            _ => f.write_str(&self.message),
        }
    }
}

/// Every problem of `loaded` (read from `root`) given the status translate computed for it,
/// in file and line order.
pub fn problems(root: &Path, loaded: &Loaded, status: &Status) -> Vec<Problem> {
    let mut out: Vec<Problem> = loaded
        .errors
        .iter()
        .chain(&loaded.warnings)
        .map(|e| Problem {
            file: Some(e.file.clone()),
            line: e.line,
            message: e.message.clone(),
        })
        .collect();
    let at = |kind: &str, key: &ObjectKey| loaded.locations.get(&(kind.to_string(), key.clone()));
    let mut object_problem = |kind: &str, key: &ObjectKey, message: String| {
        let (file, line) = match at(kind, key) {
            Some((file, line)) => (Some(file.clone()), Some(*line)),
            None => (None, None),
        };
        out.push(Problem {
            file,
            line,
            message: format!("{kind} {}: {message}", display_key(kind, key)),
        });
    };

    // Conditions of every object with a status of ours.
    struct Conditions<'a, F: FnMut(&str, &ObjectKey, String)> {
        input: &'a Input,
        status: &'a Status,
        report: &'a mut F,
    }
    impl<F: FnMut(&str, &ObjectKey, String)> KindVisitor for Conditions<'_, F> {
        fn visit<K: Kind>(&mut self) {
            if K::STATUS == StatusShape::None {
                return;
            }
            let kind = K::kind_name();
            for object in K::of(self.input) {
                let Some(status) = object.computed_status(self.status) else {
                    continue;
                };
                let key = ObjectKey::of(object.meta());
                for message in bad_conditions(&status) {
                    (self.report)(&kind, &key, message);
                }
            }
        }
    }
    for_each_kind(&mut Conditions {
        input: &loaded.input,
        status,
        report: &mut object_problem,
    });

    // Gateways whose class does not exist: nobody will ever serve them.
    let classes: BTreeSet<&str> = loaded
        .input
        .gateway_classes
        .iter()
        .filter_map(|c| c.metadata.name.as_deref())
        .collect();
    for gw in &loaded.input.gateways {
        if !classes.contains(gw.spec.gateway_class_name.as_str()) {
            object_problem(
                "Gateway",
                &ObjectKey::of(&gw.metadata),
                format!(
                    "GatewayClass {} does not exist; no controller serves this Gateway",
                    gw.spec.gateway_class_name
                ),
            );
        }
    }

    // Routes whose parentRefs name no Gateway at all.
    let gateways: BTreeSet<ObjectKey> = loaded
        .input
        .gateways
        .iter()
        .map(|g| ObjectKey::of(&g.metadata))
        .collect();
    struct Parents<'a, F: FnMut(&str, &ObjectKey, String)> {
        input: &'a Input,
        gateways: &'a BTreeSet<ObjectKey>,
        report: &'a mut F,
    }
    impl<F: FnMut(&str, &ObjectKey, String)> gatehouse_translate::kinds::RouteKindVisitor
        for Parents<'_, F>
    {
        fn visit<R: RouteKind>(&mut self) {
            let kind = R::kind_name();
            for route in R::of(self.input) {
                let key = ObjectKey::of(route.meta());
                for p in route.parent_refs() {
                    let is_gateway = p.group.as_deref().unwrap_or(GATEWAY_GROUP) == GATEWAY_GROUP
                        && p.kind.as_deref().unwrap_or("Gateway") == "Gateway";
                    let ns = p.namespace.clone().unwrap_or_else(|| key.namespace.clone());
                    let target = ObjectKey::new(ns, p.name.clone());
                    if is_gateway && !self.gateways.contains(&target) {
                        (self.report)(
                            &kind,
                            &key,
                            format!("parentRef names Gateway {target}, which does not exist"),
                        );
                    }
                }
            }
        }
    }
    gatehouse_translate::kinds::for_each_route_kind(&mut Parents {
        input: &loaded.input,
        gateways: &gateways,
        report: &mut object_problem,
    });

    if loaded.locations.is_empty() && loaded.errors.is_empty() {
        out.push(Problem {
            file: Some(root.to_path_buf()),
            line: None,
            message: "no Kubernetes objects found (nothing to serve)".into(),
        });
    }
    out.sort();
    out.dedup();
    out
}

fn display_key(kind: &str, key: &ObjectKey) -> String {
    if kind == "GatewayClass" {
        key.name.clone()
    } else {
        key.to_string()
    }
}

/// Conditions Gatehouse set to the value that means trouble, anywhere in a status it writes
/// (the object's own, its listeners', its parents' or ancestors').
fn bad_conditions(status: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let mut each = |prefix: String, conditions: &Value| {
        let Ok(conditions) = serde_json::from_value::<Vec<Condition>>(conditions.clone()) else {
            return;
        };
        for c in conditions {
            let bad = match c.type_.as_str() {
                "Conflicted" | "PartiallyInvalid" => c.status == "True",
                "Accepted" | "ResolvedRefs" | "Programmed" => c.status == "False",
                _ => false,
            };
            if bad {
                out.push(format!(
                    "{prefix}{}={} ({}): {}",
                    c.type_, c.status, c.reason, c.message
                ));
            }
        }
    };
    match status {
        // Shared lists: route parents, policy ancestors.
        Value::Array(entries) => {
            for e in entries {
                let parent = e
                    .get("parentRef")
                    .or_else(|| e.get("ancestorRef"))
                    .and_then(|r| r.get("name"))
                    .and_then(Value::as_str)
                    .unwrap_or("?");
                each(format!("on {parent}: "), &e["conditions"]);
            }
        }
        Value::Object(_) => {
            each(String::new(), &status["conditions"]);
            for l in status["listeners"].as_array().into_iter().flatten() {
                let name = l["name"].as_str().unwrap_or("?");
                each(format!("listener {name}: "), &l["conditions"]);
            }
        }
        _ => {}
    }
    out
}
