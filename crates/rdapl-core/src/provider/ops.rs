//! The provider's operations: one table per object, as the kernel's
//! `ib_device_ops` and libfabric's per-object `fi_ops` are.
//!
//! The IA's table ([`super::Transport`]) creates the others: an endpoint's
//! ([`EpOps`]) when the endpoint is created, a listener's ([`ListenerOps`])
//! when a service point starts listening, a protection zone's ([`PzOps`])
//! and a shared receive queue's ([`SrqOps`]) with them. A connection
//! request's ([`CrOps`]) comes from the provider with the request itself
//! ([`SpInner::request`]). Each table is a value the provider owns, kept by
//! the core in the object: the provider's own state of that object lives
//! in it (a connection, a socket, the active endpoint of an in-process
//! request), found without any lookup.
//!
//! # Guarantees
//!
//! * The core calls each table's methods only on its own object, with no
//!   object-model lock held (but [`EpOps::submit`], handed the posting
//!   endpoint's lock).
//! * Every object the provider made a table for is told when it ends:
//!   [`EpOps::destroy`] (endpoint free, abrupt IA close),
//!   [`ListenerOps::unlisten`] (service point freed, reserved SP used, IA
//!   closed), [`PzOps::free`], [`PzOps::mem_free`] (LMR or RMR freed),
//!   [`SrqOps::free`]; each once, when the consumer frees it. An abrupt
//!   IA close destroys its endpoints and stops its listeners one by one,
//!   then calls [`super::Transport::close`], which ends the rest (zones,
//!   memory, SRQs the consumer did not free).
//! * A creation the provider refuses (an `Err` from the IA's table or from
//!   [`PzOps::mem_create`]) fails the consumer's call with that error, and
//!   nothing was made.

use crate::ep::{Attempt, EpAttr, EpInner, NewWr};
use crate::error::Result;
use crate::event::{EpHandle, LmrHandle, PzHandle, RmrHandle, SrqHandle};
use crate::mem::MemPriv;
use crate::provider::EpLock;
use crate::sp::{CrInner, SpInner};
use crate::srq::SrqInner;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

/// What an endpoint is created with (handed to
/// [`super::Transport::ep_create`] before the endpoint exists).
#[derive(Clone, Copy, Debug)]
pub struct EpInfo<'a> {
    /// The endpoint's handle.
    pub handle: EpHandle,
    /// Its protection zone.
    pub pz: PzHandle,
    /// Its attributes (checked against the IA's limits).
    pub attr: &'a EpAttr,
    /// Its shared receive queue, if it uses one.
    pub srq: Option<SrqHandle>,
}

/// One endpoint's operations. Every method but [`EpOps::submit`] (which
/// gets the posting endpoint's lock) is called with no object-model lock
/// held; the provider may call back into the endpoint at once or later
/// from its own thread, through the methods of the provider's view
/// (`complete`, `established`, `ended`, `take_recv`, `gather`,
/// `remote_write`, ...).
pub trait EpOps: Send + Sync + 'static {
    /// Start active connection attempt `attempt` of `ep` (which the core
    /// moved to `ActiveConnectionPending`, then let go of); the outcome
    /// arrives later, under that attempt: [`EpInner::established`] or
    /// [`EpInner::connect_failed`]. An error here leaves `ep` unconnected.
    /// The consumer may withdraw the attempt at any time, even before this
    /// call ([`EpOps::connect_cancel`]), and then begin another: a
    /// provider that starts the attempt later (on its own thread) first
    /// checks [`EpCore::is_attempt`](crate::ep::EpCore::is_attempt) under
    /// the endpoint's lock and starts nothing if it fails.
    fn connect(
        &self,
        ep: &Arc<EpInner>,
        attempt: Attempt,
        remote: IpAddr,
        conn_qual: u64,
        private_data: Vec<u8>,
        timeout: Option<Duration>,
    ) -> Result<()>;
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
    /// what it holds. Called once; no other method is called after it but
    /// [`EpOps::connect_cancel`] (for an attempt in progress). The default
    /// does what `disconnect` does for a connected endpoint.
    fn destroy(&self, ep: &Arc<EpInner>) {
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
    /// which then calls [`EpOps::kick`]) was posted on `ep`, still locked
    /// (`core`), with every check passed and its completion reserved:
    /// execute it at once, or queue it on the request queue
    /// ([`NewWr::queued`]) and go on as [`EpOps::kick`] would, under that
    /// lock or after releasing it. The default queues, unlocks and kicks.
    fn submit(&self, ep: &Arc<EpInner>, mut core: EpLock<'_>, wr: NewWr<'_>) {
        core.push_send(wr.queued());
        drop(core);
        self.kick(ep, false);
    }
    /// [`EpOps::submit`] of a request of a batch ([`crate::Ep::post_batch`])
    /// that more requests follow: the provider may queue it and act only
    /// at the batch's end, which calls [`EpOps::kick`] (`recv == false`),
    /// so that the batch goes out together (verbs' list of work requests,
    /// libfabric's `FI_MORE`). The default submits it at once.
    fn submit_more(&self, ep: &Arc<EpInner>, core: EpLock<'_>, wr: NewWr<'_>) {
        self.submit(ep, core, wr);
    }
}

/// One listening service point's operations (what
/// [`super::Transport::listen`] made).
pub trait ListenerOps: Send + Sync + 'static {
    /// Stop listening (the service point was freed, a reserved one took
    /// its request, or the IA closed). Called once.
    fn unlisten(&self, sp: &SpInner);
}

/// One connection request's operations: the provider hands them over with
/// the request ([`SpInner::request`], [`CrInner::new`]) and keeps its own
/// state of the request in them.
pub trait CrOps: Send + Sync + 'static {
    /// Accept the request on `ep` (`PassiveConnectionPending`): settle it
    /// ([`CrInner::settle_as`]), answer the peer, and call
    /// [`EpInner::established`] on `ep` once the connection is up. An error
    /// here returns `ep` to `Unconnected`.
    fn accept(&self, cr: &Arc<CrInner>, ep: &Arc<EpInner>, private_data: Vec<u8>) -> Result<()>;
    /// Reject the request: settle it and tell the peer. Also how a request
    /// still pending when its IA closes is answered.
    fn reject(&self, cr: &Arc<CrInner>, private_data: Vec<u8>) -> Result<()>;
    /// The connecting endpoint gave the pending request up (a disconnect,
    /// a free, its IA closed abruptly) and the core settled it `Cancelled`:
    /// what the provider keeps for it (a timer) can go. Called once, with
    /// no lock of the core held. By default, nothing.
    fn cancelled(&self) {}
}

/// Which memory object a [`PzOps`] hears of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemHandle {
    /// An LMR.
    Lmr(LmrHandle),
    /// An RMR (a memory window).
    Rmr(RmrHandle),
}

/// A memory object of a protection zone, as its [`PzOps`] hears of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemInfo {
    /// The object.
    pub handle: MemHandle,
    /// Its local key (`lmr_context`; a window's is 0).
    pub lmr_context: u32,
    /// Its remote key (`rmr_context`) in the core's registration table,
    /// RFC 5040's STag layout (the table picks both keys; a provider may
    /// give consumers a remote key of its own instead: [`MemGrant`]).
    pub rmr_context: u32,
    /// Bytes registered (0 for a window, or a fast-registration LMR not
    /// yet mapped).
    pub len: u64,
    /// Its rights.
    pub privileges: MemPriv,
    /// A fast-registration LMR: mapped, re-mapped and invalidated by
    /// posted requests, its keys changing each time.
    pub fast: bool,
}

/// What a provider answers to a registration it accepts
/// ([`PzOps::mem_create`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemGrant {
    /// The remote key consumers are to hand to peers for this LMR (its
    /// `rmr_context`), if the provider's fabric gives keys of its own (a
    /// libfabric provider with `FI_MR_PROV_KEY`: `fi_mr_key`, which must
    /// fit DAT's 32 bits). `None`: the core's table key, which software
    /// providers resolve on the target ([`MemInfo::rmr_context`]). The
    /// local key (`lmr_context`) stays the core's: a provider maps it to
    /// its own descriptor. Only for an LMR whose key never changes (not a
    /// window, not a fast-registration LMR: those are re-keyed by every
    /// bind and map); the core refuses the registration otherwise.
    pub rmr_context: Option<u32>,
}

impl MemGrant {
    /// Accepted with the core's keys.
    pub const CORE_KEYS: MemGrant = MemGrant { rmr_context: None };

    /// Accepted, with the fabric's remote key `key`.
    pub fn remote_key(key: u32) -> MemGrant {
        MemGrant {
            rmr_context: Some(key),
        }
    }
}

/// One protection zone's operations, and those of the memory registered
/// in it.
pub trait PzOps: Send + Sync + 'static {
    /// An LMR or RMR is being created in the zone (registered in the
    /// core's table already): `Err` refuses it (and the consumer's create
    /// fails with that error); `Ok` accepts it, with the core's keys or a
    /// remote key of the provider's ([`MemGrant`]). Default: accepted with
    /// the core's keys.
    fn mem_create(&self, mem: &MemInfo) -> Result<MemGrant> {
        let _ = mem;
        Ok(MemGrant::CORE_KEYS)
    }
    /// An LMR or RMR of the zone was freed (explicitly, or by an abrupt IA
    /// close, or a borrowed LMR's scope ending). Called once per object
    /// [`PzOps::mem_create`] accepted. Default: nothing.
    fn mem_free(&self, mem: &MemInfo) {
        let _ = mem;
    }
    /// The zone was freed. Default: nothing.
    fn free(&self) {}
}

/// The table of a provider with nothing of its own to do for a protection
/// zone (what [`super::Transport::pz_create`] gives by default).
pub struct NoPzOps;

impl PzOps for NoPzOps {}

/// One shared receive queue's operations.
pub trait SrqOps: Send + Sync + 'static {
    /// Receives were posted to `srq`: progress senders waiting on its
    /// endpoints.
    fn posted(&self, srq: &SrqInner);
    /// The SRQ was freed. Default: nothing.
    fn free(&self) {}
}
