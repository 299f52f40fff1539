//! End to end over real sockets: a ListenerSet's listener is served by its Gateway, reaches
//! only the routes attached to the ListenerSet, and a ListenerSet the Gateway does not allow
//! opens no port. Standalone mode (`gatehouse run` on a directory of manifests).

mod support;

use support::*;

fn manifests(gw_port: u16, set_port: u16, refused_port: u16) -> String {
    format!(
        r#"{class}---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: gw, namespace: default}}
spec:
  gatewayClassName: gatehouse
  allowedListeners: {{namespaces: {{from: Same}}}}
  listeners:
  - {{name: http, port: {gw_port}, protocol: HTTP}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {{name: team, namespace: default}}
spec:
  parentRef: {{name: gw}}
  listeners:
  - {{name: team-http, port: {set_port}, protocol: HTTP, hostname: {HOST}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {{name: intruder, namespace: elsewhere}}
spec:
  parentRef: {{name: gw, namespace: default}}
  listeners:
  - {{name: sneaky, port: {refused_port}, protocol: HTTP}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: on-set, namespace: default}}
spec:
  parentRefs: [{{kind: ListenerSet, name: team, sectionName: team-http}}]
  rules:
  - matches: [{{path: {{value: /team}}}}]
    backendRefs: [{{name: team, port: 80}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: on-gateway, namespace: default}}
spec:
  parentRefs: [{{name: gw}}]
  rules:
  - matches: [{{path: {{value: /gw}}}}]
    backendRefs: [{{name: owner, port: 80}}]
"#,
        class = gatehouse_testkit::manifests::gateway_class(),
    )
}

async fn get(c: &reqwest::Client, port: u16, path: &str) -> (u16, String) {
    status_and_backend(c.get(url(port, path)).send().await.unwrap()).await
}

#[tokio::test]
async fn listener_set_listener_serves_its_routes_only() {
    let (gw_port, set_port, refused_port) = (free_port(), free_port(), free_port());
    let team = echo("team").await;
    let owner = echo("owner").await;
    let services = [
        service("team", &[team], None),
        service("owner", &[owner], None),
    ]
    .concat();
    let gw = Gateway::start(&[
        ("all.yaml", manifests(gw_port, set_port, refused_port)),
        ("backends.yaml", services),
    ])
    .await;
    assert!(gw.errors().is_empty(), "{:?}", gw.errors());
    let c = client();

    // The ListenerSet's port is open and carries the ListenerSet's route...
    assert_eq!(get(&c, set_port, "/team").await, (200, "team".into()));
    // ...and not the Gateway's: a Gateway parentRef does not reach a ListenerSet's listener.
    assert_eq!(get(&c, set_port, "/gw").await.0, 404);
    // The Gateway's own listener is the other way round.
    assert_eq!(get(&c, gw_port, "/gw").await, (200, "owner".into()));
    assert_eq!(get(&c, gw_port, "/team").await.0, 404);
    // A ListenerSet from a namespace the Gateway does not allow binds nothing.
    let refused = c.get(url(refused_port, "/")).send().await;
    assert!(
        refused.as_ref().is_err_and(|e| e.is_connect()),
        "port {refused_port} of a ListenerSet that is not allowed must stay closed: {refused:?}"
    );

    // Status, as /status reports it: the allowed set is Accepted with its listener's
    // attachedRoutes, the other NotAllowed, and the Gateway counts one attached set.
    let status = gw.status().await;
    let objects = status["objects"].as_array().expect("objects");
    let find = |kind: &str, ns: &str, name: &str| {
        objects
            .iter()
            .find(|o| {
                o["kind"] == kind
                    && o["metadata"]["namespace"] == ns
                    && o["metadata"]["name"] == name
            })
            .unwrap_or_else(|| panic!("{kind} {ns}/{name} in /status"))
            .clone()
    };
    let condition = |o: &serde_json::Value, type_: &str| {
        let c = o["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == type_)
            .unwrap()
            .clone();
        (
            c["status"].as_str().unwrap().to_string(),
            c["reason"].as_str().unwrap().to_string(),
        )
    };
    let team_set = find("ListenerSet", "default", "team");
    assert_eq!(
        condition(&team_set, "Accepted"),
        ("True".into(), "Accepted".into())
    );
    assert_eq!(
        condition(&team_set, "Programmed"),
        ("True".into(), "Programmed".into())
    );
    assert_eq!(team_set["status"]["listeners"][0]["name"], "team-http");
    assert_eq!(team_set["status"]["listeners"][0]["attachedRoutes"], 1);
    let intruder = find("ListenerSet", "elsewhere", "intruder");
    assert_eq!(
        condition(&intruder, "Accepted"),
        ("False".into(), "NotAllowed".into())
    );
    let gateway = find("Gateway", "default", "gw");
    assert_eq!(gateway["status"]["attachedListenerSets"], 1);
    let listeners = gateway["status"]["listeners"].as_array().unwrap();
    assert_eq!(
        listeners.len(),
        1,
        "the Gateway reports only its own listener"
    );
    assert_eq!(listeners[0]["attachedRoutes"], 1);

    gw.stop().await;
}
