//! The storage stand-in for loom models of the EVD protocol.
//!
//! Loom explores every interleaving of every atomic access; with the real
//! ring (`ring.rs`) under it, the EVD models take many minutes. The EVD
//! models therefore run against this stand-in, which keeps the *contract*
//! the EVD relies on and nothing more: a FIFO under a modelled mutex whose
//! depth is answered from a separate atomic counter, as the ring answers it
//! from its stamps and indices. A depth check does not synchronise through
//! the mutex, so the models depend on the `SeqCst` fences of the EVD
//! protocol exactly as the ring does (remove one and a model fails). The
//! ring itself is checked against the same contract by its own loom models
//! (`ring.rs`, `loom_tests`).

use crate::event::Event;
use crate::sync::{AtomicU64, AtomicUsize, Mutex, Ordering};
use std::collections::VecDeque;

pub(crate) struct Storage {
    q: Mutex<VecDeque<Event>>,
    len: AtomicUsize,
    consumed: AtomicU64,
}

impl Storage {
    pub(crate) fn new(_cap: usize) -> Self {
        Storage {
            q: Mutex::new(VecDeque::new()),
            len: AtomicUsize::new(0),
            consumed: AtomicU64::new(0),
        }
    }

    // The counter changes under the lock, so a thread whose pop found the
    // queue empty also sees a depth of zero.
    pub(crate) fn push(&self, e: Event) {
        let mut q = self.q.lock();
        q.push_back(e);
        self.len.fetch_add(1, Ordering::Release);
    }

    /// See the ring's `push_then`: the fence stands for the `SeqCst` claim.
    pub(crate) fn push_then<R>(&self, e: Event, then: impl FnOnce() -> R) -> R {
        self.push(e);
        crate::sync::fence(Ordering::SeqCst);
        then()
    }

    pub(crate) fn any_claimed(&self) -> bool {
        !self.is_empty()
    }

    pub(crate) fn pop(&self) -> Option<Event> {
        let mut got = None;
        self.pop_batch(1, |e| got = Some(e));
        got
    }

    pub(crate) fn pop_again(&self, mut again: impl FnMut() -> bool) -> Option<Event> {
        loop {
            if let Some(e) = self.pop() {
                return Some(e);
            }
            if !again() {
                return None;
            }
        }
    }

    pub(crate) fn pop_batch(&self, max: usize, mut out: impl FnMut(Event)) -> usize {
        let mut q = self.q.lock();
        let n = max.min(q.len());
        for e in q.drain(..n) {
            out(e);
        }
        if n > 0 {
            self.len.fetch_sub(n, Ordering::Release);
            self.consumed.fetch_add(n as u64, Ordering::Release);
        }
        n
    }

    pub(crate) fn consumed(&self) -> u64 {
        self.consumed.load(Ordering::Acquire)
    }

    /// The ring's slot-based lower bound: the stand-in has none.
    pub(crate) fn consumed_from_slots(&self, _known: u64, _want: u64) -> Option<u64> {
        None
    }

    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn ready_at_least(&self, k: usize) -> bool {
        self.len() >= k
    }

    pub(crate) fn claimed(&self) -> usize {
        self.len()
    }

    pub(crate) fn grow(&self, _cap: usize) {}
}
