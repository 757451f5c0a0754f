//! The provider's view of the object model: the public methods a provider
//! (in this crate or another) calls on what the core hands its tables of
//! operations ([`Transport`](super::Transport) and the per-object tables
//! it makes): endpoints ([`EpInner`]), their locked state ([`EpCore`]),
//! work requests ([`Wr`], [`NewWr`], [`RecvWr`]), service points
//! ([`SpInner`]) and connection requests ([`CrInner`]).
//!
//! # What the core keeps, what the provider does
//!
//! The core has checked every post (state, flags, lists, sizes) and
//! reserved its completion before the provider sees it. The provider moves
//! the data and reports back, only through these methods:
//!
//! * **Completions.** [`EpInner::complete`] and [`EpInner::complete_recv`]
//!   complete a work request exactly once, with its status (the DAT
//!   completion-flag rules are applied here, not by the provider).
//! * **Connections.** [`EpInner::established`] when a connection is up on
//!   this side (it returns the connection's number), [`EpInner::connect_failed`]
//!   when an active attempt fails, [`EpInner::ended`] when a connection ends
//!   or breaks: the core moves the state, flushes what it holds (queued
//!   sends, posted receives) exactly once and raises the event. The
//!   provider flushes the requests it holds itself (in flight on a wire).
//! * **Requests.** [`SpInner::request`] delivers an arriving connection
//!   request; [`CrInner::settle_as`] answers or withdraws one.
//! * **Memory.** [`EpInner::gather`] and [`EpInner::scatter`] read and
//!   write the endpoint's own registered memory through a local list;
//!   [`EpInner::remote_write`] and [`EpInner::remote_read`] check a peer's
//!   access (key of this endpoint's protection zone, rights, bounds) and
//!   move bytes only if it passes.
//! * **Receives.** [`EpInner::take_recv`] takes the oldest posted receive
//!   (of the endpoint, or of its shared receive queue) for a connection.

use crate::buf::Buf;
use crate::ep::{CompletionFlags, EpAttr, EpCore, EpInner, EpState, NewWr, RecvWr, Wr, WrOp};
use crate::error::Result;
use crate::event::{ConnectionEventKind, CrHandle, DtoStatus, EpHandle, PzHandle, SpHandle};
use crate::mem::{self, LmrTriplet, MemPriv, RmrTriplet, Span, SpanRef};
use crate::sp::{CrInner, CrState, SpInner};
use crate::sync::LockGuard as MutexGuard;
use std::net::IpAddr;
use std::sync::{Arc, Weak};

/// What a work request asks of the provider.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum WrKind {
    /// A send (its data: [`Wr::data`] or the local list).
    Send,
    /// A send that also invalidates the peer's key (RDMAP Send with
    /// Invalidate): the peer calls [`EpInner::invalidate_remote`] and
    /// completes the receive with [`EpInner::complete_recv_invalidated`].
    SendInvalidate(u32),
    /// An RDMA write to the peer's memory.
    RdmaWrite(RmrTriplet),
    /// An RDMA read of the peer's memory.
    RdmaRead(RmrTriplet),
    /// A memory operation (bind, fast registration, invalidate): the
    /// provider runs it in order with [`EpInner::execute_local`].
    Local,
}

fn kind_of(op: &WrOp) -> WrKind {
    match op {
        WrOp::Send | WrOp::Recv => WrKind::Send,
        WrOp::SendInvalidate(k) => WrKind::SendInvalidate(*k),
        WrOp::RdmaWrite(r) => WrKind::RdmaWrite(*r),
        WrOp::RdmaRead(r) => WrKind::RdmaRead(*r),
        WrOp::Local(_) => WrKind::Local,
    }
}

impl Wr {
    /// What the request asks.
    pub fn kind(&self) -> WrKind {
        kind_of(&self.op)
    }
    /// Its local scatter/gather list (empty for an owned buffer's request).
    pub fn iov(&self) -> &[LmrTriplet] {
        &self.iov
    }
    /// The bytes it sends from its owned buffer, if it has one.
    pub fn data(&self) -> Option<&[u8]> {
        self.buf.as_ref().map(|b| &b[..self.buf_len])
    }
    /// The consumer's cookie.
    pub fn cookie(&self) -> u64 {
        self.cookie
    }
    /// Its completion flags.
    pub fn flags(&self) -> CompletionFlags {
        self.flags
    }
    /// A send the consumer marked solicited (`SOLICITED_WAIT` on a send):
    /// the provider carries that to the peer (RDMAP's Send with Solicited
    /// Event), whose receive is then marked with [`RecvWr::set_solicited`].
    pub fn is_solicited(&self) -> bool {
        self.flags.contains(CompletionFlags::SOLICITED_WAIT)
    }
}

impl NewWr<'_> {
    /// What the request asks.
    pub fn kind(&self) -> WrKind {
        kind_of(&self.op)
    }
    /// The request as queued (its list copied), to keep past the call.
    pub fn queued(self) -> Wr {
        self.into_wr()
    }
}

impl RecvWr {
    /// Its local scatter list (empty for an owned buffer's receive).
    pub fn iov(&self) -> &[LmrTriplet] {
        &self.iov
    }
    /// The consumer's cookie.
    pub fn cookie(&self) -> u64 {
        self.cookie
    }
    /// The bytes the receive can hold: its owned buffer's length, or the
    /// sum of its list's lengths (saturating).
    pub fn capacity(&self) -> u64 {
        match &self.buf {
            Some(b) => b.len() as u64,
            None => self
                .iov
                .iter()
                .fold(0u64, |n, t| n.saturating_add(t.segment_length)),
        }
    }
    /// Marks the receive as filled by a solicited send (a network
    /// provider learns it from the wire): its successful completion then
    /// notifies even under `SOLICITED_WAIT`.
    pub fn set_solicited(&mut self) {
        self.flags = self.flags | CompletionFlags::SOLICITED_ARRIVAL;
    }
}

impl EpCore {
    /// The endpoint's DAT state.
    pub fn state(&self) -> EpState {
        self.state
    }
    /// Whether the endpoint is still making active connection attempt
    /// `attempt` (`ActiveConnectionPending`, and no later attempt began):
    /// what a provider checks before it starts or settles an attempt.
    pub fn is_attempt(&self, attempt: crate::ep::Attempt) -> bool {
        self.state == EpState::ActiveConnectionPending && self.attempt == attempt
    }
    /// The connection the endpoint is in (0: none), as
    /// [`EpInner::established`] returned it.
    pub fn connection(&self) -> u64 {
        self.conn
    }
    /// The provider's state of the endpoint's connection
    /// ([`EpCore::link`]), if there is one of type `T`.
    pub fn link_ref<T: std::any::Any>(&self) -> Option<&T> {
        self.link.as_ref()?.downcast_ref::<T>()
    }
    /// Queues `wr` at the tail of the endpoint's send queue (flushed by the
    /// core when the connection ends).
    pub fn push_send(&mut self, wr: Wr) {
        self.sends.push_back(wr);
    }
    /// Puts `wr` back at the head of the send queue.
    pub fn unpop_send(&mut self, wr: Wr) {
        self.sends.push_front(wr);
    }
    /// Takes the oldest queued request.
    pub fn pop_send(&mut self) -> Option<Wr> {
        self.sends.pop_front()
    }
    /// The oldest queued request.
    pub fn front_send(&self) -> Option<&Wr> {
        self.sends.front()
    }
}

/// The status of a failed local access (`LocalProtection`, or
/// `LocalLength` for a receive too short), in zone `pz`.
fn local_access(
    iov: &[LmrTriplet],
    right: MemPriv,
    ep: &EpInner,
    pz: PzHandle,
) -> Result<mem::Spans, DtoStatus> {
    ep.ia.mem.resolve_local(iov, right, pz)
}

impl EpInner {
    /// The endpoint's handle.
    pub fn handle(&self) -> EpHandle {
        self.id
    }
    /// The endpoint's protection zone.
    pub fn pz_handle(&self) -> PzHandle {
        self.pz.inner.id
    }
    /// The protection zone of the endpoint's receives: its shared receive
    /// queue's if it has one (DAT: the endpoint's zone governs every DTO
    /// but receives), else its own.
    pub fn recv_pz_handle(&self) -> PzHandle {
        self.srq
            .as_ref()
            .map_or(self.pz.inner.id, |s| s.inner.pz.inner.id)
    }
    /// The endpoint's attributes.
    pub fn attr(&self) -> &EpAttr {
        &self.attr
    }
    /// Locks the endpoint's state (the lock [`super::EpOps::submit`]
    /// is called under).
    pub fn lock(&self) -> MutexGuard<'_, EpCore> {
        self.core.lock()
    }

    /// Attaches a provider's progress hook to the EVDs this endpoint's
    /// completions and connection events go to (receive, request and
    /// connection EVDs): a consumer that finds one empty, or is about to
    /// wait on it, runs the hook first (see [`crate::evd::Progress`]), so
    /// that the end of a connection, which a provider learns from the same
    /// input as its data, reaches a consumer waiting for it as soon as its
    /// completions would. Held weakly: dropping the hook detaches it.
    pub fn attach_progress(&self, hook: Weak<dyn crate::evd::Progress>) {
        self.attach_progress_per_evd(|_| hook.clone());
    }

    /// [`EpInner::attach_progress`] with a hook per EVD: `hook_for` is
    /// called once for each of those EVDs (once for an EVD that takes
    /// several of the streams), with its handle, and what it returns is
    /// attached to that EVD. A provider whose connections share
    /// EVDs keeps one hook per EVD for all of them, so that a pass over an
    /// EVD costs what is ready, not what is attached.
    pub fn attach_progress_per_evd(
        &self,
        mut hook_for: impl FnMut(crate::event::EvdHandle) -> Weak<dyn crate::evd::Progress>,
    ) {
        let mut seen = [None; 3];
        for (i, evd) in [
            self.recv_evd.as_ref(),
            self.request_evd.as_ref(),
            self.conn_evd.as_ref(),
        ]
        .into_iter()
        .enumerate()
        {
            let Some(evd) = evd else { continue };
            let h = evd.handle();
            if seen.contains(&Some(h)) {
                continue;
            }
            seen[i] = Some(h);
            evd.inner.progress.attach(hook_for(h));
        }
    }

    /// The connection is up on this side: `Connected`, `remote` recorded,
    /// `Established` raised (with `peer_private`, the accept's private data,
    /// on the active side). `attempt` names the active side's attempt (as
    /// [`super::EpOps::connect`] got it); `None` is the passive side.
    /// Returns the connection's number (never 0), or `None` if the
    /// endpoint is no longer making that attempt, or accepting (it gave
    /// up, was freed or reset, or began another attempt).
    pub fn established(
        &self,
        attempt: Option<crate::ep::Attempt>,
        remote: (IpAddr, u64),
        peer_private: Option<&[u8]>,
    ) -> Option<u64> {
        let conn = {
            let mut c = self.core.lock();
            let pending = match attempt {
                Some(a) => c.is_attempt(a),
                None => c.state == EpState::PassiveConnectionPending,
            };
            if !pending || self.is_freed() {
                return None;
            }
            let conn = crate::ep::next_conn();
            self.rq.lock().conn = conn;
            c.conn = conn;
            self.set_state(&mut c, EpState::Connected);
            c.remote = Some(remote);
            c.pending_cr = None;
            c.peer_private = peer_private.map(Box::from);
            conn
        };
        self.connection_event(
            ConnectionEventKind::Established,
            peer_private.map(Box::from),
        );
        Some(conn)
    }

    /// Keeps `link` as the provider's state of this endpoint's connection
    /// ([`EpCore::link`](crate::ep::EpCore::link)), if the endpoint is
    /// connecting or connected (and not freed); false (and `link` dropped)
    /// otherwise. The core drops it when the endpoint leaves.
    pub fn set_link(&self, link: Box<dyn std::any::Any + Send>) -> bool {
        let mut c = self.core.lock();
        let live = matches!(
            c.state,
            EpState::ActiveConnectionPending
                | EpState::PassiveConnectionPending
                | EpState::Connected
        ) && !self.is_freed();
        if live {
            c.link = Some(link);
        }
        live
    }

    /// Active connection attempt `attempt` failed with `kind`
    /// (`PeerRejected` with the reject's private data, `NonPeerRejected`,
    /// `Unreachable`, `TimedOut`): `Disconnected`, everything posted
    /// flushed, the event raised. False if the endpoint is no longer making
    /// that attempt (it gave up, or began another), or is being freed (no
    /// event names a freed endpoint).
    pub fn connect_failed(
        &self,
        attempt: crate::ep::Attempt,
        kind: ConnectionEventKind,
        private: Option<&[u8]>,
    ) -> bool {
        {
            let mut c = self.core.lock();
            if !c.is_attempt(attempt) || self.is_freed() {
                return false;
            }
            self.set_state(&mut c, EpState::Disconnected);
            c.pending_cr = None;
        }
        self.flush_all();
        self.connection_event(kind, private.map(Box::from));
        true
    }

    /// The connection of this side ended (`Disconnected`) or broke
    /// (`Broken`), or an accept could not complete: the state moves to
    /// `Disconnected`, what the core holds (queued sends, posted receives)
    /// is flushed, and `kind` is raised, once. False if there was nothing
    /// to end. An active attempt is not a connection: it ends only by its
    /// own outcome ([`EpInner::connect_failed`], which names it), so that
    /// a late end of an earlier connection never fails the attempt that
    /// followed it.
    pub fn ended(&self, kind: ConnectionEventKind) -> bool {
        let state = self.core.lock().state;
        match state {
            EpState::Connected | EpState::DisconnectPending => {
                let was = self.leave(&mut self.core.lock());
                if was {
                    self.flush_all();
                    self.connection_event(kind, None);
                }
                was
            }
            EpState::PassiveConnectionPending => {
                {
                    let mut c = self.core.lock();
                    if c.state != EpState::PassiveConnectionPending {
                        return false;
                    }
                    self.set_state(&mut c, EpState::Disconnected);
                }
                self.flush_all();
                self.connection_event(kind, None);
                true
            }
            _ => false,
        }
    }

    /// Takes the oldest posted receive for connection `conn` (of this
    /// endpoint, or of its shared receive queue, its completion then
    /// reserved on the receive EVD now). `None` if there is none, or the
    /// endpoint is no longer in that connection. The provider completes it
    /// (or flushes it) before it reports the end of the connection
    /// ([`EpInner::ended`]): the end flushes the receives still queued,
    /// which are later ones, and completions must stay in order.
    pub fn take_recv(&self, conn: u64) -> Option<RecvWr> {
        let mut rq = self.rq.lock();
        if conn == 0 || rq.conn != conn {
            return None;
        }
        rq.refill(self, false);
        let r = self.take_recv_locked(&mut rq);
        self.publish_taken(&rq);
        r
    }

    /// Copies the bytes a send or RDMA write gathers (its owned buffer, or
    /// its local list, checked for local read) to the end of `out`.
    /// `LocalProtection` if a key does not allow it (nothing is copied).
    pub fn gather(&self, wr: &Wr, out: &mut Vec<u8>) -> std::result::Result<(), DtoStatus> {
        if let Some(d) = wr.data() {
            out.extend_from_slice(d);
            return Ok(());
        }
        self.read_local(&wr.iov, out)
    }

    fn read_local(
        &self,
        iov: &[LmrTriplet],
        out: &mut Vec<u8>,
    ) -> std::result::Result<(), DtoStatus> {
        let spans = local_access(iov, MemPriv::LOCAL_READ, self, self.pz.inner.id)?;
        if let [s] = &spans[..] {
            // One region (a short message's usual list): its lock alone,
            // no list of references.
            let g = s.region.try_read().ok_or(DtoStatus::LocalProtection)?;
            out.extend_from_slice(&g[s.offset..s.offset + s.len]);
            return Ok(());
        }
        let refs: Vec<SpanRef<'_>> = spans.iter().map(Span::as_ref).collect();
        mem::append_spans(&refs, out)
            .map(|_| ())
            .map_err(|_| DtoStatus::LocalProtection)
    }

    /// Writes `data` into the memory of a receive (its owned buffer, or
    /// its list, checked for local write), from its start. Returns the
    /// bytes written; `LocalLength` if `data` does not fit, `LocalProtection`
    /// if a key does not allow it (nothing is written either way).
    pub fn scatter(&self, r: &mut RecvWr, data: &[u8]) -> std::result::Result<u64, DtoStatus> {
        self.scatter_at(r, 0, data)
    }

    /// [`EpInner::scatter`] of `data` at byte `offset` of the receive (a
    /// segment of a longer message): `LocalLength` if `offset + data.len()`
    /// passes the end of the receive's memory.
    pub fn scatter_at(
        &self,
        r: &mut RecvWr,
        offset: u64,
        data: &[u8],
    ) -> std::result::Result<u64, DtoStatus> {
        if let Some(b) = r.buf.as_mut() {
            return fill_buf(b, offset, data);
        }
        self.write_local(&r.iov, offset, data, self.recv_pz_handle())
    }

    /// Writes `data` at byte `offset` of the local list of an RDMA read
    /// `wr` (a segment of the read's response), as
    /// [`EpInner::scatter_at`] does.
    pub fn scatter_read(
        &self,
        wr: &Wr,
        offset: u64,
        data: &[u8],
    ) -> std::result::Result<u64, DtoStatus> {
        self.write_local(&wr.iov, offset, data, self.pz.inner.id)
    }

    fn write_local(
        &self,
        iov: &[LmrTriplet],
        offset: u64,
        data: &[u8],
        pz: PzHandle,
    ) -> std::result::Result<u64, DtoStatus> {
        let spans = local_access(iov, MemPriv::LOCAL_WRITE, self, pz)?;
        // The usual case, one segment holding all of it: that region alone
        // is locked, with nothing gathered on the way.
        if let Some(span) = segment_at(&spans, offset, data.len())
            && span.len == data.len()
        {
            return mem::lend_span(span, |dst| dst.copy_from_slice(data))
                .map(|()| data.len() as u64)
                .map_err(|_| DtoStatus::LocalProtection);
        }
        let refs: Vec<SpanRef<'_>> = spans.iter().map(Span::as_ref).collect();
        let refs = skip_spans(&refs, offset, data.len()).ok_or(DtoStatus::LocalLength)?;
        mem::copy_from_buf(data, &refs)
            .map(|n| n as u64)
            .map_err(|_| DtoStatus::LocalProtection)
    }

    /// Lends the memory of a receive to `f`, for a provider that reads its
    /// transport straight into it (no intermediate copy): `f` gets the
    /// bytes of `r` from byte `offset` on, at most `len` of them and only as
    /// far as they are contiguous (the rest of the segment holding
    /// `offset`, or of the owned buffer), under that region's write lock.
    /// What `f` writes there is received data, as if
    /// [`EpInner::scatter_at`] had written it. `LocalLength` if `offset` is
    /// at or past the end of the receive's memory, `LocalProtection` if a
    /// key does not allow local write or the region is retired (`f` is not
    /// called).
    pub fn lend_recv<R>(
        &self,
        r: &mut RecvWr,
        offset: u64,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> std::result::Result<R, DtoStatus> {
        if let Some(b) = r.buf.as_mut() {
            let start = usize::try_from(offset).map_err(|_| DtoStatus::LocalLength)?;
            if start >= b.len() {
                return Err(DtoStatus::LocalLength);
            }
            let end = start + len.min(b.len() - start);
            return Ok(f(&mut b[start..end]));
        }
        self.lend_local(&r.iov, offset, len, self.recv_pz_handle(), f)
    }

    /// [`EpInner::lend_recv`] for the local list of an RDMA read `wr`, the
    /// memory its response lands in.
    pub fn lend_read_sink<R>(
        &self,
        wr: &Wr,
        offset: u64,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> std::result::Result<R, DtoStatus> {
        self.lend_local(&wr.iov, offset, len, self.pz.inner.id, f)
    }

    fn lend_local<R>(
        &self,
        iov: &[LmrTriplet],
        offset: u64,
        len: usize,
        pz: PzHandle,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> std::result::Result<R, DtoStatus> {
        let spans = local_access(iov, MemPriv::LOCAL_WRITE, self, pz)?;
        let span = segment_at(&spans, offset, len).ok_or(DtoStatus::LocalLength)?;
        mem::lend_span(span, f).map_err(|_| DtoStatus::LocalProtection)
    }

    /// Lends the memory of a peer's RDMA write to `f` (for a provider that
    /// reads its transport straight into it): the `segment_length` bytes
    /// at `target`, checked as [`EpInner::remote_write`] checks them
    /// (`RemoteAccess`, and `f` is not called), under the region's write
    /// lock. What `f` writes there is the peer's data.
    pub fn lend_remote_write<R>(
        &self,
        target: RmrTriplet,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> std::result::Result<R, DtoStatus> {
        if target.segment_length == 0 {
            return Ok(f(&mut []));
        }
        let span = self.remote_span(target, target.segment_length, MemPriv::REMOTE_WRITE)?;
        mem::lend_span(span.as_ref(), f).map_err(|_| DtoStatus::RemoteAccess)
    }

    /// A peer's RDMA write of `data` into this endpoint's memory at
    /// `target` (its key, address; the length is `data`'s): the key must be
    /// of this endpoint's protection zone and grant remote write over the
    /// whole range, or `RemoteAccess` and no byte moves.
    pub fn remote_write(
        &self,
        target: RmrTriplet,
        data: &[u8],
    ) -> std::result::Result<(), DtoStatus> {
        if data.is_empty() {
            return Ok(());
        }
        let span = self.remote_span(target, data.len() as u64, MemPriv::REMOTE_WRITE)?;
        mem::copy_from_buf(data, &[span.as_ref()])
            .map(|_| ())
            .map_err(|_| DtoStatus::RemoteAccess)
    }

    /// A peer's RDMA read of `out.len()` bytes of this endpoint's memory at
    /// `source`, checked as [`EpInner::remote_write`] is (remote read).
    pub fn remote_read(
        &self,
        source: RmrTriplet,
        out: &mut [u8],
    ) -> std::result::Result<(), DtoStatus> {
        if out.is_empty() {
            return Ok(());
        }
        let span = self.remote_span(source, out.len() as u64, MemPriv::REMOTE_READ)?;
        mem::copy_into_buf(&[span.as_ref()], out)
            .map(|_| ())
            .map_err(|_| DtoStatus::RemoteAccess)
    }

    /// The range (start address, length) that the key `rmr_context`
    /// grants a peer of this endpoint for `right`: the key must be of this
    /// endpoint's protection zone and grant `right`, or `RemoteAccess`. For
    /// a network provider whose wire engine checks each arriving segment
    /// against the region before placing it (iWARP's STag lookup);
    /// [`EpInner::remote_write`] and [`EpInner::remote_read`] check every
    /// transfer again.
    pub fn remote_extent(
        &self,
        rmr_context: u32,
        right: MemPriv,
    ) -> std::result::Result<(u64, u64), DtoStatus> {
        let e = self
            .ia
            .mem
            .get(rmr_context)
            .ok_or(DtoStatus::RemoteAccess)?;
        let (start, len) = (e.start, e.len);
        // The whole range must pass the check a transfer passes.
        let t = RmrTriplet {
            rmr_context,
            target_address: start,
            segment_length: len,
        };
        self.remote_span(t, len, right)?;
        Ok((start, len))
    }

    fn remote_span(
        &self,
        t: RmrTriplet,
        len: u64,
        right: MemPriv,
    ) -> std::result::Result<Span, DtoStatus> {
        self.ia
            .mem
            .resolve(
                t.rmr_context,
                t.target_address,
                len,
                right,
                self.pz.inner.id,
            )
            .map_err(|_| DtoStatus::RemoteAccess)
    }
}

fn fill_buf(b: &mut Buf, offset: u64, data: &[u8]) -> std::result::Result<u64, DtoStatus> {
    let start = usize::try_from(offset).map_err(|_| DtoStatus::LocalLength)?;
    let end = start
        .checked_add(data.len())
        .ok_or(DtoStatus::LocalLength)?;
    let dst = b.get_mut(start..end).ok_or(DtoStatus::LocalLength)?;
    dst.copy_from_slice(data);
    Ok(data.len() as u64)
}

/// The part of `spans` from byte `offset` on, `len` bytes long; `None` if
/// the spans hold fewer than `offset + len` bytes.
/// The bytes from `offset` on of the spans, at most `len` of them and only
/// as far as the segment holding `offset` goes; `None` if `offset` is at
/// or past their end.
fn segment_at(spans: &mem::Spans, offset: u64, len: usize) -> Option<SpanRef<'_>> {
    let mut skip = usize::try_from(offset).ok()?;
    for s in spans.iter().map(Span::as_ref) {
        if skip >= s.len {
            skip -= s.len;
            continue;
        }
        return Some(SpanRef {
            region: s.region,
            offset: s.offset + skip,
            len: (s.len - skip).min(len),
        });
    }
    None
}

fn skip_spans<'a>(spans: &[SpanRef<'a>], offset: u64, len: usize) -> Option<Vec<SpanRef<'a>>> {
    let mut skip = usize::try_from(offset).ok()?;
    let mut want = len;
    let mut out = Vec::with_capacity(spans.len());
    for s in spans {
        if want == 0 {
            break;
        }
        if skip >= s.len {
            skip -= s.len;
            continue;
        }
        let n = (s.len - skip).min(want);
        out.push(SpanRef {
            region: s.region,
            offset: s.offset + skip,
            len: n,
        });
        want -= n;
        skip = 0;
    }
    (want == 0).then_some(out)
}

impl crate::srq::SrqInner {
    /// The live endpoints that take their receives from this SRQ (whose
    /// peers' waiting sends [`super::SrqOps::posted`] may resume).
    pub fn takers(&self) -> Vec<Arc<EpInner>> {
        self.endpoints()
    }
}

impl SpInner {
    /// The service point's handle.
    pub fn handle(&self) -> SpHandle {
        self.id
    }
    /// The connection qualifier it listens on.
    pub fn conn_qual(&self) -> u64 {
        self.conn_qual
    }
    /// True once freed (or, for a reserved SP, once it took its request).
    pub fn freed(&self) -> bool {
        self.is_freed()
    }

    /// A connection request arrived from `remote` with `private_data`: the
    /// core makes the request and raises `ConnectionRequest` on the CR
    /// EVD. `QueueFull` if that EVD overflowed (the provider then rejects
    /// the request as a non-peer reject), `InvalidHandle` if the SP is
    /// gone. The provider keeps its own state of the request in `ops`,
    /// which accept and reject are handed to.
    pub fn request(
        self: &Arc<Self>,
        remote: IpAddr,
        private_data: Vec<u8>,
        ops: Box<dyn crate::provider::CrOps>,
    ) -> Result<Arc<CrInner>> {
        let cr = CrInner::new(self, private_data, remote, ops);
        self.deliver(&cr)?;
        Ok(cr)
    }
}

impl CrInner {
    /// The request's handle.
    pub fn handle(&self) -> CrHandle {
        self.id
    }
    /// The active side's address.
    pub fn remote(&self) -> IpAddr {
        self.remote_address
    }
    /// The connection qualifier it arrived on.
    pub fn qualifier(&self) -> u64 {
        self.conn_qual
    }

    /// Settles a pending request (`Accepted` or `Rejected` when the
    /// provider carries out the consumer's answer, `Cancelled` when the
    /// active side gave up); false if it was no longer pending (answer
    /// nothing then). A cancelled request releases an RSP's endpoint.
    pub fn settle_as(&self, to: CrState) -> bool {
        self.settle(to)
    }
}
