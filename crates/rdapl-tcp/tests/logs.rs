//! The provider's logs (`tracing` events), as a user debugging a
//! connection reads them: what was negotiated, how a connection ended and
//! how many requests it flushed, why a connect failed, which Terminate
//! went out or came in and why, what a raw client's garbage was. One
//! subscriber for the process keeps every line; each test finds its own by
//! its addresses and port (127.0.210.x).

mod common;

use common::*;
use rdapl::*;
use rdapl_tcp::Tcp;
use std::io::Write;
use std::net::{IpAddr, TcpListener, TcpStream};
use std::sync::{Mutex, Once};
use std::time::Instant;

static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());

/// Appends what the subscriber writes (a whole event a call) to [`LOG`].
struct Keep;

impl Write for Keep {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        LOG.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs the process's subscriber (debug and up), once.
fn capture() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        tracing_subscriber::fmt()
            .with_max_level(tracing_subscriber::filter::LevelFilter::DEBUG)
            .with_writer(|| Keep)
            .with_ansi(false)
            .init();
    });
}

/// The lines logged so far that contain every one of `parts`.
fn lines_with(parts: &[&str]) -> Vec<String> {
    let log = LOG.lock().unwrap();
    String::from_utf8_lossy(&log)
        .lines()
        .filter(|l| parts.iter().all(|p| l.contains(p)))
        .map(str::to_owned)
        .collect()
}

/// The first line with every one of `parts`, waiting for it up to `T`.
fn expect_line(parts: &[&str]) -> String {
    let end = Instant::now() + T;
    loop {
        if let Some(l) = lines_with(parts).into_iter().next() {
            return l;
        }
        assert!(
            Instant::now() < end,
            "no log line with {parts:?}; the log:\n{}",
            String::from_utf8_lossy(&LOG.lock().unwrap())
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[test]
fn a_connection_says_what_was_negotiated_and_how_it_ended() {
    capture();
    let tcp = Tcp::new();
    for (params, crc, c, s) in [
        ("crc=1", "crc=true", "127.0.210.1", "127.0.210.2"),
        ("crc=0", "crc=false", "127.0.210.3", "127.0.210.4"),
    ] {
        // Placed: the Send below waits for its receive, not for TCP.
        let params = format!("{params} complete=placed");
        let p = Pair::connected(&tcp, c, s, &params);
        let q = format!("qual={}", p.qual);
        let (cpeer, speer) = (format!("peer={s} "), format!("peer={c} "));
        for (peer, role) in [(&cpeer, "role=Initiator"), (&speer, "role=Responder")] {
            let l = expect_line(&["connection established", peer, &q, role]);
            assert!(l.contains(" INFO "), "{l}");
            assert!(l.contains(crc) && l.contains("revision=2"), "{l}");
            assert!(l.contains("ird=") && l.contains("ord=") && l.contains("rtr="));
        }
        // A Send the server has no receive for waits in flight; the
        // client's abrupt disconnect flushes it, and its end counts it.
        let src = p.c.lmr(vec![7; 8]);
        p.c.send(&src, 0, 8, 1);
        std::thread::sleep(std::time::Duration::from_millis(100));
        p.c.ep.disconnect(false).unwrap();
        p.expect_end(ConnectionEventKind::Disconnected);
        flushed(&p.c.req, &[1]);
        let l = expect_line(&["connection ended", &cpeer, &q, "end=Disconnected"]);
        assert!(l.contains("flushed=1"), "{l}");
        let l = expect_line(&["connection ended", &speer, &q]);
        assert!(l.contains("flushed=0"), "{l}");
    }
}

#[test]
fn a_connect_nobody_takes_says_why() {
    capture();
    let tcp = Tcp::new();
    let n = Node::new(&tcp, "127.0.210.5", "");
    // A port of that address where nobody listens.
    let port = {
        let l = TcpListener::bind("127.0.210.6:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let to: IpAddr = "127.0.210.6".parse().unwrap();
    n.ep.connect(to, u64::from(port), Some(T), b"").unwrap();
    assert_eq!(conn_kind(&n.conn), ConnectionEventKind::NonPeerRejected);
    expect_line(&[
        "connect failed",
        "peer=127.0.210.6 ",
        &format!("qual={port} "),
        "end=NonPeerRejected",
    ]);
}

#[test]
fn a_forged_key_is_told_on_both_sides_with_its_cause() {
    capture();
    let tcp = Tcp::new();
    let p = Pair::connected(&tcp, "127.0.210.7", "127.0.210.8", "complete=placed");
    let q = format!("qual={}", p.qual);
    let target = p.s.lmr(vec![5; 64]);
    let src = p.c.lmr(vec![1; 64]);
    let forged = forged_key(&target);
    p.c.ep
        .post_rdma_write(&[src.triplet(0, 64).unwrap()], forged, 1, D)
        .unwrap();
    assert_eq!(next_dto(&p.c.req).status, DtoStatus::RemoteAccess);
    p.expect_end(ConnectionEventKind::Broken);
    let cause = "DDP tagged buffer error: invalid STag (layer 1, type 1, code 0x00)";
    // The target found it and said so to the writer...
    let l = expect_line(&[
        "a Terminate goes to the peer",
        "peer=127.0.210.7 ",
        &q,
        &format!("terminate={cause}"),
    ]);
    assert!(l.contains(" WARN "), "{l}");
    // ...which heard it.
    let l = expect_line(&[
        "Terminate received",
        "peer=127.0.210.8 ",
        &q,
        &format!("cause={cause}"),
    ]);
    assert!(l.contains(" WARN "), "{l}");
    for peer in ["peer=127.0.210.7 ", "peer=127.0.210.8 "] {
        expect_line(&["connection ended", peer, &q, "end=Broken"]);
    }
}

#[test]
fn a_raw_clients_garbage_is_named() {
    capture();
    let tcp = Tcp::new();
    let s = Node::new(&tcp, "127.0.210.9", "");
    let (_psp, q) = listen(&s.ia, &s.cr);
    let mut g = TcpStream::connect(("127.0.210.9", q as u16)).unwrap();
    g.write_all(&[0xAB; 300]).unwrap();
    let l = expect_line(&[
        "connection error",
        &format!("qual={q} "),
        "MPA key is neither the request nor the reply key",
    ]);
    assert!(l.contains(" WARN "), "{l}");
}

#[test]
fn a_reject_is_told_on_both_sides() {
    capture();
    let tcp = Tcp::new();
    let p = Pair::new(
        Node::new(&tcp, "127.0.210.11", ""),
        Node::new(&tcp, "127.0.210.12", ""),
    );
    let q = format!("qual={}", p.qual);
    p.c.ep
        .connect(p.s.ia.address(), p.qual, Some(T), b"hello")
        .unwrap();
    next_cr(&p.s.ia, &p.s.cr).reject(b"not now").unwrap();
    let l = expect_line(&[
        "connection request, for the service point's consumer",
        "peer=127.0.210.11 ",
        &q,
    ]);
    assert!(l.contains(" DEBUG ") && l.contains("private_data=5"), "{l}");
    assert_eq!(conn_kind(&p.c.conn), ConnectionEventKind::PeerRejected);
    let l = expect_line(&[
        "connection request rejected by its consumer",
        "peer=127.0.210.11 ",
        &q,
    ]);
    assert!(l.contains("private_data=7"), "{l}");
    let l = expect_line(&["connection rejected by the peer", "peer=127.0.210.12 ", &q]);
    assert!(l.contains("private_data=7"), "{l}");
    expect_line(&[
        "connect failed",
        "peer=127.0.210.12 ",
        &q,
        "end=PeerRejected",
    ]);
}

#[test]
fn a_send_that_found_no_receive_says_how_long_it_waited() {
    capture();
    let tcp = Tcp::new();
    let p = Pair::connected(
        &tcp,
        "127.0.210.13",
        "127.0.210.14",
        "recv_wait_ms=100 complete=placed",
    );
    let q = format!("qual={}", p.qual);
    let src = p.c.lmr(vec![3; 16]);
    p.c.send(&src, 0, 16, 1);
    assert_eq!(next_dto(&p.c.req).status, DtoStatus::ReceiverNotReady);
    p.expect_end(ConnectionEventKind::Broken);
    // The receiver says it waited, and for how long...
    let l = expect_line(&[
        "found no receive posted within recv_wait_ms",
        "peer=127.0.210.13 ",
        &q,
        "recv_wait_ms=100",
    ]);
    assert!(l.contains(" WARN "), "{l}");
    let waited: u64 = l
        .split("waited_ms=")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no waited_ms in {l}"));
    assert!(waited >= 100, "{l}");
    // ...and the sender hears the cause.
    expect_line(&[
        "Terminate received",
        "peer=127.0.210.14 ",
        &q,
        "cause=DDP untagged buffer error: invalid MSN, no buffer available",
    ]);
}

/// A client that gives up its connect while the server's consumer has
/// not answered yet ends the TCP connection during the MPA exchange: the
/// server says so at `info`, as an ordinary end (it was a `WARN`
/// "connection error: a Terminate goes to the peer ... stream ended
/// inside an FPDU": neither an FPDU nor a Terminate was involved), and
/// the client that it gave up.
#[test]
fn a_connect_given_up_before_its_accept_is_no_protocol_error() {
    capture();
    let tcp = Tcp::new();
    let p = Pair::new(
        Node::new(&tcp, "127.0.210.15", ""),
        Node::new(&tcp, "127.0.210.16", ""),
    );
    let q = format!("qual={}", p.qual);
    p.c.ep
        .connect(p.s.ia.address(), p.qual, Some(T), b"")
        .unwrap();
    let _cr = next_cr(&p.s.ia, &p.s.cr);
    p.c.ep.free().unwrap();
    let l = expect_line(&[
        "the peer closed the connection during its set-up",
        "peer=127.0.210.15 ",
        &q,
    ]);
    assert!(l.contains(" INFO "), "{l}");
    let warned = lines_with(&["peer=127.0.210.15 ", &q, " WARN "]);
    assert!(warned.is_empty(), "{warned:?}");
    // The client says it gave up, not that its connect failed (it was
    // "connect failed ... end=NonPeerRejected").
    let l = expect_line(&["connect given up by its consumer", "peer=127.0.210.16 ", &q]);
    assert!(l.contains(" INFO "), "{l}");
    let failed = lines_with(&["connect failed", "peer=127.0.210.16 ", &q]);
    assert!(failed.is_empty(), "{failed:?}");
}
