//! `rdapl demo`: a server and a client on the loopback provider, in one
//! process, exercising the whole object model end to end.
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
//!
//! This file holds the options, the run and the shared helpers;
//! `sides.rs` is the server and the client, `phases.rs` the steps above,
//! `summary.rs` what a run reports.

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

mod phases;
mod sides;
mod summary;

use phases::*;
use sides::*;
pub use summary::DemoSummary;
use summary::*;

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
