//! Send with Invalidate (`dat_ep_post_send_with_invalidate`, RDMAP's Send
//! with Invalidate): the message lands, the receiver's window of the key
//! is unbound (the key grants nothing from then on) and its receive
//! completes as `ReceiveWithInvalidate` naming the key. A key the receiver
//! cannot invalidate (a plain LMR, another zone's, nothing) is refused
//! and the connection breaks. On every provider.

use crate::case;
use crate::support as common;

use common::{D, next_dto, pair};
use rdapl::*;

/// The server binds a window over `lmr`; returns it and its key.
fn window(p: &common::Pair, lmr: &Lmr, privs: MemPriv) -> (Rmr, u32) {
    let rmr = p.s.pz.rmr_create().unwrap();
    let k =
        p.s.ep
            .post_rmr_bind(&rmr, lmr, lmr.whole().unwrap(), privs, 90, D)
            .unwrap();
    let d = next_dto(&p.s.req);
    assert_eq!((d.cookie, d.status), (90, DtoStatus::Success));
    (rmr, k)
}

#[case]
fn the_key_goes_when_the_message_lands() {
    if crate::support::skip_unless_placed() {
        return;
    }
    let p = pair("127.0.64.1", "127.0.64.2", 6400);
    let target = p.s.buf(64);
    let (rmr, k) = window(&p, &target, MemPriv::REMOTE_WRITE);
    let t = rmr.triplet(0, 64).unwrap();
    // The window works.
    let src = p.c.lmr(vec![5; 64]);
    p.c.ep
        .post_rdma_write(&[src.triplet(0, 64).unwrap()], t, 1, D)
        .unwrap();
    assert_eq!(next_dto(&p.c.req).status, DtoStatus::Success);
    // The message and the invalidation.
    let rbuf = p.s.buf(16);
    p.s.recv(&rbuf, 0, 16, 2);
    let msg = p.c.lmr(b"invalidate it!!!".to_vec());
    p.c.ep
        .post_send_with_invalidate(&[msg.triplet(0, 16).unwrap()], k, 3, D)
        .unwrap();
    let d = next_dto(&p.c.req);
    assert_eq!(
        (d.cookie, d.status, d.operation),
        (3, DtoStatus::Success, DtoOp::Send)
    );
    let r = next_dto(&p.s.rcv);
    assert_eq!(
        (
            r.cookie,
            r.status,
            r.operation,
            r.rmr_context,
            r.transferred_length
        ),
        (2, DtoStatus::Success, DtoOp::ReceiveWithInvalidate, k, 16)
    );
    assert_eq!(rbuf.to_vec().unwrap(), b"invalidate it!!!");
    // The server's window is unbound now.
    assert!(rmr.triplet(0, 64).is_err(), "the window is unbound");
    // The old key moves nothing, and the connection breaks.
    let src2 = p.c.lmr(vec![9; 64]);
    p.c.ep
        .post_rdma_write(&[src2.triplet(0, 64).unwrap()], t, 4, D)
        .unwrap();
    assert_eq!(next_dto(&p.c.req).status, DtoStatus::RemoteAccess);
    p.expect_end(ConnectionEventKind::Broken);
    assert_eq!(target.to_vec().unwrap(), vec![5; 64], "not one byte moved");
}

#[case]
fn a_key_the_peer_cannot_invalidate_breaks_the_connection() {
    if crate::support::skip_unless_placed() {
        return;
    }
    let p = pair("127.0.64.3", "127.0.64.4", 6401);
    // A plain LMR's key.
    let plain = p.s.buf(64);
    let rbuf = p.s.buf(16);
    p.s.recv(&rbuf, 0, 16, 1);
    let msg = p.c.lmr(vec![7; 16]);
    p.c.ep
        .post_send_with_invalidate(
            &[msg.triplet(0, 16).unwrap()],
            plain.rmr_context().unwrap(),
            2,
            D,
        )
        .unwrap();
    let d = next_dto(&p.c.req);
    assert_eq!(d.cookie, 2);
    assert_ne!(d.status, DtoStatus::Success, "{d:?}");
    let r = next_dto(&p.s.rcv);
    assert_eq!(r.cookie, 1);
    assert_ne!(r.status, DtoStatus::Success, "{r:?}");
    p.expect_end(ConnectionEventKind::Broken);
    // The plain LMR still grants what it did.
    p.reconnect();
    let w = p.c.lmr(vec![3; 8]);
    p.c.ep
        .post_rdma_write(
            &[w.triplet(0, 8).unwrap()],
            plain.rmr_triplet(0, 8).unwrap(),
            3,
            D,
        )
        .unwrap();
    assert_eq!(next_dto(&p.c.req).status, DtoStatus::Success);
    // A key of nothing at all.
    p.s.recv(&rbuf, 0, 16, 4);
    p.c.ep
        .post_send_with_invalidate(&[msg.triplet(0, 16).unwrap()], 0xdead_be00, 5, D)
        .unwrap();
    assert_ne!(next_dto(&p.c.req).status, DtoStatus::Success);
    assert_ne!(next_dto(&p.s.rcv).status, DtoStatus::Success);
    p.expect_end(ConnectionEventKind::Broken);
}
