//! Alternates one loopback ping-pong method with its crossbeam peer in
//! short pieces, in one process, for comparisons that hold still on a
//! noisy machine:
//!
//! ```sh
//! cargo run --release -p rdapl-bench --example alternate -- 60 rdapl-buf-wait > alt.txt
//! python3 crates/rdapl-bench/scripts/phases.py alt.txt
//! ```
//!
//! Arguments: seconds (default 10, at most 3600) and method (default
//! `rdapl-buf-poll`; any of `rdapl-bench`'s ping-pong methods). Each piece
//! runs the peer, the method, and the peer again (each up to 3,000 round
//! trips or 50 ms) and prints one line of median half round trips in ns:
//! `peer method peer`.
//!
//! This machine's speed changes in phases lasting seconds to minutes
//! (crossbeam's half round trip about 80, 150–200 or 500–700 ns); a piece
//! this short usually sees one phase, so `scripts/phases.py` can group the
//! pieces by the peer's speed and compare like with like. Two builds
//! compared this way run in separate processes, so alternate them in turns
//! of a few seconds and compare within a phase group.

use rdapl_bench::config::Scale;
use rdapl_bench::loopback::{Method, Params, run_half_rtt};
use rdapl_bench::stats::percentile_sorted;
use std::time::{Duration, Instant};

/// The median half round trip of one run of `m` (NaN if it recorded
/// nothing, e.g. the machine stalled for the whole piece).
fn median(m: Method, p: &Params) -> f64 {
    let mut r = run_half_rtt(m, p);
    r.samples.sort_unstable();
    percentile_sorted(&r.samples, 50.0) / 2.0
}

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let secs = a
        .first()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10u64)
        .clamp(1, 3600);
    let m = a
        .get(1)
        .and_then(|name| Method::ALL.into_iter().find(|m| m.name() == name))
        .unwrap_or(Method::RdaplBufPoll);
    // Short pieces; the rest as in the full suite.
    let p = Params {
        warmup_iters: 200,
        iters: 3000,
        limit: Duration::from_millis(50),
        ..Scale::full().loopback
    };
    eprintln!("{} against {}", m.name(), m.peer().name());
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        let before = median(m.peer(), &p);
        let x = median(m, &p);
        let after = median(m.peer(), &p);
        println!("{before:.0} {x:.0} {after:.0}");
    }
}
