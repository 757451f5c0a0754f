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
//!
//! # Layout
//!
//! This file holds the connection's types, its state and the calls that
//! post requests, close it and run its timers; `establish` is the MPA
//! setup, `rx` the FPDUs that come in, `tx` the ones that go out.

use std::collections::VecDeque;

use crate::error::{MpaError, PostError, ProtocolError};
use crate::fpdu::{FpduDecoder, HeaderBuf, INLINE_MAX, TrailerBuf};
use crate::mem::{Memory, Place, Region, Source};
use crate::mpa::{self, MpaFrame};
use crate::rdmap::{self, Opcode, READ_REQUEST_LEN, ReadRequest};
use crate::setup::{ConnectRequest, Local, Negotiated, RtrOffer};
use crate::terminate::{MAX_TERMINATE_BODY, Terminate, TerminatedDdp, layer};

mod establish;
mod rx;
mod tx;

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
    /// TCP MSS; every FPDU we send fits it (rounded down to 8). It may
    /// change during the connection ([`Connection::set_mss`]).
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

impl ConnError {
    /// The Terminate sent for this error, if one is
    /// ([`MpaError::term_code`], [`ProtocolError::term_code`]).
    pub fn term_code(&self) -> Option<crate::terminate::TermCode> {
        match self {
            ConnError::Mpa(m) => m.term_code(),
            ConnError::Protocol(p) => Some(p.term_code()),
        }
    }
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
    /// A posting taken before the set-up was done, refused once the
    /// set-up made it impossible: an RDMA Read toward a peer that takes
    /// none (our ORD 0). It was never sent; the requests behind it go on.
    Refused {
        /// The posting's id.
        wr_id: u64,
        /// What the same post returns after the set-up.
        error: PostError,
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

impl SqKind {
    /// A Send of RDMAP's four kinds: with Solicited Event if `solicited`,
    /// with Invalidate of the STag if given.
    fn send(solicited: bool, invalidate: Option<u32>) -> Self {
        let op = match (invalidate.is_some(), solicited) {
            (false, false) => Opcode::Send,
            (false, true) => Opcode::SendSe,
            (true, false) => Opcode::SendInvalidate,
            (true, true) => Opcode::SendSeInvalidate,
        };
        SqKind::Send {
            op,
            inval: invalidate.unwrap_or(0),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct SqEntry {
    wr_id: u64,
    kind: SqKind,
    len: u32,
    internal: bool,
    offset: u32,
    msn: u32,
    /// The payload, when it was given at post time
    /// ([`Connection::post_send_inline`]); else framing asks [`Memory`].
    inline: Option<InlinePayload>,
}

/// A short payload held by the connection itself.
#[derive(Clone, Copy)]
struct InlinePayload {
    bytes: [u8; INLINE_MAX],
    len: u16,
}

impl std::fmt::Debug for InlinePayload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "InlinePayload({} bytes)", self.len)
    }
}

impl InlinePayload {
    fn new(data: &[u8]) -> Result<Self, PostError> {
        if data.len() > INLINE_MAX {
            return Err(PostError::TooLong);
        }
        let mut bytes = [0; INLINE_MAX];
        bytes[..data.len()].copy_from_slice(data);
        Ok(Self {
            bytes,
            len: data.len() as u16,
        })
    }

    /// Bytes `offset..offset + len` (a segment the caller bounded by
    /// this payload's length).
    fn get(&self, offset: u32, len: u32) -> Option<&[u8]> {
        let end = offset.checked_add(len)? as usize;
        self.bytes[..usize::from(self.len)].get(offset as usize..end)
    }
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

    /// Follows a change of the TCP connection's MSS (RFC 5044: the MULPDU
    /// follows the current EMSS, which may change). Every FPDU framed from
    /// now on fits `mss`, those of a message already under way included
    /// (DDP segments stand alone); what was framed stays as it is. Refused
    /// below 64, as in [`Config`].
    pub fn set_mss(&mut self, mss: u32) -> Result<(), PostError> {
        if mss < 64 {
            return Err(PostError::Config("mss must be at least 64"));
        }
        self.cfg.mss = mss;
        Ok(())
    }

    /// The current state.
    pub fn state(&self) -> State {
        self.state
    }

    /// What was negotiated, once known.
    pub fn negotiated(&self) -> Option<&Negotiated> {
        self.neg.as_ref()
    }

    /// Whether all this side sends waits for the peer's first FPDU: a
    /// responder, established, that has had none yet (RFC 5044 §7.1.2).
    /// With an RTR negotiated it is never so: the RTR is that FPDU, and
    /// the responder is established only once it came.
    pub fn awaits_first_fpdu(&self) -> bool {
        self.role == Role::Responder && self.state == State::Established && !self.peer_spoke
    }

    /// Read requests sent and not yet answered.
    pub fn outstanding_reads(&self) -> usize {
        self.orq.len()
    }

    /// Whether the connection is closed.
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
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
        self.push_sq_entry(wr_id, kind, len, None)
    }

    fn push_sq_entry(
        &mut self,
        wr_id: u64,
        kind: SqKind,
        len: u32,
        inline: Option<InlinePayload>,
    ) -> Result<(), PostError> {
        self.can_post()?;
        self.sq.push_back(SqEntry {
            wr_id,
            kind,
            len,
            internal: false,
            offset: 0,
            msn: 0,
            inline,
        });
        Ok(())
    }

    /// Posts a Send of `len` bytes from the local buffer of `wr_id`.
    pub fn post_send(&mut self, wr_id: u64, len: u32) -> Result<(), PostError> {
        self.push_sq(wr_id, SqKind::send(false, None), len)
    }

    /// Posts a Send with Solicited Event.
    pub fn post_send_se(&mut self, wr_id: u64, len: u32) -> Result<(), PostError> {
        self.push_sq(wr_id, SqKind::send(true, None), len)
    }

    /// Posts a Send with Invalidate of `inval_stag` (with SE if `solicited`).
    pub fn post_send_inv(
        &mut self,
        wr_id: u64,
        len: u32,
        inval_stag: u32,
        solicited: bool,
    ) -> Result<(), PostError> {
        self.push_sq(wr_id, SqKind::send(solicited, Some(inval_stag)), len)
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

    /// Posts a Send whose payload is `data` itself, copied into the
    /// connection now: with Solicited Event if `solicited`, with Invalidate
    /// of `invalidate` if given. Framing then never asks [`Memory`] for it,
    /// and each of its FPDUs is one contiguous run with one CRC pass. The
    /// wire bytes are those of [`Connection::post_send`] and its kin.
    /// `TooLong` above [`INLINE_MAX`] bytes.
    pub fn post_send_inline(
        &mut self,
        wr_id: u64,
        data: &[u8],
        solicited: bool,
        invalidate: Option<u32>,
    ) -> Result<(), PostError> {
        let p = InlinePayload::new(data)?;
        let kind = SqKind::send(solicited, invalidate);
        self.push_sq_entry(wr_id, kind, u32::from(p.len), Some(p))
    }

    /// [`Connection::post_write`] of `data` itself, as
    /// [`Connection::post_send_inline`] takes a Send's.
    pub fn post_write_inline(
        &mut self,
        wr_id: u64,
        data: &[u8],
        stag: u32,
        to: u64,
    ) -> Result<(), PostError> {
        let p = InlinePayload::new(data)?;
        to.checked_add(u64::from(p.len)).ok_or(PostError::Wrap)?;
        self.push_sq_entry(wr_id, SqKind::Write { stag, to }, u32::from(p.len), Some(p))
    }

    /// Posts an RDMA Read: `rr.size` bytes from the peer's `src_stag`/`src_to`
    /// into our `sink_stag`/`sink_to`. At most ORD are outstanding; more wait.
    /// `InvalidState` once the negotiated ORD is 0 (the peer takes no reads);
    /// a read posted before the set-up settled that is refused then
    /// ([`Event::Refused`]).
    pub fn post_read(&mut self, wr_id: u64, rr: ReadRequest) -> Result<(), PostError> {
        // A peer that takes no reads (its IRD 0 made our ORD 0): the read
        // could never go out, and would hold every request behind it.
        if self.neg.is_some_and(|n| n.ord == 0) {
            return Err(PostError::InvalidState);
        }
        rr.sink_to
            .checked_add(u64::from(rr.size))
            .ok_or(PostError::Wrap)?;
        rr.src_to
            .checked_add(u64::from(rr.size))
            .ok_or(PostError::Wrap)?;
        self.push_sq(wr_id, SqKind::Read(rr), 0)
    }

    /// Once the set-up settled on an ORD of 0: refuses the reads posted
    /// before ([`Event::Refused`]). None could ever go out, and the first
    /// would hold every request behind it.
    fn refuse_reads_at_ord_0(&mut self) {
        if self.neg.is_none_or(|n| n.ord != 0) {
            return;
        }
        let mut refused = Vec::new();
        self.sq.retain(|e| {
            let read = !e.internal && matches!(e.kind, SqKind::Read(_));
            if read {
                refused.push(e.wr_id);
            }
            !read
        });
        for wr_id in refused {
            self.events.push_back(Event::Refused {
                wr_id,
                error: PostError::InvalidState,
            });
        }
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
        self.abort_with(crate::terminate::rdmap::local_catastrophic());
    }

    /// [`Connection::abort`] whose Terminate carries `code` (the layer
    /// that failed and why).
    pub fn abort_with(&mut self, code: crate::terminate::TermCode) {
        if self.neg.is_some() && !matches!(self.state, State::Closed | State::Terminating) {
            self.flush_all();
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
    /// closes after it. Nothing else is sent. An end between FPDUs is
    /// clean; one during the MPA exchange is [`MpaError::PeerClosed`], one
    /// inside an FPDU [`ProtocolError::StreamLost`].
    pub fn handle_eof(&mut self) {
        match self.state {
            State::Closed => return,
            State::Terminating if self.term_pending.is_some() => return,
            State::Established | State::AwaitRtr if self.decoder.at_boundary() => {}
            State::Terminating => {}
            State::Idle | State::AwaitReply | State::AwaitRequest | State::AwaitAccept => self
                .events
                .push_back(Event::Error(MpaError::PeerClosed.into())),
            State::Established | State::AwaitRtr => self
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
                    inline: None,
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
}
