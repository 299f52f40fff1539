//! Connecting to a backend endpoint for a request or a stream, the same way for the HTTP/1
//! pool and for TLSRoute/TCP streams: hedged when slow, retried on another endpoint when it
//! fails, every failure counted against the endpoint's health (see [`crate::health`]).
//!
//! **Hedging.** Inside a cluster a connect takes well under a millisecond and a TLS handshake a
//! few. One still pending after [`HEDGE_AFTER`] is most likely to an address that went dark: a
//! pod deleted before its removal reached the data plane answers no SYN, so the connect would
//! wait for the connect timeout (seconds). With round-robin and many client connections, every
//! connection soon has a request waiting on such an endpoint and the whole route stalls. So a
//! second connect to another endpoint starts alongside and the first connection made wins; the
//! overtaken attempt counts as a failure of its endpoint, so two of them eject it.
//!
//! **Retrying.** A failed connect sent nothing, so any request may go elsewhere: up to
//! [`CONNECT_RETRIES`] other endpoints are tried.

use crate::table::{ClusterState, Endpoint};
use crate::upstream::BoxError;
use std::future::Future;
use std::time::Duration;

/// How long a connect may take before another endpoint is tried alongside it.
pub(crate) const HEDGE_AFTER: Duration = Duration::from_millis(250);

/// Connections to other endpoints after a failed one, per request.
pub(crate) const CONNECT_RETRIES: usize = 2;

/// A connection to `endpoint`, or to another endpoint of `cluster` when that fails. `reuse`
/// offers a connection already open to an endpoint (a pooled one), taken before any connect;
/// `connect` opens a new one (`None`: the endpoint cannot be connected this way). Returns the
/// connection and the endpoint it goes to.
pub(crate) async fn connect_with_retries<'e, T, R, F, Fut>(
    cluster: &'e ClusterState,
    endpoint: &'e Endpoint,
    reuse: R,
    connect: F,
) -> Result<(T, &'e Endpoint), BoxError>
where
    R: Fn(&'e Endpoint) -> Option<T>,
    F: Fn(&'e Endpoint) -> Option<Fut>,
    Fut: Future<Output = Result<T, BoxError>>,
{
    let mut endpoint = endpoint;
    let mut attempt = 0;
    loop {
        if let Some(up) = reuse(endpoint) {
            return Ok((up, endpoint));
        }
        let (error, failed) = match connect_hedged(cluster, endpoint, &connect).await {
            Ok(connected) => return Ok(connected),
            Err(failure) => failure,
        };
        attempt += 1;
        match cluster.pick_other(failed.addr) {
            Some(next) if attempt <= CONNECT_RETRIES => {
                cluster.retries.inc();
                endpoint = next;
            }
            _ => return Err(error),
        }
    }
}

/// Connects to `endpoint` with `connect`, hedging as the module describes. Every failure is
/// recorded against its endpoint here; the error comes with the endpoint tried last.
async fn connect_hedged<'e, T, F, Fut>(
    cluster: &'e ClusterState,
    endpoint: &'e Endpoint,
    connect: &F,
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
    // Overtaken: counted now, and not again if it fails later.
    cluster.connect_failed(endpoint);
    cluster.retries.inc();
    tracing::debug!(cluster = &*cluster.name, endpoint = %endpoint.addr, other = %other.addr, "upstream connect slow; trying another endpoint alongside");
    tokio::pin!(second);
    // Whichever connects first; if one fails, the other's outcome is the answer.
    tokio::select! {
        result = &mut first => match result {
            Ok(up) => Ok((up, endpoint)),
            Err(_) => second.await.map(|up| (up, other)).map_err(|e| failed(other, e)),
        },
        result = &mut second => match result {
            Ok(up) => Ok((up, other)),
            Err(e) => {
                failed(other, e);
                first.await.map(|up| (up, endpoint)).map_err(|e| (e, endpoint))
            }
        },
    }
}
