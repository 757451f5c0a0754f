//! Consumer-driven progress: a provider whose transport makes progress in
//! software (sockets) may attach a [`Progress`] hook to the EVDs its
//! endpoints feed. A consumer that finds such an EVD empty (`dequeue`) or
//! is about to wait on it then runs a non-blocking progress pass in its
//! own thread first, as libfabric's manual progress does from
//! `fi_cq_read`, instead of waiting for the provider's thread to be
//! scheduled.
//!
//! The hooks are held weakly and called with no EVD lock held (they
//! produce events into that same EVD). An EVD without hooks (every EVD of
//! the loopback provider) pays one relaxed load, and only when it is found
//! empty.

use std::sync::Mutex;
use std::sync::Weak;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// A provider's progress engine, driven from consumers' threads.
pub trait Progress: Send + Sync + 'static {
    /// A non-blocking progress pass: move what can be moved now (read and
    /// write sockets, place, complete). It must not block for long (a
    /// contended connection is skipped: its owner makes the progress).
    fn progress(&self);
    /// [`Progress::progress`] as one hook of a pass over an EVD with
    /// several hooks (an EVD with one hook calls `progress`): `pass` is
    /// the same for every hook of that pass and differs from every other
    /// pass's in the process. Hooks that share a source of readiness (a
    /// provider's sockets, many connections on one EVD) can ask it once
    /// per pass and skip the members with nothing to do, instead of one
    /// system call each. By default, `progress`.
    fn progress_pass(&self, pass: u64) {
        let _ = pass;
        self.progress();
    }
    /// The consumer is about to block on an EVD this hook feeds, or to
    /// rely on its notification (upcalls enabled, a CNO enabled, a stream
    /// gone to sleep, or the EVD found empty while one of these is armed):
    /// whatever progress the hook held back from the provider's own thread
    /// while the consumer polled must be handed back now, or that consumer
    /// may be told late or never. It may be called from any thread,
    /// including while the provider's own locks are held by others: it
    /// must not wait for them.
    fn park(&self) {}
    /// How long a consumer's `wait` may drive this hook from its own
    /// thread before it parks it and blocks. Spinning saves a ping-pong
    /// the wake-ups of a blocked waiter, but only if the answer comes while
    /// the waiter spins: where the peer, or the provider's own thread,
    /// shares the waiter's only CPU, it cannot, and a spin only delays it.
    /// Read when the hook is attached; an EVD with several hooks spins the
    /// longest of theirs. By default [`DEFAULT_WAIT_SPIN`].
    fn wait_spin(&self) -> Duration {
        DEFAULT_WAIT_SPIN
    }
}

/// The default of [`Progress::wait_spin`].
pub const DEFAULT_WAIT_SPIN: Duration = Duration::from_micros(50);

/// The hooks of one EVD.
#[derive(Default)]
pub(crate) struct ProgressHooks {
    any: AtomicBool,
    /// The longest [`Progress::wait_spin`] of the hooks attached, in
    /// nanoseconds.
    spin_ns: AtomicU64,
    list: Mutex<Vec<Weak<dyn Progress>>>,
}

impl ProgressHooks {
    /// True if a hook is (or was) attached: the consumer paths run them.
    #[inline]
    pub(crate) fn any(&self) -> bool {
        self.any.load(Ordering::Relaxed)
    }

    // (Under loom no provider attaches hooks and `wait` never parks.)
    #[cfg_attr(rdapl_loom, allow(dead_code))]
    pub(crate) fn attach(&self, hook: Weak<dyn Progress>) {
        if let Some(h) = hook.upgrade() {
            let ns = u64::try_from(h.wait_spin().as_nanos()).unwrap_or(u64::MAX);
            self.spin_ns.fetch_max(ns, Ordering::Relaxed);
        }
        let mut l = self.list.lock().unwrap_or_else(|e| e.into_inner());
        l.retain(|w| w.strong_count() > 0);
        if !l.iter().any(|w| w.ptr_eq(&hook)) {
            l.push(hook);
        }
        self.any.store(!l.is_empty(), Ordering::Relaxed);
    }

    /// How long a `wait` drives the hooks before it parks them and blocks.
    #[cfg_attr(rdapl_loom, allow(dead_code))]
    pub(crate) fn wait_spin(&self) -> Duration {
        Duration::from_nanos(self.spin_ns.load(Ordering::Relaxed))
    }

    /// Calls `f` on every live hook, with whether there are several.
    fn each(&self, f: impl Fn(&dyn Progress, bool)) {
        // One hook (an endpoint's EVD, the usual case): no list to copy.
        let one = {
            let l = self.list.lock().unwrap_or_else(|e| e.into_inner());
            match l.as_slice() {
                [h] => Some(h.upgrade()),
                _ => None,
            }
        };
        if let Some(Some(h)) = one {
            return f(&*h, false);
        }
        let hooks: Vec<_> = {
            let mut l = self.list.lock().unwrap_or_else(|e| e.into_inner());
            let live: Vec<_> = l.iter().filter_map(Weak::upgrade).collect();
            if live.len() != l.len() {
                l.retain(|w| w.strong_count() > 0);
                self.any.store(!l.is_empty(), Ordering::Relaxed);
            }
            live
        };
        // No lock held: the hooks publish into this EVD.
        let many = hooks.len() > 1;
        for h in hooks {
            f(&*h, many);
        }
    }

    /// Runs one progress pass of every hook.
    #[cold]
    pub(crate) fn run(&self) {
        static PASSES: AtomicU64 = AtomicU64::new(0);
        // Numbered only when several hooks share the pass (an EVD with one
        // hook does no shared write).
        let pass = std::cell::OnceCell::new();
        self.each(|h, many| {
            if many {
                h.progress_pass(*pass.get_or_init(|| PASSES.fetch_add(1, Ordering::Relaxed)))
            } else {
                h.progress()
            }
        });
    }

    /// Tells every hook that a consumer is about to block.
    #[cold]
    #[cfg_attr(rdapl_loom, allow(dead_code))]
    pub(crate) fn park(&self) {
        self.each(|h, _| h.park());
    }
}
