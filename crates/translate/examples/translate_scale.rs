//! Times `translate` alone on N HTTPRoutes (one Gateway, one Service, one hostname per route),
//! the shape of `bench/controlplane`: for profiling the translation without a data plane, a
//! source or a prober in the samples (`perf record` this binary).
//!
//!   cargo run --release -p gatehouse-translate --example translate_scale -- [ROUTES] [PASSES]
//!
//! Prints the mean and minimum time of one translation. Measures; asserts nothing.
//!
//! With a third argument `reuse`, each pass first replaces one route with a fresh copy (a
//! changed object, as a store gives it) and translates with [`translate_reusing`], as the
//! reconcile loop does; it also prints the memory the kept work holds between passes (run it
//! with `_RJEM_MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0` for that figure to be the heap's).
//!
//! With `add` instead, passes add one more route and remove it again in turn, reusing, as
//! `bench/controlplane/standalone` changes the routes: the pass of a new route at N existing.
//! On a machine shared with others, compare the minimums (and p10) of runs taken in turn.

use gatehouse_testkit::manifests::{self, Listener};
use gatehouse_translate::{Options, Reuse, translate, translate_reusing};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The allocator the gatehouse binary runs translate with.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    let mut args = std::env::args().skip(1);
    let routes: usize = args.next().map_or(5000, |a| a.parse().expect("ROUTES"));
    let passes: usize = args.next().map_or(50, |a| a.parse().expect("PASSES"));
    assert!(passes > 0, "PASSES: at least one");
    let mode = args.next();
    let (mut reuse, add) = match mode.as_deref() {
        None => (None, false),
        Some("reuse") => (Some(Reuse::default()), false),
        Some("add") => (Some(Reuse::default()), true),
        Some(other) => panic!("unknown mode {other}: `reuse` or `add`"),
    };
    let mut docs = vec![
        manifests::gateway_class(),
        manifests::gateway("gw", &[Listener::http("web", 8080).from_all()]),
        manifests::service("svc", &["10.0.0.1:9000".parse().unwrap()], None),
    ];
    docs.extend((0..routes).map(|i| route(&format!("r{i}"))));
    let mut input = manifests::input(&docs.join("---\n"));
    let added = manifests::input(&route("new"))
        .http_routes
        .pop()
        .expect("a route");
    let options = Options::default();
    let mut times = Vec::with_capacity(passes);
    let mut held = None;
    for pass in 0..passes {
        if add {
            if pass % 2 == 0 {
                input.http_routes.push(Arc::clone(&added));
            } else {
                input.http_routes.pop();
            }
        } else if reuse.is_some() && routes > 0 {
            let i = pass % routes;
            input.http_routes[i] = Arc::new((*input.http_routes[i]).clone());
        }
        let t = Instant::now();
        let out = match &mut reuse {
            Some(reuse) => translate_reusing(&input, &options, reuse),
            None => translate(&input, &options),
        };
        times.push(t.elapsed());
        // Dropped outside the timing, as the reconcile loop keeps it until the next pass.
        drop(out);
        if pass + 1 == passes {
            held = reuse.as_ref().map(|_| allocated());
        }
    }
    let mode = match (&reuse, add) {
        (Some(_), true) => ", one route added and removed in turn, reusing",
        (Some(_), false) => ", one route changed per pass, reusing",
        (None, _) => "",
    };
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mean = ms(times.iter().sum::<Duration>()) / passes.max(1) as f64;
    times.sort();
    let at = |q: usize| ms(times[(times.len() - 1) * q / 100]);
    println!(
        "{routes} routes{mode}: translate mean {mean:.2} ms, min {:.2} p10 {:.2} p50 {:.2} ms over {passes} passes",
        at(0),
        at(10),
        at(50)
    );
    if let Some(held) = held {
        drop(reuse);
        let without = allocated();
        println!(
            "kept between passes: {:.1} MB ({:.0} bytes per route)",
            held.saturating_sub(without) as f64 / 1e6,
            held.saturating_sub(without) as f64 / routes.max(1) as f64
        );
    }
}

/// A route to the Service with a hostname of its own.
fn route(name: &str) -> String {
    manifests::http_route(
        name,
        "gw",
        &format!(
            "  hostnames: [{name}.example.com]\n  rules: [{{matches: [{{path: {{type: PathPrefix, value: /}}}}], backendRefs: [{{name: svc, port: 80}}]}}]"
        ),
    )
}

/// The process's anonymous resident memory: its heap, as close as jemalloc lets it be when
/// it returns freed pages at once (`_RJEM_MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0`).
fn allocated() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("RssAnon");
    kib * 1024
}
