//! Small pieces every benchmark shares: a spin-then-yield backoff, a
//! cache-line padded cell, a watchdog that unblocks a stuck run, the event
//! payloads sent through every queue, the date/machine facts printed
//! with the results, and the size labels of the report.
//!
//! Nothing here measures anything; it only keeps the benchmark modules free
//! of boilerplate and makes sure every queue under test is driven the same
//! way (same payload, same backoff, same stop protocol).

use rdapl::event::EpHandle;
use rdapl::{DtoCompletion, DtoOp, DtoStatus, Event};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Spin with a growing number of `spin_loop` hints, keep spinning until
/// [`YIELD_AFTER`] has passed without progress, then fall back to
/// `yield_now`. Used identically by the EVD and by every peer when a queue
/// is full (producer) or empty (consumer), so the backoff policy cannot
/// favour one side.
///
/// Why the time bound: `yield_now` on a core shared with a thread that
/// never yields (another process's compiler, a test) hands that thread a
/// whole time slice (milliseconds; the kernel's EEVDF scheduler pushes the
/// yielder's deadline out by one slice). A side that yielded as soon as it
/// caught up with its peer (the old policy: after 127 hints, well under a
/// microsecond) then moved at most one queue's worth of events per slice
/// of the other process, about 1% of its rate, and which side caught up
/// depended on the queue under test. The peer on another core normally
/// makes progress within microseconds; only a peer that is not running
/// (descheduled, or waiting for a core this thread holds) makes the wait
/// last, and then yielding is what lets it run.
#[derive(Debug, Default)]
pub struct Backoff {
    step: u32,
    since: Option<Instant>,
}

const SPIN_LIMIT: u32 = 6;

/// How long a [`Backoff`] spins without progress before it yields.
pub const YIELD_AFTER: Duration = Duration::from_micros(50);

impl Backoff {
    /// A fresh backoff.
    pub fn new() -> Backoff {
        Backoff {
            step: 0,
            since: None,
        }
    }

    /// Forget past failures (call after progress).
    pub fn reset(&mut self) {
        self.step = 0;
    }

    /// Wait a little: 1, 2, 4 ... 64 spin hints, then 64 hints per call
    /// until [`YIELD_AFTER`] has passed since the 64-hint calls began, then
    /// a `yield_now` per call.
    pub fn snooze(&mut self) {
        if self.step <= SPIN_LIMIT {
            for _ in 0..(1u32 << self.step) {
                std::hint::spin_loop();
            }
            self.step += 1;
            if self.step > SPIN_LIMIT {
                self.since = Some(Instant::now());
            }
        } else if self.since.is_some_and(|t| t.elapsed() < YIELD_AFTER) {
            for _ in 0..(1u32 << SPIN_LIMIT) {
                std::hint::spin_loop();
            }
        } else {
            std::thread::yield_now();
        }
    }
}

/// Polls until `poll` yields a value: [`SPIN_POLLS`] polls with a spin
/// hint between them, then a `yield_now` between polls (so that on a
/// machine with fewer free cores than spinning threads the other side still
/// gets to run); checks `deadline` every 1024 polls. `None` if `poll`
/// failed (`Err`) or the deadline passed.
///
/// Every busy-polling side of the ping-pong benchmarks (EVD `dequeue`,
/// crossbeam `try_recv`, the loopback provider's completions) waits this
/// way, so the policy cannot favour one of them.
pub fn spin_poll<T>(
    deadline: Instant,
    mut poll: impl FnMut() -> Result<Option<T>, ()>,
) -> Option<T> {
    let mut polls = 0u32;
    loop {
        match poll() {
            Ok(Some(v)) => return Some(v),
            Ok(None) => {}
            Err(()) => return None,
        }
        polls = polls.wrapping_add(1);
        if polls < SPIN_POLLS {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
        if polls.is_multiple_of(1024) && Instant::now() > deadline {
            return None;
        }
    }
}

/// Polls spent spinning before a busy-polling side starts yielding.
pub const SPIN_POLLS: u32 = 2048;

/// A value alone on its cache line (two lines, for adjacent-line prefetch),
/// so a counter the harness reads does not share a line with queue state.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct Padded<T>(pub T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Runs `on_fire` on a helper thread if it is not disarmed within `limit`.
///
/// Blocking benchmarks (`wait(None, 1)`, `recv()`) cannot check a deadline
/// themselves; the watchdog posts a stop marker instead, so a lost wakeup
/// turns into a reported failure rather than a hang.
#[derive(Debug)]
pub struct Watchdog {
    tx: Option<mpsc::Sender<()>>,
    handle: Option<JoinHandle<bool>>,
}

impl Watchdog {
    /// Arms the watchdog.
    pub fn arm(limit: Duration, on_fire: impl FnOnce() + Send + 'static) -> Watchdog {
        let (tx, rx) = mpsc::channel::<()>();
        let handle = std::thread::Builder::new()
            .name("bench-watchdog".into())
            .spawn(move || match rx.recv_timeout(limit) {
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    on_fire();
                    true
                }
                _ => false,
            })
            .expect("spawning the watchdog thread");
        Watchdog {
            tx: Some(tx),
            handle: Some(handle),
        }
    }

    /// Disarms the watchdog; returns true if it had already fired.
    pub fn disarm(mut self) -> bool {
        self.tx.take();
        self.handle
            .take()
            .map(|h| h.join().unwrap_or(true))
            .unwrap_or(false)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// The small event every throughput benchmark sends: a DTO completion, the
/// event an EVD carries most. Peers carry the very same `Event` value, so
/// every queue moves the same number of bytes per event.
pub fn dto_event(cookie: u64) -> Event {
    Event::Dto(DtoCompletion {
        ep: EpHandle(1),
        consumer_context: 0,
        cookie,
        status: DtoStatus::Success,
        transferred_length: 64,
        operation: DtoOp::Send,
        rmr_context: 0,
        buf: None,
    })
}

/// Nanoseconds since `epoch` (saturating at `u64::MAX`).
pub fn nanos_since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// A `Duration` in nanoseconds as `u64` (saturating).
pub fn as_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Facts about the machine and the moment, printed and stored with the
/// results.
#[derive(Clone, Debug)]
pub struct Machine {
    /// `std::thread::available_parallelism()`.
    pub cores: usize,
    /// The CPU model from `/proc/cpuinfo`, if readable.
    pub cpu_model: Option<String>,
    /// UTC date and time, `YYYY-MM-DD HH:MM:SS UTC`.
    pub date_utc: String,
    /// Seconds since the Unix epoch.
    pub unix_time: u64,
    /// The commit of the rdapl sources measured, with `+dirty` if
    /// `crates/rdapl` has uncommitted changes (`None` if git is unavailable).
    pub rdapl_commit: Option<String>,
}

impl Machine {
    /// Reads the facts now.
    pub fn probe() -> Machine {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| cpu_description(&s));
        let unix_time = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Machine {
            cores,
            cpu_model,
            date_utc: format_utc(unix_time),
            unix_time,
            rdapl_commit: rdapl_commit(),
        }
    }
}

/// Features of the CPU that change a measured path: the CRC32 instruction
/// and carry-less multiplies (the MPA CRC's two ways), wide vectors, and
/// fast string moves (`memcpy`).
const CPU_FLAGS: [&str; 7] = [
    "sse4_2",
    "pclmulqdq",
    "vpclmulqdq",
    "avx2",
    "avx512f",
    "erms",
    "fsrm",
];

/// The first CPU of `/proc/cpuinfo` text: its model name, then its family,
/// model and stepping and which of `CPU_FLAGS` it has (a virtual
/// machine's model name is often generic, "Intel Xeon Processor", while
/// the family and model tell two generations apart). `None` without a
/// model name.
pub fn cpu_description(cpuinfo: &str) -> Option<String> {
    let first = cpuinfo.split("\n\n").next().unwrap_or("");
    let field = |name: &str| {
        first.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == name).then(|| v.trim())
        })
    };
    let mut out = field("model name")?.to_string();
    if let (Some(f), Some(m)) = (field("cpu family"), field("model")) {
        out.push_str(&format!("; family {f} model {m}"));
        if let Some(st) = field("stepping") {
            out.push_str(&format!(" stepping {st}"));
        }
    }
    if let Some(flags) = field("flags") {
        let have: Vec<&str> = CPU_FLAGS
            .iter()
            .copied()
            .filter(|f| flags.split_whitespace().any(|x| x == *f))
            .collect();
        if have.is_empty() {
            out.push_str(&format!("; none of {}", CPU_FLAGS.join(" ")));
        } else {
            out.push_str(&format!("; {}", have.join(" ")));
        }
    }
    Some(out)
}

/// `git rev-parse --short HEAD` of the workspace this crate was built from,
/// plus `+dirty` when `crates/rdapl` differs from it. Best effort.
fn rdapl_commit() -> Option<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let head = git(&["rev-parse", "--short", "HEAD"])?;
    let dirty = git(&["status", "--porcelain", "--", "../rdapl"]).is_some_and(|s| !s.is_empty());
    Some(if dirty { format!("{head}+dirty") } else { head })
}

/// Formats Unix seconds as `YYYY-MM-DD HH:MM:SS UTC` (proleptic Gregorian;
/// Howard Hinnant's `civil_from_days`).
pub fn format_utc(unix: u64) -> String {
    let days = (unix / 86_400) as i64;
    let secs = unix % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        secs / 3600,
        (secs / 60) % 60,
        secs % 60
    )
}

/// `4KiB`, `64KiB`, `1MiB`, `16MiB`, or bytes (`100B`).
pub fn size_label(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{}MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{}KiB", n >> 10)
    } else {
        format!("{n}B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_is_described_by_name_model_and_flags() {
        let info = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n\
                    model\t\t: 167\nmodel name\t: Intel(R) Xeon(R) Processor\n\
                    stepping\t: 1\nflags\t\t: fpu sse4_2 avx2 avx512f vpclmulqdq fsrm\n\n\
                    processor\t: 1\nmodel name\t: other\n";
        assert_eq!(
            cpu_description(info).as_deref(),
            Some(
                "Intel(R) Xeon(R) Processor; family 6 model 167 stepping 1; \
                 sse4_2 vpclmulqdq avx2 avx512f fsrm"
            )
        );
        let bare = "model name\t: Some CPU\nflags\t: fpu\n";
        assert_eq!(
            cpu_description(bare).as_deref(),
            Some("Some CPU; none of sse4_2 pclmulqdq vpclmulqdq avx2 avx512f erms fsrm")
        );
        assert_eq!(cpu_description("processor\t: 0\n"), None);
    }

    #[test]
    fn utc_dates() {
        assert_eq!(format_utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(format_utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(format_utc(1_700_000_000), "2023-11-14 22:13:20 UTC");
    }

    #[test]
    fn watchdog_fires_and_disarms() {
        let (tx, rx) = mpsc::channel();
        let w = Watchdog::arm(Duration::from_millis(1), move || tx.send(()).unwrap());
        rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(w.disarm());
        let w = Watchdog::arm(Duration::from_secs(60), || panic!("must not fire"));
        assert!(!w.disarm());
    }
}
