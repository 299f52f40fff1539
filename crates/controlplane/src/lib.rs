//! The control plane: sources of objects (YAML files, the Kubernetes API), the one reconcile
//! loop that turns them into configurations and status, and where status goes.

pub mod check;
mod failures;
mod file;
pub mod kubernetes;
mod locate;
pub mod metrics;
pub mod provision;
pub mod reconcile;
pub mod remote;
pub mod source;
pub mod state;
pub mod status_report;
mod watch;

pub use file::{FileSource, LoadError, Loaded};
pub use reconcile::{Applied, Publisher, Reconciler, StatusSink};
pub use source::{Source, SourceSnapshot, WatchedFiles};
pub use state::{ControlState, Published};
pub use watch::{Changes, Watch, watch};
