//! rdapl's TCP/iWARP provider against the Linux kernel's soft-iWARP (siw)
//! and rdma-core's tools, in the lab VM (`lab/vm/`, built by its
//! `build.sh`; booted once here, under TCG, for all scenarios in turn):
//!
//! * `rdapl rping -c` on the host against `rping -s` in the VM (hostfwd
//!   127.0.0.1:P → 10.0.2.15:P), with CRC off and with CRC on;
//! * `rping -c -V` in the VM against `rdapl rping -s` on 127.0.0.1
//!   (guestfwd 10.0.2.100:P → 127.0.0.1:P), with CRC off and on (siw asks
//!   for no CRC; the rdapl server turns it on by answering with C set);
//! * rdma-core's `rdma_server` / `rdma_client` (librdmacm's examples: one
//!   16-byte Send each way, the server disconnects) against `rdapl
//!   rdma-cm`, each way;
//! * rping each way again with the rdapl side's Sends and Writes completing
//!   once TCP has them (`RDAPL_TCP_PARAMS=complete=sent`, siw's meaning);
//! * `rdapl rping -c --interval 0.7` with `timeout_ms=1000`: idle between
//!   pings, the rdapl side asks siw with heartbeats (zero-length reads),
//!   which must be in the capture and answered (every ping checked);
//! * the whole session captured in the VM and decoded by the host's
//!   tshark: the CRC flag of every MPA exchange as expected, every CRC good
//!   where CRC is on, no malformed frame.
//!
//! Both sides check every ping's data (rping's pattern; rping -V compares
//! the echo), and every ping line is compared with the pattern; in the
//! rping scenarios rdapl prints nothing else, not one warning of its logs
//! (no Terminate sent or received, no socket error).
//!
//! Without the lab (no `$LAB_DATA/disk.raw`, no qemu) the test prints why
//! and passes, unless `RDAPL_REQUIRE_EXTERNAL=1` (CI), where it fails.
//! `RDAPL_SIW_KEEP=1` keeps the run folder (`$LAB_DATA/runs/test-*`).

use rdapl_cli::rping::pattern;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Pings per scenario.
const COUNT: u32 = 10;
/// Bound of each step (a scenario's commands, on either side).
const STEP: Duration = Duration::from_secs(60);
/// Bound of the boot (qemu start to the first scenario).
const BOOT: Duration = Duration::from_secs(240);
/// Bound of the whole VM run.
const RUN_LIMIT_S: u64 = 600;

fn skip_or_fail(why: &str) {
    rdapl_conformance::support::skip_or_fail("siw interoperability tests", why);
}

fn have(tool: &str, arg: &str) -> bool {
    Command::new(tool)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn lab_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../lab/vm")
}

fn lab_data() -> PathBuf {
    std::env::var_os("LAB_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/rdapl-lab"))
}

/// Which side serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    /// The VM serves on 10.0.2.15:port; the host connects to 127.0.0.1:port.
    HostToVm,
    /// The host serves on 127.0.0.1:port; the VM connects to 10.0.2.100:port.
    VmToHost,
}

/// Which tool pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tool {
    /// `rping` and `rdapl rping`.
    Rping,
    /// rdma-core's `rdma_server` / `rdma_client` and `rdapl rdma-cm`.
    RdmaCm,
}

struct Scenario {
    name: &'static str,
    tool: Tool,
    dir: Dir,
    port: u16,
    /// The rdapl side asks for CRC.
    crc: bool,
    /// Ping size (the client's).
    size: usize,
    /// The tcp provider's default parameters on the rdapl side
    /// (`RDAPL_TCP_PARAMS`), e.g. `complete=sent`.
    params: &'static str,
    /// The rdapl client's pause between pings, in seconds (`""`: none).
    interval: &'static str,
}

impl Scenario {
    fn vm_call(&self) -> String {
        if self.tool == Tool::RdmaCm {
            return match self.dir {
                Dir::HostToVm => format!(
                    "vm_server {} {} rdma_server -p {}",
                    self.name, self.port, self.port
                ),
                Dir::VmToHost => format!(
                    "vm_client {} rdma_client -s 10.0.2.100 -p {}",
                    self.name, self.port
                ),
            };
        }
        match self.dir {
            Dir::HostToVm => format!(
                "vm_server {} {} rping -s -v -S {} -a $VM_IP -p {}",
                self.name, self.port, self.size, self.port
            ),
            Dir::VmToHost => format!(
                "vm_client {} rping -c -v -V -C {COUNT} -S {} -a 10.0.2.100 -p {}",
                self.name, self.size, self.port
            ),
        }
    }

    fn rdapl_args(&self) -> Vec<String> {
        let tool = match self.tool {
            Tool::Rping => "rping",
            Tool::RdmaCm => "rdma-cm",
        };
        let mut a: Vec<String> = match self.dir {
            Dir::HostToVm => vec![tool.into(), "-c".into(), "-S".into(), self.size.to_string()],
            Dir::VmToHost => vec![tool.into(), "-s".into()],
        };
        if !self.interval.is_empty() {
            a.extend(["--interval".into(), self.interval.into()]);
        }
        a.extend(
            [
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-C",
                &COUNT.to_string(),
                "-v",
                "--crc",
                if self.crc { "1" } else { "0" },
                "--timeout",
                "30",
            ]
            .map(String::from),
        );
        a
    }
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "rdapl-client-crc0",
        tool: Tool::Rping,
        dir: Dir::HostToVm,
        port: 27174,
        crc: false,
        size: 64,
        params: "",
        interval: "",
    },
    Scenario {
        name: "rdapl-client-crc1",
        tool: Tool::Rping,
        dir: Dir::HostToVm,
        port: 27175,
        crc: true,
        // Several FPDUs each way (siw's are at most one MSS).
        size: 5000,
        params: "",
        interval: "",
    },
    Scenario {
        name: "rdapl-server-crc0",
        tool: Tool::Rping,
        dir: Dir::VmToHost,
        port: 27176,
        crc: false,
        size: 64,
        params: "",
        interval: "",
    },
    Scenario {
        name: "rdapl-server-crc1",
        tool: Tool::Rping,
        dir: Dir::VmToHost,
        port: 27177,
        crc: true,
        size: 3000,
        params: "",
        interval: "",
    },
    Scenario {
        name: "rdma-cm-client-crc1",
        tool: Tool::RdmaCm,
        dir: Dir::HostToVm,
        port: 27178,
        crc: true,
        size: 64,
        params: "",
        interval: "",
    },
    Scenario {
        name: "rdma-cm-server-crc0",
        tool: Tool::RdmaCm,
        dir: Dir::VmToHost,
        port: 27179,
        crc: false,
        size: 64,
        params: "",
        interval: "",
    },
    // Sends and Writes complete once TCP has them (siw's own meaning).
    Scenario {
        name: "rdapl-client-sent-crc1",
        tool: Tool::Rping,
        dir: Dir::HostToVm,
        port: 27180,
        crc: true,
        size: 5000,
        params: "complete=sent",
        interval: "",
    },
    Scenario {
        name: "rdapl-server-sent-crc0",
        tool: Tool::Rping,
        dir: Dir::VmToHost,
        port: 27181,
        crc: false,
        size: 3000,
        params: "complete=sent",
        interval: "",
    },
    // Idle between pings for longer than half the timeout: the rdapl
    // side asks siw with heartbeats, zero-length reads (no fences on
    // `sent`, so every Read Request from the host is one), and siw
    // answers them.
    Scenario {
        name: "rdapl-client-idle-crc1",
        tool: Tool::Rping,
        dir: Dir::HostToVm,
        port: 27182,
        crc: true,
        size: 64,
        params: "complete=sent,timeout_ms=1000",
        interval: "0.7",
    },
];

/// A child whose stdout and stderr lines are collected (and sent on).
struct Logged {
    child: Child,
    lines: mpsc::Receiver<String>,
    all: Vec<String>,
}

impl Logged {
    fn spawn(cmd: &mut Command) -> Logged {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
        let (tx, rx) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        let err = child.stderr.take().unwrap();
        let tx2 = tx.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx2.send(l);
            }
        });
        Logged {
            child,
            lines: rx,
            all: Vec::new(),
        }
    }

    /// Waits until a line contains `what` (true) or `limit` passes.
    fn wait_line(&mut self, what: &str, limit: Duration) -> bool {
        let end = Instant::now() + limit;
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let hit = l.contains(what);
                    self.all.push(l);
                    if hit {
                        return true;
                    }
                }
                Err(_) => return false,
            }
        }
        false
    }

    /// Waits for the exit (killing the child after `limit`); the exit code
    /// (None if killed) and every line.
    fn finish(mut self, limit: Duration) -> (Option<i32>, Vec<String>) {
        let end = Instant::now() + limit;
        let code = loop {
            match self.child.try_wait() {
                Ok(Some(st)) => break st.code(),
                Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(50)),
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break None;
                }
            }
        };
        // The readers end with the pipes.
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(2)) {
            self.all.push(l);
        }
        (code, self.all)
    }
}

fn wait_file(p: &Path, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if p.exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// What the host side of a scenario saw.
struct HostSide {
    code: Option<i32>,
    lines: Vec<String>,
}

fn host_side(s: &Scenario, run: &Path, out: &Path, first: bool) -> HostSide {
    let rdapl = env!("CARGO_BIN_EXE_rdapl");
    let mut cmd = Command::new(rdapl);
    cmd.args(s.rdapl_args());
    // Its logs at the default level (warn): a warning in a clean rping
    // exchange (a Terminate either way, a socket error) is a line
    // `check_pings` refuses.
    cmd.env_remove("RDAPL_LOG");
    // (The user's own settings dropped: a scenario names its own.)
    cmd.env_remove(rdapl_tcp::PARAMS_ENV);
    if !s.params.is_empty() {
        cmd.env(rdapl_tcp::PARAMS_ENV, s.params);
    }
    let r = match s.dir {
        Dir::HostToVm => {
            let ready = out.join(format!("{}.ready", s.name));
            if !wait_file(&ready, if first { BOOT } else { STEP }) {
                HostSide {
                    code: None,
                    lines: vec![format!("the VM's server never became ready ({ready:?})")],
                }
            } else {
                let (code, lines) = Logged::spawn(&mut cmd).finish(STEP);
                HostSide { code, lines }
            }
        }
        Dir::VmToHost => {
            let mut srv = Logged::spawn(&mut cmd);
            if !srv.wait_line("listening on", Duration::from_secs(10)) {
                let (code, mut lines) = srv.finish(Duration::from_secs(1));
                lines.push("the rdapl server never listened".into());
                HostSide { code, lines }
            } else {
                std::fs::write(run.join(format!("{}.go", s.name)), b"").unwrap();
                // The server ends once the VM's client disconnects; give it
                // a little after the VM's client is done.
                let done = out.join(format!("{}.vm.done", s.name));
                let limit = if first { BOOT + STEP } else { STEP + STEP };
                let t0 = Instant::now();
                let left = if wait_file(&done, limit) {
                    Duration::from_secs(10)
                } else {
                    limit.saturating_sub(t0.elapsed()) + Duration::from_secs(1)
                };
                let (code, lines) = srv.finish(left);
                HostSide { code, lines }
            }
        }
    };
    if s.dir == Dir::HostToVm {
        std::fs::write(run.join(format!("{}.done", s.name)), b"").unwrap();
    }
    let _ = std::fs::write(
        run.join(format!("{}.host.txt", s.name)),
        r.lines.join("\n") + "\n",
    );
    r
}

/// The ping lines `prefix` + rping's data for pings 0..COUNT, in order,
/// and nothing else but `allowed` lines.
fn check_pings(
    who: &str,
    lines: &[String],
    prefix: &str,
    size: usize,
    allowed: &[&str],
) -> Result<(), String> {
    let pings: Vec<&String> = lines.iter().filter(|l| l.starts_with(prefix)).collect();
    for (i, l) in pings.iter().enumerate() {
        let p = pattern(i as u32, size);
        let want = format!("{prefix}{}", String::from_utf8_lossy(&p[..size - 1]));
        if **l != want {
            let at = l.bytes().zip(want.bytes()).position(|(a, b)| a != b);
            return Err(format!(
                "{who}: ping {i} printed {} bytes, want {} (first difference at {at:?})",
                l.len(),
                want.len()
            ));
        }
    }
    if pings.len() != COUNT as usize {
        return Err(format!("{who}: {} ping line(s), want {COUNT}", pings.len()));
    }
    for l in lines {
        if !l.starts_with(prefix) && !allowed.iter().any(|a| l.contains(a)) {
            let l: String = l.chars().take(200).collect();
            return Err(format!("{who}: unexpected line {l:?}"));
        }
    }
    Ok(())
}

fn check_scenario(s: &Scenario, host: &HostSide, out: &Path) -> Result<(), String> {
    let vm_rc = std::fs::read_to_string(out.join(format!("{}.vm.rc", s.name)))
        .map_err(|_| "the VM side left no exit code".to_string())?;
    let read = |ext: &str| -> Vec<String> {
        std::fs::read_to_string(out.join(format!("{}.vm.{ext}", s.name)))
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect()
    };
    let (vm_lines, vm_err) = (read("txt"), read("err"));
    let short = |ls: &[String]| -> String {
        ls.iter()
            .map(|l| l.chars().take(120).collect::<String>())
            .collect::<Vec<_>>()
            .join("\n")
    };
    let ctx = || {
        format!(
            "\n--- host (rdapl rping, rc {:?}):\n{}\n--- VM (rc {}):\n{}\n--- VM stderr:\n{}",
            host.code,
            short(&host.lines),
            vm_rc.trim(),
            short(&vm_lines),
            short(&vm_err)
        )
    };
    if host.code != Some(0) {
        return Err(format!("rdapl rping failed{}", ctx()));
    }
    if vm_rc.trim() != "0" {
        return Err(format!("the VM's rping failed{}", ctx()));
    }
    if s.tool == Tool::RdmaCm {
        let end = match s.dir {
            Dir::HostToVm => "rdma_server: end 0",
            Dir::VmToHost => "rdma_client: end 0",
        };
        let ok_host = host
            .lines
            .iter()
            .any(|l| l.contains("16 bytes each way, then disconnected"));
        let ok_vm = vm_lines.iter().any(|l| l == end);
        return if ok_host && ok_vm {
            Ok(())
        } else {
            Err(format!("want {end:?} in the VM's output{}", ctx()))
        };
    }
    let checked = format!("{COUNT} ping(s) of rping's data checked");
    match s.dir {
        Dir::HostToVm => check_pings(
            "rdapl client",
            &host.lines,
            "ping data: ",
            s.size,
            &[&checked],
        )
        .and_then(|()| check_pings("VM rping -s", &vm_lines, "server ping data: ", s.size, &[])),
        Dir::VmToHost => check_pings(
            "rdapl server",
            &host.lines,
            "server ping data: ",
            s.size,
            &[&checked, "listening on"],
        )
        .and_then(|()| check_pings("VM rping -c -V", &vm_lines, "ping data: ", s.size, &[])),
    }
    .map_err(|e| format!("{e}{}", ctx()))
}

fn tshark(pcap: &Path, extra: &[&str]) -> String {
    let o = Command::new("tshark")
        .arg("-r")
        .arg(pcap)
        .args(["-o", "tcp.try_heuristic_first:TRUE"])
        .args(extra)
        .output()
        .expect("run tshark");
    assert!(
        o.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The RDMAP opcode of every FPDU in the frames `filter` keeps (a frame
/// may carry several).
fn opcodes(pcap: &Path, filter: &str) -> Vec<String> {
    tshark(
        pcap,
        &["-Y", filter, "-T", "fields", "-e", "iwarp_rdma.opcode"],
    )
    .lines()
    .flat_map(|l| l.split(','))
    .map(|x| x.trim().to_string())
    .filter(|x| !x.is_empty())
    .collect()
}

/// The capture: per scenario, the MPA Request and Reply with the CRC flag
/// expected, every CRC good when on; no malformed frame anywhere.
fn check_pcap(pcap: &Path) -> Result<String, String> {
    if !pcap.exists() {
        return Err(format!(
            "no capture at {} (the VM wrote no output: see its console.log and host.log)",
            pcap.display()
        ));
    }
    let mut report = String::new();
    let bad = tshark(
        pcap,
        &["-Y", "_ws.malformed || _ws.expert.severity == error"],
    );
    if !bad.trim().is_empty() {
        return Err(format!("malformed or error frames:\n{bad}"));
    }
    for s in SCENARIOS {
        let port = format!("tcp.port == {}", s.port);
        let mpa = tshark(
            pcap,
            &[
                "-Y",
                &format!("{port} && (iwarp_mpa.req || iwarp_mpa.rep)"),
                "-T",
                "fields",
                "-e",
                "iwarp_mpa.crc_flag",
            ],
        );
        let flags: Vec<&str> = mpa.lines().collect();
        let on = |f: &&str| f.starts_with('1') || f.starts_with("True");
        let crc_used = flags.iter().any(on);
        if flags.len() != 2 {
            return Err(format!(
                "{}: {} MPA frames decoded, want 2",
                s.name,
                flags.len()
            ));
        }
        // The Reply's C decides: the rdapl side asks for CRC or, as the
        // responder, answers with it.
        if on(&flags[1]) != s.crc || crc_used != s.crc {
            return Err(format!(
                "{}: MPA CRC flags {flags:?}, want CRC {}",
                s.name, s.crc
            ));
        }
        let fpdus = opcodes(pcap, &format!("{port} && iwarp_ddp_rdmap")).len();
        let verbose = tshark(pcap, &["-Y", &port, "-V"]);
        let good = verbose.matches("Good CRC32").count();
        // Every bad CRC must be siw's, on a Read Response: siw answers
        // rdapl's zero-length read fences with stale bytes sent zero-copy
        // from a buffer rping may be writing (rdapl-iwarp's siw_quirks.rs),
        // and rdapl drops them unread. rdapl's own frames are all good.
        let mut siw_bad = 0;
        for frame in verbose
            .split("\nFrame ")
            .filter(|f| f.contains("Bad CRC32"))
        {
            let from_siw = frame.contains("Src: 10.0.2.15,");
            let response = frame.contains("OpCode: Read Response");
            if !(from_siw && response) {
                return Err(format!(
                    "{}: tshark found a bad CRC not in siw's Read Response:\n{frame}",
                    s.name
                ));
            }
            siw_bad += frame.matches("Bad CRC32").count();
        }
        // Per ping at least: 2 Sends and 2 go aheads, a Read Request and its
        // Response, a Write.
        let min = match s.tool {
            Tool::Rping => 7 * COUNT as usize,
            // A Send each way (and the RTR).
            Tool::RdmaCm => 3,
        };
        if fpdus < min {
            return Err(format!("{}: only {fpdus} FPDUs decoded", s.name));
        }
        if s.crc && good + siw_bad != fpdus {
            return Err(format!(
                "{}: {good} good CRCs (and {siw_bad} bad of siw's) for {fpdus} FPDUs",
                s.name
            ));
        }
        let mut heartbeats = String::new();
        if !s.interval.is_empty() {
            // Read Requests from the host (the VM's own reads of rping's
            // buffers come from 10.0.2.15).
            let n = opcodes(
                pcap,
                &format!("{port} && ip.src != 10.0.2.15 && iwarp_rdma.opcode == 1"),
            )
            .iter()
            .filter(|op| *op == "1" || *op == "0x01")
            .count();
            // One an idle pause at least, most of them.
            if n < COUNT as usize / 2 {
                return Err(format!(
                    "{}: {n} heartbeats (zero-length reads) from the host over {} idle pauses",
                    s.name,
                    COUNT - 1
                ));
            }
            heartbeats = format!(", {n} heartbeats");
        }
        report += &format!(
            "{}: MPA CRC flags {flags:?}, {fpdus} FPDUs decoded, {good} good CRCs, \
             {siw_bad} bad in siw's answers to zero-length reads{heartbeats}\n",
            s.name
        );
    }
    Ok(report)
}

#[test]
fn rdapl_and_kernel_siw_rping_each_other() {
    let data = lab_data();
    let lab = lab_dir();
    for f in ["disk.raw", "boot/vmlinuz", "boot/initrd.img"] {
        if !data.join(f).exists() {
            return skip_or_fail(&format!(
                "the lab VM is not built ({} missing; run lab/vm/build.sh)",
                data.join(f).display()
            ));
        }
    }
    if !have("qemu-system-x86_64", "--version") || !have("socat", "-V") {
        return skip_or_fail("qemu-system-x86_64 or socat is not installed");
    }
    let with_tshark = have("tshark", "-v");
    if !with_tshark {
        skip_or_fail("tshark is not installed: the capture is not checked");
    }
    let run = data.join(format!("runs/test-siw-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&run);
    // (A lab another user built: its folder is not ours to write.)
    if let Err(e) = std::fs::create_dir_all(&run) {
        return skip_or_fail(&format!(
            "the lab's run folder {} cannot be made ({e}); set LAB_DATA to a lab of yours",
            run.display()
        ));
    }
    let out = run.join("out");
    // The VM's script: the scenarios in order.
    let mut script = String::from(". \"$LAB/tests/interop.sh\"\ninterop_init\n");
    for s in SCENARIOS {
        script += &s.vm_call();
        script.push('\n');
    }
    script += "interop_end\n";
    let script_path = run.join("scenarios.sh");
    std::fs::write(&script_path, script).unwrap();
    let fwd: Vec<String> = SCENARIOS
        .iter()
        .filter(|s| s.dir == Dir::HostToVm)
        .map(|s| s.port.to_string())
        .collect();
    let guestfwd: Vec<String> = SCENARIOS
        .iter()
        .filter(|s| s.dir == Dir::VmToHost)
        .map(|s| s.port.to_string())
        .collect();
    let t0 = Instant::now();
    let vm = Logged::spawn(
        Command::new(lab.join("run.sh"))
            .arg("-t")
            .arg(RUN_LIMIT_S.to_string())
            .arg(&script_path)
            .args(&fwd)
            .env("LAB_DATA", &data)
            .env("LAB_RUN", &run)
            .env("GUESTFWD", guestfwd.join(" ")),
    );
    let mut hosts = Vec::new();
    for (i, s) in SCENARIOS.iter().enumerate() {
        let ts = Instant::now();
        hosts.push(host_side(s, &run, &out, i == 0));
        println!(
            "{}: host side done after {:.1} s (at {:.1} s)",
            s.name,
            ts.elapsed().as_secs_f64(),
            t0.elapsed().as_secs_f64()
        );
    }
    let (vm_code, vm_lines) = vm.finish(Duration::from_secs(RUN_LIMIT_S + 30));
    println!(
        "VM run finished after {:.1} s (rc {vm_code:?}):\n{}",
        t0.elapsed().as_secs_f64(),
        vm_lines.join("\n")
    );
    if let Ok(log) = std::fs::read_to_string(out.join("run.log")) {
        let log: Vec<String> = log.lines().map(|l| l.chars().take(200).collect()).collect();
        println!("--- the VM's run.log:\n{}", log.join("\n"));
    }
    let mut failures = Vec::new();
    for (s, h) in SCENARIOS.iter().zip(&hosts) {
        match check_scenario(s, h, &out) {
            Ok(()) => println!("PASS {}", s.name),
            Err(e) => {
                println!("FAIL {}: {e}", s.name);
                failures.push(s.name);
            }
        }
    }
    if with_tshark {
        match check_pcap(&out.join("interop.pcap")) {
            Ok(r) => println!("PASS capture:\n{r}"),
            Err(e) => {
                println!("FAIL capture: {e}");
                failures.push("capture");
            }
        }
    }
    if failures.is_empty() && std::env::var("RDAPL_SIW_KEEP").as_deref() != Ok("1") {
        let _ = std::fs::remove_dir_all(&run);
    } else {
        println!("run folder kept: {}", run.display());
    }
    assert!(failures.is_empty(), "failed: {failures:?}");
}
