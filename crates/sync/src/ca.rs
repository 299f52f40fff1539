//! The control plane's own CA: it issues the control plane's server certificate and every
//! data plane's client certificate, so both ends of a stream trust exactly this CA and
//! nothing else (no system roots, no cluster CA).

use crate::credentials::Credentials;
use crate::identity::{DataPlaneIdentity, system_time};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::pem::PemObject;
use std::fmt;
use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use time::OffsetDateTime;

/// How long a generated CA is valid.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// How far notBefore lies before the moment of issuance at most, so that a node whose clock
/// is a little behind the control plane's accepts a certificate issued just now.
const MAX_BACKDATE: Duration = Duration::from_secs(60);

pub struct Ca {
    cert_pem: String,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    /// A new self-signed CA: ECDSA P-256, valid for ten years, allowed to issue end-entity
    /// certificates only (path length 0).
    pub fn generate(common_name: &str) -> Ca {
        // Generating a P-256 key and self-signing fixed parameters fails only if the crypto
        // library itself is broken; there is nothing a caller could do about it.
        let key =
            KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("generating a P-256 key");
        let mut params = CertificateParams::default();
        params.distinguished_name = common_name_dn(common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        (params.not_before, params.not_after) = validity_from_now(CA_VALIDITY);
        let cert = params.self_signed(&key).expect("self-signing the CA");
        Ca {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A CA kept from an earlier run (a Secret), so certificates issued before stay valid.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Ca, CaError> {
        let der = rustls::pki_types::CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| CaError::Certificate(e.to_string()))?;
        let (_, cert) = x509_parser::parse_x509_certificate(&der)
            .map_err(|e| CaError::Certificate(e.to_string()))?;
        if !cert.is_ca() {
            return Err(CaError::Certificate("not a CA certificate".into()));
        }
        let key = KeyPair::from_pem(key_pem).map_err(|e| CaError::Key(e.to_string()))?;
        if key.public_key_raw() != cert.public_key().subject_public_key.data.as_ref() {
            return Err(CaError::Key(
                "the key does not belong to the certificate".into(),
            ));
        }
        let issuer =
            Issuer::from_ca_cert_der(&der, key).map_err(|e| CaError::Certificate(e.to_string()))?;
        Ok(Ca {
            cert_pem: cert_pem.to_string(),
            key_pem: key_pem.to_string(),
            issuer,
        })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// The control plane's serving certificate (serverAuth only). DNS names that cannot be
    /// encoded (not ASCII) are left out with a warning: the handshake then fails for that
    /// name, which is visible, instead of the controller failing to start.
    pub fn issue_server(
        &self,
        dns_names: &[String],
        ips: &[IpAddr],
        validity: Duration,
    ) -> Credentials {
        let mut sans: Vec<SanType> = Vec::new();
        for name in dns_names {
            match name.clone().try_into() {
                Ok(ia5) => sans.push(SanType::DnsName(ia5)),
                Err(e) => {
                    tracing::warn!(%name, error = %e, "DNS name left out of the server certificate")
                }
            }
        }
        sans.extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
        let common_name = dns_names
            .first()
            .map_or("gatehouse control plane", String::as_str);
        self.issue(
            common_name,
            sans,
            ExtendedKeyUsagePurpose::ServerAuth,
            validity,
        )
    }

    /// A data plane's client certificate (clientAuth only), naming its Gateway in the URI
    /// subjectAltName.
    pub fn issue_dataplane(&self, identity: &DataPlaneIdentity, validity: Duration) -> Credentials {
        // A `DataPlaneIdentity` holds Kubernetes names only, so its URI is always ASCII.
        let uri = identity.uri().try_into().expect("identity URIs are ASCII");
        self.issue(
            &identity.to_string(),
            vec![SanType::URI(uri)],
            ExtendedKeyUsagePurpose::ClientAuth,
            validity,
        )
    }

    fn issue(
        &self,
        common_name: &str,
        sans: Vec<SanType>,
        usage: ExtendedKeyUsagePurpose,
        validity: Duration,
    ) -> Credentials {
        let key =
            KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("generating a P-256 key");
        let mut params = CertificateParams::default();
        params.distinguished_name = common_name_dn(common_name);
        params.subject_alt_names = sans;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        params.use_authority_key_identifier_extension = true;
        (params.not_before, params.not_after) = validity_from_now(validity);
        // Fails only for parameters this function never builds (or a broken crypto library).
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("signing a certificate");
        Credentials {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            ca_pem: self.cert_pem.clone(),
            not_before: system_time(params.not_before.unix_timestamp()),
            not_after: system_time(params.not_after.unix_timestamp()),
        }
    }
}

/// Never prints the private key.
impl fmt::Debug for Ca {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("CA certificate: {0}")]
    Certificate(String),
    #[error("CA key: {0}")]
    Key(String),
}

fn common_name_dn(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

/// notBefore and notAfter for a certificate issued now, in whole seconds (what X.509 keeps).
/// notBefore is backdated by up to a minute for clock skew, but by no more than half the
/// validity, so that very short-lived certificates (tests) still renew after issuance.
fn validity_from_now(validity: Duration) -> (OffsetDateTime, OffsetDateTime) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let backdate = MAX_BACKDATE.min(validity / 2).as_secs();
    let at = |secs: u64| {
        OffsetDateTime::from_unix_timestamp(i64::try_from(secs).unwrap_or(i64::MAX))
            .unwrap_or(OffsetDateTime::UNIX_EPOCH)
    };
    (
        at(now.saturating_sub(backdate)),
        at(now.saturating_add(validity.as_secs())),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::identity_of;
    use rustls::pki_types::CertificateDer;
    use x509_parser::extensions::GeneralName;
    use x509_parser::prelude::X509Certificate;

    fn leaf_der(credentials: &Credentials) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(credentials.cert_pem.as_bytes()).unwrap()
    }

    fn parse<'a>(der: &'a CertificateDer<'_>) -> X509Certificate<'a> {
        x509_parser::parse_x509_certificate(der).unwrap().1
    }

    fn now_secs() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    #[test]
    fn the_ca_is_a_p256_ca_for_ten_years() {
        let ca = Ca::generate("gatehouse CA");
        let der = CertificateDer::from_pem_slice(ca.cert_pem().as_bytes()).unwrap();
        let cert = parse(&der);
        assert!(cert.is_ca());
        assert_eq!(cert.subject().to_string(), "CN=gatehouse CA");
        let constraints = cert.basic_constraints().unwrap().unwrap().value;
        assert_eq!(constraints.path_len_constraint, Some(0));
        let usage = cert.key_usage().unwrap().unwrap().value;
        assert!(usage.key_cert_sign());
        let validity = cert.validity();
        let lifetime = validity.not_after.timestamp() - validity.not_before.timestamp();
        assert!(lifetime >= CA_VALIDITY.as_secs() as i64);
        assert_eq!(
            cert.public_key().algorithm.algorithm,
            x509_parser::oid_registry::OID_KEY_TYPE_EC_PUBLIC_KEY
        );
    }

    #[test]
    fn data_plane_certificates_are_for_clients_and_name_their_gateway() {
        let ca = Ca::generate("gatehouse CA");
        let identity = DataPlaneIdentity::new("apps", "public").unwrap();
        let credentials = ca.issue_dataplane(&identity, Duration::from_secs(3600));
        let der = leaf_der(&credentials);
        let cert = parse(&der);
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth);
        assert!(!cert.is_ca());
        assert_eq!(identity_of(&der), Ok(identity));
        assert_eq!(credentials.ca_pem, ca.cert_pem());
        // Issued by the CA: its issuer is the CA's subject and the CA's key verifies it.
        let ca_der = CertificateDer::from_pem_slice(ca.cert_pem().as_bytes()).unwrap();
        let ca_cert = parse(&ca_der);
        assert_eq!(cert.issuer(), ca_cert.subject());
        cert.verify_signature(Some(ca_cert.public_key())).unwrap();
    }

    #[test]
    fn server_certificates_are_for_servers_with_the_names_asked_for() {
        let ca = Ca::generate("gatehouse CA");
        let ip: IpAddr = "10.0.0.7".parse().unwrap();
        let names = [
            "gatehouse.gatehouse-system.svc".to_string(),
            "localhost".into(),
            "bäd".into(),
        ];
        let credentials = ca.issue_server(&names, &[ip], Duration::from_secs(3600));
        let der = leaf_der(&credentials);
        let cert = parse(&der);
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && !eku.client_auth);
        let sans: Vec<String> = cert
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names
            .iter()
            .map(|name| match name {
                GeneralName::DNSName(dns) => dns.to_string(),
                GeneralName::IPAddress(bytes) => format!("ip:{bytes:?}"),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            sans,
            [
                "gatehouse.gatehouse-system.svc",
                "localhost",
                "ip:[10, 0, 0, 7]"
            ],
            "the name that cannot be encoded is left out"
        );
    }

    #[test]
    fn validity_is_what_was_asked_with_a_little_backdating() {
        let ca = Ca::generate("gatehouse CA");
        let identity = DataPlaneIdentity::new("apps", "public").unwrap();
        let before = now_secs();
        let credentials = ca.issue_dataplane(&identity, Duration::from_secs(3600));
        let after = now_secs();
        let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_secs();
        assert!((before + 3600..=after + 3600).contains(&secs(credentials.not_after)));
        assert!((before - 60..=after - 60).contains(&secs(credentials.not_before)));
        // The certificate says the same as the struct.
        let der = leaf_der(&credentials);
        let validity = parse(&der).validity().clone();
        assert_eq!(
            validity.not_after.timestamp() as u64,
            secs(credentials.not_after)
        );
        assert_eq!(
            validity.not_before.timestamp() as u64,
            secs(credentials.not_before)
        );
        // Renewal two thirds into the lifetime, backdating included.
        assert_eq!(
            secs(credentials.renew_at()),
            secs(credentials.not_before) + (3600 + 60) * 2 / 3
        );
        // A short-lived certificate is backdated by half its validity at most.
        let short = ca.issue_dataplane(&identity, Duration::from_secs(6));
        assert_eq!(secs(short.not_after) - secs(short.not_before), 9);
    }

    #[test]
    fn a_ca_read_back_issues_certificates_its_original_verifies() {
        let original = Ca::generate("gatehouse CA");
        let restored = Ca::from_pem(original.cert_pem(), original.key_pem()).unwrap();
        assert_eq!(restored.cert_pem(), original.cert_pem());
        let identity = DataPlaneIdentity::new("apps", "public").unwrap();
        let credentials = restored.issue_dataplane(&identity, Duration::from_secs(60));
        let der = leaf_der(&credentials);
        let ca_der = CertificateDer::from_pem_slice(original.cert_pem().as_bytes()).unwrap();
        let (cert, ca_cert) = (parse(&der), parse(&ca_der));
        // Byte-identical issuer name, which is what path building compares.
        assert_eq!(cert.issuer().as_raw(), ca_cert.subject().as_raw());
        cert.verify_signature(Some(ca_cert.public_key())).unwrap();
    }

    #[test]
    fn a_ca_is_refused_with_a_key_of_another() {
        let one = Ca::generate("one");
        let two = Ca::generate("two");
        assert!(matches!(
            Ca::from_pem(one.cert_pem(), two.key_pem()),
            Err(CaError::Key(_))
        ));
        let leaf = one.issue_server(&["x".into()], &[], Duration::from_secs(60));
        assert!(matches!(
            Ca::from_pem(&leaf.cert_pem, &leaf.key_pem),
            Err(CaError::Certificate(_))
        ));
    }
}
