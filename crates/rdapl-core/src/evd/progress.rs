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
use std::sync::atomic::{AtomicBool, Ordering};

/// A provider's progress engine, driven from consumers' threads.
pub trait Progress: Send + Sync + 'static {
    /// A non-blocking progress pass: move what can be moved now (read and
    /// write sockets, place, complete). It must not block for long (a
    /// contended connection is skipped: its owner makes the progress).
    fn progress(&self);
    /// The consumer is about to block on an EVD this hook feeds, or to
    /// rely on its notification (upcalls enabled, a CNO enabled, a stream
    /// gone to sleep, or the EVD found empty while one of these is armed):
    /// whatever progress the hook held back from the provider's own thread
    /// while the consumer polled must be handed back now, or that consumer
    /// may be told late or never. It may be called from any thread,
    /// including while the provider's own locks are held by others: it
    /// must not wait for them.
    fn park(&self) {}
}

/// The hooks of one EVD.
#[derive(Default)]
pub(crate) struct ProgressHooks {
    any: AtomicBool,
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
        let mut l = self.list.lock().unwrap_or_else(|e| e.into_inner());
        l.retain(|w| w.strong_count() > 0);
        if !l.iter().any(|w| w.ptr_eq(&hook)) {
            l.push(hook);
        }
        self.any.store(!l.is_empty(), Ordering::Relaxed);
    }

    fn each(&self, f: impl Fn(&dyn Progress)) {
        // One hook (an endpoint's EVD, the usual case): no list to copy.
        let one = {
            let l = self.list.lock().unwrap_or_else(|e| e.into_inner());
            match l.as_slice() {
                [h] => Some(h.upgrade()),
                _ => None,
            }
        };
        if let Some(Some(h)) = one {
            return f(&*h);
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
        for h in hooks {
            f(&*h);
        }
    }

    /// Runs one progress pass of every hook.
    #[cold]
    pub(crate) fn run(&self) {
        self.each(|h| h.progress());
    }

    /// Tells every hook that a consumer is about to block.
    #[cold]
    #[cfg_attr(rdapl_loom, allow(dead_code))]
    pub(crate) fn park(&self) {
        self.each(|h| h.park());
    }
}
