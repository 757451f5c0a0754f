//! DDP segment headers (RFC 5041 §4) and segmentation.
//!
//! The header starts right after the MPA ULPDU length: the DDP control byte
//! (T, L, 4 reserved bits, DV), the RDMAP control byte (RV, 2 reserved bits,
//! opcode), then either STag + TO (tagged, 14 bytes in all) or RsvdULP + QN +
//! MSN + MO (untagged, 18 bytes). This module encodes and decodes every bit,
//! so encode/decode round-trips exactly; protocol checks live in the
//! connection. [`Segments`] splits a message so that every FPDU fits one
//! TCP MSS and no segment but the last needs padding.

/// DDP version this crate speaks.
pub const DDP_VERSION: u8 = 1;
/// RDMAP version this crate speaks.
pub const RDMAP_VERSION: u8 = 1;
/// Tagged header length (after the MPA length field).
pub const TAGGED_HEADER_LEN: usize = 14;
/// Untagged header length (after the MPA length field).
pub const UNTAGGED_HEADER_LEN: usize = 18;

/// Where a segment's payload goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buffer {
    /// Tagged buffer model.
    Tagged {
        /// Steering tag.
        stag: u32,
        /// Tagged offset.
        to: u64,
    },
    /// Untagged buffer model.
    Untagged {
        /// RsvdULP: the invalidate STag for Send with Invalidate, else 0.
        rsvd_ulp: u32,
        /// Queue number.
        qn: u32,
        /// Message sequence number.
        msn: u32,
        /// Message offset.
        mo: u32,
    },
}

/// A DDP + RDMAP segment header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DdpHeader {
    /// L: last segment of the message.
    pub last: bool,
    /// The 4 reserved DDP control bits.
    pub ddp_reserved: u8,
    /// DDP version (2 bits).
    pub ddp_version: u8,
    /// RDMAP version (2 bits).
    pub rdmap_version: u8,
    /// The 2 reserved RDMAP control bits.
    pub rdmap_reserved: u8,
    /// RDMAP opcode (4 bits).
    pub opcode: u8,
    /// Tagged or untagged fields.
    pub buffer: Buffer,
}

impl DdpHeader {
    /// A version-1 header with zero reserved bits.
    pub fn new(opcode: u8, last: bool, buffer: Buffer) -> Self {
        Self {
            last,
            ddp_reserved: 0,
            ddp_version: DDP_VERSION,
            rdmap_version: RDMAP_VERSION,
            rdmap_reserved: 0,
            opcode,
            buffer,
        }
    }

    /// Whether the T bit is set.
    pub fn tagged(&self) -> bool {
        matches!(self.buffer, Buffer::Tagged { .. })
    }

    /// Header length: 14 or 18.
    pub fn len(&self) -> usize {
        if self.tagged() {
            TAGGED_HEADER_LEN
        } else {
            UNTAGGED_HEADER_LEN
        }
    }

    /// Never empty; present for clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Header length implied by a DDP control byte.
    pub fn len_for_control(b0: u8) -> usize {
        if b0 & 0x80 != 0 {
            TAGGED_HEADER_LEN
        } else {
            UNTAGGED_HEADER_LEN
        }
    }

    /// Writes the header into `out[..self.len()]`; reserved and version
    /// fields are masked to their widths.
    pub fn encode(&self, out: &mut [u8]) {
        out[0] = (u8::from(self.tagged()) << 7)
            | (u8::from(self.last) << 6)
            | ((self.ddp_reserved & 0xf) << 2)
            | (self.ddp_version & 3);
        out[1] = ((self.rdmap_version & 3) << 6)
            | ((self.rdmap_reserved & 3) << 4)
            | (self.opcode & 0xf);
        match self.buffer {
            Buffer::Tagged { stag, to } => {
                out[2..6].copy_from_slice(&stag.to_be_bytes());
                out[6..14].copy_from_slice(&to.to_be_bytes());
            }
            Buffer::Untagged {
                rsvd_ulp,
                qn,
                msn,
                mo,
            } => {
                out[2..6].copy_from_slice(&rsvd_ulp.to_be_bytes());
                out[6..10].copy_from_slice(&qn.to_be_bytes());
                out[10..14].copy_from_slice(&msn.to_be_bytes());
                out[14..18].copy_from_slice(&mo.to_be_bytes());
            }
        }
    }

    /// The encoded bytes (14 or 18).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len()];
        self.encode(&mut v);
        v
    }

    /// Decodes from the start of `b`; `None` if `b` is shorter than the
    /// header its T bit announces.
    pub fn decode(b: &[u8]) -> Option<Self> {
        let b0 = *b.first()?;
        let len = Self::len_for_control(b0);
        if b.len() < len {
            return None;
        }
        let be32 = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let buffer = if b0 & 0x80 != 0 {
            let mut to = [0u8; 8];
            to.copy_from_slice(&b[6..14]);
            Buffer::Tagged {
                stag: be32(2),
                to: u64::from_be_bytes(to),
            }
        } else {
            Buffer::Untagged {
                rsvd_ulp: be32(2),
                qn: be32(6),
                msn: be32(10),
                mo: be32(14),
            }
        };
        Some(Self {
            last: b0 & 0x40 != 0,
            ddp_reserved: (b0 >> 2) & 0xf,
            ddp_version: b0 & 3,
            rdmap_version: b[1] >> 6,
            rdmap_reserved: (b[1] >> 4) & 3,
            opcode: b[1] & 0xf,
            buffer,
        })
    }
}

/// Largest FPDU for a TCP MSS: the MSS rounded down to 8 (as siw does),
/// capped so the ULPDU length fits 16 bits.
pub fn max_fpdu_len(mss: u32) -> u32 {
    (mss.min(65536)) & !7
}

/// Largest DDP payload per segment (the MULPDU less the header) for a
/// header of `header_len` bytes; a multiple of 4 so non-last segments need
/// no pad. Zero if the MSS is too small for any payload.
pub fn max_segment_payload(mss: u32, header_len: usize) -> u32 {
    let overhead = 2 + header_len as u32 + 4;
    max_fpdu_len(mss).saturating_sub(overhead) & !3
}

/// One DDP segment of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Byte offset in the message (the MO, or the TO delta).
    pub offset: u32,
    /// Payload length.
    pub len: u32,
    /// Whether this is the last segment.
    pub last: bool,
}

/// Splits a message of `total` bytes into segments of at most `max` bytes.
/// A zero-length message is one empty last segment. `max` of 0 is treated
/// as 4.
#[derive(Debug, Clone)]
pub struct Segments {
    total: u32,
    max: u32,
    next: u32,
    done: bool,
}

impl Segments {
    /// A segmenter.
    pub fn new(total: u32, max: u32) -> Self {
        Self {
            total,
            max: max.max(4),
            next: 0,
            done: false,
        }
    }

    /// The segment starting at `offset` (for resuming).
    pub fn at(total: u32, max: u32, offset: u32) -> Segment {
        let max = max.max(4);
        let len = (total - offset.min(total)).min(max);
        Segment {
            offset,
            len,
            last: offset.saturating_add(len) >= total,
        }
    }
}

impl Iterator for Segments {
    type Item = Segment;
    fn next(&mut self) -> Option<Segment> {
        if self.done {
            return None;
        }
        let s = Segments::at(self.total, self.max, self.next);
        self.next += s.len;
        self.done = s.last;
        Some(s)
    }
}

/// Checks that `[to, to+len)` lies in the region `[base, base+region_len)`,
/// without overflow. Returns the byte offset of `to` in the region.
pub fn check_bounds(base: u64, region_len: u64, to: u64, len: u64) -> Result<u64, BoundsError> {
    let end = to.checked_add(len).ok_or(BoundsError::Wrap)?;
    let region_end = u128::from(base) + u128::from(region_len);
    if to < base || u128::from(end) > region_end {
        return Err(BoundsError::OutOfBounds);
    }
    Ok(to - base)
}

/// Why [`check_bounds`] failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoundsError {
    /// TO + length overflows 64 bits.
    Wrap,
    /// Outside the region.
    OutOfBounds,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_message() {
        for total in [0u32, 1, 3, 4, 100, 1000, 4096] {
            for max in [4u32, 8, 100, 1432] {
                let segs: Vec<_> = Segments::new(total, max).collect();
                assert!(segs.last().unwrap().last);
                assert_eq!(segs.iter().map(|s| s.len).sum::<u32>(), total);
                let mut off = 0;
                for s in &segs {
                    assert_eq!(s.offset, off);
                    assert!(s.len <= max);
                    if !s.last {
                        assert_eq!(s.len % 4, 0);
                    }
                    off += s.len;
                }
            }
        }
    }

    #[test]
    fn mulpdu_fits_mss() {
        assert_eq!(max_segment_payload(1460, TAGGED_HEADER_LEN), 1456 - 20);
        assert_eq!(max_segment_payload(1460, UNTAGGED_HEADER_LEN), 1456 - 24);
        assert_eq!(max_segment_payload(65495, TAGGED_HEADER_LEN), 65488 - 20);
        assert_eq!(max_segment_payload(10, TAGGED_HEADER_LEN), 0);
    }

    #[test]
    fn bounds() {
        assert_eq!(check_bounds(100, 10, 100, 10), Ok(0));
        assert_eq!(check_bounds(100, 10, 105, 5), Ok(5));
        assert_eq!(check_bounds(100, 10, 105, 6), Err(BoundsError::OutOfBounds));
        assert_eq!(check_bounds(100, 10, 99, 1), Err(BoundsError::OutOfBounds));
        assert_eq!(
            check_bounds(0, u64::MAX, u64::MAX, 1),
            Err(BoundsError::Wrap)
        );
        assert_eq!(check_bounds(u64::MAX, u64::MAX, u64::MAX, 0), Ok(0));
    }
}
