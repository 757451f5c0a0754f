//! Stable "fuzz smoke" test: pseudo-random and mutated valid inputs through
//! every fuzz entry point (the same functions the cargo-fuzz targets call).
//! `FUZZ_SMOKE_SCALE=<n>` multiplies the iteration counts.

mod common;

use common::{Pair, XorShift};
use rdapl_iwarp::fuzzing::{self, fuzz_config, fuzz_memory};
use rdapl_iwarp::mpa::FrameKind;
use rdapl_iwarp::rdmap::{self, Opcode};
use rdapl_iwarp::setup::{self, ConnectRequest, Local, RtrOffer};
use rdapl_iwarp::terminate::{TerminatedDdp, ddp};
use rdapl_iwarp::{Buffer, DdpHeader, Event, ReadRequest, Terminate};

fn scale() -> usize {
    std::env::var("FUZZ_SMOKE_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
}

fn mutate(rng: &mut XorShift, seed: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    let n = 1 + rng.below(4);
    for _ in 0..n {
        if v.is_empty() {
            v.push(rng.next_u64() as u8);
            continue;
        }
        let i = rng.below(v.len() as u64) as usize;
        match rng.below(7) {
            0 => v[i] ^= 1 << rng.below(8),
            1 => v[i] = [0, 0xff, 0x7f, 0x80, 1, 0x40][rng.below(6) as usize],
            2 => v.truncate(i),
            3 => {
                v.remove(i);
            }
            4 => v.insert(i, rng.next_u64() as u8),
            5 => {
                // Big-endian 16-bit field set to an extreme.
                if i + 1 < v.len() {
                    let x: u16 = [0, 1, 0xffff, 0x8000, 0x7fff][rng.below(5) as usize];
                    v[i..i + 2].copy_from_slice(&x.to_be_bytes());
                }
            }
            _ => {
                let j = rng.below(v.len() as u64) as usize;
                let (a, b) = (i.min(j), i.max(j));
                let dup = v[a..b].to_vec();
                v.splice(b..b, dup);
                v.truncate(4096);
            }
        }
    }
    v
}

fn run(
    name: &str,
    f: fn(&[u8]),
    seeds: &[Vec<u8>],
    random: usize,
    mutated: usize,
    max_len: u64,
) -> usize {
    let mut rng = XorShift::new(0x5eed ^ name.len() as u64);
    for s in seeds {
        f(s);
    }
    for _ in 0..random * scale() {
        let len = rng.below(max_len) as usize;
        f(&rng.bytes(len));
    }
    for i in 0..mutated * scale() {
        let s = &seeds[i % seeds.len()];
        f(&mutate(&mut rng, s));
    }
    let n = seeds.len() + (random + mutated) * scale();
    println!("{name}: {n} inputs");
    n
}

fn mpa_seeds() -> Vec<Vec<u8>> {
    let local = Local {
        revision: 2,
        crc: true,
        ird: 4,
        ord: 4,
        peer_to_peer: true,
        rtr_offer: RtrOffer::default(),
    };
    let req = setup::build_request(&local, b"private");
    let cr = ConnectRequest {
        revision: 2,
        crc: true,
        params: req.enhanced_params().map(|p| p.0),
        private_data: vec![],
    };
    let (rep, _) = setup::build_reply(&cr, &local, true, b"reply-data");
    let (rej, _) = setup::build_reply(&cr, &local, false, b"");
    let v1 = setup::build_request(
        &Local {
            revision: 1,
            ..local
        },
        &[9; 40],
    );
    assert_eq!(rep.kind, FrameKind::Reply);
    [req, rep, rej, v1]
        .iter()
        .map(|f| f.to_vec().unwrap())
        .collect()
}

fn header_seeds() -> Vec<DdpHeader> {
    vec![
        rdmap::tagged_header(Opcode::Write, true, 0x100, 0x1000),
        rdmap::tagged_header(Opcode::ReadResponse, false, 0x300, 0x3000),
        rdmap::untagged_header(Opcode::Send, true, 0, 1, 0),
        rdmap::untagged_header(Opcode::SendSeInvalidate, false, 0x100, 2, 64),
        rdmap::untagged_header(Opcode::ReadRequest, true, 0, 1, 0),
        rdmap::untagged_header(Opcode::Terminate, true, 0, 1, 0),
    ]
}

fn body_seeds() -> Vec<Vec<u8>> {
    let rr = ReadRequest {
        sink_stag: 1,
        sink_to: 2,
        size: 3,
        src_stag: 4,
        src_to: 5,
    };
    let mut t = Terminate::new(ddp::untagged(ddp::UT_MSN_RANGE));
    t.m = true;
    t.ddp = Some(TerminatedDdp {
        segment_length: 18,
        header: rdmap::untagged_header(Opcode::Send, true, 0, 9, 0).to_vec(),
    });
    t.rdmap = Some(rr.encode());
    let mut tb = Vec::new();
    t.encode(&mut tb);
    let mut t0 = Vec::new();
    Terminate::new(ddp::tagged(ddp::T_BASE_BOUNDS)).encode(&mut t0);
    vec![rr.encode().to_vec(), tb, t0]
}

/// A small valid conversation in the fuzz memory layout: the a→b stream
/// (request, then FPDUs) and the b→a stream (reply, then FPDUs).
fn conversation(crc: bool) -> (Vec<u8>, Vec<u8>) {
    let mut p = Pair::new(fuzz_config(crc), fuzz_config(crc));
    p.a.mem = fuzz_memory();
    p.b.mem = fuzz_memory();
    p.a.conn.connect(0, b"fuzz").unwrap();
    let (mut ab, _) = p.pump();
    p.b.take_events();
    p.b.conn.accept(0, b"ok", None, None).unwrap();
    p.b.conn.post_recv(1, 128).unwrap();
    p.b.conn.post_recv(2, 128).unwrap();
    p.a.conn.post_recv(1, 128).unwrap();
    p.a.conn.post_send(10, 64).unwrap();
    p.a.conn.post_write(10, 64, 0x100, 0x1010).unwrap();
    p.a.conn
        .post_read(
            11,
            ReadRequest {
                sink_stag: 0x300,
                sink_to: 0x3000,
                size: 32,
                src_stag: 0x200,
                src_to: 8,
            },
        )
        .unwrap();
    p.a.conn.post_send_se(10, 3).unwrap();
    p.b.conn.post_send(10, 64).unwrap();
    p.b.conn.post_write(10, 40, 0x100, 0x1000).unwrap();
    let (x, mut ba) = p.pump();
    ab.extend(x);
    for e in p.a.take_events().into_iter().chain(p.b.take_events()) {
        assert!(!matches!(e, Event::Error(_) | Event::Closed), "{e:?}");
    }
    // End a's stream with a Terminate, so the seed covers that path too.
    p.a.conn.abort();
    ab.extend(p.a.drain_tx());
    ba.truncate(ba.len());
    (ab, ba)
}

type Target = (&'static str, fn(&[u8]), Vec<Vec<u8>>);

fn all_seeds() -> Vec<Target> {
    let hdrs: Vec<Vec<u8>> = header_seeds().iter().map(|h| h.to_vec()).collect();
    let mut streams = Vec::new();
    for crc in [false, true] {
        let (ab, ba) = conversation(crc);
        let skip = |s: &[u8]| {
            let n = 20 + usize::from(u16::from_be_bytes([s[18], s[19]]));
            s[n..].to_vec()
        };
        for s in [skip(&ab), skip(&ba)] {
            for ctl in [u8::from(crc), u8::from(crc) | 0x10, u8::from(crc) | 0xfe] {
                let mut v = vec![ctl];
                v.extend_from_slice(&s);
                streams.push(v);
            }
        }
    }
    let mut convs = Vec::new();
    for crc in [false, true] {
        let (ab, ba) = conversation(crc);
        let c = u8::from(crc) << 1;
        for chunk in [0u8, 7, 63] {
            let mut v = vec![c | chunk << 2];
            v.extend_from_slice(&ab);
            convs.push(v);
            let mut v = vec![c | 1 | chunk << 2];
            v.extend_from_slice(&ba);
            convs.push(v);
        }
    }
    vec![
        (
            "mpa_frame",
            fuzzing::fuzz_mpa_frame as fn(&[u8]),
            mpa_seeds(),
        ),
        ("ddp_header", fuzzing::fuzz_ddp_header, hdrs),
        ("rdmap_bodies", fuzzing::fuzz_rdmap_bodies, body_seeds()),
        ("fpdu_stream", fuzzing::fuzz_fpdu_stream, streams),
        ("connection", fuzzing::fuzz_connection, convs),
    ]
}

#[test]
fn fuzz_smoke() {
    let start = std::time::Instant::now();
    let mut total = 0;
    for (name, f, seeds) in all_seeds() {
        let (random, mutated, max_len) = match name {
            "mpa_frame" => (60_000, 60_000, 600),
            "ddp_header" | "rdmap_bodies" => (40_000, 40_000, 60),
            "fpdu_stream" => (20_000, 40_000, 2000),
            _ => (10_000, 30_000, 1200),
        };
        total += run(name, f, &seeds, random, mutated, max_len);
    }
    println!("fuzz smoke: {total} inputs in {:?}", start.elapsed());
    assert!(total >= 300_000);
}

/// With `FUZZ_WRITE_CORPUS=<dir>`, writes the seeds as a cargo-fuzz corpus
/// (`<dir>/<target>/seed-N`).
#[test]
fn write_corpus_if_asked() {
    let Ok(dir) = std::env::var("FUZZ_WRITE_CORPUS") else {
        return;
    };
    for (name, _, seeds) in all_seeds() {
        let d = std::path::Path::new(&dir).join(name);
        std::fs::create_dir_all(&d).unwrap();
        for (i, s) in seeds.iter().enumerate() {
            std::fs::write(d.join(format!("seed-{i}")), s).unwrap();
        }
    }
}

#[test]
fn seeds_reach_deep_code() {
    // The valid conversation, fed through the fuzz harness's connection,
    // must complete the Sends and place the Write: the seeds are not dead.
    let (ab, _) = conversation(true);
    let mut b =
        rdapl_iwarp::Connection::new(rdapl_iwarp::Role::Responder, fuzz_config(true), 0).unwrap();
    let mut mem = fuzz_memory();
    let n = 20 + usize::from(u16::from_be_bytes([ab[18], ab[19]]));
    b.handle_input(0, &ab[..n], &mut mem);
    while b.poll_event().is_some() {}
    b.accept(0, b"ok", None, None).unwrap();
    b.post_recv(1, 128).unwrap();
    b.post_recv(2, 128).unwrap();
    b.handle_input(0, &ab[n..], &mut mem);
    let mut recvs = 0;
    let mut term = false;
    while let Some(e) = b.poll_event() {
        match e {
            Event::RecvComplete { .. } => recvs += 1,
            Event::TerminateReceived(_) => term = true,
            _ => {}
        }
    }
    assert_eq!(recvs, 2);
    assert!(term);
    assert_eq!(&mem.regions[&0x100].data[0x10..0x50], &[0x5a; 64][..]);
    let _ = Buffer::Tagged { stag: 0, to: 0 };
}
