//! Reconnect delays: 250 ms doubling to 10 s, each drawn from its upper half, so that the data
//! planes of a restarted control plane do not all come back in the same instant.

use std::time::Duration;

const FIRST: Duration = Duration::from_millis(250);
const MAX: Duration = Duration::from_secs(10);

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
        let delay = self.next;
        self.next = (delay * 2).min(MAX);
        delay / 2 + delay.mul_f64(fastrand::f64() / 2.0)
    }

    pub fn reset(&mut self) {
        self.next = FIRST;
    }
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
}
