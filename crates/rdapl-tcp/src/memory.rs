//! The engine's view of one connection's memory ([`rdapl_iwarp::Memory`]).
//!
//! The iWARP engine names bytes by work-request id and STag; this module
//! turns those names into the endpoint's registered memory, through the
//! provider's view of the core only:
//!
//! * outbound Sends and RDMA Writes: the local list is checked when the
//!   request is handed to the engine and held by reference
//!   ([`rdapl::provider::Gather`]): the engine's CRC and the socket's
//!   vectored writes read the registered regions themselves, under their
//!   read locks, with no staging copy. A request with an owned buffer
//!   ([`rdapl::Buf`]) is gathered into a staging buffer instead, shared
//!   with the output queue and recycled once written;
//! * inbound Sends: placed at their offset with `scatter_at`, or read from
//!   the socket straight into the receive's memory (`lend_recv`, see
//!   `ConnMemory::lend`);
//! * inbound RDMA Writes: the STag's extent comes from `remote_extent`
//!   (key, protection zone, right), the engine checks each segment against
//!   it, and `remote_write` (or `lend_remote_write`) checks every chunk
//!   again before a byte moves;
//! * inbound RDMA Read Requests: the source is checked with
//!   `remote_gather` when the request arrives and held by reference until
//!   the response has gone out (its bytes are read when they are sent, as
//!   an RNIC's DMA reads them); a refused source fails the engine's STag
//!   lookup, so a Terminate goes out and nothing is sent;
//! * Read Responses: placed into the read's local list with `scatter_read`
//!   (or `lend_read_sink`).
//!
//! Nothing here panics on what the wire says: every range is checked.

use rdapl::provider::{EpInner, Gather, RecvWr, Wr};
use rdapl::{DtoStatus, MemPriv, RmrTriplet};
use rdapl_iwarp::{Access, Memory, Place, Region, Source, StagError};
use rustc_hash::FxHashMap as HashMap;
use std::collections::VecDeque;
use std::sync::Arc;

/// What the FPDU being fed to the engine is (tagged placements are told
/// apart by it).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum RxOp {
    Other,
    Write,
    ReadResponse,
}

/// A posted receive the engine holds.
pub(crate) struct RecvState {
    pub wr: RecvWr,
    /// The first placement error, if any.
    pub status: Option<DtoStatus>,
}

/// A checked RDMA Read source, held by reference.
pub(crate) struct StagedRead {
    pub stag: u32,
    pub to: u64,
    pub data: Result<Arc<Gather>, DtoStatus>,
}

/// The payload of a Send or RDMA Write handed to the engine.
pub(crate) enum Staged {
    /// The request's own list, held by reference.
    Held(Arc<Gather>),
    /// Gathered bytes (a request with an owned buffer).
    Copied(Arc<Vec<u8>>),
}

impl Staged {
    fn len(&self) -> usize {
        match self {
            Staged::Held(g) => g.len(),
            Staged::Copied(v) => v.len(),
        }
    }
}

/// An RDMA read of ours in flight: its request and the first placement
/// error of its response.
pub(crate) struct Sink {
    pub wr: Wr,
    pub len: u64,
    pub status: Option<DtoStatus>,
}

/// Receives handed to the engine, in the order they were (by increasing
/// engine id). The engine fills them in that order, so the one a Send
/// lands in is the first, found without hashing.
#[derive(Default)]
pub(crate) struct Recvs(VecDeque<(u64, RecvState)>);

impl Recvs {
    /// Adds receive `id`, newer than every one held.
    pub fn push(&mut self, id: u64, r: RecvState) {
        debug_assert!(self.0.back().is_none_or(|b| b.0 < id));
        self.0.push_back((id, r));
    }

    fn index(&self, id: u64) -> Option<usize> {
        match self.0.front() {
            Some((f, _)) if *f == id => Some(0),
            _ => self.0.binary_search_by_key(&id, |e| e.0).ok(),
        }
    }

    pub fn get_mut(&mut self, id: u64) -> Option<&mut RecvState> {
        let i = self.index(id)?;
        self.0.get_mut(i).map(|e| &mut e.1)
    }

    pub fn remove(&mut self, id: u64) -> Option<RecvState> {
        let i = self.index(id)?;
        self.0.remove(i).map(|e| e.1)
    }

    /// The oldest receive held.
    pub fn front_mut(&mut self) -> Option<&mut RecvState> {
        self.0.front_mut().map(|e| &mut e.1)
    }

    pub fn pop_front(&mut self) -> Option<RecvState> {
        self.0.pop_front().map(|e| e.1)
    }
}

/// One connection's memory, as the engine sees it.
pub(crate) struct ConnMemory {
    pub ep: Option<Arc<EpInner>>,
    /// Payload of Sends and Writes, by engine id (shared with the output
    /// queue, which keeps it until written).
    pub staged: HashMap<u64, Staged>,
    pub staged_bytes: usize,
    /// Gather buffers given back, for reuse (large sends would otherwise
    /// map, fault in and unmap fresh memory each time).
    pub pool: Vec<Vec<u8>>,
    /// Receives handed to the engine.
    pub recvs: Recvs,
    /// Our reads in flight, by sink STag.
    pub sinks: HashMap<u32, Sink>,
    /// The FPDU being fed.
    pub rx_op: RxOp,
    /// The source of the Read Request being fed.
    pub pending_read: Option<StagedRead>,
    /// Sources of accepted Read Requests, in response order.
    pub responses: VecDeque<StagedRead>,
    /// An inbound RDMA Write the core refused at placement (the engine's
    /// own check passed): the connection must break.
    pub fault: bool,
}

impl ConnMemory {
    pub fn new() -> ConnMemory {
        ConnMemory {
            ep: None,
            staged: HashMap::default(),
            staged_bytes: 0,
            pool: Vec::new(),
            recvs: Recvs::default(),
            sinks: HashMap::default(),
            rx_op: RxOp::Other,
            pending_read: None,
            responses: VecDeque::new(),
            fault: false,
        }
    }

    /// Stages the payload of Send or Write `id`.
    pub fn stage(&mut self, id: u64, data: Staged) {
        self.staged_bytes += data.len();
        self.staged.insert(id, data);
    }

    /// Drops the payload of `id` (transmitted or flushed).
    pub fn unstage(&mut self, id: u64) {
        if let Some(d) = self.staged.remove(&id) {
            self.staged_bytes -= d.len();
            // Written already: the buffer is free for the next gather.
            if let Staged::Copied(d) = d
                && let Ok(v) = Arc::try_unwrap(d)
            {
                recycle(&mut self.pool, v);
            }
        }
    }

    /// An empty buffer for a gather (a recycled one if there is one).
    pub fn take_buf(&mut self) -> Vec<u8> {
        self.pool.pop().unwrap_or_default()
    }

    /// A Read Response segment from `stag` at `to`, `len` bytes long, was
    /// written out: the staged source goes once its last byte has.
    pub fn response_sent(&mut self, stag: u32, to: u64, len: u32) {
        if let Some(f) = self.responses.front()
            && f.stag == stag
        {
            let end =
                f.to.saturating_add(f.data.as_ref().map_or(0, |d| d.len() as u64));
            if to.saturating_add(u64::from(len)) >= end {
                self.responses.pop_front();
            }
        }
    }
}

impl ConnMemory {
    /// Lends `f` the memory at `dst`, at most `len` bytes of it (fewer where
    /// a segment of a receive's list ends), for a read from the socket
    /// straight into it; what `f` writes there is placed data. `None` (and
    /// `f` not called) when it cannot: no endpoint, a placement error
    /// already recorded, or the core refuses the range; the caller then
    /// takes the buffered path, whose [`Memory::place`] records the error.
    pub fn lend<R>(
        &mut self,
        dst: &Place,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Option<R> {
        let ep = self.ep.as_ref()?;
        match *dst {
            Place::Recv { wr_id, offset } => {
                let r = self.recvs.get_mut(wr_id).filter(|r| r.status.is_none())?;
                ep.lend_recv(&mut r.wr, u64::from(offset), len, f).ok()
            }
            Place::Tagged { stag, to } => match self.rx_op {
                RxOp::Write => {
                    let t = RmrTriplet {
                        rmr_context: stag,
                        target_address: to,
                        segment_length: len as u64,
                    };
                    ep.lend_remote_write(t, f).ok()
                }
                RxOp::ReadResponse => {
                    let s = self.sinks.get(&stag).filter(|s| s.status.is_none())?;
                    ep.lend_read_sink(&s.wr, to, len, f).ok()
                }
                RxOp::Other => None,
            },
        }
    }
}

/// Keeps `v` (emptied) in `pool` if there is room.
pub(crate) fn recycle(pool: &mut Vec<Vec<u8>>, mut v: Vec<u8>) {
    if pool.len() < POOL && v.capacity() <= POOL_BUF_MAX {
        v.clear();
        pool.push(v);
    }
}

/// Gather buffers kept for reuse per connection.
const POOL: usize = 8;
/// The largest buffer kept.
const POOL_BUF_MAX: usize = 4 << 20;

fn slice(data: &[u8], offset: u64, len: u32) -> Option<&[u8]> {
    let s = usize::try_from(offset).ok()?;
    data.get(s..s.checked_add(usize::try_from(len).ok()?)?)
}

/// The range `[offset, offset + len)` as `usize`s, if it fits `total`.
pub(crate) fn range(offset: u64, len: u32, total: usize) -> Option<(usize, usize)> {
    let s = usize::try_from(offset).ok()?;
    let e = s.checked_add(usize::try_from(len).ok()?)?;
    (e <= total).then_some((s, e))
}

/// Calls `f` on bytes `[start, end)` of `g`, under its regions' read
/// locks; false if a region is gone or the range is not inside it.
fn held_bytes(g: &Gather, start: usize, end: usize, f: &mut dyn FnMut(&[u8])) -> bool {
    let Some(l) = g.lock() else {
        return false;
    };
    let Some(slices) = l.slices(start, end) else {
        return false;
    };
    slices.for_each(f);
    true
}

impl ConnMemory {
    /// The source of the response to the read of `stag` starting at `to`:
    /// the held source and the offset of `to` in it.
    pub fn response(&self, stag: u32, to: u64) -> Option<(&Arc<Gather>, u64)> {
        let f = self.responses.iter().find(|r| r.stag == stag)?;
        Some((f.data.as_ref().ok()?, to.checked_sub(f.to)?))
    }
}

impl Memory for ConnMemory {
    fn lookup(&mut self, stag: u32, access: Access) -> Result<Region, StagError> {
        match access {
            Access::RemoteWrite => {
                let ep = self.ep.as_ref().ok_or(StagError::Invalid)?;
                let (base, len) = ep
                    .remote_extent(stag, MemPriv::REMOTE_WRITE)
                    .map_err(|_| StagError::Invalid)?;
                Ok(Region { base, len })
            }
            Access::RemoteRead => {
                let Some(p) = self.pending_read.take().filter(|p| p.stag == stag) else {
                    return Err(StagError::Invalid);
                };
                match &p.data {
                    Ok(d) => {
                        let r = Region {
                            base: p.to,
                            len: d.len() as u64,
                        };
                        self.responses.push_back(p);
                        Ok(r)
                    }
                    Err(_) => Err(StagError::Access),
                }
            }
            Access::LocalWrite => self
                .sinks
                .get(&stag)
                .map(|s| Region {
                    base: 0,
                    len: s.len,
                })
                .ok_or(StagError::Invalid),
        }
    }

    fn source_with(&self, src: &Source, f: &mut dyn FnMut(&[u8])) -> bool {
        match *src {
            Source::Local { wr_id, offset, len } => match self.staged.get(&wr_id) {
                Some(Staged::Copied(d)) => match slice(d, u64::from(offset), len) {
                    Some(b) => {
                        f(b);
                        true
                    }
                    None => false,
                },
                Some(Staged::Held(g)) => match range(u64::from(offset), len, g.len()) {
                    Some((s, e)) => held_bytes(g, s, e, f),
                    None => false,
                },
                None => false,
            },
            Source::Region { stag, to, len } => {
                let Some((g, off)) = self.response(stag, to) else {
                    return false;
                };
                match range(off, len, g.len()) {
                    Some((s, e)) => held_bytes(g, s, e, f),
                    None => false,
                }
            }
        }
    }

    fn invalidate(&mut self, stag: u32) -> Result<(), StagError> {
        use rdapl::mem::RemoteInvalidate as R;
        let ep = self.ep.as_ref().ok_or(StagError::Invalid)?;
        ep.invalidate_remote(stag).map_err(|e| match e {
            R::Unknown => StagError::Invalid,
            R::OtherZone => StagError::NotAssociated,
            R::NotInvalidatable => StagError::Access,
        })
    }

    fn place(&mut self, dst: &Place, data: &[u8]) {
        let Some(ep) = self.ep.as_ref() else {
            self.fault = true;
            return;
        };
        match *dst {
            Place::Recv { wr_id, offset } => {
                if let Some(r) = self.recvs.get_mut(wr_id)
                    && r.status.is_none()
                    && let Err(st) = ep.scatter_at(&mut r.wr, u64::from(offset), data)
                {
                    r.status = Some(st);
                }
            }
            Place::Tagged { stag, to } => match self.rx_op {
                RxOp::Write => {
                    let t = RmrTriplet {
                        rmr_context: stag,
                        target_address: to,
                        segment_length: data.len() as u64,
                    };
                    if ep.remote_write(t, data).is_err() {
                        self.fault = true;
                    }
                }
                RxOp::ReadResponse => {
                    if let Some(s) = self.sinks.get_mut(&stag)
                        && s.status.is_none()
                        && let Err(st) = ep.scatter_read(&s.wr, to, data)
                    {
                        s.status = Some(st);
                    }
                }
                RxOp::Other => self.fault = true,
            },
        }
    }
}
