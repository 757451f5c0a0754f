//! The poller: the seed's consumer flow, done correctly once for everyone.
//!
//! A high-rate consumer wants an upcall to tell it that work arrived, then
//! to drain the EVD by polling in a thread (not in the dispatch context),
//! then to re-arm without losing what arrives in between. [`Poller`] does
//! exactly that, in the shape of Linux's `ib_cq_poll_work` and NAPI:
//!
//! 1. each attached EVD gets a notify-only upcall whose only work is to
//!    schedule the EVD's task on a poller thread (nothing heavy runs in the
//!    dispatch context);
//! 2. a poller thread dequeues up to `budget` events in batches and hands
//!    them to the consumer's handler, in thread context;
//! 3. if the budget ran out, the task yields and is rescheduled behind the
//!    other EVDs' tasks (fairness), without re-arming;
//! 4. otherwise it re-arms the notify-only upcall with the configured
//!    [`ReEnable`] mode; if events were pending at the atomic re-arm, it goes
//!    on polling.
//!
//! # Guarantees
//!
//! * **No lost event**: the re-arm is atomic with respect to producers (see
//!   [`crate::evd`]), and a pending count or a `Busy` makes the task poll
//!   again.
//! * **One handler run per EVD at a time**: a task state machine (idle,
//!   scheduled, running, notified) lets a notification that arrives while
//!   the task runs mark it for another pass instead of starting a second run.
//! * **Bounded time per run**: at most `budget` events per run.
//! * **A panicking handler is contained**: the panic is caught and counted
//!   ([`PollerStats::handler_panics`]), the event counts as handled, and the
//!   task goes on with the next event; the poller's threads never die of it.

use crate::dispatch::{Dispatch, DispatchRun};
use crate::error::{Error, Result, Subtype};
use crate::evd::{Evd, ReEnable, Upcall, UpcallPolicy, teardown_waits};
use crate::event::Event;
use std::fmt;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};

/// Poller settings.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PollerConfig {
    /// Poller threads (at least one).
    pub threads: usize,
    /// Most events handled per run before the task yields.
    pub budget: usize,
    /// How the task re-arms: `OnNew` (Linux style: arm and report missed
    /// events) or `Strict` (the seed's rule: refused while events pend).
    /// `OnAny` is accepted and behaves like `OnNew` plus an immediate
    /// notification for what is queued.
    pub mode: ReEnable,
}

impl Default for PollerConfig {
    fn default() -> Self {
        PollerConfig {
            threads: 1,
            budget: 64,
            mode: ReEnable::OnNew,
        }
    }
}

/// Counters of one attached EVD.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct PollerStats {
    /// Events handed to the handler.
    pub events: u64,
    /// Notify-only upcalls received (each schedules at most one run).
    pub upcalls: u64,
    /// Runs executed.
    pub runs: u64,
    /// Runs that ended because the budget ran out.
    pub budget_exhausted: u64,
    /// Re-arms that found events pending and polled again.
    pub rearm_pending: u64,
    /// Handler calls that panicked (caught; the task carried on).
    pub handler_panics: u64,
}

const IDLE: u8 = 0;
const SCHEDULED: u8 = 1;
const RUNNING: u8 = 2;
const NOTIFIED: u8 = 3;
const CLOSED: u8 = 4;

type Handler = Box<dyn FnMut(Event) + Send>;

/// Work for a poller thread.
enum Job {
    /// Poll an attached EVD.
    Task(Arc<Task>),
    /// A dispatch run of an EVD created with [`Poller::dispatch`].
    Run(DispatchRun),
    /// Stop the thread.
    Stop,
}

/// The poller's threads as a dispatch context (see [`Poller::dispatch`]).
struct PollerDispatch {
    tx: crossbeam_channel::Sender<Job>,
    threads: usize,
}

impl Dispatch for PollerDispatch {
    fn schedule(&self, run: DispatchRun) {
        let _ = self.tx.send(Job::Run(run));
    }

    fn concurrency(&self) -> usize {
        self.threads
    }
}

struct Task {
    id: u64,
    poller: u64,
    evd: Evd,
    state: AtomicU8,
    handler: Mutex<Handler>,
    tx: crossbeam_channel::Sender<Job>,
    budget: usize,
    mode: ReEnable,
    done_lock: Mutex<()>,
    done_cv: Condvar,
    /// Serialises closes (an entry's and its poller's drop may race).
    close_lock: Mutex<()>,
    events: AtomicU64,
    upcalls: AtomicU64,
    runs: AtomicU64,
    budget_exhausted: AtomicU64,
    rearm_pending: AtomicU64,
    handler_panics: AtomicU64,
}

std::thread_local! {
    static RUNNING_TASK: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// The poller whose thread this is (0: not a poller thread).
    static POLLER_THREAD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// A task to run right after the current job on this poller thread.
    static LOCAL_TASK: std::cell::RefCell<Option<Arc<Task>>> = const { std::cell::RefCell::new(None) };
    /// A task whose poller was dropped from inside its handler: this
    /// thread closes it once the run has ended.
    static CLOSE_AFTER_RUN: std::cell::RefCell<Option<Arc<Task>>> = const { std::cell::RefCell::new(None) };
}

impl Task {
    /// Called from the notify-only upcall: make sure a run will happen.
    fn schedule(self: &Arc<Self>) {
        let mut cur = self.state.load(Ordering::SeqCst);
        loop {
            let next = match cur {
                IDLE => SCHEDULED,
                RUNNING => NOTIFIED,
                _ => return, // already scheduled, notified or closed
            };
            match self
                .state
                .compare_exchange(cur, next, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => {
                    if next == SCHEDULED {
                        self.enqueue();
                    }
                    return;
                }
                Err(a) => cur = a,
            }
        }
    }

    /// Queues a scheduled task. On one of its own poller's threads (the
    /// notify upcall ran there, the poller being the EVD's dispatch
    /// context) the task runs right after the current job, with no
    /// channel round trip.
    fn enqueue(self: &Arc<Self>) {
        let local = POLLER_THREAD.with(|p| p.get()) == self.poller
            && LOCAL_TASK.with(|t| {
                let mut t = t.borrow_mut();
                if t.is_none() {
                    *t = Some(self.clone());
                    true
                } else {
                    false
                }
            });
        if !local {
            let _ = self.tx.send(Job::Task(self.clone()));
        }
    }

    fn finish(&self) {
        let _g = self.done_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.done_cv.notify_all();
    }

    /// Leaves RUNNING: to SCHEDULED (and requeue) if `again` or a
    /// notification came in, else to IDLE.
    fn end_run(self: &Arc<Self>, again: bool) {
        let mut cur = self.state.load(Ordering::SeqCst);
        loop {
            let next = match cur {
                CLOSED => break,
                NOTIFIED => SCHEDULED,
                _ if again => SCHEDULED,
                _ => IDLE,
            };
            match self
                .state
                .compare_exchange(cur, next, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => {
                    if next == SCHEDULED {
                        let _ = self.tx.send(Job::Task(self.clone()));
                    }
                    break;
                }
                Err(a) => cur = a,
            }
        }
        self.finish();
    }

    fn run(self: &Arc<Self>) {
        if self
            .state
            .compare_exchange(SCHEDULED, RUNNING, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return; // closed while queued
        }
        self.runs.fetch_add(1, Ordering::Relaxed);
        let mut handler = self.handler.lock().unwrap_or_else(|e| e.into_inner());
        let prev = RUNNING_TASK.with(|c| c.replace(self.id));
        let mut batch = Vec::with_capacity(self.budget.min(64));
        let mut handled = 0usize;
        let again = loop {
            // Poll up to the budget.
            let mut dead = false;
            while handled < self.budget {
                batch.clear();
                match self
                    .evd
                    .dequeue_batch(&mut batch, (self.budget - handled).min(64))
                {
                    Ok(0) => break,
                    Ok(n) => {
                        handled += n;
                        self.events.fetch_add(n as u64, Ordering::Relaxed);
                        for ev in batch.drain(..) {
                            // A panic must neither kill this thread (every
                            // EVD on the poller would be stranded) nor drop
                            // the rest of the batch.
                            let call = std::panic::AssertUnwindSafe(|| handler(ev));
                            if std::panic::catch_unwind(call).is_err() {
                                self.handler_panics.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    Err(_) => {
                        dead = true;
                        break;
                    }
                }
            }
            if dead {
                break false;
            }
            if handled >= self.budget {
                // Budget exhausted: yield to other EVDs without re-arming.
                self.budget_exhausted.fetch_add(1, Ordering::Relaxed);
                break true;
            }
            // Drained: re-arm atomically; poll on if events were pending.
            match self
                .evd
                .modify_upcall(UpcallPolicy::NotifyOnly, None, self.mode)
            {
                Ok(0) => break false,
                Ok(_) | Err(Error::Busy { .. }) => {
                    self.rearm_pending.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Err(_) => break false,
            }
        };
        RUNNING_TASK.with(|c| c.set(prev));
        drop(handler);
        self.end_run(again);
    }
}

struct NotifyUpcall(Weak<Task>);

impl Upcall for NotifyUpcall {
    fn upcall(&self, _evd: &Evd, _event: Option<Event>, _more: bool) {
        if let Some(t) = self.0.upgrade() {
            t.upcalls.fetch_add(1, Ordering::Relaxed);
            t.schedule();
        }
    }
}

/// Runs the notify → poll → re-arm flow for any number of EVDs.
///
/// Dropping it detaches every EVD and ends its threads. Dropped from
/// inside a handler, it detaches that handler's EVD once the run ends.
pub struct Poller {
    id: u64,
    tx: crossbeam_channel::Sender<Job>,
    config: PollerConfig,
    tasks: Arc<Mutex<Vec<Arc<Task>>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl fmt::Debug for Poller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Poller")
            .field("config", &self.config)
            .finish()
    }
}

/// One EVD attached to a [`Poller`]. Dropping it detaches the EVD, as
/// [`PollerEntry::remove`] does (quietly: from inside its own handler
/// nothing happens, and the poller detaches it when it is dropped).
pub struct PollerEntry {
    task: Arc<Task>,
    /// The poller's list of tasks (gone with the poller).
    tasks: Weak<Mutex<Vec<Arc<Task>>>>,
    detached: bool,
}

impl fmt::Debug for PollerEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PollerEntry")
            .field("evd", &self.task.evd.handle())
            .field("stats", &self.stats())
            .finish()
    }
}

impl Poller {
    /// Starts a poller.
    pub fn new(config: PollerConfig) -> Result<Poller> {
        if config.budget == 0 {
            return Err(Error::param(1, "the poller budget must be at least 1"));
        }
        static NEXT_POLLER: AtomicU64 = AtomicU64::new(1);
        let id = NEXT_POLLER.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        let threads = (0..config.threads.max(1))
            .map(|i| {
                let rx = rx.clone();
                std::thread::Builder::new()
                    .name(format!("rdapl-poller-{i}"))
                    .spawn(move || {
                        POLLER_THREAD.with(|p| p.set(id));
                        while let Ok(job) = rx.recv() {
                            match job {
                                Job::Task(task) => task.run(),
                                Job::Run(run) => run.run(),
                                Job::Stop => break,
                            }
                            while let Some(t) = LOCAL_TASK.with(|t| t.borrow_mut().take()) {
                                t.run();
                            }
                            if let Some(t) = CLOSE_AFTER_RUN.with(|t| t.borrow_mut().take()) {
                                let _ = close(&t);
                            }
                        }
                    })
                    .map_err(|_| Error::InsufficientResources {
                        resource: Subtype::ResourceMemory,
                        what: "could not start a poller thread",
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Poller {
            id,
            tx,
            config,
            tasks: Arc::new(Mutex::new(Vec::new())),
            threads,
        })
    }

    /// Attaches `evd`: from now on its events go to `handler`, in a poller
    /// thread. Takes over the EVD's upcall (notify-only); events already
    /// queued are handled at once. Refused with `InvalidState` while the
    /// EVD is attached to an entry (of this poller or another): remove
    /// that one first, since its detach switches the upcall off.
    pub fn add(
        &self,
        evd: &Evd,
        handler: impl FnMut(Event) + Send + 'static,
    ) -> Result<PollerEntry> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let task = Arc::new(Task {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            poller: self.id,
            evd: evd.clone(),
            state: AtomicU8::new(IDLE),
            handler: Mutex::new(Box::new(handler)),
            tx: self.tx.clone(),
            budget: self.config.budget,
            mode: self.config.mode,
            done_lock: Mutex::new(()),
            done_cv: Condvar::new(),
            close_lock: Mutex::new(()),
            events: AtomicU64::new(0),
            upcalls: AtomicU64::new(0),
            runs: AtomicU64::new(0),
            budget_exhausted: AtomicU64::new(0),
            rearm_pending: AtomicU64::new(0),
            handler_panics: AtomicU64::new(0),
        });
        let attached = &evd.inner.poller_task;
        if attached
            .compare_exchange(0, task.id, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return Err(Error::state(
                Subtype::InvalidStateEvdInUse,
                "the EVD is attached to a poller entry already",
            ));
        }
        let up: Arc<dyn Upcall> = Arc::new(NotifyUpcall(Arc::downgrade(&task)));
        if let Err(e) = evd.modify_upcall(UpcallPolicy::NotifyOnly, Some(up), ReEnable::OnAny) {
            attached.store(0, Ordering::SeqCst);
            return Err(e);
        }
        self.tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(task.clone());
        Ok(PollerEntry {
            task,
            tasks: Arc::downgrade(&self.tasks),
            detached: false,
        })
    }

    /// The poller's own threads as a dispatch context, for the EVDs it will
    /// poll (`Evd::builder(..).dispatch(poller.dispatch())`). The
    /// notify-only upcall then runs on a poller thread, which goes on to
    /// poll the EVD without a second thread wake-up: one hand-off from
    /// producer to handler instead of two, as NAPI polls on the CPU that
    /// took the interrupt. The notify upcall stays trivial (it only marks
    /// the task scheduled); the handler still runs in a task run, never
    /// inside the upcall. Runs scheduled after the poller is dropped do not
    /// execute: free or detach such EVDs first.
    pub fn dispatch(&self) -> Arc<dyn Dispatch> {
        Arc::new(PollerDispatch {
            tx: self.tx.clone(),
            threads: self.threads.len(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> PollerConfig {
        self.config
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|e| e.into_inner()));
        let running = RUNNING_TASK.with(|c| c.get());
        for t in &tasks {
            if t.id == running {
                // Dropped from inside this task's handler: its run goes on
                // to the end, then this thread closes the task.
                CLOSE_AFTER_RUN.with(|c| *c.borrow_mut() = Some(t.clone()));
                continue;
            }
            let _ = close(t);
        }
        for _ in &self.threads {
            let _ = self.tx.send(Job::Stop);
        }
        // Dropped on one of its own threads (from a handler or a dispatch
        // run): that thread cannot join itself; it ends at its Stop.
        let me = std::thread::current().id();
        for h in self.threads.drain(..) {
            if h.thread().id() != me {
                let _ = h.join();
            }
        }
    }
}

/// Marks a task id as a node of the waits graph (`teardown_waits`),
/// apart from EVD ids.
const TASK_NODE: u64 = 1 << 63;

fn close(task: &Arc<Task>) -> Result<()> {
    let from = RUNNING_TASK.with(|c| c.get());
    if from == task.id {
        return Err(Error::state(
            Subtype::InvalidStateEvdInUse,
            "a poller entry cannot be removed from inside its own handler",
        ));
    }
    // Inside a handler, the wait below for the task's run must not close
    // a cycle: handlers that remove each other's entries would both wait
    // for ever.
    let from = if from == 0 { 0 } else { TASK_NODE | from };
    let Some(_waiting) = teardown_waits::enter(from, TASK_NODE | task.id) else {
        return Err(Error::state(
            Subtype::InvalidStateEvdInUse,
            "removing this entry from inside a handler would deadlock: its handler \
             waits for the caller's",
        ));
    };
    // Once closed, the EVD is no longer this task's: another entry may
    // hold it already, and a second close would switch its upcall off.
    let _closing = task.close_lock.lock().unwrap_or_else(|e| e.into_inner());
    if task.state.load(Ordering::SeqCst) == CLOSED {
        return Ok(());
    }
    // No new notifications; waits for a notify upcall in progress.
    match task
        .evd
        .modify_upcall(UpcallPolicy::Teardown, None, ReEnable::OnNew)
    {
        Ok(_) | Err(Error::InvalidHandle(_)) => {}
        Err(e) => return Err(e),
    }
    // Close the task; wait for a run in progress to end.
    let mut g = task.done_lock.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let cur = task.state.load(Ordering::SeqCst);
        match cur {
            CLOSED => break,
            IDLE | SCHEDULED => {
                if task
                    .state
                    .compare_exchange(cur, CLOSED, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
                {
                    break;
                }
            }
            _ => {
                g = task
                    .done_cv
                    .wait_timeout(g, std::time::Duration::from_millis(10))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
    }
    drop(g);
    // A run that ended meanwhile may have re-armed: leave upcalls off.
    match task
        .evd
        .modify_upcall(UpcallPolicy::Disable, None, ReEnable::OnNew)
    {
        Ok(_) | Err(Error::InvalidHandle(_)) => {}
        Err(e) => return Err(e),
    }
    // Detached: the EVD may be attached again.
    let _ =
        task.evd
            .inner
            .poller_task
            .compare_exchange(task.id, 0, Ordering::SeqCst, Ordering::SeqCst);
    Ok(())
}

impl PollerEntry {
    /// The counters so far.
    pub fn stats(&self) -> PollerStats {
        let t = &self.task;
        PollerStats {
            events: t.events.load(Ordering::Relaxed),
            upcalls: t.upcalls.load(Ordering::Relaxed),
            runs: t.runs.load(Ordering::Relaxed),
            budget_exhausted: t.budget_exhausted.load(Ordering::Relaxed),
            rearm_pending: t.rearm_pending.load(Ordering::Relaxed),
            handler_panics: t.handler_panics.load(Ordering::Relaxed),
        }
    }

    /// The EVD this entry polls.
    pub fn evd(&self) -> &Evd {
        &self.task.evd
    }

    /// Detaches the EVD: tears its upcall down, waits for a run in progress,
    /// and leaves unhandled events queued on the EVD. Refused from inside the
    /// entry's own handler, and from inside a handler whose run that entry's
    /// handler waits for (it removes the caller's entry, directly or through
    /// others). (`poller` is the one the entry came from; the
    /// entry knows it, so dropping the entry does the same.)
    pub fn remove(mut self, poller: &Poller) -> Result<()> {
        debug_assert!(self.tasks.ptr_eq(&Arc::downgrade(&poller.tasks)));
        self.detach()
    }

    fn detach(&mut self) -> Result<()> {
        close(&self.task)?;
        self.detached = true;
        if let Some(tasks) = self.tasks.upgrade() {
            tasks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|t| !Arc::ptr_eq(t, &self.task));
        }
        Ok(())
    }
}

impl Drop for PollerEntry {
    fn drop(&mut self) {
        if !self.detached && self.tasks.strong_count() > 0 {
            let _ = self.detach();
        }
    }
}
