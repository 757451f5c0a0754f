//! The synchronisation primitives rdapl is built on, behind one facade.
//!
//! Normal builds use `std` (and parking_lot for the object model's
//! [`Lock`]); `RUSTFLAGS="--cfg rdapl_loom"` builds swap in loom's
//! model-checked versions, so the EVD and CNO protocols
//! (`tests/loom_evd.rs`) and the endpoint's receive queue, its teardown
//! gate and the end of a connection (`rdapl-loopback`'s
//! `tests/loom_ep.rs`) are explored under every interleaving (within
//! loom's preemption bound). The EVD, the CNO and the endpoint take their
//! atomics and locks from here. Under loom the default dispatch context
//! and the poller are left out: a model brings its own dispatch.
//!
//! The cfg is scoped to this crate (`rdapl_loom`, as crossbeam uses
//! `crossbeam_loom`): a downstream crate that model-checks its own code
//! with `--cfg loom` gets the whole of rdapl, built on `std`.

#[cfg(rdapl_loom)]
pub(crate) use loom::cell::UnsafeCell;
#[cfg(rdapl_loom)]
pub(crate) use loom::sync::Arc;
#[cfg(rdapl_loom)]
pub(crate) use loom::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering, fence,
};

#[cfg(not(rdapl_loom))]
pub(crate) use std::sync::Arc;
#[cfg(not(rdapl_loom))]
pub(crate) use std::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering, fence,
};

/// `std`'s `UnsafeCell` with loom's closure-based interface, so the same
/// code runs under both.
#[cfg(not(rdapl_loom))]
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(rdapl_loom))]
impl<T> UnsafeCell<T> {
    pub(crate) const fn new(v: T) -> Self {
        UnsafeCell(std::cell::UnsafeCell::new(v))
    }

    #[inline]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    #[inline]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// One step of a bounded wait for another thread's in-flight step: spin a
/// little, then yield (loom: always yield, so the model lets the other
/// thread run).
#[inline]
pub(crate) fn spin_wait(spins: &mut u32) {
    #[cfg(rdapl_loom)]
    {
        let _ = spins;
        loom::thread::yield_now();
    }
    #[cfg(not(rdapl_loom))]
    {
        if *spins < 64 {
            *spins += 1;
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

use std::time::{Duration, Instant};

#[cfg(rdapl_loom)]
type InnerMutex<T> = loom::sync::Mutex<T>;
#[cfg(not(rdapl_loom))]
type InnerMutex<T> = std::sync::Mutex<T>;
#[cfg(rdapl_loom)]
type InnerCondvar = loom::sync::Condvar;
#[cfg(not(rdapl_loom))]
type InnerCondvar = std::sync::Condvar;

/// A mutex whose `lock` never reports poisoning (a panicking upcall must not
/// wedge the EVD: the protected data is always left consistent).
#[derive(Debug, Default)]
pub(crate) struct Mutex<T>(InnerMutex<T>);

#[cfg(rdapl_loom)]
pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;
#[cfg(not(rdapl_loom))]
pub(crate) type MutexGuard<'a, T> = std::sync::MutexGuard<'a, T>;

impl<T> Mutex<T> {
    pub(crate) fn new(v: T) -> Self {
        Mutex(InnerMutex::new(v))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A condition variable paired with [`Mutex`].
#[derive(Debug, Default)]
pub(crate) struct Condvar(InnerCondvar);

impl Condvar {
    pub(crate) fn new() -> Self {
        Condvar(InnerCondvar::new())
    }

    pub(crate) fn wait<'a, T>(&self, g: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        self.0.wait(g).unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until notified or `deadline` passes (`None`: no deadline).
    /// Returns the guard and whether the deadline has passed. Under loom
    /// timeouts are not modelled: this is a plain wait.
    pub(crate) fn wait_until<'a, T>(
        &self,
        g: MutexGuard<'a, T>,
        deadline: Option<Instant>,
    ) -> (MutexGuard<'a, T>, bool) {
        match deadline {
            None => (self.wait(g), false),
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    return (g, true);
                }
                let (g, _) = self
                    .0
                    .wait_timeout(g, d - now)
                    .unwrap_or_else(|e| e.into_inner());
                (g, Instant::now() >= d)
            }
        }
    }

    pub(crate) fn notify_one(&self) {
        self.0.notify_one()
    }

    pub(crate) fn notify_all(&self) {
        self.0.notify_all()
    }
}

/// A sticky binary signal: `raise` is remembered until one `wait` consumes it,
/// so a wake-up sent before the waiter sleeps is never lost.
#[derive(Debug, Default)]
pub(crate) struct Signal {
    raised: Mutex<bool>,
    cv: Condvar,
}

impl Signal {
    pub(crate) fn new() -> Self {
        Signal {
            raised: Mutex::new(false),
            cv: Condvar::new(),
        }
    }

    pub(crate) fn raise(&self) {
        let mut r = self.raised.lock();
        *r = true;
        drop(r);
        self.cv.notify_one();
    }

    /// Waits for a raise (consuming it) or the deadline. Returns true if a
    /// raise was consumed.
    pub(crate) fn wait_until(&self, deadline: Option<Instant>) -> bool {
        let mut r = self.raised.lock();
        loop {
            if *r {
                *r = false;
                return true;
            }
            let (g, expired) = self.cv.wait_until(r, deadline);
            r = g;
            if expired && !*r {
                return false;
            }
        }
    }
}

/// Converts a DAT-style timeout (`None` = infinite) into a deadline.
pub fn deadline(timeout: Option<Duration>) -> Option<Instant> {
    timeout.map(|t| Instant::now().checked_add(t).unwrap_or_else(far_future))
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86400 * 365)
}

/// The lock of the object model's hot state (an endpoint's parts, an
/// SRQ's queue): parking_lot's in normal builds; under `rdapl_loom`,
/// loom's, behind the same interface (`lock`, `try_lock`), so that models
/// of the object model explore the interleavings of its locks.
#[cfg(not(rdapl_loom))]
pub type Lock<T> = parking_lot::Mutex<T>;
/// The guard of a [`Lock`].
#[cfg(not(rdapl_loom))]
pub type LockGuard<'a, T> = parking_lot::MutexGuard<'a, T>;

/// The lock of the object model's hot state, loom's under `rdapl_loom`.
#[cfg(rdapl_loom)]
#[derive(Debug, Default)]
pub struct Lock<T>(loom::sync::Mutex<T>);

/// The guard of a [`Lock`].
#[cfg(rdapl_loom)]
pub type LockGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

#[cfg(rdapl_loom)]
impl<T> Lock<T> {
    /// A lock holding `v`.
    pub fn new(v: T) -> Self {
        Lock(loom::sync::Mutex::new(v))
    }

    /// Locks, waiting for it (never poisoned: see [`Mutex`]).
    pub fn lock(&self) -> LockGuard<'_, T> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Locks if it is free.
    pub fn try_lock(&self) -> Option<LockGuard<'_, T>> {
        match self.0.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }
}
