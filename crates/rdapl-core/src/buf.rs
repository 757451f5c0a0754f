//! Owned buffers: registered memory that one holder owns at a time.
//!
//! An LMR's memory can be read and written by the application at any time
//! (through [`Lmr::read_at`](crate::Lmr::read_at) and friends) while a
//! provider copies into or out of it, so every access takes the region's
//! lock. A [`Buf`] is the other model, the one of io_uring's owned
//! buffers: the application owns it and reaches its bytes through `&mut`,
//! [`Ep::post_send_buf`](crate::Ep::post_send_buf) and
//! [`Ep::post_recv_buf`](crate::Ep::post_recv_buf) move it into the
//! request, and its completion ([`DtoCompletion::buf`](crate::DtoCompletion::buf))
//! moves it back, whatever the status. While the request owns it nobody
//! else can reach it, so the provider copies without any lock, and the
//! application reads and writes without one.
//!
//! Guarantees: a buffer is never lost (a refused post hands it back with
//! the error; every completion, flushes included, carries it), and its
//! bytes are only ever touched by its one owner. A buffer belongs to the
//! protection zone it was made in and can be posted only on that zone's
//! endpoints.

use std::fmt;
use std::ops::{Deref, DerefMut};

use crate::event::PzHandle;

/// A registered buffer owned by the application or, while posted, by its
/// request (see the module docs). Derefs to its bytes. Cloning copies the
/// bytes into a new buffer of the same protection zone.
///
/// Its bytes start on a 128-byte boundary and nothing else lives on their
/// last line (nor on its header's), so a buffer written on one core and
/// read on another shares no cache line with anything else.
pub struct Buf(Box<BufInner>);

/// The two cache lines x86-64 fetches together.
const LINE: usize = 128;

#[repr(align(128))]
struct BufInner {
    pz: PzHandle,
    /// The allocation; the bytes are `store[off..off + len]`.
    store: Box<[u8]>,
    off: usize,
    len: usize,
}

impl Buf {
    /// A buffer of `pz` holding a copy of `bytes` (made by
    /// [`Pz::buf_create`](crate::Pz::buf_create)).
    pub(crate) fn new(pz: PzHandle, bytes: &[u8]) -> Buf {
        let mut b = Buf::zeroed(pz, bytes.len());
        b.copy_from_slice(bytes);
        b
    }

    /// A buffer of `pz` of `len` zero bytes.
    pub(crate) fn zeroed(pz: PzHandle, len: usize) -> Buf {
        // Room to start on a line and to end on one.
        let store = vec![0u8; len.div_ceil(LINE) * LINE + LINE].into_boxed_slice();
        let off = store.as_ptr().align_offset(LINE).min(LINE);
        Buf(Box::new(BufInner {
            pz,
            store,
            off,
            len,
        }))
    }

    /// [`Buf::zeroed`] for a length the caller chose: `None` where the
    /// memory cannot be had, not an abort of the process.
    pub(crate) fn try_zeroed(pz: PzHandle, len: usize) -> Option<Buf> {
        let size = len.div_ceil(LINE).checked_mul(LINE)?.checked_add(LINE)?;
        crate::mem::can_allocate(size).then(|| Buf::zeroed(pz, len))
    }

    /// The protection zone the buffer belongs to.
    #[inline]
    pub fn pz(&self) -> PzHandle {
        self.0.pz
    }

    /// The buffer's bytes, copied out (the buffer is no longer registered).
    pub fn into_vec(self) -> Vec<u8> {
        self.to_vec()
    }

    /// The addresses of the buffer's header and of its first byte:
    /// prefetch hints for a sender on another core (never dereferenced
    /// through these values).
    #[inline]
    pub fn hint_addrs(&self) -> (usize, usize) {
        (
            std::ptr::from_ref::<BufInner>(&self.0) as usize,
            self.as_ptr() as usize,
        )
    }
}

impl Deref for Buf {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        let b = &*self.0;
        &b.store[b.off..b.off + b.len]
    }
}

impl DerefMut for Buf {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        let b = &mut *self.0;
        &mut b.store[b.off..b.off + b.len]
    }
}

impl Clone for Buf {
    fn clone(&self) -> Buf {
        Buf::new(self.0.pz, self)
    }
}

impl PartialEq for Buf {
    fn eq(&self, other: &Buf) -> bool {
        self.0.pz == other.0.pz && **self == **other
    }
}

impl Eq for Buf {}

impl fmt::Debug for Buf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buf")
            .field("pz", &self.0.pz)
            .field("len", &self.0.len)
            .finish()
    }
}

/// A post of a [`Buf`] that was refused: the error, and the buffer back.
#[derive(Debug)]
pub struct BufRefused {
    /// Why the post was refused.
    pub error: crate::Error,
    /// The buffer, untouched.
    pub buf: Buf,
}

impl fmt::Display for BufRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "buffer post refused: {}", self.error)
    }
}

impl std::error::Error for BufRefused {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}
