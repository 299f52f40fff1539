//! IR -> per-socket routing tables ([`crate::table`]). Runs once per apply, on the caller's
//! task, never on the request path: matchers and filters are converted from the IR by their
//! own `TryFrom` implementations (regexes built and anchored, names and values parsed), label
//! strings interned into `Arc<str>`, metric handles resolved, TLS configurations built or
//! reused.
//!
//! # Contain, never reject
//!
//! The data plane applies every configuration it is given. What translate can judge it refuses
//! before the IR exists, with a status condition; what is left for the data plane to find (a
//! certificate or TLS setting that does not load, an IR made by something other than
//! translate) is contained to the smallest unit that cannot work, and reported as a
//! [`Diagnostic`]:
//!
//! | problem | contained to |
//! |---|---|
//! | a match that cannot compile | that match never matches |
//! | a filter that cannot compile | its rule answers 500 |
//! | a mirror naming an unknown cluster | that mirror is left out |
//! | a backend naming an unknown cluster | its share of the rule answers 500 |
//! | a cluster whose backend TLS cannot be set up | requests to it answer 502 |
//! | a listener whose certificates or TLS settings do not load | handshakes for its names are refused |
//! | a listener that clashes with another on its address (protocol, hostname; a second TCP or UDP listener) | that listener is left out |
//! | an endpoint without a usable address, a missing client certificate | that endpoint / certificate is skipped |
//!
//! Everything else of the configuration applies.

use crate::balancer::{RoundRobin, Weighted};
use crate::filters::Filter;
use crate::l4::L4Route;
use crate::matchers::RequestMatcher;
use crate::metrics::L4Metrics;
use crate::metrics::{AuthMetrics, MirrorMetrics, RouteMetrics};
use crate::mirror::{self, MirrorSpec};
use crate::reuse::Reuse;
use crate::router::{HostTable, RouteTable};
use crate::table::{
    Backend, ClusterState, CompiledListener, CompiledRoute, CompiledRule, CompiledTlsRoute,
    CompiledVhost, Endpoint, ListenerMode, SocketTable, Speaks, Target,
};
use crate::tls::{self, ClientKey, LoadedCert, TlsCache};
use crate::upstream::{TlsUpstream, Upstreams};
use crate::{Metrics, SocketKey};
use gatehouse_ir as ir;
use http::uri::Authority;
use prometheus_client::metrics::counter::Counter;
use rustls::ServerConfig;
use rustls::sign::CertifiedKey;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tracing::warn;

/// A problem the data plane contained instead of rejecting the configuration (see the module
/// documentation for what each kind costs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// What it concerns: `gateway ns/name listener x`, `route ns/name`, `cluster ns/svc:80`.
    pub subject: String,
    /// What is wrong and what the data plane does about it.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.subject, self.message)
    }
}

pub(crate) struct Compiler<'a> {
    pub metrics: &'a Metrics,
    pub upstreams: &'a Upstreams,
    pub tls: &'a mut TlsCache,
    pub default_timeout: Option<Duration>,
    /// What this apply contained so far.
    pub diagnostics: Vec<Diagnostic>,
    /// What the last apply compiled from each virtual host.
    pub hosts: &'a mut CompiledHosts,
}

/// The route tables the last apply compiled, by listener and hostname, with the matches each
/// was compiled from. Translate shares each match between the route's rule and every virtual
/// host entry made from it (`Arc`), so a host whose entries hold the same match objects as
/// last time (a change elsewhere, or a route added before it, which only moves its rules'
/// indices) takes its table again without compiling or even reading them: a pass that adds one
/// route compiles one host instead of thousands. The matches are held, so no other match can
/// take their addresses while a table is kept. A configuration decoded afresh (a provisioned
/// data plane's snapshot) shares nothing; such a data plane turns keeping off.
pub(crate) struct CompiledHosts {
    /// Off: nothing is kept ([`crate::Options::keep_compiled_hosts`]).
    enabled: bool,
    listeners: Reuse<(Arc<str>, String), KeptHosts>,
}

/// One listener's kept tables, by hostname (foldhash: looked up for every host of every
/// apply).
type KeptHosts = Reuse<String, KeptTable, foldhash::fast::RandomState>;

struct KeptTable {
    matchers: Box<[Arc<ir::HttpMatch>]>,
    table: Arc<RouteTable>,
}

impl KeptTable {
    fn new(vhost: &ir::VirtualHost, table: &Arc<RouteTable>) -> Self {
        KeptTable {
            matchers: vhost
                .routes
                .iter()
                .map(|e| Arc::clone(&e.matcher))
                .collect(),
            table: Arc::clone(table),
        }
    }

    /// Whether the table holds for `vhost` in a listener of `rules` rules: compiled from the
    /// same match objects, and every entry's rule there (a table leaves out entries past the
    /// rules it was compiled with).
    fn holds_for(&self, vhost: &ir::VirtualHost, rules: usize) -> bool {
        self.matchers.len() == vhost.routes.len()
            && self
                .matchers
                .iter()
                .zip(&vhost.routes)
                .all(|(m, e)| Arc::ptr_eq(m, &e.matcher) && e.rule < rules)
    }
}

impl CompiledHosts {
    pub(crate) fn new(enabled: bool) -> Self {
        CompiledHosts {
            enabled,
            listeners: Reuse::default(),
        }
    }
}

type Certificates = HashMap<String, Arc<LoadedCert>>;

/// Whether two rules' references name the same route (kind, namespace, name): by pointer
/// first, as translate shares one set of names between a route's rules.
fn same_route(a: &ir::RouteRef, b: &ir::RouteRef) -> bool {
    let same = |x: &Arc<str>, y: &Arc<str>| Arc::ptr_eq(x, y) || x == y;
    same(&a.name, &b.name) && same(&a.namespace, &b.namespace) && same(&a.kind, &b.kind)
}

/// foldhash: looked up for every backend of every rule on each apply; seeded per map, as
/// SipHash is, at a fraction of its cost.
type Clusters<'c> = HashMap<&'c str, Arc<ClusterState>, foldhash::fast::RandomState>;

impl Compiler<'_> {
    /// Records (and logs) a problem that was contained.
    fn contain(&mut self, subject: impl Into<String>, message: impl fmt::Display) {
        let d = Diagnostic {
            subject: subject.into(),
            message: message.to_string(),
        };
        warn!("{d}");
        self.diagnostics.push(d);
    }

    pub(crate) fn compile(&mut self, config: &ir::Config) -> HashMap<SocketKey, SocketTable> {
        let certs = self.tls.certificates(&config.certificates, self.metrics);
        let clusters: Clusters = config
            .clusters
            .iter()
            .map(|c| (c.name.as_str(), Arc::new(self.cluster(c, &certs))))
            .collect();

        struct Building {
            speaks: Speaks,
            listeners: Vec<CompiledListener>,
            hosts: HostTable<usize>,
            gateways: Vec<Arc<str>>,
        }
        let mut sockets: HashMap<SocketKey, Building> = HashMap::new();
        for gateway in &config.gateways {
            let gateway_key: Arc<str> = gateway.key().into();
            for listener in &gateway.listeners {
                let subject = || format!("gateway {gateway_key} listener {}", listener.name);
                let speaks = Speaks::of(listener.protocol);
                let address = listener.socket_addr();
                let building = sockets
                    .entry((listener.transport(), address))
                    .or_insert_with(|| Building {
                        speaks,
                        listeners: Vec::new(),
                        hosts: HostTable::default(),
                        gateways: Vec::new(),
                    });
                if building.speaks != speaks {
                    // The first listener decides what the socket speaks.
                    self.contain(
                        subject(),
                        format_args!(
                            "{address} already speaks {}; listener left out",
                            building.speaks.describe()
                        ),
                    );
                    continue;
                }
                let index = building.listeners.len();
                // A TCP or UDP socket has nothing to tell two listeners apart by.
                let single = matches!(speaks, Speaks::Tcp | Speaks::Udp);
                if single && index > 0 {
                    self.contain(
                        subject(),
                        format_args!(
                            "another listener already forwards {address}; listener left out"
                        ),
                    );
                    continue;
                }
                if !building.hosts.insert(listener.hostname.as_deref(), index) {
                    self.contain(
                        subject(),
                        format_args!(
                            "another listener already serves hostname {} on {address}; listener left out",
                            listener.hostname.as_deref().unwrap_or("*")
                        ),
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
            .map(|(key, b)| {
                let gateway = match b.gateways.as_slice() {
                    [only] => only.clone(),
                    _ => Arc::from(""),
                };
                let pre_routing = b.listeners.iter().any(|l| !l.filters.is_empty());
                let table = SocketTable {
                    pre_routing,
                    speaks: b.speaks,
                    listeners: b.listeners,
                    hosts: b.hosts,
                    unmatched: RouteMetrics::new(gateway, Arc::from(""), 404),
                };
                (key, table)
            })
            .collect();
        // Registries and caches only keep what this configuration still uses.
        self.upstreams.finish_apply();
        self.tls.finish();
        self.hosts.listeners.finish();
        tables
    }

    fn cluster(&mut self, cluster: &ir::Cluster, certs: &Certificates) -> ClusterState {
        let name: Arc<str> = cluster.name.as_str().into();
        let subject = || format!("cluster {}", cluster.name);
        let (tls, tls_broken) = match &cluster.tls {
            None => (None, false),
            Some(settings) => match self.upstream_tls(cluster, settings, certs) {
                Ok(tls) => (Some(tls), false),
                Err(error) => {
                    self.contain(
                        subject(),
                        format_args!(
                            "backend TLS cannot be set up ({error}); requests to it answer 502"
                        ),
                    );
                    (None, true)
                }
            },
        };
        let mut endpoints = Vec::with_capacity(cluster.endpoints.len());
        for &addr in &cluster.endpoints {
            let authority = match Authority::try_from(addr.to_string()) {
                Ok(a) => a,
                Err(e) => {
                    self.contain(
                        subject(),
                        format_args!("endpoint {addr} is unusable ({e}); skipped"),
                    );
                    continue;
                }
            };
            let h2 = (cluster.protocol == ir::UpstreamProtocol::H2c)
                .then(|| self.upstreams.h2_endpoint(addr, tls.clone()));
            // TCPRoute and UDPRoute backends get connections (sockets) of their own per
            // client connection (session), never pooled HTTP ones.
            let l4 = matches!(
                cluster.protocol,
                ir::UpstreamProtocol::Tcp | ir::UpstreamProtocol::Udp
            );
            let pool = (h2.is_none() && !l4).then(|| self.upstreams.h1_pool(addr, tls.clone()));
            endpoints.push(Endpoint {
                addr,
                authority,
                h2,
                pool,
                tls: tls.clone(),
                health: self.upstreams.health(addr),
            });
        }
        ClusterState {
            connect_failures: self.metrics.cluster_connect_failures(&name),
            retries: self.metrics.cluster_retries(&name),
            ejections: self.metrics.cluster_ejections(&name),
            route_retries: self.metrics.cluster_route_retries(&name),
            name,
            endpoints: RoundRobin::new(endpoints),
            tls_broken,
        }
    }

    fn upstream_tls(
        &mut self,
        cluster: &ir::Cluster,
        settings: &ir::UpstreamTls,
        certs: &Certificates,
    ) -> Result<Arc<TlsUpstream>, String> {
        let client_cert: Option<Arc<CertifiedKey>> = match &settings.client_certificate {
            None => None,
            Some(name) => match certs.get(name) {
                Some(cert) => Some(cert.key.clone()),
                None => {
                    self.contain(
                        format!("cluster {}", cluster.name),
                        format_args!("backend client certificate {name} is not loaded; connecting without one"),
                    );
                    None
                }
            },
        };
        let h2 = cluster.protocol == ir::UpstreamProtocol::H2c;
        let key = ClientKey::new(settings, client_cert.as_ref(), h2);
        let provider = &self.tls.provider;
        self.upstreams.tls_upstream(key, || {
            tls::client_config(settings, client_cert, h2, provider)
        })
    }

    /// A terminating listener's `ServerConfig`, or `None` (contained) when it cannot serve.
    fn server_config(
        &mut self,
        gateway: &str,
        listener: &ir::Listener,
        certs: &Certificates,
        http: bool,
    ) -> Option<Arc<ServerConfig>> {
        let subject = || format!("gateway {gateway} listener {}", listener.name);
        let Some(settings) = &listener.tls else {
            self.contain(
                subject(),
                "TLS listener without TLS settings; handshakes are refused",
            );
            return None;
        };
        let keys: Vec<Arc<CertifiedKey>> = settings
            .certificates
            .iter()
            .filter_map(|name| certs.get(name).map(|c| c.key.clone()))
            .collect();
        if keys.is_empty() {
            self.contain(
                subject(),
                format_args!(
                    "no usable certificate among {:?}; handshakes for its names are refused",
                    settings.certificates
                ),
            );
            return None;
        }
        match self
            .tls
            .server_config(keys, settings.client_validation.as_ref(), http)
        {
            Ok(config) => Some(config),
            Err(error) => {
                self.contain(
                    subject(),
                    format_args!("TLS settings cannot be used ({error}); handshakes for its names are refused"),
                );
                None
            }
        }
    }

    fn target(&mut self, route: &str, target: &ir::BackendTarget, clusters: &Clusters) -> Target {
        match target {
            ir::BackendTarget::Cluster(name) => match clusters.get(name.as_str()) {
                Some(c) => Target::Cluster(c.clone()),
                None => {
                    self.contain(
                        format!("route {route}"),
                        format_args!("unknown cluster {name}; its share answers 500"),
                    );
                    Target::Invalid
                }
            },
            // Translate reported it in the route's status (ResolvedRefs).
            ir::BackendTarget::Invalid { .. } => Target::Invalid,
        }
    }

    fn tls_routes(
        &mut self,
        listener: &ir::Listener,
        clusters: &Clusters,
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
            let backends: Vec<(u32, Target)> = route
                .backends
                .iter()
                .map(|b| (b.weight, self.target(&key, &b.target, clusters)))
                .collect();
            routes.push(CompiledTlsRoute {
                route: key.into(),
                backends: Weighted::new(backends),
            });
        }
        (hosts, routes)
    }

    fn listener(
        &mut self,
        gateway: &Arc<str>,
        listener: &ir::Listener,
        clusters: &Clusters,
        certs: &Certificates,
    ) -> CompiledListener {
        // A route's rules sit next to each other in the listener's list (translate assembles
        // it route by route), so the label is built once per route and shared by its rules,
        // with no map of labels: a listener has thousands.
        let mut last: Option<(&ir::RouteRef, Arc<str>)> = None;
        let rules = listener
            .rules
            .iter()
            .map(|rule| {
                let route = match &last {
                    Some((r, key)) if same_route(r, &rule.route) => key.clone(),
                    _ => {
                        let key: Arc<str> = rule.route.key().into();
                        last = Some((&rule.route, key.clone()));
                        key
                    }
                };
                self.rule(gateway.clone(), route, rule, clusters)
            })
            .collect::<Vec<_>>();
        let mut vhosts = HostTable::with_capacity(listener.virtual_hosts.len());
        let mut entry_rules = Vec::new();
        let key = (gateway.clone(), listener.name.clone());
        let mut kept = self
            .hosts
            .listeners
            .get_mut(&key)
            .map(std::mem::take)
            .unwrap_or_default();
        for vhost in &listener.virtual_hosts {
            // Each entry's rule, by its position in the host (the table's routes name those).
            let base = entry_rules.len();
            entry_rules.extend(vhost.routes.iter().map(|e| e.rule));
            let same = kept.get_mut(vhost.hostname.as_str());
            let routes = match same {
                Some(same) if same.holds_for(vhost, listener.rules.len()) => {
                    Arc::clone(&same.table)
                }
                last => {
                    let (table, clean) = self.vhost(gateway, listener, vhost);
                    if clean && self.hosts.enabled {
                        let fresh = KeptTable::new(vhost, &table);
                        match last {
                            Some(last) => *last = fresh,
                            None => kept.keep(vhost.hostname.clone(), fresh),
                        }
                    }
                    table
                }
            };
            if !vhosts.insert(Some(&vhost.hostname), CompiledVhost { routes, base }) {
                self.contain(
                    format!("gateway {gateway} listener {}", listener.name),
                    format_args!("duplicate virtual host {}; ignored", vhost.hostname),
                );
            }
        }
        if self.hosts.enabled {
            kept.finish();
            self.hosts.listeners.keep(key, kept);
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
            ir::ListenerProtocol::Tcp | ir::ListenerProtocol::Udp => ListenerMode::Forward,
        };
        let l4_route = listener
            .l4_route
            .as_ref()
            .map(|route| Arc::new(self.l4_route(gateway, listener, route, clusters)));
        let (tls_hosts, tls_routes) = self.tls_routes(listener, clusters);
        // Only listeners that terminate TLS have a handshake series.
        let handshakes = match mode {
            ListenerMode::Terminate { .. } => self
                .metrics
                .listener_handshakes(gateway, &listener.name.as_str().into()),
            _ => Counter::default(),
        };
        // Only HTTP requests can be filtered (translate gives no other listener filters).
        let filters = match mode {
            ListenerMode::Http | ListenerMode::Terminate { http: true, .. } => {
                let subject = format!("gateway {gateway} listener {}", listener.name);
                self.filters(&subject, &listener.filters, clusters)
            }
            _ => Box::default(),
        };
        CompiledListener {
            filters,
            vhosts,
            entry_rules: entry_rules.into_boxed_slice(),
            rules,
            unmatched: RouteMetrics::new(gateway.clone(), Arc::from(""), 404),
            mode,
            tls_hosts,
            tls_routes,
            l4_route,
            handshakes,
        }
    }

    /// The route table of one virtual host, and whether nothing in it was contained: only
    /// then is it kept for the next apply (a problem's report names the rule's route, which
    /// the next apply may have changed, and must be made again).
    fn vhost(
        &mut self,
        gateway: &Arc<str>,
        listener: &ir::Listener,
        vhost: &ir::VirtualHost,
    ) -> (Arc<RouteTable>, bool) {
        let contained = self.diagnostics.len();
        let mut routes = Vec::with_capacity(vhost.routes.len());
        for (position, entry) in vhost.routes.iter().enumerate() {
            let Some(rule) = listener.rules.get(entry.rule) else {
                self.contain(
                    format!("gateway {gateway} listener {}", listener.name),
                    format_args!(
                        "route entry points past the listener's rules (rule {}); ignored",
                        entry.rule
                    ),
                );
                continue;
            };
            match RequestMatcher::try_from(&*entry.matcher) {
                Ok(matcher) => routes.push(CompiledRoute {
                    matcher,
                    entry: position,
                }),
                Err(error) => self.contain(
                    format!("route {}", rule.route.key()),
                    format_args!("a match cannot be compiled ({error}); it never matches"),
                ),
            }
        }
        let table = Arc::new(RouteTable::new(routes));
        (table, self.diagnostics.len() == contained)
    }

    fn l4_route(
        &mut self,
        gateway: &Arc<str>,
        listener: &ir::Listener,
        route: &ir::L4Route,
        clusters: &Clusters,
    ) -> L4Route {
        let key: Arc<str> = route.route.key().into();
        let backends: Vec<(u32, Target)> = route
            .backends
            .iter()
            .map(|b| (b.weight, self.target(&key, &b.target, clusters)))
            .collect();
        let metrics = L4Metrics::new(self.metrics, listener.transport(), gateway, &key);
        L4Route {
            route: key,
            backends: Weighted::new(backends),
            metrics,
        }
    }

    fn rule(
        &mut self,
        gateway: Arc<str>,
        route: Arc<str>,
        rule: &ir::HttpRule,
        clusters: &Clusters,
    ) -> CompiledRule {
        let mut backends = Vec::with_capacity(rule.backends.len());
        for b in &rule.backends {
            let backend = Backend {
                target: self.target(&route, &b.target, clusters),
                filters: self.filters(&route, &b.filters, clusters),
            };
            backends.push((b.weight, backend));
        }
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
        let filters = self.filters(&route, &rule.filters, clusters);
        let mirrored =
            mirror::any(&filters) || backends.iter().any(|(_, b)| mirror::any(&b.filters));
        let authorized = filters.iter().any(|f| matches!(f, Filter::ExternalAuth(_)));
        CompiledRule {
            filters,
            mirrored,
            authorized,
            metrics: RouteMetrics::new(gateway, route, 200),
            backends: Weighted::new(backends),
            timeout,
            retry: rule.retry.as_ref().map(|retry| {
                Box::new(crate::retry::RetryPolicy::new(
                    retry,
                    &rule.timeouts,
                    self.default_timeout,
                ))
            }),
        }
    }

    fn filters(
        &mut self,
        route: &str,
        filters: &[ir::HttpFilter],
        clusters: &Clusters,
    ) -> Box<[Filter]> {
        filters
            .iter()
            .filter_map(|f| {
                match f {
                    ir::HttpFilter::Mirror(m) => return self.mirror(route, m, clusters),
                    ir::HttpFilter::ExternalAuth(a) => {
                        return Some(self.external_auth(route, a, clusters));
                    }
                    _ => {}
                }
                Some(Filter::try_from(f).unwrap_or_else(|error| {
                    self.contain(
                        format!("route {route}"),
                        format_args!("a filter cannot be compiled ({error}); its rule answers 500"),
                    );
                    Filter::Invalid
                }))
            })
            .collect()
    }

    /// An authorization server the configuration does not have (or an invalid target) keeps
    /// its filter, which then refuses every request: the check fails closed.
    fn external_auth(&mut self, route: &str, a: &ir::ExternalAuth, clusters: &Clusters) -> Filter {
        let protocol = match crate::ext_auth::Protocol::compile(&a.protocol) {
            Ok(p) => p,
            Err(error) => {
                self.contain(
                    format!("route {route}"),
                    format_args!("ExternalAuth header names ({error}); its rule answers 500"),
                );
                return Filter::Invalid;
            }
        };
        let cluster = match &a.target {
            ir::BackendTarget::Cluster(name) => {
                let found = clusters.get(name.as_str()).cloned();
                if found.is_none() {
                    self.contain(
                        format!("route {route}"),
                        format_args!(
                            "ExternalAuth to unknown cluster {name}; its requests are refused"
                        ),
                    );
                }
                found
            }
            ir::BackendTarget::Invalid { .. } => None,
        };
        let metrics = match &cluster {
            Some(c) => AuthMetrics::new(self.metrics, &c.name),
            None => AuthMetrics::new(self.metrics, &Arc::from("")),
        };
        Filter::ExternalAuth(Box::new(crate::ext_auth::AuthSpec {
            cluster,
            protocol,
            forward_body: a.forward_body as usize,
            metrics,
        }))
    }

    /// A mirror to a cluster the configuration does not have is left out: the real request
    /// must not suffer for its mirror.
    fn mirror(&mut self, route: &str, m: &ir::Mirror, clusters: &Clusters) -> Option<Filter> {
        let Some(cluster) = clusters.get(m.cluster.as_str()) else {
            self.contain(
                format!("route {route}"),
                format_args!("mirror to unknown cluster {}; not mirrored", m.cluster),
            );
            return None;
        };
        Some(Filter::Mirror(Box::new(MirrorSpec {
            metrics: MirrorMetrics::new(self.metrics, &cluster.name),
            cluster: cluster.clone(),
            numerator: m.numerator,
            denominator: m.denominator.max(1),
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matchers::{LazyQuery, RequestView};
    use gatehouse_testkit::ir::*;

    fn host(name: &str, entries: Vec<ir::RouteEntry>) -> ir::VirtualHost {
        ir::VirtualHost {
            hostname: name.into(),
            routes: entries,
        }
    }

    /// Compiles `config` (one listener) with the kept hosts: its compiled listener, and what
    /// was contained.
    fn compile(config: &ir::Config, hosts: &mut CompiledHosts) -> (CompiledListener, Vec<String>) {
        let metrics = Metrics::new(&mut prometheus_client::registry::Registry::default());
        let upstreams = Upstreams::new(&crate::Options::default());
        let mut tls = TlsCache::default();
        let mut compiler = Compiler {
            metrics: &metrics,
            upstreams: &upstreams,
            tls: &mut tls,
            default_timeout: None,
            diagnostics: Vec::new(),
            hosts,
        };
        let mut sockets = compiler.compile(config);
        let key = *sockets.keys().next().unwrap();
        let listener = sockets.remove(&key).unwrap().listeners.remove(0);
        let problems = compiler.diagnostics.iter().map(|d| d.to_string()).collect();
        (listener, problems)
    }

    fn table<'l>(l: &'l CompiledListener, host: &str) -> &'l Arc<RouteTable> {
        &l.vhosts.get(host).unwrap().routes
    }

    /// Whether `host` routes with the very same table in both compiled listeners.
    fn same_table(a: &CompiledListener, b: &CompiledListener, host: &str) -> bool {
        Arc::ptr_eq(table(a, host), table(b, host))
    }

    /// Gives every entry of `vhost` a new match object equal to its old one.
    fn renew_matches(vhost: &mut ir::VirtualHost) {
        for entry in &mut vhost.routes {
            entry.matcher = Arc::new((*entry.matcher).clone());
        }
    }

    /// The index of the rule a GET of `path` on `host` takes, if any.
    fn route_of(l: &CompiledListener, host: &str, path: &str) -> Option<usize> {
        let headers = http::HeaderMap::new();
        let mut view = RequestView {
            method: &http::Method::GET,
            path,
            headers: &headers,
            query: LazyQuery::new(None),
        };
        let vhost = l.vhosts.get(host)?;
        let route = vhost.routes.find(&mut view)?;
        let rule = vhost.rule(l, route);
        l.rules.iter().position(|r| std::ptr::eq(r, rule))
    }

    fn routed(l: &CompiledListener, host: &str, path: &str) -> String {
        format!("rule {}", route_of(l, host, path).unwrap())
    }

    /// A virtual host whose matches are the objects it was compiled from keeps its table, also
    /// when its rules moved in the listener; a host with new match objects, one decoded
    /// afresh, or one whose rules are no longer all there is compiled again.
    #[test]
    fn a_host_with_the_same_matches_keeps_its_table() {
        let endpoint = "127.0.0.1:9".parse().unwrap();
        let mut l = listener(
            8080,
            None,
            vec![
                rule("a", vec![to_cluster("c")], vec![]),
                rule("b", vec![to_cluster("c")], vec![]),
            ],
            vec![],
        );
        l.virtual_hosts = vec![
            host("a.example", vec![prefix("/", 0)]),
            host("b.example", vec![prefix("/b", 1), prefix("/", 0)]),
        ];
        let first = config(vec![l], vec![http1("c", vec![endpoint])]);
        let mut kept = CompiledHosts::new(true);
        let (before, problems) = compile(&first, &mut kept);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(routed(&before, "b.example", "/b"), "rule 1");

        // A route added before the others: every rule moves up one. b's entries are new
        // objects (the same matches, as a route changed and back would give).
        let mut second = first.clone();
        let l = &mut second.gateways[0].listeners[0];
        l.rules
            .insert(0, rule("new", vec![to_cluster("c")], vec![]));
        for vhost in &mut l.virtual_hosts {
            for entry in &mut vhost.routes {
                entry.rule += 1;
            }
        }
        renew_matches(&mut l.virtual_hosts[1]);
        let (after, _) = compile(&second, &mut kept);
        assert!(same_table(&before, &after, "a.example"));
        assert!(!same_table(&before, &after, "b.example"));
        // The kept table finds its rule where it moved to.
        assert_eq!(routed(&after, "a.example", "/"), "rule 1");
        assert_eq!(routed(&after, "b.example", "/b"), "rule 2");
        assert_eq!(routed(&after, "b.example", "/x"), "rule 1");

        // A snapshot decoded from the wire shares nothing: every match a new object.
        let mut decoded = second.clone();
        decoded.gateways[0].listeners[0]
            .virtual_hosts
            .iter_mut()
            .for_each(renew_matches);
        let (fresh, _) = compile(&decoded, &mut kept);
        assert!(!same_table(&after, &fresh, "a.example"));

        // The same matches, but the listener lost a rule b names: b is compiled again and the
        // entry that points past the rules is reported.
        let mut shrunk = decoded.clone();
        shrunk.gateways[0].listeners[0].rules.truncate(2);
        let (small, problems) = compile(&shrunk, &mut kept);
        assert!(same_table(&fresh, &small, "a.example"));
        assert!(!same_table(&fresh, &small, "b.example"));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("points past"), "{problems:?}");
        assert_eq!(routed(&small, "b.example", "/b"), "rule 1");

        // A host with a contained problem is not kept: its report is made again.
        let (_, again) = compile(&shrunk, &mut kept);
        assert_eq!(again, problems);

        // Keeping turned off (a data plane that decodes every snapshot): nothing is taken.
        let mut off = CompiledHosts::new(false);
        let (one, _) = compile(&first, &mut off);
        let (two, _) = compile(&first, &mut off);
        assert!(!same_table(&one, &two, "a.example"));
        assert!(off.listeners.is_empty());
    }

    /// Over random sequences of configurations whose hosts reuse match objects from earlier
    /// ones (with rules added, removed and moved, entries pointing past the rules, and
    /// duplicate hosts), compiling with the kept tables routes every request as compiling
    /// from nothing does, and reports the same problems.
    #[test]
    fn kept_tables_route_as_a_fresh_compile_over_random_changes() {
        const HOSTS: [&str; 4] = ["a.example", "b.example", "c.example", "d.example"];
        const PATHS: [&str; 5] = ["/", "/x", "/x/y/z", "/y", "/z"];
        let endpoint = "127.0.0.1:9".parse().unwrap();
        let mut reused = 0;
        for seed in 0..200u64 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut pool: Vec<Arc<ir::HttpMatch>> = Vec::new();
            let mut kept = CompiledHosts::new(true);
            let mut last: HashMap<&str, Arc<RouteTable>> = HashMap::new();
            let mut before: HashMap<&str, Vec<Arc<ir::HttpMatch>>> = HashMap::new();
            for _ in 0..10 {
                let rules = rng.usize(1..6);
                let mut l = listener(
                    8080,
                    None,
                    (0..rules)
                        .map(|i| rule(&format!("r{i}"), vec![to_cluster("c")], vec![]))
                        .collect(),
                    vec![],
                );
                l.virtual_hosts.clear();
                for name in HOSTS {
                    if rng.usize(..5) == 0 {
                        continue;
                    }
                    let copies = if rng.usize(..10) == 0 { 2 } else { 1 };
                    for _ in 0..copies {
                        let entry = |rng: &mut fastrand::Rng, matcher| {
                            // Now and then past the rules.
                            let past = usize::from(rng.usize(..8) == 0);
                            ir::RouteEntry {
                                matcher,
                                rule: rng.usize(..rules + past),
                            }
                        };
                        let routes: Vec<ir::RouteEntry> = match before.get(name) {
                            // The host's last matches again, their rules anywhere now.
                            Some(matchers) if rng.bool() => matchers
                                .iter()
                                .map(|m: &Arc<ir::HttpMatch>| entry(&mut rng, m.clone()))
                                .collect(),
                            _ => (0..rng.usize(1..4))
                                .map(|_| {
                                    let matcher = if !pool.is_empty() && rng.bool() {
                                        pool[rng.usize(..pool.len())].clone()
                                    } else {
                                        let path = ["/", "/x", "/x/y", "/y"][rng.usize(..4)];
                                        let m = prefix(path, 0).matcher;
                                        pool.push(m.clone());
                                        m
                                    };
                                    entry(&mut rng, matcher)
                                })
                                .collect(),
                        };
                        l.virtual_hosts.push(host(name, routes));
                    }
                }
                before = l
                    .virtual_hosts
                    .iter()
                    .map(|v| {
                        let matchers = v.routes.iter().map(|e| e.matcher.clone()).collect();
                        (
                            HOSTS.iter().find(|h| **h == v.hostname).copied().unwrap(),
                            matchers,
                        )
                    })
                    .collect();
                let cfg = config(vec![l], vec![http1("c", vec![endpoint])]);
                let (with_kept, kept_problems) = compile(&cfg, &mut kept);
                let (fresh, fresh_problems) = compile(&cfg, &mut CompiledHosts::new(false));
                assert_eq!(kept_problems, fresh_problems, "seed {seed}");
                for h in HOSTS {
                    for p in PATHS {
                        assert_eq!(
                            route_of(&with_kept, h, p),
                            route_of(&fresh, h, p),
                            "seed {seed}: GET {p} on {h}"
                        );
                    }
                    // Taken again: the very table of the last step.
                    if let Some(now) = with_kept.vhosts.get(h) {
                        reused +=
                            usize::from(last.get(h).is_some_and(|t| Arc::ptr_eq(t, &now.routes)));
                    }
                }
                last = HOSTS
                    .iter()
                    .filter_map(|h| Some((*h, with_kept.vhosts.get(h)?.routes.clone())))
                    .collect();
            }
        }
        // Tables were taken again, many times.
        assert!(reused > 500, "{reused} tables taken again");
    }
}
