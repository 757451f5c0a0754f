//! Work requests: what a post hands the transport ([`NewWr`]), what waits
//! in a queue ([`Wr`], [`RecvWr`]), and the [`Request`] trait a transport
//! executes either through.
//!
//! A request owns its completion's reservation, so it completes exactly
//! once. A queued receive is one cache line ([`RecvWr`], checked at compile
//! time). The rare memory operations are boxed to keep requests small.

use super::{CompletionFlags, EpInner};
use crate::buf::Buf;
use crate::evd::Reservation;
use crate::event::{DtoOp, DtoStatus};
use crate::mem::{LmrTriplet, MemPriv, Region, RmrTriplet};
use crate::pz::Lmr;
use std::sync::Arc;

/// What a work request does. Small (the common requests are moved through
/// queues on the data path); the rare memory operations are boxed.
pub enum WrOp {
    /// A send.
    Send,
    /// A send that also invalidates the peer's key (RDMAP Send with
    /// Invalidate).
    SendInvalidate(u32),
    /// A receive.
    Recv,
    /// An RDMA write to the peer's memory.
    RdmaWrite(RmrTriplet),
    /// An RDMA read of the peer's memory.
    RdmaRead(RmrTriplet),
    /// A bind, fast-register map or invalidate.
    Local(Box<LocalOp>),
}

/// A work request that changes memory registrations (executed in order with
/// the endpoint's other requests).
pub enum LocalOp {
    /// Bind (or unbind, `len == 0`) a window; `new_ctx` is its next key.
    Bind {
        /// The window's LMR key and the triplet it binds (`None`: unbind).
        target: Option<(u32, LmrTriplet)>,
        /// The rights granted.
        privs: MemPriv,
        /// The window's next key.
        new_ctx: u32,
    },
    /// Map a fast-registration LMR onto a region.
    Fmr {
        /// The fast-registration LMR.
        lmr: Lmr,
        /// The region it maps.
        region: Arc<Region>,
        /// The rights granted.
        privs: MemPriv,
        /// The LMR's next key.
        new_ctx: u32,
    },
    /// Invalidate a fast-registration LMR: at execution its key becomes
    /// `new_ctx` (reserved at post time) and its mapping goes.
    Invalidate {
        /// The fast-registration LMR.
        lmr: Lmr,
        /// The LMR's next key.
        new_ctx: u32,
    },
}

impl WrOp {
    pub(super) fn dto_op(&self) -> DtoOp {
        match self {
            WrOp::Send | WrOp::SendInvalidate(_) => DtoOp::Send,
            WrOp::Recv => DtoOp::Receive,
            WrOp::RdmaWrite(_) => DtoOp::RdmaWrite,
            WrOp::RdmaRead(_) => DtoOp::RdmaRead,
            WrOp::Local(l) => match **l {
                LocalOp::Bind { .. } => DtoOp::BindMw,
                LocalOp::Fmr { .. } => DtoOp::LmrFmr,
                LocalOp::Invalidate { .. } => DtoOp::LmrInvalidate,
            },
        }
    }

    /// Sets the key a local memory operation gives its object.
    pub(super) fn set_new_ctx(&mut self, ctx: u32) {
        if let WrOp::Local(l) = self {
            match &mut **l {
                LocalOp::Bind { new_ctx, .. }
                | LocalOp::Fmr { new_ctx, .. }
                | LocalOp::Invalidate { new_ctx, .. } => *new_ctx = ctx,
            }
        }
    }
}

/// A posted work request. A provider reads it through its methods (the
/// provider's view); an in-process provider (see [`crate::provider::soft`])
/// may read its fields.
pub struct Wr {
    /// What it does.
    pub op: WrOp,
    /// Its scatter/gather list (empty for an owned buffer's request).
    pub iov: crate::mem::Iov,
    pub(crate) cookie: u64,
    pub(crate) flags: CompletionFlags,
    pub(crate) res: Reservation,
    /// An owned buffer (`post_send_buf`, or a receive's): the request's
    /// data instead of `iov` (its first `buf_len` bytes), handed back with
    /// the completion.
    pub(crate) buf: Option<Buf>,
    /// The bytes of `buf` a send carries.
    pub(crate) buf_len: usize,
}

/// The scatter/gather list of a queued receive (one entry inline).
pub type RecvIov = smallvec::SmallVec<[LmrTriplet; 1]>;

/// A posted receive as queued: one cache line, aligned (a sender on
/// another core reads exactly one line of it).
#[repr(align(64))]
pub struct RecvWr {
    /// Its scatter/gather list (empty for an owned buffer's receive).
    pub iov: RecvIov,
    /// Its cookie.
    pub cookie: u64,
    /// Its completion flags.
    pub flags: CompletionFlags,
    /// Its completion's reservation on the receive EVD.
    pub res: Reservation,
    /// An owned buffer (`post_recv_buf`) to receive into instead of `iov`
    /// (then empty), handed back with the completion.
    pub buf: Option<Buf>,
}

const _: () = assert!(std::mem::size_of::<RecvWr>() == 64);

impl From<RecvWr> for Wr {
    fn from(r: RecvWr) -> Wr {
        Wr {
            op: WrOp::Recv,
            iov: crate::mem::Iov::from_slice(&r.iov),
            cookie: r.cookie,
            flags: r.flags,
            res: r.res,
            buf: r.buf,
            // (Only a send carries bytes of its buffer.)
            buf_len: 0,
        }
    }
}

/// A request (not a receive) being posted, every check passed and its
/// completion reserved, handed to the transport under the endpoint's lock
/// (read through its methods, or its fields by an in-process provider).
/// Its scatter/gather list is still the
/// caller's: a request that completes at once is never copied into a
/// [`Wr`]; one that waits is copied into one and queued.
pub struct NewWr<'a> {
    /// What it does.
    pub op: WrOp,
    /// Its scatter/gather list, still the caller's.
    pub iov: &'a [LmrTriplet],
    pub(crate) cookie: u64,
    pub(crate) flags: CompletionFlags,
    pub(crate) res: Reservation,
    /// An owned buffer to send from instead of `iov` (see [`Wr::buf`]).
    pub(crate) buf: Option<Buf>,
    /// The bytes of `buf` the send carries.
    pub(crate) buf_len: usize,
}

impl NewWr<'_> {
    /// The request as queued.
    pub(crate) fn into_wr(self) -> Wr {
        Wr {
            op: self.op,
            iov: crate::mem::Iov::from_slice(self.iov),
            cookie: self.cookie,
            flags: self.flags,
            res: self.res,
            buf: self.buf,
            buf_len: self.buf_len,
        }
    }
}

/// A send or RDMA request as a transport executes it: queued ([`Wr`]) or
/// being posted ([`NewWr`]).
pub trait Request {
    /// Its scatter/gather list (empty for an owned buffer's request).
    fn iov(&self) -> &[LmrTriplet];
    /// The bytes it sends from its owned buffer, if it has one.
    fn src_buf(&self) -> Option<&[u8]>;
    /// Its completion flags.
    fn flags(&self) -> CompletionFlags;
    /// The peer's key it invalidates (a Send with Invalidate).
    fn invalidates(&self) -> Option<u32>;
    /// Completes it on `ep` with `status` and `len` bytes transferred.
    fn complete(self, ep: &EpInner, status: DtoStatus, len: u64);
}

impl Request for Wr {
    #[inline]
    fn iov(&self) -> &[LmrTriplet] {
        &self.iov
    }
    #[inline]
    fn src_buf(&self) -> Option<&[u8]> {
        self.buf.as_ref().map(|b| &b[..self.buf_len])
    }
    #[inline]
    fn flags(&self) -> CompletionFlags {
        self.flags
    }
    #[inline]
    fn invalidates(&self) -> Option<u32> {
        match self.op {
            WrOp::SendInvalidate(k) => Some(k),
            _ => None,
        }
    }
    #[inline]
    fn complete(self, ep: &EpInner, status: DtoStatus, len: u64) {
        ep.complete(self, status, len);
    }
}

impl Request for NewWr<'_> {
    #[inline]
    fn iov(&self) -> &[LmrTriplet] {
        self.iov
    }
    #[inline]
    fn src_buf(&self) -> Option<&[u8]> {
        self.buf.as_ref().map(|b| &b[..self.buf_len])
    }
    #[inline]
    fn flags(&self) -> CompletionFlags {
        self.flags
    }
    #[inline]
    fn invalidates(&self) -> Option<u32> {
        match self.op {
            WrOp::SendInvalidate(k) => Some(k),
            _ => None,
        }
    }
    #[inline]
    fn complete(self, ep: &EpInner, status: DtoStatus, len: u64) {
        let NewWr {
            op,
            cookie,
            flags,
            res,
            buf,
            ..
        } = self;
        let dto_op = op.dto_op();
        // Only a memory operation owns anything (checked here, inline: the
        // usual request needs no call to drop it).
        if let WrOp::Local(l) = op {
            drop(l);
        }
        ep.complete_parts(false, dto_op, cookie, flags, res, status, len, buf);
    }
}
