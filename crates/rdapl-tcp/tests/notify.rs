//! A consumer that polled an EVD and then turns to notification (an
//! upcall, a CNO, the poller, an async stream) gets the next completion
//! at once: the input it held while it polled goes back to the provider's
//! thread when it arms, not when the thread next checks whether the
//! polling stopped.
//!
//! Every test makes that check an hour apart (`poll_fresh_ms`), so a
//! consumer that kept the input would see nothing within the bound `T`.
//! A consumer that polled and then waits for the connection's end sees it
//! at once too. The last test: a consumer that polled a receive in and then went
//! quiet still lets the answer to the peer's fence out (the peer's send
//! completes on it), within the provider's hold bound, not the hour.
//! And a consumer that polled and then paused for longer than
//! `timeout_ms` while its read was answered is not mistaken for a peer
//! that fell silent: the answer waits in the socket.

mod common;

use common::*;
use rdapl::*;
use rdapl_tcp::{Tcp, TcpConfig};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

/// A provider whose thread would leave a polled connection's input alone
/// for an hour.
fn patient() -> Arc<Tcp> {
    Tcp::with_config(TcpConfig {
        poll_fresh_ms: 3_600_000,
        ..Default::default()
    })
}

/// A connected pair that has moved a first message both ways (no
/// connection set-up timer is left to pump the sockets). Each side's send
/// follows its receive, so that it carries the answer to the peer's fence
/// (a consumer that got a receive holds that answer back for its reply).
fn warm_pair(client: &str, server: &str) -> Pair {
    warm_pair_with(client, (server, &patient()), "")
}

/// [`warm_pair`] with IA parameters, the server on a provider of its own.
fn warm_pair_with(client: &str, server: (&str, &Arc<Tcp>), params: &str) -> Pair {
    let p = Pair::new(
        Node::new(&patient(), client, params),
        Node::new(server.1, server.0, params),
    );
    p.connect();
    let ok = |evd: &Evd, what: &str| {
        let got = evd.wait(Some(T), 1).expect(what);
        assert!(
            matches!(got.0, Event::Dto(ref d) if d.status == DtoStatus::Success),
            "{what}"
        );
    };
    let (cdst, sdst) = (p.c.buf(8), p.s.buf(8));
    p.c.recv(&cdst, 0, 8, 100);
    p.s.recv(&sdst, 0, 8, 100);
    let (csrc, ssrc) = (p.c.lmr(pattern(8, 1)), p.s.lmr(pattern(8, 2)));
    p.s.send(&ssrc, 0, 8, 101);
    ok(&p.c.rcv, "warm: the client's receive");
    p.c.send(&csrc, 0, 8, 101);
    ok(&p.s.rcv, "warm: the server's receive");
    ok(&p.s.req, "warm: the server's send");
    ok(&p.c.req, "warm: the client's send");
    p
}

/// A warm pair, a receive posted on the client, and the client's receive
/// EVD polled empty (the client's thread now holds the input).
fn polled_pair(client: &str, server: &str) -> (Pair, Lmr) {
    let p = warm_pair(client, server);
    let buf = p.c.buf(64);
    p.c.recv(&buf, 0, 64, 1);
    for _ in 0..10 {
        assert_eq!(p.c.rcv.dequeue().unwrap(), None);
    }
    (p, buf)
}

/// The server sends 64 bytes to the client's receive, cookie 1.
fn server_sends(p: &Pair, seed: u8) -> Lmr {
    let src = p.s.lmr(pattern(64, seed));
    p.s.send(&src, 0, 64, 7);
    src
}

fn is_recv_1(ev: &Event) -> bool {
    matches!(ev, Event::Dto(d) if d.cookie == 1 && d.status == DtoStatus::Success)
}

#[test]
fn an_upcall_armed_after_polling_gets_the_next_receive() {
    let (p, buf) = polled_pair("127.0.31.1", "127.0.31.2");
    let (tx, rx) = mpsc::channel::<Event>();
    let tx = Mutex::new(tx);
    let up: Arc<dyn Upcall> = Arc::new(move |_: &Evd, ev: Option<Event>, _more: bool| {
        if let Some(ev) = ev {
            let _ = tx.lock().unwrap().send(ev);
        }
    });
    let pending =
        p.c.rcv
            .modify_upcall(UpcallPolicy::Many, Some(up), ReEnable::OnAny)
            .unwrap();
    assert_eq!(pending, 0);
    let _src = server_sends(&p, 3);
    let ev = rx
        .recv_timeout(T)
        .expect("the receive's upcall within the bound, not when the thread checks");
    assert!(is_recv_1(&ev), "{ev:?}");
    let mut got = vec![0u8; 64];
    buf.read_at(0, &mut got).unwrap();
    assert_eq!(got, pattern(64, 3));
    assert_eq!(next_dto(&p.s.req).status, DtoStatus::Success);
}

#[test]
fn a_waiter_for_the_end_after_polling_sees_it_at_once() {
    // The end of a connection comes in with its data: a consumer that
    // polled the receive EVD, then waits on the connection EVD, drives
    // that input (the connection EVD runs the same progress hooks).
    let (p, _buf) = polled_pair("127.0.222.1", "127.0.222.2");
    p.s.ep.disconnect(true).unwrap();
    assert_eq!(
        conn_kind(&p.c.conn),
        ConnectionEventKind::Disconnected,
        "the end within the bound, not when the thread checks"
    );
    assert_eq!(conn_kind(&p.s.conn), ConnectionEventKind::Disconnected);
    // The receive the client had posted is flushed.
    let d = next_dto(&p.c.rcv);
    assert_eq!((d.cookie, d.status), (1, DtoStatus::Flushed));
}

#[test]
fn a_cno_waiter_after_polling_is_woken_by_the_next_receive() {
    let cno = Cno::new();
    let p = warm_pair("127.0.32.1", "127.0.32.2");
    p.c.rcv.modify_cno(Some(&cno)).unwrap();
    p.c.rcv.enable().unwrap();
    // uDAPL's flow: drain by polling, then block on the CNO.
    let buf = p.c.buf(64);
    p.c.recv(&buf, 0, 64, 1);
    for _ in 0..10 {
        assert_eq!(p.c.rcv.dequeue().unwrap(), None);
    }
    let _src = server_sends(&p, 4);
    assert_eq!(
        cno.wait(Some(T)).expect("a trigger within the bound"),
        p.c.rcv.handle()
    );
    let ev = p.c.rcv.dequeue().unwrap().expect("the receive");
    assert!(is_recv_1(&ev), "{ev:?}");
}

#[test]
fn the_poller_gets_every_message_of_a_conversation() {
    // The poller drains in batches (a dequeue that finds the EVD empty
    // polls the socket) and then re-arms its notify-only upcall.
    let (p, _buf) = polled_pair("127.0.33.1", "127.0.33.2");
    let poller = Poller::new(PollerConfig::default()).unwrap();
    let (tx, rx) = mpsc::channel::<Event>();
    let _entry = poller
        .add(&p.c.rcv, move |ev| {
            let _ = tx.send(ev);
        })
        .unwrap();
    let bufs: Vec<Lmr> = (0..3).map(|_| p.c.buf(64)).collect();
    for (i, b) in bufs.iter().enumerate() {
        p.c.recv(b, 0, 64, 10 + i as u64);
    }
    // One message at a time: each finds the poller idle and re-armed.
    for i in 0..4u8 {
        let _src = server_sends(&p, 10 + i);
        let ev = rx.recv_timeout(T).expect("each message within the bound");
        assert!(
            matches!(ev, Event::Dto(ref d) if d.status == DtoStatus::Success),
            "{ev:?}"
        );
        assert_eq!(next_dto(&p.s.req).status, DtoStatus::Success);
    }
}

#[test]
fn an_async_stream_after_polling_gets_the_next_receive() {
    use futures_core::Stream;
    use std::pin::Pin;
    use std::task::{Context, Poll, Wake, Waker};

    struct Signal(Mutex<mpsc::Sender<()>>);
    impl Wake for Signal {
        fn wake(self: Arc<Self>) {
            let _ = self.0.lock().unwrap().send(());
        }
    }
    let (p, _buf) = polled_pair("127.0.34.1", "127.0.34.2");
    let (tx, woken) = mpsc::channel();
    let waker = Waker::from(Arc::new(Signal(Mutex::new(tx))));
    let mut cx = Context::from_waker(&waker);
    let mut stream = p.c.rcv.stream();
    assert!(Pin::new(&mut stream).poll_next(&mut cx).is_pending());
    let _src = server_sends(&p, 5);
    woken
        .recv_timeout(T)
        .expect("the stream's waker within the bound");
    match Pin::new(&mut stream).poll_next(&mut cx) {
        Poll::Ready(Some(Ok(ev))) => assert!(is_recv_1(&ev), "{ev:?}"),
        other => panic!("expected the receive, got {other:?}"),
    }
}

#[test]
fn a_held_answer_goes_out_though_the_consumer_goes_quiet() {
    let (p, buf) = polled_pair("127.0.35.1", "127.0.35.2");
    let _src = server_sends(&p, 6);
    // The message reaches the client's socket while the client polls (as
    // far as the thread knows: its last pass is an hour fresh), so the
    // thread leaves it there for the client's next pass.
    std::thread::sleep(std::time::Duration::from_millis(50));
    // The client polls its receive in (and holds the answer to the
    // server's fence back for a reply that never comes), then goes quiet.
    let end = std::time::Instant::now() + T;
    let ev = loop {
        if let Some(ev) = p.c.rcv.dequeue().unwrap() {
            break ev;
        }
        assert!(
            std::time::Instant::now() < end,
            "no receive within the bound"
        );
    };
    assert!(is_recv_1(&ev), "{ev:?}");
    let mut got = vec![0u8; 64];
    buf.read_at(0, &mut got).unwrap();
    assert_eq!(got, pattern(64, 6));
    // The server's send completes on the client's answer.
    let d = next_dto(&p.s.req);
    assert_eq!((d.cookie, d.status), (7, DtoStatus::Success), "{d:?}");
}

/// A consumer posts an RDMA Read while it polls, then pauses for three
/// times the IA's `timeout_ms`: the response reaches the client's socket
/// and stays there (the thread leaves the input to the consumer), so no
/// byte is read while the read is outstanding. That is not a silent
/// peer: the connection stays up and the read completes. (The server's
/// provider is an ordinary one: its thread answers whoever polled last.)
#[test]
fn a_paused_poller_is_not_taken_for_a_silent_peer() {
    let server = Tcp::new();
    let p = warm_pair_with("127.0.36.1", ("127.0.36.2", &server), "timeout_ms=200");
    // (The warm-up's own fences leave a check of the client's timer
    // pending for a timeout: it passes first, so that the read's check
    // finds its answer in the socket rather than read by that pump.)
    std::thread::sleep(std::time::Duration::from_millis(400));
    for _ in 0..10 {
        assert_eq!(p.c.req.dequeue().unwrap(), None);
    }
    let target = p.s.lmr(pattern(4096, 3));
    let sink = p.c.buf(4096);
    p.c.ep
        .post_rdma_read(
            &[sink.triplet(0, 4096).unwrap()],
            target.rmr_triplet(0, 4096).unwrap(),
            1,
            D,
        )
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(600));
    assert_eq!(p.c.ep.state(), EpState::Connected, "broken while paused");
    let d = next_dto(&p.c.req);
    assert_eq!((d.cookie, d.status), (1, DtoStatus::Success), "{d:?}");
    assert_eq!(sink.to_vec().unwrap(), pattern(4096, 3));
    assert_eq!(p.c.ep.state(), EpState::Connected);
}

/// A consumer's `wait` drives its connection from its own thread for the
/// IA's `wait_spin_us`, then leaves it to the provider's thread and
/// blocks: with none (a machine with one CPU) every completion of a
/// waited ping-pong comes through the provider's thread, no consumer
/// runs a pass; with a long spin the waiters take their completions in
/// themselves.
#[test]
fn a_wait_drives_its_connection_for_the_spin_it_is_given() {
    const ROUNDS: u64 = 100;
    for (spin, client, server) in [
        (0, "127.0.227.1", "127.0.227.2"),
        (1_000_000, "127.0.227.3", "127.0.227.4"),
    ] {
        let tcp = Tcp::new();
        // Placed: each Send's completion too comes through a wait (once
        // sent, it completes in the post, and a loaded machine's provider
        // thread took half the rest in 2 of 8 runs).
        let params = format!("wait_spin_us={spin} complete=placed");
        let p = Pair::connected(&tcp, client, server, &params);
        let (sbuf, cbuf) = (p.s.buf(64), p.c.buf(64));
        let (ssrc, csrc) = (p.s.lmr(vec![7; 64]), p.c.lmr(vec![9; 64]));
        let n0 = tcp.passes();
        for i in 0..ROUNDS {
            round_trip(&p, (&sbuf, &cbuf), (&ssrc, &csrc), 64, i, next_dto);
        }
        let passes = tcp.passes() - n0;
        if spin == 0 {
            assert_eq!(passes, 0, "passes run by waiters that were not to spin");
        } else {
            assert!(
                passes >= ROUNDS / 2,
                "{passes} passes in {ROUNDS} round trips of spinning waiters"
            );
        }
    }
}

/// A polling consumer's passes (each `dequeue` that finds its EVD empty)
/// yield the CPU once every `poll_yield` of them (on a machine with one CPU
/// by default, where a poll loop that never yields keeps a peer on the
/// same CPU from running), and never with 0.
#[test]
fn a_polling_consumer_yields_once_every_poll_yield_passes() {
    for (every, client, server) in [
        (0, "127.0.227.5", "127.0.227.6"),
        (4, "127.0.227.7", "127.0.227.8"),
    ] {
        let tcp = Tcp::new();
        let p = Pair::connected(&tcp, client, server, &format!("poll_yield={every}"));
        let (y0, n0) = (tcp.poll_yields(), tcp.passes());
        for _ in 0..400 {
            assert!(p.c.rcv.dequeue().unwrap().is_none());
        }
        let (y, n) = (tcp.poll_yields() - y0, tcp.passes() - n0);
        assert_eq!(n, 400, "a pass for each dequeue of the empty EVD");
        assert_eq!(y, if every == 0 { 0 } else { 100 }, "poll_yield={every}");
    }
}

/// A waiting consumer whose `wait` takes its input in while it spins
/// (the provider's thread, woken by the same input, comes too late to see
/// it) gets that input left to it, as a polling consumer does: its passes
/// then hold the answer to the peer's fence back for its reply, one write
/// a message each way instead of two. Both ends wait, in threads of their
/// own, with spins longer than any answer; the client blocks once first
/// (its input goes back to the thread), then pauses for the thread to
/// take the word of its next passes (the thread may get no CPU while both
/// waiters spin).
#[test]
fn a_spinning_waiter_holds_its_answers_for_its_reply() {
    const WARM: u64 = 20;
    const ROUNDS: u64 = 1000;
    let tcp = patient();
    let p = Pair::connected(&tcp, "127.0.224.1", "127.0.224.2", "wait_spin_us=1000000");
    let (sbuf, cbuf) = (p.s.buf(64), p.c.buf(64));
    let (ssrc, csrc) = (p.s.lmr(vec![7; 64]), p.c.lmr(vec![9; 64]));
    let writes = std::thread::scope(|sc| {
        sc.spawn(|| {
            for i in 0..2 * WARM + ROUNDS {
                assert_eq!(next_dto(&p.s.rcv).status, DtoStatus::Success);
                p.s.recv(&sbuf, 0, 64, i + 1);
                p.s.send(&ssrc, 0, 64, i);
                assert_eq!(next_dto(&p.s.req).status, DtoStatus::Success);
            }
        });
        p.s.recv(&sbuf, 0, 64, 0);
        let round = |i| {
            p.c.recv(&cbuf, 0, 64, i);
            p.c.send(&csrc, 0, 64, i);
            assert_eq!(next_dto(&p.c.rcv).status, DtoStatus::Success);
            assert_eq!(next_dto(&p.c.req).status, DtoStatus::Success);
        };
        (0..WARM).for_each(round);
        // Blocks (nothing comes): the input goes back to the thread.
        let r = p.c.rcv.wait(Some(std::time::Duration::from_millis(2)), 1);
        assert!(matches!(r, Err(Error::TimeoutExpired { .. })), "{r:?}");
        (WARM..2 * WARM).for_each(round);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let w0 = tcp.socket_writes();
        (2 * WARM..2 * WARM + ROUNDS).for_each(round);
        tcp.socket_writes() - w0
    });
    eprintln!("{writes} writes for {ROUNDS} round trips");
    // Two a round trip when every answer rides with a reply (up to four
    // when none does); a few spare for the thread's check of a held
    // answer, which may come before the reply.
    assert!(
        writes <= 2 * ROUNDS + ROUNDS / 30,
        "{writes} writes for {ROUNDS} round trips of spinning waiters"
    );
}
