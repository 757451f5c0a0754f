//! `rdapl demo`: a server and a client on the loopback provider, in one
//! process, exercising the whole object model end to end.
//!
//! NOTE for the lead: `src/lib.rs` must declare this module
//! (`pub mod demo;`). Until it does, `tests/demo.rs` compiles this file
//! directly with `#[path = "../src/demo.rs"] mod demo;`.
//!
//! # What runs
//!
//! Two interface adapters are opened on the loopback provider, the server at
//! [`SERVER_ADDR`] and the client at [`CLIENT_ADDR`].
//!
//! 1. **Connection.** The server listens on a public service point; the
//!    client connects with private data. The server consumes its CR EVD by
//!    blocking `wait`, checks the request's private data and remote address,
//!    and accepts with private data of its own: a greeting followed by the
//!    RMR triplet of a buffer the client may RDMA-write and read. The client
//!    checks that private data (text, length, triplet) and takes the remote
//!    buffer from it, as a real DAT application would.
//! 2. **Messages.** The server pre-posts `messages` receives (before it even
//!    accepts); the client sends `messages` patterned messages. The server
//!    consumes its receive completions through a `SingleInstance` **upcall**
//!    that checks every event (status, operation, length, endpoint, cookie
//!    order, the received bytes, that no two upcalls overlap and that none
//!    runs on the posting thread). The client consumes its send completions
//!    through an [`rdapl::Poller`] and checks them the same way.
//! 3. **RDMA.** The poller entry is removed (the client's request EVD goes
//!    back to plain polling), the client RDMA-writes a patterned buffer into
//!    the server's LMR (registered with remote write and read rights), then
//!    RDMA-reads it back into a freshly registered, zero-filled client LMR.
//!    Both completions are consumed by blocking `wait`; every byte is checked
//!    in both directions.
//! 4. **Disconnect.** The client disconnects gracefully; both sides must see
//!    `Disconnected` (by `wait`) and end in the `Disconnected` state.
//! 5. **Audit and teardown.** Every EVD, the async EVDs included, must be
//!    empty (a stray event is an error); everything is freed and both IAs are
//!    closed gracefully, and a refusal there is an error too.
//!
//! A failed call or an expired wait ends the run with `Err` (after tearing
//! down what was created); a wrong event or a wrong byte is recorded in
//! [`DemoSummary::errors`] and the run goes on. Every wait is bounded by
//! [`WAIT_TIMEOUT`]; a normal run takes milliseconds.

use rdapl::event::EpHandle;
use rdapl::{
    CloseFlags, CompletionFlags, ConnectionEventKind, DtoCompletion, DtoOp, DtoStatus, Ep, EpAttr,
    EpState, Evd, EvdFlags, Event, Ia, IaAttr, IaOpen, IaOptions, Lmr, MemPriv, Poller,
    PollerConfig, Psp, Pz, ReEnable, Region, RmrTriplet, Upcall, UpcallPolicy,
};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

/// The server IA's address.
pub const SERVER_ADDR: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
/// The client IA's address.
pub const CLIENT_ADDR: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
/// The first connection qualifier tried; if it is taken in this process,
/// the next ones are tried (up to [`CONN_QUAL_TRIES`]).
pub const BASE_CONN_QUAL: u64 = 4791;
/// How many connection qualifiers are tried before giving up.
pub const CONN_QUAL_TRIES: u64 = 64;
/// Messages sent when [`DemoOptions::messages`] is `None`.
pub const DEFAULT_MESSAGES: usize = 64;
/// Message size when [`DemoOptions::message_size`] is `None`.
pub const DEFAULT_MESSAGE_SIZE: usize = 256;
/// RDMA transfer size when [`DemoOptions::rdma_size`] is `None` (1 MiB).
pub const DEFAULT_RDMA_SIZE: usize = 1 << 20;
/// Largest message accepted (1 MiB).
pub const MAX_MESSAGE_SIZE: usize = 1 << 20;
/// Largest total of message bytes (`messages * message_size`, 64 MiB).
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;
/// Largest RDMA transfer accepted (256 MiB; the demo holds three copies).
pub const MAX_RDMA_SIZE: usize = 256 << 20;
/// The bound of every wait (a normal run never comes near it).
pub const WAIT_TIMEOUT: Duration = Duration::from_secs(5);
/// Private data the client connects with (followed by its address).
pub const CLIENT_GREETING: &str = "rdapl-demo: hello from ";
/// Private data the server accepts with, followed by the RMR triplet of the
/// RDMA buffer (`rmr_context` u32, `target_address` u64, `segment_length`
/// u64, little endian).
pub const SERVER_GREETING: &str = "rdapl-demo: welcome; RDMA buffer follows";
/// Cookie of the RDMA write.
const RDMA_WRITE_COOKIE: u64 = 0x0057_5249_5445; // "WRITE"
/// Cookie of the RDMA read.
const RDMA_READ_COOKIE: u64 = 0x5245_4144; // "READ"
/// Most error messages kept per run (more are counted, not kept).
const MAX_ERRORS_KEPT: usize = 32;
/// Seed of the RDMA buffer's pattern.
const RDMA_SEED: u64 = 0xDA7_2000_D0E0;

/// Knobs of [`run`]. `None` means the default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DemoOptions {
    /// Messages sent from client to server (default [`DEFAULT_MESSAGES`]).
    pub messages: Option<usize>,
    /// Bytes per message (default [`DEFAULT_MESSAGE_SIZE`]).
    pub message_size: Option<usize>,
    /// Bytes of the RDMA write and read (default [`DEFAULT_RDMA_SIZE`]).
    pub rdma_size: Option<usize>,
    /// No progress lines on stderr.
    pub quiet: bool,
}

impl DemoOptions {
    /// Messages to send.
    pub fn messages(&self) -> usize {
        self.messages.unwrap_or(DEFAULT_MESSAGES)
    }

    /// Bytes per message.
    pub fn message_size(&self) -> usize {
        self.message_size.unwrap_or(DEFAULT_MESSAGE_SIZE)
    }

    /// Bytes of the RDMA transfers.
    pub fn rdma_size(&self) -> usize {
        self.rdma_size.unwrap_or(DEFAULT_RDMA_SIZE)
    }

    /// Checks the knobs against the demo's own bounds (the IA's limits are
    /// checked once it is open).
    pub fn validate(&self) -> Result<(), String> {
        let (n, size, rdma) = (self.messages(), self.message_size(), self.rdma_size());
        if n == 0 {
            return Err("--messages must be at least 1".into());
        }
        if size == 0 || size > MAX_MESSAGE_SIZE {
            return Err(format!(
                "--message-size must be between 1 and {MAX_MESSAGE_SIZE} bytes"
            ));
        }
        if n.checked_mul(size).is_none_or(|t| t > MAX_MESSAGE_BYTES) {
            return Err(format!(
                "messages x message size must be at most {MAX_MESSAGE_BYTES} bytes"
            ));
        }
        if rdma == 0 || rdma > MAX_RDMA_SIZE {
            return Err(format!(
                "--rdma-size must be between 1 and {MAX_RDMA_SIZE} bytes"
            ));
        }
        Ok(())
    }

    fn check_ia_limits(&self, attr: &IaAttr) -> Result<(), String> {
        let (n, size, rdma) = (self.messages(), self.message_size(), self.rdma_size());
        let limits = [
            (
                "messages",
                n as u64,
                attr.max_dto_per_ep as u64,
                "max_dto_per_ep",
            ),
            // Queue length of the client's request EVD: the sends plus RDMA.
            (
                "messages + 4",
                n as u64 + 4,
                attr.max_evd_qlen as u64,
                "max_evd_qlen",
            ),
            (
                "message size",
                size as u64,
                attr.max_message_size,
                "max_message_size",
            ),
            (
                "RDMA size",
                rdma as u64,
                attr.max_rdma_size,
                "max_rdma_size",
            ),
            (
                "RDMA size",
                rdma as u64,
                attr.max_lmr_block_size,
                "max_lmr_block_size",
            ),
        ];
        for (what, v, max, name) in limits {
            if v > max {
                return Err(format!("{what} ({v}) is above the IA's {name} ({max})"));
            }
        }
        Ok(())
    }
}

/// What a demo run did and saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DemoSummary {
    /// The server IA's address.
    pub server_address: IpAddr,
    /// The client IA's address.
    pub client_address: IpAddr,
    /// The connection qualifier the server listened on.
    pub conn_qual: u64,
    /// True once both sides saw `Established`.
    pub established: bool,
    /// Private data of the connection request, as the server received it.
    pub client_private_data: Vec<u8>,
    /// Private data of the accept, as the client received it.
    pub server_private_data: Vec<u8>,
    /// The remote buffer the client took from the accept's private data.
    pub remote_buffer: Option<RmrTriplet>,
    /// Bytes per message.
    pub message_size: usize,
    /// Sends that completed successfully (seen by the poller).
    pub messages_sent: u64,
    /// Receives that completed successfully (seen by the upcall).
    pub messages_received: u64,
    /// Received message bytes found equal to what was sent.
    pub message_bytes_verified: u64,
    /// Time from the first send posted to the last completion consumed.
    pub message_time: Duration,
    /// Bytes the RDMA write completion reported.
    pub rdma_write_bytes: u64,
    /// Bytes of the server's buffer found equal to what was written.
    pub rdma_write_verified: u64,
    /// Time from posting the RDMA write to consuming its completion.
    pub rdma_write_time: Duration,
    /// Bytes the RDMA read completion reported.
    pub rdma_read_bytes: u64,
    /// Bytes read back found equal to what was written.
    pub rdma_read_verified: u64,
    /// Time from posting the RDMA read to consuming its completion.
    pub rdma_read_time: Duration,
    /// Events consumed by the server's receive upcall.
    pub consumed_by_upcall: u64,
    /// Events consumed by the client's poller.
    pub consumed_by_poller: u64,
    /// Events consumed by blocking `wait`.
    pub consumed_by_wait: u64,
    /// What the `wait`s consumed, in order.
    pub waited: Vec<String>,
    /// The client saw `Disconnected`.
    pub client_disconnected: bool,
    /// The server saw `Disconnected`.
    pub server_disconnected: bool,
    /// Wall-clock time of the whole run, setup and teardown included.
    pub elapsed: Duration,
    /// Everything that went wrong (empty on success).
    pub errors: Vec<String>,
    /// Errors beyond the ones kept in `errors`.
    pub errors_dropped: u64,
}

impl DemoSummary {
    fn new(conn_qual: u64, message_size: usize) -> DemoSummary {
        DemoSummary {
            server_address: SERVER_ADDR,
            client_address: CLIENT_ADDR,
            conn_qual,
            established: false,
            client_private_data: Vec::new(),
            server_private_data: Vec::new(),
            remote_buffer: None,
            message_size,
            messages_sent: 0,
            messages_received: 0,
            message_bytes_verified: 0,
            message_time: Duration::ZERO,
            rdma_write_bytes: 0,
            rdma_write_verified: 0,
            rdma_write_time: Duration::ZERO,
            rdma_read_bytes: 0,
            rdma_read_verified: 0,
            rdma_read_time: Duration::ZERO,
            consumed_by_upcall: 0,
            consumed_by_poller: 0,
            consumed_by_wait: 0,
            waited: Vec::new(),
            client_disconnected: false,
            server_disconnected: false,
            elapsed: Duration::ZERO,
            errors: Vec::new(),
            errors_dropped: 0,
        }
    }

    /// True if the run saw no error.
    pub fn ok(&self) -> bool {
        self.errors.is_empty() && self.errors_dropped == 0
    }

    /// Number of errors seen.
    pub fn error_count(&self) -> u64 {
        self.errors.len() as u64 + self.errors_dropped
    }

    /// All bytes verified: messages, RDMA write and RDMA read.
    pub fn bytes_verified(&self) -> u64 {
        self.message_bytes_verified + self.rdma_write_verified + self.rdma_read_verified
    }

    /// RDMA write throughput in MB/s (10^6 bytes; context only: one
    /// in-process copy, no wire).
    pub fn rdma_write_mbps(&self) -> f64 {
        mbps(self.rdma_write_bytes, self.rdma_write_time)
    }

    /// RDMA read throughput in MB/s (context only).
    pub fn rdma_read_mbps(&self) -> f64 {
        mbps(self.rdma_read_bytes, self.rdma_read_time)
    }

    fn error(&mut self, e: impl Into<String>) {
        if self.errors.len() < MAX_ERRORS_KEPT {
            self.errors.push(e.into());
        } else {
            self.errors_dropped += 1;
        }
    }

    fn absorb(&mut self, errors: Vec<String>, dropped: u64) {
        self.errors_dropped += dropped;
        for e in errors {
            self.error(e);
        }
    }
}

fn mbps(bytes: u64, t: Duration) -> f64 {
    bytes as f64 / 1e6 / t.as_secs_f64().max(1e-9)
}

fn ms(t: Duration) -> f64 {
    t.as_secs_f64() * 1e3
}

/// Printable form of private data: the text, then any non-text tail in hex.
fn show_private(data: &[u8]) -> String {
    let text_len = data
        .iter()
        .position(|b| !(b.is_ascii_graphic() || *b == b' '))
        .unwrap_or(data.len());
    let mut s = format!("{:?}", String::from_utf8_lossy(&data[..text_len]));
    if text_len < data.len() {
        s.push_str(&format!(" + {} binary byte(s)", data.len() - text_len));
    }
    s
}

impl fmt::Display for DemoSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "rdapl demo on the loopback provider")?;
        writeln!(
            f,
            "  connection  {} -> {}, qualifier {}: {}",
            self.client_address,
            self.server_address,
            self.conn_qual,
            if self.established {
                "established"
            } else {
                "NOT established"
            }
        )?;
        writeln!(
            f,
            "              client private data {} ({} bytes), checked by the server",
            show_private(&self.client_private_data),
            self.client_private_data.len()
        )?;
        writeln!(
            f,
            "              server private data {} ({} bytes), checked by the client",
            show_private(&self.server_private_data),
            self.server_private_data.len()
        )?;
        if let Some(t) = &self.remote_buffer {
            writeln!(
                f,
                "              remote buffer from the accept: rmr_context {:#x}, address {:#x}, {} bytes",
                t.rmr_context, t.target_address, t.segment_length
            )?;
        }
        writeln!(
            f,
            "  messages    {} sent, {} received ({} bytes each), {} bytes verified, {:.2} ms",
            self.messages_sent,
            self.messages_received,
            self.message_size,
            self.message_bytes_verified,
            ms(self.message_time)
        )?;
        writeln!(
            f,
            "  rdma write  {} bytes into the server LMR, {} bytes verified, {:.2} ms, {:.0} MB/s",
            self.rdma_write_bytes,
            self.rdma_write_verified,
            ms(self.rdma_write_time),
            self.rdma_write_mbps()
        )?;
        writeln!(
            f,
            "  rdma read   {} bytes back into a fresh client LMR, {} bytes verified, {:.2} ms, {:.0} MB/s",
            self.rdma_read_bytes,
            self.rdma_read_verified,
            ms(self.rdma_read_time),
            self.rdma_read_mbps()
        )?;
        writeln!(
            f,
            "              (throughput is context only: one in-process copy, no wire)"
        )?;
        writeln!(
            f,
            "  events      {} consumed by upcall (server receives), {} by poller (client sends), {} by wait",
            self.consumed_by_upcall, self.consumed_by_poller, self.consumed_by_wait
        )?;
        if !self.waited.is_empty() {
            writeln!(f, "              by wait: {}", self.waited.join(", "))?;
        }
        writeln!(
            f,
            "  disconnect  graceful; Disconnected seen by the client: {}, by the server: {}",
            yes_no(self.client_disconnected),
            yes_no(self.server_disconnected)
        )?;
        writeln!(
            f,
            "  total       {} bytes verified in {:.2} ms",
            self.bytes_verified(),
            ms(self.elapsed)
        )?;
        if self.ok() {
            writeln!(f, "  result      0 errors")
        } else {
            writeln!(f, "  result      {} error(s):", self.error_count())?;
            for e in &self.errors {
                writeln!(f, "    - {e}")?;
            }
            if self.errors_dropped > 0 {
                writeln!(f, "    - ... and {} more", self.errors_dropped)?;
            }
            Ok(())
        }
    }
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "NO" }
}

// ----- data patterns ------------------------------------------------------

/// Fills `buf` with a deterministic pseudo-random pattern (splitmix64).
fn fill_pattern(seed: u64, buf: &mut [u8]) {
    let mut x = seed;
    for chunk in buf.chunks_mut(8) {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
    }
}

/// Message `i`: its own pattern, so a message landing in the wrong slot or
/// arriving twice is caught.
fn message(i: u64, size: usize) -> Vec<u8> {
    let mut m = vec![0; size];
    fill_pattern(0x6D73_6700_0000_0000 ^ i, &mut m);
    m
}

fn first_mismatch(a: &[u8], b: &[u8]) -> Option<usize> {
    if a.len() != b.len() {
        return Some(a.len().min(b.len()));
    }
    a.iter().zip(b).position(|(x, y)| x != y)
}

fn encode_accept(t: &RmrTriplet) -> Vec<u8> {
    let mut v = SERVER_GREETING.as_bytes().to_vec();
    v.extend_from_slice(&t.rmr_context.to_le_bytes());
    v.extend_from_slice(&t.target_address.to_le_bytes());
    v.extend_from_slice(&t.segment_length.to_le_bytes());
    v
}

fn decode_accept(data: &[u8]) -> Option<RmrTriplet> {
    let rest = data.strip_prefix(SERVER_GREETING.as_bytes())?;
    if rest.len() != 20 {
        return None;
    }
    Some(RmrTriplet {
        rmr_context: u32::from_le_bytes(rest[0..4].try_into().ok()?),
        target_address: u64::from_le_bytes(rest[4..12].try_into().ok()?),
        segment_length: u64::from_le_bytes(rest[12..20].try_into().ok()?),
    })
}

// ----- small helpers ------------------------------------------------------

trait Ctx<T> {
    fn ctx(self, what: &str) -> Result<T, String>;
}

impl<T> Ctx<T> for rdapl::Result<T> {
    fn ctx(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Log {
    quiet: bool,
    start: Instant,
}

impl Log {
    fn step(&self, what: fmt::Arguments<'_>) {
        if !self.quiet {
            eprintln!(
                "demo [{:8.3} ms] {what}",
                self.start.elapsed().as_secs_f64() * 1e3
            );
        }
    }
}

/// Errors gathered in a consumer context (upcall, poller thread).
#[derive(Default)]
struct Errors {
    kept: Vec<String>,
    dropped: u64,
}

impl Errors {
    fn push(&mut self, e: String) {
        if self.kept.len() < MAX_ERRORS_KEPT {
            self.kept.push(e);
        } else {
            self.dropped += 1;
        }
    }
}

/// What a consumer (upcall or poller handler) has seen so far.
#[derive(Default)]
struct Tally {
    /// Events delivered to the consumer.
    events: u64,
    /// Successful, correct completions.
    good: u64,
    /// Bytes verified.
    bytes: u64,
    errors: Errors,
}

/// Checks a DTO completion's fields; returns the problems found.
fn check_dto(d: &DtoCompletion, op: DtoOp, ep: EpHandle, cookie: u64, len: u64) -> Option<String> {
    let mut bad = Vec::new();
    if d.status != DtoStatus::Success {
        bad.push(format!("status {:?}", d.status));
    }
    if d.operation != op {
        bad.push(format!("operation {:?} (expected {op:?})", d.operation));
    }
    if d.ep != ep {
        bad.push(format!("endpoint {:?} (expected {ep:?})", d.ep));
    }
    if d.cookie != cookie {
        bad.push(format!("cookie {} (expected {cookie})", d.cookie));
    }
    if d.status == DtoStatus::Success && d.transferred_length != len {
        bad.push(format!(
            "transferred_length {} (expected {len})",
            d.transferred_length
        ));
    }
    (!bad.is_empty()).then(|| bad.join(", "))
}

// ----- the server's receive upcall ----------------------------------------

/// The server's `SingleInstance` upcall on its receive EVD: checks every
/// receive completion and the bytes it delivered.
struct RecvUpcall {
    ep: EpHandle,
    lmr: Lmr,
    messages: u64,
    size: usize,
    /// The thread that posts the sends (an upcall must never run on it).
    poster: ThreadId,
    /// Set while an upcall runs (two at once breaks `SingleInstance`).
    busy: AtomicBool,
    tally: Mutex<Tally>,
    cv: Condvar,
}

impl Upcall for RecvUpcall {
    fn upcall(&self, _evd: &Evd, event: Option<Event>, _more_events: bool) {
        let overlapped = self.busy.swap(true, Ordering::SeqCst);
        let mut t = lock(&self.tally);
        if overlapped {
            t.errors
                .push("two receive upcalls ran at once under SingleInstance".into());
        }
        if thread::current().id() == self.poster {
            t.errors
                .push("a receive upcall ran on the posting thread".into());
        }
        match event {
            None => t
                .errors
                .push("a notify-only upcall (no event) under SingleInstance".into()),
            Some(Event::Dto(d)) => {
                t.events += 1;
                let i = t.events - 1;
                if let Some(bad) = check_dto(&d, DtoOp::Receive, self.ep, i, self.size as u64) {
                    t.errors.push(format!("receive completion #{i}: {bad}"));
                } else if i >= self.messages {
                    t.errors
                        .push(format!("receive completion #{i}: more than were posted"));
                } else {
                    let mut got = vec![0; self.size];
                    match self.lmr.read_at(i as usize * self.size, &mut got) {
                        Ok(()) => match first_mismatch(&got, &message(i, self.size)) {
                            None => {
                                t.good += 1;
                                t.bytes += self.size as u64;
                            }
                            Some(off) => t.errors.push(format!(
                                "message {i}: received bytes differ from the sent ones at offset {off}"
                            )),
                        },
                        Err(e) => t
                            .errors
                            .push(format!("message {i}: reading the receive buffer: {e}")),
                    }
                }
            }
            Some(other) => {
                t.events += 1;
                t.errors.push(format!(
                    "unexpected event on the server's receive EVD: {other:?}"
                ));
            }
        }
        drop(t);
        self.busy.store(false, Ordering::SeqCst);
        self.cv.notify_all();
    }
}

// ----- the client's poller handler ----------------------------------------

/// The client's send-completion checker, fed by the poller thread.
struct SendCheck {
    ep: EpHandle,
    messages: u64,
    size: usize,
    tally: Mutex<Tally>,
    cv: Condvar,
}

impl SendCheck {
    fn handle(&self, event: Event) {
        let mut t = lock(&self.tally);
        t.events += 1;
        let i = t.events - 1;
        match event {
            Event::Dto(d) => {
                if let Some(bad) = check_dto(&d, DtoOp::Send, self.ep, i, self.size as u64) {
                    t.errors.push(format!("send completion #{i}: {bad}"));
                } else if i >= self.messages {
                    t.errors
                        .push(format!("send completion #{i}: more than were posted"));
                } else {
                    t.good += 1;
                }
            }
            other => t.errors.push(format!(
                "unexpected event on the client's request EVD: {other:?}"
            )),
        }
        drop(t);
        self.cv.notify_all();
    }
}

/// Waits until `tally.events >= n` or `deadline`; true if reached.
fn wait_tally(m: &Mutex<Tally>, cv: &Condvar, n: u64, deadline: Instant) -> bool {
    let mut t = lock(m);
    // Bounded: every pass either returns or sleeps until the deadline.
    loop {
        if t.events >= n {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        t = cv
            .wait_timeout(t, deadline - now)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

// ----- the two sides ------------------------------------------------------

/// An IA closed abruptly when dropped unless it was closed already (so an
/// early error leaves nothing listening or connected).
struct IaGuard(Ia);

impl Drop for IaGuard {
    fn drop(&mut self) {
        let _ = self.0.close(CloseFlags::Abrupt);
    }
}

fn open_ia(addr: IpAddr) -> Result<IaGuard, String> {
    Ia::open_with(
        "loopback",
        IaOptions {
            params: format!("addr={addr}"),
            ..Default::default()
        },
    )
    .map(IaGuard)
    .ctx(&format!("opening a loopback IA at {addr}"))
}

struct Server {
    ia: IaGuard,
    pz: Pz,
    cr_evd: Evd,
    conn_evd: Evd,
    recv_evd: Evd,
    ep: Ep,
    recv_lmr: Lmr,
    rdma_lmr: Lmr,
    psp: Psp,
    conn_qual: u64,
    upcall: Arc<RecvUpcall>,
}

impl Server {
    fn open(opts: &DemoOptions) -> Result<Server, String> {
        let (n, size, rdma) = (opts.messages(), opts.message_size(), opts.rdma_size());
        let ia = open_ia(SERVER_ADDR)?;
        let (attr, _) = ia.0.query().ctx("server: ia_query")?;
        opts.check_ia_limits(&attr)?;
        let pz = ia.0.pz_create().ctx("server: pz_create")?;
        let cr_evd = ia.0.evd_create(4, EvdFlags::CR).ctx("server: CR EVD")?;
        let conn_evd =
            ia.0.evd_create(4, EvdFlags::CONNECTION)
                .ctx("server: connection EVD")?;
        let recv_evd =
            ia.0.evd_create(n, EvdFlags::DTO)
                .ctx("server: receive EVD")?;
        let ep_attr = EpAttr {
            max_recv_dtos: n.max(EpAttr::default().max_recv_dtos),
            max_message_size: size as u64,
            max_rdma_size: rdma as u64,
            ..EpAttr::default()
        };
        let ep =
            ia.0.ep_create(&pz, Some(&recv_evd), None, Some(&conn_evd), Some(ep_attr))
                .ctx("server: ep_create")?;
        let recv_lmr = pz
            .lmr_create(
                Region::zeroed(n * size),
                MemPriv::LOCAL_WRITE | MemPriv::LOCAL_READ,
            )
            .ctx("server: receive LMR")?;
        let rdma_lmr = pz
            .lmr_create(
                Region::zeroed(rdma),
                MemPriv::LOCAL_READ
                    | MemPriv::LOCAL_WRITE
                    | MemPriv::REMOTE_WRITE
                    | MemPriv::REMOTE_READ,
            )
            .ctx("server: RDMA LMR")?;
        let upcall = Arc::new(RecvUpcall {
            ep: ep.handle(),
            lmr: recv_lmr.clone(),
            messages: n as u64,
            size,
            poster: thread::current().id(),
            busy: AtomicBool::new(false),
            tally: Mutex::new(Tally::default()),
            cv: Condvar::new(),
        });
        let up: Arc<dyn Upcall> = upcall.clone();
        recv_evd
            .modify_upcall(UpcallPolicy::SingleInstance, Some(up), ReEnable::Strict)
            .ctx("server: enabling the receive upcall")?;
        let mut psp = None;
        for q in BASE_CONN_QUAL..BASE_CONN_QUAL + CONN_QUAL_TRIES {
            match ia.0.psp_create(q, &cr_evd) {
                Ok(p) => {
                    psp = Some((p, q));
                    break;
                }
                Err(rdapl::Error::ConnQualInUse(_)) => continue,
                Err(e) => return Err(format!("server: psp_create({q}): {e}")),
            }
        }
        let (psp, conn_qual) = psp.ok_or_else(|| {
            format!(
                "server: connection qualifiers {BASE_CONN_QUAL}..{} are all in use",
                BASE_CONN_QUAL + CONN_QUAL_TRIES
            )
        })?;
        Ok(Server {
            ia,
            pz,
            cr_evd,
            conn_evd,
            recv_evd,
            ep,
            recv_lmr,
            rdma_lmr,
            psp,
            conn_qual,
            upcall,
        })
    }
}

struct Client {
    ia: IaGuard,
    pz: Pz,
    conn_evd: Evd,
    req_evd: Evd,
    ep: Ep,
    send_lmr: Lmr,
}

impl Client {
    fn open(opts: &DemoOptions) -> Result<Client, String> {
        let (n, size, rdma) = (opts.messages(), opts.message_size(), opts.rdma_size());
        let ia = open_ia(CLIENT_ADDR)?;
        let (attr, _) = ia.0.query().ctx("client: ia_query")?;
        opts.check_ia_limits(&attr)?;
        let pz = ia.0.pz_create().ctx("client: pz_create")?;
        let conn_evd =
            ia.0.evd_create(4, EvdFlags::CONNECTION)
                .ctx("client: connection EVD")?;
        // The sends, then the RDMA write and read.
        let req_evd =
            ia.0.evd_create(n + 4, EvdFlags::DTO)
                .ctx("client: request EVD")?;
        let ep_attr = EpAttr {
            max_request_dtos: n.max(EpAttr::default().max_request_dtos),
            max_message_size: size as u64,
            max_rdma_size: rdma as u64,
            ..EpAttr::default()
        };
        let ep =
            ia.0.ep_create(&pz, None, Some(&req_evd), Some(&conn_evd), Some(ep_attr))
                .ctx("client: ep_create")?;
        let mut all = Vec::with_capacity(n * size);
        for i in 0..n as u64 {
            all.extend_from_slice(&message(i, size));
        }
        let send_lmr = pz
            .lmr_create_from(all, MemPriv::LOCAL_READ)
            .ctx("client: send LMR")?;
        Ok(Client {
            ia,
            pz,
            conn_evd,
            req_evd,
            ep,
            send_lmr,
        })
    }
}

/// One blocking `wait` (threshold 1, bounded), counted.
fn wait_one(evd: &Evd, what: &str, s: &mut DemoSummary) -> Result<Event, String> {
    let (ev, _left) = evd
        .wait(Some(WAIT_TIMEOUT), 1)
        .ctx(&format!("waiting for {what}"))?;
    s.consumed_by_wait += 1;
    s.waited.push(what.to_string());
    Ok(ev)
}

/// Waits for a connection event of `kind` on `evd` for endpoint `ep`.
/// Returns its private data.
fn wait_connection(
    evd: &Evd,
    ep: EpHandle,
    kind: ConnectionEventKind,
    what: &str,
    s: &mut DemoSummary,
) -> Result<Option<Box<[u8]>>, String> {
    match wait_one(evd, what, s)? {
        Event::Connection(c) if c.kind == kind => {
            if c.ep != ep {
                s.error(format!("{what}: for endpoint {:?}, expected {ep:?}", c.ep));
            }
            Ok(c.private_data)
        }
        other => Err(format!("{what}: got {other:?} instead")),
    }
}

/// Waits for one DTO completion and checks it; returns the bytes it moved.
fn wait_dto(
    evd: &Evd,
    op: DtoOp,
    ep: EpHandle,
    cookie: u64,
    len: u64,
    what: &str,
    s: &mut DemoSummary,
) -> Result<u64, String> {
    match wait_one(evd, what, s)? {
        Event::Dto(d) => {
            if let Some(bad) = check_dto(&d, op, ep, cookie, len) {
                s.error(format!("{what}: {bad}"));
            }
            Ok(if d.status.is_success() {
                d.transferred_length
            } else {
                0
            })
        }
        other => Err(format!("{what}: got {other:?} instead")),
    }
}

// ----- the phases ---------------------------------------------------------

fn connect(sv: &Server, cl: &Client, s: &mut DemoSummary, log: &Log) -> Result<(), String> {
    let client_pd = format!("{CLIENT_GREETING}{CLIENT_ADDR}").into_bytes();
    let remote = sv
        .rdma_lmr
        .rmr_triplet(0, sv.rdma_lmr.region().map_or(0, |r| r.len() as u64))
        .ctx("server: RDMA LMR triplet")?;
    let server_pd = encode_accept(&remote);

    cl.ep
        .connect(SERVER_ADDR, sv.conn_qual, Some(WAIT_TIMEOUT), &client_pd)
        .ctx("client: connect")?;
    log.step(format_args!(
        "client {CLIENT_ADDR} connecting to {SERVER_ADDR} qualifier {}",
        sv.conn_qual
    ));

    // Server: the request, by wait.
    let arrival = match wait_one(&sv.cr_evd, "connection request (server)", s)? {
        Event::ConnectionRequest(a) => a,
        other => {
            return Err(format!(
                "server: expected a connection request, got {other:?}"
            ));
        }
    };
    if arrival.conn_qual != sv.conn_qual || arrival.sp != Some(sv.psp.handle()) {
        s.error(format!(
            "connection request names qualifier {} / {:?}, expected {} / {:?}",
            arrival.conn_qual,
            arrival.sp,
            sv.conn_qual,
            sv.psp.handle()
        ));
    }
    if arrival.truncated {
        s.error("the connection request's private data was truncated");
    }
    let cr = sv.ia.0.cr(arrival.cr).ctx("server: looking the CR up")?;
    s.client_private_data = cr.private_data().to_vec();
    if cr.private_data() != client_pd.as_slice() {
        s.error(format!(
            "server: request private data {} differs from what the client sent ({})",
            show_private(cr.private_data()),
            show_private(&client_pd)
        ));
    }
    if cr.remote_address() != CLIENT_ADDR {
        s.error(format!(
            "server: request comes from {}, expected {CLIENT_ADDR}",
            cr.remote_address()
        ));
    }
    cr.accept(&sv.ep, &server_pd).ctx("server: cr_accept")?;
    log.step(format_args!(
        "server accepted with {} bytes of private data",
        server_pd.len()
    ));

    wait_connection(
        &sv.conn_evd,
        sv.ep.handle(),
        ConnectionEventKind::Established,
        "Established (server)",
        s,
    )?;
    let got = wait_connection(
        &cl.conn_evd,
        cl.ep.handle(),
        ConnectionEventKind::Established,
        "Established (client)",
        s,
    )?
    .unwrap_or_default();
    s.established = true;
    s.server_private_data = got.to_vec();
    if *got != *server_pd {
        s.error(format!(
            "client: accept private data {} differs from what the server sent",
            show_private(&got)
        ));
    }
    match decode_accept(&got) {
        Some(t) if t.segment_length == remote.segment_length => s.remote_buffer = Some(t),
        Some(t) => {
            s.error(format!(
                "client: the remote buffer has {} bytes, expected {}",
                t.segment_length, remote.segment_length
            ));
            s.remote_buffer = Some(t);
        }
        None => s.error("client: the accept's private data does not carry an RMR triplet"),
    }
    let q = cl.ep.query().ctx("client: ep_query")?;
    if q.peer_private_data.as_deref() != Some(&got[..]) {
        s.error("client: ep_query's peer private data differs from the Established event's");
    }
    Ok(())
}

fn messages(
    sv: &Server,
    cl: &Client,
    opts: &DemoOptions,
    s: &mut DemoSummary,
    log: &Log,
) -> Result<(), String> {
    let (n, size) = (opts.messages() as u64, opts.message_size());
    let check = Arc::new(SendCheck {
        ep: cl.ep.handle(),
        messages: n,
        size,
        tally: Mutex::new(Tally::default()),
        cv: Condvar::new(),
    });
    let poller = Poller::new(PollerConfig::default()).ctx("client: starting the poller")?;
    let handler = check.clone();
    let entry = poller
        .add(&cl.req_evd, move |ev| handler.handle(ev))
        .ctx("client: attaching the request EVD to the poller")?;

    let start = Instant::now();
    for i in 0..n {
        let t = cl
            .send_lmr
            .triplet(i * size as u64, size as u64)
            .ctx("client: send triplet")?;
        cl.ep
            .post_send(&[t], i, CompletionFlags::DEFAULT)
            .ctx(&format!("client: post_send #{i}"))?;
    }
    log.step(format_args!("client posted {n} sends of {size} bytes"));
    let deadline = Instant::now() + WAIT_TIMEOUT;
    let sends_done = wait_tally(&check.tally, &check.cv, n, deadline);
    let recvs_done = wait_tally(&sv.upcall.tally, &sv.upcall.cv, n, deadline);
    s.message_time = start.elapsed();

    // Back to plain polling for the RDMA phase: what the poller did not
    // handle stays queued on the EVD.
    let stats = entry.stats();
    entry
        .remove(&poller)
        .ctx("client: removing the request EVD from the poller")?;
    drop(poller);

    {
        let t = lock(&check.tally);
        s.consumed_by_poller = t.events;
        s.messages_sent = t.good;
        s.absorb(t.errors.kept.clone(), t.errors.dropped);
        if stats.events != t.events {
            s.error(format!(
                "poller counted {} events, its handler {}",
                stats.events, t.events
            ));
        }
    }
    {
        let t = lock(&sv.upcall.tally);
        s.consumed_by_upcall = t.events;
        s.messages_received = t.good;
        s.message_bytes_verified = t.bytes;
    }
    if !sends_done {
        return Err(format!(
            "client: only {} of {n} send completions within {WAIT_TIMEOUT:?}",
            s.consumed_by_poller
        ));
    }
    if !recvs_done {
        return Err(format!(
            "server: only {} of {n} receive completions within {WAIT_TIMEOUT:?}",
            s.consumed_by_upcall
        ));
    }
    log.step(format_args!(
        "{} sends seen by the poller, {} receives by the upcall",
        s.consumed_by_poller, s.consumed_by_upcall
    ));
    Ok(())
}

fn rdma(
    sv: &Server,
    cl: &Client,
    opts: &DemoOptions,
    s: &mut DemoSummary,
    log: &Log,
) -> Result<(), String> {
    let size = opts.rdma_size();
    let remote = s
        .remote_buffer
        .ok_or("client: no remote buffer from the accept")?;
    let mut pattern = vec![0; size];
    fill_pattern(RDMA_SEED, &mut pattern);

    // Write the pattern into the server's LMR.
    let src = cl
        .pz
        .lmr_create_from(pattern.clone(), MemPriv::LOCAL_READ)
        .ctx("client: RDMA source LMR")?;
    let start = Instant::now();
    let written = rdma_op(cl, &src, DtoOp::RdmaWrite, remote, size, s);
    s.rdma_write_time = start.elapsed();
    let freed = src.free().ctx("client: freeing the RDMA source LMR");
    s.rdma_write_bytes = written?;
    freed?;
    let landed = sv.rdma_lmr.to_vec().ctx("server: reading the RDMA LMR")?;
    match first_mismatch(&landed[..size.min(landed.len())], &pattern) {
        None => s.rdma_write_verified = size as u64,
        Some(off) => s.error(format!(
            "RDMA write: the server's buffer differs from the written data at offset {off}"
        )),
    }
    log.step(format_args!(
        "RDMA write of {size} bytes checked on the server"
    ));

    // Read it back into a fresh, zero-filled LMR.
    let dst = cl
        .pz
        .lmr_create(
            Region::zeroed(size),
            MemPriv::LOCAL_WRITE | MemPriv::LOCAL_READ,
        )
        .ctx("client: RDMA read LMR")?;
    let start = Instant::now();
    let read = rdma_op(cl, &dst, DtoOp::RdmaRead, remote, size, s);
    s.rdma_read_time = start.elapsed();
    let back = read.and_then(|n| {
        s.rdma_read_bytes = n;
        dst.to_vec().ctx("client: reading the RDMA read LMR")
    });
    let freed = dst.free().ctx("client: freeing the RDMA read LMR");
    match first_mismatch(&back?, &pattern) {
        None => s.rdma_read_verified = size as u64,
        Some(off) => s.error(format!(
            "RDMA read: the data read back differs from the written data at offset {off}"
        )),
    }
    freed?;
    log.step(format_args!(
        "RDMA read of {size} bytes checked on the client"
    ));
    Ok(())
}

/// Posts one RDMA write or read of `size` bytes between `local` and
/// `remote` and consumes its completion by `wait`; returns the bytes moved.
fn rdma_op(
    cl: &Client,
    local: &Lmr,
    op: DtoOp,
    remote: RmrTriplet,
    size: usize,
    s: &mut DemoSummary,
) -> Result<u64, String> {
    let iov = [local
        .triplet(0, size as u64)
        .ctx("client: local RDMA triplet")?];
    let (cookie, what) = match op {
        DtoOp::RdmaWrite => {
            cl.ep
                .post_rdma_write(&iov, remote, RDMA_WRITE_COOKIE, CompletionFlags::DEFAULT)
                .ctx("client: post_rdma_write")?;
            (RDMA_WRITE_COOKIE, "RDMA write completion (client)")
        }
        _ => {
            cl.ep
                .post_rdma_read(&iov, remote, RDMA_READ_COOKIE, CompletionFlags::DEFAULT)
                .ctx("client: post_rdma_read")?;
            (RDMA_READ_COOKIE, "RDMA read completion (client)")
        }
    };
    wait_dto(
        &cl.req_evd,
        op,
        cl.ep.handle(),
        cookie,
        size as u64,
        what,
        s,
    )
}

fn disconnect(sv: &Server, cl: &Client, s: &mut DemoSummary, log: &Log) -> Result<(), String> {
    cl.ep.disconnect(true).ctx("client: ep_disconnect")?;
    wait_connection(
        &cl.conn_evd,
        cl.ep.handle(),
        ConnectionEventKind::Disconnected,
        "Disconnected (client)",
        s,
    )?;
    s.client_disconnected = true;
    wait_connection(
        &sv.conn_evd,
        sv.ep.handle(),
        ConnectionEventKind::Disconnected,
        "Disconnected (server)",
        s,
    )?;
    s.server_disconnected = true;
    for (who, ep) in [("client", &cl.ep), ("server", &sv.ep)] {
        let st = ep.state();
        if st != EpState::Disconnected {
            s.error(format!(
                "{who}: endpoint in state {st:?} after the disconnect"
            ));
        }
    }
    log.step(format_args!("disconnected; both sides saw Disconnected"));
    Ok(())
}

/// Drains `evd` (bounded); every event found is an error.
fn expect_empty(evd: &Evd, what: &str, s: &mut DemoSummary) {
    for _ in 0..=MAX_ERRORS_KEPT {
        match evd.dequeue() {
            Ok(Some(ev)) => s.error(format!("stray event on the {what}: {ev:?}")),
            Ok(None) => return,
            Err(e) => {
                s.error(format!("dequeue on the {what}: {e}"));
                return;
            }
        }
    }
    s.error(format!("the {what} keeps producing events"));
}

/// Stops the upcall, audits every EVD and frees everything; the problems
/// found are recorded in `s`.
fn teardown(sv: Server, cl: Client, s: &mut DemoSummary) {
    // No upcall may run past this point; what it saw is final.
    match sv
        .recv_evd
        .modify_upcall(UpcallPolicy::Teardown, None, ReEnable::OnNew)
    {
        Ok(_) => {}
        Err(e) => s.error(format!("server: receive EVD teardown: {e}")),
    }
    {
        let t = lock(&sv.upcall.tally);
        s.consumed_by_upcall = t.events;
        s.messages_received = t.good;
        s.message_bytes_verified = t.bytes;
        s.absorb(t.errors.kept.clone(), t.errors.dropped);
    }
    for (evd, what) in [
        (&sv.cr_evd, "server's CR EVD"),
        (&sv.conn_evd, "server's connection EVD"),
        (&sv.recv_evd, "server's receive EVD"),
        (sv.ia.0.async_evd(), "server's async EVD"),
        (&cl.conn_evd, "client's connection EVD"),
        (&cl.req_evd, "client's request EVD"),
        (cl.ia.0.async_evd(), "client's async EVD"),
    ] {
        expect_empty(evd, what, s);
    }

    let mut steps: Vec<(&str, rdapl::Result<()>)> = vec![
        ("client: ep_free", cl.ep.free()),
        ("server: ep_free", sv.ep.free()),
        ("server: psp_free", sv.psp.free()),
        ("client: send LMR free", cl.send_lmr.free()),
        ("server: receive LMR free", sv.recv_lmr.free()),
        ("server: RDMA LMR free", sv.rdma_lmr.free()),
    ];
    for (what, evd) in [
        ("client: request EVD free", &cl.req_evd),
        ("client: connection EVD free", &cl.conn_evd),
        ("server: receive EVD free", &sv.recv_evd),
        ("server: connection EVD free", &sv.conn_evd),
        ("server: CR EVD free", &sv.cr_evd),
    ] {
        steps.push((what, evd.free()));
    }
    steps.push(("client: pz_free", cl.pz.free()));
    steps.push(("server: pz_free", sv.pz.free()));
    steps.push((
        "client: ia_close(graceful)",
        cl.ia.0.close(CloseFlags::Graceful),
    ));
    steps.push((
        "server: ia_close(graceful)",
        sv.ia.0.close(CloseFlags::Graceful),
    ));
    for (what, r) in steps {
        if let Err(e) = r {
            s.error(format!("{what}: {e}"));
        }
    }
}

/// Runs the demo (see the module documentation). `Err` if a call failed or
/// a wait expired; otherwise the summary, whose `errors` list every wrong
/// event or byte.
pub fn run(opts: &DemoOptions) -> Result<DemoSummary, String> {
    opts.validate()?;
    let log = Log {
        quiet: opts.quiet,
        start: Instant::now(),
    };
    let server = Server::open(opts)?;
    let client = Client::open(opts)?;
    let mut s = DemoSummary::new(server.conn_qual, opts.message_size());
    log.step(format_args!(
        "server {SERVER_ADDR} listening on qualifier {}; {} receives of {} bytes pre-posted next",
        server.conn_qual,
        opts.messages(),
        opts.message_size()
    ));
    let result = pre_post(&server, opts)
        .and_then(|()| connect(&server, &client, &mut s, &log))
        .and_then(|()| messages(&server, &client, opts, &mut s, &log))
        .and_then(|()| rdma(&server, &client, opts, &mut s, &log))
        .and_then(|()| disconnect(&server, &client, &mut s, &log));
    teardown(server, client, &mut s);
    s.elapsed = log.start.elapsed();
    log.step(format_args!("done"));
    match result {
        Ok(()) => Ok(s),
        Err(e) if s.errors.is_empty() => Err(e),
        Err(e) => Err(format!("{e} (also: {})", s.errors.join("; "))),
    }
}

/// The server pre-posts every receive before the client connects.
fn pre_post(sv: &Server, opts: &DemoOptions) -> Result<(), String> {
    let size = opts.message_size() as u64;
    for i in 0..opts.messages() as u64 {
        let t = sv
            .recv_lmr
            .triplet(i * size, size)
            .ctx("server: receive triplet")?;
        sv.ep
            .post_recv(&[t], i, CompletionFlags::DEFAULT)
            .ctx(&format!("server: post_recv #{i}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_private_data_round_trips() {
        let t = RmrTriplet {
            rmr_context: 0x1234_5600,
            target_address: 0xdead_beef_0000,
            segment_length: 1 << 20,
        };
        assert_eq!(decode_accept(&encode_accept(&t)), Some(t));
        assert_eq!(decode_accept(b"something else"), None);
    }

    #[test]
    fn completion_checks_catch_each_wrong_field() {
        let ep = EpHandle(7);
        let good = DtoCompletion {
            ep,
            consumer_context: 0,
            cookie: 3,
            status: DtoStatus::Success,
            transferred_length: 64,
            operation: DtoOp::Send,
            rmr_context: 0,
            buf: None,
        };
        assert_eq!(check_dto(&good, DtoOp::Send, ep, 3, 64), None);
        let wrong = [
            DtoCompletion {
                status: DtoStatus::Flushed,
                ..good.clone()
            },
            DtoCompletion {
                operation: DtoOp::Receive,
                ..good.clone()
            },
            DtoCompletion {
                ep: EpHandle(8),
                ..good.clone()
            },
            DtoCompletion {
                cookie: 4,
                ..good.clone()
            },
            DtoCompletion {
                transferred_length: 63,
                ..good.clone()
            },
        ];
        for d in wrong {
            assert!(check_dto(&d, DtoOp::Send, ep, 3, 64).is_some(), "{d:?}");
        }
    }

    #[test]
    fn patterns_differ_per_message() {
        assert_ne!(message(0, 64), message(1, 64));
        assert_eq!(message(3, 64), message(3, 64));
        assert_eq!(first_mismatch(b"abc", b"abd"), Some(2));
        assert_eq!(first_mismatch(b"abc", b"abc"), None);
    }
}
