//! The provider's per-connection slot (`EpCore::link`): a provider keeps
//! its state of a connection there, and the core drops it whenever the
//! endpoint leaves the connection (the provider's end, a disconnect, a
//! free, a reset), refuses it for an endpoint that is not connecting or
//! connected, and never looks inside. "Solo" is a provider of this file:
//! a connect is established at once, with no peer, and its link is a
//! value that counts its own drops. Also here: a connection attempt's
//! outcome reaches the endpoint only while it still makes that attempt.

use rdapl::event::{PzHandle, SrqHandle};
use rdapl::provider::{
    Attempt, EpInfo, EpInner, EpOps, ListenerOps, Provider, SpInner, SrqOps, Transport,
};
use rdapl::*;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Counts its drops.
struct Link(Arc<AtomicUsize>);

impl Drop for Link {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[derive(Default)]
struct Solo {
    /// Links dropped, ever.
    dropped: Arc<AtomicUsize>,
    /// Links set and kept (`set_link` said yes).
    kept: AtomicUsize,
    /// Whether `disconnect` tells the core (`ended`); if not, only the
    /// core's own steps (free, reset) end the endpoint's side.
    tells: AtomicBool,
    /// Whether a connect is established at once (else it stays pending).
    hangs: AtomicBool,
    /// The last endpoint that connected (the provider's view of it).
    last: Mutex<Option<Arc<EpInner>>>,
    /// Every attempt `connect` was given, in order.
    attempts: Mutex<Vec<Attempt>>,
}

struct SoloIa(Arc<Solo>);
struct SoloEp(Arc<Solo>);

/// The provider value: its IAs share one `Solo`.
struct SoloProvider(Arc<Solo>);

impl Provider for SoloProvider {
    fn attr(&self) -> ProviderAttr {
        ProviderAttr {
            name: "solo".into(),
            ..rdapl::provider::loopback::Loopback::new().attr()
        }
    }

    fn ia_attr(&self, address: IpAddr) -> IaAttr {
        rdapl::provider::loopback::Loopback::new().ia_attr(address)
    }

    fn open(&self, _address: Option<IpAddr>, _params: &str) -> Result<Arc<dyn Transport>> {
        Ok(Arc::new(SoloIa(self.0.clone())))
    }
}

impl Transport for SoloIa {
    fn address(&self) -> IpAddr {
        "127.0.93.1".parse().unwrap()
    }

    fn ep_create(&self, _ep: &EpInfo<'_>) -> Result<Box<dyn EpOps>> {
        Ok(Box::new(SoloEp(self.0.clone())))
    }

    fn listen(&self, _sp: &Arc<SpInner>) -> Result<Box<dyn ListenerOps>> {
        Err(Error::Internal("solo: no listening".into()))
    }

    fn srq_create(&self, _srq: SrqHandle, _pz: PzHandle) -> Result<Box<dyn SrqOps>> {
        Err(Error::Internal("solo: no SRQ".into()))
    }

    fn close(&self) {}
}

impl EpOps for SoloEp {
    fn connect(
        &self,
        ep: &Arc<EpInner>,
        attempt: Attempt,
        remote: IpAddr,
        conn_qual: u64,
        _private_data: Vec<u8>,
        _timeout: Option<Duration>,
    ) -> Result<()> {
        *self.0.last.lock().unwrap() = Some(ep.clone());
        self.0.attempts.lock().unwrap().push(attempt);
        // Made while connecting (kept), then established.
        if ep.set_link(Box::new(Link(self.0.dropped.clone()))) {
            self.0.kept.fetch_add(1, Ordering::SeqCst);
        }
        if !self.0.hangs.load(Ordering::SeqCst) {
            ep.established(Some(attempt), (remote, conn_qual), None);
        }
        Ok(())
    }

    fn disconnect(&self, ep: &Arc<EpInner>, _graceful: bool) {
        if self.0.tells.load(Ordering::SeqCst) {
            ep.ended(ConnectionEventKind::Disconnected);
        }
    }

    fn kick(&self, _ep: &Arc<EpInner>, _recv: bool) {}
}

struct Node {
    solo: Arc<Solo>,
    ia: Ia,
    _pz: Pz,
    evd: Evd,
    ep: Ep,
}

fn node(tells: bool) -> Node {
    let solo = Arc::new(Solo::default());
    solo.tells.store(tells, Ordering::SeqCst);
    let ia = Ia::open_provider(Arc::new(SoloProvider(solo.clone())), IaOptions::default()).unwrap();
    let pz = ia.pz_create().unwrap();
    let evd = ia
        .evd_create(16, EvdFlags::DTO | EvdFlags::CONNECTION)
        .unwrap();
    let ep = ia
        .ep_create(&pz, Some(&evd), Some(&evd), Some(&evd), None)
        .unwrap();
    Node {
        solo,
        ia,
        _pz: pz,
        evd,
        ep,
    }
}

fn connect(n: &Node) {
    n.ep.connect("127.0.93.2".parse().unwrap(), 1, None, b"")
        .unwrap();
    assert_eq!(n.ep.state(), EpState::Connected);
    assert_eq!(
        n.solo.kept.load(Ordering::SeqCst),
        1,
        "kept while connecting"
    );
}

fn dropped(n: &Node) -> usize {
    n.solo.dropped.load(Ordering::SeqCst)
}

#[test]
fn the_providers_end_drops_the_link() {
    let n = node(true);
    connect(&n);
    assert_eq!(dropped(&n), 0, "kept while connected");
    n.ep.disconnect(false).unwrap();
    assert_eq!(n.ep.state(), EpState::Disconnected);
    assert_eq!(dropped(&n), 1, "dropped as the endpoint left");
    n.ep.reset().unwrap();
    n.ep.free().unwrap();
    assert_eq!(dropped(&n), 1, "dropped once");
    n.ia.close(CloseFlags::Abrupt).unwrap();
}

#[test]
fn a_free_drops_the_link_even_if_the_provider_never_ends() {
    let n = node(false);
    connect(&n);
    // The provider hears the free (its default `destroy` disconnects) but
    // never tells the core: the core's own teardown drops the link.
    n.ep.free().unwrap();
    assert_eq!(dropped(&n), 1);
    n.ia.close(CloseFlags::Abrupt).unwrap();
}

#[test]
fn an_abrupt_close_drops_the_link() {
    let n = node(false);
    connect(&n);
    n.ia.close(CloseFlags::Abrupt).unwrap();
    assert_eq!(dropped(&n), 1);
}

#[test]
fn set_link_is_refused_outside_a_connection() {
    let n = node(true);
    connect(&n);
    let inner = n.solo.last.lock().unwrap().clone().expect("connected");
    // Connected: kept; a second one replaces (and drops) the first.
    assert!(inner.set_link(Box::new(Link(n.solo.dropped.clone()))));
    assert_eq!(dropped(&n), 1, "the one it replaced");
    assert!(inner.lock().link_ref::<Link>().is_some());
    n.ep.disconnect(false).unwrap();
    assert_eq!(dropped(&n), 2);
    assert!(inner.lock().link_ref::<Link>().is_none());
    // Disconnected, then unconnected: refused, and dropped at once.
    assert!(!inner.set_link(Box::new(Link(n.solo.dropped.clone()))));
    assert_eq!(dropped(&n), 3);
    n.ep.reset().unwrap();
    assert!(!inner.set_link(Box::new(Link(n.solo.dropped.clone()))));
    assert_eq!(dropped(&n), 4);
    assert!(inner.lock().link_ref::<Link>().is_none());
    let _ = n.evd.dequeue();
    drop(inner);
    n.ia.close(CloseFlags::Abrupt).unwrap();
}

#[test]
fn a_reconnect_after_reset_keeps_a_new_link() {
    let n = node(true);
    connect(&n);
    n.ep.disconnect(false).unwrap();
    n.ep.reset().unwrap();
    assert_eq!(dropped(&n), 1);
    n.ep.connect("127.0.93.2".parse().unwrap(), 1, None, b"")
        .unwrap();
    assert_eq!(n.solo.kept.load(Ordering::SeqCst), 2);
    assert_eq!(dropped(&n), 1, "the new one is kept");
    n.ep.disconnect(false).unwrap();
    assert_eq!(dropped(&n), 2);
    n.ia.close(CloseFlags::Abrupt).unwrap();
}

#[test]
fn a_connect_given_up_drops_the_link() {
    for free in [false, true] {
        let n = node(true);
        n.solo.hangs.store(true, Ordering::SeqCst);
        n.ep.connect("127.0.93.2".parse().unwrap(), 1, None, b"")
            .unwrap();
        assert_eq!(n.ep.state(), EpState::ActiveConnectionPending);
        assert_eq!(n.solo.kept.load(Ordering::SeqCst), 1);
        assert_eq!(dropped(&n), 0, "kept while connecting");
        if free {
            n.ep.free().unwrap();
        } else {
            // The consumer gives the attempt up.
            n.ep.disconnect(false).unwrap();
            assert_eq!(n.ep.state(), EpState::Disconnected);
        }
        assert_eq!(dropped(&n), 1, "free: {free}");
        n.solo.last.lock().unwrap().take();
        n.ia.close(CloseFlags::Abrupt).unwrap();
    }
}

/// A late outcome of an attempt the consumer withdrew (a disconnect, a
/// reset, a new connect) changes nothing: not established, not failed,
/// not ended; the attempt that replaced it stays pending until its own
/// outcome comes.
#[test]
fn a_withdrawn_attempts_outcome_does_not_settle_the_next() {
    let n = node(true);
    n.solo.hangs.store(true, Ordering::SeqCst);
    let peer: IpAddr = "127.0.93.2".parse().unwrap();
    n.ep.connect(peer, 1, None, b"").unwrap();
    n.ep.disconnect(false).unwrap();
    let kind = |e: Option<Event>| match e {
        Some(Event::Connection(c)) => c.kind,
        e => panic!("expected a connection event, got {e:?}"),
    };
    assert_eq!(
        kind(n.evd.dequeue().unwrap()),
        ConnectionEventKind::Disconnected
    );
    n.ep.reset().unwrap();
    n.ep.connect(peer, 2, None, b"").unwrap();
    let inner = n.solo.last.lock().unwrap().clone().expect("connecting");
    let attempts = n.solo.attempts.lock().unwrap().clone();
    let [first, second] = attempts[..] else {
        panic!("two attempts, got {attempts:?}")
    };
    assert_ne!(first, second);
    assert!(inner.established(Some(first), (peer, 1), None).is_none());
    assert!(!inner.connect_failed(first, ConnectionEventKind::TimedOut, None));
    assert!(
        !inner.ended(ConnectionEventKind::Broken),
        "an attempt is not a connection"
    );
    assert!(
        inner.established(None, (peer, 2), None).is_none(),
        "a passive side's report"
    );
    assert_eq!(n.ep.state(), EpState::ActiveConnectionPending);
    assert!(n.evd.dequeue().unwrap().is_none());
    assert!(inner.established(Some(second), (peer, 2), None).is_some());
    assert_eq!(n.ep.state(), EpState::Connected);
    assert_eq!(
        kind(n.evd.dequeue().unwrap()),
        ConnectionEventKind::Established
    );
    n.ia.close(CloseFlags::Abrupt).unwrap();
}
