//! A listener whose process is out of file descriptors: connections wait
//! in the backlog, the progress thread rests instead of spinning on the
//! listener it cannot accept from, and once descriptors are free again
//! the next connection is served.
//!
//! The server is a child process (this test binary re-executed with
//! `RDAPL_TCP_FDLIMIT` set) whose descriptor limit is a few above what
//! it holds; the test floods its listener with raw TCP connections.

mod common;

use common::*;
use rdapl::*;
use rdapl_tcp::Tcp;
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

const ENV: &str = "RDAPL_TCP_FDLIMIT";
const SERVER: &str = "127.0.39.2";

/// The child's side. Without the variable set, it does nothing.
#[test]
fn child_server() {
    if std::env::var(ENV).is_err() {
        return;
    }
    let tcp = Tcp::new();
    let s = Node::new(&tcp, SERVER, "");
    let (_psp, q) = listen(&s.ia, &s.cr);
    let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let max = getrlimit(Resource::Nofile).maximum;
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(open + 8),
            maximum: max,
        },
    )
    .unwrap();
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

#[test]
fn a_listener_out_of_descriptors_rests_then_serves() {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["child_server", "--exact", "--nocapture", "--test-threads=1"])
        .env(ENV, "1");
    let (_child, rx) = spawn_lines(cmd);
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
    assert_eq!(next_dto(&c.req).status, DtoStatus::Success);
    expect_line(&rx, "DONE", T);
}
