//! Which threads the library starts, and when: none for an application that
//! only polls; the loopback fabric's timer once one of its connections can
//! exist; the default dispatcher's threads once an upcall is enabled.
//!
//! One test in this binary, so that no other test starts a thread first.

mod common;

use common::*;
use rdapl::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// This process's threads: id and name (as the kernel keeps it: at most
/// 15 bytes; a new thread shows its creator's name until it sets its own).
fn threads() -> Vec<(u32, String)> {
    let mut v: Vec<(u32, String)> = std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|t| {
            let t = t.ok()?;
            let id = t.file_name().to_str()?.parse().ok()?;
            let name = std::fs::read_to_string(t.path().join("comm")).ok()?;
            Some((id, name.trim_end().to_string()))
        })
        .collect();
    v.sort();
    v
}

/// The threads not in `before`, once each has a name starting with
/// `prefix` (waits for them to set it, for at most [`T`]).
fn new_threads(before: &[(u32, String)], prefix: &str) -> Vec<(u32, String)> {
    let end = Instant::now() + T;
    loop {
        let new: Vec<_> = threads()
            .into_iter()
            .filter(|(id, _)| before.iter().all(|(b, _)| b != id))
            .collect();
        if new.iter().all(|(_, n)| n.starts_with(prefix)) || Instant::now() >= end {
            return new;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

const DISPATCH: &str = "rdapl-dispatch-";
const TIMER: &str = "rdapl-loopback-";

#[test]
fn threads_start_when_first_needed() {
    let first = threads();
    // Polling alone: EVDs on the default dispatcher, events in and out.
    let evd = sw_evd(16);
    for i in 0..8 {
        evd.post_se(i).unwrap();
    }
    for i in 0..8 {
        assert_eq!(evd.dequeue().unwrap().map(|e| sw_value(&e)), Some(i));
    }
    let ia = Ia::open("loopback").unwrap();
    let _pz = ia.pz_create().unwrap();
    let start = threads();
    let ids = |v: &[(u32, String)]| v.iter().map(|t| t.0).collect::<Vec<_>>();
    assert_eq!(
        ids(&first),
        ids(&start),
        "polling started threads: {first:?} then {start:?}"
    );

    // A loopback connection: the fabric's timer (connect timeouts,
    // receiver-not-ready waits) runs; still no dispatcher.
    let p = pair("127.0.0.61", "127.0.0.62", 61);
    let timer = new_threads(&start, TIMER);
    assert!(
        timer.len() == 1 && timer[0].1.starts_with(TIMER),
        "a connection started {timer:?}"
    );
    let connected = threads();

    // An upcall enabled on an EVD of the default dispatcher starts its
    // two threads, and they deliver.
    let seen = Arc::new(AtomicU64::new(0));
    let s2 = seen.clone();
    evd.modify_upcall(
        UpcallPolicy::SingleInstance,
        Some(upcall(move |_, ev, _| {
            if ev.is_some() {
                s2.fetch_add(1, Ordering::SeqCst);
            }
        })),
        ReEnable::Strict,
    )
    .unwrap();
    let dispatch = new_threads(&connected, DISPATCH);
    assert!(
        dispatch.len() == 2 && dispatch.iter().all(|(_, n)| n.starts_with(DISPATCH)),
        "enabling an upcall started {dispatch:?}"
    );
    evd.post_se(99).unwrap();
    let end = Instant::now() + T;
    while seen.load(Ordering::SeqCst) == 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(seen.load(Ordering::SeqCst), 1, "the upcall did not run");
    assert_eq!(new_threads(&connected, DISPATCH).len(), 2);
    drop(p);
}
