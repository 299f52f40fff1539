//! Shared by the data plane's end-to-end tests: the test kit's IR builders and free ports, and
//! a data plane to apply them to.
#![allow(dead_code)]

pub mod raw;

pub use gatehouse_testkit::free_port;
pub use gatehouse_testkit::ir::*;

use gatehouse_dataplane::{DataPlane, Metrics, Options};
use gatehouse_ir::Config;
use prometheus_client::registry::Registry;
use std::sync::Arc;

pub async fn dataplane(options: Options) -> (Arc<DataPlane>, Registry) {
    let mut registry = Registry::default();
    let metrics = Arc::new(Metrics::new(&mut registry));
    (DataPlane::new(options, metrics), registry)
}

/// One HTTP listener on `port` sending every request to cluster "b" of `endpoints`.
pub fn all_to(port: u16, endpoints: Vec<std::net::SocketAddr>) -> Config {
    config(
        vec![listener(
            port,
            None,
            vec![rule("r", vec![to_cluster("b")], vec![])],
            vec![prefix("/", 0)],
        )],
        vec![http1("b", endpoints)],
    )
}

/// A data plane on a free port sending every request to cluster "b" of `endpoints`.
pub async fn proxy_to_endpoints(
    endpoints: Vec<std::net::SocketAddr>,
    options: Options,
) -> (u16, Arc<DataPlane>, Registry) {
    let port = free_port();
    let (dp, registry) = dataplane(options).await;
    apply_ok(&dp, &all_to(port, endpoints)).await;
    (port, dp, registry)
}

pub async fn apply_ok(dp: &DataPlane, config: &Config) {
    let errors = dp.apply(config).await.bind_errors;
    assert!(errors.is_empty(), "bind errors: {errors:?}");
}

/// The registry in Prometheus text format.
pub fn metrics_text(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text
}

/// The value of one sample line, 0 when absent.
pub fn metric(registry: &Registry, sample: &str) -> f64 {
    metrics_text(registry)
        .lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// An address whose connects hang, as a deleted pod's do until its removal arrives: a
/// listener that never accepts, its accept queue filled, so the kernel drops further SYNs.
/// The returned sockets keep the queue full.
pub fn dark_address() -> (
    std::net::SocketAddr,
    Vec<std::net::TcpStream>,
    socket2::Socket,
) {
    let listener =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    listener
        .bind(
            &"127.0.0.1:0"
                .parse::<std::net::SocketAddr>()
                .unwrap()
                .into(),
        )
        .unwrap();
    listener.listen(0).unwrap();
    let addr = listener.local_addr().unwrap().as_socket().unwrap();
    let mut fillers = Vec::new();
    // Connects complete (into the queue) until it is full; then one hangs.
    loop {
        match std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(300)) {
            Ok(s) => fillers.push(s),
            Err(_) => break,
        }
        assert!(fillers.len() < 64, "the accept queue never filled");
    }
    (addr, fillers, listener)
}
