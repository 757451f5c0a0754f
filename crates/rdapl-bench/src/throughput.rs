//! Benchmark 1: EVD throughput against channel peers.
//!
//! One or two producer threads push small events (a DTO completion, the same
//! `Event` value for every queue) into one queue of capacity `capacity`; one
//! consumer thread takes them out, one at a time (`dequeue` / `try_recv`) or
//! in batches of up to `batch` (`dequeue_batch` / `try_iter().take(batch)`).
//!
//! Queues under test:
//!
//! | name | producer side | consumer side |
//! |---|---|---|
//! | `evd-reserve-complete` (main row) | `reserve()` then `complete(r, Event::Dto(..))` | `dequeue` / `dequeue_batch` |
//! | `evd-post-se` | `post_se(i)` | `dequeue` / `dequeue_batch` |
//! | `crossbeam` (the peer of every ratio) | `crossbeam_channel::bounded` `try_send` | `try_recv` / `try_iter` |
//! | `std-sync-channel` | `std::sync::mpsc::sync_channel` `try_send` | `try_recv` / `try_iter` |
//! | `flume` | `flume::bounded` `try_send` | `try_recv` / `try_iter` |
//!
//! Every side of every queue uses the same non-blocking calls and the same
//! [`Backoff`] when full or empty, so the comparison is of the data
//! structures, not of their parking strategies. A run lasts `warmup +
//! window`; the events the consumer took during the window, divided by the
//! window's length, is the rate. A *trial* runs every queue of one
//! configuration once, back to back, in an order that rotates from trial to
//! trial; the ratio EVD/crossbeam is taken inside the trial, and the report
//! gives the median over many short trials, which is what survives a noisy
//! shared machine.

use crate::stats::{Summary, ratio};
use crate::util::{Backoff, Padded, dto_event};
use rdapl::evd::EvdProducer;
use rdapl::{Evd, EvdFlags, Event};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// Parameters of the throughput benchmark.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Params {
    /// Run time before the measured window starts.
    pub warmup: Duration,
    /// The measured window.
    pub window: Duration,
    /// Capacity of every queue (EVD `qlen`, channel bound).
    pub capacity: usize,
    /// Largest batch the batched consumer takes at once.
    pub batch: usize,
    /// Trials per repetition (each trial runs every queue once).
    pub trials_per_rep: usize,
}

/// How the consumer takes events out.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Consumption {
    /// One event per call (`dequeue`, `try_recv`).
    Unbatched,
    /// Up to `batch` events per call (`dequeue_batch`, `try_iter().take(batch)`).
    Batched,
}

impl Consumption {
    /// Short name used in row ids.
    pub fn name(self) -> &'static str {
        match self {
            Consumption::Unbatched => "unbatched",
            Consumption::Batched => "batched",
        }
    }
}

/// The queue under test.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Queue {
    /// EVD, producer `reserve` + `complete` (the provider's DTO path).
    EvdReserveComplete,
    /// EVD, producer `post_se`.
    EvdPostSe,
    /// `crossbeam_channel::bounded`.
    Crossbeam,
    /// `std::sync::mpsc::sync_channel`.
    StdSyncChannel,
    /// `flume::bounded`.
    Flume,
}

impl Queue {
    /// Every queue, in report order.
    pub const ALL: [Queue; 5] = [
        Queue::EvdReserveComplete,
        Queue::EvdPostSe,
        Queue::Crossbeam,
        Queue::StdSyncChannel,
        Queue::Flume,
    ];

    /// Short name used in row ids.
    pub fn name(self) -> &'static str {
        match self {
            Queue::EvdReserveComplete => "evd-reserve-complete",
            Queue::EvdPostSe => "evd-post-se",
            Queue::Crossbeam => "crossbeam",
            Queue::StdSyncChannel => "std-sync-channel",
            Queue::Flume => "flume",
        }
    }
}

/// One configuration: producers and consumption form.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Producer threads (the consumer is always one thread).
    pub producers: usize,
    /// Consumption form.
    pub consumption: Consumption,
}

impl Config {
    /// The configurations of the issue: 1 and 2 producers, unbatched and batched.
    pub const ALL: [Config; 4] = [
        Config {
            producers: 1,
            consumption: Consumption::Unbatched,
        },
        Config {
            producers: 2,
            consumption: Consumption::Unbatched,
        },
        Config {
            producers: 1,
            consumption: Consumption::Batched,
        },
        Config {
            producers: 2,
            consumption: Consumption::Batched,
        },
    ];

    /// `1p-unbatched` etc.
    pub fn name(self) -> String {
        format!("{}p-{}", self.producers, self.consumption.name())
    }
}

/// One row of the report: a queue in a configuration.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    /// `throughput/<config>/<queue>`.
    pub id: String,
    /// Producer threads.
    pub producers: usize,
    /// Consumption form.
    pub consumption: Consumption,
    /// Queue under test.
    pub queue: Queue,
    /// The peer of the ratio (always `crossbeam`).
    pub peer: Queue,
    /// Events per second (absolute, context only).
    pub events_per_s: Summary,
    /// Events per second of this queue / of crossbeam, per repetition.
    pub ratio_vs_peer: Summary,
}

/// Result of one measured run.
#[derive(Copy, Clone, Debug)]
struct Sample {
    events: u64,
    secs: f64,
}

impl Sample {
    fn rate(self) -> f64 {
        if self.secs > 0.0 {
            self.events as f64 / self.secs
        } else {
            f64::NAN
        }
    }
}

/// Producer side of a queue.
trait Tx: Clone + Send + 'static {
    /// Tries to push one event; false if the queue is full.
    fn try_push(&self, i: u64) -> bool;
}

/// Consumer side of a queue.
trait Rx: Send + 'static {
    /// Takes one event if there is one.
    fn pop_one(&mut self) -> Option<Event>;
    /// Appends up to `max` events to `buf`; returns how many.
    fn pop_batch(&mut self, buf: &mut Vec<Event>, max: usize) -> usize;
}

#[derive(Clone)]
struct EvdReserve(Evd);
impl Tx for EvdReserve {
    fn try_push(&self, i: u64) -> bool {
        match self.0.reserve() {
            Ok(r) => {
                self.0
                    .complete(r, dto_event(i))
                    .expect("reserved on this EVD");
                true
            }
            Err(_) => false,
        }
    }
}

#[derive(Clone)]
struct EvdPostSe(Evd);
impl Tx for EvdPostSe {
    fn try_push(&self, i: u64) -> bool {
        self.0.post_se(i).is_ok()
    }
}

struct EvdRx(Evd);
impl Rx for EvdRx {
    fn pop_one(&mut self) -> Option<Event> {
        self.0.dequeue().ok().flatten()
    }
    fn pop_batch(&mut self, buf: &mut Vec<Event>, max: usize) -> usize {
        self.0.dequeue_batch(buf, max).unwrap_or(0)
    }
}

/// Adapters for the channel peers: each has `try_send`, `try_recv` and
/// `try_iter`, so one definition serves all three.
macro_rules! channel_peer {
    ($tx:ident($sender:ty), $rx:ident($receiver:ty)) => {
        #[derive(Clone)]
        struct $tx($sender);
        impl Tx for $tx {
            fn try_push(&self, i: u64) -> bool {
                self.0.try_send(dto_event(i)).is_ok()
            }
        }
        struct $rx($receiver);
        impl Rx for $rx {
            fn pop_one(&mut self) -> Option<Event> {
                self.0.try_recv().ok()
            }
            fn pop_batch(&mut self, buf: &mut Vec<Event>, max: usize) -> usize {
                let before = buf.len();
                buf.extend(self.0.try_iter().take(max));
                buf.len() - before
            }
        }
    };
}

channel_peer!(
    CbTx(crossbeam_channel::Sender<Event>),
    CbRx(crossbeam_channel::Receiver<Event>)
);
channel_peer!(
    StdTx(std::sync::mpsc::SyncSender<Event>),
    StdRx(std::sync::mpsc::Receiver<Event>)
);
channel_peer!(
    FlumeTx(flume::Sender<Event>),
    FlumeRx(flume::Receiver<Event>)
);

/// Runs producers and the consumer for `warmup + window` and counts what
/// the consumer took during the window. Every loop checks the stop flag.
fn drive<T: Tx, R: Rx>(tx: T, mut rx: R, cfg: Config, p: &Params) -> Sample {
    let stop = Arc::new(AtomicBool::new(false));
    let consumed = Arc::new(Padded(AtomicU64::new(0)));
    let barrier = Arc::new(Barrier::new(cfg.producers + 2));
    let producers: Vec<_> = (0..cfg.producers)
        .map(|k| {
            let (tx, stop, barrier) = (tx.clone(), stop.clone(), barrier.clone());
            std::thread::Builder::new()
                .name(format!("tp-producer-{k}"))
                .spawn(move || {
                    barrier.wait();
                    let mut i = 0u64;
                    let mut backoff = Backoff::new();
                    while !stop.load(Ordering::Relaxed) {
                        if tx.try_push(i) {
                            i += 1;
                            backoff.reset();
                        } else {
                            backoff.snooze();
                        }
                    }
                })
                .expect("spawning a producer")
        })
        .collect();
    drop(tx);
    let batch = p.batch;
    let consumption = cfg.consumption;
    let consumer = {
        let (stop, consumed, barrier) = (stop.clone(), consumed.clone(), barrier.clone());
        std::thread::Builder::new()
            .name("tp-consumer".into())
            .spawn(move || {
                barrier.wait();
                let mut n = 0u64;
                let mut backoff = Backoff::new();
                let mut buf: Vec<Event> = Vec::with_capacity(batch);
                while !stop.load(Ordering::Relaxed) {
                    let got = match consumption {
                        Consumption::Unbatched => u64::from(rx.pop_one().is_some()),
                        Consumption::Batched => {
                            buf.clear();
                            rx.pop_batch(&mut buf, batch) as u64
                        }
                    };
                    if got > 0 {
                        n += got;
                        consumed.0.store(n, Ordering::Relaxed);
                        backoff.reset();
                    } else {
                        backoff.snooze();
                    }
                }
                drop(rx);
            })
            .expect("spawning the consumer")
    };
    barrier.wait();
    std::thread::sleep(p.warmup);
    let (c0, t0) = (consumed.0.load(Ordering::Relaxed), Instant::now());
    std::thread::sleep(p.window);
    let (c1, t1) = (consumed.0.load(Ordering::Relaxed), Instant::now());
    stop.store(true, Ordering::Relaxed);
    for h in producers {
        let _ = h.join();
    }
    let _ = consumer.join();
    Sample {
        events: c1 - c0,
        secs: (t1 - t0).as_secs_f64(),
    }
}

fn run_one(queue: Queue, cfg: Config, p: &Params) -> Sample {
    let cap = p.capacity;
    match queue {
        Queue::EvdReserveComplete | Queue::EvdPostSe => {
            let evd = Evd::create(cap, EvdFlags::DTO | EvdFlags::SOFTWARE)
                .expect("creating the benchmark EVD");
            let rx = EvdRx(evd.clone());
            let s = if queue == Queue::EvdReserveComplete {
                drive(EvdReserve(evd.clone()), rx, cfg, p)
            } else {
                drive(EvdPostSe(evd.clone()), rx, cfg, p)
            };
            let _ = evd.free();
            s
        }
        Queue::Crossbeam => {
            let (tx, rx) = crossbeam_channel::bounded(cap);
            drive(CbTx(tx), CbRx(rx), cfg, p)
        }
        Queue::StdSyncChannel => {
            let (tx, rx) = std::sync::mpsc::sync_channel(cap);
            drive(StdTx(tx), StdRx(rx), cfg, p)
        }
        Queue::Flume => {
            let (tx, rx) = flume::bounded(cap);
            drive(FlumeTx(tx), FlumeRx(rx), cfg, p)
        }
    }
}

/// Measures one queue in one configuration once (one warm-up and one
/// window); returns events per second. Public for profiling (see the
/// `profile_throughput` example).
pub fn run_single(queue: Queue, cfg: Config, p: &Params) -> f64 {
    run_one(queue, cfg, p).rate()
}

/// Runs every configuration × queue for `reps × trials_per_rep` trials and
/// returns the report rows. A trial of a configuration runs every queue
/// once, back to back, starting with a different queue each trial
/// (rotation), so a change of background load hits all queues alike; the
/// ratio against crossbeam is taken inside each trial. The configurations
/// take turns trial by trial, so that each one's trials spread over the
/// whole benchmark rather than over a quarter of it: a slow or fast phase
/// of the machine (they last seconds to minutes) weighs on every
/// configuration alike instead of deciding one configuration's median.
/// `progress` is called after each trial.
pub fn run(p: &Params, reps: usize, mut progress: impl FnMut(&str)) -> Vec<Row> {
    let trials = (reps * p.trials_per_rep).max(1);
    let nq = Queue::ALL.len();
    let mut rates = vec![vec![Vec::with_capacity(trials); nq]; Config::ALL.len()];
    for trial in 0..trials {
        for (ci, cfg) in Config::ALL.iter().enumerate() {
            let mut line = format!("{} trial {:>2}/{trials}:", cfg.name(), trial + 1);
            let mut got = vec![f64::NAN; nq];
            for k in 0..nq {
                let qi = (k + trial) % nq;
                got[qi] = run_single(Queue::ALL[qi], *cfg, p);
            }
            for (qi, r) in got.iter().enumerate() {
                rates[ci][qi].push(*r);
                line.push_str(&format!(" {} {:.1}M", Queue::ALL[qi].name(), r / 1e6));
            }
            progress(&line);
        }
    }
    let peer_idx = Queue::ALL
        .iter()
        .position(|q| *q == Queue::Crossbeam)
        .unwrap_or(0);
    let mut rows = Vec::new();
    for (ci, cfg) in Config::ALL.iter().enumerate() {
        for (qi, q) in Queue::ALL.iter().enumerate() {
            let ratios: Vec<f64> = rates[ci][qi]
                .iter()
                .zip(&rates[ci][peer_idx])
                .map(|(a, b)| ratio(*a, *b))
                .collect();
            rows.push(Row {
                id: format!("throughput/{}/{}", cfg.name(), q.name()),
                producers: cfg.producers,
                consumption: cfg.consumption,
                queue: *q,
                peer: Queue::Crossbeam,
                events_per_s: Summary::of(&rates[ci][qi]),
                ratio_vs_peer: Summary::of(&ratios),
            });
        }
    }
    rows
}
