//! The file source: Kubernetes-style YAML manifests from a file or a directory tree.
//!
//! [`FileSource::load`] re-reads every file and returns one [`Input`] snapshot plus the
//! errors, each naming a file and a line. A file with any error contributes the objects of
//! its last successful load instead of its new content ("last good"), so a broken edit
//! loses nothing and fixing the file applies it. A deleted file contributes nothing.
//! [`FileSource::load_changed`] re-reads only the files a watch saw change.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, LazyLock};

use gatehouse_translate::Input;
use gatehouse_translate::kinds::{Kind, KindVisitor, for_each_kind};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_yaml::Value;

use crate::Changes;
use crate::locate::{self, Document, Seg, key};

mod served;

/// A problem in one file, at one line when it is known.
///
/// Displays as `path:line: message` (or `path: message` without a line), the format editors
/// and terminals turn into links.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadError {
    pub file: PathBuf,
    /// 1-based line in the file.
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{}: {}", self.file.display(), line, self.message),
            None => write!(f, "{}: {}", self.file.display(), self.message),
        }
    }
}

impl std::error::Error for LoadError {}

/// The result of one [`FileSource::load`].
#[derive(Clone, Debug, Default)]
pub struct Loaded {
    /// Every object to serve: new content of the good files, last-good content of the others.
    pub input: Input,
    /// Errors; a file listed here is served from its last good load (see `stale_files`).
    pub errors: Vec<LoadError>,
    /// Non-fatal findings (unknown fields, ignored namespaces). Already logged with
    /// `tracing::warn!` when the file was parsed; returned on every load for callers that
    /// want to show them (a CLI check, tests).
    pub warnings: Vec<LoadError>,
    /// Files with errors whose previous good content is served instead of the new one.
    pub stale_files: Vec<PathBuf>,
    /// Where each served object is defined: (kind, namespace/name) -> (file, line of its
    /// name). Cluster-scoped objects have the namespace `default` (as [`ObjectKey::of`] gives).
    pub locations: BTreeMap<(String, gatehouse_translate::ObjectKey), (PathBuf, usize)>,
}

impl Loaded {
    /// True if every file loaded without error.
    pub fn is_ok(&self) -> bool {
        self.errors.is_empty()
    }
}

/// Reads Gateway API and core objects from a YAML file or a directory of YAML files.
///
/// A directory is read recursively: every `*.yaml` / `*.yml` file, in sorted path order;
/// hidden files and directories (`.x`, which includes `.#x` and `.x.swp`), backups (`x~`)
/// and Emacs autosaves (`#x#`) are skipped. A single file given explicitly is read
/// whatever its extension.
#[derive(Debug)]
pub struct FileSource {
    path: PathBuf,
    files: BTreeMap<PathBuf, FileState>,
    /// True once a directory walk succeeded: [`FileSource::load_changed`] may then re-read only
    /// the files a watch names.
    walked: bool,
    /// Problems of the last walk (an unreadable subdirectory), reported on every load.
    walk_errors: Vec<LoadError>,
    /// Fill [`Loaded::locations`]: a check needs them; the reconcile loop, which assembles a
    /// snapshot for every change, does not (it cost an owned key, a path and a map insert per
    /// object per change).
    locations: bool,
    /// The last snapshot, while every file loads cleanly: a change of some files updates it
    /// instead of assembling every file's objects again (see `served`).
    served: Option<served::Served>,
    /// How many snapshots the kept one gave (tests check that it does).
    updated: u64,
}

#[derive(Debug)]
struct FileState {
    /// The digest of the text `parsed` was computed from; `None` until the first read. The
    /// text itself is not kept: it is only compared, and at 5000 routes it was 1.3 MB held for
    /// that alone. SHA-256, not a fast hash: two texts that differ must not pass for one
    /// another by a collision that a fast hash makes a matter of luck.
    digest: Option<TextDigest>,
    parsed: Parsed,
    /// Why the file could not be read (not UTF-8, permissions), if it could not.
    read_error: Option<String>,
    last_good: Option<Arc<Vec<Located>>>,
}

/// What a file's text is compared by: its length and SHA-256.
#[derive(Debug, PartialEq, Eq)]
struct TextDigest {
    len: usize,
    sha256: [u8; 32],
}

impl TextDigest {
    fn of(text: &str) -> Self {
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, text.as_bytes());
        let mut sha256 = [0; 32];
        sha256.copy_from_slice(digest.as_ref());
        TextDigest {
            len: text.len(),
            sha256,
        }
    }
}

#[derive(Debug, Default)]
struct Parsed {
    objects: Arc<Vec<Located>>,
    errors: Vec<LoadError>,
    warnings: Vec<LoadError>,
}

#[derive(Clone, Debug)]
struct Located {
    object: Arc<dyn Object>,
    /// File line of `metadata.name` (or of the start of the object).
    line: usize,
}

/// An object of any registered kind, as a file holds it.
trait Object: std::fmt::Debug + Send + Sync {
    fn kind(&self) -> String;
    fn meta(&self) -> &ObjectMeta;
    /// Adds the object to a snapshot, shared with the cache (no copy of it).
    fn push_into(self: Arc<Self>, input: &mut Input);
    /// Takes this very object (found by pointer) out of a snapshot; false if it is not there.
    fn remove_from(&self, input: &mut Input) -> bool;
    /// Puts the object in the place of `old` (found by pointer) in a snapshot. `None` when
    /// `old` is of another kind, `Some(false)` when it is not there.
    fn replace_in(self: Arc<Self>, old: &dyn Object, input: &mut Input) -> Option<bool>;
    fn as_any(&self) -> &dyn std::any::Any;
    /// The same kind with the same content.
    fn equals(&self, other: &dyn Object) -> bool;

    /// Kind, namespace and name, borrowed from the object: every object of every file is
    /// keyed on every snapshot, and owned keys were three strings built and dropped each.
    fn key(&self) -> Key<'_> {
        let meta = self.meta();
        (
            self.kind_static(),
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
        )
    }

    /// [`Object::kind`] without a copy.
    fn kind_static(&self) -> std::borrow::Cow<'static, str>;
}

impl<K: Kind> Object for K {
    fn kind(&self) -> String {
        K::kind_name()
    }

    fn kind_static(&self) -> std::borrow::Cow<'static, str> {
        K::kind(&())
    }

    fn meta(&self) -> &ObjectMeta {
        kube::Resource::meta(self)
    }

    fn push_into(self: Arc<Self>, input: &mut Input) {
        input.push_shared(self);
    }

    fn remove_from(&self, input: &mut Input) -> bool {
        let list = K::of_mut(input);
        match list.iter().position(|o| std::ptr::eq(Arc::as_ptr(o), self)) {
            Some(i) => {
                // Not swapped out: the others keep their order (see `served`).
                list.remove(i);
                true
            }
            None => false,
        }
    }

    fn replace_in(self: Arc<Self>, old: &dyn Object, input: &mut Input) -> Option<bool> {
        let old = old.as_any().downcast_ref::<K>()?;
        let slot = K::of_mut(input)
            .iter_mut()
            .find(|o| std::ptr::eq(Arc::as_ptr(o), old));
        Some(slot.map(|slot| *slot = self).is_some())
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn equals(&self, other: &dyn Object) -> bool {
        other.as_any().downcast_ref::<K>() == Some(self)
    }
}

type Key<'o> = (std::borrow::Cow<'static, str>, &'o str, &'o str);

/// Objects by key for the duplicate check of every snapshot: one entry per object of every
/// file on every pass, so a fast hash (the keys are the operator's own manifests).
type Seen<'p> = HashMap<Key<'p>, (&'p Path, usize), foldhash::fast::RandomState>;

fn display_key((kind, ns, name): &Key<'_>) -> String {
    if ns.is_empty() {
        format!("{kind} {name}")
    } else {
        format!("{kind} {ns}/{name}")
    }
}

impl FileSource {
    /// A source reading `path`, a YAML file or a directory. Nothing is read until `load`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        FileSource {
            path: path.into(),
            files: BTreeMap::new(),
            walked: false,
            walk_errors: Vec::new(),
            locations: true,
            served: None,
            updated: 0,
        }
    }

    /// Leaves [`Loaded::locations`] empty: for a reader that never points at lines.
    pub fn without_locations(mut self) -> Self {
        self.locations = false;
        self
    }

    /// The file or directory this source reads.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// File-system notifications for this source's path: see [`crate::watch()`].
    pub fn watch(&self) -> anyhow::Result<crate::Watch> {
        crate::watch(&self.path)
    }

    /// Re-reads every file and returns the objects to serve and the errors.
    ///
    /// A file whose text did not change since the previous load is not parsed again. When
    /// the path itself cannot be read (e.g. the directory was removed), every file's last
    /// good content is served and the error is returned.
    pub fn load(&mut self) -> Loaded {
        self.load_changed(&Changes::All)
    }

    /// Like [`FileSource::load`], but when `changes` names files (a [`crate::Watch`] saw only
    /// files written, created, renamed or removed), only those are read again: the cost of a
    /// change follows the change, not the size of the folder. Anything a file list cannot
    /// describe (a directory, a path outside the walk) falls back to a full walk.
    pub fn load_changed(&mut self, changes: &Changes) -> Loaded {
        let refreshed = match changes {
            Changes::Files(paths) if self.walked => {
                // Taken: whatever happens next, it is only kept again once it holds.
                let served = self.served.take();
                let before: Vec<Arc<Vec<Located>>> =
                    paths.iter().map(|p| self.served_objects(p)).collect();
                if !self.refresh(paths) {
                    false
                } else if let Some(loaded) =
                    served.and_then(|served| self.update_served(served, paths, &before))
                {
                    return loaded;
                } else {
                    true
                }
            }
            _ => false,
        };
        if !refreshed {
            let mut walk_errors = Vec::new();
            match discover(&self.path, &mut walk_errors) {
                Ok(paths) => {
                    self.walked = self.path.is_dir();
                    self.walk_errors = walk_errors;
                    let present: HashSet<&PathBuf> = paths.iter().collect();
                    self.files.retain(|p, _| present.contains(p));
                    for path in &paths {
                        self.read(path);
                    }
                }
                Err(err) => {
                    self.walked = false;
                    self.served = None;
                    let mut out = Loaded::default();
                    out.errors.push(err);
                    let mut seen = Seen::default();
                    for (path, state) in &self.files {
                        if let Some(good) = &state.last_good {
                            out.stale_files.push(path.clone());
                            contribute(path, good, None, &mut seen, self.locations, &mut out);
                        }
                    }
                    return out;
                }
            }
        }
        self.assemble()
    }

    /// The objects a file served in the last snapshot, when that snapshot was clean (its
    /// parse then is its last good content); none if the file was not there.
    fn served_objects(&self, path: &Path) -> Arc<Vec<Located>> {
        self.files
            .get(path)
            .map(|f| f.parsed.objects.clone())
            .unwrap_or_default()
    }

    /// The kept snapshot updated by the files in `paths` (read again already), which served
    /// `before` in it. `None` when a changed file has an error or the update cannot tell
    /// (see `served`): the full way decides.
    fn update_served(
        &mut self,
        mut served: served::Served,
        paths: &BTreeSet<PathBuf>,
        before: &[Arc<Vec<Located>>],
    ) -> Option<Loaded> {
        let mut after = Vec::with_capacity(paths.len());
        for path in paths {
            match self.files.get(path) {
                None => after.push(Arc::default()),
                Some(f) if f.read_error.is_none() && f.parsed.errors.is_empty() => {
                    after.push(f.parsed.objects.clone())
                }
                Some(_) => return None,
            }
        }
        let changes: Vec<served::Change<'_>> = paths
            .iter()
            .zip(before.iter().zip(&after))
            .map(|(path, (before, after))| served::Change {
                path,
                before,
                after,
            })
            .collect();
        // Every file's, in path order, as a full snapshot gathers them: a walk through the
        // files, but no copy unless a file has some.
        let warnings = self
            .files
            .values()
            .filter(|f| f.read_error.is_none())
            .flat_map(|f| f.parsed.warnings.iter().cloned())
            .collect();
        let loaded = served.update(&changes, self.locations, warnings)?;
        for (path, objects) in paths.iter().zip(after) {
            if let Some(f) = self.files.get_mut(path) {
                f.last_good = Some(objects);
            }
        }
        self.served = Some(served);
        self.updated += 1;
        Some(loaded)
    }

    /// Re-reads the named files of a walked directory. False if a path is not one a walk would
    /// read as a file (the caller then walks the whole directory).
    fn refresh(&mut self, paths: &BTreeSet<PathBuf>) -> bool {
        for path in paths {
            let Ok(rel) = path.strip_prefix(&self.path) else {
                return false;
            };
            let names: Vec<_> = rel
                .components()
                .map(|c| match c {
                    Component::Normal(n) => Some(n.to_string_lossy()),
                    _ => None,
                })
                .collect();
            let walkable = !names.is_empty()
                && names.len() < MAX_DEPTH
                && names
                    .iter()
                    .all(|n| n.as_deref().is_some_and(|n| !is_ignored_name(n)))
                && names
                    .last()
                    .and_then(|n| n.as_deref())
                    .is_some_and(is_manifest_name);
            if !walkable {
                return false;
            }
            match std::fs::metadata(path) {
                Ok(meta) if meta.is_dir() => return false,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    // Removed (or a dangling symlink, which a walk skips too).
                    self.files.remove(path);
                }
                _ => self.read(path),
            }
        }
        true
    }

    /// Reads one file into its state; parses it only if its text changed.
    fn read(&mut self, path: &Path) {
        let content = match std::fs::read(path) {
            Ok(bytes) => {
                String::from_utf8(bytes).map_err(|_| "the file is not valid UTF-8".to_owned())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // Deleted between the directory walk (or the event) and the read.
                self.files.remove(path);
                return;
            }
            Err(e) => Err(format!("cannot read the file: {e}")),
        };
        let state = self
            .files
            .entry(path.to_owned())
            .or_insert_with(|| FileState {
                digest: None,
                parsed: Parsed::default(),
                read_error: None,
                last_good: None,
            });
        match content {
            Ok(content) => {
                state.read_error = None;
                let digest = TextDigest::of(&content);
                if state.digest.as_ref() != Some(&digest) {
                    let before = std::mem::replace(&mut state.parsed, parse_file(path, &content));
                    keep_unchanged(&before.objects, &mut state.parsed.objects);
                    for w in &state.parsed.warnings {
                        tracing::warn!("{w}");
                    }
                    state.digest = Some(digest);
                }
            }
            Err(message) => {
                // Parse again once the file is readable.
                state.digest = None;
                state.read_error = Some(message);
            }
        }
    }

    /// The snapshot of every file's state, in path order.
    fn assemble(&mut self) -> Loaded {
        let mut out = Loaded {
            errors: self.walk_errors.clone(),
            ..Loaded::default()
        };
        // Sized for every object up front: growing it was a twentieth of a snapshot.
        let objects = self.files.values().map(|f| f.parsed.objects.len()).sum();
        let mut seen = Seen::with_capacity_and_hasher(objects, Default::default());
        let locations = self.locations;
        for (path, state) in &mut self.files {
            let mut errors = Vec::new();
            match &state.read_error {
                None => {
                    errors.extend(state.parsed.errors.iter().cloned());
                    out.warnings.extend(state.parsed.warnings.iter().cloned());
                }
                Some(message) => errors.push(LoadError {
                    file: path.clone(),
                    line: None,
                    message: message.clone(),
                }),
            }

            // Each object's key (with the line it is defined at), built once: the duplicate
            // check and the snapshot both need it, and building it is three owned strings per
            // object on every pass.
            let mut keys: Vec<(Key<'_>, usize)> = Vec::new();
            if errors.is_empty() {
                // Duplicates: the first definition (in path order, then file order) wins and
                // the later one is the error.
                keys.reserve_exact(state.parsed.objects.len());
                for o in state.parsed.objects.iter() {
                    let key = o.object.key();
                    let previous = match seen.get(&key) {
                        Some((file, line)) => Some(format!("{}:{line}", file.display())),
                        // Earlier in this file: few objects, so a scan beats a map.
                        None => keys
                            .iter()
                            .find(|(k, _)| *k == key)
                            .map(|(_, line)| format!("line {line}")),
                    };
                    match previous {
                        Some(at) => errors.push(LoadError {
                            file: path.clone(),
                            line: Some(o.line),
                            message: format!(
                                "duplicate {}: already defined at {at}",
                                display_key(&key)
                            ),
                        }),
                        None => keys.push((key, o.line)),
                    }
                }
            }

            if errors.is_empty() {
                state.last_good = Some(state.parsed.objects.clone());
                contribute(
                    path,
                    &state.parsed.objects,
                    Some(keys),
                    &mut seen,
                    locations,
                    &mut out,
                );
            } else {
                if let Some(good) = &state.last_good {
                    out.stale_files.push(path.clone());
                    contribute(path, good, None, &mut seen, locations, &mut out);
                }
                out.errors.extend(errors);
            }
        }
        let clean = out.errors.is_empty() && out.stale_files.is_empty();
        self.served = (clean && self.walked).then(|| served::Served::of(&out, &self.files));
        out
    }
}

/// Adds a file's objects to the snapshot, skipping (with a warning) any already defined by
/// an earlier file: this can only happen to last-good content, which was checked against
/// the files of its own time.
/// `keys` are the objects' keys, in order, when the caller built them already.
fn contribute<'p>(
    path: &'p Path,
    objects: &'p [Located],
    keys: Option<Vec<(Key<'p>, usize)>>,
    seen: &mut Seen<'p>,
    locations: bool,
    out: &mut Loaded,
) {
    let mut keys = keys.map(Vec::into_iter);
    for o in objects {
        let key = match keys.as_mut().and_then(Iterator::next) {
            Some((key, _)) => key,
            None => o.object.key(),
        };
        // One lookup that finds or claims the key: every object of every file passes here on
        // every snapshot.
        match seen.entry(key) {
            std::collections::hash_map::Entry::Occupied(first) => {
                let (file, line) = first.get();
                tracing::warn!(
                    "{}:{}: not serving the last good {}: now defined at {}:{}",
                    path.display(),
                    o.line,
                    display_key(first.key()),
                    file.display(),
                    line
                );
                continue;
            }
            std::collections::hash_map::Entry::Vacant(free) => {
                free.insert((path, o.line));
            }
        }
        if locations {
            out.locations.insert(
                (
                    o.object.kind(),
                    gatehouse_translate::ObjectKey::of(o.object.meta()),
                ),
                (path.to_owned(), o.line),
            );
        }
        Arc::clone(&o.object).push_into(&mut out.input);
    }
}

/// Gives every object of a file's new parse that equals one of its last parse the `Arc` of
/// before. Translation takes a route's work from the last pass only for the same object
/// (`gatehouse_translate::Reuse`), and one route edited in a file of many must not make every
/// route of the file new. Objects are matched by position first (an edit rarely moves the
/// others), by kind, namespace and name otherwise.
fn keep_unchanged(before: &[Located], now: &mut Arc<Vec<Located>>) {
    let Some(now) = Arc::get_mut(now) else {
        return;
    };
    let mut by_key: Option<HashMap<Key<'_>, usize>> = None;
    for (i, n) in now.iter_mut().enumerate() {
        let same = match before.get(i) {
            Some(b) if b.object.equals(&*n.object) => Some(b),
            _ => {
                let by_key = by_key.get_or_insert_with(|| {
                    before
                        .iter()
                        .enumerate()
                        .map(|(j, b)| (b.object.key(), j))
                        .collect()
                });
                by_key
                    .get(&n.object.key())
                    .map(|&j| &before[j])
                    .filter(|b| b.object.equals(&*n.object))
            }
        };
        if let Some(b) = same {
            n.object = Arc::clone(&b.object);
        }
    }
}

/// Names skipped in a directory walk: hidden files (`.x`, `.#x`, `.x.swp`), backups (`x~`)
/// and Emacs autosaves (`#x#`).
pub(crate) fn is_ignored_name(name: &str) -> bool {
    name.starts_with('.') || name.ends_with('~') || (name.starts_with('#') && name.ends_with('#'))
}

/// Files read in a directory walk: YAML, and JSON (which is YAML too, as kubectl reads it).
pub(crate) fn is_manifest_name(name: &str) -> bool {
    !is_ignored_name(name)
        && (name.ends_with(".yaml") || name.ends_with(".yml") || name.ends_with(".json"))
}

const MAX_DEPTH: usize = 32;

/// The files to read, sorted. Errors about the root are returned; errors about a
/// subdirectory are recorded and the walk goes on.
fn discover(root: &Path, errors: &mut Vec<LoadError>) -> Result<Vec<PathBuf>, LoadError> {
    let meta = std::fs::metadata(root).map_err(|e| LoadError {
        file: root.to_owned(),
        line: None,
        message: format!("cannot read: {e}"),
    })?;
    if !meta.is_dir() {
        return Ok(vec![root.to_owned()]);
    }
    let mut files = Vec::new();
    walk(root, 0, &mut files, errors).map_err(|e| LoadError {
        file: root.to_owned(),
        line: None,
        message: format!("cannot read the directory: {e}"),
    })?;
    files.sort();
    Ok(files)
}

fn walk(
    dir: &Path,
    depth: usize,
    files: &mut Vec<PathBuf>,
    errors: &mut Vec<LoadError>,
) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if is_ignored_name(&name) {
            continue;
        }
        let path = entry.path();
        // Follows symlinks (ConfigMap volumes are symlinks); a dangling one is skipped.
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            if depth + 1 >= MAX_DEPTH {
                errors.push(LoadError {
                    file: path,
                    line: None,
                    message: format!("directory nested deeper than {MAX_DEPTH} levels: skipped"),
                });
            } else if let Err(e) = walk(&path, depth + 1, files, errors) {
                errors.push(LoadError {
                    file: path,
                    line: None,
                    message: format!("cannot read the directory: {e}"),
                });
            }
        } else if is_manifest_name(&name) {
            files.push(path);
        }
    }
    Ok(())
}

fn parse_file(path: &Path, content: &str) -> Parsed {
    let content = content.strip_prefix('\u{feff}').unwrap_or(content);
    let mut parsed = Parsed::default();
    let mut objects = Vec::new();
    for doc in locate::split_documents(content) {
        if doc.is_blank() {
            continue;
        }
        let ctx = Ctx {
            file: path,
            doc,
            fixed_line: None,
        };
        let value: Value = match serde_yaml::from_str(doc.text) {
            Ok(v) => v,
            Err(e) => {
                parsed.errors.push(ctx.yaml_error(&e));
                continue;
            }
        };
        parse_value(&ctx, &value, true, &mut objects, &mut parsed);
    }
    parsed.objects = Arc::new(objects);
    parsed
}

/// Where a document or list item sits in its file.
struct Ctx<'a> {
    file: &'a Path,
    doc: Document<'a>,
    /// For items of a `kind: List`: their text is re-serialized, so every finding inside
    /// one is reported at the line where the item starts.
    fixed_line: Option<usize>,
}

static MARK: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r" at line (\d+) column (\d+)").expect("valid regex"));

impl Ctx<'_> {
    /// File line of a 1-based document line.
    fn line(&self, doc_line: usize) -> usize {
        self.fixed_line
            .unwrap_or_else(|| self.doc.file_line(doc_line))
    }

    fn start_line(&self) -> usize {
        self.line(self.doc.first_content_line())
    }

    /// File line of the value at `path` (or of its deepest ancestor found, or of the start
    /// of the object).
    fn path_line(&self, path: &[Seg]) -> usize {
        match locate::find_path_line(self.doc.text, path) {
            Some(l) => self.line(l),
            None => self.start_line(),
        }
    }

    fn error(&self, line: usize, message: impl Into<String>) -> LoadError {
        LoadError {
            file: self.file.to_owned(),
            line: Some(line),
            message: message.into(),
        }
    }

    /// A serde_yaml error, with its document-relative location made file-relative.
    fn yaml_error(&self, e: &serde_yaml::Error) -> LoadError {
        let line = match e.location() {
            Some(loc) => self.line(loc.line()),
            None => self.start_line(),
        };
        let text = e.to_string();
        let message = MARK.replace_all(&text, |c: &regex::Captures<'_>| {
            if self.fixed_line.is_some() {
                return String::new();
            }
            let l: usize = c[1].parse().unwrap_or(1);
            let l = self.line(l);
            if l == line {
                format!(" at column {}", &c[2])
            } else {
                format!(" at line {l} column {}", &c[2])
            }
        });
        self.error(line, message)
    }
}

fn parse_value(
    ctx: &Ctx<'_>,
    value: &Value,
    allow_list: bool,
    objects: &mut Vec<Located>,
    parsed: &mut Parsed,
) {
    let map = match value {
        Value::Mapping(map) => map,
        Value::Null => return,
        _ => {
            parsed.errors.push(ctx.error(
                ctx.start_line(),
                "expected a Kubernetes object (a mapping with apiVersion and kind)",
            ));
            return;
        }
    };
    let field = |name: &str| -> Result<Option<&str>, LoadError> {
        match map.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(_) => Err(ctx.error(
                ctx.path_line(&[key(name)]),
                format!("{name} must be a string"),
            )),
        }
    };
    let (api_version, kind) = match (field("apiVersion"), field("kind")) {
        (Ok(Some(a)), Ok(Some(k))) => (a, k),
        (Err(e), _) | (_, Err(e)) => {
            parsed.errors.push(e);
            return;
        }
        (Ok(a), Ok(k)) => {
            let missing = match (a, k) {
                (None, None) => "apiVersion and kind",
                (None, _) => "apiVersion",
                _ => "kind",
            };
            parsed
                .errors
                .push(ctx.error(ctx.start_line(), format!("missing {missing}")));
            return;
        }
    };
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));

    if (group, kind) == ("", "List") && version == "v1" {
        if !allow_list {
            parsed
                .errors
                .push(ctx.error(ctx.path_line(&[key("kind")]), "a List inside a List"));
            return;
        }
        parse_list(ctx, map.get("items"), objects, parsed);
        return;
    }

    let mut visit = ParseKind {
        ctx,
        value,
        group,
        version,
        kind,
        api_version,
        parsed,
        found: false,
        object: None,
    };
    for_each_kind(&mut visit);
    if !visit.found {
        // Application manifests and `kustomize build` output mix in Deployments and the
        // like: skipped with a warning, never a reason to reject the rest of the file.
        parsed.warnings.push(ctx.error(
            ctx.path_line(&[key("kind")]),
            format!(
                "kind {kind:?} (apiVersion {api_version}) is not one Gatehouse reads; skipped \
                 (it reads {})",
                supported_kinds()
            ),
        ));
        return;
    }
    if let Some(object) = visit.object {
        objects.push(Located {
            object,
            line: ctx.path_line(&[key("metadata"), key("name")]),
        });
    }
}

/// Every registered kind with its apiVersions, for the unknown-kind error.
fn supported_kinds() -> String {
    struct List(Vec<String>);
    impl KindVisitor for List {
        fn visit<K: Kind>(&mut self) {
            let group = K::group(&());
            let group = if group.is_empty() {
                String::new()
            } else {
                format!("{group}/")
            };
            self.0
                .push(format!("{} ({group}{})", K::kind_name(), K::VERSIONS[0]));
        }
    }
    let mut list = List(Vec::new());
    for_each_kind(&mut list);
    list.0.join(", ")
}

/// Finds the registered kind of a document and reads it as that kind.
struct ParseKind<'c, 'a> {
    ctx: &'c Ctx<'a>,
    /// The document (or List item) already parsed: the object is read from it.
    value: &'c Value,
    group: &'c str,
    version: &'c str,
    kind: &'c str,
    api_version: &'c str,
    parsed: &'c mut Parsed,
    found: bool,
    object: Option<Arc<dyn Object>>,
}

impl KindVisitor for ParseKind<'_, '_> {
    fn visit<K: Kind>(&mut self) {
        if self.found || K::group(&()) != self.group || K::kind_name() != self.kind {
            return;
        }
        self.found = true;
        let ctx = self.ctx;
        if !K::VERSIONS.contains(&self.version) {
            self.parsed.errors.push(ctx.error(
                ctx.path_line(&[key("apiVersion")]),
                format!(
                    "unsupported apiVersion {} for {}; supported versions: {}",
                    self.api_version,
                    self.kind,
                    K::VERSIONS.join(", ")
                ),
            ));
            return;
        }
        let Some(object) = typed::<K>(ctx, self.value, self.kind, K::NAMESPACED, self.parsed)
        else {
            return;
        };
        for finding in object.findings() {
            let line = finding_line(ctx, &finding.path, finding.value.as_deref());
            self.parsed.errors.push(ctx.error(line, finding.message));
        }
        self.object = Some(Arc::new(object));
    }
}

/// `kind: List` (what `kubectl get -o yaml` prints): each item is an object. Findings
/// inside an item are reported at the line where the item starts.
fn parse_list(
    ctx: &Ctx<'_>,
    items: Option<&Value>,
    objects: &mut Vec<Located>,
    parsed: &mut Parsed,
) {
    let items = match items {
        None | Some(Value::Null) => return,
        Some(Value::Sequence(items)) => items,
        Some(_) => {
            parsed
                .errors
                .push(ctx.error(ctx.path_line(&[key("items")]), "items must be a list"));
            return;
        }
    };
    for (i, item) in items.iter().enumerate() {
        let line = ctx.path_line(&[key("items"), Seg::Index(i)]);
        let text = match serde_yaml::to_string(item) {
            Ok(t) => t,
            Err(e) => {
                parsed.errors.push(ctx.error(line, e.to_string()));
                continue;
            }
        };
        let item_ctx = Ctx {
            file: ctx.file,
            doc: Document {
                text: &text,
                first_line: line,
            },
            fixed_line: Some(line),
        };
        parse_value(&item_ctx, item, false, objects, parsed);
    }
}

/// Deserializes the document into `K`, reporting unknown fields as warnings, then checks
/// the name and defaults the namespace.
///
/// Read from the parsed `value` first: its sequences know their length, so every list in the
/// object is allocated at its size. Read from the text, a list grows by doubling and keeps the
/// spare room: a route's one rule, match, backendRef and parentRef each held room for four,
/// a third of the process's heap at 5000 routes. The text is read when the value cannot be:
/// its errors carry line and column, and where the two readers differ (a plain `80` is a
/// number in a value and may still be a string field in the text) the text decides, as it
/// always did.
fn typed<K>(
    ctx: &Ctx<'_>,
    value: &Value,
    kind: &str,
    namespaced: bool,
    parsed: &mut Parsed,
) -> Option<K>
where
    K: serde::de::DeserializeOwned + kube::Resource,
{
    let mut ignored = Vec::new();
    let from_value: Result<K, _> =
        serde_ignored::deserialize(value, |path| ignored.push(locate::segments(&path)));
    let result = from_value.or_else(|_| {
        ignored.clear();
        let de = serde_yaml::Deserializer::from_str(ctx.doc.text);
        serde_ignored::deserialize(de, |path| ignored.push(locate::segments(&path)))
    });
    let mut object: K = match result {
        Ok(o) => o,
        Err(e) => {
            parsed.errors.push(ctx.yaml_error(&e));
            return None;
        }
    };
    for path in ignored {
        // Custom resources take apiVersion and kind from their type, not from a field.
        if let [Seg::Key(k)] = path.as_slice()
            && (k == "apiVersion" || k == "kind")
        {
            continue;
        }
        parsed.warnings.push(ctx.error(
            ctx.path_line(&path),
            format!("unknown field {} (ignored)", locate::display_path(&path)),
        ));
    }
    let meta = object.meta_mut();
    if meta.name.as_deref().is_none_or(str::is_empty) {
        parsed.errors.push(ctx.error(
            ctx.path_line(&[key("metadata")]),
            "metadata.name is required",
        ));
        return None;
    }
    if namespaced {
        if meta.namespace.as_deref().is_none_or(str::is_empty) {
            meta.namespace = Some("default".to_owned());
        }
    } else if meta.namespace.take().is_some() {
        parsed.warnings.push(ctx.error(
            ctx.path_line(&[key("metadata"), key("namespace")]),
            format!("metadata.namespace ignored: {kind} is cluster-scoped"),
        ));
    }
    Some(object)
}

/// The line of a finding: found by its path when that line holds the value, else by
/// searching the text for the value, else the path's deepest ancestor.
fn finding_line(ctx: &Ctx<'_>, path: &[Seg], value: Option<&str>) -> usize {
    if ctx.fixed_line.is_some() {
        return ctx.start_line();
    }
    let Some(value) = value else {
        return ctx.path_line(path);
    };
    let lines: Vec<&str> = ctx.doc.text.lines().collect();
    let escaped = value.replace('\\', "\\\\");
    let holds = |l: usize| {
        lines
            .get(l.wrapping_sub(1))
            .is_some_and(|s| s.contains(value) || s.contains(&escaped))
    };
    match locate::find_path_line(ctx.doc.text, path) {
        Some(l) if holds(l) => ctx.line(l),
        found => match locate::find_value_line(ctx.doc.text, value) {
            Some(l) => ctx.line(l),
            None => found.map_or_else(|| ctx.start_line(), |l| ctx.line(l)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatehouse_translate::generated::httproutes::HttpRoute as HTTPRoute;

    fn ctx<'a>(text: &'a str) -> Ctx<'a> {
        Ctx {
            file: Path::new("test.yaml"),
            doc: Document {
                text,
                first_line: 1,
            },
            fixed_line: None,
        }
    }

    /// Reads `text` as `K` through [`typed`] (from the parsed value, falling back to the
    /// text) and through the text alone, as files were read before.
    fn both<K: Kind>(text: &str) -> (Option<K>, Option<K>, Parsed) {
        let ctx = ctx(text);
        let value: Value = serde_yaml::from_str(text).expect("valid YAML");
        let mut parsed = Parsed::default();
        let via_value = typed::<K>(
            &ctx,
            &value,
            K::kind_name().as_str(),
            K::NAMESPACED,
            &mut parsed,
        );
        let de = serde_yaml::Deserializer::from_str(text);
        let via_text = serde_ignored::deserialize(de, |_| {}).ok().map(|mut o: K| {
            let meta = o.meta_mut();
            if K::NAMESPACED && meta.namespace.is_none() {
                meta.namespace = Some("default".to_owned());
            }
            o
        });
        (via_value, via_text, parsed)
    }

    /// Every object of every manifest in the repository's fixtures and examples reads the
    /// same from the parsed value as from the text.
    #[test]
    fn objects_read_from_the_value_equal_those_read_from_the_text() {
        struct Compare<'t> {
            text: &'t str,
            kind: &'t str,
            compared: usize,
        }
        impl KindVisitor for Compare<'_> {
            fn visit<K: Kind>(&mut self) {
                if K::kind_name() != self.kind {
                    return;
                }
                let (via_value, via_text, _) = both::<K>(self.text);
                let json = |o: &Option<K>| o.as_ref().map(|o| serde_json::to_value(o).unwrap());
                assert_eq!(json(&via_value), json(&via_text), "{}", self.text);
                self.compared += 1;
            }
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut files: Vec<PathBuf> = Vec::new();
        for dir in ["crates/translate/tests/fixtures", "examples"] {
            for entry in walk(&root.join(dir)) {
                if entry.extension().is_some_and(|e| e == "yaml") {
                    files.push(entry);
                }
            }
        }
        let mut compared = 0;
        for file in &files {
            let content = std::fs::read_to_string(file).unwrap();
            for doc in locate::split_documents(&content) {
                if doc.is_blank() {
                    continue;
                }
                let Ok(Value::Mapping(map)) = serde_yaml::from_str::<Value>(doc.text) else {
                    continue;
                };
                let Some(Value::String(kind)) = map.get("kind") else {
                    continue;
                };
                let mut visit = Compare {
                    text: doc.text,
                    kind,
                    compared: 0,
                };
                for_each_kind(&mut visit);
                compared += visit.compared;
            }
        }
        // The fixtures hold hundreds of objects; a walk that found none compared nothing.
        assert!(compared > 200, "compared only {compared} objects");
    }

    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                out.extend(walk(&path));
            } else {
                out.push(path);
            }
        }
        out
    }

    const ROUTE: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: n}
spec:
  parentRefs: [{name: gw}]
  hostnames: [a.example.com]
  rules:
    - matches: [{path: {type: PathPrefix, value: /}}]
      backendRefs: [{name: echo, port: 80}]
";

    /// A list of one holds room for one: read from the text it held room for four.
    #[test]
    fn lists_are_allocated_at_their_length() {
        let (route, _, parsed) = both::<HTTPRoute>(ROUTE);
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let spec = route.unwrap().spec;
        let rules = spec.rules.as_ref().unwrap();
        assert_eq!(rules.capacity(), 1);
        assert_eq!(rules[0].matches.as_ref().unwrap().capacity(), 1);
        assert_eq!(rules[0].backend_refs.as_ref().unwrap().capacity(), 1);
        assert_eq!(spec.parent_refs.as_ref().unwrap().capacity(), 1);
        assert_eq!(spec.hostnames.as_ref().unwrap().capacity(), 1);
    }

    /// A plain `1` is a number in the value but the text reads it into a string field, as
    /// files always were read: the fallback keeps such files loading.
    #[test]
    fn a_number_in_a_string_field_still_reads_through_the_text() {
        let text = ROUTE.replace(
            "{name: r, namespace: n}",
            "{name: r, namespace: n, labels: {v: 1}}",
        );
        let (route, via_text, parsed) = both::<HTTPRoute>(&text);
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let labels = route.unwrap().metadata.labels.unwrap();
        assert_eq!(labels["v"], "1");
        assert!(via_text.is_some());
    }

    /// Errors still come from the text, with their line and column.
    #[test]
    fn a_type_error_keeps_its_location() {
        let text = ROUTE.replace("port: 80", "port: eighty");
        let (route, _, parsed) = both::<HTTPRoute>(&text);
        assert!(route.is_none());
        let [error] = parsed.errors.as_slice() else {
            panic!("one error expected: {:?}", parsed.errors);
        };
        assert_eq!(error.line, Some(9), "{error:?}");
        assert!(error.message.contains("column"), "{}", error.message);
    }

    /// Unknown fields are warned about once, at their line, whichever reader read the object.
    #[test]
    fn unknown_fields_are_warned_about_once() {
        let text = ROUTE.replace("hostnames:", "hostnamez: [x]\n  hostnames:");
        let (route, _, parsed) = both::<HTTPRoute>(&text);
        assert!(route.is_some());
        let [warning] = parsed.warnings.as_slice() else {
            panic!("one warning expected: {:?}", parsed.warnings);
        };
        assert!(
            warning.message.contains("spec.hostnamez"),
            "{}",
            warning.message
        );
        assert_eq!(warning.line, Some(6));
    }
}
