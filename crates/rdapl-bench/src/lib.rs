//! # rdapl-bench: the rdapl event dispatcher and loopback provider against their peers
//!
//! The benchmark suite of issue 4 (parts 1 to 4). Every figure it reports
//! is a **ratio against a peer measured in the same run**: the subject and
//! its peer run back to back inside each repetition, the ratio is taken
//! there, and the report gives the median over repetitions with the
//! spread. Absolute numbers are printed as context only.
//!
//! | module | what it measures or does |
//! |---|---|
//! | [`throughput`] | part 1: EVD events/s vs crossbeam-channel, `std::sync::mpsc::sync_channel` and flume; 1–2 producers, unbatched and batched consumption |
//! | [`latency`] | part 2: ping-pong round trip by upcall, blocking `wait`, and busy `dequeue`, vs crossbeam blocking and busy-poll ping-pongs |
//! | [`flow`] | part 3: the seed's flow: `Poller` vs pure upcalls vs pure polling at low, medium and saturating load |
//! | [`loopback`] | part 4: the loopback provider: 64-byte send/receive half round trip vs crossbeam ping-pongs, RDMA write/read bandwidth vs memcpy at 4 KiB–16 MiB |
//! | [`tcp`] | part 5: the TCP provider between two processes (the `rdapl` CLI) vs `fi_pingpong -p tcp -e msg` and qperf `tcp_lat`/`tcp_bw`: 64 B one-way latency, ping-pong and streaming bandwidth at 4 KiB–1 MiB |
//! | [`shared`] | part 6: many connections on one EVD: the TCP provider's waiting 64 B round trip on EVDs that idle connections share vs on EVDs of its own, in this process |
//! | [`report`] | targets of the issue, `results.json`, `results.md` |
//! | [`plot`] | SVG plots |
//! | [`config`] | the full and `--smoke` sizes |
//! | [`stats`], [`util`] | percentiles and summaries; backoff, watchdog, payloads, date |
//!
//! Run it with `cargo run --release -p rdapl-bench -- --out bench-results`
//! (see the crate's README).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
pub mod flow;
pub mod latency;
pub mod loopback;
pub mod plot;
pub mod report;
pub mod shared;
pub mod stats;
pub mod tcp;
pub mod throughput;
pub mod util;
