//! The one reconcile loop: source → translate → data plane → status, for both modes.
//!
//! ```text
//! Source::changed ─▶ snapshot ─▶ translate (pure) ─▶ Publisher::apply ─▶ Published (admin)
//!                                                   └──────────────────▶ StatusSink (leader)
//! ```
//!
//! The loop owns every piece of state between a change and its effect; `gatehouse run` and
//! `gatehouse controller` only choose the source, the publisher and the status sink. Reading
//! and translating run on the blocking pool, so a large configuration never delays requests.

use crate::metrics::{ControlMetrics, ResultLabel, Stage};
use crate::source::{Source, SourceSnapshot};
use crate::state::{ControlState, Published};
use futures_util::future::BoxFuture;
use gatehouse_ir as ir;
use gatehouse_translate::serving::Serving;
use gatehouse_translate::{
    Infrastructure, Input, ObjectKey, Options as TranslateOptions, Output, Reuse, Status,
    translate_reusing,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// What a data plane made of a configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Problems the data plane contained instead of rejecting the configuration.
    pub diagnostics: Vec<String>,
}

/// Where configurations go: the data plane in this process (or, later, remote ones).
pub trait Publisher: Send + Sync + 'static {
    /// Serve `config` from now on; resolves once it is applied.
    fn apply(&self, config: Arc<ir::Config>) -> BoxFuture<'_, Applied>;
    /// What is not serving right now (addresses not bound yet).
    fn serving(&self) -> Serving;
    /// Resolves when [`Publisher::serving`] may have changed (a retried bind succeeded).
    /// Cancel-safe.
    fn changed(&self) -> BoxFuture<'_, ()>;
}

/// Where status goes besides the admin endpoint (the Kubernetes API, written by the leader),
/// with whatever else the cluster keeps in step with the configuration (the data plane's
/// Service).
pub trait StatusSink: Send + 'static {
    /// Resolves when status should be written again although nothing changed (this replica
    /// just became the leader). Cancel-safe.
    fn changed(&mut self) -> BoxFuture<'_, ()>;
    /// Writes `status` (and brings what depends on `config` up to date) if this replica
    /// writes at all. Returns once the writes are queued.
    fn write<'a>(
        &'a mut self,
        input: &'a Input,
        status: Arc<Status>,
        config: &'a ir::Config,
        infrastructure: &'a BTreeMap<ObjectKey, Infrastructure>,
    ) -> BoxFuture<'a, ()>;
    /// Counts what it writes in the reconcile loop's metrics.
    fn attach_metrics(&mut self, metrics: &ControlMetrics);
    /// Stops for good (a leader releases its Lease so another takes over at once).
    fn stop(self: Box<Self>) -> BoxFuture<'static, ()>;
}

/// Per-snapshot translate options a mode derives from the objects (the controller's
/// per-Gateway addresses and published Service addresses).
pub type AdjustOptions = Box<dyn FnMut(&Input, &mut TranslateOptions) + Send>;

pub struct Reconciler<S: Source> {
    /// `None` only while a pass holds it on the blocking pool.
    source: Option<S>,
    options: TranslateOptions,
    adjust: Option<AdjustOptions>,
    publisher: Arc<dyn Publisher>,
    status: Option<Box<dyn StatusSink>>,
    state: Arc<ControlState>,
    /// The last pass's translation inputs (`None` while a pass holds them, and until the
    /// first pass).
    last: Option<LastTranslation>,
    /// Each route's translation work, for the next pass to take where it still holds.
    reuse: Reuse,
}

impl<S: Source> Reconciler<S> {
    pub fn new(
        source: S,
        options: TranslateOptions,
        publisher: Arc<dyn Publisher>,
        state: Arc<ControlState>,
    ) -> Self {
        Reconciler {
            source: Some(source),
            options,
            adjust: None,
            publisher,
            status: None,
            state,
            last: None,
            reuse: Reuse::default(),
        }
    }

    pub fn adjust_options(mut self, adjust: AdjustOptions) -> Self {
        self.adjust = Some(adjust);
        self
    }

    pub fn status_sink(mut self, mut sink: Box<dyn StatusSink>) -> Self {
        sink.attach_metrics(&self.state.metrics);
        self.status = Some(sink);
        self
    }

    /// Waits for the source, serves the first configuration and marks the state ready, then
    /// follows every change on a task of its own until `stop`.
    pub async fn start(mut self, stop: CancellationToken) -> anyhow::Result<JoinHandle<()>> {
        self.source_mut().ready().await?;
        self.update_connected();
        self.reconcile().await;
        self.state.set_started();
        Ok(tokio::spawn(self.follow(stop)))
    }

    async fn follow(mut self, stop: CancellationToken) {
        // The source's connectivity is sampled once a second for readiness and metrics;
        // a change of it alone needs no new configuration.
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        // How much pass time the loop may spend before it is paced: see `PassBudget`.
        let mut budget = PassBudget::new(Instant::now());
        // When the last pass ended, if it translated: whether a change is part of a backlog
        // (see `PassBudget`).
        let mut translated_end: Option<Instant> = None;
        // Translating passes in a row that each found the next change already waiting. One
        // alone is a change that came in while a pass finished its status; a run is a burst.
        let mut backlog_run = 0u32;
        loop {
            let source = self.source.as_mut().expect("held between passes");
            let status = self.status.as_mut();
            let work = tokio::select! {
                _ = stop.cancelled() => break,
                _ = source.changed() => true,
                _ = async { match status { Some(s) => s.changed().await, None => std::future::pending().await } } => true,
                // What serves changed (a listener bound at last): status and readiness follow.
                _ = self.publisher.changed() => true,
                _ = tick.tick() => false,
            };
            self.update_connected();
            if work {
                let now = Instant::now();
                let backlog = translated_end
                    .is_some_and(|end| now.duration_since(end) < PassBudget::BACKLOG_GAP);
                backlog_run = if backlog { backlog_run + 1 } else { 0 };
                let mut pause = budget.pause(now, backlog_run >= 2);
                // Only a pass that translates is worth holding back: our own status writes'
                // events come back while the next change is on its way, and a pass that only
                // finds them takes a millisecond. Holding it would hold that next change too.
                if !pause.is_zero() && !self.would_translate().await {
                    pause = Duration::ZERO;
                }
                if !pause.is_zero() {
                    self.state
                        .metrics
                        .pacing_pauses
                        .observe(pause.as_secs_f64());
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tokio::time::sleep(pause) => {}
                    }
                }
                let started = Instant::now();
                let translated = self.reconcile().await;
                let ended = Instant::now();
                budget.spend(ended - started, ended, backlog);
                translated_end = translated.then_some(ended);
            }
        }
        if let Some(sink) = self.status.take() {
            sink.stop().await;
        }
    }

    fn source_mut(&mut self) -> &mut S {
        self.source.as_mut().expect("held between passes")
    }

    fn update_connected(&mut self) {
        let connected = self.source_mut().connected();
        self.state.set_connected(connected);
    }

    /// Whether a pass now would translate, from a snapshot taken and dropped: not when the
    /// snapshot reads as the last pass's did (only status, the resourceVersions our writes
    /// bumped, or what serves changed), as [`Reconciler::reconcile`] decides.
    async fn would_translate(&mut self) -> bool {
        let Some(last) = self.last.take() else {
            return true;
        };
        let mut source = self.source.take().expect("held between passes");
        let mut adjust = self.adjust.take();
        let mut options = self.options.clone();
        let (source, adjust, last, same) = tokio::task::spawn_blocking(move || {
            let snapshot = read(&mut source, &mut adjust, &mut options);
            let same = last.translates_the_same(&snapshot, &options);
            (source, adjust, last, same)
        })
        .await
        .expect("reading a snapshot never panics");
        self.source = Some(source);
        self.adjust = adjust;
        self.last = Some(last);
        !same
    }

    /// One pass of the pipeline. Returns whether it translated (a pass whose snapshot read
    /// as the last one's reuses that translation and only writes status).
    pub async fn reconcile(&mut self) -> bool {
        let started = Instant::now();
        let mut source = self.source.take().expect("held between passes");
        let mut adjust = self.adjust.take();
        let mut options = self.options.clone();
        // Read before the snapshot: a pass that reuses the last translation applies nothing,
        // so nothing can bind in between.
        let serving = self.publisher.serving();
        let last = self.last.take();
        let mut reuse = std::mem::take(&mut self.reuse);
        let (source, adjust, snapshot, options, translated, times, reuse) =
            tokio::task::spawn_blocking(move || {
                let ((snapshot, reused), snapshot_took) = timed(|| {
                    let snapshot = read(&mut source, &mut adjust, &mut options);
                    let reused = last.filter(|l| l.translates_the_same(&snapshot, &options));
                    (snapshot, reused)
                });
                let mut times = PassTimes {
                    snapshot: snapshot_took,
                    ..PassTimes::default()
                };
                let translated = match reused {
                    Some(last) if last.serving == serving => Translated::Reused(last),
                    Some(last) => Translated::Restamped(last),
                    None => {
                        let (output, took) =
                            timed(|| translate_reusing(&snapshot.input, &options, &mut reuse));
                        times.translate = took;
                        Translated::New(output)
                    }
                };
                (source, adjust, snapshot, options, translated, times, reuse)
            })
            .await
            .expect("reading and translating never panic");
        self.reuse = reuse;
        self.source = Some(source);
        self.adjust = adjust;
        let translating = matches!(translated, Translated::New(_));
        if translating {
            let reused = self.reuse.reused();
            let routes = &self.state.metrics.translate_routes;
            for (result, n) in [("reused", reused.routes), ("translated", reused.worked)] {
                routes
                    .get_or_create(&ResultLabel { result })
                    .inc_by(n as u64);
            }
        }
        let (serving, infrastructure, status) = match translated {
            Translated::New(output) => {
                let status = Arc::new(output.status.clone());
                let serving = publish(
                    &self.state,
                    &*self.publisher,
                    &snapshot,
                    Some(output.config),
                    output.status,
                    started,
                    times,
                )
                .await;
                (serving, output.infrastructure, status)
            }
            Translated::Restamped(last) => {
                // What serves changed, and nothing translate reads (in provisioned mode, a
                // data plane acknowledged the last snapshot): the last translation's status
                // is stamped again with it. The configuration is the one published.
                let serving = publish(
                    &self.state,
                    &*self.publisher,
                    &snapshot,
                    None,
                    (*last.status).clone(),
                    started,
                    times,
                )
                .await;
                (serving, last.infrastructure, last.status)
            }
            Translated::Reused(last) => {
                // Only what Gatehouse writes changed (status, and the resourceVersions its
                // writes bumped): a translation would give the last output again, and stamping
                // it against the last status would give that status. Only status is written.
                // Published before it is counted, as a translated pass is: whoever sees the
                // count sees what the pass published.
                let previous = self.state.published.load_full();
                self.state
                    .published
                    .store(Arc::new(previous.with_input(snapshot.input.clone())));
                self.state.metrics.stage(Stage::Snapshot, times.snapshot);
                self.state
                    .metrics
                    .reconciles
                    .get_or_create(&ResultLabel { result: "reused" })
                    .inc();
                (last.serving, last.infrastructure, last.status)
            }
        };
        if let Some(sink) = self.status.as_mut() {
            // What was just published, or what the reused pass published: the same status
            // `Arc`, so the writer can tell it is unchanged. The sink's writer counts the
            // patches in gatehouse_status_writes_total as they finish.
            let published = self.state.published.load_full();
            let t = Instant::now();
            sink.write(
                &snapshot.input,
                Arc::clone(&published.status),
                &published.config,
                &infrastructure,
            )
            .await;
            self.state.metrics.stage(Stage::StatusQueue, t.elapsed());
        }
        // The newest snapshot, whichever of the two read the same: its objects are the ones
        // the store still shares, so the next comparison finds them by pointer.
        self.last = Some(LastTranslation {
            snapshot,
            options,
            serving,
            infrastructure,
            status,
        });
        translating
    }
}

/// What a pass made of its snapshot. One per pass, moved once: its size does not matter.
#[allow(clippy::large_enum_variant)]
enum Translated {
    New(Output),
    /// The snapshot reads as the last one did, and what serves is the same.
    Reused(LastTranslation),
    /// The snapshot reads as the last one did, but what serves changed.
    Restamped(LastTranslation),
}

/// The last translation's inputs, so that a pass whose snapshot translate would read the same
/// way can skip translating, comparing and publishing (and, when what serves changed, only
/// stamps the status again). Passes like that are common in the
/// controller: when the watch event of our own status write arrives after the next pass took
/// its snapshot, the status that pass computed waits for the event (`status.rs`) and needs a
/// pass of its own, in which nothing but resourceVersions and status changed.
struct LastTranslation {
    snapshot: SourceSnapshot,
    options: TranslateOptions,
    /// What was serving when its status was published.
    serving: Serving,
    infrastructure: BTreeMap<ObjectKey, Infrastructure>,
    /// The status translate gave, before what serves was applied to it and before stamping:
    /// a pass in which only what serves changed starts again from it. In provisioned mode
    /// that is a pass per change (the data plane acknowledges every snapshot), which
    /// translated everything again only to apply the acknowledgement.
    status: Arc<gatehouse_translate::Status>,
}

impl LastTranslation {
    /// Translate would give the same output for `snapshot` and `options`. What serves may
    /// differ: it only changes the status stamped on that output (`Translated::Restamped`).
    fn translates_the_same(&self, snapshot: &SourceSnapshot, options: &TranslateOptions) -> bool {
        let last = &self.snapshot;
        self.options == *options
            && last.errors == snapshot.errors
            && last.warnings == snapshot.warnings
            && last.pending == snapshot.pending
            && last.input.same_to_translate(&snapshot.input)
    }
}

/// How long the stages of one pass took (see [`Stage`]); observed in the metrics once the
/// pass has published, and logged with every applied configuration.
#[derive(Clone, Copy, Debug, Default)]
struct PassTimes {
    snapshot: Duration,
    translate: Duration,
    compare: Duration,
    /// `None` when the configuration did not change (nothing was applied).
    apply: Option<Duration>,
    status: Duration,
}

impl PassTimes {
    fn observe(&self, metrics: &ControlMetrics) {
        metrics.stage(Stage::Snapshot, self.snapshot);
        metrics.stage(Stage::Translate, self.translate);
        metrics.stage(Stage::Compare, self.compare);
        if let Some(apply) = self.apply {
            metrics.stage(Stage::Apply, apply);
        }
        metrics.stage(Stage::Status, self.status);
    }
}

/// A snapshot of `source`, and `options` adjusted to it (the mode's per-snapshot options).
fn read<S: Source>(
    source: &mut S,
    adjust: &mut Option<AdjustOptions>,
    options: &mut TranslateOptions,
) -> SourceSnapshot {
    let snapshot = source.snapshot();
    if let Some(adjust) = adjust.as_mut() {
        adjust(&snapshot.input, options);
    }
    snapshot
}

/// `f`'s result and how long it took.
fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let value = f();
    (value, t.elapsed())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Pacing of passes by their own cost. A pass translates the whole snapshot, so during a
/// burst of changes (1000 routes created at once, each followed by our own status write's
/// event) a loop that starts a pass for every event spends a core on translations a few
/// objects apart, and takes it from the API server the burst is going through. The loop may
/// spend [`PassBudget::BURST`] of pass time at once; beyond that it is held to
/// [`PassBudget::SHARE`] of one core, by pausing before a pass until the budget is back to
/// zero, and each paced pass takes in everything that arrived meanwhile. Only a backlog is
/// paced: a change that was already waiting when a translating pass ended, twice running, and
/// only when the pass it starts would translate (not one that finds only our own status
/// writes). A change the loop sat idle for comes from someone who waited for the last one to
/// serve (an edit, then the next; a pipeline applying one object after another): holding it
/// would coalesce nothing, since nothing else is coming until it serves, and would only delay
/// it. Its pass uses up what credit there is, so a burst that follows is paced at once, but
/// runs up no debt ([`PassBudget::spend`]). Budgeting time rather than counting passes keeps
/// the pause right whether a pass takes 1 ms or 300 ms.
#[derive(Debug)]
struct PassBudget {
    /// Pass time the loop may still spend at once, in seconds; negative is a debt.
    credit: f64,
    /// When `credit` was last brought up to date.
    updated: Instant,
}

impl PassBudget {
    /// Pass time that may be spent back to back before pacing starts.
    const BURST: Duration = Duration::from_secs(1);
    /// The share of one core passes may take while changes keep coming.
    const SHARE: f64 = 0.5;
    /// The longest pause before one pass, so a change is never held longer whatever a pass
    /// cost.
    const MAX_PAUSE: Duration = Duration::from_secs(1);
    /// A change that arrives within this of the last pass's end was waiting while it ran: a
    /// backlog. An idle loop waits far longer for its next change (a watch event, a file
    /// event) than the few microseconds between a pass's end and the next `select!`.
    const BACKLOG_GAP: Duration = Duration::from_millis(1);

    fn new(now: Instant) -> Self {
        PassBudget {
            credit: Self::BURST.as_secs_f64(),
            updated: now,
        }
    }

    /// Credit comes back at `SHARE` of the time that passed, up to `BURST`.
    fn refill(&mut self, now: Instant) {
        let passed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.credit = (self.credit + passed * Self::SHARE).min(Self::BURST.as_secs_f64());
        self.updated = now;
    }

    /// How long to wait before the next pass may start: nothing unless the change is part
    /// of a `backlog` and the budget is in debt.
    fn pause(&mut self, now: Instant, backlog: bool) -> Duration {
        self.refill(now);
        if !backlog || self.credit >= 0.0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(-self.credit / Self::SHARE).min(Self::MAX_PAUSE)
    }

    /// A pass that took `took` ended at `now`; `backlog` as for [`PassBudget::pause`]. Only
    /// a backlog runs the loop into debt: a pass the loop sat idle for uses up what credit
    /// there is and leaves any debt as it was, so a change made now and then is never held
    /// for the cost of the ones before it. The debt stops at one `BURST`, so that one pass
    /// far over the budget holds the next back by `MAX_PAUSE` at most a few times.
    fn spend(&mut self, took: Duration, now: Instant, backlog: bool) {
        self.refill(now);
        let floor = if backlog {
            -Self::BURST.as_secs_f64()
        } else {
            self.credit.min(0.0)
        };
        self.credit = (self.credit - took.as_secs_f64()).max(floor);
    }
}

/// Applies a translated configuration to the data plane (only if it changed) and publishes
/// what the admin endpoint serves, with the status stamped against the previous one. Returns
/// what was serving when that status was computed.
async fn publish(
    state: &ControlState,
    publisher: &dyn Publisher,
    snapshot: &SourceSnapshot,
    config: Option<ir::Config>,
    mut status: gatehouse_translate::Status,
    started: Instant,
    mut times: PassTimes,
) -> Serving {
    let errors = snapshot.errors.clone();
    state.metrics.source_errors.set(errors.len() as i64);
    let previous = state.published.load_full();
    // `None`: the configuration is the one published (nothing translate reads changed).
    let (changed, compare) = timed(|| config.filter(|config| *previous.config != *config));
    times.compare = compare;
    let config_changed = changed.is_some();
    let (config, applied) = if let Some(config) = changed {
        let config = Arc::new(config);
        let t = Instant::now();
        let applied = publisher.apply(Arc::clone(&config)).await;
        times.apply = Some(t.elapsed());
        (config, applied)
    } else {
        let applied = Applied {
            diagnostics: previous.diagnostics.clone(),
        };
        (Arc::clone(&previous.config), applied)
    };
    let serving = publisher.serving();

    let t = Instant::now();
    gatehouse_translate::serving::apply(&mut status, &config, &serving);
    let unstamped_routes: Vec<_> = status.routes.values().cloned().collect();
    gatehouse_translate::stamp_status_since(
        &mut status,
        &previous.status,
        &previous.unstamped_routes,
        k8s_openapi::jiff::Timestamp::now(),
    );
    let generation = previous.generation + u64::from(config_changed);
    let bind_errors: Vec<String> = serving
        .unbound
        .iter()
        .map(|(address, p)| format!("cannot listen on {address}: {}", p.error))
        .chain(
            serving
                .unbound_udp
                .iter()
                .map(|(address, p)| format!("cannot listen on {address}/udp: {}", p.error)),
        )
        .collect();
    // Ready means serving all of it: every listener bound, every referenced object read.
    let missing: Vec<String> = bind_errors
        .iter()
        .cloned()
        .chain(snapshot.pending.iter().map(|p| format!("waiting for {p}")))
        .collect();
    state.set_missing(missing);
    state.metrics.set_listeners(&status);
    state.published.store(Arc::new(Published {
        generation,
        config,
        status: Arc::new(status),
        unstamped_routes,
        input: snapshot.input.clone(),
        errors,
        warnings: snapshot.warnings.clone(),
        bind_errors,
        diagnostics: applied.diagnostics,
    }));
    times.status = t.elapsed();
    times.observe(&state.metrics);

    let result = if config_changed {
        state
            .metrics
            .apply_duration
            .observe(started.elapsed().as_secs_f64());
        tracing::info!(
            generation,
            elapsed_ms = ms(started.elapsed()),
            snapshot_ms = ms(times.snapshot),
            translate_ms = ms(times.translate),
            compare_ms = ms(times.compare),
            apply_ms = times.apply.map(ms).unwrap_or_default(),
            status_ms = ms(times.status),
            "configuration applied"
        );
        "applied"
    } else if snapshot.errors.is_empty() {
        "unchanged"
    } else {
        "error"
    };
    state
        .metrics
        .reconciles
        .get_or_create(&ResultLabel { result })
        .inc();
    state.set_generation(generation);
    serving
}

#[cfg(test)]
mod tests {
    use super::PassBudget;
    use std::time::{Duration, Instant};

    const MS: Duration = Duration::from_millis(1);

    /// Runs passes of `took`, each after the pause the budget asks for and followed by `idle`
    /// before the next change arrives (`backlog` as the loop would say), and returns the
    /// pauses.
    fn spaced(
        budget: &mut PassBudget,
        now: &mut Instant,
        (took, idle): (Duration, Duration),
        passes: usize,
        backlog: bool,
    ) -> Vec<Duration> {
        (0..passes)
            .map(|_| {
                let pause = budget.pause(*now, backlog);
                *now += pause + took;
                budget.spend(took, *now, backlog);
                *now += idle;
                pause
            })
            .collect()
    }

    /// Runs passes of `took` back to back, each after the pause the budget asks for, and
    /// returns the pauses.
    fn back_to_back(
        budget: &mut PassBudget,
        now: &mut Instant,
        took: Duration,
        passes: usize,
    ) -> Vec<Duration> {
        spaced(budget, now, (took, Duration::ZERO), passes, true)
    }

    #[test]
    fn changes_one_at_a_time_never_wait() {
        let mut now = Instant::now();
        let mut budget = PassBudget::new(now);
        // 100 passes of 85 ms, each change 100 ms after the last pass ended: the loop is
        // busy less than half of the time, so the budget never runs out.
        let pauses = spaced(&mut budget, &mut now, (85 * MS, 100 * MS), 100, true);
        assert!(pauses.iter().all(Duration::is_zero), "{pauses:?}");
    }

    #[test]
    fn a_burst_runs_at_once_then_is_held_to_half_a_core() {
        let mut now = Instant::now();
        let start = now;
        let mut budget = PassBudget::new(now);
        let pauses = back_to_back(&mut budget, &mut now, 100 * MS, 200);
        // The first second of pass time costs half of it (the credit comes back while the
        // passes run), so about 20 passes of 100 ms run without a pause.
        let unpaused = pauses.iter().take_while(|p| p.is_zero()).count();
        assert!(
            (18..=21).contains(&unpaused),
            "{unpaused} passes before the first pause"
        );
        // Then each pass waits about as long as it took: half a core.
        for pause in &pauses[30..] {
            assert!(pause.abs_diff(100 * MS) <= MS, "pause {pause:?}");
        }
        let busy = 200.0 * 0.1;
        let share = busy / now.duration_since(start).as_secs_f64();
        assert!(
            (0.5..0.55).contains(&share),
            "passes took {share} of the time"
        );
    }

    #[test]
    fn a_change_the_loop_waited_for_is_never_held() {
        let mut now = Instant::now();
        let mut budget = PassBudget::new(now);
        // Sequential changes (each made once the last one serves) that keep the loop busy 80%
        // of the time: passes of 80 ms, 20 ms idle before each next change. None is held ...
        let pauses = spaced(&mut budget, &mut now, (80 * MS, 20 * MS), 200, false);
        assert!(pauses.iter().all(Duration::is_zero), "{pauses:?}");
        // ... nor is the one change among them that happened to arrive during a pass: they
        // used up the allowance but ran up no debt for it to pay.
        assert_eq!(budget.pause(now, true), Duration::ZERO);
        // A burst now is paced after its first pass, at half a core: 40 passes of 100 ms wait
        // about 100 ms each. A debt run up by the 200 passes (6 s at half a core) would hold
        // them back a second each instead.
        let pauses = back_to_back(&mut budget, &mut now, 100 * MS, 40);
        assert!(!pauses[1].is_zero(), "the burst is paced at once");
        let waited: Duration = pauses.iter().sum();
        assert!(
            waited <= Duration::from_millis(4200),
            "the burst's 40 passes waited {waited:?} in all"
        );
    }

    #[test]
    fn a_debt_stops_at_one_burst() {
        let mut now = Instant::now();
        let mut budget = PassBudget::new(now);
        // A backlog of passes of 3 s each (a huge configuration on a slow machine): each
        // waits MAX_PAUSE, and the debt never grows past one BURST, so once the passes get
        // cheap again the pauses shrink back to half a core within a few passes.
        let slow = back_to_back(&mut budget, &mut now, 3000 * MS, 10);
        assert!(slow[2..].iter().all(|p| *p == PassBudget::MAX_PAUSE));
        let fast = back_to_back(&mut budget, &mut now, 100 * MS, 10);
        assert!(
            fast[5..].iter().all(|p| p.abs_diff(100 * MS) <= MS),
            "pauses after the slow passes: {fast:?}"
        );
    }

    #[test]
    fn the_budget_comes_back_while_idle_and_a_pause_is_bounded() {
        let mut now = Instant::now();
        let mut budget = PassBudget::new(now);
        // One pass far beyond the budget: the next waits at most MAX_PAUSE.
        now += Duration::from_secs(10);
        budget.spend(Duration::from_secs(10), now, true);
        assert_eq!(budget.pause(now, true), PassBudget::MAX_PAUSE);
        // A quiet spell refills it to a full burst, no more.
        now += Duration::from_secs(60);
        assert_eq!(budget.pause(now, true), Duration::ZERO);
        let pauses = back_to_back(&mut budget, &mut now, 100 * MS, 25);
        let unpaused = pauses.iter().take_while(|p| p.is_zero()).count();
        assert!(
            (18..=21).contains(&unpaused),
            "{unpaused} passes before the first pause"
        );
    }
}

/// Passes in which only what serves changed stamp the last translation's status again.
#[cfg(test)]
mod restamp_tests {
    use super::*;
    use gatehouse_testkit::manifests::{self, Listener};
    use prometheus_client::registry::Registry;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct FixedSource(SourceSnapshot);

    impl Source for FixedSource {
        fn changed(&mut self) -> impl Future<Output = ()> + Send {
            std::future::pending()
        }

        fn snapshot(&mut self) -> SourceSnapshot {
            self.0.clone()
        }
    }

    /// What serves is whatever the test sets; counts the configurations applied.
    #[derive(Default)]
    struct TestPublisher {
        serving: Mutex<Serving>,
        applied: AtomicUsize,
    }

    impl Publisher for TestPublisher {
        fn apply(&self, _config: Arc<ir::Config>) -> BoxFuture<'_, Applied> {
            self.applied.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Applied::default() })
        }

        fn serving(&self) -> Serving {
            self.serving.lock().unwrap().clone()
        }

        fn changed(&self) -> BoxFuture<'_, ()> {
            Box::pin(std::future::pending())
        }
    }

    fn gateway() -> ObjectKey {
        ObjectKey::new("default".to_string(), "gw".to_string())
    }

    /// The Gateway's Programmed condition: status, reason, message.
    fn programmed(state: &ControlState) -> (String, String, String) {
        let published = state.published.load_full();
        let conditions = published.status.gateways[&gateway()]
            .conditions
            .clone()
            .unwrap_or_default();
        let c = conditions
            .into_iter()
            .find(|c| c.type_ == "Programmed")
            .expect("a Programmed condition");
        (c.status, c.reason, c.message)
    }

    fn translated_routes(state: &ControlState) -> u64 {
        let routes = &state.metrics.translate_routes;
        ["reused", "translated"]
            .into_iter()
            .map(|result| routes.get_or_create(&ResultLabel { result }).get())
            .sum()
    }

    #[tokio::test]
    async fn a_change_of_what_serves_is_stamped_without_translating() {
        let input = manifests::input(
            &[
                manifests::gateway_class(),
                manifests::gateway("gw", &[Listener::http("web", 80)]),
                manifests::http_route(
                    "r",
                    "gw",
                    "  rules: [{backendRefs: [{name: svc, port: 80}]}]",
                ),
            ]
            .join("---\n"),
        );
        let snapshot = SourceSnapshot {
            input: Arc::new(input),
            ..SourceSnapshot::default()
        };
        let publisher = Arc::new(TestPublisher::default());
        let state = ControlState::new(&mut Registry::default());
        let mut reconciler = Reconciler::new(
            FixedSource(snapshot),
            TranslateOptions::default(),
            publisher.clone(),
            state.clone(),
        );
        assert!(reconciler.reconcile().await, "the first pass translates");
        assert_eq!(programmed(&state).0, "True");
        let generation = state.published.load().generation;
        let routes = translated_routes(&state);
        assert_eq!(routes, 1);

        // The data plane stops serving it: status says so, from the last translation.
        *publisher.serving.lock().unwrap() = Serving {
            not_serving: BTreeMap::from([(gateway(), "no replica is connected".to_string())]),
            ..Serving::default()
        };
        assert!(!reconciler.reconcile().await, "only what serves changed");
        let (status, reason, message) = programmed(&state);
        assert_eq!((status.as_str(), reason.as_str()), ("False", "Pending"));
        assert!(message.contains("no replica is connected"), "{message}");
        assert_eq!(
            translated_routes(&state),
            routes,
            "no route translated again"
        );
        assert_eq!(state.published.load().generation, generation);
        assert_eq!(
            publisher.applied.load(Ordering::SeqCst),
            1,
            "nothing applied again"
        );

        // It serves again.
        *publisher.serving.lock().unwrap() = Serving::default();
        assert!(!reconciler.reconcile().await);
        assert_eq!(programmed(&state).0, "True");
        // Nothing changed at all: the pass reuses the last one.
        assert!(!reconciler.reconcile().await);
        assert_eq!(programmed(&state).0, "True");
        assert_eq!(translated_routes(&state), routes);
        assert_eq!(publisher.applied.load(Ordering::SeqCst), 1);
    }
}
