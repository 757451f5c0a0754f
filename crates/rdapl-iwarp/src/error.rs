//! Typed errors and their Terminate codes.
//!
//! Every error detected on the byte stream is a [`ProtocolError`]; each one
//! maps to exactly one Terminate (layer, error type, error code) per RFC 5040
//! §7, RFC 5041 §7 and RFC 5044 §8 / RFC 6581 §9. MPA setup errors are
//! [`MpaError`]s; local API misuse is a [`PostError`].

use crate::terminate::{TermCode, ddp, llp, rdmap};

/// Why an MPA Request or Reply frame was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MpaError {
    /// The 16-byte key is neither "MPA ID Req Frame" nor "MPA ID Rep Frame".
    #[error("MPA key is neither the request nor the reply key")]
    BadKey,
    /// A request arrived where a reply was expected, or the reverse.
    #[error("unexpected MPA frame kind (request where reply expected or reverse)")]
    UnexpectedKind,
    /// Revision other than 1 or 2.
    #[error("unsupported MPA revision {0}")]
    UnsupportedRevision(u8),
    /// The PD_Length field is above the limit; nothing was allocated for it.
    #[error("private data length {len} exceeds the limit {max}")]
    PrivateDataTooLong {
        /// Length the peer announced.
        len: u16,
        /// Our limit.
        max: u16,
    },
    /// Revision 2 with the Enhanced flag but fewer than 4 private-data bytes.
    #[error("enhanced MPA frame has only {0} private-data bytes, fewer than the IRD/ORD block")]
    MissingEnhancedParams(u16),
    /// The peer asked for markers, which this crate never uses.
    #[error("peer asked for MPA markers, which are not supported")]
    Markers,
    /// We sent revision 2 (enhanced) and the reply is not.
    #[error("reply revision {got} does not match request revision {sent}")]
    RevisionMismatch {
        /// Revision we sent.
        sent: u8,
        /// Revision received.
        got: u8,
    },
    /// Bytes followed an MPA Request before we replied (RFC 5044 §7.1.2).
    #[error("peer sent bytes behind its MPA request before the reply")]
    TrailingBytes,
    /// Our ULP private data is longer than the configured limit.
    #[error("local private data of {len} bytes exceeds the limit {max}")]
    LocalPrivateDataTooLong {
        /// Length given.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// Peer IRD/ORD cannot be satisfied (RFC 6581 §9.1).
    #[error("insufficient IRD: peer ORD {peer_ord} exceeds our IRD limit {max_ird}")]
    InsufficientIrd {
        /// Peer's ORD.
        peer_ord: u16,
        /// Our maximum IRD.
        max_ird: u16,
    },
    /// The reply selected no RTR we offered, or more than one.
    #[error("reply selects no matching ready-to-receive message")]
    NoMatchingRtr,
    /// The MPA exchange did not finish in time.
    #[error("MPA negotiation timed out")]
    Timeout,
    /// The peer rejected the connection (R bit).
    #[error("the peer rejected the connection")]
    Rejected,
    /// The TCP stream ended before the MPA exchange was done: the peer
    /// gave up (a connect abandoned or timed out, a process that ended).
    #[error("the peer closed the connection during its set-up")]
    PeerClosed,
}

impl MpaError {
    /// The Terminate to send for this error once framing is up, if any.
    pub fn term_code(&self) -> Option<TermCode> {
        match self {
            MpaError::InsufficientIrd { .. } => Some(llp(llp::INSUFFICIENT_IRD)),
            MpaError::NoMatchingRtr => Some(llp(llp::NO_MATCHING_RTR)),
            _ => None,
        }
    }
}

/// Why a remote STag access failed; returned by [`crate::Memory::lookup`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StagError {
    /// Unknown or invalidated STag, or wrong key byte.
    #[error("invalid STag")]
    Invalid,
    /// The STag is valid but lacks the access right.
    #[error("access rights violation")]
    Access,
    /// The STag belongs to another protection domain / stream.
    #[error("STag not associated with this stream")]
    NotAssociated,
}

/// An error detected on the FPDU stream. Each maps to one Terminate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// MPA CRC mismatch.
    #[error("MPA CRC mismatch: received {received:08x}, computed {computed:08x}")]
    Crc {
        /// CRC on the wire (as a little-endian u32).
        received: u32,
        /// CRC we computed.
        computed: u32,
    },
    /// ULPDU length shorter than the DDP header it must contain.
    #[error("ULPDU length {ulpdu_len} shorter than the {header_len}-byte DDP header")]
    UlpduTooShort {
        /// Length field value.
        ulpdu_len: u16,
        /// Header length implied by the T bit.
        header_len: u16,
    },
    /// The TCP stream ended inside an FPDU.
    #[error("stream ended inside an FPDU")]
    StreamLost,
    /// DDP version other than 1.
    #[error("DDP version {version} (tagged: {tagged})")]
    DdpVersion {
        /// Buffer model of the bad segment.
        tagged: bool,
        /// Version received.
        version: u8,
    },
    /// RDMAP version other than 1.
    #[error("RDMAP version {0}")]
    RdmapVersion(u8),
    /// Unknown opcode, or an opcode used with the wrong buffer model.
    #[error("unexpected RDMAP opcode {opcode} (tagged: {tagged})")]
    Opcode {
        /// Opcode received.
        opcode: u8,
        /// T bit of the segment.
        tagged: bool,
    },
    /// Untagged queue number not valid for the opcode.
    #[error("invalid DDP queue number {0}")]
    InvalidQn(u32),
    /// MSN out of range.
    #[error("queue {qn}: MSN {got}, expected {expected}")]
    MsnRange {
        /// Queue.
        qn: u32,
        /// Expected MSN.
        expected: u32,
        /// Received MSN.
        got: u32,
    },
    /// Untagged message with no posted receive buffer.
    #[error("send MSN {msn} arrived with no receive buffer posted")]
    NoBuffer {
        /// MSN of the message.
        msn: u32,
    },
    /// Message offset not the next expected one.
    #[error("queue {qn}: MO {got}, expected {expected}")]
    InvalidMo {
        /// Queue.
        qn: u32,
        /// Expected MO.
        expected: u32,
        /// Received MO.
        got: u32,
    },
    /// Untagged message longer than the receive buffer.
    #[error("message of at least {end} bytes exceeds the {capacity}-byte receive buffer")]
    MessageTooLong {
        /// Buffer capacity.
        capacity: u32,
        /// End offset of the offending segment.
        end: u64,
    },
    /// Tagged sink STag lookup failed.
    #[error("sink STag {stag:#x}: {err}")]
    SinkStag {
        /// STag.
        stag: u32,
        /// Cause.
        err: StagError,
    },
    /// Tagged sink access outside the region, or not contiguous.
    #[error("sink STag {stag:#x}: TO {to:#x} + {len} outside the region or not contiguous")]
    SinkBounds {
        /// STag.
        stag: u32,
        /// Tagged offset.
        to: u64,
        /// Length.
        len: u64,
    },
    /// TO + length wraps 2^64.
    #[error("tagged offset {to:#x} + {len} wraps")]
    SinkToWrap {
        /// Tagged offset.
        to: u64,
        /// Length.
        len: u64,
    },
    /// Read source STag lookup failed.
    #[error("read source STag {stag:#x}: {err}")]
    SourceStag {
        /// STag.
        stag: u32,
        /// Cause.
        err: StagError,
    },
    /// Read source outside its region.
    #[error("read source STag {stag:#x}: TO {to:#x} + {len} outside the region")]
    SourceBounds {
        /// STag.
        stag: u32,
        /// Tagged offset.
        to: u64,
        /// Length.
        len: u64,
    },
    /// Read source TO + length wraps 2^64.
    #[error("read source offset {to:#x} + {len} wraps")]
    SourceToWrap {
        /// Tagged offset.
        to: u64,
        /// Length.
        len: u64,
    },
    /// More outstanding read requests than our IRD.
    #[error("more than IRD={ird} outstanding read requests")]
    TooManyReads {
        /// Our IRD.
        ird: u16,
    },
    /// A read request whose body is not 28 bytes or which is not a single segment.
    #[error("malformed read request ({0} body bytes)")]
    MalformedReadRequest(u16),
    /// A read response with no matching outstanding request.
    #[error("read response with no matching outstanding read")]
    UnexpectedReadResponse,
    /// Send-with-Invalidate named an STag that cannot be invalidated.
    #[error("cannot invalidate STag {stag:#x}: {err}")]
    CannotInvalidate {
        /// STag.
        stag: u32,
        /// Cause.
        err: StagError,
    },
    /// The first FPDU is not the negotiated ready-to-receive message.
    #[error("first FPDU is not the negotiated RTR")]
    RtrMismatch,
    /// A Terminate that does not follow RFC 5040 §4.8 (still fatal).
    #[error("malformed Terminate message")]
    BogusTerminate,
    /// A local provider failure (a source slice of the wrong length).
    #[error("local error: {0}")]
    Local(&'static str),
}

impl ProtocolError {
    /// The Terminate layer/type/code for this error.
    pub fn term_code(&self) -> TermCode {
        use ProtocolError as E;
        match self {
            E::Crc { .. } => llp(llp::RECEIVED_CRC),
            E::UlpduTooShort { .. } => llp(llp::FPDU_START),
            E::StreamLost => llp(llp::TCP_STREAM_LOST),
            E::RtrMismatch => llp(llp::NO_MATCHING_RTR),
            E::DdpVersion { tagged: true, .. } => ddp::tagged(ddp::T_VERSION),
            E::DdpVersion { tagged: false, .. } => ddp::untagged(ddp::UT_VERSION),
            E::RdmapVersion(_) => rdmap::remote_op(rdmap::VERSION),
            E::Opcode { .. } => rdmap::remote_op(rdmap::OPCODE),
            E::InvalidQn(_) => ddp::untagged(ddp::UT_INVALID_QN),
            E::MsnRange { .. } => ddp::untagged(ddp::UT_MSN_RANGE),
            E::NoBuffer { .. } => ddp::untagged(ddp::UT_MSN_NOBUF),
            E::InvalidMo { .. } => ddp::untagged(ddp::UT_INVALID_MO),
            E::MessageTooLong { .. } => ddp::untagged(ddp::UT_MSG_TOOLONG),
            E::SinkStag {
                err: StagError::Invalid,
                ..
            } => ddp::tagged(ddp::T_INVALID_STAG),
            E::SinkStag {
                err: StagError::NotAssociated,
                ..
            } => ddp::tagged(ddp::T_STAG_NOT_ASSOC),
            E::SinkStag {
                err: StagError::Access,
                ..
            } => rdmap::remote_prot(rdmap::ACCESS_RIGHTS),
            E::SinkBounds { .. } => ddp::tagged(ddp::T_BASE_BOUNDS),
            E::SinkToWrap { .. } => ddp::tagged(ddp::T_TO_WRAP),
            E::SourceStag {
                err: StagError::Invalid,
                ..
            } => rdmap::remote_prot(rdmap::INVALID_STAG),
            E::SourceStag {
                err: StagError::Access,
                ..
            } => rdmap::remote_prot(rdmap::ACCESS_RIGHTS),
            E::SourceStag {
                err: StagError::NotAssociated,
                ..
            } => rdmap::remote_prot(rdmap::STAG_NOT_ASSOC),
            E::SourceBounds { .. } => rdmap::remote_prot(rdmap::BASE_BOUNDS),
            E::SourceToWrap { .. } => rdmap::remote_prot(rdmap::TO_WRAP),
            E::TooManyReads { .. } => rdmap::remote_op(rdmap::CATASTROPHIC_STREAM),
            E::MalformedReadRequest(_) => rdmap::remote_op(rdmap::CATASTROPHIC_STREAM),
            E::UnexpectedReadResponse => ddp::tagged(ddp::T_INVALID_STAG),
            E::CannotInvalidate { .. } => rdmap::remote_prot(rdmap::CANNOT_INVALIDATE),
            E::BogusTerminate => rdmap::remote_op(rdmap::UNSPECIFIED),
            E::Local(_) => rdmap::local_catastrophic(),
        }
    }
}

/// Why a local post or call was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// The connection is closed or terminating.
    #[error("connection is closed")]
    Closed,
    /// The call does not fit the connection's current state or role.
    #[error("operation not valid in the current state")]
    InvalidState,
    /// The message would need more than 2^32-1 bytes.
    #[error("message too long")]
    TooLong,
    /// TO + length wraps 2^64.
    #[error("tagged offset + length wraps")]
    Wrap,
    /// A config value is out of range.
    #[error("invalid configuration: {0}")]
    Config(&'static str),
    /// MPA-level refusal (e.g. private data too long).
    #[error(transparent)]
    Mpa(#[from] MpaError),
}
