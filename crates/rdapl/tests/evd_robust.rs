//! Robustness: a panicking upcall does not wedge its EVD.

mod common;

use common::{LIMIT, eventually, sw_evd, upcall};
use rdapl::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

#[test]
fn panicking_upcall_is_caught_and_delivery_goes_on() {
    let evd = sw_evd(16);
    let seen = Arc::new(AtomicUsize::new(0));
    let s2 = seen.clone();
    let up = upcall(move |_, ev, _| {
        s2.fetch_add(1, Ordering::SeqCst);
        if ev == Some(Event::Software(1)) {
            panic!("consumer bug in the upcall (expected by this test)");
        }
    });
    evd.modify_upcall(UpcallPolicy::SingleInstance, Some(up), ReEnable::Strict)
        .unwrap();
    evd.post_se(1).unwrap();
    evd.post_se(2).unwrap();
    eventually(LIMIT, || seen.load(Ordering::SeqCst) >= 2);
    assert_eq!(
        seen.load(Ordering::SeqCst),
        2,
        "the event after the panic was delivered"
    );
    // Teardown returns (no upcall is stuck "in progress").
    evd.modify_upcall(UpcallPolicy::Teardown, None, ReEnable::OnNew)
        .unwrap();
    assert_eq!(evd.query().unwrap().upcall_panics, 1);
}
