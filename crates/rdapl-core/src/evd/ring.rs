//! The EVD's event ring: a bounded multi-producer multi-consumer FIFO of
//! events held by value, with batch claims, that can grow while in use.
//!
//! This is the lock-free core of the EVD and one of the few modules of
//! rdapl with `unsafe` code (reading and writing slots that the atomics below
//! have handed to one thread).
//!
//! # Design
//!
//! A [`Ring`] is an array of `2^k` slots, each with a *stamp* (after
//! Vyukov's bounded queue, as in crossbeam's `ArrayQueue`). Position `p`
//! lives in slot `p mod cap`; the slot's stamp is `p` when it is free for
//! the producer of position `p`, `p + 1` once that producer wrote it, and
//! `p + cap` once a consumer took it (free for position `p + cap`).
//!
//! * **Producers never find a ring full**: the EVD hands out capacity by
//!   reservation before anything is pushed (`evd/mod.rs`), and a ring's
//!   capacity is at least the queue length. So a push is a `fetch_add` on the
//!   tail, a write and a stamp store. The slot of position `p` can still be
//!   in the hands of the consumer of position `p - cap` (it advanced the head
//!   and is copying the event out); the producer then waits for that copy.
//!   It cannot be waiting for an event nobody has taken: `cap` events queued
//!   plus this one would exceed the queue length.
//! * **Consumers claim with one CAS on the head**, for one event or for a
//!   whole batch of consecutive ready slots. Head and tail are on separate
//!   cache lines: producers and consumers share only the slots.
//! * **Growing** (`dat_evd_resize` above the capacity) links a larger ring
//!   after the current one. The old ring is *closed* by setting a bit in its
//!   tail: a producer whose `fetch_add` returns the bit pushes into the new
//!   ring instead, and consumers move on once they have taken every position
//!   below the closing point. Old rings are kept until the storage is
//!   dropped (growing is rare), so no pointer is ever dangling.
//!
//! # What the EVD relies on
//!
//! * A pop takes an event for exactly one consumer, in FIFO order of the
//!   producers' tail positions.
//! * A push claims its position with a `SeqCst` read-modify-write and runs
//!   the caller's check between that claim and the write
//!   ([`Storage::push_then`]); [`Storage::any_claimed`] after a consumer's
//!   `SeqCst` write and fence sees every claim that the producer's check did
//!   not see the write for (the Dekker pattern of `state.rs`), also across a
//!   ring change.

#![allow(unsafe_code)]

use crate::event::Event;
use crate::sync::{self, AtomicPtr, AtomicU64, Mutex, Ordering, UnsafeCell};
use crossbeam_utils::CachePadded;
use std::mem::MaybeUninit;
use std::sync::Arc as StdArc;

/// Defines a prefetch hint: a function that asks the CPU for the cache
/// line at `addr` with the given x86-64 instruction (a no-op elsewhere,
/// under loom and under Miri, which runs no inline assembly).
macro_rules! prefetch_hint {
    ($(#[$doc:meta])* $name:ident, $insn:literal) => {
        $(#[$doc])*
        #[inline(always)]
        pub fn $name(addr: *const u8) {
            #[cfg(all(target_arch = "x86_64", not(rdapl_loom), not(miri)))]
            // SAFETY: a prefetch is a hint: it cannot fault (any address
            // is allowed, mapped or not), changes no register or memory
            // contents the program can observe, and CPUs without the
            // instruction execute it as a no-op.
            unsafe {
                std::arch::asm!(
                    concat!($insn, " [{a}]"),
                    a = in(reg) addr,
                    options(nostack, preserves_flags, readonly)
                );
            }
            #[cfg(not(all(target_arch = "x86_64", not(rdapl_loom), not(miri))))]
            let _ = addr;
        }
    };
}

prefetch_hint!(
    /// Asks the CPU to fetch, for writing, the cache line at `addr`: a hint
    /// only. A thread about to touch several lines that another core holds
    /// (the peer's receive queue, its EVD's tail, the receive buffer) can
    /// ask for all of them at once, so their transfers overlap instead of
    /// running one after the other behind each locked instruction.
    prefetch_write,
    "prefetchw"
);

prefetch_hint!(
    /// Asks the CPU to fetch, for reading, the cache line at `addr`: a hint
    /// only (see [`prefetch_write`]).
    prefetch_read,
    "prefetcht0"
);

/// Set in a ring's tail once it is closed.
const CLOSED: u64 = 1 << 63;

/// One slot, on a cache line of its own, and on x86-64 (as on the other
/// targets where crossbeam's `CachePadded` takes 128 bytes) on a 128-byte
/// pair of lines of its own: those CPUs fetch lines in aligned pairs (the
/// adjacent-line prefetcher), so with 64-byte slots a producer writing the
/// slot of position `p - 1` (a full EVD: the slot the consumer just freed)
/// or `p + 1` (an empty one) pulled away the line of `p` that the consumer
/// was reading. A ring of `cap` slots thus takes `cap * 128` bytes (the
/// measurements: `rdapl-bench/HISTORY.md`, "The ring's layout").
#[cfg_attr(
    any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "powerpc64"
    ),
    repr(align(128))
)]
#[cfg_attr(
    not(any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "powerpc64"
    )),
    repr(align(64))
)]
struct Slot {
    stamp: AtomicU64,
    val: UnsafeCell<MaybeUninit<Event>>,
}

/// One fixed-capacity ring (see the module docs).
struct Ring {
    tail: CachePadded<AtomicU64>,
    head: CachePadded<AtomicU64>,
    /// The first position that does not exist (valid once `tail` has
    /// `CLOSED`; stored before the bit is set).
    close_pos: AtomicU64,
    /// The ring that follows this one (set before it is closed).
    next: AtomicPtr<Ring>,
    /// Events taken from the rings before this one (set before consumers
    /// move to it).
    base: AtomicU64,
    mask: u64,
    slots: Box<[Slot]>,
}

/// Why a ring had nothing to take.
enum Stop {
    /// No event at the head yet.
    Empty,
    /// The ring is closed and drained: move on to the next one.
    Closed,
}

// SAFETY: slots are handed to one thread at a time by the stamp protocol
// (a producer writes only the slot of the position its `fetch_add` returned,
// after the stamp says the slot is free; a consumer reads only slots whose
// positions its head CAS claimed, after the stamp says they were written),
// and `Event` is `Send`.
unsafe impl Send for Ring {}
// SAFETY: as above: all shared access goes through the atomics.
unsafe impl Sync for Ring {}

impl Ring {
    fn new(cap: usize) -> Ring {
        let cap = cap.max(2).next_power_of_two();
        let slots = (0..cap as u64)
            .map(|i| Slot {
                stamp: AtomicU64::new(i),
                val: UnsafeCell::new(MaybeUninit::uninit()),
            })
            .collect();
        Ring {
            tail: CachePadded::new(AtomicU64::new(0)),
            head: CachePadded::new(AtomicU64::new(0)),
            close_pos: AtomicU64::new(u64::MAX),
            next: AtomicPtr::new(std::ptr::null_mut()),
            base: AtomicU64::new(0),
            mask: cap as u64 - 1,
            slots,
        }
    }

    fn cap(&self) -> u64 {
        self.mask + 1
    }

    #[inline(always)]
    fn slot(&self, pos: u64) -> &Slot {
        let i = (pos & self.mask) as usize;
        debug_assert!(i < self.slots.len());
        // SAFETY: `slots` has `mask + 1` entries (`Ring::new`, never
        // resized), so `pos & mask` is always an index into it.
        unsafe { self.slots.get_unchecked(i) }
    }

    /// Pushes `ev`, or gives it back if the ring is closed.
    /// Claims the next position for a push (`SeqCst`: this increment is
    /// what consumers' fenced checks see, see [`Storage::push_then`]), or
    /// fails if the ring is closed.
    #[inline]
    fn claim(&self) -> Result<u64, ()> {
        let t = self.tail.fetch_add(1, Ordering::SeqCst);
        if t & CLOSED != 0 { Err(()) } else { Ok(t) }
    }

    /// Writes the event of claimed position `t`.
    #[inline(always)]
    fn write(&self, t: u64, ev: Event) {
        let slot = self.slot(t);
        // The slot's line is usually in the consumer's cache (it freed the
        // slot a lap ago, or is polling it): ask for it for writing before
        // reading the stamp, so that one transfer brings it ready for the
        // stores below, rather than a read followed by an upgrade that the
        // producer's next locked instruction would wait for (measured
        // with the prefetch in `pop_batch`: `rdapl-bench/HISTORY.md`, "The
        // ring's layout").
        prefetch_write(slot as *const Slot as *const u8);
        // Normally free at once; otherwise the consumer of `t - cap` is
        // copying its event out (see the module docs).
        let mut spins = 0u32;
        while slot.stamp.load(Ordering::Acquire) != t {
            sync::spin_wait(&mut spins);
        }
        slot.val.with_mut(|p| {
            // SAFETY: the stamp says the slot is free for position `t`, and
            // only the producer that got `t` from the tail writes it.
            unsafe { (*p).write(ev) };
        });
        slot.stamp.store(t + 1, Ordering::Release);
    }

    /// What is at `head` when its slot holds no event for it: nothing yet,
    /// or the closing point of a closed ring.
    fn empty_or_closed(&self, head: u64) -> Stop {
        // Only a ring with a successor can be closed (`next` is set first);
        // checking that read-mostly word first keeps consumers that poll an
        // empty ring off the producers' tail line. A consumer that misses a
        // close that is under way reports Empty for a moment; the fenced
        // checks of the EVD protocol use `any_claimed`, which reads the tail.
        if self.next.load(Ordering::Acquire).is_null() {
            return Stop::Empty;
        }
        let tail = self.tail.load(Ordering::Acquire);
        if tail & CLOSED != 0 && self.close_pos.load(Ordering::Acquire) == head {
            Stop::Closed
        } else {
            Stop::Empty
        }
    }

    /// Reads the event of a claimed position and frees its slot.
    #[inline]
    fn take(&self, pos: u64) -> Event {
        let slot = self.slot(pos);
        let ev = slot.val.with(|p| {
            // SAFETY: this thread's head CAS claimed `pos`, whose stamp said
            // it was written (acquire load before the CAS); nobody else
            // reads or writes the slot until the stamp below frees it.
            unsafe { (*p).assume_init_read() }
        });
        slot.stamp.store(pos + self.cap(), Ordering::Release);
        ev
    }

    /// Takes the event at the head (the one-event case of
    /// [`Ring::pop_batch`], without its batch scan).
    #[inline]
    fn pop_one(&self) -> Result<Event, Stop> {
        let mut h = self.ready_head(self.head.load(Ordering::Acquire))?;
        loop {
            match self
                .head
                .compare_exchange_weak(h, h + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(self.take(h)),
                Err(cur) => h = self.ready_head(cur)?,
            }
        }
    }

    /// Takes up to `max` events (at least 1), handing each to `out`.
    fn pop_batch(&self, max: usize, out: &mut impl FnMut(Event)) -> Result<usize, Stop> {
        let max = (max as u64).min(self.cap());
        let mut h = self.ready_head(self.head.load(Ordering::Acquire))?;
        loop {
            let mut k = 1;
            while k < max && self.slot(h + k).stamp.load(Ordering::Acquire) == h + k + 1 {
                k += 1;
            }
            // `take` frees each slot with a store: ask for the run's lines
            // for writing now, before the head CAS, so that those upgrades
            // overlap instead of each waiting in the store buffer. (Not in
            // `pop_one`: for one event it measured slower.)
            for pos in h..h + k {
                prefetch_write(self.slot(pos) as *const Slot as *const u8);
            }
            match self
                .head
                .compare_exchange_weak(h, h + k, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    for pos in h..h + k {
                        out(self.take(pos));
                    }
                    return Ok(k as usize);
                }
                Err(cur) => h = self.ready_head(cur)?,
            }
        }
    }

    /// The head position (starting from `h`, a head value read earlier)
    /// once its slot holds a written event, or why there is none.
    #[inline]
    fn ready_head(&self, mut h: u64) -> Result<u64, Stop> {
        loop {
            let st = self.slot(h).stamp.load(Ordering::Acquire);
            let d = st.wrapping_sub(h + 1) as i64;
            if d == 0 {
                return Ok(h);
            }
            if d < 0 {
                return Err(self.empty_or_closed(h));
            }
            // Another consumer took `h`: look at the new head.
            h = self.head.load(Ordering::Acquire);
        }
    }

    /// True if the slot at the head holds no event; `Err(())` if the ring is
    /// closed and drained (look at the next one).
    fn is_empty(&self) -> Result<bool, ()> {
        match self.ready_head(self.head.load(Ordering::Acquire)) {
            Ok(_) => Ok(false),
            Err(Stop::Empty) => Ok(true),
            Err(Stop::Closed) => Err(()),
        }
    }

    /// How many events from the head on (up to `k`) are written and ready;
    /// `closed_end`: the count stopped at the closing point of this ring.
    fn ready(&self, k: u64) -> (u64, bool) {
        let h = self.head.load(Ordering::Acquire);
        let mut n = 0;
        while n < k && self.slot(h + n).stamp.load(Ordering::Acquire) == h + n + 1 {
            n += 1;
        }
        let closed_end = n < k && matches!(self.empty_or_closed(h + n), Stop::Closed);
        (n, closed_end)
    }

    /// True if producers claimed positions at or past the head (written or
    /// not); `Err(())` if the ring is closed and drained.
    fn any_claimed(&self) -> Result<bool, ()> {
        let h = self.head.load(Ordering::SeqCst);
        let t = self.tail.load(Ordering::SeqCst);
        if t & CLOSED != 0 {
            let end = self.close_pos.load(Ordering::Acquire);
            return if h >= end { Err(()) } else { Ok(true) };
        }
        Ok(t > h)
    }

    /// Events pushed or being pushed and not yet claimed (approximate while
    /// others run).
    fn len(&self) -> usize {
        let t = self.tail.load(Ordering::Acquire);
        let end = if t & CLOSED != 0 {
            self.close_pos.load(Ordering::Acquire)
        } else {
            t
        };
        let h = self.head.load(Ordering::Acquire);
        end.saturating_sub(h) as usize
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // Exclusive access: drop every event written and not taken.
        let h = self.head.load(Ordering::Relaxed);
        let t = self.tail.load(Ordering::Relaxed);
        let end = if t & CLOSED != 0 {
            self.close_pos.load(Ordering::Relaxed)
        } else {
            t
        };
        for pos in h..end {
            let slot = self.slot(pos);
            if slot.stamp.load(Ordering::Relaxed) == pos + 1 {
                slot.val.with_mut(|p| {
                    // SAFETY: the stamp says the slot holds the event of
                    // `pos`, which nobody took; we have `&mut self`.
                    unsafe { (*p).assume_init_drop() }
                });
            }
        }
    }
}

/// The EVD's event storage: the chain of rings.
pub(crate) struct Storage {
    /// The ring producers push into.
    prod: CachePadded<AtomicPtr<Ring>>,
    /// The ring consumers take from.
    cons: CachePadded<AtomicPtr<Ring>>,
    /// Owns every ring ever used, oldest first (see the module docs). The
    /// `Arc` (never cloned) keeps a ring's address stable when the vector
    /// grows and, unlike a `Box`, does not claim unique access to the ring
    /// when it moves, so the raw pointers in `prod`, `cons` and the rings'
    /// `next` stay valid under Rust's aliasing rules (Miri checks this).
    rings: Mutex<Vec<StdArc<Ring>>>,
}

impl Storage {
    /// Storage for at least `cap` events.
    pub(crate) fn new(cap: usize) -> Storage {
        let ring = StdArc::new(Ring::new(cap));
        let p = ring_ptr(&ring);
        Storage {
            prod: CachePadded::new(AtomicPtr::new(p)),
            cons: CachePadded::new(AtomicPtr::new(p)),
            rings: Mutex::new(vec![ring]),
        }
    }

    #[inline(always)]
    fn prod_ring(&self) -> &Ring {
        // SAFETY: the pointer is to a ring owned by `self.rings`, which only
        // grows while `self` lives.
        unsafe { &*self.prod.load(Ordering::Acquire) }
    }

    #[inline(always)]
    fn cons_ring(&self) -> &Ring {
        // SAFETY: as in `prod_ring`.
        unsafe { &*self.cons.load(Ordering::Acquire) }
    }

    /// Moves consumers from the closed, drained ring `r` to its successor.
    fn advance(&self, r: &Ring) {
        let next = r.next.load(Ordering::Acquire);
        debug_assert!(
            !next.is_null(),
            "a ring is closed only once it has a successor"
        );
        // Every consumer that gets here computes the same value.
        let base = r.base.load(Ordering::Acquire) + r.close_pos.load(Ordering::Acquire);
        // SAFETY: successors are owned by `self.rings`.
        unsafe { &*next }.base.store(base, Ordering::Release);
        let _ = self.cons.compare_exchange(
            r as *const Ring as *mut Ring,
            next,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// Appends an event. The caller holds a reservation for it.
    #[inline]
    pub(crate) fn push(&self, ev: Event) {
        self.push_then(ev, || ())
    }

    /// Appends an event and runs `then` between claiming its position and
    /// writing it. The claim is a `SeqCst` read-modify-write and is what
    /// [`Storage::any_claimed`] reports, so a `SeqCst` read of another
    /// location in `then` and a consumer's `SeqCst` write before its
    /// `any_claimed` form the Dekker pattern: one of the two sees the
    /// other. Deciding there, before the write, keeps the producer from
    /// stalling on the store of a line the consumer is reading (a fence
    /// after the write would). Under loom, which models `SeqCst` accesses as
    /// acquire/release only, an explicit fence stands for that guarantee.
    #[inline(always)]
    pub(crate) fn push_then<R>(&self, ev: Event, then: impl FnOnce() -> R) -> R {
        let mut spins = 0;
        let (ring, pos) = loop {
            let r = self.prod_ring();
            match r.claim() {
                Ok(pos) => break (r, pos),
                // Closed: `grow` publishes the next ring right after.
                Err(()) => sync::spin_wait(&mut spins),
            }
        };
        #[cfg(rdapl_loom)]
        crate::sync::fence(Ordering::SeqCst);
        let out = then();
        ring.write(pos, ev);
        out
    }

    /// Hints that a push is coming: fetches the producers' tail line, and
    /// the slot the push will probably write (the one at the tail now).
    /// The slot's line is usually in the consumer's cache, which polls it;
    /// without this hint the push asks for it only once its position is
    /// claimed, and then waits for it (measured on the loopback ping-pong:
    /// `rdapl-bench/HISTORY.md`, "Loopback provider and the EVD's costs").
    #[inline]
    pub(crate) fn prefetch_push(&self) {
        let r = self.prod_ring();
        prefetch_write(&*r.tail as *const AtomicU64 as *const u8);
        let t = r.tail.load(Ordering::Relaxed);
        if t & CLOSED == 0 {
            prefetch_write(r.slot(t) as *const Slot as *const u8);
        }
    }

    /// True if producers have claimed positions not yet taken, written or
    /// still being written. A consumer that arms a notification with a
    /// `SeqCst` write and then finds `false` here is sure every producer
    /// that claims later sees its write (see [`Storage::push_then`]); one
    /// that finds `true` must not sleep: the event is there or arriving.
    pub(crate) fn any_claimed(&self) -> bool {
        loop {
            let r = self.cons_ring();
            match r.any_claimed() {
                Ok(b) => return b,
                Err(()) => self.advance(r),
            }
        }
    }

    /// Takes the oldest event.
    #[inline]
    pub(crate) fn pop(&self) -> Option<Event> {
        loop {
            let r = self.cons_ring();
            match r.pop_one() {
                Ok(ev) => return Some(ev),
                Err(Stop::Empty) => return None,
                Err(Stop::Closed) => self.advance(r),
            }
        }
    }

    /// [`Storage::pop`] that, finding no event, asks `again()` whether to
    /// look once more (after it made progress elsewhere).
    #[inline]
    pub(crate) fn pop_again(&self, mut again: impl FnMut() -> bool) -> Option<Event> {
        loop {
            let r = self.cons_ring();
            match r.pop_one() {
                Ok(ev) => return Some(ev),
                Err(Stop::Empty) => {
                    if !again() {
                        return None;
                    }
                }
                Err(Stop::Closed) => self.advance(r),
            }
        }
    }

    /// Takes up to `max` events, oldest first, handing each to `out`;
    /// returns how many.
    pub(crate) fn pop_batch(&self, max: usize, mut out: impl FnMut(Event)) -> usize {
        if max == 0 {
            return 0;
        }
        let mut total = 0;
        loop {
            let r = self.cons_ring();
            match r.pop_batch(max - total, &mut out) {
                Ok(n) => {
                    total += n;
                    // A batch stops at the end of a ring's ready run; carry
                    // on into the next ring only if this one was replaced.
                    if total == max || r.next.load(Ordering::Acquire).is_null() {
                        return total;
                    }
                }
                Err(Stop::Closed) => self.advance(r),
                Err(Stop::Empty) => return total,
            }
        }
    }

    /// True if no event is ready to be taken.
    pub(crate) fn is_empty(&self) -> bool {
        loop {
            let r = self.cons_ring();
            match r.is_empty() {
                Ok(e) => return e,
                Err(()) => self.advance(r),
            }
        }
    }

    /// True if at least `k` events are ready to be taken (written, not
    /// claimed). Unlike [`Storage::len`], pushes still in progress do not
    /// count, so a consumer told "yes" finds the events (unless another
    /// consumer takes them first).
    pub(crate) fn ready_at_least(&self, k: usize) -> bool {
        if k <= 1 {
            return k == 0 || !self.is_empty();
        }
        // Cheap bound first (claimed positions, written or not), so a waiter
        // with a large threshold does not scan stamps on every check.
        if self.len() < k {
            return false;
        }
        let mut want = k as u64;
        let mut r = self.cons_ring();
        loop {
            let (n, closed_end) = r.ready(want);
            want -= n;
            if want == 0 {
                return true;
            }
            if !closed_end {
                return false;
            }
            // SAFETY: a closed ring has a successor owned by `self.rings`.
            r = unsafe { &*r.next.load(Ordering::Acquire) };
        }
    }

    /// Events queued as `modify_upcall` reports them: 0 unless producers
    /// claimed positions not yet taken (see [`Storage::any_claimed`]), else
    /// the depth including pushes in progress.
    pub(crate) fn claimed(&self) -> usize {
        if self.any_claimed() {
            self.len().max(1)
        } else {
            0
        }
    }

    /// Events ever taken by consumers: claims advance the head, so this is
    /// counted on the consumers' own line with no extra operation. A value
    /// read while consumers move to a new ring may lag (it is never ahead).
    pub(crate) fn consumed(&self) -> u64 {
        let r = self.cons_ring();
        r.base.load(Ordering::Acquire) + r.head.load(Ordering::Acquire)
    }

    /// A lower bound of [`Storage::consumed`] read from the slots rather
    /// than from the consumers' head (the line they write with every
    /// claim), as a bounded queue's producer checks its next slot before
    /// the head. A slot's stamp reaches `pos + cap` once position `pos` was
    /// taken (its consumer's claim advanced the head past it), and only
    /// grows after that. From `known` (a value `consumed` gave earlier) it
    /// looks at two slots only:
    ///
    /// * the last of the `want` positions from `known`: taken, then so was
    ///   every position below it (claims advance the head in order), and
    ///   `known + want` is returned;
    /// * else the first, the one the producer's next push writes: taken,
    ///   `known + 1`; not taken, `known`.
    ///
    /// Never the slots in between: when the EVD is full and a consumer
    /// takes events one by one, the slot it is working on is there, and a
    /// producer that read it would pull that line away from the consumer
    /// once per event (the full-queue slowdown; a forward scan up to the
    /// first untaken slot did exactly that). `None` while the rings change
    /// or if `known` is from an older ring (ask `consumed` then).
    pub(crate) fn consumed_from_slots(&self, known: u64, want: u64) -> Option<u64> {
        let r = self.cons_ring();
        if !r.next.load(Ordering::Acquire).is_null() {
            return None;
        }
        let base = r.base.load(Ordering::Acquire);
        let start = known.checked_sub(base)?;
        let taken = |h: u64| r.slot(h).stamp.load(Ordering::Acquire) >= h + r.cap();
        let far = start + want.max(1) - 1;
        let h = if taken(far) {
            far + 1
        } else if taken(start) {
            start + 1
        } else {
            start
        };
        Some(base + h)
    }

    /// Events queued (including pushes in progress).
    pub(crate) fn len(&self) -> usize {
        let mut r = self.cons_ring();
        let mut n = r.len();
        loop {
            let next = r.next.load(Ordering::Acquire);
            if next.is_null() {
                return n;
            }
            // SAFETY: successors are owned by `self.rings` as well.
            r = unsafe { &*next };
            n += r.len();
        }
    }

    /// Makes room for at least `cap` events (before the queue length is
    /// raised to `cap`). Never shrinks.
    pub(crate) fn grow(&self, cap: usize) {
        let mut rings = self.rings.lock();
        let old = self.prod_ring();
        if old.cap() >= cap as u64 {
            return;
        }
        let ring = StdArc::new(Ring::new(cap));
        let new = ring_ptr(&ring);
        rings.push(ring);
        old.next.store(new, Ordering::Release);
        // Close the old ring at its current tail *before* producers may see
        // the new one: a consumer that finds the old ring empty must then
        // see the close and look further (a producer that pushed into the
        // new ring got there through the close). The closing point is
        // stored before the bit, so whoever sees the bit sees the point.
        let mut t = old.tail.load(Ordering::Acquire);
        loop {
            old.close_pos.store(t, Ordering::Release);
            match old
                .tail
                .compare_exchange(t, t | CLOSED, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(cur) => t = cur,
            }
        }
        // Orders the close before the switch for every observer, also under
        // the fence-only reasoning loom implements.
        crate::sync::fence(Ordering::SeqCst);
        self.prod.store(new, Ordering::Release);
    }
}

fn ring_ptr(r: &StdArc<Ring>) -> *mut Ring {
    StdArc::as_ptr(r).cast_mut()
}

#[cfg(all(test, not(rdapl_loom)))]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn slots_do_not_share_a_prefetch_pair() {
        // Two positions never share an aligned 128-byte pair of lines (see
        // `Slot`): the slot array starts on such a pair and every slot
        // fills whole pairs.
        assert_eq!(std::mem::align_of::<Slot>(), 128);
        assert_eq!(std::mem::size_of::<Slot>() % 128, 0);
        let r = Ring::new(8);
        for p in 0..8 {
            assert_eq!(r.slot(p) as *const Slot as usize % 128, 0);
        }
        assert_eq!(
            r.slot(1) as *const Slot as usize - r.slot(0) as *const Slot as usize,
            std::mem::size_of::<Slot>()
        );
    }

    fn ev(i: u64) -> Event {
        Event::Software(i)
    }
    fn val(e: Event) -> u64 {
        match e {
            Event::Software(v) => v,
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn fifo_wraps_and_batches() {
        let s = Storage::new(4);
        assert!(s.is_empty());
        for round in 0..10u64 {
            for i in 0..4 {
                s.push(ev(round * 4 + i));
            }
            assert_eq!(s.len(), 4);
            assert!(!s.is_empty());
            assert_eq!(val(s.pop().unwrap()), round * 4);
            let mut got = Vec::new();
            assert_eq!(s.pop_batch(8, |e| got.push(val(e))), 3);
            assert_eq!(got, vec![round * 4 + 1, round * 4 + 2, round * 4 + 3]);
            assert!(s.pop().is_none());
            assert!(s.is_empty());
        }
    }

    #[test]
    fn consumed_from_slots_reads_two_slots_and_never_overshoots() {
        let s = Storage::new(16);
        for i in 0..16 {
            s.push(ev(i));
        }
        let pop = |n: usize| {
            for _ in 0..n {
                s.pop().expect("queued");
            }
        };
        // Nothing taken: the lower bound is where it was.
        assert_eq!(s.consumed_from_slots(0, 8), Some(0));
        // The next slot taken: one more.
        pop(1);
        assert_eq!(s.consumed_from_slots(0, 8), Some(1));
        // Four taken: still one, because the slots between the next one and
        // the last of the window (where a consumer is working) are not read.
        pop(3);
        assert_eq!(s.consumed(), 4);
        assert_eq!(s.consumed_from_slots(0, 8), Some(1));
        assert_eq!(s.consumed_from_slots(1, 8), Some(2));
        // The last of the window taken: all of it.
        pop(4);
        assert_eq!(s.consumed_from_slots(0, 8), Some(8));
        // A later window, across the wrap of positions into slots.
        pop(4);
        assert_eq!(s.consumed_from_slots(8, 8), Some(9));
        pop(4);
        assert_eq!(s.consumed_from_slots(8, 8), Some(16));
        // The next lap: slots reused for positions 16.., none taken yet.
        for i in 16..20 {
            s.push(ev(i));
        }
        assert_eq!(s.consumed_from_slots(16, 8), Some(16));
        pop(2);
        assert_eq!(s.consumed_from_slots(16, 8), Some(17));
        // Never above what the head says, whatever `known` and `want`.
        for known in 16..=18 {
            for want in 1..=20 {
                let c = s.consumed_from_slots(known, want).expect("one ring");
                assert!(
                    c >= known && c <= s.consumed().max(known),
                    "{known} {want} {c}"
                );
            }
        }
        // While the rings change: no answer (the head then tells).
        s.grow(64);
        assert_eq!(s.consumed_from_slots(18, 8), None);
    }

    #[test]
    fn grow_keeps_order_across_rings() {
        let s = Storage::new(2);
        s.push(ev(0));
        s.push(ev(1));
        s.grow(8);
        for i in 2..8 {
            s.push(ev(i));
        }
        assert_eq!(s.len(), 8);
        let mut got = Vec::new();
        while let Some(e) = s.pop() {
            got.push(val(e));
        }
        assert_eq!(got, (0..8).collect::<Vec<_>>());
        assert!(s.is_empty());
        s.grow(4); // no-op: already big enough
        s.push(ev(9));
        assert_eq!(val(s.pop().unwrap()), 9);
    }

    #[test]
    fn drop_releases_queued_events_in_every_ring() {
        // Run under valgrind to see the frees; here: no crash, no double drop.
        let s = Storage::new(4);
        let ce = |i: u8| {
            Event::Connection(crate::event::ConnectionEvent {
                kind: crate::event::ConnectionEventKind::Established,
                ep: crate::event::EpHandle(u64::from(i)),
                consumer_context: 0,
                private_data: Some(vec![i; 32].into_boxed_slice()),
            })
        };
        for i in 0..3 {
            s.push(ce(i));
        }
        s.grow(16);
        s.push(ce(3));
        assert!(matches!(s.pop(), Some(Event::Connection(c)) if c.ep.0 == 0));
        drop(s);
    }

    /// Two producers and two consumers, with capacity handed out as the EVD
    /// does (a token per push, given back after the pop), growing midway:
    /// every event is seen once and each producer's events in order.
    #[test]
    fn concurrent_producers_and_consumers_see_each_event_once() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicI64, AtomicU64 as StdU64};
        use std::time::{Duration, Instant};
        // Fewer under Miri, which runs each event thousands of times slower.
        const N: u64 = if cfg!(miri) { 1_000 } else { 100_000 };
        let s = Arc::new(Storage::new(8));
        let room = Arc::new(AtomicI64::new(8));
        let taken = Arc::new(StdU64::new(0));
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut hs = Vec::new();
        for p in 0..2u64 {
            let (s, room) = (s.clone(), room.clone());
            hs.push(std::thread::spawn(move || {
                for i in 0..N {
                    while room.fetch_sub(1, Ordering::AcqRel) <= 0 {
                        room.fetch_add(1, Ordering::AcqRel);
                        assert!(Instant::now() < deadline, "producer stuck");
                        std::thread::yield_now();
                    }
                    if p == 0 && i == N / 2 {
                        s.grow(64);
                        room.fetch_add(56, Ordering::AcqRel);
                    }
                    s.push(ev(p << 32 | i));
                }
            }));
        }
        let mut cs = Vec::new();
        for _ in 0..2 {
            let (s, room, taken) = (s.clone(), room.clone(), taken.clone());
            cs.push(std::thread::spawn(move || {
                let mut last = [None::<u64>; 2];
                let mut batch = Vec::new();
                while taken.load(Ordering::Acquire) < 2 * N {
                    assert!(Instant::now() < deadline, "consumer stuck");
                    batch.clear();
                    let n = s.pop_batch(5, |e| batch.push(val(e)));
                    if n == 0 {
                        std::thread::yield_now();
                        continue;
                    }
                    room.fetch_add(n as i64, Ordering::AcqRel);
                    taken.fetch_add(n as u64, Ordering::AcqRel);
                    for v in &batch {
                        let (p, i) = ((v >> 32) as usize, v & 0xFFFF_FFFF);
                        // Each consumer sees a producer's events in order.
                        assert!(last[p].is_none_or(|l| l < i), "out of order");
                        last[p] = Some(i);
                    }
                }
            }));
        }
        for h in hs.into_iter().chain(cs) {
            h.join().unwrap();
        }
        assert_eq!(taken.load(Ordering::Acquire), 2 * N);
        assert!(s.is_empty());
        assert_eq!(s.len(), 0);
    }
}

/// Loom models of the ring against the contract the EVD relies on (module
/// docs): exactly once in FIFO order, and the fenced emptiness check, also
/// across a ring change. Run with the EVD models (`scripts/test-all.sh`):
/// `RUSTFLAGS="--cfg rdapl_loom" cargo test -p rdapl-core --lib --release`.
#[cfg(all(test, rdapl_loom))]
mod loom_tests {
    use super::*;
    use crate::sync::{Arc, AtomicBool, fence};
    use loom::thread;

    fn ev(i: u64) -> Event {
        Event::Software(i)
    }
    fn val(e: Event) -> u64 {
        match e {
            Event::Software(v) => v,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut b = loom::model::Builder::new();
        if b.preemption_bound.is_none() {
            b.preemption_bound = Some(3);
        }
        b.check(f);
    }

    /// Two producers, one consumer (one pop, one batch) racing them, on a
    /// ring that wraps: every event once, each producer's in order.
    #[test]
    fn two_producers_one_consumer_exactly_once() {
        model(|| {
            let s = Arc::new(Storage::new(2));
            s.push(ev(0));
            s.pop().unwrap();
            let hs: Vec<_> = [10u64, 20]
                .into_iter()
                .map(|p| {
                    let s = s.clone();
                    thread::spawn(move || s.push(ev(p)))
                })
                .collect();
            let mut got = Vec::new();
            if let Some(e) = s.pop() {
                got.push(val(e));
            }
            for h in hs {
                h.join().unwrap();
            }
            s.pop_batch(4, |e| got.push(val(e)));
            got.sort();
            assert_eq!(got, vec![10, 20]);
            assert!(s.is_empty());
        });
    }

    /// The Dekker pattern: a producer claims a position and reads a flag
    /// before writing (`push_then`); a consumer sets the flag, fences and
    /// asks `any_claimed`. One of them must see the other.
    #[test]
    fn fenced_emptiness_check_sees_the_push() {
        model(|| {
            let s = Arc::new(Storage::new(2));
            let flag = Arc::new(AtomicBool::new(false));
            let p = {
                let (s, flag) = (s.clone(), flag.clone());
                thread::spawn(move || s.push_then(ev(1), || flag.load(Ordering::SeqCst)))
            };
            flag.store(true, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            let empty = !s.any_claimed();
            let saw_flag = p.join().unwrap();
            assert!(
                saw_flag || !empty,
                "lost wakeup: neither side saw the other"
            );
            assert_eq!(s.pop().map(val), Some(1));
        });
    }

    /// The same across a ring change: the producer may push into the old
    /// ring (before the close) or the new one; the consumer's fenced check
    /// starts from the old ring.
    #[test]
    fn fenced_emptiness_check_across_grow() {
        model(|| {
            let s = Arc::new(Storage::new(2));
            let flag = Arc::new(AtomicBool::new(false));
            let g = {
                let s = s.clone();
                thread::spawn(move || s.grow(4))
            };
            let p = {
                let (s, flag) = (s.clone(), flag.clone());
                thread::spawn(move || s.push_then(ev(1), || flag.load(Ordering::SeqCst)))
            };
            flag.store(true, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            let empty = !s.any_claimed();
            let saw_flag = p.join().unwrap();
            g.join().unwrap();
            assert!(saw_flag || !empty, "lost wakeup across the ring change");
            s.push(ev(2));
            let mut got = Vec::new();
            s.pop_batch(8, |e| got.push(val(e)));
            assert_eq!(got, vec![1, 2], "FIFO across the ring change");
        });
    }
}
