//! Event storage: a FIFO of events held by value.
//!
//! Normal builds use crossbeam's lock-free segmented queue; loom builds use a
//! modelled mutex around a `VecDeque`, since loom cannot see inside
//! crossbeam. Both are linearizable FIFOs, which is all the EVD relies on:
//! the state word decides who may pop, storage only keeps the order.
//!
//! Invariant kept by the EVD: an event is pushed *before* it is published
//! (counted in the state word) and a consumer pops only after claiming a
//! published event, so at every claim storage holds at least one fully
//! pushed event that nobody else will take.

use crate::event::Event;

#[cfg(not(loom))]
pub(crate) struct Storage(crossbeam_queue::SegQueue<Event>);

#[cfg(not(loom))]
impl Storage {
    pub(crate) fn new() -> Self {
        Storage(crossbeam_queue::SegQueue::new())
    }

    pub(crate) fn push(&self, e: Event) {
        self.0.push(e)
    }

    /// Pops an event the caller has claimed (see the invariant above).
    pub(crate) fn pop_claimed(&self) -> Event {
        loop {
            if let Some(e) = self.0.pop() {
                return e;
            }
            // Unreachable while the invariant holds; yield rather than spin
            // hot if a future change ever breaks it.
            debug_assert!(false, "claimed an event that is not in storage");
            crate::sync::spin_yield();
        }
    }
}

#[cfg(loom)]
pub(crate) struct Storage(crate::sync::Mutex<std::collections::VecDeque<Event>>);

#[cfg(loom)]
impl Storage {
    pub(crate) fn new() -> Self {
        Storage(crate::sync::Mutex::new(std::collections::VecDeque::new()))
    }

    pub(crate) fn push(&self, e: Event) {
        self.0.lock().push_back(e)
    }

    pub(crate) fn pop_claimed(&self) -> Event {
        self.0
            .lock()
            .pop_front()
            .expect("claimed an event that is not in storage")
    }
}
