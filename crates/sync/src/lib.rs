//! Configuration sync between the controller and per-Gateway data planes.
//!
//! ```text
//! controller: ConfigServer::publish(gateway, ir::Config) ──▶ watch per Gateway
//!                                                               │ (latest wins)
//!   gRPC stream over mTLS ◀── session per data-plane stream ◀───┘
//!        │   Snapshot / Credentials ▼          ▲ Hello / Ack / Nack / Serving
//! gatehouse proxy: client::run ──▶ Applier::apply ──▶ ClientState
//! ```
//!
//! The control plane runs its own CA ([`Ca`]); a data plane's client certificate names its
//! Gateway ([`DataPlaneIdentity`]) and is the only thing that decides which configuration a
//! stream receives. Snapshot versions are hashes of their content ([`version`]), so restarts
//! on either side never cause an identical configuration to be applied twice.

pub mod ca;
pub mod client;
pub mod compression;
pub mod credentials;
pub mod identity;
mod keepalive;
mod rpc;
pub mod server;
pub mod version;
pub mod wire;

pub use ca::{Ca, CaError};
pub use client::{Applier, ClientOptions, ClientState, run};
pub use credentials::{Credentials, CredentialsError};
pub use identity::{DataPlaneIdentity, IdentityError, identity_of};
pub use server::{ConfigServer, GatewayReport, ReplicaReport, ServerCounters, ServerOptions};
pub use wire::UnboundListener;
