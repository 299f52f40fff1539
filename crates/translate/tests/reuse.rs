//! `translate_reusing`: a pass that takes each route's work from the last pass where it still
//! holds must give exactly what translating from nothing gives. Random sequences of changes
//! (routes, Gateways, Services, endpoints, status writes, order, options), one `Reuse` through
//! each, every step compared with a fresh translation.

mod changes;

use changes::{CHANGES, apply, base};
use gatehouse_translate::{Options, Reuse, translate, translate_reusing};

#[test]
fn reusing_work_translates_as_from_nothing_over_random_changes() {
    // Another controller: none of the Gateways is ours, so no route attaches anywhere.
    let other = Options {
        controller_name: "example.com/another-controller".into(),
        ..Options::default()
    };
    let mut reused = 0;
    let mut worked = 0;
    for seed in 0..300u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut serial = 0;
        let mut input = base();
        let mut options = Options::default();
        let mut reuse = Reuse::default();
        let mut history = Vec::new();
        for step in 0..12 {
            // Now and then the options change too: they are read by every route's work.
            if rng.usize(..10) == 0 {
                options = if options == other {
                    Options::default()
                } else {
                    other.clone()
                };
                history.push("options".to_string());
            }
            let change = CHANGES[rng.usize(..CHANGES.len())];
            history.push(format!("{change:?}"));
            apply(&mut input, change, &mut rng, &mut serial);
            let fresh = translate(&input, &options);
            let kept = translate_reusing(&input, &options, &mut reuse);
            assert!(
                fresh == kept,
                "seed {seed}, step {step}: reusing work changes the output after {history:?}"
            );
            reused += reuse.reused().routes;
            worked += reuse.reused().worked;
        }
    }
    // Both paths were taken, many times.
    assert!(
        reused > 5000 && worked > 5000,
        "{reused} routes reused, {worked} worked out"
    );
}

/// Pods coming and going change EndpointSlices only: every route's work is reused, and the
/// clusters still carry the new endpoints.
#[test]
fn an_endpoints_change_reuses_every_route_and_serves_the_new_endpoints() {
    let options = Options::default();
    let mut input = base();
    let mut reuse = Reuse::default();
    translate_reusing(&input, &options, &mut reuse);
    let slice = input
        .endpoint_slices
        .iter()
        .position(|s| s.metadata.name.as_deref() == Some("svc"))
        .unwrap();
    changes::edit(&mut input.endpoint_slices, slice, |s| {
        s.endpoints[0].addresses = vec!["10.9.9.9".into()];
    });
    let out = translate_reusing(&input, &options, &mut reuse);
    assert_eq!(
        (reuse.reused().routes, reuse.reused().worked),
        (changes::ROUTES, 0)
    );
    assert!(out == translate(&input, &options));
    let cluster = out
        .config
        .clusters
        .iter()
        .find(|c| c.name == "default/svc:80")
        .unwrap();
    let addresses: Vec<String> = cluster.endpoints.iter().map(|e| e.to_string()).collect();
    assert_eq!(addresses, ["10.9.9.9:9000"]);
}
