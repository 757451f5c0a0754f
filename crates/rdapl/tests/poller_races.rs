//! The poller against lifecycle races. Entries are attached and detached
//! while producers post. EVDs are freed, resized or moved to another
//! poller while attached. Handlers remove each other's entries, drop
//! their poller or free their EVD from inside. Pollers are dropped with
//! runs scheduled. Each case counts what the rules forbid: an event
//! neither handled nor still queued, an event handled twice, a handler
//! run after `remove` returned, a hang, a panic.

mod common;

use common::{LIMIT, QUIET, eventually, sw_evd, sw_value, within};
use rdapl::{Error, Evd, Event, Poller, ReEnable, UpcallPolicy};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// What a handler saw: the values, and the calls made after its entry's
/// `remove` returned (`gone` set).
#[derive(Default)]
struct Log {
    seen: Mutex<Vec<u64>>,
    gone: AtomicBool,
    late: AtomicUsize,
}

impl Log {
    fn handler(self: &Arc<Self>) -> impl FnMut(Event) + Send + 'static {
        let log = self.clone();
        move |ev: Event| {
            if log.gone.load(Ordering::SeqCst) {
                log.late.fetch_add(1, Ordering::SeqCst);
            }
            log.seen.lock().unwrap().push(sw_value(&ev));
        }
    }

    fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

/// Every value of `0..n` appears once in `handled` and `queued` together.
fn exactly_once(n: u64, handled: &[u64], queued: &[u64]) -> bool {
    let mut all: Vec<u64> = handled.iter().chain(queued).copied().collect();
    all.sort_unstable();
    all == (0..n).collect::<Vec<_>>()
}

fn drain(evd: &Evd) -> Vec<u64> {
    let mut v = Vec::new();
    while evd.dequeue_batch(&mut v, 64).unwrap() > 0 {}
    v.iter().map(sw_value).collect()
}

/// One round: `evd` attached to `p`, `n` events posted on another thread
/// while the entry is removed (after a spin that varies with `round`, so
/// that the producer gets more or less far). Returns whether an event was
/// lost or repeated, and the handler calls begun after `remove` returned.
fn remove_racing_posts(p: &Poller, evd: &Evd, n: u64, round: usize) -> (bool, usize) {
    let log = Arc::new(Log::default());
    let entry = p.add(evd, log.handler()).unwrap();
    let go = Arc::new(Barrier::new(2));
    let producer = {
        let (evd, go) = (evd.clone(), go.clone());
        thread::spawn(move || {
            go.wait();
            for v in 0..n {
                evd.post_se(v).unwrap();
            }
        })
    };
    go.wait();
    for _ in 0..(round % 50) * 20 {
        std::hint::spin_loop();
    }
    entry.remove(p).unwrap();
    log.gone.store(true, Ordering::SeqCst);
    producer.join().unwrap();
    thread::sleep(Duration::from_micros(200));
    let handled = log.seen.lock().unwrap().clone();
    let bad = !exactly_once(n, &handled, &drain(evd));
    (bad, log.late.load(Ordering::SeqCst))
}

/// `remove` while a producer posts: what was posted is handled or still
/// queued, once; no handler call begins after `remove` returned.
#[test]
fn remove_racing_posts_loses_and_repeats_nothing() {
    const ROUNDS: usize = 300;
    const N: u64 = 200;
    for mode in [ReEnable::OnNew, ReEnable::Strict, ReEnable::OnAny] {
        let p = common::poller(2, 8, mode);
        let (mut bad, mut late) = (0, 0);
        for round in 0..ROUNDS {
            let (b, l) = remove_racing_posts(&p, &sw_evd(256), N, round);
            bad += usize::from(b);
            late += l;
        }
        assert_eq!(
            (bad, late),
            (0, 0),
            "{mode:?}: rounds with lost or repeated events, handler calls after remove"
        );
    }
}

/// An EVD moved to another poller stays with the new one. Attaching it
/// there while the old entry holds it is either refused, or the old
/// entry's removal must not switch the new entry's notifications off.
#[test]
fn moving_an_evd_to_another_poller_keeps_it_handled() {
    let a = common::poller(1, 8, ReEnable::OnNew);
    let b = common::poller(1, 8, ReEnable::OnNew);
    let evd = sw_evd(64);
    let old = Arc::new(Log::default());
    let new = Arc::new(Log::default());
    let entry_a = a.add(&evd, old.handler()).unwrap();
    evd.post_se(0).unwrap();
    assert!(eventually(LIMIT, || old.count() == 1));
    let entry_b = match b.add(&evd, new.handler()) {
        Ok(e) => {
            entry_a.remove(&a).unwrap();
            e
        }
        Err(Error::InvalidState { .. }) => {
            // The same poller refuses too.
            assert!(a.add(&evd, new.handler()).is_err());
            entry_a.remove(&a).unwrap();
            b.add(&evd, new.handler()).unwrap()
        }
        Err(e) => panic!("{e:?}"),
    };
    evd.post_se(1).unwrap();
    let handled = eventually(Duration::from_secs(2), || new.count() == 1);
    assert!(
        handled,
        "the new poller never handled the event: {} queued, policy {:?}",
        evd.query().unwrap().pending,
        evd.query().unwrap().upcall_policy
    );
    assert_eq!(old.count(), 1);
    // Once detached, the EVD can go back.
    entry_b.remove(&b).unwrap();
    let _again = a.add(&evd, old.handler()).unwrap();
    evd.post_se(2).unwrap();
    assert!(eventually(LIMIT, || old.count() == 2));
}

/// Two handlers on a two-thread poller each remove the other's entry
/// while the other runs: one of the removals may be refused, but neither
/// may hang.
#[test]
fn handlers_removing_each_other_do_not_deadlock() {
    let results = within(LIMIT * 2, "two handlers removing each other", || {
        let p = Arc::new(common::poller(2, 8, ReEnable::OnNew));
        let evds = [sw_evd(8), sw_evd(8)];
        let slots: Arc<[Mutex<Option<rdapl::PollerEntry>>; 2]> =
            Arc::new([Mutex::new(None), Mutex::new(None)]);
        let both_in = Arc::new(Barrier::new(2));
        let results = Arc::new(Mutex::new(Vec::new()));
        for (i, evd) in evds.iter().enumerate() {
            let (p2, slots2, both_in, results) =
                (p.clone(), slots.clone(), both_in.clone(), results.clone());
            let mut fired = false;
            let entry = p
                .add(evd, move |_ev: Event| {
                    if std::mem::replace(&mut fired, true) {
                        return;
                    }
                    both_in.wait();
                    let other = slots2[1 - i].lock().unwrap().take();
                    if let Some(e) = other {
                        let ok = e.remove(&p2).is_ok();
                        results.lock().unwrap().push(ok);
                    }
                })
                .unwrap();
            *slots[i].lock().unwrap() = Some(entry);
        }
        evds[0].post_se(0).unwrap();
        evds[1].post_se(1).unwrap();
        assert!(
            eventually(LIMIT, || results.lock().unwrap().len() == 2),
            "a removal never returned: {:?}",
            results.lock().unwrap()
        );
        results.lock().unwrap().clone()
    });
    assert!(results.iter().any(|ok| *ok), "{results:?}");
}

/// A handler that drops the last handle of its own poller: the drop
/// returns without a panic (a thread cannot join itself), the other EVDs
/// are detached at once, and the handler's own EVD once its run ends.
#[test]
fn dropping_the_poller_from_its_own_handler() {
    let p = common::poller(2, 8, ReEnable::OnNew);
    let evd = sw_evd(8);
    let other = sw_evd(8);
    let holder: Arc<Mutex<Option<Poller>>> = Arc::new(Mutex::new(None));
    let dropped = Arc::new(AtomicBool::new(false));
    let entry = {
        let (holder, dropped) = (holder.clone(), dropped.clone());
        p.add(&evd, move |_ev: Event| {
            let p = holder.lock().unwrap().take();
            drop(p);
            dropped.store(true, Ordering::SeqCst);
        })
        .unwrap()
    };
    let other_log = Arc::new(Log::default());
    let other_entry = p.add(&other, other_log.handler()).unwrap();
    *holder.lock().unwrap() = Some(p);
    evd.post_se(0).unwrap();
    assert!(
        eventually(LIMIT, || dropped.load(Ordering::SeqCst)),
        "the handler never returned from dropping the poller"
    );
    assert_eq!(entry.stats().handler_panics, 0, "{:?}", entry.stats());
    // The other EVD was detached by the drop.
    other.post_se(1).unwrap();
    thread::sleep(QUIET);
    assert_eq!(other_log.count(), 0);
    assert_eq!(other.query().unwrap().pending, 1);
    // The handler's own EVD: detached, and free to attach elsewhere.
    assert!(
        eventually(LIMIT, || evd.query().unwrap().upcall_policy
            == UpcallPolicy::Disable),
        "{:?}",
        evd.query().unwrap()
    );
    evd.post_se(2).unwrap();
    let q = common::poller(1, 8, ReEnable::OnNew);
    let log = Arc::new(Log::default());
    let _again = q.add(&evd, log.handler()).unwrap();
    assert!(eventually(LIMIT, || log.count() == 1));
    drop((entry, other_entry));
}

/// A handler that frees its own EVD, and a free from outside racing the
/// handler: nothing hangs or panics, and the entry still detaches.
#[test]
fn freeing_an_attached_evd_inside_and_outside_the_handler() {
    let p = Arc::new(common::poller(2, 4, ReEnable::OnNew));
    for round in 0..200u64 {
        let evd = sw_evd(64);
        let inside = round % 2 == 0;
        let handled = Arc::new(AtomicU64::new(0));
        let entry = {
            let (evd2, handled) = (evd.clone(), handled.clone());
            p.add(&evd, move |_ev: Event| {
                if handled.fetch_add(1, Ordering::SeqCst) == 3 && inside {
                    evd2.free().unwrap();
                }
            })
            .unwrap()
        };
        for v in 0..20 {
            match evd.post_se(v) {
                Ok(()) | Err(Error::InvalidHandle(_)) => {}
                Err(e) => panic!("{e:?}"),
            }
            if !inside && v == 10 {
                evd.free().unwrap();
            }
        }
        assert!(eventually(LIMIT, || evd.is_freed()));
        let p = p.clone();
        within(LIMIT, "remove after the free", move || {
            entry.remove(&p).unwrap()
        });
    }
}

/// A poller dropped while producers post and runs are scheduled: no
/// handler call after the drop returned, and each event handled or still
/// queued, once.
#[test]
fn dropping_the_poller_while_runs_are_scheduled() {
    const N: u64 = 300;
    let mut bad = 0;
    let mut late = 0;
    for round in 0..100 {
        let p = common::poller(2, 4, ReEnable::OnNew);
        let evds: Vec<Evd> = (0..3).map(|_| sw_evd(512)).collect();
        let logs: Vec<Arc<Log>> = (0..3).map(|_| Arc::new(Log::default())).collect();
        let entries: Vec<_> = evds
            .iter()
            .zip(&logs)
            .map(|(e, l)| p.add(e, l.handler()).unwrap())
            .collect();
        let go = Arc::new(Barrier::new(evds.len() + 1));
        let producers: Vec<_> = evds
            .iter()
            .map(|evd| {
                let (evd, go) = (evd.clone(), go.clone());
                thread::spawn(move || {
                    go.wait();
                    for v in 0..N {
                        evd.post_se(v).unwrap();
                    }
                })
            })
            .collect();
        go.wait();
        thread::sleep(Duration::from_micros((round % 10) * 30));
        drop(p);
        for l in &logs {
            l.gone.store(true, Ordering::SeqCst);
        }
        for h in producers {
            h.join().unwrap();
        }
        thread::sleep(Duration::from_micros(200));
        for (evd, l) in evds.iter().zip(&logs) {
            let handled = l.seen.lock().unwrap().clone();
            if !exactly_once(N, &handled, &drain(evd)) {
                bad += 1;
            }
            late += l.late.load(Ordering::SeqCst);
        }
        drop(entries);
    }
    assert_eq!(
        (bad, late),
        (0, 0),
        "lost or repeated, handled after the drop"
    );
}

/// `resize` while the poller drains: every event handled once, in order.
#[test]
fn resize_while_attached_keeps_every_event() {
    const N: u64 = 5000;
    let p = common::poller(1, 8, ReEnable::OnNew);
    let evd = sw_evd(64);
    let log = Arc::new(Log::default());
    let _entry = p.add(&evd, log.handler()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let resizer = {
        let (evd, stop) = (evd.clone(), stop.clone());
        thread::spawn(move || {
            let mut q = 64;
            while !stop.load(Ordering::SeqCst) {
                q = if q == 64 { 256 } else { 64 };
                let _ = evd.resize(q);
                thread::yield_now();
            }
        })
    };
    let end = Instant::now() + LIMIT;
    for v in 0..N {
        common::post_retry(&evd, v, end);
    }
    let done = eventually(LIMIT, || log.count() == N as usize);
    stop.store(true, Ordering::SeqCst);
    resizer.join().unwrap();
    assert!(
        done,
        "handled {} of {N}, {} queued",
        log.count(),
        evd.query().unwrap().pending
    );
    assert_eq!(*log.seen.lock().unwrap(), (0..N).collect::<Vec<_>>());
}

/// [`remove_racing_posts_loses_and_repeats_nothing`] with the poller as
/// the EVD's dispatch context: the notify upcall runs on a poller thread
/// and the task runs right after it there.
#[test]
fn remove_racing_posts_on_the_pollers_own_dispatch() {
    const ROUNDS: usize = 300;
    const N: u64 = 200;
    let p = common::poller(2, 8, ReEnable::OnNew);
    let (mut bad, mut late) = (0, 0);
    for round in 0..ROUNDS {
        let evd = Evd::builder(256, rdapl::EvdFlags::SOFTWARE)
            .dispatch(p.dispatch())
            .build()
            .unwrap();
        let (b, l) = remove_racing_posts(&p, &evd, N, round);
        bad += usize::from(b);
        late += l;
        evd.free().unwrap();
    }
    assert_eq!(
        (bad, late),
        (0, 0),
        "lost or repeated, handled after remove"
    );
}

/// A handler's removal of its own entry is refused (as documented); the
/// entry, dropped with the refused call, stays attached until the poller
/// goes, and the poller's drop detaches it.
#[test]
fn removing_its_own_entry_from_the_handler_is_refused() {
    let p = Arc::new(common::poller(1, 8, ReEnable::OnNew));
    let evd = sw_evd(16);
    let slot: Arc<Mutex<Option<rdapl::PollerEntry>>> = Arc::new(Mutex::new(None));
    let refused = Arc::new(Mutex::new(None));
    let log = Arc::new(Log::default());
    let entry = {
        let (slot, refused, p2) = (slot.clone(), refused.clone(), Arc::downgrade(&p));
        let mut record = log.handler();
        p.add(&evd, move |ev: Event| {
            record(ev);
            let own = slot.lock().unwrap().take();
            if let (Some(e), Some(p)) = (own, p2.upgrade()) {
                *refused.lock().unwrap() = Some(e.remove(&p));
            }
        })
        .unwrap()
    };
    *slot.lock().unwrap() = Some(entry);
    evd.post_se(0).unwrap();
    assert!(eventually(LIMIT, || refused.lock().unwrap().is_some()));
    let r = refused.lock().unwrap().take().unwrap();
    assert!(matches!(r, Err(Error::InvalidState { .. })), "{r:?}");
    evd.post_se(1).unwrap();
    assert!(eventually(LIMIT, || log.count() == 2), "still attached");
    let p = Arc::try_unwrap(p).unwrap();
    within(LIMIT, "dropping the poller", move || drop(p));
    evd.post_se(2).unwrap();
    thread::sleep(QUIET);
    assert_eq!(log.count(), 2, "handled after the poller's drop");
    assert_eq!(evd.query().unwrap().upcall_policy, UpcallPolicy::Disable);
}

/// An entry dropped while its poller is dropped on another thread, and
/// the EVD attached to a second poller as soon as it is free: the
/// second of the two detaches must not switch the new entry off.
#[test]
fn reattaching_while_entry_and_poller_drop_together() {
    const ROUNDS: usize = 400;
    let q = Arc::new(common::poller(1, 8, ReEnable::OnNew));
    let mut dead = 0;
    for _ in 0..ROUNDS {
        let p = common::poller(1, 8, ReEnable::OnNew);
        let evd = sw_evd(8);
        let entry = p.add(&evd, |_ev: Event| {}).unwrap();
        let go = Arc::new(Barrier::new(3));
        let dropper = {
            let go = go.clone();
            thread::spawn(move || {
                go.wait();
                drop(p);
            })
        };
        let adder = {
            let (go, q, evd) = (go.clone(), q.clone(), evd.clone());
            thread::spawn(move || {
                go.wait();
                let log = Arc::new(Log::default());
                let end = Instant::now() + LIMIT;
                loop {
                    match q.add(&evd, log.handler()) {
                        Ok(e) => return (e, log),
                        Err(Error::InvalidState { .. }) if Instant::now() < end => {
                            thread::yield_now()
                        }
                        Err(e) => panic!("{e:?}"),
                    }
                }
            })
        };
        go.wait();
        drop(entry);
        dropper.join().unwrap();
        let (new_entry, log) = adder.join().unwrap();
        evd.post_se(1).unwrap();
        if !eventually(Duration::from_millis(500), || log.count() == 1) {
            dead += 1;
        }
        drop(new_entry);
    }
    assert_eq!(dead, 0, "rounds whose new entry was switched off");
}

/// One EVD attached and removed again and again, alternating between two
/// pollers, while a producer posts all along: every event is handled
/// once or left queued, and none is handled by an entry already removed.
#[test]
fn attach_detach_rounds_on_one_evd_racing_a_producer() {
    const ROUNDS: usize = 1500;
    for mode in [ReEnable::OnNew, ReEnable::Strict, ReEnable::OnAny] {
        let pollers = [common::poller(2, 4, mode), common::poller(1, 16, mode)];
        let evd = sw_evd(256);
        let stop = Arc::new(AtomicBool::new(false));
        let count = Arc::new(AtomicU64::new(0));
        let producer = {
            let (evd, stop, count) = (evd.clone(), stop.clone(), count.clone());
            thread::spawn(move || {
                let mut v = 0;
                while !stop.load(Ordering::Relaxed) {
                    match evd.post_se(v) {
                        Ok(()) => {
                            v += 1;
                            count.store(v, Ordering::Relaxed);
                        }
                        Err(Error::QueueFull) => thread::yield_now(),
                        Err(e) => panic!("{e:?}"),
                    }
                }
                v
            })
        };
        let mut logs = Vec::new();
        // Enough rounds, and enough posts among them (bounded in time).
        let end = Instant::now() + Duration::from_secs(2);
        let mut round = 0;
        while round < ROUNDS || (count.load(Ordering::Relaxed) < 20_000 && Instant::now() < end) {
            let p = &pollers[round % 2];
            let log = Arc::new(Log::default());
            let entry = p.add(&evd, log.handler()).unwrap();
            for _ in 0..(round % 7) * 100 {
                std::hint::spin_loop();
            }
            entry.remove(p).unwrap();
            log.gone.store(true, Ordering::SeqCst);
            logs.push(log);
            round += 1;
        }
        stop.store(true, Ordering::Relaxed);
        let posted = producer.join().unwrap();
        let mut handled = Vec::new();
        let mut late = 0;
        for l in &logs {
            handled.extend(l.seen.lock().unwrap().iter().copied());
            late += l.late.load(Ordering::SeqCst);
        }
        let queued = drain(&evd);
        assert!(
            exactly_once(posted, &handled, &queued),
            "{mode:?}: {} handled + {} queued of {posted}",
            handled.len(),
            queued.len()
        );
        assert_eq!(late, 0, "{mode:?}: handled after remove");
    }
}
