//! A send that finds no receive waits for one, and the receive posted at
//! that very moment must wake it. The receiver-not-ready timer would
//! rescue a lost wake-up at its deadline (its last step retries the send),
//! so this test runs on a loopback fabric of its own whose RNR time is far
//! beyond the tests' event timeout: a lost wake-up then fails the test
//! instead of costing a silent pause.

use crate::case;
use crate::support as common;

use common::{D, empty, next_dto, pair_on};
use rdapl::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Each send and the receive it needs are posted at about the same time
/// from two threads, with a varying head start for the send, thousands of
/// times; every one must complete in order and successfully.
#[case]
fn a_receive_posted_as_the_send_finds_none_wakes_it() {
    // Far beyond `common::T`: only a wake-up can complete a waiting send.
    let lb = Loopback::new();
    lb.set_rnr_timeout(Duration::from_secs(600));
    const N: usize = 3000;
    let attr = EpAttr {
        max_recv_dtos: 4,
        max_request_dtos: 4,
        ..Default::default()
    };
    let p = pair_on(&lb, ("127.0.24.1", "127.0.24.2", 4100), Some(attr), 64, 64);
    let rb = p.s.lmr(vec![0; 8]);
    let src = p.c.lmr((1..=8).collect());
    let go = Arc::new(AtomicUsize::new(0));
    let sender = {
        let (ep, req, go) = (p.c.ep.clone(), p.c.req.clone(), go.clone());
        std::thread::spawn(move || {
            let end = Instant::now() + Duration::from_secs(60);
            for i in 0..N {
                while go.load(Ordering::Acquire) <= i {
                    assert!(Instant::now() < end, "the receiver stalled at {i}");
                    std::hint::spin_loop();
                }
                ep.post_send(&[src.triplet(0, 8).unwrap()], i as u64, D)
                    .unwrap();
                let d = next_dto(&req);
                assert_eq!((d.cookie, d.status), (i as u64, DtoStatus::Success));
            }
        })
    };
    for i in 0..N {
        go.store(i + 1, Ordering::Release);
        // Up to about a microsecond of head start for the send.
        for _ in 0..(i * 7) % 64 {
            std::hint::spin_loop();
        }
        p.s.recv(&rb, 0, 8, i as u64);
        let d = next_dto(&p.s.rcv);
        assert_eq!((d.cookie, d.status), (i as u64, DtoStatus::Success));
    }
    sender.join().unwrap();
    empty(&p.c.req);
    empty(&p.s.rcv);
    assert_eq!(rb.to_vec().unwrap(), (1..=8).collect::<Vec<u8>>());
}
