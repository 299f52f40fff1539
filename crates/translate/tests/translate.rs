//! Table-driven tests of translate: attachment, hostnames, precedence, backends and every
//! status condition and reason it sets.

use gatehouse_ir as ir;
use gatehouse_translate::{Input, ObjectKey, Options, Output, translate};
use gateway_api::apis::standard::httproutes::HttpRoute;

fn input(yaml: &str) -> Input {
    gatehouse_testkit::manifests::input(yaml)
}

fn run(yaml: &str) -> Output {
    translate(&input(yaml), &Options::default())
}

const CLASS: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: gatehouse}
spec: {controllerName: gatehouse.dev/gateway-controller}
"#;

fn gateway(listeners: &str) -> String {
    format!(
        "{CLASS}---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: gw, namespace: default}}\nspec:\n  gatewayClassName: gatehouse\n  listeners:\n{listeners}\n"
    )
}

const HTTP_LISTENER: &str = "  - {name: http, port: 8080, protocol: HTTP}";

fn service(name: &str, ns: &str, port: u16, ip: &str) -> String {
    format!(
        r#"---
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: {ns}}}
spec:
  ports: [{{name: web, port: 80, targetPort: {port}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}-1
  namespace: {ns}
  labels: {{kubernetes.io/service-name: {name}}}
addressType: IPv4
ports: [{{name: web, port: {port}, protocol: TCP}}]
endpoints:
- addresses: ["{ip}"]
  conditions: {{ready: true}}
"#
    )
}

fn route(name: &str, ns: &str, spec: &str) -> String {
    format!(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n{spec}\n"
    )
}

fn cond<'a>(
    conds: &'a [k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    t: &str,
) -> (&'a str, &'a str) {
    let c = conds
        .iter()
        .find(|c| c.type_ == t)
        .unwrap_or_else(|| panic!("no {t} condition in {conds:?}"));
    (c.status.as_str(), c.reason.as_str())
}

fn route_cond(out: &Output, name: &str, t: &str) -> (String, String) {
    let st = out
        .status
        .route::<HttpRoute>(&ObjectKey::new("default", name))
        .unwrap();
    let (s, r) = cond(&st.parents[0].conditions, t);
    (s.to_string(), r.to_string())
}

fn listener_cond(out: &Output, listener: &str, t: &str) -> (String, String) {
    let st = &out.status.gateways[&ObjectKey::new("default", "gw")];
    let l = st
        .listeners
        .as_ref()
        .unwrap()
        .iter()
        .find(|l| l.name == listener)
        .unwrap();
    let (s, r) = cond(&l.conditions, t);
    (s.to_string(), r.to_string())
}

fn tt(s: &str, r: &str) -> (String, String) {
    (s.to_string(), r.to_string())
}

/// Rule name (route/index) each virtual host's entries point at, in order.
fn order(out: &Output, listener: &str, host: &str) -> Vec<String> {
    let l = out.config.gateways[0]
        .listeners
        .iter()
        .find(|l| l.name == listener)
        .unwrap();
    let vh = l
        .virtual_hosts
        .iter()
        .find(|v| v.hostname == host)
        .unwrap_or_else(|| panic!("no vhost {host}"));
    vh.routes
        .iter()
        .map(|e| {
            format!(
                "{}/{}",
                l.rules[e.rule].route.name, l.rules[e.rule].route.rule
            )
        })
        .collect()
}

#[test]
fn gateway_class_conditions() {
    let out = run(&format!(
        "{CLASS}---\napiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: params}}\nspec:\n  controllerName: gatehouse.dev/gateway-controller\n  parametersRef: {{group: example.com, kind: Config, name: x}}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: other}}\nspec: {{controllerName: example.com/other}}\n"
    ));
    let classes = &out.status.gateway_classes;
    assert_eq!(classes.len(), 2, "other controllers' classes get no status");
    assert_eq!(
        cond(
            classes["gatehouse"].conditions.as_ref().unwrap(),
            "Accepted"
        ),
        ("True", "Accepted")
    );
    assert_eq!(
        cond(classes["params"].conditions.as_ref().unwrap(), "Accepted"),
        ("False", "InvalidParameters")
    );
    assert!(
        classes["gatehouse"]
            .supported_features
            .as_ref()
            .unwrap()
            .iter()
            .any(|f| f.name == "HTTPRoute")
    );
}

#[test]
fn gateways_of_other_classes_are_ignored() {
    let out = run(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: gw}\nspec:\n  gatewayClassName: nope\n  listeners: [{name: http, port: 80, protocol: HTTP}]\n",
    );
    assert!(out.status.gateways.is_empty());
    assert!(out.config.gateways.is_empty());
}

#[test]
fn listener_conditions() {
    let out = run(&gateway(
        "  - {name: ok, port: 80, protocol: HTTP}\n  - {name: udp, port: 53, protocol: UDP}\n  - {name: a, port: 81, protocol: HTTP}\n  - {name: b, port: 81, protocol: HTTPS, hostname: x.com}\n  - {name: c, port: 82, protocol: HTTP, hostname: same.com}\n  - {name: d, port: 82, protocol: HTTP, hostname: same.com}\n  - name: kinds\n    port: 83\n    protocol: HTTP\n    allowedRoutes: {kinds: [{kind: HTTPRoute}, {kind: TCPRoute}]}",
    ));
    let cases = [
        ("ok", "Accepted", tt("True", "Accepted")),
        ("ok", "Programmed", tt("True", "Programmed")),
        ("ok", "ResolvedRefs", tt("True", "ResolvedRefs")),
        ("ok", "Conflicted", tt("False", "NoConflicts")),
        ("udp", "Accepted", tt("False", "UnsupportedProtocol")),
        ("udp", "Programmed", tt("False", "Invalid")),
        ("a", "Conflicted", tt("True", "ProtocolConflict")),
        ("a", "Programmed", tt("False", "Invalid")),
        ("c", "Conflicted", tt("True", "HostnameConflict")),
        ("d", "Conflicted", tt("True", "HostnameConflict")),
        ("kinds", "ResolvedRefs", tt("False", "InvalidRouteKinds")),
        ("kinds", "Programmed", tt("True", "Programmed")),
    ];
    for (listener, t, want) in cases {
        assert_eq!(listener_cond(&out, listener, t), want, "{listener} {t}");
    }
    let gw = &out.status.gateways[&ObjectKey::new("default", "gw")];
    assert_eq!(
        cond(gw.conditions.as_ref().unwrap(), "Accepted"),
        ("True", "ListenersNotValid")
    );
    assert_eq!(
        cond(gw.conditions.as_ref().unwrap(), "Programmed"),
        ("True", "Programmed")
    );
    let served: Vec<&str> = out.config.gateways[0]
        .listeners
        .iter()
        .map(|l| l.name.as_str())
        .collect();
    assert_eq!(
        served,
        ["ok", "kinds"],
        "only valid, unconflicted listeners reach the data plane"
    );
    let kinds = gw
        .listeners
        .as_ref()
        .unwrap()
        .iter()
        .find(|l| l.name == "kinds")
        .unwrap();
    assert_eq!(kinds.supported_kinds.as_ref().unwrap().len(), 1);
}

#[test]
fn gateway_all_listeners_invalid_and_bad_address() {
    let out = run(&gateway("  - {name: tcp, port: 5432, protocol: TCP}"));
    let gw = &out.status.gateways[&ObjectKey::new("default", "gw")];
    assert_eq!(
        cond(gw.conditions.as_ref().unwrap(), "Accepted"),
        ("False", "ListenersNotValid")
    );
    assert_eq!(
        cond(gw.conditions.as_ref().unwrap(), "Programmed"),
        ("False", "Invalid")
    );

    let yaml = gateway(HTTP_LISTENER).replace(
        "  gatewayClassName: gatehouse\n",
        "  gatewayClassName: gatehouse\n  addresses: [{type: Hostname, value: gw.example.com}]\n",
    );
    let out = run(&yaml);
    let gw = &out.status.gateways[&ObjectKey::new("default", "gw")];
    assert_eq!(
        cond(gw.conditions.as_ref().unwrap(), "Accepted"),
        ("False", "UnsupportedAddress")
    );
    assert_eq!(
        cond(gw.conditions.as_ref().unwrap(), "Programmed"),
        ("False", "AddressNotUsable")
    );
    assert!(out.config.gateways.is_empty());

    let yaml = gateway(HTTP_LISTENER).replace(
        "  gatewayClassName: gatehouse\n",
        "  gatewayClassName: gatehouse\n  addresses: [{type: IPAddress, value: 127.0.0.9}]\n",
    );
    let out = run(&yaml);
    assert_eq!(
        out.config.gateways[0].listeners[0].address.to_string(),
        "127.0.0.9"
    );
    let gw = &out.status.gateways[&ObjectKey::new("default", "gw")];
    assert_eq!(gw.addresses.as_ref().unwrap()[0].value, "127.0.0.9");
}

#[test]
fn route_attachment_reasons() {
    let listeners = "  - {name: same, port: 80, protocol: HTTP}\n  - name: all\n    port: 81\n    protocol: HTTP\n    allowedRoutes: {namespaces: {from: All}}\n  - name: sel\n    port: 82\n    protocol: HTTP\n    allowedRoutes: {namespaces: {from: Selector, selector: {matchLabels: {team: a}}}}\n  - {name: host, port: 83, protocol: HTTP, hostname: only.example.com}";
    let ns = "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: team-a, labels: {team: a}}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: team-b, labels: {team: b}}\n";
    let pr = |section: &str| {
        format!(
            "  parentRefs: [{{name: gw, namespace: default, sectionName: {section}}}]\n  rules: [{{backendRefs: [{{name: svc, port: 80}}]}}]"
        )
    };
    let cases = [
        ("default", "same", tt("True", "Accepted")),
        ("team-a", "same", tt("False", "NotAllowedByListeners")),
        ("team-b", "all", tt("True", "Accepted")),
        ("team-a", "sel", tt("True", "Accepted")),
        ("team-b", "sel", tt("False", "NotAllowedByListeners")),
        ("default", "missing", tt("False", "NoMatchingParent")),
    ];
    for (route_ns, section, want) in cases {
        let yaml = format!(
            "{}{ns}{}{}",
            gateway(listeners),
            service("svc", route_ns, 9000, "10.0.0.1"),
            route("r", route_ns, &pr(section))
        );
        let out = run(&yaml);
        let st = out
            .status
            .route::<HttpRoute>(&ObjectKey::new(route_ns, "r"))
            .unwrap();
        let (s, r) = cond(&st.parents[0].conditions, "Accepted");
        assert_eq!(
            (s.to_string(), r.to_string()),
            want,
            "route in {route_ns} -> {section}"
        );
        assert_eq!(
            st.parents[0].controller_name,
            "gatehouse.dev/gateway-controller"
        );
    }

    // Hostnames that do not intersect: not accepted, so not counted in attachedRoutes (v1.7.0:
    // only Accepted routes count).
    let yaml = format!(
        "{}{}{}",
        gateway(listeners),
        service("svc", "default", 9000, "10.0.0.1"),
        route(
            "r",
            "default",
            "  parentRefs: [{name: gw, sectionName: host}]\n  hostnames: [other.example.com]\n  rules: [{backendRefs: [{name: svc, port: 80}]}]"
        )
    );
    let out = run(&yaml);
    assert_eq!(
        route_cond(&out, "r", "Accepted"),
        tt("False", "NoMatchingListenerHostname")
    );
    let gw = &out.status.gateways[&ObjectKey::new("default", "gw")];
    let host = gw
        .listeners
        .as_ref()
        .unwrap()
        .iter()
        .find(|l| l.name == "host")
        .unwrap();
    assert_eq!(host.attached_routes, 0);

    // A port in the parentRef narrows the listeners.
    let yaml = format!(
        "{}{}",
        gateway(listeners),
        route("r", "default", "  parentRefs: [{name: gw, port: 9999}]")
    );
    assert_eq!(
        route_cond(&run(&yaml), "r", "Accepted"),
        tt("False", "NoMatchingParent")
    );
    let yaml = format!(
        "{}{}",
        gateway(listeners),
        route("r", "default", "  parentRefs: [{name: gw, port: 80}]")
    );
    assert_eq!(
        route_cond(&run(&yaml), "r", "Accepted"),
        tt("True", "Accepted")
    );
}

#[test]
fn routes_for_other_gateways_get_no_status() {
    let yaml = format!(
        "{}{}",
        gateway(HTTP_LISTENER),
        route("r", "default", "  parentRefs: [{name: elsewhere}]")
    );
    assert!(run(&yaml).status.routes_of::<HttpRoute>().next().is_none());
}

#[test]
fn attached_routes_counts_each_route_once_per_listener() {
    let yaml = format!(
        "{}{}{}",
        gateway("  - {name: a, port: 80, protocol: HTTP}\n  - {name: b, port: 81, protocol: HTTP}"),
        route(
            "r1",
            "default",
            "  parentRefs: [{name: gw}, {name: gw, sectionName: a}]"
        ),
        route(
            "r2",
            "default",
            "  parentRefs: [{name: gw, sectionName: b}]"
        ),
    );
    let out = run(&yaml);
    let gw = &out.status.gateways[&ObjectKey::new("default", "gw")];
    let counts: Vec<(String, i32)> = gw
        .listeners
        .as_ref()
        .unwrap()
        .iter()
        .map(|l| (l.name.clone(), l.attached_routes))
        .collect();
    assert_eq!(counts, [("a".to_string(), 1), ("b".to_string(), 2)]);
}

#[test]
fn backend_ref_resolution() {
    let grant = "---\napiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: g, namespace: other}\nspec:\n  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: default}]\n  to: [{group: \"\", kind: Service, name: granted}]\n";
    let base = format!(
        "{}{}{}{}",
        gateway(HTTP_LISTENER),
        service("svc", "default", 9000, "10.0.0.1"),
        service("granted", "other", 9001, "10.0.0.2"),
        service("ungranted", "other", 9002, "10.0.0.3"),
    );
    let cases = [
        ("{name: svc, port: 80}", tt("True", "ResolvedRefs")),
        (
            "{name: granted, namespace: other, port: 80}",
            tt("True", "ResolvedRefs"),
        ),
        (
            "{name: ungranted, namespace: other, port: 80}",
            tt("False", "RefNotPermitted"),
        ),
        ("{name: missing, port: 80}", tt("False", "BackendNotFound")),
        ("{name: svc, port: 81}", tt("False", "BackendNotFound")),
        ("{name: svc}", tt("False", "BackendNotFound")),
        (
            "{group: example.com, kind: Bucket, name: b}",
            tt("False", "InvalidKind"),
        ),
    ];
    for (backend, want) in cases {
        let yaml = format!(
            "{base}{grant}{}",
            route(
                "r",
                "default",
                &format!("  parentRefs: [{{name: gw}}]\n  rules: [{{backendRefs: [{backend}]}}]")
            )
        );
        let out = run(&yaml);
        assert_eq!(route_cond(&out, "r", "ResolvedRefs"), want, "{backend}");
        // Invalid refs still leave the route accepted; their share of traffic gets 500s.
        assert_eq!(
            route_cond(&out, "r", "Accepted"),
            tt("True", "Accepted"),
            "{backend}"
        );
        let rule = &out.config.gateways[0].listeners[0].rules[0];
        assert_eq!(
            matches!(rule.backends[0].target, ir::BackendTarget::Invalid { .. }),
            want.0 == "False",
            "{backend}"
        );
    }
    // Without the grant the same cross-namespace reference is refused.
    let yaml = format!(
        "{base}{}",
        route(
            "r",
            "default",
            "  parentRefs: [{name: gw}]\n  rules: [{backendRefs: [{name: granted, namespace: other, port: 80}]}]"
        )
    );
    assert_eq!(
        route_cond(&run(&yaml), "r", "ResolvedRefs"),
        tt("False", "RefNotPermitted")
    );
}

#[test]
fn endpoints_follow_conditions_and_service_port_mapping() {
    let yaml = format!(
        "{}{}{}",
        gateway(HTTP_LISTENER),
        r#"---
apiVersion: v1
kind: Service
metadata: {name: svc, namespace: default}
spec:
  ports:
  - {name: web, port: 80, targetPort: 8080}
  - {name: grpc, port: 90, targetPort: 9090, appProtocol: kubernetes.io/h2c}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: svc-a, namespace: default, labels: {kubernetes.io/service-name: svc}}
addressType: IPv4
ports: [{name: web, port: 8080}, {name: grpc, port: 9090}]
endpoints:
- addresses: ["10.0.0.1"]
  conditions: {ready: true}
- addresses: ["10.0.0.2"]
- addresses: ["10.0.0.3"]
  conditions: {ready: false, serving: true, terminating: true}
- addresses: ["10.0.0.4"]
  conditions: {ready: false}
"#,
        route(
            "r",
            "default",
            "  parentRefs: [{name: gw}]\n  rules:\n  - backendRefs: [{name: svc, port: 80}]\n  - matches: [{path: {value: /grpc}}]\n    backendRefs: [{name: svc, port: 90}]"
        )
    );
    let out = run(&yaml);
    let web = out
        .config
        .clusters
        .iter()
        .find(|c| c.name == "default/svc:80")
        .unwrap();
    let addrs: Vec<String> = web.endpoints.iter().map(|a| a.to_string()).collect();
    assert_eq!(
        addrs,
        ["10.0.0.1:8080", "10.0.0.2:8080"],
        "ready (or unset) only while any is ready"
    );
    assert_eq!(web.protocol, ir::UpstreamProtocol::Http1);
    let grpc = out
        .config
        .clusters
        .iter()
        .find(|c| c.name == "default/svc:90")
        .unwrap();
    assert_eq!(grpc.protocol, ir::UpstreamProtocol::H2c);
    assert_eq!(grpc.endpoints.len(), 2);

    // With nothing ready, serving endpoints that are terminating still take traffic.
    let yaml = yaml
        .replace("conditions: {ready: true}", "conditions: {ready: false}")
        .replace("- addresses: [\"10.0.0.2\"]\n", "");
    let out = run(&yaml);
    let web = out
        .config
        .clusters
        .iter()
        .find(|c| c.name == "default/svc:80")
        .unwrap();
    let addrs: Vec<String> = web.endpoints.iter().map(|a| a.to_string()).collect();
    assert_eq!(addrs, ["10.0.0.3:8080"]);
}

#[test]
fn precedence_within_and_across_routes() {
    // Each rule names its expected rank in the order the spec defines.
    let spec_new = "  parentRefs: [{name: gw}]\n  rules:\n  - matches: [{path: {type: PathPrefix, value: /}}]\n  - matches: [{path: {type: PathPrefix, value: /a}, headers: [{name: x, value: '1'}]}]\n  - matches: [{path: {type: PathPrefix, value: /a}, method: GET}]\n  - matches: [{path: {type: PathPrefix, value: /a}, headers: [{name: x, value: '1'}, {name: y, value: '2'}]}]\n  - matches: [{path: {type: PathPrefix, value: /a}, headers: [{name: x, value: '1'}], queryParams: [{name: q, value: v}]}]\n  - matches: [{path: {type: Exact, value: /a}}]\n  - matches: [{path: {type: PathPrefix, value: /a/b}}]";
    let spec_old = "  parentRefs: [{name: gw}]\n  rules:\n  - matches: [{path: {type: PathPrefix, value: /a}, headers: [{name: x, value: '1'}]}]";
    let yaml = format!(
        "{}{}{}",
        gateway(HTTP_LISTENER),
        route("new", "default", spec_new).replace(
            "metadata: {name: new, namespace: default}",
            "metadata: {name: new, namespace: default, creationTimestamp: '2024-02-01T00:00:00Z'}"
        ),
        route("old", "default", spec_old).replace(
            "metadata: {name: old, namespace: default}",
            "metadata: {name: old, namespace: default, creationTimestamp: '2024-01-01T00:00:00Z'}"
        ),
    );
    let out = run(&yaml);
    assert_eq!(
        order(&out, "http", "*"),
        [
            "new/5", "new/6", "new/2", "new/3", "new/4", "old/0", "new/1", "new/0"
        ],
        "exact, longest prefix, method, most headers, most query params, oldest route"
    );
}

#[test]
fn name_breaks_ties_between_routes_of_equal_age() {
    let spec = "  parentRefs: [{name: gw}]\n  rules: [{matches: [{path: {value: /same}}]}]";
    let yaml = format!(
        "{}{}{}",
        gateway(HTTP_LISTENER),
        route("b", "default", spec),
        route("a", "default", spec)
    );
    assert_eq!(order(&run(&yaml), "http", "*"), ["a/0", "b/0"]);
}

#[test]
fn hostname_specificity_and_fallthrough() {
    let yaml = format!(
        "{}{}{}{}",
        gateway("  - {name: http, port: 80, protocol: HTTP, hostname: '*.example.com'}"),
        route(
            "exact",
            "default",
            "  parentRefs: [{name: gw}]\n  hostnames: [foo.example.com]\n  rules: [{matches: [{path: {value: /foo}}]}]"
        ),
        route(
            "wild",
            "default",
            "  parentRefs: [{name: gw}]\n  hostnames: ['*.example.com', unrelated.org]\n  rules: [{matches: [{path: {type: Exact, value: /foo/bar}}]}]"
        ),
        route(
            "any",
            "default",
            "  parentRefs: [{name: gw}]\n  rules: [{matches: [{path: {value: /}}]}]"
        ),
    );
    let out = run(&yaml);
    let l = &out.config.gateways[0].listeners[0];
    let hosts: Vec<&str> = l
        .virtual_hosts
        .iter()
        .map(|v| v.hostname.as_str())
        .collect();
    assert_eq!(
        hosts,
        ["foo.example.com", "*.example.com"],
        "unrelated.org does not intersect; no-hostname route takes the listener's"
    );
    // The exact host's own rules come first even though the wildcard's exact path match would
    // otherwise win; then the wildcard's entries follow so unmatched paths fall through.
    assert_eq!(
        order(&out, "http", "foo.example.com"),
        ["exact/0", "wild/0", "any/0"]
    );
    assert_eq!(order(&out, "http", "*.example.com"), ["wild/0", "any/0"]);
}

#[test]
fn invalid_rules_are_dropped_with_conditions() {
    let base = format!(
        "{}{}",
        gateway(HTTP_LISTENER),
        service("svc", "default", 9000, "10.0.0.1")
    );
    let partial = route(
        "r",
        "default",
        "  parentRefs: [{name: gw}]\n  rules:\n  - matches: [{path: {type: RegularExpression, value: '/(unclosed'}}]\n    backendRefs: [{name: svc, port: 80}]\n  - backendRefs: [{name: svc, port: 80}]",
    );
    let out = run(&format!("{base}{partial}"));
    assert_eq!(route_cond(&out, "r", "Accepted"), tt("True", "Accepted"));
    assert_eq!(
        route_cond(&out, "r", "PartiallyInvalid"),
        tt("True", "UnsupportedValue")
    );
    assert_eq!(out.config.gateways[0].listeners[0].rules.len(), 1);

    let cases = [
        "  - matches: [{headers: [{name: x, type: RegularExpression, value: '[z-a]'}]}]",
        "  - matches: [{queryParams: [{name: x, type: RegularExpression, value: '(?'}]}]",
        "  - filters: [{type: RequestMirror, requestMirror: {backendRef: {name: svc, port: 80}}}]",
        "  - matches: [{path: {type: Exact, value: /x}}]\n    filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /y}}}]",
        "  - timeouts: {request: banana}",
    ];
    for rule in cases {
        let out = run(&format!(
            "{base}{}",
            route(
                "r",
                "default",
                &format!("  parentRefs: [{{name: gw}}]\n  rules:\n{rule}")
            )
        ));
        assert_eq!(
            route_cond(&out, "r", "Accepted"),
            tt("False", "UnsupportedValue"),
            "{rule}"
        );
        assert!(
            out.config.gateways[0].listeners[0].rules.is_empty(),
            "{rule}"
        );
    }
}

#[test]
fn redirect_defaults_resolve_per_listener() {
    let yaml = format!(
        "{}{}",
        gateway("  - {name: http, port: 8080, protocol: HTTP}"),
        route(
            "r",
            "default",
            "  parentRefs: [{name: gw}]\n  rules:\n  - matches: [{path: {value: /a}}]\n    filters: [{type: RequestRedirect, requestRedirect: {scheme: https}}]\n  - matches: [{path: {value: /b}}]\n    filters: [{type: RequestRedirect, requestRedirect: {hostname: b.example.com, statusCode: 301}}]\n  - matches: [{path: {value: /c}}]\n    filters: [{type: RequestRedirect, requestRedirect: {scheme: https, port: 8443, path: {type: ReplacePrefixMatch, replacePrefixMatch: /z}}}]\n  - matches: [{path: {value: /d}}]\n    filters: [{type: RequestRedirect, requestRedirect: {port: 80}}]"
        ),
    );
    let out = run(&yaml);
    let redirects: Vec<(String, Option<u16>, u16)> = out.config.gateways[0].listeners[0]
        .rules
        .iter()
        .map(|r| match &r.filters[0] {
            ir::HttpFilter::Redirect(r) => (r.scheme.clone(), r.port, r.status),
            f => panic!("not a redirect: {f:?}"),
        })
        .collect();
    assert_eq!(
        redirects,
        [
            ("https".to_string(), None, 302),
            ("http".to_string(), Some(8080), 301),
            ("https".to_string(), Some(8443), 302),
            ("http".to_string(), None, 302),
        ]
    );
}

#[test]
fn matches_and_filters_are_normalised() {
    let yaml = format!(
        "{}{}{}",
        gateway(HTTP_LISTENER),
        service("svc", "default", 9000, "10.0.0.1"),
        route(
            "r",
            "default",
            "  parentRefs: [{name: gw}]\n  rules:\n  - matches: [{path: {value: /coffee/}, method: POST, headers: [{name: X-Version, value: v2}, {name: x-version, value: ignored}], queryParams: [{name: TEST, value: v2}]}]\n    filters:\n    - type: RequestHeaderModifier\n      requestHeaderModifier: {set: [{name: X-Set, value: a}], add: [{name: X-Add, value: b}], remove: [X-Gone]}\n    backendRefs:\n    - {name: svc, port: 80, weight: 0}\n    - name: svc\n      port: 80\n      weight: 3\n      filters: [{type: ResponseHeaderModifier, responseHeaderModifier: {add: [{name: X-Backend, value: svc}]}}]\n    timeouts: {request: 10s, backendRequest: 500ms}"
        ),
    );
    let out = run(&yaml);
    let l = &out.config.gateways[0].listeners[0];
    let m = &l.virtual_hosts[0].routes[0].matcher;
    assert_eq!(m.path, ir::PathMatch::Prefix("/coffee".into()));
    assert_eq!(m.method.as_deref(), Some("POST"));
    assert_eq!(
        m.headers,
        [ir::HeaderMatch {
            name: "x-version".into(),
            value: ir::StringMatch::Exact("v2".into())
        }]
    );
    assert_eq!(m.query_params[0].name, "TEST");
    let rule = &l.rules[0];
    assert_eq!(
        rule.backends.iter().map(|b| b.weight).collect::<Vec<_>>(),
        [0, 3]
    );
    assert!(
        matches!(&rule.backends[1].filters[0], ir::HttpFilter::ResponseHeaders(h) if h.add[0].name == "x-backend")
    );
    match &rule.filters[0] {
        ir::HttpFilter::RequestHeaders(h) => {
            assert_eq!(h.set[0].name, "x-set");
            assert_eq!(h.add[0].name, "x-add");
            assert_eq!(h.remove, ["x-gone"]);
        }
        f => panic!("{f:?}"),
    }
    assert_eq!(
        rule.timeouts,
        ir::Timeouts {
            request_ms: Some(10_000),
            backend_request_ms: Some(500)
        }
    );
}

#[test]
fn output_does_not_depend_on_input_order() {
    let yaml = format!(
        "{}{}{}{}{}",
        gateway(
            "  - {name: a, port: 80, protocol: HTTP}\n  - {name: b, port: 81, protocol: HTTP, hostname: '*.x.com'}"
        ),
        service("svc", "default", 9000, "10.0.0.1"),
        service("svc2", "default", 9001, "10.0.0.2"),
        route(
            "r1",
            "default",
            "  parentRefs: [{name: gw}]\n  hostnames: [a.x.com]\n  rules: [{backendRefs: [{name: svc, port: 80}]}]"
        ),
        route(
            "r2",
            "default",
            "  parentRefs: [{name: gw}]\n  rules: [{matches: [{path: {value: /z}}], backendRefs: [{name: svc2, port: 80}]}]"
        ),
    );
    let forward = input(&yaml);
    let mut reversed = forward.clone();
    reversed.http_routes.reverse();
    reversed.services.reverse();
    reversed.endpoint_slices.reverse();
    let a = translate(&forward, &Options::default());
    let b = translate(&reversed, &Options::default());
    assert_eq!(a, b);
    assert_eq!(a, translate(&forward, &Options::default()));
}
