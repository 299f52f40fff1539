//! One data-plane stream on the control plane: waits for Hello, then sends its Gateway's
//! latest snapshot whenever it changes (and there is room to send), renews the client
//! certificate before it expires, and folds Acks, Nacks and Serving reports into the
//! replica's report, which disappears when the stream ends.

use super::registry::{Published, StreamKey};
use super::{ConfigServer, Counters, NOT_LEADER, ReplicaReport};
use crate::credentials::{Credentials, renew_time};
use crate::identity::PeerCertificate;
use crate::wire::{
    self, ControlPlaneMessage, DataPlaneMessage, control_plane_message, data_plane_message,
};
use bytes::Bytes;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::{Status, Streaming};

type Outbound = mpsc::Sender<Result<ControlPlaneMessage, Status>>;

/// How long a closing status may wait for room in a stream the data plane does not read.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

pub(crate) async fn run(
    server: Arc<ConfigServer>,
    peer: PeerCertificate,
    remote: Option<SocketAddr>,
    mut inbound: Streaming<DataPlaneMessage>,
    outbound: Outbound,
    stop: CancellationToken,
) {
    let gateway = peer.identity.clone();
    let hello = match tokio::time::timeout(server.options.hello_timeout, inbound.message()).await {
        Ok(Ok(Some(DataPlaneMessage {
            kind: Some(data_plane_message::Kind::Hello(hello)),
        }))) if !hello.pod.is_empty() => hello,
        Ok(Ok(Some(_))) => {
            let status = Status::invalid_argument("the first message must be a Hello with a pod");
            close(&outbound, status).await;
            return;
        }
        Ok(Ok(None) | Err(_)) => return,
        Err(_) => {
            close(&outbound, Status::deadline_exceeded("no Hello")).await;
            return;
        }
    };
    let serving = Some(hello.current_version).filter(|v| !v.is_empty());
    let gzip_snapshots = hello.gzip_snapshots;
    let report = ReplicaReport::new(hello.build, serving.clone());
    let (key, published) = server.registry.register(&gateway, &hello.pod, report);
    tracing::info!(%gateway, pod = %key.pod, ?remote, ?serving, "data plane connected");
    let mut session = Session {
        renew_at: instant_of(renew_time(peer.not_before, peer.not_after)),
        server: server.clone(),
        key,
        inbound,
        outbound,
        published,
        sent: serving,
        gzip_snapshots,
        credentials: None,
    };
    let end = session.follow(&stop).await;
    server.registry.unregister(&session.key);
    tracing::info!(%gateway, pod = %session.key.pod, ?remote, reason = %end, "data plane disconnected");
}

struct Session {
    server: Arc<ConfigServer>,
    key: StreamKey,
    inbound: Streaming<DataPlaneMessage>,
    outbound: Outbound,
    published: watch::Receiver<Published>,
    /// The version this stream's data plane has (its Hello's, then the last sent).
    sent: Option<String>,
    /// The data plane reads `config_gzip` (its Hello said so).
    gzip_snapshots: bool,
    /// Renewed credentials waiting for room in the stream.
    credentials: Option<wire::Credentials>,
    renew_at: Instant,
}

/// Why a stream ended, for the log.
enum End {
    Stopped,
    NotLeader,
    GatewayRemoved,
    DataPlaneClosed,
    Failed(String),
}

impl std::fmt::Display for End {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            End::Stopped => f.write_str(super::STOPPING),
            End::NotLeader => f.write_str(NOT_LEADER),
            End::GatewayRemoved => f.write_str("Gateway removed"),
            End::DataPlaneClosed => f.write_str("closed by the data plane"),
            End::Failed(why) => f.write_str(why),
        }
    }
}

impl Session {
    async fn follow(&mut self, stop: &CancellationToken) -> End {
        let mut accepting = self.server.accepting.subscribe();
        // The current snapshot is due at once (unless the Hello named it).
        let mut snapshot_due = true;
        // A second handle, so that a send permit borrows it and not `self`.
        let outbound = self.outbound.clone();
        loop {
            let sending = snapshot_due || self.credentials.is_some();
            tokio::select! {
                biased;
                _ = stop.cancelled() => {
                    close(&self.outbound, Status::unavailable(super::STOPPING)).await;
                    return End::Stopped;
                }
                // Mapped to `()`: the guard `wait_for` returns must not live across an await.
                _ = async { accepting.wait_for(|accepting| !*accepting).await.map(|_| ()) } => {
                    close(&self.outbound, Status::unavailable(NOT_LEADER)).await;
                    return End::NotLeader;
                }
                message = self.inbound.message() => match message {
                    Ok(Some(message)) => {
                        if let Err(status) = self.received(message) {
                            let why = status.message().to_string();
                            close(&self.outbound, status).await;
                            return End::Failed(why);
                        }
                    }
                    Ok(None) => return End::DataPlaneClosed,
                    Err(status) => return End::Failed(status.to_string()),
                },
                changed = self.published.changed(), if !snapshot_due => {
                    // An error means the Gateway's entry is gone: removed (the value says
                    // so), or forgotten after a newer stream of the same pod replaced this
                    // one's report, which leaves this stream nothing to follow.
                    if changed.is_err() && !matches!(*self.published.borrow(), Published::Removed) {
                        return End::Failed("replaced by a newer stream of the same pod".into());
                    }
                    snapshot_due = true;
                }
                permit = outbound.reserve(), if sending => {
                    let Ok(permit) = permit else {
                        return End::Failed("response stream dropped".into());
                    };
                    if let Some(credentials) = self.credentials.take() {
                        permit.send(Ok(message(control_plane_message::Kind::Credentials(credentials))));
                        continue;
                    }
                    snapshot_due = false;
                    // The latest, read only now that it can be sent: latest wins.
                    let published = self.published.borrow_and_update().clone();
                    match published {
                        Published::Pending => {}
                        Published::Removed => {
                            permit.send(Err(Status::not_found("the Gateway was removed")));
                            return End::GatewayRemoved;
                        }
                        Published::Snapshot(snapshot) => {
                            if self.sent.as_deref() != Some(snapshot.version.as_str()) {
                                tracing::debug!(gateway = %self.key.identity, pod = %self.key.pod, version = %snapshot.version, "sending snapshot");
                                // Reference counts, not copies: every stream of the
                                // Gateway sends the same bytes, compressed once.
                                let (config_json, config_gzip) = if self.gzip_snapshots {
                                    (Bytes::new(), snapshot.gzip.clone())
                                } else {
                                    (snapshot.json.clone(), Bytes::new())
                                };
                                Counters::add(&self.server.counters.snapshots_sent);
                                if !config_gzip.is_empty() {
                                    Counters::add(&self.server.counters.snapshots_sent_gzip);
                                }
                                permit.send(Ok(message(control_plane_message::Kind::Snapshot(
                                    wire::Snapshot {
                                        version: snapshot.version.clone(),
                                        config_json,
                                        config_gzip,
                                    },
                                ))));
                                self.sent = Some(snapshot.version.clone());
                            }
                        }
                    }
                }
                _ = tokio::time::sleep_until(self.renew_at) => self.renew(),
            }
        }
    }

    fn received(&mut self, message: DataPlaneMessage) -> Result<(), Status> {
        let registry = &self.server.registry;
        match message.kind {
            Some(data_plane_message::Kind::Hello(_)) => {
                return Err(Status::invalid_argument("Hello is sent once per stream"));
            }
            Some(data_plane_message::Kind::Ack(ack)) => {
                Counters::add(&self.server.counters.acks);
                registry.update(&self.key, |report| {
                    report.acked = Some(ack.version);
                    report.rejected = None;
                    report.unbound = ack.unbound;
                    report.diagnostics = ack.diagnostics;
                });
            }
            Some(data_plane_message::Kind::Nack(nack)) => {
                Counters::add(&self.server.counters.nacks);
                tracing::warn!(gateway = %self.key.identity, pod = %self.key.pod, version = %nack.version, error = %nack.error, "data plane rejected a snapshot");
                registry.update(&self.key, |report| {
                    report.rejected = Some((nack.version, nack.error));
                });
            }
            Some(data_plane_message::Kind::Serving(serving)) => {
                registry.update(&self.key, |report| report.unbound = serving.unbound);
            }
            // A message kind of a newer data plane: nothing to do with it.
            None => {}
        }
        Ok(())
    }

    /// Issues the next client certificate; it goes out when there is room in the stream.
    fn renew(&mut self) {
        let server = &self.server;
        let credentials: Credentials = server
            .ca
            .issue_dataplane(&self.key.identity, server.options.dataplane_cert_validity);
        Counters::add(&server.counters.credentials_issued);
        tracing::debug!(gateway = %self.key.identity, pod = %self.key.pod, not_after = ?credentials.not_after, "renewed the data plane's certificate");
        // At most one renewal a second, whatever the validity: a validity under a second
        // would otherwise renew in a loop.
        self.renew_at =
            instant_of(credentials.renew_at()).max(Instant::now() + Duration::from_secs(1));
        self.credentials = Some(wire::Credentials {
            cert_pem: credentials.cert_pem,
            key_pem: credentials.key_pem,
            ca_pem: credentials.ca_pem,
        });
    }
}

fn message(kind: control_plane_message::Kind) -> ControlPlaneMessage {
    ControlPlaneMessage { kind: Some(kind) }
}

/// Ends the stream with `status` if the data plane makes room for it soon; otherwise just
/// ends it (dropping the sender ends the response).
async fn close(outbound: &Outbound, status: Status) {
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, outbound.send(Err(status))).await;
}

fn instant_of(at: SystemTime) -> Instant {
    Instant::now() + at.duration_since(SystemTime::now()).unwrap_or_default()
}
