//! The connections whose peer's Send waits for a receive of an SRQ, so
//! that a receive posted to an SRQ kicks exactly those of its endpoints,
//! and touches nothing while none waits (a post then costs one fence and
//! one load).
//!
//! A Dekker pair: a connection that finds no receive enters itself
//! ([`SrqWaits::enter`]), fences, then looks for a receive again; a
//! poster queues its receive, then ([`SrqWaits::waiting`]) fences and
//! reads the count and, if it is not zero, the list. Either the
//! connection finds the receive, or the poster finds the connection.

use super::ConnCell;
use parking_lot::Mutex;
use rdapl::event::SrqHandle;
use std::sync::atomic::{AtomicUsize, Ordering, fence};
use std::sync::{Arc, Weak};

/// One provider instance's connections that wait for an SRQ's receive.
#[derive(Default)]
pub(crate) struct SrqWaits {
    count: AtomicUsize,
    /// (connection token, its endpoint's SRQ, its cell).
    list: Mutex<Vec<(u64, SrqHandle, Weak<ConnCell>)>>,
}

impl SrqWaits {
    /// Connection `token` (whose cell is `cell`), of an endpoint of `srq`,
    /// waits for a receive. The caller then fences and looks again.
    pub fn enter(&self, token: u64, srq: SrqHandle, cell: Weak<ConnCell>) {
        let mut l = self.list.lock();
        l.push((token, srq, cell));
        self.count.fetch_add(1, Ordering::SeqCst);
    }

    /// Connection `token` no longer waits.
    pub fn leave(&self, token: u64) {
        let mut l = self.list.lock();
        if let Some(i) = l.iter().position(|e| e.0 == token) {
            l.swap_remove(i);
            self.count.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// After a receive was queued on `srq`: the cells of its endpoints'
    /// connections that wait for one.
    pub fn waiting(&self, srq: SrqHandle) -> Vec<Arc<ConnCell>> {
        fence(Ordering::SeqCst);
        if self.count.load(Ordering::SeqCst) == 0 {
            return Vec::new();
        }
        self.list
            .lock()
            .iter()
            .filter(|e| e.1 == srq)
            .filter_map(|e| e.2.upgrade())
            .collect()
    }
}
