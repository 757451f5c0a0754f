//! The endpoint's life: creation (`dat_ep_create`), query, reset, free,
//! and the teardown an abrupt IA close shares with free.
//!
//! Creation checks every handle and limit before the provider sees the
//! endpoint. Once freed, an endpoint refuses posts, connects and queries
//! (`InvalidHandle`). Teardown refuses new receives before it flushes, so
//! no completion is lost.

#[cfg(any(test, feature = "test-hooks"))]
use super::test_hooks;
use super::{Ep, EpAttr, EpCore, EpInner, EpParam, EpState, PostedRecvs, RecvQueue, Wr, next_id};
use crate::error::{Error, Result, Subtype};
use crate::evd::Evd;
use crate::event::{ConnectionEventKind, DtoStatus, EpHandle};
use crate::ia::{Ia, IaInner};
use crate::pz::Pz;
use crate::sync::Lock as Mutex;
use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use crossbeam_utils::CachePadded;
use std::collections::VecDeque;
use std::sync::Arc;

impl Ep {
    pub(crate) fn create(
        ia: &Ia,
        pz: &Pz,
        recv_evd: Option<&Evd>,
        request_evd: Option<&Evd>,
        connect_evd: Option<&Evd>,
        attr: Option<EpAttr>,
        srq: Option<&crate::srq::Srq>,
    ) -> Result<Ep> {
        let user = pz.acquire()?;
        // Held until the endpoint is entered among the SRQ's: a free of
        // the SRQ on another thread comes wholly before (refused here) or
        // after (and sees this endpoint).
        let srq_life = match srq {
            Some(srq) => {
                let g = srq.inner.life.lock();
                if srq.inner.is_freed() || !Arc::ptr_eq(&srq.inner.ia, &ia.inner) {
                    return Err(Error::InvalidHandle(Subtype::InvalidHandleSrq));
                }
                Some(g)
            }
            None => None,
        };
        if !Arc::ptr_eq(&pz.inner.ia, &ia.inner) {
            return Err(Error::InvalidHandle(Subtype::InvalidHandlePz));
        }
        let check = |e: Option<&Evd>, s: crate::event::EventStream, sub: Subtype| -> Result<()> {
            if let Some(e) = e
                && (e.is_freed() || !e.flags().accepts(s))
            {
                return Err(Error::InvalidHandle(sub));
            }
            Ok(())
        };
        use crate::event::EventStream as S;
        check(recv_evd, S::Dto, Subtype::InvalidHandleEvdRecv)?;
        check(request_evd, S::Dto, Subtype::InvalidHandleEvdRequest)?;
        check(connect_evd, S::Connection, Subtype::InvalidHandleEvdConn)?;
        let attr = attr.unwrap_or_default();
        let ia_attr = &ia.inner.attr;
        if attr.max_request_iov > ia_attr.max_iov_segments_per_dto
            || attr.max_recv_iov > ia_attr.max_iov_segments_per_dto
            || attr.max_recv_dtos > ia_attr.max_dto_per_ep
            || attr.max_request_dtos > ia_attr.max_dto_per_ep
            || attr.max_message_size > ia_attr.max_message_size
            || attr.max_rdma_size > ia_attr.max_rdma_size
            || attr.max_rdma_read_in > ia_attr.max_rdma_read_per_ep
            || attr.max_rdma_read_out > ia_attr.max_rdma_read_per_ep
        {
            return Err(Error::param(
                6,
                "endpoint attributes exceed the IA's limits",
            ));
        }
        // Feeding first, refused if an EVD was freed meanwhile (checked
        // under the lock `Evd::free` takes: the two never both succeed).
        let feeders = [
            (recv_evd, Subtype::InvalidHandleEvdRecv),
            (request_evd, Subtype::InvalidHandleEvdRequest),
            (connect_evd, Subtype::InvalidHandleEvdConn),
        ]
        .into_iter()
        .filter_map(|(e, sub)| e.map(|e| e.try_feeder_of(&ia.inner.async_evd, sub)))
        .collect::<Result<Vec<_>>>()?;
        let id = EpHandle(next_id());
        let place = crate::ia::Admission::take(
            &ia.inner.live.eps,
            ia.inner.attr.max_eps,
            Subtype::ResourceTep,
            "max_eps endpoints live",
        )?;
        // The provider's table, before anything of the endpoint exists.
        let ops = ia.inner.transport.ep_create(&crate::provider::EpInfo {
            handle: id,
            pz: pz.inner.id,
            attr: &attr,
            srq: srq.map(|s| s.inner.id),
        })?;
        let inner = Arc::new(EpInner {
            context: crate::context::ContextSlot::new(),
            id,
            ia: ia.inner.clone(),
            pz: pz.clone(),
            attr,
            recv_evd: recv_evd.cloned(),
            request_evd: request_evd.cloned(),
            conn_evd: connect_evd.cloned(),
            srq: srq.cloned(),
            feeders: Mutex::new(feeders),
            core: CachePadded::new(Mutex::new(EpCore {
                state: EpState::Unconnected,
                conn: 0,
                remote: None,
                sends: VecDeque::new(),
                attempt: Default::default(),
                pending_cr: None,
                peer_private: None,
                link: None,
            })),
            rq: CachePadded::new(Mutex::new(RecvQueue {
                conn: 0,
                recvs: VecDeque::new(),
                taken: 0,
                keys: Default::default(),
            })),
            posted: CachePadded::new(Mutex::new(PostedRecvs {
                refused: None,
                recvs: VecDeque::new(),
                total: 0,
                taken_seen: 0,
            })),
            taken: CachePadded::new(AtomicU64::new(0)),
            recv_hint: CachePadded::new(AtomicUsize::new(0)),
            recv_wanted: AtomicBool::new(false),
            freed: AtomicBool::new(false),
            requests: CachePadded::new(AtomicUsize::new(0)),
            ops,
        });
        user.keep();
        place.keep();
        ia.inner.eps.push(&inner);
        if let Some(srq) = srq {
            srq.inner.eps.push(&inner);
        }
        drop(srq_life);
        Ok(Ep { inner })
    }

    /// The endpoint's handle.
    pub fn handle(&self) -> EpHandle {
        self.inner.id
    }

    /// Current state.
    pub fn state(&self) -> EpState {
        self.inner.core.lock().state
    }

    /// The endpoint's parameters (`dat_ep_query`).
    pub fn query(&self) -> Result<EpParam> {
        self.inner.check_live()?;
        let c = self.inner.core.lock();
        Ok(EpParam {
            handle: self.inner.id,
            state: c.state,
            attr: self.inner.attr,
            remote: c.remote,
            outstanding: (
                self.inner.requests.load(Ordering::Acquire),
                self.inner.outstanding_recvs(),
            ),
            peer_private_data: c.peer_private.clone(),
        })
    }

    /// Returns a disconnected endpoint to `Unconnected` (`dat_ep_reset`),
    /// flushing anything still posted.
    pub fn reset(&self) -> Result<()> {
        let inner = &self.inner;
        inner.check_live()?;
        let mut g = inner.core.lock();
        match g.state {
            EpState::Disconnected | EpState::Unconnected => {
                let wrs: Vec<Wr> = {
                    let c = &mut *g;
                    c.state = EpState::Unconnected;
                    c.link = None;
                    c.remote = None;
                    c.peer_private = None;
                    let mut rq = inner.rq.lock();
                    rq.conn = 0;
                    rq.keys.clear();
                    // Flushed, then open to receives again, in one hold of
                    // the posters' lock: a receive posted meanwhile is for
                    // the next connection, never flushed by this reset.
                    let recvs = {
                        let mut p = inner.posted.lock();
                        let recvs = rq.drain_all(&mut p);
                        p.refused = None;
                        recvs
                    };
                    inner.publish_taken(&rq);
                    c.sends
                        .drain(..)
                        .chain(recvs.into_iter().map(Wr::from))
                        .collect()
                };
                drop(g);
                for wr in wrs {
                    inner.complete(wr, DtoStatus::Flushed, 0);
                }
                Ok(())
            }
            s => {
                drop(g);
                Err(Error::state(
                    s.subtype(),
                    "reset needs a disconnected endpoint",
                ))
            }
        }
    }

    /// Frees the endpoint (`dat_ep_free`): an abrupt disconnect if needed,
    /// everything outstanding flushed, its EVDs released.
    pub fn free(&self) -> Result<()> {
        self.inner.check_live()?;
        {
            // As `dapl_ep_free`: an endpoint an RSP owns, or one a
            // connection request is being accepted on, is freed after that
            // is settled. The state is looked at and the endpoint marked
            // freed under one hold of its lock, under which an RSP's
            // creation, an accept and a connect look at `freed` before they
            // change the state: the two never both succeed.
            let c = self.inner.core.lock();
            let state = c.state;
            if matches!(
                state,
                EpState::Reserved
                    | EpState::TentativeConnectionPending
                    | EpState::PassiveConnectionPending
            ) {
                return Err(Error::state(
                    state.subtype(),
                    "free the RSP or settle the connection request first",
                ));
            }
            if self.inner.freed.swap(true, Ordering::SeqCst) {
                return Err(Error::InvalidHandle(Subtype::InvalidHandleEp));
            }
        }
        let ia = self.inner.ia.clone();
        self.inner.teardown(&ia);
        Ok(())
    }
}

impl EpInner {
    pub(crate) fn is_freed(&self) -> bool {
        self.freed.load(Ordering::SeqCst)
    }

    pub(crate) fn check_live(&self) -> Result<()> {
        if self.is_freed() {
            Err(Error::InvalidHandle(Subtype::InvalidHandleEp))
        } else {
            Ok(())
        }
    }

    /// Tears the endpoint down (free, or abrupt IA close).
    pub(crate) fn abort(self: &Arc<Self>, ia: &Arc<IaInner>) {
        if self.freed.swap(true, Ordering::SeqCst) {
            return;
        }
        self.teardown(ia);
    }

    /// [`EpInner::abort`] once `freed` is set (by this caller).
    fn teardown(self: &Arc<Self>, ia: &Arc<IaInner>) {
        let (cr, connecting) = {
            let mut c = self.core.lock();
            let connecting = c.state == EpState::ActiveConnectionPending;
            if connecting {
                // No longer connecting before the provider hears of the
                // free: a connect that fails on its thread meanwhile raises
                // nothing for the freed endpoint.
                self.set_state(&mut c, EpState::Disconnected);
            }
            (c.pending_cr.take(), connecting)
        };
        if let Some(cr) = cr {
            cr.cancel();
        }
        // The provider ends a connection (the peer is told), or drops an
        // attempt in progress.
        let connected = matches!(
            self.core.lock().state,
            EpState::Connected | EpState::DisconnectPending
        );
        self.ops.destroy(self);
        if connected {
            // A provider that ends it on its own thread, later, finds it
            // ended: the freed endpoint's own side ends here, now.
            self.ended(ConnectionEventKind::Disconnected);
        }
        if connecting {
            self.ops.connect_cancel(self);
        }
        // Refuse first, then flush (as a connection's end does): a receive
        // whose post passed the liveness check before `freed` was set is
        // then either queued before the flush (and flushed) or refused,
        // never queued behind the flush with its completion lost.
        // (Whatever the provider kept of a connection goes with it.)
        self.set_state(&mut self.core.lock(), EpState::Disconnected);
        #[cfg(any(test, feature = "test-hooks"))]
        if let Some(f) = test_hooks::ABORT_GAP.with(|h| h.borrow_mut().take()) {
            f();
        }
        self.flush_all();
        self.feeders.lock().clear();
        self.pz.inner.users.fetch_sub(1, Ordering::SeqCst);
        ia.live.eps.fetch_sub(1, Ordering::Relaxed);
        ia.eps.freed();
        if let Some(srq) = &self.srq {
            srq.inner.eps.freed();
        }
    }
}
