//! RDMAP opcodes, queue numbers and the Read Request body (RFC 5040 §4).
//!
//! This module only names and encodes; the connection enforces which
//! opcode may use which buffer model and queue. Opcodes above 7 (RFC 7306)
//! are unknown here, as they are to siw.

use crate::ddp::{Buffer, DdpHeader};

/// Untagged queue for Sends.
pub const QN_SEND: u32 = 0;
/// Untagged queue for RDMA Read Requests.
pub const QN_READ: u32 = 1;
/// Untagged queue for Terminates.
pub const QN_TERMINATE: u32 = 2;
/// Length of the Read Request body after the untagged DDP header.
pub const READ_REQUEST_LEN: usize = 28;

/// RDMAP opcodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// RDMA Write (tagged).
    Write = 0,
    /// RDMA Read Request (untagged, QN 1).
    ReadRequest = 1,
    /// RDMA Read Response (tagged).
    ReadResponse = 2,
    /// Send (QN 0).
    Send = 3,
    /// Send with Invalidate (QN 0).
    SendInvalidate = 4,
    /// Send with Solicited Event (QN 0).
    SendSe = 5,
    /// Send with Solicited Event and Invalidate (QN 0).
    SendSeInvalidate = 6,
    /// Terminate (QN 2).
    Terminate = 7,
}

impl Opcode {
    /// The opcode for a 4-bit value, if known.
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Self::Write,
            1 => Self::ReadRequest,
            2 => Self::ReadResponse,
            3 => Self::Send,
            4 => Self::SendInvalidate,
            5 => Self::SendSe,
            6 => Self::SendSeInvalidate,
            7 => Self::Terminate,
            _ => return None,
        })
    }

    /// Whether the opcode uses the tagged buffer model.
    pub fn tagged(self) -> bool {
        matches!(self, Self::Write | Self::ReadResponse)
    }

    /// The untagged queue the opcode uses.
    pub fn queue(self) -> Option<u32> {
        match self {
            Self::Write | Self::ReadResponse => None,
            Self::ReadRequest => Some(QN_READ),
            Self::Terminate => Some(QN_TERMINATE),
            _ => Some(QN_SEND),
        }
    }

    /// Whether this is one of the four Send opcodes.
    pub fn is_send(self) -> bool {
        matches!(
            self,
            Self::Send | Self::SendInvalidate | Self::SendSe | Self::SendSeInvalidate
        )
    }

    /// Send with Solicited Event (with or without Invalidate).
    pub fn solicited(self) -> bool {
        matches!(self, Self::SendSe | Self::SendSeInvalidate)
    }

    /// Send with Invalidate (with or without SE).
    pub fn invalidates(self) -> bool {
        matches!(self, Self::SendInvalidate | Self::SendSeInvalidate)
    }
}

/// The RDMA Read Request body (RFC 5040 §4.4).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadRequest {
    /// Data sink STag (at the requester).
    pub sink_stag: u32,
    /// Data sink tagged offset.
    pub sink_to: u64,
    /// RDMA Read message size.
    pub size: u32,
    /// Data source STag (at the responder).
    pub src_stag: u32,
    /// Data source tagged offset.
    pub src_to: u64,
}

impl ReadRequest {
    /// The 28 wire bytes.
    pub fn encode(&self) -> [u8; READ_REQUEST_LEN] {
        let mut b = [0u8; READ_REQUEST_LEN];
        b[0..4].copy_from_slice(&self.sink_stag.to_be_bytes());
        b[4..12].copy_from_slice(&self.sink_to.to_be_bytes());
        b[12..16].copy_from_slice(&self.size.to_be_bytes());
        b[16..20].copy_from_slice(&self.src_stag.to_be_bytes());
        b[20..28].copy_from_slice(&self.src_to.to_be_bytes());
        b
    }

    /// Decodes exactly 28 bytes.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != READ_REQUEST_LEN {
            return None;
        }
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            u64::from_be_bytes(x)
        };
        Some(Self {
            sink_stag: u32_at(0),
            sink_to: u64_at(4),
            size: u32_at(12),
            src_stag: u32_at(16),
            src_to: u64_at(20),
        })
    }
}

/// The header of an untagged message segment.
pub fn untagged_header(op: Opcode, last: bool, rsvd_ulp: u32, msn: u32, mo: u32) -> DdpHeader {
    let qn = op.queue().unwrap_or(QN_SEND);
    DdpHeader::new(
        op as u8,
        last,
        Buffer::Untagged {
            rsvd_ulp,
            qn,
            msn,
            mo,
        },
    )
}

/// The header of a tagged message segment.
pub fn tagged_header(op: Opcode, last: bool, stag: u32, to: u64) -> DdpHeader {
    DdpHeader::new(op as u8, last, Buffer::Tagged { stag, to })
}
