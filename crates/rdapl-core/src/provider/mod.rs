//! Providers: the transports under the object model.
//!
//! A [`Provider`] is a plain value the application may pick (rustls style)
//! and open with [`crate::Ia::open_provider`]; a [`Registry`] finds one by
//! name (the `rdapl` crate's `Ia::open` uses its registry of the providers
//! it was built with). Opening it yields a [`Transport`]
//! for one IA. The object model ([`crate::ep`], [`crate::sp`]) keeps every
//! provider-independent rule: handles, the endpoint state machine, argument
//! checks, completion reservations on EVDs, flushing. A transport only
//! moves connection-management messages and data, and reports back through
//! the endpoint's methods (`complete`, `connection_event`, `break_connection`).
//!
//! No provider lives in this crate. The in-process loopback provider, the
//! embedded default, is the crate `rdapl-loopback`, built on this crate's
//! public interface alone (the provider's view and [`soft`]); the TCP
//! provider is `rdapl-tcp`; the `rdapl` crate re-exports this one and
//! registers the providers it was built with.
//!
//! # Writing a provider
//!
//! A provider in another crate implements [`Provider`] (attributes, and
//! `open`, which makes a [`Transport`] for one IA) and [`Transport`] with
//! the public methods of the objects it is handed (the provider's view,
//! module `view`): it completes work requests with
//! [`EpInner::complete`] / [`EpInner::complete_recv`], reports connections
//! with [`EpInner::established`], [`EpInner::connect_failed`] and
//! [`EpInner::ended`], delivers requests with [`SpInner::request`], takes
//! receives with [`EpInner::take_recv`], and moves bytes with
//! [`EpInner::gather`], [`EpInner::scatter`], [`EpInner::remote_write`]
//! and [`EpInner::remote_read`], which check every key, right and bound.
//! Requests may complete on the provider's own thread, in any order
//! across queues and in post order within one. A provider that progresses
//! in software may also let consumers drive it: a [`Progress`] hook
//! attached with [`EpInner::attach_progress`] runs in the consumer's
//! thread when it finds one of the endpoint's EVDs empty or is about to
//! wait on it (the TCP provider does so). The `rdapl` crate's
//! `tests/provider_public.rs` is a whole provider written that way (a
//! progress thread, every completion asynchronous), run through the object
//! model's flows. Its IAs are opened with [`crate::Ia::open_provider`], or
//! by name once it is in a [`Registry`].
//!
//! A provider that moves the bytes itself inside this process, as the
//! loopback does (one copy from the source's registered region into the
//! sink's, in the poster's thread), uses the helpers of [`soft`] instead:
//! the registration tables and their key caches, the copy functions, the
//! endpoint's receive queue and request queue and the state under its lock
//! ([`EpCore`]'s public fields), connection numbers and a timer. It then
//! keeps the invariants those items document (lock order, completions
//! published in post order, a failure stopping both queues before it is
//! published). The loopback's module docs are the worked example.

pub mod fault;
mod gather;
mod registry;
pub mod soft;
mod view;

pub use crate::ep::{EpCore, EpInner, NewWr, RecvWr, Wr};
pub use crate::evd::{EvdProducer, Progress};
pub use crate::ia::IaInner;
pub use crate::sp::{CrInner, CrState, SpInner};
pub use fault::{FaultInjector, Faults};
pub use gather::{Gather, GatherLock};
pub use registry::Registry;
pub use view::WrKind;

/// An endpoint's state, locked (what [`Transport::submit`] is handed).
pub type EpLock<'a> = MutexGuard<'a, EpCore>;

use crate::error::Result;
use crate::ia::{IaAttr, ProviderAttr};
use parking_lot::MutexGuard;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

/// A provider: a named factory of transports.
pub trait Provider: Send + Sync + 'static {
    /// Provider attributes (name, capabilities).
    fn attr(&self) -> ProviderAttr;
    /// IA attributes of an IA at `address`.
    fn ia_attr(&self, address: IpAddr) -> IaAttr;
    /// Opens a transport for one IA at `address` (`None`: the provider
    /// picks one); `params` is provider specific.
    fn open(&self, address: Option<IpAddr>, params: &str) -> Result<Arc<dyn Transport>>;
}

/// One IA's view of a provider. Every method but [`Transport::submit`] (which
/// gets the posting endpoint's lock) is called with no object-model lock
/// held; the transport may call back into the endpoint at once or later
/// from its own thread, through the methods of the provider's view
/// (module docs of `view`, summarised in [`EpInner`]'s: `complete`,
/// `established`, `ended`, `take_recv`, `gather`, `remote_write`, ...).
pub trait Transport: Send + Sync + 'static {
    /// The IA's address.
    fn address(&self) -> IpAddr;
    /// Start listening for `sp`'s connection qualifier.
    fn listen(&self, sp: &Arc<SpInner>) -> Result<()>;
    /// Stop listening.
    fn unlisten(&self, sp: &SpInner);
    /// Start an active connection (`ep` is `ActiveConnectionPending`); the
    /// outcome arrives later: [`EpInner::established`] or
    /// [`EpInner::connect_failed`]. An error here leaves `ep` unconnected.
    fn connect(
        &self,
        ep: &Arc<EpInner>,
        remote: IpAddr,
        conn_qual: u64,
        private_data: Vec<u8>,
        timeout: Option<Duration>,
    ) -> Result<()>;
    /// Accept a connection request on `ep` (`PassiveConnectionPending`):
    /// settle it ([`CrInner::settle_as`]), answer the peer, and call
    /// [`EpInner::established`] on `ep` once the connection is up. An error
    /// here returns `ep` to `Unconnected`.
    fn accept(&self, cr: &Arc<CrInner>, ep: &Arc<EpInner>, private_data: Vec<u8>) -> Result<()>;
    /// Reject a connection request: settle it and tell the peer.
    fn reject(&self, cr: &Arc<CrInner>, private_data: Vec<u8>) -> Result<()>;
    /// Tear the connection of `ep` down (`DisconnectPending`): tell the
    /// peer, flush what the provider holds, and [`EpInner::ended`] with
    /// `Disconnected` (the peer's side likewise, when it learns).
    fn disconnect(&self, ep: &Arc<EpInner>, graceful: bool);
    /// The consumer gave up an active connection attempt of `ep`
    /// (`disconnect` while `ActiveConnectionPending`, or a free): the core
    /// has already moved it to `Disconnected`, flushed and told it; the
    /// provider drops the attempt and withdraws its request from the
    /// passive side ([`CrInner::settle_as`] with `Cancelled`). Default:
    /// nothing.
    fn connect_cancel(&self, ep: &Arc<EpInner>) {
        let _ = ep;
    }
    /// `ep` is being freed (`Ep::free`, an abrupt IA close) in whatever
    /// state: if it is connected, end its connection as an abrupt
    /// disconnect does, so that the peer is told. The core then flushes
    /// what it holds. The default does what `disconnect` does for a
    /// connected endpoint.
    fn ep_destroy(&self, ep: &Arc<EpInner>) {
        if matches!(
            ep.lock().state(),
            crate::EpState::Connected | crate::EpState::DisconnectPending
        ) {
            self.disconnect(ep, false);
        }
    }
    /// End `ep`'s connection as a failed link would (fault injection, a
    /// lost device): nothing more moves, what the provider holds is
    /// flushed, the core hears `Broken` ([`EpInner::ended`]), and so does
    /// the peer as soon as it can tell (a reset connection, the other end
    /// of an in-process link). Nothing if `ep` is not connected. The
    /// default ends the connection as an abrupt disconnect does (the peer
    /// then hears whatever that tells it).
    fn break_connection(&self, ep: &Arc<EpInner>) {
        if matches!(
            ep.lock().state(),
            crate::EpState::Connected | crate::EpState::DisconnectPending
        ) {
            self.disconnect(ep, false);
        }
    }
    /// New work was queued on `ep`: on its request queue (`recv == false`:
    /// progress it) or its receive queue (`recv == true`: a peer request
    /// waiting for a receive may go on).
    fn kick(&self, ep: &Arc<EpInner>, recv: bool);
    /// A request (a send, an RDMA transfer or a memory operation; never a
    /// receive: those are queued on the receive queue by the object model,
    /// which then calls [`Transport::kick`]) was posted on `ep`, still
    /// locked (`core`), with every check passed and its completion
    /// reserved: execute it at once, or queue it on the request queue
    /// ([`NewWr::into_wr`](crate::ep::NewWr)) and go on as
    /// [`Transport::kick`] would, under that lock or after releasing it.
    /// The default queues, unlocks and kicks.
    fn submit(&self, ep: &Arc<EpInner>, mut core: EpLock<'_>, wr: NewWr<'_>) {
        core.push_send(wr.queued());
        drop(core);
        self.kick(ep, false);
    }
    /// Receives were posted to `srq`: progress senders waiting on its endpoints.
    fn srq_posted(&self, srq: &crate::srq::SrqInner);
    /// The IA is closing.
    fn close(&self);
}
