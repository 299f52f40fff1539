//! The data plane's Service, kept by the controller: its ports follow the listeners of the
//! Gateways it serves, so nobody keeps a port list by hand (the Helm chart renders no
//! Service; it gives the controller a template instead).
//!
//! The template is a Service manifest without ports (type, selector, labels, annotations,
//! externalTrafficPolicy, load-balancer settings); the controller sets its name, namespace,
//! owner and ports and applies it server-side as field manager `gatehouse`, only when the
//! result differs from what it applied last. While no listener exists the Service is left as
//! it is (created only once there is a port), so its load-balancer address survives a moment
//! without Gateways.

use gatehouse_ir as ir;
use gatehouse_translate::ObjectKey;
use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use std::collections::{BTreeMap, BTreeSet};
use tokio::sync::watch;

/// What the controller needs to keep the data-plane Service.
#[derive(Clone, Debug)]
pub struct ServiceTemplate {
    pub key: ObjectKey,
    /// The manifest to complete (metadata.labels/annotations and spec, without ports).
    pub template: Service,
    /// Deleted with this owner (the controller's Deployment): uninstalling leaves nothing.
    pub owner: Option<OwnerReference>,
}

/// The port and transport of every listener in `config`, sorted: a UDP listener's port is a
/// UDP port of the Service (a TCP one would never reach its socket), every other protocol's a
/// TCP one; a UDP and a TCP-based listener may share a port number.
pub fn listener_ports(config: &ir::Config) -> BTreeSet<(u16, ir::Transport)> {
    config
        .gateways
        .iter()
        .flat_map(|g| &g.listeners)
        .map(|l| (l.port, l.transport()))
        .collect()
}

/// The Service to apply for `ports` (`None` without ports: nothing to apply).
pub fn desired(
    template: &ServiceTemplate,
    ports: &BTreeSet<(u16, ir::Transport)>,
) -> Option<Service> {
    if ports.is_empty() {
        return None;
    }
    let mut svc = template.template.clone();
    svc.metadata.name = Some(template.key.name.clone());
    svc.metadata.namespace = Some(template.key.namespace.clone());
    svc.metadata.owner_references = template.owner.clone().map(|o| vec![o]);
    svc.metadata.resource_version = None;
    svc.metadata.uid = None;
    svc.metadata.creation_timestamp = None;
    svc.metadata.managed_fields = None;
    svc.status = None;
    let spec = svc.spec.get_or_insert_with(Default::default);
    spec.ports = Some(
        ports
            .iter()
            .map(|&(port, transport)| {
                let protocol = match transport {
                    ir::Transport::Tcp => "TCP",
                    ir::Transport::Udp => "UDP",
                };
                ServicePort {
                    name: Some(format!("{}-{port}", protocol.to_lowercase())),
                    port: i32::from(port),
                    target_port: Some(IntOrString::Int(i32::from(port))),
                    protocol: Some(protocol.into()),
                    ..Default::default()
                }
            })
            .collect(),
    );
    Some(svc)
}

/// Listener ports (with their transport) that the data-plane Service lacks because the API
/// server refused or did not answer the apply that adds them, with its error. Status reports
/// their listeners as not programmed: traffic to the Service's address on them goes nowhere.
pub type MissingPorts = BTreeMap<(u16, ir::Transport), String>;

/// Applies the desired Service, remembering the last one applied so that an unchanged port
/// set costs no request.
pub struct ServiceKeeper {
    client: Client,
    template: ServiceTemplate,
    last: Option<Service>,
    /// The ports of `last`.
    applied: BTreeSet<(u16, ir::Transport)>,
    missing: watch::Sender<MissingPorts>,
}

impl ServiceKeeper {
    pub fn new(client: Client, template: ServiceTemplate) -> Self {
        ServiceKeeper {
            client,
            template,
            last: None,
            applied: BTreeSet::new(),
            missing: watch::Sender::new(MissingPorts::new()),
        }
    }

    /// What the Service lacks after the last apply, kept up to date by [`Self::sync`].
    pub fn missing_ports(&self) -> watch::Receiver<MissingPorts> {
        self.missing.subscribe()
    }

    /// Only a change of the ports wakes the receivers (`failures::replace`).
    fn set_missing(&self, missing: MissingPorts) {
        crate::failures::replace(&self.missing, missing);
    }

    /// This replica no longer leads: the Service is the new leader's to keep. The ports an
    /// apply of ours could not add are no longer ours to report (they would stay in this
    /// replica's status until it led again, whatever the leader has applied since), and what
    /// we applied last may be overwritten by then, so leading again applies afresh.
    pub fn stand_down(&mut self) {
        self.last = None;
        self.applied.clear();
        self.set_missing(MissingPorts::new());
    }

    /// Applies the Service `config`'s listeners need, if it differs from the last one applied;
    /// false when the API server refused it or did not answer (the caller tries again later:
    /// nothing else would, since the next pass comes only with a change).
    pub async fn sync(&mut self, config: &ir::Config) -> bool {
        let ports = listener_ports(config);
        let Some(svc) = desired(&self.template, &ports) else {
            // Left as it is; no listener needs a port of it.
            self.set_missing(MissingPorts::new());
            return true;
        };
        if self.last.as_ref() == Some(&svc) {
            // Back to what the Service has (a failed apply's ports removed again).
            self.set_missing(MissingPorts::new());
            return true;
        }
        let api: Api<Service> = Api::namespaced(self.client.clone(), &self.template.key.namespace);
        let params = PatchParams::apply("gatehouse").force();
        let mut body = serde_json::to_value(&svc).unwrap_or_default();
        body["apiVersion"] = "v1".into();
        body["kind"] = "Service".into();
        match api
            .patch(&self.template.key.name, &params, &Patch::Apply(&body))
            .await
        {
            Ok(_) => {
                tracing::info!(service = %self.template.key, ports = ?ports, "data-plane Service applied");
                self.last = Some(svc);
                self.applied = ports;
                self.set_missing(MissingPorts::new());
                true
            }
            Err(e) => {
                tracing::warn!(service = %self.template.key, "cannot apply the data-plane Service: {e}");
                // Ports a successful apply added are on the Service; of the others nothing
                // is known but that this apply did not add them.
                let why = format!(
                    "the data-plane Service {} could not be given this port: {e}",
                    self.template.key
                );
                self.set_missing(
                    ports
                        .difference(&self.applied)
                        .map(|&p| (p, why.clone()))
                        .collect(),
                );
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template() -> ServiceTemplate {
        let template: Service = serde_yaml::from_str(
            "metadata: {labels: {app: gh}, annotations: {lb: x}}\nspec: {type: LoadBalancer, selector: {app: gh}, externalTrafficPolicy: Local}\n",
        )
        .unwrap();
        ServiceTemplate {
            key: ObjectKey::new("gatehouse-system", "gatehouse"),
            template,
            owner: None,
        }
    }

    #[test]
    fn ports_follow_the_listeners_and_the_template_is_kept() {
        let tcp = |p| (p, ir::Transport::Tcp);
        let svc = desired(&template(), &BTreeSet::from([tcp(443), tcp(80), tcp(8080)])).unwrap();
        assert_eq!(svc.metadata.name.as_deref(), Some("gatehouse"));
        assert_eq!(svc.metadata.namespace.as_deref(), Some("gatehouse-system"));
        assert_eq!(svc.metadata.annotations.as_ref().unwrap()["lb"], "x");
        let spec = svc.spec.unwrap();
        assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
        assert_eq!(spec.external_traffic_policy.as_deref(), Some("Local"));
        let ports: Vec<(String, i32)> = spec
            .ports
            .unwrap()
            .into_iter()
            .map(|p| (p.name.unwrap(), p.port))
            .collect();
        assert_eq!(
            ports,
            [
                ("tcp-80".to_string(), 80),
                ("tcp-443".to_string(), 443),
                ("tcp-8080".to_string(), 8080)
            ]
        );
        assert!(desired(&template(), &BTreeSet::new()).is_none());
    }

    #[tokio::test]
    async fn only_a_change_of_the_missing_ports_wakes_the_loop() {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let keeper = ServiceKeeper::new(Client::try_from(config).unwrap(), template());
        let mut rx = keeper.missing_ports();
        let port = (80, ir::Transport::Tcp);
        keeper.set_missing([(port, "refused at 10:00".to_string())].into());
        assert!(rx.has_changed().unwrap(), "a port went missing");
        rx.mark_unchanged();
        keeper.set_missing([(port, "refused at 10:01".to_string())].into());
        assert!(!rx.has_changed().unwrap(), "the same port, another text");
        assert_eq!(rx.borrow()[&port], "refused at 10:01", "the text is kept");
        keeper.set_missing(MissingPorts::new());
        assert!(rx.has_changed().unwrap(), "the port is on the Service");
    }

    fn listener(name: &str, port: u16, protocol: ir::ListenerProtocol) -> ir::Listener {
        ir::Listener {
            name: name.into(),
            address: "0.0.0.0".parse().unwrap(),
            port,
            protocol,
            hostname: None,
            rules: Vec::new(),
            virtual_hosts: Vec::new(),
            tls: None,
            tls_routes: Vec::new(),
            l4_route: None,
            filters: Vec::new(),
        }
    }

    fn config(listeners: Vec<ir::Listener>) -> ir::Config {
        ir::Config {
            gateways: vec![ir::Gateway {
                namespace: "default".into(),
                name: "gw".into(),
                listeners,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_udp_listener_gets_a_udp_port_beside_a_tcp_one_of_the_same_number() {
        let config = config(vec![
            listener("dns", 53, ir::ListenerProtocol::Udp),
            listener("dns-tcp", 53, ir::ListenerProtocol::Tcp),
            listener("https", 443, ir::ListenerProtocol::Https),
            listener("tls", 8443, ir::ListenerProtocol::Tls),
        ]);
        let svc = desired(&template(), &listener_ports(&config)).unwrap();
        let ports: Vec<(String, i32, String)> = svc
            .spec
            .unwrap()
            .ports
            .unwrap()
            .into_iter()
            .map(|p| (p.name.unwrap(), p.port, p.protocol.unwrap()))
            .collect();
        assert_eq!(
            ports,
            [
                ("tcp-53".to_string(), 53, "TCP".to_string()),
                ("udp-53".to_string(), 53, "UDP".to_string()),
                ("tcp-443".to_string(), 443, "TCP".to_string()),
                ("tcp-8443".to_string(), 8443, "TCP".to_string()),
            ]
        );
    }

    /// A replica that stops leading forgets the ports it failed to add and what it applied:
    /// an API server that refuses connections stands in for one that refused the apply.
    #[tokio::test]
    async fn a_replica_that_stops_leading_reports_no_ports_and_applies_afresh_when_it_leads() {
        let api = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let mut keeper = ServiceKeeper::new(Client::try_from(api).unwrap(), template());
        let rx = keeper.missing_ports();
        let config = config(vec![listener("http", 80, ir::ListenerProtocol::Http)]);

        assert!(!keeper.sync(&config).await, "the API server is not there");
        let port = (80, ir::Transport::Tcp);
        assert!(rx.borrow().contains_key(&port), "{:?}", *rx.borrow());
        keeper.stand_down();
        assert!(rx.borrow().is_empty(), "{:?}", *rx.borrow());

        // As if an apply of ours had succeeded: an unchanged port set costs no request ...
        let ports = listener_ports(&config);
        keeper.last = desired(&template(), &ports);
        keeper.applied = ports;
        assert!(keeper.sync(&config).await, "nothing to apply");
        // ... until this replica has stopped leading, when the Service may have changed.
        keeper.stand_down();
        assert!(!keeper.sync(&config).await, "applied afresh");
        assert!(rx.borrow().contains_key(&port));
    }
}
