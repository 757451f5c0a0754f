//! The progress thread: it waits in epoll on the sockets, the listeners
//! and an eventfd; it accepts, sets connections up, runs their timers and
//! tears them down, and takes back the input of a connection whose
//! consumer stopped polling.
//!
//! * Nothing spins when idle: the thread sleeps until a socket, a command
//!   or the earliest timer is due.
//! * Its work per wake-up follows the connections it was woken for.

use super::*;

/// The thread's own state.
pub(super) struct Driver {
    sh: Arc<Shared>,
    conns: HashMap<u64, Arc<ConnCell>>,
    /// Live connections by endpoint, for the commands (posters find theirs
    /// in the endpoint's link: [`link_of`]).
    by_ep: HashMap<EpHandle, u64>,
    /// Connections whose input the thread left to a polling consumer.
    polled: HashSet<u64>,
    /// `polled` grew since its last check: the next check comes at once
    /// (it sets when to look again).
    polled_grew: bool,
    /// Connection timers, earliest first: (deadline, token). Lazy: an
    /// entry is live while `armed` holds its deadline for its token.
    timers: BinaryHeap<Reverse<(u64, u64)>>,
    /// The deadline each connection is armed with: never later than its
    /// own (`Conn::deadline`), unless it is in `touched` or
    /// `Shared::retimed`.
    armed: HashMap<u64, u64>,
    /// Connections the thread changed since it last looked at them.
    touched: HashSet<u64>,
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
                polled_grew: false,
                timers: BinaryHeap::new(),
                armed: HashMap::default(),
                touched: HashSet::default(),
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

pub(super) fn flags((r, w): (bool, bool)) -> epoll::EventFlags {
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
            // The polled connections when one's hold or freshness runs out
            // (and when the set grew, or a park could not hand some back):
            // not at every wake-up, which would make each one cost a look
            // at every polled connection.
            let asked = self.sh.recheck_polled.swap(false, Ordering::SeqCst);
            if std::mem::take(&mut self.polled_grew) || asked || poll_due.is_some_and(|d| d <= now)
            {
                poll_due = self.check_polled(now);
            }
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
                            _ => {
                                tracing::warn!(
                                    qual = l.sp.upgrade().map_or(0, |sp| sp.conn_qual()),
                                    error = %e,
                                    "accept failed: the listener rests {ACCEPT_REST_MS} ms, \
                                     its connections wait in the backlog"
                                );
                                rest = true;
                            }
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
            // (An IPv4 client of a dual-stack listener, an IA at `::`,
            // comes as `::ffff:a.b.c.d`: named by its IPv4 address.)
            let peer = peer.ip().to_canonical();
            let mut c = Conn::new(t, s, ia, Role::Responder, (peer, qual));
            c.stats = self.sh.stats.clone();
            c.srq_waits = self.sh.srq_waits.clone();
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
    /// (plus what arrives within the grace and
    /// [`setups::GRACE_WALK_GAP_MS`]), and a real client, whose request
    /// comes a round trip after its connect, still gets in: the newest are
    /// kept.
    fn limit_setups(&mut self, token: u64, accepted: &[u64], now: u64) {
        let (mut list, cap) = {
            let mut ls = self.sh.listeners.lock();
            let Some(l) = ls.get_mut(&token) else {
                return;
            };
            let cap = l.ia.setups;
            match l.setups.add(accepted, now, cap) {
                Some(list) => (list, cap),
                None => return,
            }
        };
        setups::walk(
            &mut list,
            cap,
            now,
            |t| {
                self.conns
                    .get(&t)
                    .is_some_and(|c| look(&self.sh, c).in_setup())
            },
            |t| {
                if let Some(c) = self.conns.get(&t)
                    && look(&self.sh, c).drop_setup()
                {
                    tracing::info!(
                        conn = t,
                        setups = cap,
                        "a connection that sent no MPA request is closed: its listener has \
                         more than `setups` waiting"
                    );
                    self.touched.insert(t);
                    self.sh.stats.setups_dropped.fetch_add(1, Ordering::Relaxed);
                }
            },
        );
        if let Some(l) = self.sh.listeners.lock().get_mut(&token) {
            l.setups.put_back(list, cap, now);
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
            ConnCell::new(c, self.sh.clone())
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
                    Err(f) => c.connect_failed(f.kind, f.why, now),
                }
            } else {
                let only_input = !fl.intersects(
                    epoll::EventFlags::OUT
                        | epoll::EventFlags::ERR
                        | epoll::EventFlags::HUP
                        | epoll::EventFlags::RDHUP,
                );
                // A consumer polls this connection: leave its input to it.
                if only_input && self.leave_input(t, &cell, &mut c, now) {
                    return;
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

    /// If a consumer polls open connection `t` (read under the lock:
    /// `park` clears it before locking), leaves its input to it: the
    /// thread stops polling the socket for input and looks at the
    /// connection again when the consumer's passes stop
    /// ([`Driver::check_polled`]). True if it did.
    fn leave_input(&mut self, t: u64, cell: &ConnCell, c: &mut Conn, now: u64) -> bool {
        if c.phase != Phase::Open || cell.polling(now).is_none() {
            return false;
        }
        // On the groups' lists first, then freshness again: a park that
        // came in between either takes it from a list or is seen here.
        cell.claim();
        if cell.polling(now).is_none() {
            return false;
        }
        c.polled = true;
        self.sh.sync_interest(c);
        self.polled.insert(t);
        self.polled_grew = true;
        true
    }

    fn command(&mut self, cmd: Cmd, now: u64) {
        match cmd {
            Cmd::Connect {
                ep,
                attempt,
                ia,
                sock,
                remote,
                qual,
                pd,
                timeout,
            } => {
                // Withdrawn before the thread got here (a free, a
                // disconnect or an abrupt close on another thread, once the
                // core let go of the endpoint; perhaps a reset and another
                // attempt since): its end was raised already, and its
                // withdrawal, queued ahead of this command (or behind it,
                // in this batch), finds no connection by the endpoint.
                // Nothing is started (the socket closes unused). A
                // withdrawal after this look is queued after it, and finds
                // the connection by its endpoint.
                if !ep.lock().is_attempt(attempt) {
                    return;
                }
                let t = self.sh.token();
                let s = match cm::start_connect(sock, ia.addr, remote, ia.timeout_ms) {
                    Ok(s) => s,
                    Err(f) => {
                        tracing::warn!(
                            local = %ia.addr,
                            peer = %remote.ip(),
                            qual,
                            end = ?f.kind,
                            why = %f.why,
                            "connect failed before it began"
                        );
                        ep.connect_failed(attempt, f.kind, None);
                        return;
                    }
                };
                let mut c = Conn::new(t, s, ia, Role::Initiator, (remote.ip(), qual));
                c.stats = self.sh.stats.clone();
                c.srq_waits = self.sh.srq_waits.clone();
                c.phase = Phase::Connecting;
                c.bind_ep(&ep);
                c.connect_pd = pd;
                c.attempt = attempt;
                // (A timeout past u64 milliseconds is none: cut to 64
                // bits, it could come out a few milliseconds.)
                c.connect_deadline = timeout
                    .map(|d| now.saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)));
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
                // The endpoint left `PassiveConnectionPending` before the
                // thread got here (an abrupt close of its IA on another
                // thread: the endpoint is aborted, and its withdrawal,
                // queued ahead of this command or behind it in this batch,
                // finds no connection by the endpoint): the request is
                // answered as a closing IA answers those still pending,
                // with a reject. A withdrawal after this look is queued
                // after it, and finds the connection by its endpoint.
                let withdrawn = ep.lock().state() != rdapl::EpState::PassiveConnectionPending;
                match cell {
                    Some(cell) if withdrawn => {
                        look(&self.sh, &cell).reject(&[], now);
                    }
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
            Cmd::Adopt { token } => {
                let Some(cell) = self.cell(token) else {
                    return;
                };
                self.touched.insert(token);
                let mut c = look(&self.sh, &cell);
                c.adopt_asked = false;
                if !c.polled {
                    self.leave_input(token, &cell, &mut c, now);
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
        }
    }
}
