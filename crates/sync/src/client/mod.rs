//! The data plane's end: connects to the control plane with its client certificate, applies
//! the snapshots of its Gateway, reports back, and keeps going (with the last configuration
//! serving) through disconnects and control-plane restarts.

mod backoff;
mod connect;
mod session;
mod state;

use crate::wire::UnboundListener;
use backoff::Backoff;
use gatehouse_ir as ir;
use session::Outcome;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How long a data plane that has never had a stream treats failing to reach the control
/// plane as part of starting: a freshly provisioned pod can start before any controller
/// replica is Ready, and the Service refuses it until one is.
const STARTUP_GRACE: Duration = Duration::from_secs(30);

pub use futures_util::future::BoxFuture;
pub use state::ClientState;

#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// `https://host:port` of the control plane's config sync service.
    pub endpoint: String,
    /// The name the control plane's certificate must carry.
    pub server_name: String,
    /// `tls.crt`, `tls.key` and `ca.crt`: the bootstrap credentials, mounted from a Secret.
    pub credentials_dir: PathBuf,
    /// This pod's name: the control plane reports replicas by it.
    pub pod: String,
    /// This build's version, for the control plane's reports.
    pub build: String,
    /// Ask for snapshots compressed once by the control plane (`Snapshot.config_gzip`). Data
    /// planes always do; `false` asks as builds before it did (the JSON, compressed by gRPC
    /// on each stream), which the tests of mixed versions use.
    pub gzip_snapshots: bool,
}

/// What serves the configuration: the data plane.
pub trait Applier: Send + Sync + 'static {
    /// Serve `config` from now on: Ok(diagnostics) or Err(why it was rejected; the previous
    /// one keeps serving).
    fn apply(&self, config: Arc<ir::Config>) -> BoxFuture<'_, Result<Vec<String>, String>>;
    /// Listeners whose address is not bound right now.
    fn unbound(&self) -> Vec<UnboundListener>;
    /// Resolves when `unbound()` may have changed.
    fn changed(&self) -> BoxFuture<'_, ()>;
}

/// Connects, follows the stream, applies snapshots, acks/nacks, reports serving changes,
/// keeps rotated credentials (in memory, and written back to `credentials_dir` when it is
/// writable) for reconnects, and reconnects with backoff (250 ms doubling to 10 s, jittered;
/// at most 1 s after a leader handover) until `stop`. The data plane keeps serving its last
/// configuration while disconnected.
pub async fn run(
    options: ClientOptions,
    applier: Arc<dyn Applier>,
    state: Arc<ClientState>,
    stop: CancellationToken,
) {
    let mut backoff = Backoff::default();
    let started = Instant::now();
    let mut ever_established = false;
    while !stop.is_cancelled() {
        let outcome = session::run(&options, applier.as_ref(), &state, &stop).await;
        state.set_connected(false);
        let handover = match outcome {
            Outcome::Stopped => break,
            Outcome::Ended { established, error } => {
                // A stream that was up says the control plane is reachable: start over from
                // the shortest delay.
                if established {
                    backoff.reset();
                }
                ever_established |= established;
                let handover = is_handover(&error);
                if expected(handover, ever_established, started.elapsed()) {
                    tracing::info!(endpoint = %options.endpoint, %error, "config sync stream ended; reconnecting");
                } else {
                    tracing::warn!(endpoint = %options.endpoint, %error, "config sync stream ended");
                }
                state.set_last_error(error);
                handover
            }
        };
        let delay = if handover {
            backoff.next_handover_delay()
        } else {
            backoff.next_delay()
        };
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(delay) => {}
        }
    }
    tracing::info!("config sync client stopped");
}

/// Whether a stream ended because its control-plane replica stopped or is not the leader
/// (the statuses `server` sends then), rather than because something failed.
fn is_handover(error: &str) -> bool {
    error.contains(crate::server::NOT_LEADER) || error.contains(crate::server::STOPPING)
}

/// Whether an ended stream is part of normal operation, logged without a warning: a
/// control plane that stops or hands over leadership ends streams on purpose (every rollout
/// of the controller), and a data plane that has never had a stream may be starting before
/// the control plane can take it. Past [`STARTUP_GRACE`] without a first stream, or once a
/// stream has been up, any other failure is a warning.
fn expected(handover: bool, ever_established: bool, since_start: Duration) -> bool {
    handover || (!ever_established && since_start < STARTUP_GRACE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_handover_or_stop_is_not_a_failure() {
        // As the data planes logged them when the controller rolled.
        assert!(is_handover("Unavailable: not the leader"));
        assert!(is_handover("Unavailable: control plane stopping"));
        assert!(!is_handover(
            "transport error: tcp connect error: Connection refused"
        ));
        assert!(!is_handover(
            "Unauthenticated: certificate names no Gateway"
        ));
    }

    #[test]
    fn a_control_plane_not_there_yet_is_expected_only_while_starting() {
        let refused = "connecting to https://gatehouse.gatehouse-system.svc:18000: transport \
                       error: tcp connect error: Connection refused (os error 111)";
        let second = Duration::from_secs(1);
        let refused = is_handover(refused);
        assert!(expected(refused, false, second));
        assert!(!expected(refused, false, STARTUP_GRACE));
        // Once it has had a stream, losing the control plane is news.
        assert!(!expected(refused, true, second));
        // A handover is expected whenever it happens.
        let handover = is_handover("Unavailable: not the leader");
        assert!(expected(handover, true, STARTUP_GRACE * 10));
    }
}
