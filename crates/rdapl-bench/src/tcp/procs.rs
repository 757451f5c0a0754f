//! The processes of part 5: finding the programs (rdapl's CLI, the
//! peers), spawning a server and a client in process groups of their own,
//! reading their output without ever blocking them, and reaping or
//! killing them within the run's bound.

use super::*;

pub(super) fn required() -> bool {
    std::env::var("RDAPL_REQUIRE_EXTERNAL").as_deref() == Ok("1")
}

/// An executable named `name` on `PATH` (or the path in `env`, if set).
pub(super) fn find_tool(name: &str, env: &str) -> Option<PathBuf> {
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
pub(super) fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(4)..].join(" | ")
}

/// A child process in its own process group, its output read by two
/// threads (so a full pipe never blocks it), killed with its group if it
/// is dropped unreaped.
pub(super) struct Proc {
    pub(super) name: String,
    pub(super) child: Child,
    pub(super) reaped: bool,
    /// CPU seconds of its main thread, read when it exited (before it was
    /// reaped).
    pub(super) main_cpu_s: Option<f64>,
    pub(super) out: Option<JoinHandle<String>>,
    pub(super) err: Option<JoinHandle<String>>,
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
pub(super) fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("finding a free port: {e}"))
}

/// True if some socket listens on TCP `port` (IPv4 or IPv6), from
/// `/proc/net/tcp*`: nothing connects to the server to find out.
pub(super) fn listening(port: u16) -> bool {
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
pub(super) struct PairOut {
    pub(super) client: String,
    pub(super) server: String,
    pub(super) wall_s: f64,
    /// The client's main thread's CPU time ÷ its wall time.
    pub(super) client_cpu_share: Option<f64>,
}

/// `program` with `args`. The user's `RDAPL_TCP_PARAMS` is dropped: a
/// row's settings are its `--params` alone, as its label says.
fn command(program: &Path, args: &[String]) -> Command {
    let mut c = Command::new(program);
    c.args(args).env_remove(rdapl_tcp::PARAMS_ENV);
    c
}

/// Runs a server, waits until it listens on `port`, runs the client, and
/// waits for both (a `persistent` server, which never exits by itself, is
/// killed once the client is done). Every step bounded by `timeout`.
pub(super) fn run_pair(
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
