//! IR builders: small configurations for data-plane tests, in namespace `default`, Gateway
//! `gw`, on 127.0.0.1.

use gatehouse_ir::*;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

pub const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

pub fn route_ref(kind: &str, name: &str) -> RouteRef {
    RouteRef {
        kind: kind.into(),
        namespace: "default".into(),
        name: name.into(),
        rule: 0,
    }
}

pub fn to_cluster(name: &str) -> WeightedBackend {
    WeightedBackend {
        weight: 1,
        target: BackendTarget::Cluster(name.into()),
        filters: vec![],
    }
}

/// An HTTPRoute rule of route `route`.
pub fn rule(route: &str, backends: Vec<WeightedBackend>, filters: Vec<HttpFilter>) -> HttpRule {
    HttpRule {
        route: route_ref("HTTPRoute", route),
        filters,
        backends,
        timeouts: Timeouts::default(),
        retry: None,
    }
}

pub fn prefix(path: &str, rule: usize) -> RouteEntry {
    RouteEntry {
        matcher: std::sync::Arc::new(HttpMatch {
            path: PathMatch::Prefix(path.into()),
            ..HttpMatch::default()
        }),
        rule,
    }
}

pub fn listener_base(
    name: &str,
    port: u16,
    hostname: Option<&str>,
    protocol: ListenerProtocol,
) -> Listener {
    Listener {
        name: name.into(),
        address: LOCALHOST,
        port,
        protocol,
        hostname: hostname.map(Into::into),
        rules: vec![],
        virtual_hosts: vec![],
        tls: None,
        tls_routes: vec![],
        l4_route: None,
        filters: vec![],
    }
}

/// An HTTP listener whose one virtual host (`*`) has `entries` over `rules`.
pub fn listener(
    port: u16,
    hostname: Option<&str>,
    rules: Vec<HttpRule>,
    entries: Vec<RouteEntry>,
) -> Listener {
    Listener {
        rules,
        virtual_hosts: vec![VirtualHost {
            hostname: "*".into(),
            routes: entries,
        }],
        ..listener_base(
            &format!("http-{port}-{}", hostname.unwrap_or("any")),
            port,
            hostname,
            ListenerProtocol::Http,
        )
    }
}

/// An HTTPS listener sending everything to `cluster`.
pub fn https_listener(
    name: &str,
    port: u16,
    hostname: Option<&str>,
    cert: &str,
    cluster: &str,
) -> Listener {
    Listener {
        rules: vec![rule(name, vec![to_cluster(cluster)], vec![])],
        virtual_hosts: vec![VirtualHost {
            hostname: "*".into(),
            routes: vec![prefix("/", 0)],
        }],
        tls: Some(ListenerTls {
            mode: TlsMode::Terminate,
            certificates: vec![cert.into()],
            client_validation: None,
        }),
        ..listener_base(name, port, hostname, ListenerProtocol::Https)
    }
}

pub fn tls_listener(
    name: &str,
    port: u16,
    hostname: Option<&str>,
    mode: TlsMode,
    certificates: &[&str],
    tls_routes: Vec<TlsRoute>,
) -> Listener {
    Listener {
        tls: Some(ListenerTls {
            mode,
            certificates: certificates.iter().map(|c| c.to_string()).collect(),
            client_validation: None,
        }),
        tls_routes,
        ..listener_base(name, port, hostname, ListenerProtocol::Tls)
    }
}

pub fn tls_route(name: &str, hostnames: &[&str], cluster: &str) -> TlsRoute {
    TlsRoute {
        route: route_ref("TLSRoute", name),
        hostnames: hostnames.iter().map(|h| h.to_string()).collect(),
        backends: vec![to_cluster(cluster)],
    }
}

pub fn gateway(listeners: Vec<Listener>) -> Gateway {
    Gateway {
        namespace: "default".into(),
        name: "gw".into(),
        listeners,
    }
}

pub fn cluster(name: &str, protocol: UpstreamProtocol, endpoints: Vec<SocketAddr>) -> Cluster {
    Cluster {
        name: name.into(),
        protocol,
        endpoints,
        tls: None,
    }
}

pub fn http1(name: &str, endpoints: Vec<SocketAddr>) -> Cluster {
    cluster(name, UpstreamProtocol::Http1, endpoints)
}

/// An HTTP/1.1 cluster reached over TLS with `tls` (a BackendTLSPolicy's settings).
pub fn http1_tls(name: &str, endpoints: Vec<SocketAddr>, tls: UpstreamTls) -> Cluster {
    Cluster {
        tls: Some(tls),
        ..http1(name, endpoints)
    }
}

/// One Gateway with `listeners`.
pub fn config(listeners: Vec<Listener>, clusters: Vec<Cluster>) -> Config {
    Config {
        gateways: vec![gateway(listeners)],
        clusters,
        certificates: vec![],
    }
}

/// One Gateway with `listeners`, and the `certificates` its TLS settings name.
pub fn config_with_certificates(
    listeners: Vec<Listener>,
    clusters: Vec<Cluster>,
    certificates: Vec<Certificate>,
) -> Config {
    Config {
        certificates,
        ..config(listeners, clusters)
    }
}

/// A backend of `cluster` with `weight`.
pub fn weighted(cluster: &str, weight: u32) -> WeightedBackend {
    WeightedBackend {
        weight,
        ..to_cluster(cluster)
    }
}

/// A TCP listener on `port` forwarding to TCPRoute `route` over `backends` (no route: `None`).
pub fn tcp_listener(port: u16, route: Option<(&str, Vec<WeightedBackend>)>) -> Listener {
    l4_listener(port, ListenerProtocol::Tcp, "TCPRoute", route)
}

/// A UDP listener on `port` forwarding to UDPRoute `route` over `backends`.
pub fn udp_listener(port: u16, route: Option<(&str, Vec<WeightedBackend>)>) -> Listener {
    l4_listener(port, ListenerProtocol::Udp, "UDPRoute", route)
}

fn l4_listener(
    port: u16,
    protocol: ListenerProtocol,
    kind: &str,
    route: Option<(&str, Vec<WeightedBackend>)>,
) -> Listener {
    let name = format!("{}-{port}", kind.trim_end_matches("Route").to_lowercase());
    Listener {
        l4_route: route.map(|(name, backends)| L4Route {
            route: route_ref(kind, name),
            backends,
        }),
        ..listener_base(&name, port, None, protocol)
    }
}

pub fn tcp_cluster(name: &str, endpoints: Vec<SocketAddr>) -> Cluster {
    cluster(name, UpstreamProtocol::Tcp, endpoints)
}

pub fn udp_cluster(name: &str, endpoints: Vec<SocketAddr>) -> Cluster {
    cluster(name, UpstreamProtocol::Udp, endpoints)
}
