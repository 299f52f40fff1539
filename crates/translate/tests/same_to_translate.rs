//! `Input::same_to_translate`: the check that lets a pass reuse the last translation. Its one
//! duty is safety: whenever it says two inputs read the same, translating them must give the
//! same output. Its use is that our own status writes (status and resourceVersion changes)
//! read the same, so the passes they cause translate nothing.

use gatehouse_testkit::manifests::{self, Listener};
use gatehouse_translate::{Input, Options, translate};
use std::sync::Arc;

const ROUTES: usize = 6;

fn base() -> Input {
    let mut docs = vec![
        manifests::gateway_class(),
        manifests::gateway(
            "gw",
            &[
                Listener::http("web", 80),
                Listener::http("other", 81).hostname("*.example.com"),
            ],
        ),
        manifests::service("svc", &["10.0.0.1:9000".parse().unwrap()], None),
        manifests::service("svc2", &["10.0.0.2:9000".parse().unwrap()], None),
    ];
    for i in 0..ROUTES {
        docs.push(manifests::http_route(
            &format!("r{i}"),
            "gw",
            &format!(
                "  hostnames: [r{i}.example.com]\n  rules: [{{matches: [{{path: {{type: PathPrefix, value: /p{i}}}}}], backendRefs: [{{name: svc, port: 80}}]}}]"
            ),
        ));
    }
    manifests::input(&docs.join("---\n"))
}

/// A change the status writer makes (or the API server makes because of it).
fn is_write(change: Change) -> bool {
    matches!(
        change,
        Change::RouteStatus | Change::GatewayStatus | Change::ResourceVersion | Change::Shuffle
    )
}

#[derive(Clone, Copy, Debug)]
enum Change {
    /// A route's status replaced (our write, or someone else's) and its version bumped.
    RouteStatus,
    /// The Gateway's status replaced and its version bumped.
    GatewayStatus,
    /// Only a resourceVersion and managedFields (a write that changed nothing we read).
    ResourceVersion,
    /// The same objects in another order (a store's iteration order).
    Shuffle,
    /// A route's path prefix.
    RoutePath,
    /// A route's labels.
    RouteLabel,
    /// A route's generation (the API server bumps it with the spec).
    RouteGeneration,
    /// A route's backend.
    RouteBackend,
    /// The Gateway's listener port.
    ListenerPort,
    /// A Service's port.
    ServicePort,
    /// A Service's status (someone else's: translate may read it).
    ServiceStatus,
    /// A route removed.
    RemoveRoute,
    /// A route added.
    AddRoute,
}

const CHANGES: [Change; 13] = [
    Change::RouteStatus,
    Change::GatewayStatus,
    Change::ResourceVersion,
    Change::Shuffle,
    Change::RoutePath,
    Change::RouteLabel,
    Change::RouteGeneration,
    Change::RouteBackend,
    Change::ListenerPort,
    Change::ServicePort,
    Change::ServiceStatus,
    Change::RemoveRoute,
    Change::AddRoute,
];

/// Replaces the object at `i` of `list` by a changed copy, as a store replaces what a watch
/// event brings.
fn edit<K: Clone>(list: &mut [Arc<K>], i: usize, f: impl FnOnce(&mut K)) {
    let mut copy = (*list[i]).clone();
    f(&mut copy);
    list[i] = Arc::new(copy);
}

fn apply(input: &mut Input, change: Change, rng: &mut fastrand::Rng, serial: &mut u64) {
    *serial += 1;
    let version = Some(serial.to_string());
    let n = input.http_routes.len();
    match change {
        Change::RouteStatus if n > 0 => {
            let i = rng.usize(..n);
            let status = serde_yaml::from_str(&format!(
                "parents: [{{parentRef: {{name: gw}}, controllerName: x/{serial}, conditions: []}}]"
            ))
            .unwrap();
            edit(&mut input.http_routes, i, |r| {
                r.status = Some(status);
                r.metadata.resource_version = version;
            });
        }
        Change::GatewayStatus => {
            let status = serde_yaml::from_str(&format!(
                "listeners: [{{name: web, attachedRoutes: {serial}, supportedKinds: [], conditions: []}}]"
            ))
            .unwrap();
            edit(&mut input.gateways, 0, |g| {
                g.status = Some(status);
                g.metadata.resource_version = version;
            });
        }
        Change::ResourceVersion if n > 0 => {
            let i = rng.usize(..n);
            edit(&mut input.http_routes, i, |r| {
                r.metadata.resource_version = version;
                r.metadata.managed_fields = Some(Vec::new());
            });
        }
        Change::Shuffle => {
            rng.shuffle(&mut input.http_routes);
            rng.shuffle(&mut input.services);
        }
        Change::RoutePath if n > 0 => {
            let i = rng.usize(..n);
            edit(&mut input.http_routes, i, |r| {
                let rules = r.spec.rules.as_mut().unwrap();
                let path = rules[0].matches.as_mut().unwrap()[0].path.as_mut().unwrap();
                path.value = Some(format!("/changed{serial}"));
            });
        }
        Change::RouteLabel if n > 0 => {
            let i = rng.usize(..n);
            edit(&mut input.http_routes, i, |r| {
                r.metadata
                    .labels
                    .get_or_insert_default()
                    .insert("l".into(), serial.to_string());
            });
        }
        Change::RouteGeneration if n > 0 => {
            let i = rng.usize(..n);
            edit(&mut input.http_routes, i, |r| {
                r.metadata.generation = Some(*serial as i64);
            });
        }
        Change::RouteBackend if n > 0 => {
            let i = rng.usize(..n);
            edit(&mut input.http_routes, i, |r| {
                let rules = r.spec.rules.as_mut().unwrap();
                let backends = rules[0].backend_refs.as_mut().unwrap();
                backends[0].name = if backends[0].name == "svc" {
                    "svc2".into()
                } else {
                    "svc".into()
                };
            });
        }
        Change::ListenerPort => edit(&mut input.gateways, 0, |g| {
            g.spec.listeners[0].port = 80 + (*serial % 5) as i32;
        }),
        Change::ServicePort => {
            let i = rng.usize(..input.services.len());
            edit(&mut input.services, i, |s| {
                let ports = s.spec.as_mut().unwrap().ports.as_mut().unwrap();
                ports[0].port = 80 + (*serial % 3) as i32;
            });
        }
        Change::ServiceStatus => {
            let i = rng.usize(..input.services.len());
            let status = serde_yaml::from_str(&format!(
                "loadBalancer: {{ingress: [{{ip: 192.0.2.{}}}]}}",
                *serial % 200
            ))
            .unwrap();
            edit(&mut input.services, i, |s| s.status = Some(status));
        }
        Change::RemoveRoute if n > 0 => {
            input.http_routes.remove(rng.usize(..n));
        }
        Change::AddRoute => {
            let added = manifests::input(&manifests::http_route(
                &format!("added{serial}"),
                "gw",
                "  rules: [{matches: [{path: {type: PathPrefix, value: /added}}], backendRefs: [{name: svc, port: 80}]}]",
            ));
            input.http_routes.extend(added.http_routes);
        }
        // A change that needs a route while there is none.
        _ => {}
    }
}

/// Random sequences of changes from one snapshot to the next: whenever the check says the two
/// read the same, translate gives the same output; whenever the changes were only writes of
/// status (and what comes with them), the check says so.
#[test]
fn inputs_that_read_the_same_translate_the_same() {
    let options = Options::default();
    let mut reused = 0;
    let mut translated = 0;
    for seed in 0..400u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut serial = 0;
        let mut before = base();
        // Some history first, so that the snapshots compared are not always the base.
        for _ in 0..rng.usize(0..4) {
            let change = CHANGES[rng.usize(..CHANGES.len())];
            apply(&mut before, change, &mut rng, &mut serial);
        }
        let mut after = before.clone();
        let mut changes = Vec::new();
        for _ in 0..rng.usize(1..4) {
            let change = CHANGES[rng.usize(..CHANGES.len())];
            changes.push(change);
            apply(&mut after, change, &mut rng, &mut serial);
        }
        let same = before.same_to_translate(&after);
        assert_eq!(
            same,
            after.same_to_translate(&before),
            "seed {seed}: the check is not symmetric ({changes:?})"
        );
        if same {
            reused += 1;
            assert!(
                translate(&before, &options) == translate(&after, &options),
                "seed {seed}: {changes:?} read the same but translate differently"
            );
        } else {
            translated += 1;
        }
        if changes.iter().all(|c| is_write(*c)) {
            assert!(
                same,
                "seed {seed}: only writes ({changes:?}), yet not the same"
            );
        }
    }
    // Both sides were exercised.
    assert!(
        reused > 50 && translated > 50,
        "{reused} reused, {translated} translated"
    );
}

/// Each change that translate reads is seen on its own, whatever else stays the same.
#[test]
fn every_change_translate_reads_is_seen() {
    for change in CHANGES.into_iter().filter(|c| !is_write(*c)) {
        let before = base();
        let mut after = before.clone();
        let mut rng = fastrand::Rng::with_seed(7);
        let mut serial = 100;
        apply(&mut after, change, &mut rng, &mut serial);
        assert!(!before.same_to_translate(&after), "{change:?} was not seen");
    }
}

/// A list with one object twice (two files may declare it) is never taken for the same: which
/// of the two wins is translate's to decide.
#[test]
fn a_key_twice_is_never_the_same() {
    let before = base();
    let mut after = before.clone();
    let first = Arc::clone(&after.http_routes[0]);
    after.http_routes[1] = first;
    after.http_routes.reverse();
    assert!(!before.same_to_translate(&after));
    assert!(!after.same_to_translate(&before));
}
