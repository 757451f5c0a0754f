//! The progress engine: one thread per [`crate::Tcp`] instance, and the
//! consumers' own threads.
//!
//! Every connection (`crate::conn::Conn`) sits behind a lock
//! (`ConnCell`). The thread waits in `epoll_wait` on the non-blocking
//! sockets, the listening sockets and an eventfd, and sets connections up
//! and tears them down. Once a connection is established, data moves on
//! whichever thread gets there first:
//!
//! * **Posters.** A send posted (`kick`) try-locks its connection and
//!   pumps it at once: the request goes to the engine and its bytes to the
//!   socket from the poster's thread. Contended, it queues a `Cmd` and
//!   writes the eventfd instead (the lock's holder may have looked at the
//!   queue before the post). A posted receive kicks only if a Send of the
//!   peer waits for one (`Conn::stalled`, a Dekker pair with the stall).
//! * **Consumers.** The connections that feed an EVD are one progress
//!   hook ([`rdapl::provider::Progress`]) of it, their group (`group`): a
//!   consumer that finds the EVD empty, or is about to wait on it, pumps
//!   them (read, place, complete) in its own thread. A pass over several
//!   asks once which sockets have input (a zero-timeout wait on the
//!   provider's second epoll set, the pollset, which holds every
//!   connection's socket) and pumps only those and the ones with
//!   something else to do (not `quiet`), so that its cost follows the
//!   connections that move, not how many share the EVD.
//! * **The thread.** While a consumer polls a connection (the last pass
//!   of one of its groups less than [`POLL_FRESH_MS`] ago, and no park of
//!   its groups since) the thread does not compete for its
//!   input: the first readiness it sees then takes `EPOLLIN` away from
//!   that socket, and the thread only checks every few milliseconds
//!   whether the polling stopped. A consumer about to block or to rely on
//!   a notification hands the input back at once (`park`); one that just
//!   stops polling gets it back within the IA's `poll_fresh_ms`
//!   ([`POLL_FRESH_MS`] by default). Output such a consumer's pass held
//!   back (an answer to the peer's fence, to ride with its reply) goes
//!   out at the thread's next check, at most [`HOLD_MS`] later, however
//!   long `poll_fresh_ms` is: the peer's send completes on it.
//!
//! Interest is level-triggered and follows what each connection can use
//! (no `EPOLLIN` while its input buffer is full or a Send waits for a
//! receive, `EPOLLOUT` only while output is pending); whoever pumped a
//! connection brings its registration up to date, and wakes the thread
//! when its timers or phase changed. Nothing spins when idle: the thread
//! sleeps until a socket, a command or the earliest timer (MPA timers,
//! connect timeouts, the receive wait, lingering closes, a polled
//! connection's check) is due. A listener whose `accept` fails for want
//! of descriptors or memory (its backlog stays readable) rests
//! `ACCEPT_REST_MS` before it listens again, so even a process out of
//! descriptors does not spin; the connections wait in the backlog.
//!
//! The thread's work per wake-up is in the connections it was woken for,
//! not in how many there are: it keeps the timers in a heap and looks
//! again (timers, interest, phase) only at the connections it pumped and
//! at those another thread's pump moved to an earlier timer or a new
//! phase (`Shared::settle` names them). A connection's timer may move
//! later than its entry in the heap (the entry then wakes the thread
//! early, which re-arms it), never earlier unseen.
//!
//! The thread ends when the provider and every IA opened from it are gone;
//! its connections are closed then (the peers see the end).

use crate::cm;
use crate::conn::{Conn, Phase};
use crate::group::Group;
use crate::params::IaParams;
use parking_lot::Mutex;
use rdapl::event::{EpHandle, EvdHandle};
use rdapl::provider::{CrInner, EpInner, SpInner};
use rdapl::{ConnectionEventKind, Result};
use rdapl_iwarp::{Connection, Role};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use rustix::event::epoll;
use rustix::event::{EventfdFlags, Timespec, eventfd};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

/// The eventfd's epoll key.
const WAKE: u64 = 0;

/// How long (ms) a listener rests after `accept` failed for want of
/// resources (descriptors, memory): its backlog stays readable, so
/// without a rest the thread would wake for it at once, again and again.
const ACCEPT_REST_MS: u64 = 50;

/// How long (ms) an accepted connection may wait for its MPA request
/// before its listener's cap on waiting connections may drop it: a burst
/// of real clients, all accepted before any request is read (300 at once
/// through one busy thread in a debug build), is not cut.
const SETUP_GRACE_MS: u64 = 1_000;

/// Most sockets one pass's readiness check names; more count as all.
const PASS_EVENTS: usize = 256;

thread_local! {
    /// A consumer thread's buffers for its passes' readiness checks.
    static PASS_READY: std::cell::RefCell<(Vec<epoll::Event>, Vec<u64>)> =
        std::cell::RefCell::new((Vec::with_capacity(PASS_EVENTS), Vec::with_capacity(PASS_EVENTS)));
}

/// A consumer whose last progress pass is younger than this (ms) is
/// polling: the thread leaves that connection's input to it (the default
/// of [`crate::TcpConfig::poll_fresh_ms`]).
pub const POLL_FRESH_MS: u64 = 3;

/// The longest a polled connection goes between the thread's checks, and
/// so the longest output held back by a consumer's pass waits (ms).
pub const HOLD_MS: u64 = POLL_FRESH_MS;

/// One connection, shared by the thread, posters and polling consumers.
pub(crate) struct ConnCell {
    pub conn: Mutex<Conn>,
    /// `Conn::stalled`, readable without the lock.
    pub stalled: Arc<AtomicBool>,
    /// The groups of the EVDs it feeds (set once it is established).
    groups: OnceLock<Vec<Membership>>,
    /// A poster found the lock taken: whoever releases it pumps again.
    kicked: AtomicBool,
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
    g: Option<parking_lot::MutexGuard<'a, Conn>>,
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
        let mut g = self.g.take();
        while let Some(guard) = g.take() {
            drop(guard);
            // The releaser's half of the Dekker pattern with `kick`: a
            // poster sets `kicked`, then tries the lock; the releaser
            // unlocks, then reads `kicked`.
            fence(Ordering::SeqCst);
            if !cell.kicked.load(Ordering::SeqCst) {
                return;
            }
            // Taken by someone else: its release looks again.
            if let Some(mut c) = cell.conn.try_lock() {
                if cell.kicked.swap(false, Ordering::SeqCst) {
                    cell.unquiet();
                    let before = (c.deadline(), c.phase);
                    c.pump(cell.sh.now());
                    cell.sh.settle(&mut c, before);
                }
                g = Some(c);
            }
        }
    }
}

impl ConnCell {
    pub fn lock(&self) -> ConnGuard<'_> {
        ConnGuard {
            cell: self,
            g: Some(self.conn.lock()),
        }
    }

    fn try_lock(&self) -> Option<ConnGuard<'_>> {
        self.conn.try_lock().map(|g| ConnGuard {
            cell: self,
            g: Some(g),
        })
    }

    /// New work for the connection (a send or a receive posted): pumps it
    /// from the caller's thread if the lock is free, else leaves it to the
    /// lock's holder, which pumps again when it lets go. Never waits.
    pub fn kick(&self) {
        self.kicked.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if let Some(mut c) = self.try_lock()
            && self.kicked.swap(false, Ordering::SeqCst)
        {
            let before = (c.deadline(), c.phase);
            c.pump_tx(self.sh.now());
            self.sh.settle(&mut c, before);
        }
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
    fn mark_busy(&self) {
        for m in self.memberships() {
            if !m.busy.swap(true, Ordering::AcqRel) {
                m.group.mark_busy(self.token);
            }
        }
    }

    /// Its groups' parks must look at it (its input left to the consumer,
    /// or output held back).
    fn claim(&self) {
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
    /// connection was just established).
    pub(crate) fn join_groups(self: &Arc<Self>, ep: &EpInner) {
        let mut mine = Vec::new();
        ep.attach_progress_per_evd(|evd| {
            let g = self.sh.group(evd);
            g.join(self);
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
    fn leave_groups(&self) {
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
        c.pump_polled(now);
        self.sh.settle(&mut c, before);
        if c.out_held {
            self.claim();
        }
        let quiet = c.quiet();
        if !quiet {
            self.mark_busy();
        }
        // Last, after every change of this pass (the guard's release may
        // pump again, and clears it then).
        self.quiet.store(quiet, Ordering::Release);
    }

    /// A park of one of its groups: what the consumer held goes back to
    /// the thread. Never waits for the lock (a consumer may park from a
    /// context that a holder waits for). Contended, it leaves the work to
    /// others, as `kick` does: the holder's release pumps (output held
    /// back goes out), and the thread, woken, hands the input back in its
    /// check of polled connections.
    pub(crate) fn park(&self) {
        let mut c = match self.try_lock() {
            Some(c) => c,
            None => {
                self.kicked.store(true, Ordering::SeqCst);
                fence(Ordering::SeqCst);
                match self.try_lock() {
                    Some(c) => c,
                    None => {
                        self.sh.wakeup();
                        return;
                    }
                }
            }
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

/// Work for the progress thread.
pub(crate) enum Cmd {
    Connect {
        ep: Arc<EpInner>,
        ia: Arc<IaParams>,
        /// Made by the caller (`cm::connect_socket`).
        sock: Option<socket2::Socket>,
        remote: SocketAddr,
        qual: u64,
        pd: Vec<u8>,
        timeout: Option<Duration>,
    },
    Accept {
        /// The connection the request came on.
        token: u64,
        cr: Arc<CrInner>,
        ep: Arc<EpInner>,
        pd: Vec<u8>,
    },
    Reject {
        token: u64,
        cr: Arc<CrInner>,
        pd: Vec<u8>,
    },
    Disconnect {
        ep: Arc<EpInner>,
    },
    /// The link fails (`EpOps::break_connection`): reset, `Broken`.
    Break {
        ep: Arc<EpInner>,
    },
    Kick {
        ep: Arc<EpInner>,
        recv: bool,
    },
    KickAll,
}

/// A listening socket and the service point it serves.
pub(crate) struct Listener {
    pub sock: TcpListener,
    pub sp: Weak<SpInner>,
    pub ia: Arc<IaParams>,
    /// Accepted connections that may still wait for their MPA request,
    /// oldest first: (token, accepted at, ms). Some may have moved on
    /// (pruned when the list passes the IA's `setups`).
    pub setups: std::collections::VecDeque<(u64, u64)>,
}

/// What the callers and the thread share.
pub(crate) struct Shared {
    epoll: OwnedFd,
    /// Every connection's socket, for consumers' passes: one zero-timeout
    /// wait a pass names the sockets with input (level-triggered), so that
    /// a pass over many connections makes one system call, not one each.
    pollset: OwnedFd,
    wake: OwnedFd,
    cmds: Mutex<Vec<Cmd>>,
    /// Listening sockets by epoll key; a caller removes (and so closes)
    /// one under this lock.
    pub listeners: Mutex<HashMap<u64, Listener>>,
    next_token: AtomicU64,
    /// When the thread wakes up next at the latest (ms; `u64::MAX`: only
    /// for a socket or a command), published before it sleeps.
    next_due: AtomicU64,
    /// Connections that a pump off the thread moved to an earlier timer
    /// or another phase: the thread looks at them again.
    retimed: Mutex<Vec<u64>>,
    stop: AtomicBool,
    start: Instant,
    /// Returns from `epoll_wait` (a diagnostic: idle means few).
    pub wakeups: AtomicU64,
    /// Connections the thread locked (a diagnostic: its work follows the
    /// connections that changed, not how many there are).
    pub looks: AtomicU64,
    /// The thread's checks of a polled connection that found it locked
    /// and waited for it (`Driver::check_polled`).
    pub polled_waits: AtomicU64,
    /// Counters the connections keep (diagnostics).
    pub stats: Arc<Stats>,
    /// Numbers consumers' passes and parks, in order (see [`Group`]).
    pub pass_seq: AtomicU64,
    /// The group of each EVD that connections of this instance feed.
    groups: Mutex<HashMap<EvdHandle, Weak<Group>>>,
}

/// What the connections of one provider instance count (diagnostics).
#[derive(Default)]
pub(crate) struct Stats {
    /// Payload bytes read from a socket straight into their destination.
    pub placed_direct: AtomicU64,
    /// Payload bytes queued for a socket by reference to registered
    /// memory (written from it, no staging copy).
    pub sent_direct: AtomicU64,
    /// System calls that wrote to a connection's socket.
    pub socket_writes: AtomicU64,
    /// System calls that read data from a connection's socket (not those
    /// that found none).
    pub socket_reads: AtomicU64,
    /// Zero-length reads posted as fences (`complete=placed`).
    pub fences: AtomicU64,
    /// Consumers' passes over a group (an EVD's connections).
    pub passes: AtomicU64,
    /// Connections a pass pumped.
    pub pass_pumps: AtomicU64,
    /// Connections a pass left alone (quiet, no input), without looking.
    pub pass_skips: AtomicU64,
    /// Accepted connections closed before their MPA request came, their
    /// listener holding its IA's `setups` already.
    pub setups_dropped: AtomicU64,
}

impl Shared {
    pub fn new() -> Result<Arc<Shared>> {
        let err = |e: rustix::io::Errno| rdapl::Error::Internal(format!("tcp: {e}"));
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC).map_err(err)?;
        let pollset = epoll::create(epoll::CreateFlags::CLOEXEC).map_err(err)?;
        let wake = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).map_err(err)?;
        epoll::add(
            &epoll,
            &wake,
            epoll::EventData::new_u64(WAKE),
            epoll::EventFlags::IN,
        )
        .map_err(err)?;
        Ok(Arc::new(Shared {
            epoll,
            pollset,
            wake,
            cmds: Mutex::new(Vec::new()),
            listeners: Mutex::new(HashMap::default()),
            next_token: AtomicU64::new(1),
            next_due: AtomicU64::new(u64::MAX),
            retimed: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            start: Instant::now(),
            wakeups: AtomicU64::new(0),
            looks: AtomicU64::new(0),
            polled_waits: AtomicU64::new(0),
            stats: Arc::default(),
            pass_seq: AtomicU64::new(0),
            groups: Mutex::new(HashMap::default()),
        }))
    }

    pub fn token(&self) -> u64 {
        self.next_token.fetch_add(1, Ordering::Relaxed)
    }

    pub fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Runs `f` with the tokens of the connections whose sockets have
    /// input (or an error) now, and whether every socket is to count as
    /// ready (the wait failed): one zero-timeout wait on the pollset. More
    /// ready than it names ([`PASS_EVENTS`]): the others come in later
    /// passes (a level-triggered epoll set hands out its ready sockets in
    /// turn: each one named goes to the back of the line).
    pub(crate) fn with_ready<R>(&self, f: impl FnOnce(&[u64], bool) -> R) -> R {
        PASS_READY.with(|b| {
            let (events, tokens) = &mut *b.borrow_mut();
            events.clear();
            tokens.clear();
            let zero = Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            let r = epoll::wait(
                &self.pollset,
                rustix::buffer::spare_capacity(events),
                Some(&zero),
            );
            let all = r.is_err();
            tokens.extend(events.iter().map(|e| e.data.u64()));
            f(tokens, all)
        })
    }

    /// The group of `evd`'s connections (made if none is alive).
    pub(crate) fn group(self: &Arc<Self>, evd: EvdHandle) -> Arc<Group> {
        let mut gs = self.groups.lock();
        if let Some(g) = gs.get(&evd).and_then(Weak::upgrade) {
            return g;
        }
        gs.retain(|_, w| w.strong_count() > 0);
        let g = Arc::new(Group::new(self.clone()));
        gs.insert(evd, Arc::downgrade(&g));
        g
    }

    /// Adds a connection's socket to the pollset.
    fn pollset_add(&self, c: &Conn) {
        let _ = epoll::add(
            &self.pollset,
            &c.sock,
            epoll::EventData::new_u64(c.token),
            epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
        );
    }

    /// Brings the epoll registration of `c` up to date.
    pub fn sync_interest(&self, c: &mut Conn) {
        if c.is_dead() {
            return;
        }
        let mut want = c.interest();
        if c.polled {
            want.0 = false;
        }
        if c.registered == Some(want) {
            return;
        }
        let fl = flags(want);
        let key = epoll::EventData::new_u64(c.token);
        let r = match c.registered {
            None => epoll::add(&self.epoll, &c.sock, key, fl),
            Some(_) => epoll::modify(&self.epoll, &c.sock, key, fl),
        };
        if r.is_ok() {
            c.registered = Some(want);
        }
    }

    /// After a pump off the thread: the registration brought up to date,
    /// and the thread woken if the connection's timers or phase changed
    /// (`before`: what they were).
    fn settle(&self, c: &mut Conn, before: (Option<u64>, Phase)) {
        self.sync_interest(c);
        let due = c.deadline();
        let earlier = due.is_some_and(|d| before.0.is_none_or(|b| d < b));
        let moved = c.phase != before.1;
        if earlier || moved {
            // Named before `next_due` is read: a thread that already took
            // the list published `u64::MAX` first, and is woken below.
            self.retimed.lock().push(c.token);
            let sooner = due.is_some_and(|d| d < self.next_due.load(Ordering::SeqCst));
            if moved || sooner {
                self.wakeup();
            }
        }
    }

    fn wakeup(&self) {
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }

    /// Queues `cmd` for the thread.
    pub fn send(&self, cmd: Cmd) {
        self.cmds.lock().push(cmd);
        self.wakeup();
    }

    /// Asks the thread to stop.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wakeup();
    }

    /// Registers a listening socket.
    pub fn add_listener(&self, l: Listener) -> Result<u64> {
        let token = self.token();
        epoll::add(
            &self.epoll,
            &l.sock,
            epoll::EventData::new_u64(token),
            epoll::EventFlags::IN,
        )
        .map_err(|e| rdapl::Error::Internal(format!("tcp: epoll: {e}")))?;
        self.listeners.lock().insert(token, l);
        Ok(token)
    }
}

/// The thread's own state.
struct Driver {
    sh: Arc<Shared>,
    conns: HashMap<u64, Arc<ConnCell>>,
    /// Live connections by endpoint, for the commands (posters find theirs
    /// in the endpoint's link: [`link_of`]).
    by_ep: HashMap<EpHandle, u64>,
    /// Connections whose input the thread left to a polling consumer.
    polled: HashSet<u64>,
    /// Connection timers, earliest first: (deadline, token). Lazy: an
    /// entry is live while `armed` holds its deadline for its token.
    timers: BinaryHeap<Reverse<(u64, u64)>>,
    /// The deadline each connection is armed with: never later than its
    /// own (`Conn::deadline`), unless it is in `touched` or
    /// `Shared::retimed`.
    armed: HashMap<u64, u64>,
    /// Connections the thread changed since it last looked at them.
    touched: HashSet<u64>,
    /// Every connection changed (a command that touched them all).
    all_touched: bool,
    /// Listeners resting after a failed `accept`: (until, token).
    resting: Vec<(u64, u64)>,
}

/// Starts the progress thread of `sh`.
pub(crate) fn spawn(sh: Arc<Shared>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("rdapl-tcp".into())
        .spawn(move || {
            let mut d = Driver {
                sh,
                conns: HashMap::default(),
                by_ep: HashMap::default(),
                polled: HashSet::default(),
                timers: BinaryHeap::new(),
                armed: HashMap::default(),
                touched: HashSet::default(),
                all_touched: false,
                resting: Vec::new(),
            };
            d.run();
        })
        .map(|_| ())
}

/// The thread's lock of a connection, counted in [`Shared::looks`].
fn look<'a>(sh: &Shared, cell: &'a ConnCell) -> ConnGuard<'a> {
    sh.looks.fetch_add(1, Ordering::Relaxed);
    cell.lock()
}

fn flags((r, w): (bool, bool)) -> epoll::EventFlags {
    let mut f = epoll::EventFlags::empty();
    if r {
        f |= epoll::EventFlags::IN | epoll::EventFlags::RDHUP;
    }
    if w {
        f |= epoll::EventFlags::OUT;
    }
    f
}

impl Driver {
    fn cell(&self, t: u64) -> Option<Arc<ConnCell>> {
        self.conns.get(&t).cloned()
    }

    /// The live connection of `ep`, out of the commands' map.
    fn take_by_ep(&mut self, ep: &EpInner) -> Option<Arc<ConnCell>> {
        let t = self.by_ep.remove(&ep.handle())?;
        self.touched.insert(t);
        self.cell(t)
    }

    /// The earliest live timer (stale entries dropped on the way).
    fn next_timer(&mut self) -> Option<u64> {
        while let Some(&Reverse((d, t))) = self.timers.peek() {
            if self.armed.get(&t) == Some(&d) {
                return Some(d);
            }
            self.timers.pop();
        }
        None
    }

    /// Runs the timers of the connections armed for `now` or earlier.
    fn fire_timers(&mut self, now: u64) {
        while let Some(&Reverse((d, t))) = self.timers.peek() {
            if d > now {
                break;
            }
            self.timers.pop();
            if self.armed.get(&t) != Some(&d) {
                continue; // re-armed since, or gone
            }
            self.armed.remove(&t);
            self.touched.insert(t);
            if let Some(cell) = self.cell(t) {
                let mut c = look(&self.sh, &cell);
                if c.deadline().is_some_and(|x| x <= now) {
                    c.on_timer(now);
                }
            }
        }
    }

    fn run(&mut self) {
        let mut events: Vec<epoll::Event> = Vec::with_capacity(256);
        let mut poll_due: Option<u64> = None;
        loop {
            if self.sh.stop.load(Ordering::SeqCst) {
                break;
            }
            // Published first: a connection whose timer changes after its
            // look here wakes the thread (`Shared::settle`).
            self.sh.next_due.store(u64::MAX, Ordering::SeqCst);
            self.tidy();
            let now = self.sh.now();
            let rest = self.resting.iter().map(|&(until, _)| until).min();
            let due = self
                .next_timer()
                .into_iter()
                .chain(poll_due)
                .chain(rest)
                .min();
            self.sh
                .next_due
                .store(due.unwrap_or(u64::MAX), Ordering::SeqCst);
            let timeout = due.map(|d| {
                let ms = d.saturating_sub(now).min(60_000);
                Timespec {
                    tv_sec: (ms / 1000) as i64,
                    tv_nsec: ((ms % 1000) * 1_000_000) as i64,
                }
            });
            events.clear();
            let _ = epoll::wait(
                &self.sh.epoll,
                rustix::buffer::spare_capacity(&mut events),
                timeout.as_ref(),
            );
            self.sh.wakeups.fetch_add(1, Ordering::Relaxed);
            let now = self.sh.now();
            let mut ready: Vec<(u64, epoll::EventFlags)> = Vec::new();
            let mut listeners: Vec<u64> = Vec::new();
            for ev in &events {
                match ev.data.u64() {
                    WAKE => {
                        let mut b = [0u8; 8];
                        let _ = rustix::io::read(&self.sh.wake, &mut b);
                    }
                    t if self.conns.contains_key(&t) => ready.push((t, ev.flags)),
                    t => listeners.push(t),
                }
            }
            for t in listeners {
                self.accept_all(t, now);
            }
            let cmds = std::mem::take(&mut *self.sh.cmds.lock());
            for c in cmds {
                self.command(c, now);
            }
            for (t, fl) in ready {
                self.ready(t, fl, now);
            }
            self.fire_timers(now);
            self.wake_listeners(now);
            poll_due = self.check_polled(now);
        }
        // Stopping: close every connection; the peers see the end.
        self.by_ep.clear();
        for c in self.conns.values() {
            look(&self.sh, c).close_local(self.sh.now());
        }
    }

    /// Gives the input of connections whose consumer stopped polling back
    /// to the thread; returns when to look again.
    fn check_polled(&mut self, now: u64) -> Option<u64> {
        let mut next: Option<u64> = None;
        let polled: Vec<u64> = self.polled.iter().copied().collect();
        let again = now.saturating_add(HOLD_MS);
        for t in polled {
            let Some(cell) = self.cell(t) else {
                self.polled.remove(&t);
                continue;
            };
            // (Read again under the lock below: `park` records itself,
            // then takes the lock, so the decision is made there.)
            let fresh = cell.polling(now);
            // Still polled and locked: its consumer's pass (or a post)
            // pumps it, and sends what the last pass held back. Waiting for
            // the lock would only make that holder wake the thread when it
            // lets go, on the consumer's path; looked at again within
            // HOLD_MS. No longer polled, the thread waits for the lock: the
            // input must come back to it.
            let mut c = match cell.try_lock() {
                Some(c) => {
                    self.sh.looks.fetch_add(1, Ordering::Relaxed);
                    c
                }
                None if fresh.is_some() => {
                    next = Some(next.map_or(again, |n| n.min(again)));
                    continue;
                }
                None => {
                    self.sh.polled_waits.fetch_add(1, Ordering::Relaxed);
                    look(&self.sh, &cell)
                }
            };
            match cell.polling(now) {
                Some(until) if c.polled => {
                    // Still polled: output its consumer held back goes now
                    // (the peer's send completes on it), and the next
                    // check comes within HOLD_MS.
                    if c.out_held {
                        c.pump_tx(now);
                        self.touched.insert(t);
                    }
                    let until = until.min(again);
                    next = Some(next.map_or(until, |n| n.min(until)));
                }
                _ => {
                    self.touched.insert(t);
                    self.polled.remove(&t);
                    if c.polled {
                        c.polled = false;
                        c.pump(now);
                    }
                }
            }
        }
        next
    }

    /// For the connections changed since the last look: updates epoll
    /// interest, the maps and the timers, and drops dead connections.
    fn tidy(&mut self) {
        let mut names: Vec<u64> = std::mem::take(&mut *self.sh.retimed.lock());
        if std::mem::take(&mut self.all_touched) {
            names.extend(self.conns.keys());
        }
        names.extend(self.touched.drain());
        names.sort_unstable();
        names.dedup();
        let mut dead = Vec::new();
        let mut gone = Vec::new();
        for t in names {
            let Some(cell) = self.conns.get(&t) else {
                self.armed.remove(&t);
                continue;
            };
            let mut c = look(&self.sh, cell);
            if c.phase != Phase::Open && c.phase != Phase::Connecting {
                gone.push(t);
            }
            if c.is_dead() {
                dead.push(t);
                continue;
            }
            self.sh.sync_interest(&mut c);
            if let Some(d) = c.deadline()
                && self.armed.get(&t).is_none_or(|a| d < *a)
            {
                self.armed.insert(t, d);
                self.timers.push(Reverse((d, t)));
            }
        }
        if !gone.is_empty() {
            self.by_ep.retain(|_, v| !gone.contains(v));
        }
        for t in dead {
            if let Some(cell) = self.conns.remove(&t) {
                cell.leave_groups();
                let mut c = look(&self.sh, &cell);
                if c.registered.take().is_some() {
                    let _ = epoll::delete(&self.sh.epoll, c.sock.as_fd());
                }
                let _ = epoll::delete(&self.sh.pollset, c.sock.as_fd());
                // Dead: nobody registers it again, and its endpoint, if
                // it still links it, lets go (the link would keep it, and
                // so the endpoint, alive).
                if let Some(ep) = c.ep.clone() {
                    let mut core = ep.core.lock();
                    let mine = core
                        .link_ref::<Arc<ConnCell>>()
                        .is_some_and(|l| Arc::ptr_eq(l, &cell));
                    if mine {
                        core.link = None;
                    }
                }
            }
            self.polled.remove(&t);
            self.armed.remove(&t);
        }
    }

    fn accept_all(&mut self, token: u64, now: u64) {
        let mut fresh = Vec::new();
        {
            let ls = self.sh.listeners.lock();
            let Some(l) = ls.get(&token) else {
                return;
            };
            let mut rest = false;
            for _ in 0..256 {
                match l.sock.accept() {
                    Ok((s, peer)) => {
                        if cm::prepare_accepted(&s, l.ia.timeout_ms).is_err() {
                            continue;
                        }
                        let qual = l.sp.upgrade().map_or(0, |sp| sp.conn_qual());
                        fresh.push((s, peer, l.sp.clone(), l.ia.clone(), qual));
                    }
                    Err(e) => {
                        use std::io::ErrorKind as K;
                        match e.kind() {
                            K::WouldBlock => {}
                            // That connection is gone; the next may not be.
                            K::Interrupted | K::ConnectionAborted => continue,
                            // Out of descriptors or memory: the connection
                            // waits in the backlog until the listener's rest
                            // is over.
                            _ => rest = true,
                        }
                        break;
                    }
                }
            }
            if rest {
                let _ = epoll::modify(
                    &self.sh.epoll,
                    &l.sock,
                    epoll::EventData::new_u64(token),
                    epoll::EventFlags::empty(),
                );
                self.resting
                    .push((now.saturating_add(ACCEPT_REST_MS), token));
            }
        }
        let mut accepted = Vec::with_capacity(fresh.len());
        for (s, peer, sp, ia, qual) in fresh {
            let t = self.sh.token();
            let mut c = Conn::new(t, s, ia, Role::Responder, (peer.ip(), qual));
            c.stats = self.sh.stats.clone();
            c.shared = Some(self.sh.clone());
            c.sp = Some(sp);
            let cfg = c.engine_config();
            match Connection::new(Role::Responder, cfg, now) {
                Ok(e) => c.engine = Some(e),
                Err(_) => continue,
            }
            let cell = self.insert(c);
            look(&self.sh, &cell).pump(now);
            self.after(t);
            accepted.push(t);
        }
        self.limit_setups(token, &accepted, now);
    }

    /// Keeps the connections of listener `token` that wait for their MPA
    /// request to the IA's `setups`: past it, the oldest that waited
    /// [`SETUP_GRACE_MS`] or more are closed (the consumer never saw them).
    /// A flood of idle connections then holds at most that many sockets
    /// (plus what arrives within the grace), and a real client, whose
    /// request comes a round trip after its connect, still gets in: the
    /// newest are kept.
    fn limit_setups(&mut self, token: u64, accepted: &[u64], now: u64) {
        let (mut list, cap) = {
            let mut ls = self.sh.listeners.lock();
            let Some(l) = ls.get_mut(&token) else {
                return;
            };
            l.setups.extend(accepted.iter().map(|&t| (t, now)));
            // In accept order: a front within the grace means none may
            // go, so the list is not walked (a burst costs nothing here).
            if l.setups.len() <= l.ia.setups
                || l.setups
                    .front()
                    .is_some_and(|&(_, at)| at.saturating_add(SETUP_GRACE_MS) > now)
            {
                return;
            }
            (std::mem::take(&mut l.setups), l.ia.setups)
        };
        list.retain(|(t, _)| {
            self.conns
                .get(t)
                .is_some_and(|c| look(&self.sh, c).in_setup())
        });
        while list.len() > cap
            && let Some(&(t, at)) = list.front()
            && at.saturating_add(SETUP_GRACE_MS) <= now
        {
            list.pop_front();
            if let Some(c) = self.conns.get(&t)
                && look(&self.sh, c).drop_setup()
            {
                self.touched.insert(t);
                self.sh.stats.setups_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Some(l) = self.sh.listeners.lock().get_mut(&token) {
            l.setups = list;
        }
    }

    /// Listeners whose rest is over listen again (and take what waits).
    fn wake_listeners(&mut self, now: u64) {
        if self.resting.iter().all(|&(until, _)| until > now) {
            return;
        }
        let mut due = Vec::new();
        self.resting.retain(|&(until, t)| {
            let over = until <= now;
            if over {
                due.push(t);
            }
            !over
        });
        for t in due {
            {
                let ls = self.sh.listeners.lock();
                let Some(l) = ls.get(&t) else {
                    continue; // freed meanwhile
                };
                let _ = epoll::modify(
                    &self.sh.epoll,
                    &l.sock,
                    epoll::EventData::new_u64(t),
                    epoll::EventFlags::IN,
                );
            }
            self.accept_all(t, now);
        }
    }

    /// Puts `c` behind its lock, in the maps.
    fn insert(&mut self, mut c: Conn) -> Arc<ConnCell> {
        let t = c.token;
        let cell = Arc::new_cyclic(|w: &Weak<ConnCell>| {
            c.hook = Some(w.clone());
            ConnCell {
                poll_fresh: c.ia.poll_fresh_ms,
                stalled: c.stalled.clone(),
                conn: Mutex::new(c),
                groups: OnceLock::new(),
                kicked: AtomicBool::new(false),
                quiet: AtomicBool::new(false),
                token: t,
                sh: self.sh.clone(),
            }
        });
        self.sh.pollset_add(&cell.conn.lock());
        self.conns.insert(t, cell.clone());
        self.touched.insert(t);
        self.after(t);
        cell
    }

    /// Records the maps of connection `t` after a change.
    fn after(&mut self, t: u64) {
        let Some(cell) = self.cell(t) else {
            return;
        };
        let c = look(&self.sh, &cell);
        if (c.phase == Phase::Open || c.phase == Phase::Connecting)
            && let Some(ep) = &c.ep
            && self.by_ep.insert(ep.handle(), t) != Some(t)
        {
            // Bound to its endpoint just now: posters find it there.
            ep.set_link(Box::new(cell.clone()));
        }
    }

    fn ready(&mut self, t: u64, fl: epoll::EventFlags, now: u64) {
        let Some(cell) = self.cell(t) else {
            return;
        };
        self.touched.insert(t);
        {
            let mut c = look(&self.sh, &cell);
            if c.phase == Phase::Connecting {
                match cm::connect_result(&c.sock) {
                    Ok(true) => c.start_mpa(now),
                    Ok(false) => {}
                    Err(kind) => c.connect_failed(kind, now),
                }
            } else {
                let only_input = !fl.intersects(
                    epoll::EventFlags::OUT
                        | epoll::EventFlags::ERR
                        | epoll::EventFlags::HUP
                        | epoll::EventFlags::RDHUP,
                );
                // A consumer polls this connection: leave its input to it
                // (read under the lock: `park` clears it before locking).
                if only_input && c.phase == Phase::Open && cell.polling(now).is_some() {
                    // On the groups' lists first, then freshness again: a
                    // park that came in between either takes it from a
                    // list or is seen here.
                    cell.claim();
                    if cell.polling(now).is_some() {
                        c.polled = true;
                        self.sh.sync_interest(&mut c);
                        self.polled.insert(t);
                        return;
                    }
                }
                c.pump(now);
                if fl.intersects(epoll::EventFlags::ERR | epoll::EventFlags::HUP) {
                    c.hung_up();
                    c.pump(now);
                }
            }
        }
        self.after(t);
    }

    fn command(&mut self, cmd: Cmd, now: u64) {
        match cmd {
            Cmd::Connect {
                ep,
                ia,
                sock,
                remote,
                qual,
                pd,
                timeout,
            } => {
                let t = self.sh.token();
                let s = match cm::start_connect(sock, ia.addr, remote, ia.timeout_ms) {
                    Ok(s) => s,
                    Err(kind) => {
                        ep.connect_failed(kind, None);
                        return;
                    }
                };
                let mut c = Conn::new(t, s, ia, Role::Initiator, (remote.ip(), qual));
                c.stats = self.sh.stats.clone();
                c.phase = Phase::Connecting;
                c.bind_ep(&ep);
                c.connect_pd = pd;
                c.connect_deadline = timeout.map(|d| now.saturating_add(d.as_millis() as u64));
                self.insert(c);
            }
            Cmd::Accept { token, cr, ep, pd } => {
                // The connection the request came on, if it still waits
                // for the answer.
                self.touched.insert(token);
                let cell = self.cell(token).filter(|cell| {
                    let c = look(&self.sh, cell);
                    c.phase == Phase::Open && c.cr.as_ref().is_some_and(|x| Arc::ptr_eq(x, &cr))
                });
                match cell {
                    Some(cell) => {
                        look(&self.sh, &cell).accept(&ep, &pd, now);
                        self.after(token);
                    }
                    None => {
                        ep.ended(ConnectionEventKind::AcceptCompletionError);
                    }
                }
            }
            Cmd::Reject { token, cr, pd } => {
                self.touched.insert(token);
                if let Some(cell) = self.cell(token) {
                    let mut c = look(&self.sh, &cell);
                    if c.phase == Phase::Open && c.cr.as_ref().is_some_and(|x| Arc::ptr_eq(x, &cr))
                    {
                        c.reject(&pd, now);
                    }
                }
            }
            Cmd::Disconnect { ep } => {
                let cell = self.take_by_ep(&ep);
                if let Some(cell) = cell {
                    look(&self.sh, &cell).close_local(now);
                }
            }
            Cmd::Break { ep } => {
                let cell = self.take_by_ep(&ep);
                if let Some(cell) = cell {
                    look(&self.sh, &cell).break_link(now);
                }
            }
            Cmd::Kick { ep, recv } => {
                let t = self.by_ep.get(&ep.handle()).copied();
                if let Some(t) = t {
                    self.touched.insert(t);
                }
                let cell = t.and_then(|t| self.cell(t));
                if let Some(cell) = cell {
                    let mut c = look(&self.sh, &cell);
                    if recv {
                        c.recv_posted(now);
                    } else {
                        c.pump(now);
                    }
                }
            }
            Cmd::KickAll => {
                self.all_touched = true;
                for cell in self.conns.values() {
                    look(&self.sh, cell).recv_posted(now);
                }
            }
        }
    }
}
