//! Which Gateway a data plane serves, as its client certificate says.
//!
//! The identity is the certificate's only URI subjectAltName,
//! `spiffe://gatehouse.dev/ns/<namespace>/gateway/<name>`. The control plane takes a stream's
//! Gateway from the verified certificate alone, so a data plane cannot ask for another
//! Gateway's configuration (which holds that Gateway's private keys).

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use x509_parser::extensions::GeneralName;

/// The SPIFFE trust domain of Gatehouse data-plane certificates.
pub const TRUST_DOMAIN: &str = "gatehouse.dev";

/// One Gateway, whose data planes share one identity.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DataPlaneIdentity {
    pub namespace: String,
    pub gateway: String,
}

impl DataPlaneIdentity {
    /// Checks both names, so that every identity that exists can be encoded and read back.
    pub fn new(
        namespace: impl Into<String>,
        gateway: impl Into<String>,
    ) -> Result<Self, IdentityError> {
        let identity = DataPlaneIdentity {
            namespace: namespace.into(),
            gateway: gateway.into(),
        };
        check_label(&identity.namespace).map_err(|why| IdentityError::BadNamespace {
            name: identity.namespace.clone(),
            why,
        })?;
        check_subdomain(&identity.gateway).map_err(|why| IdentityError::BadGateway {
            name: identity.gateway.clone(),
            why,
        })?;
        Ok(identity)
    }

    /// The URI subjectAltName of this identity's certificates.
    pub fn uri(&self) -> String {
        format!(
            "spiffe://{TRUST_DOMAIN}/ns/{}/gateway/{}",
            self.namespace, self.gateway
        )
    }

    /// Reads a URI written by [`DataPlaneIdentity::uri`].
    pub fn from_uri(uri: &str) -> Result<Self, IdentityError> {
        let wrong = || IdentityError::NotGatehouse(uri.to_string());
        let rest = uri.strip_prefix("spiffe://").ok_or_else(wrong)?;
        let path = rest
            .strip_prefix(TRUST_DOMAIN)
            .and_then(|p| p.strip_prefix('/'))
            .ok_or_else(wrong)?;
        let parts: Vec<&str> = path.split('/').collect();
        match parts.as_slice() {
            ["ns", namespace, "gateway", gateway] => DataPlaneIdentity::new(*namespace, *gateway),
            _ => Err(wrong()),
        }
    }
}

/// `namespace/name`, as Gateways are named in logs and status.
impl fmt::Display for DataPlaneIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.gateway)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdentityError {
    #[error("certificate does not parse: {0}")]
    Certificate(String),
    #[error("certificate has no URI subjectAltName")]
    NoUri,
    #[error("certificate has {0} URI subjectAltNames; a data plane's has exactly one")]
    SeveralUris(usize),
    #[error(
        "{0:?} is not a Gatehouse data-plane identity (spiffe://{TRUST_DOMAIN}/ns/<namespace>/gateway/<name>)"
    )]
    NotGatehouse(String),
    #[error("namespace {name:?} {why}")]
    BadNamespace { name: String, why: &'static str },
    #[error("gateway name {name:?} {why}")]
    BadGateway { name: String, why: &'static str },
}

/// The identity in a client certificate (DER). Does not verify the certificate: the TLS
/// handshake did that against the CA.
pub fn identity_of(cert_der: &[u8]) -> Result<DataPlaneIdentity, IdentityError> {
    Ok(PeerCertificate::parse(cert_der)?.identity)
}

/// What the control plane needs of a verified client certificate: who it is, and when to
/// renew it.
#[derive(Clone, Debug)]
pub(crate) struct PeerCertificate {
    pub identity: DataPlaneIdentity,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl PeerCertificate {
    pub fn parse(cert_der: &[u8]) -> Result<Self, IdentityError> {
        let (_, cert) = x509_parser::parse_x509_certificate(cert_der)
            .map_err(|e| IdentityError::Certificate(e.to_string()))?;
        let san = cert
            .subject_alternative_name()
            .map_err(|e| IdentityError::Certificate(e.to_string()))?;
        let uris: Vec<&str> = san
            .iter()
            .flat_map(|san| san.value.general_names.iter())
            .filter_map(|name| match name {
                GeneralName::URI(uri) => Some(*uri),
                _ => None,
            })
            .collect();
        let identity = match uris.as_slice() {
            [] => return Err(IdentityError::NoUri),
            [uri] => DataPlaneIdentity::from_uri(uri)?,
            several => return Err(IdentityError::SeveralUris(several.len())),
        };
        let validity = cert.validity();
        Ok(PeerCertificate {
            identity,
            not_before: system_time(validity.not_before.timestamp()),
            not_after: system_time(validity.not_after.timestamp()),
        })
    }
}

pub(crate) fn system_time(unix_seconds: i64) -> SystemTime {
    match u64::try_from(unix_seconds) {
        Ok(s) => UNIX_EPOCH + Duration::from_secs(s),
        Err(_) => UNIX_EPOCH,
    }
}

/// A DNS-1123 label (namespaces): at most 63 of `[a-z0-9-]`, alphanumeric at both ends.
fn check_label(name: &str) -> Result<(), &'static str> {
    if name.len() > 63 {
        return Err("is longer than 63 characters");
    }
    check_label_chars(name)
}

/// A DNS-1123 subdomain (Gateway names): at most 253 characters, labels separated by dots.
fn check_subdomain(name: &str) -> Result<(), &'static str> {
    if name.len() > 253 {
        return Err("is longer than 253 characters");
    }
    name.split('.').try_for_each(check_label_chars)
}

fn check_label_chars(label: &str) -> Result<(), &'static str> {
    let bytes = label.as_bytes();
    let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
        return Err("is empty (or has an empty label)");
    };
    if !bytes
        .iter()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
    {
        return Err("may hold only lower-case letters, digits and '-'");
    }
    if !first.is_ascii_alphanumeric() || !last.is_ascii_alphanumeric() {
        return Err("must start and end with a letter or digit");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, KeyPair, SanType};

    /// A self-signed certificate with exactly these subjectAltNames.
    fn cert_with(sans: Vec<SanType>) -> Vec<u8> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = CertificateParams::default();
        params.subject_alt_names = sans;
        params.self_signed(&key).unwrap().der().to_vec()
    }

    fn uri(text: &str) -> SanType {
        SanType::URI(text.to_string().try_into().unwrap())
    }

    #[test]
    fn reads_the_identity_back() {
        let identity = DataPlaneIdentity::new("apps", "public.edge-1").unwrap();
        assert_eq!(
            identity.uri(),
            "spiffe://gatehouse.dev/ns/apps/gateway/public.edge-1"
        );
        let der = cert_with(vec![
            SanType::DnsName("ignored.example".to_string().try_into().unwrap()),
            uri(&identity.uri()),
        ]);
        assert_eq!(identity_of(&der), Ok(identity));
    }

    #[test]
    fn refuses_other_schemes_and_trust_domains() {
        for text in [
            "https://gatehouse.dev/ns/apps/gateway/public",
            "spiffe://example.org/ns/apps/gateway/public",
            "spiffe://gatehouse.dev.example.org/ns/apps/gateway/public",
            "spiffe://gatehouse.dev/ns/apps/gateways/public",
            "spiffe://gatehouse.dev/ns/apps/gateway/public/extra",
            "spiffe://gatehouse.dev/ns/apps/gateway/",
        ] {
            let der = cert_with(vec![uri(text)]);
            assert!(identity_of(&der).is_err(), "{text}");
        }
        assert_eq!(
            identity_of(&cert_with(vec![uri("https://gatehouse.dev/x")])),
            Err(IdentityError::NotGatehouse(
                "https://gatehouse.dev/x".into()
            ))
        );
    }

    #[test]
    fn refuses_certificates_without_exactly_one_uri() {
        let a = "spiffe://gatehouse.dev/ns/apps/gateway/a";
        let b = "spiffe://gatehouse.dev/ns/apps/gateway/b";
        assert_eq!(
            identity_of(&cert_with(vec![uri(a), uri(b)])),
            Err(IdentityError::SeveralUris(2))
        );
        assert_eq!(
            identity_of(&cert_with(vec![uri(a), uri("https://example.org/")])),
            Err(IdentityError::SeveralUris(2))
        );
        assert_eq!(
            identity_of(&cert_with(Vec::new())),
            Err(IdentityError::NoUri)
        );
        assert!(matches!(
            identity_of(b"not a certificate"),
            Err(IdentityError::Certificate(_))
        ));
    }

    #[test]
    fn names_must_be_kubernetes_names() {
        let bad_namespaces = [
            "",
            "Apps",
            "apps.team",
            "-apps",
            "apps-",
            "ap_ps",
            &"a".repeat(64),
        ];
        for namespace in bad_namespaces {
            assert!(
                matches!(
                    DataPlaneIdentity::new(namespace, "public"),
                    Err(IdentityError::BadNamespace { .. })
                ),
                "{namespace:?}"
            );
        }
        let bad_gateways = [
            "",
            "Public",
            "public.",
            ".public",
            "a..b",
            "pub lic",
            "pub%2fx",
            &"a".repeat(254),
        ];
        for gateway in bad_gateways {
            assert!(
                matches!(
                    DataPlaneIdentity::new("apps", gateway),
                    Err(IdentityError::BadGateway { .. })
                ),
                "{gateway:?}"
            );
        }
        assert!(DataPlaneIdentity::new("a".repeat(63), "b".repeat(253)).is_ok());
        // A bad name inside an otherwise well-formed URI is refused too.
        let der = cert_with(vec![uri("spiffe://gatehouse.dev/ns/Apps/gateway/public")]);
        assert!(matches!(
            identity_of(&der),
            Err(IdentityError::BadNamespace { .. })
        ));
    }
}
