//! The endpoint's mutable state ([`EpCore`]) and its receive queue, a
//! two-lock queue: a taking end ([`RecvQueue`]) and a posting end
//! ([`PostedRecvs`]).
//!
//! Each part has its own lock, and they are taken in one order: the
//! endpoint's, the taking end's, the posting end's. Receives move from the
//! posting end to the taking end in batches, never one by one. Every
//! receive that leaves for good is counted in [`RecvQueue::taken`].

use super::{EpInner, EpState, RecvWr, Wr};
use std::any::Any;
use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Mutable endpoint state, under the endpoint's lock. A provider that
/// locks two endpoints takes them in handle order. A provider reads and
/// changes it through its methods (the provider's view); an in-process
/// provider (see [`crate::provider::soft`]) works on its public fields,
/// keeping the invariants each one states, and keeps its own state of the
/// connection in [`EpCore::link`].
///
/// In declaration order: what a peer's progress reads here (the state)
/// comes first, on the lock's cache line.
#[repr(C)]
pub struct EpCore {
    /// The endpoint's state (change it with [`EpInner::set_state`], which
    /// also tells the posters).
    pub state: EpState,
    /// The connection this endpoint's requests belong to (a number unique
    /// in the process, set on both sides when it is established; stale once
    /// it ends): a send lands only in a receive queue of the same
    /// connection ([`RecvQueue::conn`]).
    pub conn: u64,
    /// The request queue: requests posted and not yet executed, in order.
    pub sends: VecDeque<Wr>,
    /// The remote IA address and connection qualifier, once connecting.
    pub remote: Option<(IpAddr, u64)>,
    /// The endpoint's latest active connection attempt (numbered by
    /// [`crate::Ep::connect`] as it moves the endpoint to
    /// `ActiveConnectionPending`): a provider acts for an attempt only
    /// while it is still this one ([`EpCore::is_attempt`]).
    pub attempt: Attempt,
    /// Active side: the connection request in flight.
    pub pending_cr: Option<Arc<crate::sp::CrInner>>,
    /// Private data received from the peer (accept on the active side).
    pub peer_private: Option<Box<[u8]>>,
    /// The provider's state of the connection this endpoint is in or is
    /// making (for an in-process provider, the peer endpoint and its
    /// memory; for a network provider, its connection object), under the
    /// endpoint's lock: set by the provider, dropped by the core whenever
    /// the endpoint leaves a connection or an attempt
    /// ([`EpInner::leave`], any move to `Disconnected`), on reset and on
    /// free. The core never looks inside. A provider sets it only while
    /// the endpoint is connecting or connected.
    pub link: Option<Box<dyn Any + Send>>,
}

/// One active connection attempt of one endpoint. [`crate::Ep::connect`]
/// numbers each attempt it hands the provider
/// ([`crate::provider::EpOps::connect`]); the provider reports its outcome
/// under that number ([`EpInner::established`](crate::provider::EpInner::established),
/// [`EpInner::connect_failed`](crate::provider::EpInner::connect_failed)),
/// so that an attempt the consumer withdrew (a disconnect, then a reset
/// and a new connect, on other threads) neither starts late nor settles
/// the attempt that replaced it. Only the core makes them.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Attempt(u64);

impl Attempt {
    /// The attempt after this one.
    pub(crate) fn next(self) -> Attempt {
        Attempt(self.0.wrapping_add(1))
    }
}

/// The receive queue of an endpoint, the taking end of a two-lock queue
/// (after Michael and Scott): posters append to [`PostedRecvs`] under its
/// lock, and whoever takes receives (the peer's sends, a flush, a reset)
/// works here under this one, moving the posted receives over when this
/// queue runs dry. With the usual traffic each lock thus stays with one
/// thread: this one with the peer's sender, the posters' with the
/// endpoint's own thread, and the receives move between them in batches.
///
/// Lock order: an endpoint's lock, then this one, then [`PostedRecvs`]'
/// (locks of two endpoints are taken before any receive queue's); a poster
/// takes the posters' lock alone.
pub struct RecvQueue {
    /// The connection the posted receives belong to: set with
    /// [`EpCore::conn`] when it is established, cleared (0, no connection)
    /// when it breaks and on reset, under this lock. A peer's send checks it
    /// under this lock against its own `EpCore::conn` before it takes a
    /// receive: a send of a connection that ended on this side (the peer
    /// not yet told) never lands in a receive posted for the next one.
    pub conn: u64,
    /// The oldest posted receives, in order (all of them older than those
    /// still in [`PostedRecvs`]).
    pub recvs: VecDeque<RecvWr>,
    /// Receives that left the endpoint for good (taken by a send, flushed,
    /// dropped by a reset), ever; published to posters in
    /// the endpoint's own count (by [`EpInner::publish_taken`]) before this
    /// lock is released.
    pub taken: u64,
    /// Resolved keys of this endpoint's IA for its receive buffers (as the
    /// peer's sends resolve them).
    pub keys: crate::mem::KeyCache,
}

impl RecvQueue {
    /// Makes sure the oldest posted receive, if any, is at the head of this
    /// queue (moved over from `posted` if this queue is empty).
    /// `mark_wanted`: if there is none, set
    /// `recv_wanted` (see [`EpInner::recv_wanted`]) before the posters'
    /// lock is released, so that a receive posted from then on kicks the
    /// peer's progress.
    #[inline]
    pub fn refill(&mut self, ep: &EpInner, mark_wanted: bool) {
        if !self.recvs.is_empty() {
            return;
        }
        let mut posted = ep.posted.lock();
        // This queue is empty: the posted receives become this queue by a
        // swap of the two buffers (no receive is copied), and the posters
        // go on in this queue's empty one.
        std::mem::swap(&mut self.recvs, &mut posted.recvs);
        if self.recvs.is_empty() && mark_wanted {
            ep.recv_wanted.store(true, Ordering::Relaxed);
        }
    }

    /// Takes the oldest posted receive for good (see [`RecvQueue::refill`]).
    #[inline]
    pub fn pop(&mut self) -> Option<RecvWr> {
        let r = self.recvs.pop_front()?;
        self.taken += 1;
        Some(r)
    }

    /// Puts back a receive [`RecvQueue::pop`] took, at the head.
    pub fn unpop(&mut self, r: RecvWr) {
        self.recvs.push_front(r);
        self.taken -= 1;
    }

    /// Takes every posted receive, oldest first, for a flush or a reset
    /// (the posting end locked too: `posted`; the caller publishes
    /// [`RecvQueue::taken`]).
    pub(super) fn drain_all(&mut self, posted: &mut PostedRecvs) -> Vec<RecvWr> {
        let mut all: Vec<RecvWr> = self.recvs.drain(..).collect();
        all.extend(posted.recvs.drain(..));
        self.taken += all.len() as u64;
        all
    }
}

/// The posting end of an endpoint's receive queue (see [`RecvQueue`]).
pub struct PostedRecvs {
    /// The endpoint's state while it refuses receives (`DisconnectPending`,
    /// `Disconnected`), else `None`: set with the state under this lock
    /// (see [`EpInner::set_state`]), which `post_recv` holds from this
    /// check to the append, so a receive is either queued before a state
    /// change that refuses receives (and the flush after it finds it) or
    /// refused.
    pub(crate) refused: Option<EpState>,
    /// Receives posted and not yet moved to [`RecvQueue`], in order.
    pub(crate) recvs: VecDeque<RecvWr>,
    /// Receives ever posted.
    pub(super) total: u64,
    /// The last value of [`EpInner::taken`] read here: outstanding receives
    /// are at most `total - taken_seen`, and the published count is read
    /// again only when that reaches the queue's length.
    pub(super) taken_seen: u64,
}
