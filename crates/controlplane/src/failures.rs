//! Failures by key (a Gateway whose data-plane objects were refused, a Service port that could
//! not be added), published on a `watch` channel that wakes the reconcile loop.

use std::collections::BTreeMap;
use tokio::sync::watch;

/// Replaces the failures on `channel`, waking its receivers only when the set of keys changed.
/// A new error text for the same keys is stored and shows in the next pass's status. An error
/// that reads differently every time (a request id, a time) would otherwise wake the loop into
/// another apply at once, around the retry's backoff.
pub(crate) fn replace<K: Ord>(
    channel: &watch::Sender<BTreeMap<K, String>>,
    failures: BTreeMap<K, String>,
) {
    channel.send_if_modified(|current| {
        let changed = !current.keys().eq(failures.keys());
        *current = failures;
        changed
    });
}
