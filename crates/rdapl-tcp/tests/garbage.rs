//! A raw TCP client (the rdapl-iwarp engine over a plain socket, so it can
//! set up a connection and then misbehave) sends garbage, a truncated
//! frame, a huge length, a bad CRC, an unknown opcode and a forged STag:
//! each time the server's endpoint breaks, a Terminate comes back where
//! framing allows, nothing panics, and the server keeps serving a good
//! connection made before. The other way round, a client that meets a
//! server which is no iWARP peer ends its connect at once, with the end
//! that says so.

mod common;

use common::*;
use rdapl::*;
use rdapl_iwarp::rdmap::{tagged_header, untagged_header};
use rdapl_iwarp::{
    Buffer, Config, Connection, DdpHeader, Event as IwEvent, Opcode, Role, VecMemory,
};
use rdapl_tcp::Tcp;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

struct Raw {
    sock: TcpStream,
    conn: Connection,
    mem: VecMemory,
}

impl Raw {
    /// Sets up an iWARP connection with the server's `ep` (a receive of
    /// 16 bytes posted on it first).
    fn connect(s: &Node, q: u64, ep: &Ep, rbuf: &Lmr) -> Raw {
        let sock = TcpStream::connect((s.ia.address(), q as u16)).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let cfg = Config {
            peer_to_peer: true,
            ..Config::default()
        };
        let mut conn = Connection::new(Role::Initiator, cfg, 0).unwrap();
        conn.connect(0, b"raw").unwrap();
        let mut raw = Raw {
            sock,
            conn,
            mem: VecMemory::default(),
        };
        raw.flush();
        ep.post_recv(&[rbuf.triplet(0, 16).unwrap()], 1, D).unwrap();
        next_cr(&s.ia, &s.cr).accept(ep, b"").unwrap();
        let end = std::time::Instant::now() + T;
        while !raw
            .events()
            .iter()
            .any(|e| matches!(e, IwEvent::Established { .. }))
        {
            assert!(std::time::Instant::now() < end, "no MPA reply");
            raw.read_some();
        }
        raw.flush(); // the RTR
        assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Established);
        raw
    }

    fn flush(&mut self) {
        let mut out = Vec::new();
        while let Some(t) = self.conn.poll_transmit(&self.mem) {
            assert!(t.write_to(&self.mem, &mut out));
        }
        self.sock.write_all(&out).unwrap();
    }

    fn read_some(&mut self) -> bool {
        let mut b = [0u8; 4096];
        match self.sock.read(&mut b) {
            Ok(0) => false,
            Ok(n) => {
                self.conn.handle_input(0, &b[..n], &mut self.mem);
                true
            }
            Err(_) => true,
        }
    }

    fn events(&mut self) -> Vec<IwEvent> {
        std::iter::from_fn(|| self.conn.poll_event()).collect()
    }

    /// Reads until the server closes; true if a Terminate came.
    fn terminated(&mut self) -> bool {
        let end = std::time::Instant::now() + T;
        let mut term = false;
        while std::time::Instant::now() < end {
            let more = self.read_some();
            term |= self
                .events()
                .iter()
                .any(|e| matches!(e, IwEvent::TerminateReceived(_)));
            if !more || term {
                break;
            }
        }
        term
    }
}

fn fpdu(h: DdpHeader, payload: &[u8]) -> Vec<u8> {
    rdapl_iwarp::fpdu::encode_fpdu(&h, &[], payload, true).unwrap()
}

#[test]
fn bad_clients_get_a_terminate_and_the_server_keeps_serving() {
    let tcp = Tcp::new();
    let s = Node::new(&tcp, "127.0.40.2", "");
    let (_psp, q) = listen(&s.ia, &s.cr);
    // A good connection first.
    let c = Node::new(&tcp, "127.0.40.1", "");
    c.ep.connect(s.ia.address(), q, Some(T), b"").unwrap();
    let good = s.ep2();
    next_cr(&s.ia, &s.cr).accept(&good, b"").unwrap();
    assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Established);
    assert_eq!(conn_kind(&c.conn), ConnectionEventKind::Established);

    // Garbage instead of an MPA request: no request reaches the consumer.
    let mut g = TcpStream::connect((s.ia.address(), q as u16)).unwrap();
    g.write_all(&[0xAB; 300]).unwrap();
    g.set_read_timeout(Some(T)).unwrap();
    let mut b = [0u8; 64];
    assert!(
        matches!(g.read(&mut b), Ok(0) | Err(_)),
        "the server hangs up"
    );
    empty(&s.cr);

    let rbuf = s.buf(16);
    // (what, the bytes, a Terminate expected, the posted receive's status)
    let bad: Vec<(&str, Vec<u8>, bool, DtoStatus)> = vec![
        // A truncated FPDU, then the end of the stream.
        (
            "truncated",
            fpdu(untagged_header(Opcode::Send, true, 0, 1, 0), b"0123456789")[..9].to_vec(),
            false,
            DtoStatus::Flushed,
        ),
        // A huge length: far more than the posted receive.
        (
            "huge",
            {
                let mut v = fpdu(untagged_header(Opcode::Send, true, 0, 1, 0), &[7; 65000]);
                v.truncate(2000);
                v
            },
            true,
            DtoStatus::LocalLength,
        ),
        // A bad CRC.
        (
            "crc",
            {
                let mut v = fpdu(untagged_header(Opcode::Send, true, 0, 1, 0), b"abcd");
                let n = v.len();
                v[n - 1] ^= 0xFF;
                v
            },
            true,
            DtoStatus::Flushed,
        ),
        // An unknown opcode.
        (
            "opcode",
            fpdu(
                DdpHeader::new(
                    9,
                    true,
                    Buffer::Untagged {
                        rsvd_ulp: 0,
                        qn: 0,
                        msn: 1,
                        mo: 0,
                    },
                ),
                b"x",
            ),
            true,
            DtoStatus::Flushed,
        ),
        // A forged STag.
        (
            "stag",
            fpdu(
                tagged_header(Opcode::Write, true, 0xDEAD_BEEF, 0x1000),
                &[1; 32],
            ),
            true,
            DtoStatus::Flushed,
        ),
    ];
    // Each bad input twice: the client keeps its sending side open, or
    // shuts it right after the bytes (the end of the stream then reaches
    // the server with them; the Terminate must still come back).
    for (what, bytes, want_term, recv_status) in bad {
        for shut in [false, true] {
            let ep = s.ep2();
            let mut raw = Raw::connect(&s, q, &ep, &rbuf);
            raw.sock.write_all(&bytes).unwrap();
            if shut || !want_term {
                raw.sock.shutdown(Shutdown::Write).unwrap();
            }
            assert_eq!(
                raw.terminated(),
                want_term,
                "{what} (shut {shut}): a Terminate"
            );
            assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Broken, "{what}");
            assert_eq!(next_dto(&s.rcv).status, recv_status, "{what}");
            assert_eq!(ep.state(), EpState::Disconnected, "{what}");
            ep.free().unwrap();
        }
    }

    // The good connection still works.
    let gbuf = s.buf(64);
    good.post_recv(&[gbuf.triplet(0, 64).unwrap()], 9, D)
        .unwrap();
    let src = c.lmr(pattern(64, 3));
    c.send(&src, 0, 64, 1);
    let r = next_dto(&s.rcv);
    assert_eq!((r.cookie, r.status), (9, DtoStatus::Success));
    assert_eq!(gbuf.to_vec().unwrap(), pattern(64, 3));
    assert_eq!(next_dto(&c.req).status, DtoStatus::Success);
}

/// A bad frame from a client that reads nothing: the server's socket and
/// output are full of Sends that cannot leave, and its Terminate queues
/// behind them. Every Send is flushed and the endpoint broken at once,
/// not when the kernel gives the full socket up (`timeout_ms` later).
#[test]
fn a_bad_frame_while_the_output_is_full_flushes_at_once() {
    let tcp = Tcp::new();
    let s = Node::new(&tcp, "127.0.235.1", "timeout_ms=30000 complete=placed");
    let (_psp, q) = listen(&s.ia, &s.cr);
    let rbuf = s.buf(16);
    let mut raw = Raw::connect(&s, q, &s.ep, &rbuf);
    // 8 MiB of Sends to a client that never reads.
    const N: u64 = 128;
    let src = s.lmr(pattern(1 << 16, 8));
    for i in 0..N {
        s.send(&src, 0, 1 << 16, i);
    }
    std::thread::sleep(Duration::from_millis(300));
    empty(&s.req);
    let start = std::time::Instant::now();
    raw.sock
        .write_all(&fpdu(
            tagged_header(Opcode::Write, true, 0xDEAD_BEEF, 0x1000),
            &[1; 32],
        ))
        .unwrap();
    let mut seen = vec![0u32; N as usize];
    while seen.contains(&0) {
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{} of {N} Sends completed",
            seen.iter().filter(|&&n| n > 0).count()
        );
        if let Ok((Event::Dto(d), _)) = s.req.wait(Some(Duration::from_millis(10)), 1) {
            assert_eq!(d.status, DtoStatus::Flushed, "{d:?}");
            seen[d.cookie as usize] += 1;
        }
    }
    assert!(seen.iter().all(|&n| n == 1), "each Send exactly once");
    assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Broken);
    assert_eq!(next_dto(&s.rcv).status, DtoStatus::Flushed);
    let took = start.elapsed();
    assert!(took < Duration::from_secs(1), "broken after {took:?}");
}

/// A client that resets its connection while the server holds back its
/// Sends (no receive posted for them, the server's input buffer full,
/// so it no longer reads that socket) is seen at once: the endpoint
/// breaks, its receive is flushed, and the thread does not spin on the
/// socket's error meanwhile (`recv_wait_ms` would otherwise end it 60 s
/// later).
#[test]
fn a_reset_while_sends_wait_for_receives_breaks_at_once() {
    let tcp = Tcp::new();
    let s = Node::new(&tcp, "127.0.40.4", "recv_wait_ms=60000");
    let (_psp, q) = listen(&s.ia, &s.cr);
    let rbuf = s.buf(16);
    let mut raw = Raw::connect(&s, q, &s.ep, &rbuf);
    // The posted receive takes the first Send; the rest wait, more than
    // the server's input buffer holds.
    let mut bytes = fpdu(untagged_header(Opcode::Send, true, 0, 1, 0), b"first");
    for msn in 2..14 {
        bytes.extend(fpdu(
            untagged_header(Opcode::Send, true, 0, msn, 0),
            &[msn as u8; 60_000],
        ));
    }
    raw.sock
        .set_write_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut sent = 0;
    while sent < bytes.len() {
        match raw.sock.write(&bytes[sent..]) {
            Ok(n) => sent += n,
            Err(_) => break, // the server stopped reading: full
        }
    }
    assert!(sent > 400_000, "only {sent} bytes went");
    let r = next_dto(&s.rcv);
    assert_eq!((r.cookie, r.transferred_length), (1, 5));
    std::thread::sleep(Duration::from_millis(200));
    // Reset: the server's socket reports an error from now on.
    socket2::SockRef::from(&raw.sock)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    let before = tcp.wakeups();
    let start = std::time::Instant::now();
    drop(raw);
    let e = conn_ev(&s.conn);
    let took = start.elapsed();
    assert_eq!(e.kind, ConnectionEventKind::Broken);
    assert!(took < Duration::from_secs(1), "broken after {took:?}");
    let woke = tcp.wakeups() - before;
    assert!(woke < 100, "{woke} wake-ups until the break");
}

/// A flood of idle TCP connections (no MPA request ever) is held to the
/// listener's `setups`: once a real client comes, the server closes the
/// oldest idle ones that waited past the grace (before, every one stayed
/// open until its 5 s MPA timeout), keeps the newest, and the real client
/// gets in at once.
#[test]
fn a_flood_of_idle_connections_is_held_to_the_listeners_setups() {
    const IDLE: usize = 80;
    const SETUPS: usize = 16;
    let tcp = Tcp::new();
    let s = Node::new(&tcp, "127.0.40.6", &format!("setups={SETUPS}"));
    let (_psp, q) = listen(&s.ia, &s.cr);
    let idle: Vec<TcpStream> = (0..IDLE)
        .map(|_| TcpStream::connect((s.ia.address(), q as u16)).unwrap())
        .collect();
    // Past the grace (1 s) that spares connections just accepted.
    std::thread::sleep(Duration::from_millis(1_300));
    let c = Node::new(&tcp, "127.0.40.5", "");
    let t0 = std::time::Instant::now();
    c.ep.connect(s.ia.address(), q, Some(T), b"real").unwrap();
    let cr = next_cr(&s.ia, &s.cr);
    assert_eq!(cr.private_data(), b"real");
    cr.accept(&s.ep, b"").unwrap();
    assert_eq!(conn_kind(&c.conn), ConnectionEventKind::Established);
    assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Established);
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    std::thread::sleep(Duration::from_millis(100));
    let closed = idle
        .iter()
        .filter(|sock| {
            let mut sock: &TcpStream = sock;
            sock.set_read_timeout(Some(Duration::from_millis(50)))
                .unwrap();
            let mut b = [0u8; 1];
            match sock.read(&mut b) {
                Ok(0) => true,
                Ok(_) => false,
                Err(e) => !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
            }
        })
        .count();
    // All but the newest: the real client, if its request was not read
    // yet when the cap was applied, counts among the SETUPS kept.
    assert!(
        (IDLE - SETUPS..=IDLE + 1 - SETUPS).contains(&closed),
        "{closed} of {IDLE} idle connections closed"
    );
    assert_eq!(tcp.setups_dropped(), closed as u64);
}

/// A server that is no iWARP peer: what the client's connect ends with
/// when the server answers its MPA Request with `answer` (then holds the
/// connection open) or with nothing at all (`None`: it closes, or resets
/// if `reset`). Returns the end and how long it took.
fn against(
    addr: &str,
    answer: Option<Vec<u8>>,
    reset: bool,
) -> (ConnectionEventKind, std::time::Duration) {
    let raw = std::net::TcpListener::bind(format!("{addr}:0")).unwrap();
    let port = raw.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut s, _) = raw.accept().unwrap();
        match answer {
            Some(a) => {
                let mut b = [0u8; 512];
                let _ = s.read(&mut b);
                let _ = s.write_all(&a);
                // Held open until the client lets go (at most 3 s).
                s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
                while matches!(s.read(&mut b), Ok(n) if n > 0) {}
            }
            None if reset => {
                socket2::SockRef::from(&s)
                    .set_linger(Some(Duration::ZERO))
                    .unwrap();
            }
            None => {}
        }
    });
    let tcp = Tcp::new();
    let c = Node::new(&tcp, "127.0.240.1", "");
    let t0 = std::time::Instant::now();
    c.ep.connect(addr.parse().unwrap(), u64::from(port), Some(T), b"hello")
        .unwrap();
    let end = (conn_kind(&c.conn), t0.elapsed());
    assert_eq!(c.ep.state(), EpState::Disconnected, "{addr}");
    drop(c);
    server.join().unwrap();
    end
}

/// An MPA Reply frame's first 20 bytes: `key`, flags, revision 2 and
/// a private data length.
fn reply(key: &[u8; 16], flags: u8, pd_len: u16) -> Vec<u8> {
    let mut r = key.to_vec();
    r.extend_from_slice(&[flags, 2]);
    r.extend_from_slice(&pd_len.to_be_bytes());
    r
}

#[test]
fn a_server_that_is_no_iwarp_peer_ends_the_connect_at_once() {
    const KEY: &[u8; 16] = b"MPA ID Rep Frame";
    let http = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n".to_vec();
    let mut wrong_key = reply(KEY, 0x40, 0);
    wrong_key[0] = b'X';
    // A private data length past what MPA allows (512), its bytes
    // never sent.
    let mut huge = reply(KEY, 0x40, u16::MAX);
    huge.extend_from_slice(&[0; 100]);
    let cases: [(&str, Option<Vec<u8>>, bool, ConnectionEventKind); 6] = [
        (
            "127.0.240.2",
            Some(http),
            false,
            ConnectionEventKind::NonPeerRejected,
        ),
        (
            "127.0.240.3",
            None,
            false,
            ConnectionEventKind::NonPeerRejected,
        ),
        (
            "127.0.240.4",
            None,
            true,
            ConnectionEventKind::NonPeerRejected,
        ),
        (
            "127.0.240.5",
            Some(wrong_key),
            false,
            ConnectionEventKind::NonPeerRejected,
        ),
        (
            "127.0.240.6",
            Some(huge),
            false,
            ConnectionEventKind::NonPeerRejected,
        ),
        // A well-formed reject (the R flag) with private data: the
        // peer's consumer said no.
        (
            "127.0.240.7",
            Some([reply(KEY, 0x60, 3), b"no!".to_vec()].concat()),
            false,
            ConnectionEventKind::PeerRejected,
        ),
    ];
    for (addr, answer, reset, want) in cases {
        let (end, took) = against(addr, answer, reset);
        assert_eq!(end, want, "{addr}");
        assert!(took < Duration::from_secs(2), "{addr}: {took:?}");
    }
}

/// A Read Request whose FPDU is whole but shorter than the 28-byte body
/// (here: no body at all) is refused at once with the engine's Terminate,
/// as any other malformed FPDU is. The provider's look at the header must
/// not wait for bytes past the FPDU's end (bytes the peer never owes it),
/// nor read the next FPDU's bytes as this one's body.
#[test]
fn a_read_request_without_its_body_is_refused_at_once() {
    let tcp = Tcp::new();
    let s = Node::new(&tcp, "127.0.46.1", "timeout_ms=60000");
    let (_psp, q) = listen(&s.ia, &s.cr);
    let rbuf = s.buf(16);
    let mut raw = Raw::connect(&s, q, &s.ep, &rbuf);
    let start = std::time::Instant::now();
    raw.sock
        .write_all(&fpdu(
            untagged_header(Opcode::ReadRequest, true, 0, 1, 0),
            b"",
        ))
        .unwrap();
    assert!(raw.terminated(), "a Terminate within {T:?}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "refused after {:?}",
        start.elapsed()
    );
    assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Broken);
    assert_eq!(next_dto(&s.rcv).status, DtoStatus::Flushed);
}

/// The bytes of an MPA Request with `pd` (what an rdapl initiator sends),
/// and the engine that sent it.
fn mpa_request(pd: &[u8]) -> (Vec<u8>, Connection) {
    let cfg = Config {
        peer_to_peer: true,
        ..Config::default()
    };
    let mut conn = Connection::new(Role::Initiator, cfg, 0).unwrap();
    conn.connect(0, pd).unwrap();
    let mem = VecMemory::default();
    let mut out = Vec::new();
    while let Some(t) = conn.poll_transmit(&mem) {
        assert!(t.write_to(&mem, &mut out));
    }
    (out, conn)
}

/// Resets `sock` (linger 0, then closed).
fn reset(sock: TcpStream) {
    socket2::SockRef::from(&sock)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(sock);
}

/// True if the server closes `sock` within `within` (EOF or a reset).
fn closed_within(sock: &mut TcpStream, within: Duration) -> bool {
    let end = std::time::Instant::now() + within;
    let mut b = [0u8; 4096];
    while std::time::Instant::now() < end {
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        match sock.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
    }
    false
}

/// A client that resets at each step of the set-up (before its Request,
/// within it, after it while the consumer decides, after the Reply before
/// its RTR), one that trickles its Request a byte at a time, one that
/// sends a Reply to the server, one that sends a Send before its RTR, and
/// one that never sends its RTR: each ends as it should (nothing for the
/// consumer before a whole Request; the request cancelled; the accepting
/// endpoint's `AcceptCompletionError`; a trickled Request held to
/// `mpa_timeout_ms` from its first byte), and a good client is served
/// after them all.
#[test]
fn a_client_failing_at_each_step_of_the_setup_leaves_the_server_serving() {
    let tcp = Tcp::new();
    let s = Node::new(&tcp, "127.0.252.10", "mpa_timeout_ms=400");
    let psp = s.ia.psp_create(19020, &s.cr).unwrap();
    let at = ("127.0.252.10", 19020u16);
    let (req, _) = mpa_request(b"edge");

    // Reset before any byte, and within the Request: nothing reaches the
    // consumer.
    reset(TcpStream::connect(at).unwrap());
    let mut half = TcpStream::connect(at).unwrap();
    half.write_all(&req[..req.len() / 2]).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    reset(half);

    // A Request a byte at a time, every 50 ms: closed by mpa_timeout_ms
    // counted from the connection's start, not from the last byte.
    let mut slow = TcpStream::connect(at).unwrap();
    let t0 = std::time::Instant::now();
    let mut closed = false;
    for &b in &req {
        if slow.write_all(&[b]).is_err() {
            closed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        if t0.elapsed() > Duration::from_secs(3) {
            break;
        }
    }
    assert!(
        closed || closed_within(&mut slow, Duration::from_secs(2)),
        "a trickled Request still open after {:?}",
        t0.elapsed()
    );
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    empty(&s.cr);

    // A Reply sent to the server: closed, nothing for the consumer.
    let mut rep = TcpStream::connect(at).unwrap();
    let mut frame = b"MPA ID Rep Frame".to_vec();
    frame.extend_from_slice(&[0x40, 1, 0, 0]);
    rep.write_all(&frame).unwrap();
    assert!(closed_within(&mut rep, Duration::from_secs(2)), "a Reply");
    empty(&s.cr);

    // A whole Request, then a reset while the consumer decides: its
    // accept fails (the request was cancelled), with an error or the
    // endpoint's AcceptCompletionError.
    let mut gone = TcpStream::connect(at).unwrap();
    gone.write_all(&req).unwrap();
    let cr = next_cr(&s.ia, &s.cr);
    reset(gone);
    std::thread::sleep(Duration::from_millis(200));
    let ep = s.ep2();
    if cr.accept(&ep, b"").is_ok() {
        assert_eq!(
            conn_kind(&s.conn),
            ConnectionEventKind::AcceptCompletionError
        );
    }
    ep.free().unwrap();

    // After the Reply: a reset, a Send instead of the RTR, no RTR at all.
    let mut held = Vec::new();
    for what in ["reset", "send", "silent"] {
        let mut sock = TcpStream::connect(at).unwrap();
        let (req, mut conn) = mpa_request(b"edge");
        sock.write_all(&req).unwrap();
        let ep = s.ep2();
        let t0 = std::time::Instant::now();
        next_cr(&s.ia, &s.cr).accept(&ep, b"").unwrap();
        // The Reply.
        let mut mem = VecMemory::default();
        sock.set_read_timeout(Some(T)).unwrap();
        let mut b = [0u8; 512];
        let n = sock.read(&mut b).unwrap();
        conn.handle_input(0, &b[..n], &mut mem);
        match what {
            "reset" => reset(sock),
            "send" => {
                sock.write_all(&fpdu(
                    untagged_header(Opcode::Send, true, 0, 1, 0),
                    b"early",
                ))
                .unwrap();
                held.push(sock);
            }
            _ => held.push(sock),
        }
        assert_eq!(
            conn_kind(&s.conn),
            ConnectionEventKind::AcceptCompletionError,
            "{what}"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "{what}: {:?}",
            t0.elapsed()
        );
        assert_eq!(ep.state(), EpState::Disconnected, "{what}");
        ep.free().unwrap();
    }
    empty(&s.cr);

    // A good client still gets in.
    let c = Node::new(&tcp, "127.0.252.11", "");
    c.ep.connect(s.ia.address(), 19020, Some(T), b"real")
        .unwrap();
    let cr = next_cr(&s.ia, &s.cr);
    assert_eq!(cr.private_data(), b"real");
    cr.accept(&s.ep, b"").unwrap();
    assert_eq!(conn_kind(&c.conn), ConnectionEventKind::Established);
    assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Established);
    drop(psp);
}

/// A peer of another implementation may send more private data in its
/// MPA Request than this IA takes (`max_private_data_size`; MPA allows
/// 512 bytes): the consumer gets the first `max_private_data_size` bytes
/// and an arrival that says the rest was cut (`truncated`), never more
/// than the IA said it takes. The request can be answered as any other.
#[test]
fn a_request_with_more_private_data_than_the_ia_takes_is_cut() {
    let tcp = Tcp::new();
    let s = Node::new(&tcp, "127.0.46.2", "");
    let (_psp, q) = listen(&s.ia, &s.cr);
    let max = s.ia.query().unwrap().0.max_private_data_size;
    let pd: Vec<u8> = (0..252u8).collect();
    assert!(pd.len() > max);
    let (req, _) = mpa_request(&pd);
    let mut sock = TcpStream::connect(("127.0.46.2", q as u16)).unwrap();
    sock.write_all(&req).unwrap();
    let a = match next(&s.cr) {
        Event::ConnectionRequest(a) => a,
        e => panic!("expected a connection request, got {e:?}"),
    };
    assert!(a.truncated, "{a:?}");
    let cr = s.ia.cr(a.cr).unwrap();
    assert_eq!(cr.private_data(), &pd[..max]);
    cr.reject(b"").unwrap();
    // A request within the limit says nothing was cut.
    let (req, _) = mpa_request(&pd[..max]);
    let mut sock = TcpStream::connect(("127.0.46.2", q as u16)).unwrap();
    sock.write_all(&req).unwrap();
    let a = match next(&s.cr) {
        Event::ConnectionRequest(a) => a,
        e => panic!("expected a connection request, got {e:?}"),
    };
    assert!(!a.truncated, "{a:?}");
    assert_eq!(s.ia.cr(a.cr).unwrap().private_data(), &pd[..max]);
}

/// A malformed Send (a wrong MSN, a wrong DDP or RDMAP version, another
/// opcode inside a message under way) that finds no receive posted is
/// refused at once with the engine's Terminate. The wait for a receive
/// (`recv_wait_ms`) is for a Send that a receive would let in; none
/// makes these right, and waiting only delays the error.
#[test]
fn a_malformed_send_with_no_receive_posted_is_refused_at_once() {
    let tcp = Tcp::new();
    let s = Node::new(&tcp, "127.0.182.11", "recv_wait_ms=60000");
    let q = 18211;
    let _psp = s.ia.psp_create(q, &s.cr).unwrap();
    let rbuf = s.buf(16);
    let send = |msn, last| untagged_header(Opcode::Send, last, 0, msn, 0);
    let versions = |ddp, rdmap| {
        let mut h = send(2, true);
        (h.ddp_version, h.rdmap_version) = (ddp, rdmap);
        h
    };
    // The one receive posted takes a whole Send, or the first segment
    // of one; then comes the bad Send.
    let whole = fpdu(send(1, true), b"first");
    let begun = fpdu(send(1, false), b"half");
    let cases = [
        (
            "msn",
            &whole,
            fpdu(send(5, true), b"bad"),
            DtoStatus::Success,
        ),
        (
            "ddp version",
            &whole,
            fpdu(versions(2, 1), b"bad"),
            DtoStatus::Success,
        ),
        (
            "rdmap version",
            &whole,
            fpdu(versions(1, 0), b"bad"),
            DtoStatus::Success,
        ),
        (
            "opcode",
            &begun,
            fpdu(untagged_header(Opcode::SendSe, true, 0, 1, 0), b"bad"),
            DtoStatus::Flushed,
        ),
    ];
    for (what, first, bad, recv_status) in cases {
        let ep = s.ep2();
        let mut raw = Raw::connect(&s, q, &ep, &rbuf);
        raw.sock.write_all(first).unwrap();
        if recv_status == DtoStatus::Success {
            let r = next_dto(&s.rcv);
            assert_eq!((r.cookie, r.status), (1, DtoStatus::Success), "{what}");
        }
        let start = std::time::Instant::now();
        raw.sock.write_all(&bad).unwrap();
        assert!(raw.terminated(), "{what}: a Terminate");
        let took = start.elapsed();
        assert!(
            took < Duration::from_secs(2),
            "{what}: refused after {took:?}"
        );
        assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Broken, "{what}");
        if recv_status != DtoStatus::Success {
            assert_eq!(next_dto(&s.rcv).status, recv_status, "{what}");
        }
        assert_eq!(ep.state(), EpState::Disconnected, "{what}");
        ep.free().unwrap();
    }
}
