//! Deadlines checked by a timer that is re-armed lazily.
//!
//! A keep-alive connection sets a new deadline for every request (header read, time to
//! response headers). Re-arming a timer each time costs a timer-wheel removal and insertion
//! per request. Deadlines on one connection mostly move forward, so the timer stays armed at
//! an earlier deadline and, when it fires, compares the clock with the current deadline and
//! re-arms only if there is time left: one re-arm per timeout period instead of per request.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::task::{Context, Poll, ready};
use tokio::time::{Duration, Instant, Sleep};

pub(crate) struct Deadline {
    sleep: Pin<Box<Sleep>>,
}

impl Deadline {
    pub(crate) fn new() -> Self {
        // Unarmed in practice: the first deadline is earlier and re-arms it.
        let far = Instant::now() + Duration::from_secs(86_400 * 365);
        Deadline {
            sleep: Box::pin(tokio::time::sleep_until(far)),
        }
    }

    /// `Ready` once `at` has passed.
    pub(crate) fn poll_passed(&mut self, cx: &mut Context<'_>, at: Instant) -> Poll<()> {
        if self.sleep.deadline() > at {
            self.sleep.as_mut().reset(at);
        }
        loop {
            ready!(self.sleep.as_mut().poll(cx));
            if Instant::now() >= at {
                return Poll::Ready(());
            }
            self.sleep.as_mut().reset(at);
        }
    }

    /// Runs `fut` until it completes (`Some`) or `at` passes (`None`).
    pub(crate) async fn run<F: Future>(&mut self, at: Instant, fut: F) -> Option<F::Output> {
        let mut fut = pin!(fut);
        poll_fn(|cx| {
            if let Poll::Ready(out) = fut.as_mut().poll(cx) {
                return Poll::Ready(Some(out));
            }
            self.poll_passed(cx, at).map(|()| None)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn fires_at_the_latest_deadline_only() {
        let mut d = Deadline::new();
        let start = Instant::now();
        // Completes first: no timeout.
        assert_eq!(
            d.run(start + Duration::from_secs(1), async { 7 }).await,
            Some(7)
        );
        // The deadline moved on: the timer, armed at the first one, fires there and re-arms.
        let late = start + Duration::from_secs(3);
        let out = d.run(late, std::future::pending::<()>()).await;
        assert_eq!(out, None);
        assert!(Instant::now() >= late);
        // An earlier deadline than the armed one is honoured at once.
        let soon = Instant::now() + Duration::from_millis(10);
        let before = Instant::now();
        assert_eq!(d.run(soon, std::future::pending::<()>()).await, None);
        assert!(Instant::now() - before < Duration::from_secs(1));
    }
}
