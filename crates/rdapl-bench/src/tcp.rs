//! Benchmark 5: rdapl's TCP/iWARP provider between two processes on
//! 127.0.0.1, against libfabric's tcp provider (`fi_pingpong -p tcp -e
//! msg`) and qperf's `tcp_lat` / `tcp_bw`, all in the same run.
//!
//! rdapl's side is the command-line tool's `rdapl pingpong` / `rdapl bw`
//! (crate `rdapl-cli`), a server (`-s --once`) and a client process per
//! run, as the peers run. Every figure is a ratio against the peer of the
//! same completion discipline, measured in the same repetition:
//!
//! | test | rdapl (subject) | peer | figure |
//! |---|---|---|---|
//! | `latency` (64 B) | `rdapl pingpong`, busy polling | `fi_pingpong` (busy-polls its CQs) | one-way µs: time ÷ (2 × round trips) |
//! | `latency` (64 B) | `rdapl pingpong -w`, waiting | `qperf tcp_lat` (blocking socket calls) | one-way µs, the same definition |
//! | `pingpong-bw` | `rdapl pingpong`, polling | `fi_pingpong` (it has no streaming test) | MB/s = size ÷ one-way time (fi_pingpong's `MB/sec`) |
//! | `stream-bw` | `rdapl bw -w`, 16 in flight, waiting | `qperf tcp_bw` (blocking `send`/`recv` of `-m` bytes) | MB/s received (10⁶ bytes/s) |
//!
//! Each rdapl row is measured with MPA CRC32c on (the provider's default,
//! the row judged) and off (`crc=0` on both sides, context; neither peer
//! has a CRC), and with `complete=sent` (CRC on; context): Sends complete
//! once TCP has them, siw's meaning and the peers' (fi_pingpong's
//! transmit-complete, qperf's `send`), instead of once the peer placed them.
//!
//! **Method.** A fresh server and client process per run, both with the
//! same placement for every program (`Placement`); the client starts once
//! the server's port is in `LISTEN` (read from `/proc/net/tcp*`, without
//! connecting to it); a free port per run. Before the repetitions, one
//! untimed warm-up run of each counted case also calibrates its iteration
//! count, so that each measured run lasts about `run_secs` whatever the
//! program's speed (qperf runs for a time, `qperf_secs`, whole seconds).
//! Within a repetition each group of cases runs `runs` rounds, each in an
//! order that rotates and reverses from round to round, and a program's
//! value in the repetition is the best of its runs there (the highest
//! MB/s, the lowest µs), so that subject and peer are each taken at their
//! best in the same stretch of time. On a shared VM the machine has slow
//! phases of a second or so (kernel copies at half speed, both peers
//! alike): a single run per repetition lands in one at random, and the
//! ratio of two runs then says which of them did. Every run is kept
//! (`Row::runs`, and `Row::value_all` over all of them). Every process is bounded by
//! `timeout` and killed with its process group when it passes it; a server
//! never outlives its run. A run counts only if both processes exit
//! successfully and the client reports every iteration (`#sent` and `#ack`
//! for rdapl and fi_pingpong, messages received for qperf, no errors); a
//! failed run is an error of the suite, not a number.

use crate::report::Pending;
use crate::stats::{Summary, rep_ratios};
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bound on a peer's ratio for the latency target (rdapl ≤ 1.0 × fi_pingpong).
pub const LATENCY_BOUND: f64 = 1.0;
/// Bound on the ping-pong bandwidth target (rdapl ≥ 1.0 × fi_pingpong).
pub const PINGPONG_BW_BOUND: f64 = 1.0;
/// Bound on the streaming bandwidth target (rdapl ≥ 0.95 × qperf tcp_bw).
pub const STREAM_BW_BOUND: f64 = 0.95;
/// Bandwidth targets apply from this size up (64 KiB and 1 MiB).
pub const TARGET_FROM_SIZE: usize = 64 << 10;

/// Where the client and server processes run.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// Wherever the scheduler puts them (the default: rdapl's provider has
    /// a progress thread per process, and pinning a process to one CPU puts
    /// it and a busy-polling application thread on one core).
    Unpinned,
    /// Server on the first allowed CPU, client on the second (every thread
    /// of each process), for every program alike.
    Split,
}

/// Parameters of benchmark 5.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Params {
    /// Wanted length of a counted run (rdapl, fi_pingpong), seconds.
    pub run_secs: f64,
    /// Runs of every case in a repetition; its value there is their best.
    pub runs: usize,
    /// qperf's `-t` (whole seconds, at least 1: it truncates, and 0 runs
    /// forever).
    pub qperf_secs: u32,
    /// Iterations of the calibrating warm-up run (a tenth of it, at least
    /// 2, at 1 MiB).
    pub calib_iters: usize,
    /// Fewest iterations of a measured run (a tenth of it, at least 2, at
    /// 1 MiB).
    pub min_iters: usize,
    /// Most iterations of a measured run.
    pub max_iters: usize,
    /// Warm up and calibrate (one untimed run per counted case, and one
    /// qperf `tcp_lat`); without it (`--smoke`), every counted run does
    /// `calib_iters` iterations.
    pub calibrate: bool,
    /// Bound of every process.
    pub timeout: Duration,
    /// Messages in flight for `rdapl bw`.
    pub window: usize,
    /// Where the processes run.
    pub placement: Placement,
    /// Size of the latency test.
    pub latency_size: usize,
    /// Sizes of the bandwidth tests.
    pub sizes: Vec<usize>,
}

/// What a row measures.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Test {
    /// One message in flight: one-way latency, µs.
    Latency,
    /// One message in flight: size ÷ one-way time, MB/s.
    PingpongBw,
    /// A window in flight: MB/s received.
    StreamBw,
}

impl Test {
    /// Short name (row ids).
    pub fn name(self) -> &'static str {
        match self {
            Test::Latency => "latency",
            Test::PingpongBw => "pingpong-bw",
            Test::StreamBw => "stream-bw",
        }
    }

    /// Unit of the row's value.
    pub fn unit(self) -> &'static str {
        match self {
            Test::Latency => "µs one-way",
            _ => "MB/s",
        }
    }

    /// True if a larger value is better.
    pub fn higher_is_better(self) -> bool {
        self != Test::Latency
    }
}

/// Who runs.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Program {
    /// `rdapl pingpong|bw`, busy polling, CRC on.
    RdaplPoll,
    /// The same with `crc=0`.
    RdaplPollNocrc,
    /// The same with `complete=sent` (CRC on).
    RdaplPollSent,
    /// `rdapl pingpong|bw -w`, waiting on the EVD, CRC on.
    RdaplWait,
    /// The same with `crc=0`.
    RdaplWaitNocrc,
    /// The same with `complete=sent` (CRC on).
    RdaplWaitSent,
    /// `fi_pingpong -p tcp -e msg`.
    FiPingpong,
    /// `qperf tcp_lat` / `tcp_bw`.
    Qperf,
}

impl Program {
    /// Short name (row ids).
    pub fn name(self) -> &'static str {
        match self {
            Program::RdaplPoll => "rdapl-poll",
            Program::RdaplPollNocrc => "rdapl-poll-nocrc",
            Program::RdaplPollSent => "rdapl-poll-sent",
            Program::RdaplWait => "rdapl-wait",
            Program::RdaplWaitNocrc => "rdapl-wait-nocrc",
            Program::RdaplWaitSent => "rdapl-wait-sent",
            Program::FiPingpong => "fi_pingpong",
            Program::Qperf => "qperf",
        }
    }

    /// The peer of its ratio (rdapl rows only).
    pub fn peer(self) -> Option<Program> {
        match self {
            Program::RdaplPoll | Program::RdaplPollNocrc | Program::RdaplPollSent => {
                Some(Program::FiPingpong)
            }
            Program::RdaplWait | Program::RdaplWaitNocrc | Program::RdaplWaitSent => {
                Some(Program::Qperf)
            }
            _ => None,
        }
    }

    fn waits(self) -> bool {
        matches!(
            self,
            Program::RdaplWait | Program::RdaplWaitNocrc | Program::RdaplWaitSent
        )
    }

    fn crc(self) -> bool {
        !matches!(self, Program::RdaplPollNocrc | Program::RdaplWaitNocrc)
    }

    /// Sends complete once handed to TCP (`complete=sent`).
    fn sent(self) -> bool {
        matches!(self, Program::RdaplPollSent | Program::RdaplWaitSent)
    }

    /// How the program runs `test`, in words (the report's legend).
    pub fn describe(self, test: Test) -> String {
        let sub = if test == Test::StreamBw {
            "bw"
        } else {
            "pingpong"
        };
        match self {
            Program::RdaplPoll => format!("`rdapl {sub}`, polling, CRC32c on"),
            Program::RdaplPollNocrc => format!("`rdapl {sub} --params crc=0`, polling"),
            Program::RdaplWait => format!("`rdapl {sub} -w`, waiting, CRC32c on"),
            Program::RdaplWaitNocrc => format!("`rdapl {sub} -w --params crc=0`, waiting"),
            Program::RdaplPollSent => {
                format!("`rdapl {sub} --params complete=sent`, polling, CRC32c on")
            }
            Program::RdaplWaitSent => {
                format!("`rdapl {sub} -w --params complete=sent`, waiting, CRC32c on")
            }
            Program::FiPingpong => "`fi_pingpong -p tcp -e msg`".into(),
            Program::Qperf if test == Test::StreamBw => "`qperf tcp_bw`".into(),
            Program::Qperf => "`qperf tcp_lat`".into(),
        }
    }
}

/// One measured run (or its failure).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Run {
    /// Repetition (`usize::MAX`: the warm-up run, kept only if it failed).
    pub rep: usize,
    /// Round within the repetition.
    #[serde(default)]
    pub round: usize,
    /// Position in the repetition's order of its group (0 = first).
    pub position: usize,
    /// The value (µs or MB/s); NaN (`null`) if the run failed.
    pub value: f64,
    /// Iterations asked (rdapl, fi_pingpong) or messages received (qperf).
    pub iters: u64,
    /// Wall-clock seconds of the client process.
    pub wall_s: f64,
    /// CPU time of the client's main thread ÷ its wall-clock time (`None`
    /// if unknown). A busy-polling client (rdapl polling, fi_pingpong)
    /// spins in its main thread: well below 1, it was kept off a CPU for
    /// that share of the run, and the run measured the scheduler.
    pub client_cpu_share: Option<f64>,
    /// Why the run failed.
    pub error: Option<String>,
}

/// One row: a program at a test and size.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    /// `tcp/<test>/<size>/<program>`.
    pub id: String,
    /// The test.
    pub test: Test,
    /// Message size, bytes.
    pub size: usize,
    /// `64B`, `4KiB`, ...
    pub size_label: String,
    /// The program.
    pub program: Program,
    /// The peer of the ratio (rdapl rows).
    pub peer: Option<Program>,
    /// Unit of `value`.
    pub unit: String,
    /// Per repetition: the best of its runs.
    pub value: Summary,
    /// Every run that succeeded.
    #[serde(default)]
    pub value_all: Summary,
    /// value ÷ the peer's in the same repetition.
    pub ratio_vs_peer: Summary,
    /// Every repetition's runs.
    pub runs: Vec<Run>,
    /// The client's main-thread CPU share per repetition (see
    /// [`Run::client_cpu_share`]).
    pub client_cpu_share: Summary,
    /// Failed repetitions.
    pub failed_reps: usize,
    /// Why the row (or its peer) is not measured.
    pub pending: Option<String>,
}

/// What ran and where.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Setup {
    /// The `rdapl` binary measured.
    pub rdapl_bin: Option<String>,
    /// `fi_pingpong` found.
    pub fi_pingpong: Option<String>,
    /// `qperf` found.
    pub qperf: Option<String>,
    /// Placement of the processes.
    pub placement: Option<Placement>,
    /// CPU of the servers and of the clients (`Split`).
    pub cpus: Option<(usize, usize)>,
    /// Calibrated iterations per case (`<test>/<size>/<program>`).
    pub iters: Vec<(String, u64)>,
    /// The 1-minute load average (`/proc/loadavg`) at the start of each
    /// repetition: how busy the machine was.
    pub load_avg: Vec<f64>,
    /// A failure that stopped the part (no rdapl binary, a required peer
    /// missing).
    pub error: Option<String>,
}

/// The part's results.
#[derive(Clone, Debug, Default)]
pub struct Output {
    /// The rows.
    pub rows: Vec<Row>,
    /// Rows not measured, and why.
    pub pending: Vec<Pending>,
    /// What ran.
    pub setup: Setup,
}

/// `64B`, `4KiB`, `64KiB`, `1MiB`.
pub fn size_label(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{}MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{}KiB", n >> 10)
    } else {
        format!("{n}B")
    }
}

/// The cases of a run, grouped: a group's members run back to back within
/// a repetition, in an order that changes from repetition to repetition.
fn groups(p: &Params) -> Vec<(Test, usize, Vec<Program>)> {
    use Program::*;
    let mut g = vec![(
        Test::Latency,
        p.latency_size,
        vec![
            RdaplPoll,
            RdaplPollNocrc,
            RdaplPollSent,
            FiPingpong,
            RdaplWait,
            RdaplWaitNocrc,
            RdaplWaitSent,
            Qperf,
        ],
    )];
    for &s in &p.sizes {
        g.push((
            Test::PingpongBw,
            s,
            vec![RdaplPoll, RdaplPollNocrc, RdaplPollSent, FiPingpong],
        ));
        g.push((
            Test::StreamBw,
            s,
            vec![RdaplWait, RdaplWaitNocrc, RdaplWaitSent, Qperf],
        ));
    }
    g
}

/// The order of a group of `n` in repetition `rep`: rotated by `rep`,
/// reversed in odd repetitions.
pub fn order(n: usize, rep: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    if n > 0 {
        v.rotate_left(rep % n);
    }
    if rep % 2 == 1 {
        v.reverse();
    }
    v
}

fn required() -> bool {
    std::env::var("RDAPL_REQUIRE_EXTERNAL").as_deref() == Ok("1")
}

/// An executable named `name` on `PATH` (or the path in `env`, if set).
fn find_tool(name: &str, env: &str) -> Option<PathBuf> {
    if let Ok(p) = std::env::var(env) {
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The `rdapl` binary: `RDAPL_BIN` if set; else, run from cargo (`cargo
/// run`, `cargo test`), `cargo build -p rdapl-cli --bin rdapl` in this
/// build's profile (a no-op when it is fresh, so a changed provider is
/// never measured through a stale binary) and the binary next to this
/// executable; else that binary if it exists.
pub fn rdapl_binary(progress: &dyn Fn(&str)) -> Result<PathBuf, String> {
    if let Ok(p) = std::env::var("RDAPL_BIN") {
        let p = PathBuf::from(p);
        return if is_executable(&p) {
            Ok(p)
        } else {
            Err(format!("RDAPL_BIN={} is not an executable", p.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("locating this executable: {e}"))?;
    let dir = exe
        .parent()
        .ok_or("this executable has no directory")?
        .to_path_buf();
    // Integration tests run from `<target>/<profile>/deps`.
    let dir = if dir.ends_with("deps") {
        dir.parent().map(Path::to_path_buf).unwrap_or(dir)
    } else {
        dir
    };
    let bin = dir.join("rdapl");
    if let Some(cargo) = std::env::var_os("CARGO") {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut cmd = Command::new(cargo);
        cmd.current_dir(&root)
            .args(["build", "--quiet", "-p", "rdapl-cli", "--bin", "rdapl"]);
        if !cfg!(debug_assertions) {
            cmd.arg("--release");
        }
        progress("building the rdapl CLI (cargo build -p rdapl-cli --bin rdapl)");
        let mut p = Proc::spawn("cargo build", cmd, None)?;
        let status = p.wait_until(Instant::now() + Duration::from_secs(900));
        let (_, err) = p.finish();
        match status {
            Some(s) if s.success() => {}
            Some(s) => {
                return Err(format!(
                    "cargo build -p rdapl-cli failed ({s}): {}",
                    tail(&err)
                ));
            }
            None => return Err("cargo build -p rdapl-cli took more than 900 s".into()),
        }
        if !is_executable(&bin) {
            return Err(format!(
                "cargo built rdapl-cli, but {} is not there (another target directory?); set RDAPL_BIN",
                bin.display()
            ));
        }
        return Ok(bin);
    }
    if is_executable(&bin) {
        progress(&format!(
            "warning: not run by cargo, measuring {} as it is (it may be older than the sources)",
            bin.display()
        ));
        return Ok(bin);
    }
    Err(format!(
        "no rdapl binary at {}: run `cargo run --release -p rdapl-bench`, or build it \
         (`cargo build --release -p rdapl-cli`), or set RDAPL_BIN",
        bin.display()
    ))
}

/// The last few lines of a process's output, for an error message.
fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(4)..].join(" | ")
}

/// A child process in its own process group, its output read by two
/// threads (so a full pipe never blocks it), killed with its group if it
/// is dropped unreaped.
struct Proc {
    name: String,
    child: Child,
    reaped: bool,
    /// CPU seconds of its main thread, read when it exited (before it was
    /// reaped).
    main_cpu_s: Option<f64>,
    out: Option<JoinHandle<String>>,
    err: Option<JoinHandle<String>>,
}

fn reader(mut r: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = r.read_to_end(&mut v);
        String::from_utf8_lossy(&v).into_owned()
    })
}

impl Proc {
    /// Spawns `cmd`; on `cpu`, every thread of it (the spawning thread pins
    /// itself first, and the child inherits its affinity).
    fn spawn(name: &str, mut cmd: Command, cpu: Option<usize>) -> Result<Proc, String> {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = std::thread::scope(|s| {
            s.spawn(|| {
                if let Some(c) = cpu
                    && !crate::throughput::pin_to(c)
                {
                    return Err(std::io::Error::other(format!("cannot pin to CPU {c}")));
                }
                cmd.spawn()
            })
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("spawning thread panicked")))
        })
        .map_err(|e| format!("starting {name}: {e}"))?;
        let mut child = child;
        let out = child.stdout.take().map(reader);
        let err = child.stderr.take().map(reader);
        Ok(Proc {
            name: name.to_string(),
            child,
            reaped: false,
            main_cpu_s: None,
            out,
            err,
        })
    }

    /// Waits for the exit until `deadline`; `None` if it still runs.
    fn wait_until(&mut self, deadline: Instant) -> Option<ExitStatus> {
        use rustix::process::{WaitId, WaitIdOptions, waitid};
        let pid = rustix::process::Pid::from_child(&self.child);
        loop {
            // Exited? Then read its main thread's CPU time while it is a
            // zombie (still in /proc), and reap it.
            let exited = waitid(
                WaitId::Pid(pid),
                WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT,
            );
            // Reap only what that look saw exit: a process that ends between
            // the look and a reap would be reaped unread.
            let reap = match exited {
                Ok(Some(_)) => {
                    self.main_cpu_s = main_thread_cpu_s(pid.as_raw_nonzero().get());
                    true
                }
                Ok(None) => false,
                Err(_) => true,
            };
            if reap {
                match self.child.try_wait() {
                    Ok(Some(s)) => {
                        self.reaped = true;
                        return Some(s);
                    }
                    Ok(None) => {}
                    Err(_) => return None,
                }
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        self.wait_until(Instant::now())
    }

    /// Kills the process group (the process and anything it forked).
    fn kill(&mut self) {
        if self.reaped {
            return;
        }
        let pid = rustix::process::Pid::from_child(&self.child);
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.reaped = true;
    }

    /// Its stdout and stderr (after it ended).
    fn finish(mut self) -> (String, String) {
        self.kill();
        let out = self.out.take().map(|h| h.join().unwrap_or_default());
        let err = self.err.take().map(|h| h.join().unwrap_or_default());
        (out.unwrap_or_default(), err.unwrap_or_default())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// CPU seconds (user + system) of the main thread of process `pid`, from
/// `/proc/<pid>/task/<pid>/stat` (readable until the process is reaped).
fn main_thread_cpu_s(pid: i32) -> Option<f64> {
    let st = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/stat")).ok()?;
    let after = &st[st.rfind(')')? + 1..];
    let mut w = after.split_whitespace().skip(11);
    let utime: u64 = w.next()?.parse().ok()?;
    let stime: u64 = w.next()?.parse().ok()?;
    let hz = rustix::param::clock_ticks_per_second().max(1);
    Some((utime + stime) as f64 / hz as f64)
}

/// A port no socket is bound to on 127.0.0.1 now.
fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("finding a free port: {e}"))
}

/// True if some socket listens on TCP `port` (IPv4 or IPv6), from
/// `/proc/net/tcp*`: nothing connects to the server to find out.
fn listening(port: u16) -> bool {
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|s| {
            s.lines().skip(1).any(|l| {
                let mut w = l.split_whitespace();
                let local = w.nth(1);
                let state = w.nth(1);
                state == Some("0A")
                    && local
                        .and_then(|a| a.rsplit(':').next())
                        .and_then(|h| u16::from_str_radix(h, 16).ok())
                        == Some(port)
            })
        })
    })
}

/// The outputs of a server/client pair.
struct PairOut {
    client: String,
    server: String,
    wall_s: f64,
    /// The client's main thread's CPU time ÷ its wall time.
    client_cpu_share: Option<f64>,
}

fn command(program: &Path, args: &[String]) -> Command {
    let mut c = Command::new(program);
    c.args(args);
    c
}

/// Runs a server, waits until it listens on `port`, runs the client, and
/// waits for both (a `persistent` server, which never exits by itself, is
/// killed once the client is done). Every step bounded by `timeout`.
fn run_pair(
    server: (&Path, Vec<String>),
    client: (&Path, Vec<String>),
    port: u16,
    persistent: bool,
    cpus: Option<(usize, usize)>,
    timeout: Duration,
) -> Result<PairOut, String> {
    let name = server
        .0
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut srv = Proc::spawn(
        &format!("{name} server"),
        command(server.0, &server.1),
        cpus.map(|c| c.0),
    )?;
    let ready_by = Instant::now() + timeout.min(Duration::from_secs(10));
    loop {
        if listening(port) {
            break;
        }
        if let Some(s) = srv.exited() {
            let (o, e) = srv.finish();
            return Err(format!(
                "{name} server exited ({s}) before listening on {port}: {}",
                tail(&format!("{o}\n{e}"))
            ));
        }
        if Instant::now() >= ready_by {
            let (o, e) = srv.finish();
            return Err(format!(
                "{name} server not listening on {port} after {:?}: killed; {}",
                timeout.min(Duration::from_secs(10)),
                tail(&format!("{o}\n{e}"))
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let t0 = Instant::now();
    let mut cli = Proc::spawn(
        &format!("{name} client"),
        command(client.0, &client.1),
        cpus.map(|c| c.1),
    )?;
    let cs = cli.wait_until(t0 + timeout);
    let wall_s = t0.elapsed().as_secs_f64();
    let ss = match (cs, persistent) {
        (None, _) => None,
        (Some(_), true) => {
            srv.kill();
            None
        }
        (Some(_), false) => srv.wait_until(Instant::now() + Duration::from_secs(5)),
    };
    let server_name = srv.name.clone();
    let client_cpu_share = cli.main_cpu_s.map(|c| c / wall_s.max(1e-9));
    let (co, ce) = cli.finish();
    let (so, se) = srv.finish();
    let Some(cs) = cs else {
        return Err(format!(
            "{name} client still running after {timeout:?}: killed; client: {}; server: {}",
            tail(&format!("{co}\n{ce}")),
            tail(&format!("{so}\n{se}"))
        ));
    };
    if !cs.success() {
        return Err(format!(
            "{name} client failed ({cs}): {}; server: {}",
            tail(&format!("{co}\n{ce}")),
            tail(&format!("{so}\n{se}"))
        ));
    }
    if !persistent {
        match ss {
            Some(s) if s.success() => {}
            Some(s) => {
                return Err(format!(
                    "{server_name} failed ({s}): {}",
                    tail(&format!("{so}\n{se}"))
                ));
            }
            None => {
                return Err(format!(
                    "{server_name} did not exit 5 s after its client: killed; {}",
                    tail(&format!("{so}\n{se}"))
                ));
            }
        }
    }
    Ok(PairOut {
        client: co,
        server: so,
        wall_s,
        client_cpu_share,
    })
}

/// The binaries.
struct Tools {
    rdapl: PathBuf,
    fi_pingpong: Option<PathBuf>,
    qperf: Option<PathBuf>,
}

/// A run's result: the value and the iterations it covered.
struct Measured {
    value: f64,
    iters: u64,
    /// Seconds per iteration (a round trip, or a message of `bw`), for
    /// calibration.
    per_iter_s: f64,
    wall_s: f64,
    client_cpu_share: Option<f64>,
}

/// fi_pingpong's `cnt_str`: `999`, `2k`, `1m` (truncating).
fn fi_count(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{}b", n / 1_000_000_000)
    } else if n >= 1_000_000 {
        format!("{}m", n / 1_000_000)
    } else if n >= 1000 {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

/// fi_pingpong's `size_str` of a size: `64`, `4k`, `1m`.
fn fi_size(n: usize) -> String {
    let (base, mag) = if n >= 1 << 30 {
        (1usize << 30, "g")
    } else if n >= 1 << 20 {
        (1 << 20, "m")
    } else if n >= 1 << 10 {
        (1 << 10, "k")
    } else {
        (1, "")
    };
    let frac = if n / base < 10 {
        (n % base) * 10 / base
    } else {
        0
    };
    if frac > 0 {
        format!("{}.{frac}{mag}", n / base)
    } else {
        format!("{}{mag}", n / base)
    }
}

/// The result row (the line after the `bytes ...` header) of a
/// fi_pingpong-style table.
fn table_row(out: &str) -> Option<Vec<&str>> {
    let mut lines = out
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("bytes"));
    lines.next()?;
    lines
        .find(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect())
}

fn num(s: &str) -> Option<f64> {
    s.trim_end_matches('s').replace(',', "").parse().ok()
}

/// Iterations to run so that a run lasts about `secs` at `per_iter_s`,
/// within the bounds, and written exactly by fi_pingpong (whole thousands
/// from 1000 up).
pub fn iterations(secs: f64, per_iter_s: f64, min: usize, max: usize) -> u64 {
    let n = if per_iter_s > 0.0 && per_iter_s.is_finite() {
        (secs / per_iter_s).round() as usize
    } else {
        min
    };
    let n = n.clamp(min.max(1), max.max(min).max(1));
    let n = if n >= 1000 { n / 1000 * 1000 } else { n };
    n as u64
}

/// Runs `program` at `test`/`size` for `iters` iterations once.
fn measure_once(
    tools: &Tools,
    p: &Params,
    cpus: Option<(usize, usize)>,
    test: Test,
    size: usize,
    program: Program,
    iters: u64,
) -> Result<Measured, String> {
    let port = free_port()?;
    let s = |v: &dyn ToString| v.to_string();
    match program {
        Program::FiPingpong => {
            let bin = tools.fi_pingpong.as_deref().ok_or("fi_pingpong missing")?;
            let common = |port_flag: &str| -> Vec<String> {
                vec![
                    s(&"-p"),
                    s(&"tcp"),
                    s(&"-e"),
                    s(&"msg"),
                    s(&port_flag),
                    s(&port),
                    s(&"-I"),
                    s(&iters),
                    s(&"-S"),
                    s(&size),
                ]
            };
            let mut client = common("-P");
            client.push("127.0.0.1".into());
            let out = run_pair(
                (bin, common("-B")),
                (bin, client),
                port,
                false,
                cpus,
                p.timeout,
            )?;
            for (side, text) in [("client", &out.client), ("server", &out.server)] {
                let f = table_row(text)
                    .ok_or_else(|| format!("fi_pingpong {side}: no result row: {}", tail(text)))?;
                let want = [
                    fi_size(size),
                    fi_count(iters),
                    format!("={}", fi_count(iters)),
                ];
                if f.len() < 8 || f[0] != want[0] || f[1] != want[1] || f[2] != want[2] {
                    return Err(format!(
                        "fi_pingpong {side}: expected {} of {} sent and acknowledged, got `{}`",
                        want[1],
                        want[0],
                        f.join(" ")
                    ));
                }
            }
            let f = table_row(&out.client).unwrap_or_default();
            let usec = f
                .get(6)
                .and_then(|v| num(v))
                .filter(|v| *v > 0.0)
                .ok_or("fi_pingpong: no usec/xfer")?;
            Ok(Measured {
                value: if test == Test::Latency {
                    usec
                } else {
                    size as f64 / usec
                },
                iters,
                per_iter_s: 2.0 * usec * 1e-6,
                wall_s: out.wall_s,
                client_cpu_share: out.client_cpu_share,
            })
        }
        Program::Qperf => {
            let bin = tools.qperf.as_deref().ok_or("qperf missing")?;
            let name = if test == Test::StreamBw {
                "tcp_bw"
            } else {
                "tcp_lat"
            };
            let client: Vec<String> = vec![
                s(&"127.0.0.1"),
                s(&"-lp"),
                s(&port),
                s(&"-t"),
                s(&p.qperf_secs.max(1)),
                s(&"-m"),
                s(&size),
                s(&"-uu"),
                s(&"-e"),
                s(&"5"),
                s(&"-vvs"),
                s(&name),
            ];
            let out = run_pair(
                (bin, vec![s(&"-lp"), s(&port)]),
                (bin, client),
                port,
                true,
                cpus,
                p.timeout,
            )?;
            parse_qperf(&out.client, test).map(|(value, msgs)| Measured {
                value,
                iters: msgs,
                per_iter_s: f64::NAN,
                wall_s: out.wall_s,
                client_cpu_share: out.client_cpu_share,
            })
        }
        _ => {
            let sub = if test == Test::StreamBw {
                "bw"
            } else {
                "pingpong"
            };
            let mut common: Vec<String> = vec![
                s(&"-p"),
                s(&"tcp"),
                s(&"-a"),
                s(&"127.0.0.1"),
                s(&"-q"),
                s(&port),
                s(&"-S"),
                s(&size),
                s(&"-I"),
                s(&iters),
                s(&"--window"),
                s(&p.window),
                // One message buffer a side, reused, as fi_pingpong's,
                // qperf's and perftest's are: the same working set as the
                // peers (one buffer per message in flight put 33 MiB
                // through the caches at 1 MiB).
                s(&"--buffers"),
                s(&1),
                s(&"--timeout"),
                s(&p.timeout.as_secs_f64()),
            ];
            if program.waits() {
                common.push("-w".into());
            }
            if !program.crc() {
                common.extend([s(&"--params"), s(&"crc=0")]);
            }
            if program.sent() {
                common.extend([s(&"--params"), s(&"complete=sent")]);
            }
            let mut server = vec![s(&sub), s(&"-s"), s(&"--once")];
            server.extend(common.iter().cloned());
            let mut client = vec![s(&sub)];
            client.extend(common);
            client.push("127.0.0.1".into());
            let out = run_pair(
                (&tools.rdapl, server),
                (&tools.rdapl, client),
                port,
                false,
                cpus,
                p.timeout,
            )?;
            let f = table_row(&out.client)
                .ok_or_else(|| format!("rdapl {sub}: no result row: {}", tail(&out.client)))?;
            let acked = if test == Test::StreamBw { 1 } else { iters };
            if f.len() < 8 || f[1].parse::<u64>() != Ok(iters) || f[2].parse::<u64>() != Ok(acked) {
                return Err(format!(
                    "rdapl {sub}: expected {iters} sent and {acked} acknowledged, got `{}`",
                    f.join(" ")
                ));
            }
            let (mb, usec) = (num(f[5]), num(f[6]));
            let (Some(mb), Some(usec)) = (mb, usec) else {
                return Err(format!("rdapl {sub}: unreadable row `{}`", f.join(" ")));
            };
            let (value, per_iter_s) = match test {
                Test::Latency => (usec, 2.0 * usec * 1e-6),
                Test::PingpongBw => (size as f64 / usec, 2.0 * usec * 1e-6),
                Test::StreamBw => (mb, usec * 1e-6),
            };
            if !(value > 0.0 && value.is_finite()) {
                return Err(format!("rdapl {sub}: no figure in `{}`", f.join(" ")));
            }
            Ok(Measured {
                value,
                iters,
                per_iter_s,
                wall_s: out.wall_s,
                client_cpu_share: out.client_cpu_share,
            })
        }
    }
}

/// qperf's figure (`latency` in µs, `bw` in MB/s) and the messages
/// received, checking that messages went both ways (latency) or arrived
/// (bandwidth) and that no errors are reported.
pub fn parse_qperf(out: &str, test: Test) -> Result<(f64, u64), String> {
    let field = |key: &str| -> Option<f64> {
        out.lines().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == key)
                .then(|| v.split_whitespace().next().and_then(num))
                .flatten()
        })
    };
    if let Some(l) = out.lines().find(|l| {
        l.contains("errors")
            && l.split_once('=').is_some_and(|(_, v)| {
                num(v.split_whitespace().next().unwrap_or("0")).unwrap_or(1.0) != 0.0
            })
    }) {
        return Err(format!("qperf reports errors: {}", l.trim()));
    }
    let (value, msgs) = match test {
        Test::Latency => {
            let ns = field("latency").ok_or_else(|| format!("qperf: no latency: {}", tail(out)))?;
            let loc = field("loc_recv_msgs").unwrap_or(0.0);
            let rem = field("rem_recv_msgs").unwrap_or(0.0);
            if loc < 1.0 || rem < 1.0 {
                return Err(format!(
                    "qperf tcp_lat: no messages both ways: {}",
                    tail(out)
                ));
            }
            (ns / 1000.0, loc)
        }
        _ => {
            let bw = field("bw").ok_or_else(|| format!("qperf: no bw: {}", tail(out)))?;
            let msgs = field("recv_msgs").unwrap_or(0.0);
            if msgs < 1.0 {
                return Err(format!("qperf tcp_bw: nothing received: {}", tail(out)));
            }
            (bw / 1e6, msgs)
        }
    };
    if !(value > 0.0 && value.is_finite()) {
        return Err(format!("qperf: no figure: {}", tail(out)));
    }
    Ok((value, msgs as u64))
}

/// The 1-minute load average (NaN if unknown).
fn load_avg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

fn case_id(test: Test, size: usize, program: Program) -> String {
    format!("{}/{}/{}", test.name(), size_label(size), program.name())
}

/// Runs benchmark 5.
pub fn run(p: &Params, reps: usize, progress: impl Fn(&str)) -> Output {
    let mut out = Output::default();
    out.setup.placement = Some(p.placement);
    let fi = find_tool("fi_pingpong", "RDAPL_FI_PINGPONG");
    let qp = find_tool("qperf", "RDAPL_QPERF");
    out.setup.fi_pingpong = fi.as_ref().map(|p| p.display().to_string());
    out.setup.qperf = qp.as_ref().map(|p| p.display().to_string());
    let missing = |have: &Option<PathBuf>, name: &str, pkg: &str| {
        have.is_none()
            .then(|| format!("{name} not found on PATH (Debian: apt-get install {pkg})"))
    };
    let fi_missing = missing(&fi, "fi_pingpong", "libfabric-bin");
    let qp_missing = missing(&qp, "qperf", "qperf");
    for why in fi_missing.iter().chain(&qp_missing) {
        progress(&format!("peer missing: {why}: its rows are pending"));
    }
    if required() && (fi_missing.is_some() || qp_missing.is_some()) {
        out.setup.error = Some(format!(
            "{} and RDAPL_REQUIRE_EXTERNAL=1",
            fi_missing
                .iter()
                .chain(&qp_missing)
                .cloned()
                .collect::<Vec<_>>()
                .join("; ")
        ));
        return out;
    }
    let rdapl = match rdapl_binary(&|s: &str| progress(s)) {
        Ok(b) => b,
        Err(e) => {
            out.setup.error = Some(e);
            return out;
        }
    };
    out.setup.rdapl_bin = Some(rdapl.display().to_string());
    progress(&format!("rdapl binary: {}", rdapl.display()));
    let cpus = match p.placement {
        Placement::Unpinned => None,
        Placement::Split => {
            let allowed = crate::throughput::allowed_cpus();
            if allowed.len() < 2 {
                out.setup.error = Some(format!(
                    "placement split needs 2 CPUs, {} allowed",
                    allowed.len()
                ));
                return out;
            }
            Some((allowed[0], allowed[1]))
        }
    };
    out.setup.cpus = cpus;
    let tools = Tools {
        rdapl,
        fi_pingpong: fi,
        qperf: qp,
    };
    let pending_for = |prog: Program| -> Option<String> {
        match prog {
            Program::FiPingpong => fi_missing.clone(),
            Program::Qperf => qp_missing.clone(),
            _ => None,
        }
    };
    let groups = groups(p);

    // Warm-up and calibration: one untimed run of each counted case.
    let mut iters: Vec<(String, u64)> = Vec::new();
    let mut calib_errors: Vec<(String, String)> = Vec::new();
    for (test, size, progs) in &groups {
        for &prog in progs {
            if pending_for(prog).is_some() || !p.calibrate {
                continue;
            }
            if prog == Program::Qperf {
                if *test == Test::Latency
                    && let Err(e) = measure_once(&tools, p, cpus, *test, *size, prog, 0)
                {
                    calib_errors.push((case_id(*test, *size, prog), e));
                }
                continue;
            }
            let n0 = if *size >= 1 << 20 {
                (p.calib_iters / 10).max(2)
            } else {
                p.calib_iters
            } as u64;
            let id = case_id(*test, *size, prog);
            match measure_once(&tools, p, cpus, *test, *size, prog, n0) {
                Ok(m) => {
                    let min = if *size >= 1 << 20 {
                        (p.min_iters / 10).max(2)
                    } else {
                        p.min_iters
                    };
                    let n = iterations(p.run_secs, m.per_iter_s, min, p.max_iters);
                    progress(&format!(
                        "warm-up {id}: {} {} at {n0} iterations → {n} per run",
                        crate::report::num(m.value),
                        test.unit()
                    ));
                    iters.push((id, n));
                }
                Err(e) => {
                    progress(&format!("warm-up {id} FAILED: {e}"));
                    calib_errors.push((id, e));
                }
            }
        }
    }
    out.setup.iters = iters.clone();
    let iters_of = |id: &str| {
        iters
            .iter()
            .find(|(k, _)| k == id)
            .map(|(_, n)| *n)
            .unwrap_or(if p.calibrate {
                p.min_iters as u64
            } else {
                p.calib_iters as u64
            })
    };

    // The repetitions.
    let mut by_case: Vec<Vec<Vec<Run>>> = groups
        .iter()
        .map(|(_, _, progs)| progs.iter().map(|_| Vec::new()).collect())
        .collect();
    for rep in 0..reps {
        let t = Instant::now();
        let load = load_avg();
        out.setup.load_avg.push(load);
        for (g, (test, size, progs)) in groups.iter().enumerate() {
            let rounds = p.runs.max(1);
            for round in 0..rounds {
                for (position, k) in order(progs.len(), rep * rounds + round)
                    .into_iter()
                    .enumerate()
                {
                    let prog = progs[k];
                    if pending_for(prog).is_some() {
                        continue;
                    }
                    let id = case_id(*test, *size, prog);
                    let n = iters_of(&id);
                    let (value, iters, wall_s, client_cpu_share, error) =
                        match measure_once(&tools, p, cpus, *test, *size, prog, n) {
                            Ok(m) => (m.value, m.iters, m.wall_s, m.client_cpu_share, None),
                            Err(e) => {
                                progress(&format!("rep {rep} {id} FAILED: {e}"));
                                (f64::NAN, n, 0.0, None, Some(e))
                            }
                        };
                    by_case[g][k].push(Run {
                        rep,
                        round,
                        position,
                        value,
                        iters,
                        wall_s,
                        client_cpu_share,
                        error,
                    });
                }
            }
        }
        progress(&format!(
            "repetition {}/{reps} ({:.1} s, load average {load:.2} at its start)",
            rep + 1,
            t.elapsed().as_secs_f64()
        ));
    }

    // Rows.
    for (g, (test, size, progs)) in groups.iter().enumerate() {
        let best = |k: usize| best_per_rep(&by_case[g][k], reps, test.higher_is_better());
        let values = |b: &[Option<&Run>]| -> Vec<f64> {
            b.iter().map(|r| r.map_or(f64::NAN, |r| r.value)).collect()
        };
        for (k, &prog) in progs.iter().enumerate() {
            let id = format!("tcp/{}", case_id(*test, *size, prog));
            let b = best(k);
            let v = values(&b);
            let share: Vec<f64> = b
                .iter()
                .map(|r| r.and_then(|r| r.client_cpu_share).unwrap_or(f64::NAN))
                .collect();
            let all: Vec<f64> = by_case[g][k]
                .iter()
                .map(|r| r.value)
                .filter(|v| v.is_finite())
                .collect();
            let peer = prog.peer();
            let peer_k = peer.and_then(|q| progs.iter().position(|x| *x == q));
            let ratio = match peer_k {
                Some(pk) => Summary::of(&rep_ratios(&v, &values(&best(pk)), reps)),
                None => Summary::of(&[]),
            };
            let mut rruns = by_case[g][k].clone();
            if let Some((_, e)) = calib_errors
                .iter()
                .find(|(c, _)| *c == case_id(*test, *size, prog))
            {
                rruns.push(Run {
                    rep: usize::MAX,
                    round: 0,
                    position: 0,
                    value: f64::NAN,
                    iters: 0,
                    wall_s: 0.0,
                    client_cpu_share: None,
                    error: Some(format!("warm-up: {e}")),
                });
            }
            let failed = rruns.iter().filter(|r| r.error.is_some()).count();
            let pending = pending_for(prog)
                .or_else(|| peer.and_then(pending_for).map(|w| format!("peer: {w}")));
            if let Some(why) = pending_for(prog) {
                out.pending.push(Pending {
                    id: id.clone(),
                    status: why,
                });
            }
            out.rows.push(Row {
                id,
                test: *test,
                size: *size,
                size_label: size_label(*size),
                program: prog,
                peer,
                unit: test.unit().into(),
                value: Summary::of(&v),
                value_all: Summary::of(&all),
                ratio_vs_peer: ratio,
                client_cpu_share: Summary::of(&share),
                runs: rruns,
                failed_reps: failed,
                pending,
            });
        }
    }
    out
}

/// Each repetition's best successful run (`None` if none succeeded): the
/// highest value if `higher` is better, else the lowest.
pub fn best_per_rep(runs: &[Run], reps: usize, higher: bool) -> Vec<Option<&Run>> {
    let mut b: Vec<Option<&Run>> = vec![None; reps];
    for r in runs.iter().filter(|r| r.value.is_finite() && r.rep < reps) {
        let better = match b[r.rep] {
            None => true,
            Some(o) if higher => r.value > o.value,
            Some(o) => r.value < o.value,
        };
        if better {
            b[r.rep] = Some(r);
        }
    }
    b
}

/// True if `r` is the row a target judges.
pub fn target_of(r: &Row) -> Option<(f64, crate::report::Compare)> {
    use crate::report::Compare;
    match (r.test, r.program) {
        (Test::Latency, Program::RdaplPoll) => Some((LATENCY_BOUND, Compare::AtMost)),
        (Test::PingpongBw, Program::RdaplPoll) if r.size >= TARGET_FROM_SIZE => {
            Some((PINGPONG_BW_BOUND, Compare::AtLeast))
        }
        (Test::StreamBw, Program::RdaplWait) if r.size >= TARGET_FROM_SIZE => {
            Some((STREAM_BW_BOUND, Compare::AtLeast))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repetition_counts_its_best_run() {
        let run = |rep, round, value: f64| Run {
            rep,
            round,
            position: 0,
            value,
            iters: 1,
            wall_s: 0.1,
            client_cpu_share: None,
            error: value.is_nan().then(|| "failed".to_string()),
        };
        let runs = [
            run(0, 0, 800.0),
            run(0, 1, 2400.0),
            run(0, 2, 900.0),
            run(1, 0, f64::NAN),
            run(1, 1, 1500.0),
            run(2, 0, f64::NAN),
            run(usize::MAX, 0, f64::NAN),
        ];
        let v = |higher| -> Vec<Option<f64>> {
            best_per_rep(&runs, 3, higher)
                .iter()
                .map(|r| r.map(|r| r.value))
                .collect()
        };
        assert_eq!(v(true), [Some(2400.0), Some(1500.0), None]);
        assert_eq!(v(false), [Some(800.0), Some(1500.0), None]);
    }

    #[test]
    fn orders_rotate_and_reverse() {
        assert_eq!(order(3, 0), vec![0, 1, 2]);
        assert_eq!(order(3, 1), vec![0, 2, 1]);
        assert_eq!(order(3, 2), vec![2, 0, 1]);
        assert_eq!(order(3, 3), vec![2, 1, 0]);
        // Every case runs first in some repetition.
        let firsts: std::collections::BTreeSet<usize> = (0..6).map(|r| order(3, r)[0]).collect();
        assert_eq!(firsts.len(), 3);
    }

    #[test]
    fn fi_pingpong_formats() {
        assert_eq!(fi_count(999), "999");
        assert_eq!(fi_count(2000), "2k");
        assert_eq!(fi_count(2500), "2k");
        assert_eq!(fi_size(64), "64");
        assert_eq!(fi_size(4096), "4k");
        assert_eq!(fi_size(65536), "64k");
        assert_eq!(fi_size(1 << 20), "1m");
        assert_eq!(fi_size(1536), "1.5k");
        let out = "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n\
                   64      2k      =2k      250k        0.38s      0.67      95.21       0.01\n";
        let f = table_row(out).unwrap();
        assert_eq!(f[2], "=2k");
        assert_eq!(num(f[6]), Some(95.21));
    }

    #[test]
    fn iterations_round_for_fi_pingpong() {
        assert_eq!(iterations(0.3, 1e-4, 10, 100_000), 3000);
        assert_eq!(iterations(0.3, 2.9e-4, 10, 100_000), 1000);
        assert_eq!(iterations(0.3, 1e-3, 10, 100_000), 300);
        assert_eq!(iterations(0.3, 1.0, 10, 100_000), 10);
        assert_eq!(iterations(0.3, 1e-9, 10, 100_000), 100_000);
        assert_eq!(iterations(0.3, f64::NAN, 10, 100_000), 10);
    }

    #[test]
    fn qperf_output_is_read_and_checked() {
        let lat = "tcp_lat:\n    latency         =  39038 ns\n    msg_rate        =  25616 /sec\n\
                   loc_send_msgs   =  12809 \n    loc_recv_msgs   =  12808 \n\
                   rem_send_msgs   =  12808 \n    rem_recv_msgs   =  12808 \n";
        assert_eq!(parse_qperf(lat, Test::Latency), Ok((39.038, 12808)));
        let bw = "tcp_bw:\n    bw          =  1136918528 bytes/sec\n    send_msgs   =       17347 \n\
                  recv_bytes  =  1136918528 bytes\n    recv_msgs   =       17348 \n";
        let (v, n) = parse_qperf(bw, Test::StreamBw).unwrap();
        assert!((v - 1136.918528).abs() < 1e-9 && n == 17348);
        let bad = format!("{bw}    recv_errors =  3 \n");
        assert!(parse_qperf(&bad, Test::StreamBw).is_err());
        assert!(parse_qperf("tcp_bw:\n    bw = 5 bytes/sec\n", Test::StreamBw).is_err());
    }

    fn sh(script: &str) -> (PathBuf, Vec<String>) {
        (PathBuf::from("/bin/sh"), vec!["-c".into(), script.into()])
    }

    #[test]
    fn a_server_that_never_listens_is_killed() {
        let port = free_port().unwrap();
        let t = Instant::now();
        let (b, a) = sh("echo hello; exec sleep 30");
        let e = run_pair(
            (&b, a.clone()),
            (&b, a),
            port,
            false,
            None,
            Duration::from_millis(300),
        )
        .err()
        .unwrap();
        assert!(e.contains("not listening"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_client_past_its_timeout_is_killed_with_the_server() {
        // Something listens on the port (this test), so the client starts.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let t = Instant::now();
        let (b, srv) = sh("exec sleep 30");
        let (_, cli) = sh("sleep 30 & wait");
        let e = run_pair(
            (&b, srv),
            (&b, cli),
            port,
            true,
            None,
            Duration::from_millis(300),
        )
        .err()
        .unwrap();
        assert!(e.contains("still running"), "{e}");
        // The readers returned: every process of both groups is gone.
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_failing_client_is_an_error() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let (b, srv) = sh("exec sleep 30");
        let (_, cli) = sh("echo broken >&2; exit 3");
        let e = run_pair(
            (&b, srv),
            (&b, cli),
            port,
            true,
            None,
            Duration::from_secs(5),
        )
        .err()
        .unwrap();
        assert!(e.contains("failed") && e.contains("broken"), "{e}");
    }

    #[test]
    fn a_clients_main_thread_cpu_is_read_before_it_is_reaped() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let (b, srv) = sh("exec sleep 30");
        let (_, spin) = sh("i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done");
        let out = run_pair(
            (&b, srv.clone()),
            (&b, spin),
            port,
            true,
            None,
            Duration::from_secs(20),
        )
        .unwrap();
        let busy = out.client_cpu_share.expect("a CPU share");
        let (_, idle) = sh("exec sleep 0.3");
        let out = run_pair(
            (&b, srv),
            (&b, idle),
            port,
            true,
            None,
            Duration::from_secs(20),
        )
        .unwrap();
        let asleep = out.client_cpu_share.expect("a CPU share");
        assert!(busy > 0.2 && asleep < 0.1, "busy {busy}, asleep {asleep}");
    }

    #[test]
    fn proc_net_tcp_shows_a_listener() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert!(listening(port));
        drop(l);
        assert!(!listening(port));
    }
}
