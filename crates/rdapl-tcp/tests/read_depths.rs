//! An endpoint's `max_rdma_read_in` / `max_rdma_read_out` are the IRD and
//! ORD it offers in MPA (RFC 6581), as a raw iWARP peer (the rdapl-iwarp
//! engine over a plain socket) sees them from either side; the IA's
//! `max_rdma_read_per_ep` bounds them; a connection whose ORD is 1
//! still completes a burst of Reads and placed Sends, one read at a time;
//! and one whose peer takes no reads at all (IRD 0) completes its Sends
//! once TCP has them, since no fence can ask for proof of placement.

mod common;

use common::*;
use rdapl::*;
use rdapl_iwarp::{Config, Connection, Event as IwEvent, Role, VecMemory};
use rdapl_tcp::Tcp;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

fn depths(ird: usize, ord: usize) -> EpAttr {
    EpAttr {
        max_rdma_read_in: ird,
        max_rdma_read_out: ord,
        ..EpAttr::default()
    }
}

/// Sends what a raw engine has to send.
fn flush(sock: &mut TcpStream, conn: &mut Connection) {
    let mem = VecMemory::default();
    let mut out = Vec::new();
    while let Some(t) = conn.poll_transmit(&mem) {
        assert!(t.write_to(&mem, &mut out));
    }
    sock.write_all(&out).unwrap();
}

/// A raw engine on `sock`: sends what it has, reads until `done` says so
/// of an event (bounded).
fn drive(sock: &mut TcpStream, conn: &mut Connection, done: impl FnMut(&IwEvent) -> bool) {
    drive_with(sock, conn, &mut VecMemory::default(), done)
}

/// [`drive`] with the raw side's memory (its posted receives).
fn drive_with(
    sock: &mut TcpStream,
    conn: &mut Connection,
    mem_in: &mut VecMemory,
    mut done: impl FnMut(&IwEvent) -> bool,
) {
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let end = Instant::now() + T;
    loop {
        flush(sock, conn);
        while let Some(e) = conn.poll_event() {
            if done(&e) {
                return;
            }
        }
        assert!(Instant::now() < end, "no such event from the raw peer");
        let mut b = [0u8; 4096];
        if let Ok(n) = sock.read(&mut b) {
            assert!(n > 0, "the rdapl side closed");
            conn.handle_input(0, &b[..n], mem_in);
        }
    }
}

#[test]
fn a_responders_depths_are_its_endpoints() {
    let tcp = Tcp::new();
    let s = Node::with_attr(ia(&tcp, "127.0.0.1", ""), 64, Some(depths(3, 2)));
    let (_psp, q) = listen(&s.ia, &s.cr);
    let mut sock = TcpStream::connect(("127.0.0.1", q as u16)).unwrap();
    // The raw initiator's ORD is below the server's IRD (nothing raises
    // it) and its IRD above the server's ORD (nothing lowers that).
    let cfg = Config {
        peer_to_peer: true,
        ird: 4,
        ord: 1,
        ..Config::default()
    };
    let mut conn = Connection::new(Role::Initiator, cfg, 0).unwrap();
    conn.connect(0, b"raw").unwrap();
    flush(&mut sock, &mut conn);
    next_cr(&s.ia, &s.cr).accept(&s.ep, b"").unwrap();
    let mut got = None;
    drive(&mut sock, &mut conn, |e| match e {
        IwEvent::Established { params, .. } => {
            got = Some((params.peer_ird, params.peer_ord));
            true
        }
        _ => false,
    });
    assert_eq!(got, Some((Some(3), Some(2))));
}

#[test]
fn an_initiators_depths_are_its_endpoints() {
    let tcp = Tcp::new();
    let c = Node::with_attr(ia(&tcp, "127.0.0.1", ""), 64, Some(depths(5, 2)));
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = u64::from(l.local_addr().unwrap().port());
    c.ep.connect("127.0.0.1".parse().unwrap(), port, Some(T), b"")
        .unwrap();
    let (mut sock, _) = l.accept().unwrap();
    let mut conn = Connection::new(Role::Responder, Config::default(), 0).unwrap();
    let mut got = None;
    drive(&mut sock, &mut conn, |e| match e {
        IwEvent::ConnectRequest(r) => {
            got = r.params.map(|p| (p.ird, p.ord));
            true
        }
        _ => false,
    });
    assert_eq!(got, Some((5, 2)));
}

#[test]
fn depths_beyond_the_ias_are_refused() {
    let tcp = Tcp::new();
    let ia = ia(&tcp, "127.0.0.1", "");
    let most = ia.query().unwrap().0.max_rdma_read_per_ep;
    let pz = ia.pz_create().unwrap();
    let evd = ia
        .evd_create(16, EvdFlags::DTO | EvdFlags::CONNECTION)
        .unwrap();
    for attr in [depths(most + 1, 1), depths(1, most + 1)] {
        let e = ia
            .ep_create(&pz, Some(&evd), Some(&evd), Some(&evd), Some(attr))
            .unwrap_err();
        assert!(matches!(e, Error::InvalidParameter { .. }), "{e:?}");
    }
    ia.ep_create(
        &pz,
        Some(&evd),
        Some(&evd),
        Some(&evd),
        Some(depths(most, most)),
    )
    .unwrap();
}

/// ORD 1: Reads and placed Sends in a burst (each Send's fence is a read
/// too) all complete, in order, with the right bytes.
#[test]
fn a_burst_through_an_ord_of_one() {
    let tcp = Tcp::new();
    let p = Pair::new(
        Node::with_attr(ia(&tcp, "127.0.0.1", ""), 256, Some(depths(1, 1))),
        Node::with_attr(ia(&tcp, "127.0.0.1", ""), 256, Some(depths(1, 1))),
    );
    p.connect();
    let data = pattern(64 << 10, 7);
    let src = p.s.lmr(data.clone());
    let dst = p.c.buf(8 * (64 << 10));
    let sbuf = p.s.buf(8 * 64);
    let msg = p.c.lmr(pattern(64, 3));
    for i in 0..8u64 {
        p.s.recv(&sbuf, i * 64, 64, 100 + i);
    }
    for i in 0..8u64 {
        p.c.ep
            .post_rdma_read(
                &[dst.triplet(i << 16, 64 << 10).unwrap()],
                src.rmr_triplet(0, 64 << 10).unwrap(),
                i,
                D,
            )
            .unwrap();
        p.c.send(&msg, 0, 64, 100 + i);
    }
    for i in 0..8u64 {
        for op in [DtoOp::RdmaRead, DtoOp::Send] {
            let d = next_dto(&p.c.req);
            assert_eq!(
                (d.operation, d.status, d.cookie),
                (
                    op,
                    DtoStatus::Success,
                    if op == DtoOp::Send { 100 + i } else { i }
                )
            );
        }
    }
    for i in 0..8u64 {
        let d = next_dto(&p.s.rcv);
        assert_eq!((d.status, d.cookie), (DtoStatus::Success, 100 + i));
    }
    let got = dst.to_vec().unwrap();
    for i in 0..8 {
        assert_eq!(&got[i << 16..(i + 1) << 16], &data[..], "read {i}");
    }
}

/// A raw iWARP initiator that takes no reads (its IRD 0), connected to
/// `s`'s listener on `q` and established (its RTR sent), with a receive of
/// 64 bytes (id 1) posted.
fn peer_taking_no_reads(s: &Node, q: u64) -> (TcpStream, Connection, VecMemory) {
    let mut sock = TcpStream::connect(("127.0.0.1", q as u16)).unwrap();
    let cfg = Config {
        peer_to_peer: true,
        ird: 0,
        ord: 1,
        ..Config::default()
    };
    let mut conn = Connection::new(Role::Initiator, cfg, 0).unwrap();
    conn.connect(0, b"raw").unwrap();
    let mut mem = VecMemory::default();
    mem.recvs.insert(1, vec![0; 64]);
    flush(&mut sock, &mut conn);
    next_cr(&s.ia, &s.cr).accept(&s.ep, b"").unwrap();
    drive_with(&mut sock, &mut conn, &mut mem, |e| {
        matches!(e, IwEvent::Established { .. })
    });
    conn.post_recv(1, 64).unwrap();
    flush(&mut sock, &mut conn); // the RTR
    assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Established);
    (sock, conn, mem)
}

/// A peer whose IRD is 0 takes no fence: a placed Send to it used to wait
/// for ever (the fence, a read beyond an ORD of 0, held the queue); it now
/// completes once sent, and the peer gets it.
#[test]
fn sends_to_a_peer_that_takes_no_reads_complete() {
    let tcp = Tcp::new();
    let s = Node::with_attr(ia(&tcp, "127.0.0.1", ""), 64, None);
    let (_psp, q) = listen(&s.ia, &s.cr);
    let (mut sock, mut conn, mut mem) = peer_taking_no_reads(&s, q);
    let data = pattern(64, 9);
    let src = s.lmr(data.clone());
    s.send(&src, 0, 64, 5);
    let mut got = None;
    drive_with(&mut sock, &mut conn, &mut mem, |e| match e {
        IwEvent::RecvComplete { wr_id, len, .. } => {
            got = Some((*wr_id, *len));
            true
        }
        _ => false,
    });
    assert_eq!(got, Some((1, 64)));
    assert_eq!(mem.recvs[&1], data);
    let d = next_dto(&s.req);
    assert_eq!((d.status, d.cookie), (DtoStatus::Success, 5));
}

/// An RDMA Read posted toward a peer whose IRD is 0 (our ORD 0) can never
/// go out: it must complete (with an error) at once, not wait at the head
/// of the queue, holding the Send posted behind it, until the watchdog's
/// `timeout_ms` (or for ever, while the peer keeps talking).
#[test]
fn a_read_toward_a_peer_that_takes_no_reads_completes_at_once() {
    let tcp = Tcp::new();
    let s = Node::with_attr(ia(&tcp, "127.0.0.1", "timeout_ms=60000"), 64, None);
    let (_psp, q) = listen(&s.ia, &s.cr);
    let _peer = peer_taking_no_reads(&s, q);
    let dst = s.buf(64);
    s.ep.post_rdma_read(
        &[dst.triplet(0, 64).unwrap()],
        RmrTriplet {
            rmr_context: 0x77,
            target_address: 0,
            segment_length: 64,
        },
        5,
        D,
    )
    .unwrap();
    let got = s.req.wait(Some(Duration::from_secs(3)), 1);
    assert!(
        matches!(got, Ok((Event::Dto(ref d), _)) if d.cookie == 5 && d.status != DtoStatus::Success),
        "the read did not complete: {got:?}"
    );
}
