//! Certificates made at test time with rcgen: a private CA, server leaves, client
//! certificates, and the rustls pieces to use them.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SerialNumber,
};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use std::sync::Arc;

/// A certificate chain and its key, in PEM.
#[derive(Clone, Debug)]
pub struct Pair {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Pair {
    pub fn chain(&self) -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap()
    }

    pub fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).unwrap()
    }

    /// The certificate as the IR carries it, under `name`.
    pub fn certificate(&self, name: &str) -> gatehouse_ir::Certificate {
        gatehouse_ir::Certificate {
            name: name.into(),
            cert_pem: self.cert_pem.clone(),
            key_pem: self.key_pem.clone(),
        }
    }

    /// A `kubernetes.io/tls` Secret holding the pair, as YAML.
    pub fn secret_yaml(&self, namespace: &str, name: &str) -> String {
        let indent = |pem: &str| {
            pem.lines()
                .map(|l| format!("    {l}\n"))
                .collect::<String>()
        };
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: {namespace}}}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}",
            indent(&self.cert_pem),
            indent(&self.key_pem)
        )
    }
}

/// A throwaway certificate authority.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pub pem: String,
}

pub fn dn(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn
}

impl Ca {
    pub fn new(cn: &str) -> Ca {
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(cn);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let pem = issuer.pem();
        Ca { issuer, pem }
    }

    pub fn issue(&self, params: CertificateParams) -> Pair {
        self.issue_with(params, KeyPair::generate().unwrap())
    }

    pub fn issue_with(&self, params: CertificateParams, key: KeyPair) -> Pair {
        let issuer: &Issuer<'_, KeyPair> = &self.issuer;
        let cert = params.signed_by(&key, issuer).unwrap();
        Pair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// Parameters of a server leaf for `names` (the first is also the common name).
    pub fn server_params(names: &[&str], serial: u64) -> CertificateParams {
        let mut params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name = dn(names[0]);
        params.serial_number = Some(SerialNumber::from(serial));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params
    }

    pub fn server(&self, names: &[&str], serial: u64) -> Pair {
        self.issue(Ca::server_params(names, serial))
    }

    pub fn client(&self, cn: &str) -> Pair {
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(cn);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params)
    }
}

/// The crypto provider Gatehouse uses.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// A root store of every certificate in `pems`.
pub fn roots(pems: &[&str]) -> RootCertStore {
    let mut roots = RootCertStore::empty();
    for pem in pems {
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
    }
    roots
}

/// A client trusting `ca_pems`, offering `alpn`, presenting `client_cert` if given.
pub fn client_config(
    ca_pems: &[&str],
    alpn: &[&[u8]],
    client_cert: Option<&Pair>,
) -> Arc<rustls::ClientConfig> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots(ca_pems));
    let mut config = match client_cert {
        Some(pair) => builder
            .with_client_auth_cert(pair.chain(), pair.key())
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// A server presenting `pair`, offering `alpn`, asking for (not requiring) a client
/// certificate issued by `client_ca` if given.
pub fn server_config(pair: &Pair, client_ca: Option<&str>, alpn: &[&[u8]]) -> Arc<ServerConfig> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        Some(pem) => builder.with_client_cert_verifier(
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots(&[pem])), provider())
                .allow_unauthenticated()
                .build()
                .unwrap(),
        ),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(pair.chain(), pair.key()).unwrap();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// Accepts any server certificate (to look at an expired one, or at which key a server picks)
/// and offers `.0` in signature_algorithms, like a client that can verify only some key types.
#[derive(Debug)]
pub struct AcceptAnything(pub Vec<SignatureScheme>);

impl AcceptAnything {
    /// Offering every scheme the provider verifies.
    pub fn all_schemes() -> Self {
        AcceptAnything(
            provider()
                .signature_verification_algorithms
                .supported_schemes(),
        )
    }
}

impl ServerCertVerifier for AcceptAnything {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_leaves_chain_to_their_ca() {
        let ca = Ca::new("test ca");
        let leaf = ca.server(&["a.example.com"], 7);
        let roots = roots(&[&ca.pem]);
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            provider(),
        )
        .build()
        .unwrap();
        let chain = leaf.chain();
        let name = rustls::pki_types::ServerName::try_from("a.example.com").unwrap();
        let now = rustls::pki_types::UnixTime::now();
        use rustls::client::danger::ServerCertVerifier;
        verifier
            .verify_server_cert(&chain[0], &chain[1..], &name, &[], now)
            .expect("the leaf verifies against its CA");
        let other = Ca::new("other ca");
        let roots = roots_of(&other);
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            provider(),
        )
        .build()
        .unwrap();
        assert!(
            verifier
                .verify_server_cert(&chain[0], &chain[1..], &name, &[], now)
                .is_err()
        );
    }

    fn roots_of(ca: &Ca) -> RootCertStore {
        roots(&[&ca.pem])
    }
}
