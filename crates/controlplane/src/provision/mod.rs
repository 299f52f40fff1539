//! Provisioning: one data plane per Gateway (Deployment, Service, ServiceAccount, bootstrap
//! credentials, and a PodDisruptionBudget or HorizontalPodAutoscaler when the parameters ask),
//! in the Gateway's namespace and owned by it.
//!
//! `render` is pure (what the objects are), `apply` talks to the API server (only what
//! changed), `credentials` is how the bootstrap Secret is filled.

mod apply;
pub mod credentials;
pub mod names;
pub mod render;
pub mod spec;

pub use apply::{Desired, Provisioned, Provisioner};
pub use credentials::{CredentialsIssuer, IssuedCredentials};
pub use render::{ProxySpec, Settings};
