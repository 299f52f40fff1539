//! IR -> per-socket routing tables. Runs once per apply, on the caller's task, never on the
//! request path: regexes are built and anchored here, names and values parsed into `http`
//! types, label strings interned into `Arc<str>`, metric handles resolved.
//!
//! Anything the IR holds that cannot be executed (a bad regex, an unparsable header name) is
//! logged and contained: a matcher that cannot compile never matches, a filter that cannot
//! compile answers 500 for its rule. The rest of the configuration is unaffected. The same holds
//! for TLS: a listener whose certificate does not load refuses handshakes for its names, a
//! cluster whose backend TLS settings do not load answers 502.

use crate::Metrics;
use crate::balancer::{RoundRobin, Weighted};
use crate::filters::{Filter, HeaderMods, PathModifier, RedirectSpec, RewriteSpec};
use crate::metrics::RouteMetrics;
use crate::router::{
    HeaderMatcher, HostTable, PathMatcher, QueryMatcher, RequestMatcher, RouteTable, ValueMatcher,
};
use crate::tls::{self, ClientKey, LoadedCert, TlsCache};
use crate::upstream::{H2Endpoint, TlsUpstream, Upstreams};
use gatehouse_ir as ir;
use http::uri::Authority;
use http::{HeaderName, HeaderValue, Method, StatusCode};
use prometheus_client::metrics::counter::Counter;
use regex::Regex;
use rustls::ServerConfig;
use rustls::sign::CertifiedKey;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tracing::{error, warn};

/// Everything one bound socket routes with.
#[derive(Debug)]
pub(crate) struct SocketTable {
    /// Connections start with a TLS ClientHello (HTTPS and TLS listeners) rather than HTTP.
    pub tls: bool,
    pub listeners: Vec<CompiledListener>,
    /// Request host (or SNI name) -> index into `listeners`.
    pub hosts: HostTable<usize>,
    /// Metrics for requests no listener takes. The gateway label is the socket's gateway when
    /// only one gateway listens here, empty otherwise.
    pub unmatched: RouteMetrics,
}

#[derive(Debug)]
pub(crate) struct CompiledListener {
    pub vhosts: HostTable<CompiledVhost>,
    pub rules: Vec<CompiledRule>,
    /// Metrics for requests this listener takes but no route matches.
    pub unmatched: RouteMetrics,
    pub mode: ListenerMode,
    /// TLS listeners: SNI name -> index into `tls_routes`.
    pub tls_hosts: HostTable<usize>,
    pub tls_routes: Vec<CompiledTlsRoute>,
    /// `gatehouse_tls_handshakes_total` of this listener.
    pub handshakes: Counter,
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
}

#[derive(Debug)]
pub(crate) struct CompiledTlsRoute {
    pub route: Arc<str>,
    pub backends: Weighted<Target>,
}

#[derive(Debug)]
pub(crate) struct CompiledVhost {
    /// In precedence order, with exact-header indexes over long runs of header matches.
    pub routes: RouteTable,
}

#[derive(Debug)]
pub(crate) struct CompiledRoute {
    pub matcher: RequestMatcher,
    /// Index into [`CompiledListener::rules`], checked at compile time.
    pub rule: usize,
}

#[derive(Debug)]
pub(crate) struct CompiledRule {
    pub metrics: RouteMetrics,
    pub filters: Box<[Filter]>,
    pub backends: Weighted<Backend>,
    /// Until response headers: the tighter of the rule's request and backend-request timeouts,
    /// or the default.
    pub timeout: Option<Duration>,
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
}

/// `^(?:re)$`: the group keeps alternations inside the anchors.
pub(crate) fn full_match_regex(re: &str) -> Result<Regex, regex::Error> {
    Regex::new(&format!("^(?:{re})$"))
}

pub(crate) struct Compiler<'a> {
    pub metrics: &'a Metrics,
    pub upstreams: &'a Upstreams,
    pub tls: &'a mut TlsCache,
    pub default_timeout: Option<Duration>,
}

type Certificates = HashMap<String, Arc<LoadedCert>>;

impl Compiler<'_> {
    pub(crate) fn compile(&mut self, config: &ir::Config) -> HashMap<SocketAddr, SocketTable> {
        let certs = self.tls.certificates(&config.certificates, self.metrics);
        let clusters: HashMap<&str, Arc<ClusterState>> = config
            .clusters
            .iter()
            .map(|c| (c.name.as_str(), Arc::new(self.cluster(c, &certs))))
            .collect();

        struct Building {
            tls: bool,
            listeners: Vec<CompiledListener>,
            hosts: HostTable<usize>,
            gateways: Vec<Arc<str>>,
        }
        let mut sockets: HashMap<SocketAddr, Building> = HashMap::new();
        for gateway in &config.gateways {
            let gateway_key: Arc<str> = gateway.key().into();
            for listener in &gateway.listeners {
                let tls = listener.protocol != ir::ListenerProtocol::Http;
                let building = sockets
                    .entry(listener.socket_addr())
                    .or_insert_with(|| Building {
                        tls,
                        listeners: Vec::new(),
                        hosts: HostTable::default(),
                        gateways: Vec::new(),
                    });
                if building.tls != tls {
                    // Translate never puts HTTP and HTTPS/TLS on one port; the first listener
                    // decides what the socket speaks.
                    warn!(
                        gateway = &*gateway_key,
                        listener = listener.name,
                        address = %listener.socket_addr(),
                        "listener mixes plaintext HTTP and TLS on one address; ignored",
                    );
                    continue;
                }
                let index = building.listeners.len();
                if !building.hosts.insert(listener.hostname.as_deref(), index) {
                    warn!(
                        gateway = &*gateway_key,
                        listener = listener.name,
                        hostname = listener.hostname.as_deref().unwrap_or("*"),
                        address = %listener.socket_addr(),
                        "another listener already serves this hostname on this address; ignored",
                    );
                    continue;
                }
                let compiled = self.listener(&gateway_key, listener, &clusters, &certs);
                building.listeners.push(compiled);
                if !building.gateways.contains(&gateway_key) {
                    building.gateways.push(gateway_key.clone());
                }
            }
        }
        let tables = sockets
            .into_iter()
            .map(|(addr, b)| {
                let gateway = match b.gateways.as_slice() {
                    [only] => only.clone(),
                    _ => Arc::from(""),
                };
                let table = SocketTable {
                    tls: b.tls,
                    listeners: b.listeners,
                    hosts: b.hosts,
                    unmatched: RouteMetrics::new(self.metrics, gateway, Arc::from(""), 404),
                };
                (addr, table)
            })
            .collect();
        // Registries and caches only keep what this configuration still uses.
        self.upstreams.finish_apply();
        self.tls.finish();
        tables
    }

    fn cluster(&mut self, cluster: &ir::Cluster, certs: &Certificates) -> ClusterState {
        let name: Arc<str> = cluster.name.as_str().into();
        let (tls, tls_broken) = match &cluster.tls {
            None => (None, false),
            Some(settings) => match self.upstream_tls(cluster, settings, certs) {
                Ok(tls) => (Some(tls), false),
                Err(error) => {
                    error!(cluster = cluster.name, %error, "backend TLS cannot be set up; requests to this cluster answer 502");
                    (None, true)
                }
            },
        };
        let endpoints = cluster
            .endpoints
            .iter()
            .filter_map(|&addr| {
                let authority = match Authority::try_from(addr.to_string()) {
                    Ok(a) => a,
                    Err(e) => {
                        warn!(cluster = cluster.name, %addr, error = %e, "unusable endpoint");
                        return None;
                    }
                };
                let h2 = (cluster.protocol == ir::UpstreamProtocol::H2c)
                    .then(|| self.upstreams.h2_endpoint(addr, tls.clone()));
                let pool = h2
                    .is_none()
                    .then(|| self.upstreams.h1_pool(addr, tls.clone()));
                Some(Endpoint {
                    addr,
                    authority,
                    h2,
                    pool,
                    tls: tls.clone(),
                })
            })
            .collect();
        ClusterState {
            connect_failures: self.metrics.cluster_connect_failures(&name),
            name,
            endpoints: RoundRobin::new(endpoints),
            tls_broken,
        }
    }

    fn upstream_tls(
        &self,
        cluster: &ir::Cluster,
        settings: &ir::UpstreamTls,
        certs: &Certificates,
    ) -> Result<Arc<TlsUpstream>, String> {
        let client_cert: Option<Arc<CertifiedKey>> =
            settings
                .client_certificate
                .as_ref()
                .and_then(|name| match certs.get(name) {
                    Some(cert) => Some(cert.key.clone()),
                    None => {
                        warn!(
                            cluster = cluster.name,
                            certificate = name,
                            "backend client certificate is not loaded; connecting without one"
                        );
                        None
                    }
                });
        let h2 = cluster.protocol == ir::UpstreamProtocol::H2c;
        let key = ClientKey::new(settings, client_cert.as_ref(), h2);
        let provider = &self.tls.provider;
        self.upstreams.tls_upstream(key, || {
            tls::client_config(settings, client_cert, h2, provider)
        })
    }

    /// A terminating listener's `ServerConfig`, or `None` (logged) when it cannot serve.
    fn server_config(
        &mut self,
        gateway: &str,
        listener: &ir::Listener,
        certs: &Certificates,
        http: bool,
    ) -> Option<Arc<ServerConfig>> {
        let Some(settings) = &listener.tls else {
            error!(
                gateway,
                listener = listener.name,
                "TLS listener without TLS settings; handshakes are refused"
            );
            return None;
        };
        let keys: Vec<Arc<CertifiedKey>> = settings
            .certificates
            .iter()
            .filter_map(|name| certs.get(name).map(|c| c.key.clone()))
            .collect();
        if keys.is_empty() {
            error!(
                gateway,
                listener = listener.name,
                certificates = ?settings.certificates,
                "no usable certificate; handshakes for this listener's names are refused"
            );
            return None;
        }
        match self
            .tls
            .server_config(keys, settings.client_validation.as_ref(), http)
        {
            Ok(config) => Some(config),
            Err(error) => {
                error!(
                    gateway,
                    listener = listener.name,
                    %error,
                    "TLS settings cannot be used; handshakes for this listener's names are refused"
                );
                None
            }
        }
    }

    fn target(
        &self,
        route: &str,
        target: &ir::BackendTarget,
        clusters: &HashMap<&str, Arc<ClusterState>>,
    ) -> Target {
        match target {
            ir::BackendTarget::Cluster(name) => match clusters.get(name.as_str()) {
                Some(c) => Target::Cluster(c.clone()),
                None => {
                    warn!(route, cluster = name, "unknown cluster; answering 500");
                    Target::Invalid
                }
            },
            ir::BackendTarget::Invalid { .. } => Target::Invalid,
        }
    }

    fn tls_routes(
        &self,
        listener: &ir::Listener,
        clusters: &HashMap<&str, Arc<ClusterState>>,
    ) -> (HostTable<usize>, Vec<CompiledTlsRoute>) {
        let mut hosts = HostTable::default();
        let mut routes = Vec::with_capacity(listener.tls_routes.len());
        for (index, route) in listener.tls_routes.iter().enumerate() {
            let key = route.route.key();
            // No hostnames: every name the listener takes.
            let names: &[String] = &route.hostnames;
            if names.is_empty() {
                hosts.insert(None, index);
            }
            for name in names {
                // The IR lists the most specific routes first, so the first claim wins.
                hosts.insert(Some(name), index);
            }
            let backends = Weighted::new(
                route
                    .backends
                    .iter()
                    .map(|b| (b.weight, self.target(&key, &b.target, clusters))),
            );
            routes.push(CompiledTlsRoute {
                route: key.into(),
                backends,
            });
        }
        (hosts, routes)
    }

    fn listener(
        &mut self,
        gateway: &Arc<str>,
        listener: &ir::Listener,
        clusters: &HashMap<&str, Arc<ClusterState>>,
        certs: &Certificates,
    ) -> CompiledListener {
        let mut route_keys: HashMap<String, Arc<str>> = HashMap::new();
        let rules = listener
            .rules
            .iter()
            .map(|rule| {
                let key = rule.route.key();
                let route = route_keys
                    .entry(key)
                    .or_insert_with_key(|k| k.as_str().into())
                    .clone();
                self.rule(gateway.clone(), route, rule, clusters)
            })
            .collect::<Vec<_>>();
        let mut vhosts = HostTable::default();
        for vhost in &listener.virtual_hosts {
            let routes = vhost
                .routes
                .iter()
                .filter_map(|entry| {
                    if entry.rule >= rules.len() {
                        warn!(
                            listener = listener.name,
                            rule = entry.rule,
                            "route entry points past the listener's rules; ignored"
                        );
                        return None;
                    }
                    match request_matcher(&entry.matcher) {
                        Ok(matcher) => Some(CompiledRoute {
                            matcher,
                            rule: entry.rule,
                        }),
                        Err(error) => {
                            warn!(
                                listener = listener.name,
                                route = %listener.rules[entry.rule].route.key(),
                                %error,
                                "match cannot be compiled; it will never match"
                            );
                            None
                        }
                    }
                })
                .collect();
            let routes = RouteTable::new(routes);
            if !vhosts.insert(Some(&vhost.hostname), CompiledVhost { routes }) {
                warn!(
                    listener = listener.name,
                    hostname = vhost.hostname,
                    "duplicate virtual host; ignored"
                );
            }
        }
        let mode = match listener.protocol {
            ir::ListenerProtocol::Http => ListenerMode::Http,
            ir::ListenerProtocol::Https => ListenerMode::Terminate {
                config: self.server_config(gateway, listener, certs, true),
                http: true,
            },
            ir::ListenerProtocol::Tls => match listener.tls.as_ref().map(|t| t.mode) {
                Some(ir::TlsMode::Terminate) => ListenerMode::Terminate {
                    config: self.server_config(gateway, listener, certs, false),
                    http: false,
                },
                Some(ir::TlsMode::Passthrough) | None => ListenerMode::Passthrough,
            },
        };
        let (tls_hosts, tls_routes) = self.tls_routes(listener, clusters);
        // Only listeners that terminate TLS have a handshake series.
        let handshakes = match mode {
            ListenerMode::Terminate { .. } => self
                .metrics
                .listener_handshakes(gateway, &listener.name.as_str().into()),
            _ => Counter::default(),
        };
        CompiledListener {
            vhosts,
            rules,
            unmatched: RouteMetrics::new(self.metrics, gateway.clone(), Arc::from(""), 404),
            mode,
            tls_hosts,
            tls_routes,
            handshakes,
        }
    }

    fn rule(
        &self,
        gateway: Arc<str>,
        route: Arc<str>,
        rule: &ir::HttpRule,
        clusters: &HashMap<&str, Arc<ClusterState>>,
    ) -> CompiledRule {
        let backends = Weighted::new(rule.backends.iter().map(|b| {
            let backend = Backend {
                target: self.target(&route, &b.target, clusters),
                filters: filters(&route, &b.filters),
            };
            (b.weight, backend)
        }));
        let timeouts = &rule.timeouts;
        let timeout = if timeouts.request_ms.is_none() && timeouts.backend_request_ms.is_none() {
            self.default_timeout
        } else {
            // Gateway API spells "no timeout" as 0s, so zero values do not bound anything.
            [timeouts.request_ms, timeouts.backend_request_ms]
                .into_iter()
                .flatten()
                .filter(|&ms| ms > 0)
                .min()
                .map(Duration::from_millis)
        };
        CompiledRule {
            filters: filters(&route, &rule.filters),
            metrics: RouteMetrics::new(self.metrics, gateway, route, 200),
            backends,
            timeout,
        }
    }
}

pub(crate) fn request_matcher(m: &ir::HttpMatch) -> Result<RequestMatcher, String> {
    let path = match &m.path {
        ir::PathMatch::Exact(p) => PathMatcher::Exact(p.as_str().into()),
        ir::PathMatch::Prefix(p) => PathMatcher::Prefix(p.trim_end_matches('/').into()),
        ir::PathMatch::Regex(re) => {
            PathMatcher::Regex(full_match_regex(re).map_err(|e| format!("path regex: {e}"))?)
        }
    };
    let method = m
        .method
        .as_deref()
        .map(|s| Method::from_bytes(s.as_bytes()).map_err(|e| format!("method {s:?}: {e}")))
        .transpose()?;
    let headers = m
        .headers
        .iter()
        .map(|h| {
            Ok(HeaderMatcher {
                name: HeaderName::from_bytes(h.name.as_bytes())
                    .map_err(|e| format!("header name {:?}: {e}", h.name))?,
                value: value_matcher(&h.value)?,
            })
        })
        .collect::<Result<_, String>>()?;
    let query = m
        .query_params
        .iter()
        .map(|q| {
            Ok(QueryMatcher {
                name: q.name.as_str().into(),
                value: value_matcher(&q.value)?,
            })
        })
        .collect::<Result<_, String>>()?;
    Ok(RequestMatcher {
        path,
        method,
        headers,
        query,
    })
}

fn value_matcher(m: &ir::StringMatch) -> Result<ValueMatcher, String> {
    Ok(match m {
        ir::StringMatch::Exact(v) => ValueMatcher::Exact(v.as_str().into()),
        ir::StringMatch::Regex(re) => {
            ValueMatcher::Regex(full_match_regex(re).map_err(|e| format!("regex {re:?}: {e}"))?)
        }
    })
}

fn filters(route: &str, filters: &[ir::HttpFilter]) -> Box<[Filter]> {
    filters
        .iter()
        .map(|f| {
            filter(f).unwrap_or_else(|error| {
                warn!(route, %error, "filter cannot be compiled; its rule answers 500");
                Filter::Invalid
            })
        })
        .collect()
}

fn filter(f: &ir::HttpFilter) -> Result<Filter, String> {
    Ok(match f {
        ir::HttpFilter::RequestHeaders(m) => Filter::RequestHeaders(header_mods(m)?),
        ir::HttpFilter::ResponseHeaders(m) => Filter::ResponseHeaders(header_mods(m)?),
        ir::HttpFilter::Redirect(r) => Filter::Redirect(RedirectSpec {
            scheme: r.scheme.to_ascii_lowercase().into(),
            hostname: r.hostname.as_deref().map(Into::into),
            port: r.port,
            path: r.path.as_ref().map(path_modifier),
            status: StatusCode::from_u16(r.status)
                .ok()
                .filter(StatusCode::is_redirection)
                .ok_or_else(|| format!("redirect status {}", r.status))?,
        }),
        ir::HttpFilter::UrlRewrite(r) => Filter::UrlRewrite(RewriteSpec {
            hostname: r
                .hostname
                .as_deref()
                .map(|h| HeaderValue::from_str(h).map_err(|e| format!("hostname {h:?}: {e}")))
                .transpose()?,
            path: r.path.as_ref().map(path_modifier),
        }),
    })
}

fn path_modifier(p: &ir::PathModifier) -> PathModifier {
    match p {
        ir::PathModifier::ReplaceFullPath(p) => PathModifier::Full(p.as_str().into()),
        ir::PathModifier::ReplacePrefixMatch(p) => PathModifier::Prefix(p.as_str().into()),
    }
}

fn header_mods(m: &ir::HeaderModifier) -> Result<HeaderMods, String> {
    let pair = |h: &ir::HeaderValue| -> Result<(HeaderName, HeaderValue), String> {
        Ok((
            HeaderName::from_bytes(h.name.as_bytes())
                .map_err(|e| format!("header name {:?}: {e}", h.name))?,
            HeaderValue::from_str(&h.value)
                .map_err(|e| format!("header value for {:?}: {e}", h.name))?,
        ))
    };
    Ok(HeaderMods {
        set: m.set.iter().map(pair).collect::<Result<_, _>>()?,
        add: m.add.iter().map(pair).collect::<Result<_, _>>()?,
        remove: m
            .remove
            .iter()
            .map(|n| {
                HeaderName::from_bytes(n.as_bytes()).map_err(|e| format!("header name {n:?}: {e}"))
            })
            .collect::<Result<_, _>>()?,
    })
}
