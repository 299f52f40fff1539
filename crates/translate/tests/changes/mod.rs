//! Changes between snapshots, as stores and our own status writes make them: shared by the
//! tests of `same_to_translate` and of reusing work between passes.

#![allow(dead_code)] // each test file uses its own part

use gatehouse_testkit::manifests::{self, Listener};
use gatehouse_translate::Input;
use std::sync::Arc;

pub const ROUTES: usize = 6;

pub fn base() -> Input {
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
pub fn is_write(change: Change) -> bool {
    matches!(
        change,
        Change::RouteStatus | Change::GatewayStatus | Change::ResourceVersion | Change::Shuffle
    )
}

#[derive(Clone, Copy, Debug)]
pub enum Change {
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
    /// The second listener's hostname (which routes it takes, and for which names).
    ListenerHostname,
    /// A Service removed (its routes' backends no longer resolve), while another is left.
    RemoveService,
    /// `svc3` (again) if there is none: a route that names it now resolves.
    AddService,
    /// An endpoint's address (a pod replaced).
    Endpoints,
}

pub const CHANGES: [Change; 17] = [
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
    Change::ListenerHostname,
    Change::RemoveService,
    Change::AddService,
    Change::Endpoints,
];

/// Replaces the object at `i` of `list` by a changed copy, as a store replaces what a watch
/// event brings.
pub fn edit<K: Clone>(list: &mut [Arc<K>], i: usize, f: impl FnOnce(&mut K)) {
    let mut copy = (*list[i]).clone();
    f(&mut copy);
    list[i] = Arc::new(copy);
}

pub fn apply(input: &mut Input, change: Change, rng: &mut fastrand::Rng, serial: &mut u64) {
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
                backends[0].name = match backends[0].name.as_str() {
                    "svc" => "svc2",
                    "svc2" => "svc3",
                    _ => "svc",
                }
                .into();
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
        Change::ListenerHostname => edit(&mut input.gateways, 0, |g| {
            let hostname = ["*.example.com", "r1.example.com", "*.other.example"];
            g.spec.listeners[1].hostname = Some(hostname[(*serial % 3) as usize].into());
        }),
        Change::RemoveService if input.services.len() > 1 => {
            input.services.remove(rng.usize(..input.services.len()));
        }
        Change::AddService
            if !input
                .services
                .iter()
                .any(|s| s.metadata.name.as_deref() == Some("svc3")) =>
        {
            let added = manifests::input(&manifests::service(
                "svc3",
                &["10.0.0.3:9000".parse().unwrap()],
                None,
            ));
            input.services.extend(added.services);
        }
        Change::Endpoints if !input.endpoint_slices.is_empty() => {
            let i = rng.usize(..input.endpoint_slices.len());
            edit(&mut input.endpoint_slices, i, |s| {
                s.endpoints[0].addresses =
                    vec![format!("10.1.{}.{}", *serial / 250, *serial % 250)];
            });
        }
        // A change that needs a route while there is none.
        _ => {}
    }
}
