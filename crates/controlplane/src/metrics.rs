//! The control plane's own metrics.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

/// A stage of one reconcile pass (see [`Stage`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabel {
    pub stage: &'static str,
}

/// The stages of a reconcile pass, timed separately: which one grows with the configuration
/// is what says where the next optimisation belongs (issue 18: a pass whose cost follows the
/// change, not the whole configuration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Reading the sources into one snapshot (and the mode's per-snapshot options).
    Snapshot,
    /// Objects to IR and status (`translate`).
    Translate,
    /// Whether the new IR differs from the one serving.
    Compare,
    /// The data plane compiling and swapping in the new configuration (only when it changed).
    Apply,
    /// Status stamped against the last, the admin snapshot and listener gauges published.
    Status,
    /// Controller mode: status patches computed and queued for the writer.
    StatusQueue,
}

impl Stage {
    pub fn name(self) -> &'static str {
        match self {
            Stage::Snapshot => "snapshot",
            Stage::Translate => "translate",
            Stage::Compare => "compare",
            Stage::Apply => "apply",
            Stage::Status => "status",
            Stage::StatusQueue => "status_queue",
        }
    }
}

fn stage_histogram() -> Histogram {
    // From 10 µs to ~5 s.
    Histogram::new(exponential_buckets(0.00001, 2.0, 20))
}

/// How configuration changes are doing.
pub struct ControlMetrics {
    pub generation: Gauge,
    pub apply_duration: Histogram,
    pub reconciles: Family<ResultLabel, Counter>,
    /// Time per stage of every pass (applied or not).
    pub stage_duration: Family<StageLabel, Histogram, fn() -> Histogram>,
    pub source_errors: Gauge,
    /// Controller mode: status patches by result (patched, conflict, failed).
    pub status_writes: Family<ResultLabel, Counter>,
    /// Pauses before a pass while changes keep coming faster than passes may take (the
    /// reconcile loop's pacing): how often, and how long in all.
    pub pacing_pauses: Histogram,
    /// Controller mode: 1 while every watch of the Kubernetes API works, 0 during an outage.
    pub api_connected: Gauge,
    /// Per listener: 1 while Programmed (bound and serving), 0 otherwise.
    pub listener_programmed: Family<ListenerLabels, Gauge>,
    /// Routes a translation took from the last pass (`reused`) or worked out (`translated`).
    pub translate_routes: Family<ResultLabel, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabels {
    pub gateway: String,
    pub listener: String,
}

impl ControlMetrics {
    pub fn new(registry: &mut Registry) -> Self {
        let m = ControlMetrics {
            generation: Gauge::default(),
            // From 100 µs to ~6.5 s: a change should land in milliseconds.
            apply_duration: Histogram::new(exponential_buckets(0.0001, 2.0, 17)),
            reconciles: Family::default(),
            stage_duration: Family::new_with_constructor(stage_histogram),
            source_errors: Gauge::default(),
            status_writes: Family::default(),
            // From 1 ms to ~1 s (a pause is at most one second).
            pacing_pauses: Histogram::new(exponential_buckets(0.001, 2.0, 11)),
            api_connected: Gauge::default(),
            listener_programmed: Family::default(),
            translate_routes: Family::default(),
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
            "Reconciliations of the sources, by result (applied; unchanged; reused: nothing translate reads changed, only status was written; error)",
            m.reconciles.clone(),
        );
        registry.register(
            "gatehouse_config_pass_stage_duration_seconds",
            "Time each stage of a reconcile pass took (snapshot, translate, compare, apply, status, status_queue); apply only when the configuration changed",
            m.stage_duration.clone(),
        );
        registry.register(
            "gatehouse_config_pacing_pause_seconds",
            "Pauses of the reconcile loop before a pass, taken while changes keep coming faster than passes may spend half of one core on them",
            m.pacing_pauses.clone(),
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
        registry.register(
            "gatehouse_listener_programmed",
            "1 while a listener is Programmed (its socket bound and its configuration serving), 0 while it is not; one series per listener of Gatehouse's Gateways",
            m.listener_programmed.clone(),
        );
        registry.register(
            "gatehouse_translate_routes",
            "Routes each translation took unchanged from the last one (reused: neither the route nor anything around it changed) or worked out (translated)",
            m.translate_routes.clone(),
        );
        m
    }

    /// Records how long `stage` of a pass took.
    pub fn stage(&self, stage: Stage, took: std::time::Duration) {
        self.stage_duration
            .get_or_create(&StageLabel {
                stage: stage.name(),
            })
            .observe(took.as_secs_f64());
    }

    /// Sets the per-listener gauge from the status just computed; listeners that are gone
    /// lose their series.
    pub fn set_listeners(&self, status: &gatehouse_translate::Status) {
        self.listener_programmed.clear();
        for (key, gw) in &status.gateways {
            for l in gw.listeners.iter().flatten() {
                let programmed = l
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "Programmed" && c.status == "True");
                self.listener_programmed
                    .get_or_create(&ListenerLabels {
                        gateway: key.to_string(),
                        listener: l.name.clone(),
                    })
                    .set(i64::from(programmed));
            }
        }
    }
}
