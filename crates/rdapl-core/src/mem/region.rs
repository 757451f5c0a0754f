//! Region memory: a block of registrable memory with a fixed address,
//! behind a read/write lock.
//!
//! Memory is owned by rdapl, borrowed from the caller for a scope, or raw
//! caller-owned memory for the C ABI. Every access takes the region's lock
//! and checks the retirement mark under it. Once [`Region::retire`]
//! returns, rdapl never reads or writes that memory again.

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

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
    pub(super) id: u64,
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

/// Read access to a region's bytes: derefs to them while it holds the
/// region's read lock. Opaque, so that the bytes cannot be had without the
/// lock: a slice taken out of a guard (and the guard dropped) would outlive
/// [`Region::retire`], and with it the caller's borrow of the memory.
///
/// ```compile_fail,E0599
/// use rdapl_core::mem::{Region, RegionRead};
/// let r = Region::zeroed(8);
/// let RegionRead::Raw(g, s) = r.read() else { return };
/// ```
pub struct RegionRead<'a>(ReadGuard<'a>);

enum ReadGuard<'a> {
    /// Owned memory.
    Owned(RwLockReadGuard<'a, Box<[u8]>>),
    /// Raw memory: the bytes, valid while the guard (held, never read)
    /// keeps `retire` out.
    Raw(#[allow(dead_code)] RwLockReadGuard<'a, ()>, &'a [u8]),
}

impl std::ops::Deref for RegionRead<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            ReadGuard::Owned(g) => g,
            ReadGuard::Raw(_, s) => s,
        }
    }
}

/// Write access to a region's bytes: derefs to them while it holds the
/// region's write lock. Opaque, as [`RegionRead`] (and so that an owned
/// region's memory cannot be replaced by another of a different length).
///
/// ```compile_fail,E0599
/// use rdapl_core::mem::{Region, RegionWrite};
/// let r = Region::zeroed(8);
/// let RegionWrite::Raw(g, s) = r.write() else { return };
/// ```
pub struct RegionWrite<'a>(WriteGuard<'a>);

enum WriteGuard<'a> {
    /// Owned memory.
    Owned(RwLockWriteGuard<'a, Box<[u8]>>),
    /// Raw memory: the bytes, valid while the guard (held, never read)
    /// keeps `retire` out.
    Raw(#[allow(dead_code)] RwLockWriteGuard<'a, ()>, &'a mut [u8]),
}

impl std::ops::Deref for RegionWrite<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            WriteGuard::Owned(g) => g,
            WriteGuard::Raw(_, s) => s,
        }
    }
}

impl std::ops::DerefMut for RegionWrite<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.0 {
            WriteGuard::Owned(g) => g,
            WriteGuard::Raw(_, s) => s,
        }
    }
}

/// Whether `len` bytes can be had now: asked for and given back at once,
/// so that the caller then takes them zeroed from the allocator (whose
/// fresh pages stay untouched until used), where asking for zeroed memory
/// directly would abort the process on failure.
pub(crate) fn can_allocate(len: usize) -> bool {
    Vec::<u8>::new().try_reserve_exact(len).is_ok()
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

    /// [`Region::zeroed`] for a length a user chose: `None` where the
    /// memory cannot be had, not an abort of the process.
    pub fn try_zeroed(len: usize) -> Option<Arc<Region>> {
        can_allocate(len).then(|| Region::zeroed(len))
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
                (!self.is_retired()).then_some(RegionRead(ReadGuard::Owned(g)))
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
                Some(RegionRead(ReadGuard::Raw(g, s)))
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
                (!self.is_retired()).then_some(RegionWrite(WriteGuard::Owned(g)))
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
                Some(RegionWrite(WriteGuard::Raw(g, s)))
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
