//! The memory interface the connection calls, and a simple implementation.
//!
//! The connection never owns registered memory. It asks a [`Memory`] to look
//! up an STag (the caller checks keys, PDs and access rights), and then
//! itself checks every offset and length against the region returned, with
//! no arithmetic overflow, before it calls [`Memory::place`]. So `place`
//! is only ever called with bytes that fit the region or receive buffer.
//!
//! [`VecMemory`] keeps regions and buffers in `Vec`s; tests, the simulation
//! and the fuzz targets use it.

use std::collections::HashMap;

use crate::error::StagError;

/// The access a remote operation needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// The peer writes into the region (RDMA Write).
    RemoteWrite,
    /// The peer reads the region (RDMA Read source).
    RemoteRead,
    /// A Read Response lands in our own sink region.
    LocalWrite,
}

/// A registered region as the connection sees it: TOs `[base, base+len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// First valid tagged offset (a virtual address under siw's rules).
    pub base: u64,
    /// Length in bytes.
    pub len: u64,
}

/// Where received payload goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Tagged placement at `to` in `stag`'s region (already bounds-checked).
    Tagged {
        /// STag.
        stag: u32,
        /// Tagged offset of the first byte.
        to: u64,
    },
    /// Into the posted receive `wr_id` at byte `offset` (already checked
    /// against the posted capacity).
    Recv {
        /// The receive's work-request id.
        wr_id: u64,
        /// Byte offset in the receive buffer.
        offset: u32,
    },
}

/// Bytes the connection transmits from caller memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Bytes `[offset, offset+len)` of the local buffer of work request `wr_id`
    /// (a Send or RDMA Write).
    Local {
        /// The posting's work-request id.
        wr_id: u64,
        /// Byte offset in the message.
        offset: u32,
        /// Length.
        len: u32,
    },
    /// Bytes of a Read Response: `len` bytes at `to` in region `stag`
    /// (bounds already checked against [`Memory::lookup`]).
    Region {
        /// Source STag.
        stag: u32,
        /// Tagged offset.
        to: u64,
        /// Length.
        len: u32,
    },
}

impl Source {
    /// Length in bytes.
    pub fn len(&self) -> u32 {
        match *self {
            Source::Local { len, .. } | Source::Region { len, .. } => len,
        }
    }

    /// Whether the source is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What the connection needs from the provider's memory.
pub trait Memory {
    /// Looks up `stag` for `access`; the implementation checks the key,
    /// PD and rights. Bounds are checked by the connection.
    fn lookup(&mut self, stag: u32, access: Access) -> Result<Region, StagError>;
    /// The bytes of `src`; must be exactly `src.len()` long (else the
    /// connection fails with a local error). An implementation provides
    /// this or [`Memory::source_with`]; the connection calls only the
    /// latter, whose default calls this.
    fn source(&self, src: &Source) -> Option<&[u8]> {
        let _ = src;
        None
    }
    /// Calls `f` on the bytes of `src` in order, in one or more pieces
    /// that together are exactly `src.len()` long (for memory that is not
    /// one slice, or is only readable under a lock); false if they cannot
    /// be had (the connection then fails with a local error).
    fn source_with(&self, src: &Source, f: &mut dyn FnMut(&[u8])) -> bool {
        match self.source(src) {
            Some(b) => {
                f(b);
                true
            }
            None => false,
        }
    }
    /// Stores received bytes.
    fn place(&mut self, dst: &Place, data: &[u8]);
    /// Invalidates `stag` for a Send with Invalidate.
    fn invalidate(&mut self, stag: u32) -> Result<(), StagError> {
        let _ = stag;
        Ok(())
    }
}

/// A registered region in a [`VecMemory`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VecRegion {
    /// Base TO.
    pub base: u64,
    /// Contents.
    pub data: Vec<u8>,
    /// Remote write allowed.
    pub remote_write: bool,
    /// Remote read allowed.
    pub remote_read: bool,
    /// Still valid (not invalidated).
    pub valid: bool,
}

/// A simple [`Memory`] over `Vec`s: regions by STag, send buffers by wr_id,
/// receive buffers by wr_id.
#[derive(Debug, Clone, Default)]
pub struct VecMemory {
    /// Registered regions.
    pub regions: HashMap<u32, VecRegion>,
    /// Local buffers of posted Sends and Writes.
    pub sends: HashMap<u64, Vec<u8>>,
    /// Receive buffers (sized at their posted capacity).
    pub recvs: HashMap<u64, Vec<u8>>,
}

impl VecMemory {
    /// Registers a region.
    pub fn register(&mut self, stag: u32, base: u64, data: Vec<u8>, write: bool, read: bool) {
        self.regions.insert(
            stag,
            VecRegion {
                base,
                data,
                remote_write: write,
                remote_read: read,
                valid: true,
            },
        );
    }
}

impl Memory for VecMemory {
    fn lookup(&mut self, stag: u32, access: Access) -> Result<Region, StagError> {
        let r = self.regions.get(&stag).ok_or(StagError::Invalid)?;
        if !r.valid {
            return Err(StagError::Invalid);
        }
        let ok = match access {
            Access::RemoteWrite => r.remote_write,
            Access::RemoteRead => r.remote_read,
            Access::LocalWrite => true,
        };
        if !ok {
            return Err(StagError::Access);
        }
        Ok(Region {
            base: r.base,
            len: r.data.len() as u64,
        })
    }

    fn source(&self, src: &Source) -> Option<&[u8]> {
        match *src {
            Source::Local { wr_id, offset, len } => {
                let b = self.sends.get(&wr_id)?;
                let s = usize::try_from(offset).ok()?;
                b.get(s..s.checked_add(usize::try_from(len).ok()?)?)
            }
            Source::Region { stag, to, len } => {
                let r = self.regions.get(&stag)?;
                let s = usize::try_from(to.checked_sub(r.base)?).ok()?;
                r.data.get(s..s.checked_add(usize::try_from(len).ok()?)?)
            }
        }
    }

    fn place(&mut self, dst: &Place, data: &[u8]) {
        let (buf, start) = match *dst {
            Place::Tagged { stag, to } => match self.regions.get_mut(&stag) {
                Some(r) => (&mut r.data, to.wrapping_sub(r.base) as usize),
                None => return,
            },
            Place::Recv { wr_id, offset } => match self.recvs.get_mut(&wr_id) {
                Some(b) => (b, offset as usize),
                None => return,
            },
        };
        if let Some(dst) = start
            .checked_add(data.len())
            .and_then(|end| buf.get_mut(start..end))
        {
            dst.copy_from_slice(data);
        }
    }

    fn invalidate(&mut self, stag: u32) -> Result<(), StagError> {
        match self.regions.get_mut(&stag) {
            Some(r) => {
                r.valid = false;
                Ok(())
            }
            None => Err(StagError::Invalid),
        }
    }
}
