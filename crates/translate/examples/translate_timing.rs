//! Translate alone, timed in process: N routes (one hostname each, on one listener), then
//! passes that add and remove one more route in turn through one `Reuse`, as the reconcile
//! loop runs them. Prints the min, p10 and p50 of the passes' times.
//!
//!   cargo run --release -p gatehouse-translate --example translate_timing [ROUTES] [PASSES]
//!
//! For comparing builds of translate without the rest of the pass (the file source, the data
//! plane) and its noise; `bench/controlplane/standalone` measures the whole propagation. On a
//! machine shared with others, compare the minimums of several runs taken in turn.

use gatehouse_testkit::manifests::{self, Listener};
use gatehouse_translate::{Options, Reuse, translate_reusing};
use std::time::Instant;

fn route(name: &str) -> String {
    manifests::http_route(
        name,
        "gw",
        &format!(
            "  hostnames: [{name}.example.com]\n  rules: [{{matches: [{{path: {{type: PathPrefix, value: /}}}}], backendRefs: [{{name: svc, port: 80}}]}}]"
        ),
    )
}

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>());
    let routes = args.next().transpose().expect("ROUTES").unwrap_or(5000);
    let passes = args.next().transpose().expect("PASSES").unwrap_or(400);
    let mut docs = vec![
        manifests::gateway_class(),
        manifests::gateway("gw", &[Listener::http("web", 80)]),
        manifests::service("svc", &["10.0.0.1:9000".parse().unwrap()], None),
    ];
    docs.extend((0..routes).map(|i| route(&format!("r{i}"))));
    let without = manifests::input(&docs.join("---\n"));
    let mut with = without.clone();
    with.http_routes
        .extend(manifests::input(&route("new")).http_routes);

    let options = Options::default();
    let mut reuse = Reuse::default();
    translate_reusing(&without, &options, &mut reuse);
    let mut times: Vec<f64> = (0..passes)
        .map(|k| {
            let input = if k % 2 == 0 { &with } else { &without };
            let start = Instant::now();
            let output = translate_reusing(input, &options, &mut reuse);
            let elapsed = start.elapsed();
            // Dropped outside the timing, as the reconcile loop keeps it until the next pass.
            drop(output);
            elapsed.as_secs_f64() * 1000.0
        })
        .collect();
    times.sort_by(f64::total_cmp);
    let at = |q: usize| times[(times.len() - 1) * q / 100];
    println!(
        "{routes} routes, {passes} passes: min {:.3} p10 {:.3} p50 {:.3} ms",
        at(0),
        at(10),
        at(50)
    );
}
