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
//! structures, not of their parking strategies. A run pins its threads
//! apart, records when each was not running, and takes its rate over the
//! *live* ticks only, in which the consumer and enough producers were all
//! running (see `drive`); a run with too little live time is *starved*
//! ([`MIN_LIVE_SHARE`]). A *trial* runs every queue of one configuration
//! once, back to back, in an order that rotates from trial to trial; the
//! ratio EVD/crossbeam is taken inside the trial (none if either run was
//! starved: the trial is listed as discarded, with the reason), and the
//! report gives the median over many short trials.

use crate::stats::{Summary, ratio};
use crate::util::{Backoff, Padded, as_nanos, dto_event};
use rdapl::evd::EvdProducer;
use rdapl::{Evd, EvdFlags, Event};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

/// Parameters of the throughput benchmark.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Params {
    /// Run time before the measured window starts.
    pub warmup: Duration,
    /// Live time wanted in a run's window (see `drive`): the window
    /// runs until its live ticks add up to this, or `max_window`.
    pub window: Duration,
    /// The longest window.
    pub max_window: Duration,
    /// How often the harness samples the workers' progress in the window.
    pub tick: Duration,
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
    /// Events per second over the live part of each run (absolute,
    /// context only; every trial, discarded or not).
    pub events_per_s: Summary,
    /// Events per second over each run's whole window, live or not
    /// (context: what the method gave before 2026-12-02).
    pub raw_events_per_s: Summary,
    /// The live share of each run's window (every worker made progress).
    pub live_frac: Summary,
    /// Per trial: events/s of this queue ÷ crossbeam's in the same trial,
    /// both over their live ticks; `NaN` (`null` in JSON) for a discarded
    /// trial, which the median, min and max leave out.
    pub ratio_vs_peer: Summary,
    /// The trials left out of `ratio_vs_peer`, with the reason.
    pub discarded: Vec<Discarded>,
}

/// A trial left out of a row's ratio.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Discarded {
    /// Trial index (0-based, the index into the row's `reps`).
    pub trial: usize,
    /// Why, e.g. `crossbeam live 0.31 < 0.50`.
    pub reason: String,
}

/// A run is *starved* if its live ticks add up to less than this share of
/// the live time wanted (`Params::window`), even with its window stretched
/// to `max_window`, or cover less than this share of its window: for most
/// of the time it had, some side was not running. A trial in which the
/// queue or its peer was starved gives no ratio. (The second condition:
/// a queue that a stall left full runs at another rate than one running
/// near empty, up to twice crossbeam's usual rate here, so live ticks taken
/// between long stalls do not measure what an undisturbed run does.)
pub const MIN_LIVE_SHARE: f64 = 0.5;

/// What the kernel says about one worker thread (`/proc/<pid>/task/<tid>/schedstat`
/// and `stat`): time on a CPU, time runnable but waiting for one, and the
/// CPU it last ran on.
#[derive(Copy, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ThreadSched {
    /// Nanoseconds on a CPU.
    pub run_ns: u64,
    /// Nanoseconds runnable and waiting for a CPU.
    pub wait_ns: u64,
    /// The CPU the thread last ran on.
    pub cpu: i64,
}

impl ThreadSched {
    /// Reads the figures of thread `tid` of this process (`None` if
    /// `/proc` cannot be read).
    pub fn read(tid: u64) -> Option<ThreadSched> {
        let base = format!("/proc/self/task/{tid}");
        let ss = std::fs::read_to_string(format!("{base}/schedstat")).ok()?;
        let mut it = ss.split_whitespace().map(|x| x.parse::<u64>().ok());
        let (run_ns, wait_ns) = (it.next()??, it.next()??);
        let st = std::fs::read_to_string(format!("{base}/stat")).ok()?;
        // Fields after the `(comm)`, which may hold spaces: field 39 of the
        // whole line (`processor`) is the 37th after it.
        let after = &st[st.rfind(')')? + 1..];
        let cpu = after.split_whitespace().nth(36)?.parse().ok()?;
        Some(ThreadSched {
            run_ns,
            wait_ns,
            cpu,
        })
    }
}

/// The CPUs this process may run on (empty if unknown).
pub fn allowed_cpus() -> Vec<usize> {
    #[cfg(target_os = "linux")]
    {
        use rustix::thread::{CpuSet, sched_getaffinity};
        sched_getaffinity(None)
            .map(|set| (0..CpuSet::MAX_CPU).filter(|c| set.is_set(*c)).collect())
            .unwrap_or_default()
    }
    #[cfg(not(target_os = "linux"))]
    {
        Vec::new()
    }
}

/// Pins the calling thread to `cpu`; false if that failed.
pub(crate) fn pin_to(cpu: usize) -> bool {
    #[cfg(target_os = "linux")]
    {
        use rustix::thread::{CpuSet, sched_setaffinity};
        let mut set = CpuSet::new();
        set.set(cpu);
        sched_setaffinity(None, &set).is_ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = cpu;
        false
    }
}

/// Where each worker runs: with at least two CPUs allowed, the consumer
/// alone on the first and the producers on the others in turn (on two
/// cores both producers share the second); with one, nowhere in
/// particular (`None`: the run then cannot have its sides running at once,
/// and its ticks are not live).
fn placement(producers: usize, cpus: &[usize]) -> Vec<Option<usize>> {
    if cpus.len() < 2 {
        return vec![None; producers + 1];
    }
    (0..producers)
        .map(|k| Some(cpus[1 + k % (cpus.len() - 1)]))
        .chain(std::iter::once(Some(cpus[0])))
        .collect()
}

/// This thread's id (from the `/proc/thread-self` link), 0 if unknown.
fn own_tid() -> u64 {
    std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name()?.to_str()?.parse().ok())
        .unwrap_or(0)
}

/// One sampling tick of the harness: the time and every worker's count of
/// operations done so far (the producers' pushes, then the consumer's
/// events taken).
#[derive(Clone, Debug)]
pub struct Tick {
    /// Time since the run's epoch (before the threads started).
    pub at: Duration,
    /// Producers' pushes, then the consumer's events, so far.
    pub counts: Vec<u64>,
}

/// Result of one measured run.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Events the consumer took in the whole window.
    pub events: u64,
    /// The window's length, s.
    pub secs: f64,
    /// Events the consumer took in the live ticks (see `drive`).
    pub live_events: u64,
    /// Total length of the live ticks, s.
    pub live_secs: f64,
    /// Share of the window in which the consumer and enough producers were
    /// all running, live tick or not.
    pub running_frac: f64,
    /// Per worker (producers, then the consumer): the share of the window
    /// it was not running, by its own clock gaps.
    pub off_frac: Vec<f64>,
    /// Whether every worker was pinned to its CPU (see `placement`).
    pub pinned: bool,
    /// Ticks of the window, live and not.
    pub ticks: usize,
    /// Live ticks in which the consumer took nothing (both sides were
    /// running by their clocks, yet nothing moved: not a scheduling
    /// stall, so they stay in the rate).
    pub idle_live_ticks: usize,
    /// Longest run of consecutive ticks that were not live, s.
    pub longest_stall_secs: f64,
    /// Per worker (producers, then the consumer): its CPU time during the
    /// window ÷ the window (`NaN` if `/proc` could not be read).
    pub cpu_frac: Vec<f64>,
    /// Per worker: time runnable but waiting for a CPU ÷ the window.
    pub wait_frac: Vec<f64>,
    /// Per worker: the CPU it last ran on at the end of the window.
    pub last_cpu: Vec<i64>,
    /// Every tick (for diagnostics).
    pub timeline: Vec<Tick>,
    /// Per worker, when it was not running: (from, to), ns since the
    /// run's epoch (for diagnostics).
    pub gaps: Vec<Vec<(u64, u64)>>,
}

impl Sample {
    /// Events per second over the whole window.
    pub fn raw_rate(&self) -> f64 {
        if self.secs > 0.0 {
            self.events as f64 / self.secs
        } else {
            f64::NAN
        }
    }

    /// Events per second over the live ticks.
    pub fn live_rate(&self) -> f64 {
        if self.live_secs > 0.0 {
            self.live_events as f64 / self.live_secs
        } else {
            f64::NAN
        }
    }

    /// Whether the run had too little live time to give a rate (see
    /// [`MIN_LIVE_SHARE`]).
    pub fn starved(&self, p: &Params) -> bool {
        self.live_secs < MIN_LIVE_SHARE * p.window.as_secs_f64()
            || self.live_frac() < MIN_LIVE_SHARE
    }

    /// The live ticks' share of the window.
    pub fn live_frac(&self) -> f64 {
        if self.secs > 0.0 {
            self.live_secs / self.secs
        } else {
            0.0
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

/// Spins (yielding after [`crate::util::YIELD_AFTER`], as every side does)
/// until `go` is set.
fn wait_for(go: &AtomicBool) {
    let mut backoff = Backoff::new();
    while !go.load(Ordering::Acquire) {
        backoff.snooze();
    }
}

/// A worker's clock gap at least this long is time it did not run
/// (descheduled, preempted, or its virtual CPU stopped by the host): an
/// order of magnitude above an interrupt or the harness's own wake-ups,
/// an order below a scheduler time slice.
pub const OFF_GAP: Duration = Duration::from_micros(50);

/// A tick is live if for at least this share of it the consumer and
/// enough producers were running (see `drive`).
pub const LIVE_TICK_SHARE: f64 = 0.9;

/// Records when a worker thread was not running: it reads the clock once
/// at least 64 events have gone through it since the last reading, and
/// after every backoff, and reports every gap of at least [`OFF_GAP`]
/// between two readings to the harness (which also sees the time of the
/// last reading, so it knows up to when a worker's gaps are all in). Every
/// queue's workers call it at the same points.
struct Presence {
    me: usize,
    epoch: Instant,
    last: Instant,
    n: u32,
    gaps: mpsc::Sender<(usize, u64, u64)>,
    seen: Arc<Vec<Padded<AtomicU64>>>,
}

impl Presence {
    fn new(
        me: usize,
        epoch: Instant,
        gaps: mpsc::Sender<(usize, u64, u64)>,
        seen: Arc<Vec<Padded<AtomicU64>>>,
    ) -> Presence {
        Presence {
            me,
            epoch,
            last: Instant::now(),
            n: 0,
            gaps,
            seen,
        }
    }

    /// After an operation that moved `events` events.
    #[inline]
    fn progress(&mut self, events: u32) {
        self.n += events;
        if self.n >= 64 {
            self.n = 0;
            self.check();
        }
    }

    /// After a backoff (which may have yielded the CPU), and at the end.
    #[inline]
    fn check(&mut self) {
        let now = Instant::now();
        let ns = |t: Instant| u64::try_from((t - self.epoch).as_nanos()).unwrap_or(u64::MAX);
        if now - self.last >= OFF_GAP {
            let _ = self.gaps.send((self.me, ns(self.last), ns(now)));
        }
        self.last = now;
        self.seen[self.me].0.store(ns(now), Ordering::Release);
    }
}

/// One worker's gaps: (from, to), ns since the run's epoch.
type Gaps = Vec<(u64, u64)>;

/// Runs producers and the consumer: every thread first reports in and
/// spins at a start line; once all of them are there the harness lets them
/// go, waits `warmup`, then samples every worker's count of operations
/// every `tick` for `window`. Each worker records when it was not running
/// ([`Presence`]). A tick is *live* if, for at least [`LIVE_TICK_SHARE`] of
/// it, the consumer and at least `min(producers, cores - 1)` producers (at
/// least one) were all running: the most this machine can run at once. The
/// rate is the consumer's events in live ticks over their total length
/// (see [`Sample`]). Every loop checks the stop flag.
fn drive<T: Tx, R: Rx>(tx: T, mut rx: R, cfg: Config, p: &Params) -> Sample {
    let workers = cfg.producers + 1;
    let stop = Arc::new(AtomicBool::new(false));
    let go = Arc::new(AtomicBool::new(false));
    let counts: Arc<Vec<Padded<AtomicU64>>> =
        Arc::new((0..workers).map(|_| Padded(AtomicU64::new(0))).collect());
    let tids: Arc<Vec<Padded<AtomicU64>>> =
        Arc::new((0..workers).map(|_| Padded(AtomicU64::new(0))).collect());
    let ready = Arc::new(Padded(AtomicU64::new(0)));
    let cpus = allowed_cpus();
    let place = placement(cfg.producers, &cpus);
    let need = cfg.producers.min(cpus.len().saturating_sub(1)).max(1);
    let (gap_tx, gap_rx) = mpsc::channel::<(usize, u64, u64)>();
    let seen: Arc<Vec<Padded<AtomicU64>>> =
        Arc::new((0..workers).map(|_| Padded(AtomicU64::new(0))).collect());
    let pinned = Arc::new(AtomicU64::new(0));
    let epoch = Instant::now();
    let producers: Vec<_> = (0..cfg.producers)
        .map(|k| {
            let (tx, stop, go) = (tx.clone(), stop.clone(), go.clone());
            let (counts, tids, ready) = (counts.clone(), tids.clone(), ready.clone());
            let (cpu, pinned) = (place[k], pinned.clone());
            let (gap_tx, seen) = (gap_tx.clone(), seen.clone());
            std::thread::Builder::new()
                .name(format!("tp-producer-{k}"))
                .spawn(move || {
                    if cpu.is_some_and(pin_to) {
                        pinned.fetch_add(1, Ordering::Relaxed);
                    }
                    tids[k].0.store(own_tid(), Ordering::Relaxed);
                    ready.0.fetch_add(1, Ordering::AcqRel);
                    wait_for(&go);
                    let mine = &counts[k].0;
                    let mut i = 0u64;
                    let mut backoff = Backoff::new();
                    let mut presence = Presence::new(k, epoch, gap_tx, seen);
                    while !stop.load(Ordering::Relaxed) {
                        if tx.try_push(i) {
                            i += 1;
                            mine.store(i, Ordering::Relaxed);
                            backoff.reset();
                            presence.progress(1);
                        } else {
                            backoff.snooze();
                            presence.check();
                        }
                    }
                    presence.check();
                })
                .expect("spawning a producer")
        })
        .collect();
    drop(tx);
    let batch = p.batch;
    let consumption = cfg.consumption;
    let consumer = {
        let (stop, go) = (stop.clone(), go.clone());
        let (counts, tids, ready) = (counts.clone(), tids.clone(), ready.clone());
        let me = workers - 1;
        let (cpu, pinned) = (place[me], pinned.clone());
        let (gap_tx, seen) = (gap_tx.clone(), seen.clone());
        std::thread::Builder::new()
            .name("tp-consumer".into())
            .spawn(move || {
                if cpu.is_some_and(pin_to) {
                    pinned.fetch_add(1, Ordering::Relaxed);
                }
                tids[me].0.store(own_tid(), Ordering::Relaxed);
                ready.0.fetch_add(1, Ordering::AcqRel);
                wait_for(&go);
                let mine = &counts[me].0;
                let mut n = 0u64;
                let mut backoff = Backoff::new();
                let mut presence = Presence::new(me, epoch, gap_tx, seen);
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
                        mine.store(n, Ordering::Relaxed);
                        backoff.reset();
                        presence.progress(got as u32);
                    } else {
                        backoff.snooze();
                        presence.check();
                    }
                }
                presence.check();
                drop(rx);
            })
            .expect("spawning the consumer")
    };
    while ready.0.load(Ordering::Acquire) < workers as u64 {
        std::thread::sleep(Duration::from_micros(50));
    }
    let tids: Vec<u64> = tids.iter().map(|t| t.0.load(Ordering::Relaxed)).collect();
    go.store(true, Ordering::Release);
    std::thread::sleep(p.warmup);
    let snap = || -> Vec<u64> { counts.iter().map(|c| c.0.load(Ordering::Relaxed)).collect() };
    let sched =
        || -> Vec<Option<ThreadSched>> { tids.iter().map(|t| ThreadSched::read(*t)).collect() };
    // The counts, stamped with the time halfway through reading them.
    let tick = || {
        let a = epoch.elapsed();
        let counts = snap();
        let b = epoch.elapsed();
        Tick {
            at: a + (b - a) / 2,
            counts,
        }
    };
    let sched0 = sched();
    let t0 = Instant::now();
    let mut timeline = vec![tick()];
    let mut gaps: Vec<Gaps> = vec![Vec::new(); workers];
    // Live time so far, over the ticks up to `done`, whose gaps are all in.
    let (mut live, mut done) = (Duration::ZERO, 0usize);
    while live < p.window {
        let left = p.max_window.saturating_sub(t0.elapsed());
        if left.is_zero() {
            break;
        }
        std::thread::sleep(left.min(p.tick));
        timeline.push(tick());
        for (k, a, b) in gap_rx.try_iter() {
            gaps[k].push((a, b));
        }
        let all_in = seen
            .iter()
            .map(|s| s.0.load(Ordering::Acquire))
            .min()
            .unwrap_or(0);
        while done + 1 < timeline.len() && as_nanos(timeline[done + 1].at) <= all_in {
            let (a, b) = (as_nanos(timeline[done].at), as_nanos(timeline[done + 1].at));
            if running_ns(&gaps, need, a, b) as f64 >= LIVE_TICK_SHARE * (b - a) as f64 {
                live += timeline[done + 1].at - timeline[done].at;
            }
            done += 1;
        }
    }
    let sched1 = sched();
    stop.store(true, Ordering::Relaxed);
    for h in producers {
        let _ = h.join();
    }
    let _ = consumer.join();
    drop(gap_tx);
    for (k, a, b) in gap_rx.try_iter() {
        gaps[k].push((a, b));
    }
    let mut s = summarize(timeline, &gaps, need, &sched0, &sched1);
    s.pinned = pinned.load(Ordering::Relaxed) == workers as u64;
    if !s.pinned {
        // Sides that may share one CPU never run at once: nothing is live.
        s.live_events = 0;
        s.live_secs = 0.0;
    }
    s
}

/// How long, within `[a, b)` (ns), the consumer (the last of `gaps`) and at
/// least `need` producers were all running, given each worker's gaps.
fn running_ns(gaps: &[Gaps], need: usize, a: u64, b: u64) -> u64 {
    let consumer = gaps.len() - 1;
    // (time, worker, +1 going off / -1 coming back)
    let mut edges: Vec<(u64, usize, i32)> = Vec::new();
    for (k, g) in gaps.iter().enumerate() {
        for &(s, e) in g {
            let (s, e) = (s.max(a), e.min(b));
            if s < e {
                edges.push((s, k, 1));
                edges.push((e, k, -1));
            }
        }
    }
    edges.sort_unstable();
    let mut off = vec![0i32; gaps.len()];
    let (mut live, mut at) = (0u64, a);
    let is_live = |off: &[i32]| {
        off[consumer] == 0 && off[..consumer].iter().filter(|o| **o == 0).count() >= need
    };
    for (t, k, d) in edges {
        if is_live(&off) {
            live += t - at;
        }
        at = t;
        off[k] += d;
    }
    if is_live(&off) {
        live += b - at;
    }
    live
}

/// Turns a run's ticks, its workers' gaps and their scheduler figures at
/// the window's two ends into a [`Sample`].
fn summarize(
    timeline: Vec<Tick>,
    gaps: &[Gaps],
    need: usize,
    sched0: &[Option<ThreadSched>],
    sched1: &[Option<ThreadSched>],
) -> Sample {
    let (first, last) = (&timeline[0], &timeline[timeline.len() - 1]);
    let workers = first.counts.len();
    let secs = (last.at - first.at).as_secs_f64();
    let consumer = workers - 1;
    let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let (mut live_events, mut live_secs, mut stall, mut longest) = (0u64, 0.0, 0.0, 0.0f64);
    let (mut running, mut idle_live) = (0u64, 0usize);
    for w in timeline.windows(2) {
        let (a, b) = (ns(w[0].at), ns(w[1].at));
        let dt = (w[1].at - w[0].at).as_secs_f64();
        let run = running_ns(gaps, need, a, b);
        running += run;
        if run as f64 >= LIVE_TICK_SHARE * (b - a) as f64 {
            let got = w[1].counts[consumer] - w[0].counts[consumer];
            idle_live += usize::from(got == 0);
            live_events += got;
            live_secs += dt;
            stall = 0.0;
        } else {
            stall += dt;
            longest = longest.max(stall);
        }
    }
    let frac = |get: fn(&ThreadSched) -> u64| -> Vec<f64> {
        sched0
            .iter()
            .zip(sched1)
            .map(|(a, b)| match (a, b) {
                (Some(a), Some(b)) if secs > 0.0 => {
                    get(b).saturating_sub(get(a)) as f64 / 1e9 / secs
                }
                _ => f64::NAN,
            })
            .collect()
    };
    let (w0, w1) = (ns(first.at), ns(last.at));
    let off_frac = gaps
        .iter()
        .map(|g| {
            let off: u64 = g
                .iter()
                .map(|&(s, e)| e.min(w1).saturating_sub(s.max(w0)))
                .sum();
            if secs > 0.0 {
                off as f64 / 1e9 / secs
            } else {
                f64::NAN
            }
        })
        .collect();
    Sample {
        events: last.counts[consumer] - first.counts[consumer],
        secs,
        live_events,
        live_secs,
        running_frac: if secs > 0.0 {
            running as f64 / 1e9 / secs
        } else {
            0.0
        },
        off_frac,
        pinned: false,
        ticks: timeline.len() - 1,
        idle_live_ticks: idle_live,
        longest_stall_secs: longest,
        cpu_frac: frac(|s| s.run_ns),
        wait_frac: frac(|s| s.wait_ns),
        last_cpu: sched1.iter().map(|s| s.map_or(-1, |s| s.cpu)).collect(),
        timeline,
        gaps: gaps.to_vec(),
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
/// window). Public for profiling and diagnostics (see the
/// `profile_throughput` and `trial_timeline` examples).
pub fn run_single(queue: Queue, cfg: Config, p: &Params) -> Sample {
    run_one(queue, cfg, p)
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
    let mut got: Vec<Vec<Vec<Sample>>> =
        vec![vec![Vec::with_capacity(trials); nq]; Config::ALL.len()];
    for trial in 0..trials {
        for (ci, cfg) in Config::ALL.iter().enumerate() {
            let mut line = format!("{} trial {:>2}/{trials}:", cfg.name(), trial + 1);
            let mut this: Vec<Option<Sample>> = vec![None; nq];
            for k in 0..nq {
                let qi = (k + trial) % nq;
                let mut s = run_single(Queue::ALL[qi], *cfg, p);
                s.timeline = Vec::new();
                this[qi] = Some(s);
            }
            for (qi, s) in this.into_iter().enumerate() {
                let s = s.expect("every queue ran");
                line.push_str(&format!(
                    " {} {:.1}M{}",
                    Queue::ALL[qi].name(),
                    s.live_rate() / 1e6,
                    if s.starved(p) {
                        format!(" (starved: live {:.1} ms)", 1e3 * s.live_secs)
                    } else {
                        String::new()
                    }
                ));
                got[ci][qi].push(s);
            }
            progress(&line);
        }
    }
    rows_of(&got, p)
}

/// The report rows from every run's sample, `got[config][queue][trial]`.
fn rows_of(got: &[Vec<Vec<Sample>>], p: &Params) -> Vec<Row> {
    let peer_idx = Queue::ALL
        .iter()
        .position(|q| *q == Queue::Crossbeam)
        .unwrap_or(0);
    let mut rows = Vec::new();
    for (ci, cfg) in Config::ALL.iter().enumerate() {
        for (qi, q) in Queue::ALL.iter().enumerate() {
            let mut discarded = Vec::new();
            let ratios: Vec<f64> = got[ci][qi]
                .iter()
                .zip(&got[ci][peer_idx])
                .enumerate()
                .map(|(trial, (a, b))| {
                    let mut why = Vec::new();
                    for (name, s) in [(q.name(), a), (Queue::Crossbeam.name(), b)] {
                        if s.starved(p) && !why.iter().any(|w: &String| w.starts_with(name)) {
                            why.push(format!(
                                "{name}: live {:.1} ms, wanted {:.1}, window {:.1} ms{}",
                                1e3 * s.live_secs,
                                1e3 * p.window.as_secs_f64(),
                                1e3 * s.secs,
                                if s.pinned { "" } else { ", threads not pinned" }
                            ));
                        }
                    }
                    if why.is_empty() {
                        ratio(a.live_rate(), b.live_rate())
                    } else {
                        discarded.push(Discarded {
                            trial,
                            reason: why.join(", "),
                        });
                        f64::NAN
                    }
                })
                .collect();
            let of = |get: fn(&Sample) -> f64| -> Summary {
                Summary::of(&got[ci][qi].iter().map(get).collect::<Vec<_>>())
            };
            rows.push(Row {
                id: format!("throughput/{}/{}", cfg.name(), q.name()),
                producers: cfg.producers,
                consumption: cfg.consumption,
                queue: *q,
                peer: Queue::Crossbeam,
                events_per_s: of(Sample::live_rate),
                raw_events_per_s: of(Sample::raw_rate),
                live_frac: of(Sample::live_frac),
                ratio_vs_peer: Summary::of(&ratios),
                discarded,
            });
        }
    }
    rows
}
