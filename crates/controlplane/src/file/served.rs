//! The snapshot kept up to date by the changed files alone.
//!
//! A full snapshot goes through every object of every file: the duplicate check hashes each
//! key and a new `Input` gets each object pushed. At 5000 routes that was 1.4 ms of every pass,
//! for a change of one file. While every file loads cleanly, the last snapshot is kept with a
//! count of its keys, and a change takes the changed files' old objects out and puts their new
//! ones in.
//!
//! Anything else goes the full way, which is always right: an error, a stale file, a possible
//! duplicate, a walk, a change of many objects. The kept snapshot is made again after the next
//! full snapshot that is clean.

use std::collections::{BTreeMap, HashSet};
use std::hash::BuildHasher;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{FileState, Loaded, Located, Object};

/// A change of more objects than this goes the full way: each object taken out is searched
/// for in its kind's list, and past this many a full snapshot costs no more.
const MOST_MOVED: usize = 64;

#[derive(Debug)]
pub(super) struct Served {
    /// The snapshot as last handed out: every object of every file, without errors.
    loaded: Loaded,
    /// How many served objects have a key of each hash. A count, not the keys: a key is three
    /// owned strings per object. Two keys of one hash only make a new object look like a
    /// duplicate, which sends that change the full way; a count never lets a real duplicate
    /// through, also after one of the two is taken out.
    keys: foldhash::HashMap<u64, u32>,
    /// Hashes the keys: seeded once, so that a key hashes the same on every change.
    hasher: foldhash::fast::RandomState,
}

/// One changed file: the objects it served before the change and the ones it reads now.
pub(super) struct Change<'a> {
    pub path: &'a Path,
    pub before: &'a [Located],
    pub after: &'a [Located],
}

impl Served {
    /// Kept after a full snapshot without errors or stale files, of the `files` it was made of.
    pub(super) fn of(loaded: &Loaded, files: &BTreeMap<PathBuf, FileState>) -> Served {
        let hasher = foldhash::fast::RandomState::default();
        let mut keys = foldhash::HashMap::default();
        for o in files.values().flat_map(|f| f.parsed.objects.iter()) {
            *keys.entry(hasher.hash_one(o.object.key())).or_insert(0) += 1;
        }
        Served {
            loaded: loaded.clone(),
            keys,
            hasher,
        }
    }

    /// The snapshot after `changes`, with the warnings of all files (`warnings`, in path
    /// order, as a full snapshot gathers them). `None` when the changes cannot be applied here;
    /// `self` is then half changed and must be dropped.
    pub(super) fn update(
        &mut self,
        changes: &[Change<'_>],
        locations: bool,
        warnings: Vec<super::LoadError>,
    ) -> Option<Loaded> {
        // What each file took out and put in: an edit keeps the `Arc` of every object it did
        // not change (`keep_unchanged`), so those are neither.
        let mut moved = Vec::with_capacity(changes.len());
        let mut count = 0;
        for c in changes {
            let (out, into) = difference(c.before, c.after)?;
            count += out.len() + into.len();
            if count > MOST_MOVED {
                return None;
            }
            moved.push((out, into));
        }
        // Keys first, all taken out before any is put in: an object may move between files.
        for (out, _) in &moved {
            for o in out {
                let hash = self.hasher.hash_one(o.object.key());
                match self.keys.get_mut(&hash) {
                    Some(n) if *n > 1 => *n -= 1,
                    Some(_) => {
                        self.keys.remove(&hash);
                    }
                    None => return None,
                }
            }
        }
        for (_, into) in &moved {
            for o in into {
                let n = self
                    .keys
                    .entry(self.hasher.hash_one(o.object.key()))
                    .or_insert(0);
                if *n > 0 {
                    // Served already, or one of the same hash: the full way finds out which.
                    return None;
                }
                *n = 1;
            }
        }
        let input = &mut self.loaded.input;
        for (out, into) in &moved {
            // Paired in order, an object of the same kind takes the place of the one it
            // replaces: the list keeps its order, and comparing it with the last pass's
            // (`Input::same_to_translate`) stays a walk in step.
            let mut into = into.iter();
            for o in out {
                if let Some(new) = into.next() {
                    match Arc::clone(&new.object).replace_in(&*o.object, input) {
                        Some(true) => continue,
                        Some(false) => return None,
                        // Another kind: added, and the old one taken out below.
                        None => Arc::clone(&new.object).push_into(input),
                    }
                }
                if !o.object.remove_from(input) {
                    return None;
                }
            }
            for new in into {
                Arc::clone(&new.object).push_into(input);
            }
        }
        if locations {
            // Every object of a changed file, also the unchanged ones: their lines may have
            // moved.
            for c in changes {
                for o in c.before {
                    self.loaded.locations.remove(&location_key(&*o.object));
                }
            }
            for c in changes {
                for o in c.after {
                    self.loaded
                        .locations
                        .insert(location_key(&*o.object), (c.path.to_owned(), o.line));
                }
            }
        }
        self.loaded.warnings = warnings;
        Some(self.loaded.clone())
    }
}

fn location_key(o: &dyn Object) -> (String, gatehouse_translate::ObjectKey) {
    (o.kind(), gatehouse_translate::ObjectKey::of(o.meta()))
}

/// The objects of `before` that `after` does not hold (by pointer), and those of `after` that
/// `before` does not. `None` when `after` holds one object twice: a file that defines one
/// object twice alike gets the one `Arc` of before for both (`keep_unchanged`), and only the
/// full way reports the duplicate.
fn difference<'a>(
    before: &'a [Located],
    after: &'a [Located],
) -> Option<(Vec<&'a Located>, Vec<&'a Located>)> {
    let pointers = |list: &[Located]| -> HashSet<*const (), foldhash::fast::RandomState> {
        list.iter()
            .map(|o| Arc::as_ptr(&o.object).cast::<()>())
            .collect()
    };
    let (was, is) = (pointers(before), pointers(after));
    if is.len() != after.len() {
        return None;
    }
    let out = before
        .iter()
        .filter(|o| !is.contains(&Arc::as_ptr(&o.object).cast::<()>()))
        .collect();
    let into = after
        .iter()
        .filter(|o| !was.contains(&Arc::as_ptr(&o.object).cast::<()>()))
        .collect();
    Some((out, into))
}

#[cfg(test)]
mod tests {
    use super::super::FileSource;
    use crate::Changes;
    use std::path::PathBuf;

    struct Dir(PathBuf);

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A small generator, seeded: the sequence is the same on every run.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) % n
        }
    }

    fn route(name: u64, path: u64) -> String {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r{name}}}\n\
             spec:\n  parentRefs: [{{name: gw}}]\n  rules:\n  - matches: [{{path: {{type: PathPrefix, value: /p{path}}}}}]\n"
        )
    }

    fn service(name: u64) -> String {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: r{name}}}\nspec:\n  ports: [{{port: 80}}]\n"
        )
    }

    /// A file's random content: up to four objects from a small set of names (so that files
    /// define the same object now and then), sometimes a broken document or an unknown field.
    fn content(rng: &mut Rng) -> String {
        let mut docs = Vec::new();
        for _ in 0..rng.below(5) {
            docs.push(match rng.below(12) {
                0 => "kind: [".to_owned(),
                1 => format!("{}  bogus: 1\n", route(rng.below(12), 0)),
                2 | 3 => service(rng.below(12)),
                _ => route(rng.below(12), rng.below(3)),
            });
        }
        docs.join("---\n")
    }

    /// What a load gives, comparable between two sources: the objects (any order), errors,
    /// warnings, stale files and locations.
    fn view(loaded: &super::Loaded) -> (Vec<String>, Vec<String>, Vec<PathBuf>, String) {
        let mut objects: Vec<String> = loaded
            .input
            .http_routes
            .iter()
            .map(|r| format!("{r:?}"))
            .chain(loaded.input.services.iter().map(|s| format!("{s:?}")))
            .collect();
        objects.sort();
        let problems = (loaded.errors.iter().map(|e| format!("error {e}")))
            .chain(loaded.warnings.iter().map(|w| format!("warning {w}")))
            .collect();
        (
            objects,
            problems,
            loaded.stale_files.clone(),
            format!("{:?}", loaded.locations),
        )
    }

    /// Random writes, removals and broken edits of a few files, each loaded by a source that
    /// updates its kept snapshot (the change named, as a watch names it) and by one that walks
    /// everything: both must give the same every time, and the kept snapshot must have been
    /// used for most of them.
    #[test]
    fn an_updated_snapshot_equals_a_full_one() {
        let dir = Dir(std::env::temp_dir().join(format!(
            "gatehouse-served-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        )));
        std::fs::create_dir_all(&dir.0).unwrap();
        for locations in [true, false] {
            let mut rng = Rng(if locations { 7 } else { 11 });
            for f in std::fs::read_dir(&dir.0).unwrap() {
                std::fs::remove_file(f.unwrap().path()).unwrap();
            }
            for i in 0..8 {
                std::fs::write(dir.0.join(format!("f{i}.yaml")), route(100 + i, 0)).unwrap();
            }
            let (mut updating, mut walking) = if locations {
                (FileSource::new(&dir.0), FileSource::new(&dir.0))
            } else {
                (
                    FileSource::new(&dir.0).without_locations(),
                    FileSource::new(&dir.0).without_locations(),
                )
            };
            updating.load();
            walking.load();
            for step in 0..600 {
                let mut named = std::collections::BTreeSet::new();
                for _ in 0..1 + rng.below(2) {
                    let path = dir.0.join(format!("f{}.yaml", rng.below(8)));
                    if rng.below(5) == 0 {
                        let _ = std::fs::remove_file(&path);
                    } else {
                        // Mostly clean, so that the kept snapshot comes back.
                        let text = if rng.below(3) == 0 {
                            content(&mut rng)
                        } else {
                            route(200 + rng.below(40), rng.below(3))
                        };
                        std::fs::write(&path, text).unwrap();
                    }
                    named.insert(path);
                }
                let got = updating.load_changed(&Changes::Files(named));
                let want = walking.load();
                assert_eq!(view(&got), view(&want), "step {step}");
            }
            assert!(
                updating.updated > 150,
                "the kept snapshot gave {} of 600 loads",
                updating.updated
            );
        }
    }
}
