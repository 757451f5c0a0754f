//! Across processes: the server runs in a child process (this test binary
//! re-executed with `RDAPL_TCP_CHILD` set, running only `child_server`),
//! the client in the test. Data moves both ways with every byte checked;
//! then the child is killed (SIGKILL) with 1000 requests in flight and the
//! survivor must see every one flushed, exactly once, and the connection
//! broken within 1 s. A child stopped (SIGSTOP) while it owes the answer
//! to a read, its kernel still acknowledging, breaks the connection
//! within the IA's `timeout_ms`; one stopped while its connection is
//! idle does not (the provider's heartbeats ask the peer's kernel, which
//! answers), nor one stopped under traffic for less than the timeout,
//! and the connection serves on once it runs again.

mod common;

use common::*;
use rdapl::*;
use rdapl_tcp::Tcp;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const ENV: &str = "RDAPL_TCP_CHILD";

/// The child's side. Without the variable set, it does nothing.
#[test]
fn child_server() {
    let Ok(mode) = std::env::var(ENV) else {
        return;
    };
    let (mode, addr) = mode.split_once(',').expect("mode,addr");
    let tcp = Tcp::new();
    let s = Node::new(&tcp, addr, "");
    let (_psp, q) = listen(&s.ia, &s.cr);
    println!("\nPORT {q}");
    let cr = next_cr(&s.ia, &s.cr);
    let target = s.lmr(pattern(1 << 16, 77));
    match mode {
        "echo" => {
            // Four messages come in; each goes back as it came.
            let rbuf = s.buf(2 << 20);
            let sizes = [1u64, 4096, 100_000, 1 << 20];
            let mut off = 0;
            for (i, &n) in sizes.iter().enumerate() {
                s.recv(&rbuf, off, n, i as u64);
                off += n;
            }
            // The accept tells the client where it may write and read.
            cr.accept(&s.ep, &offer(&target)).unwrap();
            assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Established);
            let mut off = 0;
            for (i, &n) in sizes.iter().enumerate() {
                let r = next_dto(&s.rcv);
                assert_eq!(
                    (r.cookie, r.status, r.transferred_length),
                    (i as u64, DtoStatus::Success, n)
                );
                s.send(&rbuf, off, n, 100 + i as u64);
                assert_eq!(next_dto(&s.req).status, DtoStatus::Success);
                off += n;
            }
            assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Disconnected);
            println!("DONE");
        }
        "target" => {
            // Offers its region and lets its provider answer reads: the
            // test stops it (SIGSTOP).
            cr.accept(&s.ep, &offer(&target)).unwrap();
            assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Established);
            println!("READY");
            std::thread::sleep(Duration::from_secs(30));
        }
        "sink" => {
            // Accepts and never posts a receive: the client's sends pile up.
            cr.accept(&s.ep, b"").unwrap();
            assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Established);
            println!("READY");
            std::thread::sleep(Duration::from_secs(30));
        }
        m => panic!("unknown mode {m}"),
    }
}

/// The private data of an accept that offers the region `target` (64
/// KiB): its key and address.
fn offer(target: &Lmr) -> Vec<u8> {
    let t = target.rmr_triplet(0, 1 << 16).unwrap();
    let mut pd = t.rmr_context.to_be_bytes().to_vec();
    pd.extend_from_slice(&t.target_address.to_be_bytes());
    pd
}

/// The region an accept's private data offers ([`offer`]).
fn offered(pd: &[u8]) -> RmrTriplet {
    RmrTriplet {
        rmr_context: u32::from_be_bytes(pd[0..4].try_into().unwrap()),
        target_address: u64::from_be_bytes(pd[4..12].try_into().unwrap()),
        segment_length: 1 << 16,
    }
}

/// Starts the child in `mode` at `addr`; returns it, its stdout lines,
/// and the port it listens on.
fn spawn(mode: &str, addr: &str) -> (Reap, mpsc::Receiver<String>, u64) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["child_server", "--exact", "--nocapture", "--test-threads=1"])
        .env(ENV, format!("{mode},{addr}"));
    let (child, rx) = spawn_lines(cmd);
    let port = expect_line(&rx, "PORT ", T).parse().expect("a port number");
    (child, rx, port)
}

#[test]
fn a_server_in_another_process_echoes_every_byte() {
    let (mut child, rx, port) = spawn("echo", "127.0.20.2");
    let tcp = Tcp::new();
    let c = Node::new(&tcp, "127.0.20.1", "");
    let sizes = [1u64, 4096, 100_000, 1 << 20];
    let cbuf = c.buf(2 << 20);
    let mut off = 0;
    for (i, &n) in sizes.iter().enumerate() {
        c.recv(&cbuf, off, n, 200 + i as u64);
        off += n;
    }
    c.ep.connect("127.0.20.2".parse().unwrap(), port, Some(T), b"hi")
        .unwrap();
    let e = conn_ev(&c.conn);
    assert_eq!(e.kind, ConnectionEventKind::Established);
    let whole = offered(&e.private_data.expect("the accept's private data"));
    let addr = whole.target_address;
    // RDMA read of the child's region, then a write into it, read back.
    let sink = c.buf(1 << 16);
    c.ep.post_rdma_read(&[sink.triplet(0, 1 << 16).unwrap()], whole, 1, D)
        .unwrap();
    assert_eq!(next_dto(&c.req).status, DtoStatus::Success);
    assert!(sink.to_vec().unwrap() == pattern(1 << 16, 77));
    let w = c.lmr(pattern(1000, 5));
    let at = RmrTriplet {
        target_address: addr + 500,
        segment_length: 1000,
        ..whole
    };
    c.ep.post_rdma_write(&[w.triplet(0, 1000).unwrap()], at, 2, D)
        .unwrap();
    assert_eq!(next_dto(&c.req).status, DtoStatus::Success);
    c.ep.post_rdma_read(
        &[sink.triplet(0, 2000).unwrap()],
        RmrTriplet {
            segment_length: 2000,
            ..whole
        },
        3,
        D,
    )
    .unwrap();
    assert_eq!(next_dto(&c.req).status, DtoStatus::Success);
    let got = sink.to_vec().unwrap();
    let mut want = pattern(1 << 16, 77)[..2000].to_vec();
    want[500..1500].copy_from_slice(&pattern(1000, 5));
    assert_eq!(&got[..2000], &want[..]);
    // Four messages there and back.
    let msgs: Vec<u8> = sizes
        .iter()
        .enumerate()
        .flat_map(|(i, &n)| pattern(n as usize, 31 * i as u8))
        .collect();
    let src = c.lmr(msgs.clone());
    let mut off = 0;
    for (i, &n) in sizes.iter().enumerate() {
        c.send(&src, off, n, 10 + i as u64);
        off += n;
    }
    for (i, &n) in sizes.iter().enumerate() {
        let d = next_dto(&c.req);
        assert_eq!((d.cookie, d.status), (10 + i as u64, DtoStatus::Success));
        let r = next_dto(&c.rcv);
        assert_eq!(
            (r.cookie, r.status, r.transferred_length),
            (200 + i as u64, DtoStatus::Success, n)
        );
    }
    assert!(
        cbuf.to_vec().unwrap()[..msgs.len()] == msgs[..],
        "every byte back"
    );
    c.ep.disconnect(true).unwrap();
    assert_eq!(conn_kind(&c.conn), ConnectionEventKind::Disconnected);
    expect_line(&rx, "DONE", T);
    let end = Instant::now() + T;
    loop {
        if let Some(st) = child.0.try_wait().unwrap() {
            assert!(st.success(), "the child failed: {st:?}");
            break;
        }
        assert!(Instant::now() < end, "the child did not exit");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_killed_peer_flushes_1000_requests_once_and_breaks_within_a_second() {
    let (mut child, rx, port) = spawn("sink", "127.0.21.2");
    let tcp = Tcp::new();
    let attr = EpAttr {
        max_request_dtos: 1024,
        ..EpAttr::default()
    };
    let c = Node::with_attr(
        common::ia(&tcp, "127.0.21.1", "complete=placed"),
        4096,
        Some(attr),
    );
    c.ep.connect("127.0.21.2".parse().unwrap(), port, Some(T), b"")
        .unwrap();
    assert_eq!(conn_kind(&c.conn), ConnectionEventKind::Established);
    expect_line(&rx, "READY", T);
    const N: u64 = 1000;
    let src = c.lmr(pattern(4096, 1));
    for i in 0..N {
        c.send(&src, 0, 4096, i);
    }
    // Some sends are on the wire, the rest queued; none can complete.
    std::thread::sleep(Duration::from_millis(100));
    empty(&c.req);
    child.0.kill().unwrap();
    let killed = Instant::now();
    let _ = child.0.wait();
    let mut seen = vec![0u32; N as usize];
    let mut ended = None;
    let limit = Duration::from_secs(1);
    while seen.contains(&0) || ended.is_none() {
        let left = limit.saturating_sub(killed.elapsed());
        assert!(
            !left.is_zero(),
            "not everything ended within 1 s: {ended:?}, {} flushed",
            seen.iter().filter(|&&n| n > 0).count()
        );
        if ended.is_none()
            && let Ok(Some(Event::Connection(e))) = c.conn.dequeue()
        {
            ended = Some(e.kind);
        }
        match c.req.wait(Some(left.min(Duration::from_millis(20))), 1) {
            Ok((Event::Dto(d), _)) => {
                assert_eq!(d.status, DtoStatus::Flushed, "{d:?}");
                seen[d.cookie as usize] += 1;
            }
            Ok((e, _)) => panic!("unexpected {e:?}"),
            Err(Error::TimeoutExpired { .. }) => {}
            Err(e) => panic!("{e:?}"),
        }
    }
    assert!(seen.iter().all(|&n| n == 1), "each flushed exactly once");
    assert_eq!(ended, Some(ConnectionEventKind::Broken));
    assert_eq!(c.ep.state(), EpState::Disconnected);
    std::thread::sleep(Duration::from_millis(50));
    empty(&c.req);
    empty(&c.conn);
}

/// The peer process stopped (SIGSTOP, as a debugger or a hung host
/// process would leave it) while its kernel still acknowledges: a read
/// and a Send (its fence a read too) wait for answers that cannot come.
/// Within the IA's `timeout_ms` the connection breaks and both requests
/// complete, not in success.
#[test]
fn a_stopped_peer_breaks_the_connection_within_the_timeout() {
    let tcp = Tcp::new();
    let c = Node::new(&tcp, "127.0.22.1", "timeout_ms=500 complete=placed");
    let (child, whole) = connect_target(&c, "127.0.22.2");
    let sink = c.buf(1 << 16);
    let read = |cookie| {
        c.ep.post_rdma_read(&[sink.triplet(0, 1 << 16).unwrap()], whole, cookie, D)
            .unwrap()
    };
    // Alive: the child's provider answers though its consumer sleeps.
    read(1);
    assert_eq!(next_dto(&c.req).status, DtoStatus::Success);
    assert!(sink.to_vec().unwrap() == pattern(1 << 16, 77));
    let pid = stop(&child);
    let stopped = Instant::now();
    read(2);
    let src = c.lmr(pattern(100, 3));
    c.send(&src, 0, 100, 3);
    let mut got = Vec::new();
    while got.len() < 2 {
        let left = T.saturating_sub(stopped.elapsed());
        assert!(!left.is_zero(), "{} of 2 completions", got.len());
        if let Ok((Event::Dto(d), _)) = c.req.wait(Some(left), 1) {
            got.push((d.cookie, d.status));
        }
    }
    let waited = stopped.elapsed();
    assert!(
        got.iter().all(|&(_, st)| st != DtoStatus::Success),
        "{got:?}"
    );
    assert!(
        waited >= Duration::from_millis(400) && waited < Duration::from_secs(3),
        "broken after {waited:?}"
    );
    assert_eq!(conn_kind(&c.conn), ConnectionEventKind::Broken);
    assert_eq!(c.ep.state(), EpState::Disconnected);
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::CONT);
}

/// The peer process stopped for well under the timeout (a debugger's
/// breakpoint, a host's hiccup), twice, under a stream of RDMA Writes
/// and Reads of its region: its kernel's window closes and the answers
/// wait, but the connection does not break, and once it runs again
/// every request succeeds in order and every read returns the write
/// before it.
#[test]
fn a_peer_stopped_briefly_is_not_silent() {
    let tcp = Tcp::new();
    let c = Node::new(&tcp, "127.0.234.5", "timeout_ms=1000");
    let (child, whole) = connect_target(&c, "127.0.234.6");
    let sink = c.buf(1 << 16);
    let srcs: Vec<Lmr> = (0..4u8).map(|k| c.lmr(pattern(1 << 16, k))).collect();
    let (mut cookie, mut round) = (0u64, 0usize);
    let start = Instant::now();
    let mut stops = 0;
    // Rounds of eight 64 KiB writes (the last one's bytes are what a
    // read then sees) and a read, until two stops are over.
    while stops < 2 || start.elapsed() < Duration::from_millis(1_800) {
        assert!(start.elapsed() < T, "rounds did not end");
        let k = round % srcs.len();
        for _ in 0..8 {
            c.ep.post_rdma_write(&[srcs[k].triplet(0, 1 << 16).unwrap()], whole, cookie, D)
                .unwrap();
            cookie += 1;
        }
        c.ep.post_rdma_read(&[sink.triplet(0, 1 << 16).unwrap()], whole, cookie, D)
            .unwrap();
        // Stopped with the round's requests in flight, 400 ms each time.
        if stops < 2 && start.elapsed() >= Duration::from_millis(200 + 700 * stops) {
            let pid = stop(&child);
            std::thread::sleep(Duration::from_millis(400));
            rustix::process::kill_process(pid, rustix::process::Signal::CONT).expect("SIGCONT");
            stops += 1;
        }
        for i in cookie - 8..=cookie {
            let d = next_dto(&c.req);
            assert_eq!(
                (d.cookie, d.status),
                (i, DtoStatus::Success),
                "round {round}, stops {stops}"
            );
        }
        assert!(
            sink.to_vec().unwrap() == pattern(1 << 16, k as u8),
            "round {round}: the read sees the writes before it"
        );
        cookie += 1;
        round += 1;
    }
    assert_eq!(c.ep.state(), EpState::Connected);
    empty(&c.conn);
    empty(&c.req);
}

/// The peer process stopped under a stream of RDMA Writes: its kernel's
/// window closes, the writer's socket and output fill, and the fences'
/// answers cannot come. The timeout after the last byte went (the
/// stopped kernel may still open its window a little, once) every
/// request is flushed, exactly once, and the connection broken.
#[test]
fn a_stopped_peer_with_a_full_socket_is_broken_at_the_timeout() {
    let tcp = Tcp::new();
    let attr = EpAttr {
        max_request_dtos: 1024,
        ..EpAttr::default()
    };
    let c = Node::with_attr(
        common::ia(&tcp, "127.0.234.3", "timeout_ms=500"),
        4096,
        Some(attr),
    );
    let (child, whole) = connect_target(&c, "127.0.234.4");
    let pid = stop(&child);
    let stopped = Instant::now();
    // 32 MiB: far more than the two kernels and the provider's output
    // hold.
    const N: u64 = 512;
    let src = c.lmr(pattern(1 << 16, 5));
    for i in 0..N {
        c.ep.post_rdma_write(&[src.triplet(0, 1 << 16).unwrap()], whole, i, D)
            .unwrap();
    }
    let mut seen = vec![0u32; N as usize];
    let mut ended = None;
    while seen.contains(&0) || ended.is_none() {
        assert!(
            stopped.elapsed() < T,
            "not everything ended: {ended:?}, {} completed",
            seen.iter().filter(|&&n| n > 0).count()
        );
        if ended.is_none()
            && let Ok(Some(Event::Connection(e))) = c.conn.dequeue()
        {
            ended = Some(e.kind);
        }
        if let Ok((Event::Dto(d), _)) = c.req.wait(Some(Duration::from_millis(5)), 1) {
            seen[d.cookie as usize] += 1;
        }
    }
    let took = stopped.elapsed();
    assert!(seen.iter().all(|&n| n == 1), "each request exactly once");
    assert_eq!(ended, Some(ConnectionEventKind::Broken));
    // The timeout counts from the last byte written: a few milliseconds
    // after the stop, or a window probe's round later (Linux 6.18 opened
    // the stopped side's window once, about 200 ms after it closed).
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_millis(1_500),
        "everything ended {took:?} after the stop"
    );
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::CONT);
}

/// The peer process stopped while its connection is idle: the provider
/// asks it with heartbeats (a short timeout, so several), its kernel
/// acknowledges them, and the connection stays up: a stopped process owes
/// nothing it was not asked by its consumer. Resumed, it answers, and a
/// read moves the region again.
#[test]
fn a_stopped_peer_on_an_idle_connection_is_asked_and_not_broken() {
    let tcp = Tcp::new();
    let c = Node::new(&tcp, "127.0.234.1", "timeout_ms=300");
    let (child, whole) = connect_target(&c, "127.0.234.2");
    let read = |cookie| {
        let sink = c.buf(1 << 16);
        c.ep.post_rdma_read(&[sink.triplet(0, 1 << 16).unwrap()], whole, cookie, D)
            .unwrap();
        let d = next_dto(&c.req);
        assert_eq!((d.cookie, d.status), (cookie, DtoStatus::Success));
        assert!(sink.to_vec().unwrap() == pattern(1 << 16, 77));
    };
    read(1);
    let pid = stop(&child);
    let before = tcp.heartbeats();
    // Five timeouts.
    std::thread::sleep(Duration::from_millis(1_500));
    assert_eq!(c.ep.state(), EpState::Connected);
    empty(&c.conn);
    empty(&c.req);
    assert!(
        tcp.heartbeats() > before,
        "an idle peer silent for five timeouts was never asked"
    );
    rustix::process::kill_process(pid, rustix::process::Signal::CONT).expect("SIGCONT");
    read(2);
    assert_eq!(c.ep.state(), EpState::Connected);
    empty(&c.conn);
}

/// Starts a child in mode "target" listening at `server` and connects
/// `c` to it: the child and the region it offers.
fn connect_target(c: &Node, server: &str) -> (Reap, RmrTriplet) {
    let (child, rx, port) = spawn("target", server);
    c.ep.connect(server.parse().unwrap(), port, Some(T), b"")
        .unwrap();
    let e = conn_ev(&c.conn);
    assert_eq!(e.kind, ConnectionEventKind::Established);
    expect_line(&rx, "READY", T);
    (
        child,
        offered(&e.private_data.expect("the accept's private data")),
    )
}

/// Stops the child (SIGSTOP) and waits until every thread of it is
/// stopped (a stop takes effect as each thread next runs); its pid, for
/// the SIGCONT.
fn stop(child: &Reap) -> rustix::process::Pid {
    use rustix::process::{Pid, Signal, kill_process};
    let pid = Pid::from_raw(child.0.id() as i32).expect("the child's pid");
    kill_process(pid, Signal::STOP).expect("SIGSTOP to the child");
    let stopped = Instant::now();
    while !all_stopped(child.0.id()) {
        assert!(stopped.elapsed() < T, "the child did not stop");
        std::thread::sleep(Duration::from_millis(1));
    }
    pid
}

/// Whether every thread of process `pid` is stopped (state `T` in
/// `/proc/<pid>/task/*/stat`).
fn all_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|t| {
        std::fs::read_to_string(t.path().join("stat"))
            .ok()
            .and_then(|st| st.rsplit_once(") ").map(|(_, r)| r.starts_with('T')))
            .unwrap_or(false)
    })
}
