//! CRC32c for MPA FPDUs (RFC 5044 §6).
//!
//! The CRC covers the whole FPDU before the CRC field: the ULPDU length,
//! the ULPDU and the pad. It is put on the wire as the little-endian bytes
//! of the standard CRC32c value; that is the order siw sends and the order
//! Wireshark calls "Good CRC32". This module guarantees that
//! [`FpduCrc::wire`] over the same bytes gives the same four bytes however
//! the bytes were split across [`FpduCrc::update`] calls.

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
        self.0 = crc32c::crc32c_append(self.0, bytes);
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

    #[test]
    fn split_does_not_matter() {
        let data: Vec<u8> = (0..200u32).map(|i| (i * 7) as u8).collect();
        let whole = crc_wire(&[&data]);
        for cut in 0..data.len() {
            assert_eq!(crc_wire(&[&data[..cut], &data[cut..]]), whole);
        }
    }
}
