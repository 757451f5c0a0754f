//! Frees that race the creation or the rekeying of what they free, on two
//! threads: never do both succeed, and an object freed stays freed (a
//! live endpoint feeding a freed EVD, a live LMR in a freed zone, or a
//! window a rebind brought back after its free would lose events or
//! leave counts wrong). Each case runs its race many times; before the
//! fixes each one saw both succeed in some rounds of a run.

mod common;
use common::*;
use rdapl::*;

/// Runs `a` and `b` at once, `rounds` times, on fresh objects from
/// `setup`; returns how many rounds saw both succeed.
fn race<S: Send + Sync + 'static>(
    rounds: usize,
    setup: impl Fn() -> S,
    a: impl Fn(&S) -> bool,
    b: impl Fn(&S) -> bool + Send + Sync + Clone + 'static,
) -> usize {
    use std::sync::{Arc, Barrier};
    let mut both = 0;
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
        if ra && rb {
            both += 1;
        }
    }
    both
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
    let both = race(
        10000,
        || ia.pz_create().unwrap(),
        |pz| pz.lmr_create(Region::zeroed(64), MemPriv::ALL).is_ok(),
        |pz| pz.free().is_ok(),
    );
    assert_eq!(both, 0, "rounds with a live LMR in a freed PZ");
}

/// `Evd::free` racing `Ia::ep_create` that names the EVD: never both
/// succeed (an endpoint feeding a freed EVD loses its events).
#[test]
fn evd_free_racing_ep_create_never_both_succeed() {
    let ia = open("127.0.250.14");
    let pz = ia.pz_create().unwrap();
    let both = race(
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
    );
    assert_eq!(both, 0, "rounds with an endpoint feeding a freed EVD");
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
    let mut resurrected = 0;
    let rounds = 5000;
    for _ in 0..rounds {
        let rmr = p.s.pz.rmr_create().unwrap();
        let go = std::sync::Arc::new(std::sync::Barrier::new(2));
        let th = {
            let (rmr, go) = (rmr.clone(), go.clone());
            std::thread::spawn(move || {
                go.wait();
                rmr.free().is_ok()
            })
        };
        go.wait();
        let bound =
            p.s.ep
                .post_rmr_bind(&rmr, &lmr, t, MemPriv::REMOTE_WRITE, 1, D);
        let freed = th.join().unwrap();
        if bound.is_ok() {
            next_dto(&p.s.req);
        }
        assert!(freed || bound.is_ok());
        if freed && rmr.context().is_ok() {
            resurrected += 1;
            // Free it again so the zone's count is right (if it can be).
            let _ = rmr.free();
        }
    }
    assert_eq!(resurrected, 0, "freed windows that came back with a key");
}

/// `Lmr::free` of a fast-registration LMR racing `Ep::post_lmr_fmr` of
/// it on another thread: once `free` has returned `Ok`, the LMR has no
/// context and a second free is refused.
#[test]
fn fmr_free_racing_map_leaves_it_freed() {
    let p = pair("127.0.250.18", "127.0.250.19", 9005);
    let _busy = hammer_table(&p.s.ia);
    let rounds = 5000;
    let mut resurrected = 0;
    for _ in 0..rounds {
        let fmr = p.s.pz.lmr_create_fmr(64).unwrap();
        let go = std::sync::Arc::new(std::sync::Barrier::new(2));
        let th = {
            let (fmr, go) = (fmr.clone(), go.clone());
            std::thread::spawn(move || {
                go.wait();
                fmr.free().is_ok()
            })
        };
        go.wait();
        let mapped =
            p.s.ep
                .post_lmr_fmr(&fmr, Region::zeroed(64), MemPriv::ALL, 1, D);
        let freed = th.join().unwrap();
        if mapped.is_ok() {
            next_dto(&p.s.req);
        }
        assert!(freed || mapped.is_ok());
        if freed && fmr.context().is_ok() {
            resurrected += 1;
            let _ = fmr.free();
        }
    }
    assert_eq!(resurrected, 0, "freed LMRs that came back with a key");
}
