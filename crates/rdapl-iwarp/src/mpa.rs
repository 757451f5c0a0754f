//! MPA Request and Reply frames (RFC 5044 §7.1) and the RFC 6581 IRD/ORD block.
//!
//! A frame is the 16-byte key, a flags byte (M, C, R, Enhanced, 4 reserved
//! bits), the revision byte, the 16-bit private-data length and the private
//! data. Under revision 2 with the Enhanced flag (as siw and Chelsio send it)
//! the first 4 private-data bytes are the IRD/ORD words with the
//! peer-to-peer and RTR control bits ([`EnhancedParams`]).
//!
//! Guarantees: [`decode`] never allocates more than the caller's private-data
//! limit (at most [`MAX_PRIVATE_DATA_WIRE`], RFC 5044's 512), refuses an
//! over-long length as soon as the 20-byte header is in, and reports
//! [`Decoded::NeedMore`] for a frame split across reads.

use crate::error::MpaError;

/// Key of an MPA Request.
pub const KEY_REQ: &[u8; 16] = b"MPA ID Req Frame";
/// Key of an MPA Reply.
pub const KEY_REP: &[u8; 16] = b"MPA ID Rep Frame";
/// Fixed header length before the private data.
pub const HEADER_LEN: usize = 20;
/// RFC 5044's limit on private data.
pub const MAX_PRIVATE_DATA_WIRE: u16 = 512;
/// siw's (and the RDMA CM's) limit, including the 4-byte v2 block; our default.
pub const SIW_MAX_PRIVATE_DATA: u16 = 256;
/// Marker flag.
pub const FLAG_MARKERS: u8 = 0x80;
/// CRC flag.
pub const FLAG_CRC: u8 = 0x40;
/// Reject flag.
pub const FLAG_REJECT: u8 = 0x20;
/// Enhanced (RFC 6581) flag, as siw and cxgb4 use it.
pub const FLAG_ENHANCED: u8 = 0x10;
/// Largest IRD/ORD value the 14-bit fields hold.
pub const IRD_ORD_MASK: u16 = 0x3fff;

/// Request or Reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// "MPA ID Req Frame".
    Request,
    /// "MPA ID Rep Frame".
    Reply,
}

/// An MPA Request or Reply frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpaFrame {
    /// Request or Reply.
    pub kind: FrameKind,
    /// M: markers wanted.
    pub markers: bool,
    /// C: CRC wanted.
    pub crc: bool,
    /// R: connection rejected (replies only).
    pub reject: bool,
    /// Enhanced (RFC 6581) connection setup.
    pub enhanced: bool,
    /// The four low reserved flag bits, sent as zero.
    pub reserved: u8,
    /// Revision (1 or 2).
    pub revision: u8,
    /// All private data, including a v2 IRD/ORD block if present.
    pub private_data: Vec<u8>,
}

/// Result of [`decode`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// More bytes are needed: at least this many in total.
    NeedMore(usize),
    /// A whole frame and the bytes it took.
    Frame(MpaFrame, usize),
}

impl MpaFrame {
    /// Encoded length.
    pub fn encoded_len(&self) -> usize {
        HEADER_LEN + self.private_data.len()
    }

    /// Appends the frame. Fails if the private data exceeds 512 bytes.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), MpaError> {
        let len = self.private_data.len();
        if len > usize::from(MAX_PRIVATE_DATA_WIRE) {
            return Err(MpaError::LocalPrivateDataTooLong {
                len,
                max: MAX_PRIVATE_DATA_WIRE.into(),
            });
        }
        out.extend_from_slice(match self.kind {
            FrameKind::Request => KEY_REQ,
            FrameKind::Reply => KEY_REP,
        });
        let flags = (u8::from(self.markers) << 7)
            | (u8::from(self.crc) << 6)
            | (u8::from(self.reject) << 5)
            | (u8::from(self.enhanced) << 4)
            | (self.reserved & 0x0f);
        out.push(flags);
        out.push(self.revision);
        out.extend_from_slice(&(len as u16).to_be_bytes());
        out.extend_from_slice(&self.private_data);
        Ok(())
    }

    /// The encoded bytes.
    pub fn to_vec(&self) -> Result<Vec<u8>, MpaError> {
        let mut v = Vec::with_capacity(self.encoded_len());
        self.encode(&mut v)?;
        Ok(v)
    }

    /// Whether this frame carries an RFC 6581 IRD/ORD block.
    pub fn is_enhanced(&self) -> bool {
        self.revision == 2 && self.enhanced
    }

    /// The IRD/ORD block and the ULP private data after it, for an enhanced
    /// frame with at least 4 private-data bytes.
    pub fn enhanced_params(&self) -> Option<(EnhancedParams, &[u8])> {
        if self.is_enhanced() && self.private_data.len() >= 4 {
            Some((
                EnhancedParams::decode(&self.private_data[..4]),
                &self.private_data[4..],
            ))
        } else {
            None
        }
    }

    /// The ULP private data (after the IRD/ORD block if there is one).
    pub fn ulp_private_data(&self) -> &[u8] {
        match self.enhanced_params() {
            Some((_, pd)) => pd,
            None => &self.private_data,
        }
    }
}

/// Decodes one frame from the start of `buf`.
///
/// `max_private_data` (clamped to 512) bounds the PD_Length accepted; a
/// larger value fails at once, before any private data is read. Revisions
/// above 2 and unknown keys fail; the caller decides what else to refuse.
pub fn decode(buf: &[u8], max_private_data: u16) -> Result<Decoded, MpaError> {
    let max = max_private_data.min(MAX_PRIVATE_DATA_WIRE);
    if buf.len() < 16 {
        // Check the key prefix early so garbage fails fast.
        let n = buf.len();
        if buf != &KEY_REQ[..n] && buf != &KEY_REP[..n] {
            return Err(MpaError::BadKey);
        }
        return Ok(Decoded::NeedMore(HEADER_LEN));
    }
    let kind = if &buf[..16] == KEY_REQ {
        FrameKind::Request
    } else if &buf[..16] == KEY_REP {
        FrameKind::Reply
    } else {
        return Err(MpaError::BadKey);
    };
    if buf.len() < HEADER_LEN {
        return Ok(Decoded::NeedMore(HEADER_LEN));
    }
    let flags = buf[16];
    let revision = buf[17];
    if revision > 2 {
        return Err(MpaError::UnsupportedRevision(revision));
    }
    let pd_len = u16::from_be_bytes([buf[18], buf[19]]);
    if pd_len > max {
        return Err(MpaError::PrivateDataTooLong { len: pd_len, max });
    }
    let total = HEADER_LEN + usize::from(pd_len);
    if buf.len() < total {
        return Ok(Decoded::NeedMore(total));
    }
    Ok(Decoded::Frame(
        MpaFrame {
            kind,
            markers: flags & FLAG_MARKERS != 0,
            crc: flags & FLAG_CRC != 0,
            reject: flags & FLAG_REJECT != 0,
            enhanced: flags & FLAG_ENHANCED != 0,
            reserved: flags & 0x0f,
            revision,
            private_data: buf[HEADER_LEN..total].to_vec(),
        },
        total,
    ))
}

/// The RFC 6581 IRD/ORD block: the first 4 private-data bytes of an
/// enhanced frame.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EnhancedParams {
    /// Inbound RDMA Read queue depth (14 bits).
    pub ird: u16,
    /// Outbound RDMA Read queue depth (14 bits).
    pub ord: u16,
    /// A: peer-to-peer mode (RTR) requested / accepted.
    pub peer_to_peer: bool,
    /// B: zero-length Send as RTR.
    pub send_rtr: bool,
    /// C: zero-length RDMA Write as RTR.
    pub write_rtr: bool,
    /// D: zero-length RDMA Read as RTR.
    pub read_rtr: bool,
}

impl EnhancedParams {
    /// The 4 wire bytes; IRD and ORD are masked to 14 bits.
    pub fn encode(&self) -> [u8; 4] {
        let ird = (self.ird & IRD_ORD_MASK)
            | (u16::from(self.peer_to_peer) << 15)
            | (u16::from(self.send_rtr) << 14);
        let ord = (self.ord & IRD_ORD_MASK)
            | (u16::from(self.write_rtr) << 15)
            | (u16::from(self.read_rtr) << 14);
        let i = ird.to_be_bytes();
        let o = ord.to_be_bytes();
        [i[0], i[1], o[0], o[1]]
    }

    /// Decodes 4 bytes (panics never; shorter input reads as zeros).
    pub fn decode(b: &[u8]) -> Self {
        let g = |i: usize| b.get(i).copied().unwrap_or(0);
        let ird = u16::from_be_bytes([g(0), g(1)]);
        let ord = u16::from_be_bytes([g(2), g(3)]);
        Self {
            ird: ird & IRD_ORD_MASK,
            ord: ord & IRD_ORD_MASK,
            peer_to_peer: ird & 0x8000 != 0,
            send_rtr: ird & 0x4000 != 0,
            write_rtr: ord & 0x8000 != 0,
            read_rtr: ord & 0x4000 != 0,
        }
    }
}
