//! Connection management: connect, disconnect, the connection events,
//! and the state changes of a connection ending.
//!
//! A state is checked and changed under one hold of the endpoint's lock.
//! Every change into or out of a state that refuses receives also tells
//! the posters ([`EpInner::set_state`]). Both sides of a broken
//! connection leave it under both locks, before either is flushed or told.

#[cfg(any(test, feature = "test-hooks"))]
use super::test_hooks;
use super::{Ep, EpCore, EpInner, EpState};
use crate::error::{Error, Result, Subtype};
use crate::evd::EvdProducer;
use crate::event::{ConnectionEvent, ConnectionEventKind, Event};
use parking_lot::MutexGuard;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

impl Ep {
    /// Connects to `conn_qual` at `remote` (`dat_ep_connect`). The outcome
    /// arrives on the connection EVD: `Established` (with the accept's
    /// private data), `PeerRejected`, `NonPeerRejected`, `Unreachable` or
    /// `TimedOut` (`timeout: None` waits forever).
    pub fn connect(
        &self,
        remote: IpAddr,
        conn_qual: u64,
        timeout: Option<Duration>,
        private_data: &[u8],
    ) -> Result<()> {
        let inner = &self.inner;
        inner.check_live()?;
        if inner.conn_evd.is_none() {
            return Err(Error::state(
                Subtype::InvalidStateEpEvdConnect,
                "the endpoint has no connection EVD",
            ));
        }
        if private_data.len() > inner.ia.attr.max_private_data_size {
            return Err(Error::param(
                5,
                "private data larger than max_private_data_size",
            ));
        }
        {
            let mut c = inner.core.lock();
            if c.state != EpState::Unconnected {
                return Err(Error::state(
                    c.state.subtype(),
                    "connect needs an unconnected endpoint",
                ));
            }
            c.state = EpState::ActiveConnectionPending;
            c.remote = Some((remote, conn_qual));
        }
        let r = inner
            .ops
            .connect(inner, remote, conn_qual, private_data.to_vec(), timeout);
        if r.is_err() {
            let mut c = inner.core.lock();
            if c.state == EpState::ActiveConnectionPending {
                c.state = EpState::Unconnected;
                c.remote = None;
            }
        }
        r
    }

    /// Disconnects (`dat_ep_disconnect`). Outstanding requests and receives
    /// on both sides complete with `Flushed`; both connection EVDs get
    /// `Disconnected`. On a pending active connection it aborts the attempt.
    /// A no-op on an already disconnected endpoint.
    pub fn disconnect(&self, graceful: bool) -> Result<()> {
        let inner = &self.inner;
        inner.check_live()?;
        // The state is checked and changed under one hold of the lock: a
        // connection that breaks or is established meanwhile is not
        // overwritten.
        let mut c = inner.core.lock();
        match c.state {
            EpState::Connected | EpState::DisconnectPending => {
                inner.set_state(&mut c, EpState::DisconnectPending);
                drop(c);
                inner.ops.disconnect(inner, graceful);
                Ok(())
            }
            EpState::ActiveConnectionPending => {
                let cr = {
                    inner.set_state(&mut c, EpState::Disconnected);
                    let cr = c.pending_cr.take();
                    drop(c);
                    cr
                };
                if let Some(cr) = cr {
                    cr.cancel();
                }
                inner.flush_all();
                inner.connection_event(ConnectionEventKind::Disconnected, None);
                inner.ops.connect_cancel(inner);
                Ok(())
            }
            EpState::Disconnected => Ok(()),
            s => Err(Error::state(s.subtype(), "the endpoint is not connected")),
        }
    }
}

impl EpInner {
    /// Posts a connection event on the connection EVD.
    pub fn connection_event(&self, kind: ConnectionEventKind, private: Option<Box<[u8]>>) {
        if let Some(evd) = &self.conn_evd {
            let _ = evd.post_event(Event::Connection(ConnectionEvent {
                kind,
                ep: self.id,
                consumer_context: self.context.get(),
                private_data: private,
            }));
        }
    }

    /// Ends the connection on both sides: states to `Disconnected`, every
    /// outstanding request flushed, and `kind` (default `Broken`) raised on
    /// both connection EVDs. Idempotent per side.
    ///
    /// Both sides leave the connection under both endpoints' locks, before
    /// either is flushed or told: nothing of either side (a send, an RDMA
    /// copy into the other's memory, a receive landing) can run while one
    /// side is out of the connection and the other still in it. A request
    /// already executing holds its endpoint's lock, so it finishes first
    /// (as a transfer in flight does on a wire). The peer leaves only if it
    /// is still in this same connection (its connection number), never a
    /// later one.
    pub fn break_connection(&self, peer: Option<&Arc<EpInner>>, kind: Option<ConnectionEventKind>) {
        let kind = kind.unwrap_or(ConnectionEventKind::Broken);
        let peer = peer.filter(|p| !std::ptr::eq(&***p, self));
        let (mine, theirs) = match peer {
            Some(p) => {
                let (mut ca, mut cb) = EpInner::lock_pair(self, p);
                let same = cb.conn == ca.conn;
                let mine = self.leave_locked(&mut ca);
                let theirs = same && p.leave_locked(&mut cb);
                (mine, theirs)
            }
            None => (self.leave_locked(&mut self.core.lock()), false),
        };
        if mine {
            self.flush_all();
            self.connection_event(kind, None);
        }
        // Tests: run what the hook holds between telling the two sides.
        #[cfg(any(test, feature = "test-hooks"))]
        if let Some(f) = test_hooks::BREAK_GAP.with(|h| h.borrow_mut().take()) {
            f();
        }
        if let (Some(p), true) = (peer, theirs) {
            p.flush_all();
            p.connection_event(kind, None);
        }
    }

    /// This side leaves its connection (locked: `c`), if it is in one:
    /// `Disconnected`, no peer, no keys, and its receive queue closed to
    /// the connection's sends and refusing receives. True if it was in one.
    pub(crate) fn leave_locked(&self, c: &mut EpCore) -> bool {
        let was = matches!(c.state, EpState::Connected | EpState::DisconnectPending);
        if was {
            c.state = EpState::Disconnected;
            c.peer = None;
            c.peer_mem = None;
            c.keys.clear();
            c.peer_keys.clear();
            let mut rq = self.rq.lock();
            rq.conn = 0;
            rq.keys.clear();
            self.posted.lock().refused = Some(EpState::Disconnected);
        }
        was
    }

    /// Sets the state of this endpoint (locked: `c`) to `state`, and what
    /// `post_recv` reads of it under the posters' lock (taken here, after
    /// the endpoint's). Every change into or out of a state that refuses
    /// receives goes through here (or sets both the same way, as
    /// `break_connection` and `reset` do).
    pub fn set_state(&self, c: &mut EpCore, state: EpState) {
        c.state = state;
        let refused = matches!(state, EpState::Disconnected | EpState::DisconnectPending);
        self.posted.lock().refused = refused.then_some(state);
    }

    /// Locks this endpoint and `other` in handle order.
    pub fn lock_pair<'a>(
        a: &'a EpInner,
        b: &'a EpInner,
    ) -> (MutexGuard<'a, EpCore>, MutexGuard<'a, EpCore>) {
        if a.id <= b.id {
            let ga = a.core.lock();
            let gb = b.core.lock();
            (ga, gb)
        } else {
            let gb = b.core.lock();
            let ga = a.core.lock();
            (ga, gb)
        }
    }
}
