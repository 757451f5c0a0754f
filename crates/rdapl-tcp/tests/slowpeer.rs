//! A peer that takes bytes slowly is no silent peer. Between the two ends
//! a proxy takes what its receive buffer holds of the client's bytes
//! every 100 ms: in between, the client's window is closed with nothing
//! in flight (everything sent acknowledged, the rest waiting in its
//! socket). The client's last bytes take longer than its timeout to
//! leave its socket, and the answer to its fence comes only behind them:
//! the client must not take the wait for a silent peer, whatever the
//! window's state when it looks. (It did, when a look fell between two
//! openings: `chunked.rs`'s slow-path case failed so now and then.)

mod common;

use common::*;
use rdapl::*;
use rdapl_tcp::Tcp;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the proxy takes what the client's bytes filled its receive
/// buffer with.
const GAP: Duration = Duration::from_millis(100);

/// Forwards `from` to `to` until `from` ends or `stop`; `slow`: a read,
/// then a pause of `GAP`.
fn forward(mut from: TcpStream, mut to: TcpStream, slow: bool, stop: Arc<AtomicBool>) {
    from.set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let mut buf = vec![0u8; 64 << 10];
    while !stop.load(Ordering::Relaxed) {
        match from.read(&mut buf) {
            Ok(0) => {
                let _ = to.shutdown(std::net::Shutdown::Write);
                return;
            }
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    return;
                }
                if slow {
                    std::thread::sleep(GAP);
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// The proxy at `at` for the server at `to`: one connection.
fn proxy(at: SocketAddr, to: SocketAddr, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    // A small receive buffer and MSS, set before `listen` so that the
    // accepted socket has them from its first segment: the client's
    // window closes within a read's pause, and opens as soon as the
    // proxy reads (the kernel offers no window smaller than an MSS).
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.set_reuse_address(true).unwrap();
    s.set_recv_buffer_size(64 << 10).unwrap();
    s.set_tcp_mss(1400).unwrap();
    s.bind(&at.into()).unwrap();
    s.listen(1).unwrap();
    let l: TcpListener = s.into();
    std::thread::spawn(move || {
        let (client, _) = l.accept().unwrap();
        let server = TcpStream::connect(to).unwrap();
        client.set_nodelay(true).unwrap();
        server.set_nodelay(true).unwrap();
        let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        let st = stop.clone();
        let back = std::thread::spawn(move || forward(s2, c2, false, st));
        forward(client, server, true, stop);
        let _ = back.join();
    })
}

#[test]
fn a_peer_taking_bytes_slowly_behind_a_closed_window_is_not_silent() {
    log_to_test();
    let tcp = Tcp::new();
    let params = "timeout_ms=400";
    let p = Pair::new(
        Node::new(&tcp, "127.0.236.1", params),
        Node::new(&tcp, "127.0.236.2", params),
    );
    let at = SocketAddr::new("127.0.236.3".parse().unwrap(), p.qual as u16);
    let stop = Arc::new(AtomicBool::new(false));
    let px = proxy(
        at,
        SocketAddr::new(p.s.ia.address(), p.qual as u16),
        stop.clone(),
    );
    p.c.ep.connect(at.ip(), p.qual, Some(T), b"").unwrap();
    next_cr(&p.s.ia, &p.s.cr).accept(&p.s.ep, b"").unwrap();
    assert_eq!(conn_kind(&p.s.conn), ConnectionEventKind::Established);
    assert_eq!(conn_kind(&p.c.conn), ConnectionEventKind::Established);
    // About two seconds through the proxy: several timeouts.
    let n = 512usize << 10;
    let (src, dst) = (p.c.lmr(pattern(n, 9)), p.s.buf(n));
    p.s.recv(&dst, 0, n as u64, 1);
    let t0 = Instant::now();
    p.c.send(&src, 0, n as u64, 2);
    let sent = next_dto(&p.c.req);
    let got = next_dto(&p.s.rcv);
    assert_eq!(
        (sent.status, got.status, got.transferred_length),
        (DtoStatus::Success, DtoStatus::Success, n as u64),
        "after {:?}",
        t0.elapsed()
    );
    assert!(
        t0.elapsed() > Duration::from_millis(600),
        "the proxy was not slow: {:?}",
        t0.elapsed()
    );
    assert!(dst.to_vec().unwrap() == pattern(n, 9));
    assert_eq!(p.c.ep.state(), EpState::Connected);
    p.c.ep.disconnect(true).unwrap();
    p.expect_end(ConnectionEventKind::Disconnected);
    stop.store(true, Ordering::Relaxed);
    px.join().unwrap();
}
