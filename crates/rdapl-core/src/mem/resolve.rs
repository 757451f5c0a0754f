//! Resolving keys: the access check and the `resolve*` methods of
//! [`MemTable`].
//!
//! Every access is checked against the entry's protection zone, its range
//! and its rights before a byte moves. A refused access moves nothing. A
//! segment of zero bytes names no memory and is not resolved. A key to a
//! retired region is refused.

use super::cache::{CACHED_KEYS, CachedKey, KeyCache};
use super::table::{EntryKind, MemTable, Slot, within};
use super::{LmrTriplet, MemPriv, Region, Span, SpanRef, SpanRefs, Spans};
use crate::event::{DtoStatus, PzHandle};
use std::sync::atomic::Ordering;

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

impl MemTable {
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
        if let [t] = iov
            && t.segment_length > 0
            && let Some(i) = self.cached_index(cache, t.lmr_context)
        {
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
pub(super) fn check_access(
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
