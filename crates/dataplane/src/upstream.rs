//! Upstream clients, hop-by-hop header hygiene and upgrade splicing.
//!
//! HTTP/1.1 (and WebSocket) clusters go through hyper-util's pooled legacy client keyed by
//! endpoint address. h2c clusters do not: that client puts the URI authority in `:authority`,
//! and the URI authority must be the endpoint so that the pool connects to it, which would hide
//! the request host from the backend (RFC 9113 §8.3.1 wants `:authority`, not `Host`). So each
//! h2c endpoint owns one multiplexed connection whose requests carry the real host as
//! `:authority`; the connection is shared across applies while the endpoint stays configured.
//!
//! Clusters with backend TLS get a [`TlsUpstream`]: its own pooled client (TCP + rustls through
//! hyper-rustls, ALPN http/1.1) or, for h2 clusters, TLS under the shared HTTP/2 connection
//! (ALPN h2). A `TlsUpstream` is built at apply time and reused by later applies while its
//! settings are unchanged, so pooled TLS connections survive unrelated configuration changes.

use crate::Options;
use crate::h1;
use crate::health::EndpointHealth;
use crate::limits::IdleBody;
use crate::reuse::Reuse;
use crate::table::Endpoint;
use crate::tls::ClientKey;
use arc_swap::ArcSwapOption;
use http::header::{CONNECTION, TE, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, Version};
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper::upgrade::OnUpgrade;
use hyper_rustls::{FixedServerNameResolver, HttpsConnector};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::net::TcpStream;
use tracing::debug;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug)]
pub(crate) enum UpstreamError {
    /// No connection could be made (refused, unreachable, connect timeout).
    Connect(BoxError),
    /// The connection failed after it was made.
    Failed(BoxError),
    /// The response head is over `--max-response-head-bytes`.
    HeadTooLarge,
}

pub(crate) struct Upstreams {
    http1: Client<HttpConnector, IdleBody>,
    /// Used at compile time only, so that applies keep reusing live h2 connections. Keyed by
    /// address and the address of the endpoint's `TlsUpstream` (0 for cleartext); the endpoint
    /// holds that `TlsUpstream`, so the pointer cannot be reused while the entry is live.
    h2: Mutex<HashMap<(SocketAddr, usize), Weak<H2Endpoint>>>,
    /// HTTP/1 pools by endpoint, like `h2`; also walked by the idle sweeper.
    h1: Mutex<HashMap<(SocketAddr, usize), Weak<h1::Pool>>>,
    /// Passive health by endpoint address, shared by every cluster that has the address and
    /// kept across applies while one does.
    health: Mutex<HashMap<SocketAddr, Weak<EndpointHealth>>>,
    /// Shards of every HTTP/1 pool: one per worker thread.
    pool_shards: usize,
    /// Compile time only: backend TLS clients by their settings.
    tls: Mutex<Reuse<ClientKey, Arc<TlsUpstream>>>,
    connect_timeout: Duration,
    pool_idle_timeout: Duration,
    /// Largest response head accepted from a backend (both HTTP/1 clients).
    max_response_head: usize,
}

impl std::fmt::Debug for Upstreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstreams").finish_non_exhaustive()
    }
}

impl Upstreams {
    pub(crate) fn new(options: &Options) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(options.connect_timeout));
        connector.set_nodelay(true);
        let max_response_head = options.max_response_head_bytes.max(8 * 1024);
        let http1 = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(options.pool_idle_timeout)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            // The read buffer bounds the response head: beyond it the request fails (502).
            .http1_max_buf_size(max_response_head)
            // The proxy always sets Host itself (original or rewritten host).
            .set_host(false)
            .build(connector);
        Upstreams {
            http1,
            h2: Mutex::new(HashMap::new()),
            h1: Mutex::new(HashMap::new()),
            health: Mutex::new(HashMap::new()),
            pool_shards: options.workers.max(1),
            tls: Mutex::new(Reuse::default()),
            connect_timeout: options.connect_timeout,
            pool_idle_timeout: options.pool_idle_timeout,
            max_response_head,
        }
    }

    pub(crate) fn h2_endpoint(
        &self,
        addr: SocketAddr,
        tls: Option<Arc<TlsUpstream>>,
    ) -> Arc<H2Endpoint> {
        let key = (addr, tls.as_ref().map_or(0, |t| Arc::as_ptr(t) as usize));
        let mut map = self.h2.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(existing) = map.get(&key).and_then(Weak::upgrade) {
            return existing;
        }
        let endpoint = Arc::new(H2Endpoint {
            addr,
            tls,
            connect_timeout: self.connect_timeout,
            sender: ArcSwapOption::empty(),
            connecting: tokio::sync::Mutex::new(()),
        });
        map.insert(key, Arc::downgrade(&endpoint));
        endpoint
    }

    /// The passive health of the endpoint at `addr`, kept across applies while some endpoint
    /// uses it.
    pub(crate) fn health(&self, addr: SocketAddr) -> Arc<EndpointHealth> {
        let mut map = self.health.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(existing) = map.get(&addr).and_then(Weak::upgrade) {
            return existing;
        }
        let health = Arc::new(EndpointHealth::default());
        map.insert(addr, Arc::downgrade(&health));
        health
    }

    /// The HTTP/1 pool of an endpoint, kept across applies while some endpoint uses it.
    pub(crate) fn h1_pool(&self, addr: SocketAddr, tls: Option<Arc<TlsUpstream>>) -> Arc<h1::Pool> {
        let key = (addr, tls.as_ref().map_or(0, |t| Arc::as_ptr(t) as usize));
        let mut map = self.h1.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(existing) = map.get(&key).and_then(Weak::upgrade) {
            return existing;
        }
        let pool = Arc::new(h1::Pool::new(
            addr,
            tls,
            self.pool_shards,
            self.connect_timeout,
            self.pool_idle_timeout,
            self.max_response_head,
        ));
        map.insert(key, Arc::downgrade(&pool));
        pool
    }

    /// Closes idle HTTP/1 upstream connections past the idle timeout.
    pub(crate) fn sweep_idle(&self) {
        let pools: Vec<Arc<h1::Pool>> = {
            let map = self.h1.lock().unwrap_or_else(|e| e.into_inner());
            map.values().filter_map(Weak::upgrade).collect()
        };
        for pool in pools {
            pool.sweep();
        }
    }

    pub(crate) fn pool_idle_timeout(&self) -> Duration {
        self.pool_idle_timeout
    }

    /// The backend TLS client for `key`, built by `config` unless the previous apply had one.
    pub(crate) fn tls_upstream(
        &self,
        key: ClientKey,
        config: impl FnOnce() -> Result<(ClientConfig, ServerName<'static>), String>,
    ) -> Result<Arc<TlsUpstream>, String> {
        let mut reuse = self.tls.lock().unwrap_or_else(|e| e.into_inner());
        reuse.get_or_try(key, || {
            let (config, server_name) = config()?;
            Ok(Arc::new(TlsUpstream::new(
                config,
                server_name,
                self.connect_timeout,
                self.pool_idle_timeout,
                self.max_response_head,
            )))
        })
    }

    /// Ends an apply: drops h2 registry entries and TLS clients nothing uses any more.
    pub(crate) fn finish_apply(&self) {
        let mut map = self.h2.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, w| w.strong_count() > 0);
        drop(map);
        let mut map = self.h1.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, w| w.strong_count() > 0);
        drop(map);
        let mut map = self.health.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, w| w.strong_count() > 0);
        drop(map);
        self.tls.lock().unwrap_or_else(|e| e.into_inner()).finish();
    }

    /// `req` must already carry its upstream URI (`http://<endpoint>/...` for HTTP/1,
    /// `http://<host>/...` for h2c) and version.
    pub(crate) async fn send(
        &self,
        endpoint: &Endpoint,
        req: Request<IdleBody>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let result = match (&endpoint.h2, &endpoint.tls) {
            (Some(h2), _) => return h2.send(req).await,
            (None, Some(tls)) => tls.http1.request(req).await,
            (None, None) => self.http1.request(req).await,
        };
        result.map_err(|e| {
            // TLS handshake failures (e.g. an untrusted or misnamed certificate) happen in
            // the connector, so they count as connect errors.
            if e.is_connect() {
                UpstreamError::Connect(e.into())
            } else if std::error::Error::source(&e)
                .and_then(|s| s.downcast_ref::<hyper::Error>())
                .is_some_and(hyper::Error::is_parse_too_large)
            {
                UpstreamError::HeadTooLarge
            } else {
                UpstreamError::Failed(e.into())
            }
        })
    }
}

/// TLS towards the endpoints of one cluster (BackendTLSPolicy).
pub(crate) struct TlsUpstream {
    connector: tokio_rustls::TlsConnector,
    server_name: ServerName<'static>,
    http1: Client<HttpsConnector<HttpConnector>, IdleBody>,
}

impl std::fmt::Debug for TlsUpstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsUpstream")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl TlsUpstream {
    /// TLS to the backend over `tcp`, verified as for HTTP requests (TLSRoute terminate
    /// re-encrypting to a backend under a BackendTLSPolicy).
    pub(crate) async fn connect(
        &self,
        tcp: tokio::net::TcpStream,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        self.connector.connect(self.server_name.clone(), tcp).await
    }

    fn new(
        config: ClientConfig,
        server_name: ServerName<'static>,
        connect_timeout: Duration,
        pool_idle_timeout: Duration,
        max_response_head: usize,
    ) -> Self {
        let mut tcp = HttpConnector::new();
        tcp.set_connect_timeout(Some(connect_timeout));
        tcp.set_nodelay(true);
        tcp.enforce_http(false);
        let config = Arc::new(config);
        // Not the builder: it refuses a config with ALPN set, and we offer http/1.1 (or h2).
        let connector = HttpsConnector::new(
            tcp,
            config.clone(),
            true,
            Arc::new(FixedServerNameResolver::new(server_name.clone())),
        );
        let http1 = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(pool_idle_timeout)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .http1_max_buf_size(max_response_head)
            .set_host(false)
            .build(connector);
        TlsUpstream {
            connector: tokio_rustls::TlsConnector::from(config),
            server_name,
            http1,
        }
    }
}

/// One h2c backend endpoint and its shared connection.
pub(crate) struct H2Endpoint {
    addr: SocketAddr,
    /// TLS under HTTP/2 (ALPN h2), for h2 clusters with backend TLS.
    tls: Option<Arc<TlsUpstream>>,
    connect_timeout: Duration,
    /// Read lock-free by every request; replaced when the connection dies.
    sender: ArcSwapOption<http2::SendRequest<IdleBody>>,
    /// Only taken to (re)connect, so that a burst does not open one connection per request.
    connecting: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for H2Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H2Endpoint")
            .field("addr", &self.addr)
            .finish()
    }
}

impl H2Endpoint {
    fn live_sender(&self) -> Option<http2::SendRequest<IdleBody>> {
        self.sender
            .load()
            .as_ref()
            .filter(|s| !s.is_closed())
            .map(|s| http2::SendRequest::clone(s))
    }

    async fn sender(&self) -> Result<http2::SendRequest<IdleBody>, UpstreamError> {
        if let Some(s) = self.live_sender() {
            return Ok(s);
        }
        // Boxed: connecting (TCP, TLS, the HTTP/2 handshake) is a future of several KB, and
        // inline it would be part of every request's future, which hyper boxes per HTTP/2
        // stream (a copy of the whole future per request). Only a request that connects pays.
        Box::pin(self.connect()).await
    }

    /// A new connection, one at a time: a request that waited for another's connect uses it.
    async fn connect(&self) -> Result<http2::SendRequest<IdleBody>, UpstreamError> {
        let _connecting = self.connecting.lock().await;
        if let Some(s) = self.live_sender() {
            return Ok(s);
        }
        let stream = tokio::time::timeout(self.connect_timeout, TcpStream::connect(self.addr))
            .await
            .map_err(|e| UpstreamError::Connect(e.into()))?
            .map_err(|e| UpstreamError::Connect(e.into()))?;
        let _ = stream.set_nodelay(true);
        let sender = match &self.tls {
            None => h2_handshake(self.addr, stream).await?,
            Some(tls) => {
                let connect = tls.connector.connect(tls.server_name.clone(), stream);
                let stream = tokio::time::timeout(self.connect_timeout, connect)
                    .await
                    .map_err(|e| UpstreamError::Connect(e.into()))?
                    .map_err(|e| UpstreamError::Connect(e.into()))?;
                h2_handshake(self.addr, stream).await?
            }
        };
        self.sender.store(Some(Arc::new(sender.clone())));
        Ok(sender)
    }

    async fn send(&self, req: Request<IdleBody>) -> Result<Response<Incoming>, UpstreamError> {
        let mut sender = self.sender().await?;
        match sender.try_send_request(req).await {
            Ok(resp) => Ok(resp),
            Err(mut e) => match e.take_message() {
                // The connection went away before the request left: one fresh connection.
                Some(req) => {
                    let mut sender = self.sender().await?;
                    sender
                        .send_request(req)
                        .await
                        .map_err(|e| UpstreamError::Failed(e.into()))
                }
                None => Err(UpstreamError::Failed(e.into_error().into())),
            },
        }
    }
}

async fn h2_handshake<I>(
    addr: SocketAddr,
    io: I,
) -> Result<http2::SendRequest<IdleBody>, UpstreamError>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .keep_alive_interval(Duration::from_secs(30))
        .handshake(TokioIo::new(io))
        .await
        .map_err(|e| UpstreamError::Connect(e.into()))?;
    tokio::spawn(async move {
        if let Err(error) = conn.await {
            debug!(%addr, %error, "h2 upstream connection ended");
        }
    });
    Ok(sender)
}

fn tokens(value: &HeaderValue) -> impl Iterator<Item = &str> {
    value
        .to_str()
        .ok()
        .into_iter()
        .flat_map(|v| v.split(','))
        .map(|t| t.split(';').next().unwrap_or("").trim())
        .filter(|t| !t.is_empty())
}

fn has_token(headers: &HeaderMap, name: HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .any(|v| tokens(v).any(|t| t.eq_ignore_ascii_case(token)))
}

/// The `Upgrade` value of an HTTP/1.1 upgrade request (`Connection: upgrade` + `Upgrade`).
pub(crate) fn upgrade_protocol(version: Version, headers: &HeaderMap) -> Option<HeaderValue> {
    if version != Version::HTTP_11 || !has_token(headers, CONNECTION, "upgrade") {
        return None;
    }
    // `Upgrade: h2c` asks this hop to switch to HTTP/2 (RFC 7540 §3.2, removed in RFC 9113):
    // never forwarded, the request goes on as an ordinary one.
    if has_token(headers, UPGRADE, "h2c") {
        return None;
    }
    headers.get(UPGRADE).cloned()
}

/// Removes hop-by-hop fields (RFC 9110 §7.6.1): `Connection` and every field it names,
/// `Keep-Alive`, `Proxy-Connection`, `Transfer-Encoding`, `Upgrade`, and `TE` except for
/// `trailers`. Proxy-Authenticate/Authorization are end-to-end in RFC 9110 and stay.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    match headers.get_all(CONNECTION).iter().count() {
        0 => {}
        1 => {
            if let Some(value) = headers.remove(CONNECTION) {
                remove_listed(headers, &value);
            }
        }
        _ => {
            let values: Vec<HeaderValue> = headers.get_all(CONNECTION).iter().cloned().collect();
            headers.remove(CONNECTION);
            for value in &values {
                remove_listed(headers, value);
            }
        }
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
    headers.remove(TRANSFER_ENCODING);
    headers.remove(UPGRADE);
    if headers.contains_key(TE) {
        let trailers = has_token(headers, TE, "trailers");
        headers.remove(TE);
        if trailers {
            headers.insert(TE, HeaderValue::from_static("trailers"));
        }
    }
}

fn remove_listed(headers: &mut HeaderMap, connection: &HeaderValue) {
    for name in tokens(connection) {
        // `&str` lookups parse the name on the stack; invalid names simply match nothing.
        headers.remove(name);
    }
}

/// Puts back what an upgrade needs after `strip_hop_by_hop`.
pub(crate) fn restore_upgrade(headers: &mut HeaderMap, protocol: HeaderValue) {
    headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(UPGRADE, protocol);
}

/// Splices an upgraded client connection to its upgraded backend connection until either
/// side closes.
pub(crate) async fn splice(
    downstream: OnUpgrade,
    upstream: OnUpgrade,
    idle: std::time::Duration,
    metrics: &crate::Metrics,
) {
    let (downstream, upstream) = match tokio::try_join!(downstream, upstream) {
        Ok(pair) => pair,
        Err(error) => {
            debug!(%error, "upgrade did not complete");
            return;
        }
    };
    let mut downstream = TokioIo::new(downstream);
    let mut upstream = TokioIo::new(upstream);
    if let Err(error) =
        crate::limits::copy_bidirectional_idle(&mut downstream, &mut upstream, idle, metrics, None)
            .await
    {
        debug!(%error, "upgraded connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(*n, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn strips_hop_by_hop_and_connection_listed() {
        let mut h = map(&[
            ("connection", "keep-alive, X-Secret"),
            ("connection", "x-other"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("te", "gzip, trailers"),
            ("x-secret", "1"),
            ("x-other", "2"),
            ("x-kept", "3"),
            ("proxy-authorization", "Basic Zm9v"),
            ("proxy-authenticate", "Basic"),
        ]);
        strip_hop_by_hop(&mut h);
        let mut names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(
            names,
            ["proxy-authenticate", "proxy-authorization", "te", "x-kept"]
        );
        assert_eq!(h.get(TE).unwrap(), "trailers");

        let mut h = map(&[("te", "gzip"), ("x-a", "1")]);
        strip_hop_by_hop(&mut h);
        assert!(!h.contains_key(TE));
        assert!(h.contains_key("x-a"));
    }

    #[test]
    fn detects_upgrades() {
        let req = |conn: &'static str, protocol: &'static str| {
            map(&[("connection", conn), ("upgrade", protocol)])
        };
        assert_eq!(
            upgrade_protocol(Version::HTTP_11, &req("keep-alive, Upgrade", "websocket")).unwrap(),
            "websocket"
        );
        assert!(upgrade_protocol(Version::HTTP_11, &req("keep-alive", "websocket")).is_none());
        assert!(upgrade_protocol(Version::HTTP_2, &req("upgrade", "websocket")).is_none());
        assert!(
            upgrade_protocol(Version::HTTP_11, &req("upgrade", "h2c")).is_none(),
            "h2c is never forwarded"
        );
    }
}
