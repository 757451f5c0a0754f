//! Benchmark 2: wakeup latency, measured as a ping-pong round trip between
//! two threads through two queues (ping and pong).
//!
//! | method | how a side learns of the next message | peer of its ratio |
//! |---|---|---|
//! | `evd-upcall` (a) | each EVD has its own one-thread [`Dispatcher`]; a `SingleInstance` upcall on the ping EVD posts the reply to the pong EVD, whose upcall records the round trip and posts the next ping | `crossbeam-blocking` |
//! | `evd-wait` (b) | `wait(None, 1)` on the EVD | `crossbeam-blocking` |
//! | `evd-poll` (c) | busy polling with `dequeue` | `crossbeam-poll` |
//! | `crossbeam-blocking` | `crossbeam_channel` `recv()` | – |
//! | `crossbeam-poll` | busy polling with `try_recv` | – |
//!
//! Each iteration records its own round-trip time (first `warmup_iters`
//! dropped); the median and p99 are computed per repetition, and the ratio
//! EVD/peer is taken within the repetition (lower is better).
//!
//! Every run is bounded: loops stop at `limit` (reported as `capped`, with
//! the samples so far), and a [`Watchdog`] posts a stop marker to both
//! queues if a blocking side never wakes (reported as `failed`: that would
//! be a lost wakeup).

use crate::stats::{Summary, percentile_sorted, rep_ratios, sorted_pools};
use crate::util::{Watchdog, as_nanos};
use rdapl::{Dispatch, Dispatcher, Evd, EvdFlags, Event, ReEnable, UpcallPolicy};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// Parameters of the latency benchmark.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Params {
    /// Round trips dropped at the start of each run.
    pub warmup_iters: usize,
    /// Round trips recorded per run.
    pub iters: usize,
    /// Wall-clock cap of one run (then it stops with fewer samples).
    pub limit: Duration,
    /// Extra time after `limit` before the watchdog declares a run stuck.
    pub grace: Duration,
    /// Capacity of each queue.
    pub capacity: usize,
}

/// A ping-pong method.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// (a) upcalls post the reply.
    EvdUpcall,
    /// (b) blocking `wait(None, 1)`.
    EvdWait,
    /// (c) busy polling `dequeue`.
    EvdPoll,
    /// crossbeam-channel, blocking `recv`.
    CrossbeamBlocking,
    /// crossbeam-channel, busy polling `try_recv`.
    CrossbeamPoll,
}

impl Method {
    /// Every method, in report order.
    pub const ALL: [Method; 5] = [
        Method::EvdUpcall,
        Method::EvdWait,
        Method::EvdPoll,
        Method::CrossbeamBlocking,
        Method::CrossbeamPoll,
    ];

    /// Short name used in row ids.
    pub fn name(self) -> &'static str {
        match self {
            Method::EvdUpcall => "evd-upcall",
            Method::EvdWait => "evd-wait",
            Method::EvdPoll => "evd-poll",
            Method::CrossbeamBlocking => "crossbeam-blocking",
            Method::CrossbeamPoll => "crossbeam-poll",
        }
    }

    /// The peer this method's ratio is taken against.
    pub fn peer(self) -> Method {
        match self {
            Method::EvdUpcall | Method::EvdWait | Method::CrossbeamBlocking => {
                Method::CrossbeamBlocking
            }
            Method::EvdPoll | Method::CrossbeamPoll => Method::CrossbeamPoll,
        }
    }
}

/// One row of the report.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    /// `latency/<method>`.
    pub id: String,
    /// The method.
    pub method: Method,
    /// The peer of the ratios.
    pub peer: Method,
    /// Median round trip, ns (absolute, context only).
    pub rtt_median_ns: Summary,
    /// 99th percentile round trip, ns (absolute, context only).
    pub rtt_p99_ns: Summary,
    /// Median round trip / the peer's, per repetition (lower is better).
    pub ratio_median_vs_peer: Summary,
    /// p99 round trip / the peer's, per repetition (lower is better).
    pub ratio_p99_vs_peer: Summary,
    /// Samples recorded per repetition.
    pub samples: Vec<usize>,
    /// Repetitions that hit the time cap before `iters` samples.
    pub capped_reps: usize,
    /// Repetitions that got stuck (watchdog fired) or received a wrong value.
    pub failed_reps: usize,
}

/// The result of one run.
#[derive(Clone, Debug, Default)]
pub struct Run {
    /// Round-trip times, ns, in order.
    pub samples: Vec<u64>,
    /// The time cap stopped the run.
    pub capped: bool,
    /// The watchdog fired or a wrong value came back.
    pub failed: bool,
}

const STOP: u64 = u64::MAX;

/// One direction of a ping-pong: both ends of one queue.
trait Link: Clone + Send + 'static {
    fn send(&self, v: u64);
    /// Receives the next value; `None` if the link broke or, for polling
    /// forms, `deadline` passed.
    fn recv(&self, deadline: Instant) -> Option<u64>;
}

fn software(ev: Event) -> Option<u64> {
    match ev {
        Event::Software(v) => Some(v),
        _ => None,
    }
}

#[derive(Clone)]
struct EvdWait(Evd);
impl Link for EvdWait {
    fn send(&self, v: u64) {
        let _ = self.0.post_se(v);
    }
    fn recv(&self, _deadline: Instant) -> Option<u64> {
        self.0.wait(None, 1).ok().and_then(|(e, _)| software(e))
    }
}

/// Busy polling with the suite's spin-then-yield policy
/// ([`crate::util::spin_poll`]).
fn spin_recv(deadline: Instant, poll: impl FnMut() -> Result<Option<u64>, ()>) -> Option<u64> {
    crate::util::spin_poll(deadline, poll)
}

#[derive(Clone)]
struct EvdPoll(Evd);
impl Link for EvdPoll {
    fn send(&self, v: u64) {
        let _ = self.0.post_se(v);
    }
    fn recv(&self, deadline: Instant) -> Option<u64> {
        spin_recv(deadline, || match self.0.dequeue() {
            Ok(Some(e)) => software(e).map(Some).ok_or(()),
            Ok(None) => Ok(None),
            Err(_) => Err(()),
        })
    }
}

#[derive(Clone)]
struct CbBlocking(
    crossbeam_channel::Sender<u64>,
    crossbeam_channel::Receiver<u64>,
);
impl Link for CbBlocking {
    fn send(&self, v: u64) {
        let _ = self.0.send(v);
    }
    fn recv(&self, _deadline: Instant) -> Option<u64> {
        self.1.recv().ok()
    }
}

#[derive(Clone)]
struct CbPoll(
    crossbeam_channel::Sender<u64>,
    crossbeam_channel::Receiver<u64>,
);
impl Link for CbPoll {
    fn send(&self, v: u64) {
        let _ = self.0.send(v);
    }
    fn recv(&self, deadline: Instant) -> Option<u64> {
        spin_recv(deadline, || match self.1.try_recv() {
            Ok(v) => Ok(Some(v)),
            Err(crossbeam_channel::TryRecvError::Empty) => Ok(None),
            Err(crossbeam_channel::TryRecvError::Disconnected) => Err(()),
        })
    }
}

/// Thread-to-thread ping-pong over two links.
fn pingpong<L: Link>(ping: L, pong: L, p: &Params) -> Run {
    let start = Instant::now();
    let deadline = start + p.limit;
    let hard = deadline + p.grace;
    let echo = {
        let (ping, pong) = (ping.clone(), pong.clone());
        std::thread::Builder::new()
            .name("lat-echo".into())
            .spawn(move || {
                while let Some(v) = ping.recv(hard) {
                    if v == STOP {
                        break;
                    }
                    pong.send(v);
                }
            })
            .expect("spawning the echo thread")
    };
    let watchdog = {
        let (ping, pong) = (ping.clone(), pong.clone());
        Watchdog::arm(p.limit + p.grace, move || {
            pong.send(STOP);
            ping.send(STOP);
        })
    };
    let total = p.warmup_iters + p.iters;
    let mut run = Run {
        samples: Vec::with_capacity(p.iters),
        ..Run::default()
    };
    for i in 0..total as u64 {
        if Instant::now() > deadline {
            run.capped = true;
            break;
        }
        let t0 = Instant::now();
        ping.send(i);
        match pong.recv(hard) {
            Some(v) if v == i => {}
            _ => {
                run.failed = true;
                break;
            }
        }
        let dt = as_nanos(t0.elapsed());
        if i as usize >= p.warmup_iters {
            run.samples.push(dt);
        }
    }
    run.failed |= watchdog.disarm();
    ping.send(STOP);
    let _ = echo.join();
    run
}

struct UpcallState {
    t0: Instant,
    i: u64,
    samples: Vec<u64>,
    done: Option<mpsc::Sender<()>>,
}

/// (a): two EVDs, each with its own one-thread dispatcher; the upcalls play
/// ping-pong and the pong upcall records each round trip.
fn upcall_pingpong(p: &Params) -> Run {
    let da: Arc<dyn Dispatch> = Dispatcher::new(1);
    let db: Arc<dyn Dispatch> = Dispatcher::new(1);
    let a = Evd::builder(p.capacity, EvdFlags::SOFTWARE)
        .dispatch(da)
        .build()
        .expect("creating the ping EVD");
    let b = Evd::builder(p.capacity, EvdFlags::SOFTWARE)
        .dispatch(db)
        .build()
        .expect("creating the pong EVD");
    let deadline = Instant::now() + p.limit;
    let total = (p.warmup_iters + p.iters) as u64;
    let warmup = p.warmup_iters as u64;
    let (done_tx, done_rx) = mpsc::channel();
    let state = Arc::new(Mutex::new(UpcallState {
        t0: Instant::now(),
        i: 0,
        samples: Vec::with_capacity(p.iters),
        done: Some(done_tx),
    }));
    let stop = Arc::new(AtomicBool::new(false));
    let capped = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(AtomicBool::new(false));
    {
        let b2 = b.clone();
        a.modify_upcall(
            UpcallPolicy::SingleInstance,
            Some(Arc::new(move |_: &Evd, ev: Option<Event>, _more: bool| {
                if let Some(v) = ev.and_then(software) {
                    let _ = b2.post_se(v);
                }
            })),
            ReEnable::OnNew,
        )
        .expect("enabling the ping upcall");
    }
    {
        let (a2, state, stop, capped, failed) = (
            a.clone(),
            state.clone(),
            stop.clone(),
            capped.clone(),
            failed.clone(),
        );
        b.modify_upcall(
            UpcallPolicy::SingleInstance,
            Some(Arc::new(move |_: &Evd, ev: Option<Event>, _more: bool| {
                let now = Instant::now();
                let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
                let got = ev.and_then(software);
                if got != Some(st.i) {
                    failed.store(true, Ordering::Relaxed);
                    st.done.take().map(|d| d.send(()));
                    return;
                }
                let dt = as_nanos(now - st.t0);
                if st.i >= warmup {
                    st.samples.push(dt);
                }
                st.i += 1;
                let out_of_time = now > deadline;
                if st.i >= total || out_of_time || stop.load(Ordering::Relaxed) {
                    if out_of_time && st.i < total {
                        capped.store(true, Ordering::Relaxed);
                    }
                    st.done.take().map(|d| d.send(()));
                    return;
                }
                let next = st.i;
                st.t0 = Instant::now();
                drop(st);
                let _ = a2.post_se(next);
            })),
            ReEnable::OnNew,
        )
        .expect("enabling the pong upcall");
    }
    state.lock().unwrap_or_else(|e| e.into_inner()).t0 = Instant::now();
    let _ = a.post_se(0);
    let finished = done_rx.recv_timeout(p.limit + p.grace).is_ok();
    if !finished {
        stop.store(true, Ordering::Relaxed);
        failed.store(true, Ordering::Relaxed);
    }
    // Stop the upcalls (waits for a running one), then free both EVDs: that
    // drops the upcall objects, which hold each other's EVD.
    for e in [&a, &b] {
        let _ = e.modify_upcall(UpcallPolicy::Teardown, None, ReEnable::OnNew);
    }
    for e in [&a, &b] {
        let _ = e.free();
    }
    let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
    Run {
        samples: std::mem::take(&mut st.samples),
        capped: capped.load(Ordering::Relaxed),
        failed: failed.load(Ordering::Relaxed),
    }
}

fn evd_pair(cap: usize) -> (Evd, Evd) {
    let mk = || Evd::create(cap, EvdFlags::SOFTWARE).expect("creating a ping-pong EVD");
    (mk(), mk())
}

/// Runs one method once.
pub fn run_method(m: Method, p: &Params) -> Run {
    match m {
        Method::EvdUpcall => upcall_pingpong(p),
        Method::EvdWait => {
            let (a, b) = evd_pair(p.capacity);
            let r = pingpong(EvdWait(a.clone()), EvdWait(b.clone()), p);
            let _ = (a.free(), b.free());
            r
        }
        Method::EvdPoll => {
            let (a, b) = evd_pair(p.capacity);
            let r = pingpong(EvdPoll(a.clone()), EvdPoll(b.clone()), p);
            let _ = (a.free(), b.free());
            r
        }
        Method::CrossbeamBlocking => {
            let (t1, r1) = crossbeam_channel::bounded(p.capacity);
            let (t2, r2) = crossbeam_channel::bounded(p.capacity);
            pingpong(CbBlocking(t1, r1), CbBlocking(t2, r2), p)
        }
        Method::CrossbeamPoll => {
            let (t1, r1) = crossbeam_channel::bounded(p.capacity);
            let (t2, r2) = crossbeam_channel::bounded(p.capacity);
            pingpong(CbPoll(t1, r1), CbPoll(t2, r2), p)
        }
    }
}

/// Everything the latency benchmark produced.
#[derive(Clone, Debug)]
pub struct Output {
    /// Report rows, one per method.
    pub rows: Vec<Row>,
    /// Every recorded round trip of every repetition, sorted, per method
    /// (for the distribution plot), in [`Method::ALL`] order.
    pub pooled: Vec<(Method, Vec<u64>)>,
}

/// Runs every method for `reps` repetitions.
pub fn run(p: &Params, reps: usize, mut progress: impl FnMut(&str)) -> Output {
    let n = Method::ALL.len();
    let mut med = vec![vec![f64::NAN; reps]; n];
    let mut p99 = vec![vec![f64::NAN; reps]; n];
    let mut counts = vec![Vec::new(); n];
    let mut capped = vec![0usize; n];
    let mut failed = vec![0usize; n];
    let mut pooled: Vec<Vec<u64>> = vec![Vec::new(); n];
    for rep in 0..reps {
        for (mi, m) in Method::ALL.iter().enumerate() {
            let mut r = run_method(*m, p);
            r.samples.sort_unstable();
            med[mi][rep] = percentile_sorted(&r.samples, 50.0);
            p99[mi][rep] = percentile_sorted(&r.samples, 99.0);
            counts[mi].push(r.samples.len());
            capped[mi] += usize::from(r.capped);
            failed[mi] += usize::from(r.failed);
            progress(&format!(
                "rep {}/{reps} {:<20} median {:>9.0} ns  p99 {:>9.0} ns  ({} samples{}{})",
                rep + 1,
                m.name(),
                med[mi][rep],
                p99[mi][rep],
                r.samples.len(),
                if r.capped { ", capped" } else { "" },
                if r.failed { ", FAILED" } else { "" },
            ));
            pooled[mi].extend_from_slice(&r.samples);
        }
    }
    let idx = |m: Method| Method::ALL.iter().position(|x| *x == m).unwrap_or(0);
    let rows = Method::ALL
        .iter()
        .enumerate()
        .map(|(mi, m)| {
            let pi = idx(m.peer());
            let rm = rep_ratios(&med[mi], &med[pi], reps);
            let rp = rep_ratios(&p99[mi], &p99[pi], reps);
            Row {
                id: format!("latency/{}", m.name()),
                method: *m,
                peer: m.peer(),
                rtt_median_ns: Summary::of(&med[mi]),
                rtt_p99_ns: Summary::of(&p99[mi]),
                ratio_median_vs_peer: Summary::of(&rm),
                ratio_p99_vs_peer: Summary::of(&rp),
                samples: counts[mi].clone(),
                capped_reps: capped[mi],
                failed_reps: failed[mi],
            }
        })
        .collect();
    let pooled = sorted_pools(&Method::ALL, pooled);
    Output { rows, pooled }
}
