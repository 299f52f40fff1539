//! `Status::changed_since`: which objects' computed status the status writer must look at
//! again, and `Kind::computed_status_changed`, which asks it for one object.

use gatehouse_testkit::manifests::{self, Listener};
use gatehouse_translate::generated::httproutes::HttpRoute;
use gatehouse_translate::{Input, Kind, Options, Status, translate};

fn input(routes: &[&str]) -> Input {
    let mut docs = vec![
        manifests::gateway_class(),
        manifests::gateway("gw", &[Listener::http("web", 80)]),
    ];
    for r in routes {
        docs.push(manifests::http_route(
            r,
            "gw",
            &format!("  hostnames: [{r}.example.com]"),
        ));
    }
    manifests::input(&docs.join("---\n"))
}

fn status(routes: &[&str]) -> Status {
    translate(&input(routes), &Options::default()).status
}

fn route<'i>(input: &'i Input, name: &str) -> &'i HttpRoute {
    input
        .http_routes
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some(name))
        .unwrap()
}

#[test]
fn only_what_changed_is_named() {
    let before = status(&["a", "b", "c"]);
    // The same status computed again: nothing changed.
    let again = status(&["a", "b", "c"]);
    let changed = again.changed_since(&before);
    assert!(
        changed.routes.is_empty() && changed.gateways.is_empty(),
        "{changed:?}"
    );
    assert!(changed.gateway_classes.is_empty());

    // A route added and one removed: both named; the Gateway is not (its attachedRoutes
    // stays 3) ...
    let after = status(&["a", "c", "d"]);
    let changed = after.changed_since(&before);
    let mut routes: Vec<_> = changed.routes.iter().map(|(_, _, n)| *n).collect();
    routes.sort();
    assert_eq!(routes, ["b", "d"]);
    assert!(changed.gateways.is_empty(), "{changed:?}");

    // ... while one more route changes the Gateway's attachedRoutes.
    let more = status(&["a", "b", "c", "d"]);
    let changed = more.changed_since(&before);
    assert_eq!(
        changed.gateways.iter().copied().collect::<Vec<_>>(),
        [("default", "gw")]
    );
    let objects = input(&["a", "b", "c", "d"]);
    assert!(route(&objects, "d").computed_status_changed(&changed));
    assert!(!route(&objects, "a").computed_status_changed(&changed));
    assert!(objects.gateways[0].computed_status_changed(&changed));
    assert!(!objects.gateway_classes[0].computed_status_changed(&changed));
}
