//! Posting several requests as one: [`Ep::post_batch`].
//!
//! Each request of a batch is checked and reserved exactly as its own
//! `Ep::post_*` call would be, and is refused or queued on its own; only
//! the provider's part is shared: it hears of the batch once, after the
//! last request, so a network provider can send the batch together (for
//! small messages, one system call and one TCP segment instead of one
//! each). This is what verbs' list of work requests and libfabric's
//! `FI_MORE` give; DAT's C API has no such call.
//!
//! Every kind of request a DAT endpoint takes goes in a batch: Sends (with
//! or without invalidation), RDMA Writes and Reads, window binds and
//! unbinds, fast-registration maps and invalidations. A storage target's
//! "register, then tell the peer" is one batch: the map or bind and the
//! Send that carries its key.
//!
//! Guarantees: the requests are queued in the order posted, as separate
//! posts would be; whatever was queued is handed on when the batch ends,
//! also when the closure returns early, fails or panics.

use super::{Ep, WrOp};
use crate::CompletionFlags;
use crate::buf::{Buf, BufRefused};
use crate::error::Result;
use crate::mem::{LmrTriplet, MemPriv, Region, RmrTriplet};
use crate::pz::{Lmr, Rmr};
use std::cell::Cell;
use std::sync::Arc;

/// The requests of one [`Ep::post_batch`].
pub struct Batch<'a> {
    ep: &'a Ep,
    queued: Cell<usize>,
}

impl Batch<'_> {
    fn post(
        &self,
        op: WrOp,
        iov: &[LmrTriplet],
        cookie: u64,
        flags: CompletionFlags,
    ) -> Result<()> {
        self.counted(self.ep.inner.post_with::<true>(
            op,
            iov,
            (&mut None, 0),
            cookie,
            flags,
            |_| Ok(()),
        ))
    }

    /// Counts a request of the batch that was queued (`r` is `Ok`).
    fn counted<T, E>(&self, r: std::result::Result<T, E>) -> std::result::Result<T, E> {
        if r.is_ok() {
            self.queued.set(self.queued.get() + 1);
        }
        r
    }

    /// [`Ep::post_send`] within the batch.
    pub fn post_send(&self, iov: &[LmrTriplet], cookie: u64, flags: CompletionFlags) -> Result<()> {
        self.post(WrOp::Send, iov, cookie, flags)
    }

    /// [`Ep::post_send_buf`] within the batch (the buffer back in the
    /// error if refused).
    pub fn post_send_buf(
        &self,
        buf: Buf,
        len: usize,
        cookie: u64,
        flags: CompletionFlags,
    ) -> std::result::Result<(), BufRefused> {
        self.counted(self.ep.inner.post_send_buf::<true>(buf, len, cookie, flags))
    }

    /// [`Ep::post_rdma_write`] within the batch.
    pub fn post_rdma_write(
        &self,
        iov: &[LmrTriplet],
        remote: RmrTriplet,
        cookie: u64,
        flags: CompletionFlags,
    ) -> Result<()> {
        self.post(WrOp::RdmaWrite(remote), iov, cookie, flags)
    }

    /// [`Ep::post_rdma_read`] within the batch.
    pub fn post_rdma_read(
        &self,
        iov: &[LmrTriplet],
        remote: RmrTriplet,
        cookie: u64,
        flags: CompletionFlags,
    ) -> Result<()> {
        self.post(WrOp::RdmaRead(remote), iov, cookie, flags)
    }

    /// [`Ep::post_send_with_invalidate`] within the batch.
    pub fn post_send_with_invalidate(
        &self,
        iov: &[LmrTriplet],
        rmr_context: u32,
        cookie: u64,
        flags: CompletionFlags,
    ) -> Result<()> {
        self.post(WrOp::SendInvalidate(rmr_context), iov, cookie, flags)
    }

    /// [`Ep::post_rmr_bind`] within the batch: the window's new key, for
    /// a Send of the same batch to carry (it is valid for the peer once
    /// the bind executed, and the bind executes before anything posted
    /// after it).
    pub fn post_rmr_bind(
        &self,
        rmr: &Rmr,
        lmr: &Lmr,
        target: LmrTriplet,
        privs: MemPriv,
        cookie: u64,
        flags: CompletionFlags,
    ) -> Result<u32> {
        self.counted(
            self.ep
                .rmr_rebind::<true>(rmr, Some((lmr, target)), privs, cookie, flags),
        )
    }

    /// [`Ep::post_rmr_unbind`] within the batch.
    pub fn post_rmr_unbind(&self, rmr: &Rmr, cookie: u64, flags: CompletionFlags) -> Result<u32> {
        self.counted(
            self.ep
                .rmr_rebind::<true>(rmr, None, MemPriv::NONE, cookie, flags),
        )
    }

    /// [`Ep::post_lmr_fmr`] within the batch: the mapping's new key (as
    /// for [`Batch::post_rmr_bind`], a Send of the same batch may carry it).
    pub fn post_lmr_fmr(
        &self,
        lmr: &Lmr,
        region: Arc<Region>,
        privs: MemPriv,
        cookie: u64,
        flags: CompletionFlags,
    ) -> Result<u32> {
        self.counted(self.ep.lmr_fmr::<true>(lmr, region, privs, cookie, flags))
    }

    /// [`Ep::post_lmr_invalidate`] within the batch.
    pub fn post_lmr_invalidate(
        &self,
        lmr: &Lmr,
        cookie: u64,
        flags: CompletionFlags,
    ) -> Result<u32> {
        self.counted(self.ep.lmr_invalidate::<true>(lmr, cookie, flags))
    }

    /// Requests queued so far.
    pub fn len(&self) -> usize {
        self.queued.get()
    }

    /// True if nothing was queued yet.
    pub fn is_empty(&self) -> bool {
        self.queued.get() == 0
    }
}

impl Drop for Batch<'_> {
    /// The batch's end: the provider acts on what was queued.
    fn drop(&mut self) {
        if self.queued.get() > 0 {
            self.ep.inner.ops.kick(&self.ep.inner, false);
        }
    }
}

impl Ep {
    /// Posts the requests `f` makes as one batch (see the module docs of
    /// `ep::batch`): each is checked and refused as its own post would be,
    /// and the provider hears of them once, after `f` returns, so that a
    /// network provider sends them together.
    ///
    /// ```
    /// # use rdapl::*;
    /// # fn run(ep: &Ep, lmr: &Lmr) -> Result<()> {
    /// ep.post_batch(|b| {
    ///     for i in 0..4u64 {
    ///         b.post_send(&[lmr.triplet(i * 64, 64)?], i, CompletionFlags::DEFAULT)?;
    ///     }
    ///     Ok(())
    /// })
    /// # }
    /// ```
    pub fn post_batch<R>(&self, f: impl FnOnce(&Batch<'_>) -> R) -> R {
        let b = Batch {
            ep: self,
            queued: Cell::new(0),
        };
        f(&b)
    }
}
