//! CRC32c for MPA FPDUs (RFC 5044 §6).
//!
//! The CRC covers the whole FPDU before the CRC field: the ULPDU length,
//! the ULPDU and the pad. It is put on the wire as the little-endian bytes
//! of the standard CRC32c value; that is the order siw sends and the order
//! Wireshark calls "Good CRC32". This module guarantees that
//! [`FpduCrc::wire`] over the same bytes gives the same four bytes however
//! the bytes were split across [`FpduCrc::update`] calls.
//!
//! Two ways to sum are at hand, and which is faster depends on the CPU:
//! the CRC32 instruction on three streams at once (the `crc32c` crate; a
//! table walk where the CPU has no such instruction) and crc-fast's
//! carry-less folding (VPCLMULQDQ with AVX-512 where the CPU has it, else
//! 128-bit PCLMULQDQ fused with the CRC32 instruction). Every payload
//! byte is summed on both sides, so the rate matters, and no rule by CPU
//! feature picks right (the folding wins on Zen 1 and with AVX-512, the
//! instruction on a Zen 4 without AVX-512; figures in rdapl-bench's
//! HISTORY.md). So the first sum of [`WIDE_MIN`] bytes or more in a process
//! times both on the same 64 KiB, as Linux picks its RAID-6 and XOR
//! routines at boot, and keeps the faster for inputs from that size.
//! Smaller inputs take the instruction (crc-fast's fixed cost per call
//! outweighs its rate there), and below [`SMALL_MAX`] bytes (an FPDU's
//! pad) a table walk. Headers and other short pieces take the
//! instruction: a walk takes fewer instructions but, each byte's lookup
//! waiting on the last, more time from 4 bytes on. The choice changes no
//! value: every way computes the standard CRC32c, each checked against a
//! bitwise reference.

use crc_fast::{CrcAlgorithm, Digest};
use std::hint::black_box;
use std::sync::OnceLock;
use std::time::Instant;

/// Inputs from this size take the faster of the two ways, found by
/// timing both once.
pub const WIDE_MIN: usize = 256;

/// Whether crc-fast's folding beat the CRC32 instruction here (timed once,
/// the best of five interleaved runs of each over 64 KiB in cache).
fn wide() -> bool {
    static WIDE: OnceLock<bool> = OnceLock::new();
    *WIDE.get_or_init(|| {
        let buf = vec![0x5a_u8; 64 << 10];
        let ways: [fn(u32, &[u8]) -> u32; 2] = [crc32c::crc32c_append, folded];
        let mut best = [u128::MAX; 2];
        for _ in 0..5 {
            for (way, b) in ways.iter().zip(best.iter_mut()) {
                let t = Instant::now();
                black_box(way(0, black_box(&buf)));
                *b = (*b).min(t.elapsed().as_nanos());
            }
        }
        best[1] < best[0]
    })
}

/// Inputs shorter than this are summed with a table walk: below it the
/// walk is faster than a call of the CRC32 instruction's way.
pub const SMALL_MAX: usize = 4;

/// The reflected CRC32c polynomial.
const POLY: u32 = 0x82F6_3B78;

/// The byte-at-a-time table: `TABLE[b]` is the CRC register after byte
/// `b`.
static TABLE: [u32; 256] = make_table();

const fn make_table() -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
}

/// Advances the raw (not inverted) CRC register `c` over `bytes`.
fn table_update(mut c: u32, bytes: &[u8]) -> u32 {
    for &b in bytes {
        c = (c >> 8) ^ TABLE[((c ^ u32::from(b)) & 0xff) as usize];
    }
    c
}

/// crc-fast's sum of `bytes` after the bytes whose CRC32c is `crc`.
fn folded(crc: u32, bytes: &[u8]) -> u32 {
    // crc-fast's running state is the value before its final inversion.
    let mut d = Digest::new_with_init_state(CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    d.update(bytes);
    d.finalize() as u32
}

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
        self.0 = if bytes.len() < SMALL_MAX {
            // The register is the value before its final inversion.
            !table_update(!self.0, bytes)
        } else if bytes.len() >= WIDE_MIN && wide() {
            folded(self.0, bytes)
        } else {
            crc32c::crc32c_append(self.0, bytes)
        };
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

    /// Every length around the switches between the table walk and the
    /// two ways, and sums that cross them, match the bitwise reference;
    /// so does each of the three on its own, whichever this CPU uses.
    #[test]
    fn both_ways_agree_with_the_reference() {
        let data: Vec<u8> = (0..2 * WIDE_MIN as u32 + 40)
            .map(|i| (i.wrapping_mul(40_503) >> 5) as u8)
            .collect();
        for len in (0..24)
            .chain(SMALL_MAX.saturating_sub(9)..SMALL_MAX + 9)
            .chain(WIDE_MIN - 9..WIDE_MIN + 9)
            .chain([2 * WIDE_MIN + 40])
        {
            let d = &data[..len];
            let want = bitwise(d).to_le_bytes();
            assert_eq!(crc_wire(&[d]), want, "len {len}");
            for cut in [1, 3, 8, 9, len / 3, len.saturating_sub(1)] {
                let cut = cut.min(len);
                assert_eq!(
                    crc_wire(&[&d[..cut], &d[cut..]]),
                    want,
                    "len {len} cut {cut}"
                );
                let head = bitwise(&d[..cut]);
                let want = bitwise(d);
                assert_eq!(folded(head, &d[cut..]), want, "folded len {len} cut {cut}");
                assert_eq!(
                    crc32c::crc32c_append(head, &d[cut..]),
                    want,
                    "crc32c len {len} cut {cut}"
                );
                assert_eq!(
                    !table_update(!head, &d[cut..]),
                    want,
                    "table len {len} cut {cut}"
                );
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
