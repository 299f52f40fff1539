//! Reconnect delays: 250 ms doubling to 10 s, each drawn from its upper half, so that the data
//! planes of a restarted control plane do not all come back in the same instant. A leader
//! handover is retried within a second instead: a replica answered, and the next leader is
//! at most a lease renewal away.

use std::time::Duration;

const FIRST: Duration = Duration::from_millis(250);
const MAX: Duration = Duration::from_secs(10);
const HANDOVER_MAX: Duration = Duration::from_secs(1);

pub(super) struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { next: FIRST }
    }
}

impl Backoff {
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self.next;
        self.next = (ceiling * 2).min(MAX);
        jittered(ceiling)
    }

    /// After "not the leader" or "control plane stopping": the same doubling, capped at a
    /// second, so that a data plane finds the new leader within a second of its election
    /// rather than up to 10 s later.
    pub fn next_handover_delay(&mut self) -> Duration {
        let ceiling = self.next.min(HANDOVER_MAX);
        self.next = (self.next * 2).min(MAX);
        jittered(ceiling)
    }

    pub fn reset(&mut self) {
        self.next = FIRST;
    }
}

/// A delay from the upper half of `ceiling`.
fn jittered(ceiling: Duration) -> Duration {
    ceiling / 2 + ceiling.mul_f64(fastrand::f64() / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_within_jitter() {
        let mut backoff = Backoff::default();
        let mut ceiling = FIRST;
        for _ in 0..12 {
            let delay = backoff.next_delay();
            assert!(
                delay >= ceiling / 2 && delay <= ceiling,
                "{delay:?} for {ceiling:?}"
            );
            ceiling = (ceiling * 2).min(MAX);
        }
        assert_eq!(ceiling, MAX);
        backoff.reset();
        assert!(backoff.next_delay() <= FIRST);
    }

    #[test]
    fn a_handover_is_retried_within_a_second() {
        let mut backoff = Backoff::default();
        let delays: Vec<Duration> = (0..8).map(|_| backoff.next_handover_delay()).collect();
        assert!(delays[0] <= FIRST, "{delays:?}");
        assert!(delays.iter().all(|d| *d <= HANDOVER_MAX), "{delays:?}");
        assert!(delays[7] >= HANDOVER_MAX / 2, "{delays:?}");
        // A failure after the handover still backs off as far as before.
        assert!(backoff.next_delay() >= MAX / 2);
    }
}
