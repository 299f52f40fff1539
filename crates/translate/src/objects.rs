//! Small helpers over object metadata shared by every stage.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The API group of every Gateway API kind.
pub const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";

/// `namespace/name` of a namespaced object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ObjectKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    pub fn of(meta: &ObjectMeta) -> Self {
        let (namespace, name) = key_of(meta);
        ObjectKey::new(namespace, name)
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

pub fn namespace(meta: &ObjectMeta) -> String {
    key_of(meta).0.to_string()
}

/// [`ObjectKey::of`] borrowed, for lookups that run for every object on every pass:
/// (namespace, `default` when unset; name).
pub fn key_of(meta: &ObjectMeta) -> (&str, &str) {
    (
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref().unwrap_or_default(),
    )
}

/// Sort key that puts older objects first and breaks ties by namespace/name, as the spec asks
/// for route and listener precedence. Objects without a creation time count as oldest.
pub fn age_key(meta: &ObjectMeta) -> (Timestamp, ObjectKey) {
    let created = meta
        .creation_timestamp
        .as_ref()
        .map(|t| t.0)
        .unwrap_or(Timestamp::UNIX_EPOCH);
    (created, ObjectKey::of(meta))
}

/// A Kubernetes label selector (matchLabels and matchExpressions), evaluated against `labels`.
pub fn selector_matches(
    match_labels: Option<&BTreeMap<String, String>>,
    expressions: &[(String, String, Vec<String>)],
    labels: &BTreeMap<String, String>,
) -> bool {
    let labels_ok = match_labels
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    labels_ok
        && expressions
            .iter()
            .all(|(key, op, values)| match op.as_str() {
                "In" => labels.get(key).is_some_and(|v| values.contains(v)),
                "NotIn" => labels.get(key).is_none_or(|v| !values.contains(v)),
                "Exists" => labels.contains_key(key),
                "DoesNotExist" => !labels.contains_key(key),
                _ => false,
            })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors() {
        let labels: BTreeMap<String, String> = [("env".to_string(), "prod".to_string())]
            .into_iter()
            .collect();
        let ml: BTreeMap<String, String> = labels.clone();
        assert!(selector_matches(Some(&ml), &[], &labels));
        assert!(!selector_matches(Some(&ml), &[], &BTreeMap::new()));
        let expr = |op: &str, v: &[&str]| {
            vec![(
                "env".to_string(),
                op.to_string(),
                v.iter().map(|s| s.to_string()).collect(),
            )]
        };
        assert!(selector_matches(
            None,
            &expr("In", &["prod", "dev"]),
            &labels
        ));
        assert!(!selector_matches(None, &expr("NotIn", &["prod"]), &labels));
        assert!(selector_matches(None, &expr("Exists", &[]), &labels));
        assert!(!selector_matches(None, &expr("DoesNotExist", &[]), &labels));
        assert!(!selector_matches(None, &expr("Bogus", &[]), &labels));
    }
}
