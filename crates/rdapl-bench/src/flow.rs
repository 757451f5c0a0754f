//! Benchmark 3: the seed's flow. One producer thread completes DTOs into an
//! EVD (`reserve` then `complete`, the cookie carrying the post time) at an
//! offered load; three consumers handle them:
//!
//! | consumer | how events reach the handler |
//! |---|---|
//! | `poller` | [`rdapl::Poller`] (one poller thread, budget `budget`, re-arm `OnNew`), which is also the EVD's dispatch context ([`rdapl::Poller::dispatch`]): a notify-only upcall on the poller thread schedules the poll, which drains by batches and re-arms |
//! | `pure-upcall` (the peer of every ratio) | a `SingleInstance` upcall per event, on the default dispatcher |
//! | `pure-polling` | a thread that calls `dequeue` in a loop (spin, then yield when empty) |
//!
//! Loads: `low` and `medium` are paced (the producer posts event *i* at
//! `start + i / rate`; it sleeps through gaps of 50 µs or more and yields
//! through shorter ones, see [`SLEEP_GAP`]), `saturating` posts as fast as
//! the EVD takes events (retrying `reserve` with a backoff when it is full).
//!
//! Per run: events handled per second during the window, upcalls per event
//! during the window (the poller's notify upcalls, counted by
//! [`rdapl::poller::PollerStats`]; one per event for pure upcalls; none for
//! polling), and the latency from `complete` to the handler (mean over the
//! window; per-event samples at low load for the median, p99 and the plot).
//! After the window the producer stops, the consumer drains what was posted
//! (bounded by `drain_limit`), and the run checks that every posted event
//! was handled.

use crate::stats::{Summary, percentile_sorted, ratio};
use crate::util::{Backoff, Padded, dto_event, nanos_since};
use rdapl::evd::EvdProducer;
use rdapl::poller::PollerStats;
use rdapl::{Evd, EvdFlags, Event, Poller, PollerConfig, ReEnable, UpcallPolicy};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Parameters of the flow benchmark.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Params {
    /// Run time before the measured window.
    pub warmup: Duration,
    /// The measured window.
    pub window: Duration,
    /// Longest wait for the consumer to drain after the producer stopped.
    pub drain_limit: Duration,
    /// Offered load of `low`, events/s.
    pub low_rate: f64,
    /// Offered load of `medium`, events/s.
    pub medium_rate: f64,
    /// The poller's budget.
    pub budget: usize,
    /// EVD queue length.
    pub qlen: usize,
    /// Most latency samples kept per run (low load only).
    pub max_samples: usize,
}

/// A consumer of the flow.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Consumer {
    /// `rdapl::Poller`.
    Poller,
    /// One `SingleInstance` upcall per event.
    PureUpcall,
    /// A thread dequeuing in a loop.
    PurePolling,
}

impl Consumer {
    /// Every consumer, in report order.
    pub const ALL: [Consumer; 3] = [
        Consumer::Poller,
        Consumer::PureUpcall,
        Consumer::PurePolling,
    ];

    /// Short name used in row ids.
    pub fn name(self) -> &'static str {
        match self {
            Consumer::Poller => "poller",
            Consumer::PureUpcall => "pure-upcall",
            Consumer::PurePolling => "pure-polling",
        }
    }
}

/// An offered load.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Load {
    /// Paced at `low_rate`.
    Low,
    /// Paced at `medium_rate`.
    Medium,
    /// Unpaced.
    Saturating,
}

impl Load {
    /// Every load, in report order.
    pub const ALL: [Load; 3] = [Load::Low, Load::Medium, Load::Saturating];

    /// Short name used in row ids.
    pub fn name(self) -> &'static str {
        match self {
            Load::Low => "low",
            Load::Medium => "medium",
            Load::Saturating => "saturating",
        }
    }

    /// Offered events/s (`None`: unpaced).
    pub fn rate(self, p: &Params) -> Option<f64> {
        match self {
            Load::Low => Some(p.low_rate),
            Load::Medium => Some(p.medium_rate),
            Load::Saturating => None,
        }
    }
}

/// One row of the report: a consumer at a load.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    /// `flow/<load>/<consumer>`.
    pub id: String,
    /// The consumer.
    pub consumer: Consumer,
    /// The load.
    pub load: Load,
    /// Offered events/s (`None`: saturating).
    pub offered_per_s: Option<f64>,
    /// The peer of the ratios (always `pure-upcall`).
    pub peer: Consumer,
    /// Events handled per second (absolute, context only).
    pub events_per_s: Summary,
    /// Upcalls per handled event.
    pub upcalls_per_event: Summary,
    /// Mean latency from `complete` to the handler, ns (absolute).
    pub mean_latency_ns: Summary,
    /// Median latency, ns (low load only, else NaN/null).
    pub p50_latency_ns: Summary,
    /// 99th percentile latency, ns (low load only, else NaN/null).
    pub p99_latency_ns: Summary,
    /// events/s / the peer's.
    pub ratio_events_vs_peer: Summary,
    /// upcalls per event / the peer's (lower is better).
    pub ratio_upcalls_per_event_vs_peer: Summary,
    /// mean latency / the peer's (lower is better).
    pub ratio_mean_latency_vs_peer: Summary,
    /// Events posted and never handled, summed over repetitions (must be 0).
    pub lost: u64,
}

/// What a handler records.
struct Sink {
    epoch: Instant,
    /// Events handled and the sum of their latencies (ns).
    counters: Padded<(AtomicU64, AtomicU64)>,
    /// Upcalls made (pure-upcall consumer only).
    upcalls: Padded<AtomicU64>,
    samples: Option<Mutex<Vec<u64>>>,
    max_samples: usize,
}

impl Sink {
    fn new(epoch: Instant, sample: bool, max_samples: usize) -> Sink {
        Sink {
            epoch,
            counters: Padded((AtomicU64::new(0), AtomicU64::new(0))),
            upcalls: Padded(AtomicU64::new(0)),
            samples: sample.then(|| Mutex::new(Vec::with_capacity(max_samples))),
            max_samples,
        }
    }

    fn handle(&self, ev: &Event) {
        let now = nanos_since(self.epoch);
        let lat = match ev {
            Event::Dto(d) => now.saturating_sub(d.cookie),
            _ => 0,
        };
        if let Some(s) = &self.samples {
            let mut s = s.lock().unwrap_or_else(|e| e.into_inner());
            if s.len() < self.max_samples {
                s.push(lat);
            }
        }
        self.counters.0.1.fetch_add(lat, Ordering::Relaxed);
        self.counters.0.0.fetch_add(1, Ordering::Relaxed);
    }

    fn handled(&self) -> u64 {
        self.counters.0.0.load(Ordering::Relaxed)
    }

    fn lat_sum(&self) -> u64 {
        self.counters.0.1.load(Ordering::Relaxed)
    }
}

/// A running consumer.
enum Running {
    Poller(Poller, rdapl::PollerEntry),
    Upcall,
    Polling(Arc<AtomicBool>, std::thread::JoinHandle<()>),
}

impl Running {
    fn start(c: Consumer, evd: &Evd, sink: &Arc<Sink>, poller: Option<Poller>) -> Running {
        match c {
            Consumer::Poller => {
                let poller = poller.expect("the poller is started before its EVD");
                let s = sink.clone();
                let entry = poller
                    .add(evd, move |ev| s.handle(&ev))
                    .expect("attaching the EVD to the poller");
                Running::Poller(poller, entry)
            }
            Consumer::PureUpcall => {
                let s = sink.clone();
                evd.modify_upcall(
                    UpcallPolicy::SingleInstance,
                    Some(Arc::new(move |_: &Evd, ev: Option<Event>, _more: bool| {
                        s.upcalls.0.fetch_add(1, Ordering::Relaxed);
                        if let Some(ev) = ev {
                            s.handle(&ev);
                        }
                    })),
                    ReEnable::OnAny,
                )
                .expect("enabling the upcall");
                Running::Upcall
            }
            Consumer::PurePolling => {
                let stop = Arc::new(AtomicBool::new(false));
                let (evd, s, st) = (evd.clone(), sink.clone(), stop.clone());
                let h = std::thread::Builder::new()
                    .name("flow-polling".into())
                    .spawn(move || {
                        let mut backoff = Backoff::new();
                        while !st.load(Ordering::Relaxed) {
                            match evd.dequeue() {
                                Ok(Some(ev)) => {
                                    s.handle(&ev);
                                    backoff.reset();
                                }
                                Ok(None) => backoff.snooze(),
                                Err(_) => break,
                            }
                        }
                    })
                    .expect("spawning the polling consumer");
                Running::Polling(stop, h)
            }
        }
    }

    fn upcalls(&self, sink: &Sink) -> u64 {
        match self {
            Running::Poller(_, e) => {
                let s: PollerStats = e.stats();
                s.upcalls
            }
            _ => sink.upcalls.0.load(Ordering::Relaxed),
        }
    }

    fn stop(self, evd: &Evd) {
        match self {
            Running::Poller(poller, entry) => {
                let _ = entry.remove(&poller);
                drop(poller);
            }
            Running::Upcall => {
                let _ = evd.modify_upcall(UpcallPolicy::Teardown, None, ReEnable::OnNew);
            }
            Running::Polling(stop, h) => {
                stop.store(true, Ordering::Relaxed);
                let _ = h.join();
            }
        }
    }
}

/// The result of one run.
#[derive(Clone, Debug, Default)]
struct Sample {
    events_per_s: f64,
    upcalls_per_event: f64,
    mean_latency_ns: f64,
    samples: Vec<u64>,
    lost: u64,
}

/// Gaps to the next due event at least this long are slept (the OS may
/// oversleep; the events that fell due meanwhile are then posted at once),
/// shorter ones are waited with `yield_now`. At 10k events/s the producer
/// thus sleeps and leaves the cores to the consumers, as a NIC would; at
/// 200k events/s it yields between events.
pub const SLEEP_GAP: Duration = Duration::from_micros(50);

fn produce(evd: &Evd, rate: Option<f64>, epoch: Instant, stop: &AtomicBool, posted: &AtomicU64) {
    let start = Instant::now();
    let mut i = 0u64;
    let mut backoff = Backoff::new();
    while !stop.load(Ordering::Relaxed) {
        if let Some(rate) = rate {
            let due = start + Duration::from_secs_f64(i as f64 / rate);
            let now = Instant::now();
            if now < due {
                let wait = due - now;
                if wait >= SLEEP_GAP {
                    std::thread::sleep(wait);
                } else {
                    std::thread::yield_now();
                }
                continue;
            }
        }
        match evd.reserve() {
            Ok(r) => {
                evd.complete(r, dto_event(nanos_since(epoch)))
                    .expect("reserved on this EVD");
                i += 1;
                posted.store(i, Ordering::Relaxed);
                backoff.reset();
            }
            Err(_) => backoff.snooze(),
        }
    }
}

fn run_one(c: Consumer, load: Load, p: &Params) -> Sample {
    let epoch = Instant::now();
    // The poller is its EVD's dispatch context: its notify-only upcall runs
    // on the poller thread, which then polls without a second wake-up.
    let poller = matches!(c, Consumer::Poller).then(|| {
        Poller::new(PollerConfig {
            threads: 1,
            budget: p.budget,
            mode: ReEnable::OnNew,
        })
        .expect("starting the poller")
    });
    let evd = match &poller {
        Some(pl) => Evd::builder(p.qlen, EvdFlags::DTO)
            .dispatch(pl.dispatch())
            .build(),
        None => Evd::create(p.qlen, EvdFlags::DTO),
    }
    .expect("creating the flow EVD");
    let sink = Arc::new(Sink::new(epoch, load == Load::Low, p.max_samples));
    let running = Running::start(c, &evd, &sink, poller);
    let stop = Arc::new(AtomicBool::new(false));
    let posted = Arc::new(Padded(AtomicU64::new(0)));
    let producer = {
        let (evd, stop, posted) = (evd.clone(), stop.clone(), posted.clone());
        let rate = load.rate(p);
        std::thread::Builder::new()
            .name("flow-producer".into())
            .spawn(move || produce(&evd, rate, epoch, &stop, &posted.0))
            .expect("spawning the producer")
    };
    std::thread::sleep(p.warmup);
    let snap = |t: Instant| (t, sink.handled(), sink.lat_sum(), running.upcalls(&sink));
    let s0 = snap(Instant::now());
    std::thread::sleep(p.window);
    let s1 = snap(Instant::now());
    stop.store(true, Ordering::Relaxed);
    let _ = producer.join();
    let total = posted.0.load(Ordering::Relaxed);
    let drain_deadline = Instant::now() + p.drain_limit;
    while sink.handled() < total && Instant::now() < drain_deadline {
        std::thread::sleep(Duration::from_micros(200));
    }
    let handled_total = sink.handled();
    running.stop(&evd);
    let _ = evd.free();
    let events = s1.1 - s0.1;
    let secs = (s1.0 - s0.0).as_secs_f64();
    let ev = events as f64;
    let samples = sink
        .samples
        .as_ref()
        .map(|s| std::mem::take(&mut *s.lock().unwrap_or_else(|e| e.into_inner())))
        .unwrap_or_default();
    Sample {
        events_per_s: if secs > 0.0 { ev / secs } else { f64::NAN },
        upcalls_per_event: ratio((s1.3 - s0.3) as f64, ev),
        mean_latency_ns: ratio((s1.2 - s0.2) as f64, ev),
        samples,
        lost: total.saturating_sub(handled_total),
    }
}

/// What one flow run measured (see [`run_single`]).
#[derive(Clone, Debug)]
pub struct Single {
    /// Events handled per second during the window.
    pub events_per_s: f64,
    /// Upcalls per handled event during the window.
    pub upcalls_per_event: f64,
    /// Mean `complete` → handler latency during the window, ns.
    pub mean_latency_ns: f64,
    /// Latency samples, ns, sorted (low load only).
    pub samples: Vec<u64>,
    /// Events posted and never handled.
    pub lost: u64,
}

/// Runs one consumer at one load once. Public for profiling (see the
/// `profile_flow` example).
pub fn run_single(c: Consumer, load: Load, p: &Params) -> Single {
    let mut s = run_one(c, load, p);
    s.samples.sort_unstable();
    Single {
        events_per_s: s.events_per_s,
        upcalls_per_event: s.upcalls_per_event,
        mean_latency_ns: s.mean_latency_ns,
        samples: s.samples,
        lost: s.lost,
    }
}

/// Everything the flow benchmark produced.
#[derive(Clone, Debug)]
pub struct Output {
    /// Report rows, loads × consumers.
    pub rows: Vec<Row>,
    /// Low-load latency samples of every repetition, sorted, per consumer.
    pub low_load_latencies: Vec<(Consumer, Vec<u64>)>,
}

/// Runs every load × consumer for `reps` repetitions.
pub fn run(p: &Params, reps: usize, mut progress: impl FnMut(&str)) -> Output {
    let (nl, nc) = (Load::ALL.len(), Consumer::ALL.len());
    let mut res: Vec<Vec<Vec<Sample>>> = vec![vec![Vec::with_capacity(reps); nc]; nl];
    for rep in 0..reps {
        for (li, load) in Load::ALL.iter().enumerate() {
            for (ci, c) in Consumer::ALL.iter().enumerate() {
                let mut s = run_one(*c, *load, p);
                s.samples.sort_unstable();
                progress(&format!(
                    "rep {}/{reps} {:<10} {:<12} {:>10.0} events/s  {:.4} upcalls/event  mean latency {:>9.0} ns{}",
                    rep + 1,
                    load.name(),
                    c.name(),
                    s.events_per_s,
                    s.upcalls_per_event,
                    s.mean_latency_ns,
                    if s.lost > 0 {
                        format!("  LOST {}", s.lost)
                    } else {
                        String::new()
                    }
                ));
                res[li][ci].push(s);
            }
        }
    }
    let peer = Consumer::ALL
        .iter()
        .position(|c| *c == Consumer::PureUpcall)
        .unwrap_or(0);
    let mut rows = Vec::new();
    for (li, load) in Load::ALL.iter().enumerate() {
        for (ci, c) in Consumer::ALL.iter().enumerate() {
            let me = &res[li][ci];
            let pe = &res[li][peer];
            let f = |get: &dyn Fn(&Sample) -> f64| -> Vec<f64> { me.iter().map(get).collect() };
            let r = |get: &dyn Fn(&Sample) -> f64| -> Vec<f64> {
                me.iter()
                    .zip(pe)
                    .map(|(a, b)| ratio(get(a), get(b)))
                    .collect()
            };
            rows.push(Row {
                id: format!("flow/{}/{}", load.name(), c.name()),
                consumer: *c,
                load: *load,
                offered_per_s: load.rate(p),
                peer: Consumer::PureUpcall,
                events_per_s: Summary::of(&f(&|s| s.events_per_s)),
                upcalls_per_event: Summary::of(&f(&|s| s.upcalls_per_event)),
                mean_latency_ns: Summary::of(&f(&|s| s.mean_latency_ns)),
                p50_latency_ns: Summary::of(&f(&|s| percentile_sorted(&s.samples, 50.0))),
                p99_latency_ns: Summary::of(&f(&|s| percentile_sorted(&s.samples, 99.0))),
                ratio_events_vs_peer: Summary::of(&r(&|s| s.events_per_s)),
                ratio_upcalls_per_event_vs_peer: Summary::of(&r(&|s| s.upcalls_per_event)),
                ratio_mean_latency_vs_peer: Summary::of(&r(&|s| s.mean_latency_ns)),
                lost: me.iter().map(|s| s.lost).sum(),
            });
        }
    }
    let low = Load::ALL.iter().position(|l| *l == Load::Low).unwrap_or(0);
    let low_load_latencies = Consumer::ALL
        .iter()
        .enumerate()
        .map(|(ci, c)| {
            let mut v: Vec<u64> = res[low][ci]
                .iter()
                .flat_map(|s| s.samples.iter().copied())
                .collect();
            v.sort_unstable();
            (*c, v)
        })
        .collect();
    Output {
        rows,
        low_load_latencies,
    }
}
