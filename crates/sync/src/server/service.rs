//! The tonic service: admits a stream (leader, verified identity) and hands it to a session.

use super::{ConfigServer, NOT_LEADER, session};
use crate::identity::PeerCertificate;
use crate::rpc::config_sync_server::ConfigSync;
use crate::wire::{ControlPlaneMessage, DataPlaneMessage};
use futures_util::stream::BoxStream;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

pub(crate) struct SyncService {
    server: Arc<ConfigServer>,
    stop: CancellationToken,
}

impl SyncService {
    pub fn new(server: Arc<ConfigServer>, stop: CancellationToken) -> Self {
        SyncService { server, stop }
    }
}

#[tonic::async_trait]
impl ConfigSync for SyncService {
    type StreamStream = BoxStream<'static, Result<ControlPlaneMessage, Status>>;

    async fn stream(
        &self,
        request: Request<Streaming<DataPlaneMessage>>,
    ) -> Result<Response<Self::StreamStream>, Status> {
        if !*self.server.accepting.borrow() {
            return Err(Status::unavailable(NOT_LEADER));
        }
        // The handshake verified the chain; the Gateway comes from the certificate and from
        // nothing the client says.
        let peer = request
            .peer_certs()
            .and_then(|certs| certs.first().cloned())
            .ok_or_else(|| Status::unauthenticated("no client certificate"))?;
        let peer = PeerCertificate::parse(&peer)
            .map_err(|e| Status::permission_denied(format!("client certificate: {e}")))?;
        let remote = request.remote_addr();
        // One message of room: the session reads the latest snapshot when there is room, so
        // a slow data plane is never sent a queue of stale ones.
        let (sender, mut receiver) = mpsc::channel(1);
        tokio::spawn(session::run(
            self.server.clone(),
            peer,
            remote,
            request.into_inner(),
            sender,
            self.stop.clone(),
        ));
        let outbound = futures_util::stream::poll_fn(move |cx| receiver.poll_recv(cx));
        Ok(Response::new(Box::pin(outbound)))
    }
}
