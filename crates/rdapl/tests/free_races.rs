//! Frees that race the creation or the rekeying of what they free, on two
//! threads: never do both succeed, and an object freed stays freed (a
//! live endpoint feeding a freed EVD, a live LMR in a freed zone, or a
//! window a rebind brought back after its free would lose events or
//! leave counts wrong). Each case runs its race many times; before the
//! fixes each one saw both succeed in some rounds of a run.

mod common;
use common::*;
use rdapl::evd::EvdProducer;
use rdapl::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Runs `a` (here) and `b` (on another thread) at once, `rounds` times,
/// on fresh objects from `setup`; `check` sees each round's objects and
/// both results and says whether the round went wrong. Returns how many
/// rounds did.
fn race<S: Send + Sync + 'static, A, B: Send + 'static>(
    rounds: usize,
    setup: impl Fn() -> S,
    a: impl Fn(&S) -> A,
    b: impl Fn(&S) -> B + Send + Sync + Clone + 'static,
    mut check: impl FnMut(&S, A, B) -> bool,
) -> usize {
    use std::sync::{Arc, Barrier};
    let mut bad = 0;
    for _ in 0..rounds {
        let s = Arc::new(setup());
        let go = Arc::new(Barrier::new(2));
        let t = {
            let (s, go, b) = (s.clone(), go.clone(), b.clone());
            std::thread::spawn(move || {
                go.wait();
                b(&s)
            })
        };
        go.wait();
        let ra = a(&s);
        let rb = t.join().unwrap();
        if check(&s, ra, rb) {
            bad += 1;
        }
    }
    bad
}

/// Both succeeded (for [`race`]).
fn both<S>(_: &S, a: bool, b: bool) -> bool {
    a && b
}

/// Frees an object made by `make` on another thread while this one gives
/// it a new key (`rekey`), `rounds` times: the number of objects whose
/// free returned `Ok` and that still had a key afterwards (`keyed`; each
/// freed again).
fn revivals<T: Clone + Send + 'static>(
    rounds: usize,
    make: impl Fn() -> T,
    free: fn(&T) -> Result<()>,
    rekey: impl Fn(&T) -> bool,
    keyed: impl Fn(&T) -> bool,
) -> usize {
    use std::sync::{Arc, Barrier};
    let mut back = 0;
    for _ in 0..rounds {
        let obj = make();
        let go = Arc::new(Barrier::new(2));
        let th = {
            let (obj, go) = (obj.clone(), go.clone());
            std::thread::spawn(move || {
                go.wait();
                free(&obj).is_ok()
            })
        };
        go.wait();
        let rekeyed = rekey(&obj);
        let freed = th.join().unwrap();
        assert!(freed || rekeyed, "neither the free nor the new key");
        if freed && keyed(&obj) {
            back += 1;
            let _ = free(&obj);
        }
    }
    back
}

/// Keeps the registration table of `ia` busy (an LMR registered and freed
/// in a loop, in a zone of its own) until the returned guard drops: calls
/// that change the table then wait for its lock, which widens the races
/// below from nanoseconds to the lock's hand-over.
fn hammer_table(ia: &Ia) -> impl Drop {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    struct Stop(Arc<AtomicBool>, Option<std::thread::JoinHandle<()>>);
    impl Drop for Stop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
            if let Some(h) = self.1.take() {
                h.join().unwrap();
            }
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let pz = ia.pz_create().unwrap();
    let h = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let l = pz.lmr_create(Region::zeroed(8), MemPriv::ALL).unwrap();
                l.free().unwrap();
            }
        })
    };
    Stop(stop, Some(h))
}

/// `Pz::free` racing `Pz::lmr_create` on another thread: either the free
/// is refused (`PZ_IN_USE`) or the registration is (`InvalidHandle`);
/// never both succeed, which would leave a live LMR in a freed zone.
#[test]
fn pz_free_racing_lmr_create_never_both_succeed() {
    let ia = open("127.0.250.13");
    let _busy = hammer_table(&ia);
    let bad = race(
        10000,
        || ia.pz_create().unwrap(),
        |pz| pz.lmr_create(Region::zeroed(64), MemPriv::ALL).is_ok(),
        |pz| pz.free().is_ok(),
        both,
    );
    assert_eq!(bad, 0, "rounds with a live LMR in a freed PZ");
}

/// `Evd::free` racing `Ia::ep_create` that names the EVD: never both
/// succeed (an endpoint feeding a freed EVD loses its events).
#[test]
fn evd_free_racing_ep_create_never_both_succeed() {
    let ia = open("127.0.250.14");
    let pz = ia.pz_create().unwrap();
    let bad = race(
        10000,
        || {
            ia.evd_create(8, EvdFlags::DTO | EvdFlags::CONNECTION)
                .unwrap()
        },
        {
            let (ia, pz) = (ia.clone(), pz.clone());
            // (Leaked on purpose: freeing the endpoint would drop the feeder.)
            move |evd: &Evd| match ia.ep_create(&pz, None, Some(evd), Some(evd), None) {
                Ok(ep) => {
                    std::mem::forget(ep);
                    true
                }
                Err(_) => false,
            }
        },
        |evd| evd.free().is_ok(),
        both,
    );
    assert_eq!(bad, 0, "rounds with an endpoint feeding a freed EVD");
}

/// `Rmr::free` racing `Ep::post_rmr_bind` of the same window on another
/// thread: once `free` has returned `Ok`, the window is gone for good: its
/// handle has no context, a second free is refused, and its zone's count
/// of users is not taken twice (the zone can be freed once everything
/// else is).
#[test]
fn rmr_free_racing_bind_leaves_it_freed() {
    let p = std::sync::Arc::new(pair("127.0.250.16", "127.0.250.17", 9004));
    let lmr = p.s.buf(64);
    let t = lmr.triplet(0, 64).unwrap();
    let _busy = hammer_table(&p.s.ia);
    let bind = |rmr: &Rmr| {
        let bound =
            p.s.ep
                .post_rmr_bind(rmr, &lmr, t, MemPriv::REMOTE_WRITE, 1, D);
        if bound.is_ok() {
            next_dto(&p.s.req);
        }
        bound.is_ok()
    };
    let back = revivals(
        5000,
        || p.s.pz.rmr_create().unwrap(),
        Rmr::free,
        bind,
        |r| r.context().is_ok(),
    );
    assert_eq!(back, 0, "freed windows that came back with a key");
}

/// `Lmr::free` of a fast-registration LMR racing `Ep::post_lmr_fmr` of
/// it on another thread: once `free` has returned `Ok`, the LMR has no
/// context and a second free is refused.
#[test]
fn fmr_free_racing_map_leaves_it_freed() {
    let p = pair("127.0.250.18", "127.0.250.19", 9005);
    let _busy = hammer_table(&p.s.ia);
    let map = |fmr: &Lmr| {
        let mapped =
            p.s.ep
                .post_lmr_fmr(fmr, Region::zeroed(64), MemPriv::ALL, 1, D);
        if mapped.is_ok() {
            next_dto(&p.s.req);
        }
        mapped.is_ok()
    };
    let back = revivals(
        5000,
        || p.s.pz.lmr_create_fmr(64).unwrap(),
        Lmr::free,
        map,
        |l| l.context().is_ok(),
    );
    assert_eq!(back, 0, "freed LMRs that came back with a key");
}

/// `Ia::close(Graceful)` racing `Ia::pz_create`: never both succeed (a
/// live zone in a closed IA, which a graceful close promises not to
/// leave).
#[test]
fn ia_graceful_close_racing_pz_create_never_both_succeed() {
    let rounds = 20000;
    let bad = race(
        rounds,
        || open("127.0.251.6"),
        |ia| ia.pz_create(),
        |ia| ia.close(CloseFlags::Graceful).is_ok(),
        |ia, pz, closed| {
            let wrong = pz.is_ok() && closed;
            // (A zone made as its IA closed cannot be freed any more.)
            if let Ok(pz) = pz {
                let _ = pz.free();
            }
            let _ = ia.close(CloseFlags::Abrupt);
            wrong
        },
    );
    assert_eq!(bad, 0, "rounds with a live PZ in a gracefully closed IA");
}

/// `Evd::resize` racing `Evd::free`: once both returned, the EVD is
/// freed for good: it takes no reservation (a freed EVD has queue
/// length 0).
#[test]
fn evd_resize_racing_free_leaves_it_freed() {
    let rounds = 10000;
    let bad = race(
        rounds,
        || sw_evd(8),
        |evd| evd.resize(4096).is_ok(),
        |evd| evd.free().is_ok(),
        |evd, _, freed| {
            assert!(freed);
            evd.reserve().map(|r| evd.release(r).unwrap()).is_ok()
        },
    );
    assert_eq!(bad, 0, "freed EVDs that took a reservation after a resize");
}

/// `Evd::modify_upcall` installing an upcall object racing `Evd::free`:
/// once both returned, the freed EVD holds no upcall object (free breaks
/// that reference; an upcall that holds the EVD would leak both).
#[test]
fn evd_free_racing_modify_upcall_keeps_no_upcall_object() {
    let marker = Arc::new(());
    let rounds = 10000;
    let bad = race(
        rounds,
        || sw_evd(8),
        {
            let marker = marker.clone();
            move |evd: &Evd| {
                let m = marker.clone();
                let up: Arc<dyn Upcall> = Arc::new(move |_: &Evd, _: Option<Event>, _: bool| {
                    let _ = &m;
                });
                evd.modify_upcall(UpcallPolicy::Many, Some(up), ReEnable::OnNew)
                    .is_ok()
            }
        },
        |evd| evd.free().is_ok(),
        |_, _, freed| {
            assert!(freed);
            // Held here and by the closure above: a third is the upcall
            // object the freed EVD kept.
            Arc::strong_count(&marker) > 2
        },
    );
    assert_eq!(bad, 0, "freed EVDs that kept an upcall object");
}

/// `Srq::free` racing `Ia::ep_create_with_srq` naming it: never both
/// succeed (a live endpoint taking its receives from a freed SRQ).
#[test]
fn srq_free_racing_ep_create_never_both_succeed() {
    let n = Node::with("127.0.251.4", None, 64, 64);
    let rounds = 5000;
    let bad = race(
        rounds,
        || n.ia.srq_create(&n.pz, 8, 1).unwrap(),
        |srq| {
            n.ia.ep_create_with_srq(&n.pz, &n.rcv, Some(&n.req), Some(&n.conn), srq, None)
        },
        |srq| srq.free().is_ok(),
        |srq, ep, freed| {
            let wrong = ep.is_ok() && freed;
            if let Ok(ep) = ep {
                ep.free().unwrap();
            }
            let _ = srq.free();
            wrong
        },
    );
    assert_eq!(bad, 0, "rounds with an endpoint on a freed SRQ");
}

/// `Srq::free` racing `Srq::post_recv`: a receive is never accepted into
/// an SRQ whose free returned `Ok` (it would stay there, never matched,
/// never completed).
#[test]
fn srq_free_racing_post_recv_keeps_nothing_in_a_freed_srq() {
    let n = Node::with("127.0.251.5", None, 64, 64);
    let lmr = n.buf(64);
    let t = lmr.triplet(0, 64).unwrap();
    let rounds = 10000;
    let bad = race(
        rounds,
        || n.ia.srq_create(&n.pz, 8, 1).unwrap(),
        move |srq| srq.post_recv(&[t], 1, D).is_ok(),
        |srq| srq.free().is_ok(),
        |srq, posted, freed| posted && freed && !format!("{srq:?}").contains("available: 0"),
    );
    assert_eq!(bad, 0, "rounds that left a receive in a freed SRQ");
}

/// Drains `evd` (events already queued).
fn drain(evd: &Evd) {
    while let Ok(Some(_)) = evd.dequeue() {}
}

/// `Ep::free` racing `Cr::accept` of a request on that endpoint: if both
/// succeed, the endpoint is freed and its connection ended, never a freed
/// endpoint left `Connected` (nor its peer `Connected` to it, not told).
#[test]
fn ep_free_racing_accept_never_leaves_a_freed_ep_connected() {
    let c = Node::with("127.0.251.1", None, 64, 64);
    let s = Node::with("127.0.251.2", None, 64, 64);
    let _psp = s.ia.psp_create(9120, &s.cr).unwrap();
    let rounds = 2000;
    let both = AtomicUsize::new(0);
    let bad = race(
        rounds,
        || {
            drain(&c.conn);
            drain(&s.conn);
            let cep = c.ep2();
            cep.connect(s.ia.address(), 9120, Some(T), b"").unwrap();
            let cr = next_cr(&s.ia, &s.cr);
            (cep, s.ep2(), cr)
        },
        |(_, sep, cr)| cr.accept(sep, b"").is_ok(),
        |(_, sep, _)| sep.free().is_ok(),
        |(cep, sep, _), accepted, freed| {
            let wrong = if accepted && freed {
                both.fetch_add(1, Ordering::Relaxed);
                // Either end still in a connection with a freed endpoint.
                !eventually(QUIET, || {
                    sep.state() != EpState::Connected && cep.state() != EpState::Connected
                })
            } else {
                false
            };
            let _ = cep.disconnect(false);
            let _ = cep.free();
            let _ = sep.free();
            wrong
        },
    );
    eprintln!(
        "accept and free both succeeded in {} of {rounds} rounds",
        both.load(Ordering::Relaxed)
    );
    assert_eq!(bad, 0, "rounds that left a freed endpoint connected");
}

/// `Ep::free` racing `Ia::rsp_create` for that endpoint: never both
/// succeed (an RSP reserved for a freed endpoint takes requests nobody
/// can accept, and keeps its qualifier and IA busy).
#[test]
fn ep_free_racing_rsp_create_never_both_succeed() {
    let s = Node::with("127.0.251.3", None, 64, 64);
    let rounds = 5000;
    let bad = race(
        rounds,
        || s.ep2(),
        |ep| s.ia.rsp_create(9121, ep, &s.cr),
        |ep| ep.free().is_ok(),
        |ep, rsp, freed| {
            let wrong = rsp.is_ok() && freed;
            if let Ok(r) = rsp {
                r.free().unwrap();
            }
            let _ = ep.free();
            wrong
        },
    );
    assert_eq!(bad, 0, "rounds with an RSP reserved for a freed endpoint");
}

/// `Ep::free` racing `Ep::connect`: if both succeed, the attempt is
/// withdrawn: the passive side sees no request from the freed endpoint
/// that stays pending (it could never be accepted).
#[test]
fn ep_free_racing_connect_leaves_no_pending_request() {
    let c = Node::with("127.0.251.8", None, 64, 64);
    let s = Node::with("127.0.251.9", None, 256, 256);
    let _psp = s.ia.psp_create(9123, &s.cr).unwrap();
    let rounds = 3000;
    let bad = race(
        rounds,
        || {
            drain(&c.conn);
            c.ep2()
        },
        |ep| ep.connect(s.ia.address(), 9123, None, b"").is_ok(),
        |ep| ep.free().is_ok(),
        |_, connected, freed| {
            let mut wrong = false;
            // Every request that arrived is settled: pending ones are
            // withdrawn by now (their active endpoint is freed).
            while let Ok(Some(ev)) = s.cr.dequeue() {
                if let Event::ConnectionRequest(a) = ev
                    && let Ok(cr) = s.ia.cr(a.cr)
                {
                    if connected && freed && cr.state() == CrState::Pending {
                        wrong = true;
                    }
                    let _ = cr.reject(b"");
                }
            }
            wrong
        },
    );
    assert_eq!(
        bad, 0,
        "rounds with a request from a freed endpoint left pending"
    );
}

/// Two `Psp::free` calls at once: one succeeds, the other is refused
/// (`InvalidHandle`), as a second free after the first is.
#[test]
fn psp_free_twice_at_once_one_is_refused() {
    let n = Node::with("127.0.251.7", None, 64, 64);
    let rounds = 10000;
    let bad = race(
        rounds,
        || n.ia.psp_create(9122, &n.cr).unwrap(),
        |psp| psp.free().is_ok(),
        |psp| psp.free().is_ok(),
        |_, a, b| a && b,
    );
    assert_eq!(bad, 0, "rounds where both frees succeeded");
}
