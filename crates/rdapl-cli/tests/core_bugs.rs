//! Minimal reproductions of core-crate bugs found by `rdapl evd-stress`.
//!
//! A test still `#[ignore]`d shows a bug that is not fixed yet (run those
//! with `cargo test -p rdapl-cli --test core_bugs -- --ignored`); when one
//! starts passing, drop its `#[ignore]`. The others are regression tests for
//! bugs that were fixed.

use rdapl::{Dispatch, DispatchRun, Evd, EvdFlags, Event, ReEnable, Upcall, UpcallPolicy};
use rdapl_cli::stress::{self, Mode, StressConfig};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(10);

/// A dispatch context driven by hand: `schedule` only queues the run, and
/// the test decides when and on which thread each run executes. This makes
/// the interleaving exact instead of hoping a scheduler produces it.
#[derive(Default)]
struct ManualDispatch {
    runs: Mutex<VecDeque<DispatchRun>>,
}

impl ManualDispatch {
    fn take(&self) -> Option<DispatchRun> {
        self.runs.lock().unwrap().pop_front()
    }

    fn queued(&self) -> usize {
        self.runs.lock().unwrap().len()
    }
}

impl Dispatch for ManualDispatch {
    fn schedule(&self, run: DispatchRun) {
        self.runs.lock().unwrap().push_back(run);
    }
}

/// A notify-only EVD whose first upcall blocks until `go` is sent: the
/// window in which the notify run is still alive (`runs == 1`).
fn held_notify_evd() -> (
    Evd,
    Arc<ManualDispatch>,
    mpsc::Receiver<()>,
    mpsc::Sender<()>,
) {
    let (in_tx, in_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (in_tx, go_rx) = (Mutex::new(in_tx), Mutex::new(go_rx));
    let first = AtomicBool::new(true);
    let up: Arc<dyn Upcall> = Arc::new(move |_: &Evd, _: Option<Event>, _: bool| {
        let _ = in_tx.lock().unwrap().send(());
        if first.swap(false, Ordering::SeqCst) {
            let _ = go_rx.lock().unwrap().recv_timeout(LIMIT);
        }
    });
    let dispatch = Arc::new(ManualDispatch::default());
    let evd = Evd::builder(8, EvdFlags::SOFTWARE)
        .dispatch(dispatch.clone())
        .upcall(UpcallPolicy::NotifyOnly, up)
        .build()
        .unwrap();
    (evd, dispatch, in_rx, go_tx)
}

/// Fixed core bug (regression test): a notify-only EVD re-armed while its
/// previous notify run is still alive lost the wakeup of the next arrival.
///
/// `state::schedule_runs` (crates/rdapl-core/src/evd/state.rs, the
/// `Policy::Notify if s.has(NOTIFY_ARMED) && s.runs() == 0` arm) scheduled
/// nothing while `runs != 0` and left `NOTIFY_ARMED` set, expecting the
/// live run to take care of it; but `state::run_step` fired a notify only on
/// a run's *first* step (`first && policy == Notify`), so the live run exited
/// (`runs -> 0`) without looking at `NOTIFY_ARMED` or `count`. (Fixed by the
/// `NOTIFY_DUE` flag: the arrival marks the live run, which notifies again.)
/// Interleaving:
///
/// 1. event 1 arrives: run R1 is scheduled (`NOTIFY_ARMED` cleared, runs 1);
/// 2. R1 calls the notify upcall (a poller schedules its worker and returns);
/// 3. the worker drains event 1 and re-arms: `modify_upcall(NotifyOnly,
///    OnNew)` returns `Ok(0)` (correct: nothing pending), `NOTIFY_ARMED` set;
/// 4. event 2 arrives before R1 has exited: runs is 1, so nothing is
///    scheduled;
/// 5. R1's last `run_step` exits.
///
/// Event 2 is queued, upcalls are armed, no upcall is due and the consumer
/// was told nothing is pending: the lost wakeup of evd-contract.md section 1.
/// Under load `rdapl evd-stress --modes poller --qlen 4` hung this way
/// (the queue fills during the window, so no later arrival re-fires).
#[test]
fn notify_rearmed_on_new_while_notify_run_alive_is_notified_of_the_next_arrival() {
    let (evd, dispatch, in_rx, go_tx) = held_notify_evd();
    evd.post_se(1).unwrap();
    let r1 = dispatch.take().expect("event 1 scheduled a notify run");
    let t = thread::spawn(move || r1.run());
    in_rx
        .recv_timeout(LIMIT)
        .expect("R1 made its notify upcall");

    // The consumer drains and re-arms while R1 is still inside its upcall.
    assert_eq!(evd.dequeue().unwrap(), Some(Event::Software(1)));
    assert_eq!(
        evd.modify_upcall(UpcallPolicy::NotifyOnly, None, ReEnable::OnNew),
        Ok(0)
    );
    evd.post_se(2).unwrap();
    go_tx.send(()).unwrap();
    t.join().unwrap();

    // R1 has exited. Event 2 is queued and upcalls are armed: a notify run
    // must be due (or R1 must have made a second notify upcall).
    let notified_by_r1 = in_rx.try_recv().is_ok();
    let q = evd.query().unwrap();
    assert_eq!(q.pending, 1);
    assert_eq!(q.upcall_policy, UpcallPolicy::NotifyOnly);
    assert!(
        notified_by_r1 || dispatch.queued() > 0,
        "lost wakeup: event 2 queued, notify-only armed, no notify run due"
    );
}

/// The same root cause through `OnAny` (regression test): re-arming with an
/// event already queued must notify "for what is queued" (evd-contract.md
/// section 1), but while the previous notify run was alive `schedule_runs`
/// scheduled nothing and that run exited without notifying.
#[test]
fn notify_rearmed_on_any_with_queued_events_while_notify_run_alive_notifies() {
    let (evd, dispatch, in_rx, go_tx) = held_notify_evd();
    evd.post_se(1).unwrap();
    let r1 = dispatch.take().expect("event 1 scheduled a notify run");
    let t = thread::spawn(move || r1.run());
    in_rx
        .recv_timeout(LIMIT)
        .expect("R1 made its notify upcall");

    evd.post_se(2).unwrap();
    assert_eq!(evd.dequeue().unwrap(), Some(Event::Software(1)));
    // Event 2 is queued: OnAny must arrange a notification for it.
    assert_eq!(
        evd.modify_upcall(UpcallPolicy::NotifyOnly, None, ReEnable::OnAny),
        Ok(1)
    );
    go_tx.send(()).unwrap();
    t.join().unwrap();

    let notified_by_r1 = in_rx.try_recv().is_ok();
    assert_eq!(evd.query().unwrap().pending, 1);
    assert!(
        notified_by_r1 || dispatch.queued() > 0,
        "lost wakeup: OnAny re-arm with event 2 queued, no notify run due"
    );
}

/// The bug seen end to end (regression test): the `Poller` (whose notify
/// upcall only schedules its worker, so the worker often re-arms before the
/// dispatch run has exited) hung with a full EVD in most runs on a two-core
/// machine.
#[test]
fn poller_with_a_small_queue_does_not_hang() {
    let cfg = StressConfig {
        producers: 6,
        events: 40_000,
        qlen: 4,
        evds: 2,
        max_time: Duration::from_secs(20),
        ..StressConfig::default()
    };
    for _ in 0..2 {
        let r = stress::run_mode(Mode::Poller, &cfg);
        assert!(
            r.passed(),
            "{}{:?}",
            stress::format_table(std::slice::from_ref(&r)),
            r.notes
        );
    }
}

/// Core bug: a `Teardown` caller blocked on a running upcall never returns if
/// upcalls are re-enabled meanwhile.
///
/// `modify_upcall(Teardown)` (crates/rdapl-core/src/evd/upcall.rs) sets
/// `TD_WAITING` and sleeps on `teardown_cv` until `inup == 0 || FREED ||
/// policy != Teardown`, with no timeout. The enabling branch of
/// `modify_upcall` goes through `state::enable`, which clears `TD_WAITING`
/// and never notifies `teardown_cv`; so when the running upcall then returns,
/// `run_step` computes `wake_teardown = inup == 0 && TD_WAITING` = false and
/// nobody wakes the waiter, although its own exit condition (`policy !=
/// Teardown`, and now `inup == 0`) holds. Interleaving:
///
/// 1. upcall U runs (`inup` 1);
/// 2. thread T calls `modify_upcall(Teardown)`: policy Teardown,
///    `TD_WAITING` set, T sleeps on the condvar;
/// 3. thread E (or U itself: an upcall may call `modify_upcall` on its own
///    EVD) re-enables: policy SingleInstance, `TD_WAITING` cleared, no
///    notify;
/// 4. U returns: `inup` 0, no wake-up. T sleeps forever.
///
/// The contract (section 2): Teardown "returns only after every running
/// upcall has returned" and must never deadlock.
#[test]
fn teardown_waiting_for_an_upcall_returns_when_upcalls_are_re_enabled_meanwhile() {
    let (entered_tx, entered) = mpsc::channel::<()>();
    let (go, go_rx) = mpsc::channel::<()>();
    let (entered_tx, go_rx) = (Mutex::new(entered_tx), Mutex::new(go_rx));
    let up: Arc<dyn Upcall> = Arc::new(move |_: &Evd, _: Option<Event>, _: bool| {
        let _ = entered_tx.lock().unwrap().send(());
        let _ = go_rx.lock().unwrap().recv_timeout(LIMIT);
    });
    let dispatch = Arc::new(ManualDispatch::default());
    let evd = Evd::builder(8, EvdFlags::SOFTWARE)
        .dispatch(dispatch.clone())
        .upcall(UpcallPolicy::SingleInstance, up)
        .build()
        .unwrap();

    // 1. U runs and blocks inside the upcall.
    evd.post_se(1).unwrap();
    let r1 = dispatch.take().expect("event 1 scheduled a run");
    let run = thread::spawn(move || r1.run());
    entered.recv_timeout(LIMIT).expect("the upcall started");

    // 2. T tears down and waits for U.
    let (done_tx, done) = mpsc::channel();
    let t_evd = evd.clone();
    thread::spawn(move || {
        let r = t_evd.modify_upcall(UpcallPolicy::Teardown, None, ReEnable::OnNew);
        let _ = done_tx.send(r);
    });
    for _ in 0..1000 {
        if evd.query().unwrap().upcall_policy == UpcallPolicy::Teardown {
            break;
        }
        thread::sleep(Duration::from_millis(1));
    }
    // Let T reach its condition-variable wait.
    thread::sleep(Duration::from_millis(200));
    assert!(
        done.try_recv().is_err(),
        "Teardown returned while the upcall runs"
    );

    // 3. Upcalls are re-enabled while T waits.
    assert_eq!(
        evd.modify_upcall(UpcallPolicy::SingleInstance, None, ReEnable::OnNew),
        Ok(0)
    );
    // 4. U returns.
    go.send(()).unwrap();
    run.join().unwrap();

    assert!(
        done.recv_timeout(Duration::from_secs(3)).is_ok(),
        "Teardown still blocked 3 s after the running upcall returned (TD_WAITING cleared by the re-enable, no wake-up)"
    );
}
