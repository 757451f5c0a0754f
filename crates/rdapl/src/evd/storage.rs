//! Event storage: a FIFO of events held by value.
//!
//! Normal builds use crossbeam's lock-free segmented queue (its head and tail
//! indices sit on separate cache lines, so producers and consumers do not
//! write each other's lines); loom builds use a modelled mutex around a
//! `VecDeque`, since loom cannot see inside crossbeam. Both are linearizable
//! FIFOs, which is all the EVD relies on: a pop takes an event for exactly
//! one consumer, and the depth read after a `SeqCst` fence includes every
//! push that came before the fence of the thread that pushed (see
//! `state.rs` for the protocol built on that).

use crate::event::Event;

#[cfg(not(loom))]
pub(crate) struct Storage(crossbeam_queue::SegQueue<Event>);

#[cfg(not(loom))]
impl Storage {
    pub(crate) fn new() -> Self {
        Storage(crossbeam_queue::SegQueue::new())
    }

    #[inline]
    pub(crate) fn push(&self, e: Event) {
        self.0.push(e)
    }

    #[inline]
    pub(crate) fn pop(&self) -> Option<Event> {
        self.0.pop()
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The loom model keeps the events under a modelled mutex but answers
/// `len`/`is_empty` from a separate atomic counter, as the segmented queue
/// answers them from its head and tail indices: a depth check then does not
/// synchronise through the mutex, so the models depend on the `SeqCst`
/// fences of the EVD protocol exactly as the real queue does (remove one and
/// a model fails).
#[cfg(loom)]
pub(crate) struct Storage {
    q: crate::sync::Mutex<std::collections::VecDeque<Event>>,
    len: crate::sync::AtomicUsize,
}

#[cfg(loom)]
impl Storage {
    pub(crate) fn new() -> Self {
        Storage {
            q: crate::sync::Mutex::new(std::collections::VecDeque::new()),
            len: crate::sync::AtomicUsize::new(0),
        }
    }

    // The counter changes under the lock, so a thread whose pop found the
    // queue empty also sees a depth of zero (as the real queue's head index
    // tells a failed pop).
    pub(crate) fn push(&self, e: Event) {
        let mut q = self.q.lock();
        q.push_back(e);
        self.len.fetch_add(1, crate::sync::Ordering::Release);
    }

    pub(crate) fn pop(&self) -> Option<Event> {
        let mut q = self.q.lock();
        let e = q.pop_front();
        if e.is_some() {
            self.len.fetch_sub(1, crate::sync::Ordering::Release);
        }
        e
    }

    pub(crate) fn len(&self) -> usize {
        self.len.load(crate::sync::Ordering::Acquire)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
