//! What Linux soft-iWARP (siw, kernel 6.1 as in the lab VM, `lab/vm/`)
//! puts on the wire where it strays from the RFCs, fed to the engine as the
//! exact bytes captured from a live siw.

mod common;

use common::Pair;
use rdapl_iwarp::{Config, Event, ProtocolError, ReadRequest};

/// CRC off, peer-to-peer (as rdapl-tcp connects).
fn no_crc() -> Config {
    Config {
        crc: false,
        peer_to_peer: true,
        ..Config::default()
    }
}

/// An FPDU with CRC off: length, ULPDU, pad, a zero CRC field.
fn fpdu(ulpdu: &[u8]) -> Vec<u8> {
    let mut v = (ulpdu.len() as u16).to_be_bytes().to_vec();
    v.extend_from_slice(ulpdu);
    while !v.len().is_multiple_of(4) {
        v.push(0);
    }
    v.extend_from_slice(&[0; 4]);
    v
}

/// A zero-length read of ours, the kind rdapl-tcp posts as a fence.
fn zero_read() -> ReadRequest {
    ReadRequest {
        sink_stag: 1,
        sink_to: 0,
        size: 0,
        src_stag: 1,
        src_to: 0,
    }
}

/// A pair with `cfg` on both sides where `a` has a 4-byte RDMA Read (sink
/// STag 0x500) in flight, its request already sent.
fn four_byte_read(cfg: Config) -> Pair {
    let mut p = Pair::new(cfg.clone(), cfg);
    p.establish();
    p.a.mem.register(0x500, 0, vec![0; 4], false, false);
    let rr = ReadRequest {
        sink_stag: 0x500,
        size: 4,
        ..zero_read()
    };
    p.a.conn.post_read(7, rr).unwrap();
    p.a.drain_tx();
    p
}

/// The ULPDU of a last Read Response segment into STag 0x500 at TO 0.
fn read_response(payload: &[u8]) -> Vec<u8> {
    let mut u = vec![0xc1, 0x42, 0, 0, 0x05, 0x00];
    u.extend_from_slice(&0u64.to_be_bytes());
    u.extend_from_slice(payload);
    u
}

/// siw 6.1 answers a zero-length Read Request that waited in its inbound
/// read queue with the bytes of the work request its transmitter sent
/// before: `siw_activate_tx` sets `num_sge = 0` for the response but keeps
/// the old SGE, and the transmit path forces `num_sge = 1` for a Read
/// Response. Captured from `rping -s` (its 16-byte all-zero go ahead Send
/// just before): a tagged, last Read Response for sink STag 1, TO 0, with
/// 16 bytes, CRC off. A zero-length read places nothing, so the engine
/// drops such bytes and completes the read instead of terminating.
#[test]
fn siw_answers_a_zero_length_read_with_stale_bytes() {
    let mut p = Pair::new(no_crc(), no_crc());
    p.establish();
    p.a.conn.post_read(7, zero_read()).unwrap();
    let _request = p.a.drain_tx();
    #[rustfmt::skip]
    let siw: [u8; 36] = [
        0x00, 0x1e, 0xc1, 0x42, 0x00, 0x00, 0x00, 0x01, // ULPDU length 30, tagged+last, Read Response, STag 1
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // TO 0
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // 16 stale bytes
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, // CRC field (CRC off)
    ];
    p.a.conn.handle_input(0, &siw, &mut p.a.mem);
    let evs = p.a.take_events();
    assert_eq!(evs, vec![Event::ReadComplete { wr_id: 7, len: 0 }]);
    assert!(p.a.drain_tx().is_empty(), "no Terminate goes out");
    assert!(!p.a.conn.is_closed());
    // The connection goes on: a Send from b still arrives.
    p.a.mem.recvs.insert(3, vec![0; 8]);
    p.a.conn.post_recv(3, 8).unwrap();
    p.b.mem.sends.insert(9, b"after".to_vec());
    p.b.conn.post_send(9, 5).unwrap();
    p.pump();
    assert!(p.a.take_events().iter().any(|e| matches!(
        e,
        Event::RecvComplete {
            wr_id: 3,
            len: 5,
            ..
        }
    )),);
}

/// Split over FPDUs (a stale SGE longer than an MSS), the stale bytes are
/// dropped too; their TOs must still follow on.
#[test]
fn stale_bytes_over_several_fpdus_and_a_gap_in_them() {
    let resp = |to: u64, len: usize, last: bool| {
        let mut u = vec![if last { 0xc1 } else { 0x81 }, 0x42, 0, 0, 0, 1];
        u.extend_from_slice(&to.to_be_bytes());
        u.extend(std::iter::repeat_n(0xab, len));
        fpdu(&u)
    };
    let mut p = Pair::new(no_crc(), no_crc());
    p.establish();
    p.a.conn.post_read(7, zero_read()).unwrap();
    p.a.drain_tx();
    p.a.conn.handle_input(0, &resp(0, 100, false), &mut p.a.mem);
    p.a.conn.handle_input(0, &resp(100, 20, true), &mut p.a.mem);
    assert_eq!(
        p.a.take_events(),
        vec![Event::ReadComplete { wr_id: 7, len: 0 }]
    );
    // A second zero-length read whose stale bytes skip ahead is refused.
    p.a.conn.post_read(8, zero_read()).unwrap();
    p.a.drain_tx();
    p.a.conn.handle_input(0, &resp(0, 10, false), &mut p.a.mem);
    p.a.conn.handle_input(0, &resp(11, 5, true), &mut p.a.mem);
    let evs = p.a.take_events();
    assert!(
        evs.iter().any(|e| matches!(
            e,
            Event::Error(rdapl_iwarp::ConnError::Protocol(
                ProtocolError::SinkBounds { .. }
            ))
        )),
        "{evs:?}"
    );
}

/// The leniency is for zero-length reads only: a 4-byte read answered
/// with 16 bytes is still a bounds violation.
#[test]
fn a_longer_answer_to_a_non_empty_read_is_refused() {
    let mut p = four_byte_read(no_crc());
    let f = fpdu(&read_response(&[0u8; 16]));
    p.a.conn.handle_input(0, &f, &mut p.a.mem);
    let evs = p.a.take_events();
    assert!(
        evs.iter().any(|e| matches!(
            e,
            Event::Error(rdapl_iwarp::ConnError::Protocol(
                ProtocolError::SinkBounds { .. }
            ))
        )),
        "{evs:?}"
    );
    assert!(!p.a.drain_tx().is_empty(), "a Terminate goes out");
    assert!(p.a.conn.is_closed());
}

/// The zero-length RDMA Write rdapl sends as RTR and as a nudge, CRC off:
/// as in the captures (siw's own RTR is the same: STag 1, TO 0).
const ZERO_WRITE: [u8; 20] = [
    0x00, 0x0e, 0xc1, 0x40, 0x00, 0x00, 0x00, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
];

/// a connected to b and holds b's Reply at `t` ms; returns what a sent
/// after it (the RTR).
fn replied_at(p: &mut Pair, t: u64) -> Vec<u8> {
    p.a.conn.connect(0, b"").unwrap();
    let req = p.a.drain_tx();
    p.b.conn.handle_input(0, &req, &mut p.b.mem);
    assert!(matches!(
        p.b.take_events().as_slice(),
        [Event::ConnectRequest(_)]
    ));
    p.b.conn.accept(0, b"", None, None).unwrap();
    let rep = p.b.drain_tx();
    p.a.conn.handle_input(t, &rep, &mut p.a.mem);
    p.a.drain_tx()
}

/// siw 6.1's `siw_accept` sends the MPA Reply, then switches the socket
/// to its RTR reader; FPDUs that arrive in between stay unread until more
/// bytes come. Under TCG that window was about 6 ms: in 3 of 6 runs of
/// `rping -s` against rdapl, the RTR, the first Send and a Read Request
/// all landed in it, siw's log showed `siw_cm_llp_data_ready: cep state:
/// 7` (ignored) and nothing else until our FIN 15 s later. So an
/// initiator whose peer stays silent sends a zero-length Write 50 ms after
/// the Reply, again 200 ms and 800 ms after that, and then no more.
#[test]
fn a_silent_peer_after_the_reply_is_nudged_three_times() {
    let mut p = Pair::new(no_crc(), no_crc());
    let rtr = replied_at(&mut p, 10);
    assert_eq!(rtr, ZERO_WRITE, "the RTR");
    assert_eq!(p.a.conn.poll_timeout(), Some(60));
    p.a.conn.handle_timeout(59);
    assert!(p.a.drain_tx().is_empty(), "not before 50 ms");
    let mut at = 60;
    for gap in [200, 800] {
        p.a.conn.handle_timeout(at);
        assert_eq!(p.a.drain_tx(), ZERO_WRITE, "a nudge at {at} ms");
        at += gap;
        assert_eq!(p.a.conn.poll_timeout(), Some(at));
    }
    p.a.conn.handle_timeout(at);
    assert_eq!(p.a.drain_tx(), ZERO_WRITE, "the last nudge at {at} ms");
    assert_eq!(p.a.conn.poll_timeout(), None);
    p.a.conn.handle_timeout(at + 100_000);
    assert!(p.a.drain_tx().is_empty(), "three at most");
    // The peer takes the RTR and the nudges as zero-length Writes: nothing
    // but its Established.
    let mut all = rtr.clone();
    for _ in 0..3 {
        all.extend_from_slice(&ZERO_WRITE);
    }
    p.b.conn.handle_input(at, &all, &mut p.b.mem);
    assert!(matches!(
        p.b.take_events().as_slice(),
        [Event::Established { .. }]
    ));
    assert!(p.b.drain_tx().is_empty());
    assert!(!p.b.conn.is_closed());
}

/// A peer that speaks first stops the nudges (and none goes out).
#[test]
fn a_peer_that_speaks_is_not_nudged() {
    let mut p = Pair::new(no_crc(), no_crc());
    let rtr = replied_at(&mut p, 0);
    p.b.conn.handle_input(1, &rtr, &mut p.b.mem);
    p.b.take_events();
    p.b.mem.sends.insert(9, b"hi".to_vec());
    p.b.conn.post_send(9, 2).unwrap();
    p.a.mem.recvs.insert(3, vec![0; 8]);
    p.a.conn.post_recv(3, 8).unwrap();
    let hi = p.b.drain_tx();
    p.a.conn.handle_input(20, &hi, &mut p.a.mem);
    assert_eq!(p.a.conn.poll_timeout(), None);
    p.a.conn.handle_timeout(10_000);
    assert!(p.a.drain_tx().is_empty());
}

/// `rtr_nudge_ms: 0` turns the nudges off.
#[test]
fn nudges_can_be_turned_off() {
    let off = Config {
        rtr_nudge_ms: 0,
        ..no_crc()
    };
    let mut p = Pair::new(off, no_crc());
    replied_at(&mut p, 0);
    assert_eq!(p.a.conn.poll_timeout(), None);
    p.a.conn.handle_timeout(10_000);
    assert!(p.a.drain_tx().is_empty());
}

/// CRC on, peer-to-peer.
fn with_crc() -> Config {
    Config {
        crc: true,
        ..no_crc()
    }
}

fn crc_error(evs: &[Event]) -> bool {
    evs.iter().any(|e| {
        matches!(
            e,
            Event::Error(rdapl_iwarp::ConnError::Protocol(ProtocolError::Crc { .. }))
        )
    })
}

/// siw sends the stale bytes of its answer to a zero-length read from the
/// buffer itself, zero-copy, and rping may be writing that buffer at the
/// time: seen in CI (lab run test-siw-806, 5000-byte pings, CRC on), a
/// 5000-byte answer whose CRC did not match and a Terminate from us. The
/// bytes are dropped unread and the header matches the read, so that one
/// frame's CRC is not checked.
#[test]
fn stale_bytes_with_a_bad_crc_answering_a_zero_length_read_are_dropped() {
    let mut p = Pair::new(with_crc(), with_crc());
    p.establish();
    p.a.conn.post_read(7, zero_read()).unwrap();
    p.a.drain_tx();
    let mut u = vec![0xc1, 0x42, 0, 0, 0, 1];
    u.extend_from_slice(&0u64.to_be_bytes());
    u.extend(std::iter::repeat_n(0x5a, 100));
    // A zero CRC field: wrong for these bytes.
    let f = fpdu(&u);
    p.a.conn.handle_input(0, &f, &mut p.a.mem);
    let evs = p.a.take_events();
    assert_eq!(evs, vec![Event::ReadComplete { wr_id: 7, len: 0 }]);
    assert!(p.a.drain_tx().is_empty(), "no Terminate goes out");
    // The next frame's CRC is checked again: a Send with a zero CRC field.
    p.a.mem.recvs.insert(3, vec![0; 8]);
    p.a.conn.post_recv(3, 8).unwrap();
    let mut s = vec![0x41, 0x43, 0, 0, 0, 0];
    s.extend_from_slice(&0u32.to_be_bytes()); // queue 0
    s.extend_from_slice(&1u32.to_be_bytes()); // MSN 1
    s.extend_from_slice(&0u32.to_be_bytes()); // MO 0
    s.extend_from_slice(b"abcd");
    p.a.conn.handle_input(0, &fpdu(&s), &mut p.a.mem);
    let evs = p.a.take_events();
    assert!(crc_error(&evs), "{evs:?}");
}

/// Only a zero-length read's dropped bytes: a bad CRC on the answer to a
/// 4-byte read, or on an empty answer to a zero-length one, is refused.
#[test]
fn a_bad_crc_on_any_other_read_response_is_refused() {
    let mut p = four_byte_read(with_crc());
    p.a.conn
        .handle_input(0, &fpdu(&read_response(&[1, 2, 3, 4])), &mut p.a.mem);
    assert!(crc_error(&p.a.take_events()));

    let mut p = Pair::new(with_crc(), with_crc());
    p.establish();
    p.a.conn.post_read(8, zero_read()).unwrap();
    p.a.drain_tx();
    let mut u = vec![0xc1, 0x42, 0, 0, 0, 1];
    u.extend_from_slice(&0u64.to_be_bytes());
    p.a.conn.handle_input(0, &fpdu(&u), &mut p.a.mem);
    assert!(crc_error(&p.a.take_events()));
}
