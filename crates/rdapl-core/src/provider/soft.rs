//! Shared helpers for software providers: what a provider that moves the
//! bytes itself, in this process (the loopback provider, crate
//! `rdapl-loopback`), needs of the core beyond the provider's view.
//!
//! Everything here is the core's own machinery, made public for such
//! providers: the same code the object model runs, with the same locking
//! and no extra cost. It is grouped by concern:
//!
//! * **registered memory**: an IA's registration table ([`MemTable`],
//!   reached through [`IaInner::mem`](crate::provider::IaInner::mem)) resolves
//!   a key, an address range, a right and a protection zone to a [`Span`]
//!   of a region, and a [`KeyCache`] keeps a few resolved keys so that the
//!   usual request takes no table lock; [`SpanRef`], [`SpanRefs`],
//!   [`Spans`] and [`Iov`] are the lists these work on;
//! * **copies** between resolved spans and owned buffers ([`copy_one`],
//!   [`copy_refs`], [`copy_from_buf`], [`copy_into_buf`], [`total`]): every
//!   region locked (in id order) and checked live under its lock, so a
//!   region retired after its key resolved moves no byte ([`Retired`]);
//! * **queues**: an endpoint's receive queue ([`RecvQueue`], the taking
//!   end of a two-lock queue), the requests a transport executes
//!   ([`Request`], [`WrOp`]), a shared receive queue's entries ([`SrqWr`]),
//!   and connection numbers ([`next_conn`]) that keep a send of an ended
//!   connection out of the receives of the next one;
//! * **time**: [`deadline`] (a DAT timeout as an instant) and a one-thread
//!   [`Timer`] for delayed work;
//! * **locks**: [`Lock`], the lock of the endpoint's parts (parking_lot's
//!   mutex; loom's under `--cfg rdapl_loom`), for a provider's own state
//!   that its loom models should see;
//! * **cache hints**: [`prefetch_write`], [`prefetch_read`].
//!
//! A provider that talks to another process (the TCP provider) needs none
//! of this: the provider's view (`gather`, `scatter`, `remote_write`,
//! `remote_read`, `take_recv`, see [`EpInner`](crate::provider::EpInner))
//! does the same checks behind one call each.

pub use crate::ep::{RecvQueue, Request, WrOp, next_conn};
pub use crate::evd::ring::{prefetch_read, prefetch_write};
pub use crate::mem::{
    AccessError, Iov, KeyCache, MemTable, Retired, Span, SpanRef, SpanRefs, Spans, copy_from_buf,
    copy_into_buf, copy_one, copy_refs, total,
};
pub use crate::srq::SrqWr;
pub use crate::sync::{Lock, LockGuard, deadline};

use parking_lot::{Condvar, Mutex};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// A job for the [`Timer`].
pub type Job = Box<dyn FnOnce() + Send>;

/// Names a job of a [`Timer`], to cancel it ([`Timer::cancel`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimerKey(u64);

/// A one-thread timer: runs jobs at their deadlines, one at a time and
/// earliest first (ties in the order they were armed), on its own thread,
/// with none of its locks held. The thread starts with the
/// first job ([`Timer::at`], or [`Timer::ensure_running`] ahead of it), so
/// a provider whose timer is never used runs none. It ends when the timer
/// is stopped ([`Timer::stop`]); jobs not yet run then never run. A job
/// that has become pointless is cancelled ([`Timer::cancel`]), so that what
/// it holds goes at once rather than at its deadline.
pub struct Timer {
    name: String,
    jobs: Mutex<Jobs>,
    /// The thread was started (under the `jobs` lock).
    running: AtomicBool,
    stopped: AtomicBool,
    cv: Condvar,
}

/// The pending jobs by key, and their deadlines earliest first (ties in
/// the order they were armed). A cancelled job leaves its deadline in the
/// heap until it surfaces or the heap is rebuilt (once it holds more dead
/// entries than live ones), so that arming, cancelling and running a job
/// each cost a logarithm of the jobs pending, not a walk over them.
#[derive(Default)]
struct Jobs {
    jobs: HashMap<u64, (Instant, Job)>,
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
    next_key: u64,
}

impl Jobs {
    /// The earliest live deadline and its key (dead entries dropped on
    /// the way).
    fn first(&mut self) -> Option<(Instant, u64)> {
        while let Some(&Reverse((when, key))) = self.heap.peek() {
            if self.jobs.contains_key(&key) {
                return Some((when, key));
            }
            self.heap.pop();
        }
        None
    }
}

impl Timer {
    /// A timer whose thread, once started, is called `name`.
    pub fn new(name: &str) -> Arc<Timer> {
        Arc::new(Timer {
            name: name.into(),
            jobs: Mutex::new(Jobs::default()),
            running: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            cv: Condvar::new(),
        })
    }

    /// Starts the thread if it has not started (nothing once the timer is
    /// stopped). A caller that must not fail later, once it has committed
    /// to a delayed job, calls this first.
    pub fn ensure_running(self: &Arc<Self>) -> std::io::Result<()> {
        if self.running.load(Ordering::Acquire) {
            return Ok(());
        }
        let _g = self.jobs.lock();
        if self.running.load(Ordering::Relaxed) || self.stopped.load(Ordering::SeqCst) {
            return Ok(());
        }
        let t = self.clone();
        std::thread::Builder::new()
            .name(self.name.clone())
            .spawn(move || t.run())?;
        self.running.store(true, Ordering::Release);
        Ok(())
    }

    /// Runs `job` at `when` (at once if that has passed). An error (the
    /// thread could not be started) drops the job unrun.
    pub fn at(self: &Arc<Self>, when: Instant, job: Job) -> std::io::Result<TimerKey> {
        self.ensure_running()?;
        let key = {
            let mut jobs = self.jobs.lock();
            let key = jobs.next_key;
            jobs.next_key += 1;
            jobs.jobs.insert(key, (when, job));
            jobs.heap.push(Reverse((when, key)));
            TimerKey(key)
        };
        self.cv.notify_one();
        Ok(key)
    }

    /// Drops the job `key` unrun, with what it holds; false if it already
    /// ran, is running or was cancelled.
    pub fn cancel(&self, key: TimerKey) -> bool {
        let job = {
            let mut jobs = self.jobs.lock();
            let job = jobs.jobs.remove(&key.0);
            if jobs.heap.len() > 2 * jobs.jobs.len() + 64 {
                let live = jobs.jobs.iter().map(|(&k, &(w, _))| Reverse((w, k)));
                jobs.heap = live.collect();
            }
            job
        };
        // Dropped here, not under the lock: the job may hold the last
        // reference to an object whose drop takes locks of its own.
        job.is_some()
    }

    /// Jobs waiting for their deadline.
    pub fn pending(&self) -> usize {
        self.jobs.lock().jobs.len()
    }

    /// Stops the timer: its thread ends (after the job it may be running).
    pub fn stop(&self) {
        let _g = self.jobs.lock();
        self.stopped.store(true, Ordering::SeqCst);
        self.cv.notify_one();
    }

    fn run(&self) {
        let mut jobs = self.jobs.lock();
        loop {
            if self.stopped.load(Ordering::SeqCst) {
                return;
            }
            match jobs.first() {
                Some((when, key)) if when <= Instant::now() => {
                    jobs.heap.pop();
                    let job = jobs.jobs.remove(&key).map(|(_, j)| j);
                    drop(jobs);
                    if let Some(job) = job {
                        job();
                    }
                    jobs = self.jobs.lock();
                }
                Some((when, _)) => {
                    self.cv.wait_until(&mut jobs, when);
                }
                None => self.cv.wait(&mut jobs),
            }
        }
    }
}

#[cfg(all(test, not(rdapl_loom)))]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn a_cancelled_job_never_runs_and_lets_go_at_once() {
        let t = Timer::new("test-timer");
        let held = Arc::new(());
        let (tx, rx) = mpsc::channel();
        let h = held.clone();
        let far = Instant::now() + Duration::from_secs(3600);
        let key = t
            .at(
                far,
                Box::new(move || {
                    drop(h);
                    tx.send("ran").unwrap();
                }),
            )
            .unwrap();
        assert_eq!((t.pending(), Arc::strong_count(&held)), (1, 2));
        assert!(t.cancel(key));
        assert_eq!((t.pending(), Arc::strong_count(&held)), (0, 1));
        assert!(!t.cancel(key), "a key cancels once");
        assert!(rx.recv_timeout(Duration::from_millis(50)).is_err());
        t.stop();
    }

    /// Jobs run in deadline order (ties in arming order) whatever order
    /// they were armed in, cancelled ones never, and cancelling many
    /// leaves no trace behind.
    #[test]
    // (No unsafe code here; under Miri its hundreds of jobs take longer
    // than the rest of the crate's tests together.)
    #[cfg_attr(miri, ignore)]
    fn jobs_run_in_deadline_order_and_cancelled_ones_never() {
        const N: u64 = 120;
        let t = Timer::new("test-timer");
        // The thread held in a first job while the others are armed and
        // cancelled, however slowly this runs (Miri).
        let (open, gate) = mpsc::channel::<()>();
        t.at(
            Instant::now(),
            Box::new(move || {
                let _ = gate.recv();
            }),
        )
        .unwrap();
        while t.pending() > 0 {
            std::thread::yield_now();
        }
        let (tx, rx) = mpsc::channel();
        let base = Instant::now();
        let mut keys = Vec::new();
        for i in 0..N {
            // A permutation of 0..N (7 is prime to N).
            let slot = (i * 7) % N;
            let tx = tx.clone();
            let when = base + Duration::from_micros(slot / 2 * 50);
            let key = t
                .at(when, Box::new(move || tx.send(slot).unwrap()))
                .unwrap();
            keys.push((slot, key));
        }
        // Far ones, armed and cancelled: the heap is rebuilt as they go.
        let far = Instant::now() + Duration::from_secs(3600);
        for _ in 0..300 {
            let k = t.at(far, Box::new(|| {})).unwrap();
            assert!(t.cancel(k));
        }
        assert!(t.jobs.lock().heap.len() <= 2 * N as usize + 64);
        // Every third one cancelled.
        for &(slot, key) in &keys {
            if slot % 3 == 0 {
                assert!(t.cancel(key));
            }
        }
        open.send(()).unwrap();
        let want: Vec<u64> = (0..N).filter(|s| s % 3 != 0).collect();
        let got: Vec<u64> = (0..want.len())
            .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
            .collect();
        // Deadline order; two slots share each deadline, and of those the
        // one armed first runs first.
        let mut by_deadline = want.clone();
        by_deadline.sort_by_key(|&s| (s / 2, (0..N).position(|i| (i * 7) % N == s)));
        assert_eq!(got, by_deadline);
        assert!(rx.recv_timeout(Duration::from_millis(50)).is_err());
        assert_eq!(t.pending(), 0);
        t.stop();
    }

    #[test]
    fn a_job_runs_at_its_deadline_and_then_cannot_be_cancelled() {
        let t = Timer::new("test-timer");
        let (tx, rx) = mpsc::channel();
        let (tx2, rx2) = mpsc::channel();
        let soon = Instant::now() + Duration::from_millis(20);
        let key = t.at(soon, Box::new(move || tx.send(1).unwrap())).unwrap();
        let other = t.at(soon, Box::new(move || tx2.send(2).unwrap())).unwrap();
        assert_ne!(key, other);
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(1));
        assert_eq!(rx2.recv_timeout(Duration::from_secs(10)), Ok(2));
        assert!(Instant::now() >= soon);
        assert!(!t.cancel(key));
        assert_eq!(t.pending(), 0);
        t.stop();
    }
}
