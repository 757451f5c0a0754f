//! What a zero-length RDMA request checks: the decision stated in the
//! loopback provider's module docs, tested through the public API.
//!
//! The test opens its IAs at its own address (`127.0.40.<m>`) and uses its
//! own connection qualifier. Every wait has a timeout.

use crate::case;
use crate::support as common;

use common::{D, Pair, next_dto, pair, rt};
use rdapl::*;

/// Client RDMA write of `len` bytes of `src` to `remote`; its completion.
fn write(p: &Pair, src: &Lmr, len: u64, remote: RmrTriplet, cookie: u64) -> DtoCompletion {
    p.c.ep
        .post_rdma_write(&[src.triplet(0, len).unwrap()], remote, cookie, D)
        .unwrap();
    let d = next_dto(&p.c.req);
    assert_eq!((d.cookie, d.operation), (cookie, DtoOp::RdmaWrite));
    d
}

#[case]
fn zero_length_rdma_succeeds_without_checking_keys() {
    if crate::support::skip_unless_placed() {
        return;
    }
    // The decision (see the loopback module docs): as on InfiniBand and
    // iWARP, a zero-length RDMA write or read moves nothing and its remote
    // key is not checked; neither are the keys of zero-length local
    // segments. No byte is reachable through it.
    let p = pair("127.0.40.24", "127.0.40.25", 4024);
    let tgt = p.s.lmr(vec![3; 64]);
    let forged = rt(0xDEAD_BEEF, 0x1000, 64);
    let local = p.c.lmr(vec![8; 64]);
    let zero_local = [LmrTriplet {
        lmr_context: 0xBAD0_BAD0,
        virtual_address: 0,
        segment_length: 0,
    }];
    for (i, iov) in [
        &[][..],
        &zero_local[..],
        &[local.triplet(0, 0).unwrap()][..],
    ]
    .into_iter()
    .enumerate()
    {
        let cookie = 10 * i as u64;
        p.c.ep.post_rdma_write(iov, forged, cookie, D).unwrap();
        let d = next_dto(&p.c.req);
        assert_eq!(
            (d.cookie, d.status, d.transferred_length),
            (cookie, DtoStatus::Success, 0)
        );
        p.c.ep.post_rdma_read(iov, forged, cookie + 1, D).unwrap();
        let d = next_dto(&p.c.req);
        assert_eq!(
            (d.cookie, d.status, d.transferred_length),
            (cookie + 1, DtoStatus::Success, 0)
        );
    }
    assert_eq!(p.c.ep.state(), EpState::Connected);
    assert_eq!(tgt.to_vec().unwrap(), vec![3; 64]);
    assert_eq!(local.to_vec().unwrap(), vec![8; 64]);
    // One byte with the same forged key is refused.
    let d = write(&p, &local, 1, forged, 99);
    assert_eq!(d.status, DtoStatus::RemoteAccess);
    p.expect_end(ConnectionEventKind::Broken);
}
