//! Table-driven tests of TLS in translate: certificateRefs, ReferenceGrant for Secrets, frontend
//! client validation, TLSRoute attachment, BackendTLSPolicy and backend client certificates.

use gatehouse_ir as ir;
use gatehouse_translate::{Input, ObjectKey, Options, Output, translate};
use gateway_api::apis::standard::{httproutes::HttpRoute, tlsroutes::TlsRoute};

fn input(yaml: &str) -> Input {
    gatehouse_testkit::manifests::input(yaml)
}

fn run(yaml: &str) -> Output {
    translate(&input(yaml), &Options::default())
}

fn indent(pem: &str, n: usize) -> String {
    pem.lines()
        .map(|l| format!("{}{l}\n", " ".repeat(n)))
        .collect()
}

/// A self-signed certificate and key for `names`, PEM.
fn cert(names: &[&str]) -> (String, String) {
    let c =
        rcgen::generate_simple_self_signed(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap();
    (c.cert.pem(), c.signing_key.serialize_pem())
}

fn tls_secret(name: &str, ns: &str, (crt, key): &(String, String)) -> String {
    format!(
        "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: {ns}}}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}",
        indent(crt, 4),
        indent(key, 4)
    )
}

fn ca_config_map(name: &str, pem: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: default}}\ndata:\n  ca.crt: |\n{}",
        indent(pem, 4)
    )
}

const CLASS: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: gatehouse}\nspec: {controllerName: gatehouse.dev/gateway-controller}\n";

fn gateway(extra_spec: &str, listeners: &str) -> String {
    format!(
        "{CLASS}---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: gw, namespace: default}}\nspec:\n  gatewayClassName: gatehouse\n{extra_spec}  listeners:\n{listeners}\n"
    )
}

fn https(name: &str, port: u16, host: Option<&str>, cert_refs: &str) -> String {
    let host = host
        .map(|h| format!(", hostname: '{h}'"))
        .unwrap_or_default();
    format!(
        "  - {{name: {name}, port: {port}, protocol: HTTPS{host}, tls: {{certificateRefs: [{cert_refs}]}}}}\n"
    )
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
    let c = l.conditions.iter().find(|c| c.type_ == t).unwrap();
    (c.status.clone(), c.reason.clone())
}

fn gateway_cond(out: &Output, t: &str) -> Option<(String, String)> {
    let st = &out.status.gateways[&ObjectKey::new("default", "gw")];
    st.conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == t)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

fn tt(s: &str, r: &str) -> (String, String) {
    (s.into(), r.into())
}

#[test]
fn certificate_refs() {
    let good = cert(&["cafe.example.com"]);
    let other = cert(&["other.example.com"]);
    let mismatched = (good.0.clone(), other.1.clone());
    let secrets = [
        tls_secret("good", "default", &good),
        tls_secret("mismatch", "default", &mismatched),
        tls_secret("elsewhere", "certs", &good),
        tls_secret("granted", "granted-ns", &good),
        "---\napiVersion: v1\nkind: Secret\nmetadata: {name: malformed, namespace: default}\ntype: kubernetes.io/tls\nstringData: {tls.crt: '-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n', tls.key: x}\n".to_string(),
        "---\napiVersion: v1\nkind: Secret\nmetadata: {name: opaque, namespace: default}\ntype: Opaque\nstringData: {a: b}\n".to_string(),
    ]
    .concat();
    let grant = "---\napiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: g, namespace: granted-ns}\nspec:\n  from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: default}]\n  to: [{group: \"\", kind: Secret}]\n";
    let cases = [
        ("{name: good}", tt("True", "ResolvedRefs")),
        ("{name: missing}", tt("False", "InvalidCertificateRef")),
        ("{name: mismatch}", tt("False", "InvalidCertificateRef")),
        ("{name: malformed}", tt("False", "InvalidCertificateRef")),
        ("{name: opaque}", tt("False", "InvalidCertificateRef")),
        (
            "{name: elsewhere, namespace: certs}",
            tt("False", "RefNotPermitted"),
        ),
        (
            "{name: granted, namespace: granted-ns}",
            tt("True", "ResolvedRefs"),
        ),
        (
            "{group: example.com, kind: Vault, name: good}",
            tt("False", "InvalidCertificateRef"),
        ),
    ];
    for (r, want) in cases {
        let yaml = format!(
            "{}{secrets}{grant}",
            gateway(
                "",
                &format!(
                    "{}{}",
                    https("tls", 443, None, r),
                    "  - {name: http, port: 80, protocol: HTTP}"
                )
            )
        );
        let out = run(&yaml);
        assert_eq!(listener_cond(&out, "tls", "ResolvedRefs"), want, "{r}");
        let ok = want.0 == "True";
        assert_eq!(
            listener_cond(&out, "tls", "Programmed").0,
            if ok { "True" } else { "False" },
            "{r}"
        );
        let listeners = &out.config.gateways[0].listeners;
        assert_eq!(
            listeners.iter().any(|l| l.name == "tls"),
            ok,
            "{r}: served only when valid"
        );
        assert!(
            listeners.iter().any(|l| l.name == "http"),
            "{r}: other listeners keep working"
        );
        if ok {
            let l = listeners.iter().find(|l| l.name == "tls").unwrap();
            assert_eq!(l.protocol, ir::ListenerProtocol::Https);
            let names = &l.tls.as_ref().unwrap().certificates;
            assert_eq!(
                out.config
                    .certificates
                    .iter()
                    .map(|c| &c.name)
                    .collect::<Vec<_>>(),
                names.iter().collect::<Vec<_>>()
            );
            assert!(
                out.config.certificates[0]
                    .cert_pem
                    .contains("BEGIN CERTIFICATE")
            );
        }
    }
    // The mismatch message says what is wrong.
    let yaml = format!(
        "{}{secrets}",
        gateway("", &https("tls", 443, None, "{name: mismatch}"))
    );
    let st = &run(&yaml).status.gateways[&ObjectKey::new("default", "gw")];
    let msg = &st.listeners.as_ref().unwrap()[0]
        .conditions
        .iter()
        .find(|c| c.type_ == "ResolvedRefs")
        .unwrap()
        .message;
    assert!(msg.contains("does not match"), "{msg}");
}

#[test]
fn tls_port_sharing_and_route_kinds() {
    let c = cert(&["a.example.com"]);
    let yaml = format!(
        "{}{}{}{}",
        gateway(
            "",
            &format!(
                "{}  - {{name: pass, port: 443, protocol: TLS, hostname: b.example.com, tls: {{mode: Passthrough}}}}\n  - {{name: pass-dup, port: 8443, protocol: TLS, hostname: c.example.com, tls: {{mode: Passthrough}}}}\n{}",
                https("term", 443, Some("a.example.com"), "{name: s}"),
                https("term-dup", 8443, Some("c.example.com"), "{name: s}")
            )
        ),
        tls_secret("s", "default", &c),
        "---\napiVersion: v1\nkind: Service\nmetadata: {name: tls-backend, namespace: default}\nspec: {ports: [{name: tls, port: 443}]}\n",
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: TLSRoute\nmetadata: {name: t, namespace: default}\nspec:\n  parentRefs: [{name: gw}]\n  hostnames: [b.example.com]\n  rules: [{backendRefs: [{name: tls-backend, port: 443}]}]\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: h, namespace: default}\nspec:\n  parentRefs: [{name: gw, sectionName: pass}]\n",
    );
    let out = run(&yaml);
    assert_eq!(
        listener_cond(&out, "term", "Conflicted"),
        tt("False", "NoConflicts"),
        "HTTPS and TLS share a port by SNI"
    );
    assert_eq!(
        listener_cond(&out, "pass", "Conflicted"),
        tt("False", "NoConflicts")
    );
    assert_eq!(
        listener_cond(&out, "pass-dup", "Conflicted"),
        tt("True", "HostnameConflict")
    );
    assert_eq!(
        listener_cond(&out, "term-dup", "Conflicted"),
        tt("True", "HostnameConflict")
    );
    let l = out.config.gateways[0]
        .listeners
        .iter()
        .find(|l| l.name == "pass")
        .unwrap();
    assert_eq!(l.protocol, ir::ListenerProtocol::Tls);
    assert_eq!(l.tls.as_ref().unwrap().mode, ir::TlsMode::Passthrough);
    assert_eq!(l.tls_routes.len(), 1);
    assert_eq!(l.tls_routes[0].hostnames, ["b.example.com"]);
    assert!(
        matches!(&l.tls_routes[0].backends[0].target, ir::BackendTarget::Cluster(c) if c == "default/tls-backend:443")
    );
    let tls_status = out
        .status
        .route::<TlsRoute>(&ObjectKey::new("default", "t"))
        .unwrap();
    assert_eq!(tls_status.parents[0].conditions[0].status, "True");
    let h = out
        .status
        .route::<HttpRoute>(&ObjectKey::new("default", "h"))
        .unwrap();
    assert_eq!(
        h.parents[0].conditions[0].reason, "NotAllowedByListeners",
        "HTTPRoute cannot use a TLS listener"
    );
}

#[test]
fn https_redirect_defaults_use_https_scheme() {
    let c = cert(&["cafe.example.com"]);
    let yaml = format!(
        "{}{}---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r, namespace: default}}\nspec:\n  parentRefs: [{{name: gw}}]\n  rules:\n  - filters: [{{type: RequestRedirect, requestRedirect: {{hostname: x.example.com}}}}]\n",
        gateway(
            "",
            &format!(
                "{}{}",
                https("a", 443, None, "{name: s}"),
                https("b", 8443, None, "{name: s}")
            )
        ),
        tls_secret("s", "default", &c)
    );
    let out = run(&yaml);
    let ports: Vec<(String, Option<u16>)> = out.config.gateways[0]
        .listeners
        .iter()
        .map(|l| match &l.rules[0].filters[0] {
            ir::HttpFilter::Redirect(r) => (r.scheme.clone(), r.port),
            f => panic!("{f:?}"),
        })
        .collect();
    assert_eq!(
        ports,
        [
            ("https".to_string(), None),
            ("https".to_string(), Some(8443))
        ]
    );
}

#[test]
fn frontend_client_validation() {
    let c = cert(&["cafe.example.com"]);
    let ca = cert(&["ca"]);
    let base = format!(
        "{}{}",
        tls_secret("s", "default", &c),
        ca_config_map("ca", &ca.0)
    );
    let frontend = |default_ref: &str, per_port: &str| {
        format!(
            "  tls:\n    frontend:\n      default:\n        validation: {{caCertificateRefs: [{default_ref}]}}\n{per_port}"
        )
    };
    let listeners = format!(
        "{}{}",
        https("a", 443, None, "{name: s}"),
        https("b", 8443, None, "{name: s}")
    );
    // Default for every port, AllowValidOnly.
    let out = run(&format!(
        "{}{base}",
        gateway(
            &frontend("{group: '', kind: ConfigMap, name: ca}", ""),
            &listeners
        )
    ));
    assert_eq!(gateway_cond(&out, "InsecureFrontendValidationMode"), None);
    for l in &out.config.gateways[0].listeners {
        let v = l.tls.as_ref().unwrap().client_validation.as_ref().unwrap();
        assert!(v.ca_pem.contains("BEGIN CERTIFICATE"));
        assert!(!v.allow_insecure_fallback);
    }
    // A per-port override with insecure fallback applies to its port only.
    let per_port = "      perPort:\n      - port: 8443\n        tls: {validation: {caCertificateRefs: [{group: '', kind: ConfigMap, name: ca}], mode: AllowInsecureFallback}}\n";
    let out = run(&format!(
        "{}{base}",
        gateway(
            &frontend("{group: '', kind: ConfigMap, name: ca}", per_port),
            &listeners
        )
    ));
    let fallback: Vec<bool> = out.config.gateways[0]
        .listeners
        .iter()
        .map(|l| {
            l.tls
                .as_ref()
                .unwrap()
                .client_validation
                .as_ref()
                .unwrap()
                .allow_insecure_fallback
        })
        .collect();
    assert_eq!(fallback, [false, true]);
    assert_eq!(
        gateway_cond(&out, "InsecureFrontendValidationMode"),
        Some(tt("True", "ConfigurationChanged"))
    );
    // Bad references keep the listener from being served rather than serving it unvalidated.
    for (r, want) in [
        (
            "{group: '', kind: ConfigMap, name: nope}",
            tt("False", "InvalidCACertificateRef"),
        ),
        (
            "{group: '', kind: Secret, name: ca}",
            tt("False", "InvalidCACertificateKind"),
        ),
    ] {
        let out = run(&format!("{}{base}", gateway(&frontend(r, ""), &listeners)));
        assert_eq!(listener_cond(&out, "a", "ResolvedRefs"), want, "{r}");
        assert_eq!(listener_cond(&out, "a", "Programmed").0, "False");
        // No usable CA at all: the listener cannot check anyone, so it is not Accepted.
        assert_eq!(
            listener_cond(&out, "a", "Accepted"),
            tt("False", "NoValidCACertificate"),
            "{r}"
        );
    }
    // One good CA and one bad: still refused (fail closed), but the listener is Accepted.
    let out = run(&format!(
        "{}{base}",
        gateway(
            &frontend(
                "{group: '', kind: ConfigMap, name: ca}, {group: '', kind: ConfigMap, name: nope}",
                ""
            ),
            &listeners
        )
    ));
    assert_eq!(
        listener_cond(&out, "a", "ResolvedRefs"),
        tt("False", "InvalidCACertificateRef")
    );
    assert_eq!(listener_cond(&out, "a", "Accepted").0, "True");
    assert_eq!(listener_cond(&out, "a", "Programmed").0, "False");
}

fn backend_tls_setup(policy_validation: &str, gateway_spec: &str) -> String {
    let ca = cert(&["ca"]);
    let c = cert(&["cafe.example.com"]);
    let client = cert(&["gateway-client"]);
    format!(
        "{}{}{}{}{}---\napiVersion: v1\nkind: Service\nmetadata: {{name: secure, namespace: default}}\nspec: {{ports: [{{name: https, port: 443}}]}}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r, namespace: default}}\nspec:\n  parentRefs: [{{name: gw}}]\n  rules: [{{backendRefs: [{{name: secure, port: 443}}]}}]\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: BackendTLSPolicy\nmetadata: {{name: p, namespace: default}}\nspec:\n  targetRefs: [{{group: '', kind: Service, name: secure}}]\n  validation: {policy_validation}\n",
        gateway(gateway_spec, "  - {name: http, port: 80, protocol: HTTP}"),
        tls_secret("s", "default", &c),
        tls_secret("client", "default", &client),
        ca_config_map("ca", &ca.0),
        "",
    )
}

#[test]
fn backend_tls_policy() {
    let yaml = backend_tls_setup(
        "{hostname: secure.internal, caCertificateRefs: [{group: '', kind: ConfigMap, name: ca}], subjectAltNames: [{type: Hostname, hostname: alt.internal}, {type: URI, uri: 'spiffe://cluster/secure'}]}",
        "",
    );
    let out = run(&yaml);
    let cluster = &out.config.clusters[0];
    let tls = cluster
        .tls
        .as_ref()
        .expect("the policy secures the cluster");
    assert_eq!(tls.server_name, "secure.internal");
    assert!(tls.ca_pem.as_ref().unwrap().contains("BEGIN CERTIFICATE"));
    assert_eq!(
        tls.subject_alt_names,
        [
            ir::SubjectAltName::Dns("alt.internal".into()),
            ir::SubjectAltName::Uri("spiffe://cluster/secure".into())
        ]
    );
    let st = &out.status.backend_tls_policies[&ObjectKey::new("default", "p")];
    assert_eq!(st.ancestors.len(), 1);
    assert_eq!(st.ancestors[0].ancestor_ref.name, "gw");
    assert!(
        st.ancestors[0]
            .conditions
            .iter()
            .all(|c| c.status == "True")
    );

    // System roots.
    let out = run(&backend_tls_setup(
        "{hostname: secure.internal, wellKnownCACertificates: System}",
        "",
    ));
    assert_eq!(out.config.clusters[0].tls.as_ref().unwrap().ca_pem, None);

    // A CA that cannot be found makes the backend invalid (500s), never trusts other roots.
    let out = run(&backend_tls_setup(
        "{hostname: secure.internal, caCertificateRefs: [{group: '', kind: ConfigMap, name: missing}]}",
        "",
    ));
    let rule = &out.config.gateways[0].listeners[0].rules[0];
    assert!(matches!(
        rule.backends[0].target,
        ir::BackendTarget::Invalid { .. }
    ));
    let st = &out.status.backend_tls_policies[&ObjectKey::new("default", "p")];
    assert_eq!(
        st.ancestors.len(),
        1,
        "the Gateway whose route would use the backend is the ancestor"
    );
    let c = st.ancestors[0]
        .conditions
        .iter()
        .find(|c| c.type_ == "ResolvedRefs")
        .unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "InvalidCACertificateRef")
    );
    let a = st.ancestors[0]
        .conditions
        .iter()
        .find(|c| c.type_ == "Accepted")
        .unwrap();
    assert_eq!(
        (a.status.as_str(), a.reason.as_str()),
        ("False", "NoValidCACertificate"),
        "no usable CA: the policy is not accepted"
    );
    let route = out
        .status
        .route::<HttpRoute>(&ObjectKey::new("default", "r"))
        .unwrap();
    let rr = route.parents[0]
        .conditions
        .iter()
        .find(|c| c.type_ == "ResolvedRefs")
        .unwrap();
    assert_eq!(rr.status, "False");
}

#[test]
fn gateway_backend_client_certificate() {
    let spec = "  tls:\n    backend:\n      clientCertificateRef: {name: client}\n";
    let out = run(&backend_tls_setup(
        "{hostname: secure.internal, wellKnownCACertificates: System}",
        spec,
    ));
    let rule = &out.config.gateways[0].listeners[0].rules[0];
    let ir::BackendTarget::Cluster(name) = &rule.backends[0].target else {
        panic!()
    };
    let cluster = out
        .config
        .clusters
        .iter()
        .find(|c| &c.name == name)
        .unwrap();
    assert_eq!(
        cluster.tls.as_ref().unwrap().client_certificate.as_deref(),
        Some("default/client")
    );
    assert!(
        out.config
            .certificates
            .iter()
            .any(|c| c.name == "default/client"),
        "the client certificate reaches the data plane"
    );
    let gw = &out.status.gateways[&ObjectKey::new("default", "gw")];
    let rr = gw
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == "ResolvedRefs")
        .unwrap();
    assert_eq!(rr.status, "True");

    let spec = "  tls:\n    backend:\n      clientCertificateRef: {name: nope}\n";
    let out = run(&backend_tls_setup(
        "{hostname: secure.internal, wellKnownCACertificates: System}",
        spec,
    ));
    assert_eq!(
        gateway_cond(&out, "ResolvedRefs"),
        Some(tt("False", "InvalidClientCertificateRef"))
    );

    // A Secret in another namespace without a ReferenceGrant: RefNotPermitted.
    let spec =
        "  tls:\n    backend:\n      clientCertificateRef: {name: client, namespace: other}\n";
    let out = run(&backend_tls_setup(
        "{hostname: secure.internal, wellKnownCACertificates: System}",
        spec,
    ));
    assert_eq!(
        gateway_cond(&out, "ResolvedRefs"),
        Some(tt("False", "RefNotPermitted"))
    );
}
