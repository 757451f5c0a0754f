//! A consumer that switches between polling and waiting at random moments
//! on one EVD that several connections feed, with one message in flight
//! on each or on one of them at a time, under a provider whose thread
//! would leave a polled connection's input alone for an hour: every echo
//! arrives, whole and in order per connection, and no wait outlasts the
//! bound `T`. A wait that did not tell the provider it stopped polling
//! (its park) would see nothing for the hour: without fences nothing else
//! brings the thread back to that input (with them, the answer the pass
//! held back does within a few milliseconds). Each run's seed is printed
//! on failure; `SWITCHING_SEED` replays one.
//!
//! The other side of the same hand-over: Sends that arrive before their
//! receives, which a thread other than the waiting one posts at random
//! moments, all get in.

mod common;

use common::*;
use rdapl::*;
use rdapl_tcp::{Tcp, TcpConfig};
use std::time::{Duration, Instant};

const CONNS: usize = 4;
const MSG: usize = 256;
/// How long the consumer runs.
const RUN: Duration = Duration::from_secs(2);

/// One side: an IA whose endpoints all complete into one DTO EVD.
struct Side {
    ia: Ia,
    pz: Pz,
    evd: Evd,
    conn: Evd,
    cr: Evd,
    eps: Vec<Ep>,
}

impl Side {
    fn new(tcp: &std::sync::Arc<Tcp>, addr: &str, params: &str) -> Side {
        let ia = ia(tcp, addr, params);
        let pz = ia.pz_create().unwrap();
        let evd = ia.evd_create(1024, EvdFlags::DTO).unwrap();
        let conn = ia.evd_create(64, EvdFlags::CONNECTION).unwrap();
        let cr = ia.evd_create(64, EvdFlags::CR).unwrap();
        let eps = (0..CONNS)
            .map(|_| {
                ia.ep_create(&pz, Some(&evd), Some(&evd), Some(&conn), None)
                    .unwrap()
            })
            .collect();
        Side {
            ia,
            pz,
            evd,
            conn,
            cr,
            eps,
        }
    }
}

/// The client's messages: how many each connection sent, whether one is
/// in flight, and its length.
#[derive(Default)]
struct Flights {
    sent: [u64; CONNS],
    busy: [bool; CONNS],
    expect: [u64; CONNS],
}

impl Flights {
    /// Sends connection `k`'s next message, of a random length.
    fn start(&mut self, k: usize, rng: &mut Rng, send: &dyn Fn(usize, u64, u64)) {
        self.expect[k] = 1 + rng.below(MSG as u64);
        send(k, self.sent[k], self.expect[k]);
        self.busy[k] = true;
    }
}

/// The next DTO completion of `evd`, either polled for up to `spin` then
/// waited for, or waited for at once; a wait past `T` is a stall.
fn next(evd: &Evd, spin: Duration, seed: u64, what: &str) -> DtoCompletion {
    let until = Instant::now() + spin;
    let ev = loop {
        if let Some(ev) = evd.dequeue().unwrap() {
            break ev;
        }
        if Instant::now() >= until {
            match evd.wait(Some(T), 1) {
                Ok((ev, _)) => break ev,
                Err(e) => panic!("seed {seed}: {what}: no completion within {T:?} ({e:?})"),
            }
        }
    };
    match ev {
        Event::Dto(d) => {
            assert_eq!(d.status, DtoStatus::Success, "seed {seed}: {what}: {d:?}");
            d
        }
        e => panic!("seed {seed}: {what}: {e:?}"),
    }
}

/// With fences (`placed`): every echo arrives whole and in order.
#[test]
fn switching_between_polling_and_waiting_loses_nothing() {
    switching(("127.0.225.1", "127.0.225.2"), "");
}

/// Without fences (`sent`) no answer is held back for a reply, so nothing
/// but the park hands a polled connection's input back to the thread: a
/// wait that did not park would go without its completion (a `park` that
/// returned at once failed this test; the one above passed).
#[test]
fn switching_without_fences_loses_nothing() {
    switching(("127.0.225.3", "127.0.225.4"), "complete=sent");
}

fn switching((client, server): (&str, &str), params: &str) {
    let seed = seed_from("SWITCHING_SEED");
    let mut rng = Rng(seed);
    let patient = Tcp::with_config(TcpConfig {
        poll_fresh_ms: 3_600_000,
        ..Default::default()
    });
    let c = Side::new(&patient, client, params);
    let s = Side::new(&Tcp::new(), server, params);
    let (_psp, q) = listen(&s.ia, &s.cr);
    let (sbuf, cbuf) = (
        s.pz.lmr_create(Region::zeroed(CONNS * MSG), MemPriv::ALL)
            .unwrap(),
        c.pz.lmr_create(Region::zeroed(CONNS * MSG), MemPriv::ALL)
            .unwrap(),
    );
    let part = |k: usize| (k * MSG) as u64;
    for k in 0..CONNS {
        let t = [sbuf.triplet(part(k), MSG as u64).unwrap()];
        s.eps[k].post_recv(&t, k as u64, D).unwrap();
        let t = [cbuf.triplet(part(k), MSG as u64).unwrap()];
        c.eps[k].post_recv(&t, k as u64, D).unwrap();
        c.eps[k]
            .connect(s.ia.address(), q, Some(T), &[k as u8])
            .unwrap();
        let cr = next_cr(&s.ia, &s.cr);
        let j = usize::from(cr.private_data()[0]);
        cr.accept(&s.eps[j], b"").unwrap();
        assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Established);
        assert_eq!(conn_kind(&c.conn), ConnectionEventKind::Established);
    }
    // The server echoes each message on the connection it came by, and
    // reposts its receive first. It stops on a zero-length message.
    let server = std::thread::spawn(move || {
        let mut done = 0;
        while done < CONNS {
            let d = match s.evd.wait(Some(T), 1) {
                Ok((Event::Dto(d), _)) => d,
                other => panic!("server: {other:?}"),
            };
            assert_eq!(d.status, DtoStatus::Success, "server: {d:?}");
            if d.operation != DtoOp::Receive {
                continue;
            }
            let k = d.cookie as usize;
            let len = d.transferred_length;
            if len == 0 {
                done += 1;
                continue;
            }
            let t = [sbuf.triplet(part(k), MSG as u64).unwrap()];
            s.eps[k].post_recv(&t, k as u64, D).unwrap();
            let t = [sbuf.triplet(part(k), len).unwrap()];
            s.eps[k].post_send(&t, 1000 + k as u64, D).unwrap();
        }
        s
    });
    // The client keeps one message in flight on every connection, or on
    // one connection at a time (a random one), switching every few dozen
    // echoes: with one in flight each wait depends on one connection
    // alone. The first byte of a message counts its connection's
    // messages, the rest is a pattern of both.
    let srcs: Vec<Lmr> = (0..CONNS)
        .map(|_| c.pz.lmr_create(Region::zeroed(MSG), MemPriv::ALL).unwrap())
        .collect();
    // Message `n` of connection `k`, of `len` bytes.
    let send = |k: usize, n: u64, len: u64| {
        let mut m = pattern(len as usize, k as u8);
        m[0] = n as u8;
        srcs[k].write_at(0, &m).unwrap();
        let t = [srcs[k].triplet(0, len).unwrap()];
        c.eps[k].post_send(&t, 1000 + k as u64, D).unwrap();
    };
    let mut f = Flights::default();
    for k in 0..CONNS {
        f.start(k, &mut rng, &send);
    }
    let end = Instant::now() + RUN;
    let (mut echoes, mut all) = (0u64, true);
    while Instant::now() < end {
        // Poll for up to 300 µs, or wait at once (a third of the time).
        let spin = match rng.below(3) {
            0 => Duration::ZERO,
            _ => Duration::from_micros(rng.below(300)),
        };
        let d = next(&c.evd, spin, seed, "client");
        if d.operation != DtoOp::Receive {
            continue;
        }
        let k = d.cookie as usize;
        assert!(f.busy[k], "seed {seed}: an echo on {k} with nothing sent");
        let len = f.expect[k];
        assert_eq!(d.transferred_length, len, "seed {seed}: echo on {k}");
        let mut want = pattern(len as usize, k as u8);
        want[0] = f.sent[k] as u8;
        let got = cbuf.to_vec().unwrap()[part(k) as usize..][..len as usize].to_vec();
        assert_eq!(got, want, "seed {seed}: echo {} on {k}", f.sent[k]);
        echoes += 1;
        f.busy[k] = false;
        f.sent[k] += 1;
        let t = [cbuf.triplet(part(k), MSG as u64).unwrap()];
        c.eps[k].post_recv(&t, k as u64, D).unwrap();
        if rng.below(40) == 0 {
            all = !all;
        }
        if all {
            for j in 0..CONNS {
                if !f.busy[j] {
                    f.start(j, &mut rng, &send);
                }
            }
        } else if !f.busy.iter().any(|&b| b) {
            let j = rng.below(CONNS as u64) as usize;
            f.start(j, &mut rng, &send);
        }
    }
    // The last echoes, then a zero-length message on each connection
    // tells the server to stop.
    while f.busy.iter().any(|&b| b) {
        let d = next(&c.evd, Duration::ZERO, seed, "client, draining");
        if d.operation == DtoOp::Receive {
            f.busy[d.cookie as usize] = false;
        }
    }
    for (k, ep) in c.eps.iter().enumerate() {
        ep.post_send(&[], 2000 + k as u64, D).unwrap();
    }
    let s = server.join().unwrap();
    assert!(echoes >= CONNS as u64, "seed {seed}: {echoes} echoes");
    drop(s);
}

/// Sends that arrive before their receive wait for it, and a receive
/// posted by a thread other than the one waiting for its completion must
/// wake the connection (the waiter has handed its input to the provider's
/// thread, which stops reading a socket whose Send waits for a receive):
/// a receive that did not would leave the Send waiting until
/// `recv_wait_ms`, then break the connection. A sender keeps four Sends
/// of random lengths in flight; one server thread posts receives at most
/// two ahead, at random moments, while another waits for their
/// completions and checks every byte.
#[test]
fn receives_posted_late_by_another_thread_let_every_send_in() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const SLOTS: u64 = 16;
    let seed = seed_from("SWITCHING_SEED");
    let tcp = Tcp::new();
    // The default timeout: a sender completing once sent runs far ahead
    // of this receiver, whose window may stay closed a while.
    let p = Pair::connected(&tcp, "127.0.225.5", "127.0.225.6", "timeout_ms=10000");
    let rbuf = p.s.buf(SLOTS as usize * MSG);
    let received = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let ep = p.s.ep.clone();
    let poster = late_poster(
        move |t, n| ep.post_recv(t, n, D).unwrap(),
        (rbuf.clone(), SLOTS, MSG as u64),
        (received.clone(), 2),
        stop.clone(),
        (seed, T),
    );
    let waiter = {
        let (evd, rbuf, received) = (p.s.rcv.clone(), rbuf.clone(), received.clone());
        std::thread::spawn(move || {
            let mut lens = Vec::new();
            loop {
                let d = match evd.wait(Some(T), 1) {
                    Ok((Event::Dto(d), _)) => d,
                    other => panic!("seed {seed}: the receiver got {other:?}"),
                };
                let i = received.load(Ordering::Relaxed);
                assert_eq!(
                    (d.cookie, d.status),
                    (i, DtoStatus::Success),
                    "seed {seed}: receive {i}"
                );
                let len = d.transferred_length as usize;
                if len == 0 {
                    return lens;
                }
                let off = ((i % SLOTS) as usize) * MSG;
                let got = rbuf.to_vec().unwrap()[off..off + len].to_vec();
                let mut want = pattern(len, i as u8);
                want[..8.min(len)].copy_from_slice(&i.to_le_bytes()[..8.min(len)]);
                assert_eq!(got, want, "seed {seed}: message {i}");
                lens.push(len);
                received.store(i + 1, Ordering::Release);
            }
        })
    };
    // The sender: four in flight, random lengths, for a second or
    // `MOST` messages. (Completing once sent, it would send some 30,000
    // in a second, into the socket buffers; the receiver, with a pause of
    // up to 200 µs before each receive, would need longer than `T` to
    // take them under load.)
    const MOST: u64 = 6_000;
    let src = p.c.buf(SLOTS as usize * MSG);
    let mut rng = Rng(seed);
    let (mut sent, mut done) = (0u64, 0u64);
    let end = Instant::now() + Duration::from_secs(1);
    let more = |sent: u64| Instant::now() < end && sent < MOST;
    while more(sent) || done < sent {
        if sent < done + 4 && more(sent) {
            let len = 1 + rng.below(MSG as u64) as usize;
            let mut m = pattern(len, sent as u8);
            m[..8.min(len)].copy_from_slice(&sent.to_le_bytes()[..8.min(len)]);
            let off = (sent % SLOTS) * MSG as u64;
            src.write_at(off as usize, &m).unwrap();
            p.c.send(&src, off, len as u64, sent);
            sent += 1;
        } else {
            let d = next_dto(&p.c.req);
            assert_eq!(
                (d.cookie, d.status),
                (done, DtoStatus::Success),
                "seed {seed}"
            );
            done += 1;
        }
    }
    // A zero-length Send ends the waiter.
    p.c.ep.post_send(&[], sent, D).unwrap();
    assert_eq!(next_dto(&p.c.req).status, DtoStatus::Success);
    let lens = waiter.join().unwrap();
    stop.store(true, Ordering::Release);
    poster.join().unwrap();
    assert_eq!(lens.len() as u64, sent, "seed {seed}");
}
