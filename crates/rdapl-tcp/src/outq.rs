//! A connection's output: what the engine transmits, queued for the socket
//! without copying large payload.
//!
//! Headers, trailers and small payloads are copied into byte segments;
//! payload of at least [`SHARE_MIN`] bytes is queued by reference: to the
//! registered memory itself ([`Gather`], a Send's or RDMA Write's list, a
//! Read Response's source), or to a gathered buffer (shared with the
//! connection's memory, which may drop its own reference as soon as the
//! engine is done with it). The socket gets everything with vectored
//! writes (header, payload and CRC of many FPDUs in one system call),
//! registered memory read under its regions' read locks for the call only,
//! one list locked at a time. A socket is written with `MSG_NOSIGNAL`: a
//! peer that has gone makes the write fail with `EPIPE`, never raises
//! `SIGPIPE` (which kills a host process that did not ignore it, as C
//! programs do not).

use rdapl::provider::Gather;
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::net::TcpStream;
use std::sync::Arc;

/// Where a queue's bytes go: a socket, or a test's writer.
pub(crate) trait Sink {
    /// Writes some of `iov`, as `writev` does.
    fn send(&mut self, iov: &[IoSlice<'_>]) -> io::Result<usize>;
}

impl Sink for TcpStream {
    fn send(&mut self, iov: &[IoSlice<'_>]) -> io::Result<usize> {
        use rustix::net::{SendAncillaryBuffer, SendFlags, sendmsg};
        Ok(sendmsg(
            &*self,
            iov,
            &mut SendAncillaryBuffer::default(),
            SendFlags::NOSIGNAL,
        )?)
    }
}

/// The smallest payload queued by reference rather than copied: below a
/// network's MSS (an Ethernet link's FPDU carries about 1,400 bytes), so
/// that every full FPDU of a bulk transfer goes by reference whatever the
/// link; only small messages and a message's short tail are copied.
pub(crate) const SHARE_MIN: usize = 256;

/// The largest Send or RDMA Write whose payload is copied into the queue
/// whole rather than queued by reference: writes take one list of
/// registered memory at a time, so small messages by reference would cost
/// a system call each, while copied ones posted together (a batch) share
/// one. Copying a message this size costs less than a system call.
pub(crate) const COPY_MESSAGE_MAX: usize = 8 << 10;

/// Most slices one vectored write takes.
const MAX_IOV: usize = 64;

/// Written byte segments kept for reuse: a message's FPDUs and the
/// fence behind it can need a few at once (its headers between payloads
/// queued by reference), each otherwise a fresh allocation grown step by
/// step.
const SPARES: usize = 4;

/// The capacity a new byte segment starts with: room for a few headers
/// and short messages without growing.
const SEG_START: usize = 512;

/// Most bytes a segment keeps inline: the trailer and next header that
/// sit between two payloads queued by reference.
const INLINE: usize = 64;

enum Seg {
    Bytes(Vec<u8>),
    /// A few bytes between two payloads queued by reference, kept in the
    /// queue itself (no allocation per FPDU of a bulk transfer).
    Inline([u8; INLINE], u8),
    Shared(Arc<Vec<u8>>, usize, usize),
    /// Bytes `start..end` of registered memory.
    Held(Arc<Gather>, usize, usize),
}

impl Seg {
    fn len(&self) -> usize {
        match self {
            Seg::Bytes(b) => b.len(),
            Seg::Inline(_, n) => usize::from(*n),
            Seg::Shared(_, s, e) | Seg::Held(_, s, e) => e - s,
        }
    }
}

/// The output queue.
#[derive(Default)]
pub(crate) struct OutQueue {
    segs: VecDeque<Seg>,
    /// Bytes of the front segment already written.
    off: usize,
    /// Bytes queued and not written.
    len: usize,
    /// Bytes written since the queue was made.
    written: u64,
    /// System calls that wrote (some of) them.
    pub writes: u64,
    /// Written byte segments kept for reuse (at most [`SPARES`]).
    spares: Vec<Vec<u8>>,
    /// Shared payload buffers written and no longer referenced elsewhere.
    pub freed: Vec<Vec<u8>>,
}

impl OutQueue {
    /// Bytes queued and not yet written.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes written to the socket since the queue was made.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Bytes queued since the queue was made: once [`OutQueue::written`]
    /// reaches this figure, everything queued so far has left.
    pub fn pushed(&self) -> u64 {
        self.written + self.len as u64
    }

    /// Drops everything queued.
    pub fn clear(&mut self) {
        self.segs.clear();
        self.off = 0;
        self.len = 0;
    }

    /// Queues a copy of `b`.
    pub fn push_bytes(&mut self, b: &[u8]) {
        if b.is_empty() {
            return;
        }
        self.len += b.len();
        match self.segs.back_mut() {
            Some(Seg::Bytes(last)) if last.len() < 64 << 10 => {
                last.extend_from_slice(b);
                return;
            }
            Some(Seg::Inline(buf, n)) if usize::from(*n) + b.len() <= INLINE => {
                let at = usize::from(*n);
                buf[at..at + b.len()].copy_from_slice(b);
                *n += b.len() as u8;
                return;
            }
            Some(Seg::Shared(..) | Seg::Held(..)) if b.len() <= INLINE => {
                let mut buf = [0; INLINE];
                buf[..b.len()].copy_from_slice(b);
                self.segs.push_back(Seg::Inline(buf, b.len() as u8));
                return;
            }
            _ => {}
        }
        let mut v = self
            .spares
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(SEG_START.max(b.len())));
        v.extend_from_slice(b);
        self.segs.push_back(Seg::Bytes(v));
    }

    /// Queues bytes `start..end` of `data` by reference (a copy if short).
    /// False (nothing queued) if the range is not inside `data`.
    pub fn push_shared(&mut self, data: &Arc<Vec<u8>>, start: usize, end: usize) -> bool {
        if start > end || end > data.len() {
            return false;
        }
        if end - start < SHARE_MIN {
            self.push_bytes(&data[start..end]);
        } else {
            self.len += end - start;
            self.segs.push_back(Seg::Shared(data.clone(), start, end));
        }
        true
    }

    /// Queues bytes `start..end` of registered memory by reference (a
    /// copy if short). False (nothing queued) if the range is not inside
    /// `g`, or (short) if its memory is gone.
    pub fn push_held(&mut self, g: &Arc<Gather>, start: usize, end: usize) -> bool {
        if start > end || end > g.len() {
            return false;
        }
        if end - start >= SHARE_MIN {
            self.len += end - start;
            self.segs.push_back(Seg::Held(g.clone(), start, end));
            return true;
        }
        self.push_copied(g, start, end)
    }

    /// Queues a copy of bytes `start..end` of registered memory. False
    /// (nothing queued) if the range is not inside `g` or its memory is
    /// gone.
    pub fn push_copied(&mut self, g: &Arc<Gather>, start: usize, end: usize) -> bool {
        if start > end || end > g.len() {
            return false;
        }
        let Some(l) = g.lock() else {
            return false;
        };
        for b in l.slices(start, end).into_iter().flatten() {
            self.push_bytes(b);
        }
        true
    }

    /// Writes as much as the socket takes. `Ok(true)` if bytes moved. An
    /// error if registered memory queued by reference is gone (its region
    /// was retired under a request in flight): the connection breaks.
    pub fn write_to(&mut self, w: &mut impl Sink) -> io::Result<bool> {
        let mut moved = false;
        while self.len > 0 {
            // One list of registered memory per call, locked for it.
            let held = self.segs.iter().take(MAX_IOV).find_map(|s| match s {
                Seg::Held(g, ..) => Some(g.clone()),
                _ => None,
            });
            let lock =
                match &held {
                    Some(g) => Some(g.lock().ok_or_else(|| {
                        io::Error::other("registered memory being sent was freed")
                    })?),
                    None => None,
                };
            let n = {
                let mut iov: [IoSlice<'_>; MAX_IOV] = [IoSlice::new(&[]); MAX_IOV];
                let mut k = 0;
                'fill: for (i, s) in self.segs.iter().enumerate() {
                    // (A list's slices may have filled it.)
                    if k == MAX_IOV {
                        break;
                    }
                    let skip = if i == 0 { self.off } else { 0 };
                    match s {
                        Seg::Bytes(b) => iov[k] = IoSlice::new(&b[skip..]),
                        Seg::Inline(b, n) => iov[k] = IoSlice::new(&b[skip..usize::from(*n)]),
                        Seg::Shared(a, st, e) => iov[k] = IoSlice::new(&a[st + skip..*e]),
                        Seg::Held(g, st, e) => {
                            let (Some(h), Some(l)) = (&held, &lock) else {
                                break 'fill;
                            };
                            if !Arc::ptr_eq(g, h) {
                                break 'fill;
                            }
                            for b in l.slices(st + skip, *e).into_iter().flatten() {
                                if k == MAX_IOV {
                                    break 'fill;
                                }
                                iov[k] = IoSlice::new(b);
                                k += 1;
                            }
                            continue;
                        }
                    }
                    k += 1;
                    if k == MAX_IOV {
                        break;
                    }
                }
                match w.send(&iov[..k]) {
                    Ok(0) => return Ok(moved),
                    Ok(n) => {
                        self.writes += 1;
                        n
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(moved),
                    Err(e) => return Err(e),
                }
            };
            drop(lock);
            moved = true;
            self.advance(n);
        }
        Ok(moved)
    }

    fn advance(&mut self, mut n: usize) {
        self.len -= n;
        self.written += n as u64;
        while n > 0 {
            let Some(front) = self.segs.front() else {
                break;
            };
            let left = front.len() - self.off;
            if n < left {
                self.off += n;
                return;
            }
            n -= left;
            self.off = 0;
            match self.segs.pop_front() {
                Some(Seg::Bytes(mut b))
                    if self.spares.len() < SPARES && b.capacity() <= 1 << 20 =>
                {
                    b.clear();
                    self.spares.push(b);
                }
                Some(Seg::Shared(a, ..)) => {
                    if let Ok(v) = Arc::try_unwrap(a) {
                        crate::memory::recycle(&mut self.freed, v);
                    }
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdapl::mem::{Region, Span};

    /// A writer that takes at most `max` bytes per call.
    struct Trickle {
        out: Vec<u8>,
        max: usize,
    }

    impl Sink for Trickle {
        fn send(&mut self, iov: &[IoSlice<'_>]) -> io::Result<usize> {
            // Like the default `write_vectored`: the first non-empty slice.
            let b = iov.iter().find(|b| !b.is_empty()).map_or(&[][..], |b| b);
            let n = b.len().min(self.max);
            if n == 0 && !b.is_empty() {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            self.out.extend_from_slice(&b[..n]);
            Ok(n)
        }
    }

    #[test]
    fn bytes_and_shared_come_out_in_order_across_partial_writes() {
        let big = Arc::new((0..10_000u32).map(|i| i as u8).collect::<Vec<u8>>());
        let mut q = OutQueue::default();
        let mut want = Vec::new();
        for round in 0..5u8 {
            q.push_bytes(&[round; 7]);
            want.extend_from_slice(&[round; 7]);
            assert!(q.push_shared(&big, 100, 9_000));
            want.extend_from_slice(&big[100..9_000]);
            assert!(q.push_shared(&big, 10, 20));
            want.extend_from_slice(&big[10..20]);
        }
        assert!(!q.push_shared(&big, 5, 10_001));
        assert_eq!(q.len(), want.len());
        for max in [1, 333, 4096, 1 << 20] {
            let mut q2 = OutQueue::default();
            q2.push_bytes(&want[..3]);
            assert!(q2.push_shared(&Arc::new(want[3..].to_vec()), 0, want.len() - 3));
            let mut w = Trickle {
                out: Vec::new(),
                max,
            };
            while !q2.is_empty() {
                assert!(q2.write_to(&mut w).unwrap());
            }
            assert_eq!(w.out, want);
        }
        let mut w = Trickle {
            out: Vec::new(),
            max: 777,
        };
        while !q.is_empty() {
            q.write_to(&mut w).unwrap();
        }
        assert_eq!(w.out, want);
    }

    /// A writer that takes every slice it is given, up to `max` bytes.
    struct Greedy {
        out: Vec<u8>,
        max: usize,
        calls: usize,
    }

    impl Sink for Greedy {
        fn send(&mut self, iov: &[IoSlice<'_>]) -> io::Result<usize> {
            assert!(iov.len() <= MAX_IOV);
            self.calls += 1;
            let mut n = 0;
            for b in iov {
                let take = b.len().min(self.max - n);
                self.out.extend_from_slice(&b[..take]);
                n += take;
            }
            Ok(n)
        }
    }

    #[test]
    fn a_list_that_fills_the_vector_leaves_the_rest_to_the_next_write() {
        // One header, then a list of exactly MAX_IOV - 1 slices: the write
        // is full after the list, and the trailer behind it waits.
        let r = Region::from_vec((0..200_000u32).map(|i| (i * 13) as u8).collect());
        let n = MAX_IOV - 1;
        let parts: Vec<(usize, usize)> = (0..n).map(|i| (i * 3_000, SHARE_MIN)).collect();
        let g = gather(&r, &parts);
        let mut want = b"hdr".to_vec();
        for &(o, l) in &parts {
            want.extend_from_slice(&r.read()[o..o + l]);
        }
        want.extend_from_slice(b"trailer");
        for max in [usize::MAX, 5_000] {
            let mut q = OutQueue::default();
            q.push_bytes(b"hdr");
            assert!(q.push_held(&g, 0, n * SHARE_MIN));
            q.push_bytes(b"trailer");
            let mut w = Greedy {
                out: Vec::new(),
                max,
                calls: 0,
            };
            while !q.is_empty() {
                assert!(q.write_to(&mut w).unwrap());
            }
            assert!(w.out == want, "max {max}");
            assert!(w.calls >= 2);
        }
    }

    /// What a property case queues.
    #[derive(Debug, Clone)]
    enum Push {
        Bytes(usize),
        Shared(usize, usize),
        /// A list of `(offset, len)` spans of the region, and the range of
        /// it queued (as fractions of its length, in 1/64ths).
        Held(Vec<(usize, usize)>, u8, u8),
    }

    fn push_strategy() -> impl proptest::strategy::Strategy<Value = Push> {
        use proptest::prelude::*;
        prop_oneof![
            (0usize..300).prop_map(Push::Bytes),
            (0usize..4_000, 0usize..6_000).prop_map(|(s, n)| Push::Shared(s, n)),
            (
                // Few slices, or about a whole vector's worth of them.
                prop_oneof![
                    proptest::collection::vec((0usize..60_000, 1usize..1_500), 1..8),
                    proptest::collection::vec((0usize..60_000, 1usize..1_500), 60..68),
                ],
                // Often the whole list.
                prop_oneof![Just((0u8, 64u8)), (0u8..=64, 0u8..=64)],
            )
                .prop_map(|(spans, (a, b))| Push::Held(spans, a.min(b), a.max(b))),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Whatever is queued, in any mix and size, comes out whole and in
        /// order through writers that take any amount, and no write is
        /// given more than `MAX_IOV` slices.
        #[test]
        fn anything_queued_comes_out_in_order(
            pushes in proptest::collection::vec(push_strategy(), 1..16),
            max in proptest::prop_oneof![
                97usize..5_000,
                proptest::strategy::Just(usize::MAX),
            ],
            greedy in proptest::bool::ANY,
        ) {
            let r = Region::from_vec((0..64_000u32).map(|i| (i * 31 + 7) as u8).collect());
            let shared = Arc::new((0..10_000u32).map(|i| (i * 17) as u8).collect::<Vec<u8>>());
            let mut q = OutQueue::default();
            let mut want = Vec::new();
            for (i, p) in pushes.iter().enumerate() {
                match p {
                    Push::Bytes(n) => {
                        let b: Vec<u8> = (0..*n).map(|k| (k + i) as u8).collect();
                        q.push_bytes(&b);
                        want.extend_from_slice(&b);
                    }
                    Push::Shared(s, n) => {
                        let (s, e) = (*s, s + n);
                        let ok = q.push_shared(&shared, s, e);
                        proptest::prop_assert_eq!(ok, e <= shared.len());
                        if ok {
                            want.extend_from_slice(&shared[s..e]);
                        }
                    }
                    Push::Held(spans, a, b) => {
                        let spans: Vec<(usize, usize)> = spans
                            .iter()
                            .map(|&(o, n)| (o, n.min(64_000 - o)))
                            .collect();
                        let g = gather(&r, &spans);
                        let mut all = Vec::new();
                        for &(o, n) in &spans {
                            all.extend_from_slice(&r.read()[o..o + n]);
                        }
                        let (s, e) = (all.len() * *a as usize / 64, all.len() * *b as usize / 64);
                        proptest::prop_assert!(q.push_held(&g, s, e));
                        want.extend_from_slice(&all[s..e]);
                    }
                }
            }
            proptest::prop_assert_eq!(q.len(), want.len());
            let mut out = Vec::new();
            let mut calls = 0;
            while !q.is_empty() {
                calls += 1;
                proptest::prop_assert!(calls < 1_000_000);
                if greedy {
                    let mut w = Greedy { out: std::mem::take(&mut out), max, calls: 0 };
                    q.write_to(&mut w).unwrap();
                    out = w.out;
                } else {
                    let mut w = Trickle { out: std::mem::take(&mut out), max };
                    q.write_to(&mut w).unwrap();
                    out = w.out;
                }
            }
            proptest::prop_assert!(out == want);
        }
    }

    fn gather(r: &Arc<Region>, parts: &[(usize, usize)]) -> Arc<Gather> {
        let spans = parts.iter().map(|&(offset, len)| Span {
            region: r.clone(),
            offset,
            len,
        });
        Arc::new(Gather::from_spans(spans).unwrap())
    }

    #[test]
    fn registered_memory_comes_out_in_order_across_lists_and_partial_writes() {
        let r1 = Region::from_vec((0..20_000u32).map(|i| (i * 7) as u8).collect());
        let r2 = Region::from_vec((0..9_000u32).map(|i| (i * 3) as u8).collect());
        let bytes = |r: &Arc<Region>, o: usize, n: usize| r.read()[o..o + n].to_vec();
        // Two lists, one of them crossing regions, taken in pieces.
        let a = gather(&r1, &[(100, 9_000), (15_000, 4_000)]);
        let b = Arc::new(
            Gather::from_spans([
                Span {
                    region: r2.clone(),
                    offset: 0,
                    len: 9_000,
                },
                Span {
                    region: r1.clone(),
                    offset: 0,
                    len: 50,
                },
            ])
            .unwrap(),
        );
        let mut wa = bytes(&r1, 100, 9_000);
        wa.extend(bytes(&r1, 15_000, 4_000));
        let mut wb = bytes(&r2, 0, 9_000);
        wb.extend(bytes(&r1, 0, 50));
        for max in [1, 1000, 4096, 1 << 20] {
            let mut q = OutQueue::default();
            let mut want = Vec::new();
            for (g, w, cuts) in [
                (&a, &wa, [0, 3_000, 12_999, 13_000]),
                (&b, &wb, [0, 100, 8_990, 9_050]),
            ] {
                for c in cuts.windows(2) {
                    q.push_bytes(b"hdr");
                    want.extend_from_slice(b"hdr");
                    assert!(q.push_held(g, c[0], c[1]));
                    want.extend_from_slice(&w[c[0]..c[1]]);
                }
            }
            assert!(!q.push_held(&a, 10, 13_001));
            assert!(!q.push_held(&a, 11, 10));
            assert_eq!(q.len(), want.len());
            let mut w = Trickle {
                out: Vec::new(),
                max,
            };
            while !q.is_empty() {
                q.write_to(&mut w).unwrap();
            }
            assert!(w.out == want, "max {max}");
        }
        // Memory retired under a queued list: an error, never a read.
        let mut q = OutQueue::default();
        assert!(q.push_held(&b, 0, 9_050));
        r2.retire();
        let mut w = Trickle {
            out: Vec::new(),
            max: 1 << 20,
        };
        assert!(q.write_to(&mut w).is_err());
        assert!(w.out.is_empty());
        // A short range of it is copied at once, so it fails right away.
        assert!(!q.push_held(&b, 0, 10));
    }

    /// A socket whose peer has gone fails the write with `EPIPE` and raises
    /// no `SIGPIPE`. Runs in a child process of its own (the flag handler it
    /// installs is process-wide; with it, a raised signal is seen instead
    /// of ignored).
    #[test]
    fn a_gone_peer_fails_the_write_without_sigpipe() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::time::{Duration, Instant};
        const CHILD: &str = "RDAPL_TCP_SIGPIPE_CHILD";
        const NAME: &str = "outq::tests::a_gone_peer_fails_the_write_without_sigpipe";
        if std::env::var_os(CHILD).is_none() {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
                .env(CHILD, "1")
                .output()
                .unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(out.status.success(), "the child failed: {text}");
            assert!(text.contains("1 passed"), "the child ran no test: {text}");
            return;
        }
        let raised = Arc::new(AtomicBool::new(false));
        signal_hook::flag::register(signal_hook::consts::SIGPIPE, raised.clone()).unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut s = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        drop(l.accept().unwrap());
        // The peer answers the first write with a reset; a write after the
        // reset was reported is the one that raises SIGPIPE unless asked not to.
        let end = Instant::now() + Duration::from_secs(5);
        let mut q = OutQueue::default();
        loop {
            q.clear();
            q.push_bytes(&[7; 1000]);
            match q.write_to(&mut s) {
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => break,
                Ok(_) | Err(_) => {}
            }
            assert!(Instant::now() < end, "no EPIPE within 5 s");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!raised.load(Ordering::SeqCst), "the write raised SIGPIPE");
    }
}
