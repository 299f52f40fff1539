//! TLS of a listener: certificateRefs to Secrets, and client validation from the Gateway's
//! spec.tls.frontend, each resolved to IR or to the condition that explains why not.

use crate::certificates;
use crate::conditions::names::*;
use crate::generated::gateways::{
    Gateway, GatewayListeners, GatewayListenersTlsMode, GatewayTlsFrontendDefaultValidation,
    GatewayTlsFrontendDefaultValidationMode, GatewayTlsFrontendPerPortTlsValidation,
    GatewayTlsFrontendPerPortTlsValidationMode,
};
use crate::objects::GATEWAY_GROUP;
use crate::objects::ObjectKey;
use crate::refs::{Referrer, Refs};
use gatehouse_ir as ir;
use std::collections::BTreeMap;

/// Why a TLS reference cannot be used: (ResolvedRefs reason, message).
pub type Problem = (&'static str, String);

/// Why a listener's TLS cannot be served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsProblem {
    /// The ResolvedRefs=False reason and message.
    pub problem: Problem,
    /// Client validation is configured and none of its CA certificates is usable: the listener
    /// is not Accepted either (reason NoValidCACertificate), since it cannot check anyone.
    pub no_valid_ca: bool,
}

impl From<Problem> for TlsProblem {
    fn from(problem: Problem) -> Self {
        TlsProblem {
            problem,
            no_valid_ca: false,
        }
    }
}

/// Resolve one `kubernetes.io/tls` Secret reference from `owner` (a Gateway or a
/// ListenerSet), registering the certificate under `namespace/name`.
pub fn secret_ref(
    owner: Owner<'_>,
    group: Option<&str>,
    kind: Option<&str>,
    name: &str,
    namespace: Option<&str>,
    refs: &Refs,
    certificates: &mut BTreeMap<String, ir::Certificate>,
) -> Result<String, Problem> {
    let (group, kind) = (group.unwrap_or(""), kind.unwrap_or("Secret"));
    if !group.is_empty() || kind != "Secret" {
        return Err((
            INVALID_CERTIFICATE_REF,
            format!("certificateRef kind {group}/{kind} is not supported; use a Secret"),
        ));
    }
    let (from_kind, from_namespace) = (owner.kind, owner.namespace);
    let ns = namespace.unwrap_or(from_namespace);
    let from = Referrer {
        group: GATEWAY_GROUP,
        kind: from_kind,
        namespace: from_namespace,
    };
    if !refs.permitted(from, "", "Secret", ns, name) {
        return Err((
            REF_NOT_PERMITTED,
            format!(
                "no ReferenceGrant in namespace {ns} allows {from_kind}s from {from_namespace} to use Secret {name}"
            ),
        ));
    }
    let key = ObjectKey::new(ns, name);
    let secret = refs
        .secrets
        .get(&key)
        .ok_or((INVALID_CERTIFICATE_REF, format!("Secret {key} not found")))?;
    let (cert_pem, key_pem) = certificates::tls_secret(secret)
        .map_err(|e| (INVALID_CERTIFICATE_REF, format!("Secret {key}: {e}")))?;
    let name = key.to_string();
    certificates.insert(
        name.clone(),
        ir::Certificate {
            name: name.clone(),
            cert_pem,
            key_pem,
        },
    );
    Ok(name)
}

/// The object a listener is declared in: the Gateway itself, or a ListenerSet attached to it.
/// Its certificateRefs are relative to (and ReferenceGrants name) that object.
#[derive(Clone, Copy)]
pub struct Owner<'a> {
    pub kind: &'a str,
    pub namespace: &'a str,
}

/// The listener's TLS, or the problem that keeps it from being served. Client validation
/// comes from the Gateway's spec.tls.frontend for the listener's port, whoever declared it.
pub fn listener_tls(
    gw: &Gateway,
    owner: Owner<'_>,
    l: &GatewayListeners,
    refs: &Refs,
    certificates: &mut BTreeMap<String, ir::Certificate>,
) -> Result<Option<ir::ListenerTls>, TlsProblem> {
    if !matches!(l.protocol.as_str(), "HTTPS" | "TLS") {
        return Ok(None);
    }
    let gw_ns = crate::objects::namespace(&gw.metadata);
    let tls = l.tls.as_ref();
    let mode = match tls.and_then(|t| t.mode.as_ref()) {
        Some(GatewayListenersTlsMode::Passthrough) => ir::TlsMode::Passthrough,
        _ => ir::TlsMode::Terminate,
    };
    if mode == ir::TlsMode::Passthrough {
        return Ok(Some(ir::ListenerTls {
            mode,
            certificates: Vec::new(),
            client_validation: None,
        }));
    }
    let cert_refs = tls
        .and_then(|t| t.certificate_refs.as_deref())
        .unwrap_or_default();
    if cert_refs.is_empty() {
        return Err((
            INVALID_CERTIFICATE_REF,
            "a listener that terminates TLS needs certificateRefs".into(),
        )
            .into());
    }
    let mut names = Vec::new();
    for r in cert_refs {
        names.push(secret_ref(
            owner,
            r.group.as_deref(),
            r.kind.as_deref(),
            &r.name,
            r.namespace.as_deref(),
            refs,
            certificates,
        )?);
    }
    let client_validation = frontend_validation(gw, &gw_ns, l.port, refs)?;
    Ok(Some(ir::ListenerTls {
        mode,
        certificates: names,
        client_validation,
    }))
}

/// Client certificate validation as both the default and the per-port blocks spell it (two
/// generated types with the same fields).
pub struct FrontendValidation {
    pub ca_refs: Vec<CaRef>,
    pub insecure_fallback: bool,
}

/// A caCertificateRef of client validation.
pub struct CaRef {
    pub group: String,
    pub kind: String,
    pub name: String,
    pub namespace: Option<String>,
}

macro_rules! frontend_validation_from {
    ($($ty:ty => $mode:ident),+) => {$(
        impl From<&$ty> for FrontendValidation {
            fn from(v: &$ty) -> Self {
                FrontendValidation {
                    ca_refs: v
                        .ca_certificate_refs
                        .iter()
                        .map(|r| CaRef {
                            group: r.group.clone(),
                            kind: r.kind.clone(),
                            name: r.name.clone(),
                            namespace: r.namespace.clone(),
                        })
                        .collect(),
                    insecure_fallback: matches!(v.mode, Some($mode::AllowInsecureFallback)),
                }
            }
        }
    )+};
}
frontend_validation_from!(
    GatewayTlsFrontendDefaultValidation => GatewayTlsFrontendDefaultValidationMode,
    GatewayTlsFrontendPerPortTlsValidation => GatewayTlsFrontendPerPortTlsValidationMode
);

/// Every client validation block of the Gateway (default first, then per port), with the port
/// it applies to (`None` for the default).
pub fn frontend_validations(gw: &Gateway) -> Vec<(Option<i32>, FrontendValidation)> {
    let Some(frontend) = gw.spec.tls.as_ref().and_then(|t| t.frontend.as_ref()) else {
        return Vec::new();
    };
    let default = frontend
        .default
        .validation
        .as_ref()
        .map(|v| (None, FrontendValidation::from(v)));
    let per_port = frontend
        .per_port
        .iter()
        .flatten()
        .filter_map(|p| p.tls.validation.as_ref().map(|v| (Some(p.port), v.into())));
    default.into_iter().chain(per_port).collect()
}

/// Whether any of the Gateway's client certificate validations lets clients without a valid
/// certificate through (mode AllowInsecureFallback): the Gateway says so in a condition.
pub fn uses_insecure_fallback(gw: &Gateway) -> bool {
    frontend_validations(gw)
        .iter()
        .any(|(_, v)| v.insecure_fallback)
}

/// Client certificate validation for `port`: the per-port entry if there is one, else the
/// default.
fn frontend_validation(
    gw: &Gateway,
    gw_ns: &str,
    port: i32,
    refs: &Refs,
) -> Result<Option<ir::ClientValidation>, TlsProblem> {
    let Some(frontend) = gw.spec.tls.as_ref().and_then(|t| t.frontend.as_ref()) else {
        return Ok(None);
    };
    let validation: Option<FrontendValidation> =
        match frontend.per_port.iter().flatten().find(|p| p.port == port) {
            Some(p) => p.tls.validation.as_ref().map(Into::into),
            None => frontend.default.validation.as_ref().map(Into::into),
        };
    let Some(v) = validation else {
        return Ok(None);
    };
    let mut bundle = String::new();
    let mut first_problem: Option<Problem> = None;
    for r in &v.ca_refs {
        match ca_ref(gw_ns, r, refs) {
            Ok(pem) => {
                bundle.push_str(&pem);
                if !bundle.ends_with('\n') {
                    bundle.push('\n');
                }
            }
            Err(problem) => {
                first_problem.get_or_insert(problem);
            }
        }
    }
    if let Some(problem) = first_problem {
        // Fail closed: a listener told to check clients against CAs it cannot all load
        // serves nobody rather than checking against fewer CAs than configured.
        return Err(TlsProblem {
            problem,
            no_valid_ca: bundle.is_empty(),
        });
    }
    if bundle.is_empty() {
        return Err(TlsProblem {
            problem: (
                INVALID_CA_CERTIFICATE_REF,
                "client validation needs at least one caCertificateRef".into(),
            ),
            no_valid_ca: true,
        });
    }
    Ok(Some(ir::ClientValidation {
        ca_pem: bundle,
        allow_insecure_fallback: v.insecure_fallback,
    }))
}

/// One CA certificate reference of client validation: the PEM bundle of its ConfigMap or
/// ClusterTrustBundle.
fn ca_ref(gw_ns: &str, r: &CaRef, refs: &Refs) -> Result<String, Problem> {
    let (group, kind, name) = (r.group.as_str(), r.kind.as_str(), r.name.as_str());
    if crate::refs::is_cluster_trust_bundle(group, kind) {
        // The API's validation rejects a namespace here; files are not validated by it.
        if let Some(ns) = &r.namespace {
            return Err((
                INVALID_CA_CERTIFICATE_REF,
                format!(
                    "ClusterTrustBundle {name} is cluster-scoped: its reference must not set \
                     namespace (it sets {ns})"
                ),
            ));
        }
        return refs
            .trust_bundle(name)
            .map_err(|e| (INVALID_CA_CERTIFICATE_REF, e));
    }
    if !group.is_empty() || kind != "ConfigMap" {
        return Err((
            INVALID_CA_CERTIFICATE_KIND,
            crate::refs::unsupported_ca_kind(group, kind),
        ));
    }
    let ns = r.namespace.clone().unwrap_or_else(|| gw_ns.to_string());
    let from = Referrer {
        group: GATEWAY_GROUP,
        kind: "Gateway",
        namespace: gw_ns,
    };
    if !refs.permitted(from, "", "ConfigMap", &ns, name) {
        return Err((
            REF_NOT_PERMITTED,
            format!(
                "no ReferenceGrant in namespace {ns} allows Gateways from {gw_ns} to use ConfigMap {name}"
            ),
        ));
    }
    refs.config_map_bundle(&ObjectKey::new(ns, name.to_string()))
        .map_err(|e| (INVALID_CA_CERTIFICATE_REF, e))
}
