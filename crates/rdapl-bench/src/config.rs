//! The two sizes of the suite: the full run (about 40 s of measuring on
//! two cores, well inside the five-minute budget) and `--smoke` (every
//! benchmark at a tiny size, a second or two in total, to prove the harness
//! works end to end).

use crate::{flow, latency, throughput};
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
}

impl Scale {
    /// The full run.
    pub fn full() -> Scale {
        Scale {
            smoke: false,
            reps: 5,
            throughput: throughput::Params {
                warmup: Duration::from_millis(10),
                window: Duration::from_millis(50),
                capacity: 1024,
                batch: 64,
                trials_per_rep: 3,
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
        }
    }
}
