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

mod attr;
mod batch;
mod cm;
mod complete;
mod lifecycle;
mod post;
mod queue;
mod wr;

pub use attr::{CompletionFlags, EpAttr, EpState};
pub use batch::Batch;
pub use queue::{Attempt, EpCore, PostedRecvs, RecvQueue};
pub use wr::{LocalOp, NewWr, RecvIov, RecvWr, Request, Wr, WrOp};

use crate::error::{Error, Subtype};
use crate::evd::{Evd, Feeder};
use crate::event::EpHandle;
use crate::ia::IaInner;
use crate::pz::Pz;
use crate::sync::Lock as Mutex;
use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use crossbeam_utils::CachePadded;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

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
    // (A process-wide counter: never modelled.)
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
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
    // (A process-wide counter: never modelled.)
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Test-only hooks (feature `test-hooks`, for the tests of providers) that
/// open the windows between steps other threads could run in: each is a
/// closure that the step runs once, on the thread that set it.
#[cfg(any(test, feature = "test-hooks"))]
pub mod test_hooks {
    use std::cell::RefCell;

    thread_local! {
        /// Run (once) by [`super::EpInner::abort`] on this thread, between
        /// its two steps that refuse new receives and flush the queued ones.
        pub static ABORT_GAP: RefCell<Option<Box<dyn FnOnce()>>> =
            const { RefCell::new(None) };
        /// Run (once) by `post_recv` on this thread, after the request's
        /// checks (liveness included) and before the receive queue is
        /// locked.
        pub static POST_RECV_GAP: RefCell<Option<Box<dyn FnOnce()>>> =
            const { RefCell::new(None) };
        /// Run (once) by `Ep::connect` on this thread, after it moved the
        /// endpoint to `ActiveConnectionPending` and let go of its lock,
        /// before it hands the attempt to the provider.
        pub static CONNECT_GAP: RefCell<Option<Box<dyn FnOnce()>>> =
            const { RefCell::new(None) };
    }
}

crate::context::consumer_context!(Ep, |s| s.inner.context);
