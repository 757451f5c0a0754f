//! Send with Invalidate (`dat_ep_post_send_with_invalidate`, RDMAP's Send
//! with Invalidate): the message lands, the receiver's window of the key
//! is unbound (the key grants nothing from then on) and its receive
//! completes as `ReceiveWithInvalidate` naming the key. A key the receiver
//! cannot invalidate (a plain LMR, another zone's, nothing) is refused
//! and the connection breaks. A storage target's whole exchange (register,
//! send the keys, read and write through them, answer with an
//! invalidation) posted as batches. On every provider.

use crate::case;
use crate::support as common;

use common::{D, next_dto, pair, rt};
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

/// A storage target's exchange, each side's posts one batch
/// (`Ep::post_batch`): the client maps a fast-registration LMR, binds a
/// window and sends both keys in one batch; the server reads through the
/// mapping, writes through the window and answers with a Send that
/// invalidates the mapping, fenced behind its Read, in one batch. The
/// client's receive names the key, which grants nothing from then on; a
/// last batch unbinds the window and maps the LMR again.
#[case]
fn a_batch_registers_sends_the_keys_and_the_peer_invalidates() {
    let p = pair("127.0.64.5", "127.0.64.6", 6402);
    let data: Vec<u8> = (0..256u32).map(|i| (i * 7 + 3) as u8).collect();
    let fmr = p.c.pz.lmr_create_fmr(256).unwrap();
    let region = Region::from_vec(data.clone());
    let sink = p.c.buf(64);
    let rmr = p.c.pz.rmr_create().unwrap();
    let msg = p.c.buf(24);
    let ans = p.c.buf(8);
    p.c.recv(&ans, 0, 8, 200);
    let rbuf = p.s.buf(24);
    p.s.recv(&rbuf, 0, 24, 100);
    let (k, w) =
        p.c.ep
            .post_batch(|b| {
                let k = b.post_lmr_fmr(&fmr, region.clone(), MemPriv::ALL, 1, D)?;
                let w = b.post_rmr_bind(&rmr, &sink, sink.whole()?, MemPriv::REMOTE_WRITE, 2, D)?;
                let mut m = Vec::with_capacity(24);
                m.extend_from_slice(&k.to_le_bytes());
                m.extend_from_slice(&w.to_le_bytes());
                m.extend_from_slice(&region.address().to_le_bytes());
                m.extend_from_slice(&sink.address()?.to_le_bytes());
                msg.write_at(0, &m)?;
                b.post_send(&[msg.whole()?], 3, D)?;
                assert_eq!(b.len(), 3);
                Ok::<_, Error>((k, w))
            })
            .unwrap();
    let ops = [DtoOp::LmrFmr, DtoOp::BindMw, DtoOp::Send];
    for (i, op) in ops.into_iter().enumerate() {
        let d = next_dto(&p.c.req);
        assert_eq!(
            (d.cookie, d.operation, d.status),
            (i as u64 + 1, op, DtoStatus::Success)
        );
    }
    // The server takes the keys from the message.
    let r = next_dto(&p.s.rcv);
    assert_eq!(
        (r.cookie, r.status, r.transferred_length),
        (100, DtoStatus::Success, 24)
    );
    let m = rbuf.to_vec().unwrap();
    let u32_at = |o: usize| u32::from_le_bytes(m[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(m[o..o + 8].try_into().unwrap());
    assert_eq!((u32_at(0), u32_at(4)), (k, w));
    let (at, sink_at) = (u64_at(8), u64_at(16));
    let dst = p.s.buf(256);
    let src = p.s.lmr(vec![0xA5; 64]);
    let note = p.s.lmr(b"done ok!".to_vec());
    p.s.ep
        .post_batch(|b| {
            b.post_rdma_read(&[dst.whole()?], rt(k, at, 256), 10, D)?;
            b.post_rdma_write(&[src.whole()?], rt(w, sink_at, 64), 11, D)?;
            b.post_send_with_invalidate(&[note.whole()?], k, 12, D | CompletionFlags::BARRIER_FENCE)
        })
        .unwrap();
    let ops = [DtoOp::RdmaRead, DtoOp::RdmaWrite, DtoOp::Send];
    for (i, op) in ops.into_iter().enumerate() {
        let d = next_dto(&p.s.req);
        assert_eq!(
            (d.cookie, d.operation, d.status),
            (i as u64 + 10, op, DtoStatus::Success)
        );
    }
    assert_eq!(dst.to_vec().unwrap(), data, "the Read saw the mapping");
    // The client's receive names the key; the Write came before it.
    let r = next_dto(&p.c.rcv);
    assert_eq!(
        (
            r.cookie,
            r.status,
            r.operation,
            r.rmr_context,
            r.transferred_length
        ),
        (200, DtoStatus::Success, DtoOp::ReceiveWithInvalidate, k, 8)
    );
    assert_eq!(ans.to_vec().unwrap(), b"done ok!");
    assert_eq!(sink.to_vec().unwrap(), vec![0xA5; 64]);
    // The client's last batch: the window goes, the LMR is mapped again
    // (a new key), and invalidated by the client itself.
    let (gone, k2, k3) =
        p.c.ep
            .post_batch(|b| {
                let gone = b.post_rmr_unbind(&rmr, 20, D)?;
                let k2 = b.post_lmr_fmr(&fmr, region.clone(), MemPriv::ALL, 21, D)?;
                let k3 = b.post_lmr_invalidate(&fmr, 22, D)?;
                Ok::<_, Error>((gone, k2, k3))
            })
            .unwrap();
    assert!(gone != w && k2 != k && k3 != k2, "new keys");
    let ops = [DtoOp::BindMw, DtoOp::LmrFmr, DtoOp::LmrInvalidate];
    for (i, op) in ops.into_iter().enumerate() {
        let d = next_dto(&p.c.req);
        assert_eq!(
            (d.cookie, d.operation, d.status),
            (i as u64 + 20, op, DtoStatus::Success)
        );
    }
    assert!(rmr.triplet(0, 64).is_err(), "the window is unbound");
    // The invalidated key moves nothing, and the connection breaks.
    let d2 = p.s.buf(256);
    p.s.ep
        .post_rdma_read(&[d2.whole().unwrap()], rt(k, at, 256), 13, D)
        .unwrap();
    assert_eq!(next_dto(&p.s.req).status, DtoStatus::RemoteAccess);
    p.expect_end(ConnectionEventKind::Broken);
    assert_eq!(d2.to_vec().unwrap(), vec![0; 256], "not one byte moved");
}
