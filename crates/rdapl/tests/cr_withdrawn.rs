//! A connection request withdrawn before the core delivered it: the
//! active side's timer can fire between the provider making the request
//! and handing it over (the loopback arms it first). "Late" is a provider
//! of this file that does exactly that, in order, on the test's thread:
//! it makes the request, settles it as cancelled, then delivers it.
//!
//! Whoever sees the request gone must find an RSP's endpoint released
//! (`Disconnected`, `Broken`), as when the withdrawal comes after the
//! delivery; before, the endpoint stayed `TentativeConnectionPending` for
//! good (a soak of the conformance suite found it on the loopback).

use rdapl::event::{CrHandle, PzHandle, SrqHandle};
use rdapl::provider::{
    Attempt, CrInner, CrOps, CrState, EpInfo, EpInner, EpOps, ListenerOps, Provider, SpInner,
    SrqOps, Transport,
};
use rdapl::*;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The listeners the core opened, for the test to deliver to.
#[derive(Default)]
struct Late {
    sps: Mutex<Vec<Arc<SpInner>>>,
}

struct LateProvider(Arc<Late>);
struct LateIa(Arc<Late>);
struct LateEp;
struct LateListener;
struct LateCr;

fn here() -> IpAddr {
    "127.0.94.1".parse().unwrap()
}

impl Provider for LateProvider {
    fn attr(&self) -> ProviderAttr {
        ProviderAttr {
            name: "late".into(),
            ..rdapl::provider::loopback::Loopback::new().attr()
        }
    }

    fn ia_attr(&self, address: IpAddr) -> IaAttr {
        rdapl::provider::loopback::Loopback::new().ia_attr(address)
    }

    fn open(&self, _address: Option<IpAddr>, _params: &str) -> Result<Arc<dyn Transport>> {
        Ok(Arc::new(LateIa(self.0.clone())))
    }
}

impl Transport for LateIa {
    fn address(&self) -> IpAddr {
        here()
    }

    fn ep_create(&self, _ep: &EpInfo<'_>) -> Result<Box<dyn EpOps>> {
        Ok(Box::new(LateEp))
    }

    fn listen(&self, sp: &Arc<SpInner>) -> Result<Box<dyn ListenerOps>> {
        self.0.sps.lock().unwrap().push(sp.clone());
        Ok(Box::new(LateListener))
    }

    fn srq_create(&self, _srq: SrqHandle, _pz: PzHandle) -> Result<Box<dyn SrqOps>> {
        Err(Error::Internal("late: no SRQ".into()))
    }

    fn close(&self) {}
}

impl EpOps for LateEp {
    fn connect(
        &self,
        _ep: &Arc<EpInner>,
        _attempt: Attempt,
        _remote: IpAddr,
        _conn_qual: u64,
        _private_data: Vec<u8>,
        _timeout: Option<Duration>,
    ) -> Result<()> {
        Err(Error::Internal("late: no connecting".into()))
    }

    fn disconnect(&self, _ep: &Arc<EpInner>, _graceful: bool) {}

    fn kick(&self, _ep: &Arc<EpInner>, _recv: bool) {}
}

impl ListenerOps for LateListener {
    fn unlisten(&self, _sp: &SpInner) {}
}

impl CrOps for LateCr {
    fn accept(&self, _cr: &Arc<CrInner>, _ep: &Arc<EpInner>, _pd: Vec<u8>) -> Result<()> {
        Err(Error::Internal("late: no accepting".into()))
    }

    fn reject(&self, _cr: &Arc<CrInner>, _pd: Vec<u8>) -> Result<()> {
        Ok(())
    }
}

struct Node {
    late: Arc<Late>,
    ia: Ia,
    _pz: Pz,
    cr_evd: Evd,
    conn: Evd,
    ep: Ep,
}

fn node() -> Node {
    let late = Arc::new(Late::default());
    let ia = Ia::open_provider(Arc::new(LateProvider(late.clone())), IaOptions::default()).unwrap();
    let pz = ia.pz_create().unwrap();
    let cr_evd = ia.evd_create(4, EvdFlags::CR).unwrap();
    let conn = ia.evd_create(4, EvdFlags::CONNECTION).unwrap();
    let ep = ia.ep_create(&pz, None, None, Some(&conn), None).unwrap();
    Node {
        late,
        ia,
        _pz: pz,
        cr_evd,
        conn,
        ep,
    }
}

/// The request the provider made on the last listener, withdrawn (if
/// `first`) before it is delivered, else after.
fn arrive(n: &Node, withdrawn_first: bool) -> Arc<CrInner> {
    let sp = n
        .late
        .sps
        .lock()
        .unwrap()
        .last()
        .cloned()
        .expect("listening");
    let cr = CrInner::new(&sp, b"pd".to_vec(), here(), Box::new(LateCr));
    if withdrawn_first {
        assert!(cr.settle_as(CrState::Cancelled));
    }
    sp.deliver(&cr).unwrap();
    if !withdrawn_first {
        assert!(cr.settle_as(CrState::Cancelled));
    }
    cr
}

fn request_of(evd: &Evd) -> CrHandle {
    match evd.dequeue().unwrap() {
        Some(Event::ConnectionRequest(a)) => a.cr,
        e => panic!("expected a connection request, got {e:?}"),
    }
}

fn conn_kind(evd: &Evd) -> ConnectionEventKind {
    match evd.dequeue().unwrap() {
        Some(Event::Connection(c)) => c.kind,
        e => panic!("expected a connection event, got {e:?}"),
    }
}

/// Either order leaves the same: the request's event, the request gone,
/// the RSP's endpoint released with `Broken`, and nothing else.
#[test]
fn a_request_withdrawn_before_its_delivery_releases_the_rsps_endpoint() {
    for withdrawn_first in [false, true] {
        let n = node();
        let _rsp = n.ia.rsp_create(7, &n.ep, &n.cr_evd).unwrap();
        assert_eq!(n.ep.state(), EpState::Reserved);
        let cr = arrive(&n, withdrawn_first);
        let what = if withdrawn_first { "before" } else { "after" };
        let h = request_of(&n.cr_evd);
        assert_eq!(h, cr.handle(), "{what}");
        assert!(n.ia.cr(h).is_err(), "{what}: the request is gone");
        assert_eq!(n.ep.state(), EpState::Disconnected, "{what}");
        assert_eq!(conn_kind(&n.conn), ConnectionEventKind::Broken, "{what}");
        assert!(n.conn.dequeue().unwrap().is_none(), "{what}");
        assert!(n.cr_evd.dequeue().unwrap().is_none(), "{what}");
        // Released for good: reset, it serves again.
        n.ep.reset().unwrap();
        let _rsp = n.ia.rsp_create(8, &n.ep, &n.cr_evd).unwrap();
        assert_eq!(n.ep.state(), EpState::Reserved, "{what}");
    }
}

/// A public SP's request withdrawn before its delivery: its event comes,
/// and the request is gone (nothing registered stays behind it).
#[test]
fn a_psps_request_withdrawn_before_its_delivery_is_not_kept() {
    let n = node();
    let _psp = n.ia.psp_create(9, &n.cr_evd).unwrap();
    let cr = arrive(&n, true);
    assert_eq!(request_of(&n.cr_evd), cr.handle());
    assert!(n.ia.cr(cr.handle()).is_err());
    assert_eq!(n.ep.state(), EpState::Unconnected);
}
