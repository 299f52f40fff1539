//! File-system notifications for a [`crate::FileSource`] path.
//!
//! Usage (the binary):
//! ```no_run
//! # async fn run() -> anyhow::Result<()> {
//! let mut source = gatehouse_controlplane::FileSource::new("examples/cafe");
//! let mut watch = source.watch()?; // before the first load: no change is missed
//! loop {
//!     let loaded = source.load();
//!     // ... translate and publish loaded.input, print loaded.errors ...
//!     watch.changed().await;
//! }
//! # }
//! ```
//!
//! The watch also remembers which files changed ([`Watch::take_changes`]), so a folder of
//! thousands of manifests is not re-read for an edit of one ([`crate::FileSource::load_changed`]).
//!
//! Bursts are coalesced without a timer: the channel holds at most one pending
//! notification, so however many events arrive while the consumer is busy, it reloads once
//! more afterwards. An editor's save (truncate, write, close; or write a temp file and
//! rename it) may be seen half-way: that load reports an error and keeps the last good
//! content, and the next notification of the same burst loads the finished file.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use notify::event::{AccessKind, AccessMode, MetadataKind, ModifyKind};
use notify::{EventKind, RecursiveMode, Watcher as _};
use tokio::sync::mpsc;

use crate::file::{is_ignored_name, is_manifest_name};

/// A running file-system watch. Dropping it stops the watch.
#[derive(Debug)]
pub struct Watch {
    watcher: notify::RecommendedWatcher,
    rx: mpsc::Receiver<()>,
    pending: Arc<Mutex<Pending>>,
}

/// What changed since the last [`Watch::take_changes`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Changes {
    /// Anything may have changed: walk and re-read everything. A directory event, a single
    /// watched file, a missed event (the kernel queue overflowed) or a watch error.
    All,
    /// Only these manifest files were written, created, renamed or removed.
    Files(BTreeSet<PathBuf>),
}

/// Changes collected by the watcher's thread until the loop takes them. Starts at "all": the
/// first load walks the folder anyway.
#[derive(Debug)]
struct Pending {
    all: bool,
    files: BTreeSet<PathBuf>,
}

impl Pending {
    /// Past this many files a walk is as cheap as the list, and the list stops growing.
    const MAX_FILES: usize = 4096;

    fn add(&mut self, change: Change) {
        match change {
            Change::None => {}
            Change::All => {
                self.all = true;
                self.files.clear();
            }
            Change::Files(paths) if !self.all => {
                self.files.extend(paths);
                if self.files.len() > Self::MAX_FILES {
                    self.all = true;
                    self.files.clear();
                }
            }
            Change::Files(_) => {}
        }
    }
}

/// How one event changes what the source must re-read.
enum Change {
    None,
    All,
    Files(Vec<PathBuf>),
}

impl Watch {
    /// Waits until something changed since the previous call (returns at once if a change
    /// is already pending). Cancel-safe, so it can sit in a `tokio::select!`.
    pub async fn changed(&mut self) {
        if self.rx.recv().await.is_none() {
            // Cannot happen while `self.watcher` holds the sender; never report a change.
            std::future::pending::<()>().await;
        }
    }

    /// True (and consumed) if a change is pending.
    pub fn try_changed(&mut self) -> bool {
        self.rx.try_recv().is_ok()
    }

    /// What changed since the previous call (the first call says [`Changes::All`]). Call it
    /// after [`Watch::changed`] and before reading: an event that arrives while reading is
    /// then both in the next take and behind the next notification.
    pub fn take_changes(&mut self) -> Changes {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let files = std::mem::take(&mut pending.files);
        if std::mem::replace(&mut pending.all, false) {
            Changes::All
        } else {
            Changes::Files(files)
        }
    }

    /// The watcher (keep it alive) and the notification channel.
    pub fn into_parts(self) -> (notify::RecommendedWatcher, mpsc::Receiver<()>) {
        (self.watcher, self.rx)
    }
}

#[derive(Debug)]
enum Target {
    /// A directory, watched recursively.
    Dir(PathBuf),
    /// A single file, by name in its parent directory (watched non-recursively, so that
    /// editors that replace the file by a rename are still seen).
    File(OsString),
}

/// Watches `path` (a file or a directory, as given to [`crate::FileSource::new`]) and
/// returns a [`Watch`] that reports changes to the files the source reads.
///
/// Ignored: reads (our own loads open the files), access-time changes, and files a
/// directory walk skips (hidden files, editor temp files, non-YAML files). Kubernetes
/// ConfigMap volumes are handled: their atomic `..data` symlink swap counts as a change.
pub fn watch(path: &Path) -> anyhow::Result<Watch> {
    let meta =
        std::fs::metadata(path).with_context(|| format!("cannot watch {}", path.display()))?;
    let (watched, mode, target) = if meta.is_dir() {
        (
            path.to_owned(),
            RecursiveMode::Recursive,
            Target::Dir(path.to_owned()),
        )
    } else {
        let name = path
            .file_name()
            .with_context(|| format!("cannot watch {}: no file name", path.display()))?
            .to_owned();
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
            _ => PathBuf::from("."),
        };
        (parent, RecursiveMode::NonRecursive, Target::File(name))
    };

    let (tx, rx) = mpsc::channel(1);
    let pending = Arc::new(Mutex::new(Pending {
        all: true,
        files: BTreeSet::new(),
    }));
    let collected = pending.clone();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let change = match &event {
            Ok(event) => classify(&target, event),
            Err(e) => {
                tracing::warn!("file watch: {e}");
                Change::All
            }
        };
        if matches!(change, Change::None) {
            return;
        }
        collected
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add(change);
        // Full means a reload is already pending: it will see this change too.
        let _ = tx.try_send(());
    })
    .context("cannot start the file watcher")?;
    watcher
        .watch(&watched, mode)
        .with_context(|| format!("cannot watch {}", watched.display()))?;
    Ok(Watch {
        watcher,
        rx,
        pending,
    })
}

#[cfg(test)]
fn is_relevant(target: &Target, event: &notify::Event) -> bool {
    !matches!(classify(target, event), Change::None)
}

/// Irrelevant events (reads, files a walk skips) change nothing; events on manifest files of
/// a directory name those files; anything else (the watched file itself, a directory, a
/// ConfigMap volume swap, a missed event) means everything.
fn classify(target: &Target, event: &notify::Event) -> Change {
    match event.kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => {}
        EventKind::Access(_) => return Change::None,
        EventKind::Modify(ModifyKind::Metadata(MetadataKind::AccessTime)) => return Change::None,
        _ => {}
    }
    if event.need_rescan() || event.paths.is_empty() {
        return Change::All;
    }
    match target {
        Target::File(name) => {
            if event
                .paths
                .iter()
                .any(|p| p.file_name() == Some(name.as_os_str()))
            {
                Change::All
            } else {
                Change::None
            }
        }
        Target::Dir(root) => {
            let relevant: Vec<PathBuf> = event
                .paths
                .iter()
                .filter(|p| is_relevant_in_dir(root, p))
                .cloned()
                .collect();
            if relevant.is_empty() {
                Change::None
            } else if relevant.iter().all(|p| is_manifest_path(p)) {
                Change::Files(relevant)
            } else {
                Change::All
            }
        }
    }
}

/// A path whose name a walk reads as a manifest (the caller checked it is relevant).
fn is_manifest_path(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| is_manifest_name(&n.to_string_lossy()))
}

fn is_relevant_in_dir(root: &Path, path: &Path) -> bool {
    let rel = path.strip_prefix(root).unwrap_or(path);
    let mut names = rel.components().filter_map(|c| match c {
        Component::Normal(n) => Some(n.to_string_lossy()),
        _ => None,
    });
    let Some(last) = names.next_back() else {
        return true; // the root itself
    };
    if last == "..data" {
        return true; // ConfigMap volume update
    }
    if names.any(|n| is_ignored_name(&n)) || is_ignored_name(&last) {
        return false;
    }
    // A YAML file, or something without an extension: a directory created or removed.
    is_manifest_name(&last) || Path::new(last.as_ref()).extension().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_relevance() {
        let root = Path::new("/cfg");
        let yes = [
            "/cfg/a.yaml",
            "/cfg/sub/b.yml",
            "/cfg/sub",
            "/cfg",
            "/cfg/..data",
        ];
        let no = [
            "/cfg/.a.yaml.swp",
            "/cfg/.#a.yaml",
            "/cfg/a.yaml~",
            "/cfg/notes.txt",
            "/cfg/.git/config",
            "/cfg/.hidden/a.yaml",
            "/cfg/4913",
        ];
        for p in yes {
            assert!(is_relevant_in_dir(root, Path::new(p)), "{p}");
        }
        // vim's `4913` probe file has no extension: it counts (harmless extra reload).
        for p in &no[..6] {
            assert!(!is_relevant_in_dir(root, Path::new(p)), "{p}");
        }
    }

    #[test]
    fn reads_are_not_changes() {
        let target = Target::Dir(PathBuf::from("/cfg"));
        let read = notify::Event::new(EventKind::Access(AccessKind::Open(AccessMode::Any)))
            .add_path(PathBuf::from("/cfg/a.yaml"));
        assert!(!is_relevant(&target, &read));
        let closed = notify::Event::new(EventKind::Access(AccessKind::Close(AccessMode::Write)))
            .add_path(PathBuf::from("/cfg/a.yaml"));
        assert!(is_relevant(&target, &closed));
    }
}
