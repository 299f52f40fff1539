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
        };
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

/// Pre-resolved metric handles for one label set (a rule, or "nothing matched" on a listener).
/// `usual_code` is the code whose counter is resolved up front (200 for rules, 404 for "nothing
/// matched"); any other code pays one lookup in the family.
#[derive(Debug, Clone)]
pub(crate) struct RouteMetrics {
    labels: RouteLabels,
    duration: Histogram,
    usual_code: u16,
    usual: Counter,
}

impl RouteMetrics {
    pub(crate) fn new(
        metrics: &Metrics,
        gateway: Arc<str>,
        route: Arc<str>,
        usual_code: u16,
    ) -> Self {
        let labels = RouteLabels { gateway, route };
        RouteMetrics {
            duration: metrics.route_histogram(&labels),
            usual: metrics.request_counter(&labels, usual_code),
            usual_code,
            labels,
        }
    }

    pub(crate) fn record(&self, metrics: &Metrics, code: u16, elapsed: std::time::Duration) {
        self.duration.observe(elapsed.as_secs_f64());
        if code == self.usual_code {
            self.usual.inc();
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
