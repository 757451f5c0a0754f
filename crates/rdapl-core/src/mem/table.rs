//! The registration table of one IA: keys to entries, and the changes
//! that bind, unbind, invalidate, re-key and remove them.
//!
//! A key is a 24-bit slot index and an 8-bit key byte (as an iWARP STag's
//! index and consumer key, or an InfiniBand key's). Freeing, invalidating,
//! re-binding or re-mapping an entry rotates its key byte, so a dead key
//! is refused until its slot has handed out 256 more keys: an entry
//! re-bound or re-mapped in place comes back to a key after 256 changes,
//! as hardware's does, and free slots are reused oldest first, only while
//! more than [`SPARE_SLOTS`] are free, so a freed entry's key comes back
//! after at least 256 × `SPARE_SLOTS` registrations. Nothing runs out: an
//! IA registers, re-maps and re-binds for as long as it lives, in a table
//! as large as its most registrations at once plus the spares. A window
//! is unbound in the same table change that ends its LMR's mapping. Its
//! LMR's count of bound windows stays exact on every path, failures
//! included.

use super::{MemPriv, Region};
use crate::error::{Error, Result, Subtype};
use crate::event::PzHandle;
use parking_lot::{Mutex, RwLock, RwLockWriteGuard};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

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

pub(super) struct Slot {
    pub(super) entry: Option<Entry>,
    /// Keys this slot ever handed out (reserved ones included): the next
    /// key's generation. A key's byte is its generation modulo 256.
    issued: u64,
    /// The generation of the entry's key.
    current: u64,
}

impl Slot {
    /// Hands out the slot's next key; returns its generation.
    fn issue(&mut self) -> u64 {
        let g = self.issued;
        self.issued += 1;
        g
    }

    /// The newest generation issued whose byte is `k` (a reserved key's,
    /// see [`MemTable::next_key`]), if any.
    fn generation_of(&self, k: u8) -> Option<u64> {
        let last = self.issued.checked_sub(1)?;
        last.checked_sub(u64::from((last as u8).wrapping_sub(k)))
    }
}

/// The registration table of one IA: keys to entries.
#[derive(Default)]
pub struct MemTable {
    pub(super) slots: RwLock<Vec<Slot>>,
    /// Free slots, oldest first.
    free: Mutex<VecDeque<u32>>,
    /// Bumped under the write lock, before any change: a
    /// [`KeyCache`](super::KeyCache) entry read at this generation is what
    /// the table says as long as the generation has not moved.
    pub(super) generation: AtomicU64,
}

const MAX_SLOTS: usize = 1 << 24;

/// Free slots kept aside: a free slot is reused only while more than this
/// many are free (or the table is full), so that a freed entry's key does
/// not come back before at least 256 times as many registrations.
pub(crate) const SPARE_SLOTS: usize = 64;

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
/// the latest, as [`CachedKey`](super::cache::CachedKey)'s bounds say).
/// Computed without overflow.
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
        let reuse = {
            let mut free = self.free.lock();
            if free.len() > SPARE_SLOTS || slots.len() >= MAX_SLOTS {
                free.pop_front()
            } else {
                None
            }
        };
        let idx = match reuse {
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
                    issued: 0,
                    current: 0,
                });
                (slots.len() - 1) as u32
            }
        };
        let slot = &mut slots[idx as usize];
        slot.current = slot.issue();
        entry.key = slot.current as u8;
        let ctx = (idx << 8) | entry.key as u32;
        slot.entry = Some(entry);
        Ok(ctx)
    }

    pub(super) fn slot_of(ctx: u32) -> (usize, u8) {
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

    /// Gives the entry of `ctx` a new key (the old one is refused from now
    /// on, see the module docs) and applies `f` to it. Its bindings go with
    /// the old key (see [`MemTable::detach`]): a window leaves the LMR it
    /// was bound to, an LMR's windows are unbound. Returns the new context,
    /// or `None` if `ctx` is not live.
    pub(crate) fn rekey(&self, ctx: u32, f: impl FnOnce(&mut Entry)) -> Option<u32> {
        let (i, k) = Self::slot_of(ctx);
        let mut slots = self.write_slots();
        if slots.get(i)?.entry.as_ref()?.key != k {
            return None;
        }
        Self::detach(&mut slots, i);
        let slot = &mut slots[i];
        slot.current = slot.issue();
        let key = slot.current as u8;
        let e = slot.entry.as_mut()?;
        f(e);
        e.key = key;
        Some(((i as u32) << 8) | u32::from(key))
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
    /// entry (see [`MemTable::set_key`]); `None` if `ctx` is dead.
    pub(crate) fn next_key(&self, ctx: u32) -> Option<u32> {
        let (i, k) = Self::slot_of(ctx);
        let mut slots = self.write_slots();
        let slot = slots.get_mut(i)?;
        if slot.entry.as_ref()?.key != k {
            return None;
        }
        let key = slot.issue() as u8;
        Some(((i as u32) << 8) | u32::from(key))
    }

    /// Gives the entry in `new_ctx`'s slot the key reserved by
    /// [`MemTable::next_key`] (whatever its current key) and applies `f`.
    /// Keys only move forward: false if the entry is gone or already has a
    /// later key.
    pub(crate) fn set_key(&self, new_ctx: u32, f: impl FnOnce(&mut Entry)) -> bool {
        let (i, k) = Self::slot_of(new_ctx);
        let mut slots = self.write_slots();
        let Some(slot) = slots.get(i).filter(|s| s.entry.is_some()) else {
            return false;
        };
        let Some(g) = slot.generation_of(k).filter(|&g| g >= slot.current) else {
            return false;
        };
        // The old key's bindings go with it.
        Self::detach(&mut slots, i);
        let slot = &mut slots[i];
        slot.current = g;
        let Some(e) = slot.entry.as_mut() else {
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
        self.free.lock().push_back(i as u32);
        Ok(e)
    }

    /// Removes the entry of `ctx`; its key is dead, and its bindings
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
        self.free.lock().push_back(i as u32);
        e
    }

    /// Removes the LMR entry of `ctx` even if windows are bound to it: its
    /// key is dead, and every window bound to it is left unbound (see
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
        self.free.lock().push_back(i as u32);
        Some((e, unbound))
    }
}
