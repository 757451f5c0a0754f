//! The connection: MPA setup, then FPDUs in and out, with no I/O.
//!
//! Modelled on quinn-proto. The caller feeds TCP bytes with
//! [`Connection::handle_input`], drains [`Connection::poll_transmit`] into
//! the socket, drains [`Connection::poll_event`], and drives
//! [`Connection::poll_timeout`] / [`Connection::handle_timeout`] with its
//! own clock (milliseconds). Nothing here reads a clock, a socket or a
//! thread.
//!
//! Guarantees:
//! * every length and offset from the wire is checked before a
//!   [`Memory::place`] call; placements stay inside the region returned by
//!   [`Memory::lookup`] or the posted receive capacity;
//! * bad input never panics: it yields [`Event::Error`] and (after setup) a
//!   Terminate with the RFC layer/type/code as the next transmit, then
//!   [`Event::Closed`];
//! * buffers sized by the peer are capped: the MPA private data by the
//!   configured limit, Terminate and Read Request bodies by their fixed
//!   sizes;
//! * at most ORD read requests are outstanding; more than IRD inbound read
//!   requests are refused with a Terminate;
//! * two tagged (or two untagged) messages are never interleaved on
//!   transmit, and each FPDU fits the configured MSS;
//! * the responder sends no FPDU before the initiator's first FPDU (RFC 5044
//!   §7.1.2), and with peer-to-peer mode the initiator's first FPDU is the
//!   negotiated RTR.
//!
//! Data is placed as it arrives, before the FPDU's CRC is checked (as
//! hardware does); completions are only reported after the CRC check.

use std::collections::VecDeque;

use crate::crc::FpduCrc;
use crate::ddp::{self, Buffer, DdpHeader, Segments};
use crate::error::{MpaError, PostError, ProtocolError};
use crate::fpdu::{self, FpduDecoder, FpduEvent, HeaderBuf, TrailerBuf};
use crate::mem::{Access, Memory, Place, Region, Source};
use crate::mpa::{self, Decoded, FrameKind, MpaFrame};
use crate::rdmap::{self, Opcode, READ_REQUEST_LEN, ReadRequest};
use crate::setup::{self, ConnectRequest, Local, Negotiated, Rtr, RtrOffer};
use crate::terminate::{MAX_TERMINATE_BODY, Terminate, TerminatedDdp, layer};

/// Which end of the TCP connection this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Active side: sends the MPA Request.
    Initiator,
    /// Passive side: answers with the MPA Reply.
    Responder,
}

/// Connection settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// MPA revision to speak: 2 (RFC 6581 enhanced, siw's default) or 1.
    pub revision: u8,
    /// Ask for CRC (it is used if either side asks).
    pub crc: bool,
    /// Inbound RDMA Read queue depth. Under revision 2 it is exchanged
    /// (and may be raised to the peer's ORD, at most 128); under revision 1
    /// nothing is exchanged and the ULP must agree IRD/ORD out of band.
    pub ird: u16,
    /// Outbound RDMA Read queue depth (lowered to the peer's IRD under
    /// revision 2).
    pub ord: u16,
    /// Initiator: ask for peer-to-peer mode (an RTR message).
    pub peer_to_peer: bool,
    /// Initiator: which RTR messages to offer.
    pub rtr_offer: RtrOffer,
    /// TCP MSS; every FPDU we send fits it (rounded down to 8).
    pub mss: u32,
    /// Largest inbound private data (including the 4-byte IRD/ORD block),
    /// at most 512 (RFC 5044). Default 256, siw's and the RDMA CM's limit
    /// (siw refuses more); local ULP private data is capped at this less 4
    /// under revision 2. siw's reply path keeps the ULP length in a `u8`,
    /// so toward siw keep ULP private data at or below 251 bytes.
    pub max_private_data: u16,
    /// Initiator: how long to wait for the Reply (siw: 10 s); `None`: no
    /// timer, for a caller whose own deadline bounds the connect (a DAT
    /// consumer's connect timeout, or none: an indefinite wait).
    pub reply_timeout_ms: Option<u64>,
    /// Responder: how long to wait for the Request, and for the RTR after
    /// the Reply (siw: 5 s). The consumer's decision in between has no
    /// timer: the initiator's patience bounds it (its close ends the
    /// setup), as a slow accept must not be refused behind its back.
    pub request_timeout_ms: u64,
    /// Initiator in peer-to-peer mode: while the peer has sent no FPDU,
    /// send a zero-length RDMA Write this long after the Reply, then 4 and
    /// 16 times as long after that (3 at most; 0 turns this off). siw
    /// (Linux 6.1) sends its Reply before it starts reading the socket for
    /// the RTR, and leaves what arrived in between unread until more bytes
    /// come (`siw_accept`); the nudge is those bytes. A zero-length Write
    /// is valid at any time and moves nothing.
    pub rtr_nudge_ms: u64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            revision: 2,
            crc: true,
            ird: 16,
            ord: 16,
            peer_to_peer: false,
            rtr_offer: RtrOffer::default(),
            mss: 1460,
            max_private_data: mpa::SIW_MAX_PRIVATE_DATA,
            reply_timeout_ms: Some(10_000),
            request_timeout_ms: 5_000,
            rtr_nudge_ms: 50,
        }
    }
}

impl Config {
    fn local(&self) -> Local {
        Local {
            revision: self.revision,
            crc: self.crc,
            ird: self.ird,
            ord: self.ord,
            peer_to_peer: self.peer_to_peer,
            rtr_offer: self.rtr_offer,
        }
    }

    fn validate(&self) -> Result<(), PostError> {
        if !(1..=2).contains(&self.revision) {
            return Err(PostError::Config("revision must be 1 or 2"));
        }
        if self.mss < 64 {
            return Err(PostError::Config("mss must be at least 64"));
        }
        if self.max_private_data < 4 || self.max_private_data > mpa::MAX_PRIVATE_DATA_WIRE {
            return Err(PostError::Config("max_private_data must be in 4..=512"));
        }
        Ok(())
    }

    fn max_ulp_private_data(&self) -> usize {
        usize::from(self.max_private_data) - if self.revision >= 2 { 4 } else { 0 }
    }
}

/// A connection-level error reported by [`Event::Error`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnError {
    /// MPA setup failed.
    #[error("MPA setup: {0}")]
    Mpa(#[from] MpaError),
    /// The FPDU stream broke a rule; a Terminate with its code is sent.
    #[error("protocol: {0}")]
    Protocol(#[from] ProtocolError),
}

/// What the connection tells its caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Responder: a Request arrived; call [`Connection::accept`] or
    /// [`Connection::reject`].
    ConnectRequest(ConnectRequest),
    /// Setup is done; FPDUs flow.
    Established {
        /// What was negotiated.
        params: Negotiated,
        /// The peer's ULP private data (initiator: from the Reply;
        /// responder: from the Request).
        private_data: Vec<u8>,
    },
    /// Initiator: the responder rejected the connection.
    Rejected {
        /// The responder's ULP private data.
        private_data: Vec<u8>,
    },
    /// A Send arrived in the posted receive `wr_id`.
    RecvComplete {
        /// The receive's id.
        wr_id: u64,
        /// Message length.
        len: u32,
        /// Send with Solicited Event.
        solicited: bool,
        /// STag invalidated by Send with Invalidate.
        invalidated: Option<u32>,
    },
    /// A Send or RDMA Write was handed to the transmit path in full.
    SendComplete {
        /// The posting's id.
        wr_id: u64,
    },
    /// An RDMA Read's response arrived in full.
    ReadComplete {
        /// The posting's id.
        wr_id: u64,
        /// Bytes read.
        len: u32,
    },
    /// A posting was flushed unfinished by a close or error.
    Flushed {
        /// The posting's id.
        wr_id: u64,
    },
    /// The peer sent a Terminate; the connection is closed.
    TerminateReceived(Terminate),
    /// We detected an error; a Terminate follows when framing allows.
    Error(ConnError),
    /// The connection is closed; the caller closes the TCP socket.
    Closed,
}

/// One thing to write to the TCP stream, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transmit {
    /// An MPA Request or Reply.
    Mpa(Vec<u8>),
    /// An FPDU: `header`, then the payload bytes of `payload` from the
    /// caller's memory, then `trailer`.
    Fpdu {
        /// ULPDU length, DDP header, inline body.
        header: HeaderBuf,
        /// Payload to take from caller memory.
        payload: Option<Source>,
        /// Pad and CRC.
        trailer: TrailerBuf,
    },
}

impl Transmit {
    /// Total bytes on the wire.
    pub fn len(&self) -> usize {
        match self {
            Transmit::Mpa(b) => b.len(),
            Transmit::Fpdu {
                header,
                payload,
                trailer,
            } => header.len() + payload.map_or(0, |p| p.len() as usize) + trailer.len(),
        }
    }

    /// Whether there are no bytes (never true).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends the wire bytes to `out`, taking the payload from `mem`.
    /// Returns false if `mem` lacks the payload bytes.
    pub fn write_to<M: Memory + ?Sized>(&self, mem: &M, out: &mut Vec<u8>) -> bool {
        match self {
            Transmit::Mpa(b) => out.extend_from_slice(b),
            Transmit::Fpdu {
                header,
                payload,
                trailer,
            } => {
                out.extend_from_slice(header);
                if let Some(src) = payload {
                    let start = out.len();
                    if !mem.source_with(src, &mut |b| out.extend_from_slice(b))
                        || out.len() - start != src.len() as usize
                    {
                        return false;
                    }
                }
                out.extend_from_slice(trailer);
            }
        }
        true
    }
}

/// Where the connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Initiator before [`Connection::connect`].
    Idle,
    /// Initiator waiting for the Reply.
    AwaitReply,
    /// Responder waiting for the Request.
    AwaitRequest,
    /// Responder waiting for the consumer's accept or reject.
    AwaitAccept,
    /// Responder waiting for the initiator's RTR.
    AwaitRtr,
    /// FPDUs flow.
    Established,
    /// A Terminate is queued; nothing else is sent or received.
    Terminating,
    /// Done.
    Closed,
}

#[derive(Debug, Clone, Copy)]
enum SqKind {
    Send { op: Opcode, inval: u32 },
    Write { stag: u32, to: u64 },
    Read(ReadRequest),
}

#[derive(Debug, Clone, Copy)]
struct SqEntry {
    wr_id: u64,
    kind: SqKind,
    len: u32,
    internal: bool,
    offset: u32,
    msn: u32,
}

#[derive(Debug, Clone, Copy)]
struct OrqEntry {
    wr_id: u64,
    rr: ReadRequest,
    received: u32,
    internal: bool,
    region: Option<Region>,
}

#[derive(Debug, Clone, Copy)]
struct RespJob {
    rr: ReadRequest,
    offset: u32,
}

#[derive(Debug, Clone, Copy)]
struct RecvProgress {
    wr_id: u64,
    capacity: u32,
    offset: u32,
    op: Opcode,
    inval: u32,
}

#[derive(Debug, Clone, Copy)]
struct TaggedProgress {
    stag: u32,
    next_to: u64,
    region: Region,
}

#[derive(Debug, Clone, Copy)]
enum RxKind {
    Write { last: bool },
    ZeroWrite,
    ReadResp { last: bool, len: u16 },
    Send { last: bool, len: u16 },
    RtrSend,
    ReadReq,
    Term,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TxPick {
    Sq,
    Resp,
}

/// An iWARP connection (one QP's wire protocol).
#[derive(Debug)]
pub struct Connection {
    role: Role,
    cfg: Config,
    state: State,
    now: u64,
    deadline: Option<u64>,
    mpa_buf: Vec<u8>,
    sent_request: Option<MpaFrame>,
    request: Option<ConnectRequest>,
    neg: Option<Negotiated>,
    decoder: FpduDecoder,
    out_mpa: VecDeque<Vec<u8>>,
    events: VecDeque<Event>,
    peer_spoke: bool,
    /// The next RTR nudge: when, how many are left (this one included)
    /// and the wait before it ([`Config::rtr_nudge_ms`]).
    nudge: Option<(u64, u8, u64)>,
    // transmit
    sq: VecDeque<SqEntry>,
    resp: VecDeque<RespJob>,
    orq: VecDeque<OrqEntry>,
    cur_tx: Option<TxPick>,
    last_pick: TxPick,
    tx_msn: [u32; 2],
    term_pending: Option<Terminate>,
    /// Zero-length Read Responses still due when the consumer closed
    /// (see [`Connection::close`]), framed, sent after the close.
    closing: VecDeque<Transmit>,
    // receive
    recvs: VecDeque<(u64, u32)>,
    rx_msn: [u32; 2],
    rx_send: Option<RecvProgress>,
    rx_tagged: Option<TaggedProgress>,
    rx_kind: Option<RxKind>,
    rx_place: Option<Place>,
    rx_raw: [u8; 20],
    rx_raw_len: usize,
    collect: [u8; MAX_TERMINATE_BODY],
    collect_len: usize,
}

impl Connection {
    /// A new connection. `now` is the caller's clock in milliseconds; a
    /// responder starts its Request timer here.
    pub fn new(role: Role, config: Config, now: u64) -> Result<Self, PostError> {
        config.validate()?;
        let (state, deadline) = match role {
            Role::Initiator => (State::Idle, None),
            Role::Responder => (
                State::AwaitRequest,
                Some(now.saturating_add(config.request_timeout_ms)),
            ),
        };
        Ok(Self {
            role,
            cfg: config,
            state,
            now,
            deadline,
            mpa_buf: Vec::new(),
            sent_request: None,
            request: None,
            neg: None,
            decoder: FpduDecoder::new(false),
            out_mpa: VecDeque::new(),
            closing: VecDeque::new(),
            events: VecDeque::new(),
            peer_spoke: false,
            nudge: None,
            sq: VecDeque::new(),
            resp: VecDeque::new(),
            orq: VecDeque::new(),
            cur_tx: None,
            last_pick: TxPick::Resp,
            tx_msn: [1, 1],
            term_pending: None,
            recvs: VecDeque::new(),
            rx_msn: [1, 1],
            rx_send: None,
            rx_tagged: None,
            rx_kind: None,
            rx_place: None,
            rx_raw: [0; 20],
            rx_raw_len: 0,
            collect: [0; MAX_TERMINATE_BODY],
            collect_len: 0,
        })
    }

    /// The role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The current state.
    pub fn state(&self) -> State {
        self.state
    }

    /// What was negotiated, once known.
    pub fn negotiated(&self) -> Option<&Negotiated> {
        self.neg.as_ref()
    }

    /// Read requests sent and not yet answered.
    pub fn outstanding_reads(&self) -> usize {
        self.orq.len()
    }

    /// Whether the connection is closed.
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

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

    fn can_post(&self) -> Result<(), PostError> {
        match self.state {
            State::Closed | State::Terminating => Err(PostError::Closed),
            State::Idle | State::AwaitRequest => Err(PostError::InvalidState),
            _ => Ok(()),
        }
    }

    /// Posts a receive buffer of `capacity` bytes for inbound Sends.
    pub fn post_recv(&mut self, wr_id: u64, capacity: u32) -> Result<(), PostError> {
        self.can_post()?;
        self.recvs.push_back((wr_id, capacity));
        Ok(())
    }

    fn push_sq(&mut self, wr_id: u64, kind: SqKind, len: u32) -> Result<(), PostError> {
        self.can_post()?;
        self.sq.push_back(SqEntry {
            wr_id,
            kind,
            len,
            internal: false,
            offset: 0,
            msn: 0,
        });
        Ok(())
    }

    /// Posts a Send of `len` bytes from the local buffer of `wr_id`.
    pub fn post_send(&mut self, wr_id: u64, len: u32) -> Result<(), PostError> {
        self.push_sq(
            wr_id,
            SqKind::Send {
                op: Opcode::Send,
                inval: 0,
            },
            len,
        )
    }

    /// Posts a Send with Solicited Event.
    pub fn post_send_se(&mut self, wr_id: u64, len: u32) -> Result<(), PostError> {
        self.push_sq(
            wr_id,
            SqKind::Send {
                op: Opcode::SendSe,
                inval: 0,
            },
            len,
        )
    }

    /// Posts a Send with Invalidate of `inval_stag` (with SE if `solicited`).
    pub fn post_send_inv(
        &mut self,
        wr_id: u64,
        len: u32,
        inval_stag: u32,
        solicited: bool,
    ) -> Result<(), PostError> {
        let op = if solicited {
            Opcode::SendSeInvalidate
        } else {
            Opcode::SendInvalidate
        };
        self.push_sq(
            wr_id,
            SqKind::Send {
                op,
                inval: inval_stag,
            },
            len,
        )
    }

    /// Posts an RDMA Write of `len` bytes to `stag`/`to` at the peer.
    pub fn post_write(
        &mut self,
        wr_id: u64,
        len: u32,
        stag: u32,
        to: u64,
    ) -> Result<(), PostError> {
        to.checked_add(u64::from(len)).ok_or(PostError::Wrap)?;
        self.push_sq(wr_id, SqKind::Write { stag, to }, len)
    }

    /// Posts an RDMA Read: `rr.size` bytes from the peer's `src_stag`/`src_to`
    /// into our `sink_stag`/`sink_to`. At most ORD are outstanding; more wait.
    pub fn post_read(&mut self, wr_id: u64, rr: ReadRequest) -> Result<(), PostError> {
        rr.sink_to
            .checked_add(u64::from(rr.size))
            .ok_or(PostError::Wrap)?;
        rr.src_to
            .checked_add(u64::from(rr.size))
            .ok_or(PostError::Wrap)?;
        self.push_sq(wr_id, SqKind::Read(rr), 0)
    }

    /// Closes: flushes what is unsent and reports [`Event::Closed`]. The
    /// caller then closes the TCP socket.
    ///
    /// The answers to zero-length Read Requests already taken in (the
    /// peer's fences; those ahead of any response with data) still come
    /// out of [`Connection::poll_transmit`], before the caller's close:
    /// each tells the peer that everything it
    /// sent before that request was placed here. Without them a peer
    /// that completes its Sends only when a fence is answered would
    /// report as flushed messages this side received.
    pub fn close(&mut self) {
        if self.state != State::Closed {
            if self.state == State::Established && self.cur_tx != Some(TxPick::Resp) {
                // In order, up to the first that carries data (that one,
                // like the rest, is dropped: responses match requests in
                // order, so none may come after it).
                for j in self.resp.iter().take_while(|j| j.rr.size == 0) {
                    let hdr = rdmap::tagged_header(
                        Opcode::ReadResponse,
                        true,
                        j.rr.sink_stag,
                        j.rr.sink_to,
                    );
                    if let Some(t) = self.inline_frame(&hdr, &[]) {
                        self.closing.push_back(t);
                    }
                }
            }
            self.flush_all();
            self.term_pending = None;
            self.finish_close();
        }
    }

    /// Aborts with a Terminate (RDMAP, local catastrophic), then closes.
    pub fn abort(&mut self) {
        if self.neg.is_some() && !matches!(self.state, State::Closed | State::Terminating) {
            self.flush_all();
            let code = crate::terminate::rdmap::local_catastrophic();
            self.term_pending = Some(Terminate::new(code));
            self.state = State::Terminating;
        } else {
            self.close();
        }
    }

    /// The TCP stream ended (the peer closed or the socket failed). A
    /// Terminate already due still comes out of
    /// [`Connection::poll_transmit`] (the peer may have shut only its
    /// sending side, after the bytes that caused it), and the connection
    /// closes after it.
    pub fn handle_eof(&mut self) {
        match self.state {
            State::Closed => return,
            State::Terminating if self.term_pending.is_some() => return,
            State::Established | State::AwaitRtr if self.decoder.at_boundary() => {}
            State::Terminating => {}
            _ => self
                .events
                .push_back(Event::Error(ProtocolError::StreamLost.into())),
        }
        self.flush_all();
        self.term_pending = None;
        self.finish_close();
    }

    /// The next deadline (ms), if a timer runs.
    pub fn poll_timeout(&self) -> Option<u64> {
        let nudge = self.nudge.filter(|_| !self.peer_spoke).map(|n| n.0);
        [self.deadline, nudge].into_iter().flatten().min()
    }

    /// Tells the connection the time; fires an expired MPA timer.
    pub fn handle_timeout(&mut self, now: u64) {
        self.now = self.now.max(now);
        if let Some(d) = self.deadline
            && self.now >= d
        {
            self.deadline = None;
            if matches!(
                self.state,
                State::AwaitReply | State::AwaitRequest | State::AwaitRtr
            ) {
                self.setup_failed(MpaError::Timeout);
            }
        }
        if let Some((at, left, gap)) = self.nudge
            && self.now >= at
        {
            self.nudge = None;
            if self.state == State::Established && !self.peer_spoke {
                self.sq.push_back(SqEntry {
                    wr_id: 0,
                    kind: SqKind::Write { stag: 1, to: 0 },
                    len: 0,
                    internal: true,
                    offset: 0,
                    msn: 0,
                });
                if left > 1 {
                    let gap = gap.saturating_mul(4);
                    self.nudge = Some((self.now.saturating_add(gap), left - 1, gap));
                }
            }
        }
    }

    /// The next event for the caller.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn finish_close(&mut self) {
        if self.state != State::Closed {
            self.state = State::Closed;
            self.deadline = None;
            self.events.push_back(Event::Closed);
        }
    }

    fn flush_all(&mut self) {
        let mut ids = Vec::new();
        ids.extend(self.sq.drain(..).filter(|e| !e.internal).map(|e| e.wr_id));
        ids.extend(self.orq.drain(..).filter(|e| !e.internal).map(|e| e.wr_id));
        ids.extend(self.rx_send.take().map(|r| r.wr_id));
        ids.extend(self.recvs.drain(..).map(|r| r.0));
        self.resp.clear();
        self.cur_tx = None;
        for wr_id in ids {
            self.events.push_back(Event::Flushed { wr_id });
        }
    }

    fn setup_failed(&mut self, e: MpaError) {
        let code = e.term_code();
        self.events.push_back(Event::Error(e.into()));
        self.flush_all();
        match (code, self.neg.is_some()) {
            (Some(code), true) => {
                self.term_pending = Some(Terminate::new(code));
                self.state = State::Terminating;
            }
            _ => self.finish_close(),
        }
    }

    fn fail(&mut self, e: ProtocolError) {
        if matches!(self.state, State::Closed | State::Terminating) {
            return;
        }
        let mut t = Terminate::new(e.term_code());
        let header_layers = t.code.layer == layer::DDP || t.code.layer == layer::RDMAP;
        if header_layers && self.rx_raw_len > 2 && t.code.etype != 0 {
            t.m = true;
            t.ddp = Some(TerminatedDdp {
                segment_length: u16::from_be_bytes([self.rx_raw[0], self.rx_raw[1]]),
                header: self.rx_raw[2..self.rx_raw_len].to_vec(),
            });
            if matches!(self.rx_kind, Some(RxKind::ReadReq)) && self.collect_len == READ_REQUEST_LEN
            {
                let mut r = [0u8; 28];
                r.copy_from_slice(&self.collect[..28]);
                t.rdmap = Some(r);
            }
        }
        let bogus = e == ProtocolError::BogusTerminate;
        self.events.push_back(Event::Error(e.into()));
        self.flush_all();
        if bogus || self.neg.is_none() {
            self.finish_close();
        } else {
            self.term_pending = Some(t);
            self.state = State::Terminating;
        }
    }

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

    fn mpa_input(&mut self, data: &mut &[u8]) {
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
            match self.decoder.next(data)? {
                None => return Ok(()),
                Some(FpduEvent::Header {
                    header,
                    payload_len,
                    ..
                }) => {
                    let raw = self.decoder.raw_header();
                    self.rx_raw[..raw.len()].copy_from_slice(raw);
                    self.rx_raw_len = raw.len();
                    self.collect_len = 0;
                    self.on_header(header, payload_len, mem)?;
                }
                Some(FpduEvent::Payload(chunk)) => self.on_payload(chunk, mem),
                Some(FpduEvent::End) => {
                    self.on_end(mem)?;
                    self.rx_raw_len = 0;
                    self.rx_kind = None;
                }
            }
        }
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
                        self.rx_send = None;
                        self.rx_msn[0] = self.rx_msn[0].wrapping_add(1);
                        let invalidated = if p.op.invalidates() {
                            mem.invalidate(p.inval).map_err(|err| {
                                ProtocolError::CannotInvalidate { stag: p.inval, err }
                            })?;
                            Some(p.inval)
                        } else {
                            None
                        };
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

    /// The next bytes to write to TCP, in order. Payload bytes are named by
    /// [`Source`]; `mem` is read only to compute the CRC and to check that
    /// the source exists.
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
    fn inline_frame(&self, hdr: &DdpHeader, body: &[u8]) -> Option<Transmit> {
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
                        let src = Source::Local {
                            wr_id: e.wr_id,
                            offset: seg.offset,
                            len: seg.len,
                        };
                        let t = self.frame(&hdr, &[], Some(src), mem)?;
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
                        let src = Source::Local {
                            wr_id: e.wr_id,
                            offset: seg.offset,
                            len: seg.len,
                        };
                        let t = self.frame(&hdr, &[], Some(src), mem)?;
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

/// Moves a placement past `n` bytes (checked at the FPDU's header: the
/// sums stay inside the region or the receive).
fn advance(p: &mut Place, n: usize) {
    match p {
        Place::Tagged { to, .. } => *to += n as u64,
        Place::Recv { offset, .. } => *offset += n as u32,
    }
}
