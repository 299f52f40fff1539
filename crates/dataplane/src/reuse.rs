//! Values an apply built that the next apply may take over: TLS server configurations and
//! clients (keyed by everything they were built from) and virtual hosts' route tables (keyed
//! by hostname, checked by the caller against what they were compiled from). What an apply
//! does not take or keep is dropped when it finishes.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, RandomState};

pub(crate) struct Reuse<K, V, S = RandomState> {
    previous: HashMap<K, V, S>,
    current: HashMap<K, V, S>,
}

impl<K, V, S: Default> Default for Reuse<K, V, S> {
    fn default() -> Self {
        Reuse {
            previous: HashMap::default(),
            current: HashMap::default(),
        }
    }
}

impl<K: Eq + Hash, V, S: BuildHasher> Reuse<K, V, S> {
    /// The value this apply already has for `key`, else the last apply's, else a new one.
    pub(crate) fn get_or_try<E>(
        &mut self,
        key: K,
        build: impl FnOnce() -> Result<V, E>,
    ) -> Result<V, E>
    where
        V: Clone,
    {
        if let Some(v) = self.current.get(&key) {
            return Ok(v.clone());
        }
        let value = match self.previous.remove(&key) {
            Some(v) => v,
            None => build()?,
        };
        self.current.insert(key, value.clone());
        Ok(value)
    }

    /// Takes the last apply's value for `key`, with its key, out of reach of this one: the
    /// caller keeps it again ([`Reuse::keep`]) or lets it go.
    pub(crate) fn take<Q>(&mut self, key: &Q) -> Option<(K, V)>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.previous.remove_entry(key)
    }

    /// Keeps `value` for the next apply.
    pub(crate) fn keep(&mut self, key: K, value: V) {
        self.current.insert(key, value);
    }

    /// Ends an apply: what it did not use is dropped. Swapped, not replaced, so that both
    /// maps keep their room and a steady apply allocates no table.
    pub(crate) fn finish(&mut self) {
        std::mem::swap(&mut self.previous, &mut self.current);
        self.current.clear();
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.previous.is_empty() && self.current.is_empty()
    }
}
