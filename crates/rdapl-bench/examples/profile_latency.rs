//! Runs one ping-pong method for a while, for a profiler:
//!
//! ```sh
//! cargo build --release -p rdapl-bench --example profile_latency
//! perf stat -e task-clock,context-switches target/release/examples/profile_latency evd-wait 3
//! ```
//!
//! Arguments: method (`evd-upcall`, `evd-wait`, `evd-poll`,
//! `crossbeam-blocking`, `crossbeam-poll`), seconds (at most 60). Prints the
//! round trips done and their median.

use rdapl_bench::latency::{Method, Params, run_method};
use rdapl_bench::stats::percentile_sorted;
use std::time::Duration;

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let method = Method::ALL
        .into_iter()
        .find(|m| Some(m.name()) == a.first().map(String::as_str))
        .unwrap_or(Method::EvdWait);
    let secs = a
        .get(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3u64)
        .clamp(1, 60);
    let p = Params {
        warmup_iters: 100,
        iters: 10_000_000,
        limit: Duration::from_secs(secs),
        grace: Duration::from_secs(3),
        capacity: 1024,
    };
    let mut r = run_method(method, &p);
    r.samples.sort_unstable();
    println!(
        "{}: {} round trips, median {:.0} ns, p99 {:.0} ns{}",
        method.name(),
        r.samples.len(),
        percentile_sorted(&r.samples, 50.0),
        percentile_sorted(&r.samples, 99.0),
        if r.failed { ", FAILED" } else { "" }
    );
}
