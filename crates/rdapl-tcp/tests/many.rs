//! Load and liveness: 100 connections at once, each moving data both
//! ways with every byte checked; an idle provider does not spin; the
//! progress thread's work follows the connections that move, not how many
//! are idle beside them, and so does a consumer's pass over EVDs that
//! many connections share.

mod common;

use common::*;
use rdapl::*;
use rdapl_tcp::Tcp;
use std::collections::HashMap;

#[test]
fn a_hundred_connections_at_once_move_every_byte() {
    at_once(100, "127.0.30.1", "127.0.30.2", next_dto);
}

/// More ready sockets than one pass's readiness check names (two ends of
/// 300 connections in this process), the consumers polling: the passes
/// take them in turn.
#[test]
fn three_hundred_polled_connections_move_every_byte() {
    at_once(300, "127.0.36.1", "127.0.36.2", poll_dto);
}

/// A ping-pong whose consumers busy-poll: the thread's checks of the two
/// polled connections (every `HOLD_MS`) find them locked by the polling
/// thread much of the time, and leave them then rather than wait (a wait
/// makes the consumer wake the thread as it lets go, on its own path).
#[test]
fn the_thread_does_not_wait_for_a_polled_connection() {
    let tcp = Tcp::new();
    let p = Pair::connected(&tcp, "127.0.38.1", "127.0.38.2", "");
    let (sbuf, cbuf) = (p.s.buf(64), p.c.buf(64));
    let (ssrc, csrc) = (p.s.lmr(vec![7; 64]), p.c.lmr(vec![9; 64]));
    let run = |rounds: std::ops::Range<u64>| {
        for i in rounds {
            round_trip(&p, (&sbuf, &cbuf), (&ssrc, &csrc), 64, i, poll_dto);
        }
    };
    // Polling from here on (the first passes hand the input over).
    run(0..100);
    let (w0, l0) = (tcp.polled_waits(), tcp.thread_looks());
    let start = std::time::Instant::now();
    let mut i = 100;
    while start.elapsed() < std::time::Duration::from_millis(400) {
        run(i..i + 100);
        i += 100;
    }
    let (w, l) = (tcp.polled_waits() - w0, tcp.thread_looks() - l0);
    // The thread looked (found them free, or handed input back where one
    // end went unpolled for longer than `poll_fresh_ms`); a check of a
    // polled connection that found it locked waited only where its
    // freshness had just run out: a poller kept off its CPU that long
    // holding the lock (0-6 in 20 runs beside a clean clone's CI build;
    // the thread that always waited did 72 and 120).
    assert!(l > 0, "the thread never looked at the connections");
    assert!(
        w <= 20,
        "{w} checks of polled connections waited for the lock ({l} looks, {i} round trips)"
    );
}

/// `n` connections between two nodes, on the nodes' EVDs, connected at
/// once; each client sends 64 KiB, each server end sends it back; every
/// byte and completion checked, completions taken by `next`.
fn at_once(n: usize, client: &str, server: &str, next: fn(&Evd) -> DtoCompletion) {
    const LEN: usize = 64 << 10;
    // Two sockets a connection, and this file's other tests at once.
    descriptors_for(4 * n as u64 + 256);
    let tcp = Tcp::new();
    let s = Node::with(common::ia(&tcp, server, ""), 4096);
    let c = Node::with(common::ia(&tcp, client, ""), 4096);
    let (_psp, q) = listen(&s.ia, &s.cr);
    let sbufs: Vec<Lmr> = (0..n).map(|_| s.buf(LEN)).collect();
    let cbufs: Vec<Lmr> = (0..n).map(|_| c.buf(LEN)).collect();
    let srcs: Vec<Lmr> = (0..n).map(|i| c.lmr(pattern(LEN, i as u8))).collect();
    // Every client endpoint connects at once, its index in the private data.
    let ceps: Vec<Ep> = (0..n).map(|_| c.ep2()).collect();
    for (i, ep) in ceps.iter().enumerate() {
        ep.post_recv(&[cbufs[i].triplet(0, LEN as u64).unwrap()], i as u64, D)
            .unwrap();
        ep.connect(s.ia.address(), q, Some(T), &(i as u32).to_be_bytes())
            .unwrap();
    }
    let mut seps: HashMap<usize, Ep> = HashMap::new();
    for _ in 0..n {
        let cr = next_cr(&s.ia, &s.cr);
        let i = u32::from_be_bytes(cr.private_data().try_into().unwrap()) as usize;
        let ep = s.ep2();
        ep.post_recv(&[sbufs[i].triplet(0, LEN as u64).unwrap()], i as u64, D)
            .unwrap();
        cr.accept(&ep, b"").unwrap();
        assert!(seps.insert(i, ep).is_none());
    }
    for _ in 0..n {
        assert_eq!(conn_kind(&c.conn), ConnectionEventKind::Established);
    }
    for _ in 0..n {
        assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Established);
    }
    // Each client sends its pattern; each server endpoint sends it back.
    for (i, ep) in ceps.iter().enumerate() {
        ep.post_send(
            &[srcs[i].triplet(0, LEN as u64).unwrap()],
            1000 + i as u64,
            D,
        )
        .unwrap();
    }
    for _ in 0..n {
        let r = next(&s.rcv);
        assert_eq!(
            (r.status, r.transferred_length),
            (DtoStatus::Success, LEN as u64)
        );
        let i = r.cookie as usize;
        assert!(
            sbufs[i].to_vec().unwrap() == pattern(LEN, i as u8),
            "server {i}"
        );
        seps[&i]
            .post_send(
                &[sbufs[i].triplet(0, LEN as u64).unwrap()],
                2000 + i as u64,
                D,
            )
            .unwrap();
    }
    let mut back = vec![false; n];
    for _ in 0..n {
        let r = next(&c.rcv);
        assert_eq!(
            (r.status, r.transferred_length),
            (DtoStatus::Success, LEN as u64)
        );
        let i = r.cookie as usize;
        assert!(
            cbufs[i].to_vec().unwrap() == pattern(LEN, i as u8),
            "client {i}"
        );
        back[i] = true;
    }
    assert!(back.iter().all(|&b| b));
    let mut done = vec![0; n];
    let mut sent = vec![0; n];
    for _ in 0..n {
        let d = next(&c.req);
        assert_eq!(d.status, DtoStatus::Success);
        sent[d.cookie as usize - 1000] += 1;
    }
    assert!(sent.iter().all(|&n| n == 1));
    for _ in 0..n {
        let d = next(&s.req);
        assert_eq!(d.status, DtoStatus::Success);
        done[d.cookie as usize - 2000] += 1;
    }
    assert!(done.iter().all(|&n| n == 1));
}

#[test]
fn an_idle_provider_does_not_spin() {
    let tcp = Tcp::new();
    // The default timeout: no heartbeat falls in the half second watched.
    let p = Pair::connected(&tcp, "127.0.31.1", "127.0.31.2", "timeout_ms=10000");
    let rbuf = p.s.buf(16);
    p.s.recv(&rbuf, 0, 16, 1);
    // Past the connection's start-up timers: the active side nudges a
    // silent peer with zero-length Writes 50, 250 and 1050 ms after the
    // MPA Reply (rdapl-iwarp's `rtr_nudge_ms`, for siw), then stops.
    std::thread::sleep(std::time::Duration::from_millis(1_500));
    let before = tcp.wakeups();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let idle = tcp.wakeups() - before;
    // Connected, a receive posted, nothing moving: no timer runs, so
    // the thread sleeps (a spinning loop would wake thousands of times).
    assert!(idle <= 3, "{idle} wake-ups while idle");
    let src = p.c.lmr(vec![4; 16]);
    p.c.send(&src, 0, 16, 2);
    assert_eq!(next_dto(&p.s.rcv).status, DtoStatus::Success);
    assert_eq!(next_dto(&p.c.req).status, DtoStatus::Success);
}

/// `n` connections between a client node at `client` and a server node at
/// `server`, every end on its node's EVDs: (server, client, the server
/// ends, the client ends), the ends in the order of their connects.
fn connected_on_shared_evds(
    tcp: &std::sync::Arc<Tcp>,
    client: &str,
    server: &str,
    n: usize,
    server_params: &str,
) -> (Node, Node, Psp, Vec<Ep>, Vec<Ep>) {
    let s = Node::with(common::ia(tcp, server, server_params), 1024);
    let c = Node::with(common::ia(tcp, client, ""), 1024);
    let (psp, q) = listen(&s.ia, &s.cr);
    let ceps: Vec<Ep> = (0..n).map(|_| c.ep2()).collect();
    for ep in &ceps {
        ep.connect(s.ia.address(), q, Some(T), b"").unwrap();
    }
    let mut seps = Vec::new();
    for _ in 0..n {
        let ep = s.ep2();
        next_cr(&s.ia, &s.cr).accept(&ep, b"").unwrap();
        seps.push(ep);
    }
    for _ in 0..n {
        assert_eq!(conn_kind(&c.conn), ConnectionEventKind::Established);
        assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Established);
    }
    (s, c, psp, seps, ceps)
}

#[test]
fn the_thread_leaves_idle_connections_alone() {
    const IDLE: usize = 100;
    const ROUNDS: u64 = 200;
    let tcp = Tcp::new();
    let (_s, _c, _psp, seps, ceps) =
        connected_on_shared_evds(&tcp, "127.0.32.1", "127.0.32.2", IDLE, "");
    // One busy pair beside them, its consumers waiting (not polling), so
    // that the thread carries much of its input.
    let p = Pair::connected(&tcp, "127.0.32.3", "127.0.32.4", "");
    let (sbuf, cbuf) = (p.s.buf(64), p.c.buf(64));
    let (ssrc, csrc) = (p.s.lmr(vec![7; 64]), p.c.lmr(vec![9; 64]));
    // Past the start-up timers of every connection (the active sides'
    // nudges end 1050 ms after the MPA Reply).
    std::thread::sleep(std::time::Duration::from_millis(1_300));
    let (w0, l0) = (tcp.wakeups(), tcp.thread_looks());
    for i in 0..ROUNDS {
        round_trip(&p, (&sbuf, &cbuf), (&ssrc, &csrc), 64, i, next_dto);
    }
    let (w, l) = (tcp.wakeups() - w0, tcp.thread_looks() - l0);
    // Each wake-up looks at the few connections it was for (the busy
    // pair's two ends, each about three times: its readiness, its maps,
    // its timers and interest): a walk over every connection would lock
    // the 200 idle ends each time.
    assert!(
        l <= 10 * w + 32,
        "{l} connection locks in {w} wake-ups beside {} idle connections",
        2 * IDLE
    );
    drop((ceps, seps));
}

/// The connections whose input the thread leaves to a polling consumer
/// are looked at when their hold or freshness runs out (every
/// `HOLD_MS`), not at every wake-up of the thread: beside a hundred
/// polled connections, a pair whose consumers wait (every message through
/// the thread) costs the thread the locks of that pair.
#[test]
fn the_thread_looks_at_polled_connections_when_due_only() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const POLLED: usize = 100;
    const ROUNDS: u64 = 200;
    let tcp = Tcp::new();
    // The server's consumer stays fresh for a minute after each pass.
    let (s, c, _psp, seps, ceps) = connected_on_shared_evds(
        &tcp,
        "127.0.228.1",
        "127.0.228.2",
        POLLED,
        "poll_fresh_ms=60000",
    );
    let (sbuf, cbuf) = (s.buf(64), c.buf(64));
    let csrc = c.lmr(vec![9; 64]);
    let t = |l: &Lmr| [l.triplet(0, 64).unwrap()];
    for (i, ep) in seps.iter().enumerate() {
        ep.post_recv(&t(&sbuf), i as u64, D).unwrap();
    }
    // The server's consumer polls its receive EVD from here on, a pass
    // every millisecond or so: every connection's input, once it came, is
    // left to it, and so the thread leaves it each connection as it sees
    // its input come.
    let stop = Arc::new(AtomicBool::new(false));
    let got = Arc::new(AtomicU64::new(0));
    let poller = {
        let (rcv, stop, got) = (s.rcv.clone(), stop.clone(), got.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match rcv.dequeue().unwrap() {
                    Some(Event::Dto(d)) => {
                        assert_eq!(d.status, DtoStatus::Success);
                        got.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(e) => panic!("{e:?}"),
                    None => std::thread::sleep(std::time::Duration::from_millis(1)),
                }
            }
        })
    };
    for (i, ep) in ceps.iter().enumerate() {
        ep.post_recv(&t(&cbuf), i as u64, D).unwrap();
        ep.post_send(&t(&csrc), i as u64, D).unwrap();
    }
    for _ in 0..POLLED {
        assert_eq!(next_dto(&c.req).status, DtoStatus::Success);
    }
    let end = std::time::Instant::now() + T;
    while got.load(Ordering::Relaxed) < POLLED as u64 {
        assert!(std::time::Instant::now() < end, "the polled receives");
        std::thread::yield_now();
    }
    // A pair whose consumers wait without spinning: the thread takes in
    // every message of it.
    let p = Pair::connected(&tcp, "127.0.228.3", "127.0.228.4", "wait_spin_us=0");
    let (pb, pc) = (p.s.buf(64), p.c.buf(64));
    let (ps, pcs) = (p.s.lmr(vec![7; 64]), p.c.lmr(vec![9; 64]));
    let (w0, l0) = (tcp.wakeups(), tcp.thread_looks());
    let start = std::time::Instant::now();
    for i in 0..ROUNDS {
        round_trip(&p, (&pb, &pc), (&ps, &pcs), 64, i, next_dto);
    }
    let ms = start.elapsed().as_millis() as u64;
    let (w, l) = (tcp.wakeups() - w0, tcp.thread_looks() - l0);
    stop.store(true, Ordering::Relaxed);
    poller.join().unwrap();
    // The pair's ends, a few locks a wake-up, and each polled connection
    // once every HOLD_MS (and once more at either end of the run).
    let due = (ms / rdapl_tcp::progress::HOLD_MS + 2) * POLLED as u64;
    assert!(
        w >= ROUNDS,
        "{w} wake-ups: the pair's messages went past the thread"
    );
    assert!(
        l <= 10 * w + 32 + due,
        "{l} connection locks in {w} wake-ups and {ms} ms beside {POLLED} polled connections"
    );
    drop((ceps, seps));
}

#[test]
fn a_pass_over_shared_evds_skips_idle_connections() {
    const IDLE: usize = 50;
    const ROUNDS: u64 = 200;
    let tcp = Tcp::new();
    // The first client end moves data, the others are idle.
    let (s, c, _psp, seps, ceps) =
        connected_on_shared_evds(&tcp, "127.0.34.1", "127.0.34.2", IDLE + 1, "");
    // Which server end is the first client's: the one its first message
    // reaches.
    let (sbuf, cbuf) = (s.buf(64), c.buf(64));
    let (ssrc, csrc) = (s.lmr(vec![7; 64]), c.lmr(vec![9; 64]));
    let t = |l: &Lmr| [l.triplet(0, 64).unwrap()];
    for (i, ep) in seps.iter().enumerate() {
        ep.post_recv(&t(&sbuf), i as u64, D).unwrap();
    }
    let poll = poll_dto;
    // A member is pumped once in the first pass after it joins (input may
    // have come before): that pass is set-up, not counted. Each empty
    // dequeue makes one.
    for evd in [&s.rcv, &s.req, &c.rcv, &c.req] {
        assert!(evd.dequeue().unwrap().is_none());
    }
    let (p0, k0) = tcp.pass_counts();
    let n0 = tcp.passes();
    for i in 0..ROUNDS {
        ceps[0].post_recv(&t(&cbuf), i, D).unwrap();
        ceps[0].post_send(&t(&csrc), i, D).unwrap();
        let r = poll(&s.rcv);
        assert_eq!(r.status, DtoStatus::Success);
        let sep = &seps[r.cookie as usize];
        sep.post_recv(&t(&sbuf), r.cookie, D).unwrap();
        sep.post_send(&t(&ssrc), i, D).unwrap();
        assert_eq!(poll(&c.rcv).status, DtoStatus::Success);
        assert_eq!(poll(&c.req).status, DtoStatus::Success);
        assert_eq!(poll(&s.req).status, DtoStatus::Success);
    }
    let (pumps, skips) = (tcp.pass_counts().0 - p0, tcp.pass_counts().1 - k0);
    let passes = tcp.passes() - n0;
    // A pass over the IDLE + 1 connections of an EVD pumps the busy one
    // (and an idle one now and then) and leaves the rest alone: a `recv`
    // each would pump them all.
    assert!(
        skips >= 10 * pumps,
        "{pumps} pumps and {skips} skips in passes over {} connections",
        IDLE + 1
    );
    // One hook per EVD, not per connection: each pass covers all of them
    // (pumped or left alone) and pumps only a few.
    assert!(
        pumps + skips >= IDLE as u64 * passes && pumps <= 3 * passes,
        "{passes} passes: {pumps} pumps, {skips} left alone, over {} connections",
        IDLE + 1
    );
    drop((ceps, seps));
}

/// Raises this process's soft limit of open files to its hard limit (a
/// user's soft limit is often 1024, root's higher) and fails, saying so,
/// if that is still below `need`.
fn descriptors_for(need: u64) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let lim = getrlimit(Resource::Nofile);
    if lim.current.is_some_and(|c| c < need) {
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: lim.maximum,
                maximum: lim.maximum,
            },
        );
    }
    let now = getrlimit(Resource::Nofile).current;
    assert!(
        now.is_none_or(|c| c >= need),
        "this test needs {need} open files and the hard limit allows {now:?} (ulimit -Hn)"
    );
}

/// A connection whose consumer refills a stream of RDMA Writes as fast as
/// they complete (`complete=sent`, no spin: the provider's thread does the
/// pumping) while the socket takes every byte does not keep its
/// provider's thread: connections set up meanwhile on the same provider
/// (the thread's work) are established within half a second each, ten
/// times in a row, and the stream goes on.
#[test]
fn a_stream_refilled_as_fast_as_it_completes_does_not_keep_the_thread() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    let params = "complete=sent wait_spin_us=0";
    let (tc, ts, p) = Pair::apart("127.0.45.1", "127.0.45.2", params);
    let target = p.s.buf(1 << 20);
    let whole = target.rmr_triplet(0, 1 << 20).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let streamer = {
        let stop = stop.clone();
        let c = p.c;
        std::thread::spawn(move || {
            let src = c.lmr(pattern(1 << 16, 1));
            let (mut posted, mut done) = (0u64, 0u64);
            let end = Instant::now() + T;
            while !stop.load(Ordering::Relaxed) {
                assert!(Instant::now() < end, "the stream never stopped");
                while posted - done < 64 {
                    let at = RmrTriplet {
                        target_address: whole.target_address + (posted % 16) * (1 << 16),
                        segment_length: 1 << 16,
                        ..whole
                    };
                    c.ep.post_rdma_write(&[src.triplet(0, 1 << 16).unwrap()], at, posted, D)
                        .unwrap();
                    posted += 1;
                }
                if let Ok((Event::Dto(d), _)) = c.req.wait(Some(Duration::from_millis(20)), 1) {
                    assert_eq!((d.cookie, d.status), (done, DtoStatus::Success));
                    done += 1;
                }
            }
            done
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let mut took = Vec::new();
    for i in 0..10u8 {
        let t0 = Instant::now();
        let b = Pair::new(
            Node::new(&tc, "127.0.45.3", params),
            Node::new(&ts, "127.0.45.4", params),
        );
        b.connect();
        took.push(t0.elapsed());
        b.c.ep.disconnect(true).unwrap();
        b.expect_end(ConnectionEventKind::Disconnected);
        assert!(
            took[i as usize] < Duration::from_millis(500),
            "set-up {i} took {took:?} beside the stream"
        );
    }
    stop.store(true, Ordering::Relaxed);
    let done = streamer.join().unwrap();
    assert!(done > 0, "the stream moved");
}
