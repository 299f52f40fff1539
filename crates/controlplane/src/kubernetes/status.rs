//! Writes computed status back to the API, minimally and without fighting other controllers.
//!
//! - Only differences are written: the new status is compared with what the object carries
//!   (conditions keep their lastTransitionTime while unchanged, so equal means equal).
//! - Route status is shared with other controllers: only the `parents` entries with our
//!   controllerName are replaced; the others are kept as they are.
//! - Every write is a merge patch carrying the resourceVersion that was read, so a concurrent
//!   change makes it fail with a conflict instead of overwriting; the change that caused the
//!   conflict triggers the next reconcile, which writes again.

use gatehouse_translate::{Input, ObjectKey, Status, stamp_status};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::fmt::Debug;

pub struct StatusWriter {
    client: Client,
    controller_name: String,
}

/// What one `write` did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    pub patched: usize,
    pub unchanged: usize,
    pub conflicts: usize,
    pub failed: usize,
}

impl StatusWriter {
    pub fn new(client: Client, controller_name: impl Into<String>) -> Self {
        StatusWriter {
            client,
            controller_name: controller_name.into(),
        }
    }

    /// The status the objects in `input` carry now, as a [`Status`] (ours only).
    pub fn current(&self, input: &Input) -> Status {
        let mut s = Status::default();
        for c in &input.gateway_classes {
            if let Some(st) = &c.status {
                s.gateway_classes
                    .insert(c.metadata.name.clone().unwrap_or_default(), st.clone());
            }
        }
        for g in &input.gateways {
            if let Some(st) = &g.status {
                s.gateways.insert(ObjectKey::of(&g.metadata), st.clone());
            }
        }
        for r in &input.http_routes {
            if let Some(st) = &r.status {
                s.http_routes.insert(ObjectKey::of(&r.metadata), st.clone());
            }
        }
        for r in &input.tls_routes {
            if let Some(st) = &r.status {
                s.tls_routes.insert(ObjectKey::of(&r.metadata), st.clone());
            }
        }
        for p in &input.backend_tls_policies {
            if let Some(st) = &p.status {
                s.backend_tls_policies
                    .insert(ObjectKey::of(&p.metadata), st.clone());
            }
        }
        s
    }

    /// Stamp `status` against what the objects carry and write what differs.
    pub async fn write(&self, input: &Input, mut status: Status) -> Written {
        let current = self.current(input);
        stamp_status(&mut status, &current, Timestamp::now());
        let mut w = Written::default();
        let ours = self.controller_name.as_str();

        for class in &input.gateway_classes {
            let name = class.metadata.name.clone().unwrap_or_default();
            if let Some(st) = status.gateway_classes.get(&name) {
                let new = serde_json::to_value(st).unwrap_or_default();
                self.patch(Api::all(self.client.clone()), class, new, &mut w)
                    .await;
            }
        }
        for gw in &input.gateways {
            if let Some(st) = status.gateways.get(&ObjectKey::of(&gw.metadata)) {
                let new = serde_json::to_value(st).unwrap_or_default();
                self.patch(self.namespaced(&gw.metadata), gw, new, &mut w)
                    .await;
            }
        }
        for route in &input.http_routes {
            let mine = status
                .http_routes
                .get(&ObjectKey::of(&route.metadata))
                .map(|s| &s.parents);
            let new = merge_parents(route.status.as_ref().map(|s| &s.parents), mine, ours);
            if let Some(new) = new {
                self.patch(self.namespaced(&route.metadata), route, new, &mut w)
                    .await;
            }
        }
        for route in &input.tls_routes {
            let mine = status
                .tls_routes
                .get(&ObjectKey::of(&route.metadata))
                .map(|s| &s.parents);
            let new = merge_parents(route.status.as_ref().map(|s| &s.parents), mine, ours);
            if let Some(new) = new {
                self.patch(self.namespaced(&route.metadata), route, new, &mut w)
                    .await;
            }
        }
        for policy in &input.backend_tls_policies {
            let mine = status
                .backend_tls_policies
                .get(&ObjectKey::of(&policy.metadata))
                .map(|s| &s.ancestors);
            let current = policy.status.as_ref().map(|s| &s.ancestors);
            let others: Vec<Value> = current
                .into_iter()
                .flatten()
                .filter(|a| a.controller_name != ours)
                .map(|a| serde_json::to_value(a).unwrap_or_default())
                .collect();
            let had_ours = current
                .into_iter()
                .flatten()
                .any(|a| a.controller_name == ours);
            if mine.is_none() && !had_ours {
                continue;
            }
            let mut all = others;
            all.extend(
                mine.into_iter()
                    .flatten()
                    .map(|a| serde_json::to_value(a).unwrap_or_default()),
            );
            self.patch(
                self.namespaced(&policy.metadata),
                policy,
                json!({ "ancestors": all }),
                &mut w,
            )
            .await;
        }
        w
    }

    fn namespaced<K>(
        &self,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    ) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(
            self.client.clone(),
            meta.namespace.as_deref().unwrap_or("default"),
        )
    }

    async fn patch<K>(&self, api: Api<K>, obj: &K, new_status: Value, w: &mut Written)
    where
        K: Resource + Clone + DeserializeOwned + Serialize + Debug,
        K::DynamicType: Default,
    {
        let current = serde_json::to_value(obj)
            .ok()
            .and_then(|v| v.get("status").cloned())
            .unwrap_or(Value::Null);
        if current == new_status {
            w.unchanged += 1;
            return;
        }
        let meta = obj.meta();
        let name = meta.name.clone().unwrap_or_default();
        let body = json!({
            "metadata": { "resourceVersion": meta.resource_version },
            "status": new_status,
        });
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&body))
            .await
        {
            Ok(_) => w.patched += 1,
            Err(kube::Error::Api(e)) if e.code == 409 => w.conflicts += 1,
            Err(e) => {
                w.failed += 1;
                tracing::warn!(
                    "cannot write status of {} {name}: {e}",
                    K::kind(&Default::default())
                );
            }
        }
    }
}

/// The route's parents with ours replaced by `mine`; `None` when there is nothing of ours to
/// write or remove.
fn merge_parents<P: Serialize>(
    current: Option<&Vec<P>>,
    mine: Option<&Vec<P>>,
    ours: &str,
) -> Option<Value> {
    let current: Vec<Value> = current
        .into_iter()
        .flatten()
        .map(|p| serde_json::to_value(p).unwrap_or_default())
        .collect();
    let is_ours = |p: &Value| p.get("controllerName").and_then(|c| c.as_str()) == Some(ours);
    if mine.is_none() && !current.iter().any(is_ours) {
        return None;
    }
    let mut parents: Vec<Value> = current.into_iter().filter(|p| !is_ours(p)).collect();
    parents.extend(
        mine.into_iter()
            .flatten()
            .map(|p| serde_json::to_value(p).unwrap_or_default()),
    );
    Some(json!({ "parents": parents }))
}
