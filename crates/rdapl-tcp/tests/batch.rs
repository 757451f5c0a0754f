//! Requests posted together (`Ep::post_batch`) leave in one socket write:
//! eight 4 KiB Sends (copied into the output queue, being small) and
//! sixteen 64-byte ones take one system call (two for the larger, should
//! the socket's buffer take only part), where separate posts, or 4 KiB
//! messages written from their registered memory, take one each; every
//! byte arrives. A burst of small messages is read several to a system
//! call, and fenced as it goes.

mod common;

use common::*;
use rdapl::*;

/// The server posts `n` receives of `len` bytes, in one region.
fn receives(p: &Pair, len: usize, n: usize) -> Lmr {
    let rbuf = p.s.buf(n * len);
    for i in 0..n {
        p.s.recv(&rbuf, (i * len) as u64, len as u64, i as u64);
    }
    rbuf
}

/// The client sends `n` messages of `len` bytes of `src`, one batch.
fn send_batch(p: &Pair, src: &Lmr, len: usize, n: usize) {
    p.c.ep
        .post_batch(|b| {
            for i in 0..n {
                let t = src.triplet((i * len) as u64, len as u64)?;
                b.post_send(&[t], i as u64, D)?;
            }
            Ok::<_, Error>(())
        })
        .unwrap();
}

/// `n` successful completions on `evd`, cookies 0 to `n - 1` in order.
fn in_order(evd: &Evd, n: usize) {
    for i in 0..n {
        let d = next_dto(evd);
        assert_eq!((d.status, d.cookie), (DtoStatus::Success, i as u64));
    }
}

#[test]
fn a_batch_of_small_sends_is_one_socket_write() {
    let (tc, _ts, p) = Pair::apart("127.0.14.1", "127.0.14.2", "");
    // One message first: the server's answer to its fence is an FPDU of
    // the peer, after which the client sends no more MPA nudges (RTR
    // repeats) that would count as writes.
    let warm = p.s.buf(64);
    p.s.recv(&warm, 0, 64, 99);
    p.c.send(&p.c.lmr(vec![1; 64]), 0, 64, 99);
    assert_eq!(next_dto(&p.s.rcv).status, DtoStatus::Success);
    assert_eq!(next_dto(&p.c.req).status, DtoStatus::Success);
    for (len, n, most, seed) in [(4096usize, 8usize, 2u64, 1u8), (64, 16, 1, 2)] {
        let rbuf = receives(&p, len, n);
        let data = pattern(n * len, seed);
        let src = p.c.lmr(data.clone());
        // The client's writes from before the batch to its completions:
        // the batch and its fence (the client writes nothing else here).
        let before = tc.socket_writes();
        send_batch(&p, &src, len, n);
        in_order(&p.s.rcv, n);
        in_order(&p.c.req, n);
        let batched = tc.socket_writes() - before;
        assert!(
            (1..=most).contains(&batched),
            "{len} B: a batch took {batched} writes"
        );
        assert!(rbuf.to_vec().unwrap() == data, "{len} B: bytes differ");
    }
}

/// A burst of small messages (a batch: they arrive together) is read
/// several FPDUs to a system call, through the input buffer, not with a
/// read (or two) of its own per message straight into each receive; every
/// byte arrives.
#[test]
fn a_burst_of_small_messages_is_read_in_few_socket_reads() {
    let (_tc, ts, p) = Pair::apart("127.0.14.3", "127.0.14.4", "");
    let (len, n) = (4096usize, 24usize);
    let rbuf = receives(&p, len, n);
    let data = pattern(n * len, 3);
    let src = p.c.lmr(data.clone());
    let before = ts.socket_reads();
    send_batch(&p, &src, len, n);
    in_order(&p.s.rcv, n);
    let reads = ts.socket_reads() - before;
    assert!(
        reads <= (n / 2) as u64,
        "{n} messages of {len} B took {reads} reads"
    );
    assert!(rbuf.to_vec().unwrap() == data, "bytes differ");
    in_order(&p.c.req, n);
}

/// A burst of small placed Sends gets fences as it goes, not one at its
/// end: its first Sends complete (and a streaming sender refills its
/// window) while the rest are on their way; every Send completes.
#[test]
fn a_burst_of_small_sends_is_fenced_as_it_goes() {
    let (tc, _ts, p) = Pair::apart("127.0.14.5", "127.0.14.6", "complete=placed");
    let (len, n) = (256usize, 16usize);
    let _rbuf = receives(&p, len, n);
    let src = p.c.lmr(pattern(n * len, 4));
    let before = tc.fences();
    send_batch(&p, &src, len, n);
    in_order(&p.c.req, n);
    in_order(&p.s.rcv, n);
    let fences = tc.fences() - before;
    assert!(
        (2..=n as u64).contains(&fences),
        "{n} Sends in a burst took {fences} fences"
    );
}
