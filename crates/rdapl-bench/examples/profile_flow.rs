//! Runs one consumer of the seed's flow at one load for a while, for a
//! profiler:
//!
//! ```sh
//! cargo build --release -p rdapl-bench --example profile_flow
//! perf stat -e task-clock,context-switches target/release/examples/profile_flow poller low 3
//! ```
//!
//! Arguments: consumer (`poller`, `pure-upcall`, `pure-polling`), load
//! (`low`, `medium`, `saturating`), seconds (at most 60).

use rdapl_bench::config::Scale;
use rdapl_bench::flow::{Consumer, Load, run_single};
use rdapl_bench::stats::percentile_sorted;
use std::time::Duration;

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let consumer = Consumer::ALL
        .into_iter()
        .find(|c| Some(c.name()) == a.first().map(String::as_str))
        .unwrap_or(Consumer::Poller);
    let load = Load::ALL
        .into_iter()
        .find(|l| Some(l.name()) == a.get(1).map(String::as_str))
        .unwrap_or(Load::Low);
    let secs = a
        .get(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3u64)
        .clamp(1, 60);
    let mut p = Scale::full().flow;
    p.window = Duration::from_secs(secs);
    p.max_samples = 1_000_000;
    let r = run_single(consumer, load, &p);
    println!(
        "{} at {} load: {:.0} events/s, {:.4} upcalls/event, mean latency {:.0} ns, p50 {:.0} ns, p99 {:.0} ns, lost {}",
        consumer.name(),
        load.name(),
        r.events_per_s,
        r.upcalls_per_event,
        r.mean_latency_ns,
        percentile_sorted(&r.samples, 50.0),
        percentile_sorted(&r.samples, 99.0),
        r.lost
    );
}
