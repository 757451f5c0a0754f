//! Consumer Notification Objects (CNO): one waitable object fed by several
//! EVDs.
//!
//! # Guarantees
//!
//! * **Sticky trigger.** An event arriving on an enabled EVD with no direct
//!   waiter triggers the CNO. A trigger with nobody waiting is remembered:
//!   the next [`Cno::wait`] returns at once. Triggers coalesce.
//! * **Hint, not a promise.** `wait` returns the handle of the EVD that
//!   triggered it first. Another consumer may already have taken the event
//!   and other EVDs may have fired too: drain every EVD the CNO is fed by.
//!   Because a producer publishes its event before it triggers, an event
//!   whose trigger was coalesced is visible to a drain that follows the
//!   `wait` that consumed the earlier trigger: none is missed.
//! * **fd form.** [`Cno::with_fd`] also makes an `eventfd` readable on each
//!   trigger, so epoll, mio or tokio can wait on rdapl. Readiness may be
//!   spurious, never missed: after the fd is readable call
//!   [`Cno::wait`] with a zero timeout (which drains the fd) and drain the
//!   EVDs.
//! * **No CNO freed under an EVD.** Each EVD that feeds the CNO holds a
//!   link to it, counted by the CNO: [`Cno::free`] refuses while one
//!   lives, and a freed CNO takes no new EVD.

use crate::error::{Error, Result, Subtype};
use crate::event::EvdHandle;
use crate::sync::{self, Arc, AtomicBool, AtomicUsize, Condvar, Mutex, Ordering, fence};
use std::fmt;
use std::time::Duration;

/// A CNO's handle (`DAT_CNO_HANDLE`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CnoHandle(pub u64);

/// A Consumer Notification Object. Cloning gives another handle to the same CNO.
#[derive(Clone)]
pub struct Cno {
    inner: Arc<CnoInner>,
}

struct CnoInner {
    /// The consumer context (`DAT_CONTEXT`).
    pub(crate) context: crate::context::ContextSlot,
    id: CnoHandle,
    triggered: AtomicBool,
    freed: AtomicBool,
    /// EVDs that feed it (their [`CnoLink`]s): changed with `freed`'s
    /// check under `slot`'s lock, dropped without it.
    links: AtomicUsize,
    slot: Mutex<Option<EvdHandle>>,
    cv: Condvar,
    #[cfg(not(rdapl_loom))]
    fd: Option<std::os::fd::OwnedFd>,
}

impl fmt::Debug for Cno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cno")
            .field("handle", &self.inner.id)
            .field("triggered", &self.inner.triggered.load(Ordering::SeqCst))
            .finish()
    }
}

fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl Default for Cno {
    fn default() -> Self {
        Cno::new()
    }
}

impl Cno {
    /// Creates a CNO (`dat_cno_create` with no proxy agent).
    pub fn new() -> Cno {
        Cno {
            inner: Arc::new(CnoInner {
                context: crate::context::ContextSlot::new(),
                id: CnoHandle(next_id()),
                triggered: AtomicBool::new(false),
                freed: AtomicBool::new(false),
                links: AtomicUsize::new(0),
                slot: Mutex::new(None),
                cv: Condvar::new(),
                #[cfg(not(rdapl_loom))]
                fd: None,
            }),
        }
    }

    /// Creates a CNO with an `eventfd` (`dat_cno_fd_create`).
    #[cfg(not(rdapl_loom))]
    pub fn with_fd() -> Result<Cno> {
        use rustix::event::{EventfdFlags, eventfd};
        let fd = eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC).map_err(|_| {
            Error::InsufficientResources {
                resource: crate::error::Subtype::ResourceDevice,
                what: "eventfd could not be created",
            }
        })?;
        Ok(Cno {
            inner: Arc::new(CnoInner {
                context: crate::context::ContextSlot::new(),
                id: CnoHandle(next_id()),
                triggered: AtomicBool::new(false),
                freed: AtomicBool::new(false),
                links: AtomicUsize::new(0),
                slot: Mutex::new(None),
                cv: Condvar::new(),
                fd: Some(fd),
            }),
        })
    }

    /// The CNO's handle.
    pub fn handle(&self) -> CnoHandle {
        self.inner.id
    }

    /// The eventfd of a CNO made by [`Cno::with_fd`].
    #[cfg(not(rdapl_loom))]
    pub fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.inner.fd.as_ref().map(|f| f.as_fd())
    }

    /// Triggers the CNO on behalf of `evd` (called by EVDs on arrival;
    /// public for providers and for `dat_cno_trigger`). Wakes one waiter, or
    /// is remembered until the next `wait`.
    pub fn trigger(&self, evd: EvdHandle) {
        let inner = &*self.inner;
        // Fast path: already triggered, this trigger coalesces. The fence
        // pairs with the one in `wait`: either this load sees the waiter's
        // reset, or the waiter's drain (which follows its fence) sees the
        // event this producer published before calling us.
        fence(Ordering::SeqCst);
        if inner.triggered.load(Ordering::SeqCst) {
            return;
        }
        let mut slot = inner.slot.lock();
        if inner.triggered.swap(true, Ordering::SeqCst) {
            return;
        }
        *slot = Some(evd);
        drop(slot);
        inner.cv.notify_one();
        #[cfg(not(rdapl_loom))]
        if let Some(fd) = &inner.fd {
            // An eventfd write only fails if the counter would overflow,
            // in which case it is readable already.
            let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
        }
    }

    /// Waits until the CNO is triggered or `timeout` passes (`None`:
    /// infinite) and returns the hint EVD (`dat_cno_wait`). On timeout it
    /// returns `QueueEmpty`, as DAT does; `Abort` if the CNO is freed.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<EvdHandle> {
        let inner = &*self.inner;
        let deadline = sync::deadline(timeout);
        #[cfg(not(rdapl_loom))]
        self.drain_fd();
        let mut slot = inner.slot.lock();
        loop {
            if inner.freed.load(Ordering::SeqCst) {
                return Err(Error::Abort("the CNO was freed"));
            }
            if inner.triggered.swap(false, Ordering::SeqCst) {
                // See `trigger`: orders the reset before the caller's drain.
                fence(Ordering::SeqCst);
                // The slot is always set with the flag, under this lock.
                return slot
                    .take()
                    .ok_or_else(|| Error::Internal("CNO triggered without an EVD".into()));
            }
            let (g, expired) = inner.cv.wait_until(slot, deadline);
            slot = g;
            if expired && !inner.triggered.load(Ordering::SeqCst) {
                return Err(Error::QueueEmpty);
            }
        }
    }

    #[cfg(not(rdapl_loom))]
    fn drain_fd(&self) {
        if let Some(fd) = &self.inner.fd {
            let mut buf = [0u8; 8];
            let _ = rustix::io::read(fd, &mut buf);
        }
    }

    /// True if a trigger is pending (no waiter has consumed it yet).
    pub fn is_triggered(&self) -> bool {
        self.inner.triggered.load(Ordering::SeqCst)
    }

    /// Frees the CNO (`dat_cno_free`): blocked waiters return `Abort`.
    /// Refused with `InvalidState(CNO_IN_USE)` while an EVD feeds it
    /// (detach them first: [`crate::Evd::modify_cno`] with `None`, or free
    /// them), and with `InvalidHandle(CNO)` once freed.
    pub fn free(&self) -> Result<()> {
        let inner = &*self.inner;
        let _g = inner.slot.lock();
        if inner.freed.load(Ordering::SeqCst) {
            return Err(Error::InvalidHandle(Subtype::InvalidHandleCno));
        }
        if inner.links.load(Ordering::SeqCst) > 0 {
            return Err(Error::state(
                Subtype::InvalidStateCnoInUse,
                "EVDs still feed the CNO",
            ));
        }
        inner.freed.store(true, Ordering::SeqCst);
        inner.cv.notify_all();
        Ok(())
    }

    /// A link for an EVD that is to feed this CNO; `InvalidHandle(CNO)` if
    /// the CNO was freed.
    pub(crate) fn link(&self) -> Result<CnoLink> {
        let inner = &*self.inner;
        let _g = inner.slot.lock();
        if inner.freed.load(Ordering::SeqCst) {
            return Err(Error::InvalidHandle(Subtype::InvalidHandleCno));
        }
        inner.links.fetch_add(1, Ordering::SeqCst);
        Ok(CnoLink(self.clone()))
    }
}

/// An EVD's hold on the CNO it feeds: counted by the CNO from
/// [`Cno::link`] until it drops.
pub(crate) struct CnoLink(Cno);

impl CnoLink {
    /// The CNO.
    pub(crate) fn cno(&self) -> &Cno {
        &self.0
    }
}

impl Drop for CnoLink {
    fn drop(&mut self) {
        self.0.inner.links.fetch_sub(1, Ordering::SeqCst);
    }
}

crate::context::consumer_context!(Cno, |s| s.inner.context);
