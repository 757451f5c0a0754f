//! A few resolved keys of one registration table, so the data path checks
//! a cached key without the table's lock.
//!
//! A cached key is valid while the table's generation has not moved. It
//! accepts exactly what the full access check accepts. A miss drops every
//! stale entry.

use super::resolve::check_access;
use super::table::{Entry, EntryKind};
use super::{AccessError, MemPriv, Region};
use crate::event::PzHandle;
use std::sync::Arc;

/// How many keys a [`KeyCache`] holds.
pub(super) const CACHED_KEYS: usize = 4;

/// A few resolved keys of one registration table, each as of a table
/// generation (an endpoint keeps one for its own table and one for its
/// peer's, under its lock). Valid while the table's generation has not
/// moved; a miss drops every stale entry, so a region outlives its last
/// registration in here only until the endpoint's next miss (or release).
#[derive(Default)]
pub struct KeyCache {
    pub(super) keys: [Option<CachedKey>; CACHED_KEYS],
    next: usize,
}

/// An entry's access-check inputs, as of `generation`.
pub(super) struct CachedKey {
    ctx: u32,
    generation: u64,
    rmr: bool,
    pz: PzHandle,
    privs: MemPriv,
    start: u64,
    len: u64,
    pub(super) region: Arc<Region>,
    /// The addresses an access may span: the entry's range within the
    /// region's (what [`check_access`] checks, precomputed).
    lo: u64,
    hi: u64,
}

impl CachedKey {
    pub(super) fn new(ctx: u32, generation: u64, e: &Entry, region: &Arc<Region>) -> CachedKey {
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
    pub(super) fn offset(
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
    pub(super) fn check(
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
    pub(super) fn find(&self, ctx: u32, generation: u64) -> Option<&CachedKey> {
        self.position(ctx, generation).map(|i| self.get(i))
    }

    /// The index of `ctx` cached at `generation`.
    #[inline(always)]
    pub(super) fn position(&self, ctx: u32, generation: u64) -> Option<usize> {
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
    pub(super) fn get(&self, i: usize) -> &CachedKey {
        self.keys[i].as_ref().expect("a cached key's index")
    }

    /// Adds `k`, dropping stale entries first; returns its index.
    pub(super) fn insert(&mut self, k: CachedKey) -> usize {
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
