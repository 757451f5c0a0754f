//! Shared receive queues over TCP: a receive posted to an SRQ lets in the
//! Sends that wait for one on any of its endpoints, and costs the
//! provider's thread nothing while none waits.

mod common;

use common::*;
use rdapl::*;
use rdapl_tcp::Tcp;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const MSG: usize = 256;
const SLOTS: u64 = 16;

/// A server IA whose `eps` take their receives from one SRQ and complete
/// into one EVD, listening; and a client IA with as many endpoints,
/// connected to them.
struct Setup {
    tcp: Arc<Tcp>,
    s_ia: Ia,
    s_pz: Pz,
    srq: Srq,
    s_rcv: Evd,
    s_eps: Vec<Ep>,
    c: Vec<Node>,
}

fn setup(n: usize, (client, server): (&str, &str), srq_len: usize) -> Setup {
    let tcp = Tcp::new();
    // A Send that waits for a receive waits a minute before it is refused
    // (the client's silence bound above it): a post that did not let it in
    // shows as a wait of the bound `T`, not as a late success.
    let s_ia = ia(&tcp, server, "recv_wait_ms=60000");
    let s_pz = s_ia.pz_create().unwrap();
    let srq = s_ia.srq_create(&s_pz, srq_len, 1).unwrap();
    let s_rcv = s_ia.evd_create(srq_len + 64, EvdFlags::DTO).unwrap();
    let s_req = s_ia.evd_create(64, EvdFlags::DTO).unwrap();
    let s_conn = s_ia.evd_create(64, EvdFlags::CONNECTION).unwrap();
    let s_cr = s_ia.evd_create(64, EvdFlags::CR).unwrap();
    let s_eps: Vec<Ep> = (0..n)
        .map(|_| {
            s_ia.ep_create_with_srq(&s_pz, &s_rcv, Some(&s_req), Some(&s_conn), &srq, None)
                .unwrap()
        })
        .collect();
    let (_psp, q) = listen(&s_ia, &s_cr);
    let c: Vec<Node> = (0..n)
        .map(|k| {
            let node = Node::with(ia(&tcp, client, "timeout_ms=120000"), 64);
            node.ep
                .connect(s_ia.address(), q, Some(T), &[k as u8])
                .unwrap();
            let cr = next_cr(&s_ia, &s_cr);
            let j = usize::from(cr.private_data()[0]);
            cr.accept(&s_eps[j], b"").unwrap();
            assert_eq!(conn_kind(&s_conn), ConnectionEventKind::Established);
            assert_eq!(conn_kind(&node.conn), ConnectionEventKind::Established);
            node
        })
        .collect();
    Setup {
        tcp,
        s_ia,
        s_pz,
        srq,
        s_rcv,
        s_eps,
        c,
    }
}

/// Message `n` of client `k`, `len` bytes: its first two bytes name it.
fn message(k: usize, n: u64, len: usize) -> Vec<u8> {
    let mut m = pattern(len, (n as u8) ^ ((k as u8) << 4));
    m[0] = k as u8;
    if len > 1 {
        m[1] = n as u8;
    }
    m
}

/// Two clients keep two Sends each in flight to two endpoints of one
/// SRQ, for a second. The SRQ gets its receives from a thread that never
/// waits, at most two ahead of those consumed and at random moments, so
/// Sends often arrive first; another thread waits for the receives'
/// completions. A receive posted to the SRQ must let a waiting Send in: one
/// that did not would leave it waiting until `recv_wait_ms`, then break
/// the connection (`ReceiverNotReady`). Every byte is checked, and each
/// client's messages arrive in its order. `SRQ_SEED` replays a run.
#[test]
fn srq_receives_posted_late_let_every_send_in() {
    const N: usize = 2;
    let seed = seed_from("SRQ_SEED");
    let st = setup(N, ("127.0.226.1", "127.0.226.2"), SLOTS as usize);
    let rbuf = st
        .s_pz
        .lmr_create(Region::zeroed(SLOTS as usize * MSG), MemPriv::ALL)
        .unwrap();
    let consumed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let srq = st.srq.clone();
    let poster = late_poster(
        move |t, n| srq.post_recv(t, n, D).unwrap(),
        (rbuf.clone(), SLOTS, MSG as u64),
        (consumed.clone(), 2),
        stop.clone(),
        (seed, 4 * T),
    );
    let waiter = {
        let (evd, rbuf, consumed) = (st.s_rcv.clone(), rbuf.clone(), consumed.clone());
        std::thread::spawn(move || {
            let mut next = [0u64; N];
            let mut ended = 0;
            while ended < N {
                let d = match evd.wait(Some(T), 1) {
                    Ok((Event::Dto(d), _)) => d,
                    other => panic!("seed {seed}: the server got {other:?}"),
                };
                assert_eq!(d.status, DtoStatus::Success, "seed {seed}: {d:?}");
                let len = d.transferred_length as usize;
                let off = ((d.cookie % SLOTS) as usize) * MSG;
                let got = rbuf.to_vec().unwrap()[off..off + len].to_vec();
                consumed.fetch_add(1, Ordering::AcqRel);
                if len == 1 {
                    ended += 1;
                    continue;
                }
                let k = usize::from(got[0]);
                assert!(k < N, "seed {seed}: {got:?}");
                assert_eq!(got, message(k, next[k], len), "seed {seed}: client {k}");
                next[k] += 1;
            }
            next
        })
    };
    let srcs: Vec<Lmr> = st.c.iter().map(|c| c.buf(2 * MSG)).collect();
    let mut sent = [0u64; N];
    let mut done = [0u64; N];
    let mut rng = Rng(seed);
    let end = Instant::now() + Duration::from_secs(1);
    while Instant::now() < end {
        for k in 0..N {
            while sent[k] < done[k] + 2 {
                let len = 2 + rng.below(MSG as u64 - 1) as usize;
                let off = (sent[k] % 2) as usize * MSG;
                srcs[k].write_at(off, &message(k, sent[k], len)).unwrap();
                st.c[k].send(&srcs[k], off as u64, len as u64, sent[k]);
                sent[k] += 1;
            }
            if let Some(Event::Dto(d)) = st.c[k].req.dequeue().unwrap() {
                assert_eq!(
                    (d.cookie, d.status),
                    (done[k], DtoStatus::Success),
                    "seed {seed}"
                );
                done[k] += 1;
            }
        }
    }
    for k in 0..N {
        while done[k] < sent[k] {
            let d = next_dto(&st.c[k].req);
            assert_eq!(
                (d.cookie, d.status),
                (done[k], DtoStatus::Success),
                "seed {seed}"
            );
            done[k] += 1;
        }
        // A one-byte message ends the server's count of this client.
        st.c[k].send(&srcs[k], 0, 1, u64::MAX);
        assert_eq!(next_dto(&st.c[k].req).status, DtoStatus::Success);
    }
    let got = waiter.join().unwrap();
    stop.store(true, Ordering::Release);
    poster.join().unwrap();
    assert_eq!(got, sent, "seed {seed}");
    drop(st.s_eps);
    st.s_ia.close(CloseFlags::Abrupt).unwrap();
}

/// Receives posted to an SRQ while no Send waits for one wake nobody: the
/// provider's thread stays asleep. Each post used to send it a command
/// that made it lock and look at every connection it has; thousands of
/// posts a second (a storage target refilling its SRQ) kept it busy for
/// nothing.
#[test]
fn srq_posts_wake_nobody_while_no_send_waits() {
    const POSTS: u64 = 2000;
    let st = setup(1, ("127.0.226.3", "127.0.226.4"), POSTS as usize + 1);
    let rbuf = st
        .s_pz
        .lmr_create(Region::zeroed(MSG), MemPriv::ALL)
        .unwrap();
    // Let the thread settle after the set-up.
    std::thread::sleep(Duration::from_millis(50));
    let (woke, looked) = (st.tcp.wakeups(), st.tcp.thread_looks());
    for i in 0..POSTS {
        st.srq
            .post_recv(&[rbuf.triplet(0, MSG as u64).unwrap()], i, D)
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(50));
    let (woke, looked) = (st.tcp.wakeups() - woke, st.tcp.thread_looks() - looked);
    assert!(
        woke < 20 && looked < 20,
        "{POSTS} posts woke the thread {woke} times, it locked a connection {looked} times"
    );
    // The receives work: a Send takes the first.
    let src = st.c[0].lmr(message(0, 0, 100));
    st.c[0].send(&src, 0, 100, 1);
    assert_eq!(next_dto(&st.c[0].req).status, DtoStatus::Success);
    let d = match st.s_rcv.wait(Some(T), 1).unwrap().0 {
        Event::Dto(d) => d,
        e => panic!("{e:?}"),
    };
    assert_eq!((d.cookie, d.transferred_length), (0, 100));
    assert_eq!(rbuf.to_vec().unwrap()[..100], message(0, 0, 100));
}
