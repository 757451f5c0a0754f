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
    /// How long a consumer's `wait` drives this hook from its own thread
    /// before it parks it and blocks, at least. Spinning saves a ping-pong
    /// the wake-ups of a blocked waiter, but only if the answer comes while
    /// the waiter spins: where the peer, or the provider's own thread,
    /// shares the waiter's only CPU, it cannot, and a spin only delays it.
    /// Read when the hook is attached; an EVD with several hooks spins the
    /// longest of theirs, and lengthens it up to [`WAIT_SPIN_GROWTH`]
    /// times while its spins catch events and its blocked waits end soon
    /// after they blocked (as Linux's haltpoll grows its poll window); 0
    /// never spins. By default [`DEFAULT_WAIT_SPIN`].
    fn wait_spin(&self) -> Duration {
        DEFAULT_WAIT_SPIN
    }
}

/// The default of [`Progress::wait_spin`].
pub const DEFAULT_WAIT_SPIN: Duration = Duration::from_micros(50);

/// How many times its hooks' [`Progress::wait_spin`] an EVD's spin may
/// grow to.
pub const WAIT_SPIN_GROWTH: u64 = 4;

/// The hooks of one EVD.
#[derive(Default)]
pub(crate) struct ProgressHooks {
    any: AtomicBool,
    /// The longest [`Progress::wait_spin`] of the hooks attached, in
    /// nanoseconds: the least a wait spins.
    spin_ns: AtomicU64,
    /// How long a wait spins now (ns; never below `spin_ns`, see
    /// [`ProgressHooks::blocked`]).
    spin_now_ns: AtomicU64,
    /// A wait's spin took in an event since the spin last shrank.
    caught: AtomicBool,
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
        let base = self.spin_ns.load(Ordering::Relaxed);
        Duration::from_nanos(self.spin_now_ns.load(Ordering::Relaxed).max(base))
    }

    /// A wait's spin took in an event (a pass of the spin brought it).
    #[cfg_attr(rdapl_loom, allow(dead_code))]
    pub(crate) fn spin_caught(&self) {
        // (Read first: a ping-pong's every wait comes here; the line stays
        // shared once the flag is set.)
        if !self.caught.load(Ordering::Relaxed) {
            self.caught.store(true, Ordering::Relaxed);
        }
    }

    /// A wait spun, blocked, and ended `waited` after it began, with an
    /// event (`got`) or without. Where a blocked wait's event comes soon
    /// after the spin gave up, the waker's wake-up costs more than the
    /// spin saves, and each side's late answer makes the other's spin
    /// give up too: a waited ping-pong then stays in blocked waits (on a
    /// VM whose idle CPUs halt, where every wake-up is a CPU's resume:
    /// `rdapl-bench/HISTORY.md`). So, as
    /// Linux's haltpoll and KVM's halt polling do, the spin doubles after
    /// a blocked wait whose event came within [`WAIT_SPIN_GROWTH`] times
    /// the hooks' spin, and halves (not below theirs) after one that took
    /// longer or got none. It grows only where spins have been seen to
    /// take events in, and never for a thread that may run on one CPU
    /// only: its peer may share that CPU, and there a longer spin only
    /// delays the answer.
    #[cfg_attr(rdapl_loom, allow(dead_code))]
    pub(crate) fn blocked(&self, waited: Duration, got: bool) {
        let base = self.spin_ns.load(Ordering::Relaxed);
        let now = self.spin_now_ns.load(Ordering::Relaxed).max(base);
        let waited = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        let caught = self.caught.load(Ordering::Relaxed);
        let (mut next, keep) = spin_after_block(now, base, waited, got, caught);
        if next > now && !on_several_cpus() {
            next = now;
        }
        if next != now {
            self.spin_now_ns.store(next, Ordering::Relaxed);
        }
        if keep != caught {
            self.caught.store(keep, Ordering::Relaxed);
        }
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

/// Whether the calling thread may run on more than one CPU (its
/// affinity; where it cannot be read, yes).
fn on_several_cpus() -> bool {
    #[cfg(target_os = "linux")]
    if let Ok(set) = rustix::thread::sched_getaffinity(None) {
        return set.count() > 1;
    }
    true
}

/// [`ProgressHooks::blocked`]'s rule, all in nanoseconds: the spin after a
/// blocked wait that lasted `waited` from its start and got an event or
/// not, given the spin it had (`spin`), the hooks' (`base`) and whether
/// spins caught events (`caught`); then whether they count as having
/// caught any (not after a shrink).
fn spin_after_block(spin: u64, base: u64, waited: u64, got: bool, caught: bool) -> (u64, bool) {
    let max = base.saturating_mul(WAIT_SPIN_GROWTH);
    if got && waited <= max {
        let next = if caught {
            spin.saturating_mul(2).clamp(base, max)
        } else {
            spin
        };
        (next, caught)
    } else {
        ((spin / 2).max(base), false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;

    #[test]
    fn the_spin_doubles_after_short_blocks_where_spins_caught_events() {
        let base = 50 * US;
        let mut spin = base;
        for want in [100, 200, 200] {
            (spin, _) = spin_after_block(spin, base, 80 * US, true, true);
            assert_eq!(spin, want * US);
        }
        // Exactly at the bound still counts as short.
        assert_eq!(
            spin_after_block(base, base, 200 * US, true, true),
            (100 * US, true)
        );
    }

    #[test]
    fn the_spin_never_grows_where_no_spin_caught_an_event() {
        let base = 50 * US;
        assert_eq!(
            spin_after_block(base, base, 60 * US, true, false),
            (base, false)
        );
        assert_eq!(
            spin_after_block(100 * US, base, 60 * US, true, false),
            (100 * US, false)
        );
    }

    #[test]
    fn long_blocks_and_empty_waits_halve_the_spin_down_to_the_hooks() {
        let base = 50 * US;
        assert_eq!(
            spin_after_block(200 * US, base, 201 * US, true, true),
            (100 * US, false)
        );
        assert_eq!(
            spin_after_block(100 * US, base, 10 * US, false, true),
            (base, false)
        );
        assert_eq!(
            spin_after_block(base, base, 10_000 * US, true, true),
            (base, false)
        );
        // A spin above the bound (the hooks' own spin fell) comes down too.
        assert_eq!(
            spin_after_block(800 * US, base, 900 * US, true, true),
            (400 * US, false)
        );
    }

    /// A hook that only counts its passes, with the spin it is given.
    #[cfg(not(rdapl_loom))]
    struct Spinner(Duration, AtomicU64);

    #[cfg(not(rdapl_loom))]
    impl Progress for Spinner {
        fn progress(&self) {
            self.1.fetch_add(1, Ordering::Relaxed);
        }
        fn wait_spin(&self) -> Duration {
            self.0
        }
    }

    #[cfg(not(rdapl_loom))]
    fn evd_with(spin: Duration) -> (crate::evd::Evd, std::sync::Arc<Spinner>) {
        let evd = crate::evd::Evd::create(8, crate::evd::EvdFlags::SOFTWARE).unwrap();
        let hook = std::sync::Arc::new(Spinner(spin, AtomicU64::new(0)));
        let weak: Weak<dyn Progress> = std::sync::Arc::downgrade(&hook) as Weak<dyn Progress>;
        evd.inner.progress.attach(weak);
        (evd, hook)
    }

    #[test]
    #[cfg(not(rdapl_loom))] // (hooks are not run under loom)
    #[cfg_attr(miri, ignore)] // timing
    fn a_wait_spins_no_longer_than_its_timeout() {
        let (evd, hook) = evd_with(Duration::from_secs(60));
        let t = std::time::Instant::now();
        let r = evd.wait(Some(Duration::from_millis(20)), 1);
        assert!(
            matches!(r, Err(crate::Error::TimeoutExpired { .. })),
            "{r:?}"
        );
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert!(hook.1.load(Ordering::Relaxed) > 0, "no pass in the spin");
    }

    /// The spin grows after a blocked wait whose event came soon, once a
    /// spin has caught one, then catches such events; a long block brings
    /// it back. (Where this thread may use one CPU only, it never grows.)
    #[test]
    #[cfg(not(rdapl_loom))] // (hooks are not run under loom)
    #[cfg_attr(miri, ignore)] // timing
    fn the_spin_follows_how_soon_blocked_waits_end() {
        const MS: Duration = Duration::from_millis(1);
        let base = 50 * MS;
        let (evd, _hook) = evd_with(base);
        let spin = || evd.inner.progress.wait_spin();
        // A wait whose event comes `after` it began.
        let wait_for = |after: Duration| {
            std::thread::scope(|sc| {
                sc.spawn(|| {
                    std::thread::sleep(after);
                    evd.post_se(1).unwrap();
                });
                evd.wait(Some(Duration::from_secs(10)), 1).unwrap();
            });
        };
        wait_for(5 * MS); // caught by the spin
        assert_eq!(spin(), base);
        wait_for(70 * MS); // blocked, and woken well within 4 × 50 ms
        let grows = on_several_cpus();
        assert_eq!(spin(), if grows { 2 * base } else { base });
        if grows {
            wait_for(70 * MS); // caught by the longer spin: no change
            assert_eq!(spin(), 2 * base);
        }
        wait_for(400 * MS); // a long block
        assert_eq!(spin(), base);
    }

    #[test]
    fn no_spin_stays_no_spin() {
        for (waited, got, caught) in [(0, true, true), (5, true, true), (5, false, false)] {
            assert_eq!(spin_after_block(0, 0, waited, got, caught).0, 0);
        }
    }
}
