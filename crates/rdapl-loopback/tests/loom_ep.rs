//! Model checking of the object model with loom, on the loopback provider:
//! the receive queue and the shared receive queue (a send that finds no
//! receive against the receive posted for it), the gate of a freed
//! endpoint ("queued before close, else refused"), and the end of a
//! connection racing a send, an RDMA write, or the other side's end.
//!
//! Run with:
//!
//! ```text
//! RUSTFLAGS="--cfg rdapl_loom" cargo test -p rdapl-loopback --test loom_ep --release
//! ```
//!
//! Under `rdapl_loom` the endpoint's locks and counters and the EVDs are
//! loom's, so each model explores every interleaving of them (all of
//! them unless `LOOM_MAX_PREEMPTIONS` bounds the preemptions) and asserts that every posted
//! request completes exactly once, with a status its interleaving allows.
//! The setup (open, connect, register) runs in the model's first thread.
#![cfg(rdapl_loom)]

use loom::thread;
use rdapl_core::dispatch::{Dispatch, DispatchRun};
use rdapl_core::ia::IaOptions;
use rdapl_core::provider::Provider;
use rdapl_core::{
    CompletionFlags, ConnectionEventKind, DtoStatus, Ep, Evd, EvdFlags, Event, Ia, Lmr, MemPriv,
    Pz, Region, Srq,
};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// No upcalls are enabled in these models: nothing is ever scheduled.
struct NoDispatch;

impl Dispatch for NoDispatch {
    fn schedule(&self, _run: DispatchRun) {
        panic!("no upcall is enabled in these models");
    }
}

/// One fabric for every model and iteration (its timer thread is not
/// loom's; no timer is due within a model: the receiver-not-ready time
/// is an hour, and connects have no timeout).
fn fabric() -> Arc<dyn Provider> {
    static F: OnceLock<Arc<dyn Provider>> = OnceLock::new();
    F.get_or_init(|| {
        let lb = rdapl_loopback::Loopback::new();
        lb.set_rnr_timeout(Duration::from_secs(3600));
        lb
    })
    .clone()
}

struct Side {
    ia: Ia,
    pz: Pz,
    evd: Evd,
    ep: Ep,
    buf: Lmr,
    srq: Option<Srq>,
}

/// One side; its endpoint takes its receives from an SRQ of its own if
/// `with_srq`.
fn side(addr: &str, with_srq: bool) -> Side {
    let opts = IaOptions {
        params: format!("addr={addr}"),
        dispatch: Some(loom::sync::Arc::from_std(
            Arc::new(NoDispatch) as Arc<dyn Dispatch>
        )),
        ..Default::default()
    };
    let ia = Ia::open_provider(fabric(), opts).unwrap();
    let pz = ia.pz_create().unwrap();
    let evd = ia
        .evd_create(16, EvdFlags::DTO | EvdFlags::CONNECTION | EvdFlags::CR)
        .unwrap();
    let srq = with_srq.then(|| ia.srq_create(&pz, 4, 1).unwrap());
    let ep = match &srq {
        Some(q) => ia.ep_create_with_srq(&pz, &evd, Some(&evd), Some(&evd), q, None),
        None => ia.ep_create(&pz, Some(&evd), Some(&evd), Some(&evd), None),
    }
    .unwrap();
    let buf = pz.lmr_create(Region::zeroed(16), MemPriv::ALL).unwrap();
    Side {
        ia,
        pz,
        evd,
        ep,
        buf,
        srq,
    }
}

/// Server and client, connected (each has seen `Established`), on
/// addresses of their own for model `n` (the models of this file run at
/// once, on one fabric).
fn connected(n: u8) -> (Side, Side) {
    connected_with(n, false)
}

/// [`connected`], the server's endpoint on an SRQ if `srq`.
fn connected_with(n: u8, srq: bool) -> (Side, Side) {
    let (s, c) = (
        side(&format!("127.0.7.{n}"), srq),
        side(&format!("127.0.8.{n}"), false),
    );
    let psp = s.ia.psp_create(7, &s.evd).unwrap();
    c.ep.connect(s.ia.address(), 7, None, b"").unwrap();
    let cr = match s.evd.dequeue().unwrap() {
        Some(Event::ConnectionRequest(a)) => s.ia.cr(a.cr).unwrap(),
        e => panic!("expected the request, got {e:?}"),
    };
    cr.accept(&s.ep, b"").unwrap();
    for side in [&s, &c] {
        match side.evd.dequeue().unwrap() {
            Some(Event::Connection(e)) => assert_eq!(e.kind, ConnectionEventKind::Established),
            e => panic!("expected Established, got {e:?}"),
        }
    }
    psp.free().unwrap();
    (s, c)
}

/// Every event queued on `evd` now, as DTO statuses by cookie and
/// connection events.
fn drain(evd: &Evd) -> (Vec<(u64, DtoStatus)>, Vec<ConnectionEventKind>) {
    let (mut dto, mut conn) = (Vec::new(), Vec::new());
    while let Some(e) = evd.dequeue().unwrap() {
        match e {
            Event::Dto(d) => dto.push((d.cookie, d.status)),
            Event::Connection(c) => conn.push(c.kind),
            e => panic!("unexpected event {e:?}"),
        }
    }
    (dto, conn)
}

fn close(sides: [Side; 2]) {
    for s in sides {
        let _ = s.ep.free();
        if let Some(q) = &s.srq {
            let _ = q.free();
        }
        let _ = s.buf.free();
        let _ = s.evd.free();
        let _ = s.pz.free();
        s.ia.close(rdapl_core::CloseFlags::Abrupt).unwrap();
    }
}

/// Runs `f` under loom; returns the interleavings explored.
fn model(f: impl Fn() + Sync + Send + 'static) -> usize {
    // Unbounded unless LOOM_MAX_PREEMPTIONS says otherwise: these spaces
    // are small enough to explore whole.
    let b = loom::model::Builder::new();
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let r = runs.clone();
    b.check(move || {
        r.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f()
    });
    let n = runs.load(std::sync::atomic::Ordering::Relaxed);
    println!("{n} interleavings");
    n
}

/// Model `n`: a send posted with no receive waiting, against the receive
/// posted for it on the other thread (to the endpoint's own queue, or to
/// its SRQ if `srq`): whichever comes first, the send lands in the
/// receive (the receive's post kicks a send that found none; a send
/// finds a receive posted before it): both complete `Success`, once.
fn send_meets_receive(n: u8, srq: bool) {
    model(move || {
        let (s, c) = connected_with(n, srq);
        let send = c.buf.triplet(0, 8).unwrap();
        let recv = s.buf.triplet(0, 16).unwrap();
        let (s_ep, s_srq) = (s.ep.clone(), s.srq.clone());
        let t = thread::spawn(move || {
            let f = CompletionFlags::DEFAULT;
            match s_srq {
                Some(q) => q.post_recv(&[recv], 10, f),
                None => s_ep.post_recv(&[recv], 10, f),
            }
            .unwrap();
        });
        c.ep.post_send(&[send], 20, CompletionFlags::DEFAULT)
            .unwrap();
        t.join().unwrap();
        assert_eq!(drain(&c.evd), (vec![(20, DtoStatus::Success)], vec![]));
        assert_eq!(drain(&s.evd), (vec![(10, DtoStatus::Success)], vec![]));
        close([s, c]);
    });
}

#[test]
fn send_meets_receive_posted_concurrently() {
    send_meets_receive(1, false);
}

/// The same with the receiver's endpoint on a shared receive queue: the
/// SRQ's post progresses the senders of its endpoints' peers, so a send
/// that found the SRQ empty still lands in the receive posted meanwhile.
#[test]
fn send_meets_srq_receive_posted_concurrently() {
    send_meets_receive(4, true);
}

/// A receive posted while its endpoint is freed: either refused, or
/// queued before the flush and flushed; never queued behind the flush
/// with its completion lost. The peer hears of the end once.
#[test]
fn receive_posted_while_freed_is_refused_or_flushed() {
    model(|| {
        let (s, c) = connected(2);
        let recv = s.buf.triplet(0, 16).unwrap();
        let s_ep = s.ep.clone();
        let t = thread::spawn(move || s_ep.post_recv(&[recv], 10, CompletionFlags::DEFAULT));
        s.ep.free().unwrap();
        let posted = t.join().unwrap().is_ok();
        let (dto, conn) = drain(&s.evd);
        if posted {
            assert_eq!(dto, vec![(10, DtoStatus::Flushed)]);
        } else {
            assert_eq!(dto, vec![]);
        }
        assert_eq!(conn, vec![ConnectionEventKind::Disconnected]);
        assert_eq!(
            drain(&c.evd),
            (vec![], vec![ConnectionEventKind::Disconnected])
        );
        close([s, c]);
    });
}

/// A send racing the receiver's disconnect, a receive waiting for it:
/// either the message moves (both `Success`) or neither side has it
/// (the send refused or flushed, the receive flushed); each request
/// completes once and each side hears `Disconnected` once.
#[test]
fn send_racing_disconnect_completes_both_sides_alike() {
    model(|| {
        let (s, c) = connected(3);
        let recv = s.buf.triplet(0, 16).unwrap();
        s.ep.post_recv(&[recv], 10, CompletionFlags::DEFAULT)
            .unwrap();
        let send = c.buf.triplet(0, 8).unwrap();
        let c_ep = c.ep.clone();
        let t = thread::spawn(move || c_ep.post_send(&[send], 20, CompletionFlags::DEFAULT));
        s.ep.disconnect(false).unwrap();
        let posted = t.join().unwrap().is_ok();
        let (c_dto, c_conn) = drain(&c.evd);
        let (s_dto, s_conn) = drain(&s.evd);
        assert_eq!(c_conn, vec![ConnectionEventKind::Disconnected]);
        assert_eq!(s_conn, vec![ConnectionEventKind::Disconnected]);
        let moved = s_dto == vec![(10, DtoStatus::Success)];
        if moved {
            assert_eq!(c_dto, vec![(20, DtoStatus::Success)]);
        } else {
            assert_eq!(s_dto, vec![(10, DtoStatus::Flushed)]);
            let want = if posted {
                vec![(20, DtoStatus::Flushed)]
            } else {
                vec![]
            };
            assert_eq!(c_dto, want);
        }
        close([s, c]);
    });
}

/// Both sides disconnect at once, a receive posted on one and a send
/// queued on the other (waiting for a receive the peer has not got):
/// each side hears `Disconnected` once, and every request completes once,
/// flushed (or, for the receive, taken by the send, both `Success`).
#[test]
fn both_sides_disconnect_at_once() {
    model(|| {
        let (s, c) = connected(5);
        let recv = s.buf.triplet(0, 16).unwrap();
        let send = c.buf.triplet(0, 8).unwrap();
        // The first send takes the receive; the second waits for one.
        s.ep.post_recv(&[recv], 10, CompletionFlags::DEFAULT)
            .unwrap();
        c.ep.post_send(&[send], 20, CompletionFlags::DEFAULT)
            .unwrap();
        c.ep.post_send(&[send], 21, CompletionFlags::DEFAULT)
            .unwrap();
        let c_ep = c.ep.clone();
        let t = thread::spawn(move || c_ep.disconnect(false).unwrap());
        s.ep.disconnect(false).unwrap();
        t.join().unwrap();
        assert_eq!(
            drain(&s.evd),
            (
                vec![(10, DtoStatus::Success)],
                vec![ConnectionEventKind::Disconnected]
            )
        );
        assert_eq!(
            drain(&c.evd),
            (
                vec![(20, DtoStatus::Success), (21, DtoStatus::Flushed)],
                vec![ConnectionEventKind::Disconnected]
            )
        );
        close([s, c]);
    });
}

/// An RDMA write racing the target's disconnect: either it completes
/// `Success` and its bytes are in the target's region, or it is refused
/// or flushed and the region is untouched; never a success without the
/// bytes, nor bytes behind a flush.
#[test]
fn rdma_write_racing_disconnect_moves_all_or_nothing() {
    model(|| {
        let (s, c) = connected(6);
        c.buf.write_at(0, b"written!").unwrap();
        let local = c.buf.triplet(0, 8).unwrap();
        let remote = s.buf.rmr_triplet(4, 8).unwrap();
        let c_ep = c.ep.clone();
        let t = thread::spawn(move || {
            c_ep.post_rdma_write(&[local], remote, 30, CompletionFlags::DEFAULT)
        });
        s.ep.disconnect(false).unwrap();
        let posted = t.join().unwrap().is_ok();
        let (c_dto, c_conn) = drain(&c.evd);
        assert_eq!(c_conn, vec![ConnectionEventKind::Disconnected]);
        let bytes = s.buf.to_vec().unwrap();
        match c_dto.as_slice() {
            [(30, DtoStatus::Success)] => assert_eq!(&bytes[4..12], b"written!"),
            [(30, DtoStatus::Flushed)] => assert_eq!(bytes, vec![0; 16]),
            [] => {
                assert!(!posted, "a posted write completes");
                assert_eq!(bytes, vec![0; 16]);
            }
            other => panic!("unexpected completions {other:?}"),
        }
        assert_eq!(
            drain(&s.evd),
            (vec![], vec![ConnectionEventKind::Disconnected])
        );
        close([s, c]);
    });
}
