//! The interface adapter (IA): the root of every other object.
//!
//! [`Ia::open_provider`] opens an IA of a provider given as a value (the
//! `rdapl` crate's `Ia::open` picks one by name from the providers it was
//! built with, the in-process loopback provider the default,
//! `"loopback"`), creates the IA's async EVD unless the caller brings one, and owns the registration table, the dispatch context and
//! the lists of live objects that [`Ia::close`] checks or tears down.

use crate::cno::Cno;
use crate::dispatch::Dispatch;
use crate::ep::{Ep, EpAttr, EpInner};
use crate::error::{Error, Result, Subtype};
use crate::evd::{Evd, MAX_QLEN};
use crate::event::{EvdFlags, IaHandle};
use crate::mem::MemTable;
use crate::provider::{Provider, Transport};
use crate::pz::Pz;
use crate::sp::{Psp, Rsp, SpInner};
use crate::weak_list::WeakList;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// IA attributes (`DAT_IA_ATTR`, the fields rdapl reports).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IaAttr {
    /// Adapter name.
    pub adapter_name: String,
    /// Vendor name.
    pub vendor_name: String,
    /// The IA's address.
    pub address: IpAddr,
    /// Most endpoints live at once (one more is refused:
    /// `InsufficientResources(TEP)`).
    pub max_eps: usize,
    /// Most outstanding DTOs per endpoint and queue.
    pub max_dto_per_ep: usize,
    /// Most RDMA reads in flight per endpoint, as target and as initiator.
    pub max_rdma_read_per_ep: usize,
    /// Most EVDs made by [`Ia::evd_create`] live at once, until freed or
    /// dropped (one more is refused: `InsufficientResources(TEVD)`; the
    /// async EVD is not counted).
    pub max_evds: usize,
    /// Longest EVD queue.
    pub max_evd_qlen: usize,
    /// Most scatter/gather entries per DTO.
    pub max_iov_segments_per_dto: usize,
    /// Most LMRs live at once (one more is refused:
    /// `InsufficientResources(MEMORY_REGION)`).
    pub max_lmrs: usize,
    /// Largest LMR.
    pub max_lmr_block_size: u64,
    /// Most protection zones live at once (one more is refused:
    /// `InsufficientResources(PROTECTION_DOMAIN)`).
    pub max_pzs: usize,
    /// Largest message.
    pub max_message_size: u64,
    /// Largest RDMA transfer.
    pub max_rdma_size: u64,
    /// Most RMRs live at once (one more is refused:
    /// `InsufficientResources(MEMORY_REGION)`).
    pub max_rmrs: usize,
    /// Largest private data in connection management.
    pub max_private_data_size: usize,
}

/// Provider attributes (`DAT_PROVIDER_ATTR`, the fields rdapl reports).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderAttr {
    /// Provider name (what [`Registry::open`](crate::provider::Registry::open)
    /// and the `rdapl` crate's `Ia::open` take).
    pub name: String,
    /// One-line description.
    pub description: String,
    /// Provider version.
    pub version: (u32, u32),
    /// DAT API version implemented.
    pub dapl_version: (u32, u32),
    /// Upcall policies supported.
    pub upcall_policies: Vec<crate::evd::UpcallPolicy>,
    /// `evd_stream_merging_supported[6][6]`.
    pub evd_stream_merging: [[bool; 6]; 6],
    /// Completion flags supported (`DAT_COMPLETION_FLAGS` bits).
    pub completion_flags: u32,
    /// Thread safe.
    pub thread_safe: bool,
    /// Fast registration (DAT 2.0 LMR FMR/invalidate work requests).
    pub fmr_supported: bool,
    /// Shared receive queues.
    pub srq_supported: bool,
    /// Connection requests carry and accept/reject private data.
    pub max_private_data_size: usize,
    /// A Send or RDMA Write completes once the peer has placed it (its
    /// bytes are in the target's memory, a remote error completes it with
    /// its status). False: once the local buffer may be reused (handed to
    /// TCP, say); the peer may not have it yet, and a remote error breaks
    /// the connection instead. An rdapl extension (DAT leaves it to the
    /// provider); the instance's default, which an IA's parameters may
    /// change (an IA's query reports its own).
    pub completes_when_placed: bool,
    /// Provider-specific attributes (`provider_specific_attr`, DAT's
    /// named attributes): the provider's settings in force, each under
    /// the name its parameters take, its value as they write it. An IA's
    /// query reports its own ([`Transport::provider_attr`]).
    /// Empty for a provider that has none.
    pub provider_specific_attr: Vec<NamedAttr>,
}

/// One named attribute (`DAT_NAMED_ATTR`): a name and its value, as text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedAttr {
    /// The name.
    pub name: String,
    /// The value.
    pub value: String,
}

impl NamedAttr {
    /// `name` = `value`.
    pub fn new(name: impl Into<String>, value: impl ToString) -> NamedAttr {
        NamedAttr {
            name: name.into(),
            value: value.to_string(),
        }
    }
}

impl Default for ProviderAttr {
    /// What the object model itself supports, for a provider to start
    /// from (`..ProviderAttr::default()`): every upcall policy, every
    /// stream merge, completion flags `0x0F`, thread safe, fast
    /// registration, shared receive queues, completions once placed;
    /// version 0.1 of DAT 2.0. The
    /// name and description are empty, `max_private_data_size` is 0 and
    /// there are no provider-specific attributes: those are the
    /// provider's to say.
    fn default() -> Self {
        use crate::evd::UpcallPolicy;
        ProviderAttr {
            name: String::new(),
            description: String::new(),
            version: (0, 1),
            dapl_version: (2, 0),
            upcall_policies: vec![
                UpcallPolicy::Disable,
                UpcallPolicy::SingleInstance,
                UpcallPolicy::Many,
                UpcallPolicy::NotifyOnly,
                UpcallPolicy::Teardown,
            ],
            evd_stream_merging: [[true; 6]; 6],
            completion_flags: 0x0F,
            thread_safe: true,
            fmr_supported: true,
            srq_supported: true,
            max_private_data_size: 0,
            completes_when_placed: true,
            provider_specific_attr: Vec::new(),
        }
    }
}

impl Default for IaAttr {
    /// The object model's own limits, for a provider to start from
    /// (`IaAttr { address, ..IaAttr::default() }`): vendor `rdapl`, 2^16
    /// endpoints, EVDs and protection zones, 2^14 requests per queue, 64
    /// RDMA reads in flight, the longest EVD queue, 64 segments per list,
    /// 2^24 LMRs and RMRs, 2^40-byte LMRs, 2^30-byte messages and RDMA
    /// transfers. The adapter name is empty, the address unspecified
    /// (`0.0.0.0`) and `max_private_data_size` 0: those are the provider's.
    fn default() -> Self {
        IaAttr {
            adapter_name: String::new(),
            vendor_name: "rdapl".into(),
            address: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            max_eps: 1 << 16,
            max_dto_per_ep: 1 << 14,
            max_rdma_read_per_ep: 64,
            max_evds: 1 << 16,
            max_evd_qlen: MAX_QLEN,
            max_iov_segments_per_dto: 64,
            max_lmrs: 1 << 24,
            max_lmr_block_size: 1 << 40,
            max_pzs: 1 << 16,
            max_message_size: 1 << 30,
            max_rdma_size: 1 << 30,
            max_rmrs: 1 << 24,
            max_private_data_size: 0,
        }
    }
}

/// How [`Ia::close`] treats live objects (`DAT_CLOSE_FLAGS`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CloseFlags {
    /// `DAT_CLOSE_ABRUPT_FLAG`: tear everything down.
    Abrupt,
    /// `DAT_CLOSE_GRACEFUL_FLAG`: refuse while objects are alive.
    Graceful,
}

/// An open interface adapter. Cloning gives another handle to the same IA.
#[derive(Clone)]
pub struct Ia {
    pub(crate) inner: Arc<IaInner>,
}

/// The shared part of an IA (what providers work on): its registration
/// table, reached by [`IaInner::mem`].
pub struct IaInner {
    /// The consumer context (`DAT_CONTEXT`).
    pub(crate) context: crate::context::ContextSlot,
    pub(crate) id: IaHandle,
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) provider_attr: ProviderAttr,
    pub(crate) attr: IaAttr,
    pub(crate) async_evd: Evd,
    /// Keeps the async EVD from being freed while the IA is open (taken
    /// by [`Ia::close`]).
    async_feeder: parking_lot::Mutex<Option<crate::evd::Feeder>>,
    /// The IA's registration table: every LMR and RMR key of the IA.
    pub mem: MemTable,
    pub(crate) dispatch: crate::sync::Arc<dyn Dispatch>,
    pub(crate) eps: WeakList<EpInner>,
    pub(crate) sps: WeakList<SpInner>,
    pub(crate) live: LiveCounts,
    pub(crate) closed: AtomicBool,
    /// Creations of the IA's objects hold it shared from their check that
    /// the IA is open until the object is counted and listed; `close`
    /// holds it exclusively from its look at what lives to its setting of
    /// `closed`: a close and a creation never both succeed.
    life: parking_lot::RwLock<()>,
}

/// Live object counts (for `close` and the `max_*` limits).
#[derive(Default)]
pub(crate) struct LiveCounts {
    pub pzs: AtomicUsize,
    pub lmrs: AtomicUsize,
    pub rmrs: AtomicUsize,
    pub eps: AtomicUsize,
    /// EVDs made by [`Ia::evd_create`] (each holds its place until it is
    /// freed or dropped: [`OwnedAdmission`]).
    pub evds: Arc<AtomicUsize>,
}

/// Takes a place in `count` if fewer than `max` are taken; else
/// `InsufficientResources(resource)`.
fn take_place(
    count: &AtomicUsize,
    max: usize,
    resource: Subtype,
    what: &'static str,
) -> Result<()> {
    count
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
            (n < max).then_some(n + 1)
        })
        .map(drop)
        .map_err(|_| Error::InsufficientResources { resource, what })
}

/// A place taken in one of the IA's live counts against its `max_*`
/// limit before an object is made: given back when dropped, unless the
/// object was made ([`Admission::keep`]; its free gives it back).
#[must_use]
pub(crate) struct Admission<'a>(&'a AtomicUsize);

impl<'a> Admission<'a> {
    /// Takes a place in `count` (see [`take_place`]).
    pub(crate) fn take(
        count: &'a AtomicUsize,
        max: usize,
        resource: Subtype,
        what: &'static str,
    ) -> Result<Admission<'a>> {
        take_place(count, max, resource, what)?;
        Ok(Admission(count))
    }

    /// The object was made: its place stays taken.
    pub(crate) fn keep(self) {
        std::mem::forget(self);
    }
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// An EVD's place in its IA's count of EVDs, given back when it drops
/// (the EVD freed, or its last handle dropped).
pub(crate) struct OwnedAdmission(Arc<AtomicUsize>);

impl Drop for OwnedAdmission {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl fmt::Debug for Ia {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ia")
            .field("handle", &self.inner.id)
            .field("provider", &self.inner.provider_attr.name)
            .field("address", &self.inner.attr.address)
            .finish()
    }
}

/// Options of [`Ia::open_provider`] (and of opening by name).
pub struct IaOptions {
    /// The IA's address. `None`: the provider picks one (loopback: the
    /// first `127.0.0.x` no other IA of its fabric uses, so two IAs opened
    /// with defaults are told apart; tcp: `127.0.0.1`).
    pub address: Option<IpAddr>,
    /// Provider parameters (provider specific; an `addr=` word there is
    /// the older spelling of [`IaOptions::address`]).
    pub params: String,
    /// Use this EVD as the async EVD instead of creating one.
    pub async_evd: Option<Evd>,
    /// Queue length of the async EVD rdapl creates.
    pub async_qlen: usize,
    /// Dispatch context for upcalls of this IA's EVDs.
    pub dispatch: Option<crate::sync::Arc<dyn Dispatch>>,
}

impl Default for IaOptions {
    fn default() -> Self {
        IaOptions {
            address: None,
            params: String::new(),
            async_evd: None,
            async_qlen: 64,
            dispatch: None,
        }
    }
}

fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Ia {
    /// Opens an IA of a provider given as a value (`dat_ia_open`; rustls
    /// style: the application chooses the provider object). By name: from
    /// a [`Registry`](crate::provider::Registry), or the `rdapl` crate's
    /// `Ia::open` / `Ia::open_with` (its `IaOpen` trait).
    pub fn open_provider(provider: Arc<dyn Provider>, opts: IaOptions) -> Result<Ia> {
        let dispatch = match opts.dispatch {
            Some(d) => d,
            None => crate::evd::default_dispatch()?,
        };
        let async_evd = match opts.async_evd {
            Some(e) => {
                if !e.flags().contains(EvdFlags::ASYNC) {
                    return Err(Error::param(3, "the async EVD must have the ASYNC stream"));
                }
                e
            }
            None => {
                if opts.async_qlen == 0 || opts.async_qlen > MAX_QLEN {
                    return Err(Error::param(2, "async_evd_min_qlen out of range"));
                }
                Evd::builder(opts.async_qlen, EvdFlags::ASYNC)
                    .dispatch(dispatch.clone())
                    .build()?
            }
        };
        // The IA holds its async EVD until it closes (refused if it was
        // freed meanwhile).
        let async_feeder = async_evd.try_feeder_of(&async_evd, Subtype::InvalidHandleEvdAsync)?;
        // Open the transport last: it registers the IA's address, and nothing
        // may fail after that.
        let transport = provider.open(opts.address, &opts.params)?;
        let provider_attr = transport.provider_attr(provider.attr());
        let attr = provider.ia_attr(transport.address());
        let async_feeder = parking_lot::Mutex::new(Some(async_feeder));
        Ok(Ia {
            inner: Arc::new(IaInner {
                context: crate::context::ContextSlot::new(),
                id: IaHandle(next_id()),
                transport,
                provider_attr,
                attr,
                async_evd,
                async_feeder,
                mem: MemTable::default(),
                dispatch,
                eps: WeakList::default(),
                sps: WeakList::default(),
                live: LiveCounts::default(),
                closed: AtomicBool::new(false),
                life: parking_lot::RwLock::new(()),
            }),
        })
    }

    /// The IA's handle.
    pub fn handle(&self) -> IaHandle {
        self.inner.id
    }

    /// The IA's address (what a peer connects to).
    pub fn address(&self) -> IpAddr {
        self.inner.attr.address
    }

    /// The async EVD.
    pub fn async_evd(&self) -> &Evd {
        &self.inner.async_evd
    }

    /// IA and provider attributes (`dat_ia_query`).
    pub fn query(&self) -> Result<(IaAttr, ProviderAttr)> {
        self.check_open()?;
        Ok((self.inner.attr.clone(), self.inner.provider_attr.clone()))
    }

    /// [`Ia::check_open`] for a creation: the returned guard keeps a
    /// `close` on another thread from running until it drops.
    pub(crate) fn creating(&self) -> Result<parking_lot::RwLockReadGuard<'_, ()>> {
        let g = self.inner.life.read();
        self.check_open()?;
        Ok(g)
    }

    pub(crate) fn check_open(&self) -> Result<()> {
        if self.inner.closed.load(Ordering::SeqCst) {
            Err(Error::InvalidHandle(Subtype::InvalidHandleIa))
        } else {
            Ok(())
        }
    }

    /// Creates an EVD of this IA (`dat_evd_create`): its overflows are
    /// reported on the IA's async EVD and its upcalls run in the IA's
    /// dispatch context.
    pub fn evd_create(&self, qlen: usize, flags: EvdFlags) -> Result<Evd> {
        self.evd_create_with(qlen, flags, None)
    }

    /// Creates an EVD attached to a CNO.
    pub fn evd_create_with(&self, qlen: usize, flags: EvdFlags, cno: Option<&Cno>) -> Result<Evd> {
        self.check_open()?;
        if qlen > self.inner.attr.max_evd_qlen {
            return Err(Error::InsufficientResources {
                resource: Subtype::ResourceTevd,
                what: "evd_min_qlen above max_evd_qlen",
            });
        }
        let evds = &self.inner.live.evds;
        take_place(
            evds,
            self.inner.attr.max_evds,
            Subtype::ResourceTevd,
            "max_evds EVDs live",
        )?;
        let mut b = Evd::builder(qlen, flags)
            .dispatch(self.inner.dispatch.clone())
            .async_evd(&self.inner.async_evd)
            .counted(OwnedAdmission(evds.clone()));
        if let Some(c) = cno {
            b = b.cno(c);
        }
        let evd = b.build()?;
        Ok(evd)
    }

    /// Creates a protection zone (`dat_pz_create`).
    pub fn pz_create(&self) -> Result<Pz> {
        let _open = self.creating()?;
        Pz::new(self)
    }

    /// An endpoint of this IA in `pz`, its EVDs and attributes named
    /// ([`crate::EpBuilder`]; `ia.ep_builder(&pz).evd(&evd).create()`).
    pub fn ep_builder<'a>(&'a self, pz: &'a Pz) -> crate::EpBuilder<'a> {
        crate::EpBuilder::new(self, pz)
    }

    /// Creates an endpoint (`dat_ep_create`). Any EVD may be `None` if the
    /// endpoint will not use that stream; `attr: None` takes the defaults.
    /// ([`Ia::ep_builder`] names them.)
    pub fn ep_create(
        &self,
        pz: &Pz,
        recv_evd: Option<&Evd>,
        request_evd: Option<&Evd>,
        connect_evd: Option<&Evd>,
        attr: Option<EpAttr>,
    ) -> Result<Ep> {
        let _open = self.creating()?;
        Ep::create(self, pz, recv_evd, request_evd, connect_evd, attr, None)
    }

    /// Creates an endpoint whose receives come from `srq`
    /// (`dat_ep_create_with_srq`); `Ep::post_recv` is refused on it.
    pub fn ep_create_with_srq(
        &self,
        pz: &Pz,
        recv_evd: &Evd,
        request_evd: Option<&Evd>,
        connect_evd: Option<&Evd>,
        srq: &crate::srq::Srq,
        attr: Option<EpAttr>,
    ) -> Result<Ep> {
        let _open = self.creating()?;
        Ep::create(
            self,
            pz,
            Some(recv_evd),
            request_evd,
            connect_evd,
            attr,
            Some(srq),
        )
    }

    /// Creates a public service point listening on `conn_qual`
    /// (`dat_psp_create`); connection requests arrive on `cr_evd`.
    pub fn psp_create(&self, conn_qual: u64, cr_evd: &Evd) -> Result<Psp> {
        let _open = self.creating()?;
        Psp::create(self, conn_qual, cr_evd)
    }

    /// Creates a reserved service point for `ep` on `conn_qual`
    /// (`dat_rsp_create`).
    pub fn rsp_create(&self, conn_qual: u64, ep: &Ep, cr_evd: &Evd) -> Result<Rsp> {
        let _open = self.creating()?;
        Rsp::create(self, conn_qual, ep, cr_evd)
    }

    /// Closes the IA (`dat_ia_close`). `Graceful` is refused with
    /// `InvalidState(IA_IN_USE)` while endpoints, service points, protection
    /// zones, LMRs or RMRs live (EVDs are not counted: they outlive the IA
    /// safely); `Abrupt` disconnects every endpoint (peers see
    /// `Disconnected`) and stops every service point. Either way,
    /// connection requests still pending on its service points are
    /// rejected (their active sides get `PeerRejected`).
    pub fn close(&self, flags: CloseFlags) -> Result<()> {
        let _life = self.inner.life.write();
        self.check_open()?;
        let eps = self.inner.eps.live();
        let sps = self.inner.sps.live();
        let live_eps = eps.iter().filter(|e| !e.is_freed()).count();
        let live_sps = sps.iter().filter(|s| !s.is_freed()).count();
        let live = &self.inner.live;
        let memory = live.pzs.load(Ordering::SeqCst)
            + live.lmrs.load(Ordering::SeqCst)
            + live.rmrs.load(Ordering::SeqCst);
        if flags == CloseFlags::Graceful && (live_eps > 0 || live_sps > 0 || memory > 0) {
            return Err(Error::state(
                Subtype::InvalidStateIaInUse,
                "endpoints, service points, protection zones or memory regions are still alive",
            ));
        }
        for sp in sps {
            sp.shutdown();
            // Requests still pending can no longer be answered: rejected,
            // so their active sides are told instead of waiting forever.
            let pending: Vec<_> = sp.crs.lock().values().cloned().collect();
            for cr in pending {
                cr.reject_closing();
            }
        }
        for ep in eps {
            ep.abort(&self.inner);
        }
        self.inner.closed.store(true, Ordering::SeqCst);
        self.inner.transport.close();
        // The async EVD may be freed from now on.
        self.inner.async_feeder.lock().take();
        Ok(())
    }
}

crate::context::consumer_context!(Ia, |s| s.inner.context);
