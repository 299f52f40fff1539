//! Leader election on a coordination.k8s.io Lease, so that only one replica writes status.
//!
//! Written by hand: the kube-rs ecosystem's lease crates do not yet follow kube 4. The
//! protocol is client-go's: the holder renews every `renew_every`; a candidate takes a Lease
//! only when it has seen the Lease's record stay unchanged for a whole leaseDuration *by its
//! own clock* (or when the Lease is vacant); every write carries the resourceVersion read, so
//! two candidates can never both win.
//!
//! A replica that is shutting down resigns ([`LeaderElection::resign_token`]): it stops
//! campaigning and hands the Lease back at once, so a standby takes over within one renewal
//! period instead of after the holder's drain delay.
//!
//! Expiry is never judged from the renewTime in the Lease: that time was written by another
//! node's clock, and with clocks apart by more than the lease duration a candidate would take
//! a Lease that is being renewed, and two replicas would lead at once. Local observation
//! only needs every node's clock to run at the same rate.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, PostParams};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long [`LeaderElection::release`] waits for the campaign to hand the Lease back.
const RELEASE_WAIT: Duration = Duration::from_secs(5);

#[derive(Clone, Debug)]
pub struct LeaseOptions {
    pub namespace: String,
    pub name: String,
    /// Unique per replica (pod name).
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_every: Duration,
    /// How far this replica's wall clock is off, in seconds (0 in production). Tests set it to
    /// show that the times written into the Lease play no part in deciding expiry.
    pub clock_skew_secs: i64,
}

pub struct LeaderElection {
    leader: watch::Receiver<bool>,
    task: JoinHandle<()>,
    resign: CancellationToken,
}

impl LeaderElection {
    pub fn start(client: Client, options: LeaseOptions) -> LeaderElection {
        let api: Api<Lease> = Api::namespaced(client, &options.namespace);
        let (tx, rx) = watch::channel(false);
        let tx = Arc::new(tx);
        let resign = CancellationToken::new();
        let task = tokio::spawn(run(api, options, tx, resign.clone()));
        LeaderElection {
            leader: rx,
            task,
            resign,
        }
    }

    /// Cancelling it ends the campaign: the Lease is handed back if held, and leadership is
    /// reported lost. Shutdown cancels it when the drain begins.
    pub fn resign_token(&self) -> CancellationToken {
        self.resign.clone()
    }

    pub fn is_leader(&self) -> bool {
        *self.leader.borrow()
    }

    /// Changes of leadership, for whoever must act when it is gained.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.leader.clone()
    }

    /// Stop campaigning and, if leading, hand the Lease back so another replica takes over at
    /// once instead of after the lease duration. The campaign itself hands it back, so that
    /// no renewal of its own can land after the release.
    pub async fn release(self) {
        self.resign.cancel();
        let abort = self.task.abort_handle();
        if tokio::time::timeout(RELEASE_WAIT, self.task).await.is_err() {
            abort.abort();
        }
    }
}

/// This replica's wall clock, for the times it writes into the Lease (informational only).
fn now(o: &LeaseOptions) -> MicroTime {
    MicroTime(Timestamp::now() + SignedDuration::from_secs(o.clock_skew_secs))
}

/// The Lease record as last seen, and when (by this replica's monotonic clock).
struct Observed {
    record: Option<LeaseSpec>,
    at: Instant,
}

async fn run(
    api: Api<Lease>,
    o: LeaseOptions,
    tx: Arc<watch::Sender<bool>>,
    resign: CancellationToken,
) {
    let mut last_renewed: Option<Instant> = None;
    let mut failing = false;
    let mut observed: Option<Observed> = None;
    loop {
        let held = match try_acquire_or_renew(&api, &o, &mut observed).await {
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
        if *tx.borrow() != held && !resign.is_cancelled() {
            tracing::info!(identity = %o.identity, "leadership {}", if held { "acquired" } else { "lost" });
            tx.send_replace(held);
        }
        tokio::select! {
            biased;
            () = resign.cancelled() => {
                // Standbys see the Lease vacant at their next look.
                if tx.send_replace(false) {
                    tracing::info!(identity = %o.identity, "leadership resigned: shutting down");
                }
                if held {
                    hand_back(&api, &o).await;
                }
                return;
            }
            () = tokio::time::sleep(o.renew_every) => {}
        }
    }
}

/// Clears the holder of a Lease this replica holds.
async fn hand_back(api: &Api<Lease>, o: &LeaseOptions) {
    let Ok(Some(mut lease)) = api.get_opt(&o.name).await else {
        return;
    };
    let Some(spec) = lease.spec.as_mut() else {
        return;
    };
    if spec.holder_identity.as_deref() != Some(&o.identity) {
        return;
    }
    spec.holder_identity = None;
    spec.renew_time = None;
    match api.replace(&o.name, &PostParams::default(), &lease).await {
        Ok(_) => tracing::info!(identity = %o.identity, "leadership handed back"),
        Err(e) => tracing::warn!(
            "could not hand back lease {}/{} (a standby takes it when it expires): {e}",
            o.namespace,
            o.name
        ),
    }
}

/// One round: true if this replica holds the Lease afterwards.
async fn try_acquire_or_renew(
    api: &Api<Lease>,
    o: &LeaseOptions,
    observed: &mut Option<Observed>,
) -> Result<bool, kube::Error> {
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
                acquire_time: Some(now(o)),
                renew_time: Some(now(o)),
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
    // A record that changed since we last looked was renewed: start timing it afresh.
    let unchanged_for = match observed.as_ref() {
        Some(seen) if seen.record.as_ref() == Some(&*spec) => seen.at.elapsed(),
        _ => {
            *observed = Some(Observed {
                record: Some(spec.clone()),
                at: Instant::now(),
            });
            Duration::ZERO
        }
    };
    let duration = spec
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map_or(o.lease_duration, Duration::from_secs);
    let expired = unchanged_for > duration;
    let vacant = spec.holder_identity.as_deref().is_none_or(str::is_empty);
    if !mine && !expired && !vacant {
        return Ok(false);
    }
    if !mine {
        spec.holder_identity = Some(o.identity.clone());
        spec.acquire_time = Some(now(o));
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.renew_time = Some(now(o));
    spec.lease_duration_seconds = Some(duration_secs);
    // replace carries metadata.resourceVersion: a concurrent writer makes this a 409.
    match api.replace(&o.name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}
