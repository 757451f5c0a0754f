//! Several threads post on one endpoint at once (Sends, RDMA Writes and
//! RDMA Reads, each thread its own kind) while another takes the
//! completions, now polling, now waiting: every request completes exactly
//! once and every byte lands where it was sent. Then the same load met
//! by a disconnect: every request taken completes once, `Success` or
//! `Flushed` (none of a kind succeeds after one of it is flushed), and
//! nothing is lost.

mod common;

use common::*;
use rdapl::*;
use rdapl_tcp::Tcp;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Requests each posting thread keeps in flight.
const Q: u64 = 24;
/// Receives the server keeps posted.
const RQ: u64 = 64;
/// Largest Send; sizes cycle through inline, one FPDU and several.
const MAX: u64 = 9_000;
/// Slots of each client thread's buffer (each as large as `MAX`).
const SLOTS: u64 = Q;
/// How long each run may take at most.
const BOUND: Duration = Duration::from_secs(40);

const SEND: u64 = 0;
const WRITE: u64 = 1;
const READ: u64 = 2;

fn cookie(kind: u64, seq: u64) -> u64 {
    (kind << 56) | seq
}

fn len_of(seq: u64) -> u64 {
    // 0, small (inline), around an FPDU, several FPDUs.
    match seq % 5 {
        0 => 0,
        1 => 1 + seq % 61,
        2 => 1_400 + seq % 300,
        3 => MAX - seq % 7,
        _ => 4_096,
    }
}

/// What the client's threads did: per kind, how many they posted, and
/// which of them completed (and how).
struct Ledger {
    posted: [AtomicU64; 3],
    done: [AtomicU64; 3],
    seen: Mutex<Vec<Vec<Option<DtoStatus>>>>,
}

impl Ledger {
    fn new(n: usize) -> Ledger {
        Ledger {
            posted: Default::default(),
            done: Default::default(),
            seen: Mutex::new(vec![vec![None; n]; 3]),
        }
    }

    /// Records a completion; a second one of the same request fails.
    fn complete(&self, d: &DtoCompletion) {
        let (kind, seq) = (d.cookie >> 56, d.cookie & ((1 << 56) - 1));
        let mut seen = self.seen.lock().unwrap();
        let slot = &mut seen[kind as usize][seq as usize];
        assert!(slot.is_none(), "{d:?} completed twice (first {slot:?})");
        *slot = Some(d.status);
        drop(seen);
        self.done[kind as usize].fetch_add(1, Ordering::Release);
    }

    fn in_flight(&self, kind: u64) -> u64 {
        // `done` first: it never passes `posted`.
        let k = kind as usize;
        let done = self.done[k].load(Ordering::Acquire);
        self.posted[k].load(Ordering::Acquire).saturating_sub(done)
    }
}

/// The client's and the server's buffers.
struct Bufs {
    /// Client: sources of Sends and Writes, sinks of Reads (per kind).
    csrc: [Lmr; 3],
    /// Server: receive slots, the Writes' target, the Reads' source.
    srecv: Lmr,
    swrite: Lmr,
    sread: Lmr,
}

fn bufs(p: &Pair) -> Bufs {
    let n = (SLOTS * MAX) as usize;
    Bufs {
        csrc: [p.c.buf(n), p.c.buf(n), p.c.buf(n)],
        srecv: p.s.buf((RQ * MAX) as usize),
        swrite: p.s.buf(n),
        sread: p.s.lmr(pattern(n, 77)),
    }
}

/// Posts `n` requests of `kind` (at most `Q` in flight), or until `stop`
/// is set; a refused post ends the thread once `stop` is set (the
/// disconnect case) and fails it otherwise.
fn poster(p: &Pair, b: &Bufs, led: &Ledger, kind: u64, n: u64, stop: &AtomicBool) {
    let end = Instant::now() + BOUND;
    let src = &b.csrc[kind as usize];
    for seq in 0..n {
        while led.in_flight(kind) >= Q {
            assert!(Instant::now() < end, "kind {kind}: no completions");
            if stop.load(Ordering::Acquire) {
                return;
            }
            std::thread::yield_now();
        }
        if stop.load(Ordering::Acquire) {
            return;
        }
        let slot = seq % SLOTS;
        let len = len_of(seq);
        let at = slot * MAX;
        if kind != READ {
            src.write_at(at as usize, &pattern(len as usize, seq as u8))
                .unwrap();
        }
        let iov = [src.triplet(at, len).unwrap()];
        // Counted before the post: the completion may come first.
        led.posted[kind as usize].fetch_add(1, Ordering::AcqRel);
        let c = cookie(kind, seq);
        let r = match kind {
            SEND => p.c.ep.post_send(&iov, c, D),
            WRITE => {
                let to = b.swrite.rmr_triplet(at, len.max(1)).unwrap();
                p.c.ep.post_rdma_write(&iov, to, c, D)
            }
            _ => {
                let from = b.sread.rmr_triplet(at, len.max(1)).unwrap();
                p.c.ep.post_rdma_read(&iov, from, c, D)
            }
        };
        if let Err(e) = r {
            led.posted[kind as usize].fetch_sub(1, Ordering::AcqRel);
            assert!(stop.load(Ordering::Acquire), "kind {kind} seq {seq}: {e:?}");
            return;
        }
    }
}

/// Takes the client's request completions until every posted request
/// completed and `posting` is over, alternating polls and waits. Checks
/// each Read's bytes before its slot can be used again.
fn consumer(p: &Pair, b: &Bufs, led: &Ledger, posting: &AtomicBool, flushes_ok: bool) {
    let end = Instant::now() + BOUND;
    let want = pattern((SLOTS * MAX) as usize, 77);
    let mut n = 0u64;
    loop {
        let ev = if (n / 64).is_multiple_of(2) {
            p.c.req.dequeue().unwrap()
        } else {
            match p.c.req.wait(Some(Duration::from_millis(20)), 1) {
                Ok((e, _)) => Some(e),
                Err(Error::TimeoutExpired { .. }) => None,
                Err(e) => panic!("wait: {e:?}"),
            }
        };
        match ev {
            Some(Event::Dto(d)) => {
                n += 1;
                let (kind, seq) = (d.cookie >> 56, d.cookie & ((1 << 56) - 1));
                if d.status == DtoStatus::Success {
                    if kind == READ {
                        let (at, len) = ((seq % SLOTS) * MAX, len_of(seq));
                        let mut got = vec![0; len as usize];
                        b.csrc[READ as usize]
                            .read_at(at as usize, &mut got)
                            .unwrap();
                        assert!(
                            got[..] == want[at as usize..(at + len) as usize],
                            "read {seq}: wrong bytes"
                        );
                    }
                    assert_eq!(d.transferred_length, len_of(seq), "{d:?}");
                } else {
                    assert!(
                        flushes_ok && d.status == DtoStatus::Flushed,
                        "kind {kind} seq {seq}: {d:?}"
                    );
                }
                led.complete(&d);
            }
            Some(e) => panic!("unexpected {e:?}"),
            None => {
                // Posting over first, then nothing in flight: read the
                // other way round, the last posts could fall between.
                let over = !posting.load(Ordering::Acquire);
                if over && (0..3).all(|k| led.in_flight(k) == 0) {
                    return;
                }
                assert!(Instant::now() < end, "completions stopped");
            }
        }
    }
}

/// The server: keeps `RQ` receives posted and checks that Sends arrive
/// in order with their bytes, until `n` arrived (or the connection ends
/// with `flushes_ok`). Returns how many arrived.
fn receiver(p: &Pair, b: &Bufs, n: u64, flushes_ok: bool) -> u64 {
    let end = Instant::now() + BOUND;
    let post = |i: u64| {
        let slot = i % RQ;
        p.s.ep
            .post_recv(&[b.srecv.triplet(slot * MAX, MAX).unwrap()], i, D)
    };
    let mut next_post = 0;
    while next_post < RQ.min(n) {
        post(next_post).unwrap();
        next_post += 1;
    }
    for seq in 0..n {
        let d = loop {
            match p.s.rcv.wait(Some(Duration::from_millis(50)), 1) {
                Ok((Event::Dto(d), _)) => break d,
                Ok((e, _)) => panic!("unexpected {e:?}"),
                Err(Error::TimeoutExpired { .. }) => {
                    assert!(Instant::now() < end, "receive {seq} never came")
                }
                Err(e) => panic!("wait: {e:?}"),
            }
        };
        if d.status != DtoStatus::Success {
            assert!(flushes_ok && d.status == DtoStatus::Flushed, "{d:?}");
            return seq;
        }
        assert_eq!((d.cookie, d.transferred_length), (seq, len_of(seq)));
        let len = len_of(seq) as usize;
        let mut got = vec![0; len];
        b.srecv
            .read_at(((seq % RQ) * MAX) as usize, &mut got)
            .unwrap();
        assert!(got == pattern(len, seq as u8), "send {seq}: wrong bytes");
        if next_post < n {
            if let Err(e) = post(next_post) {
                assert!(flushes_ok, "post_recv: {e:?}");
                return seq + 1;
            }
            next_post += 1;
        }
    }
    n
}

fn pair(client: &str, server: &str) -> (std::sync::Arc<Tcp>, Pair) {
    let tcp = Tcp::new();
    let attr = EpAttr {
        max_request_dtos: 128,
        max_recv_dtos: 128,
        ..Default::default()
    };
    let node = |a: &str| Node::with_attr(common::ia(&tcp, a, ""), 1024, Some(attr));
    let p = Pair::new(node(client), node(server));
    p.connect();
    (tcp, p)
}

/// Runs the load: the server's receiver, the client's consumer and its
/// three posters (up to `n` requests each); with `cut`, the client
/// disconnects abruptly once 300 Sends completed. Returns the Sends the
/// server received.
fn load(p: &Pair, b: &Bufs, led: &Ledger, n: u64, cut: bool) -> u64 {
    let posting = AtomicBool::new(true);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let rx = s.spawn(|| receiver(p, b, n, cut));
        let cons = s.spawn(|| consumer(p, b, led, &posting, cut));
        let posters: Vec<_> = [SEND, WRITE, READ]
            .into_iter()
            .map(|k| {
                let stop = &stop;
                s.spawn(move || poster(p, b, led, k, n, stop))
            })
            .collect();
        if cut {
            let end = Instant::now() + BOUND;
            while led.done[SEND as usize].load(Ordering::Acquire) < 300 {
                assert!(Instant::now() < end, "no progress before the cut");
                std::thread::sleep(Duration::from_millis(1));
            }
            stop.store(true, Ordering::Release);
            p.c.ep.disconnect(false).unwrap();
        }
        for t in posters {
            t.join().unwrap();
        }
        posting.store(false, Ordering::Release);
        cons.join().unwrap();
        rx.join().unwrap()
    })
}

#[test]
fn threads_posting_on_one_endpoint_lose_and_repeat_nothing() {
    const N: u64 = 1_500;
    let (_tcp, p) = pair("127.0.50.1", "127.0.50.2");
    let b = bufs(&p);
    let led = Ledger::new(N as usize);
    let got = load(&p, &b, &led, N, false);
    assert_eq!(got, N);
    let seen = led.seen.lock().unwrap();
    for (k, v) in seen.iter().enumerate() {
        let ok = v.iter().filter(|s| **s == Some(DtoStatus::Success)).count();
        assert_eq!(ok as u64, N, "kind {k}: {ok} of {N} succeeded");
    }
    // A Read answered after the Writes: they are placed (a Write's
    // completion under `complete=sent` says only that TCP has it).
    let sink = p.c.buf(1);
    let from = b.swrite.rmr_triplet(0, 1).unwrap();
    p.c.ep
        .post_rdma_read(&[sink.triplet(0, 1).unwrap()], from, 1, D)
        .unwrap();
    assert_eq!(next_dto(&p.c.req).status, DtoStatus::Success);
    // Each Write slot holds the last Write made to it (the Writes of one
    // thread land in order).
    for slot in 0..SLOTS {
        let last = (0..N).rev().find(|s| s % SLOTS == slot).unwrap();
        let len = len_of(last) as usize;
        let mut got = vec![0; len];
        b.swrite.read_at((slot * MAX) as usize, &mut got).unwrap();
        assert!(got == pattern(len, last as u8), "write slot {slot}");
    }
}

#[test]
fn a_disconnect_under_posting_threads_flushes_each_request_once() {
    const N: u64 = 100_000;
    let (_tcp, p) = pair("127.0.50.3", "127.0.50.4");
    let b = bufs(&p);
    let led = Ledger::new(N as usize);
    load(&p, &b, &led, N, true);
    // Every request taken completed once (a post refused after the cut
    // is not counted), so none is missing.
    let seen = led.seen.lock().unwrap();
    for k in 0..3 {
        let posted = led.posted[k].load(Ordering::Acquire);
        let done = seen[k].iter().filter(|s| s.is_some()).count() as u64;
        assert_eq!(done, posted, "kind {k}: {done} of {posted} completed");
        // In order: no success after the first flush of a kind.
        let first_flush = seen[k].iter().position(|s| *s == Some(DtoStatus::Flushed));
        if let Some(f) = first_flush {
            assert!(
                seen[k][f..].iter().all(|s| *s != Some(DtoStatus::Success)),
                "kind {k}: a success after a flush"
            );
        }
    }
}
