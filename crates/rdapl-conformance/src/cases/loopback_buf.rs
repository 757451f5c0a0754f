//! Owned buffers (`Buf`) on the loopback provider: posted sends and
//! receives move the buffer into the request and its completion hands it
//! back, whatever the status; a refused post hands it back with the error;
//! owned buffers and LMR triplets mix on the two sides of a send.

use crate::case;
use crate::support as common;

use common::{Side, T, empty, next, next_cr, next_dto, side};
use rdapl::*;

/// A connected pair (server, client) on `qual`.
fn pair(s_addr: &str, c_addr: &str, qual: u64) -> (Side, Side, Psp) {
    let s = side(s_addr);
    let c = side(c_addr);
    let psp = s.ia.psp_create(qual, &s.evd).unwrap();
    c.ep.connect(s.ia.address(), qual, Some(T), b"").unwrap();
    let cr = next_cr(&s.ia, &s.evd);
    cr.accept(&s.ep, b"").unwrap();
    for e in [&s.evd, &c.evd] {
        match next(e) {
            Event::Connection(ev) => assert_eq!(ev.kind, ConnectionEventKind::Established),
            ev => panic!("{ev:?}"),
        }
    }
    (s, c, psp)
}

/// The next DTO completion on `evd`: its cookie, status, operation, length
/// and buffer (which must be there).
fn next_buf(evd: &Evd) -> (u64, DtoStatus, DtoOp, u64, Buf) {
    let d = next_dto(evd);
    let buf = d.buf.expect("an owned buffer's completion carries it");
    (d.cookie, d.status, d.operation, d.transferred_length, buf)
}

#[case]
fn owned_buffers_ping_pong_and_always_come_back() {
    let (s, c, _psp) = pair("127.0.30.1", "127.0.30.2", 5100);
    // Two receives posted on each side; the buffers travel back and forth.
    for (side, base) in [(&s, 100), (&c, 200)] {
        for k in 0..2 {
            let b = side.pz.buf_create(64).unwrap();
            side.ep
                .post_recv_buf(b, base + k, CompletionFlags::DEFAULT)
                .unwrap();
        }
    }
    let mut send_c = Some(c.pz.buf_create(64).unwrap());
    let mut send_s = Some(s.pz.buf_create(64).unwrap());
    for i in 0..200u64 {
        // Client to server.
        let mut b = send_c.take().unwrap();
        b[..8].copy_from_slice(&i.to_le_bytes());
        c.ep.post_send_buf(b, 8 + (i as usize % 50), i, CompletionFlags::DEFAULT)
            .unwrap();
        let (cookie, st, op, len, b) = next_buf(&c.evd);
        assert_eq!(
            (cookie, st, op, len),
            (i, DtoStatus::Success, DtoOp::Send, 8 + i % 50)
        );
        assert_eq!(
            &b[..8],
            &i.to_le_bytes(),
            "a send leaves its buffer as it was"
        );
        send_c = Some(b);
        let (cookie, st, op, len, mut r) = next_buf(&s.evd);
        assert_eq!(
            (st, op, len),
            (DtoStatus::Success, DtoOp::Receive, 8 + i % 50)
        );
        assert!((100..102).contains(&cookie));
        assert_eq!(u64::from_le_bytes(r[..8].try_into().unwrap()), i);
        // Echo back from the server's own send buffer, repost the receive.
        let mut e = send_s.take().unwrap();
        e[..8].copy_from_slice(&r[..8]);
        r.fill(0);
        s.ep.post_recv_buf(r, cookie, CompletionFlags::DEFAULT)
            .unwrap();
        s.ep.post_send_buf(e, 8, i, CompletionFlags::DEFAULT)
            .unwrap();
        let (_, st, _, _, e) = next_buf(&s.evd);
        assert_eq!(st, DtoStatus::Success);
        send_s = Some(e);
        let (cookie, st, op, len, r) = next_buf(&c.evd);
        assert_eq!((st, op, len), (DtoStatus::Success, DtoOp::Receive, 8));
        assert_eq!(u64::from_le_bytes(r[..8].try_into().unwrap()), i);
        c.ep.post_recv_buf(r, cookie, CompletionFlags::DEFAULT)
            .unwrap();
    }
    empty(&s.evd);
    empty(&c.evd);
    // Disconnect: the four posted receives come back flushed, each with
    // its buffer.
    c.ep.disconnect(false).unwrap();
    for (side, base) in [(&s, 100u64), (&c, 200)] {
        let mut cookies = Vec::new();
        let mut disconnected = false;
        for _ in 0..3 {
            match next(&side.evd) {
                Event::Dto(d) => {
                    assert_eq!(d.status, DtoStatus::Flushed);
                    assert_eq!(d.buf.expect("a flushed receive's buffer").len(), 64);
                    cookies.push(d.cookie);
                }
                Event::Connection(e) => {
                    assert_eq!(e.kind, ConnectionEventKind::Disconnected);
                    disconnected = true;
                }
                e => panic!("{e:?}"),
            }
        }
        cookies.sort_unstable();
        assert_eq!(cookies, [base, base + 1]);
        assert!(disconnected);
    }
}

#[case]
fn owned_buffers_and_lmr_triplets_mix() {
    let (s, c, _psp) = pair("127.0.30.3", "127.0.30.4", 5101);
    // Owned buffer to a triplet receive.
    let rlmr = s.pz.lmr_create(Region::zeroed(32), MemPriv::ALL).unwrap();
    s.ep.post_recv(&[rlmr.triplet(8, 16).unwrap()], 1, CompletionFlags::DEFAULT)
        .unwrap();
    let b = c.pz.buf_from(b"owned->triplet!!xyz").unwrap();
    c.ep.post_send_buf(b, 16, 2, CompletionFlags::DEFAULT)
        .unwrap();
    let (_, st, _, len, b) = next_buf(&c.evd);
    assert_eq!((st, len), (DtoStatus::Success, 16));
    assert_eq!(&b[..], b"owned->triplet!!xyz");
    let d = next_dto(&s.evd);
    assert_eq!(
        (d.cookie, d.status, d.transferred_length),
        (1, DtoStatus::Success, 16)
    );
    assert!(d.buf.is_none());
    let got = rlmr.to_vec().unwrap();
    assert_eq!(&got[8..24], b"owned->triplet!!");
    assert_eq!(&got[..8], &[0; 8], "nothing outside the receive's range");

    // A triplet send (two pieces) into an owned receive.
    let r = s.pz.buf_create(40).unwrap();
    s.ep.post_recv_buf(r, 3, CompletionFlags::DEFAULT).unwrap();
    let slmr =
        c.pz.lmr_create_from(b"triplet->owned".to_vec(), MemPriv::LOCAL_READ)
            .unwrap();
    c.ep.post_send(
        &[slmr.triplet(0, 8).unwrap(), slmr.triplet(8, 6).unwrap()],
        4,
        CompletionFlags::DEFAULT,
    )
    .unwrap();
    let d = next_dto(&c.evd);
    assert_eq!(
        (d.cookie, d.status, d.transferred_length),
        (4, DtoStatus::Success, 14)
    );
    assert!(d.buf.is_none());
    let (cookie, st, _, len, r) = next_buf(&s.evd);
    assert_eq!((cookie, st, len), (3, DtoStatus::Success, 14));
    assert_eq!(&r[..14], b"triplet->owned");
    assert_eq!(&r[14..], &[0; 26]);

    // A single-triplet send into an owned receive (the usual message).
    let r = s.pz.buf_create(8).unwrap();
    s.ep.post_recv_buf(r, 5, CompletionFlags::DEFAULT).unwrap();
    c.ep.post_send(&[slmr.triplet(0, 7).unwrap()], 6, CompletionFlags::DEFAULT)
        .unwrap();
    assert_eq!(next_dto(&c.evd).status, DtoStatus::Success);
    let (_, st, _, len, r) = next_buf(&s.evd);
    assert_eq!((st, len), (DtoStatus::Success, 7));
    assert_eq!(&r[..7], b"triplet");
}

#[case]
fn a_receive_too_short_fails_and_both_buffers_come_back() {
    if crate::support::skip_unless_placed() {
        return;
    }
    let (s, c, _psp) = pair("127.0.30.5", "127.0.30.6", 5102);
    s.ep.post_recv_buf(s.pz.buf_create(4).unwrap(), 1, CompletionFlags::DEFAULT)
        .unwrap();
    c.ep.post_send_buf(
        c.pz.buf_from(b"0123456789").unwrap(),
        10,
        2,
        CompletionFlags::DEFAULT,
    )
    .unwrap();
    let (cookie, st, _, _, b) = next_buf(&c.evd);
    assert_eq!((cookie, st), (2, DtoStatus::RemoteResponder));
    assert_eq!(&b[..], b"0123456789");
    let mut seen_recv = false;
    // The receiver's failed receive (and the connection's end) follow.
    for _ in 0..2 {
        match next(&s.evd) {
            Event::Dto(d) => {
                assert_eq!((d.cookie, d.status), (1, DtoStatus::LocalLength));
                assert_eq!(d.buf.expect("its buffer").len(), 4);
                seen_recv = true;
            }
            Event::Connection(_) => {}
            e => panic!("{e:?}"),
        }
    }
    assert!(seen_recv);
}

#[case]
fn a_send_waits_for_an_owned_receive() {
    if crate::support::skip_unless_placed() {
        return;
    }
    let (s, c, _psp) = pair("127.0.30.7", "127.0.30.8", 5103);
    // No receive yet: the send waits at the head of the queue.
    c.ep.post_send_buf(
        c.pz.buf_from(b"late").unwrap(),
        4,
        1,
        CompletionFlags::DEFAULT,
    )
    .unwrap();
    assert_eq!(c.evd.dequeue().unwrap(), None);
    s.ep.post_recv_buf(s.pz.buf_create(16).unwrap(), 2, CompletionFlags::DEFAULT)
        .unwrap();
    let (_, st, _, _, b) = next_buf(&c.evd);
    assert_eq!(st, DtoStatus::Success);
    assert_eq!(&b[..], b"late");
    let (_, st, _, len, r) = next_buf(&s.evd);
    assert_eq!((st, len), (DtoStatus::Success, 4));
    assert_eq!(&r[..4], b"late");
}

#[case]
fn refused_posts_hand_the_buffer_back() {
    let (s, c, _psp) = pair("127.0.30.9", "127.0.30.10", 5104);
    let refused = |r: std::result::Result<(), BufRefused>| -> (Error, Buf) {
        let e = r.expect_err("refused");
        (e.error, e.buf)
    };
    // Another zone's buffer.
    let other = s.ia.pz_create().unwrap();
    let (e, b) = refused(s.ep.post_recv_buf(
        other.buf_from(&[7; 8]).unwrap(),
        1,
        CompletionFlags::DEFAULT,
    ));
    assert!(matches!(e, Error::ProtectionViolation(_)), "{e:?}");
    assert_eq!(&b[..], &[7; 8]);
    assert_eq!(b.pz(), other.handle());
    let (e, _) =
        refused(c.ep.post_send_buf(other.buf_create(8).unwrap(), 8, 1, CompletionFlags::DEFAULT));
    assert!(matches!(e, Error::ProtectionViolation(_)), "{e:?}");
    // A completion that would not come back.
    let (e, _) =
        refused(s.ep.post_recv_buf(s.pz.buf_create(8).unwrap(), 1, CompletionFlags::SUPPRESS));
    assert!(matches!(e, Error::InvalidParameter { .. }), "{e:?}");
    for f in [CompletionFlags::SUPPRESS, CompletionFlags::UNSIGNALLED] {
        let (e, _) = refused(c.ep.post_send_buf(c.pz.buf_create(8).unwrap(), 8, 1, f));
        assert!(matches!(e, Error::InvalidParameter { .. }), "{e:?}");
    }
    // Longer than the buffer.
    let (e, b) =
        refused(c.ep.post_send_buf(c.pz.buf_create(8).unwrap(), 9, 1, CompletionFlags::DEFAULT));
    assert!(matches!(e, Error::InvalidParameter { .. }), "{e:?}");
    assert_eq!(b.len(), 8);
    // Nothing was queued or completed by any of them.
    empty(&s.evd);
    empty(&c.evd);
    // Not connected any more.
    c.ep.disconnect(false).unwrap();
    let _ = next(&c.evd);
    let (e, b) =
        refused(c.ep.post_send_buf(c.pz.buf_from(b"x").unwrap(), 1, 1, CompletionFlags::DEFAULT));
    assert!(matches!(e, Error::InvalidState { .. }), "{e:?}");
    assert_eq!(&b[..], b"x");
    // A zone that is gone makes no buffers.
    let lone = c.ia.pz_create().unwrap();
    lone.free().unwrap();
    assert!(lone.buf_create(8).is_err());
}

#[case]
fn an_srq_endpoint_refuses_owned_receives() {
    let s = side("127.0.30.11");
    let srq = s.ia.srq_create(&s.pz, 8, 2).unwrap();
    let ep =
        s.ia.ep_create_with_srq(&s.pz, &s.evd, Some(&s.evd), Some(&s.evd), &srq, None)
            .unwrap();
    let e = ep
        .post_recv_buf(s.pz.buf_create(8).unwrap(), 1, CompletionFlags::DEFAULT)
        .expect_err("refused");
    assert!(
        matches!(e.error, Error::InvalidState { .. }),
        "{:?}",
        e.error
    );
    assert_eq!(e.buf.len(), 8);
}

/// Owned-buffer sends into a peer that takes its receives from a shared
/// receive queue (LMR triplets): the bytes land in the SRQ's receives in
/// post order, a send that finds no receive waits for one, a receive too
/// short fails both sides, and every send buffer comes back.
#[case]
fn owned_sends_into_a_shared_receive_queue() {
    if crate::support::skip_unless_placed() {
        return;
    }
    let s = side("127.0.30.21");
    let c = side("127.0.30.22");
    let srq = s.ia.srq_create(&s.pz, 8, 2).unwrap();
    let e =
        s.ia.ep_create_with_srq(&s.pz, &s.evd, Some(&s.evd), Some(&s.evd), &srq, None)
            .unwrap();
    let _psp = s.ia.psp_create(5110, &s.evd).unwrap();
    c.ep.connect(s.ia.address(), 5110, Some(T), b"").unwrap();
    let cr = next_cr(&s.ia, &s.evd);
    cr.accept(&e, b"").unwrap();
    for evd in [&s.evd, &c.evd] {
        match next(evd) {
            Event::Connection(ev) => assert_eq!(ev.kind, ConnectionEventKind::Established),
            ev => panic!("{ev:?}"),
        }
    }
    // No receive yet: the send waits at the head of the client's queue.
    let mut b = c.pz.buf_create(32).unwrap();
    b[..5].copy_from_slice(b"first");
    c.ep.post_send_buf(b, 5, 1, CompletionFlags::DEFAULT)
        .unwrap();
    empty(&c.evd);
    let rb = s.pz.lmr_create(Region::zeroed(64), MemPriv::ALL).unwrap();
    for (k, len) in [(0u64, 16u64), (1, 16), (2, 4)] {
        srq.post_recv(
            &[rb.triplet(k * 16, len).unwrap()],
            100 + k,
            CompletionFlags::DEFAULT,
        )
        .unwrap();
    }
    // The waiting send lands in the first receive.
    let d = next_dto(&s.evd);
    assert_eq!(
        (d.cookie, d.status, d.operation, d.transferred_length, d.ep),
        (100, DtoStatus::Success, DtoOp::Receive, 5, e.handle())
    );
    assert!(d.buf.is_none(), "a triplet receive carries no buffer");
    let (cookie, st, op, len, mut b) = next_buf(&c.evd);
    assert_eq!(
        (cookie, st, op, len),
        (1, DtoStatus::Success, DtoOp::Send, 5)
    );
    // The next one goes at once, into the second.
    b[..6].copy_from_slice(b"second");
    c.ep.post_send_buf(b, 6, 2, CompletionFlags::DEFAULT)
        .unwrap();
    assert_eq!(next_dto(&s.evd).cookie, 101);
    let (cookie, st, _, len, mut b) = next_buf(&c.evd);
    assert_eq!((cookie, st, len), (2, DtoStatus::Success, 6));
    let data = rb.to_vec().unwrap();
    assert_eq!(&data[0..5], b"first");
    assert_eq!(&data[16..22], b"second");
    // The third receive holds 4 bytes: an 8-byte send fails on both sides,
    // and its buffer still comes back, its bytes intact.
    b[..8].copy_from_slice(b"too-long");
    c.ep.post_send_buf(b, 8, 3, CompletionFlags::DEFAULT)
        .unwrap();
    let d = next_dto(&s.evd);
    assert_eq!((d.cookie, d.status), (102, DtoStatus::LocalLength));
    let (cookie, st, _, _, b) = next_buf(&c.evd);
    assert_eq!((cookie, st), (3, DtoStatus::RemoteResponder));
    assert_eq!(&b[..8], b"too-long");
    assert_eq!(&rb.to_vec().unwrap()[32..36], &[0u8; 4]);
}

/// Owned-buffer sends in a batch (`Ep::post_batch`): they arrive in order,
/// each completion hands its buffer back, and one the batch refuses (too
/// long for its buffer) comes back with the error while those before it
/// still go out.
#[case]
fn a_batch_of_owned_buffers_goes_out_and_comes_back() {
    let (s, c, _psp) = pair("127.0.30.41", "127.0.30.42", 5140);
    for k in 0..8u64 {
        let b = s.pz.buf_create(64).unwrap();
        s.ep.post_recv_buf(b, 100 + k, CompletionFlags::DEFAULT)
            .unwrap();
    }
    let refused = c.ep.post_batch(|b| {
        for i in 0..8u64 {
            let mut buf = c.pz.buf_create(64).unwrap();
            buf[..8].copy_from_slice(&i.to_le_bytes());
            b.post_send_buf(buf, 8, i, CompletionFlags::DEFAULT)
                .unwrap();
        }
        assert_eq!(b.len(), 8);
        // Longer than its buffer: refused, the buffer handed back.
        let small = c.pz.buf_create(16).unwrap();
        b.post_send_buf(small, 17, 9, CompletionFlags::DEFAULT)
            .unwrap_err()
    });
    assert_eq!(refused.buf.len(), 16);
    // The server's side first: the batch went out at its end.
    for i in 0..8u64 {
        let (cookie, st, op, len, buf) = next_buf(&s.evd);
        assert_eq!(
            (cookie, st, op, len),
            (100 + i, DtoStatus::Success, DtoOp::Receive, 8)
        );
        assert_eq!(buf[..8], i.to_le_bytes());
    }
    for i in 0..8u64 {
        let (cookie, st, op, _, buf) = next_buf(&c.evd);
        assert_eq!((cookie, st, op), (i, DtoStatus::Success, DtoOp::Send));
        assert_eq!(buf[..8], i.to_le_bytes());
    }
    empty(&c.evd);
}
