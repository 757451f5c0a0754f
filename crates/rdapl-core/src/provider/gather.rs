//! Registered memory held by reference for transmitting: a provider writes
//! a send's bytes, an RDMA write's or a read response's to its transport
//! straight from the registered regions, with no staging copy.
//!
//! # Guarantees
//!
//! * A [`Gather`] is checked when it is made, as the copying calls check:
//!   [`EpInner::gather_ref`] as [`EpInner::gather`] (keys, protection
//!   zone, local read, bounds), [`EpInner::remote_gather`] as
//!   [`EpInner::remote_read`] (remote read over the whole range).
//! * Its bytes are read only under the regions' read locks
//!   ([`Gather::lock`]), taken in region order as every copy of the core
//!   takes them, so no deadlock with placements. A region retired
//!   meanwhile is never read again: `lock` returns `None`.
//! * Holding a `Gather` holds no lock: placements and the application wait
//!   only while a [`GatherLock`] lives, which should be for one system call
//!   or one checksum.
//!
//! As with a NIC's DMA, the bytes sent are those in the region when they
//! are read; DAT leaves a buffer the application's again only once its
//! request has completed.

use crate::ep::{EpInner, Wr};
use crate::event::DtoStatus;
use crate::mem::{MemPriv, RegionRead, RmrTriplet, Span, Spans};
use smallvec::SmallVec;

/// A checked scatter/gather list held by reference.
#[derive(Debug, Clone)]
pub struct Gather {
    spans: Spans,
    len: usize,
}

/// A [`Gather`] with every region locked for reading.
pub struct GatherLock<'a> {
    spans: &'a [Span],
    len: usize,
    guards: SmallVec<[(u64, RegionRead<'a>); 4]>,
}

impl Gather {
    fn new(spans: Spans) -> Gather {
        let len = spans.iter().map(|s| s.len).sum();
        Gather { spans, len }
    }

    /// A list of spans of regions the caller holds (for a provider's own
    /// memory, and tests); `None` if a span passes the end of its region.
    /// Making one checks no key: the keys of an endpoint's memory are
    /// checked by [`EpInner::gather_ref`] and [`EpInner::remote_gather`].
    pub fn from_spans(spans: impl IntoIterator<Item = Span>) -> Option<Gather> {
        let spans: Spans = spans.into_iter().collect();
        for s in &spans {
            if s.offset.checked_add(s.len)? > s.region.len() {
                return None;
            }
        }
        Some(Gather::new(spans))
    }

    /// Bytes in the list.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the list holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Locks every region of the list for reading, in region order;
    /// `None` if one is retired (nothing of the list may be read then).
    pub fn lock(&self) -> Option<GatherLock<'_>> {
        let mut regions: SmallVec<[&Span; 4]> = SmallVec::new();
        for s in &self.spans {
            if !regions.iter().any(|r| r.region.id() == s.region.id()) {
                regions.push(s);
            }
        }
        regions.sort_by_key(|s| s.region.id());
        let mut guards = SmallVec::new();
        for s in regions {
            guards.push((s.region.id(), s.region.try_read()?));
        }
        Some(GatherLock {
            spans: &self.spans,
            len: self.len,
            guards,
        })
    }
}

impl GatherLock<'_> {
    /// The bytes `[start, end)` of the list, in order, one slice per
    /// segment they cross; `None` if the range is not inside the list.
    pub fn slices(&self, start: usize, end: usize) -> Option<impl Iterator<Item = &[u8]> + '_> {
        if start > end || end > self.len {
            return None;
        }
        let mut at = 0usize;
        Some(self.spans.iter().filter_map(move |s| {
            let (lo, hi) = (at, at + s.len);
            at = hi;
            let (a, b) = (start.max(lo), end.min(hi));
            if a >= b {
                return None;
            }
            let g = self.guards.iter().find(|g| g.0 == s.region.id())?;
            let off = s.offset + (a - lo);
            Some(&g.1[off..off + (b - a)])
        }))
    }
}

impl EpInner {
    /// The local list of a send or RDMA write `wr`, checked for local read
    /// as [`EpInner::gather`] checks it and held by reference
    /// ([`Gather`]); `None` if the request carries an owned buffer
    /// ([`crate::Buf`]: [`EpInner::gather`] copies that one).
    /// `LocalProtection` if a key does not allow it.
    pub fn gather_ref(&self, wr: &Wr) -> std::result::Result<Option<Gather>, DtoStatus> {
        if wr.data().is_some() {
            return Ok(None);
        }
        let spans = self
            .ia
            .mem
            .resolve_local(wr.iov(), MemPriv::LOCAL_READ, self.pz.inner.id)?;
        Ok(Some(Gather::new(spans)))
    }

    /// A peer's RDMA read of `source` (its key, address and length), checked
    /// as [`EpInner::remote_read`] checks it (`RemoteAccess`) and held by
    /// reference, for its response to be sent straight from the region.
    pub fn remote_gather(&self, source: RmrTriplet) -> std::result::Result<Gather, DtoStatus> {
        let mut spans = Spans::new();
        if source.segment_length > 0 {
            let span = self
                .ia
                .mem
                .resolve(
                    source.rmr_context,
                    source.target_address,
                    source.segment_length,
                    MemPriv::REMOTE_READ,
                    self.pz.inner.id,
                )
                .map_err(|_| DtoStatus::RemoteAccess)?;
            spans.push(span);
        }
        Ok(Gather::new(spans))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::Region;

    fn span(r: &std::sync::Arc<Region>, offset: usize, len: usize) -> Span {
        Span {
            region: r.clone(),
            offset,
            len,
        }
    }

    #[test]
    fn slices_cross_segments_in_list_order() {
        let a = Region::from_vec((0..100u8).collect());
        let b = Region::from_vec((100..200u8).collect());
        assert!(Gather::from_spans([span(&a, 90, 11)]).is_none());
        assert!(Gather::from_spans([span(&a, usize::MAX, 2)]).is_none());
        let g = Gather::from_spans([span(&b, 10, 20), span(&a, 5, 10), span(&b, 0, 3)]).unwrap();
        assert_eq!(g.len(), 33);
        let l = g.lock().unwrap();
        let all: Vec<u8> = l.slices(0, 33).unwrap().flatten().copied().collect();
        let want: Vec<u8> = (110..130u8).chain(5..15).chain(100..103).collect();
        assert_eq!(all, want);
        let mid: Vec<&[u8]> = l.slices(18, 31).unwrap().collect();
        assert_eq!(
            mid,
            vec![
                &[128u8, 129][..],
                &(5..15u8).collect::<Vec<_>>()[..],
                &[100][..]
            ]
        );
        assert_eq!(l.slices(33, 33).unwrap().count(), 0);
        assert!(l.slices(0, 34).is_none());
        assert!(l.slices(5, 4).is_none());
        drop(l);
        // A retired region is never read again.
        a.retire();
        assert!(g.lock().is_none());
    }
}
