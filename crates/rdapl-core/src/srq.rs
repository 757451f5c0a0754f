//! Shared receive queues (SRQ): one pool of posted receives serving many
//! endpoints (`dat_srq_*`, `dat_ep_create_with_srq`).
//!
//! A receive posted to an SRQ has no endpoint, hence no EVD, until a send
//! arrives for one of the SRQ's endpoints: only then is it matched, and its
//! completion slot reserved on that endpoint's receive EVD. If that EVD is
//! full the send is treated as finding no receive (receiver not ready): the
//! message waits, it is never dropped.
//!
//! Low watermark: when the number of available receives falls below the
//! armed watermark, one asynchronous event (object `Srq`, reason
//! `DAT_SRQ_LOW_WATERMARK_EVENT`) is posted to the IA's async EVD and the
//! watermark disarms (re-arm with [`Srq::set_low_watermark`]), like the
//! limit event of IB SRQs. DAT 2.0 defines no event number of its own for
//! it; rdapl reports it under `DAT_ASYNC_ERROR_PROVIDER_INTERNAL_ERROR`
//! with the SRQ handle and that reason.

use crate::ep::CompletionFlags;
use crate::error::{Error, Result, Subtype};
use crate::evd::EvdProducer;
use crate::event::{AsyncError, AsyncErrorKind, DatObject, Event, SrqHandle};
use crate::ia::{Ia, IaInner};
use crate::mem::LmrTriplet;
use crate::pz::Pz;
use crate::sync::Lock as Mutex;
use crate::sync::{AtomicBool, Ordering};
use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

/// `DAT_SRQ_LOW_WATERMARK_EVENT`, the reason of the low-watermark event.
pub const DAT_SRQ_LOW_WATERMARK_EVENT: i32 = 2;

/// A receive posted to an SRQ.
pub struct SrqWr {
    /// Its scatter/gather list.
    pub iov: crate::mem::Iov,
    /// Its cookie.
    pub cookie: u64,
    /// Its completion flags.
    pub flags: CompletionFlags,
}

/// A shared receive queue. Cloning gives another handle.
#[derive(Clone)]
pub struct Srq {
    /// The shared part (what providers work on).
    pub inner: Arc<SrqInner>,
}

/// The shared part of an SRQ (what providers work on).
pub struct SrqInner {
    /// The consumer context (`DAT_CONTEXT`).
    pub(crate) context: crate::context::ContextSlot,
    pub(crate) id: SrqHandle,
    pub(crate) ia: Arc<IaInner>,
    pub(crate) pz: Pz,
    pub(crate) max_recv_dtos: usize,
    pub(crate) max_recv_iov: usize,
    /// The posted receives, oldest first (a provider takes them with
    /// [`EpInner::take_recv`](crate::provider::EpInner::take_recv), and
    /// puts back at the head one it took and did not use).
    pub recvs: Mutex<VecDeque<SrqWr>>,
    watermark: Mutex<Option<usize>>,
    pub(crate) eps: crate::weak_list::WeakList<crate::ep::EpInner>,
    freed: AtomicBool,
    /// Serialises `free`'s look at the endpoints and its setting of
    /// `freed` with an endpoint's creation on the SRQ (its check of
    /// `freed` and its entry in `eps`): the two never both succeed.
    pub(crate) life: Mutex<()>,
    /// The provider's table of the SRQ.
    ops: Box<dyn crate::provider::SrqOps>,
}

impl fmt::Debug for Srq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Srq")
            .field("handle", &self.inner.id)
            .field("available", &self.inner.recvs.lock().len())
            .finish()
    }
}

/// What `Srq::query` reports (`DAT_SRQ_PARAM`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SrqParam {
    /// Most posted receives.
    pub max_recv_dtos: usize,
    /// Most scatter/gather entries per receive.
    pub max_recv_iov: usize,
    /// Armed low watermark.
    pub low_watermark: Option<usize>,
    /// Receives posted and not yet matched.
    pub available: usize,
    /// Endpoints using the SRQ.
    pub endpoints: usize,
}

fn next_id() -> u64 {
    // (A process-wide counter: never modelled.)
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Ia {
    /// Creates a shared receive queue (`dat_srq_create`).
    pub fn srq_create(&self, pz: &Pz, max_recv_dtos: usize, max_recv_iov: usize) -> Result<Srq> {
        let _open = self.creating()?;
        let user = pz.acquire()?;
        if !Arc::ptr_eq(&pz.inner.ia, &self.inner) {
            return Err(Error::InvalidHandle(Subtype::InvalidHandlePz));
        }
        if max_recv_dtos == 0 || max_recv_dtos > self.inner.attr.max_dto_per_ep {
            return Err(Error::param(3, "max_recv_dtos out of range"));
        }
        if max_recv_iov == 0 || max_recv_iov > self.inner.attr.max_iov_segments_per_dto {
            return Err(Error::param(3, "max_recv_iov out of range"));
        }
        let id = SrqHandle(next_id());
        let ops = self.inner.transport.srq_create(id, pz.inner.id)?;
        user.keep();
        Ok(Srq {
            inner: Arc::new(SrqInner {
                context: crate::context::ContextSlot::new(),
                id,
                ia: self.inner.clone(),
                pz: pz.clone(),
                max_recv_dtos,
                max_recv_iov,
                recvs: Mutex::new(VecDeque::new()),
                watermark: Mutex::new(None),
                eps: Default::default(),
                freed: AtomicBool::new(false),
                life: Mutex::new(()),
                ops,
            }),
        })
    }
}

impl Srq {
    /// The SRQ's handle.
    pub fn handle(&self) -> SrqHandle {
        self.inner.id
    }

    fn check_live(&self) -> Result<()> {
        if self.inner.freed.load(Ordering::SeqCst) {
            Err(Error::InvalidHandle(Subtype::InvalidHandleSrq))
        } else {
            Ok(())
        }
    }

    /// Posts a receive (`dat_srq_post_recv`).
    pub fn post_recv(&self, iov: &[LmrTriplet], cookie: u64, flags: CompletionFlags) -> Result<()> {
        self.check_live()?;
        if flags.0 & !0x3F != 0 {
            return Err(Error::param(4, "unknown completion flag bits"));
        }
        if iov.len() > self.inner.max_recv_iov {
            return Err(Error::param(
                2,
                "more scatter/gather entries than the SRQ allows",
            ));
        }
        // As an endpoint's receive: the list's total (added checked) within
        // the largest message.
        if crate::mem::list_len(iov, self.inner.ia.attr.max_message_size).is_none() {
            return Err(Error::Length("receive larger than the largest message"));
        }
        {
            let mut q = self.inner.recvs.lock();
            // Under the lock `free` empties the queue under once it set
            // `freed`: nothing is queued in a freed SRQ.
            self.check_live()?;
            if q.len() >= self.inner.max_recv_dtos {
                return Err(Error::InsufficientResources {
                    resource: Subtype::ResourceSrq,
                    what: "the shared receive queue is full",
                });
            }
            q.push_back(SrqWr {
                iov: iov.iter().copied().collect(),
                cookie,
                flags,
            });
        }
        // Sends waiting for a receive on any of the SRQ's endpoints.
        self.inner.ops.posted(&self.inner);
        Ok(())
    }

    /// Arms the low watermark (`dat_srq_set_lw`): one async event when the
    /// available receives fall below `lw`. `None` disarms.
    pub fn set_low_watermark(&self, lw: Option<usize>) -> Result<()> {
        self.check_live()?;
        *self.inner.watermark.lock() = lw;
        self.inner.check_watermark();
        Ok(())
    }

    /// The SRQ's parameters (`dat_srq_query`).
    pub fn query(&self) -> Result<SrqParam> {
        self.check_live()?;
        Ok(SrqParam {
            max_recv_dtos: self.inner.max_recv_dtos,
            max_recv_iov: self.inner.max_recv_iov,
            low_watermark: *self.inner.watermark.lock(),
            available: self.inner.recvs.lock().len(),
            endpoints: self.inner.endpoints().len(),
        })
    }

    /// Frees the SRQ (`dat_srq_free`); refused while endpoints use it.
    /// Receives still posted are discarded (they have no EVD yet).
    pub fn free(&self) -> Result<()> {
        let life = self.inner.life.lock();
        self.check_live()?;
        if !self.inner.endpoints().is_empty() {
            return Err(Error::state(
                Subtype::InvalidStateSrqInUse,
                "endpoints still use this shared receive queue",
            ));
        }
        if self.inner.freed.swap(true, Ordering::SeqCst) {
            return Err(Error::InvalidHandle(Subtype::InvalidHandleSrq));
        }
        drop(life);
        self.inner.recvs.lock().clear();
        self.inner.ops.free();
        self.inner.pz.inner.users.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }
}

impl SrqInner {
    /// The live endpoints using this SRQ.
    pub(crate) fn endpoints(&self) -> Vec<Arc<crate::ep::EpInner>> {
        let mut eps = self.eps.live();
        eps.retain(|e| !e.is_freed());
        eps
    }

    pub(crate) fn is_freed(&self) -> bool {
        self.freed.load(Ordering::SeqCst)
    }

    /// Posts the low-watermark event if armed and crossed (then disarms).
    pub(crate) fn check_watermark(&self) {
        let available = self.recvs.lock().len();
        let fire = {
            let mut w = self.watermark.lock();
            match *w {
                Some(lw) if available < lw => {
                    *w = None;
                    true
                }
                _ => false,
            }
        };
        if fire {
            let _ = self.ia.async_evd.post_event(Event::AsyncError(AsyncError {
                kind: AsyncErrorKind::ProviderInternalError,
                object: DatObject::Srq(self.id),
                consumer_context: self.context.get(),
                reason: DAT_SRQ_LOW_WATERMARK_EVENT,
            }));
        }
    }
}

crate::context::consumer_context!(Srq, |s| s.inner.context);
