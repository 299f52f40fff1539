//! Controller mode: the Kubernetes API -> translate -> data plane, with status written back by
//! the elected leader. Every replica serves traffic; only the leader writes.

use crate::admin;
use crate::run::{Running, State, publish};
use crate::telemetry::ResultLabel;
use anyhow::Context as _;
use gatehouse_controlplane::kubernetes::{KubeSource, LeaderElection, LeaseOptions, StatusWriter};
use gatehouse_dataplane::Options as DataOptions;
use gatehouse_translate::{Input, ObjectKey, Options as TranslateOptions, translate};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

#[derive(Clone, Debug)]
pub struct ControllerOptions {
    pub admin_address: SocketAddr,
    /// Where Gateways listen when `local_addresses` is off.
    pub default_address: IpAddr,
    /// Give each Gateway its own loopback address (127.x.y.z), so that many Gateways can all
    /// use the same ports on one machine.
    pub local_addresses: bool,
    pub shutdown_grace: Duration,
    pub dataplane: DataOptions,
    /// `None` disables leader election: this replica always writes status.
    pub lease: Option<LeaseOptions>,
    pub controller_name: String,
    /// The data plane's Service (namespace/name): its address is what Gateways report.
    pub publish_service: Option<ObjectKey>,
}

/// Stable loopback addresses per Gateway: derived from its name, so they survive restarts,
/// and sticky while running, so a new Gateway never moves an existing one.
#[derive(Default)]
struct AddressBook {
    assigned: BTreeMap<ObjectKey, IpAddr>,
}

impl AddressBook {
    fn assign(&mut self, input: &Input) -> BTreeMap<ObjectKey, IpAddr> {
        let live: std::collections::BTreeSet<ObjectKey> = input
            .gateways
            .iter()
            .map(|g| ObjectKey::of(&g.metadata))
            .collect();
        self.assigned.retain(|k, _| live.contains(k));
        for key in live {
            if self.assigned.contains_key(&key) {
                continue;
            }
            // FNV-1a over namespace/name picks a slot in 127.1.0.1 .. 127.255.255.254.
            let mut h: u32 = 0x811c_9dc5;
            for b in key.to_string().bytes() {
                h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
            }
            const SLOTS: u32 = 255 * 256 * 254;
            let mut slot = h % SLOTS;
            loop {
                let (a, rest) = (1 + slot / (256 * 254), slot % (256 * 254));
                let ip = IpAddr::V4(Ipv4Addr::new(
                    127,
                    a as u8,
                    (rest / 254) as u8,
                    (1 + rest % 254) as u8,
                ));
                if !self.assigned.values().any(|v| *v == ip) {
                    self.assigned.insert(key.clone(), ip);
                    break;
                }
                slot = (slot + 1) % SLOTS;
            }
        }
        self.assigned.clone()
    }
}

pub async fn start(opts: ControllerOptions, client: kube::Client) -> anyhow::Result<Running> {
    let state = State::new(opts.dataplane.clone(), true);
    let admin_listener = tokio::net::TcpListener::bind(opts.admin_address)
        .await
        .with_context(|| format!("cannot bind the admin endpoint on {}", opts.admin_address))?;
    let admin_address = admin_listener.local_addr()?;
    let admin_task = tokio::spawn(admin::serve(admin_listener, Arc::clone(&state)));

    let mut source = KubeSource::start(client.clone());
    tokio::time::timeout(
        Duration::from_secs(60),
        source.ready(Duration::from_secs(5)),
    )
    .await
    .context("the Kubernetes API did not list the Gateway API objects within 60s")??;
    let leader = opts
        .lease
        .clone()
        .map(|l| LeaderElection::start(client.clone(), l));
    let mut ctx = Ctx {
        state: Arc::clone(&state),
        writer: StatusWriter::new(client, opts.controller_name.clone()),
        leader,
        addresses: AddressBook::default(),
        base: TranslateOptions {
            controller_name: opts.controller_name.clone(),
            default_address: opts.default_address,
            ..TranslateOptions::default()
        },
        local: opts.local_addresses,
        publish_service: opts.publish_service.clone(),
    };
    ctx.reconcile(&source).await;
    state.metrics.api_connected.set(1);
    if let Some(c) = &state.api_connected {
        c.store(true, Ordering::Release);
    }
    state.ready.store(true, Ordering::Release);
    tracing::info!(admin = %admin_address, "gatehouse controller is serving");

    let stop = CancellationToken::new();
    let task = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut leadership = ctx.leader.as_ref().map(LeaderElection::subscribe);
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                let mut work = true;
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = source.changed() => {}
                    Some(Ok(())) = async { match leadership.as_mut() { Some(l) => Some(l.changed().await), None => None } } => {}
                    _ = tick.tick() => work = false,
                }
                if let Some(c) = &ctx.state.api_connected {
                    c.store(source.connected(), Ordering::Release);
                    ctx.state
                        .metrics
                        .api_connected
                        .set(i64::from(source.connected()));
                }
                if work {
                    ctx.reconcile(&source).await;
                }
            }
            if let Some(l) = ctx.leader.take() {
                l.release().await;
            }
        })
    };
    Ok(Running {
        admin_address,
        state,
        stop,
        task,
        admin_task,
        grace: opts.shutdown_grace,
    })
}

struct Ctx {
    state: Arc<State>,
    writer: StatusWriter,
    leader: Option<LeaderElection>,
    addresses: AddressBook,
    base: TranslateOptions,
    local: bool,
    publish_service: Option<ObjectKey>,
}

/// The addresses clients reach the data plane at: the Service's load-balancer ingress if it has
/// one, else its cluster IPs. `None` until the Service exists (status then shows the bind
/// address).
fn published_addresses(input: &Input, service: &ObjectKey) -> Option<Vec<(String, String)>> {
    let svc = input
        .services
        .iter()
        .find(|s| ObjectKey::of(&s.metadata) == *service)?;
    let ingress: Vec<(String, String)> = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| match (&i.ip, &i.hostname) {
            (Some(ip), _) => Some(("IPAddress".to_string(), ip.clone())),
            (None, Some(h)) => Some(("Hostname".to_string(), h.clone())),
            _ => None,
        })
        .collect();
    if !ingress.is_empty() {
        return Some(ingress);
    }
    let spec = svc.spec.as_ref()?;
    let ips: Vec<(String, String)> = spec
        .cluster_ips
        .clone()
        .or_else(|| spec.cluster_ip.clone().map(|ip| vec![ip]))
        .into_iter()
        .flatten()
        .filter(|ip| ip != "None" && !ip.is_empty())
        .map(|ip| ("IPAddress".to_string(), ip))
        .collect();
    (!ips.is_empty()).then_some(ips)
}

impl Ctx {
    async fn reconcile(&mut self, source: &KubeSource) {
        let started = Instant::now();
        let input = source.snapshot();
        let mut options = self.base.clone();
        if self.local {
            options.gateway_addresses = self.addresses.assign(&input);
        }
        if let Some(key) = &self.publish_service {
            options.published_addresses = published_addresses(&input, key);
        }
        let (input, output) = tokio::task::spawn_blocking(move || {
            let output = translate(&input, &options);
            (input, output)
        })
        .await
        .expect("translate never panics");
        let status = publish(&self.state, &input, output, Vec::new(), started).await;
        if self.leader.as_ref().is_none_or(LeaderElection::is_leader) {
            let w = self.writer.write(&input, status).await;
            let m = &self.state.metrics.status_writes;
            m.get_or_create(&ResultLabel { result: "patched" })
                .inc_by(w.patched as u64);
            m.get_or_create(&ResultLabel { result: "conflict" })
                .inc_by(w.conflicts as u64);
            m.get_or_create(&ResultLabel { result: "failed" })
                .inc_by(w.failed as u64);
            if w.patched + w.conflicts + w.failed > 0 {
                tracing::debug!(
                    patched = w.patched,
                    conflicts = w.conflicts,
                    failed = w.failed,
                    "status written"
                );
            }
        }
    }
}
