//! Backend choice: weighted random between a rule's backends, round-robin between a cluster's
//! endpoints. Both are lock-free on the request path.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Weighted random choice. Zero-weight items are dropped at compile time, so they can never be
/// picked, and the cumulative table turns a pick into one random number and a binary search.
#[derive(Debug)]
pub(crate) struct Weighted<T> {
    items: Box<[T]>,
    /// `cumulative[i]` is the sum of the weights of items `0..=i`.
    cumulative: Box<[u64]>,
}

impl<T> Weighted<T> {
    pub(crate) fn new(weighted: impl IntoIterator<Item = (u32, T)>) -> Self {
        // Sized from the iterator: boxing a vector with exactly its length in it reallocates
        // nothing, and every rule of a configuration builds one of these.
        let weighted = weighted.into_iter();
        let mut items = Vec::with_capacity(weighted.size_hint().0);
        let mut cumulative = Vec::with_capacity(weighted.size_hint().0);
        let mut total = 0u64;
        for (weight, item) in weighted {
            if weight == 0 {
                continue;
            }
            total += u64::from(weight);
            items.push(item);
            cumulative.push(total);
        }
        Weighted {
            items: items.into(),
            cumulative: cumulative.into(),
        }
    }

    /// `None` when there is nothing with a positive weight.
    pub(crate) fn pick(&self) -> Option<&T> {
        match self.items.len() {
            0 => None,
            1 => self.items.first(),
            _ => {
                let total = *self.cumulative.last()?;
                let r = fastrand::u64(0..total);
                let index = self.cumulative.partition_point(|&c| c <= r);
                self.items.get(index)
            }
        }
    }

    /// The items that can be picked (positive weight), in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.items.iter()
    }

    #[cfg(test)]
    pub(crate) fn items(&self) -> &[T] {
        &self.items
    }
}

/// Round-robin over a fixed list. The counter wraps; `fetch_add` keeps concurrent requests
/// spread without a lock.
#[derive(Debug)]
pub(crate) struct RoundRobin<T> {
    items: Box<[T]>,
    next: AtomicUsize,
}

impl<T> RoundRobin<T> {
    pub(crate) fn new(items: Vec<T>) -> Self {
        RoundRobin {
            items: items.into(),
            // Start at a random place so that many proxies (or many applies) do not all hit the
            // first endpoint first.
            next: AtomicUsize::new(fastrand::usize(..)),
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.items.iter()
    }

    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    pub(crate) fn next(&self) -> Option<&T> {
        if self.items.is_empty() {
            return None;
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        self.items.get(n % self.items.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_all_zero_pick_nothing() {
        assert!(Weighted::<u8>::new([]).pick().is_none());
        assert!(Weighted::new([(0, 'a'), (0, 'b')]).pick().is_none());
    }

    #[test]
    fn weight_zero_is_never_chosen() {
        let w = Weighted::new([(0, 'z'), (1, 'a'), (0, 'y'), (3, 'b'), (0, 'x')]);
        assert_eq!(w.items(), &['a', 'b']);
        let mut a = 0;
        for _ in 0..10_000 {
            match w.pick() {
                Some('a') => a += 1,
                Some('b') => {}
                other => panic!("picked {other:?}"),
            }
        }
        // Expected 25%; the bounds are ~11 standard deviations wide.
        assert!(
            (2_000..=3_000).contains(&a),
            "a picked {a} times out of 10000"
        );
    }

    #[test]
    fn single_backend_always_chosen() {
        let w = Weighted::new([(0, 'z'), (7, 'a')]);
        for _ in 0..100 {
            assert_eq!(w.pick(), Some(&'a'));
        }
    }

    #[test]
    fn round_robin_cycles() {
        let rr = RoundRobin::new(vec![1, 2, 3]);
        let first = *rr.next().unwrap();
        let seq: Vec<i32> = (0..6).map(|_| *rr.next().unwrap()).collect();
        let expect: Vec<i32> = (1..=6).map(|i| (first - 1 + i) % 3 + 1).collect();
        assert_eq!(seq, expect);
        assert!(RoundRobin::<u8>::new(vec![]).next().is_none());
    }
}
