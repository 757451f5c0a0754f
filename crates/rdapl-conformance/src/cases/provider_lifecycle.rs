//! Every object's lifecycle reaches its provider's table of operations
//! (`rdapl::provider` module `ops`): a recording wrapper around the
//! loopback sees each creation and each end exactly once, a refused
//! creation fails the consumer's call and leaves nothing behind, and an
//! abrupt IA close ends what the consumer did not.

use crate::case;
use crate::support as common;

use common::{conn_kind, ia_options, next_cr};
use rdapl::event::{PzHandle, SrqHandle};
use rdapl::provider::{
    Attempt, EpInfo, EpInner, EpLock, EpOps, ListenerOps, MemGrant, MemHandle, MemInfo, NewWr,
    Provider, PzOps, SpInner, SrqOps, Transport,
};
use rdapl::srq::SrqInner;
use rdapl::*;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the wrapper saw, in order, and what it refuses.
#[derive(Default)]
struct Log {
    calls: Mutex<Vec<String>>,
    refuse_pz: AtomicBool,
    refuse_ep: AtomicBool,
    refuse_srq: AtomicBool,
    /// Refuse LMRs longer than this (0: none refused).
    refuse_lmr_over: AtomicU64,
    /// Give every memory object this remote key of the provider's own
    /// (0: the core's keys).
    grant_key: AtomicU32,
}

impl Log {
    fn push(&self, s: String) {
        self.calls.lock().unwrap().push(s);
    }
    fn count(&self, prefix: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.starts_with(prefix))
            .count()
    }
    fn has(&self, call: &str) -> bool {
        self.calls.lock().unwrap().iter().any(|c| c == call)
    }
    fn position(&self, call: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .position(|c| c == call)
            .unwrap_or_else(|| panic!("{call} never called"))
    }
}

fn refused() -> Error {
    Error::InsufficientResources {
        resource: error::Subtype::NoSubtype,
        what: "refused by the test provider",
    }
}

struct Recorder {
    inner: Arc<dyn Provider>,
    log: Arc<Log>,
}

impl Provider for Recorder {
    fn attr(&self) -> ProviderAttr {
        self.inner.attr()
    }
    fn ia_attr(&self, address: IpAddr) -> IaAttr {
        self.inner.ia_attr(address)
    }
    fn open(&self, address: Option<IpAddr>, params: &str) -> Result<Arc<dyn Transport>> {
        Ok(Arc::new(RecIa {
            inner: self.inner.open(address, params)?,
            log: self.log.clone(),
        }))
    }
}

struct RecIa {
    inner: Arc<dyn Transport>,
    log: Arc<Log>,
}

impl Transport for RecIa {
    fn address(&self) -> IpAddr {
        self.inner.address()
    }
    fn ep_create(&self, ep: &EpInfo<'_>) -> Result<Box<dyn EpOps>> {
        if self.log.refuse_ep.load(Ordering::SeqCst) {
            return Err(refused());
        }
        self.log.push(format!("ep_create {}", ep.handle.0));
        Ok(Box::new(RecEp {
            inner: self.inner.ep_create(ep)?,
            log: self.log.clone(),
        }))
    }
    fn listen(&self, sp: &Arc<SpInner>) -> Result<Box<dyn ListenerOps>> {
        self.log.push(format!("listen {}", sp.conn_qual()));
        Ok(Box::new(RecListener {
            inner: self.inner.listen(sp)?,
            log: self.log.clone(),
        }))
    }
    fn pz_create(&self, pz: PzHandle) -> Result<Box<dyn PzOps>> {
        if self.log.refuse_pz.load(Ordering::SeqCst) {
            return Err(refused());
        }
        self.log.push(format!("pz_create {}", pz.0));
        Ok(Box::new(RecPz {
            inner: self.inner.pz_create(pz)?,
            log: self.log.clone(),
            pz,
        }))
    }
    fn srq_create(&self, srq: SrqHandle, pz: PzHandle) -> Result<Box<dyn SrqOps>> {
        if self.log.refuse_srq.load(Ordering::SeqCst) {
            return Err(refused());
        }
        self.log.push(format!("srq_create {} in {}", srq.0, pz.0));
        Ok(Box::new(RecSrq {
            inner: self.inner.srq_create(srq, pz)?,
            log: self.log.clone(),
            srq,
        }))
    }
    fn close(&self) {
        self.log.push("close".into());
        self.inner.close();
    }
}

struct RecEp {
    inner: Box<dyn EpOps>,
    log: Arc<Log>,
}

impl EpOps for RecEp {
    fn connect(
        &self,
        ep: &Arc<EpInner>,
        attempt: Attempt,
        remote: IpAddr,
        conn_qual: u64,
        private_data: Vec<u8>,
        timeout: Option<Duration>,
    ) -> Result<()> {
        self.log.push(format!("connect {}", ep.handle().0));
        self.inner
            .connect(ep, attempt, remote, conn_qual, private_data, timeout)
    }
    fn disconnect(&self, ep: &Arc<EpInner>, graceful: bool) {
        self.log.push(format!("disconnect {}", ep.handle().0));
        self.inner.disconnect(ep, graceful)
    }
    fn connect_cancel(&self, ep: &Arc<EpInner>) {
        self.log.push(format!("connect_cancel {}", ep.handle().0));
        self.inner.connect_cancel(ep)
    }
    fn destroy(&self, ep: &Arc<EpInner>) {
        self.log.push(format!("destroy {}", ep.handle().0));
        self.inner.destroy(ep)
    }
    fn break_connection(&self, ep: &Arc<EpInner>) {
        self.inner.break_connection(ep)
    }
    fn kick(&self, ep: &Arc<EpInner>, recv: bool) {
        self.inner.kick(ep, recv)
    }
    fn submit(&self, ep: &Arc<EpInner>, core: EpLock<'_>, wr: NewWr<'_>) {
        self.inner.submit(ep, core, wr)
    }
}

struct RecListener {
    inner: Box<dyn ListenerOps>,
    log: Arc<Log>,
}

impl ListenerOps for RecListener {
    fn unlisten(&self, sp: &SpInner) {
        self.log.push(format!("unlisten {}", sp.conn_qual()));
        self.inner.unlisten(sp)
    }
}

struct RecPz {
    inner: Box<dyn PzOps>,
    log: Arc<Log>,
    pz: PzHandle,
}

fn mem_name(m: &MemInfo) -> String {
    match m.handle {
        MemHandle::Lmr(h) => format!("lmr {}", h.0),
        MemHandle::Rmr(h) => format!("rmr {}", h.0),
    }
}

impl PzOps for RecPz {
    fn mem_create(&self, mem: &MemInfo) -> Result<MemGrant> {
        let over = self.log.refuse_lmr_over.load(Ordering::SeqCst);
        if over > 0 && mem.len > over {
            return Err(refused());
        }
        let grant = self.inner.mem_create(mem)?;
        self.log.push(format!("mem_create {}", mem_name(mem)));
        match self.log.grant_key.load(Ordering::SeqCst) {
            0 => Ok(grant),
            k => Ok(MemGrant::remote_key(k)),
        }
    }
    fn mem_free(&self, mem: &MemInfo) {
        self.log.push(format!("mem_free {}", mem_name(mem)));
        self.inner.mem_free(mem)
    }
    fn free(&self) {
        self.log.push(format!("pz_free {}", self.pz.0));
        self.inner.free()
    }
}

struct RecSrq {
    inner: Box<dyn SrqOps>,
    log: Arc<Log>,
    srq: SrqHandle,
}

impl SrqOps for RecSrq {
    fn posted(&self, srq: &SrqInner) {
        self.log.push(format!("srq_posted {}", self.srq.0));
        self.inner.posted(srq)
    }
    fn free(&self) {
        self.log.push(format!("srq_free {}", self.srq.0));
        self.inner.free()
    }
}

fn recorder() -> (Arc<Recorder>, Arc<Log>) {
    let log = Arc::new(Log::default());
    let inner: Arc<dyn Provider> = rdapl::Loopback::new();
    (
        Arc::new(Recorder {
            inner,
            log: log.clone(),
        }),
        log,
    )
}

fn open(p: &Arc<Recorder>, addr: &str) -> Ia {
    Ia::open_provider(p.clone(), ia_options(addr)).unwrap()
}

#[case]
fn every_creation_and_free_reaches_the_provider_once() {
    let (p, log) = recorder();
    let (cia, sia) = (open(&p, "127.0.95.1"), open(&p, "127.0.95.2"));
    let evd = |ia: &Ia, f| ia.evd_create(16, f).unwrap();
    let (c_conn, c_dto) = (evd(&cia, EvdFlags::CONNECTION), evd(&cia, EvdFlags::DTO));
    let (s_conn, s_dto, s_cr) = (
        evd(&sia, EvdFlags::CONNECTION),
        evd(&sia, EvdFlags::DTO),
        evd(&sia, EvdFlags::CR),
    );

    // Zones and memory.
    let spz = sia.pz_create().unwrap();
    assert!(log.has(&format!("pz_create {}", spz.handle().0)));
    let lmr = spz.lmr_create_from(vec![7; 4096], MemPriv::ALL).unwrap();
    let fmr = spz.lmr_create_fmr(1 << 16).unwrap();
    let rmr = spz.rmr_create().unwrap();
    let lmr_name = format!("lmr {}", lmr.handle().0);
    assert!(log.has(&format!("mem_create {lmr_name}")));
    assert!(log.has(&format!("mem_create lmr {}", fmr.handle().0)));
    assert!(log.has(&format!("mem_create rmr {}", rmr.handle().0)));
    let mut borrowed = [0u8; 256];
    let bh = rdapl::lmr_scope(|s| {
        let b = spz
            .lmr_create_borrowed(s, &mut borrowed, MemPriv::ALL)
            .unwrap();
        let h = b.handle();
        assert!(log.has(&format!("mem_create lmr {}", h.0)));
        h
    });
    // The scope's end freed the borrowed LMR.
    assert_eq!(log.count(&format!("mem_free lmr {}", bh.0)), 1);

    // An SRQ and endpoints on both sides.
    let srq = sia.srq_create(&spz, 8, 1).unwrap();
    assert!(log.has(&format!(
        "srq_create {} in {}",
        srq.handle().0,
        spz.handle().0
    )));
    let sep = sia
        .ep_builder(&spz)
        .recv_evd(&s_dto)
        .request_evd(&s_dto)
        .connect_evd(&s_conn)
        .srq(&srq)
        .create()
        .unwrap();
    let cpz = cia.pz_create().unwrap();
    let cep = cia
        .ep_builder(&cpz)
        .recv_evd(&c_dto)
        .request_evd(&c_dto)
        .connect_evd(&c_conn)
        .create()
        .unwrap();
    assert!(log.has(&format!("ep_create {}", sep.handle().0)));
    assert!(log.has(&format!("ep_create {}", cep.handle().0)));
    srq.post_recv(&[lmr.triplet(0, 64).unwrap()], 1, D).unwrap();
    assert!(log.has(&format!("srq_posted {}", srq.handle().0)));

    // A connection, up and down.
    let psp = sia.psp_create(3, &s_cr).unwrap();
    assert_eq!(log.count("listen 3"), 1);
    cep.connect(sia.address(), 3, Some(common::T), b"hi")
        .unwrap();
    assert!(log.has(&format!("connect {}", cep.handle().0)));
    next_cr(&sia, &s_cr).accept(&sep, b"").unwrap();
    assert_eq!(conn_kind(&c_conn), ConnectionEventKind::Established);
    assert_eq!(conn_kind(&s_conn), ConnectionEventKind::Established);
    cep.disconnect(true).unwrap();
    assert!(log.has(&format!("disconnect {}", cep.handle().0)));
    assert_eq!(conn_kind(&c_conn), ConnectionEventKind::Disconnected);
    assert_eq!(conn_kind(&s_conn), ConnectionEventKind::Disconnected);

    // Every free, once each, even when repeated.
    psp.free().unwrap();
    assert!(psp.free().is_err());
    assert_eq!(log.count("unlisten 3"), 1);
    sep.free().unwrap();
    cep.free().unwrap();
    assert!(cep.free().is_err());
    assert_eq!(log.count(&format!("destroy {}", sep.handle().0)), 1);
    assert_eq!(log.count(&format!("destroy {}", cep.handle().0)), 1);
    srq.free().unwrap();
    assert!(srq.free().is_err());
    assert_eq!(log.count(&format!("srq_free {}", srq.handle().0)), 1);
    rmr.free().unwrap();
    fmr.free().unwrap();
    lmr.free().unwrap();
    assert!(lmr.free().is_err());
    assert_eq!(log.count(&format!("mem_free {lmr_name}")), 1);
    assert_eq!(log.count(&format!("mem_free lmr {}", fmr.handle().0)), 1);
    assert_eq!(log.count(&format!("mem_free rmr {}", rmr.handle().0)), 1);
    assert_eq!(log.count("mem_create"), log.count("mem_free"));
    spz.free().unwrap();
    assert!(spz.free().is_err());
    assert_eq!(log.count(&format!("pz_free {}", spz.handle().0)), 1);
    cpz.free().unwrap();
    sia.close(CloseFlags::Graceful).unwrap();
    cia.close(CloseFlags::Graceful).unwrap();
    assert_eq!(log.count("close"), 2);
    assert_eq!(log.count("ep_create"), log.count("destroy"));
}

#[case]
fn an_abrupt_close_ends_every_endpoint_and_listener_then_the_ia() {
    let (p, log) = recorder();
    let (cia, sia) = (open(&p, "127.0.96.1"), open(&p, "127.0.96.2"));
    let c = common::Node::of(cia, None, 16, 16);
    let s = common::Node::of(sia, None, 16, 16);
    let _psp = s.ia.psp_create(4, &s.cr).unwrap();
    let _rsp_ep = s.ep2();
    let _rsp = s.ia.rsp_create(5, &_rsp_ep, &s.cr).unwrap();
    common::connect_nodes(&c, &s, 4);
    // A second client endpoint trying to connect when the server closes.
    let pending = c.ep2();
    pending
        .connect(s.ia.address(), 4, Some(common::T), b"")
        .unwrap();
    let _ = next_cr(&s.ia, &s.cr);
    s.ia.close(CloseFlags::Abrupt).unwrap();
    for ep in [&s.ep, &_rsp_ep] {
        assert_eq!(log.count(&format!("destroy {}", ep.handle().0)), 1);
    }
    assert_eq!(log.count("unlisten 4"), 1);
    assert_eq!(log.count("unlisten 5"), 1);
    // The IA's own table hears last.
    let close = log.position("close");
    assert!(log.position(&format!("destroy {}", s.ep.handle().0)) < close);
    assert!(log.position("unlisten 4") < close);
    // Its peer was told; the pending request was answered.
    // (Pending requests are answered before endpoints end.)
    let mut kinds = [conn_kind(&c.conn), conn_kind(&c.conn)];
    kinds.sort_by_key(|k| *k as u32);
    let mut want = [
        ConnectionEventKind::Disconnected,
        ConnectionEventKind::PeerRejected,
    ];
    want.sort_by_key(|k| *k as u32);
    assert_eq!(kinds, want);
    // The client's pending attempt and its free.
    c.ia.close(CloseFlags::Abrupt).unwrap();
    assert_eq!(log.count(&format!("destroy {}", pending.handle().0)), 1);
    assert_eq!(log.count("ep_create"), log.count("destroy"));
}

#[case]
fn a_refused_creation_fails_the_call_and_leaves_nothing() {
    let (p, log) = recorder();
    let ia = open(&p, "127.0.97.1");
    let dto = ia.evd_create(16, EvdFlags::DTO).unwrap();

    log.refuse_pz.store(true, Ordering::SeqCst);
    let e = ia.pz_create().unwrap_err();
    assert_eq!(e.to_string(), refused().to_string());
    log.refuse_pz.store(false, Ordering::SeqCst);
    let pz = ia.pz_create().unwrap();

    log.refuse_lmr_over.store(1024, Ordering::SeqCst);
    let e = pz.lmr_create_from(vec![0; 4096], MemPriv::ALL).unwrap_err();
    assert_eq!(e.to_string(), refused().to_string());
    let mut buf = [0u8; 2048];
    rdapl::lmr_scope(|s| {
        assert!(pz.lmr_create_borrowed(s, &mut buf, MemPriv::ALL).is_err());
    });
    let small = pz.lmr_create_from(vec![0; 512], MemPriv::ALL).unwrap();
    assert_eq!(log.count("mem_create"), 1);

    log.refuse_ep.store(true, Ordering::SeqCst);
    let e = ia
        .ep_create(&pz, Some(&dto), Some(&dto), None, None)
        .unwrap_err();
    assert_eq!(e.to_string(), refused().to_string());
    log.refuse_ep.store(false, Ordering::SeqCst);

    log.refuse_srq.store(true, Ordering::SeqCst);
    assert!(ia.srq_create(&pz, 4, 1).is_err());
    log.refuse_srq.store(false, Ordering::SeqCst);

    // Nothing refused holds the zone or the IA: once the one LMR made is
    // freed, the zone frees and the IA closes gracefully.
    assert!(pz.free().is_err());
    small.free().unwrap();
    pz.free().unwrap();
    ia.close(CloseFlags::Graceful).unwrap();
    assert_eq!(log.count("mem_free"), 1);
    assert_eq!(log.count("destroy"), 0);
}

use common::D;

/// A provider whose fabric gives its own remote keys (libfabric's
/// `FI_MR_PROV_KEY`): consumers see that key as the LMR's `rmr_context`
/// (and in its remote triplets), the local key stays the core's; a key
/// for a window or a fast-registration LMR, whose keys change with every
/// bind and map, is refused, and the provider hears of its end.
#[case]
fn a_provider_key_is_the_remote_key_consumers_see() {
    let (p, log) = recorder();
    let ia = open(&p, "127.0.97.2");
    let pz = ia.pz_create().unwrap();
    let plain = pz.lmr_create_from(vec![1; 64], MemPriv::ALL).unwrap();
    log.grant_key.store(0xAB_CD_EF_01, Ordering::SeqCst);
    let lmr = pz.lmr_create_from(vec![2; 64], MemPriv::ALL).unwrap();
    assert_eq!(lmr.rmr_context().unwrap(), 0xAB_CD_EF_01);
    assert_eq!(lmr.rmr_triplet(8, 16).unwrap().rmr_context, 0xAB_CD_EF_01);
    assert_ne!(
        lmr.context().unwrap(),
        0xAB_CD_EF_01,
        "the local key is the core's"
    );
    assert_eq!(
        lmr.triplet(0, 8).unwrap().lmr_context,
        lmr.context().unwrap()
    );
    // An LMR registered before keeps the core's (remote = local) key.
    assert_eq!(plain.rmr_context().unwrap(), plain.context().unwrap());

    let created = log.count("mem_create");
    assert!(matches!(pz.rmr_create(), Err(Error::Internal(_))));
    assert!(matches!(pz.lmr_create_fmr(4096), Err(Error::Internal(_))));
    assert_eq!(log.count("mem_create"), created + 2);
    assert_eq!(log.count("mem_free"), 2, "each refused one was freed");
    log.grant_key.store(0, Ordering::SeqCst);

    // Freed, the LMR's keys are gone, the provider's with them.
    lmr.free().unwrap();
    assert!(lmr.rmr_context().is_err());
    assert_eq!(log.count("mem_free"), 3);
    plain.free().unwrap();
    pz.free().unwrap();
    ia.close(CloseFlags::Graceful).unwrap();
}
