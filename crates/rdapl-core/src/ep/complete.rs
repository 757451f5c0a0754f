//! Completing work requests: the DAT completion-flag rules, local memory
//! operations, flushes, and the taking of receives by a peer's send.
//!
//! Every work request completes exactly once: with its status, flushed, or
//! (a suppressed or unsignalled success) silently released. Its completion
//! goes to the EVD its slot was reserved on at post time. The count of
//! receives taken is published before the receive queue's lock is released.

use super::{CompletionFlags, EpInner, LocalOp, RecvIov, RecvQueue, RecvWr, Wr, WrOp};
use crate::buf::Buf;
use crate::evd::{EvdProducer, Reservation};
use crate::event::{DtoCompletion, DtoOp, DtoStatus, Event};
use crate::mem::MemPriv;
use std::sync::atomic::Ordering;

impl EpInner {
    /// Completes a work request with `status` and `len` bytes transferred
    /// (exactly once: it is consumed). The DAT completion-flag rules apply
    /// here (a suppressed success is released, not queued).
    #[inline]
    pub fn complete(&self, wr: Wr, status: DtoStatus, len: u64) {
        let is_recv = matches!(wr.op, WrOp::Recv);
        let op = wr.op.dto_op();
        self.complete_parts(
            is_recv, op, wr.cookie, wr.flags, wr.res, status, len, wr.buf,
        );
    }

    /// Completes a receive with `status` and `len` bytes transferred, as
    /// [`EpInner::complete`] does.
    #[inline]
    pub fn complete_recv(&self, r: RecvWr, status: DtoStatus, len: u64) {
        self.complete_parts(
            true,
            DtoOp::Receive,
            r.cookie,
            r.flags,
            r.res,
            status,
            len,
            r.buf,
        );
    }

    /// Completes a receive filled by a Send with Invalidate that
    /// invalidated `rmr_context` ([`EpInner::invalidate_remote`]): a
    /// success of `len` bytes, reported as `ReceiveWithInvalidate` naming
    /// the key.
    pub fn complete_recv_invalidated(&self, r: RecvWr, len: u64, rmr_context: u32) {
        self.complete_parts_ctx(
            true,
            DtoOp::ReceiveWithInvalidate,
            (r.cookie, r.flags, r.res),
            DtoStatus::Success,
            len,
            r.buf,
            rmr_context,
        );
    }

    /// Invalidates `rmr_context` of this endpoint's protection zone for
    /// the peer's Send with Invalidate (see
    /// [`Ep::post_send_with_invalidate`](super::Ep::post_send_with_invalidate)).
    /// Refused, changing nothing, if the key names nothing live of this
    /// zone or a plain LMR.
    pub fn invalidate_remote(
        &self,
        rmr_context: u32,
    ) -> std::result::Result<(), crate::mem::RemoteInvalidate> {
        self.ia.mem.invalidate_remote(rmr_context, self.pz.inner.id)
    }

    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(crate) fn complete_parts(
        &self,
        is_recv: bool,
        op: DtoOp,
        cookie: u64,
        f: CompletionFlags,
        res: Reservation,
        status: DtoStatus,
        len: u64,
        buf: Option<Buf>,
    ) {
        self.complete_parts_ctx(is_recv, op, (cookie, f, res), status, len, buf, 0);
    }

    /// [`EpInner::complete_parts`] with the event's `rmr_context`.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn complete_parts_ctx(
        &self,
        is_recv: bool,
        op: DtoOp,
        (cookie, f, res): (u64, CompletionFlags, Reservation),
        status: DtoStatus,
        len: u64,
        buf: Option<Buf>,
        rmr_context: u32,
    ) {
        let evd = if is_recv {
            self.recv_evd.as_ref()
        } else {
            self.requests.fetch_sub(1, Ordering::Release);
            self.request_evd.as_ref()
        };
        let Some(evd) = evd else { return };
        let mut notify = true;
        if status.is_success() {
            if is_recv {
                // Receives: SUPPRESS drops a success; UNSIGNALLED, and
                // SOLICITED_WAIT filled by an unsolicited send, queue it
                // without notification.
                // (Never with a buffer: it would be lost. Its post refuses
                // SUPPRESS; this only makes sure.)
                if f.contains(CompletionFlags::SUPPRESS) && buf.is_none() {
                    let _ = evd.release(res); // reserved on this EVD
                    return;
                }
                notify = !(f.contains(CompletionFlags::UNSIGNALLED)
                    || (f.contains(CompletionFlags::SOLICITED_WAIT)
                        && !f.contains(CompletionFlags::SOLICITED_ARRIVAL)));
            } else if f.quiet_on_success() && buf.is_none() {
                let _ = evd.release(res); // reserved on this EVD
                return;
            }
        }
        let ev = Event::Dto(DtoCompletion {
            ep: self.id,
            consumer_context: self.context.get(),
            cookie,
            status,
            transferred_length: if status.is_success() { len } else { 0 },
            operation: op,
            rmr_context,
            buf,
        });
        // The reservation was made on this very EVD at post time.
        let done = if notify {
            evd.complete(res, ev)
        } else {
            evd.complete_unsignalled(res, ev)
        };
        debug_assert!(done.is_ok(), "{done:?}");
    }

    /// Executes a local memory work request (bind, map, invalidate) and
    /// completes it; returns its status.
    pub fn execute_local(&self, wr: Wr) -> DtoStatus {
        let mem = &self.ia.mem;
        let WrOp::Local(l) = &wr.op else {
            return self.finish(wr, DtoStatus::LocalEp);
        };
        let status = match &**l {
            LocalOp::Bind { target: None, .. } => DtoStatus::Success,
            LocalOp::Bind {
                target: Some((lctx, t)),
                privs,
                new_ctx,
                ..
            } => {
                if mem.bind_window(*lctx, *new_ctx, t.virtual_address, t.segment_length, *privs) {
                    DtoStatus::Success
                } else {
                    DtoStatus::RmrOperationFailed
                }
            }
            LocalOp::Fmr {
                lmr,
                region,
                privs,
                new_ctx,
            } => {
                let mapping = (Some(region.clone()), *privs);
                let map = || mem.map_fmr(*new_ctx, region, *privs).then_some(*new_ctx);
                if lmr.change_mapping(None, mapping, map).is_some() {
                    DtoStatus::Success
                } else {
                    DtoStatus::LocalMmError
                }
            }
            LocalOp::Invalidate { lmr, new_ctx } => {
                let done = lmr.change_mapping(None, (None, MemPriv::NONE), || {
                    mem.set_key(*new_ctx, |e| {
                        e.region = None;
                        e.privs = MemPriv::NONE;
                    })
                    .then_some(*new_ctx)
                });
                if done.is_some() {
                    DtoStatus::Success
                } else {
                    DtoStatus::LocalMmError
                }
            }
        };
        self.finish(wr, status)
    }

    fn finish(&self, wr: Wr, status: DtoStatus) -> DtoStatus {
        self.complete(wr, status, 0);
        status
    }

    /// Flushes every outstanding work request of this endpoint.
    pub fn flush_all(&self) {
        let wrs: Vec<Wr> = {
            let mut g = self.core.lock();
            let c = &mut *g;
            let mut rq = self.rq.lock();
            let recvs = rq.drain_all(&mut self.posted.lock());
            self.publish_taken(&rq);
            c.sends
                .drain(..)
                .chain(recvs.into_iter().map(Wr::from))
                .collect()
        };
        for wr in wrs {
            self.complete(wr, DtoStatus::Flushed, 0);
        }
    }

    /// The receive a send to this endpoint lands in (its receive queue
    /// locked: `rq`, refilled): its own queue's head, or one of its SRQ
    /// (reserving the completion on the receive EVD now; if that EVD is
    /// full the receive stays posted, as if there were none).
    pub fn take_recv_locked(&self, rq: &mut RecvQueue) -> Option<RecvWr> {
        let Some(srq) = &self.srq else {
            return rq.pop();
        };
        let evd = self.recv_evd.as_ref()?;
        let wr = {
            let mut q = srq.inner.recvs.lock();
            if q.is_empty() {
                return None;
            }
            // (No refusal's pause under the SRQ's lock.)
            let res = evd.reserve_now().ok()?;
            let s = q.pop_front().expect("non-empty");
            RecvWr {
                iov: RecvIov::from_slice(&s.iov),
                cookie: s.cookie,
                flags: s.flags,
                res,
                buf: None,
            }
        };
        srq.inner.check_watermark();
        Some(wr)
    }

    /// Publishes the receive queue's count of receives taken for good (its
    /// lock held: `rq`) to posters; called before that lock is released
    /// wherever the count changed, so the published count never counts a
    /// receive that is put back.
    #[inline]
    pub fn publish_taken(&self, rq: &RecvQueue) {
        self.publish_taken_count(rq.taken);
    }

    /// [`EpInner::publish_taken`] of the count `taken` (read under the
    /// receive queue's lock).
    #[inline]
    pub fn publish_taken_count(&self, taken: u64) {
        self.taken.store(taken, Ordering::Release);
    }

    /// Receives posted and not yet taken by a send, flushed or reset.
    pub(super) fn outstanding_recvs(&self) -> usize {
        // Both locks at once (in order): no receive is counted twice or
        // missed while it moves over.
        let rq = self.rq.lock();
        let posted = self.posted.lock();
        rq.recvs.len() + posted.recvs.len()
    }
}
