//! Connection workers: one single-threaded tokio runtime per thread, each with its own epoll.
//!
//! Every listening address has a socket per worker in one `SO_REUSEPORT` group (see
//! `listeners.rs`), and a connection lives on the worker that accepted it. There is no work
//! stealing: a worker's tasks, timers and I/O never wake another thread. This is nginx's
//! process model in threads, and it measured cheaper than tokio's multi-threaded scheduler,
//! whose single I/O driver hands every event to one thread and lets the others steal (see
//! docs/architecture.md, "Runtime").

use crate::metrics::WorkerStalls;
use std::io;
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

/// How often each worker's watchdog wakes.
const TICK: Duration = Duration::from_millis(100);
/// A tick this late means the worker ran nothing else for that long: a stall, counted.
const STALL: Duration = Duration::from_millis(250);
/// A stall this long is also a warning (Envoy's watchdog calls these a miss and a mega-miss).
/// Shorter ones happen on a host with more runnable threads than cores (a 2-core machine
/// running load generators, backends and several data planes logged a few 250–400 ms ones in
/// two minutes, on idle workers too); the counters show those, and a warning for each would
/// be noise in the logs of exactly the hosts that are busiest.
const WARN_AT: Duration = Duration::from_secs(1);
/// At most one stall warning per worker this often: a host that starves a worker for minutes
/// would otherwise log a line a second for it. The counters count every stall.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The running workers; dropping it stops their threads (after the data plane has drained).
pub(crate) struct Workers {
    handles: Vec<Handle>,
    stop: CancellationToken,
}

impl Workers {
    pub(crate) fn start(count: usize, stalls: &WorkerStalls) -> io::Result<Self> {
        let stop = CancellationToken::new();
        let mut handles = Vec::with_capacity(count);
        for index in 0..count.max(1) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            handles.push(runtime.handle().clone());
            runtime.spawn(watchdog(index, stalls.clone()));
            let stop = stop.clone();
            std::thread::Builder::new()
                .name(format!("gatehouse-worker-{index}"))
                .spawn(move || {
                    crate::h1::set_worker_index(index);
                    runtime.block_on(stop.cancelled());
                })?;
        }
        Ok(Workers { handles, stop })
    }

    pub(crate) fn handles(&self) -> &[Handle] {
        &self.handles
    }
}

/// Envoy's watchdog, for one worker: a timer that should fire every [`TICK`]. A worker is a
/// single thread, so a tick that fires [`STALL`] late means every connection on it waited that
/// long too: something blocked the thread (a blocking call, a long computation) or the host
/// gave it no CPU. Counted (`gatehouse_worker_stalls_total`) and logged, because a request
/// that stalls for seconds otherwise leaves no trace in the data plane at all.
async fn watchdog(index: usize, stalls: WorkerStalls) {
    let mut expected = Instant::now() + TICK;
    let mut last_warning: Option<Instant> = None;
    let mut unreported = 0u64;
    loop {
        tokio::time::sleep_until(expected.into()).await;
        let now = Instant::now();
        let late = now.saturating_duration_since(expected);
        if late >= STALL {
            stalls.count.inc();
            stalls.seconds.inc_by(late.as_secs_f64());
            unreported += 1;
            if late >= WARN_AT && last_warning.is_none_or(|at| now.duration_since(at) >= WARN_EVERY)
            {
                tracing::warn!(
                    worker = index,
                    late_ms = late.as_millis(),
                    stalls = unreported,
                    "connection worker stalled: its timers ran late, and so did its connections"
                );
                last_warning = Some(now);
                unreported = 0;
            }
        }
        expected = now + TICK;
    }
}

impl Drop for Workers {
    /// Ends every worker's runtime (dropping whatever tasks are left on it). The threads are
    /// not joined: this may run on one of them, or inside another runtime.
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stalls_after(work: impl FnOnce() + Send + 'static) -> WorkerStalls {
        let stalls = WorkerStalls::default();
        let workers = Workers::start(1, &stalls).unwrap();
        // Let the watchdog take its first tick on an idle worker.
        std::thread::sleep(TICK * 2);
        workers.handles()[0].spawn(async move { work() });
        std::thread::sleep(TICK * 8);
        stalls
    }

    #[test]
    fn a_blocked_worker_is_counted_as_stalled() {
        // A blocking sleep on the worker's only thread: the watchdog cannot run for 600 ms.
        let stalls = stalls_after(|| std::thread::sleep(Duration::from_millis(600)));
        assert_eq!(stalls.count.get(), 1);
        let seconds = stalls.seconds.get();
        assert!((0.25..0.7).contains(&seconds), "stalled for {seconds} s");
    }

    #[test]
    fn a_worker_that_yields_is_not_stalled() {
        let stalls = stalls_after(|| std::thread::sleep(Duration::from_millis(20)));
        assert_eq!(stalls.count.get(), 0);
    }
}
