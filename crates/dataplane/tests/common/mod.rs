//! Shared by the data plane's end-to-end tests: IR builders and a data plane to apply them to.
#![allow(dead_code)]

use gatehouse_dataplane::{DataPlane, Metrics, Options};
use gatehouse_ir::*;
use prometheus_client::registry::Registry;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

pub const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

// ---------------------------------------------------------------------------------------------
// IR builders

pub fn route_ref(name: &str) -> RouteRef {
    RouteRef {
        kind: "HTTPRoute".into(),
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

pub fn rule(route: &str, backends: Vec<WeightedBackend>, filters: Vec<HttpFilter>) -> HttpRule {
    HttpRule {
        route: route_ref(route),
        filters,
        backends,
        timeouts: Timeouts::default(),
    }
}

pub fn prefix(path: &str, rule: usize) -> RouteEntry {
    RouteEntry {
        matcher: HttpMatch {
            path: PathMatch::Prefix(path.into()),
            ..HttpMatch::default()
        },
        rule,
    }
}

pub fn listener(
    port: u16,
    hostname: Option<&str>,
    rules: Vec<HttpRule>,
    entries: Vec<RouteEntry>,
) -> Listener {
    Listener {
        name: format!("http-{port}-{}", hostname.unwrap_or("any")),
        address: LOCALHOST,
        port,
        protocol: ListenerProtocol::Http,
        hostname: hostname.map(Into::into),
        rules,
        virtual_hosts: vec![VirtualHost {
            hostname: "*".into(),
            routes: entries,
        }],
        tls: None,
        tls_routes: vec![],
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

pub fn config(listeners: Vec<Listener>, clusters: Vec<Cluster>) -> Config {
    Config {
        gateways: vec![gateway(listeners)],
        clusters,
        certificates: vec![],
    }
}

pub async fn dataplane(options: Options) -> (Arc<DataPlane>, Registry) {
    let mut registry = Registry::default();
    let metrics = Arc::new(Metrics::new(&mut registry));
    (DataPlane::new(options, metrics), registry)
}

pub async fn apply_ok(dp: &DataPlane, config: &Config) {
    let errors = dp.apply(config).await.bind_errors;
    assert!(errors.is_empty(), "bind errors: {errors:?}");
}
