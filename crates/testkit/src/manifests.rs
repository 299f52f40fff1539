//! Manifests for tests: multi-document YAML to an [`Input`] through the kind registry (so a new
//! kind needs no change here), and typed builders for the objects tests write most.

use gatehouse_translate::kinds::{Kind, KindVisitor, for_each_kind};
use gatehouse_translate::{GATEWAY_GROUP, Input};
use serde::Deserialize;

/// Every document of `yaml` into an [`Input`]. Panics on a kind the registry does not know.
pub fn input(yaml: &str) -> Input {
    let mut input = Input::default();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let value = serde_yaml::Value::deserialize(doc).expect("valid YAML");
        if value.is_null() {
            continue;
        }
        push(&mut input, value);
    }
    input
}

/// Adds one object (any registered kind, by its `kind` field) to `input`. Panics on an unknown
/// kind or an object that does not parse.
pub fn push(input: &mut Input, value: serde_yaml::Value) {
    if let Err(e) = try_push(input, value) {
        panic!("{e}");
    }
}

/// Adds one object to `input`, or says why it cannot: no `kind`, a kind the registry does not
/// know, or an object that does not parse as its kind.
pub fn try_push(input: &mut Input, value: serde_yaml::Value) -> Result<(), String> {
    struct Push<'i> {
        input: &'i mut Input,
        kind: String,
        value: Option<serde_yaml::Value>,
        result: Result<(), String>,
    }
    impl KindVisitor for Push<'_> {
        fn visit<K: Kind>(&mut self) {
            if K::kind_name() == self.kind
                && let Some(v) = self.value.take()
            {
                match serde_yaml::from_value::<K>(v) {
                    Ok(object) => self.input.push(object),
                    Err(e) => self.result = Err(format!("{} does not parse: {e}", self.kind)),
                }
            }
        }
    }
    let kind = value["kind"]
        .as_str()
        .ok_or("an object without a kind")?
        .to_string();
    let mut visit = Push {
        input,
        kind,
        value: Some(value),
        result: Ok(()),
    };
    for_each_kind(&mut visit);
    if visit.value.is_some() {
        return Err(format!("unknown kind {}", visit.kind));
    }
    visit.result
}

/// Multi-document YAML of typed objects.
pub fn to_yaml<T: serde::Serialize>(objects: &[T]) -> String {
    objects
        .iter()
        .map(|o| serde_yaml::to_string(o).expect("serialisable"))
        .collect::<Vec<_>>()
        .join("---\n")
}

/// The GatewayClass `gatehouse` for Gatehouse's controller.
pub fn gateway_class() -> String {
    format!(
        "apiVersion: {GATEWAY_GROUP}/v1\nkind: GatewayClass\nmetadata: {{name: gatehouse}}\nspec: {{controllerName: {}}}\n",
        gatehouse_translate::CONTROLLER_NAME
    )
}

/// A listener of a [`gateway`].
#[derive(Clone, Debug)]
pub struct Listener {
    pub name: String,
    pub port: u16,
    pub protocol: String,
    pub hostname: Option<String>,
    /// `allowedRoutes.namespaces.from`, `Same` when `None`.
    pub from: Option<String>,
}

impl Listener {
    pub fn http(name: &str, port: u16) -> Self {
        Listener {
            name: name.into(),
            port,
            protocol: "HTTP".into(),
            hostname: None,
            from: None,
        }
    }

    pub fn hostname(mut self, hostname: &str) -> Self {
        self.hostname = Some(hostname.into());
        self
    }

    /// Routes from every namespace.
    pub fn from_all(mut self) -> Self {
        self.from = Some("All".into());
        self
    }
}

/// A Gateway of class `gatehouse` in namespace `default`.
pub fn gateway(name: &str, listeners: &[Listener]) -> String {
    let mut out = format!(
        "apiVersion: {GATEWAY_GROUP}/v1\nkind: Gateway\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  gatewayClassName: gatehouse\n  listeners:\n"
    );
    for l in listeners {
        out.push_str(&format!(
            "  - {{name: {}, port: {}, protocol: {}",
            l.name, l.port, l.protocol
        ));
        if let Some(h) = &l.hostname {
            out.push_str(&format!(", hostname: \"{h}\""));
        }
        if let Some(from) = &l.from {
            out.push_str(&format!(
                ", allowedRoutes: {{namespaces: {{from: {from}}}}}"
            ));
        }
        out.push_str("}\n");
    }
    out
}

/// A Service `name` in `default` with port 80 (named `http`) whose EndpointSlice lists
/// `endpoints` as ready (they must share one port).
pub fn service(
    name: &str,
    endpoints: &[std::net::SocketAddr],
    app_protocol: Option<&str>,
) -> String {
    let port = endpoints.first().map(|e| e.port()).unwrap_or(1);
    let app = app_protocol
        .map(|p| format!(", appProtocol: {p}"))
        .unwrap_or_default();
    let eps: String = endpoints
        .iter()
        .map(|e| {
            format!(
                "- addresses: [\"{}\"]\n  conditions: {{ready: true}}\n",
                e.ip()
            )
        })
        .collect();
    format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  ports: [{{name: http, port: 80, targetPort: {port}{app}}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  namespace: default\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\nports: [{{name: http, port: {port}, protocol: TCP}}]\nendpoints:{}",
        if eps.is_empty() {
            " []\n".to_string()
        } else {
            format!("\n{eps}")
        }
    )
}

/// An HTTPRoute `name` in `default` attached to Gateway `gateway`, whose spec continues with
/// `body` (YAML indented two spaces).
pub fn http_route(name: &str, gateway: &str, body: &str) -> String {
    format!(
        "apiVersion: {GATEWAY_GROUP}/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  parentRefs: [{{name: {gateway}}}]\n{body}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builders_parse_into_an_input() {
        let yaml = [
            gateway_class(),
            gateway(
                "gw",
                &[Listener::http("web", 8080)
                    .hostname("*.example.com")
                    .from_all()],
            ),
            service("svc", &["10.0.0.1:9000".parse().unwrap()], None),
            http_route(
                "r",
                "gw",
                "  rules: [{backendRefs: [{name: svc, port: 80}]}]",
            ),
        ]
        .join("---\n");
        let input = input(&yaml);
        assert_eq!(input.gateway_classes.len(), 1);
        let gw = &input.gateways[0];
        assert_eq!(
            gw.spec.listeners[0].hostname.as_deref(),
            Some("*.example.com")
        );
        assert_eq!(input.services.len(), 1);
        assert_eq!(
            input.endpoint_slices[0].endpoints[0].addresses,
            ["10.0.0.1"]
        );
        assert_eq!(
            input.http_routes[0].spec.parent_refs.as_ref().unwrap()[0].name,
            "gw"
        );
    }
}
