//! Values an apply built that the next apply may take over: TLS server configurations and
//! clients (keyed by everything they were built from) and virtual hosts' route tables (keyed
//! by hostname, checked by the caller against what they were compiled from). What an apply
//! does not use is dropped when it finishes.
//!
//! One map, each value marked with the last apply that used it: a value is found and marked
//! with one lookup, and a finish drops the unmarked ones in one pass (two maps, the last
//! apply's and this one's, cost a removal and an insertion per value, which at thousands of
//! hosts an apply was measurable).

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, RandomState};

pub(crate) struct Reuse<K, V, S = RandomState> {
    apply: u64,
    values: HashMap<K, (u64, V), S>,
}

impl<K, V, S: Default> Default for Reuse<K, V, S> {
    fn default() -> Self {
        Reuse {
            apply: 0,
            values: HashMap::default(),
        }
    }
}

impl<K: Eq + Hash, V, S: BuildHasher> Reuse<K, V, S> {
    /// The value kept for `key` (by this apply or the last), else a new one.
    pub(crate) fn get_or_try<E>(
        &mut self,
        key: K,
        build: impl FnOnce() -> Result<V, E>,
    ) -> Result<V, E>
    where
        V: Clone,
    {
        if let Some((used, v)) = self.values.get_mut(&key) {
            *used = self.apply;
            return Ok(v.clone());
        }
        let value = build()?;
        self.values.insert(key, (self.apply, value.clone()));
        Ok(value)
    }

    /// The value kept for `key`, now used by this apply: the caller checks that it still
    /// holds, and may replace it.
    pub(crate) fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (used, v) = self.values.get_mut(key)?;
        *used = self.apply;
        Some(v)
    }

    /// Keeps `value` for the next apply.
    pub(crate) fn keep(&mut self, key: K, value: V) {
        self.values.insert(key, (self.apply, value));
    }

    /// Ends an apply: what it did not use is dropped.
    pub(crate) fn finish(&mut self) {
        let apply = self.apply;
        self.values.retain(|_, (used, _)| *used == apply);
        self.apply += 1;
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}
