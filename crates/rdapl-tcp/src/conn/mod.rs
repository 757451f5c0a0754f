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
//!   Only a Send the engine would take but for the receive waits
//!   (`Connection::needs_recv`): a malformed one is refused at once.
//! * **No frame waits forever.** A partial FPDU (its header or payload
//!   incomplete) on which no byte arrives for the IA's `timeout_ms` breaks
//!   the connection with an MPA Terminate (bad FPDU start): a peer stopped
//!   mid-frame, or a length corrupted past the CRC's reach (a longer one
//!   waits for bytes that never come), would otherwise hold every request
//!   of the connection, on both sides, with no end.
//! * **No answer waits forever.** While a read or fence of ours is
//!   unanswered, a peer from which no byte came and to which the socket
//!   took none for `timeout_ms` (since the request was queued, at the
//!   earliest) breaks the connection with an MPA Terminate (stream lost):
//!   a peer process stopped or hung while its kernel still acknowledges,
//!   or a middlebox that swallows frames, would otherwise leave the read,
//!   and on `placed` the Sends and Writes before the fence, waiting with
//!   no end. Bytes waiting in the socket count as an answer coming (a
//!   polling consumer that paused has not read them yet), and bytes of
//!   ours the kernel is still delivering (in flight and acknowledged
//!   within the timeout) as bytes going: on a slow path the answer comes
//!   behind a large message's last bytes, long after they were written.
//!   The first FPDU of an initiator that negotiated no RTR is owed so
//!   too while requests of ours wait for it (a responder sends nothing
//!   before it, RFC 5044 §7.1.2): on `sent` no fence would ask.
//! * **No silent peer outlives the timeout.** A peer from which nothing
//!   came for `timeout_ms` while it is asked (a retransmission, a window
//!   probe or a keepalive probe unanswered, or bytes of ours half a
//!   timeout old; an idle connection asks with a heartbeat, a zero-length
//!   read, after half a timeout) breaks the connection then, with an MPA
//!   Terminate (stream lost), not when the kernel's own timers come round
//!   to it (`liveness`). A heartbeat's answer is not owed as a read's is:
//!   a stopped peer process whose kernel acknowledges stays connected,
//!   and no request posted behind the heartbeat waits for its answer.
//! * **An ending connection completes at once.** Its requests are
//!   flushed as soon as it ends, also when its Terminate must wait behind
//!   bytes a full socket does not take.
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
//!
//! # Layout
//!
//! This file holds the connection's state and the pump that drives it;
//! each concern of the pump is a module of its own: `input` (reading and
//! feeding), `requests` (work requests, fences, completions),
//! `output` (framing and writing), `events` (what the engine reports)
//! and `lifecycle` (setup, accept, reject, disconnect, the end).

use crate::memory::ConnMemory;
use crate::outq::OutQueue;
use crate::params::{Completion, IaParams};
use rdapl::provider::{Attempt, CrInner, EpInner, SpInner, Wr};
use rdapl::{ConnectionEventKind, DtoStatus};
use rdapl_iwarp::{Connection, Role, State};
use std::collections::VecDeque;
use std::net::{IpAddr, TcpStream};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};

/// Logs an event of connection `$c` (a `Conn`) at `$level`, with its
/// number, the peer's address and the qualifier as fields (the crate's
/// "Logs"), then the event's own fields and message.
macro_rules! conn_log {
    ($level:ident, $c:expr, $($rest:tt)+) => {
        tracing::$level!(conn = $c.token, peer = %$c.peer.0, qual = $c.peer.1, $($rest)+)
    };
}

mod events;
mod input;
mod lifecycle;
mod liveness;
mod output;
mod requests;

/// Most requests one connection takes from the core's queue at once.
pub(crate) const MAX_INFLIGHT: usize = 512;
/// Most gathered bytes one connection stages at once.
pub(crate) const MAX_STAGED: usize = 16 << 20;
/// Input and output buffer high-water mark.
pub(crate) const IO_HIGH: usize = 256 << 10;

/// How often (ms) a pumped connection looks at its socket's MSS
/// (`Conn::follow_mss`).
const MSS_LOOK_MS: u64 = 100;

/// Most rounds (read, feed, pull, transmit, write) of one pump. A
/// connection that keeps moving, its consumer refilling a stream as fast
/// as it completes while the socket takes every byte, would otherwise
/// keep the thread that pumps it for as long as the stream lasts: no
/// timer, no other connection and no connection set-up of that thread
/// would come round. Stopped here, it is due again at once
/// ([`Conn::deadline`]): its thread pumps it on after the rest of its
/// work.
const PUMP_ROUNDS: u32 = 16;

/// Most output bytes a polling consumer's pass holds back.
const HOLD_MAX: usize = 4096;

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

impl Slot {
    /// A Send or Write handed to TCP in full whose outcome is not known
    /// yet (on `placed`: the proof of its placement is awaited).
    fn sent_unfinished(&self) -> bool {
        matches!(self.kind, SlotKind::Send { .. } | SlotKind::Write { .. })
            && self.sent
            && self.status.is_none()
    }
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
    /// Active side: the endpoint's attempt this connection makes (its
    /// outcome is reported under it).
    pub attempt: Attempt,
    pub connect_deadline: Option<u64>,
    /// The core's connection number (0 until established).
    pub dat_conn: u64,
    told: bool,
    /// The consumer gave up the connect (freed or disconnected its
    /// endpoint) before it was set up.
    given_up: bool,
    /// How an active attempt failed, with the reject's private data.
    setup_fail: (ConnectionEventKind, Option<Vec<u8>>),
    /// The socket's error, if that is how the attempt failed (logged).
    setup_why: Option<String>,
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
    /// [`input::LARGE_AFTER`] at the start and by a large FPDU, less one
    /// by each small one).
    large_recent: u8,
    eof: bool,
    eof_fed: bool,
    stall_since: Option<u64>,
    /// When a read last brought bytes (ms): a partial frame times out
    /// `timeout_ms` after it ([`Conn::frame_deadline`]).
    rx_last: u64,
    /// When the socket last took output bytes (ms).
    tx_last: u64,
    /// A Send of the peer arrived since our last Send or Write was framed:
    /// what we send next answers it ([`output`]'s early write).
    peer_spoke: bool,
    /// Reads and fences among `slots` (outstanding, or answered and about
    /// to complete), and since when there have been some (ms).
    reads_queued: usize,
    awaiting_since: u64,
    /// When to look whether an answer is overdue ([`Conn::answer_deadline`]):
    /// set when reads come to be queued and kept until it passes, so that
    /// a read a round trip does not move the timer each time.
    answer_check: Option<u64>,
    /// When to look at the kernel's state for a silent peer
    /// ([`Conn::look_alive`]): set once the stream is established, then
    /// from each look. `live_off` once the kernel cannot say.
    live_check: Option<u64>,
    live_off: bool,
    /// The heartbeat not answered yet (`liveness`): its request's id and
    /// when it was posted. Its answer is not owed as a read's is: a live
    /// kernel acknowledging it is the evidence, and a peer process that
    /// is stopped answers it once it runs again.
    heartbeat_sent: Option<(u64, u64)>,
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
    free_recvs: usize,
    next_id: u64,
    next_sink: u32,
    /// A short Send's or Write's payload, gathered to be posted inline.
    inline_buf: Vec<u8>,
    send_msn: u32,
    read_msn: u32,
    /// Counts every step that moved something (bytes read, fed, queued or
    /// written; events): `pump` goes on while it moves, for at most
    /// [`PUMP_ROUNDS`] rounds.
    work: u64,
    /// When (ms) the last pump stopped after [`PUMP_ROUNDS`] while it
    /// still moved: the connection is due again then.
    more: Option<u64>,
    /// A Send of the peer waits for a receive: a posted receive must kick
    /// (read by posters without the lock; see `fpdu_start`).
    pub stalled: Arc<AtomicBool>,
    /// The epoll interest registered (`None`: not registered).
    pub registered: Option<(bool, bool)>,
    /// A consumer drives the input: the progress thread does not poll for
    /// it ([`crate::progress`]).
    pub polled: bool,
    /// Reads of the socket that brought bytes, by anyone.
    pub reads: u64,
    /// A consumer's pass took input while not `polled` and asked the
    /// thread to leave the input to it (`Cmd::Adopt`); cleared by the
    /// thread's answer.
    pub adopt_asked: bool,
    /// Its own cell: it joins the groups of the endpoint's EVDs once
    /// established ([`crate::group`]).
    pub hook: Option<Weak<crate::progress::ConnCell>>,
    /// Completions delivered to the core so far.
    delivered: u64,
    /// Requests completed `Flushed` so far (said when the connection
    /// ends).
    flushed: u64,
    /// A request completed `Flushed`: every later one does too
    /// ([`Conn::complete_ready`]).
    flushing: bool,
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
    /// The provider's connections whose peer's Send waits for an SRQ's
    /// receive, and whether this one is among them.
    pub srq_waits: Arc<crate::progress::SrqWaits>,
    srq_waiting: bool,
    /// The provider's shared state (a responder's requests answer through
    /// it).
    pub shared: Option<Arc<crate::progress::Shared>>,
    /// When (ms) `follow_mss` looks at the socket's MSS next.
    mss_look_at: u64,
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

impl Drop for Conn {
    fn drop(&mut self) {
        // Not counted among the connections waiting for an SRQ's receive
        // past its end, however it ended.
        self.srq_wait(false);
    }
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
            attempt: Attempt::default(),
            connect_deadline: None,
            dat_conn: 0,
            told: false,
            given_up: false,
            setup_fail: (ConnectionEventKind::NonPeerRejected, None),
            setup_why: None,
            end_kind: ConnectionEventKind::Disconnected,
            inbuf: Vec::new(),
            in_end: 0,
            in_pos: 0,
            frame_left: 0,
            direct: false,
            // (a first message may be large too)
            large_recent: input::LARGE_AFTER,
            eof: false,
            eof_fed: false,
            stall_since: None,
            rx_last: 0,
            peer_spoke: false,
            tx_last: 0,
            reads_queued: 0,
            awaiting_since: 0,
            answer_check: None,
            live_check: None,
            live_off: false,
            heartbeat_sent: None,
            out: OutQueue::default(),
            shut: false,
            linger_deadline: None,
            slots: VecDeque::new(),
            fence_due: false,
            free_recvs: 0,
            next_id: 1,
            next_sink: 2,
            inline_buf: Vec::with_capacity(rdapl_iwarp::fpdu::INLINE_MAX),
            send_msn: 1,
            read_msn: 1,
            work: 0,
            stalled: Arc::new(AtomicBool::new(false)),
            registered: None,
            polled: false,
            reads: 0,
            adopt_asked: false,
            hook: None,
            delivered: 0,
            flushed: 0,
            flushing: false,
            rx_drained: false,
            hold_out: false,
            out_held: false,
            complete,
            stats: Arc::default(),
            srq_waits: Arc::default(),
            srq_waiting: false,
            shared: None,
            mss_look_at: 0,
            more: None,
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
        [
            self.connect_deadline,
            stall,
            self.linger_deadline,
            self.frame_deadline(),
            self.answer_check,
            self.live_check.filter(|_| self.phase == Phase::Open),
            self.more,
        ]
        .into_iter()
        .fold(engine, earliest)
    }

    /// When the frame being received times out: `timeout_ms` after the
    /// last byte came, while a frame is begun and not whole (its payload
    /// being fed, or a header's first bytes buffered).
    fn frame_deadline(&self) -> Option<u64> {
        (self.listening() && (self.frame_left > 0 || self.in_pos < self.in_end))
            .then(|| self.rx_last.saturating_add(self.ia.timeout_ms))
    }

    /// Reads and fences of ours whose answers are owed: those queued but
    /// a heartbeat. And one more while requests of ours wait for the
    /// peer's first FPDU (a responder sends nothing before it, and
    /// without an RTR it is established before it): on `sent` no fence
    /// asks for it, and a live peer's kernel answers keepalive, so
    /// nothing else would ever end that wait.
    fn answers_owed(&self) -> usize {
        let reads = self
            .reads_queued
            .saturating_sub(usize::from(self.heartbeat_sent.is_some()));
        reads + usize::from(self.first_fpdu_owed())
    }

    /// Requests of ours (a heartbeat aside) wait for the peer's first
    /// FPDU.
    fn first_fpdu_owed(&self) -> bool {
        self.engine.as_ref().is_some_and(|e| e.awaits_first_fpdu())
            && self.slots.iter().any(|s| {
                !matches!(s.kind, SlotKind::Local)
                    && self.heartbeat_sent.is_none_or(|(id, _)| id != s.id)
            })
    }

    /// When an answer owed to us is overdue: while reads or fences are
    /// queued, `timeout_ms` after the last byte came or went, or after the
    /// first of them was queued if that is later.
    fn answer_deadline(&self) -> Option<u64> {
        (self.listening() && self.answers_owed() > 0).then(|| {
            let last = self.rx_last.max(self.tx_last).max(self.awaiting_since);
            last.saturating_add(self.ia.timeout_ms)
        })
    }

    /// Expecting bytes of the peer: open and reading (not held back by a
    /// Send that waits for a receive), the stream established.
    fn listening(&self) -> bool {
        self.phase == Phase::Open
            && !self.eof
            && self.stall_since.is_none()
            && self
                .engine
                .as_ref()
                .is_some_and(|e| matches!(e.state(), State::Established | State::AwaitRtr))
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

    /// Leaves the connection's work to its thread: due at once (a pump's
    /// budget spent, see `progress::cell`).
    pub fn defer(&mut self, now: u64) {
        self.more = Some(now);
    }

    fn pump_inner(&mut self, now: u64) {
        self.more = None;
        if matches!(self.phase, Phase::Connecting | Phase::Dead) {
            return;
        }
        if !self.hold_out {
            self.out_held = false;
        }
        self.follow_mss(now);
        let (writes, reads) = (self.out.writes, self.answers_owed());
        for round in 1.. {
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
            if round == PUMP_ROUNDS {
                self.more = Some(now);
                break;
            }
        }
        if self.out.writes != writes {
            self.tx_last = now;
        }
        let owed = self.answers_owed();
        if reads == 0 && owed > 0 {
            self.awaiting_since = now;
        }
        if owed > 0 && self.answer_check.is_none() {
            self.answer_check = Some(now.saturating_add(self.ia.timeout_ms));
        }
        if self.live_check.is_none()
            && !self.live_off
            && self.phase == Phase::Open
            && self.established_engine()
        {
            self.live_check = Some(now.saturating_add((self.ia.timeout_ms / 2).max(1)));
        }
    }

    /// Looks whether the peer fell silent ([`liveness`]): breaks the
    /// connection if so, else sets when to look again.
    fn look_alive(&mut self, now: u64) {
        self.live_check = None;
        if self.phase != Phase::Open || !self.established_engine() {
            return;
        }
        let s = match crate::sockinfo::snapshot(&self.sock) {
            Ok(s) => s,
            Err(e) => {
                // The kernel's own timers are left to it.
                conn_log!(debug, self, error = %e, "no TCP_INFO: no watchdog");
                self.live_off = true;
                return;
            }
        };
        let keepalive = crate::cm::keepalive_ms(self.ia.timeout_ms);
        let can_ask = self.slots.is_empty() && self.listening() && self.may_read();
        // How long our heartbeat has gone unanswered, if it has.
        let asked_ms = self.heartbeat_sent.map(|(_, at)| now.saturating_sub(at));
        let verdict = liveness::judge(&s, self.ia.timeout_ms, keepalive, can_ask, asked_ms);
        match verdict {
            liveness::Verdict::Again(ms) => self.live_check = Some(now.saturating_add(ms)),
            liveness::Verdict::Ask(ms) => {
                if let Some(id) = self.heartbeat() {
                    conn_log!(trace, self, silent_ms = s.silent_ms, "heartbeat");
                    self.heartbeat_sent = Some((id, now));
                }
                self.live_check = Some(now.saturating_add(ms));
            }
            liveness::Verdict::Silent => {
                conn_log!(
                    warn,
                    self,
                    timeout_ms = self.ia.timeout_ms,
                    silent_ms = s.silent_ms,
                    unacked = s.unacked,
                    unsent = s.notsent,
                    probes = s.probes,
                    retransmits = s.retransmits,
                    "the peer fell silent, asked and not answering: the connection breaks"
                );
                self.break_silent(rdapl_iwarp::terminate::llp::TCP_STREAM_LOST);
            }
        }
    }

    /// Breaks the connection of a peer that fell silent, with an MPA
    /// Terminate of code `code`.
    fn break_silent(&mut self, code: u8) {
        self.end_kind = ConnectionEventKind::Broken;
        if let Some(e) = self.engine.as_mut() {
            e.abort_with(rdapl_iwarp::terminate::llp(code));
        }
        self.events();
    }

    /// RFC 5044's MULPDU follows the connection's current MSS: where the
    /// path's MTU fell, the FPDUs framed from now on fit the smaller MSS
    /// (hardware peers place an FPDU directly only if it fits a segment).
    /// A larger MSS is not followed (larger FPDUs moved 1 MiB messages
    /// slower: `rdapl-bench/HISTORY.md`). Looked at once every
    /// [`MSS_LOOK_MS`] while the connection is pumped, and not where the
    /// IA fixed `mss`.
    fn follow_mss(&mut self, now: u64) {
        if now < self.mss_look_at || self.ia.mss.is_some() || self.phase != Phase::Open {
            return;
        }
        self.mss_look_at = now.saturating_add(MSS_LOOK_MS);
        let Some(e) = self.engine.as_mut() else {
            return;
        };
        let Ok(m) = socket2::SockRef::from(&self.sock).tcp_mss() else {
            return;
        };
        let was = e.config().mss;
        if m >= was || m < 64 || e.set_mss(m).is_err() {
            return;
        }
        self.stats
            .mss_shrinks
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        conn_log!(
            info,
            self,
            from = was,
            to = m,
            "the path's MSS fell: FPDUs follow it"
        );
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
            conn_log!(info, self, "connect timed out (the consumer's timeout)");
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
        if self.answer_check.is_some_and(|d| now >= d) {
            // Looked at again when the answer would be overdue, if one is
            // still owed.
            self.answer_check = self.answer_deadline();
        }
        let why = if self.frame_deadline().is_some_and(|d| now >= d) {
            Some(rdapl_iwarp::terminate::llp::FPDU_START)
        } else if self.answer_check.is_some_and(|d| now >= d) {
            Some(rdapl_iwarp::terminate::llp::TCP_STREAM_LOST)
        } else {
            None
        };
        if let Some(code) = why {
            if self.socket_has_input() {
                // The peer is not silent: its bytes (or its end) are not
                // read yet. (An error the socket held broke it just now.)
                self.rx_last = now;
                self.answer_check = self.answer_deadline();
            } else {
                // What the kernel sees, read once: it decides an overdue
                // answer, and goes with a break to explain it later.
                let snap = crate::sockinfo::snapshot(&self.sock).ok();
                let leaving = snap
                    .filter(|_| code == rdapl_iwarp::terminate::llp::TCP_STREAM_LOST)
                    .and_then(|s| liveness::still_sending(&s, self.ia.timeout_ms));
                if let Some(ago) = leaving {
                    // The kernel still delivers bytes of ours (a slow
                    // path drains a large message, a slow peer takes it):
                    // the answer comes behind them, a timeout after the
                    // last went.
                    self.tx_last = self.tx_last.max(now.saturating_sub(ago));
                    self.answer_check = self.answer_deadline();
                } else {
                    // No byte for `timeout_ms`: none will come.
                    let s = snap.unwrap_or_default();
                    conn_log!(
                        warn,
                        self,
                        timeout_ms = self.ia.timeout_ms,
                        unacked = s.unacked,
                        unsent = s.notsent,
                        silent_ms = s.silent_ms,
                        sent_ms = s.sent_ms,
                        "the peer fell silent {}: the connection breaks",
                        if code == rdapl_iwarp::terminate::llp::FPDU_START {
                            "inside an FPDU"
                        } else {
                            "owing the answer to a read or fence, or the first FPDU \
                             our requests wait for"
                        }
                    );
                    self.break_silent(code);
                }
            }
        }
        if self.live_check.is_some_and(|d| now >= d) {
            self.look_alive(now);
        }
        if let Some(d) = self.linger_deadline
            && now >= d
        {
            self.phase = Phase::Dead;
        }
        self.pump(now);
    }
}
