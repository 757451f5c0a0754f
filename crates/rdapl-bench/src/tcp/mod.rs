//! Benchmark 5: rdapl's TCP/iWARP provider between two processes on
//! 127.0.0.1, against libfabric's tcp provider (`fi_pingpong -p tcp -e
//! msg`) and qperf's `tcp_lat` / `tcp_bw`, all in the same run.
//!
//! rdapl's side is the command-line tool's `rdapl pingpong` / `rdapl bw`
//! (crate `rdapl-cli`), a server (`-s --once`) and a client process per
//! run, as the peers run. Every figure is a ratio against the peer of the
//! same completion discipline, measured in the same repetition:
//!
//! | test | rdapl (subject) | peer | figure |
//! |---|---|---|---|
//! | `latency` (64 B) | `rdapl pingpong`, busy polling | `fi_pingpong` (busy-polls its CQs) | one-way µs: time ÷ (2 × round trips) |
//! | `latency` (64 B) | `rdapl pingpong -w`, waiting | `qperf tcp_lat` (blocking socket calls) | one-way µs, the same definition |
//! | `pingpong-bw` | `rdapl pingpong`, polling | `fi_pingpong` (it has no streaming test) | MB/s = size ÷ one-way time (fi_pingpong's `MB/sec`) |
//! | `stream-bw` | `rdapl bw -w`, 16 in flight, waiting | `qperf tcp_bw` (blocking `send`/`recv` of `-m` bytes) | MB/s received (10⁶ bytes/s) |
//!
//! Each rdapl row is measured with MPA CRC32c on (the provider's default,
//! the row judged) and off (`crc=0` on both sides, context; neither peer
//! has a CRC), and with `complete=sent` (CRC on; context): Sends complete
//! once TCP has them, siw's meaning and the peers' (fi_pingpong's
//! transmit-complete, qperf's `send`), instead of once the peer placed them.
//!
//! **Method.** A fresh server and client process per run, both with the
//! same placement for every program (`Placement`); the client starts once
//! the server's port is in `LISTEN` (read from `/proc/net/tcp*`, without
//! connecting to it); a free port per run. Before the repetitions, one
//! untimed warm-up run of each counted case also calibrates its iteration
//! count, so that each measured run lasts about `run_secs` whatever the
//! program's speed (qperf runs for a time, `qperf_secs`, whole seconds).
//! Within a repetition each group of cases runs `runs` rounds, each in an
//! order that rotates and reverses from round to round, and a program's
//! value in the repetition is the best of its runs there (the highest
//! MB/s, the lowest µs), so that subject and peer are each taken at their
//! best in the same stretch of time. On a shared VM the machine has slow
//! phases of a second or so (kernel copies at half speed, both peers
//! alike): a single run per repetition lands in one at random, and the
//! ratio of two runs then says which of them did. Every run is kept
//! (`Row::runs`, and `Row::value_all` over all of them). Every process is bounded by
//! `timeout` and killed with its process group when it passes it; a server
//! never outlives its run. A run counts only if both processes exit
//! successfully and the client reports every iteration (`#sent` and `#ack`
//! for rdapl and fi_pingpong, messages received for qperf, no errors); a
//! failed run is an error of the suite, not a number.
//!
//! `procs.rs` runs the programs' processes, `measure.rs` one measurement;
//! this file the plan, the repetitions and the report's rows.

use crate::report::Pending;
use crate::stats::{Summary, rep_ratios};
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

mod measure;
mod procs;

pub use measure::parse_qperf;
use measure::*;
pub use procs::rdapl_binary;
use procs::*;

/// Bound on a peer's ratio for the latency target (rdapl ≤ 1.0 × fi_pingpong).
pub const LATENCY_BOUND: f64 = 1.0;
/// Bound on the ping-pong bandwidth target (rdapl ≥ 1.0 × fi_pingpong).
pub const PINGPONG_BW_BOUND: f64 = 1.0;
/// Bound on the streaming bandwidth target (rdapl ≥ 0.95 × qperf tcp_bw).
pub const STREAM_BW_BOUND: f64 = 0.95;
/// Bandwidth targets apply from this size up (64 KiB and 1 MiB).
pub const TARGET_FROM_SIZE: usize = 64 << 10;

/// Where the client and server processes run.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// Wherever the scheduler puts them (the default: rdapl's provider has
    /// a progress thread per process, and pinning a process to one CPU puts
    /// it and a busy-polling application thread on one core).
    Unpinned,
    /// Server on the first allowed CPU, client on the second (every thread
    /// of each process), for every program alike.
    Split,
}

/// Parameters of benchmark 5.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Params {
    /// Wanted length of a counted run (rdapl, fi_pingpong), seconds.
    pub run_secs: f64,
    /// Runs of every case in a repetition; its value there is their best.
    pub runs: usize,
    /// qperf's `-t` (whole seconds, at least 1: it truncates, and 0 runs
    /// forever).
    pub qperf_secs: u32,
    /// Iterations of the calibrating warm-up run (a tenth of it, at least
    /// 2, at 1 MiB).
    pub calib_iters: usize,
    /// Fewest iterations of a measured run (a tenth of it, at least 2, at
    /// 1 MiB).
    pub min_iters: usize,
    /// Most iterations of a measured run.
    pub max_iters: usize,
    /// Warm up and calibrate (one untimed run per counted case, and one
    /// qperf `tcp_lat`); without it (`--smoke`), every counted run does
    /// `calib_iters` iterations.
    pub calibrate: bool,
    /// Bound of every process.
    pub timeout: Duration,
    /// Messages in flight for `rdapl bw`.
    pub window: usize,
    /// Where the processes run.
    pub placement: Placement,
    /// Size of the latency test.
    pub latency_size: usize,
    /// Sizes of the bandwidth tests.
    pub sizes: Vec<usize>,
}

/// What a row measures.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Test {
    /// One message in flight: one-way latency, µs.
    Latency,
    /// One message in flight: size ÷ one-way time, MB/s.
    PingpongBw,
    /// A window in flight: MB/s received.
    StreamBw,
}

impl Test {
    /// Short name (row ids).
    pub fn name(self) -> &'static str {
        match self {
            Test::Latency => "latency",
            Test::PingpongBw => "pingpong-bw",
            Test::StreamBw => "stream-bw",
        }
    }

    /// Unit of the row's value.
    pub fn unit(self) -> &'static str {
        match self {
            Test::Latency => "µs one-way",
            _ => "MB/s",
        }
    }

    /// True if a larger value is better.
    pub fn higher_is_better(self) -> bool {
        self != Test::Latency
    }
}

/// Who runs.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Program {
    /// `rdapl pingpong|bw`, busy polling, CRC on.
    RdaplPoll,
    /// The same with `crc=0`.
    RdaplPollNocrc,
    /// The same with `complete=sent` (CRC on).
    RdaplPollSent,
    /// `rdapl pingpong|bw -w`, waiting on the EVD, CRC on.
    RdaplWait,
    /// The same with `crc=0`.
    RdaplWaitNocrc,
    /// The same with `complete=sent` (CRC on).
    RdaplWaitSent,
    /// `fi_pingpong -p tcp -e msg`.
    FiPingpong,
    /// `qperf tcp_lat` / `tcp_bw`.
    Qperf,
}

impl Program {
    /// Short name (row ids).
    pub fn name(self) -> &'static str {
        match self {
            Program::RdaplPoll => "rdapl-poll",
            Program::RdaplPollNocrc => "rdapl-poll-nocrc",
            Program::RdaplPollSent => "rdapl-poll-sent",
            Program::RdaplWait => "rdapl-wait",
            Program::RdaplWaitNocrc => "rdapl-wait-nocrc",
            Program::RdaplWaitSent => "rdapl-wait-sent",
            Program::FiPingpong => "fi_pingpong",
            Program::Qperf => "qperf",
        }
    }

    /// The peer of its ratio (rdapl rows only).
    pub fn peer(self) -> Option<Program> {
        match self {
            Program::RdaplPoll | Program::RdaplPollNocrc | Program::RdaplPollSent => {
                Some(Program::FiPingpong)
            }
            Program::RdaplWait | Program::RdaplWaitNocrc | Program::RdaplWaitSent => {
                Some(Program::Qperf)
            }
            _ => None,
        }
    }

    fn waits(self) -> bool {
        matches!(
            self,
            Program::RdaplWait | Program::RdaplWaitNocrc | Program::RdaplWaitSent
        )
    }

    fn crc(self) -> bool {
        !matches!(self, Program::RdaplPollNocrc | Program::RdaplWaitNocrc)
    }

    /// Sends complete once handed to TCP (`complete=sent`).
    fn sent(self) -> bool {
        matches!(self, Program::RdaplPollSent | Program::RdaplWaitSent)
    }

    /// How the program runs `test`, in words (the report's legend).
    pub fn describe(self, test: Test) -> String {
        let sub = if test == Test::StreamBw {
            "bw"
        } else {
            "pingpong"
        };
        match self {
            Program::RdaplPoll => format!("`rdapl {sub}`, polling, CRC32c on"),
            Program::RdaplPollNocrc => format!("`rdapl {sub} --params crc=0`, polling"),
            Program::RdaplWait => format!("`rdapl {sub} -w`, waiting, CRC32c on"),
            Program::RdaplWaitNocrc => format!("`rdapl {sub} -w --params crc=0`, waiting"),
            Program::RdaplPollSent => {
                format!("`rdapl {sub} --params complete=sent`, polling, CRC32c on")
            }
            Program::RdaplWaitSent => {
                format!("`rdapl {sub} -w --params complete=sent`, waiting, CRC32c on")
            }
            Program::FiPingpong => "`fi_pingpong -p tcp -e msg`".into(),
            Program::Qperf if test == Test::StreamBw => "`qperf tcp_bw`".into(),
            Program::Qperf => "`qperf tcp_lat`".into(),
        }
    }
}

/// One measured run (or its failure).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Run {
    /// Repetition (`usize::MAX`: the warm-up run, kept only if it failed).
    pub rep: usize,
    /// Round within the repetition.
    #[serde(default)]
    pub round: usize,
    /// Position in the repetition's order of its group (0 = first).
    pub position: usize,
    /// The value (µs or MB/s); NaN (`null`) if the run failed.
    pub value: f64,
    /// Iterations asked (rdapl, fi_pingpong) or messages received (qperf).
    pub iters: u64,
    /// Wall-clock seconds of the client process.
    pub wall_s: f64,
    /// CPU time of the client's main thread ÷ its wall-clock time (`None`
    /// if unknown). A busy-polling client (rdapl polling, fi_pingpong)
    /// spins in its main thread: well below 1, it was kept off a CPU for
    /// that share of the run, and the run measured the scheduler.
    pub client_cpu_share: Option<f64>,
    /// Why the run failed.
    pub error: Option<String>,
}

/// One row: a program at a test and size.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    /// `tcp/<test>/<size>/<program>`.
    pub id: String,
    /// The test.
    pub test: Test,
    /// Message size, bytes.
    pub size: usize,
    /// `64B`, `4KiB`, ...
    pub size_label: String,
    /// The program.
    pub program: Program,
    /// The peer of the ratio (rdapl rows).
    pub peer: Option<Program>,
    /// Unit of `value`.
    pub unit: String,
    /// Per repetition: the best of its runs.
    pub value: Summary,
    /// Every run that succeeded.
    #[serde(default)]
    pub value_all: Summary,
    /// value ÷ the peer's in the same repetition.
    pub ratio_vs_peer: Summary,
    /// Every repetition's runs.
    pub runs: Vec<Run>,
    /// The client's main-thread CPU share per repetition (see
    /// [`Run::client_cpu_share`]).
    pub client_cpu_share: Summary,
    /// Failed repetitions.
    pub failed_reps: usize,
    /// Why the row (or its peer) is not measured.
    pub pending: Option<String>,
}

/// What ran and where.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Setup {
    /// The `rdapl` binary measured.
    pub rdapl_bin: Option<String>,
    /// `fi_pingpong` found.
    pub fi_pingpong: Option<String>,
    /// `qperf` found.
    pub qperf: Option<String>,
    /// Placement of the processes.
    pub placement: Option<Placement>,
    /// CPU of the servers and of the clients (`Split`).
    pub cpus: Option<(usize, usize)>,
    /// Calibrated iterations per case (`<test>/<size>/<program>`).
    pub iters: Vec<(String, u64)>,
    /// The 1-minute load average (`/proc/loadavg`) at the start of each
    /// repetition: how busy the machine was.
    pub load_avg: Vec<f64>,
    /// A failure that stopped the part (no rdapl binary, a required peer
    /// missing).
    pub error: Option<String>,
}

/// The part's results.
#[derive(Clone, Debug, Default)]
pub struct Output {
    /// The rows.
    pub rows: Vec<Row>,
    /// Rows not measured, and why.
    pub pending: Vec<Pending>,
    /// What ran.
    pub setup: Setup,
}

pub use crate::util::size_label;

/// The cases of a run, grouped: a group's members run back to back within
/// a repetition, in an order that changes from repetition to repetition.
fn groups(p: &Params) -> Vec<(Test, usize, Vec<Program>)> {
    use Program::*;
    let mut g = vec![(
        Test::Latency,
        p.latency_size,
        vec![
            RdaplPoll,
            RdaplPollNocrc,
            RdaplPollSent,
            FiPingpong,
            RdaplWait,
            RdaplWaitNocrc,
            RdaplWaitSent,
            Qperf,
        ],
    )];
    for &s in &p.sizes {
        g.push((
            Test::PingpongBw,
            s,
            vec![RdaplPoll, RdaplPollNocrc, RdaplPollSent, FiPingpong],
        ));
        g.push((
            Test::StreamBw,
            s,
            vec![RdaplWait, RdaplWaitNocrc, RdaplWaitSent, Qperf],
        ));
    }
    g
}

/// The order of a group of `n` in repetition `rep`: rotated by `rep`,
/// reversed in odd repetitions.
pub fn order(n: usize, rep: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    if n > 0 {
        v.rotate_left(rep % n);
    }
    if rep % 2 == 1 {
        v.reverse();
    }
    v
}

/// Iterations to run so that a run lasts about `secs` at `per_iter_s`,
/// within the bounds, and written exactly by fi_pingpong (whole thousands
/// from 1000 up).
pub fn iterations(secs: f64, per_iter_s: f64, min: usize, max: usize) -> u64 {
    let n = if per_iter_s > 0.0 && per_iter_s.is_finite() {
        (secs / per_iter_s).round() as usize
    } else {
        min
    };
    let n = n.clamp(min.max(1), max.max(min).max(1));
    let n = if n >= 1000 { n / 1000 * 1000 } else { n };
    n as u64
}

fn case_id(test: Test, size: usize, program: Program) -> String {
    format!("{}/{}/{}", test.name(), size_label(size), program.name())
}

/// Runs benchmark 5.
pub fn run(p: &Params, reps: usize, progress: impl Fn(&str)) -> Output {
    let mut out = Output::default();
    out.setup.placement = Some(p.placement);
    let fi = find_tool("fi_pingpong", "RDAPL_FI_PINGPONG");
    let qp = find_tool("qperf", "RDAPL_QPERF");
    out.setup.fi_pingpong = fi.as_ref().map(|p| p.display().to_string());
    out.setup.qperf = qp.as_ref().map(|p| p.display().to_string());
    let missing = |have: &Option<PathBuf>, name: &str, pkg: &str| {
        have.is_none()
            .then(|| format!("{name} not found on PATH (Debian: apt-get install {pkg})"))
    };
    let fi_missing = missing(&fi, "fi_pingpong", "libfabric-bin");
    let qp_missing = missing(&qp, "qperf", "qperf");
    for why in fi_missing.iter().chain(&qp_missing) {
        progress(&format!("peer missing: {why}: its rows are pending"));
    }
    if required() && (fi_missing.is_some() || qp_missing.is_some()) {
        out.setup.error = Some(format!(
            "{} and RDAPL_REQUIRE_EXTERNAL=1",
            fi_missing
                .iter()
                .chain(&qp_missing)
                .cloned()
                .collect::<Vec<_>>()
                .join("; ")
        ));
        return out;
    }
    let rdapl = match rdapl_binary(&|s: &str| progress(s)) {
        Ok(b) => b,
        Err(e) => {
            out.setup.error = Some(e);
            return out;
        }
    };
    out.setup.rdapl_bin = Some(rdapl.display().to_string());
    progress(&format!("rdapl binary: {}", rdapl.display()));
    let cpus = match p.placement {
        Placement::Unpinned => None,
        Placement::Split => {
            let allowed = crate::throughput::allowed_cpus();
            if allowed.len() < 2 {
                out.setup.error = Some(format!(
                    "placement split needs 2 CPUs, {} allowed",
                    allowed.len()
                ));
                return out;
            }
            Some((allowed[0], allowed[1]))
        }
    };
    out.setup.cpus = cpus;
    let tools = Tools {
        rdapl,
        fi_pingpong: fi,
        qperf: qp,
    };
    let pending_for = |prog: Program| -> Option<String> {
        match prog {
            Program::FiPingpong => fi_missing.clone(),
            Program::Qperf => qp_missing.clone(),
            _ => None,
        }
    };
    let groups = groups(p);

    // Warm-up and calibration: one untimed run of each counted case.
    let mut iters: Vec<(String, u64)> = Vec::new();
    let mut calib_errors: Vec<(String, String)> = Vec::new();
    for (test, size, progs) in &groups {
        for &prog in progs {
            if pending_for(prog).is_some() || !p.calibrate {
                continue;
            }
            if prog == Program::Qperf {
                if *test == Test::Latency
                    && let Err(e) = measure_once(&tools, p, cpus, *test, *size, prog, 0)
                {
                    calib_errors.push((case_id(*test, *size, prog), e));
                }
                continue;
            }
            let n0 = if *size >= 1 << 20 {
                (p.calib_iters / 10).max(2)
            } else {
                p.calib_iters
            } as u64;
            let id = case_id(*test, *size, prog);
            match measure_once(&tools, p, cpus, *test, *size, prog, n0) {
                Ok(m) => {
                    let min = if *size >= 1 << 20 {
                        (p.min_iters / 10).max(2)
                    } else {
                        p.min_iters
                    };
                    let n = iterations(p.run_secs, m.per_iter_s, min, p.max_iters);
                    progress(&format!(
                        "warm-up {id}: {} {} at {n0} iterations → {n} per run",
                        crate::report::num(m.value),
                        test.unit()
                    ));
                    iters.push((id, n));
                }
                Err(e) => {
                    progress(&format!("warm-up {id} FAILED: {e}"));
                    calib_errors.push((id, e));
                }
            }
        }
    }
    out.setup.iters = iters.clone();
    let iters_of = |id: &str| {
        iters
            .iter()
            .find(|(k, _)| k == id)
            .map(|(_, n)| *n)
            .unwrap_or(if p.calibrate {
                p.min_iters as u64
            } else {
                p.calib_iters as u64
            })
    };

    // The repetitions.
    let mut by_case: Vec<Vec<Vec<Run>>> = groups
        .iter()
        .map(|(_, _, progs)| progs.iter().map(|_| Vec::new()).collect())
        .collect();
    for rep in 0..reps {
        let t = Instant::now();
        let load = load_avg();
        out.setup.load_avg.push(load);
        for (g, (test, size, progs)) in groups.iter().enumerate() {
            let rounds = p.runs.max(1);
            for round in 0..rounds {
                for (position, k) in order(progs.len(), rep * rounds + round)
                    .into_iter()
                    .enumerate()
                {
                    let prog = progs[k];
                    if pending_for(prog).is_some() {
                        continue;
                    }
                    let id = case_id(*test, *size, prog);
                    let n = iters_of(&id);
                    let (value, iters, wall_s, client_cpu_share, error) =
                        match measure_once(&tools, p, cpus, *test, *size, prog, n) {
                            Ok(m) => (m.value, m.iters, m.wall_s, m.client_cpu_share, None),
                            Err(e) => {
                                progress(&format!("rep {rep} {id} FAILED: {e}"));
                                (f64::NAN, n, 0.0, None, Some(e))
                            }
                        };
                    by_case[g][k].push(Run {
                        rep,
                        round,
                        position,
                        value,
                        iters,
                        wall_s,
                        client_cpu_share,
                        error,
                    });
                }
            }
        }
        progress(&format!(
            "repetition {}/{reps} ({:.1} s, load average {load:.2} at its start)",
            rep + 1,
            t.elapsed().as_secs_f64()
        ));
    }

    // Rows.
    for (g, (test, size, progs)) in groups.iter().enumerate() {
        let best = |k: usize| best_per_rep(&by_case[g][k], reps, test.higher_is_better());
        let values = |b: &[Option<&Run>]| -> Vec<f64> {
            b.iter().map(|r| r.map_or(f64::NAN, |r| r.value)).collect()
        };
        for (k, &prog) in progs.iter().enumerate() {
            let id = format!("tcp/{}", case_id(*test, *size, prog));
            let b = best(k);
            let v = values(&b);
            let share: Vec<f64> = b
                .iter()
                .map(|r| r.and_then(|r| r.client_cpu_share).unwrap_or(f64::NAN))
                .collect();
            let all: Vec<f64> = by_case[g][k]
                .iter()
                .map(|r| r.value)
                .filter(|v| v.is_finite())
                .collect();
            let peer = prog.peer();
            let peer_k = peer.and_then(|q| progs.iter().position(|x| *x == q));
            let ratio = match peer_k {
                Some(pk) => Summary::of(&rep_ratios(&v, &values(&best(pk)), reps)),
                None => Summary::of(&[]),
            };
            let mut rruns = by_case[g][k].clone();
            if let Some((_, e)) = calib_errors
                .iter()
                .find(|(c, _)| *c == case_id(*test, *size, prog))
            {
                rruns.push(Run {
                    rep: usize::MAX,
                    round: 0,
                    position: 0,
                    value: f64::NAN,
                    iters: 0,
                    wall_s: 0.0,
                    client_cpu_share: None,
                    error: Some(format!("warm-up: {e}")),
                });
            }
            let failed = rruns.iter().filter(|r| r.error.is_some()).count();
            let pending = pending_for(prog)
                .or_else(|| peer.and_then(pending_for).map(|w| format!("peer: {w}")));
            if let Some(why) = pending_for(prog) {
                out.pending.push(Pending {
                    id: id.clone(),
                    status: why,
                });
            }
            out.rows.push(Row {
                id,
                test: *test,
                size: *size,
                size_label: size_label(*size),
                program: prog,
                peer,
                unit: test.unit().into(),
                value: Summary::of(&v),
                value_all: Summary::of(&all),
                ratio_vs_peer: ratio,
                client_cpu_share: Summary::of(&share),
                runs: rruns,
                failed_reps: failed,
                pending,
            });
        }
    }
    out
}

/// Each repetition's best successful run (`None` if none succeeded): the
/// highest value if `higher` is better, else the lowest.
pub fn best_per_rep(runs: &[Run], reps: usize, higher: bool) -> Vec<Option<&Run>> {
    let mut b: Vec<Option<&Run>> = vec![None; reps];
    for r in runs.iter().filter(|r| r.value.is_finite() && r.rep < reps) {
        let better = match b[r.rep] {
            None => true,
            Some(o) if higher => r.value > o.value,
            Some(o) => r.value < o.value,
        };
        if better {
            b[r.rep] = Some(r);
        }
    }
    b
}

/// True if `r` is the row a target judges.
pub fn target_of(r: &Row) -> Option<(f64, crate::report::Compare)> {
    use crate::report::Compare;
    match (r.test, r.program) {
        (Test::Latency, Program::RdaplPoll) => Some((LATENCY_BOUND, Compare::AtMost)),
        (Test::PingpongBw, Program::RdaplPoll) if r.size >= TARGET_FROM_SIZE => {
            Some((PINGPONG_BW_BOUND, Compare::AtLeast))
        }
        (Test::StreamBw, Program::RdaplWait) if r.size >= TARGET_FROM_SIZE => {
            Some((STREAM_BW_BOUND, Compare::AtLeast))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repetition_counts_its_best_run() {
        let run = |rep, round, value: f64| Run {
            rep,
            round,
            position: 0,
            value,
            iters: 1,
            wall_s: 0.1,
            client_cpu_share: None,
            error: value.is_nan().then(|| "failed".to_string()),
        };
        let runs = [
            run(0, 0, 800.0),
            run(0, 1, 2400.0),
            run(0, 2, 900.0),
            run(1, 0, f64::NAN),
            run(1, 1, 1500.0),
            run(2, 0, f64::NAN),
            run(usize::MAX, 0, f64::NAN),
        ];
        let v = |higher| -> Vec<Option<f64>> {
            best_per_rep(&runs, 3, higher)
                .iter()
                .map(|r| r.map(|r| r.value))
                .collect()
        };
        assert_eq!(v(true), [Some(2400.0), Some(1500.0), None]);
        assert_eq!(v(false), [Some(800.0), Some(1500.0), None]);
    }

    #[test]
    fn orders_rotate_and_reverse() {
        assert_eq!(order(3, 0), vec![0, 1, 2]);
        assert_eq!(order(3, 1), vec![0, 2, 1]);
        assert_eq!(order(3, 2), vec![2, 0, 1]);
        assert_eq!(order(3, 3), vec![2, 1, 0]);
        // Every case runs first in some repetition.
        let firsts: std::collections::BTreeSet<usize> = (0..6).map(|r| order(3, r)[0]).collect();
        assert_eq!(firsts.len(), 3);
    }

    #[test]
    fn fi_pingpong_formats() {
        assert_eq!(fi_count(999), "999");
        assert_eq!(fi_count(2000), "2k");
        assert_eq!(fi_count(2500), "2k");
        assert_eq!(fi_size(64), "64");
        assert_eq!(fi_size(4096), "4k");
        assert_eq!(fi_size(65536), "64k");
        assert_eq!(fi_size(1 << 20), "1m");
        assert_eq!(fi_size(1536), "1.5k");
        let out = "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n\
                   64      2k      =2k      250k        0.38s      0.67      95.21       0.01\n";
        let f = table_row(out).unwrap();
        assert_eq!(f[2], "=2k");
        assert_eq!(num(f[6]), Some(95.21));
    }

    #[test]
    fn iterations_round_for_fi_pingpong() {
        assert_eq!(iterations(0.3, 1e-4, 10, 100_000), 3000);
        assert_eq!(iterations(0.3, 2.9e-4, 10, 100_000), 1000);
        assert_eq!(iterations(0.3, 1e-3, 10, 100_000), 300);
        assert_eq!(iterations(0.3, 1.0, 10, 100_000), 10);
        assert_eq!(iterations(0.3, 1e-9, 10, 100_000), 100_000);
        assert_eq!(iterations(0.3, f64::NAN, 10, 100_000), 10);
    }

    #[test]
    fn qperf_output_is_read_and_checked() {
        let lat = "tcp_lat:\n    latency         =  39038 ns\n    msg_rate        =  25616 /sec\n\
                   loc_send_msgs   =  12809 \n    loc_recv_msgs   =  12808 \n\
                   rem_send_msgs   =  12808 \n    rem_recv_msgs   =  12808 \n";
        assert_eq!(parse_qperf(lat, Test::Latency), Ok((39.038, 12808)));
        let bw = "tcp_bw:\n    bw          =  1136918528 bytes/sec\n    send_msgs   =       17347 \n\
                  recv_bytes  =  1136918528 bytes\n    recv_msgs   =       17348 \n";
        let (v, n) = parse_qperf(bw, Test::StreamBw).unwrap();
        assert!((v - 1136.918528).abs() < 1e-9 && n == 17348);
        let bad = format!("{bw}    recv_errors =  3 \n");
        assert!(parse_qperf(&bad, Test::StreamBw).is_err());
        assert!(parse_qperf("tcp_bw:\n    bw = 5 bytes/sec\n", Test::StreamBw).is_err());
    }

    fn sh(script: &str) -> (PathBuf, Vec<String>) {
        (PathBuf::from("/bin/sh"), vec!["-c".into(), script.into()])
    }

    #[test]
    fn a_server_that_never_listens_is_killed() {
        let port = free_port().unwrap();
        let t = Instant::now();
        let (b, a) = sh("echo hello; exec sleep 30");
        let e = run_pair(
            (&b, a.clone()),
            (&b, a),
            port,
            false,
            None,
            Duration::from_millis(300),
        )
        .err()
        .unwrap();
        assert!(e.contains("not listening"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_client_past_its_timeout_is_killed_with_the_server() {
        // Something listens on the port (this test), so the client starts.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let t = Instant::now();
        let (b, srv) = sh("exec sleep 30");
        let (_, cli) = sh("sleep 30 & wait");
        let e = run_pair(
            (&b, srv),
            (&b, cli),
            port,
            true,
            None,
            Duration::from_millis(300),
        )
        .err()
        .unwrap();
        assert!(e.contains("still running"), "{e}");
        // The readers returned: every process of both groups is gone.
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_failing_client_is_an_error() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let (b, srv) = sh("exec sleep 30");
        let (_, cli) = sh("echo broken >&2; exit 3");
        let e = run_pair(
            (&b, srv),
            (&b, cli),
            port,
            true,
            None,
            Duration::from_secs(5),
        )
        .err()
        .unwrap();
        assert!(e.contains("failed") && e.contains("broken"), "{e}");
    }

    #[test]
    fn a_clients_main_thread_cpu_is_read_before_it_is_reaped() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let (b, srv) = sh("exec sleep 30");
        let (_, spin) = sh("i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done");
        let out = run_pair(
            (&b, srv.clone()),
            (&b, spin),
            port,
            true,
            None,
            Duration::from_secs(20),
        )
        .unwrap();
        let busy = out.client_cpu_share.expect("a CPU share");
        let (_, idle) = sh("exec sleep 0.3");
        let out = run_pair(
            (&b, srv),
            (&b, idle),
            port,
            true,
            None,
            Duration::from_secs(20),
        )
        .unwrap();
        let asleep = out.client_cpu_share.expect("a CPU share");
        assert!(busy > 0.2 && asleep < 0.1, "busy {busy}, asleep {asleep}");
    }

    #[test]
    fn proc_net_tcp_shows_a_listener() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert!(listening(port));
        drop(l);
        assert!(!listening(port));
    }
}
