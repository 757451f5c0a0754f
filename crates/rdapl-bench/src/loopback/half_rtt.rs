//! The half round trip: a 64-byte ping-pong of rdapl's send/receive (by
//! triplets and by owned buffers, polled or waited) against crossbeam's
//! channels, in one process, and the serial variant on one thread.

use super::*;

/// The 64-byte message carrying `v`.
pub(super) fn payload(v: u64) -> [u8; MSG] {
    let mut m = [0u8; MSG];
    m[..8].copy_from_slice(&v.to_le_bytes());
    m
}

pub(super) fn value_of(m: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&m[..8]);
    u64::from_le_bytes(b)
}

/// One side of a ping-pong.
pub(super) trait Peer: Send + 'static {
    /// Sends `v`; false if that failed.
    fn send(&mut self, v: u64) -> bool;
    /// The next value; `None` on failure or once `hard` passed.
    fn recv(&mut self, hard: Instant) -> Option<u64>;
}

/// A loopback endpoint sending and receiving 64-byte messages.
pub(super) struct Messenger {
    pub(super) ep: Ep,
    pub(super) evd: Evd,
    pub(super) send_lmr: Lmr,
    pub(super) send_iov: [LmrTriplet; 1],
    /// Where the message starts in the send region.
    pub(super) send_off: usize,
    pub(super) recv_lmr: Lmr,
    pub(super) recv_iov: Vec<LmrTriplet>,
    /// Where receive slot 0 starts in the receive region (slot `k` is
    /// `SLOT` bytes further per `k`).
    pub(super) recv_off: usize,
    /// Receive slots consumed and not yet reposted (reposted after the
    /// next send).
    pub(super) consumed: Vec<usize>,
    pub(super) blocking: bool,
}

/// The spacing of the 64-byte messages in registered memory: a 128-byte
/// pair of cache lines each.
pub(super) const SLOT: usize = 128;

impl Messenger {
    /// Registers a send buffer and `depth` receive slots on `side`, and
    /// posts every receive.
    pub(super) fn new(side: &Side, depth: usize, blocking: bool) -> rdapl::Result<Messenger> {
        let depth = depth.max(1);
        // Every message on a 128-byte pair of lines of its own (as owned
        // buffers are): `n` slots and room to align the first.
        let region = |n: usize| Region::from_vec(vec![1; (n + 1) * SLOT]);
        let aligned = |r: &Region| (SLOT - r.address() as usize % SLOT) % SLOT;
        let send_region = region(1);
        let send_off = aligned(&send_region);
        let recv_region = region(depth);
        let recv_off = aligned(&recv_region);
        let send_lmr = side.pz.lmr_create(send_region, MemPriv::ALL)?;
        let recv_lmr = side.pz.lmr_create(recv_region, MemPriv::ALL)?;
        let send_iov = [send_lmr.triplet(send_off as u64, MSG as u64)?];
        let recv_iov = (0..depth)
            .map(|k| recv_lmr.triplet((recv_off + k * SLOT) as u64, MSG as u64))
            .collect::<rdapl::Result<Vec<_>>>()?;
        let m = Messenger {
            ep: side.ep.clone(),
            evd: side.evd.clone(),
            send_lmr,
            send_iov,
            send_off,
            recv_lmr,
            recv_iov,
            recv_off,
            consumed: Vec::with_capacity(depth),
            blocking,
        };
        for slot in 0..depth {
            m.repost(slot)?;
        }
        Ok(m)
    }

    fn repost(&self, slot: usize) -> rdapl::Result<()> {
        self.ep.post_recv(
            &self.recv_iov[slot..slot + 1],
            slot as u64,
            CompletionFlags::DEFAULT,
        )
    }

    /// Handles one completion: `Some(v)` for a received message (its slot
    /// is set aside, to be reposted after the next send), `None` for this
    /// side's own send completion, `Err` for anything else (a failed DTO, a
    /// connection event). (A function of the fields it needs, so that a
    /// poll loop borrows the EVD and these apart.)
    fn on_event(
        (recv_lmr, recv_off, depth): (&Lmr, usize, usize),
        consumed: &mut Vec<usize>,
        ev: Event,
    ) -> Result<Option<u64>, ()> {
        let Event::Dto(d) = ev else { return Err(()) };
        if d.status != DtoStatus::Success {
            return Err(());
        }
        match d.operation {
            DtoOp::Send => Ok(None),
            DtoOp::Receive if d.transferred_length == MSG as u64 => {
                let slot = usize::try_from(d.cookie).map_err(|_| ())?;
                if slot >= depth || consumed.len() == depth {
                    return Err(());
                }
                let mut head = [0u8; 8];
                recv_lmr
                    .read_at(recv_off + slot * SLOT, &mut head)
                    .map_err(|_| ())?;
                consumed.push(slot);
                Ok(Some(value_of(&head)))
            }
            _ => Err(()),
        }
    }
}

impl Peer for Messenger {
    fn send(&mut self, v: u64) -> bool {
        let sent = self.send_lmr.write_at(self.send_off, &payload(v)).is_ok()
            && self
                .ep
                .post_send(&self.send_iov, v, CompletionFlags::DEFAULT)
                .is_ok();
        // The reply first, then the receives it consumed (see the module
        // documentation).
        let mut reposted = sent;
        while let Some(slot) = self.consumed.pop() {
            reposted &= self.repost(slot).is_ok();
        }
        reposted
    }

    fn recv(&mut self, hard: Instant) -> Option<u64> {
        let Messenger {
            evd,
            recv_lmr,
            recv_iov,
            recv_off,
            consumed,
            blocking,
            ..
        } = self;
        let recv = (&*recv_lmr, *recv_off, recv_iov.len());
        next_value(evd, *blocking, hard, |ev| {
            Messenger::on_event(recv, consumed, ev)
        })
    }
}

/// How long a side waits for its send buffer to come back.
pub(super) const SEND_BUF_WAIT: Duration = Duration::from_secs(2);

/// A loopback endpoint sending and receiving 64-byte messages in owned
/// buffers: each completion hands its buffer back, a received one is read
/// in place and reposted, the send buffer is written in place for the next
/// message.
pub(super) struct BufMessenger {
    pub(super) ep: Ep,
    pub(super) evd: Evd,
    /// The send buffer, while no send of it is outstanding.
    pub(super) send_buf: Option<Buf>,
    /// Receive buffers consumed and not yet reposted (reposted after the
    /// next send), with their cookies.
    pub(super) consumed: Vec<(Buf, u64)>,
    /// How many receive buffers it has.
    pub(super) depth: usize,
    pub(super) blocking: bool,
}

impl BufMessenger {
    /// A send buffer and `depth` posted receive buffers on `side`.
    pub(super) fn new(side: &Side, depth: usize, blocking: bool) -> Result<BufMessenger, String> {
        let depth = depth.max(1);
        for slot in 0..depth {
            let b = side.pz.buf_create(MSG).map_err(|e| e.to_string())?;
            side.ep
                .post_recv_buf(b, slot as u64, CompletionFlags::DEFAULT)
                .map_err(|e| e.to_string())?;
        }
        Ok(BufMessenger {
            ep: side.ep.clone(),
            evd: side.evd.clone(),
            send_buf: Some(side.pz.buf_create(MSG).map_err(|e| e.to_string())?),
            consumed: Vec::with_capacity(depth),
            depth,
            blocking,
        })
    }

    /// As [`Messenger::on_event`]; the send completion gives the send
    /// buffer back (into `send_buf`), a received buffer goes to
    /// `consumed` (at most `depth` of them).
    fn on_event(
        send_buf: &mut Option<Buf>,
        consumed: &mut Vec<(Buf, u64)>,
        depth: usize,
        ev: Event,
    ) -> Result<Option<u64>, ()> {
        let Event::Dto(d) = ev else { return Err(()) };
        if d.status != DtoStatus::Success {
            return Err(());
        }
        let buf = d.buf.ok_or(())?;
        match d.operation {
            DtoOp::Send => {
                *send_buf = Some(buf);
                Ok(None)
            }
            DtoOp::Receive if d.transferred_length == MSG as u64 && consumed.len() < depth => {
                let v = value_of(&buf);
                consumed.push((buf, d.cookie));
                Ok(Some(v))
            }
            _ => Err(()),
        }
    }
}

impl Peer for BufMessenger {
    fn send(&mut self, v: u64) -> bool {
        // The buffer comes back with the last send's completion, which can
        // land after the reply to it: wait for it (the peer sends nothing
        // before this message, so any other event is a failure).
        if self.send_buf.is_none() {
            let hard = Instant::now() + SEND_BUF_WAIT;
            let (evd, send_buf) = (&self.evd, &mut self.send_buf);
            let (consumed, depth) = (&mut self.consumed, self.depth);
            let back = spin_poll(hard, || match evd.dequeue() {
                Ok(Some(ev)) => match BufMessenger::on_event(send_buf, consumed, depth, ev) {
                    Ok(None) => Ok(send_buf.is_some().then_some(())),
                    _ => Err(()),
                },
                Ok(None) => Ok(None),
                Err(_) => Err(()),
            });
            if back.is_none() {
                return false;
            }
        }
        let Some(mut b) = self.send_buf.take() else {
            return false;
        };
        b.copy_from_slice(&payload(v));
        let sent = self
            .ep
            .post_send_buf(b, MSG, v, CompletionFlags::DEFAULT)
            .is_ok();
        // The reply first, then the receives it consumed (see the module
        // documentation).
        let mut reposted = sent;
        while let Some((b, cookie)) = self.consumed.pop() {
            reposted &= self
                .ep
                .post_recv_buf(b, cookie, CompletionFlags::DEFAULT)
                .is_ok();
        }
        reposted
    }

    fn recv(&mut self, hard: Instant) -> Option<u64> {
        let (evd, send_buf) = (&self.evd, &mut self.send_buf);
        let (consumed, depth) = (&mut self.consumed, self.depth);
        next_value(evd, self.blocking, hard, |ev| {
            BufMessenger::on_event(send_buf, consumed, depth, ev)
        })
    }
}

/// The next value received on `evd` (busy `dequeue`, or blocking `wait`
/// if `blocking`), each event handled by `on_event` (`Some`: a value,
/// `None`: the side's own send completion, `Err`: a failure); `None` on
/// failure or once `hard` passed. Bounded: every `wait` returns within
/// [`BLOCK_SLICE`], and each turn consumes an event, or gives up if `hard`
/// passed.
fn next_value(
    evd: &Evd,
    blocking: bool,
    hard: Instant,
    mut on_event: impl FnMut(Event) -> Result<Option<u64>, ()>,
) -> Option<u64> {
    if !blocking {
        return spin_poll(hard, || match evd.dequeue() {
            Ok(Some(ev)) => on_event(ev),
            Ok(None) => Ok(None),
            Err(_) => Err(()),
        });
    }
    loop {
        let ev = match evd.wait(Some(BLOCK_SLICE), 1) {
            Ok((ev, _)) => ev,
            Err(rdapl::Error::TimeoutExpired { .. }) if Instant::now() < hard => continue,
            Err(_) => return None,
        };
        match on_event(ev) {
            Ok(Some(v)) => return Some(v),
            Ok(None) => {}
            Err(()) => return None,
        }
    }
}

/// The longest one blocking call of a ping-pong side lasts (`wait`,
/// `recv_timeout`): far longer than a round trip, short enough to notice
/// the run's hard deadline in good time.
pub const BLOCK_SLICE: Duration = Duration::from_millis(20);

/// One side of a crossbeam ping-pong of `[u8; 64]`.
pub(super) struct Chan {
    pub(super) tx: crossbeam_channel::Sender<[u8; MSG]>,
    pub(super) rx: crossbeam_channel::Receiver<[u8; MSG]>,
    pub(super) blocking: bool,
}

impl Peer for Chan {
    fn send(&mut self, v: u64) -> bool {
        self.tx.send(payload(v)).is_ok()
    }

    fn recv(&mut self, hard: Instant) -> Option<u64> {
        if self.blocking {
            loop {
                match self.rx.recv_timeout(BLOCK_SLICE) {
                    Ok(m) => return Some(value_of(&m)),
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) if Instant::now() < hard => {}
                    Err(_) => return None,
                }
            }
        }
        spin_poll(hard, || match self.rx.try_recv() {
            Ok(m) => Ok(Some(value_of(&m))),
            Err(crossbeam_channel::TryRecvError::Empty) => Ok(None),
            Err(crossbeam_channel::TryRecvError::Disconnected) => Err(()),
        })
    }
}

/// Ping-pong between this thread (`me`) and an echo thread (`echo`).
fn pingpong<P: Peer>(mut me: P, echo: P, p: &Params) -> Run {
    let start = Instant::now();
    let deadline = start + p.limit;
    let hard = deadline + p.grace;
    let failed = Run {
        failed: true,
        ..Run::default()
    };
    let echo = std::thread::Builder::new()
        .name("lb-echo".into())
        .spawn(move || {
            let mut echo = echo;
            // Bounded: every `recv` returns by `hard`.
            loop {
                match echo.recv(hard) {
                    Some(STOP) => return true,
                    Some(v) => {
                        if !echo.send(v) {
                            return false;
                        }
                    }
                    None => return false,
                }
            }
        });
    let Ok(echo) = echo else { return failed };
    let total = p.warmup_iters + p.iters;
    let mut run = Run {
        samples: Vec::with_capacity(p.iters),
        ..Run::default()
    };
    for i in 0..total as u64 {
        if Instant::now() > deadline {
            run.capped = true;
            break;
        }
        let t0 = Instant::now();
        if !me.send(i) {
            run.failed = true;
            break;
        }
        match me.recv(hard) {
            Some(v) if v == i => {}
            _ => {
                run.failed = true;
                break;
            }
        }
        let dt = as_nanos(t0.elapsed());
        if i as usize >= p.warmup_iters {
            run.samples.push(dt);
        }
    }
    let stopped = me.send(STOP);
    let echo_ok = echo.join().unwrap_or(false);
    run.failed |= !(stopped && echo_ok);
    run
}

/// Both ends of the ping-pong driven by this one thread, in turn (the
/// report's software-path rows and the profiling example): each round trip
/// does exactly the work of the two-thread ping-pong (send and repost,
/// consume the completions, read the value, echo back) but nothing ever
/// crosses cores or waits,
/// so its time is the software path alone.
fn serial<P: Peer>(mut me: P, mut echo: P, p: &Params) -> Run {
    let deadline = Instant::now() + p.limit;
    let hard = deadline + p.grace;
    let mut run = Run {
        samples: Vec::with_capacity(p.iters.min(1 << 20)),
        ..Run::default()
    };
    for i in 0..(p.warmup_iters + p.iters) as u64 {
        if Instant::now() > deadline {
            run.capped = true;
            break;
        }
        let t0 = Instant::now();
        let ok =
            me.send(i) && echo.recv(hard) == Some(i) && echo.send(i) && me.recv(hard) == Some(i);
        if !ok {
            run.failed = true;
            break;
        }
        if i as usize >= p.warmup_iters {
            run.samples.push(as_nanos(t0.elapsed()));
        }
    }
    run
}

/// [`run_half_rtt`] with both ends in this thread (see `serial`); for the
/// non-blocking methods only (a blocking one is run non-blocking).
pub fn run_half_rtt_serial(m: Method, p: &Params) -> Run {
    match m {
        Method::RdaplBufPoll | Method::RdaplBufWait => {
            loopback_pingpong(m, p, |s| BufMessenger::new(s, p.recv_depth, false), serial)
        }
        Method::RdaplPoll | Method::RdaplWait => loopback_pingpong(
            m,
            p,
            |s| Messenger::new(s, p.recv_depth, false).map_err(|e| e.to_string()),
            serial,
        ),
        Method::CrossbeamPoll | Method::CrossbeamBlocking => {
            let (t1, r1) = crossbeam_channel::bounded(p.capacity);
            let (t2, r2) = crossbeam_channel::bounded(p.capacity);
            let chan = |tx, rx| Chan {
                tx,
                rx,
                blocking: false,
            };
            serial(chan(t1, r2), chan(t2, r1), p)
        }
    }
}

/// `drive` ([`pingpong`] or [`serial`]) between the two ends of a new
/// connected pair, each end made by `end`; setup errors are printed and
/// make the run `failed`.
fn loopback_pingpong<P: Peer>(
    m: Method,
    p: &Params,
    end: impl Fn(&Side) -> Result<P, String>,
    drive: fn(P, P, &Params) -> Run,
) -> Run {
    let failed = || Run {
        failed: true,
        ..Run::default()
    };
    let pair = match Pair::connect(p.capacity) {
        Ok(pair) => pair,
        Err(e) => {
            eprintln!("loopback {}: setup failed: {e}", m.name());
            return failed();
        }
    };
    match (end(&pair.client), end(&pair.server)) {
        (Ok(me), Ok(echo)) => drive(me, echo, p),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("loopback {}: setting up the buffers: {e}", m.name());
            failed()
        }
    }
}

/// Runs one ping-pong method once; `Run::samples` are round trips (ns).
/// Setup errors are printed to stderr and make the run `failed`.
pub fn run_half_rtt(m: Method, p: &Params) -> Run {
    let blocking = m.blocking();
    match m {
        Method::RdaplBufPoll | Method::RdaplBufWait => loopback_pingpong(
            m,
            p,
            |s| BufMessenger::new(s, p.recv_depth, blocking),
            pingpong,
        ),
        Method::RdaplPoll | Method::RdaplWait => loopback_pingpong(
            m,
            p,
            |s| Messenger::new(s, p.recv_depth, blocking).map_err(|e| e.to_string()),
            pingpong,
        ),
        Method::CrossbeamPoll | Method::CrossbeamBlocking => {
            let (t1, r1) = crossbeam_channel::bounded(p.capacity);
            let (t2, r2) = crossbeam_channel::bounded(p.capacity);
            pingpong(
                Chan {
                    tx: t1,
                    rx: r2,
                    blocking,
                },
                Chan {
                    tx: t2,
                    rx: r1,
                    blocking,
                },
                p,
            )
        }
    }
}
