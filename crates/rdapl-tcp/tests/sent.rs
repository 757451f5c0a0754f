//! `complete=sent`: Sends and RDMA Writes complete once TCP has their last
//! byte (siw's meaning), with no fence; against the default `placed`.

mod common;

use common::*;
use rdapl::*;
use rdapl_tcp::{Completion, Tcp, TcpConfig};
use std::time::Duration;

/// With no receive posted at the peer, a small Send completes on `sent`
/// (its bytes are in the socket) and does not on `placed` (the peer
/// holds it back until a receive comes, so the fence behind it is not
/// answered). Either way the message lands once a receive is posted.
#[test]
fn a_send_completes_once_written_not_once_placed() {
    let tcp = Tcp::new();
    for (params, completes_early) in [("complete=sent", true), ("complete=placed", false)] {
        let p = Pair::connected(&tcp, "127.0.37.1", "127.0.37.2", params);
        let src = p.c.lmr(pattern(64, 4));
        let rbuf = p.s.buf(64);
        p.c.send(&src, 0, 64, 1);
        if completes_early {
            let d = next_dto(&p.c.req);
            assert_eq!((d.cookie, d.status), (1, DtoStatus::Success), "{params}");
        } else {
            std::thread::sleep(Duration::from_millis(300));
            empty(&p.c.req);
        }
        p.s.recv(&rbuf, 0, 64, 2);
        let r = next_dto(&p.s.rcv);
        assert_eq!(
            (r.cookie, r.status, r.transferred_length),
            (2, DtoStatus::Success, 64)
        );
        assert_eq!(rbuf.to_vec().unwrap(), pattern(64, 4), "{params}");
        if !completes_early {
            assert_eq!(next_dto(&p.c.req).status, DtoStatus::Success);
        }
        empty(&p.c.req);
        p.c.ep.disconnect(true).unwrap();
        p.expect_end(ConnectionEventKind::Disconnected);
    }
}

/// A completed Send's buffer may be rewritten at once: every message
/// arrives as it was when posted, although the sender refills one region
/// as soon as each completes. The receiver posts its receives late (one
/// each time the sender has waited 50 ms), so the socket fills and much
/// of a message is still queued when its last byte is: a completion that
/// came before the socket took every byte would let the next message's
/// bytes into this one.
#[test]
fn a_region_rewritten_after_its_send_completes_sends_what_was_posted() {
    // The instance's setting reaches its IAs.
    let tcp = Tcp::with_config(TcpConfig {
        complete: Completion::Sent,
        ..TcpConfig::default()
    });
    // With CRC an early completion shows as a bad CRC (the peer's
    // Terminate), without as changed bytes.
    rewrite_after_completion(&tcp, "127.0.37.3", "");
    rewrite_after_completion(&tcp, "127.0.37.7", "crc=0");
}

fn rewrite_after_completion(tcp: &std::sync::Arc<Tcp>, client: &str, params: &str) {
    const N: usize = 48;
    const LEN: usize = 1 << 20;
    let p = Pair::connected(tcp, client, "127.0.37.4", params);
    let bufs: Vec<Lmr> = (0..N).map(|_| p.s.buf(LEN)).collect();
    let mut posted = 0;
    let src = p.c.buf(LEN);
    let start = std::time::Instant::now();
    for i in 0..N {
        src.write_at(0, &pattern(LEN, i as u8)).unwrap();
        p.c.send(&src, 0, LEN as u64, i as u64);
        let d = loop {
            assert!(start.elapsed() < T, "message {i} did not complete");
            if let Ok((Event::Dto(d), _)) = p.c.req.wait(Some(Duration::from_millis(50)), 1) {
                break d;
            }
            if posted < N {
                p.s.recv(&bufs[posted], 0, LEN as u64, posted as u64);
                posted += 1;
            }
        };
        assert_eq!((d.cookie, d.status), (i as u64, DtoStatus::Success));
    }
    for (k, b) in bufs.iter().enumerate().skip(posted) {
        p.s.recv(b, 0, LEN as u64, k as u64);
    }
    for (i, b) in bufs.iter().enumerate() {
        let r = next_dto(&p.s.rcv);
        assert_eq!((r.cookie, r.status), (i as u64, DtoStatus::Success));
        assert!(
            b.to_vec().unwrap() == pattern(LEN, i as u8),
            "message {i} changed after it was posted"
        );
    }
}

/// On `sent`, a Write with a forged key succeeds locally (TCP took it);
/// the target moves nothing and answers with a Terminate, so both sides
/// break and every request not completed is flushed, once.
#[test]
fn a_forged_key_on_sent_breaks_both_sides_and_flushes_the_rest() {
    let tcp = Tcp::new();
    let p = Pair::connected(&tcp, "127.0.37.5", "127.0.37.6", "complete=sent");
    let target = p.s.lmr(vec![5; 64]);
    let rbuf = p.s.buf(16);
    p.s.recv(&rbuf, 0, 16, 9);
    let src = p.c.lmr(vec![1; 64]);
    let sink = p.c.buf(64);
    let forged = forged_key(&target);
    p.c.ep
        .post_rdma_write(&[src.triplet(0, 64).unwrap()], forged, 1, D)
        .unwrap();
    // A read behind it waits for a response that never comes.
    p.c.ep
        .post_rdma_read(
            &[sink.triplet(0, 64).unwrap()],
            target.rmr_triplet(0, 64).unwrap(),
            2,
            D,
        )
        .unwrap();
    let d = next_dto(&p.c.req);
    assert_eq!((d.cookie, d.status), (1, DtoStatus::Success));
    let d = next_dto(&p.c.req);
    assert_eq!(d.cookie, 2);
    assert_ne!(d.status, DtoStatus::Success, "{d:?}");
    p.expect_end(ConnectionEventKind::Broken);
    empty(&p.c.req);
    flushed(&p.s.rcv, &[9]);
    assert_eq!(target.to_vec().unwrap(), vec![5; 64]);
    assert!(sink.to_vec().unwrap().iter().all(|&b| b == 0));
}

/// A raw initiator (the rdapl-iwarp engine over a plain socket) at `at`,
/// asking for peer-to-peer mode (an RTR) or not: sends its MPA Request,
/// the consumer of `s` accepts it on `ep`, and it reads the Reply. It
/// sends nothing more: no RTR, no FPDU.
fn mute_initiator(s: &Node, ep: &Ep, at: (&str, u16), p2p: bool) -> std::net::TcpStream {
    use rdapl_iwarp::{Config, Connection, Event as IwEvent, Role, VecMemory};
    use std::io::{Read, Write};
    let mut sock = std::net::TcpStream::connect(at).unwrap();
    let cfg = Config {
        peer_to_peer: p2p,
        ..Config::default()
    };
    let mut conn = Connection::new(Role::Initiator, cfg, 0).unwrap();
    conn.connect(0, b"mute").unwrap();
    let mut mem = VecMemory::default();
    let mut out = Vec::new();
    while let Some(t) = conn.poll_transmit(&mem) {
        assert!(t.write_to(&mem, &mut out));
    }
    sock.write_all(&out).unwrap();
    next_cr(&s.ia, &s.cr).accept(ep, b"").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let end = std::time::Instant::now() + T;
    while !std::iter::from_fn(|| conn.poll_event())
        .any(|e| matches!(e, IwEvent::Established { .. }))
    {
        assert!(std::time::Instant::now() < end, "no MPA Reply");
        let mut b = [0u8; 512];
        if let Ok(n) = sock.read(&mut b) {
            assert!(n > 0, "the server closed");
            conn.handle_input(0, &b[..n], &mut mem);
        }
    }
    sock
}

/// A responder sends nothing before its initiator's first FPDU (RFC 5044
/// 7.1.2), with RFC 6581's RTR or without. An initiator that never sends
/// it must not hold the responder's Sends for ever: without an RTR the
/// responder is established at its accept, and its Sends wait for that
/// FPDU as a fence waits for its answer, so the connection breaks within
/// `timeout_ms`, everything flushed, on `sent` (no fence, no timer
/// before) as on `placed`. With an RTR the responder is not established
/// until it comes, takes no Send, and `mpa_timeout_ms` ends the wait.
#[test]
fn a_responders_sends_do_not_wait_for_ever_for_a_mute_initiator() {
    let tcp = Tcp::new();
    let cases = [
        ("complete=sent", "127.0.182.21", 18221u16),
        ("complete=placed", "127.0.182.22", 18222),
    ];
    for (mode, addr, port) in cases {
        let params = format!("{mode} timeout_ms=400 mpa_timeout_ms=60000");
        let s = Node::new(&tcp, addr, &params);
        let _psp = s.ia.psp_create(u64::from(port), &s.cr).unwrap();
        let _sock = mute_initiator(&s, &s.ep, (addr, port), false);
        assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Established);
        let src = s.lmr(pattern(64, 5));
        let start = std::time::Instant::now();
        s.send(&src, 0, 64, 1);
        s.send(&src, 0, 64, 2);
        for cookie in [1, 2] {
            let got = s.req.wait(Some(Duration::from_secs(3)), 1);
            assert!(
                matches!(got, Ok((Event::Dto(ref d), _))
                    if (d.cookie, d.status) == (cookie, DtoStatus::Flushed)),
                "{mode}: Send {cookie} after {:?}: {got:?}",
                start.elapsed()
            );
        }
        assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Broken, "{mode}");
        let took = start.elapsed();
        assert!(
            took < Duration::from_secs(3),
            "{mode}: broken after {took:?}"
        );
    }

    // With an RTR negotiated: no Send before it, and the wait is
    // mpa_timeout_ms's.
    let s = Node::new(
        &tcp,
        "127.0.182.23",
        "complete=sent timeout_ms=400 mpa_timeout_ms=300",
    );
    let _psp = s.ia.psp_create(18223, &s.cr).unwrap();
    let start = std::time::Instant::now();
    let _sock = mute_initiator(&s, &s.ep, ("127.0.182.23", 18223), true);
    let src = s.lmr(pattern(64, 5));
    let e = s.ep.post_send(&[src.triplet(0, 64).unwrap()], 1, D);
    assert!(e.is_err(), "a Send posted before the RTR: {e:?}");
    assert_eq!(
        conn_kind(&s.conn),
        ConnectionEventKind::AcceptCompletionError
    );
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
}
