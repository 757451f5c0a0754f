//! # rdapl-core: the core of rdapl, the DAT 2.0 Direct Access Transport in Rust
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
//! (with the `stream` feature) an async `Stream` of events (module `stream`).
//!
//! The DAT object model sits on top: the interface adapter ([`ia`]),
//! protection zones and registered memory ([`pz`], [`mem`]: LMRs owned,
//! borrowed or raw, RMRs, fast registration), endpoints ([`ep`]), service
//! points and connection requests ([`sp`]), shared receive queues ([`srq`]),
//! and the provider interface ([`provider`]).
//!
//! No provider lives here: applications use the `rdapl` crate, which
//! re-exports this one at the same paths and adds the providers it was
//! built with (the in-process loopback provider, crate `rdapl-loopback`,
//! the default) and opening by name (`Ia::open`, its `IaOpen` trait). The
//! examples below are written against it.
//!
//! ## A connection on the loopback provider
//!
//! ```
//! use rdapl::*;
//! use std::time::Duration;
//! let t = Some(Duration::from_secs(5));
//! let open = |a: &str| {
//!     Ia::open_with("loopback", IaOptions { params: format!("addr={a}"), ..Default::default() })
//!         .unwrap()
//! };
//! let (server, client) = (open("127.0.200.1"), open("127.0.200.2"));
//! let flags = EvdFlags::DTO | EvdFlags::CONNECTION | EvdFlags::CR;
//! let (sevd, cevd) = (server.evd_create(64, flags).unwrap(), client.evd_create(64, flags).unwrap());
//! let (spz, cpz) = (server.pz_create().unwrap(), client.pz_create().unwrap());
//! let sep = server.ep_create(&spz, Some(&sevd), Some(&sevd), Some(&sevd), None).unwrap();
//! let cep = client.ep_create(&cpz, Some(&cevd), Some(&cevd), Some(&cevd), None).unwrap();
//! let _psp = server.psp_create(7000, &sevd).unwrap();
//! cep.connect(server.address(), 7000, t, b"hello").unwrap();
//! let Event::ConnectionRequest(cr) = sevd.wait(t, 1).unwrap().0 else { panic!() };
//! server.cr(cr.cr).unwrap().accept(&sep, b"welcome").unwrap();
//! // Server: Established; client: Established with the accept's private data.
//! assert!(matches!(sevd.wait(t, 1).unwrap().0, Event::Connection(_)));
//! let Event::Connection(e) = cevd.wait(t, 1).unwrap().0 else { panic!() };
//! assert_eq!(e.private_data.as_deref(), Some(&b"welcome"[..]));
//! // One RDMA write, checked on the server.
//! let sink = spz.lmr_create(Region::zeroed(16), MemPriv::ALL).unwrap();
//! let src = cpz.lmr_create_from(b"rdma".to_vec(), MemPriv::LOCAL_READ).unwrap();
//! cep.post_rdma_write(&[src.triplet(0, 4).unwrap()], sink.rmr_triplet(0, 4).unwrap(), 1,
//!     CompletionFlags::DEFAULT).unwrap();
//! assert!(cevd.wait(t, 1).unwrap().0.as_dto().unwrap().status.is_success());
//! assert_eq!(&sink.to_vec().unwrap()[..4], b"rdma");
//! ```
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

pub mod buf;
pub mod cno;
mod context;
pub mod dispatch;
pub mod ep;
mod ep_builder;
pub mod error;
pub mod evd;
pub mod event;
pub mod ia;
pub mod mem;
#[cfg(not(rdapl_loom))]
pub mod poller;
pub mod provider;
pub mod pz;
pub mod sp;
pub mod srq;
#[cfg(feature = "stream")]
pub mod stream;
mod sync;
mod weak_list;

pub use buf::{Buf, BufRefused};
pub use cno::{Cno, CnoHandle};
#[cfg(not(rdapl_loom))]
pub use dispatch::Dispatcher;
pub use dispatch::{Dispatch, DispatchRun};
pub use error::{DatReturn, Error, Result, Subtype};
pub use evd::{
    Enabled, Evd, EvdBuilder, EvdParam, Feeder, Misdirected, Overflowed, ReEnable, Reservation,
    Upcall, UpcallPolicy,
};
pub use event::{
    AsyncError, AsyncErrorKind, ConnectionEvent, ConnectionEventKind, CrArrival, DatObject,
    DtoCompletion, DtoOp, DtoStatus, EvdFlags, EvdHandle, Event, EventNumber, EventStream,
    RmrBindCompletion,
};
#[cfg(not(rdapl_loom))]
pub use poller::{Poller, PollerConfig, PollerEntry};
pub use {
    ep::{Batch, CompletionFlags, Ep, EpAttr, EpParam, EpState},
    ep_builder::EpBuilder,
    ia::{CloseFlags, Ia, IaAttr, IaOptions, NamedAttr, ProviderAttr},
    mem::{LmrTriplet, MemPriv, Region, RmrTriplet},
    provider::Registry,
    pz::{BorrowedLmr, Lmr, LmrScope, Pz, Rmr, lmr_scope},
    sp::{Cr, CrState, Psp, Rsp},
    srq::{Srq, SrqParam},
};
