//! The consumer flow of the 2005 kDAPL discussion (`shared/seed`), in each of
//! rdapl's three re-enable modes.
//!
//! The flow: an upcall arrives, the consumer disables upcalls, hands the EVD
//! to a polling thread, which dequeues everything and then re-enables
//! upcalls. The danger is an event that arrives after the last (empty)
//! dequeue and before the re-enable: upcalls are off, so nobody is told, and
//! the consumer believes the queue is empty (the *lost wakeup*).
//!
//! This example stages exactly that arrival, then shows what each mode does:
//!
//! * `ReEnable::Strict` (the seed's patch): the re-enable is refused with
//!   `Busy`, upcalls stay off, and the thread keeps polling.
//! * `ReEnable::OnAny` (DAT 2.0 `DAT_UPCALL_INVOC_ANY`): upcalls are enabled
//!   and the queued event is delivered by upcall.
//! * `ReEnable::OnNew` (DAT 2.0 `DAT_UPCALL_INVOC_NEW`, Linux
//!   `IB_CQ_REPORT_MISSED_EVENTS`): upcalls are enabled for new arrivals and
//!   the pending count is returned; non-zero means "poll again".
//!
//! Run it with `cargo run -p rdapl --example seed_flow`.

use rdapl::{Error, Evd, EvdFlags, Event, ReEnable, Upcall, UpcallPolicy};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// Every wait in this example is bounded by this.
const LIMIT: Duration = Duration::from_secs(2);

/// Messages to the polling thread.
enum Msg {
    /// The upcall disabled upcalls and hands the EVD over.
    HandOff,
    /// The example is over.
    Stop,
}

/// What the consumer saw, in order (shared by the upcall and the thread).
type Seen = Arc<Mutex<Vec<u64>>>;

fn value(ev: &Event) -> u64 {
    match ev {
        Event::Software(v) => *v,
        other => panic!("unexpected event {other:?}"),
    }
}

/// The consumer's upcall: it runs in rdapl's dispatch context, so it does
/// the minimum: take the event, switch upcalls off, wake the polling thread.
fn upcall(seen: Seen, to_poller: Sender<Msg>) -> Arc<dyn Upcall> {
    let to_poller = Mutex::new(to_poller);
    Arc::new(move |evd: &Evd, event: Option<Event>, _more: bool| {
        let v = value(
            event
                .as_ref()
                .expect("SingleInstance upcalls carry an event"),
        );
        println!("  [upcall ] event {v}: disable upcalls, hand the EVD to the polling thread");
        seen.lock().unwrap().push(v);
        // Calling modify_upcall from inside the upcall is allowed: upcalls
        // never run under an rdapl lock. `Disable` needs no re-enable mode.
        evd.modify_upcall(UpcallPolicy::Disable, None, ReEnable::Strict)
            .expect("disable from the upcall");
        let _ = to_poller.lock().unwrap().send(Msg::HandOff);
    })
}

/// Dequeues until empty, with both dequeue forms.
fn drain(evd: &Evd, seen: &Seen) {
    let mut batch = Vec::new();
    // One at a time...
    while let Some(ev) = evd.dequeue().expect("dequeue") {
        println!("  [poll   ] dequeued event {}", value(&ev));
        seen.lock().unwrap().push(value(&ev));
        // ...and in batches.
        batch.clear();
        evd.dequeue_batch(&mut batch, 8).expect("dequeue_batch");
        for ev in &batch {
            println!("  [poll   ] dequeued event {} (batch)", value(ev));
            seen.lock().unwrap().push(value(ev));
        }
    }
    println!("  [poll   ] queue empty");
}

/// The polling thread: on each hand-off, drain and re-enable in `mode`.
/// The first time, a "producer" posts an event in the race window.
fn poller(evd: Evd, mode: ReEnable, rx: Receiver<Msg>, seen: Seen, quiet: Sender<()>) {
    let mut stage_the_race = true;
    loop {
        match rx.recv_timeout(LIMIT) {
            Ok(Msg::HandOff) => {}
            Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {
                println!("  [poll   ] no hand-off within {LIMIT:?}: giving up");
                return;
            }
        }
        loop {
            drain(&evd, &seen);
            if stage_the_race {
                stage_the_race = false;
                // This is what a provider does when a completion lands now:
                // reserve the slot, complete it. A software event is the
                // simplest stand-in.
                println!(
                    "  [produce] event 4 arrives NOW: after the last empty dequeue, before the re-enable"
                );
                evd.post_se(4).expect("post_se");
            }
            // The atomic re-enable: the queue check and the policy change are
            // one step with respect to producers, in every mode.
            let result = evd.modify_upcall(UpcallPolicy::SingleInstance, None, mode);
            match result {
                Ok(0) => {
                    println!(
                        "  [poll   ] re-enable -> Ok(0): nothing pending, upcalls on; wait for the next hand-off"
                    );
                    let _ = quiet.send(());
                    break;
                }
                Ok(n) if mode == ReEnable::OnAny => {
                    println!(
                        "  [poll   ] re-enable -> Ok({n}): upcalls on, the {n} queued event(s) go to the upcall"
                    );
                    break;
                }
                Ok(n) => {
                    // OnNew. Upcalls are already on again, so an arrival now
                    // would also start an upcall; a consumer whose upcall and
                    // thread must never overlap switches upcalls off again
                    // first, or uses NotifyOnly upcalls as `rdapl::Poller` does.
                    println!(
                        "  [poll   ] re-enable -> Ok({n}): upcalls on for new arrivals, {n} missed: poll again"
                    );
                }
                Err(Error::Busy { pending }) => {
                    println!(
                        "  [poll   ] re-enable -> Busy {{ pending: {pending} }}: upcalls stay off, keep polling here"
                    );
                }
                Err(e) => panic!("modify_upcall: {e}"),
            }
        }
    }
}

fn run(mode: ReEnable, what: &str) -> Vec<u64> {
    println!("\n=== ReEnable::{mode:?}: {what} ===");
    let evd = Evd::create(16, EvdFlags::SOFTWARE).expect("create the EVD");
    let seen: Seen = Arc::default();
    let (to_poller, rx) = mpsc::channel();
    let (quiet_tx, quiet) = mpsc::channel();
    let poll_thread = {
        let (evd, seen) = (evd.clone(), seen.clone());
        thread::spawn(move || poller(evd, mode, rx, seen, quiet_tx))
    };

    // Events 1..=3 wait while upcalls are off; turning upcalls on (OnAny:
    // deliver what is queued) makes the upcall see event 1, which hands off.
    for v in 1..=3 {
        evd.post_se(v).expect("post_se");
    }
    println!("  [main   ] 3 events queued; enabling SingleInstance upcalls");
    evd.modify_upcall(
        UpcallPolicy::SingleInstance,
        Some(upcall(seen.clone(), to_poller.clone())),
        ReEnable::OnAny,
    )
    .expect("enable upcalls");
    quiet.recv_timeout(LIMIT).expect("the flow settles");

    // Upcalls are really on again: a new event is delivered by upcall.
    println!("  [main   ] posting event 5");
    evd.post_se(5).expect("post_se");
    quiet.recv_timeout(LIMIT).expect("the flow settles again");

    let _ = to_poller.send(Msg::Stop);
    poll_thread.join().expect("the polling thread");
    // Teardown waits for a running upcall to return; then free the EVD.
    evd.modify_upcall(UpcallPolicy::Teardown, None, mode)
        .expect("teardown");
    evd.free().expect("free");
    let seen = seen.lock().unwrap().clone();
    println!("  [main   ] consumer saw {seen:?}");
    seen
}

fn main() {
    for (mode, what) in [
        (
            ReEnable::Strict,
            "refuse while events are queued (the seed's patch)",
        ),
        (ReEnable::OnAny, "queued events are delivered by upcall"),
        (
            ReEnable::OnNew,
            "enable for new arrivals, report what is pending",
        ),
    ] {
        let seen = run(mode, what);
        assert_eq!(seen, [1, 2, 3, 4, 5], "every event exactly once, in order");
    }
    println!("\nIn every mode the event that arrived in the race window was seen: no lost wakeup.");
}
