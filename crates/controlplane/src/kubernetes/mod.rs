//! Kubernetes: the source that watches the API, the status writer, and leader election.

mod leader;
mod source;
mod status;

pub use leader::{LeaderElection, LeaseOptions};
pub use source::{KubeSource, referenced};
pub use status::StatusWriter;
