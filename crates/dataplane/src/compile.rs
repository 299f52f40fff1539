//! IR -> per-socket routing tables. Runs once per apply, on the caller's task, never on the
//! request path: regexes are built and anchored here, names and values parsed into `http`
//! types, label strings interned into `Arc<str>`, metric handles resolved.
//!
//! Anything the IR holds that cannot be executed (a bad regex, an unparsable header name) is
//! logged and contained: a matcher that cannot compile never matches, a filter that cannot
//! compile answers 500 for its rule. The rest of the configuration is unaffected.

use crate::Metrics;
use crate::balancer::{RoundRobin, Weighted};
use crate::filters::{Filter, HeaderMods, PathModifier, RedirectSpec, RewriteSpec};
use crate::metrics::RouteMetrics;
use crate::router::{
    HeaderMatcher, HostTable, PathMatcher, QueryMatcher, RequestMatcher, ValueMatcher,
};
use crate::upstream::{H2Endpoint, Upstreams};
use gatehouse_ir as ir;
use http::uri::Authority;
use http::{HeaderName, HeaderValue, Method, StatusCode};
use prometheus_client::metrics::counter::Counter;
use regex::Regex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tracing::warn;

/// Everything one bound socket routes with.
#[derive(Debug)]
pub(crate) struct SocketTable {
    pub listeners: Vec<CompiledListener>,
    /// Request host -> index into `listeners`.
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
}

#[derive(Debug)]
pub(crate) struct CompiledVhost {
    pub routes: Vec<CompiledRoute>,
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
}

#[derive(Debug)]
pub(crate) struct Endpoint {
    pub addr: SocketAddr,
    /// `ip:port`, the authority of upstream request URIs (it is also the pool key).
    pub authority: Authority,
    /// The shared HTTP/2 connection, for h2c clusters.
    pub h2: Option<Arc<H2Endpoint>>,
}

/// `^(?:re)$`: the group keeps alternations inside the anchors.
pub(crate) fn full_match_regex(re: &str) -> Result<Regex, regex::Error> {
    Regex::new(&format!("^(?:{re})$"))
}

pub(crate) struct Compiler<'a> {
    pub metrics: &'a Metrics,
    pub upstreams: &'a Upstreams,
    pub default_timeout: Option<Duration>,
}

impl Compiler<'_> {
    pub(crate) fn compile(&self, config: &ir::Config) -> HashMap<SocketAddr, SocketTable> {
        let clusters: HashMap<&str, Arc<ClusterState>> = config
            .clusters
            .iter()
            .map(|c| (c.name.as_str(), Arc::new(self.cluster(c))))
            .collect();
        // The h2 registry only needs endpoints that are still referenced.
        self.upstreams.prune_h2();

        struct Building {
            listeners: Vec<CompiledListener>,
            hosts: HostTable<usize>,
            gateways: Vec<Arc<str>>,
        }
        let mut sockets: HashMap<SocketAddr, Building> = HashMap::new();
        for gateway in &config.gateways {
            let gateway_key: Arc<str> = gateway.key().into();
            for listener in &gateway.listeners {
                let building = sockets
                    .entry(listener.socket_addr())
                    .or_insert_with(|| Building {
                        listeners: Vec::new(),
                        hosts: HostTable::default(),
                        gateways: Vec::new(),
                    });
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
                building
                    .listeners
                    .push(self.listener(&gateway_key, listener, &clusters));
                if !building.gateways.contains(&gateway_key) {
                    building.gateways.push(gateway_key.clone());
                }
            }
        }
        sockets
            .into_iter()
            .map(|(addr, b)| {
                let gateway = match b.gateways.as_slice() {
                    [only] => only.clone(),
                    _ => Arc::from(""),
                };
                let table = SocketTable {
                    listeners: b.listeners,
                    hosts: b.hosts,
                    unmatched: RouteMetrics::new(self.metrics, gateway, Arc::from(""), 404),
                };
                (addr, table)
            })
            .collect()
    }

    fn cluster(&self, cluster: &ir::Cluster) -> ClusterState {
        let name: Arc<str> = cluster.name.as_str().into();
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
                    .then(|| self.upstreams.h2_endpoint(addr));
                Some(Endpoint {
                    addr,
                    authority,
                    h2,
                })
            })
            .collect();
        ClusterState {
            connect_failures: self.metrics.cluster_connect_failures(&name),
            name,
            endpoints: RoundRobin::new(endpoints),
        }
    }

    fn listener(
        &self,
        gateway: &Arc<str>,
        listener: &ir::Listener,
        clusters: &HashMap<&str, Arc<ClusterState>>,
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
            if !vhosts.insert(Some(&vhost.hostname), CompiledVhost { routes }) {
                warn!(
                    listener = listener.name,
                    hostname = vhost.hostname,
                    "duplicate virtual host; ignored"
                );
            }
        }
        CompiledListener {
            vhosts,
            rules,
            unmatched: RouteMetrics::new(self.metrics, gateway.clone(), Arc::from(""), 404),
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
            let target = match &b.target {
                ir::BackendTarget::Cluster(name) => match clusters.get(name.as_str()) {
                    Some(c) => Target::Cluster(c.clone()),
                    None => {
                        warn!(
                            route = &*route,
                            cluster = name,
                            "unknown cluster; answering 500"
                        );
                        Target::Invalid
                    }
                },
                ir::BackendTarget::Invalid { .. } => Target::Invalid,
            };
            let backend = Backend {
                target,
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

fn request_matcher(m: &ir::HttpMatch) -> Result<RequestMatcher, String> {
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
