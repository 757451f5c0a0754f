//! The transmit side: picking the next message (send queue or read
//! responses, never interleaving two of one kind), segmenting it into
//! FPDUs that fit the MSS, and reporting sends once framed.

use crate::crc::FpduCrc;
use crate::ddp::{self, DdpHeader, Segments};
use crate::error::ProtocolError;
use crate::fpdu::{self};
use crate::mem::{Memory, Source};
use crate::rdmap::{self, Opcode};

use super::{Connection, Event, OrqEntry, Role, SqEntry, SqKind, State, Transmit, TxPick};

impl Connection {
    /// The next bytes to write to TCP, in order. Payload bytes are named by
    /// [`Source`]; `mem` is read only to compute the CRC and to check that
    /// the source exists. A payload posted inline comes in the header
    /// (`payload` is `None`).
    pub fn poll_transmit<M: Memory + ?Sized>(&mut self, mem: &M) -> Option<Transmit> {
        if let Some(b) = self.out_mpa.pop_front() {
            return Some(Transmit::Mpa(b));
        }
        if let Some(t) = self.closing.pop_front() {
            return Some(t);
        }
        if let Some(t) = self.term_pending.take() {
            let mut body = Vec::with_capacity(t.encoded_len());
            t.encode(&mut body);
            let hdr = rdmap::untagged_header(Opcode::Terminate, true, 0, 1, 0);
            let out = self.inline_frame(&hdr, &body);
            self.finish_close();
            return out;
        }
        if self.state != State::Established {
            return None;
        }
        if self.role == Role::Responder && !self.peer_spoke {
            return None;
        }
        let pick = match self.cur_tx {
            Some(p) => p,
            None => {
                let ord = usize::from(self.neg.map_or(0, |n| n.ord));
                let sq_ready = self
                    .sq
                    .front()
                    .is_some_and(|e| !matches!(e.kind, SqKind::Read(_)) || self.orq.len() < ord);
                let resp_ready = !self.resp.is_empty();
                match (sq_ready, resp_ready) {
                    (false, false) => return None,
                    (true, false) => TxPick::Sq,
                    (false, true) => TxPick::Resp,
                    (true, true) => {
                        if self.last_pick == TxPick::Sq {
                            TxPick::Resp
                        } else {
                            TxPick::Sq
                        }
                    }
                }
            }
        };
        self.last_pick = pick;
        match self.segment(pick, mem) {
            Ok(t) => Some(t),
            Err(e) => {
                self.fail(e);
                self.poll_transmit(mem)
            }
        }
    }

    /// An FPDU whose whole ULPDU is `hdr` and `body` (no payload by
    /// reference), with the negotiated CRC.
    pub(super) fn inline_frame(&self, hdr: &DdpHeader, body: &[u8]) -> Option<Transmit> {
        let crc = self.neg.is_some_and(|n| n.crc);
        let header = fpdu::encode_header(hdr, body, 0).ok()?;
        let trailer = fpdu::encode_trailer(&header, &[], crc);
        Some(Transmit::Fpdu {
            header,
            payload: None,
            trailer,
        })
    }

    fn frame<M: Memory + ?Sized>(
        &self,
        hdr: &DdpHeader,
        inline: &[u8],
        src: Option<Source>,
        mem: &M,
    ) -> Result<Transmit, ProtocolError> {
        let crc = self.neg.is_some_and(|n| n.crc);
        let payload = src.filter(|s| !s.is_empty());
        let len = payload.map_or(0, |s| s.len() as usize);
        let header = fpdu::encode_header(hdr, inline, len)
            .map_err(|_| ProtocolError::Local("FPDU too long"))?;
        let mut c = crc.then(|| {
            let mut c = FpduCrc::new();
            c.update(&header);
            c
        });
        if let Some(s) = &payload {
            let mut got = 0usize;
            let found = mem.source_with(s, &mut |b| {
                got += b.len();
                if let Some(c) = c.as_mut() {
                    c.update(b);
                }
            });
            if !found {
                return Err(ProtocolError::Local("payload source missing"));
            }
            if got != len {
                return Err(ProtocolError::Local("payload source has the wrong length"));
            }
        }
        let trailer = fpdu::trailer_after(header.len(), len, c);
        Ok(Transmit::Fpdu {
            header,
            payload,
            trailer,
        })
    }

    /// The FPDU of bytes `offset..offset + len` of a Send's or Write's
    /// payload: from the entry itself when it was posted inline (header,
    /// payload and pad contiguous, one CRC pass), else from `mem`.
    fn frame_segment<M: Memory + ?Sized>(
        &self,
        hdr: &DdpHeader,
        e: &SqEntry,
        offset: u32,
        len: u32,
        mem: &M,
    ) -> Result<Transmit, ProtocolError> {
        match &e.inline {
            Some(p) => {
                let bytes = p
                    .get(offset, len)
                    .ok_or(ProtocolError::Local("inline payload has the wrong length"))?;
                self.inline_frame(hdr, bytes)
                    .ok_or(ProtocolError::Local("FPDU too long"))
            }
            None => {
                let src = Source::Local {
                    wr_id: e.wr_id,
                    offset,
                    len,
                };
                self.frame(hdr, &[], Some(src), mem)
            }
        }
    }

    fn segment<M: Memory + ?Sized>(
        &mut self,
        pick: TxPick,
        mem: &M,
    ) -> Result<Transmit, ProtocolError> {
        let mss = self.cfg.mss;
        match pick {
            TxPick::Resp => {
                let job = *self
                    .resp
                    .front()
                    .ok_or(ProtocolError::Local("no response"))?;
                let max = ddp::max_segment_payload(mss, ddp::TAGGED_HEADER_LEN);
                let seg = Segments::at(job.rr.size, max, job.offset);
                let to = job.rr.sink_to + u64::from(seg.offset);
                let hdr =
                    rdmap::tagged_header(Opcode::ReadResponse, seg.last, job.rr.sink_stag, to);
                let src = Source::Region {
                    stag: job.rr.src_stag,
                    to: job.rr.src_to + u64::from(seg.offset),
                    len: seg.len,
                };
                let t = self.frame(&hdr, &[], Some(src), mem)?;
                if seg.last {
                    self.resp.pop_front();
                    self.cur_tx = None;
                } else {
                    if let Some(j) = self.resp.front_mut() {
                        j.offset += seg.len;
                    }
                    self.cur_tx = Some(TxPick::Resp);
                }
                Ok(t)
            }
            TxPick::Sq => {
                let e = *self.sq.front().ok_or(ProtocolError::Local("no work"))?;
                let (t, last) = match e.kind {
                    SqKind::Read(rr) => {
                        let msn = self.tx_msn[1];
                        self.tx_msn[1] = msn.wrapping_add(1);
                        let hdr = rdmap::untagged_header(Opcode::ReadRequest, true, 0, msn, 0);
                        let t = self.frame(&hdr, &rr.encode(), None, mem)?;
                        self.orq.push_back(OrqEntry {
                            wr_id: e.wr_id,
                            rr,
                            received: 0,
                            internal: e.internal,
                            region: None,
                        });
                        (t, true)
                    }
                    SqKind::Send { op, inval } => {
                        let max = ddp::max_segment_payload(mss, ddp::UNTAGGED_HEADER_LEN);
                        let seg = Segments::at(e.len, max, e.offset);
                        let msn = if e.offset == 0 {
                            let m = self.tx_msn[0];
                            self.tx_msn[0] = m.wrapping_add(1);
                            m
                        } else {
                            e.msn
                        };
                        let hdr = rdmap::untagged_header(op, seg.last, inval, msn, seg.offset);
                        let t = self.frame_segment(&hdr, &e, seg.offset, seg.len, mem)?;
                        if let Some(h) = self.sq.front_mut() {
                            h.offset += seg.len;
                            h.msn = msn;
                        }
                        (t, seg.last)
                    }
                    SqKind::Write { stag, to } => {
                        let max = ddp::max_segment_payload(mss, ddp::TAGGED_HEADER_LEN);
                        let seg = Segments::at(e.len, max, e.offset);
                        let hdr = rdmap::tagged_header(
                            Opcode::Write,
                            seg.last,
                            stag,
                            to + u64::from(seg.offset),
                        );
                        let t = self.frame_segment(&hdr, &e, seg.offset, seg.len, mem)?;
                        if let Some(h) = self.sq.front_mut() {
                            h.offset += seg.len;
                        }
                        (t, seg.last)
                    }
                };
                if last {
                    self.sq.pop_front();
                    self.cur_tx = None;
                    if !e.internal && !matches!(e.kind, SqKind::Read(_)) {
                        self.events
                            .push_back(Event::SendComplete { wr_id: e.wr_id });
                    }
                } else {
                    self.cur_tx = Some(TxPick::Sq);
                }
                Ok(t)
            }
        }
    }
}
