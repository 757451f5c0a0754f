//! Runs one loopback case for a while, for a profiler (the 2-core VM has no
//! hardware counters: use `-e cpu-clock`):
//!
//! ```sh
//! cargo build --release -p rdapl-bench --example profile_loopback
//! perf record -e cpu-clock -g target/release/examples/profile_loopback rdapl-poll 3
//! perf record -e cpu-clock -g target/release/examples/profile_loopback rdma-write 3 64KiB
//! perf report --no-children --sort sym
//! ```
//!
//! Arguments: case (`rdapl-buf-poll`, `rdapl-buf-wait`, `rdapl-poll`,
//! `rdapl-wait`, `crossbeam-poll`, `crossbeam-blocking` for the 64-byte
//! ping-pong between two threads; `serial-rdapl-buf`, `serial-rdapl`,
//! `serial-crossbeam` for the same ping-pong with both ends
//! driven by one thread, i.e. the software path without cross-core
//! traffic or waiting; `rdma-write`, `rdma-read`, `memcpy-write`,
//! `memcpy-read` for bandwidth),
//! seconds (at most 60), and for the bandwidth cases the size (`4KiB`,
//! `64KiB`, `1MiB`, `16MiB` or bytes; default 64KiB) and optionally the
//! most transfers per phase (a fixed amount of work, for callgrind:
//! `valgrind --tool=callgrind --cache-sim=yes ... rdma-write 60 64KiB 2000`).
//! Prints what was done and its median / rate.

use rdapl_bench::config::loopback_sizes;
use rdapl_bench::loopback::{
    Method, Params, Transfer, run_bandwidth, run_half_rtt, run_half_rtt_serial, size_label,
};
use rdapl_bench::stats::percentile_sorted;
use std::time::Duration;

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let case = a.first().map(String::as_str).unwrap_or("rdapl-poll");
    let secs = a
        .get(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3u64)
        .clamp(1, 60);
    let size = a
        .get(2)
        .and_then(|s| {
            loopback_sizes()
                .into_iter()
                .find(|n| size_label(*n) == *s)
                .or_else(|| s.parse().ok())
        })
        .unwrap_or(64 << 10)
        .clamp(1, 1 << 30);
    let p = Params {
        warmup_iters: 100,
        iters: 100_000_000,
        limit: Duration::from_secs(secs),
        grace: Duration::from_secs(3),
        recv_depth: 4,
        capacity: 256,
        sizes: vec![size],
        window: 8,
        bw_trials_per_rep: 1,
        bw_warmup: Duration::from_millis(100),
        bw_window: Duration::from_secs(secs),
        bw_min_ops: 1,
        bw_min_bytes: 0,
        // Optional fourth argument: at most this many transfers per phase
        // (warm-up, window): a fixed amount of work, for callgrind.
        bw_max_ops: a.get(3).and_then(|s| s.parse().ok()).unwrap_or(u64::MAX),
    };
    let serial = case.strip_prefix("serial-").map(|s| match s {
        "crossbeam" => Method::CrossbeamPoll,
        "rdapl-buf" => Method::RdaplBufPoll,
        _ => Method::RdaplPoll,
    });
    let pingpong = Method::ALL.into_iter().find(|m| m.name() == case);
    if let Some(m) = serial.or(pingpong) {
        let mut r = if serial.is_some() {
            run_half_rtt_serial(m, &p)
        } else {
            run_half_rtt(m, &p)
        };
        r.samples.sort_unstable();
        println!(
            "{}{}: {} round trips, median half round trip {:.0} ns, p99 {:.0} ns{}",
            if serial.is_some() { "serial " } else { "" },
            m.name(),
            r.samples.len(),
            percentile_sorted(&r.samples, 50.0) / 2.0,
            percentile_sorted(&r.samples, 99.0) / 2.0,
            if r.failed { ", FAILED" } else { "" }
        );
    } else if let Some(t) = Transfer::ALL.into_iter().find(|t| t.name() == case) {
        let r = run_bandwidth(t, size, &p);
        println!(
            "{} {}: {} transfers, {:.2} GB/s{}",
            t.name(),
            size_label(size),
            r.ops,
            r.bytes_per_s / 1e9,
            if r.failed { ", FAILED" } else { "" }
        );
    } else {
        eprintln!("unknown case {case:?}");
        std::process::exit(2);
    }
}
