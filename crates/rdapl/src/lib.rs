//! # rdapl: the DAT 2.0 Direct Access Transport in Rust
//!
//! rdapl implements the programming model of kDAPL and uDAPL (the DAT 2.0
//! API): endpoints, registered memory, send/receive, RDMA read/write and
//! connection management, whose completions flow through **Event
//! Dispatchers** (EVDs).
//!
//! This crate is the core: the event types ([`event`]), typed errors mapped
//! to DAT return codes ([`error`]), the EVD engine ([`evd`]), where upcalls
//! run ([`dispatch`]), consumer notification objects ([`cno`]), the poller
//! that implements the drain/re-arm flow for the consumer ([`poller`]), and
//! (with the `stream` feature) an async `Stream` of events ([`stream`]).
//!
//! ## Switching between upcalls and polling, race-free
//!
//! ```
//! use rdapl::{Evd, EvdFlags, ReEnable, UpcallPolicy};
//! use std::sync::Arc;
//!
//! let evd = Evd::create(64, EvdFlags::SOFTWARE).unwrap();
//! evd.modify_upcall(UpcallPolicy::Disable, Some(Arc::new(|_: &Evd, _, _| {})), ReEnable::Strict)
//!     .unwrap();
//! evd.post_se(7).unwrap();
//! // Strict: re-enabling with an event queued is refused; keep polling.
//! assert!(matches!(
//!     evd.modify_upcall(UpcallPolicy::SingleInstance, None, ReEnable::Strict),
//!     Err(rdapl::Error::Busy { pending: 1 })
//! ));
//! assert_eq!(evd.dequeue().unwrap(), Some(rdapl::Event::Software(7)));
//! assert_eq!(evd.modify_upcall(UpcallPolicy::SingleInstance, None, ReEnable::Strict), Ok(0));
//! ```
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod cno;
pub mod dispatch;
#[cfg(not(loom))]
pub mod ep;
pub mod error;
pub mod evd;
pub mod event;
#[cfg(not(loom))]
pub mod ia;
#[cfg(not(loom))]
pub mod mem;
#[cfg(not(loom))]
pub mod poller;
#[cfg(not(loom))]
pub mod provider;
#[cfg(not(loom))]
pub mod pz;
#[cfg(not(loom))]
pub mod sp;
#[cfg(not(loom))]
pub mod srq;
#[cfg(feature = "stream")]
pub mod stream;
mod sync;

pub use cno::{Cno, CnoHandle};
#[cfg(not(loom))]
pub use dispatch::Dispatcher;
pub use dispatch::{Dispatch, DispatchRun};
pub use error::{DatReturn, Error, Result};
pub use evd::{
    Evd, EvdBuilder, EvdParam, Feeder, Overflowed, ReEnable, Reservation, Upcall, UpcallPolicy,
};
pub use event::{
    AsyncError, AsyncErrorKind, ConnectionEvent, ConnectionEventKind, CrArrival, DatObject,
    DtoCompletion, DtoOp, DtoStatus, EvdFlags, EvdHandle, Event, EventNumber, EventStream,
    RmrBindCompletion,
};
#[cfg(not(loom))]
pub use poller::{Poller, PollerConfig, PollerEntry};
#[cfg(not(loom))]
pub use {
    ep::{CompletionFlags, Ep, EpAttr, EpParam, EpState},
    ia::{CloseFlags, Ia, IaAttr, IaOptions, ProviderAttr},
    mem::{LmrTriplet, MemPriv, Region, RmrTriplet},
    provider::loopback::Loopback,
    pz::{BorrowedLmr, Lmr, LmrScope, Pz, Rmr, lmr_scope},
    sp::{Cr, CrState, Psp, Rsp},
    srq::{Srq, SrqParam},
};
