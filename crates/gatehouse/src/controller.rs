//! Controller mode: the Kubernetes API as the source of the one reconcile loop, status written
//! back by the elected leader. Every replica serves traffic; only the leader writes.

use crate::run::{Running, Serve, serve};
use anyhow::Context as _;
use gatehouse_controlplane::Publisher;
use gatehouse_controlplane::kubernetes::ca_secret::{self, CaIssuer};
use gatehouse_controlplane::kubernetes::service::{ServiceKeeper, ServiceTemplate};
use gatehouse_controlplane::kubernetes::{
    KubeSource, KubeStatus, LeaderElection, LeaseOptions, Provisioning, StatusWriter, addresses,
};
use gatehouse_controlplane::provision::names::Names;
use gatehouse_controlplane::provision::{Provisioner, Settings};
use gatehouse_controlplane::remote::RemotePublisher;
use gatehouse_dataplane::Options as DataOptions;
use gatehouse_sync::{ConfigServer, ServerOptions};
use gatehouse_translate::{ObjectKey, Options as TranslateOptions};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

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
    /// Provisioned mode: a data plane per Gateway, fed over the sync stream; this process
    /// serves no traffic itself.
    pub provision: Option<ProvisionOptions>,
}

#[derive(Clone, Debug)]
pub struct ProvisionOptions {
    /// Namespace and name of the Secret holding the control plane's CA.
    pub ca_secret: ObjectKey,
    /// Where the sync server listens.
    pub sync_address: SocketAddr,
    /// Names (DNS) and addresses the sync server's certificate carries; data planes verify
    /// `settings.control_plane_server_name` against it.
    pub sync_dns_names: Vec<String>,
    pub sync_ips: Vec<IpAddr>,
    /// Image, control-plane endpoint and server name of every data plane.
    pub settings: Settings,
    /// Where data planes bind their listeners (all of the pod's addresses by default).
    pub dataplane_bind: IpAddr,
}

/// Data planes' bootstrap certificates are re-issued at two thirds of this; the certificate
/// a data plane gets on its stream is renewed there (gatehouse-sync's own validity).
const BOOTSTRAP_VALIDITY: Duration = Duration::from_secs(7 * 24 * 3600);
/// The sync server's certificate; it is issued again at every start and daily.
const SERVER_VALIDITY: Duration = Duration::from_secs(30 * 24 * 3600);

/// Starts the sync server and returns the publisher and provisioning of provisioned mode.
async fn start_provisioning(
    p: &ProvisionOptions,
    client: &kube::Client,
    leader_elected: bool,
    stop: CancellationToken,
) -> anyhow::Result<(Arc<RemotePublisher>, Provisioning)> {
    let ca = Arc::new(
        ca_secret::load_or_create(client, &p.ca_secret.namespace, &p.ca_secret.name).await?,
    );
    let server = ConfigServer::new(
        Arc::clone(&ca),
        ServerOptions {
            // With an election, only the leader accepts (KubeStatus switches it on).
            accepting: !leader_elected,
            ..ServerOptions::default()
        },
    );
    let listener = tokio::net::TcpListener::bind(p.sync_address)
        .await
        .with_context(|| format!("cannot bind the sync server on {}", p.sync_address))?;
    let credentials = ca.issue_server(&p.sync_dns_names, &p.sync_ips, SERVER_VALIDITY);
    tokio::spawn({
        let server = Arc::clone(&server);
        let stop = stop.clone();
        async move {
            if let Err(e) = server.serve(listener, credentials, stop).await {
                tracing::error!("config sync server: {e:#}");
            }
        }
    });
    tokio::spawn({
        let server = Arc::clone(&server);
        let ca = Arc::clone(&ca);
        let (names, ips) = (p.sync_dns_names.clone(), p.sync_ips.clone());
        async move {
            let mut every = tokio::time::interval(Duration::from_secs(24 * 3600));
            every.tick().await;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = every.tick() => server.set_server_credentials(ca.issue_server(&names, &ips, SERVER_VALIDITY)),
                }
            }
        }
    });
    let publisher = RemotePublisher::new(Arc::clone(&server), p.dataplane_bind);
    let issuer = Arc::new(CaIssuer {
        ca,
        validity: BOOTSTRAP_VALIDITY,
    });
    let provisioning = Provisioning {
        provisioner: Provisioner::new(client.clone(), p.settings.clone(), issuer),
        publisher: Arc::clone(&publisher),
        server,
    };
    Ok((publisher, provisioning))
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
    let resign = leader.as_ref().map(LeaderElection::resign_token);
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
    let service_ports = service.as_ref().map(ServiceKeeper::missing_ports);
    let also_stop = CancellationToken::new();
    let mut sink = KubeStatus::new(
        StatusWriter::new(
            client.clone(),
            opts.controller_name.clone(),
            source.echoes(),
        ),
        leader,
        service,
    );
    let mut publisher: Option<Arc<dyn Publisher>> = None;
    if let Some(p) = &opts.provision {
        let (remote, provisioning) =
            start_provisioning(p, &client, opts.lease.is_some(), also_stop.clone()).await?;
        sink = sink.provisioning(provisioning);
        publisher = Some(remote);
    }
    let options = TranslateOptions {
        controller_name: opts.controller_name.clone(),
        default_address: opts.default_address,
        provisioned: opts.provision.is_some(),
        ..TranslateOptions::default()
    };
    let adjust = if opts.provision.is_some() {
        addresses::provisioned_options(|gateway| Names::of(gateway).object)
    } else {
        addresses::adjust_options(opts.local_addresses, opts.publish_service.clone())
    };
    let serve_opts = Serve {
        admin_address: opts.admin_address,
        dataplane: opts.dataplane,
        drain_delay: opts.drain_delay,
        shutdown_grace: opts.shutdown_grace,
        publisher,
        service_ports,
    };
    let mut running = serve(serve_opts, source, options, |r| {
        r.adjust_options(adjust).status_sink(Box::new(sink))
    })
    .await?;
    running.also_stop = also_stop;
    if let Some(resign) = resign {
        running.on_drain = resign;
    }
    tracing::info!(admin = %running.admin_address, "gatehouse controller is serving");
    Ok(running)
}
