//! Every error path of the EVD API, with the DAT return code each one maps to.
//!
//! Each test that can block runs the blocking call on a helper thread and
//! gives up (failing) after a bounded time, so a hang shows up as a failure.

mod common;

use common::{
    LIMIT, noop_upcall, start_waiter, sw_evd, teardown_within, upcall, upcall_evd, waiter_owns,
    within,
};
use rdapl::error::{DatType, Subtype};
use rdapl::evd::EvdProducer;
use rdapl::evd::MAX_QLEN;
use rdapl::{Cno, DatReturn, Error, Evd, EvdFlags, Event, ReEnable, UpcallPolicy};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

// Raw DAT values from dat_error.h, written out so this file checks the
// numbers independently of the enums it is testing.
const DAT_CLASS_ERROR: u32 = 0x8000_0000;
const DAT_ABORT: u32 = 0x0001_0000;
const DAT_INSUFFICIENT_RESOURCES: u32 = 0x0003_0000;
const DAT_INVALID_HANDLE: u32 = 0x0005_0000;
const DAT_INVALID_PARAMETER: u32 = 0x0006_0000;
const DAT_INVALID_STATE: u32 = 0x0007_0000;
const DAT_QUEUE_FULL: u32 = 0x000E_0000;
const DAT_TIMEOUT_EXPIRED: u32 = 0x000F_0000;
const DAT_RESOURCE_TEVD: u32 = 5;
const DAT_INVALID_ARG1: u32 = 37;
const DAT_INVALID_ARG2: u32 = 38;
const DAT_INVALID_ARG3: u32 = 39;
const DAT_INVALID_STATE_EVD_UNWAITABLE: u32 = 73;
const DAT_INVALID_STATE_EVD_IN_USE: u32 = 74;
const DAT_INVALID_STATE_EVD_WAITER: u32 = 78;

/// Checks the DAT return of `e`: error class, `ty`/`sub` through the typed
/// accessors, and the raw value against the header numbers.
fn assert_dat(e: &Error, ty: DatType, sub: Subtype, raw_ty: u32, raw_sub: u32) {
    let r = e.dat_return();
    assert_eq!(r.ty(), Some(ty), "type of {e:?} ({r:?})");
    assert_eq!(r.subtype(), Some(sub), "subtype of {e:?} ({r:?})");
    assert_eq!(
        r.0,
        DAT_CLASS_ERROR | raw_ty | raw_sub,
        "raw DAT_RETURN of {e:?} ({r:?})"
    );
    assert!(!r.is_success());
    assert_ne!(r, DatReturn::SUCCESS);
}

/// `e` is `InvalidParameter` for argument `arg`, subtype `sub` (raw `raw_sub`).
fn assert_invalid_arg(e: &Error, arg: u8, sub: Subtype, raw_sub: u32) {
    assert!(
        matches!(e, Error::InvalidParameter { arg: a, .. } if *a == arg),
        "{e:?}"
    );
    assert_dat(
        e,
        DatType::InvalidParameter,
        sub,
        DAT_INVALID_PARAMETER,
        raw_sub,
    );
}

/// `e` is `InvalidState` with subtype `sub` (raw `raw_sub`).
fn assert_invalid_state(e: &Error, sub: Subtype, raw_sub: u32) {
    assert!(
        matches!(e, Error::InvalidState { state, .. } if *state == sub),
        "{e:?}"
    );
    assert_dat(e, DatType::InvalidState, sub, DAT_INVALID_STATE, raw_sub);
}

/// `e` is `InvalidState` (any subtype), with the DAT type to match.
fn assert_any_invalid_state(e: &Error) {
    assert!(matches!(e, Error::InvalidState { .. }), "{e:?}");
    assert_eq!(e.dat_return().ty(), Some(DatType::InvalidState));
    assert_eq!(e.dat_return().0 & DatReturn::TYPE_MASK, DAT_INVALID_STATE);
}

/// `e` is `InsufficientResources` of the EVD (`DAT_RESOURCE_TEVD`).
fn assert_no_tevd(e: &Error) {
    assert!(
        matches!(
            e,
            Error::InsufficientResources {
                resource: Subtype::ResourceTevd,
                ..
            }
        ),
        "{e:?}"
    );
    assert_dat(
        e,
        DatType::InsufficientResources,
        Subtype::ResourceTevd,
        DAT_INSUFFICIENT_RESOURCES,
        DAT_RESOURCE_TEVD,
    );
}

/// A software-event EVD that also accepts DTO completions.
fn sw_dto_evd(qlen: usize) -> Evd {
    Evd::create(qlen, EvdFlags::SOFTWARE | EvdFlags::DTO).unwrap()
}

// ----- wait -----------------------------------------------------------------

#[test]
fn wait_threshold_zero_is_invalid_arg3() {
    let evd = sw_evd(4);
    evd.post_se(1).unwrap();
    let e = evd.wait(Some(Duration::ZERO), 0).unwrap_err();
    assert_invalid_arg(&e, 3, Subtype::InvalidArg3, DAT_INVALID_ARG3);
    // The refused call took nothing and did not leave the EVD owned.
    assert_eq!(evd.query().unwrap().pending, 1);
    assert_eq!(evd.dequeue().unwrap(), Some(Event::Software(1)));
}

#[test]
fn wait_threshold_above_qlen_is_invalid_arg3() {
    let evd = sw_evd(4);
    let e = evd.wait(Some(Duration::ZERO), 5).unwrap_err();
    assert_invalid_arg(&e, 3, Subtype::InvalidArg3, DAT_INVALID_ARG3);
    // threshold == qlen is legal.
    for i in 0..4 {
        evd.post_se(i).unwrap();
    }
    assert_eq!(
        evd.wait(Some(Duration::ZERO), 4).unwrap(),
        (Event::Software(0), 3)
    );
    // After a resize the bound follows the new queue length.
    evd.resize(8).unwrap();
    let e = evd.wait(Some(Duration::ZERO), 9).unwrap_err();
    assert!(matches!(e, Error::InvalidParameter { arg: 3, .. }), "{e:?}");
    assert!(matches!(
        evd.wait(Some(Duration::from_millis(1)), 8),
        Err(Error::TimeoutExpired { nmore: 3 })
    ));
}

#[test]
fn wait_on_unwaitable_evd_is_invalid_state_unwaitable() {
    let evd = sw_evd(4);
    evd.post_se(9).unwrap();
    evd.set_unwaitable().unwrap();
    assert!(!evd.query().unwrap().waitable);
    let e = evd.wait(Some(Duration::ZERO), 1).unwrap_err();
    assert_invalid_state(
        &e,
        Subtype::InvalidStateEvdUnwaitable,
        DAT_INVALID_STATE_EVD_UNWAITABLE,
    );
    // Unwaitable does not stop events or dequeue.
    evd.post_se(10).unwrap();
    assert_eq!(evd.dequeue().unwrap(), Some(Event::Software(9)));
    evd.clear_unwaitable().unwrap();
    assert!(evd.query().unwrap().waitable);
    assert_eq!(
        evd.wait(Some(Duration::ZERO), 1).unwrap(),
        (Event::Software(10), 0)
    );
}

#[test]
fn second_concurrent_waiter_is_invalid_state_waiter() {
    let evd = sw_evd(4);
    let (h, rx) = start_waiter(&evd, Some(LIMIT), 1);
    let e = evd.wait(Some(Duration::from_millis(1)), 1).unwrap_err();
    assert_invalid_state(
        &e,
        Subtype::InvalidStateEvdWaiter,
        DAT_INVALID_STATE_EVD_WAITER,
    );
    // The refused second waiter did not disturb the first one.
    evd.post_se(5).unwrap();
    let got = rx.recv_timeout(LIMIT).expect("first waiter not woken");
    assert_eq!(got.unwrap(), (Event::Software(5), 0));
    h.join().unwrap();
    // Ownership was released.
    evd.post_se(6).unwrap();
    assert_eq!(evd.dequeue().unwrap(), Some(Event::Software(6)));
}

#[test]
fn dequeue_while_waiter_owns_is_invalid_state() {
    let evd = sw_evd(8);
    evd.post_se(1).unwrap();
    // Threshold 3: one event queued is not enough, the waiter blocks.
    let (h, rx) = start_waiter(&evd, Some(LIMIT), 3);
    let check = |e: Error| {
        assert_invalid_state(
            &e,
            Subtype::InvalidStateEvdWaiter,
            DAT_INVALID_STATE_EVD_WAITER,
        );
    };
    check(evd.dequeue().unwrap_err());
    let mut v = Vec::new();
    check(evd.dequeue_batch(&mut v, 4).unwrap_err());
    assert!(v.is_empty());
    let mut buf = [None, None];
    check(evd.dequeue_into(&mut buf).unwrap_err());
    assert_eq!(buf, [None, None]);
    // Nothing was taken from the waiter.
    evd.post_se(2).unwrap();
    evd.post_se(3).unwrap();
    let got = rx
        .recv_timeout(LIMIT)
        .expect("waiter not woken at its threshold");
    assert_eq!(got.unwrap(), (Event::Software(1), 2));
    h.join().unwrap();
    assert_eq!(evd.dequeue().unwrap(), Some(Event::Software(2)));
    assert_eq!(evd.dequeue().unwrap(), Some(Event::Software(3)));
    assert_eq!(evd.dequeue().unwrap(), None);
}

#[test]
fn wait_timeout_is_timeout_expired_with_nmore() {
    let evd = sw_evd(8);
    evd.post_se(1).unwrap();
    evd.post_se(2).unwrap();
    let t0 = Instant::now();
    let e = within(LIMIT, "wait with a 30 ms timeout", {
        let evd = evd.clone();
        move || evd.wait(Some(Duration::from_millis(30)), 4).unwrap_err()
    });
    let took = t0.elapsed();
    assert_eq!(e, Error::TimeoutExpired { nmore: 2 });
    assert_dat(
        &e,
        DatType::TimeoutExpired,
        Subtype::NoSubtype,
        DAT_TIMEOUT_EXPIRED,
        0,
    );
    assert!(
        took >= Duration::from_millis(30),
        "returned after {took:?}, before its timeout"
    );
    // A timed-out wait dequeues nothing and releases ownership.
    assert_eq!(evd.query().unwrap().pending, 2);
    assert_eq!(evd.dequeue().unwrap(), Some(Event::Software(1)));
    assert_eq!(evd.dequeue().unwrap(), Some(Event::Software(2)));
    // Zero timeout on an empty EVD: returns at once, nmore 0.
    assert_eq!(
        evd.wait(Some(Duration::ZERO), 1).unwrap_err(),
        Error::TimeoutExpired { nmore: 0 }
    );
}

#[test]
fn freeing_evd_aborts_blocked_waiter() {
    let evd = sw_evd(4);
    let (_h, rx) = start_waiter(&evd, None, 1);
    thread::sleep(Duration::from_millis(20)); // let it reach its sleep
    evd.free().unwrap();
    let got = rx.recv_timeout(LIMIT).expect("waiter not woken by free");
    let e = got.unwrap_err();
    assert!(matches!(e, Error::Abort(_)), "{e:?}");
    assert_dat(&e, DatType::Abort, Subtype::NoSubtype, DAT_ABORT, 0);
}

#[test]
fn set_unwaitable_wakes_blocked_waiter_with_invalid_state() {
    let evd = sw_evd(4);
    let (_h, rx) = start_waiter(&evd, None, 1);
    thread::sleep(Duration::from_millis(20));
    evd.set_unwaitable().unwrap();
    let got = rx
        .recv_timeout(LIMIT)
        .expect("waiter not woken by set_unwaitable");
    let e = got.unwrap_err();
    assert_any_invalid_state(&e);
    assert_eq!(
        e.dat_return().subtype(),
        Some(Subtype::InvalidStateEvdUnwaitable)
    );
    // The woken waiter released ownership: dequeue works, wait is refused.
    assert!(!waiter_owns(&evd));
    evd.post_se(1).unwrap();
    assert!(matches!(
        evd.wait(Some(Duration::ZERO), 1),
        Err(Error::InvalidState {
            state: Subtype::InvalidStateEvdUnwaitable,
            ..
        })
    ));
    assert_eq!(evd.dequeue().unwrap(), Some(Event::Software(1)));
}

// ----- post_se -------------------------------------------------------------

#[test]
fn post_se_on_full_evd_is_queue_full_and_queues_nothing() {
    let evd = sw_evd(3);
    for i in 1..=3 {
        evd.post_se(i).unwrap();
    }
    for v in [100, 101] {
        let e = evd.post_se(v).unwrap_err();
        assert_eq!(e, Error::QueueFull);
        assert_dat(
            &e,
            DatType::QueueFull,
            Subtype::NoSubtype,
            DAT_QUEUE_FULL,
            0,
        );
    }
    let q = evd.query().unwrap();
    assert_eq!((q.pending, q.occupied, q.qlen), (3, 3, 3));
    assert_eq!(q.overflows, 0, "a refused post_se is not an overflow");
    let mut v = Vec::new();
    assert_eq!(evd.dequeue_batch(&mut v, 10).unwrap(), 3);
    assert_eq!(
        v,
        vec![Event::Software(1), Event::Software(2), Event::Software(3)]
    );
    assert_eq!(evd.dequeue().unwrap(), None);
    // Capacity came back.
    evd.post_se(4).unwrap();
    assert_eq!(evd.dequeue().unwrap(), Some(Event::Software(4)));
}

#[test]
fn post_se_without_software_flag_is_invalid_arg1() {
    let evd = Evd::create(4, EvdFlags::DEFAULT).unwrap();
    let e = evd.post_se(1).unwrap_err();
    assert_invalid_arg(&e, 1, Subtype::InvalidArg1, DAT_INVALID_ARG1);
    let q = evd.query().unwrap();
    assert_eq!(
        (q.pending, q.occupied),
        (0, 0),
        "a refused post_se took a slot"
    );
    assert_eq!(evd.dequeue().unwrap(), None);
}

// ----- resize --------------------------------------------------------------

#[test]
fn resize_below_occupied_is_invalid_state_and_changes_nothing() {
    let evd = sw_dto_evd(8);
    for i in 0..3 {
        evd.post_se(i).unwrap();
    }
    let r1 = evd.reserve().unwrap();
    let r2 = evd.reserve().unwrap();
    // 3 queued + 2 reserved = 5 occupied.
    assert_eq!(evd.query().unwrap().occupied, 5);
    for bad in [1, 3, 4] {
        let e = evd.resize(bad).unwrap_err();
        match &e {
            Error::InvalidState { state, .. } => {
                assert_eq!(e.dat_return().subtype(), Some(*state));
            }
            other => panic!("resize({bad}) gave {other:?}"),
        }
        assert_eq!(e.dat_return().ty(), Some(DatType::InvalidState));
        assert_eq!(e.dat_return().0 & DatReturn::TYPE_MASK, DAT_INVALID_STATE);
        assert_eq!(
            evd.query().unwrap().qlen,
            8,
            "a refused resize changed qlen"
        );
    }
    // Exactly the occupied count is allowed.
    evd.resize(5).unwrap();
    assert_eq!(evd.query().unwrap().qlen, 5);
    assert_eq!(evd.post_se(99), Err(Error::QueueFull));
    evd.release(r1).unwrap();
    evd.release(r2).unwrap();
    let mut v = Vec::new();
    evd.dequeue_batch(&mut v, 10).unwrap();
    assert_eq!(v, (0..3).map(Event::Software).collect::<Vec<_>>());
}

#[test]
fn resize_bad_lengths() {
    let evd = sw_evd(8);
    let e = evd.resize(0).unwrap_err();
    assert_invalid_arg(&e, 2, Subtype::InvalidArg2, DAT_INVALID_ARG2);
    let e = evd.resize(MAX_QLEN + 1).unwrap_err();
    assert_no_tevd(&e);
    assert_eq!(evd.query().unwrap().qlen, 8);
}

#[test]
fn resize_keeps_every_event_in_order_grow_and_shrink() {
    let evd = sw_evd(4);
    for i in 0..4 {
        evd.post_se(i).unwrap();
    }
    // Grow while full, then fill the new room.
    evd.resize(10).unwrap();
    for i in 4..10 {
        evd.post_se(i).unwrap();
    }
    assert_eq!(evd.post_se(100), Err(Error::QueueFull));
    // Take two, shrink to exactly what is queued.
    assert_eq!(evd.dequeue().unwrap(), Some(Event::Software(0)));
    assert_eq!(evd.dequeue().unwrap(), Some(Event::Software(1)));
    evd.resize(8).unwrap();
    assert_eq!(evd.query().unwrap().qlen, 8);
    assert_eq!(evd.post_se(101), Err(Error::QueueFull));
    // Shrink a little more after consuming.
    let mut v = Vec::new();
    evd.dequeue_batch(&mut v, 3).unwrap();
    evd.resize(5).unwrap();
    evd.dequeue_batch(&mut v, 100).unwrap();
    assert_eq!(v, (2..10).map(Event::Software).collect::<Vec<_>>());
    assert_eq!(evd.dequeue().unwrap(), None);
    assert_eq!(evd.query().unwrap().occupied, 0);
}

// ----- free -------------------------------------------------------------------

#[test]
fn free_while_fed_is_refused_then_allowed() {
    let evd = sw_dto_evd(4);
    let f1 = evd.feeder();
    let f2 = evd.feeder();
    assert_eq!(f1.evd().handle(), evd.handle());
    assert_eq!(evd.query().unwrap().feeders, 2);
    let e = evd.free().unwrap_err();
    assert!(matches!(e, Error::InvalidState { .. }), "{e:?}");
    assert_dat(
        &e,
        DatType::InvalidState,
        Subtype::InvalidStateEvdInUse,
        DAT_INVALID_STATE,
        DAT_INVALID_STATE_EVD_IN_USE,
    );
    // Still fully usable.
    assert!(!evd.is_freed());
    evd.post_se(1).unwrap();
    assert_eq!(evd.dequeue().unwrap(), Some(Event::Software(1)));
    drop(f1);
    assert_eq!(evd.query().unwrap().feeders, 1);
    assert!(matches!(evd.free(), Err(Error::InvalidState { .. })));
    drop(f2);
    assert_eq!(evd.query().unwrap().feeders, 0);
    evd.free().unwrap();
    assert!(evd.is_freed());
}

#[test]
fn every_operation_on_freed_evd_is_invalid_handle() {
    let cno = Cno::new();
    let evd = Evd::builder(8, EvdFlags::ALL).cno(&cno).build().unwrap();
    evd.post_se(1).unwrap();
    let res = evd.reserve().unwrap();
    let clone = evd.clone();
    evd.free().unwrap();
    assert!(evd.is_freed() && clone.is_freed());

    fn ih<T: std::fmt::Debug>(what: &str, r: rdapl::Result<T>) {
        match r {
            Err(e @ Error::InvalidHandle(_)) => {
                assert_eq!(e.dat_return().ty(), Some(DatType::InvalidHandle), "{what}");
                assert_eq!(
                    e.dat_return().0 & DatReturn::TYPE_MASK,
                    DAT_INVALID_HANDLE,
                    "{what}"
                );
            }
            other => panic!("{what} on a freed EVD gave {other:?}, expected InvalidHandle"),
        }
    }
    ih("dequeue", clone.dequeue());
    ih("dequeue_batch", clone.dequeue_batch(&mut Vec::new(), 4));
    ih("dequeue_into", clone.dequeue_into(&mut [None, None]));
    ih("wait", clone.wait(Some(Duration::ZERO), 1));
    ih(
        "wait(infinite)",
        within(LIMIT, "wait(None) on a freed EVD", {
            let c = clone.clone();
            move || c.wait(None, 1)
        }),
    );
    ih("post_se", clone.post_se(2));
    ih("query", clone.query());
    ih("resize", clone.resize(16));
    ih("free", clone.free());
    ih("enable", clone.enable());
    ih("disable", clone.disable());
    ih("set_unwaitable", clone.set_unwaitable());
    ih("clear_unwaitable", clone.clear_unwaitable());
    ih("modify_cno", clone.modify_cno(None));
    ih("modify_cno(Some)", clone.modify_cno(Some(&cno)));
    ih("reserve", clone.reserve());
    for p in [
        UpcallPolicy::Disable,
        UpcallPolicy::SingleInstance,
        UpcallPolicy::Many,
        UpcallPolicy::NotifyOnly,
        UpcallPolicy::Teardown,
    ] {
        for m in [ReEnable::Strict, ReEnable::OnAny, ReEnable::OnNew] {
            ih(
                "modify_upcall",
                clone.modify_upcall(p, Some(noop_upcall()), m),
            );
            ih("modify_upcall(SAME)", clone.modify_upcall(p, None, m));
        }
    }
    // Provider side: a stream that cannot be refused counts an overflow; a
    // completion for a reservation taken before the free is discarded.
    assert!(clone.post_event(Event::Software(3)).is_err());
    clone.complete(res, Event::Software(4)).unwrap();
    // The CNO was not triggered by any of this after the free.
    assert!(cno.is_triggered(), "the post before the free triggered it");
    cno.wait(Some(Duration::ZERO)).unwrap();
    clone.post_event(Event::Software(5)).unwrap_err();
    assert!(!cno.is_triggered());
}

// ----- upcalls ----------------------------------------------------------------

#[test]
fn teardown_from_own_upcall_is_an_error_not_a_deadlock() {
    let (tx, rx) = mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    let up = upcall(move |evd, _ev, _more| {
        let r = evd.modify_upcall(UpcallPolicy::Teardown, None, ReEnable::Strict);
        let _ = tx.lock().unwrap().send(r);
    });
    let evd = upcall_evd(4, None, UpcallPolicy::SingleInstance, up);
    evd.post_se(1).unwrap();
    let r = rx
        .recv_timeout(LIMIT)
        .expect("Teardown inside the EVD's own upcall deadlocked (or no upcall ran)");
    let e = r.unwrap_err();
    assert_any_invalid_state(&e);
    // The refused teardown left the policy alone; teardown from outside works.
    assert_eq!(
        evd.query().unwrap().upcall_policy,
        UpcallPolicy::SingleInstance
    );
    teardown_within(&evd, "Teardown from outside the upcall").unwrap();
    assert_eq!(evd.query().unwrap().upcall_policy, UpcallPolicy::Teardown);
}

#[test]
fn enabling_upcalls_without_upcall_object_is_refused() {
    let evd = sw_evd(4);
    evd.post_se(1).unwrap();
    for p in [
        UpcallPolicy::SingleInstance,
        UpcallPolicy::Many,
        UpcallPolicy::NotifyOnly,
    ] {
        for m in [ReEnable::Strict, ReEnable::OnAny, ReEnable::OnNew] {
            let e = evd.modify_upcall(p, None, m).unwrap_err();
            match &e {
                Error::InvalidParameter { arg, .. } => {
                    assert_eq!(
                        e.dat_return().subtype(),
                        Some(Subtype::invalid_arg(*arg)),
                        "{e:?}"
                    );
                }
                other => panic!("{p:?}/{m:?} without an upcall gave {other:?}"),
            }
            assert_eq!(e.dat_return().ty(), Some(DatType::InvalidParameter));
            let q = evd.query().unwrap();
            assert_eq!(q.upcall_policy, UpcallPolicy::Disable);
            assert!(!q.has_upcall);
        }
    }
    // The queued event was not lost to a phantom upcall.
    assert_eq!(evd.dequeue().unwrap(), Some(Event::Software(1)));
    // Disable and Teardown need no upcall object.
    evd.modify_upcall(UpcallPolicy::Disable, None, ReEnable::Strict)
        .unwrap();
    evd.modify_upcall(UpcallPolicy::Teardown, None, ReEnable::Strict)
        .unwrap();
}

#[test]
fn strict_busy_maps_to_invalid_state_evd_in_use() {
    let evd = sw_evd(4);
    evd.modify_upcall(UpcallPolicy::Disable, Some(noop_upcall()), ReEnable::Strict)
        .unwrap();
    evd.post_se(1).unwrap();
    evd.post_se(2).unwrap();
    let e = evd
        .modify_upcall(UpcallPolicy::SingleInstance, None, ReEnable::Strict)
        .unwrap_err();
    assert_eq!(e, Error::Busy { pending: 2 });
    assert_dat(
        &e,
        DatType::InvalidState,
        Subtype::InvalidStateEvdInUse,
        DAT_INVALID_STATE,
        DAT_INVALID_STATE_EVD_IN_USE,
    );
}

// ----- create -----------------------------------------------------------------

#[test]
fn create_with_bad_qlen() {
    let e = Evd::create(0, EvdFlags::SOFTWARE).unwrap_err();
    assert_invalid_arg(&e, 2, Subtype::InvalidArg2, DAT_INVALID_ARG2);
    let e = Evd::create(MAX_QLEN + 1, EvdFlags::SOFTWARE).unwrap_err();
    assert_no_tevd(&e);
    let e = Evd::builder(0, EvdFlags::SOFTWARE).build().unwrap_err();
    assert!(matches!(e, Error::InvalidParameter { arg: 2, .. }), "{e:?}");
    // The bounds themselves are legal.
    let one = Evd::create(1, EvdFlags::SOFTWARE).unwrap();
    one.post_se(1).unwrap();
    assert_eq!(one.post_se(2), Err(Error::QueueFull));
    let max = Evd::create(MAX_QLEN, EvdFlags::SOFTWARE).unwrap();
    assert_eq!(max.query().unwrap().qlen, MAX_QLEN);
}
