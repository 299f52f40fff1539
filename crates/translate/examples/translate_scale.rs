//! Times `translate` alone on N HTTPRoutes (one Gateway, one Service, one hostname per route),
//! the shape of `bench/controlplane`: for profiling the translation without a data plane, a
//! source or a prober in the samples (`perf record` this binary).
//!
//!   cargo run --release -p gatehouse-translate --example translate_scale -- [ROUTES] [PASSES]
//!
//! Prints the mean and minimum time of one translation. Measures; asserts nothing.

use gatehouse_testkit::manifests::{self, Listener};
use gatehouse_translate::{Options, translate};
use std::time::{Duration, Instant};

/// The allocator the gatehouse binary runs translate with.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    let mut args = std::env::args().skip(1);
    let routes: usize = args.next().map_or(5000, |a| a.parse().expect("ROUTES"));
    let passes: usize = args.next().map_or(50, |a| a.parse().expect("PASSES"));
    let mut docs = vec![
        manifests::gateway_class(),
        manifests::gateway("gw", &[Listener::http("web", 8080).from_all()]),
        manifests::service("svc", &["10.0.0.1:9000".parse().unwrap()], None),
    ];
    for i in 0..routes {
        docs.push(manifests::http_route(
            &format!("r{i}"),
            "gw",
            &format!(
                "  hostnames: [r{i}.example.com]\n  rules: [{{matches: [{{path: {{type: PathPrefix, value: /}}}}], backendRefs: [{{name: svc, port: 80}}]}}]"
            ),
        ));
    }
    let input = manifests::input(&docs.join("---\n"));
    let options = Options::default();
    let mut total = Duration::ZERO;
    let mut min = Duration::MAX;
    for _ in 0..passes {
        let t = Instant::now();
        let out = translate(&input, &options);
        let took = t.elapsed();
        std::hint::black_box(out);
        total += took;
        min = min.min(took);
    }
    println!(
        "{routes} routes: translate mean {:.2} ms, min {:.2} ms over {passes} passes",
        total.as_secs_f64() * 1000.0 / passes as f64,
        min.as_secs_f64() * 1000.0
    );
}
