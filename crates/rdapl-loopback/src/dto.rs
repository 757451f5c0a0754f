//! Executing requests: sends into the peer's receives, RDMA writes and
//! reads, memory operations, in post order per endpoint, with the fast
//! paths of the usual send and RDMA request; the receiver-not-ready clock.

use crate::fabric::Fabric;
use crate::link::{self, Link};
use rdapl_core::ep::{CompletionFlags, EpState};
use rdapl_core::evd::EvdProducer;
use rdapl_core::event::{DtoStatus, PzHandle};
use rdapl_core::mem::{LmrTriplet, MemPriv, RmrTriplet};
use rdapl_core::provider::soft::{
    self, KeyCache, RecvQueue, Request, Span, SpanRef, SpanRefs, Spans, WrOp,
};
use rdapl_core::provider::{EpCore, EpInner, EpLock, IaInner, NewWr, RecvWr, Wr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

#[inline]
pub(crate) fn submit(lb: &Arc<Fabric>, ep: &Arc<EpInner>, mut core: EpLock<'_>, wr: NewWr<'_>) {
    // Nothing ahead of it: a send or RDMA request that can run now
    // completes without going through the queue (and is never copied
    // into a queued `Wr`).
    let c = &mut *core;
    let wr = 'now: {
        if !(c.sends.is_empty() && c.state == EpState::Connected) {
            break 'now wr;
        }
        match wr.op {
            WrOp::Send => {
                let conn = c.conn;
                let Some(l) = link::of(&mut c.link) else {
                    break 'now wr;
                };
                let Some(b) = l.peer() else {
                    break 'now wr;
                };
                // The usual message needs only the peer's receive
                // queue; anything else (no receive, a failure) needs
                // the peer locked too: at once if the handle order
                // allows it (or the lock is free), else it queues.
                let wr = match send_fast(ep, &b, conn, l, wr) {
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
                match send(lb, ep, &b, c, wr) {
                    Ok(Step::Broken) => {
                        stop_both((ep, c), (&b, &mut cb));
                        drop(cb);
                        drop(core);
                        link::break_both(ep, Some(&b), None);
                    }
                    Ok(_) => {}
                    // No receive yet: it waits at the head.
                    Err(wr) => c.sends.push_back(wr.queued()),
                }
                return;
            }
            WrOp::RdmaWrite(r) | WrOp::RdmaRead(r) => {
                let write = matches!(wr.op, WrOp::RdmaWrite(_));
                if let Some(l) = link::of(&mut c.link)
                    && let Some(len) = rdma_try(ep, wr.iov, l, r, write)
                {
                    wr.complete(ep, DtoStatus::Success, len);
                    return;
                }
                wr
            }
            _ => wr,
        }
    };
    core.sends.push_back(wr.queued());
    progress_locked(lb, ep, core);
}

pub(crate) fn kick(lb: &Arc<Fabric>, ep: &Arc<EpInner>, recv: bool) {
    if recv {
        // Only the peer's head send can have been waiting for this, and
        // only if it found no receive (it says so under `ep`'s posters'
        // lock, which the poster took after it: no kick is lost; see
        // `RecvQueue::refill`).
        if !ep.recv_wanted.load(Ordering::Relaxed) {
            return;
        }
        if let Some(p) = link::peer_of(ep) {
            progress(lb, &p);
        }
    } else {
        progress(lb, ep);
    }
}

pub(crate) fn srq_posted(lb: &Arc<Fabric>, srq: &rdapl_core::srq::SrqInner) {
    for ep in srq.takers() {
        if let Some(p) = link::peer_of(&ep) {
            progress(lb, &p);
        }
    }
}

/// What one step of [`progress`] did.
pub(crate) enum Step {
    /// The head request completed: go on with the next.
    Next,
    /// The head request cannot execute yet: stop.
    Blocked,
    /// A DTO error: stop both queues and break the connection.
    Broken,
}

/// Executes `a`'s send queue, in order, until it is empty or blocked.
pub(crate) fn progress(lb: &Arc<Fabric>, a: &Arc<EpInner>) {
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
fn progress_locked<'g>(lb: &Arc<Fabric>, a: &'g Arc<EpInner>, mut ca: EpLock<'g>) {
    loop {
        let c = &mut *ca;
        if c.state != EpState::Connected {
            return;
        }
        let Some(head) = c.sends.front() else {
            return;
        };
        let (r, write) = match head.op {
            WrOp::RdmaWrite(r) => (r, true),
            WrOp::RdmaRead(r) => (r, false),
            _ => break,
        };
        let Some(l) = link::of(&mut c.link) else {
            break;
        };
        let Some(len) = rdma_try(a, &head.iov, l, r, write) else {
            break;
        };
        let wr = c.sends.pop_front().expect("head");
        a.complete(wr, DtoStatus::Success, len);
    }
    progress_both(lb, a, ca);
}

/// An RDMA write (`write`) or read of `iov` against `r` on the peer (its
/// IA and zone, as `a`'s link `l` names them): the bytes moved, or `None`
/// (and nothing moved) if any check or the copy failed.
fn rdma_try(
    a: &EpInner,
    iov: &[LmrTriplet],
    l: &mut Link,
    r: RmrTriplet,
    write: bool,
) -> Option<u64> {
    let (keys, peer_keys) = (&mut l.keys, &mut l.peer_keys);
    let (peer, peer_pz): (&IaInner, _) = (&l.peer_ia, l.peer_pz);
    let (local_right, remote_right) = if write {
        (MemPriv::LOCAL_READ, MemPriv::REMOTE_WRITE)
    } else {
        (MemPriv::LOCAL_WRITE, MemPriv::REMOTE_READ)
    };
    // The usual request: one local buffer, both keys cached.
    if let [t] = iov
        && t.segment_length > 0
    {
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
fn progress_both<'g>(lb: &Arc<Fabric>, a: &'g Arc<EpInner>, mut ca: EpLock<'g>) {
    if ca.state != EpState::Connected || ca.sends.is_empty() {
        return;
    }
    let Some(b) = link::of(&mut ca.link).and_then(|l| l.peer()) else {
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
        if !link::of(&mut ca.link).is_some_and(|l| l.is_to(&b)) {
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
        let step = if is_local {
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
        link::break_both(a, Some(&b), None);
    }
}

/// After a DTO error: stops both queues at once (with both endpoints
/// locked); `link::break_both` then flushes.
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
    let conn = ca.conn;
    // (Connected, locked: the link is there.)
    let Some(l) = link::of(&mut ca.link) else {
        return Err(wr);
    };
    let mut rq = b.rq.lock();
    let r = send_locked(lb, a, b, (conn, l), wr, &mut rq);
    b.publish_taken(&rq);
    r
}

/// [`send`], `b`'s receive queue locked (`rq`), `a`'s connection `conn`
/// and its link `l`.
#[allow(clippy::result_large_err)]
fn send_locked<R: Request>(
    lb: &Arc<Fabric>,
    a: &Arc<EpInner>,
    b: &Arc<EpInner>,
    (conn, l): (u64, &mut Link),
    wr: R,
    rq: &mut RecvQueue,
) -> std::result::Result<Step, R> {
    // `b`'s side of the connection ended (its receives, if any, are for
    // the next one): this send waits, and `a`'s disconnect, on its way,
    // flushes it.
    if rq.conn != conn {
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
        if let Some(rwr) = rq.recvs.front().filter(|_| wr.invalidates().is_none())
            && let Some((n, _)) =
                copy_one_cached(a, b, (&mut l.keys, &mut rq.keys), wr.iov(), &rwr.iov)
        {
            let mut rwr = rq.pop().expect("head");
            received(b, l);
            if wr.flags().contains(CompletionFlags::SOLICITED_WAIT) {
                rwr.flags = rwr.flags | CompletionFlags::SOLICITED_ARRIVAL;
            }
            // The receiver waits for its completion: it goes first.
            complete_taken(b, rq.taken, rwr, DtoStatus::Success, n);
            wr.complete(a, DtoStatus::Success, n);
            return Ok(Step::Next);
        }
    }
    let Some(mut rwr) = b.take_recv_locked(rq) else {
        // A receive posted from now on kicks us: for `b`'s own queue,
        // `refill` above said so under the posters' lock; a shared receive
        // queue's posts run its endpoints' peers' progress anyway.
        if l.rnr_deadline.is_none() {
            let deadline = soft::deadline(Some(lb.rnr_timeout())).unwrap_or_else(Instant::now);
            l.rnr_deadline = Some(deadline);
            let (lb2, a2) = (lb.clone(), Arc::downgrade(a));
            // Cannot fail: the connect started the thread.
            let _ = lb
                .timer
                .at(deadline, Box::new(move || rnr_expired(&lb2, a2, deadline)));
        }
        return Err(wr);
    };
    // A Send with Invalidate: the key goes when a receive is at hand, and
    // before any byte moves; a key the peer cannot invalidate moves none.
    let inval = wr.invalidates();
    if let Some(k) = inval
        && b.invalidate_remote(k).is_err()
    {
        untake_recv(b, rq, rwr);
        wr.complete(a, DtoStatus::RemoteAccess, 0);
        return Ok(Step::Broken);
    }
    received(b, l);
    if b.srq.is_some()
        && inval.is_none()
        && let Some((n, _)) = copy_one_cached(a, b, (&mut l.keys, &mut rq.keys), wr.iov(), &rwr.iov)
    {
        if wr.flags().contains(CompletionFlags::SOLICITED_WAIT) {
            rwr.flags = rwr.flags | CompletionFlags::SOLICITED_ARRIVAL;
        }
        complete_taken(b, rq.taken, rwr, DtoStatus::Success, n);
        wr.complete(a, DtoStatus::Success, n);
        return Ok(Step::Next);
    }
    let (mut hold_src, mut hold_dst) = (Spans::new(), Spans::new());
    let src = match a.ia.mem.resolve_local_cached(
        &mut l.keys,
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
        b.recv_pz_handle(),
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

/// [`send`] of the usual message (the request `wr` of `a`, locked, in
/// connection `conn` over link `l`, nothing queued ahead), with `b`'s receive queue alone locked: into the
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
    conn: u64,
    l: &mut Link,
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
    for h in l.hints {
        soft::prefetch_write(h as *const u8);
    }
    soft::prefetch_read(l.read_hint as *const u8);
    let mut guard = b.rq.lock();
    let rq = &mut *guard;
    // Of another connection (`b`'s ended): as in `send`.
    if rq.conn != conn {
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
        copy_one_cached(a, b, (&mut l.keys, &mut rq.keys), wr.iov(), &rwr.iov)
    } else {
        // An owned buffer on one side at least: no region lock to hint.
        copy_one_owned(a, b, (&mut l.keys, &mut rq.keys), &wr, rwr).map(|n| (n, 0))
    };
    let Some((n, dst_lock)) = copied else {
        return Err(wr);
    };
    let mut rwr = rq.pop().expect("head");
    // Where the next send to `b` will probably go: hints for its prefetch
    // (its head receive, or the posters' lock it will take to move the
    // posted receives over).
    l.hints = [
        rq.recvs.front().map_or_else(
            || std::ptr::from_ref(&*b.posted) as usize,
            |r| r as *const RecvWr as usize,
        ),
        dst_lock,
    ];
    received(b, l);
    if wr.flags().contains(CompletionFlags::SOLICITED_WAIT) {
        rwr.flags = rwr.flags | CompletionFlags::SOLICITED_ARRIVAL;
    }
    // The receiver waits for its completion: it goes first.
    complete_taken(b, rq.taken, rwr, DtoStatus::Success, n);
    // The next head receive's owned buffer: its lines as hints too (read
    // only now, the receiver already on its way).
    l.read_hint = 0;
    if let Some(next) = rq.recvs.front().and_then(|r| r.buf.as_ref()) {
        let (header, bytes) = next.hint_addrs();
        l.hints[1] = bytes;
        l.read_hint = header;
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
fn received(b: &EpInner, l: &mut Link) {
    if b.recv_wanted.load(Ordering::Relaxed) {
        b.recv_wanted.store(false, Ordering::Relaxed);
    }
    if l.rnr_deadline.is_some() {
        l.rnr_deadline = None;
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
    let src = resolve_triplet(a, ka, s, MemPriv::LOCAL_READ, a.pz_handle())?;
    let dst = resolve_triplet(b, kb, d, MemPriv::LOCAL_WRITE, b.recv_pz_handle())?;
    let dst_lock = dst.region.lock_addr();
    soft::copy_one(src, dst).ok().map(|n| (n as u64, dst_lock))
}

/// The span of one triplet `t` of `ep` (its IA's keys, zone `pz`: the
/// endpoint's for what it sends, its receives' for what it receives), for
/// `right`, through `cache`.
#[inline(always)]
fn resolve_triplet<'c>(
    ep: &EpInner,
    cache: &'c mut KeyCache,
    t: &LmrTriplet,
    right: MemPriv,
    pz: PzHandle,
) -> Option<SpanRef<'c>> {
    ep.ia.mem.resolve_one_cached(
        cache,
        t.lmr_context,
        t.virtual_address,
        t.segment_length,
        right,
        pz,
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
            let dst = resolve_triplet(b, kb, d, MemPriv::LOCAL_WRITE, b.recv_pz_handle())?;
            soft::copy_from_buf(s, &[dst]).ok()?
        }
        (None, Some(d)) => {
            let [s] = wr.iov() else { return None };
            if s.segment_length as usize > d.len() {
                return None;
            }
            let src = resolve_triplet(a, ka, s, MemPriv::LOCAL_READ, a.pz_handle())?;
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
        if c.state != EpState::Connected {
            return;
        }
        let Some(l) = link::of(&mut c.link).filter(|l| l.rnr_deadline == Some(deadline)) else {
            return;
        };
        l.rnr_deadline = None;
        let peer = l.peer();
        let Some(wr) = c.sends.pop_front() else {
            return;
        };
        // As in `progress`: publish and stop the queue under the lock.
        a.complete(wr, DtoStatus::ReceiverNotReady, 0);
        a.set_state(&mut c, EpState::DisconnectPending);
        peer
    };
    link::break_both(&a, peer.as_ref(), None);
}
