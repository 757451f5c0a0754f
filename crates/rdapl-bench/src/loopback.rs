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

/// `4KiB`, `64KiB`, `1MiB`, `16MiB`, or bytes (`100B`).
pub fn size_label(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{}MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{}KiB", n >> 10)
    } else {
        format!("{n}B")
    }
}

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

// ---------------------------------------------------------------------------
// A connected endpoint pair.

/// One side: an IA, its protection zone, one DTO/connection EVD and one
/// endpoint using it for every stream.
struct Side {
    ia: Ia,
    pz: Pz,
    evd: Evd,
    ep: Ep,
}

fn open_side(addr: &str, qlen: usize) -> rdapl::Result<Side> {
    let ia = Ia::open_with(
        "loopback",
        IaOptions {
            params: format!("addr={addr}"),
            ..Default::default()
        },
    )?;
    let rest = (|| {
        let pz = ia.pz_create()?;
        let evd = ia.evd_create(qlen, EvdFlags::DTO | EvdFlags::CONNECTION | EvdFlags::CR)?;
        let ep = ia.ep_create(&pz, Some(&evd), Some(&evd), Some(&evd), None)?;
        Ok((pz, evd, ep))
    })();
    match rest {
        Ok((pz, evd, ep)) => Ok(Side { ia, pz, evd, ep }),
        Err(e) => {
            let _ = ia.close(CloseFlags::Abrupt);
            Err(e)
        }
    }
}

/// A connected pair; dropping it disconnects and closes both IAs.
struct Pair {
    server: Side,
    client: Side,
    psp: Psp,
}

impl Pair {
    /// Opens both sides and connects them (server: accepts on a fresh
    /// connection qualifier).
    fn connect(qlen: usize) -> Result<Pair, String> {
        static NEXT_QUAL: AtomicU64 = AtomicU64::new(0);
        let server = open_side(SERVER_ADDR, qlen).map_err(|e| format!("server IA: {e}"))?;
        let client = match open_side(CLIENT_ADDR, qlen) {
            Ok(c) => c,
            Err(e) => {
                let _ = server.ia.close(CloseFlags::Abrupt);
                return Err(format!("client IA: {e}"));
            }
        };
        let qual = 47_000 + NEXT_QUAL.fetch_add(1, Ordering::Relaxed);
        let psp = match server.ia.psp_create(qual, &server.evd) {
            Ok(p) => p,
            Err(e) => {
                for s in [&server, &client] {
                    let _ = s.ia.close(CloseFlags::Abrupt);
                }
                return Err(format!("psp_create: {e}"));
            }
        };
        // From here on, dropping `pair` tears everything down.
        let pair = Pair {
            server,
            client,
            psp,
        };
        let (s, c) = (&pair.server, &pair.client);
        c.ep.connect(s.ia.address(), qual, Some(SETUP_TIMEOUT), b"rdapl-bench")
            .map_err(|e| format!("connect: {e}"))?;
        let cr = match s.evd.wait(Some(SETUP_TIMEOUT), 1) {
            Ok((Event::ConnectionRequest(a), _)) => {
                s.ia.cr(a.cr).map_err(|e| format!("cr: {e}"))?
            }
            other => return Err(format!("expected a connection request, got {other:?}")),
        };
        cr.accept(&s.ep, b"").map_err(|e| format!("accept: {e}"))?;
        for (who, evd) in [("server", &s.evd), ("client", &c.evd)] {
            match evd.wait(Some(SETUP_TIMEOUT), 1) {
                Ok((Event::Connection(e), _)) if e.kind == ConnectionEventKind::Established => {}
                other => return Err(format!("{who}: expected Established, got {other:?}")),
            }
        }
        Ok(pair)
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        let _ = self.client.ep.disconnect(false);
        let _ = self.psp.free();
        for s in [&self.client, &self.server] {
            let _ = s.ep.free();
            let _ = s.ia.close(CloseFlags::Abrupt);
        }
    }
}

// ---------------------------------------------------------------------------
// Half round trip.

/// The 64-byte message carrying `v`.
fn payload(v: u64) -> [u8; MSG] {
    let mut m = [0u8; MSG];
    m[..8].copy_from_slice(&v.to_le_bytes());
    m
}

fn value_of(m: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&m[..8]);
    u64::from_le_bytes(b)
}

/// One side of a ping-pong.
trait Peer: Send + 'static {
    /// Sends `v`; false if that failed.
    fn send(&mut self, v: u64) -> bool;
    /// The next value; `None` on failure or once `hard` passed.
    fn recv(&mut self, hard: Instant) -> Option<u64>;
}

/// A loopback endpoint sending and receiving 64-byte messages.
struct Messenger {
    ep: Ep,
    evd: Evd,
    send_lmr: Lmr,
    send_iov: [LmrTriplet; 1],
    /// Where the message starts in the send region.
    send_off: usize,
    recv_lmr: Lmr,
    recv_iov: Vec<LmrTriplet>,
    /// Where receive slot 0 starts in the receive region (slot `k` is
    /// `SLOT` bytes further per `k`).
    recv_off: usize,
    /// Receive slots consumed and not yet reposted (reposted after the
    /// next send).
    consumed: Vec<usize>,
    blocking: bool,
}

/// The spacing of the 64-byte messages in registered memory: a 128-byte
/// pair of cache lines each.
const SLOT: usize = 128;

impl Messenger {
    /// Registers a send buffer and `depth` receive slots on `side`, and
    /// posts every receive.
    fn new(side: &Side, depth: usize, blocking: bool) -> rdapl::Result<Messenger> {
        let depth = depth.max(1);
        // Every message on a 128-byte pair of lines of its own (as owned
        // buffers are): `n` slots and room to align the first.
        let region = |n: usize| Region::from_vec(vec![1; (n + 1) * SLOT]);
        let aligned = |r: &Region| (SLOT - r.address() as usize % SLOT) % SLOT;
        let send_region = region(1);
        let send_off = aligned(&send_region);
        let recv_region = region(depth);
        let recv_off = aligned(&recv_region);
        let send_lmr = side.pz.lmr_create(send_region, MemPriv::ALL)?;
        let recv_lmr = side.pz.lmr_create(recv_region, MemPriv::ALL)?;
        let send_iov = [send_lmr.triplet(send_off as u64, MSG as u64)?];
        let recv_iov = (0..depth)
            .map(|k| recv_lmr.triplet((recv_off + k * SLOT) as u64, MSG as u64))
            .collect::<rdapl::Result<Vec<_>>>()?;
        let m = Messenger {
            ep: side.ep.clone(),
            evd: side.evd.clone(),
            send_lmr,
            send_iov,
            send_off,
            recv_lmr,
            recv_iov,
            recv_off,
            consumed: Vec::with_capacity(depth),
            blocking,
        };
        for slot in 0..depth {
            m.repost(slot)?;
        }
        Ok(m)
    }

    fn repost(&self, slot: usize) -> rdapl::Result<()> {
        self.ep.post_recv(
            &self.recv_iov[slot..slot + 1],
            slot as u64,
            CompletionFlags::DEFAULT,
        )
    }

    /// Handles one completion: `Some(v)` for a received message (its slot
    /// is set aside, to be reposted after the next send), `None` for this
    /// side's own send completion, `Err` for anything else (a failed DTO, a
    /// connection event). (A function of the fields it needs, so that a
    /// poll loop borrows the EVD and these apart.)
    fn on_event(
        (recv_lmr, recv_off, depth): (&Lmr, usize, usize),
        consumed: &mut Vec<usize>,
        ev: Event,
    ) -> Result<Option<u64>, ()> {
        let Event::Dto(d) = ev else { return Err(()) };
        if d.status != DtoStatus::Success {
            return Err(());
        }
        match d.operation {
            DtoOp::Send => Ok(None),
            DtoOp::Receive if d.transferred_length == MSG as u64 => {
                let slot = usize::try_from(d.cookie).map_err(|_| ())?;
                if slot >= depth || consumed.len() == depth {
                    return Err(());
                }
                let mut head = [0u8; 8];
                recv_lmr
                    .read_at(recv_off + slot * SLOT, &mut head)
                    .map_err(|_| ())?;
                consumed.push(slot);
                Ok(Some(value_of(&head)))
            }
            _ => Err(()),
        }
    }
}

impl Peer for Messenger {
    fn send(&mut self, v: u64) -> bool {
        let sent = self.send_lmr.write_at(self.send_off, &payload(v)).is_ok()
            && self
                .ep
                .post_send(&self.send_iov, v, CompletionFlags::DEFAULT)
                .is_ok();
        // The reply first, then the receives it consumed (see the module
        // documentation).
        let mut reposted = sent;
        while let Some(slot) = self.consumed.pop() {
            reposted &= self.repost(slot).is_ok();
        }
        reposted
    }

    fn recv(&mut self, hard: Instant) -> Option<u64> {
        let Messenger {
            evd,
            recv_lmr,
            recv_iov,
            recv_off,
            consumed,
            blocking,
            ..
        } = self;
        let recv = (&*recv_lmr, *recv_off, recv_iov.len());
        next_value(evd, *blocking, hard, |ev| {
            Messenger::on_event(recv, consumed, ev)
        })
    }
}

/// How long a side waits for its send buffer to come back.
const SEND_BUF_WAIT: Duration = Duration::from_secs(2);

/// A loopback endpoint sending and receiving 64-byte messages in owned
/// buffers: each completion hands its buffer back, a received one is read
/// in place and reposted, the send buffer is written in place for the next
/// message.
struct BufMessenger {
    ep: Ep,
    evd: Evd,
    /// The send buffer, while no send of it is outstanding.
    send_buf: Option<Buf>,
    /// Receive buffers consumed and not yet reposted (reposted after the
    /// next send), with their cookies.
    consumed: Vec<(Buf, u64)>,
    /// How many receive buffers it has.
    depth: usize,
    blocking: bool,
}

impl BufMessenger {
    /// A send buffer and `depth` posted receive buffers on `side`.
    fn new(side: &Side, depth: usize, blocking: bool) -> Result<BufMessenger, String> {
        let depth = depth.max(1);
        for slot in 0..depth {
            let b = side.pz.buf_create(MSG).map_err(|e| e.to_string())?;
            side.ep
                .post_recv_buf(b, slot as u64, CompletionFlags::DEFAULT)
                .map_err(|e| e.to_string())?;
        }
        Ok(BufMessenger {
            ep: side.ep.clone(),
            evd: side.evd.clone(),
            send_buf: Some(side.pz.buf_create(MSG).map_err(|e| e.to_string())?),
            consumed: Vec::with_capacity(depth),
            depth,
            blocking,
        })
    }

    /// As [`Messenger::on_event`]; the send completion gives the send
    /// buffer back (into `send_buf`), a received buffer goes to
    /// `consumed` (at most `depth` of them).
    fn on_event(
        send_buf: &mut Option<Buf>,
        consumed: &mut Vec<(Buf, u64)>,
        depth: usize,
        ev: Event,
    ) -> Result<Option<u64>, ()> {
        let Event::Dto(d) = ev else { return Err(()) };
        if d.status != DtoStatus::Success {
            return Err(());
        }
        let buf = d.buf.ok_or(())?;
        match d.operation {
            DtoOp::Send => {
                *send_buf = Some(buf);
                Ok(None)
            }
            DtoOp::Receive if d.transferred_length == MSG as u64 && consumed.len() < depth => {
                let v = value_of(&buf);
                consumed.push((buf, d.cookie));
                Ok(Some(v))
            }
            _ => Err(()),
        }
    }
}

impl Peer for BufMessenger {
    fn send(&mut self, v: u64) -> bool {
        // The buffer comes back with the last send's completion, which can
        // land after the reply to it: wait for it (the peer sends nothing
        // before this message, so any other event is a failure).
        if self.send_buf.is_none() {
            let hard = Instant::now() + SEND_BUF_WAIT;
            let (evd, send_buf) = (&self.evd, &mut self.send_buf);
            let (consumed, depth) = (&mut self.consumed, self.depth);
            let back = spin_poll(hard, || match evd.dequeue() {
                Ok(Some(ev)) => match BufMessenger::on_event(send_buf, consumed, depth, ev) {
                    Ok(None) => Ok(send_buf.is_some().then_some(())),
                    _ => Err(()),
                },
                Ok(None) => Ok(None),
                Err(_) => Err(()),
            });
            if back.is_none() {
                return false;
            }
        }
        let Some(mut b) = self.send_buf.take() else {
            return false;
        };
        b.copy_from_slice(&payload(v));
        let sent = self
            .ep
            .post_send_buf(b, MSG, v, CompletionFlags::DEFAULT)
            .is_ok();
        // The reply first, then the receives it consumed (see the module
        // documentation).
        let mut reposted = sent;
        while let Some((b, cookie)) = self.consumed.pop() {
            reposted &= self
                .ep
                .post_recv_buf(b, cookie, CompletionFlags::DEFAULT)
                .is_ok();
        }
        reposted
    }

    fn recv(&mut self, hard: Instant) -> Option<u64> {
        let (evd, send_buf) = (&self.evd, &mut self.send_buf);
        let (consumed, depth) = (&mut self.consumed, self.depth);
        next_value(evd, self.blocking, hard, |ev| {
            BufMessenger::on_event(send_buf, consumed, depth, ev)
        })
    }
}

/// The next value received on `evd` (busy `dequeue`, or blocking `wait`
/// if `blocking`), each event handled by `on_event` (`Some`: a value,
/// `None`: the side's own send completion, `Err`: a failure); `None` on
/// failure or once `hard` passed. Bounded: every `wait` returns within
/// [`BLOCK_SLICE`], and each turn consumes an event, or gives up if `hard`
/// passed.
fn next_value(
    evd: &Evd,
    blocking: bool,
    hard: Instant,
    mut on_event: impl FnMut(Event) -> Result<Option<u64>, ()>,
) -> Option<u64> {
    if !blocking {
        return spin_poll(hard, || match evd.dequeue() {
            Ok(Some(ev)) => on_event(ev),
            Ok(None) => Ok(None),
            Err(_) => Err(()),
        });
    }
    loop {
        let ev = match evd.wait(Some(BLOCK_SLICE), 1) {
            Ok((ev, _)) => ev,
            Err(rdapl::Error::TimeoutExpired { .. }) if Instant::now() < hard => continue,
            Err(_) => return None,
        };
        match on_event(ev) {
            Ok(Some(v)) => return Some(v),
            Ok(None) => {}
            Err(()) => return None,
        }
    }
}

/// The longest one blocking call of a ping-pong side lasts (`wait`,
/// `recv_timeout`): far longer than a round trip, short enough to notice
/// the run's hard deadline in good time.
pub const BLOCK_SLICE: Duration = Duration::from_millis(20);

/// One side of a crossbeam ping-pong of `[u8; 64]`.
struct Chan {
    tx: crossbeam_channel::Sender<[u8; MSG]>,
    rx: crossbeam_channel::Receiver<[u8; MSG]>,
    blocking: bool,
}

impl Peer for Chan {
    fn send(&mut self, v: u64) -> bool {
        self.tx.send(payload(v)).is_ok()
    }

    fn recv(&mut self, hard: Instant) -> Option<u64> {
        if self.blocking {
            loop {
                match self.rx.recv_timeout(BLOCK_SLICE) {
                    Ok(m) => return Some(value_of(&m)),
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) if Instant::now() < hard => {}
                    Err(_) => return None,
                }
            }
        }
        spin_poll(hard, || match self.rx.try_recv() {
            Ok(m) => Ok(Some(value_of(&m))),
            Err(crossbeam_channel::TryRecvError::Empty) => Ok(None),
            Err(crossbeam_channel::TryRecvError::Disconnected) => Err(()),
        })
    }
}

/// Ping-pong between this thread (`me`) and an echo thread (`echo`).
fn pingpong<P: Peer>(mut me: P, echo: P, p: &Params) -> Run {
    let start = Instant::now();
    let deadline = start + p.limit;
    let hard = deadline + p.grace;
    let failed = Run {
        failed: true,
        ..Run::default()
    };
    let echo = std::thread::Builder::new()
        .name("lb-echo".into())
        .spawn(move || {
            let mut echo = echo;
            // Bounded: every `recv` returns by `hard`.
            loop {
                match echo.recv(hard) {
                    Some(STOP) => return true,
                    Some(v) => {
                        if !echo.send(v) {
                            return false;
                        }
                    }
                    None => return false,
                }
            }
        });
    let Ok(echo) = echo else { return failed };
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
        if !me.send(i) {
            run.failed = true;
            break;
        }
        match me.recv(hard) {
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
    let stopped = me.send(STOP);
    let echo_ok = echo.join().unwrap_or(false);
    run.failed |= !(stopped && echo_ok);
    run
}

/// Both ends of the ping-pong driven by this one thread, in turn (the
/// report's software-path rows and the profiling example): each round trip
/// does exactly the work of the two-thread ping-pong (send and repost,
/// consume the completions, read the value, echo back) but nothing ever
/// crosses cores or waits,
/// so its time is the software path alone.
fn serial<P: Peer>(mut me: P, mut echo: P, p: &Params) -> Run {
    let deadline = Instant::now() + p.limit;
    let hard = deadline + p.grace;
    let mut run = Run {
        samples: Vec::with_capacity(p.iters.min(1 << 20)),
        ..Run::default()
    };
    for i in 0..(p.warmup_iters + p.iters) as u64 {
        if Instant::now() > deadline {
            run.capped = true;
            break;
        }
        let t0 = Instant::now();
        let ok =
            me.send(i) && echo.recv(hard) == Some(i) && echo.send(i) && me.recv(hard) == Some(i);
        if !ok {
            run.failed = true;
            break;
        }
        if i as usize >= p.warmup_iters {
            run.samples.push(as_nanos(t0.elapsed()));
        }
    }
    run
}

/// [`run_half_rtt`] with both ends in this thread (see `serial`); for the
/// non-blocking methods only (a blocking one is run non-blocking).
pub fn run_half_rtt_serial(m: Method, p: &Params) -> Run {
    match m {
        Method::RdaplBufPoll | Method::RdaplBufWait => {
            loopback_pingpong(m, p, |s| BufMessenger::new(s, p.recv_depth, false), serial)
        }
        Method::RdaplPoll | Method::RdaplWait => loopback_pingpong(
            m,
            p,
            |s| Messenger::new(s, p.recv_depth, false).map_err(|e| e.to_string()),
            serial,
        ),
        Method::CrossbeamPoll | Method::CrossbeamBlocking => {
            let (t1, r1) = crossbeam_channel::bounded(p.capacity);
            let (t2, r2) = crossbeam_channel::bounded(p.capacity);
            let chan = |tx, rx| Chan {
                tx,
                rx,
                blocking: false,
            };
            serial(chan(t1, r2), chan(t2, r1), p)
        }
    }
}

/// `drive` ([`pingpong`] or [`serial`]) between the two ends of a new
/// connected pair, each end made by `end`; setup errors are printed and
/// make the run `failed`.
fn loopback_pingpong<P: Peer>(
    m: Method,
    p: &Params,
    end: impl Fn(&Side) -> Result<P, String>,
    drive: fn(P, P, &Params) -> Run,
) -> Run {
    let failed = || Run {
        failed: true,
        ..Run::default()
    };
    let pair = match Pair::connect(p.capacity) {
        Ok(pair) => pair,
        Err(e) => {
            eprintln!("loopback {}: setup failed: {e}", m.name());
            return failed();
        }
    };
    match (end(&pair.client), end(&pair.server)) {
        (Ok(me), Ok(echo)) => drive(me, echo, p),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("loopback {}: setting up the buffers: {e}", m.name());
            failed()
        }
    }
}

/// Runs one ping-pong method once; `Run::samples` are round trips (ns).
/// Setup errors are printed to stderr and make the run `failed`.
pub fn run_half_rtt(m: Method, p: &Params) -> Run {
    let blocking = m.blocking();
    match m {
        Method::RdaplBufPoll | Method::RdaplBufWait => loopback_pingpong(
            m,
            p,
            |s| BufMessenger::new(s, p.recv_depth, blocking),
            pingpong,
        ),
        Method::RdaplPoll | Method::RdaplWait => loopback_pingpong(
            m,
            p,
            |s| Messenger::new(s, p.recv_depth, blocking).map_err(|e| e.to_string()),
            pingpong,
        ),
        Method::CrossbeamPoll | Method::CrossbeamBlocking => {
            let (t1, r1) = crossbeam_channel::bounded(p.capacity);
            let (t2, r2) = crossbeam_channel::bounded(p.capacity);
            pingpong(
                Chan {
                    tx: t1,
                    rx: r2,
                    blocking,
                },
                Chan {
                    tx: t2,
                    rx: r1,
                    blocking,
                },
                p,
            )
        }
    }
}

// ---------------------------------------------------------------------------
// Bandwidth.

/// The outcome of one bandwidth run.
#[derive(Clone, Debug, Default)]
pub struct BwRun {
    /// Bytes per second over the measured window (NaN if failed).
    pub bytes_per_s: f64,
    /// Transfers in the measured window.
    pub ops: u64,
    /// A post, a completion or the final comparison failed.
    pub failed: bool,
}

impl BwRun {
    fn failed() -> BwRun {
        BwRun {
            bytes_per_s: f64::NAN,
            ops: 0,
            failed: true,
        }
    }
}

/// Page size assumed for buffer placement.
const PAGE: usize = 4096;

/// Offset of the first page boundary at or after `addr`.
fn to_page(addr: usize) -> usize {
    (PAGE - addr % PAGE) % PAGE
}

/// The two buffers of one size: the client's registered region `a` and the
/// server's `b`, each a `Vec<u8>` of `size + PAGE` non-zero bytes (no
/// first-touch page faults later) handed to `Region::from_vec`.
///
/// The memcpy peers copy between the very same memory (through
/// `Region::read` / `Region::write`, the guards taken once per run, outside
/// the timed loop), so the subject and its peer differ only by rdapl's
/// path: same physical pages, same alignment, same cache footprint. Two
/// separate pairs of buffers would not do: `memcpy`'s speed depends on the
/// destination's distance from the source modulo the page size (on this
/// machine's glibc, a destination 16 bytes past the source modulo 4 KiB, as
/// two back-to-back `malloc`s place them, copies 4 KiB at about 2 GB/s
/// instead of 30–70 GB/s), and at 16 MiB on where the pages landed (two
/// pairs of 16 MiB buffers differed by ±10% from run to run, either way).
/// Every transferred range starts on a page boundary, in both buffers.
struct Buffers {
    size: usize,
    a: Lmr,
    b: Lmr,
    ra: std::sync::Arc<Region>,
    rb: std::sync::Arc<Region>,
    /// Offsets of the page-aligned ranges in `a` and `b`.
    a_off: usize,
    b_off: usize,
    a_iov: [LmrTriplet; 1],
    b_remote: RmrTriplet,
    /// Seed of the next fill pattern.
    seed: u8,
}

impl Buffers {
    fn new(pair: &Pair, size: usize) -> rdapl::Result<Buffers> {
        let region = || {
            let r = Region::from_vec(vec![1; size + PAGE]);
            let off = to_page(r.address() as usize);
            (r, off)
        };
        let (ra, a_off) = region();
        let (rb, b_off) = region();
        let a = pair.client.pz.lmr_create(ra.clone(), MemPriv::ALL)?;
        let b = pair.server.pz.lmr_create(rb.clone(), MemPriv::ALL)?;
        let a_iov = [a.triplet(a_off as u64, size as u64)?];
        let b_remote = b.rmr_triplet(b_off as u64, size as u64)?;
        Ok(Buffers {
            size,
            a,
            b,
            ra,
            rb,
            a_off,
            b_off,
            a_iov,
            b_remote,
            seed: 0,
        })
    }

    /// A fresh pattern (never all ones, never the previous one).
    fn next_pattern(&mut self) -> Vec<u8> {
        self.seed = self.seed.wrapping_add(1);
        let seed = self.seed;
        (0..self.size)
            .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
            .collect()
    }

    /// The source and destination of a direction: `a` → `b` for a write,
    /// `b` → `a` for a read.
    fn ends(&self, write: bool) -> (End<'_>, End<'_>) {
        let a = End {
            lmr: &self.a,
            region: &self.ra,
            off: self.a_off,
        };
        let b = End {
            lmr: &self.b,
            region: &self.rb,
            off: self.b_off,
        };
        if write { (a, b) } else { (b, a) }
    }

    /// Writes a fresh pattern into the direction's source range; returns it.
    fn fill_source(&mut self, write: bool) -> Option<Vec<u8>> {
        let pattern = self.next_pattern();
        let (src, _) = self.ends(write);
        src.lmr.write_at(src.off, &pattern).ok()?;
        Some(pattern)
    }

    /// Whether the direction's destination range holds `pattern`.
    fn dest_holds(&self, write: bool, pattern: &[u8]) -> bool {
        let (_, dst) = self.ends(write);
        let mut got = vec![0u8; self.size];
        dst.lmr.read_at(dst.off, &mut got).is_ok() && got == pattern
    }

    fn free(self) {
        let _ = self.a.free();
        let _ = self.b.free();
    }
}

/// One end of a direction: its LMR, the region's memory, and where the
/// page-aligned range starts.
struct End<'a> {
    lmr: &'a Lmr,
    region: &'a Region,
    off: usize,
}

/// Transfers per clock read for `size`: about [`ROUND_BYTES`], at least
/// (and a multiple of) the window.
fn ops_per_round(size: usize, window: usize) -> u64 {
    let w = window.max(1);
    let n = ROUND_BYTES.div_ceil(size.max(1)).max(w);
    n.div_ceil(w) as u64 * w as u64
}

/// `n` RDMA transfers of the whole region, up to `window` outstanding,
/// completions reaped with `dequeue` and checked.
fn rdma_round(
    side: &Side,
    bufs: &Buffers,
    write: bool,
    n: u64,
    window: usize,
    grace: Duration,
) -> bool {
    let hard = Instant::now() + grace;
    let op = if write {
        DtoOp::RdmaWrite
    } else {
        DtoOp::RdmaRead
    };
    let len = bufs.size as u64;
    let window = window.max(1) as u64;
    let (mut posted, mut done) = (0u64, 0u64);
    let reap = || match side.evd.dequeue() {
        Ok(Some(Event::Dto(d))) => Ok(Some(
            d.status == DtoStatus::Success && d.operation == op && d.transferred_length == len,
        )),
        Ok(Some(_)) | Err(_) => Err(()),
        Ok(None) => Ok(None),
    };
    while done < n {
        while posted < n && posted - done < window {
            let r = if write {
                side.ep.post_rdma_write(
                    &bufs.a_iov,
                    bufs.b_remote,
                    posted,
                    CompletionFlags::DEFAULT,
                )
            } else {
                side.ep
                    .post_rdma_read(&bufs.a_iov, bufs.b_remote, posted, CompletionFlags::DEFAULT)
            };
            if r.is_err() {
                return false;
            }
            posted += 1;
        }
        // At least one completion, then whatever else is already there.
        if spin_poll(hard, &reap) != Some(true) {
            return false;
        }
        done += 1;
        while done < posted {
            match reap() {
                Ok(Some(true)) => done += 1,
                Ok(None) => break,
                _ => return false,
            }
        }
    }
    true
}

fn memcpy_round(src: &[u8], dst: &mut [u8], n: u64) -> bool {
    let src = std::hint::black_box(src);
    for _ in 0..n {
        dst.copy_from_slice(src);
        std::hint::black_box(&mut *dst);
    }
    true
}

/// One round of `t`: `n` transfers of the whole range between the buffers.
fn transfer_round(t: Transfer, pair: &Pair, bufs: &Buffers, n: u64, p: &Params) -> bool {
    let write = t.client_to_server();
    if t.is_rdma() {
        return rdma_round(&pair.client, bufs, write, n, p.window, p.grace);
    }
    let (src, dst) = bufs.ends(write);
    // The regions' own memory, locked for the round (one read and one write
    // lock per round of about `ROUND_BYTES`; the provider takes them per
    // transfer).
    let from = src.region.read();
    let mut to = dst.region.write();
    let len = bufs.size;
    memcpy_round(
        &from[src.off..src.off + len],
        &mut to[dst.off..dst.off + len],
        n,
    )
}

/// Runs whole turns of `ts` (one round of `per_round` transfers of each,
/// the order rotating every turn: A B, B A, ...). After each round of
/// `ts[j]`, `after_round(j, turn_done)` says whether to stop (only heeded
/// at the end of a turn). False if a round failed.
fn turns(
    ts: &[Transfer],
    pair: &Pair,
    bufs: &Buffers,
    per_round: u64,
    p: &Params,
    mut after_round: impl FnMut(usize, bool) -> bool,
) -> bool {
    let k = ts.len();
    if k == 0 {
        return true;
    }
    for turn in 0.. {
        for i in 0..k {
            let j = (i + turn) % k;
            if !transfer_round(ts[j], pair, bufs, per_round, p) {
                return false;
            }
            let turn_done = i + 1 == k;
            if after_round(j, turn_done) && turn_done {
                return true;
            }
        }
    }
    true
}

/// Measures the transfers `ts`, all of one direction between the same two
/// buffers, interleaved round by round (a round is `ops_per_round`: about
/// `ROUND_BYTES`, at least the window):
/// each turn runs one round of each, the order rotating every turn (A B,
/// B A, A B, ...), each round timed on its own, for `bw_warmup` then at
/// least `bw_window` per transfer, `bw_min_ops` transfers and
/// `bw_min_bytes` bytes each. So an rdapl transfer and its memcpy share
/// the machine's state round by round: at 16 MiB, where both run from
/// memory, one transfer's rate moved between 9 and 22 GB/s from one 30 ms
/// run to the next, and a ratio of runs made one after the other missed
/// the target in one full run of 2026-12-01 (0.87 at the median) with the
/// two rates' means 6% apart.
///
/// Checked: every RDMA completion (`rdma_round`); the destination holds
/// the source's fresh pattern after the measured rounds; and then each
/// transfer on its own moves a new pattern (one untimed transfer each), so
/// a transfer that moved nothing cannot pass behind its peer.
fn measure(ts: &[Transfer], pair: &Pair, bufs: &mut Buffers, p: &Params) -> Vec<BwRun> {
    let k = ts.len();
    let failed = || vec![BwRun::failed(); k];
    let Some(write) = ts.first().map(|t| t.client_to_server()) else {
        return Vec::new();
    };
    if ts.iter().any(|t| t.client_to_server() != write) {
        return failed();
    }
    let n = bufs.size;
    let per_round = ops_per_round(n, p.window);
    let min_ops = p.bw_min_ops.max(p.bw_min_bytes.div_ceil(n.max(1) as u64));
    let max_ops = p.bw_max_ops.max(1);
    let Some(pattern) = bufs.fill_source(write) else {
        return failed();
    };
    let n_turns = k as u32;
    let mut ops = vec![0u64; k];
    let mut time = vec![Duration::ZERO; k];
    {
        let b: &Buffers = bufs;
        // Warm-up: `bw_warmup` per transfer, or `bw_max_ops` of each.
        let warm_end = Instant::now() + p.bw_warmup * n_turns;
        let mut warm_ops = 0u64;
        let warmed = turns(ts, pair, b, per_round, p, |_, turn_done| {
            warm_ops += u64::from(turn_done) * per_round;
            turn_done && (warm_ops >= max_ops || Instant::now() >= warm_end)
        });
        // Measured: one clock read per round, each round's time to its
        // transfer.
        let mut last = Instant::now();
        let end = last + p.bw_window * n_turns;
        let measured = warmed
            && turns(ts, pair, b, per_round, p, |j, turn_done| {
                let now = Instant::now();
                time[j] += now - last;
                last = now;
                ops[j] += per_round;
                let enough = last >= end && ops.iter().all(|&o| o >= min_ops);
                turn_done && (enough || ops.iter().any(|&o| o >= max_ops))
            });
        if !measured || !b.dest_holds(write, &pattern) {
            return failed();
        }
    }
    for &t in ts {
        let Some(pattern) = bufs.fill_source(write) else {
            return failed();
        };
        if !transfer_round(t, pair, bufs, 1, p) || !bufs.dest_holds(write, &pattern) {
            return failed();
        }
    }
    ops.iter()
        .zip(&time)
        .map(|(&o, dt)| BwRun {
            bytes_per_s: (o as f64 * n as f64) / dt.as_secs_f64().max(1e-12),
            ops: o,
            failed: false,
        })
        .collect()
}

/// Runs one bulk transfer of `size` bytes once (its own connection and
/// buffers), for the profiling example.
pub fn run_bandwidth(t: Transfer, size: usize, p: &Params) -> BwRun {
    let pair = match Pair::connect(p.capacity) {
        Ok(pair) => pair,
        Err(e) => {
            eprintln!("loopback bandwidth: setup failed: {e}");
            return BwRun::failed();
        }
    };
    let Ok(mut bufs) = Buffers::new(&pair, size) else {
        return BwRun::failed();
    };
    let r = measure(&[t], &pair, &mut bufs, p)
        .pop()
        .unwrap_or_else(BwRun::failed);
    bufs.free();
    r
}

// ---------------------------------------------------------------------------
// The benchmark.

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
