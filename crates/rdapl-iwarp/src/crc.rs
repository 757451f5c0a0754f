//! CRC32c for MPA FPDUs (RFC 5044 §6).
//!
//! The CRC covers the whole FPDU before the CRC field: the ULPDU length,
//! the ULPDU and the pad. It is put on the wire as the little-endian bytes
//! of the standard CRC32c value; that is the order siw sends and the order
//! Wireshark calls "Good CRC32". This module guarantees that
//! [`FpduCrc::wire`] over the same bytes gives the same four bytes however
//! the bytes were split across [`FpduCrc::update`] calls.
//!
//! The arithmetic is crc-fast's (carry-less multiplication folding, with
//! VPCLMULQDQ where the CPU has it, chosen at run time): about twice the
//! rate of the CRC32 instruction alone on large FPDUs, which matters
//! because every payload byte is summed on both sides.

use crc_fast::{CrcAlgorithm, Digest};

/// A running CRC32c over FPDU bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FpduCrc(u32);

impl FpduCrc {
    /// A CRC over no bytes yet.
    pub const fn new() -> Self {
        Self(0)
    }

    /// Adds `bytes` to the CRC.
    pub fn update(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        // The running state is the value before its final inversion.
        let mut d = Digest::new_with_init_state(CrcAlgorithm::Crc32Iscsi, u64::from(!self.0));
        d.update(bytes);
        self.0 = d.finalize() as u32;
    }

    /// The standard CRC32c value of the bytes so far.
    pub fn value(&self) -> u32 {
        self.0
    }

    /// The four bytes that go on the wire.
    pub fn wire(&self) -> [u8; 4] {
        self.0.to_le_bytes()
    }
}

/// The wire CRC over several byte slices, in order.
pub fn crc_wire(parts: &[&[u8]]) -> [u8; 4] {
    let mut c = FpduCrc::new();
    for p in parts {
        c.update(p);
    }
    c.wire()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vector() {
        // RFC 3720 B.4: 32 bytes of zeros give 0x8a9136aa.
        let mut c = FpduCrc::new();
        c.update(&[0u8; 32]);
        assert_eq!(c.value(), 0x8a91_36aa);
        assert_eq!(c.wire(), [0xaa, 0x36, 0x91, 0x8a]);
    }

    /// CRC32c bit by bit (reflected polynomial 0x82F63B78): a reference
    /// that shares nothing with the folding code.
    fn bitwise(data: &[u8]) -> u32 {
        let mut c = !0u32;
        for &b in data {
            c ^= u32::from(b);
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    (c >> 1) ^ 0x82F6_3B78
                } else {
                    c >> 1
                };
            }
        }
        !c
    }

    #[test]
    fn rfc3720_vectors() {
        let ones = [0xffu8; 32];
        let up: Vec<u8> = (0..32u8).collect();
        let down: Vec<u8> = (0..32u8).rev().collect();
        assert_eq!(crc_wire(&[&ones]), 0x62a8_ab43u32.to_le_bytes());
        assert_eq!(crc_wire(&[&up]), 0x46dd_794eu32.to_le_bytes());
        assert_eq!(crc_wire(&[&down]), 0x113f_db5cu32.to_le_bytes());
    }

    #[test]
    fn large_and_unaligned_match_the_bitwise_reference() {
        // Long enough for every SIMD path; every start alignment; splits
        // that leave short heads and tails.
        let data: Vec<u8> = (0..9000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for start in 0..16 {
            for len in [0, 1, 15, 63, 64, 255, 256, 1024, 4093, 8000] {
                let d = &data[start..start + len];
                let want = bitwise(d).to_le_bytes();
                assert_eq!(crc_wire(&[d]), want, "start {start} len {len}");
                for cut in [1, 7, 64, len / 2, len.saturating_sub(3)] {
                    let cut = cut.min(len);
                    assert_eq!(crc_wire(&[&d[..cut], &d[cut..]]), want, "cut {cut}");
                }
            }
        }
    }

    #[test]
    fn split_does_not_matter() {
        let data: Vec<u8> = (0..200u32).map(|i| (i * 7) as u8).collect();
        let whole = crc_wire(&[&data]);
        for cut in 0..data.len() {
            assert_eq!(crc_wire(&[&data[..cut], &data[cut..]]), whole);
        }
    }
}
