//! What every Gatehouse test crate shares: manifests (YAML to [`Input`](gatehouse_translate::Input)
//! through the kind registry, and typed builders), IR builders, free ports below the ephemeral
//! range, certificates made at test time, and the echo backend.

pub mod certs;
pub mod ir;
pub mod manifests;
pub mod ports;

pub use ports::free_port;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Starts an in-process echo backend answering with `name` (see `gatehouse_echo`).
pub async fn echo(name: &str) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(gatehouse_echo::serve(listener, name.to_string()));
    addr
}

/// Waits until `condition` holds, checking every 20 ms; fails the test after `limit`.
pub async fn eventually(what: &str, limit: Duration, mut condition: impl FnMut() -> bool) {
    let start = Instant::now();
    while !condition() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
