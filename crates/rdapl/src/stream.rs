//! An async [`Stream`](futures_core::Stream) of EVD events (feature `stream`).
//!
//! `poll_next` claims an event or, in the same compare-and-swap, arms the
//! stream's waker slot when the EVD is empty: the arm-then-recheck protocol
//! of the rest of the EVD, so an event published between "empty" and
//! "armed" always wakes the task. The stream ends when the EVD is freed.

use crate::error::{Error, Result};
use crate::evd::Evd;
use crate::event::Event;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A `Stream` of the events of one EVD. Items are `Ok(event)`, or an error
/// if a `wait` call owns the EVD at that moment.
#[derive(Debug, Clone)]
pub struct EvdStream {
    evd: Evd,
}

impl Evd {
    /// An async stream of this EVD's events.
    pub fn stream(&self) -> EvdStream {
        EvdStream { evd: self.clone() }
    }
}

impl futures_core::Stream for EvdStream {
    type Item = Result<Event>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        // Register first, then claim-or-arm atomically: a producer that
        // publishes after the arm finds STREAM_ARMED and wakes this waker.
        *self.evd.inner.stream_waker.lock() = Some(cx.waker().clone());
        match self.evd.claim_or_arm_stream() {
            Ok(Some(ev)) => Poll::Ready(Some(Ok(ev))),
            Ok(None) => Poll::Pending,
            Err(Error::InvalidHandle(_)) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(e))),
        }
    }
}
