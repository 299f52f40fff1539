//! Layer 4: TCP listeners (TCPRoute) forward each connection, UDP listeners (UDPRoute) each
//! client's datagrams, to a backend picked by weight when the connection or session starts.
//!
//! A TCP or UDP socket has one listener and that listener one route ([`L4Route`], the oldest
//! attached). What the two share lives here: the compiled route and the choice of backend and
//! endpoint. The route's identity (namespace/name) is what a configuration swap is judged by:
//! connections and sessions whose route is still the socket's keep going on the backend they
//! started with; when the route is gone, so are they.

pub(crate) mod tcp;
pub(crate) mod udp;

use crate::balancer::Weighted;
use crate::metrics::{L4Error, L4Metrics};
use crate::table::{ClusterState, Endpoint, SocketTable, Target};
use std::sync::Arc;

/// A TCPRoute or UDPRoute as a TCP or UDP socket runs it.
#[derive(Debug)]
pub(crate) struct L4Route {
    /// `namespace/name`.
    pub route: Arc<str>,
    pub backends: Weighted<Target>,
    pub metrics: L4Metrics,
}

/// Where one connection or session goes.
pub(crate) struct Picked<'r> {
    pub cluster: &'r Arc<ClusterState>,
    pub endpoint: &'r Endpoint,
}

impl L4Route {
    /// A backend by weight and one of its endpoints (round-robin, skipping ejected ones).
    pub(crate) fn pick(&self) -> Result<Picked<'_>, L4Error> {
        let Some(Target::Cluster(cluster)) = self.backends.pick() else {
            // No backend with a positive weight, or an invalid one (translate reported it).
            return Err(L4Error::NoBackend);
        };
        let endpoint = cluster.pick().ok_or(L4Error::NoBackend)?;
        Ok(Picked { cluster, endpoint })
    }

    /// Whether this route still sends to `endpoint` of `cluster` (a backend with a positive
    /// weight whose endpoints include it).
    pub(crate) fn reaches(&self, cluster: &str, endpoint: std::net::SocketAddr) -> bool {
        self.backends.iter().any(|t| {
            matches!(t, Target::Cluster(c)
                if &*c.name == cluster && c.endpoints_iter().any(|e| e.addr == endpoint))
        })
    }
}

/// Whether the route named `route` is still the one `table` forwards with.
pub(crate) fn still_routes(table: &SocketTable, route: &str) -> bool {
    table.l4_route().is_some_and(|r| &*r.route == route)
}
