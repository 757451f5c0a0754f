//! The poller as its EVDs' dispatch context.

use rdapl::*;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[test]
fn poller_dispatch_context_delivers_every_event_once_in_order() {
    let poller = Poller::new(PollerConfig {
        threads: 1,
        budget: 8,
        mode: ReEnable::OnNew,
    })
    .unwrap();
    let evd = Evd::builder(64, EvdFlags::SOFTWARE)
        .dispatch(poller.dispatch())
        .build()
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let entry = poller
        .add(&evd, move |ev| {
            if let Event::Software(v) = ev {
                s2.lock().unwrap().push(v);
            }
        })
        .unwrap();
    let n = 2000u64;
    let mut posted = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while posted < n && Instant::now() < deadline {
        match evd.post_se(posted) {
            Ok(()) => posted += 1,
            Err(Error::QueueFull) => std::thread::yield_now(),
            Err(e) => panic!("{e:?}"),
        }
        if posted % 97 == 0 {
            // Let the queue drain now and then so re-arms happen.
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    while seen.lock().unwrap().len() < n as usize && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let got = seen.lock().unwrap().clone();
    assert_eq!(
        got,
        (0..n).collect::<Vec<_>>(),
        "every event once, in order"
    );
    let st = entry.stats();
    assert!(st.upcalls >= 1 && st.upcalls <= n, "{st:?}");
    entry.remove(&poller).unwrap();
    evd.free().unwrap();
}
