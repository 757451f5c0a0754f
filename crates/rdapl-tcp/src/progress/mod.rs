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
//!   socket from the poster's thread. Contended, it leaves the pump to
//!   the lock's holder, whose release pumps again (`kick.rs`, a lock
//!   that kickers never wait for, model-checked with loom); before the
//!   connection is linked to its endpoint, it queues a `Cmd` for the
//!   thread. A posted receive kicks only if a Send of the
//!   peer waits for one (`Conn::stalled`, a Dekker pair with the stall);
//!   one posted to an SRQ kicks the connections of its endpoints that
//!   wait (`SrqWaits`), and nothing while none does.
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
//!   that socket (so does a consumer's pass that read the input first:
//!   it asks the thread, `Cmd::Adopt`), and the thread only checks every
//!   few milliseconds
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
//! No connection keeps the thread that pumps it: a pump stops after
//! `PUMP_ROUNDS` rounds (`conn/mod.rs`) while its connection still moves,
//! and a release after `REPUMPS` pumps for kicks raised meanwhile
//! (`cell.rs`); the connection is then due at once, and the thread pumps
//! it on after its other connections, timers and set-ups. (A consumer
//! refilling a stream as fast as it completed, the socket taking every
//! byte, held the thread for as long as the stream lasted.)
//!
//! The thread's work per wake-up is in the connections it was woken for,
//! not in how many there are: it keeps the timers in a heap and looks
//! again (timers, interest, phase) only at the connections it pumped and
//! at those another thread's pump moved to an earlier timer or a new
//! phase (`Shared::settle` names them). A connection's timer may move
//! later than its entry in the heap (the entry then wakes the thread
//! early, which re-arms it), never earlier unseen. The connections whose
//! input it left to a polling consumer are looked at when one's hold or
//! freshness runs out (within `HOLD_MS`), when one joins them, and when
//! a park could not hand one back; not at every wake-up.
//!
//! The thread ends when the provider and every IA opened from it are gone;
//! its connections are closed then (the peers see the end).
//!
//! This file holds what the thread and the other threads share (commands,
//! listeners, counters, the pollset); `kick.rs` is the protocol of a
//! connection's lock, `cell.rs` the lock and what its holders do,
//! `driver.rs` the thread itself.

use crate::cm;
use crate::conn::{Conn, Phase};
use crate::group::Group;
use crate::params::IaParams;
use parking_lot::Mutex;
use rdapl::event::{EpHandle, EvdHandle};
use rdapl::provider::{Attempt, CrInner, EpInner, SpInner};
use rdapl::{ConnectionEventKind, Result};
use rdapl_iwarp::{Connection, Role};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use rustix::event::epoll;
use rustix::event::{EventfdFlags, Timespec, eventfd};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

mod cell;
mod driver;
mod kick;
mod setups;
mod srq_waits;

pub(crate) use cell::{ConnCell, ConnGuard, link_of};
use driver::flags;
pub(crate) use driver::spawn;
pub(crate) use srq_waits::SrqWaits;

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

/// Work for the progress thread.
pub(crate) enum Cmd {
    Connect {
        ep: Arc<EpInner>,
        /// The endpoint's attempt (started only if still the endpoint's).
        attempt: Attempt,
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
    /// A consumer's pass read connection `token`'s input while the thread
    /// still polled for it (`ConnCell::pass`): leave it to the consumer
    /// while it is fresh, as when the thread sees the input first.
    Adopt {
        token: u64,
    },
}

/// A listening socket and the service point it serves.
pub(crate) struct Listener {
    pub sock: TcpListener,
    pub sp: Weak<SpInner>,
    pub ia: Arc<IaParams>,
    /// Accepted connections that may still wait for their MPA request.
    pub setups: setups::Setups,
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
    /// A park could not take a connection's lock to hand its input back:
    /// the thread checks its polled connections at its next wake-up.
    pub recheck_polled: AtomicBool,
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
    /// Connections whose peer's Send waits for a receive of an SRQ: a
    /// receive posted to an SRQ kicks those of its endpoints.
    pub srq_waits: Arc<SrqWaits>,
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
    /// Zero-length reads posted to ask an idle peer whether it is there.
    pub heartbeats: AtomicU64,
    /// Consumers' passes over a group (an EVD's connections).
    pub passes: AtomicU64,
    /// Passes that yielded the CPU (`poll_yield`).
    pub poll_yields: AtomicU64,
    /// Connections a pass pumped.
    pub pass_pumps: AtomicU64,
    /// Connections a pass left alone (quiet, no input), without looking.
    pub pass_skips: AtomicU64,
    /// Accepted connections closed before their MPA request came, their
    /// listener holding its IA's `setups` already.
    pub setups_dropped: AtomicU64,
    /// Times a connection's FPDUs shrank with its path's MSS.
    pub mss_shrinks: AtomicU64,
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
            recheck_polled: AtomicBool::new(false),
            start: Instant::now(),
            wakeups: AtomicU64::new(0),
            looks: AtomicU64::new(0),
            polled_waits: AtomicU64::new(0),
            stats: Arc::default(),
            srq_waits: Arc::default(),
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
