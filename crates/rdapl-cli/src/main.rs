//! `rdapl`: the rdapl command-line tool.

use clap::{Args, Parser, Subcommand};
use rdapl_cli::perf::{self, Op, PerfOptions, Test};
use rdapl_cli::stress::{self, DEFAULT_EVENTS, Mode, StressConfig};
use rdapl_cli::{demo, info, rping};
use std::process::ExitCode;
use std::time::Duration;

/// The rdapl command-line tool (DAT 2.0 / kDAPL / uDAPL in Rust).
#[derive(Parser, Debug)]
#[command(
    name = "rdapl",
    version,
    propagate_version = true,
    after_help = "Logs: the providers' (connections established and ended, Terminates \
                  and their causes, timeouts, socket errors) go to stderr at the level \
                  RDAPL_LOG names: off, error, warn (the default), info, debug or trace."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Stress the event dispatcher with the seed's upcall/poll flow and check
    /// that every event arrives exactly once, in order, without a hang.
    EvdStress(EvdStressArgs),
    /// Run a server and a client on the loopback provider in this process:
    /// connect with private data, send/receive (upcall and poller), RDMA
    /// write and read back (wait), disconnect; every byte is checked.
    Demo(DemoArgs),
    /// List every provider with its provider and IA attributes.
    Info,
    /// Latency: one message in flight between a server (-s) and a client
    /// (names the server's address; loopback without one: both here).
    Pingpong(PerfArgs),
    /// Bandwidth: a window of messages in flight from the client.
    Bw(PerfArgs),
    /// A peer of rdma-core's `rping` (-s server, -c client), every ping's
    /// data checked; meets the real rping over the tcp provider.
    Rping(RpingArgs),
    /// A peer of rdma-core's `rdma_server` (-s) / `rdma_client` (-c): one
    /// 16-byte Send each way, then the server disconnects.
    RdmaCm(RpingArgs),
}

#[derive(Args, Debug)]
struct RpingArgs {
    /// Server side.
    #[arg(
        short = 's',
        long,
        conflicts_with = "client",
        required_unless_present = "client"
    )]
    server: bool,
    /// Client side.
    #[arg(short = 'c', long)]
    client: bool,
    /// Server: the address to listen at; client: the server's address.
    #[arg(short = 'a', long, default_value = "127.0.0.1", value_parser = parse_host)]
    addr: std::net::IpAddr,
    /// Client: this side's address [default: a loopback address of the
    /// server's family for a server on this host, else any: 0.0.0.0 or
    /// ::].
    #[arg(short = 'I', long, value_parser = parse_host)]
    local: Option<std::net::IpAddr>,
    /// Port.
    #[arg(short = 'p', long, default_value_t = 7174)]
    port: u16,
    /// Pings (client: to do, 0 for ever; server: that must come, 0 any).
    #[arg(short = 'C', long, default_value_t = 0)]
    count: u32,
    /// Ping data size in bytes (client).
    #[arg(short = 'S', long, default_value_t = 64)]
    size: usize,
    /// Print the ping data.
    #[arg(short = 'v', long)]
    verbose: bool,
    /// Ask for MPA CRC32c: 1 or 0 (the peer may still turn it on).
    #[arg(long, default_value = "1", value_parser = ["0", "1"])]
    crc: String,
    /// Provider.
    #[arg(long, default_value = "tcp")]
    provider: String,
    /// Bound of every wait, in seconds (a server's wait for its client too).
    #[arg(long, default_value_t = 30.0, value_parser = parse_seconds)]
    timeout: f64,
    /// Client: the pause between two pings, in seconds (the connection
    /// sits idle meanwhile).
    #[arg(long, value_parser = parse_seconds)]
    interval: Option<f64>,
}

fn rping_options(a: &RpingArgs) -> rping::RpingOptions {
    rping::RpingOptions {
        provider: a.provider.clone(),
        server: a.server,
        addr: a.addr,
        local: a
            .local
            .unwrap_or_else(|| rdapl_cli::client_addr(Some(a.addr))),
        port: a.port,
        count: a.count,
        size: a.size,
        verbose: a.verbose,
        crc: a.crc == "1",
        timeout: Duration::from_secs_f64(a.timeout),
        interval: a.interval.map_or(Duration::ZERO, Duration::from_secs_f64),
    }
}

fn rdma_cm_cmd(a: &RpingArgs) -> ExitCode {
    rdapl_cli::register_providers();
    let o = rping_options(a);
    let (side, r) = if a.server {
        let r = rping::cm_serve(&o, || {
            eprintln!("rdapl rdma-cm server: listening on {}:{}", a.addr, a.port)
        });
        ("server", r)
    } else {
        ("client", rping::cm_client(&o))
    };
    match r {
        Ok(()) => {
            eprintln!(
                "rdapl rdma-cm {side}: {} bytes each way, then disconnected",
                rping::CM_MSG
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rdapl rdma-cm {side}: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn rping_cmd(a: &RpingArgs) -> ExitCode {
    rdapl_cli::register_providers();
    let o = rping_options(a);
    let side = if a.server { "server" } else { "client" };
    let r = if a.server {
        rping::serve(&o, || {
            eprintln!("rdapl rping server: listening on {}:{}", a.addr, a.port)
        })
    } else {
        rping::run(&o)
    };
    match r {
        Ok(r) => {
            eprintln!(
                "rdapl rping {side}: {} ping(s) of rping's data checked",
                r.pings
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rdapl rping {side}: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Args, Debug)]
struct PerfArgs {
    /// Serve (listen on the qualifier) instead of connecting.
    #[arg(short = 's', long)]
    server: bool,
    /// Provider (`rdapl info` lists them).
    #[arg(short = 'p', long, default_value = "loopback")]
    provider: String,
    /// What moves the messages (client): sends into the server's receives,
    /// or RDMA writes / reads into or from a region the server offers, as
    /// perftest's ib_write_bw, ib_read_bw, ib_write_lat (polls memory) and
    /// ib_read_lat.
    #[arg(long, default_value = "send", value_parser = ["send", "write", "read"])]
    op: String,
    /// This side's IA address [default: a server 127.0.0.1, which serves
    /// this host only (0.0.0.0 or :: serve any); a client a loopback
    /// address of its server's family for a server on this host, else any].
    #[arg(short = 'a', long, value_parser = parse_host)]
    addr: Option<std::net::IpAddr>,
    /// Connection qualifier (with tcp: the TCP port).
    #[arg(short = 'q', long, default_value_t = 47_593)]
    qual: u64,
    /// Message size in bytes (k/m/g suffixes), or `all` (1 B to 1 MiB).
    #[arg(short = 'S', long, default_value = "64")]
    size: String,
    /// Messages per size.
    #[arg(short = 'I', long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    iters: u32,
    /// Wait on the EVD instead of polling it.
    #[arg(short = 'w', long)]
    wait: bool,
    /// Messages in flight (bw) and receives posted.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024))]
    window: u32,
    /// Message buffers each side cycles through (default: one per message
    /// in flight and per receive posted, and bw checks the first and last
    /// byte of every message). Fewer are reused as qperf's and perftest's
    /// are, so large messages stay in cache; bw then checks lengths only.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1025))]
    buffers: Option<u32>,
    /// Largest message a server accepts.
    #[arg(long, default_value = "1m")]
    max_size: String,
    /// Bound of every step, in seconds.
    #[arg(long, default_value_t = 30.0, value_parser = parse_seconds)]
    timeout: f64,
    /// A server serves one client, then exits.
    #[arg(long)]
    once: bool,
    /// More IA parameters, provider-specific (tcp: `crc=0` turns MPA CRC32c
    /// off; both sides must say so, as either side asking turns it on).
    #[arg(long, default_value = "")]
    params: String,
    /// The server's address or host name (client).
    #[arg(value_parser = parse_host)]
    server_addr: Option<std::net::IpAddr>,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let (num, mul) = match s.as_bytes().last() {
        Some(b'k' | b'K') => (&s[..s.len() - 1], 1 << 10),
        Some(b'm' | b'M') => (&s[..s.len() - 1], 1 << 20),
        Some(b'g' | b'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .filter(|&n| n > 0 && n <= 1 << 30)
        .ok_or_else(|| format!("{s:?} is not a size of 1 byte to 1 GiB"))
}

fn perf_cmd(test: Test, a: &PerfArgs) -> ExitCode {
    let name = if test == Test::PingPong {
        "pingpong"
    } else {
        "bw"
    };
    let sizes = if a.size == "all" {
        Ok(perf::all_sizes())
    } else {
        parse_size(&a.size).map(|s| vec![s])
    };
    let (sizes, max_size) = match (sizes, parse_size(&a.max_size)) {
        (Ok(s), Ok(m)) => {
            let top = s.iter().copied().max().unwrap_or(0);
            (s, m.max(top))
        }
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("rdapl {name}: {e}");
            return ExitCode::from(2);
        }
    };
    rdapl_cli::register_providers();
    let op = match a.op.as_str() {
        "write" => Op::Write,
        "read" => Op::Read,
        _ => Op::Send,
    };
    let o = PerfOptions {
        provider: a.provider.clone(),
        op,
        server: a.server,
        addr: a
            .addr
            .unwrap_or_else(|| rdapl_cli::client_addr(if a.server { None } else { a.server_addr })),
        remote: a.server_addr,
        qual: a.qual,
        sizes,
        iters: a.iters as usize,
        wait: a.wait,
        window: a.window as usize,
        buffers: a.buffers.map(|b| b as usize),
        max_size,
        timeout: Duration::from_secs_f64(a.timeout),
        once: a.once,
        params: a.params.clone(),
        poll_yield: 0,
    };
    match perf::run(test, &o) {
        Ok(rows) => {
            if !a.server {
                print!("{}", perf::format(&rows));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rdapl {name}: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Args, Debug)]
struct DemoArgs {
    /// Messages sent from client to server [default: 64].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=16_384))]
    messages: Option<u32>,

    /// Bytes per message [default: 256].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=(1 << 20)))]
    message_size: Option<u32>,

    /// Bytes of the RDMA write and of the read back [default: 1 MiB].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=(256 << 20)))]
    rdma_size: Option<u64>,

    /// No progress lines on stderr.
    #[arg(long, short)]
    quiet: bool,
}

fn demo_cmd(a: &DemoArgs) -> ExitCode {
    let opts = demo::DemoOptions {
        messages: a.messages.map(|n| n as usize),
        message_size: a.message_size.map(|n| n as usize),
        rdma_size: a.rdma_size.map(|n| n as usize),
        quiet: a.quiet,
    };
    if let Err(e) = opts.validate() {
        eprintln!("rdapl demo: {e}");
        return ExitCode::from(2);
    }
    match demo::run(&opts) {
        Ok(s) => {
            print!("{s}");
            if s.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("rdapl demo: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Args, Debug)]
struct EvdStressArgs {
    /// Producer threads.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    producers: u32,

    /// Events per mode, over all producers.
    #[arg(long, default_value_t = DEFAULT_EVENTS, value_parser = clap::value_parser!(u64).range(1..(1 << 40)))]
    events: u64,

    /// Queue length of each EVD.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=(rdapl::evd::MAX_QLEN as i64)))]
    qlen: u32,

    /// EVDs fed by the producers (producer p feeds EVD p % evds; the poller
    /// mode uses at least two).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    evds: u32,

    /// Modes to run, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "strict,on-any,on-new,poller,many"
    )]
    modes: Vec<Mode>,

    /// Events the upcall consumes itself before it disables upcalls and
    /// hands the EVD to the polling thread.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    switch_every: u64,

    /// Wall-clock limit of each mode; reaching it is reported as a hang.
    #[arg(long, default_value_t = 60.0, value_parser = parse_seconds)]
    max_seconds: f64,

    /// Seed of the pseudo-random choices (event mix, dequeue forms, yields).
    #[arg(long, default_value_t = 0x5eed_da71)]
    seed: u64,
}

/// An IP address, or a host name resolved to one (an IPv4 address if it
/// has one: IAs default to IPv4), as rping and fi_pingpong take.
fn parse_host(s: &str) -> Result<std::net::IpAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(ip) = s.parse() {
        return Ok(ip);
    }
    let addrs: Vec<_> = (s, 0)
        .to_socket_addrs()
        .map_err(|e| format!("not an IP address, nor a host name that resolves: {e}"))?
        .map(|a| a.ip())
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("the host name {s} has no address"))
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() && v > 0.0 && v <= 86_400.0 {
        Ok(v)
    } else {
        Err("must be a number of seconds above 0 and at most 86400".into())
    }
}

fn evd_stress(a: &EvdStressArgs) -> ExitCode {
    let cfg = StressConfig {
        producers: a.producers as usize,
        events: a.events,
        qlen: a.qlen as usize,
        evds: a.evds as usize,
        switch_every: a.switch_every,
        max_time: Duration::from_secs_f64(a.max_seconds),
        seed: a.seed,
        fault: None,
    };
    if let Err(e) = cfg.validate() {
        eprintln!("rdapl evd-stress: {e}");
        return ExitCode::from(2);
    }
    let mut modes: Vec<Mode> = Vec::new();
    for m in &a.modes {
        if !modes.contains(m) {
            modes.push(*m);
        }
    }
    eprintln!(
        "evd-stress: {} producer(s), {} event(s) per mode, qlen {}, {} EVD(s), switch every {} event(s), limit {:.1} s per mode",
        cfg.producers, cfg.events, cfg.qlen, cfg.evds, cfg.switch_every, a.max_seconds
    );
    let reports = stress::run(&cfg, &modes, |r| {
        eprintln!(
            "evd-stress: {:<7} {} in {:.2} s{}",
            r.mode.name(),
            if r.passed() { "ok" } else { "FAILED" },
            r.elapsed.as_secs_f64(),
            if r.hang { " (hang)" } else { "" }
        );
    });
    print!("{}", stress::format_table(&reports));
    let mut failed = false;
    for r in &reports {
        if !r.passed() {
            failed = true;
            for n in &r.notes {
                println!("{}: {n}", r.mode.name());
            }
        }
    }
    if failed {
        println!(
            "FAILED: events were lost, duplicated or reordered, a mode hung, or a call failed"
        );
        ExitCode::FAILURE
    } else {
        println!("ok: every event seen exactly once, in order, in every mode");
        ExitCode::SUCCESS
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    rdapl_cli::init_logs();
    // Returning from `main` ends the process, even if a hung mode left
    // threads behind.
    match cli.command {
        Command::EvdStress(a) => evd_stress(&a),
        Command::Demo(a) => demo_cmd(&a),
        Command::Info => {
            print!("{}", info::run());
            ExitCode::SUCCESS
        }
        Command::Pingpong(a) => perf_cmd(Test::PingPong, &a),
        Command::Bw(a) => perf_cmd(Test::Bw, &a),
        Command::Rping(a) => rping_cmd(&a),
        Command::RdmaCm(a) => rdma_cm_cmd(&a),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    /// Sizes with and without suffixes, up to the 1 GiB the error names.
    #[test]
    fn sizes_parse_up_to_a_gib() {
        assert_eq!(parse_size("64"), Ok(64));
        assert_eq!(parse_size("4k"), Ok(4 << 10));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("1024m"), Ok(1 << 30));
        for bad in ["0", "2g", "1025m", "g", "-1", "1t"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
