//! One stream to the control plane: Hello (and an Ack of what serves), then snapshots in,
//! Acks and Nacks out, Serving reports when binds change, credentials kept for reconnects.

use super::connect::{self, describe};
use super::state::ClientState;
use super::{Applier, ClientOptions};
use crate::credentials::Credentials;
use crate::identity::identity_of;
use crate::rpc::config_sync_client::ConfigSyncClient;
use crate::wire::{
    self, ControlPlaneMessage, DataPlaneMessage, UnboundListener, control_plane_message,
    data_plane_message,
};
use gatehouse_ir as ir;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::Streaming;
use tonic::codec::CompressionEncoding;

/// The largest snapshot accepted (decompressed). Generous: a Gateway with many certificates
/// is large, and the control plane is trusted.
const MAX_SNAPSHOT_BYTES: usize = 256 << 20;

pub(super) enum Outcome {
    Stopped,
    Ended { established: bool, error: String },
}

fn failed(error: String) -> Outcome {
    Outcome::Ended {
        established: false,
        error,
    }
}

pub(super) async fn run(
    options: &ClientOptions,
    applier: &dyn Applier,
    state: &ClientState,
    stop: &CancellationToken,
) -> Outcome {
    let credentials = match connect::credentials(options, state) {
        Ok(credentials) => credentials,
        Err(e) => return failed(e),
    };
    let channel = tokio::select! {
        _ = stop.cancelled() => return Outcome::Stopped,
        channel = connect::channel(options, &credentials) => match channel {
            Ok(channel) => channel,
            Err(e) => return failed(e),
        },
    };
    let mut client = ConfigSyncClient::new(channel).max_decoding_message_size(MAX_SNAPSHOT_BYTES);
    if !options.gzip_snapshots {
        // Snapshots come as JSON, which gRPC compresses per stream.
        client = client.accept_compressed(CompressionEncoding::Gzip);
    }

    // Room for the Hello and the Ack behind it, so both are queued before the stream opens.
    let (outbound, mut receiver) = mpsc::channel(8);
    let applied = state.applied_version();
    let hello = wire::Hello {
        pod: options.pod.clone(),
        build: options.build.clone(),
        current_version: applied.clone().unwrap_or_default(),
        gzip_snapshots: options.gzip_snapshots,
    };
    let _ = outbound.try_send(message(data_plane_message::Kind::Hello(hello)));
    let mut reported = applier.unbound();
    if let Some(version) = applied {
        // The Hello says what serves; the Ack completes the report (unbound listeners,
        // diagnostics) of a control plane that will not send this version again.
        let _ = outbound.try_send(ack(version, reported.clone(), state.diagnostics()));
    }
    let requests = futures_util::stream::poll_fn(move |cx| receiver.poll_recv(cx));
    let inbound = tokio::select! {
        _ = stop.cancelled() => return Outcome::Stopped,
        response = client.stream(requests) => match response {
            Ok(response) => response.into_inner(),
            Err(status) => return failed(describe(&status)),
        },
    };
    state.set_connected(true);
    tracing::info!(endpoint = %options.endpoint, "config sync stream up");

    let mut stream = Stream {
        options,
        applier,
        state,
        outbound,
        current_identity: identity_of_pem(&credentials.cert_pem),
    };
    match stream.follow(inbound, &mut reported, stop).await {
        Outcome::Stopped => Outcome::Stopped,
        Outcome::Ended { error, .. } => Outcome::Ended {
            established: true,
            error,
        },
    }
}

struct Stream<'a> {
    options: &'a ClientOptions,
    applier: &'a dyn Applier,
    state: &'a ClientState,
    outbound: mpsc::Sender<DataPlaneMessage>,
    /// Who the certificate in use says this data plane is; renewed credentials must agree.
    current_identity: Option<crate::DataPlaneIdentity>,
}

impl Stream<'_> {
    async fn follow(
        &mut self,
        mut inbound: Streaming<ControlPlaneMessage>,
        reported: &mut Vec<UnboundListener>,
        stop: &CancellationToken,
    ) -> Outcome {
        let applier = self.applier;
        let mut changed = applier.changed();
        loop {
            tokio::select! {
                biased;
                _ = stop.cancelled() => return Outcome::Stopped,
                message = inbound.message() => {
                    let message = match message {
                        Ok(Some(message)) => message,
                        Ok(None) => return ended("the control plane closed the stream".into()),
                        Err(status) => return ended(describe(&status)),
                    };
                    let sent = match message.kind {
                        Some(control_plane_message::Kind::Snapshot(snapshot)) => {
                            let reply = self.snapshot(snapshot).await;
                            if let Some(data_plane_message::Kind::Ack(ack)) = &reply.kind {
                                reported.clone_from(&ack.unbound);
                            }
                            self.outbound.send(reply).await
                        }
                        Some(control_plane_message::Kind::Credentials(credentials)) => {
                            self.credentials(credentials).await;
                            Ok(())
                        }
                        // A message kind of a newer control plane.
                        None => Ok(()),
                    };
                    if sent.is_err() {
                        return ended("the request stream closed".into());
                    }
                }
                _ = &mut changed => {
                    changed = applier.changed();
                    let unbound = applier.unbound();
                    if unbound != *reported {
                        let serving = wire::Serving { unbound: unbound.clone() };
                        if self.outbound.send(message(data_plane_message::Kind::Serving(serving))).await.is_err() {
                            return ended("the request stream closed".into());
                        }
                        *reported = unbound;
                    }
                }
            }
        }
    }

    /// Applies a snapshot (unless it is the version serving) and answers with an Ack or Nack.
    async fn snapshot(&self, snapshot: wire::Snapshot) -> DataPlaneMessage {
        let version = snapshot.version;
        if self.state.applied_version().as_deref() == Some(version.as_str()) {
            return ack(version, self.applier.unbound(), self.state.diagnostics());
        }
        // Decoding a large configuration is CPU work: off the runtime's workers.
        let decoded = tokio::task::spawn_blocking(move || {
            decode(&snapshot.config_json, &snapshot.config_gzip)
        })
        .await;
        let config = match decoded {
            Ok(Ok(config)) => config,
            Ok(Err(e)) => return nack(version, e),
            Err(e) => return nack(version, format!("decoding the snapshot: {e}")),
        };
        match self.applier.apply(Arc::new(config)).await {
            Ok(diagnostics) => {
                tracing::info!(%version, diagnostics = diagnostics.len(), "snapshot applied");
                self.state.set_applied(version.clone(), diagnostics.clone());
                ack(version, self.applier.unbound(), diagnostics)
            }
            Err(error) => {
                tracing::warn!(%version, %error, "snapshot rejected; the previous configuration keeps serving");
                nack(version, error)
            }
        }
    }

    /// Keeps renewed credentials for the next connection: in memory, and in the credentials
    /// directory when it can be written (usually it cannot: a Secret volume).
    async fn credentials(&mut self, received: wire::Credentials) {
        let credentials =
            match Credentials::from_pem(received.cert_pem, received.key_pem, received.ca_pem) {
                Ok(credentials) => credentials,
                Err(e) => {
                    tracing::warn!(error = %e, "renewed credentials refused");
                    return;
                }
            };
        let identity = identity_of_pem(&credentials.cert_pem);
        if identity.is_none() || identity != self.current_identity {
            tracing::warn!(renewed = ?identity, current = ?self.current_identity, "renewed credentials name another identity; refused");
            return;
        }
        tracing::info!(not_after = ?credentials.not_after, "received renewed credentials");
        self.state.set_credentials(credentials.clone());
        let dir = self.options.credentials_dir.clone();
        let written = tokio::task::spawn_blocking(move || credentials.write_dir(&dir)).await;
        if let Ok(Err(e)) = written {
            tracing::debug!(dir = %self.options.credentials_dir.display(), error = %e, "renewed credentials kept in memory only");
        }
    }
}

/// The configuration of a snapshot: its `config_gzip` when the control plane sent that
/// (it does to data planes that asked), else its `config_json` (older control planes).
fn decode(json: &[u8], gzip: &[u8]) -> Result<ir::Config, String> {
    let decompressed;
    let json = if gzip.is_empty() {
        json
    } else {
        decompressed = crate::compression::gunzip(gzip, MAX_SNAPSHOT_BYTES)?;
        &decompressed
    };
    serde_json::from_slice(json).map_err(|e| format!("the snapshot does not deserialize: {e}"))
}

fn ended(error: String) -> Outcome {
    Outcome::Ended {
        established: true,
        error,
    }
}

fn message(kind: data_plane_message::Kind) -> DataPlaneMessage {
    DataPlaneMessage { kind: Some(kind) }
}

fn ack(
    version: String,
    unbound: Vec<UnboundListener>,
    diagnostics: Vec<String>,
) -> DataPlaneMessage {
    message(data_plane_message::Kind::Ack(wire::Ack {
        version,
        unbound,
        diagnostics,
    }))
}

fn nack(version: String, error: String) -> DataPlaneMessage {
    message(data_plane_message::Kind::Nack(wire::Nack {
        version,
        error,
    }))
}

fn identity_of_pem(cert_pem: &str) -> Option<crate::DataPlaneIdentity> {
    let leaf = CertificateDer::from_pem_slice(cert_pem.as_bytes()).ok()?;
    identity_of(&leaf).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_decodes_from_its_gzip_or_its_json() {
        let config = ir::Config {
            gateways: vec![ir::Gateway {
                namespace: "apps".into(),
                name: "public".into(),
                listeners: Vec::new(),
            }],
            ..ir::Config::default()
        };
        let (json, _) = crate::version::encode(&config);
        let gzip = crate::compression::gzip(&json);
        assert_eq!(decode(&[], &gzip).unwrap(), config);
        // From a control plane that sends only the JSON.
        assert_eq!(decode(&json, &[]).unwrap(), config);
        // The gzip wins when both are there.
        assert_eq!(decode(b"not json", &gzip).unwrap(), config);
        let error = decode(&[], &json).unwrap_err();
        assert!(error.contains("does not decompress"), "{error}");
        let error = decode(&[], &crate::compression::gzip(b"{}")).unwrap_err();
        assert!(error.contains("does not deserialize"), "{error}");
    }
}
