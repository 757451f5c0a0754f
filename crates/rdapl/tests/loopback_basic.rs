//! End-to-end smoke of the object model on the loopback provider: connect
//! with private data, send/receive, RDMA write and read, disconnect.

use rdapl::*;
use std::time::Duration;

const T: Option<Duration> = Some(Duration::from_secs(5));

struct Side {
    ia: Ia,
    pz: Pz,
    evd: Evd,
    ep: Ep,
}

fn side(addr: &str) -> Side {
    let ia = Ia::open_with(
        "loopback",
        IaOptions {
            params: format!("addr={addr}"),
            ..Default::default()
        },
    )
    .unwrap();
    let pz = ia.pz_create().unwrap();
    let evd = ia
        .evd_create(256, EvdFlags::DTO | EvdFlags::CONNECTION | EvdFlags::CR)
        .unwrap();
    let ep = ia
        .ep_create(&pz, Some(&evd), Some(&evd), Some(&evd), None)
        .unwrap();
    Side { ia, pz, evd, ep }
}

fn next(evd: &Evd) -> Event {
    evd.wait(T, 1).expect("event").0
}

fn dto(evd: &Evd) -> DtoCompletion {
    match next(evd) {
        Event::Dto(d) => d,
        e => panic!("expected a DTO completion, got {e:?}"),
    }
}

#[test]
fn connect_send_rdma_disconnect() {
    let s = side("127.0.10.1");
    let c = side("127.0.10.2");
    let _psp = s.ia.psp_create(4000, &s.evd).unwrap();
    c.ep.connect(s.ia.address(), 4000, T, b"hello from client")
        .unwrap();
    let cr = match next(&s.evd) {
        Event::ConnectionRequest(a) => s.ia.cr(a.cr).unwrap(),
        e => panic!("{e:?}"),
    };
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
    let d = dto(&c.evd);
    assert_eq!(
        (d.cookie, d.status, d.operation, d.transferred_length),
        (8, DtoStatus::Success, DtoOp::Send, 10)
    );
    let d = dto(&s.evd);
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
    assert_eq!(dto(&c.evd).status, DtoStatus::Success);
    assert_eq!(&rbuf.to_vec().unwrap()[20..30], b"0123456789");
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
    let d = dto(&c.evd);
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
