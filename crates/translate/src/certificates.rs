//! Certificates and CA bundles from Secrets, ConfigMaps and ClusterTrustBundles, validated here
//! so that a bad one becomes a status condition instead of a failed handshake.

use k8s_openapi::api::certificates::v1beta1::ClusterTrustBundle;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::sync::Arc;

/// Value of `key` in a Secret: `stringData` wins over `data`, as the API server merges them.
fn secret_value(secret: &Secret, key: &str) -> Option<Vec<u8>> {
    if let Some(v) = secret.string_data.as_ref().and_then(|d| d.get(key)) {
        return Some(v.as_bytes().to_vec());
    }
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.clone())
}

fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("malformed PEM: {e}"))?;
    if certs.is_empty() {
        return Err("no PEM certificate found".into());
    }
    Ok(certs)
}

/// The (certificate chain, private key) PEM of a `kubernetes.io/tls` Secret, checked: both
/// parse, and the key belongs to the first certificate. Expiry is not checked here (an expired
/// certificate is still served, with a warning, so the clock stays out of translate).
pub fn tls_secret(secret: &Secret) -> Result<(String, String), String> {
    let kind = secret.type_.as_deref().unwrap_or("Opaque");
    if kind != "kubernetes.io/tls" {
        return Err(format!("Secret type is {kind}, want kubernetes.io/tls"));
    }
    let cert = secret_value(secret, "tls.crt").ok_or("Secret has no tls.crt")?;
    let key = secret_value(secret, "tls.key").ok_or("Secret has no tls.key")?;
    let chain = certificates(&cert).map_err(|e| format!("tls.crt: {e}"))?;
    let private = PrivateKeyDer::from_pem_slice(&key).map_err(|e| format!("tls.key: {e}"))?;
    let signer = rustls::crypto::aws_lc_rs::sign::any_supported_type(&private)
        .map_err(|e| format!("tls.key: unsupported private key: {e}"))?;
    rustls::sign::CertifiedKey::new(chain, Arc::clone(&signer))
        .keys_match()
        .map_err(|e| format!("tls.key does not match the certificate in tls.crt: {e}"))?;
    let as_text =
        |b: Vec<u8>, what: &str| String::from_utf8(b).map_err(|_| format!("{what} is not text"));
    Ok((as_text(cert, "tls.crt")?, as_text(key, "tls.key")?))
}

/// The CA bundle of a ClusterTrustBundle (`spec.trustBundle`, PEM certificates only, as the
/// API server validates it), checked to hold at least one certificate: the API allows an
/// empty bundle, which would trust nothing.
pub fn trust_bundle(bundle: &ClusterTrustBundle) -> Result<String, String> {
    let pem = &bundle.spec.trust_bundle;
    certificates(pem.as_bytes()).map_err(|e| format!("trustBundle: {e}"))?;
    Ok(pem.clone())
}

/// The CA bundle under `ca.crt` of a ConfigMap, checked to hold at least one certificate.
pub fn ca_bundle(config_map: &ConfigMap) -> Result<String, String> {
    let pem = config_map
        .data
        .as_ref()
        .and_then(|d| d.get("ca.crt"))
        .ok_or("ConfigMap has no ca.crt")?;
    certificates(pem.as_bytes()).map_err(|e| format!("ca.crt: {e}"))?;
    Ok(pem.clone())
}
