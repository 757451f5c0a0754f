//! Spans and the one copy that moves data between registered regions (and
//! between regions and owned buffers).
//!
//! Regions are locked in id order (sinks for writing, sources for
//! reading), so concurrent copies neither race nor deadlock. Each region is
//! checked live under its lock: if one is retired, no byte moves. A span
//! built by hand outside its region's bounds (the fields are public) is
//! refused the same way, never a panic.

use super::{LmrTriplet, Region, RegionRead, RegionWrite};
use std::sync::Arc;

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

/// Total length of spans (saturating).
pub fn total(spans: &[SpanRef<'_>]) -> usize {
    spans.iter().fold(0usize, |n, s| n.saturating_add(s.len))
}

/// Whether `s` lies within its region.
#[inline]
fn in_bounds(s: &SpanRef<'_>) -> bool {
    s.offset
        .checked_add(s.len)
        .is_some_and(|end| end <= s.region.len())
}

/// `Err` naming the side(s) with a span outside its region.
#[inline]
fn check_bounds(src: &[SpanRef<'_>], dst: &[SpanRef<'_>]) -> std::result::Result<(), Retired> {
    let r = Retired {
        src: !src.iter().all(in_bounds),
        dst: !dst.iter().all(in_bounds),
    };
    if r.src || r.dst { Err(r) } else { Ok(()) }
}

/// A copy refused because a region it names is retired (or a span lies
/// outside its region): which side(s).
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
    check_bounds(&[s], &[d])?;
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
    if let ([s], [d]) = (src, dst)
        && s.region.id != d.region.id
    {
        return copy_one(*s, *d);
    }
    check_bounds(src, dst)?;
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
    check_bounds(&[], dst)?;
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
    check_bounds(src, &[])?;
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
