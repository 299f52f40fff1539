//! TLS: certificates, per-listener server configurations, backend client configurations, the
//! ClientHello peek, and the reasons handshakes fail.
//!
//! Everything here runs at apply time except [`read_client_hello`] and [`FailureReason`], which
//! run per connection. Parsed certificates and built `ServerConfig`s are cached across applies
//! while their inputs stay the same, so an apply that only changes routes does not parse keys
//! again and keeps every listener's session cache (resumption survives unrelated changes).

use crate::Metrics;
use crate::reuse::Reuse;
use gatehouse_ir as ir;
use rustls::DistinguishedName;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{
    ResolvesClientCert, WebPkiServerVerifier, verify_server_cert_signed_by_trust_anchor,
    verify_server_name,
};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{
    Accepted, Acceptor, ClientHello, ParsedCertificate, ResolvesServerCert, WebPkiClientVerifier,
};
use rustls::sign::CertifiedKey;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, PeerIncompatible, RootCertStore,
    ServerConfig, SignatureScheme,
};
use std::collections::HashMap;
use std::hash::Hash;
use std::io;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tracing::{error, warn};

/// TLS 1.3 and 1.2 only. rustls implements nothing older, so a TLS 1.1 client is refused with
/// a `protocol_version` alert.
static VERSIONS: &[&rustls::SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];

/// A certificate chain and key from [`ir::Config::certificates`], ready to serve.
#[derive(Debug)]
pub(crate) struct LoadedCert {
    pub key: Arc<CertifiedKey>,
    /// The leaf's notAfter, Unix seconds.
    pub not_after: i64,
}

fn load_certificate(
    cert: &ir::Certificate,
    provider: &CryptoProvider,
) -> Result<LoadedCert, String> {
    let chain = CertificateDer::pem_slice_iter(cert.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("certificate PEM: {e}"))?;
    let Some(leaf) = chain.first() else {
        return Err("no certificate in the PEM data".into());
    };
    let not_after = x509_parser::parse_x509_certificate(leaf)
        .map_err(|e| format!("certificate: {e}"))?
        .1
        .validity()
        .not_after
        .timestamp();
    let key = PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes())
        .map_err(|e| format!("private key PEM: {e}"))?;
    // Also checks that the key belongs to the leaf certificate.
    let key = CertifiedKey::from_der(chain, key, provider).map_err(|e| e.to_string())?;
    Ok(LoadedCert {
        key: Arc::new(key),
        not_after,
    })
}

/// A PEM bundle of CA certificates. Unparsable entries are skipped; none usable is an error.
fn root_store(pem: &str) -> Result<RootCertStore, String> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("CA bundle PEM: {e}"))?;
    let mut roots = RootCertStore::empty();
    let (added, ignored) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(format!(
            "CA bundle has no usable certificate ({ignored} ignored)"
        ));
    }
    Ok(roots)
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

struct CachedCert {
    cert_pem: String,
    key_pem: String,
    loaded: Result<Arc<LoadedCert>, String>,
    expiry_warned: bool,
}

/// What makes two listeners' `ServerConfig`s the same. Certificates are compared by identity:
/// the cache hands out the same `Arc` while a certificate's PEM is unchanged, and the cached
/// config holds those `Arc`s, so an address cannot be reused while its entry exists.
#[derive(PartialEq, Eq, Hash)]
struct ServerKey {
    keys: Vec<usize>,
    client_ca: Option<(String, bool)>,
    http: bool,
}

/// Compile-time TLS state kept across applies (the data plane serialises applies).
pub(crate) struct TlsCache {
    pub provider: Arc<CryptoProvider>,
    certs: HashMap<String, CachedCert>,
    servers: Reuse<ServerKey, Arc<ServerConfig>>,
}

impl std::fmt::Debug for TlsCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsCache").finish_non_exhaustive()
    }
}

/// aws-lc-rs with the AES-128-GCM suites first. With `ignore_client_order` the server picks:
/// AES-128-GCM is as safe as AES-256 for TLS and its SHA-256 key schedule and transcript run
/// on the SHA extensions every current x86 and ARM server has, where SHA-384 (the AES-256
/// suite's hash) often runs in plain code: on this project's AMD hosts it was a fifth of the
/// CPU of a handshake. Only TLS 1.3 suites and ECDHE AEAD TLS 1.2 suites are offered.
pub(crate) fn crypto_provider() -> CryptoProvider {
    use rustls::crypto::aws_lc_rs::cipher_suite::*;
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    provider.cipher_suites = vec![
        TLS13_AES_128_GCM_SHA256,
        TLS13_AES_256_GCM_SHA384,
        TLS13_CHACHA20_POLY1305_SHA256,
        TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ];
    provider
}

impl Default for TlsCache {
    fn default() -> Self {
        TlsCache {
            provider: Arc::new(crypto_provider()),
            certs: HashMap::new(),
            servers: Reuse::default(),
        }
    }
}

impl TlsCache {
    /// Loads `certs` (reusing unchanged ones), logs the ones that do not load and warns about
    /// expired ones (once per certificate content), and keeps the expiry gauges in step:
    /// one per loaded certificate, removed when the certificate goes away or stops loading.
    pub(crate) fn certificates(
        &mut self,
        certs: &[ir::Certificate],
        metrics: &Metrics,
    ) -> HashMap<String, Arc<LoadedCert>> {
        let now = unix_now();
        let mut kept = HashMap::with_capacity(certs.len());
        let mut loaded = HashMap::with_capacity(certs.len());
        for cert in certs {
            let mut entry = match self.certs.remove(&cert.name) {
                Some(e) if e.cert_pem == cert.cert_pem && e.key_pem == cert.key_pem => e,
                _ => {
                    let result = load_certificate(cert, &self.provider).map(Arc::new);
                    if let Err(error) = &result {
                        error!(
                            certificate = cert.name,
                            %error,
                            "certificate cannot be loaded; listeners using only it refuse handshakes"
                        );
                    }
                    CachedCert {
                        cert_pem: cert.cert_pem.clone(),
                        key_pem: cert.key_pem.clone(),
                        loaded: result,
                        expiry_warned: false,
                    }
                }
            };
            match &entry.loaded {
                Ok(c) => {
                    if c.not_after <= now && !entry.expiry_warned {
                        warn!(
                            certificate = cert.name,
                            not_after = c.not_after,
                            "certificate has expired; it is still served"
                        );
                        entry.expiry_warned = true;
                    }
                    metrics.set_certificate_expiry(&cert.name, c.not_after);
                    loaded.insert(cert.name.clone(), c.clone());
                }
                Err(_) => metrics.remove_certificate_expiry(&cert.name),
            }
            kept.insert(cert.name.clone(), entry);
        }
        for gone in self.certs.keys() {
            if !kept.contains_key(gone) {
                metrics.remove_certificate_expiry(gone);
            }
        }
        self.certs = kept;
        loaded
    }

    /// The `ServerConfig` of a terminating listener: `keys` in preference order, optional
    /// client-certificate validation, ALPN h2 + http/1.1 when it serves HTTP (none otherwise).
    pub(crate) fn server_config(
        &mut self,
        keys: Vec<Arc<CertifiedKey>>,
        client: Option<&ir::ClientValidation>,
        http: bool,
    ) -> Result<Arc<ServerConfig>, String> {
        let key = ServerKey {
            keys: keys.iter().map(|k| Arc::as_ptr(k) as usize).collect(),
            client_ca: client.map(|c| (c.ca_pem.clone(), c.allow_insecure_fallback)),
            http,
        };
        let provider = &self.provider;
        self.servers.get_or_try(key, || {
            build_server_config(keys, client, http, provider).map(Arc::new)
        })
    }

    /// Ends an apply: configurations it did not use are dropped.
    pub(crate) fn finish(&mut self) {
        self.servers.finish();
    }
}

fn build_server_config(
    keys: Vec<Arc<CertifiedKey>>,
    client: Option<&ir::ClientValidation>,
    http: bool,
    provider: &Arc<CryptoProvider>,
) -> Result<ServerConfig, String> {
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(VERSIONS)
        .map_err(|e| e.to_string())?;
    let builder = match client {
        None => builder.with_no_client_auth(),
        Some(validation) => {
            let roots = Arc::new(root_store(&validation.ca_pem)?);
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| format!("client CA bundle: {e}"))?;
            if validation.allow_insecure_fallback {
                builder.with_client_cert_verifier(Arc::new(InsecureFallback(verifier)))
            } else {
                builder.with_client_cert_verifier(verifier)
            }
        }
    };
    let mut config = builder.with_cert_resolver(Arc::new(ListenerCerts(keys.into())));
    // The provider's order (see `crypto_provider`), not the client's.
    config.ignore_client_order = true;
    // Stateless session tickets (a random key per config, rotated by rustls every 6 hours), so
    // any number of clients can resume; the default is a server-side cache of 256 sessions,
    // which a listener's clients evict from each other once there are more than ~128 of them.
    config.ticketer = rustls::crypto::aws_lc_rs::Ticketer::new().map_err(|e| e.to_string())?;
    if http {
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    }
    Ok(config)
}

/// Client validation in mode AllowInsecureFallback: a certificate is asked for and checked, but
/// a client without one, or with one that does not verify, is served all the same (the Gateway
/// says so in its InsecureFrontendValidationMode condition). The handshake signature is still
/// checked against whatever certificate was presented: a client cannot claim a key it lacks.
#[derive(Debug)]
struct InsecureFallback(Arc<dyn ClientCertVerifier>);

impl ClientCertVerifier for InsecureFallback {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.0.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        if let Err(error) = self.0.verify_client_cert(end_entity, intermediates, now) {
            tracing::debug!(%error, "client certificate does not verify; served (insecure fallback)");
        }
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// A listener's certificates: the first whose key can sign with one of the client's offered
/// schemes (so an RSA and an ECDSA certificate can sit side by side), else the first.
#[derive(Debug)]
struct ListenerCerts(Box<[Arc<CertifiedKey>]>);

impl ResolvesServerCert for ListenerCerts {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        if let [only] = &*self.0 {
            return Some(only.clone());
        }
        let schemes = hello.signature_schemes();
        self.0
            .iter()
            .find(|k| k.key.choose_scheme(schemes).is_some())
            .or(self.0.first())
            .cloned()
    }
}

// ---------------------------------------------------------------------------------------------
// Backend TLS

/// What makes two clusters' backend TLS settings the same (see [`ServerKey`] for the pointer).
#[derive(PartialEq, Eq, Hash)]
pub(crate) struct ClientKey {
    server_name: String,
    ca_pem: Option<String>,
    sans: Vec<(bool, String)>,
    client_cert: usize,
    h2: bool,
}

impl ClientKey {
    pub(crate) fn new(
        tls: &ir::UpstreamTls,
        client_cert: Option<&Arc<CertifiedKey>>,
        h2: bool,
    ) -> Self {
        ClientKey {
            server_name: tls.server_name.clone(),
            ca_pem: tls.ca_pem.clone(),
            sans: tls
                .subject_alt_names
                .iter()
                .map(|s| match s {
                    ir::SubjectAltName::Dns(n) => (false, n.clone()),
                    ir::SubjectAltName::Uri(u) => (true, u.clone()),
                })
                .collect(),
            client_cert: client_cert.map_or(0, |k| Arc::as_ptr(k) as usize),
            h2,
        }
    }
}

/// The client side of BackendTLSPolicy: roots from the policy's CA bundle (or the compiled-in
/// Mozilla roots), SNI `server_name`, and, when the policy lists subjectAltNames, a chain
/// that must carry one of them instead of `server_name`.
pub(crate) fn client_config(
    tls: &ir::UpstreamTls,
    client_cert: Option<Arc<CertifiedKey>>,
    h2: bool,
    provider: &Arc<CryptoProvider>,
) -> Result<(ClientConfig, ServerName<'static>), String> {
    let server_name = ServerName::try_from(tls.server_name.clone())
        .map_err(|e| format!("server name {:?}: {e}", tls.server_name))?;
    let roots = Arc::new(match &tls.ca_pem {
        Some(pem) => root_store(pem)?,
        None => RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        },
    });
    let verifier: Arc<dyn ServerCertVerifier> = if tls.subject_alt_names.is_empty() {
        WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(|e| e.to_string())?
    } else {
        Arc::new(SanVerifier {
            roots,
            algorithms: provider.signature_verification_algorithms,
            names: tls.subject_alt_names.clone(),
        })
    };
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(VERSIONS)
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut config = match client_cert {
        Some(key) => builder.with_client_cert_resolver(Arc::new(FixedClientCert(key))),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![if h2 {
        b"h2".to_vec()
    } else {
        b"http/1.1".to_vec()
    }];
    Ok((config, server_name))
}

#[derive(Debug)]
struct FixedClientCert(Arc<CertifiedKey>);

impl ResolvesClientCert for FixedClientCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// Verifies the chain like the standard verifier (trust anchors, validity, server-auth usage),
/// then accepts the end-entity certificate if it carries any of the expected subjectAltNames:
/// DNS names with the usual wildcard rules, URIs compared exactly.
#[derive(Debug)]
struct SanVerifier {
    roots: Arc<RootCertStore>,
    algorithms: WebPkiSupportedAlgorithms,
    names: Vec<ir::SubjectAltName>,
}

fn uri_sans(der: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Vec::new();
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::URI(u) => Some((*u).to_owned()),
            _ => None,
        })
        .collect()
}

impl ServerCertVerifier for SanVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.algorithms.all,
        )?;
        let mut uris: Option<Vec<String>> = None;
        for name in &self.names {
            let ok = match name {
                ir::SubjectAltName::Dns(dns) => ServerName::try_from(dns.as_str())
                    .is_ok_and(|n| verify_server_name(&cert, &n).is_ok()),
                ir::SubjectAltName::Uri(uri) => uris
                    .get_or_insert_with(|| uri_sans(end_entity))
                    .iter()
                    .any(|u| u == uri),
            };
            if ok {
                return Ok(ServerCertVerified::assertion());
            }
        }
        Err(rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName,
        ))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

// ---------------------------------------------------------------------------------------------
// Per connection

/// Why a TLS connection was refused before it carried any data; the `reason` label of
/// `gatehouse_tls_handshake_failures_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FailureReason {
    /// No listener serves the SNI name, or its certificate did not load.
    NoCertificate,
    /// mTLS: the client sent no certificate where one is required, or an invalid one.
    BadClientCertificate,
    /// The client offered nothing newer than TLS 1.1.
    ProtocolVersion,
    /// No TLSRoute (or usable backend) for the SNI name on a TLS listener.
    NoRoute,
    /// ClientHello or handshake not finished within the handshake timeout.
    Timeout,
    Other,
}

impl FailureReason {
    pub(crate) const ALL: [FailureReason; 6] = [
        FailureReason::NoCertificate,
        FailureReason::BadClientCertificate,
        FailureReason::ProtocolVersion,
        FailureReason::NoRoute,
        FailureReason::Timeout,
        FailureReason::Other,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            FailureReason::NoCertificate => "no_certificate",
            FailureReason::BadClientCertificate => "bad_client_certificate",
            FailureReason::ProtocolVersion => "protocol_version",
            FailureReason::NoRoute => "no_route",
            FailureReason::Timeout => "timeout",
            FailureReason::Other => "other",
        }
    }

    pub(crate) fn of_tls(error: &rustls::Error) -> Self {
        match error {
            rustls::Error::NoCertificatesPresented | rustls::Error::InvalidCertificate(_) => {
                FailureReason::BadClientCertificate
            }
            rustls::Error::PeerIncompatible(
                PeerIncompatible::Tls12NotOffered
                | PeerIncompatible::Tls12NotOfferedOrEnabled
                | PeerIncompatible::SupportedVersionsExtensionRequired,
            ) => FailureReason::ProtocolVersion,
            _ => FailureReason::Other,
        }
    }

    /// tokio-rustls reports handshake errors as `io::Error`s wrapping the rustls error.
    pub(crate) fn of_io(error: &io::Error) -> Self {
        error
            .get_ref()
            .and_then(|e| e.downcast_ref::<rustls::Error>())
            .map_or(FailureReason::Other, FailureReason::of_tls)
    }
}

/// Upper bound on what is buffered before the ClientHello is complete (rustls refuses
/// handshake messages beyond 64 KiB anyway).
const MAX_CLIENT_HELLO: usize = 64 * 1024 + 1024;

pub(crate) enum HelloError {
    /// The client closed (or reset) before a ClientHello arrived.
    Closed {
        empty: bool,
    },
    /// Not TLS, or a malformed ClientHello; the alert has been sent.
    Tls(rustls::Error),
    /// A ClientHello of TLS 1.1 or older; a `protocol_version` alert has been sent.
    TooOld,
    TooLarge,
}

/// Reads until a whole ClientHello has arrived, without answering it. `seen` receives every
/// byte read, so a passthrough listener can replay them to its backend; a terminating one
/// continues the handshake from the returned [`Accepted`].
pub(crate) async fn read_client_hello<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    seen: &mut Vec<u8>,
) -> Result<Accepted, HelloError> {
    let mut acceptor = Acceptor::default();
    let mut chunk = [0u8; 2048];
    loop {
        if seen.len() > MAX_CLIENT_HELLO {
            return Err(HelloError::TooLarge);
        }
        let n = match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => {
                return Err(HelloError::Closed {
                    empty: seen.is_empty(),
                });
            }
            Ok(n) => n,
        };
        seen.extend_from_slice(&chunk[..n]);
        // The acceptor buffers what it has not processed yet; it goes on into the connection.
        let mut rd = &chunk[..n];
        while !rd.is_empty() {
            match acceptor.read_tls(&mut rd) {
                Ok(0) | Err(_) => return Err(HelloError::TooLarge),
                Ok(_) => {}
            }
        }
        match acceptor.accept() {
            Ok(Some(accepted)) => return Ok(accepted),
            Ok(None) => {}
            Err((error, mut alert)) => {
                // rustls refuses a pre-1.2 ClientHello already here (it lacks extensions that
                // rustls requires), with a generic alert: say what is really wrong.
                if offers_below_tls12(seen) {
                    send_alert(stream, ALERT_PROTOCOL_VERSION).await;
                    return Err(HelloError::TooOld);
                }
                let mut out = Vec::new();
                let _ = alert.write_all(&mut out);
                let _ = stream.write_all(&out).await;
                return Err(HelloError::Tls(error));
            }
        }
    }
}

/// Whether `record` starts with a ClientHello whose `legacy_version` is below TLS 1.2. TLS 1.2
/// and 1.3 clients both put 0x0303 there (1.3 negotiates through an extension).
fn offers_below_tls12(record: &[u8]) -> bool {
    // Record header (type 22, version, length), then handshake header (type 1, length).
    match record {
        [0x16, _, _, _, _, 0x01, _, _, _, major, minor, ..] => (*major, *minor) < (3, 3),
        _ => false,
    }
}

/// TLS alert descriptions we send ourselves when refusing after the ClientHello.
pub(crate) const ALERT_HANDSHAKE_FAILURE: u8 = 40;
pub(crate) const ALERT_PROTOCOL_VERSION: u8 = 70;

/// A fatal alert record in the clear, as sent before any ServerHello.
pub(crate) async fn send_alert<S: AsyncWrite + Unpin>(stream: &mut S, description: u8) {
    let record = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, description];
    let _ = stream.write_all(&record).await;
    let _ = stream.shutdown().await;
}

/// Refuse a server name nothing here serves (no listener, no TLSRoute, no backend): close the
/// connection without an alert, as a passthrough proxy that cannot speak TLS would, and as the
/// conformance suite expects (EOF or reset, not an `unrecognized_name` alert).
pub(crate) async fn refuse_name<S: AsyncWrite + Unpin>(stream: &mut S) {
    let _ = stream.shutdown().await;
}

/// The SNI name as the router wants it: lower case, no trailing dot; empty when absent.
pub(crate) fn sni_of(hello: &ClientHello<'_>) -> Box<str> {
    hello
        .server_name()
        .map(|n| {
            n.trim_end_matches('.')
                .to_ascii_lowercase()
                .into_boxed_str()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_pre_tls12_client_hellos() {
        let hello = |major, minor| [0x16, 3, 1, 0, 100, 1, 0, 0, 96, major, minor, 0xaa];
        assert!(offers_below_tls12(&hello(3, 2)));
        assert!(offers_below_tls12(&hello(3, 1)));
        assert!(!offers_below_tls12(&hello(3, 3)));
        assert!(!offers_below_tls12(b"GET / HTTP/1.1\r\n"));
        assert!(!offers_below_tls12(&[0x16, 3, 1]));
    }

    #[test]
    fn failure_reasons_from_rustls_errors() {
        use FailureReason as R;
        assert_eq!(
            R::of_tls(&rustls::Error::NoCertificatesPresented),
            R::BadClientCertificate
        );
        assert_eq!(
            R::of_tls(&rustls::Error::InvalidCertificate(
                CertificateError::UnknownIssuer
            )),
            R::BadClientCertificate
        );
        assert_eq!(
            R::of_tls(&rustls::Error::PeerIncompatible(
                PeerIncompatible::Tls12NotOffered
            )),
            R::ProtocolVersion
        );
        assert_eq!(R::of_tls(&rustls::Error::DecryptError), R::Other);
        let wrapped = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::NoCertificatesPresented,
        );
        assert_eq!(R::of_io(&wrapped), R::BadClientCertificate);
        assert_eq!(
            R::of_io(&io::Error::from(io::ErrorKind::ConnectionReset)),
            R::Other
        );
    }
}
