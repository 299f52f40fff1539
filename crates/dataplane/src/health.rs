//! Passive health of backend endpoints: an endpoint that keeps refusing connections is
//! ejected from its clusters' rotation for a while, so requests stop paying a failed connect
//! (and its retry) for a pod that is gone or going.
//!
//! Only failures before a request reaches the backend count (connect refused, reset or timed
//! out): they say the endpoint cannot take traffic, and nothing the application answers does.
//! [`FAILURES_TO_EJECT`] consecutive failures eject the endpoint for [`BASE_EJECTION`] times
//! the number of times it was ejected in a row (capped at [`MAX_EJECTION`]); one success
//! clears both. When every endpoint of a cluster is ejected, ejection is ignored: sending to a
//! maybe-broken endpoint beats answering 503 for sure.
//!
//! The state lives per address and outlives applies (an EndpointSlice change rebuilds the
//! cluster but must not forgive an endpoint that is still refusing). The request path reads
//! one atomic per pick while nothing is ejected; the clock is read only when something is.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Consecutive pre-request failures that eject an endpoint.
pub(crate) const FAILURES_TO_EJECT: u32 = 2;
/// The first ejection's length; later ones in a row are multiples of it.
pub(crate) const BASE_EJECTION: Duration = Duration::from_secs(5);
/// The longest ejection.
pub(crate) const MAX_EJECTION: Duration = Duration::from_secs(60);

/// Milliseconds since the first call, never 0 (0 marks "not ejected").
fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    u64::try_from(start.elapsed().as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

#[derive(Debug, Default)]
pub(crate) struct EndpointHealth {
    /// Pre-request failures since the last success or ejection.
    failures: AtomicU32,
    /// Ejections in a row (reset by a success).
    ejections: AtomicU32,
    /// Ejected until this [`now_ms`]; 0 when not ejected.
    ejected_until: AtomicU64,
}

impl EndpointHealth {
    /// Whether the endpoint should be skipped now.
    pub(crate) fn is_ejected(&self) -> bool {
        let until = self.ejected_until.load(Ordering::Relaxed);
        until != 0 && now_ms() < until
    }

    /// A connection to the endpoint failed before the request reached it. Returns whether
    /// this failure ejected the endpoint.
    pub(crate) fn failure(&self) -> bool {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures < FAILURES_TO_EJECT || self.is_ejected() {
            return false;
        }
        self.failures.store(0, Ordering::Relaxed);
        let n = self.ejections.fetch_add(1, Ordering::Relaxed) + 1;
        let length = BASE_EJECTION.saturating_mul(n).min(MAX_EJECTION);
        let until = now_ms() + u64::try_from(length.as_millis()).unwrap_or(u64::MAX);
        self.ejected_until.store(until, Ordering::Relaxed);
        true
    }

    /// The endpoint answered: it is healthy again. Costs one load when nothing is recorded.
    pub(crate) fn success(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
        if self.ejected_until.load(Ordering::Relaxed) != 0 {
            self.ejected_until.store(0, Ordering::Relaxed);
            self.ejections.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_failures_eject_and_a_success_forgives() {
        let h = EndpointHealth::default();
        assert!(!h.is_ejected());
        assert!(!h.failure(), "one failure is not enough");
        assert!(!h.is_ejected());
        assert!(h.failure());
        assert!(h.is_ejected());
        // Further failures while ejected do not extend or count.
        assert!(!h.failure() && !h.failure());
        h.success();
        assert!(!h.is_ejected());
        assert!(!h.failure(), "the count started over");
    }

    #[test]
    fn a_success_between_failures_resets_the_count() {
        let h = EndpointHealth::default();
        assert!(!h.failure());
        h.success();
        assert!(!h.failure());
        assert!(!h.is_ejected());
    }

    #[test]
    fn ejections_in_a_row_grow_up_to_the_cap() {
        let h = EndpointHealth::default();
        let length = |h: &EndpointHealth| h.ejected_until.load(Ordering::Relaxed) - now_ms();
        h.failure();
        h.failure();
        let first = length(&h);
        assert!(first <= 5_000 && first > 4_000, "{first}");
        // Expire the ejection without a success in between: the next one is longer.
        h.ejected_until.store(1, Ordering::Relaxed);
        h.failure();
        h.failure();
        let second = length(&h);
        assert!(second > 9_000 && second <= 10_000, "{second}");
        for _ in 0..20 {
            h.ejected_until.store(1, Ordering::Relaxed);
            h.failure();
            h.failure();
        }
        assert!(length(&h) <= 60_000);
    }
}
