//! Leader election on a coordination.k8s.io Lease, so that only one replica writes status.
//!
//! Written by hand: the kube-rs ecosystem's lease crates do not yet follow kube 4. The
//! protocol is the usual one: the holder renews every `renew_every`; anyone may take a Lease
//! whose renewTime is older than its leaseDuration; every write carries the resourceVersion
//! read, so two candidates can never both win.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, PostParams};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[derive(Clone, Debug)]
pub struct LeaseOptions {
    pub namespace: String,
    pub name: String,
    /// Unique per replica (pod name).
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_every: Duration,
}

pub struct LeaderElection {
    leader: watch::Receiver<bool>,
    task: JoinHandle<()>,
    api: Api<Lease>,
    options: LeaseOptions,
}

impl LeaderElection {
    pub fn start(client: Client, options: LeaseOptions) -> LeaderElection {
        let api: Api<Lease> = Api::namespaced(client, &options.namespace);
        let (tx, rx) = watch::channel(false);
        let tx = Arc::new(tx);
        let task = tokio::spawn(run(api.clone(), options.clone(), tx));
        LeaderElection {
            leader: rx,
            task,
            api,
            options,
        }
    }

    pub fn is_leader(&self) -> bool {
        *self.leader.borrow()
    }

    /// Changes of leadership, for whoever must act when it is gained.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.leader.clone()
    }

    /// Stop campaigning and, if leading, hand the Lease back so another replica takes over at
    /// once instead of after the lease duration.
    pub async fn release(self) {
        self.task.abort();
        if !*self.leader.borrow() {
            return;
        }
        let Ok(Some(mut lease)) = self.api.get_opt(&self.options.name).await else {
            return;
        };
        let Some(spec) = lease.spec.as_mut() else {
            return;
        };
        if spec.holder_identity.as_deref() == Some(&self.options.identity) {
            spec.holder_identity = None;
            spec.renew_time = None;
            let _ = self
                .api
                .replace(&self.options.name, &PostParams::default(), &lease)
                .await;
            tracing::info!("released leadership");
        }
    }
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

async fn run(api: Api<Lease>, o: LeaseOptions, tx: Arc<watch::Sender<bool>>) {
    let mut last_renewed: Option<Instant> = None;
    let mut failing = false;
    loop {
        let held = match try_acquire_or_renew(&api, &o).await {
            Ok(held) => {
                failing = false;
                if held {
                    last_renewed = Some(Instant::now());
                }
                held
            }
            Err(e) => {
                // Say it once per run of failures: a replica that can never lead (say, for
                // lack of RBAC on leases) must not be silent about it.
                if !failing {
                    tracing::warn!(
                        "cannot acquire or renew lease {}/{}: {e}",
                        o.namespace,
                        o.name
                    );
                }
                failing = true;
                // Keep leading only while the last renewal is still comfortably valid.
                last_renewed.is_some_and(|t| t.elapsed() < o.lease_duration * 2 / 3)
            }
        };
        if !held {
            last_renewed = None;
        }
        if *tx.borrow() != held {
            tracing::info!(identity = %o.identity, "leadership {}", if held { "acquired" } else { "lost" });
            tx.send_replace(held);
        }
        tokio::time::sleep(o.renew_every).await;
    }
}

/// One round: true if this replica holds the Lease afterwards.
async fn try_acquire_or_renew(api: &Api<Lease>, o: &LeaseOptions) -> Result<bool, kube::Error> {
    let duration_secs = i32::try_from(o.lease_duration.as_secs()).unwrap_or(15);
    let Some(mut lease) = api.get_opt(&o.name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(o.name.clone()),
                namespace: Some(o.namespace.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(o.identity.clone()),
                lease_duration_seconds: Some(duration_secs),
                acquire_time: Some(now()),
                renew_time: Some(now()),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.get_or_insert_with(Default::default);
    let mine = spec.holder_identity.as_deref() == Some(&o.identity);
    let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
        (Some(renewed), Some(secs)) => {
            renewed.0 + SignedDuration::from_secs(i64::from(secs)) < Timestamp::now()
        }
        _ => true,
    };
    let vacant = spec.holder_identity.as_deref().is_none_or(str::is_empty);
    if !mine && !expired && !vacant {
        return Ok(false);
    }
    if !mine {
        spec.holder_identity = Some(o.identity.clone());
        spec.acquire_time = Some(now());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.renew_time = Some(now());
    spec.lease_duration_seconds = Some(duration_secs);
    // replace carries metadata.resourceVersion: a concurrent writer makes this a 409.
    match api.replace(&o.name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}
