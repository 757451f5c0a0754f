//! The MULPDU follows the connection's MSS as it changes: FPDUs framed
//! after `set_mss` fit the new MSS, a message under way included, and the
//! peer places every byte whatever sizes its segments had.

mod common;

use common::Pair;
use rdapl_iwarp::{Config, Event, PostError, ReadRequest, Transmit};

const LEN: usize = 20_000;

fn pattern(seed: u8) -> Vec<u8> {
    (0..LEN).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect()
}

/// Established, with a's Send and Write buffers and b's receive and
/// write target.
fn pair() -> Pair {
    let cfg = Config {
        mss: 1460,
        ..Config::default()
    };
    let mut p = Pair::new(cfg.clone(), cfg);
    p.establish();
    p.a.mem.sends.insert(1, pattern(1));
    p.a.mem.sends.insert(2, pattern(2));
    p.b.mem.register(0x200, 0, vec![0; LEN], true, false);
    p.b.mem.recvs.insert(7, vec![0; LEN]);
    p.b.conn.post_recv(7, LEN as u32).unwrap();
    p
}

/// The FPDU lengths of the next `n` transmits of `side` (all if `n` is
/// `None`), written to `out`.
fn frames(side: &mut common::Side, n: Option<usize>, out: &mut Vec<u8>) -> Vec<usize> {
    let mut lens = Vec::new();
    while n.is_none_or(|n| lens.len() < n) {
        let Some(t) = side.conn.poll_transmit(&side.mem) else {
            break;
        };
        assert!(matches!(t, Transmit::Fpdu { .. }));
        lens.push(t.len());
        assert!(t.write_to(&side.mem, out));
    }
    lens
}

#[test]
fn frames_follow_the_mss_within_a_message() {
    let mut p = pair();
    p.a.conn.post_send(1, LEN as u32).unwrap();
    p.a.conn.post_write(2, LEN as u32, 0x200, 0).unwrap();
    let mut out = Vec::new();
    let first = frames(&mut p.a, Some(3), &mut out);
    assert!(first.iter().all(|&l| l <= 1456), "{first:?}");
    assert_eq!(
        p.a.conn.set_mss(63),
        Err(PostError::Config("mss must be at least 64"))
    );
    assert_eq!(
        p.a.conn.config().mss,
        1460,
        "a refused change changes nothing"
    );
    p.a.conn.set_mss(9000).unwrap();
    let wide = frames(&mut p.a, Some(3), &mut out);
    assert!(wide.iter().all(|&l| l <= 9000), "{wide:?}");
    assert!(wide.iter().any(|&l| l > 1460), "{wide:?}");
    p.a.conn.set_mss(536).unwrap();
    let rest = frames(&mut p.a, None, &mut out);
    assert!(rest.iter().all(|&l| l <= 536), "{rest:?}");
    p.b.conn.handle_input(0, &out, &mut p.b.mem);
    let evs = p.b.take_events();
    assert!(
        evs.iter().any(
            |e| matches!(e, Event::RecvComplete { wr_id: 7, len, .. } if *len as usize == LEN)
        ),
        "{evs:?}"
    );
    assert_eq!(p.b.mem.recvs[&7], pattern(1));
    assert_eq!(p.b.mem.regions[&0x200].data, pattern(2));
}

#[test]
fn read_responses_follow_the_responders_mss() {
    let mut p = pair();
    p.b.mem.register(0x300, 0, pattern(3), false, true);
    p.a.mem.register(0x400, 0, vec![0; LEN], false, false);
    p.b.conn.set_mss(65535).unwrap();
    p.a.conn
        .post_read(
            9,
            ReadRequest {
                sink_stag: 0x400,
                sink_to: 0,
                size: LEN as u32,
                src_stag: 0x300,
                src_to: 0,
            },
        )
        .unwrap();
    let req = p.a.drain_tx();
    p.b.conn.handle_input(0, &req, &mut p.b.mem);
    let mut out = Vec::new();
    let lens = frames(&mut p.b, None, &mut out);
    // One FPDU carries the whole response (at 1460, fourteen would).
    assert_eq!(lens.len(), 1, "{lens:?}");
    p.a.conn.handle_input(0, &out, &mut p.a.mem);
    let evs = p.a.take_events();
    assert!(
        evs.contains(&Event::ReadComplete {
            wr_id: 9,
            len: LEN as u32
        }),
        "{evs:?}"
    );
    assert_eq!(p.a.mem.regions[&0x400].data, pattern(3));
}
