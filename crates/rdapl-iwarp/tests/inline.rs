//! A payload posted inline (`post_send_inline`, `post_write_inline`) puts
//! the same bytes on the wire, and reports the same events, as the same
//! payload posted by reference to memory, whatever the MSS, CRC and mix
//! of requests; and the peer places it.

mod common;

use common::Pair;
use proptest::prelude::*;
use rdapl_iwarp::fpdu::INLINE_MAX;
use rdapl_iwarp::{Config, Event, PostError};

#[derive(Debug, Clone)]
enum Op {
    Send {
        data: Vec<u8>,
        solicited: bool,
        invalidate: Option<u32>,
    },
    Write {
        data: Vec<u8>,
        to: u64,
    },
    /// Drain what is framed so far, so that posts meet a busy or an idle
    /// send queue.
    Drain,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (
            proptest::collection::vec(any::<u8>(), 0..=INLINE_MAX),
            any::<bool>(),
            proptest::option::of(any::<u32>()),
        )
            .prop_map(|(data, solicited, invalidate)| Op::Send {
                data,
                solicited,
                invalidate,
            }),
        (
            proptest::collection::vec(any::<u8>(), 0..=INLINE_MAX),
            0u64..4096
        )
            .prop_map(|(data, to)| Op::Write { data, to }),
        Just(Op::Drain),
    ]
}

fn pair(crc: bool, mss: u32) -> Pair {
    let cfg = Config {
        crc,
        mss,
        ..Config::default()
    };
    let mut p = Pair::new(cfg.clone(), cfg);
    p.establish();
    p
}

/// Posts `ops` on `p.a`, inline or by reference; returns the wire bytes and
/// the events.
fn run(p: &mut Pair, ops: &[Op], inline: bool) -> (Vec<u8>, Vec<Event>) {
    let mut wire = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let id = i as u64 + 100;
        let a = &mut p.a;
        match op {
            Op::Send {
                data,
                solicited,
                invalidate,
            } => {
                let r = if inline {
                    a.conn.post_send_inline(id, data, *solicited, *invalidate)
                } else {
                    a.mem.sends.insert(id, data.clone());
                    let len = data.len() as u32;
                    match (invalidate, solicited) {
                        (Some(k), se) => a.conn.post_send_inv(id, len, *k, *se),
                        (None, true) => a.conn.post_send_se(id, len),
                        (None, false) => a.conn.post_send(id, len),
                    }
                };
                r.unwrap();
            }
            Op::Write { data, to } => {
                let r = if inline {
                    a.conn.post_write_inline(id, data, 0x300, *to)
                } else {
                    a.mem.sends.insert(id, data.clone());
                    a.conn.post_write(id, data.len() as u32, 0x300, *to)
                };
                r.unwrap();
            }
            Op::Drain => wire.extend(a.drain_tx()),
        }
    }
    wire.extend(p.a.drain_tx());
    (wire, p.a.take_events())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn inline_and_by_reference_put_the_same_bytes_on_the_wire(
        ops in proptest::collection::vec(op(), 1..24),
        crc in any::<bool>(),
        mss in prop_oneof![Just(64u32), 64u32..400, Just(1460u32)],
    ) {
        let (w_ref, e_ref) = run(&mut pair(crc, mss), &ops, false);
        let (w_inl, e_inl) = run(&mut pair(crc, mss), &ops, true);
        prop_assert_eq!(&w_ref, &w_inl);
        prop_assert_eq!(e_ref, e_inl);
    }
}

#[test]
fn the_peer_places_inline_sends_and_writes() {
    let mut p = pair(true, 100);
    let msg: Vec<u8> = (0..INLINE_MAX as u32).map(|i| (i * 7) as u8).collect();
    p.b.mem.recvs.insert(7, vec![0; INLINE_MAX]);
    p.b.conn.post_recv(7, INLINE_MAX as u32).unwrap();
    p.b.mem.register(0x300, 0, vec![0; 64], true, false);
    p.a.conn.post_send_inline(1, &msg, true, None).unwrap();
    p.a.conn
        .post_write_inline(2, &msg[..32], 0x300, 16)
        .unwrap();
    let wire = p.a.drain_tx();
    p.b.conn.handle_input(0, &wire, &mut p.b.mem);
    let ev = p.b.take_events();
    assert!(
        ev.contains(&Event::RecvComplete {
            wr_id: 7,
            len: INLINE_MAX as u32,
            solicited: true,
            invalidated: None,
        }),
        "{ev:?}"
    );
    assert_eq!(p.b.mem.recvs[&7], msg);
    assert_eq!(&p.b.mem.regions[&0x300].data[16..48], &msg[..32]);
    assert_eq!(
        p.a.take_events(),
        vec![
            Event::SendComplete { wr_id: 1 },
            Event::SendComplete { wr_id: 2 }
        ]
    );
}

#[test]
fn an_inline_payload_is_at_most_inline_max_and_a_write_may_not_wrap() {
    let mut p = pair(false, 1460);
    let long = vec![0u8; INLINE_MAX + 1];
    assert_eq!(
        p.a.conn.post_send_inline(1, &long, false, None),
        Err(PostError::TooLong)
    );
    assert_eq!(
        p.a.conn.post_write_inline(2, &long, 0x300, 0),
        Err(PostError::TooLong)
    );
    assert_eq!(
        p.a.conn.post_write_inline(3, &[1, 2], 0x300, u64::MAX),
        Err(PostError::Wrap)
    );
    assert!(p.a.drain_tx().is_empty());
}
