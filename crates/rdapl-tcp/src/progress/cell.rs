//! One connection's cell: the lock that the progress thread, posters and
//! polling consumers share, and what a holder does when it lets go.
//!
//! * A poster or consumer only tries the lock; a contended post is left
//!   to the holder, whose release pumps again ([`KickLock`]).
//! * Whoever pumps brings the connection's readiness interest and timers
//!   up to date, and wakes the thread when they changed.

use super::kick::{KickGuard, KickLock};
use super::*;

/// Most pumps one release runs for kicks raised meanwhile
/// ([`ConnCell::repump`]).
const REPUMPS: u32 = 4;

/// One connection, shared by the thread, posters and polling consumers.
pub(crate) struct ConnCell {
    pub conn: KickLock<Conn>,
    /// `Conn::stalled`, readable without the lock.
    pub stalled: Arc<AtomicBool>,
    /// The groups of the EVDs it feeds (set once it is established).
    groups: OnceLock<Vec<Membership>>,
    /// The last consumer pass left nothing to do but wait for input
    /// (`Conn::quiet`); cleared by every other change under the lock
    /// (`unquiet`, which puts it on its groups' busy lists). A pass skips
    /// a quiet connection whose socket has no input.
    quiet: AtomicBool,
    /// The IA's `poll_fresh_ms`.
    poll_fresh: u64,
    /// The connection's key (`Conn::token`).
    pub token: u64,
    sh: Arc<Shared>,
}

/// A connection's place in one group: whether it is on the group's busy
/// and claimed lists (so that each holds it once, however often it is
/// marked before the group drains its lists).
pub(crate) struct Membership {
    group: Arc<Group>,
    busy: AtomicBool,
    claimed: AtomicBool,
}

/// The connection `ep` is in or is making, as the progress thread linked
/// it ([`EpInner::set_link`]); none once the endpoint left it.
pub(crate) fn link_of(ep: &EpInner) -> Option<Arc<ConnCell>> {
    ep.core.lock().link_ref::<Arc<ConnCell>>().cloned()
}

/// The lock of a [`ConnCell`]: releasing it pumps the connection again if
/// a poster kicked meanwhile (the poster does not wait for the lock).
pub(crate) struct ConnGuard<'a> {
    cell: &'a ConnCell,
    g: Option<KickGuard<'a, Conn>>,
}

impl std::ops::Deref for ConnGuard<'_> {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        self.g.as_ref().expect("held until dropped")
    }
}

impl std::ops::DerefMut for ConnGuard<'_> {
    fn deref_mut(&mut self) -> &mut Conn {
        // Whatever changes now may leave work for the next pass. (Every
        // writer holds the lock: only a set flag needs the write, and the
        // line that passes read stays clean otherwise.)
        self.cell.unquiet();
        self.g.as_mut().expect("held until dropped")
    }
}

impl Drop for ConnGuard<'_> {
    fn drop(&mut self) {
        let cell = self.cell;
        if let Some(g) = self.g.take() {
            let mut n = 0;
            cell.conn.release(g, |c| cell.repump(c, &mut n));
        }
    }
}

impl ConnCell {
    /// A cell for `c`, not yet in the thread's maps.
    pub(super) fn new(c: Conn, sh: Arc<Shared>) -> ConnCell {
        ConnCell {
            poll_fresh: c.ia.poll_fresh_ms,
            stalled: c.stalled.clone(),
            token: c.token,
            conn: KickLock::new(c),
            groups: OnceLock::new(),
            quiet: AtomicBool::new(false),
            sh,
        }
    }

    pub fn lock(&self) -> ConnGuard<'_> {
        ConnGuard {
            cell: self,
            g: Some(self.conn.lock()),
        }
    }

    pub(super) fn try_lock(&self) -> Option<ConnGuard<'_>> {
        self.conn.try_lock().map(|g| ConnGuard {
            cell: self,
            g: Some(g),
        })
    }

    /// New work for the connection (a send or a receive posted): pumps it
    /// from the caller's thread if the lock is free, else leaves it to the
    /// lock's holder, which pumps again when it lets go. Never waits.
    pub fn kick(&self) {
        self.conn.kick(|c| self.pump_with(c, Conn::pump_tx), {
            let mut n = 0;
            move |c| self.repump(c, &mut n)
        });
    }

    /// A release's pump for a kick raised while the lock was held (the
    /// `n`th of this release). Past [`REPUMPS`] the connection is left
    /// due at once instead (`Conn::defer`: the thread pumps it after the
    /// rest of its work) and the release looks no further: posters that
    /// kick as fast as the releaser's pumps complete their requests do
    /// not keep it, be it the thread or a consumer.
    fn repump(&self, c: &mut Conn, n: &mut u32) -> bool {
        *n += 1;
        if *n > REPUMPS {
            let before = (c.deadline(), c.phase);
            c.defer(self.sh.now());
            self.sh.settle(c, before);
            return false;
        }
        self.pump_with(c, Conn::pump);
        true
    }

    /// Pumps `c` with `pump`, then settles its interest and timers.
    fn pump_with(&self, c: &mut Conn, pump: fn(&mut Conn, u64)) {
        self.unquiet();
        let before = (c.deadline(), c.phase);
        pump(c, self.sh.now());
        self.sh.settle(c, before);
    }

    /// Whether a consumer polls this connection at `now` (the newest pass
    /// of one of its groups younger than `poll_fresh_ms` and newer than
    /// every park of its groups), and until when.
    pub(crate) fn polling(&self, now: u64) -> Option<u64> {
        let groups = self.groups.get()?;
        let mut park = 0;
        let mut newest = (0, 0);
        for m in groups {
            let (pass, ms, pk) = m.group.freshness();
            park = park.max(pk);
            newest = newest.max((pass, ms));
        }
        let (pass, ms) = newest;
        if pass <= park {
            return None;
        }
        let until = ms.checked_sub(1)?.saturating_add(self.poll_fresh);
        (now < until).then_some(until)
    }

    fn memberships(&self) -> &[Membership] {
        self.groups.get().map_or(&[], Vec::as_slice)
    }

    /// The connection stops being quiet: its groups' passes pump it
    /// whatever its socket says. (Every writer holds the lock: only a set
    /// flag needs the write, and the line that passes read stays clean
    /// otherwise.)
    fn unquiet(&self) {
        if self.quiet.load(Ordering::Relaxed) {
            self.quiet.store(false, Ordering::Relaxed);
            self.mark_busy();
        }
    }

    /// On every group's busy list (once).
    pub(super) fn mark_busy(&self) {
        for m in self.memberships() {
            if !m.busy.swap(true, Ordering::AcqRel) {
                m.group.mark_busy(self.token);
            }
        }
    }

    /// Its groups' parks must look at it (its input left to the consumer,
    /// or output held back).
    pub(super) fn claim(&self) {
        for m in self.memberships() {
            if !m.claimed.swap(true, Ordering::AcqRel) {
                m.group.claim(self.token);
            }
        }
    }

    /// `g` took it off its busy list (`busy`) or its claimed list.
    pub(crate) fn taken(&self, g: &Group, busy: bool) {
        for m in self.memberships() {
            if std::ptr::eq(&*m.group, g) {
                let flag = if busy { &m.busy } else { &m.claimed };
                flag.store(false, Ordering::Release);
            }
        }
    }

    /// Joins the groups of the EVDs `ep`'s completions go to (the
    /// connection was just established); `ia` is its IA's settings.
    pub(crate) fn join_groups(self: &Arc<Self>, ep: &EpInner, ia: &crate::params::IaParams) {
        let mut mine = Vec::new();
        ep.attach_progress_per_evd(|evd| {
            let g = self.sh.group(evd);
            g.join(self, ia);
            let hook: Weak<dyn rdapl::provider::Progress> = Arc::downgrade(&g) as _;
            mine.push(Membership {
                group: g,
                busy: AtomicBool::new(true),
                claimed: AtomicBool::new(false),
            });
            hook
        });
        let _ = self.groups.set(mine);
    }

    /// Leaves its groups (the connection is gone).
    pub(super) fn leave_groups(&self) {
        for m in self.memberships() {
            m.group.leave(self.token);
        }
    }

    /// One group's pass over this connection, at `now`.
    pub(crate) fn pass(&self, now: u64) {
        let Some(mut c) = self.try_lock() else {
            // Its holder pumps; a later pass looks again.
            self.mark_busy();
            return;
        };
        // Not quiet while pumped (without the busy lists: this pass
        // decides below).
        self.quiet.store(false, Ordering::Relaxed);
        if c.phase != Phase::Open {
            return;
        }
        let before = (c.deadline(), c.phase);
        let reads = c.reads;
        c.pump_polled(now);
        self.sh.settle(&mut c, before);
        if c.out_held {
            self.claim();
        }
        // The pass read input that the thread still polls for: the thread,
        // woken by it, came too late to find it (it shares a CPU with this
        // consumer, or the consumer spins in a `wait`). It is asked to leave
        // the input to the consumer, as it does when it sees it first: a
        // waiting consumer's passes then hold their answers back for its
        // reply, as a polling one's do (`Conn::pump_polled`).
        let adopt = !c.polled && !c.adopt_asked && c.reads != reads;
        if adopt {
            c.adopt_asked = true;
        }
        let quiet = c.quiet();
        if !quiet {
            self.mark_busy();
        }
        // Last, after every change of this pass (the guard's release may
        // pump again, and clears it then).
        self.quiet.store(quiet, Ordering::Release);
        drop(c);
        if adopt {
            self.sh.send(Cmd::Adopt { token: self.token });
        }
    }

    /// A park of one of its groups: what the consumer held goes back to
    /// the thread. Never waits for the lock (a consumer may park from a
    /// context that a holder waits for). Contended, it leaves the work to
    /// others, as `kick` does: the holder's release pumps (output held
    /// back goes out), and the thread, woken, hands the input back in its
    /// check of polled connections.
    pub(crate) fn park(&self) {
        let Some(g) = self.conn.try_lock_or_kick() else {
            // The holder pumps on release but leaves the input polled: the
            // thread takes it back.
            self.sh.recheck_polled.store(true, Ordering::SeqCst);
            self.sh.wakeup();
            return;
        };
        let mut c = ConnGuard {
            cell: self,
            g: Some(g),
        };
        if c.polled || c.out_held {
            let before = (c.deadline(), c.phase);
            c.polled = false;
            if c.out_held {
                c.pump(self.sh.now());
            }
            self.sh.settle(&mut c, before);
        }
    }
}
