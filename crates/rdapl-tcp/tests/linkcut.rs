//! Two hosts in network namespaces joined by a veth pair; the link is cut
//! mid-transfer, and again under an idle connection, with a timeout that
//! keepalive keeps and with one under its whole second (the provider's
//! heartbeats' case).
//! Once more mid-transfer after the link's MTU fell: the sender's FPDUs
//! must follow the smaller MSS first.
//! Both sides must see the connection broken within the
//! configured `timeout_ms` (plus a few hundred milliseconds), with
//! every outstanding request completed exactly once (`Flushed` if it did
//! not finish) and nothing after.
//!
//! The namespaces, the veth pair and the addresses (10.201.x.1 and .2) are
//! this test's own, made and removed by it. Making them needs root (or
//! CAP_SYS_ADMIN) and `ip` (iproute2); without them the test is skipped
//! with a message, unless `RDAPL_REQUIRE_EXTERNAL=1` (CI), where that fails.

mod common;

use common::*;
use rdapl::*;
use rdapl_conformance::hosts::Hosts;
use rdapl_tcp::Tcp;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const ENV: &str = "RDAPL_TCP_LINKCUT_CHILD";
/// The configured timeout under test.
const TIMEOUT_MS: u64 = 2_000;
/// A timeout shorter than keepalive's period of a second: only the
/// provider's heartbeats can ask an idle peer often enough.
const SHORT_TIMEOUT_MS: u64 = 500;
/// The allowance on top of the timeout: the provider's thread waking,
/// the child printing. The kernel's own timers come round up to 1.25 s
/// late (a side probing a closed window at the cut counts from its first
/// probe; keepalive cannot keep a timeout under two seconds), which the
/// provider's watchdog of a silent peer must not leave to them; nor may
/// a side whose socket is full wait for the kernel to give it up before
/// it completes its requests (about 240 ms late, when the Terminate
/// waited for room in the socket).
const SLACK: Duration = Duration::from_millis(200);
const WINDOW: u64 = 64;
const SIZE: u64 = 64 << 10;
/// Receives each side posts and never has consumed.
const IDLE_RECVS: u64 = 8;

fn skip_or_fail(why: &str) {
    rdapl_conformance::support::skip_or_fail("link-cut test", why);
}

/// Runs this binary's `child` in namespace `ns` with `args`; returns it
/// and its stdout lines.
fn spawn(ns: &str, args: &str) -> (Reap, mpsc::Receiver<String>) {
    let mut cmd = Hosts::command(ns, std::env::current_exe().unwrap());
    cmd.args(["child", "--exact", "--nocapture", "--test-threads=1"])
        .env(ENV, args);
    spawn_lines(cmd)
}

/// What a side saw of its requests once the connection ended.
#[derive(Default)]
struct Tally {
    seen: Vec<u8>,
    ok: u64,
    flushed: u64,
}

impl Tally {
    fn take(&mut self, d: &DtoCompletion) {
        let n = &mut self.seen[d.cookie as usize];
        assert_eq!(*n, 0, "cookie {} completed twice: {d:?}", d.cookie);
        *n = 1;
        match d.status {
            DtoStatus::Success => self.ok += 1,
            DtoStatus::Flushed => self.flushed += 1,
            s => panic!("unexpected status {s:?} for {d:?}"),
        }
    }
}

/// Waits for the end of the connection and for every request (not the
/// receives) to complete; returns the end's kind. Bounded by `limit`.
fn drain(n: &Node, t: &mut Tally, posted: u64, limit: Instant) -> ConnectionEventKind {
    let mut ended = None;
    loop {
        if ended.is_none()
            && let Ok(Some(Event::Connection(e))) = n.conn.dequeue()
        {
            ended = Some(e.kind);
        }
        let done = t.seen[..posted as usize].iter().all(|&s| s == 1);
        if let (Some(k), true) = (ended, done) {
            return k;
        }
        assert!(
            Instant::now() < limit,
            "not everything ended: {ended:?}, {} of {posted} completed",
            t.ok + t.flushed
        );
        match n.req.wait(Some(Duration::from_millis(20)), 1) {
            Ok((Event::Dto(d), _)) => t.take(&d),
            Ok((e, _)) => panic!("unexpected {e:?}"),
            Err(Error::TimeoutExpired { .. }) => {}
            Err(e) => panic!("{e:?}"),
        }
    }
}

/// A side's part. Without the variable set, it does nothing.
#[test]
fn child() {
    let Ok(args) = std::env::var(ENV) else {
        return;
    };
    // The timeout comes last.
    let mut args: Vec<&str> = args.split(',').collect();
    let timeout_ms: u64 = args.pop().and_then(|t| t.parse().ok()).unwrap();
    log_to_stdout();
    let tcp = Tcp::new();
    // The MSS of the path, which the mtu-client's FPDUs follow.
    let params = format!("timeout_ms={timeout_ms} mss=auto");
    let attr = EpAttr {
        max_request_dtos: WINDOW as usize * 2,
        max_recv_dtos: IDLE_RECVS as usize,
        ..EpAttr::default()
    };
    let n = Node::with_attr(common::ia(&tcp, args[1], &params), 1024, Some(attr));
    let limit = Instant::now() + Duration::from_secs(40);
    let rbuf = n.buf((IDLE_RECVS * 64) as usize);
    // Receives that nothing consumes: the end must flush them.
    // Cookies of receives start after every request's.
    let recv_base = 1 << 20;
    let mut rt = Tally {
        seen: vec![0; IDLE_RECVS as usize],
        ..Tally::default()
    };
    for i in 0..IDLE_RECVS {
        n.recv(&rbuf, i * 64, 64, recv_base + i);
    }
    let region = SIZE * WINDOW;
    match args[0] {
        "server" => {
            let target = n.buf(region as usize);
            let (_psp, q) = listen(&n.ia, &n.cr);
            println!("\nPORT {q}");
            let cr = next_cr(&n.ia, &n.cr);
            let t = target.rmr_triplet(0, region).unwrap();
            let mut pd = t.rmr_context.to_be_bytes().to_vec();
            pd.extend_from_slice(&t.target_address.to_be_bytes());
            cr.accept(&n.ep, &pd).unwrap();
            assert_eq!(conn_kind(&n.conn), ConnectionEventKind::Established);
            println!("READY");
            let kind = drain_recvs(&n, &mut rt, limit, false).expect("waited for the end");
            println!(
                "BROKEN kind={kind:?} recv_flushed={} heartbeats={}",
                rt.flushed,
                tcp.heartbeats()
            );
            assert_eq!(kind, ConnectionEventKind::Broken);
            assert_eq!(rt.flushed, IDLE_RECVS);
        }
        "client" | "mtu-client" => {
            // (mtu-client: says SHRUNK once its FPDUs followed a fall of
            // the path's MSS.)
            let mut watch_mss = args[0] == "mtu-client";
            let port: u64 = args[3].parse().unwrap();
            n.ep.connect(args[2].parse().unwrap(), port, Some(T), b"")
                .unwrap();
            let e = conn_ev(&n.conn);
            assert_eq!(e.kind, ConnectionEventKind::Established);
            let pd = e.private_data.expect("the accept's private data");
            let ctx = u32::from_be_bytes(pd[0..4].try_into().unwrap());
            let addr = u64::from_be_bytes(pd[4..12].try_into().unwrap());
            let src = n.lmr(pattern(SIZE as usize, 3));
            let mut t = Tally {
                seen: vec![0; 1 << 20],
                ..Tally::default()
            };
            let (mut posted, mut running) = (0u64, false);
            let kind = loop {
                // Keep the window full until a post is refused.
                while posted - (t.ok + t.flushed) < WINDOW && posted < 1 << 20 {
                    let at = RmrTriplet {
                        rmr_context: ctx,
                        target_address: addr + (posted % WINDOW) * SIZE,
                        segment_length: SIZE,
                    };
                    match n
                        .ep
                        .post_rdma_write(&[src.triplet(0, SIZE).unwrap()], at, posted, D)
                    {
                        Ok(()) => posted += 1,
                        Err(_) => break,
                    }
                }
                match n.req.wait(Some(Duration::from_millis(20)), 1) {
                    Ok((Event::Dto(d), _)) => t.take(&d),
                    Ok((e, _)) => panic!("unexpected {e:?}"),
                    Err(Error::TimeoutExpired { .. }) => {}
                    Err(e) => panic!("{e:?}"),
                }
                if !running && t.ok >= 100 {
                    running = true;
                    println!("RUNNING");
                }
                if watch_mss && tcp.mss_shrinks() > 0 {
                    watch_mss = false;
                    println!("SHRUNK after {} writes", t.ok);
                }
                if t.flushed > 0 || n.ep.state() != EpState::Connected {
                    break drain(&n, &mut t, posted, limit);
                }
                assert!(Instant::now() < limit, "the connection never broke");
            };
            // The receives end too.
            drain_recvs(&n, &mut rt, limit, true);
            println!(
                "BROKEN kind={kind:?} posted={posted} ok={} flushed={} recv_flushed={}",
                t.ok, t.flushed, rt.flushed
            );
            assert_eq!(kind, ConnectionEventKind::Broken);
            assert!(t.flushed > 0, "the cut left requests outstanding");
            assert_eq!(rt.flushed, IDLE_RECVS);
        }
        "idle-client" => {
            // Connected and then silent: no request outstanding, only the
            // receives, so only keepalive or a heartbeat can notice the cut.
            let port: u64 = args[3].parse().unwrap();
            n.ep.connect(args[2].parse().unwrap(), port, Some(T), b"")
                .unwrap();
            assert_eq!(conn_kind(&n.conn), ConnectionEventKind::Established);
            println!("RUNNING");
            let kind = drain_recvs(&n, &mut rt, limit, false).expect("waited for the end");
            println!(
                "BROKEN kind={kind:?} recv_flushed={} heartbeats={}",
                rt.flushed,
                tcp.heartbeats()
            );
            assert_eq!(kind, ConnectionEventKind::Broken);
            assert_eq!(rt.flushed, IDLE_RECVS);
        }
        m => panic!("unknown mode {m}"),
    }
    // Nothing after the end.
    std::thread::sleep(Duration::from_millis(100));
    empty(&n.req);
    empty(&n.rcv);
    empty(&n.conn);
    println!("CLEAN");
}

/// Waits (bounded) for every idle receive to be flushed and, unless the
/// caller took it already (`end_taken`), for the end of the connection,
/// which it returns. (The receives can be flushed and the endpoint leave
/// `Connected` before the end's event is dequeued: waiting on the state
/// alone left that event behind, which `empty` then found.)
fn drain_recvs(
    n: &Node,
    t: &mut Tally,
    limit: Instant,
    end_taken: bool,
) -> Option<ConnectionEventKind> {
    let mut ended = None;
    while t.flushed < IDLE_RECVS || (!end_taken && ended.is_none()) {
        assert!(
            Instant::now() < limit,
            "receives not flushed ({}) or the end not seen ({ended:?})",
            t.flushed
        );
        if !end_taken
            && ended.is_none()
            && let Ok(Some(Event::Connection(e))) = n.conn.dequeue()
        {
            ended = Some(e.kind);
        }
        match n.rcv.wait(Some(Duration::from_millis(20)), 1) {
            Ok((Event::Dto(mut d), _)) => {
                d.cookie -= 1 << 20;
                t.take(&d);
            }
            Ok((e, _)) => panic!("unexpected {e:?}"),
            Err(Error::TimeoutExpired { .. }) => {}
            Err(e) => panic!("{e:?}"),
        }
    }
    ended
}

/// The link is cut while the client keeps a window of RDMA Writes full,
/// then (new namespaces each time) while a connection sits idle, once
/// with a timeout keepalive keeps and once with one it cannot, and under
/// a transfer whose path's MTU fell.
#[test]
fn a_cut_link_breaks_both_sides_within_the_timeout_and_flushes_everything() {
    if std::env::var(ENV).is_ok() {
        return;
    }
    if cut_while("client", TIMEOUT_MS)
        && cut_while("idle-client", TIMEOUT_MS)
        && cut_while("idle-client", SHORT_TIMEOUT_MS)
    {
        cut_while("mtu-client", TIMEOUT_MS);
    }
}

/// Runs a server and a client (`client_mode`) in two namespaces, both
/// with `timeout_ms`, cuts the link once the client says it runs, and
/// checks both ends. False if the namespaces could not be made (skipped).
fn cut_while(client_mode: &str, timeout_ms: u64) -> bool {
    let hosts = match Hosts::new("lc", 201) {
        Ok(h) => h,
        Err(e) => {
            skip_or_fail(&format!("cannot make network namespaces: {e}"));
            return false;
        }
    };
    let (sa, ca) = (hosts.addr(2), hosts.addr(1));
    let (server, srx) = spawn(&hosts.b, &format!("server,{sa},{timeout_ms}"));
    let port = expect_line(&srx, "PORT ", T);
    let (client, crx) = spawn(
        &hosts.a,
        &format!("{client_mode},{ca},{sa},{port},{timeout_ms}"),
    );
    expect_line(&srx, "READY", T);
    expect_line(&crx, "RUNNING", T);
    if client_mode == "mtu-client" {
        // From 1500 to IPv6's minimum: the TCP MSS falls from 1448 to
        // 1228 bytes (with timestamps).
        hosts.set_mtu(1280);
        let s = expect_line(&crx, "SHRUNK", T);
        println!("{client_mode}: {s}");
    }
    let idle = client_mode == "idle-client";
    if idle {
        // Idle for three timeouts first: a live peer is asked and answers,
        // and nothing breaks.
        std::thread::sleep(Duration::from_millis(3 * timeout_ms));
        for (who, rx) in [("client", &crx), ("server", &srx)] {
            while let Ok(line) = rx.try_recv() {
                assert!(
                    !line.contains("BROKEN"),
                    "{client_mode} ({timeout_ms} ms): the {who} broke a live idle connection: {line}"
                );
            }
        }
    }
    hosts.cut();
    let cut = Instant::now();
    let bound = Duration::from_millis(timeout_ms) + SLACK;
    let wait = bound + Duration::from_secs(5);
    let c = expect_line(&crx, "BROKEN", wait);
    let c_at = cut.elapsed();
    let s = expect_line(&srx, "BROKEN", wait);
    let s_at = cut.elapsed();
    println!("{client_mode} ({timeout_ms} ms): client broken after {c_at:?}: {c}");
    println!("{client_mode} ({timeout_ms} ms): server broken after {s_at:?}: {s}");
    assert!(
        c_at <= bound,
        "{client_mode}: the client saw the end after {c_at:?}"
    );
    assert!(
        s_at <= bound,
        "{client_mode}: the server saw the end after {s_at:?}"
    );
    if idle {
        let beats = |line: &str| -> u64 {
            line.split("heartbeats=")
                .nth(1)
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(0)
        };
        // Each side's heartbeat and its answer end the other's silence, so
        // one side may ask for both.
        assert!(
            beats(&c) + beats(&s) >= 2,
            "{client_mode} ({timeout_ms} ms): an idle connection was not asked: {c} / {s}"
        );
    }
    expect_line(&crx, "CLEAN", T);
    expect_line(&srx, "CLEAN", T);
    for (who, mut ch) in [("client", client), ("server", server)] {
        let end = Instant::now() + T;
        let st = loop {
            if let Some(st) = ch.0.try_wait().unwrap() {
                break st;
            }
            assert!(Instant::now() < end, "the {who} did not exit");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(st.success(), "{client_mode}: the {who} failed: {st:?}");
    }
    true
}
