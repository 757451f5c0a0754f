//! What a hostile or careless peer must not make the engine do: lose a
//! receive when its Send with Invalidate fails, place bytes through an
//! STag it invalidated in the middle of a message, or hold the send queue
//! behind a read it will never take (its IRD 0).

mod common;

use common::Pair;
use rdapl_iwarp::fpdu::{self, encode_fpdu};
use rdapl_iwarp::rdmap::{self, Opcode};
use rdapl_iwarp::{Config, ConnError, DdpHeader, Event, ProtocolError, ReadRequest, StagError};

fn cfg() -> Config {
    Config {
        ird: 2,
        ord: 2,
        ..Config::default()
    }
}

/// An established pair (CRC on) where a has spoken first; b has region
/// 0x100 (remote write, 4096 bytes at 0x1000) and one posted receive of 64.
fn pair() -> Pair {
    let mut p = Pair::new(cfg(), cfg());
    p.establish();
    p.b.mem.register(0x100, 0x1000, vec![0; 4096], true, false);
    p.b.mem.recvs.insert(1, vec![0; 64]);
    p.b.conn.post_recv(1, 64).unwrap();
    p
}

fn fpdu(h: &DdpHeader, payload: &[u8]) -> Vec<u8> {
    encode_fpdu(h, &[], payload, true).unwrap()
}

fn inject(p: &mut Pair, bytes: &[u8]) -> Vec<Event> {
    p.b.conn.handle_input(0, bytes, &mut p.b.mem);
    let out = p.b.drain_tx();
    let (_, err) = fpdu::decode_all(&out, true);
    assert_eq!(err, None, "b's own output must decode");
    p.b.take_events()
}

/// A Send with Invalidate whose STag cannot be invalidated: the receive it
/// took (its data placed) must still complete, with its outcome or as
/// flushed; it must not vanish.
#[test]
fn a_failed_remote_invalidate_does_not_lose_the_receive() {
    let mut p = pair();
    let h = rdmap::untagged_header(Opcode::SendInvalidate, true, 0x4242, 1, 0);
    let evs = inject(&mut p, &fpdu(&h, b"x"));
    assert!(
        evs.contains(&Event::Error(ConnError::Protocol(
            ProtocolError::CannotInvalidate {
                stag: 0x4242,
                err: StagError::Invalid
            }
        ))),
        "{evs:?}"
    );
    assert_eq!(evs.last(), Some(&Event::Closed), "{evs:?}");
    let n = evs
        .iter()
        .filter(|e| {
            matches!(
                e,
                Event::Flushed { wr_id: 1 } | Event::RecvComplete { wr_id: 1, .. }
            )
        })
        .count();
    assert_eq!(n, 1, "receive 1 completes exactly once: {evs:?}");
}

/// The peer invalidates (Send with Invalidate) the STag of the RDMA Write
/// it is in the middle of, then sends the Write's next segment: once the
/// consumer was told the STag is invalidated, no byte may land through it.
#[test]
fn no_write_segment_lands_through_an_stag_the_peer_invalidated() {
    let mut p = pair();
    let mut b = fpdu(
        &rdmap::tagged_header(Opcode::Write, false, 0x100, 0x1000),
        &[1; 8],
    );
    b.extend(fpdu(
        &rdmap::untagged_header(Opcode::SendInvalidate, true, 0x100, 1, 0),
        b"inv",
    ));
    b.extend(fpdu(
        &rdmap::tagged_header(Opcode::Write, true, 0x100, 0x1008),
        &[2; 8],
    ));
    let evs = inject(&mut p, &b);
    assert!(
        evs.contains(&Event::RecvComplete {
            wr_id: 1,
            len: 3,
            solicited: false,
            invalidated: Some(0x100),
        }),
        "{evs:?}"
    );
    assert!(!p.b.mem.regions[&0x100].valid);
    assert!(
        p.b.mem.regions[&0x100].data[8..16].iter().all(|&x| x == 0),
        "a segment was placed through an invalidated STag"
    );
    assert!(
        evs.contains(&Event::Error(ConnError::Protocol(
            ProtocolError::SinkStag {
                stag: 0x100,
                err: StagError::Invalid
            }
        ))),
        "{evs:?}"
    );
}

/// The initiator advertises IRD 0, so the responder's ORD is 0. An RDMA
/// Read posted there can never go out: it must be refused, not sit at the
/// head of the send queue holding every later request for ever.
#[test]
fn a_read_toward_a_peer_with_ird_0_does_not_hold_the_send_queue() {
    let ca = Config { ird: 0, ..cfg() };
    let mut p = Pair::new(ca, cfg());
    p.establish();
    assert_eq!(p.b.conn.negotiated().unwrap().ord, 0);
    // The initiator speaks first (RFC 5044 7.1.2): a zero-length Write.
    p.a.conn.post_write(99, 0, 1, 0).unwrap();
    p.pump();
    p.b.take_events();
    p.a.mem.recvs.insert(1, vec![0; 64]);
    p.a.conn.post_recv(1, 64).unwrap();
    p.b.mem.register(0x50, 0, vec![0; 64], false, false);
    let rr = ReadRequest {
        sink_stag: 0x50,
        sink_to: 0,
        size: 8,
        src_stag: 0x77,
        src_to: 0,
    };
    let read = p.b.conn.post_read(7, rr);
    p.b.mem.sends.insert(8, b"hi".to_vec());
    p.b.conn.post_send(8, 2).unwrap();
    p.pump();
    let evs = p.b.take_events();
    assert!(
        read.is_err()
            || evs
                .iter()
                .any(|e| matches!(e, Event::ReadComplete { wr_id: 7, .. })),
        "the read neither refused nor done: {read:?} {evs:?}"
    );
    assert!(
        evs.contains(&Event::SendComplete { wr_id: 8 }),
        "the Send behind the read never went out: {evs:?}"
    );
}
