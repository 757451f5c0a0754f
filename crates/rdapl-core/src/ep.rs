//! Endpoints (reliable connected): the DAT endpoint state machine, work
//! request posting, and the provider-independent half of completion and
//! connection handling.
//!
//! # Guarantees
//!
//! * Posting checks the endpoint's state, the scatter/gather and size
//!   limits, and reserves the completion's slot on its EVD before the work
//!   request exists; a request that could not complete is refused at once.
//! * Work requests complete in the order they were posted on a queue.
//! * A DTO error breaks the connection (reliable-connected semantics): every
//!   outstanding request on both sides completes with `Flushed` and both
//!   sides get a `Broken` connection event. A disconnect flushes the same
//!   way and raises `Disconnected` on both sides.
//! * Every work request completes exactly once: with its status, flushed, or
//!   (for suppressed/unsignalled successes) silently released.

use crate::buf::{Buf, BufRefused};
use crate::error::{Error, Result, Subtype};
use crate::evd::{Evd, EvdProducer, Feeder, Reservation};
use crate::event::{
    ConnectionEvent, ConnectionEventKind, DtoCompletion, DtoOp, DtoStatus, EpHandle, Event,
};
use crate::ia::{Ia, IaInner};
use crate::mem::{LmrTriplet, MemPriv, Region, RmrTriplet};
use crate::pz::{Lmr, Pz, Rmr};
use crossbeam_utils::CachePadded;
use parking_lot::{Mutex, MutexGuard};
use std::collections::VecDeque;
use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Endpoint attributes (`DAT_EP_ATTR`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct EpAttr {
    /// Largest send/receive message.
    pub max_message_size: u64,
    /// Largest RDMA transfer.
    pub max_rdma_size: u64,
    /// Most outstanding receives.
    pub max_recv_dtos: usize,
    /// Most outstanding requests (sends, RDMA, binds).
    pub max_request_dtos: usize,
    /// Most scatter/gather entries per receive.
    pub max_recv_iov: usize,
    /// Most scatter/gather entries per request.
    pub max_request_iov: usize,
    /// Most RDMA reads in flight as target.
    pub max_rdma_read_in: usize,
    /// Most RDMA reads in flight as initiator.
    pub max_rdma_read_out: usize,
}

impl Default for EpAttr {
    fn default() -> Self {
        EpAttr {
            max_message_size: 1 << 30,
            max_rdma_size: 1 << 30,
            max_recv_dtos: 256,
            max_request_dtos: 256,
            max_recv_iov: 16,
            max_request_iov: 16,
            max_rdma_read_in: 16,
            max_rdma_read_out: 16,
        }
    }
}

/// `DAT_EP_STATE` (values as in `dat.h`).
#[allow(missing_docs)]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum EpState {
    Unconnected = 0,
    Reserved = 2,
    PassiveConnectionPending = 4,
    ActiveConnectionPending = 6,
    TentativeConnectionPending = 7,
    Connected = 9,
    DisconnectPending = 10,
    Disconnected = 11,
}

impl EpState {
    /// The `DAT_INVALID_STATE_EP_*` subtype naming this state.
    pub fn subtype(self) -> Subtype {
        match self {
            EpState::Unconnected => Subtype::InvalidStateEpUnconnected,
            EpState::Reserved => Subtype::InvalidStateEpReserved,
            EpState::PassiveConnectionPending => Subtype::InvalidStateEpPassconnpending,
            EpState::ActiveConnectionPending => Subtype::InvalidStateEpActconnpending,
            EpState::TentativeConnectionPending => Subtype::InvalidStateEpTentconnpending,
            EpState::Connected => Subtype::InvalidStateEpConnected,
            EpState::DisconnectPending => Subtype::InvalidStateEpDiscpending,
            EpState::Disconnected => Subtype::InvalidStateEpDisconnected,
        }
    }
}

/// `DAT_COMPLETION_FLAGS` of a posted work request.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct CompletionFlags(pub u32);

impl CompletionFlags {
    /// `DAT_COMPLETION_DEFAULT_FLAG`.
    pub const DEFAULT: CompletionFlags = CompletionFlags(0x00);
    /// `DAT_COMPLETION_SUPPRESS_FLAG`: no completion event if successful.
    pub const SUPPRESS: CompletionFlags = CompletionFlags(0x01);
    /// `DAT_COMPLETION_SOLICITED_WAIT_FLAG`: sender-controlled notification.
    /// On a send it marks the message solicited; on a receive, a successful
    /// completion is queued but notifies (upcall, waiter, CNO) only if the
    /// message that filled it was solicited.
    pub const SOLICITED_WAIT: CompletionFlags = CompletionFlags(0x02);
    /// `DAT_COMPLETION_UNSIGNALLED_FLAG`: on a request, no completion event
    /// if successful; on a receive, the successful completion is queued
    /// without notification.
    pub const UNSIGNALLED: CompletionFlags = CompletionFlags(0x04);
    /// `DAT_COMPLETION_BARRIER_FENCE_FLAG`: start only after earlier RDMA
    /// reads completed (always true: requests execute in order).
    pub const BARRIER_FENCE: CompletionFlags = CompletionFlags(0x08);

    /// True if every flag of `o` is set.
    pub fn contains(self, o: CompletionFlags) -> bool {
        self.0 & o.0 == o.0
    }
    /// Set by the provider on a receive filled by a solicited send.
    pub const SOLICITED_ARRIVAL: CompletionFlags = CompletionFlags(0x8000_0000);

    fn quiet_on_success(self) -> bool {
        self.0 & (Self::SUPPRESS.0 | Self::UNSIGNALLED.0) != 0
    }
}

impl std::ops::BitOr for CompletionFlags {
    type Output = CompletionFlags;
    fn bitor(self, rhs: CompletionFlags) -> CompletionFlags {
        CompletionFlags(self.0 | rhs.0)
    }
}

/// What a work request does. Small (the common requests are moved through
/// queues on the data path); the rare memory operations are boxed.
pub enum WrOp {
    /// A send.
    Send,
    /// A send that also invalidates the peer's key (RDMAP Send with
    /// Invalidate).
    SendInvalidate(u32),
    /// A receive.
    Recv,
    /// An RDMA write to the peer's memory.
    RdmaWrite(RmrTriplet),
    /// An RDMA read of the peer's memory.
    RdmaRead(RmrTriplet),
    /// A bind, fast-register map or invalidate.
    Local(Box<LocalOp>),
}

/// A work request that changes memory registrations (executed in order with
/// the endpoint's other requests).
pub enum LocalOp {
    /// Bind (or unbind, `len == 0`) a window; `new_ctx` is its next key.
    Bind {
        /// The window's LMR key and the triplet it binds (`None`: unbind).
        target: Option<(u32, LmrTriplet)>,
        /// The rights granted.
        privs: MemPriv,
        /// The window's next key.
        new_ctx: u32,
    },
    /// Map a fast-registration LMR onto a region.
    Fmr {
        /// The fast-registration LMR.
        lmr: Lmr,
        /// The region it maps.
        region: Arc<Region>,
        /// The rights granted.
        privs: MemPriv,
        /// The LMR's next key.
        new_ctx: u32,
    },
    /// Invalidate a fast-registration LMR: at execution its key becomes
    /// `new_ctx` (reserved at post time) and its mapping goes.
    Invalidate {
        /// The fast-registration LMR.
        lmr: Lmr,
        /// The LMR's next key.
        new_ctx: u32,
    },
}

impl WrOp {
    fn dto_op(&self) -> DtoOp {
        match self {
            WrOp::Send | WrOp::SendInvalidate(_) => DtoOp::Send,
            WrOp::Recv => DtoOp::Receive,
            WrOp::RdmaWrite(_) => DtoOp::RdmaWrite,
            WrOp::RdmaRead(_) => DtoOp::RdmaRead,
            WrOp::Local(l) => match **l {
                LocalOp::Bind { .. } => DtoOp::BindMw,
                LocalOp::Fmr { .. } => DtoOp::LmrFmr,
                LocalOp::Invalidate { .. } => DtoOp::LmrInvalidate,
            },
        }
    }

    /// Sets the key a local memory operation gives its object.
    fn set_new_ctx(&mut self, ctx: u32) {
        if let WrOp::Local(l) = self {
            match &mut **l {
                LocalOp::Bind { new_ctx, .. }
                | LocalOp::Fmr { new_ctx, .. }
                | LocalOp::Invalidate { new_ctx, .. } => *new_ctx = ctx,
            }
        }
    }
}

/// A posted work request. A provider reads it through its methods (the
/// provider's view); an in-process provider (see [`crate::provider::soft`])
/// may read its fields.
pub struct Wr {
    /// What it does.
    pub op: WrOp,
    /// Its scatter/gather list (empty for an owned buffer's request).
    pub iov: crate::mem::Iov,
    pub(crate) cookie: u64,
    pub(crate) flags: CompletionFlags,
    pub(crate) res: Reservation,
    /// An owned buffer (`post_send_buf`, or a receive's): the request's
    /// data instead of `iov` (its first `buf_len` bytes), handed back with
    /// the completion.
    pub(crate) buf: Option<Buf>,
    /// The bytes of `buf` a send carries.
    pub(crate) buf_len: usize,
}

/// The scatter/gather list of a queued receive (one entry inline).
pub type RecvIov = smallvec::SmallVec<[LmrTriplet; 1]>;

/// A posted receive as queued: one cache line, aligned (a sender on
/// another core reads exactly one line of it).
#[repr(align(64))]
pub struct RecvWr {
    /// Its scatter/gather list (empty for an owned buffer's receive).
    pub iov: RecvIov,
    /// Its cookie.
    pub cookie: u64,
    /// Its completion flags.
    pub flags: CompletionFlags,
    /// Its completion's reservation on the receive EVD.
    pub res: Reservation,
    /// An owned buffer (`post_recv_buf`) to receive into instead of `iov`
    /// (then empty), handed back with the completion.
    pub buf: Option<Buf>,
}

const _: () = assert!(std::mem::size_of::<RecvWr>() == 64);

impl From<RecvWr> for Wr {
    fn from(r: RecvWr) -> Wr {
        Wr {
            op: WrOp::Recv,
            iov: crate::mem::Iov::from_slice(&r.iov),
            cookie: r.cookie,
            flags: r.flags,
            res: r.res,
            buf: r.buf,
            // (Only a send carries bytes of its buffer.)
            buf_len: 0,
        }
    }
}

/// A request (not a receive) being posted, every check passed and its
/// completion reserved, handed to the transport under the endpoint's lock
/// (read through its methods, or its fields by an in-process provider).
/// Its scatter/gather list is still the
/// caller's: a request that completes at once is never copied into a
/// [`Wr`]; one that waits is copied into one and queued.
pub struct NewWr<'a> {
    /// What it does.
    pub op: WrOp,
    /// Its scatter/gather list, still the caller's.
    pub iov: &'a [LmrTriplet],
    pub(crate) cookie: u64,
    pub(crate) flags: CompletionFlags,
    pub(crate) res: Reservation,
    /// An owned buffer to send from instead of `iov` (see [`Wr::buf`]).
    pub(crate) buf: Option<Buf>,
    /// The bytes of `buf` the send carries.
    pub(crate) buf_len: usize,
}

impl NewWr<'_> {
    /// The request as queued.
    pub(crate) fn into_wr(self) -> Wr {
        Wr {
            op: self.op,
            iov: crate::mem::Iov::from_slice(self.iov),
            cookie: self.cookie,
            flags: self.flags,
            res: self.res,
            buf: self.buf,
            buf_len: self.buf_len,
        }
    }
}

/// A send or RDMA request as a transport executes it: queued ([`Wr`]) or
/// being posted ([`NewWr`]).
pub trait Request {
    /// Its scatter/gather list (empty for an owned buffer's request).
    fn iov(&self) -> &[LmrTriplet];
    /// The bytes it sends from its owned buffer, if it has one.
    fn src_buf(&self) -> Option<&[u8]>;
    /// Its completion flags.
    fn flags(&self) -> CompletionFlags;
    /// The peer's key it invalidates (a Send with Invalidate).
    fn invalidates(&self) -> Option<u32>;
    /// Completes it on `ep` with `status` and `len` bytes transferred.
    fn complete(self, ep: &EpInner, status: DtoStatus, len: u64);
}

impl Request for Wr {
    #[inline]
    fn iov(&self) -> &[LmrTriplet] {
        &self.iov
    }
    #[inline]
    fn src_buf(&self) -> Option<&[u8]> {
        self.buf.as_ref().map(|b| &b[..self.buf_len])
    }
    #[inline]
    fn flags(&self) -> CompletionFlags {
        self.flags
    }
    #[inline]
    fn invalidates(&self) -> Option<u32> {
        match self.op {
            WrOp::SendInvalidate(k) => Some(k),
            _ => None,
        }
    }
    #[inline]
    fn complete(self, ep: &EpInner, status: DtoStatus, len: u64) {
        ep.complete(self, status, len);
    }
}

impl Request for NewWr<'_> {
    #[inline]
    fn iov(&self) -> &[LmrTriplet] {
        self.iov
    }
    #[inline]
    fn src_buf(&self) -> Option<&[u8]> {
        self.buf.as_ref().map(|b| &b[..self.buf_len])
    }
    #[inline]
    fn flags(&self) -> CompletionFlags {
        self.flags
    }
    #[inline]
    fn invalidates(&self) -> Option<u32> {
        match self.op {
            WrOp::SendInvalidate(k) => Some(k),
            _ => None,
        }
    }
    #[inline]
    fn complete(self, ep: &EpInner, status: DtoStatus, len: u64) {
        let NewWr {
            op,
            cookie,
            flags,
            res,
            buf,
            ..
        } = self;
        let dto_op = op.dto_op();
        // Only a memory operation owns anything (checked here, inline: the
        // usual request needs no call to drop it).
        if let WrOp::Local(l) = op {
            drop(l);
        }
        ep.complete_parts(false, dto_op, cookie, flags, res, status, len, buf);
    }
}

/// Mutable endpoint state, under the endpoint's lock. Providers lock two
/// endpoints in handle order. A provider reads and changes it through its
/// methods (the provider's view); an in-process provider (see
/// [`crate::provider::soft`]) works on its public fields, keeping the
/// invariants each one states.
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
    /// In-process providers (the loopback): the connected peer.
    pub peer: Option<Weak<EpInner>>,
    /// In-process providers: the connected peer's registration table and protection
    /// zone (what an RDMA request needs of it), set and cleared with `peer`.
    pub peer_mem: Option<(Arc<IaInner>, crate::event::PzHandle)>,
    /// Resolved keys of this endpoint's IA for its own requests (its
    /// receive buffers' keys are cached in its [`RecvQueue`]).
    pub keys: crate::mem::KeyCache,
    /// Resolved keys of the peer's IA (RDMA targets); cleared with `peer_mem`.
    pub peer_keys: crate::mem::KeyCache,
    /// The remote IA address and connection qualifier, once connecting.
    pub remote: Option<(IpAddr, u64)>,
    /// The head send waits for a receive until this instant.
    pub rnr_deadline: Option<Instant>,
    /// Active side: the connection request in flight.
    pub pending_cr: Option<Arc<crate::sp::CrInner>>,
    /// Private data received from the peer (accept on the active side).
    pub peer_private: Option<Box<[u8]>>,
    /// Addresses the next send to the peer will probably touch (its head
    /// receive, the lock of its receive region), recorded by the last
    /// send: prefetch hints only, never dereferenced (0: none).
    pub peer_hints: [usize; 2],
    /// Like `peer_hints`, a line the next send will only read: the header
    /// of the head receive's owned buffer (0: none).
    pub peer_read_hint: usize,
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
    fn drain_all(&mut self, posted: &mut PostedRecvs) -> Vec<RecvWr> {
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
    total: u64,
    /// The last value of [`EpInner::taken`] read here: outstanding receives
    /// are at most `total - taken_seen`, and the published count is read
    /// again only when that reaches the queue's length.
    taken_seen: u64,
}

/// An endpoint. Cloning gives another handle to the same endpoint.
#[derive(Clone)]
pub struct Ep {
    pub(crate) inner: Arc<EpInner>,
}

/// The shared part of an endpoint (what providers work on).
pub struct EpInner {
    /// The consumer context (`DAT_CONTEXT`).
    pub(crate) context: crate::context::ContextSlot,
    /// The endpoint's handle: providers lock two endpoints in handle order.
    pub id: EpHandle,
    /// Its IA (its registration table: [`IaInner::mem`]).
    pub ia: Arc<IaInner>,
    pub(crate) pz: Pz,
    pub(crate) attr: EpAttr,
    /// Its receive EVD.
    pub recv_evd: Option<Evd>,
    pub(crate) request_evd: Option<Evd>,
    pub(crate) conn_evd: Option<Evd>,
    /// Its shared receive queue, if it takes receives from one.
    pub srq: Option<crate::srq::Srq>,
    feeders: Mutex<Vec<Feeder>>,
    /// Cache-padded: both threads of a connection take it on every
    /// transfer; the read-mostly fields above (and the `Arc`'s counts,
    /// which a peer's progress touches) stay out of its cache lines.
    pub core: CachePadded<Mutex<EpCore>>,
    /// The taking end of the receive queue (the peer's sends take
    /// receives under this lock alone; see [`RecvQueue`]).
    pub rq: CachePadded<Mutex<RecvQueue>>,
    /// The posting end of the receive queue: the endpoint's own posts take
    /// this lock, and besides them only state changes, flushes, resets and
    /// a peer's send whose end of the queue ran dry (see
    /// [`RecvQueue::refill`]).
    pub posted: CachePadded<Mutex<PostedRecvs>>,
    /// [`RecvQueue::taken`], published for posters (on a line of its own:
    /// the taking side writes it, posters read it only when the queue looks
    /// full).
    taken: CachePadded<AtomicU64>,
    /// Where this endpoint's next receive will probably be queued: a
    /// prefetch hint for `post_recv`, never dereferenced (0: none). On a
    /// line of its own: only the poster writes it.
    recv_hint: CachePadded<AtomicUsize>,
    /// In-process providers: the peer's head send found no receive here. Set by the
    /// peer's progress under both receive-queue locks (see
    /// [`RecvQueue::refill`]; a poster that takes the posters' lock after
    /// that reads it set), cleared under the receive queue's lock when a
    /// send finds a receive; a receive posted while it is clear needs no
    /// kick of the peer.
    pub recv_wanted: AtomicBool,
    freed: AtomicBool,
    /// Requests posted and not yet completed, wherever they are (the
    /// request queue, a provider's flight, a fault injector): what
    /// `max_request_dtos` bounds. Raised under the endpoint's lock before
    /// the transport sees the request, lowered by its completion.
    requests: CachePadded<AtomicUsize>,
    /// The provider's table for this endpoint (its own state of it inside).
    pub(crate) ops: Box<dyn crate::provider::EpOps>,
}

impl fmt::Debug for Ep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ep")
            .field("handle", &self.inner.id)
            .field("state", &self.inner.core.lock().state)
            .finish()
    }
}

/// What `Ep::query` reports (`DAT_EP_PARAM`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpParam {
    /// The endpoint's handle.
    pub handle: EpHandle,
    /// Current state.
    pub state: EpState,
    /// Attributes.
    pub attr: EpAttr,
    /// Remote IA address and connection qualifier, once connecting.
    pub remote: Option<(IpAddr, u64)>,
    /// Outstanding requests and receives.
    pub outstanding: (usize, usize),
    /// Private data the peer sent with its accept (active side).
    pub peer_private_data: Option<Box<[u8]>>,
}

fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A post refused because the endpoint is in `state`.
#[cold]
fn refused_in(state: EpState) -> Error {
    Error::state(
        state.subtype(),
        "the endpoint cannot take this work request now",
    )
}

/// A post refused because the endpoint's queue (send or receive) is full.
#[cold]
fn queue_full() -> Error {
    Error::InsufficientResources {
        resource: Subtype::ResourceTep,
        what: "the endpoint's queue is full",
    }
}

/// A new connection number ([`EpCore::conn`]): unique in the process, never 0.
pub fn next_conn() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Ep {
    pub(crate) fn create(
        ia: &Ia,
        pz: &Pz,
        recv_evd: Option<&Evd>,
        request_evd: Option<&Evd>,
        connect_evd: Option<&Evd>,
        attr: Option<EpAttr>,
        srq: Option<&crate::srq::Srq>,
    ) -> Result<Ep> {
        pz.check_live()?;
        if let Some(srq) = srq {
            if srq.inner.is_freed() || !Arc::ptr_eq(&srq.inner.ia, &ia.inner) {
                return Err(Error::InvalidHandle(Subtype::InvalidHandleSrq));
            }
        }
        if !Arc::ptr_eq(&pz.inner.ia, &ia.inner) {
            return Err(Error::InvalidHandle(Subtype::InvalidHandlePz));
        }
        let check = |e: Option<&Evd>, s: crate::event::EventStream, sub: Subtype| -> Result<()> {
            if let Some(e) = e {
                if e.is_freed() || !e.flags().accepts(s) {
                    return Err(Error::InvalidHandle(sub));
                }
            }
            Ok(())
        };
        use crate::event::EventStream as S;
        check(recv_evd, S::Dto, Subtype::InvalidHandleEvdRecv)?;
        check(request_evd, S::Dto, Subtype::InvalidHandleEvdRequest)?;
        check(connect_evd, S::Connection, Subtype::InvalidHandleEvdConn)?;
        let attr = attr.unwrap_or_default();
        let ia_attr = &ia.inner.attr;
        if attr.max_request_iov > ia_attr.max_iov_segments_per_dto
            || attr.max_recv_iov > ia_attr.max_iov_segments_per_dto
            || attr.max_recv_dtos > ia_attr.max_dto_per_ep
            || attr.max_request_dtos > ia_attr.max_dto_per_ep
            || attr.max_message_size > ia_attr.max_message_size
            || attr.max_rdma_size > ia_attr.max_rdma_size
        {
            return Err(Error::param(
                6,
                "endpoint attributes exceed the IA's limits",
            ));
        }
        let id = EpHandle(next_id());
        // The provider's table, before anything of the endpoint exists.
        let ops = ia.inner.transport.ep_create(&crate::provider::EpInfo {
            handle: id,
            pz: pz.inner.id,
            attr: &attr,
            srq: srq.map(|s| s.inner.id),
        })?;
        let feeders = [recv_evd, request_evd, connect_evd]
            .into_iter()
            .flatten()
            .map(|e| e.feeder_of(&ia.inner.async_evd))
            .collect();
        let inner = Arc::new(EpInner {
            context: crate::context::ContextSlot::new(),
            id,
            ia: ia.inner.clone(),
            pz: pz.clone(),
            attr,
            recv_evd: recv_evd.cloned(),
            request_evd: request_evd.cloned(),
            conn_evd: connect_evd.cloned(),
            srq: srq.cloned(),
            feeders: Mutex::new(feeders),
            core: CachePadded::new(Mutex::new(EpCore {
                state: EpState::Unconnected,
                conn: 0,
                peer: None,
                peer_mem: None,
                keys: Default::default(),
                peer_keys: Default::default(),
                remote: None,
                sends: VecDeque::new(),
                rnr_deadline: None,
                pending_cr: None,
                peer_private: None,
                peer_hints: [0; 2],
                peer_read_hint: 0,
            })),
            rq: CachePadded::new(Mutex::new(RecvQueue {
                conn: 0,
                recvs: VecDeque::new(),
                taken: 0,
                keys: Default::default(),
            })),
            posted: CachePadded::new(Mutex::new(PostedRecvs {
                refused: None,
                recvs: VecDeque::new(),
                total: 0,
                taken_seen: 0,
            })),
            taken: CachePadded::new(AtomicU64::new(0)),
            recv_hint: CachePadded::new(AtomicUsize::new(0)),
            recv_wanted: AtomicBool::new(false),
            freed: AtomicBool::new(false),
            requests: CachePadded::new(AtomicUsize::new(0)),
            ops,
        });
        pz.inner.users.fetch_add(1, Ordering::SeqCst);
        ia.inner.live.eps.fetch_add(1, Ordering::Relaxed);
        ia.inner.eps.lock().push(Arc::downgrade(&inner));
        if let Some(srq) = srq {
            srq.inner.eps.lock().push(Arc::downgrade(&inner));
        }
        Ok(Ep { inner })
    }

    /// The endpoint's handle.
    pub fn handle(&self) -> EpHandle {
        self.inner.id
    }

    /// Current state.
    pub fn state(&self) -> EpState {
        self.inner.core.lock().state
    }

    /// The endpoint's parameters (`dat_ep_query`).
    pub fn query(&self) -> Result<EpParam> {
        self.inner.check_live()?;
        let c = self.inner.core.lock();
        Ok(EpParam {
            handle: self.inner.id,
            state: c.state,
            attr: self.inner.attr,
            remote: c.remote,
            outstanding: (
                self.inner.requests.load(Ordering::Acquire),
                self.inner.outstanding_recvs(),
            ),
            peer_private_data: c.peer_private.clone(),
        })
    }

    /// Connects to `conn_qual` at `remote` (`dat_ep_connect`). The outcome
    /// arrives on the connection EVD: `Established` (with the accept's
    /// private data), `PeerRejected`, `NonPeerRejected`, `Unreachable` or
    /// `TimedOut` (`timeout: None` waits forever).
    pub fn connect(
        &self,
        remote: IpAddr,
        conn_qual: u64,
        timeout: Option<Duration>,
        private_data: &[u8],
    ) -> Result<()> {
        let inner = &self.inner;
        inner.check_live()?;
        if inner.conn_evd.is_none() {
            return Err(Error::state(
                Subtype::InvalidStateEpEvdConnect,
                "the endpoint has no connection EVD",
            ));
        }
        if private_data.len() > inner.ia.attr.max_private_data_size {
            return Err(Error::param(
                5,
                "private data larger than max_private_data_size",
            ));
        }
        {
            let mut c = inner.core.lock();
            if c.state != EpState::Unconnected {
                return Err(Error::state(
                    c.state.subtype(),
                    "connect needs an unconnected endpoint",
                ));
            }
            c.state = EpState::ActiveConnectionPending;
            c.remote = Some((remote, conn_qual));
        }
        let r = inner
            .ops
            .connect(inner, remote, conn_qual, private_data.to_vec(), timeout);
        if r.is_err() {
            let mut c = inner.core.lock();
            if c.state == EpState::ActiveConnectionPending {
                c.state = EpState::Unconnected;
                c.remote = None;
            }
        }
        r
    }

    /// Disconnects (`dat_ep_disconnect`). Outstanding requests and receives
    /// on both sides complete with `Flushed`; both connection EVDs get
    /// `Disconnected`. On a pending active connection it aborts the attempt.
    /// A no-op on an already disconnected endpoint.
    pub fn disconnect(&self, graceful: bool) -> Result<()> {
        let inner = &self.inner;
        inner.check_live()?;
        // The state is checked and changed under one hold of the lock: a
        // connection that breaks or is established meanwhile is not
        // overwritten.
        let mut c = inner.core.lock();
        match c.state {
            EpState::Connected | EpState::DisconnectPending => {
                inner.set_state(&mut c, EpState::DisconnectPending);
                drop(c);
                inner.ops.disconnect(inner, graceful);
                Ok(())
            }
            EpState::ActiveConnectionPending => {
                let cr = {
                    inner.set_state(&mut c, EpState::Disconnected);
                    let cr = c.pending_cr.take();
                    drop(c);
                    cr
                };
                if let Some(cr) = cr {
                    cr.cancel();
                }
                inner.flush_all();
                inner.connection_event(ConnectionEventKind::Disconnected, None);
                inner.ops.connect_cancel(inner);
                Ok(())
            }
            EpState::Disconnected => Ok(()),
            s => Err(Error::state(s.subtype(), "the endpoint is not connected")),
        }
    }

    /// Returns a disconnected endpoint to `Unconnected` (`dat_ep_reset`),
    /// flushing anything still posted.
    pub fn reset(&self) -> Result<()> {
        let inner = &self.inner;
        inner.check_live()?;
        let mut g = inner.core.lock();
        match g.state {
            EpState::Disconnected | EpState::Unconnected => {
                let wrs: Vec<Wr> = {
                    let c = &mut *g;
                    c.state = EpState::Unconnected;
                    c.peer = None;
                    c.peer_mem = None;
                    c.keys.clear();
                    c.peer_keys.clear();
                    c.remote = None;
                    c.rnr_deadline = None;
                    c.peer_private = None;
                    let mut rq = inner.rq.lock();
                    rq.conn = 0;
                    rq.keys.clear();
                    // Flushed, then open to receives again, in one hold of
                    // the posters' lock: a receive posted meanwhile is for
                    // the next connection, never flushed by this reset.
                    let recvs = {
                        let mut p = inner.posted.lock();
                        let recvs = rq.drain_all(&mut p);
                        p.refused = None;
                        recvs
                    };
                    inner.publish_taken(&rq);
                    c.sends
                        .drain(..)
                        .chain(recvs.into_iter().map(Wr::from))
                        .collect()
                };
                drop(g);
                for wr in wrs {
                    inner.complete(wr, DtoStatus::Flushed, 0);
                }
                Ok(())
            }
            s => {
                drop(g);
                Err(Error::state(
                    s.subtype(),
                    "reset needs a disconnected endpoint",
                ))
            }
        }
    }

    /// Frees the endpoint (`dat_ep_free`): an abrupt disconnect if needed,
    /// everything outstanding flushed, its EVDs released.
    pub fn free(&self) -> Result<()> {
        self.inner.check_live()?;
        // As `dapl_ep_free`: an endpoint an RSP owns, or one a connection
        // request is being accepted on, is freed after that is settled.
        let state = self.inner.core.lock().state;
        if matches!(
            state,
            EpState::Reserved
                | EpState::TentativeConnectionPending
                | EpState::PassiveConnectionPending
        ) {
            return Err(Error::state(
                state.subtype(),
                "free the RSP or settle the connection request first",
            ));
        }
        let ia = self.inner.ia.clone();
        self.inner.abort(&ia);
        Ok(())
    }

    /// Posts a receive (`dat_ep_post_recv`). Allowed before the connection
    /// is established.
    pub fn post_recv(&self, iov: &[LmrTriplet], cookie: u64, flags: CompletionFlags) -> Result<()> {
        self.inner.post_recv(iov, &mut None, cookie, flags)
    }

    /// Posts a receive into an owned buffer (see [`crate::buf`]): the
    /// buffer is the request's until its completion, which hands it back
    /// in [`DtoCompletion::buf`](crate::DtoCompletion::buf) (whatever the
    /// status), with the message in its first `transferred_length` bytes.
    /// Refused (the buffer back in the error) where [`Ep::post_recv`] would
    /// be, and also for a buffer of another protection zone, with
    /// `SUPPRESS` (the completion is the buffer's way back), or on an
    /// endpoint that takes its receives from a shared receive queue.
    pub fn post_recv_buf(
        &self,
        buf: Buf,
        cookie: u64,
        flags: CompletionFlags,
    ) -> std::result::Result<(), BufRefused> {
        let mut buf = Some(buf);
        match self.inner.post_recv(&[], &mut buf, cookie, flags) {
            Ok(()) => Ok(()),
            Err(error) => Err(BufRefused {
                error,
                buf: buf.expect("a refused post keeps its buffer"),
            }),
        }
    }

    /// Posts a send of the first `len` bytes of an owned buffer (see
    /// [`crate::buf`]): the buffer is the request's until its completion,
    /// which hands it back in [`DtoCompletion::buf`](crate::DtoCompletion::buf)
    /// whatever the status. Refused (the buffer back in the error) where
    /// [`Ep::post_send`] would be, and also for a buffer of another
    /// protection zone, `len` beyond the buffer, or with `SUPPRESS` or
    /// `UNSIGNALLED` (the completion is the buffer's way back).
    pub fn post_send_buf(
        &self,
        buf: Buf,
        len: usize,
        cookie: u64,
        flags: CompletionFlags,
    ) -> std::result::Result<(), BufRefused> {
        let mut buf = Some(buf);
        match self
            .inner
            .post_with(WrOp::Send, &[], (&mut buf, len), cookie, flags, |_| Ok(()))
        {
            Ok(()) => Ok(()),
            Err(error) => Err(BufRefused {
                error,
                buf: buf.expect("a refused post keeps its buffer"),
            }),
        }
    }

    /// Posts a send (`dat_ep_post_send`).
    pub fn post_send(&self, iov: &[LmrTriplet], cookie: u64, flags: CompletionFlags) -> Result<()> {
        self.inner.post(WrOp::Send, iov, cookie, flags)
    }

    /// Posts a send of `iov` that also invalidates `rmr_context` at the
    /// peer (`dat_ep_post_send_with_invalidate`; RDMAP's Send with
    /// Invalidate). When the message lands, the peer's window (or
    /// fast-registration LMR) of that key is unbound, so the key grants
    /// nothing from then on, and the receive completes as
    /// `ReceiveWithInvalidate` naming the key. A key that names nothing
    /// live of the peer endpoint's protection zone, or a plain LMR,
    /// moves no byte: `RemoteAccess` here, and the connection breaks.
    pub fn post_send_with_invalidate(
        &self,
        iov: &[LmrTriplet],
        rmr_context: u32,
        cookie: u64,
        flags: CompletionFlags,
    ) -> Result<()> {
        self.inner
            .post(WrOp::SendInvalidate(rmr_context), iov, cookie, flags)
    }

    /// Posts an RDMA write of `iov` to `remote` (`dat_ep_post_rdma_write`).
    /// A write of zero bytes moves nothing and, as on InfiniBand and iWARP,
    /// is not checked against the remote key (see the loopback provider's
    /// module docs, crate `rdapl-loopback`).
    pub fn post_rdma_write(
        &self,
        iov: &[LmrTriplet],
        remote: RmrTriplet,
        cookie: u64,
        flags: CompletionFlags,
    ) -> Result<()> {
        self.inner.post(WrOp::RdmaWrite(remote), iov, cookie, flags)
    }

    /// Posts an RDMA read of `remote` into `iov` (`dat_ep_post_rdma_read`).
    /// A read of zero bytes is treated as a write of zero bytes.
    pub fn post_rdma_read(
        &self,
        iov: &[LmrTriplet],
        remote: RmrTriplet,
        cookie: u64,
        flags: CompletionFlags,
    ) -> Result<()> {
        self.inner.post(WrOp::RdmaRead(remote), iov, cookie, flags)
    }

    /// Binds `rmr` to `target` (a range of `lmr`) with remote rights
    /// `privs` (`dat_rmr_bind`). Returns the window's new `rmr_context`,
    /// valid once the bind completes (a `BindMw` DTO on the request EVD);
    /// the previous context dies at once.
    pub fn post_rmr_bind(
        &self,
        rmr: &Rmr,
        lmr: &Lmr,
        target: LmrTriplet,
        privs: MemPriv,
        cookie: u64,
        flags: CompletionFlags,
    ) -> Result<u32> {
        self.rmr_rebind(rmr, Some((lmr, target)), privs, cookie, flags)
    }

    /// Unbinds `rmr` (a bind of length zero). Returns its new context.
    pub fn post_rmr_unbind(&self, rmr: &Rmr, cookie: u64, flags: CompletionFlags) -> Result<u32> {
        self.rmr_rebind(rmr, None, MemPriv::NONE, cookie, flags)
    }

    fn rmr_rebind(
        &self,
        rmr: &Rmr,
        target: Option<(&Lmr, LmrTriplet)>,
        privs: MemPriv,
        cookie: u64,
        flags: CompletionFlags,
    ) -> Result<u32> {
        let inner = &self.inner;
        let mem = &inner.ia.mem;
        let old = rmr.context()?;
        if !Arc::ptr_eq(&rmr.inner.pz.inner, &inner.pz.inner) {
            return Err(Error::ProtectionViolation(Subtype::NoSubtype));
        }
        if privs.contains(MemPriv::LOCAL_READ) || privs.contains(MemPriv::LOCAL_WRITE) {
            return Err(Error::param(4, "a window grants remote rights only"));
        }
        let target = match target {
            Some((lmr, t)) => {
                let lctx = lmr.context()?;
                if lctx != t.lmr_context {
                    return Err(Error::param(2, "the triplet does not name this LMR"));
                }
                let e = mem
                    .get(lctx)
                    .ok_or(Error::InvalidHandle(Subtype::InvalidHandleLmr))?;
                if e.pz != inner.pz.inner.id {
                    return Err(Error::ProtectionViolation(Subtype::NoSubtype));
                }
                if !crate::mem::within(e.start, e.len, t.virtual_address, t.segment_length) {
                    return Err(Error::param(2, "the window range is outside the LMR"));
                }
                if !e.privs.contains(privs) {
                    return Err(Error::PrivilegesViolation(Subtype::NoSubtype));
                }
                Some((lctx, t))
            }
            None => None,
        };
        let op = WrOp::Local(Box::new(LocalOp::Bind {
            target,
            privs,
            new_ctx: 0,
        }));
        let mut new_ctx = 0;
        // Rotate the key once the request is sure to be queued (a refused
        // bind leaves the window as it was): the old context is dead from
        // here on; the new one is unbound until the work request executes.
        inner.post_with(op, &[], (&mut None, 0), cookie, flags, |op| {
            // The new key is unbound; the old binding is released (the LMR
            // it was bound to no longer counts it) under the table's lock,
            // also when the window has no key left: then the window is
            // retired, unbound, and `Rmr::free` is all that is left to do.
            let ctx = mem.rekey(old, |_| {}).ok_or(Error::InsufficientResources {
                resource: Subtype::ResourceMemoryRegion,
                what: "the window ran out of keys",
            })?;
            *rmr.inner.ctx.lock() = Some(ctx);
            op.set_new_ctx(ctx);
            new_ctx = ctx;
            Ok(())
        })?;
        Ok(new_ctx)
    }

    /// Maps the fast-registration `lmr` onto `region` with `privs` by a work
    /// request (DAT 2.0 `dat_lmr_kcreate` FMR style). Returns the new
    /// context, valid once the `LmrFmr` DTO completes. The previous mapping
    /// and its key die at once, and every window bound to it is unbound.
    pub fn post_lmr_fmr(
        &self,
        lmr: &Lmr,
        region: Arc<Region>,
        privs: MemPriv,
        cookie: u64,
        flags: CompletionFlags,
    ) -> Result<u32> {
        let inner = &self.inner;
        if lmr.inner.kind != crate::mem::EntryKind::Fmr {
            return Err(Error::param(1, "not a fast-registration LMR"));
        }
        if !Arc::ptr_eq(&lmr.inner.pz.inner, &inner.pz.inner) {
            return Err(Error::ProtectionViolation(Subtype::NoSubtype));
        }
        let old = lmr.context()?;
        inner
            .ia
            .mem
            .get(old)
            .ok_or(Error::InvalidHandle(Subtype::InvalidHandleLmr))?;
        // The entry's length is the current mapping's; the maximum is fixed
        // at creation.
        if region.len() as u64 > lmr.inner.max_len {
            return Err(Error::Length("region larger than the FMR's maximum"));
        }
        let op = WrOp::Local(Box::new(LocalOp::Fmr {
            lmr: lmr.clone(),
            region,
            privs,
            new_ctx: 0,
        }));
        let mut new_ctx = 0;
        inner.post_with(op, &[], (&mut None, 0), cookie, flags, |op| {
            let ctx = self.fmr_rekey(lmr, old)?;
            op.set_new_ctx(ctx);
            new_ctx = ctx;
            Ok(())
        })?;
        Ok(new_ctx)
    }

    /// Invalidates the fast-registration `lmr` by a work request
    /// (`dat_lmr_invalidate`): when the `LmrInvalidate` DTO executes (after
    /// every request posted before it) the mapping goes and the key changes
    /// to the returned (unmapped) context; the old key is then dead for good,
    /// and so is every window bound to the mapping (they are unbound).
    pub fn post_lmr_invalidate(
        &self,
        lmr: &Lmr,
        cookie: u64,
        flags: CompletionFlags,
    ) -> Result<u32> {
        if lmr.inner.kind != crate::mem::EntryKind::Fmr {
            return Err(Error::param(1, "not a fast-registration LMR"));
        }
        if !Arc::ptr_eq(&lmr.inner.pz.inner, &self.inner.pz.inner) {
            return Err(Error::ProtectionViolation(Subtype::NoSubtype));
        }
        let old = lmr.context()?;
        let op = WrOp::Local(Box::new(LocalOp::Invalidate {
            lmr: lmr.clone(),
            new_ctx: 0,
        }));
        let mut new_ctx = 0;
        self.inner
            .post_with(op, &[], (&mut None, 0), cookie, flags, |op| {
                // Reserve the next key now (it is returned), apply it when the
                // request executes: requests queued before the invalidate (a
                // map, a transfer) still see the current key.
                let k = self
                    .inner
                    .ia
                    .mem
                    .next_key(old)
                    .ok_or(Error::InsufficientResources {
                        resource: Subtype::ResourceMemoryRegion,
                        what: "the fast-registration LMR ran out of keys",
                    })?;
                op.set_new_ctx(k);
                new_ctx = k;
                Ok(())
            })?;
        Ok(new_ctx)
    }

    fn fmr_rekey(&self, lmr: &Lmr, old: u32) -> Result<u32> {
        let new_ctx = self
            .inner
            .ia
            .mem
            .rekey(old, |e| {
                e.region = None;
                e.privs = MemPriv::NONE;
            })
            .ok_or(Error::InsufficientResources {
                resource: Subtype::ResourceMemoryRegion,
                what: "the fast-registration LMR ran out of keys",
            })?;
        lmr.set_mapping(new_ctx, None, MemPriv::NONE);
        Ok(new_ctx)
    }
}

impl EpInner {
    pub(crate) fn is_freed(&self) -> bool {
        self.freed.load(Ordering::SeqCst)
    }

    pub(crate) fn check_live(&self) -> Result<()> {
        if self.is_freed() {
            Err(Error::InvalidHandle(Subtype::InvalidHandleEp))
        } else {
            Ok(())
        }
    }

    #[inline(always)]
    fn post(
        self: &Arc<Self>,
        op: WrOp,
        iov: &[LmrTriplet],
        cookie: u64,
        flags: CompletionFlags,
    ) -> Result<()> {
        self.post_with(op, iov, (&mut None, 0), cookie, flags, |_| Ok(()))
    }

    /// The checks of a post of an owned buffer (`len` bytes of it, for a
    /// send): of this endpoint's zone, not too long, and with a completion
    /// that is always delivered (the buffer comes back only with it).
    fn check_buf(&self, buf: &Buf, len: usize, flags: CompletionFlags, recv: bool) -> Result<()> {
        if buf.pz() != self.pz.inner.id {
            return Err(Error::ProtectionViolation(Subtype::NoSubtype));
        }
        let quiet = if recv {
            CompletionFlags::SUPPRESS
        } else {
            CompletionFlags::SUPPRESS | CompletionFlags::UNSIGNALLED
        };
        if flags.0 & quiet.0 != 0 {
            return Err(Error::param(
                4,
                "an owned buffer comes back with its completion: it cannot be suppressed",
            ));
        }
        if len > buf.len() {
            return Err(Error::param(2, "longer than the buffer"));
        }
        if len as u64 > self.attr.max_message_size {
            return Err(Error::Length("transfer larger than the endpoint's maximum"));
        }
        Ok(())
    }

    /// The first checks of a post: the endpoint is live, the flags known.
    #[inline]
    fn check_post(&self, flags: CompletionFlags) -> Result<()> {
        self.check_live()?;
        if flags.0 & !0x3F != 0 {
            return Err(Error::param(4, "unknown completion flag bits"));
        }
        Ok(())
    }

    /// The list checks of a post: within `max_iov` entries, its total
    /// within `limit`; returns that total.
    #[inline]
    fn check_list(iov: &[LmrTriplet], max_iov: usize, limit: u64) -> Result<u64> {
        if iov.len() > max_iov {
            return Err(Error::param(
                2,
                "more scatter/gather entries than the endpoint allows",
            ));
        }
        let len = crate::mem::list_len(iov, limit)
            .ok_or(Error::Length("transfer larger than the endpoint's maximum"))?;
        Ok(len)
    }

    /// Posts a receive: checked, its completion reserved and queued under
    /// the endpoint's lock (built in place, as queued), then the transport
    /// is kicked (a peer's send may wait for it).
    #[inline]
    fn post_recv(
        self: &Arc<Self>,
        iov: &[LmrTriplet],
        buf: &mut Option<Buf>,
        cookie: u64,
        flags: CompletionFlags,
    ) -> Result<()> {
        self.check_post(flags)?;
        let evd = match (&self.recv_evd, &self.srq) {
            (Some(evd), None) => evd,
            (_, Some(_)) => {
                return Err(Error::state(
                    Subtype::InvalidStateEpEvdRecv,
                    "the endpoint takes its receives from a shared receive queue",
                ));
            }
            (None, None) => {
                return Err(Error::state(
                    Subtype::InvalidStateEpEvdRecv,
                    "the endpoint has no EVD for this queue",
                ));
            }
        };
        Self::check_list(iov, self.attr.max_recv_iov, self.attr.max_message_size)?;
        if let Some(b) = buf {
            self.check_buf(b, b.len(), flags, true)?;
        }
        #[cfg(any(test, feature = "test-hooks"))]
        if let Some(f) = test_hooks::POST_RECV_GAP.with(|h| h.borrow_mut().take()) {
            f();
        }
        // The slot the receive will go to was last read by the peer's
        // sender: ask for it together with the lock's line.
        crate::evd::prefetch_write(self.recv_hint.load(Ordering::Relaxed) as *const u8);
        {
            // Under the posters' lock alone: a state change that refuses
            // receives is published here (`set_state`) before the flush
            // that follows it drains the queue (under this lock too), so a
            // receive is either queued before the state change (and
            // flushed) or refused.
            let mut p = self.posted.lock();
            if let Some(state) = p.refused {
                return Err(refused_in(state));
            }
            let max = self.attr.max_recv_dtos as u64;
            if p.total - p.taken_seen >= max {
                // Looks full with the count read last: read it again (the
                // published count never runs ahead of the queue, so a
                // receive is refused only if the queue was full at a moment
                // of this call).
                p.taken_seen = self.taken.load(Ordering::Acquire);
                if p.total - p.taken_seen >= max {
                    return Err(queue_full());
                }
            }
            let res = evd.reserve()?;
            p.recvs.push_back(RecvWr {
                iov: match iov {
                    [t] => RecvIov::from_buf([*t]),
                    // (An owned buffer's receive.)
                    [] => RecvIov::new(),
                    _ => RecvIov::from_slice(iov),
                },
                cookie,
                flags,
                res,
                buf: buf.take(),
            });
            p.total += 1;
            // The next receive probably goes just after this one.
            if let Some(last) = p.recvs.back() {
                let next = (last as *const RecvWr as usize) + std::mem::size_of::<RecvWr>();
                self.recv_hint.store(next, Ordering::Relaxed);
            }
        }
        self.ops.kick(self, true);
        Ok(())
    }

    /// `post` of a request, running `prepare` on the request under the
    /// endpoint's lock once every check passed and the completion's slot is
    /// reserved: its side effects happen only if the request is queued (if
    /// it fails, the reservation is returned and nothing is queued).
    /// (Receives go through [`EpInner::post_recv`].) Inlined into each
    /// `Ep::post_*`: the operation is a constant there, and its checks fold.
    #[inline(always)]
    fn post_with(
        self: &Arc<Self>,
        mut op: WrOp,
        iov: &[LmrTriplet],
        (buf, buf_len): (&mut Option<Buf>, usize),
        cookie: u64,
        flags: CompletionFlags,
        prepare: impl FnOnce(&mut WrOp) -> Result<()>,
    ) -> Result<()> {
        if matches!(op, WrOp::Recv) {
            return self.post_recv(iov, buf, cookie, flags);
        }
        self.check_post(flags)?;
        if let Some(b) = buf {
            self.check_buf(b, buf_len, flags, false)?;
        }
        let evd = self.request_evd.as_ref().ok_or_else(|| {
            Error::state(
                Subtype::InvalidStateEpEvdRequest,
                "the endpoint has no EVD for this queue",
            )
        })?;
        let limit = match op {
            WrOp::RdmaWrite(_) | WrOp::RdmaRead(_) => self.attr.max_rdma_size,
            _ => self.attr.max_message_size,
        };
        let len = Self::check_list(iov, self.attr.max_request_iov, limit)?;
        if let WrOp::RdmaWrite(r) | WrOp::RdmaRead(r) = &op {
            if r.segment_length < len {
                return Err(Error::Length("remote buffer shorter than the local list"));
            }
        }
        let c = self.core.lock();
        if c.state != EpState::Connected {
            return Err(refused_in(c.state));
        }
        if self.requests.load(Ordering::Acquire) >= self.attr.max_request_dtos {
            return Err(queue_full());
        }
        let res = evd.reserve()?;
        if let Err(e) = prepare(&mut op) {
            let _ = evd.release(res); // reserved on this EVD
            return Err(e);
        }
        let wr = NewWr {
            op,
            iov,
            cookie,
            flags,
            res,
            buf: buf.take(),
            buf_len,
        };
        // Counted before the transport sees it (it may complete it at once).
        self.requests.fetch_add(1, Ordering::Relaxed);
        // The transport executes or queues it and goes on under the same
        // lock.
        self.ops.submit(self, c, wr);
        Ok(())
    }

    /// Completes a work request with `status` and `len` bytes transferred
    /// (exactly once: it is consumed). The DAT completion-flag rules apply
    /// here (a suppressed success is released, not queued).
    #[inline]
    pub fn complete(&self, wr: Wr, status: DtoStatus, len: u64) {
        let is_recv = matches!(wr.op, WrOp::Recv);
        let op = wr.op.dto_op();
        self.complete_parts(
            is_recv, op, wr.cookie, wr.flags, wr.res, status, len, wr.buf,
        );
    }

    /// Completes a receive with `status` and `len` bytes transferred, as
    /// [`EpInner::complete`] does.
    #[inline]
    pub fn complete_recv(&self, r: RecvWr, status: DtoStatus, len: u64) {
        self.complete_parts(
            true,
            DtoOp::Receive,
            r.cookie,
            r.flags,
            r.res,
            status,
            len,
            r.buf,
        );
    }

    /// Completes a receive filled by a Send with Invalidate that
    /// invalidated `rmr_context` ([`EpInner::invalidate_remote`]): a
    /// success of `len` bytes, reported as `ReceiveWithInvalidate` naming
    /// the key.
    pub fn complete_recv_invalidated(&self, r: RecvWr, len: u64, rmr_context: u32) {
        self.complete_parts_ctx(
            true,
            DtoOp::ReceiveWithInvalidate,
            (r.cookie, r.flags, r.res),
            DtoStatus::Success,
            len,
            r.buf,
            rmr_context,
        );
    }

    /// Invalidates `rmr_context` of this endpoint's protection zone for
    /// the peer's Send with Invalidate (see
    /// [`Ep::post_send_with_invalidate`]). Refused, changing nothing, if
    /// the key names nothing live of this zone or a plain LMR.
    pub fn invalidate_remote(
        &self,
        rmr_context: u32,
    ) -> std::result::Result<(), crate::mem::RemoteInvalidate> {
        self.ia.mem.invalidate_remote(rmr_context, self.pz.inner.id)
    }

    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(crate) fn complete_parts(
        &self,
        is_recv: bool,
        op: DtoOp,
        cookie: u64,
        f: CompletionFlags,
        res: Reservation,
        status: DtoStatus,
        len: u64,
        buf: Option<Buf>,
    ) {
        self.complete_parts_ctx(is_recv, op, (cookie, f, res), status, len, buf, 0);
    }

    /// [`EpInner::complete_parts`] with the event's `rmr_context`.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn complete_parts_ctx(
        &self,
        is_recv: bool,
        op: DtoOp,
        (cookie, f, res): (u64, CompletionFlags, Reservation),
        status: DtoStatus,
        len: u64,
        buf: Option<Buf>,
        rmr_context: u32,
    ) {
        let evd = if is_recv {
            self.recv_evd.as_ref()
        } else {
            self.requests.fetch_sub(1, Ordering::Release);
            self.request_evd.as_ref()
        };
        let Some(evd) = evd else { return };
        let mut notify = true;
        if status.is_success() {
            if is_recv {
                // Receives: SUPPRESS drops a success; UNSIGNALLED, and
                // SOLICITED_WAIT filled by an unsolicited send, queue it
                // without notification.
                // (Never with a buffer: it would be lost. Its post refuses
                // SUPPRESS; this only makes sure.)
                if f.contains(CompletionFlags::SUPPRESS) && buf.is_none() {
                    let _ = evd.release(res); // reserved on this EVD
                    return;
                }
                notify = !(f.contains(CompletionFlags::UNSIGNALLED)
                    || (f.contains(CompletionFlags::SOLICITED_WAIT)
                        && !f.contains(CompletionFlags::SOLICITED_ARRIVAL)));
            } else if f.quiet_on_success() && buf.is_none() {
                let _ = evd.release(res); // reserved on this EVD
                return;
            }
        }
        let ev = Event::Dto(DtoCompletion {
            ep: self.id,
            consumer_context: self.context.get(),
            cookie,
            status,
            transferred_length: if status.is_success() { len } else { 0 },
            operation: op,
            rmr_context,
            buf,
        });
        // The reservation was made on this very EVD at post time.
        let done = if notify {
            evd.complete(res, ev)
        } else {
            evd.complete_unsignalled(res, ev)
        };
        debug_assert!(done.is_ok(), "{done:?}");
    }

    /// Executes a local memory work request (bind, map, invalidate) and
    /// completes it; returns its status.
    pub fn execute_local(&self, wr: Wr) -> DtoStatus {
        let mem = &self.ia.mem;
        let WrOp::Local(l) = &wr.op else {
            return self.finish(wr, DtoStatus::LocalEp);
        };
        let status = match &**l {
            LocalOp::Bind { target: None, .. } => DtoStatus::Success,
            LocalOp::Bind {
                target: Some((lctx, t)),
                privs,
                new_ctx,
                ..
            } => {
                if mem.bind_window(*lctx, *new_ctx, t.virtual_address, t.segment_length, *privs) {
                    DtoStatus::Success
                } else {
                    DtoStatus::RmrOperationFailed
                }
            }
            LocalOp::Fmr {
                lmr,
                region,
                privs,
                new_ctx,
            } => {
                if mem.map_fmr(*new_ctx, region, *privs) {
                    lmr.set_mapping(*new_ctx, Some(region.clone()), *privs);
                    DtoStatus::Success
                } else {
                    DtoStatus::LocalMmError
                }
            }
            LocalOp::Invalidate { lmr, new_ctx } => {
                let done = mem.set_key(*new_ctx, |e| {
                    e.region = None;
                    e.privs = MemPriv::NONE;
                });
                if done {
                    lmr.set_mapping(*new_ctx, None, MemPriv::NONE);
                    DtoStatus::Success
                } else {
                    DtoStatus::LocalMmError
                }
            }
        };
        self.finish(wr, status)
    }

    fn finish(&self, wr: Wr, status: DtoStatus) -> DtoStatus {
        self.complete(wr, status, 0);
        status
    }

    /// Posts a connection event on the connection EVD.
    pub fn connection_event(&self, kind: ConnectionEventKind, private: Option<Box<[u8]>>) {
        if let Some(evd) = &self.conn_evd {
            let _ = evd.post_event(Event::Connection(ConnectionEvent {
                kind,
                ep: self.id,
                consumer_context: self.context.get(),
                private_data: private,
            }));
        }
    }

    /// Flushes every outstanding work request of this endpoint.
    pub fn flush_all(&self) {
        let wrs: Vec<Wr> = {
            let mut g = self.core.lock();
            let c = &mut *g;
            c.rnr_deadline = None;
            let mut rq = self.rq.lock();
            let recvs = rq.drain_all(&mut self.posted.lock());
            self.publish_taken(&rq);
            c.sends
                .drain(..)
                .chain(recvs.into_iter().map(Wr::from))
                .collect()
        };
        for wr in wrs {
            self.complete(wr, DtoStatus::Flushed, 0);
        }
    }

    /// Ends the connection on both sides: states to `Disconnected`, every
    /// outstanding request flushed, and `kind` (default `Broken`) raised on
    /// both connection EVDs. Idempotent per side.
    ///
    /// Both sides leave the connection under both endpoints' locks, before
    /// either is flushed or told: nothing of either side (a send, an RDMA
    /// copy into the other's memory, a receive landing) can run while one
    /// side is out of the connection and the other still in it. A request
    /// already executing holds its endpoint's lock, so it finishes first
    /// (as a transfer in flight does on a wire). The peer leaves only if it
    /// is still in this same connection (its connection number), never a
    /// later one.
    pub fn break_connection(&self, peer: Option<&Arc<EpInner>>, kind: Option<ConnectionEventKind>) {
        let kind = kind.unwrap_or(ConnectionEventKind::Broken);
        let peer = peer.filter(|p| !std::ptr::eq(&***p, self));
        let (mine, theirs) = match peer {
            Some(p) => {
                let (mut ca, mut cb) = EpInner::lock_pair(self, p);
                let same = cb.conn == ca.conn;
                let mine = self.leave_locked(&mut ca);
                let theirs = same && p.leave_locked(&mut cb);
                (mine, theirs)
            }
            None => (self.leave_locked(&mut self.core.lock()), false),
        };
        if mine {
            self.flush_all();
            self.connection_event(kind, None);
        }
        // Tests: run what the hook holds between telling the two sides.
        #[cfg(any(test, feature = "test-hooks"))]
        if let Some(f) = test_hooks::BREAK_GAP.with(|h| h.borrow_mut().take()) {
            f();
        }
        if let (Some(p), true) = (peer, theirs) {
            p.flush_all();
            p.connection_event(kind, None);
        }
    }

    /// This side leaves its connection (locked: `c`), if it is in one:
    /// `Disconnected`, no peer, no keys, and its receive queue closed to
    /// the connection's sends and refusing receives. True if it was in one.
    pub(crate) fn leave_locked(&self, c: &mut EpCore) -> bool {
        let was = matches!(c.state, EpState::Connected | EpState::DisconnectPending);
        if was {
            c.state = EpState::Disconnected;
            c.peer = None;
            c.peer_mem = None;
            c.keys.clear();
            c.peer_keys.clear();
            let mut rq = self.rq.lock();
            rq.conn = 0;
            rq.keys.clear();
            self.posted.lock().refused = Some(EpState::Disconnected);
        }
        was
    }

    /// Tears the endpoint down (free, or abrupt IA close).
    pub(crate) fn abort(self: &Arc<Self>, ia: &Arc<IaInner>) {
        if self.freed.swap(true, Ordering::SeqCst) {
            return;
        }
        let (cr, connecting) = {
            let mut c = self.core.lock();
            (
                c.pending_cr.take(),
                c.state == EpState::ActiveConnectionPending,
            )
        };
        if let Some(cr) = cr {
            cr.cancel();
        }
        // The provider ends a connection (the peer is told), or drops an
        // attempt in progress.
        let connected = matches!(
            self.core.lock().state,
            EpState::Connected | EpState::DisconnectPending
        );
        self.ops.destroy(self);
        if connected {
            // A provider that ends it on its own thread, later, finds it
            // ended: the freed endpoint's own side ends here, now.
            self.ended(ConnectionEventKind::Disconnected);
        }
        if connecting {
            self.set_state(&mut self.core.lock(), EpState::Disconnected);
            self.ops.connect_cancel(self);
        }
        // Refuse first, then flush (as `break_connection` does): a receive
        // whose post passed the liveness check before `freed` was set is
        // then either queued before the flush (and flushed) or refused,
        // never queued behind the flush with its completion lost.
        self.set_state(&mut self.core.lock(), EpState::Disconnected);
        #[cfg(any(test, feature = "test-hooks"))]
        if let Some(f) = test_hooks::ABORT_GAP.with(|h| h.borrow_mut().take()) {
            f();
        }
        self.flush_all();
        self.feeders.lock().clear();
        self.pz.inner.users.fetch_sub(1, Ordering::SeqCst);
        ia.live.eps.fetch_sub(1, Ordering::Relaxed);
    }

    /// The receive a send to this endpoint lands in (its receive queue
    /// locked: `rq`, refilled): its own queue's head, or one of its SRQ
    /// (reserving the completion on the receive EVD now; if that EVD is
    /// full the receive stays posted, as if there were none).
    pub fn take_recv_locked(&self, rq: &mut RecvQueue) -> Option<RecvWr> {
        let Some(srq) = &self.srq else {
            return rq.pop();
        };
        let evd = self.recv_evd.as_ref()?;
        let wr = {
            let mut q = srq.inner.recvs.lock();
            if q.is_empty() {
                return None;
            }
            let res = evd.reserve().ok()?;
            let s = q.pop_front().expect("non-empty");
            RecvWr {
                iov: RecvIov::from_slice(&s.iov),
                cookie: s.cookie,
                flags: s.flags,
                res,
                buf: None,
            }
        };
        srq.inner.check_watermark();
        Some(wr)
    }

    /// Publishes the receive queue's count of receives taken for good (its
    /// lock held: `rq`) to posters; called before that lock is released
    /// wherever the count changed, so the published count never counts a
    /// receive that is put back.
    #[inline]
    pub fn publish_taken(&self, rq: &RecvQueue) {
        self.publish_taken_count(rq.taken);
    }

    /// [`EpInner::publish_taken`] of the count `taken` (read under the
    /// receive queue's lock).
    #[inline]
    pub fn publish_taken_count(&self, taken: u64) {
        self.taken.store(taken, Ordering::Release);
    }

    /// Receives posted and not yet taken by a send, flushed or reset.
    fn outstanding_recvs(&self) -> usize {
        // Both locks at once (in order): no receive is counted twice or
        // missed while it moves over.
        let rq = self.rq.lock();
        let posted = self.posted.lock();
        rq.recvs.len() + posted.recvs.len()
    }

    /// Sets the state of this endpoint (locked: `c`) to `state`, and what
    /// `post_recv` reads of it under the posters' lock (taken here, after
    /// the endpoint's). Every change into or out of a state that refuses
    /// receives goes through here (or sets both the same way, as
    /// `break_connection` and `reset` do).
    pub fn set_state(&self, c: &mut EpCore, state: EpState) {
        c.state = state;
        let refused = matches!(state, EpState::Disconnected | EpState::DisconnectPending);
        self.posted.lock().refused = refused.then_some(state);
    }

    /// Locks this endpoint and `other` in handle order.
    pub fn lock_pair<'a>(
        a: &'a EpInner,
        b: &'a EpInner,
    ) -> (MutexGuard<'a, EpCore>, MutexGuard<'a, EpCore>) {
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
}

/// Test-only hooks (feature `test-hooks`, for the tests of providers) that
/// open the windows between steps other threads could run in: each is a
/// closure that the step runs once, on the thread that set it.
#[cfg(any(test, feature = "test-hooks"))]
pub mod test_hooks {
    use std::cell::RefCell;

    thread_local! {
        /// Run (once) by [`super::EpInner::break_connection`] on this
        /// thread, once both sides left the connection and the first one
        /// was flushed and told, before the second one is.
        pub static BREAK_GAP: RefCell<Option<Box<dyn FnOnce()>>> =
            const { RefCell::new(None) };
        /// Run (once) by [`super::EpInner::abort`] on this thread, between
        /// its two steps that refuse new receives and flush the queued ones.
        pub static ABORT_GAP: RefCell<Option<Box<dyn FnOnce()>>> =
            const { RefCell::new(None) };
        /// Run (once) by `post_recv` on this thread, after the request's
        /// checks (liveness included) and before the receive queue is
        /// locked.
        pub static POST_RECV_GAP: RefCell<Option<Box<dyn FnOnce()>>> =
            const { RefCell::new(None) };
    }
}

crate::context::consumer_context!(Ep, |s| s.inner.context);
