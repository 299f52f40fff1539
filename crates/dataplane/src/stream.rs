//! TCP forwarding for TLSRoute: passthrough (the buffered ClientHello replayed, then bytes both
//! ways, untouched) and terminate (the decrypted stream, re-encrypted when a BackendTLSPolicy
//! secures the backend).

use crate::Shared;
use crate::connect::connect_with_retries;
use crate::table::{ClusterState, CompiledListener, Endpoint, Target};
use crate::upstream::{BoxError, TlsUpstream};
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
    let endpoint = cluster.pick().ok_or("cluster has no endpoints")?;
    Ok(TcpTarget {
        route: route.route.clone(),
        cluster: cluster.clone(),
        addr: endpoint.addr,
    })
}

/// Connects to the target, sends `first`, then copies both ways until either side closes (or
/// the shutdown grace is over). With `reencrypt` (a terminated TLSRoute) a backend under a
/// BackendTLSPolicy is spoken to over TLS; passthrough bytes are TLS already and go as they are.
/// `Err` only when the backend could not be reached.
pub(crate) async fn forward<S>(
    client: &mut S,
    first: &[u8],
    target: TcpTarget,
    reencrypt: bool,
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
    if reencrypt && cluster.tls_broken {
        debug!(
            route = &*route,
            cluster = &*cluster.name,
            "backend TLS settings do not load; refused"
        );
        return Err(());
    }
    // The endpoint picked up front, then others of the cluster when connecting fails: nothing
    // of the client's stream was sent yet.
    let picked = cluster
        .endpoints_iter()
        .find(|e| e.addr == addr)
        .ok_or(())?;
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
    let (tcp, endpoint) = match connect_with_retries(&cluster, picked, |_| None, connect).await {
        Ok(connected) => connected,
        Err(error) => {
            debug!(
                route = &*route,
                cluster = &*cluster.name,
                "TLSRoute backend: connect failed: {error}"
            );
            return Err(());
        }
    };
    let _ = tcp.set_nodelay(true);
    let failed = |what: &dyn std::fmt::Display| {
        cluster.connect_failures.inc();
        debug!(route = &*route, cluster = &*cluster.name, endpoint = %endpoint.addr, "TLSRoute backend: {what}");
        Err(())
    };
    let tls: Option<&Arc<TlsUpstream>> = endpoint.tls.as_ref();
    match tls.filter(|_| reencrypt) {
        None => {
            endpoint.health.success();
            pipe(client, tcp, first, &route, &cluster, shared).await
        }
        Some(tls) => match tokio::time::timeout(shared.connect_timeout, tls.connect(tcp)).await {
            Ok(Ok(upstream)) => {
                endpoint.health.success();
                pipe(client, upstream, first, &route, &cluster, shared).await
            }
            Ok(Err(error)) => failed(&format_args!("TLS handshake failed: {error}")),
            Err(_) => failed(&"TLS handshake timed out"),
        },
    }
}

async fn pipe<S, U>(
    client: &mut S,
    mut upstream: U,
    first: &[u8],
    route: &str,
    cluster: &ClusterState,
    shared: &Shared,
) -> Result<(), ()>
where
    S: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    if !first.is_empty() && upstream.write_all(first).await.is_err() {
        return Ok(());
    }
    tokio::select! {
        result = crate::limits::copy_bidirectional_idle(client, &mut upstream, shared.limits.tunnel_idle, &shared.metrics, None) => {
            if let Err(error) = result {
                debug!(route, cluster = &*cluster.name, %error, "TLSRoute connection ended with an error");
            }
        }
        () = shared.kill.cancelled() => {}
    }
    Ok(())
}
