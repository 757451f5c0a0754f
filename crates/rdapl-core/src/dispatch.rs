//! Dispatch contexts: where upcalls run.
//!
//! An upcall never runs on the stack of a consumer call (`post_*`, `dequeue`,
//! `modify_upcall`, ...) and never under an internal lock. When an event makes
//! an upcall due, the producer only hands a [`DispatchRun`] to the EVD's
//! [`Dispatch`] implementation; the run executes later in a context the
//! library (or a provider) owns, the analogue of kDAPL's interrupt context.
//!
//! [`Dispatcher`] is the default: a small pool of threads. A provider with its
//! own progress thread may implement [`Dispatch`] to run upcalls there, as
//! long as it never runs them inline inside a consumer's call.

use crate::evd::EvdInner;
use crate::sync::Arc;
use std::fmt;

/// A pending dispatch run for one EVD: the unit of work a dispatch context
/// executes. Running it delivers events to the EVD's upcall until the queue
/// is empty or upcalls are off (single-instance/many), or makes the one
/// notify-only upcall.
pub struct DispatchRun(pub(crate) Arc<EvdInner>);

impl DispatchRun {
    /// Executes the run in the current (dispatch) context.
    pub fn run(self) {
        crate::evd::run(&self.0);
    }
}

impl fmt::Debug for DispatchRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("DispatchRun").field(&self.0.id).finish()
    }
}

/// Something that executes [`DispatchRun`]s in a dispatch context.
pub trait Dispatch: Send + Sync + 'static {
    /// Queues `run` for execution. Must not execute it on the caller's stack.
    fn schedule(&self, run: DispatchRun);

    /// How many runs of one EVD may execute at once (bounds the `Many`
    /// policy's concurrency).
    fn concurrency(&self) -> usize {
        1
    }

    /// Readies the context before an EVD that uses it may schedule runs:
    /// called when upcalls are enabled on it (at creation or by
    /// `modify_upcall`), never on a producer's path. A context that starts
    /// its threads lazily starts them here; an error refuses the enabling
    /// call, so no run is scheduled into a context that cannot execute it.
    fn prepare(&self) -> crate::Result<()> {
        Ok(())
    }
}

#[cfg(not(rdapl_loom))]
pub use pool::Dispatcher;

#[cfg(not(rdapl_loom))]
mod pool {
    use super::{Dispatch, DispatchRun};
    use crate::error::{Error, Subtype};
    use crossbeam_channel::{Receiver, Sender};
    use parking_lot::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, OnceLock};

    /// The default dispatch context: `threads` threads that execute runs in
    /// the order they were scheduled. The threads start when first needed
    /// ([`Dispatch::prepare`], or the first run scheduled), so a process
    /// whose EVDs are only polled runs none.
    pub struct Dispatcher {
        tx: Sender<DispatchRun>,
        /// What the threads receive from, kept until they start.
        rx: Receiver<DispatchRun>,
        threads: usize,
        /// How many threads started (0 until the first start that could
        /// start any; only ever set under `starting`).
        started: AtomicUsize,
        starting: Mutex<()>,
    }

    impl std::fmt::Debug for Dispatcher {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Dispatcher")
                .field("threads", &self.threads)
                .field("started", &self.started_threads())
                .finish()
        }
    }

    impl Dispatcher {
        /// A dispatcher with `threads` threads (at least one), started when
        /// first needed. The threads end when the last handle to the
        /// dispatcher is dropped and the runs already queued have executed.
        pub fn new(threads: usize) -> Arc<Dispatcher> {
            let (tx, rx) = crossbeam_channel::unbounded::<DispatchRun>();
            Arc::new(Dispatcher {
                tx,
                rx,
                threads: threads.max(1),
                started: AtomicUsize::new(0),
                starting: Mutex::new(()),
            })
        }

        /// The process-wide default dispatcher (two threads), made on first
        /// use; its threads start with the first upcall enabled on an EVD
        /// that uses it.
        pub fn global() -> Arc<Dispatcher> {
            static GLOBAL: OnceLock<Arc<Dispatcher>> = OnceLock::new();
            GLOBAL.get_or_init(|| Dispatcher::new(2)).clone()
        }

        /// Number of dispatch threads.
        pub fn threads(&self) -> usize {
            self.threads
        }

        /// How many threads have started (0 until first needed).
        pub fn started_threads(&self) -> usize {
            self.started.load(Ordering::Acquire)
        }

        /// Starts the threads unless some run; the number running. The
        /// first thread the system refuses ends the start (a count beyond
        /// what it allows runs what it allows). A start that could start
        /// none is tried again by the next call.
        fn start(&self) -> usize {
            let n = self.started.load(Ordering::Acquire);
            if n > 0 {
                return n;
            }
            let _g = self.starting.lock();
            let n = self.started.load(Ordering::Acquire);
            if n > 0 {
                return n;
            }
            let n = (0..self.threads)
                .take_while(|i| {
                    let rx = self.rx.clone();
                    std::thread::Builder::new()
                        .name(format!("rdapl-dispatch-{i}"))
                        .spawn(move || {
                            while let Ok(run) = rx.recv() {
                                run.run();
                            }
                        })
                        .is_ok()
                })
                .count();
            self.started.store(n, Ordering::Release);
            n
        }
    }

    impl Dispatch for Dispatcher {
        fn schedule(&self, run: DispatchRun) {
            // EVDs prepared the dispatcher before enabling upcalls, so this
            // only reads the count; a direct caller starts the threads here.
            self.start();
            // `self` holds a receiver: this cannot fail while it exists.
            let _ = self.tx.send(run);
        }

        fn concurrency(&self) -> usize {
            self.threads
        }

        fn prepare(&self) -> crate::Result<()> {
            if self.start() == 0 {
                return Err(Error::InsufficientResources {
                    resource: Subtype::NoSubtype,
                    what: "no dispatch thread could be started",
                });
            }
            Ok(())
        }
    }
}
