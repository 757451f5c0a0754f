//! Service points and connection requests.
//!
//! A public service point ([`Psp`]) listens on a connection qualifier; each
//! connection request that arrives becomes a [`Cr`] and a
//! `ConnectionRequest` event (carrying the CR's handle) on the PSP's CR EVD.
//! The consumer looks the CR up with [`crate::Ia::cr`], reads its private
//! data, and accepts it on an endpoint (with private data of its own) or
//! rejects it. A reserved service point ([`Rsp`]) binds one endpoint to a
//! qualifier; it serves one request and is consumed by it.
//!
//! A request can go away before it is answered: the active side times
//! out, disconnects, is freed, or its IA closes. The request is then
//! cancelled (accept and reject refuse it with `InvalidHandle(Cr)`, so
//! nothing is accepted into a dead peer), and an RSP's endpoint, reserved
//! for it, does not stay in `TentativeConnectionPending`: as uDAPL does
//! for a passive endpoint whose request fails (`dapls_cr_callback`), it
//! goes to `Disconnected` and gets `Broken` on its connection EVD, so it
//! can be reset (and reserved again) or freed, and the IA closed. When
//! the passive side's IA closes, its pending requests are rejected, so no
//! active side waits for an answer that cannot come.

use crate::ep::{Ep, EpInner, EpState};
use crate::error::{Error, Result, Subtype};
use crate::evd::{Evd, EvdProducer, Feeder};
use crate::event::{ConnectionEventKind, CrArrival, CrHandle, Event, EventStream, SpHandle};
use crate::ia::{Ia, IaInner};
use crate::provider::{CrOps, ListenerOps};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Which kind of service point.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum SpKind {
    /// Public service point.
    Public,
    /// Reserved service point.
    Reserved,
}

/// The shared part of a service point (what providers work on).
pub struct SpInner {
    /// The consumer context (`DAT_CONTEXT`).
    pub(crate) context: crate::context::ContextSlot,
    pub(crate) id: SpHandle,
    pub(crate) kind: SpKind,
    pub(crate) ia: Arc<IaInner>,
    pub(crate) conn_qual: u64,
    pub(crate) cr_evd: Evd,
    feeder: Mutex<Option<Feeder>>,
    /// Reserved SP: the endpoint it was created for.
    pub(crate) rsp_ep: Option<Arc<EpInner>>,
    pub(crate) crs: Mutex<HashMap<CrHandle, Arc<CrInner>>>,
    freed: AtomicBool,
    /// The provider's table of the listener (taken when it stops).
    listener: Mutex<Option<Box<dyn ListenerOps>>>,
}

/// State of a connection request.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CrState {
    /// Waiting for accept or reject.
    Pending,
    /// Accepted.
    Accepted,
    /// Rejected.
    Rejected,
    /// The active side gave up (timeout, disconnect, free).
    Cancelled,
}

/// The shared part of a connection request.
pub struct CrInner {
    /// The consumer context (`DAT_CONTEXT`).
    pub(crate) context: crate::context::ContextSlot,
    pub(crate) id: CrHandle,
    pub(crate) sp: Arc<SpInner>,
    pub(crate) conn_qual: u64,
    /// At most the IA's `max_private_data_size` bytes of the peer's.
    pub(crate) private_data: Box<[u8]>,
    /// The peer sent more private data than that: the rest was cut.
    truncated: bool,
    pub(crate) remote_address: IpAddr,
    pub(crate) state: Mutex<CrState>,
    /// The provider's table of the request (its own state of it inside).
    ops: Box<dyn CrOps>,
}

fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl CrInner {
    /// Rejects the request as its IA closes (no private data).
    pub(crate) fn reject_closing(self: &Arc<Self>) {
        let _ = self.ops.reject(self, Vec::new());
    }

    /// A new pending request (made by a provider on arrival, then
    /// [`SpInner::deliver`]ed; [`SpInner::request`] does both), answered
    /// through `ops`. Private data past the IA's `max_private_data_size`
    /// (a peer of another implementation may send more) is cut, and the
    /// arrival says so (`CrArrival::truncated`).
    pub fn new(
        sp: &Arc<SpInner>,
        mut private_data: Vec<u8>,
        remote_address: IpAddr,
        ops: Box<dyn CrOps>,
    ) -> Arc<CrInner> {
        let max = sp.ia.attr.max_private_data_size;
        let truncated = private_data.len() > max;
        private_data.truncate(max);
        Arc::new(CrInner {
            context: crate::context::ContextSlot::new(),
            id: CrHandle(next_id()),
            sp: sp.clone(),
            conn_qual: sp.conn_qual,
            private_data: private_data.into_boxed_slice(),
            truncated,
            remote_address,
            state: Mutex::new(CrState::Pending),
            ops,
        })
    }

    /// Moves a pending request to `to`; false if it was no longer pending.
    /// A cancelled request releases an RSP's endpoint (see the module
    /// docs).
    pub(crate) fn settle(&self, to: CrState) -> bool {
        let mut s = self.state.lock();
        if *s != CrState::Pending {
            return false;
        }
        // The reserved endpoint leaves `TentativeConnectionPending` before
        // the request shows as cancelled: whoever sees `Cancelled` sees the
        // endpoint released (its event follows, outside the lock).
        let released = if to == CrState::Cancelled {
            self.release_reserved_ep()
        } else {
            None
        };
        *s = to;
        drop(s);
        self.sp.crs.lock().remove(&self.id);
        if let Some(ep) = released {
            ep.connection_event(ConnectionEventKind::Broken, None);
        }
        true
    }

    /// The active side gave up (disconnect, free, IA close); false if the
    /// request was no longer pending. The provider hears of it
    /// ([`CrOps::cancelled`]).
    pub(crate) fn cancel(&self) -> bool {
        let done = self.settle(CrState::Cancelled);
        if done {
            self.ops.cancelled();
        }
        done
    }

    /// The request went away unanswered: an RSP's endpoint still waiting
    /// for it (`TentativeConnectionPending`) goes to `Disconnected`; the
    /// caller then posts `Broken` on its connection EVD (returned: the
    /// endpoint it released). (One being accepted right now is left to
    /// the accept, which fails and returns it to `Unconnected`.)
    fn release_reserved_ep(&self) -> Option<&Arc<EpInner>> {
        if self.sp.kind != SpKind::Reserved {
            return None;
        }
        let ep = self.sp.rsp_ep.as_ref()?;
        let mut c = ep.core.lock();
        if c.state != EpState::TentativeConnectionPending {
            return None;
        }
        ep.set_state(&mut c, EpState::Disconnected);
        Some(ep)
    }
}

impl SpInner {
    pub(crate) fn is_freed(&self) -> bool {
        self.freed.load(Ordering::SeqCst)
    }

    /// Delivers a connection request: registers it and posts the
    /// `ConnectionRequest` event. Fails if the CR EVD overflowed (the
    /// transport then rejects the request as a non-peer reject).
    ///
    /// A request the active side withdrew before its delivery (its
    /// connect's timer fired first) is delivered as one withdrawn right
    /// after: its event is posted, the request is not registered (a
    /// lookup finds it gone), and an RSP's endpoint is released at once
    /// (`Disconnected`, `Broken`), never left waiting for it.
    pub fn deliver(self: &Arc<Self>, cr: &Arc<CrInner>) -> Result<()> {
        if self.is_freed() {
            return Err(Error::InvalidHandle(Subtype::InvalidHandlePsp));
        }
        // An RSP's endpoint waits for the request before anyone can see it
        // (so a cancel, which may come at once, finds it waiting). Both
        // steps run under the request's state, as `CrInner::settle` does
        // its release: a withdrawal comes wholly before them or after.
        let reserved = self
            .rsp_ep
            .as_ref()
            .filter(|_| self.kind == SpKind::Reserved);
        let mut released = None;
        let withdrawn = {
            let st = cr.state.lock();
            let pending = *st == CrState::Pending;
            if let Some(ep) = reserved {
                let mut c = ep.core.lock();
                if c.state == EpState::Reserved {
                    if pending {
                        c.state = EpState::TentativeConnectionPending;
                    } else {
                        ep.set_state(&mut c, EpState::Disconnected);
                        released = Some(ep);
                    }
                }
            }
            if pending {
                self.crs.lock().insert(cr.id, cr.clone());
            }
            !pending
        };
        let ev = Event::ConnectionRequest(CrArrival {
            sp: (self.kind == SpKind::Public).then_some(self.id),
            consumer_context: self.context.get(),
            conn_qual: self.conn_qual,
            cr: cr.id,
            truncated: cr.truncated,
        });
        let posted = self.cr_evd.post_event(ev).is_ok();
        if let Some(ep) = released {
            ep.connection_event(ConnectionEventKind::Broken, None);
        }
        // (A withdrawn request lost in a full CR EVD has nothing to answer.)
        if !posted && !withdrawn {
            self.crs.lock().remove(&cr.id);
            if let Some(ep) = reserved {
                let mut c = ep.core.lock();
                if c.state == EpState::TentativeConnectionPending {
                    c.state = EpState::Reserved;
                }
            }
            return Err(Error::QueueFull);
        }
        if reserved.is_some() {
            // A reserved SP serves one request.
            self.shutdown();
        }
        Ok(())
    }

    /// Stops listening and releases the CR EVD.
    /// False if it was stopped already (by another caller: one wins).
    pub(crate) fn shutdown(&self) -> bool {
        if self.freed.swap(true, Ordering::SeqCst) {
            return false;
        }
        let listener = self.listener.lock().take();
        if let Some(l) = listener {
            l.unlisten(self);
        }
        self.feeder.lock().take();
        self.ia.sps.freed();
        true
    }
}

fn create_sp(
    ia: &Ia,
    kind: SpKind,
    conn_qual: u64,
    cr_evd: &Evd,
    rsp_ep: Option<&Ep>,
) -> Result<Arc<SpInner>> {
    if cr_evd.is_freed() || !cr_evd.flags().accepts(EventStream::ConnectionRequest) {
        return Err(Error::InvalidHandle(Subtype::InvalidHandleEvdCr));
    }
    let feeder = cr_evd.try_feeder_of(&ia.inner.async_evd, Subtype::InvalidHandleEvdCr)?;
    let sp = Arc::new(SpInner {
        context: crate::context::ContextSlot::new(),
        id: SpHandle(next_id()),
        kind,
        ia: ia.inner.clone(),
        conn_qual,
        cr_evd: cr_evd.clone(),
        feeder: Mutex::new(Some(feeder)),
        rsp_ep: rsp_ep.map(|e| e.inner.clone()),
        crs: Mutex::new(HashMap::new()),
        freed: AtomicBool::new(false),
        listener: Mutex::new(None),
    });
    let listener = ia.inner.transport.listen(&sp)?;
    *sp.listener.lock() = Some(listener);
    ia.inner.sps.push(&sp);
    Ok(sp)
}

/// A public service point.
#[derive(Clone)]
pub struct Psp {
    pub(crate) inner: Arc<SpInner>,
}

impl fmt::Debug for Psp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Psp")
            .field("handle", &self.inner.id)
            .field("conn_qual", &self.inner.conn_qual)
            .finish()
    }
}

impl Psp {
    pub(crate) fn create(ia: &Ia, conn_qual: u64, cr_evd: &Evd) -> Result<Psp> {
        Ok(Psp {
            inner: create_sp(ia, SpKind::Public, conn_qual, cr_evd, None)?,
        })
    }

    /// The PSP's handle.
    pub fn handle(&self) -> SpHandle {
        self.inner.id
    }

    /// The connection qualifier it listens on.
    pub fn conn_qual(&self) -> u64 {
        self.inner.conn_qual
    }

    /// Stops listening (`dat_psp_free`). Pending requests stay valid.
    pub fn free(&self) -> Result<()> {
        // (One of two frees at once wins: the other is refused.)
        if !self.inner.shutdown() {
            return Err(Error::InvalidHandle(Subtype::InvalidHandlePsp));
        }
        Ok(())
    }
}

/// A reserved service point.
#[derive(Clone)]
pub struct Rsp {
    pub(crate) inner: Arc<SpInner>,
}

impl fmt::Debug for Rsp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rsp")
            .field("handle", &self.inner.id)
            .field("conn_qual", &self.inner.conn_qual)
            .finish()
    }
}

impl Rsp {
    pub(crate) fn create(ia: &Ia, conn_qual: u64, ep: &Ep, cr_evd: &Evd) -> Result<Rsp> {
        ep.inner.check_live()?;
        if !Arc::ptr_eq(&ep.inner.ia, &ia.inner) {
            return Err(Error::InvalidHandle(Subtype::InvalidHandleEp));
        }
        {
            let mut c = ep.inner.core.lock();
            // Under the lock `Ep::free` marks it freed under.
            ep.inner.check_live()?;
            if c.state != EpState::Unconnected {
                return Err(Error::state(
                    c.state.subtype(),
                    "an RSP needs an unconnected endpoint",
                ));
            }
            c.state = EpState::Reserved;
        }
        match create_sp(ia, SpKind::Reserved, conn_qual, cr_evd, Some(ep)) {
            Ok(inner) => Ok(Rsp { inner }),
            Err(e) => {
                ep.inner.core.lock().state = EpState::Unconnected;
                Err(e)
            }
        }
    }

    /// The RSP's handle.
    pub fn handle(&self) -> SpHandle {
        self.inner.id
    }

    /// Frees the RSP (`dat_rsp_free`); its endpoint returns to `Unconnected`.
    pub fn free(&self) -> Result<()> {
        if !self.inner.shutdown() {
            return Err(Error::InvalidHandle(Subtype::InvalidHandleRsp));
        }
        if let Some(ep) = &self.inner.rsp_ep {
            let mut c = ep.core.lock();
            if c.state == EpState::Reserved {
                c.state = EpState::Unconnected;
            }
        }
        Ok(())
    }
}

/// A connection request.
#[derive(Clone)]
pub struct Cr {
    pub(crate) inner: Arc<CrInner>,
}

impl fmt::Debug for Cr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cr")
            .field("handle", &self.inner.id)
            .field("conn_qual", &self.inner.conn_qual)
            .field("state", &*self.inner.state.lock())
            .finish()
    }
}

impl Ia {
    /// The pending connection request named by a `ConnectionRequest` event.
    pub fn cr(&self, handle: CrHandle) -> Result<Cr> {
        for sp in self.inner.sps.live() {
            if let Some(cr) = sp.crs.lock().get(&handle) {
                return Ok(Cr { inner: cr.clone() });
            }
        }
        Err(Error::InvalidHandle(Subtype::InvalidHandleCr))
    }
}

impl Cr {
    /// The request's handle.
    pub fn handle(&self) -> CrHandle {
        self.inner.id
    }

    /// Private data sent by the active side (`dat_cr_query`).
    pub fn private_data(&self) -> &[u8] {
        &self.inner.private_data
    }

    /// The active side's IA address.
    pub fn remote_address(&self) -> IpAddr {
        self.inner.remote_address
    }

    /// The connection qualifier the request arrived on.
    pub fn conn_qual(&self) -> u64 {
        self.inner.conn_qual
    }

    /// The request's state.
    pub fn state(&self) -> CrState {
        *self.inner.state.lock()
    }

    /// Accepts the request on `ep` with `private_data` (`dat_cr_accept`).
    /// Both sides then get `Established`; the active side receives the
    /// private data. Refused if the request is no longer pending or the
    /// endpoint is not unconnected (or reserved for this request).
    pub fn accept(&self, ep: &Ep, private_data: &[u8]) -> Result<()> {
        let sp = &self.inner.sp;
        ep.inner.check_live()?;
        if !Arc::ptr_eq(&ep.inner.ia, &sp.ia) {
            return Err(Error::InvalidHandle(Subtype::InvalidHandleEp));
        }
        if private_data.len() > sp.ia.attr.max_private_data_size {
            return Err(Error::param(
                3,
                "private data larger than max_private_data_size",
            ));
        }
        if ep.inner.conn_evd.is_none() {
            return Err(Error::state(
                Subtype::InvalidStateEpEvdConnect,
                "the endpoint has no connection EVD",
            ));
        }
        if *self.inner.state.lock() != CrState::Pending {
            return Err(Error::InvalidHandle(Subtype::InvalidHandleCr));
        }
        {
            let mut c = ep.inner.core.lock();
            // Under the lock `Ep::free` marks it freed under.
            ep.inner.check_live()?;
            let ok = c.state == EpState::Unconnected
                || (c.state == EpState::TentativeConnectionPending
                    && sp
                        .rsp_ep
                        .as_ref()
                        .is_some_and(|e| Arc::ptr_eq(e, &ep.inner)));
            if !ok {
                return Err(Error::state(
                    c.state.subtype(),
                    "accept needs an unconnected endpoint",
                ));
            }
            c.state = EpState::PassiveConnectionPending;
        }
        let r = self
            .inner
            .ops
            .accept(&self.inner, &ep.inner, private_data.to_vec());
        if r.is_err() {
            let mut c = ep.inner.core.lock();
            if c.state == EpState::PassiveConnectionPending {
                c.state = EpState::Unconnected;
            }
        }
        r
    }

    /// Rejects the request (`dat_cr_reject`); the active side gets
    /// `PeerRejected` with `private_data`.
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        let sp = &self.inner.sp;
        if private_data.len() > sp.ia.attr.max_private_data_size {
            return Err(Error::param(
                2,
                "private data larger than max_private_data_size",
            ));
        }
        if *self.inner.state.lock() != CrState::Pending {
            return Err(Error::InvalidHandle(Subtype::InvalidHandleCr));
        }
        if let Some(ep) = &sp.rsp_ep {
            let mut c = ep.core.lock();
            if c.state == EpState::TentativeConnectionPending {
                c.state = EpState::Unconnected;
            }
        }
        self.inner.ops.reject(&self.inner, private_data.to_vec())
    }
}

crate::context::consumer_context!(Psp, |s| s.inner.context);
crate::context::consumer_context!(Rsp, |s| s.inner.context);
crate::context::consumer_context!(Cr, |s| s.inner.context);
