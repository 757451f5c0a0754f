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
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// A job for the [`Timer`].
pub type Job = Box<dyn FnOnce() + Send>;

/// Names a job of a [`Timer`], to cancel it ([`Timer::cancel`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimerKey(u64);

/// A one-thread timer: runs jobs at their deadlines, one at a time, on its
/// own thread, with none of its locks held. The thread starts with the
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

/// The pending jobs, with their deadlines and keys.
#[derive(Default)]
struct Jobs {
    list: Vec<(Instant, TimerKey, Job)>,
    next_key: u64,
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
            let key = TimerKey(jobs.next_key);
            jobs.next_key += 1;
            jobs.list.push((when, key, job));
            key
        };
        self.cv.notify_one();
        Ok(key)
    }

    /// Drops the job `key` unrun, with what it holds; false if it already
    /// ran, is running or was cancelled.
    pub fn cancel(&self, key: TimerKey) -> bool {
        let job = {
            let mut jobs = self.jobs.lock();
            let at = jobs.list.iter().position(|(_, k, _)| *k == key);
            at.map(|i| jobs.list.swap_remove(i))
        };
        // Dropped here, not under the lock: the job may hold the last
        // reference to an object whose drop takes locks of its own.
        job.is_some()
    }

    /// Jobs waiting for their deadline.
    pub fn pending(&self) -> usize {
        self.jobs.lock().list.len()
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
            let now = Instant::now();
            if let Some(i) = jobs.list.iter().position(|(w, _, _)| *w <= now) {
                let (_, _, job) = jobs.list.swap_remove(i);
                drop(jobs);
                job();
                jobs = self.jobs.lock();
                continue;
            }
            match jobs.list.iter().map(|(w, _, _)| *w).min() {
                Some(next) => {
                    self.cv.wait_until(&mut jobs, next);
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
