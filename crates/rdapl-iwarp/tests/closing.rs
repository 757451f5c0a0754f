//! A local close answers the peer's zero-length reads (fences) it has
//! already taken in: they tell the peer what was placed before the close.

mod common;

use common::Pair;
use rdapl_iwarp::fpdu;
use rdapl_iwarp::rdmap::Opcode;
use rdapl_iwarp::{Config, Event, ReadRequest};

fn pair() -> Pair {
    let cfg = Config {
        ird: 4,
        ord: 4,
        ..Config::default()
    };
    let mut p = Pair::new(cfg.clone(), cfg);
    p.establish();
    p.a.mem.register(0x50, 0, vec![0; 64], false, false);
    p.b.mem.register(0x200, 0, vec![9; 256], false, true);
    p.b.mem.recvs.insert(1, vec![0; 64]);
    p.b.conn.post_recv(1, 64).unwrap();
    p
}

fn read(size: u32) -> ReadRequest {
    ReadRequest {
        sink_stag: 0x50,
        sink_to: 0,
        size,
        src_stag: if size == 0 { 1 } else { 0x200 },
        src_to: 0,
    }
}

/// What b sends after `close`, decoded: the opcodes of its FPDUs.
fn closed_output(p: &mut Pair) -> Vec<u8> {
    let from_a = p.a.drain_tx();
    p.b.conn.handle_input(0, &from_a, &mut p.b.mem);
    p.b.conn.close();
    let out = p.b.drain_tx();
    let (frames, err) = fpdu::decode_all(&out, true);
    assert_eq!(err, None, "b's output decodes");
    p.a.conn.handle_input(0, &out, &mut p.a.mem);
    frames.iter().map(|f| f.header.opcode).collect()
}

fn reads_done(p: &mut Pair) -> Vec<u64> {
    p.a.take_events()
        .iter()
        .filter_map(|e| match e {
            Event::ReadComplete { wr_id, .. } => Some(*wr_id),
            _ => None,
        })
        .collect()
}

#[test]
fn fences_taken_in_are_answered_after_a_close() {
    let mut p = pair();
    // A Send placed, then two fences behind it.
    p.a.mem.sends.insert(9, vec![7; 16]);
    p.a.conn.post_send(9, 16).unwrap();
    p.a.conn.post_read(1, read(0)).unwrap();
    p.a.conn.post_read(2, read(0)).unwrap();
    let ops = closed_output(&mut p);
    let rr = Opcode::ReadResponse as u8;
    assert_eq!(ops, vec![rr, rr], "both fences answered");
    assert_eq!(reads_done(&mut p), vec![1, 2]);
    assert_eq!(p.b.mem.recvs[&1][..16], [7; 16]);
}

#[test]
fn no_answer_after_one_that_carries_data() {
    // Responses match requests in order: the fence after a read with data
    // (dropped by the close) must not go out either.
    let mut p = pair();
    p.a.conn.post_read(1, read(0)).unwrap();
    p.a.conn.post_read(2, read(8)).unwrap();
    p.a.conn.post_read(3, read(0)).unwrap();
    let ops = closed_output(&mut p);
    assert_eq!(ops, vec![Opcode::ReadResponse as u8]);
    assert_eq!(reads_done(&mut p), vec![1]);
}
