//! One object that does not decode costs only itself.
//!
//! The watchers list and watch `Lenient<K>` instead of `K`. kube decodes a list as one
//! document, so with `K` itself a single object our types reject fails the whole list: the
//! kind is never listed, the controller never becomes ready, and no object of that kind is
//! served. One HTTPRoute with a filter type from a newer Gateway API release (or from the
//! experimental channel, when our types came from the standard one) was enough. Here each
//! object is decoded on its own; one that fails keeps its name and the error, is left out of
//! the snapshot, and is logged by the watch that saw it.

use gatehouse_translate::kinds::Kind;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer};
use std::borrow::Cow;
use std::sync::Arc;

/// An object of kind `K` as the API server sent it: decoded, or why not.
#[derive(Clone, Debug)]
pub struct Lenient<K> {
    /// Name, namespace and resourceVersion: what the reflector's store keys objects by.
    meta: ObjectMeta,
    pub object: Result<Arc<K>, Arc<str>>,
}

impl<K: Kind> kube::Resource for Lenient<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.meta
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.meta
    }
}

/// What the store needs of an object's metadata; the decoded object keeps all of it.
fn key_meta(meta: &ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        resource_version: meta.resource_version.clone(),
        uid: meta.uid.clone(),
        ..ObjectMeta::default()
    }
}

impl<'de, K: Kind> Deserialize<'de> for Lenient<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Only a document that is not JSON at all is an error for the whole list.
        let mut value = serde_json::Value::deserialize(deserializer)?;
        // managedFields (which field manager set what) is never read: not by translate, not
        // by the status writer, whose patches do not depend on it. It is often larger than
        // the rest of the object, and every object is held for as long as it exists.
        if let Some(meta) = value
            .get_mut("metadata")
            .and_then(serde_json::Value::as_object_mut)
        {
            meta.remove("managedFields");
        }
        match K::deserialize(&value) {
            Ok(object) => Ok(Lenient {
                meta: key_meta(object.meta()),
                object: Ok(Arc::new(object)),
            }),
            Err(e) => {
                let meta = value
                    .get("metadata")
                    .and_then(|m| ObjectMeta::deserialize(m).ok())
                    .unwrap_or_default();
                Ok(Lenient {
                    meta: key_meta(&meta),
                    object: Err(e.to_string().into()),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatehouse_translate::generated::httproutes::HttpRoute;
    use kube::core::ObjectList;

    fn route(name: &str, filter_type: &str) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": {"name": name, "namespace": "default", "resourceVersion": "7"},
            "spec": {"rules": [{"filters": [{"type": filter_type}]}]}
        })
    }

    /// What decoding object by object costs on a list of 5000 routes, typed against lenient.
    /// A measurement to run by hand (`cargo test --release -p gatehouse-controlplane
    /// lenient_cost -- --ignored --nocapture`), not an assertion.
    #[test]
    #[ignore]
    fn lenient_cost() {
        let items: Vec<_> = (0..5000)
            .map(|i| route(&format!("r{i}"), "RequestHeaderModifier"))
            .collect();
        let body = serde_json::to_vec(&serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRouteList",
            "metadata": {"resourceVersion": "9"}, "items": items,
        }))
        .unwrap();
        for _ in 0..3 {
            let t = std::time::Instant::now();
            let typed: ObjectList<HttpRoute> = serde_json::from_slice(&body).unwrap();
            let typed_time = t.elapsed();
            let t = std::time::Instant::now();
            let lenient: ObjectList<Lenient<HttpRoute>> = serde_json::from_slice(&body).unwrap();
            let lenient_time = t.elapsed();
            assert_eq!(typed.items.len(), lenient.items.len());
            eprintln!(
                "{} KiB, 5000 routes: typed {typed_time:?}, lenient {lenient_time:?}",
                body.len() / 1024
            );
        }
    }

    /// managedFields is dropped as the object is read; everything else is kept.
    #[test]
    fn managed_fields_are_not_kept() {
        let mut object = route("r", "RequestHeaderModifier");
        object["metadata"]["managedFields"] = serde_json::json!([{
            "manager": "kubectl", "operation": "Update", "apiVersion": "gateway.networking.k8s.io/v1",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:rules": {}}}
        }]);
        object["metadata"]["labels"] = serde_json::json!({"app": "a"});
        let read: Lenient<HttpRoute> = serde_json::from_value(object).unwrap();
        let route = read.object.unwrap();
        assert_eq!(route.metadata.managed_fields, None);
        assert_eq!(route.metadata.labels.as_ref().unwrap()["app"], "a");
        assert_eq!(route.metadata.resource_version.as_deref(), Some("7"));
    }

    #[test]
    fn one_object_that_does_not_decode_leaves_the_rest_of_the_list() {
        let list = serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRouteList",
            "metadata": {"resourceVersion": "9"},
            "items": [
                route("good", "RequestHeaderModifier"),
                route("from-the-future", "SomethingNew"),
            ]
        });
        // The typed list fails as a whole: this is what the wrapper is for.
        assert!(serde_json::from_value::<ObjectList<HttpRoute>>(list.clone()).is_err());

        let list: ObjectList<Lenient<HttpRoute>> = serde_json::from_value(list).unwrap();
        assert_eq!(list.items.len(), 2);
        let good = &list.items[0];
        assert_eq!(good.meta.name.as_deref(), Some("good"));
        assert!(good.object.is_ok());
        let bad = &list.items[1];
        assert_eq!(bad.meta.name.as_deref(), Some("from-the-future"));
        assert_eq!(bad.meta.namespace.as_deref(), Some("default"));
        assert_eq!(bad.meta.resource_version.as_deref(), Some("7"));
        let why = bad.object.as_ref().unwrap_err();
        assert!(why.contains("SomethingNew"), "{why}");
    }
}
