//! The object API a C ABI and a Rust programmer need beyond DAT's calls:
//! handles of every object, a consumer context on every object, and a
//! window's own triplet.

use crate::case;
use crate::support as common;

use common::{D, next_dto, pair};
use rdapl::*;
use std::collections::HashSet;

type Set<'a> = Box<dyn Fn(u64) + 'a>;
type Get<'a> = Box<dyn Fn() -> u64 + 'a>;

/// Every object keeps the consumer context it was given, independently of
/// every other object; a new object's context is 0.
#[case]
fn every_object_keeps_its_consumer_context() {
    let p = pair("127.0.60.1", "127.0.60.2", 60);
    let pz = p.c.pz.clone();
    let lmr = p.c.buf(64);
    let rmr = pz.rmr_create().unwrap();
    let srq = p.c.ia.srq_create(&pz, 4, 1).unwrap();
    let cno = Cno::new();
    let psp = p.s.ia.psp_create(61, &p.s.cr).unwrap();
    let rsp_ep = p.s.ep2();
    let rsp = p.s.ia.rsp_create(62, &rsp_ep, &p.s.cr).unwrap();
    let sets: Vec<(&str, Set, Get)> = vec![
        (
            "ia",
            Box::new(|v| p.c.ia.set_consumer_context(v)),
            Box::new(|| p.c.ia.consumer_context()),
        ),
        (
            "pz",
            Box::new(|v| pz.set_consumer_context(v)),
            Box::new(|| pz.consumer_context()),
        ),
        (
            "lmr",
            Box::new(|v| lmr.set_consumer_context(v)),
            Box::new(|| lmr.consumer_context()),
        ),
        (
            "rmr",
            Box::new(|v| rmr.set_consumer_context(v)),
            Box::new(|| rmr.consumer_context()),
        ),
        (
            "ep",
            Box::new(|v| p.c.ep.set_consumer_context(v)),
            Box::new(|| p.c.ep.consumer_context()),
        ),
        (
            "evd",
            Box::new(|v| p.c.req.set_consumer_context(v)),
            Box::new(|| p.c.req.consumer_context()),
        ),
        (
            "srq",
            Box::new(|v| srq.set_consumer_context(v)),
            Box::new(|| srq.consumer_context()),
        ),
        (
            "cno",
            Box::new(|v| cno.set_consumer_context(v)),
            Box::new(|| cno.consumer_context()),
        ),
        (
            "psp",
            Box::new(|v| psp.set_consumer_context(v)),
            Box::new(|| psp.consumer_context()),
        ),
        (
            "rsp",
            Box::new(|v| rsp.set_consumer_context(v)),
            Box::new(|| rsp.consumer_context()),
        ),
    ];
    for (name, _, get) in &sets {
        assert_eq!(get(), 0, "{name}: a new object's context is 0");
    }
    for (i, (_, set, _)) in sets.iter().enumerate() {
        set(0xC0DE_0000 + i as u64);
    }
    for (i, (name, _, get)) in sets.iter().enumerate() {
        assert_eq!(get(), 0xC0DE_0000 + i as u64, "{name}");
    }
    // A clone is the same object.
    assert_eq!(p.c.ep.clone().consumer_context(), 0xC0DE_0004);
    p.c.ep.set_consumer_context(u64::MAX);
    assert_eq!(p.c.ep.consumer_context(), u64::MAX);
}

/// LMRs and RMRs have handles that are distinct and stay the same across
/// the key changes of binds.
#[case]
fn lmr_and_rmr_handles_are_distinct_and_stable() {
    let p = pair("127.0.60.3", "127.0.60.4", 63);
    let lmrs: Vec<Lmr> = (0..4).map(|_| p.s.buf(64)).collect();
    let rmrs: Vec<Rmr> = (0..4).map(|_| p.s.pz.rmr_create().unwrap()).collect();
    let lh: HashSet<_> = lmrs.iter().map(|l| l.handle()).collect();
    let rh: HashSet<_> = rmrs.iter().map(|r| r.handle()).collect();
    assert_eq!((lh.len(), rh.len()), (4, 4));
    let before = rmrs[0].handle();
    let k0 = rmrs[0].context().unwrap();
    let k1 =
        p.s.ep
            .post_rmr_bind(
                &rmrs[0],
                &lmrs[0],
                lmrs[0].triplet(0, 64).unwrap(),
                MemPriv::REMOTE_WRITE,
                1,
                D,
            )
            .unwrap();
    assert_ne!(k0, k1, "a bind changes the key");
    assert_eq!(rmrs[0].handle(), before, "not the handle");
}

/// `Rmr::triplet` names a range of the bound window: refused while
/// unbound and past the window's end; usable by a peer's RDMA write.
#[case]
fn a_windows_triplet_reaches_its_range_only() {
    if crate::support::skip_unless_placed() {
        return;
    }
    let p = pair("127.0.60.5", "127.0.60.6", 64);
    let lmr = p.s.buf(64);
    let rmr = p.s.pz.rmr_create().unwrap();
    assert!(matches!(rmr.triplet(0, 1), Err(Error::InvalidState { .. })));
    p.s.ep
        .post_rmr_bind(
            &rmr,
            &lmr,
            lmr.triplet(16, 32).unwrap(),
            MemPriv::REMOTE_WRITE,
            1,
            D,
        )
        .unwrap();
    assert_eq!(next_dto(&p.s.req).status, DtoStatus::Success);
    let t = rmr.triplet(8, 8).unwrap();
    assert_eq!(t.rmr_context, rmr.context().unwrap());
    assert_eq!(
        t.target_address,
        lmr.triplet(24, 8).unwrap().virtual_address
    );
    assert_eq!(t.segment_length, 8);
    assert!(rmr.triplet(0, 32).is_ok());
    for (off, len) in [(0, 33), (32, 1), (u64::MAX, 2), (1, u64::MAX)] {
        assert!(
            matches!(rmr.triplet(off, len), Err(Error::Length(_))),
            "({off}, {len})"
        );
    }
    let src = p.c.lmr(vec![7; 8]);
    p.c.ep
        .post_rdma_write(&[src.triplet(0, 8).unwrap()], t, 2, D)
        .unwrap();
    assert_eq!(next_dto(&p.c.req).status, DtoStatus::Success);
    let bytes = lmr.to_vec().unwrap();
    assert_eq!(&bytes[24..32], &[7; 8]);
    assert!(bytes[..24].iter().chain(&bytes[32..]).all(|&b| b == 0));
}
