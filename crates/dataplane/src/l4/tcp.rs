//! TCP listeners: each accepted connection goes to a backend endpoint picked by weight, and
//! bytes are copied both ways as they are.
//!
//! Every state has a limit: connecting (`connect_timeout` per attempt, then another endpoint,
//! as the HTTP pools do: [`connect_with_retries`]), and the stream itself (no byte either way
//! for `tunnel_idle_timeout` closes both sides). A side that finishes its stream (FIN) gets the
//! other side's write half shut down, and the copy goes on the other way until that one ends
//! too, so protocols that half-close work. A configuration swap keeps the connection while its
//! route is still the socket's; a removed route or listener closes it at once. When the data
//! plane shuts down it waits for the connection up to the shutdown grace.

use super::{L4Route, still_routes};
use crate::connect::connect_with_retries;
use crate::listeners::{ActiveConn, SocketShared};
use crate::metrics::L4Error;
use crate::table::Endpoint;
use crate::upstream::BoxError;
use gatehouse_ir::Transport;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpStream;
use tracing::debug;

/// Serves one connection of a TCP listener to its end.
pub(crate) async fn serve(
    mut client: TcpStream,
    peer: SocketAddr,
    socket: Arc<SocketShared>,
    _active: ActiveConn,
) {
    let shared = socket.shared.clone();
    // Subscribed before the table is read, so that no swap after this point goes unseen.
    let mut swaps = socket.swaps();
    let Some(route) = socket.table.load().l4_route().cloned() else {
        debug!(%peer, "TCP listener without a route; connection closed");
        shared.metrics.l4_error(Transport::Tcp, L4Error::NoRoute);
        return;
    };
    let picked = match route.pick() {
        Ok(picked) => picked,
        Err(error) => {
            debug!(%peer, route = &*route.route, "no backend to forward to; connection closed");
            shared.metrics.l4_error(Transport::Tcp, error);
            return;
        }
    };
    let cluster = picked.cluster;
    let connect_timeout = shared.connect_timeout;
    let connect = |e: &Endpoint| {
        let addr = e.addr;
        Some(async move {
            match tokio::time::timeout(connect_timeout, TcpStream::connect(addr)).await {
                Ok(result) => result.map_err(BoxError::from),
                Err(_) => Err("connect timed out".into()),
            }
        })
    };
    let connected = tokio::select! {
        connected = connect_with_retries(cluster, picked.endpoint, |_| None, connect) => connected,
        () = shared.kill.cancelled() => return,
    };
    let (mut upstream, endpoint) = match connected {
        Ok(connected) => connected,
        Err(error) => {
            debug!(%peer, route = &*route.route, cluster = &*cluster.name, %error, "TCPRoute backend: connect failed; connection closed");
            shared.metrics.l4_error(Transport::Tcp, L4Error::Connect);
            return;
        }
    };
    endpoint.health.success();
    let _ = upstream.set_nodelay(true);
    let metrics = &route.metrics;
    metrics.opened.inc();
    metrics.active.inc();
    let _open = Open(&route);
    let route_gone = async {
        loop {
            if swaps.changed().await.is_err() {
                // The socket is gone with its sender: nothing will change any more.
                return std::future::pending().await;
            }
            if socket.is_removed() || !still_routes(&socket.table.load(), &route.route) {
                return;
            }
        }
    };
    tokio::select! {
        result = crate::limits::copy_bidirectional_idle(
            &mut client,
            &mut upstream,
            shared.limits.tunnel_idle,
            &shared.metrics,
            Some([&metrics.bytes_to_backend, &metrics.bytes_to_client]),
        ) => {
            if let Err(error) = result {
                debug!(%peer, route = &*route.route, endpoint = %endpoint.addr, %error, "TCP connection ended with an error");
            }
        }
        () = route_gone => {
            debug!(%peer, route = &*route.route, "the connection's route is gone; closed");
        }
        () = shared.kill.cancelled() => {}
    }
}

/// Counts the connection as open for as long as it lives.
struct Open<'r>(&'r L4Route);

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.metrics.active.dec();
    }
}
