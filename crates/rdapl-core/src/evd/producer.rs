//! The producing side of an EVD: what providers call to complete work
//! requests and post events. It is a trait, [`EvdProducer`], not methods of
//! [`Evd`]: a consumer that does not import it cannot forge a completion or
//! spend a reservation by accident.
//!
//! ```compile_fail
//! // A consumer's `Evd` has no producer methods in scope.
//! let evd = rdapl::Evd::create(4, rdapl::EvdFlags::DTO).unwrap();
//! let r = evd.reserve();
//! ```
//!
//! ```
//! // A provider (or a benchmark of the EVD itself) imports the trait.
//! use rdapl::evd::EvdProducer;
//! let evd = rdapl::Evd::create(4, rdapl::EvdFlags::SOFTWARE).unwrap();
//! let r = evd.reserve().unwrap();
//! evd.complete(r, rdapl::Event::Software(1)).unwrap();
//! assert_eq!(evd.dequeue().unwrap(), Some(rdapl::Event::Software(1)));
//! ```

use super::state::FREED;
use super::{Evd, Feeder, Misdirected, Overflowed, Reservation, publish};
use crate::error::{Error, Result, Subtype};
use crate::event::Event;
use crate::sync::{Arc, Ordering};

/// The producing side of an EVD (for providers; see the module docs).
pub trait EvdProducer {
    /// Reserves the slot for one DTO completion, at post time. Fails with
    /// `InsufficientResources(ResourceTevd)` if the EVD could not take the
    /// completion, so the work request is refused before anything happens.
    fn reserve(&self) -> Result<Reservation>;

    /// Completes a reservation with its event. Never drops: the slot was
    /// reserved. (A completion for a freed EVD is unreachable and dropped
    /// with it.) A reservation made on another EVD is refused in every
    /// build, and handed back with the event ([`Misdirected`], which
    /// converts to `InvalidParameter` for argument 1).
    fn complete(&self, res: Reservation, event: Event) -> std::result::Result<(), Misdirected>;

    /// Completes a reservation without notification: the event is queued
    /// (dequeue, a later waiter or a later upcall run will see it) but
    /// wakes nobody (DAT's unsignalled and solicited-wait receives).
    /// Refused as [`EvdProducer::complete`] is for another EVD's reservation.
    fn complete_unsignalled(
        &self,
        res: Reservation,
        event: Event,
    ) -> std::result::Result<(), Misdirected>;

    /// Returns an unused reservation (e.g. a suppressed successful
    /// completion). Refused as [`EvdProducer::complete`] is for another EVD's
    /// reservation.
    fn release(&self, res: Reservation) -> std::result::Result<(), Misdirected>;

    /// Posts an event of a stream that cannot be refused at the source
    /// (connection requests, connection events, asynchronous errors). If the
    /// EVD is full the event is counted as an overflow and, once per
    /// overflow episode, an `EvdOverflow` naming this EVD is posted to the
    /// async EVD. An episode ends as soon as a slot is given back (a
    /// consumer took an event, a reservation was released) or the EVD is
    /// resized: the next loss is reported again. Posting to a freed EVD
    /// counts as an overflow too.
    fn post_event(&self, event: Event) -> std::result::Result<(), Overflowed>;

    /// Registers an endpoint or service point that feeds this EVD; `free` is
    /// refused until the returned guard is dropped.
    fn feeder(&self) -> Feeder;
}

impl Evd {
    /// [`EvdProducer::reserve`] without the refusal's pause, for the
    /// core's posts, which reserve under an endpoint's or SRQ's lock: they
    /// pause (`refused_pause`) once they let go of it, or not at all.
    #[inline]
    pub(crate) fn reserve_now(&self) -> Result<Reservation> {
        // A freed EVD has queue length 0, so this fails for it too.
        if self.inner.take_slots(1) {
            Ok(Reservation::new(self.inner.id))
        } else {
            self.inner.check_live()?;
            Err(Error::InsufficientResources {
                resource: Subtype::ResourceTevd,
                what: "completion EVD is full (queued plus outstanding completions)",
            })
        }
    }
}

impl EvdProducer for Evd {
    #[inline]
    fn reserve(&self) -> Result<Reservation> {
        let r = self.reserve_now();
        if r.is_err() {
            super::refused_pause();
        }
        r
    }

    #[inline]
    fn complete(&self, res: Reservation, event: Event) -> std::result::Result<(), Misdirected> {
        if res.evd() != self.inner.id {
            return Err(Misdirected::new(res, Some(event)));
        }
        res.spend();
        publish(&self.inner, event);
        Ok(())
    }

    #[inline]
    fn complete_unsignalled(
        &self,
        res: Reservation,
        event: Event,
    ) -> std::result::Result<(), Misdirected> {
        if res.evd() != self.inner.id {
            return Err(Misdirected::new(res, Some(event)));
        }
        res.spend();
        self.inner.storage.push(event);
        Ok(())
    }

    #[inline]
    fn release(&self, res: Reservation) -> std::result::Result<(), Misdirected> {
        if res.evd() != self.inner.id {
            return Err(Misdirected::new(res, None));
        }
        res.spend();
        self.inner.released.fetch_add(1, Ordering::Release);
        Ok(())
    }

    #[inline]
    fn post_event(&self, event: Event) -> std::result::Result<(), Overflowed> {
        let inner = &self.inner;
        debug_assert!(
            inner.flags.accepts(event.stream()),
            "provider posted {:?} to an EVD without that stream",
            event.stream()
        );
        if !inner.load().has(FREED) && inner.take_slots(1) {
            publish(inner, event);
            return Ok(());
        }
        inner.overflows.fetch_add(1, Ordering::SeqCst);
        let mut reported = false;
        // The episode is named by the slots given back so far: the first
        // loss after a slot came back swaps in a new mark and reports.
        let mark = inner.freed().wrapping_add(1);
        if inner.overflow_mark.swap(mark, Ordering::SeqCst) != mark {
            let a = inner.async_evd.lock().clone();
            if let Some(a) = a
                && !Arc::ptr_eq(&a.inner, &self.inner)
            {
                reported = a
                    .post_event(Event::evd_overflow(inner.id, inner.context.get()))
                    .is_ok();
            }
        }
        Err(Overflowed { reported })
    }

    #[inline]
    fn feeder(&self) -> Feeder {
        self.inner.feeders.fetch_add(1, Ordering::SeqCst);
        Feeder { evd: self.clone() }
    }
}
