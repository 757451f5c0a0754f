//! The in-process link between two connected endpoints: what each side
//! keeps of the other under its own lock, and the end of the connection
//! on both sides at once.
//!
//! A side's [`Link`] lives in the core's per-connection slot
//! ([`EpCore::link`]): it is set on both sides, under both locks, when a
//! request is accepted, and the core drops it whenever that side leaves
//! the connection. An endpoint with a link is in a connection with the
//! peer it names. Two endpoints are always locked in handle order.

use rdapl_core::event::{ConnectionEventKind, PzHandle};
use rdapl_core::provider::soft::KeyCache;
use rdapl_core::provider::{EpInner, EpLock, IaInner};
use std::any::Any;
use std::sync::{Arc, Weak};
use std::time::Instant;

/// One side's state of an in-process connection. Written by every send
/// of its side: aligned to its own pair of cache lines, so the two sides'
/// links (allocated together at the accept) never share one.
#[repr(align(128))]
pub(crate) struct Link {
    /// The connected peer.
    pub(crate) peer: Weak<EpInner>,
    /// The peer's registration table and protection zone (what an RDMA
    /// request needs of it).
    pub(crate) peer_ia: Arc<IaInner>,
    pub(crate) peer_pz: PzHandle,
    /// Resolved keys of this side's own IA, for its requests.
    pub(crate) keys: KeyCache,
    /// Resolved keys of the peer's IA (RDMA targets).
    pub(crate) peer_keys: KeyCache,
    /// The head send waits for a receive until this instant.
    pub(crate) rnr_deadline: Option<Instant>,
    /// Addresses the next send to the peer will probably touch (its head
    /// receive, the lock of its receive region), recorded by the last
    /// send: prefetch hints only, never dereferenced (0: none).
    pub(crate) hints: [usize; 2],
    /// Like `hints`, a line the next send will only read: the header of
    /// the head receive's owned buffer (0: none).
    pub(crate) read_hint: usize,
}

impl Link {
    /// This side's link to `peer`.
    pub(crate) fn to(peer: &Arc<EpInner>) -> Box<Link> {
        Box::new(Link {
            peer: Arc::downgrade(peer),
            peer_ia: peer.ia.clone(),
            peer_pz: peer.pz_handle(),
            keys: KeyCache::default(),
            peer_keys: KeyCache::default(),
            rnr_deadline: None,
            hints: [0; 2],
            read_hint: 0,
        })
    }

    /// The connected peer, if it is still there.
    #[inline(always)]
    pub(crate) fn peer(&self) -> Option<Arc<EpInner>> {
        self.peer.upgrade()
    }

    /// True if this link is to `b`.
    pub(crate) fn is_to(&self, b: &Arc<EpInner>) -> bool {
        std::ptr::eq(self.peer.as_ptr(), Arc::as_ptr(b))
    }
}

/// The link in an endpoint's slot (`&mut c.link`, its lock held), if it
/// is in a connection.
#[inline(always)]
pub(crate) fn of(slot: &mut Option<Box<dyn Any + Send>>) -> Option<&mut Link> {
    slot.as_mut()?.downcast_mut::<Link>()
}

/// The connected peer of `ep`, if any (takes `ep`'s lock).
pub(crate) fn peer_of(ep: &EpInner) -> Option<Arc<EpInner>> {
    of(&mut ep.core.lock().link).and_then(|l| l.peer())
}

/// Locks `a` and `b` in handle order.
pub(crate) fn lock_pair<'a>(a: &'a EpInner, b: &'a EpInner) -> (EpLock<'a>, EpLock<'a>) {
    if a.id <= b.id {
        let ga = a.core.lock();
        let gb = b.core.lock();
        (ga, gb)
    } else {
        let gb = b.core.lock();
        let ga = a.core.lock();
        (ga, gb)
    }
}

/// Ends the connection of `a` on both sides: states to `Disconnected`,
/// every outstanding request flushed, and `kind` (default `Broken`) raised
/// on both connection EVDs. Idempotent per side.
///
/// Both sides leave the connection under both endpoints' locks, before
/// either is flushed or told ([`EpInner::leave`]): nothing of either side
/// (a send, an RDMA copy into the other's memory, a receive landing) can
/// run while one side is out of the connection and the other still in it.
/// A request already executing holds its endpoint's lock, so it finishes
/// first (as a transfer in flight does on a wire). The peer leaves only if
/// it is still in this same connection (its connection number), never a
/// later one.
pub(crate) fn break_both(
    a: &EpInner,
    peer: Option<&Arc<EpInner>>,
    kind: Option<ConnectionEventKind>,
) {
    let kind = kind.unwrap_or(ConnectionEventKind::Broken);
    let peer = peer.filter(|p| !std::ptr::eq(&***p, a));
    let (mine, theirs) = match peer {
        Some(p) => {
            let (mut ca, mut cb) = lock_pair(a, p);
            let same = cb.conn == ca.conn;
            let mine = a.leave(&mut ca);
            let theirs = same && p.leave(&mut cb);
            (mine, theirs)
        }
        None => (a.leave(&mut a.core.lock()), false),
    };
    if mine {
        a.flush_all();
        a.connection_event(kind, None);
    }
    #[cfg(test)]
    if let Some(f) = test_hooks::BREAK_GAP.with(|h| h.borrow_mut().take()) {
        f();
    }
    if let (Some(p), true) = (peer, theirs) {
        p.flush_all();
        p.connection_event(kind, None);
    }
}

/// Ends `a`'s connection on both sides ([`break_both`]), its peer read
/// from its link.
pub(crate) fn break_link(a: &EpInner, kind: Option<ConnectionEventKind>) {
    let peer = peer_of(a);
    break_both(a, peer.as_ref(), kind);
}

#[cfg(test)]
pub(crate) mod test_hooks {
    use std::cell::RefCell;

    thread_local! {
        /// Run (once) by [`super::break_both`] on this thread, once both
        /// sides left the connection and the first one was flushed and
        /// told, before the second one is.
        pub(crate) static BREAK_GAP: RefCell<Option<Box<dyn FnOnce()>>> =
            const { RefCell::new(None) };
    }
}
