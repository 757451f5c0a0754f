//! The requests of a connection: taking work requests from the core,
//! handing them to the engine, fencing bursts, and completing each one
//! exactly once, in post order per queue.
//!
//! * A Send or Write of at most `INLINE_MAX` bytes is copied at post and
//!   handed to the engine inline; a longer one is staged (its list held by
//!   reference, an owned buffer gathered) until the engine framed it.
//! * A Send or Write completes once placed: a zero-length RDMA Read (a
//!   fence) follows each burst, and its response proves placement.
//! * A peer's Terminate completes the request it names with the error,
//!   those before it successfully, and flushes those after it.

use crate::memory::{Sink, Staged};
use crate::params::Completion;
use rdapl::provider::{EpInner, Wr, WrKind};
use rdapl::{CompletionFlags, DtoStatus};
use rdapl_iwarp::fpdu::INLINE_MAX;
use rdapl_iwarp::terminate::{ddp as tddp, layer, rdmap as trdmap};
use rdapl_iwarp::{Buffer, DdpHeader, ReadRequest, State, Terminate};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Conn, MAX_INFLIGHT, MAX_STAGED, Phase, Slot, SlotKind, total_len};

/// Most reads (fences included) outstanding before a burst of sends waits
/// for one of them to come back rather than get a fence of its own (see
/// `fence_now` for the rule below it).
const MAX_FENCES: usize = 4;

/// Sends and Writes of one burst after which a fence may go out before
/// the burst's end (`Conn::pull`; `fence_now` decides), counting those
/// shorter than [`BURST_FENCE_LONG`] only.
const BURST_FENCE_COUNT: usize = 4;

/// A Send or Write this long moves so much between two fences that an
/// earlier fence gains nothing: streams of such messages ran slower with
/// a fence every four (the figures are in the commit that set this).
const BURST_FENCE_LONG: u64 = 256 << 10;

/// Whether a fence goes out behind `uncovered` (> 0) Sends and Writes
/// while `outstanding` reads will complete `covered` earlier ones, on a
/// connection whose ORD is `ord` (see `Conn::maybe_fence`): a read beyond
/// the ORD would hold every request behind it until a response came.
fn fence_now(outstanding: usize, uncovered: usize, covered: usize, ord: usize) -> bool {
    outstanding == 0 || (outstanding < MAX_FENCES.min(ord) && uncovered >= covered)
}

/// The STag a fence's zero-length read names (never looked up).
const FENCE_STAG: u32 = 1;

impl Conn {
    pub(super) fn next_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// A receive was posted: a stalled Send may go on.
    pub fn recv_posted(&mut self, now: u64) {
        if self.stall_since.is_some() {
            self.pump(now);
        }
    }

    pub(super) fn established_engine(&self) -> bool {
        self.engine
            .as_ref()
            .is_some_and(|e| e.state() == State::Established)
    }

    /// Takes the core's queued requests and hands them to the engine.
    pub(super) fn pull(&mut self) {
        if self.dat_conn == 0 || self.phase != Phase::Open || !self.established_engine() {
            return;
        }
        let Some(ep) = self.ep.clone() else {
            return;
        };
        // A long burst gets its fences as it goes, not one at its end: the
        // first part completes (and its sender refills) while the rest is
        // on its way.
        let mut count = 0usize;
        while self.slots.len() < MAX_INFLIGHT && self.mem.staged_bytes < MAX_STAGED {
            let wr = {
                let mut c = ep.lock();
                if c.connection() != self.dat_conn {
                    return;
                }
                match c.pop_send() {
                    Some(w) => w,
                    None => break,
                }
            };
            if !self.post(&ep, wr) {
                break;
            }
            if let Some(s) = self.slots.back()
                && matches!(s.kind, SlotKind::Send { .. } | SlotKind::Write { .. })
                && s.len < BURST_FENCE_LONG
            {
                count += 1;
                if count >= BURST_FENCE_COUNT {
                    self.maybe_fence();
                    count = 0;
                }
            }
        }
        self.maybe_fence();
    }

    /// Hands one request to the engine; false if the connection broke.
    fn post(&mut self, ep: &Arc<EpInner>, wr: Wr) -> bool {
        let id = self.next_id();
        let kind = wr.kind();
        let mut slot = Slot {
            id,
            kind: SlotKind::Local,
            wr: None,
            len: 0,
            sent: false,
            sent_at: 0,
            status: None,
        };
        let posted = match kind {
            WrKind::Local => {
                slot.wr = Some(wr);
                self.push_slot(slot);
                self.complete_ready();
                return true;
            }
            WrKind::Send | WrKind::SendInvalidate(_) | WrKind::RdmaWrite(_) => {
                // A short payload is copied now and posted inline (framed
                // with its header in one run, nothing staged); a longer
                // list is held by reference, an owned buffer gathered.
                let inline = total_len(&wr) <= INLINE_MAX as u64;
                let staged = if inline {
                    self.inline_buf.clear();
                    ep.gather(&wr, &mut self.inline_buf).map(|()| None)
                } else {
                    match ep.gather_ref(&wr) {
                        Ok(Some(g)) => Ok(Some(Staged::Held(Arc::new(g)))),
                        Ok(None) => {
                            let mut data =
                                self.out.freed.pop().unwrap_or_else(|| self.mem.take_buf());
                            ep.gather(&wr, &mut data)
                                .map(|()| Some(Staged::Copied(Arc::new(data))))
                        }
                        Err(st) => Err(st),
                    }
                };
                let staged = match staged {
                    Ok(s) => s,
                    Err(st) => {
                        slot.status = Some(st);
                        slot.wr = Some(wr);
                        self.push_slot(slot);
                        self.break_local();
                        return false;
                    }
                };
                let n = match &staged {
                    Some(Staged::Held(g)) => g.len(),
                    Some(Staged::Copied(d)) => d.len(),
                    None => self.inline_buf.len(),
                };
                let Ok(len) = u32::try_from(n) else {
                    slot.status = Some(DtoStatus::LocalLength);
                    slot.wr = Some(wr);
                    self.push_slot(slot);
                    self.break_local();
                    return false;
                };
                slot.len = u64::from(len);
                if let Some(s) = staged {
                    self.mem.stage(id, s);
                }
                let data = inline.then_some(&self.inline_buf[..]);
                let Some(e) = self.engine.as_mut() else {
                    return false;
                };
                let r = match kind {
                    WrKind::RdmaWrite(rt) => {
                        slot.kind = SlotKind::Write {
                            stag: rt.rmr_context,
                            to: rt.target_address,
                            len: u64::from(len),
                        };
                        match data {
                            Some(d) => {
                                e.post_write_inline(id, d, rt.rmr_context, rt.target_address)
                            }
                            None => e.post_write(id, len, rt.rmr_context, rt.target_address),
                        }
                    }
                    _ => {
                        slot.kind = SlotKind::Send { msn: self.send_msn };
                        self.send_msn = self.send_msn.wrapping_add(1);
                        let se = wr.flags().contains(CompletionFlags::SOLICITED_WAIT);
                        let inval = match kind {
                            WrKind::SendInvalidate(k) => Some(k),
                            _ => None,
                        };
                        match (data, inval) {
                            (Some(d), _) => e.post_send_inline(id, d, se, inval),
                            (None, Some(k)) => e.post_send_inv(id, len, k, se),
                            (None, None) if se => e.post_send_se(id, len),
                            (None, None) => e.post_send(id, len),
                        }
                    }
                };
                slot.wr = Some(wr);
                r
            }
            WrKind::RdmaRead(rt) => {
                let total = total_len(&wr);
                let Ok(size) = u32::try_from(total) else {
                    slot.status = Some(DtoStatus::LocalLength);
                    slot.wr = Some(wr);
                    self.push_slot(slot);
                    self.break_local();
                    return false;
                };
                let sink = self.alloc_sink();
                slot.kind = SlotKind::Read {
                    msn: self.read_msn,
                    sink,
                };
                self.read_msn = self.read_msn.wrapping_add(1);
                slot.len = total;
                self.mem.sinks.insert(
                    sink,
                    Sink {
                        wr,
                        len: total,
                        status: None,
                    },
                );
                let rr = ReadRequest {
                    sink_stag: sink,
                    sink_to: 0,
                    size,
                    src_stag: rt.rmr_context,
                    src_to: rt.target_address,
                };
                match self.engine.as_mut() {
                    Some(e) => e.post_read(id, rr),
                    None => return false,
                }
            }
        };
        let ok = posted.is_ok();
        if let Err(e) = &posted {
            // A remote range that wraps the address space names memory the
            // peer cannot grant: a remote access error, as the target's
            // check would give (and the loopback gives); anything else is
            // this endpoint's.
            slot.status = Some(if matches!(e, rdapl_iwarp::PostError::Wrap) {
                DtoStatus::RemoteAccess
            } else {
                DtoStatus::LocalEp
            });
        }
        self.push_slot(slot);
        if !ok {
            self.break_local();
        }
        ok
    }

    fn alloc_sink(&mut self) -> u32 {
        loop {
            let s = self.next_sink;
            self.next_sink = self.next_sink.wrapping_add(1).max(2);
            if !self.mem.sinks.contains_key(&s) {
                return s;
            }
        }
    }

    /// Posts a zero-length read behind Sends and Writes that no read
    /// covers: at once if no read is outstanding; else only while fewer
    /// than [`MAX_FENCES`] are and the uncovered requests are at least as
    /// many as those the outstanding reads will complete (the response to
    /// the last of them leads here again). A few small windows get a fence
    /// each instead of waiting a round trip for the one before; a stream
    /// that refills its window one completion at a time gets fences over
    /// batches that double, not one a request; a burst of small requests
    /// taken at once is looked at every [`BURST_FENCE_COUNT`] of them
    /// (`Conn::pull`), so its first part completes while the rest travels.
    fn maybe_fence(&mut self) {
        if self.complete == Completion::Sent || !self.fence_due {
            return;
        }
        // Sends and Writes behind the newest read, and those before it
        // that outstanding reads will complete.
        let (mut uncovered, mut covered) = (0usize, 0usize);
        let mut outstanding = 0;
        let mut seen_read = false;
        for s in self.slots.iter().rev() {
            match s.kind {
                SlotKind::Read { .. } | SlotKind::Fence { .. } => {
                    seen_read = true;
                    if s.status.is_none() {
                        outstanding += 1;
                    }
                }
                SlotKind::Send { .. } | SlotKind::Write { .. } if s.status.is_none() => {
                    if seen_read {
                        covered += 1;
                    } else {
                        uncovered += 1;
                    }
                }
                _ => {}
            }
        }
        if uncovered == 0 {
            self.fence_due = false;
            return;
        }
        let ord = self.ord().unwrap_or(1);
        if !fence_now(outstanding, uncovered, covered, ord) {
            return; // (the next response leads here again)
        }
        if self.post_zero_read().is_some() {
            self.fence_due = false;
            self.stats.fences.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Asks an idle peer whether it is there (`conn/liveness.rs`): a
    /// zero-length read, answered by a live peer's provider and
    /// acknowledged by its kernel. Only on a connection with no request
    /// outstanding, so it is the head of the queue; no completion waits
    /// for its answer (see [`Conn::complete_ready`]).
    /// Returns the heartbeat's request id.
    pub(super) fn heartbeat(&mut self) -> Option<u64> {
        if !self.slots.is_empty() || !self.may_read() {
            return None;
        }
        let id = self.post_zero_read()?;
        self.stats.heartbeats.fetch_add(1, Ordering::Relaxed);
        Some(id)
    }

    /// The negotiated ORD lets this side post reads.
    pub(super) fn may_read(&self) -> bool {
        self.ord().is_some_and(|ord| ord > 0)
    }

    /// The ORD negotiated at set-up (reads of ours outstanding at once).
    fn ord(&self) -> Option<usize> {
        let n = self.engine.as_ref()?.negotiated()?;
        Some(usize::from(n.ord))
    }

    /// Posts a zero-length RDMA Read (a fence or a heartbeat): its
    /// response says the peer took everything sent before it. Returns its
    /// request id.
    fn post_zero_read(&mut self) -> Option<u64> {
        let id = self.next_id();
        let rr = ReadRequest {
            sink_stag: FENCE_STAG,
            sink_to: 0,
            size: 0,
            src_stag: FENCE_STAG,
            src_to: 0,
        };
        let e = self.engine.as_mut()?;
        e.post_read(id, rr).ok()?;
        self.push_slot(Slot {
            id,
            kind: SlotKind::Fence { msn: self.read_msn },
            wr: None,
            len: 0,
            sent: false,
            sent_at: 0,
            status: None,
        });
        self.read_msn = self.read_msn.wrapping_add(1);
        Some(id)
    }

    /// Completes requests from the head while their outcome is known (a
    /// memory operation runs when it reaches the head). Behind a flushed
    /// request every later one is flushed too, whatever it was to be (a
    /// Send handed to TCP behind a read the ended connection never
    /// answered): no success follows a flush in an endpoint's stream.
    ///
    /// A heartbeat is nobody's request: what was posted behind it
    /// completes as if it were not there (a stopped peer process never
    /// answers it, and with [`Completion::Sent`] a Send written behind it
    /// is complete), and its flush flushes nothing else. It stays at the
    /// head until its answer comes or the connection ends.
    pub(super) fn complete_ready(&mut self) {
        let Some(ep) = self.ep.clone() else {
            return;
        };
        let mut aside = None;
        if let Some(s) = self.slots.front()
            && self.heartbeat_sent.is_some_and(|(id, _)| id == s.id)
        {
            if s.status.is_some() {
                self.pop_slot();
            } else {
                aside = self.slots.pop_front();
            }
        }
        self.complete_head(&ep);
        if let Some(h) = aside {
            self.slots.push_front(h);
        }
    }

    /// [`Conn::complete_ready`] from the queue's head.
    fn complete_head(&mut self, ep: &Arc<EpInner>) {
        while let Some(s) = self.slots.front() {
            if s.kind == SlotKind::Local && s.status.is_none() && !self.flushing {
                let mut s = self.pop_slot().expect("front exists");
                if let Some(wr) = s.wr.take() {
                    ep.execute_local(wr);
                }
                continue;
            }
            if s.status.is_none() {
                break;
            }
            let mut s = self.pop_slot().expect("front exists");
            let mut st = s.status.unwrap_or(DtoStatus::Flushed);
            if st == DtoStatus::Flushed {
                self.flushing = true;
            } else if self.flushing {
                st = DtoStatus::Flushed;
            }
            let len = if st == DtoStatus::Success { s.len } else { 0 };
            let wr = match s.kind {
                SlotKind::Read { sink, .. } => self.mem.sinks.remove(&sink).map(|k| k.wr),
                _ => s.wr.take(),
            };
            if let Some(wr) = wr {
                ep.complete(wr, st, len);
                self.delivered += 1;
                self.flushed += u64::from(st == DtoStatus::Flushed);
            }
        }
    }

    /// Queues a request's slot. Ids only grow, so the queue stays sorted
    /// by id and is searched by halving ([`Conn::slot_index`]).
    fn push_slot(&mut self, slot: Slot) {
        debug_assert!(self.slots.back().is_none_or(|b| b.id < slot.id));
        match slot.kind {
            SlotKind::Send { .. } | SlotKind::Write { .. } => self.fence_due = true,
            SlotKind::Read { .. } | SlotKind::Fence { .. } => self.reads_queued += 1,
            SlotKind::Local => {}
        }
        self.slots.push_back(slot);
    }

    /// Takes the oldest request's slot.
    pub(super) fn pop_slot(&mut self) -> Option<Slot> {
        let s = self.slots.pop_front()?;
        if matches!(s.kind, SlotKind::Read { .. } | SlotKind::Fence { .. }) {
            self.reads_queued -= 1;
        }
        if self.heartbeat_sent.is_some_and(|(id, _)| id == s.id) {
            self.heartbeat_sent = None;
        }
        Some(s)
    }

    fn slot_index(&self, id: u64) -> Option<usize> {
        self.slots.binary_search_by_key(&id, |s| s.id).ok()
    }

    pub(super) fn slot_mut(&mut self, id: u64) -> Option<&mut Slot> {
        let i = self.slot_index(id)?;
        self.slots.get_mut(i)
    }

    /// A read (or fence) came back: it and everything before it is done.
    pub(super) fn read_done(&mut self, id: u64) {
        let Some(i) = self.slot_index(id) else {
            return;
        };
        let mut failed = false;
        let st = match self.slots[i].kind {
            SlotKind::Read { sink, .. } => {
                let st = self
                    .mem
                    .sinks
                    .get(&sink)
                    .and_then(|k| k.status)
                    .unwrap_or(DtoStatus::Success);
                failed = st != DtoStatus::Success;
                st
            }
            _ => DtoStatus::Success,
        };
        self.slots[i].status = Some(st);
        for s in self.slots.iter_mut().take(i) {
            if matches!(s.kind, SlotKind::Send { .. } | SlotKind::Write { .. })
                && s.status.is_none()
            {
                s.status = Some(DtoStatus::Success);
            }
        }
        self.complete_ready();
        if failed {
            self.break_local();
        } else {
            self.maybe_fence();
        }
    }

    /// The peer's Terminate names the request that failed.
    pub(super) fn terminated(&mut self, t: &Terminate) {
        let h = t.ddp.as_ref().and_then(|d| DdpHeader::decode(&d.header));
        let culprit = h.and_then(|h| {
            self.slots.iter().position(|s| {
                s.status.is_none()
                    && match (h.buffer, s.kind) {
                        (
                            Buffer::Tagged { stag, to },
                            SlotKind::Write {
                                stag: s2,
                                to: t2,
                                len,
                            },
                        ) => stag == s2 && to >= t2 && to <= t2.saturating_add(len),
                        (Buffer::Untagged { qn: 0, msn, .. }, SlotKind::Send { msn: m }) => {
                            msn == m
                        }
                        (
                            Buffer::Untagged { qn: 1, msn, .. },
                            SlotKind::Read { msn: m, .. } | SlotKind::Fence { msn: m },
                        ) => msn == m,
                        _ => false,
                    }
            })
        });
        // On `sent`, Sends and Writes complete once written: one the
        // Terminate names may have succeeded already, and then no other
        // request is to blame.
        let named = h.is_some() && self.complete == Completion::Sent;
        // A Terminate that names no message (a peer's local error while it
        // placed one, sent as "local catastrophic" without a DDP header):
        // the peer handles requests in order, so the oldest one it has not
        // confirmed is the one that failed.
        let culprit = culprit.or_else(|| {
            if named {
                return None;
            }
            self.slots
                .iter()
                .position(|s| s.status.is_none() && !matches!(s.kind, SlotKind::Fence { .. }))
        });
        let Some(i) = culprit else {
            return;
        };
        let c = t.code;
        let st = if (c.layer == layer::RDMAP && c.etype == trdmap::ETYPE_REMOTE_PROTECTION)
            || (c.layer == layer::DDP && c.etype == tddp::ETYPE_TAGGED)
        {
            DtoStatus::RemoteAccess
        } else if c.layer == layer::DDP
            && c.etype == tddp::ETYPE_UNTAGGED
            && c.ecode == tddp::UT_MSN_NOBUF
        {
            DtoStatus::ReceiverNotReady
        } else {
            DtoStatus::RemoteResponder
        };
        for s in self.slots.iter_mut().take(i) {
            if s.sent_unfinished() {
                s.status = Some(DtoStatus::Success);
            }
        }
        self.slots[i].status = Some(st);
    }
}

#[cfg(test)]
mod tests {
    use super::MAX_FENCES;

    fn fence_now(outstanding: usize, uncovered: usize, covered: usize) -> bool {
        super::fence_now(outstanding, uncovered, covered, 16)
    }

    #[test]
    fn fences_stay_within_the_ord() {
        // ORD 1: one read in flight, whatever is uncovered.
        assert!(super::fence_now(0, 1, 0, 1));
        assert!(!super::fence_now(1, 100, 1, 1));
        assert!(super::fence_now(1, 2, 2, 2));
        assert!(!super::fence_now(2, 4, 4, 2));
    }

    #[test]
    fn fences_cover_batches_that_double() {
        // Nothing outstanding: at once, whatever it covers.
        assert!(fence_now(0, 1, 0));
        // Two one-request windows: a fence each (no round trip lost).
        assert!(fence_now(1, 1, 1));
        // A window refilled one completion at a time: the next fence
        // waits until it covers as many as the outstanding ones do.
        assert!(!fence_now(2, 1, 2));
        assert!(fence_now(2, 2, 2));
        assert!(!fence_now(3, 3, 4));
        assert!(fence_now(3, 4, 4));
        // Never more than MAX_FENCES in flight.
        assert!(!fence_now(MAX_FENCES, 100, 1));
        // Simulated: a 16-request window refilled one at a time, no
        // response coming back meanwhile, takes a handful of fences.
        let (mut fences, mut covered, mut uncovered) = (0usize, 0usize, 0usize);
        for _ in 0..16 {
            uncovered += 1;
            if fence_now(fences, uncovered, covered) {
                fences += 1;
                covered += uncovered;
                uncovered = 0;
            }
        }
        assert_eq!((fences, covered + uncovered), (4, 16));
        assert!(covered >= 8, "{covered}");
    }
}
