//! A certificate, its key and the CA that verifies the other side: what either end of the
//! stream presents, and what a data plane keeps on disk.

use crate::identity::system_time;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

/// File names in a credentials directory: those of a `kubernetes.io/tls` Secret plus `ca.crt`.
pub const CERT_FILE: &str = "tls.crt";
pub const KEY_FILE: &str = "tls.key";
pub const CA_FILE: &str = "ca.crt";

#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The certificate chain, leaf first.
    pub cert_pem: String,
    /// PKCS#8 private key of the leaf.
    pub key_pem: String,
    /// The CA that verifies the other end.
    pub ca_pem: String,
    /// The leaf's notBefore (an addition to the brief: [`Credentials::renew_at`] needs the
    /// whole lifetime, and issuance backdates notBefore for clock skew).
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl Credentials {
    /// When to replace these: two thirds into the certificate's lifetime, which leaves a third
    /// for the renewal to arrive and for a reconnect with it.
    pub fn renew_at(&self) -> SystemTime {
        renew_time(self.not_before, self.not_after)
    }

    /// Reads the validity from the leaf, and checks that the key belongs to it and that the
    /// CA parses, so that bad credentials fail here and not in a handshake later.
    pub fn from_pem(
        cert_pem: impl Into<String>,
        key_pem: impl Into<String>,
        ca_pem: impl Into<String>,
    ) -> Result<Self, CredentialsError> {
        let (cert_pem, key_pem, ca_pem) = (cert_pem.into(), key_pem.into(), ca_pem.into());
        let chain = parse_chain(&cert_pem)?;
        let (_, leaf) = x509_parser::parse_x509_certificate(&chain[0])
            .map_err(|e| CredentialsError::Certificate(e.to_string()))?;
        let validity = leaf.validity();
        let credentials = Credentials {
            not_before: system_time(validity.not_before.timestamp()),
            not_after: system_time(validity.not_after.timestamp()),
            cert_pem,
            key_pem,
            ca_pem,
        };
        credentials.certified_key()?;
        if credentials.ca_certificates()?.is_empty() {
            return Err(CredentialsError::Ca(
                "no certificate in the CA bundle".into(),
            ));
        }
        Ok(credentials)
    }

    /// Reads `tls.crt`, `tls.key` and `ca.crt` from `dir`.
    pub fn read_dir(dir: &Path) -> Result<Self, CredentialsError> {
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name)).map_err(|e| CredentialsError::Io {
                path: dir.join(name).display().to_string(),
                error: e.to_string(),
            })
        };
        Credentials::from_pem(read(CERT_FILE)?, read(KEY_FILE)?, read(CA_FILE)?)
    }

    /// Writes the three files into `dir`, each through a temporary file and a rename, so a
    /// reader never sees half a file. The key is written last-but-one and the certificate last:
    /// a crash in between leaves a key that does not match, which [`Credentials::read_dir`]
    /// refuses instead of presenting.
    pub fn write_dir(&self, dir: &Path) -> std::io::Result<()> {
        for (name, content) in [
            (CA_FILE, &self.ca_pem),
            (KEY_FILE, &self.key_pem),
            (CERT_FILE, &self.cert_pem),
        ] {
            let tmp = dir.join(format!(".{name}.tmp"));
            std::fs::write(&tmp, content)?;
            std::fs::rename(&tmp, dir.join(name))?;
        }
        Ok(())
    }

    /// The chain and key as rustls presents them; fails when the key is not the leaf's.
    pub(crate) fn certified_key(
        &self,
    ) -> Result<Arc<rustls::sign::CertifiedKey>, CredentialsError> {
        let chain = parse_chain(&self.cert_pem)?;
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .map_err(|e| CredentialsError::Key(e.to_string()))?;
        let provider = rustls::crypto::aws_lc_rs::default_provider();
        rustls::sign::CertifiedKey::from_der(chain, key, &provider)
            .map(Arc::new)
            .map_err(|e| CredentialsError::Key(e.to_string()))
    }

    pub(crate) fn ca_certificates(&self) -> Result<Vec<CertificateDer<'static>>, CredentialsError> {
        CertificateDer::pem_slice_iter(self.ca_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| CredentialsError::Ca(e.to_string()))
    }
}

/// Two thirds into the lifetime `not_before..not_after`.
pub(crate) fn renew_time(not_before: SystemTime, not_after: SystemTime) -> SystemTime {
    let lifetime = not_after.duration_since(not_before).unwrap_or_default();
    not_before + lifetime * 2 / 3
}

fn parse_chain(cert_pem: &str) -> Result<Vec<CertificateDer<'static>>, CredentialsError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CredentialsError::Certificate(e.to_string()))?;
    if chain.is_empty() {
        return Err(CredentialsError::Certificate(
            "no certificate in PEM".into(),
        ));
    }
    Ok(chain)
}

/// Never prints the private key.
impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum CredentialsError {
    #[error("certificate: {0}")]
    Certificate(String),
    #[error("private key: {0}")]
    Key(String),
    #[error("CA bundle: {0}")]
    Ca(String),
    #[error("reading {path}: {error}")]
    Io { path: String, error: String },
}
