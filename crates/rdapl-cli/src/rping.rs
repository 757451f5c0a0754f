//! `rdapl rping`: a peer of rdma-core's `rping` (librdmacm/examples), on
//! the rdapl API, so that rdapl can be tested against another RDMA stack
//! (the Linux kernel's soft-iWARP, `siw`, in the lab VM: `lab/vm/`).
//!
//! rping's protocol, which this module follows message for message:
//!
//! * Every control message is one 16-byte Send, `struct rping_rdma_info
//!   { be64 buf; be32 rkey; be32 size; }`. Either side refuses a receive of
//!   any other length.
//! * The client fills its *start* buffer with ping `i`'s pattern
//!   ([`pattern`]) and Sends its address, rkey and size.
//! * The server RDMA-Reads that many bytes into its buffer and Sends a
//!   "go ahead" (its own, never-filled, all-zero `rping_rdma_info`).
//! * The client Sends the address, rkey and size of its *sink* buffer.
//! * The server RDMA-Writes `strlen(data) + 1` bytes of what it read there
//!   and Sends another go ahead.
//! * The client checks the sink against the start buffer and goes on with
//!   ping `i + 1` (after `interval`, if given), `count` times; then it
//!   disconnects, and the server (waiting for the next ping) ends.
//!
//! With `-v` both print the ping data as rping does (`ping data: ...` on
//! the client, `server ping data: ...` on the server). Unlike rping, both
//! sides always check the data: the server checks what it read against
//! rping's pattern for that ping, the client checks the echo byte for
//! byte, and the server, given a count, checks that exactly that many
//! pings came. Every wait is bounded by the timeout.
//!
//! The provider is `tcp` by default (`addr=` this side's address, `crc=`
//! whether to ask for MPA CRC32c), the connection qualifier is the TCP port.

use rdapl::{
    CloseFlags, CompletionFlags, ConnectionEventKind, DtoOp, DtoStatus, Ep, Evd, EvdFlags, Event,
    Ia, IaOpen, IaOptions, Lmr, MemPriv, Region, RmrTriplet,
};
use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Bytes of `struct rping_rdma_info`.
pub const INFO_LEN: usize = 16;
/// rping's smallest ping size (`RPING_MIN_BUFSIZE`: the digits of INT_MAX
/// and the message format, both with their NULs).
pub const MIN_SIZE: usize = 26;
/// rping's largest ping size (`RPING_BUFSIZE - 1`).
pub const MAX_SIZE: usize = 64 * 1024 - 1;
/// The server's buffer (`RPING_BUFSIZE`): any client size fits.
const SERVER_BUF: usize = 64 * 1024;

/// What a run is told.
#[derive(Clone, Debug)]
pub struct RpingOptions {
    /// Provider name (`tcp` to meet a real rping).
    pub provider: String,
    /// Serve instead of connecting.
    pub server: bool,
    /// Server: the address to listen at. Client: the server's address.
    pub addr: IpAddr,
    /// Client: this side's IA address.
    pub local: IpAddr,
    /// The port (connection qualifier).
    pub port: u16,
    /// Pings (client: how many to do, 0: until killed; server: how many
    /// must come, 0: any).
    pub count: u32,
    /// Ping size in bytes (client), [`MIN_SIZE`]..=[`MAX_SIZE`].
    pub size: usize,
    /// Print the ping data.
    pub verbose: bool,
    /// Ask for MPA CRC32c (`crc=` of the tcp provider).
    pub crc: bool,
    /// Bound of every wait (a server waits this long for its client too).
    pub timeout: Duration,
    /// Client: the pause between two pings (the connection sits idle).
    pub interval: Duration,
}

impl Default for RpingOptions {
    fn default() -> Self {
        RpingOptions {
            provider: "tcp".into(),
            server: false,
            addr: "127.0.0.1".parse().unwrap(),
            local: "127.0.0.1".parse().unwrap(),
            port: 7174,
            count: 0,
            size: 64,
            verbose: false,
            crc: true,
            timeout: Duration::from_secs(30),
            interval: Duration::ZERO,
        }
    }
}

/// What a run did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RpingReport {
    /// Pings completed and checked.
    pub pings: u32,
    /// Lines printed with `-v` (also written to stdout as they come).
    pub lines: Vec<String>,
}

/// rping's data for ping `ping` of `size` bytes: `"rdma-ping-<ping>: "`,
/// then letters from `'A' + ping % 58` on, cycling through `'A'..='z'`,
/// and a NUL in the last byte.
pub fn pattern(ping: u32, size: usize) -> Vec<u8> {
    let mut b = format!("rdma-ping-{ping}: ").into_bytes();
    b.truncate(size.saturating_sub(1));
    let mut c = 65 + (ping % 58) as u8;
    while b.len() < size {
        b.push(c);
        c = if c >= 122 { 65 } else { c + 1 };
    }
    if let Some(last) = b.last_mut() {
        *last = 0;
    }
    b
}

/// Encodes `struct rping_rdma_info`.
pub fn encode_info(buf: u64, rkey: u32, size: u32) -> [u8; INFO_LEN] {
    let mut m = [0u8; INFO_LEN];
    m[..8].copy_from_slice(&buf.to_be_bytes());
    m[8..12].copy_from_slice(&rkey.to_be_bytes());
    m[12..].copy_from_slice(&size.to_be_bytes());
    m
}

/// Decodes `struct rping_rdma_info`: (buf, rkey, size).
pub fn decode_info(m: &[u8; INFO_LEN]) -> (u64, u32, u32) {
    (
        u64::from_be_bytes(m[..8].try_into().unwrap()),
        u32::from_be_bytes(m[8..12].try_into().unwrap()),
        u32::from_be_bytes(m[12..].try_into().unwrap()),
    )
}

/// The text of a NUL-terminated buffer, as `printf("%s")` shows it.
fn c_str(b: &[u8]) -> String {
    let end = b.iter().position(|&x| x == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// Cookies of the requests, so completions are told apart.
const C_SEND: u64 = 1;
const C_READ: u64 = 2;
const C_WRITE: u64 = 3;
const C_RECV: u64 = 4;

/// One side: IA, one EVD for everything, the endpoint, rping's buffers.
struct Side {
    ia: Ia,
    evd: Evd,
    ep: Ep,
    recv: Lmr,
    send: Lmr,
    /// Client: the sink of the server's Write. Server: the read data.
    rdma: Lmr,
    /// Client only: the source of the server's Read.
    start: Option<Lmr>,
    timeout: Duration,
    /// Receives completed and not yet taken (their lengths).
    recvs: VecDeque<u64>,
    /// Successful completions of Sends, Reads and Writes not yet taken.
    done: Vec<u64>,
    /// The connection ended (the event's kind).
    ended: Option<ConnectionEventKind>,
    lines: Vec<String>,
    verbose: bool,
}

impl Side {
    fn open(
        o: &RpingOptions,
        local: IpAddr,
        rdma_len: usize,
        client: bool,
    ) -> Result<Side, String> {
        let ia = Ia::open_with(
            &o.provider,
            IaOptions {
                params: if o.provider == "tcp" {
                    format!("addr={local} crc={}", u8::from(o.crc))
                } else {
                    format!("addr={local}")
                },
                ..Default::default()
            },
        )
        .map_err(|e| format!("opening an IA of {:?} at {local}: {e}", o.provider))?;
        let pz = ia.pz_create().map_err(|e| e.to_string())?;
        let evd = ia
            .evd_create(64, EvdFlags::DTO | EvdFlags::CONNECTION | EvdFlags::CR)
            .map_err(|e| format!("creating the EVD: {e}"))?;
        // rping: 16 send requests, 2 receives, one SGE each.
        let attr = rdapl::EpAttr {
            max_recv_dtos: 2,
            max_request_dtos: 16,
            max_message_size: SERVER_BUF as u64,
            ..Default::default()
        };
        let ep = ia
            .ep_builder(&pz)
            .evd(&evd)
            .attr(attr)
            .create()
            .map_err(|e| format!("creating the endpoint: {e}"))?;
        let region = |n: usize, p: MemPriv| {
            pz.lmr_create(Region::zeroed(n), p)
                .map_err(|e| format!("registering {n} bytes: {e}"))
        };
        let remote = MemPriv::LOCAL_READ
            | MemPriv::LOCAL_WRITE
            | MemPriv::REMOTE_READ
            | MemPriv::REMOTE_WRITE;
        let local = MemPriv::LOCAL_READ | MemPriv::LOCAL_WRITE;
        Ok(Side {
            recv: region(INFO_LEN, local)?,
            send: region(INFO_LEN, local)?,
            rdma: region(rdma_len, remote)?,
            start: if client {
                Some(region(rdma_len, remote)?)
            } else {
                None
            },
            ia,
            evd,
            ep,
            timeout: o.timeout,
            recvs: VecDeque::new(),
            done: Vec::new(),
            ended: None,
            lines: Vec::new(),
            verbose: o.verbose,
        })
    }

    fn say(&mut self, line: String) {
        if self.verbose {
            println!("{line}");
            self.lines.push(line);
        }
    }

    fn post_recv(&self) -> Result<(), String> {
        let t = self
            .recv
            .triplet(0, INFO_LEN as u64)
            .map_err(|e| e.to_string())?;
        self.ep
            .post_recv(&[t], C_RECV, CompletionFlags::DEFAULT)
            .map_err(|e| format!("posting the receive: {e}"))
    }

    /// Sends `struct rping_rdma_info` (the last one must be done).
    fn send_info(&mut self, info: [u8; INFO_LEN]) -> Result<(), String> {
        self.send.write_at(0, &info).map_err(|e| e.to_string())?;
        let t = self
            .send
            .triplet(0, INFO_LEN as u64)
            .map_err(|e| e.to_string())?;
        self.ep
            .post_send(&[t], C_SEND, CompletionFlags::DEFAULT)
            .map_err(|e| format!("posting a send: {e}"))
    }

    /// One event, within the timeout.
    fn next(&self, deadline: Instant, what: &str) -> Result<Event, String> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("timed out ({:?}) waiting for {what}", self.timeout));
            }
            match self.evd.wait(Some(left.min(Duration::from_millis(200))), 1) {
                Ok((ev, _)) => return Ok(ev),
                Err(rdapl::Error::TimeoutExpired { .. }) => continue,
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    /// Waits for the connection to be established. A failed attempt
    /// flushes the receive first, then says why: `what` and the
    /// connection event's kind, not the flush.
    fn established(&self, deadline: Instant, what: &str) -> Result<(), String> {
        loop {
            match self.next(deadline, "the connection")? {
                Event::Connection(e) if e.kind == ConnectionEventKind::Established => return Ok(()),
                Event::Connection(e) => return Err(format!("{what}: {:?}", e.kind)),
                Event::Dto(d) if d.status == DtoStatus::Flushed => {}
                other => return Err(format!("{what}: expected Established, got {other:?}")),
            }
        }
    }

    /// Files one event.
    fn take(&mut self, ev: Event) -> Result<(), String> {
        match ev {
            // A connection's end flushes what is outstanding: the end
            // itself follows and is what counts.
            Event::Dto(d) if d.status == DtoStatus::Flushed => Ok(()),
            Event::Dto(d) if d.status != DtoStatus::Success => Err(format!(
                "{:?} (cookie {}) failed: {:?}",
                d.operation, d.cookie, d.status
            )),
            Event::Dto(d) if d.operation == DtoOp::Receive => {
                self.recvs.push_back(d.transferred_length);
                Ok(())
            }
            Event::Dto(d) => {
                self.done.push(d.cookie);
                Ok(())
            }
            Event::Connection(c) => match c.kind {
                ConnectionEventKind::Disconnected | ConnectionEventKind::Broken => {
                    self.ended = Some(c.kind);
                    Ok(())
                }
                k => Err(format!("unexpected connection event {k:?}")),
            },
            other => Err(format!("unexpected event {other:?}")),
        }
    }

    /// The next `rping_rdma_info` received (the receive is posted again);
    /// `None` if the connection ended first.
    fn recv_info(&mut self, what: &str) -> Result<Option<[u8; INFO_LEN]>, String> {
        self.recv_msg(what, true)
    }

    /// The next 16-byte message received, the receive posted again if
    /// `repost`; `None` if the connection ended first.
    fn recv_msg(&mut self, what: &str, repost: bool) -> Result<Option<[u8; INFO_LEN]>, String> {
        let deadline = crate::deadline_in(self.timeout);
        loop {
            if let Some(len) = self.recvs.pop_front() {
                if len != INFO_LEN as u64 {
                    return Err(format!("received bogus data, size {len} (want {INFO_LEN})"));
                }
                let mut m = [0u8; INFO_LEN];
                self.recv.read_at(0, &mut m).map_err(|e| e.to_string())?;
                if repost {
                    self.post_recv()?;
                }
                return Ok(Some(m));
            }
            if self.ended.is_some() {
                return Ok(None);
            }
            let ev = self.next(deadline, what)?;
            self.take(ev)?;
        }
    }

    /// Waits for the successful completion of the request `cookie`.
    fn wait_done(&mut self, cookie: u64, what: &str) -> Result<(), String> {
        let deadline = crate::deadline_in(self.timeout);
        loop {
            if let Some(i) = self.done.iter().position(|&c| c == cookie) {
                self.done.swap_remove(i);
                return Ok(());
            }
            if let Some(k) = self.ended {
                return Err(format!("the connection ended ({k:?}) before {what}"));
            }
            let ev = self.next(deadline, what)?;
            self.take(ev)?;
        }
    }

    fn close(self) {
        let _ = self.ep.free();
        let _ = self.ia.close(CloseFlags::Abrupt);
    }
}

/// Runs a client or a server.
pub fn run(o: &RpingOptions) -> Result<RpingReport, String> {
    if !(MIN_SIZE..=MAX_SIZE).contains(&o.size) {
        return Err(format!(
            "invalid size {} (valid range is {MIN_SIZE} to {MAX_SIZE})",
            o.size
        ));
    }
    if o.server { serve(o, || {}) } else { client(o) }
}

/// The client: `count` pings, each checked, then a disconnect.
pub fn client(o: &RpingOptions) -> Result<RpingReport, String> {
    let mut s = Side::open(o, o.local, o.size, true)?;
    let r = client_pings(o, &mut s);
    let lines = std::mem::take(&mut s.lines);
    s.close();
    r.map(|pings| RpingReport { pings, lines })
}

fn client_pings(o: &RpingOptions, s: &mut Side) -> Result<u32, String> {
    s.post_recv()?;
    s.ep.connect(o.addr, u64::from(o.port), Some(o.timeout), b"")
        .map_err(|e| format!("connecting: {e}"))?;
    let deadline = crate::deadline_in(o.timeout);
    s.established(deadline, &format!("connecting to {}:{}", o.addr, o.port))?;
    let start = s.start.clone().expect("a client has a start buffer");
    let (start_addr, start_key) = (
        start.address().map_err(|e| e.to_string())?,
        start.rmr_context().map_err(|e| e.to_string())?,
    );
    let (sink_addr, sink_key) = (
        s.rdma.address().map_err(|e| e.to_string())?,
        s.rdma.rmr_context().map_err(|e| e.to_string())?,
    );
    let size = o.size as u32;
    let mut ping = 0u32;
    while o.count == 0 || ping < o.count {
        let want = pattern(ping, o.size);
        start.write_at(0, &want).map_err(|e| e.to_string())?;
        s.rdma
            .write_at(0, &vec![0u8; o.size])
            .map_err(|e| e.to_string())?;
        // The source: the server reads it, then says go ahead.
        s.send_info(encode_info(start_addr, start_key, size))?;
        s.recv_info("the server's go ahead after its read")?
            .ok_or_else(|| format!("ping {ping}: the server went away"))?;
        s.wait_done(C_SEND, "the start buffer's send completed")?;
        // The sink: the server writes the data back, then says go ahead.
        s.send_info(encode_info(sink_addr, sink_key, size))?;
        s.recv_info("the server's go ahead after its write")?
            .ok_or_else(|| format!("ping {ping}: the server went away"))?;
        s.wait_done(C_SEND, "the sink buffer's send completed")?;
        let got = s.rdma.to_vec().map_err(|e| e.to_string())?;
        if got != want {
            let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
            return Err(format!(
                "ping {ping}: data mismatch at byte {at}: got {:?}, want {:?}",
                c_str(&got),
                c_str(&want)
            ));
        }
        s.say(format!("ping data: {}", c_str(&got)));
        ping += 1;
        if !o.interval.is_zero() && ping != o.count {
            std::thread::sleep(o.interval);
        }
    }
    let _ = s.ep.disconnect(true);
    let deadline = crate::deadline_in(o.timeout);
    while s.ended.is_none() {
        match s.next(deadline, "the disconnect") {
            Ok(ev) => s.take(ev)?,
            Err(e) => return Err(e),
        }
    }
    Ok(ping)
}

/// The server: one client, served until it disconnects. `listening()` is
/// called once the port listens.
pub fn serve(o: &RpingOptions, listening: impl FnOnce()) -> Result<RpingReport, String> {
    if !(MIN_SIZE..=MAX_SIZE).contains(&o.size) {
        return Err(format!("invalid size {}", o.size));
    }
    let mut s = Side::open(o, o.addr, SERVER_BUF, false)?;
    let psp =
        s.ia.psp_create(u64::from(o.port), &s.evd)
            .map_err(|e| format!("listening on {}:{}: {e}", o.addr, o.port))?;
    listening();
    let r = serve_pings(o, &mut s);
    let _ = psp.free();
    let lines = std::mem::take(&mut s.lines);
    s.close();
    let pings = r?;
    if o.count != 0 && pings != o.count {
        return Err(format!("{pings} ping(s) came, expected {}", o.count));
    }
    Ok(RpingReport { pings, lines })
}

/// A server's first steps: a receive posted, then the first client's
/// request accepted and the connection established, within the timeout.
fn accept_one(o: &RpingOptions, s: &mut Side) -> Result<(), String> {
    s.post_recv()?;
    let deadline = crate::deadline_in(o.timeout);
    let cr = match s.next(deadline, "a client")? {
        Event::ConnectionRequest(a) => a.cr,
        other => return Err(format!("waiting for a client: {other:?}")),
    };
    s.ia.cr(cr)
        .and_then(|c| c.accept(&s.ep, b""))
        .map_err(|e| format!("accepting: {e}"))?;
    s.established(deadline, "accepting")
}

fn serve_pings(o: &RpingOptions, s: &mut Side) -> Result<u32, String> {
    accept_one(o, s)?;
    let go_ahead = [0u8; INFO_LEN];
    let mut ping = 0u32;
    loop {
        // The client's source, or its disconnect after the last ping.
        let Some(info) = s.recv_info("the client's source (RDMA_READ_ADV)")? else {
            return Ok(ping);
        };
        if ping > 0 {
            // The last ping's final go ahead (the client has it: it sent
            // this). After the last ping it may be flushed instead.
            s.wait_done(C_SEND, "the last go ahead's send completed")?;
        }
        let (buf, rkey, len) = decode_info(&info);
        if len as usize > SERVER_BUF || len == 0 {
            return Err(format!("ping {ping}: the client offers {len} bytes"));
        }
        let local = s.rdma.triplet(0, len.into()).map_err(|e| e.to_string())?;
        let remote = RmrTriplet {
            rmr_context: rkey,
            target_address: buf,
            segment_length: len.into(),
        };
        s.ep.post_rdma_read(&[local], remote, C_READ, CompletionFlags::DEFAULT)
            .map_err(|e| format!("posting the read: {e}"))?;
        s.wait_done(C_READ, "the read of the client's source")?;
        let mut data = vec![0u8; len as usize];
        s.rdma.read_at(0, &mut data).map_err(|e| e.to_string())?;
        let want = pattern(ping, len as usize);
        if data != want {
            return Err(format!(
                "ping {ping}: the client's data is not rping's: got {:?}, want {:?}",
                c_str(&data),
                c_str(&want)
            ));
        }
        s.say(format!("server ping data: {}", c_str(&data)));
        s.send_info(go_ahead)?;
        let info = s
            .recv_info("the client's sink (RDMA_WRITE_ADV)")?
            .ok_or_else(|| format!("ping {ping}: the client went away before its sink"))?;
        s.wait_done(C_SEND, "the go ahead's send completed")?;
        let (buf, rkey, sink_len) = decode_info(&info);
        let n = data.iter().position(|&b| b == 0).unwrap_or(data.len() - 1) + 1;
        if (sink_len as usize) < n {
            return Err(format!(
                "ping {ping}: the client's sink holds {sink_len} bytes, the ping {n}"
            ));
        }
        let local = s.rdma.triplet(0, n as u64).map_err(|e| e.to_string())?;
        let remote = RmrTriplet {
            rmr_context: rkey,
            target_address: buf,
            segment_length: n as u64,
        };
        s.ep.post_rdma_write(&[local], remote, C_WRITE, CompletionFlags::DEFAULT)
            .map_err(|e| format!("posting the write: {e}"))?;
        s.wait_done(C_WRITE, "the write to the client's sink")?;
        s.send_info(go_ahead)?;
        ping += 1;
    }
}

/// Bytes of each message of rdma-core's `rdma_server` / `rdma_client`.
pub const CM_MSG: usize = 16;

/// A peer of rdma-core's `rdma_client` (librdmacm/examples): connect with
/// no private data, Send 16 bytes, take the server's 16-byte Send, then
/// the server disconnects (`rdma_server` does, right after its Send) or,
/// if it does not within the timeout, this side does and that fails.
/// `o.size`, `o.count` and `o.verbose` are not used.
pub fn cm_client(o: &RpingOptions) -> Result<(), String> {
    let mut s = Side::open(o, o.local, CM_MSG, false)?;
    let r = cm_client_run(o, &mut s);
    s.close();
    r
}

fn cm_client_run(o: &RpingOptions, s: &mut Side) -> Result<(), String> {
    s.post_recv()?;
    s.ep.connect(o.addr, u64::from(o.port), Some(o.timeout), b"")
        .map_err(|e| format!("connecting: {e}"))?;
    let deadline = crate::deadline_in(o.timeout);
    s.established(deadline, &format!("connecting to {}:{}", o.addr, o.port))?;
    s.send_info([0x5a; CM_MSG])?;
    s.wait_done(C_SEND, "the send completed")?;
    // No receive after it: rdma_server disconnects once its send completed.
    s.recv_msg("the server's message", false)?
        .ok_or("the server went away before its message")?;
    let deadline = crate::deadline_in(o.timeout);
    while s.ended.is_none() {
        let ev = s.next(deadline, "the server's disconnect")?;
        s.take(ev)?;
    }
    Ok(())
}

/// A peer of rdma-core's `rdma_server`: one client; take its 16-byte
/// Send, Send 16 bytes back, disconnect once that completed.
pub fn cm_serve(o: &RpingOptions, listening: impl FnOnce()) -> Result<(), String> {
    let mut s = Side::open(o, o.addr, CM_MSG, false)?;
    let psp =
        s.ia.psp_create(u64::from(o.port), &s.evd)
            .map_err(|e| format!("listening on {}:{}: {e}", o.addr, o.port))?;
    listening();
    let r = cm_serve_run(o, &mut s);
    let _ = psp.free();
    s.close();
    r
}

fn cm_serve_run(o: &RpingOptions, s: &mut Side) -> Result<(), String> {
    accept_one(o, s)?;
    s.recv_msg("the client's message", false)?
        .ok_or("the client went away before its message")?;
    s.send_info([0xa5; CM_MSG])?;
    // rdma_client disconnects as soon as our message has arrived, and
    // rdapl-tcp completes a send only once the peer has answered the
    // zero-length read that follows it: a client's clean disconnect may
    // come first, and then the send is flushed though it arrived (the
    // client's own check, "end 0", says whether it did). Its close may
    // also reset the connection while our fence read is unanswered (seen:
    // Broken). A failed completion, a timeout or an end before the send
    // was posted are still failures.
    match s.wait_done(C_SEND, "the send completed") {
        Err(_) if s.ended.is_some() => return Ok(()),
        r => r?,
    }
    let _ = s.ep.disconnect(true);
    let deadline = crate::deadline_in(o.timeout);
    while s.ended.is_none() {
        let ev = s.next(deadline, "the disconnect")?;
        s.take(ev)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pattern_is_rpings() {
        // What siw's rping -c sent the lab's Python peer (README).
        let p = pattern(0, 64);
        assert_eq!(p.len(), 64);
        assert!(p.starts_with(b"rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abc"));
        assert_eq!(p[63], 0);
        assert_eq!(&pattern(1, 20)[..], b"rdma-ping-1: BCDEFG\0");
        // The start letter wraps after 'z' (58 letters).
        assert!(pattern(57, 30).starts_with(b"rdma-ping-57: z"));
        assert!(pattern(58, 30).starts_with(b"rdma-ping-58: A"));
        // Letters wrap within a ping too.
        let long = pattern(0, 200);
        assert_eq!(long[13 + 57], b'z');
        assert_eq!(long[13 + 58], b'A');
    }

    #[test]
    fn info_is_big_endian() {
        let m = encode_info(0x1122_3344_5566_7788, 0xdead_beef, 64);
        assert_eq!(
            m,
            [
                0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 64
            ]
        );
        assert_eq!(decode_info(&m), (0x1122_3344_5566_7788, 0xdead_beef, 64));
    }

    /// Runs `serve(so)` in a thread, once it listens.
    fn start_server(so: RpingOptions) -> std::thread::JoinHandle<Result<RpingReport, String>> {
        let (tx, rx) = std::sync::mpsc::channel();
        let h = std::thread::spawn(move || serve(&so, || tx.send(()).unwrap()));
        rx.recv().unwrap();
        h
    }

    fn both(port: u16, crc_client: bool, crc_server: bool, count: u32, size: usize) {
        both_within(
            port,
            crc_client,
            crc_server,
            count,
            size,
            Duration::from_secs(20),
        );
    }

    fn both_within(
        port: u16,
        crc_client: bool,
        crc_server: bool,
        count: u32,
        size: usize,
        timeout: Duration,
    ) {
        crate::register_providers();
        let base = RpingOptions {
            port,
            count,
            size,
            verbose: true,
            timeout,
            ..Default::default()
        };
        let so = RpingOptions {
            server: true,
            crc: crc_server,
            ..base.clone()
        };
        let h = start_server(so);
        let co = RpingOptions {
            crc: crc_client,
            ..base
        };
        let c = client(&co).unwrap();
        let srv = h.join().unwrap().unwrap();
        assert_eq!((c.pings, srv.pings), (count, count));
        assert_eq!(c.lines.len(), count as usize);
        assert!(c.lines[0].starts_with("ping data: rdma-ping-0: ABC"));
        assert!(
            srv.lines[count as usize - 1]
                .starts_with(&format!("server ping data: rdma-ping-{}: ", count - 1))
        );
    }

    #[test]
    fn rdapl_pings_rdapl_over_tcp_with_and_without_crc() {
        both(17_174, false, false, 5, 64);
        both(17_175, true, false, 3, MIN_SIZE);
        both(17_176, false, true, 2, MAX_SIZE);
    }

    /// Options filled by code may bound waits by any `Duration`: one past
    /// what an `Instant` holds is as good as none, not a panic.
    #[test]
    fn a_timeout_of_duration_max_waits_without_bound() {
        both_within(17_180, false, false, 2, 64, Duration::MAX);
    }

    /// `interval` pauses the client between pings (two pauses for three).
    #[test]
    fn a_client_pauses_between_pings() {
        crate::register_providers();
        let base = RpingOptions {
            port: 17_179,
            count: 3,
            timeout: Duration::from_secs(20),
            ..Default::default()
        };
        let so = RpingOptions {
            server: true,
            ..base.clone()
        };
        let h = start_server(so);
        let t = Instant::now();
        let c = client(&RpingOptions {
            interval: Duration::from_millis(200),
            ..base
        })
        .unwrap();
        let took = t.elapsed();
        assert_eq!(c.pings, 3);
        assert_eq!(h.join().unwrap().unwrap().pings, 3);
        assert!(took >= Duration::from_millis(400), "{took:?}");
    }

    #[test]
    fn a_server_expecting_more_pings_fails() {
        crate::register_providers();
        let base = RpingOptions {
            port: 17_177,
            timeout: Duration::from_secs(20),
            ..Default::default()
        };
        let so = RpingOptions {
            server: true,
            count: 3,
            ..base.clone()
        };
        let h = start_server(so);
        let c = client(&RpingOptions { count: 2, ..base }).unwrap();
        assert_eq!(c.pings, 2);
        let e = h.join().unwrap().unwrap_err();
        assert!(e.contains("2 ping(s) came, expected 3"), "{e}");
    }

    #[test]
    fn rdma_cm_example_peers_meet_each_other() {
        crate::register_providers();
        let base = RpingOptions {
            port: 17_178,
            timeout: Duration::from_secs(20),
            ..Default::default()
        };
        let so = RpingOptions {
            server: true,
            ..base.clone()
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let h = std::thread::spawn(move || cm_serve(&so, || tx.send(()).unwrap()));
        rx.recv().unwrap();
        cm_client(&base).unwrap();
        h.join().unwrap().unwrap();
    }

    /// A client that breaks rping's protocol: its first message offers
    /// `start` (address, key, length: `None` for its start buffer's own),
    /// and if the server reads and says go ahead, a sink of `sink_len`
    /// bytes (its sink buffer, 64 bytes). The server's verdict, and the
    /// sink's bytes.
    fn against_bad_client(
        port: u16,
        start: (Option<u64>, Option<u32>),
        sink_len: u32,
    ) -> (Result<RpingReport, String>, Vec<u8>) {
        crate::register_providers();
        let base = RpingOptions {
            port,
            addr: "127.0.252.40".parse().unwrap(),
            local: "127.0.252.41".parse().unwrap(),
            timeout: Duration::from_secs(5),
            ..Default::default()
        };
        let h = start_server(RpingOptions {
            server: true,
            ..base.clone()
        });
        let mut s = Side::open(&base, base.local, 64, true).unwrap();
        s.post_recv().unwrap();
        s.ep.connect(base.addr, u64::from(port), Some(base.timeout), b"")
            .unwrap();
        let deadline = crate::deadline_in(base.timeout);
        match s.next(deadline, "the connection").unwrap() {
            Event::Connection(e) => assert_eq!(e.kind, ConnectionEventKind::Established),
            other => panic!("{other:?}"),
        }
        let src = s.start.clone().unwrap();
        src.write_at(0, &pattern(0, 64)).unwrap();
        let buf = start.0.unwrap_or_else(|| src.address().unwrap());
        let len = start.1.unwrap_or(64);
        s.send_info(encode_info(buf, src.rmr_context().unwrap(), len))
            .unwrap();
        if let Ok(Some(_)) = s.recv_info("the go ahead") {
            let (addr, key) = (s.rdma.address().unwrap(), s.rdma.rmr_context().unwrap());
            let _ = s.wait_done(C_SEND, "the send");
            let _ = s.send_info(encode_info(addr, key, sink_len));
            let _ = s.recv_info("the second go ahead");
        }
        let r = h.join().unwrap();
        let sink = s.rdma.to_vec().unwrap();
        s.close();
        (r, sink)
    }

    /// The lengths and addresses of a client's messages are checked: a
    /// source of 0 bytes or more than the server's buffer is refused, one
    /// that wraps past the end of the address space fails the read, and a
    /// sink smaller than the ping is refused rather than written past
    /// what the client offered. Each is an error, never a panic.
    #[test]
    fn a_clients_bad_buffers_are_refused() {
        let e = against_bad_client(19050, (None, Some(0)), 64)
            .0
            .unwrap_err();
        assert!(e.contains("offers 0 bytes"), "{e}");
        let e = against_bad_client(19051, (None, Some(70_000)), 64)
            .0
            .unwrap_err();
        assert!(e.contains("offers 70000 bytes"), "{e}");
        let e = against_bad_client(19052, (Some(u64::MAX - 10), None), 64)
            .0
            .unwrap_err();
        assert!(e.contains("RdmaRead"), "{e}");
        let (r, sink) = against_bad_client(19053, (None, None), 1);
        assert!(
            sink[1..].iter().all(|&b| b == 0),
            "the server wrote past the 1 byte of the client's sink: {:?}",
            c_str(&sink)
        );
        let e = r.unwrap_err();
        assert!(e.contains("sink"), "{e}");
    }

    /// A connect of the rdma-cm client that fails says how (here: nobody
    /// listens), not the receive its end flushed first.
    #[test]
    fn a_failed_rdma_cm_connect_says_why() {
        crate::register_providers();
        let o = RpingOptions {
            port: 19054,
            addr: "127.0.252.42".parse().unwrap(),
            local: "127.0.252.43".parse().unwrap(),
            timeout: Duration::from_secs(5),
            ..Default::default()
        };
        let e = cm_client(&o).unwrap_err();
        assert!(e.contains("NonPeerRejected"), "{e}");
    }

    #[test]
    fn bad_sizes_are_refused() {
        for size in [MIN_SIZE - 1, MAX_SIZE + 1] {
            let o = RpingOptions {
                size,
                ..Default::default()
            };
            assert!(run(&o).unwrap_err().contains("invalid size"));
        }
    }
}
