//! Connection setup: the MPA Request and Reply (RFC 5044 with the
//! enhanced setup of RFC 6581), accept and reject with private data, and
//! the start of framing once both sides agreed.
//!
//! * Private data is bounded by the configured limit before it is kept.
//! * A malformed or refused setup ends the connection with an error
//!   event, never a panic.

use crate::error::{MpaError, PostError};
use crate::fpdu::FpduDecoder;
use crate::mpa::{self, Decoded, FrameKind, MpaFrame};
use crate::rdmap::{Opcode, ReadRequest};
use crate::setup::{self, ConnectRequest, Negotiated, Rtr};

use super::{Connection, Event, Role, SqEntry, SqKind, State};

impl Connection {
    /// Initiator: sends the MPA Request with `private_data` (the ULP part).
    pub fn connect(&mut self, now: u64, private_data: &[u8]) -> Result<(), PostError> {
        if self.role != Role::Initiator || self.state != State::Idle {
            return Err(PostError::InvalidState);
        }
        self.check_local_pd(private_data)?;
        self.now = now;
        let req = setup::build_request(&self.cfg.local(), private_data);
        self.out_mpa.push_back(req.to_vec()?);
        self.sent_request = Some(req);
        self.state = State::AwaitReply;
        self.deadline = self.cfg.reply_timeout_ms.map(|t| now.saturating_add(t));
        Ok(())
    }

    fn check_local_pd(&self, pd: &[u8]) -> Result<(), PostError> {
        let max = self.cfg.max_ulp_private_data();
        if pd.len() > max {
            return Err(MpaError::LocalPrivateDataTooLong { len: pd.len(), max }.into());
        }
        Ok(())
    }

    /// Responder: accepts the pending request, at `now`, with our ULP
    /// private data. `ird`/`ord` override the config's values for this
    /// connection. The wait for the RTR is timed from `now`: the consumer
    /// may have taken any time to decide.
    pub fn accept(
        &mut self,
        now: u64,
        private_data: &[u8],
        ird: Option<u16>,
        ord: Option<u16>,
    ) -> Result<(), PostError> {
        if self.state != State::AwaitAccept {
            return Err(PostError::InvalidState);
        }
        self.now = self.now.max(now);
        self.check_local_pd(private_data)?;
        let Some(req) = self.request.take() else {
            return Err(PostError::InvalidState);
        };
        let mut local = self.cfg.local();
        local.ird = ird.unwrap_or(local.ird);
        local.ord = ord.unwrap_or(local.ord);
        let (frame, neg) = setup::build_reply(&req, &local, true, private_data);
        self.out_mpa.push_back(frame.to_vec()?);
        let neg = neg.ok_or(PostError::InvalidState)?;
        self.start_framing(neg);
        if neg.rtr.is_some() {
            self.state = State::AwaitRtr;
            self.deadline = Some(self.now.saturating_add(self.cfg.request_timeout_ms));
            self.request = Some(req);
        } else {
            self.state = State::Established;
            self.events.push_back(Event::Established {
                params: neg,
                private_data: req.private_data,
            });
        }
        self.refuse_reads_at_ord_0();
        Ok(())
    }

    /// Responder: rejects the pending request (Reply with the R bit).
    pub fn reject(&mut self, private_data: &[u8]) -> Result<(), PostError> {
        if self.state != State::AwaitAccept {
            return Err(PostError::InvalidState);
        }
        self.check_local_pd(private_data)?;
        let Some(req) = self.request.take() else {
            return Err(PostError::InvalidState);
        };
        let (frame, _) = setup::build_reply(&req, &self.cfg.local(), false, private_data);
        self.out_mpa.push_back(frame.to_vec()?);
        self.finish_close();
        Ok(())
    }

    fn start_framing(&mut self, neg: Negotiated) {
        self.neg = Some(neg);
        self.decoder = FpduDecoder::new(neg.crc);
        self.deadline = None;
    }

    pub(super) fn mpa_input(&mut self, data: &mut &[u8]) {
        loop {
            match mpa::decode(&self.mpa_buf, self.cfg.max_private_data) {
                Ok(Decoded::NeedMore(n)) => {
                    if data.is_empty() {
                        return;
                    }
                    let take = n.saturating_sub(self.mpa_buf.len()).min(data.len()).max(1);
                    self.mpa_buf.extend_from_slice(&data[..take]);
                    *data = &data[take..];
                }
                Ok(Decoded::Frame(frame, _)) => {
                    self.mpa_buf = Vec::new();
                    match self.role {
                        Role::Responder => self.on_request(frame, !data.is_empty()),
                        Role::Initiator => self.on_reply(frame),
                    }
                    return;
                }
                Err(e) => {
                    self.mpa_buf = Vec::new();
                    self.setup_failed(e);
                    return;
                }
            }
        }
    }

    fn on_request(&mut self, frame: MpaFrame, trailing: bool) {
        if frame.kind != FrameKind::Request {
            return self.setup_failed(MpaError::UnexpectedKind);
        }
        if trailing {
            return self.setup_failed(MpaError::TrailingBytes);
        }
        match setup::check_request(&frame) {
            Ok(req) => {
                self.request = Some(req.clone());
                self.state = State::AwaitAccept;
                self.deadline = None;
                self.events.push_back(Event::ConnectRequest(req));
            }
            Err((e, reply)) => {
                if reply {
                    let req = ConnectRequest {
                        revision: frame.revision.max(1),
                        crc: frame.crc,
                        params: frame.enhanced_params().map(|(p, _)| p),
                        private_data: Vec::new(),
                    };
                    let (rep, _) = setup::build_reply(&req, &self.cfg.local(), false, &[]);
                    if let Ok(b) = rep.to_vec() {
                        self.out_mpa.push_back(b);
                    }
                }
                self.setup_failed(e);
            }
        }
    }

    fn on_reply(&mut self, frame: MpaFrame) {
        let Some(sent) = self.sent_request.take() else {
            return self.setup_failed(MpaError::UnexpectedKind);
        };
        if frame.kind == FrameKind::Reply && frame.reject && !frame.markers {
            self.events.push_back(Event::Rejected {
                private_data: frame.ulp_private_data().to_vec(),
            });
            self.flush_all();
            return self.finish_close();
        }
        match setup::check_reply(&sent, &frame, &self.cfg.local()) {
            Ok((neg, pd)) => {
                self.start_framing(neg);
                self.state = State::Established;
                if let Some(rtr) = neg.rtr {
                    let kind = match rtr {
                        Rtr::Write => SqKind::Write { stag: 1, to: 0 },
                        Rtr::Send => SqKind::Send {
                            op: Opcode::Send,
                            inval: 0,
                        },
                        Rtr::Read => SqKind::Read(ReadRequest {
                            sink_stag: 1,
                            sink_to: 0,
                            size: 0,
                            src_stag: 1,
                            src_to: 0,
                        }),
                    };
                    self.sq.push_front(SqEntry {
                        wr_id: 0,
                        kind,
                        len: 0,
                        internal: true,
                        offset: 0,
                        msn: 0,
                        inline: None,
                    });
                    let gap = self.cfg.rtr_nudge_ms;
                    if gap > 0 {
                        self.nudge = Some((self.now.saturating_add(gap), 3, gap));
                    }
                }
                self.events.push_back(Event::Established {
                    params: neg,
                    private_data: pd,
                });
                self.refuse_reads_at_ord_0();
            }
            Err(e) => {
                // Framing is known for IRD/RTR failures: the Terminate can go out.
                if e.term_code().is_some() {
                    let crc = sent.crc || frame.crc;
                    self.neg = Some(Negotiated {
                        revision: frame.revision,
                        enhanced: true,
                        crc,
                        ird: 0,
                        ord: 0,
                        peer_ird: None,
                        peer_ord: None,
                        rtr: None,
                    });
                }
                self.setup_failed(e);
            }
        }
    }
}
