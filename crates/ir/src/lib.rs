//! The intermediate representation: the only thing the data plane knows.
//!
//! `translate` turns Gateway API objects into a [`Config`]; the data plane compiles a `Config`
//! into matchers and balancers and swaps it in atomically. Every Gateway API decision
//! (attachment, hostname intersection, precedence, redirect ports, which backends are invalid)
//! is already taken here, so the data plane only executes. The model is plain data with serde so
//! that the same IR can later travel to remote proxies without a second model.

use serde::{Deserialize, Serialize};

mod split;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// A regular expression of a route match as Gatehouse runs it: anchored at both ends, so it
/// must match the whole path or value (`^(?:re)$`; the group keeps alternations inside the
/// anchors). Translate checks with this what the data plane will compile.
pub fn anchored_regex(re: &str) -> String {
    format!("^(?:{re})$")
}

/// Checks a path a filter writes into a request line or a Location (ReplaceFullPath, the
/// replacement of ReplacePrefixMatch, a redirect's path): an absolute path of RFC 3986 path
/// characters (`pchar` and `/`) with well-formed escapes. `Err` names the first byte that
/// may not be there: a space, CR/LF, `?`, `#`, a control or non-ASCII byte would break the
/// request line or inject a header. Translate refuses such values; the data plane checks again.
pub fn check_path_value(value: &str) -> Result<(), String> {
    if !value.starts_with('/') {
        return Err("must start with /".into());
    }
    let bytes = value.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let escape = b == b'%'
            && bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
            && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit);
        if !(b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/".contains(&b) || escape) {
            return Err(format!(
                "has a character a path may not carry ({:?}); percent-encode it",
                char::from(b)
            ));
        }
        i += if escape { 3 } else { 1 };
    }
    Ok(())
}

/// Everything the data plane serves.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    /// Gateways in a deterministic order (oldest first, then namespace/name).
    pub gateways: Vec<Gateway>,
    /// Backend clusters referenced by [`BackendTarget::Cluster`], sorted by name.
    pub clusters: Vec<Cluster>,
    /// Certificates referenced by listeners and clusters, sorted by name.
    pub certificates: Vec<Certificate>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gateway {
    pub namespace: String,
    pub name: String,
    /// Only listeners that are accepted and free of conflicts.
    pub listeners: Vec<Listener>,
}

impl Gateway {
    /// `namespace/name`, the label used in logs and metrics.
    pub fn key(&self) -> String {
        // Joined by hand, not `format!`: the data plane makes one per route on every apply,
        // and the formatting machinery was a tenth of compiling a listener.
        let mut key = String::with_capacity(self.namespace.len() + 1 + self.name.len());
        key.push_str(&self.namespace);
        key.push('/');
        key.push_str(&self.name);
        key
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ListenerProtocol {
    Http,
    /// HTTP over TLS terminated by the gateway; [`Listener::tls`] holds the certificates.
    Https,
    /// TLS routed by SNI to [`Listener::tls_routes`]: passed through untouched, or terminated
    /// (per [`ListenerTls::mode`]) with the decrypted stream forwarded over TCP.
    Tls,
    /// TCP connections forwarded byte for byte to [`Listener::l4_route`] (TCPRoute).
    Tcp,
    /// UDP datagrams forwarded to [`Listener::l4_route`] (UDPRoute), per client session. A UDP
    /// listener's socket is a UDP one: it may share its port number with a TCP-based listener.
    Udp,
}

/// The transport a listener's socket uses: sockets are keyed by transport and address, so a
/// UDP listener and a TCP-based one may use the same port number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Transport {
    Tcp,
    Udp,
}

impl ListenerProtocol {
    pub fn transport(self) -> Transport {
        match self {
            ListenerProtocol::Udp => Transport::Udp,
            _ => Transport::Tcp,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listener {
    pub name: String,
    /// Address to bind. Several listeners (also of several Gateways) may share one socket;
    /// the request's Host then selects among them by [`Listener::hostname`].
    pub address: IpAddr,
    pub port: u16,
    pub protocol: ListenerProtocol,
    /// `None` matches every host; `*.example.com` matches one or more labels before the suffix.
    pub hostname: Option<String>,
    /// Rules of every route attached to this listener; [`RouteEntry::rule`] indexes here.
    pub rules: Vec<HttpRule>,
    /// One entry per hostname the attached routes serve on this listener.
    pub virtual_hosts: Vec<VirtualHost>,
    /// HTTPS and TLS listeners.
    pub tls: Option<ListenerTls>,
    /// TLS listeners: TLSRoutes by SNI, most specific hostname first.
    pub tls_routes: Vec<TlsRoute>,
    /// TCP and UDP listeners: the one route every connection or session goes to (the oldest of
    /// the routes attached; `None` while none is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l4_route: Option<L4Route>,
    /// HTTP and HTTPS listeners: pre-routing filters (GatewayListenerFilters), run in order on
    /// every request the listener takes, before route matching. Only
    /// [`HttpFilter::ExternalAuth`] appears here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<HttpFilter>,
}

impl Listener {
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.address, self.port)
    }

    pub fn transport(&self) -> Transport {
        self.protocol.transport()
    }
}

/// A TCPRoute or UDPRoute rule attached to a TCP or UDP listener.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct L4Route {
    pub route: RouteRef,
    /// Picked by weight per connection (TCP) or per client session (UDP).
    pub backends: Vec<WeightedBackend>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VirtualHost {
    /// `example.com`, `*.example.com` or `*` (any host).
    pub hostname: String,
    /// In precedence order: the data plane takes the first entry whose match succeeds. Entries of
    /// less specific hostnames that also cover this one are included after this host's own, so
    /// the data plane never has to fall through between virtual hosts.
    pub routes: Vec<RouteEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteEntry {
    /// Shared with the route's translated rule: a pass builds its virtual hosts without
    /// copying any match, and the data plane knows a host whose matches are the same objects
    /// as last time without reading them (serialised as the match itself).
    pub matcher: Arc<HttpMatch>,
    /// Index into [`Listener::rules`].
    pub rule: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpMatch {
    pub path: PathMatch,
    /// Upper-case method name, e.g. `GET`.
    pub method: Option<String>,
    /// Header names are lower case; at most one entry per name.
    pub headers: Vec<HeaderMatch>,
    /// Query parameter names are case-sensitive; at most one entry per name.
    pub query_params: Vec<QueryParamMatch>,
}

impl Default for HttpMatch {
    fn default() -> Self {
        HttpMatch {
            path: PathMatch::Prefix("/".into()),
            method: None,
            headers: Vec::new(),
            query_params: Vec::new(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PathMatch {
    Exact(String),
    /// Element-wise prefix without a trailing slash (except for `/` itself): `/foo` matches
    /// `/foo`, `/foo/` and `/foo/bar`, never `/foobar`.
    Prefix(String),
    /// Must match the whole path.
    Regex(String),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StringMatch {
    Exact(String),
    /// Must match the whole value.
    Regex(String),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeaderMatch {
    pub name: String,
    pub value: StringMatch,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueryParamMatch {
    pub name: String,
    pub value: StringMatch,
}

/// Identifies the route rule a request matched, for metrics, logs and debugging.
///
/// The names are shared, not owned: translate makes one per route and every rule, listener
/// and pass that carries it clones a reference count, not three strings (a fifth of the
/// allocations of translating 5000 routes were these copies).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RouteRef {
    pub kind: Arc<str>,
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    /// Index of the rule in the route's spec.
    pub rule: usize,
}

impl RouteRef {
    /// `namespace/name`, the label used in logs and metrics.
    pub fn key(&self) -> String {
        // Joined by hand, not `format!`: the data plane makes one per route on every apply,
        // and the formatting machinery was a tenth of compiling a listener.
        let mut key = String::with_capacity(self.namespace.len() + 1 + self.name.len());
        key.push_str(&self.namespace);
        key.push('/');
        key.push_str(&self.name);
        key
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpRule {
    pub route: RouteRef,
    /// Applied in order before a backend is picked.
    pub filters: Vec<HttpFilter>,
    /// Picked by weight. Empty, or all weights zero, answers 500.
    pub backends: Vec<WeightedBackend>,
    pub timeouts: Timeouts,
    /// `retry`: `None` when the rule has none or it allows no retry (`attempts: 0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<Retry>,
}

/// An HTTPRoute rule's `retry`, validated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retry {
    /// Response statuses that are retried, 400 to 599, sorted and deduplicated. Empty: only
    /// failed connections are retried.
    pub codes: Vec<u16>,
    /// Retries after the first attempt; at least 1.
    pub attempts: u32,
    /// The base interval between attempts; `None`: the data plane's default.
    pub backoff_ms: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeouts {
    /// Whole request, from the first byte received to the end of the response headers.
    pub request_ms: Option<u64>,
    /// One attempt at the backend.
    pub backend_request_ms: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HttpFilter {
    RequestHeaders(HeaderModifier),
    ResponseHeaders(HeaderModifier),
    Redirect(Redirect),
    UrlRewrite(UrlRewrite),
    /// `RequestMirror`: a copy of the request also goes to another cluster; its response is
    /// discarded and it never delays or fails the real request.
    Mirror(Mirror),
    /// `CORS`: preflights answered by the gateway, CORS response fields on the rest.
    Cors(Cors),
    /// `ExternalAuth`: an authorization server decides whether the request goes on.
    ExternalAuth(ExternalAuth),
}

/// An `ExternalAuth` filter. A request goes on only when the server allows it; a server that
/// cannot be asked (invalid target, no endpoints, error, timeout) refuses it (fail closed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExternalAuth {
    /// The authorization server: a cluster (HTTP/2 for [`AuthProtocol::Grpc`]), or a
    /// backendRef that cannot be used, whose requests are all refused.
    pub target: BackendTarget,
    pub protocol: AuthProtocol,
    /// `forwardBody.maxSize`: up to this many bytes of the request body are buffered and sent
    /// with the check; a longer body is refused (413). 0: no body is sent.
    #[serde(default)]
    pub forward_body: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthProtocol {
    /// The request's method, path (after `path_prefix`) and some headers go to the server;
    /// a 2xx allows.
    Http {
        /// Prepended to the request's path; "" or a path without a trailing `/`.
        path_prefix: String,
        /// Lower-case names of headers sent besides Host, Authorization and Content-Length.
        allowed_headers: Vec<String>,
        /// Lower-case names of the allow response's headers copied onto the request; empty:
        /// all but Host and the response's own framing.
        allowed_response_headers: Vec<String>,
    },
    /// Envoy's `envoy.service.auth.v3.Authorization/Check`.
    Grpc {
        /// Lower-case names of the headers sent; empty: all.
        allowed_headers: Vec<String>,
    },
}

/// A mirror whose backend resolved (translate leaves out mirrors whose backendRef does not).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mirror {
    /// Name of a [`Cluster`] in [`Config::clusters`].
    pub cluster: String,
    /// The share of requests mirrored, `numerator / denominator` (`1/1`: every request;
    /// `0/…`: none). `denominator` is never 0 and `numerator` never exceeds it.
    pub numerator: u32,
    pub denominator: u32,
}

/// A CORS policy with its defaults resolved.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cors {
    /// `*` (any origin), `scheme://host[:port]`, or a host with a leading `*.` (one or more
    /// labels) or `*` alone (any host of that scheme). Hosts are lower case.
    pub allow_origins: Vec<String>,
    pub allow_credentials: bool,
    /// Method names as given (case-sensitive), or `*`.
    pub allow_methods: Vec<String>,
    /// Lower-case header names, or `*`.
    pub allow_headers: Vec<String>,
    /// Lower-case header names, or `*`.
    pub expose_headers: Vec<String>,
    /// `Access-Control-Max-Age` in seconds (the Gateway API default is 5).
    pub max_age_seconds: u32,
}

impl HttpRule {
    /// The clusters this rule can send requests to: its backends', its mirrors' and its
    /// authorization servers' (the rule's and its backends' filters).
    pub fn clusters(&self) -> impl Iterator<Item = &str> {
        let backends = self.backends.iter().filter_map(|b| match &b.target {
            BackendTarget::Cluster(name) => Some(name.as_str()),
            BackendTarget::Invalid { .. } => None,
        });
        let filters = self
            .filters
            .iter()
            .chain(self.backends.iter().flat_map(|b| &b.filters));
        backends.chain(filters.filter_map(HttpFilter::cluster))
    }
}

impl HttpFilter {
    /// The cluster a filter sends requests to: a mirror's, an authorization server's.
    pub fn cluster(&self) -> Option<&str> {
        match self {
            HttpFilter::Mirror(m) => Some(m.cluster.as_str()),
            HttpFilter::ExternalAuth(ExternalAuth {
                target: BackendTarget::Cluster(name),
                ..
            }) => Some(name.as_str()),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeaderModifier {
    pub set: Vec<HeaderValue>,
    pub add: Vec<HeaderValue>,
    /// Lower-case names.
    pub remove: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeaderValue {
    /// Lower case.
    pub name: String,
    pub value: String,
}

/// A redirect with every default already resolved for the listener it runs on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Redirect {
    /// `http` or `https`.
    pub scheme: String,
    /// `None` keeps the request's host (without its port).
    pub hostname: Option<String>,
    /// `None` leaves the port out of the Location (the scheme's well-known port).
    pub port: Option<u16>,
    pub path: Option<PathModifier>,
    pub status: u16,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PathModifier {
    ReplaceFullPath(String),
    /// Replaces the part of the path matched by the entry's [`PathMatch::Prefix`].
    ReplacePrefixMatch(String),
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UrlRewrite {
    pub hostname: Option<String>,
    pub path: Option<PathModifier>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WeightedBackend {
    pub weight: u32,
    pub target: BackendTarget,
    /// Filters of this backendRef, applied after the rule's filters.
    pub filters: Vec<HttpFilter>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BackendTarget {
    /// Name of a [`Cluster`] in [`Config::clusters`].
    Cluster(String),
    /// A backendRef that cannot be used: requests routed here get a 500.
    Invalid { reason: String },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum UpstreamProtocol {
    /// HTTP/1.1 with keep-alive; also carries WebSocket upgrades.
    Http1,
    /// HTTP/2: over cleartext with prior knowledge (`kubernetes.io/h2c`), or over the
    /// cluster's TLS with ALPN h2. GRPCRoute backends are always this.
    H2c,
    /// HTTP/1.1 whose every request is expected to upgrade (`kubernetes.io/ws`).
    WebSocket,
    /// A byte stream over TCP (TCPRoute backends): no HTTP, no pools.
    Tcp,
    /// Datagrams over UDP (UDPRoute backends).
    Udp,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cluster {
    /// `namespace/service:port`.
    pub name: String,
    pub protocol: UpstreamProtocol,
    /// Endpoints to balance over. Empty answers 503.
    pub endpoints: Vec<SocketAddr>,
    /// TLS to the endpoints (BackendTLSPolicy); `None` is cleartext.
    pub tls: Option<UpstreamTls>,
}

/// How a listener handles TLS.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenerTls {
    pub mode: TlsMode,
    /// Terminate: names in [`Config::certificates`]; the first is served (several exist so that
    /// e.g. an RSA and an ECDSA certificate can sit side by side; the data plane may pick by the
    /// client's signature schemes).
    pub certificates: Vec<String>,
    /// Client certificate validation (Gateway spec.tls.frontend) for this listener's port.
    pub client_validation: Option<ClientValidation>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TlsMode {
    Terminate,
    Passthrough,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientValidation {
    /// PEM bundle of the CAs client certificates must chain to.
    pub ca_pem: String,
    /// AllowInsecureFallback: a client without a valid certificate is still served.
    pub allow_insecure_fallback: bool,
}

/// A certificate chain and its private key, from a `kubernetes.io/tls` Secret.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Certificate {
    /// `namespace/secret`.
    pub name: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for Certificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Certificate")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A TLSRoute rule attached to a TLS listener.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TlsRoute {
    pub route: RouteRef,
    /// SNI names: exact, `*.example.com`, or `*` for any (also a ClientHello without SNI).
    pub hostnames: Vec<String>,
    /// Picked by weight; the stream is forwarded to an endpoint of the chosen cluster over TCP.
    pub backends: Vec<WeightedBackend>,
}

/// TLS from the gateway to a backend (BackendTLSPolicy).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpstreamTls {
    /// SNI sent, and the name verified when `subject_alt_names` is empty.
    pub server_name: String,
    /// PEM bundle of trusted CAs; `None` uses the system roots.
    pub ca_pem: Option<String>,
    /// When not empty, the backend certificate must carry one of these (DNS names or URIs),
    /// instead of `server_name`.
    pub subject_alt_names: Vec<SubjectAltName>,
    /// Client certificate presented to the backend (Gateway spec.tls.backend), a name in
    /// [`Config::certificates`].
    pub client_certificate: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SubjectAltName {
    Dns(String),
    Uri(String),
}
