//! Writes computed status back to the API, minimally, off the reconcile loop, and without
//! fighting other controllers or itself.
//!
//! - Only differences are written: the new status is compared with what the object carries
//!   (conditions keep their lastTransitionTime while unchanged, so equal means equal).
//! - Shared status lists (route `parents`, policy `ancestors`) keep other controllers'
//!   entries as they are; only the entries with our controllerName are replaced.
//! - Every write is a merge patch carrying the resourceVersion that was read, so a concurrent
//!   change makes it fail with a conflict instead of overwriting; the change that caused the
//!   conflict triggers the next reconcile, which writes again.
//! - Patches run on a task of their own, [`PATCHES_IN_FLIGHT`] at a time, so a burst of new
//!   routes never holds the reconcile loop on API round trips. Per object the newest status
//!   wins: a patch not yet sent is replaced by a newer one, and at most one per object is in
//!   flight.
//! - A snapshot that still shows the resourceVersion one of our own patches carried predates
//!   that patch: its object is left alone, because the watch event of our write is on its way
//!   and triggers the reconcile that sees the object as it is now. Patching from the stale copy
//!   would only earn a conflict (this is what made concurrent writes conflict by the hundred).
//! - A write that fails for another reason (the API server unreachable) is forgotten: the next
//!   reconcile writes that object again (as before the writer had a task of its own).
//!
//! Every kind of the registry with a [`StatusShape`] other than `None` is written; nothing here
//! names a kind.

use super::source::api_in;
use crate::metrics::ResultLabel;
use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use gatehouse_translate::kinds::{Kind, KindVisitor, StatusShape, for_each_kind};
use gatehouse_translate::{Input, Status, stamp_status};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Patch, PatchParams};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use tokio::sync::Notify;

/// Status patches in flight at once. The API server's default limit of mutating requests in
/// flight is 200 for all clients together; this leaves most of it to everyone else.
pub const PATCHES_IN_FLIGHT: usize = 32;

/// One object's status: kind, namespace, name.
type WriteKey = (String, String, String);

pub struct StatusWriter {
    client: Client,
    controller_name: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

/// What one `write` did; the patches themselves are counted by result in the metric
/// `gatehouse_status_writes_total` as they finish.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// Patches queued (a queued patch of the same object not yet sent was replaced).
    pub queued: usize,
    /// Objects left alone because the snapshot predates our own patch of them.
    pub stale: usize,
}

enum Outcome {
    Patched,
    Conflict,
    Failed,
}

struct Job {
    resource_version: Option<String>,
    patch: BoxFuture<'static, Outcome>,
}

#[derive(Default)]
struct Queue {
    /// Patches not sent yet, newest per object. Ordered so that writes go out in a stable
    /// order (kinds in registry order would be nicer; by kind name is deterministic enough).
    pending: BTreeMap<WriteKey, Job>,
    in_flight: HashSet<WriteKey>,
    /// The resourceVersion our last patch of each object carried (sent, in flight or done).
    sent: HashMap<WriteKey, Option<String>>,
}

struct Shared {
    queue: Mutex<Queue>,
    work: Notify,
    /// Set once the reconcile loop attaches its metrics.
    counts: OnceLock<Family<ResultLabel, Counter>>,
}

impl Drop for StatusWriter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StatusWriter {
    /// Starts the writer's task: call within a Tokio runtime.
    pub fn new(client: Client, controller_name: impl Into<String>) -> Self {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            work: Notify::new(),
            counts: OnceLock::new(),
        });
        let task = tokio::spawn(send_patches(shared.clone()));
        StatusWriter {
            client,
            controller_name: controller_name.into(),
            shared,
            task,
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

    /// Stamp `status` against what the objects carry and queue a patch of every object whose
    /// status differs. Returns at once; the patches go out on the writer's task.
    pub fn write(&self, input: &Input, mut status: Status) -> Written {
        stamp_status(&mut status, &Self::current(input), Timestamp::now());
        let mut plan = Plan {
            input,
            status: &status,
            ours: &self.controller_name,
            client: &self.client,
            patches: Vec::new(),
            unchanged: Vec::new(),
            seen: HashMap::new(),
        };
        for_each_kind(&mut plan);
        let mut w = Written::default();
        let mut q = self.shared.queue.lock().expect("never poisoned");
        let Queue {
            pending,
            in_flight,
            sent,
        } = &mut *q;
        for key in &plan.unchanged {
            pending.remove(key);
        }
        for (key, job) in plan.patches {
            if sent.get(&key) == Some(&job.resource_version) {
                // Our own patch of this very version is in flight or done: wait for its event.
                pending.remove(&key);
                w.stale += 1;
                continue;
            }
            pending.insert(key, job);
            w.queued += 1;
        }
        // Forget what can no longer match a snapshot: objects gone, or seen at another version.
        sent.retain(|k, rv| in_flight.contains(k) || plan.seen.get(k) == Some(rv));
        drop(q);
        if w.queued > 0 {
            self.shared.work.notify_one();
        }
        w
    }

    /// Counts every finished patch in `counts` by result (patched, conflict, failed).
    pub fn count_in(&self, counts: Family<ResultLabel, Counter>) {
        let _ = self.shared.counts.set(counts);
    }

    /// Drops the patches not sent yet (this replica stopped being the leader).
    pub fn forget_pending(&self) {
        let mut q = self.shared.queue.lock().expect("never poisoned");
        q.pending.clear();
    }
}

/// The writer's task: keeps up to [`PATCHES_IN_FLIGHT`] patches running, one per object.
async fn send_patches(shared: Arc<Shared>) {
    let mut running = FuturesUnordered::new();
    loop {
        {
            let mut q = shared.queue.lock().expect("never poisoned");
            while running.len() < PATCHES_IN_FLIGHT {
                let Some(key) = q
                    .pending
                    .keys()
                    .find(|k| !q.in_flight.contains(*k))
                    .cloned()
                else {
                    break;
                };
                let job = q.pending.remove(&key).expect("just found");
                q.in_flight.insert(key.clone());
                q.sent.insert(key.clone(), job.resource_version);
                let patch = job.patch;
                running.push(async move { (key, patch.await) });
            }
        }
        tokio::select! {
            Some((key, outcome)) = running.next(), if !running.is_empty() => {
                let mut q = shared.queue.lock().expect("never poisoned");
                q.in_flight.remove(&key);
                let result = match outcome {
                    Outcome::Patched => "patched",
                    Outcome::Conflict => "conflict",
                    Outcome::Failed => "failed",
                };
                if !matches!(outcome, Outcome::Patched) {
                    // Nothing of ours is on its way: the next snapshot must write again.
                    q.sent.remove(&key);
                }
                drop(q);
                if let Some(counts) = shared.counts.get() {
                    counts.get_or_create(&ResultLabel { result }).inc();
                }
            }
            _ = shared.work.notified() => {}
        }
    }
}

/// The patches one write would send, one per object whose status differs.
struct Plan<'a> {
    input: &'a Input,
    status: &'a Status,
    ours: &'a str,
    client: &'a Client,
    patches: Vec<(WriteKey, Job)>,
    unchanged: Vec<WriteKey>,
    /// Every object with a status, and the version the snapshot shows.
    seen: HashMap<WriteKey, Option<String>>,
}

impl KindVisitor for Plan<'_> {
    fn visit<K: Kind>(&mut self) {
        if K::STATUS == StatusShape::None {
            return;
        }
        for object in K::of(self.input) {
            let meta = object.meta();
            let name = meta.name.clone().unwrap_or_default();
            let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
            let key: WriteKey = (K::kind_name(), namespace, name);
            let resource_version = meta.resource_version.clone();
            self.seen.insert(key.clone(), resource_version.clone());
            let carried = object.status_json();
            let Some(new) = new_status(
                K::STATUS,
                &carried,
                object.computed_status(self.status),
                self.ours,
            ) else {
                continue;
            };
            if new == carried {
                self.unchanged.push(key);
                continue;
            }
            let api = api_in::<K>(self.client, &key.1);
            let body = json!({
                "metadata": { "resourceVersion": resource_version },
                "status": new,
            });
            let name = key.2.clone();
            let patch = Box::pin(async move {
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
            });
            self.patches.push((
                key,
                Job {
                    resource_version,
                    patch,
                },
            ));
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

    /// What the writer compares is the object's `status` exactly as the whole object
    /// serialises it, for every kind with a status (and Null for one without).
    #[test]
    fn status_json_is_the_status_of_the_serialised_object() {
        struct Check(Input);
        impl KindVisitor for Check {
            fn visit<K: Kind>(&mut self) {
                for object in K::of(&self.0) {
                    let whole = serde_json::to_value(&**object).unwrap();
                    let status = whole.get("status").cloned().unwrap_or(Value::Null);
                    assert_eq!(object.status_json(), status, "{}", K::kind_name());
                }
            }
        }
        let manifests = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: a}
spec: {gatewayClassName: c, listeners: [{name: h, port: 80, protocol: HTTP}]}
status:
  conditions: [{type: Accepted, status: "True", reason: Accepted, message: ok, lastTransitionTime: "2026-11-27T00:00:00Z"}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: a}
spec: {parentRefs: [{name: gw}]}
status:
  parents: [{controllerName: other.io/c, parentRef: {name: gw}, conditions: []}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: no-status, namespace: a}
spec: {parentRefs: [{name: gw}]}
---
apiVersion: v1
kind: Service
metadata: {name: s, namespace: a}
spec: {ports: [{port: 80}]}
"#;
        let input = gatehouse_testkit::manifests::input(manifests);
        assert_eq!(input.http_routes.len(), 2);
        for_each_kind(&mut Check(input));
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
