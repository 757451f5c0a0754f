//! Posting work requests: the `Ep::post_*` calls and the checks they share.
//!
//! A post checks the endpoint's state, the flags, the scatter/gather and
//! size limits, and reserves the completion's slot on its EVD before the
//! work request exists. A request that could not complete is refused at
//! once, and changes nothing. Memory operations rotate their keys only
//! once the request is sure to be queued.

#[cfg(any(test, feature = "test-hooks"))]
use super::test_hooks;
use super::{
    CompletionFlags, Ep, EpInner, EpState, LocalOp, NewWr, RecvIov, RecvWr, WrOp, queue_full,
    refused_in,
};
use crate::buf::{Buf, BufRefused};
use crate::error::{Error, Result, Subtype};
use crate::evd::EvdProducer;
use crate::mem::{LmrTriplet, MemPriv, Region, RmrTriplet};
use crate::pz::{Lmr, Rmr};
use std::sync::Arc;
use std::sync::atomic::Ordering;

impl Ep {
    /// Posts a receive (`dat_ep_post_recv`). Allowed before the connection
    /// is established.
    pub fn post_recv(&self, iov: &[LmrTriplet], cookie: u64, flags: CompletionFlags) -> Result<()> {
        self.inner.post_recv(iov, &mut None, cookie, flags)
    }

    /// Posts a receive into an owned buffer (see [`crate::buf`]): the
    /// buffer is the request's until its completion, which hands it back
    /// in [`DtoCompletion::buf`](crate::DtoCompletion::buf) (whatever the
    /// status), with the message in its first `transferred_length` bytes.
    /// Refused (the buffer back in the error) where [`Ep::post_recv`] would
    /// be, and also for a buffer of another protection zone, with
    /// `SUPPRESS` (the completion is the buffer's way back), or on an
    /// endpoint that takes its receives from a shared receive queue.
    pub fn post_recv_buf(
        &self,
        buf: Buf,
        cookie: u64,
        flags: CompletionFlags,
    ) -> std::result::Result<(), BufRefused> {
        let mut buf = Some(buf);
        match self.inner.post_recv(&[], &mut buf, cookie, flags) {
            Ok(()) => Ok(()),
            Err(error) => Err(BufRefused {
                error,
                buf: buf.expect("a refused post keeps its buffer"),
            }),
        }
    }

    /// Posts a send of the first `len` bytes of an owned buffer (see
    /// [`crate::buf`]): the buffer is the request's until its completion,
    /// which hands it back in [`DtoCompletion::buf`](crate::DtoCompletion::buf)
    /// whatever the status. Refused (the buffer back in the error) where
    /// [`Ep::post_send`] would be, and also for a buffer of another
    /// protection zone, `len` beyond the buffer, or with `SUPPRESS` or
    /// `UNSIGNALLED` (the completion is the buffer's way back).
    pub fn post_send_buf(
        &self,
        buf: Buf,
        len: usize,
        cookie: u64,
        flags: CompletionFlags,
    ) -> std::result::Result<(), BufRefused> {
        self.inner.post_send_buf::<false>(buf, len, cookie, flags)
    }

    /// Posts a send (`dat_ep_post_send`).
    pub fn post_send(&self, iov: &[LmrTriplet], cookie: u64, flags: CompletionFlags) -> Result<()> {
        self.inner.post(WrOp::Send, iov, cookie, flags)
    }

    /// Posts a send of `iov` that also invalidates `rmr_context` at the
    /// peer (`dat_ep_post_send_with_invalidate`; RDMAP's Send with
    /// Invalidate). When the message lands, the peer's window (or
    /// fast-registration LMR) of that key is unbound, so the key grants
    /// nothing from then on, and the receive completes as
    /// `ReceiveWithInvalidate` naming the key. A key that names nothing
    /// live of the peer endpoint's protection zone, or a plain LMR,
    /// moves no byte: `RemoteAccess` here, and the connection breaks.
    pub fn post_send_with_invalidate(
        &self,
        iov: &[LmrTriplet],
        rmr_context: u32,
        cookie: u64,
        flags: CompletionFlags,
    ) -> Result<()> {
        self.inner
            .post(WrOp::SendInvalidate(rmr_context), iov, cookie, flags)
    }

    /// Posts an RDMA write of `iov` to `remote` (`dat_ep_post_rdma_write`).
    /// A write of zero bytes moves nothing and, as on InfiniBand and iWARP,
    /// is not checked against the remote key (see the loopback provider's
    /// module docs, crate `rdapl-loopback`).
    pub fn post_rdma_write(
        &self,
        iov: &[LmrTriplet],
        remote: RmrTriplet,
        cookie: u64,
        flags: CompletionFlags,
    ) -> Result<()> {
        self.inner.post(WrOp::RdmaWrite(remote), iov, cookie, flags)
    }

    /// Posts an RDMA read of `remote` into `iov` (`dat_ep_post_rdma_read`).
    /// A read of zero bytes is treated as a write of zero bytes.
    pub fn post_rdma_read(
        &self,
        iov: &[LmrTriplet],
        remote: RmrTriplet,
        cookie: u64,
        flags: CompletionFlags,
    ) -> Result<()> {
        self.inner.post(WrOp::RdmaRead(remote), iov, cookie, flags)
    }

    /// Binds `rmr` to `target` (a range of `lmr`) with remote rights
    /// `privs` (`dat_rmr_bind`). Returns the window's new `rmr_context`,
    /// valid once the bind completes (a `BindMw` DTO on the request EVD);
    /// the previous context dies at once.
    pub fn post_rmr_bind(
        &self,
        rmr: &Rmr,
        lmr: &Lmr,
        target: LmrTriplet,
        privs: MemPriv,
        cookie: u64,
        flags: CompletionFlags,
    ) -> Result<u32> {
        self.rmr_rebind::<false>(rmr, Some((lmr, target)), privs, cookie, flags)
    }

    /// Unbinds `rmr` (a bind of length zero). Returns its new context.
    pub fn post_rmr_unbind(&self, rmr: &Rmr, cookie: u64, flags: CompletionFlags) -> Result<u32> {
        self.rmr_rebind::<false>(rmr, None, MemPriv::NONE, cookie, flags)
    }

    /// A bind (`target`) or unbind (`None`) of `rmr` (`MORE`: in a batch,
    /// with more to follow).
    pub(super) fn rmr_rebind<const MORE: bool>(
        &self,
        rmr: &Rmr,
        target: Option<(&Lmr, LmrTriplet)>,
        privs: MemPriv,
        cookie: u64,
        flags: CompletionFlags,
    ) -> Result<u32> {
        let inner = &self.inner;
        let mem = &inner.ia.mem;
        let old = rmr.context()?;
        if !Arc::ptr_eq(&rmr.inner.pz.inner, &inner.pz.inner) {
            return Err(Error::ProtectionViolation(Subtype::NoSubtype));
        }
        if privs.contains(MemPriv::LOCAL_READ) || privs.contains(MemPriv::LOCAL_WRITE) {
            return Err(Error::param(4, "a window grants remote rights only"));
        }
        let target = match target {
            Some((lmr, t)) => {
                // Of this endpoint's zone (so of its IA) before its
                // context is looked up: another IA's context is a key of
                // another table, which may name a registration of this one.
                if !Arc::ptr_eq(&lmr.inner.pz.inner, &inner.pz.inner) {
                    return Err(Error::ProtectionViolation(Subtype::NoSubtype));
                }
                let lctx = lmr.context()?;
                if lctx != t.lmr_context {
                    return Err(Error::param(2, "the triplet does not name this LMR"));
                }
                let e = mem
                    .get(lctx)
                    .ok_or(Error::InvalidHandle(Subtype::InvalidHandleLmr))?;
                if e.pz != inner.pz.inner.id {
                    return Err(Error::ProtectionViolation(Subtype::NoSubtype));
                }
                if !crate::mem::within(e.start, e.len, t.virtual_address, t.segment_length) {
                    return Err(Error::param(2, "the window range is outside the LMR"));
                }
                if !e.privs.contains(privs) {
                    return Err(Error::PrivilegesViolation(Subtype::NoSubtype));
                }
                Some((lctx, t))
            }
            None => None,
        };
        let op = WrOp::Local(Box::new(LocalOp::Bind {
            target,
            privs,
            new_ctx: 0,
        }));
        let mut new_ctx = 0;
        // Rotate the key once the request is sure to be queued (a refused
        // bind leaves the window as it was): the old context is dead from
        // here on; the new one is unbound until the work request executes.
        inner.post_with::<MORE>(op, &[], (&mut None, 0), cookie, flags, |op| {
            // The new key is unbound; the old binding is released (the LMR
            // it was bound to no longer counts it) under the table's lock.
            // Under the window's lock, as its free: a free on another
            // thread sees the old key or the new one, never a key this
            // rekey just replaced (it would leave the window alive).
            let mut slot = rmr.inner.ctx.lock();
            if *slot != Some(old) {
                return Err(Error::InvalidHandle(Subtype::InvalidHandleRmr));
            }
            let ctx = mem
                .rekey(old, |_| {})
                .ok_or(Error::InvalidHandle(Subtype::InvalidHandleRmr))?;
            *slot = Some(ctx);
            drop(slot);
            op.set_new_ctx(ctx);
            new_ctx = ctx;
            Ok(())
        })?;
        Ok(new_ctx)
    }

    /// Maps the fast-registration `lmr` onto `region` with `privs` by a work
    /// request (DAT 2.0 `dat_lmr_kcreate` FMR style). Returns the new
    /// context, valid once the `LmrFmr` DTO completes. The previous mapping
    /// and its key die at once, and every window bound to it is unbound.
    pub fn post_lmr_fmr(
        &self,
        lmr: &Lmr,
        region: Arc<Region>,
        privs: MemPriv,
        cookie: u64,
        flags: CompletionFlags,
    ) -> Result<u32> {
        self.lmr_fmr::<false>(lmr, region, privs, cookie, flags)
    }

    /// [`Ep::post_lmr_fmr`] (`MORE`: in a batch, with more to follow).
    pub(super) fn lmr_fmr<const MORE: bool>(
        &self,
        lmr: &Lmr,
        region: Arc<Region>,
        privs: MemPriv,
        cookie: u64,
        flags: CompletionFlags,
    ) -> Result<u32> {
        let inner = &self.inner;
        if lmr.inner.kind != crate::mem::EntryKind::Fmr {
            return Err(Error::param(1, "not a fast-registration LMR"));
        }
        if !Arc::ptr_eq(&lmr.inner.pz.inner, &inner.pz.inner) {
            return Err(Error::ProtectionViolation(Subtype::NoSubtype));
        }
        let old = lmr.context()?;
        inner
            .ia
            .mem
            .get(old)
            .ok_or(Error::InvalidHandle(Subtype::InvalidHandleLmr))?;
        // The entry's length is the current mapping's; the maximum is fixed
        // at creation.
        if region.len() as u64 > lmr.inner.max_len {
            return Err(Error::Length("region larger than the FMR's maximum"));
        }
        let op = WrOp::Local(Box::new(LocalOp::Fmr {
            lmr: lmr.clone(),
            region,
            privs,
            new_ctx: 0,
        }));
        let mut new_ctx = 0;
        inner.post_with::<MORE>(op, &[], (&mut None, 0), cookie, flags, |op| {
            let ctx = self.fmr_rekey(lmr, old)?;
            op.set_new_ctx(ctx);
            new_ctx = ctx;
            Ok(())
        })?;
        Ok(new_ctx)
    }

    /// Invalidates the fast-registration `lmr` by a work request
    /// (`dat_lmr_invalidate`): when the `LmrInvalidate` DTO executes (after
    /// every request posted before it) the mapping goes and the key changes
    /// to the returned (unmapped) context; the old key is then dead,
    /// and so is every window bound to the mapping (they are unbound).
    pub fn post_lmr_invalidate(
        &self,
        lmr: &Lmr,
        cookie: u64,
        flags: CompletionFlags,
    ) -> Result<u32> {
        self.lmr_invalidate::<false>(lmr, cookie, flags)
    }

    /// [`Ep::post_lmr_invalidate`] (`MORE`: in a batch, with more to
    /// follow).
    pub(super) fn lmr_invalidate<const MORE: bool>(
        &self,
        lmr: &Lmr,
        cookie: u64,
        flags: CompletionFlags,
    ) -> Result<u32> {
        if lmr.inner.kind != crate::mem::EntryKind::Fmr {
            return Err(Error::param(1, "not a fast-registration LMR"));
        }
        if !Arc::ptr_eq(&lmr.inner.pz.inner, &self.inner.pz.inner) {
            return Err(Error::ProtectionViolation(Subtype::NoSubtype));
        }
        let old = lmr.context()?;
        let op = WrOp::Local(Box::new(LocalOp::Invalidate {
            lmr: lmr.clone(),
            new_ctx: 0,
        }));
        let mut new_ctx = 0;
        self.inner
            .post_with::<MORE>(op, &[], (&mut None, 0), cookie, flags, |op| {
                // Reserve the next key now (it is returned), apply it when the
                // request executes: requests queued before the invalidate (a
                // map, a transfer) still see the current key.
                let k = self
                    .inner
                    .ia
                    .mem
                    .next_key(old)
                    .ok_or(Error::InvalidHandle(Subtype::InvalidHandleLmr))?;
                op.set_new_ctx(k);
                new_ctx = k;
                Ok(())
            })?;
        Ok(new_ctx)
    }

    fn fmr_rekey(&self, lmr: &Lmr, old: u32) -> Result<u32> {
        let mem = &self.inner.ia.mem;
        // The LMR's key changes with the table's, under the LMR's lock: a
        // free on another thread sees the old key or the new one.
        lmr.change_mapping(Some(old), (None, MemPriv::NONE), || {
            mem.rekey(old, |e| {
                e.region = None;
                e.privs = MemPriv::NONE;
            })
        })
        .ok_or(Error::InvalidHandle(Subtype::InvalidHandleLmr))
    }
}

impl EpInner {
    #[inline(always)]
    fn post(
        self: &Arc<Self>,
        op: WrOp,
        iov: &[LmrTriplet],
        cookie: u64,
        flags: CompletionFlags,
    ) -> Result<()> {
        self.post_with::<false>(op, iov, (&mut None, 0), cookie, flags, |_| Ok(()))
    }

    /// [`Ep::post_send_buf`] (`MORE`: in a batch, with more to follow).
    pub(super) fn post_send_buf<const MORE: bool>(
        self: &Arc<Self>,
        buf: Buf,
        len: usize,
        cookie: u64,
        flags: CompletionFlags,
    ) -> std::result::Result<(), BufRefused> {
        let mut buf = Some(buf);
        match self.post_with::<MORE>(WrOp::Send, &[], (&mut buf, len), cookie, flags, |_| Ok(())) {
            Ok(()) => Ok(()),
            Err(error) => Err(BufRefused {
                error,
                buf: buf.expect("a refused post keeps its buffer"),
            }),
        }
    }

    /// The checks of a post of an owned buffer (`len` bytes of it, for a
    /// send): of this endpoint's zone, not too long, and with a completion
    /// that is always delivered (the buffer comes back only with it).
    fn check_buf(&self, buf: &Buf, len: usize, flags: CompletionFlags, recv: bool) -> Result<()> {
        if buf.pz() != self.pz.inner.id {
            return Err(Error::ProtectionViolation(Subtype::NoSubtype));
        }
        let quiet = if recv {
            CompletionFlags::SUPPRESS
        } else {
            CompletionFlags::SUPPRESS | CompletionFlags::UNSIGNALLED
        };
        if flags.0 & quiet.0 != 0 {
            return Err(Error::param(
                4,
                "an owned buffer comes back with its completion: it cannot be suppressed",
            ));
        }
        if len > buf.len() {
            return Err(Error::param(2, "longer than the buffer"));
        }
        if len as u64 > self.attr.max_message_size {
            return Err(Error::Length("transfer larger than the endpoint's maximum"));
        }
        Ok(())
    }

    /// The first checks of a post: the endpoint is live, the flags known.
    #[inline]
    fn check_post(&self, flags: CompletionFlags) -> Result<()> {
        self.check_live()?;
        if flags.0 & !0x3F != 0 {
            return Err(Error::param(4, "unknown completion flag bits"));
        }
        Ok(())
    }

    /// The list checks of a post: within `max_iov` entries, its total
    /// within `limit`; returns that total.
    #[inline]
    fn check_list(iov: &[LmrTriplet], max_iov: usize, limit: u64) -> Result<u64> {
        if iov.len() > max_iov {
            return Err(Error::param(
                2,
                "more scatter/gather entries than the endpoint allows",
            ));
        }
        let len = crate::mem::list_len(iov, limit)
            .ok_or(Error::Length("transfer larger than the endpoint's maximum"))?;
        Ok(len)
    }

    /// Posts a receive: checked, its completion reserved and queued under
    /// the endpoint's lock (built in place, as queued), then the transport
    /// is kicked (a peer's send may wait for it).
    #[inline]
    fn post_recv(
        self: &Arc<Self>,
        iov: &[LmrTriplet],
        buf: &mut Option<Buf>,
        cookie: u64,
        flags: CompletionFlags,
    ) -> Result<()> {
        self.check_post(flags)?;
        let evd = match (&self.recv_evd, &self.srq) {
            (Some(evd), None) => evd,
            (_, Some(_)) => {
                return Err(Error::state(
                    Subtype::InvalidStateEpEvdRecv,
                    "the endpoint takes its receives from a shared receive queue",
                ));
            }
            (None, None) => {
                return Err(Error::state(
                    Subtype::InvalidStateEpEvdRecv,
                    "the endpoint has no EVD for this queue",
                ));
            }
        };
        Self::check_list(iov, self.attr.max_recv_iov, self.attr.max_message_size)?;
        if let Some(b) = buf {
            self.check_buf(b, b.len(), flags, true)?;
        }
        #[cfg(any(test, feature = "test-hooks"))]
        if let Some(f) = test_hooks::POST_RECV_GAP.with(|h| h.borrow_mut().take()) {
            f();
        }
        // The slot the receive will go to was last read by the peer's
        // sender: ask for it together with the lock's line.
        crate::evd::prefetch_write(self.recv_hint.load(Ordering::Relaxed) as *const u8);
        {
            // Under the posters' lock alone: a state change that refuses
            // receives is published here (`set_state`) before the flush
            // that follows it drains the queue (under this lock too), so a
            // receive is either queued before the state change (and
            // flushed) or refused.
            let mut p = self.posted.lock();
            if let Some(state) = p.refused {
                return Err(refused_in(state));
            }
            let max = self.attr.max_recv_dtos as u64;
            if p.total - p.taken_seen >= max {
                // Looks full with the count read last: read it again (the
                // published count never runs ahead of the queue, so a
                // receive is refused only if the queue was full at a moment
                // of this call).
                p.taken_seen = self.taken.load(Ordering::Acquire);
                if p.total - p.taken_seen >= max {
                    return Err(queue_full());
                }
            }
            let res = match evd.reserve_now() {
                Ok(r) => r,
                Err(e) => return crate::evd::refused_after(p, e),
            };
            p.recvs.push_back(RecvWr {
                iov: match iov {
                    [t] => RecvIov::from_buf([*t]),
                    // (An owned buffer's receive.)
                    [] => RecvIov::new(),
                    _ => RecvIov::from_slice(iov),
                },
                cookie,
                flags,
                res,
                buf: buf.take(),
            });
            p.total += 1;
            // The next receive probably goes just after this one.
            if let Some(last) = p.recvs.back() {
                let next = (last as *const RecvWr as usize) + std::mem::size_of::<RecvWr>();
                self.recv_hint.store(next, Ordering::Relaxed);
            }
        }
        self.ops.kick(self, true);
        Ok(())
    }

    /// `post` of a request, running `prepare` on the request under the
    /// endpoint's lock once every check passed and the completion's slot is
    /// reserved: its side effects happen only if the request is queued (if
    /// it fails, the reservation is returned and nothing is queued).
    /// `MORE`: a request of a batch with more to follow (the provider's
    /// `submit_more`).
    /// (Receives go through [`EpInner::post_recv`].) Inlined into each
    /// `Ep::post_*`: the operation is a constant there, and its checks fold.
    #[inline(always)]
    pub(super) fn post_with<const MORE: bool>(
        self: &Arc<Self>,
        mut op: WrOp,
        iov: &[LmrTriplet],
        (buf, buf_len): (&mut Option<Buf>, usize),
        cookie: u64,
        flags: CompletionFlags,
        prepare: impl FnOnce(&mut WrOp) -> Result<()>,
    ) -> Result<()> {
        if matches!(op, WrOp::Recv) {
            return self.post_recv(iov, buf, cookie, flags);
        }
        self.check_post(flags)?;
        if let Some(b) = buf {
            self.check_buf(b, buf_len, flags, false)?;
        }
        let evd = self.request_evd.as_ref().ok_or_else(|| {
            Error::state(
                Subtype::InvalidStateEpEvdRequest,
                "the endpoint has no EVD for this queue",
            )
        })?;
        let limit = match op {
            WrOp::RdmaWrite(_) | WrOp::RdmaRead(_) => self.attr.max_rdma_size,
            _ => self.attr.max_message_size,
        };
        let len = Self::check_list(iov, self.attr.max_request_iov, limit)?;
        if let WrOp::RdmaWrite(r) | WrOp::RdmaRead(r) = &op
            && r.segment_length < len
        {
            return Err(Error::Length("remote buffer shorter than the local list"));
        }
        let c = self.core.lock();
        if c.state != EpState::Connected {
            return Err(refused_in(c.state));
        }
        if self.requests.load(Ordering::Acquire) >= self.attr.max_request_dtos {
            return Err(queue_full());
        }
        let res = match evd.reserve_now() {
            Ok(r) => r,
            Err(e) => return crate::evd::refused_after(c, e),
        };
        if let Err(e) = prepare(&mut op) {
            let _ = evd.release(res); // reserved on this EVD
            return Err(e);
        }
        let wr = NewWr {
            op,
            iov,
            cookie,
            flags,
            res,
            buf: buf.take(),
            buf_len,
        };
        // Counted before the transport sees it (it may complete it at once).
        self.requests.fetch_add(1, Ordering::Relaxed);
        // The transport executes or queues it and goes on under the same
        // lock.
        if MORE {
            self.ops.submit_more(self, c, wr);
        } else {
            self.ops.submit(self, c, wr);
        }
        Ok(())
    }
}
