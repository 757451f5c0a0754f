//! Every event carries the consumer context of the object it is about, as
//! it was when the event was made: DTO completions and connection events
//! their endpoint's, a connection request its service point's, an
//! asynchronous error its object's (an SRQ's low watermark, an EVD's
//! overflow). A consumer (the C ABI among them) finds its own object from
//! a dequeued event without a lookup.

use crate::case;
use crate::support as common;

use common::{D, T, conn_ev, cr_arrival, next, next_dto, pair};
use rdapl::*;

#[case]
fn dto_and_connection_events_carry_their_endpoints_context() {
    let (c, s, psp) = common::listening("127.0.98.1", "127.0.98.2", 61);
    c.ep.set_consumer_context(0xC1);
    s.ep.set_consumer_context(0x51);
    psp.set_consumer_context(0x9);
    c.ep.connect(s.ia.address(), 61, Some(T), b"").unwrap();
    let arrival = cr_arrival(&s.cr);
    assert_eq!(arrival.consumer_context, 0x9);
    assert_eq!(arrival.sp, Some(psp.handle()));
    s.ia.cr(arrival.cr).unwrap().accept(&s.ep, b"").unwrap();
    let (ce, se) = (conn_ev(&c.conn), conn_ev(&s.conn));
    assert_eq!((ce.ep, ce.consumer_context), (c.ep.handle(), 0xC1));
    assert_eq!((se.ep, se.consumer_context), (s.ep.handle(), 0x51));

    let src = c.lmr(vec![5; 64]);
    let dst = s.buf(64);
    s.recv(&dst, 0, 64, 1);
    c.send(&src, 0, 64, 2);
    let sent = next_dto(&c.req);
    let got = next_dto(&s.rcv);
    assert_eq!((sent.cookie, sent.consumer_context), (2, 0xC1));
    assert_eq!((got.cookie, got.consumer_context), (1, 0x51));

    // A later context is what later events carry.
    c.ep.set_consumer_context(0xC2);
    s.recv(&dst, 0, 64, 3);
    c.send(&src, 0, 64, 4);
    assert_eq!(next_dto(&c.req).consumer_context, 0xC2);
    assert_eq!(next_dto(&s.rcv).consumer_context, 0x51);
    c.ep.disconnect(true).unwrap();
    assert_eq!(conn_ev(&c.conn).consumer_context, 0xC2);
    assert_eq!(conn_ev(&s.conn).consumer_context, 0x51);
}

#[case]
fn a_reserved_service_points_request_carries_its_context() {
    let p = pair("127.0.98.3", "127.0.98.4", 62);
    let ep = p.s.ep2();
    let rsp = p.s.ia.rsp_create(63, &ep, &p.s.cr).unwrap();
    rsp.set_consumer_context(0x77);
    let client = p.c.ep2();
    client.connect(p.s.ia.address(), 63, Some(T), b"").unwrap();
    let arrival = cr_arrival(&p.s.cr);
    assert_eq!(arrival.sp, None);
    assert_eq!(arrival.consumer_context, 0x77);
}

#[case]
fn async_errors_carry_their_objects_context() {
    let ia = common::open("127.0.98.5");
    let pz = ia.pz_create().unwrap();
    let lmr = pz.lmr_create_from(vec![0; 64], MemPriv::ALL).unwrap();
    let srq = ia.srq_create(&pz, 8, 1).unwrap();
    srq.set_consumer_context(0x5A);
    let rcv = ia.evd_create(8, EvdFlags::DTO).unwrap();
    let _ep = ia
        .ep_create_with_srq(&pz, &rcv, None, None, &srq, None)
        .unwrap();
    srq.post_recv(&[lmr.triplet(0, 64).unwrap()], 1, D).unwrap();
    // Armed above what is posted: it fires at once.
    srq.set_low_watermark(Some(2)).unwrap();
    match next(ia.async_evd()) {
        Event::AsyncError(a) => {
            assert_eq!(a.object, event::DatObject::Srq(srq.handle()));
            assert_eq!(a.consumer_context, 0x5A);
        }
        e => panic!("expected the SRQ's low watermark, got {e:?}"),
    }

    // An EVD's overflow, reported on the IA's async EVD: a CR EVD of one
    // entry, two requests.
    let small = ia.evd_create(1, EvdFlags::CR).unwrap();
    small.set_consumer_context(0xE7);
    let _psp = ia.psp_create(64, &small).unwrap();
    let c = common::Node::new("127.0.98.6");
    let c2 = c.ep2();
    for ep in [&c.ep, &c2] {
        ep.connect(ia.address(), 64, Some(T), b"").unwrap();
    }
    // The second was refused by the provider, not the peer.
    let kinds = [conn_ev(&c.conn).kind];
    assert_eq!(kinds, [ConnectionEventKind::NonPeerRejected]);
    match next(ia.async_evd()) {
        Event::AsyncError(a) => {
            assert_eq!(a.object, event::DatObject::Evd(small.handle()));
            assert_eq!(a.kind, AsyncErrorKind::EvdOverflow);
            assert_eq!(a.consumer_context, 0xE7);
        }
        e => panic!("expected the EVD's overflow, got {e:?}"),
    }
}
