//! The results of one run: the JSON document (`results.json`), the targets
//! of the issue judged against the measured ratios, and the markdown report
//! (`results.md`).
//!
//! Ratios are the figures; absolute numbers sit beside them as context.
//! Each ratio is shown as `median [min–max]` over the repetitions, and each
//! target says `met` or `MISSED` from the median ratio, with how many
//! repetitions met it.

use crate::stats::Summary;
use crate::util::Machine;
use crate::{flow, latency, loopback, shared, tcp, throughput};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// Facts about the run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Meta {
    /// `YYYY-MM-DD HH:MM:SS UTC` at the start of the run.
    pub date_utc: String,
    /// Unix seconds at the start of the run.
    pub unix_time: u64,
    /// Cores available to the process.
    pub cores: usize,
    /// CPU model, if known.
    pub cpu_model: Option<String>,
    /// `--smoke` run.
    pub smoke: bool,
    /// Repetitions.
    pub reps: usize,
    /// Wall-clock seconds of the whole suite.
    pub suite_seconds: f64,
    /// The command line.
    pub command: String,
    /// rdapl-bench version (the workspace version).
    pub version: String,
    /// Whether this is an optimized build (debug builds are not meaningful).
    pub optimized: bool,
    /// The rdapl commit measured (`+dirty`: with uncommitted changes).
    pub rdapl_commit: Option<String>,
    /// The parameters used.
    pub params: crate::config::Scale,
}

impl Meta {
    /// Meta for a run started on `machine`.
    pub fn new(machine: &Machine, scale: &crate::config::Scale, command: String) -> Meta {
        Meta {
            date_utc: machine.date_utc.clone(),
            unix_time: machine.unix_time,
            cores: machine.cores,
            cpu_model: machine.cpu_model.clone(),
            smoke: scale.smoke,
            reps: scale.reps,
            suite_seconds: 0.0,
            command,
            version: env!("CARGO_PKG_VERSION").into(),
            optimized: !cfg!(debug_assertions),
            rdapl_commit: machine.rdapl_commit.clone(),
            params: scale.clone(),
        }
    }
}

/// A row of the suite that is known and not measured: at present the TCP
/// benchmark's rows of a peer program that is not installed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    /// Row id prefix the part will use.
    pub id: String,
    /// Why it is not measured.
    pub status: String,
}

/// How a measured ratio is compared with its bound.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Compare {
    /// The ratio must be at least the bound.
    #[serde(rename = ">=")]
    AtLeast,
    /// The ratio must be at most the bound.
    #[serde(rename = "<=")]
    AtMost,
}

impl Compare {
    fn holds(self, v: f64, bound: f64) -> bool {
        !v.is_nan()
            && match self {
                Compare::AtLeast => v >= bound,
                Compare::AtMost => v <= bound,
            }
    }

    fn symbol(self) -> &'static str {
        match self {
            Compare::AtLeast => "≥",
            Compare::AtMost => "≤",
        }
    }
}

/// A target of the issue (or a correctness check), judged on a ratio.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Target {
    /// `target/...` or `check/...`.
    pub id: String,
    /// What is required, in words.
    pub statement: String,
    /// The row the figure comes from.
    pub row: String,
    /// The measured figure (median over repetitions).
    pub measured: f64,
    /// Smallest and largest repetition.
    pub min: f64,
    /// Largest repetition.
    pub max: f64,
    /// The comparison.
    pub compare: Compare,
    /// The bound.
    pub bound: f64,
    /// Met, judged on the median.
    pub met: bool,
    /// Repetitions that met the bound on their own.
    pub reps_met: usize,
    /// Repetitions.
    pub reps: usize,
    /// Why the target cannot be judged (its peer not measured): neither
    /// met nor missed.
    #[serde(default)]
    pub pending: Option<String>,
}

impl Target {
    fn new(
        id: &str,
        statement: &str,
        row: &str,
        s: &Summary,
        compare: Compare,
        bound: f64,
    ) -> Self {
        Target {
            id: id.into(),
            statement: statement.into(),
            row: row.into(),
            measured: s.median,
            min: s.min,
            max: s.max,
            compare,
            bound,
            met: compare.holds(s.median, bound),
            reps_met: s.reps.iter().filter(|v| compare.holds(**v, bound)).count(),
            reps: s.reps.len(),
            pending: None,
        }
    }
}

/// The whole document.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Results {
    /// Facts about the run.
    pub meta: Meta,
    /// Benchmark 1 rows.
    pub throughput: Vec<throughput::Row>,
    /// Benchmark 2 rows.
    pub latency: Vec<latency::Row>,
    /// Benchmark 3 rows.
    pub flow: Vec<flow::Row>,
    /// Benchmark 4: half round trips.
    pub loopback_half_rtt: Vec<loopback::HalfRttRow>,
    /// Benchmark 4: the half round trip's software path alone (both ends
    /// on one thread; context, no target).
    #[serde(default)]
    pub loopback_serial: Vec<loopback::SerialRow>,
    /// Benchmark 4: RDMA and memcpy bandwidth.
    pub loopback_bandwidth: Vec<loopback::BandwidthRow>,
    /// Benchmark 5: the TCP provider against fi_pingpong and qperf.
    #[serde(default)]
    pub tcp: Vec<tcp::Row>,
    /// Benchmark 5: the binaries, the placement, the calibrated iteration
    /// counts, a failure that stopped it (`None`: not run).
    #[serde(default)]
    pub tcp_setup: Option<tcp::Setup>,
    /// Benchmark 6: many connections on one EVD.
    #[serde(default)]
    pub shared: Vec<shared::Row>,
    /// Targets and checks.
    pub targets: Vec<Target>,
    /// Parts deliberately not measured.
    pub pending: Vec<Pending>,
    /// SVG files written (names relative to the output directory).
    pub plots: Vec<String>,
}

impl Results {
    /// Judges the targets of the issue against the rows present.
    pub fn judge(&mut self) {
        let mut t = Vec::new();
        for r in &self.throughput {
            if r.queue != throughput::Queue::EvdReserveComplete {
                continue;
            }
            let (bound, form) = match r.consumption {
                throughput::Consumption::Unbatched => (1.0, "unbatched (`dequeue`)"),
                throughput::Consumption::Batched => (1.5, "batched (`dequeue_batch`)"),
            };
            t.push(Target::new(
                &format!(
                    "target/throughput/{}p-{}",
                    r.producers,
                    r.consumption.name()
                ),
                &format!(
                    "EVD (reserve/complete) events/s, {} producer(s), {form}, ÷ crossbeam bounded",
                    r.producers
                ),
                &r.id,
                &r.ratio_vs_peer,
                Compare::AtLeast,
                bound,
            ));
        }
        if let Some(r) = self
            .latency
            .iter()
            .find(|r| r.method == latency::Method::EvdWait)
        {
            t.push(Target::new(
                "target/latency/evd-wait-median",
                "Blocking `wait(None, 1)` ping-pong: median round trip ÷ crossbeam's blocking ping-pong (no slower)",
                &r.id,
                &r.ratio_median_vs_peer,
                Compare::AtMost,
                1.0,
            ));
        }
        let flow_row = |load, c| self.flow.iter().find(|r| r.load == load && r.consumer == c);
        if let Some(r) = flow_row(flow::Load::Saturating, flow::Consumer::Poller) {
            t.push(Target::new(
                "target/flow/saturating-upcalls-per-event",
                "Poller at saturation: upcalls per event ÷ pure upcalls' (at least 10× fewer)",
                &r.id,
                &r.ratio_upcalls_per_event_vs_peer,
                Compare::AtMost,
                0.1,
            ));
        }
        if let Some(r) = flow_row(flow::Load::Low, flow::Consumer::Poller) {
            t.push(Target::new(
                "target/flow/low-load-latency",
                "Poller at low load: mean post-to-handler latency ÷ pure upcalls' (within 1.5×)",
                &r.id,
                &r.ratio_mean_latency_vs_peer,
                Compare::AtMost,
                1.5,
            ));
        }
        // Judged on the owned-buffer rows, the provider's send/receive path
        // for latency; the LMR-triplet rows are reported beside them.
        for r in &self.loopback_half_rtt {
            let form = match r.method {
                loopback::Method::RdaplBufPoll => "poll",
                loopback::Method::RdaplBufWait => "wait",
                _ => continue,
            };
            t.push(Target::new(
                &format!("target/loopback/half-rtt-{form}-median"),
                &format!(
                    "Loopback {}-byte send/receive of owned buffers (`post_send_buf` / `post_recv_buf`), completions by {}: median half round trip ÷ crossbeam {} ping-pong's (within {}×)",
                    r.message_bytes,
                    if form == "poll" {
                        "busy `dequeue`"
                    } else {
                        "blocking `wait`"
                    },
                    if form == "poll" {
                        "busy `try_recv`"
                    } else {
                        "blocking `recv`"
                    },
                    loopback::HALF_RTT_BOUND
                ),
                &r.id,
                &r.ratio_median_vs_peer,
                Compare::AtMost,
                loopback::HALF_RTT_BOUND,
            ));
        }
        for r in self
            .loopback_bandwidth
            .iter()
            .filter(|r| loopback::has_target(r))
        {
            t.push(Target::new(
                &format!("target/loopback/{}-{}", r.transfer.name(), r.size_label),
                &format!(
                    "Loopback {} of {}: GB/s ÷ `copy_from_slice` of the same size (at least {:.0}%)",
                    r.transfer.name(),
                    r.size_label,
                    loopback::BANDWIDTH_BOUND * 100.0
                ),
                &r.id,
                &r.ratio_vs_memcpy,
                Compare::AtLeast,
                loopback::BANDWIDTH_BOUND,
            ));
        }
        if !self.loopback_half_rtt.is_empty() || !self.loopback_bandwidth.is_empty() {
            let failed: usize = self
                .loopback_half_rtt
                .iter()
                .map(|r| r.failed_reps)
                .chain(self.loopback_serial.iter().map(|r| r.failed_reps))
                .chain(self.loopback_bandwidth.iter().map(|r| r.failed_reps))
                .sum();
            t.push(Target::new(
                "check/loopback/no-failed-runs",
                "Loopback runs that failed (setup, a stuck side, a wrong value, a failed DTO, data not matching), summed",
                "loopback/*",
                &Summary::of(&[failed as f64]),
                Compare::AtMost,
                0.0,
            ));
        }
        for r in &self.tcp {
            let Some((bound, compare)) = tcp::target_of(r) else {
                continue;
            };
            let peer = r.peer.map_or("–", |p| p.name());
            let mut target = Target::new(
                &format!("target/tcp/{}-{}", r.test.name(), r.size_label),
                &format!(
                    "TCP provider, {} {} between two processes ({}): {} ÷ {}'s ({}), same repetition",
                    r.size_label,
                    match r.test {
                        tcp::Test::Latency => "one-way latency",
                        tcp::Test::PingpongBw => "ping-pong bandwidth",
                        tcp::Test::StreamBw => "streaming bandwidth",
                    },
                    r.program.describe(r.test),
                    r.test.unit(),
                    peer,
                    r.peer.map_or(String::new(), |p| p.describe(r.test)),
                ),
                &r.id,
                &r.ratio_vs_peer,
                compare,
                bound,
            );
            target.pending = r.pending.clone();
            t.push(target);
        }
        if let Some(setup) = &self.tcp_setup {
            let failed: usize = self.tcp.iter().map(|r| r.failed_reps).sum::<usize>()
                + usize::from(setup.error.is_some());
            t.push(Target::new(
                "check/tcp/no-failed-runs",
                "TCP runs that failed (a process failed or timed out, iterations missing, an output not understood, the part not able to start), summed",
                "tcp/*",
                &Summary::of(&[failed as f64]),
                Compare::AtMost,
                0.0,
            ));
        }
        if !self.shared.is_empty() {
            let failed = self.shared.iter().filter(|r| r.error.is_some()).count();
            t.push(Target::new(
                "check/shared/no-failed-rows",
                "Many-connection rows that failed (a connection not set up, a round trip not completing in time), summed",
                "tcp-shared/*",
                &Summary::of(&[failed as f64]),
                Compare::AtMost,
                0.0,
            ));
        }
        if !self.flow.is_empty() {
            let lost: u64 = self.flow.iter().map(|r| r.lost).sum();
            t.push(Target::new(
                "check/flow/no-lost-events",
                "Events posted in the flow runs and never handled, summed",
                "flow/*",
                &Summary::of(&[lost as f64]),
                Compare::AtMost,
                0.0,
            ));
        }
        if !self.latency.is_empty() {
            let failed: usize = self.latency.iter().map(|r| r.failed_reps).sum();
            t.push(Target::new(
                "check/latency/no-stuck-runs",
                "Ping-pong runs that got stuck or received a wrong value, summed",
                "latency/*",
                &Summary::of(&[failed as f64]),
                Compare::AtMost,
                0.0,
            ));
        }
        self.targets = t;
    }

    /// The markdown report.
    pub fn markdown(&self) -> String {
        let m = &self.meta;
        let mut s = String::new();
        let _ = writeln!(s, "# rdapl-bench results\n");
        let _ = writeln!(s, "- **Date:** {}", m.date_utc);
        let _ = writeln!(
            s,
            "- **Machine:** {} core(s) available{}",
            m.cores,
            m.cpu_model
                .as_ref()
                .map(|c| format!(" ({c})"))
                .unwrap_or_default()
        );
        let _ = writeln!(
            s,
            "- **Run:** {}, {} repetition(s), {:.1} s in total{}",
            if m.smoke {
                "smoke (tiny sizes: proves the harness, the numbers mean nothing)"
            } else {
                "full"
            },
            m.reps,
            m.suite_seconds,
            if m.optimized {
                ""
            } else {
                ", **debug build (not meaningful)**"
            }
        );
        let _ = writeln!(s, "- **Command:** `{}`", m.command);
        if let Some(c) = &m.rdapl_commit {
            let _ = writeln!(s, "- **rdapl measured:** commit `{c}`");
        }
        let _ = writeln!(
            s,
            "\nEvery figure is a ratio against a peer measured in the same run: subject and \
             peer run back to back inside each repetition and the ratio is taken there; the \
             tables give the median over repetitions and `[min–max]`. Absolute numbers are \
             context only (this is a shared {}-core machine).\n",
            m.cores
        );

        if !self.targets.is_empty() {
            let _ = writeln!(s, "## Targets\n");
            table(
                &mut s,
                &[
                    "target",
                    "statement",
                    "bound",
                    "measured (median [min–max])",
                    "reps meeting it",
                    "result",
                ],
                self.targets.iter().map(|t| {
                    vec![
                        format!("`{}`", t.id),
                        t.statement.clone(),
                        format!("{} {}", t.compare.symbol(), num(t.bound)),
                        format!("{} [{}–{}]", num(t.measured), num(t.min), num(t.max)),
                        format!("{}/{}", t.reps_met, t.reps),
                        match &t.pending {
                            Some(why) => format!("pending ({why})"),
                            None => met_cell(t.met).into(),
                        },
                    ]
                }),
            );
        }

        if !self.throughput.is_empty() {
            let p = &m.params.throughput;
            let _ = writeln!(s, "## 1. EVD throughput\n");
            let _ = writeln!(
                s,
                "Producers push a DTO-completion `Event` into a queue of capacity {}; one consumer \
                 takes them out one by one or in batches of up to {}. Non-blocking calls with the \
                 same backoff on every side (spin, yield after 50 µs without progress); the \
                 consumer pinned to one CPU, the producers to the others. {} ms warm-up, then \
                 the window runs until {} ms of it were *live* (the consumer and enough \
                 producers running, by the threads' own clocks, in 1 ms ticks) or for {} ms. \
                 Rate = events taken in live ticks ÷ their length. A run with less than half \
                 the live time wanted, or live for less than half its window, is *starved*; a \
                 trial in which the queue or crossbeam was starved gives no ratio (counted \
                 below; each one's reason is in `results.json`). {} trials per configuration, \
                 each running every queue once back to back (rotating order). Ratio = events/s \
                 of the queue ÷ events/s of crossbeam-channel (bounded) in the same trial \
                 (higher is better); median [min–max] over the trials kept.\n",
                p.capacity,
                p.batch,
                p.warmup.as_millis(),
                p.window.as_millis(),
                p.max_window.as_millis(),
                m.reps * p.trials_per_rep
            );
            table(
                &mut s,
                &[
                    "config",
                    "queue",
                    "ratio vs crossbeam",
                    "trials kept",
                    "events/s (context)",
                    "live share",
                ],
                self.throughput.iter().map(|r| {
                    vec![
                        format!("{}p {}", r.producers, r.consumption.name()),
                        format!(
                            "{}{}",
                            r.queue.name(),
                            if r.queue == throughput::Queue::EvdReserveComplete {
                                " (main)"
                            } else {
                                ""
                            }
                        ),
                        ratio_cell(&r.ratio_vs_peer),
                        format!(
                            "{} of {}",
                            r.ratio_vs_peer.reps.len() - r.discarded.len(),
                            r.ratio_vs_peer.reps.len()
                        ),
                        rate(r.events_per_s.median),
                        format!("{:.0}%", 100.0 * r.live_frac.median),
                    ]
                }),
            );
            let split: Vec<_> = throughput_split(&self.throughput).collect();
            if !split.is_empty() {
                let _ = writeln!(
                    s,
                    "The main row's ratio by how fast crossbeam ran in the same trial (the \
                     machine's phases: where crossbeam is fast, cross-core transfers are cheap \
                     and the queues' own instructions and locked operations decide; where it \
                     is slow, the transfers do). Trials split at crossbeam's median rate.\n"
                );
                table(
                    &mut s,
                    &[
                        "config",
                        "crossbeam median",
                        "ratio, trials with crossbeam at or above it",
                        "ratio, trials with crossbeam below it",
                    ],
                    split.into_iter().map(|(cfg, peer, fast, slow)| {
                        let cell = |x: &Summary| format!("{} (n={})", ratio_cell(x), x.reps.len());
                        vec![cfg, rate(peer), cell(&fast), cell(&slow)]
                    }),
                );
            }
        }

        if !self.latency.is_empty() {
            let p = &m.params.latency;
            let _ = writeln!(s, "## 2. Wakeup latency (ping-pong round trip)\n");
            let _ = writeln!(
                s,
                "Two threads bounce a value through two queues; each round trip is timed \
                 ({} recorded after {} warm-up, at most {} ms per run). Ratio = this method's \
                 median (p99) round trip ÷ the peer's in the same repetition (lower is better). \
                 `evd-upcall`: each EVD has its own one-thread dispatcher and a `SingleInstance` \
                 upcall posts the reply; `evd-wait`: `wait(None, 1)`; `evd-poll`: busy `dequeue`.\n",
                p.iters,
                p.warmup_iters,
                p.limit.as_millis()
            );
            table(
                &mut s,
                &rtt_header("median RTT", "p99 RTT", "samples/rep"),
                self.latency.iter().map(|r| {
                    rtt_cells(
                        [r.method.name(), r.peer.name()],
                        [&r.ratio_median_vs_peer, &r.ratio_p99_vs_peer],
                        [&r.rtt_median_ns, &r.rtt_p99_ns],
                        &r.samples,
                        [r.capped_reps, r.failed_reps],
                    )
                }),
            );
        }

        if !self.flow.is_empty() {
            let p = &m.params.flow;
            let _ = writeln!(s, "## 3. The seed's flow\n");
            let _ = writeln!(
                s,
                "One producer completes DTOs (`reserve` + `complete`) into an EVD of qlen {} at \
                 {} events/s (low), {} events/s (medium) or unpaced (saturating). Consumers: \
                 `rdapl::Poller` (budget {}, `OnNew`), a `SingleInstance` upcall per event \
                 (`pure-upcall`, the peer of every ratio) and a thread calling `dequeue` in a \
                 loop (`pure-polling`). Window {} ms after {} ms warm-up. Latency = `complete` \
                 → handler; p50/p99 are recorded at low load only.\n",
                p.qlen,
                p.low_rate,
                p.medium_rate,
                p.budget,
                p.window.as_millis(),
                p.warmup.as_millis()
            );
            table(
                &mut s,
                &[
                    "load",
                    "consumer",
                    "events/s ratio",
                    "upcalls/event",
                    "upcalls/event ratio",
                    "mean latency ratio",
                    "events/s",
                    "mean latency",
                    "p50",
                    "p99",
                    "lost",
                ],
                self.flow.iter().map(|r| {
                    vec![
                        r.load.name().to_string(),
                        r.consumer.name().to_string(),
                        ratio_cell(&r.ratio_events_vs_peer),
                        num(r.upcalls_per_event.median),
                        ratio_cell(&r.ratio_upcalls_per_event_vs_peer),
                        ratio_cell(&r.ratio_mean_latency_vs_peer),
                        rate(r.events_per_s.median),
                        ns(r.mean_latency_ns.median),
                        ns(r.p50_latency_ns.median),
                        ns(r.p99_latency_ns.median),
                        r.lost.to_string(),
                    ]
                }),
            );
        }

        if !self.loopback_half_rtt.is_empty() || !self.loopback_bandwidth.is_empty() {
            self.loopback_markdown(&mut s);
        }

        if self.tcp_setup.is_some() {
            self.tcp_markdown(&mut s);
        }

        if !self.shared.is_empty() {
            let _ = writeln!(
                s,
                "## 6. Many connections on one EVD
"
            );
            let _ = writeln!(
                s,
                "The TCP provider in this process (127.0.0.x): waiting 64-byte round trips \
                 (`wait` for each completion) of a connection whose EVDs `n` idle connections \
                 share, and of one with EVDs of its own beside `n` idle connections, back to \
                 back in each repetition. Ratio = shared ÷ own (lower is better; 1 means \
                 sharing an EVD costs nothing). Context, no target.\n"
            );
            table(
                &mut s,
                &[
                    "idle connections",
                    "ratio shared ÷ own",
                    "shared µs/round trip",
                    "own µs/round trip",
                    "error",
                ],
                self.shared.iter().map(|r| {
                    vec![
                        r.idle.to_string(),
                        format!(
                            "{}× [{}–{}]",
                            num(r.ratio.median),
                            num(r.ratio.min),
                            num(r.ratio.max)
                        ),
                        num(r.shared_us.median),
                        num(r.own_us.median),
                        r.error.clone().unwrap_or_else(|| "–".into()),
                    ]
                }),
            );
        }

        if !self.pending.is_empty() {
            let _ = writeln!(s, "## Not measured\n");
            for p in &self.pending {
                let _ = writeln!(s, "- `{}`: {}", p.id, p.status);
            }
            s.push('\n');
        }

        if !self.plots.is_empty() {
            let _ = writeln!(s, "## Plots\n");
            for p in &self.plots {
                let _ = writeln!(s, "- [`{p}`]({p})");
            }
            s.push('\n');
        }
        s
    }
}

impl Results {
    /// Section 5: the TCP provider's tables.
    fn tcp_markdown(&self, s: &mut String) {
        let _ = writeln!(s, "## 5. TCP provider against fi_pingpong and qperf\n");
        let Some(setup) = &self.tcp_setup else {
            return;
        };
        let p = &self.meta.params.tcp;
        if let Some(e) = &setup.error {
            let _ = writeln!(s, "**Not run:** {e}\n");
        }
        let busiest = setup.load_avg.iter().copied().fold(f64::NAN, f64::max);
        if busiest > self.meta.cores as f64 {
            let _ = writeln!(
                s,
                "**Warning: the machine was busy** (load average up to {busiest:.1} on {} \
                 core(s)): the busy-polling rows (`rdapl-poll*`, fi_pingpong) then measure \
                 how often the scheduler lets two spinning processes run, and their ratios \
                 swing both ways; judge them on a quiet machine.\n",
                self.meta.cores
            );
        }
        let _ = writeln!(
            s,
            "rdapl's TCP/iWARP provider between two processes on 127.0.0.1 (the `rdapl` CLI: \
             `pingpong` and `bw`, server `-s --once`), against libfabric's tcp provider \
             (`fi_pingpong -p tcp -e msg`, which busy-polls its CQs: the peer of rdapl polling) \
             and qperf (`tcp_lat`, `tcp_bw`, blocking socket calls: the peer of rdapl waiting \
             with `-w`). Latency: one-way µs, elapsed time ÷ (2 × round trips), as both peers \
             define it. Ping-pong bandwidth (fi_pingpong has no streaming test): size ÷ one-way \
             time, MB/s (10⁶ bytes/s; half of the `MB/sec` column of fi_pingpong and `rdapl pingpong`, \
             which count both ways). Streaming bandwidth: `rdapl bw -w` with {} messages in flight against \
             `qperf tcp_bw` (MB/s received). rdapl with MPA CRC32c on (the default, judged) and \
             off (`crc=0`, context); neither peer has a CRC. A fresh server and client process \
             per run, placement `{}`{}; {} (qperf: `-t {}`); within a repetition each group \
             runs {} round(s), each in an order that rotates and reverses between rounds, and a \
             program's value in the repetition is the best of its runs there (highest MB/s, \
             lowest µs): a shared VM has slow phases of a second or so that slow both peers \
             alike, and one run each would compare phases, not programs. Ratio = rdapl's best ÷ \
             the peer's best in the same repetition, median [min–max] over {} repetition(s); \
             `every run` shows the spread of all runs. Load average \
             at the start of each repetition: {}. The client's main-thread CPU time ÷ its wall \
             time: a busy-polling client (`rdapl-poll*`, fi_pingpong) spins there, so well \
             below 1.00 it was off a CPU for that share of its run.\n",
            p.window,
            match p.placement {
                tcp::Placement::Unpinned => "unpinned",
                tcp::Placement::Split => "split",
            },
            setup
                .cpus
                .map(|(a, b)| format!(" (servers on CPU {a}, clients on CPU {b})"))
                .unwrap_or_default(),
            if p.calibrate {
                format!(
                    "one warm-up run per case calibrates its iterations to about {} s a run",
                    p.run_secs
                )
            } else {
                format!("no warm-up, {} iterations a run", p.calib_iters)
            },
            p.qperf_secs,
            p.runs.max(1),
            self.meta.reps,
            setup
                .load_avg
                .iter()
                .map(|l| format!("{l:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let rows = self.tcp.iter().map(|r| {
            let peer_value = r
                .peer
                .and_then(|q| {
                    self.tcp
                        .iter()
                        .find(|x| x.test == r.test && x.size == r.size && x.program == q)
                })
                .map(|x| x.value.median)
                .unwrap_or(f64::NAN);
            let target = match (tcp::target_of(r), &r.pending) {
                (Some(_), Some(_)) => "pending".to_string(),
                (Some((bound, c)), None) => {
                    let met = match c {
                        Compare::AtLeast => r.ratio_vs_peer.median >= bound,
                        Compare::AtMost => r.ratio_vs_peer.median <= bound,
                    };
                    format!("{} {:.2}: {}", c.symbol(), bound, met_cell(met))
                }
                (None, _) => "–".into(),
            };
            let iters: Vec<u64> = r
                .runs
                .iter()
                .filter(|x| x.error.is_none())
                .map(|x| x.iters)
                .collect();
            vec![
                r.test.name().to_string(),
                r.size_label.clone(),
                r.program.describe(r.test),
                r.peer.map_or("–".to_string(), |q| q.name().to_string()),
                if r.pending.is_some() && r.peer.is_none() {
                    "pending".into()
                } else {
                    ratio_cell(&r.ratio_vs_peer)
                },
                format!(
                    "{} {} [{}–{}]",
                    num(r.value.median),
                    r.unit,
                    num(r.value.min),
                    num(r.value.max)
                ),
                format!(
                    "{} [{}–{}]",
                    num(r.value_all.median),
                    num(r.value_all.min),
                    num(r.value_all.max)
                ),
                num(peer_value),
                match (iters.iter().min(), iters.iter().max()) {
                    (Some(a), Some(b)) if a == b => a.to_string(),
                    (Some(a), Some(b)) => format!("{a}–{b}"),
                    _ => "–".into(),
                },
                if r.client_cpu_share.median.is_nan() {
                    "–".into()
                } else {
                    format!(
                        "{:.2} [{:.2}–{:.2}]",
                        r.client_cpu_share.median, r.client_cpu_share.min, r.client_cpu_share.max
                    )
                },
                r.failed_reps.to_string(),
                target,
            ]
        });
        table(
            s,
            &[
                "test",
                "size",
                "program",
                "peer",
                "ratio vs peer",
                "best of a repetition (median [min–max])",
                "every run",
                "peer median",
                "iterations / messages",
                "client main-thread CPU ÷ wall",
                "failed runs",
                "target",
            ],
            rows,
        );
    }

    /// The software-path table: each method's one-thread half round trip
    /// beside its two-thread one, and against crossbeam's two-thread one
    /// (per repetition: how the software path alone compares with what the
    /// target is measured against).
    fn serial_markdown(&self, s: &mut String) {
        let _ = writeln!(s, "### The software path alone\n");
        let _ = writeln!(
            s,
            "The same {}-byte ping-pong with both ends driven by one thread in turn \
             (send and repost, consume the completions, read the value, echo back): nothing \
             crosses cores and nobody waits, so the time is the path's instructions and \
             locked operations. No target. The last column sets the one-thread half round \
             trip against crossbeam's two-thread one in the same repetition: where it comes \
             near {:.1}, the 2× target depends on how slow the machine's cross-core transfers \
             are at the time. It is not a strict floor: on two threads part of each side's \
             work (consuming its own send completion, reposting) overlaps the peer's turn, so \
             where transfers are cheap the two-thread half round trip can be the shorter.\n",
            loopback::MSG,
            loopback::HALF_RTT_BOUND
        );
        let threaded = |m: loopback::Method| self.loopback_half_rtt.iter().find(|r| r.method == m);
        let cb = threaded(loopback::Method::CrossbeamPoll);
        table(
            s,
            &[
                "method",
                "one-thread median half RTT",
                "two-thread median half RTT",
                "one-thread ÷ crossbeam-poll two-thread",
                "round trips/rep",
                "failed reps",
            ],
            self.loopback_serial.iter().map(|r| {
                let two = threaded(r.method).map_or(f64::NAN, |t| t.half_rtt_median_ns.median);
                let vs_cb = cb.map_or(Summary::of(&[]), |c| {
                    per_rep_ratio(&r.half_rtt_median_ns, &c.half_rtt_median_ns)
                });
                vec![
                    r.method.name().to_string(),
                    ns(r.half_rtt_median_ns.median),
                    ns(two),
                    ratio_cell(&vs_cb),
                    min_or_zero(&r.samples).to_string(),
                    r.failed_reps.to_string(),
                ]
            }),
        );
    }

    fn loopback_markdown(&self, s: &mut String) {
        let p = &self.meta.params.loopback;
        let m_reps = self.meta.reps;
        let _ = writeln!(s, "## 4. Loopback provider\n");
        if !self.loopback_half_rtt.is_empty() {
            let _ = writeln!(
                s,
                "### Half round trip, {}-byte send/receive\n",
                loopback::MSG
            );
            let _ = writeln!(
                s,
                "Two IAs on distinct 127.x addresses, one connected endpoint pair; the measuring \
                 thread owns the client endpoint, an echo thread the server endpoint. Each side \
                 keeps {} receives posted and reposts the ones it consumed right after its next \
                 send (the reply first, then the receive it answered, as UCX's `rc_verbs` \
                 transport replenishes receives after its handlers ran), and every send is \
                 signalled. `rdapl-buf-*`: owned buffers (`Pz::buf_create`), the value \
                 written into the send buffer and read from the receive buffer in place, a send \
                 buffer reused once its send completion handed it back (`post_send_buf`, \
                 `post_recv_buf`); the targets are judged on these rows. `rdapl-poll`, \
                 `rdapl-wait`: LMR triplets of registered regions, the value written with \
                 `write_at` and read back with `read_at` (each access takes the region's lock), \
                 then `post_send` / `post_recv`; each side consumes its own send completion. \
                 Every message sits on a 128-byte pair of cache lines of its own. Peer: a \
                 `crossbeam_channel::bounded` ping-pong of a `[u8; {}]` (busy `try_recv` for the \
                 `-poll` rows, blocking `recv_timeout` for the `-wait` rows). \
                 {} round trips recorded after {} warm-up, at most {} ms per run; half round trip \
                 = round trip ÷ 2. Ratio = median (p99) ÷ the peer's in the same repetition \
                 (lower is better).\n",
                p.recv_depth,
                loopback::MSG,
                p.iters,
                p.warmup_iters,
                p.limit.as_millis()
            );
            table(
                s,
                &rtt_header("median half RTT", "p99 half RTT", "round trips/rep"),
                self.loopback_half_rtt.iter().map(|r| {
                    rtt_cells(
                        [r.method.name(), r.peer.name()],
                        [&r.ratio_median_vs_peer, &r.ratio_p99_vs_peer],
                        [&r.half_rtt_median_ns, &r.half_rtt_p99_ns],
                        &r.samples,
                        [r.capped_reps, r.failed_reps],
                    )
                }),
            );
        }
        if !self.loopback_serial.is_empty() {
            self.serial_markdown(s);
        }
        if !self.loopback_bandwidth.is_empty() {
            let _ = writeln!(s, "### RDMA bandwidth against memcpy\n");
            let _ = writeln!(
                s,
                "The client's endpoint posts RDMA writes of its registered region `a` into the \
                 server's region `b` (and RDMA reads of `b` into `a`), `size` bytes each, up to {} \
                 outstanding, completions reaped with `dequeue` and checked. Peer of each \
                 direction: `copy_from_slice` of `size` bytes in the same direction between the \
                 very same two buffers (two distinct `Vec<u8>`, the regions' memory, no rdapl call \
                 in the loop): same cache footprint, same page-aligned placement, same physical \
                 pages. {} trials per size; in each, a direction's RDMA transfer and its memcpy \
                 interleaved round by round (about 1 MiB a round, the order rotating every turn, \
                 each round timed), {} ms warm-up then ≥ {} ms, ≥ {} transfers and ≥ {} MiB each; \
                 the destination is checked after the measured rounds, then each transfer alone \
                 moves a fresh pattern. GB/s = 10⁹ bytes/s (median over trials); \
                 ratio = rdapl ÷ memcpy in the same trial (higher is better), median [min–max]; \
                 target ≥ {:.2} from {} up.\n",
                p.window,
                m_reps * p.bw_trials_per_rep,
                p.bw_warmup.as_millis(),
                p.bw_window.as_millis(),
                p.bw_min_ops,
                p.bw_min_bytes >> 20,
                loopback::BANDWIDTH_BOUND,
                loopback::size_label(loopback::TARGET_FROM_SIZE)
            );
            let rows = self.loopback_bandwidth.iter().map(|r| {
                let memcpy = self
                    .loopback_bandwidth
                    .iter()
                    .find(|m| m.size == r.size && m.transfer == r.peer)
                    .map(|m| m.gb_per_s.median)
                    .unwrap_or(f64::NAN);
                let target = if loopback::has_target(r) {
                    let met = r.ratio_vs_memcpy.median >= loopback::BANDWIDTH_BOUND;
                    format!("≥ {:.2}: {}", loopback::BANDWIDTH_BOUND, met_cell(met))
                } else {
                    "–".into()
                };
                vec![
                    r.size_label.clone(),
                    r.transfer.name().to_string(),
                    r.peer.name().to_string(),
                    ratio_cell(&r.ratio_vs_memcpy),
                    num(r.gb_per_s.median),
                    num(memcpy),
                    min_or_zero(&r.ops).to_string(),
                    r.failed_reps.to_string(),
                    target,
                ]
            });
            table(
                s,
                &[
                    "size",
                    "transfer",
                    "peer",
                    "ratio vs peer",
                    "GB/s",
                    "peer GB/s",
                    "transfers/trial",
                    "failed trials",
                    "target",
                ],
                rows,
            );
        }
    }
}

/// Writes a markdown table: the header row, the separator row, one row per
/// item of `rows`, then a blank line.
fn table(s: &mut String, header: &[&str], rows: impl IntoIterator<Item = Vec<String>>) {
    let _ = writeln!(s, "| {} |", header.join(" | "));
    let _ = writeln!(s, "|{}", "---|".repeat(header.len()));
    for cells in rows {
        let _ = writeln!(s, "| {} |", cells.join(" | "));
    }
    s.push('\n');
}

/// The header of a round-trip table (latency and loopback half round trip).
fn rtt_header<'a>(median: &'a str, p99: &'a str, samples: &'a str) -> [&'a str; 8] {
    [
        "method",
        "peer",
        "median ratio",
        "p99 ratio",
        median,
        p99,
        samples,
        "capped/failed reps",
    ]
}

/// The cells of a round-trip row: method and peer names, median and p99
/// ratios, median and p99 times (ns), the fewest samples of a repetition,
/// capped and failed repetitions.
fn rtt_cells(
    names: [&str; 2],
    ratios: [&Summary; 2],
    times_ns: [&Summary; 2],
    samples: &[usize],
    capped_failed: [usize; 2],
) -> Vec<String> {
    vec![
        names[0].to_string(),
        names[1].to_string(),
        ratio_cell(ratios[0]),
        ratio_cell(ratios[1]),
        ns(times_ns[0].median),
        ns(times_ns[1].median),
        min_or_zero(samples).to_string(),
        format!("{}/{}", capped_failed[0], capped_failed[1]),
    ]
}

/// `a ÷ b` repetition by repetition (both summaries keep their repetitions
/// in run order), summarised.
fn per_rep_ratio(a: &Summary, b: &Summary) -> Summary {
    let reps = a.reps.len().min(b.reps.len());
    Summary::of(&crate::stats::rep_ratios(&a.reps, &b.reps, reps))
}

/// The smallest count, 0 for none.
fn min_or_zero<T: Copy + Ord + Default>(v: &[T]) -> T {
    v.iter().min().copied().unwrap_or_default()
}

fn met_cell(met: bool) -> &'static str {
    if met { "met" } else { "**MISSED**" }
}

/// A number with a sensible number of digits; `–` for NaN.
pub fn num(v: f64) -> String {
    if v.is_nan() {
        "–".into()
    } else if v == 0.0 {
        "0".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 0.1 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

fn ratio_cell(s: &Summary) -> String {
    if s.median.is_nan() {
        return "–".into();
    }
    if s.reps.len() <= 1 {
        return format!("{}×", num(s.median));
    }
    format!("{}× [{}–{}]", num(s.median), num(s.min), num(s.max))
}

/// Events per second, human units.
pub fn rate(v: f64) -> String {
    if v.is_nan() {
        "–".into()
    } else if v >= 1e6 {
        format!("{:.2} M/s", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1} k/s", v / 1e3)
    } else {
        format!("{v:.0} /s")
    }
}

/// Nanoseconds, human units.
pub fn ns(v: f64) -> String {
    if v.is_nan() {
        "–".into()
    } else if v >= 1e6 {
        format!("{:.2} ms", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1} µs", v / 1e3)
    } else {
        format!("{v:.0} ns")
    }
}

/// For each configuration: its name, crossbeam's median rate, and the main
/// row's per-trial ratios in the trials where crossbeam ran at or above
/// that median and in those where it ran below (the two rows' `reps` are
/// in the same trial order).
fn throughput_split(
    rows: &[throughput::Row],
) -> impl Iterator<Item = (String, f64, Summary, Summary)> + '_ {
    rows.iter()
        .filter(|r| r.queue == throughput::Queue::EvdReserveComplete)
        .filter_map(|main| {
            let peer = rows.iter().find(|r| {
                r.queue == throughput::Queue::Crossbeam
                    && r.producers == main.producers
                    && r.consumption == main.consumption
            })?;
            let m = peer.events_per_s.median;
            let pairs = peer.events_per_s.reps.iter().zip(&main.ratio_vs_peer.reps);
            let (fast, slow): (Vec<_>, Vec<_>) = pairs.partition(|(rate, _)| **rate >= m);
            let ratios =
                |v: Vec<(&f64, &f64)>| Summary::of(&v.iter().map(|p| *p.1).collect::<Vec<_>>());
            Some((
                format!("{}p {}", main.producers, main.consumption.name()),
                m,
                ratios(fast),
                ratios(slow),
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::throughput::{Consumption, Queue, Row};

    fn row(queue: Queue, rates: &[f64], ratios: &[f64]) -> Row {
        Row {
            id: String::new(),
            producers: 1,
            consumption: Consumption::Batched,
            queue,
            peer: Queue::Crossbeam,
            events_per_s: Summary::of(rates),
            raw_events_per_s: Summary::of(rates),
            live_frac: Summary::of(&[1.0]),
            ratio_vs_peer: Summary::of(ratios),
            discarded: Vec::new(),
        }
    }

    #[test]
    fn throughput_split_pairs_each_trial_with_crossbeams_rate_in_it() {
        // Trials 1 and 3 ran with crossbeam fast (at or above its median of
        // 20), trials 2 and 4 with it slow.
        let rows = [
            row(Queue::EvdReserveComplete, &[1.0; 4], &[0.8, 2.0, 0.9, 3.0]),
            row(Queue::Crossbeam, &[30.0, 10.0, 25.0, 15.0], &[1.0; 4]),
        ];
        let split: Vec<_> = throughput_split(&rows).collect();
        assert_eq!(split.len(), 1);
        let (cfg, peer, fast, slow) = &split[0];
        assert_eq!(cfg, "1p batched");
        assert_eq!(*peer, 20.0);
        assert_eq!(fast.reps, vec![0.8, 0.9]);
        assert_eq!(slow.reps, vec![2.0, 3.0]);
    }

    #[test]
    fn per_rep_ratio_pairs_repetitions_in_run_order() {
        // The one-thread path of repetition 2 is slower, and crossbeam's
        // two-thread half round trip of that repetition faster: the ratio
        // of repetition 2 is the high one, which medians taken apart would
        // not show.
        let one = Summary::of(&[270.0, 300.0, 280.0]);
        let two = Summary::of(&[135.0, 100.0, 140.0]);
        let f = per_rep_ratio(&one, &two);
        assert_eq!(f.reps, vec![2.0, 3.0, 2.0]);
        assert_eq!((f.median, f.min, f.max), (2.0, 2.0, 3.0));
        // A missing repetition (NaN, or a zero peer) stays out of the
        // summary.
        let g = per_rep_ratio(
            &Summary::of(&[f64::NAN, 200.0, 50.0]),
            &Summary::of(&[100.0, 100.0, 0.0]),
        );
        assert_eq!((g.median, g.min, g.max), (2.0, 2.0, 2.0));
    }
}
