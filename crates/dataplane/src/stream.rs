//! TCP forwarding for TLSRoute: passthrough (the buffered ClientHello replayed, then bytes both
//! ways, untouched) and terminate (the decrypted stream).

use crate::Shared;
use crate::compile::{ClusterState, CompiledListener, Target};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tracing::debug;

/// Where one TLSRoute connection goes.
pub(crate) struct TcpTarget {
    route: Arc<str>,
    cluster: Arc<ClusterState>,
    addr: SocketAddr,
}

/// Route, backend and endpoint for `sni` (empty: no SNI), picked up front so that the tunnel
/// holds only its cluster, not the whole routing table, for as long as it lives.
pub(crate) fn pick(listener: &CompiledListener, sni: &str) -> Result<TcpTarget, &'static str> {
    let route = listener
        .tls_hosts
        .get(sni)
        .and_then(|&i| listener.tls_routes.get(i))
        .ok_or("no TLSRoute for this name")?;
    let Some(Target::Cluster(cluster)) = route.backends.pick() else {
        return Err("route has no usable backend");
    };
    let endpoint = cluster.endpoints.next().ok_or("cluster has no endpoints")?;
    Ok(TcpTarget {
        route: route.route.clone(),
        cluster: cluster.clone(),
        addr: endpoint.addr,
    })
}

/// Connects to the target, sends `first`, then copies both ways until either side closes (or
/// the shutdown grace is over). `Err` only when the backend could not be reached.
pub(crate) async fn forward<S>(
    client: &mut S,
    first: &[u8],
    target: TcpTarget,
    shared: &Shared,
) -> Result<(), ()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let TcpTarget {
        route,
        cluster,
        addr,
    } = target;
    let connect = tokio::time::timeout(shared.connect_timeout, TcpStream::connect(addr)).await;
    let mut upstream = match connect {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => {
            cluster.connect_failures.inc();
            debug!(route = &*route, cluster = &*cluster.name, endpoint = %addr, %error, "TLSRoute backend connect failed");
            return Err(());
        }
        Err(_) => {
            cluster.connect_failures.inc();
            debug!(route = &*route, cluster = &*cluster.name, endpoint = %addr, "TLSRoute backend connect timed out");
            return Err(());
        }
    };
    let _ = upstream.set_nodelay(true);
    if !first.is_empty() && upstream.write_all(first).await.is_err() {
        return Ok(());
    }
    tokio::select! {
        result = tokio::io::copy_bidirectional(client, &mut upstream) => {
            if let Err(error) = result {
                debug!(route = &*route, cluster = &*cluster.name, %error, "TLSRoute connection ended with an error");
            }
        }
        () = shared.kill.cancelled() => {}
    }
    Ok(())
}
