//! The progress engine: one thread per [`crate::Tcp`] instance.
//!
//! The thread owns every connection ([`crate::conn::Conn`]) and waits in
//! `epoll_wait` on their non-blocking sockets, the listening sockets and an
//! eventfd. Callers (the transports' methods, on the consumer's threads)
//! queue a [`Cmd`] and write the eventfd; nothing else of a connection is
//! shared. Interest is level-triggered and follows what each connection
//! can use (no `EPOLLIN` while its input buffer is full or a Send waits for
//! a receive, `EPOLLOUT` only while output is pending), so nothing spins
//! when idle: the thread sleeps until a socket, a command or the earliest
//! timer (MPA timers, connect timeouts, the receive wait, lingering
//! closes) is due.
//!
//! The thread ends when the provider and every IA opened from it are gone;
//! its connections are closed then (the peers see the end).

use crate::cm;
use crate::conn::{Conn, Phase};
use crate::params::IaParams;
use parking_lot::Mutex;
use rdapl::event::{CrHandle, EpHandle};
use rdapl::provider::{CrInner, EpInner, SpInner};
use rdapl::{ConnectionEventKind, Result};
use rdapl_iwarp::{Connection, Role};
use rustix::event::epoll;
use rustix::event::{EventfdFlags, Timespec, eventfd};
use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// The eventfd's epoll key.
const WAKE: u64 = 0;

/// Work for the progress thread.
pub(crate) enum Cmd {
    Connect {
        ep: Arc<EpInner>,
        ia: Arc<IaParams>,
        remote: SocketAddr,
        qual: u64,
        pd: Vec<u8>,
        timeout: Option<Duration>,
    },
    Accept {
        cr: Arc<CrInner>,
        ep: Arc<EpInner>,
        pd: Vec<u8>,
    },
    Reject {
        cr: Arc<CrInner>,
        pd: Vec<u8>,
    },
    Disconnect {
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
}

/// What the callers and the thread share.
pub(crate) struct Shared {
    epoll: OwnedFd,
    wake: OwnedFd,
    cmds: Mutex<Vec<Cmd>>,
    /// Listening sockets by epoll key; a caller removes (and so closes)
    /// one under this lock.
    pub listeners: Mutex<HashMap<u64, Listener>>,
    next_token: AtomicU64,
    stop: AtomicBool,
    start: Instant,
    /// Returns from `epoll_wait` (a diagnostic: idle means few).
    pub wakeups: AtomicU64,
}

impl Shared {
    pub fn new() -> Result<Arc<Shared>> {
        let err = |e: rustix::io::Errno| rdapl::Error::Internal(format!("tcp: {e}"));
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC).map_err(err)?;
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
            wake,
            cmds: Mutex::new(Vec::new()),
            listeners: Mutex::new(HashMap::new()),
            next_token: AtomicU64::new(1),
            stop: AtomicBool::new(false),
            start: Instant::now(),
            wakeups: AtomicU64::new(0),
        }))
    }

    pub fn token(&self) -> u64 {
        self.next_token.fetch_add(1, Ordering::Relaxed)
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
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
    conns: HashMap<u64, Conn>,
    /// Interest registered per connection.
    interest: HashMap<u64, (bool, bool)>,
    by_ep: HashMap<EpHandle, u64>,
    by_cr: HashMap<CrHandle, u64>,
}

/// Starts the progress thread of `sh`.
pub(crate) fn spawn(sh: Arc<Shared>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("rdapl-tcp".into())
        .spawn(move || {
            let mut d = Driver {
                sh,
                conns: HashMap::new(),
                interest: HashMap::new(),
                by_ep: HashMap::new(),
                by_cr: HashMap::new(),
            };
            d.run();
        })
        .map(|_| ())
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
    fn run(&mut self) {
        let mut events: Vec<epoll::Event> = Vec::with_capacity(256);
        loop {
            if self.sh.stop.load(Ordering::SeqCst) {
                break;
            }
            let now = self.sh.now();
            let timeout = self
                .conns
                .values()
                .filter_map(|c| c.deadline())
                .min()
                .map(|d| {
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
            let mut ready: Vec<u64> = Vec::new();
            let mut listeners: Vec<u64> = Vec::new();
            for ev in &events {
                match ev.data.u64() {
                    WAKE => {
                        let mut b = [0u8; 8];
                        let _ = rustix::io::read(&self.sh.wake, &mut b);
                    }
                    t if self.conns.contains_key(&t) => ready.push(t),
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
            for t in ready {
                self.ready(t, now);
            }
            let due: Vec<u64> = self
                .conns
                .iter()
                .filter(|(_, c)| c.deadline().is_some_and(|d| d <= now))
                .map(|(t, _)| *t)
                .collect();
            for t in due {
                if let Some(c) = self.conns.get_mut(&t) {
                    c.on_timer(now);
                }
            }
            self.tidy();
        }
        // Stopping: close every connection; the peers see the end.
        for c in self.conns.values_mut() {
            c.close_local(self.sh.now());
        }
    }

    /// Updates epoll interest, the maps, and drops dead connections.
    fn tidy(&mut self) {
        let mut dead = Vec::new();
        for (t, c) in self.conns.iter_mut() {
            if c.phase != Phase::Open && c.phase != Phase::Connecting {
                self.by_ep.retain(|_, v| v != t);
                self.by_cr.retain(|_, v| v != t);
            }
            if c.is_dead() {
                dead.push(*t);
                continue;
            }
            let want = c.interest();
            let had = self.interest.get(t).copied();
            if had != Some(want) {
                let fl = flags(want);
                let r = match had {
                    None => epoll::add(&self.sh.epoll, &c.sock, epoll::EventData::new_u64(*t), fl),
                    Some(_) => {
                        epoll::modify(&self.sh.epoll, &c.sock, epoll::EventData::new_u64(*t), fl)
                    }
                };
                if r.is_ok() {
                    self.interest.insert(*t, want);
                }
            }
        }
        for t in dead {
            if let Some(c) = self.conns.remove(&t) {
                let _ = epoll::delete(&self.sh.epoll, c.sock.as_fd());
            }
            self.interest.remove(&t);
            self.by_ep.retain(|_, v| *v != t);
            self.by_cr.retain(|_, v| *v != t);
        }
    }

    fn accept_all(&mut self, token: u64, now: u64) {
        let mut fresh = Vec::new();
        {
            let ls = self.sh.listeners.lock();
            let Some(l) = ls.get(&token) else {
                return;
            };
            for _ in 0..256 {
                match l.sock.accept() {
                    Ok((s, peer)) => {
                        if cm::prepare_accepted(&s, l.ia.timeout_ms).is_err() {
                            continue;
                        }
                        let qual = l.sp.upgrade().map_or(0, |sp| sp.conn_qual());
                        fresh.push((s, peer, l.sp.clone(), l.ia.clone(), qual));
                    }
                    Err(_) => break,
                }
            }
        }
        for (s, peer, sp, ia, qual) in fresh {
            let t = self.sh.token();
            let mut c = Conn::new(t, s, ia, Role::Responder, (peer.ip(), qual));
            c.sp = Some(sp);
            let cfg = c.engine_config();
            match Connection::new(Role::Responder, cfg, now) {
                Ok(e) => c.engine = Some(e),
                Err(_) => continue,
            }
            c.pump(now);
            self.insert(c);
        }
    }

    fn insert(&mut self, c: Conn) {
        let t = c.token;
        if let Some(h) = c.ep_handle() {
            self.by_ep.insert(h, t);
        }
        self.conns.insert(t, c);
        self.after(t);
    }

    /// Records the maps of connection `t` after a change.
    fn after(&mut self, t: u64) {
        let Some(c) = self.conns.get(&t) else {
            return;
        };
        if c.phase == Phase::Open || c.phase == Phase::Connecting {
            if let Some(h) = c.ep_handle() {
                self.by_ep.insert(h, t);
            }
        }
        // (A request delivered to the core is keyed by its handle.)
        if let Some(cr) = self.conns.get(&t).and_then(|c| c.cr_handle()) {
            self.by_cr.insert(cr, t);
        }
    }

    fn ready(&mut self, t: u64, now: u64) {
        let Some(c) = self.conns.get_mut(&t) else {
            return;
        };
        if c.phase == Phase::Connecting {
            match cm::connect_result(&c.sock) {
                Ok(true) => c.start_mpa(now),
                Ok(false) => {}
                Err(kind) => c.connect_failed(kind, now),
            }
        } else {
            c.pump(now);
        }
        self.after(t);
    }

    fn command(&mut self, cmd: Cmd, now: u64) {
        match cmd {
            Cmd::Connect {
                ep,
                ia,
                remote,
                qual,
                pd,
                timeout,
            } => {
                let t = self.sh.token();
                let s = match cm::start_connect(ia.addr, remote, ia.timeout_ms) {
                    Ok(s) => s,
                    Err(kind) => {
                        ep.connect_failed(kind, None);
                        return;
                    }
                };
                let mut c = Conn::new(t, s, ia, Role::Initiator, (remote.ip(), qual));
                c.phase = Phase::Connecting;
                c.bind_ep(&ep);
                c.connect_pd = pd;
                c.connect_deadline = timeout.map(|d| now.saturating_add(d.as_millis() as u64));
                self.insert(c);
            }
            Cmd::Accept { cr, ep, pd } => {
                let t = self.by_cr.remove(&cr.handle());
                match t.and_then(|t| self.conns.get_mut(&t).map(|c| (t, c))) {
                    Some((t, c)) => {
                        c.accept(&ep, &pd, now);
                        self.after(t);
                    }
                    None => {
                        ep.ended(ConnectionEventKind::AcceptCompletionError);
                    }
                }
            }
            Cmd::Reject { cr, pd } => {
                if let Some(t) = self.by_cr.remove(&cr.handle())
                    && let Some(c) = self.conns.get_mut(&t)
                {
                    c.reject(&pd, now);
                }
            }
            Cmd::Disconnect { ep } => {
                if let Some(t) = self.by_ep.remove(&ep.handle())
                    && let Some(c) = self.conns.get_mut(&t)
                {
                    c.close_local(now);
                }
            }
            Cmd::Kick { ep, recv } => {
                if let Some(t) = self.by_ep.get(&ep.handle())
                    && let Some(c) = self.conns.get_mut(t)
                {
                    if recv {
                        c.recv_posted(now);
                    } else {
                        c.pump(now);
                    }
                }
            }
            Cmd::KickAll => {
                for c in self.conns.values_mut() {
                    c.recv_posted(now);
                }
            }
        }
    }
}
