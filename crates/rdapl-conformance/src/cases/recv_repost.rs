//! A receive whose completion the consumer has seen has left the queue: it
//! may be posted again at once, on a queue that was full, whatever the
//! peer's thread is doing. (Found by `rdapl pingpong`: the loopback
//! published its count of receives taken only after it had published the
//! receive's completion, so a fast consumer's re-post was refused with a
//! full queue.)

use crate::case;
use crate::support as common;

use common::{D, LIMIT, pair_on, pair_with};
use rdapl::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// A pass that found nothing to do. The loopback moves each message in
/// the sender's own call: spinning keeps both threads on their CPUs. A
/// provider with a thread of its own (pipe, tcp) needs the CPU for it:
/// on a loaded machine a spinning test starves it.
fn idle() {
    if common::on_loopback() {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

#[case]
fn a_completed_receive_can_be_posted_again_at_once() {
    // (The asynchronous test provider moves each message through a thread
    // hand-off: fewer rounds keep it within the time bound.)
    let rounds: u64 = if common::on_loopback() {
        200_000
    } else {
        5_000
    };
    let attr = EpAttr {
        max_recv_dtos: 2,
        max_request_dtos: 2,
        ..Default::default()
    };
    // On the loopback, a fabric of its own whose sends wait long for a
    // receive: a server thread starved by a loaded machine must slow the
    // sender down, not break the connection with ReceiverNotReady.
    let p = if common::on_loopback() {
        let lb = Loopback::new();
        lb.set_rnr_timeout(LIMIT);
        pair_on(&lb, ("127.0.62.1", "127.0.62.2", 6200), Some(attr), 64, 64)
    } else {
        pair_with("127.0.62.1", "127.0.62.2", 6200, Some(attr), 64, 64)
    };
    let rb = p.s.lmr(vec![0; 16]);
    let sb = p.c.lmr(vec![7; 8]);
    // The server's queue is full from the start.
    p.s.recv(&rb, 0, 8, 0);
    p.s.recv(&rb, 8, 8, 1);
    let stop = Arc::new(AtomicBool::new(false));
    let server = {
        let (ep, rcv, rb, stop) = (p.s.ep.clone(), p.s.rcv.clone(), rb.clone(), stop.clone());
        std::thread::spawn(move || -> std::result::Result<u64, String> {
            let end = Instant::now() + LIMIT * 4;
            let mut got = 0;
            while got < rounds {
                if stop.load(Ordering::Relaxed) {
                    break; // the sender's time is up
                }
                if Instant::now() > end {
                    return Err(format!("stalled after {got} receives"));
                }
                let Some(ev) = rcv.dequeue().map_err(|e| e.to_string())? else {
                    idle();
                    continue;
                };
                let d = ev.as_dto().ok_or("not a DTO")?.clone();
                if d.status != DtoStatus::Success {
                    return Err(format!("receive {got}: {:?}", d.status));
                }
                got += 1;
                // At once, into the queue the receive just left.
                let slot = d.cookie;
                ep.post_recv(&[rb.triplet(slot * 8, 8).unwrap()], slot, D)
                    .map_err(|e| format!("re-post {got} refused: {e}"))?;
            }
            Ok(got)
        })
    };
    // The rounds take well under a second on an idle machine; a loaded one
    // (other processes on both CPUs) may starve either thread for
    // milliseconds at a time, so the sender stops at a time budget and the
    // test asserts a floor of rounds instead of all of them.
    let budget = Instant::now() + LIMIT;
    let mut sent = 0;
    while sent < rounds && !server.is_finished() && Instant::now() < budget {
        match p.c.ep.post_send(&[sb.triplet(0, 8).unwrap()], sent, D) {
            Ok(()) => sent += 1,
            Err(Error::InsufficientResources { .. }) => idle(),
            Err(e) => panic!("send {sent}: {e:?}"),
        }
        while let Some(ev) = p.c.req.dequeue().unwrap() {
            assert_eq!(ev.as_dto().unwrap().status, DtoStatus::Success);
        }
    }
    let short = sent < rounds;
    if short {
        stop.store(true, Ordering::Relaxed);
    }
    let got = server
        .join()
        .unwrap()
        .unwrap_or_else(|e| panic!("after {sent} sends: {e}"));
    if short {
        assert!(got >= 1000, "only {got} rounds of {rounds} in {LIMIT:?}");
        eprintln!("a loaded machine: {got} rounds of {rounds} in {LIMIT:?}");
    } else {
        assert_eq!(got, rounds);
    }
}
