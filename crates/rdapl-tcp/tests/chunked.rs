//! The provider's own socket code under a hostile byte stream: a proxy
//! between client and server forwards each direction in random pieces
//! (from one byte to more than an FPDU, reads and writes chopped apart,
//! short pauses), so MPA frames, FPDU headers, trailers and bulk payload
//! arrive split at every kind of place. The protocol crate's simulation
//! checks the engine under any split; this checks what the provider adds
//! around it: the input buffer, reads straight into a payload's place,
//! partial writes, the fence. Every byte and every completion is checked.
//! Faults of the proxy: both connections reset once a chosen number of
//! bytes went through (mid-FPDU); a bit flipped anywhere, or in an FPDU's
//! length, either way (with CRC); the proxy no longer reading from the
//! client; the server's stream dropped from an FPDU on (answers that
//! never come); without CRC, a bit flipped in an RDMA Write's STag or
//! tagged offset (the target's checks keep it inside the grant). Each time both sides see the connection broken, within
//! the IA's `timeout_ms` where bytes stop coming, every request completes
//! exactly once, and nothing corrupted completes in success. Each case
//! prints its seed; `CHUNK_SEED=n` replays a seed's choices (the kernel's
//! timing varies). A failing case also prints the provider's log of its
//! connections (info and above: which side ended, how and why), since a
//! timing the seed does not replay may not come back.

mod common;

use common::*;
use rdapl::*;
use rdapl_tcp::Tcp;
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// splitmix64: the proxy's choices, reproducible from a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// A piece's size: often a few bytes (headers and trailers split),
    /// often a few KiB, sometimes more than a loopback FPDU.
    fn piece(&mut self) -> usize {
        match self.below(10) {
            0..=2 => 1 + self.below(8) as usize,
            3..=6 => 9 + self.below(4096) as usize,
            _ => 4096 + self.below(70_000) as usize,
        }
    }
}

fn seed() -> u64 {
    let s = std::env::var("CHUNK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    eprintln!("CHUNK_SEED={s}");
    s
}

/// A forwarding proxy at `listen` for connections to `to`.
struct Proxy {
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

/// How a proxy forwards.
#[derive(Clone, Copy)]
struct Mode {
    seed: u64,
    /// What happens to the bytes from the client to the server.
    fault: Fault,
    /// And to those from the server to the client.
    back: Fault,
    /// The proxy's sockets take small receive buffers: the provider's
    /// writes come back short or would block, mid-FPDU.
    small_windows: bool,
}

impl Mode {
    /// The client's bytes untouched, the server's dropped from its first
    /// FPDU on (its kernel still acknowledging): no answer comes.
    fn answers_dropped() -> Mode {
        Mode {
            seed: seed(),
            fault: Fault::None,
            small_windows: false,
            back: Fault::DropFrom(0),
        }
    }
}

/// A fault of one direction.
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    None,
    /// Both connections reset (RST) once this many bytes went through.
    CutAfter(u64),
    /// The byte at this offset of the stream has this bit flipped.
    Flip(u64, u8),
    /// The high byte of the length of this FPDU (counted from 0, after
    /// the MPA Request) has this bit flipped.
    FlipLength(u64, u8),
    /// After this many bytes the proxy stops reading from the client,
    /// holding the connection open: a peer alive but no longer reading.
    FreezeAfter(u64),
    /// In the tagged FPDU of this number (counted from 0), the byte at
    /// this offset from the FPDU's start (4..8: the STag, 8..16: the
    /// tagged offset) has this bit flipped.
    FlipTagged(u64, u64, u8),
    /// From the start of this FPDU on, the bytes are read and dropped, and
    /// the stream's end too: a peer whose kernel acknowledges while its
    /// process sends nothing more, or a middlebox that swallows frames.
    DropFrom(u64),
}

/// Where the FPDUs of a client's stream begin: follows the MPA Request
/// and the length of each FPDU (RFC 5044: 2 bytes of length, the ULPDU,
/// padding to 4 bytes, the CRC field).
struct Framing {
    seen: Vec<u8>,
    /// The start of the next FPDU, and its number.
    next: u64,
    count: u64,
    /// Tagged FPDUs passed (the DDP control byte's T bit).
    tagged: u64,
}

impl Framing {
    fn new() -> Framing {
        Framing {
            seen: Vec::new(),
            next: 0,
            count: 0,
            tagged: 0,
        }
    }

    /// Takes the stream's next bytes; false until the MPA frame before the
    /// first FPDU (20 bytes and its private data) is known.
    fn take(&mut self, bytes: &[u8]) -> bool {
        self.seen.extend_from_slice(bytes);
        if self.next == 0 {
            if self.seen.len() < 20 {
                return false;
            }
            let pd = u16::from_be_bytes([self.seen[18], self.seen[19]]);
            self.next = 20 + u64::from(pd);
        }
        true
    }

    /// Moves `next` past the FPDU that begins there (its length known).
    fn skip(&mut self) {
        let at = self.next as usize;
        let len = u64::from(u16::from_be_bytes([self.seen[at], self.seen[at + 1]]));
        self.next += (2 + len).div_ceil(4) * 4 + 4;
    }

    /// Takes the stream's next bytes; returns where tagged FPDU `nth`
    /// begins once its first bytes are there.
    fn feed_tagged(&mut self, bytes: &[u8], nth: u64) -> Option<u64> {
        if !self.take(bytes) {
            return None;
        }
        while self.seen.len() as u64 >= self.next + 3 {
            if self.seen[self.next as usize + 2] & 0x80 != 0 {
                if self.tagged == nth {
                    return Some(self.next);
                }
                self.tagged += 1;
            }
            self.skip();
        }
        None
    }

    /// Takes the stream's next bytes; returns where FPDU `nth` begins
    /// once that is known.
    fn feed(&mut self, bytes: &[u8], nth: u64) -> Option<u64> {
        if !self.take(bytes) {
            return None;
        }
        while self.count < nth && self.seen.len() as u64 >= self.next + 2 {
            self.skip();
            self.count += 1;
        }
        (self.count == nth).then_some(self.next)
    }
}

/// The receive buffer of the proxy's sockets in `small_windows` mode.
const SMALL: usize = 4096;

impl Proxy {
    fn start(listen: SocketAddr, to: SocketAddr, mode: Mode) -> Proxy {
        let l = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        if mode.small_windows {
            // (Accepted sockets inherit it.)
            l.set_recv_buffer_size(SMALL).unwrap();
        }
        // (A run just before may have left this port's connections in
        // TIME_WAIT.)
        l.set_reuse_address(true).unwrap();
        l.bind(&listen.into()).unwrap();
        l.listen(16).unwrap();
        let l: TcpListener = l.into();
        l.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let accept = std::thread::spawn(move || {
            let mut pumps = Vec::new();
            let mut n = 0u64;
            while !stop2.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((a, _)) => {
                        let b = socket2::Socket::new(
                            socket2::Domain::IPV4,
                            socket2::Type::STREAM,
                            None,
                        )
                        .unwrap();
                        if mode.small_windows {
                            b.set_recv_buffer_size(SMALL).unwrap();
                        }
                        b.connect(&to.into()).unwrap();
                        let b: TcpStream = b.into();
                        a.set_nonblocking(false).unwrap();
                        for s in [&a, &b] {
                            s.set_nodelay(true).unwrap();
                            s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
                        }
                        let cut = Arc::new(AtomicBool::new(false));
                        let slow = mode.small_windows;
                        let seed = mode.seed.wrapping_add(n * 2);
                        n += 1;
                        let ends = [
                            (
                                a.try_clone().unwrap(),
                                b.try_clone().unwrap(),
                                seed,
                                mode.fault,
                            ),
                            (b, a, seed + 1, mode.back),
                        ];
                        for (from, to, seed, fault) in ends {
                            let (stop, cut) = (stop2.clone(), cut.clone());
                            pumps.push(std::thread::spawn(move || {
                                pump(from, to, Rng(seed), fault, slow, &cut, &stop)
                            }));
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(1))
                    }
                    Err(e) => panic!("proxy accept: {e}"),
                }
            }
            for p in pumps {
                let _ = p.join();
            }
        });
        Proxy {
            stop,
            accept: Some(accept),
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(a) = self.accept.take() {
            let _ = a.join();
        }
    }
}

/// Forwards `from` to `to` in random pieces until either ends or the proxy
/// stops, with `fault`: a flipped bit, or both connections reset after so
/// many bytes (`cut` tells the other direction's pump).
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    mut rng: Rng,
    fault: Fault,
    slow: bool,
    cut: &AtomicBool,
    stop: &AtomicBool,
) {
    let mut buf = vec![0u8; 128 << 10];
    // Bytes written, and read.
    let (mut total, mut read) = (0u64, 0u64);
    let mut framing = Framing::new();
    // Where the FPDU a fault names begins, once known.
    let mut found: Option<u64> = None;
    let reset = |s: &TcpStream| {
        let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
    };
    loop {
        if cut.load(Ordering::Relaxed) {
            // The last descriptor of each socket closes with linger 0: RST.
            reset(&from);
            reset(&to);
            return;
        }
        if stop.load(Ordering::Relaxed) {
            return;
        }
        if let Fault::FreezeAfter(limit) = fault
            && read >= limit
        {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        let mut want = rng.piece().min(buf.len());
        if let Fault::FreezeAfter(limit) = fault {
            want = want.min((limit - read) as usize);
        }
        let n = match from.read(&mut buf[..want]) {
            Ok(0) if matches!(fault, Fault::DropFrom(_)) => {
                // Its end is swallowed too: `to` stays open, silent.
                while !stop.load(Ordering::Relaxed) && !cut.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                return;
            }
            Ok(0) => {
                let _ = to.shutdown(std::net::Shutdown::Write);
                return;
            }
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                continue;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => {
                let _ = to.shutdown(std::net::Shutdown::Both);
                return;
            }
        };
        if let Fault::Flip(at, bit) = fault
            && (read..read + n as u64).contains(&at)
        {
            buf[(at - read) as usize] ^= 1 << bit;
        }
        if let Fault::FlipLength(nth, bit) = fault {
            // (Where it begins is known from the bytes before it.)
            let at = if framing.count == nth {
                Some(framing.next)
            } else {
                framing.feed(&buf[..n], nth)
            };
            if let Some(at) = at
                && (read..read + n as u64).contains(&at)
            {
                buf[(at - read) as usize] ^= 1 << bit;
            }
        }
        if let Fault::FlipTagged(nth, off, bit) = fault {
            let at = found.or_else(|| framing.feed_tagged(&buf[..n], nth));
            found = at;
            if let Some(at) = at
                && (read..read + n as u64).contains(&(at + off))
            {
                buf[(at + off - read) as usize] ^= 1 << bit;
            }
        }
        // Bytes of this read to forward.
        let mut fwd = n;
        if let Fault::DropFrom(nth) = fault {
            let at = if framing.count == nth && framing.next != 0 {
                Some(framing.next)
            } else {
                framing.feed(&buf[..n], nth)
            };
            if let Some(at) = at {
                fwd = at.saturating_sub(read).min(n as u64) as usize;
            }
        }
        read += n as u64;
        let mut off = 0;
        while off < fwd {
            let mut k = rng.piece().min(fwd - off);
            if let Fault::CutAfter(limit) = fault {
                k = k.min((limit - total) as usize);
                if k == 0 {
                    cut.store(true, Ordering::Relaxed);
                    break;
                }
            }
            if to.write_all(&buf[off..off + k]).is_err() {
                let _ = from.shutdown(std::net::Shutdown::Both);
                return;
            }
            off += k;
            total += k as u64;
            // Pauses: often and long with small windows, so that the
            // sender's socket fills and its writes come back short.
            if slow && rng.below(3) == 0 {
                std::thread::sleep(Duration::from_micros(200 + rng.below(2000)));
            } else if rng.below(20) == 0 {
                std::thread::sleep(Duration::from_micros(50 + rng.below(500)));
            }
        }
    }
}

/// A connected pair whose client reaches the server through a proxy at
/// `proxy_ip` (same port: the qualifier).
fn through_proxy(tcp: &Arc<Tcp>, net: u8, params: &str, mode: Mode) -> (Pair, Proxy) {
    log_to_test();
    let (c, s) = (
        Node::new(tcp, &format!("127.0.{net}.1"), params),
        Node::new(tcp, &format!("127.0.{net}.2"), params),
    );
    let p = Pair::new(c, s);
    let proxy_ip: std::net::IpAddr = format!("127.0.{net}.3").parse().unwrap();
    let proxy = Proxy::start(
        SocketAddr::new(proxy_ip, p.qual as u16),
        SocketAddr::new(p.s.ia.address(), p.qual as u16),
        mode,
    );
    let pd = pattern(40, 5);
    p.c.ep.connect(proxy_ip, p.qual, Some(T), &pd).unwrap();
    let cr = next_cr(&p.s.ia, &p.s.cr);
    assert_eq!(cr.private_data(), &pd[..], "the request's private data");
    cr.accept(&p.s.ep, &pattern(30, 6)).unwrap();
    assert_eq!(conn_kind(&p.s.conn), ConnectionEventKind::Established);
    let est = conn_ev(&p.c.conn);
    assert_eq!(est.kind, ConnectionEventKind::Established);
    assert_eq!(
        est.private_data.as_deref(),
        Some(&pattern(30, 6)[..]),
        "the reply's private data"
    );
    (p, proxy)
}

/// Sends of every size class one way (some before their receives, some
/// after), RDMA writes and reads, then large ping-pongs; every byte and
/// completion checked; then a graceful disconnect.
fn conversation(net: u8, params: &str, small_windows: bool) {
    let tcp = Tcp::new();
    let mode = Mode {
        seed: seed(),
        fault: Fault::None,
        small_windows,
        back: Fault::None,
    };
    let (p, _proxy) = through_proxy(&tcp, net, params, mode);

    // Sends: empty, tiny, around the direct-placement size, bulk.
    let sizes = [0usize, 1, 63, 4096, 16_383, 16_384, 20_000, 65_536, 300_001];
    let total: usize = sizes.iter().sum();
    let msgs: Vec<u8> = sizes
        .iter()
        .enumerate()
        .flat_map(|(i, &n)| pattern(n, i as u8 * 11 + 3))
        .collect();
    let src = p.c.lmr(msgs.clone());
    let rbuf = p.s.buf(total);
    let offs: Vec<u64> = sizes
        .iter()
        .scan(0u64, |o, &n| {
            let at = *o;
            *o += n as u64;
            Some(at)
        })
        .collect();
    for (i, &n) in sizes.iter().enumerate().take(4) {
        p.s.recv(&rbuf, offs[i], n as u64, 100 + i as u64);
    }
    for (i, &n) in sizes.iter().enumerate() {
        p.c.send(&src, offs[i], n as u64, i as u64);
    }
    for (i, &n) in sizes.iter().enumerate().skip(4) {
        p.s.recv(&rbuf, offs[i], n as u64, 100 + i as u64);
    }
    for (i, &n) in sizes.iter().enumerate() {
        let r = next_dto(&p.s.rcv);
        assert_eq!(
            (r.cookie, r.status, r.transferred_length),
            (100 + i as u64, DtoStatus::Success, n as u64)
        );
        let d = next_dto(&p.c.req);
        assert_eq!((d.cookie, d.status), (i as u64, DtoStatus::Success));
    }
    assert!(rbuf.to_vec().unwrap() == msgs, "every sent byte in place");

    // RDMA: a write and a read of odd ranges, then a burst of small ones.
    let target = p.s.lmr(pattern(400_000, 9));
    let mut expect = target.to_vec().unwrap();
    let w = pattern(123_457, 2);
    let wsrc = p.c.lmr(w.clone());
    p.c.ep
        .post_rdma_write(
            &[wsrc.triplet(0, w.len() as u64).unwrap()],
            target.rmr_triplet(77, w.len() as u64).unwrap(),
            200,
            D,
        )
        .unwrap();
    expect[77..77 + w.len()].copy_from_slice(&w);
    let sink = p.c.buf(300_000);
    let m = 250_003u64;
    p.c.ep
        .post_rdma_read(
            &[
                sink.triplet(5, 1000).unwrap(),
                sink.triplet(2000, m - 1000).unwrap(),
            ],
            target.rmr_triplet(50, m).unwrap(),
            201,
            D,
        )
        .unwrap();
    for k in 0..16u64 {
        p.c.ep
            .post_rdma_write(
                &[wsrc.triplet(k * 7, 7).unwrap()],
                target.rmr_triplet(300_000 + k * 7, 7).unwrap(),
                202 + k,
                D,
            )
            .unwrap();
        expect[300_000 + k as usize * 7..][..7].copy_from_slice(&w[k as usize * 7..][..7]);
    }
    for k in 200..218 {
        let d = next_dto(&p.c.req);
        assert_eq!((d.cookie, d.status), (k, DtoStatus::Success), "{d:?}");
    }
    // (With `complete=sent` the writes after the read completed once
    // sent: their bytes land a little later.)
    let end = Instant::now() + T;
    while target.to_vec().unwrap() != expect && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(target.to_vec().unwrap() == expect, "the writes, exactly");
    let got = sink.to_vec().unwrap();
    assert!(got[5..1005] == expect[50..1050], "the read's first segment");
    assert!(
        got[2000..2000 + (m - 1000) as usize] == expect[1050..50 + m as usize],
        "the read's second segment"
    );

    // Ping-pong of large and small messages, both ways.
    let big = 200_000usize;
    let (cbuf, sbuf) = (p.c.buf(big), p.s.buf(big));
    let (csrc, ssrc) = (p.c.lmr(pattern(big, 21)), p.s.lmr(pattern(big, 22)));
    for (i, len) in [70_000u64, 64, 131_072, 1, 199_999, 16_384]
        .into_iter()
        .enumerate()
    {
        let (s, c) = round_trip(&p, (&sbuf, &cbuf), (&ssrc, &csrc), len, i as u64, next_dto);
        assert_eq!((s.transferred_length, c.transferred_length), (len, len));
        let n = len as usize;
        assert!(
            sbuf.to_vec().unwrap()[..n] == pattern(big, 21)[..n],
            "round {i}: server"
        );
        assert!(
            cbuf.to_vec().unwrap()[..n] == pattern(big, 22)[..n],
            "round {i}: client"
        );
    }
    if small_windows {
        // More than the sender's socket holds while the proxy pauses: its
        // writes come back short, mid-FPDU.
        let n = 6usize << 20;
        let (src, dst) = (p.c.lmr(pattern(n, 31)), p.s.buf(n));
        p.s.recv(&dst, 0, n as u64, 300);
        p.c.send(&src, 0, n as u64, 301);
        let r = next_dto(&p.s.rcv);
        assert_eq!(
            (r.status, r.transferred_length),
            (DtoStatus::Success, n as u64)
        );
        assert_eq!(next_dto(&p.c.req).status, DtoStatus::Success);
        assert!(dst.to_vec().unwrap() == pattern(n, 31), "the large send");
    }
    for e in [&p.c.req, &p.c.rcv, &p.s.req, &p.s.rcv] {
        empty(e);
    }
    p.c.ep.disconnect(true).unwrap();
    p.expect_end(ConnectionEventKind::Disconnected);
}

#[test]
fn a_conversation_in_random_pieces_crc_on() {
    conversation(150, "crc=1", false);
}

#[test]
fn a_conversation_in_random_pieces_crc_off() {
    conversation(151, "crc=0", false);
}

#[test]
fn a_conversation_in_random_pieces_small_fpdus() {
    conversation(152, "mss=700", false);
}

#[test]
fn a_conversation_in_random_pieces_completing_when_sent() {
    conversation(155, "complete=sent", false);
}

#[test]
fn a_conversation_in_random_pieces_through_small_windows() {
    conversation(154, "crc=1", true);
}

/// The same with a short timeout: the 6 MiB Send's last bytes take longer
/// than it to leave the sender's socket through the small windows, and
/// the answer to its fence comes only behind them. The sender must not
/// take the wait for a silent peer (it broke the connection before).
#[test]
fn a_slow_path_outlasting_a_short_timeout_is_no_silence() {
    conversation(167, "timeout_ms=400", true);
}

/// Every completion of `evd` until `n` arrived (within `T`): cookie →
/// status, each cookie once.
fn collect(evd: &Evd, n: usize) -> HashMap<u64, DtoCompletion> {
    let mut seen = HashMap::new();
    let end = Instant::now() + T;
    while seen.len() < n {
        let left = end.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "{} of {n} completions", seen.len());
        if let Ok((Event::Dto(d), _)) = evd.wait(Some(left), 1) {
            let k = d.cookie;
            assert!(seen.insert(k, d).is_none(), "cookie {k} twice");
        }
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        evd.dequeue().unwrap(),
        None,
        "nothing after the last completion"
    );
    seen
}

/// Collects the completions of requests 0..`n` (cookies) from `evd` and
/// checks that they succeeded up to a point and none after it; returns
/// them and how many succeeded.
fn prefix_ok(evd: &Evd, n: u64) -> (HashMap<u64, DtoCompletion>, u64) {
    let got = collect(evd, n as usize);
    let ok = (0..n)
        .take_while(|i| got[i].status == DtoStatus::Success)
        .count() as u64;
    if let Some(i) = (ok..n).find(|i| got[i].status == DtoStatus::Success) {
        panic!("request {i} succeeded after request {ok} failed");
    }
    (got, ok)
}

/// Posts requests 0..n with `post` until one is refused because the
/// connection broke (a fault may come early: those refused are not
/// requests); returns how many were taken.
fn post_until_broken(n: u64, mut post: impl FnMut(u64) -> Result<()>) -> u64 {
    for i in 0..n {
        match post(i) {
            Ok(()) => {}
            Err(Error::InvalidState { .. }) => return i,
            Err(e) => panic!("request {i}: {e:?}"),
        }
    }
    n
}

/// A fault mid-stream, in the middle of a stream of sends and RDMA
/// writes: both sides see the connection broken, every request completes
/// exactly once (a prefix in success, in order, the rest flushed or in
/// error), and every receive that succeeded holds its bytes.
fn fault_midway(net: u8, params: &str, round: u64, kind: u8) {
    let tcp = Tcp::new();
    let s = seed().wrapping_add(round);
    const N: u64 = 40;
    const LEN: usize = 50_000;
    let mut rng = Rng(s);
    // Past the connection set-up, inside the stream.
    let cut = 200 + rng.below(N * LEN as u64 * 3 / 4);
    let fault = match kind {
        CUT => Fault::CutAfter(cut),
        FLIP => Fault::Flip(cut, rng.below(8) as u8),
        _ => Fault::FlipLength(2 + rng.below(N), rng.below(8) as u8),
    };
    let mode = Mode {
        seed: s,
        fault,
        small_windows: round % 3 == 1,
        back: Fault::None,
    };
    // Placed: the fault comes before the last requests complete.
    let params = format!("{params} complete=placed");
    let (p, _proxy) = through_proxy(&tcp, net, &params, mode);
    let msgs: Vec<u8> = (0..N).flat_map(|i| pattern(LEN, i as u8)).collect();
    let src = p.c.lmr(msgs.clone());
    let rbuf = p.s.buf(N as usize * LEN);
    let target = p.s.buf(LEN);
    for i in 0..N {
        p.s.recv(&rbuf, i * LEN as u64, LEN as u64, 1000 + i);
    }
    let posted = post_until_broken(N, |i| {
        if i % 4 == 3 {
            p.c.ep.post_rdma_write(
                &[src.triplet(i * LEN as u64, LEN as u64).unwrap()],
                target.rmr_triplet(0, LEN as u64).unwrap(),
                i,
                D,
            )
        } else {
            p.c.ep
                .post_send(&[src.triplet(i * LEN as u64, LEN as u64).unwrap()], i, D)
        }
    });
    // The requests: a prefix succeeded, the rest did not.
    let (_, ok) = prefix_ok(&p.c.req, posted);
    let rcvd = collect(&p.s.rcv, N as usize);
    assert_eq!(conn_kind(&p.c.conn), ConnectionEventKind::Broken, "client");
    assert_eq!(conn_kind(&p.s.conn), ConnectionEventKind::Broken, "server");
    assert!(ok < N, "the fault (at byte {cut}) came after every request");
    // The receives: those that succeeded hold their message, in order.
    let mut k = 0;
    for i in 0..N {
        let r = &rcvd[&(1000 + i)];
        if r.status == DtoStatus::Success {
            assert_eq!(r.transferred_length, LEN as u64);
            let msg = (0..N).filter(|j| j % 4 != 3).nth(k).unwrap();
            let at = i as usize * LEN;
            assert!(
                rbuf.to_vec().unwrap()[at..at + LEN] == pattern(LEN, msg as u8)[..],
                "receive {i} holds message {msg}"
            );
            k += 1;
        } else if kind == CUT {
            assert_eq!(r.status, DtoStatus::Flushed, "receive {i}");
        }
        // (After a flip, the receive the corrupted frame went to may end
        // in its own error, LocalLength for one: no longer a Flushed.)
    }
    assert!(k as u64 <= N - N / 4);
    // Every send the client saw succeed was placed (`placed` completions).
    let sent_ok = (0..ok).filter(|i| i % 4 != 3).count();
    assert!(k >= sent_ok, "{k} receives for {sent_ok} placed sends");
}

const CUT: u8 = 0;
const FLIP: u8 = 1;
const FLIP_LENGTH: u8 = 2;

#[test]
fn a_reset_mid_stream_breaks_both_and_completes_everything_once() {
    for round in 0..4 {
        let params = if round % 2 == 0 { "crc=1" } else { "crc=0" };
        fault_midway(153, params, round, CUT);
    }
}

/// With CRC, a bit flipped anywhere in an FPDU is caught: nothing
/// corrupted is delivered, both sides break.
#[test]
fn a_flipped_bit_breaks_both_and_delivers_nothing_corrupted() {
    for round in 0..4 {
        fault_midway(156, "crc=1 timeout_ms=500", round, FLIP);
    }
}

/// A flipped bit in an FPDU's length: the receiver's framing is off. A
/// shorter length fails the CRC; a longer one takes bytes of the FPDUs
/// after it and fails the CRC then, or waits for bytes that never come
/// (the sender waits for its fence's answer) and times out: each ends in
/// a break.
#[test]
fn a_flipped_length_breaks_both_and_delivers_nothing_corrupted() {
    for round in 0..6 {
        fault_midway(157, "crc=1 timeout_ms=500", round, FLIP_LENGTH);
    }
}

/// A Send's length made longer (by 2 KiB, then by 16 KiB) while nothing
/// follows but its fence: the receiver waits for bytes that never come,
/// the sender for the fence's answer. Within the IA's `timeout_ms` of the
/// last byte the receiver gives up on the frame (an MPA Terminate: the
/// Send completes `RemoteResponder`) or the sender on the answer (the
/// Send is flushed), whichever comes first: both sides break and the
/// receive is flushed. With `complete=sent` no fence follows and the
/// sender, its Send complete, waits for nothing: the receiver's frame
/// timer alone ends the connection.
#[test]
fn a_frame_whose_bytes_never_come_breaks_both_within_the_timeout() {
    let placed = "crc=1 timeout_ms=300 complete=placed";
    let sent = "crc=1 timeout_ms=300 complete=sent";
    for (bit, params) in [(3u8, placed), (6, placed), (3, sent)] {
        let tcp = Tcp::new();
        let mode = Mode {
            seed: u64::from(bit),
            // FPDU 1: the Send (0 is the RTR).
            fault: Fault::FlipLength(1, bit),
            small_windows: false,
            back: Fault::None,
        };
        let (p, _proxy) = through_proxy(&tcp, 158, params, mode);
        let rbuf = p.s.buf(64 << 10);
        p.s.recv(&rbuf, 0, 64 << 10, 1);
        let src = p.c.lmr(pattern(1000, 3));
        let t0 = Instant::now();
        p.c.send(&src, 0, 1000, 2);
        let d = collect(&p.c.req, 1)[&2].clone();
        if params == sent {
            assert_eq!(d.status, DtoStatus::Success, "{params}: written: {d:?}");
        } else {
            assert!(
                matches!(d.status, DtoStatus::RemoteResponder | DtoStatus::Flushed),
                "bit {bit}: {d:?}"
            );
        }
        assert_eq!(conn_kind(&p.c.conn), ConnectionEventKind::Broken);
        let waited = t0.elapsed();
        assert!(
            waited >= Duration::from_millis(250) && waited < Duration::from_secs(5),
            "bit {bit}, {params}: broken after {waited:?}"
        );
        assert_eq!(collect(&p.s.rcv, 1)[&1].status, DtoStatus::Flushed);
        // (What a flushed receive's buffer holds is undefined: the
        // frame's first bytes may be there.)
        assert_eq!(conn_kind(&p.s.conn), ConnectionEventKind::Broken);
        assert_eq!(p.c.ep.state(), EpState::Disconnected);
        assert_eq!(p.s.ep.state(), EpState::Disconnected);
    }
}

/// The proxy stops reading from the client mid-stream, the connection
/// held open (a peer alive, its kernel acknowledging, its process no
/// longer reading): the client's socket fills, and TCP's user timeout
/// or its unanswered fence (`timeout_ms` either) breaks its side, or the
/// server's Terminate does: the server's frame stops mid-way and its own
/// timer breaks the other; every request completes once.
#[test]
fn a_peer_that_stops_reading_breaks_both_within_the_timeout() {
    let (p, _proxy, ok, t0, _bufs) =
        sends_until_reading_stops(159, "crc=1 complete=placed", Fault::None);
    let waited = t0.elapsed();
    assert!(waited < Duration::from_secs(5), "broken after {waited:?}");
    let rcvd = collect(&p.s.rcv, SR_N as usize);
    let placed = (0..SR_N)
        .filter(|i| rcvd[&(1000 + i)].status == DtoStatus::Success)
        .count() as u64;
    assert!(placed >= ok, "{placed} receives for {ok} placed sends");
    p.expect_end(ConnectionEventKind::Broken);
}

/// The same with `complete=sent`, the proxy swallowing the server's
/// stream too (all but its MPA Reply): no fence waits for an answer and
/// no Terminate of the server reaches the client, so only TCP's user
/// timeout (`timeout_ms`, while the client's data sits before a closed
/// window) can end the client's side; the server's frame timer ends the
/// other. Sends written before the stop succeed, the rest are flushed,
/// each once. (Linux aborts a connection whose zero-window probes outlast
/// the user timeout since 5.11.)
#[test]
fn a_peer_that_stops_reading_both_ways_breaks_the_sender_by_tcps_timeout() {
    let (p, _proxy, _, t0, _bufs) =
        sends_until_reading_stops(166, "crc=1 complete=sent", Fault::DropFrom(0));
    assert_eq!(conn_kind(&p.c.conn), ConnectionEventKind::Broken, "client");
    let waited = t0.elapsed();
    assert!(waited < Duration::from_secs(5), "broken after {waited:?}");
    collect(&p.s.rcv, SR_N as usize);
    assert_eq!(conn_kind(&p.s.conn), ConnectionEventKind::Broken, "server");
}

/// A heartbeat whose answer never comes (the peer's process stopped
/// while its kernel acknowledges; here the proxy swallows the server's
/// stream) holds back no completion: with `complete=sent` the Sends
/// posted behind it complete once written, in success, the connection
/// stays up (a heartbeat's answer is not owed) and ends gracefully.
#[test]
fn an_unanswered_heartbeat_holds_back_no_completion() {
    let tcp = Tcp::new();
    let mode = Mode {
        seed: seed(),
        fault: Fault::None,
        small_windows: false,
        back: Fault::DropFrom(0),
    };
    let (p, _proxy) = through_proxy(&tcp, 169, "timeout_ms=400 complete=sent", mode);
    // Idle past half the timeout: both sides ask (one Tcp counts both).
    let end = Instant::now() + T;
    while tcp.heartbeats() < 2 {
        assert!(Instant::now() < end, "no heartbeat");
        std::thread::sleep(Duration::from_millis(5));
    }
    let rbuf = p.s.buf(2000);
    let src = p.c.lmr(pattern(2000, 7));
    for i in 0..2u64 {
        p.s.recv(&rbuf, i * 1000, 1000, 10 + i);
        p.c.send(&src, i * 1000, 1000, i);
        let r = next_dto(&p.s.rcv);
        assert_eq!((r.cookie, r.status), (10 + i, DtoStatus::Success));
        // Written at once: its completion is due then, not after the
        // heartbeat's answer.
        let d = match p.c.req.wait(Some(Duration::from_secs(3)), 1) {
            Ok((Event::Dto(d), _)) => d,
            other => panic!("send {i}: no completion behind the heartbeat: {other:?}"),
        };
        assert_eq!((d.cookie, d.status), (i, DtoStatus::Success));
    }
    assert!(rbuf.to_vec().unwrap() == pattern(2000, 7), "both sends");
    // Two timeouts later: still connected, nothing else happened.
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(p.c.ep.state(), EpState::Connected);
    empty(&p.c.conn);
    empty(&p.c.req);
    // The heartbeats still unanswered: a graceful end all the same.
    p.c.ep.disconnect(true).unwrap();
    p.expect_end(ConnectionEventKind::Disconnected);
}

/// Sends of [`sends_until_reading_stops`].
const SR_N: u64 = 200;

/// A pair through a proxy that stops reading from the client after 300 KB
/// (small windows; the server's stream as `back` says), `timeout_ms=500`
/// beside `params`; the client posts 200 Sends of 50 KB, the server a
/// receive for each. Returns the pair, the proxy, how many Sends
/// succeeded (a prefix: checked), when they were posted, and the regions
/// (the receives are still posted).
fn sends_until_reading_stops(
    net: u8,
    params: &str,
    back: Fault,
) -> (Pair, Proxy, u64, Instant, [Lmr; 2]) {
    let tcp = Tcp::new();
    let mode = Mode {
        seed: seed(),
        fault: Fault::FreezeAfter(300_000),
        small_windows: true,
        back,
    };
    let params = format!("{params} timeout_ms=500");
    let (p, proxy) = through_proxy(&tcp, net, &params, mode);
    const LEN: u64 = 50_000;
    let src = p.c.lmr(pattern((SR_N * LEN) as usize, 1));
    let rbuf = p.s.buf((SR_N * LEN) as usize);
    for i in 0..SR_N {
        p.s.recv(&rbuf, i * LEN, LEN, 1000 + i);
    }
    let t0 = Instant::now();
    for i in 0..SR_N {
        p.c.send(&src, i * LEN, LEN, i);
    }
    let (_, ok) = prefix_ok(&p.c.req, SR_N);
    assert!(
        ok < SR_N,
        "every send completed through a proxy that stopped"
    );
    (p, proxy, ok, t0, [src, rbuf])
}

/// Without CRC a bit flipped in an RDMA Write's STag or tagged offset
/// goes undetected by MPA, so the target's checks are all that stands
/// between it and memory the peer was not granted: 1 KiB writes (an FPDU
/// each) through a window on the middle third of a region, one of them
/// flipped: in the STag; in the offset's high bytes (the write leaves the
/// window: refused, both sides break); in its lowest byte (it stays
/// inside: placed at the wrong place, which only a CRC would catch, and
/// the connection goes on). The thirds around the window never change;
/// every request completes once, a prefix in success; a connection the
/// flip did not break still disconnects cleanly.
#[test]
fn a_flipped_tagged_field_without_crc_stays_inside_the_grant() {
    const N: u64 = 48;
    const WL: u64 = 1 << 10;
    const LEN: u64 = 64 << 10;
    for round in 0..9u64 {
        let tcp = Tcp::new();
        let s = seed().wrapping_add(round);
        let mut rng = Rng(s);
        let off = match round % 3 {
            0 => 4 + rng.below(4),
            1 => 8 + rng.below(6),
            _ => 15,
        };
        let mode = Mode {
            seed: s,
            // (Tagged FPDU 0 is the RTR, a zero-length Write that places
            // nothing; 1.. are the writes. Not the first write: a low
            // offset bit flipped there may reach below the window.)
            fault: Fault::FlipTagged(2 + rng.below(N - 2), off, rng.below(8) as u8),
            small_windows: false,
            back: Fault::None,
        };
        let (p, _proxy) = through_proxy(&tcp, 165, "crc=0 mss=auto complete=placed", mode);
        let whole = p.s.buf(3 * LEN as usize);
        let rmr = p.s.pz.rmr_create().unwrap();
        p.s.ep
            .post_rmr_bind(
                &rmr,
                &whole,
                whole.triplet(LEN, LEN).unwrap(),
                MemPriv::REMOTE_READ | MemPriv::REMOTE_WRITE,
                1,
                D,
            )
            .unwrap();
        assert_eq!(next_dto(&p.s.req).status, DtoStatus::Success, "the bind");
        let src: Vec<u8> = (0..N).flat_map(|i| pattern(WL as usize, i as u8)).collect();
        let src = p.c.lmr(src);
        let posted = post_until_broken(N, |i| {
            p.c.ep.post_rdma_write(
                &[src.triplet(i * WL, WL).unwrap()],
                rmr.triplet(i * WL, WL).unwrap(),
                i,
                D,
            )
        });
        let (_, ok) = prefix_ok(&p.c.req, posted);
        let held = whole.to_vec().unwrap();
        let (lo, hi) = (LEN as usize, 2 * LEN as usize);
        let stray = held[..lo]
            .iter()
            .chain(&held[hi..])
            .filter(|&&b| b != 0)
            .count();
        assert_eq!(stray, 0, "round {round}: bytes outside the window changed");
        match round % 3 {
            1 => assert!(ok < N, "round {round}: a write left the window unrefused"),
            2 => {
                assert_eq!(ok, N, "round {round}: a write inside the window refused");
                // (The flip happened: one write sits a little off its place.)
                let want: Vec<u8> = (0..N).flat_map(|i| pattern(WL as usize, i as u8)).collect();
                let window = &held[lo..lo + want.len()];
                assert!(window != &want[..], "round {round}: no write misplaced");
            }
            _ => {}
        }
        if ok < N {
            p.expect_end(ConnectionEventKind::Broken);
        } else {
            p.c.ep.disconnect(true).unwrap();
            p.expect_end(ConnectionEventKind::Disconnected);
        }
    }
}

/// The server's answers never reach the client: the proxy drops the
/// server's stream from its first FPDU on, its kernel still acknowledging
/// (a peer process stopped or hung, a middlebox that swallows frames). A
/// read, or on `placed` a Send (whose fence is a read), waits for an
/// answer that never comes, no frame open: within the IA's `timeout_ms`
/// the client gives up, both sides break, and the request completes
/// once, not in success (the Send was placed, but nothing says so).
#[test]
fn an_answer_that_never_comes_breaks_both_within_the_timeout() {
    for (net, read) in [(163u8, true), (164, false)] {
        let tcp = Tcp::new();
        let mode = Mode::answers_dropped();
        let (p, _proxy) = through_proxy(&tcp, net, "crc=1 timeout_ms=300 complete=placed", mode);
        let src = pattern(1000, 4);
        let target = p.s.lmr(src.clone());
        let (sink, rbuf) = (p.c.buf(1000), p.s.buf(1000));
        let t0 = Instant::now();
        if read {
            p.c.ep
                .post_rdma_read(
                    &[sink.triplet(0, 1000).unwrap()],
                    target.rmr_triplet(0, 1000).unwrap(),
                    1,
                    D,
                )
                .unwrap();
        } else {
            p.s.recv(&rbuf, 0, 1000, 7);
            let l = p.c.lmr(src.clone());
            p.c.send(&l, 0, 1000, 1);
            let r = collect(&p.s.rcv, 1)[&7].clone();
            assert_eq!(
                (r.status, r.transferred_length),
                (DtoStatus::Success, 1000),
                "{r:?}"
            );
            assert!(rbuf.to_vec().unwrap() == src, "the Send placed");
        }
        let d = collect(&p.c.req, 1)[&1].clone();
        let waited = t0.elapsed();
        assert_ne!(d.status, DtoStatus::Success, "read {read}: {d:?}");
        assert!(
            waited >= Duration::from_millis(250) && waited < Duration::from_secs(5),
            "read {read}: broken after {waited:?}"
        );
        p.expect_end(ConnectionEventKind::Broken);
    }
}

/// Requests complete in order, and a connection's end flushes every one
/// still outstanding. On `complete=sent` a Send handed to TCP behind a
/// read whose answer never comes waits for the read; when the timeout
/// breaks the connection both are flushed, the Send included: no success
/// after a flush in one endpoint's stream (verbs and DAT flush every
/// request behind the first that did not complete).
#[test]
fn a_send_behind_an_unanswered_read_is_flushed_with_it() {
    let tcp = Tcp::new();
    let mode = Mode::answers_dropped();
    let (p, _proxy) = through_proxy(&tcp, 168, "crc=1 timeout_ms=300 complete=sent", mode);
    let src = pattern(1000, 4);
    let target = p.s.lmr(src.clone());
    let (sink, rbuf) = (p.c.buf(1000), p.s.buf(1000));
    p.s.recv(&rbuf, 0, 1000, 7);
    p.c.ep
        .post_rdma_read(
            &[sink.triplet(0, 1000).unwrap()],
            target.rmr_triplet(0, 1000).unwrap(),
            1,
            D,
        )
        .unwrap();
    let l = p.c.lmr(src.clone());
    p.c.send(&l, 0, 1000, 2);
    // The Send reached the server (its answers are what the proxy drops).
    let r = collect(&p.s.rcv, 1)[&7].clone();
    assert_eq!(r.status, DtoStatus::Success, "{r:?}");
    let got = collect(&p.c.req, 2);
    assert_eq!(
        (got[&1].status, got[&2].status),
        (DtoStatus::Flushed, DtoStatus::Flushed),
        "{got:?}"
    );
    p.expect_end(ConnectionEventKind::Broken);
}

/// With CRC, a bit flipped in what the server sends back (RDMA Read
/// Responses, straight into the client's sinks), anywhere or in an FPDU's
/// length: both sides break, each read completes once, and no read that
/// succeeded holds a wrong byte.
#[test]
fn a_flipped_bit_in_read_responses_breaks_both() {
    for round in 0..8u64 {
        let tcp = Tcp::new();
        const N: u64 = 20;
        const LEN: u64 = 50_000;
        let s = seed().wrapping_add(round);
        let mut rng = Rng(s);
        let mode = Mode {
            seed: s,
            fault: Fault::None,
            small_windows: round % 2 == 1,
            back: if round < 4 {
                Fault::Flip(200 + rng.below(N * LEN * 3 / 4), rng.below(8) as u8)
            } else {
                Fault::FlipLength(1 + rng.below(N), rng.below(8) as u8)
            },
        };
        let (p, _proxy) = through_proxy(&tcp, 160, "crc=1 timeout_ms=500", mode);
        let data = pattern((N * LEN) as usize, 5);
        let target = p.s.lmr(data.clone());
        let sink = p.c.buf((N * LEN) as usize);
        let posted = post_until_broken(N, |i| {
            p.c.ep.post_rdma_read(
                &[sink.triplet(i * LEN, LEN).unwrap()],
                target.rmr_triplet(i * LEN, LEN).unwrap(),
                i,
                D,
            )
        });
        let (_, ok) = prefix_ok(&p.c.req, posted);
        assert!(
            ok < N,
            "round {round}: every read succeeded past a flipped bit"
        );
        let held = sink.to_vec().unwrap();
        for i in 0..ok {
            let r = (i * LEN) as usize..((i + 1) * LEN) as usize;
            assert!(
                held[r.clone()] == data[r],
                "round {round}: read {i} succeeded with wrong bytes"
            );
        }
        p.expect_end(ConnectionEventKind::Broken);
    }
}

/// One provider, two connections through proxies: while one waits inside a
/// frame whose bytes never come, until its timeout breaks it, the other
/// keeps moving data, every byte checked, and stays connected.
#[test]
fn a_stalled_connection_leaves_the_others_alone() {
    let tcp = Tcp::new();
    let params = "crc=1 timeout_ms=300 complete=placed";
    let bad_mode = Mode {
        seed: 6,
        fault: Fault::FlipLength(1, 6),
        small_windows: false,
        back: Fault::None,
    };
    let good_mode = Mode {
        seed: seed(),
        fault: Fault::None,
        small_windows: false,
        back: Fault::None,
    };
    let (bad, _p1) = through_proxy(&tcp, 161, params, bad_mode);
    let (good, _p2) = through_proxy(&tcp, 162, params, good_mode);
    let rbuf = bad.s.buf(64 << 10);
    bad.s.recv(&rbuf, 0, 64 << 10, 1);
    let src = bad.c.lmr(pattern(1000, 3));
    bad.c.send(&src, 0, 1000, 2);
    const LEN: u64 = 20_000;
    let (sbuf, cbuf) = (good.s.buf(LEN as usize), good.c.buf(LEN as usize));
    let (ssrc, csrc) = (
        good.s.lmr(pattern(LEN as usize, 7)),
        good.c.lmr(pattern(LEN as usize, 8)),
    );
    let t0 = Instant::now();
    let mut rounds = 0u64;
    let mut broke = None;
    // Round trips until well past the bad one's break.
    while broke.is_none_or(|b: Duration| t0.elapsed() < b + Duration::from_millis(200)) {
        assert!(t0.elapsed() < T, "the stalled connection never broke");
        round_trip(&good, (&sbuf, &cbuf), (&ssrc, &csrc), LEN, rounds, next_dto);
        assert!(
            sbuf.to_vec().unwrap() == pattern(LEN as usize, 8),
            "round {rounds}"
        );
        assert!(
            cbuf.to_vec().unwrap() == pattern(LEN as usize, 7),
            "round {rounds}"
        );
        rounds += 1;
        if broke.is_none() && bad.c.req.dequeue().unwrap().is_some() {
            broke = Some(t0.elapsed());
        }
    }
    let b = broke.unwrap();
    assert!(b >= Duration::from_millis(250), "broke after {b:?}");
    assert!(rounds > 10, "{rounds} round trips while the other stalled");
    assert_eq!(collect(&bad.s.rcv, 1)[&1].status, DtoStatus::Flushed);
    bad.expect_end(ConnectionEventKind::Broken);
    assert_eq!(good.c.ep.state(), EpState::Connected);
    good.c.ep.disconnect(true).unwrap();
    good.expect_end(ConnectionEventKind::Disconnected);
}
