//! The application API beyond DAT's positional calls: endpoints built with
//! named EVDs, upcall switches whose outcomes are values, poller entries
//! that detach when dropped.

use crate::case;
use crate::support as common;

use common::{LIMIT, eventually, noop_upcall, open, sw_evd};
use rdapl::error::Subtype;
use rdapl::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

#[case]
fn ep_builder_names_each_evd() {
    let ia = open("127.0.61.1");
    let pz = ia.pz_create().unwrap();
    let rcv = ia.evd_create(8, EvdFlags::DTO).unwrap();
    let req = ia.evd_create(8, EvdFlags::DTO).unwrap();
    let conn = ia.evd_create(8, EvdFlags::CONNECTION).unwrap();
    let ep = ia
        .ep_builder(&pz)
        .recv_evd(&rcv)
        .request_evd(&req)
        .connect_evd(&conn)
        .attr(EpAttr {
            max_recv_dtos: 3,
            ..Default::default()
        })
        .create()
        .unwrap();
    let q = ep.query().unwrap();
    assert_eq!(q.attr.max_recv_dtos, 3);
    // Each EVD is checked for its own stream: a DTO EVD is no connection EVD.
    assert!(matches!(
        ia.ep_builder(&pz).connect_evd(&req).create(),
        Err(Error::InvalidHandle(Subtype::InvalidHandleEvdConn))
    ));
    // One EVD for everything.
    let all = ia
        .evd_create(16, EvdFlags::DTO | EvdFlags::CONNECTION)
        .unwrap();
    ia.ep_builder(&pz).evd(&all).create().unwrap();
    // An SRQ needs a receive EVD.
    let srq = ia.srq_create(&pz, 4, 1).unwrap();
    assert!(matches!(
        ia.ep_builder(&pz).srq(&srq).create(),
        Err(Error::InvalidHandle(Subtype::InvalidHandleEvdRecv))
    ));
    let ep = ia
        .ep_builder(&pz)
        .srq(&srq)
        .recv_evd(&rcv)
        .create()
        .unwrap();
    assert!(ep.post_recv(&[], 1, CompletionFlags::DEFAULT).is_err());
}

#[case]
fn enable_upcalls_outcomes_are_values() {
    let evd = sw_evd(8);
    assert!(
        matches!(
            evd.enable_upcalls(UpcallPolicy::SingleInstance, ReEnable::OnNew),
            Err(Error::InvalidParameter { arg: 3, .. })
        ),
        "no upcall object registered"
    );
    evd.modify_upcall(UpcallPolicy::Disable, Some(noop_upcall()), ReEnable::OnNew)
        .unwrap();
    assert!(matches!(
        evd.enable_upcalls(UpcallPolicy::Disable, ReEnable::OnNew),
        Err(Error::InvalidParameter { arg: 2, .. })
    ));
    evd.post_se(1).unwrap();
    assert_eq!(
        evd.enable_upcalls(UpcallPolicy::SingleInstance, ReEnable::Strict),
        Ok(Enabled::Refused { pending: 1 })
    );
    assert_eq!(evd.query().unwrap().upcall_policy, UpcallPolicy::Disable);
    assert_eq!(
        evd.enable_upcalls(UpcallPolicy::NotifyOnly, ReEnable::OnNew),
        Ok(Enabled::PollFirst { pending: 1 })
    );
    assert_eq!(evd.disable_upcalls(), Ok(1));
    assert_eq!(evd.dequeue().unwrap(), Some(Event::Software(1)));
    assert_eq!(
        evd.enable_upcalls(UpcallPolicy::SingleInstance, ReEnable::Strict),
        Ok(Enabled::Armed)
    );
    assert_eq!(evd.teardown_upcalls(), Ok(0));
    evd.post_se(2).unwrap();
    let seen = Arc::new(AtomicU64::new(0));
    let s2 = seen.clone();
    evd.modify_upcall(
        UpcallPolicy::Disable,
        Some(common::upcall(move |_, _, _| {
            s2.fetch_add(1, Ordering::SeqCst);
        })),
        ReEnable::OnNew,
    )
    .unwrap();
    assert_eq!(
        evd.enable_upcalls(UpcallPolicy::SingleInstance, ReEnable::OnAny),
        Ok(Enabled::Delivering { pending: 1 })
    );
    assert!(eventually(LIMIT, || seen.load(Ordering::SeqCst) == 1));
}

#[case]
fn dropping_a_poller_entry_detaches_its_evd() {
    let poller = Poller::new(PollerConfig::default()).unwrap();
    let evd = sw_evd(16);
    let handled = Arc::new(AtomicU64::new(0));
    let h2 = handled.clone();
    let entry = poller
        .add(&evd, move |_| {
            h2.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    evd.post_se(1).unwrap();
    assert!(eventually(LIMIT, || handled.load(Ordering::SeqCst) == 1));
    drop(entry);
    assert_eq!(evd.query().unwrap().upcall_policy, UpcallPolicy::Disable);
    evd.post_se(2).unwrap();
    std::thread::sleep(common::QUIET);
    assert_eq!(handled.load(Ordering::SeqCst), 1, "handled after the drop");
    assert_eq!(evd.dequeue().unwrap(), Some(Event::Software(2)));
    // The EVD can be attached again.
    let _again = poller.add(&evd, |_| {}).unwrap();
    // An entry outliving its poller drops quietly.
    let evd2 = sw_evd(4);
    let late = poller.add(&evd2, |_| {}).unwrap();
    drop(poller);
    drop(late);
}

#[case]
fn ias_opened_with_defaults_get_addresses_of_their_own() {
    if common::skip_unless_loopback("the loopback's own default addresses") {
        return;
    }
    let lb = Loopback::new();
    let open = |address: Option<std::net::IpAddr>, params: &str| {
        Ia::open_provider(
            lb.clone(),
            IaOptions {
                address,
                params: params.into(),
                ..Default::default()
            },
        )
    };
    let (a, b) = (open(None, "").unwrap(), open(None, "").unwrap());
    assert_ne!(a.address(), b.address(), "two default IAs are told apart");
    let x: std::net::IpAddr = "127.0.62.9".parse().unwrap();
    let c = open(Some(x), "").unwrap();
    assert_eq!(c.address(), x, "the typed address is used");
    // The older spelling agrees, or is refused.
    assert_eq!(open(Some(x), "addr=127.0.62.9").unwrap().address(), x);
    assert!(matches!(
        open(Some(x), "addr=127.0.62.10"),
        Err(Error::InvalidParameter { arg: 1, .. })
    ));
    // An address given back is reused by the next default IA.
    let first = a.address();
    a.close(CloseFlags::Graceful).unwrap();
    drop(a);
    assert_eq!(open(None, "").unwrap().address(), first);
    // A client at defaults reaches a server at defaults by its address.
    let cr = b.evd_create(4, EvdFlags::CR).unwrap();
    let _psp = b.psp_create(77, &cr).unwrap();
    let client = open(None, "").unwrap();
    let pz = client.pz_create().unwrap();
    let conn = client.evd_create(4, EvdFlags::CONNECTION).unwrap();
    let ep = client.ep_builder(&pz).connect_evd(&conn).create().unwrap();
    ep.connect(b.address(), 77, Some(LIMIT), b"").unwrap();
    assert!(matches!(
        cr.wait(Some(LIMIT), 1).unwrap().0,
        Event::ConnectionRequest(_)
    ));
}
