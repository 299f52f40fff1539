//! Gateway API types the `gateway-api` crate does not have at the version Gatehouse targets,
//! generated with kopium from the v1.7.0 CRDs and committed (docs/architecture.md: one set of
//! types per kind). The crate's 0.22 TCPRoute and UDPRoute are v1alpha2; v1.7.0 serves them
//! as v1 (its standard channel serves nothing else). Its standard HTTPRoute predates v1.7.0's
//! `rules[].retry`, which serde would drop. HTTPRoute, Gateway and ListenerSet come from
//! v1.7.0's experimental CRDs (a superset of the standard ones; `cluster/up` installs them by
//! default): their experimental fields (address `routability`, listener `filters`, the
//! `ExternalAuth` filter type) must reach translate, to be honoured or refused, never
//! silently dropped. An enum value the type does not know is worse than a dropped field: it
//! fails the whole list of that kind, so one HTTPRoute with an `ExternalAuth` filter stopped
//! every HTTPRoute from being read.
//! Regenerate with the command at the top of each file, then `cargo fmt`.

#![allow(clippy::all, clippy::pedantic, missing_docs)]

pub mod gateways;
pub mod httproutes;
pub mod listenersets;
pub mod tcproutes;
pub mod udproutes;
