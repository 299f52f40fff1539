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
use tokio_util::sync::CancellationToken;

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
                // A control plane that stops or hands over leadership ends streams on
                // purpose: expected in every rollout of the controller, so not a warning.
                let handover = is_handover(&error);
                if handover {
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

#[cfg(test)]
mod tests {
    use super::is_handover;

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
}
