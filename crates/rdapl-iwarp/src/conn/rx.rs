//! The receive side of an established connection: FPDUs in, checked,
//! placed and reported.
//!
//! * Every length and offset from the wire is checked before a
//!   placement; payload lands only inside the region or the receive.
//! * Data is placed as it arrives; completions wait for the CRC check.
//! * Bad input yields an error and a Terminate, never a panic.

use crate::ddp::{self, Buffer, DdpHeader};
use crate::error::{MpaError, ProtocolError};
use crate::fpdu::FpduEvent;
use crate::mem::{Access, Memory, Place};
use crate::rdmap::{self, Opcode, READ_REQUEST_LEN, ReadRequest};
use crate::setup::Rtr;
use crate::terminate::{MAX_TERMINATE_BODY, Terminate};

use super::{Connection, Event, RecvProgress, RespJob, RxKind, State, TaggedProgress};

impl Connection {
    /// Feeds bytes read from TCP. All of `data` is consumed (bytes after a
    /// fatal error are dropped). `now` is the caller's clock in ms.
    pub fn handle_input<M: Memory + ?Sized>(&mut self, now: u64, mut data: &[u8], mem: &mut M) {
        self.now = self.now.max(now);
        while !data.is_empty() {
            match self.state {
                State::Closed | State::Terminating => return,
                State::Idle | State::AwaitAccept => {
                    // The initiator must not send before our Reply.
                    self.setup_failed(MpaError::TrailingBytes);
                    return;
                }
                State::AwaitRequest | State::AwaitReply => self.mpa_input(&mut data),
                State::AwaitRtr | State::Established => {
                    if let Err(e) = self.fpdu_input(&mut data, mem) {
                        self.fail(e);
                        return;
                    }
                }
            }
        }
    }

    /// Direct placement: while the FPDU being received has payload left
    /// that goes to memory (a Send's receive, an RDMA Write's or a Read
    /// Response's region), where its next byte goes and how many bytes of
    /// the FPDU's payload are still due. Its header was checked in full:
    /// the range `[place, place + due)` lies inside what
    /// [`Memory::lookup`] returned or the posted receive's capacity. A
    /// caller that reads its transport straight into that memory then
    /// reports the bytes with [`Connection::handle_placed`] instead of
    /// feeding them to [`Connection::handle_input`]: no intermediate copy.
    pub fn rx_direct(&self) -> Option<(Place, u32)> {
        if !matches!(self.state, State::AwaitRtr | State::Established) {
            return None;
        }
        let due = self.decoder.payload_left();
        if due == 0 || matches!(self.rx_kind, None | Some(RxKind::ReadReq | RxKind::Term)) {
            return None;
        }
        let due = u32::try_from(due).ok()?;
        self.rx_place.map(|p| (p, due))
    }

    /// Whether an FPDU with header `h`, arriving now at an FPDU boundary,
    /// takes a posted receive: the first segment of a Send that nothing
    /// else refuses (versions, opcode, queue, MSN and offset right, no
    /// Send under way, not the RTR). Whether a receive is posted does not
    /// count. A caller that holds a Send back until a receive is posted
    /// holds only these: any other untagged segment is fed at once, and
    /// one that is malformed meets its error (and Terminate) then, not
    /// after the wait.
    pub fn needs_recv(&self, h: &DdpHeader) -> bool {
        let Buffer::Untagged { qn, msn, mo, .. } = h.buffer else {
            return false;
        };
        self.state == State::Established
            && h.ddp_version == ddp::DDP_VERSION
            && h.rdmap_version == ddp::RDMAP_VERSION
            && Opcode::from_u8(h.opcode).is_some_and(Opcode::is_send)
            && qn == rdmap::QN_SEND
            && msn == self.rx_msn[0]
            && mo == 0
            && self.rx_send.is_none()
    }

    /// The caller stored `data`, the next payload bytes of the FPDU being
    /// received, at the place [`Connection::rx_direct`] named: they count
    /// as if [`Connection::handle_input`] had placed them (CRC, offsets),
    /// and [`Memory::place`] is not called. False, and nothing taken, if
    /// no direct placement is due or `data` is longer than what is due.
    pub fn handle_placed(&mut self, now: u64, data: &[u8]) -> bool {
        self.now = self.now.max(now);
        if data.is_empty() {
            return true;
        }
        match self.rx_direct() {
            Some((_, due)) if data.len() <= due as usize => {}
            _ => return false,
        }
        if !self.decoder.take_payload(data) {
            return false;
        }
        if let Some(p) = self.rx_place.as_mut() {
            advance(p, data.len());
        }
        true
    }

    fn fpdu_input<M: Memory + ?Sized>(
        &mut self,
        data: &mut &[u8],
        mem: &mut M,
    ) -> Result<(), ProtocolError> {
        loop {
            if matches!(self.state, State::Closed | State::Terminating) {
                *data = &[];
                return Ok(());
            }
            // A whole FPDU (the usual case: a provider feeds one at a
            // time) skips the event path's steps; the same checks, in the
            // same order.
            if let Some(w) = self.decoder.whole(data) {
                *data = &data[w.len..];
                self.begin_fpdu(w.header, w.payload.len() as u16, mem)?;
                if !w.payload.is_empty() {
                    self.on_payload(w.payload, mem);
                }
                self.decoder.end_whole(&w)?;
                self.end_fpdu(mem)?;
                if data.is_empty() {
                    return Ok(());
                }
                continue;
            }
            match self.decoder.next(data)? {
                None => return Ok(()),
                Some(FpduEvent::Header {
                    header,
                    payload_len,
                    ..
                }) => self.begin_fpdu(header, payload_len, mem)?,
                Some(FpduEvent::Payload(chunk)) => self.on_payload(chunk, mem),
                Some(FpduEvent::End) => self.end_fpdu(mem)?,
            }
        }
    }

    /// An FPDU's header is in: kept raw (a Terminate quotes it), then
    /// checked and acted on.
    fn begin_fpdu<M: Memory + ?Sized>(
        &mut self,
        h: DdpHeader,
        payload_len: u16,
        mem: &mut M,
    ) -> Result<(), ProtocolError> {
        let raw = self.decoder.raw_header();
        self.rx_raw[..raw.len()].copy_from_slice(raw);
        self.rx_raw_len = raw.len();
        self.collect_len = 0;
        self.on_header(h, payload_len, mem)
    }

    /// An FPDU ended, its CRC checked: acted on, then forgotten.
    fn end_fpdu<M: Memory + ?Sized>(&mut self, mem: &mut M) -> Result<(), ProtocolError> {
        self.on_end(mem)?;
        self.rx_raw_len = 0;
        self.rx_kind = None;
        Ok(())
    }

    fn on_header<M: Memory + ?Sized>(
        &mut self,
        h: DdpHeader,
        payload_len: u16,
        mem: &mut M,
    ) -> Result<(), ProtocolError> {
        let tagged = h.tagged();
        if h.ddp_version != ddp::DDP_VERSION {
            return Err(ProtocolError::DdpVersion {
                tagged,
                version: h.ddp_version,
            });
        }
        if h.rdmap_version != ddp::RDMAP_VERSION {
            return Err(ProtocolError::RdmapVersion(h.rdmap_version));
        }
        let op = Opcode::from_u8(h.opcode).filter(|o| o.tagged() == tagged);
        let Some(op) = op else {
            return Err(ProtocolError::Opcode {
                opcode: h.opcode,
                tagged,
            });
        };
        let len = u64::from(payload_len);
        let awaiting_rtr = (self.state == State::AwaitRtr)
            .then(|| self.neg.and_then(|n| n.rtr))
            .flatten();
        if let Some(rtr) = awaiting_rtr {
            let ok = match (rtr, op) {
                (Rtr::Write, Opcode::Write) | (Rtr::Send, Opcode::Send) => {
                    payload_len == 0 && h.last
                }
                (Rtr::Read, Opcode::ReadRequest) => true,
                _ => false,
            };
            if !ok {
                return Err(ProtocolError::RtrMismatch);
            }
        }
        self.rx_place = None;
        match h.buffer {
            Buffer::Tagged { stag, to } if op == Opcode::Write => {
                let region = if let Some(p) = self.rx_tagged {
                    if p.stag != stag {
                        return Err(ProtocolError::SinkStag {
                            stag,
                            err: crate::error::StagError::Invalid,
                        });
                    }
                    if p.next_to != to {
                        return Err(ProtocolError::SinkBounds { stag, to, len });
                    }
                    p.region
                } else if payload_len == 0 && h.last {
                    self.rx_kind = Some(RxKind::ZeroWrite);
                    return Ok(());
                } else {
                    mem.lookup(stag, Access::RemoteWrite)
                        .map_err(|err| ProtocolError::SinkStag { stag, err })?
                };
                ddp::check_bounds(region.base, region.len, to, len).map_err(|e| match e {
                    ddp::BoundsError::Wrap => ProtocolError::SinkToWrap { to, len },
                    ddp::BoundsError::OutOfBounds => ProtocolError::SinkBounds { stag, to, len },
                })?;
                self.rx_tagged = Some(TaggedProgress {
                    stag,
                    next_to: to + len,
                    region,
                });
                self.rx_place = Some(Place::Tagged { stag, to });
                self.rx_kind = Some(RxKind::Write { last: h.last });
            }
            Buffer::Tagged { stag, to } => {
                // Read Response: must match the oldest outstanding read, and
                // may not cut into an unfinished Write.
                if self.rx_tagged.is_some() {
                    return Err(ProtocolError::UnexpectedReadResponse);
                }
                let Some(head) = self.orq.front_mut() else {
                    return Err(ProtocolError::UnexpectedReadResponse);
                };
                if head.rr.sink_stag != stag {
                    return Err(ProtocolError::SinkStag {
                        stag,
                        err: crate::error::StagError::Invalid,
                    });
                }
                let expect_to = head.rr.sink_to.checked_add(u64::from(head.received));
                let end = u64::from(head.received) + len;
                // siw (Linux 6.1) may answer a zero-length read with the
                // bytes of the SGE its transmitter used last (siw_activate_tx
                // keeps it). Such a read places nothing: the bytes, at
                // following TOs, are dropped (tests/siw_quirks.rs).
                let zero = head.rr.size == 0;
                let bad = expect_to != Some(to)
                    || (!zero && end > u64::from(head.rr.size))
                    || (!zero && h.last && end != u64::from(head.rr.size));
                if bad {
                    return Err(ProtocolError::SinkBounds { stag, to, len });
                }
                // siw sends those stale bytes from the buffer itself
                // (zero-copy), which its application may be writing
                // meanwhile: their CRC may not match. Nothing of the frame
                // is placed and its header matched the read in full (STag,
                // TO), so its CRC is not checked; every other frame's is.
                if zero && payload_len > 0 {
                    self.decoder.waive_crc();
                }
                if payload_len > 0 && !zero {
                    let region = match head.region {
                        Some(r) => r,
                        None => {
                            let r = mem
                                .lookup(stag, Access::LocalWrite)
                                .map_err(|err| ProtocolError::SinkStag { stag, err })?;
                            head.region = Some(r);
                            r
                        }
                    };
                    ddp::check_bounds(region.base, region.len, to, len).map_err(|e| match e {
                        ddp::BoundsError::Wrap => ProtocolError::SinkToWrap { to, len },
                        ddp::BoundsError::OutOfBounds => {
                            ProtocolError::SinkBounds { stag, to, len }
                        }
                    })?;
                    self.rx_place = Some(Place::Tagged { stag, to });
                }
                self.rx_kind = Some(RxKind::ReadResp {
                    last: h.last,
                    len: payload_len,
                });
            }
            Buffer::Untagged {
                rsvd_ulp,
                qn,
                msn,
                mo,
            } => {
                if op.queue() != Some(qn) {
                    return Err(ProtocolError::InvalidQn(qn));
                }
                match op {
                    Opcode::ReadRequest => {
                        let expected = self.rx_msn[1];
                        if msn != expected {
                            return Err(ProtocolError::MsnRange {
                                qn,
                                expected,
                                got: msn,
                            });
                        }
                        if mo != 0 {
                            return Err(ProtocolError::InvalidMo {
                                qn,
                                expected: 0,
                                got: mo,
                            });
                        }
                        self.rx_kind = Some(RxKind::ReadReq);
                        if !h.last || usize::from(payload_len) != READ_REQUEST_LEN {
                            return Err(ProtocolError::MalformedReadRequest(payload_len));
                        }
                    }
                    Opcode::Terminate => {
                        if msn != 1 || mo != 0 || !h.last {
                            return Err(ProtocolError::BogusTerminate);
                        }
                        if usize::from(payload_len) > MAX_TERMINATE_BODY {
                            return Err(ProtocolError::BogusTerminate);
                        }
                        self.rx_kind = Some(RxKind::Term);
                    }
                    _ => {
                        let expected = self.rx_msn[0];
                        if msn != expected {
                            return Err(ProtocolError::MsnRange {
                                qn,
                                expected,
                                got: msn,
                            });
                        }
                        let p = match self.rx_send {
                            Some(p) => {
                                if p.op != op {
                                    return Err(ProtocolError::Opcode {
                                        opcode: h.opcode,
                                        tagged,
                                    });
                                }
                                p
                            }
                            None => {
                                if awaiting_rtr == Some(Rtr::Send) && mo == 0 {
                                    self.rx_kind = Some(RxKind::RtrSend);
                                    return Ok(());
                                }
                                if mo != 0 {
                                    return Err(ProtocolError::InvalidMo {
                                        qn,
                                        expected: 0,
                                        got: mo,
                                    });
                                }
                                let Some((wr_id, capacity)) = self.recvs.pop_front() else {
                                    return Err(ProtocolError::NoBuffer { msn });
                                };
                                let p = RecvProgress {
                                    wr_id,
                                    capacity,
                                    offset: 0,
                                    op,
                                    inval: rsvd_ulp,
                                };
                                self.rx_send = Some(p);
                                p
                            }
                        };
                        if mo != p.offset {
                            return Err(ProtocolError::InvalidMo {
                                qn,
                                expected: p.offset,
                                got: mo,
                            });
                        }
                        let end = u64::from(p.offset) + len;
                        if end > u64::from(p.capacity) {
                            return Err(ProtocolError::MessageTooLong {
                                capacity: p.capacity,
                                end,
                            });
                        }
                        self.rx_place = Some(Place::Recv {
                            wr_id: p.wr_id,
                            offset: p.offset,
                        });
                        self.rx_kind = Some(RxKind::Send {
                            last: h.last,
                            len: payload_len,
                        });
                    }
                }
            }
        }
        Ok(())
    }

    fn on_payload<M: Memory + ?Sized>(&mut self, chunk: &[u8], mem: &mut M) {
        match self.rx_kind {
            Some(RxKind::ReadReq) | Some(RxKind::Term) => {
                // Lengths were checked at the header: this always fits.
                let n = chunk.len().min(self.collect.len() - self.collect_len);
                self.collect[self.collect_len..self.collect_len + n].copy_from_slice(&chunk[..n]);
                self.collect_len += n;
            }
            _ => {
                if let Some(p) = self.rx_place.as_mut() {
                    mem.place(p, chunk);
                    advance(p, chunk.len());
                }
            }
        }
    }

    fn on_end<M: Memory + ?Sized>(&mut self, mem: &mut M) -> Result<(), ProtocolError> {
        self.peer_spoke = true;
        match self.rx_kind {
            None | Some(RxKind::ZeroWrite) => {}
            Some(RxKind::Write { last, .. }) => {
                if last {
                    self.rx_tagged = None;
                }
            }
            Some(RxKind::ReadResp { last, len }) => {
                if let Some(head) = self.orq.front_mut() {
                    head.received = head.received.saturating_add(u32::from(len));
                    if last {
                        let done = self.orq.pop_front();
                        if let Some(d) = done.filter(|d| !d.internal) {
                            self.events.push_back(Event::ReadComplete {
                                wr_id: d.wr_id,
                                len: d.rr.size,
                            });
                        }
                    }
                }
            }
            Some(RxKind::Send { last, len }) => {
                if let Some(p) = self.rx_send.as_mut() {
                    p.offset += u32::from(len);
                    if last {
                        let p = *p;
                        // Invalidated before the receive is let go: if that
                        // fails, the receive is still held and is flushed.
                        let invalidated = if p.op.invalidates() {
                            mem.invalidate(p.inval).map_err(|err| {
                                ProtocolError::CannotInvalidate { stag: p.inval, err }
                            })?;
                            // A tagged message under way through that STag
                            // does not go on with the region looked up
                            // before: its next segment looks the STag up
                            // again (and is refused).
                            if self.rx_tagged.is_some_and(|t| t.stag == p.inval) {
                                self.rx_tagged = None;
                            }
                            if let Some(h) = self.orq.front_mut()
                                && h.rr.sink_stag == p.inval
                            {
                                h.region = None;
                            }
                            Some(p.inval)
                        } else {
                            None
                        };
                        self.rx_send = None;
                        self.rx_msn[0] = self.rx_msn[0].wrapping_add(1);
                        self.events.push_back(Event::RecvComplete {
                            wr_id: p.wr_id,
                            len: p.offset,
                            solicited: p.op.solicited(),
                            invalidated,
                        });
                    }
                }
            }
            Some(RxKind::RtrSend) => {
                self.rx_msn[0] = self.rx_msn[0].wrapping_add(1);
            }
            Some(RxKind::ReadReq) => {
                let rr = ReadRequest::decode(&self.collect[..self.collect_len])
                    .ok_or(ProtocolError::MalformedReadRequest(self.collect_len as u16))?;
                if self.state == State::AwaitRtr && rr.size != 0 {
                    return Err(ProtocolError::RtrMismatch);
                }
                let ird = self.neg.map_or(0, |n| n.ird);
                if self.resp.len() >= usize::from(ird) {
                    return Err(ProtocolError::TooManyReads { ird });
                }
                if rr.size > 0 {
                    let (stag, to, len) = (rr.src_stag, rr.src_to, u64::from(rr.size));
                    let region = mem
                        .lookup(stag, Access::RemoteRead)
                        .map_err(|err| ProtocolError::SourceStag { stag, err })?;
                    ddp::check_bounds(region.base, region.len, to, len).map_err(|e| match e {
                        ddp::BoundsError::Wrap => ProtocolError::SourceToWrap { to, len },
                        ddp::BoundsError::OutOfBounds => {
                            ProtocolError::SourceBounds { stag, to, len }
                        }
                    })?;
                    rr.sink_to
                        .checked_add(len)
                        .ok_or(ProtocolError::SinkToWrap {
                            to: rr.sink_to,
                            len,
                        })?;
                }
                self.rx_msn[1] = self.rx_msn[1].wrapping_add(1);
                self.resp.push_back(RespJob { rr, offset: 0 });
            }
            Some(RxKind::Term) => {
                match Terminate::decode(&self.collect[..self.collect_len]) {
                    Ok(t) => self.events.push_back(Event::TerminateReceived(t)),
                    Err(_) => self
                        .events
                        .push_back(Event::Error(ProtocolError::BogusTerminate.into())),
                }
                self.flush_all();
                self.finish_close();
                return Ok(());
            }
        }
        if self.state == State::AwaitRtr {
            self.state = State::Established;
            self.deadline = None;
            if let (Some(neg), Some(req)) = (self.neg, self.request.take()) {
                self.events.push_back(Event::Established {
                    params: neg,
                    private_data: req.private_data,
                });
            }
        }
        Ok(())
    }
}

/// Moves a placement past `n` bytes (checked at the FPDU's header: the
/// sums stay inside the region or the receive).
fn advance(p: &mut Place, n: usize) {
    match p {
        Place::Tagged { to, .. } => *to += n as u64,
        Place::Recv { offset, .. } => *offset += n as u32,
    }
}
