//! Configuration sources and the object store.
//!
//! Today: the file source used by `gatehouse run -f <dir|file>` ([`FileSource`]) and its
//! file-system watcher ([`watch()`]). Later: the Kubernetes source, the status writer and
//! leader election.

mod file;
pub mod kubernetes;
mod locate;
mod watch;

pub use file::{FileSource, LoadError, Loaded};
pub use watch::{Watch, watch};
