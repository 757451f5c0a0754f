//! Benchmark 4 (issue 4, part 4): DTOs through rdapl's in-process loopback
//! provider, against the cheapest in-process equivalents measured in the
//! same run.
//!
//! **Half round trip of a 64-byte send/receive.** Two IAs on distinct
//! `127.x` addresses, one connected endpoint pair; the measuring thread owns
//! the client endpoint, an echo thread the server endpoint. Each side has
//! one DTO EVD (receive, request and connection streams), keeps
//! `recv_depth` 64-byte receives posted, and reposts the ones it consumed
//! right after its next send: a reply goes out first, and the receive it
//! answered is replenished after it, as UCX's `rc_verbs` transport does
//! (it reposts receives after its receive handlers ran, in batches). With 4
//! receives posted the peer always finds one, and the repost overlaps the
//! peer's turn instead of delaying the reply. A message is a signalled
//! `post_send` of a 64-byte registered buffer whose first 8 bytes carry the
//! iteration number (written with `write_at`, read back from the receive
//! slot with `read_at`). The sender's own `Send` completion arrives on its
//! EVD before the reply and is consumed (and checked) on the way. One round
//! trip is timed from before the initiator's send (and its repost of the
//! last reply's receive) to after its reply was read; the half round trip
//! is half of it.
//!
//! | method | how a side learns of the next message | peer of its ratio |
//! |---|---|---|
//! | `rdapl-poll` | busy polling `dequeue` on its EVD | `crossbeam-poll` |
//! | `rdapl-wait` | blocking `wait(timeout, 1)` on its EVD | `crossbeam-blocking` |
//! | `crossbeam-poll` | `crossbeam_channel::bounded` of `[u8; 64]`, busy `try_recv` | – |
//! | `crossbeam-blocking` | the same channels, blocking `recv_timeout` | – |
//!
//! Busy polling uses the suite's spin-then-yield policy
//! ([`crate::util::spin_poll`]) on both sides. Both blocking forms block
//! for at most [`BLOCK_SLICE`] per call and check the run's hard deadline
//! when a call times out, so no run can hang (a timeout computed from the
//! deadline would read the clock at every call, and a side makes its calls
//! between its send and the reply, where about 30 ns per clock read here
//! can end up on the reply's path). Median and
//! p99 per repetition; the ratio rdapl/crossbeam is taken within the
//! repetition (lower is better). Target: within 2× of crossbeam.
//!
//! **The same ping-pong on one thread** (`rdapl-poll`, `crossbeam-poll`):
//! both ends driven in turn by the calling thread, so nothing crosses cores
//! and nobody waits. Its half round trip is the software path alone
//! (instructions and locked operations), set against crossbeam's two-thread
//! half round trip of the same repetition: where that ratio is high, the
//! two-thread target depends on how slow cross-core transfers are at the
//! time. Not a strict floor: on two threads part of each side's work (its
//! own send completion, its reposts) overlaps the peer's turn. Context
//! only, no target.
//!
//! **RDMA write and read bandwidth** at every size of `sizes` (4 KiB,
//! 64 KiB, 1 MiB, 16 MiB). The client posts RDMA writes of its registered
//! region (`size` bytes) into the server's registered region (and, as the
//! other direction, RDMA reads of the server's region into its own),
//! keeping up to `window` requests outstanding and reaping completions with
//! `dequeue` (each checked: success, `size` bytes, the right operation).
//! The peer of each direction is `copy_from_slice` of `size` bytes in the
//! same direction between the very same two buffers (two distinct
//! `Vec<u8>`, the regions' backing memory, reached through
//! `Region::read`/`write` with no rdapl call in the loop): the same cache
//! footprint (source plus destination: in L2 at 64 KiB, in the last-level
//! cache at 1 MiB, mostly memory at 16 MiB), the same alignment (every range
//! starts on a page boundary) and the same physical pages, so the ratio
//! measures rdapl's path and nothing else (see `Buffers` for why separate
//! buffers would not do). Every buffer is filled with non-zero bytes before
//! it is used (no first-touch page faults in the window). In each trial,
//! each direction's RDMA transfer and its memcpy are interleaved round by
//! round (`measure`: a round is about 1 MiB, the order rotates every turn,
//! each round is timed on its own), `bw_warmup` then at least `bw_window`,
//! `bw_min_ops` transfers and `bw_min_bytes` bytes each, so both see the
//! same machine. The destination is checked after the measured rounds, and
//! then each transfer alone moves a fresh pattern, so a transfer that moved
//! nothing cannot pass. Rate in GB/s (10⁹ bytes/s); ratio rdapl/memcpy
//! within the trial.
//! Target: ≥ 0.90 from 64 KiB up.
//!
//! All of it runs in the calling thread except the echo side of the
//! ping-pong: the loopback provider executes a request in the poster's
//! thread, so an RDMA transfer is complete (data copied, completion queued)
//! when `post_rdma_write` returns; the window bounds the completions not yet
//! reaped, not requests waiting to execute.
//!
//! `pair.rs` is the connected endpoint pair, `half_rtt.rs` the half round
//! trip, `bandwidth.rs` the RDMA bandwidth; this file the parameters and
//! the report's rows.

use crate::latency::Run;
use crate::stats::{Summary, percentile_sorted, ratio, rep_ratios, sorted_pools};
use crate::util::{as_nanos, spin_poll};
use rdapl::{
    Buf, CloseFlags, CompletionFlags, ConnectionEventKind, DtoOp, DtoStatus, Ep, Evd, EvdFlags,
    Event, Ia, IaOpen, IaOptions, Lmr, LmrTriplet, MemPriv, Psp, Pz, Region, RmrTriplet,
};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod bandwidth;
mod half_rtt;
mod pair;

pub use bandwidth::*;
pub use half_rtt::*;
use pair::*;

/// Parameters of the loopback benchmark.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Params {
    /// Round trips dropped at the start of each ping-pong run.
    pub warmup_iters: usize,
    /// Round trips recorded per ping-pong run.
    pub iters: usize,
    /// Wall-clock cap of one ping-pong run (then it stops with fewer samples).
    pub limit: Duration,
    /// Extra time after `limit` before a side gives up waiting (the run is
    /// then reported as failed).
    pub grace: Duration,
    /// Receives each side of the ping-pong keeps posted.
    pub recv_depth: usize,
    /// Queue length of every EVD, and the bound of the crossbeam channels.
    pub capacity: usize,
    /// Transfer sizes of the bandwidth benchmark, bytes.
    pub sizes: Vec<usize>,
    /// RDMA requests kept outstanding.
    pub window: usize,
    /// Bandwidth trials per repetition (each measures both directions of
    /// one size, an RDMA transfer interleaved with its memcpy).
    pub bw_trials_per_rep: usize,
    /// Warm-up of each transfer in a bandwidth run.
    pub bw_warmup: Duration,
    /// Minimum measured time of each transfer in a bandwidth run.
    pub bw_window: Duration,
    /// Minimum transfers of each bandwidth run.
    pub bw_min_ops: u64,
    /// Minimum bytes moved by each bandwidth run (more transfers of the
    /// largest sizes, whose trials are otherwise short and noisy).
    pub bw_min_bytes: u64,
    /// Maximum transfers of each bandwidth run (a bound, normally not hit).
    pub bw_max_ops: u64,
}

/// Size of a ping-pong message.
pub const MSG: usize = 64;

/// The value that ends a ping-pong run.
const STOP: u64 = u64::MAX;

/// Timeout of every connection-setup step.
const SETUP_TIMEOUT: Duration = Duration::from_secs(5);

const SERVER_ADDR: &str = "127.0.84.1";
const CLIENT_ADDR: &str = "127.0.84.2";

/// Bytes moved between two reads of the clock in a bandwidth run.
const ROUND_BYTES: usize = 1 << 20;

/// Target: the median half round trip at most this many times crossbeam's.
pub const HALF_RTT_BOUND: f64 = 2.0;

/// Target: RDMA GB/s at least this fraction of memcpy's ...
pub const BANDWIDTH_BOUND: f64 = 0.90;

/// ... from this size up.
pub const TARGET_FROM_SIZE: usize = 64 << 10;

/// Whether a bandwidth row has a target (an RDMA transfer of at least
/// [`TARGET_FROM_SIZE`]).
pub fn has_target(r: &BandwidthRow) -> bool {
    r.transfer.is_rdma() && r.size >= TARGET_FROM_SIZE
}

/// A ping-pong method.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// Loopback send/receive of owned buffers (`post_send_buf`,
    /// `post_recv_buf`), completions by busy `dequeue`.
    RdaplBufPoll,
    /// Loopback send/receive of owned buffers, completions by blocking
    /// `wait`.
    RdaplBufWait,
    /// Loopback send/receive of LMR triplets (`write_at`, `post_send`,
    /// `read_at`), completions by busy `dequeue`.
    RdaplPoll,
    /// Loopback send/receive of LMR triplets, completions by blocking
    /// `wait`.
    RdaplWait,
    /// crossbeam-channel, busy `try_recv`.
    CrossbeamPoll,
    /// crossbeam-channel, blocking `recv_timeout`.
    CrossbeamBlocking,
}

impl Method {
    /// Every method, in report order.
    pub const ALL: [Method; 6] = [
        Method::RdaplBufPoll,
        Method::RdaplBufWait,
        Method::RdaplPoll,
        Method::RdaplWait,
        Method::CrossbeamPoll,
        Method::CrossbeamBlocking,
    ];

    /// Short name used in row ids.
    pub fn name(self) -> &'static str {
        match self {
            Method::RdaplBufPoll => "rdapl-buf-poll",
            Method::RdaplBufWait => "rdapl-buf-wait",
            Method::RdaplPoll => "rdapl-poll",
            Method::RdaplWait => "rdapl-wait",
            Method::CrossbeamPoll => "crossbeam-poll",
            Method::CrossbeamBlocking => "crossbeam-blocking",
        }
    }

    /// The peer this method's ratio is taken against.
    pub fn peer(self) -> Method {
        match self {
            Method::RdaplBufPoll | Method::RdaplPoll | Method::CrossbeamPoll => {
                Method::CrossbeamPoll
            }
            Method::RdaplBufWait | Method::RdaplWait | Method::CrossbeamBlocking => {
                Method::CrossbeamBlocking
            }
        }
    }

    fn blocking(self) -> bool {
        matches!(
            self,
            Method::RdaplBufWait | Method::RdaplWait | Method::CrossbeamBlocking
        )
    }
}

/// A bulk transfer of the bandwidth benchmark. Both directions move data
/// between the same two registered buffers: the client's region `a` and the
/// server's region `b`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Transfer {
    /// `post_rdma_write` of `a` into `b`.
    RdmaWrite,
    /// `post_rdma_read` of `b` into `a`.
    RdmaRead,
    /// `copy_from_slice` of `a` into `b`, no rdapl call (the peer of
    /// `rdma-write`).
    MemcpyWrite,
    /// `copy_from_slice` of `b` into `a`, no rdapl call (the peer of
    /// `rdma-read`).
    MemcpyRead,
}

impl Transfer {
    /// Every transfer, in report order.
    pub const ALL: [Transfer; 4] = [
        Transfer::RdmaWrite,
        Transfer::RdmaRead,
        Transfer::MemcpyWrite,
        Transfer::MemcpyRead,
    ];

    /// Short name used in row ids.
    pub fn name(self) -> &'static str {
        match self {
            Transfer::RdmaWrite => "rdma-write",
            Transfer::RdmaRead => "rdma-read",
            Transfer::MemcpyWrite => "memcpy-write",
            Transfer::MemcpyRead => "memcpy-read",
        }
    }

    /// The memcpy of the same direction (itself for a memcpy).
    pub fn peer(self) -> Transfer {
        match self {
            Transfer::RdmaWrite | Transfer::MemcpyWrite => Transfer::MemcpyWrite,
            Transfer::RdmaRead | Transfer::MemcpyRead => Transfer::MemcpyRead,
        }
    }

    /// An rdapl RDMA transfer (not a memcpy).
    pub fn is_rdma(self) -> bool {
        matches!(self, Transfer::RdmaWrite | Transfer::RdmaRead)
    }

    /// Client region into server region (`a` → `b`).
    fn client_to_server(self) -> bool {
        matches!(self, Transfer::RdmaWrite | Transfer::MemcpyWrite)
    }
}

pub use crate::util::size_label;

/// One half-round-trip row of the report.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HalfRttRow {
    /// `loopback/half-rtt/<method>`.
    pub id: String,
    /// The method.
    pub method: Method,
    /// The peer of the ratios.
    pub peer: Method,
    /// Message size, bytes.
    pub message_bytes: usize,
    /// Median half round trip, ns (absolute, context only).
    pub half_rtt_median_ns: Summary,
    /// 99th percentile half round trip, ns (absolute, context only).
    pub half_rtt_p99_ns: Summary,
    /// Median / the peer's, per repetition (lower is better).
    pub ratio_median_vs_peer: Summary,
    /// p99 / the peer's, per repetition (lower is better).
    pub ratio_p99_vs_peer: Summary,
    /// Round trips recorded per repetition.
    pub samples: Vec<usize>,
    /// Repetitions that hit the time cap before `iters` round trips.
    pub capped_reps: usize,
    /// Repetitions that failed: setup error, a side stuck, a wrong value or
    /// a failed completion.
    pub failed_reps: usize,
}

/// One row of the software path alone: the 64-byte ping-pong with both
/// ends driven by one thread, in turn (nothing crosses cores or waits), so
/// its time is the instructions and locked operations of the path. Context
/// for the half-round-trip target: no target of its own.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SerialRow {
    /// `loopback/half-rtt-serial/<method>`.
    pub id: String,
    /// The method (`rdapl-poll` or `crossbeam-poll`).
    pub method: Method,
    /// Median half round trip with both ends on one thread, ns.
    pub half_rtt_median_ns: Summary,
    /// Round trips recorded per repetition.
    pub samples: Vec<usize>,
    /// Repetitions that failed (setup error, a wrong value, a failed
    /// completion).
    pub failed_reps: usize,
}

/// One bandwidth row of the report.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BandwidthRow {
    /// `loopback/bandwidth/<size>/<transfer>`.
    pub id: String,
    /// Bytes per transfer.
    pub size: usize,
    /// `size` in words (`64KiB`).
    pub size_label: String,
    /// The transfer.
    pub transfer: Transfer,
    /// The peer of the ratio: the memcpy of the same direction.
    pub peer: Transfer,
    /// GB/s (10⁹ bytes per second) per trial (context).
    pub gb_per_s: Summary,
    /// GB/s ÷ the peer's GB/s (same size, same trial).
    pub ratio_vs_memcpy: Summary,
    /// Transfers timed per trial.
    pub ops: Vec<u64>,
    /// Trials that failed (setup error, a failed post or completion,
    /// or the destination differing from the source afterwards).
    pub failed_reps: usize,
}

/// Everything the loopback benchmark produced.
#[derive(Clone, Debug, Default)]
pub struct Output {
    /// Half-round-trip rows, in [`Method::ALL`] order.
    pub half_rtt: Vec<HalfRttRow>,
    /// Bandwidth rows, per size, in [`Transfer::ALL`] order.
    pub bandwidth: Vec<BandwidthRow>,
    /// Every half round trip of every repetition (ns), sorted, per method.
    pub pooled_half_rtt: Vec<(Method, Vec<u64>)>,
    /// The software path alone, per method of [`SERIAL_METHODS`].
    pub serial: Vec<SerialRow>,
}

/// The methods measured with both ends on one thread: the busy-polling
/// ones (a blocking one would only be run non-blocking).
pub const SERIAL_METHODS: [Method; 3] = [
    Method::RdaplBufPoll,
    Method::RdaplPoll,
    Method::CrossbeamPoll,
];

fn half_rtt_rows(
    p: &Params,
    reps: usize,
    progress: &mut impl FnMut(&str),
) -> (Vec<HalfRttRow>, Vec<(Method, Vec<u64>)>) {
    let n = Method::ALL.len();
    let mut med = vec![vec![f64::NAN; reps]; n];
    let mut p99 = vec![vec![f64::NAN; reps]; n];
    let mut counts = vec![Vec::new(); n];
    let mut capped = vec![0usize; n];
    let mut failed = vec![0usize; n];
    let mut pooled: Vec<Vec<u64>> = vec![Vec::new(); n];
    for rep in 0..reps {
        for k in 0..n {
            let mi = (k + rep) % n;
            let m = Method::ALL[mi];
            let mut r = run_half_rtt(m, p);
            r.samples.sort_unstable();
            med[mi][rep] = percentile_sorted(&r.samples, 50.0) / 2.0;
            p99[mi][rep] = percentile_sorted(&r.samples, 99.0) / 2.0;
            counts[mi].push(r.samples.len());
            capped[mi] += usize::from(r.capped);
            failed[mi] += usize::from(r.failed);
            progress(&format!(
                "rep {}/{reps} half-rtt {:<19} median {:>8.0} ns  p99 {:>8.0} ns  ({} round trips{}{})",
                rep + 1,
                m.name(),
                med[mi][rep],
                p99[mi][rep],
                r.samples.len(),
                if r.capped { ", capped" } else { "" },
                if r.failed { ", FAILED" } else { "" },
            ));
            pooled[mi].extend(r.samples.iter().map(|s| s / 2));
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
            HalfRttRow {
                id: format!("loopback/half-rtt/{}", m.name()),
                method: *m,
                peer: m.peer(),
                message_bytes: MSG,
                half_rtt_median_ns: Summary::of(&med[mi]),
                half_rtt_p99_ns: Summary::of(&p99[mi]),
                ratio_median_vs_peer: Summary::of(&rm),
                ratio_p99_vs_peer: Summary::of(&rp),
                samples: counts[mi].clone(),
                capped_reps: capped[mi],
                failed_reps: failed[mi],
            }
        })
        .collect();
    let pooled = sorted_pools(&Method::ALL, pooled);
    (rows, pooled)
}

fn bandwidth_rows(p: &Params, reps: usize, progress: &mut impl FnMut(&str)) -> Vec<BandwidthRow> {
    let nt = Transfer::ALL.len();
    let trials = (reps * p.bw_trials_per_rep).max(1);
    let pair = Pair::connect(p.capacity);
    if let Err(e) = &pair {
        progress(&format!("bandwidth: setup FAILED: {e}"));
    }
    let mut rows = Vec::new();
    for &size in &p.sizes {
        let label = size_label(size);
        let mut rates = vec![vec![f64::NAN; trials]; nt];
        let mut ops = vec![vec![0u64; trials]; nt];
        let mut failed = vec![0usize; nt];
        let setup = pair.as_ref().map_err(Clone::clone).and_then(|pr| {
            Buffers::new(pr, size)
                .map(|b| (pr, b))
                .map_err(|e| e.to_string())
        });
        match setup {
            Ok((pair, mut bufs)) => {
                for trial in 0..trials {
                    let mut line = format!("trial {:>2}/{trials} bandwidth {label:>5}:", trial + 1);
                    // Each direction's rdapl transfer and memcpy interleaved
                    // (`measure`); which direction goes first, and which of
                    // the two starts, rotate over the trials.
                    for d in 0..2 {
                        let (rdma, memcpy) = if (d + trial) % 2 == 0 {
                            (Transfer::RdmaWrite, Transfer::MemcpyWrite)
                        } else {
                            (Transfer::RdmaRead, Transfer::MemcpyRead)
                        };
                        let ts = if (trial / 2) % 2 == 0 {
                            [rdma, memcpy]
                        } else {
                            [memcpy, rdma]
                        };
                        for (t, r) in ts.iter().zip(measure(&ts, pair, &mut bufs, p)) {
                            let ti = Transfer::ALL.iter().position(|x| x == t).unwrap_or(0);
                            rates[ti][trial] = r.bytes_per_s;
                            ops[ti][trial] = r.ops;
                            failed[ti] += usize::from(r.failed);
                        }
                    }
                    for (ti, t) in Transfer::ALL.iter().enumerate() {
                        line.push_str(&format!(
                            "  {} {:.2} GB/s{}",
                            t.name(),
                            rates[ti][trial] / 1e9,
                            if rates[ti][trial].is_nan() {
                                " (FAILED)"
                            } else {
                                ""
                            }
                        ));
                    }
                    progress(&line);
                }
                bufs.free();
            }
            Err(e) => {
                progress(&format!("bandwidth {label}: setup FAILED: {e}"));
                failed.iter_mut().for_each(|f| *f = trials);
            }
        }
        for (ti, t) in Transfer::ALL.iter().enumerate() {
            let peer = Transfer::ALL
                .iter()
                .position(|x| *x == t.peer())
                .unwrap_or(ti);
            let gb: Vec<f64> = rates[ti].iter().map(|r| r / 1e9).collect();
            let rs: Vec<f64> = (0..trials)
                .map(|r| ratio(rates[ti][r], rates[peer][r]))
                .collect();
            rows.push(BandwidthRow {
                id: format!("loopback/bandwidth/{label}/{}", t.name()),
                size,
                size_label: label.clone(),
                transfer: *t,
                peer: t.peer(),
                gb_per_s: Summary::of(&gb),
                ratio_vs_memcpy: Summary::of(&rs),
                ops: ops[ti].clone(),
                failed_reps: failed[ti],
            });
        }
    }
    rows
}

/// The software-path rows: each repetition runs every method of
/// [`SERIAL_METHODS`] with both ends on this thread, in a rotating order.
fn serial_rows(p: &Params, reps: usize, progress: &mut impl FnMut(&str)) -> Vec<SerialRow> {
    let n = SERIAL_METHODS.len();
    // Per method, one median per repetition, in repetition order.
    let mut med = vec![Vec::with_capacity(reps); n];
    let mut counts = vec![Vec::new(); n];
    let mut failed = vec![0usize; n];
    for rep in 0..reps {
        for k in 0..n {
            let mi = (k + rep) % n;
            let m = SERIAL_METHODS[mi];
            let mut r = run_half_rtt_serial(m, p);
            r.samples.sort_unstable();
            let median = percentile_sorted(&r.samples, 50.0) / 2.0;
            med[mi].push(median);
            counts[mi].push(r.samples.len());
            failed[mi] += usize::from(r.failed);
            progress(&format!(
                "rep {}/{reps} half-rtt one thread {:<15} median {:>8.0} ns  ({} round trips{})",
                rep + 1,
                m.name(),
                median,
                r.samples.len(),
                if r.failed { ", FAILED" } else { "" },
            ));
        }
    }
    SERIAL_METHODS
        .iter()
        .enumerate()
        .map(|(mi, m)| SerialRow {
            id: format!("loopback/half-rtt-serial/{}", m.name()),
            method: *m,
            half_rtt_median_ns: Summary::of(&med[mi]),
            samples: counts[mi].clone(),
            failed_reps: failed[mi],
        })
        .collect()
}

/// Runs the half round trips (on two threads, then on one), then the
/// bandwidth at every size, for `reps` repetitions each.
pub fn run(p: &Params, reps: usize, mut progress: impl FnMut(&str)) -> Output {
    let reps = reps.max(1);
    let (half_rtt, pooled_half_rtt) = half_rtt_rows(p, reps, &mut progress);
    let serial = serial_rows(p, reps, &mut progress);
    let bandwidth = bandwidth_rows(p, reps, &mut progress);
    Output {
        half_rtt,
        bandwidth,
        pooled_half_rtt,
        serial,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_rounds() {
        assert_eq!(size_label(4096), "4KiB");
        assert_eq!(size_label(64 << 10), "64KiB");
        assert_eq!(size_label(1 << 20), "1MiB");
        assert_eq!(size_label(16 << 20), "16MiB");
        assert_eq!(size_label(100), "100B");
        assert_eq!(ops_per_round(4096, 8), 256);
        assert_eq!(ops_per_round(64 << 10, 8), 16);
        assert_eq!(ops_per_round(16 << 20, 8), 8);
        assert_eq!(ops_per_round(3000, 8), 352);
        assert_eq!(value_of(&payload(0xdead_beef)), 0xdead_beef);
    }

    /// `measure` runs a direction's two transfers in whole turns (so each
    /// made the same number of transfers), checks the data and gives each
    /// its own rate; transfers of two directions are refused.
    #[test]
    fn measure_interleaves_a_direction() {
        let p = crate::config::Scale::smoke().loopback;
        let pair = Pair::connect(p.capacity).expect("connecting the loopback pair");
        let mut bufs = Buffers::new(&pair, 64 << 10).expect("registering the buffers");
        for ts in [
            [Transfer::RdmaWrite, Transfer::MemcpyWrite],
            [Transfer::MemcpyRead, Transfer::RdmaRead],
        ] {
            let runs = measure(&ts, &pair, &mut bufs, &p);
            assert_eq!(runs.len(), 2);
            for r in &runs {
                assert!(!r.failed, "{ts:?}: {r:?}");
                assert!(r.ops >= ops_per_round(bufs.size, p.window), "{r:?}");
                assert!(r.bytes_per_s.is_finite() && r.bytes_per_s > 0.0, "{r:?}");
            }
            assert_eq!(runs[0].ops, runs[1].ops, "{ts:?}: whole turns");
        }
        let mixed = measure(
            &[Transfer::RdmaWrite, Transfer::MemcpyRead],
            &pair,
            &mut bufs,
            &p,
        );
        assert_eq!(mixed.len(), 2);
        assert!(mixed.iter().all(|r| r.failed), "{mixed:?}");
        bufs.free();
    }
}
