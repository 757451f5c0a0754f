//! RDMAP Terminate messages (RFC 5040 §4.8, §7) and their error codes.
//!
//! A Terminate body is the 4-byte Terminate Control word (Layer, Error Type,
//! Error Code, M/D/R header-control bits), then, when D is set, the DDP
//! segment length and the copied DDP header (14 bytes tagged, 18 untagged),
//! then, when R is set, the 28-byte copied RDMAP header. A cause
//! ([`TermCode`]) prints with the RFCs' names for its layer, type and code.
//! This module encodes
//! in RFC bit order (Layer in the high nibble) and guarantees that decoding
//! never reads past the body and never allocates more than
//! [`MAX_TERMINATE_BODY`] bytes.

/// Largest Terminate body this crate sends or accepts: control + segment
/// length + untagged DDP header + RDMAP header.
pub const MAX_TERMINATE_BODY: usize = 4 + 2 + 18 + 28;

/// Terminate layer values (RFC 5040 §7.1).
pub mod layer {
    /// RDMAP.
    pub const RDMAP: u8 = 0;
    /// DDP.
    pub const DDP: u8 = 1;
    /// The lower-layer protocol (MPA/TCP).
    pub const LLP: u8 = 2;
}

/// A Terminate cause: layer, error type and error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TermCode {
    /// Layer (see [`layer`]).
    pub layer: u8,
    /// Error type within the layer.
    pub etype: u8,
    /// Error code within the type.
    pub ecode: u8,
}

impl TermCode {
    /// The names of the layer, the error type and the error code as the
    /// RFCs give them (RFC 5040 §7, RFC 5041 §7, RFC 5044 §8, RFC 6581 §9);
    /// `None` where a value has no name there.
    pub fn names(
        &self,
    ) -> (
        Option<&'static str>,
        Option<&'static str>,
        Option<&'static str>,
    ) {
        let (layer_name, etype, ecode) = match self.layer {
            layer::RDMAP => (
                "RDMAP",
                match self.etype {
                    rdmap::ETYPE_LOCAL_CATASTROPHIC => Some("local catastrophic error"),
                    rdmap::ETYPE_REMOTE_PROTECTION => Some("remote protection error"),
                    rdmap::ETYPE_REMOTE_OPERATION => Some("remote operation error"),
                    _ => None,
                },
                match (self.etype, self.ecode) {
                    (rdmap::ETYPE_LOCAL_CATASTROPHIC, 0) => Some("local catastrophic"),
                    (rdmap::ETYPE_REMOTE_PROTECTION, rdmap::INVALID_STAG) => Some("invalid STag"),
                    (rdmap::ETYPE_REMOTE_PROTECTION, rdmap::BASE_BOUNDS) => {
                        Some("base or bounds violation")
                    }
                    (rdmap::ETYPE_REMOTE_PROTECTION, rdmap::ACCESS_RIGHTS) => {
                        Some("access rights violation")
                    }
                    (rdmap::ETYPE_REMOTE_PROTECTION, rdmap::STAG_NOT_ASSOC) => {
                        Some("STag not associated with RDMAP stream")
                    }
                    (rdmap::ETYPE_REMOTE_PROTECTION, rdmap::TO_WRAP) => Some("TO wrap"),
                    (rdmap::ETYPE_REMOTE_OPERATION, rdmap::VERSION) => {
                        Some("invalid RDMAP version")
                    }
                    (rdmap::ETYPE_REMOTE_OPERATION, rdmap::OPCODE) => Some("unexpected opcode"),
                    (rdmap::ETYPE_REMOTE_OPERATION, rdmap::CATASTROPHIC_STREAM) => {
                        Some("catastrophic error, localized to RDMAP stream")
                    }
                    (rdmap::ETYPE_REMOTE_OPERATION, rdmap::CATASTROPHIC_GLOBAL) => {
                        Some("catastrophic error, global")
                    }
                    (
                        rdmap::ETYPE_REMOTE_PROTECTION | rdmap::ETYPE_REMOTE_OPERATION,
                        rdmap::CANNOT_INVALIDATE,
                    ) => Some("STag cannot be invalidated"),
                    (
                        rdmap::ETYPE_REMOTE_PROTECTION | rdmap::ETYPE_REMOTE_OPERATION,
                        rdmap::UNSPECIFIED,
                    ) => Some("unspecified error"),
                    _ => None,
                },
            ),
            layer::DDP => (
                "DDP",
                match self.etype {
                    ddp::ETYPE_LOCAL_CATASTROPHIC => Some("local catastrophic error"),
                    ddp::ETYPE_TAGGED => Some("tagged buffer error"),
                    ddp::ETYPE_UNTAGGED => Some("untagged buffer error"),
                    _ => None,
                },
                match (self.etype, self.ecode) {
                    (ddp::ETYPE_LOCAL_CATASTROPHIC, 0) => Some("local catastrophic"),
                    (ddp::ETYPE_TAGGED, ddp::T_INVALID_STAG) => Some("invalid STag"),
                    (ddp::ETYPE_TAGGED, ddp::T_BASE_BOUNDS) => Some("base or bounds violation"),
                    (ddp::ETYPE_TAGGED, ddp::T_STAG_NOT_ASSOC) => {
                        Some("STag not associated with DDP stream")
                    }
                    (ddp::ETYPE_TAGGED, ddp::T_TO_WRAP) => Some("TO wrap"),
                    (ddp::ETYPE_TAGGED, ddp::T_VERSION) => Some("invalid DDP version"),
                    (ddp::ETYPE_UNTAGGED, ddp::UT_INVALID_QN) => Some("invalid QN"),
                    (ddp::ETYPE_UNTAGGED, ddp::UT_MSN_NOBUF) => {
                        Some("invalid MSN, no buffer available")
                    }
                    (ddp::ETYPE_UNTAGGED, ddp::UT_MSN_RANGE) => Some("invalid MSN, MSN range"),
                    (ddp::ETYPE_UNTAGGED, ddp::UT_INVALID_MO) => Some("invalid MO"),
                    (ddp::ETYPE_UNTAGGED, ddp::UT_MSG_TOOLONG) => {
                        Some("DDP message too long for available buffer")
                    }
                    (ddp::ETYPE_UNTAGGED, ddp::UT_VERSION) => Some("invalid DDP version"),
                    _ => None,
                },
            ),
            layer::LLP => (
                "LLP",
                (self.etype == 0).then_some("MPA"),
                match (self.etype, self.ecode) {
                    (0, llp::TCP_STREAM_LOST) => Some("TCP connection closed, stream lost"),
                    (0, llp::RECEIVED_CRC) => Some("received MPA CRC does not match"),
                    (0, llp::FPDU_START) => Some("marker and ULPDU length mismatch"),
                    (0, llp::INVALID_REQ_RESP) => Some("invalid MPA request or reply"),
                    (0, llp::LOCAL_CATASTROPHIC) => Some("local catastrophic error"),
                    (0, llp::INSUFFICIENT_IRD) => Some("insufficient IRD resources"),
                    (0, llp::NO_MATCHING_RTR) => Some("no matching RTR"),
                    _ => None,
                },
            ),
            _ => return (None, None, None),
        };
        (Some(layer_name), etype, ecode)
    }
}

/// `DDP tagged buffer error: invalid STag (layer 1, type 1, code 0x00)`;
/// the numbers alone where the RFCs name nothing.
impl std::fmt::Display for TermCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (l, t, c) = self.names();
        if let Some(l) = l {
            write!(f, "{l}")?;
            if let Some(t) = t {
                write!(f, " {t}")?;
            }
            if let Some(c) = c {
                write!(f, ": {c}")?;
            }
            write!(f, " ")?;
        }
        write!(
            f,
            "(layer {}, type {}, code {:#04x})",
            self.layer, self.etype, self.ecode
        )
    }
}

/// RDMAP error types and codes (RFC 5040 §7.2).
pub mod rdmap {
    use super::{TermCode, layer};
    /// Error type: local catastrophic.
    pub const ETYPE_LOCAL_CATASTROPHIC: u8 = 0;
    /// Error type: remote protection.
    pub const ETYPE_REMOTE_PROTECTION: u8 = 1;
    /// Error type: remote operation.
    pub const ETYPE_REMOTE_OPERATION: u8 = 2;
    /// Invalid STag.
    pub const INVALID_STAG: u8 = 0x00;
    /// Base or bounds violation.
    pub const BASE_BOUNDS: u8 = 0x01;
    /// Access rights violation.
    pub const ACCESS_RIGHTS: u8 = 0x02;
    /// STag not associated with RDMAP stream.
    pub const STAG_NOT_ASSOC: u8 = 0x03;
    /// TO wrap.
    pub const TO_WRAP: u8 = 0x04;
    /// Invalid RDMAP version.
    pub const VERSION: u8 = 0x05;
    /// Unexpected opcode.
    pub const OPCODE: u8 = 0x06;
    /// Catastrophic error, localized to the RDMAP stream.
    pub const CATASTROPHIC_STREAM: u8 = 0x07;
    /// Catastrophic error, global.
    pub const CATASTROPHIC_GLOBAL: u8 = 0x08;
    /// STag cannot be invalidated.
    pub const CANNOT_INVALIDATE: u8 = 0x09;
    /// Unspecified.
    pub const UNSPECIFIED: u8 = 0xff;
    /// A remote-protection cause.
    pub const fn remote_prot(ecode: u8) -> TermCode {
        TermCode {
            layer: layer::RDMAP,
            etype: ETYPE_REMOTE_PROTECTION,
            ecode,
        }
    }
    /// A remote-operation cause.
    pub const fn remote_op(ecode: u8) -> TermCode {
        TermCode {
            layer: layer::RDMAP,
            etype: ETYPE_REMOTE_OPERATION,
            ecode,
        }
    }
    /// The local catastrophic cause.
    pub const fn local_catastrophic() -> TermCode {
        TermCode {
            layer: layer::RDMAP,
            etype: ETYPE_LOCAL_CATASTROPHIC,
            ecode: 0,
        }
    }
}

/// DDP error types and codes (RFC 5041 §7.2).
pub mod ddp {
    use super::{TermCode, layer};
    /// Error type: local catastrophic.
    pub const ETYPE_LOCAL_CATASTROPHIC: u8 = 0;
    /// Error type: tagged buffer.
    pub const ETYPE_TAGGED: u8 = 1;
    /// Error type: untagged buffer.
    pub const ETYPE_UNTAGGED: u8 = 2;
    /// Tagged: invalid STag.
    pub const T_INVALID_STAG: u8 = 0x00;
    /// Tagged: base or bounds violation.
    pub const T_BASE_BOUNDS: u8 = 0x01;
    /// Tagged: STag not associated with DDP stream.
    pub const T_STAG_NOT_ASSOC: u8 = 0x02;
    /// Tagged: TO wrap.
    pub const T_TO_WRAP: u8 = 0x03;
    /// Tagged: invalid DDP version.
    pub const T_VERSION: u8 = 0x04;
    /// Untagged: invalid QN.
    pub const UT_INVALID_QN: u8 = 0x01;
    /// Untagged: invalid MSN, no buffer available.
    pub const UT_MSN_NOBUF: u8 = 0x02;
    /// Untagged: invalid MSN, MSN range.
    pub const UT_MSN_RANGE: u8 = 0x03;
    /// Untagged: invalid MO.
    pub const UT_INVALID_MO: u8 = 0x04;
    /// Untagged: DDP message too long for the buffer.
    pub const UT_MSG_TOOLONG: u8 = 0x05;
    /// Untagged: invalid DDP version.
    pub const UT_VERSION: u8 = 0x06;
    /// A tagged-buffer cause.
    pub const fn tagged(ecode: u8) -> TermCode {
        TermCode {
            layer: layer::DDP,
            etype: ETYPE_TAGGED,
            ecode,
        }
    }
    /// An untagged-buffer cause.
    pub const fn untagged(ecode: u8) -> TermCode {
        TermCode {
            layer: layer::DDP,
            etype: ETYPE_UNTAGGED,
            ecode,
        }
    }
}

/// LLP (MPA) error codes (RFC 5044 §8, RFC 6581 §9); the error type is 0.
pub mod llp {
    use super::{TermCode, layer};
    /// TCP connection closed / stream lost.
    pub const TCP_STREAM_LOST: u8 = 0x01;
    /// Received MPA CRC does not match.
    pub const RECEIVED_CRC: u8 = 0x02;
    /// Marker / ULPDU length mismatch (bad FPDU start).
    pub const FPDU_START: u8 = 0x03;
    /// Invalid MPA Request or Reply.
    pub const INVALID_REQ_RESP: u8 = 0x04;
    /// Local catastrophic error.
    pub const LOCAL_CATASTROPHIC: u8 = 0x05;
    /// Insufficient IRD resources (RFC 6581).
    pub const INSUFFICIENT_IRD: u8 = 0x06;
    /// No matching RTR (RFC 6581).
    pub const NO_MATCHING_RTR: u8 = 0x07;
    /// An LLP cause with error type 0 (MPA).
    pub const fn code(ecode: u8) -> TermCode {
        TermCode {
            layer: layer::LLP,
            etype: 0,
            ecode,
        }
    }
}

/// Shorthand for [`llp::code`].
pub const fn llp(ecode: u8) -> TermCode {
    llp::code(ecode)
}

/// The copied DDP header of a Terminate (present iff the D bit is set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerminatedDdp {
    /// The DDP segment length of the offending segment (valid if M is set).
    pub segment_length: u16,
    /// The DDP header bytes: 14 if its T bit is set, else 18.
    pub header: Vec<u8>,
}

/// A decoded Terminate body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Terminate {
    /// The cause; layer and error type are 4 bits each on the wire.
    pub code: TermCode,
    /// M: the DDP segment length is valid.
    pub m: bool,
    /// The 13 reserved bits of the control word (zero when we send).
    pub reserved: u16,
    /// The copied DDP header (D bit).
    pub ddp: Option<TerminatedDdp>,
    /// The copied RDMAP header (R bit), 28 bytes.
    pub rdmap: Option<[u8; 28]>,
}

/// Why a Terminate body could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TerminateDecodeError {
    /// Shorter than the bits say.
    #[error("terminate body truncated")]
    Truncated,
    /// Bytes left over after the announced headers.
    #[error("terminate body has {0} trailing bytes")]
    Trailing(usize),
}

impl Terminate {
    /// A Terminate with no copied headers.
    pub fn new(code: TermCode) -> Self {
        Self {
            code,
            m: false,
            reserved: 0,
            ddp: None,
            rdmap: None,
        }
    }

    /// Encoded body length.
    pub fn encoded_len(&self) -> usize {
        4 + self.ddp.as_ref().map_or(0, |d| 2 + d.header.len()) + self.rdmap.map_or(0, |_| 28)
    }

    /// Appends the body to `out`. The layer and error type are truncated to
    /// 4 bits and `reserved` to 13 bits; a copied DDP header longer than 18
    /// bytes is truncated to 18.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(((self.code.layer & 0xf) << 4) | (self.code.etype & 0xf));
        out.push(self.code.ecode);
        let hdrct = (u16::from(self.m) << 15)
            | (u16::from(self.ddp.is_some()) << 14)
            | (u16::from(self.rdmap.is_some()) << 13)
            | (self.reserved & 0x1fff);
        out.extend_from_slice(&hdrct.to_be_bytes());
        if let Some(d) = &self.ddp {
            out.extend_from_slice(&d.segment_length.to_be_bytes());
            let n = d.header.len().min(18);
            out.extend_from_slice(&d.header[..n]);
        }
        if let Some(r) = &self.rdmap {
            out.extend_from_slice(r);
        }
    }

    /// Decodes a whole Terminate body.
    pub fn decode(b: &[u8]) -> Result<Self, TerminateDecodeError> {
        if b.len() < 4 {
            return Err(TerminateDecodeError::Truncated);
        }
        let code = TermCode {
            layer: b[0] >> 4,
            etype: b[0] & 0xf,
            ecode: b[1],
        };
        let hdrct = u16::from_be_bytes([b[2], b[3]]);
        let mut rest = &b[4..];
        let ddp = if hdrct & 0x4000 != 0 {
            if rest.len() < 3 {
                return Err(TerminateDecodeError::Truncated);
            }
            let segment_length = u16::from_be_bytes([rest[0], rest[1]]);
            let hlen = if rest[2] & 0x80 != 0 { 14 } else { 18 };
            if rest.len() < 2 + hlen {
                return Err(TerminateDecodeError::Truncated);
            }
            let header = rest[2..2 + hlen].to_vec();
            rest = &rest[2 + hlen..];
            Some(TerminatedDdp {
                segment_length,
                header,
            })
        } else {
            None
        };
        let rdmap = if hdrct & 0x2000 != 0 {
            if rest.len() < 28 {
                return Err(TerminateDecodeError::Truncated);
            }
            let mut r = [0u8; 28];
            r.copy_from_slice(&rest[..28]);
            rest = &rest[28..];
            Some(r)
        } else {
            None
        };
        if !rest.is_empty() {
            return Err(TerminateDecodeError::Trailing(rest.len()));
        }
        Ok(Self {
            code,
            m: hdrct & 0x8000 != 0,
            reserved: hdrct & 0x1fff,
            ddp,
            rdmap,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every cause this crate defines, by its constructor.
    fn defined() -> Vec<TermCode> {
        let mut v = vec![rdmap::local_catastrophic()];
        for c in [
            rdmap::INVALID_STAG,
            rdmap::BASE_BOUNDS,
            rdmap::ACCESS_RIGHTS,
            rdmap::STAG_NOT_ASSOC,
            rdmap::TO_WRAP,
            rdmap::CANNOT_INVALIDATE,
            rdmap::UNSPECIFIED,
        ] {
            v.push(rdmap::remote_prot(c));
        }
        for c in [
            rdmap::VERSION,
            rdmap::OPCODE,
            rdmap::CATASTROPHIC_STREAM,
            rdmap::CATASTROPHIC_GLOBAL,
            rdmap::CANNOT_INVALIDATE,
            rdmap::UNSPECIFIED,
        ] {
            v.push(rdmap::remote_op(c));
        }
        for c in [
            ddp::T_INVALID_STAG,
            ddp::T_BASE_BOUNDS,
            ddp::T_STAG_NOT_ASSOC,
            ddp::T_TO_WRAP,
            ddp::T_VERSION,
        ] {
            v.push(ddp::tagged(c));
        }
        for c in [
            ddp::UT_INVALID_QN,
            ddp::UT_MSN_NOBUF,
            ddp::UT_MSN_RANGE,
            ddp::UT_INVALID_MO,
            ddp::UT_MSG_TOOLONG,
            ddp::UT_VERSION,
        ] {
            v.push(ddp::untagged(c));
        }
        for c in 1..=7 {
            v.push(llp(c));
        }
        v
    }

    #[test]
    fn every_defined_cause_has_its_three_names() {
        for c in defined() {
            let (l, t, e) = c.names();
            assert!(l.is_some() && t.is_some() && e.is_some(), "{c:?}: {c}");
        }
    }

    #[test]
    fn causes_print_their_names_and_numbers() {
        assert_eq!(
            ddp::tagged(ddp::T_INVALID_STAG).to_string(),
            "DDP tagged buffer error: invalid STag (layer 1, type 1, code 0x00)"
        );
        assert_eq!(
            llp(llp::RECEIVED_CRC).to_string(),
            "LLP MPA: received MPA CRC does not match (layer 2, type 0, code 0x02)"
        );
        assert_eq!(
            rdmap::remote_prot(rdmap::ACCESS_RIGHTS).to_string(),
            "RDMAP remote protection error: access rights violation (layer 0, type 1, code 0x02)"
        );
        // What the RFCs do not name is shown as numbers only.
        let odd = TermCode {
            layer: 1,
            etype: 1,
            ecode: 0x7f,
        };
        assert_eq!(
            odd.to_string(),
            "DDP tagged buffer error (layer 1, type 1, code 0x7f)"
        );
        let unknown = TermCode {
            layer: 9,
            etype: 3,
            ecode: 4,
        };
        assert_eq!(unknown.to_string(), "(layer 9, type 3, code 0x04)");
        // A code of one type is not named under another.
        assert_eq!(ddp::untagged(ddp::T_INVALID_STAG).names().2, None);
    }
}
