//! Controller mode: the Kubernetes API as the source of the one reconcile loop, status written
//! back by the elected leader. Every replica serves traffic; only the leader writes.

use crate::run::{Running, Serve, serve};
use gatehouse_controlplane::kubernetes::{
    KubeSource, KubeStatus, LeaderElection, LeaseOptions, StatusWriter, addresses,
};
use gatehouse_dataplane::Options as DataOptions;
use gatehouse_translate::{ObjectKey, Options as TranslateOptions};
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
}

pub async fn start(opts: ControllerOptions, client: kube::Client) -> anyhow::Result<Running> {
    let source = KubeSource::start(client.clone());
    let leader = opts
        .lease
        .clone()
        .map(|l| LeaderElection::start(client.clone(), l));
    let sink = KubeStatus::new(
        StatusWriter::new(client, opts.controller_name.clone()),
        leader,
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
