//! Fuzz entry points: one per parser, shared by cargo-fuzz and the stable
//! smoke test.
//!
//! Each function takes arbitrary bytes and must never panic. Where a value
//! decodes, it also checks that encoding it again gives the same bytes, so
//! the fuzzers test round trips as well as robustness. Allocation stays
//! bounded by the input length or fixed caps.
//!
//! Running the libFuzzer targets needs a nightly toolchain and cargo-fuzz:
//!
//! ```text
//! # from the repository root: write the seed corpus, then fuzz one target
//! FUZZ_WRITE_CORPUS=$PWD/crates/rdapl-iwarp/fuzz/corpus \
//!     cargo test -p rdapl-iwarp --test fuzz_smoke write_corpus_if_asked
//! cd crates/rdapl-iwarp/fuzz
//! cargo +nightly fuzz run connection corpus/connection -- -max_total_time=60
//! ```
//!
//! Targets: `mpa_frame`, `ddp_header`, `rdmap_bodies`, `fpdu_stream`,
//! `connection`. On stable, `cargo test -p rdapl-iwarp --test fuzz_smoke`
//! runs the same functions over pseudo-random and mutated valid inputs.

use crate::conn::{Config, Connection, Event, Role};
use crate::ddp::DdpHeader;
use crate::fpdu::{FpduDecoder, FpduEvent};
use crate::mem::VecMemory;
use crate::mpa::{self, Decoded};
use crate::rdmap::ReadRequest;
use crate::terminate::Terminate;

/// MPA Request/Reply frame decoding.
pub fn fuzz_mpa_frame(data: &[u8]) {
    if let Ok(Decoded::Frame(f, used)) = mpa::decode(data, mpa::MAX_PRIVATE_DATA_WIRE) {
        assert!(used <= data.len());
        let again = f.to_vec().expect("decoded frame re-encodes");
        assert_eq!(&again[..], &data[..used]);
        let _ = crate::setup::check_request(&f);
    }
}

/// DDP header decoding.
pub fn fuzz_ddp_header(data: &[u8]) {
    if let Some(h) = DdpHeader::decode(data) {
        assert_eq!(&h.to_vec()[..], &data[..h.len()]);
    }
}

/// Read Request and Terminate body decoding.
pub fn fuzz_rdmap_bodies(data: &[u8]) {
    if let Some(rr) = ReadRequest::decode(data) {
        assert_eq!(&rr.encode()[..], data);
    }
    if let Ok(t) = Terminate::decode(data) {
        let mut v = Vec::new();
        t.encode(&mut v);
        assert_eq!(&v[..], data);
    }
}

/// The FPDU stream decoder; byte 0 picks CRC and the chunk size. Whole
/// FPDUs a piece holds are taken with [`FpduDecoder::whole`], the rest as
/// events (small chunks take the event path only).
pub fn fuzz_fpdu_stream(data: &[u8]) {
    let Some((&ctl, rest)) = data.split_first() else {
        return;
    };
    let mut d = FpduDecoder::new(ctl & 1 != 0);
    let chunk = usize::from(ctl >> 1).max(1);
    let mut total_payload = 0usize;
    for piece in rest.chunks(chunk) {
        let mut input = piece;
        loop {
            if let Some(w) = d.whole(input) {
                assert!(w.len <= input.len() && w.payload.len() < w.len);
                input = &input[w.len..];
                if d.end_whole(&w).is_err() {
                    return;
                }
                total_payload += w.payload.len();
                continue;
            }
            match d.next(&mut input) {
                Ok(None) => break,
                Ok(Some(FpduEvent::Payload(p))) => total_payload += p.len(),
                Ok(Some(_)) => {}
                Err(_) => return,
            }
        }
    }
    assert!(total_payload <= rest.len());
}

/// The memory every fuzzed connection uses: region 0x100 (remote write,
/// 256 bytes at TO 0x1000), region 0x200 (remote read, 64 bytes at TO 0),
/// region 0x300 (a read sink, 64 bytes at 0x3000) and receives 1 and 2 of
/// 128 bytes.
pub fn fuzz_memory() -> VecMemory {
    let mut m = VecMemory::default();
    m.register(0x100, 0x1000, vec![0u8; 256], true, true);
    m.register(0x200, 0, vec![7u8; 64], false, true);
    m.register(0x300, 0x3000, vec![0u8; 64], false, false);
    m.recvs.insert(1, vec![0u8; 128]);
    m.recvs.insert(2, vec![0u8; 128]);
    m.sends.insert(10, vec![0x5a; 64]);
    m
}

/// The config of a fuzzed connection (`crc` from the control byte).
pub fn fuzz_config(crc: bool) -> Config {
    Config {
        crc,
        ird: 2,
        ord: 2,
        ..Config::default()
    }
}

/// A whole connection fed arbitrary bytes. Byte 0 picks the role (bit 0:
/// initiator), CRC (bit 1) and the chunk size (bits 2..). If the input
/// starts with a whole MPA frame, that frame is fed alone first (a peer
/// waits for the answer), so mutated valid streams reach the FPDU code.
/// A responder accepts whatever request it sees; an initiator has sent its
/// request and posts two sends (one inline) and one read once established.
pub fn fuzz_connection(data: &[u8]) {
    let Some((&ctl, rest)) = data.split_first() else {
        return;
    };
    let role = if ctl & 1 == 0 {
        Role::Responder
    } else {
        Role::Initiator
    };
    let Ok(mut c) = Connection::new(role, fuzz_config(ctl & 2 != 0), 0) else {
        return;
    };
    let mut mem = fuzz_memory();
    if role == Role::Initiator {
        let _ = c.connect(0, b"fuzz");
    }
    let chunk = usize::from(ctl >> 2).max(1);
    let (first, rest) = match mpa::decode(rest, mpa::MAX_PRIVATE_DATA_WIRE) {
        Ok(Decoded::Frame(_, used)) => rest.split_at(used),
        _ => (&rest[..0], rest),
    };
    let mut now = 0u64;
    for piece in std::iter::once(first).chain(rest.chunks(chunk)) {
        now += 1;
        c.handle_input(now, piece, &mut mem);
        drive(&mut c, &mut mem);
    }
    c.handle_timeout(now + 60_000);
    c.handle_eof();
    drive(&mut c, &mut mem);
    assert!(c.is_closed());
}

fn drive(c: &mut Connection, mem: &mut VecMemory) {
    for _ in 0..4 {
        while let Some(ev) = c.poll_event() {
            match ev {
                Event::ConnectRequest(_) => {
                    let _ = c.accept(0, b"ok", None, None);
                    let _ = c.post_recv(1, 128);
                    let _ = c.post_recv(2, 128);
                }
                Event::Established { .. } if c.role() == Role::Initiator => {
                    let _ = c.post_recv(1, 128);
                    let _ = c.post_send(10, 64);
                    let _ = c.post_send_inline(12, &[0xa5; 40], true, None);
                    let rr = ReadRequest {
                        sink_stag: 0x300,
                        sink_to: 0x3000,
                        size: 32,
                        src_stag: 1,
                        src_to: 0,
                    };
                    let _ = c.post_read(11, rr);
                }
                _ => {}
            }
        }
        let mut n = 0;
        while let Some(t) = c.poll_transmit(&*mem) {
            let mut out = Vec::new();
            let _ = t.write_to(&*mem, &mut out);
            n += 1;
            assert!(n <= 10_000, "unbounded transmit");
        }
    }
}
