//! Logging setup and the control plane's own metrics.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Install the global tracing subscriber. `RUST_LOG` overrides the default level.
pub fn init_logging(format: LogFormat) {
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // rustls warns about things clients do on every connection (an IP address as SNI, for
    // one): any client could fill the log and spend the proxy's CPU on it. Gatehouse reports
    // handshake failures itself (metrics, debug logs); rustls keeps its errors unless
    // RUST_LOG names it.
    if !std::env::var("RUST_LOG").is_ok_and(|v| v.contains("rustls")) {
        filter = filter.add_directive("rustls=error".parse().expect("static directive"));
    }
    // Colour only on a terminal: logs redirected to files or collected by a node agent
    // should not carry escape codes.
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

/// How configuration changes are doing.
pub struct ControlMetrics {
    pub generation: Gauge,
    pub apply_duration: Histogram,
    pub reconciles: Family<ResultLabel, Counter>,
    pub source_errors: Gauge,
    /// Controller mode: status patches by result (patched, conflict, failed).
    pub status_writes: Family<ResultLabel, Counter>,
    /// Controller mode: 1 while every watch of the Kubernetes API works, 0 during an outage.
    pub api_connected: Gauge,
}

impl ControlMetrics {
    pub fn new(registry: &mut Registry) -> Self {
        let m = ControlMetrics {
            generation: Gauge::default(),
            // From 100 µs to ~6.5 s: a change should land in milliseconds.
            apply_duration: Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(0.0001, 2.0, 17),
            ),
            reconciles: Family::default(),
            source_errors: Gauge::default(),
            status_writes: Family::default(),
            api_connected: Gauge::default(),
        };
        registry.register(
            "gatehouse_config_generation",
            "Generation of the configuration the data plane serves; increases with every applied change",
            m.generation.clone(),
        );
        registry.register(
            "gatehouse_config_apply_duration_seconds",
            "Time from reading the sources to the new configuration serving traffic",
            m.apply_duration.clone(),
        );
        registry.register(
            "gatehouse_config_reconciles",
            "Reconciliations of the sources, by result (applied, unchanged, error)",
            m.reconciles.clone(),
        );
        registry.register(
            "gatehouse_config_source_errors",
            "Errors in the configuration sources right now (broken files keep their last good content)",
            m.source_errors.clone(),
        );
        registry.register(
            "gatehouse_status_writes",
            "Status patches written to the Kubernetes API by this replica, by result",
            m.status_writes.clone(),
        );
        registry.register(
            "gatehouse_kubernetes_api_connected",
            "Controller mode: 1 while the Kubernetes API answers every watch, 0 while it does not (the last configuration keeps serving)",
            m.api_connected.clone(),
        );
        m
    }
}
