//! Property tests: every frame type round-trips both ways, and the FPDU
//! decoder gives the same frames under any split of the stream.

use proptest::prelude::*;
use rdapl_iwarp::fpdu::{self, FpduDecoder, FpduEvent};
use rdapl_iwarp::mpa::{self, Decoded};
use rdapl_iwarp::terminate::TerminatedDdp;
use rdapl_iwarp::{
    Buffer, DdpHeader, EnhancedParams, FrameKind, MpaFrame, ReadRequest, TermCode, Terminate,
};

fn mpa_frame() -> impl Strategy<Value = MpaFrame> {
    (
        any::<bool>(),
        any::<[bool; 4]>(),
        0u8..16,
        0u8..=2,
        proptest::collection::vec(any::<u8>(), 0..=512),
    )
        .prop_map(|(req, f, reserved, revision, private_data)| MpaFrame {
            kind: if req {
                FrameKind::Request
            } else {
                FrameKind::Reply
            },
            markers: f[0],
            crc: f[1],
            reject: f[2],
            enhanced: f[3],
            reserved,
            revision,
            private_data,
        })
}

fn ddp_header() -> impl Strategy<Value = DdpHeader> {
    let buffer = prop_oneof![
        (any::<u32>(), any::<u64>()).prop_map(|(stag, to)| Buffer::Tagged { stag, to }),
        (any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()).prop_map(
            |(rsvd_ulp, qn, msn, mo)| Buffer::Untagged {
                rsvd_ulp,
                qn,
                msn,
                mo
            }
        ),
    ];
    (
        any::<bool>(),
        0u8..16,
        0u8..4,
        0u8..4,
        0u8..4,
        0u8..16,
        buffer,
    )
        .prop_map(
            |(last, ddp_reserved, ddp_version, rdmap_version, rdmap_reserved, opcode, buffer)| {
                DdpHeader {
                    last,
                    ddp_reserved,
                    ddp_version,
                    rdmap_version,
                    rdmap_reserved,
                    opcode,
                    buffer,
                }
            },
        )
}

fn terminate() -> impl Strategy<Value = Terminate> {
    let ddp = proptest::option::of((any::<u16>(), any::<bool>(), any::<[u8; 18]>()).prop_map(
        |(segment_length, tagged, mut h)| {
            let n = if tagged { 14 } else { 18 };
            if tagged {
                h[0] |= 0x80
            } else {
                h[0] &= 0x7f
            }
            TerminatedDdp {
                segment_length,
                header: h[..n].to_vec(),
            }
        },
    ));
    (
        0u8..16,
        0u8..16,
        any::<u8>(),
        any::<bool>(),
        0u16..0x2000,
        ddp,
        proptest::option::of(any::<[u8; 28]>()),
    )
        .prop_map(|(layer, etype, ecode, m, reserved, ddp, rdmap)| Terminate {
            code: TermCode {
                layer,
                etype,
                ecode,
            },
            m,
            reserved,
            ddp,
            rdmap,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn mpa_frame_encode_decode(f in mpa_frame()) {
        let bytes = f.to_vec().unwrap();
        match mpa::decode(&bytes, 512).unwrap() {
            Decoded::Frame(g, used) => { prop_assert_eq!(used, bytes.len()); prop_assert_eq!(g, f); }
            other => prop_assert!(false, "{:?}", other),
        }
        // Every proper prefix asks for more and never errors.
        for cut in [0, 1, 15, 16, 19, bytes.len() - 1] {
            if cut < bytes.len() {
                prop_assert!(matches!(mpa::decode(&bytes[..cut], 512), Ok(Decoded::NeedMore(_))));
            }
        }
    }

    #[test]
    fn mpa_frame_decode_encode(req in any::<bool>(), flags in any::<u8>(), rev in 0u8..=2,
                               pd in proptest::collection::vec(any::<u8>(), 0..=512)) {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(if req { mpa::KEY_REQ } else { mpa::KEY_REP });
        bytes.push(flags);
        bytes.push(rev);
        bytes.extend_from_slice(&(pd.len() as u16).to_be_bytes());
        bytes.extend_from_slice(&pd);
        let Decoded::Frame(f, _) = mpa::decode(&bytes, 512).unwrap() else { panic!() };
        prop_assert_eq!(f.to_vec().unwrap(), bytes);
    }

    #[test]
    fn enhanced_params_roundtrip(b in any::<[u8; 4]>(), ird in 0u16..0x4000, ord in 0u16..0x4000,
                                 bits in any::<[bool; 4]>()) {
        prop_assert_eq!(EnhancedParams::decode(&b).encode(), b);
        let p = EnhancedParams { ird, ord, peer_to_peer: bits[0], send_rtr: bits[1],
                                 write_rtr: bits[2], read_rtr: bits[3] };
        prop_assert_eq!(EnhancedParams::decode(&p.encode()), p);
    }

    #[test]
    fn ddp_header_roundtrip(h in ddp_header()) {
        let b = h.to_vec();
        prop_assert_eq!(DdpHeader::decode(&b), Some(h));
    }

    #[test]
    fn ddp_header_decode_encode(mut b in proptest::collection::vec(any::<u8>(), 14..=18)) {
        let want = DdpHeader::len_for_control(b[0]);
        if b.len() < want {
            prop_assert_eq!(DdpHeader::decode(&b), None);
            b.resize(want, 0);
        }
        let h = DdpHeader::decode(&b).unwrap();
        prop_assert_eq!(&h.to_vec()[..], &b[..want]);
    }

    #[test]
    fn read_request_roundtrip(b in any::<[u8; 28]>()) {
        let rr = ReadRequest::decode(&b).unwrap();
        prop_assert_eq!(rr.encode(), b);
        prop_assert_eq!(ReadRequest::decode(&rr.encode()), Some(rr));
    }

    #[test]
    fn terminate_roundtrip(t in terminate()) {
        let mut v = Vec::new();
        t.encode(&mut v);
        prop_assert_eq!(v.len(), t.encoded_len());
        prop_assert_eq!(Terminate::decode(&v), Ok(t));
    }

    #[test]
    fn terminate_decode_encode(b in proptest::collection::vec(any::<u8>(), 0..60)) {
        if let Ok(t) = Terminate::decode(&b) {
            let mut v = Vec::new();
            t.encode(&mut v);
            prop_assert_eq!(v, b);
        }
    }

    #[test]
    fn fpdu_roundtrip(h in ddp_header(), payload in proptest::collection::vec(any::<u8>(), 0..2000),
                      crc in any::<bool>()) {
        let bytes = fpdu::encode_fpdu(&h, &[], &payload, crc).unwrap();
        prop_assert_eq!(bytes.len() % 4, 0);
        let (frames, err) = fpdu::decode_all(&bytes, crc);
        prop_assert_eq!(err, None);
        prop_assert_eq!(frames.len(), 1);
        prop_assert_eq!(frames[0].header, h);
        prop_assert_eq!(&frames[0].payload, &payload);
        // Decode then encode gives the same bytes.
        let again = fpdu::encode_fpdu(&frames[0].header, &[], &frames[0].payload, crc).unwrap();
        prop_assert_eq!(again, bytes);
    }

    #[test]
    fn fpdu_stream_any_split(
        frames in small_frames(),
        crc in any::<bool>(),
        cuts in proptest::collection::vec(any::<u16>(), 0..20),
    ) {
        let stream = encode_stream(&frames, crc);
        let cuts = cut_points(&cuts, stream.len());
        let mut d = FpduDecoder::new(crc);
        let mut got: Vec<(DdpHeader, Vec<u8>)> = Vec::new();
        let mut prev = 0;
        for end in cuts.into_iter().chain([stream.len()]) {
            let mut input = &stream[prev..end];
            prev = end;
            while let Some(ev) = d.next(&mut input).unwrap() {
                match ev {
                    FpduEvent::Header { header, .. } => got.push((header, Vec::new())),
                    FpduEvent::Payload(p) => got.last_mut().unwrap().1.extend_from_slice(p),
                    FpduEvent::End => {}
                }
            }
            prop_assert!(input.is_empty());
        }
        prop_assert!(d.at_boundary());
        prop_assert_eq!(got, frames);
    }

    /// Whole FPDUs taken at once (`FpduDecoder::whole`) where the input
    /// holds them, the event path for the rest: the same frames under any
    /// split, and a flipped bit is caught either way.
    #[test]
    fn whole_fpdus_and_events_agree_under_any_split(
        frames in small_frames(),
        crc in any::<bool>(),
        cuts in proptest::collection::vec(any::<u16>(), 0..8),
        flip in proptest::option::of(any::<(u16, u8)>()),
    ) {
        let mut stream = encode_stream(&frames, crc);
        // A flip inside the last frame's DDP header, payload or CRC (not
        // its length: that would only make the stream end inside a frame).
        let last_start = stream.len() - encode_stream(&frames[frames.len() - 1..], crc).len();
        let flipped = crc && flip.is_some();
        if let (true, Some((at, bit))) = (crc, flip) {
            let span = stream.len() - last_start - 2;
            stream[last_start + 2 + usize::from(at) % span] ^= 1 << (bit % 8);
        }
        let cuts = cut_points(&cuts, stream.len());
        let mut d = FpduDecoder::new(crc);
        let mut got: Vec<(DdpHeader, Vec<u8>)> = Vec::new();
        let mut failed = false;
        let mut prev = 0;
        'pieces: for end in cuts.into_iter().chain([stream.len()]) {
            let mut input = &stream[prev..end];
            prev = end;
            loop {
                if let Some(w) = d.whole(input) {
                    input = &input[w.len..];
                    if d.end_whole(&w).is_err() {
                        failed = true;
                        break 'pieces;
                    }
                    got.push((w.header, w.payload.to_vec()));
                    continue;
                }
                match d.next(&mut input) {
                    Ok(None) => break,
                    Ok(Some(FpduEvent::Header { header, .. })) => got.push((header, Vec::new())),
                    Ok(Some(FpduEvent::Payload(p))) => got.last_mut().unwrap().1.extend_from_slice(p),
                    Ok(Some(FpduEvent::End)) => {}
                    Err(_) => {
                        failed = true;
                        break 'pieces;
                    }
                }
            }
            prop_assert!(input.is_empty());
        }
        if flipped {
            // Caught (a header made invalid, or the CRC), never delivered whole.
            prop_assert!(failed);
        } else {
            prop_assert!(!failed);
            prop_assert!(d.at_boundary());
            prop_assert_eq!(got, frames);
        }
    }
}

#[test]
fn crc_bit_flip_is_caught() {
    let h = DdpHeader::new(
        3,
        true,
        Buffer::Untagged {
            rsvd_ulp: 0,
            qn: 0,
            msn: 1,
            mo: 0,
        },
    );
    let bytes = fpdu::encode_fpdu(&h, &[], b"hello world", true).unwrap();
    for i in 0..bytes.len() {
        for bit in 0..8 {
            let mut b = bytes.clone();
            b[i] ^= 1 << bit;
            let (frames, err) = fpdu::decode_all(&b, true);
            // Either an error, or (if the length changed) no complete frame.
            assert!(
                err.is_some() || frames.is_empty(),
                "flip at {i}.{bit} undetected"
            );
        }
    }
}

/// Up to seven FPDUs of up to 300 payload bytes each.
fn small_frames() -> impl Strategy<Value = Vec<(DdpHeader, Vec<u8>)>> {
    proptest::collection::vec(
        (ddp_header(), proptest::collection::vec(any::<u8>(), 0..300)),
        1..8,
    )
}

/// The FPDUs of `frames`, one after the other.
fn encode_stream(frames: &[(DdpHeader, Vec<u8>)], crc: bool) -> Vec<u8> {
    let mut stream = Vec::new();
    for (h, p) in frames {
        stream.extend(fpdu::encode_fpdu(h, &[], p, crc).unwrap());
    }
    stream
}

/// `cuts` as sorted offsets into a stream of `len` bytes.
fn cut_points(cuts: &[u16], len: usize) -> Vec<usize> {
    let mut v: Vec<usize> = cuts.iter().map(|c| usize::from(*c) % (len + 1)).collect();
    v.sort_unstable();
    v
}
