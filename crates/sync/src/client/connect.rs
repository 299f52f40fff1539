//! One connection to the control plane: TLS 1.3 with the data plane's client certificate,
//! trusting the control plane's CA only, with HTTP/2 keep-alive.

use super::ClientOptions;
use super::state::ClientState;
use crate::credentials::Credentials;
use crate::keepalive;
use std::error::Error;
use std::time::Duration;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The credentials to connect with: the newer of those received on a stream and those in
/// the directory (which a Secret update may have refreshed), by notAfter.
pub(super) fn credentials(
    options: &ClientOptions,
    state: &ClientState,
) -> Result<Credentials, String> {
    let on_disk = Credentials::read_dir(&options.credentials_dir);
    match (state.credentials(), on_disk) {
        (Some(received), Ok(on_disk)) if on_disk.not_after > received.not_after => Ok(on_disk),
        (Some(received), _) => Ok(received),
        (None, Ok(on_disk)) => Ok(on_disk),
        (None, Err(e)) => Err(format!("no credentials: {e}")),
    }
}

pub(super) async fn channel(
    options: &ClientOptions,
    credentials: &Credentials,
) -> Result<Channel, String> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&credentials.ca_pem))
        .identity(Identity::from_pem(
            &credentials.cert_pem,
            &credentials.key_pem,
        ))
        .domain_name(options.server_name.clone());
    let endpoint = Endpoint::from_shared(options.endpoint.clone())
        .map_err(|e| format!("endpoint {:?}: {}", options.endpoint, chain(&e)))?
        .tls_config(tls)
        .map_err(|e| format!("TLS: {}", chain(&e)))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(keepalive::INTERVAL)
        .keep_alive_timeout(keepalive::TIMEOUT)
        // The stream is idle between snapshots, which is exactly when a dead peer must
        // still be noticed.
        .keep_alive_while_idle(true);
    endpoint
        .connect()
        .await
        .map_err(|e| format!("connecting to {}: {}", options.endpoint, chain(&e)))
}

/// An error and its sources, `: `-separated: tonic's own messages ("transport error") say
/// little without the causes beneath them.
pub(super) fn chain(error: &dyn Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// A status as one line: code, message and, for transport failures, the causes.
pub(super) fn describe(status: &tonic::Status) -> String {
    let mut text = format!("{:?}: {}", status.code(), status.message());
    if let Some(source) = status.source() {
        text.push_str(": ");
        text.push_str(&chain(source));
    }
    text
}
