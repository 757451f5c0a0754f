//! `rdapl-bench`: runs the benchmark suite and writes `results.md`,
//! `results.json` and SVG plots to the output directory.
//!
//! ```sh
//! cargo run --release -p rdapl-bench -- --out bench-results
//! cargo run --release -p rdapl-bench -- --smoke --out /tmp/smoke
//! ```
//!
//! Exits with status 1 if a correctness check fails (an event lost in the
//! flow benchmark, a ping-pong run stuck, a loopback transfer failed or
//! delivered wrong data, a TCP run failed or could not start, a part-6
//! round trip failed) or an output
//! cannot be written.
//! A missed performance target is reported, not an error.
#![forbid(unsafe_code)]

use clap::{Parser, ValueEnum};
use rdapl_bench::config::Scale;
use rdapl_bench::report::{Meta, Results};
use rdapl_bench::util::Machine;
use rdapl_bench::{flow, latency, loopback, plot, shared, tcp, throughput};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// Benchmark suite of the rdapl event dispatcher, loopback provider and TCP provider.
#[derive(Parser, Debug)]
#[command(name = "rdapl-bench", version)]
struct Args {
    /// Output directory (created if missing).
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,

    /// Run every benchmark at a tiny size (a second or two) to prove the
    /// harness works; the numbers mean nothing.
    #[arg(long)]
    smoke: bool,

    /// Repetitions (default: 5, or 1 with --smoke).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=50))]
    reps: Option<u32>,

    /// Run only these benchmarks (comma-separated; default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Bench>,

    /// Where part 5 runs its server and client processes (every program
    /// alike): `unpinned`, or `split` (servers on the first allowed CPU,
    /// clients on the second).
    #[arg(long, value_enum, default_value = "unpinned")]
    tcp_placement: tcp::Placement,

    /// Part 6: the counts of idle connections, comma-separated (default:
    /// 100,1000; 10 with --smoke).
    #[arg(long, value_delimiter = ',')]
    shared_idle: Vec<usize>,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Bench {
    Throughput,
    Latency,
    Flow,
    Loopback,
    Tcp,
    /// Part 6: many connections on one EVD.
    Shared,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let machine = Machine::probe();
    let mut scale = if args.smoke {
        Scale::smoke()
    } else {
        Scale::full()
    };
    if let Some(r) = args.reps {
        scale.reps = r as usize;
    }
    scale.tcp.placement = args.tcp_placement;
    if !args.shared_idle.is_empty() {
        scale.shared.idle = args.shared_idle.clone();
    }
    let wants = |b: Bench| args.only.is_empty() || args.only.contains(&b);
    let command = std::env::args().collect::<Vec<_>>().join(" ");

    println!(
        "rdapl-bench {}: {} | {} core(s){} | {} run, {} repetition(s)",
        env!("CARGO_PKG_VERSION"),
        machine.date_utc,
        machine.cores,
        machine
            .cpu_model
            .as_ref()
            .map(|c| format!(" ({c})"))
            .unwrap_or_default(),
        if scale.smoke { "smoke" } else { "full" },
        scale.reps
    );
    if let Some(c) = &machine.rdapl_commit {
        println!("rdapl commit {c}");
    }
    if cfg!(debug_assertions) {
        println!("warning: debug build; use --release for meaningful numbers");
    }
    if let Err(e) = std::fs::create_dir_all(&args.out) {
        eprintln!("cannot create {}: {e}", args.out.display());
        return ExitCode::FAILURE;
    }

    let start = Instant::now();
    let progress = |s: &str| println!("  {s}");
    let mut results = Results {
        meta: Meta::new(&machine, &scale, command),
        throughput: Vec::new(),
        latency: Vec::new(),
        flow: Vec::new(),
        loopback_half_rtt: Vec::new(),
        loopback_serial: Vec::new(),
        loopback_bandwidth: Vec::new(),
        tcp: Vec::new(),
        tcp_setup: None,
        shared: Vec::new(),
        targets: Vec::new(),
        pending: Vec::new(),
        plots: Vec::new(),
    };
    let mut failed = false;
    let mut plot_err = |what: &str, e: Box<dyn std::error::Error>| {
        eprintln!("plot {what}: {e}");
        failed = true;
    };

    if wants(Bench::Throughput) {
        println!("[1/6] EVD throughput");
        let t = Instant::now();
        results.throughput = throughput::run(&scale.throughput, scale.reps, progress);
        println!("      ({:.1} s)", t.elapsed().as_secs_f64());
        match plot::throughput(&args.out, &results.throughput) {
            Ok(p) => results.plots.push(p),
            Err(e) => plot_err("throughput", e),
        }
    }
    if wants(Bench::Latency) {
        println!("[2/6] Wakeup latency");
        let t = Instant::now();
        let out = latency::run(&scale.latency, scale.reps, progress);
        println!("      ({:.1} s)", t.elapsed().as_secs_f64());
        match plot::latency(&args.out, &out.pooled) {
            Ok(p) => results.plots.push(p),
            Err(e) => plot_err("latency", e),
        }
        results.latency = out.rows;
    }
    if wants(Bench::Flow) {
        println!("[3/6] The seed's flow");
        let t = Instant::now();
        let out = flow::run(&scale.flow, scale.reps, progress);
        println!("      ({:.1} s)", t.elapsed().as_secs_f64());
        match plot::flow(&args.out, &out) {
            Ok(p) => results.plots.extend(p),
            Err(e) => plot_err("flow", e),
        }
        results.flow = out.rows;
    }
    if wants(Bench::Loopback) {
        println!("[4/6] Loopback provider");
        let t = Instant::now();
        let out = loopback::run(&scale.loopback, scale.reps, progress);
        println!("      ({:.1} s)", t.elapsed().as_secs_f64());
        match plot::loopback(&args.out, &out) {
            Ok(p) => results.plots.extend(p),
            Err(e) => plot_err("loopback", e),
        }
        results.loopback_half_rtt = out.half_rtt;
        results.loopback_serial = out.serial;
        results.loopback_bandwidth = out.bandwidth;
    }
    if wants(Bench::Tcp) {
        println!("[5/6] TCP provider against fi_pingpong and qperf");
        let t = Instant::now();
        let out = tcp::run(&scale.tcp, scale.reps, progress);
        println!("      ({:.1} s)", t.elapsed().as_secs_f64());
        if let Some(e) = &out.setup.error {
            eprintln!("tcp benchmark not run: {e}");
        }
        match plot::tcp(&args.out, &out.rows) {
            Ok(p) => results.plots.extend(p),
            Err(e) => plot_err("tcp", e),
        }
        results.tcp = out.rows;
        results.tcp_setup = Some(out.setup);
        results.pending.extend(out.pending);
    }

    if wants(Bench::Shared) {
        println!("[6/6] Many connections on one EVD (TCP provider, in process)");
        let t = Instant::now();
        results.shared = shared::run(&scale.shared, scale.reps, progress);
        println!("      ({:.1} s)", t.elapsed().as_secs_f64());
    }

    results.meta.suite_seconds = start.elapsed().as_secs_f64();
    results.judge();
    let md = results.markdown();
    let json = match serde_json::to_string_pretty(&results) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("serializing the results: {e}");
            return ExitCode::FAILURE;
        }
    };
    for (name, body) in [("results.json", json.as_str()), ("results.md", md.as_str())] {
        let path = args.out.join(name);
        if let Err(e) = std::fs::write(&path, body) {
            eprintln!("writing {}: {e}", path.display());
            failed = true;
        }
    }
    println!("\n{md}");
    println!(
        "Wrote {}/results.md, results.json and {} plot(s).",
        args.out.display(),
        results.plots.len()
    );
    let checks_failed: Vec<&str> = results
        .targets
        .iter()
        .filter(|t| t.id.starts_with("check/") && !t.met)
        .map(|t| t.id.as_str())
        .collect();
    if !checks_failed.is_empty() {
        eprintln!("correctness check(s) failed: {}", checks_failed.join(", "));
        failed = true;
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
