//! The Event Dispatcher (EVD): the queue every completion and notification
//! of rdapl flows through.
//!
//! # Guarantees
//!
//! * **Exactly once.** Every event that is published is delivered to exactly
//!   one consumer: an upcall, a `dequeue`, a `wait` or an async stream,
//!   whatever mix of them runs.
//! * **Per-stream FIFO.** Events are stored in one FIFO in the order
//!   producers published them, so within a stream (and across streams) they
//!   come out in that order.
//! * **No lost wakeup.** Every notification decision is a compare-and-swap
//!   on one state word that holds the policy and every notification flag
//!   (`state.rs`). A producer pushes, fences, then reads that word; a
//!   consumer that arms a notification writes the word, fences, then looks
//!   at the queue: one of the two always sees the other (the Dekker
//!   pattern, model-checked with loom).
//! * **Race-free re-enable in three forms** ([`ReEnable`]): `Strict` refuses
//!   with [`Error::Busy`] while events are queued, `OnAny` delivers what is
//!   queued by upcall, `OnNew` arms for new arrivals and reports the pending
//!   count.
//! * **Upcalls run in a dispatch context** ([`crate::dispatch`]): never on
//!   the stack of a consumer call and never under an internal lock, so an
//!   upcall may call any function, `modify_upcall` on its own EVD included.
//!   `SingleInstance` runs at most one upcall at a time and delivers what
//!   arrived meanwhile when it returns. Once `Disable` (or `free`) returns,
//!   no upcall begins: the policy is looked at before each event is taken
//!   for an upcall, and the switch waits for a run between that look and
//!   its upcall. Upcalls that had begun may still be running; `Teardown`
//!   returns only after they have returned, and fails (instead of
//!   deadlocking) when called from inside this EVD's own upcall or from an
//!   upcall that one of this EVD's upcalls waits for.
//! * **Nothing lost silently.** DTO completions reserve their slot when the
//!   work request is posted ([`EvdProducer::reserve`]), so a completion always fits.
//!   Streams that cannot be refused at the source ([`EvdProducer::post_event`]) that
//!   find the EVD full are counted and reported by an `EvdOverflow` event on
//!   the async EVD, naming this EVD, once per episode (an episode ends when
//!   a slot is given back); the EVD stays usable. An EVD made without an
//!   async EVD reports on the async EVD of the first IA whose endpoint or
//!   service point it feeds.
//! * **No misdirected completion.** A reservation is checked against the
//!   EVD it is completed on, in every build ([`Misdirected`]).
//!
//! # Hot path
//!
//! Producers and consumers keep their counters on separate cache lines
//! (`ring.rs` holds the events; its module docs give the details).
//!
//! * A producer reserves capacity with one CAS on the producers' line (the
//!   consumers' count is read only when the producers' cached copy says the
//!   EVD looks full), then publishes with one `fetch_add` on the ring's tail,
//!   a read of the state word and a write of the slot.
//! * A refusal (`reserve` or `post_se` on a full EVD) is exact: it comes
//!   after a read of the consumers' head. It then returns after a short
//!   pause (`refused_pause`): a producer that retries at once would pull
//!   that head, and the slot the consumer takes next, to its own core with
//!   every look, and slow the draining it waits for. An endpoint's posts
//!   reserve under its lock and pause only once they let go of it; a
//!   provider's take of an SRQ receive does not pause.
//! * A consumer reads the state word and claims one event, or a whole batch,
//!   with one CAS on the ring's head; that head is also the count of slots
//!   given back, so returning capacity costs nothing more.
//! * While nobody listens the state word is only read, so it stays shared in
//!   every core's cache, and no lock is taken on either side unless a
//!   waiter, stream, CNO or upcall has to be woken.
//! * `wait` polls at a fine grain for a few microseconds before it takes
//!   ownership, arms and blocks.
//! * A provider may attach progress hooks ([`Progress`]): a `dequeue` that
//!   finds the EVD empty runs them once and looks again; a `wait` drives
//!   them for as long as they say ([`Progress::wait_spin`]), longer while
//!   blocked waits end soon after they blocked (up to
//!   [`WAIT_SPIN_GROWTH`] times), never past its timeout, then parks
//!   them and blocks. Arming a
//!   notification (enabling upcalls, `enable` for a CNO, a stream that
//!   goes to sleep) parks them too, and so does a `dequeue` that finds the
//!   EVD empty while a notification is armed: such a consumer relies on
//!   being told, not on polling again. They are called
//!   with no lock of the EVD held. An EVD without hooks (the loopback
//!   provider's) pays one relaxed load of a read-mostly line, and only
//!   when found empty.
//!
//! # Layout
//!
//! This file holds the EVD itself: its creation, its state word and
//! capacity counters, resize, query, free and the CNO. The rest, a
//! concern a file: `consume.rs` (dequeue, wait, the progress hooks a
//! consumer drives), `publish.rs` (pushing and waking listeners),
//! `producer.rs` and `reservation.rs` (the providers' side), `upcall.rs`
//! (upcalls, their policies and dispatch runs), `state.rs` (the state
//! word's protocol), `ring.rs` (the lock-free event storage),
//! `progress.rs` and `teardown_waits.rs`.

#[cfg(rdapl_loom)]
mod loom_storage;
// Under loom the ring is checked by its own models only (see `loom_storage`).
#[cfg_attr(rdapl_loom, allow(dead_code))]
pub(crate) mod ring;
#[cfg_attr(rdapl_loom, allow(unused_imports))]
pub(crate) use ring::{prefetch_read, prefetch_write};
mod consume;
mod producer;
mod progress;
mod publish;
mod reservation;
pub(crate) mod state;
pub(crate) mod teardown_waits;
mod upcall;

pub use producer::EvdProducer;
pub use progress::{DEFAULT_WAIT_SPIN, Progress, WAIT_SPIN_GROWTH};
use publish::publish;
pub use reservation::{Misdirected, Reservation};
use upcall::enabling_policy;
pub(crate) use upcall::run;
pub use upcall::{Enabled, Upcall, UpcallPolicy};

pub use state::{MAX_QLEN, ReEnable};

use crate::cno::Cno;
use crate::dispatch::{Dispatch, DispatchRun};
use crate::error::{Error, Result, Subtype};
use crate::event::{EvdFlags, EvdHandle, Event, EventStream};
use crate::sync::{
    self, Arc, AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex, Ordering, Signal, fence,
};
use crossbeam_utils::CachePadded;
#[cfg(rdapl_loom)]
use loom_storage::Storage;
#[cfg(not(rdapl_loom))]
use ring::Storage;
use state::{
    CNO_ENABLED, FREED, Policy, RunStep, STREAM_ARMED, State, TD_WAITING, UNWAITABLE, WAIT_ARMED,
    WAITER,
};
use std::convert::Infallible;
use std::fmt;
use std::time::Duration;

/// What `Evd::query` reports (`DAT_EVD_PARAM`, both the uDAT and kDAT forms).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvdParam {
    /// The EVD's handle.
    pub handle: EvdHandle,
    /// Queue length.
    pub qlen: usize,
    /// Streams accepted.
    pub flags: EvdFlags,
    /// Current upcall policy.
    pub upcall_policy: UpcallPolicy,
    /// Whether an upcall object is registered.
    pub has_upcall: bool,
    /// Events queued and not yet consumed.
    pub pending: usize,
    /// Slots taken: queued events plus reserved DTO completions.
    pub occupied: usize,
    /// uDAT enabled state (arrivals trigger the CNO).
    pub enabled: bool,
    /// uDAT waitable state.
    pub waitable: bool,
    /// The attached CNO, if any.
    pub cno: Option<crate::cno::CnoHandle>,
    /// Events dropped because the EVD was full (each counted, reported by
    /// `EvdOverflow` on the async EVD).
    pub overflows: u64,
    /// Endpoints and service points that feed this EVD.
    pub feeders: usize,
    /// Upcalls that panicked (caught; the EVD carried on).
    pub upcall_panics: u64,
    /// Reservations dropped unspent (their slots came back; the
    /// completions they stood for were never delivered).
    pub dropped_reservations: u64,
}

/// The overflow outcome of [`EvdProducer::post_event`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Overflowed {
    /// True if an `EvdOverflow` event was posted to the async EVD for this
    /// overflow (one is posted per overflow episode).
    pub reported: bool,
}

/// An Event Dispatcher. Cloning gives another handle to the same EVD.
#[derive(Clone)]
pub struct Evd {
    pub(crate) inner: Arc<EvdInner>,
}

impl fmt::Debug for Evd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Evd")
            .field("handle", &self.inner.id)
            .field("state", &self.inner.load())
            .finish()
    }
}

pub(crate) struct EvdInner {
    /// The consumer context (`DAT_CONTEXT`).
    pub(crate) context: crate::context::ContextSlot,
    pub(crate) id: EvdHandle,
    flags: EvdFlags,
    /// Providers' progress hooks ([`Progress`]), run by consumers that find
    /// the EVD empty (read-mostly: next to the other read-mostly fields).
    pub(crate) progress: progress::ProgressHooks,
    /// The state word (`state.rs`): read by every producer, written only
    /// when a listener arms or a policy changes.
    state: CachePadded<AtomicU64>,
    /// The producers' line: slots taken and the queue length.
    prod: CachePadded<Producers>,
    /// The consumers' line: slots given back (monotonic, modulo 2^44).
    released: CachePadded<AtomicU64>,
    storage: Storage,
    /// Serialises policy changes (a `Strict` re-enable is three steps).
    modify: Mutex<()>,
    upcall: Mutex<Option<Arc<dyn Upcall>>>,
    dispatch: Arc<dyn Dispatch>,
    max_runs: u64,
    waiter: Signal,
    teardown_lock: Mutex<()>,
    teardown_cv: Condvar,
    cno: Mutex<Option<crate::cno::CnoLink>>,
    enabled: AtomicBool,
    /// Where overflows are reported: set at creation, or adopted from the
    /// IA when an EVD made without one starts to feed from it.
    async_evd: Mutex<Option<Evd>>,
    overflows: AtomicU64,
    /// `freed() + 1` when the last overflow was reported (0: never): an
    /// overflow episode ends as soon as a slot was given back since.
    overflow_mark: AtomicU64,
    upcall_panics: AtomicU64,
    /// Reservations dropped unspent (`reservation.rs`).
    pub(crate) dropped_reservations: AtomicU64,
    /// Its place in its IA's count of EVDs (given back at the free).
    counted: Mutex<Option<crate::ia::OwnedAdmission>>,
    feeders: AtomicUsize,
    /// Serialises `free`'s look at `feeders` and its setting of `FREED`
    /// with an object's registration as a feeder
    /// ([`Evd::try_feeder_of`]): a free and an endpoint's creation on
    /// another thread never both succeed.
    feed_lock: Mutex<()>,
    /// Runs between their last look at the policy and the entry of the
    /// upcall they decided to make (see [`upcall::UpcallGate`]).
    /// `Disable` and `free` wait for this to reach zero, so that no upcall
    /// begins after they return.
    starting: CachePadded<AtomicUsize>,
    /// The poller task this EVD is attached to (0: none): one at a time,
    /// since a detach switches the EVD's upcall off (`poller.rs`).
    #[cfg(not(rdapl_loom))]
    pub(crate) poller_task: std::sync::atomic::AtomicU64,
    #[cfg(feature = "stream")]
    pub(crate) stream_wakers: Mutex<crate::stream::Wakers>,
}

/// Capacity accounting on the producers' cache line.
///
/// `reserved` holds the queue length in its top 20 bits and the number of
/// slots ever taken (modulo 2^44) below. Slots given back (`freed`) are the
/// events consumers took, which the storage counts with the very claim that
/// takes them (its head), plus reservations released unused: a consumer does
/// no extra atomic operation to return capacity. Occupancy (queued plus
/// reserved) is `taken - freed` modulo 2^44, never above the queue length.
/// `freed_seen` is a copy of `freed` that may lag: it only ever
/// underestimates the free room, so producers look again only when the EVD
/// looks full, and then first at the slots consumers freed, the consumers'
/// head last (`EvdInner::freed_again`).
struct Producers {
    reserved: AtomicU64,
    freed_seen: AtomicU64,
    /// The consumers' part of `freed_seen` (events taken), so that a
    /// producer that finds the EVD full can first learn of new takes from
    /// the slots ([`Storage::consumed_from_slots`]) instead of the
    /// consumers' head.
    consumed_seen: AtomicU64,
}

/// Checks a `wait` makes one pause apart before it blocks (a few
/// microseconds: a ping-pong partner's answer usually comes within them).
/// (Loom models block at once.)
#[cfg(not(rdapl_loom))]
const WAIT_SPINS: u32 = 256;
/// Checks after a `yield_now` each, after the spins.
#[cfg(not(rdapl_loom))]
const WAIT_YIELDS: u32 = 4;

/// Slots a producer that finds the EVD full looks at before it reads the
/// consumers' head (see `EvdInner::freed_again`).
const SLOT_LOOK: u64 = 8;

const TAKEN_BITS: u32 = 44;
const TAKEN_MASK: u64 = (1 << TAKEN_BITS) - 1;

fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

#[cfg(not(rdapl_loom))]
std::thread_local! {
    /// The EVD whose upcall this thread is executing (0: none).
    static IN_UPCALL: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}
#[cfg(rdapl_loom)]
loom::thread_local! {
    static IN_UPCALL: std::cell::Cell<u64> = std::cell::Cell::new(0);
}

/// Builder for an [`Evd`].
pub struct EvdBuilder {
    qlen: usize,
    flags: EvdFlags,
    dispatch: Option<Arc<dyn Dispatch>>,
    async_evd: Option<Evd>,
    cno: Option<Cno>,
    upcall: Option<(UpcallPolicy, Arc<dyn Upcall>)>,
    counted: Option<crate::ia::OwnedAdmission>,
}

impl EvdBuilder {
    /// The dispatch context for upcalls (default: [`crate::Dispatcher::global`]).
    pub fn dispatch(mut self, d: Arc<dyn Dispatch>) -> Self {
        self.dispatch = Some(d);
        self
    }

    /// The async EVD that receives this EVD's overflow reports.
    pub fn async_evd(mut self, evd: &Evd) -> Self {
        self.async_evd = Some(evd.clone());
        self
    }

    /// Attach a CNO (uDAT `dat_evd_create(..., cno, ...)`); the EVD starts enabled.
    pub fn cno(mut self, cno: &Cno) -> Self {
        self.cno = Some(cno.clone());
        self
    }

    /// The EVD's place in its IA's count of EVDs.
    pub(crate) fn counted(mut self, place: crate::ia::OwnedAdmission) -> Self {
        self.counted = Some(place);
        self
    }

    /// Register an upcall at creation (kDAT `dat_evd_kcreate`).
    pub fn upcall(mut self, policy: UpcallPolicy, upcall: Arc<dyn Upcall>) -> Self {
        self.upcall = Some((policy, upcall));
        self
    }

    /// Creates the EVD.
    pub fn build(self) -> Result<Evd> {
        if self.qlen == 0 {
            return Err(Error::param(2, "evd_min_qlen must be at least 1"));
        }
        if self.qlen > MAX_QLEN {
            return Err(Error::InsufficientResources {
                resource: Subtype::ResourceTevd,
                what: "evd_min_qlen above the maximum EVD queue length",
            });
        }
        let dispatch = match self.dispatch {
            Some(d) => d,
            None => default_dispatch()?,
        };
        let max_runs = (dispatch.concurrency() as u64).clamp(1, state::MAX_RUNS);
        let (policy, upcall) = match self.upcall {
            None => (Policy::Disabled, None),
            Some((p, u)) => (enabling_policy(p).unwrap_or(Policy::Disabled), Some(u)),
        };
        if policy != Policy::Disabled {
            dispatch.prepare()?;
        }
        let cno = self.cno.as_ref().map(Cno::link).transpose()?;
        let has_cno = cno.is_some();
        let mut s = State(0).with_policy(policy);
        if policy == Policy::Notify {
            s = s.set(state::NOTIFY_ARMED);
        }
        if has_cno {
            s = s.set(CNO_ENABLED);
        }
        let inner = EvdInner {
            context: crate::context::ContextSlot::new(),
            id: EvdHandle(next_id()),
            flags: self.flags,
            progress: progress::ProgressHooks::default(),
            state: CachePadded::new(AtomicU64::new(s.0)),
            prod: CachePadded::new(Producers {
                reserved: AtomicU64::new((self.qlen as u64) << TAKEN_BITS),
                freed_seen: AtomicU64::new(0),
                consumed_seen: AtomicU64::new(0),
            }),
            released: CachePadded::new(AtomicU64::new(0)),
            storage: Storage::new(self.qlen),
            modify: Mutex::new(()),
            upcall: Mutex::new(upcall),
            dispatch,
            max_runs,
            waiter: Signal::new(),
            teardown_lock: Mutex::new(()),
            teardown_cv: Condvar::new(),
            cno: Mutex::new(cno),
            enabled: AtomicBool::new(true),
            async_evd: Mutex::new(self.async_evd),
            overflows: AtomicU64::new(0),
            overflow_mark: AtomicU64::new(0),
            upcall_panics: AtomicU64::new(0),
            dropped_reservations: AtomicU64::new(0),
            counted: Mutex::new(self.counted),
            feeders: AtomicUsize::new(0),
            feed_lock: Mutex::new(()),
            starting: CachePadded::new(AtomicUsize::new(0)),
            #[cfg(not(rdapl_loom))]
            poller_task: std::sync::atomic::AtomicU64::new(0),
            #[cfg(feature = "stream")]
            stream_wakers: Mutex::new(Default::default()),
        };
        let inner = Arc::new(inner);
        reservation::register(&inner);
        Ok(Evd { inner })
    }
}

#[cfg(not(rdapl_loom))]
pub(crate) fn default_dispatch() -> Result<Arc<dyn Dispatch>> {
    Ok(crate::dispatch::Dispatcher::global())
}

#[cfg(rdapl_loom)]
pub(crate) fn default_dispatch() -> Result<Arc<dyn Dispatch>> {
    Err(Error::param(
        1,
        "loom builds need an explicit dispatch context",
    ))
}

/// Spin hints a refused producer waits before it returns (see the module
/// docs): enough that a producer retrying on a full EVD looks at the
/// consumers' lines a few times an event taken, not dozens.
#[cfg(not(rdapl_loom))]
const REFUSED_PAUSE: u32 = 16;

/// The pause of a refusal (`reserve`, `post_se`), after its exact check:
/// nothing is read or written in it. Not under loom (no shared state).
#[cold]
#[inline(never)]
pub(crate) fn refused_pause() {
    #[cfg(not(rdapl_loom))]
    for _ in 0..REFUSED_PAUSE {
        std::hint::spin_loop();
    }
}

/// A refused reservation's return from under a lock: `guard` (the lock)
/// goes first, then the pause, then the error.
#[cold]
pub(crate) fn refused_after<T, G>(guard: G, e: Error) -> Result<T> {
    drop(guard);
    refused_pause();
    Err(e)
}

impl EvdInner {
    fn load(&self) -> State {
        State(self.state.load(Ordering::SeqCst))
    }

    /// Runs `f` in a CAS loop on the state word. `f` returns the new state
    /// and a value, or an error that ends the loop without a change.
    fn update<T, E>(&self, mut f: impl FnMut(State) -> Result<(State, T), E>) -> Result<T, E> {
        let mut cur = self.state.load(Ordering::SeqCst);
        loop {
            let (next, out) = f(State(cur))?;
            if next.0 == cur {
                return Ok(out);
            }
            match self
                .state
                .compare_exchange_weak(cur, next.0, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return Ok(out),
                Err(actual) => cur = actual,
            }
        }
    }

    fn qlen(&self) -> usize {
        (self.prod.reserved.load(Ordering::SeqCst) >> TAKEN_BITS) as usize
    }

    /// Queued events plus reserved completions.
    fn occupied(&self) -> u64 {
        // `freed` first: every slot it counts was taken before the read of
        // `reserved` below, so the difference is never negative.
        let freed = self.freed();
        let taken = self.prod.reserved.load(Ordering::SeqCst) & TAKEN_MASK;
        taken.wrapping_sub(freed) & TAKEN_MASK
    }

    /// Slots ever given back (modulo 2^44): events consumers took (the
    /// storage counts them as it hands them out, on the consumers' own
    /// line) plus reservations released unused.
    #[inline]
    fn freed(&self) -> u64 {
        self.storage
            .consumed()
            .wrapping_add(self.released.load(Ordering::Acquire))
            & TAKEN_MASK
    }

    /// [`EvdInner::freed`] for a producer that found the EVD full with its
    /// cached count: new takes are first looked for in two slots (the
    /// next one it would write, and the last of the next [`SLOT_LOOK`]; see
    /// [`Storage::consumed_from_slots`]), and the consumers' head, the
    /// line they write with every claim, is read only if that finds none,
    /// or finds the whole run taken (a consumer taking batches: the head
    /// then tells all of it at once). A producer retrying on a full EVD
    /// that consumers drain one by one thus stays off the line that paces
    /// them and off the slot they are taking. A refusal always comes after
    /// the head was read: never from the slots' lower bound alone.
    #[cold]
    fn freed_again(&self) -> u64 {
        let known = self.prod.consumed_seen.load(Ordering::Relaxed);
        // The slots say `known` (none taken), `known + 1` (the next one) or
        // `known + SLOT_LOOK` (the whole run): only the middle answer is
        // taken as it is; the others read the head.
        let consumed = match self.storage.consumed_from_slots(known, SLOT_LOOK) {
            Some(c) if c == known + 1 => c,
            _ => self.storage.consumed(),
        };
        self.prod.consumed_seen.store(consumed, Ordering::Relaxed);
        consumed.wrapping_add(self.released.load(Ordering::Acquire)) & TAKEN_MASK
    }

    /// Takes `n` slots of capacity, or fails if fewer are free.
    #[inline]
    fn take_slots(&self, n: u64) -> bool {
        let prod = &self.prod;
        let mut cur = prod.reserved.load(Ordering::Relaxed);
        let mut seen = prod.freed_seen.load(Ordering::Relaxed);
        loop {
            let qlen = cur >> TAKEN_BITS;
            let taken = cur & TAKEN_MASK;
            let occupied = taken.wrapping_sub(seen) & TAKEN_MASK;
            if occupied > TAKEN_MASK / 2 {
                // Negative: `seen` counts frees of slots taken after our read
                // of `reserved`. Read it again.
                cur = prod.reserved.load(Ordering::Relaxed);
                continue;
            }
            if occupied + n > qlen {
                // Looks full with the cached count: look again.
                let freed = self.freed_again();
                if freed == seen {
                    return false;
                }
                seen = freed;
                prod.freed_seen.store(freed, Ordering::Relaxed);
                continue;
            }
            let next = (cur & !TAKEN_MASK) | (taken.wrapping_add(n) & TAKEN_MASK);
            match prod.reserved.compare_exchange_weak(
                cur,
                next,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(a) => cur = a,
            }
        }
    }

    /// Refuses consumers while the EVD is freed or a waiter owns it.
    #[inline]
    fn check_consumer(&self) -> Result<()> {
        let s = State(self.state.load(Ordering::Relaxed));
        if s.0 & (FREED | WAITER) == 0 {
            return Ok(());
        }
        if s.has(FREED) {
            Err(Error::InvalidHandle(Subtype::NoSubtype))
        } else {
            Err(Error::state(
                Subtype::InvalidStateEvdWaiter,
                "a waiter owns the EVD",
            ))
        }
    }

    fn check_live(&self) -> Result<State> {
        let s = self.load();
        if s.has(FREED) {
            Err(Error::InvalidHandle(Subtype::NoSubtype))
        } else {
            Ok(s)
        }
    }
}

impl Evd {
    /// Starts building an EVD of queue length `qlen` for the given streams.
    ///
    /// Memory: the EVD allocates its ring at creation, one slot per event
    /// rounded up to a power of two (as a hardware completion queue does).
    /// A slot is 128 bytes on x86-64, aarch64 and powerpc64 (64 elsewhere),
    /// so that producers and consumers never share a pair of cache lines:
    /// e.g. 8 MiB for `qlen` 65536.
    pub fn builder(qlen: usize, flags: EvdFlags) -> EvdBuilder {
        EvdBuilder {
            qlen,
            flags,
            dispatch: None,
            async_evd: None,
            cno: None,
            upcall: None,
            counted: None,
        }
    }

    /// Creates an EVD with the default dispatch context (`dat_evd_create`).
    pub fn create(qlen: usize, flags: EvdFlags) -> Result<Evd> {
        Evd::builder(qlen, flags).build()
    }

    /// The EVD's handle.
    pub fn handle(&self) -> EvdHandle {
        self.inner.id
    }

    /// The streams this EVD accepts.
    pub fn flags(&self) -> EvdFlags {
        self.inner.flags
    }

    /// Posts a software event (`dat_evd_post_se`). `QueueFull` if the EVD is
    /// full (nothing is queued).
    #[inline]
    pub fn post_se(&self, value: u64) -> Result<()> {
        self.inner.check_live()?;
        if !self.inner.flags.accepts(EventStream::Software) {
            return Err(Error::param(1, "the EVD has no software event stream"));
        }
        if !self.inner.take_slots(1) {
            refused_pause();
            return Err(Error::QueueFull);
        }
        publish(&self.inner, Event::Software(value));
        Ok(())
    }

    /// Changes the queue length (`dat_evd_resize`), keeping every queued
    /// event. Refused with `InvalidState` below the slots in use (queued
    /// events plus reserved DTO completions).
    pub fn resize(&self, qlen: usize) -> Result<()> {
        self.inner.check_live()?;
        if qlen == 0 {
            return Err(Error::param(2, "evd_min_qlen must be at least 1"));
        }
        if qlen > MAX_QLEN {
            return Err(Error::InsufficientResources {
                resource: Subtype::ResourceTevd,
                what: "evd_min_qlen above the maximum EVD queue length",
            });
        }
        if self.inner.load().has(WAITER) {
            return Err(Error::state(
                Subtype::InvalidStateEvdWaiter,
                "a waiter owns the EVD (resize would change its threshold's bound)",
            ));
        }
        // Room in storage first, so capacity never exceeds it.
        self.inner.storage.grow(qlen);
        let reserved = &self.inner.prod.reserved;
        loop {
            // `freed` before `reserved` (see `occupied`); slots freed
            // meanwhile only make the check conservative.
            let freed = self.inner.freed();
            let cur = reserved.load(Ordering::SeqCst);
            // A free that zeroed the queue length before this read set
            // `FREED` before it: refused, never a freed EVD given room
            // again (its CAS below fails if the free comes after the read).
            self.inner.check_live()?;
            let occupied = (cur & TAKEN_MASK).wrapping_sub(freed) & TAKEN_MASK;
            if occupied > qlen as u64 {
                return Err(Error::state(
                    Subtype::InvalidStateEvdInUse,
                    "more events queued or reserved than the new queue length",
                ));
            }
            let next = (cur & TAKEN_MASK) | ((qlen as u64) << TAKEN_BITS);
            if reserved
                .compare_exchange_weak(cur, next, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                // Room may have changed: the next loss is a new episode.
                self.inner.overflow_mark.store(0, Ordering::SeqCst);
                return Ok(());
            }
        }
    }

    /// Reports the EVD's parameters (`dat_evd_query`).
    pub fn query(&self) -> Result<EvdParam> {
        let s = self.inner.check_live()?;
        Ok(EvdParam {
            handle: self.inner.id,
            qlen: self.inner.qlen(),
            flags: self.inner.flags,
            upcall_policy: UpcallPolicy::from_state(s.policy()),
            has_upcall: self.inner.upcall.lock().is_some(),
            pending: self.inner.storage.len(),
            occupied: self.inner.occupied() as usize,
            enabled: self.inner.enabled.load(Ordering::SeqCst),
            waitable: !s.has(UNWAITABLE),
            cno: self.inner.cno.lock().as_ref().map(|l| l.cno().handle()),
            overflows: self.inner.overflows.load(Ordering::SeqCst),
            feeders: self.inner.feeders.load(Ordering::SeqCst),
            upcall_panics: self.inner.upcall_panics.load(Ordering::SeqCst),
            dropped_reservations: self.inner.dropped_reservations.load(Ordering::SeqCst),
        })
    }

    /// Frees the EVD (`dat_evd_free`). Refused with `InvalidState` while
    /// endpoints or service points feed it, or an open IA reports its
    /// asynchronous events to it (as uDAPL counts that use). Queued events are discarded; a
    /// blocked waiter returns `Abort`; later calls return `InvalidHandle`.
    /// No upcall begins once this returns; upcalls already running finish
    /// (use `Teardown` first to wait for them).
    pub fn free(&self) -> Result<()> {
        let inner = &self.inner;
        let feed = inner.feed_lock.lock();
        if inner.feeders.load(Ordering::SeqCst) > 0 {
            return Err(Error::state(
                Subtype::InvalidStateEvdInUse,
                "endpoints or service points still feed this EVD",
            ));
        }
        let prev = inner.update(|s| {
            if s.has(FREED) {
                return Err(Error::InvalidHandle(Subtype::NoSubtype));
            }
            Ok((
                s.set(FREED)
                    .with_policy(Policy::Disabled)
                    .clear(WAIT_ARMED | STREAM_ARMED | CNO_ENABLED),
                s,
            ))
        })?;
        drop(feed);
        // No more reservations or posts: queue length 0.
        inner.prod.reserved.fetch_and(TAKEN_MASK, Ordering::SeqCst);
        // No upcall begins once `free` returns.
        inner.wait_for_starting();
        if prev.has(WAITER) {
            inner.waiter.raise();
        }
        #[cfg(feature = "stream")]
        {
            // Taken under the lock, woken after it (a waker may poll the
            // stream inline).
            let wakers = inner.stream_wakers.lock().take();
            crate::stream::wake_all(wakers);
        }
        // Break reference cycles through the upcall object and the CNO.
        *inner.upcall.lock() = None;
        *inner.cno.lock() = None;
        *inner.counted.lock() = None;
        // Queued events become unreachable and are dropped with the last
        // handle.
        if prev.has(TD_WAITING) {
            let _g = inner.teardown_lock.lock();
            inner.teardown_cv.notify_all();
        }
        Ok(())
    }

    /// uDAT `dat_evd_enable`: arrivals trigger the attached CNO.
    pub fn enable(&self) -> Result<()> {
        self.inner.check_live()?;
        self.inner.enabled.store(true, Ordering::SeqCst);
        self.sync_cno_flag();
        self.inner.park_progress();
        Ok(())
    }

    /// uDAT `dat_evd_disable`: arrivals no longer trigger the CNO (a trigger
    /// already in progress may still wake a CNO waiter).
    pub fn disable(&self) -> Result<()> {
        self.inner.check_live()?;
        self.inner.enabled.store(false, Ordering::SeqCst);
        self.sync_cno_flag();
        Ok(())
    }

    /// uDAT `dat_evd_set_unwaitable`: `wait` is refused, and a blocked
    /// waiter returns `InvalidState`.
    pub fn set_unwaitable(&self) -> Result<()> {
        self.inner.check_live()?;
        let prev = self
            .inner
            .update::<_, Error>(|s| Ok((s.set(UNWAITABLE).clear(WAIT_ARMED), s)))?;
        if prev.has(WAIT_ARMED) {
            self.inner.waiter.raise();
        }
        Ok(())
    }

    /// uDAT `dat_evd_clear_unwaitable`.
    pub fn clear_unwaitable(&self) -> Result<()> {
        self.inner.check_live()?;
        self.inner
            .update::<_, Error>(|s| Ok((s.clear(UNWAITABLE), ())))
    }

    /// uDAT `dat_evd_modify_cno`: attach, replace or detach (`None`) the CNO.
    /// As DAT warns, a notification may still reach the old CNO.
    /// `InvalidHandle(CNO)` for a freed CNO.
    pub fn modify_cno(&self, cno: Option<&Cno>) -> Result<()> {
        let link = cno.map(Cno::link).transpose()?;
        {
            // Checked under the slot's lock, which `free` clears it under
            // once the EVD is marked freed: no link outlives the free.
            let mut slot = self.inner.cno.lock();
            self.inner.check_live()?;
            *slot = link;
        }
        self.sync_cno_flag();
        Ok(())
    }

    fn sync_cno_flag(&self) {
        // Hold the CNO slot while setting the flag so concurrent
        // `modify_cno`/`enable` calls leave flag and slot consistent.
        let slot = self.inner.cno.lock();
        let on = slot.is_some() && self.inner.enabled.load(Ordering::SeqCst);
        let _ = self.inner.update::<_, ()>(|s| {
            Ok((
                if on {
                    s.set(CNO_ENABLED)
                } else {
                    s.clear(CNO_ENABLED)
                },
                (),
            ))
        });
        drop(slot);
    }

    // ----- the producing side: `producer.rs` -------------------------------

    /// Hints that a completion is coming soon: the lines a publish
    /// writes are fetched now (see `ring::prefetch_write`). (Used by the
    /// loopback provider; a no-op under loom.)
    #[inline]
    pub fn prefetch_complete(&self) {
        #[cfg(not(rdapl_loom))]
        self.inner.storage.prefetch_push();
    }

    /// [`EvdProducer::feeder`] for an object being created by an IA whose
    /// async EVD is `ia_async`: an EVD made without an async EVD
    /// (`Evd::create`) reports its overflows there from now on. Refused
    /// with `InvalidHandle(sub)` if the EVD is freed, checked under the
    /// lock `free` takes, so that the two never both succeed.
    pub(crate) fn try_feeder_of(&self, ia_async: &Evd, sub: Subtype) -> Result<Feeder> {
        let _g = self.inner.feed_lock.lock();
        if self.inner.load().has(FREED) {
            return Err(Error::InvalidHandle(sub));
        }
        {
            let mut a = self.inner.async_evd.lock();
            if a.is_none() && !Arc::ptr_eq(&ia_async.inner, &self.inner) {
                *a = Some(ia_async.clone());
            }
        }
        Ok(self.feeder())
    }

    /// True if the EVD was freed.
    pub fn is_freed(&self) -> bool {
        self.inner.load().has(FREED)
    }
}

/// Keeps an EVD from being freed while an endpoint or service point feeds it.
pub struct Feeder {
    evd: Evd,
}

impl fmt::Debug for Feeder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Feeder").field(&self.evd.inner.id).finish()
    }
}

impl Feeder {
    /// The EVD being fed.
    pub fn evd(&self) -> &Evd {
        &self.evd
    }
}

impl Drop for Feeder {
    fn drop(&mut self) {
        self.evd.inner.feeders.fetch_sub(1, Ordering::SeqCst);
    }
}

crate::context::consumer_context!(Evd, |s| s.inner.context);
