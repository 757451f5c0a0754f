//! Helpers of the cases, public so a provider's own tests (and rdapl's
//! tests of the core) use the same ones.
//!
//! * Watchdogs and polling: [`within`], [`eventually`].
//! * Software-event EVDs, upcalls and event builders: [`sw_evd`],
//!   [`upcall`], [`upcall_evd`], [`waiter_owns`], [`start_waiter`],
//!   [`dto_event`], [`conn_event`], [`cr_event`], ...
//! * The provider under test: [`provider`], [`open`], a [`Node`] (IA, PZ,
//!   one EVD per stream and an endpoint), a connected client/server
//!   [`Pair`], and "the next event on this EVD, within [`T`]" helpers
//!   ([`next`], [`next_dto`], [`conn_kind`], [`next_cr`], ...).

use rdapl::error::Subtype;
use rdapl::event::{CrHandle, EpHandle};
use rdapl::provider::{FaultInjector, Faults};
use rdapl::{
    CompletionFlags, ConnectionEvent, ConnectionEventKind, Cr, CrArrival, Dispatcher,
    DtoCompletion, DtoOp, DtoStatus, Ep, EpAttr, EpState, Error, Evd, EvdFlags, Event, Ia,
    IaOptions, Lmr, MemPriv, Psp, Pz, ReEnable, Region, Result, RmrTriplet, Upcall, UpcallPolicy,
};
use std::net::IpAddr;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc;
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

// ----- watchdogs ----------------------------------------------------------------

/// The bound of a blocking step (only reached when something is wrong).
pub const LIMIT: Duration = Duration::from_secs(5);
/// How long to watch for something that must *not* happen.
pub const QUIET: Duration = Duration::from_millis(100);

/// A check that needs something outside the project (a program, root,
/// a VM) and cannot run here: it prints `SKIPPED what: why`, unless
/// `RDAPL_REQUIRE_EXTERNAL=1` (CI, which installs what is needed), where
/// it fails.
pub fn skip_or_fail(what: &str, why: &str) {
    if std::env::var("RDAPL_REQUIRE_EXTERNAL").as_deref() == Ok("1") {
        panic!("{why}, and RDAPL_REQUIRE_EXTERNAL=1");
    }
    println!("SKIPPED {what}: {why}");
}

/// Runs `f` on a helper thread and fails the test if it does not finish
/// within `limit` (the helper is leaked in that case, e.g. deadlocked). A
/// panic in `f` is passed on to the caller.
pub fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(catch_unwind(AssertUnwindSafe(f)));
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(v)) => v,
        Ok(Err(panic)) => resume_unwind(panic),
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: did not return within {limit:?}"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what}: panicked"),
    }
}

/// Polls `cond` every millisecond until it holds (true) or `limit` passes
/// (false).
pub fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        thread::sleep(Duration::from_millis(1));
    }
}

// ----- software-event EVDs and upcalls ------------------------------------------

/// A software-event EVD of `qlen` entries.
pub fn sw_evd(qlen: usize) -> Evd {
    Evd::create(qlen, EvdFlags::SOFTWARE).unwrap()
}

/// A poller with `threads` threads, `budget` events a run and re-arm
/// mode `mode`.
pub fn poller(threads: usize, budget: usize, mode: rdapl::ReEnable) -> rdapl::Poller {
    rdapl::Poller::new(rdapl::PollerConfig {
        threads,
        budget,
        mode,
    })
    .unwrap()
}

/// The value of a software event.
pub fn sw_value(ev: &Event) -> u64 {
    match ev {
        Event::Software(v) => *v,
        other => panic!("unexpected event {other:?}"),
    }
}

/// The values of software events.
pub fn sw_values(evs: &[Event]) -> Vec<u64> {
    evs.iter().map(sw_value).collect()
}

/// A software event value naming its producer and sequence number.
pub fn tag(producer: u64, seq: u64) -> u64 {
    (producer << 32) | seq
}

/// The (producer, sequence number) of a [`tag`].
pub fn untag(v: u64) -> (usize, u64) {
    ((v >> 32) as usize, v & 0xFFFF_FFFF)
}

/// True while a `wait` call owns the EVD. `dequeue_batch` with `max == 0`
/// claims nothing, so this probe never consumes an event.
pub fn waiter_owns(evd: &Evd) -> bool {
    matches!(
        evd.dequeue_batch(&mut Vec::new(), 0),
        Err(Error::InvalidState {
            state: Subtype::InvalidStateEvdWaiter,
            ..
        })
    )
}

/// What a waiter thread's `wait` returned.
pub type WaitResult = rdapl::Result<(Event, usize)>;

/// Starts a thread blocked in `evd.wait(timeout, threshold)` and returns
/// once it owns the EVD (failing the test if it does not within [`LIMIT`]).
/// The thread reports the result of its `wait` on the receiver.
pub fn start_waiter(
    evd: &Evd,
    timeout: Option<Duration>,
    threshold: usize,
) -> (JoinHandle<()>, mpsc::Receiver<WaitResult>) {
    let (tx, rx) = mpsc::channel();
    let h = {
        let evd = evd.clone();
        thread::spawn(move || {
            let _ = tx.send(evd.wait(timeout, threshold));
        })
    };
    assert!(
        eventually(LIMIT, || waiter_owns(evd)),
        "the waiter never owned the EVD"
    );
    (h, rx)
}

/// An upcall object from a closure.
pub fn upcall(f: impl Fn(&Evd, Option<Event>, bool) + Send + Sync + 'static) -> Arc<dyn Upcall> {
    Arc::new(f)
}

/// An upcall that does nothing.
pub fn noop_upcall() -> Arc<dyn Upcall> {
    upcall(|_, _, _| {})
}

/// A software-event EVD of `qlen` entries with `up` installed under
/// `policy`, dispatched by a dispatcher of `threads` threads (`None`: the
/// default dispatcher).
pub fn upcall_evd(
    qlen: usize,
    threads: Option<usize>,
    policy: UpcallPolicy,
    up: Arc<dyn Upcall>,
) -> Evd {
    let mut b = Evd::builder(qlen, EvdFlags::SOFTWARE);
    if let Some(n) = threads {
        b = b.dispatch(Dispatcher::new(n));
    }
    b.upcall(policy, up).build().unwrap()
}

/// Posts software event `v`, retrying while the EVD is full; fails the test
/// if it is still full at `end`.
pub fn post_retry(evd: &Evd, v: u64, end: Instant) {
    loop {
        match evd.post_se(v) {
            Ok(()) => return,
            Err(Error::QueueFull) => {
                assert!(
                    Instant::now() < end,
                    "EVD stayed full: the consumer stopped draining"
                );
                thread::yield_now();
            }
            Err(e) => panic!("post_se: {e:?}"),
        }
    }
}

/// Starts a thread that posts each of `values` on `evd` with [`post_retry`]
/// (so it fails if the EVD stays full until `end`); after the `k`-th post
/// (from 0) it calls `pace(k)`.
pub fn spawn_poster(
    evd: &Evd,
    values: impl Iterator<Item = u64> + Send + 'static,
    end: Instant,
    mut pace: impl FnMut(usize) + Send + 'static,
) -> JoinHandle<()> {
    let evd = evd.clone();
    thread::spawn(move || {
        for (k, v) in values.enumerate() {
            post_retry(&evd, v, end);
            pace(k);
        }
    })
}

/// `modify_upcall(Teardown)` on `evd`, failing the test if it does not
/// return within [`LIMIT`].
pub fn teardown_within(evd: &Evd, what: &str) -> rdapl::Result<usize> {
    let evd = evd.clone();
    within(LIMIT, what, move || {
        evd.modify_upcall(UpcallPolicy::Teardown, None, ReEnable::Strict)
    })
}

// ----- event builders -------------------------------------------------------------

/// A successful DTO completion event.
pub fn dto_event(ep: u64, cookie: u64, operation: DtoOp, transferred_length: u64) -> Event {
    Event::Dto(DtoCompletion {
        ep: EpHandle(ep),
        consumer_context: 0,
        cookie,
        status: DtoStatus::Success,
        transferred_length,
        operation,
        rmr_context: 0,
        buf: None,
    })
}

/// A connection event without private data.
pub fn conn_event(kind: ConnectionEventKind, ep: u64) -> Event {
    Event::Connection(ConnectionEvent {
        kind,
        ep: EpHandle(ep),
        consumer_context: 0,
        private_data: None,
    })
}

/// A connection request arrival (no service point, nothing truncated).
pub fn cr_event(conn_qual: u64, cr: u64) -> Event {
    Event::ConnectionRequest(CrArrival {
        sp: None,
        consumer_context: 0,
        conn_qual,
        cr: CrHandle(cr),
        truncated: false,
    })
}

// ----- the loopback provider --------------------------------------------------------

/// The timeout of every wait for an event or a connection.
pub const T: Duration = Duration::from_secs(5);
/// Default completion flags.
pub const D: CompletionFlags = CompletionFlags::DEFAULT;

/// Options that open a loopback IA at `addr`.
pub fn ia_options(addr: &str) -> IaOptions {
    IaOptions {
        params: format!("addr={addr}"),
        ..Default::default()
    }
}

/// The provider under test and what the suite was told of it.
pub(crate) struct UnderTest {
    pub(crate) provider: Arc<dyn rdapl::provider::Provider>,
    pub(crate) in_process: bool,
    pub(crate) ia_params: String,
    pub(crate) quick_rnr: Option<String>,
}

/// The provider under test, set once per process by
/// [`Suite::run`](crate::Suite::run).
pub(crate) static UNDER_TEST: std::sync::OnceLock<UnderTest> = std::sync::OnceLock::new();

/// The provider the cases of this process run on: the one given to
/// [`Suite`](crate::Suite), or (outside a suite run, as in plain `#[test]`s
/// that use these helpers) the built-in loopback; one instance per
/// process, so IAs reach each other. It is wrapped in a fault injector
/// ([`faults`]).
pub fn provider() -> Arc<dyn rdapl::provider::Provider> {
    static P: std::sync::OnceLock<Arc<dyn rdapl::provider::Provider>> = std::sync::OnceLock::new();
    P.get_or_init(|| {
        let inner = match UNDER_TEST.get() {
            Some(u) => u.provider.clone(),
            None => rdapl::builtin().get("loopback").unwrap(),
        };
        FaultInjector::with_faults(inner, faults().clone())
    })
    .clone()
}

/// True when the provider under test keeps both ends of a connection in
/// this process (loopback, pipe; [`Suite::in_process`](crate::Suite::in_process)):
/// what one side did the other knows at once. Across a network (tcp, any
/// other provider) a receiver can place a message whose acknowledgement
/// never reaches the sender before the connection ends, and the sender
/// reports that request flushed.
pub fn in_process() -> bool {
    UNDER_TEST.get().is_none_or(|u| u.in_process)
}

/// The IA parameters given to [`Suite::quick_rnr`](crate::Suite::quick_rnr),
/// if any.
pub fn quick_rnr() -> Option<&'static str> {
    UNDER_TEST.get().and_then(|u| u.quick_rnr.as_deref())
}

/// The faults armed on the tests' endpoints: every IA the tests open goes
/// through a [`FaultInjector`] with these.
pub fn faults() -> &'static Arc<Faults> {
    static F: std::sync::OnceLock<Arc<Faults>> = std::sync::OnceLock::new();
    F.get_or_init(Faults::new)
}

/// Fault injection on a test's endpoint, through [`faults`] (the old
/// `Ep::inject_*` names).
pub trait Inject {
    /// The next request posted fails with `status` and breaks the
    /// connection.
    fn inject_failure(&self, status: DtoStatus);
    /// Requests posted from now on reach the provider `delay` later.
    fn inject_delay(&self, delay: Option<Duration>);
    /// The link fails now: both sides `Broken`.
    fn inject_break(&self);
}

impl Inject for Ep {
    fn inject_failure(&self, status: DtoStatus) {
        faults().fail_next(self, status);
    }
    fn inject_delay(&self, delay: Option<Duration>) {
        faults().delay(self, delay);
    }
    fn inject_break(&self) {
        faults().break_link(self);
    }
}

/// True when the tests run on the loopback provider (tests of what only
/// it does, such as fault injection or its RNR time, skip otherwise).
pub fn on_loopback() -> bool {
    provider().attr().name == "loopback"
}

/// True (after printing why) when a test of what only the loopback
/// provider does must skip on the provider the tests run on.
pub fn skip_unless_loopback(why: &str) -> bool {
    if on_loopback() {
        return false;
    }
    eprintln!("skipped on {}: {why}", provider().attr().name);
    true
}

/// True (after printing why) when a test assumes that a completed Send or
/// RDMA Write was placed at the peer (its bytes readable there, a remote
/// error on the request itself) and the provider completes them earlier
/// ([`rdapl::ProviderAttr::completes_when_placed`]).
pub fn skip_unless_placed() -> bool {
    let a = provider().attr();
    if a.completes_when_placed {
        return false;
    }
    eprintln!(
        "skipped on {}: assumes a completed Send or Write was placed at the peer",
        a.name
    );
    true
}

/// Asserts that `read()` gives `want` after an RDMA Write completed at its
/// initiator: at once when the provider completes on placement, within
/// [`T`] otherwise (its completion only freed the local buffer).
#[track_caller]
pub fn assert_placed(read: impl Fn() -> Vec<u8>, want: &[u8]) {
    if !provider().attr().completes_when_placed {
        eventually(T, || read() == want);
    }
    assert_eq!(read(), want);
}

/// The event of a connect to an address where no IA was ever opened (or
/// one was closed): the loopback knows its addresses (`Unreachable`); over
/// a real network nobody listening there looks the same as nobody
/// listening on the qualifier (`NonPeerRejected`, a TCP reset).
pub fn no_ia_kind(got: ConnectionEventKind) -> bool {
    if on_loopback() {
        got == ConnectionEventKind::Unreachable
    } else {
        matches!(
            got,
            ConnectionEventKind::Unreachable | ConnectionEventKind::NonPeerRejected
        )
    }
}

/// Waits (within [`T`]) until the connection request `cr` is withdrawn by
/// its active side, which a network provider learns from the wire.
pub fn withdrawn(cr: &Cr) -> bool {
    eventually(T, || cr.state() == rdapl::CrState::Cancelled)
}

/// An IA at `addr` of the tests' provider ([`provider`]), with the suite's
/// [`ia_params`](crate::Suite::ia_params).
pub fn open(addr: &str) -> Ia {
    open_with(addr, "")
}

/// [`open`] with `extra` parameters after the suite's.
pub fn open_with(addr: &str, extra: &str) -> Ia {
    let suite = UNDER_TEST.get().map_or("", |u| u.ia_params.as_str());
    let addr = format!("addr={addr}");
    let words = [addr.as_str(), suite, extra];
    let opts = IaOptions {
        params: words
            .iter()
            .filter(|w| !w.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join(" "),
        ..Default::default()
    };
    Ia::open_provider(provider(), opts).unwrap()
}

/// A loopback IA at `addr` of the fabric `lb` (a test with settings of its
/// own, such as the RNR time, makes its own fabric).
pub fn open_on(lb: &Arc<rdapl::Loopback>, addr: &str) -> Ia {
    let p = FaultInjector::with_faults(lb.clone(), faults().clone());
    Ia::open_provider(p, ia_options(addr)).unwrap()
}

/// The IP address `addr`.
pub fn ip(addr: &str) -> IpAddr {
    addr.parse().unwrap()
}

/// The next event on `evd`, waiting at most [`T`].
pub fn next(evd: &Evd) -> Event {
    evd.wait(Some(T), 1).expect("an event within the timeout").0
}

/// The next event on `evd`, which must be a DTO completion.
pub fn next_dto(evd: &Evd) -> DtoCompletion {
    match next(evd) {
        Event::Dto(d) => d,
        e => panic!("expected a DTO completion, got {e:?}"),
    }
}

/// The next event on `evd`, which must be a connection event.
pub fn conn_ev(evd: &Evd) -> ConnectionEvent {
    match next(evd) {
        Event::Connection(c) => c,
        e => panic!("expected a connection event, got {e:?}"),
    }
}

/// The kind of the next connection event on `evd`.
pub fn conn_kind(evd: &Evd) -> ConnectionEventKind {
    conn_ev(evd).kind
}

/// The next event on `evd`, which must be a connection request.
pub fn cr_arrival(evd: &Evd) -> CrArrival {
    match next(evd) {
        Event::ConnectionRequest(a) => a,
        e => panic!("expected a connection request, got {e:?}"),
    }
}

/// The connection request that arrives next on `cr_evd` of `ia`.
pub fn next_cr(ia: &Ia, cr_evd: &Evd) -> Cr {
    ia.cr(cr_arrival(cr_evd).cr).unwrap()
}

/// Asserts that `evd` holds no event.
pub fn empty(evd: &Evd) {
    assert_eq!(evd.dequeue().unwrap(), None, "no further event expected");
}

/// Expects `Flushed` completions with these cookies, in order, and nothing else.
pub fn flushed(evd: &Evd, cookies: &[u64]) {
    for &k in cookies {
        let d = next_dto(evd);
        assert_eq!((d.cookie, d.status), (k, DtoStatus::Flushed), "{d:?}");
    }
    empty(evd);
}

/// Asserts that `r` is `InvalidState` with the subtype `want`.
pub fn state_err<T: std::fmt::Debug>(r: Result<T>, want: Subtype) {
    match r {
        Err(Error::InvalidState { state, .. }) if state == want => {}
        r => panic!("expected InvalidState({want:?}), got {r:?}"),
    }
}

/// Asserts that `r` is `InvalidHandle` with the subtype `want`.
pub fn handle_err<T: std::fmt::Debug>(r: Result<T>, want: Subtype) {
    match r {
        Err(Error::InvalidHandle(sub)) if sub == want => {}
        r => panic!("expected InvalidHandle({want:?}), got {r:?}"),
    }
}

/// Asserts that `r` is `InsufficientResources` of the resource `want`.
pub fn resource_err<T: std::fmt::Debug>(r: Result<T>, want: Subtype) {
    match r {
        Err(Error::InsufficientResources { resource, .. }) if resource == want => {}
        r => panic!("expected InsufficientResources({want:?}), got {r:?}"),
    }
}

/// A remote triplet: `len` bytes at `addr` through the key `ctx`.
pub fn rt(ctx: u32, addr: u64, len: u64) -> RmrTriplet {
    RmrTriplet {
        rmr_context: ctx,
        target_address: addr,
        segment_length: len,
    }
}

/// One side: an IA, a PZ, one EVD for every stream (256 entries), and an
/// endpoint on it.
pub struct Side {
    pub ia: Ia,
    pub pz: Pz,
    pub evd: Evd,
    pub ep: Ep,
}

/// A [`Side`] at `addr`.
pub fn side(addr: &str) -> Side {
    let ia = open(addr);
    let pz = ia.pz_create().unwrap();
    let evd = ia
        .evd_create(256, EvdFlags::DTO | EvdFlags::CONNECTION | EvdFlags::CR)
        .unwrap();
    let ep = ia
        .ep_create(&pz, Some(&evd), Some(&evd), Some(&evd), None)
        .unwrap();
    Side { ia, pz, evd, ep }
}

/// One side: an IA, a PZ, one EVD per stream and an endpoint on them.
pub struct Node {
    pub ia: Ia,
    pub pz: Pz,
    pub req: Evd,
    pub rcv: Evd,
    pub conn: Evd,
    pub cr: Evd,
    pub ep: Ep,
}

impl Node {
    /// A node at `addr` with 64-entry DTO EVDs and default endpoint attributes.
    pub fn new(addr: &str) -> Node {
        Node::with(addr, None, 64, 64)
    }

    /// A node at `addr` with these endpoint attributes and DTO EVD lengths.
    pub fn with(addr: &str, attr: Option<EpAttr>, req_qlen: usize, rcv_qlen: usize) -> Node {
        Node::of(open(addr), attr, req_qlen, rcv_qlen)
    }

    /// [`Node::with`] on the IA `ia`.
    pub fn of(ia: Ia, attr: Option<EpAttr>, req_qlen: usize, rcv_qlen: usize) -> Node {
        let pz = ia.pz_create().unwrap();
        let req = ia.evd_create(req_qlen, EvdFlags::DTO).unwrap();
        let rcv = ia.evd_create(rcv_qlen, EvdFlags::DTO).unwrap();
        let conn = ia.evd_create(16, EvdFlags::CONNECTION).unwrap();
        let cr = ia.evd_create(16, EvdFlags::CR).unwrap();
        let ep = ia
            .ep_create(&pz, Some(&rcv), Some(&req), Some(&conn), attr)
            .unwrap();
        Node {
            ia,
            pz,
            req,
            rcv,
            conn,
            cr,
            ep,
        }
    }

    /// Another endpoint on this node's EVDs.
    pub fn ep2(&self) -> Ep {
        self.ia
            .ep_create(
                &self.pz,
                Some(&self.rcv),
                Some(&self.req),
                Some(&self.conn),
                None,
            )
            .unwrap()
    }

    /// A zeroed LMR of `len` bytes with every right.
    pub fn buf(&self, len: usize) -> Lmr {
        self.pz
            .lmr_create(Region::zeroed(len), MemPriv::ALL)
            .unwrap()
    }

    /// An LMR holding `data`, with every right.
    pub fn lmr(&self, data: Vec<u8>) -> Lmr {
        self.pz.lmr_create_from(data, MemPriv::ALL).unwrap()
    }

    /// Posts a receive into `len` bytes at `off` of `lmr` (default flags).
    pub fn recv(&self, lmr: &Lmr, off: u64, len: u64, cookie: u64) {
        self.ep
            .post_recv(&[lmr.triplet(off, len).unwrap()], cookie, D)
            .unwrap();
    }

    /// Posts a send of `len` bytes at `off` of `lmr` (default flags).
    pub fn send(&self, lmr: &Lmr, off: u64, len: u64, cookie: u64) {
        self.ep
            .post_send(&[lmr.triplet(off, len).unwrap()], cookie, D)
            .unwrap();
    }
}

/// `c.ep` connects to `s` on `qual` and `s.ep` accepts; both sides see
/// `Established`.
pub fn connect_nodes(c: &Node, s: &Node, qual: u64) {
    c.ep.connect(s.ia.address(), qual, Some(T), b"").unwrap();
    next_cr(&s.ia, &s.cr).accept(&s.ep, b"").unwrap();
    assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Established);
    assert_eq!(conn_kind(&c.conn), ConnectionEventKind::Established);
}

/// [`connect_nodes`], then both endpoints are `Connected`.
pub fn establish(c: &Node, s: &Node, qual: u64) {
    connect_nodes(c, s, qual);
    assert_eq!(c.ep.state(), EpState::Connected);
    assert_eq!(s.ep.state(), EpState::Connected);
}

/// A client (`c`) and a server (`s`) listening on `qual`.
pub struct Pair {
    pub c: Node,
    pub s: Node,
    pub psp: Psp,
    pub qual: u64,
}

/// The client and server nodes of a [`pair`] and the server's PSP on
/// `qual`, not connected yet.
pub fn listening(client: &str, server: &str, qual: u64) -> (Node, Node, Psp) {
    let Pair { c, s, psp, .. } = Pair::new(Node::new(client), Node::new(server), qual);
    (c, s, psp)
}

/// A client at `client` connected to a server at `server` on `qual`, with
/// 64-entry DTO EVDs and default endpoint attributes.
pub fn pair(client: &str, server: &str, qual: u64) -> Pair {
    pair_with(client, server, qual, None, 64, 64)
}

/// [`pair`] with these endpoint attributes and DTO EVD lengths (see
/// [`Node::with`]).
pub fn pair_with(
    client: &str,
    server: &str,
    qual: u64,
    attr: Option<EpAttr>,
    req_qlen: usize,
    rcv_qlen: usize,
) -> Pair {
    let p = Pair::new(
        Node::with(client, attr, req_qlen, rcv_qlen),
        Node::with(server, attr, req_qlen, rcv_qlen),
        qual,
    );
    p.connect();
    p
}

/// [`pair_with`] on the loopback fabric `lb`.
pub fn pair_on(
    lb: &Arc<rdapl::Loopback>,
    (client, server, qual): (&str, &str, u64),
    attr: Option<EpAttr>,
    req_qlen: usize,
    rcv_qlen: usize,
) -> Pair {
    let p = Pair::new(
        Node::of(open_on(lb, client), attr, req_qlen, rcv_qlen),
        Node::of(open_on(lb, server), attr, req_qlen, rcv_qlen),
        qual,
    );
    p.connect();
    p
}

impl Pair {
    /// Client `c` and server `s`, listening on `qual`; not connected yet.
    pub fn new(c: Node, s: Node, qual: u64) -> Pair {
        let psp = s.ia.psp_create(qual, &s.cr).unwrap();
        Pair { c, s, psp, qual }
    }

    pub fn connect(&self) {
        connect_nodes(&self.c, &self.s, self.qual);
    }

    /// Both sides saw the connection end with `kind`.
    pub fn expect_end(&self, kind: ConnectionEventKind) {
        assert_eq!(conn_kind(&self.c.conn), kind);
        assert_eq!(conn_kind(&self.s.conn), kind);
        assert_eq!(self.c.ep.state(), EpState::Disconnected);
        assert_eq!(self.s.ep.state(), EpState::Disconnected);
    }

    pub fn reconnect(&self) {
        self.c.ep.reset().unwrap();
        self.s.ep.reset().unwrap();
        self.connect();
    }
}
