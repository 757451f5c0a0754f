//! The loopback's own tests: the windows between the endpoint's teardown
//! steps (feature `test-hooks` of rdapl-core) against its connection rules.

use crate::link::test_hooks::BREAK_GAP;
use rdapl_core::ep::test_hooks::{ABORT_GAP, CONNECT_GAP, POST_RECV_GAP};
use rdapl_core::evd::EvdProducer;
use rdapl_core::provider::{FaultInjector, Faults};
use rdapl_core::*;
use std::sync::Arc;
use std::time::Duration;

const T: Duration = Duration::from_secs(5);

struct Side {
    ia: Ia,
    pz: Pz,
    evd: Evd,
    ep: Ep,
}

/// The fabric of these tests, wrapped for fault injection ([`faults`]).
fn fabric() -> Arc<dyn rdapl_core::provider::Provider> {
    static FABRIC: std::sync::OnceLock<Arc<dyn rdapl_core::provider::Provider>> =
        std::sync::OnceLock::new();
    FABRIC
        .get_or_init(|| FaultInjector::with_faults(crate::Loopback::new(), faults().clone()))
        .clone()
}

/// The faults armed on these tests' endpoints.
fn faults() -> &'static Arc<Faults> {
    static F: std::sync::OnceLock<Arc<Faults>> = std::sync::OnceLock::new();
    F.get_or_init(Faults::new)
}

fn side(addr: &str) -> Side {
    let opts = ia::IaOptions {
        params: format!("addr={addr}"),
        ..Default::default()
    };
    let ia = Ia::open_provider(fabric(), opts).unwrap();
    let pz = ia.pz_create().unwrap();
    let evd = ia
        .evd_create(64, EvdFlags::DTO | EvdFlags::CONNECTION | EvdFlags::CR)
        .unwrap();
    let ep = ia
        .ep_create(&pz, Some(&evd), Some(&evd), Some(&evd), None)
        .unwrap();
    Side { ia, pz, evd, ep }
}

fn next(evd: &Evd) -> Event {
    evd.wait(Some(T), 1).expect("an event within the timeout").0
}

fn conn_kind(evd: &Evd) -> ConnectionEventKind {
    match next(evd) {
        Event::Connection(c) => c.kind,
        e => panic!("expected a connection event, got {e:?}"),
    }
}

fn dto(evd: &Evd) -> (u64, DtoStatus) {
    match next(evd) {
        Event::Dto(d) => (d.cookie, d.status),
        e => panic!("expected a DTO completion, got {e:?}"),
    }
}

/// Server `s` and client `c`, connected.
fn connected(s_addr: &str, c_addr: &str, qual: u64) -> (Side, Side, Psp) {
    let (s, c) = (side(s_addr), side(c_addr));
    let psp = s.ia.psp_create(qual, &s.evd).unwrap();
    c.ep.connect(s.ia.address(), qual, Some(T), b"").unwrap();
    let cr = match next(&s.evd) {
        Event::ConnectionRequest(a) => s.ia.cr(a.cr).unwrap(),
        e => panic!("{e:?}"),
    };
    cr.accept(&s.ep, b"").unwrap();
    assert_eq!(conn_kind(&s.evd), ConnectionEventKind::Established);
    assert_eq!(conn_kind(&c.evd), ConnectionEventKind::Established);
    (s, c, psp)
}

/// The receiver `s` disconnects; in the window before the sender `c`
/// is disconnected too (`c` still connected, its peer still `s`), `s`
/// is reset and posts a receive for its next connection, and `c` posts
/// a send (`queued_first`: with one already waiting for a receive, so
/// the general path executes it). No message of the old connection may
/// land in that receive: `c`'s sends are flushed by its disconnect and
/// the receive stays posted.
fn old_send_never_lands_in_next_receive(s_addr: &str, c_addr: &str, queued_first: bool) {
    let (s, c, _psp) = connected(s_addr, c_addr, 4100);
    let sbuf =
        c.pz.lmr_create_from(b"old connection".to_vec(), MemPriv::LOCAL_READ)
            .unwrap();
    let rbuf = s.pz.lmr_create(Region::zeroed(64), MemPriv::ALL).unwrap();
    let send = sbuf.triplet(0, 14).unwrap();
    if queued_first {
        // No receive: it waits at the head of the queue.
        c.ep.post_send(&[send], 1, CompletionFlags::DEFAULT)
            .unwrap();
    }
    let (s_ep, c_ep) = (s.ep.clone(), c.ep.clone());
    let recv = rbuf.triplet(0, 64).unwrap();
    let late_send = std::rc::Rc::new(std::cell::Cell::new(None));
    let late = late_send.clone();
    BREAK_GAP.with(|h| {
        *h.borrow_mut() = Some(Box::new(move || {
            // `s` is told; `c` left the connection with it, not yet told.
            assert_eq!(s_ep.state(), EpState::Disconnected);
            assert_eq!(
                c_ep.state(),
                EpState::Disconnected,
                "both sides left together"
            );
            s_ep.reset().unwrap();
            s_ep.post_recv(&[recv], 100, CompletionFlags::DEFAULT)
                .unwrap();
            // Refused (the endpoint is out of the connection) or, if
            // taken, flushed: never delivered.
            late.set(Some(
                c_ep.post_send(&[send], 2, CompletionFlags::DEFAULT).is_ok(),
            ));
        }))
    });
    s.ep.disconnect(false).unwrap();
    assert!(BREAK_GAP.with(|h| h.borrow().is_none()), "the hook ran");
    assert_eq!(conn_kind(&s.evd), ConnectionEventKind::Disconnected);
    assert_eq!(
        s.evd.dequeue().unwrap().map(|e| format!("{e:?}")),
        None,
        "the receive of the next connection took nothing"
    );
    assert_eq!(rbuf.to_vec().unwrap(), vec![0; 64]);
    assert_eq!(s.ep.query().unwrap().outstanding, (0, 1));
    if queued_first {
        assert_eq!(dto(&c.evd), (1, DtoStatus::Flushed));
    }
    if late_send.get().expect("the hook posted") {
        assert_eq!(dto(&c.evd), (2, DtoStatus::Flushed));
    }
    assert_eq!(conn_kind(&c.evd), ConnectionEventKind::Disconnected);
    assert_eq!(c.evd.dequeue().unwrap().map(|e| format!("{e:?}")), None);
}

/// `post_recv` reads the state under the posters' lock alone:
/// after a DTO error stopped both sides, refused on the side not yet
/// told (it left the connection with the other) and once it is, with
/// the state's subtype; accepted again after a reset.
#[test]
fn post_recv_refused_while_disconnecting() {
    let (s, c, _psp) = connected("127.0.77.5", "127.0.77.6", 4101);
    let buf = s.pz.lmr_create(Region::zeroed(64), MemPriv::ALL).unwrap();
    let cbuf = c.pz.lmr_create(Region::zeroed(64), MemPriv::ALL).unwrap();
    let recv = buf.triplet(0, 64).unwrap();
    let refused = |r: Result<()>, want: error::Subtype| match r {
        Err(Error::InvalidState { state, .. }) => assert_eq!(state, want),
        r => panic!("expected InvalidState({want:?}), got {r:?}"),
    };
    let s_ep = s.ep.clone();
    let c_ep = c.ep.clone();
    BREAK_GAP.with(|h| {
        *h.borrow_mut() = Some(Box::new(move || {
            // `c` is told; `s` left the connection with it, not yet
            // told.
            assert_eq!(s_ep.state(), EpState::Disconnected);
            refused(
                s_ep.post_recv(&[recv], 1, CompletionFlags::DEFAULT),
                error::Subtype::InvalidStateEpDisconnected,
            );
            refused(
                c_ep.post_recv(&[recv], 2, CompletionFlags::DEFAULT),
                error::Subtype::InvalidStateEpDisconnected,
            );
        }))
    });
    faults().fail_next(&c.ep, DtoStatus::LocalLength);
    c.ep.post_send(&[cbuf.triplet(0, 8).unwrap()], 3, CompletionFlags::DEFAULT)
        .unwrap();
    assert!(BREAK_GAP.with(|h| h.borrow().is_none()), "the hook ran");
    assert_eq!(s.ep.state(), EpState::Disconnected);
    refused(
        s.ep.post_recv(&[recv], 4, CompletionFlags::DEFAULT),
        error::Subtype::InvalidStateEpDisconnected,
    );
    s.ep.reset().unwrap();
    s.ep.post_recv(&[recv], 5, CompletionFlags::DEFAULT)
        .unwrap();
    assert_eq!(s.ep.query().unwrap().outstanding, (0, 1));
}

/// Once one side of a connection has been told it is disconnected (its
/// requests flushed, its connection event raised), the other side can
/// no longer reach its memory: an RDMA write posted then does not land,
/// an RDMA read does not read. (Both sides leave the connection
/// together, before either is told.)
#[test]
fn no_rdma_reaches_a_side_told_it_is_disconnected() {
    let (s, c, _psp) = connected("127.0.77.8", "127.0.77.9", 4102);
    let target = s.pz.lmr_create(Region::zeroed(64), MemPriv::ALL).unwrap();
    let remote = target.rmr_triplet(0, 64).unwrap();
    let src = c.pz.lmr_create_from(vec![0xAB; 64], MemPriv::ALL).unwrap();
    let local = src.triplet(0, 64).unwrap();
    // The connection works: a write lands, and is undone.
    c.ep.post_rdma_write(&[local], remote, 1, CompletionFlags::DEFAULT)
        .unwrap();
    assert_eq!(dto(&c.evd), (1, DtoStatus::Success));
    assert_eq!(target.to_vec().unwrap(), vec![0xAB; 64]);
    target.write_at(0, &[0; 64]).unwrap();
    let c_ep = c.ep.clone();
    let s_evd = s.evd.clone();
    let posted = std::rc::Rc::new(std::cell::Cell::new((None, None)));
    let out = posted.clone();
    BREAK_GAP.with(|h| {
        *h.borrow_mut() = Some(Box::new(move || {
            // `s` has been told.
            assert!(matches!(
                s_evd.dequeue().unwrap(),
                Some(Event::Connection(e)) if e.kind == ConnectionEventKind::Disconnected
            ));
            let w = c_ep
                .post_rdma_write(&[local], remote, 2, CompletionFlags::DEFAULT)
                .is_ok();
            let r = c_ep
                .post_rdma_read(&[local], remote, 3, CompletionFlags::DEFAULT)
                .is_ok();
            out.set((Some(w), Some(r)));
        }))
    });
    s.ep.disconnect(false).unwrap();
    assert!(BREAK_GAP.with(|h| h.borrow().is_none()), "the hook ran");
    assert_eq!(target.to_vec().unwrap(), vec![0; 64], "no write landed");
    assert_eq!(src.to_vec().unwrap(), vec![0xAB; 64], "no read landed");
    // Taken requests (if any) are flushed, never executed.
    let (w, r) = posted.get();
    if w.expect("the hook posted") {
        assert_eq!(dto(&c.evd), (2, DtoStatus::Flushed));
    }
    if r.expect("the hook posted") {
        assert_eq!(dto(&c.evd), (3, DtoStatus::Flushed));
    }
    assert_eq!(conn_kind(&c.evd), ConnectionEventKind::Disconnected);
    assert_eq!(c.evd.dequeue().unwrap().map(|e| format!("{e:?}")), None);
}

/// A receive whose post passed its checks just before its endpoint was
/// freed, and that reaches the receive queue while the free is under
/// way (between refusing receives and flushing them), is refused: it is
/// never queued behind the flush, where its completion (and its EVD
/// reservation) would be lost.
#[test]
fn post_recv_racing_free_is_refused_not_lost() {
    let s = side("127.0.77.7");
    let rbuf = s.pz.lmr_create(Region::zeroed(64), MemPriv::ALL).unwrap();
    let recv = rbuf.triplet(0, 64).unwrap();
    let (passed_tx, passed_rx) = std::sync::mpsc::channel::<()>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let ep = s.ep.clone();
    let poster = std::thread::spawn(move || {
        POST_RECV_GAP.with(|h| {
            *h.borrow_mut() = Some(Box::new(move || {
                passed_tx.send(()).unwrap();
                go_rx.recv_timeout(T).unwrap();
            }))
        });
        ep.post_recv(&[recv], 7, CompletionFlags::DEFAULT)
    });
    // The post passed its checks (the endpoint was live) and waits.
    passed_rx.recv_timeout(T).unwrap();
    let result = std::sync::Arc::new(parking_lot::Mutex::new(None));
    let out = result.clone();
    ABORT_GAP.with(|h| {
        *h.borrow_mut() = Some(Box::new(move || {
            go_tx.send(()).unwrap();
            *out.lock() = Some(poster.join().unwrap());
        }))
    });
    s.ep.free().unwrap();
    assert!(ABORT_GAP.with(|h| h.borrow().is_none()), "the hook ran");
    let posted = result.lock().take().expect("the post finished in the gap");
    assert!(
        matches!(posted, Err(Error::InvalidState { .. })),
        "a receive reaching a freed endpoint's queue must be refused, got {posted:?}"
    );
    // Nothing was queued, so nothing is left over: the EVD is empty and
    // its whole capacity can be reserved again.
    assert!(s.evd.dequeue().unwrap().is_none());
    let all: Vec<_> = (0..64).map(|_| s.evd.reserve().unwrap()).collect();
    for r in all {
        s.evd.release(r).unwrap();
    }
}

/// A connect withdrawn before the provider heard of it (a disconnect, a
/// reset and a connect to another listener, in the window after the core
/// let go of the endpoint) starts nothing: only the attempt that
/// replaced it reaches a listener, and it is the one established.
#[test]
fn a_withdrawn_connect_is_not_started_after_the_next_one() {
    let (a, b, c) = (
        side("127.0.77.50"),
        side("127.0.77.51"),
        side("127.0.77.52"),
    );
    let _pa = a.ia.psp_create(4200, &a.evd).unwrap();
    let _pb = b.ia.psp_create(4200, &b.evd).unwrap();
    let (ep, b_addr) = (c.ep.clone(), b.ia.address());
    CONNECT_GAP.with(|h| {
        *h.borrow_mut() = Some(Box::new(move || {
            ep.disconnect(false).unwrap();
            ep.reset().unwrap();
            ep.connect(b_addr, 4200, Some(T), b"second").unwrap();
        }))
    });
    c.ep.connect(a.ia.address(), 4200, Some(T), b"first")
        .unwrap();
    assert!(CONNECT_GAP.with(|h| h.borrow().is_none()), "the hook ran");
    assert_eq!(conn_kind(&c.evd), ConnectionEventKind::Disconnected);
    let cr = match next(&b.evd) {
        Event::ConnectionRequest(r) => b.ia.cr(r.cr).unwrap(),
        e => panic!("expected the second attempt's request, got {e:?}"),
    };
    assert_eq!(cr.private_data(), b"second");
    assert!(
        a.evd.dequeue().unwrap().is_none(),
        "the withdrawn attempt reached its listener"
    );
    cr.accept(&b.ep, b"").unwrap();
    assert_eq!(conn_kind(&c.evd), ConnectionEventKind::Established);
    assert_eq!(conn_kind(&b.evd), ConnectionEventKind::Established);
    assert_eq!(c.ep.state(), EpState::Connected);
    assert!(c.evd.dequeue().unwrap().is_none());
}

#[test]
fn send_fast_never_lands_in_the_next_connections_receive() {
    old_send_never_lands_in_next_receive("127.0.77.1", "127.0.77.2", false);
}

#[test]
fn queued_send_never_lands_in_the_next_connections_receive() {
    old_send_never_lands_in_next_receive("127.0.77.3", "127.0.77.4", true);
}
