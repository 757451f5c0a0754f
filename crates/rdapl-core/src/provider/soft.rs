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

/// A one-thread timer: runs jobs at their deadlines, one at a time, on its
/// own thread, with none of its locks held. The thread starts with the
/// first job ([`Timer::at`], or [`Timer::ensure_running`] ahead of it), so
/// a provider whose timer is never used runs none. It ends when the timer
/// is stopped ([`Timer::stop`]); jobs not yet run then never run.
pub struct Timer {
    name: String,
    jobs: Mutex<Vec<(Instant, Job)>>,
    /// The thread was started (under the `jobs` lock).
    running: AtomicBool,
    stopped: AtomicBool,
    cv: Condvar,
}

impl Timer {
    /// A timer whose thread, once started, is called `name`.
    pub fn new(name: &str) -> Arc<Timer> {
        Arc::new(Timer {
            name: name.into(),
            jobs: Mutex::new(Vec::new()),
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
    pub fn at(self: &Arc<Self>, when: Instant, job: Job) -> std::io::Result<()> {
        self.ensure_running()?;
        self.jobs.lock().push((when, job));
        self.cv.notify_one();
        Ok(())
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
            if let Some(i) = jobs.iter().position(|(w, _)| *w <= now) {
                let (_, job) = jobs.swap_remove(i);
                drop(jobs);
                job();
                jobs = self.jobs.lock();
                continue;
            }
            match jobs.iter().map(|(w, _)| *w).min() {
                Some(next) => {
                    self.cv.wait_until(&mut jobs, next);
                }
                None => self.cv.wait(&mut jobs),
            }
        }
    }
}
