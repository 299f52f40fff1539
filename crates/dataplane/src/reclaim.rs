//! Frees replaced routing tables off the threads that serve requests.
//!
//! A table of thousands of routes takes the better part of a millisecond to free, and whoever
//! lets go of it last frees it: the apply that swapped it out, or, when a connection still held
//! it, the worker serving that connection's next request, which then answers late. Its
//! contents go to one background thread instead, which frees them in the order they come.

use std::sync::OnceLock;
use std::sync::mpsc::{self, Sender};

/// Anything to free.
type Garbage = Box<dyn Send>;

static RECLAIMER: OnceLock<Sender<Garbage>> = OnceLock::new();

/// Frees `value` on the reclaiming thread (started by the first call). Where no thread can be
/// started, frees it here, as dropping it would have.
pub(crate) fn later<T: Send + 'static>(value: T) {
    let sender = RECLAIMER.get_or_init(|| {
        let (sender, garbage) = mpsc::channel::<Garbage>();
        // If the thread cannot start, `garbage` is dropped with the closure and every send
        // fails: values are then freed by their caller.
        let _ = std::thread::Builder::new()
            .name("gatehouse-reclaim".into())
            .spawn(move || {
                for value in garbage {
                    drop(value);
                }
            });
        sender
    });
    if let Err(mpsc::SendError(value)) = sender.send(Box::new(value)) {
        drop(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends the name of the thread that drops it.
    struct Witness(mpsc::Sender<Option<String>>);

    impl Drop for Witness {
        fn drop(&mut self) {
            let name = std::thread::current().name().map(str::to_owned);
            let _ = self.0.send(name);
        }
    }

    #[test]
    fn values_are_freed_on_the_reclaiming_thread() {
        let (tx, rx) = mpsc::channel();
        later(Witness(tx.clone()));
        later(vec![Witness(tx)]);
        for _ in 0..2 {
            let name = rx
                .recv_timeout(std::time::Duration::from_secs(5))
                .expect("freed");
            assert_eq!(name.as_deref(), Some("gatehouse-reclaim"));
        }
    }
}
