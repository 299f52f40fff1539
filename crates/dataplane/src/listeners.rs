//! Sockets: bind, accept, serve connections, drain.
//!
//! One accept loop per distinct address. Each socket holds an `ArcSwap` of its routing table,
//! which `apply` replaces without touching the socket or its connections.

use crate::Shared;
use crate::compile::SocketTable;
use crate::proxy::{self, ConnContext};
use arc_swap::ArcSwap;
use http::HeaderValue;
use hyper_util::rt::TokioIo;
use socket2::{Domain, Protocol, Socket, Type};
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// State shared by one socket's accept loop and connections.
pub(crate) struct SocketShared {
    pub table: ArcSwap<SocketTable>,
    pub shared: Arc<Shared>,
}

pub(crate) struct BoundSocket {
    pub state: Arc<SocketShared>,
    /// Cancelled to stop accepting; the socket's connections then drain gracefully.
    pub stop: CancellationToken,
    /// Ends (closing the listening socket) promptly after `stop`.
    pub accept: JoinHandle<()>,
}

pub(crate) fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    // Lets a restarted or re-applied listener bind while old connections sit in TIME_WAIT.
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}

pub(crate) fn start(
    listener: TcpListener,
    table: SocketTable,
    shared: Arc<Shared>,
    stop: CancellationToken,
) -> BoundSocket {
    let state = Arc::new(SocketShared {
        table: ArcSwap::from_pointee(table),
        shared: shared.clone(),
    });
    let accept = shared
        .tasks
        .spawn(accept_loop(listener, state.clone(), stop.clone()));
    BoundSocket {
        state,
        stop,
        accept,
    }
}

async fn accept_loop(listener: TcpListener, socket: Arc<SocketShared>, stop: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                socket
                    .shared
                    .tasks
                    .spawn(serve(stream, peer, socket.clone(), stop.clone()));
            }
            // A client that gave up before we accepted: nothing to do.
            Err(error)
                if matches!(
                    error.kind(),
                    io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
                ) =>
            {
                debug!(%error, "accept failed");
            }
            Err(error) => {
                // Typically EMFILE/ENFILE: back off instead of spinning on the error.
                warn!(%error, "accept failed; backing off");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    debug!(address = ?listener.local_addr().ok(), "listener closed");
}

async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    socket: Arc<SocketShared>,
    drain: CancellationToken,
) {
    let shared = socket.shared.clone();
    let client_ip = HeaderValue::try_from(peer.ip().to_canonical().to_string())
        .unwrap_or_else(|_| HeaderValue::from_static("unknown"));
    let conn = Arc::new(ConnContext::new(socket, client_ip));
    let service = hyper::service::service_fn(move |req| {
        let conn = conn.clone();
        async move { Ok::<_, Infallible>(proxy::handle(conn, req).await) }
    });
    let connection = shared
        .server
        .serve_connection_with_upgrades(TokioIo::new(stream), service);
    tokio::pin!(connection);
    tokio::select! {
        result = connection.as_mut() => {
            if let Err(error) = result {
                debug!(%peer, %error, "connection ended with an error");
            }
            return;
        }
        () = drain.cancelled() => {}
        () = shared.kill.cancelled() => return,
    }
    // HTTP/1: finish the request in flight, then close (idle connections close now).
    // HTTP/2: GOAWAY, then finish the open streams.
    connection.as_mut().graceful_shutdown();
    tokio::select! {
        _ = connection => {}
        () = shared.kill.cancelled() => {}
    }
}
