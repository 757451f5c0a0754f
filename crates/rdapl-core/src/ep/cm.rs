//! Connection management: connect, disconnect, the connection events,
//! and the state changes of a connection ending.
//!
//! A state is checked and changed under one hold of the endpoint's lock.
//! Every change into or out of a state that refuses receives also tells
//! the posters ([`EpInner::set_state`]). A side leaves its connection
//! ([`EpInner::leave`]) under its lock, before it is flushed or told.

use super::{Ep, EpCore, EpInner, EpState};
use crate::error::{Error, Result, Subtype};
use crate::evd::EvdProducer;
use crate::event::{ConnectionEvent, ConnectionEventKind, Event};
use std::net::IpAddr;
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
        let attempt = {
            let mut c = inner.core.lock();
            // Under the lock `Ep::free` marks it freed under.
            inner.check_live()?;
            if c.state != EpState::Unconnected {
                return Err(Error::state(
                    c.state.subtype(),
                    "connect needs an unconnected endpoint",
                ));
            }
            c.state = EpState::ActiveConnectionPending;
            c.remote = Some((remote, conn_qual));
            c.attempt = c.attempt.next();
            c.attempt
        };
        #[cfg(any(test, feature = "test-hooks"))]
        if let Some(f) = super::test_hooks::CONNECT_GAP.with(|h| h.borrow_mut().take()) {
            f();
        }
        let r = inner.ops.connect(
            inner,
            attempt,
            remote,
            conn_qual,
            private_data.to_vec(),
            timeout,
        );
        if r.is_err() {
            let mut c = inner.core.lock();
            if c.is_attempt(attempt) {
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

    /// This side leaves its connection (locked: `c`), if it is in one:
    /// `Disconnected`, the provider's [`EpCore::link`] dropped, and its
    /// receive queue closed to the connection's sends and refusing
    /// receives. True if it was in one; the caller then flushes
    /// ([`EpInner::flush_all`]) and raises the event
    /// ([`EpInner::connection_event`]) once this lock is released.
    ///
    /// A provider that ends both sides of an in-process connection leaves
    /// both under both endpoints' locks, before either is flushed or told:
    /// nothing of either side can then run while one side is out of the
    /// connection and the other still in it.
    pub fn leave(&self, c: &mut EpCore) -> bool {
        let was = matches!(c.state, EpState::Connected | EpState::DisconnectPending);
        if was {
            c.state = EpState::Disconnected;
            c.link = None;
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
    /// [`EpInner::leave`] and `reset` do).
    /// A move to `Disconnected` or `Unconnected` also drops the provider's
    /// [`EpCore::link`]: there is no connection left to keep state of.
    pub fn set_state(&self, c: &mut EpCore, state: EpState) {
        c.state = state;
        if matches!(state, EpState::Disconnected | EpState::Unconnected) {
            c.link = None;
        }
        let refused = matches!(state, EpState::Disconnected | EpState::DisconnectPending);
        self.posted.lock().refused = refused.then_some(state);
    }
}
