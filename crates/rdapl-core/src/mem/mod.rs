//! Registered memory: protection-checked regions, keys, and the one copy that
//! moves data between them.
//!
//! # Guarantees
//!
//! * **Dead keys are refused, and nothing runs out.** A key (`lmr_context`
//!   / `rmr_context`) is a 24-bit slot index and an 8-bit key byte, as an
//!   iWARP STag or an InfiniBand key. Freeing, invalidating, re-binding or
//!   re-mapping an entry rotates its key byte, and the old key is refused
//!   from then on, until its slot has handed out 256 more keys: a window
//!   re-bound or a fast registration re-mapped in place meets an old key
//!   again after 256 changes (as on hardware, whose consumer key is 8
//!   bits); a freed entry's slot is reused oldest first and only while
//!   more than 64 are free, so its key comes back after at least 16,384
//!   registrations. An IA registers, re-maps and re-binds for as long as
//!   it lives; its table is as large as its most registrations at once,
//!   plus those 64.
//! * **No access outside the grant.** Every access is checked against the
//!   entry's protection zone, its range and its rights before a byte moves;
//!   a refused access moves nothing. A segment of zero bytes names no
//!   memory and is not resolved (see the loopback provider on zero-length
//!   RDMA).
//! * **A window lasts no longer than its LMR's mapping.** A window (RMR)
//!   is bound to the mapping its LMR has at the bind. When that LMR is
//!   invalidated, re-mapped, freed or retired, every
//!   window bound to it is unbound in the same table change: its key grants
//!   nothing from then on. Binding, unbinding and freeing a window keep its
//!   LMR's count of bound windows exact on every path, failures included.
//! * **Safe memory.** Region memory sits behind a read/write lock; the data
//!   mover takes read locks on sources and write locks on sinks in a fixed
//!   order, so concurrent transfers neither race nor deadlock. Memory comes
//!   in three forms:
//!   - *owned* by rdapl ([`Region::from_vec`], [`Region::zeroed`]): a
//!     `Box<[u8]>` that lives as long as the region;
//!   - *borrowed* from the caller for a scope ([`crate::pz::lmr_scope`],
//!     [`Pz::lmr_create_borrowed`](crate::pz::Pz::lmr_create_borrowed)):
//!     the [`BorrowedLmr`](crate::pz::BorrowedLmr) holds the caller's
//!     `&mut [u8]`, so the caller cannot touch the buffer while it is
//!     registered, and the registration is retired (below) when the
//!     `BorrowedLmr` is dropped or released, and in any case (even if it was
//!     leaked) before the scope returns;
//!   - *raw* caller-owned memory for the C ABI, registered through the one
//!     `unsafe` constructor, [`Region::from_raw`], whose caller keeps the
//!     memory valid until the region is retired.
//! * **Retired memory is never touched again.** [`Region::retire`] marks a
//!   region dead under its write lock, so it first waits for any copy in
//!   progress to finish. Every access to region memory takes the region's
//!   lock and checks the mark under it: a key resolved before the
//!   retirement whose transfer runs after it moves no byte and fails
//!   (`LocalProtection` for a local buffer, `RemoteAccess` for a remote one,
//!   breaking the connection like any DTO error); resolving a key to a
//!   retired region is refused; [`Region::read`] and [`Region::write`]
//!   panic ([`Region::try_read`] and [`Region::try_write`] return `None`).
//!   So once `retire` returns, rdapl never reads or writes that memory
//!   again, and borrowed memory can go back to its owner.

mod cache;
mod copy;
mod region;
mod resolve;
mod table;
#[cfg(test)]
mod tests;

pub use cache::KeyCache;
pub use copy::{
    Iov, Retired, Span, SpanRef, SpanRefs, Spans, copy_from_buf, copy_into_buf, copy_one,
    copy_refs, total,
};
pub(crate) use region::can_allocate;
pub use region::{Region, RegionRead, RegionWrite};
pub use resolve::AccessError;
pub use table::{MemTable, RemoteInvalidate};

pub(crate) use copy::{append_spans, lend_span, list_len};
pub(crate) use table::{Entry, EntryKind, within};

use std::fmt;

/// `DAT_MEM_PRIV_FLAGS`: access rights of a registration.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Default)]
pub struct MemPriv(u32);

impl MemPriv {
    /// `DAT_MEM_PRIV_NONE_FLAG`.
    pub const NONE: MemPriv = MemPriv(0x00);
    /// `DAT_MEM_PRIV_LOCAL_READ_FLAG`.
    pub const LOCAL_READ: MemPriv = MemPriv(0x01);
    /// `DAT_MEM_PRIV_REMOTE_READ_FLAG`.
    pub const REMOTE_READ: MemPriv = MemPriv(0x02);
    /// `DAT_MEM_PRIV_LOCAL_WRITE_FLAG`.
    pub const LOCAL_WRITE: MemPriv = MemPriv(0x10);
    /// `DAT_MEM_PRIV_REMOTE_WRITE_FLAG`.
    pub const REMOTE_WRITE: MemPriv = MemPriv(0x20);
    /// `DAT_MEM_PRIV_ALL_FLAG`.
    pub const ALL: MemPriv = MemPriv(0x33);

    /// From raw bits; `None` if an unknown bit is set.
    pub fn from_bits(bits: u32) -> Option<MemPriv> {
        (bits & !Self::ALL.0 == 0).then_some(MemPriv(bits))
    }
    /// The raw bits.
    pub fn bits(self) -> u32 {
        self.0
    }
    /// True if every right of `other` is granted here.
    pub fn contains(self, other: MemPriv) -> bool {
        self.0 & other.0 == other.0
    }
    /// True if any remote right is granted.
    pub fn any_remote(self) -> bool {
        self.0 & (Self::REMOTE_READ.0 | Self::REMOTE_WRITE.0) != 0
    }
}

impl std::ops::BitOr for MemPriv {
    type Output = MemPriv;
    fn bitor(self, rhs: MemPriv) -> MemPriv {
        MemPriv(self.0 | rhs.0)
    }
}

impl fmt::Debug for MemPriv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        for (p, n) in [
            (Self::LOCAL_READ, "LOCAL_READ"),
            (Self::REMOTE_READ, "REMOTE_READ"),
            (Self::LOCAL_WRITE, "LOCAL_WRITE"),
            (Self::REMOTE_WRITE, "REMOTE_WRITE"),
        ] {
            if self.contains(p) {
                parts.push(n);
            }
        }
        write!(f, "MemPriv({})", parts.join("|"))
    }
}

/// A local scatter/gather entry (`DAT_LMR_TRIPLET`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct LmrTriplet {
    /// The LMR's `lmr_context`.
    pub lmr_context: u32,
    /// Start address inside the LMR.
    pub virtual_address: u64,
    /// Length in bytes.
    pub segment_length: u64,
}

/// A remote buffer (`DAT_RMR_TRIPLET`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct RmrTriplet {
    /// The remote LMR's or RMR's `rmr_context`.
    pub rmr_context: u32,
    /// Start address on the remote side.
    pub target_address: u64,
    /// Length in bytes.
    pub segment_length: u64,
}
