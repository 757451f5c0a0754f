//! Churn: a long-lived process makes and ends objects and connections in
//! every way, hundreds of times, and holds no more afterwards than before.
//!
//! A server runs for weeks; every connection it ever accepted, every
//! endpoint, service point, registration and EVD it ever freed must leave
//! nothing behind: no heap, no descriptor, no thread. [`run`] makes a cycle
//! of them on two IAs of the provider under test (connections accepted,
//! rejected, ended gracefully or abruptly by either side, an endpoint freed
//! while connected with a receive posted; service points, registrations,
//! windows, zones, EVDs, SRQs and CNOs created and freed), runs it a while
//! to warm up, then many times more, and checks the heap (as the test
//! binary's allocator counts it), the open descriptors and the threads.
//!
//! It needs a process of its own (the heap is the process's): a provider
//! crate adds a test target with one test and a counting allocator, e.g.
//! [`stats_alloc`](https://docs.rs/stats_alloc)'s:
//!
//! ```no_run
//! // tests/churn.rs
//! use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};
//! use std::alloc::System;
//!
//! #[global_allocator]
//! static HEAP: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;
//!
//! // The test target's one #[test].
//! fn churn_leaves_nothing_behind() {
//!     # let open = |a: &str| rdapl_conformance::support::open(a);
//!     rdapl_conformance::churn::run(open("127.0.220.1"), open("127.0.220.2"), || {
//!         let s = HEAP.stats();
//!         s.bytes_allocated as i64 - s.bytes_deallocated as i64
//!     });
//! }
//! # fn main() { churn_leaves_nothing_behind() }
//! ```

use crate::support::{Node, T, conn_kind, next_cr, next_dto};
use rdapl::*;
use std::time::{Duration, Instant};

/// Cycles run before the first measurement (caches, pools and tables
/// reach their working size).
const WARM_UP: u64 = 40;
/// Cycles measured.
const CYCLES: u64 = 1000;
/// Heap growth allowed per cycle, on average, in bytes (said in `run`'s
/// docs). A cycle frees eleven endpoints; the memory of one kept costs more
/// than this.
const GROWTH: i64 = 256;
/// Heap growth allowed per cycle over the second half of the measured
/// cycles alone, in bytes: what fills to a bound (a listener's list of
/// recent set-ups, tables at their working size) filled in the first, so
/// a small allocation kept a cycle shows here.
const SLOPE: i64 = 64;

/// Runs the churn between IAs `client` and `server` of the provider under
/// test and panics if the process held more afterwards: heap (`live_bytes`:
/// bytes allocated and not freed, counted by the test's allocator) beyond
/// 256 bytes a cycle on average (a cycle frees eleven endpoints), or
/// beyond 64 a cycle over the second half of the cycles (once what fills
/// to a bound is full), or more descriptors or threads than before, once
/// the provider had a few seconds to finish closing.
pub fn run(client: Ia, server: Ia, live_bytes: impl Fn() -> i64) {
    let c = Node::of(client, None, 64, 64);
    let s = Node::of(server, None, 64, 64);
    let bufs = (c.buf(4096), s.buf(4096));
    let (psp, qual) = listen(&s, 4000);
    let ends = Ends {
        c: &c,
        s: &s,
        bufs: &bufs,
        qual,
    };
    for i in 0..WARM_UP {
        ends.cycle(i);
    }
    // What the warm-up closed is closed.
    std::thread::sleep(Duration::from_millis(300));
    let before = (quiet(&live_bytes), open_fds(), threads());
    let start = Instant::now();
    let half = CYCLES / 2;
    for i in WARM_UP..WARM_UP + half {
        ends.cycle(i);
    }
    let mid = quiet(&live_bytes);
    for i in WARM_UP + half..WARM_UP + CYCLES {
        ends.cycle(i);
    }
    let (fds, threads) = settle(|| (open_fds(), threads()), (before.1, before.2));
    let after = quiet(&live_bytes);
    let grown = (after - before.0) / CYCLES as i64;
    let slope = (after - mid) / half as i64;
    eprintln!(
        "churn: {CYCLES} cycles in {:?}; heap {grown:+} bytes a cycle ({slope:+} in the second half), descriptors {} -> {fds}, threads {} -> {threads}",
        start.elapsed(),
        before.1,
        before.2
    );
    assert!(
        grown <= GROWTH,
        "the heap grew by {grown} bytes a cycle (at most {GROWTH})"
    );
    assert!(
        slope <= SLOPE,
        "the heap grew by {slope} bytes a cycle over the second half (at most {SLOPE})"
    );
    assert!(
        fds <= before.1,
        "descriptors: {} before, {fds} after",
        before.1
    );
    assert!(
        threads <= before.2,
        "threads: {} before, {threads} after",
        before.2
    );
    psp.free().unwrap();
}

/// The next event of `n`'s connection EVD ends a connection.
fn expect_end(n: &Node) {
    let kind = conn_kind(&n.conn);
    assert!(
        matches!(
            kind,
            ConnectionEventKind::Disconnected | ConnectionEventKind::Broken
        ),
        "{kind:?}"
    );
}

/// A PSP of `s` on the first free qualifier from `from`.
fn listen(s: &Node, from: u64) -> (Psp, u64) {
    for q in from..from + 500 {
        match s.ia.psp_create(q, &s.cr) {
            Ok(p) => return (p, q),
            Err(Error::ConnQualInUse(_)) => continue,
            Err(e) => panic!("psp_create: {e:?}"),
        }
    }
    panic!("no free qualifier from {from}");
}

/// The two sides and the server's qualifier.
struct Ends<'a> {
    c: &'a Node,
    s: &'a Node,
    /// The client's and the server's buffers.
    bufs: &'a (Lmr, Lmr),
    qual: u64,
}

impl Ends<'_> {
    /// A connected pair of new endpoints.
    fn connect(&self, private: &[u8]) -> (Ep, Ep) {
        let (c, s) = (self.c.ep2(), self.s.ep2());
        c.connect(self.s.ia.address(), self.qual, Some(T), private)
            .unwrap();
        next_cr(&self.s.ia, &self.s.cr).accept(&s, b"ok").unwrap();
        assert_eq!(conn_kind(&self.s.conn), ConnectionEventKind::Established);
        assert_eq!(conn_kind(&self.c.conn), ConnectionEventKind::Established);
        (c, s)
    }

    /// One message each way.
    fn exchange(&self, (c, s): (&Ep, &Ep), i: u64) {
        let (cb, sb) = (&self.bufs.0, &self.bufs.1);
        s.post_recv(&[sb.triplet(0, 4096).unwrap()], i, CompletionFlags::DEFAULT)
            .unwrap();
        c.post_recv(&[cb.triplet(0, 4096).unwrap()], i, CompletionFlags::DEFAULT)
            .unwrap();
        c.post_send(&[cb.triplet(0, 1000).unwrap()], i, CompletionFlags::DEFAULT)
            .unwrap();
        assert_eq!(next_dto(&self.s.rcv).status, DtoStatus::Success);
        s.post_send(&[sb.triplet(0, 3000).unwrap()], i, CompletionFlags::DEFAULT)
            .unwrap();
        assert_eq!(next_dto(&self.c.rcv).status, DtoStatus::Success);
        assert_eq!(next_dto(&self.c.req).status, DtoStatus::Success);
        assert_eq!(next_dto(&self.s.req).status, DtoStatus::Success);
    }

    /// Every way a connection ends, and every object made and freed.
    fn cycle(&self, i: u64) {
        let (c, s) = (self.c, self.s);

        // An endpoint never connected.
        c.ep2().free().unwrap();

        // Used, then ended gracefully by the client.
        let (ce, se) = self.connect(b"hello");
        self.exchange((&ce, &se), i);
        ce.disconnect(true).unwrap();
        expect_end(c);
        expect_end(s);
        ce.free().unwrap();
        se.free().unwrap();

        // Ended abruptly by the server.
        let (ce, se) = self.connect(b"");
        se.disconnect(false).unwrap();
        expect_end(s);
        expect_end(c);
        se.free().unwrap();
        ce.free().unwrap();

        // Freed while connected, with a receive posted (flushed).
        let (ce, se) = self.connect(b"");
        ce.post_recv(
            &[self.bufs.0.triplet(0, 64).unwrap()],
            i,
            CompletionFlags::DEFAULT,
        )
        .unwrap();
        ce.free().unwrap();
        assert_eq!(next_dto(&c.rcv).status, DtoStatus::Flushed);
        expect_end(c);
        expect_end(s);
        se.free().unwrap();

        // Rejected, with a connect timeout pending.
        let ce = c.ep2();
        ce.connect(s.ia.address(), self.qual, Some(T), b"may I")
            .unwrap();
        next_cr(&s.ia, &s.cr).reject(b"no").unwrap();
        assert_eq!(conn_kind(&c.conn), ConnectionEventKind::PeerRejected);
        ce.free().unwrap();

        // Given up by the client (freed) while the server holds the
        // request: the server's answer may come too late (refused).
        let ce = c.ep2();
        ce.connect(s.ia.address(), self.qual, Some(T), b"").unwrap();
        let cr = next_cr(&s.ia, &s.cr);
        ce.free().unwrap();
        let _ = cr.reject(b"");

        // Service points.
        let (psp, _) = listen(s, self.qual + 1);
        psp.free().unwrap();
        let se = s.ep2();
        let (rsp, _) = (1..500)
            .find_map(|k| {
                s.ia.rsp_create(self.qual + k, &se, &s.cr)
                    .ok()
                    .map(|r| (r, k))
            })
            .expect("a free qualifier for an RSP");
        rsp.free().unwrap();
        se.free().unwrap();

        // Memory, zones, EVDs, an SRQ and its endpoint, a CNO.
        let pz = c.ia.pz_create().unwrap();
        let lmr = pz.lmr_create(Region::zeroed(256), MemPriv::ALL).unwrap();
        let rmr = pz.rmr_create().unwrap();
        rmr.free().unwrap();
        lmr.free().unwrap();
        let evd = c.ia.evd_create(16, EvdFlags::DTO).unwrap();
        let srq = c.ia.srq_create(&pz, 4, 1).unwrap();
        let ep =
            c.ia.ep_create_with_srq(&pz, &evd, Some(&evd), Some(&c.conn), &srq, None)
                .unwrap();
        ep.free().unwrap();
        srq.free().unwrap();
        evd.free().unwrap();
        pz.free().unwrap();
        Cno::new().free().unwrap();
    }
}

/// Reads `now` until it is at most `target`, for up to ten seconds (a
/// provider closes sockets and ends threads on its own time); returns the
/// last reading.
fn settle(now: impl Fn() -> (usize, usize), target: (usize, usize)) -> (usize, usize) {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let n = now();
        if (n.0 <= target.0 && n.1 <= target.1) || Instant::now() >= end {
            return n;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The heap once it stopped moving (two readings 50 ms apart agree; at
/// most two seconds): a provider's threads may still be freeing what the
/// last connections left.
fn quiet(live_bytes: impl Fn() -> i64) -> i64 {
    let end = Instant::now() + Duration::from_secs(2);
    let mut last = live_bytes();
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let now = live_bytes();
        if now == last || Instant::now() >= end {
            return now;
        }
        last = now;
    }
}

/// Open descriptors of the process (0 where `/proc` is not there).
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Threads of the process (0 where `/proc` is not there).
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}
