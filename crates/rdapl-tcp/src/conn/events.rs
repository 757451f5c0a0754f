//! What the engine reports, turned into what the core is told:
//! completions, connection events, the end of the connection.

use crate::params::Completion;
use rdapl::{ConnectionEventKind, DtoStatus};
use rdapl_iwarp::{ConnError, Event, ProtocolError, Role, Rtr};
use std::sync::{Arc, Weak};

use super::Conn;

impl Conn {
    /// Handles the engine's events.
    pub(super) fn events(&mut self) {
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
                let pd_len = req.private_data.len();
                match req_sp.map(|(sp, sh)| sp.request(self.peer.0, req.private_data, ops(sh))) {
                    Some(Ok(cr)) => {
                        conn_log!(
                            debug,
                            self,
                            crc = req.crc,
                            private_data = pd_len,
                            "connection request, for the service point's consumer"
                        );
                        self.cr = Some(cr);
                    }
                    // Nobody to take it: drop the TCP connection (the
                    // active side sees a non-peer reject).
                    _ => {
                        conn_log!(
                            info,
                            self,
                            "connection request dropped: its service point is gone or \
                             cannot take it"
                        );
                        if let Some(e) = self.engine.as_mut() {
                            e.close();
                        }
                    }
                }
            }
            Event::Established {
                params,
                private_data,
            } => {
                conn_log!(
                    info,
                    self,
                    role = ?self.role,
                    revision = params.revision,
                    crc = params.crc,
                    ird = params.ird,
                    ord = params.ord,
                    rtr = ?params.rtr,
                    "connection established"
                );
                self.connect_deadline = None;
                let Some(ep) = self.ep.clone() else {
                    return self.abort_engine();
                };
                let initiator = self.role == Role::Initiator;
                let pd = initiator.then_some(&private_data[..]);
                match ep.established(initiator.then_some(self.attempt), self.peer, pd) {
                    Some(c) => {
                        self.dat_conn = c;
                        self.told = true;
                        if let Some(cell) = self.hook.as_ref().and_then(Weak::upgrade) {
                            cell.join_groups(&ep, &self.ia);
                        }
                        if let Some(n) = self.engine.as_ref().and_then(|e| e.negotiated()) {
                            // A peer that takes no reads (IRD 0) cannot be
                            // asked for proof of placement: Sends and
                            // Writes complete once TCP has them.
                            if n.ord == 0 && self.complete != Completion::Sent {
                                conn_log!(
                                    info,
                                    self,
                                    "the peer takes no RDMA Reads (IRD 0): Sends and Writes \
                                     complete once TCP has them, not once placed"
                                );
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
                        // The endpoint left the set-up after this side
                        // began it (freed, its IA closed, the attempt
                        // given up): its withdrawal ends the connection as
                        // a disconnect does, so the peer hears an end, not
                        // an error (its withdrawal, queued behind, finds
                        // the connection closing).
                        self.told = true;
                        if let Some(e) = self.engine.as_mut()
                            && !e.is_closed()
                        {
                            e.close();
                        }
                    }
                }
            }
            Event::Rejected { private_data } => {
                conn_log!(
                    info,
                    self,
                    private_data = private_data.len(),
                    "connection rejected by the peer"
                );
                self.setup_fail = (ConnectionEventKind::PeerRejected, Some(private_data));
            }
            Event::RecvComplete {
                wr_id,
                len,
                solicited,
                invalidated,
            } => {
                if let Some(mut r) = self.mem.recvs.remove(wr_id) {
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
                        self.flushed += u64::from(st == DtoStatus::Flushed);
                        self.delivered += 1;
                        self.peer_spoke = true;
                    }
                    if st != DtoStatus::Success {
                        self.break_local();
                    }
                }
            }
            Event::SendComplete { wr_id } => {
                self.mem.unstage(wr_id);
                self.peer_spoke = false;
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
                if let Some(r) = self.mem.recvs.remove(wr_id) {
                    let st = r.status.unwrap_or(DtoStatus::Flushed);
                    if let Some(ep) = &self.ep {
                        ep.complete_recv(r.wr, st, 0);
                        self.flushed += u64::from(st == DtoStatus::Flushed);
                    }
                } else if let Some(s) = self.slot_mut(wr_id)
                    && s.status.is_none()
                {
                    s.status = Some(DtoStatus::Flushed);
                }
            }
            Event::Refused { wr_id, error } => {
                // Not met here (requests are posted once the connection is
                // established, and a read at ORD 0 is refused at its post,
                // `requests.rs`): taken as that refusal is.
                conn_log!(
                    warn,
                    self,
                    error = %error,
                    "a request taken before the set-up was refused: the connection breaks"
                );
                if let Some(s) = self.slot_mut(wr_id) {
                    s.status.get_or_insert(DtoStatus::LocalEp);
                }
                self.break_local();
            }
            Event::TerminateReceived(t) => {
                conn_log!(
                    warn,
                    self,
                    cause = %t.code,
                    "Terminate received: the peer ends the connection"
                );
                self.end_kind = ConnectionEventKind::Broken;
                self.terminated(&t);
            }
            Event::Error(ConnError::Mpa(rdapl_iwarp::MpaError::PeerClosed)) => {
                // An ordinary end: a client gave up its connect (or its
                // process ended) before the set-up was done.
                conn_log!(
                    info,
                    self,
                    "the peer closed the connection during its set-up"
                );
                self.end_kind = ConnectionEventKind::Broken;
            }
            Event::Error(e) => {
                // An engine that reports an error already closed (the
                // stream ended) sends nothing more.
                let terminate = e
                    .term_code()
                    .filter(|_| self.engine.as_ref().is_some_and(|e| !e.is_closed()));
                conn_log!(
                    warn,
                    self,
                    error = %e,
                    terminate = terminate.map(tracing::field::display),
                    "connection error{}",
                    if terminate.is_some() {
                        ": a Terminate goes to the peer"
                    } else {
                        ""
                    }
                );
                self.end_kind = ConnectionEventKind::Broken;
                match e {
                    ConnError::Mpa(rdapl_iwarp::MpaError::Timeout) => {
                        self.setup_fail = (ConnectionEventKind::TimedOut, None)
                    }
                    ConnError::Protocol(ProtocolError::MessageTooLong { .. }) => {
                        if let Some(r) = self.mem.recvs.front_mut() {
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

    /// A local error: Terminate, both sides break.
    pub(super) fn break_local(&mut self) {
        self.end_kind = ConnectionEventKind::Broken;
        if let Some(e) = self.engine.as_mut() {
            e.abort();
        }
        self.events();
    }
}
