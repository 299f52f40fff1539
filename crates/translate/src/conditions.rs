//! Status conditions with the Gateway API's types and reasons.
//!
//! Translate is pure, so it cannot read the clock: every condition it builds carries the Unix
//! epoch as lastTransitionTime. Whoever publishes status calls [`stamp`] with the previous
//! conditions and the current time, which keeps the old time for unchanged conditions.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

pub fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: if ok { "True" } else { "False" }.to_string(),
        reason: reason.to_string(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
    }
}

/// Give every condition in `new` its lastTransitionTime: the previous one's when the status did
/// not change, otherwise `now`.
pub fn stamp(new: &mut [Condition], previous: &[Condition], now: Timestamp) {
    for c in new {
        c.last_transition_time = match previous.iter().find(|p| p.type_ == c.type_) {
            Some(p) if p.status == c.status => p.last_transition_time.clone(),
            _ => Time(now),
        };
    }
}

/// Condition types and reasons used across the crate, spelled once.
pub mod names {
    pub const ACCEPTED: &str = "Accepted";
    pub const PROGRAMMED: &str = "Programmed";
    pub const RESOLVED_REFS: &str = "ResolvedRefs";
    pub const CONFLICTED: &str = "Conflicted";
    pub const PARTIALLY_INVALID: &str = "PartiallyInvalid";

    pub const INVALID: &str = "Invalid";
    pub const INVALID_PARAMETERS: &str = "InvalidParameters";
    pub const LISTENERS_NOT_VALID: &str = "ListenersNotValid";
    pub const UNSUPPORTED_ADDRESS: &str = "UnsupportedAddress";
    pub const ADDRESS_NOT_USABLE: &str = "AddressNotUsable";
    pub const UNSUPPORTED_PROTOCOL: &str = "UnsupportedProtocol";
    pub const INVALID_ROUTE_KINDS: &str = "InvalidRouteKinds";
    pub const HOSTNAME_CONFLICT: &str = "HostnameConflict";
    pub const PROTOCOL_CONFLICT: &str = "ProtocolConflict";
    pub const NO_CONFLICTS: &str = "NoConflicts";
    pub const NOT_ALLOWED_BY_LISTENERS: &str = "NotAllowedByListeners";
    pub const NO_MATCHING_LISTENER_HOSTNAME: &str = "NoMatchingListenerHostname";
    pub const NO_MATCHING_PARENT: &str = "NoMatchingParent";
    pub const UNSUPPORTED_VALUE: &str = "UnsupportedValue";
    pub const REF_NOT_PERMITTED: &str = "RefNotPermitted";
    pub const INVALID_KIND: &str = "InvalidKind";
    pub const BACKEND_NOT_FOUND: &str = "BackendNotFound";
    pub const INVALID_CERTIFICATE_REF: &str = "InvalidCertificateRef";
    pub const INVALID_CA_CERTIFICATE_REF: &str = "InvalidCACertificateRef";
    pub const INVALID_CA_CERTIFICATE_KIND: &str = "InvalidCACertificateKind";
    pub const INVALID_CLIENT_CERTIFICATE_REF: &str = "InvalidClientCertificateRef";
    pub const CONFLICTED_POLICY: &str = "Conflicted";
    pub const NO_VALID_CA_CERTIFICATE: &str = "NoValidCACertificate";
}
