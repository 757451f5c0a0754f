//! One TCP connection: its iWARP engine, its socket buffers, its requests
//! in flight, and what the core is told.
//!
//! Behind a lock (`progress::ConnCell`) that the progress thread,
//! posters and polling consumers take ([`crate::progress`]).
//!
//! # Guarantees
//!
//! * **Exactly once.** Every request taken from the core (a send, an RDMA
//!   write or read, a memory operation, a receive) is completed exactly
//!   once: by its outcome, or `Flushed` when the connection ends first.
//!   The core is told of the connection's end once ([`EpInner::ended`]),
//!   after the provider's own requests are completed, so the requests of
//!   one queue complete in post order.
//! * **What a completion means.** A Send or RDMA Write completes when the
//!   peer has placed it, not when it was handed to TCP (siw's meaning):
//!   iWARP has no acknowledgement, so after a burst of Sends and Writes the
//!   provider posts a zero-length RDMA Read (a *fence*; any RDMA Read does
//!   it; up to `MAX_FENCES` outstanding, a further one only once it
//!   covers as many requests as those before it), whose response proves
//!   that the peer processed everything before it. A remote error
//!   therefore reaches the request that caused it: the
//!   peer's Terminate names the offending segment (STag or MSN), that
//!   request completes with `RemoteAccess` (key, right, bounds),
//!   `ReceiverNotReady` (no receive) or `RemoteResponder` (anything else),
//!   those before it with `Success`, those after it `Flushed`. With
//!   [`Completion::Sent`] there are no fences: a Send or Write succeeds
//!   once the socket took its last byte (the output queue's position
//!   passed it, so its memory is no longer read), and a Terminate breaks
//!   the connection (what did not complete yet is `Flushed`). A peer whose
//!   IRD is 0 takes no fence, so its connection completes that way too.
//! * **A Send that finds no receive.** The receiver stops feeding (and
//!   then reading) that socket at the first segment of a Send while no
//!   receive is posted, so TCP flow control holds the sender back. A
//!   receive posted within `recv_wait_ms` lets it go on; after that the
//!   Send is fed anyway: the engine answers with a Terminate (no buffer),
//!   the sender's Send completes `ReceiverNotReady` and both sides break.
//! * **Bounded memory.** At most `MAX_INFLIGHT` requests and
//!   `MAX_STAGED` staged bytes per connection leave the core's queue;
//!   the input buffer stops growing at `IO_HIGH` bytes, the output at
//!   `IO_HIGH` or, to finish the message it is in, `OUT_MESSAGE_MAX`
//!   (the output holds large payload by reference, not copied).
//!
//! The engine is fed one FPDU at a time (its header is looked at first:
//! whether it needs a receive, whether it is a Read Request to stage,
//! whether tagged payload is a Write or a Read Response). A peer that
//! sends garbage meets the engine's checks: an error, a Terminate, the
//! connection broken, never a panic.

use crate::memory::{ConnMemory, RecvState, RxOp, Sink, Staged, StagedRead};
use crate::outq::OutQueue;
use crate::params::{Completion, IaParams};
use rdapl::provider::{CrInner, CrState, EpInner, SpInner, Wr, WrKind};
use rdapl::{CompletionFlags, ConnectionEventKind, DtoStatus, RmrTriplet};
use rdapl_iwarp::terminate::{ddp as tddp, layer, rdmap as trdmap};
use rdapl_iwarp::{
    Buffer, ConnError, Connection, DdpHeader, Event, Opcode, ProtocolError, ReadRequest, Role, Rtr,
    Source, State, Terminate, Transmit, fpdu,
};
use std::collections::VecDeque;
use std::io::{self, IoSliceMut, Read};
use std::net::{IpAddr, Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering, fence};
use std::sync::{Arc, Weak};

/// Most requests one connection takes from the core's queue at once.
pub(crate) const MAX_INFLIGHT: usize = 512;
/// Most gathered bytes one connection stages at once.
pub(crate) const MAX_STAGED: usize = 16 << 20;
/// Input and output buffer high-water mark.
pub(crate) const IO_HIGH: usize = 256 << 10;
/// The output may pass [`IO_HIGH`] up to this to end the message it is
/// in: a stream of large messages leaves in writes of a message each, not
/// of `IO_HIGH` (which streamed 1 MiB messages slower: see the commit).
const OUT_MESSAGE_MAX: usize = 1 << 20;

/// Most reads (fences included) outstanding before a burst of sends waits
/// for one of them to come back rather than get a fence of its own (see
/// `fence_now` for the rule below it).
const MAX_FENCES: usize = 4;

/// Sends and Writes of one burst after which a fence may go out before
/// the burst's end (`Conn::pull`; `fence_now` decides), counting those
/// shorter than [`BURST_FENCE_LONG`] only.
const BURST_FENCE_COUNT: usize = 4;

/// A Send or Write this long moves so much between two fences that an
/// earlier fence gains nothing: streams of such messages ran slower with
/// a fence every four (the figures are in the commit that set this).
const BURST_FENCE_LONG: u64 = 256 << 10;

/// Most output bytes a polling consumer's pass holds back.
const HOLD_MAX: usize = 4096;

/// The least room a read into the input buffer gets.
const READ_CHUNK: usize = 64 << 10;

/// The least payload due that is read straight into its destination:
/// the FPDUs of a large message (on loopback, where the MSS is about
/// 32 KiB). Smaller ones go through the input buffer, several to a system
/// call, and are copied to their place: for them the copy costs less than
/// a system call each (small messages come in bursts, posted together).
const DIRECT_MIN: usize = 16 << 10;

/// What a direct read takes into the input buffer after the payload: the
/// trailer and the next FPDU's header, with a little payload.
const DIRECT_TAIL: usize = 256;

/// FPDU starts after a large one during which a read at a boundary takes
/// a header's worth first ([`Conn::read_socket`]): a message's small last
/// FPDU, the peer's fence and the answers to ours (four small FPDUs
/// between the messages of a ping-pong) do not make the next large
/// message's first FPDU land in the input buffer.
const LARGE_AFTER: u8 = 8;

/// Whether a fence goes out behind `uncovered` (> 0) Sends and Writes
/// while `outstanding` reads will complete `covered` earlier ones, on a
/// connection whose ORD is `ord` (see `Conn::maybe_fence`): a read beyond
/// the ORD would hold every request behind it until a response came.
fn fence_now(outstanding: usize, uncovered: usize, covered: usize, ord: usize) -> bool {
    outstanding == 0 || (outstanding < MAX_FENCES.min(ord) && uncovered >= covered)
}

/// The STag a fence's zero-length read names (never looked up).
const FENCE_STAG: u32 = 1;

/// The IRD and ORD an endpoint asks for (its attributes'
/// `max_rdma_read_in` and `max_rdma_read_out`, which the core holds to
/// the IA's `max_rdma_read_per_ep`): offered in MPA, where the peer's
/// ORD may raise the IRD and its IRD lower the ORD (RFC 6581). At least
/// 1 each way: a fence is a read, so a connection whose ORD is 0 could
/// never complete a Send or Write once placed, nor could an rdapl peer's
/// facing an IRD of 0.
fn read_depths(ep: &EpInner) -> (u16, u16) {
    let a = ep.attr();
    let depth = |n: usize| u16::try_from(n.max(1)).unwrap_or(u16::MAX);
    (depth(a.max_rdma_read_in), depth(a.max_rdma_read_out))
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum SlotKind {
    Send { msn: u32 },
    Write { stag: u32, to: u64, len: u64 },
    Read { msn: u32, sink: u32 },
    Fence { msn: u32 },
    Local,
}

/// A request taken from the core, in post order.
struct Slot {
    id: u64,
    kind: SlotKind,
    /// The request (a read's is in its sink).
    wr: Option<Wr>,
    len: u64,
    /// Handed to TCP in full (Sends and Writes).
    sent: bool,
    /// Once `sent`: the output position past its last byte.
    sent_at: u64,
    status: Option<DtoStatus>,
}

/// Where the connection is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// TCP connect in progress (active side).
    Connecting,
    /// MPA setup and data.
    Open,
    /// The core was told; the last bytes drain, then the socket closes.
    Draining,
    /// To be dropped.
    Dead,
}

pub(crate) struct Conn {
    pub token: u64,
    pub sock: TcpStream,
    pub ia: Arc<IaParams>,
    pub role: Role,
    pub phase: Phase,
    pub engine: Option<Connection>,
    pub mem: ConnMemory,
    pub ep: Option<Arc<EpInner>>,
    pub cr: Option<Arc<CrInner>>,
    pub sp: Option<Weak<SpInner>>,
    /// The peer's address and the qualifier.
    pub peer: (IpAddr, u64),
    /// Active side: the private data to send once TCP is up.
    pub connect_pd: Vec<u8>,
    pub connect_deadline: Option<u64>,
    /// The core's connection number (0 until established).
    pub dat_conn: u64,
    told: bool,
    /// How an active attempt failed, with the reject's private data.
    setup_fail: (ConnectionEventKind, Option<Vec<u8>>),
    /// How an established connection ends.
    end_kind: ConnectionEventKind,
    // input
    /// Input: bytes `in_pos..in_end` of `inbuf` are unfed.
    inbuf: Vec<u8>,
    in_end: usize,
    in_pos: usize,
    /// Bytes left of the FPDU or MPA frame being fed (0: at a boundary).
    frame_left: usize,
    /// Bulk input: the FPDU being fed is large, so reads into the buffer
    /// stop at the next header and its payload goes straight to its place
    /// ([`Conn::read_direct`]).
    direct: bool,
    /// FPDU starts left before large input is no longer expected (set to
    /// [`LARGE_AFTER`] at the start and by a large FPDU, less one by each
    /// small one).
    large_recent: u8,
    eof: bool,
    eof_fed: bool,
    stall_since: Option<u64>,
    // output
    out: OutQueue,
    shut: bool,
    linger_deadline: Option<u64>,
    // requests
    /// In post order, so by increasing `id` (see `push_slot`).
    slots: VecDeque<Slot>,
    /// A Send or Write was queued since `maybe_fence` last found every
    /// one covered by a read: only then does it look.
    fence_due: bool,
    recv_order: VecDeque<u64>,
    free_recvs: usize,
    next_id: u64,
    next_sink: u32,
    send_msn: u32,
    read_msn: u32,
    /// Counts every step that moved something (bytes read, fed, queued or
    /// written; events): `pump` goes on while it moves.
    work: u64,
    /// A Send of the peer waits for a receive: a posted receive must kick
    /// (read by posters without the lock; see `fpdu_start`).
    pub stalled: Arc<AtomicBool>,
    /// The epoll interest registered (`None`: not registered).
    pub registered: Option<(bool, bool)>,
    /// A consumer drives the input: the progress thread does not poll for
    /// it ([`crate::progress`]).
    pub polled: bool,
    /// Its own cell: it joins the groups of the endpoint's EVDs once
    /// established ([`crate::group`]).
    pub hook: Option<Weak<crate::progress::ConnCell>>,
    /// Completions delivered to the core so far.
    delivered: u64,
    /// The socket had nothing more to read in this pump.
    rx_drained: bool,
    /// `write_socket` holds its bytes back (a polling consumer's pass).
    hold_out: bool,
    /// Output held back for the consumer's answer (see `pump_polled`).
    pub out_held: bool,
    /// What a Send or Write's completion means on this connection: the
    /// IA's choice, or `Sent` where the peer takes no reads (a fence could
    /// never go out).
    complete: Completion,
    /// The provider's counters.
    pub stats: Arc<crate::progress::Stats>,
    /// The provider's shared state (a responder's requests answer through
    /// it).
    pub shared: Option<Arc<crate::progress::Shared>>,
}

/// The earlier of two optional instants.
fn earliest(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

fn total_len(wr: &Wr) -> u64 {
    match wr.data() {
        Some(d) => d.len() as u64,
        None => wr
            .iov()
            .iter()
            .fold(0u64, |n, t| n.saturating_add(t.segment_length)),
    }
}

/// True if `b` is a whole number of FPDUs.
fn whole_fpdus(mut b: &[u8]) -> bool {
    while b.len() >= 2 {
        let ulpdu = usize::from(u16::from_be_bytes([b[0], b[1]]));
        let total = 2 + ulpdu + fpdu::pad_len(ulpdu) + 4;
        if total > b.len() {
            return false;
        }
        b = &b[total..];
    }
    b.is_empty()
}

impl Conn {
    pub fn new(
        token: u64,
        sock: TcpStream,
        ia: Arc<IaParams>,
        role: Role,
        peer: (IpAddr, u64),
    ) -> Conn {
        let complete = ia.complete;
        Conn {
            token,
            sock,
            ia,
            role,
            phase: Phase::Open,
            engine: None,
            mem: ConnMemory::new(),
            ep: None,
            cr: None,
            sp: None,
            peer,
            connect_pd: Vec::new(),
            connect_deadline: None,
            dat_conn: 0,
            told: false,
            setup_fail: (ConnectionEventKind::NonPeerRejected, None),
            end_kind: ConnectionEventKind::Disconnected,
            inbuf: Vec::new(),
            in_end: 0,
            in_pos: 0,
            frame_left: 0,
            direct: false,
            // (a first message may be large too)
            large_recent: LARGE_AFTER,
            eof: false,
            eof_fed: false,
            stall_since: None,
            out: OutQueue::default(),
            shut: false,
            linger_deadline: None,
            slots: VecDeque::new(),
            fence_due: false,
            recv_order: VecDeque::new(),
            free_recvs: 0,
            next_id: 1,
            next_sink: 2,
            send_msn: 1,
            read_msn: 1,
            work: 0,
            stalled: Arc::new(AtomicBool::new(false)),
            registered: None,
            polled: false,
            hook: None,
            delivered: 0,
            rx_drained: false,
            hold_out: false,
            out_held: false,
            complete,
            stats: Arc::default(),
            shared: None,
        }
    }

    /// The engine config for this connection's socket.
    pub fn engine_config(&self) -> rdapl_iwarp::Config {
        let mss = self.ia.mss.unwrap_or_else(|| {
            socket2::SockRef::from(&self.sock)
                .tcp_mss()
                .unwrap_or(1460)
                .clamp(64, 65535)
        });
        let mut cfg = rdapl_iwarp::Config {
            crc: self.ia.crc,
            peer_to_peer: true,
            mss,
            // The consumer's connect timeout (`connect_deadline`) bounds
            // the wait for the Reply, or nothing does: DAT's indefinite
            // wait. MPA's own 10 s would refuse a slow accept the
            // consumer was prepared to wait for.
            reply_timeout_ms: None,
            request_timeout_ms: self.ia.mpa_timeout_ms,
            ..rdapl_iwarp::Config::default()
        };
        // The endpoint's read depths, once it is known (an initiator's
        // is; a responder's comes with the accept).
        if let Some(ep) = &self.ep {
            (cfg.ird, cfg.ord) = read_depths(ep);
        }
        cfg
    }

    /// Binds the endpoint whose requests and memory this connection uses.
    pub fn bind_ep(&mut self, ep: &Arc<EpInner>) {
        self.ep = Some(ep.clone());
        self.mem.ep = Some(ep.clone());
    }

    pub fn is_dead(&self) -> bool {
        self.phase == Phase::Dead
    }

    /// An accepted connection whose MPA request has not come yet: no
    /// consumer knows of it.
    pub fn in_setup(&self) -> bool {
        self.role == Role::Responder
            && self.phase == Phase::Open
            && self.cr.is_none()
            && self.ep.is_none()
            && self
                .engine
                .as_ref()
                .is_some_and(|e| e.state() == State::AwaitRequest)
    }

    /// Closes the connection if it is [`Conn::in_setup`] (its listener
    /// has too many waiting): nobody is told, the peer sees its socket
    /// close. False if it was not in setup.
    pub fn drop_setup(&mut self) -> bool {
        let drop = self.in_setup();
        if drop {
            self.phase = Phase::Dead;
        }
        drop
    }

    /// The earliest timer of this connection (ms).
    pub fn deadline(&self) -> Option<u64> {
        let stall = self
            .stall_since
            .map(|s| s.saturating_add(self.ia.recv_wait_ms));
        let engine = self.engine.as_ref().and_then(|e| e.poll_timeout());
        [self.connect_deadline, stall, self.linger_deadline]
            .into_iter()
            .fold(engine, earliest)
    }

    /// Nothing to do until the socket has input: open, no input buffered
    /// unfed, no Send waiting for a receive, no output queued or held.
    /// (A consumer's pass may then skip the connection, see
    /// `progress::ConnCell`.)
    pub fn quiet(&self) -> bool {
        self.phase == Phase::Open
            && self.in_pos == self.in_end
            && self.stall_since.is_none()
            && !self.eof
            && self.out.is_empty()
            && !self.out_held
    }

    /// What the socket should be polled for: (readable, writable).
    pub fn interest(&self) -> (bool, bool) {
        match self.phase {
            Phase::Connecting => (false, true),
            Phase::Dead => (false, false),
            Phase::Draining => (!self.eof, !self.out.is_empty()),
            Phase::Open => (
                !self.eof && self.in_end - self.in_pos < IO_HIGH,
                !self.out.is_empty() && !self.out_held,
            ),
        }
    }

    // ----- driving -------------------------------------------------------------

    /// Does everything that can be done now: read, feed, post, transmit,
    /// write, time out.
    pub fn pump(&mut self, now: u64) {
        self.rx_drained = false;
        self.pump_inner(now);
    }

    /// [`Conn::pump`] for a poster: it reads the socket only while a read
    /// or fence of ours waits for its response (a stream of sends then
    /// takes the answers in as it goes, so the peer's small responses do
    /// not pile up in the socket); otherwise the input is the polling
    /// consumer's or the thread's, and a system call that finds nothing
    /// would only delay the send (a ping-pong's case).
    pub fn pump_tx(&mut self, now: u64) {
        // (From the back: the newest fence is there.)
        self.rx_drained = !self.slots.iter().rev().any(|s| {
            matches!(s.kind, SlotKind::Read { .. } | SlotKind::Fence { .. }) && s.status.is_none()
        });
        self.pump_inner(now);
    }

    fn pump_inner(&mut self, now: u64) {
        if matches!(self.phase, Phase::Connecting | Phase::Dead) {
            return;
        }
        if !self.hold_out {
            self.out_held = false;
        }
        loop {
            let before = self.work;
            self.read_socket(now);
            self.feed(now);
            self.pull();
            self.transmit();
            self.write_socket();
            self.check_end(now);
            if before == self.work || self.phase == Phase::Dead {
                break;
            }
        }
    }

    /// [`Conn::pump`] for a polling consumer's pass (the progress thread
    /// leaves the input to it: `polled`). If the pass delivered
    /// completions and what it has to send is small (an answer to the
    /// peer's fence, typically), the bytes are held back once: the
    /// consumer is likely to post in reply at once, and its send then
    /// carries them in the same segment (one system call, one wakeup of
    /// the peer instead of two). They go with the next pump of any kind:
    /// the consumer's post, its next pass, its `park`, or the progress
    /// thread's check of a polled connection (within
    /// [`crate::progress::HOLD_MS`]).
    pub fn pump_polled(&mut self, now: u64) {
        let held_before = self.out_held;
        let d0 = self.delivered;
        self.hold_out = self.polled && !held_before;
        self.pump(now);
        self.hold_out = false;
        let pending = self.out.len();
        if pending == 0 {
            self.out_held = false;
            return;
        }
        if self.polled
            && !held_before
            && self.delivered != d0
            && pending <= HOLD_MAX
            && self.phase == Phase::Open
        {
            self.out_held = true;
        } else {
            self.pump(now);
        }
    }

    /// Timers that are due at `now`.
    pub fn on_timer(&mut self, now: u64) {
        if let Some(d) = self.connect_deadline
            && now >= d
            && self.dat_conn == 0
        {
            self.connect_deadline = None;
            self.setup_fail = (ConnectionEventKind::TimedOut, None);
            match self.engine.as_mut() {
                Some(e) => e.close(),
                None => self.finalize(now),
            }
            self.events();
        }
        if let Some(e) = self.engine.as_mut() {
            e.handle_timeout(now);
        }
        self.events();
        if let Some(d) = self.linger_deadline
            && now >= d
        {
            self.phase = Phase::Dead;
        }
        self.pump(now);
    }

    fn read_socket(&mut self, now: u64) {
        if self.eof || self.phase == Phase::Dead || self.rx_drained {
            return;
        }
        if self.in_pos == self.in_end {
            self.in_pos = 0;
            self.in_end = 0;
            if self.phase == Phase::Open
                && let Some(r) = self.read_direct(now)
            {
                match r {
                    Ok((0, _, _)) => self.eof = true,
                    Ok((n, placed, room)) => {
                        self.work += 1;
                        self.stats.socket_reads.fetch_add(1, Ordering::Relaxed);
                        self.rx_drained = n < room;
                        self.frame_left = self.frame_left.saturating_sub(placed);
                        self.stats
                            .placed_direct
                            .fetch_add(placed as u64, Ordering::Relaxed);
                        self.in_end = n - placed;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.rx_drained = true,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        self.eof = true;
                        self.socket_failed();
                    }
                }
                // What followed the payload is fed before more is read.
                return;
            }
        }
        while self.in_end - self.in_pos < IO_HIGH {
            // Room for a large read, straight into the input buffer (its
            // memory is zeroed once, when it grows, never per read).
            if self.inbuf.len() - self.in_end < READ_CHUNK {
                if self.in_pos > 0 {
                    self.inbuf.copy_within(self.in_pos..self.in_end, 0);
                    self.in_end -= self.in_pos;
                    self.in_pos = 0;
                }
                if self.inbuf.len() - self.in_end < READ_CHUNK {
                    self.inbuf.resize(self.in_end + READ_CHUNK, 0);
                }
            }
            let mut room = (self.inbuf.len() - self.in_end).min(READ_CHUNK);
            let buffered = self.in_end - self.in_pos;
            // While large FPDUs are expected, a read stops a header's
            // worth past the FPDU being fed (a small one too: the last
            // piece of a large message, a fence): if the next one is
            // large, its payload goes straight to its place (one more,
            // small read; no copy of it).
            let head = self.large_recent > 0;
            if self.direct || head {
                // Bulk input: the rest of this FPDU and the next header
                // only, so that the next payload can go straight to its
                // place.
                room = room.min(self.frame_left.saturating_sub(buffered) + DIRECT_TAIL);
            }
            match self
                .sock
                .read(&mut self.inbuf[self.in_end..self.in_end + room])
            {
                Ok(0) => {
                    self.eof = true;
                    break;
                }
                Ok(n) => {
                    self.work += 1;
                    self.stats.socket_reads.fetch_add(1, Ordering::Relaxed);
                    // A short read took what the socket held: this pump
                    // does not ask again (level-triggered readiness, or the
                    // next poll, brings the rest).
                    self.rx_drained = n < room;
                    if self.phase != Phase::Draining {
                        self.in_end += n; // (draining: nothing more is fed)
                    }
                    // After a header's worth, fed first: a large FPDU may
                    // begin behind small ones (the answer to the peer's
                    // fence rides just ahead of its reply).
                    if self.rx_drained || self.direct || head || self.bulk_next() {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.rx_drained = true;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.eof = true;
                    self.socket_failed();
                    break;
                }
            }
        }
    }

    /// Reads the rest of the current FPDU's payload straight into its
    /// destination (the receive, or the region of an RDMA Write or Read
    /// Response) and what follows (its trailer, the next header) into the
    /// input buffer, in one vectored read: bulk payload is placed with no
    /// intermediate copy, and the engine is told with
    /// `Connection::handle_placed`. Returns (bytes read, bytes placed,
    /// room offered); `None` when it does not apply (no placement due, a
    /// small one, or memory the core does not lend): the caller reads into
    /// the buffer. The input buffer is empty when it is called.
    fn read_direct(&mut self, now: u64) -> Option<io::Result<(usize, usize, usize)>> {
        let (place, due) = self.engine.as_ref()?.rx_direct()?;
        let due = due as usize;
        if due < DIRECT_MIN {
            return None;
        }
        if self.inbuf.len() < DIRECT_TAIL {
            self.inbuf.resize(DIRECT_TAIL, 0);
        }
        let engine = self.engine.as_mut()?;
        let sock = &mut self.sock;
        let tail = &mut self.inbuf[..DIRECT_TAIL];
        let r = self.mem.lend(&place, due, |dst| {
            let room = dst.len() + tail.len();
            let n = sock.read_vectored(&mut [IoSliceMut::new(dst), IoSliceMut::new(tail)])?;
            let placed = n.min(dst.len());
            // At most what is due: always taken.
            let taken = engine.handle_placed(now, &dst[..placed]);
            debug_assert!(taken);
            Ok((n, placed, room))
        })?;
        Some(r)
    }

    /// Whether the buffered input begins a large FPDU: it is fed before
    /// more is read, so that the rest of its payload goes straight to its
    /// place ([`Conn::read_direct`]).
    fn bulk_next(&self) -> bool {
        let b = &self.inbuf[self.in_pos..self.in_end];
        self.frame_left == 0
            && b.len() >= 2
            && usize::from(u16::from_be_bytes([b[0], b[1]])) >= DIRECT_MIN
    }

    /// The socket reported an error or a hang-up (epoll's `ERR`/`HUP`,
    /// which come whatever the interest). A pump may not have read it (a
    /// full input buffer, or a Send of the peer waiting for a receive,
    /// stops the reads), so it is looked at here: a pending error or a
    /// connection closed both ways breaks an open connection now, instead
    /// of the report coming back on every wait until the reads resume.
    pub fn hung_up(&mut self) {
        if self.phase != Phase::Open || self.eof {
            return;
        }
        // (`take_error` clears the error: it is acted on here.)
        let _ = self.sock.take_error();
        self.eof = true;
        self.stall_since = None;
        self.socket_failed();
    }

    fn socket_failed(&mut self) {
        self.end_kind = ConnectionEventKind::Broken;
        if let Some(e) = self.engine.as_mut()
            && !e.is_closed()
        {
            e.handle_eof();
        }
        self.out.clear();
        self.events();
    }

    fn write_socket(&mut self) {
        if self.hold_out {
            return;
        }
        let before = self.out.writes;
        let r = self.out.write_to(&mut self.sock);
        // (Only when something was written: most pumps write nothing, and
        // the counter's line is every connection's.)
        if self.out.writes != before {
            self.stats
                .socket_writes
                .fetch_add(self.out.writes - before, Ordering::Relaxed);
        }
        match r {
            Ok(true) => {
                self.work += 1;
                if self.complete == Completion::Sent {
                    self.complete_written();
                }
            }
            Ok(false) => {}
            Err(_) => self.socket_failed(),
        }
    }

    /// [`Completion::Sent`]: Sends and Writes whose last byte the socket
    /// took succeed (the kernel holds its copy; the region may be reused).
    fn complete_written(&mut self) {
        let written = self.out.written();
        let mut any = false;
        // The engine sends its queue in post order: the first one not
        // written ends the walk.
        for s in self.slots.iter_mut() {
            if !matches!(s.kind, SlotKind::Send { .. } | SlotKind::Write { .. })
                || s.status.is_some()
            {
                continue;
            }
            if !s.sent || s.sent_at > written {
                break;
            }
            s.status = Some(DtoStatus::Success);
            any = true;
        }
        if any {
            self.complete_ready();
        }
    }

    /// Feeds buffered input to the engine, one MPA frame or FPDU (part) at
    /// a time.
    fn feed(&mut self, now: u64) {
        if self.phase != Phase::Open {
            return;
        }
        loop {
            let Some(state) = self.engine.as_ref().map(|e| e.state()) else {
                return;
            };
            let avail = self.in_end - self.in_pos;
            if avail == 0 {
                break;
            }
            let n = match state {
                State::Closed | State::Terminating => {
                    self.in_pos = self.in_end;
                    break;
                }
                State::AwaitRequest | State::AwaitReply => {
                    if self.frame_left == 0 {
                        if avail < 20 && !self.eof {
                            break;
                        }
                        let b = &self.inbuf[self.in_pos..self.in_end];
                        let pd = if b.len() >= 20 {
                            usize::from(u16::from_be_bytes([b[18], b[19]]))
                        } else {
                            0
                        };
                        self.frame_left = 20 + pd;
                    }
                    self.frame_left.min(avail)
                }
                State::AwaitRtr | State::Established => {
                    if self.frame_left == 0 {
                        match self.fpdu_start(now) {
                            Some(len) => self.frame_left = len,
                            None => break,
                        }
                    }
                    self.frame_left.min(avail)
                }
                State::Idle | State::AwaitAccept => avail,
            };
            let chunk = &self.inbuf[self.in_pos..self.in_pos + n];
            if let Some(e) = self.engine.as_mut() {
                e.handle_input(now, chunk, &mut self.mem);
            }
            self.in_pos += n;
            self.work += 1;
            self.frame_left = self.frame_left.saturating_sub(n);
            if self.frame_left == 0 {
                self.mem.rx_op = RxOp::Other;
                self.mem.pending_read = None;
            }
            self.events();
            if self.mem.fault {
                self.mem.fault = false;
                self.end_kind = ConnectionEventKind::Broken;
                if let Some(e) = self.engine.as_mut() {
                    e.abort();
                }
                self.events();
            }
        }
        if self.in_pos == self.in_end {
            self.in_pos = 0;
            self.in_end = 0;
        }
        if self.eof && self.stall_since.is_some() {
            // The peer ended while a Send of it waited for a receive: the
            // sender flushed it (its completion needs our fence answer),
            // so it is dropped. A stream cut inside an FPDU is broken.
            if !whole_fpdus(&self.inbuf[self.in_pos..self.in_end]) {
                self.end_kind = ConnectionEventKind::Broken;
            }
            self.in_pos = 0;
            self.in_end = 0;
            self.stall_since = None;
        }
        if self.eof && !self.eof_fed && self.in_pos == self.in_end && self.stall_since.is_none() {
            self.eof_fed = true;
            if let Some(e) = self.engine.as_mut() {
                e.handle_eof();
            }
            self.events();
        }
    }

    /// At an FPDU boundary: looks at the header and returns the FPDU's
    /// length, or `None` to wait (more bytes, or a receive).
    fn fpdu_start(&mut self, now: u64) -> Option<usize> {
        let len = self.fpdu_look(now);
        // Counted once an FPDU starts for good: a look that waits (for
        // the rest of its header, or for a receive) is repeated.
        if len.is_some() {
            self.large_recent = if self.direct {
                LARGE_AFTER
            } else {
                self.large_recent.saturating_sub(1)
            };
        }
        len
    }

    /// [`Conn::fpdu_start`]'s look at the header.
    fn fpdu_look(&mut self, now: u64) -> Option<usize> {
        let b = &self.inbuf[self.in_pos..self.in_end];
        let eof = self.eof;
        if b.len() < 3 {
            return (eof).then_some(b.len());
        }
        let ulpdu = usize::from(u16::from_be_bytes([b[0], b[1]]));
        let total = 2 + ulpdu + fpdu::pad_len(ulpdu) + 4;
        // Bulk input while FPDUs are large (see `read_direct`).
        self.direct = ulpdu >= DIRECT_MIN;
        let hlen = DdpHeader::len_for_control(b[2]);
        if ulpdu < hlen {
            return Some(total); // the engine refuses it
        }
        if b.len() < 2 + hlen {
            return eof.then_some(total);
        }
        let Some(h) = DdpHeader::decode(&b[2..]) else {
            return Some(total);
        };
        let op = Opcode::from_u8(h.opcode);
        self.mem.rx_op = match (h.buffer, op) {
            (Buffer::Tagged { .. }, Some(Opcode::Write)) => RxOp::Write,
            (Buffer::Tagged { .. }, Some(Opcode::ReadResponse)) => RxOp::ReadResponse,
            _ => RxOp::Other,
        };
        match (h.buffer, op) {
            (
                Buffer::Untagged { qn: 0, mo: 0, .. },
                Some(
                    Opcode::Send
                    | Opcode::SendSe
                    | Opcode::SendInvalidate
                    | Opcode::SendSeInvalidate,
                ),
            ) => {
                let rtr = self
                    .engine
                    .as_ref()
                    .is_some_and(|e| e.state() == State::AwaitRtr);
                let have = rtr || self.ensure_recv() || {
                    // The Dekker pattern with a poster (`TcpIa::kick`): it
                    // queues its receive, then reads `stalled`; this sets
                    // `stalled`, then looks again.
                    self.stalled.store(true, Ordering::SeqCst);
                    fence(Ordering::SeqCst);
                    self.ensure_recv()
                };
                if !have {
                    let since = *self.stall_since.get_or_insert(now);
                    if now < since.saturating_add(self.ia.recv_wait_ms) {
                        return None;
                    }
                    // Waited long enough: the engine refuses it (no buffer).
                } else if !rtr {
                    self.free_recvs -= 1;
                }
                self.stall_since = None;
                self.stalled.store(false, Ordering::Relaxed);
            }
            (Buffer::Untagged { qn: 1, .. }, Some(Opcode::ReadRequest)) => {
                let body = 2 + rdapl_iwarp::ddp::UNTAGGED_HEADER_LEN;
                if b.len() < body + 28 {
                    return eof.then_some(total);
                }
                if let Some(rr) = ReadRequest::decode(&b[body..body + 28])
                    && rr.size > 0
                {
                    self.mem.pending_read = Some(self.stage_read(&rr));
                }
            }
            _ => {}
        }
        Some(total)
    }

    fn stage_read(&self, rr: &ReadRequest) -> StagedRead {
        let data = match &self.ep {
            Some(ep) => {
                let src = RmrTriplet {
                    rmr_context: rr.src_stag,
                    target_address: rr.src_to,
                    segment_length: u64::from(rr.size),
                };
                ep.remote_gather(src).map(Arc::new)
            }
            None => Err(DtoStatus::RemoteAccess),
        };
        StagedRead {
            stag: rr.src_stag,
            to: rr.src_to,
            data,
        }
    }

    /// Makes sure the engine holds a free receive: takes one from the core
    /// if needed. False if there is none.
    fn ensure_recv(&mut self) -> bool {
        if self.free_recvs > 0 {
            return true;
        }
        let Some(ep) = self.ep.clone() else {
            return false;
        };
        let Some(r) = ep.take_recv(self.dat_conn) else {
            return false;
        };
        let id = self.next_id();
        let cap = u32::try_from(r.capacity()).unwrap_or(u32::MAX);
        let Some(e) = self.engine.as_mut() else {
            ep.complete_recv(r, DtoStatus::Flushed, 0);
            return false;
        };
        if e.post_recv(id, cap).is_err() {
            ep.complete_recv(r, DtoStatus::Flushed, 0);
            return false;
        }
        self.mem.recvs.insert(
            id,
            RecvState {
                wr: r,
                status: None,
            },
        );
        self.recv_order.push_back(id);
        self.free_recvs += 1;
        true
    }

    fn next_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// A receive was posted: a stalled Send may go on.
    pub fn recv_posted(&mut self, now: u64) {
        if self.stall_since.is_some() {
            self.pump(now);
        }
    }

    // ----- requests --------------------------------------------------------------

    fn established_engine(&self) -> bool {
        self.engine
            .as_ref()
            .is_some_and(|e| e.state() == State::Established)
    }

    /// Takes the core's queued requests and hands them to the engine.
    fn pull(&mut self) {
        if self.dat_conn == 0 || self.phase != Phase::Open || !self.established_engine() {
            return;
        }
        let Some(ep) = self.ep.clone() else {
            return;
        };
        // A long burst gets its fences as it goes, not one at its end: the
        // first part completes (and its sender refills) while the rest is
        // on its way.
        let mut count = 0usize;
        while self.slots.len() < MAX_INFLIGHT && self.mem.staged_bytes < MAX_STAGED {
            let wr = {
                let mut c = ep.lock();
                if c.connection() != self.dat_conn {
                    return;
                }
                match c.pop_send() {
                    Some(w) => w,
                    None => break,
                }
            };
            if !self.post(&ep, wr) {
                break;
            }
            if let Some(s) = self.slots.back()
                && matches!(s.kind, SlotKind::Send { .. } | SlotKind::Write { .. })
                && s.len < BURST_FENCE_LONG
            {
                count += 1;
                if count >= BURST_FENCE_COUNT {
                    self.maybe_fence();
                    count = 0;
                }
            }
        }
        self.maybe_fence();
    }

    /// Hands one request to the engine; false if the connection broke.
    fn post(&mut self, ep: &Arc<EpInner>, wr: Wr) -> bool {
        let id = self.next_id();
        let kind = wr.kind();
        let mut slot = Slot {
            id,
            kind: SlotKind::Local,
            wr: None,
            len: 0,
            sent: false,
            sent_at: 0,
            status: None,
        };
        let posted = match kind {
            WrKind::Local => {
                slot.wr = Some(wr);
                self.push_slot(slot);
                self.complete_ready();
                return true;
            }
            WrKind::Send | WrKind::SendInvalidate(_) | WrKind::RdmaWrite(_) => {
                // The list held by reference; an owned buffer gathered.
                let staged = match ep.gather_ref(&wr) {
                    Ok(Some(g)) => Ok(Staged::Held(Arc::new(g))),
                    Ok(None) => {
                        let mut data = self.out.freed.pop().unwrap_or_else(|| self.mem.take_buf());
                        ep.gather(&wr, &mut data)
                            .map(|()| Staged::Copied(Arc::new(data)))
                    }
                    Err(st) => Err(st),
                };
                let staged = match staged {
                    Ok(s) => s,
                    Err(st) => {
                        slot.status = Some(st);
                        slot.wr = Some(wr);
                        self.push_slot(slot);
                        self.break_local();
                        return false;
                    }
                };
                let n = match &staged {
                    Staged::Held(g) => g.len(),
                    Staged::Copied(d) => d.len(),
                };
                let Ok(len) = u32::try_from(n) else {
                    slot.status = Some(DtoStatus::LocalLength);
                    slot.wr = Some(wr);
                    self.push_slot(slot);
                    self.break_local();
                    return false;
                };
                slot.len = u64::from(len);
                self.mem.stage(id, staged);
                let Some(e) = self.engine.as_mut() else {
                    return false;
                };
                let r = match kind {
                    WrKind::RdmaWrite(rt) => {
                        slot.kind = SlotKind::Write {
                            stag: rt.rmr_context,
                            to: rt.target_address,
                            len: u64::from(len),
                        };
                        e.post_write(id, len, rt.rmr_context, rt.target_address)
                    }
                    _ => {
                        slot.kind = SlotKind::Send { msn: self.send_msn };
                        self.send_msn = self.send_msn.wrapping_add(1);
                        let se = wr.flags().contains(CompletionFlags::SOLICITED_WAIT);
                        match kind {
                            WrKind::SendInvalidate(k) => e.post_send_inv(id, len, k, se),
                            _ if se => e.post_send_se(id, len),
                            _ => e.post_send(id, len),
                        }
                    }
                };
                slot.wr = Some(wr);
                r
            }
            WrKind::RdmaRead(rt) => {
                let total = total_len(&wr);
                let Ok(size) = u32::try_from(total) else {
                    slot.status = Some(DtoStatus::LocalLength);
                    slot.wr = Some(wr);
                    self.push_slot(slot);
                    self.break_local();
                    return false;
                };
                let sink = self.alloc_sink();
                slot.kind = SlotKind::Read {
                    msn: self.read_msn,
                    sink,
                };
                self.read_msn = self.read_msn.wrapping_add(1);
                slot.len = total;
                self.mem.sinks.insert(
                    sink,
                    Sink {
                        wr,
                        len: total,
                        status: None,
                    },
                );
                let rr = ReadRequest {
                    sink_stag: sink,
                    sink_to: 0,
                    size,
                    src_stag: rt.rmr_context,
                    src_to: rt.target_address,
                };
                match self.engine.as_mut() {
                    Some(e) => e.post_read(id, rr),
                    None => return false,
                }
            }
        };
        let ok = posted.is_ok();
        if let Err(e) = &posted {
            // A remote range that wraps the address space names memory the
            // peer cannot grant: a remote access error, as the target's
            // check would give (and the loopback gives); anything else is
            // this endpoint's.
            slot.status = Some(if matches!(e, rdapl_iwarp::PostError::Wrap) {
                DtoStatus::RemoteAccess
            } else {
                DtoStatus::LocalEp
            });
        }
        self.push_slot(slot);
        if !ok {
            self.break_local();
        }
        ok
    }

    fn alloc_sink(&mut self) -> u32 {
        loop {
            let s = self.next_sink;
            self.next_sink = self.next_sink.wrapping_add(1).max(2);
            if !self.mem.sinks.contains_key(&s) {
                return s;
            }
        }
    }

    /// Posts a zero-length read behind Sends and Writes that no read
    /// covers: at once if no read is outstanding; else only while fewer
    /// than [`MAX_FENCES`] are and the uncovered requests are at least as
    /// many as those the outstanding reads will complete (the response to
    /// the last of them leads here again). A few small windows get a fence
    /// each instead of waiting a round trip for the one before; a stream
    /// that refills its window one completion at a time gets fences over
    /// batches that double, not one a request; a burst of small requests
    /// taken at once is looked at every [`BURST_FENCE_COUNT`] of them
    /// (`Conn::pull`), so its first part completes while the rest travels.
    fn maybe_fence(&mut self) {
        if self.complete == Completion::Sent || !self.fence_due {
            return;
        }
        // Sends and Writes behind the newest read, and those before it
        // that outstanding reads will complete.
        let (mut uncovered, mut covered) = (0usize, 0usize);
        let mut outstanding = 0;
        let mut seen_read = false;
        for s in self.slots.iter().rev() {
            match s.kind {
                SlotKind::Read { .. } | SlotKind::Fence { .. } => {
                    seen_read = true;
                    if s.status.is_none() {
                        outstanding += 1;
                    }
                }
                SlotKind::Send { .. } | SlotKind::Write { .. } if s.status.is_none() => {
                    if seen_read {
                        covered += 1;
                    } else {
                        uncovered += 1;
                    }
                }
                _ => {}
            }
        }
        if uncovered == 0 {
            self.fence_due = false;
            return;
        }
        let ord = self
            .engine
            .as_ref()
            .and_then(|e| e.negotiated())
            .map_or(1, |n| usize::from(n.ord));
        if !fence_now(outstanding, uncovered, covered, ord) {
            return; // (the next response leads here again)
        }
        let id = self.next_id();
        let rr = ReadRequest {
            sink_stag: FENCE_STAG,
            sink_to: 0,
            size: 0,
            src_stag: FENCE_STAG,
            src_to: 0,
        };
        let Some(e) = self.engine.as_mut() else {
            return;
        };
        if e.post_read(id, rr).is_ok() {
            self.fence_due = false;
            self.stats.fences.fetch_add(1, Ordering::Relaxed);
            self.push_slot(Slot {
                id,
                kind: SlotKind::Fence { msn: self.read_msn },
                wr: None,
                len: 0,
                sent: false,
                sent_at: 0,
                status: None,
            });
            self.read_msn = self.read_msn.wrapping_add(1);
        }
    }

    /// Completes requests from the head while their outcome is known (a
    /// memory operation runs when it reaches the head).
    fn complete_ready(&mut self) {
        let Some(ep) = self.ep.clone() else {
            return;
        };
        while let Some(s) = self.slots.front() {
            if s.kind == SlotKind::Local && s.status.is_none() {
                let mut s = self.slots.pop_front().expect("front exists");
                if let Some(wr) = s.wr.take() {
                    ep.execute_local(wr);
                }
                continue;
            }
            if s.status.is_none() {
                break;
            }
            let mut s = self.slots.pop_front().expect("front exists");
            let st = s.status.unwrap_or(DtoStatus::Flushed);
            let len = if st == DtoStatus::Success { s.len } else { 0 };
            let wr = match s.kind {
                SlotKind::Read { sink, .. } => self.mem.sinks.remove(&sink).map(|k| k.wr),
                _ => s.wr.take(),
            };
            if let Some(wr) = wr {
                ep.complete(wr, st, len);
                self.delivered += 1;
            }
        }
    }

    /// Queues a request's slot. Ids only grow, so the queue stays sorted
    /// by id and is searched by halving ([`Conn::slot_index`]).
    fn push_slot(&mut self, slot: Slot) {
        debug_assert!(self.slots.back().is_none_or(|b| b.id < slot.id));
        if matches!(slot.kind, SlotKind::Send { .. } | SlotKind::Write { .. }) {
            self.fence_due = true;
        }
        self.slots.push_back(slot);
    }

    fn slot_index(&self, id: u64) -> Option<usize> {
        self.slots.binary_search_by_key(&id, |s| s.id).ok()
    }

    fn slot_mut(&mut self, id: u64) -> Option<&mut Slot> {
        let i = self.slot_index(id)?;
        self.slots.get_mut(i)
    }

    /// A read (or fence) came back: it and everything before it is done.
    fn read_done(&mut self, id: u64) {
        let Some(i) = self.slot_index(id) else {
            return;
        };
        let mut failed = false;
        let st = match self.slots[i].kind {
            SlotKind::Read { sink, .. } => {
                let st = self
                    .mem
                    .sinks
                    .get(&sink)
                    .and_then(|k| k.status)
                    .unwrap_or(DtoStatus::Success);
                failed = st != DtoStatus::Success;
                st
            }
            _ => DtoStatus::Success,
        };
        self.slots[i].status = Some(st);
        for s in self.slots.iter_mut().take(i) {
            if matches!(s.kind, SlotKind::Send { .. } | SlotKind::Write { .. })
                && s.status.is_none()
            {
                s.status = Some(DtoStatus::Success);
            }
        }
        self.complete_ready();
        if failed {
            self.break_local();
        } else {
            self.maybe_fence();
        }
    }

    /// A local error: Terminate, both sides break.
    fn break_local(&mut self) {
        self.end_kind = ConnectionEventKind::Broken;
        if let Some(e) = self.engine.as_mut() {
            e.abort();
        }
        self.events();
    }

    /// The peer's Terminate names the request that failed.
    fn terminated(&mut self, t: &Terminate) {
        let h = t.ddp.as_ref().and_then(|d| DdpHeader::decode(&d.header));
        let culprit = h.and_then(|h| {
            self.slots.iter().position(|s| {
                s.status.is_none()
                    && match (h.buffer, s.kind) {
                        (
                            Buffer::Tagged { stag, to },
                            SlotKind::Write {
                                stag: s2,
                                to: t2,
                                len,
                            },
                        ) => stag == s2 && to >= t2 && to <= t2.saturating_add(len),
                        (Buffer::Untagged { qn: 0, msn, .. }, SlotKind::Send { msn: m }) => {
                            msn == m
                        }
                        (
                            Buffer::Untagged { qn: 1, msn, .. },
                            SlotKind::Read { msn: m, .. } | SlotKind::Fence { msn: m },
                        ) => msn == m,
                        _ => false,
                    }
            })
        });
        // On `sent`, Sends and Writes complete once written: one the
        // Terminate names may have succeeded already, and then no other
        // request is to blame.
        let named = h.is_some() && self.complete == Completion::Sent;
        // A Terminate that names no message (a peer's local error while it
        // placed one, sent as "local catastrophic" without a DDP header):
        // the peer handles requests in order, so the oldest one it has not
        // confirmed is the one that failed.
        let culprit = culprit.or_else(|| {
            if named {
                return None;
            }
            self.slots
                .iter()
                .position(|s| s.status.is_none() && !matches!(s.kind, SlotKind::Fence { .. }))
        });
        let Some(i) = culprit else {
            return;
        };
        let c = t.code;
        let st = if (c.layer == layer::RDMAP && c.etype == trdmap::ETYPE_REMOTE_PROTECTION)
            || (c.layer == layer::DDP && c.etype == tddp::ETYPE_TAGGED)
        {
            DtoStatus::RemoteAccess
        } else if c.layer == layer::DDP
            && c.etype == tddp::ETYPE_UNTAGGED
            && c.ecode == tddp::UT_MSN_NOBUF
        {
            DtoStatus::ReceiverNotReady
        } else {
            DtoStatus::RemoteResponder
        };
        for s in self.slots.iter_mut().take(i) {
            if matches!(s.kind, SlotKind::Send { .. } | SlotKind::Write { .. })
                && s.status.is_none()
                && s.sent
            {
                s.status = Some(DtoStatus::Success);
            }
        }
        self.slots[i].status = Some(st);
    }

    // ----- transmit and events ---------------------------------------------------

    fn transmit(&mut self) {
        if self.phase == Phase::Dead {
            return;
        }
        // Past IO_HIGH only to finish the message being framed: a large
        // message leaves in writes of up to OUT_MESSAGE_MAX.
        let mut high = IO_HIGH;
        while self.out.len() < high {
            let Some(e) = self.engine.as_mut() else {
                return;
            };
            let Some(t) = e.poll_transmit(&self.mem) else {
                break;
            };
            self.work += 1;
            high = match &t {
                Transmit::Fpdu { header, .. } if !header.last() => OUT_MESSAGE_MAX,
                _ => IO_HIGH,
            };
            if !self.queue(&t) {
                // The engine checked the source; this does not happen.
                self.break_local();
            }
            if let Transmit::Fpdu {
                payload: Some(Source::Region { stag, to, len }),
                ..
            } = t
            {
                self.mem.response_sent(stag, to, len);
            }
            self.events();
        }
    }

    /// Queues what the engine transmits: a Send's or Write's payload by
    /// reference to its gathered bytes, the rest copied. False if `mem`
    /// lacks the payload.
    fn queue(&mut self, t: &Transmit) -> bool {
        match t {
            Transmit::Mpa(b) => self.out.push_bytes(b),
            Transmit::Fpdu {
                header,
                payload,
                trailer,
            } => {
                self.out.push_bytes(header);
                match payload {
                    None => {}
                    Some(Source::Local { wr_id, offset, len }) => {
                        let start = *offset as usize;
                        let end = start + *len as usize;
                        let ok = match self.mem.staged.get(wr_id) {
                            Some(Staged::Copied(d)) => self.out.push_shared(d, start, end),
                            // A small message: copied, so that messages
                            // posted together share a write.
                            Some(Staged::Held(g)) if g.len() <= crate::outq::COPY_MESSAGE_MAX => {
                                self.out.push_copied(g, start, end)
                            }
                            Some(Staged::Held(g)) => {
                                self.count_held(end - start);
                                self.out.push_held(g, start, end)
                            }
                            None => false,
                        };
                        if !ok {
                            return false;
                        }
                    }
                    Some(Source::Region { stag, to, len }) => {
                        let Some((g, off)) = self.mem.response(*stag, *to) else {
                            return false;
                        };
                        let Some((s, e)) = crate::memory::range(off, *len, g.len()) else {
                            return false;
                        };
                        let g = g.clone();
                        self.count_held(e - s);
                        if !self.out.push_held(&g, s, e) {
                            return false;
                        }
                    }
                }
                self.out.push_bytes(trailer);
            }
        }
        true
    }

    /// Counts `n` payload bytes queued from registered memory (those that
    /// go by reference, not copied).
    fn count_held(&self, n: usize) {
        if n >= crate::outq::SHARE_MIN {
            self.stats
                .sent_direct
                .fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// Handles the engine's events.
    fn events(&mut self) {
        loop {
            let Some(ev) = self.engine.as_mut().and_then(|e| e.poll_event()) else {
                return;
            };
            self.work += 1;
            self.event(ev);
        }
    }

    fn event(&mut self, ev: Event) {
        match ev {
            Event::ConnectRequest(req) => {
                let sp = self
                    .sp
                    .as_ref()
                    .and_then(Weak::upgrade)
                    .filter(|s| !s.freed());
                let token = self.token;
                let ops = |sh: &Arc<crate::progress::Shared>| {
                    Box::new(crate::TcpCr {
                        sh: sh.clone(),
                        token,
                    }) as Box<dyn rdapl::provider::CrOps>
                };
                let req_sp = sp.zip(self.shared.as_ref());
                match req_sp.map(|(sp, sh)| sp.request(self.peer.0, req.private_data, ops(sh))) {
                    Some(Ok(cr)) => self.cr = Some(cr),
                    // Nobody to take it: drop the TCP connection (the
                    // active side sees a non-peer reject).
                    _ => {
                        if let Some(e) = self.engine.as_mut() {
                            e.close();
                        }
                    }
                }
            }
            Event::Established { private_data, .. } => {
                self.connect_deadline = None;
                let Some(ep) = self.ep.clone() else {
                    return self.abort_engine();
                };
                let pd = (self.role == Role::Initiator).then_some(&private_data[..]);
                match ep.established(self.peer, pd) {
                    Some(c) => {
                        self.dat_conn = c;
                        self.told = true;
                        if let Some(cell) = self.hook.as_ref().and_then(Weak::upgrade) {
                            cell.join_groups(&ep);
                        }
                        if let Some(n) = self.engine.as_ref().and_then(|e| e.negotiated()) {
                            // A peer that takes no reads (IRD 0) cannot be
                            // asked for proof of placement: Sends and
                            // Writes complete once TCP has them.
                            if n.ord == 0 {
                                self.complete = Completion::Sent;
                            }
                            if n.rtr == Some(Rtr::Send) {
                                self.send_msn = 2;
                            }
                            if n.rtr == Some(Rtr::Read) {
                                self.read_msn = 2;
                            }
                        }
                    }
                    None => {
                        self.told = true;
                        self.abort_engine();
                    }
                }
            }
            Event::Rejected { private_data } => {
                self.setup_fail = (ConnectionEventKind::PeerRejected, Some(private_data));
            }
            Event::RecvComplete {
                wr_id,
                len,
                solicited,
                invalidated,
            } => {
                self.recv_order.retain(|&i| i != wr_id);
                if let Some(mut r) = self.mem.recvs.remove(&wr_id) {
                    let st = r.status.unwrap_or(DtoStatus::Success);
                    if solicited {
                        r.wr.set_solicited();
                    }
                    let n = if st == DtoStatus::Success {
                        u64::from(len)
                    } else {
                        0
                    };
                    if let Some(ep) = &self.ep {
                        match invalidated {
                            Some(k) if st == DtoStatus::Success => {
                                ep.complete_recv_invalidated(r.wr, n, k)
                            }
                            _ => ep.complete_recv(r.wr, st, n),
                        }
                        self.delivered += 1;
                    }
                    if st != DtoStatus::Success {
                        self.break_local();
                    }
                }
            }
            Event::SendComplete { wr_id } => {
                self.mem.unstage(wr_id);
                // Its last byte is queued: the queue's position now.
                let at = self.out.pushed();
                if let Some(s) = self.slot_mut(wr_id) {
                    s.sent = true;
                    s.sent_at = at;
                }
            }
            Event::ReadComplete { wr_id, .. } => self.read_done(wr_id),
            Event::Flushed { wr_id } => {
                self.mem.unstage(wr_id);
                if let Some(r) = self.mem.recvs.remove(&wr_id) {
                    self.recv_order.retain(|&i| i != wr_id);
                    let st = r.status.unwrap_or(DtoStatus::Flushed);
                    if let Some(ep) = &self.ep {
                        ep.complete_recv(r.wr, st, 0);
                    }
                } else if let Some(s) = self.slot_mut(wr_id)
                    && s.status.is_none()
                {
                    s.status = Some(DtoStatus::Flushed);
                }
            }
            Event::TerminateReceived(t) => {
                self.end_kind = ConnectionEventKind::Broken;
                self.terminated(&t);
            }
            Event::Error(e) => {
                self.end_kind = ConnectionEventKind::Broken;
                match e {
                    ConnError::Mpa(rdapl_iwarp::MpaError::Timeout) => {
                        self.setup_fail = (ConnectionEventKind::TimedOut, None)
                    }
                    ConnError::Protocol(ProtocolError::MessageTooLong { .. }) => {
                        if let Some(&id) = self.recv_order.front()
                            && let Some(r) = self.mem.recvs.get_mut(&id)
                        {
                            r.status.get_or_insert(DtoStatus::LocalLength);
                        }
                    }
                    _ => {}
                }
            }
            Event::Closed => {
                let now = 0; // finalize does not read the clock
                self.finalize(now);
            }
        }
    }

    fn abort_engine(&mut self) {
        if let Some(e) = self.engine.as_mut() {
            e.abort();
        }
    }

    /// Ends this side on the consumer's word (disconnect or free).
    pub fn close_local(&mut self, now: u64) {
        if self.phase == Phase::Connecting {
            self.finalize(now);
            return;
        }
        if let Some(e) = self.engine.as_mut() {
            if !e.is_closed() {
                e.close();
            }
        } else {
            self.finalize(now);
        }
        self.events();
        self.pump(now);
    }

    /// The link fails (fault injection): nothing more is read or written,
    /// the socket is reset when it closes (linger 0: the peer's next read
    /// fails, and it breaks too), every request is flushed and the core
    /// hears `Broken`.
    pub fn break_link(&mut self, now: u64) {
        if matches!(self.phase, Phase::Connecting | Phase::Dead) {
            return self.close_local(now);
        }
        let _ = socket2::SockRef::from(&self.sock).set_linger(Some(std::time::Duration::ZERO));
        self.eof = true;
        // No FIN: the socket is only reset, when it closes.
        self.shut = true;
        self.socket_failed();
        self.pump(now);
    }

    /// Accept (passive side): answer the request.
    pub fn accept(&mut self, ep: &Arc<EpInner>, pd: &[u8], now: u64) -> bool {
        self.bind_ep(ep);
        self.cr = None;
        let ok = self.engine.as_mut().is_some_and(|e| {
            let (ird, ord) = read_depths(ep);
            e.accept(now, pd, Some(ird), Some(ord)).is_ok()
        });
        if !ok {
            self.end_kind = ConnectionEventKind::AcceptCompletionError;
            self.close_local(now);
        }
        self.events();
        self.pump(now);
        ok
    }

    /// Reject (passive side): answer the request with the reject.
    pub fn reject(&mut self, pd: &[u8], now: u64) {
        self.cr = None;
        if let Some(e) = self.engine.as_mut()
            && e.reject(pd).is_err()
        {
            e.close();
        }
        self.events();
        self.pump(now);
    }

    /// The engine closed (or never started): complete what is in flight,
    /// tell the core, and drain the socket.
    pub fn finalize(&mut self, _now: u64) {
        if matches!(self.phase, Phase::Draining | Phase::Dead) {
            return;
        }
        self.phase = Phase::Draining;
        self.connect_deadline = None;
        self.stall_since = None;
        for s in self.slots.iter_mut() {
            s.status.get_or_insert(DtoStatus::Flushed);
        }
        self.complete_ready();
        // A memory operation at the head ran; the rest are flushed.
        let ep = self.ep.clone();
        while let Some(mut s) = self.slots.pop_front() {
            let wr = match s.kind {
                SlotKind::Read { sink, .. } => self.mem.sinks.remove(&sink).map(|k| k.wr),
                _ => s.wr.take(),
            };
            if let (Some(wr), Some(ep)) = (wr, &ep) {
                ep.complete(wr, DtoStatus::Flushed, 0);
            }
        }
        while let Some(id) = self.recv_order.pop_front() {
            if let (Some(r), Some(ep)) = (self.mem.recvs.remove(&id), &ep) {
                ep.complete_recv(r.wr, r.status.unwrap_or(DtoStatus::Flushed), 0);
            }
        }
        self.mem.staged.clear();
        self.mem.staged_bytes = 0;
        self.mem.responses.clear();
        if let Some(ep) = ep {
            if self.dat_conn != 0 {
                if ep.lock().connection() == self.dat_conn {
                    ep.ended(self.end_kind);
                }
            } else if !self.told {
                match self.role {
                    Role::Initiator => {
                        let (k, pd) = self.setup_fail.clone();
                        ep.connect_failed(k, pd.as_deref());
                    }
                    Role::Responder => {
                        ep.ended(ConnectionEventKind::AcceptCompletionError);
                    }
                }
            }
        }
        self.told = true;
        if let Some(cr) = self.cr.take() {
            cr.settle_as(CrState::Cancelled);
        }
        self.ep = None;
        self.mem.ep = None;
    }

    /// Draining: once the output is out, half-close; once the peer's end
    /// is seen (or the linger time passes), the connection is dead.
    fn check_end(&mut self, now: u64) {
        if self.phase != Phase::Draining {
            return;
        }
        if self.linger_deadline.is_none() {
            self.linger_deadline = Some(now.saturating_add(self.ia.linger_ms));
        }
        if self.out.is_empty() && !self.shut {
            self.shut = true;
            let _ = self.sock.shutdown(Shutdown::Write);
        }
        if self.shut && self.eof {
            self.phase = Phase::Dead;
        }
    }

    /// TCP connected (active side): start MPA.
    pub fn start_mpa(&mut self, now: u64) {
        self.phase = Phase::Open;
        let cfg = self.engine_config();
        match Connection::new(Role::Initiator, cfg, now) {
            Ok(mut e) => {
                let ok = e.connect(now, &self.connect_pd).is_ok();
                self.engine = Some(e);
                if !ok {
                    self.close_local(now);
                    return;
                }
            }
            Err(_) => {
                self.finalize(now);
                return;
            }
        }
        self.pump(now);
    }

    /// An active attempt failed before MPA (refused, unreachable).
    pub fn connect_failed(&mut self, kind: ConnectionEventKind, now: u64) {
        self.setup_fail = (kind, None);
        self.phase = Phase::Open;
        self.finalize(now);
        self.phase = Phase::Dead;
    }
}

#[cfg(test)]
mod tests {
    use super::MAX_FENCES;

    fn fence_now(outstanding: usize, uncovered: usize, covered: usize) -> bool {
        super::fence_now(outstanding, uncovered, covered, 16)
    }

    #[test]
    fn fences_stay_within_the_ord() {
        // ORD 1: one read in flight, whatever is uncovered.
        assert!(super::fence_now(0, 1, 0, 1));
        assert!(!super::fence_now(1, 100, 1, 1));
        assert!(super::fence_now(1, 2, 2, 2));
        assert!(!super::fence_now(2, 4, 4, 2));
    }

    #[test]
    fn fences_cover_batches_that_double() {
        // Nothing outstanding: at once, whatever it covers.
        assert!(fence_now(0, 1, 0));
        // Two one-request windows: a fence each (no round trip lost).
        assert!(fence_now(1, 1, 1));
        // A window refilled one completion at a time: the next fence
        // waits until it covers as many as the outstanding ones do.
        assert!(!fence_now(2, 1, 2));
        assert!(fence_now(2, 2, 2));
        assert!(!fence_now(3, 3, 4));
        assert!(fence_now(3, 4, 4));
        // Never more than MAX_FENCES in flight.
        assert!(!fence_now(MAX_FENCES, 100, 1));
        // Simulated: a 16-request window refilled one at a time, no
        // response coming back meanwhile, takes a handful of fences.
        let (mut fences, mut covered, mut uncovered) = (0usize, 0usize, 0usize);
        for _ in 0..16 {
            uncovered += 1;
            if fence_now(fences, uncovered, covered) {
                fences += 1;
                covered += uncovered;
                uncovered = 0;
            }
        }
        assert_eq!((fences, covered + uncovered), (4, 16));
        assert!(covered >= 8, "{covered}");
    }
}
