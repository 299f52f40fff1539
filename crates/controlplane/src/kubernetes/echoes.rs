//! Our own status writes, told apart from everyone else's changes.
//!
//! Every status PATCH the writer sends comes back as a watch event of the object it patched.
//! Before this, each such echo started a pass: a full snapshot and translation that found
//! nothing new (the status is already what the pass before computed) and, while it ran, held
//! back the change that came next. In the control-plane benchmark one route's creation costs
//! one pass and two writes (the route's status, the Gateway's attachedRoutes), so the echoes
//! doubled the passes and a create arriving during an echo's pass waited for it.
//!
//! An event is an echo when its resourceVersion is the one our PATCH response carried. The
//! watch event and the response race (the API server sends both at once), so an event for an
//! object with a PATCH in flight is held until the response says whose it was. Every other
//! event starts a pass as before, and so does an echo that a pass is waiting for: when a pass
//! computed a new status from a snapshot that predates our write, the writer leaves the object
//! alone until the echo is in the store (see `status.rs`) and asks for the pass here.
//!
//! What is held is bounded by the PATCH's own timeout (`status::PATCH_TIMEOUT`): a failed or
//! timed-out PATCH releases the event with a pass.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::api::ObjectMeta;
use tokio::sync::mpsc;

/// One object: kind, namespace (`default` for cluster-scoped kinds, as the writer keys them),
/// name.
pub type ObjectRef = (String, String, String);

/// Owned [`gatehouse_translate::key_of`]: the writer looks objects up by its borrowed form.
pub fn object_ref(kind: String, meta: &ObjectMeta) -> ObjectRef {
    let (namespace, name) = gatehouse_translate::key_of(meta);
    (kind, namespace.to_owned(), name.to_owned())
}

/// Shared by the source's watches and the status writer.
#[derive(Debug)]
pub struct Echoes {
    entries: Mutex<HashMap<ObjectRef, Entry>>,
    /// The source's change channel: starts a pass.
    wake: mpsc::Sender<()>,
}

/// What is known about our latest write of one object.
#[derive(Debug, Default)]
struct Entry {
    /// The PATCH has not answered yet.
    in_flight: bool,
    /// The resourceVersion our PATCH produced, once it answered.
    version: Option<String>,
    /// An event that arrived while the PATCH was in flight, held until it answers.
    held: Option<String>,
    /// More than one event arrived while in flight: at least one is not ours.
    foreign: bool,
    /// The echo has arrived (and started no pass).
    arrived: bool,
    /// A pass wants to see the object once the echo is in the store.
    awaited: bool,
}

impl Echoes {
    pub fn new(wake: mpsc::Sender<()>) -> Echoes {
        Echoes {
            entries: Mutex::new(HashMap::new()),
            wake,
        }
    }

    fn wake(&self) {
        // Full: a pass is pending already, and it will see the store as it is then.
        let _ = self.wake.try_send(());
    }

    /// A PATCH of `key` is about to be sent.
    pub fn sending(&self, key: &ObjectRef) {
        self.lock().insert(
            key.clone(),
            Entry {
                in_flight: true,
                ..Entry::default()
            },
        );
    }

    /// The PATCH of `key` answered: `Some(version)` when it was applied.
    pub fn answered(&self, key: &ObjectRef, version: Option<String>) {
        let mut entries = self.lock();
        let Some(entry) = entries.get_mut(key) else {
            return;
        };
        entry.in_flight = false;
        let held = entry.held.take();
        let (Some(version), false) = (version, entry.foreign) else {
            // Not applied (no echo is coming), or someone else changed the object too.
            let pass_wanted = held.is_some() || entry.awaited || entry.foreign;
            entries.remove(key);
            drop(entries);
            if pass_wanted {
                self.wake();
            }
            return;
        };
        match held {
            None => entry.version = Some(version),
            Some(h) if h == version && !entry.awaited => {
                entry.version = Some(version);
                entry.arrived = true;
            }
            Some(_) => {
                // The held event was another change, or a pass awaits this very echo.
                entries.remove(key);
                drop(entries);
                self.wake();
            }
        }
    }

    /// A pass computed a status for `key` from a snapshot older than our write, and left it
    /// unwritten: it needs another pass once the echo is in the store.
    pub fn awaited(&self, key: &ObjectRef) {
        let mut entries = self.lock();
        let Some(entry) = entries.get_mut(key) else {
            // Our write failed, or another change of the object came: a pass is on its way.
            return;
        };
        if entry.arrived {
            entries.remove(key);
            drop(entries);
            self.wake();
        } else {
            entry.awaited = true;
        }
    }

    /// The watch saw `key` at `version`. True when the event is our own write's echo and
    /// nobody waits for it, or when it is held until our PATCH answers: no pass now.
    pub fn quiet(&self, key: &ObjectRef, version: Option<&str>) -> bool {
        let mut entries = self.lock();
        let Some(entry) = entries.get_mut(key) else {
            return false;
        };
        if entry.in_flight {
            match (&entry.held, version) {
                (None, Some(v)) => entry.held = Some(v.to_owned()),
                _ => entry.foreign = true,
            }
            return true;
        }
        if version.is_some() && entry.version.as_deref() == version && !entry.arrived {
            if entry.awaited {
                entries.remove(key);
                return false;
            }
            entry.arrived = true;
            return true;
        }
        // Another version: our echo has passed; this is someone else's change.
        entries.remove(key);
        false
    }

    /// `key` was deleted: nothing of ours is coming for it.
    pub fn deleted(&self, key: &ObjectRef) {
        self.lock().remove(key);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectRef, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn echoes() -> (Echoes, mpsc::Receiver<()>) {
        let (tx, rx) = mpsc::channel(1);
        (Echoes::new(tx), rx)
    }

    fn key(name: &str) -> ObjectRef {
        ("HTTPRoute".into(), "ns".into(), name.into())
    }

    fn woken(rx: &mut mpsc::Receiver<()>) -> bool {
        rx.try_recv().is_ok()
    }

    #[test]
    fn an_echo_after_the_answer_starts_no_pass() {
        let (e, mut rx) = echoes();
        e.sending(&key("r"));
        e.answered(&key("r"), Some("7".into()));
        assert!(e.quiet(&key("r"), Some("7")));
        assert!(!woken(&mut rx));
        // The next change of the object is someone else's, and forgets the entry.
        assert!(!e.quiet(&key("r"), Some("8")));
        assert_eq!(e.len(), 0);
    }

    #[test]
    fn an_echo_before_the_answer_is_held_and_then_dropped() {
        let (e, mut rx) = echoes();
        e.sending(&key("r"));
        assert!(
            e.quiet(&key("r"), Some("7")),
            "held while the PATCH is in flight"
        );
        e.answered(&key("r"), Some("7".into()));
        assert!(!woken(&mut rx));
    }

    #[test]
    fn a_change_held_during_the_patch_is_released_with_a_pass() {
        let (e, mut rx) = echoes();
        // Someone else's change arrives while our PATCH is in flight (ours then conflicts).
        e.sending(&key("r"));
        assert!(e.quiet(&key("r"), Some("6")));
        e.answered(&key("r"), None);
        assert!(woken(&mut rx));
        assert_eq!(e.len(), 0);

        // Two events while in flight: one at least is not ours.
        e.sending(&key("r"));
        assert!(e.quiet(&key("r"), Some("7")));
        assert!(e.quiet(&key("r"), Some("8")));
        e.answered(&key("r"), Some("7".into()));
        assert!(woken(&mut rx));

        // One event, not the version our PATCH made.
        e.sending(&key("r"));
        assert!(e.quiet(&key("r"), Some("9")));
        e.answered(&key("r"), Some("10".into()));
        assert!(woken(&mut rx));
    }

    #[test]
    fn an_awaited_echo_starts_a_pass_whenever_it_comes() {
        let (e, mut rx) = echoes();
        // Awaited before the answer, echo after it.
        e.sending(&key("a"));
        e.awaited(&key("a"));
        e.answered(&key("a"), Some("3".into()));
        assert!(!woken(&mut rx));
        assert!(!e.quiet(&key("a"), Some("3")));

        // Echo held in flight, awaited, then the answer.
        e.sending(&key("b"));
        assert!(e.quiet(&key("b"), Some("4")));
        e.awaited(&key("b"));
        e.answered(&key("b"), Some("4".into()));
        assert!(woken(&mut rx));

        // The echo already arrived (quietly) when the pass asks: woken at once.
        e.sending(&key("c"));
        e.answered(&key("c"), Some("5".into()));
        assert!(e.quiet(&key("c"), Some("5")));
        assert!(!woken(&mut rx));
        e.awaited(&key("c"));
        assert!(woken(&mut rx));
        assert_eq!(e.len(), 0);
    }

    #[test]
    fn a_failed_patch_that_a_pass_awaits_starts_one() {
        let (e, mut rx) = echoes();
        e.sending(&key("r"));
        e.awaited(&key("r"));
        e.answered(&key("r"), None);
        assert!(woken(&mut rx));
        // Nobody waiting, nothing held: no pass.
        e.sending(&key("s"));
        e.answered(&key("s"), None);
        assert!(!woken(&mut rx));
        assert_eq!(e.len(), 0);
    }

    #[test]
    fn objects_we_never_wrote_always_start_a_pass() {
        let (e, _rx) = echoes();
        assert!(!e.quiet(&key("r"), Some("1")));
        e.sending(&key("r"));
        e.deleted(&key("r"));
        assert!(!e.quiet(&key("r"), Some("2")));
    }
}
