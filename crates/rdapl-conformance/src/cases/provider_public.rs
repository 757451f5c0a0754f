//! The test provider "pipe" (`crate::pipe`), written outside the core
//! crate with its public provider interface alone, every completion
//! asynchronous. The tests run the object model's flows on
//! it: connection management with private data, sends and receives, RDMA
//! writes and reads, protection errors, disconnect and free flushing
//! exactly once, with every byte checked.

use crate::case;
use crate::support as common;

use crate::pipe::Pipe;
use common::{D, Node, Pair, conn_ev, conn_kind, empty, flushed, ia_options, next_cr, next_dto};
use rdapl::*;
use std::sync::Arc;

// ----- the tests ----------------------------------------------------------------

fn node(pipe: &Arc<Pipe>, addr: &str) -> Node {
    let ia = Ia::open_provider(pipe.clone(), ia_options(addr)).unwrap();
    Node::of(ia, None, 64, 64)
}

fn pipe_pair(qual: u64) -> Pair {
    let pipe = Pipe::new();
    let p = Pair::new(node(&pipe, "127.0.90.1"), node(&pipe, "127.0.90.2"), qual);
    p.connect();
    p
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

#[case]
fn the_provider_is_named_and_opens_ias() {
    let pipe = Pipe::new();
    let ia = Ia::open_provider(pipe.clone(), ia_options("127.0.91.1")).unwrap();
    let (attr, pattr) = ia.query().unwrap();
    assert_eq!(pattr.name, "pipe");
    assert_eq!(attr.adapter_name, "pipe0");
    let reg = rdapl::with_builtin();
    reg.register(pipe).unwrap();
    assert_eq!(
        reg.names(),
        vec!["loopback".to_string(), "pipe".to_string()]
    );
    assert!(reg.open("pipe", ia_options("127.0.91.2")).is_ok());
}

#[case]
fn connect_accept_and_reject_carry_private_data() {
    let pipe = Pipe::new();
    let (c, s) = (node(&pipe, "127.0.92.1"), node(&pipe, "127.0.92.2"));
    let _psp = s.ia.psp_create(70, &s.cr).unwrap();
    c.ep.connect(s.ia.address(), 70, Some(common::T), b"hello")
        .unwrap();
    let cr = next_cr(&s.ia, &s.cr);
    assert_eq!(cr.private_data(), b"hello");
    assert_eq!(cr.remote_address(), c.ia.address());
    cr.reject(b"no").unwrap();
    let e = conn_ev(&c.conn);
    assert_eq!(e.kind, ConnectionEventKind::PeerRejected);
    assert_eq!(e.private_data.as_deref(), Some(&b"no"[..]));
    assert!(cr.accept(&s.ep, b"").is_err(), "a settled request");
    c.ep.reset().unwrap();
    c.ep.connect(s.ia.address(), 70, Some(common::T), b"again")
        .unwrap();
    next_cr(&s.ia, &s.cr).accept(&s.ep, b"welcome").unwrap();
    assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Established);
    let e = conn_ev(&c.conn);
    assert_eq!(e.kind, ConnectionEventKind::Established);
    assert_eq!(e.private_data.as_deref(), Some(&b"welcome"[..]));
    assert_eq!(
        c.ep.query().unwrap().peer_private_data.as_deref(),
        Some(&b"welcome"[..])
    );
    // Nobody listens on 71.
    let c2 = c.ep2();
    c2.connect(s.ia.address(), 71, Some(common::T), b"")
        .unwrap();
    assert_eq!(conn_kind(&c.conn), ConnectionEventKind::NonPeerRejected);
}

#[case]
fn sends_land_in_order_with_every_byte() {
    let p = pipe_pair(72);
    const N: u64 = 48;
    let rbuf = p.s.buf(64 * N as usize);
    let src =
        p.c.lmr((0..N as usize).flat_map(|i| pattern(64, i as u8)).collect());
    // Half the sends before their receives (they wait), half after.
    for i in 0..N / 2 {
        p.c.send(&src, i * 64, 64, i);
    }
    for i in 0..N {
        p.s.recv(&rbuf, i * 64, 64, 1000 + i);
    }
    for i in N / 2..N {
        p.c.send(&src, i * 64, 64, i);
    }
    for i in 0..N {
        let d = next_dto(&p.c.req);
        assert_eq!(
            (d.cookie, d.status, d.transferred_length),
            (i, DtoStatus::Success, 64)
        );
        let r = next_dto(&p.s.rcv);
        assert_eq!(
            (r.cookie, r.status, r.operation),
            (1000 + i, DtoStatus::Success, DtoOp::Receive)
        );
    }
    assert_eq!(rbuf.to_vec().unwrap(), src.to_vec().unwrap());
    empty(&p.c.req);
    empty(&p.s.rcv);
}

#[case]
fn rdma_write_and_read_move_exactly_the_range() {
    let p = pipe_pair(73);
    let target = p.s.lmr(pattern(256, 9));
    let before = target.to_vec().unwrap();
    let src = p.c.lmr(pattern(64, 1));
    let remote = target.rmr_triplet(32, 64).unwrap();
    p.c.ep
        .post_rdma_write(&[src.triplet(0, 64).unwrap()], remote, 1, D)
        .unwrap();
    let d = next_dto(&p.c.req);
    assert_eq!(
        (d.status, d.transferred_length, d.operation),
        (DtoStatus::Success, 64, DtoOp::RdmaWrite)
    );
    let after = target.to_vec().unwrap();
    assert_eq!(&after[32..96], &pattern(64, 1)[..]);
    assert_eq!(&after[..32], &before[..32]);
    assert_eq!(&after[96..], &before[96..]);
    let sink = p.c.buf(100);
    p.c.ep
        .post_rdma_read(
            &[sink.triplet(10, 80).unwrap()],
            target.rmr_triplet(100, 80).unwrap(),
            2,
            D,
        )
        .unwrap();
    let d = next_dto(&p.c.req);
    assert_eq!(
        (d.status, d.transferred_length, d.operation),
        (DtoStatus::Success, 80, DtoOp::RdmaRead)
    );
    let got = sink.to_vec().unwrap();
    assert_eq!(&got[10..90], &after[100..180]);
    assert!(got[..10].iter().chain(&got[90..]).all(|&b| b == 0));
}

#[case]
fn a_forged_key_moves_nothing_and_breaks_both_sides() {
    let p = pipe_pair(74);
    let target = p.s.lmr(vec![5; 64]);
    let rbuf = p.s.buf(16);
    p.s.recv(&rbuf, 0, 16, 9);
    let src = p.c.lmr(vec![1; 64]);
    let mut forged = target.rmr_triplet(0, 64).unwrap();
    forged.rmr_context ^= 0xFF;
    p.c.ep
        .post_rdma_write(&[src.triplet(0, 64).unwrap()], forged, 1, D)
        .unwrap();
    let d = next_dto(&p.c.req);
    assert_eq!(
        (d.status, d.transferred_length),
        (DtoStatus::RemoteAccess, 0)
    );
    p.expect_end(ConnectionEventKind::Broken);
    flushed(&p.s.rcv, &[9]);
    assert_eq!(target.to_vec().unwrap(), vec![5; 64]);
    // Out of range with the right key: refused too.
    p.reconnect();
    let past = common::rt(
        target.context().unwrap(),
        target.rmr_triplet(0, 1).unwrap().target_address + 60,
        8,
    );
    p.c.ep
        .post_rdma_write(&[src.triplet(0, 8).unwrap()], past, 2, D)
        .unwrap();
    assert_eq!(next_dto(&p.c.req).status, DtoStatus::RemoteAccess);
    p.expect_end(ConnectionEventKind::Broken);
    assert_eq!(target.to_vec().unwrap(), vec![5; 64]);
}

#[case]
fn disconnect_and_free_flush_everything_once_and_tell_the_peer() {
    let p = pipe_pair(75);
    let rbuf = p.s.buf(64);
    let cbuf = p.c.buf(64);
    for i in 0..4 {
        p.s.recv(&rbuf, i * 16, 16, 10 + i);
        p.c.recv(&cbuf, i * 16, 16, 20 + i);
    }
    p.c.ep.disconnect(true).unwrap();
    p.expect_end(ConnectionEventKind::Disconnected);
    flushed(&p.s.rcv, &[10, 11, 12, 13]);
    flushed(&p.c.rcv, &[20, 21, 22, 23]);
    empty(&p.s.rcv);
    empty(&p.c.rcv);
    // Freeing a connected endpoint reaches the provider: the peer is told.
    p.reconnect();
    p.s.recv(&rbuf, 0, 16, 30);
    p.c.ep.free().unwrap();
    assert_eq!(conn_kind(&p.s.conn), ConnectionEventKind::Disconnected);
    flushed(&p.s.rcv, &[30]);
    assert_eq!(p.s.ep.state(), EpState::Disconnected);
}

#[case]
fn a_message_in_segments_fills_a_scatter_list_in_order() {
    let p = pipe_pair(76);
    let rbuf = p.s.buf(64);
    // Three entries of 7, 3 and 13 bytes at scattered offsets.
    let list = [
        rbuf.triplet(40, 7).unwrap(),
        rbuf.triplet(0, 3).unwrap(),
        rbuf.triplet(20, 13).unwrap(),
    ];
    p.s.ep.post_recv(&list, 1, D).unwrap();
    let msg = pattern(23, 3);
    let src = p.c.lmr(msg.clone());
    p.c.send(&src, 0, 23, 2);
    let r = next_dto(&p.s.rcv);
    assert_eq!((r.status, r.transferred_length), (DtoStatus::Success, 23));
    assert_eq!(next_dto(&p.c.req).status, DtoStatus::Success);
    let got = rbuf.to_vec().unwrap();
    assert_eq!(&got[40..47], &msg[..7]);
    assert_eq!(&got[0..3], &msg[7..10]);
    assert_eq!(&got[20..33], &msg[10..]);
    // One byte too many for the list: LocalLength, nothing breaks silently.
    p.s.ep.post_recv(&list, 3, D).unwrap();
    let big = p.c.lmr(pattern(24, 4));
    p.c.send(&big, 0, 24, 4);
    assert_eq!(next_dto(&p.s.rcv).status, DtoStatus::LocalLength);
    assert_eq!(next_dto(&p.c.req).status, DtoStatus::RemoteResponder);
    p.expect_end(ConnectionEventKind::Broken);
}
