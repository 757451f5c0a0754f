//! Model tests of data transfer operations on the loopback provider (public
//! API only): ordering, length and protection errors, the receiver-not-ready
//! window, completion flags, scatter/gather, queue and EVD limits, and fault
//! injection.
//!
//! Every test uses its own IA addresses (`127.0.23.<m>`) and qualifiers, so
//! the tests run in parallel; every wait has a timeout.
//!
//! The RNR time is a setting of a loopback instance: the test that changes
//! it runs on a loopback fabric of its own. Every other test in this binary
//! posts its receives before the sends that need them, so none depends on
//! the RNR time (and none waits for it).

use crate::case;
use crate::support as common;

use common::{
    D, Inject, Pair, T, empty, flushed, in_process, next, next_cr, next_dto, pair_on, pair_with,
    resource_err, rt,
};
use rdapl::error::Subtype;
use rdapl::*;
use std::time::{Duration, Instant};

/// A connected pair with 256-entry DTO EVDs (see [`pair_with`]).
fn pair(client: &str, server: &str, qual: u64) -> Pair {
    pair_with(client, server, qual, None, 256, 256)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[case]
fn completions_and_data_in_post_order() {
    let p = pair("127.0.23.1", "127.0.23.2", 100);
    const N: usize = 200;
    let rbuf = p.s.lmr(vec![0; N * 8]);
    let sbuf = p.c.lmr((0..N * 8).map(|i| (i / 8) as u8).collect());
    for i in 0..N {
        p.s.recv(&rbuf, (i * 8) as u64, 8, 1000 + i as u64);
    }
    // Sends interleaved with RDMA writes into a separate area.
    let area = p.s.lmr(vec![0; N]);
    for i in 0..N {
        p.c.send(&sbuf, (i * 8) as u64, 8, i as u64);
        if i % 10 == 0 {
            p.c.ep
                .post_rdma_write(
                    &[sbuf.triplet((i * 8) as u64, 1).unwrap()],
                    area.rmr_triplet(i as u64, 1).unwrap(),
                    10_000 + i as u64,
                    D,
                )
                .unwrap();
        }
    }
    for i in 0..N {
        let d = next_dto(&p.c.req);
        assert_eq!(
            (d.cookie, d.status, d.operation, d.transferred_length),
            (i as u64, DtoStatus::Success, DtoOp::Send, 8)
        );
        if i % 10 == 0 {
            let d = next_dto(&p.c.req);
            assert_eq!(
                (d.cookie, d.status, d.operation),
                (10_000 + i as u64, DtoStatus::Success, DtoOp::RdmaWrite)
            );
        }
        let r = next_dto(&p.s.rcv);
        assert_eq!(
            (r.cookie, r.status, r.operation, r.transferred_length),
            (1000 + i as u64, DtoStatus::Success, DtoOp::Receive, 8)
        );
    }
    empty(&p.c.req);
    empty(&p.s.rcv);
    // Receive i holds message i.
    assert_eq!(rbuf.to_vec().unwrap(), sbuf.to_vec().unwrap());
    let a = area.to_vec().unwrap();
    for i in (0..N).step_by(10) {
        assert_eq!(a[i], i as u8);
    }
}

#[case]
fn receive_too_small() {
    if crate::support::skip_unless_placed() {
        return;
    }
    let p = pair("127.0.23.3", "127.0.23.4", 300);
    let rbuf = p.s.lmr(vec![0; 32]);
    p.s.recv(&rbuf, 0, 8, 1);
    p.s.recv(&rbuf, 8, 24, 2);
    let cbuf = p.c.lmr(pattern(16, 1));
    p.c.recv(&cbuf, 0, 16, 3);
    p.c.send(&cbuf, 0, 16, 4);
    let d = next_dto(&p.c.req);
    assert_eq!(
        (d.cookie, d.status, d.operation, d.transferred_length),
        (4, DtoStatus::RemoteResponder, DtoOp::Send, 0)
    );
    let d = next_dto(&p.s.rcv);
    assert_eq!(
        (d.cookie, d.status, d.operation),
        (1, DtoStatus::LocalLength, DtoOp::Receive)
    );
    flushed(&p.s.rcv, &[2]);
    flushed(&p.c.rcv, &[3]);
    empty(&p.c.req);
    p.expect_end(ConnectionEventKind::Broken);
    assert_eq!(rbuf.to_vec().unwrap(), vec![0; 32], "no byte moved");
    assert!(matches!(
        p.c.ep.post_send(&[cbuf.triplet(0, 1).unwrap()], 5, D),
        Err(Error::InvalidState {
            state: Subtype::InvalidStateEpDisconnected,
            ..
        })
    ));
    // An exact fit is fine.
    p.reconnect();
    p.s.recv(&rbuf, 0, 16, 6);
    p.c.send(&cbuf, 0, 16, 7);
    assert_eq!(next_dto(&p.c.req).status, DtoStatus::Success);
    assert_eq!(next_dto(&p.s.rcv).transferred_length, 16);
    assert_eq!(rbuf.to_vec().unwrap()[..16], pattern(16, 1));
}

/// The RNR time, set on a loopback fabric of this test's own.
#[case]
fn rnr_timeout_and_late_receive() {
    let rnr = Duration::from_millis(300);
    let lb = Loopback::new();
    lb.set_rnr_timeout(rnr);
    let p = pair_on(&lb, ("127.0.23.5", "127.0.23.6", 500), None, 256, 256);
    let cbuf = p.c.lmr(pattern(16, 2));
    let rbuf = p.s.lmr(vec![0; 16]);
    let cspare = p.c.lmr(vec![0; 16]);
    p.c.recv(&cspare, 0, 16, 1);

    // No receive: the send waits the RNR time, then fails.
    let t0 = Instant::now();
    p.c.send(&cbuf, 0, 16, 2);
    std::thread::sleep(Duration::from_millis(100));
    empty(&p.c.req);
    assert_eq!(p.c.ep.state(), EpState::Connected, "still waiting");
    let d = next_dto(&p.c.req);
    let waited = t0.elapsed();
    assert_eq!(
        (d.cookie, d.status, d.operation),
        (2, DtoStatus::ReceiverNotReady, DtoOp::Send)
    );
    assert!(waited >= rnr - Duration::from_millis(10), "{waited:?}");
    flushed(&p.c.rcv, &[1]);
    p.expect_end(ConnectionEventKind::Broken);

    // A receive posted inside the window lets the send complete.
    p.reconnect();
    p.c.send(&cbuf, 0, 16, 3);
    std::thread::sleep(Duration::from_millis(100));
    empty(&p.c.req);
    p.s.recv(&rbuf, 0, 16, 4);
    let d = next_dto(&p.c.req);
    assert_eq!((d.cookie, d.status), (3, DtoStatus::Success));
    let d = next_dto(&p.s.rcv);
    assert_eq!(
        (d.cookie, d.status, d.transferred_length),
        (4, DtoStatus::Success, 16)
    );
    assert_eq!(rbuf.to_vec().unwrap(), pattern(16, 2));
    // The stale RNR timer of that send must not break the connection later.
    std::thread::sleep(rnr + Duration::from_millis(50));
    assert_eq!(p.c.ep.state(), EpState::Connected);
    empty(&p.c.conn);
    empty(&p.c.req);
}

#[case]
fn bad_remote_key_range_or_right() {
    if crate::support::skip_unless_placed() {
        return;
    }
    let p = pair("127.0.23.7", "127.0.23.8", 700);
    let tgt = p.s.lmr(pattern(64, 3));
    let ro =
        p.s.pz
            .lmr_create_from(pattern(64, 4), MemPriv::LOCAL_READ | MemPriv::REMOTE_READ)
            .unwrap();
    let wo =
        p.s.pz
            .lmr_create_from(pattern(64, 5), MemPriv::LOCAL_WRITE | MemPriv::REMOTE_WRITE)
            .unwrap();
    let src = p.c.lmr(vec![0xFF; 64]);
    let sink = p.c.lmr(vec![0; 64]);
    let base = tgt.address().unwrap();
    let k = tgt.context().unwrap();
    let cases: Vec<(bool, RmrTriplet, &Lmr, &str)> = vec![
        (true, rt(k ^ 0x80, base, 8), &tgt, "write, bad key"),
        (true, rt(0xFFFF_FF00, base, 8), &tgt, "write, unknown slot"),
        (true, rt(k, base + 60, 8), &tgt, "write past the end"),
        (true, rt(k, base - 1, 8), &tgt, "write before the start"),
        (
            true,
            rt(k, u64::MAX - 3, 8),
            &tgt,
            "write, wrapping address",
        ),
        (true, ro.rmr_triplet(0, 8).unwrap(), &ro, "write, no right"),
        (false, rt(k ^ 0x80, base, 8), &tgt, "read, bad key"),
        (false, rt(k, base + 57, 8), &tgt, "read past the end"),
        (false, wo.rmr_triplet(0, 8).unwrap(), &wo, "read, no right"),
    ];
    for (i, (is_write, remote, lmr, what)) in cases.into_iter().enumerate() {
        let before = lmr.to_vec().unwrap();
        let cookie = 100 + i as u64;
        if is_write {
            p.c.ep
                .post_rdma_write(&[src.triplet(0, 8).unwrap()], remote, cookie, D)
                .unwrap();
        } else {
            p.c.ep
                .post_rdma_read(&[sink.triplet(0, 8).unwrap()], remote, cookie, D)
                .unwrap();
        }
        let d = next_dto(&p.c.req);
        assert_eq!(
            (d.cookie, d.status, d.transferred_length),
            (cookie, DtoStatus::RemoteAccess, 0),
            "{what}"
        );
        p.expect_end(ConnectionEventKind::Broken);
        assert_eq!(lmr.to_vec().unwrap(), before, "{what}: target changed");
        assert_eq!(sink.to_vec().unwrap(), vec![0; 64], "{what}: sink changed");
        p.reconnect();
    }
    // The rights that are granted work.
    p.c.ep
        .post_rdma_read(
            &[sink.triplet(0, 8).unwrap()],
            ro.rmr_triplet(0, 8).unwrap(),
            1,
            D,
        )
        .unwrap();
    assert_eq!(next_dto(&p.c.req).status, DtoStatus::Success);
    assert_eq!(sink.to_vec().unwrap()[..8], pattern(64, 4)[..8]);
    p.c.ep
        .post_rdma_write(
            &[src.triplet(0, 8).unwrap()],
            wo.rmr_triplet(56, 8).unwrap(),
            2,
            D,
        )
        .unwrap();
    assert_eq!(next_dto(&p.c.req).status, DtoStatus::Success);
    assert_eq!(wo.to_vec().unwrap()[56..], [0xFF; 8]);
    // A remote triplet shorter than the local list is refused at post time.
    assert!(matches!(
        p.c.ep
            .post_rdma_write(&[src.triplet(0, 16).unwrap()], rt(k, base, 8), 3, D),
        Err(Error::Length(_))
    ));
    empty(&p.c.req);
}

#[case]
fn bad_local_key_or_right() {
    if crate::support::skip_unless_placed() {
        return;
    }
    let p = pair("127.0.23.9", "127.0.23.10", 900);
    // Send from a buffer without LOCAL_READ.
    let noread =
        p.c.pz
            .lmr_create_from(vec![1; 8], MemPriv::LOCAL_WRITE)
            .unwrap();
    let rbuf = p.s.lmr(vec![0; 8]);
    p.s.recv(&rbuf, 0, 8, 1);
    p.c.send(&noread, 0, 8, 2);
    assert_eq!(next_dto(&p.c.req).status, DtoStatus::LocalProtection);
    flushed(&p.s.rcv, &[1]);
    p.expect_end(ConnectionEventKind::Broken);
    assert_eq!(rbuf.to_vec().unwrap(), vec![0; 8]);
    p.reconnect();
    // Receive into a buffer without LOCAL_WRITE.
    let nowrite =
        p.s.pz
            .lmr_create_from(vec![0; 8], MemPriv::LOCAL_READ)
            .unwrap();
    p.s.recv(&nowrite, 0, 8, 3);
    let sbuf = p.c.lmr(vec![2; 8]);
    p.c.send(&sbuf, 0, 8, 4);
    assert_eq!(next_dto(&p.c.req).status, DtoStatus::RemoteResponder);
    let d = next_dto(&p.s.rcv);
    assert_eq!((d.cookie, d.status), (3, DtoStatus::LocalProtection));
    p.expect_end(ConnectionEventKind::Broken);
    assert_eq!(nowrite.to_vec().unwrap(), vec![0; 8]);
    p.reconnect();
    // A local range past the LMR's end (built by hand: `triplet` refuses it).
    let t = LmrTriplet {
        virtual_address: sbuf.address().unwrap() + 4,
        ..sbuf.triplet(0, 8).unwrap()
    };
    p.s.recv(&rbuf, 0, 8, 5);
    p.c.ep.post_send(&[t], 6, D).unwrap();
    assert_eq!(next_dto(&p.c.req).status, DtoStatus::LocalProtection);
    flushed(&p.s.rcv, &[5]);
    p.expect_end(ConnectionEventKind::Broken);
}

#[case]
fn suppress_and_unsignalled_only_report_errors() {
    if common::skip_unless_loopback("assumes requests complete inside the poster's call") {
        return;
    }
    let p = pair_with("127.0.23.11", "127.0.23.12", 1100, None, 2, 256);
    let tgt = p.s.lmr(vec![0; 64]);
    let src = p.c.lmr(pattern(64, 6));
    let rbuf = p.s.lmr(vec![0; 64]);
    let quiet = [CompletionFlags::SUPPRESS, CompletionFlags::UNSIGNALLED];
    // Successful quiet requests give no completion and free their EVD slot:
    // twenty of them pass through a request EVD of two entries.
    for i in 0..20u64 {
        p.c.ep
            .post_rdma_write(
                &[src.triplet(i, 1).unwrap()],
                tgt.rmr_triplet(i, 1).unwrap(),
                i,
                quiet[i as usize % 2],
            )
            .unwrap();
    }
    p.s.recv(&rbuf, 0, 8, 50);
    p.c.ep
        .post_send(&[src.triplet(0, 8).unwrap()], 51, CompletionFlags::SUPPRESS)
        .unwrap();
    // The receiver still sees its (default) receive complete.
    let d = next_dto(&p.s.rcv);
    assert_eq!((d.cookie, d.status), (50, DtoStatus::Success));
    // A quiet receive is quiet on success too.
    p.s.ep
        .post_recv(
            &[rbuf.triplet(8, 8).unwrap()],
            52,
            CompletionFlags::SUPPRESS,
        )
        .unwrap();
    p.c.send(&src, 8, 8, 53);
    assert_eq!(
        next_dto(&p.c.req).cookie,
        53,
        "only the default send reports"
    );
    empty(&p.c.req);
    empty(&p.s.rcv);
    assert_eq!(tgt.to_vec().unwrap()[..20], pattern(64, 6)[..20]);
    assert_eq!(rbuf.to_vec().unwrap()[..16], pattern(64, 6)[..16]);

    // Errors are always reported: a suppressed write with a bad key ...
    p.c.ep
        .post_rdma_write(
            &[src.triplet(0, 8).unwrap()],
            rt(tgt.context().unwrap() ^ 0x40, 0, 8),
            60,
            CompletionFlags::SUPPRESS,
        )
        .unwrap();
    let d = next_dto(&p.c.req);
    assert_eq!((d.cookie, d.status), (60, DtoStatus::RemoteAccess));
    p.expect_end(ConnectionEventKind::Broken);
    p.reconnect();
    // ... an unsignalled send into a too small receive ...
    p.s.ep
        .post_recv(
            &[rbuf.triplet(0, 4).unwrap()],
            61,
            CompletionFlags::SUPPRESS,
        )
        .unwrap();
    p.c.ep
        .post_send(
            &[src.triplet(0, 8).unwrap()],
            62,
            CompletionFlags::UNSIGNALLED,
        )
        .unwrap();
    let d = next_dto(&p.c.req);
    assert_eq!((d.cookie, d.status), (62, DtoStatus::RemoteResponder));
    let d = next_dto(&p.s.rcv);
    assert_eq!((d.cookie, d.status), (61, DtoStatus::LocalLength));
    p.expect_end(ConnectionEventKind::Broken);
    p.reconnect();
    // ... and a flush.
    p.s.ep
        .post_recv(
            &[rbuf.triplet(0, 4).unwrap()],
            63,
            CompletionFlags::SUPPRESS,
        )
        .unwrap();
    p.s.ep.disconnect(true).unwrap();
    flushed(&p.s.rcv, &[63]);
    p.expect_end(ConnectionEventKind::Disconnected);
    // Other flags are accepted and complete as usual.
    p.reconnect();
    p.s.ep
        .post_recv(
            &[rbuf.triplet(0, 8).unwrap()],
            64,
            CompletionFlags::SOLICITED_WAIT,
        )
        .unwrap();
    p.c.ep
        .post_send(
            &[src.triplet(0, 8).unwrap()],
            65,
            CompletionFlags::BARRIER_FENCE,
        )
        .unwrap();
    assert_eq!(next_dto(&p.s.rcv).cookie, 64);
    assert_eq!(next_dto(&p.c.req).cookie, 65);
}

#[case]
fn scatter_gather_several_entries() {
    let p = pair("127.0.23.13", "127.0.23.14", 1300);
    let a = p.c.lmr(b"ABCDEFGHIJ".to_vec());
    let b = p.c.lmr(b"0123456789".to_vec());
    // Gather 3 + 4 + 2 = 9 bytes from two LMRs (and a zero-length entry).
    let gather = [
        a.triplet(0, 3).unwrap(),
        b.triplet(2, 4).unwrap(),
        a.triplet(5, 0).unwrap(),
        a.triplet(8, 2).unwrap(),
    ];
    // Scatter into 2 + 1 + 5 + 8 bytes spread over two LMRs.
    let x = p.s.lmr(vec![b'.'; 12]);
    let y = p.s.lmr(vec![b'.'; 12]);
    let scatter = [
        x.triplet(1, 2).unwrap(),
        y.triplet(0, 1).unwrap(),
        x.triplet(6, 5).unwrap(),
        y.triplet(4, 8).unwrap(),
    ];
    p.s.ep.post_recv(&scatter, 1, D).unwrap();
    p.c.ep.post_send(&gather, 2, D).unwrap();
    assert_eq!(next_dto(&p.c.req).transferred_length, 9);
    let d = next_dto(&p.s.rcv);
    assert_eq!((d.status, d.transferred_length), (DtoStatus::Success, 9));
    // "ABC2345IJ" -> x[1..3]="AB", y[0]="C", x[6..11]="2345I", y[4..5]="J".
    assert_eq!(x.to_vec().unwrap(), b".AB...2345I.");
    assert_eq!(y.to_vec().unwrap(), b"C...J.......");

    // RDMA write gathers into one contiguous remote range.
    let tgt = p.s.lmr(vec![b'-'; 16]);
    p.c.ep
        .post_rdma_write(&gather, tgt.rmr_triplet(2, 9).unwrap(), 3, D)
        .unwrap();
    assert_eq!(next_dto(&p.c.req).transferred_length, 9);
    common::assert_placed(|| tgt.to_vec().unwrap(), b"--ABC2345IJ-----");
    // RDMA read scatters a contiguous remote range.
    let r1 = p.c.lmr(vec![b'_'; 4]);
    let r2 = p.c.lmr(vec![b'_'; 8]);
    p.c.ep
        .post_rdma_read(
            &[r1.triplet(1, 3).unwrap(), r2.triplet(0, 6).unwrap()],
            tgt.rmr_triplet(2, 9).unwrap(),
            4,
            D,
        )
        .unwrap();
    let d = next_dto(&p.c.req);
    assert_eq!((d.status, d.transferred_length), (DtoStatus::Success, 9));
    assert_eq!(r1.to_vec().unwrap(), b"_ABC");
    assert_eq!(r2.to_vec().unwrap(), b"2345IJ__");
}

#[case]
fn too_many_iov_entries() {
    let attr = EpAttr {
        max_request_iov: 2,
        max_recv_iov: 3,
        ..Default::default()
    };
    let p = pair_with("127.0.23.15", "127.0.23.16", 1500, Some(attr), 64, 64);
    let b = p.c.lmr(vec![0; 16]);
    let t = b.triplet(0, 1).unwrap();
    let r = b.rmr_triplet(0, 16).unwrap();
    let param = |r: Result<()>| {
        assert!(
            matches!(r, Err(Error::InvalidParameter { arg: 2, .. })),
            "{r:?}"
        )
    };
    param(p.c.ep.post_send(&[t; 3], 1, D));
    param(p.c.ep.post_rdma_write(&[t; 3], r, 2, D));
    param(p.c.ep.post_rdma_read(&[t; 3], r, 3, D));
    param(p.c.ep.post_recv(&[t; 4], 4, D));
    // At the limit they are accepted.
    p.c.ep.post_recv(&[t; 3], 5, D).unwrap();
    let sb = p.s.lmr(vec![7; 2]);
    p.s.ep
        .post_send(&[sb.triplet(0, 1).unwrap(); 2], 6, D)
        .unwrap();
    assert_eq!(next_dto(&p.c.rcv).transferred_length, 2);
    assert_eq!(next_dto(&p.s.req).status, DtoStatus::Success);
    empty(&p.c.req);
    assert_eq!(p.c.ep.state(), EpState::Connected);
}

#[case]
fn work_queue_full() {
    if crate::support::skip_unless_placed() {
        return;
    }
    let attr = EpAttr {
        max_request_dtos: 2,
        max_recv_dtos: 3,
        ..Default::default()
    };
    let p = pair_with("127.0.23.17", "127.0.23.18", 1700, Some(attr), 64, 64);
    let tep = |r: Result<()>| resource_err(r, Subtype::ResourceTep);
    let rb = p.s.lmr(vec![0; 32]);
    // The receive queue: three fit, a fourth is refused (on the client,
    // where no send will take them).
    let cb = p.c.lmr(vec![0; 32]);
    for i in 0..3 {
        p.c.recv(&cb, i * 8, 8, 100 + i);
    }
    tep(p.c.ep.post_recv(&[cb.triplet(24, 8).unwrap()], 103, D));
    // Sends waiting for a receive (none posted yet) fill the send queue:
    // outstanding requests count, wherever the provider keeps them.
    let sb = p.c.lmr(pattern(24, 7));
    p.c.send(&sb, 0, 8, 10);
    p.c.send(&sb, 8, 8, 11);
    tep(p.c.ep.post_send(&[sb.triplet(16, 8).unwrap()], 12, D));
    assert_eq!(p.c.ep.query().unwrap().outstanding, (2, 3));
    for i in 0..3 {
        p.s.recv(&rb, i * 8, 8, i);
    }
    // Nothing was lost: both complete, in order, into the first receives.
    for k in [10, 11] {
        let d = next_dto(&p.c.req);
        assert_eq!((d.cookie, d.status), (k, DtoStatus::Success));
    }
    for k in [0, 1] {
        let d = next_dto(&p.s.rcv);
        assert_eq!((d.cookie, d.status), (k, DtoStatus::Success));
    }
    assert_eq!(rb.to_vec().unwrap()[..16], pattern(24, 7)[..16]);
    // Room again.
    p.s.recv(&rb, 24, 8, 3);
    p.c.send(&sb, 16, 8, 12);
    assert_eq!(next_dto(&p.c.req).cookie, 12);
    assert_eq!(next_dto(&p.s.rcv).cookie, 2);
}

#[case]
fn completion_evd_full_is_refused_at_post_time() {
    if crate::support::skip_unless_placed() {
        return;
    }
    let p = pair_with("127.0.23.19", "127.0.23.20", 1900, None, 2, 2);
    let tevd = |r: Result<()>| resource_err(r, Subtype::ResourceTevd);
    let src = p.c.lmr(pattern(8, 8));
    let tgt = p.s.lmr(vec![0; 8]);
    for i in 0..2u64 {
        p.c.ep
            .post_rdma_write(
                &[src.triplet(i, 1).unwrap()],
                tgt.rmr_triplet(i, 1).unwrap(),
                i,
                D,
            )
            .unwrap();
    }
    // Two completions queued: a third request has no room for its own.
    tevd(p.c.ep.post_rdma_write(
        &[src.triplet(2, 1).unwrap()],
        tgt.rmr_triplet(2, 1).unwrap(),
        2,
        D,
    ));
    assert_eq!(tgt.to_vec().unwrap()[2], 0, "the refused write did not run");
    // Receives reserve their slot when posted, before they complete.
    let rb = p.s.lmr(vec![0; 8]);
    p.s.recv(&rb, 0, 4, 20);
    p.s.recv(&rb, 4, 4, 21);
    tevd(p.s.ep.post_recv(&[rb.triplet(0, 4).unwrap()], 22, D));
    assert_eq!(p.c.ep.state(), EpState::Connected);
    // Nothing lost: the queued completions are intact and room comes back.
    for i in 0..2 {
        let d = next_dto(&p.c.req);
        assert_eq!((d.cookie, d.status), (i, DtoStatus::Success));
    }
    p.c.ep
        .post_rdma_write(
            &[src.triplet(2, 1).unwrap()],
            tgt.rmr_triplet(2, 1).unwrap(),
            2,
            D,
        )
        .unwrap();
    assert_eq!(next_dto(&p.c.req).cookie, 2);
    common::assert_placed(|| tgt.to_vec().unwrap()[..3].to_vec(), &pattern(8, 8)[..3]);
    // The two receives still complete.
    p.c.send(&src, 0, 4, 30);
    p.c.send(&src, 4, 4, 31);
    assert_eq!(next_dto(&p.s.rcv).cookie, 20);
    assert_eq!(next_dto(&p.s.rcv).cookie, 21);
    assert_eq!(rb.to_vec().unwrap(), pattern(8, 8));
}

#[case]
fn inject_failure_fails_next_dto_and_breaks() {
    let p = pair("127.0.23.21", "127.0.23.22", 2100);
    let sb = p.c.lmr(pattern(16, 9));
    let rb = p.s.lmr(vec![0; 16]);
    p.s.recv(&rb, 0, 8, 1);
    p.s.recv(&rb, 8, 8, 2);
    p.c.recv(&sb, 0, 8, 3);
    p.c.ep.inject_failure(DtoStatus::Transport);
    p.c.send(&sb, 0, 8, 4);
    let d = next_dto(&p.c.req);
    assert_eq!(
        (d.cookie, d.status, d.operation),
        (4, DtoStatus::Transport, DtoOp::Send)
    );
    flushed(&p.c.rcv, &[3]);
    flushed(&p.s.rcv, &[1, 2]);
    p.expect_end(ConnectionEventKind::Broken);
    assert_eq!(rb.to_vec().unwrap(), vec![0; 16]);
    // One failure only: after reconnecting everything works.
    p.reconnect();
    p.s.recv(&rb, 0, 8, 5);
    p.c.send(&sb, 0, 8, 6);
    assert_eq!(next_dto(&p.c.req).status, DtoStatus::Success);
    assert_eq!(next_dto(&p.s.rcv).status, DtoStatus::Success);
    // The next DTO may be an RDMA write; the status is the injected one.
    let before = rb.to_vec().unwrap();
    p.c.ep.inject_failure(DtoStatus::LocalEp);
    p.c.ep
        .post_rdma_write(
            &[sb.triplet(0, 8).unwrap()],
            rb.rmr_triplet(8, 8).unwrap(),
            7,
            D,
        )
        .unwrap();
    let d = next_dto(&p.c.req);
    assert_eq!(
        (d.cookie, d.status, d.operation),
        (7, DtoStatus::LocalEp, DtoOp::RdmaWrite)
    );
    p.expect_end(ConnectionEventKind::Broken);
    assert_eq!(
        rb.to_vec().unwrap(),
        before,
        "the failed write moved nothing"
    );
}

/// Requests a fault injector still holds when their endpoint is freed are
/// flushed, in order, before the free returns.
#[case]
fn freeing_flushes_delayed_requests_before_it_returns() {
    let p = pair("127.0.23.39", "127.0.23.40", 3900);
    let sb = p.c.lmr(pattern(16, 11));
    let rb = p.s.lmr(vec![0; 16]);
    p.s.recv(&rb, 0, 8, 1);
    p.c.ep.inject_delay(Some(Duration::from_secs(60)));
    p.c.send(&sb, 0, 8, 2);
    p.c.send(&sb, 8, 8, 3);
    assert!(common::faults().holds(&p.c.ep));
    empty(&p.c.req);
    p.c.ep.free().unwrap();
    assert!(!common::faults().holds(&p.c.ep));
    for k in [2, 3] {
        let Some(Event::Dto(d)) = p.c.req.dequeue().unwrap() else {
            panic!("request {k} was not flushed by the free");
        };
        assert_eq!((d.cookie, d.status), (k, DtoStatus::Flushed));
    }
    assert_eq!(rb.to_vec().unwrap(), vec![0; 16], "nothing moved");
}

#[case]
fn inject_delay_delays() {
    let p = pair("127.0.23.23", "127.0.23.24", 2300);
    let sb = p.c.lmr(pattern(8, 10));
    let rb = p.s.lmr(vec![0; 16]);
    p.s.recv(&rb, 0, 8, 1);
    p.s.recv(&rb, 8, 8, 2);
    let delay = Duration::from_millis(150);
    p.c.ep.inject_delay(Some(delay));
    let t0 = Instant::now();
    p.c.send(&sb, 0, 8, 3);
    empty(&p.c.req);
    empty(&p.s.rcv);
    let d = next_dto(&p.c.req);
    assert_eq!((d.cookie, d.status), (3, DtoStatus::Success));
    assert!(
        t0.elapsed() >= delay - Duration::from_millis(5),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(next_dto(&p.s.rcv).cookie, 1);
    assert_eq!(rb.to_vec().unwrap()[..8], pattern(8, 10));
    // Delay off: the next request is handed over at once (the loopback
    // runs it inside the post; another provider when it gets to it).
    p.c.ep.inject_delay(None);
    p.c.send(&sb, 0, 8, 4);
    assert!(!common::faults().holds(&p.c.ep));
    if common::on_loopback() {
        assert_eq!(
            p.c.req.dequeue().unwrap().map(|e| match e {
                Event::Dto(d) => d.cookie,
                _ => 0,
            }),
            Some(4)
        );
    } else {
        assert_eq!(next_dto(&p.c.req).cookie, 4);
    }
    assert_eq!(next_dto(&p.s.rcv).cookie, 2);
}

#[case]
fn inject_break_breaks_both_sides() {
    let p = pair("127.0.23.25", "127.0.23.26", 2500);
    let cb = p.c.lmr(vec![0; 32]);
    let sb = p.s.lmr(vec![0; 32]);
    p.c.recv(&cb, 0, 8, 1);
    p.s.recv(&sb, 0, 8, 2);
    p.s.recv(&sb, 8, 8, 3);
    p.c.ep.inject_delay(Some(Duration::from_secs(2)));
    p.c.ep
        .post_rdma_write(
            &[cb.triplet(0, 8).unwrap()],
            sb.rmr_triplet(16, 8).unwrap(),
            4,
            D,
        )
        .unwrap();
    p.s.ep.inject_break();
    p.expect_end(ConnectionEventKind::Broken);
    flushed(&p.c.req, &[4]);
    flushed(&p.c.rcv, &[1]);
    flushed(&p.s.rcv, &[2, 3]);
    empty(&p.s.req);
    empty(&p.c.conn);
    empty(&p.s.conn);
    // Breaking a broken connection does nothing more.
    p.c.ep.inject_break();
    empty(&p.c.conn);
    empty(&p.s.conn);
}

#[case]
fn message_and_rdma_size_limits() {
    let attr = EpAttr {
        max_message_size: 8,
        max_rdma_size: 16,
        ..Default::default()
    };
    let p = pair_with("127.0.23.27", "127.0.23.28", 2700, Some(attr), 64, 64);
    let b = p.c.lmr(vec![0; 32]);
    let r = p.s.lmr(vec![0; 32]).rmr_triplet(0, 32).unwrap();
    let len_err = |r: Result<()>| assert!(matches!(r, Err(Error::Length(_))), "{r:?}");
    len_err(p.c.ep.post_send(&[b.triplet(0, 9).unwrap()], 1, D));
    len_err(
        p.c.ep
            .post_recv(&[b.triplet(0, 5).unwrap(), b.triplet(5, 4).unwrap()], 2, D),
    );
    len_err(
        p.c.ep
            .post_rdma_write(&[b.triplet(0, 17).unwrap()], r, 3, D),
    );
    len_err(p.c.ep.post_rdma_read(&[b.triplet(0, 17).unwrap()], r, 4, D));
    // Owned buffers: a send of more, or a receive buffer larger, than the
    // endpoint's message size (the buffer back with the error).
    let big = p.c.pz.buf_create(9).unwrap();
    let e = p.c.ep.post_send_buf(big, 9, 5, D).expect_err("too long");
    assert!(matches!(e.error, Error::Length(_)), "{e:?}");
    let e = p.c.ep.post_recv_buf(e.buf, 6, D).expect_err("too long");
    assert!(matches!(e.error, Error::Length(_)), "{e:?}");
    assert_eq!(e.buf.len(), 9);
    p.c.ep
        .post_rdma_write(&[b.triplet(0, 16).unwrap()], r, 5, D)
        .unwrap();
    assert_eq!(next_dto(&p.c.req).cookie, 5);
    empty(&p.c.req);
    assert_eq!(p.c.ep.state(), EpState::Connected);
}

/// Two threads post sends on one endpoint while the peer's receives were
/// posted in order: the receives must complete in the order they were
/// posted (each receive takes the next message), and each thread's sends
/// in the order that thread posted them. The interleaving is up to the
/// scheduler, so the scenario runs for several rounds.
#[case]
fn concurrent_posters_keep_completion_order() {
    const PER: usize = 1000;
    const ROUNDS: usize = 20;
    let attr = EpAttr {
        max_recv_dtos: 2 * PER,
        max_request_dtos: 2 * PER,
        ..Default::default()
    };
    let p = pair_with(
        "127.0.23.29",
        "127.0.23.30",
        2900,
        Some(attr),
        4 * PER,
        4 * PER,
    );
    let rb = p.s.lmr(vec![0; 2 * PER * 4]);
    let srcs: Vec<Lmr> = (0..2u8)
        .map(|t| {
            p.c.lmr(
                (0..PER)
                    .flat_map(|i| [t, (i >> 8) as u8, i as u8, 0xAA])
                    .collect(),
            )
        })
        .collect();
    for round in 0..ROUNDS {
        for i in 0..2 * PER {
            p.s.recv(&rb, (i * 4) as u64, 4, i as u64);
        }
        let threads: Vec<_> = (0..2u64)
            .map(|t| {
                let ep = p.c.ep.clone();
                let src = srcs[t as usize].clone();
                std::thread::spawn(move || {
                    for i in 0..PER {
                        let iov = [src.triplet((i * 4) as u64, 4).unwrap()];
                        ep.post_send(&iov, (t << 32) | i as u64, D).unwrap();
                    }
                })
            })
            .collect();
        for h in threads {
            h.join().unwrap();
        }
        let mut recv_order = Vec::new();
        for _ in 0..2 * PER {
            let d = next_dto(&p.s.rcv);
            assert_eq!(d.status, DtoStatus::Success);
            recv_order.push(d.cookie);
        }
        let mut last = [None::<u64>; 2];
        for _ in 0..2 * PER {
            let d = next_dto(&p.c.req);
            assert_eq!(d.status, DtoStatus::Success);
            let t = (d.cookie >> 32) as usize;
            let i = d.cookie & 0xffff_ffff;
            assert!(
                last[t].is_none_or(|l| l < i),
                "round {round}: thread {t}'s send {i} completed after {:?}",
                last[t]
            );
            last[t] = Some(i);
        }
        let bad: Vec<_> = recv_order.windows(2).filter(|w| w[0] > w[1]).collect();
        assert!(
            bad.is_empty(),
            "round {round}: receive completions out of post order: {bad:?}"
        );
        // Receive i holds a message, and each thread's messages are in order.
        let data = rb.to_vec().unwrap();
        let mut seen = [None::<u16>; 2];
        for m in data.chunks(4) {
            assert_eq!(m[3], 0xAA);
            let (t, i) = (m[0] as usize, u16::from_be_bytes([m[1], m[2]]));
            assert!(
                seen[t].is_none_or(|l| l < i),
                "thread {t}: message {i} after {:?}",
                seen[t]
            );
            seen[t] = Some(i);
        }
    }
}

/// Message `i` of side `k` (8 bytes).
fn message(k: u8, i: usize) -> [u8; 8] {
    let n = (i as u32).to_be_bytes();
    [k, n[0], n[1], n[2], n[3], 0x5A, !k, 0xA5]
}

/// Sends in both directions race with the peer posting its next receives
/// (a send takes the head receive under the receive queue's lock while the
/// owner appends to it): every message lands in the receive posted for it,
/// and every completion arrives once, successful, in post order. Each send
/// waits until the receive it needs is posted (no dependence on the RNR
/// time).
#[case]
fn sends_race_receives_both_ways() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    const N: usize = 4000;
    let attr = EpAttr {
        max_recv_dtos: N,
        max_request_dtos: N,
        ..Default::default()
    };
    let p = pair_with("127.0.23.31", "127.0.23.32", 3100, Some(attr), 2 * N, 2 * N);
    let posted: Arc<[AtomicUsize; 2]> = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let nodes = [&p.c, &p.s];
    let dst: Vec<Lmr> = nodes.iter().map(|n| n.lmr(vec![0; 8 * N])).collect();
    let threads: Vec<_> = (0..2usize)
        .map(|k| {
            let ep = nodes[k].ep.clone();
            let src = nodes[k].lmr((0..N).flat_map(|i| message(k as u8, i)).collect());
            let dst = dst[k].clone();
            let posted = posted.clone();
            std::thread::spawn(move || {
                let end = Instant::now() + Duration::from_secs(60);
                for i in 0..N {
                    let t = [dst.triplet((8 * i) as u64, 8).unwrap()];
                    ep.post_recv(&t, i as u64, D).unwrap();
                    posted[k].store(i + 1, Ordering::Release);
                    while posted[1 - k].load(Ordering::Acquire) <= i {
                        assert!(Instant::now() < end, "side {k}: the peer stalled at {i}");
                        std::hint::spin_loop();
                        if i % 64 == 0 {
                            std::thread::yield_now();
                        }
                    }
                    let t = [src.triplet((8 * i) as u64, 8).unwrap()];
                    ep.post_send(&t, i as u64, D).unwrap();
                }
            })
        })
        .collect();
    for h in threads {
        h.join().unwrap();
    }
    for (k, n) in nodes.iter().enumerate() {
        for i in 0..N as u64 {
            let d = next_dto(&n.rcv);
            assert_eq!(
                (d.cookie, d.status, d.operation, d.transferred_length),
                (i, DtoStatus::Success, DtoOp::Receive, 8),
                "side {k}"
            );
            let d = next_dto(&n.req);
            assert_eq!(
                (d.cookie, d.status, d.operation),
                (i, DtoStatus::Success, DtoOp::Send),
                "side {k}"
            );
        }
        empty(&n.rcv);
        empty(&n.req);
        let want: Vec<u8> = (0..N).flat_map(|i| message(1 - k as u8, i)).collect();
        assert_eq!(dst[k].to_vec().unwrap(), want, "side {k}: received data");
    }
}

/// A disconnect while sends stream into posted receives: each side's
/// completions are a run of successes then a run of `Flushed`, in post
/// order, each work request exactly once; the receiver's successes are
/// the sender's (in one process exactly; across a network at least),
/// with their data.
#[case]
fn disconnect_racing_sends_flushes_the_rest_in_order() {
    if crate::support::skip_unless_placed() {
        return;
    }
    const N: usize = 12_000;
    let attr = EpAttr {
        max_recv_dtos: N,
        max_request_dtos: N,
        ..Default::default()
    };
    let p = pair_with("127.0.23.33", "127.0.23.34", 3300, Some(attr), 2 * N, 2 * N);
    let rb = p.s.lmr(vec![0; 8 * N]);
    for i in 0..N {
        p.s.recv(&rb, (8 * i) as u64, 8, i as u64);
    }
    let src = p.c.lmr((0..N).flat_map(|i| message(0, i)).collect());
    let ep = p.c.ep.clone();
    let sender = std::thread::spawn(move || {
        let mut sent = 0;
        for i in 0..N {
            let t = [src.triplet((8 * i) as u64, 8).unwrap()];
            if ep.post_send(&t, i as u64, D).is_err() {
                break;
            }
            sent += 1;
        }
        sent
    });
    std::thread::sleep(Duration::from_micros(300));
    p.s.ep.disconnect(false).unwrap();
    let sent = sender.join().unwrap();
    // The client's requests: successes, then flushed ones.
    let mut ok_sent = 0;
    for i in 0..sent as u64 {
        let d = next_dto(&p.c.req);
        assert_eq!(d.cookie, i);
        match d.status {
            DtoStatus::Success if ok_sent == i => ok_sent += 1,
            DtoStatus::Flushed => {}
            s => panic!("send {i}: {s:?} after {ok_sent} successes"),
        }
    }
    empty(&p.c.req);
    // The server's receives: as many successes, then flushed ones.
    let mut ok_recv = 0;
    for i in 0..N as u64 {
        let d = next_dto(&p.s.rcv);
        assert_eq!(d.cookie, i);
        match d.status {
            DtoStatus::Success if ok_recv == i => ok_recv += 1,
            DtoStatus::Flushed => {}
            s => panic!("receive {i}: {s:?} after {ok_recv} successes"),
        }
    }
    empty(&p.s.rcv);
    if in_process() {
        assert_eq!(ok_sent, ok_recv, "sends and receives that succeeded");
    } else {
        // A send succeeds only once its message was placed; the receiver
        // may have placed a few more that it could not acknowledge (see
        // `in_process`): they are flushed on the sender and succeeded on
        // the receiver, with their data.
        assert!(
            ok_sent <= ok_recv,
            "{ok_sent} sends succeeded, only {ok_recv} receives"
        );
    }
    let data = rb.to_vec().unwrap();
    for (i, m) in data.chunks(8).enumerate() {
        if (i as u64) < ok_recv {
            assert_eq!(m, message(0, i), "receive {i}");
        } else {
            assert_eq!(m, [0; 8], "receive {i} was flushed: no byte moved");
        }
    }
    p.expect_end(ConnectionEventKind::Disconnected);
}

/// The receive queue has two ends: posts append under the posters' lock,
/// the peer's sends take under the queue's own and move the posted
/// receives over when their end runs dry. The queue length, the
/// outstanding count, the order of completions and of a flush, and a
/// reset all hold across both ends.
#[case]
fn receive_queue_limit_count_and_flush_order_span_both_ends() {
    let attr = EpAttr {
        max_recv_dtos: 4,
        ..Default::default()
    };
    let p = pair_with("127.0.23.35", "127.0.23.36", 3500, Some(attr), 64, 64);
    let tep = |r: Result<()>| resource_err(r, Subtype::ResourceTep);
    let rb = p.s.lmr(vec![0; 64]);
    let sb = p.c.lmr(pattern(8, 5));
    let outstanding = || p.s.ep.query().unwrap().outstanding.1;
    for i in 0..4 {
        p.s.recv(&rb, i * 8, 8, i);
    }
    tep(p.s.ep.post_recv(&[rb.triplet(56, 8).unwrap()], 99, D));
    assert_eq!(outstanding(), 4);
    // A send moves the four over and takes the oldest.
    p.c.send(&sb, 0, 8, 10);
    assert_eq!(next_dto(&p.c.req).cookie, 10);
    assert_eq!(next_dto(&p.s.rcv).cookie, 0);
    assert_eq!(outstanding(), 3);
    // Room for exactly one more, queued at the posting end behind three.
    p.s.recv(&rb, 32, 8, 4);
    tep(p.s.ep.post_recv(&[rb.triplet(56, 8).unwrap()], 99, D));
    assert_eq!(outstanding(), 4);
    // The next sends take the older three first, then the newest.
    for (k, want) in [(11, 1), (12, 2)] {
        p.c.send(&sb, 0, 8, k);
        assert_eq!(next_dto(&p.c.req).cookie, k);
        assert_eq!(next_dto(&p.s.rcv).cookie, want);
    }
    // Two left (one at each end); two more fit, a third does not.
    p.s.recv(&rb, 40, 8, 5);
    p.s.recv(&rb, 48, 8, 6);
    tep(p.s.ep.post_recv(&[rb.triplet(56, 8).unwrap()], 99, D));
    assert_eq!(outstanding(), 4);
    // A disconnect flushes them in post order, across both ends.
    p.s.ep.disconnect(true).unwrap();
    flushed(&p.s.rcv, &[3, 4, 5, 6]);
    p.expect_end(ConnectionEventKind::Disconnected);
    assert_eq!(outstanding(), 0);
    // Refused while disconnected; after a reset the whole length is free.
    assert!(
        p.s.ep
            .post_recv(&[rb.triplet(0, 8).unwrap()], 98, D)
            .is_err()
    );
    p.s.ep.reset().unwrap();
    for i in 0..4 {
        p.s.recv(&rb, i * 8, 8, 20 + i);
    }
    tep(p.s.ep.post_recv(&[rb.triplet(56, 8).unwrap()], 99, D));
    assert_eq!(outstanding(), 4);
    // A reset of an unconnected endpoint flushes what is posted.
    p.s.ep.reset().unwrap();
    flushed(&p.s.rcv, &[20, 21, 22, 23]);
    assert_eq!(outstanding(), 0);
}

/// A batch (`Ep::post_batch`) queues in post order, as separate posts
/// would: Sends, RDMA Writes and Reads complete in that order with their
/// data; a post the batch refuses (here: longer than the endpoint's
/// messages) changes nothing before it, and what was queued goes out when the batch ends,
/// also when its closure fails or panics.
#[case]
fn a_batch_posts_in_order_and_a_refusal_keeps_what_came_before() {
    let attr = EpAttr {
        max_message_size: 256,
        ..EpAttr::default()
    };
    let p = pair_with("127.0.23.41", "127.0.23.42", 4141, Some(attr), 256, 256);
    let rbuf = p.s.lmr(vec![0; 4 * 64]);
    for i in 0..4u64 {
        p.s.recv(&rbuf, i * 64, 64, 100 + i);
    }
    let src = p.c.lmr(pattern(4 * 64, 5));
    let area = p.s.lmr(vec![0; 64]);
    let back = p.c.lmr(vec![0; 64]);
    let t = |i: u64| src.triplet(i * 64, 64).unwrap();
    p.c.ep
        .post_batch(|b| {
            b.post_send(&[t(0)], 0, D)?;
            b.post_rdma_write(&[t(1)], area.rmr_triplet(0, 64).unwrap(), 1, D)?;
            b.post_rdma_read(
                &[back.triplet(0, 64).unwrap()],
                area.rmr_triplet(0, 64).unwrap(),
                2,
                D,
            )?;
            b.post_send(&[t(2)], 3, D)?;
            assert_eq!(b.len(), 4);
            Ok::<_, Error>(())
        })
        .unwrap();
    // The server's side first: the batch went out without the client's
    // EVDs being looked at (whose progress could have sent it).
    for (k, i) in [(0u64, 0u64), (1, 2)] {
        let d = next_dto(&p.s.rcv);
        assert_eq!((d.cookie, d.status), (100 + k, DtoStatus::Success));
        assert_eq!(
            rbuf.to_vec().unwrap()[(k * 64) as usize..(k * 64 + 64) as usize],
            pattern(4 * 64, 5)[(i * 64) as usize..(i * 64 + 64) as usize]
        );
    }
    let ops = [DtoOp::Send, DtoOp::RdmaWrite, DtoOp::RdmaRead, DtoOp::Send];
    for (i, op) in ops.into_iter().enumerate() {
        let d = next_dto(&p.c.req);
        assert_eq!(
            (d.cookie, d.operation, d.status),
            (i as u64, op, DtoStatus::Success)
        );
    }
    // The read saw the write before it.
    assert_eq!(back.to_vec().unwrap(), pattern(4 * 64, 5)[64..128]);
    // Two writes, then a send longer than the endpoint's messages: the
    // send is refused, the writes before it complete.
    let long = p.c.lmr(vec![7; 512]);
    let r = p.c.ep.post_batch(|b| {
        for i in 0..2u64 {
            b.post_rdma_write(&[t(3)], area.rmr_triplet(0, 64).unwrap(), 10 + i, D)?;
        }
        b.post_send(&[long.triplet(0, 512).unwrap()], 12, D)
    });
    assert!(matches!(r, Err(Error::Length(_))), "{r:?}");
    for i in 0..2u64 {
        let d = next_dto(&p.c.req);
        assert_eq!((d.cookie, d.status), (10 + i, DtoStatus::Success));
    }
    // A closure that panics after a post: the post still goes out.
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        p.c.ep.post_batch(|b| {
            b.post_send(&[t(3)], 20, D).unwrap();
            panic!("the consumer's bug");
        })
    }));
    assert!(panicked.is_err());
    let d = next_dto(&p.s.rcv);
    assert_eq!((d.cookie, d.status), (102, DtoStatus::Success));
    let d = next_dto(&p.c.req);
    assert_eq!((d.cookie, d.status), (20, DtoStatus::Success));
    empty(&p.c.req);
}

/// Takes every DTO completion of `evd` until `n` came (or 10 s passed):
/// each cookie once, with its status.
fn completions(evd: &Evd, n: usize) -> Vec<(u64, DtoStatus)> {
    (0..n)
        .map(|_| {
            let d = next_dto(evd);
            (d.cookie, d.status)
        })
        .collect()
}

/// A connected pair whose server has four 64-byte receives posted, and
/// a 64-byte source at the client.
fn four_receives(client: &str, server: &str, qual: u64, seed: u8) -> (Pair, Lmr, Lmr) {
    let p = pair(client, server, qual);
    let rbuf = p.s.buf(4 * 64);
    for i in 0..4u64 {
        p.s.recv(&rbuf, i * 64, 64, 100 + i);
    }
    let src = p.c.lmr(pattern(64, seed));
    (p, rbuf, src)
}

/// A batch cut short by the end of its endpoint's connection: requests
/// queued before the end (of which the provider has not heard yet: it
/// hears at the batch's end) complete exactly once, delivered or flushed,
/// in post order; those posted after it are refused; the batch's end then
/// finds the endpoint disconnected, or freed, and does no harm.
#[case]
fn a_batch_cut_short_by_the_end_of_the_connection_loses_nothing() {
    let ok = |s: DtoStatus| matches!(s, DtoStatus::Success | DtoStatus::Flushed);
    // An abrupt disconnect inside the batch.
    let (p, _rbuf, src) = four_receives("127.0.23.43", "127.0.23.44", 4143, 9);
    let t = src.triplet(0, 64).unwrap();
    p.c.ep.post_batch(|b| {
        for i in 0..4u64 {
            b.post_send(&[t], i, D).unwrap();
        }
        p.c.ep.disconnect(false).unwrap();
        assert!(
            b.post_send(&[t], 9, D).is_err(),
            "refused once disconnected"
        );
        assert_eq!(b.len(), 4);
    });
    let got = completions(&p.c.req, 4);
    assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), [0, 1, 2, 3]);
    assert!(got.iter().all(|g| ok(g.1)), "{got:?}");
    p.expect_end(ConnectionEventKind::Disconnected);
    let at_server = completions(&p.s.rcv, 4);
    assert!(at_server.iter().all(|g| ok(g.1)), "{at_server:?}");
    // What the client saw delivered (placed), the server received.
    if common::provider().attr().completes_when_placed {
        let sent = got.iter().filter(|g| g.1 == DtoStatus::Success).count();
        let landed = at_server
            .iter()
            .filter(|g| g.1 == DtoStatus::Success)
            .count();
        assert!(sent <= landed, "{got:?} {at_server:?}");
    }
    empty(&p.c.req);
    empty(&p.s.rcv);

    // The endpoint freed inside the batch.
    let (p, _rbuf, src) = four_receives("127.0.23.45", "127.0.23.46", 4145, 10);
    let t = src.triplet(0, 64).unwrap();
    p.c.ep.post_batch(|b| {
        for i in 0..3u64 {
            b.post_send(&[t], 10 + i, D).unwrap();
        }
        p.c.ep.free().unwrap();
        assert!(b.post_send(&[t], 19, D).is_err(), "refused once freed");
    });
    let got = completions(&p.c.req, 3);
    assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), [10, 11, 12]);
    assert!(got.iter().all(|g| ok(g.1)), "{got:?}");
    empty(&p.c.req);
    // The server hears of the end.
    assert!(!matches!(
        common::conn_kind(&p.s.conn),
        ConnectionEventKind::Established
    ));
}

/// The receives of an endpoint on a shared receive queue use the queue's
/// protection zone, whatever the endpoint's (DAT: the endpoint's zone
/// governs its DTOs but receives; the SRQ's, the receives posted to it):
/// a Send lands in an SRQ receive of the SRQ's zone though the endpoint's
/// zone is another.
#[case]
fn srq_receives_use_the_srqs_zone() {
    let s = common::side("127.0.101.1");
    let c = common::side("127.0.101.2");
    let zone = s.ia.pz_create().unwrap();
    let srq = s.ia.srq_create(&zone, 4, 1).unwrap();
    let evd =
        s.ia.evd_create(16, EvdFlags::DTO | EvdFlags::CONNECTION)
            .unwrap();
    let ep =
        s.ia.ep_create_with_srq(&s.pz, &evd, Some(&evd), Some(&evd), &srq, None)
            .unwrap();
    let rb = zone.lmr_create(Region::zeroed(64), MemPriv::ALL).unwrap();
    srq.post_recv(&[rb.triplet(0, 64).unwrap()], 7, D).unwrap();
    let _psp = s.ia.psp_create(4300, &s.evd).unwrap();
    c.ep.connect(s.ia.address(), 4300, Some(T), b"").unwrap();
    next_cr(&s.ia, &s.evd).accept(&ep, b"").unwrap();
    assert!(matches!(next(&evd), Event::Connection(_)));
    assert!(matches!(next(&c.evd), Event::Connection(_)));
    let sb =
        c.pz.lmr_create_from(b"zoned".to_vec(), MemPriv::ALL)
            .unwrap();
    c.ep.post_send(&[sb.triplet(0, 5).unwrap()], 1, D).unwrap();
    let d = next_dto(&evd);
    assert_eq!(
        (d.cookie, d.status, d.transferred_length),
        (7, DtoStatus::Success, 5)
    );
    assert_eq!(&rb.to_vec().unwrap()[..5], b"zoned");
    let d = next_dto(&c.evd);
    assert_eq!((d.cookie, d.status), (1, DtoStatus::Success));
    c.ep.disconnect(false).unwrap();
}
