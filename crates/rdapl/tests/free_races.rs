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
