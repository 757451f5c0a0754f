//! Regression tests of registered-memory defects found by an adversarial
//! test of the public API: windows outliving their LMR's mapping (an FMR
//! invalidated or re-mapped under them), and a window's bind leaked when
//! it ran out of keys (keys no longer run out: a window re-bound and an
//! FMR re-mapped hundreds of times keep their counts exact).
//!
//! Every test opens its IAs at its own address (`127.0.40.<m>`) and uses its
//! own connection qualifiers, so the tests run in parallel. Every wait has a
//! timeout. A remote access error breaks the connection (RC semantics), so
//! the tests reconnect (`Pair::reconnect`) between failing accesses.

use crate::case;
use crate::support as common;

use common::{D, Inject, Pair, next_dto, pair, rt};
use rdapl::error::Subtype;
use rdapl::*;
use std::sync::Arc;

fn remote_rw() -> MemPriv {
    MemPriv::REMOTE_READ | MemPriv::REMOTE_WRITE
}

/// Client RDMA write of `len` bytes of `src` to `remote`; its completion.
fn write(p: &Pair, src: &Lmr, len: u64, remote: RmrTriplet, cookie: u64) -> DtoCompletion {
    p.c.ep
        .post_rdma_write(&[src.triplet(0, len).unwrap()], remote, cookie, D)
        .unwrap();
    let d = next_dto(&p.c.req);
    assert_eq!((d.cookie, d.operation), (cookie, DtoOp::RdmaWrite));
    d
}

/// Client RDMA read of `len` bytes of `remote` into `dst`; its completion.
fn read(p: &Pair, dst: &Lmr, len: u64, remote: RmrTriplet, cookie: u64) -> DtoCompletion {
    p.c.ep
        .post_rdma_read(&[dst.triplet(0, len).unwrap()], remote, cookie, D)
        .unwrap();
    let d = next_dto(&p.c.req);
    assert_eq!((d.cookie, d.operation), (cookie, DtoOp::RdmaRead));
    d
}

/// Server maps the FMR `fmr` onto `region`; waits for the completion.
fn map(p: &Pair, fmr: &Lmr, region: &Arc<Region>, cookie: u64) -> u32 {
    let k =
        p.s.ep
            .post_lmr_fmr(fmr, region.clone(), MemPriv::ALL, cookie, D)
            .unwrap();
    let d = next_dto(&p.s.req);
    assert_eq!(
        (d.cookie, d.status, d.operation),
        (cookie, DtoStatus::Success, DtoOp::LmrFmr)
    );
    k
}

/// Server invalidates the FMR `fmr`; waits for the completion.
fn invalidate(p: &Pair, fmr: &Lmr, cookie: u64) {
    p.s.ep.post_lmr_invalidate(fmr, cookie, D).unwrap();
    let d = next_dto(&p.s.req);
    assert_eq!(
        (d.cookie, d.status, d.operation),
        (cookie, DtoStatus::Success, DtoOp::LmrInvalidate)
    );
}

/// Server binds `rmr` to `len` bytes at `off` of `lmr`; waits for the
/// completion and returns the window's key.
fn bind(p: &Pair, rmr: &Rmr, lmr: &Lmr, off: u64, len: u64, cookie: u64) -> u32 {
    let k =
        p.s.ep
            .post_rmr_bind(
                rmr,
                lmr,
                lmr.triplet(off, len).unwrap(),
                remote_rw(),
                cookie,
                D,
            )
            .unwrap();
    let d = next_dto(&p.s.req);
    assert_eq!(
        (d.cookie, d.status, d.operation),
        (cookie, DtoStatus::Success, DtoOp::BindMw)
    );
    k
}

/// Server unbinds `rmr`; waits for the completion.
fn unbind(p: &Pair, rmr: &Rmr, cookie: u64) {
    p.s.ep.post_rmr_unbind(rmr, cookie, D).unwrap();
    let d = next_dto(&p.s.req);
    assert_eq!(
        (d.cookie, d.status, d.operation),
        (cookie, DtoStatus::Success, DtoOp::BindMw)
    );
}

/// A write and a read of 16 bytes at `addr` through the window key `k`
/// are both refused (`RemoteAccess`, 0 bytes) and change nothing in
/// `regions`; the pair is reconnected afterwards.
fn window_refused(p: &Pair, k: u32, addr: u64, regions: &[&Arc<Region>], cookie: u64) {
    let before: Vec<Vec<u8>> = regions.iter().map(|r| r.read().to_vec()).collect();
    let src = p.c.lmr(vec![0xEE; 16]);
    let d = write(p, &src, 16, rt(k, addr, 16), cookie);
    assert_eq!(
        (d.status, d.transferred_length),
        (DtoStatus::RemoteAccess, 0),
        "a write through the window must be refused"
    );
    p.expect_end(ConnectionEventKind::Broken);
    p.reconnect();
    let sink = p.c.lmr(vec![0x11; 16]);
    let d = read(p, &sink, 16, rt(k, addr, 16), cookie + 1);
    assert_eq!(
        (d.status, d.transferred_length),
        (DtoStatus::RemoteAccess, 0),
        "a read through the window must be refused"
    );
    assert_eq!(sink.to_vec().unwrap(), vec![0x11; 16], "no byte read");
    p.expect_end(ConnectionEventKind::Broken);
    p.reconnect();
    for (r, b) in regions.iter().zip(&before) {
        assert_eq!(&*r.read(), &b[..], "no byte may change");
    }
}

// ----- defect 8: windows on an invalidated or re-mapped FMR ----------------

#[case]
fn window_on_invalidated_fmr_grants_nothing() {
    if crate::support::skip_unless_placed() {
        return;
    }
    let p = pair("127.0.40.1", "127.0.40.2", 4001);
    let fmr = p.s.pz.lmr_create_fmr(64).unwrap();
    let region = Region::from_vec(vec![7; 64]);
    map(&p, &fmr, &region, 1);
    let rmr = p.s.pz.rmr_create().unwrap();
    let k = bind(&p, &rmr, &fmr, 0, 64, 2);
    // The window works while the mapping lasts.
    let src = p.c.lmr(vec![0x5A; 16]);
    assert_eq!(
        write(&p, &src, 16, rt(k, region.address(), 16), 3).status,
        DtoStatus::Success
    );
    assert_eq!(region.read()[..16], [0x5A; 16]);
    invalidate(&p, &fmr, 4);
    window_refused(&p, k, region.address(), &[&region], 5);
    // Nothing is left bound: the FMR, the window and the zone can go.
    fmr.free().unwrap();
    rmr.free().unwrap();
}

#[case]
fn window_on_remapped_fmr_reaches_neither_mapping() {
    if crate::support::skip_unless_placed() {
        return;
    }
    let p = pair("127.0.40.3", "127.0.40.4", 4003);
    let fmr = p.s.pz.lmr_create_fmr(64).unwrap();
    let old = Region::from_vec(vec![1; 64]);
    map(&p, &fmr, &old, 1);
    let rmr = p.s.pz.rmr_create().unwrap();
    let k = bind(&p, &rmr, &fmr, 0, 64, 2);
    // Re-mapped without an invalidate in between.
    let new = Region::from_vec(vec![2; 64]);
    map(&p, &fmr, &new, 3);
    window_refused(&p, k, old.address(), &[&old, &new], 4);
    window_refused(&p, k, new.address(), &[&old, &new], 6);
    // The new mapping itself works, and only through the FMR's own key.
    let src = p.c.lmr(vec![3; 8]);
    assert_eq!(
        write(&p, &src, 8, fmr.rmr_triplet(0, 8).unwrap(), 8).status,
        DtoStatus::Success
    );
    assert_eq!(new.read()[..8], [3; 8]);
    // Unbinding the (already dead) window keeps the counts right.
    unbind(&p, &rmr, 9);
    rmr.free().unwrap();
    fmr.free().unwrap();
}

#[case]
fn window_rebound_after_fmr_remap_is_counted_once() {
    // A window unbound by a re-map, then bound to the new mapping and
    // freed: the FMR's use count goes back to zero.
    let p = pair("127.0.40.5", "127.0.40.6", 4005);
    let fmr = p.s.pz.lmr_create_fmr(64).unwrap();
    let a = Region::zeroed(64);
    map(&p, &fmr, &a, 1);
    let rmr = p.s.pz.rmr_create().unwrap();
    bind(&p, &rmr, &fmr, 0, 32, 2);
    let b = Region::zeroed(64);
    map(&p, &fmr, &b, 3);
    let k = bind(&p, &rmr, &fmr, 0, 32, 4);
    let src = p.c.lmr(vec![9; 8]);
    assert_eq!(
        write(&p, &src, 8, rt(k, b.address(), 8), 5).status,
        DtoStatus::Success
    );
    // Bound: the FMR cannot be freed.
    common::state_err(fmr.free(), Subtype::InvalidStateLmrInUse);
    rmr.free().unwrap();
    fmr.free().unwrap();
    assert_eq!(&a.read()[..], &[0; 64][..]);
}

#[case]
fn window_on_fmr_invalidated_while_bind_queued_grants_nothing() {
    if crate::support::skip_unless_placed() {
        return;
    }
    // The bind and the invalidate are queued together: the bind executes
    // first (the mapping is still there), then the invalidate must take
    // the new window with it.
    let p = pair("127.0.40.7", "127.0.40.8", 4007);
    let fmr = p.s.pz.lmr_create_fmr(64).unwrap();
    let region = Region::from_vec(vec![4; 64]);
    map(&p, &fmr, &region, 1);
    let rmr = p.s.pz.rmr_create().unwrap();
    // Both wait in the queue (a delay), so the invalidate is posted
    // before the bind executes.
    p.s.ep
        .inject_delay(Some(std::time::Duration::from_millis(30)));
    let k =
        p.s.ep
            .post_rmr_bind(&rmr, &fmr, fmr.triplet(0, 64).unwrap(), remote_rw(), 2, D)
            .unwrap();
    p.s.ep.post_lmr_invalidate(&fmr, 3, D).unwrap();
    p.s.ep.inject_delay(None);
    for cookie in [2, 3] {
        let d = next_dto(&p.s.req);
        assert_eq!((d.cookie, d.status), (cookie, DtoStatus::Success));
    }
    window_refused(&p, k, region.address(), &[&region], 4);
    fmr.free().unwrap();
    rmr.free().unwrap();
}

// ----- defect 9: a window re-bound again and again ------------------------

/// Rounds of re-binding and re-mapping: more than a key byte's 256 values.
const ROUNDS: u64 = 300;

/// Binds `rmr` to `lmr`, then alternates unbind and bind (or, with
/// `rebind`, binds it again and again) for twice [`ROUNDS`] posts: none is
/// refused (keys never run out), a replaced key is refused (checked every
/// 100 posts), and the window ends bound, counted once by its LMR.
fn rebind_window(p: &Pair, rmr: &Rmr, lmr: &Lmr, region: &Arc<Region>, rebind: bool) {
    let mut key = bind(p, rmr, lmr, 0, 64, 1);
    let mut cookie = 2;
    let mut bound = true;
    for post in 0..ROUNDS * 2 {
        let old = key;
        key = if bound && !rebind {
            p.s.ep.post_rmr_unbind(rmr, cookie, D).unwrap()
        } else {
            p.s.ep
                .post_rmr_bind(
                    rmr,
                    lmr,
                    lmr.triplet(0, 64).unwrap(),
                    remote_rw(),
                    cookie,
                    D,
                )
                .unwrap_or_else(|e| panic!("post {post}: {e:?}"))
        };
        let d = next_dto(&p.s.req);
        assert_eq!((d.cookie, d.status), (cookie, DtoStatus::Success));
        cookie += 1;
        bound = rebind || !bound;
        if post % 100 == 0 {
            window_refused(p, old, region.address(), &[region], 100_000 + post);
        }
    }
    if !bound {
        bind(p, rmr, lmr, 0, 64, cookie);
    }
    common::state_err(lmr.free(), Subtype::InvalidStateLmrInUse);
}

fn window_rebound_releases_its_lmr(p: Pair, rebind: bool) {
    let region_lmr = p.s.buf(64);
    let region = region_lmr.region().unwrap();
    let rmr = p.s.pz.rmr_create().unwrap();
    rebind_window(&p, &rmr, &region_lmr, &region, rebind);
    // Freeing the window releases the LMR: everything can be freed, and
    // the IA closed gracefully.
    rmr.free().unwrap();
    region_lmr.free().unwrap();
    p.psp.free().unwrap();
    p.s.ep.disconnect(false).unwrap();
    p.s.ep.free().unwrap();
    p.s.pz.free().unwrap();
    p.s.ia.close(CloseFlags::Graceful).unwrap();
}

#[case]
fn window_unbound_and_bound_again_and_again_releases_its_lmr() {
    if crate::support::skip_unless_placed() {
        return;
    }
    window_rebound_releases_its_lmr(pair("127.0.40.9", "127.0.40.10", 4009), false);
}

#[case]
fn window_rebound_again_and_again_releases_its_lmr() {
    if crate::support::skip_unless_placed() {
        return;
    }
    window_rebound_releases_its_lmr(pair("127.0.40.11", "127.0.40.12", 4011), true);
}

#[case]
fn fmr_remapped_again_and_again_unbinds_its_windows() {
    if crate::support::skip_unless_placed() {
        return;
    }
    // An FMR re-mapped more times than a key byte has values, a window
    // bound to each mapping: each re-map refuses the last window's key
    // (checked every 50 rounds), and nothing runs out.
    let p = pair("127.0.40.13", "127.0.40.14", 4013);
    let fmr = p.s.pz.lmr_create_fmr(64).unwrap();
    let region = Region::from_vec(vec![5; 64]);
    let rmr = p.s.pz.rmr_create().unwrap();
    let mut k = None;
    let mut cookie = 1;
    for round in 0..ROUNDS {
        p.s.ep
            .post_lmr_fmr(&fmr, region.clone(), MemPriv::ALL, cookie, D)
            .unwrap_or_else(|e| panic!("re-map {round}: {e:?}"));
        assert_eq!(next_dto(&p.s.req).status, DtoStatus::Success);
        cookie += 1;
        if let Some(old) = k
            && round % 50 == 0
        {
            window_refused(&p, old, region.address(), &[&region], 100_000 + round);
        }
        k = Some(bind(&p, &rmr, &fmr, 0, 64, cookie));
        cookie += 1;
    }
    // The FMR invalidated takes the last window with it.
    p.s.ep.post_lmr_invalidate(&fmr, cookie, D).unwrap();
    assert_eq!(next_dto(&p.s.req).status, DtoStatus::Success);
    window_refused(&p, k.unwrap(), region.address(), &[&region], 5000);
    rmr.free().unwrap();
    fmr.free().unwrap();
}
