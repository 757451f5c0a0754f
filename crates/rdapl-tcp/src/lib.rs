//! rdapl's TCP provider: DAT between processes and machines over standard
//! iWARP (MPA revision 2 with RFC 6581 enhanced setup, DDP, RDMAP), the
//! wire protocol Linux soft-iWARP (siw) speaks.
//!
//! [`Tcp`] is a [`Provider`] named `"tcp"`: a plain value with its own
//! progress thread and its own settings ([`TcpConfig`]); there is no
//! process-global state. Each IA opened from it is one local IP address.
//! The protocol itself is [`rdapl_iwarp`], an I/O-free engine; this crate
//! adds the sockets, the thread and the mapping to the DAT object model,
//! through the core's provider view alone.
//!
//! # What it does
//!
//! * **Addresses.** An IA's parameters ([`params`]) name its address
//!   (`addr=`, default `127.0.0.1`); the DAT connection qualifier `q` is
//!   TCP port `port_base + q` (`port_base=`, default 0: the qualifier is
//!   the port). A qualifier outside the ports is `InvalidParameter`, and
//!   so is, at open, an address that is not this host's.
//! * **Connections** ([`cm`]). A service point is a listening socket; a
//!   connect is a non-blocking TCP connect, then the MPA Request with the
//!   DAT private data (at most [`MAX_PRIVATE_DATA`] bytes, reported in the
//!   IA attributes; a peer's longer private data reaches the consumer cut
//!   to that, its arrival marked `truncated`). Accept and reject answer with the MPA Reply or reject,
//!   with private data. Nobody listening: `NonPeerRejected`; no route:
//!   `Unreachable`; the consumer's connect timeout: `TimedOut`. That
//!   timeout alone bounds the wait (none: DAT's indefinite wait), and the
//!   passive consumer may take its time to decide: no MPA timer refuses
//!   a slow accept behind their backs (siw's 10 s and 5 s would). Only
//!   the MPA Request's arrival, and the RTR's after the Reply, are timed
//!   (the IA's `mpa_timeout_ms`, 5 s). A connect binds the IA's address and
//!   leaves the port to the kernel's connect (Linux): one address then
//!   holds more connections than it has ports, as long as their peers
//!   differ, and closed connections waiting out TIME_WAIT neither slow
//!   nor stop new connects.
//!   Peer-to-peer mode is always asked for, so the active side speaks
//!   first (a zero-length RDMA Write) and either side may send at once.
//!   The endpoint's `max_rdma_read_in` and `max_rdma_read_out` are the
//!   IRD and ORD offered (at least 1 each: a fence is a read); the peer's
//!   ORD may raise the IRD and its IRD lower the ORD (RFC 6581). Reads
//!   posted beyond the ORD wait their turn.
//! * **Data** ([`conn`]). Sends (solicited or not), RDMA Writes and RDMA
//!   Reads, segmented at one TCP MSS per FPDU, CRC32c on by default
//!   (`crc=0` turns it off unless the peer asks). Completions are in post
//!   order per queue; a Send or Write completes once the peer has placed
//!   it (a zero-length read fences each burst), so a remote protection
//!   error completes the guilty request with `RemoteAccess`. With
//!   `complete=sent` ([`Completion::Sent`], siw's meaning) it completes
//!   once TCP has its last byte: no fences, and a remote error breaks the
//!   connection instead. A connection whose peer takes no reads (IRD 0)
//!   can ask for no proof of placement: it completes as with `sent`; an
//!   RDMA Read posted there fails at once (`LocalEp`) and breaks the
//!   connection, rather than wait for ever at the head of the queue.
//! * **Protection** ([`memory`]). An arriving RDMA Write or Read Request is
//!   checked on the target: the STag must be of the endpoint's protection
//!   zone, with the right and the bounds, or no byte moves, a Terminate
//!   goes out and both sides see `Broken`.
//! * **A Send with no receive posted** waits: the receiver stops reading
//!   that socket (TCP flow control holds the sender back) for up to
//!   `recv_wait_ms` (5 s), then breaks the connection (`ReceiverNotReady`
//!   on the sender). A receive posted to the endpoint, or to its SRQ,
//!   lets it in at once; a post while no Send waits wakes nothing. A
//!   malformed Send (a wrong MSN, offset or version) does not wait: its
//!   Terminate goes out at once.
//! * **Endings.** Disconnect (graceful or abrupt), free, peer EOF,
//!   Terminate or a socket error end the connection on each side as it
//!   learns: every outstanding request completes exactly once (`Flushed`
//!   if it did not finish), then `Disconnected` (a clean end) or `Broken`.
//!   A peer that falls silent (the link cut, its host gone, its process
//!   stopped inside a frame, owing the answer to a read, or the first
//!   FPDU this side's requests wait for) breaks the connection within
//!   `timeout_ms` (10 s by default; [`cm`], [`conn`]), busy or idle: an
//!   idle peer is asked with a heartbeat, a zero-length read, after half
//!   of it.
//!   A Send or Write that succeeded was placed at the peer (on `sent`:
//!   was handed to TCP, and may be lost with the connection). One flushed at
//!   the end may have been placed too: the proof of placement (the
//!   answer to a fence behind it) can be lost with the connection, as on
//!   any network transport; a closing side still answers the fences it
//!   has taken in.
//! * **Logs.** What happens to connections goes to the application's
//!   [`tracing`](https://docs.rs/tracing) subscriber, with the connection
//!   (`conn`, this provider's number), the peer's address and the
//!   qualifier as fields: `info` for a connection established (MPA
//!   revision, CRC, IRD and ORD, RTR), a connect that failed or was
//!   rejected and why, a consumer's reject on the passive side, and every
//!   end (`end`: the DAT event; `flushed`: the requests in flight it
//!   completed `Flushed`; receives still queued at the endpoint are
//!   flushed by the core, not counted); `warn` for a Terminate sent or
//!   received, with its cause named as the RFCs name it, an MPA setup
//!   that failed, a peer that fell silent, a Send of the peer refused
//!   after `recv_wait_ms` without a receive (with the time it waited), a
//!   socket error, a listener out of descriptors; `debug` for connection requests and accepts. No
//!   subscriber: no output, and no cost but a cached check. The `rdapl`
//!   command prints them on stderr at the level `RDAPL_LOG` names.
//! * **Threading** ([`progress`]). One thread per [`Tcp`] value, waiting in
//!   epoll on non-blocking sockets and an eventfd: it sets connections up,
//!   runs their timers and tears them down. Once a connection is
//!   established, data moves on whichever thread gets there first, as
//!   libfabric's tcp provider does with manual progress: a poster writes
//!   its send to the socket itself (each connection is behind a lock that
//!   posters only try; a contended post is left to the lock's holder), and
//!   a consumer that finds one of the endpoint's EVDs (receive, request or
//!   connection: the end of a connection comes in with its data) empty
//!   (`dequeue`) or is about to wait on it reads, places and completes in
//!   its own thread
//!   (the core's [`rdapl::provider::Progress`] hook; a `wait` does that
//!   for the IA's `wait_spin_us`, then hands the input back and blocks). While a consumer
//!   polls, the thread leaves that socket's input alone. Nothing spins
//!   when idle.
//! * **Copies.** None in user space for bulk data. A Send's, RDMA Write's
//!   or Read Response's payload is written to the socket straight from the
//!   registered regions (vectored, with the FPDU headers and CRCs; the
//!   regions read under their read locks for each system call, see
//!   [`rdapl::provider::Gather`]); only requests posted with an owned
//!   [`rdapl::Buf`] are gathered into a staging buffer first, and Sends and
//!   Writes of at most 8 KiB are copied into the output queue (a system
//!   call writes one list of registered memory, so small messages posted
//!   together, [`rdapl::Ep::post_batch`], share one only when copied; the
//!   copy costs less than the call); those of at most
//!   [`rdapl_iwarp::fpdu::INLINE_MAX`] bytes are copied when posted and
//!   framed with their header in one run (nothing staged). Once a large
//!   FPDU's header is in, the rest of its payload is read from the socket
//!   straight into the receive or the tagged region (the core lends that
//!   memory: `EpInner::lend_recv` and friends); headers and small FPDUs go
//!   through one input buffer per connection. `RDAPL_TCP_PARAMS`
//!   ([`PARAMS_ENV`]) gives every IA default parameters (e.g. `crc=0`).
//!
//! A consumer's `wait` first drives its connections from its own thread
//! for the IA's `wait_spin_us` ([`DEFAULT_WAIT_SPIN_US`] µs; none on
//! a machine with one CPU online), or up to
//! [`rdapl::provider::WAIT_SPIN_GROWTH`] times that while its blocked
//! waits keep ending soon after they blocked: a ping-pong's answer is
//! usually taken in within it, without waking two threads. Input a waiter
//! took in while it spun is then left to it, as to a polling consumer
//! (the thread, woken by the same input, usually comes too late to see
//! it: the waiter's pass asks the thread), so that the answer to the
//! peer's fence rides with its reply. Where the consumer shares its
//! CPU with its peer or with this provider's thread (both ends under one
//! `taskset` CPU) the answer cannot come while it spins: say
//! `wait_spin_us=0` there.
//!
//! A consumer that polls (`dequeue` in a loop) runs a pass at each
//! `dequeue` that finds its EVD empty; on a machine with one CPU online
//! every [`ONE_CPU_POLL_YIELD`]th pass yields the CPU (the IA's
//! `poll_yield`), or a poller sharing its only CPU with its peer would keep
//! the peer off it for a time slice a message. Where both ends are under
//! one `taskset` CPU, say `poll_yield=4` (and `wait_spin_us=0`).
//!
//! A consumer that stops polling and turns to a notification (it waits,
//! enables upcalls, enables a CNO, lets a stream sleep, or finds the EVD
//! empty while one of these is armed) hands the input back to the thread
//! at once (the core parks the hooks, [`rdapl::provider::Progress::park`]);
//! one that just stops polling gets it back within the IA's
//! `poll_fresh_ms` ([`progress::POLL_FRESH_MS`] by default). What a
//! polling pass held back to ride with the consumer's reply (the answer
//! to the peer's fence, on which the peer's send completes) goes out
//! within [`progress::HOLD_MS`] whatever `poll_fresh_ms` says.
//!
//! So a consumer that waits for the peer's RDMA Writes by polling its own
//! memory (perftest's `ib_write_lat`, MPI's eager RDMA) keeps dequeuing
//! the EVD in the same loop, as `rdapl pingpong --op write` does: each
//! empty dequeue is a pass that reads the socket and places what came. A
//! loop that looks at memory only, having polled the EVD shortly before,
//! sees the bytes land once the thread takes the input back, within
//! `poll_fresh_ms`; one that dequeues now and then, but more often than
//! every `poll_fresh_ms`, keeps the input, so bytes land at its dequeues
//! only: such a consumer waits on the EVD or enables its upcalls instead
//! (a park), or lowers `poll_fresh_ms`.
//!
//! # Example
//!
//! ```no_run
//! use rdapl::*;
//! use rdapl_tcp::Tcp;
//! use std::time::Duration;
//!
//! let tcp = Tcp::new();
//! let open = |addr: &str| {
//!     let opts = IaOptions { params: format!("addr={addr}"), ..Default::default() };
//!     Ia::open_provider(tcp.clone(), opts).unwrap()
//! };
//! let (server, client) = (open("127.0.0.1"), open("127.0.0.1"));
//! let evd = |ia: &Ia, f| ia.evd_create(16, f).unwrap();
//! let cr = evd(&server, EvdFlags::CR);
//! let _psp = server.psp_create(18515, &cr).unwrap(); // TCP port 18515
//! let (spz, cpz) = (server.pz_create().unwrap(), client.pz_create().unwrap());
//! let (sdto, sconn) = (evd(&server, EvdFlags::DTO), evd(&server, EvdFlags::CONNECTION));
//! let (cdto, cconn) = (evd(&client, EvdFlags::DTO), evd(&client, EvdFlags::CONNECTION));
//! let sep = server.ep_create(&spz, Some(&sdto), Some(&sdto), Some(&sconn), None).unwrap();
//! let cep = client.ep_create(&cpz, Some(&cdto), Some(&cdto), Some(&cconn), None).unwrap();
//! let t = Some(Duration::from_secs(5));
//! cep.connect(server.address(), 18515, t, b"hello").unwrap();
//! let Event::ConnectionRequest(req) = cr.wait(t, 1).unwrap().0 else { panic!() };
//! server.cr(req.cr).unwrap().accept(&sep, b"welcome").unwrap();
//! ```

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod cm;
pub mod conn;
mod group;
pub mod memory;
mod outq;
pub mod params;
pub mod progress;
mod sockinfo;

pub use params::{Completion, DEFAULT_WAIT_SPIN_US, ONE_CPU_POLL_YIELD, TcpConfig};

use params::IaParams;
use parking_lot::Mutex;
use progress::{Cmd, Listener, Shared};
use rdapl::error::Subtype;
use rdapl::event::{PzHandle, SrqHandle};
use rdapl::provider::{
    Attempt, CrInner, CrOps, CrState, EpInfo, EpInner, EpLock, EpOps, ListenerOps, NewWr, Provider,
    SpInner, SrqOps, Transport,
};
use rdapl::{Error, IaAttr, ProviderAttr, Result};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// The largest private data of a connect, accept or reject, in bytes: it
/// fits an MPA revision 2 frame toward siw (at most 251 ULP bytes there,
/// 256 with the IRD/ORD block) with room to spare, as iWARP RDMA CM
/// consumers expect (196, the InfiniBand REQ's limit).
pub const MAX_PRIVATE_DATA: usize = 196;

/// The environment variable whose `key=value` parameters every IA of the
/// provider starts from (its own parameters override them).
pub const PARAMS_ENV: &str = "RDAPL_TCP_PARAMS";

/// The progress thread's handle: when the last one goes, the thread stops.
struct Core {
    sh: Arc<Shared>,
}

impl Drop for Core {
    fn drop(&mut self) {
        self.sh.stop();
    }
}

/// The TCP provider: a value, with its own progress thread and settings.
pub struct Tcp {
    cfg: TcpConfig,
    core: Mutex<Option<Arc<Core>>>,
}

impl Tcp {
    /// A provider with the default settings.
    pub fn new() -> Arc<Tcp> {
        Tcp::with_config(TcpConfig::default())
    }

    /// A provider with these settings (the defaults of its IAs).
    pub fn with_config(cfg: TcpConfig) -> Arc<Tcp> {
        Arc::new(Tcp {
            cfg,
            core: Mutex::new(None),
        })
    }

    /// The settings.
    pub fn config(&self) -> &TcpConfig {
        &self.cfg
    }

    /// The settings of an IA opened with no parameters of its own: the
    /// instance's, under `RDAPL_TCP_PARAMS` (ignored if it does not parse:
    /// the open then fails and says why).
    fn defaults(&self) -> IaParams {
        let env = std::env::var(PARAMS_ENV).unwrap_or_default();
        IaParams::parse(&env, &self.cfg).unwrap_or_else(|_| IaParams::defaults(&self.cfg))
    }

    /// How many times the progress thread woke up so far (a diagnostic:
    /// it sleeps while nothing happens).
    pub fn wakeups(&self) -> u64 {
        self.core.lock().as_ref().map_or(0, |c| {
            c.sh.wakeups.load(std::sync::atomic::Ordering::Relaxed)
        })
    }

    /// How many times the progress thread locked one of its connections
    /// so far (a diagnostic: per wake-up it looks at the connections that
    /// changed, not at every connection it has).
    pub fn thread_looks(&self) -> u64 {
        self.core
            .lock()
            .as_ref()
            .map_or(0, |c| c.sh.looks.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// How many of the thread's checks of a polled connection (every
    /// [`HOLD_MS`](crate::progress::HOLD_MS) or so) found it locked and
    /// waited for the lock (a diagnostic: while its consumer polls, a check
    /// that finds it locked leaves it, so this counts only connections
    /// whose consumer stopped polling as a post held the lock).
    pub fn polled_waits(&self) -> u64 {
        self.core.lock().as_ref().map_or(0, |c| {
            c.sh.polled_waits.load(std::sync::atomic::Ordering::Relaxed)
        })
    }

    /// Consumers' passes over its connections so far: (connections
    /// pumped, connections left alone). A pass leaves alone, without
    /// looking at it, a connection with nothing to do and no input (a
    /// diagnostic: a pass over an EVD that many connections share makes
    /// one readiness check and pumps what moves, not a `recv` each).
    pub fn pass_counts(&self) -> (u64, u64) {
        self.core.lock().as_ref().map_or((0, 0), |c| {
            let s = &c.sh.stats;
            (
                s.pass_pumps.load(std::sync::atomic::Ordering::Relaxed),
                s.pass_skips.load(std::sync::atomic::Ordering::Relaxed),
            )
        })
    }

    /// Consumers' passes over the EVDs its connections feed so far (one
    /// per EVD a pass runs on, whatever number of connections feed it).
    pub fn passes(&self) -> u64 {
        self.stat(|s| &s.passes)
    }

    /// Consumers' passes that yielded the CPU so far (the IAs'
    /// `poll_yield`; a diagnostic).
    pub fn poll_yields(&self) -> u64 {
        self.stat(|s| &s.poll_yields)
    }

    /// Payload bytes its connections read from their sockets straight
    /// into the receive or region they were for, with no intermediate copy
    /// (a diagnostic: bulk transfers go that way).
    pub fn placed_direct(&self) -> u64 {
        self.stat(|s| &s.placed_direct)
    }

    /// Accepted connections it closed before their MPA request came,
    /// because their listener already had its IA's `setups` waiting (a
    /// diagnostic: a flood of idle connections).
    pub fn setups_dropped(&self) -> u64 {
        self.stat(|s| &s.setups_dropped)
    }

    /// Times one of its connections made its FPDUs smaller because the
    /// TCP connection's MSS fell (the path's MTU did; a diagnostic).
    pub fn mss_shrinks(&self) -> u64 {
        self.stat(|s| &s.mss_shrinks)
    }

    /// Payload bytes its connections wrote to their sockets straight from
    /// registered memory (Sends, RDMA Writes and Read Responses of at least
    /// 256 bytes per FPDU), with no staging copy (a diagnostic).
    pub fn sent_direct(&self) -> u64 {
        self.stat(|s| &s.sent_direct)
    }

    /// System calls its connections made to write to their sockets (a
    /// diagnostic: Sends posted together, `Ep::post_batch`, share them).
    pub fn socket_writes(&self) -> u64 {
        self.stat(|s| &s.socket_writes)
    }

    /// System calls its connections made that read data from their
    /// sockets (a diagnostic: a burst of small messages shares them).
    pub fn socket_reads(&self) -> u64 {
        self.stat(|s| &s.socket_reads)
    }

    /// Zero-length RDMA Reads its connections posted as fences, the proof
    /// of placement on which `complete=placed` Sends and Writes complete
    /// (a diagnostic).
    pub fn fences(&self) -> u64 {
        self.stat(|s| &s.fences)
    }

    /// Zero-length RDMA Reads its connections posted as heartbeats, asking
    /// a peer that was silent for half of `timeout_ms` on an idle
    /// connection whether it is there (a diagnostic).
    pub fn heartbeats(&self) -> u64 {
        self.stat(|s| &s.heartbeats)
    }

    /// One of the diagnostics' counters (0 before the thread started).
    fn stat(&self, which: impl Fn(&progress::Stats) -> &std::sync::atomic::AtomicU64) -> u64 {
        self.core.lock().as_ref().map_or(0, |c| {
            which(&c.sh.stats).load(std::sync::atomic::Ordering::Relaxed)
        })
    }

    /// The progress thread, started on first use.
    fn core(&self) -> Result<Arc<Core>> {
        let mut g = self.core.lock();
        if let Some(c) = g.as_ref() {
            return Ok(c.clone());
        }
        let sh = Shared::new()?;
        progress::spawn(sh.clone())
            .map_err(|e| Error::Internal(format!("tcp: progress thread: {e}")))?;
        let c = Arc::new(Core { sh });
        *g = Some(c.clone());
        Ok(c)
    }
}

impl Provider for Tcp {
    fn attr(&self) -> ProviderAttr {
        // What an IA with no parameters of its own gets, the environment's
        // included: the flag and the named settings agree.
        let d = self.defaults();
        ProviderAttr {
            name: "tcp".into(),
            description: "iWARP (MPA/DDP/RDMAP) over TCP sockets".into(),
            max_private_data_size: MAX_PRIVATE_DATA,
            completes_when_placed: d.complete == Completion::Placed,
            provider_specific_attr: d.named(),
            ..ProviderAttr::default()
        }
    }

    fn ia_attr(&self, address: IpAddr) -> IaAttr {
        IaAttr {
            adapter_name: "tcp0".into(),
            max_rdma_read_per_ep: 16,
            max_message_size: 1 << 30,
            max_rdma_size: 1 << 30,
            max_private_data_size: MAX_PRIVATE_DATA,
            address,
            ..IaAttr::default()
        }
    }

    fn open(&self, address: Option<IpAddr>, params: &str) -> Result<Arc<dyn Transport>> {
        // Defaults from the environment (as libfabric's FI_TCP_*), under
        // the IA's own parameters: e.g. RDAPL_TCP_PARAMS=crc=0.
        let env = std::env::var(PARAMS_ENV).unwrap_or_default();
        let mut p = IaParams::parse(&format!("{env} {params}"), &self.cfg)?;
        if let Some(a) = address {
            p.addr = a;
        }
        cm::check_local(p.addr)?;
        Ok(Arc::new(TcpIa {
            core: self.core()?,
            p: Arc::new(p),
        }))
    }
}

/// Refuses private data longer than MPA carries (`arg`: its argument).
fn check_private_data(private_data: &[u8], arg: u8) -> Result<()> {
    if private_data.len() > MAX_PRIVATE_DATA {
        return Err(Error::param(arg, "tcp: private data too long"));
    }
    Ok(())
}

/// One IA of the TCP provider (its table of operations).
struct TcpIa {
    core: Arc<Core>,
    p: Arc<IaParams>,
}

impl Transport for TcpIa {
    fn address(&self) -> IpAddr {
        self.p.addr
    }

    fn ep_create(&self, _ep: &EpInfo<'_>) -> Result<Box<dyn EpOps>> {
        Ok(Box::new(TcpEp {
            core: self.core.clone(),
            p: self.p.clone(),
        }))
    }

    fn listen(&self, sp: &Arc<SpInner>) -> Result<Box<dyn ListenerOps>> {
        let qual = sp.conn_qual();
        let port = self.p.port(qual)?;
        let sock = cm::listen(self.p.addr, port, qual)?;
        let token = self.core.sh.add_listener(Listener {
            sock,
            sp: Arc::downgrade(sp),
            ia: self.p.clone(),
            setups: Default::default(),
        })?;
        Ok(Box::new(TcpListener {
            core: self.core.clone(),
            token,
        }))
    }

    fn srq_create(&self, srq: SrqHandle, _pz: PzHandle) -> Result<Box<dyn SrqOps>> {
        Ok(Box::new(TcpSrq {
            core: self.core.clone(),
            handle: srq,
        }))
    }

    fn close(&self) {
        // Its listeners stopped with their service points (and each
        // closes its socket when dropped); its endpoints were destroyed.
    }

    fn provider_attr(&self, attr: ProviderAttr) -> ProviderAttr {
        ProviderAttr {
            completes_when_placed: self.p.complete == Completion::Placed,
            provider_specific_attr: self.p.named(),
            ..attr
        }
    }
}

/// One listening socket (closed when stopped or dropped).
struct TcpListener {
    core: Arc<Core>,
    token: u64,
}

impl TcpListener {
    fn stop(&self) {
        // Closing the socket takes it out of epoll.
        self.core.sh.listeners.lock().remove(&self.token);
    }
}

impl ListenerOps for TcpListener {
    fn unlisten(&self, _sp: &SpInner) {
        self.stop();
    }
}

impl Drop for TcpListener {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One SRQ's table.
struct TcpSrq {
    core: Arc<Core>,
    handle: SrqHandle,
}

impl SrqOps for TcpSrq {
    fn posted(&self, _srq: &rdapl::srq::SrqInner) {
        // The connections of this SRQ's endpoints whose peer's Send waits
        // for a receive (none, after one fence and one load, while no
        // connection waits for an SRQ's) are kicked, as an endpoint's
        // receive kicks it (`TcpEp::kick`): from this thread when the
        // connection is free, else by its lock's holder.
        for cell in self.core.sh.srq_waits.waiting(self.handle) {
            cell.kick();
        }
    }
}

/// One endpoint's table.
struct TcpEp {
    core: Arc<Core>,
    p: Arc<IaParams>,
}

impl TcpEp {
    fn sh(&self) -> &Shared {
        &self.core.sh
    }
}

impl EpOps for TcpEp {
    fn connect(
        &self,
        ep: &Arc<EpInner>,
        attempt: Attempt,
        remote: IpAddr,
        conn_qual: u64,
        private_data: Vec<u8>,
        timeout: Option<Duration>,
    ) -> Result<()> {
        let port = self.p.port(conn_qual)?;
        check_private_data(&private_data, 4)?;
        let remote = SocketAddr::new(remote, port);
        let sock = cm::connect_socket(remote)?;
        self.sh().send(Cmd::Connect {
            ep: ep.clone(),
            attempt,
            ia: self.p.clone(),
            sock,
            remote,
            qual: conn_qual,
            pd: private_data,
            timeout,
        });
        Ok(())
    }

    fn disconnect(&self, ep: &Arc<EpInner>, _graceful: bool) {
        self.sh().send(Cmd::Disconnect { ep: ep.clone() });
    }

    fn break_connection(&self, ep: &Arc<EpInner>) {
        self.sh().send(Cmd::Break { ep: ep.clone() });
    }

    fn destroy(&self, ep: &Arc<EpInner>) {
        self.sh().send(Cmd::Disconnect { ep: ep.clone() });
    }

    fn connect_cancel(&self, ep: &Arc<EpInner>) {
        // Closing the socket withdraws the request: the passive side sees
        // the stream end before any reply and cancels its request.
        self.sh().send(Cmd::Disconnect { ep: ep.clone() });
    }

    /// A request of a batch with more to follow: queued only; the batch's
    /// end kicks, and the pump then frames and writes them all at once.
    fn submit_more(&self, _ep: &Arc<EpInner>, mut core: EpLock<'_>, wr: NewWr<'_>) {
        core.push_send(wr.queued());
    }

    fn kick(&self, ep: &Arc<EpInner>, recv: bool) {
        if let Some(cell) = progress::link_of(ep) {
            if recv {
                // The poster's half of the Dekker pattern with a stalled
                // Send (`Conn::fpdu_start`): the receive is queued; unless
                // a Send waits, nobody needs to hear of it.
                std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
                if !cell.stalled.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
            }
            // From the poster's thread when the connection is free, else
            // by the lock's holder when it lets go.
            cell.kick();
            return;
        }
        self.sh().send(Cmd::Kick {
            ep: ep.clone(),
            recv,
        });
    }
}

/// A connection request's table: the TCP connection it came on waits in
/// the progress thread for the answer.
pub(crate) struct TcpCr {
    pub(crate) sh: Arc<Shared>,
    /// That connection (its key in the progress thread).
    pub(crate) token: u64,
}

impl CrOps for TcpCr {
    fn accept(&self, cr: &Arc<CrInner>, ep: &Arc<EpInner>, private_data: Vec<u8>) -> Result<()> {
        check_private_data(&private_data, 3)?;
        if !cr.settle_as(CrState::Accepted) {
            return Err(Error::InvalidHandle(Subtype::InvalidHandleCr));
        }
        self.sh.send(Cmd::Accept {
            token: self.token,
            cr: cr.clone(),
            ep: ep.clone(),
            pd: private_data,
        });
        Ok(())
    }

    fn reject(&self, cr: &Arc<CrInner>, private_data: Vec<u8>) -> Result<()> {
        check_private_data(&private_data, 2)?;
        if !cr.settle_as(CrState::Rejected) {
            return Err(Error::InvalidHandle(Subtype::InvalidHandleCr));
        }
        self.sh.send(Cmd::Reject {
            token: self.token,
            cr: cr.clone(),
            pd: private_data,
        });
        Ok(())
    }
}
