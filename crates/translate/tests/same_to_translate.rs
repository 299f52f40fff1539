//! `Input::same_to_translate`: the check that lets a pass reuse the last translation. Its one
//! duty is safety: whenever it says two inputs read the same, translating them must give the
//! same output. Its use is that our own status writes (status and resourceVersion changes)
//! read the same, so the passes they cause translate nothing.

mod changes;

use changes::{CHANGES, apply, base, is_write};
use gatehouse_translate::{Options, translate};
use std::sync::Arc;

/// Random sequences of changes from one snapshot to the next: whenever the check says the two
/// read the same, translate gives the same output; whenever the changes were only writes of
/// status (and what comes with them), the check says so.
#[test]
fn inputs_that_read_the_same_translate_the_same() {
    let options = Options::default();
    let mut reused = 0;
    let mut translated = 0;
    for seed in 0..600u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut serial = 0;
        let mut before = base();
        // Some history first, so that the snapshots compared are not always the base.
        for _ in 0..rng.usize(0..4) {
            let change = CHANGES[rng.usize(..CHANGES.len())];
            apply(&mut before, change, &mut rng, &mut serial);
        }
        let mut after = before.clone();
        let mut changes = Vec::new();
        for _ in 0..rng.usize(1..4) {
            let change = CHANGES[rng.usize(..CHANGES.len())];
            changes.push(change);
            apply(&mut after, change, &mut rng, &mut serial);
        }
        let same = before.same_to_translate(&after);
        assert_eq!(
            same,
            after.same_to_translate(&before),
            "seed {seed}: the check is not symmetric ({changes:?})"
        );
        if same {
            reused += 1;
            assert!(
                translate(&before, &options) == translate(&after, &options),
                "seed {seed}: {changes:?} read the same but translate differently"
            );
        } else {
            translated += 1;
        }
        if changes.iter().all(|c| is_write(*c)) {
            assert!(
                same,
                "seed {seed}: only writes ({changes:?}), yet not the same"
            );
        }
    }
    // Both sides were exercised.
    assert!(
        reused > 50 && translated > 50,
        "{reused} reused, {translated} translated"
    );
}

/// Each change that translate reads is seen on its own, whatever else stays the same.
#[test]
fn every_change_translate_reads_is_seen() {
    for change in CHANGES.into_iter().filter(|c| !is_write(*c)) {
        let before = base();
        let mut after = before.clone();
        let mut rng = fastrand::Rng::with_seed(7);
        let mut serial = 100;
        apply(&mut after, change, &mut rng, &mut serial);
        assert!(!before.same_to_translate(&after), "{change:?} was not seen");
    }
}

/// A list with one object twice (two files may declare it) is never taken for the same: which
/// of the two wins is translate's to decide.
#[test]
fn a_key_twice_is_never_the_same() {
    let before = base();
    let mut after = before.clone();
    let first = Arc::clone(&after.http_routes[0]);
    after.http_routes[1] = first;
    after.http_routes.reverse();
    assert!(!before.same_to_translate(&after));
    assert!(!after.same_to_translate(&before));
}
