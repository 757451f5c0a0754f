//! Regression tests of overflow on caller input found by an adversarial
//! test of the public API: lengths, offsets, addresses and durations that
//! do not fit are refused at post time (or taken as "forever"), never
//! wrapped, and never panic.
//!
//! Every test opens its IAs at its own address (`127.0.40.<m>`, `.41.<m>`)
//! and uses its own connection qualifiers, so the tests run in parallel.
//! Every wait has a timeout.

use crate::case;
use crate::support as common;

use common::{
    D, Inject, Node, Pair, conn_kind, cr_arrival, empty, establish, next_dto, pair, rt, state_err,
};
use rdapl::error::Subtype;
use rdapl::*;
use std::time::Duration;

/// Client RDMA write of `len` bytes of `src` to `remote`; its completion.
fn write(p: &Pair, src: &Lmr, len: u64, remote: RmrTriplet, cookie: u64) -> DtoCompletion {
    p.c.ep
        .post_rdma_write(&[src.triplet(0, len).unwrap()], remote, cookie, D)
        .unwrap();
    let d = next_dto(&p.c.req);
    assert_eq!((d.cookie, d.operation), (cookie, DtoOp::RdmaWrite));
    d
}

// ----- defect 10: overflow on caller input -----------------------------------

#[case]
fn triplet_offsets_past_the_address_space_are_refused() {
    let p = pair("127.0.40.15", "127.0.40.16", 4015);
    let lmr = p.c.buf(64);
    for (off, len) in [
        (u64::MAX, 1),
        (u64::MAX, 0),
        (1 << 63, 1 << 63),
        (0, u64::MAX),
    ] {
        assert!(
            matches!(lmr.triplet(off, len), Err(Error::Length(_))),
            "triplet({off:#x}, {len:#x})"
        );
        assert!(
            matches!(lmr.rmr_triplet(off, len), Err(Error::Length(_))),
            "rmr_triplet({off:#x}, {len:#x})"
        );
    }
    // Up to the end; one past it is refused at once.
    let end = lmr.triplet(64, 0).unwrap();
    assert_eq!(end.virtual_address, lmr.address().unwrap() + 64);
    let t = lmr.triplet(63, 1).unwrap();
    assert_eq!(
        (t.virtual_address, t.segment_length),
        (lmr.address().unwrap() + 63, 1)
    );
    assert!(matches!(lmr.triplet(64, 1), Err(Error::Length(_))));
    assert!(matches!(lmr.rmr_triplet(1, 64), Err(Error::Length(_))));
    let w = lmr.whole().unwrap();
    assert_eq!(
        (w.virtual_address, w.segment_length),
        (lmr.address().unwrap(), 64)
    );
    // A forged triplet at the top of the address space: refused at
    // execution as any range error, no panic.
    let forged = LmrTriplet {
        lmr_context: lmr.context().unwrap(),
        virtual_address: u64::MAX,
        segment_length: 1,
    };
    let tgt = p.s.buf(64);
    p.c.ep
        .post_rdma_write(&[forged], tgt.rmr_triplet(0, 1).unwrap(), 1, D)
        .unwrap();
    assert_eq!(next_dto(&p.c.req).status, DtoStatus::LocalProtection);
    p.expect_end(ConnectionEventKind::Broken);
    p.reconnect();
    // A remote triplet at the top of the address space: refused too.
    let src = p.c.lmr(vec![1; 2]);
    let rk = tgt.rmr_context().unwrap();
    assert_eq!(
        write(&p, &src, 2, rt(rk, u64::MAX, 2), 2).status,
        DtoStatus::RemoteAccess
    );
    p.expect_end(ConnectionEventKind::Broken);
}

/// Two segments whose lengths sum past `u64::MAX` (and each alone within
/// the address space).
fn overflowing_list(lmr: &Lmr) -> [LmrTriplet; 2] {
    let ctx = lmr.context().unwrap();
    let a = lmr.address().unwrap();
    [
        LmrTriplet {
            lmr_context: ctx,
            virtual_address: a,
            segment_length: 1 << 63,
        },
        LmrTriplet {
            lmr_context: ctx,
            virtual_address: a,
            segment_length: 1 << 63,
        },
    ]
}

#[case]
fn segment_sums_that_overflow_are_refused_at_post() {
    let p = pair("127.0.40.17", "127.0.40.18", 4017);
    let lmr = p.c.buf(64);
    let list = overflowing_list(&lmr);
    let tgt = p.s.buf(64);
    let remote = rt(tgt.rmr_context().unwrap(), tgt.address().unwrap(), u64::MAX);
    let length = |r: Result<()>, what: &str| {
        assert!(matches!(r, Err(Error::Length(_))), "{what}: {r:?}");
    };
    length(p.c.ep.post_rdma_write(&list, remote, 1, D), "rdma write");
    length(p.c.ep.post_rdma_read(&list, remote, 2, D), "rdma read");
    length(p.c.ep.post_send(&list, 3, D), "send");
    length(p.c.ep.post_recv(&list, 4, D), "recv");
    // One past the maximum, and a sum that wraps to a small number.
    let mut wrap = list;
    wrap[1].segment_length = (1 << 63) + 8;
    length(
        p.c.ep.post_rdma_write(&wrap, remote, 5, D),
        "wrapping write",
    );
    length(p.c.ep.post_send(&wrap, 6, D), "wrapping send");
    length(p.c.ep.post_recv(&wrap, 7, D), "wrapping recv");
    // Nothing was queued, and the connection is intact.
    empty(&p.c.req);
    empty(&p.c.rcv);
    assert_eq!(p.c.ep.state(), EpState::Connected);
    let src = p.c.lmr(vec![6; 8]);
    assert_eq!(
        write(&p, &src, 8, tgt.rmr_triplet(0, 8).unwrap(), 8).status,
        DtoStatus::Success
    );
}

#[case]
fn srq_segment_sums_that_overflow_are_refused_at_post() {
    let n = Node::new("127.0.40.19");
    let srq = n.ia.srq_create(&n.pz, 8, 4).unwrap();
    let lmr = n.buf(64);
    let r = srq.post_recv(&overflowing_list(&lmr), 1, D);
    assert!(matches!(r, Err(Error::Length(_))), "{r:?}");
    let mut one_past = [lmr.triplet(0, 64).unwrap()];
    one_past[0].segment_length = n.ia.query().unwrap().0.max_message_size + 1;
    let r = srq.post_recv(&one_past, 2, D);
    assert!(matches!(r, Err(Error::Length(_))), "{r:?}");
    assert_eq!(srq.query().unwrap().available, 0);
    srq.post_recv(&[lmr.triplet(0, 64).unwrap()], 3, D).unwrap();
    assert_eq!(srq.query().unwrap().available, 1);
}

#[case]
fn bind_ranges_that_overflow_are_refused() {
    let p = pair("127.0.40.20", "127.0.40.21", 4020);
    let lmr = p.s.buf(64);
    let rmr = p.s.pz.rmr_create().unwrap();
    let at = |addr: u64, len: u64| LmrTriplet {
        lmr_context: lmr.context().unwrap(),
        virtual_address: addr,
        segment_length: len,
    };
    let a = lmr.address().unwrap();
    for t in [
        at(u64::MAX, 1),
        at(a, u64::MAX),
        at(a + 1, u64::MAX),
        at(a, 65),
        at(a + 64, 1),
    ] {
        let r =
            p.s.ep
                .post_rmr_bind(&rmr, &lmr, t, MemPriv::REMOTE_WRITE, 1, D);
        assert!(
            matches!(r, Err(Error::InvalidParameter { .. })),
            "{t:?}: {r:?}"
        );
    }
    // Exactly up to the end is fine.
    let r =
        p.s.ep
            .post_rmr_bind(&rmr, &lmr, at(a + 63, 1), MemPriv::REMOTE_WRITE, 2, D);
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(next_dto(&p.s.req).status, DtoStatus::Success);
    rmr.free().unwrap();
    lmr.free().unwrap();
}

#[case]
fn fmr_of_the_largest_length_maps_and_binds() {
    let p = pair("127.0.40.22", "127.0.40.23", 4022);
    let fmr = p.s.pz.lmr_create_fmr(u64::MAX).unwrap();
    let region = Region::zeroed(64);
    p.s.ep
        .post_lmr_fmr(&fmr, region.clone(), MemPriv::ALL, 1, D)
        .unwrap();
    assert_eq!(next_dto(&p.s.req).status, DtoStatus::Success);
    let rmr = p.s.pz.rmr_create().unwrap();
    let k =
        p.s.ep
            .post_rmr_bind(
                &rmr,
                &fmr,
                fmr.triplet(0, 64).unwrap(),
                MemPriv::REMOTE_WRITE,
                2,
                D,
            )
            .unwrap();
    assert_eq!(next_dto(&p.s.req).status, DtoStatus::Success);
    let src = p.c.lmr(vec![1; 8]);
    assert_eq!(
        write(&p, &src, 8, rt(k, region.address() + 56, 8), 3).status,
        DtoStatus::Success
    );
    rmr.free().unwrap();
    fmr.free().unwrap();
}

// ----- overflow on caller durations -------------------------------------------

#[case]
fn connect_timeout_of_any_length_is_taken() {
    let s = Node::new("127.0.41.30");
    let c = Node::new("127.0.41.31");
    let _psp = s.ia.psp_create(4130, &s.cr).unwrap();
    // Too far to represent as an instant: as good as no timeout.
    c.ep.connect(s.ia.address(), 4130, Some(Duration::MAX), b"")
        .unwrap();
    let cr = s.ia.cr(cr_arrival(&s.cr).cr).unwrap();
    cr.accept(&s.ep, b"").unwrap();
    assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Established);
    assert_eq!(conn_kind(&c.conn), ConnectionEventKind::Established);
}

#[case]
fn injected_delay_of_any_length_is_taken() {
    let s = Node::new("127.0.41.32");
    let c = Node::new("127.0.41.33");
    let _psp = s.ia.psp_create(4132, &s.cr).unwrap();
    establish(&c, &s, 4132);
    let src = c.buf(8);
    let tgt = s.buf(8);
    c.ep.inject_delay(Some(Duration::MAX));
    c.ep.post_rdma_write(
        &[src.triplet(0, 8).unwrap()],
        tgt.rmr_triplet(0, 8).unwrap(),
        1,
        D,
    )
    .unwrap();
    c.ep.inject_delay(None);
    empty(&c.req);
    // It waits (practically forever); a disconnect flushes it.
    c.ep.disconnect(false).unwrap();
    let d = next_dto(&c.req);
    assert_eq!((d.cookie, d.status), (1, DtoStatus::Flushed));
    state_err(
        c.ep.post_send(&[src.triplet(0, 8).unwrap()], 2, D),
        Subtype::InvalidStateEpDisconnected,
    );
}
