//! Model tests of the endpoint state machine and connection management on
//! the loopback provider (public API only): connect / accept / reject,
//! timeouts, reserved service points, disconnect and flush, reset, free,
//! connection qualifiers.
//!
//! Every test uses its own IA addresses (`127.0.22.<m>`) and qualifiers, so
//! the tests run in parallel; every wait has a timeout.

use crate::case;
use crate::support as common;

use common::{
    D, Inject, Node, T, conn_ev, conn_kind, cr_arrival, empty, establish, handle_err, ip,
    listening, next, next_cr, next_dto, open, state_err,
};
use rdapl::error::Subtype;
use rdapl::*;
use std::time::{Duration, Instant};

#[case]
fn posting_on_an_unconnected_endpoint() {
    let n = Node::new("127.0.22.1");
    let b = n.buf(16);
    let t = b.triplet(0, 16).unwrap();
    let r = b.rmr_triplet(0, 16).unwrap();
    assert_eq!(n.ep.state(), EpState::Unconnected);
    state_err(
        n.ep.post_send(&[t], 1, D),
        Subtype::InvalidStateEpUnconnected,
    );
    state_err(
        n.ep.post_rdma_write(&[t], r, 2, D),
        Subtype::InvalidStateEpUnconnected,
    );
    state_err(
        n.ep.post_rdma_read(&[t], r, 3, D),
        Subtype::InvalidStateEpUnconnected,
    );
    state_err(n.ep.disconnect(true), Subtype::InvalidStateEpUnconnected);
    // A receive may be posted before the connection exists.
    n.ep.post_recv(&[t], 4, D).unwrap();
    let q = n.ep.query().unwrap();
    assert_eq!(q.state, EpState::Unconnected);
    assert_eq!(q.outstanding, (0, 1));
    assert_eq!(q.remote, None);
    empty(&n.rcv);
    empty(&n.req);
    // Free flushes it.
    n.ep.free().unwrap();
    let d = next_dto(&n.rcv);
    assert_eq!(
        (d.cookie, d.status, d.operation),
        (4, DtoStatus::Flushed, DtoOp::Receive)
    );

    // An endpoint without a request (receive, connection) EVD cannot use it.
    let bare = n.ia.ep_create(&n.pz, None, None, None, None).unwrap();
    state_err(bare.post_recv(&[t], 5, D), Subtype::InvalidStateEpEvdRecv);
    state_err(
        bare.post_send(&[t], 5, D),
        Subtype::InvalidStateEpEvdRequest,
    );
    state_err(
        bare.connect(ip("127.0.22.2"), 1, Some(T), b""),
        Subtype::InvalidStateEpEvdConnect,
    );
    assert_eq!(bare.state(), EpState::Unconnected);
}

#[case]
fn connect_twice_is_refused() {
    let (c, s, _psp) = listening("127.0.22.3", "127.0.22.4", 300);
    c.ep.connect(s.ia.address(), 300, Some(T), b"one").unwrap();
    assert_eq!(c.ep.state(), EpState::ActiveConnectionPending);
    state_err(
        c.ep.connect(s.ia.address(), 300, Some(T), b"two"),
        Subtype::InvalidStateEpActconnpending,
    );
    // Still only one request arrived.
    let a = cr_arrival(&s.cr);
    let cr = s.ia.cr(a.cr).unwrap();
    assert_eq!(cr.private_data(), b"one");
    empty(&s.cr);
    // Posting on a pending endpoint is refused too.
    let b = c.buf(8);
    state_err(
        c.ep.post_send(&[b.triplet(0, 8).unwrap()], 1, D),
        Subtype::InvalidStateEpActconnpending,
    );
    cr.accept(&s.ep, b"").unwrap();
    assert_eq!(conn_kind(&c.conn), ConnectionEventKind::Established);
    assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Established);
    state_err(
        c.ep.connect(s.ia.address(), 300, Some(T), b""),
        Subtype::InvalidStateEpConnected,
    );
    assert_eq!(c.ep.state(), EpState::Connected);
    empty(&s.cr);
    empty(&c.conn);
}

#[case]
fn accept_twice_is_refused() {
    let (c, s, _psp) = listening("127.0.22.5", "127.0.22.6", 500);
    c.ep.connect(s.ia.address(), 500, Some(T), b"hi").unwrap();
    let a = cr_arrival(&s.cr);
    assert_eq!(a.conn_qual, 500);
    assert_eq!(a.sp, Some(_psp.handle()));
    let cr = s.ia.cr(a.cr).unwrap();
    assert_eq!(cr.handle(), a.cr);
    assert_eq!(cr.conn_qual(), 500);
    assert_eq!(cr.remote_address(), c.ia.address());
    assert_eq!(cr.state(), CrState::Pending);
    cr.accept(&s.ep, b"ok").unwrap();
    assert_eq!(cr.state(), CrState::Accepted);
    let ev = conn_ev(&c.conn);
    assert_eq!(ev.kind, ConnectionEventKind::Established);
    assert_eq!(ev.private_data.as_deref(), Some(&b"ok"[..]));
    assert_eq!(
        c.ep.query().unwrap().peer_private_data.as_deref(),
        Some(&b"ok"[..])
    );
    assert_eq!(c.ep.query().unwrap().remote, Some((s.ia.address(), 500)));
    assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Established);

    // Same CR again: on the same endpoint and on a fresh one.
    handle_err(cr.accept(&s.ep, b""), Subtype::InvalidHandleCr);
    let spare = s.ep2();
    handle_err(cr.accept(&spare, b""), Subtype::InvalidHandleCr);
    assert_eq!(spare.state(), EpState::Unconnected);
    handle_err(cr.reject(b""), Subtype::InvalidHandleCr);
    // The request is gone from the IA.
    handle_err(s.ia.cr(a.cr), Subtype::InvalidHandleCr);
    // A new request cannot be accepted on an endpoint that is connected.
    let c2 = Node::new("127.0.22.7");
    c2.ep.connect(s.ia.address(), 500, Some(T), b"").unwrap();
    let cr2 = next_cr(&s.ia, &s.cr);
    state_err(cr2.accept(&s.ep, b""), Subtype::InvalidStateEpConnected);
    assert_eq!(cr2.state(), CrState::Pending);
    cr2.accept(&spare, b"").unwrap();
    assert_eq!(conn_kind(&c2.conn), ConnectionEventKind::Established);
    assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Established);
    empty(&c.conn);
}

#[case]
fn reject_then_accept() {
    let (c, s, _psp) = listening("127.0.22.8", "127.0.22.9", 800);
    c.ep.connect(s.ia.address(), 800, Some(T), b"please")
        .unwrap();
    let cr = next_cr(&s.ia, &s.cr);
    cr.reject(b"no thanks").unwrap();
    assert_eq!(cr.state(), CrState::Rejected);
    let ev = conn_ev(&c.conn);
    assert_eq!(ev.kind, ConnectionEventKind::PeerRejected);
    assert_eq!(ev.ep, c.ep.handle());
    assert_eq!(ev.private_data.as_deref(), Some(&b"no thanks"[..]));
    assert_eq!(c.ep.state(), EpState::Disconnected);

    handle_err(cr.accept(&s.ep, b""), Subtype::InvalidHandleCr);
    handle_err(cr.reject(b""), Subtype::InvalidHandleCr);
    assert_eq!(s.ep.state(), EpState::Unconnected);
    empty(&s.conn);
    empty(&c.conn);
    // The client may try again after a reset.
    c.ep.reset().unwrap();
    establish(&c, &s, 800);
}

#[case]
fn connect_without_listener_or_ia() {
    let c = Node::new("127.0.22.10");
    let s = Node::new("127.0.22.11");
    // An IA at the address, nobody on the qualifier.
    c.ep.connect(s.ia.address(), 1000, Some(T), b"").unwrap();
    assert_eq!(conn_kind(&c.conn), ConnectionEventKind::NonPeerRejected);
    assert_eq!(c.ep.state(), EpState::Disconnected);
    empty(&s.cr);
    // No IA at all at the address.
    c.ep.reset().unwrap();
    c.ep.connect(ip("127.0.22.250"), 1000, Some(T), b"")
        .unwrap();
    let k = conn_kind(&c.conn);
    assert!(common::no_ia_kind(k), "{k:?}");
    assert_eq!(c.ep.state(), EpState::Disconnected);
    // A listener that was freed is gone too.
    let psp = s.ia.psp_create(1001, &s.cr).unwrap();
    psp.free().unwrap();
    c.ep.reset().unwrap();
    c.ep.connect(s.ia.address(), 1001, Some(T), b"").unwrap();
    assert_eq!(conn_kind(&c.conn), ConnectionEventKind::NonPeerRejected);
    empty(&s.cr);
    empty(&c.conn);
}

#[case]
fn connect_timeout_then_late_accept_fails() {
    let (c, s, _psp) = listening("127.0.22.12", "127.0.22.13", 1200);
    let t0 = Instant::now();
    c.ep.connect(s.ia.address(), 1200, Some(Duration::from_millis(100)), b"")
        .unwrap();
    // The server sees the request but never answers.
    let a = cr_arrival(&s.cr);
    let cr = s.ia.cr(a.cr).unwrap();
    assert_eq!(conn_kind(&c.conn), ConnectionEventKind::TimedOut);
    assert!(
        t0.elapsed() >= Duration::from_millis(90),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(c.ep.state(), EpState::Disconnected);
    assert!(common::withdrawn(&cr), "{:?}", cr.state());
    // Accepting now fails and leaves the server endpoint untouched.
    handle_err(cr.accept(&s.ep, b""), Subtype::InvalidHandleCr);
    assert_eq!(s.ep.state(), EpState::Unconnected);
    assert!(s.ia.cr(a.cr).is_err());
    empty(&s.conn);
    empty(&c.conn);
    // The PSP still serves new requests.
    c.ep.reset().unwrap();
    establish(&c, &s, 1200);
}

#[case]
fn disconnect_aborts_a_pending_connect() {
    let (c, s, _psp) = listening("127.0.22.14", "127.0.22.15", 1400);
    c.ep.connect(s.ia.address(), 1400, None, b"").unwrap();
    let cr = next_cr(&s.ia, &s.cr);
    c.ep.disconnect(false).unwrap();
    assert_eq!(conn_kind(&c.conn), ConnectionEventKind::Disconnected);
    assert_eq!(c.ep.state(), EpState::Disconnected);
    assert!(common::withdrawn(&cr), "{:?}", cr.state());
    assert!(cr.accept(&s.ep, b"").is_err());
    assert_eq!(s.ep.state(), EpState::Unconnected);
    empty(&s.conn);
}

#[case]
fn rsp_serves_one_request() {
    let s = Node::new("127.0.22.16");
    let c = Node::new("127.0.22.17");
    let c2 = Node::new("127.0.22.18");
    // An RSP needs an unconnected endpoint; it reserves it.
    let rsp = s.ia.rsp_create(1600, &s.ep, &s.cr).unwrap();
    assert_eq!(s.ep.state(), EpState::Reserved);
    state_err(
        s.ia.rsp_create(1601, &s.ep, &s.cr).map(drop),
        Subtype::InvalidStateEpReserved,
    );
    // A reserved endpoint cannot connect.
    state_err(
        s.ep.connect(c.ia.address(), 1, Some(T), b""),
        Subtype::InvalidStateEpReserved,
    );
    // The qualifier is taken.
    assert!(matches!(
        s.ia.psp_create(1600, &s.cr),
        Err(Error::ConnQualInUse(1600))
    ));

    c.ep.connect(s.ia.address(), 1600, Some(T), b"rsp").unwrap();
    let a = cr_arrival(&s.cr);
    assert_eq!(a.sp, None, "an RSP's request names no PSP");
    assert_eq!(a.conn_qual, 1600);
    assert_eq!(s.ep.state(), EpState::TentativeConnectionPending);
    let cr = s.ia.cr(a.cr).unwrap();
    assert_eq!(cr.private_data(), b"rsp");

    // The RSP is consumed: a second request finds no listener.
    c2.ep.connect(s.ia.address(), 1600, Some(T), b"").unwrap();
    assert_eq!(conn_kind(&c2.conn), ConnectionEventKind::NonPeerRejected);
    empty(&s.cr);

    cr.accept(&s.ep, b"").unwrap();
    assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Established);
    assert_eq!(conn_kind(&c.conn), ConnectionEventKind::Established);
    assert_eq!(s.ep.state(), EpState::Connected);
    // The qualifier is free again.
    let psp = s.ia.psp_create(1600, &s.cr).unwrap();
    psp.free().unwrap();
    drop(rsp);

    // An RSP freed before use returns its endpoint to Unconnected.
    let ep = s.ep2();
    let rsp2 = s.ia.rsp_create(1602, &ep, &s.cr).unwrap();
    rsp2.free().unwrap();
    assert_eq!(ep.state(), EpState::Unconnected);
    handle_err(rsp2.free(), Subtype::InvalidHandleRsp);
    c2.ep.reset().unwrap();
    c2.ep.connect(s.ia.address(), 1602, Some(T), b"").unwrap();
    assert_eq!(conn_kind(&c2.conn), ConnectionEventKind::NonPeerRejected);
    // A connected endpoint cannot be reserved.
    state_err(
        s.ia.rsp_create(1603, &s.ep, &s.cr).map(drop),
        Subtype::InvalidStateEpConnected,
    );
}

#[case]
fn rsp_reject_returns_endpoint() {
    let s = Node::new("127.0.22.19");
    let c = Node::new("127.0.22.20");
    let _rsp = s.ia.rsp_create(1900, &s.ep, &s.cr).unwrap();
    c.ep.connect(s.ia.address(), 1900, Some(T), b"").unwrap();
    let cr = next_cr(&s.ia, &s.cr);
    cr.reject(b"busy").unwrap();
    let ev = conn_ev(&c.conn);
    assert_eq!(ev.kind, ConnectionEventKind::PeerRejected);
    assert_eq!(ev.private_data.as_deref(), Some(&b"busy"[..]));
    assert_eq!(s.ep.state(), EpState::Unconnected);
}

#[case]
fn disconnect_flushes_both_sides() {
    let (c, s, _psp) = listening("127.0.22.21", "127.0.22.22", 2100);
    establish(&c, &s, 2100);
    let cb = c.buf(64);
    let sb = s.buf(64);
    // Server: two receives. Client: two delayed sends (they would match the
    // receives only after 2 s) and a receive. Server: a delayed RDMA write.
    s.recv(&sb, 0, 32, 10);
    s.recv(&sb, 32, 32, 11);
    c.ep.inject_delay(Some(Duration::from_secs(2)));
    c.send(&cb, 0, 8, 20);
    c.send(&cb, 8, 8, 21);
    c.recv(&cb, 32, 32, 22);
    s.ep.inject_delay(Some(Duration::from_secs(2)));
    s.ep.post_rdma_write(
        &[sb.triplet(0, 8).unwrap()],
        cb.rmr_triplet(0, 8).unwrap(),
        12,
        D,
    )
    .unwrap();
    // (The delayed requests wait in the fault injector; they are
    // outstanding all the same.)
    assert_eq!(c.ep.query().unwrap().outstanding, (2, 1));
    assert_eq!(s.ep.query().unwrap().outstanding, (1, 2));
    assert!(common::faults().holds(&c.ep) && common::faults().holds(&s.ep));
    empty(&c.req);
    empty(&s.rcv);

    c.ep.disconnect(true).unwrap();
    assert_eq!(conn_kind(&c.conn), ConnectionEventKind::Disconnected);
    assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Disconnected);
    let flushed = |evd: &Evd, cookies: &[u64]| {
        for &k in cookies {
            let d = next_dto(evd);
            assert_eq!((d.cookie, d.status), (k, DtoStatus::Flushed));
            assert_eq!(d.transferred_length, 0);
        }
        empty(evd);
    };
    flushed(&c.req, &[20, 21]);
    flushed(&c.rcv, &[22]);
    flushed(&s.req, &[12]);
    flushed(&s.rcv, &[10, 11]);
    assert_eq!(c.ep.state(), EpState::Disconnected);
    assert_eq!(s.ep.state(), EpState::Disconnected);
    assert_eq!(c.ep.query().unwrap().outstanding, (0, 0));
    assert_eq!(s.ep.query().unwrap().outstanding, (0, 0));
    assert!(!common::faults().holds(&c.ep) && !common::faults().holds(&s.ep));
    assert_eq!(sb.to_vec().unwrap(), vec![0; 64], "no data moved");

    // Nothing can be posted now; disconnecting again is a quiet no-op.
    state_err(
        c.ep.post_send(&[cb.triplet(0, 8).unwrap()], 30, D),
        Subtype::InvalidStateEpDisconnected,
    );
    state_err(
        s.ep.post_recv(&[sb.triplet(0, 8).unwrap()], 31, D),
        Subtype::InvalidStateEpDisconnected,
    );
    c.ep.disconnect(true).unwrap();
    s.ep.disconnect(false).unwrap();
    empty(&c.conn);
    empty(&s.conn);
}

#[case]
fn reset_only_from_disconnected() {
    let (c, s, _psp) = listening("127.0.22.23", "127.0.22.24", 2300);
    c.ep.connect(s.ia.address(), 2300, Some(T), b"").unwrap();
    state_err(c.ep.reset(), Subtype::InvalidStateEpActconnpending);
    let cr = next_cr(&s.ia, &s.cr);
    cr.accept(&s.ep, b"").unwrap();
    assert_eq!(conn_kind(&c.conn), ConnectionEventKind::Established);
    assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Established);
    state_err(c.ep.reset(), Subtype::InvalidStateEpConnected);
    state_err(s.ep.reset(), Subtype::InvalidStateEpConnected);
    assert_eq!(c.ep.state(), EpState::Connected);

    s.ep.disconnect(false).unwrap();
    assert_eq!(conn_kind(&c.conn), ConnectionEventKind::Disconnected);
    assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Disconnected);
    c.ep.reset().unwrap();
    s.ep.reset().unwrap();
    assert_eq!(c.ep.state(), EpState::Unconnected);
    let q = c.ep.query().unwrap();
    assert_eq!((q.remote, q.peer_private_data), (None, None));
    // The endpoints are reusable: connect again and move data.
    establish(&c, &s, 2300);
    let sb = s.buf(8);
    let cb = c.lmr(b"again!!!".to_vec());
    s.recv(&sb, 0, 8, 1);
    c.send(&cb, 0, 8, 2);
    assert_eq!(next_dto(&c.req).status, DtoStatus::Success);
    assert_eq!(next_dto(&s.rcv).status, DtoStatus::Success);
    assert_eq!(sb.to_vec().unwrap(), b"again!!!");
}

#[case]
fn free_of_a_connected_endpoint() {
    let (c, s, _psp) = listening("127.0.22.25", "127.0.22.26", 2500);
    establish(&c, &s, 2500);
    let cb = c.buf(16);
    let sb = s.buf(16);
    c.recv(&cb, 0, 16, 1);
    s.recv(&sb, 0, 16, 2);

    s.ep.free().unwrap();
    // The peer is disconnected and flushed.
    assert_eq!(conn_kind(&c.conn), ConnectionEventKind::Disconnected);
    let d = next_dto(&c.rcv);
    assert_eq!((d.cookie, d.status), (1, DtoStatus::Flushed));
    assert_eq!(c.ep.state(), EpState::Disconnected);
    // The freed endpoint's own work was flushed too.
    let d = next_dto(&s.rcv);
    assert_eq!((d.cookie, d.status), (2, DtoStatus::Flushed));
    // Its handle is dead.
    let dead = |r: Result<()>| handle_err(r, Subtype::InvalidHandleEp);
    dead(s.ep.free());
    dead(s.ep.post_recv(&[sb.triplet(0, 16).unwrap()], 3, D));
    dead(s.ep.post_send(&[], 3, D));
    dead(s.ep.disconnect(true));
    dead(s.ep.reset());
    dead(s.ep.query().map(drop));
    dead(s.ep.connect(c.ia.address(), 1, Some(T), b""));
    // Its EVDs are no longer fed by it: free succeeds once nothing else uses them.
    sb.free().unwrap();
    s.pz.free().unwrap();
    s.rcv.free().unwrap();
    // The freed endpoint no longer holds the IA open.
    _psp.free().unwrap();
    s.ia.close(CloseFlags::Graceful).unwrap();
}

#[case]
fn conn_qual_in_use() {
    let s = Node::new("127.0.22.27");
    let psp = s.ia.psp_create(2700, &s.cr).unwrap();
    assert_eq!(psp.conn_qual(), 2700);
    let r = s.ia.psp_create(2700, &s.cr);
    assert!(matches!(r, Err(Error::ConnQualInUse(2700))), "{r:?}");
    assert_eq!(
        r.unwrap_err().dat_return().ty(),
        Some(rdapl::error::DatType::ConnQualInUse)
    );
    // Another IA at the same address shares the qualifier space.
    let twin = open("127.0.22.27");
    let twin_cr = twin.evd_create(4, EvdFlags::CR).unwrap();
    assert!(matches!(
        twin.psp_create(2700, &twin_cr),
        Err(Error::ConnQualInUse(2700))
    ));
    // An IA at another address does not.
    let other = open("127.0.22.28");
    let other_cr = other.evd_create(4, EvdFlags::CR).unwrap();
    let p2 = other.psp_create(2700, &other_cr).unwrap();
    // An RSP on a used qualifier is refused and leaves its endpoint alone.
    let ep = s.ep2();
    assert!(matches!(
        s.ia.rsp_create(2700, &ep, &s.cr),
        Err(Error::ConnQualInUse(2700))
    ));
    assert_eq!(ep.state(), EpState::Unconnected);
    // Freed, the qualifier can be used again; a freed PSP is dead.
    psp.free().unwrap();
    handle_err(psp.free(), Subtype::InvalidHandlePsp);
    let again = s.ia.psp_create(2700, &s.cr).unwrap();
    again.free().unwrap();
    p2.free().unwrap();
}

#[case]
fn full_cr_evd_rejects_as_non_peer() {
    let s = Node::new("127.0.22.29");
    let c1 = Node::new("127.0.22.30");
    let c2 = Node::new("127.0.22.31");
    let small = s.ia.evd_create(1, EvdFlags::CR).unwrap();
    let _psp = s.ia.psp_create(2900, &small).unwrap();
    c1.ep.connect(s.ia.address(), 2900, Some(T), b"").unwrap();
    // (Over a network the request arrives later: wait until it is queued.)
    assert!(common::eventually(T, || small.query().unwrap().pending == 1));
    // The CR EVD holds one request: the second is refused by the provider.
    c2.ep.connect(s.ia.address(), 2900, Some(T), b"").unwrap();
    assert_eq!(conn_kind(&c2.conn), ConnectionEventKind::NonPeerRejected);
    assert_eq!(c2.ep.state(), EpState::Disconnected);
    // The overflow is reported on the async EVD, naming the CR EVD.
    match next(s.ia.async_evd()) {
        Event::AsyncError(e) => {
            assert_eq!(e.kind, AsyncErrorKind::EvdOverflow);
            assert_eq!(e.object, DatObject::Evd(small.handle()));
        }
        e => panic!("expected an overflow, got {e:?}"),
    }
    // The first request is intact and can be accepted.
    let cr = s.ia.cr(cr_arrival(&small).cr).unwrap();
    cr.accept(&s.ep, b"").unwrap();
    assert_eq!(conn_kind(&c1.conn), ConnectionEventKind::Established);
    assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Established);
    empty(&small);
}

/// Freeing an endpoint an RSP reserved: either refused (as the DAPL
/// reference `dapl_ep_free` does, `DAT_INVALID_STATE`), or the reservation
/// must go with it, so no request is delivered for a dead endpoint.
#[case]
fn free_of_a_reserved_endpoint() {
    let s = Node::new("127.0.22.32");
    let c = Node::new("127.0.22.33");
    let rsp = s.ia.rsp_create(3200, &s.ep, &s.cr).unwrap();
    match s.ep.free() {
        Err(Error::InvalidState {
            state: Subtype::InvalidStateEpReserved,
            ..
        }) => {
            rsp.free().unwrap();
            s.ep.free().unwrap();
        }
        Ok(()) => {
            c.ep.connect(s.ia.address(), 3200, Some(Duration::from_millis(300)), b"")
                .unwrap();
            let k = conn_kind(&c.conn);
            assert!(
                matches!(
                    k,
                    ConnectionEventKind::PeerRejected | ConnectionEventKind::NonPeerRejected
                ),
                "connect to the freed endpoint's RSP ended with {k:?}"
            );
            empty(&s.cr);
        }
        Err(e) => panic!("unexpected error {e:?}"),
    }
}
