//! A lock that never makes a poster wait: a connection's lock, shared by
//! the progress thread, posters and polling consumers.
//!
//! * [`KickLock::kick`] runs the kicker's work at once if the lock is
//!   free, else leaves it to the holder and returns without waiting.
//! * A holder lets go through [`KickLock::release`], which looks for a
//!   kick after it unlocks and runs it under the lock again, until its
//!   kick handler says it left the rest to a later holder it made sure
//!   will come (a releaser that posters keep kicking is not kept).
//! * So every kick is run once the kick began, by its kicker or by a
//!   holder that let go after it: none is lost, and no kicker waits.
//!
//! The flag and the lock are a Dekker pair: a kicker sets the flag, then
//! tries the lock; a releaser unlocks, then reads the flag; a `SeqCst`
//! fence between each pair's steps means at least one of them sees the
//! other's.
//!
//! The pair needs the lock's state to be one atomic word that a try-lock
//! reads and an unlock writes, as parking_lot's is (a compare-exchange on
//! its state byte, a release write to unlock).
//!
//! The protocol is model-checked with loom (`--cfg rdapl_tcp_loom`, a
//! cfg scoped to this crate; `scripts/test-all.sh` runs it): the tests at
//! the end of this file explore the interleavings of a holder, kickers, a
//! pass that only tries the lock, and a park, within loom's preemption
//! bound. Under loom the lock is `model::Mutex`, whose state is such a
//! word (loom's own mutex is not a memory location its fences order).

#[cfg(rdapl_tcp_loom)]
use loom::sync::atomic::{AtomicBool, Ordering, fence};
#[cfg(rdapl_tcp_loom)]
use model::{Mutex, MutexGuard};
#[cfg(not(rdapl_tcp_loom))]
use parking_lot::{Mutex, MutexGuard};
#[cfg(not(rdapl_tcp_loom))]
use std::sync::atomic::{AtomicBool, Ordering, fence};

/// The guard of a [`KickLock`]; let it go with [`KickLock::release`]
/// (dropping it unlocks without looking for kicks).
pub(crate) type KickGuard<'a, T> = MutexGuard<'a, T>;

/// A value behind a lock that kickers never wait for.
pub(crate) struct KickLock<T> {
    value: Mutex<T>,
    /// A kicker found the lock taken: whoever releases it runs the kick.
    kicked: AtomicBool,
}

impl<T> KickLock<T> {
    pub fn new(v: T) -> Self {
        KickLock {
            value: Mutex::new(v),
            kicked: AtomicBool::new(false),
        }
    }

    /// Waits for the lock.
    pub fn lock(&self) -> KickGuard<'_, T> {
        self.value.lock()
    }

    /// The lock if it is free.
    pub fn try_lock(&self) -> Option<KickGuard<'_, T>> {
        self.value.try_lock()
    }

    /// The kicker's half: from now on, the lock's next release runs a
    /// kick. A swap, not a store (the same `xchg` on x86): every write of
    /// the flag is then a read-modify-write, so a kick's raise and the
    /// swap that takes it are ordered whatever the kicker's work was
    /// handed over with (release and acquire suffice). With a store the
    /// models lose a kick: the raise of a second kicker may come before
    /// the first kicker's own raise in the flag's order, and the first
    /// kicker's pump, which takes both, need not see the second's work.
    fn raise(&self) {
        self.kicked.swap(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Runs `first` under the lock if it is free, then lets go with
    /// `then` as [`release`](Self::release) does; if it is taken, leaves
    /// the kick to the holder (whose release runs `then`). Never waits.
    pub fn kick(&self, first: impl FnOnce(&mut T), then: impl FnMut(&mut T) -> bool) {
        self.raise();
        if let Some(mut g) = self.try_lock() {
            // Another holder may have run it meanwhile.
            if self.kicked.swap(false, Ordering::SeqCst) {
                first(&mut g);
            }
            self.release(g, then);
        }
    }

    /// The lock, or, when it is taken, a kick left to its holder (whose
    /// release runs its `then`) and `None`. Never waits. A lock got after
    /// the kick was raised runs `then` on its release, as a holder's does.
    pub fn try_lock_or_kick(&self) -> Option<KickGuard<'_, T>> {
        if let Some(g) = self.try_lock() {
            return Some(g);
        }
        self.raise();
        self.try_lock()
    }

    /// Lets `g` go, then runs `on_kick` under the lock for each kick
    /// raised while it was held (or while `on_kick` ran). If the lock is
    /// taken again before this looks, its new holder's release runs it.
    /// An `on_kick` that returns false took its kick without running it:
    /// it left it (and any kick raised after) to a later holder that it
    /// made sure will come, and the release looks no further.
    pub fn release(&self, g: KickGuard<'_, T>, mut on_kick: impl FnMut(&mut T) -> bool) {
        let mut g = Some(g);
        while let Some(guard) = g.take() {
            drop(guard);
            // The releaser's half of the Dekker pair with `raise`.
            fence(Ordering::SeqCst);
            if !self.kicked.load(Ordering::SeqCst) {
                return;
            }
            // Taken by someone else: its release looks again.
            if let Some(mut again) = self.try_lock() {
                if self.kicked.swap(false, Ordering::SeqCst) && !on_kick(&mut again) {
                    return;
                }
                g = Some(again);
            }
        }
    }
}

/// The lock under loom: its state one atomic word, as parking_lot's is,
/// beside a loom mutex that holds the value (never contended: the word
/// admits one holder).
#[cfg(rdapl_tcp_loom)]
mod model {
    use loom::sync::atomic::{AtomicBool, Ordering};

    pub(crate) struct Mutex<T> {
        locked: AtomicBool,
        value: loom::sync::Mutex<T>,
    }

    pub(crate) struct MutexGuard<'a, T> {
        locked: &'a AtomicBool,
        g: Option<loom::sync::MutexGuard<'a, T>>,
    }

    impl<T> Mutex<T> {
        pub fn new(v: T) -> Self {
            Mutex {
                locked: AtomicBool::new(false),
                value: loom::sync::Mutex::new(v),
            }
        }

        pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            self.locked
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .ok()?;
            let g = self.value.try_lock().expect("the word admits one holder");
            Some(MutexGuard {
                locked: &self.locked,
                g: Some(g),
            })
        }

        pub fn lock(&self) -> MutexGuard<'_, T> {
            loop {
                if let Some(g) = self.try_lock() {
                    return g;
                }
                loom::thread::yield_now();
            }
        }
    }

    impl<T> std::ops::Deref for MutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.g.as_ref().expect("held until dropped")
        }
    }

    impl<T> std::ops::DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.g.as_mut().expect("held until dropped")
        }
    }

    impl<T> Drop for MutexGuard<'_, T> {
        fn drop(&mut self) {
            drop(self.g.take());
            self.locked.store(false, Ordering::Release);
        }
    }
}

#[cfg(all(test, rdapl_tcp_loom))]
mod loom_models {
    //! Run with `RUSTFLAGS="--cfg rdapl_tcp_loom" cargo test -p rdapl-tcp
    //! --lib --release progress::kick`.

    use super::KickLock;
    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use loom::thread;

    /// What a connection's pump sees of the posters: requests handed over
    /// with release and acquire only (the endpoint's queue uses a lock,
    /// which orders more), and how many of them it has taken.
    struct Conn {
        queued: Arc<AtomicUsize>,
        taken: usize,
    }

    fn pump(c: &mut Conn) {
        c.taken = c.queued.load(Ordering::Acquire);
    }

    /// A release's pump: it goes on looking.
    fn repump(c: &mut Conn) -> bool {
        pump(c);
        true
    }

    fn fresh() -> (Arc<KickLock<Conn>>, Arc<AtomicUsize>) {
        let queued = Arc::new(AtomicUsize::new(0));
        let lock = Arc::new(KickLock::new(Conn {
            queued: queued.clone(),
            taken: 0,
        }));
        (lock, queued)
    }

    /// A poster: queues a request, then kicks.
    fn post(lock: &KickLock<Conn>, queued: &AtomicUsize) {
        queued.fetch_add(1, Ordering::Release);
        lock.kick(pump, repump);
    }

    /// Two posters kick while the progress thread holds the lock: once all
    /// are done, every request was taken, with nobody left to pump.
    #[test]
    fn no_kick_is_lost_to_a_holder() {
        loom::model(|| {
            let (lock, queued) = fresh();
            let posters: Vec<_> = (0..2)
                .map(|_| {
                    let (lock, queued) = (lock.clone(), queued.clone());
                    thread::spawn(move || post(&lock, &queued))
                })
                .collect();
            let g = lock.lock();
            lock.release(g, repump);
            for p in posters {
                p.join().unwrap();
            }
            assert_eq!(lock.lock().taken, 2);
        });
    }

    /// A kick raised while the holder releases, with a consumer's pass
    /// (which only tries the lock) taking the lock in between: whichever
    /// of them holds it last runs the kick.
    #[test]
    fn a_pass_between_a_release_and_its_look_runs_the_kick() {
        loom::model(|| {
            let (lock, queued) = fresh();
            let poster = {
                let (lock, queued) = (lock.clone(), queued.clone());
                thread::spawn(move || post(&lock, &queued))
            };
            let pass = {
                let lock = lock.clone();
                thread::spawn(move || {
                    if let Some(g) = lock.try_lock() {
                        lock.release(g, repump);
                    }
                })
            };
            let g = lock.lock();
            lock.release(g, repump);
            poster.join().unwrap();
            pass.join().unwrap();
            assert_eq!(lock.lock().taken, 1);
        });
    }

    /// A releaser that stops at once (its kick handler leaves the work to
    /// a later holder: here it marks the value due, as a connection's
    /// timer is), and the progress thread that then holds the lock again
    /// because it is due: once all are done, every request was taken.
    #[test]
    fn a_release_that_stops_leaves_no_kick_lost() {
        loom::model(|| {
            let (lock, queued) = fresh();
            let due = Arc::new(AtomicBool::new(false));
            let poster = {
                let (lock, queued) = (lock.clone(), queued.clone());
                thread::spawn(move || post(&lock, &queued))
            };
            let stopper = {
                let due = due.clone();
                move |_: &mut Conn| {
                    due.store(true, Ordering::SeqCst);
                    false
                }
            };
            let g = lock.lock();
            lock.release(g, stopper);
            poster.join().unwrap();
            // The thread: a due value is pumped (then released as usual).
            if due.load(Ordering::SeqCst) {
                let mut g = lock.lock();
                pump(&mut g);
                lock.release(g, repump);
            }
            assert_eq!(lock.lock().taken, 1);
        });
    }

    /// What a park hands back: output held back (the holder's release
    /// pump sends it) and the input (the progress thread takes it back
    /// when told).
    struct Held {
        out_held: bool,
        polled: bool,
    }

    fn flush(h: &mut Held) -> bool {
        h.out_held = false;
        true
    }

    /// A park racing the progress thread's hold of the lock: once both
    /// are done the held output went out, and the input is back or the
    /// thread was told to take it back.
    #[test]
    fn a_contended_park_leaves_nothing_held() {
        loom::model(|| {
            let lock = Arc::new(KickLock::new(Held {
                out_held: true,
                polled: true,
            }));
            let recheck = Arc::new(AtomicBool::new(false));
            let park = {
                let (lock, recheck) = (lock.clone(), recheck.clone());
                thread::spawn(move || match lock.try_lock_or_kick() {
                    Some(mut g) => {
                        g.polled = false;
                        let _ = flush(&mut g);
                        lock.release(g, flush);
                    }
                    None => recheck.store(true, Ordering::SeqCst),
                })
            };
            let g = lock.lock();
            lock.release(g, flush);
            park.join().unwrap();
            let h = lock.lock();
            assert!(!h.out_held);
            assert!(!h.polled || recheck.load(Ordering::SeqCst));
        });
    }
}
