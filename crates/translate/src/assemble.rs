//! The IR of every Gateway, assembled from its listeners and the routes attached to them: rules
//! with redirect defaults resolved per listener, virtual hosts in precedence order, TLS routes,
//! and the clusters each Gateway uses.

use crate::gateways::GatewayCtx;
use crate::hostname::Origin;
use crate::objects::ObjectKey;
use crate::precedence;
use crate::routes::{Attachment, RouteRule};
use gatehouse_ir as ir;
use std::collections::{BTreeMap, BTreeSet};

pub struct Assembled {
    pub gateways: Vec<ir::Gateway>,
    /// Every cluster referenced so far, also those no served listener uses.
    pub clusters: BTreeMap<String, ir::Cluster>,
    /// Which Gateways send traffic to which clusters (BackendTLSPolicy ancestors; unused
    /// clusters are left out of the IR).
    pub cluster_users: BTreeMap<String, BTreeSet<ObjectKey>>,
}

pub fn gateways(
    gws: &[GatewayCtx],
    attachments: &[Attachment],
    clusters: BTreeMap<String, ir::Cluster>,
) -> Assembled {
    let mut out = Assembled {
        gateways: Vec::new(),
        clusters,
        cluster_users: BTreeMap::new(),
    };
    for (gi, gw) in gws.iter().enumerate() {
        let Some(address) = gw.address else { continue };
        let client_cert = gw.backend_client_certificate.clone().ok().flatten();
        let mut listeners = Vec::new();
        for (li, l) in gw.listeners.iter().enumerate() {
            if !l.programmable() {
                continue;
            }
            let on_listener: Vec<&Attachment> = attachments
                .iter()
                .filter(|a| a.gateway == gi && a.listener == li)
                .collect();
            listeners.push(listener(
                gw,
                l,
                address,
                &on_listener,
                client_cert.as_deref(),
                &mut out,
            ));
        }
        out.gateways.push(ir::Gateway {
            namespace: gw.key.namespace.clone(),
            name: gw.key.name.clone(),
            listeners,
        });
    }
    out
}

fn listener(
    gw: &GatewayCtx,
    l: &crate::gateways::ListenerCtx,
    address: std::net::IpAddr,
    attachments: &[&Attachment],
    client_cert: Option<&str>,
    out: &mut Assembled,
) -> ir::Listener {
    let protocol = l.ir_protocol();
    let scheme = if protocol == ir::ListenerProtocol::Http {
        "http"
    } else {
        "https"
    };
    // Counted first, so that the rules and candidates (thousands on a busy listener, a rule
    // some hundreds of bytes) are written once into room of their size: grown by push, each
    // doubling copied them all again, and the rules' final trim once more.
    let (mut rule_count, mut candidate_count) = (0, 0);
    for a in attachments {
        for (_, rule) in a.rules.iter() {
            if let RouteRule::Http(template) = rule {
                rule_count += 1;
                candidate_count += a.hostnames.len() * template.matches.len();
            }
        }
    }
    let mut rules = Vec::with_capacity(rule_count);
    let mut candidates = Vec::with_capacity(candidate_count);
    let mut tls_routes = Vec::new();
    let mut l4_route = None;
    for a in attachments {
        for (rule_index, rule) in a.rules.iter() {
            match rule {
                RouteRule::Http(template) => {
                    let index = rules.len();
                    for cluster in template
                        .backends
                        .iter()
                        .filter_map(|b| b.policy_cluster.as_ref())
                    {
                        add_user(&mut out.cluster_users, cluster, &gw.key);
                    }
                    let mut resolved = template.resolve(scheme, l.port);
                    for b in &mut resolved.backends {
                        use_cluster(&mut b.target, client_cert, out, &gw.key);
                    }
                    let filters = resolved
                        .filters
                        .iter_mut()
                        .chain(resolved.backends.iter_mut().flat_map(|b| &mut b.filters));
                    for f in filters {
                        filter_cluster(f, client_cert, out, &gw.key);
                    }
                    rules.push(resolved);
                    for (hostname, &origin) in a.hostnames.iter().zip(a.origins.iter()) {
                        for (match_index, m) in template.matches.iter().enumerate() {
                            candidates.push(precedence::Candidate {
                                hostname,
                                origin,
                                matcher: m,
                                rule: index,
                                route_age: &a.route_age,
                                rule_index: *rule_index,
                                match_index,
                            });
                        }
                    }
                }
                RouteRule::Tls { route, backends } => {
                    let mut backends = backends.clone();
                    for b in &mut backends {
                        use_cluster(&mut b.target, None, out, &gw.key);
                    }
                    let origins = a.origins.to_vec();
                    tls_routes.push((
                        ir::TlsRoute {
                            route: route.clone(),
                            hostnames: a.hostnames.to_vec(),
                            backends,
                        },
                        origins,
                    ));
                }
                // A TCP or UDP listener has nothing to tell its routes' traffic apart by, so
                // the oldest route attached takes it all (attachments come oldest first); the
                // others are Accepted and counted in attachedRoutes, as the conformance
                // suite expects, but carry nothing.
                RouteRule::L4 { route, backends } if l4_route.is_none() => {
                    let mut backends = backends.clone();
                    for b in &mut backends {
                        use_cluster(&mut b.target, None, out, &gw.key);
                    }
                    l4_route = Some(ir::L4Route {
                        route: route.clone(),
                        backends,
                    });
                }
                RouteRule::L4 { .. } => {}
            }
        }
    }
    let mut filters = l.filters.clone();
    for f in &mut filters {
        filter_cluster(f, client_cert, out, &gw.key);
    }
    ir::Listener {
        name: match l.set {
            None => l.name.clone(),
            Some(si) => crate::listener_sets::ir_listener_name(&gw.listener_sets[si].key, &l.name),
        },
        address,
        port: l.port,
        protocol,
        hostname: l.hostname.clone(),
        rules,
        virtual_hosts: precedence::virtual_hosts(candidates),
        tls: l.tls.clone(),
        tls_routes: tls_claims(tls_routes),
        l4_route,
        filters,
    }
}

/// The TLS routes of a listener, each with only the names it wins: of the routes that serve
/// one name, the one whose route hostname for it is the most specific
/// ([`hostname::origin_specificity`]), then the oldest (attachments come oldest first). A route
/// left with no name serves nothing and is left out.
fn tls_claims(routes: Vec<(ir::TlsRoute, Vec<Origin>)>) -> Vec<ir::TlsRoute> {
    let mut best: std::collections::HashMap<&str, (Origin, usize)> = Default::default();
    for (index, (route, origins)) in routes.iter().enumerate() {
        for (name, origin) in route.hostnames.iter().zip(origins) {
            let claim = (*origin, index);
            best.entry(name)
                .and_modify(|b| *b = (*b).min(claim))
                .or_insert(claim);
        }
    }
    let winners: Vec<Vec<bool>> = routes
        .iter()
        .enumerate()
        .map(|(index, (route, _))| {
            route
                .hostnames
                .iter()
                .map(|name| best[name.as_str()].1 == index)
                .collect()
        })
        .collect();
    routes
        .into_iter()
        .zip(winners)
        .filter_map(|((mut route, _), wins)| {
            let mut wins = wins.into_iter();
            route.hostnames.retain(|_| wins.next().unwrap_or(false));
            (!route.hostnames.is_empty()).then_some(route)
        })
        .collect()
}

/// [`use_cluster`] for the cluster a filter sends requests to (a mirror's, an authorization
/// server's).
fn filter_cluster(
    f: &mut ir::HttpFilter,
    client_cert: Option<&str>,
    out: &mut Assembled,
    gateway: &ObjectKey,
) {
    match f {
        ir::HttpFilter::Mirror(m) => {
            let mut target = ir::BackendTarget::Cluster(std::mem::take(&mut m.cluster));
            use_cluster(&mut target, client_cert, out, gateway);
            if let ir::BackendTarget::Cluster(name) = target {
                m.cluster = name;
            }
        }
        ir::HttpFilter::ExternalAuth(a) => use_cluster(&mut a.target, client_cert, out, gateway),
        _ => {}
    }
}

/// Record that `gateway` uses the target cluster. A Gateway with a backend client certificate
/// gets its own copy of each TLS cluster, presenting that certificate.
fn use_cluster(
    target: &mut ir::BackendTarget,
    client_cert: Option<&str>,
    out: &mut Assembled,
    gateway: &ObjectKey,
) {
    let ir::BackendTarget::Cluster(name) = target else {
        return;
    };
    let tls_base = out
        .clusters
        .get(name.as_str())
        .filter(|c| c.tls.is_some())
        .cloned();
    if let (Some(cert), Some(base)) = (client_cert, tls_base) {
        let variant = format!("{name}+client={cert}");
        out.clusters.entry(variant.clone()).or_insert_with(|| {
            let mut c = base;
            c.name = variant.clone();
            if let Some(tls) = c.tls.as_mut() {
                tls.client_certificate = Some(cert.to_string());
            }
            c
        });
        // The base name also counts as used so its policy reports this Gateway.
        add_user(&mut out.cluster_users, name, gateway);
        *name = variant;
    }
    add_user(&mut out.cluster_users, name, gateway);
}

/// Records that `gateway` uses `cluster`. Looked up before inserting: this runs for every
/// backend of every rule, and the cluster and Gateway are nearly always recorded already, so
/// their names are copied only the first time.
fn add_user(users: &mut BTreeMap<String, BTreeSet<ObjectKey>>, cluster: &str, gateway: &ObjectKey) {
    match users.get_mut(cluster) {
        Some(gateways) => {
            if !gateways.contains(gateway) {
                gateways.insert(gateway.clone());
            }
        }
        None => {
            users.insert(cluster.to_owned(), BTreeSet::from([gateway.clone()]));
        }
    }
}
