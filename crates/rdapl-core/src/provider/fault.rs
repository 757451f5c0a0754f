//! Fault injection: a wrapper around any provider (smoltcp's
//! `FaultInjector` around a device), not methods of every endpoint.
//!
//! [`FaultInjector::new`] wraps a provider; IAs opened from the wrapper
//! work as the wrapped provider's do, and its [`Faults`] arm faults per
//! endpoint:
//!
//! * [`Faults::fail_next`]: the next request posted on the endpoint (a
//!   send, an RDMA transfer, a memory operation) is not handed to the
//!   provider. The connection breaks instead
//!   ([`EpOps::break_connection`]: both sides `Broken`, everything
//!   outstanding flushed), and once the endpoint's end was reported that
//!   request completes with the armed status: it moved nothing.
//! * [`Faults::delay`]: requests posted from then on reach the provider
//!   that much later (`None` ends it; those already held still wait their
//!   time). Held requests keep their order, and a request posted while
//!   others are held waits behind them. A request still held when the
//!   connection ends completes `Flushed`, after everything the provider
//!   flushed (within [`SWEEP`] of the end; before `Ep::free` returns when
//!   the endpoint is freed).
//! * [`Faults::break_link`]: the link fails now
//!   ([`EpOps::break_connection`] of the endpoint's provider; works on
//!   any IA, wrapped or not).
//!
//! # Guarantees
//!
//! * A wrapped provider sees every other call unchanged.
//! * Completions stay in post order per queue: a failed or flushed held
//!   request completes only after the endpoint's end was reported (the
//!   provider completes what it holds before that), and it was posted
//!   after all of those.
//! * Each armed failure fires once.
//!
//! The wrapper's thread (one per [`Faults`], started on first use, ended
//! when the `Faults` is dropped) hands held requests over at their time.

use crate::ep::{Ep, EpInner, EpState, Wr};
use crate::event::{DtoStatus, EpHandle, PzHandle, SrqHandle};
use crate::ia::{IaAttr, ProviderAttr};
use crate::provider::{
    EpInfo, EpLock, EpOps, ListenerOps, NewWr, Provider, PzOps, SpInner, SrqOps, Transport,
};
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How often held requests of an ended connection are looked for.
pub const SWEEP: Duration = Duration::from_millis(10);

/// How long a failing request waits for its endpoint's end to be reported
/// before it completes anyway.
const END_WAIT: Duration = Duration::from_secs(5);

/// The faults of one endpoint.
#[derive(Default)]
struct EpFaults {
    fail_next: Option<DtoStatus>,
    delay: Option<Duration>,
    /// Requests held back, in post order, with the time each is due
    /// (`None`: never, until the connection ends).
    held: VecDeque<(Option<Instant>, Wr)>,
    ep: Weak<EpInner>,
}

#[derive(Default)]
struct State {
    eps: HashMap<EpHandle, EpFaults>,
    /// The thread is running.
    running: bool,
    /// The `Faults` is gone: the thread ends.
    stopped: bool,
}

/// The faults armed on endpoints, shared by the [`FaultInjector`]s made
/// with it.
pub struct Faults {
    st: Mutex<State>,
    cv: Condvar,
}

impl Faults {
    /// No fault armed.
    pub fn new() -> Arc<Faults> {
        Arc::new(Faults {
            st: Mutex::new(State::default()),
            cv: Condvar::new(),
        })
    }

    /// The next request posted on `ep` fails with `status` and breaks the
    /// connection (module docs). Needs an IA opened from a
    /// [`FaultInjector`] with these faults.
    pub fn fail_next(&self, ep: &Ep, status: DtoStatus) {
        let mut st = self.st.lock();
        let f = st.eps.entry(ep.inner.handle()).or_default();
        f.fail_next = Some(status);
        f.ep = Arc::downgrade(&ep.inner);
    }

    /// Requests posted on `ep` from now on reach the provider `delay`
    /// later; `None` ends it (module docs). Needs an IA opened from a
    /// [`FaultInjector`] with these faults.
    pub fn delay(&self, ep: &Ep, delay: Option<Duration>) {
        let mut st = self.st.lock();
        let f = st.eps.entry(ep.inner.handle()).or_default();
        f.delay = delay;
        f.ep = Arc::downgrade(&ep.inner);
    }

    /// The link of `ep` fails now: its provider breaks the connection,
    /// both sides `Broken`, everything outstanding flushed. Nothing if it
    /// is not connected.
    pub fn break_link(&self, ep: &Ep) {
        ep.inner.ops.break_connection(&ep.inner);
    }

    /// Whether `ep` has requests held back (a diagnostic).
    pub fn holds(&self, ep: &Ep) -> bool {
        self.st
            .lock()
            .eps
            .get(&ep.inner.handle())
            .is_some_and(|f| !f.held.is_empty())
    }

    fn start(self: &Arc<Faults>, st: &mut State) {
        if st.running {
            return;
        }
        st.running = true;
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("rdapl-faults".into())
            .spawn(move || run(weak));
        if spawned.is_err() {
            st.running = false;
        }
    }
}

impl Drop for Faults {
    fn drop(&mut self) {
        self.st.get_mut().stopped = true;
        self.cv.notify_all();
    }
}

/// Waits (at most [`END_WAIT`]) until `ep`'s end was reported.
fn wait_ended(ep: &EpInner) {
    let until = Instant::now() + END_WAIT;
    while Instant::now() < until && !ended(ep) {
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Whether `ep`'s connection has ended (its end reported to the core).
fn ended(ep: &EpInner) -> bool {
    matches!(
        ep.lock().state(),
        EpState::Disconnected | EpState::Unconnected
    )
}

/// The thread: hands held requests to the provider when due, flushes
/// those of ended connections. (Lock order: an endpoint, then the faults;
/// the thread never holds the faults while it locks an endpoint.)
fn run(faults: Weak<Faults>) {
    loop {
        let Some(f) = faults.upgrade() else {
            return;
        };
        // The endpoints holding requests.
        let eps: Vec<Arc<EpInner>> = {
            let mut st = f.st.lock();
            if st.stopped {
                return;
            }
            for e in st.eps.values_mut() {
                if e.ep.strong_count() == 0 {
                    e.held.clear();
                }
            }
            st.eps.retain(|_, e| e.ep.strong_count() > 0);
            st.eps
                .values()
                .filter(|e| !e.held.is_empty())
                .filter_map(|e| e.ep.upgrade())
                .collect()
        };
        // Their states, each endpoint's lock alone.
        let gone: Vec<bool> = eps.iter().map(|ep| ended(ep)).collect();
        // What is due, under the faults' lock.
        let now = Instant::now();
        let mut work: Vec<(Arc<EpInner>, Vec<Wr>, bool)> = Vec::new();
        {
            let mut st = f.st.lock();
            for (ep, gone) in eps.into_iter().zip(gone) {
                let Some(e) = st.eps.get_mut(&ep.handle()) else {
                    continue;
                };
                if gone {
                    let all = e.held.drain(..).map(|(_, w)| w).collect();
                    work.push((ep, all, true));
                    continue;
                }
                let mut ready = Vec::new();
                while let Some((Some(t), _)) = e.held.front() {
                    if *t > now {
                        break;
                    }
                    ready.push(e.held.pop_front().expect("front").1);
                }
                if !ready.is_empty() {
                    work.push((ep, ready, false));
                }
            }
        }
        let idle = work.is_empty();
        for (ep, wrs, gone) in work {
            if gone {
                for w in wrs {
                    ep.complete(w, DtoStatus::Flushed, 0);
                }
                continue;
            }
            let mut core = ep.lock();
            if core.state() != EpState::Connected {
                // Ending meanwhile: back in front, flushed once it ended.
                drop(core);
                let mut st = f.st.lock();
                let e = st.eps.entry(ep.handle()).or_default();
                e.ep = Arc::downgrade(&ep);
                for w in wrs.into_iter().rev() {
                    e.held.push_front((None, w));
                }
                continue;
            }
            for w in wrs {
                core.push_send(w);
            }
            drop(core);
            // The endpoint's table is the wrapper; it passes the kick on.
            ep.ops.kick(&ep, false);
        }
        if idle {
            // Sleep until the next is due (at most a sweep), or stop when
            // nothing is held: decided under the lock that posts take.
            let mut st = f.st.lock();
            if st.stopped {
                return;
            }
            let mut next: Option<Instant> = None;
            for e in st.eps.values() {
                if let Some((t, _)) = e.held.front() {
                    let t = t.map_or(now + SWEEP, |t| t.min(now + SWEEP));
                    next = Some(next.map_or(t, |n: Instant| n.min(t)));
                }
            }
            match next {
                Some(t) => {
                    f.cv.wait_until(&mut st, t);
                }
                None => {
                    st.running = false;
                    return;
                }
            }
        }
    }
}

/// A provider wrapped for fault injection (module docs).
pub struct FaultInjector {
    inner: Arc<dyn Provider>,
    faults: Arc<Faults>,
}

impl FaultInjector {
    /// Wraps `inner`, with faults of its own.
    pub fn new(inner: Arc<dyn Provider>) -> Arc<FaultInjector> {
        FaultInjector::with_faults(inner, Faults::new())
    }

    /// Wraps `inner`, arming `faults` (shared with other wrappers).
    pub fn with_faults(inner: Arc<dyn Provider>, faults: Arc<Faults>) -> Arc<FaultInjector> {
        Arc::new(FaultInjector { inner, faults })
    }

    /// The faults this wrapper carries out.
    pub fn faults(&self) -> &Arc<Faults> {
        &self.faults
    }

    /// The wrapped provider.
    pub fn inner(&self) -> &Arc<dyn Provider> {
        &self.inner
    }
}

impl Provider for FaultInjector {
    fn attr(&self) -> ProviderAttr {
        self.inner.attr()
    }

    fn ia_attr(&self, address: IpAddr) -> IaAttr {
        self.inner.ia_attr(address)
    }

    fn open(&self, address: Option<IpAddr>, params: &str) -> crate::Result<Arc<dyn Transport>> {
        Ok(Arc::new(FaultTransport {
            inner: self.inner.open(address, params)?,
            faults: self.faults.clone(),
        }))
    }
}

/// One IA's transport, wrapped: every table it makes passes through, but
/// an endpoint's, which is wrapped too.
struct FaultTransport {
    inner: Arc<dyn Transport>,
    faults: Arc<Faults>,
}

/// One endpoint's table, wrapped.
struct FaultEp {
    inner: Box<dyn EpOps>,
    faults: Arc<Faults>,
}

impl FaultEp {
    /// Fails `wr` as [`Faults::fail_next`] says: breaks the connection,
    /// waits for the end to be reported, completes it with `status`.
    fn fail(&self, ep: &Arc<EpInner>, wr: Wr, status: DtoStatus) {
        self.inner.break_connection(ep);
        wait_ended(ep);
        ep.complete(wr, status, 0);
    }

    /// Flushes what is held for `ep`, once its end was reported (a freed
    /// endpoint's requests all complete before its free returns).
    fn flush_held(&self, ep: &Arc<EpInner>) {
        let holds = self
            .faults
            .st
            .lock()
            .eps
            .get(&ep.handle())
            .is_some_and(|f| !f.held.is_empty());
        if !holds {
            return;
        }
        wait_ended(ep);
        let held: Vec<Wr> = match self.faults.st.lock().eps.get_mut(&ep.handle()) {
            Some(f) => f.held.drain(..).map(|(_, w)| w).collect(),
            None => Vec::new(),
        };
        for w in held {
            ep.complete(w, DtoStatus::Flushed, 0);
        }
    }
}

impl Transport for FaultTransport {
    fn address(&self) -> IpAddr {
        self.inner.address()
    }
    fn ep_create(&self, ep: &EpInfo<'_>) -> crate::Result<Box<dyn EpOps>> {
        Ok(Box::new(FaultEp {
            inner: self.inner.ep_create(ep)?,
            faults: self.faults.clone(),
        }))
    }
    fn listen(&self, sp: &Arc<SpInner>) -> crate::Result<Box<dyn ListenerOps>> {
        self.inner.listen(sp)
    }
    fn pz_create(&self, pz: PzHandle) -> crate::Result<Box<dyn PzOps>> {
        self.inner.pz_create(pz)
    }
    fn srq_create(&self, srq: SrqHandle, pz: PzHandle) -> crate::Result<Box<dyn SrqOps>> {
        self.inner.srq_create(srq, pz)
    }
    fn close(&self) {
        self.inner.close();
        self.faults.sweep_soon();
    }
    fn provider_attr(&self, attr: ProviderAttr) -> ProviderAttr {
        self.inner.provider_attr(attr)
    }
}

impl EpOps for FaultEp {
    fn connect(
        &self,
        ep: &Arc<EpInner>,
        attempt: crate::ep::Attempt,
        remote: IpAddr,
        conn_qual: u64,
        private_data: Vec<u8>,
        timeout: Option<Duration>,
    ) -> crate::Result<()> {
        self.inner
            .connect(ep, attempt, remote, conn_qual, private_data, timeout)
    }
    fn disconnect(&self, ep: &Arc<EpInner>, graceful: bool) {
        self.inner.disconnect(ep, graceful);
        self.faults.sweep_soon();
    }
    fn connect_cancel(&self, ep: &Arc<EpInner>) {
        self.inner.connect_cancel(ep)
    }
    fn destroy(&self, ep: &Arc<EpInner>) {
        self.inner.destroy(ep);
        self.flush_held(ep);
    }
    fn break_connection(&self, ep: &Arc<EpInner>) {
        self.inner.break_connection(ep);
        self.faults.sweep_soon();
    }
    fn kick(&self, ep: &Arc<EpInner>, recv: bool) {
        self.inner.kick(ep, recv)
    }
    fn submit(&self, ep: &Arc<EpInner>, core: EpLock<'_>, wr: NewWr<'_>) {
        self.submit_as(ep, core, wr, false);
    }
    fn submit_more(&self, ep: &Arc<EpInner>, core: EpLock<'_>, wr: NewWr<'_>) {
        self.submit_as(ep, core, wr, true);
    }
}

impl FaultEp {
    /// A request, failed or held if a fault says so, else the wrapped
    /// provider's (`more`: a batch's request with more to follow).
    fn submit_as(&self, ep: &Arc<EpInner>, core: EpLock<'_>, wr: NewWr<'_>, more: bool) {
        let pass = |core, wr| {
            if more {
                self.inner.submit_more(ep, core, wr)
            } else {
                self.inner.submit(ep, core, wr)
            }
        };
        // (Lock order: the endpoint, then the faults.)
        let mut st = self.faults.st.lock();
        let Some(f) = st.eps.get_mut(&ep.handle()) else {
            drop(st);
            return pass(core, wr);
        };
        if let Some(status) = f.fail_next.take() {
            drop(st);
            let wr = wr.queued();
            drop(core);
            return self.fail(ep, wr, status);
        }
        if f.delay.is_none() && f.held.is_empty() {
            drop(st);
            return pass(core, wr);
        }
        let due = match f.delay {
            Some(d) => Instant::now().checked_add(d),
            // Behind held requests: as soon as the last of them.
            None => f.held.back().and_then(|(t, _)| *t),
        };
        f.ep = Arc::downgrade(ep);
        f.held.push_back((due, wr.queued()));
        self.faults.start(&mut st);
        self.faults.cv.notify_all();
        drop(st);
        drop(core);
    }
}

impl Faults {
    /// A connection may have ended: held requests get flushed now rather
    /// than at their time.
    fn sweep_soon(self: &Arc<Faults>) {
        let mut st = self.st.lock();
        if st.eps.values().any(|e| !e.held.is_empty()) {
            self.start(&mut st);
            self.cv.notify_all();
        }
    }
}
