//! The in-process loopback provider: the embedded default.
//!
//! Endpoints of one process connect through an in-process namespace of
//! (IA address, connection qualifier) pairs. Data moves by one copy straight
//! from the source's registered region into the sink's (as a NIC's DMA
//! would), with every key, range, right and protection zone checked first
//! (every key that names memory: see zero-length RDMA below).
//! Work requests execute in order per endpoint, in the poster's thread (or
//! in the provider's timer thread for delayed work); completions flow
//! through the EVD engine, so upcalls still run in the dispatch context,
//! never on the poster's stack.
//!
//! Locking: a request executes under its endpoint's lock. The usual send
//! (a receive waiting, keys cached, no error) needs of the peer only its
//! receive queue, under that queue's own lock, which the peer's posts do
//! not take: a receive queue is a two-lock queue (`ep::RecvQueue`), so
//! with a steady stream of messages each of its locks stays on one core,
//! and only the receives, in batches, cross over. The usual RDMA request needs
//! nothing of the peer endpoint at all. Anything else (no receive, any
//! failure, a memory operation, fault injection) runs with both endpoints
//! locked in handle order, so a failure is published and both queues
//! stopped at once.
//!
//! Reliable-connected semantics:
//!
//! * a send with no receive posted waits up to the receiver-not-ready time
//!   ([`Loopback::set_rnr_timeout`], default 200 ms) for one, then fails with
//!   `ReceiverNotReady`;
//! * a receive too small: `LocalLength` on the receiver, `RemoteResponder`
//!   on the sender;
//! * a bad remote key, range, right or zone: `RemoteAccess`, no byte moved;
//! * a zero-length RDMA write or read (its local list totals 0 bytes)
//!   succeeds with 0 bytes and its remote key is not checked, nor are the
//!   keys of zero-length local segments: such a request names no memory.
//!   This is what InfiniBand and iWARP do (a zero-length RDMA is not
//!   checked against the remote key; iWARP uses a zero-length write as a
//!   "ready to receive" marker), and it reaches no byte, so no grant is
//!   bypassed. A request of one byte or more is checked in full;
//! * a region retired between resolving its key and the copy (see
//!   [`rdapl_core::mem`]): no byte moved, `LocalProtection` if it is the
//!   poster's own buffer, `RemoteAccess` (for a send: `RemoteResponder`, and
//!   `LocalProtection` on the receive) if it is the peer's;
//! * any DTO error breaks the connection: everything outstanding on both
//!   sides is flushed and both get `Broken`.
//! * a send lands only in a receive of its own connection: a disconnect
//!   ends the two sides one after the other, and in between the side not
//!   yet told may still send; each connection has a number, on both
//!   endpoints and both receive queues, and a send takes a receive only
//!   if the queue's number (cleared under the queue's lock when that side
//!   ends, and on reset) is its own: else it waits, and its own side's
//!   disconnect flushes it.
//!
//! Fault injection (used by the tests): `Ep::inject_failure`,
//! `Ep::inject_delay`, `Ep::inject_break`.

use parking_lot::{Mutex, MutexGuard};
use rdapl_core::ep::{CompletionFlags, EpState};
use rdapl_core::error::{Error, Result, Subtype};
use rdapl_core::evd::{EvdProducer, MAX_QLEN, UpcallPolicy};
use rdapl_core::event::{ConnectionEventKind, DtoStatus};
use rdapl_core::ia::{IaAttr, ProviderAttr};
use rdapl_core::mem::{LmrTriplet, MemPriv, RmrTriplet};
use rdapl_core::provider::soft::{
    self, KeyCache, RecvQueue, Request, Span, SpanRef, SpanRefs, Spans, Timer, WrOp,
};
use rdapl_core::provider::{
    CrInner, CrState, EpCore, EpInner, IaInner, NewWr, Provider, RecvWr, SpInner, Transport, Wr,
};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// The loopback provider: one in-process fabric. IAs opened from the same
/// instance reach each other; another instance ([`Loopback::new`]) is a
/// separate fabric with its own settings. The `"loopback"` of the `rdapl`
/// crate's registry of built-in providers (`rdapl::builtin()`, what
/// `Ia::open` opens from) is one instance.
pub struct Loopback {
    fabric: Arc<Fabric>,
}

/// What the IAs of one loopback instance share.
struct Fabric {
    listeners: Mutex<HashMap<(IpAddr, u64), Weak<SpInner>>>,
    addresses: Mutex<HashMap<IpAddr, usize>>,
    timer: Arc<Timer>,
    rnr_timeout_us: AtomicU64,
}

impl Drop for Fabric {
    fn drop(&mut self) {
        self.timer.stop();
    }
}

impl Loopback {
    /// A new loopback fabric (its own listeners, addresses, timer and
    /// settings).
    pub fn new() -> Arc<Loopback> {
        Arc::new(Loopback {
            fabric: Arc::new(Fabric {
                listeners: Mutex::new(HashMap::new()),
                addresses: Mutex::new(HashMap::new()),
                timer: Timer::start("rdapl-loopback-timer"),
                rnr_timeout_us: AtomicU64::new(200_000),
            }),
        })
    }

    /// Sets how long a send of this fabric waits for a receive before
    /// failing with `ReceiverNotReady`.
    pub fn set_rnr_timeout(&self, t: Duration) {
        self.fabric.rnr_timeout_us.store(
            t.as_micros().min(u64::MAX as u128) as u64,
            Ordering::Relaxed,
        );
    }
}

impl Fabric {
    fn rnr_timeout(&self) -> Duration {
        Duration::from_micros(self.rnr_timeout_us.load(Ordering::Relaxed))
    }
}

const MAX_PRIVATE_DATA: usize = 512;

impl Provider for Loopback {
    fn attr(&self) -> ProviderAttr {
        ProviderAttr {
            name: "loopback".into(),
            description: "in-process loopback: one copy between registered regions, no setup"
                .into(),
            version: (0, 1),
            dapl_version: (2, 0),
            upcall_policies: vec![
                UpcallPolicy::Disable,
                UpcallPolicy::SingleInstance,
                UpcallPolicy::Many,
                UpcallPolicy::NotifyOnly,
                UpcallPolicy::Teardown,
            ],
            evd_stream_merging: [[true; 6]; 6],
            completion_flags: 0x0F,
            thread_safe: true,
            fmr_supported: true,
            srq_supported: true,
            max_private_data_size: MAX_PRIVATE_DATA,
        }
    }

    fn ia_attr(&self, address: IpAddr) -> IaAttr {
        IaAttr {
            adapter_name: "loopback0".into(),
            vendor_name: "rdapl".into(),
            address,
            max_eps: 1 << 16,
            max_dto_per_ep: 1 << 14,
            max_rdma_read_per_ep: 64,
            max_evds: 1 << 16,
            max_evd_qlen: MAX_QLEN,
            max_iov_segments_per_dto: 64,
            max_lmrs: 1 << 24,
            max_lmr_block_size: 1 << 40,
            max_pzs: 1 << 16,
            max_message_size: 1 << 30,
            max_rdma_size: 1 << 30,
            max_rmrs: 1 << 24,
            max_private_data_size: MAX_PRIVATE_DATA,
        }
    }

    fn open(&self, address: Option<IpAddr>, params: &str) -> Result<Arc<dyn Transport>> {
        let mut addr = address;
        for kv in params.split([' ', ',']).filter(|s| !s.is_empty()) {
            match kv.split_once('=') {
                Some(("addr", v)) => {
                    let a = v
                        .parse()
                        .map_err(|_| Error::param(1, "loopback: addr= is not an IP address"))?;
                    if addr.is_some_and(|x| x != a) {
                        return Err(Error::param(
                            1,
                            "loopback: addr= names another address than the options do",
                        ));
                    }
                    addr = Some(a);
                }
                _ => {
                    return Err(Error::param(
                        1,
                        "loopback: unknown parameter (known: addr=IP)",
                    ));
                }
            }
        }
        let mut used = self.fabric.addresses.lock();
        // By default the first 127.0.0.x no IA of this fabric uses.
        let addr = addr
            .or_else(|| {
                (1..=254u8)
                    .map(|x| IpAddr::V4(Ipv4Addr::new(127, 0, 0, x)))
                    .find(|a| used.get(a).is_none_or(|&n| n == 0))
            })
            .ok_or(Error::InsufficientResources {
                resource: rdapl_core::error::Subtype::ResourceDevice,
                what: "loopback: every default address 127.0.0.1-254 is in use",
            })?;
        *used.entry(addr).or_insert(0) += 1;
        drop(used);
        Ok(Arc::new(LoopbackIa {
            lb: self.fabric.clone(),
            addr,
            closed: std::sync::atomic::AtomicBool::new(false),
        }))
    }
}

struct LoopbackIa {
    lb: Arc<Fabric>,
    addr: IpAddr,
    closed: std::sync::atomic::AtomicBool,
}

impl Transport for LoopbackIa {
    fn address(&self) -> IpAddr {
        self.addr
    }

    fn listen(&self, sp: &Arc<SpInner>) -> Result<()> {
        let mut l = self.lb.listeners.lock();
        let key = (self.addr, sp.conn_qual());
        if l.get(&key)
            .and_then(Weak::upgrade)
            .is_some_and(|s| !s.freed())
        {
            return Err(Error::ConnQualInUse(sp.conn_qual()));
        }
        l.insert(key, Arc::downgrade(sp));
        Ok(())
    }

    fn unlisten(&self, sp: &SpInner) {
        let mut l = self.lb.listeners.lock();
        let key = (self.addr, sp.conn_qual());
        if l.get(&key).is_some_and(|w| std::ptr::eq(w.as_ptr(), sp)) {
            l.remove(&key);
        }
    }

    fn connect(
        &self,
        ep: &Arc<EpInner>,
        remote: IpAddr,
        conn_qual: u64,
        private_data: Vec<u8>,
        timeout: Option<Duration>,
    ) -> Result<()> {
        let sp = self
            .lb
            .listeners
            .lock()
            .get(&(remote, conn_qual))
            .and_then(Weak::upgrade)
            .filter(|s| !s.freed());
        let Some(sp) = sp else {
            let reachable = self
                .lb
                .addresses
                .lock()
                .get(&remote)
                .is_some_and(|n| *n > 0);
            // Nobody listens on a reachable address: the connection
            // manager refuses, not the peer consumer (as a TCP reset, and
            // uDAPL's NON_PEER_REJECTED for a request no listener took).
            fail_active(
                ep,
                if reachable {
                    ConnectionEventKind::NonPeerRejected
                } else {
                    ConnectionEventKind::Unreachable
                },
                None,
            );
            return Ok(());
        };
        let cr = CrInner::new(&sp, private_data, self.addr, Arc::downgrade(ep));
        ep.core.lock().pending_cr = Some(cr.clone());
        if sp.deliver(&cr).is_err() {
            cr.settle_as(CrState::Cancelled);
            fail_active(ep, ConnectionEventKind::NonPeerRejected, None);
            return Ok(());
        }
        // (A timeout too long for an instant is as good as none.)
        if let Some(at) = soft::deadline(timeout) {
            let (cr, ep) = (cr.clone(), Arc::downgrade(ep));
            self.lb.timer.at(
                at,
                Box::new(move || {
                    if cr.settle_as(CrState::Cancelled) {
                        if let Some(ep) = ep.upgrade() {
                            fail_active(&ep, ConnectionEventKind::TimedOut, None);
                        }
                    }
                }),
            );
        }
        Ok(())
    }

    fn accept(&self, cr: &Arc<CrInner>, ep: &Arc<EpInner>, private_data: Vec<u8>) -> Result<()> {
        let active = cr.active.upgrade();
        if !cr.settle_as(CrState::Accepted) {
            return Err(Error::InvalidHandle(Subtype::InvalidHandleCr));
        }
        let Some(active) = active else {
            return Err(Error::Abort("the connecting endpoint went away"));
        };
        {
            let (mut cp, mut ca) = EpInner::lock_pair(ep, &active);
            if ca.state != EpState::ActiveConnectionPending {
                return Err(Error::Abort("the connecting endpoint gave up"));
            }
            // One number for the connection, on both sides and both
            // receive queues (locked after both endpoints).
            let conn = soft::next_conn();
            ep.rq.lock().conn = conn;
            active.rq.lock().conn = conn;
            cp.conn = conn;
            ca.conn = conn;
            cp.state = EpState::Connected;
            cp.peer = Some(Arc::downgrade(&active));
            cp.peer_mem = Some((active.ia.clone(), active.pz_handle()));
            cp.peer_keys.clear();
            cp.remote = Some((cr.remote(), cr.qualifier()));
            ca.state = EpState::Connected;
            ca.peer = Some(Arc::downgrade(ep));
            ca.peer_mem = Some((ep.ia.clone(), ep.pz_handle()));
            ca.peer_keys.clear();
            ca.pending_cr = None;
            ca.peer_private = Some(private_data.clone().into_boxed_slice());
        }
        ep.connection_event(ConnectionEventKind::Established, None);
        active.connection_event(
            ConnectionEventKind::Established,
            Some(private_data.into_boxed_slice()),
        );
        self.progress_both(ep);
        Ok(())
    }

    fn reject(&self, cr: &Arc<CrInner>, private_data: Vec<u8>) -> Result<()> {
        if !cr.settle_as(CrState::Rejected) {
            return Err(Error::InvalidHandle(Subtype::InvalidHandleCr));
        }
        if let Some(active) = cr.active.upgrade() {
            fail_active(
                &active,
                ConnectionEventKind::PeerRejected,
                Some(private_data.into_boxed_slice()),
            );
        }
        Ok(())
    }

    fn disconnect(&self, ep: &Arc<EpInner>, _graceful: bool) {
        // Requests execute as soon as they can, so a graceful disconnect
        // has nothing left to wait for but requests blocked on the peer:
        // those are flushed, as an abrupt one does.
        let peer = ep.core.lock().peer.as_ref().and_then(Weak::upgrade);
        ep.break_connection(peer.as_ref(), Some(ConnectionEventKind::Disconnected));
    }

    fn kick(&self, ep: &Arc<EpInner>, recv: bool) {
        if recv {
            // Only the peer's head send can have been waiting for this, and
            // only if it found no receive (it says so under `ep`'s posters'
            // lock, which the poster took after it: no kick is lost; see
            // `RecvQueue::refill`).
            if !ep.recv_wanted.load(Ordering::Relaxed) {
                return;
            }
            let peer = ep.core.lock().peer.as_ref().and_then(Weak::upgrade);
            if let Some(p) = peer {
                progress(&self.lb, &p);
            }
        } else {
            progress(&self.lb, ep);
        }
    }

    fn submit(&self, ep: &Arc<EpInner>, mut core: MutexGuard<'_, EpCore>, wr: NewWr<'_>) {
        // Nothing ahead of it: a send or RDMA request that can run now
        // completes without going through the queue (and is never copied
        // into a queued `Wr`).
        let c = &mut *core;
        let wr = 'now: {
            if !(c.sends.is_empty()
                && c.state == EpState::Connected
                && wr.not_before.is_none()
                && c.fail_next.is_none())
            {
                break 'now wr;
            }
            match wr.op {
                WrOp::Send => {
                    let Some(b) = c.peer.as_ref().and_then(Weak::upgrade) else {
                        break 'now wr;
                    };
                    // The usual message needs only the peer's receive
                    // queue; anything else (no receive, a failure) needs
                    // the peer locked too: at once if the handle order
                    // allows it (or the lock is free), else it queues.
                    let wr = match send_fast(ep, &b, c, wr) {
                        Ok(()) => return,
                        Err(wr) => wr,
                    };
                    let cb = if ep.id < b.id {
                        Some(b.core.lock())
                    } else {
                        b.core.try_lock()
                    };
                    let Some(mut cb) = cb else {
                        break 'now wr;
                    };
                    match send(&self.lb, ep, &b, c, wr) {
                        Ok(Step::Broken) => {
                            stop_both((ep, c), (&b, &mut cb));
                            drop(cb);
                            drop(core);
                            ep.break_connection(Some(&b), None);
                        }
                        Ok(_) => {}
                        // No receive yet: it waits at the head.
                        Err(wr) => c.sends.push_back(wr.queued()),
                    }
                    return;
                }
                WrOp::RdmaWrite(r) | WrOp::RdmaRead(r) => {
                    let write = matches!(wr.op, WrOp::RdmaWrite(_));
                    if let Some((ia, pz)) = &c.peer_mem {
                        if let Some(len) = rdma_try(
                            ep,
                            wr.iov,
                            (&mut c.keys, &mut c.peer_keys),
                            ia,
                            *pz,
                            r,
                            write,
                        ) {
                            wr.complete(ep, DtoStatus::Success, len);
                            return;
                        }
                    }
                    wr
                }
                _ => wr,
            }
        };
        core.sends.push_back(wr.queued());
        progress_locked(&self.lb, ep, core);
    }

    fn srq_posted(&self, srq: &rdapl_core::srq::SrqInner) {
        for ep in srq.takers() {
            let peer = ep.core.lock().peer.as_ref().and_then(Weak::upgrade);
            if let Some(p) = peer {
                progress(&self.lb, &p);
            }
        }
    }

    fn close(&self) {
        if !self.closed.swap(true, Ordering::SeqCst) {
            let mut a = self.lb.addresses.lock();
            if let Some(n) = a.get_mut(&self.addr) {
                *n = n.saturating_sub(1);
            }
        }
    }
}

/// The active side's connection attempt failed with `kind`.
fn fail_active(ep: &Arc<EpInner>, kind: ConnectionEventKind, private: Option<Box<[u8]>>) {
    {
        let mut c = ep.core.lock();
        if c.state != EpState::ActiveConnectionPending {
            return;
        }
        ep.set_state(&mut c, EpState::Disconnected);
        c.pending_cr = None;
    }
    ep.flush_all();
    ep.connection_event(kind, private);
}

impl LoopbackIa {
    /// Progresses `ep`'s requests, then its peer's (which may wait for a
    /// receive `ep` just posted).
    fn progress_both(&self, ep: &Arc<EpInner>) {
        progress(&self.lb, ep);
        let peer = ep.core.lock().peer.as_ref().and_then(Weak::upgrade);
        if let Some(p) = peer {
            progress(&self.lb, &p);
        }
    }
}

/// What one step of [`progress`] did.
enum Step {
    /// The head request completed: go on with the next.
    Next,
    /// The head request cannot execute yet: stop.
    Blocked,
    /// A DTO error: stop both queues and break the connection.
    Broken,
}

/// Executes `a`'s send queue, in order, until it is empty or blocked.
fn progress(lb: &Arc<Fabric>, a: &Arc<EpInner>) {
    progress_locked(lb, a, a.core.lock());
}

/// [`progress`] with `a` locked (`ca`).
///
/// RDMA requests need nothing of the peer endpoint but its registration
/// table and protection zone, so while they succeed they run with `a` alone
/// locked. Anything else (a send, a memory operation, an injected failure
/// or delay) and any failing RDMA request go to [`progress_both`], with both
/// endpoints locked, which (re)executes the head request: a failed RDMA
/// request moved no byte, published nothing and changed nothing, and only
/// the path with both endpoints locked publishes a failure and stops both
/// queues at once.
fn progress_locked<'g>(lb: &Arc<Fabric>, a: &'g Arc<EpInner>, mut ca: MutexGuard<'g, EpCore>) {
    loop {
        let c = &mut *ca;
        if c.state != EpState::Connected {
            return;
        }
        let Some(head) = c.sends.front() else {
            return;
        };
        if head.not_before.is_some() || c.fail_next.is_some() {
            break;
        }
        let (r, write) = match head.op {
            WrOp::RdmaWrite(r) => (r, true),
            WrOp::RdmaRead(r) => (r, false),
            _ => break,
        };
        let Some((ia, pz)) = &c.peer_mem else {
            break;
        };
        let Some(len) = rdma_try(
            a,
            &head.iov,
            (&mut c.keys, &mut c.peer_keys),
            ia,
            *pz,
            r,
            write,
        ) else {
            break;
        };
        let wr = c.sends.pop_front().expect("head");
        a.complete(wr, DtoStatus::Success, len);
    }
    progress_both(lb, a, ca);
}

/// An RDMA write (`write`) or read of `iov` against `r` on the peer (its
/// IA `peer` and zone `peer_pz`): the bytes moved, or `None` (and nothing
/// moved) if any check or the copy failed.
fn rdma_try(
    a: &EpInner,
    iov: &[LmrTriplet],
    (keys, peer_keys): (&mut KeyCache, &mut KeyCache),
    peer: &IaInner,
    peer_pz: rdapl_core::event::PzHandle,
    r: RmrTriplet,
    write: bool,
) -> Option<u64> {
    let (local_right, remote_right) = if write {
        (MemPriv::LOCAL_READ, MemPriv::REMOTE_WRITE)
    } else {
        (MemPriv::LOCAL_WRITE, MemPriv::REMOTE_READ)
    };
    // The usual request: one local buffer, both keys cached.
    if let [t] = iov {
        if t.segment_length > 0 {
            let local = a.ia.mem.resolve_one_cached(
                keys,
                t.lmr_context,
                t.virtual_address,
                t.segment_length,
                local_right,
                a.pz_handle(),
                true,
            )?;
            let remote = peer.mem.resolve_one_cached(
                peer_keys,
                r.rmr_context,
                r.target_address,
                t.segment_length,
                remote_right,
                peer_pz,
                false,
            )?;
            let copied = if write {
                soft::copy_one(local, remote)
            } else {
                soft::copy_one(remote, local)
            };
            return copied.ok().map(|_| t.segment_length);
        }
    }
    let mut hold = Spans::new();
    let local =
        a.ia.mem
            .resolve_local_cached(keys, &mut hold, iov, local_right, a.pz_handle())
            .ok()?;
    let len = soft::total(&local) as u64;
    // Zero bytes: the remote key is not checked (see the module docs).
    if len == 0 {
        return Some(0);
    }
    let mut hold_remote = None;
    let remote = peer
        .mem
        .resolve_cached(
            (peer_keys, &mut hold_remote),
            r.rmr_context,
            r.target_address,
            len,
            remote_right,
            peer_pz,
        )
        .ok()?;
    let remote = std::slice::from_ref(&remote);
    let copied = if write {
        soft::copy_refs(&local, remote)
    } else {
        soft::copy_refs(remote, &local)
    };
    copied.ok().map(|_| len)
}

/// [`progress`] with both endpoints locked, starting with `a` locked.
fn progress_both<'g>(lb: &Arc<Fabric>, a: &'g Arc<EpInner>, mut ca: MutexGuard<'g, EpCore>) {
    if ca.state != EpState::Connected || ca.sends.is_empty() {
        return;
    }
    let Some(b) = ca.peer.as_ref().and_then(Weak::upgrade) else {
        return;
    };
    // Both endpoints locked, in handle order.
    let mut cb;
    if a.id < b.id {
        cb = b.core.lock();
    } else {
        drop(ca);
        cb = b.core.lock();
        ca = a.core.lock();
        // Still connected to the same peer?
        if !ca
            .peer
            .as_ref()
            .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&b)))
        {
            return;
        }
    }
    // Completions are published while both endpoints stay locked: another
    // thread progressing this endpoint (a second poster, the peer's
    // post_recv, the timer) can neither publish the completion of a later
    // request first nor execute one behind a failure. Publishing never runs
    // consumer code on this stack.
    let broken = loop {
        if ca.state != EpState::Connected {
            break false;
        }
        let Some(head) = ca.sends.front() else {
            break false;
        };
        let is_local = matches!(head.op, WrOp::Local(_));
        if let Some(nb) = head.not_before {
            if nb > Instant::now() {
                let (lb2, a2) = (lb.clone(), Arc::downgrade(a));
                lb.timer.at(
                    nb,
                    Box::new(move || {
                        if let Some(a) = a2.upgrade() {
                            progress(&lb2, &a);
                        }
                    }),
                );
                break false;
            }
        }
        let step = if let Some(st) = ca.fail_next.take() {
            let wr = ca.sends.pop_front().expect("head");
            a.complete(wr, st, 0);
            Step::Broken
        } else if is_local {
            // A failed bind, map or invalidate is a DTO error: it breaks
            // the connection like any other.
            let wr = ca.sends.pop_front().expect("head");
            if a.execute_local(wr).is_success() {
                Step::Next
            } else {
                Step::Broken
            }
        } else {
            execute(lb, a, &b, &mut ca)
        };
        match step {
            Step::Next => {}
            Step::Blocked => break false,
            Step::Broken => {
                stop_both((a, &mut ca), (&b, &mut cb));
                break true;
            }
        }
    };
    drop(ca);
    drop(cb);
    if broken {
        a.break_connection(Some(&b), None);
    }
}

/// After a DTO error: stops both queues at once (with both endpoints
/// locked); `break_connection` then flushes.
fn stop_both((a, ca): (&EpInner, &mut EpCore), (b, cb): (&EpInner, &mut EpCore)) {
    for (ep, c) in [(a, ca), (b, cb)] {
        if c.state == EpState::Connected {
            ep.set_state(c, EpState::DisconnectPending);
        }
    }
}

/// Executes the head request of `a` (a send, RDMA write or RDMA read)
/// against peer `b`, both locked, and publishes its completions.
fn execute(lb: &Arc<Fabric>, a: &Arc<EpInner>, b: &Arc<EpInner>, ca: &mut EpCore) -> Step {
    let head = ca.sends.front().expect("head");
    match head.op {
        WrOp::Send | WrOp::SendInvalidate(_) => {
            let wr = ca.sends.pop_front().expect("head");
            match send(lb, a, b, ca, wr) {
                Ok(step) => step,
                Err(wr) => {
                    ca.sends.push_front(wr);
                    Step::Blocked
                }
            }
        }
        WrOp::RdmaWrite(r) => {
            let wr = ca.sends.pop_front().expect("head");
            rdma(a, b, wr, r, true)
        }
        WrOp::RdmaRead(r) => {
            let wr = ca.sends.pop_front().expect("head");
            rdma(a, b, wr, r, false)
        }
        _ => {
            let wr = ca.sends.pop_front().expect("head");
            a.complete(wr, DtoStatus::LocalEp, 0);
            Step::Broken
        }
    }
}

/// Executes the send `wr` of `a` (popped from the head of its queue, or
/// posted with nothing queued ahead) against peer `b`, both locked, and
/// publishes its completions; `Err(wr)` if `b` has no receive for it yet
/// (the receiver-not-ready clock runs; the caller puts it back at the head),
/// or if `b`'s side of the connection ended (its receives are for the next
/// one; `a`'s own disconnect is on its way and flushes it).
// The request comes back by value on purpose: boxing it would allocate.
#[allow(clippy::result_large_err)]
fn send<R: Request>(
    lb: &Arc<Fabric>,
    a: &Arc<EpInner>,
    b: &Arc<EpInner>,
    ca: &mut EpCore,
    wr: R,
) -> std::result::Result<Step, R> {
    // Under `b`'s receive queue lock throughout (so the receive's
    // completion is published before a flush of the queue can publish a
    // later one's).
    let mut rq = b.rq.lock();
    let r = send_locked(lb, a, b, ca, wr, &mut rq);
    b.publish_taken(&rq);
    r
}

/// [`send`], `b`'s receive queue locked (`rq`).
#[allow(clippy::result_large_err)]
fn send_locked<R: Request>(
    lb: &Arc<Fabric>,
    a: &Arc<EpInner>,
    b: &Arc<EpInner>,
    ca: &mut EpCore,
    wr: R,
    rq: &mut RecvQueue,
) -> std::result::Result<Step, R> {
    // `b`'s side of the connection ended (its receives, if any, are for
    // the next one): this send waits, and `a`'s disconnect, on its way,
    // flushes it.
    if rq.conn != ca.conn {
        return Err(wr);
    }
    // The usual message, into the head of `b`'s own receive queue: copied
    // straight from the queued receive, which is popped only once the copy
    // is done (anything else, and any failure: the general path below
    // decides, from the start).
    if b.srq.is_none() {
        // No receive at all: a receive posted from now on kicks us.
        rq.refill(b, true);
        // (A Send with Invalidate takes the general path.)
        if let Some(rwr) = rq.recvs.front().filter(|_| wr.invalidates().is_none()) {
            if let Some((n, _)) =
                copy_one_cached(a, b, (&mut ca.keys, &mut rq.keys), wr.iov(), &rwr.iov)
            {
                let mut rwr = rq.pop().expect("head");
                received(b, ca);
                if wr.flags().contains(CompletionFlags::SOLICITED_WAIT) {
                    rwr.flags = rwr.flags | CompletionFlags::SOLICITED_ARRIVAL;
                }
                // The receiver waits for its completion: it goes first.
                complete_taken(b, rq.taken, rwr, DtoStatus::Success, n);
                wr.complete(a, DtoStatus::Success, n);
                return Ok(Step::Next);
            }
        }
    }
    let Some(mut rwr) = b.take_recv_locked(rq) else {
        // A receive posted from now on kicks us: for `b`'s own queue,
        // `refill` above said so under the posters' lock; a shared receive
        // queue's posts run its endpoints' peers' progress anyway.
        if ca.rnr_deadline.is_none() {
            let deadline = soft::deadline(Some(lb.rnr_timeout())).unwrap_or_else(Instant::now);
            ca.rnr_deadline = Some(deadline);
            let (lb2, a2) = (lb.clone(), Arc::downgrade(a));
            lb.timer
                .at(deadline, Box::new(move || rnr_expired(&lb2, a2, deadline)));
        }
        return Err(wr);
    };
    // A Send with Invalidate: the key goes when a receive is at hand, and
    // before any byte moves; a key the peer cannot invalidate moves none.
    let inval = wr.invalidates();
    if let Some(k) = inval {
        if b.invalidate_remote(k).is_err() {
            untake_recv(b, rq, rwr);
            wr.complete(a, DtoStatus::RemoteAccess, 0);
            return Ok(Step::Broken);
        }
    }
    received(b, ca);
    if b.srq.is_some() && inval.is_none() {
        if let Some((n, _)) =
            copy_one_cached(a, b, (&mut ca.keys, &mut rq.keys), wr.iov(), &rwr.iov)
        {
            if wr.flags().contains(CompletionFlags::SOLICITED_WAIT) {
                rwr.flags = rwr.flags | CompletionFlags::SOLICITED_ARRIVAL;
            }
            complete_taken(b, rq.taken, rwr, DtoStatus::Success, n);
            wr.complete(a, DtoStatus::Success, n);
            return Ok(Step::Next);
        }
    }
    let (mut hold_src, mut hold_dst) = (Spans::new(), Spans::new());
    let src = match a.ia.mem.resolve_local_cached(
        &mut ca.keys,
        &mut hold_src,
        wr.iov(),
        MemPriv::LOCAL_READ,
        a.pz_handle(),
    ) {
        Ok(s) => s,
        Err(st) => {
            untake_recv(b, rq, rwr);
            wr.complete(a, st, 0);
            return Ok(Step::Broken);
        }
    };
    let dst = match b.ia.mem.resolve_local_cached(
        &mut rq.keys,
        &mut hold_dst,
        &rwr.iov,
        MemPriv::LOCAL_WRITE,
        b.pz_handle(),
    ) {
        Ok(d) => d,
        Err(st) => {
            wr.complete(a, DtoStatus::RemoteResponder, 0);
            complete_taken(b, rq.taken, rwr, st, 0);
            return Ok(Step::Broken);
        }
    };
    if wr.flags().contains(CompletionFlags::SOLICITED_WAIT) {
        rwr.flags = rwr.flags | CompletionFlags::SOLICITED_ARRIVAL;
    }
    // (An owned buffer's list is empty: its bytes stand in for it.)
    let len = wr.src_buf().map_or_else(|| soft::total(&src), <[u8]>::len);
    let room = rwr
        .buf
        .as_ref()
        .map_or_else(|| soft::total(&dst), |d| d.len());
    if len > room {
        wr.complete(a, DtoStatus::RemoteResponder, 0);
        complete_taken(b, rq.taken, rwr, DtoStatus::LocalLength, 0);
        return Ok(Step::Broken);
    }
    let copied = match (wr.src_buf(), rwr.buf.as_deref_mut()) {
        (None, None) => soft::copy_refs(&src, &dst),
        (Some(s), None) => soft::copy_from_buf(s, &dst),
        (None, Some(d)) => soft::copy_into_buf(&src, d),
        (Some(s), Some(d)) => {
            d[..s.len()].copy_from_slice(s);
            Ok(s.len())
        }
    };
    drop(dst);
    match copied {
        Ok(_) => {
            match inval {
                Some(k) => {
                    b.publish_taken_count(rq.taken);
                    b.complete_recv_invalidated(rwr, len as u64, k);
                }
                None => complete_taken(b, rq.taken, rwr, DtoStatus::Success, len as u64),
            }
            wr.complete(a, DtoStatus::Success, len as u64);
            Ok(Step::Next)
        }
        // A region was retired after its key resolved: no byte
        // moved. As for a refused key: the sender's own buffer...
        Err(r) if r.src => {
            untake_recv(b, rq, rwr);
            wr.complete(a, DtoStatus::LocalProtection, 0);
            Ok(Step::Broken)
        }
        // ...or the receiver's.
        Err(_) => {
            wr.complete(a, DtoStatus::RemoteResponder, 0);
            complete_taken(b, rq.taken, rwr, DtoStatus::LocalProtection, 0);
            Ok(Step::Broken)
        }
    }
}

/// [`send`] of the usual message (the request `wr` of `a`, locked: `ca`,
/// nothing queued ahead), with `b`'s receive queue alone locked: into the
/// head receive of `b`'s own queue, one buffer each side, keys cached and
/// granted, no region retired; completed on both sides. `Err(wr)` (and
/// nothing moved, nothing published) otherwise: [`send`] with both
/// endpoints locked then decides, from the start.
///
/// Only `a`'s sends take `b`'s receives, and they are serialised by `a`'s
/// lock; the receive is popped and its completion published under the
/// queue's lock (a flush drains the queue under it), the send's under
/// `a`'s: completions stay in order on both queues.
#[allow(clippy::result_large_err)]
fn send_fast<R: Request>(
    a: &EpInner,
    b: &EpInner,
    ca: &mut EpCore,
    wr: R,
) -> std::result::Result<(), R> {
    if b.srq.is_some() {
        return Err(wr);
    }
    // The lines of `b` this send writes are usually in `b`'s thread's
    // cache: ask for them together (hints only).
    if let Some(e) = &b.recv_evd {
        e.prefetch_complete();
    }
    for h in ca.peer_hints {
        soft::prefetch_write(h as *const u8);
    }
    soft::prefetch_read(ca.peer_read_hint as *const u8);
    let mut guard = b.rq.lock();
    let rq = &mut *guard;
    // Of another connection (`b`'s ended): as in `send`.
    if rq.conn != ca.conn {
        return Err(wr);
    }
    // (None: `send` decides, and marks that a receive is wanted.)
    rq.refill(b, false);
    let Some(rwr) = rq.recvs.front_mut() else {
        return Err(wr);
    };
    let copied = if wr.src_buf().is_none() && rwr.buf.is_none() {
        if let [d] = &rwr.iov[..] {
            // The receive buffer, by its address (a hint cannot fault).
            soft::prefetch_write(d.virtual_address as usize as *const u8);
        }
        copy_one_cached(a, b, (&mut ca.keys, &mut rq.keys), wr.iov(), &rwr.iov)
    } else {
        // An owned buffer on one side at least: no region lock to hint.
        copy_one_owned(a, b, (&mut ca.keys, &mut rq.keys), &wr, rwr).map(|n| (n, 0))
    };
    let Some((n, dst_lock)) = copied else {
        return Err(wr);
    };
    let mut rwr = rq.pop().expect("head");
    // Where the next send to `b` will probably go: hints for its prefetch
    // (its head receive, or the posters' lock it will take to move the
    // posted receives over).
    ca.peer_hints = [
        rq.recvs.front().map_or_else(
            || std::ptr::from_ref(&*b.posted) as usize,
            |r| r as *const RecvWr as usize,
        ),
        dst_lock,
    ];
    received(b, ca);
    if wr.flags().contains(CompletionFlags::SOLICITED_WAIT) {
        rwr.flags = rwr.flags | CompletionFlags::SOLICITED_ARRIVAL;
    }
    // The receiver waits for its completion: it goes first.
    complete_taken(b, rq.taken, rwr, DtoStatus::Success, n);
    // The next head receive's owned buffer: its lines as hints too (read
    // only now, the receiver already on its way).
    ca.peer_read_hint = 0;
    if let Some(next) = rq.recvs.front().and_then(|r| r.buf.as_ref()) {
        let (header, bytes) = next.hint_addrs();
        ca.peer_hints[1] = bytes;
        ca.peer_read_hint = header;
    }
    b.publish_taken(rq);
    drop(guard);
    wr.complete(a, DtoStatus::Success, n);
    Ok(())
}

/// Completes a receive taken for good from `b`'s queue, whose count of
/// receives taken (`RecvQueue::taken`, its lock held) is `taken`: the
/// count is published first, so a consumer that sees the completion and
/// posts the receive again is never refused for a queue full of a receive
/// that already left it.
#[inline]
fn complete_taken(b: &EpInner, taken: u64, rwr: RecvWr, status: DtoStatus, n: u64) {
    b.publish_taken_count(taken);
    b.complete_recv(rwr, status, n);
}

/// A send of `a` found a receive of `b`: `b` no longer waits for one, and
/// the receiver-not-ready clock of `a` stops.
#[inline]
fn received(b: &EpInner, ca: &mut EpCore) {
    if b.recv_wanted.load(Ordering::Relaxed) {
        b.recv_wanted.store(false, Ordering::Relaxed);
    }
    if ca.rnr_deadline.is_some() {
        ca.rnr_deadline = None;
    }
}

/// The usual message: one buffer each side (`src` of `a`, `dst` of `b`),
/// both keys cached (or read from the tables now) and granted, no region
/// retired: the bytes copied and the address of `dst`'s region lock (a
/// prefetch hint); `None` (and no byte moved) otherwise.
#[inline(always)]
fn copy_one_cached(
    a: &EpInner,
    b: &EpInner,
    (ka, kb): (&mut KeyCache, &mut KeyCache),
    src: &[LmrTriplet],
    dst: &[LmrTriplet],
) -> Option<(u64, usize)> {
    let ([s], [d]) = (src, dst) else {
        return None;
    };
    if s.segment_length == 0 || d.segment_length < s.segment_length {
        return None;
    }
    let src = resolve_triplet(a, ka, s, MemPriv::LOCAL_READ)?;
    let dst = resolve_triplet(b, kb, d, MemPriv::LOCAL_WRITE)?;
    let dst_lock = dst.region.lock_addr();
    soft::copy_one(src, dst).ok().map(|n| (n as u64, dst_lock))
}

/// The span of one triplet `t` of `ep` (its IA's keys, its zone), for
/// `right`, through `cache`.
#[inline(always)]
fn resolve_triplet<'c>(
    ep: &EpInner,
    cache: &'c mut KeyCache,
    t: &LmrTriplet,
    right: MemPriv,
) -> Option<SpanRef<'c>> {
    ep.ia.mem.resolve_one_cached(
        cache,
        t.lmr_context,
        t.virtual_address,
        t.segment_length,
        right,
        ep.pz_handle(),
        true,
    )
}

/// [`copy_one_cached`] with an owned buffer on one side at least (the
/// other: one buffer, key cached or read now, granted, region live): the
/// bytes copied; `None` (and no byte moved) otherwise, or if the receive
/// is too short.
fn copy_one_owned<R: Request>(
    a: &EpInner,
    b: &EpInner,
    (ka, kb): (&mut KeyCache, &mut KeyCache),
    wr: &R,
    rwr: &mut RecvWr,
) -> Option<u64> {
    let n = match (wr.src_buf(), rwr.buf.as_deref_mut()) {
        (Some(s), Some(d)) => {
            d.get_mut(..s.len())?.copy_from_slice(s);
            s.len()
        }
        (Some(s), None) => {
            let [d] = &rwr.iov[..] else { return None };
            if (d.segment_length as usize) < s.len() {
                return None;
            }
            let dst = resolve_triplet(b, kb, d, MemPriv::LOCAL_WRITE)?;
            soft::copy_from_buf(s, &[dst]).ok()?
        }
        (None, Some(d)) => {
            let [s] = wr.iov() else { return None };
            if s.segment_length as usize > d.len() {
                return None;
            }
            let src = resolve_triplet(a, ka, s, MemPriv::LOCAL_READ)?;
            soft::copy_into_buf(&[src], d).ok()?
        }
        (None, None) => return None,
    };
    Some(n as u64)
}

/// An RDMA write (`write`) or read of `a`'s request `wr` against `r` on the
/// peer `b`: the local list is checked first (`LocalProtection`), then the
/// remote key, range, right and zone (`RemoteAccess`); only then one copy.
fn rdma(a: &EpInner, b: &EpInner, wr: Wr, r: RmrTriplet, write: bool) -> Step {
    let (local_right, remote_right) = if write {
        (MemPriv::LOCAL_READ, MemPriv::REMOTE_WRITE)
    } else {
        (MemPriv::LOCAL_WRITE, MemPriv::REMOTE_READ)
    };
    let local = match a.ia.mem.resolve_local(&wr.iov, local_right, a.pz_handle()) {
        Ok(l) => l,
        Err(st) => {
            a.complete(wr, st, 0);
            return Step::Broken;
        }
    };
    let local: SpanRefs<'_> = local.iter().map(Span::as_ref).collect();
    let len = soft::total(&local) as u64;
    // Zero bytes: the remote key is not checked (see the module docs).
    if len == 0 {
        a.complete(wr, DtoStatus::Success, 0);
        return Step::Next;
    }
    let remote = match b.ia.mem.resolve(
        r.rmr_context,
        r.target_address,
        len,
        remote_right,
        b.pz_handle(),
    ) {
        Ok(span) => span,
        Err(_) => {
            a.complete(wr, DtoStatus::RemoteAccess, 0);
            return Step::Broken;
        }
    };
    let remote = [remote.as_ref()];
    let copied = if write {
        soft::copy_refs(&local, &remote).map_err(|r| r.src)
    } else {
        soft::copy_refs(&remote, &local).map_err(|r| r.dst)
    };
    let (status, len, step) = match copied {
        Ok(_) => (DtoStatus::Success, len, Step::Next),
        // A region was retired after its key resolved: no byte moved; the
        // local side is reported first, as when resolving.
        Err(true) => (DtoStatus::LocalProtection, 0, Step::Broken),
        Err(false) => (DtoStatus::RemoteAccess, 0, Step::Broken),
    };
    a.complete(wr, status, len);
    step
}

/// Puts back a receive taken by `take_recv_locked` that was not used.
fn untake_recv(b: &EpInner, rq: &mut RecvQueue, wr: RecvWr) {
    match (&b.srq, &b.recv_evd) {
        (Some(srq), Some(evd)) => {
            let _ = evd.release(wr.res); // reserved on this EVD
            srq.inner.recvs.lock().push_front(soft::SrqWr {
                iov: soft::Iov::from_slice(&wr.iov),
                cookie: wr.cookie,
                flags: wr.flags,
            });
        }
        _ => rq.unpop(wr),
    }
}

/// The head send of `a` waited `deadline` for a receive: fail it.
fn rnr_expired(lb: &Arc<Fabric>, a: Weak<EpInner>, deadline: Instant) {
    let Some(a) = a.upgrade() else { return };
    // The receive may have been posted just now: progress first.
    progress(lb, &a);
    let peer = {
        let mut c = a.core.lock();
        if c.rnr_deadline != Some(deadline) || c.state != EpState::Connected {
            return;
        }
        c.rnr_deadline = None;
        let Some(wr) = c.sends.pop_front() else {
            return;
        };
        // As in `progress`: publish and stop the queue under the lock.
        a.complete(wr, DtoStatus::ReceiverNotReady, 0);
        a.set_state(&mut c, EpState::DisconnectPending);
        c.peer.as_ref().and_then(Weak::upgrade)
    };
    a.break_connection(peer.as_ref(), None);
}

#[cfg(test)]
mod tests {
    use rdapl_core::ep::test_hooks::{ABORT_GAP, BREAK_GAP, POST_RECV_GAP};
    use rdapl_core::evd::EvdProducer;
    use rdapl_core::*;
    use std::sync::Arc;
    use std::time::Duration;

    const T: Duration = Duration::from_secs(5);

    struct Side {
        ia: Ia,
        pz: Pz,
        evd: Evd,
        ep: Ep,
    }

    /// The fabric of these tests.
    fn fabric() -> Arc<dyn rdapl_core::provider::Provider> {
        static FABRIC: std::sync::OnceLock<Arc<super::Loopback>> = std::sync::OnceLock::new();
        FABRIC.get_or_init(super::Loopback::new).clone()
    }

    fn side(addr: &str) -> Side {
        let opts = ia::IaOptions {
            params: format!("addr={addr}"),
            ..Default::default()
        };
        let ia = Ia::open_provider(fabric(), opts).unwrap();
        let pz = ia.pz_create().unwrap();
        let evd = ia
            .evd_create(64, EvdFlags::DTO | EvdFlags::CONNECTION | EvdFlags::CR)
            .unwrap();
        let ep = ia
            .ep_create(&pz, Some(&evd), Some(&evd), Some(&evd), None)
            .unwrap();
        Side { ia, pz, evd, ep }
    }

    fn next(evd: &Evd) -> Event {
        evd.wait(Some(T), 1).expect("an event within the timeout").0
    }

    fn conn_kind(evd: &Evd) -> ConnectionEventKind {
        match next(evd) {
            Event::Connection(c) => c.kind,
            e => panic!("expected a connection event, got {e:?}"),
        }
    }

    fn dto(evd: &Evd) -> (u64, DtoStatus) {
        match next(evd) {
            Event::Dto(d) => (d.cookie, d.status),
            e => panic!("expected a DTO completion, got {e:?}"),
        }
    }

    /// Server `s` and client `c`, connected.
    fn connected(s_addr: &str, c_addr: &str, qual: u64) -> (Side, Side, Psp) {
        let (s, c) = (side(s_addr), side(c_addr));
        let psp = s.ia.psp_create(qual, &s.evd).unwrap();
        c.ep.connect(s.ia.address(), qual, Some(T), b"").unwrap();
        let cr = match next(&s.evd) {
            Event::ConnectionRequest(a) => s.ia.cr(a.cr).unwrap(),
            e => panic!("{e:?}"),
        };
        cr.accept(&s.ep, b"").unwrap();
        assert_eq!(conn_kind(&s.evd), ConnectionEventKind::Established);
        assert_eq!(conn_kind(&c.evd), ConnectionEventKind::Established);
        (s, c, psp)
    }

    /// The receiver `s` disconnects; in the window before the sender `c`
    /// is disconnected too (`c` still connected, its peer still `s`), `s`
    /// is reset and posts a receive for its next connection, and `c` posts
    /// a send (`queued_first`: with one already waiting for a receive, so
    /// the general path executes it). No message of the old connection may
    /// land in that receive: `c`'s sends are flushed by its disconnect and
    /// the receive stays posted.
    fn old_send_never_lands_in_next_receive(s_addr: &str, c_addr: &str, queued_first: bool) {
        let (s, c, _psp) = connected(s_addr, c_addr, 4100);
        let sbuf =
            c.pz.lmr_create_from(b"old connection".to_vec(), MemPriv::LOCAL_READ)
                .unwrap();
        let rbuf = s.pz.lmr_create(Region::zeroed(64), MemPriv::ALL).unwrap();
        let send = sbuf.triplet(0, 14).unwrap();
        if queued_first {
            // No receive: it waits at the head of the queue.
            c.ep.post_send(&[send], 1, CompletionFlags::DEFAULT)
                .unwrap();
        }
        let (s_ep, c_ep) = (s.ep.clone(), c.ep.clone());
        let recv = rbuf.triplet(0, 64).unwrap();
        let late_send = std::rc::Rc::new(std::cell::Cell::new(None));
        let late = late_send.clone();
        BREAK_GAP.with(|h| {
            *h.borrow_mut() = Some(Box::new(move || {
                // `s` is told; `c` left the connection with it, not yet told.
                assert_eq!(s_ep.state(), EpState::Disconnected);
                assert_eq!(
                    c_ep.state(),
                    EpState::Disconnected,
                    "both sides left together"
                );
                s_ep.reset().unwrap();
                s_ep.post_recv(&[recv], 100, CompletionFlags::DEFAULT)
                    .unwrap();
                // Refused (the endpoint is out of the connection) or, if
                // taken, flushed: never delivered.
                late.set(Some(
                    c_ep.post_send(&[send], 2, CompletionFlags::DEFAULT).is_ok(),
                ));
            }))
        });
        s.ep.disconnect(false).unwrap();
        assert!(BREAK_GAP.with(|h| h.borrow().is_none()), "the hook ran");
        assert_eq!(conn_kind(&s.evd), ConnectionEventKind::Disconnected);
        assert_eq!(
            s.evd.dequeue().unwrap().map(|e| format!("{e:?}")),
            None,
            "the receive of the next connection took nothing"
        );
        assert_eq!(rbuf.to_vec().unwrap(), vec![0; 64]);
        assert_eq!(s.ep.query().unwrap().outstanding, (0, 1));
        if queued_first {
            assert_eq!(dto(&c.evd), (1, DtoStatus::Flushed));
        }
        if late_send.get().expect("the hook posted") {
            assert_eq!(dto(&c.evd), (2, DtoStatus::Flushed));
        }
        assert_eq!(conn_kind(&c.evd), ConnectionEventKind::Disconnected);
        assert_eq!(c.evd.dequeue().unwrap().map(|e| format!("{e:?}")), None);
    }

    /// `post_recv` reads the state under the posters' lock alone:
    /// after a DTO error stopped both sides, refused on the side not yet
    /// told (it left the connection with the other) and once it is, with
    /// the state's subtype; accepted again after a reset.
    #[test]
    fn post_recv_refused_while_disconnecting() {
        let (s, c, _psp) = connected("127.0.77.5", "127.0.77.6", 4101);
        let buf = s.pz.lmr_create(Region::zeroed(64), MemPriv::ALL).unwrap();
        let cbuf = c.pz.lmr_create(Region::zeroed(64), MemPriv::ALL).unwrap();
        let recv = buf.triplet(0, 64).unwrap();
        let refused = |r: Result<()>, want: error::Subtype| match r {
            Err(Error::InvalidState { state, .. }) => assert_eq!(state, want),
            r => panic!("expected InvalidState({want:?}), got {r:?}"),
        };
        let s_ep = s.ep.clone();
        let c_ep = c.ep.clone();
        BREAK_GAP.with(|h| {
            *h.borrow_mut() = Some(Box::new(move || {
                // `c` is told; `s` left the connection with it, not yet
                // told.
                assert_eq!(s_ep.state(), EpState::Disconnected);
                refused(
                    s_ep.post_recv(&[recv], 1, CompletionFlags::DEFAULT),
                    error::Subtype::InvalidStateEpDisconnected,
                );
                refused(
                    c_ep.post_recv(&[recv], 2, CompletionFlags::DEFAULT),
                    error::Subtype::InvalidStateEpDisconnected,
                );
            }))
        });
        c.ep.inject_failure(DtoStatus::LocalLength);
        c.ep.post_send(&[cbuf.triplet(0, 8).unwrap()], 3, CompletionFlags::DEFAULT)
            .unwrap();
        assert!(BREAK_GAP.with(|h| h.borrow().is_none()), "the hook ran");
        assert_eq!(s.ep.state(), EpState::Disconnected);
        refused(
            s.ep.post_recv(&[recv], 4, CompletionFlags::DEFAULT),
            error::Subtype::InvalidStateEpDisconnected,
        );
        s.ep.reset().unwrap();
        s.ep.post_recv(&[recv], 5, CompletionFlags::DEFAULT)
            .unwrap();
        assert_eq!(s.ep.query().unwrap().outstanding, (0, 1));
    }

    /// Once one side of a connection has been told it is disconnected (its
    /// requests flushed, its connection event raised), the other side can
    /// no longer reach its memory: an RDMA write posted then does not land,
    /// an RDMA read does not read. (Both sides leave the connection
    /// together, before either is told.)
    #[test]
    fn no_rdma_reaches_a_side_told_it_is_disconnected() {
        let (s, c, _psp) = connected("127.0.77.8", "127.0.77.9", 4102);
        let target = s.pz.lmr_create(Region::zeroed(64), MemPriv::ALL).unwrap();
        let remote = target.rmr_triplet(0, 64).unwrap();
        let src = c.pz.lmr_create_from(vec![0xAB; 64], MemPriv::ALL).unwrap();
        let local = src.triplet(0, 64).unwrap();
        // The connection works: a write lands, and is undone.
        c.ep.post_rdma_write(&[local], remote, 1, CompletionFlags::DEFAULT)
            .unwrap();
        assert_eq!(dto(&c.evd), (1, DtoStatus::Success));
        assert_eq!(target.to_vec().unwrap(), vec![0xAB; 64]);
        target.write_at(0, &[0; 64]).unwrap();
        let c_ep = c.ep.clone();
        let s_evd = s.evd.clone();
        let posted = std::rc::Rc::new(std::cell::Cell::new((None, None)));
        let out = posted.clone();
        BREAK_GAP.with(|h| {
            *h.borrow_mut() = Some(Box::new(move || {
                // `s` has been told.
                assert!(matches!(
                    s_evd.dequeue().unwrap(),
                    Some(Event::Connection(e)) if e.kind == ConnectionEventKind::Disconnected
                ));
                let w = c_ep
                    .post_rdma_write(&[local], remote, 2, CompletionFlags::DEFAULT)
                    .is_ok();
                let r = c_ep
                    .post_rdma_read(&[local], remote, 3, CompletionFlags::DEFAULT)
                    .is_ok();
                out.set((Some(w), Some(r)));
            }))
        });
        s.ep.disconnect(false).unwrap();
        assert!(BREAK_GAP.with(|h| h.borrow().is_none()), "the hook ran");
        assert_eq!(target.to_vec().unwrap(), vec![0; 64], "no write landed");
        assert_eq!(src.to_vec().unwrap(), vec![0xAB; 64], "no read landed");
        // Taken requests (if any) are flushed, never executed.
        let (w, r) = posted.get();
        if w.expect("the hook posted") {
            assert_eq!(dto(&c.evd), (2, DtoStatus::Flushed));
        }
        if r.expect("the hook posted") {
            assert_eq!(dto(&c.evd), (3, DtoStatus::Flushed));
        }
        assert_eq!(conn_kind(&c.evd), ConnectionEventKind::Disconnected);
        assert_eq!(c.evd.dequeue().unwrap().map(|e| format!("{e:?}")), None);
    }

    /// A receive whose post passed its checks just before its endpoint was
    /// freed, and that reaches the receive queue while the free is under
    /// way (between refusing receives and flushing them), is refused: it is
    /// never queued behind the flush, where its completion (and its EVD
    /// reservation) would be lost.
    #[test]
    fn post_recv_racing_free_is_refused_not_lost() {
        let s = side("127.0.77.7");
        let rbuf = s.pz.lmr_create(Region::zeroed(64), MemPriv::ALL).unwrap();
        let recv = rbuf.triplet(0, 64).unwrap();
        let (passed_tx, passed_rx) = std::sync::mpsc::channel::<()>();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let ep = s.ep.clone();
        let poster = std::thread::spawn(move || {
            POST_RECV_GAP.with(|h| {
                *h.borrow_mut() = Some(Box::new(move || {
                    passed_tx.send(()).unwrap();
                    go_rx.recv_timeout(T).unwrap();
                }))
            });
            ep.post_recv(&[recv], 7, CompletionFlags::DEFAULT)
        });
        // The post passed its checks (the endpoint was live) and waits.
        passed_rx.recv_timeout(T).unwrap();
        let result = std::sync::Arc::new(parking_lot::Mutex::new(None));
        let out = result.clone();
        ABORT_GAP.with(|h| {
            *h.borrow_mut() = Some(Box::new(move || {
                go_tx.send(()).unwrap();
                *out.lock() = Some(poster.join().unwrap());
            }))
        });
        s.ep.free().unwrap();
        assert!(ABORT_GAP.with(|h| h.borrow().is_none()), "the hook ran");
        let posted = result.lock().take().expect("the post finished in the gap");
        assert!(
            matches!(posted, Err(Error::InvalidState { .. })),
            "a receive reaching a freed endpoint's queue must be refused, got {posted:?}"
        );
        // Nothing was queued, so nothing is left over: the EVD is empty and
        // its whole capacity can be reserved again.
        assert!(s.evd.dequeue().unwrap().is_none());
        let all: Vec<_> = (0..64).map(|_| s.evd.reserve().unwrap()).collect();
        for r in all {
            s.evd.release(r).unwrap();
        }
    }

    #[test]
    fn send_fast_never_lands_in_the_next_connections_receive() {
        old_send_never_lands_in_next_receive("127.0.77.1", "127.0.77.2", false);
    }

    #[test]
    fn queued_send_never_lands_in_the_next_connections_receive() {
        old_send_never_lands_in_next_receive("127.0.77.3", "127.0.77.4", true);
    }
}
