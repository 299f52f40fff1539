//! The compiled runtime tables the request paths read: one [`SocketTable`] per bound socket,
//! swapped whole on every apply. `compile` builds them from the IR; the router, both request
//! paths, TLS and TCP forwarding only read them.

use crate::balancer::{RoundRobin, Weighted};
use crate::filters::Filter;
use crate::health::EndpointHealth;
use crate::matchers::RequestMatcher;
use crate::metrics::RouteMetrics;
use crate::router::{HostTable, RouteTable};
use crate::upstream::{H2Endpoint, TlsUpstream};
use http::uri::Authority;
use prometheus_client::metrics::counter::Counter;
use rustls::ServerConfig;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// What a socket's connections (or datagrams) speak; the first listener on an address decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Speaks {
    /// Plaintext HTTP.
    Http,
    /// Connections start with a TLS ClientHello (HTTPS and TLS listeners).
    Tls,
    /// Bytes forwarded as they are (TCP listeners).
    Tcp,
    /// A UDP socket (UDP listeners).
    Udp,
}

impl Speaks {
    pub(crate) fn of(protocol: gatehouse_ir::ListenerProtocol) -> Self {
        use gatehouse_ir::ListenerProtocol as P;
        match protocol {
            P::Http => Speaks::Http,
            P::Https | P::Tls => Speaks::Tls,
            P::Tcp => Speaks::Tcp,
            P::Udp => Speaks::Udp,
        }
    }

    pub(crate) fn describe(self) -> &'static str {
        match self {
            Speaks::Http => "plaintext HTTP",
            Speaks::Tls => "TLS",
            Speaks::Tcp => "TCP (a TCPRoute)",
            Speaks::Udp => "UDP",
        }
    }
}

/// Everything one bound socket routes with.
#[derive(Debug)]
pub(crate) struct SocketTable {
    pub speaks: Speaks,
    pub listeners: Vec<CompiledListener>,
    /// Request host (or SNI name) -> index into `listeners`.
    pub hosts: HostTable<usize>,
    /// Metrics for requests no listener takes. The gateway label is the socket's gateway when
    /// only one gateway listens here, empty otherwise.
    pub unmatched: RouteMetrics,
    /// Some listener here has pre-routing filters: the HTTP/1 path looks the request's
    /// listener up to hand such requests over (one flag read for every other socket).
    pub pre_routing: bool,
}

#[derive(Debug)]
pub(crate) struct CompiledListener {
    pub vhosts: HostTable<CompiledVhost>,
    /// The rule of each entry of every virtual host, the hosts one after another: an index
    /// into `rules` (checked at compile time).
    pub entry_rules: Box<[usize]>,
    pub rules: Vec<CompiledRule>,
    /// Metrics for requests this listener takes but no route matches.
    pub unmatched: RouteMetrics,
    pub mode: ListenerMode,
    /// TLS listeners: SNI name -> index into `tls_routes`.
    pub tls_hosts: HostTable<usize>,
    pub tls_routes: Vec<CompiledTlsRoute>,
    /// TCP and UDP listeners: where every connection or client session goes.
    pub l4_route: Option<Arc<crate::l4::L4Route>>,
    /// `gatehouse_tls_handshakes_total` of this listener.
    pub handshakes: Counter,
    /// Pre-routing filters (`ExternalAuth` only), in order; run on the hyper path.
    pub filters: Box<[Filter]>,
}

/// What a listener does with a connection.
#[derive(Debug)]
pub(crate) enum ListenerMode {
    /// Plaintext HTTP.
    Http,
    /// TLS terminated here; `None` when no certificate (or client CA) loaded, and handshakes
    /// for the listener's names are refused. Then HTTP (HTTPS listeners) or the decrypted
    /// stream forwarded over TCP by TLSRoute (TLS listeners in Terminate mode).
    Terminate {
        config: Option<Arc<ServerConfig>>,
        http: bool,
    },
    /// TLS forwarded untouched by TLSRoute, ClientHello included.
    Passthrough,
    /// TCP connections or UDP sessions forwarded to [`CompiledListener::l4_route`].
    Forward,
}

#[derive(Debug)]
pub(crate) struct CompiledTlsRoute {
    pub route: Arc<str>,
    pub backends: Weighted<Target>,
}

#[derive(Debug)]
pub(crate) struct CompiledVhost {
    /// In precedence order, with exact-header indexes over long runs of header matches.
    /// Shared with the next apply's table while the host's matches are the same objects
    /// ([`crate::compile::CompiledHosts`]). Its routes name their entry in the host, not a
    /// rule, so that a table stays right when its rules move in the listener.
    pub routes: Arc<RouteTable>,
    /// Where the host's entries start in [`CompiledListener::entry_rules`].
    pub base: usize,
}

impl CompiledVhost {
    /// The rule of one of this host's routes.
    pub(crate) fn rule<'l>(
        &self,
        listener: &'l CompiledListener,
        route: &CompiledRoute,
    ) -> &'l CompiledRule {
        &listener.rules[listener.entry_rules[self.base + route.entry]]
    }
}

#[derive(Debug)]
pub(crate) struct CompiledRoute {
    pub matcher: RequestMatcher,
    /// The position of its entry in the virtual host ([`CompiledVhost::rule`] finds the rule).
    pub entry: usize,
}

#[derive(Debug)]
pub(crate) struct CompiledRule {
    pub metrics: RouteMetrics,
    pub filters: Box<[Filter]>,
    /// A `RequestMirror` filter is among the rule's or its backends' filters: its requests are
    /// served on the hyper path (see `mirror`).
    pub mirrored: bool,
    /// An `ExternalAuth` filter is among the rule's filters: its requests are served on the
    /// hyper path, which awaits the check (see `ext_auth`).
    pub authorized: bool,
    pub backends: Weighted<Backend>,
    /// Until response headers: the tighter of the rule's request and backend-request timeouts,
    /// or the default.
    pub timeout: Option<Duration>,
    /// The rule's retry policy. Such rules are served on the hyper path, which alone retries
    /// (see `retry`), so the HTTP/1 path pays nothing for them.
    pub retry: Option<Box<crate::retry::RetryPolicy>>,
}

#[derive(Debug)]
pub(crate) struct Backend {
    pub target: Target,
    pub filters: Box<[Filter]>,
}

#[derive(Debug)]
pub(crate) enum Target {
    Cluster(Arc<ClusterState>),
    Invalid,
}

#[derive(Debug)]
pub(crate) struct ClusterState {
    pub name: Arc<str>,
    pub endpoints: RoundRobin<Endpoint>,
    pub connect_failures: Counter,
    /// Requests sent to another endpoint after a connect failure.
    pub retries: Counter,
    /// Endpoints taken out of rotation by passive health checking.
    pub ejections: Counter,
    /// Attempts sent again by a rule's retry policy, by reason.
    pub route_retries: crate::retry::RetryCounters,
    /// The cluster asks for backend TLS whose settings do not load: HTTP requests get a 502
    /// rather than going out in the clear or unverified.
    pub tls_broken: bool,
}

#[derive(Debug)]
pub(crate) struct Endpoint {
    pub addr: SocketAddr,
    /// `ip:port`, the authority of upstream request URIs (it is also the pool key).
    pub authority: Authority,
    /// The shared HTTP/2 connection, for h2c clusters.
    pub h2: Option<Arc<H2Endpoint>>,
    /// Kept-alive HTTP/1.1 connections for the HTTP/1 path (every cluster but h2c ones).
    pub pool: Option<Arc<crate::h1::Pool>>,
    /// Backend TLS; HTTP/1 requests go through its client, h2 ones under its connection.
    pub tls: Option<Arc<TlsUpstream>>,
    pub health: Arc<EndpointHealth>,
}

/// Tables with fewer rules than this are freed where they are dropped: handing them over
/// would cost about what freeing them does.
const RECLAIM_RULES: usize = 256;

impl Drop for SocketTable {
    /// A large table's listeners are freed on the reclaiming thread ([`crate::reclaim`]):
    /// the last holder may be a worker about to answer a request.
    fn drop(&mut self) {
        let rules: usize = self.listeners.iter().map(|l| l.rules.len()).sum();
        if rules >= RECLAIM_RULES {
            crate::reclaim::later(std::mem::take(&mut self.listeners));
        }
    }
}

impl SocketTable {
    /// The route of a TCP or UDP socket (it has one listener), if one is attached.
    pub(crate) fn l4_route(&self) -> Option<&Arc<crate::l4::L4Route>> {
        self.listeners.first()?.l4_route.as_ref()
    }
}

impl ClusterState {
    /// The next endpoint in rotation that is not ejected; if every one is, the next one
    /// anyway (see `health`).
    pub(crate) fn pick(&self) -> Option<&Endpoint> {
        let first = self.endpoints.next()?;
        if !first.health.is_ejected() {
            return Some(first);
        }
        for _ in 1..self.endpoints.len() {
            let e = self.endpoints.next()?;
            if !e.health.is_ejected() {
                return Some(e);
            }
        }
        Some(first)
    }

    pub(crate) fn endpoints_iter(&self) -> impl Iterator<Item = &Endpoint> {
        self.endpoints.iter()
    }

    /// An endpoint to retry on after `failed` refused: another healthy one if there is one.
    pub(crate) fn pick_other(&self, failed: SocketAddr) -> Option<&Endpoint> {
        (0..self.endpoints.len())
            .filter_map(|_| self.endpoints.next())
            .find(|e| e.addr != failed && !e.health.is_ejected())
    }

    /// Records that a connection to `endpoint` failed before the request reached it.
    pub(crate) fn connect_failed(&self, endpoint: &Endpoint) {
        self.connect_failures.inc();
        if endpoint.health.failure() {
            self.ejections.inc();
            tracing::info!(
                cluster = &*self.name,
                endpoint = %endpoint.addr,
                "endpoint ejected: it keeps refusing connections"
            );
        }
    }
}
