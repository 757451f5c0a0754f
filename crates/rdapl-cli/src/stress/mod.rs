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
//!
//! This file holds the configuration, the events' encoding, the report
//! and the run of a mode; `produce.rs`, `consumers.rs`, `flow.rs` (the
//! seed's flow), `checker.rs` and `shared.rs` the rest.

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

mod checker;
mod consumers;
mod flow;
mod produce;
mod shared;

pub use checker::{Checker, OrderScope, Tally};
use consumers::*;
use flow::*;
use produce::*;
use shared::*;

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

// ----- running a mode ------------------------------------------------------

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
    use super::checker::{Seen, StreamCheck};
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
