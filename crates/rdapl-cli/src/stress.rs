//! `rdapl evd-stress`: the seed's consumer flow under load, checked.
//!
//! # What runs
//!
//! For each [`Mode`], `producers` threads feed `evds` Event Dispatchers
//! through the provider-facing API: a DTO completion is posted as
//! [`Evd::reserve`] then [`Evd::complete`] (a refused reservation means the
//! EVD is full: the producer yields and retries, which is back-pressure, not
//! a loss), and now and then a software event is posted with
//! [`Evd::post_se`] (`QueueFull`: yield and retry). Producer `p` feeds EVD
//! `p % evds`.
//!
//! Each EVD has one consumer that follows the flow of the 2005 kDAPL thread
//! (`shared/seed`): the upcall consumes `switch_every` events itself, then
//! disables upcalls (`modify_upcall(Disable)`) and hands the EVD to a
//! polling thread; the polling thread polls it with `dequeue`,
//! `dequeue_batch` and, now and then, `wait(threshold 1, short timeout)`,
//! either until it is empty (the seed's "dequeue all", capped at `qlen`
//! events) or, more often, for
//! `switch_every` events, so that re-enables meet queued events and new
//! arrivals as often as possible; then it re-enables upcalls:
//!
//! * [`Mode::Strict`]: `ReEnable::Strict`; on `Busy` it keeps polling in its
//!   own context (the seed's patch).
//! * [`Mode::OnAny`]: `ReEnable::OnAny`; queued events are delivered by
//!   upcall.
//! * [`Mode::OnNew`]: `ReEnable::OnNew`; if the returned pending count is not
//!   zero it polls again.
//! * [`Mode::Many`]: the same flow under the `Many` policy (several upcalls
//!   at once), cycling through the three re-enable modes.
//! * [`Mode::Poller`]: no hand-written flow at all: the EVDs are attached to
//!   [`rdapl::Poller`]s, one re-arming with `OnNew`, one with `Strict`.
//!
//! # One consumer at a time
//!
//! Under `SingleInstance` the consumer keeps exactly one context consuming
//! at any moment (the upcall or the polling thread), so the order in which
//! it records events is the order in which the EVD handed them out. A
//! `phase` word owned by compare-and-swap decides who drives the flow: the
//! upcall that reaches `switch_every` takes it (then disables and hands
//! off), and the polling thread gives it back just before it re-enables.
//! With `OnNew` and a non-zero pending count, upcalls are on again while
//! events are queued; the polling thread takes the phase back and, before
//! polling again, quiesces upcalls with `Teardown` (which returns only after
//! a running upcall has returned), so an upcall never races the thread.
//!
//! # What is checked
//!
//! Every event carries (producer, stream, sequence number). The [`Checker`]
//! keeps, per (producer, stream), the lowest sequence not yet seen and a
//! sliding bitmap above it (its size is the reorder distance, a few words in
//! practice), so memory stays bounded however many events run:
//!
//! * **lost**: produced but never seen;
//! * **duplicated**: seen more than once;
//! * **out of order**: seen after a later event of the same (producer,
//!   stream). Under `SingleInstance` and the poller this is checked across
//!   the whole consumer; under `Many`, where several upcalls legitimately
//!   run at once, it is checked per consuming thread (each thread must see
//!   every stream in increasing order), plus exactly-once globally;
//! * **hang**: a mode that has not seen every event within `max_time`.
//!   Every loop of the harness checks the deadline, so a hang is reported,
//!   never suffered.
//!
//! [`StressConfig::fault`] injects a consumer-side fault (drop, duplicate or
//! delay one event, or skip one re-enable) so tests can show that each check
//! really fails when it should.

use clap::ValueEnum;
use rdapl::evd::EvdProducer;
use rdapl::event::EpHandle;
use rdapl::{
    Dispatch, Dispatcher, DtoCompletion, DtoOp, DtoStatus, Error, Evd, EvdFlags, Event, Poller,
    PollerConfig, PollerEntry, ReEnable, UpcallPolicy,
};
use std::collections::{HashMap, VecDeque};
use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle, ThreadId};
use std::time::{Duration, Instant};

// ----- configuration -------------------------------------------------------

/// One way of consuming events, run as its own pass of the stress test.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, ValueEnum)]
pub enum Mode {
    /// SingleInstance upcalls, re-enabled with `ReEnable::Strict`: on
    /// `Busy` the polling thread keeps polling.
    Strict,
    /// SingleInstance upcalls, re-enabled with `ReEnable::OnAny`: queued
    /// events are delivered by upcall.
    OnAny,
    /// SingleInstance upcalls, re-enabled with `ReEnable::OnNew`: a non-zero
    /// pending count means poll again.
    OnNew,
    /// `rdapl::Poller` (notify-only upcall, polling worker), one poller
    /// re-arming with `OnNew` and one with `Strict`.
    Poller,
    /// Many upcalls (several run at once), re-enabled with Strict, OnAny and
    /// OnNew in turn.
    Many,
}

impl Mode {
    /// Every mode, in the order they run by default.
    pub const ALL: [Mode; 5] = [
        Mode::Strict,
        Mode::OnAny,
        Mode::OnNew,
        Mode::Poller,
        Mode::Many,
    ];

    /// The name used on the command line and in the table.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Strict => "strict",
            Mode::OnAny => "on-any",
            Mode::OnNew => "on-new",
            Mode::Poller => "poller",
            Mode::Many => "many",
        }
    }

    /// The upcall policy of the hand-written flow (`None` for the poller).
    fn policy(self) -> Option<UpcallPolicy> {
        match self {
            Mode::Strict | Mode::OnAny | Mode::OnNew => Some(UpcallPolicy::SingleInstance),
            Mode::Many => Some(UpcallPolicy::Many),
            Mode::Poller => None,
        }
    }

    /// The re-enable modes the polling thread cycles through.
    fn re_enables(self) -> &'static [ReEnable] {
        match self {
            Mode::Strict => &[ReEnable::Strict],
            Mode::OnAny => &[ReEnable::OnAny],
            Mode::OnNew => &[ReEnable::OnNew],
            Mode::Many => &[ReEnable::Strict, ReEnable::OnAny, ReEnable::OnNew],
            Mode::Poller => &[],
        }
    }

    /// How event order is checked in this mode.
    fn order_scope(self) -> OrderScope {
        match self {
            Mode::Many => OrderScope::PerThread,
            _ => OrderScope::Global,
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The default number of events per mode.
pub const DEFAULT_EVENTS: u64 = 2_000_000;

/// Settings of one stress run (every mode uses the same).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StressConfig {
    /// Producer threads.
    pub producers: usize,
    /// Events per mode, over all producers.
    pub events: u64,
    /// Queue length of each EVD.
    pub qlen: usize,
    /// EVDs fed (producer `p` feeds EVD `p % evds`; the poller mode uses at
    /// least two, one per poller).
    pub evds: usize,
    /// Events the upcall consumes itself before it hands off to polling.
    pub switch_every: u64,
    /// Wall-clock limit of each mode; hitting it is a hang.
    pub max_time: Duration,
    /// Seed of the pseudo-random choices (event mix, dequeue forms, yields).
    pub seed: u64,
    /// A deliberate consumer-side fault (tests use it to prove that the
    /// checker catches each kind of failure); `None` in real runs.
    pub fault: Option<Fault>,
}

/// A deliberate consumer-side fault, injected to prove the checks can fail.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The consumer of each EVD forgets the n-th event it receives (1-based).
    Drop(u64),
    /// The consumer of each EVD records its n-th event twice.
    Duplicate(u64),
    /// The consumer of each EVD records its n-th event only after the next
    /// event of the same (producer, stream).
    Delay(u64),
    /// The polling thread of each EVD once ends a poll phase without
    /// re-enabling upcalls: the seed's lost wakeup, made real.
    SkipReEnable,
}

impl Default for StressConfig {
    fn default() -> Self {
        StressConfig {
            producers: 4,
            events: DEFAULT_EVENTS,
            qlen: 256,
            evds: 2,
            switch_every: 5,
            max_time: Duration::from_secs(60),
            seed: 0x5eed_da71,
            fault: None,
        }
    }
}

impl StressConfig {
    /// Checks the settings; the message says what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.producers == 0 || self.producers > MAX_PRODUCERS {
            return Err(format!("--producers must be between 1 and {MAX_PRODUCERS}"));
        }
        if self.events == 0 || self.events >= 1 << SW_SEQ_BITS {
            return Err("--events must be at least 1 (and below 2^40)".into());
        }
        if self.qlen == 0 || self.qlen > rdapl::evd::MAX_QLEN {
            return Err(format!(
                "--qlen must be between 1 and {}",
                rdapl::evd::MAX_QLEN
            ));
        }
        if self.evds == 0 || self.evds > 64 {
            return Err("--evds must be between 1 and 64".into());
        }
        if self.switch_every == 0 {
            return Err("--switch-every must be at least 1".into());
        }
        if self.max_time.is_zero() {
            return Err("--max-seconds must be positive".into());
        }
        Ok(())
    }
}

/// Most producers a run accepts (the producer id must fit the software
/// event encoding).
pub const MAX_PRODUCERS: usize = 1 << 16;

// ----- event encoding ------------------------------------------------------

/// The two event streams the producers use.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum StreamKind {
    /// DTO completions (`reserve` + `complete`): producer in `ep`, sequence
    /// in `cookie`.
    Dto = 0,
    /// Software events (`post_se`): producer and sequence packed in the value.
    Software = 1,
}

const SW_SEQ_BITS: u32 = 40;
const SW_SEQ_MASK: u64 = (1 << SW_SEQ_BITS) - 1;

/// The DTO completion a producer posts for its `seq`-th DTO.
pub fn dto_event(producer: usize, seq: u64) -> Event {
    Event::Dto(DtoCompletion {
        ep: EpHandle(producer as u64),
        consumer_context: 0,
        cookie: seq,
        status: DtoStatus::Success,
        transferred_length: seq & 0xFFFF,
        operation: DtoOp::Send,
        rmr_context: 0,
        buf: None,
    })
}

/// The software event value a producer posts for its `seq`-th software event.
pub fn software_value(producer: usize, seq: u64) -> u64 {
    ((producer as u64) << SW_SEQ_BITS) | (seq & SW_SEQ_MASK)
}

/// Decodes (producer, stream, sequence) from an event the harness posted.
pub fn decode(ev: &Event) -> Option<(usize, StreamKind, u64)> {
    match ev {
        Event::Dto(d) => Some((d.ep.0 as usize, StreamKind::Dto, d.cookie)),
        Event::Software(v) => Some((
            (v >> SW_SEQ_BITS) as usize,
            StreamKind::Software,
            v & SW_SEQ_MASK,
        )),
        _ => None,
    }
}

// ----- checker -------------------------------------------------------------

/// How the [`Checker`] judges order.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum OrderScope {
    /// All events of a (producer, stream) must be recorded in increasing
    /// order, whichever thread records them (one consumer at a time).
    Global,
    /// Each recording thread must see each (producer, stream) in increasing
    /// order (concurrent consumers, `Many` policy).
    PerThread,
}

/// Words of the sliding bitmap at most (4 Mi sequence numbers ahead of the
/// lowest unseen one); an event further ahead is counted as invalid.
const MAX_WINDOW_WORDS: usize = 1 << 16;

#[derive(Clone, Debug, Default)]
struct StreamCheck {
    /// Every sequence below `base` was seen.
    base: u64,
    /// Bit `i` of word `w`: sequence `base + 64 * w + i` was seen.
    window: VecDeque<u64>,
    /// One past the highest sequence seen.
    high: u64,
    unique: u64,
    duplicated: u64,
    out_of_order: u64,
}

enum Seen {
    New { late: bool },
    Duplicate,
    TooFar,
}

impl StreamCheck {
    fn insert(&mut self, seq: u64) -> Seen {
        if seq < self.base {
            self.duplicated += 1;
            return Seen::Duplicate;
        }
        let off = seq - self.base;
        let word = (off / 64) as usize;
        let bit = 1u64 << (off % 64);
        if word >= MAX_WINDOW_WORDS {
            return Seen::TooFar;
        }
        if word >= self.window.len() {
            self.window.resize(word + 1, 0);
        }
        if self.window[word] & bit != 0 {
            self.duplicated += 1;
            return Seen::Duplicate;
        }
        self.window[word] |= bit;
        self.unique += 1;
        let late = seq < self.high;
        if !late {
            self.high = seq + 1;
        }
        while self.window.front() == Some(&u64::MAX) {
            self.window.pop_front();
            self.base += 64;
        }
        Seen::New { late }
    }

    /// How many distinct sequences `>= n` were seen.
    fn seen_at_or_above(&self, n: u64) -> u64 {
        let in_window = |from_off: u64| -> u64 {
            self.window
                .iter()
                .enumerate()
                .map(|(w, bits)| {
                    let lo = w as u64 * 64;
                    if lo + 64 <= from_off {
                        0
                    } else if lo >= from_off {
                        u64::from(bits.count_ones())
                    } else {
                        u64::from((bits >> (from_off - lo)).count_ones())
                    }
                })
                .sum()
        };
        if n <= self.base {
            (self.base - n) + in_window(0)
        } else {
            in_window(n - self.base)
        }
    }
}

/// What a [`Checker`] concluded, given what was produced.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Distinct produced events seen.
    pub seen: u64,
    /// Produced, never seen.
    pub lost: u64,
    /// Extra deliveries of an event already seen.
    pub duplicated: u64,
    /// Events seen after a later event of their (producer, stream).
    pub out_of_order: u64,
    /// Events that were never produced (unknown producer, a sequence beyond
    /// what was produced, a foreign event type).
    pub invalid: u64,
}

impl Tally {
    /// Adds another tally.
    pub fn add(&mut self, o: &Tally) {
        self.seen += o.seen;
        self.lost += o.lost;
        self.duplicated += o.duplicated;
        self.out_of_order += o.out_of_order;
        self.invalid += o.invalid;
    }

    /// True if nothing was lost, duplicated, reordered or invented.
    pub fn clean(&self) -> bool {
        self.lost == 0 && self.duplicated == 0 && self.out_of_order == 0 && self.invalid == 0
    }
}

/// Exactly-once and order checker with memory bounded by the reorder
/// distance, not by the number of events.
#[derive(Clone, Debug)]
pub struct Checker {
    producers: usize,
    scope: OrderScope,
    /// Index `producer * 2 + stream`.
    streams: Vec<StreamCheck>,
    /// Per-thread "one past the last sequence seen", for `PerThread`.
    per_thread: HashMap<ThreadId, Vec<u64>>,
    per_thread_ooo: u64,
    invalid: u64,
    unique: u64,
}

impl Checker {
    /// A checker for events of `producers` producers.
    pub fn new(producers: usize, scope: OrderScope) -> Checker {
        Checker {
            producers,
            scope,
            streams: vec![StreamCheck::default(); producers * 2],
            per_thread: HashMap::new(),
            per_thread_ooo: 0,
            invalid: 0,
            unique: 0,
        }
    }

    /// Records one delivered event.
    pub fn record(&mut self, ev: &Event) {
        match decode(ev) {
            Some((p, stream, seq)) => self.record_seq(p, stream, seq),
            None => self.invalid += 1,
        }
    }

    /// Records the delivery of (producer, stream, seq).
    pub fn record_seq(&mut self, producer: usize, stream: StreamKind, seq: u64) {
        if producer >= self.producers {
            self.invalid += 1;
            return;
        }
        let key = producer * 2 + stream as usize;
        match self.streams[key].insert(seq) {
            Seen::Duplicate => {}
            Seen::TooFar => self.invalid += 1,
            Seen::New { late } => {
                self.unique += 1;
                match self.scope {
                    OrderScope::Global => {
                        if late {
                            self.streams[key].out_of_order += 1;
                        }
                    }
                    OrderScope::PerThread => {
                        let keys = self.streams.len();
                        let next = &mut self
                            .per_thread
                            .entry(thread::current().id())
                            .or_insert_with(|| vec![0; keys])[key];
                        if seq < *next {
                            self.per_thread_ooo += 1;
                        } else {
                            *next = seq + 1;
                        }
                    }
                }
            }
        }
    }

    /// Distinct events recorded so far (produced or not).
    pub fn unique(&self) -> u64 {
        self.unique
    }

    /// The verdict, given how many events each producer produced on each
    /// stream (`produced[p][stream]`; producers beyond the slice produced
    /// nothing).
    pub fn tally(&self, produced: &[[u64; 2]]) -> Tally {
        let mut t = Tally {
            invalid: self.invalid,
            out_of_order: self.per_thread_ooo,
            ..Tally::default()
        };
        for (key, s) in self.streams.iter().enumerate() {
            let made = produced.get(key / 2).map_or(0, |p| p[key % 2]);
            let phantom = s.seen_at_or_above(made);
            let real = s.unique - phantom;
            t.seen += real;
            t.lost += made - real;
            t.invalid += phantom;
            t.duplicated += s.duplicated;
            t.out_of_order += s.out_of_order;
        }
        t
    }
}

// ----- report --------------------------------------------------------------

/// The outcome of one mode.
#[derive(Clone, Debug, PartialEq)]
pub struct ModeReport {
    /// The mode.
    pub mode: Mode,
    /// Events the producers were asked to post.
    pub expected: u64,
    /// Events the producers did post.
    pub produced: u64,
    /// Wall-clock time from the first post to the last event seen.
    pub elapsed: Duration,
    /// Upcalls made (event upcalls, or the poller's notify-only upcalls).
    pub upcalls: u64,
    /// Times the consumer switched to polling (hand-offs; poller runs).
    pub poll_phases: u64,
    /// Re-enables that found events queued and polled again (`Busy`, or a
    /// non-zero pending count).
    pub repolls: u64,
    /// Upcalls that ran while the polling thread drove the flow (an upcall
    /// started in the `OnNew` window before the quiesce, or a concurrent
    /// `Many` upcall): the overlaps the seed warns about, handled.
    pub overlaps: u64,
    /// The checker's verdict.
    pub tally: Tally,
    /// Events found still queued when the mode ended; they are drained and
    /// checked too. After a hang with upcalls enabled or a polling thread
    /// idle, these are events nobody was told about.
    pub stranded: u64,
    /// The mode did not finish within the time limit.
    pub hang: bool,
    /// Unexpected errors and diagnostics.
    pub notes: Vec<String>,
}

impl ModeReport {
    /// True if every event was seen exactly once, in order, in time, and no
    /// call failed unexpectedly.
    pub fn passed(&self) -> bool {
        !self.hang && self.tally.clean() && self.produced == self.expected && self.notes.is_empty()
    }

    /// Distinct events seen per second.
    pub fn events_per_second(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            self.tally.seen as f64 / s
        } else {
            0.0
        }
    }

    /// Upcalls per event seen.
    pub fn upcalls_per_event(&self) -> f64 {
        if self.tally.seen > 0 {
            self.upcalls as f64 / self.tally.seen as f64
        } else {
            0.0
        }
    }
}

/// The table's column headers.
pub const COLUMNS: [&str; 13] = [
    "mode",
    "events",
    "seconds",
    "events/s",
    "upcalls",
    "upcalls/event",
    "poll-phases",
    "re-polls",
    "overlaps",
    "lost",
    "duplicated",
    "out-of-order",
    "hang",
];

/// Formats reports as an aligned table (header first; the mode column is
/// left-aligned, numbers right-aligned).
pub fn format_table(reports: &[ModeReport]) -> String {
    let mut rows: Vec<Vec<String>> = vec![COLUMNS.iter().map(|c| c.to_string()).collect()];
    for r in reports {
        rows.push(vec![
            r.mode.name().to_string(),
            r.tally.seen.to_string(),
            format!("{:.2}", r.elapsed.as_secs_f64()),
            format!("{:.0}", r.events_per_second()),
            r.upcalls.to_string(),
            format!("{:.4}", r.upcalls_per_event()),
            r.poll_phases.to_string(),
            r.repolls.to_string(),
            r.overlaps.to_string(),
            r.tally.lost.to_string(),
            r.tally.duplicated.to_string(),
            r.tally.out_of_order.to_string(),
            if r.hang { "HANG" } else { "no" }.to_string(),
        ]);
    }
    let widths: Vec<usize> = (0..COLUMNS.len())
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c > 0 {
                line.push_str("  ");
            }
            if c == 0 {
                let _ = write!(line, "{cell:<w$}", w = widths[c]);
            } else {
                let _ = write!(line, "{cell:>w$}", w = widths[c]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

// ----- shared pieces -------------------------------------------------------

/// A small, fast PRNG (xorshift64*), one per thread.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        // splitmix64 of the seed, never zero.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Unexpected errors of one mode (the first few kept verbatim).
#[derive(Default)]
struct Errors {
    list: Mutex<Vec<String>>,
    count: AtomicU64,
}

impl Errors {
    const KEEP: usize = 16;

    fn push(&self, msg: String) {
        self.count.fetch_add(1, Ordering::SeqCst);
        let mut l = lock(&self.list);
        if l.len() < Self::KEEP {
            l.push(msg);
        }
    }

    fn take(&self) -> Vec<String> {
        let mut l = std::mem::take(&mut *lock(&self.list));
        let n = self.count.load(Ordering::SeqCst) as usize;
        if n > l.len() {
            l.push(format!("... and {} more error(s)", n - l.len()));
        }
        l
    }
}

/// Stop flag plus deadline: every loop of the harness checks this.
#[derive(Clone)]
struct Stop {
    flag: Arc<AtomicBool>,
    deadline: Instant,
}

impl Stop {
    fn stopped(&self) -> bool {
        self.flag.load(Ordering::Relaxed) || Instant::now() >= self.deadline
    }
}

/// The consumer-side record of one EVD: its checker and progress counter.
struct Shard {
    checker: Mutex<Recorder>,
    unique: AtomicU64,
    fault: Option<Fault>,
}

struct Recorder {
    checker: Checker,
    /// Events handed to `record` so far.
    received: u64,
    /// An event a `Fault::Delay` holds back.
    held: Option<Event>,
}

fn same_stream(a: &Event, b: &Event) -> bool {
    match (decode(a), decode(b)) {
        (Some((p, s, _)), Some((q, t, _))) => p == q && s == t,
        _ => false,
    }
}

impl Shard {
    fn new(producers: usize, scope: OrderScope, fault: Option<Fault>) -> Shard {
        Shard {
            checker: Mutex::new(Recorder {
                checker: Checker::new(producers, scope),
                received: 0,
                held: None,
            }),
            unique: AtomicU64::new(0),
            fault,
        }
    }

    fn record(&self, events: &[Event]) {
        let mut r = lock(&self.checker);
        for ev in events {
            r.received += 1;
            match self.fault {
                None | Some(Fault::SkipReEnable) => r.checker.record(ev),
                Some(Fault::Drop(n)) => {
                    if r.received != n {
                        r.checker.record(ev);
                    }
                }
                Some(Fault::Duplicate(n)) => {
                    r.checker.record(ev);
                    if r.received == n {
                        r.checker.record(ev);
                    }
                }
                Some(Fault::Delay(n)) => {
                    if r.received == n {
                        r.held = Some(ev.clone());
                        continue;
                    }
                    r.checker.record(ev);
                    if r.held.as_ref().is_some_and(|h| same_stream(h, ev))
                        && let Some(h) = r.held.take()
                    {
                        r.checker.record(&h);
                    }
                }
            }
        }
        let unique = r.checker.unique();
        self.unique.store(unique, Ordering::SeqCst);
    }
}

// ----- producers -----------------------------------------------------------

/// A producer's progress: events posted per stream (readable at any time).
#[derive(Default)]
struct Posted([AtomicU64; 2]);

impl Posted {
    fn get(&self) -> [u64; 2] {
        [
            self.0[0].load(Ordering::SeqCst),
            self.0[1].load(Ordering::SeqCst),
        ]
    }
}

fn produce(
    id: usize,
    evd: &Evd,
    quota: u64,
    seed: u64,
    stop: &Stop,
    posted: &Posted,
    errors: &Errors,
) {
    let _feeder = evd.feeder();
    let mut rng = Rng::new(seed ^ ((id as u64 + 1) << 32));
    let mut seq = [0u64; 2];
    let mut sent = 0u64;
    let mut until_yield = 1 + rng.below(64);
    let mut held = Vec::with_capacity(4);
    let mut iter = 0u32;
    'work: while sent < quota {
        iter = iter.wrapping_add(1);
        if stop.flag.load(Ordering::Relaxed) || (iter.is_multiple_of(128) && stop.stopped()) {
            break;
        }
        if rng.below(8) == 0 {
            // A software event; QueueFull means "full right now": retry.
            let value = software_value(id, seq[1]);
            loop {
                match evd.post_se(value) {
                    Ok(()) => break,
                    Err(Error::QueueFull) => {
                        if stop.stopped() {
                            break 'work;
                        }
                        thread::yield_now();
                    }
                    Err(e) => {
                        errors.push(format!("producer {id}: post_se: {e}"));
                        break 'work;
                    }
                }
            }
            seq[1] += 1;
            sent += 1;
            posted.0[1].store(seq[1], Ordering::SeqCst);
        } else {
            // A few DTOs "posted" (slots reserved), then completed in order.
            let want = (1 + rng.below(4)).min(quota - sent) as usize;
            let mut failed = false;
            while held.len() < want {
                match evd.reserve() {
                    Ok(r) => held.push(r),
                    Err(Error::InsufficientResources { .. }) => {
                        // Full: complete what is held first (holding slots
                        // while waiting for more could starve everyone).
                        if !held.is_empty() {
                            break;
                        }
                        if stop.stopped() {
                            break 'work;
                        }
                        thread::yield_now();
                    }
                    Err(e) => {
                        errors.push(format!("producer {id}: reserve: {e}"));
                        failed = true;
                        break;
                    }
                }
            }
            for r in held.drain(..) {
                evd.complete(r, dto_event(id, seq[0]))
                    .expect("reserved on this EVD");
                seq[0] += 1;
                sent += 1;
            }
            posted.0[0].store(seq[0], Ordering::SeqCst);
            if failed {
                break;
            }
        }
        until_yield -= 1;
        if until_yield == 0 {
            // Let the queue drain now and then, so the consumer goes back to
            // upcalls instead of polling forever.
            thread::yield_now();
            until_yield = 1 + rng.below(64);
        }
    }
}

// ----- the seed's flow, hand-written ---------------------------------------

const PHASE_UPCALL: u8 = 0;
const PHASE_POLL: u8 = 1;

/// One EVD's consumer: the upcall and its polling thread.
struct Flow {
    policy: UpcallPolicy,
    re_enables: &'static [ReEnable],
    switch_every: u64,
    /// Most events one "until empty" drain takes.
    qlen: u64,
    /// Who drives the flow: the upcall (`PHASE_UPCALL`) or the polling
    /// thread (`PHASE_POLL`). Taken by compare-and-swap.
    phase: AtomicU8,
    /// Events the upcall consumed in the current upcall phase.
    in_phase: AtomicU64,
    upcalls: AtomicU64,
    handoffs: AtomicU64,
    repolls: AtomicU64,
    /// Upcalls that ran while the polling thread drove the flow.
    overlaps: AtomicU64,
    shard: Arc<Shard>,
    tx: mpsc::Sender<()>,
    errors: Arc<Errors>,
    /// `Fault::SkipReEnable` not yet injected.
    skip_re_enable: AtomicBool,
}

impl Flow {
    /// The upcall: consume the event; after `switch_every` of them, disable
    /// upcalls and hand the EVD to the polling thread.
    fn upcall(&self, evd: &Evd, event: Option<Event>) {
        self.upcalls.fetch_add(1, Ordering::Relaxed);
        match event {
            Some(ev) => {
                self.shard.record(std::slice::from_ref(&ev));
                if decode(&ev).is_some_and(|(_, _, seq)| seq % 32 == 7) {
                    // Now and then a slow upcall: concurrent Many upcalls and
                    // the hand-off then overlap more often.
                    thread::yield_now();
                }
            }
            None => self
                .errors
                .push(format!("{:?} upcall without an event", self.policy)),
        }
        if self.phase.load(Ordering::SeqCst) != PHASE_UPCALL {
            // The polling thread drives the flow (an OnNew re-poll, or a
            // concurrent Many upcall): consuming the event was all to do.
            self.overlaps.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let n = self.in_phase.fetch_add(1, Ordering::SeqCst) + 1;
        if n >= self.switch_every
            && self
                .phase
                .compare_exchange(PHASE_UPCALL, PHASE_POLL, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            self.handoffs.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = evd.modify_upcall(UpcallPolicy::Disable, None, ReEnable::Strict) {
                self.errors
                    .push(format!("upcall: modify_upcall(Disable): {e}"));
            }
            // The run is ending when the polling thread has gone: ignore.
            let _ = self.tx.send(());
        }
    }

    /// The polling thread gives up the phase just before re-enabling; this
    /// takes it back. False: an upcall took it first and has queued a
    /// hand-off, which will start the next poll phase.
    fn take_back(&self) -> bool {
        self.phase
            .compare_exchange(PHASE_UPCALL, PHASE_POLL, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// Dequeues until a dequeue form reports empty or `budget` events were
    /// taken. False: stop.
    fn drain(
        &self,
        evd: &Evd,
        budget: u64,
        rng: &mut Rng,
        batch: &mut Vec<Event>,
        stop: &Stop,
    ) -> bool {
        let mut iter = 0u32;
        let mut taken = 0u64;
        while taken < budget {
            iter = iter.wrapping_add(1);
            if iter.is_multiple_of(64) && stop.stopped() {
                return false;
            }
            let got = match rng.below(10) {
                0..=4 => match evd.dequeue() {
                    Ok(Some(ev)) => {
                        self.shard.record(std::slice::from_ref(&ev));
                        1
                    }
                    Ok(None) => 0,
                    Err(e) => {
                        self.errors.push(format!("poll: dequeue: {e}"));
                        return false;
                    }
                },
                5..=8 => {
                    batch.clear();
                    let max = (1 + rng.below(32)).min(budget - taken) as usize;
                    match evd.dequeue_batch(batch, max) {
                        Ok(n) => {
                            self.shard.record(batch);
                            n
                        }
                        Err(e) => {
                            self.errors.push(format!("poll: dequeue_batch: {e}"));
                            return false;
                        }
                    }
                }
                _ => match evd.wait(Some(Duration::from_micros(200)), 1) {
                    Ok((ev, _nmore)) => {
                        self.shard.record(std::slice::from_ref(&ev));
                        1
                    }
                    Err(Error::TimeoutExpired { .. }) => 0,
                    Err(e) => {
                        self.errors.push(format!("poll: wait: {e}"));
                        return false;
                    }
                },
            };
            if got == 0 {
                return true;
            }
            taken += got as u64;
        }
        true
    }

    /// One poll phase: drain, re-enable in `mode`, and go on polling while
    /// the re-enable says events are pending (`Busy`, or `OnNew`'s count).
    fn poll_phase(
        &self,
        evd: &Evd,
        mode: ReEnable,
        rng: &mut Rng,
        batch: &mut Vec<Event>,
        stop: &Stop,
    ) {
        loop {
            // A quarter of the time drain until empty (the seed's "dequeue
            // all", capped at one queue's worth so a steady stream cannot
            // keep the consumer polling forever); otherwise try to re-enable
            // after a few events, so that re-enables meet queued events and
            // arrivals as often as possible.
            let budget = if rng.below(4) == 0 {
                self.qlen
            } else {
                self.switch_every
            };
            if !self.drain(evd, budget, rng, batch, stop) {
                return;
            }
            if self.skip_re_enable.swap(false, Ordering::SeqCst) {
                return; // injected fault: upcalls stay off, nobody polls
            }
            // Give the flow back to the upcall, then re-enable: an upcall
            // that runs as soon as upcalls are on must find its phase.
            self.in_phase.store(0, Ordering::SeqCst);
            self.phase.store(PHASE_UPCALL, Ordering::SeqCst);
            match evd.modify_upcall(self.policy, None, mode) {
                Ok(0) => return,
                Ok(pending) if mode == ReEnable::Strict => {
                    self.errors.push(format!(
                        "Strict re-enable returned Ok({pending}) instead of Busy"
                    ));
                    return;
                }
                // OnAny: the queued events are delivered by upcall.
                Ok(_) if mode == ReEnable::OnAny => return,
                Ok(_) => {
                    // OnNew with events pending: poll again. Upcalls are on
                    // meanwhile; take the flow back and quiesce them first so
                    // no upcall races this thread (Many may race: several
                    // consumers at once is what that policy means).
                    self.repolls.fetch_add(1, Ordering::Relaxed);
                    if !self.take_back() {
                        return;
                    }
                    if rng.below(4) == 0 {
                        // Widen the window in which a new arrival's upcall
                        // overlaps this thread, so the quiesce is exercised.
                        thread::yield_now();
                    }
                    let quiesce = if self.policy == UpcallPolicy::Many {
                        UpcallPolicy::Disable
                    } else {
                        UpcallPolicy::Teardown
                    };
                    if let Err(e) = evd.modify_upcall(quiesce, None, mode) {
                        self.errors
                            .push(format!("poll: modify_upcall({quiesce:?}) after OnNew: {e}"));
                        return;
                    }
                }
                Err(Error::Busy { .. }) => {
                    // Strict refusal: upcalls stayed off; keep polling here.
                    self.repolls.fetch_add(1, Ordering::Relaxed);
                    if !self.take_back() {
                        return;
                    }
                }
                Err(e) => {
                    self.errors.push(format!(
                        "poll: modify_upcall({:?}, {mode:?}): {e}",
                        self.policy
                    ));
                    return;
                }
            }
        }
    }
}

fn poll_thread(flow: Arc<Flow>, evd: Evd, rx: mpsc::Receiver<()>, stop: Stop, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut batch = Vec::with_capacity(32);
    let mut phases = 0usize;
    while !stop.stopped() {
        match rx.recv_timeout(Duration::from_millis(2)) {
            Ok(()) => {
                let mode = flow.re_enables[phases % flow.re_enables.len()];
                phases += 1;
                flow.poll_phase(&evd, mode, &mut rng, &mut batch, &stop);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
}

// ----- running a mode ------------------------------------------------------

enum Consumers {
    Flows {
        flows: Vec<Arc<Flow>>,
        threads: Vec<JoinHandle<()>>,
    },
    Pollers {
        pollers: Vec<Poller>,
        entries: Vec<(usize, PollerEntry)>,
    },
}

/// Copies the consumers' counters into the report.
fn consumer_stats(c: &Consumers, r: &mut ModeReport) {
    match c {
        Consumers::Flows { flows, .. } => {
            for f in flows {
                r.upcalls += f.upcalls.load(Ordering::Relaxed);
                r.poll_phases += f.handoffs.load(Ordering::Relaxed);
                r.repolls += f.repolls.load(Ordering::Relaxed);
                r.overlaps += f.overlaps.load(Ordering::Relaxed);
            }
        }
        Consumers::Pollers { entries, .. } => {
            for (_, e) in entries {
                let s = e.stats();
                r.upcalls += s.upcalls;
                r.poll_phases += s.runs;
                r.repolls += s.rearm_pending;
            }
        }
    }
}

fn build_consumers(
    mode: Mode,
    cfg: &StressConfig,
    evd_count: usize,
    shards: &[Arc<Shard>],
    errors: &Arc<Errors>,
    stop: &Stop,
) -> Result<(Vec<Evd>, Consumers), String> {
    let flags = EvdFlags::DTO | EvdFlags::SOFTWARE;
    let dispatcher: Arc<dyn Dispatch> = Dispatcher::new(2);
    match mode.policy() {
        Some(policy) => {
            let mut evds = Vec::new();
            let mut flows = Vec::new();
            let mut threads = Vec::new();
            for (i, shard) in shards.iter().enumerate().take(evd_count) {
                let (tx, rx) = mpsc::channel();
                let flow = Arc::new(Flow {
                    policy,
                    re_enables: mode.re_enables(),
                    switch_every: cfg.switch_every,
                    qlen: cfg.qlen as u64,
                    phase: AtomicU8::new(PHASE_UPCALL),
                    in_phase: AtomicU64::new(0),
                    upcalls: AtomicU64::new(0),
                    handoffs: AtomicU64::new(0),
                    repolls: AtomicU64::new(0),
                    overlaps: AtomicU64::new(0),
                    shard: shard.clone(),
                    tx,
                    errors: errors.clone(),
                    skip_re_enable: AtomicBool::new(cfg.fault == Some(Fault::SkipReEnable)),
                });
                let up = flow.clone();
                let evd = Evd::builder(cfg.qlen, flags)
                    .dispatch(dispatcher.clone())
                    .upcall(
                        policy,
                        Arc::new(move |evd: &Evd, ev: Option<Event>, _more: bool| {
                            up.upcall(evd, ev)
                        }),
                    )
                    .build()
                    .map_err(|e| format!("creating EVD {i}: {e}"))?;
                let (f, e, s) = (flow.clone(), evd.clone(), stop.clone());
                let seed = cfg.seed ^ (0xC0FFEE + i as u64);
                let t = thread::Builder::new()
                    .name(format!("stress-poll-{i}"))
                    .spawn(move || poll_thread(f, e, rx, s, seed))
                    .map_err(|e| format!("starting a polling thread: {e}"))?;
                evds.push(evd);
                flows.push(flow);
                threads.push(t);
            }
            Ok((evds, Consumers::Flows { flows, threads }))
        }
        None => {
            let configs = [
                PollerConfig {
                    threads: 1,
                    budget: 64,
                    mode: ReEnable::OnNew,
                },
                PollerConfig {
                    threads: 1,
                    budget: 16,
                    mode: ReEnable::Strict,
                },
            ];
            let pollers = configs
                .iter()
                .map(|c| Poller::new(*c).map_err(|e| format!("starting a poller: {e}")))
                .collect::<Result<Vec<_>, _>>()?;
            let mut evds = Vec::new();
            let mut entries = Vec::new();
            for (i, shard) in shards.iter().enumerate().take(evd_count) {
                let evd = Evd::builder(cfg.qlen, flags)
                    .dispatch(dispatcher.clone())
                    .build()
                    .map_err(|e| format!("creating EVD {i}: {e}"))?;
                let s = shard.clone();
                let entry = pollers[i % pollers.len()]
                    .add(&evd, move |ev: Event| s.record(std::slice::from_ref(&ev)))
                    .map_err(|e| format!("attaching EVD {i} to a poller: {e}"))?;
                evds.push(evd);
                entries.push((i % pollers.len(), entry));
            }
            Ok((evds, Consumers::Pollers { pollers, entries }))
        }
    }
}

/// What the bounded clean-up found.
struct Cleanup {
    stranded: u64,
}

/// Stops the consumers, tears the EVDs down, records what was left queued,
/// frees the EVDs. Runs on its own thread so that a stuck core call cannot
/// make the harness hang.
fn cleanup(
    consumers: Consumers,
    evds: Vec<Evd>,
    shards: Vec<Arc<Shard>>,
    errors: Arc<Errors>,
) -> Cleanup {
    match consumers {
        Consumers::Flows { threads, .. } => {
            for t in threads {
                if t.join().is_err() {
                    errors.push("a polling thread panicked".into());
                }
            }
            for evd in &evds {
                if let Err(e) = evd.modify_upcall(UpcallPolicy::Teardown, None, ReEnable::OnNew) {
                    errors.push(format!("cleanup: modify_upcall(Teardown): {e}"));
                }
            }
        }
        Consumers::Pollers { pollers, entries } => {
            for (p, entry) in entries {
                if let Err(e) = entry.remove(&pollers[p]) {
                    errors.push(format!("cleanup: removing a poller entry: {e}"));
                }
            }
            drop(pollers);
        }
    }
    let mut stranded = 0u64;
    let mut batch = Vec::new();
    for (evd, shard) in evds.iter().zip(&shards) {
        // Bounded: an EVD holds at most qlen events and nobody posts now.
        for _ in 0..=rdapl::evd::MAX_QLEN {
            batch.clear();
            match evd.dequeue_batch(&mut batch, 256) {
                Ok(0) => break,
                Ok(n) => {
                    stranded += n as u64;
                    shard.record(&batch);
                }
                Err(e) => {
                    errors.push(format!("cleanup: dequeue_batch: {e}"));
                    break;
                }
            }
        }
        if let Err(e) = evd.free() {
            errors.push(format!("cleanup: free: {e}"));
        }
    }
    Cleanup { stranded }
}

/// How long clean-up may take after the run before it counts as a hang.
const CLEANUP_GRACE: Duration = Duration::from_secs(5);
/// With every producer done and nothing queued, how long the seen count may
/// stand still before the missing events are declared lost.
const SETTLE: Duration = Duration::from_millis(1500);

/// Runs one mode and checks it.
pub fn run_mode(mode: Mode, cfg: &StressConfig) -> ModeReport {
    let mut report = ModeReport {
        mode,
        expected: cfg.events,
        produced: 0,
        elapsed: Duration::ZERO,
        upcalls: 0,
        poll_phases: 0,
        repolls: 0,
        overlaps: 0,
        tally: Tally::default(),
        stranded: 0,
        hang: false,
        notes: Vec::new(),
    };
    if let Err(e) = cfg.validate() {
        report.notes.push(e);
        return report;
    }
    let start = Instant::now();
    let stop = Stop {
        flag: Arc::new(AtomicBool::new(false)),
        deadline: start + cfg.max_time,
    };
    let errors = Arc::new(Errors::default());
    let evd_count = if mode == Mode::Poller {
        cfg.evds.max(2)
    } else {
        cfg.evds
    };
    let shards: Vec<Arc<Shard>> = (0..evd_count)
        .map(|_| Arc::new(Shard::new(cfg.producers, mode.order_scope(), cfg.fault)))
        .collect();
    let (evds, consumers) = match build_consumers(mode, cfg, evd_count, &shards, &errors, &stop) {
        Ok(x) => x,
        Err(e) => {
            report.notes.push(e);
            return report;
        }
    };

    // Producers.
    let done = Arc::new(AtomicUsize::new(0));
    let posted: Vec<Arc<Posted>> = (0..cfg.producers).map(|_| Arc::default()).collect();
    let quota = |p: usize| {
        cfg.events / cfg.producers as u64
            + u64::from((p as u64) < cfg.events % cfg.producers as u64)
    };
    let mut producers = Vec::new();
    for (p, post) in posted.iter().enumerate() {
        let (evd, stop, post, errs, finished) = (
            evds[p % evd_count].clone(),
            stop.clone(),
            post.clone(),
            errors.clone(),
            done.clone(),
        );
        let (q, seed) = (quota(p), cfg.seed);
        match thread::Builder::new()
            .name(format!("stress-producer-{p}"))
            .spawn(move || {
                produce(p, &evd, q, seed, &stop, &post, &errs);
                finished.fetch_add(1, Ordering::SeqCst);
            }) {
            Ok(h) => producers.push(h),
            Err(e) => {
                errors.push(format!("starting producer {p}: {e}"));
                done.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    // Wait until every event was seen, the run settles, or time runs out.
    let mut last_seen = 0u64;
    let mut last_progress = Instant::now();
    loop {
        let seen: u64 = shards.iter().map(|s| s.unique.load(Ordering::SeqCst)).sum();
        let now = Instant::now();
        if seen >= cfg.events {
            break;
        }
        if now >= stop.deadline {
            report.hang = true;
            break;
        }
        if seen != last_seen {
            last_seen = seen;
            last_progress = now;
        } else if done.load(Ordering::SeqCst) == cfg.producers
            && now.duration_since(last_progress) >= SETTLE
            && evds
                .iter()
                .all(|e| e.query().map(|q| q.occupied == 0).unwrap_or(true))
        {
            // Nothing queued, nothing arriving, events missing: lost.
            break;
        }
        thread::sleep(Duration::from_micros(500));
    }
    report.elapsed = start.elapsed();
    if report.hang {
        for (i, evd) in evds.iter().enumerate() {
            match evd.query() {
                Ok(q) => report.notes.push(format!(
                    "hang: EVD {i}: {} event(s) queued, {} slot(s) occupied, policy {:?}",
                    q.pending, q.occupied, q.upcall_policy
                )),
                Err(e) => report.notes.push(format!("hang: EVD {i}: query: {e}")),
            }
        }
        if let Consumers::Flows { flows, .. } = &consumers {
            for (i, f) in flows.iter().enumerate() {
                let phase = f.phase.load(Ordering::SeqCst);
                report.notes.push(format!(
                    "hang: consumer {i} phase {}",
                    if phase == PHASE_UPCALL {
                        "upcall"
                    } else {
                        "poll"
                    }
                ));
            }
        }
    }
    stop.flag.store(true, Ordering::SeqCst);
    consumer_stats(&consumers, &mut report);

    // Bounded clean-up: producers, consumers, EVDs.
    let (tx, rx) = mpsc::channel();
    let (c_shards, c_errors) = (shards.clone(), errors.clone());
    let cleaner = thread::Builder::new()
        .name("stress-cleanup".into())
        .spawn(move || {
            for h in producers {
                if h.join().is_err() {
                    c_errors.push("a producer panicked".into());
                }
            }
            let _ = tx.send(cleanup(consumers, evds, c_shards, c_errors));
        });
    match cleaner {
        Ok(_) => match rx.recv_timeout(CLEANUP_GRACE) {
            Ok(c) => report.stranded = c.stranded,
            Err(_) => {
                report.hang = true;
                report.notes.push(format!(
                    "hang: clean-up did not finish within {CLEANUP_GRACE:?}"
                ));
            }
        },
        Err(e) => report
            .notes
            .push(format!("starting the clean-up thread: {e}")),
    }

    // Verdict.
    let produced_by: Vec<[u64; 2]> = posted.iter().map(|p| p.get()).collect();
    report.produced = produced_by.iter().map(|p| p[0] + p[1]).sum();
    for (i, shard) in shards.iter().enumerate() {
        // Only producers homed on this EVD produced into it.
        let home: Vec<[u64; 2]> = produced_by
            .iter()
            .enumerate()
            .map(|(p, made)| if p % evd_count == i { *made } else { [0, 0] })
            .collect();
        report.tally.add(&lock(&shard.checker).checker.tally(&home));
    }
    if report.produced != report.expected {
        report.notes.push(format!(
            "producers posted {} of {} events",
            report.produced, report.expected
        ));
    }
    if report.stranded > 0 {
        report.notes.push(format!(
            "{} event(s) were still queued when the mode ended (drained and checked)",
            report.stranded
        ));
    }
    let mut errs = errors.take();
    report.notes.append(&mut errs);
    report
}

/// Runs the modes one after the other, calling `progress` after each.
pub fn run(
    cfg: &StressConfig,
    modes: &[Mode],
    mut progress: impl FnMut(&ModeReport),
) -> Vec<ModeReport> {
    modes
        .iter()
        .map(|m| {
            let r = run_mode(*m, cfg);
            progress(&r);
            r
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_round_trips() {
        assert_eq!(decode(&dto_event(3, 77)), Some((3, StreamKind::Dto, 77)));
        let v = software_value(65_535, SW_SEQ_MASK);
        assert_eq!(
            decode(&Event::Software(v)),
            Some((65_535, StreamKind::Software, SW_SEQ_MASK))
        );
    }

    #[test]
    fn window_counts_at_or_above() {
        let mut s = StreamCheck::default();
        for q in (0..200).chain([250, 300]) {
            assert!(matches!(s.insert(q), Seen::New { .. }));
        }
        assert_eq!(s.base, 192);
        assert_eq!(s.seen_at_or_above(0), 202);
        assert_eq!(s.seen_at_or_above(199), 3);
        assert_eq!(s.seen_at_or_above(200), 2);
        assert_eq!(s.seen_at_or_above(251), 1);
        assert_eq!(s.seen_at_or_above(301), 0);
    }

    #[test]
    fn table_is_aligned() {
        let t = format_table(&[]);
        assert_eq!(t.lines().count(), 1);
        assert!(t.starts_with("mode"));
    }
}
