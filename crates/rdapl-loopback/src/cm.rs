//! Connection management: connect, accept, reject and disconnect between
//! two endpoints of one fabric, the request delivered to the listening
//! service point, the connection numbered on both sides.

use crate::Port;
use crate::dto::progress;
use crate::fabric::Fabric;
use crate::link::{self, Link};
use parking_lot::Mutex;
use rdapl_core::ep::EpState;
use rdapl_core::error::{Error, Result, Subtype};
use rdapl_core::event::ConnectionEventKind;
use rdapl_core::provider::soft::{self, TimerKey};
use rdapl_core::provider::{Attempt, CrInner, CrOps, CrState, EpInner};
use std::net::IpAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

pub(crate) fn connect(
    ia: &Port,
    ep: &Arc<EpInner>,
    attempt: Attempt,
    remote: IpAddr,
    conn_qual: u64,
    private_data: Vec<u8>,
    timeout: Option<Duration>,
) -> Result<()> {
    // The fabric's timer serves this connect's timeout and both sides'
    // receiver-not-ready waits: it runs before the connection can exist,
    // so that arming it later cannot fail.
    ia.lb
        .timer
        .ensure_running()
        .map_err(|_| Error::InsufficientResources {
            resource: Subtype::ResourceDevice,
            what: "loopback: the timer thread could not be started",
        })?;
    let sp = ia.lb.listener(remote, conn_qual);
    let Some(sp) = sp else {
        let reachable = ia.lb.reachable(remote);
        // Nobody listens on a reachable address: the connection
        // manager refuses, not the peer consumer (as a TCP reset, and
        // uDAPL's NON_PEER_REJECTED for a request no listener took).
        fail_active(
            ep,
            attempt,
            if reachable {
                ConnectionEventKind::NonPeerRejected
            } else {
                ConnectionEventKind::Unreachable
            },
            None,
        );
        return Ok(());
    };
    let timeout_job = Arc::new(Mutex::new(None));
    let ops = Box::new(LoopCr {
        lb: ia.lb.clone(),
        active: Arc::downgrade(ep),
        attempt,
        timeout_job: timeout_job.clone(),
    });
    let cr = CrInner::new(&sp, private_data, ia.addr, ops);
    {
        // Withdrawn before its request was made (a free or a disconnect
        // on another thread, after the core let go of the endpoint's lock
        // and before this; perhaps another attempt begun since): nothing
        // to deliver, its end was raised already. Otherwise the withdrawal
        // that comes later finds the request here and cancels it.
        let mut c = ep.core.lock();
        if !c.is_attempt(attempt) {
            return Ok(());
        }
        c.pending_cr = Some(cr.clone());
    }
    // Armed before the request is delivered, so that an accept, a reject
    // or a cancel always finds the job to cancel. (A timeout too long for
    // an instant is as good as none.)
    if let Some(at) = soft::deadline(timeout) {
        let (cr, ep) = (cr.clone(), Arc::downgrade(ep));
        // Cannot fail: the thread runs (started above).
        if let Ok(key) = ia.lb.timer.at(
            at,
            Box::new(move || {
                if cr.settle_as(CrState::Cancelled)
                    && let Some(ep) = ep.upgrade()
                {
                    fail_active(&ep, attempt, ConnectionEventKind::TimedOut, None);
                }
            }),
        ) {
            *timeout_job.lock() = Some(key);
        }
    }
    if sp.deliver(&cr).is_err() {
        cr.settle_as(CrState::Cancelled);
        cancel_timeout(&ia.lb, &timeout_job);
        fail_active(ep, attempt, ConnectionEventKind::NonPeerRejected, None);
    }
    Ok(())
}

/// A request's table: the connecting endpoint, in this process.
struct LoopCr {
    lb: Arc<Fabric>,
    active: Weak<EpInner>,
    /// Its attempt, which an answer settles only if the endpoint is
    /// still making it.
    attempt: Attempt,
    /// The job that times the connect out, cancelled once the request is
    /// answered or given up: it holds the request and the endpoint's
    /// allocation.
    timeout_job: Arc<Mutex<Option<TimerKey>>>,
}

fn cancel_timeout(lb: &Fabric, job: &Mutex<Option<TimerKey>>) {
    let key = job.lock().take();
    if let Some(key) = key {
        lb.timer.cancel(key);
    }
}

impl CrOps for LoopCr {
    fn accept(&self, cr: &Arc<CrInner>, ep: &Arc<EpInner>, private_data: Vec<u8>) -> Result<()> {
        accept(self, cr, ep, private_data)
    }

    fn reject(&self, cr: &Arc<CrInner>, private_data: Vec<u8>) -> Result<()> {
        reject(self, cr, private_data)
    }

    fn cancelled(&self) {
        cancel_timeout(&self.lb, &self.timeout_job);
    }
}

fn accept(req: &LoopCr, cr: &Arc<CrInner>, ep: &Arc<EpInner>, private_data: Vec<u8>) -> Result<()> {
    let active = req.active.upgrade();
    if !cr.settle_as(CrState::Accepted) {
        return Err(Error::InvalidHandle(Subtype::InvalidHandleCr));
    }
    cancel_timeout(&req.lb, &req.timeout_job);
    let Some(active) = active else {
        return Err(Error::Abort("the connecting endpoint went away"));
    };
    {
        let (mut cp, mut ca) = link::lock_pair(ep, &active);
        if !ca.is_attempt(req.attempt) {
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
        cp.link = Some(Link::to(&active));
        cp.remote = Some((cr.remote(), cr.qualifier()));
        ca.state = EpState::Connected;
        ca.link = Some(Link::to(ep));
        ca.pending_cr = None;
        ca.peer_private = Some(private_data.clone().into_boxed_slice());
    }
    ep.connection_event(ConnectionEventKind::Established, None);
    active.connection_event(
        ConnectionEventKind::Established,
        Some(private_data.into_boxed_slice()),
    );
    progress_ep_and_peer(&req.lb, ep);
    Ok(())
}

fn reject(req: &LoopCr, cr: &Arc<CrInner>, private_data: Vec<u8>) -> Result<()> {
    if !cr.settle_as(CrState::Rejected) {
        return Err(Error::InvalidHandle(Subtype::InvalidHandleCr));
    }
    cancel_timeout(&req.lb, &req.timeout_job);
    if let Some(active) = req.active.upgrade() {
        fail_active(
            &active,
            req.attempt,
            ConnectionEventKind::PeerRejected,
            Some(&private_data),
        );
    }
    Ok(())
}

pub(crate) fn disconnect(ep: &Arc<EpInner>, _graceful: bool) {
    // Requests execute as soon as they can, so a graceful disconnect
    // has nothing left to wait for but requests blocked on the peer:
    // those are flushed, as an abrupt one does.
    link::break_link(ep, Some(ConnectionEventKind::Disconnected));
}

/// The active side's connection attempt failed with `kind`.
pub(crate) fn fail_active(
    ep: &Arc<EpInner>,
    attempt: Attempt,
    kind: ConnectionEventKind,
    private: Option<&[u8]>,
) {
    ep.connect_failed(attempt, kind, private);
}

/// Progresses `ep`'s requests, then its peer's (which may wait for a
/// receive `ep` just posted).
fn progress_ep_and_peer(lb: &Arc<Fabric>, ep: &Arc<EpInner>) {
    progress(lb, ep);
    if let Some(p) = link::peer_of(ep) {
        progress(lb, &p);
    }
}
