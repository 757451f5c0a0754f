//! The objects of one kind that belong to a parent (an IA's endpoints and
//! service points, an SRQ's endpoints), held weakly: what an abrupt close
//! or a lookup walks.
//!
//! * The list never keeps an object alive.
//! * Its size follows the objects alive, not every object ever made. A
//!   `Weak` keeps its object's allocation, so a list that only grew would
//!   hold the memory of every endpoint a long-lived server ever freed. Dead
//!   entries go once more than half the list is dead: counted by the frees
//!   reported ([`WeakList::freed`]), and checked as it grows
//!   ([`WeakList::push`]) for objects dropped without a free. Both are
//!   amortised: a pass over the list per as many frees or pushes as it
//!   has entries.
//! * An object's drop never runs under the list's lock: what it hands out
//!   was upgraded there, and is dropped by the caller.

use parking_lot::Mutex;
use std::sync::{Arc, Weak};

/// Entries below which the list is not worth tidying.
const SMALL: usize = 16;

/// Weak references to the objects of a parent (see the module docs).
pub(crate) struct WeakList<T> {
    inner: Mutex<Inner<T>>,
}

struct Inner<T> {
    items: Vec<Weak<T>>,
    /// Frees reported since the last pass.
    freed: usize,
    /// The length at which a push makes a pass.
    check_at: usize,
}

impl<T> Default for WeakList<T> {
    fn default() -> Self {
        WeakList {
            inner: Mutex::new(Inner {
                items: Vec::new(),
                freed: 0,
                check_at: SMALL,
            }),
        }
    }
}

impl<T> WeakList<T> {
    /// Adds `item`.
    pub(crate) fn push(&self, item: &Arc<T>) {
        let dead = {
            let mut g = self.inner.lock();
            let dead = if g.items.len() >= g.check_at {
                g.tidy()
            } else {
                Vec::new()
            };
            g.items.push(Arc::downgrade(item));
            dead
        };
        drop(dead);
    }

    /// Notes that one of the objects was freed (it may still be referenced
    /// for a while); tidies the list once more than half of it may be dead.
    pub(crate) fn freed(&self) {
        let dead = {
            let mut g = self.inner.lock();
            g.freed += 1;
            if g.items.len() > SMALL && g.freed * 2 > g.items.len() {
                g.tidy()
            } else {
                Vec::new()
            }
        };
        drop(dead);
    }

    /// The objects still alive (freed ones included while referenced).
    pub(crate) fn live(&self) -> Vec<Arc<T>> {
        self.inner
            .lock()
            .items
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// Entries held, dead or alive (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().items.len()
    }
}

impl<T> Inner<T> {
    /// Drops the entries of dead objects and returns the removed `Weak`s,
    /// to be dropped after the lock (dropping one frees its object's
    /// allocation, which should not happen under the lock).
    fn tidy(&mut self) -> Vec<Weak<T>> {
        let (live, dead): (Vec<_>, Vec<_>) = std::mem::take(&mut self.items)
            .into_iter()
            .partition(|w| w.strong_count() > 0);
        self.items = live;
        self.freed = 0;
        self.check_at = (self.items.len() * 2).max(SMALL);
        dead
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Objects made and dropped (fewer under Miri, still many passes).
    const ROUNDS: u64 = if cfg!(miri) { 300 } else { 10_000 };

    #[test]
    fn freed_objects_leave_the_list() {
        let l = WeakList::default();
        let keep: Vec<Arc<u64>> = (0..10).map(Arc::new).collect();
        for k in &keep {
            l.push(k);
        }
        for i in 0..ROUNDS {
            let a = Arc::new(i);
            l.push(&a);
            drop(a);
            l.freed();
            assert!(l.len() <= 2 * keep.len() + 2 * SMALL, "{} entries", l.len());
        }
        let live = l.live();
        assert_eq!(live.len(), keep.len());
        assert!(live.iter().zip(&keep).all(|(a, b)| Arc::ptr_eq(a, b)));
    }

    #[test]
    fn objects_dropped_without_a_free_leave_the_list_as_it_grows() {
        let l = WeakList::default();
        let keep = Arc::new(7u64);
        l.push(&keep);
        for i in 0..ROUNDS {
            l.push(&Arc::new(i));
            assert!(l.len() <= 2 * SMALL + 1, "{} entries", l.len());
        }
        assert_eq!(l.live().len(), 1);
    }

    #[test]
    fn a_freed_object_still_referenced_stays_listed() {
        let l = WeakList::default();
        let held: Vec<Arc<u64>> = (0..40).map(Arc::new).collect();
        for h in &held {
            l.push(h);
        }
        for _ in 0..40 {
            l.freed();
        }
        assert_eq!(l.live().len(), 40);
    }
}
