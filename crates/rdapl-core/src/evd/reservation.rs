//! Reservations: the slot of one DTO completion, taken at post time.
//!
//! A [`Reservation`] is spent exactly once, by
//! [`EvdProducer::complete`](super::EvdProducer::complete),
//! [`complete_unsignalled`](super::EvdProducer::complete_unsignalled) or
//! [`release`](super::EvdProducer::release) on the EVD it was made on.
//! Guarantees:
//!
//! * Spent on another EVD, it is refused in every build and handed back
//!   ([`Misdirected`]); nothing is published.
//! * Dropped unspent (an endpoint dropped, never freed, with requests
//!   queued; a `Misdirected` discarded; a provider that lost a work
//!   request), its slot comes back to its own EVD, so capacity is never
//!   lost for good, and the EVD counts it in
//!   `EvdParam::dropped_reservations`: the completion it stood for was
//!   never delivered.
//!
//! Dropping is the cold path: it finds the EVD through a table of live
//! EVDs by handle (taken under a lock at create, at the last handle's drop
//! and when a reservation is dropped), so spending a reservation costs
//! nothing extra. Under `rdapl_loom` the table is absent and a dropped
//! reservation is only counted nowhere; the models spend every one.

use super::EvdInner;
use crate::error::Error;
use crate::event::{EvdHandle, Event};
use crate::sync::Arc;
#[cfg(not(rdapl_loom))]
use crate::sync::Ordering;

/// A slot reserved for one DTO completion. Obtained at post time from
/// [`EvdProducer::reserve`](super::EvdProducer::reserve); consumed by
/// [`EvdProducer::complete`](super::EvdProducer::complete) or
/// [`EvdProducer::release`](super::EvdProducer::release). Dropped unspent,
/// it gives its slot back (see the module docs).
#[must_use = "a reservation holds EVD capacity until completed or released"]
#[derive(Debug)]
pub struct Reservation {
    evd: EvdHandle,
}

impl Reservation {
    #[inline]
    pub(super) fn new(evd: EvdHandle) -> Reservation {
        Reservation { evd }
    }

    /// The EVD this reservation was made on.
    #[inline]
    pub fn evd(&self) -> EvdHandle {
        self.evd
    }

    /// Marks the reservation spent (its slot now holds an event or was
    /// given back by the caller).
    #[inline]
    pub(super) fn spend(self) {
        std::mem::forget(self);
    }
}

impl Drop for Reservation {
    #[cold]
    fn drop(&mut self) {
        #[cfg(not(rdapl_loom))]
        if let Some(evd) = live::find(self.evd) {
            evd.dropped_reservations.fetch_add(1, Ordering::SeqCst);
            evd.released.fetch_add(1, Ordering::Release);
        }
    }
}

/// A reservation spent on an EVD it was not made on: refused, and handed
/// back (with the event) so that it can go to its own EVD. Publishing it
/// would fill a slot nobody reserved.
#[derive(Debug, thiserror::Error)]
#[error("the reservation was made on another EVD")]
pub struct Misdirected {
    /// The reservation, still valid on its own EVD.
    pub reservation: Reservation,
    /// The event that was to complete it (`None` for a release).
    pub event: Option<Event>,
}

impl Misdirected {
    #[cold]
    pub(super) fn new(reservation: Reservation, event: Option<Event>) -> Misdirected {
        Misdirected { reservation, event }
    }
}

impl From<Misdirected> for Error {
    /// `InvalidParameter` for argument 1. The reservation is dropped, so
    /// its slot goes back to its own EVD.
    fn from(_: Misdirected) -> Error {
        Error::param(1, "the reservation was made on another EVD")
    }
}

/// Enters a new EVD in the table of live EVDs.
pub(super) fn register(evd: &Arc<EvdInner>) {
    #[cfg(not(rdapl_loom))]
    live::insert(evd);
    #[cfg(rdapl_loom)]
    let _ = evd;
}

impl Drop for EvdInner {
    fn drop(&mut self) {
        #[cfg(not(rdapl_loom))]
        live::remove(self.id);
    }
}

#[cfg(not(rdapl_loom))]
mod live {
    use super::EvdInner;
    use crate::event::EvdHandle;
    use parking_lot::Mutex;
    use std::collections::HashMap;
    use std::sync::{Arc, Weak};

    static LIVE: Mutex<Option<HashMap<EvdHandle, Weak<EvdInner>>>> = Mutex::new(None);

    pub(super) fn insert(evd: &Arc<EvdInner>) {
        LIVE.lock()
            .get_or_insert_with(HashMap::new)
            .insert(evd.id, Arc::downgrade(evd));
    }

    pub(super) fn remove(id: EvdHandle) {
        if let Some(m) = LIVE.lock().as_mut() {
            m.remove(&id);
        }
    }

    pub(super) fn find(id: EvdHandle) -> Option<Arc<EvdInner>> {
        LIVE.lock().as_ref()?.get(&id)?.upgrade()
    }
}
