//! Connection workers: one single-threaded tokio runtime per thread, each with its own epoll.
//!
//! Every listening socket is shared by all workers (one accept loop per worker on a duplicate of
//! the socket), and a connection lives on the worker that accepted it. There is no work
//! stealing: a worker's tasks, timers and I/O never wake another thread. This is nginx's
//! process model in threads, and it measured cheaper than tokio's multi-threaded scheduler,
//! whose single I/O driver hands every event to one thread and lets the others steal (see
//! docs/architecture.md, "Runtime").

use std::io;
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

/// The running workers; dropping it stops their threads (after the data plane has drained).
pub(crate) struct Workers {
    handles: Vec<Handle>,
    stop: CancellationToken,
}

impl Workers {
    pub(crate) fn start(count: usize) -> io::Result<Self> {
        let stop = CancellationToken::new();
        let mut handles = Vec::with_capacity(count);
        for index in 0..count.max(1) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            handles.push(runtime.handle().clone());
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

impl Drop for Workers {
    /// Ends every worker's runtime (dropping whatever tasks are left on it). The threads are
    /// not joined: this may run on one of them, or inside another runtime.
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
