//! Fuzz entry points: one per parser, shared by cargo-fuzz and the stable
//! smoke test.
//!
//! Each function takes arbitrary bytes and must never panic. Where a value
//! decodes, it also checks that encoding it again gives the same bytes, so
//! the fuzzers test round trips as well as robustness. Allocation stays
//! bounded by the input length or fixed caps.

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

/// The FPDU stream decoder; byte 0 picks CRC and the chunk size.
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

fn fuzz_memory() -> VecMemory {
    let mut m = VecMemory::default();
    m.register(0x100, 0x1000, vec![0u8; 256], true, true);
    m.register(0x200, 0, vec![7u8; 64], false, true);
    m.recvs.insert(1, vec![0u8; 128]);
    m.recvs.insert(2, vec![0u8; 128]);
    m
}

/// A whole connection fed arbitrary bytes. Byte 0 picks the role, CRC and
/// chunk size; a responder accepts whatever request it sees; an initiator
/// has sent its request first.
pub fn fuzz_connection(data: &[u8]) {
    let Some((&ctl, rest)) = data.split_first() else {
        return;
    };
    let role = if ctl & 1 == 0 {
        Role::Responder
    } else {
        Role::Initiator
    };
    let cfg = Config {
        crc: ctl & 2 != 0,
        ird: 2,
        ord: 2,
        ..Config::default()
    };
    let Ok(mut c) = Connection::new(role, cfg, 0) else {
        return;
    };
    let mut mem = fuzz_memory();
    if role == Role::Initiator {
        let _ = c.connect(0, b"fuzz");
    }
    let chunk = usize::from(ctl >> 2).max(1);
    let mut steps = 0u32;
    for piece in rest.chunks(chunk) {
        c.handle_input(u64::from(steps), piece, &mut mem);
        steps += 1;
        while let Some(ev) = c.poll_event() {
            if let Event::ConnectRequest(_) = ev {
                let _ = c.accept(b"ok", None, None);
                let _ = c.post_recv(1, 128);
                let _ = c.post_recv(2, 128);
            }
            if let Event::Established { .. } = ev {
                let _ = c.post_recv(1, 128);
            }
        }
        let mut n = 0;
        while let Some(t) = c.poll_transmit(&mem) {
            let mut out = Vec::new();
            let _ = t.write_to(&mem, &mut out);
            n += 1;
            if n > 10_000 {
                panic!("unbounded transmit");
            }
        }
    }
    c.handle_eof();
    while c.poll_event().is_some() {}
}
