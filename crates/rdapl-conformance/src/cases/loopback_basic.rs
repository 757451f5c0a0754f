//! End-to-end smoke of the object model on the loopback provider: connect
//! with private data, send/receive, RDMA write and read, disconnect.

use crate::case;
use crate::support as common;

use common::{Inject, T, next, next_cr, next_dto, side};
use rdapl::*;
use std::time::Duration;

#[case]
fn connect_send_rdma_disconnect() {
    let s = side("127.0.10.1");
    let c = side("127.0.10.2");
    let _psp = s.ia.psp_create(4000, &s.evd).unwrap();
    c.ep.connect(s.ia.address(), 4000, Some(T), b"hello from client")
        .unwrap();
    let cr = next_cr(&s.ia, &s.evd);
    assert_eq!(cr.private_data(), b"hello from client");
    assert_eq!(cr.remote_address(), c.ia.address());
    cr.accept(&s.ep, b"welcome").unwrap();
    match next(&s.evd) {
        Event::Connection(e) => assert_eq!(e.kind, ConnectionEventKind::Established),
        e => panic!("{e:?}"),
    }
    match next(&c.evd) {
        Event::Connection(e) => {
            assert_eq!(e.kind, ConnectionEventKind::Established);
            assert_eq!(e.private_data.as_deref(), Some(&b"welcome"[..]));
        }
        e => panic!("{e:?}"),
    }
    assert!(cr.accept(&s.ep, b"").is_err(), "accepting twice is refused");

    // Send / receive.
    let rbuf = s.pz.lmr_create(Region::zeroed(64), MemPriv::ALL).unwrap();
    let sbuf =
        c.pz.lmr_create_from(b"0123456789".to_vec(), MemPriv::LOCAL_READ)
            .unwrap();
    s.ep.post_recv(&[rbuf.triplet(0, 64).unwrap()], 7, CompletionFlags::DEFAULT)
        .unwrap();
    c.ep.post_send(&[sbuf.triplet(0, 10).unwrap()], 8, CompletionFlags::DEFAULT)
        .unwrap();
    let d = next_dto(&c.evd);
    assert_eq!(
        (d.cookie, d.status, d.operation, d.transferred_length),
        (8, DtoStatus::Success, DtoOp::Send, 10)
    );
    let d = next_dto(&s.evd);
    assert_eq!(
        (d.cookie, d.status, d.operation, d.transferred_length),
        (7, DtoStatus::Success, DtoOp::Receive, 10)
    );
    assert_eq!(&rbuf.to_vec().unwrap()[..10], b"0123456789");

    // RDMA write into the server's buffer, then read it back.
    let remote = rbuf.rmr_triplet(20, 10).unwrap();
    c.ep.post_rdma_write(
        &[sbuf.triplet(0, 10).unwrap()],
        remote,
        9,
        CompletionFlags::DEFAULT,
    )
    .unwrap();
    assert_eq!(next_dto(&c.evd).status, DtoStatus::Success);
    crate::support::assert_placed(|| rbuf.to_vec().unwrap()[20..30].to_vec(), b"0123456789");
    let back =
        c.pz.lmr_create(Region::zeroed(10), MemPriv::LOCAL_WRITE)
            .unwrap();
    c.ep.post_rdma_read(
        &[back.triplet(0, 10).unwrap()],
        remote,
        10,
        CompletionFlags::DEFAULT,
    )
    .unwrap();
    let d = next_dto(&c.evd);
    assert_eq!(
        (d.status, d.operation),
        (DtoStatus::Success, DtoOp::RdmaRead)
    );
    assert_eq!(back.to_vec().unwrap(), b"0123456789");

    // Disconnect: both sides see Disconnected; outstanding receives flush.
    s.ep.post_recv(
        &[rbuf.triplet(0, 64).unwrap()],
        11,
        CompletionFlags::DEFAULT,
    )
    .unwrap();
    c.ep.disconnect(true).unwrap();
    match next(&c.evd) {
        Event::Connection(e) => assert_eq!(e.kind, ConnectionEventKind::Disconnected),
        e => panic!("{e:?}"),
    }
    let mut saw_flush = false;
    let mut saw_disc = false;
    for _ in 0..2 {
        match next(&s.evd) {
            Event::Dto(d) => {
                assert_eq!((d.cookie, d.status), (11, DtoStatus::Flushed));
                saw_flush = true;
            }
            Event::Connection(e) => {
                assert_eq!(e.kind, ConnectionEventKind::Disconnected);
                saw_disc = true;
            }
            e => panic!("{e:?}"),
        }
    }
    assert!(saw_flush && saw_disc);
    assert_eq!(c.ep.state(), EpState::Disconnected);
    assert!(c.ep.post_send(&[], 0, CompletionFlags::DEFAULT).is_err());
    c.ep.reset().unwrap();
    assert_eq!(c.ep.state(), EpState::Unconnected);
}

/// Two server endpoints share one SRQ: receives are matched in post order
/// across both, completions land on each endpoint's receive EVD, and the
/// low watermark fires once on the async EVD.
#[case]
fn shared_receive_queue_and_low_watermark() {
    if common::skip_unless_loopback(
        "assumes completion order across endpoints (DAT orders within one)",
    ) {
        return;
    }
    let s = side("127.0.11.1");
    let c1 = side("127.0.11.2");
    let c2 = side("127.0.11.3");
    let srq = s.ia.srq_create(&s.pz, 8, 2).unwrap();
    let sevd =
        s.ia.evd_create(64, EvdFlags::DTO | EvdFlags::CONNECTION)
            .unwrap();
    let e1 =
        s.ia.ep_create_with_srq(&s.pz, &sevd, Some(&sevd), Some(&sevd), &srq, None)
            .unwrap();
    let e2 =
        s.ia.ep_create_with_srq(&s.pz, &sevd, Some(&sevd), Some(&sevd), &srq, None)
            .unwrap();
    assert!(
        e1.post_recv(&[], 0, CompletionFlags::DEFAULT).is_err(),
        "receives go to the SRQ"
    );
    let _psp = s.ia.psp_create(4100, &s.evd).unwrap();
    for (c, e) in [(&c1, &e1), (&c2, &e2)] {
        c.ep.connect(s.ia.address(), 4100, Some(T), b"").unwrap();
        let cr = next_cr(&s.ia, &s.evd);
        cr.accept(e, b"").unwrap();
        assert!(matches!(next(&c.evd), Event::Connection(_)));
        assert!(matches!(next(&sevd), Event::Connection(_)));
    }
    let rb =
        s.pz.lmr_create(Region::zeroed(4 * 16), MemPriv::ALL)
            .unwrap();
    for i in 0..4u64 {
        srq.post_recv(
            &[rb.triplet(i * 16, 16).unwrap()],
            100 + i,
            CompletionFlags::DEFAULT,
        )
        .unwrap();
    }
    srq.set_low_watermark(Some(2)).unwrap();
    let sb1 = c1
        .pz
        .lmr_create_from(b"from-one".to_vec(), MemPriv::ALL)
        .unwrap();
    let sb2 = c2
        .pz
        .lmr_create_from(b"from-two".to_vec(), MemPriv::ALL)
        .unwrap();
    c1.ep
        .post_send(&[sb1.triplet(0, 8).unwrap()], 1, CompletionFlags::DEFAULT)
        .unwrap();
    c2.ep
        .post_send(&[sb2.triplet(0, 8).unwrap()], 2, CompletionFlags::DEFAULT)
        .unwrap();
    let a = next_dto(&sevd);
    let b = next_dto(&sevd);
    assert_eq!((a.cookie, a.ep), (100, e1.handle()));
    assert_eq!((b.cookie, b.ep), (101, e2.handle()));
    let data = rb.to_vec().unwrap();
    assert_eq!(&data[0..8], b"from-one");
    assert_eq!(&data[16..24], b"from-two");
    // Two left: not below 2 yet. One more send crosses it.
    assert!(s.ia.async_evd().dequeue().unwrap().is_none());
    c1.ep
        .post_send(&[sb1.triplet(0, 8).unwrap()], 3, CompletionFlags::DEFAULT)
        .unwrap();
    assert_eq!(next_dto(&sevd).cookie, 102);
    match s.ia.async_evd().wait(Some(T), 1).unwrap().0 {
        Event::AsyncError(e) => {
            assert_eq!(e.object, DatObject::Srq(srq.handle()));
            assert_eq!(e.reason, rdapl::srq::DAT_SRQ_LOW_WATERMARK_EVENT);
        }
        ev => panic!("{ev:?}"),
    }
    assert_eq!(srq.query().unwrap().available, 1);
    assert!(srq.free().is_err(), "endpoints still use it");
}

/// A fast-registration map and an invalidate queued behind it both
/// succeed, in order; the key from before the invalidate is then refused.
#[case]
fn fmr_map_then_invalidate_queued() {
    if crate::support::skip_unless_placed() {
        return;
    }
    let s = side("127.0.12.1");
    let c = side("127.0.12.2");
    let _psp = s.ia.psp_create(4200, &s.evd).unwrap();
    c.ep.connect(s.ia.address(), 4200, Some(T), b"").unwrap();
    let cr = next_cr(&s.ia, &s.evd);
    cr.accept(&s.ep, b"").unwrap();
    assert!(matches!(next(&s.evd), Event::Connection(_)));
    assert!(matches!(next(&c.evd), Event::Connection(_)));

    let fmr = s.pz.lmr_create_fmr(64).unwrap();
    let region = Region::zeroed(64);
    // Hold the queue so both requests are queued before either executes.
    s.ep.inject_delay(Some(Duration::from_millis(50)));
    let k1 =
        s.ep.post_lmr_fmr(
            &fmr,
            region.clone(),
            MemPriv::ALL,
            1,
            CompletionFlags::DEFAULT,
        )
        .unwrap();
    let k2 =
        s.ep.post_lmr_invalidate(&fmr, 2, CompletionFlags::DEFAULT)
            .unwrap();
    s.ep.inject_delay(None);
    assert_ne!(k1, k2);
    let d = next_dto(&s.evd);
    assert_eq!(
        (d.cookie, d.status, d.operation),
        (1, DtoStatus::Success, DtoOp::LmrFmr)
    );
    let d = next_dto(&s.evd);
    assert_eq!(
        (d.cookie, d.status, d.operation),
        (2, DtoStatus::Success, DtoOp::LmrInvalidate)
    );
    assert_eq!(fmr.context().unwrap(), k2);
    // The mapped key (k1) is dead now.
    let src = c.pz.lmr_create_from(vec![7; 8], MemPriv::ALL).unwrap();
    let remote = RmrTriplet {
        rmr_context: k1,
        target_address: region.address(),
        segment_length: 8,
    };
    c.ep.post_rdma_write(
        &[src.triplet(0, 8).unwrap()],
        remote,
        3,
        CompletionFlags::DEFAULT,
    )
    .unwrap();
    assert_eq!(next_dto(&c.evd).status, DtoStatus::RemoteAccess);
    assert!(region.read().iter().all(|b| *b == 0), "no byte moved");
}

/// Sender-controlled notification: a receive posted with SOLICITED_WAIT
/// filled by an unsolicited send is queued without an upcall; a solicited
/// send notifies (and the run then delivers both, in order).
#[case]
fn solicited_wait_receives_notify_only_for_solicited_sends() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    let s = side("127.0.13.1");
    let c = side("127.0.13.2");
    let _psp = s.ia.psp_create(4300, &s.evd).unwrap();
    c.ep.connect(s.ia.address(), 4300, Some(T), b"").unwrap();
    let cr = next_cr(&s.ia, &s.evd);
    // Receives complete on their own EVD, consumed by upcall.
    let rcv = s.ia.evd_create(16, EvdFlags::DTO).unwrap();
    let ep =
        s.ia.ep_create(&s.pz, Some(&rcv), Some(&s.evd), Some(&s.evd), None)
            .unwrap();
    cr.accept(&ep, b"").unwrap();
    assert!(matches!(next(&s.evd), Event::Connection(_)));
    assert!(matches!(next(&c.evd), Event::Connection(_)));
    let upcalls = Arc::new(AtomicUsize::new(0));
    let got = Arc::new(Mutex::new(Vec::new()));
    let (u2, g2) = (upcalls.clone(), got.clone());
    let up: Arc<dyn Upcall> = Arc::new(move |_: &Evd, ev: Option<Event>, _| {
        u2.fetch_add(1, Ordering::SeqCst);
        g2.lock()
            .unwrap()
            .push(ev.unwrap().as_dto().unwrap().cookie);
    });
    rcv.modify_upcall(UpcallPolicy::SingleInstance, Some(up), ReEnable::Strict)
        .unwrap();
    let rb = s.pz.lmr_create(Region::zeroed(64), MemPriv::ALL).unwrap();
    for i in 0..2 {
        ep.post_recv(
            &[rb.triplet(i * 32, 32).unwrap()],
            10 + i,
            CompletionFlags::SOLICITED_WAIT,
        )
        .unwrap();
    }
    let sb = c.pz.lmr_create_from(vec![1; 8], MemPriv::ALL).unwrap();
    c.ep.post_send(&[sb.triplet(0, 8).unwrap()], 1, CompletionFlags::DEFAULT)
        .unwrap();
    assert_eq!(next_dto(&c.evd).status, DtoStatus::Success);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        upcalls.load(Ordering::SeqCst),
        0,
        "an unsolicited send does not notify"
    );
    assert_eq!(
        rcv.query().unwrap().pending,
        1,
        "but its completion is queued"
    );
    c.ep.post_send(
        &[sb.triplet(0, 8).unwrap()],
        2,
        CompletionFlags::SOLICITED_WAIT,
    )
    .unwrap();
    assert_eq!(next_dto(&c.evd).status, DtoStatus::Success);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while got.lock().unwrap().len() < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        *got.lock().unwrap(),
        vec![10, 11],
        "both delivered, in order"
    );
    assert!(
        c.ep.post_send(&[], 3, CompletionFlags(0x8000_0000))
            .is_err(),
        "unknown flag bits are refused"
    );
}
