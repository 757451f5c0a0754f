//! A large message that answers the peer leaves in two socket writes: its
//! first FPDU at once, so the peer takes it in while the rest is framed
//! and written; a stream of large messages the peer does not answer keeps
//! one write a message. Every byte arrives either way.

mod common;

use common::*;
use rdapl::*;
use rdapl_tcp::Tcp;

/// FPDUs of about 20,000 bytes: a message of `LARGE` bytes takes three.
const PARAMS: &str = "mss=20000";
const LARGE: usize = 48 << 10;
const ROUNDS: usize = 8;

/// The client asks with 64 bytes, the server answers with `LARGE`: the
/// server's socket writes for each answer, from its post to its
/// completion (the answer and its fence; the server writes nothing else).
fn answers(p: &Pair, ts: &Tcp) -> Vec<u64> {
    let ask = p.c.lmr(vec![7; 64]);
    let asked = p.s.buf(64);
    let reply = p.s.lmr(pattern(LARGE, 5));
    let got = p.c.buf(LARGE);
    let mut writes = Vec::new();
    for i in 0..ROUNDS as u64 {
        p.s.recv(&asked, 0, 64, i);
        p.c.recv(&got, 0, LARGE as u64, i);
        p.c.send(&ask, 0, 64, i);
        assert_eq!(next_dto(&p.s.rcv).status, DtoStatus::Success);
        assert_eq!(next_dto(&p.c.req).status, DtoStatus::Success);
        let before = ts.socket_writes();
        p.s.send(&reply, 0, LARGE as u64, i);
        let d = next_dto(&p.c.rcv);
        assert_eq!(
            (d.status, d.transferred_length),
            (DtoStatus::Success, LARGE as u64)
        );
        assert_eq!(next_dto(&p.s.req).status, DtoStatus::Success);
        writes.push(ts.socket_writes() - before);
        assert!(
            got.to_vec().unwrap() == reply.to_vec().unwrap(),
            "bytes differ"
        );
    }
    writes
}

#[test]
fn a_large_answer_leaves_its_first_fpdu_in_a_write_of_its_own() {
    let (_tc, ts, p) = Pair::apart("127.0.44.1", "127.0.44.2", PARAMS);
    let writes = answers(&p, &ts);
    // A write that the socket's buffer takes in part adds one; every
    // answer has its early write.
    assert!(
        writes.iter().all(|w| *w >= 2),
        "answers took {writes:?} writes"
    );
}

#[test]
fn a_large_message_that_answers_nothing_keeps_one_write() {
    let (tc, ts, p) = Pair::apart("127.0.44.3", "127.0.44.4", PARAMS);
    // Warm the connection first (the socket's buffer grows).
    assert_eq!(answers(&p, &ts).len(), ROUNDS);
    let n = 16usize;
    let rbuf = p.s.buf(n * LARGE);
    let data = pattern(n * LARGE, 6);
    let src = p.c.lmr(data.clone());
    let mut writes = Vec::new();
    // One message at a time, each done on both sides before the next: the
    // client's last message answered nothing the server sent.
    for i in 0..n {
        p.s.recv(&rbuf, (i * LARGE) as u64, LARGE as u64, i as u64);
        let before = tc.socket_writes();
        p.c.send(&src, (i * LARGE) as u64, LARGE as u64, i as u64);
        let d = next_dto(&p.s.rcv);
        assert_eq!((d.status, d.cookie), (DtoStatus::Success, i as u64));
        let d = next_dto(&p.c.req);
        assert_eq!((d.status, d.cookie), (DtoStatus::Success, i as u64));
        writes.push(tc.socket_writes() - before);
    }
    // A message and its fence in one write (one more where the socket's
    // buffer took part of it); the early write would make every one two.
    let total: u64 = writes.iter().sum();
    assert!(
        total < (n + n / 2) as u64,
        "{n} messages took {writes:?} writes"
    );
    assert!(rbuf.to_vec().unwrap() == data, "bytes differ");
}
