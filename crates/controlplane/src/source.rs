//! What the reconcile loop reads: a [`Source`] of Gateway API and core objects.
//!
//! Two implement it: [`WatchedFiles`] (a folder of YAML manifests, `gatehouse run`) and
//! [`KubeSource`](crate::kubernetes::KubeSource) (the API server, `gatehouse controller`).
//! The loop only ever sees snapshots, so both modes share one pipeline.

use crate::{FileSource, Watch};
use gatehouse_translate::Input;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

/// One consistent view of a source.
#[derive(Clone, Debug, Default)]
pub struct SourceSnapshot {
    /// Shared, not copied, with what the pass publishes ([`crate::Published::input`]): a
    /// copy is a pointer per object, and at 5000 objects copying (and later dropping) them
    /// touched 5000 reference counts on every pass.
    pub input: Arc<Input>,
    /// Problems in the source (`file:line: message`). What they concern keeps serving its last
    /// good content.
    pub errors: Vec<String>,
    /// Problems that lose nothing (an unknown field, a kind Gatehouse does not read).
    pub warnings: Vec<String>,
    /// Objects the snapshot needs but the source has not read yet (a newly referenced Secret
    /// whose watch has not listed); readiness waits for them.
    pub pending: Vec<String>,
}

pub trait Source: Send + 'static {
    /// Resolves once the source can give a snapshot that is not a half-read view (the
    /// Kubernetes source waits for its first lists).
    fn ready(&mut self) -> impl Future<Output = anyhow::Result<()>> + Send {
        async { Ok(()) }
    }

    /// Waits for the next change; returns at once if one is pending. Bursts coalesce into one
    /// notification. Cancel-safe.
    fn changed(&mut self) -> impl Future<Output = ()> + Send;

    /// The current objects. May block (file I/O): the loop calls it off the runtime's workers.
    fn snapshot(&mut self) -> SourceSnapshot;

    /// Whether the source reaches what it mirrors (`None`: nothing remote to reach). While it
    /// does not, the last snapshot keeps serving.
    fn connected(&self) -> Option<bool> {
        None
    }
}

/// A [`FileSource`] and its file-system watch: `gatehouse run -f`.
pub struct WatchedFiles {
    files: FileSource,
    watch: Watch,
    /// The errors of the previous snapshot: a problem is logged when it appears, not on every
    /// reload while it lasts.
    previous_errors: Vec<String>,
}

impl WatchedFiles {
    /// Starts watching before the first load, so no change is missed.
    pub fn new(path: impl Into<PathBuf>) -> anyhow::Result<WatchedFiles> {
        let files = FileSource::new(path).without_locations();
        let watch = files.watch()?;
        Ok(WatchedFiles {
            files,
            watch,
            previous_errors: Vec::new(),
        })
    }
}

impl Source for WatchedFiles {
    async fn changed(&mut self) {
        self.watch.changed().await;
    }

    fn snapshot(&mut self) -> SourceSnapshot {
        let changes = self.watch.take_changes();
        let loaded = self.files.load_changed(&changes);
        let errors: Vec<String> = loaded.errors.iter().map(ToString::to_string).collect();
        for (e, text) in loaded.errors.iter().zip(&errors) {
            if self.previous_errors.contains(text) {
                continue;
            }
            if loaded.stale_files.contains(&e.file) {
                tracing::error!("{e} (the last good version of this file keeps serving)");
            } else {
                tracing::error!("{e} (this file has never loaded; its objects are not served)");
            }
        }
        if errors.is_empty() && !self.previous_errors.is_empty() {
            tracing::info!("all configuration errors are fixed");
        }
        self.previous_errors.clone_from(&errors);
        SourceSnapshot {
            input: Arc::new(loaded.input),
            errors,
            warnings: loaded.warnings.iter().map(ToString::to_string).collect(),
            pending: Vec::new(),
        }
    }
}
