//! Robustness: a panicking upcall does not wedge its EVD.

mod common;

use common::{LIMIT, eventually, sw_evd, upcall};
use rdapl::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

#[test]
fn panicking_upcall_is_caught_and_delivery_goes_on() {
    let evd = sw_evd(16);
    let seen = Arc::new(AtomicUsize::new(0));
    let s2 = seen.clone();
    let up = upcall(move |_, ev, _| {
        s2.fetch_add(1, Ordering::SeqCst);
        if ev == Some(Event::Software(1)) {
            panic!("consumer bug in the upcall (expected by this test)");
        }
    });
    evd.modify_upcall(UpcallPolicy::SingleInstance, Some(up), ReEnable::Strict)
        .unwrap();
    evd.post_se(1).unwrap();
    evd.post_se(2).unwrap();
    eventually(LIMIT, || seen.load(Ordering::SeqCst) >= 2);
    assert_eq!(
        seen.load(Ordering::SeqCst),
        2,
        "the event after the panic was delivered"
    );
    // Teardown returns (no upcall is stuck "in progress").
    evd.modify_upcall(UpcallPolicy::Teardown, None, ReEnable::OnNew)
        .unwrap();
    assert_eq!(evd.query().unwrap().upcall_panics, 1);
}

/// Growing an EVD (`resize` above its storage capacity moves producers to a
/// new ring) while two producers post and a single-instance upcall and a
/// waiter-free poller consume: every event is delivered exactly once and
/// each producer's events in order, on both sides of every ring change.
#[test]
fn resize_while_producing_and_consuming_loses_nothing() {
    use std::sync::Mutex;
    use std::time::Instant;
    const PER: u64 = 20_000;
    let evd = sw_evd(8);
    let seen = Arc::new(Mutex::new(Vec::with_capacity(2 * PER as usize)));
    let s2 = seen.clone();
    let up = upcall(move |_, ev, _| {
        if let Some(Event::Software(v)) = ev {
            s2.lock().unwrap().push(v);
        }
    });
    evd.modify_upcall(UpcallPolicy::SingleInstance, Some(up), ReEnable::Strict)
        .unwrap();
    let deadline = Instant::now() + LIMIT;
    // Producers go on until every resize is done (and at least PER each),
    // so the ring changes happen under load.
    let resized = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producers: Vec<_> = (0..2u64)
        .map(|p| {
            let (evd, resized) = (evd.clone(), resized.clone());
            std::thread::spawn(move || {
                let mut i = 0;
                while i < PER || !resized.load(Ordering::SeqCst) {
                    while evd.post_se(p << 32 | i).is_err() {
                        assert!(Instant::now() < deadline, "producer stuck on a full EVD");
                        std::thread::yield_now();
                    }
                    i += 1;
                }
                i
            })
        })
        .collect();
    for qlen in [16, 64, 256, 1024, 4096] {
        std::thread::sleep(std::time::Duration::from_millis(1));
        evd.resize(qlen).unwrap();
    }
    resized.store(true, Ordering::SeqCst);
    let total: u64 = producers.into_iter().map(|h| h.join().unwrap()).sum();
    eventually(LIMIT, || seen.lock().unwrap().len() as u64 >= total);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len() as u64, total, "exactly once");
    let mut next = [0u64; 2];
    for v in seen.iter() {
        let (p, i) = ((v >> 32) as usize, v & 0xFFFF_FFFF);
        assert_eq!(i, next[p], "producer {p}'s events in order");
        next[p] += 1;
    }
    assert_eq!(evd.query().unwrap().pending, 0);
    assert_eq!(evd.query().unwrap().occupied, 0);
}
