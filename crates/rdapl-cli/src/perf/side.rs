//! One side of a test: its IA, endpoint, EVD and message buffers, and
//! the steps both the client and the server take (control messages,
//! posting, stamping and checking messages, the RDMA phases' offers).

use super::*;

/// One side: an IA, a zone, one EVD for everything, an endpoint, a send
/// and a receive region, and on a server the region it offers for RDMA.
pub(super) struct Side {
    pub(super) ia: Ia,
    pub(super) evd: Evd,
    pub(super) ep: rdapl::Ep,
    /// Sends' sources and RDMA Reads' destinations.
    pub(super) send: Lmr,
    pub(super) recv: Lmr,
    /// The region a server offers its clients' RDMA Writes and Reads.
    pub(super) target: Option<Lmr>,
    pub(super) slot: usize,
    pub(super) window: usize,
    /// Send buffers cycled through (at most `window`).
    pub(super) send_slots: usize,
    /// Receive buffers cycled through (at most `window + 1`).
    pub(super) recv_slots: usize,
    pub(super) timeout: Duration,
    pub(super) wait: bool,
    /// Empty polls between two yields of the CPU (0: never; see
    /// `PerfOptions::poll_yield`).
    pub(super) poll_yield: u32,
    /// The end (a connection event other than `Established`) of the
    /// endpoint's last connection was taken from the EVD, or there is no
    /// connection: nothing of it is left to drain.
    pub(super) end_seen: std::cell::Cell<bool>,
}

impl Side {
    /// `target_slots` message slots of RDMA target (0: none).
    pub(super) fn open(o: &PerfOptions, slot: usize, target_slots: usize) -> Result<Side, String> {
        // Every slot takes a control message too.
        let slot = slot.max(CONTROL);
        let ia = Ia::open_with(
            &o.provider,
            IaOptions {
                params: format!("addr={} {}", o.addr, o.params),
                ..Default::default()
            },
        )
        .map_err(|e| format!("opening an IA of {:?} at {}: {e}", o.provider, o.addr))?;
        let pz = ia.pz_create().map_err(|e| e.to_string())?;
        let qlen = 4 * o.window + 16;
        let evd = ia
            .evd_create(qlen, EvdFlags::DTO | EvdFlags::CONNECTION | EvdFlags::CR)
            .map_err(|e| format!("creating the EVD: {e}"))?;
        let attr = rdapl::EpAttr {
            max_recv_dtos: o.window + 1,
            max_request_dtos: o.window + 1,
            max_message_size: slot as u64,
            ..Default::default()
        };
        let ep = ia
            .ep_builder(&pz)
            .evd(&evd)
            .attr(attr)
            .create()
            .map_err(|e| format!("creating the endpoint: {e}"))?;
        let send_slots = o.buffers.unwrap_or(o.window).min(o.window);
        let recv_slots = o.buffers.unwrap_or(o.window + 1).min(o.window + 1);
        // Sizes the user chose: memory that cannot be had is an error,
        // not an abort of the process.
        let region = |slots: usize| {
            let r = slot
                .checked_mul(slots)
                .and_then(Region::try_zeroed)
                .ok_or_else(|| {
                    format!("no memory for {slots} buffers of {slot} bytes (message size, window, buffers)")
                })?;
            pz.lmr_create(r, MemPriv::ALL).map_err(|e| e.to_string())
        };
        let send = region(send_slots)?;
        let recv = region(recv_slots)?;
        let target = match target_slots {
            0 => None,
            n => Some(region(n)?),
        };
        Ok(Side {
            ia,
            evd,
            ep,
            send,
            recv,
            target,
            slot,
            window: o.window,
            send_slots,
            recv_slots,
            timeout: o.timeout,
            wait: o.wait,
            poll_yield: o.poll_yield,
            end_seen: std::cell::Cell::new(true),
        })
    }

    /// The next event, polled or waited for, within the timeout.
    pub(super) fn next(&self) -> Result<Event, String> {
        self.next_within(self.timeout)
    }

    /// The next event if there is one, without waiting. Every event the
    /// side takes passes here or [`Side::note`].
    pub(super) fn try_next(&self) -> Result<Option<Event>, String> {
        let ev = self.evd.dequeue().map_err(|e| e.to_string())?;
        if let Some(ev) = &ev {
            self.note(ev);
        }
        Ok(ev)
    }

    /// Records the end of the connection when `ev` is it (`end_seen`).
    fn note(&self, ev: &Event) {
        if let Event::Connection(c) = ev
            && c.kind != ConnectionEventKind::Established
        {
            self.end_seen.set(true);
        }
    }

    /// The next event, waiting at most `bound`.
    pub(super) fn next_within(&self, bound: Duration) -> Result<Event, String> {
        // A polling side reads the clock once every `CLOCK_EVERY` empty
        // passes: a read can cost as much as the pass (the EVD's check and
        // the provider's progress) on machines with a slow clock source,
        // and the pass that finds the event would wait behind it.
        const CLOCK_EVERY: u32 = 64;
        let mut end = None;
        let mut empty = 0u32;
        loop {
            let got = if self.wait {
                match self.evd.wait(Some(Duration::from_millis(100)), 1) {
                    Ok((ev, _)) => {
                        self.note(&ev);
                        Some(ev)
                    }
                    Err(rdapl::Error::TimeoutExpired { .. }) => None,
                    Err(e) => return Err(e.to_string()),
                }
            } else {
                self.try_next()?
            };
            if let Some(ev) = got {
                return Ok(ev);
            }
            empty = empty.wrapping_add(1);
            if self.wait || empty % CLOCK_EVERY == 1 {
                let now = Instant::now();
                if now >= *end.get_or_insert(crate::later(now, bound)) {
                    return Err(format!("no event within {bound:?}"));
                }
            }
            if !self.wait {
                self.pause(empty);
            }
        }
    }

    /// Between two empty polls: a spin hint, and once every `poll_yield`
    /// of them a yield of the CPU.
    pub(super) fn pause(&self, empty: u32) {
        if self.poll_yield > 0 && empty.is_multiple_of(self.poll_yield) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }

    /// Offset of the buffer of receive `i` (its cookie).
    fn recv_off(&self, i: usize) -> usize {
        (i % self.recv_slots) * self.slot
    }

    /// Offset of the buffer of send `i`.
    pub(super) fn send_off(&self, i: usize) -> usize {
        (i % self.send_slots) * self.slot
    }

    /// True when every send in flight has a buffer of its own (bytes of
    /// `bw` messages can be stamped).
    pub(super) fn sends_distinct(&self) -> bool {
        self.send_slots == self.window
    }

    /// True when every receive posted has a buffer of its own (bytes of
    /// `bw` messages can be checked).
    pub(super) fn recvs_distinct(&self) -> bool {
        self.recv_slots == self.window + 1
    }

    pub(super) fn post_recv(&self, i: usize) -> Result<(), String> {
        let t = self
            .recv
            .triplet(self.recv_off(i) as u64, self.slot as u64)
            .map_err(|e| e.to_string())?;
        self.ep
            .post_recv(&[t], i as u64, CompletionFlags::DEFAULT)
            .map_err(|e| {
                format!(
                    "posting receive {i} (slot {}, window {}): {e}",
                    self.slot, self.window
                )
            })
    }

    pub(super) fn post_send(&self, i: usize, len: usize, cookie: u64) -> Result<(), String> {
        let off = self.send_off(i);
        let t = self
            .send
            .triplet(off as u64, len as u64)
            .map_err(|e| e.to_string())?;
        self.ep
            .post_send(&[t], cookie, CompletionFlags::DEFAULT)
            .map_err(|e| format!("posting a send: {e}"))
    }

    /// Writes the first and last byte of send slot `i` for message `seq`.
    pub(super) fn stamp(&self, i: usize, len: usize, seq: u64) -> Result<(), String> {
        stamp_at(&self.send, self.send_off(i), len, seq)
    }

    /// Checks the first and last byte of receive slot `i`.
    pub(super) fn check(&self, i: usize, len: usize, seq: u64) -> Result<(), String> {
        check_at(&self.recv, self.recv_off(i), len, seq)
    }

    /// Sends the control message of a phase: `count` messages of `size`
    /// bytes, of `test` (16 bytes: a magic number, the test and whether the
    /// messages' bytes are stamped, size, count).
    pub(super) fn control(&self, c: Control) -> Result<(), String> {
        let Control {
            test,
            op,
            stamped,
            size,
            count,
            slots,
        } = c;
        let slots = u32::try_from(slots)
            .ok()
            .filter(|&n| n < 1 << (32 - SLOTS_SHIFT))
            .ok_or("too many RDMA slots for a control message")?;
        let mut m = [0u8; CONTROL];
        m[..4].copy_from_slice(&MAGIC.to_le_bytes());
        let word = test as u32
            | if stamped { 0 } else { UNSTAMPED }
            | (op as u32) << OP_SHIFT
            | slots << SLOTS_SHIFT;
        m[4..8].copy_from_slice(&word.to_le_bytes());
        m[8..12].copy_from_slice(&(size as u32).to_le_bytes());
        m[12..].copy_from_slice(&(count as u32).to_le_bytes());
        self.send.write_at(0, &m).map_err(|e| e.to_string())?;
        self.post_send(0, CONTROL, CONTROL_COOKIE)
    }

    /// Reads the control message in receive slot `i` (`len` bytes).
    pub(super) fn read_control(&self, i: usize, len: usize) -> Result<Control, String> {
        let mut m = [0u8; CONTROL];
        if len != CONTROL {
            return Err(format!("expected a control message, got {len} bytes"));
        }
        self.recv
            .read_at(self.recv_off(i), &mut m)
            .map_err(|e| e.to_string())?;
        let word = |k: usize| u32::from_le_bytes(m[4 * k..4 * k + 4].try_into().unwrap());
        let flags = word(1);
        let test = match (word(0), flags & 0xff) {
            (MAGIC, 0) => Test::PingPong,
            (MAGIC, 1) => Test::Bw,
            _ => return Err("not an rdapl pingpong/bw peer".into()),
        };
        let op = Op::from_word((flags >> OP_SHIFT) & 0x3)
            .filter(|_| flags & !(0xff | UNSTAMPED | 0x3 << OP_SHIFT | 0xffff << SLOTS_SHIFT) == 0)
            .ok_or("a control message with an unknown operation (a newer rdapl?)")?;
        Ok(Control {
            test,
            op,
            stamped: flags & UNSTAMPED == 0,
            size: word(2) as usize,
            count: word(3) as usize,
            slots: (flags >> SLOTS_SHIFT) as usize,
        })
    }

    /// True once the endpoint's connection is over (a post then fails).
    pub(super) fn ended(&self) -> bool {
        self.ep.state() != rdapl::EpState::Connected
    }

    /// Takes what the connection's end brings (flushed requests) up to its
    /// event.
    pub(super) fn drain_to_end(&self) -> Result<(), String> {
        loop {
            if let Event::Connection(c) = self.next()?
                && c.kind != ConnectionEventKind::Established
            {
                return Ok(());
            }
        }
    }

    /// The next receive's completion (slot, length), send completions
    /// checked and skipped; `None` when the connection ended.
    pub(super) fn next_recv(&self) -> Result<Option<(usize, usize)>, String> {
        loop {
            match self.next()? {
                // The connection is ending: its requests come back flushed,
                // then its event (which ends the wait).
                Event::Dto(d) if d.status == DtoStatus::Flushed => {}
                Event::Dto(d) if d.operation == DtoOp::Receive => {
                    if d.status != DtoStatus::Success {
                        return Err(format!("a receive failed: {:?}", d.status));
                    }
                    return Ok(Some((d.cookie as usize, d.transferred_length as usize)));
                }
                Event::Dto(d) => {
                    if d.status != DtoStatus::Success {
                        return Err(format!("a send failed: {:?}", d.status));
                    }
                }
                Event::Connection(c) => match c.kind {
                    ConnectionEventKind::Disconnected | ConnectionEventKind::Broken => {
                        return Ok(None);
                    }
                    k => return Err(format!("unexpected connection event {k:?}")),
                },
                other => return Err(format!("unexpected event {other:?}")),
            }
        }
    }

    /// Sends `ctl` and waits for its send's completion and the peer's echo
    /// of it, in either order.
    pub(super) fn exchange_control(&self, ctl: Control) -> Result<(), String> {
        self.control(ctl)?;
        let (mut sent, mut echoed) = (false, false);
        while !(sent && echoed) {
            let ev = self.next()?;
            match control_step(&ev) {
                ControlStep::Sent if !sent => sent = true,
                ControlStep::Echo(i, len) if !echoed => {
                    if self.read_control(i, len)? != ctl {
                        return Err("the server's echo of the control message did not match".into());
                    }
                    self.post_recv(i)?;
                    echoed = true;
                }
                ControlStep::Earlier => {}
                // The server refused the run (a size above its
                // `--max-size`, a check that failed) and ended the
                // connection.
                ControlStep::Ended => {
                    return Err(format!(
                        "the server ended the connection instead of answering the control \
                         message ({} messages of {} bytes; its stderr says why: a size above \
                         its --max-size, or data that arrived corrupted)",
                        ctl.count, ctl.size
                    ));
                }
                _ => {
                    return Err(format!("expected the control message's echo, got {ev:?}"));
                }
            }
        }
        Ok(())
    }

    /// Waits for `n` send completions (other events are an error).
    pub(super) fn sends_done(&self, n: usize) -> Result<(), String> {
        for _ in 0..n {
            match self.next()? {
                Event::Dto(d) if d.operation == DtoOp::Send && d.status == DtoStatus::Success => {}
                other => return Err(format!("expected a send completion, got {other:?}")),
            }
        }
        Ok(())
    }

    /// Takes the events already queued (a look that waits for nothing),
    /// each checked by `f`: how many.
    pub(super) fn more_done(
        &self,
        mut f: impl FnMut(Event) -> Result<(), String>,
    ) -> Result<usize, String> {
        let mut n = 0;
        while let Some(ev) = self.try_next()? {
            f(ev)?;
            n += 1;
        }
        Ok(n)
    }

    /// The next RDMA completion of a phase of `c`: its cookie (the
    /// message's number). A Read that landed in a buffer of its own
    /// (`checked`) is checked against the server's stamp of its piece.
    pub(super) fn rdma_done(&self, c: &Control, checked: bool) -> Result<u64, String> {
        self.rdma_check(self.next()?, c, checked)
    }

    /// [`Side::rdma_done`] of an event already taken.
    pub(super) fn rdma_check(&self, ev: Event, c: &Control, checked: bool) -> Result<u64, String> {
        let want = if c.op == Op::Read {
            DtoOp::RdmaRead
        } else {
            DtoOp::RdmaWrite
        };
        match ev {
            Event::Dto(d) if d.operation == want && d.status == DtoStatus::Success => {
                if d.transferred_length != c.size as u64 {
                    return Err(format!(
                        "RDMA operation {} moved {} bytes, expected {}",
                        d.cookie, d.transferred_length, c.size
                    ));
                }
                if checked {
                    let piece = d.cookie % c.slots as u64;
                    check_at(&self.send, self.send_off(d.cookie as usize), c.size, piece)?;
                }
                Ok(d.cookie)
            }
            other => Err(format!("expected an RDMA completion, got {other:?}")),
        }
    }

    /// The server's offer of its RDMA region, for its accept.
    pub(super) fn offer(&self) -> Result<Vec<u8>, String> {
        let Some(t) = &self.target else {
            return Ok(Vec::new());
        };
        let len = t.whole().map_err(|e| e.to_string())?.segment_length;
        let r = t.rmr_triplet(0, len).map_err(|e| e.to_string())?;
        let mut pd = Vec::with_capacity(OFFER);
        pd.extend_from_slice(&MAGIC.to_le_bytes());
        pd.extend_from_slice(&r.rmr_context.to_le_bytes());
        pd.extend_from_slice(&r.target_address.to_le_bytes());
        pd.extend_from_slice(&r.segment_length.to_le_bytes());
        Ok(pd)
    }
}

/// The server's RDMA region as its accept's private data offers it.
pub(super) fn read_offer(pd: Option<&[u8]>) -> Option<RmrTriplet> {
    let pd = pd?.get(..OFFER)?;
    let word = |k: usize| u32::from_le_bytes(pd[k..k + 4].try_into().unwrap());
    let long = |k: usize| u64::from_le_bytes(pd[k..k + 8].try_into().unwrap());
    (word(0) == MAGIC).then(|| RmrTriplet {
        rmr_context: word(4),
        target_address: long(8),
        segment_length: long(16),
    })
}

/// Writes the first and last byte of `len` bytes at `off` of `lmr` for
/// message `seq`.
pub(super) fn stamp_at(lmr: &Lmr, off: usize, len: usize, seq: u64) -> Result<(), String> {
    let b = seq as u8;
    lmr.write_at(off, &[b]).map_err(|e| e.to_string())?;
    if len > 1 {
        lmr.write_at(off + len - 1, &[b ^ 0xA5])
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Checks the first and last byte of `len` bytes at `off` of `lmr`
/// against the stamp of message `seq`.
pub(super) fn check_at(lmr: &Lmr, off: usize, len: usize, seq: u64) -> Result<(), String> {
    let mut first = [0u8];
    let mut last = [0u8];
    lmr.read_at(off, &mut first).map_err(|e| e.to_string())?;
    lmr.read_at(off + len - 1, &mut last)
        .map_err(|e| e.to_string())?;
    let b = seq as u8;
    if first[0] != b || (len > 1 && last[0] != b ^ 0xA5) {
        return Err(format!("message {seq} of {len} bytes arrived corrupted"));
    }
    Ok(())
}

/// A pingpong of RDMA Writes (perftest's `ib_write_lat`), either side:
/// message `seq` is written into piece 0 of the peer's region `t`, and its
/// arrival is seen in piece 0 of this side's own region, by polling its
/// last byte (the peer's stamp), then checking its first; the EVD is
/// dequeued meanwhile, which drives the provider and takes the Writes'
/// completions. `first`: this side writes first (the client). Returns the
/// peer's next message (receive, length) if it arrived before this side's
/// last Writes completed ([`WriteStep::Message`]): the caller takes it as
/// the message it waits for next.
pub(super) fn write_pingpong(
    s: &Side,
    ctl: &Control,
    t: RmrTriplet,
    first: bool,
) -> Result<Option<(usize, usize)>, String> {
    let size = ctl.size;
    let mine = s.target.as_ref().ok_or("no region of this side's own")?;
    let remote = RmrTriplet {
        segment_length: size as u64,
        ..t
    };
    if t.segment_length < size as u64 {
        return Err(format!(
            "the peer's region ({} bytes) is smaller than a {size}-byte message",
            t.segment_length
        ));
    }
    let local = s.send.triplet(0, size as u64).map_err(|e| e.to_string())?;
    if first {
        // No stamp of an earlier phase in the way (the peer writes only
        // after this side's first message; the server cleared its own
        // piece before its echo).
        mine.write_at(0, &vec![CLEAR; size])
            .map_err(|e| e.to_string())?;
    }
    let mut done = 0;
    let mut early = None;
    let mut took = |ev: Event, done: &mut usize| match write_step(&ev) {
        WriteStep::Written => {
            *done += 1;
            Ok(())
        }
        WriteStep::ControlSent => Ok(()),
        WriteStep::Message(i, len) if early.is_none() => {
            early = Some((i, len));
            Ok(())
        }
        _ => Err(format!("expected an RDMA Write's completion, got {ev:?}")),
    };
    for seq in 0..ctl.count {
        let write = |seq: usize| {
            stamp_at(&s.send, 0, size, seq as u64)?;
            s.ep.post_rdma_write(&[local], remote, seq as u64, CompletionFlags::DEFAULT)
                .map_err(|e| format!("posting RDMA Write {seq}: {e}"))
        };
        if first {
            write(seq)?;
        }
        // The peer's message `seq`: its stamp's last byte, then the whole
        // stamp (a region's bytes change under its lock, so the last one
        // seen means the message is in).
        let want = if size > 1 {
            seq as u8 ^ 0xA5
        } else {
            seq as u8
        };
        let end = crate::deadline_in(s.timeout);
        let mut spins = 0u32;
        loop {
            let mut last = [0u8];
            mine.read_at(size - 1, &mut last)
                .map_err(|e| e.to_string())?;
            if last[0] == want {
                break;
            }
            if let Some(ev) = s.try_next()? {
                took(ev, &mut done)?;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) && Instant::now() >= end {
                return Err(format!("RDMA Write {seq} of the peer did not arrive"));
            }
            s.pause(spins);
        }
        check_at(mine, 0, size, seq as u64)?;
        if !first {
            write(seq)?;
        }
    }
    while done < ctl.count {
        took(s.next()?, &mut done)?;
    }
    Ok(early)
}
