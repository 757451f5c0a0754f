//! Helpers of the TCP provider's tests: IAs on 127.x addresses, nodes (an
//! IA, a PZ, one EVD per stream, an endpoint), listening on a free port,
//! and "the next event within T" helpers. Every wait is bounded.
#![allow(dead_code)]

use rdapl::*;
use rdapl_tcp::Tcp;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The bound of every wait for an event.
pub const T: Duration = Duration::from_secs(10);
pub const D: CompletionFlags = CompletionFlags::DEFAULT;

/// An IA of `tcp` at `addr` with extra `params`.
pub fn ia(tcp: &Arc<Tcp>, addr: &str, params: &str) -> Ia {
    let opts = IaOptions {
        params: format!("addr={addr} {params}"),
        ..Default::default()
    };
    Ia::open_provider(tcp.clone(), opts).unwrap()
}

/// A port this process has not used yet (a per-process base, so that
/// test binaries running at once rarely meet; `listen` retries anyway).
pub fn next_port() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    20_000 + (u64::from(std::process::id() % 400) * 100 + n) % 40_000
}

/// A PSP of `ia` on a free qualifier (= port), retrying while in use.
pub fn listen(ia: &Ia, cr: &Evd) -> (Psp, u64) {
    for _ in 0..200 {
        let q = next_port();
        match ia.psp_create(q, cr) {
            Ok(p) => return (p, q),
            Err(Error::ConnQualInUse(_)) => continue,
            Err(e) => panic!("psp_create: {e:?}"),
        }
    }
    panic!("no free port");
}

pub fn next(evd: &Evd) -> Event {
    evd.wait(Some(T), 1).expect("an event within the timeout").0
}

pub fn next_dto(evd: &Evd) -> DtoCompletion {
    match next(evd) {
        Event::Dto(d) => d,
        e => panic!("expected a DTO completion, got {e:?}"),
    }
}

/// The next DTO completion of `evd` by busy `dequeue` (within `T`).
#[allow(dead_code)] // not every test file polls
pub fn poll_dto(evd: &Evd) -> DtoCompletion {
    let end = std::time::Instant::now() + T;
    loop {
        match evd.dequeue().unwrap() {
            Some(Event::Dto(d)) => return d,
            Some(e) => panic!("expected a DTO completion, got {e:?}"),
            None => assert!(std::time::Instant::now() < end, "no completion"),
        }
    }
}

pub fn conn_ev(evd: &Evd) -> ConnectionEvent {
    match next(evd) {
        Event::Connection(c) => c,
        e => panic!("expected a connection event, got {e:?}"),
    }
}

pub fn conn_kind(evd: &Evd) -> ConnectionEventKind {
    conn_ev(evd).kind
}

pub fn next_cr(ia: &Ia, cr: &Evd) -> Cr {
    match next(cr) {
        Event::ConnectionRequest(a) => ia.cr(a.cr).unwrap(),
        e => panic!("expected a connection request, got {e:?}"),
    }
}

pub fn empty(evd: &Evd) {
    assert_eq!(evd.dequeue().unwrap(), None, "no further event expected");
}

/// Expects `Flushed` completions with these cookies, in order, and nothing else.
pub fn flushed(evd: &Evd, cookies: &[u64]) {
    for &k in cookies {
        let d = next_dto(evd);
        assert_eq!((d.cookie, d.status), (k, DtoStatus::Flushed), "{d:?}");
    }
    empty(evd);
}

/// `target`'s first 64 bytes under a forged key: its own with the low
/// byte flipped.
#[allow(dead_code)] // not every test file forges keys
pub fn forged_key(target: &Lmr) -> RmrTriplet {
    let mut t = target.rmr_triplet(0, 64).unwrap();
    t.rmr_context ^= 0xFF;
    t
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed) ^ ((i >> 8) as u8))
        .collect()
}

pub struct Node {
    pub ia: Ia,
    pub pz: Pz,
    pub req: Evd,
    pub rcv: Evd,
    pub conn: Evd,
    pub cr: Evd,
    pub ep: Ep,
}

impl Node {
    pub fn new(tcp: &Arc<Tcp>, addr: &str, params: &str) -> Node {
        Node::with(ia(tcp, addr, params), 256)
    }

    pub fn with(ia: Ia, qlen: usize) -> Node {
        Node::with_attr(ia, qlen, None)
    }

    /// A node whose endpoint has these attributes.
    pub fn with_attr(ia: Ia, qlen: usize, attr: Option<EpAttr>) -> Node {
        let pz = ia.pz_create().unwrap();
        let req = ia.evd_create(qlen, EvdFlags::DTO).unwrap();
        let rcv = ia.evd_create(qlen, EvdFlags::DTO).unwrap();
        let conn = ia.evd_create(qlen, EvdFlags::CONNECTION).unwrap();
        let cr = ia.evd_create(qlen, EvdFlags::CR).unwrap();
        let ep = ia
            .ep_create(&pz, Some(&rcv), Some(&req), Some(&conn), attr)
            .unwrap();
        Node {
            ia,
            pz,
            req,
            rcv,
            conn,
            cr,
            ep,
        }
    }

    pub fn ep2(&self) -> Ep {
        self.ia
            .ep_create(
                &self.pz,
                Some(&self.rcv),
                Some(&self.req),
                Some(&self.conn),
                None,
            )
            .unwrap()
    }

    pub fn buf(&self, len: usize) -> Lmr {
        self.pz
            .lmr_create(Region::zeroed(len), MemPriv::ALL)
            .unwrap()
    }

    pub fn lmr(&self, data: Vec<u8>) -> Lmr {
        self.pz.lmr_create_from(data, MemPriv::ALL).unwrap()
    }

    pub fn recv(&self, lmr: &Lmr, off: u64, len: u64, cookie: u64) {
        self.ep
            .post_recv(&[lmr.triplet(off, len).unwrap()], cookie, D)
            .unwrap();
    }

    pub fn send(&self, lmr: &Lmr, off: u64, len: u64, cookie: u64) {
        self.ep
            .post_send(&[lmr.triplet(off, len).unwrap()], cookie, D)
            .unwrap();
    }
}

/// One round trip of a pair: each side posts a receive of `len` bytes at
/// the start of its buffer, the client sends `csrc`, the server answers
/// with `ssrc` once it has it; `next` takes every completion (waiting or
/// polling). Both sends must succeed; returns the server's and the
/// client's receive completions.
#[allow(dead_code)] // not every test file runs round trips
pub fn round_trip(
    p: &Pair,
    (sbuf, cbuf): (&Lmr, &Lmr),
    (ssrc, csrc): (&Lmr, &Lmr),
    len: u64,
    i: u64,
    next: fn(&Evd) -> DtoCompletion,
) -> (DtoCompletion, DtoCompletion) {
    p.s.recv(sbuf, 0, len, i);
    p.c.recv(cbuf, 0, len, i);
    p.c.send(csrc, 0, len, i);
    let s = next(&p.s.rcv);
    assert_eq!(s.status, DtoStatus::Success);
    p.s.send(ssrc, 0, len, i);
    let c = next(&p.c.rcv);
    assert_eq!(c.status, DtoStatus::Success);
    assert_eq!(next(&p.c.req).status, DtoStatus::Success);
    assert_eq!(next(&p.s.req).status, DtoStatus::Success);
    (s, c)
}

/// A client and a server listening on a free port.
pub struct Pair {
    pub c: Node,
    pub s: Node,
    pub psp: Psp,
    pub qual: u64,
}

impl Pair {
    pub fn new(c: Node, s: Node) -> Pair {
        let (psp, qual) = listen(&s.ia, &s.cr);
        Pair { c, s, psp, qual }
    }

    /// Two IAs of one provider at `client`/`server`, connected.
    pub fn connected(tcp: &Arc<Tcp>, client: &str, server: &str, params: &str) -> Pair {
        let p = Pair::new(
            Node::new(tcp, client, params),
            Node::new(tcp, server, params),
        );
        p.connect();
        p
    }

    /// Like [`Pair::connected`], with a provider instance per side (each
    /// side's system calls counted alone): the client's instance, the
    /// server's and the pair.
    pub fn apart(client: &str, server: &str, params: &str) -> (Arc<Tcp>, Arc<Tcp>, Pair) {
        let (tc, ts) = (Tcp::new(), Tcp::new());
        let p = Pair::new(
            Node::new(&tc, client, params),
            Node::new(&ts, server, params),
        );
        p.connect();
        (tc, ts, p)
    }

    pub fn connect(&self) {
        self.c
            .ep
            .connect(self.s.ia.address(), self.qual, Some(T), b"")
            .unwrap();
        next_cr(&self.s.ia, &self.s.cr)
            .accept(&self.s.ep, b"")
            .unwrap();
        assert_eq!(conn_kind(&self.s.conn), ConnectionEventKind::Established);
        assert_eq!(conn_kind(&self.c.conn), ConnectionEventKind::Established);
    }

    pub fn expect_end(&self, kind: ConnectionEventKind) {
        assert_eq!(conn_kind(&self.c.conn), kind, "client");
        assert_eq!(conn_kind(&self.s.conn), kind, "server");
        assert_eq!(self.c.ep.state(), EpState::Disconnected);
        assert_eq!(self.s.ep.state(), EpState::Disconnected);
    }

    pub fn reconnect(&self) {
        self.c.ep.reset().unwrap();
        self.s.ep.reset().unwrap();
        self.connect();
    }
}

// ----- child processes ----------------------------------------------------

/// A child process of a test, killed and reaped when dropped (a test that
/// fails early leaves nothing running).
pub struct Reap(pub std::process::Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `cmd` with its stdout piped (stderr inherited); returns it and
/// its stdout, line by line.
pub fn spawn_lines(mut cmd: std::process::Command) -> (Reap, std::sync::mpsc::Receiver<String>) {
    use std::io::{BufRead, BufReader};
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (Reap(child), rx)
}

/// The rest of the child's next line containing `prefix`, within `t`
/// (libtest may print "test child ... " before it on the same line).
pub fn expect_line(rx: &std::sync::mpsc::Receiver<String>, prefix: &str, t: Duration) -> String {
    let end = std::time::Instant::now() + t;
    // The lines passed over, the last ones shown if the awaited one never
    // comes (what the child said instead).
    let mut other = std::collections::VecDeque::new();
    loop {
        let left = end.saturating_duration_since(std::time::Instant::now());
        let Ok(line) = rx.recv_timeout(left) else {
            let said: Vec<String> = other.into_iter().collect();
            panic!(
                "the child never said {prefix:?} within {t:?}; it said meanwhile:\n{}",
                said.join("\n")
            );
        };
        if let Some(at) = line.find(prefix) {
            return line[at + prefix.len()..].trim().to_string();
        }
        if other.len() == 40 {
            other.pop_front();
        }
        other.push_back(line);
    }
}

/// The provider's info log into the test's captured output (the
/// provider's threads spawned by a test inherit its capture): shown when
/// the test fails.
pub fn log_to_test() {
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_test_writer()
        .try_init();
}

/// The provider's info log to stdout: in a child, among the lines its
/// test reads ([`expect_line`] shows them when the awaited one never
/// comes).
pub fn log_to_stdout() {
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_writer(std::io::stdout)
        .try_init();
}

/// The lines a child says within `t`.
pub fn lines_within(rx: &std::sync::mpsc::Receiver<String>, t: Duration) -> Vec<String> {
    let end = std::time::Instant::now() + t;
    let mut said = Vec::new();
    while let Ok(line) = rx.recv_timeout(end.saturating_duration_since(std::time::Instant::now())) {
        said.push(line);
    }
    said
}

/// A small generator (xorshift) for randomized tests, seeded per run.
pub struct Rng(pub u64);

impl Rng {
    /// A value below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// A seed for a randomized test: `var` if set (to replay a run), else the
/// clock; never zero.
pub fn seed_from(var: &str) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
        | 1
}

/// A thread that posts receives late, as a consumer that refills them
/// from another thread does: receive `n` into slot `n % slots` of `buf`
/// (slots of `len` bytes, cookie `n`) with `post`, at most `ahead` beyond
/// `consumed`, each after a random pause of up to 200 µs, until `stop`
/// (bounded by `bound`).
pub fn late_poster(
    post: impl Fn(&[LmrTriplet], u64) + Send + 'static,
    (buf, slots, len): (Lmr, u64, u64),
    (consumed, ahead): (Arc<AtomicU64>, u64),
    stop: Arc<std::sync::atomic::AtomicBool>,
    (seed, bound): (u64, Duration),
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut rng = Rng(seed ^ 0x5eed);
        let mut posted = 0u64;
        let end = std::time::Instant::now() + bound;
        while !stop.load(Ordering::Acquire) {
            assert!(
                std::time::Instant::now() < end,
                "seed {seed}: the poster ran too long"
            );
            if posted < consumed.load(Ordering::Acquire) + ahead {
                std::thread::sleep(Duration::from_micros(rng.below(200)));
                post(&[buf.triplet((posted % slots) * len, len).unwrap()], posted);
                posted += 1;
            } else {
                std::thread::yield_now();
            }
        }
    })
}
