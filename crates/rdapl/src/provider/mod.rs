//! Providers: the transports under the object model.
//!
//! A [`Provider`] is a plain value the application may pick (rustls style);
//! a [`Registry`] finds one by name ([`crate::Ia::open`] uses
//! [`Registry::builtin`]). Opening it yields a [`Transport`]
//! for one IA. The object model ([`crate::ep`], [`crate::sp`]) keeps every
//! provider-independent rule: handles, the endpoint state machine, argument
//! checks, completion reservations on EVDs, flushing. A transport only
//! moves connection-management messages and data, and reports back through
//! the endpoint's methods (`complete`, `connection_event`, `break_connection`).
//!
//! The in-process [`loopback`] provider is the embedded default. A network
//! provider (TCP/iWARP) plugs in the same way: its progress thread drives
//! connection setup and the wire, resolves remote keys against the IA's
//! registration table when a write or read request arrives, and completes
//! work requests from that thread; nothing here assumes that both endpoints
//! live in one process except inside `loopback`.

pub mod loopback;
mod registry;

pub use registry::Registry;

use crate::ep::{EpCore, EpInner, NewWr};
use crate::error::Result;
use crate::ia::{IaAttr, ProviderAttr};
use crate::sp::{CrInner, SpInner};
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
    /// Opens a transport for one IA; `params` is provider specific.
    fn open(&self, params: &str) -> Result<Arc<dyn Transport>>;
}

/// One IA's view of a provider. Every method but [`Transport::submit`] (which
/// gets the posting endpoint's lock) is called with no object-model lock
/// held; the transport may call back into the endpoint at once or later
/// from its own thread.
#[allow(missing_docs)]
pub trait Transport: Send + Sync + 'static {
    /// The IA's address.
    fn address(&self) -> IpAddr;
    /// Start listening for `sp`'s connection qualifier.
    fn listen(&self, sp: &Arc<SpInner>) -> Result<()>;
    /// Stop listening.
    fn unlisten(&self, sp: &SpInner);
    /// Start an active connection; the outcome arrives as a connection event.
    fn connect(
        &self,
        ep: &Arc<EpInner>,
        remote: IpAddr,
        conn_qual: u64,
        private_data: Vec<u8>,
        timeout: Option<Duration>,
    ) -> Result<()>;
    /// Accept a connection request on `ep`.
    fn accept(&self, cr: &Arc<CrInner>, ep: &Arc<EpInner>, private_data: Vec<u8>) -> Result<()>;
    /// Reject a connection request.
    fn reject(&self, cr: &Arc<CrInner>, private_data: Vec<u8>) -> Result<()>;
    /// Tear the connection of `ep` down (both sides get `Disconnected`).
    fn disconnect(&self, ep: &Arc<EpInner>, graceful: bool);
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
    fn submit(&self, ep: &Arc<EpInner>, mut core: MutexGuard<'_, EpCore>, wr: NewWr<'_>) {
        core.sends.push_back(wr.into_wr());
        drop(core);
        self.kick(ep, false);
    }
    /// Receives were posted to `srq`: progress senders waiting on its endpoints.
    fn srq_posted(&self, srq: &crate::srq::SrqInner);
    /// The IA is closing.
    fn close(&self);
}
