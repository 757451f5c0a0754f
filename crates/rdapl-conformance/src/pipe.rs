//! "pipe": a provider written outside the core crate with its public
//! provider interface alone (`rdapl::provider`). It connects IAs of one
//! process and moves every request on a progress thread of its own, so
//! completions arrive asynchronously, never inside the poster's call (as a
//! network provider's do). The suite runs on it (`tests/pipe.rs` of this
//! crate), and its `provider_public` cases open it by name; it is also a
//! short example of a provider on the public interface.

use rdapl::error::Subtype;
use rdapl::event::CrHandle;
use rdapl::event::{PzHandle, SrqHandle};
use rdapl::provider::soft::{Timer, TimerKey};
use rdapl::provider::{
    Attempt, CrInner, CrOps, CrState, EpInfo, EpInner, EpOps, ListenerOps, NewWr, Provider,
    SpInner, SrqOps, Transport, WrKind,
};
use rdapl::*;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

// ----- the provider -------------------------------------------------------------

/// The provider: every IA opened on one `Pipe` reaches the others.
pub struct Pipe {
    fabric: Arc<Fabric>,
}

/// A request in flight: the request, its active endpoint and the job
/// that times it out.
type Pending = (Arc<CrInner>, Weak<EpInner>, Attempt, Option<TimerKey>);

/// A connected endpoint's peer, the peer's connection number and its own:
/// the pipe's state of a connection, kept in the endpoint's link slot
/// ([`EpInner::set_link`]; the core drops it when the endpoint leaves).
type PeerOf = (Weak<EpInner>, u64, u64);

/// What the IAs of one pipe share: listeners, requests in flight and the
/// progress thread's queue.
struct Fabric {
    listeners: Mutex<HashMap<(IpAddr, u64), Weak<SpInner>>>,
    /// IAs open at each address (an address with none is unreachable).
    addresses: Mutex<HashMap<IpAddr, usize>>,
    /// Requests in flight: the request and its active endpoint.
    pending: Mutex<HashMap<CrHandle, Pending>>,
    /// Times connects out (one thread for all the requests in flight).
    timer: Arc<Timer>,
    jobs: Mutex<mpsc::Sender<Weak<EpInner>>>,
    /// Held from taking a peer's receive to completing it: an end of the
    /// connection (which flushes the receives still queued, the later
    /// ones) waits for it, so receive completions stay in order.
    moving: Mutex<()>,
}

impl Pipe {
    pub fn new() -> Arc<Pipe> {
        let (tx, rx) = mpsc::channel::<Weak<EpInner>>();
        let fabric = Arc::new(Fabric {
            listeners: Mutex::new(HashMap::new()),
            addresses: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            timer: Timer::new("rdapl-pipe-timer"),
            jobs: Mutex::new(tx),
            moving: Mutex::new(()),
        });
        let f = Arc::downgrade(&fabric);
        std::thread::spawn(move || {
            while let Ok(ep) = rx.recv() {
                let (Some(f), Some(ep)) = (f.upgrade(), ep.upgrade()) else {
                    continue;
                };
                f.progress(&ep);
            }
        });
        Arc::new(Pipe { fabric })
    }
}

impl Provider for Pipe {
    fn attr(&self) -> ProviderAttr {
        ProviderAttr {
            name: "pipe".into(),
            description: "test provider outside the core crate".into(),
            ..Loopback::new().attr()
        }
    }

    fn ia_attr(&self, address: IpAddr) -> IaAttr {
        IaAttr {
            adapter_name: "pipe0".into(),
            ..Loopback::new().ia_attr(address)
        }
    }

    fn open(&self, address: Option<IpAddr>, params: &str) -> Result<Arc<dyn Transport>> {
        let addr = address
            .or_else(|| params.strip_prefix("addr=").and_then(|a| a.parse().ok()))
            .ok_or(Error::InvalidParameter {
                arg: 1,
                what: "pipe: addr=IP",
            })?;
        *self
            .fabric
            .addresses
            .lock()
            .unwrap()
            .entry(addr)
            .or_insert(0) += 1;
        Ok(Arc::new(PipeIa {
            f: self.fabric.clone(),
            addr,
            closed: std::sync::atomic::AtomicBool::new(false),
        }))
    }
}

struct PipeIa {
    f: Arc<Fabric>,
    addr: IpAddr,
    closed: std::sync::atomic::AtomicBool,
}

impl Drop for Fabric {
    fn drop(&mut self) {
        // Its thread ends; jobs not run yet never run.
        self.timer.stop();
    }
}

impl Fabric {
    /// Takes request `h` out of the requests in flight (its timeout job
    /// cancelled); its active endpoint, if it was there.
    fn take_pending(&self, h: CrHandle) -> Option<(Weak<EpInner>, Attempt)> {
        let (_, active, attempt, job) = self.pending.lock().unwrap().remove(&h)?;
        self.cancel(job);
        Some((active, attempt))
    }

    /// Cancels a request's timeout job, if it has one.
    fn cancel(&self, job: Option<TimerKey>) {
        if let Some(key) = job {
            self.timer.cancel(key);
        }
    }

    fn kick(&self, ep: &Arc<EpInner>) {
        let _ = self.jobs.lock().unwrap().send(Arc::downgrade(ep));
    }

    fn peer(&self, ep: &EpInner) -> Option<(Arc<EpInner>, u64, u64)> {
        let (p, pc, mc) = ep.lock().link_ref::<PeerOf>()?.clone();
        Some((p.upgrade()?, pc, mc))
    }

    /// Ends both sides of `ep`'s connection with `kind` (the peer's only
    /// if it is still in that connection).
    fn end(&self, ep: &Arc<EpInner>, kind: ConnectionEventKind) {
        let _moving = self.moving.lock().unwrap();
        let peer = self.peer(ep);
        ep.ended(kind);
        if let Some((p, peer_conn, _)) = peer
            && p.lock().connection() == peer_conn
        {
            p.ended(kind);
        }
    }

    /// Executes `ep`'s queued requests in order until the queue is empty
    /// or the head waits for a receive of the peer.
    fn progress(&self, ep: &Arc<EpInner>) {
        loop {
            // (Lock order: `moving`, an endpoint.)
            let moving = self.moving.lock().unwrap();
            let Some((peer, peer_conn, my_conn)) = self.peer(ep) else {
                return;
            };
            let mut core = ep.lock();
            if core.connection() != my_conn {
                return;
            }
            let Some(kind) = core.front_send().map(|w| w.kind()) else {
                return;
            };
            match kind {
                WrKind::Send | WrKind::SendInvalidate(_) => {
                    // Waits (for a kick) until the peer posts a receive.
                    let Some(mut r) = peer.take_recv(peer_conn) else {
                        return;
                    };
                    let wr = core.pop_send().unwrap();
                    drop(core);
                    if wr.is_solicited() {
                        r.set_solicited();
                    }
                    // A Send with Invalidate: a key the peer cannot
                    // invalidate moves nothing.
                    let inval = match kind {
                        WrKind::SendInvalidate(k) => Some(k),
                        _ => None,
                    };
                    if let Some(k) = inval
                        && peer.invalidate_remote(k).is_err()
                    {
                        ep.complete(wr, DtoStatus::RemoteAccess, 0);
                        peer.complete_recv(r, DtoStatus::Flushed, 0);
                        drop(moving);
                        return self.end(ep, ConnectionEventKind::Broken);
                    }
                    let mut data = Vec::new();
                    if let Err(st) = ep.gather(&wr, &mut data) {
                        ep.complete(wr, st, 0);
                        peer.complete_recv(r, DtoStatus::Flushed, 0);
                        drop(moving);
                        return self.end(ep, ConnectionEventKind::Broken);
                    }
                    // Placed in segments of 5 bytes, as a wire would
                    // deliver them (the last segment checks the length).
                    // Too long for the receive: refused before a byte moves.
                    let mut placed = if data.len() as u64 > r.capacity() {
                        Err(DtoStatus::LocalLength)
                    } else {
                        Ok(0)
                    };
                    for (k, seg) in data.chunks(5).enumerate() {
                        if placed.is_err() {
                            break;
                        }
                        placed = peer.scatter_at(&mut r, 5 * k as u64, seg);
                    }
                    if data.is_empty() {
                        placed = peer.scatter(&mut r, &data);
                    }
                    match placed.map(|_| data.len() as u64) {
                        Ok(n) => {
                            ep.complete(wr, DtoStatus::Success, n);
                            match inval {
                                Some(k) => peer.complete_recv_invalidated(r, n, k),
                                None => peer.complete_recv(r, DtoStatus::Success, n),
                            }
                        }
                        Err(st) => {
                            ep.complete(wr, DtoStatus::RemoteResponder, 0);
                            peer.complete_recv(r, st, 0);
                            drop(moving);
                            return self.end(ep, ConnectionEventKind::Broken);
                        }
                    }
                }
                WrKind::RdmaWrite(rt) => {
                    let wr = core.pop_send().unwrap();
                    drop(core);
                    let mut data = Vec::new();
                    let moved = ep
                        .gather(&wr, &mut data)
                        .and_then(|()| peer.remote_write(rt, &data));
                    match moved {
                        Ok(()) => ep.complete(wr, DtoStatus::Success, data.len() as u64),
                        Err(st) => {
                            ep.complete(wr, st, 0);
                            drop(moving);
                            return self.end(ep, ConnectionEventKind::Broken);
                        }
                    }
                }
                WrKind::RdmaRead(rt) => {
                    let wr = core.pop_send().unwrap();
                    drop(core);
                    let len: u64 = wr.iov().iter().map(|t| t.segment_length).sum();
                    let mut data = vec![0; len as usize];
                    let moved = peer
                        .remote_read(rt, &mut data)
                        .and_then(|()| ep.scatter_read(&wr, 0, &data));
                    match moved {
                        Ok(n) => ep.complete(wr, DtoStatus::Success, n),
                        Err(st) => {
                            ep.complete(wr, st, 0);
                            drop(moving);
                            return self.end(ep, ConnectionEventKind::Broken);
                        }
                    }
                }
                WrKind::Local => {
                    let wr = core.pop_send().unwrap();
                    drop(core);
                    ep.execute_local(wr);
                }
            }
        }
    }
}

impl Transport for PipeIa {
    fn address(&self) -> IpAddr {
        self.addr
    }

    fn ep_create(&self, _ep: &EpInfo<'_>) -> Result<Box<dyn EpOps>> {
        Ok(Box::new(PipeEp(self.port())))
    }

    fn srq_create(&self, _srq: SrqHandle, _pz: PzHandle) -> Result<Box<dyn SrqOps>> {
        Ok(Box::new(PipeSrq(self.f.clone())))
    }

    fn listen(&self, sp: &Arc<SpInner>) -> Result<Box<dyn ListenerOps>> {
        let mut l = self.f.listeners.lock().unwrap();
        let key = (self.addr, sp.conn_qual());
        if l.get(&key)
            .and_then(Weak::upgrade)
            .is_some_and(|s| !s.freed())
        {
            return Err(Error::ConnQualInUse(sp.conn_qual()));
        }
        l.insert(key, Arc::downgrade(sp));
        Ok(Box::new(PipeListener(self.port())))
    }

    fn close(&self) {
        if !self.closed.swap(true, std::sync::atomic::Ordering::SeqCst)
            && let Some(n) = self.f.addresses.lock().unwrap().get_mut(&self.addr)
        {
            *n = n.saturating_sub(1);
        }
    }
}

impl PipeIa {
    fn port(&self) -> Port {
        Port {
            f: self.f.clone(),
            addr: self.addr,
        }
    }
}

/// What each table of an IA's objects carries: the fabric and the IA's
/// address.
#[derive(Clone)]
struct Port {
    f: Arc<Fabric>,
    addr: IpAddr,
}

struct PipeListener(Port);

impl ListenerOps for PipeListener {
    fn unlisten(&self, sp: &SpInner) {
        let mut l = self.0.f.listeners.lock().unwrap();
        let key = (self.0.addr, sp.conn_qual());
        if l.get(&key).is_some_and(|w| std::ptr::eq(w.as_ptr(), sp)) {
            l.remove(&key);
        }
    }
}

struct PipeSrq(Arc<Fabric>);

impl SrqOps for PipeSrq {
    fn posted(&self, srq: &rdapl::srq::SrqInner) {
        // A peer's send may wait for a receive of this SRQ.
        for ep in srq.takers() {
            if let Some((p, _, _)) = self.0.peer(&ep) {
                self.0.kick(&p);
            }
        }
    }
}

/// A request's table: the fabric and the passive side's address.
struct PipeCr(Port);

struct PipeEp(Port);

impl std::ops::Deref for PipeEp {
    type Target = Port;
    fn deref(&self) -> &Port {
        &self.0
    }
}

impl std::ops::Deref for PipeCr {
    type Target = Port;
    fn deref(&self) -> &Port {
        &self.0
    }
}

impl EpOps for PipeEp {
    fn connect(
        &self,
        ep: &Arc<EpInner>,
        attempt: Attempt,
        remote: IpAddr,
        conn_qual: u64,
        private_data: Vec<u8>,
        timeout: Option<Duration>,
    ) -> Result<()> {
        let sp = self
            .f
            .listeners
            .lock()
            .unwrap()
            .get(&(remote, conn_qual))
            .and_then(Weak::upgrade);
        let Some(sp) = sp.filter(|s| !s.freed()) else {
            let known = self.f.addresses.lock().unwrap().get(&remote).copied();
            let kind = if known.unwrap_or(0) > 0 {
                ConnectionEventKind::NonPeerRejected
            } else {
                ConnectionEventKind::Unreachable
            };
            ep.connect_failed(attempt, kind, None);
            return Ok(());
        };
        // Recorded before the request is visible: an accept may come at once.
        let mut pending = self.f.pending.lock().unwrap();
        let passive = Port {
            f: self.f.clone(),
            addr: remote,
        };
        match sp.request(self.addr, private_data, Box::new(PipeCr(passive))) {
            Ok(cr) => {
                // Armed under the lock, so that whoever takes the request
                // finds its job to cancel. (A timeout too long for an
                // instant is as good as none; a timer that cannot start
                // leaves the request to its answer.)
                let job = rdapl::provider::soft::deadline(timeout).and_then(|at| {
                    let (cr, ep) = (cr.clone(), Arc::downgrade(ep));
                    let f = Arc::downgrade(&self.f);
                    let job = move || {
                        if cr.settle_as(CrState::Cancelled) {
                            if let Some(f) = f.upgrade() {
                                f.pending.lock().unwrap().remove(&cr.handle());
                            }
                            if let Some(ep) = ep.upgrade() {
                                ep.connect_failed(attempt, ConnectionEventKind::TimedOut, None);
                            }
                        }
                    };
                    self.f.timer.at(at, Box::new(job)).ok()
                });
                pending.insert(cr.handle(), (cr.clone(), Arc::downgrade(ep), attempt, job));
            }
            Err(_) => {
                drop(pending);
                ep.connect_failed(attempt, ConnectionEventKind::NonPeerRejected, None);
            }
        }
        Ok(())
    }

    fn disconnect(&self, ep: &Arc<EpInner>, _graceful: bool) {
        self.f.end(ep, ConnectionEventKind::Disconnected);
    }

    fn break_connection(&self, ep: &Arc<EpInner>) {
        self.f.end(ep, ConnectionEventKind::Broken);
    }

    fn connect_cancel(&self, ep: &Arc<EpInner>) {
        // Withdraw the request this endpoint made.
        let mut pending = self.f.pending.lock().unwrap();
        let mine: Vec<CrHandle> = pending
            .iter()
            .filter(|(_, (_, a, _, _))| std::ptr::eq(a.as_ptr(), Arc::as_ptr(ep)))
            .map(|(h, _)| *h)
            .collect();
        for h in mine {
            if let Some((cr, _, _, job)) = pending.remove(&h) {
                self.f.cancel(job);
                cr.settle_as(CrState::Cancelled);
            }
        }
    }

    fn kick(&self, ep: &Arc<EpInner>, recv: bool) {
        if recv {
            if let Some((p, _, _)) = self.f.peer(ep) {
                self.f.kick(&p);
            }
        } else {
            self.f.kick(ep);
        }
    }

    fn submit(&self, ep: &Arc<EpInner>, mut core: rdapl::provider::EpLock<'_>, wr: NewWr<'_>) {
        core.push_send(wr.queued());
        drop(core);
        self.f.kick(ep);
    }
}

impl CrOps for PipeCr {
    fn accept(&self, cr: &Arc<CrInner>, ep: &Arc<EpInner>, private_data: Vec<u8>) -> Result<()> {
        if !cr.settle_as(CrState::Accepted) {
            return Err(Error::InvalidHandle(Subtype::InvalidHandleCr));
        }
        let active = self.f.take_pending(cr.handle());
        let Some((active, attempt)) = active.and_then(|(a, n)| Some((a.upgrade()?, n))) else {
            return Err(Error::Abort("the connecting endpoint went away"));
        };
        let passive_conn = ep
            .established(None, (cr.remote(), cr.qualifier()), None)
            .ok_or(Error::Abort("the accepting endpoint went away"))?;
        let Some(active_conn) = active.established(
            Some(attempt),
            (self.addr, cr.qualifier()),
            Some(&private_data),
        ) else {
            ep.ended(ConnectionEventKind::Broken);
            return Ok(());
        };
        let mine: PeerOf = (Arc::downgrade(&active), active_conn, passive_conn);
        let theirs: PeerOf = (Arc::downgrade(ep), passive_conn, active_conn);
        if !(ep.set_link(Box::new(mine)) && active.set_link(Box::new(theirs))) {
            // One side left already (freed, disconnected): end both.
            self.f.end(ep, ConnectionEventKind::Broken);
            self.f.end(&active, ConnectionEventKind::Broken);
            return Ok(());
        }
        // Requests may have been queued before the connection was up.
        self.f.kick(ep);
        self.f.kick(&active);
        Ok(())
    }

    fn reject(&self, cr: &Arc<CrInner>, private_data: Vec<u8>) -> Result<()> {
        if !cr.settle_as(CrState::Rejected) {
            return Err(Error::InvalidHandle(Subtype::InvalidHandleCr));
        }
        let active = self.f.take_pending(cr.handle());
        if let Some((a, attempt)) = active.and_then(|(a, n)| Some((a.upgrade()?, n))) {
            a.connect_failed(
                attempt,
                ConnectionEventKind::PeerRejected,
                Some(&private_data),
            );
        }
        Ok(())
    }
}
