//! MPA FPDU framing (RFC 5044 §4): ULPDU length, pad to 4, CRC32c. No markers.
//!
//! An FPDU is `ULPDU_Length(2) | DDP header | body | pad | CRC(4)`. The CRC
//! field is always present and is zero when CRC is not negotiated.
//!
//! The encoder builds the header (length, DDP header and a small inline
//! body such as a Read Request) and the trailer (pad and CRC) separately
//! from the payload, so a provider can write `header, payload, trailer`
//! with one vectored write and never copy payload into a frame buffer.
//!
//! The [`FpduDecoder`] takes the byte stream in any chunking and yields a
//! header event, payload slices borrowed from the input, and an end event
//! once the CRC is checked; where the input holds a whole FPDU,
//! [`FpduDecoder::whole`] takes it in one step (one CRC pass, the same
//! checks). It holds at most one DDP header and one trailer (28 bytes):
//! nothing it stores is sized by the peer. After an error it stays failed.

use crate::crc::FpduCrc;
use crate::ddp::{DdpHeader, UNTAGGED_HEADER_LEN};
use crate::error::ProtocolError;

/// The longest payload framed inline, in the header buffer (see
/// [`crate::Connection::post_send_inline`]): its FPDU is one contiguous run
/// of bytes with one CRC pass, not a payload fetched from memory apart.
/// Every header buffer has room for it and is moved by value with its
/// transmit, so a larger bound costs every FPDU (rdapl-bench's HISTORY.md,
/// "Short payloads inline").
pub const INLINE_MAX: usize = 64;

/// Capacity of a [`HeaderBuf`]: length + untagged header + the largest inline
/// body (the larger of an inline payload and a Terminate with both copied
/// headers).
pub const HEADER_BUF_CAP: usize = 2
    + UNTAGGED_HEADER_LEN
    + if INLINE_MAX > crate::terminate::MAX_TERMINATE_BODY {
        INLINE_MAX
    } else {
        crate::terminate::MAX_TERMINATE_BODY
    };

/// The pad length for a ULPDU of `ulpdu_len` bytes.
pub fn pad_len(ulpdu_len: usize) -> usize {
    (4 - (2 + ulpdu_len) % 4) % 4
}

/// Fixed-size bytes before the payload.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct HeaderBuf {
    bytes: [u8; HEADER_BUF_CAP],
    len: u8,
}

const _: () = assert!(HEADER_BUF_CAP <= u8::MAX as usize);

impl std::fmt::Debug for HeaderBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HeaderBuf({:02x?})", self.as_ref())
    }
}

impl AsRef<[u8]> for HeaderBuf {
    fn as_ref(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl std::ops::Deref for HeaderBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_ref()
    }
}

impl HeaderBuf {
    /// Whether the FPDU ends its DDP message (the control byte's L bit,
    /// after the ULPDU length).
    pub fn last(&self) -> bool {
        self.len > 2 && self.bytes[2] & 0x40 != 0
    }
}

/// Pad and CRC after the payload (4 to 7 bytes).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TrailerBuf {
    bytes: [u8; 8],
    len: u8,
}

impl std::fmt::Debug for TrailerBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TrailerBuf({:02x?})", self.as_ref())
    }
}

impl AsRef<[u8]> for TrailerBuf {
    fn as_ref(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl std::ops::Deref for TrailerBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_ref()
    }
}

/// Why an FPDU could not be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// The ULPDU would exceed 65535 bytes.
    #[error("ULPDU of {0} bytes does not fit the 16-bit length")]
    TooLong(usize),
    /// The inline body does not fit the header buffer.
    #[error("inline body of {0} bytes is too long")]
    InlineTooLong(usize),
}

/// Builds the header bytes of an FPDU: ULPDU length, DDP header, inline body.
/// `payload_len` is the length of the payload written separately.
pub fn encode_header(
    hdr: &DdpHeader,
    inline: &[u8],
    payload_len: usize,
) -> Result<HeaderBuf, EncodeError> {
    let hl = hdr.len();
    if 2 + hl + inline.len() > HEADER_BUF_CAP {
        return Err(EncodeError::InlineTooLong(inline.len()));
    }
    let ulpdu = hl + inline.len() + payload_len;
    let ulpdu16 = u16::try_from(ulpdu).map_err(|_| EncodeError::TooLong(ulpdu))?;
    let mut b = HeaderBuf {
        bytes: [0; HEADER_BUF_CAP],
        len: 0,
    };
    b.bytes[0..2].copy_from_slice(&ulpdu16.to_be_bytes());
    hdr.encode(&mut b.bytes[2..2 + hl]);
    b.bytes[2 + hl..2 + hl + inline.len()].copy_from_slice(inline);
    b.len = (2 + hl + inline.len()) as u8;
    Ok(b)
}

/// Builds the trailer for a header and payload: the pad, then the CRC over
/// header + payload + pad if `crc`, else four zero bytes.
pub fn encode_trailer(header: &[u8], payload: &[u8], crc: bool) -> TrailerBuf {
    let c = crc.then(|| {
        let mut c = FpduCrc::new();
        c.update(header);
        c.update(payload);
        c
    });
    trailer_after(header.len(), payload.len(), c)
}

/// [`encode_trailer`] for a payload checksummed by the caller (in pieces):
/// `crc` is the running CRC over the header and payload (`None`: no CRC,
/// four zero bytes); the pad is added here.
pub fn trailer_after(header_len: usize, payload_len: usize, crc: Option<FpduCrc>) -> TrailerBuf {
    let ulpdu = header_len - 2 + payload_len;
    let pad = pad_len(ulpdu);
    let mut t = TrailerBuf {
        bytes: [0; 8],
        len: (pad + 4) as u8,
    };
    if let Some(mut c) = crc {
        c.update(&t.bytes[..pad]);
        t.bytes[pad..pad + 4].copy_from_slice(&c.wire());
    }
    t
}

/// A whole FPDU in one buffer (for tests and small frames).
pub fn encode_fpdu(
    hdr: &DdpHeader,
    inline: &[u8],
    payload: &[u8],
    crc: bool,
) -> Result<Vec<u8>, EncodeError> {
    let h = encode_header(hdr, inline, payload.len())?;
    let t = encode_trailer(&h, payload, crc);
    let mut v = Vec::with_capacity(h.len() + payload.len() + t.len());
    v.extend_from_slice(&h);
    v.extend_from_slice(payload);
    v.extend_from_slice(&t);
    Ok(v)
}

/// What the decoder found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FpduEvent<'a> {
    /// A new FPDU's header. `payload_len` bytes of DDP payload follow.
    Header {
        /// The DDP/RDMAP header.
        header: DdpHeader,
        /// The ULPDU length field.
        ulpdu_len: u16,
        /// DDP payload length (ULPDU less the DDP header).
        payload_len: u16,
    },
    /// Payload bytes, in order, borrowed from the input.
    Payload(&'a [u8]),
    /// The FPDU is complete and its CRC (if negotiated) is good.
    End,
}

/// A whole FPDU found at the front of the input ([`FpduDecoder::whole`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Whole<'a> {
    /// The DDP (and RDMAP) header.
    pub header: DdpHeader,
    /// The payload: the ULPDU after the DDP header.
    pub payload: &'a [u8],
    /// Bytes of input the FPDU takes, pad and CRC included.
    pub len: usize,
    /// The CRC received and the one computed, if CRC is on.
    crc: Option<(u32, u32)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    Header,
    Payload,
    Trailer,
    Failed,
}

/// Streaming FPDU decoder.
#[derive(Debug, Clone)]
pub struct FpduDecoder {
    crc_enabled: bool,
    st: St,
    hdr: [u8; 2 + UNTAGGED_HEADER_LEN],
    hdr_have: usize,
    payload_left: usize,
    trailer: [u8; 8],
    trailer_have: usize,
    trailer_need: usize,
    crc: FpduCrc,
    /// The current FPDU's CRC is not checked ([`FpduDecoder::waive_crc`]).
    crc_waived: bool,
    error: Option<ProtocolError>,
}

impl FpduDecoder {
    /// A decoder; `crc_enabled` as negotiated.
    pub fn new(crc_enabled: bool) -> Self {
        Self {
            crc_enabled,
            st: St::Header,
            hdr: [0; 2 + UNTAGGED_HEADER_LEN],
            hdr_have: 0,
            payload_left: 0,
            trailer: [0; 8],
            trailer_have: 0,
            trailer_need: 0,
            crc: FpduCrc::new(),
            crc_waived: false,
            error: None,
        }
    }

    /// Leaves the CRC of the current FPDU (its header just returned)
    /// unchecked. For a frame whose payload is dropped unread and whose
    /// header the caller has checked against what it expects: the one use
    /// is siw's answer to a zero-length RDMA Read (see `Connection`).
    pub fn waive_crc(&mut self) {
        self.crc_waived = true;
    }

    /// Whether the decoder sits between FPDUs (no partial frame held).
    pub fn at_boundary(&self) -> bool {
        self.st == St::Header && self.hdr_have == 0
    }

    /// Payload bytes of the current FPDU not yet taken (0 outside a
    /// payload).
    pub fn payload_left(&self) -> usize {
        if self.st == St::Payload {
            self.payload_left
        } else {
            0
        }
    }

    /// Takes `data` as the next payload bytes of the current FPDU, bytes
    /// the caller received elsewhere (straight into their destination):
    /// they count toward the CRC as if [`FpduDecoder::next`] had returned
    /// them. False, and nothing taken, if they are more than
    /// [`FpduDecoder::payload_left`].
    pub fn take_payload(&mut self, data: &[u8]) -> bool {
        if data.len() > self.payload_left() {
            return false;
        }
        self.crc_update(data);
        self.payload_left -= data.len();
        true
    }

    /// The raw bytes of the current FPDU's ULPDU length and DDP header,
    /// once its header event was returned.
    pub fn raw_header(&self) -> &[u8] {
        &self.hdr[..self.hdr_have]
    }

    /// Counts `data` toward the CRC, if one was negotiated (without one
    /// the trailer's CRC field is not looked at: nothing to compute).
    #[inline]
    fn crc_update(&mut self, data: &[u8]) {
        if self.crc_enabled {
            self.crc.update(data);
        }
    }

    fn fail(&mut self, e: ProtocolError) -> Result<Option<FpduEvent<'static>>, ProtocolError> {
        self.st = St::Failed;
        self.error = Some(e.clone());
        Err(e)
    }

    /// The FPDU that `input` begins, if the decoder sits between FPDUs and
    /// `input` holds all of it: its header decoded and its payload
    /// borrowed, the CRC summed in one pass (over bytes not yet trusted).
    /// The caller handles it as it would the [`FpduEvent::Header`] and
    /// [`FpduEvent::Payload`] events, then calls [`FpduDecoder::end_whole`]
    /// (which checks the CRC) before acting on its end. `None`, and
    /// nothing taken, for anything else: a partial frame, or a header the
    /// event path must refuse (it gives the error).
    pub fn whole<'a>(&mut self, input: &'a [u8]) -> Option<Whole<'a>> {
        if self.st != St::Header || self.hdr_have != 0 || input.len() < 3 {
            return None;
        }
        let need = 2 + DdpHeader::len_for_control(input[2]);
        let ulpdu_len = u16::from_be_bytes([input[0], input[1]]);
        let ulpdu = usize::from(ulpdu_len);
        if ulpdu < need - 2 {
            return None;
        }
        let body_end = 2 + ulpdu + pad_len(ulpdu);
        if input.len() < body_end + 4 {
            return None;
        }
        let header = DdpHeader::decode(&input[2..need])?;
        self.hdr[..need].copy_from_slice(&input[..need]);
        self.hdr_have = need;
        self.crc_waived = false;
        let crc = self.crc_enabled.then(|| {
            let mut c = FpduCrc::new();
            c.update(&input[..body_end]);
            let mut got = [0u8; 4];
            got.copy_from_slice(&input[body_end..body_end + 4]);
            (u32::from_le_bytes(got), c.value())
        });
        Some(Whole {
            header,
            payload: &input[need..2 + ulpdu],
            len: body_end + 4,
            crc,
        })
    }

    /// The end of an FPDU taken with [`FpduDecoder::whole`]: its CRC
    /// checked (unless waived), and the decoder between FPDUs again. After
    /// a mismatch it stays failed, as on the event path.
    pub fn end_whole(&mut self, w: &Whole<'_>) -> Result<(), ProtocolError> {
        if let Some((received, computed)) = w.crc
            && !self.crc_waived
            && received != computed
        {
            return self
                .fail(ProtocolError::Crc { received, computed })
                .map(|_| ());
        }
        self.hdr_have = 0;
        Ok(())
    }

    /// Decodes the next event from `input`, advancing it past the bytes
    /// used. `Ok(None)` means `input` is used up and more bytes are needed.
    pub fn next<'a>(
        &mut self,
        input: &mut &'a [u8],
    ) -> Result<Option<FpduEvent<'a>>, ProtocolError> {
        loop {
            match self.st {
                St::Failed => {
                    return Err(self.error.clone().unwrap_or(ProtocolError::StreamLost));
                }
                St::Header => {
                    if self.hdr_have == 0 {
                        // A new FPDU: forget the last one's header.
                        self.crc = FpduCrc::new();
                        self.crc_waived = false;
                    }
                    let need = if self.hdr_have < 3 {
                        3
                    } else {
                        2 + DdpHeader::len_for_control(self.hdr[2])
                    };
                    if self.hdr_have < need {
                        if input.is_empty() {
                            return Ok(None);
                        }
                        let n = (need - self.hdr_have).min(input.len());
                        self.hdr[self.hdr_have..self.hdr_have + n].copy_from_slice(&input[..n]);
                        self.hdr_have += n;
                        *input = &input[n..];
                        continue;
                    }
                    if need == 3 {
                        continue;
                    }
                    let ulpdu_len = u16::from_be_bytes([self.hdr[0], self.hdr[1]]);
                    let hl = need - 2;
                    if usize::from(ulpdu_len) < hl {
                        return self
                            .fail(ProtocolError::UlpduTooShort {
                                ulpdu_len,
                                header_len: hl as u16,
                            })
                            .map(|_| None);
                    }
                    let Some(header) = DdpHeader::decode(&self.hdr[2..need]) else {
                        return self.fail(ProtocolError::StreamLost).map(|_| None);
                    };
                    if self.crc_enabled {
                        self.crc.update(&self.hdr[..need]);
                    }
                    let payload_len = ulpdu_len - hl as u16;
                    self.payload_left = usize::from(payload_len);
                    self.trailer_need = pad_len(usize::from(ulpdu_len)) + 4;
                    self.trailer_have = 0;
                    self.st = St::Payload;
                    return Ok(Some(FpduEvent::Header {
                        header,
                        ulpdu_len,
                        payload_len,
                    }));
                }
                St::Payload => {
                    if self.payload_left == 0 {
                        self.st = St::Trailer;
                        continue;
                    }
                    if input.is_empty() {
                        return Ok(None);
                    }
                    let n = self.payload_left.min(input.len());
                    let (chunk, rest) = input.split_at(n);
                    *input = rest;
                    self.crc_update(chunk);
                    self.payload_left -= n;
                    return Ok(Some(FpduEvent::Payload(chunk)));
                }
                St::Trailer => {
                    if self.trailer_have < self.trailer_need {
                        if input.is_empty() {
                            return Ok(None);
                        }
                        let n = (self.trailer_need - self.trailer_have).min(input.len());
                        self.trailer[self.trailer_have..self.trailer_have + n]
                            .copy_from_slice(&input[..n]);
                        self.trailer_have += n;
                        *input = &input[n..];
                        continue;
                    }
                    let pad = self.trailer_need - 4;
                    if self.crc_enabled {
                        self.crc.update(&self.trailer[..pad]);
                    }
                    let mut got = [0u8; 4];
                    got.copy_from_slice(&self.trailer[pad..pad + 4]);
                    if self.crc_enabled && !self.crc_waived && got != self.crc.wire() {
                        let e = ProtocolError::Crc {
                            received: u32::from_le_bytes(got),
                            computed: self.crc.value(),
                        };
                        return self.fail(e).map(|_| None);
                    }
                    self.st = St::Header;
                    self.hdr_have = 0;
                    return Ok(Some(FpduEvent::End));
                }
            }
        }
    }
}

/// A fully decoded FPDU (payload copied), for tests and tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fpdu {
    /// Header.
    pub header: DdpHeader,
    /// All payload bytes.
    pub payload: Vec<u8>,
}

/// Decodes a whole byte stream of FPDUs. Returns the complete FPDUs and
/// the error that stopped decoding, if any. Payload copies are bounded by
/// the input length.
pub fn decode_all(stream: &[u8], crc: bool) -> (Vec<Fpdu>, Option<ProtocolError>) {
    let mut d = FpduDecoder::new(crc);
    let mut input = stream;
    let mut out = Vec::new();
    let mut cur: Option<Fpdu> = None;
    loop {
        match d.next(&mut input) {
            Ok(None) => return (out, None),
            Ok(Some(FpduEvent::Header { header, .. })) => {
                cur = Some(Fpdu {
                    header,
                    payload: Vec::new(),
                })
            }
            Ok(Some(FpduEvent::Payload(p))) => {
                if let Some(c) = cur.as_mut() {
                    c.payload.extend_from_slice(p);
                }
            }
            Ok(Some(FpduEvent::End)) => out.extend(cur.take()),
            Err(e) => return (out, Some(e)),
        }
    }
}
