//! Hedged connects: a connect to a backend endpoint that is still pending after
//! [`HEDGE_AFTER`] gets a second one to another endpoint alongside, and the first connection
//! made wins.
//!
//! Inside a cluster a connect takes well under a millisecond and a TLS handshake a few. One
//! still pending after [`HEDGE_AFTER`] is most likely to an address that went dark: a pod
//! deleted before its removal reached the data plane answers no SYN, so the connect would wait
//! for the connect timeout (seconds). With round-robin and many client connections, every
//! connection soon has a request waiting on such an endpoint and the whole route stalls. The
//! overtaken attempt counts as a failure of its endpoint (see [`crate::health`]), so two of
//! them eject it.

use crate::table::{ClusterState, Endpoint};
use crate::upstream::BoxError;
use std::future::Future;
use std::time::Duration;

/// How long a connect may take before another endpoint is tried alongside it.
pub(crate) const HEDGE_AFTER: Duration = Duration::from_millis(250);

/// Connects to `endpoint` with `connect` (`None`: the endpoint cannot be connected this way),
/// hedging as the module describes. Every failure is recorded against its endpoint here; the
/// error comes with the endpoint tried last, for the caller's choice of the next one.
pub(crate) async fn connect_hedged<'e, T, F, Fut>(
    cluster: &'e ClusterState,
    endpoint: &'e Endpoint,
    connect: F,
) -> Result<(T, &'e Endpoint), (BoxError, &'e Endpoint)>
where
    F: Fn(&'e Endpoint) -> Option<Fut>,
    Fut: Future<Output = Result<T, BoxError>>,
{
    let failed = |endpoint: &'e Endpoint, error: BoxError| {
        cluster.connect_failed(endpoint);
        tracing::debug!(cluster = &*cluster.name, endpoint = %endpoint.addr, %error, "upstream connect failed");
        (error, endpoint)
    };
    let Some(first) = connect(endpoint) else {
        return Err(("the endpoint cannot be connected this way".into(), endpoint));
    };
    tokio::pin!(first);
    tokio::select! {
        biased;
        result = &mut first => {
            return result.map(|up| (up, endpoint)).map_err(|e| failed(endpoint, e));
        }
        () = tokio::time::sleep(HEDGE_AFTER) => {}
    }
    let Some((other, second)) = cluster
        .pick_other(endpoint.addr)
        .and_then(|other| Some((other, connect(other)?)))
    else {
        return first
            .await
            .map(|up| (up, endpoint))
            .map_err(|e| failed(endpoint, e));
    };
    // Overtaken: counted now, not again if it fails later.
    cluster.connect_failed(endpoint);
    cluster.retries.inc();
    tracing::debug!(cluster = &*cluster.name, endpoint = %endpoint.addr, other = %other.addr, "upstream connect slow; trying another endpoint alongside");
    tokio::pin!(second);
    tokio::select! {
        result = &mut first => match result {
            Ok(up) => Ok((up, endpoint)),
            Err(_) => second.await.map(|up| (up, other)).map_err(|e| failed(other, e)),
        },
        result = &mut second => match result {
            Ok(up) => Ok((up, other)),
            Err(e) => {
                let (_, other) = failed(other, e);
                first.await.map(|up| (up, endpoint)).map_err(|e| (e, other))
            }
        },
    }
}
