//! RDMA Write and Read bandwidth on the loopback provider against memcpy
//! of the same bytes, measured in interleaved turns.

use super::*;

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
    pub(super) fn failed() -> BwRun {
        BwRun {
            bytes_per_s: f64::NAN,
            ops: 0,
            failed: true,
        }
    }
}

/// Page size assumed for buffer placement.
pub(super) const PAGE: usize = 4096;

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
pub(super) struct Buffers {
    pub(super) size: usize,
    pub(super) a: Lmr,
    pub(super) b: Lmr,
    pub(super) ra: std::sync::Arc<Region>,
    pub(super) rb: std::sync::Arc<Region>,
    /// Offsets of the page-aligned ranges in `a` and `b`.
    pub(super) a_off: usize,
    pub(super) b_off: usize,
    pub(super) a_iov: [LmrTriplet; 1],
    pub(super) b_remote: RmrTriplet,
    /// Seed of the next fill pattern.
    pub(super) seed: u8,
}

impl Buffers {
    pub(super) fn new(pair: &Pair, size: usize) -> rdapl::Result<Buffers> {
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

    pub(super) fn free(self) {
        let _ = self.a.free();
        let _ = self.b.free();
    }
}

/// One end of a direction: its LMR, the region's memory, and where the
/// page-aligned range starts.
pub(super) struct End<'a> {
    pub(super) lmr: &'a Lmr,
    pub(super) region: &'a Region,
    pub(super) off: usize,
}

/// Transfers per clock read for `size`: about [`ROUND_BYTES`], at least
/// (and a multiple of) the window.
pub(super) fn ops_per_round(size: usize, window: usize) -> u64 {
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
pub(super) fn measure(ts: &[Transfer], pair: &Pair, bufs: &mut Buffers, p: &Params) -> Vec<BwRun> {
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
