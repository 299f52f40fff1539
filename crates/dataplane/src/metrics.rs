//! Prometheus metrics of the data plane.
//!
//! Label sets hold `Arc<str>` built once per apply, so recording a request clones reference
//! counts instead of formatting strings. The per-rule histogram and the per-rule `200` counter
//! are resolved at compile time, which keeps the common case off the family's lock.

use crate::tls::FailureReason;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use std::sync::Arc;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    pub gateway: Arc<str>,
    pub route: Arc<str>,
    pub code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RouteLabels {
    pub gateway: Arc<str>,
    pub route: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ClusterLabels {
    pub cluster: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RetryLabels {
    pub cluster: Arc<str>,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ListenerLabels {
    pub gateway: Arc<str>,
    pub listener: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CertificateLabels {
    pub certificate: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DirectionLabels {
    pub gateway: Arc<str>,
    pub route: Arc<str>,
    /// `to_backend` or `to_client`.
    pub direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct L4ErrorLabels {
    protocol: &'static str,
    reason: &'static str,
}

/// Why a TCP connection or a UDP datagram was not forwarded (the `reason` label of
/// `gatehouse_l4_errors_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum L4Error {
    /// The listener has no route attached.
    NoRoute,
    /// The route's chosen backend is invalid, or its Service has no endpoints.
    NoBackend,
    /// TCP: no endpoint could be connected to.
    Connect,
    /// UDP: a new client while the socket has `--udp-max-sessions` already.
    SessionLimit,
    /// UDP: a datagram dropped because a socket buffer was full or a send failed.
    Dropped,
    /// UDP: the backend answered with ICMP port unreachable; the session ends.
    Refused,
}

impl L4Error {
    const ALL: [L4Error; 6] = [
        L4Error::NoRoute,
        L4Error::NoBackend,
        L4Error::Connect,
        L4Error::SessionLimit,
        L4Error::Dropped,
        L4Error::Refused,
    ];

    fn as_str(self) -> &'static str {
        match self {
            L4Error::NoRoute => "no_route",
            L4Error::NoBackend => "no_backend",
            L4Error::Connect => "connect",
            L4Error::SessionLimit => "session_limit",
            L4Error::Dropped => "dropped",
            L4Error::Refused => "refused",
        }
    }
}

fn transport_label(transport: gatehouse_ir::Transport) -> &'static str {
    match transport {
        gatehouse_ir::Transport::Tcp => "tcp",
        gatehouse_ir::Transport::Udp => "udp",
    }
}

/// One TCPRoute's or UDPRoute's metric handles on one Gateway, resolved at compile time.
#[derive(Clone, Debug, Default)]
pub(crate) struct L4Metrics {
    /// TCP connections or UDP sessions opened.
    pub opened: Counter,
    /// TCP connections or UDP sessions open now.
    pub active: Gauge,
    pub bytes_to_backend: Counter,
    pub bytes_to_client: Counter,
    /// UDP only (TCP's stay unregistered).
    pub datagrams_to_backend: Counter,
    pub datagrams_to_client: Counter,
}

impl L4Metrics {
    pub(crate) fn new(
        metrics: &Metrics,
        transport: gatehouse_ir::Transport,
        gateway: &Arc<str>,
        route: &Arc<str>,
    ) -> Self {
        let labels = RouteLabels {
            gateway: gateway.clone(),
            route: route.clone(),
        };
        let direction = |d: &'static str| DirectionLabels {
            gateway: gateway.clone(),
            route: route.clone(),
            direction: d,
        };
        match transport {
            gatehouse_ir::Transport::Tcp => L4Metrics {
                opened: metrics.tcp_connections.get_or_create_owned(&labels),
                active: metrics.tcp_connections_active.get_or_create_owned(&labels),
                bytes_to_backend: metrics
                    .tcp_bytes
                    .get_or_create_owned(&direction("to_backend")),
                bytes_to_client: metrics
                    .tcp_bytes
                    .get_or_create_owned(&direction("to_client")),
                ..L4Metrics::default()
            },
            gatehouse_ir::Transport::Udp => L4Metrics {
                opened: metrics.udp_sessions.get_or_create_owned(&labels),
                active: metrics.udp_sessions_active.get_or_create_owned(&labels),
                bytes_to_backend: metrics
                    .udp_bytes
                    .get_or_create_owned(&direction("to_backend")),
                bytes_to_client: metrics
                    .udp_bytes
                    .get_or_create_owned(&direction("to_client")),
                datagrams_to_backend: metrics
                    .udp_datagrams
                    .get_or_create_owned(&direction("to_backend")),
                datagrams_to_client: metrics
                    .udp_datagrams
                    .get_or_create_owned(&direction("to_client")),
            },
        }
    }
}

type HistogramFamily = Family<RouteLabels, Histogram, fn() -> Histogram>;

/// Time-to-response-headers buckets: sub-millisecond proxying up to the 60 s default timeout.
fn duration_histogram() -> Histogram {
    Histogram::new([
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
        60.0,
    ])
}

/// The data plane's metrics. Names are registered as given (no registry prefix is assumed).
#[derive(Debug)]
pub struct Metrics {
    pub(crate) requests: Family<RequestLabels, Counter>,
    pub(crate) duration: HistogramFamily,
    pub(crate) connect_failures: Family<ClusterLabels, Counter>,
    pub(crate) retries: Family<ClusterLabels, Counter>,
    pub(crate) ejections: Family<ClusterLabels, Counter>,
    pub(crate) route_retries: Family<RetryLabels, Counter>,
    pub(crate) connections_active: Gauge,
    pub(crate) connections_total: Counter,
    pub(crate) tls_handshakes: Family<ListenerLabels, Counter>,
    pub(crate) tls_failures: Family<ReasonLabels, Counter>,
    pub(crate) certificate_expiry: Family<CertificateLabels, Gauge>,
    pub(crate) config_diagnostics: Gauge,
    pub(crate) bind_failures: Family<AddressLabels, Counter>,
    pub(crate) timeouts: Family<KindLabels, Counter>,
    pub(crate) connections_shed: Counter,
    pub(crate) heads_too_large: Family<SideLabels, Counter>,
    pub(crate) tcp_connections: Family<RouteLabels, Counter>,
    pub(crate) tcp_connections_active: Family<RouteLabels, Gauge>,
    pub(crate) tcp_bytes: Family<DirectionLabels, Counter>,
    pub(crate) udp_sessions: Family<RouteLabels, Counter>,
    pub(crate) udp_sessions_active: Family<RouteLabels, Gauge>,
    pub(crate) udp_datagrams: Family<DirectionLabels, Counter>,
    pub(crate) udp_bytes: Family<DirectionLabels, Counter>,
    pub(crate) l4_errors: Family<L4ErrorLabels, Counter>,
    pub(crate) mirror_requests: Family<MirrorLabels, Counter>,
    pub(crate) auth_checks: Family<MirrorLabels, Counter>,
    pub(crate) worker_stalls: WorkerStalls,
}

/// What the connection workers' watchdog counts (see `workers::watchdog`).
#[derive(Clone, Debug, Default)]
pub(crate) struct WorkerStalls {
    /// Ticks that woke past the stall threshold.
    pub count: Counter,
    /// How late those ticks woke, summed.
    pub seconds: Counter<f64, std::sync::atomic::AtomicU64>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct MirrorLabels {
    cluster: Arc<str>,
    result: &'static str,
}

/// What became of the mirror copies of requests, for one mirror cluster, resolved at compile
/// time (`gatehouse_mirror_requests_total{cluster, result}`).
#[derive(Clone, Debug, Default)]
pub(crate) struct MirrorMetrics {
    /// The mirror backend answered (its response was discarded).
    pub ok: Counter,
    /// No endpoint, connect or request failure, or timeout.
    pub error: Counter,
    /// Not sent, or abandoned, because the mirror could not keep up (too many mirror requests
    /// in flight, or the copy of the body fell too far behind).
    pub dropped: Counter,
}

impl MirrorMetrics {
    pub(crate) fn new(metrics: &Metrics, cluster: &Arc<str>) -> Self {
        let counter = |result| {
            metrics.mirror_requests.get_or_create_owned(&MirrorLabels {
                cluster: cluster.clone(),
                result,
            })
        };
        MirrorMetrics {
            ok: counter("ok"),
            error: counter("error"),
            dropped: counter("dropped"),
        }
    }
}

/// What became of the checks of one `ExternalAuth` server, resolved at compile time
/// (`gatehouse_external_auth_checks_total{cluster, result}`).
#[derive(Clone, Debug, Default)]
pub(crate) struct AuthMetrics {
    /// The server allowed the request.
    pub allowed: Counter,
    /// The server refused it (its answer went to the client).
    pub denied: Counter,
    /// The server could not be asked or did not answer usably: the request was refused.
    pub error: Counter,
}

impl AuthMetrics {
    pub(crate) fn new(metrics: &Metrics, cluster: &Arc<str>) -> Self {
        let counter = |result| {
            metrics.auth_checks.get_or_create_owned(&MirrorLabels {
                cluster: cluster.clone(),
                result,
            })
        };
        AuthMetrics {
            allowed: counter("allowed"),
            denied: counter("denied"),
            error: counter("error"),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SideLabels {
    side: &'static str,
}

/// Which side sent a head over its size limit.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Side {
    /// A client's request head (answered 431).
    Request,
    /// A backend's response head (answered 502).
    Response,
}

impl Side {
    fn as_str(self) -> &'static str {
        match self {
            Side::Request => "request",
            Side::Response => "response",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct AddressLabels {
    address: String,
}

impl Metrics {
    pub fn new(registry: &mut Registry) -> Self {
        let metrics = Metrics {
            requests: Family::default(),
            duration: Family::new_with_constructor(duration_histogram as fn() -> Histogram),
            connect_failures: Family::default(),
            retries: Family::default(),
            ejections: Family::default(),
            route_retries: Family::default(),
            connections_active: Gauge::default(),
            connections_total: Counter::default(),
            tls_handshakes: Family::default(),
            tls_failures: Family::default(),
            certificate_expiry: Family::default(),
            config_diagnostics: Gauge::default(),
            bind_failures: Family::default(),
            timeouts: Family::default(),
            connections_shed: Counter::default(),
            heads_too_large: Family::default(),
            tcp_connections: Family::default(),
            tcp_connections_active: Family::default(),
            tcp_bytes: Family::default(),
            udp_sessions: Family::default(),
            udp_sessions_active: Family::default(),
            udp_datagrams: Family::default(),
            udp_bytes: Family::default(),
            l4_errors: Family::default(),
            mirror_requests: Family::default(),
            auth_checks: Family::default(),
            worker_stalls: WorkerStalls::default(),
        };
        for protocol in ["tcp", "udp"] {
            for reason in L4Error::ALL {
                metrics.l4_errors.get_or_create_owned(&L4ErrorLabels {
                    protocol,
                    reason: reason.as_str(),
                });
            }
        }
        registry.register(
            "gatehouse_tcp_connections",
            "TCP connections a TCP listener forwarded, by gateway and TCPRoute",
            metrics.tcp_connections.clone(),
        );
        registry.register(
            "gatehouse_tcp_connections_active",
            "TCP connections open through a TCP listener, by gateway and TCPRoute",
            metrics.tcp_connections_active.clone(),
        );
        registry.register_with_unit(
            "gatehouse_tcp",
            "Bytes forwarded by TCP listeners, by gateway, TCPRoute and direction (to_backend, to_client)",
            Unit::Bytes,
            metrics.tcp_bytes.clone(),
        );
        registry.register(
            "gatehouse_udp_sessions",
            "UDP client sessions a UDP listener opened, by gateway and UDPRoute",
            metrics.udp_sessions.clone(),
        );
        registry.register(
            "gatehouse_udp_sessions_active",
            "UDP client sessions open on UDP listeners, by gateway and UDPRoute",
            metrics.udp_sessions_active.clone(),
        );
        registry.register(
            "gatehouse_udp_datagrams",
            "Datagrams forwarded by UDP listeners, by gateway, UDPRoute and direction (to_backend, to_client)",
            metrics.udp_datagrams.clone(),
        );
        registry.register_with_unit(
            "gatehouse_udp",
            "Bytes forwarded by UDP listeners, by gateway, UDPRoute and direction (to_backend, to_client)",
            Unit::Bytes,
            metrics.udp_bytes.clone(),
        );
        registry.register(
            "gatehouse_l4_errors",
            "TCP connections and UDP datagrams not forwarded, by protocol and reason (no_route, no_backend, connect, session_limit, dropped, refused)",
            metrics.l4_errors.clone(),
        );
        for side in [Side::Request, Side::Response] {
            metrics.heads_too_large.get_or_create_owned(&SideLabels {
                side: side.as_str(),
            });
        }
        for kind in crate::limits::TimeoutKind::ALL {
            metrics.timeouts.get_or_create_owned(&KindLabels {
                kind: kind.as_str(),
            });
        }
        // Every reason exists from the start, so that rates and alerts see zeros.
        for reason in FailureReason::ALL {
            metrics.tls_failures.get_or_create_owned(&ReasonLabels {
                reason: reason.as_str(),
            });
        }
        registry.register(
            "gatehouse_mirror_requests",
            "Mirror copies of requests (RequestMirror), by mirror cluster and result: ok (answered, response discarded), error, dropped (the mirror could not keep up)",
            metrics.mirror_requests.clone(),
        );
        registry.register(
            "gatehouse_external_auth_checks",
            "ExternalAuth checks, by authorization server cluster and result: allowed, denied (the server's answer went to the client), error (the server could not be asked or answered unusably; the request was refused)",
            metrics.auth_checks.clone(),
        );
        registry.register(
            "gatehouse_timeouts",
            "Connections and exchanges cut short by a limit, by kind (header_read, http2_idle, request_body, backend_read, client_write, tunnel_idle)",
            metrics.timeouts.clone(),
        );
        registry.register(
            "gatehouse_heads_too_large",
            "Request heads over --max-request-head-bytes (431) and response heads over --max-response-head-bytes (502), by side",
            metrics.heads_too_large.clone(),
        );
        registry.register(
            "gatehouse_connections_shed",
            "New connections closed at once because the worker already had --max-connections-per-worker open",
            metrics.connections_shed.clone(),
        );
        registry.register(
            "gatehouse_worker_stalls",
            "Times a connection worker thread ran its timers over 250 ms late: a blocking call or a long computation on it, or a host that gave it no CPU; every connection on that worker waited as long",
            metrics.worker_stalls.count.clone(),
        );
        registry.register_with_unit(
            "gatehouse_worker_stall",
            "How late the stalled ticks of gatehouse_worker_stalls_total were, summed",
            Unit::Seconds,
            metrics.worker_stalls.seconds.clone(),
        );
        registry.register(
            "gatehouse_listener_bind_failures",
            "Failed attempts to bind a listener address (the data plane retries with backoff)",
            metrics.bind_failures.clone(),
        );
        registry.register(
            "gatehouse_dataplane_config_diagnostics",
            "Problems in the applied configuration that the data plane contained (a match that never matches, a rule answering 500, a listener refusing handshakes); listed at /status",
            metrics.config_diagnostics.clone(),
        );
        registry.register(
            "gatehouse_http_requests",
            "HTTP requests answered, by gateway, route and status code",
            metrics.requests.clone(),
        );
        registry.register_with_unit(
            "gatehouse_http_request_duration",
            "Time from request start to response headers",
            Unit::Seconds,
            metrics.duration.clone(),
        );
        registry.register(
            "gatehouse_upstream_connect_failures",
            "Failed connection attempts to backend endpoints",
            metrics.connect_failures.clone(),
        );
        registry.register(
            "gatehouse_upstream_retries",
            "Requests sent to another endpoint after a connect failure, by cluster",
            metrics.retries.clone(),
        );
        registry.register(
            "gatehouse_route_retries",
            "Attempts an HTTPRoute rule's retry policy sent again, by cluster and reason \
             (status: a retried response code; connect: no connection; timeout: the \
             backendRequest timeout)",
            metrics.route_retries.clone(),
        );
        registry.register(
            "gatehouse_upstream_ejections",
            "Endpoints taken out of rotation after consecutive connect failures, by cluster",
            metrics.ejections.clone(),
        );
        registry.register(
            "gatehouse_downstream_connections_active",
            "Client connections currently open (including upgraded tunnels)",
            metrics.connections_active.clone(),
        );
        registry.register(
            "gatehouse_downstream_connections",
            "Client connections accepted",
            metrics.connections_total.clone(),
        );
        registry.register(
            "gatehouse_tls_handshakes",
            "TLS handshakes completed by the gateway, by listener",
            metrics.tls_handshakes.clone(),
        );
        registry.register(
            "gatehouse_tls_handshake_failures",
            "TLS connections refused before carrying data, by reason",
            metrics.tls_failures.clone(),
        );
        registry.register(
            "gatehouse_tls_certificate_expiry_timestamp_seconds",
            "notAfter of each loaded certificate (Unix time)",
            metrics.certificate_expiry.clone(),
        );
        metrics
    }

    pub(crate) fn timeout(&self, kind: crate::limits::TimeoutKind) {
        self.timeouts
            .get_or_create(&KindLabels {
                kind: kind.as_str(),
            })
            .inc();
    }

    pub(crate) fn head_too_large(&self, side: Side) {
        self.heads_too_large
            .get_or_create(&SideLabels {
                side: side.as_str(),
            })
            .inc();
    }

    pub(crate) fn bind_failure(&self, address: std::net::SocketAddr) {
        self.bind_failures
            .get_or_create(&AddressLabels {
                address: address.to_string(),
            })
            .inc();
    }

    pub(crate) fn l4_error(&self, transport: gatehouse_ir::Transport, reason: L4Error) {
        self.l4_errors
            .get_or_create(&L4ErrorLabels {
                protocol: transport_label(transport),
                reason: reason.as_str(),
            })
            .inc();
    }

    /// Metrics registered nowhere, for tests and embedders that do not export them.
    pub fn unregistered() -> Self {
        Metrics::new(&mut Registry::default())
    }

    pub(crate) fn route_histogram(&self, labels: &RouteLabels) -> Histogram {
        self.duration.get_or_create_owned(labels)
    }

    pub(crate) fn request_counter(&self, labels: &RouteLabels, code: u16) -> Counter {
        self.requests.get_or_create_owned(&RequestLabels {
            gateway: labels.gateway.clone(),
            route: labels.route.clone(),
            code,
        })
    }

    pub(crate) fn listener_handshakes(&self, gateway: &Arc<str>, listener: &Arc<str>) -> Counter {
        self.tls_handshakes.get_or_create_owned(&ListenerLabels {
            gateway: gateway.clone(),
            listener: listener.clone(),
        })
    }

    pub(crate) fn tls_failure(&self, reason: FailureReason) {
        self.tls_failures
            .get_or_create(&ReasonLabels {
                reason: reason.as_str(),
            })
            .inc();
    }

    pub(crate) fn set_certificate_expiry(&self, certificate: &str, not_after: i64) {
        self.certificate_expiry
            .get_or_create(&CertificateLabels {
                certificate: certificate.to_owned(),
            })
            .set(not_after);
    }

    pub(crate) fn remove_certificate_expiry(&self, certificate: &str) {
        self.certificate_expiry.remove(&CertificateLabels {
            certificate: certificate.to_owned(),
        });
    }

    pub(crate) fn cluster_retries(&self, cluster: &Arc<str>) -> Counter {
        self.retries.get_or_create_owned(&ClusterLabels {
            cluster: cluster.clone(),
        })
    }

    /// The `gatehouse_route_retries` counters of `cluster`, one per reason.
    pub(crate) fn cluster_route_retries(&self, cluster: &Arc<str>) -> crate::retry::RetryCounters {
        let counter = |reason| {
            self.route_retries.get_or_create_owned(&RetryLabels {
                cluster: cluster.clone(),
                reason,
            })
        };
        crate::retry::RetryCounters {
            status: counter("status"),
            connect: counter("connect"),
            timeout: counter("timeout"),
        }
    }

    pub(crate) fn cluster_ejections(&self, cluster: &Arc<str>) -> Counter {
        self.ejections.get_or_create_owned(&ClusterLabels {
            cluster: cluster.clone(),
        })
    }

    pub(crate) fn cluster_connect_failures(&self, cluster: &Arc<str>) -> Counter {
        self.connect_failures.get_or_create_owned(&ClusterLabels {
            cluster: cluster.clone(),
        })
    }
}

/// Metric handles for one label set (a rule, or "nothing matched" on a listener), resolved at
/// its first request. `usual_code` is the code whose counter is resolved with the histogram
/// (200 for rules, 404 for "nothing matched"); any other code pays one lookup in the family.
///
/// Resolved lazily, not when the rule is compiled: a series costs about 500 bytes (a histogram
/// and a counter, and their label keys in the families), so 5000 routes that have not been
/// requested held 2.5 MB, and every compile looked up every rule's series again. A route's
/// series appear in `/metrics` once it has served a request. Every compiled table of a route
/// resolves the same series (the family keeps them), so a change of configuration never resets
/// a count.
#[derive(Debug)]
pub(crate) struct RouteMetrics {
    labels: RouteLabels,
    usual_code: u16,
    handles: std::sync::OnceLock<(Histogram, Counter)>,
}

impl RouteMetrics {
    pub(crate) fn new(gateway: Arc<str>, route: Arc<str>, usual_code: u16) -> Self {
        RouteMetrics {
            labels: RouteLabels { gateway, route },
            usual_code,
            handles: std::sync::OnceLock::new(),
        }
    }

    pub(crate) fn record(&self, metrics: &Metrics, code: u16, elapsed: std::time::Duration) {
        let (duration, usual) = self.handles.get_or_init(|| {
            (
                metrics.route_histogram(&self.labels),
                metrics.request_counter(&self.labels, self.usual_code),
            )
        });
        duration.observe(elapsed.as_secs_f64());
        if code == self.usual_code {
            usual.inc();
        } else {
            metrics
                .requests
                .get_or_create(&RequestLabels {
                    gateway: self.labels.gateway.clone(),
                    route: self.labels.route.clone(),
                    code,
                })
                .inc();
        }
    }
}
