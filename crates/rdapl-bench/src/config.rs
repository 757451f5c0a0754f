//! The two sizes of the suite: the full run (about two and a quarter
//! minutes of measuring on two cores for parts 1–4, plus about two
//! minutes for part 5 on a busy machine) and
//! `--smoke` (every benchmark at a tiny size, a few seconds in total, to
//! prove the harness works end to end).

use crate::{flow, latency, loopback, shared, tcp, throughput};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Parameters of every benchmark.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Scale {
    /// True for `--smoke`.
    pub smoke: bool,
    /// Repetitions of every benchmark (ratios are taken within one).
    pub reps: usize,
    /// Benchmark 1.
    pub throughput: throughput::Params,
    /// Benchmark 2.
    pub latency: latency::Params,
    /// Benchmark 3.
    pub flow: flow::Params,
    /// Benchmark 4.
    pub loopback: loopback::Params,
    /// Benchmark 5.
    pub tcp: tcp::Params,
    /// Benchmark 6.
    #[serde(default = "shared_full")]
    pub shared: shared::Params,
}

fn shared_full() -> shared::Params {
    shared::Params {
        idle: vec![100, 1000],
        rounds: 3000,
        timeout: Duration::from_secs(10),
    }
}

/// The bandwidth sizes of benchmark 5: 4 KiB, 64 KiB, 1 MiB (the smoke
/// run keeps them).
pub fn tcp_sizes() -> Vec<usize> {
    vec![4 << 10, 64 << 10, 1 << 20]
}

/// The transfer sizes of benchmark 4: 4 KiB, 64 KiB, 1 MiB, 16 MiB (the
/// smoke run keeps them, so that its row ids are the full run's).
pub fn loopback_sizes() -> Vec<usize> {
    vec![4 << 10, 64 << 10, 1 << 20, 16 << 20]
}

impl Scale {
    /// The full run.
    pub fn full() -> Scale {
        Scale {
            smoke: false,
            reps: 5,
            throughput: throughput::Params {
                warmup: Duration::from_millis(10),
                window: Duration::from_millis(40),
                max_window: Duration::from_millis(80),
                tick: Duration::from_millis(1),
                capacity: 1024,
                batch: 64,
                // 80 trials per configuration: per-trial ratios spread
                // widely on a shared 2-core machine (1p batched, 880
                // trials in 22 runs: quartiles 1.31, 1.58, 2.09), and the
                // median of 40 trials moved from run to run with a
                // standard deviation of 0.25; that of 80 (two runs
                // pooled), 0.16.
                trials_per_rep: 16,
            },
            latency: latency::Params {
                warmup_iters: 500,
                iters: 20_000,
                limit: Duration::from_millis(1500),
                grace: Duration::from_secs(3),
                capacity: 1024,
            },
            flow: flow::Params {
                warmup: Duration::from_millis(50),
                window: Duration::from_millis(300),
                drain_limit: Duration::from_secs(2),
                low_rate: 10_000.0,
                medium_rate: 200_000.0,
                budget: 64,
                qlen: 1024,
                max_samples: 100_000,
            },
            loopback: loopback::Params {
                warmup_iters: 500,
                iters: 20_000,
                limit: Duration::from_millis(1500),
                grace: Duration::from_secs(3),
                recv_depth: 4,
                capacity: 256,
                sizes: loopback_sizes(),
                window: 8,
                bw_trials_per_rep: 3,
                bw_warmup: Duration::from_millis(10),
                bw_window: Duration::from_millis(50),
                bw_min_ops: 16,
                bw_min_bytes: 512 << 20,
                bw_max_ops: 100_000_000,
            },
            tcp: tcp::Params {
                run_secs: 0.2,
                runs: 3,
                qperf_secs: 1,
                calib_iters: 200,
                min_iters: 200,
                max_iters: 200_000,
                calibrate: true,
                timeout: Duration::from_secs(30),
                window: 16,
                placement: tcp::Placement::Unpinned,
                latency_size: 64,
                sizes: tcp_sizes(),
            },
            shared: shared_full(),
        }
    }

    /// The smoke run.
    pub fn smoke() -> Scale {
        Scale {
            smoke: true,
            reps: 1,
            throughput: throughput::Params {
                warmup: Duration::from_millis(5),
                window: Duration::from_millis(20),
                max_window: Duration::from_millis(60),
                tick: Duration::from_millis(1),
                capacity: 1024,
                batch: 64,
                trials_per_rep: 1,
            },
            latency: latency::Params {
                warmup_iters: 10,
                iters: 200,
                limit: Duration::from_millis(100),
                grace: Duration::from_secs(3),
                capacity: 1024,
            },
            flow: flow::Params {
                warmup: Duration::from_millis(5),
                window: Duration::from_millis(25),
                drain_limit: Duration::from_secs(1),
                low_rate: 10_000.0,
                medium_rate: 200_000.0,
                budget: 64,
                qlen: 1024,
                max_samples: 10_000,
            },
            loopback: loopback::Params {
                warmup_iters: 10,
                iters: 200,
                limit: Duration::from_millis(100),
                grace: Duration::from_secs(3),
                recv_depth: 4,
                capacity: 256,
                sizes: loopback_sizes(),
                window: 2,
                bw_trials_per_rep: 1,
                bw_warmup: Duration::from_millis(1),
                bw_window: Duration::from_millis(2),
                bw_min_ops: 1,
                bw_min_bytes: 0,
                bw_max_ops: 1_000_000,
            },
            tcp: tcp::Params {
                run_secs: 0.01,
                runs: 1,
                qperf_secs: 1,
                calib_iters: 20,
                min_iters: 5,
                max_iters: 2_000,
                calibrate: false,
                timeout: Duration::from_secs(20),
                window: 16,
                placement: tcp::Placement::Unpinned,
                latency_size: 64,
                sizes: tcp_sizes(),
            },
            shared: shared::Params {
                idle: vec![10],
                rounds: 50,
                timeout: Duration::from_secs(10),
            },
        }
    }
}
