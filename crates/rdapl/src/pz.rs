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
//! refused for good (see [`crate::mem`]).

use crate::error::{Error, Result, Subtype};
use crate::event::PzHandle;
use crate::ia::{Ia, IaInner};
use crate::mem::{Entry, EntryKind, LmrTriplet, MemPriv, Region, RmrTriplet};
use parking_lot::Mutex;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// A protection zone. Cloning gives another handle to the same PZ.
#[derive(Clone)]
pub struct Pz {
    pub(crate) inner: Arc<PzInner>,
}

pub(crate) struct PzInner {
    pub(crate) id: PzHandle,
    pub(crate) ia: Arc<IaInner>,
    /// LMRs, RMRs and endpoints using this PZ.
    pub(crate) users: AtomicUsize,
    freed: AtomicBool,
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
    pub(crate) fn new(ia: &Ia) -> Pz {
        ia.inner.live.pzs.fetch_add(1, Ordering::Relaxed);
        Pz {
            inner: Arc::new(PzInner {
                id: PzHandle(next_id()),
                ia: ia.inner.clone(),
                users: AtomicUsize::new(0),
                freed: AtomicBool::new(false),
            }),
        }
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

    /// Frees the PZ (`dat_pz_free`); refused while LMRs, RMRs or endpoints use it.
    pub fn free(&self) -> Result<()> {
        self.check_live()?;
        if self.inner.users.load(Ordering::SeqCst) > 0 {
            return Err(Error::state(
                Subtype::InvalidStatePzInUse,
                "LMRs, RMRs or endpoints still use this protection zone",
            ));
        }
        self.inner.freed.store(true, Ordering::SeqCst);
        self.inner.ia.live.pzs.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }

    /// Registers `region` with `privs` (`dat_lmr_create`).
    pub fn lmr_create(&self, region: Arc<Region>, privs: MemPriv) -> Result<Lmr> {
        self.check_live()?;
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
        Ok(Lmr::new(
            self,
            Some(region),
            ctx,
            EntryKind::Lmr,
            privs,
            len,
        ))
    }

    /// Registers a copy of `data` in memory rdapl owns.
    pub fn lmr_create_from(&self, data: Vec<u8>, privs: MemPriv) -> Result<Lmr> {
        self.lmr_create(Region::from_vec(data), privs)
    }

    /// Allocates a fast-registration LMR of at most `max_len` bytes; it is
    /// unmapped (every key refused) until `Ep::post_lmr_fmr` maps it.
    pub fn lmr_create_fmr(&self, max_len: u64) -> Result<Lmr> {
        self.check_live()?;
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
        Ok(Lmr::new(
            self,
            None,
            ctx,
            EntryKind::Fmr,
            MemPriv::NONE,
            max_len,
        ))
    }

    /// Creates an unbound RMR (memory window) (`dat_rmr_create`).
    pub fn rmr_create(&self) -> Result<Rmr> {
        self.check_live()?;
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
        self.inner.users.fetch_add(1, Ordering::SeqCst);
        self.inner.ia.live.rmrs.fetch_add(1, Ordering::Relaxed);
        Ok(Rmr {
            inner: Arc::new(RmrInner {
                pz: self.clone(),
                ctx: Mutex::new(Some(ctx)),
            }),
        })
    }
}

/// A local memory region. Cloning gives another handle to the same LMR.
#[derive(Clone)]
pub struct Lmr {
    pub(crate) inner: Arc<LmrInner>,
}

pub(crate) struct LmrInner {
    pub(crate) pz: Pz,
    pub(crate) kind: EntryKind,
    /// The registered region (for an FMR: the currently mapped one).
    pub(crate) region: Mutex<Option<Arc<Region>>>,
    /// Current context, `None` once freed.
    pub(crate) ctx: Mutex<Option<u32>>,
    privs: Mutex<MemPriv>,
    /// Largest region it may map (fast registration; its length otherwise).
    pub(crate) max_len: u64,
}

impl fmt::Debug for Lmr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lmr")
            .field("context", &*self.inner.ctx.lock())
            .field("kind", &self.inner.kind)
            .finish()
    }
}

impl Lmr {
    fn new(
        pz: &Pz,
        region: Option<Arc<Region>>,
        ctx: u32,
        kind: EntryKind,
        privs: MemPriv,
        max_len: u64,
    ) -> Lmr {
        pz.inner.users.fetch_add(1, Ordering::SeqCst);
        pz.inner.ia.live.lmrs.fetch_add(1, Ordering::Relaxed);
        Lmr {
            inner: Arc::new(LmrInner {
                pz: pz.clone(),
                kind,
                region: Mutex::new(region),
                ctx: Mutex::new(Some(ctx)),
                privs: Mutex::new(privs),
                max_len,
            }),
        }
    }

    fn ctx(&self) -> Result<u32> {
        self.inner
            .ctx
            .lock()
            .ok_or(Error::InvalidHandle(Subtype::InvalidHandleLmr))
    }

    /// The local key (`lmr_context`).
    pub fn context(&self) -> Result<u32> {
        self.ctx()
    }

    /// The remote key (`rmr_context`); equal to the local key in rdapl. Remote
    /// access still needs a remote right.
    pub fn rmr_context(&self) -> Result<u32> {
        self.ctx()
    }

    /// The rights granted.
    pub fn privileges(&self) -> MemPriv {
        *self.inner.privs.lock()
    }

    /// The registered (or mapped) region.
    pub fn region(&self) -> Option<Arc<Region>> {
        self.inner.region.lock().clone()
    }

    /// Address of the first registered byte.
    pub fn address(&self) -> Result<u64> {
        self.region().map(|r| r.address()).ok_or(Error::state(
            Subtype::InvalidStateLmrFree,
            "the LMR is not mapped",
        ))
    }

    /// The triplet for `len` bytes at `offset` (for scatter/gather lists).
    pub fn triplet(&self, offset: u64, len: u64) -> Result<LmrTriplet> {
        Ok(LmrTriplet {
            lmr_context: self.ctx()?,
            virtual_address: self.address()? + offset,
            segment_length: len,
        })
    }

    /// The remote triplet for `len` bytes at `offset` (to hand to a peer).
    pub fn rmr_triplet(&self, offset: u64, len: u64) -> Result<RmrTriplet> {
        Ok(RmrTriplet {
            rmr_context: self.ctx()?,
            target_address: self.address()? + offset,
            segment_length: len,
        })
    }

    /// Copies `buf.len()` bytes at `offset` of the region out.
    pub fn read_at(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        let r = self.live_region()?;
        let g = r.read();
        let end = offset
            .checked_add(buf.len())
            .filter(|e| *e <= g.len())
            .ok_or(Error::param(2, "range outside the LMR"))?;
        buf.copy_from_slice(&g[offset..end]);
        Ok(())
    }

    /// Copies `data` into the region at `offset`.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        let r = self.live_region()?;
        let mut g = r.write();
        let end = offset
            .checked_add(data.len())
            .filter(|e| *e <= g.len())
            .ok_or(Error::param(2, "range outside the LMR"))?;
        g[offset..end].copy_from_slice(data);
        Ok(())
    }

    /// The whole region's bytes, copied out.
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        Ok(self.live_region()?.read().to_vec())
    }

    fn live_region(&self) -> Result<Arc<Region>> {
        self.ctx()?;
        self.region().ok_or(Error::state(
            Subtype::InvalidStateLmrFree,
            "the LMR is not mapped",
        ))
    }

    /// Frees the LMR (`dat_lmr_free`); refused with `InvalidState(LMR_IN_USE)`
    /// while an RMR is bound to it. Its keys die for good.
    pub fn free(&self) -> Result<()> {
        let mut ctx = self.inner.ctx.lock();
        let c = ctx.ok_or(Error::InvalidHandle(Subtype::InvalidHandleLmr))?;
        let mem = &self.inner.pz.inner.ia.mem;
        if mem.get(c).is_some_and(|e| e.bound_rmrs > 0) {
            return Err(Error::state(
                Subtype::InvalidStateLmrInUse,
                "an RMR is still bound to this LMR",
            ));
        }
        mem.remove(c);
        *ctx = None;
        self.inner.pz.inner.users.fetch_sub(1, Ordering::SeqCst);
        self.inner
            .pz
            .inner
            .ia
            .live
            .lmrs
            .fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }

    pub(crate) fn set_mapping(&self, ctx: u32, region: Option<Arc<Region>>, privs: MemPriv) {
        *self.inner.ctx.lock() = Some(ctx);
        *self.inner.region.lock() = region;
        *self.inner.privs.lock() = privs;
    }
}

/// A remote memory region (memory window). Cloning gives another handle.
#[derive(Clone)]
pub struct Rmr {
    pub(crate) inner: Arc<RmrInner>,
}

pub(crate) struct RmrInner {
    pub(crate) pz: Pz,
    pub(crate) ctx: Mutex<Option<u32>>,
}

impl fmt::Debug for Rmr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rmr")
            .field("context", &*self.inner.ctx.lock())
            .finish()
    }
}

impl Rmr {
    /// The current `rmr_context` (changes on every bind and unbind).
    pub fn context(&self) -> Result<u32> {
        self.inner
            .ctx
            .lock()
            .ok_or(Error::InvalidHandle(Subtype::InvalidHandleRmr))
    }

    /// Frees the RMR (`dat_rmr_free`); a bound window is unbound first and
    /// its key dies for good.
    pub fn free(&self) -> Result<()> {
        let mut ctx = self.inner.ctx.lock();
        let c = ctx.ok_or(Error::InvalidHandle(Subtype::InvalidHandleRmr))?;
        let mem = &self.inner.pz.inner.ia.mem;
        if let Some(e) = mem.remove(c) {
            if let Some(p) = e.parent {
                mem.with_mut(p, |l| l.bound_rmrs = l.bound_rmrs.saturating_sub(1));
            }
        }
        *ctx = None;
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
