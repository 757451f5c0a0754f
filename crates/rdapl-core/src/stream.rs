//! An async [`Stream`](futures_core::Stream) of EVD events (feature `stream`).
//!
//! `poll_next` claims an event or, in the same compare-and-swap, arms the
//! EVD's stream flag when it is empty: the arm-then-recheck protocol of the
//! rest of the EVD, so an event published between "empty" and "armed"
//! always wakes the task. The stream ends when the EVD is freed.
//!
//! Any number of streams may read one EVD (`stream()` again, or `clone`):
//! each keeps its own waker in the EVD, and an arrival wakes all of them
//! (each event still goes to exactly one). Wakers are always called after
//! the EVD's locks are released, so a waker may poll the stream inline.

use crate::error::{Error, Result};
use crate::evd::Evd;
use crate::event::Event;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// The wakers of the streams parked on one EVD, by stream.
#[derive(Default)]
pub(crate) struct Wakers(Vec<(u64, Waker)>);

impl Wakers {
    /// Records (or replaces) stream `id`'s waker.
    fn register(&mut self, id: u64, waker: &Waker) {
        match self.0.iter_mut().find(|(i, _)| *i == id) {
            Some((_, w)) if w.will_wake(waker) => {}
            Some((_, w)) => w.clone_from(waker),
            None => self.0.push((id, waker.clone())),
        }
    }

    /// Takes every waker, to be woken once the lock is released.
    pub(crate) fn take(&mut self) -> Vec<(u64, Waker)> {
        std::mem::take(&mut self.0)
    }
}

/// Wakes what [`Wakers::take`] returned (call with no lock held).
pub(crate) fn wake_all(wakers: Vec<(u64, Waker)>) {
    for (_, w) in wakers {
        w.wake();
    }
}

/// A `Stream` of the events of one EVD. Items are `Ok(event)`, or an error
/// if a `wait` call owns the EVD at that moment. Cloning gives another
/// stream of the same EVD, with its own waker.
#[derive(Debug)]
pub struct EvdStream {
    evd: Evd,
    id: u64,
}

fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl Evd {
    /// An async stream of this EVD's events.
    pub fn stream(&self) -> EvdStream {
        EvdStream {
            evd: self.clone(),
            id: next_id(),
        }
    }
}

impl Clone for EvdStream {
    fn clone(&self) -> Self {
        self.evd.stream()
    }
}

impl Drop for EvdStream {
    fn drop(&mut self) {
        self.evd
            .inner
            .stream_wakers
            .lock()
            .0
            .retain(|(i, _)| *i != self.id);
    }
}

impl futures_core::Stream for EvdStream {
    type Item = Result<Event>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        // Register first, then claim-or-arm atomically: a producer that
        // publishes after the arm finds STREAM_ARMED and wakes this waker.
        self.evd
            .inner
            .stream_wakers
            .lock()
            .register(self.id, cx.waker());
        match self.evd.claim_or_arm_stream() {
            Ok(Some(ev)) => Poll::Ready(Some(Ok(ev))),
            Ok(None) => Poll::Pending,
            Err(Error::InvalidHandle(_)) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(e))),
        }
    }
}
