//! Controller mode: the Kubernetes API as the source of the one reconcile loop, status written
//! back by the elected leader. Every replica serves traffic; only the leader writes.

use crate::run::{Running, Serve, serve};
use anyhow::Context as _;
use gatehouse_controlplane::kubernetes::service::{ServiceKeeper, ServiceTemplate};
use gatehouse_controlplane::kubernetes::{
    KubeSource, KubeStatus, LeaderElection, LeaseOptions, StatusWriter, addresses,
};
use gatehouse_dataplane::Options as DataOptions;
use gatehouse_translate::{ObjectKey, Options as TranslateOptions};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct ControllerOptions {
    pub admin_address: SocketAddr,
    /// Where Gateways listen when `local_addresses` is off.
    pub default_address: IpAddr,
    /// Give each Gateway its own loopback address (127.x.y.z), so that many Gateways can all
    /// use the same ports on one machine.
    pub local_addresses: bool,
    pub drain_delay: Duration,
    pub shutdown_grace: Duration,
    pub dataplane: DataOptions,
    /// `None` disables leader election: this replica always writes status.
    pub lease: Option<LeaseOptions>,
    pub controller_name: String,
    /// The data plane's Service (namespace/name): its address is what Gateways report.
    pub publish_service: Option<ObjectKey>,
    /// Keep that Service: a manifest without ports (the controller adds one per listener
    /// port), and the Deployment that owns it (so deleting the Deployment deletes it).
    pub publish_service_template: Option<PublishServiceTemplate>,
}

#[derive(Clone, Debug)]
pub struct PublishServiceTemplate {
    pub template: k8s_openapi::api::core::v1::Service,
    /// Name of a Deployment in the Service's namespace.
    pub owner_deployment: Option<String>,
}

/// The owner reference to the Deployment `name` in `namespace`.
async fn deployment_owner(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<OwnerReference> {
    use k8s_openapi::api::apps::v1::Deployment;
    let d = kube::Api::<Deployment>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .with_context(|| {
            format!(
                "cannot read Deployment {namespace}/{name}, the owner of the data-plane Service"
            )
        })?;
    Ok(OwnerReference {
        api_version: "apps/v1".into(),
        kind: "Deployment".into(),
        name: name.into(),
        uid: d.metadata.uid.unwrap_or_default(),
        controller: Some(false),
        block_owner_deletion: None,
    })
}

pub async fn start(opts: ControllerOptions, client: kube::Client) -> anyhow::Result<Running> {
    let source = KubeSource::start(client.clone());
    let leader = opts
        .lease
        .clone()
        .map(|l| LeaderElection::start(client.clone(), l));
    let service = match (&opts.publish_service, &opts.publish_service_template) {
        (Some(key), Some(t)) => {
            let owner = match &t.owner_deployment {
                Some(name) => Some(deployment_owner(&client, &key.namespace, name).await?),
                None => None,
            };
            let template = ServiceTemplate {
                key: key.clone(),
                template: t.template.clone(),
                owner,
            };
            Some(ServiceKeeper::new(client.clone(), template))
        }
        _ => None,
    };
    let sink = KubeStatus::new(
        StatusWriter::new(client, opts.controller_name.clone()),
        leader,
        service,
    );
    let options = TranslateOptions {
        controller_name: opts.controller_name.clone(),
        default_address: opts.default_address,
        ..TranslateOptions::default()
    };
    let adjust = addresses::adjust_options(opts.local_addresses, opts.publish_service.clone());
    let serve_opts = Serve {
        admin_address: opts.admin_address,
        dataplane: opts.dataplane,
        drain_delay: opts.drain_delay,
        shutdown_grace: opts.shutdown_grace,
    };
    let running = serve(serve_opts, source, options, |r| {
        r.adjust_options(adjust).status_sink(Box::new(sink))
    })
    .await?;
    tracing::info!(admin = %running.admin_address, "gatehouse controller is serving");
    Ok(running)
}
