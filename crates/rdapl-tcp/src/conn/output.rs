//! The output side of a connection: framing what the engine transmits
//! into the output queue and writing it to the socket.
//!
//! * Large payload goes by reference to registered memory, never copied.
//! * A message is framed whole (up to `OUT_MESSAGE_MAX`) before a write,
//!   so it leaves in one system call, but for one case:
//! * A large message that answers the peer goes out in two writes: its
//!   first FPDU at once, the rest once framed. A peer that waits for it
//!   (a request/response exchange) then takes the first FPDU in while
//!   this side frames and writes the rest; a stream of messages, whose
//!   peer is busy anyway, keeps one write a message.
//! * On `complete=sent`, a Send or Write completes once its last byte
//!   was written.

use crate::memory::Staged;
use crate::params::Completion;
use rdapl::DtoStatus;
use rdapl_iwarp::{Source, State, Transmit};
use std::sync::atomic::Ordering;

use super::{Conn, IO_HIGH, Phase, SlotKind};

/// The output may pass [`IO_HIGH`] up to this to end the message it is
/// in: a stream of large messages leaves in writes of a message each, not
/// of `IO_HIGH` (which streamed 1 MiB messages slower: see the commit).
const OUT_MESSAGE_MAX: usize = 1 << 20;

/// The smallest first FPDU payload written ahead of its message's rest
/// (see the module doc): smaller ones are not worth a system call.
const EARLY_MIN: usize = 16 << 10;

impl Conn {
    pub(super) fn write_socket(&mut self) {
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
            Err(e) => self.socket_error("write", &e),
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

    pub(super) fn transmit(&mut self) {
        if self.phase == Phase::Dead {
            return;
        }
        // Past IO_HIGH only to finish the message being framed (a large
        // message leaves in writes of up to OUT_MESSAGE_MAX), and for an
        // ending connection's last frames (its Terminate): the engine
        // closes once it hands them out, and the requests it flushed are
        // then completed at once, not when a full socket (a peer gone
        // silent) takes bytes again.
        let mut high = IO_HIGH;
        // What was queued unwritten before this call (a held answer, or a
        // backlog), and whether the early write is still to be considered.
        let backlog = self.out.len();
        let mut early = true;
        loop {
            let Some(e) = self.engine.as_mut() else {
                return;
            };
            if self.out.len() >= high && e.state() != State::Terminating {
                break;
            }
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
            if early
                && let Transmit::Fpdu {
                    header,
                    payload: Some(p),
                    ..
                } = &t
                && !header.last()
                && p.len() as usize >= EARLY_MIN
            {
                early = false;
                if backlog < EARLY_MIN && self.answering() {
                    self.write_socket();
                }
            }
        }
    }

    /// This side answers a peer that waits ([`EARLY_MIN`]'s write; the
    /// caller also wants little of ours queued unwritten before, an answer
    /// held for the next write rather than a backlog): a Send of the peer
    /// arrived since our last message and nothing sent waits for the proof
    /// of its placement.
    fn answering(&self) -> bool {
        self.peer_spoke && !self.slots.iter().any(|s| s.sent_unfinished())
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
}
