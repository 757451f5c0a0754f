//! A process out of file descriptors. A listener's connections wait in
//! the backlog, the progress thread rests instead of spinning on the
//! listener it cannot accept from, and once descriptors are free again
//! the next connection is served. A connect fails at once with
//! `InsufficientResources` (not a connection event that says
//! `Unreachable`), the endpoint stays unconnected, and connects once
//! descriptors are free.
//!
//! Each runs in a child process (this test binary re-executed with
//! `RDAPL_TCP_FDLIMIT` set) whose descriptor limit is set just above
//! what it holds; the server's listener is flooded with raw TCP
//! connections from the test.

mod common;

use common::*;
use rdapl::*;
use rdapl_tcp::Tcp;
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

const ENV: &str = "RDAPL_TCP_FDLIMIT";
const SERVER: &str = "127.0.39.2";

/// Sets this process's descriptor limit to `current` (the maximum kept).
fn set_limit(current: Option<u64>) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let maximum = getrlimit(Resource::Nofile).maximum;
    setrlimit(Resource::Nofile, Rlimit { current, maximum }).unwrap();
}

/// Sets this process's descriptor limit to `more` above its lowest free
/// descriptor; returns the limit before (to set it back).
fn limit_descriptors(more: u64) -> Option<u64> {
    // The lowest free descriptor: the limit bounds descriptor numbers,
    // and the next socket takes the lowest free one.
    let open = {
        use std::os::fd::AsRawFd;
        std::fs::File::open("/dev/null").unwrap().as_raw_fd() as u64
    };
    let before = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    set_limit(Some(open + more));
    before
}

/// This test binary re-executed as the child of `mode` (its stdout lines).
fn child(mode: &str) -> (Reap, std::sync::mpsc::Receiver<String>) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["child_server", "--exact", "--nocapture", "--test-threads=1"])
        .env(ENV, mode);
    spawn_lines(cmd)
}

/// The child's side. Without the variable set, it does nothing.
#[test]
fn child_server() {
    let Ok(mode) = std::env::var(ENV) else {
        return;
    };
    log_to_stdout();
    match mode.as_str() {
        "server" => {}
        "client" => return child_client(),
        _ => return,
    }
    let tcp = Tcp::new();
    let s = Node::new(&tcp, SERVER, "");
    let (_psp, q) = listen(&s.ia, &s.cr);
    limit_descriptors(8);
    println!("\nPORT {q}");
    // The parent floods the listener meanwhile; then the thread's
    // wake-ups over half a second.
    std::thread::sleep(Duration::from_millis(1_500));
    let before = tcp.wakeups();
    std::thread::sleep(Duration::from_millis(500));
    println!("WAKEUPS {}", tcp.wakeups() - before);
    // The parent lets go of its connections and connects for real.
    let cr = next_cr(&s.ia, &s.cr);
    cr.accept(&s.ep, b"").unwrap();
    assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Established);
    let rbuf = s.buf(64);
    s.recv(&rbuf, 0, 64, 1);
    assert_eq!(next_dto(&s.rcv).status, DtoStatus::Success);
    assert_eq!(rbuf.to_vec().unwrap(), pattern(64, 3));
    println!("DONE");
}

/// The client child: a connect with no descriptor left, then with one.
fn child_client() {
    let tcp = Tcp::new();
    let s = Node::new(&tcp, "127.0.39.4", "");
    let (_psp, q) = listen(&s.ia, &s.cr);
    let c = Node::new(&tcp, "127.0.39.3", "");
    let before = limit_descriptors(0);
    let r = c.ep.connect(s.ia.address(), q, Some(T), b"");
    assert!(
        matches!(r, Err(Error::InsufficientResources { .. })),
        "connect with no descriptor: {r:?}"
    );
    assert_eq!(c.ep.state(), EpState::Unconnected);
    empty(&c.conn);
    set_limit(before);
    c.ep.connect(s.ia.address(), q, Some(T), b"").unwrap();
    next_cr(&s.ia, &s.cr).accept(&s.ep, b"").unwrap();
    assert_eq!(conn_kind(&c.conn), ConnectionEventKind::Established);
    println!("DONE");
}

#[test]
fn a_connect_out_of_descriptors_fails_at_once_then_connects() {
    let (_child, rx) = child("client");
    expect_line(&rx, "DONE", T);
}

#[test]
fn a_listener_out_of_descriptors_rests_then_serves() {
    log_to_test();
    let (_child, rx) = child("server");
    let port: u16 = expect_line(&rx, "PORT ", T).parse().expect("a port");
    let to: SocketAddr = format!("{SERVER}:{port}").parse().unwrap();
    // Far more than the child can accept: the rest stay in its backlog.
    let flood: Vec<TcpStream> = (0..48)
        .filter_map(|_| TcpStream::connect_timeout(&to, Duration::from_secs(2)).ok())
        .collect();
    assert!(flood.len() >= 16, "only {} connections", flood.len());
    let idle: u64 = expect_line(&rx, "WAKEUPS ", T).parse().unwrap();
    // Resting 50 ms at a time: about 10 in half a second (a thread
    // spinning on the listener woke hundreds of thousands of times).
    assert!(idle <= 60, "{idle} wake-ups in 500 ms with a full table");
    drop(flood);
    // The child's accepted ones end with the flood; the listener takes
    // the next connection once its rest is over.
    let tcp = Tcp::new();
    let c = Node::new(&tcp, "127.0.39.1", "");
    c.ep.connect(SERVER.parse().unwrap(), u64::from(port), Some(T), b"")
        .unwrap();
    assert_eq!(conn_kind(&c.conn), ConnectionEventKind::Established);
    let src = c.lmr(pattern(64, 3));
    c.send(&src, 0, 64, 2);
    let d = next_dto(&c.req);
    if d.status != DtoStatus::Success {
        panic!(
            "the send: {d:?}; the child said:\n{}",
            lines_within(&rx, Duration::from_secs(1)).join("\n")
        );
    }
    expect_line(&rx, "DONE", T);
}
