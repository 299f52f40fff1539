//! Writes computed status back to the API, minimally and without fighting other controllers.
//!
//! - Only differences are written: the new status is compared with what the object carries
//!   (conditions keep their lastTransitionTime while unchanged, so equal means equal).
//! - Shared status lists (route `parents`, policy `ancestors`) keep other controllers'
//!   entries as they are; only the entries with our controllerName are replaced.
//! - Every write is a merge patch carrying the resourceVersion that was read, so a concurrent
//!   change makes it fail with a conflict instead of overwriting; the change that caused the
//!   conflict triggers the next reconcile, which writes again.
//!
//! Every kind of the registry with a [`StatusShape`] other than `None` is written; nothing here
//! names a kind.

use super::source::api_in;
use futures_util::future::BoxFuture;
use futures_util::stream::{self, StreamExt};
use gatehouse_translate::kinds::{Kind, KindVisitor, StatusShape, for_each_kind};
use gatehouse_translate::{Input, Status, stamp_status};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

/// Status patches in flight at once. The API server's default limit of mutating requests in
/// flight is 200 for all clients together; this leaves most of it to everyone else.
const PATCHES_IN_FLIGHT: usize = 32;

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

enum Outcome {
    Patched,
    Conflict,
    Failed,
}

impl StatusWriter {
    pub fn new(client: Client, controller_name: impl Into<String>) -> Self {
        StatusWriter {
            client,
            controller_name: controller_name.into(),
        }
    }

    /// The status the objects in `input` carry now, as a [`Status`].
    pub fn current(input: &Input) -> Status {
        struct Carried<'a>(&'a Input, Status);
        impl KindVisitor for Carried<'_> {
            fn visit<K: Kind>(&mut self) {
                for o in K::of(self.0) {
                    o.carried_status(&mut self.1);
                }
            }
        }
        let mut carried = Carried(input, Status::default());
        for_each_kind(&mut carried);
        carried.1
    }

    /// Stamp `status` against what the objects carry and write what differs.
    pub async fn write(&self, input: &Input, mut status: Status) -> Written {
        stamp_status(&mut status, &Self::current(input), Timestamp::now());
        let mut plan = Plan {
            input,
            status: &status,
            ours: &self.controller_name,
            client: &self.client,
            patches: Vec::new(),
            unchanged: 0,
        };
        for_each_kind(&mut plan);
        let mut w = Written {
            unchanged: plan.unchanged,
            ..Written::default()
        };
        // Concurrently, but bounded: one after another, a burst of 1000 new routes took
        // seconds of round trips before the last one said Accepted; unbounded, it would open a
        // connection per object and crowd the API server's in-flight limit.
        let mut outcomes = stream::iter(plan.patches).buffer_unordered(PATCHES_IN_FLIGHT);
        while let Some(outcome) = outcomes.next().await {
            match outcome {
                Outcome::Patched => w.patched += 1,
                Outcome::Conflict => w.conflicts += 1,
                Outcome::Failed => w.failed += 1,
            }
        }
        w
    }
}

/// The patches one write sends, one per object whose status differs.
struct Plan<'a> {
    input: &'a Input,
    status: &'a Status,
    ours: &'a str,
    client: &'a Client,
    patches: Vec<BoxFuture<'static, Outcome>>,
    unchanged: usize,
}

impl KindVisitor for Plan<'_> {
    fn visit<K: Kind>(&mut self) {
        if K::STATUS == StatusShape::None {
            return;
        }
        for object in K::of(self.input) {
            let carried = serde_json::to_value(object)
                .ok()
                .and_then(|mut v| v.get_mut("status").map(Value::take))
                .unwrap_or(Value::Null);
            let Some(new) = new_status(
                K::STATUS,
                &carried,
                object.computed_status(self.status),
                self.ours,
            ) else {
                continue;
            };
            if new == carried {
                self.unchanged += 1;
                continue;
            }
            let meta = object.meta();
            let name = meta.name.clone().unwrap_or_default();
            let api = api_in::<K>(self.client, meta.namespace.as_deref().unwrap_or("default"));
            let body = json!({
                "metadata": { "resourceVersion": meta.resource_version },
                "status": new,
            });
            self.patches.push(Box::pin(async move {
                match api
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&body))
                    .await
                {
                    Ok(_) => Outcome::Patched,
                    Err(kube::Error::Api(e)) if e.code == 409 => Outcome::Conflict,
                    Err(e) => {
                        tracing::warn!("cannot write status of {} {name}: {e}", K::kind_name());
                        Outcome::Failed
                    }
                }
            }));
        }
    }
}

/// The status to write given what the object carries and our part of it; `None` when there is
/// nothing of ours to write or remove.
fn new_status(
    shape: StatusShape,
    carried: &Value,
    ours: Option<Value>,
    controller: &str,
) -> Option<Value> {
    match shape {
        StatusShape::None => None,
        StatusShape::Whole => ours,
        StatusShape::Shared(field) => {
            let current = carried.get(field).and_then(Value::as_array);
            let is_ours =
                |e: &&Value| e.get("controllerName").and_then(Value::as_str) == Some(controller);
            let had_ours = current.is_some_and(|c| c.iter().any(|e| is_ours(&e)));
            if ours.is_none() && !had_ours {
                return None;
            }
            let mut entries: Vec<Value> = current
                .into_iter()
                .flatten()
                .filter(|e| !is_ours(e))
                .cloned()
                .collect();
            if let Some(Value::Array(mine)) = ours {
                entries.extend(mine);
            }
            Some(json!({ field: entries }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_lists_keep_other_controllers_entries() {
        let carried = json!({"parents": [
            {"controllerName": "other.io/c", "parentRef": {"name": "a"}},
            {"controllerName": "me.io/c", "parentRef": {"name": "old"}},
        ]});
        let ours = json!([{"controllerName": "me.io/c", "parentRef": {"name": "new"}}]);
        let new = new_status(
            StatusShape::Shared("parents"),
            &carried,
            Some(ours),
            "me.io/c",
        );
        assert_eq!(
            new,
            Some(json!({"parents": [
                {"controllerName": "other.io/c", "parentRef": {"name": "a"}},
                {"controllerName": "me.io/c", "parentRef": {"name": "new"}},
            ]}))
        );
    }

    #[test]
    fn our_stale_entries_are_removed_and_foreign_objects_left_alone() {
        let carried = json!({"parents": [{"controllerName": "me.io/c"}]});
        assert_eq!(
            new_status(StatusShape::Shared("parents"), &carried, None, "me.io/c"),
            Some(json!({"parents": []}))
        );
        let foreign = json!({"parents": [{"controllerName": "other.io/c"}]});
        assert_eq!(
            new_status(StatusShape::Shared("parents"), &foreign, None, "me.io/c"),
            None
        );
        assert_eq!(
            new_status(StatusShape::Whole, &Value::Null, None, "me.io/c"),
            None
        );
    }
}
