//! Runs one throughput case for a while, for a profiler:
//!
//! ```sh
//! cargo build --release -p rdapl-bench --example profile_throughput
//! perf record -g target/release/examples/profile_throughput evd-reserve-complete 1 unbatched 3
//! ```
//!
//! Arguments: queue (`evd-reserve-complete`, `evd-post-se`, `crossbeam`,
//! `std-sync-channel`, `flume`), producers (1 or 2), `unbatched` or
//! `batched`, seconds (at most 60).

use rdapl_bench::throughput::{Config, Consumption, Params, Queue, run_single};
use std::time::Duration;

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let queue = Queue::ALL
        .into_iter()
        .find(|q| Some(q.name()) == a.first().map(String::as_str))
        .unwrap_or(Queue::EvdReserveComplete);
    let producers = a
        .get(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1usize)
        .clamp(1, 2);
    let consumption = match a.get(2).map(String::as_str) {
        Some("batched") => Consumption::Batched,
        _ => Consumption::Unbatched,
    };
    let secs = a
        .get(3)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3u64)
        .clamp(1, 60);
    let p = Params {
        warmup: Duration::from_millis(100),
        window: Duration::from_secs(secs),
        max_window: Duration::from_secs(secs),
        tick: Duration::from_millis(10),
        capacity: 1024,
        batch: 64,
        trials_per_rep: 1,
    };
    let cfg = Config {
        producers,
        consumption,
    };
    let r = run_single(queue, cfg, &p);
    println!(
        "{} {}: {:.0} events/s over the live ticks ({:.0}% of the window), {:.0} over the window",
        queue.name(),
        cfg.name(),
        r.live_rate(),
        100.0 * r.live_frac(),
        r.raw_rate()
    );
}
