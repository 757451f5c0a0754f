//! The input side of a connection: reading the socket, into the input
//! buffer or straight into the payload's place, and feeding the engine
//! one MPA frame or FPDU at a time.
//!
//! * Large payload (from `DIRECT_MIN`) is read straight into its receive,
//!   region or read sink; smaller FPDUs several to a system call.
//! * An FPDU's header is looked at before it is fed: a Send waits for a
//!   receive, a Read Request's source is staged, tagged payload is told
//!   apart. Nothing the wire says is trusted: every range is checked.

use crate::memory::{RecvState, RxOp, StagedRead};
use rdapl::{ConnectionEventKind, DtoStatus, RmrTriplet};
use rdapl_iwarp::rdmap::READ_REQUEST_LEN;
use rdapl_iwarp::{Buffer, DdpHeader, Opcode, ReadRequest, State, fpdu};
use std::io::{self, IoSliceMut, Read};
use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};

use super::{Conn, IO_HIGH, Phase};

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
pub(super) const LARGE_AFTER: u8 = 8;

/// What a look at a socket's input found.
#[derive(Debug)]
enum Look {
    /// Bytes not read yet, or the end of the stream.
    Input,
    /// Nothing yet.
    Nothing,
    /// The error the socket held, which the look cleared.
    Failed(io::Error),
}

/// Looks at `sock`'s input without taking it (a one-byte peek). Like any
/// receive, the peek reports and clears an error the socket holds.
fn look(sock: &std::net::TcpStream) -> Look {
    let mut b = [0u8; 1];
    match sock.peek(&mut b) {
        Ok(_) => Look::Input,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Look::Nothing,
        // Not an answer: looked at again at the next check.
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Look::Input,
        Err(e) => Look::Failed(e),
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
    pub(super) fn read_socket(&mut self, now: u64) {
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
                        self.rx_last = now;
                        self.reads += 1;
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
                    Err(e) => {
                        self.eof = true;
                        self.socket_error("read", &e);
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
                    self.rx_last = now;
                    self.reads += 1;
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
                Err(e) => {
                    self.eof = true;
                    self.socket_error("read", &e);
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
    /// small FPDU, or memory the core does not lend): the caller reads
    /// into the buffer. The rest of a large FPDU goes straight to its place
    /// however little is left (a read that came short, at the end of what
    /// the peer had sent, leaves any amount). The input buffer is empty
    /// when it is called.
    fn read_direct(&mut self, now: u64) -> Option<io::Result<(usize, usize, usize)>> {
        let (place, due) = self.engine.as_ref()?.rx_direct()?;
        let due = due as usize;
        if due < DIRECT_MIN && !self.direct {
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
        self.eof = true;
        self.end_stall();
        // (`take_error` clears the error: it is acted on, and said, here.)
        match self.sock.take_error() {
            Ok(Some(e)) => self.socket_error("poll", &e),
            _ => self.socket_failed(),
        }
    }

    /// Whether the peer is still heard from: input not read yet, or its
    /// end. An error the socket holds (a reset, TCP's user timeout) breaks
    /// the connection here: the look took it, and the next read would find
    /// only a clean end of stream.
    pub(super) fn socket_has_input(&mut self) -> bool {
        match look(&self.sock) {
            Look::Input => true,
            Look::Nothing => false,
            Look::Failed(e) => {
                self.eof = true;
                self.socket_error("read", &e);
                true
            }
        }
    }

    /// A system call on the socket failed with `e`: said, then as
    /// [`Conn::socket_failed`].
    pub(super) fn socket_error(&mut self, call: &str, e: &io::Error) {
        conn_log!(
            warn,
            self,
            error = %e,
            "socket {call} failed: the connection breaks"
        );
        self.socket_failed();
    }

    pub(super) fn socket_failed(&mut self) {
        self.end_kind = ConnectionEventKind::Broken;
        if let Some(e) = self.engine.as_mut()
            && !e.is_closed()
        {
            e.handle_eof();
        }
        self.out.clear();
        self.events();
    }

    /// Feeds buffered input to the engine, one MPA frame or FPDU (part) at
    /// a time.
    pub(super) fn feed(&mut self, now: u64) {
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
            self.end_stall();
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
            // The first segment of a Send that a receive would let in
            // waits for one. Any other is fed at once: a malformed one
            // (a wrong MSN or version, another opcode inside a message)
            // meets its error now, which no receive would spare it, and
            // the RTR takes none.
            _ if self.engine.as_ref().is_some_and(|e| e.needs_recv(&h)) => {
                let have = self.ensure_recv() || {
                    // The Dekker pattern with a poster (`TcpIa::kick`, or
                    // `TcpSrq::posted` for an SRQ's: see `SrqWaits`): it
                    // queues its receive, then reads `stalled` (or the
                    // SRQ's waiting connections); this sets them, then
                    // looks again.
                    self.stalled.store(true, Ordering::SeqCst);
                    self.srq_wait(true);
                    fence(Ordering::SeqCst);
                    self.ensure_recv()
                };
                if !have {
                    let since = *self.stall_since.get_or_insert(now);
                    if now < since.saturating_add(self.ia.recv_wait_ms) {
                        return None;
                    }
                    // Waited long enough: the engine refuses it (no buffer).
                    conn_log!(
                        warn,
                        self,
                        waited_ms = now.saturating_sub(since),
                        recv_wait_ms = self.ia.recv_wait_ms,
                        "a Send of the peer found no receive posted within recv_wait_ms: refused"
                    );
                } else {
                    self.free_recvs -= 1;
                }
                self.end_stall();
            }
            // Only an FPDU that holds exactly a Read Request's body has one
            // to stage (the engine refuses any other): its look never
            // waits for bytes past the FPDU's end.
            (Buffer::Untagged { qn: 1, .. }, Some(Opcode::ReadRequest))
                if ulpdu == hlen + READ_REQUEST_LEN =>
            {
                let body = 2 + hlen;
                if b.len() < body + READ_REQUEST_LEN {
                    return eof.then_some(total);
                }
                if let Some(rr) = ReadRequest::decode(&b[body..body + READ_REQUEST_LEN])
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

    /// Enters this connection among those whose peer's Send waits for a
    /// receive of an SRQ (`on`), or takes it out; once each way. A
    /// connection whose endpoint has no SRQ never enters.
    pub(super) fn srq_wait(&mut self, on: bool) {
        if on == self.srq_waiting {
            return;
        }
        if on {
            let srq = self.ep.as_ref().and_then(|e| e.srq.as_ref());
            let (Some(srq), Some(cell)) = (srq, self.hook.clone()) else {
                return;
            };
            self.srq_waits.enter(self.token, srq.handle(), cell);
        } else {
            self.srq_waits.leave(self.token);
        }
        self.srq_waiting = on;
    }

    /// A Send of the peer no longer waits for a receive.
    pub(super) fn end_stall(&mut self) {
        self.stall_since = None;
        self.stalled.store(false, Ordering::Relaxed);
        self.srq_wait(false);
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
            self.flushed += 1;
            return false;
        };
        if e.post_recv(id, cap).is_err() {
            ep.complete_recv(r, DtoStatus::Flushed, 0);
            self.flushed += 1;
            return false;
        }
        self.mem.recvs.push(
            id,
            RecvState {
                wr: r,
                status: None,
            },
        );
        self.free_recvs += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::{Look, look};
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        a.set_nonblocking(true).unwrap();
        (a, b)
    }

    /// Waits (bounded) until a look at `a` finds something.
    fn settled(a: &TcpStream) -> Look {
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match look(a) {
                Look::Nothing if std::time::Instant::now() < end => {
                    std::thread::sleep(std::time::Duration::from_millis(5))
                }
                l => return l,
            }
        }
    }

    #[test]
    fn a_look_tells_nothing_from_input_and_from_a_clean_end() {
        let (a, mut b) = pair();
        assert!(matches!(look(&a), Look::Nothing));
        b.write_all(b"x").unwrap();
        assert!(matches!(settled(&a), Look::Input));
        // Still there: a look takes nothing.
        assert!(matches!(look(&a), Look::Input));
        let (c, d) = pair();
        drop(d);
        assert!(matches!(settled(&c), Look::Input));
    }

    /// The case the provider acts on: a reset is reported once, by the
    /// first look, after which the socket reads as a clean end. A look
    /// that dropped the error would have turned a broken connection into
    /// a graceful end.
    #[test]
    fn a_look_reports_a_reset_once() {
        let (a, b) = pair();
        socket2::SockRef::from(&b)
            .set_linger(Some(std::time::Duration::ZERO))
            .unwrap();
        drop(b);
        match settled(&a) {
            Look::Failed(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset),
            l => panic!("expected the reset, got {l:?}"),
        }
        assert!(matches!(look(&a), Look::Input));
        let mut buf = [0u8; 4];
        assert_eq!(std::io::Read::read(&mut &a, &mut buf).unwrap(), 0);
    }
}
