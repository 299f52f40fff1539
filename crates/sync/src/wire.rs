//! The messages of `gatehouse.sync.v1`, as prost structs written by hand.
//!
//! No `protoc` exists on the build machines, so these structs are the source of truth and
//! `proto/gatehouse/sync/v1/sync.proto` documents them for other implementations (field
//! numbers and types must match; `tests/wire_format.rs` checks that they do). Add fields
//! with new numbers only; never reuse or renumber one.

use bytes::Bytes;

/// Data plane → control plane.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DataPlaneMessage {
    #[prost(oneof = "data_plane_message::Kind", tags = "1, 2, 3, 4")]
    pub kind: Option<data_plane_message::Kind>,
}

pub mod data_plane_message {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Kind {
        #[prost(message, tag = "1")]
        Hello(super::Hello),
        #[prost(message, tag = "2")]
        Ack(super::Ack),
        #[prost(message, tag = "3")]
        Nack(super::Nack),
        #[prost(message, tag = "4")]
        Serving(super::Serving),
    }
}

/// The first message of every stream.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Hello {
    /// The pod's name: replicas are reported by it.
    #[prost(string, tag = "1")]
    pub pod: String,
    /// The data plane's build (version string), for reports.
    #[prost(string, tag = "2")]
    pub build: String,
    /// The snapshot version served right now, "" if none: a control plane that restarted does
    /// not send an identical snapshot again.
    #[prost(string, tag = "3")]
    pub current_version: String,
    /// The data plane reads [`Snapshot::config_gzip`]: the control plane compresses each
    /// snapshot once for all such streams, instead of gRPC compressing it again on every
    /// stream. Older data planes never set it and get `config_json`.
    #[prost(bool, tag = "4")]
    pub gzip_snapshots: bool,
}

/// The snapshot `version` is served now.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Ack {
    #[prost(string, tag = "1")]
    pub version: String,
    /// Listeners of the configuration whose address is not bound (yet).
    #[prost(message, repeated, tag = "2")]
    pub unbound: Vec<UnboundListener>,
    /// What the data plane contained instead of rejecting (a rule that answers 500, …).
    #[prost(string, repeated, tag = "3")]
    pub diagnostics: Vec<String>,
}

/// The snapshot `version` was rejected; the previous one keeps serving.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Nack {
    #[prost(string, tag = "1")]
    pub version: String,
    #[prost(string, tag = "2")]
    pub error: String,
}

/// What serves changed without a new snapshot (a retried bind succeeded).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Serving {
    #[prost(message, repeated, tag = "1")]
    pub unbound: Vec<UnboundListener>,
}

/// A listener address the data plane could not bind.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Message)]
pub struct UnboundListener {
    #[prost(uint32, tag = "1")]
    pub port: u32,
    /// The operating system's error.
    #[prost(string, tag = "2")]
    pub error: String,
    /// The host cannot use the address at all (so retrying will not help).
    #[prost(bool, tag = "3")]
    pub address_not_usable: bool,
    /// The IP address the listener binds, "" when unknown (an addition to the brief's wire
    /// format: the control plane's serving report is keyed by socket address).
    #[prost(string, tag = "4")]
    pub address: String,
    /// A UDP socket (a UDP listener); otherwise TCP. Older data planes never set it.
    #[prost(bool, tag = "5")]
    pub udp: bool,
}

/// Control plane → data plane.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ControlPlaneMessage {
    #[prost(oneof = "control_plane_message::Kind", tags = "1, 2")]
    pub kind: Option<control_plane_message::Kind>,
}

pub mod control_plane_message {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Kind {
        #[prost(message, tag = "1")]
        Snapshot(super::Snapshot),
        #[prost(message, tag = "2")]
        Credentials(super::Credentials),
    }
}

/// Everything the data plane serves from now on.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Snapshot {
    /// Derived from the content (a hash of `config_json`), so equal content has equal versions
    /// across control-plane restarts.
    #[prost(string, tag = "1")]
    pub version: String,
    /// The serde_json of `gatehouse_ir::Config`. `Bytes`: the same snapshot goes to every
    /// replica of a Gateway without copying it per stream.
    #[prost(bytes = "bytes", tag = "2")]
    pub config_json: Bytes,
    /// `config_json` gzip-compressed, sent instead of it (`config_json` empty) to data planes
    /// whose Hello set `gzip_snapshots`. `Bytes` for the same reason.
    #[prost(bytes = "bytes", tag = "3")]
    pub config_gzip: Bytes,
}

/// A renewed client certificate for the data plane's next connections.
#[derive(Clone, PartialEq, prost::Message)]
#[prost(skip_debug)]
pub struct Credentials {
    #[prost(string, tag = "1")]
    pub cert_pem: String,
    #[prost(string, tag = "2")]
    pub key_pem: String,
    #[prost(string, tag = "3")]
    pub ca_pem: String,
}

/// Never prints the private key.
impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").finish_non_exhaustive()
    }
}
