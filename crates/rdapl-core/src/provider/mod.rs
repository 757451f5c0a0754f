//! Providers: the transports under the object model.
//!
//! A [`Provider`] is a plain value the application may pick (rustls style)
//! and open with [`crate::Ia::open_provider`]; a [`Registry`] finds one by
//! name (the `rdapl` crate's `Ia::open` uses its registry of the providers
//! it was built with). Opening it yields a [`Transport`], the IA's table of
//! operations, which makes one table per object created on the IA (the
//! kernel's `ib_device_ops`, libfabric's per-object `fi_ops`): [`EpOps`]
//! for an endpoint, [`ListenerOps`] for a listening service point,
//! [`PzOps`] for a protection zone and the memory registered in it,
//! [`SrqOps`] for a shared receive queue, and [`CrOps`] for a connection
//! request, handed over by the provider with the request. The core keeps
//! each table in its object and calls it for that object only; the
//! provider's state of the object lives in the table (module `ops`).
//! The object model ([`crate::ep`], [`crate::sp`]) keeps every
//! provider-independent rule: handles, the endpoint state machine, argument
//! checks, completion reservations on EVDs, flushing. A provider only
//! moves connection-management messages and data, and reports back through
//! the endpoint's methods (`complete`, `established`, `ended`, ...).
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
//! `open`, which makes a [`Transport`] for one IA), [`Transport`] (which
//! makes the tables of the IA's objects) and those tables, with the public
//! methods of the objects it is handed (the provider's view, module
//! `view`): it completes work requests with
//! [`EpInner::complete`] / [`EpInner::complete_recv`], reports connections
//! with [`EpInner::established`], [`EpInner::connect_failed`] and
//! [`EpInner::ended`] (an active attempt's outcome under the [`Attempt`]
//! [`EpOps::connect`] was given, so that a withdrawn attempt never settles
//! the one after it), delivers requests with [`SpInner::request`], takes
//! receives with [`EpInner::take_recv`], and moves bytes with
//! [`EpInner::gather`], [`EpInner::scatter`], [`EpInner::remote_write`]
//! and [`EpInner::remote_read`], which check every key, right and bound.
//! Requests may complete on the provider's own thread, in any order
//! across queues and in post order within one. A provider's state of an
//! endpoint lives in its [`EpOps`] table; its state of the endpoint's
//! current connection (its connection object, an in-process peer) can
//! live in the endpoint's link slot ([`EpInner::set_link`],
//! [`EpCore::link_ref`]), under the endpoint's lock, found from any
//! `EpInner` without a lookup and dropped by the core when the endpoint
//! leaves the connection. A provider whose fabric picks memory keys
//! returns its remote key from [`PzOps::mem_create`] ([`MemGrant`]). A provider that progresses
//! in software may also let consumers drive it: a [`Progress`] hook
//! attached with [`EpInner::attach_progress`] runs in the consumer's
//! thread when it finds one of the endpoint's EVDs empty or is about to
//! wait on it (the TCP provider does so). The `rdapl-conformance` crate's
//! `pipe` is a whole provider written that way (a progress thread, every
//! completion asynchronous), and that crate's suite is how a provider is
//! checked: `rdapl_conformance::Suite::new(provider).run()` from a test of
//! the provider's crate runs every case of the object model on it (its
//! `provider_lifecycle` cases wrap a provider's tables to show that every
//! creation and end reaches them once). A provider's IAs are
//! opened with [`crate::Ia::open_provider`], or by name once it is in a
//! [`Registry`].
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
mod ops;
mod registry;
pub mod soft;
mod view;

pub use crate::ep::{Attempt, EpCore, EpInner, NewWr, RecvWr, Wr};
pub use crate::evd::{DEFAULT_WAIT_SPIN, EvdProducer, Progress, WAIT_SPIN_GROWTH};
pub use crate::ia::IaInner;
pub use crate::sp::{CrInner, CrState, SpInner};
pub use fault::{FaultInjector, Faults};
pub use gather::{Gather, GatherLock};
pub use ops::{
    CrOps, EpInfo, EpOps, ListenerOps, MemGrant, MemHandle, MemInfo, NoPzOps, PzOps, SrqOps,
};
pub use registry::Registry;
pub use view::WrKind;

/// An endpoint's state, locked (what [`EpOps::submit`] is handed).
pub type EpLock<'a> = MutexGuard<'a, EpCore>;

use crate::error::Result;
use crate::event::{PzHandle, SrqHandle};
use crate::ia::{IaAttr, ProviderAttr};
use crate::sync::LockGuard as MutexGuard;
use std::net::IpAddr;
use std::sync::Arc;

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

/// One IA's view of a provider: the IA's table of operations, which makes
/// the table of each object created on it (module `ops`: [`EpOps`],
/// [`ListenerOps`], [`PzOps`], [`SrqOps`]; a request's [`CrOps`] comes with
/// the request). Called with no object-model lock held.
pub trait Transport: Send + Sync + 'static {
    /// The IA's address.
    fn address(&self) -> IpAddr;
    /// An endpoint is being created: its table. `Err` refuses it (the
    /// consumer's create fails with that error).
    fn ep_create(&self, ep: &EpInfo<'_>) -> Result<Box<dyn EpOps>>;
    /// Start listening for `sp`'s connection qualifier: the listener's
    /// table.
    fn listen(&self, sp: &Arc<SpInner>) -> Result<Box<dyn ListenerOps>>;
    /// A protection zone is being created: its table. The default has
    /// nothing to do.
    fn pz_create(&self, pz: PzHandle) -> Result<Box<dyn PzOps>> {
        let _ = pz;
        Ok(Box::new(NoPzOps))
    }
    /// A shared receive queue is being created in zone `pz`: its table.
    fn srq_create(&self, srq: SrqHandle, pz: PzHandle) -> Result<Box<dyn SrqOps>>;
    /// The IA is closing: what is left of it ends.
    fn close(&self);
    /// The provider's attributes as this IA reports them (its query):
    /// `attr` is [`Provider::attr`], the instance's; an IA whose own
    /// parameters change some (its completion meaning, its settings in
    /// `provider_specific_attr`) says so here. The default keeps `attr`.
    fn provider_attr(&self, attr: ProviderAttr) -> ProviderAttr {
        attr
    }
}
