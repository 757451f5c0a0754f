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
}

#[cfg(not(rdapl_loom))]
pub use pool::Dispatcher;

#[cfg(not(rdapl_loom))]
mod pool {
    use super::{Dispatch, DispatchRun};
    use std::sync::{Arc, OnceLock};

    /// The default dispatch context: `threads` threads that execute runs in
    /// the order they were scheduled.
    pub struct Dispatcher {
        tx: crossbeam_channel::Sender<DispatchRun>,
        threads: usize,
    }

    impl std::fmt::Debug for Dispatcher {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Dispatcher")
                .field("threads", &self.threads)
                .finish()
        }
    }

    impl Dispatcher {
        /// Starts a dispatcher with `threads` threads (at least one). The
        /// threads end when the last handle to the dispatcher is dropped and
        /// the runs already queued have executed.
        pub fn new(threads: usize) -> Arc<Dispatcher> {
            let threads = threads.max(1);
            let (tx, rx) = crossbeam_channel::unbounded::<DispatchRun>();
            for i in 0..threads {
                let rx = rx.clone();
                std::thread::Builder::new()
                    .name(format!("rdapl-dispatch-{i}"))
                    .spawn(move || {
                        while let Ok(run) = rx.recv() {
                            run.run();
                        }
                    })
                    .expect("spawning a dispatch thread");
            }
            Arc::new(Dispatcher { tx, threads })
        }

        /// The process-wide default dispatcher (two threads), started on
        /// first use.
        pub fn global() -> Arc<Dispatcher> {
            static GLOBAL: OnceLock<Arc<Dispatcher>> = OnceLock::new();
            GLOBAL.get_or_init(|| Dispatcher::new(2)).clone()
        }

        /// Number of dispatch threads.
        pub fn threads(&self) -> usize {
            self.threads
        }
    }

    impl Dispatch for Dispatcher {
        fn schedule(&self, run: DispatchRun) {
            // The receivers live as long as the sender: this cannot fail
            // while `self` exists.
            let _ = self.tx.send(run);
        }

        fn concurrency(&self) -> usize {
            self.threads
        }
    }
}
