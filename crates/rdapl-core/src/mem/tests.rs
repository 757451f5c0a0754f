//! Unit tests of registered memory: keys, access checks, the key cache,
//! windows, retirement and the copies.

use super::cache::CachedKey;
use super::copy::copy_spans;
use super::table::SPARE_SLOTS;
use super::*;
use crate::event::{DtoStatus, PzHandle};
use std::sync::Arc;

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
// The table's logic, no unsafe code: too slow under Miri for what it adds.
#[cfg_attr(miri, ignore)]
fn keys_rotate_through_every_byte_and_never_run_out() {
    let t = MemTable::default();
    let r = Region::zeroed(8);
    let first = t.insert(entry(&r, MemPriv::ALL)).unwrap();
    let mut ctx = first;
    let mut seen = std::collections::HashSet::from([ctx]);
    // Each re-key refuses the old key; 256 keys in a row are all different.
    for _ in 0..255 {
        let n = t.rekey(ctx, |_| {}).unwrap();
        assert!(t.get(ctx).is_none(), "old key still valid");
        assert!(seen.insert(n), "key {n:#x} came back early");
        ctx = n;
    }
    // The 257th is the first again (an 8-bit key, as on hardware), and
    // re-keying goes on for as long as it is asked.
    ctx = t.rekey(ctx, |_| {}).unwrap();
    assert_eq!(ctx, first);
    for _ in 0..10_000 {
        let n = t.rekey(ctx, |_| {}).unwrap();
        assert!(t.get(ctx).is_none() && t.get(n).is_some());
        ctx = n;
    }
}

#[test]
// The table's logic, no unsafe code: too slow under Miri for what it adds.
#[cfg_attr(miri, ignore)]
fn a_freed_key_comes_back_only_after_many_registrations() {
    let t = MemTable::default();
    let r = Region::zeroed(8);
    let live: Vec<u32> = (0..10)
        .map(|_| t.insert(entry(&r, MemPriv::ALL)).unwrap())
        .collect();
    let mut last_seen = std::collections::HashMap::new();
    let n = 300_000u64;
    for i in 0..n {
        let c = t.insert(entry(&r, MemPriv::ALL)).unwrap();
        if let Some(at) = last_seen.insert(c, i) {
            assert!(
                i - at >= 256 * SPARE_SLOTS as u64,
                "key {c:#x} back after {} registrations",
                i - at
            );
        }
        t.remove(c).unwrap();
        assert!(t.get(c).is_none());
    }
    // The table holds the live entries and the spares, not the history.
    assert!(t.slots.read().len() <= live.len() + SPARE_SLOTS + 1);
    assert!(live.iter().all(|&c| t.get(c).is_some()));
}

#[test]
// The table's logic, no unsafe code: too slow under Miri for what it adds.
#[cfg_attr(miri, ignore)]
fn a_reserved_key_applies_only_forward() {
    let t = MemTable::default();
    let r = Region::zeroed(8);
    let mut ctx = t.insert(entry(&r, MemPriv::ALL)).unwrap();
    // Reserved, then overtaken by a re-key: applying it is refused.
    let stale = t.next_key(ctx).unwrap();
    ctx = t.rekey(ctx, |_| {}).unwrap();
    assert!(!t.set_key(stale, |_| {}));
    assert!(t.get(ctx).is_some());
    // Reserve and apply, past the key byte's wrap many times.
    for _ in 0..1_000 {
        let k = t.next_key(ctx).unwrap();
        assert!(t.get(ctx).is_some(), "reserving leaves the key");
        assert!(t.set_key(k, |_| {}));
        assert!(t.get(ctx).is_none() && t.get(k).is_some());
        ctx = k;
    }
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
    // A window re-bound past its key byte's wrap is counted once, and
    // released with its last key.
    let mut w = t.insert(window()).unwrap();
    assert!(t.bind_window(l, w, a, 16, MemPriv::REMOTE_WRITE));
    for _ in 0..600 {
        w = t.rekey(w, |_| {}).unwrap();
        assert!(t.bind_window(l, w, a, 16, MemPriv::REMOTE_WRITE));
        assert_eq!(bound(&t, l), 1);
    }
    assert!(t.remove_unbound(l).is_err(), "bound: not removable");
    t.remove(w).unwrap();
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

/// Spans built by hand outside their regions (offset or length past the
/// end, or a sum past `usize`) are refused by every public copy, naming
/// the side, with no byte moved and no panic; `total` saturates.
#[test]
fn hand_built_spans_out_of_range_are_refused_not_a_panic() {
    let a = Region::zeroed(8);
    let b = Region::zeroed(8);
    let span = |region, offset, len| SpanRef {
        region,
        offset,
        len,
    };
    let ok = span(&a, 0, 8);
    let src = Retired {
        src: true,
        dst: false,
    };
    let dst = Retired {
        src: false,
        dst: true,
    };
    for bad in [
        span(&b, 9, 0),
        span(&b, 4, 5),
        span(&b, usize::MAX, 2),
        span(&b, 1, usize::MAX),
    ] {
        assert_eq!(copy_one(bad, ok), Err(src), "{bad:?}");
        assert_eq!(copy_one(ok, bad), Err(dst), "{bad:?}");
        assert_eq!(copy_refs(&[ok, bad], &[ok]), Err(src), "{bad:?}");
        assert_eq!(copy_refs(&[ok], &[bad, ok]), Err(dst), "{bad:?}");
        assert_eq!(
            copy_refs(&[bad], &[bad]),
            Err(Retired {
                src: true,
                dst: true
            })
        );
        assert_eq!(copy_from_buf(b"12345678", &[bad]), Err(dst), "{bad:?}");
        assert_eq!(copy_into_buf(&[bad], &mut [0u8; 8]), Err(src), "{bad:?}");
    }
    assert_eq!(&*a.read(), &[0u8; 8]);
    assert_eq!(&*b.read(), &[0u8; 8]);
    assert_eq!(
        total(&[span(&b, 0, usize::MAX), span(&b, 0, 2)]),
        usize::MAX
    );
}
