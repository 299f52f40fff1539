//! Kubernetes: the source that watches the API, the status writer, leader election, and the
//! addresses Gateways get in controller mode.

pub mod addresses;
pub mod ca_secret;
mod echoes;
mod leader;
mod lenient;
pub mod service;
mod sink;
mod source;
mod status;

pub use echoes::Echoes;
pub use leader::{LeaderElection, LeaseOptions};
pub use sink::{KubeStatus, Provisioning};
pub use source::KubeSource;
pub use status::{StatusWriter, Written};
