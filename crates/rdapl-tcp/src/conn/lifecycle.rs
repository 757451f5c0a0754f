//! A connection's life outside data transfer: MPA setup, accept and
//! reject, disconnect (graceful or abrupt), and the end, when every
//! outstanding request is completed once and the core is told.

use rdapl::provider::{CrState, EpInner};
use rdapl::{ConnectionEventKind, DtoStatus};
use rdapl_iwarp::{Connection, Role};
use std::net::Shutdown;
use std::sync::Arc;

use super::{Conn, Phase, SlotKind, read_depths};

impl Conn {
    /// Ends this side on the consumer's word (disconnect or free).
    pub fn close_local(&mut self, now: u64) {
        self.given_up = self.dat_conn == 0 && self.role == Role::Initiator;
        if self.phase == Phase::Connecting {
            // Nothing was sent: nothing to drain. Dead at once, the
            // socket closes with the connection (in Draining it waited
            // for input, with no timer, and a TCP connect that completed
            // later left it open for as long as the peer said nothing).
            self.finalize(now);
            self.phase = Phase::Dead;
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
        conn_log!(
            debug,
            self,
            private_data = pd.len(),
            "connection request accepted by its consumer"
        );
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
        conn_log!(
            info,
            self,
            private_data = pd.len(),
            "connection request rejected by its consumer"
        );
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
        self.end_stall();
        for s in self.slots.iter_mut() {
            s.status.get_or_insert(DtoStatus::Flushed);
        }
        self.complete_ready();
        // A memory operation at the head ran; the rest are flushed.
        let ep = self.ep.clone();
        while let Some(mut s) = self.pop_slot() {
            let wr = match s.kind {
                SlotKind::Read { sink, .. } => self.mem.sinks.remove(&sink).map(|k| k.wr),
                _ => s.wr.take(),
            };
            if let (Some(wr), Some(ep)) = (wr, &ep) {
                ep.complete(wr, DtoStatus::Flushed, 0);
                self.flushed += 1;
            }
        }
        while let Some(r) = self.mem.recvs.pop_front() {
            if let Some(ep) = &ep {
                let st = r.status.unwrap_or(DtoStatus::Flushed);
                self.flushed += u64::from(st == DtoStatus::Flushed);
                ep.complete_recv(r.wr, st, 0);
            }
        }
        self.mem.staged.clear();
        self.mem.staged_bytes = 0;
        self.mem.responses.clear();
        if let Some(ep) = ep {
            if self.dat_conn != 0 {
                conn_log!(
                    info,
                    self,
                    end = ?self.end_kind,
                    flushed = self.flushed,
                    "connection ended"
                );
                if ep.lock().connection() == self.dat_conn {
                    ep.ended(self.end_kind);
                }
            } else if !self.told {
                match self.role {
                    Role::Initiator => {
                        let (k, pd) = self.setup_fail.clone();
                        if self.given_up {
                            conn_log!(
                                info,
                                self,
                                flushed = self.flushed,
                                "connect given up by its consumer"
                            );
                        } else {
                            conn_log!(
                                info,
                                self,
                                end = ?k,
                                why = self.setup_why.as_deref().unwrap_or(""),
                                flushed = self.flushed,
                                "connect failed"
                            );
                        }
                        ep.connect_failed(self.attempt, k, pd.as_deref());
                    }
                    Role::Responder => {
                        conn_log!(
                            info,
                            self,
                            end = ?ConnectionEventKind::AcceptCompletionError,
                            flushed = self.flushed,
                            "accepted connection failed before it was established"
                        );
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
    pub(super) fn check_end(&mut self, now: u64) {
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

    /// An active attempt failed before MPA (refused, unreachable): the
    /// socket's error `why`.
    pub fn connect_failed(&mut self, kind: ConnectionEventKind, why: String, now: u64) {
        self.setup_fail = (kind, None);
        self.setup_why = Some(why);
        self.phase = Phase::Open;
        self.finalize(now);
        self.phase = Phase::Dead;
    }
}
