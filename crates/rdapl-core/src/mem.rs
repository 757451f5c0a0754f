//! Registered memory: protection-checked regions, keys, and the one copy that
//! moves data between them.
//!
//! # Guarantees
//!
//! * **Keys die for good.** A key (`lmr_context` / `rmr_context`) is a 24-bit
//!   slot index and an 8-bit key byte. Freeing, invalidating, re-binding or
//!   re-mapping an entry rotates its key byte; a slot whose key byte has
//!   cycled through all 256 values is retired and never handed out again.
//!   So a key, once dead, is never valid again in this IA.
//! * **No access outside the grant.** Every access is checked against the
//!   entry's protection zone, its range and its rights before a byte moves;
//!   a refused access moves nothing. A segment of zero bytes names no
//!   memory and is not resolved (see the loopback provider on zero-length
//!   RDMA).
//! * **A window lasts no longer than its LMR's mapping.** A window (RMR)
//!   is bound to the mapping its LMR has at the bind. When that LMR is
//!   invalidated, re-mapped, freed or retired (or runs out of keys), every
//!   window bound to it is unbound in the same table change: its key grants
//!   nothing from then on. Binding, unbinding and freeing a window keep its
//!   LMR's count of bound windows exact on every path, failures included.
//! * **Safe memory.** Region memory sits behind a read/write lock; the data
//!   mover takes read locks on sources and write locks on sinks in a fixed
//!   order, so concurrent transfers neither race nor deadlock. Memory comes
//!   in three forms:
//!   - *owned* by rdapl ([`Region::from_vec`], [`Region::zeroed`]): a
//!     `Box<[u8]>` that lives as long as the region;
//!   - *borrowed* from the caller for a scope ([`crate::pz::lmr_scope`],
//!     [`Pz::lmr_create_borrowed`](crate::pz::Pz::lmr_create_borrowed)):
//!     the [`BorrowedLmr`](crate::pz::BorrowedLmr) holds the caller's
//!     `&mut [u8]`, so the caller cannot touch the buffer while it is
//!     registered, and the registration is retired (below) when the
//!     `BorrowedLmr` is dropped or released, and in any case (even if it was
//!     leaked) before the scope returns;
//!   - *raw* caller-owned memory for the C ABI, registered through the one
//!     `unsafe` constructor, [`Region::from_raw`], whose caller keeps the
//!     memory valid until the region is retired.
//! * **Retired memory is never touched again.** [`Region::retire`] marks a
//!   region dead under its write lock, so it first waits for any copy in
//!   progress to finish. Every access to region memory takes the region's
//!   lock and checks the mark under it: a key resolved before the
//!   retirement whose transfer runs after it moves no byte and fails
//!   (`LocalProtection` for a local buffer, `RemoteAccess` for a remote one,
//!   breaking the connection like any DTO error); resolving a key to a
//!   retired region is refused; [`Region::read`] and [`Region::write`]
//!   panic ([`Region::try_read`] and [`Region::try_write`] return `None`).
//!   So once `retire` returns, rdapl never reads or writes that memory
//!   again, and borrowed memory can go back to its owner.

use crate::error::{Error, Result, Subtype};
use crate::event::{DtoStatus, PzHandle};
use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// `DAT_MEM_PRIV_FLAGS`: access rights of a registration.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Default)]
pub struct MemPriv(u32);

impl MemPriv {
    /// `DAT_MEM_PRIV_NONE_FLAG`.
    pub const NONE: MemPriv = MemPriv(0x00);
    /// `DAT_MEM_PRIV_LOCAL_READ_FLAG`.
    pub const LOCAL_READ: MemPriv = MemPriv(0x01);
    /// `DAT_MEM_PRIV_REMOTE_READ_FLAG`.
    pub const REMOTE_READ: MemPriv = MemPriv(0x02);
    /// `DAT_MEM_PRIV_LOCAL_WRITE_FLAG`.
    pub const LOCAL_WRITE: MemPriv = MemPriv(0x10);
    /// `DAT_MEM_PRIV_REMOTE_WRITE_FLAG`.
    pub const REMOTE_WRITE: MemPriv = MemPriv(0x20);
    /// `DAT_MEM_PRIV_ALL_FLAG`.
    pub const ALL: MemPriv = MemPriv(0x33);

    /// From raw bits; `None` if an unknown bit is set.
    pub fn from_bits(bits: u32) -> Option<MemPriv> {
        (bits & !Self::ALL.0 == 0).then_some(MemPriv(bits))
    }
    /// The raw bits.
    pub fn bits(self) -> u32 {
        self.0
    }
    /// True if every right of `other` is granted here.
    pub fn contains(self, other: MemPriv) -> bool {
        self.0 & other.0 == other.0
    }
    /// True if any remote right is granted.
    pub fn any_remote(self) -> bool {
        self.0 & (Self::REMOTE_READ.0 | Self::REMOTE_WRITE.0) != 0
    }
}

impl std::ops::BitOr for MemPriv {
    type Output = MemPriv;
    fn bitor(self, rhs: MemPriv) -> MemPriv {
        MemPriv(self.0 | rhs.0)
    }
}

impl fmt::Debug for MemPriv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        for (p, n) in [
            (Self::LOCAL_READ, "LOCAL_READ"),
            (Self::REMOTE_READ, "REMOTE_READ"),
            (Self::LOCAL_WRITE, "LOCAL_WRITE"),
            (Self::REMOTE_WRITE, "REMOTE_WRITE"),
        ] {
            if self.contains(p) {
                parts.push(n);
            }
        }
        write!(f, "MemPriv({})", parts.join("|"))
    }
}

/// A local scatter/gather entry (`DAT_LMR_TRIPLET`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct LmrTriplet {
    /// The LMR's `lmr_context`.
    pub lmr_context: u32,
    /// Start address inside the LMR.
    pub virtual_address: u64,
    /// Length in bytes.
    pub segment_length: u64,
}

/// A remote buffer (`DAT_RMR_TRIPLET`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct RmrTriplet {
    /// The remote LMR's or RMR's `rmr_context`.
    pub rmr_context: u32,
    /// Start address on the remote side.
    pub target_address: u64,
    /// Length in bytes.
    pub segment_length: u64,
}

enum Backing {
    Owned(RwLock<Box<[u8]>>),
    Raw {
        ptr: *mut u8,
        len: usize,
        lock: RwLock<()>,
    },
}

// SAFETY: a raw backing is only created by `Region::from_raw`, whose caller
// guarantees the memory stays valid and is only accessed through this region
// until the region is retired (or, never retired, while it lives); every
// access goes through `lock` and checks the retirement mark under it, so the
// pointer is never dereferenced after `Region::retire` returns.
#[allow(unsafe_code)]
unsafe impl Send for Backing {}
// SAFETY: as above; shared access is serialised by the read/write lock.
#[allow(unsafe_code)]
unsafe impl Sync for Backing {}

/// A block of registrable memory with a fixed address.
pub struct Region {
    id: u64,
    base: u64,
    len: usize,
    backing: Backing,
    /// Set (under the backing's write lock) by [`Region::retire`]; checked
    /// under the lock by every access.
    retired: AtomicBool,
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Region(#{}, {:#x}+{})", self.id, self.base, self.len)
    }
}

fn next_region_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Read access to a region's bytes.
pub enum RegionRead<'a> {
    /// Owned memory.
    Owned(RwLockReadGuard<'a, Box<[u8]>>),
    /// Raw memory.
    Raw(RwLockReadGuard<'a, ()>, &'a [u8]),
}

impl std::ops::Deref for RegionRead<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            RegionRead::Owned(g) => g,
            RegionRead::Raw(_, s) => s,
        }
    }
}

/// Write access to a region's bytes.
pub enum RegionWrite<'a> {
    /// Owned memory.
    Owned(RwLockWriteGuard<'a, Box<[u8]>>),
    /// Raw memory.
    Raw(RwLockWriteGuard<'a, ()>, &'a mut [u8]),
}

impl std::ops::Deref for RegionWrite<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            RegionWrite::Owned(g) => g,
            RegionWrite::Raw(_, s) => s,
        }
    }
}

impl std::ops::DerefMut for RegionWrite<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            RegionWrite::Owned(g) => g,
            RegionWrite::Raw(_, s) => s,
        }
    }
}

impl Region {
    /// The region's number (the order regions are locked in).
    #[inline]
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// A zero-filled region of `len` bytes owned by rdapl.
    pub fn zeroed(len: usize) -> Arc<Region> {
        Region::from_vec(vec![0; len])
    }

    /// A region owning `data`.
    pub fn from_vec(data: Vec<u8>) -> Arc<Region> {
        let b = data.into_boxed_slice();
        let base = b.as_ptr() as u64;
        Arc::new(Region {
            id: next_region_id(),
            base,
            len: b.len(),
            backing: Backing::Owned(RwLock::new(b)),
            retired: AtomicBool::new(false),
        })
    }

    /// A region over caller-owned memory (the C ABI's `dat_lmr_create` of
    /// `DAT_MEM_TYPE_VIRTUAL`). Safe code borrows memory for a scope
    /// instead: [`Pz::lmr_create_borrowed`](crate::pz::Pz::lmr_create_borrowed).
    ///
    /// # Safety
    ///
    /// `ptr` must be non-null (even when `len` is 0), and `ptr..ptr+len`
    /// must be valid for reads and writes and must not be accessed other
    /// than through this region, from this call until [`Region::retire`]
    /// returns on the returned region or, if it is never retired, for as
    /// long as the region (any clone of the `Arc`: registrations, resolved
    /// spans) lives. After `retire` returns the memory may be used, freed
    /// or reused freely: rdapl never touches it again.
    #[allow(unsafe_code)]
    pub unsafe fn from_raw(ptr: *mut u8, len: usize) -> Arc<Region> {
        Arc::new(Region {
            id: next_region_id(),
            base: ptr as u64,
            len,
            backing: Backing::Raw {
                ptr,
                len,
                lock: RwLock::new(()),
            },
            retired: AtomicBool::new(false),
        })
    }

    /// The address of the first byte (what LMR and RMR triplets refer to).
    pub fn address(&self) -> u64 {
        self.base
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Retires the region: marks it dead under its write lock (so this first
    /// waits for any copy in progress to finish). From then on every access
    /// is refused: transfers through spans resolved earlier fail without
    /// moving a byte, keys naming it no longer resolve, [`Region::read`] and
    /// [`Region::write`] panic. Once this returns rdapl never touches the
    /// region's memory again. Retiring twice is harmless.
    ///
    /// Do not call it while holding one of this region's guards: it would
    /// wait for that guard forever.
    pub fn retire(&self) {
        let _exclusive = match &self.backing {
            Backing::Owned(l) => RegionLock::Owned(l.write()),
            Backing::Raw { lock, .. } => RegionLock::Raw(lock.write()),
        };
        self.retired.store(true, Ordering::Release);
    }

    /// True once [`Region::retire`] has run (or is running).
    #[inline]
    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// Locks the region for reading.
    ///
    /// # Panics
    ///
    /// If the region is retired.
    pub fn read(&self) -> RegionRead<'_> {
        self.try_read().expect("the region is retired")
    }

    /// Locks the region for writing.
    ///
    /// # Panics
    ///
    /// If the region is retired.
    pub fn write(&self) -> RegionWrite<'_> {
        self.try_write().expect("the region is retired")
    }

    /// Locks the region for reading; `None` if it is retired.
    #[inline]
    pub fn try_read(&self) -> Option<RegionRead<'_>> {
        self.read_guard(true)
    }

    /// Locks the region for writing; `None` if it is retired.
    #[inline]
    pub fn try_write(&self) -> Option<RegionWrite<'_>> {
        self.write_guard(true)
    }

    /// [`Region::try_read`] without waiting: `None` if the lock is taken
    /// (or contended) or the region is retired.
    pub(crate) fn try_read_uncontended(&self) -> Option<RegionRead<'_>> {
        self.read_guard(false)
    }

    /// [`Region::try_write`] without waiting: `None` if the lock is taken
    /// (or contended) or the region is retired.
    pub(crate) fn try_write_uncontended(&self) -> Option<RegionWrite<'_>> {
        self.write_guard(false)
    }

    /// The read lock (waited for if `wait`, else only tried), then the
    /// retirement check under it.
    #[inline]
    fn read_guard(&self, wait: bool) -> Option<RegionRead<'_>> {
        match &self.backing {
            Backing::Owned(l) => {
                let g = if wait { l.read() } else { l.try_read()? };
                // Checked under the lock: `retire` sets it under the write lock.
                (!self.is_retired()).then_some(RegionRead::Owned(g))
            }
            Backing::Raw { ptr, len, lock } => {
                let g = if wait { lock.read() } else { lock.try_read()? };
                if self.is_retired() {
                    return None;
                }
                // SAFETY: `from_raw`'s contract: the memory is valid for
                // `len` bytes until the region is retired, and it is not: the
                // mark was clear under the lock, and `retire` needs the write
                // lock, which `g` keeps out for the slice's lifetime. The read
                // lock keeps rdapl's own writers out.
                #[allow(unsafe_code)]
                let s = unsafe { std::slice::from_raw_parts(*ptr as *const u8, *len) };
                Some(RegionRead::Raw(g, s))
            }
        }
    }

    /// The write lock (waited for if `wait`, else only tried), then the
    /// retirement check under it.
    #[inline]
    fn write_guard(&self, wait: bool) -> Option<RegionWrite<'_>> {
        match &self.backing {
            Backing::Owned(l) => {
                let g = if wait { l.write() } else { l.try_write()? };
                (!self.is_retired()).then_some(RegionWrite::Owned(g))
            }
            Backing::Raw { ptr, len, lock } => {
                let g = if wait {
                    lock.write()
                } else {
                    lock.try_write()?
                };
                if self.is_retired() {
                    return None;
                }
                // SAFETY: `from_raw`'s contract, and the region is not retired
                // (checked under the lock, which `retire` needs for writing
                // and `g` holds for the slice's lifetime); the write lock
                // makes this the only rdapl access to the memory.
                #[allow(unsafe_code)]
                let s = unsafe { std::slice::from_raw_parts_mut(*ptr, *len) };
                Some(RegionWrite::Raw(g, s))
            }
        }
    }

    /// The address of the region's lock word (a prefetch hint for a
    /// writer on another core; never dereferenced through this value).
    #[inline]
    pub fn lock_addr(&self) -> usize {
        match &self.backing {
            Backing::Owned(l) => l as *const _ as usize,
            Backing::Raw { lock, .. } => lock as *const _ as usize,
        }
    }

    /// The raw memory of a region made by [`Region::from_raw`].
    pub(crate) fn raw_parts(&self) -> Option<(*mut u8, usize)> {
        match &self.backing {
            Backing::Owned(_) => None,
            Backing::Raw { ptr, len, .. } => Some((*ptr, *len)),
        }
    }
}

/// The write lock [`Region::retire`] takes.
enum RegionLock<'a> {
    Owned(#[allow(dead_code)] RwLockWriteGuard<'a, Box<[u8]>>),
    Raw(#[allow(dead_code)] RwLockWriteGuard<'a, ()>),
}

/// What a registration entry is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum EntryKind {
    /// A plain LMR.
    Lmr,
    /// An RMR (memory window).
    Rmr,
    /// A fast-registration LMR (mapped and invalidated by work requests).
    Fmr,
}

#[derive(Clone)]
pub(crate) struct Entry {
    pub kind: EntryKind,
    pub key: u8,
    pub pz: PzHandle,
    /// `None` while unbound / unmapped / invalidated.
    pub region: Option<Arc<Region>>,
    pub start: u64,
    pub len: u64,
    pub privs: MemPriv,
    /// For RMRs: the LMR slot they are bound to.
    pub parent: Option<u32>,
    /// LMRs: number of RMRs bound to them.
    pub bound_rmrs: u32,
}

struct Slot {
    entry: Option<Entry>,
    next_key: u16,
}

/// A memory access grant resolved from a key: a range of a region.
#[derive(Clone, Debug)]
pub struct Span {
    /// The region.
    pub region: Arc<Region>,
    /// Offset into the region.
    pub offset: usize,
    /// Length.
    pub len: usize,
}

/// The registration table of one IA: keys to entries.
#[derive(Default)]
pub struct MemTable {
    slots: RwLock<Vec<Slot>>,
    free: Mutex<Vec<u32>>,
    /// Bumped under the write lock, before any change: a [`KeyCache`]
    /// entry read at this generation is what the table says as long as the
    /// generation has not moved.
    generation: AtomicU64,
}

const MAX_SLOTS: usize = 1 << 24;

/// Why a peer's Send with Invalidate could not invalidate its key.
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RemoteInvalidate {
    /// The key names no live registration.
    #[error("the key names no live registration")]
    Unknown,
    /// The registration is of another protection zone.
    #[error("the registration is of another protection zone")]
    OtherZone,
    /// A plain LMR: only windows and fast registrations can be invalidated.
    #[error("a plain LMR cannot be invalidated remotely")]
    NotInvalidatable,
}

/// Errors of the access check, before they become a DTO status.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum AccessError {
    /// Unknown or dead key.
    BadKey,
    /// Wrong protection zone.
    WrongPz,
    /// Outside the registered range.
    Range,
    /// The right is not granted.
    Right,
}

/// Clears a window's binding: no memory, no range, no rights, no LMR.
fn clear_binding(w: &mut Entry) {
    w.region = None;
    w.start = 0;
    w.len = 0;
    w.privs = MemPriv::NONE;
    w.parent = None;
}

/// True if `len` bytes at `addr` (a caller's range: one that does not fit
/// the address space lies within nothing) lie within `len_range` bytes at
/// `start` (an entry's range: it ends at the end of the address space at
/// the latest, as [`CachedKey`]'s bounds say). Computed without overflow.
pub(crate) fn within(start: u64, len_range: u64, addr: u64, len: u64) -> bool {
    addr.checked_add(len)
        .is_some_and(|end| addr >= start && end <= start.saturating_add(len_range))
}

impl MemTable {
    /// The table, locked for a change (the generation moves first).
    fn write_slots(&self) -> RwLockWriteGuard<'_, Vec<Slot>> {
        let g = self.slots.write();
        self.generation.fetch_add(1, Ordering::SeqCst);
        g
    }

    /// Adds an entry; returns its context (index << 8 | key byte).
    pub(crate) fn insert(&self, mut entry: Entry) -> Result<u32> {
        let mut slots = self.write_slots();
        let idx = match self.free.lock().pop() {
            Some(i) => i,
            None => {
                if slots.len() >= MAX_SLOTS {
                    return Err(Error::InsufficientResources {
                        resource: Subtype::ResourceMemoryRegion,
                        what: "registration table full",
                    });
                }
                slots.push(Slot {
                    entry: None,
                    next_key: 0,
                });
                (slots.len() - 1) as u32
            }
        };
        let slot = &mut slots[idx as usize];
        entry.key = slot.next_key as u8;
        slot.next_key += 1;
        let ctx = (idx << 8) | entry.key as u32;
        slot.entry = Some(entry);
        Ok(ctx)
    }

    fn slot_of(ctx: u32) -> (usize, u8) {
        ((ctx >> 8) as usize, (ctx & 0xff) as u8)
    }

    /// The live entry of `ctx`.
    pub(crate) fn get(&self, ctx: u32) -> Option<Entry> {
        let (i, k) = Self::slot_of(ctx);
        let slots = self.slots.read();
        let e = slots.get(i)?.entry.as_ref()?;
        (e.key == k).then(|| e.clone())
    }

    /// Runs `f` on the live entry of `ctx` (tests: a raw change, bindings
    /// untouched).
    #[cfg(test)]
    pub(crate) fn with_mut<T>(&self, ctx: u32, f: impl FnOnce(&mut Entry) -> T) -> Option<T> {
        let (i, k) = Self::slot_of(ctx);
        let mut slots = self.write_slots();
        let e = slots.get_mut(i)?.entry.as_mut()?;
        (e.key == k).then(|| f(e))
    }

    /// Gives the entry of `ctx` a new key (the old one dies for good) and
    /// applies `f` to it. Its bindings go with the old key (see
    /// [`MemTable::detach`]): a window leaves the LMR it was bound to, an
    /// LMR's windows are unbound. Returns the new context, or `None` if
    /// `ctx` is not live or the slot ran out of keys (then the entry is
    /// removed, its bindings released the same way).
    pub(crate) fn rekey(&self, ctx: u32, f: impl FnOnce(&mut Entry)) -> Option<u32> {
        let (i, k) = Self::slot_of(ctx);
        let mut slots = self.write_slots();
        if slots.get(i)?.entry.as_ref()?.key != k {
            return None;
        }
        Self::detach(&mut slots, i);
        let slot = &mut slots[i];
        if slot.next_key > 255 {
            slot.entry = None; // retired: no key left in this slot
            return None;
        }
        let e = slot.entry.as_mut()?;
        f(e);
        e.key = slot.next_key as u8;
        slot.next_key += 1;
        Some(((i as u32) << 8) | e.key as u32)
    }

    /// Releases the bindings of the entry in slot `i` (locked: `slots`),
    /// whose key or mapping is about to change or which is about to go:
    ///
    /// * a window leaves the LMR it is bound to (its memory, range and
    ///   rights cleared, the LMR's count of bound windows decremented);
    /// * an LMR's windows are all unbound the same way: a window grants
    ///   access only while the mapping it was bound to lasts, so it never
    ///   reaches memory its LMR no longer maps (invalidated, re-mapped,
    ///   freed). A window only gets memory again through a bind, which
    ///   gives it a new key.
    ///
    /// Returns the number of windows unbound (for an LMR).
    fn detach(slots: &mut [Slot], i: usize) -> usize {
        let Some(e) = slots.get_mut(i).and_then(|s| s.entry.as_mut()) else {
            return 0;
        };
        if e.kind == EntryKind::Rmr {
            let parent = e.parent;
            clear_binding(e);
            if let Some(p) = parent {
                let (li, lk) = Self::slot_of(p);
                if let Some(l) = slots
                    .get_mut(li)
                    .and_then(|s| s.entry.as_mut())
                    .filter(|l| l.key == lk)
                {
                    l.bound_rmrs = l.bound_rmrs.saturating_sub(1);
                }
            }
            return 0;
        }
        // Every window bound to this LMR is counted here (under this lock,
        // by `bind_window` and the window's own `detach`): no scan without.
        if e.bound_rmrs == 0 {
            return 0;
        }
        e.bound_rmrs = 0;
        let mut unbound = 0;
        for w in slots.iter_mut().filter_map(|s| s.entry.as_mut()) {
            if w.kind == EntryKind::Rmr && w.parent.is_some_and(|p| Self::slot_of(p).0 == i) {
                clear_binding(w);
                unbound += 1;
            }
        }
        unbound
    }

    /// Reserves the next key of the live entry `ctx` without changing the
    /// entry (see [`MemTable::set_key`]); `None` if `ctx` is dead or the
    /// slot has no key left.
    pub(crate) fn next_key(&self, ctx: u32) -> Option<u32> {
        let (i, k) = Self::slot_of(ctx);
        let mut slots = self.write_slots();
        let slot = slots.get_mut(i)?;
        if slot.entry.as_ref()?.key != k || slot.next_key > 255 {
            return None;
        }
        let key = slot.next_key as u8;
        slot.next_key += 1;
        Some(((i as u32) << 8) | key as u32)
    }

    /// Gives the entry in `new_ctx`'s slot the key reserved by
    /// [`MemTable::next_key`] (whatever its current key) and applies `f`.
    /// Keys only move forward: false if the entry is gone or already has a
    /// later key.
    pub(crate) fn set_key(&self, new_ctx: u32, f: impl FnOnce(&mut Entry)) -> bool {
        let (i, k) = Self::slot_of(new_ctx);
        let mut slots = self.write_slots();
        match slots.get(i).and_then(|s| s.entry.as_ref()) {
            Some(e) if e.key <= k => {}
            _ => return false,
        }
        // The old key's bindings go with it.
        Self::detach(&mut slots, i);
        let Some(e) = slots[i].entry.as_mut() else {
            return false;
        };
        e.key = k;
        f(e);
        true
    }

    /// Maps the fast-registration entry `ctx` onto `region` with `privs`
    /// (its whole range). Any window bound to its previous mapping is
    /// unbound first (see [`MemTable::detach`]). False if `ctx` is not live.
    pub(crate) fn map_fmr(&self, ctx: u32, region: &Arc<Region>, privs: MemPriv) -> bool {
        let (i, k) = Self::slot_of(ctx);
        let mut slots = self.write_slots();
        match slots.get(i).and_then(|s| s.entry.as_ref()) {
            Some(e) if e.key == k && e.kind == EntryKind::Fmr => {}
            _ => return false,
        }
        Self::detach(&mut slots, i);
        let Some(e) = slots[i].entry.as_mut() else {
            return false;
        };
        e.start = region.address();
        e.len = region.len() as u64;
        e.region = Some(region.clone());
        e.privs = privs;
        true
    }

    /// Binds the window `win` to `len` bytes at `start` of the live LMR
    /// `lmr` with `privs`, under one lock (the LMR cannot be freed,
    /// invalidated or re-mapped half-way). The range and rights are checked
    /// again here against the LMR as it is now (they were checked when the
    /// bind was posted). False if either is gone, the LMR is unmapped, or
    /// the range or rights are not the LMR's.
    pub(crate) fn bind_window(
        &self,
        lmr: u32,
        win: u32,
        start: u64,
        len: u64,
        privs: MemPriv,
    ) -> bool {
        let (li, lk) = Self::slot_of(lmr);
        let (wi, wk) = Self::slot_of(win);
        let mut slots = self.write_slots();
        let region = match slots.get(li).and_then(|s| s.entry.as_ref()) {
            Some(l)
                if l.key == lk
                    && l.kind != EntryKind::Rmr
                    && l.privs.contains(privs)
                    && within(l.start, l.len, start, len) =>
            {
                match &l.region {
                    Some(r) => r.clone(),
                    None => return false,
                }
            }
            _ => return false,
        };
        let lmr_pz = slots[li].entry.as_ref().map(|l| l.pz);
        match slots.get(wi).and_then(|s| s.entry.as_ref()) {
            Some(w) if w.key == wk && w.kind == EntryKind::Rmr && Some(w.pz) == lmr_pz => {}
            _ => return false,
        }
        // (A window is unbound when its bind is posted; should it still be
        // bound, it leaves its old LMR first.)
        Self::detach(&mut slots, wi);
        if let Some(w) = slots[wi].entry.as_mut() {
            w.region = Some(region);
            w.start = start;
            w.len = len;
            w.privs = privs;
            w.parent = Some(lmr);
        }
        if let Some(l) = slots[li].entry.as_mut() {
            l.bound_rmrs += 1;
        }
        true
    }

    /// Invalidates `ctx` for a peer's Send with Invalidate, as protection
    /// zone `pz`: an RMR is unbound, a fast-registration LMR unmapped (its
    /// key stays until the owner's next map or invalidate re-keys it).
    /// One already invalid is fine (as in the verbs). Refused, changing
    /// nothing: a key that names nothing live, an entry of another zone,
    /// a plain LMR (not invalidatable remotely).
    pub(crate) fn invalidate_remote(
        &self,
        ctx: u32,
        pz: PzHandle,
    ) -> std::result::Result<(), RemoteInvalidate> {
        let (i, k) = Self::slot_of(ctx);
        let mut slots = self.write_slots();
        let kind = match slots.get(i).and_then(|s| s.entry.as_ref()) {
            Some(e) if e.key == k && e.pz != pz => return Err(RemoteInvalidate::OtherZone),
            Some(e) if e.key == k && e.kind == EntryKind::Lmr => {
                return Err(RemoteInvalidate::NotInvalidatable);
            }
            Some(e) if e.key == k => e.kind,
            _ => return Err(RemoteInvalidate::Unknown),
        };
        if kind == EntryKind::Rmr {
            Self::detach(&mut slots, i);
        } else if let Some(e) = slots[i].entry.as_mut() {
            // Windows bound to the mapping go with it.
            e.region = None;
            Self::detach(&mut slots, i);
        }
        Ok(())
    }

    /// Removes the entry of `ctx` unless windows are bound to it (checked
    /// under the same lock). `Err(())` if windows are bound; `Ok(None)` if
    /// `ctx` is not live.
    pub(crate) fn remove_unbound(&self, ctx: u32) -> std::result::Result<Option<Entry>, ()> {
        let (i, k) = Self::slot_of(ctx);
        let mut slots = self.write_slots();
        let Some(slot) = slots.get_mut(i) else {
            return Ok(None);
        };
        match slot.entry.as_ref() {
            Some(e) if e.key == k && e.bound_rmrs > 0 => return Err(()),
            Some(e) if e.key == k => {}
            _ => return Ok(None),
        }
        let e = slot.entry.take();
        if slot.next_key <= 255 {
            self.free.lock().push(i as u32);
        }
        Ok(e)
    }

    /// Removes the entry of `ctx`; its key dies for good, and its bindings
    /// are released (see [`MemTable::detach`]: a window leaves its LMR, an
    /// LMR's windows are unbound).
    pub(crate) fn remove(&self, ctx: u32) -> Option<Entry> {
        let (i, k) = Self::slot_of(ctx);
        let mut slots = self.write_slots();
        if slots.get(i)?.entry.as_ref()?.key != k {
            return None;
        }
        Self::detach(&mut slots, i);
        let slot = &mut slots[i];
        let e = slot.entry.take();
        if slot.next_key <= 255 {
            self.free.lock().push(i as u32);
        }
        e
    }

    /// Removes the LMR entry of `ctx` even if windows are bound to it: its
    /// key dies for good, and every window bound to it is left unbound (see
    /// [`MemTable::detach`]), so the window's key is refused from then on.
    /// Returns the removed entry and the number of windows unbound.
    pub(crate) fn invalidate_lmr(&self, ctx: u32) -> Option<(Entry, usize)> {
        let (i, k) = Self::slot_of(ctx);
        let mut slots = self.write_slots();
        if slots.get(i)?.entry.as_ref()?.key != k {
            return None;
        }
        let unbound = Self::detach(&mut slots, i);
        let slot = &mut slots[i];
        let e = slot.entry.take()?;
        if slot.next_key <= 255 {
            self.free.lock().push(i as u32);
        }
        Some((e, unbound))
    }

    /// Checks an access of `len` bytes at `addr` through `ctx`, needing
    /// `right`, from protection zone `pz`; returns the span to copy.
    pub fn resolve(
        &self,
        ctx: u32,
        addr: u64,
        len: u64,
        right: MemPriv,
        pz: PzHandle,
    ) -> std::result::Result<Span, AccessError> {
        self.resolve_with(ctx, addr, len, right, pz, false)
    }

    /// [`MemTable::resolve`] with one table lookup and no entry copy;
    /// `local` refuses window (RMR) keys, which are for remote access only.
    fn resolve_with(
        &self,
        ctx: u32,
        addr: u64,
        len: u64,
        right: MemPriv,
        pz: PzHandle,
        local: bool,
    ) -> std::result::Result<Span, AccessError> {
        Self::resolve_in(&self.slots.read(), ctx, addr, len, right, pz, local)
    }

    /// [`MemTable::resolve_with`] in the locked table `slots`.
    fn resolve_in(
        slots: &[Slot],
        ctx: u32,
        addr: u64,
        len: u64,
        right: MemPriv,
        pz: PzHandle,
        local: bool,
    ) -> std::result::Result<Span, AccessError> {
        let (i, k) = Self::slot_of(ctx);
        let e = slots
            .get(i)
            .and_then(|s| s.entry.as_ref())
            .filter(|e| e.key == k)
            .ok_or(AccessError::BadKey)?;
        let region = e.region.as_ref().ok_or(AccessError::BadKey)?;
        let offset = check_access(
            region,
            e.kind == EntryKind::Rmr,
            e.pz,
            e.privs,
            (e.start, e.len),
            (addr, len, right, pz, local),
        )?;
        Ok(Span {
            region: region.clone(),
            offset,
            len: len as usize,
        })
    }

    /// The index in `cache` of `ctx`: a hit as of the current generation,
    /// or else the entry as the table says now, put in the cache (as of the
    /// generation read under the table's lock); `None` if `ctx` names no
    /// live entry with memory.
    #[inline]
    fn cached_index(&self, cache: &mut KeyCache, ctx: u32) -> Option<usize> {
        match cache.position(ctx, self.generation.load(Ordering::Acquire)) {
            Some(i) => Some(i),
            None => self.cache_miss(cache, ctx),
        }
    }

    /// [`MemTable::cached_index`] of a key not cached at the current
    /// generation: read from the table.
    #[cold]
    #[inline(never)]
    fn cache_miss(&self, cache: &mut KeyCache, ctx: u32) -> Option<usize> {
        let slots = self.slots.read();
        // Stable under the read lock: writers move it under the write lock.
        let generation = self.generation.load(Ordering::Acquire);
        let (i, k) = Self::slot_of(ctx);
        let e = slots
            .get(i)
            .and_then(|s| s.entry.as_ref())
            .filter(|e| e.key == k)?;
        let region = e.region.as_ref()?;
        Some(cache.insert(CachedKey::new(ctx, generation, e, region)))
    }

    /// Puts `ctx` in `cache` (as of the current generation, unless the
    /// table changes meanwhile) if it names a live entry with memory; false
    /// if it does not.
    fn cache_key(&self, cache: &mut KeyCache, ctx: u32) -> bool {
        self.cached_index(cache, ctx).is_some()
    }

    /// [`MemTable::resolve`] through `cache`: no table lock and no
    /// reference count taken while the key is cached and the table
    /// unchanged. The span borrows from `cache`, or (when the key is not
    /// cached: the authoritative answer, errors included) from `hold`.
    pub fn resolve_cached<'c>(
        &self,
        (cache, hold): (&'c mut KeyCache, &'c mut Option<Span>),
        ctx: u32,
        addr: u64,
        len: u64,
        right: MemPriv,
        pz: PzHandle,
    ) -> std::result::Result<SpanRef<'c>, AccessError> {
        if let Some(i) = self.cached_index(cache, ctx) {
            let cache: &'c KeyCache = cache;
            let c = cache.get(i);
            let offset = c.check(addr, len, right, pz, false)?;
            return Ok(SpanRef {
                region: &c.region,
                offset,
                len: len as usize,
            });
        }
        let span = hold.insert(self.resolve(ctx, addr, len, right, pz)?);
        Ok(span.as_ref())
    }

    /// One key through `cache` (a miss reads the table, as of one moment):
    /// the span, or `None` if the key is not live or the access is refused
    /// (the caller then asks the table for the authoritative answer).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub fn resolve_one_cached<'c>(
        &self,
        cache: &'c mut KeyCache,
        ctx: u32,
        addr: u64,
        len: u64,
        right: MemPriv,
        pz: PzHandle,
        local: bool,
    ) -> Option<SpanRef<'c>> {
        let i = self.cached_index(cache, ctx)?;
        let cache: &'c KeyCache = cache;
        let c = cache.get(i);
        let offset = c.offset(addr, len, right, pz, local)?;
        Some(SpanRef {
            region: &c.region,
            offset,
            len: len as usize,
        })
    }

    /// [`MemTable::resolve_local`] through `cache` (see
    /// [`MemTable::resolve_cached`]); `hold` keeps the spans of an uncached
    /// resolution.
    pub fn resolve_local_cached<'c>(
        &self,
        cache: &'c mut KeyCache,
        hold: &'c mut Spans,
        iov: &[LmrTriplet],
        right: MemPriv,
        pz: PzHandle,
    ) -> std::result::Result<SpanRefs<'c>, DtoStatus> {
        // The usual list: one entry.
        if let [t] = iov {
            if t.segment_length > 0 {
                if let Some(i) = self.cached_index(cache, t.lmr_context) {
                    let cache: &'c KeyCache = cache;
                    let c = cache.get(i);
                    let offset = c
                        .check(t.virtual_address, t.segment_length, right, pz, true)
                        .map_err(|_| DtoStatus::LocalProtection)?;
                    let mut out = SpanRefs::new();
                    out.push(SpanRef {
                        region: &c.region,
                        offset,
                        len: t.segment_length as usize,
                    });
                    return Ok(out);
                }
            }
        }
        let used = || iov.iter().filter(|t| t.segment_length > 0);
        // Every key cached at one generation (a later key's miss may evict
        // an earlier one, or the table may change in between: then the
        // table answers).
        let mut generation = None;
        if used().count() <= CACHED_KEYS && used().all(|t| self.cache_key(cache, t.lmr_context)) {
            let g = self.generation.load(Ordering::Acquire);
            if used().all(|t| cache.find(t.lmr_context, g).is_some()) {
                generation = Some(g);
            }
        }
        let Some(g) = generation else {
            *hold = self.resolve_local(iov, right, pz)?;
            return Ok(hold.iter().map(Span::as_ref).collect());
        };
        let cache: &'c KeyCache = cache;
        let mut out = SpanRefs::new();
        for t in used() {
            let Some(c) = cache.find(t.lmr_context, g) else {
                unreachable!("checked above, and the cache did not change");
            };
            let offset = c
                .check(t.virtual_address, t.segment_length, right, pz, true)
                .map_err(|_| DtoStatus::LocalProtection)?;
            out.push(SpanRef {
                region: &c.region,
                offset,
                len: t.segment_length as usize,
            });
        }
        Ok(out)
    }

    /// Resolves a local scatter/gather list (`LocalProtection` on failure),
    /// under one lock of the table.
    pub fn resolve_local(
        &self,
        iov: &[LmrTriplet],
        right: MemPriv,
        pz: PzHandle,
    ) -> std::result::Result<Spans, DtoStatus> {
        let mut out = Spans::new();
        if iov.is_empty() {
            return Ok(out);
        }
        let slots = self.slots.read();
        for t in iov.iter().filter(|t| t.segment_length > 0) {
            let span = Self::resolve_in(
                &slots,
                t.lmr_context,
                t.virtual_address,
                t.segment_length,
                right,
                pz,
                true,
            )
            .map_err(|_| DtoStatus::LocalProtection)?;
            out.push(span);
        }
        Ok(out)
    }
}

/// Checks an access of `len` bytes at `addr` needing `right` from zone
/// `pz` (`local`: a local buffer, which a window key cannot name) against
/// an entry (window or not, its zone, rights and range) mapping `region`;
/// returns the offset into the region.
#[inline(always)]
fn check_access(
    region: &Region,
    rmr: bool,
    entry_pz: PzHandle,
    privs: MemPriv,
    (start, entry_len): (u64, u64),
    (addr, len, right, pz, local): (u64, u64, MemPriv, PzHandle, bool),
) -> std::result::Result<usize, AccessError> {
    if local && rmr {
        return Err(AccessError::BadKey);
    }
    // A retired region's memory may be gone (borrowed memory given back):
    // its keys resolve to nothing. (A transfer through a span resolved
    // just before the retirement is refused by `copy_spans`.)
    if region.is_retired() {
        return Err(AccessError::BadKey);
    }
    if entry_pz != pz {
        return Err(AccessError::WrongPz);
    }
    if !privs.contains(right) {
        return Err(AccessError::Right);
    }
    if !within(start, entry_len, addr, len) {
        return Err(AccessError::Range);
    }
    let offset = addr
        .checked_sub(region.address())
        .ok_or(AccessError::Range)?;
    if offset
        .checked_add(len)
        .is_none_or(|x| x > region.len() as u64)
    {
        return Err(AccessError::Range);
    }
    Ok(offset as usize)
}

/// How many keys a [`KeyCache`] holds.
const CACHED_KEYS: usize = 4;

/// A few resolved keys of one registration table, each as of a table
/// generation (an endpoint keeps one for its own table and one for its
/// peer's, under its lock). Valid while the table's generation has not
/// moved; a miss drops every stale entry, so a region outlives its last
/// registration in here only until the endpoint's next miss (or release).
#[derive(Default)]
pub struct KeyCache {
    keys: [Option<CachedKey>; CACHED_KEYS],
    next: usize,
}

/// An entry's access-check inputs, as of `generation`.
struct CachedKey {
    ctx: u32,
    generation: u64,
    rmr: bool,
    pz: PzHandle,
    privs: MemPriv,
    start: u64,
    len: u64,
    region: Arc<Region>,
    /// The addresses an access may span: the entry's range within the
    /// region's (what [`check_access`] checks, precomputed).
    lo: u64,
    hi: u64,
}

impl CachedKey {
    fn new(ctx: u32, generation: u64, e: &Entry, region: &Arc<Region>) -> CachedKey {
        let base = region.address();
        CachedKey {
            ctx,
            generation,
            rmr: e.kind == EntryKind::Rmr,
            pz: e.pz,
            privs: e.privs,
            start: e.start,
            len: e.len,
            region: region.clone(),
            lo: e.start.max(base),
            hi: e
                .start
                .saturating_add(e.len)
                .min(base.saturating_add(region.len() as u64)),
        }
    }

    /// [`CachedKey::check`] when only success matters: the offset into
    /// the region, or `None` if the access is refused (for any reason).
    #[inline(always)]
    fn offset(
        &self,
        addr: u64,
        len: u64,
        right: MemPriv,
        pz: PzHandle,
        local: bool,
    ) -> Option<usize> {
        let end = addr.checked_add(len)?;
        let ok = !(local && self.rmr)
            && self.pz == pz
            && self.privs.contains(right)
            && addr >= self.lo
            && end <= self.hi
            && !self.region.is_retired();
        ok.then(|| (addr - self.region.address()) as usize)
    }

    #[inline]
    fn check(
        &self,
        addr: u64,
        len: u64,
        right: MemPriv,
        pz: PzHandle,
        local: bool,
    ) -> std::result::Result<usize, AccessError> {
        check_access(
            &self.region,
            self.rmr,
            self.pz,
            self.privs,
            (self.start, self.len),
            (addr, len, right, pz, local),
        )
    }
}

impl KeyCache {
    /// `ctx` cached at `generation`.
    fn find(&self, ctx: u32, generation: u64) -> Option<&CachedKey> {
        self.position(ctx, generation).map(|i| self.get(i))
    }

    /// The index of `ctx` cached at `generation`.
    #[inline(always)]
    fn position(&self, ctx: u32, generation: u64) -> Option<usize> {
        let hit = |k: &Option<CachedKey>| {
            k.as_ref()
                .is_some_and(|k| k.ctx == ctx && k.generation == generation)
        };
        // Usually where `insert` prefers to put it.
        let i = Self::home(ctx);
        if hit(&self.keys[i]) {
            return Some(i);
        }
        self.keys.iter().position(|k| {
            k.as_ref()
                .is_some_and(|k| k.ctx == ctx && k.generation == generation)
        })
    }

    /// The entry at `i` (an index [`KeyCache::position`] or
    /// [`KeyCache::insert`] returned, with no change since).
    #[inline(always)]
    fn get(&self, i: usize) -> &CachedKey {
        self.keys[i].as_ref().expect("a cached key's index")
    }

    /// Adds `k`, dropping stale entries first; returns its index.
    fn insert(&mut self, k: CachedKey) -> usize {
        for e in &mut self.keys {
            if e.as_ref().is_some_and(|e| e.generation != k.generation) {
                *e = None;
            }
        }
        let home = Self::home(k.ctx);
        let i = match self.keys.iter().position(Option::is_none) {
            _ if self.keys[home].is_none() => home,
            Some(i) => i,
            None => {
                self.next = (self.next + 1) % CACHED_KEYS;
                self.next
            }
        };
        self.keys[i] = Some(k);
        i
    }

    /// The entry `ctx` is looked up in first (and put in if free): by its
    /// slot index.
    #[inline(always)]
    fn home(ctx: u32) -> usize {
        (ctx >> 8) as usize % CACHED_KEYS
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        *self = KeyCache::default();
    }
}

/// A [`Span`] borrowing its region.
#[derive(Copy, Clone, Debug)]
pub struct SpanRef<'a> {
    /// The region.
    pub region: &'a Region,
    /// Offset into the region.
    pub offset: usize,
    /// Length.
    pub len: usize,
}

impl Span {
    /// The span, borrowing its region.
    pub fn as_ref(&self) -> SpanRef<'_> {
        SpanRef {
            region: &self.region,
            offset: self.offset,
            len: self.len,
        }
    }
}

/// Borrowing spans (inline up to four entries).
pub type SpanRefs<'a> = smallvec::SmallVec<[SpanRef<'a>; 4]>;

/// A posted scatter/gather list (inline up to four entries).
pub type Iov = smallvec::SmallVec<[LmrTriplet; 4]>;

/// A scatter/gather list resolved to spans (inline up to four entries: no
/// allocation on the data path for the usual lists).
pub type Spans = smallvec::SmallVec<[Span; 4]>;

/// The total length of a scatter/gather list, if it is at most `limit`
/// (`None` if it is larger, or if the sum does not fit a `u64`: lengths
/// come from the caller and are added checked).
#[inline]
pub(crate) fn list_len(iov: &[LmrTriplet], limit: u64) -> Option<u64> {
    let len = match iov {
        [t] => t.segment_length,
        _ => iov
            .iter()
            .try_fold(0u64, |sum, t| sum.checked_add(t.segment_length))?,
    };
    (len <= limit).then_some(len)
}

/// Total length of spans.
pub fn total(spans: &[SpanRef<'_>]) -> usize {
    spans.iter().map(|s| s.len).sum()
}

/// A copy refused because a region it names is retired: which side(s).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Retired {
    /// A source span's region is retired.
    pub src: bool,
    /// A sink span's region is retired.
    pub dst: bool,
}

/// Copies `min(total(src), total(dst))` bytes from the `src` spans into the
/// `dst` spans, in order, with one copy per contiguous piece. Regions are
/// locked in id order (sinks for writing, sources for reading), so
/// concurrent copies cannot deadlock. Returns the bytes copied, or, if a
/// region is retired (checked under its lock, with every lock held), which
/// side names it: then no byte moves.
#[cfg(test)]
pub(crate) fn copy_spans(src: &[Span], dst: &[Span]) -> std::result::Result<usize, Retired> {
    let src: SpanRefs<'_> = src.iter().map(Span::as_ref).collect();
    let dst: SpanRefs<'_> = dst.iter().map(Span::as_ref).collect();
    copy_refs(&src, &dst)
}

/// [`copy_refs`] of one span each side (the usual RDMA and single-buffer
/// send): two regions locked in id order, one copy; one region: the general
/// path.
#[inline]
pub fn copy_one(s: SpanRef<'_>, d: SpanRef<'_>) -> std::result::Result<usize, Retired> {
    let n = s.len.min(d.len);
    if s.region.id == d.region.id {
        return copy_general(&[s], &[d], n);
    }
    let copy = |from: &[u8], to: &mut [u8]| {
        to[d.offset..d.offset + n].copy_from_slice(&from[s.offset..s.offset + n]);
    };
    let (src_gone, dst_gone) = (
        Retired {
            src: true,
            dst: false,
        },
        Retired {
            src: false,
            dst: true,
        },
    );
    if s.region.id < d.region.id {
        let r = s.region.try_read().ok_or(src_gone)?;
        let mut w = d.region.try_write().ok_or(dst_gone)?;
        copy(&r, &mut w);
    } else {
        let mut w = d.region.try_write().ok_or(dst_gone)?;
        let r = s.region.try_read().ok_or(src_gone)?;
        copy(&r, &mut w);
    }
    Ok(n)
}

/// `copy_spans` (a test helper) of borrowing spans.
pub fn copy_refs(src: &[SpanRef<'_>], dst: &[SpanRef<'_>]) -> std::result::Result<usize, Retired> {
    if let ([s], [d]) = (src, dst) {
        if s.region.id != d.region.id {
            return copy_one(*s, *d);
        }
    }
    let n = total(src).min(total(dst));
    copy_general(src, dst, n)
}

/// [`copy_refs`] of `n` bytes in the general case (several spans, or one
/// region on both sides).
#[inline(never)]
fn copy_general(
    src: &[SpanRef<'_>],
    dst: &[SpanRef<'_>],
    n: usize,
) -> std::result::Result<usize, Retired> {
    // Distinct regions, each with the sides it is used on.
    struct Use<'a> {
        id: u64,
        region: &'a Region,
        src: bool,
        dst: bool,
    }
    let mut regions: smallvec::SmallVec<[Use<'_>; 4]> = smallvec::SmallVec::new();
    for (s, write) in src
        .iter()
        .map(|s| (s, false))
        .chain(dst.iter().map(|d| (d, true)))
    {
        let u = match regions.iter().position(|r| r.id == s.region.id) {
            Some(i) => &mut regions[i],
            None => {
                regions.push(Use {
                    id: s.region.id,
                    region: s.region,
                    src: false,
                    dst: false,
                });
                regions.last_mut().expect("just pushed")
            }
        };
        if write {
            u.dst = true;
        } else {
            u.src = true;
        }
    }
    regions.sort_by_key(|r| r.id);
    let mut guards: smallvec::SmallVec<[(u64, RegionLockGuard<'_>); 4]> = smallvec::SmallVec::new();
    let mut retired = Retired {
        src: false,
        dst: false,
    };
    for u in &regions {
        let g = if u.dst {
            u.region.try_write().map(RegionLockGuard::W)
        } else {
            u.region.try_read().map(RegionLockGuard::R)
        };
        match g {
            Some(g) => guards.push((u.id, g)),
            None => {
                retired.src |= u.src;
                retired.dst |= u.dst;
            }
        }
    }
    if retired.src || retired.dst {
        return Err(retired);
    }
    let find =
        |id: u64, gs: &[(u64, RegionLockGuard<'_>)]| gs.iter().position(|g| g.0 == id).unwrap_or(0);

    let (mut si, mut so) = (0usize, 0usize);
    let (mut di, mut doff) = (0usize, 0usize);
    let mut left = n;
    while left > 0 {
        let s = &src[si];
        let d = &dst[di];
        let chunk = (s.len - so).min(d.len - doff).min(left);
        let gs = find(s.region.id, &guards);
        let gd = find(d.region.id, &guards);
        let (src_at, dst_at) = (s.offset + so, d.offset + doff);
        if gs == gd {
            if let RegionLockGuard::W(w) = &mut guards[gd].1 {
                w.copy_within(src_at..src_at + chunk, dst_at);
            }
        } else {
            let (a, b) = if gs < gd {
                let (l, r) = guards.split_at_mut(gd);
                (&l[gs].1, &mut r[0].1)
            } else {
                let (l, r) = guards.split_at_mut(gs);
                (&r[0].1, &mut l[gd].1)
            };
            let from: &[u8] = match a {
                RegionLockGuard::R(g) => &g[src_at..src_at + chunk],
                RegionLockGuard::W(g) => &g[src_at..src_at + chunk],
            };
            if let RegionLockGuard::W(w) = b {
                w[dst_at..dst_at + chunk].copy_from_slice(from);
            }
        }
        left -= chunk;
        so += chunk;
        doff += chunk;
        if so == s.len {
            si += 1;
            so = 0;
        }
        if doff == d.len {
            di += 1;
            doff = 0;
        }
    }
    Ok(n)
}

/// The spans' distinct regions locked, in id order, for writing (`write`)
/// or reading, each checked live under its lock: `None` (and every lock
/// released) if one is retired.
fn lock_regions<'a>(
    spans: &[SpanRef<'a>],
    write: bool,
) -> Option<smallvec::SmallVec<[(u64, RegionLockGuard<'a>); 4]>> {
    let mut regions: smallvec::SmallVec<[&'a Region; 4]> = smallvec::SmallVec::new();
    for s in spans {
        if !regions.iter().any(|r| r.id == s.region.id) {
            regions.push(s.region);
        }
    }
    regions.sort_by_key(|r| r.id);
    regions
        .iter()
        .map(|r| {
            let g = if write {
                r.try_write().map(RegionLockGuard::W)
            } else {
                r.try_read().map(RegionLockGuard::R)
            };
            g.map(|g| (r.id, g))
        })
        .collect()
}

/// A read or write guard of a region (the copies that lock several).
enum RegionLockGuard<'a> {
    R(RegionRead<'a>),
    W(RegionWrite<'a>),
}

/// Copies `min(src.len(), total(dst))` bytes of an owned buffer into the
/// `dst` spans, in order, every sink region locked for writing: if one is
/// retired, no byte moves (`Retired::dst`).
pub fn copy_from_buf(src: &[u8], dst: &[SpanRef<'_>]) -> std::result::Result<usize, Retired> {
    let retired = Retired {
        src: false,
        dst: true,
    };
    let mut guards = lock_regions(dst, true).ok_or(retired)?;
    let mut done = 0;
    for d in dst {
        if done == src.len() {
            break;
        }
        let n = d.len.min(src.len() - done);
        if let Some((_, RegionLockGuard::W(w))) = guards.iter_mut().find(|g| g.0 == d.region.id) {
            w[d.offset..d.offset + n].copy_from_slice(&src[done..done + n]);
        }
        done += n;
    }
    Ok(done)
}

/// Appends the bytes of the `src` spans, in order, to `out`, every source
/// region locked for reading (no zero fill first: a gather of a large
/// message writes each byte once): if one is retired, nothing is appended
/// (`Retired::src`).
pub(crate) fn append_spans(
    src: &[SpanRef<'_>],
    out: &mut Vec<u8>,
) -> std::result::Result<usize, Retired> {
    let retired = Retired {
        src: true,
        dst: false,
    };
    let guards = lock_regions(src, false).ok_or(retired)?;
    out.reserve(total(src));
    let start = out.len();
    for s in src {
        if let Some((_, RegionLockGuard::R(r))) = guards.iter().find(|g| g.0 == s.region.id) {
            out.extend_from_slice(&r[s.offset..s.offset + s.len]);
        }
    }
    Ok(out.len() - start)
}

/// Runs `f` on the bytes of `span`, its region locked for writing (a
/// provider receiving straight into registered memory): if the region is
/// retired, `f` is not called.
pub(crate) fn lend_span<R>(
    span: SpanRef<'_>,
    f: impl FnOnce(&mut [u8]) -> R,
) -> std::result::Result<R, Retired> {
    let mut g = span.region.try_write().ok_or(Retired {
        src: false,
        dst: true,
    })?;
    Ok(f(&mut g[span.offset..span.offset + span.len]))
}

/// Copies `min(total(src), dst.len())` bytes of the `src` spans, in order,
/// into an owned buffer, every source region locked for reading: if one is
/// retired, no byte moves (`Retired::src`).
pub fn copy_into_buf(src: &[SpanRef<'_>], dst: &mut [u8]) -> std::result::Result<usize, Retired> {
    let retired = Retired {
        src: true,
        dst: false,
    };
    let guards = lock_regions(src, false).ok_or(retired)?;
    let mut done = 0;
    for s in src {
        if done == dst.len() {
            break;
        }
        let n = s.len.min(dst.len() - done);
        if let Some((_, RegionLockGuard::R(r))) = guards.iter().find(|g| g.0 == s.region.id) {
            dst[done..done + n].copy_from_slice(&r[s.offset..s.offset + n]);
        }
        done += n;
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(region: &Arc<Region>, privs: MemPriv) -> Entry {
        Entry {
            kind: EntryKind::Lmr,
            key: 0,
            pz: PzHandle(1),
            region: Some(region.clone()),
            start: region.address(),
            len: region.len() as u64,
            privs,
            parent: None,
            bound_rmrs: 0,
        }
    }

    #[test]
    fn resolve_checks_key_pz_range_and_right() {
        let t = MemTable::default();
        let r = Region::from_vec((0..100u8).collect());
        let ctx = t
            .insert(entry(&r, MemPriv::LOCAL_READ | MemPriv::REMOTE_READ))
            .unwrap();
        let a = r.address();
        assert!(
            t.resolve(ctx, a + 10, 20, MemPriv::REMOTE_READ, PzHandle(1))
                .is_ok()
        );
        assert_eq!(
            t.resolve(ctx, a + 90, 20, MemPriv::REMOTE_READ, PzHandle(1))
                .unwrap_err(),
            AccessError::Range
        );
        assert_eq!(
            t.resolve(ctx, a - 1, 2, MemPriv::REMOTE_READ, PzHandle(1))
                .unwrap_err(),
            AccessError::Range
        );
        assert_eq!(
            t.resolve(ctx, a, 1, MemPriv::REMOTE_WRITE, PzHandle(1))
                .unwrap_err(),
            AccessError::Right
        );
        assert_eq!(
            t.resolve(ctx, a, 1, MemPriv::REMOTE_READ, PzHandle(2))
                .unwrap_err(),
            AccessError::WrongPz
        );
        assert_eq!(
            t.resolve(ctx ^ 1, a, 1, MemPriv::REMOTE_READ, PzHandle(1))
                .unwrap_err(),
            AccessError::BadKey
        );
        assert_eq!(
            t.resolve(ctx, u64::MAX, 2, MemPriv::REMOTE_READ, PzHandle(1))
                .unwrap_err(),
            AccessError::Range
        );
    }

    #[test]
    fn cached_keys_follow_every_table_change() {
        let t = MemTable::default();
        let r = Region::from_vec((0..64u8).collect());
        let a = r.address();
        let ctx = t.insert(entry(&r, MemPriv::ALL)).unwrap();
        let mut cache = KeyCache::default();
        let one = |t: &MemTable, c: &mut KeyCache, ctx: u32, right: MemPriv| {
            t.resolve_one_cached(c, ctx, a + 8, 8, right, PzHandle(1), true)
                .map(|s| (s.offset, s.len))
        };
        let list = |t: &MemTable, c: &mut KeyCache, ctx: u32| {
            let mut hold = Spans::new();
            let iov = [
                LmrTriplet {
                    lmr_context: ctx,
                    virtual_address: a,
                    segment_length: 4,
                },
                LmrTriplet {
                    lmr_context: ctx,
                    virtual_address: a + 60,
                    segment_length: 4,
                },
            ];
            t.resolve_local_cached(c, &mut hold, &iov, MemPriv::LOCAL_READ, PzHandle(1))
                .map(|v| v.iter().map(|s| (s.offset, s.len)).collect::<Vec<_>>())
        };
        assert_eq!(one(&t, &mut cache, ctx, MemPriv::LOCAL_READ), Some((8, 8)));
        // A hit, and the checks still apply to it.
        assert_eq!(one(&t, &mut cache, ctx, MemPriv::LOCAL_READ), Some((8, 8)));
        assert_eq!(one(&t, &mut cache, ctx ^ 1, MemPriv::LOCAL_READ), None);
        assert_eq!(
            t.resolve_one_cached(
                &mut cache,
                ctx,
                a + 60,
                8,
                MemPriv::LOCAL_READ,
                PzHandle(1),
                true
            )
            .map(|s| s.len),
            None
        );
        assert_eq!(list(&t, &mut cache, ctx), Ok(vec![(0, 4), (60, 4)]));
        // Rights taken away: the cached entry is not used.
        t.with_mut(ctx, |e| e.privs = MemPriv::REMOTE_READ);
        assert_eq!(one(&t, &mut cache, ctx, MemPriv::LOCAL_READ), None);
        assert_eq!(list(&t, &mut cache, ctx), Err(DtoStatus::LocalProtection));
        t.with_mut(ctx, |e| e.privs = MemPriv::ALL);
        assert!(one(&t, &mut cache, ctx, MemPriv::LOCAL_READ).is_some());
        // A new key: the old one is dead in the cache too.
        let ctx2 = t.rekey(ctx, |_| {}).unwrap();
        assert_eq!(one(&t, &mut cache, ctx, MemPriv::LOCAL_READ), None);
        assert_eq!(list(&t, &mut cache, ctx), Err(DtoStatus::LocalProtection));
        assert!(one(&t, &mut cache, ctx2, MemPriv::LOCAL_READ).is_some());
        // Removed, or its region retired: refused.
        let ctx3 = t.insert(entry(&r, MemPriv::ALL)).unwrap();
        assert!(one(&t, &mut cache, ctx3, MemPriv::LOCAL_READ).is_some());
        t.remove(ctx2).unwrap();
        assert_eq!(one(&t, &mut cache, ctx2, MemPriv::LOCAL_READ), None);
        assert!(one(&t, &mut cache, ctx3, MemPriv::LOCAL_READ).is_some());
        r.retire();
        assert_eq!(one(&t, &mut cache, ctx3, MemPriv::LOCAL_READ), None);
        assert_eq!(list(&t, &mut cache, ctx3), Err(DtoStatus::LocalProtection));
        // A miss drops stale entries (their regions with them).
        let r2 = Region::zeroed(8);
        let ctx4 = t.insert(entry(&r2, MemPriv::ALL)).unwrap();
        assert!(
            t.resolve_one_cached(
                &mut cache,
                ctx4,
                r2.address(),
                8,
                MemPriv::LOCAL_READ,
                PzHandle(1),
                true
            )
            .is_some()
        );
        assert_eq!(cache.keys.iter().flatten().count(), 1);
    }

    #[test]
    fn cached_fast_check_agrees_with_the_full_check() {
        // The precomputed bounds of a cached key accept exactly what
        // `check_access` accepts, for LMRs and windows, over and around
        // the entry's range and the region's.
        let r = Region::from_vec(vec![0; 64]);
        let base = r.address();
        let mut entries = Vec::new();
        for (kind, start, len) in [
            (EntryKind::Lmr, base, 64),
            (EntryKind::Lmr, base + 8, 16),
            (EntryKind::Rmr, base + 4, 40),
            // A range reaching past the region's end: the region bounds too.
            (EntryKind::Fmr, base + 48, 64),
            // ...and past the end of the address space (no overflow).
            (EntryKind::Fmr, base + 8, u64::MAX),
        ] {
            let mut e = entry(&r, MemPriv::LOCAL_READ | MemPriv::REMOTE_WRITE);
            e.kind = kind;
            e.start = start;
            e.len = len;
            entries.push(e);
        }
        let rights = [
            MemPriv::LOCAL_READ,
            MemPriv::LOCAL_WRITE,
            MemPriv::REMOTE_WRITE,
        ];
        let mut checked = 0;
        for e in &entries {
            let c = CachedKey::new(7, 1, e, &r);
            for addr in (0..=80u64).map(|d| base.wrapping_add(d).wrapping_sub(12)) {
                for len in [0u64, 1, 8, 16, 40, 64, u64::MAX] {
                    for right in rights {
                        for pz in [PzHandle(1), PzHandle(2)] {
                            for local in [false, true] {
                                assert_eq!(
                                    c.offset(addr, len, right, pz, local),
                                    c.check(addr, len, right, pz, local).ok(),
                                    "{:?} {:#x}+{} at {:#x}+{len} {right:?} {pz:?} local={local}",
                                    e.kind,
                                    e.start,
                                    e.len,
                                    addr
                                );
                                checked += 1;
                            }
                        }
                    }
                }
            }
        }
        assert!(checked > 10_000);
        r.retire();
        let c = CachedKey::new(7, 1, &entries[0], &r);
        assert_eq!(
            c.offset(base, 8, MemPriv::LOCAL_READ, PzHandle(1), true),
            None
        );
    }

    #[test]
    fn list_lengths_add_checked() {
        let t = |len| LmrTriplet {
            lmr_context: 0,
            virtual_address: 0,
            segment_length: len,
        };
        assert_eq!(list_len(&[], 0), Some(0));
        assert_eq!(list_len(&[t(u64::MAX)], u64::MAX), Some(u64::MAX));
        assert_eq!(list_len(&[t(8), t(8)], 16), Some(16));
        assert_eq!(list_len(&[t(8), t(9)], 16), None);
        assert_eq!(list_len(&[t(17)], 16), None);
        assert_eq!(list_len(&[t(1 << 63), t(1 << 63)], u64::MAX), None);
        assert_eq!(list_len(&[t(u64::MAX), t(1)], u64::MAX), None);
        // A sum that would wrap to a small number.
        assert_eq!(list_len(&[t(1 << 63), t((1 << 63) + 8)], 1 << 30), None);
        assert!(within(10, 10, 10, 10));
        assert!(!within(10, 10, 10, 11));
        assert!(!within(10, 10, 9, 1));
        assert!(!within(0, u64::MAX, u64::MAX, 1));
        assert!(within(0, u64::MAX, u64::MAX, 0));
        assert!(within(u64::MAX - 1, u64::MAX, u64::MAX - 1, 1));
    }

    #[test]
    fn keys_die_for_good() {
        let t = MemTable::default();
        let r = Region::zeroed(8);
        let mut seen = std::collections::HashSet::new();
        let mut ctx = t.insert(entry(&r, MemPriv::ALL)).unwrap();
        seen.insert(ctx);
        // Re-key the slot until it retires; every key is new.
        while let Some(n) = t.rekey(ctx, |_| {}) {
            assert!(t.get(ctx).is_none(), "old key still valid");
            assert!(seen.insert(n), "key {n:#x} reused");
            ctx = n;
        }
        assert_eq!(seen.len(), 256);
        assert!(t.get(ctx).is_none());
        // A removed entry's key is dead, and its slot gives a fresh key.
        let c1 = t.insert(entry(&r, MemPriv::ALL)).unwrap();
        t.remove(c1).unwrap();
        assert!(t.get(c1).is_none());
        let c2 = t.insert(entry(&r, MemPriv::ALL)).unwrap();
        assert_ne!(c1, c2);
        assert!(!seen.contains(&c2));
    }

    #[test]
    fn copy_gathers_and_scatters() {
        let a = Region::from_vec((0..10u8).collect());
        let b = Region::zeroed(10);
        let src = vec![
            Span {
                region: a.clone(),
                offset: 0,
                len: 3,
            },
            Span {
                region: a.clone(),
                offset: 5,
                len: 5,
            },
        ];
        let dst = vec![
            Span {
                region: b.clone(),
                offset: 1,
                len: 4,
            },
            Span {
                region: b.clone(),
                offset: 6,
                len: 4,
            },
        ];
        assert_eq!(copy_spans(&src, &dst), Ok(8));
        assert_eq!(&*b.read(), &[0, 0, 1, 2, 5, 0, 6, 7, 8, 9]);
        // Same region source and sink.
        let s = vec![Span {
            region: a.clone(),
            offset: 0,
            len: 4,
        }];
        let d = vec![Span {
            region: a.clone(),
            offset: 6,
            len: 4,
        }];
        assert_eq!(copy_spans(&s, &d), Ok(4));
        assert_eq!(&*a.read(), &[0, 1, 2, 3, 4, 5, 0, 1, 2, 3]);
    }

    #[test]
    fn owned_buffers_scatter_and_gather_all_or_nothing() {
        let a = Region::zeroed(10);
        let b = Region::zeroed(4);
        fn span(region: &Region, offset: usize, len: usize) -> SpanRef<'_> {
            SpanRef {
                region,
                offset,
                len,
            }
        }
        // Scatter a buffer over two regions (and a zero-length piece).
        let dst = [
            span(&a, 1, 3),
            span(&b, 0, 0),
            span(&b, 2, 2),
            span(&a, 8, 2),
        ];
        assert_eq!(copy_from_buf(b"wxyz!", &dst), Ok(5));
        assert_eq!(&*a.read(), &[0, b'w', b'x', b'y', 0, 0, 0, 0, 0, 0]);
        assert_eq!(&*b.read(), &[0, 0, b'z', b'!']);
        assert_eq!(copy_from_buf(b"0123456789", &dst), Ok(7));
        assert_eq!(&*a.read(), &[0, b'0', b'1', b'2', 0, 0, 0, 0, b'5', b'6']);
        assert_eq!(&*b.read(), &[0, 0, b'3', b'4']);
        // Gather them back, as far as the buffer goes.
        let mut out = [0u8; 4];
        assert_eq!(copy_into_buf(&dst, &mut out), Ok(4));
        assert_eq!(&out, b"0123");
        let mut big = [9u8; 8];
        assert_eq!(copy_into_buf(&dst, &mut big), Ok(7));
        assert_eq!(&big, b"0123456\x09");
        // One region retired: no byte moves, on either side.
        b.retire();
        let before = a.read().to_vec();
        assert_eq!(
            copy_from_buf(b"ABCDE", &dst),
            Err(Retired {
                src: false,
                dst: true
            })
        );
        assert_eq!(*a.read(), *before);
        let mut out = [7u8; 5];
        assert_eq!(
            copy_into_buf(&dst, &mut out),
            Err(Retired {
                src: true,
                dst: false
            })
        );
        assert_eq!(out, [7; 5]);
    }

    #[test]
    fn retired_regions_are_refused_and_untouched() {
        let t = MemTable::default();
        let a = Region::from_vec(vec![1; 8]);
        let b = Region::zeroed(8);
        let ca = t.insert(entry(&a, MemPriv::ALL)).unwrap();
        let span = |r: &Arc<Region>| {
            vec![Span {
                region: r.clone(),
                offset: 0,
                len: 8,
            }]
        };
        // Spans resolved before the retirement...
        let sa = t
            .resolve(ca, a.address(), 8, MemPriv::LOCAL_READ, PzHandle(1))
            .unwrap();
        assert_eq!(sa.len, 8);
        b.retire();
        b.retire(); // harmless twice
        assert!(b.is_retired() && !a.is_retired());
        // ...move nothing into or out of a retired region, and say which side.
        assert_eq!(
            copy_spans(&span(&a), &span(&b)),
            Err(Retired {
                src: false,
                dst: true
            })
        );
        assert_eq!(
            copy_spans(&span(&b), &span(&a)),
            Err(Retired {
                src: true,
                dst: false
            })
        );
        assert_eq!(
            copy_spans(&span(&b), &span(&b)),
            Err(Retired {
                src: true,
                dst: true
            })
        );
        assert!(a.read().iter().all(|x| *x == 1));
        assert!(b.try_read().is_none() && b.try_write().is_none());
        // A key naming a retired region no longer resolves.
        let cb = t.insert(entry(&b, MemPriv::ALL)).unwrap();
        assert_eq!(
            t.resolve(cb, b.address(), 1, MemPriv::LOCAL_READ, PzHandle(1))
                .unwrap_err(),
            AccessError::BadKey
        );
    }

    #[test]
    #[should_panic(expected = "retired")]
    fn reading_a_retired_region_panics() {
        let r = Region::zeroed(4);
        r.retire();
        let _ = r.read();
    }

    #[test]
    fn retire_waits_for_a_copy_in_progress() {
        let r = Region::zeroed(4);
        let g = r.write();
        let r2 = r.clone();
        let h = std::thread::spawn(move || r2.retire());
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!h.is_finished(), "retire must wait for the guard");
        assert!(!r.is_retired());
        drop(g);
        h.join().unwrap();
        assert!(r.is_retired());
    }

    #[test]
    fn windows_follow_their_lmr_and_counts_stay_exact() {
        let t = MemTable::default();
        let r = Region::zeroed(64);
        let a = r.address();
        let mut f = entry(&r, MemPriv::ALL);
        f.kind = EntryKind::Fmr;
        let mut l = t.insert(f).unwrap();
        let window = || {
            let mut w = entry(&r, MemPriv::NONE);
            w.kind = EntryKind::Rmr;
            w.region = None;
            w
        };
        let mut w = t.insert(window()).unwrap();
        let bound = |t: &MemTable, l: u32| t.get(l).unwrap().bound_rmrs;
        let grants = |t: &MemTable, w: u32| {
            t.resolve(w, a, 8, MemPriv::REMOTE_WRITE, PzHandle(1))
                .is_ok()
        };
        // Checked again under the lock: the range and the rights.
        assert!(!t.bind_window(l, w, a + 60, 8, MemPriv::REMOTE_WRITE));
        assert!(!t.bind_window(l, w, u64::MAX, 2, MemPriv::REMOTE_WRITE));
        assert!(!t.bind_window(w, w, a, 8, MemPriv::REMOTE_WRITE));
        assert_eq!(bound(&t, l), 0);
        // Every change of the LMR's key or mapping unbinds the window.
        for step in 0..3 {
            assert!(t.bind_window(l, w, a, 16, MemPriv::REMOTE_WRITE));
            assert_eq!(bound(&t, l), 1);
            assert!(grants(&t, w));
            l = match step {
                0 => t.rekey(l, |_| {}).unwrap(),
                1 => {
                    let k = t.next_key(l).unwrap();
                    assert!(t.set_key(k, |_| {}));
                    k
                }
                _ => {
                    assert!(t.map_fmr(l, &r, MemPriv::ALL));
                    l
                }
            };
            assert!(!grants(&t, w), "step {step}: the window still grants");
            assert_eq!(bound(&t, l), 0, "step {step}");
            assert_eq!(t.get(w).unwrap().parent, None);
        }
        // Re-binding, unbinding and removing the window release its LMR.
        assert!(t.bind_window(l, w, a, 16, MemPriv::REMOTE_WRITE));
        w = t.rekey(w, |_| {}).unwrap();
        assert_eq!(bound(&t, l), 0);
        assert!(t.bind_window(l, w, a, 16, MemPriv::REMOTE_WRITE));
        t.remove(w).unwrap();
        assert_eq!(bound(&t, l), 0);
        // A window that runs out of keys while bound releases it too.
        let mut w = t.insert(window()).unwrap();
        assert!(t.bind_window(l, w, a, 16, MemPriv::REMOTE_WRITE));
        while let Some(n) = t.rekey(w, |_| {}) {
            w = n;
            assert!(t.bind_window(l, w, a, 16, MemPriv::REMOTE_WRITE));
            assert_eq!(bound(&t, l), 1);
        }
        assert!(t.get(w).is_none());
        assert_eq!(bound(&t, l), 0);
        assert!(t.remove_unbound(l).unwrap().is_some());
    }

    #[test]
    fn invalidate_lmr_unbinds_its_windows() {
        let t = MemTable::default();
        let r = Region::zeroed(16);
        let l = t.insert(entry(&r, MemPriv::ALL)).unwrap();
        let mut w = entry(&r, MemPriv::REMOTE_WRITE);
        w.kind = EntryKind::Rmr;
        w.parent = Some(l);
        let wc = t.insert(w.clone()).unwrap();
        w.parent = None; // a window bound elsewhere is left alone
        let other = t.insert(w).unwrap();
        t.with_mut(l, |e| e.bound_rmrs = 1);
        let (e, n) = t.invalidate_lmr(l).unwrap();
        assert_eq!((e.kind, n), (EntryKind::Lmr, 1));
        assert!(t.get(l).is_none());
        assert!(t.invalidate_lmr(l).is_none());
        let a = r.address();
        assert_eq!(
            t.resolve(wc, a, 1, MemPriv::REMOTE_WRITE, PzHandle(1))
                .unwrap_err(),
            AccessError::BadKey
        );
        assert!(
            t.resolve(other, a, 1, MemPriv::REMOTE_WRITE, PzHandle(1))
                .is_ok()
        );
    }
}
