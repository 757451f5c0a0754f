//! Model checking of the EVD and CNO protocols with loom.
//!
//! Run with:
//!
//! ```text
//! RUSTFLAGS="--cfg rdapl_loom" cargo test -p rdapl-core --test loom_evd --release
//! ```
//!
//! Each model explores every interleaving (within `LOOM_MAX_PREEMPTIONS`,
//! default 2 here) of the scenario listed in section 7 of the EVD contract
//! and asserts: every event delivered exactly once, nothing stranded on an
//! EVD whose upcalls are enabled (the lost wakeup), at most one
//! single-instance upcall at a time, and no hang (loom reports a deadlock if
//! every thread blocks).
#![cfg(rdapl_loom)]

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;
use rdapl_core::evd::EvdProducer;
use rdapl_core::{
    Cno, Dispatch, DispatchRun, DtoCompletion, DtoOp, DtoStatus, Evd, EvdFlags, Event, ReEnable,
    Upcall, UpcallPolicy, event::EpHandle,
};
use std::collections::VecDeque;

/// A dispatch context for models: one loom thread executing runs in order.
#[derive(Default)]
struct ModelDispatch {
    q: Mutex<(VecDeque<DispatchRun>, bool)>,
    cv: Condvar,
}

impl Dispatch for ModelDispatch {
    fn schedule(&self, run: DispatchRun) {
        self.q.lock().unwrap().0.push_back(run);
        self.cv.notify_one();
    }
}

struct DispatchThread {
    d: Arc<ModelDispatch>,
    h: thread::JoinHandle<()>,
}

impl DispatchThread {
    fn start() -> (Arc<dyn Dispatch>, DispatchThread) {
        let d = Arc::new(ModelDispatch::default());
        let d2 = d.clone();
        let h = thread::spawn(move || {
            loop {
                let run = {
                    let mut g = d2.q.lock().unwrap();
                    loop {
                        if let Some(r) = g.0.pop_front() {
                            break Some(r);
                        }
                        if g.1 {
                            break None;
                        }
                        g = d2.cv.wait(g).unwrap();
                    }
                };
                match run {
                    Some(r) => r.run(),
                    None => return,
                }
            }
        });
        let dyn_d: Arc<dyn Dispatch> = as_dyn_dispatch(d.clone());
        (dyn_d, DispatchThread { d, h })
    }

    /// Executes every run still queued, then stops the thread.
    fn finish(self) {
        self.d.q.lock().unwrap().1 = true;
        self.d.cv.notify_one();
        self.h.join().unwrap();
    }
}

fn as_dyn_dispatch(d: Arc<ModelDispatch>) -> Arc<dyn Dispatch> {
    // loom's Arc cannot coerce to a trait object; go through std's.
    let std_arc: std::sync::Arc<dyn Dispatch> = std::sync::Arc::new(Forward(d));
    Arc::from_std(std_arc)
}

struct Forward(Arc<ModelDispatch>);
impl Dispatch for Forward {
    fn schedule(&self, run: DispatchRun) {
        self.0.schedule(run)
    }
}

fn upcall(f: impl Fn(&Evd, Option<Event>, bool) + Send + Sync + 'static) -> Arc<dyn Upcall> {
    let std_arc: std::sync::Arc<dyn Upcall> = std::sync::Arc::new(f);
    Arc::from_std(std_arc)
}

fn dto(producer: u64, seq: u64) -> Event {
    Event::Dto(DtoCompletion {
        ep: EpHandle(producer),
        consumer_context: 0,
        cookie: seq,
        status: DtoStatus::Success,
        transferred_length: 0,
        operation: DtoOp::Send,
        rmr_context: 0,
        buf: None,
    })
}

fn produce(evd: &Evd, producer: u64, seq: u64) {
    let res = evd.reserve().expect("capacity");
    evd.complete(res, dto(producer, seq)).unwrap();
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(2);
    }
    b.check(f);
}

/// Sorted list of delivered (producer, seq) pairs.
#[derive(Default)]
struct Seen(Mutex<Vec<(u64, u64)>>);
impl Seen {
    fn add(&self, ev: &Event) {
        let d = ev.as_dto().expect("dto");
        self.0.lock().unwrap().push((d.ep.0, d.cookie));
    }
    fn sorted(&self) -> Vec<(u64, u64)> {
        let mut v = self.0.lock().unwrap().clone();
        v.sort();
        v
    }
}

/// Producer vs. the consumer's drain-and-re-enable, in one re-enable mode.
fn producer_vs_reenable(mode: ReEnable) {
    model(move || {
        let (d, dt) = DispatchThread::start();
        let seen = Arc::new(Seen::default());
        let s2 = seen.clone();
        // Odd while a re-enable call is in flight: an upcall records the
        // value it sees, so a Strict call that was refused can be checked
        // not to have let an upcall through meanwhile.
        let calls = Arc::new(AtomicUsize::new(0));
        let upcall_saw = Arc::new(Mutex::new(Vec::new()));
        let (c2, saw2) = (calls.clone(), upcall_saw.clone());
        let evd = Evd::builder(4, EvdFlags::DTO).dispatch(d).build().unwrap();
        // The consumer has disabled upcalls and is polling.
        evd.modify_upcall(
            UpcallPolicy::Disable,
            Some(upcall(move |_, ev, _| {
                saw2.lock().unwrap().push(c2.load(Ordering::SeqCst));
                s2.add(&ev.expect("event"))
            })),
            ReEnable::OnNew,
        )
        .unwrap();
        let p = {
            let evd = evd.clone();
            thread::spawn(move || produce(&evd, 1, 0))
        };
        // Drain, then try to re-enable; follow the mode's rule.
        loop {
            while let Some(ev) = evd.dequeue().unwrap() {
                seen.add(&ev);
            }
            let call = calls.fetch_add(1, Ordering::SeqCst) + 1;
            let r = evd.modify_upcall(UpcallPolicy::SingleInstance, None, mode);
            calls.fetch_add(1, Ordering::SeqCst);
            match r {
                Ok(0) => break,
                Ok(_) if mode == ReEnable::OnNew => continue, // missed events: poll again
                Ok(_) => break,                               // OnAny: upcalls deliver them
                Err(rdapl_core::Error::Busy { pending }) => {
                    assert_eq!(mode, ReEnable::Strict);
                    assert!(pending > 0);
                    let q = evd.query().unwrap();
                    assert_eq!(
                        q.upcall_policy,
                        UpcallPolicy::Disable,
                        "Strict stays disabled"
                    );
                    assert!(
                        !upcall_saw.lock().unwrap().contains(&call),
                        "an upcall ran during a Strict re-enable that was refused"
                    );
                    continue;
                }
                Err(e) => panic!("unexpected {e:?}"),
            }
        }
        p.join().unwrap();
        dt.finish();
        // Upcalls are enabled: nothing may be left on the EVD.
        assert_eq!(
            evd.query().unwrap().pending,
            0,
            "lost wakeup: event stranded"
        );
        assert_eq!(seen.sorted(), vec![(1, 0)], "exactly once");
    });
}

#[test]
fn producer_vs_reenable_strict() {
    producer_vs_reenable(ReEnable::Strict);
}

#[test]
fn producer_vs_reenable_on_any() {
    producer_vs_reenable(ReEnable::OnAny);
}

#[test]
fn producer_vs_reenable_on_new() {
    producer_vs_reenable(ReEnable::OnNew);
}

/// Producer vs. the end of a single-instance upcall: the event that arrives
/// while the upcall returns is delivered, and upcalls never overlap.
#[test]
fn producer_vs_end_of_single_instance_upcall() {
    model(|| {
        let (d, dt) = DispatchThread::start();
        let seen = Arc::new(Seen::default());
        let inside = Arc::new(AtomicUsize::new(0));
        let (s2, in2) = (seen.clone(), inside.clone());
        let evd = Evd::builder(4, EvdFlags::DTO)
            .dispatch(d)
            .upcall(
                UpcallPolicy::SingleInstance,
                upcall(move |_, ev, _| {
                    assert_eq!(in2.fetch_add(1, Ordering::SeqCst), 0, "overlapping upcalls");
                    s2.add(&ev.expect("event"));
                    in2.fetch_sub(1, Ordering::SeqCst);
                }),
            )
            .build()
            .unwrap();
        produce(&evd, 1, 0);
        let p = {
            let evd = evd.clone();
            thread::spawn(move || produce(&evd, 2, 0))
        };
        p.join().unwrap();
        dt.finish();
        assert_eq!(evd.query().unwrap().pending, 0, "event left behind");
        assert_eq!(seen.sorted(), vec![(1, 0), (2, 0)]);
    });
}

/// Teardown vs. a running upcall: when Teardown returns no upcall runs and
/// none starts later; the event is delivered by upcall or stays queued.
#[test]
fn teardown_vs_running_upcall() {
    model(|| {
        let (d, dt) = DispatchThread::start();
        let seen = Arc::new(Seen::default());
        let torn = Arc::new(AtomicBool::new(false));
        let running = Arc::new(AtomicBool::new(false));
        let (s2, t2, r2) = (seen.clone(), torn.clone(), running.clone());
        let evd = Evd::builder(4, EvdFlags::DTO)
            .dispatch(d)
            .upcall(
                UpcallPolicy::SingleInstance,
                upcall(move |_, ev, _| {
                    assert!(
                        !t2.load(Ordering::SeqCst),
                        "upcall started after Teardown returned"
                    );
                    r2.store(true, Ordering::SeqCst);
                    s2.add(&ev.expect("event"));
                    r2.store(false, Ordering::SeqCst);
                }),
            )
            .build()
            .unwrap();
        let p = {
            let evd = evd.clone();
            thread::spawn(move || produce(&evd, 1, 0))
        };
        evd.modify_upcall(UpcallPolicy::Teardown, None, ReEnable::OnNew)
            .unwrap();
        assert!(
            !running.load(Ordering::SeqCst),
            "Teardown returned while an upcall ran"
        );
        torn.store(true, Ordering::SeqCst);
        p.join().unwrap();
        dt.finish();
        while let Some(ev) = evd.dequeue().unwrap() {
            seen.add(&ev);
        }
        assert_eq!(seen.sorted(), vec![(1, 0)], "exactly once");
    });
}

/// A waiter at threshold 2 vs. two producers: it wakes exactly when the
/// second event lands and never sleeps past it.
#[test]
fn waiter_vs_producer_at_threshold() {
    model(|| {
        let evd = Evd::builder(4, EvdFlags::DTO)
            .dispatch(DispatchThread::start_noop())
            .build()
            .unwrap();
        let ps: Vec<_> = (1..=2)
            .map(|i| {
                let evd = evd.clone();
                thread::spawn(move || produce(&evd, i, 0))
            })
            .collect();
        let (ev, nmore) = evd.wait(None, 2).unwrap();
        assert_eq!(nmore, 1);
        let other = evd.dequeue().unwrap().expect("second event");
        for p in ps {
            p.join().unwrap();
        }
        let mut got = vec![ev.as_dto().unwrap().ep.0, other.as_dto().unwrap().ep.0];
        got.sort();
        assert_eq!(got, vec![1, 2]);
    });
}

impl DispatchThread {
    /// A dispatch context for models that never schedule a run.
    fn start_noop() -> Arc<dyn Dispatch> {
        struct Never;
        impl Dispatch for Never {
            fn schedule(&self, _run: DispatchRun) {
                panic!("no upcall is enabled in this model");
            }
        }
        let std_arc: std::sync::Arc<dyn Dispatch> = std::sync::Arc::new(Never);
        Arc::from_std(std_arc)
    }
}

/// CNO trigger vs. CNO wait: two EVDs feed one CNO; the consumer waits and
/// drains both until it has seen both events. A coalesced trigger must not
/// hide an event (loom would report the consumer blocked forever).
#[test]
fn cno_trigger_vs_wait() {
    model(|| {
        let cno = Cno::new();
        let noop = DispatchThread::start_noop();
        let a = Evd::builder(2, EvdFlags::DTO)
            .dispatch(noop.clone())
            .cno(&cno)
            .build()
            .unwrap();
        let b = Evd::builder(2, EvdFlags::DTO)
            .dispatch(noop)
            .cno(&cno)
            .build()
            .unwrap();
        let pa = {
            let a = a.clone();
            thread::spawn(move || produce(&a, 1, 0))
        };
        let pb = {
            let b = b.clone();
            thread::spawn(move || produce(&b, 2, 0))
        };
        let mut seen = 0;
        while seen < 2 {
            let hint = cno.wait(None).unwrap();
            assert!(hint == a.handle() || hint == b.handle());
            while a.dequeue().unwrap().is_some() {
                seen += 1;
            }
            while b.dequeue().unwrap().is_some() {
                seen += 1;
            }
        }
        assert_eq!(seen, 2);
        pa.join().unwrap();
        pb.join().unwrap();
    });
}

/// The poller's re-arm: notify-only upcall re-armed with OnNew while a
/// producer posts. Either the re-arm reports the event as pending or the
/// producer's arrival fires the notification.
#[test]
fn notify_rearm_vs_producer() {
    model(|| {
        let (d, dt) = DispatchThread::start();
        let notified = Arc::new(AtomicUsize::new(0));
        let n2 = notified.clone();
        let evd = Evd::builder(4, EvdFlags::DTO).dispatch(d).build().unwrap();
        evd.modify_upcall(
            UpcallPolicy::Disable,
            Some(upcall(move |_, ev, _| {
                assert!(ev.is_none(), "notify-only carries no event");
                n2.fetch_add(1, Ordering::SeqCst);
            })),
            ReEnable::OnNew,
        )
        .unwrap();
        let p = {
            let evd = evd.clone();
            thread::spawn(move || produce(&evd, 1, 0))
        };
        let pending = evd
            .modify_upcall(UpcallPolicy::NotifyOnly, None, ReEnable::OnNew)
            .unwrap();
        p.join().unwrap();
        dt.finish();
        let n = notified.load(Ordering::SeqCst);
        assert!(
            pending > 0 || n == 1,
            "event arrived, nobody told (pending {pending}, notified {n})"
        );
        assert!(n <= 1, "notify-only fired twice");
    });
}

/// Many policy with a one-thread dispatch context vs. two producers: both
/// delivered, nothing stranded.
#[test]
fn many_policy_two_producers() {
    model(|| {
        let (d, dt) = DispatchThread::start();
        let seen = Arc::new(Seen::default());
        let s2 = seen.clone();
        let evd = Evd::builder(4, EvdFlags::DTO)
            .dispatch(d)
            .upcall(
                UpcallPolicy::Many,
                upcall(move |_, ev, _| s2.add(&ev.expect("event"))),
            )
            .build()
            .unwrap();
        let ps: Vec<_> = (1..=2)
            .map(|i| {
                let evd = evd.clone();
                thread::spawn(move || produce(&evd, i, 0))
            })
            .collect();
        for p in ps {
            p.join().unwrap();
        }
        dt.finish();
        assert_eq!(evd.query().unwrap().pending, 0);
        assert_eq!(seen.sorted(), vec![(1, 0), (2, 0)]);
    });
}

/// Notify-only re-armed while its previous notification's upcall is still
/// running (the poller's pattern): an event that arrives after the re-arm
/// must be notified, or the re-arm must report it pending.
#[test]
fn notify_rearm_while_upcall_runs_vs_producer() {
    model(|| {
        let (d, dt) = DispatchThread::start();
        let notified = Arc::new(AtomicUsize::new(0));
        let n2 = notified.clone();
        let evd = Evd::builder(4, EvdFlags::DTO).dispatch(d).build().unwrap();
        // The notified consumer drains the EVD (here, inside the upcall).
        evd.modify_upcall(
            UpcallPolicy::NotifyOnly,
            Some(upcall(move |evd, _, _| {
                n2.fetch_add(1, Ordering::SeqCst);
                while evd.dequeue().unwrap().is_some() {}
            })),
            ReEnable::OnNew,
        )
        .unwrap();
        // e1 fires the first notification (its run may still be in the upcall).
        produce(&evd, 1, 0);
        let p = {
            let evd = evd.clone();
            thread::spawn(move || produce(&evd, 2, 0))
        };
        // The consumer drains what it can see and re-arms.
        let mut got = 0;
        while evd.dequeue().unwrap().is_some() {
            got += 1;
        }
        let pending = evd
            .modify_upcall(UpcallPolicy::NotifyOnly, None, ReEnable::OnNew)
            .unwrap();
        p.join().unwrap();
        dt.finish();
        let n = notified.load(Ordering::SeqCst);
        let left = evd.query().unwrap().pending;
        // Every event still queued was reported at the re-arm (else a
        // notification after its arrival drained it).
        assert!(
            left == 0 || pending > 0,
            "stranded: {left} queued, pending {pending}, notified {n}, drained {got}"
        );
    });
}

/// Growing the EVD (`resize` above its storage capacity links a new ring
/// and closes the old one) vs. a producer and a single-instance upcall: the
/// events on both sides of the ring change are delivered exactly once, in
/// order, and none is stranded in the closed ring.
#[test]
fn grow_vs_producer_vs_upcall() {
    model(|| {
        let (d, dt) = DispatchThread::start();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        let evd = Evd::builder(2, EvdFlags::DTO)
            .dispatch(d)
            .upcall(
                UpcallPolicy::SingleInstance,
                upcall(move |_, ev, _| {
                    let d = ev.expect("event");
                    s2.lock().unwrap().push(d.as_dto().expect("dto").cookie);
                }),
            )
            .build()
            .unwrap();
        produce(&evd, 1, 0);
        let p = {
            let evd = evd.clone();
            thread::spawn(move || produce(&evd, 1, 1))
        };
        evd.resize(4).unwrap();
        p.join().unwrap();
        // Into the new ring, possibly while the upcall drains the old one.
        produce(&evd, 1, 2);
        dt.finish();
        assert_eq!(evd.query().unwrap().pending, 0, "event left behind");
        assert_eq!(
            *seen.lock().unwrap(),
            vec![0, 1, 2],
            "exactly once, in order"
        );
    });
}

/// A `Strict` re-enable of the policy already in force, refused because
/// events are queued, vs. the dispatch run delivering them (issue 18,
/// defect 1): while the re-enable holds the policy back, the run may see
/// "not delivering" and end; the re-enable must then schedule what the
/// queue needs, or the backlog is stranded with upcalls on.
#[test]
fn refused_strict_reenable_vs_running_delivery() {
    model(|| {
        let (d, dt) = DispatchThread::start();
        let seen = Arc::new(Seen::default());
        let s2 = seen.clone();
        let evd = Evd::builder(4, EvdFlags::DTO)
            .dispatch(d)
            .upcall(
                UpcallPolicy::SingleInstance,
                upcall(move |_, ev, _| s2.add(&ev.expect("event"))),
            )
            .build()
            .unwrap();
        produce(&evd, 1, 0);
        produce(&evd, 1, 1);
        match evd.modify_upcall(UpcallPolicy::SingleInstance, None, ReEnable::Strict) {
            Ok(0) | Err(rdapl_core::Error::Busy { .. }) => {}
            other => panic!("unexpected {other:?}"),
        }
        dt.finish();
        assert_eq!(
            evd.query().unwrap().pending,
            0,
            "events stranded on an EVD whose upcalls are on"
        );
        assert_eq!(seen.sorted(), vec![(1, 0), (1, 1)]);
    });
}

/// `Disable` vs. a dispatch run delivering a backlog (issue 18, defect 2):
/// once `Disable` returns no upcall begins, so with no producer running the
/// count it returns is exactly what the consumer can dequeue, and every
/// event went to exactly one of the two.
#[test]
fn disable_vs_delivering_run() {
    model(|| {
        let (d, dt) = DispatchThread::start();
        let seen = Arc::new(Seen::default());
        let s2 = seen.clone();
        let evd = Evd::builder(4, EvdFlags::DTO)
            .dispatch(d)
            .upcall(
                UpcallPolicy::SingleInstance,
                upcall(move |_, ev, _| s2.add(&ev.expect("event"))),
            )
            .build()
            .unwrap();
        produce(&evd, 1, 0);
        produce(&evd, 1, 1);
        let pending = evd
            .modify_upcall(UpcallPolicy::Disable, None, ReEnable::OnNew)
            .unwrap();
        let mut polled = Vec::new();
        while let Some(ev) = evd.dequeue().unwrap() {
            polled.push(ev);
        }
        assert_eq!(
            polled.len(),
            pending,
            "an upcall took an event after Disable returned"
        );
        dt.finish();
        for ev in &polled {
            seen.add(ev);
        }
        assert_eq!(seen.sorted(), vec![(1, 0), (1, 1)], "exactly once");
    });
}
