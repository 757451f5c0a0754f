//! A fixed conversation used by several tests: sends, writes and reads both
//! ways, with every byte pattern known.
#![allow(dead_code)]

use super::{Pair, Side};
use rdapl_iwarp::{Event, ReadRequest};

pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Registers the regions both sides use.
pub fn setup_memory(a: &mut Side, b: &mut Side) {
    // b's regions: 0x100 write target, 0x200 read source.
    b.mem.register(0x100, 0x10_0000, vec![0; 8192], true, false);
    b.mem
        .register(0x200, 0x20_0000, pattern(2, 6000), false, true);
    // a's regions: 0x300 read sink, 0x400 write target, 0x500 read source, 0x600 to invalidate.
    a.mem
        .register(0x300, 0x30_0000, vec![0; 6000], false, false);
    a.mem.register(0x400, 0x40_0000, vec![0; 4096], true, false);
    a.mem
        .register(0x500, 0x50_0000, pattern(5, 3000), false, true);
    a.mem.register(0x600, 0x60_0000, vec![0; 16], false, false);
    b.mem
        .register(0x700, 0x70_0000, vec![0; 3000], false, false);
    // Send buffers.
    a.mem.sends.insert(1, pattern(11, 5));
    a.mem.sends.insert(2, pattern(12, 5000));
    a.mem.sends.insert(3, pattern(13, 3000));
    b.mem.sends.insert(21, pattern(21, 2000));
    b.mem.sends.insert(22, pattern(22, 1000));
    b.mem.sends.insert(23, pattern(23, 7));
    // Receive buffers.
    b.mem.recvs.insert(101, vec![0; 16]);
    b.mem.recvs.insert(102, vec![0; 8000]);
    a.mem.recvs.insert(201, vec![0; 4000]);
    a.mem.recvs.insert(202, vec![0; 64]);
}

/// Posts the receives.
pub fn post_recvs(a: &mut Side, b: &mut Side) {
    b.conn.post_recv(101, 16).unwrap();
    b.conn.post_recv(102, 8000).unwrap();
    a.conn.post_recv(201, 4000).unwrap();
    a.conn.post_recv(202, 64).unwrap();
}

/// Posts a's operations.
pub fn post_a(a: &mut Side) {
    a.conn.post_send(1, 5).unwrap();
    a.conn.post_send_se(2, 5000).unwrap();
    a.conn.post_write(3, 3000, 0x100, 0x10_0000 + 100).unwrap();
    let rr = ReadRequest {
        sink_stag: 0x300,
        sink_to: 0x30_0000,
        size: 4000,
        src_stag: 0x200,
        src_to: 0x20_0000 + 10,
    };
    a.conn.post_read(4, rr).unwrap();
}

/// Posts b's operations.
pub fn post_b(b: &mut Side) {
    b.conn.post_send(21, 2000).unwrap();
    b.conn.post_write(22, 1000, 0x400, 0x40_0000 + 7).unwrap();
    let rr = ReadRequest {
        sink_stag: 0x700,
        sink_to: 0x70_0000,
        size: 3000,
        src_stag: 0x500,
        src_to: 0x50_0000,
    };
    b.conn.post_read(24, rr).unwrap();
    b.conn.post_send_inv(23, 7, 0x600, true).unwrap();
}

/// Checks every byte landed where it should.
pub fn check_memory(a: &Side, b: &Side) {
    assert_eq!(&b.mem.recvs[&101][..5], &pattern(11, 5)[..]);
    assert_eq!(&b.mem.recvs[&102][..5000], &pattern(12, 5000)[..]);
    assert_eq!(
        &b.mem.regions[&0x100].data[100..3100],
        &pattern(13, 3000)[..]
    );
    assert!(b.mem.regions[&0x100].data[..100].iter().all(|&x| x == 0));
    assert!(b.mem.regions[&0x100].data[3100..].iter().all(|&x| x == 0));
    assert_eq!(
        &a.mem.regions[&0x300].data[..4000],
        &pattern(2, 6000)[10..4010]
    );
    assert_eq!(&a.mem.recvs[&201][..2000], &pattern(21, 2000)[..]);
    assert_eq!(&a.mem.regions[&0x400].data[7..1007], &pattern(22, 1000)[..]);
    assert_eq!(&b.mem.regions[&0x700].data[..], &pattern(5, 3000)[..]);
    assert_eq!(&a.mem.recvs[&202][..7], &pattern(23, 7)[..]);
    assert!(
        !a.mem.regions[&0x600].valid,
        "send-with-invalidate did not invalidate"
    );
}

/// The events each side must have seen from its peer's messages.
pub fn check_events(a_events: &[Event], b_events: &[Event]) {
    let has = |evs: &[Event], want: &Event| evs.iter().any(|e| e == want);
    for e in [
        Event::RecvComplete {
            wr_id: 101,
            len: 5,
            solicited: false,
            invalidated: None,
        },
        Event::RecvComplete {
            wr_id: 102,
            len: 5000,
            solicited: true,
            invalidated: None,
        },
        Event::ReadComplete {
            wr_id: 24,
            len: 3000,
        },
        Event::SendComplete { wr_id: 21 },
        Event::SendComplete { wr_id: 22 },
        Event::SendComplete { wr_id: 23 },
    ] {
        assert!(has(b_events, &e), "b lacks {e:?} in {b_events:?}");
    }
    for e in [
        Event::RecvComplete {
            wr_id: 201,
            len: 2000,
            solicited: false,
            invalidated: None,
        },
        Event::RecvComplete {
            wr_id: 202,
            len: 7,
            solicited: true,
            invalidated: Some(0x600),
        },
        Event::ReadComplete {
            wr_id: 4,
            len: 4000,
        },
        Event::SendComplete { wr_id: 1 },
        Event::SendComplete { wr_id: 2 },
        Event::SendComplete { wr_id: 3 },
    ] {
        assert!(has(a_events, &e), "a lacks {e:?} in {a_events:?}");
    }
    for evs in [a_events, b_events] {
        assert!(
            !evs.iter().any(|e| matches!(
                e,
                Event::Error(_)
                    | Event::Flushed { .. }
                    | Event::TerminateReceived(_)
                    | Event::Closed
            )),
            "{evs:?}"
        );
    }
}

/// Runs the whole conversation on an established pair with whole-buffer
/// pumping. Returns the a→b and b→a FPDU bytes after setup.
pub fn run(p: &mut Pair) -> (Vec<u8>, Vec<u8>) {
    setup_memory(&mut p.a, &mut p.b);
    post_recvs(&mut p.a, &mut p.b);
    post_a(&mut p.a);
    post_b(&mut p.b);
    p.pump()
}
