//! The data planes' bootstrap credentials: a certificate naming the Gateway, issued by the
//! control plane's CA and handed to the pods in a Secret of the Gateway's namespace. The
//! provisioner only stores them; issuing is the CA's (`gatehouse-sync`), behind a trait so
//! that the provisioner does not depend on how certificates are made.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A data plane's certificate, its key and the CA that verifies the control plane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssuedCredentials {
    pub cert_pem: String,
    pub key_pem: String,
    pub ca_pem: String,
    /// When to issue again (two thirds of the lifetime).
    pub renew_at: SystemTime,
}

pub trait CredentialsIssuer: Send + Sync + 'static {
    /// Credentials for the data plane of Gateway `namespace/name`.
    fn issue(&self, namespace: &str, name: &str) -> Result<IssuedCredentials, String>;
}

/// When the certificate in `cert_pem` is due for renewal (two thirds of its lifetime), or
/// `None` if it cannot be read (it is then issued again).
pub fn renew_at(cert_pem: &[u8]) -> Option<SystemTime> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem).ok()?;
    let cert = pem.parse_x509().ok()?;
    let validity = cert.validity();
    let from = u64::try_from(validity.not_before.timestamp()).ok()?;
    let until = u64::try_from(validity.not_after.timestamp()).ok()?;
    let renew = from + until.checked_sub(from)? * 2 / 3;
    Some(UNIX_EPOCH + Duration::from_secs(renew))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_is_due_after_two_thirds_of_the_lifetime() {
        let mut params = rcgen::CertificateParams::new(vec!["x".into()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2026, 1, 1);
        params.not_after = rcgen::date_time_ymd(2026, 1, 31);
        let key = rcgen::KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        let renew = renew_at(pem.as_bytes()).unwrap();
        let start = UNIX_EPOCH + Duration::from_secs(1_767_225_600); // 2026-01-01
        assert_eq!(
            renew.duration_since(start).unwrap(),
            Duration::from_secs(20 * 86_400)
        );
        assert_eq!(renew_at(b"not a certificate"), None);
    }
}
