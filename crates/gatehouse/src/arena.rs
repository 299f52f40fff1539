//! One jemalloc arena for the control plane's threads.
//!
//! jemalloc gives each new thread one of its arenas (four per core), and an arena keeps the
//! pages freed in it for its own later use. The control plane builds and frees a whole
//! translated configuration per pass, on the runtime's worker and on whichever blocking-pool
//! thread a pass lands; spread over many arenas, the space each pass freed sat in one arena
//! while the next pass grew another. Pinning all of them to one arena of their own lets each
//! pass reuse what the last one freed, and keeps the data plane's worker threads (started
//! elsewhere, never pinned) on arenas the control plane does not churn. Measured in
//! docs/architecture.md ("One arena for the control plane").

use std::sync::OnceLock;
use tikv_jemalloc_ctl::{Access, AsName};

/// The control plane's arena, created on first use; `None` if jemalloc refused (the threads
/// then keep the arenas jemalloc gave them, which is only a matter of memory).
fn control_plane_arena() -> Option<u32> {
    static ARENA: OnceLock<Option<u32>> = OnceLock::new();
    *ARENA.get_or_init(|| {
        // jemalloc's types: `arenas.create` and `thread.arena` are unsigned ints.
        match Access::<u32>::read(b"arenas.create\0".name()) {
            Ok(arena) => Some(arena),
            Err(e) => {
                tracing::warn!("cannot create the control plane's jemalloc arena: {e}");
                None
            }
        }
    })
}

/// Makes the calling thread allocate from the control plane's arena.
pub fn pin_to_control_plane() {
    if let Some(arena) = control_plane_arena()
        && let Err(e) = b"thread.arena\0".name().write(arena)
    {
        tracing::warn!("cannot move a control-plane thread to its arena: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The arena the calling thread allocates from.
    fn current() -> u32 {
        Access::<u32>::read(b"thread.arena\0".name()).expect("thread.arena")
    }

    #[test]
    fn pinned_threads_share_one_arena_that_other_threads_do_not_get() {
        let before = std::thread::spawn(current).join().unwrap();
        let pinned: Vec<u32> = (0..3)
            .map(|_| {
                std::thread::spawn(|| {
                    pin_to_control_plane();
                    current()
                })
                .join()
                .unwrap()
            })
            .collect();
        let arena = control_plane_arena().expect("jemalloc creates an arena");
        assert_eq!(pinned, [arena; 3]);
        assert_ne!(
            before, arena,
            "a thread that is not pinned allocates elsewhere"
        );
        let after = std::thread::spawn(current).join().unwrap();
        assert_ne!(
            after, arena,
            "created arenas are not handed out automatically"
        );
    }
}
