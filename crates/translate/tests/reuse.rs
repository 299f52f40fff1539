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

/// A Service changed undoes the work of the routes that name it and of no other; a Service
/// that a route names but that did not exist counts as named too. Anything else that every
/// route's work may read (here a ReferenceGrant) undoes every route's.
#[test]
fn a_service_change_reworks_only_the_routes_that_name_it() {
    let options = Options::default();
    let mut input = base();
    let mut reuse = Reuse::default();
    // r0 to svc2, r1 to svc3 (not there yet); the others to svc.
    changes::edit(&mut input.http_routes, 0, |r| {
        r.spec.rules.as_mut().unwrap()[0]
            .backend_refs
            .as_mut()
            .unwrap()[0]
            .name = "svc2".into();
    });
    changes::edit(&mut input.http_routes, 1, |r| {
        r.spec.rules.as_mut().unwrap()[0]
            .backend_refs
            .as_mut()
            .unwrap()[0]
            .name = "svc3".into();
    });
    translate_reusing(&input, &options, &mut reuse);

    let svc2 = input
        .services
        .iter()
        .position(|s| s.metadata.name.as_deref() == Some("svc2"))
        .unwrap();
    changes::edit(&mut input.services, svc2, |s| {
        s.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 81;
    });
    let out = translate_reusing(&input, &options, &mut reuse);
    assert_eq!(
        (reuse.reused().routes, reuse.reused().worked),
        (changes::ROUTES - 1, 1)
    );
    assert!(out == translate(&input, &options));

    // svc3 appears: r1, whose backend was not found, now resolves.
    let added = gatehouse_testkit::manifests::input(&gatehouse_testkit::manifests::service(
        "svc3",
        &["10.0.0.3:9000".parse().unwrap()],
        None,
    ));
    input.services.extend(added.services);
    let out = translate_reusing(&input, &options, &mut reuse);
    assert_eq!(
        (reuse.reused().routes, reuse.reused().worked),
        (changes::ROUTES - 1, 1)
    );
    assert!(out == translate(&input, &options));
    assert!(
        out.config
            .clusters
            .iter()
            .any(|c| c.name == "default/svc3:80"),
        "r1 resolves to svc3 now"
    );

    let grant = gatehouse_testkit::manifests::input(
        "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: g, namespace: default}\nspec:\n  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: other}]\n  to: [{group: '', kind: Service}]\n",
    );
    input.reference_grants.extend(grant.reference_grants);
    let out = translate_reusing(&input, &options, &mut reuse);
    assert_eq!(
        (reuse.reused().routes, reuse.reused().worked),
        (0, changes::ROUTES)
    );
    assert!(out == translate(&input, &options));
}

/// Each virtual host entry's match, by listener, hostname and position.
fn matches(
    out: &gatehouse_translate::Output,
) -> Vec<(
    (String, String, usize),
    std::sync::Arc<gatehouse_ir::HttpMatch>,
)> {
    let mut all = Vec::new();
    for l in out.config.gateways.iter().flat_map(|g| &g.listeners) {
        for v in &l.virtual_hosts {
            for (i, e) in v.routes.iter().enumerate() {
                all.push(((l.name.clone(), v.hostname.clone(), i), e.matcher.clone()));
            }
        }
    }
    all
}

/// How many of `after`'s entries hold `before`'s match object at the same place, of how many.
fn shared_matches(
    before: &gatehouse_translate::Output,
    after: &gatehouse_translate::Output,
) -> (usize, usize) {
    let before = matches(before);
    let after = matches(after);
    let shared = after
        .iter()
        .filter(|(at, m)| {
            before
                .iter()
                .any(|(b_at, b)| b_at == at && std::sync::Arc::ptr_eq(b, m))
        })
        .count();
    (shared, after.len())
}

/// A route added shares every other route's match objects with the last pass's entries, also
/// when it is attached before them and every rule index moves: the data plane takes each of
/// those hosts' compiled tables again by these pointers (`CompiledHosts`).
#[test]
fn a_route_added_leaves_the_other_hosts_matches_shared() {
    let options = Options::default();
    let mut input = base();
    let mut reuse = Reuse::default();
    let first = translate_reusing(&input, &options, &mut reuse);
    // Both listeners serve every route's name (the second one's *.example.com covers them).
    let entries = 2 * changes::ROUTES;
    assert_eq!(matches(&first).len(), entries);

    // Of the same age as the others (none given) and first by name: attached first, its rule
    // takes index 0 and every other rule moves up one.
    input
        .http_routes
        .extend(gatehouse_testkit::manifests::input(&gatehouse_testkit::manifests::http_route(
            "aa",
            "gw",
            "  hostnames: [aa.example.com]\n  rules: [{matches: [{path: {type: PathPrefix, value: /}}], backendRefs: [{name: svc, port: 80}]}]",
        ))
        .http_routes);
    let added = translate_reusing(&input, &options, &mut reuse);
    assert!(added == translate(&input, &options));
    let moved = |out: &gatehouse_translate::Output| {
        let hosts = &out.config.gateways[0].listeners[0].virtual_hosts;
        let r1 = hosts.iter().find(|v| v.hostname == "r1.example.com");
        r1.unwrap().routes[0].rule
    };
    assert_eq!(moved(&added), moved(&first) + 1, "rules moved up one");
    assert_eq!(shared_matches(&first, &added), (entries, entries + 2));

    // A route changed is new work: its entries are new objects, the others' are kept.
    changes::edit(&mut input.http_routes, 0, |r| {
        r.spec.rules.as_mut().unwrap()[0].matches.as_mut().unwrap()[0]
            .path
            .as_mut()
            .unwrap()
            .value = Some("/changed".into());
    });
    let changed = translate_reusing(&input, &options, &mut reuse);
    assert!(changed == translate(&input, &options));
    assert_eq!(shared_matches(&added, &changed), (entries, entries + 2));
}
