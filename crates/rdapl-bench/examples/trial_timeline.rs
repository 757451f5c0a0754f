//! Runs trials of one throughput configuration (EVD `reserve` +
//! `complete` and crossbeam, back to back, as the suite does) and prints
//! what the harness and the kernel saw in each run: the rate over the live
//! ticks and over the whole window, the live share, the longest stall, and
//! per worker (producers, then the consumer) its CPU time and its wait for
//! a CPU as shares of the window and the CPU it last ran on. For finding
//! out why a trial starved one side:
//!
//! ```sh
//! cargo build --release -p rdapl-bench --example trial_timeline
//! target/release/examples/trial_timeline 1 batched 10 50        # trials, window ms
//! target/release/examples/trial_timeline 1 batched 3 50 ticks   # and every tick
//! ```
use rdapl_bench::throughput::{Config, Consumption, Params, Queue, run_single};
use std::time::Duration;

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let producers = a
        .first()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1usize)
        .clamp(1, 2);
    let consumption = match a.get(1).map(String::as_str) {
        Some("batched") => Consumption::Batched,
        _ => Consumption::Unbatched,
    };
    let trials: usize = a
        .get(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10)
        .min(1000);
    let window: u64 = a
        .get(3)
        .and_then(|s| s.parse().ok())
        .unwrap_or(50)
        .clamp(5, 5000);
    let ticks = a.get(4).is_some_and(|s| s == "ticks");
    let p = Params {
        warmup: Duration::from_millis(10),
        window: Duration::from_millis(window),
        max_window: Duration::from_millis(3 * window),
        tick: Duration::from_millis(1),
        capacity: 1024,
        batch: 64,
        trials_per_rep: 1,
    };
    let cfg = Config {
        producers,
        consumption,
    };
    let queues = [Queue::EvdReserveComplete, Queue::Crossbeam];
    for t in 0..trials {
        let mut live = [0.0; 2];
        for k in 0..2 {
            let qi = (k + t) % 2;
            let q = queues[qi];
            let s = run_single(q, cfg, &p);
            live[qi] = s.live_rate();
            let pct = |v: &[f64]| {
                v.iter()
                    .map(|x| format!("{:3.0}", 100.0 * x))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            println!(
                "trial {t:3} {:<21} live {:6.2}M raw {:6.2}M live {:3.0}% running {:3.0}% idle-live {} stall {:5.1} ms | off% {} | cpu% {} | wait% {} | on cpu {:?}{}",
                q.name(),
                s.live_rate() / 1e6,
                s.raw_rate() / 1e6,
                100.0 * s.live_frac(),
                100.0 * s.running_frac,
                s.idle_live_ticks,
                1e3 * s.longest_stall_secs,
                pct(&s.off_frac),
                pct(&s.cpu_frac),
                pct(&s.wait_frac),
                s.last_cpu,
                if s.pinned { "" } else { " (not pinned)" }
            );
            if ticks {
                for w in s.timeline.windows(2) {
                    let d: Vec<u64> = (0..w[0].counts.len())
                        .map(|i| w[1].counts[i] - w[0].counts[i])
                        .collect();
                    println!("    {:7.3} ms {:?}", w[1].at.as_secs_f64() * 1e3, d);
                }
                for (k, g) in s.gaps.iter().enumerate() {
                    let g: Vec<String> = g
                        .iter()
                        .map(|(a, b)| format!("{:.3}-{:.3}", *a as f64 / 1e6, *b as f64 / 1e6))
                        .collect();
                    println!("    worker {k} off (ms): {}", g.join(" "));
                }
            }
        }
        println!("trial {t:3} ratio {:.3}", live[0] / live[1]);
    }
}
