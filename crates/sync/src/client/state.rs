//! What the client knows, for the data plane's readiness and admin endpoint, and what it
//! keeps across reconnects (the applied version, the rotated credentials).

use crate::credentials::Credentials;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::SystemTime;
use tokio::sync::watch;

#[derive(Debug)]
pub struct ClientState {
    connected: AtomicBool,
    inner: Mutex<Inner>,
    applied_once: watch::Sender<bool>,
}

#[derive(Debug, Default)]
struct Inner {
    applied_version: Option<String>,
    /// The diagnostics of the applied version, repeated in Acks of it.
    diagnostics: Vec<String>,
    last_error: Option<String>,
    /// The newest credentials received on a stream.
    credentials: Option<Credentials>,
}

impl Default for ClientState {
    fn default() -> Self {
        ClientState {
            connected: AtomicBool::new(false),
            inner: Mutex::new(Inner::default()),
            applied_once: watch::Sender::new(false),
        }
    }
}

impl ClientState {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a stream to the control plane is up.
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// The version of the snapshot serving now.
    pub fn applied_version(&self) -> Option<String> {
        self.lock().applied_version.clone()
    }

    /// Why the last stream or connection attempt ended; cleared when a stream comes up.
    pub fn last_error(&self) -> Option<String> {
        self.lock().last_error.clone()
    }

    /// Resolves once the first snapshot has been applied (at once if it has).
    pub async fn first_applied(&self) {
        let mut applied = self.applied_once.subscribe();
        // The sender lives in `self`, so waiting cannot fail.
        let _ = applied.wait_for(|applied| *applied).await;
    }

    /// notAfter of the newest client certificate received on a stream, `None` while the
    /// bootstrap credentials are all there is (an addition to the brief, for readiness and
    /// tests of rotation).
    pub fn certificate_not_after(&self) -> Option<SystemTime> {
        self.lock().credentials.as_ref().map(|c| c.not_after)
    }

    pub(crate) fn set_connected(&self, connected: bool) {
        self.connected.store(connected, Ordering::Relaxed);
        if connected {
            self.lock().last_error = None;
        }
    }

    pub(crate) fn set_last_error(&self, error: String) {
        self.lock().last_error = Some(error);
    }

    pub(crate) fn set_applied(&self, version: String, diagnostics: Vec<String>) {
        {
            let mut inner = self.lock();
            inner.applied_version = Some(version);
            inner.diagnostics = diagnostics;
        }
        self.applied_once.send_replace(true);
    }

    pub(crate) fn diagnostics(&self) -> Vec<String> {
        self.lock().diagnostics.clone()
    }

    pub(crate) fn credentials(&self) -> Option<Credentials> {
        self.lock().credentials.clone()
    }

    pub(crate) fn set_credentials(&self, credentials: Credentials) {
        self.lock().credentials = Some(credentials);
    }
}
