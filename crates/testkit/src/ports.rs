//! Ports for tests that must know a port before something binds it.
//!
//! Binding `:0` hands out a port from the kernel's ephemeral range (32768–60999 on Linux),
//! where the API server's and every client's outgoing sockets land too: a port released there
//! and bound again a moment later can be taken in between, and the test flakes. So a port is
//! picked at random below that range and checked free (TCP and UDP) instead.

use std::net::{Ipv4Addr, TcpListener, UdpSocket};

/// The lowest and one past the highest port handed out.
pub const RANGE: std::ops::Range<u16> = 20000..32768;

/// A port that was free on 127.0.0.1 and 0.0.0.0 (TCP and UDP) a moment ago.
pub fn free_port() -> u16 {
    for _ in 0..1000 {
        let port = fastrand::u16(RANGE);
        let free = [Ipv4Addr::LOCALHOST, Ipv4Addr::UNSPECIFIED]
            .iter()
            .all(|ip| {
                TcpListener::bind((*ip, port)).is_ok() && UdpSocket::bind((*ip, port)).is_ok()
            });
        if free {
            return port;
        }
    }
    panic!("no free port in {RANGE:?}");
}

#[cfg(test)]
mod tests {
    #[test]
    fn ports_are_below_the_ephemeral_range_and_free() {
        for _ in 0..20 {
            let port = super::free_port();
            assert!(super::RANGE.contains(&port));
            std::net::TcpListener::bind(("127.0.0.1", port)).expect("free");
        }
    }
}
