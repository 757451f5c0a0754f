//! Protection zones and the memory registered in them: LMRs (with fast
//! registration) and RMRs (memory windows).
//!
//! An [`Lmr`] registers a [`Region`] with access rights and returns its
//! `lmr_context` (local key) and `rmr_context` (remote key). An [`Rmr`] is a
//! window: created unbound, bound to a range of an LMR by a work request on
//! an endpoint (`Ep::post_rmr_bind`, completing through the request EVD as
//! a `BindMw` DTO), unbound the same way. A fast-registration LMR
//! ([`Pz::lmr_create_fmr`]) is mapped and invalidated by work requests
//! (`Ep::post_lmr_fmr`, `Ep::post_lmr_invalidate`). Every bind, map,
//! invalidate or free gives the entry a new key: a key from before is
//! refused for good (see [`crate::mem`]). A window grants access only while
//! the mapping it was bound to lasts: invalidating, re-mapping or freeing
//! its LMR unbinds it, so it never reaches memory the LMR no longer maps.
//!
//! # Whose memory
//!
//! An LMR's memory is owned by rdapl ([`Pz::lmr_create`] of a
//! [`Region::from_vec`] or [`Region::zeroed`], [`Pz::lmr_create_from`]), or
//! borrowed from the caller for a scope: [`lmr_scope`] and
//! [`Pz::lmr_create_borrowed`] register a `&mut [u8]` in place (no copy) as
//! a [`BorrowedLmr`], which holds the borrow. Dropping or
//! [releasing](BorrowedLmr::release) it frees the LMR (invalidating it, and
//! every window bound to it, if windows are still bound) and retires its
//! region: once that returns rdapl never touches the buffer again, and a
//! transfer that raced with it either finished before or moves nothing and
//! fails. The scope does the same for any `BorrowedLmr` that was leaked
//! (`std::mem::forget`) before it returns, which is what makes the borrow
//! safe: a destructor alone is not guaranteed to run. Raw memory for the C
//! ABI goes through the `unsafe` [`Region::from_raw`].

use crate::buf::Buf;
use crate::error::{Error, Result, Subtype};
use crate::event::{LmrHandle, PzHandle, RmrHandle};
use crate::ia::{Admission, Ia, IaInner};
use crate::mem::{Entry, EntryKind, LmrTriplet, MemPriv, Region, RmrTriplet};
use crate::provider::{MemHandle, MemInfo, PzOps};
use parking_lot::Mutex;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// A protection zone. Cloning gives another handle to the same PZ.
#[derive(Clone)]
pub struct Pz {
    pub(crate) inner: Arc<PzInner>,
}

pub(crate) struct PzInner {
    /// The consumer context (`DAT_CONTEXT`).
    pub(crate) context: crate::context::ContextSlot,
    pub(crate) id: PzHandle,
    pub(crate) ia: Arc<IaInner>,
    /// LMRs, RMRs and endpoints using this PZ.
    pub(crate) users: AtomicUsize,
    freed: AtomicBool,
    /// Serialises `free`'s look at `users` and its setting of `freed`
    /// with a new user's check and count ([`Pz::acquire`]): a free and a
    /// registration (or endpoint, or SRQ) on another thread never both
    /// succeed.
    life: Mutex<()>,
    /// The provider's table of the zone and its memory.
    ops: Box<dyn PzOps>,
}

impl fmt::Debug for Pz {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Pz").field(&self.inner.id).finish()
    }
}

fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Pz {
    pub(crate) fn new(ia: &Ia) -> Result<Pz> {
        let id = PzHandle(next_id());
        let place = Admission::take(
            &ia.inner.live.pzs,
            ia.inner.attr.max_pzs,
            Subtype::ResourceProtectionDomain,
            "max_pzs protection zones live",
        )?;
        let ops = ia.inner.transport.pz_create(id)?;
        place.keep();
        Ok(Pz {
            inner: Arc::new(PzInner {
                context: crate::context::ContextSlot::new(),
                id,
                ia: ia.inner.clone(),
                users: AtomicUsize::new(0),
                freed: AtomicBool::new(false),
                life: Mutex::new(()),
                ops,
            }),
        })
    }

    /// Tells the provider of a memory object registered in the zone (its
    /// table entry `ctx`): the provider's remote key, if it gives one. If
    /// the provider refuses it, or gives a key to an object whose keys
    /// change (a window, a fast-registration LMR), the entry goes.
    fn announce(&self, ctx: u32, mem: &MemInfo) -> Result<Option<u32>> {
        let grant = self.inner.ops.mem_create(mem).inspect_err(|_| {
            self.inner.ia.mem.remove(ctx);
        })?;
        let rekeyed = mem.fast || matches!(mem.handle, MemHandle::Rmr(_));
        if grant.rmr_context.is_some() && rekeyed {
            // Accepted, so the provider hears of its end.
            self.inner.ops.mem_free(mem);
            self.inner.ia.mem.remove(ctx);
            return Err(Error::Internal(
                "the provider gave its own remote key to a window or a \
                 fast-registration LMR, whose keys change with every bind and map"
                    .into(),
            ));
        }
        Ok(grant.rmr_context)
    }

    /// The PZ's handle.
    pub fn handle(&self) -> PzHandle {
        self.inner.id
    }

    pub(crate) fn check_live(&self) -> Result<()> {
        // An abrupt IA close destroys every object of the IA.
        if self.inner.freed.load(Ordering::SeqCst) || self.inner.ia.closed.load(Ordering::SeqCst) {
            Err(Error::InvalidHandle(Subtype::InvalidHandlePz))
        } else {
            Ok(())
        }
    }

    /// Counts a new user of the zone (an LMR, RMR, endpoint or SRQ being
    /// created): refused if the zone is freed, checked under the lock
    /// [`Pz::free`] takes. The count goes again when the returned guard
    /// drops, unless [`PzUse::keep`] kept it.
    pub(crate) fn acquire(&self) -> Result<PzUse<'_>> {
        let _g = self.inner.life.lock();
        self.check_live()?;
        self.inner.users.fetch_add(1, Ordering::SeqCst);
        Ok(PzUse(Some(&self.inner)))
    }

    /// Frees the PZ (`dat_pz_free`); refused while LMRs, RMRs or endpoints use it.
    pub fn free(&self) -> Result<()> {
        let life = self.inner.life.lock();
        self.check_live()?;
        if self.inner.users.load(Ordering::SeqCst) > 0 {
            return Err(Error::state(
                Subtype::InvalidStatePzInUse,
                "LMRs, RMRs or endpoints still use this protection zone",
            ));
        }
        if self.inner.freed.swap(true, Ordering::SeqCst) {
            return Err(Error::InvalidHandle(Subtype::InvalidHandlePz));
        }
        drop(life);
        self.inner.ia.live.pzs.fetch_sub(1, Ordering::Relaxed);
        self.inner.ops.free();
        Ok(())
    }

    /// An owned buffer of `len` zeroed bytes in this zone, for
    /// [`Ep::post_send_buf`](crate::Ep::post_send_buf) and
    /// [`Ep::post_recv_buf`](crate::Ep::post_recv_buf) (see [`crate::buf`]).
    /// Refused like an LMR larger than `max_lmr_block_size`, and with
    /// `InsufficientResources(ResourceMemory)` where the memory cannot be
    /// had.
    pub fn buf_create(&self, len: usize) -> Result<Buf> {
        self.check_buf_len(len)?;
        Buf::try_zeroed(self.inner.id, len).ok_or(BUF_MEMORY)
    }

    /// An owned buffer of this zone holding a copy of `data` (see
    /// [`Pz::buf_create`]).
    pub fn buf_from(&self, data: &[u8]) -> Result<Buf> {
        self.check_buf_len(data.len())?;
        let mut b = Buf::try_zeroed(self.inner.id, data.len()).ok_or(BUF_MEMORY)?;
        b.copy_from_slice(data);
        Ok(b)
    }

    fn check_buf_len(&self, len: usize) -> Result<()> {
        self.check_live()?;
        if len as u64 > self.inner.ia.attr.max_lmr_block_size {
            return Err(Error::InsufficientResources {
                resource: Subtype::ResourceMemoryRegion,
                what: "buffer larger than max_lmr_block_size",
            });
        }
        Ok(())
    }

    /// Registers `region` with `privs` (`dat_lmr_create`). A retired region
    /// is refused.
    pub fn lmr_create(&self, region: Arc<Region>, privs: MemPriv) -> Result<Lmr> {
        let user = self.acquire()?;
        if region.is_retired() {
            return Err(Error::param(1, "the region is retired"));
        }
        let max = self.inner.ia.attr.max_lmr_block_size;
        if region.len() as u64 > max {
            return Err(Error::InsufficientResources {
                resource: Subtype::ResourceMemoryRegion,
                what: "region larger than max_lmr_block_size",
            });
        }
        let entry = Entry {
            kind: EntryKind::Lmr,
            key: 0,
            pz: self.inner.id,
            start: region.address(),
            len: region.len() as u64,
            region: Some(region.clone()),
            privs,
            parent: None,
            bound_rmrs: 0,
        };
        let ctx = self.inner.ia.mem.insert(entry)?;
        let len = region.len() as u64;
        let lmr = Lmr::new(self, Some(region), ctx, EntryKind::Lmr, privs, len)?;
        user.keep();
        Ok(lmr)
    }

    /// Registers a copy of `data` in memory rdapl owns.
    pub fn lmr_create_from(&self, data: Vec<u8>, privs: MemPriv) -> Result<Lmr> {
        self.lmr_create(Region::from_vec(data), privs)
    }

    /// Registers the caller's buffer in place, without copying it, until the
    /// returned [`BorrowedLmr`] is dropped or
    /// [released](BorrowedLmr::release), or at the latest until `scope`
    /// ends (see [`lmr_scope`]).
    ///
    /// The `BorrowedLmr` derefs to an [`Lmr`] (triplets, contexts,
    /// [`Lmr::read_at`], [`Lmr::write_at`], windows and transfers all work
    /// as for any LMR) and holds the borrow of `buf`, so the caller cannot
    /// touch the buffer while it is registered. When it goes, rdapl
    /// guarantees it never touches the buffer again: the LMR is freed (its
    /// keys are dead; if windows are still bound to it, it is
    /// invalidated anyway and every window bound to it is unbound, so their
    /// keys die too), and the region is retired, which first waits for any
    /// copy in progress. A transfer that resolved a key before then and
    /// runs after moves no byte and fails (`LocalProtection` or
    /// `RemoteAccess`, breaking its connection). Keep the region's address
    /// in mind: it is the buffer's, and triplets refer to it.
    ///
    /// The scope is what makes this safe: a destructor is not guaranteed to
    /// run (`std::mem::forget` is safe), so the buffer stays borrowed until
    /// the scope ends, which retires every registration made in it.
    ///
    /// ```
    /// use rdapl::{Ia, IaOpen, MemPriv};
    ///
    /// let ia = Ia::open_with("loopback", Default::default()).unwrap();
    /// let pz = ia.pz_create().unwrap();
    /// let mut buf = *b"hello, world";
    /// rdapl::lmr_scope(|s| {
    ///     let lmr = pz.lmr_create_borrowed(s, &mut buf, MemPriv::ALL).unwrap();
    ///     lmr.write_at(0, b"HELLO").unwrap(); // as a transfer would
    ///     let t = lmr.triplet(0, 12).unwrap(); // for a scatter/gather list
    ///     assert_eq!(t.segment_length, 12);
    ///     let back: &mut [u8] = lmr.release(); // the borrow, given back
    ///     back[5] = b'!';
    /// });
    /// assert_eq!(&buf, b"HELLO! world");
    /// ```
    ///
    /// While it is registered the buffer cannot be used:
    ///
    /// ```compile_fail
    /// # use rdapl::{Ia, IaOpen, MemPriv};
    /// # let ia = Ia::open_with("loopback", Default::default()).unwrap();
    /// # let pz = ia.pz_create().unwrap();
    /// let mut buf = [0u8; 64];
    /// rdapl::lmr_scope(|s| {
    ///     let lmr = pz.lmr_create_borrowed(s, &mut buf, MemPriv::ALL).unwrap();
    ///     buf[0] = 1; // error: `buf` is borrowed by the registration
    ///     drop(lmr);
    /// });
    /// ```
    ///
    /// and leaking the registration does not end the borrow (only the scope
    /// does, after retiring the region):
    ///
    /// ```compile_fail
    /// # use rdapl::{Ia, IaOpen, MemPriv};
    /// # let ia = Ia::open_with("loopback", Default::default()).unwrap();
    /// # let pz = ia.pz_create().unwrap();
    /// let mut buf = [0u8; 64];
    /// rdapl::lmr_scope(|s| {
    ///     let lmr = pz.lmr_create_borrowed(s, &mut buf, MemPriv::ALL).unwrap();
    ///     std::mem::forget(lmr);
    ///     buf[0] = 1; // error: `buf` is borrowed until the scope ends
    /// });
    /// ```
    ///
    /// nor can the registration outlive the scope:
    ///
    /// ```compile_fail
    /// # use rdapl::{Ia, IaOpen, MemPriv};
    /// # let ia = Ia::open_with("loopback", Default::default()).unwrap();
    /// # let pz = ia.pz_create().unwrap();
    /// let mut buf = [0u8; 64];
    /// let lmr = rdapl::lmr_scope(|s| pz.lmr_create_borrowed(s, &mut buf, MemPriv::ALL).unwrap());
    /// ```
    pub fn lmr_create_borrowed<'scope>(
        &self,
        scope: &'scope LmrScope<'scope, '_>,
        buf: &'scope mut [u8],
        privs: MemPriv,
    ) -> Result<BorrowedLmr<'scope>> {
        let (ptr, len) = (buf.as_mut_ptr(), buf.len());
        // SAFETY: `Region::from_raw`'s contract holds until the region is
        // retired:
        // * `ptr` is non-null and `ptr..ptr+len` valid for reads and writes:
        //   they come from a `&'scope mut [u8]`, valid for all of `'scope`;
        // * nothing else accesses the memory: the borrow is exclusive, and it
        //   stays with us (the `BorrowedLmr` carries it as `PhantomData`; its
        //   `release` hands it back only after retiring the region);
        // * the region is retired before `'scope` ends: `BorrowedLmr`'s drop
        //   and `release` retire it, and since those may never run (a leak),
        //   it is recorded in `scope`, which `lmr_scope` retires before it
        //   returns, i.e. while the borrow of `buf` still lasts. Only `Arc`
        //   clones of the region may outlive that, and a retired region never
        //   touches its memory.
        #[allow(unsafe_code)]
        let region = unsafe { Region::from_raw(ptr, len) };
        // Recorded first, so a registration can never escape retirement.
        scope.record(&region);
        let lmr = match self.lmr_create(region.clone(), privs) {
            Ok(l) => l,
            Err(e) => {
                region.retire();
                return Err(e);
            }
        };
        scope.attach(&region, &lmr);
        Ok(BorrowedLmr {
            lmr,
            region,
            _buf: PhantomData,
        })
    }

    /// Allocates a fast-registration LMR of at most `max_len` bytes; it is
    /// unmapped (every key refused) until `Ep::post_lmr_fmr` maps it.
    pub fn lmr_create_fmr(&self, max_len: u64) -> Result<Lmr> {
        let user = self.acquire()?;
        let entry = Entry {
            kind: EntryKind::Fmr,
            key: 0,
            pz: self.inner.id,
            region: None,
            start: 0,
            len: max_len,
            privs: MemPriv::NONE,
            parent: None,
            bound_rmrs: 0,
        };
        let ctx = self.inner.ia.mem.insert(entry)?;
        let lmr = Lmr::new(self, None, ctx, EntryKind::Fmr, MemPriv::NONE, max_len)?;
        user.keep();
        Ok(lmr)
    }

    /// Creates an unbound RMR (memory window) (`dat_rmr_create`).
    pub fn rmr_create(&self) -> Result<Rmr> {
        let user = self.acquire()?;
        let ia = &self.inner.ia;
        let place = Admission::take(
            &ia.live.rmrs,
            ia.attr.max_rmrs,
            Subtype::ResourceMemoryRegion,
            "max_rmrs RMRs live",
        )?;
        let entry = Entry {
            kind: EntryKind::Rmr,
            key: 0,
            pz: self.inner.id,
            region: None,
            start: 0,
            len: 0,
            privs: MemPriv::NONE,
            parent: None,
            bound_rmrs: 0,
        };
        let ctx = self.inner.ia.mem.insert(entry)?;
        let id = RmrHandle(next_id());
        let announced = MemInfo {
            handle: MemHandle::Rmr(id),
            lmr_context: 0,
            rmr_context: ctx,
            len: 0,
            privileges: MemPriv::NONE,
            fast: false,
        };
        self.announce(ctx, &announced)?;
        user.keep();
        place.keep();
        Ok(Rmr {
            inner: Arc::new(RmrInner {
                id,
                context: crate::context::ContextSlot::new(),
                pz: self.clone(),
                ctx: Mutex::new(Some(ctx)),
                announced,
            }),
        })
    }
}

/// A user of a zone counted by [`Pz::acquire`]: uncounted on drop unless
/// kept.
pub(crate) struct PzUse<'a>(Option<&'a PzInner>);

impl PzUse<'_> {
    /// The new user exists: the count stays.
    pub(crate) fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for PzUse<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.0 {
            p.users.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// A local memory region. Cloning gives another handle to the same LMR.
#[derive(Clone)]
pub struct Lmr {
    pub(crate) inner: Arc<LmrInner>,
}

pub(crate) struct LmrInner {
    pub(crate) id: LmrHandle,
    /// The consumer context (`DAT_CONTEXT`).
    pub(crate) context: crate::context::ContextSlot,
    pub(crate) pz: Pz,
    pub(crate) kind: EntryKind,
    /// The current key and region, under one lock (so `read_at` /
    /// `write_at` take one lock for both).
    pub(crate) map: Mutex<LmrMap>,
    /// A plain LMR's region: it never changes (only fast-registration
    /// LMRs are re-mapped, and they have `None` here), so `read_at` and
    /// `write_at` reach it without the map's lock.
    fixed: Option<Arc<Region>>,
    /// Set (under the map's lock) when the LMR is freed: `read_at` and
    /// `write_at` through `fixed` refuse it from then on. (A copy racing
    /// with the free either ran before it or sees this; memory safety does
    /// not rest on it: the region's lock and retirement mark do that.)
    freed: AtomicBool,
    privs: Mutex<MemPriv>,
    /// Largest region it may map (fast registration; its length otherwise).
    pub(crate) max_len: u64,
    /// What the zone's provider table was told at its creation.
    announced: MemInfo,
    /// The provider's remote key for it, if its fabric gives one
    /// ([`crate::provider::MemGrant`]).
    remote_key: Option<u32>,
}

/// What an LMR currently maps.
pub(crate) struct LmrMap {
    /// Current context, `None` once freed.
    pub(crate) ctx: Option<u32>,
    /// The registered region (for an FMR: the currently mapped one).
    pub(crate) region: Option<Arc<Region>>,
}

impl fmt::Debug for Lmr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lmr")
            .field("context", &self.inner.map.lock().ctx)
            .field("kind", &self.inner.kind)
            .finish()
    }
}

impl Lmr {
    /// The LMR's handle (stable across re-mappings, unlike its context).
    pub fn handle(&self) -> LmrHandle {
        self.inner.id
    }

    fn new(
        pz: &Pz,
        region: Option<Arc<Region>>,
        ctx: u32,
        kind: EntryKind,
        privs: MemPriv,
        max_len: u64,
    ) -> Result<Lmr> {
        let id = LmrHandle(next_id());
        let announced = MemInfo {
            handle: MemHandle::Lmr(id),
            lmr_context: ctx,
            rmr_context: ctx,
            len: if kind == EntryKind::Fmr { 0 } else { max_len },
            privileges: privs,
            fast: kind == EntryKind::Fmr,
        };
        let ia = &pz.inner.ia;
        let place = Admission::take(
            &ia.live.lmrs,
            ia.attr.max_lmrs,
            Subtype::ResourceMemoryRegion,
            "max_lmrs LMRs live",
        )
        .inspect_err(|_| {
            ia.mem.remove(ctx);
        })?;
        // (The zone's count of users: the caller's `PzUse`.)
        let remote_key = pz.announce(ctx, &announced)?;
        place.keep();
        Ok(Lmr {
            inner: Arc::new(LmrInner {
                id,
                context: crate::context::ContextSlot::new(),
                pz: pz.clone(),
                kind,
                fixed: if kind == EntryKind::Fmr {
                    None
                } else {
                    region.clone()
                },
                freed: AtomicBool::new(false),
                map: Mutex::new(LmrMap {
                    ctx: Some(ctx),
                    region,
                }),
                privs: Mutex::new(privs),
                max_len,
                announced,
                remote_key,
            }),
        })
    }

    /// The LMR's key; `InvalidHandle(LMR)` once freed, or once its IA
    /// closed abruptly (which destroys every object of the IA).
    fn ctx(&self) -> Result<u32> {
        let gone = Error::InvalidHandle(Subtype::InvalidHandleLmr);
        if self.inner.pz.inner.ia.closed.load(Ordering::SeqCst) {
            return Err(gone);
        }
        self.inner.map.lock().ctx.ok_or(gone)
    }

    /// The local key (`lmr_context`).
    pub fn context(&self) -> Result<u32> {
        self.ctx()
    }

    /// The remote key (`rmr_context`), to hand to a peer: the local key,
    /// unless the provider's fabric gave a key of its own
    /// ([`crate::provider::MemGrant`]). Remote access still needs a remote
    /// right.
    pub fn rmr_context(&self) -> Result<u32> {
        let ctx = self.ctx()?;
        Ok(self.inner.remote_key.unwrap_or(ctx))
    }

    /// The rights granted.
    pub fn privileges(&self) -> MemPriv {
        *self.inner.privs.lock()
    }

    /// The registered (or mapped) region.
    pub fn region(&self) -> Option<Arc<Region>> {
        self.inner.map.lock().region.clone()
    }

    /// Address of the first registered byte.
    pub fn address(&self) -> Result<u64> {
        self.region().map(|r| r.address()).ok_or(Error::state(
            Subtype::InvalidStateLmrFree,
            "the LMR is not mapped",
        ))
    }

    /// The triplet for `len` bytes at `offset` into the LMR (for
    /// scatter/gather lists). The triplet's `virtual_address` is absolute
    /// (the region's address plus `offset`), as DAT's is. `Length` if the
    /// range reaches past the end of the LMR (a triplet built by hand is
    /// not checked until a transfer uses it); `InvalidState` while the LMR
    /// is not mapped.
    pub fn triplet(&self, offset: u64, len: u64) -> Result<LmrTriplet> {
        Ok(LmrTriplet {
            lmr_context: self.ctx()?,
            virtual_address: self.address_of(offset, len)?,
            segment_length: len,
        })
    }

    /// The triplet of the whole LMR.
    pub fn whole(&self) -> Result<LmrTriplet> {
        let len = self.region().map_or(0, |r| r.len() as u64);
        self.triplet(0, len)
    }

    /// The remote triplet for `len` bytes at `offset` into the LMR (to
    /// hand to a peer); checked as [`Lmr::triplet`].
    pub fn rmr_triplet(&self, offset: u64, len: u64) -> Result<RmrTriplet> {
        Ok(RmrTriplet {
            rmr_context: self.rmr_context()?,
            target_address: self.address_of(offset, len)?,
            segment_length: len,
        })
    }

    /// The address `offset` bytes into the region, if `len` bytes from
    /// there lie inside it.
    fn address_of(&self, offset: u64, len: u64) -> Result<u64> {
        let r = self.region().ok_or(Error::state(
            Subtype::InvalidStateLmrFree,
            "the LMR is not mapped",
        ))?;
        offset
            .checked_add(len)
            .filter(|end| *end <= r.len() as u64)
            .map(|_| r.address() + offset)
            .ok_or(Error::Length("the triplet reaches past the end of the LMR"))
    }

    /// Copies `buf.len()` bytes at `offset` of the region out.
    pub fn read_at(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        // A plain LMR: its region, without the map's lock (only the
        // region's, which keeps the retirement guarantee).
        if let Some(r) = &self.inner.fixed {
            self.check_not_freed()?;
            // The bytes were usually just written by a peer's thread: ask
            // for their line before the region lock's (a hint cannot fault).
            crate::evd::prefetch_read(r.address().wrapping_add(offset as u64) as usize as *const u8);
            let g = r.try_read().ok_or(RETIRED)?;
            let end = offset
                .checked_add(buf.len())
                .filter(|e| *e <= g.len())
                .ok_or_else(|| Error::param(2, "range outside the LMR"))?;
            buf.copy_from_slice(&g[offset..end]);
            return Ok(());
        }
        // Usually the region is free: one lock for the key and the region,
        // no reference count. The region lock is only tried here, never
        // waited for under the LMR's lock (a caller may hold the region's
        // guard and ask the LMR for its triplet).
        {
            let m = self.inner.map.lock();
            let r = Self::mapped(&m)?;
            if let Some(g) = r.try_read_uncontended() {
                let end = offset
                    .checked_add(buf.len())
                    .filter(|e| *e <= g.len())
                    .ok_or(Error::param(2, "range outside the LMR"))?;
                buf.copy_from_slice(&g[offset..end]);
                return Ok(());
            }
        }
        let r = self.live_region()?;
        let g = r.try_read().ok_or(RETIRED)?;
        let end = offset
            .checked_add(buf.len())
            .filter(|e| *e <= g.len())
            .ok_or(Error::param(2, "range outside the LMR"))?;
        buf.copy_from_slice(&g[offset..end]);
        Ok(())
    }

    /// Copies `data` into the region at `offset`.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        // As in `read_at`.
        if let Some(r) = &self.inner.fixed {
            self.check_not_freed()?;
            let mut g = r.try_write().ok_or(RETIRED)?;
            let end = offset
                .checked_add(data.len())
                .filter(|e| *e <= g.len())
                .ok_or_else(|| Error::param(2, "range outside the LMR"))?;
            g[offset..end].copy_from_slice(data);
            return Ok(());
        }
        // As in `read_at`: the region lock only tried under the LMR's.
        {
            let m = self.inner.map.lock();
            let r = Self::mapped(&m)?;
            if let Some(mut g) = r.try_write_uncontended() {
                let end = offset
                    .checked_add(data.len())
                    .filter(|e| *e <= g.len())
                    .ok_or(Error::param(2, "range outside the LMR"))?;
                g[offset..end].copy_from_slice(data);
                return Ok(());
            }
        }
        let r = self.live_region()?;
        let mut g = r.try_write().ok_or(RETIRED)?;
        let end = offset
            .checked_add(data.len())
            .filter(|e| *e <= g.len())
            .ok_or(Error::param(2, "range outside the LMR"))?;
        g[offset..end].copy_from_slice(data);
        Ok(())
    }

    /// The whole region's bytes, copied out.
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        Ok(self.live_region()?.try_read().ok_or(RETIRED)?.to_vec())
    }

    /// `InvalidHandle` once the LMR is freed (what [`Lmr::mapped`] says
    /// first, without the map's lock).
    #[inline]
    fn check_not_freed(&self) -> Result<()> {
        if self.inner.freed.load(Ordering::Acquire) {
            return Err(Error::InvalidHandle(Subtype::InvalidHandleLmr));
        }
        Ok(())
    }

    fn live_region(&self) -> Result<Arc<Region>> {
        Self::mapped(&self.inner.map.lock()).cloned()
    }

    /// The region of a live, mapped LMR.
    fn mapped(m: &LmrMap) -> Result<&Arc<Region>> {
        m.ctx
            .ok_or(Error::InvalidHandle(Subtype::InvalidHandleLmr))?;
        m.region.as_ref().ok_or(Error::state(
            Subtype::InvalidStateLmrFree,
            "the LMR is not mapped",
        ))
    }

    /// Frees the LMR (`dat_lmr_free`); refused with `InvalidState(LMR_IN_USE)`
    /// while an RMR is bound to it. Its keys are dead from then on: a
    /// request posted later that names them is refused. Requests already
    /// posted from it may still read its memory, as DMA from registered
    /// memory would (rdapl-owned memory lives as long as they need it;
    /// DAT leaves freeing an LMR in use undefined): free it once they
    /// completed. (Writing it meanwhile can make a peer's CRC check fail
    /// and end the connection.) `InvalidHandle(LMR)` once freed, or once
    /// its IA closed abruptly (which destroyed it).
    pub fn free(&self) -> Result<()> {
        let mut m = self.inner.map.lock();
        let ctx = &mut m.ctx;
        let mem = &self.inner.pz.inner.ia.mem;
        // (An abrupt close destroyed it with its IA.)
        let c = ctx
            .filter(|_| !self.inner.pz.inner.ia.closed.load(Ordering::SeqCst))
            .ok_or(Error::InvalidHandle(Subtype::InvalidHandleLmr))?;
        if mem.remove_unbound(c).is_err() {
            return Err(Error::state(
                Subtype::InvalidStateLmrInUse,
                "an RMR is still bound to this LMR",
            ));
        }
        *ctx = None;
        self.inner.freed.store(true, Ordering::Release);
        self.freed();
        Ok(())
    }

    /// Frees the LMR (if not freed already) even if windows are bound to it:
    /// then it is invalidated anyway and every window bound to it is unbound
    /// (their keys are refused from then on). Handles forget the region.
    fn free_forced(&self) {
        let mut m = self.inner.map.lock();
        if let Some(c) = m.ctx.take() {
            self.inner.freed.store(true, Ordering::Release);
            self.inner.pz.inner.ia.mem.invalidate_lmr(c);
            self.freed();
        }
        m.region = None;
    }

    /// Accounts for the LMR being freed.
    fn freed(&self) {
        self.inner.pz.inner.ops.mem_free(&self.inner.announced);
        self.inner.pz.inner.users.fetch_sub(1, Ordering::SeqCst);
        self.inner
            .pz
            .inner
            .ia
            .live
            .lmrs
            .fetch_sub(1, Ordering::Relaxed);
    }

    /// Changes the mapping to the key `table` (the registration table's
    /// change) returns, `region` and `privs`, under the map's lock, so
    /// that [`Lmr::free`] (which takes it too) sees the key from before
    /// the change or the one after, never a key the change just replaced;
    /// a freed LMR stays freed (`table` is not run). With `expect`, the
    /// LMR's key must still be that one. The new key, or `None` if nothing
    /// changed.
    pub(crate) fn change_mapping(
        &self,
        expect: Option<u32>,
        (region, privs): (Option<Arc<Region>>, MemPriv),
        table: impl FnOnce() -> Option<u32>,
    ) -> Option<u32> {
        let mut m = self.inner.map.lock();
        if m.ctx.is_none() || expect.is_some_and(|e| m.ctx != Some(e)) {
            return None;
        }
        let ctx = table()?;
        m.ctx = Some(ctx);
        m.region = region;
        *self.inner.privs.lock() = privs;
        Some(ctx)
    }
}

/// A buffer whose memory could not be had.
const BUF_MEMORY: Error = Error::InsufficientResources {
    resource: Subtype::ResourceMemory,
    what: "no memory for a buffer of that length",
};

const RETIRED: Error = Error::InvalidState {
    state: Subtype::InvalidStateLmrFree,
    what: "the region is retired",
};

/// Frees (or invalidates) `lmr` and retires `region`: afterwards rdapl never
/// touches the region's memory again.
fn unregister(lmr: &Lmr, region: &Region) {
    // Retired first: freeing calls the provider (`PzOps::mem_free`), which
    // may panic, and a panic here ends the borrow (the scope or the
    // `BorrowedLmr` unwinds) with the memory still reachable.
    region.retire();
    lmr.free_forced();
}

/// A scope for [`BorrowedLmr`]s: see [`lmr_scope`].
pub struct LmrScope<'scope, 'env: 'scope> {
    /// Every region registered in the scope and not yet retired, with its
    /// LMR once registered.
    regs: Mutex<Vec<(Arc<Region>, Option<Lmr>)>>,
    /// Invariant in both, as `std::thread::Scope`: the borrows handed to
    /// [`Pz::lmr_create_borrowed`] must last exactly until the scope ends.
    scope: PhantomData<&'scope mut &'scope ()>,
    env: PhantomData<&'env mut &'env ()>,
}

impl fmt::Debug for LmrScope<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LmrScope")
            .field("registered", &self.regs.lock().len())
            .finish()
    }
}

impl LmrScope<'_, '_> {
    fn record(&self, region: &Arc<Region>) {
        let mut regs = self.regs.lock();
        // Forget what was released already: a loop of short registrations
        // does not grow the scope.
        regs.retain(|(r, _)| !r.is_retired());
        regs.push((region.clone(), None));
    }

    fn attach(&self, region: &Arc<Region>, lmr: &Lmr) {
        if let Some(r) = self
            .regs
            .lock()
            .iter_mut()
            .find(|(r, _)| Arc::ptr_eq(r, region))
        {
            r.1 = Some(lmr.clone());
        }
    }

    /// Unregisters everything still registered.
    fn end(&self) {
        let regs = std::mem::take(&mut *self.regs.lock());
        // Every region retired before any LMR is freed: a provider's
        // `mem_free` that panics cannot leave a later one live.
        for (region, _) in &regs {
            region.retire();
        }
        for (region, lmr) in regs {
            if let Some(l) = lmr {
                unregister(&l, &region);
            }
        }
    }
}

/// Runs `f` with a scope in which caller memory can be registered in place
/// ([`Pz::lmr_create_borrowed`]); before returning (also when `f` panics)
/// it unregisters and retires every registration made in the scope that
/// was not dropped or released already, so that no registration outlives
/// the borrows, even one that was leaked.
///
/// Buffers registered in the scope stay borrowed until it ends, unless
/// given back earlier by [`BorrowedLmr::release`].
///
/// ```
/// use rdapl::{Ia, IaOpen, MemPriv};
///
/// let ia = Ia::open_with("loopback", Default::default()).unwrap();
/// let pz = ia.pz_create().unwrap();
/// let mut a = vec![0u8; 32];
/// let mut b = [0u8; 16];
/// let lmr = rdapl::lmr_scope(|s| {
///     let la = pz.lmr_create_borrowed(s, &mut a, MemPriv::ALL).unwrap();
///     let lb = pz.lmr_create_borrowed(s, &mut b, MemPriv::ALL).unwrap();
///     la.write_at(0, b"in a").unwrap();
///     lb.write_at(0, b"in b").unwrap();
///     std::mem::forget(lb); // leaked: the scope still unregisters it
///     rdapl::Lmr::clone(&la) // a plain handle may outlive the scope...
/// });
/// assert_eq!(&a[..4], b"in a");
/// assert_eq!(&b[..4], b"in b");
/// assert!(lmr.context().is_err(), "...but it is freed");
/// assert!(pz.free().is_ok(), "nothing registered is left");
/// ```
pub fn lmr_scope<'env, F, T>(f: F) -> T
where
    F: for<'scope> FnOnce(&'scope LmrScope<'scope, 'env>) -> T,
{
    struct End<'a, 'scope, 'env>(&'a LmrScope<'scope, 'env>);
    impl Drop for End<'_, '_, '_> {
        fn drop(&mut self) {
            self.0.end();
        }
    }
    let scope = LmrScope {
        regs: Mutex::new(Vec::new()),
        scope: PhantomData,
        env: PhantomData,
    };
    let _end = End(&scope);
    f(&scope)
}

/// An LMR over memory borrowed from the caller for `'scope`
/// ([`Pz::lmr_create_borrowed`]). It derefs to the [`Lmr`]; dropping it, or
/// [`BorrowedLmr::release`], unregisters it and guarantees rdapl never
/// touches the memory again.
pub struct BorrowedLmr<'scope> {
    lmr: Lmr,
    region: Arc<Region>,
    /// The caller's exclusive borrow of the memory, held while registered.
    _buf: PhantomData<&'scope mut [u8]>,
}

impl fmt::Debug for BorrowedLmr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BorrowedLmr")
            .field("lmr", &self.lmr)
            .field("region", &self.region)
            .finish()
    }
}

impl std::ops::Deref for BorrowedLmr<'_> {
    type Target = Lmr;
    fn deref(&self) -> &Lmr {
        &self.lmr
    }
}

impl<'scope> BorrowedLmr<'scope> {
    /// Unregisters the memory as dropping does (the LMR freed, or
    /// invalidated with its windows if windows are still bound; the region
    /// retired, after any copy in progress) and gives the borrow back.
    /// Clones of the [`Lmr`] are dead from then on.
    pub fn release(self) -> &'scope mut [u8] {
        unregister(&self.lmr, &self.region);
        let (ptr, len) = self.region.raw_parts().expect("a borrowed region is raw");
        // SAFETY: `ptr` and `len` are those of the `&'scope mut [u8]` this
        // registration was made from, and `self` (consumed here) held that
        // exclusive borrow; the region is retired, so rdapl never touches
        // the memory again and the slice returned is the only access to it,
        // for `'scope`, as the borrow it stands for.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts_mut(ptr, len)
        }
    }
}

impl Drop for BorrowedLmr<'_> {
    fn drop(&mut self) {
        // After `release` this finds the LMR freed and the region retired:
        // it only takes (and drops) the region's lock once more.
        unregister(&self.lmr, &self.region);
    }
}

/// A remote memory region (memory window). Cloning gives another handle.
#[derive(Clone)]
pub struct Rmr {
    pub(crate) inner: Arc<RmrInner>,
}

pub(crate) struct RmrInner {
    pub(crate) id: RmrHandle,
    /// The consumer context (`DAT_CONTEXT`).
    pub(crate) context: crate::context::ContextSlot,
    pub(crate) pz: Pz,
    pub(crate) ctx: Mutex<Option<u32>>,
    /// What the zone's provider table was told at its creation.
    announced: MemInfo,
}

impl fmt::Debug for Rmr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rmr")
            .field("context", &*self.inner.ctx.lock())
            .finish()
    }
}

impl Rmr {
    /// The RMR's handle (stable across binds, unlike its context).
    pub fn handle(&self) -> RmrHandle {
        self.inner.id
    }

    /// The remote triplet for `len` bytes at `offset` into the bound
    /// window (to hand to a peer). `InvalidState` while unbound, `Length`
    /// past the end of the window.
    pub fn triplet(&self, offset: u64, len: u64) -> Result<RmrTriplet> {
        let ctx = self.context()?;
        let e = self
            .inner
            .pz
            .inner
            .ia
            .mem
            .get(ctx)
            .filter(|e| e.region.is_some())
            .ok_or(Error::state(Subtype::NoSubtype, "the window is not bound"))?;
        match offset.checked_add(len) {
            Some(end) if end <= e.len => Ok(RmrTriplet {
                rmr_context: ctx,
                target_address: e.start + offset,
                segment_length: len,
            }),
            _ => Err(Error::Length(
                "the triplet reaches past the end of the window",
            )),
        }
    }

    /// The current `rmr_context` (changes on every bind and unbind).
    pub fn context(&self) -> Result<u32> {
        let gone = Error::InvalidHandle(Subtype::InvalidHandleRmr);
        if self.inner.pz.inner.ia.closed.load(Ordering::SeqCst) {
            return Err(gone);
        }
        self.inner.ctx.lock().ok_or(gone)
    }

    /// Frees the RMR (`dat_rmr_free`); a bound window is unbound first (its
    /// LMR no longer counts it) and its key is dead from then on.
    /// `InvalidHandle(RMR)` once freed, or once its IA closed abruptly.
    pub fn free(&self) -> Result<()> {
        let mut ctx = self.inner.ctx.lock();
        // (An abrupt close destroyed it with its IA.)
        let c = ctx
            .filter(|_| !self.inner.pz.inner.ia.closed.load(Ordering::SeqCst))
            .ok_or(Error::InvalidHandle(Subtype::InvalidHandleRmr))?;
        // (Unbinding is part of the removal, under the table's lock.)
        self.inner.pz.inner.ia.mem.remove(c);
        *ctx = None;
        self.inner.pz.inner.ops.mem_free(&self.inner.announced);
        self.inner.pz.inner.users.fetch_sub(1, Ordering::SeqCst);
        self.inner
            .pz
            .inner
            .ia
            .live
            .rmrs
            .fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }
}

crate::context::consumer_context!(Pz, |s| s.inner.context);
crate::context::consumer_context!(Lmr, |s| s.inner.context);
crate::context::consumer_context!(Rmr, |s| s.inner.context);
