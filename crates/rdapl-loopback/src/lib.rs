//! The in-process loopback provider: the embedded default of the `rdapl`
//! crate (`rdapl::provider::loopback`), and its performance baseline.
//!
//! It is a provider outside the core, built on the core's public interface
//! alone: the provider's view of the objects and the helpers of
//! [`rdapl_core::provider::soft`] for providers that move the bytes
//! themselves. Open it by value (`Ia::open_provider(Loopback::new(), ..)`,
//! a fabric of its own) or by name (`"loopback"`) from the `rdapl` crate.
//!
//! Endpoints of one process connect through an in-process namespace of
//! (IA address, connection qualifier) pairs. Data moves by one copy straight
//! from the source's registered region into the sink's (as a NIC's DMA
//! would), with every key, range, right and protection zone checked first
//! (every key that names memory: see zero-length RDMA below).
//! Work requests execute in order per endpoint, in the poster's thread (or
//! in the provider's timer thread for delayed work); completions flow
//! through the EVD engine, so upcalls still run in the dispatch context,
//! never on the poster's stack.
//!
//! Locking: a request executes under its endpoint's lock. The usual send
//! (a receive waiting, keys cached, no error) needs of the peer only its
//! receive queue, under that queue's own lock, which the peer's posts do
//! not take: a receive queue is a two-lock queue
//! ([`RecvQueue`](rdapl_core::provider::soft::RecvQueue)), so
//! with a steady stream of messages each of its locks stays on one core,
//! and only the receives, in batches, cross over. The usual RDMA request needs
//! nothing of the peer endpoint at all. Anything else (no receive, any
//! failure, a memory operation, fault injection) runs with both endpoints
//! locked in handle order, so a failure is published and both queues
//! stopped at once.
//!
//! Reliable-connected semantics:
//!
//! * a send with no receive posted waits up to the receiver-not-ready time
//!   ([`Loopback::set_rnr_timeout`], default 200 ms) for one, then fails with
//!   `ReceiverNotReady`;
//! * a receive too small: `LocalLength` on the receiver, `RemoteResponder`
//!   on the sender;
//! * a bad remote key, range, right or zone: `RemoteAccess`, no byte moved;
//! * a zero-length RDMA write or read (its local list totals 0 bytes)
//!   succeeds with 0 bytes and its remote key is not checked, nor are the
//!   keys of zero-length local segments: such a request names no memory.
//!   This is what InfiniBand and iWARP do (a zero-length RDMA is not
//!   checked against the remote key; iWARP uses a zero-length write as a
//!   "ready to receive" marker), and it reaches no byte, so no grant is
//!   bypassed. A request of one byte or more is checked in full;
//! * a region retired between resolving its key and the copy (see
//!   [`rdapl_core::mem`]): no byte moved, `LocalProtection` if it is the
//!   poster's own buffer, `RemoteAccess` (for a send: `RemoteResponder`, and
//!   `LocalProtection` on the receive) if it is the peer's;
//! * any DTO error breaks the connection: everything outstanding on both
//!   sides is flushed and both get `Broken`.
//! * a send lands only in a receive of its own connection: a disconnect
//!   ends the two sides one after the other, and in between the side not
//!   yet told may still send; each connection has a number, on both
//!   endpoints and both receive queues, and a send takes a receive only
//!   if the queue's number (cleared under the queue's lock when that side
//!   ends, and on reset) is its own: else it waits, and its own side's
//!   disconnect flushes it.
//!
//! Fault injection is a wrapper around any provider
//! ([`rdapl_core::provider::fault`]); the loopback's part is
//! `EpOps::break_connection`:
//! a failed link breaks both ends at once.
//!
//! One concern per module: this one holds the provider value and the
//! tables of operations of one IA and its objects; `fabric` the namespace
//! the IAs of one instance share (addresses, listeners, the timer,
//! settings); `cm` connection management; `link` what each side of a connection keeps of the other,
//! and the end of a connection on both sides; `dto` the execution of
//! requests (the fast paths and the general one with both endpoints
//! locked); `fault` a failed link.

mod cm;
mod dto;
mod fabric;
mod fault;
mod link;
#[cfg(test)]
mod tests;

use crate::fabric::Fabric;
use parking_lot::Mutex;
use rdapl_core::error::{Error, Result};
use rdapl_core::event::{PzHandle, SrqHandle};
use rdapl_core::ia::{IaAttr, ProviderAttr};
use rdapl_core::provider::soft::Timer;
use rdapl_core::provider::{
    Attempt, EpInfo, EpInner, EpLock, EpOps, ListenerOps, NewWr, Provider, SpInner, SrqOps,
    Transport,
};
use rdapl_core::srq::SrqInner;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The loopback provider: one in-process fabric. IAs opened from the same
/// instance reach each other; another instance ([`Loopback::new`]) is a
/// separate fabric with its own settings. The `"loopback"` of the `rdapl`
/// crate's registry of built-in providers (`rdapl::builtin()`, what
/// `Ia::open` opens from) is one instance.
pub struct Loopback {
    fabric: Arc<Fabric>,
}

impl Loopback {
    /// A new loopback fabric (its own listeners, addresses, timer and
    /// settings).
    pub fn new() -> Arc<Loopback> {
        Arc::new(Loopback {
            fabric: Arc::new(Fabric {
                listeners: Mutex::new(HashMap::new()),
                addresses: Mutex::new(HashMap::new()),
                timer: Timer::new("rdapl-loopback-timer"),
                rnr_timeout_us: AtomicU64::new(200_000),
            }),
        })
    }

    /// Sets how long a send of this fabric waits for a receive before
    /// failing with `ReceiverNotReady`.
    pub fn set_rnr_timeout(&self, t: Duration) {
        self.fabric.rnr_timeout_us.store(
            t.as_micros().min(u64::MAX as u128) as u64,
            Ordering::Relaxed,
        );
    }
}

const MAX_PRIVATE_DATA: usize = 512;

impl Provider for Loopback {
    fn attr(&self) -> ProviderAttr {
        ProviderAttr {
            name: "loopback".into(),
            description: "in-process loopback: one copy between registered regions, no setup"
                .into(),
            max_private_data_size: MAX_PRIVATE_DATA,
            ..ProviderAttr::default()
        }
    }

    fn ia_attr(&self, address: IpAddr) -> IaAttr {
        IaAttr {
            adapter_name: "loopback0".into(),
            address,
            max_private_data_size: MAX_PRIVATE_DATA,
            ..IaAttr::default()
        }
    }

    fn open(&self, address: Option<IpAddr>, params: &str) -> Result<Arc<dyn Transport>> {
        let mut addr = address;
        for kv in params.split([' ', ',']).filter(|s| !s.is_empty()) {
            match kv.split_once('=') {
                Some(("addr", v)) => {
                    let a = v
                        .parse()
                        .map_err(|_| Error::param(1, "loopback: addr= is not an IP address"))?;
                    if addr.is_some_and(|x| x != a) {
                        return Err(Error::param(
                            1,
                            "loopback: addr= names another address than the options do",
                        ));
                    }
                    addr = Some(a);
                }
                _ => {
                    return Err(Error::param(
                        1,
                        "loopback: unknown parameter (known: addr=IP)",
                    ));
                }
            }
        }
        let addr = self.fabric.take_address(addr)?;
        Ok(Arc::new(LoopbackIa {
            port: Port {
                lb: self.fabric.clone(),
                addr,
            },
            closed: std::sync::atomic::AtomicBool::new(false),
        }))
    }
}

/// Where an IA of a fabric is: what each of its objects' tables carries.
#[derive(Clone)]
pub(crate) struct Port {
    pub(crate) lb: Arc<Fabric>,
    pub(crate) addr: IpAddr,
}

/// One IA of a fabric (its table of operations).
pub(crate) struct LoopbackIa {
    pub(crate) port: Port,
    pub(crate) closed: std::sync::atomic::AtomicBool,
}

impl Transport for LoopbackIa {
    fn address(&self) -> IpAddr {
        self.port.addr
    }

    fn ep_create(&self, _ep: &EpInfo<'_>) -> Result<Box<dyn EpOps>> {
        Ok(Box::new(LoopEp(self.port.clone())))
    }

    fn listen(&self, sp: &Arc<SpInner>) -> Result<Box<dyn ListenerOps>> {
        self.port.lb.listen(self.port.addr, sp)?;
        Ok(Box::new(LoopListener(self.port.clone())))
    }

    fn srq_create(&self, _srq: SrqHandle, _pz: PzHandle) -> Result<Box<dyn SrqOps>> {
        Ok(Box::new(LoopSrq(self.port.lb.clone())))
    }

    fn close(&self) {
        if !self.closed.swap(true, Ordering::SeqCst) {
            self.port.lb.release_address(self.port.addr);
        }
    }
}

/// One endpoint's table.
struct LoopEp(Port);

impl EpOps for LoopEp {
    fn connect(
        &self,
        ep: &Arc<EpInner>,
        attempt: Attempt,
        remote: IpAddr,
        conn_qual: u64,
        private_data: Vec<u8>,
        timeout: Option<Duration>,
    ) -> Result<()> {
        cm::connect(
            &self.0,
            ep,
            attempt,
            remote,
            conn_qual,
            private_data,
            timeout,
        )
    }

    fn disconnect(&self, ep: &Arc<EpInner>, graceful: bool) {
        cm::disconnect(ep, graceful);
    }

    fn break_connection(&self, ep: &Arc<EpInner>) {
        fault::break_link(ep);
    }

    fn kick(&self, ep: &Arc<EpInner>, recv: bool) {
        dto::kick(&self.0.lb, ep, recv);
    }

    fn submit(&self, ep: &Arc<EpInner>, core: EpLock<'_>, wr: NewWr<'_>) {
        dto::submit(&self.0.lb, ep, core, wr);
    }
}

/// One listener's table.
struct LoopListener(Port);

impl ListenerOps for LoopListener {
    fn unlisten(&self, sp: &SpInner) {
        self.0.lb.unlisten(self.0.addr, sp);
    }
}

/// One SRQ's table.
struct LoopSrq(Arc<Fabric>);

impl SrqOps for LoopSrq {
    fn posted(&self, srq: &SrqInner) {
        dto::srq_posted(&self.0, srq);
    }
}
