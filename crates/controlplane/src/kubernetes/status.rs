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
//!   The same holds when the stale copy already carries what the pass computed: our patch on
//!   its way carries an older computation and will replace it (a Gateway's Programmed=False
//!   Pending, written just before its data plane acknowledged), so that object, too, is
//!   compared again in the pass its echo starts, not taken as written.
//! - A write that fails for another reason (the API server unreachable) is forgotten: the next
//!   reconcile writes that object again (as before the writer had a task of its own).
//! - An object is compared only when it may need a write: an object found with nothing to
//!   write is settled as the very copy the store holds (by address, kept alive), and stays
//!   settled while the store holds that copy and its computed status (compared typed, with
//!   the previous pass's) does not change. Comparing means serialising what it carries and
//!   what we would write, and doing that for every object on every pass was half of the
//!   controller's CPU at 3000 routes. Telling settled objects apart takes no allocation: no
//!   key is built for them, and a pass that reused the last translation hands over the same
//!   status (`Arc`), so their computed status is not even compared.
//! - Every write is reported to [`Echoes`], so that its own watch event starts no pass; a
//!   write left alone because the snapshot predates it asks there for the pass that follows
//!   its echo.
//!
//! Every kind of the registry with a [`StatusShape`] other than `None` is written; nothing here
//! names a kind.

use super::echoes::{Echoes, ObjectRef, object_ref};
use super::source::api_in;
use crate::metrics::ResultLabel;
use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use gatehouse_translate::kinds::{Kind, KindVisitor, StatusShape, for_each_kind};
use gatehouse_translate::{ChangedStatus, Input, Status, stamp_status};
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

/// A PATCH that has not answered by then counts as failed. Watch events of the object wait for
/// the answer (see [`Echoes`]), so it must come.
pub const PATCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// One object's status: kind, namespace, name.
type WriteKey = ObjectRef;

pub struct StatusWriter {
    client: Client,
    controller_name: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
    /// The status the last write was given, as translate computed it (not stamped).
    computed: Arc<Status>,
    /// Objects found with nothing to write, by the address of the store's copy, which the
    /// entry keeps alive (so the address cannot be reused by another object while it is
    /// here). A store replaces an object's `Arc` with every new version, so an object found
    /// here is the very version that was settled: no key is built and no version compared.
    settled: Settled,
}

/// See [`StatusWriter::settled`]: rebuilt by every write from the objects it settled, so
/// versions replaced or deleted since drop out with it.
type Settled = HashMap<usize, Arc<dyn std::any::Any + Send + Sync>>;

/// What one `write` did; the patches themselves are counted by result in the metric
/// `gatehouse_status_writes_total` as they finish.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// Objects whose status was compared with what they carry; the others were settled.
    pub compared: usize,
    /// Patches queued (a queued patch of the same object not yet sent was replaced).
    pub queued: usize,
    /// Objects left alone because the snapshot predates our own patch of them (whether or
    /// not they would have been written).
    pub stale: usize,
}

enum Outcome {
    /// Applied; the object's new resourceVersion.
    Patched(Option<String>),
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
    echoes: Arc<Echoes>,
}

impl Drop for StatusWriter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StatusWriter {
    /// Starts the writer's task: call within a Tokio runtime. `echoes` is the source's
    /// ([`super::KubeSource::echoes`]).
    pub fn new(client: Client, controller_name: impl Into<String>, echoes: Arc<Echoes>) -> Self {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            work: Notify::new(),
            counts: OnceLock::new(),
            echoes,
        });
        let task = tokio::spawn(send_patches(shared.clone()));
        StatusWriter {
            client,
            controller_name: controller_name.into(),
            shared,
            task,
            computed: Arc::default(),
            settled: HashMap::new(),
        }
    }

    /// Queue a patch of every object whose status differs from what it carries (each stamped
    /// against it first). Returns at once; the patches go out on the writer's task.
    pub fn write(&mut self, input: &Input, status: Arc<Status>) -> Written {
        let previous = std::mem::replace(&mut self.computed, status);
        // Keys whose resourceVersion decides whether our own patch is still on its way.
        let sent_keys: HashSet<WriteKey> = {
            let q = self.shared.queue.lock().expect("never poisoned");
            q.sent.keys().cloned().collect()
        };
        let sent_lookup: HashSet<(&str, &str, &str)> = sent_keys
            .iter()
            .map(|(k, ns, n)| (k.as_str(), ns.as_str(), n.as_str()))
            .collect();
        let mut settled = Settled::with_capacity(self.settled.len());
        // The same status as last time (a pass that reused its translation): no object's
        // computed status can have changed, and none is looked for.
        let changed = (!Arc::ptr_eq(&self.computed, &previous))
            .then(|| self.computed.changed_since(&previous));
        let mut plan = Plan {
            input,
            status: &self.computed,
            changed: changed.as_ref(),
            was_settled: &mut self.settled,
            settled: &mut settled,
            sent_lookup: &sent_lookup,
            now: Timestamp::now(),
            ours: &self.controller_name,
            client: &self.client,
            compared: Vec::new(),
            seen: HashMap::new(),
        };
        for_each_kind(&mut plan);
        let Plan { compared, seen, .. } = plan;
        self.settled = settled;
        let mut w = Written {
            compared: compared.len(),
            ..Written::default()
        };
        let mut q = self.shared.queue.lock().expect("never poisoned");
        let Queue {
            pending,
            in_flight,
            sent,
        } = &mut *q;
        for Compared {
            key,
            resource_version,
            found,
        } in compared
        {
            if sent.get(&key) == Some(&resource_version) {
                // Our own patch of this very version is in flight or done: the snapshot
                // predates it. Whether the object needs a write is decided in the pass its
                // echo starts, not from this copy, also when the copy carries what we computed
                // (our patch may carry an older computation that is about to replace it: a
                // Gateway whose data plane acknowledged while its Pending status was on its
                // way). Left alone, unsettled, and that pass asked for.
                pending.remove(&key);
                self.shared.echoes.awaited(&key);
                if let Found::Settled(address) = found {
                    self.settled.remove(&address);
                }
                w.stale += 1;
                continue;
            }
            match found {
                Found::Settled(_) => {
                    pending.remove(&key);
                }
                Found::Differs(patch) => {
                    pending.insert(
                        key,
                        Job {
                            resource_version,
                            patch,
                        },
                    );
                    w.queued += 1;
                }
            }
        }
        // Forget what can no longer match a snapshot: objects gone, or seen at another version.
        sent.retain(|k, rv| in_flight.contains(k) || seen.get(k) == Some(rv));
        drop(q);
        if w.queued > 0 {
            self.shared.work.notify_one();
        }
        w
    }

    /// Drops the patches not sent yet (this replica stopped being the leader), and what it
    /// knew of the objects: a new term compares every object again.
    pub fn forget_pending(&mut self) {
        let mut q = self.shared.queue.lock().expect("never poisoned");
        q.pending.clear();
        drop(q);
        self.settled.clear();
        self.computed = Arc::default();
    }

    /// Counts every finished patch in `counts` by result (patched, conflict, failed).
    pub fn count_in(&self, counts: Family<ResultLabel, Counter>) {
        let _ = self.shared.counts.set(counts);
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
                shared.echoes.sending(&key);
                let patch = job.patch;
                running.push(async move { (key, patch.await) });
            }
        }
        tokio::select! {
            Some((key, outcome)) = running.next(), if !running.is_empty() => {
                let mut q = shared.queue.lock().expect("never poisoned");
                q.in_flight.remove(&key);
                let (result, version) = match outcome {
                    Outcome::Patched(version) => ("patched", version),
                    Outcome::Conflict => ("conflict", None),
                    Outcome::Failed => ("failed", None),
                };
                shared.echoes.answered(&key, version.clone());
                if version.is_none() {
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
    /// This pass's computed status (not stamped).
    status: &'a Status,
    /// The objects whose computed status changed since the previous pass's (`None`: the
    /// previous pass's status itself).
    changed: Option<&'a ChangedStatus<'a>>,
    /// The objects the last write settled, and those this one settles.
    was_settled: &'a mut Settled,
    settled: &'a mut Settled,
    /// The objects with a patch of ours sent (borrowed keys: looked up without allocating).
    sent_lookup: &'a HashSet<(&'a str, &'a str, &'a str)>,
    now: Timestamp,
    ours: &'a str,
    client: &'a Client,
    /// Every object compared (the others were settled before), with what was found.
    compared: Vec<Compared>,
    /// The objects of `sent_lookup` still there, and the version the snapshot shows.
    seen: HashMap<WriteKey, Option<String>>,
}

/// One object a write compared with what it carries.
struct Compared {
    key: WriteKey,
    /// The version the snapshot shows.
    resource_version: Option<String>,
    found: Found,
}

enum Found {
    /// Nothing to write: settled, at this address in the writer's map.
    Settled(usize),
    /// The patch that writes the difference.
    Differs(BoxFuture<'static, Outcome>),
}

impl KindVisitor for Plan<'_> {
    fn visit<K: Kind>(&mut self) {
        if K::STATUS == StatusShape::None {
            return;
        }
        let kind = K::kind_name();
        for object in K::of(self.input) {
            let meta = object.meta();
            let address = Arc::as_ptr(object) as *const () as usize;
            if !self.sent_lookup.is_empty() {
                let (namespace, name) = gatehouse_translate::key_of(meta);
                if self.sent_lookup.contains(&(kind.as_str(), namespace, name)) {
                    self.seen.insert(
                        object_ref(kind.clone(), meta),
                        meta.resource_version.clone(),
                    );
                }
            }
            if self.was_settled.contains_key(&address)
                && self
                    .changed
                    .is_none_or(|changed| !object.computed_status_changed(changed))
            {
                let kept = self.was_settled.remove(&address).expect("just found");
                self.settled.insert(address, kept);
                continue;
            }
            let key: WriteKey = object_ref(kind.clone(), meta);
            let resource_version = meta.resource_version.clone();
            // This object alone: stamped against what it carries, then compared with it.
            let mut computed = Status::default();
            object.copy_computed_status(self.status, &mut computed);
            let mut carried_status = Status::default();
            object.carried_status(&mut carried_status);
            stamp_status(&mut computed, &carried_status, self.now);
            let carried = object.status_json();
            let new = new_status(
                K::STATUS,
                &carried,
                object.computed_status(&computed),
                self.ours,
            );
            // `None`: nothing of ours to write or remove.
            let Some(new) = new.filter(|new| *new != carried) else {
                let kept: Arc<dyn std::any::Any + Send + Sync> = object.clone();
                self.settled.insert(address, kept);
                self.compared.push(Compared {
                    key,
                    resource_version,
                    found: Found::Settled(address),
                });
                continue;
            };
            let api = api_in::<K>(self.client, &key.1);
            let body = json!({
                "metadata": { "resourceVersion": resource_version },
                "status": new,
            });
            let name = key.2.clone();
            let patch = Box::pin(async move {
                let (params, patch) = (PatchParams::default(), Patch::Merge(&body));
                let sent = api.patch_status(&name, &params, &patch);
                match tokio::time::timeout(PATCH_TIMEOUT, sent).await {
                    Ok(Ok(patched)) => Outcome::Patched(patched.meta().resource_version.clone()),
                    Ok(Err(kube::Error::Api(e))) if e.code == 409 => Outcome::Conflict,
                    Ok(Err(e)) => {
                        tracing::warn!("cannot write status of {} {name}: {e}", K::kind_name());
                        Outcome::Failed
                    }
                    Err(_) => {
                        tracing::warn!(
                            "cannot write status of {} {name}: no answer within {PATCH_TIMEOUT:?}",
                            K::kind_name()
                        );
                        Outcome::Failed
                    }
                }
            });
            self.compared.push(Compared {
                key,
                resource_version,
                found: Found::Differs(patch),
            });
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

    /// `input` with every object at `version`, carrying `status` as we would have written it
    /// (what the objects look like once our patches' events are in).
    fn carrying(input: &Input, status: &Status, version: &str) -> Input {
        struct Set<'a>(Input, &'a Status, &'a str);
        impl KindVisitor for Set<'_> {
            fn visit<K: Kind>(&mut self) {
                let objects: Vec<Arc<K>> = K::of(&self.0)
                    .iter()
                    .map(|o| {
                        let mut v = serde_json::to_value(&**o).unwrap();
                        v["metadata"]["resourceVersion"] = json!(self.2);
                        if let Some(ours) = o.computed_status(self.1) {
                            v["status"] = match K::STATUS {
                                StatusShape::Shared(field) => json!({ field: ours }),
                                _ => ours,
                            };
                        }
                        Arc::new(serde_json::from_value(v).unwrap())
                    })
                    .collect();
                *K::of_mut(&mut self.0) = objects;
            }
        }
        let mut set = Set(input.clone(), status, version);
        for_each_kind(&mut set);
        set.0
    }

    /// Our class and a Gateway of it, controller `me.io/c`: the writer tests' setting.
    const CLASS_AND_GATEWAY: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: c}
spec: {controllerName: me.io/c}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: a}
spec: {gatewayClassName: c, listeners: [{name: h, port: 80, protocol: HTTP}]}
"#;

    /// An HTTPRoute `name` on that Gateway, with a hostname of its own.
    fn route(name: &str) -> String {
        format!(
            "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: a}}\nspec: {{parentRefs: [{{name: gw}}], hostnames: [{name}.example.com]}}\n"
        )
    }

    fn options() -> gatehouse_translate::Options {
        gatehouse_translate::Options {
            controller_name: "me.io/c".into(),
            ..gatehouse_translate::Options::default()
        }
    }

    /// An object found with its status written is not serialised and compared again until
    /// its resourceVersion or its computed status changes.
    #[tokio::test]
    async fn settled_objects_are_compared_again_only_when_they_or_their_status_change() {
        let manifests = format!("{CLASS_AND_GATEWAY}{}{}", route("r1"), route("r2"));
        let input = carrying(
            &gatehouse_testkit::manifests::input(&manifests),
            &Status::default(),
            "1",
        );
        let status = gatehouse_translate::translate(&input, &options()).status;
        assert_eq!(status.routes.len(), 2);
        // Nothing listens here: the patches fail, which only the first write cares about.
        let client =
            Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        let (tx, _rx) = tokio::sync::mpsc::channel(1);
        let mut writer = StatusWriter::new(client, "me.io/c", Arc::new(Echoes::new(tx)));

        // Nothing written yet: all four objects compared, all four patched.
        let w = writer.write(&input, Arc::new(status.clone()));
        assert_eq!((w.compared, w.queued), (4, 4), "{w:?}");

        // Our writes are in (a new version of each): compared once more, found equal.
        let written = carrying(&input, &status, "2");
        let w = writer.write(&written, Arc::new(status.clone()));
        assert_eq!((w.compared, w.queued, w.stale), (4, 0, 0), "{w:?}");
        // Nothing changed (an equal status, computed again): nothing compared.
        let shared = Arc::new(status.clone());
        let w = writer.write(&written, Arc::clone(&shared));
        assert_eq!((w.compared, w.queued), (0, 0), "{w:?}");
        // The very same status (a pass that reused its translation): nothing compared.
        let w = writer.write(&written, Arc::clone(&shared));
        assert_eq!((w.compared, w.queued), (0, 0), "{w:?}");

        // One route at a new version (a label, say): that route alone is compared, also when
        // the status is the very same.
        let mut touched = written.clone();
        let mut r1 = (*touched.http_routes[0]).clone();
        r1.metadata.resource_version = Some("3".into());
        touched.http_routes[0] = Arc::new(r1);
        let w = writer.write(&touched, Arc::clone(&shared));
        assert_eq!((w.compared, w.queued), (1, 0), "{w:?}");
        // A copy of the same version (a relist brings new copies): compared, found equal.
        let mut relisted = touched.clone();
        relisted.http_routes[1] = Arc::new((*touched.http_routes[1]).clone());
        let w = writer.write(&relisted, Arc::clone(&shared));
        assert_eq!((w.compared, w.queued), (1, 0), "{w:?}");

        // One route's computed status changes (it is no longer ours): compared and patched.
        let mut detached = status.clone();
        let r2 = detached
            .routes
            .keys()
            .find(|k| k.key.name == "r2")
            .cloned()
            .unwrap();
        detached.routes.remove(&r2);
        let w = writer.write(&relisted, Arc::new(detached));
        assert_eq!((w.compared, w.queued), (1, 1), "{w:?}");

        // A route deleted: what was settled of it is let go with the next write.
        let mut deleted = relisted.clone();
        deleted.http_routes.remove(0);
        writer.write(&deleted, Arc::new(status.clone()));
        assert_eq!(writer.settled.len(), 3, "GatewayClass, Gateway and r2");
    }

    /// A pass whose snapshot predates our patch in flight, and finds the status it computes
    /// already carried there (the older computation is on its way to replace it), must not
    /// take the object as written: the patch's echo starts the pass that writes it again.
    /// Before, that echo started nothing, and a Gateway stayed Programmed=False Pending after
    /// its data plane had acknowledged, until some other change came.
    #[tokio::test]
    async fn a_status_found_on_a_copy_older_than_our_patch_in_flight_is_written_after_the_echo() {
        use gatehouse_testkit::eventually;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let manifests = format!("{CLASS_AND_GATEWAY}{}", route("r"));
        let plain = gatehouse_testkit::manifests::input(&manifests);
        let status = gatehouse_translate::translate(&plain, &options()).status;
        // Every object at version 1, carrying the status computed now.
        let input = carrying(&plain, &status, "1");
        let mut older = status.clone();
        let route = older.routes.keys().next().cloned().unwrap();
        older.routes.remove(&route);

        // An API server that answers the route's PATCH (with version 2) once told to.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let release = Arc::new(Notify::new());
        let server = tokio::spawn({
            let release = release.clone();
            async move {
                let (mut conn, _) = listener.accept().await.unwrap();
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = conn.read(&mut buf).await.unwrap();
                    assert!(n > 0, "the client closed before its request");
                    request.extend_from_slice(&buf[..n]);
                }
                let head = String::from_utf8_lossy(&request).to_string();
                assert!(
                    head.starts_with(
                        "PATCH /apis/gateway.networking.k8s.io/v1/namespaces/a/httproutes/r/status"
                    ),
                    "{head}"
                );
                release.notified().await;
                let body = json!({
                    "apiVersion": "gateway.networking.k8s.io/v1",
                    "kind": "HTTPRoute",
                    "metadata": {"name": "r", "namespace": "a", "resourceVersion": "2"},
                    "spec": {},
                })
                .to_string();
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                conn.write_all(response.as_bytes()).await.unwrap();
                // Held open until the client is done with it.
                let _ = conn.read(&mut buf).await;
            }
        });
        let client = Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
        let (tx, _rx) = tokio::sync::mpsc::channel(1);
        let echoes = Arc::new(Echoes::new(tx));
        let mut writer = StatusWriter::new(client, "me.io/c", echoes.clone());
        let in_flight = |writer: &StatusWriter| {
            writer
                .shared
                .queue
                .lock()
                .unwrap()
                .in_flight
                .iter()
                .any(|(kind, _, name)| kind == "HTTPRoute" && name == "r")
        };

        // A pass computes the older status (the route's entry removed): one patch, sent.
        let w = writer.write(&input, Arc::new(older));
        assert_eq!(w.queued, 1, "{w:?}");
        let limit = std::time::Duration::from_secs(5);
        eventually("the patch to be sent", limit, || in_flight(&writer)).await;

        // The next pass, from the same snapshot, computes what the object carries now.
        let w = writer.write(&input, Arc::new(status.clone()));
        assert_eq!((w.queued, w.stale), (0, 1), "{w:?}");

        // The patch lands (version 2), and its watch event arrives: it must start a pass.
        release.notify_one();
        eventually("the patch to answer", limit, || !in_flight(&writer)).await;
        let key: ObjectRef = ("HTTPRoute".into(), "a".into(), "r".into());
        assert!(
            !echoes.quiet(&key, Some("2")),
            "the echo of the older status started no pass"
        );
        server.abort();
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
