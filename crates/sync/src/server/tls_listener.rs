//! Accepting data-plane connections: TLS 1.3 with a client certificate the CA issued, and a
//! serving certificate that can be replaced while running.
//!
//! The TLS handshake is done here rather than by tonic's `ServerTlsConfig`, because tonic's
//! identity is fixed when the server starts and the control plane's certificate must rotate.
//! Handshakes run in tasks of their own, so one slow or silent client never holds up the
//! accept loop.

use super::{ConfigServer, Counters};
use crate::ca::Ca;
use crate::credentials::{Credentials, CredentialsError};
use futures_util::Stream;
use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

/// The serving certificate, swapped in place; each handshake reads the current one.
#[derive(Debug, Default)]
pub(crate) struct ServerCertResolver {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl ServerCertResolver {
    pub fn set(&self, credentials: &Credentials) -> Result<(), CredentialsError> {
        let key = credentials.certified_key()?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Some(key);
        Ok(())
    }
}

impl ResolvesServerCert for ServerCertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// TLS 1.3 only (both ends are Gatehouse), HTTP/2 only, client certificates required and
/// verified against the CA alone (clientAuth EKU, validity).
pub(crate) fn server_config(
    ca: &Ca,
    certificate: Arc<ServerCertResolver>,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.cert_pem().as_bytes()) {
        roots.add(cert?)?;
    }
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone()).build()?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(certificate);
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// Connections that completed the handshake, until `stop`.
pub(crate) fn incoming(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    handshake_timeout: Duration,
    server: Arc<ConfigServer>,
    stop: CancellationToken,
) -> impl Stream<Item = Result<TlsStream<TcpStream>, std::io::Error>> {
    let (sender, receiver) = mpsc::channel(16);
    tokio::spawn(accept_loop(
        listener,
        TlsAcceptor::from(tls),
        handshake_timeout,
        server,
        sender,
        stop,
    ));
    futures_util::stream::unfold(receiver, |mut receiver| async move {
        let connection = receiver.recv().await?;
        Some((Ok(connection), receiver))
    })
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    handshake_timeout: Duration,
    server: Arc<ConfigServer>,
    sender: mpsc::Sender<TlsStream<TcpStream>>,
    stop: CancellationToken,
) {
    // Dropping the set (on stop) aborts handshakes still in progress.
    let mut handshakes = JoinSet::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            Some(_) = handshakes.join_next(), if !handshakes.is_empty() => {}
            accepted = listener.accept() => {
                let (tcp, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors, say: pause instead of spinning.
                        tracing::warn!(error = %e, "accepting a config sync connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                let acceptor = acceptor.clone();
                let sender = sender.clone();
                let server = server.clone();
                handshakes.spawn(async move {
                    match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let _ = sender.send(tls).await;
                        }
                        Ok(Err(e)) => {
                            Counters::add(&server.counters.handshake_failures);
                            tracing::info!(%peer, error = %e, "config sync handshake failed");
                        }
                        Err(_) => {
                            Counters::add(&server.counters.handshake_failures);
                            tracing::info!(%peer, "config sync handshake timed out");
                        }
                    }
                });
            }
        }
    }
}
