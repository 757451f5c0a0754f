//! `rdapl pingpong` and `rdapl bw`: latency and bandwidth between two
//! endpoints of any provider, reported as `fi_pingpong` does.
//!
//! A server (`-s`) listens on a connection qualifier and serves one client
//! at a time; a client names the server's address. With the loopback
//! provider and no server address, both run in this process.
//!
//! The protocol is messages only (every provider has them): before each
//! size the client sends a control message (test, `size`, `count`), which
//! the server echoes once it has read it (so no message of the phase can
//! land in a reused buffer before the control message is read); for
//! `pingpong` the server echoes `count` messages of `size` bytes, one at a
//! time; for `bw` it takes `count` messages, which the client keeps a
//! window of in flight, and answers with one 8-byte acknowledgement. Every
//! message's length is checked, and the first and last bytes of each.
//!
//! `bw` keeps its window full in batches: it posts what one look at the
//! EVD freed (the completion it waited for and those already queued) as
//! one [`rdapl::Ep::post_batch`], which a network provider sends together.
//!
//! Each side cycles through its message buffers: by default one per
//! message in flight (`window` sends) and per receive posted (`window + 1`).
//! `buffers` makes them fewer, reused the way qperf and perftest reuse their
//! single buffer, so that large messages work in cache as theirs do. With
//! one message in flight (`pingpong`) a reused buffer holds one message at
//! a time and every message is still checked; `bw` with reused buffers
//! checks lengths only (a later message may be landing in the buffer while
//! an earlier one is read), and the client tells the server so in its
//! control message.
//!
//! With `op` RDMA Write or RDMA Read (perftest's `ib_write_bw`,
//! `ib_read_bw` and `ib_read_lat`), the server offers a region of its own
//! in its accept's private data (key, address, length); the client moves
//! each message from or into one of `slots` message-sized pieces of it
//! (its window's worth, or as many as fit), and the phase ends with the
//! control message again, which the server echoes once it has checked:
//! the server stamps each piece before a Read phase and the client checks
//! every Read that landed in a buffer of its own; after a Write phase the
//! server checks the last message written to each piece (when stamped).
//! The server's side of an RDMA phase is passive, as an RDMA target's is,
//! but for a `pingpong` of Writes (perftest's `ib_write_lat`): there the
//! client offers a region too (in its connect's private data), and each
//! side writes message `seq` into the other's and polls its own for the
//! peer's (its last byte, then its first), dequeuing the EVD meanwhile.
//!
//! Figures as `fi_pingpong`'s: `usec/xfer` is the one-way latency (elapsed
//! time over twice the round trips) for `pingpong` of Sends, the time per
//! RDMA Read (a round trip) for `pingpong` of Reads, and the time per
//! message for `bw`; `MB/sec` is bytes moved per microsecond, both ways for
//! `pingpong` of Sends (as `fi_pingpong` counts them).
//!
//! This file holds the options, the report and the control messages;
//! `side.rs` is what both ends do, `server.rs` and `client.rs` the rest.

use rdapl::{
    CloseFlags, CompletionFlags, ConnectionEventKind, DtoOp, DtoStatus, Evd, EvdFlags, Event, Ia,
    IaOpen, IaOptions, Lmr, MemPriv, Region, RmrTriplet,
};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::time::{Duration, Instant};

mod client;
mod server;
mod side;

use client::client_run;
use server::{serve, serve_then};
use side::Side;

/// Bytes of a control message.
const CONTROL: usize = 16;
/// The first word of a control message (`rdap`).
const MAGIC: u32 = 0x7061_6472;
/// In a control message's test word: the messages' bytes are not stamped.
const UNSTAMPED: u32 = 1 << 8;
/// In a control message's test word: where the operation ([`Op`]) is.
const OP_SHIFT: u32 = 9;
/// In a control message's test word: where the number of pieces of the
/// server's region an RDMA phase uses is (16 bits).
const SLOTS_SHIFT: u32 = 16;
/// Bytes of the server's offer in its accept's private data: the magic
/// number, then its region's key, address and length.
const OFFER: usize = 24;

/// The cookie of a control message's send (a message's is its number).
const CONTROL_COOKIE: u64 = u64::MAX;

/// What an event means while a control message is exchanged.
#[derive(Debug, PartialEq, Eq)]
enum ControlStep {
    /// The control message's send completed.
    Sent,
    /// A receive completed: the echo, in receive `.0`, `.1` bytes.
    Echo(usize, usize),
    /// A message of the phase before whose send's completion came after
    /// the peer's answer to it (a provider may report a send after the
    /// reply: the loopback completes the peer's receive first).
    Earlier,
    /// A request flushed: the connection ended.
    Ended,
    /// Anything else.
    Unexpected,
}

fn control_step(ev: &Event) -> ControlStep {
    let Event::Dto(d) = ev else {
        return ControlStep::Unexpected;
    };
    match (d.operation, d.status) {
        (_, DtoStatus::Flushed) => ControlStep::Ended,
        (DtoOp::Send, DtoStatus::Success) if d.cookie == CONTROL_COOKIE => ControlStep::Sent,
        (DtoOp::Send, DtoStatus::Success) => ControlStep::Earlier,
        (DtoOp::Receive, DtoStatus::Success) => {
            ControlStep::Echo(d.cookie as usize, d.transferred_length as usize)
        }
        _ => ControlStep::Unexpected,
    }
}

/// What an event means while a pingpong of Writes waits for its own
/// Writes' completions.
#[derive(Debug, PartialEq, Eq)]
enum WriteStep {
    /// One of this side's RDMA Writes completed.
    Written,
    /// The send of this side's control message (its echo, sent just
    /// before the phase) completed.
    ControlSent,
    /// A receive completed, in receive `.0`, `.1` bytes: the peer's next
    /// control message. The peer sends it once it has seen this side's
    /// last Write in its memory and its own Writes completed, which may be
    /// before its answer to this side's fence arrives here, so before this
    /// side's last Write completes (`Completion::Placed`): a network
    /// provider completes in the order the bytes arrive.
    Message(usize, usize),
    /// Anything else.
    Unexpected,
}

fn write_step(ev: &Event) -> WriteStep {
    let Event::Dto(d) = ev else {
        return WriteStep::Unexpected;
    };
    match (d.operation, d.status) {
        (DtoOp::RdmaWrite, DtoStatus::Success) => WriteStep::Written,
        (DtoOp::Send, DtoStatus::Success) if d.cookie == CONTROL_COOKIE => WriteStep::ControlSent,
        (DtoOp::Receive, DtoStatus::Success) => {
            WriteStep::Message(d.cookie as usize, d.transferred_length as usize)
        }
        _ => WriteStep::Unexpected,
    }
}

/// What a control message says.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct Control {
    test: Test,
    op: Op,
    /// The first and last byte of each message carry its number.
    stamped: bool,
    size: usize,
    count: usize,
    /// Pieces of the server's region an RDMA phase uses (0 for Sends).
    slots: usize,
}

/// Which test.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Test {
    /// One message in flight: latency.
    PingPong = 0,
    /// A window of messages in flight: bandwidth.
    Bw = 1,
}

/// Which operation moves the messages.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum Op {
    /// Sends into the peer's posted receives.
    #[default]
    Send = 0,
    /// RDMA Writes into the server's region (`bw` only).
    Write = 1,
    /// RDMA Reads from the server's region.
    Read = 2,
}

impl Op {
    fn from_word(w: u32) -> Option<Op> {
        match w {
            0 => Some(Op::Send),
            1 => Some(Op::Write),
            2 => Some(Op::Read),
            _ => None,
        }
    }
}

/// What a run is told.
#[derive(Clone, Debug)]
pub struct PerfOptions {
    /// Provider name (as `rdapl info` lists them).
    pub provider: String,
    /// The operation (client; a server serves whichever its client asks).
    pub op: Op,
    /// Serve instead of connecting.
    pub server: bool,
    /// This side's IA address.
    pub addr: IpAddr,
    /// The server's address (client); `None` with loopback: both here.
    pub remote: Option<IpAddr>,
    /// Connection qualifier.
    pub qual: u64,
    /// Message sizes, in order.
    pub sizes: Vec<usize>,
    /// Messages per size.
    pub iters: usize,
    /// Wait on the EVD instead of polling it.
    pub wait: bool,
    /// Messages in flight (`bw`) and receives posted (both).
    pub window: usize,
    /// Message buffers each side cycles through (`None`: one per send in
    /// flight and per receive posted; see the module doc).
    pub buffers: Option<usize>,
    /// Largest message a server accepts.
    pub max_size: usize,
    /// Bound of every step.
    pub timeout: Duration,
    /// A server serves one client, then returns (else: until killed).
    pub once: bool,
    /// More IA parameters, appended to `addr=...` (provider-specific: with
    /// tcp, e.g. `crc=0`).
    pub params: String,
    /// A polling side yields the CPU once every this many empty polls (0:
    /// never): set where server and client are threads of this process and
    /// it may run on one CPU only, so that one does not keep the other off
    /// it for a time slice a message.
    pub poll_yield: u32,
}

impl Default for PerfOptions {
    fn default() -> Self {
        PerfOptions {
            provider: "loopback".into(),
            op: Op::Send,
            server: false,
            addr: "127.0.0.1".parse().unwrap(),
            remote: None,
            qual: 47_593,
            sizes: vec![64],
            iters: 1000,
            wait: false,
            window: 16,
            poll_yield: 0,
            buffers: None,
            max_size: 1 << 20,
            timeout: Duration::from_secs(30),
            once: false,
            params: String::new(),
        }
    }
}

/// The sizes of `-S all`: 1 byte to 1 MiB, by powers of two.
pub fn all_sizes() -> Vec<usize> {
    (0..=20).map(|k| 1usize << k).collect()
}

/// One line of the report.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Message size.
    pub bytes: usize,
    /// Messages sent (or RDMA operations posted) by the client.
    pub sent: usize,
    /// Messages it got back (`pingpong` of Sends), RDMA Reads completed
    /// (`pingpong` of Reads) or acknowledgements (`bw`: 1).
    pub acked: usize,
    /// Elapsed time.
    pub secs: f64,
    /// One-way transfers per message: 2 for a `pingpong` of Sends (there
    /// and back), 1 otherwise (a `bw` message, or an RDMA Read's data
    /// coming back).
    pub ways: usize,
}

impl Row {
    /// Bytes moved per microsecond, both ways for a `pingpong` of Sends
    /// (`MB/sec`, as `fi_pingpong` counts it: the `total` column over the
    /// time).
    pub fn mb_per_s(&self) -> f64 {
        self.total() as f64 / (self.secs * 1e6)
    }
    /// Bytes moved: each message once per way.
    pub fn total(&self) -> usize {
        self.bytes * self.sent * self.ways
    }
    /// Time per one-way transfer in microseconds (`usec/xfer`).
    pub fn usec_per_xfer(&self) -> f64 {
        self.secs * 1e6 / (self.ways * self.sent) as f64
    }
}

/// The table, `fi_pingpong`'s columns.
pub fn format(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<10} {:>8} {:>8} {:>10} {:>9} {:>10} {:>11} {:>11}",
        "bytes", "#sent", "#ack", "total", "time", "MB/sec", "usec/xfer", "Mxfers/sec"
    );
    for r in rows {
        let usec = r.usec_per_xfer();
        let _ = writeln!(
            out,
            "{:<10} {:>8} {:>8} {:>10} {:>8.3}s {:>10.2} {:>11.2} {:>11.2}",
            human(r.bytes as u64),
            r.sent,
            r.acked,
            human(r.total() as u64),
            r.secs,
            r.mb_per_s(),
            usec,
            1.0 / usec,
        );
    }
    out
}

fn human(n: u64) -> String {
    match n {
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{}g", n >> 30),
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{}m", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{}k", n >> 10),
        n => n.to_string(),
    }
}

/// Runs `test`: a server (until its client disconnects), a client (the
/// rows), or both in this process (loopback without a server address).
pub fn run(test: Test, o: &PerfOptions) -> Result<Vec<Row>, String> {
    if o.sizes.iter().any(|&s| s == 0 || s > o.max_size)
        || o.iters == 0
        || o.window == 0
        || o.buffers == Some(0)
    {
        return Err(format!(
            "sizes must be 1..={} bytes, iterations, window and buffers at least 1",
            o.max_size
        ));
    }
    if test == Test::PingPong && o.op == Op::Write && o.wait && !o.server {
        return Err(
            "a pingpong of RDMA Writes polls the target memory (as perftest's \
             ib_write_lat does): it cannot wait (-w)"
                .into(),
        );
    }
    if o.server {
        serve(o).map(|()| Vec::new())
    } else if o.remote.is_none() {
        if o.provider != "loopback" {
            return Err("name the server's address (or use the loopback provider)".into());
        }
        let o = &PerfOptions {
            poll_yield: poll_yield_here(),
            ..o.clone()
        };
        let server = PerfOptions {
            server: true,
            once: true,
            ..o.clone()
        };
        here(test, server, o)
    } else {
        client_run(test, o)
    }
}

/// [`PerfOptions::poll_yield`] for a server and a client that are both
/// threads of this process: where this thread may run on one CPU only
/// (a one-CPU machine, `taskset`), polls that never yield would keep the
/// other side off it for a time slice a message.
fn poll_yield_here() -> u32 {
    match std::thread::available_parallelism() {
        Ok(n) if n.get() == 1 => rdapl_tcp::ONE_CPU_POLL_YIELD,
        _ => 0,
    }
}

/// A server (`server`) on a thread of this process and a client of it
/// (`o`, from the next address up): the client's rows.
fn here(test: Test, server: PerfOptions, o: &PerfOptions) -> Result<Vec<Row>, String> {
    let ready = std::sync::Arc::new(std::sync::Barrier::new(2));
    let r2 = ready.clone();
    let h = std::thread::spawn(move || {
        serve_then(&server, || {
            r2.wait();
        })
    });
    ready.wait();
    let client = PerfOptions {
        addr: next_addr(o.addr),
        remote: Some(o.addr),
        ..o.clone()
    };
    let rows = client_run(test, &client);
    let served = h
        .join()
        .map_err(|_| "the server thread panicked".to_string())?;
    // The server's error first (a client's is often only its echo), and
    // the client's beside it (or the other way round).
    match (served, rows) {
        (Err(s), Err(c)) => Err(format!("the server: {s}; the client: {c}")),
        (Err(s), Ok(_)) => Err(format!("the server: {s}")),
        (Ok(()), rows) => rows,
    }
}

fn next_addr(a: IpAddr) -> IpAddr {
    match a {
        IpAddr::V4(v) => IpAddr::V4(std::net::Ipv4Addr::from(u32::from(v).wrapping_add(1))),
        v6 => v6,
    }
}

/// What a pingpong of Writes fills its own piece with before a phase:
/// never the last byte of message 0's stamp (0 for a 1-byte message,
/// `0xA5` for longer ones), so that a cleared piece is not taken for the
/// peer's first message.
const CLEAR: u8 = 0xFF;

#[cfg(test)]
mod tests {
    use super::server::last_to;
    use super::side::{check_at, read_offer, stamp_at};
    use super::*;

    /// Server and client in this process poll with yields where it may
    /// use one CPU only, and without where it may use more.
    #[test]
    fn polls_yield_where_both_sides_share_one_cpu() {
        use rustix::thread::{CpuSet, sched_getaffinity, sched_setaffinity};
        // On a thread of its own: its affinity changes.
        std::thread::spawn(|| {
            let all = sched_getaffinity(None).unwrap();
            if all.count() > 1 {
                assert_eq!(poll_yield_here(), 0);
            }
            let cpu = (0..CpuSet::MAX_CPU).find(|&i| all.is_set(i)).unwrap();
            let mut one = CpuSet::new();
            one.set(cpu);
            sched_setaffinity(None, &one).unwrap();
            assert_eq!(poll_yield_here(), rdapl_tcp::ONE_CPU_POLL_YIELD);
            // And a ping-pong runs there.
            let o = PerfOptions {
                iters: 200,
                ..opts(46_101, "127.0.229.1")
            };
            let rows = run(Test::PingPong, &o).unwrap();
            assert!(rows.iter().all(|r| r.sent == 200 && r.acked == 200));
        })
        .join()
        .unwrap();
    }

    fn opts(qual: u64, addr: &str) -> PerfOptions {
        PerfOptions {
            addr: addr.parse().unwrap(),
            qual,
            sizes: vec![1, 64, 4096, 70_000],
            iters: 50,
            window: 4,
            max_size: 1 << 17,
            timeout: Duration::from_secs(10),
            ..Default::default()
        }
    }

    #[test]
    fn pingpong_on_loopback_in_one_process() {
        let rows = run(Test::PingPong, &opts(9101, "127.0.77.1")).unwrap();
        assert_eq!(rows.len(), 4);
        for r in &rows {
            assert_eq!((r.sent, r.acked), (50, 50));
            assert!(r.secs > 0.0 && r.mb_per_s() > 0.0);
        }
        let table = format(&rows);
        assert!(table.starts_with("bytes"));
        assert_eq!(table.lines().count(), 5);
    }

    /// Options filled by code may bound each step by any `Duration`: one
    /// past what an `Instant` holds is as good as none, not a panic.
    #[test]
    fn a_timeout_of_duration_max_bounds_nothing() {
        for (test, qual, addr, wait) in [
            (Test::PingPong, 9123, "127.0.77.43", false),
            (Test::Bw, 9124, "127.0.77.45", true),
        ] {
            let o = PerfOptions {
                timeout: Duration::MAX,
                wait,
                ..opts(qual, addr)
            };
            let rows = run(test, &o).unwrap();
            assert!(rows.iter().all(|r| r.sent == 50), "{test:?}");
        }
    }

    #[test]
    fn bw_on_loopback_in_one_process_and_waiting() {
        let o = PerfOptions {
            wait: true,
            ..opts(9102, "127.0.77.3")
        };
        let rows = run(Test::Bw, &o).unwrap();
        assert_eq!(rows.len(), 4);
        assert!(rows.iter().all(|r| r.acked == 1 && r.sent == 50));
    }

    #[test]
    fn one_buffer_a_side_still_moves_and_checks_every_message() {
        for (test, qual, addr) in [
            (Test::PingPong, 9104, "127.0.77.7"),
            (Test::Bw, 9105, "127.0.77.9"),
        ] {
            let o = PerfOptions {
                buffers: Some(1),
                ..opts(qual, addr)
            };
            let rows = run(test, &o).unwrap();
            assert_eq!(rows.len(), 4);
            assert!(rows.iter().all(|r| r.sent == 50));
        }
    }

    #[test]
    fn a_server_with_shared_receive_buffers_serves_a_stamping_client() {
        // The client stamps (its sends have buffers of their own); the
        // server's receives share one buffer, so it checks lengths only.
        let o = opts(9106, "127.0.77.11");
        let server = PerfOptions {
            server: true,
            once: true,
            buffers: Some(1),
            ..o.clone()
        };
        let rows = here(Test::Bw, server, &o).unwrap();
        assert!(rows.iter().all(|r| r.acked == 1 && r.sent == 50));
    }

    /// Messages smaller than a control message (16 bytes), alone: every
    /// buffer still takes the control messages (before, the client's
    /// endpoint refused them as too long).
    #[test]
    fn messages_smaller_than_a_control_message_alone() {
        for (test, qual, addr) in [
            (Test::PingPong, 9108, "127.0.77.15"),
            (Test::Bw, 9109, "127.0.77.17"),
        ] {
            let o = PerfOptions {
                sizes: vec![1, 15],
                max_size: 15,
                ..opts(qual, addr)
            };
            let server = PerfOptions {
                server: true,
                once: true,
                ..o.clone()
            };
            let rows = here(test, server, &o).unwrap();
            assert_eq!(rows.len(), 2, "{test:?}");
            assert!(rows.iter().all(|r| r.sent == 50), "{test:?}");
        }
    }

    /// A 16-byte DTO completion of endpoint 1.
    fn dto(operation: DtoOp, status: DtoStatus, cookie: u64) -> Event {
        Event::Dto(rdapl::DtoCompletion {
            ep: rdapl::event::EpHandle(1),
            consumer_context: 0,
            cookie,
            status,
            transferred_length: 16,
            operation,
            rmr_context: 0,
            buf: None,
        })
    }

    /// The completion of a message's send that comes after the peer's
    /// answer to it (the last of a phase) is not taken for the next
    /// control message's: the CI run of 2026-12-04 failed on
    /// "expected the control message's echo, got" the control send's
    /// completion, the stale one having been counted first.
    #[test]
    fn a_late_send_completion_is_not_the_control_messages() {
        let ok = DtoStatus::Success;
        assert_eq!(
            control_step(&dto(DtoOp::Send, ok, 49)),
            ControlStep::Earlier
        );
        assert_eq!(
            control_step(&dto(DtoOp::Send, ok, CONTROL_COOKIE)),
            ControlStep::Sent
        );
        assert_eq!(
            control_step(&dto(DtoOp::Receive, ok, 3)),
            ControlStep::Echo(3, 16)
        );
        assert_eq!(
            control_step(&dto(DtoOp::Receive, DtoStatus::Flushed, 3)),
            ControlStep::Ended
        );
        assert_eq!(
            control_step(&dto(DtoOp::Send, DtoStatus::LocalLength, CONTROL_COOKIE)),
            ControlStep::Unexpected
        );
    }

    /// A pingpong of Writes waiting for its last Writes' completions may
    /// see the peer's next control message first (with `complete=placed`
    /// the Write completes when the peer's answer to its fence arrives,
    /// and the peer may send once it saw the Write in its memory): the
    /// server took that receive for a failure and ended the connection,
    /// in about one run in five of `pingpong --op write -S all -I 5`.
    #[test]
    fn a_receive_while_writes_complete_is_the_peers_next_message() {
        let ok = DtoStatus::Success;
        assert_eq!(
            write_step(&dto(DtoOp::RdmaWrite, ok, 4)),
            WriteStep::Written
        );
        assert_eq!(
            write_step(&dto(DtoOp::Receive, ok, 2)),
            WriteStep::Message(2, 16)
        );
        assert_eq!(
            write_step(&dto(DtoOp::Send, ok, CONTROL_COOKIE)),
            WriteStep::ControlSent
        );
        for (op, status, cookie) in [
            (DtoOp::RdmaWrite, DtoStatus::Flushed, 4),
            (DtoOp::Receive, DtoStatus::Flushed, 2),
            (DtoOp::Send, ok, 3),
            (DtoOp::RdmaRead, ok, 4),
        ] {
            assert_eq!(
                write_step(&dto(op, status, cookie)),
                WriteStep::Unexpected,
                "{op:?} {status:?}"
            );
        }
    }

    #[test]
    fn a_control_message_says_whether_bytes_are_stamped() {
        let o = opts(9107, "127.0.77.13");
        let s = Side::open(&o, 64, 0).unwrap();
        for stamped in [true, false] {
            let c = Control {
                test: Test::Bw,
                op: Op::Send,
                stamped,
                size: 4096,
                count: 77,
                slots: 0,
            };
            // What control() writes, read back from the send buffer.
            let mut m = [0u8; CONTROL];
            m[..4].copy_from_slice(&MAGIC.to_le_bytes());
            let word = Test::Bw as u32 | if stamped { 0 } else { UNSTAMPED };
            m[4..8].copy_from_slice(&word.to_le_bytes());
            m[8..12].copy_from_slice(&4096u32.to_le_bytes());
            m[12..].copy_from_slice(&77u32.to_le_bytes());
            s.recv.write_at(0, &m).unwrap();
            assert_eq!(s.read_control(0, CONTROL).unwrap(), c);
        }
        let _ = s.ep.free();
        let _ = s.ia.close(CloseFlags::Abrupt);
    }

    #[test]
    fn bad_options_are_refused() {
        let mut o = opts(9103, "127.0.77.5");
        o.sizes = vec![0];
        assert!(run(Test::Bw, &o).is_err());
        let mut o = opts(9103, "127.0.77.5");
        o.buffers = Some(0);
        assert!(run(Test::Bw, &o).is_err());
        let mut o = opts(9103, "127.0.77.5");
        o.provider = "tcp".into();
        assert!(
            run(Test::PingPong, &o)
                .unwrap_err()
                .contains("server's address")
        );
    }

    #[test]
    fn the_table_has_fi_pingpongs_columns() {
        let mut rows = [Row {
            bytes: 64,
            sent: 1000,
            acked: 1000,
            secs: 0.01,
            ways: 2,
        }];
        let t = format(&rows);
        assert!(t.contains("usec/xfer") && t.contains("MB/sec") && t.contains("Mxfers/sec"));
        // 0.01 s over 2000 one-way transfers: 5 µs each; 128 kB (both
        // ways, as fi_pingpong counts) over 10 ms: 12.8 MB/s.
        assert!(t.contains("5.00"), "{t}");
        assert!(t.contains("12.80"), "{t}");
        assert!(!t.contains("6.40"), "{t}");
        // bw (and a pingpong of RDMA Reads) counts one way.
        rows[0].ways = 1;
        let b = format(&rows);
        assert!(b.contains("6.40") && b.contains("10.00"), "{b}");
    }

    #[test]
    fn rdma_writes_and_reads_on_loopback_in_one_process() {
        let cases = [
            (Test::Bw, Op::Write, None, 9111, "127.0.77.19"),
            (Test::Bw, Op::Read, None, 9112, "127.0.77.21"),
            (Test::PingPong, Op::Read, None, 9113, "127.0.77.23"),
            (Test::PingPong, Op::Write, None, 9121, "127.0.77.39"),
            (Test::PingPong, Op::Write, Some(1), 9122, "127.0.77.41"),
            (Test::Bw, Op::Write, Some(1), 9114, "127.0.77.25"),
            (Test::Bw, Op::Read, Some(1), 9115, "127.0.77.27"),
        ];
        for (test, op, buffers, qual, addr) in cases {
            let o = PerfOptions {
                op,
                buffers,
                ..opts(qual, addr)
            };
            let rows = run(test, &o).unwrap_or_else(|e| panic!("{test:?} {op:?}: {e}"));
            assert_eq!(rows.len(), 4, "{test:?} {op:?}");
            for r in &rows {
                assert_eq!(r.sent, 50);
                let ways = if (test, op) == (Test::PingPong, Op::Write) {
                    2
                } else {
                    1
                };
                assert_eq!(r.ways, ways);
                let acked = if test == Test::PingPong { 50 } else { 1 };
                assert_eq!(r.acked, acked);
            }
        }
    }

    /// A client whose window is larger than the server's region holds
    /// writes several messages to each piece at once; the server checks
    /// the last one of each.
    #[test]
    fn writes_share_the_pieces_of_a_small_server_region() {
        let o = PerfOptions {
            op: Op::Write,
            window: 8,
            ..opts(9116, "127.0.77.29")
        };
        // A region of 2 × 128 KiB: 70,000-byte messages get 3 pieces,
        // fewer than the client's 8 in flight.
        let server = PerfOptions {
            server: true,
            once: true,
            window: 2,
            ..o.clone()
        };
        let rows = here(Test::Bw, server, &o).unwrap();
        assert!(rows.iter().all(|r| r.acked == 1 && r.sent == 50));
    }

    #[test]
    fn the_last_message_of_each_piece() {
        // 10 messages over 4 pieces: 0 4 8 / 1 5 9 / 2 6 / 3 7.
        let last: Vec<_> = (0..4).map(|j| last_to(j, 4, 10)).collect();
        assert_eq!(last, [Some(8), Some(9), Some(6), Some(7)]);
        // Fewer messages than pieces: the pieces after them got none.
        assert_eq!(last_to(2, 4, 2), None);
        assert_eq!(last_to(1, 4, 2), Some(1));
        assert_eq!(last_to(0, 1, 1), Some(0));
    }

    #[test]
    fn a_stamp_checks_only_its_own_message() {
        let o = opts(9117, "127.0.77.31");
        let s = Side::open(&o, 64, 2).unwrap();
        let t = s.target.as_ref().unwrap();
        stamp_at(t, 64, 64, 300).unwrap();
        check_at(t, 64, 64, 300).unwrap();
        assert!(check_at(t, 64, 64, 301).is_err());
        // The last byte counts too (one message landed short).
        t.write_at(127, &[0]).unwrap();
        assert!(check_at(t, 64, 64, 300).is_err());
        let _ = s.ep.free();
        let _ = s.ia.close(CloseFlags::Abrupt);
    }

    #[test]
    fn control_messages_carry_the_operation_and_pieces() {
        let o = opts(9118, "127.0.77.33");
        let s = Side::open(&o, 64, 0).unwrap();
        let write = |word: u32| {
            let mut m = [0u8; CONTROL];
            m[..4].copy_from_slice(&MAGIC.to_le_bytes());
            m[4..8].copy_from_slice(&word.to_le_bytes());
            m[8..12].copy_from_slice(&64u32.to_le_bytes());
            m[12..].copy_from_slice(&9u32.to_le_bytes());
            s.recv.write_at(0, &m).unwrap();
        };
        write(1 | 2 << OP_SHIFT | 300 << SLOTS_SHIFT);
        let c = s.read_control(0, CONTROL).unwrap();
        assert_eq!(
            (c.test, c.op, c.slots, c.stamped),
            (Test::Bw, Op::Read, 300, true)
        );
        // An operation or a flag this rdapl does not know is refused.
        write(1 | 3 << OP_SHIFT);
        assert!(
            s.read_control(0, CONTROL)
                .unwrap_err()
                .contains("operation")
        );
        write(1 | 1 << 12);
        assert!(s.read_control(0, CONTROL).is_err());
        let _ = s.ep.free();
        let _ = s.ia.close(CloseFlags::Abrupt);
    }

    #[test]
    fn an_offer_is_read_only_when_whole_and_marked() {
        let mut pd = Vec::new();
        pd.extend_from_slice(&MAGIC.to_le_bytes());
        pd.extend_from_slice(&7u32.to_le_bytes());
        pd.extend_from_slice(&0x1000u64.to_le_bytes());
        pd.extend_from_slice(&65536u64.to_le_bytes());
        let t = read_offer(Some(&pd)).unwrap();
        assert_eq!(
            (t.rmr_context, t.target_address, t.segment_length),
            (7, 0x1000, 65536)
        );
        assert_eq!(read_offer(Some(&pd[..OFFER - 1])), None);
        assert_eq!(read_offer(None), None);
        pd[0] ^= 1;
        assert_eq!(read_offer(Some(&pd)), None);
    }

    /// A hostile server: offers a region whose address range wraps past
    /// the end of the address space, then echoes the control messages.
    fn wrapping_server(
        so: PerfOptions,
        ready: std::sync::Arc<std::sync::Barrier>,
    ) -> Result<(), String> {
        let s = Side::open(&so, 64, so.window)?;
        let crs =
            s.ia.evd_create(8, EvdFlags::CR)
                .map_err(|e| e.to_string())?;
        let psp = s.ia.psp_create(so.qual, &crs).map_err(|e| e.to_string())?;
        ready.wait();
        let cr = match crs.wait(Some(so.timeout), 1).map_err(|e| e.to_string())?.0 {
            Event::ConnectionRequest(a) => a.cr,
            other => return Err(format!("{other:?}")),
        };
        for i in 0..=s.window {
            s.post_recv(i)?;
        }
        let mut pd = s.offer()?;
        pd[8..16].copy_from_slice(&(u64::MAX - 10).to_le_bytes());
        s.ia.cr(cr)
            .and_then(|c| c.accept(&s.ep, &pd))
            .map_err(|e| e.to_string())?;
        match s.next()? {
            Event::Connection(c) if c.kind == ConnectionEventKind::Established => {}
            other => return Err(format!("expected Established, got {other:?}")),
        }
        // Echo control messages until the client goes.
        while let Ok(Some((i, len))) = s.next_recv() {
            let Ok(ctl) = s.read_control(i, len) else {
                break;
            };
            if s.post_recv(i).is_err() || s.control(ctl).is_err() {
                break;
            }
        }
        let _ = psp.free();
        let _ = s.ep.free();
        let _ = s.ia.close(CloseFlags::Abrupt);
        Ok(())
    }

    /// A server whose offered region wraps past the end of the address
    /// space (an address near `u64::MAX`) is refused with an error: the
    /// client once computed the address of piece 1 with an overflowing
    /// add and panicked (a debug build), or posted RDMA to a wrapped
    /// address (a release build).
    #[test]
    fn an_offer_that_wraps_the_address_space_is_refused() {
        for (op, qual, addr) in [
            (Op::Write, 19001, "127.0.252.1"),
            (Op::Read, 19002, "127.0.252.3"),
        ] {
            let o = PerfOptions {
                op,
                sizes: vec![64],
                iters: 8,
                window: 4,
                timeout: Duration::from_secs(5),
                ..opts(qual, addr)
            };
            let so = PerfOptions {
                server: true,
                once: true,
                ..o.clone()
            };
            let ready = std::sync::Arc::new(std::sync::Barrier::new(2));
            let r2 = ready.clone();
            let h = std::thread::spawn(move || wrapping_server(so, r2));
            ready.wait();
            let client = PerfOptions {
                addr: next_addr(o.addr),
                remote: Some(o.addr),
                ..o.clone()
            };
            let r = client_run(Test::Bw, &client);
            h.join().unwrap().unwrap();
            let e = r.unwrap_err();
            assert!(e.contains("wraps"), "{op:?}: {e}");
        }
    }

    /// Buffers larger than this machine's memory (1 GiB messages, a
    /// window of 1024: a TiB a region) are refused with an error: the
    /// process once aborted, its allocation failed.
    #[test]
    fn buffers_larger_than_memory_are_refused() {
        let o = PerfOptions {
            server: true,
            once: true,
            sizes: vec![1 << 30],
            max_size: 1 << 30,
            window: 1024,
            ..opts(19003, "127.0.252.5")
        };
        let e = run(Test::Bw, &o).unwrap_err();
        assert!(e.contains("memory"), "{e}");
    }

    #[test]
    fn a_pingpong_of_writes_cannot_wait() {
        let o = PerfOptions {
            op: Op::Write,
            wait: true,
            ..opts(9119, "127.0.77.35")
        };
        let e = run(Test::PingPong, &o).unwrap_err();
        assert!(e.contains("cannot wait"), "{e}");
    }

    /// A piece cleared for a pingpong of Writes is never taken for the
    /// peer's first message (a cleared 1-byte piece once was: 0 is its
    /// stamp, and each side went on before the other had written).
    #[test]
    fn a_cleared_piece_is_not_the_first_message() {
        let o = opts(9120, "127.0.77.37");
        let s = Side::open(&o, 64, 1).unwrap();
        let t = s.target.as_ref().unwrap();
        for size in [1usize, 2, 64] {
            t.write_at(0, &vec![CLEAR; size]).unwrap();
            assert!(check_at(t, 0, size, 0).is_err(), "{size} bytes");
            let mut last = [0u8];
            t.read_at(size - 1, &mut last).unwrap();
            stamp_at(t, 0, size, 0).unwrap();
            let mut stamped = [0u8];
            t.read_at(size - 1, &mut stamped).unwrap();
            assert_ne!(last, stamped, "{size} bytes");
        }
        let _ = s.ep.free();
        let _ = s.ia.close(CloseFlags::Abrupt);
    }
}
