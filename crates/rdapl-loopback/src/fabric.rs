//! The fabric: what the IAs of one loopback instance share, the
//! in-process namespace of IA addresses and (address, connection
//! qualifier) listeners, the timer of delayed work and the settings.

use parking_lot::Mutex;
use rdapl_core::error::{Error, Result};
use rdapl_core::provider::SpInner;
use rdapl_core::provider::soft::Timer;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// What the IAs of one loopback instance share.
pub(crate) struct Fabric {
    pub(crate) listeners: Mutex<HashMap<(IpAddr, u64), Weak<SpInner>>>,
    pub(crate) addresses: Mutex<HashMap<IpAddr, usize>>,
    pub(crate) timer: Arc<Timer>,
    pub(crate) rnr_timeout_us: AtomicU64,
}

impl Drop for Fabric {
    fn drop(&mut self) {
        self.timer.stop();
    }
}

impl Fabric {
    /// How long a send waits for a receive.
    pub(crate) fn rnr_timeout(&self) -> Duration {
        Duration::from_micros(self.rnr_timeout_us.load(Ordering::Relaxed))
    }

    /// Takes `addr` for a new IA (the first 127.0.0.x no IA of this
    /// fabric uses if `None`): IAs may share an address.
    pub(crate) fn take_address(&self, addr: Option<IpAddr>) -> Result<IpAddr> {
        let mut used = self.addresses.lock();
        // By default the first 127.0.0.x no IA of this fabric uses.
        let addr = addr
            .or_else(|| {
                (1..=254u8)
                    .map(|x| IpAddr::V4(Ipv4Addr::new(127, 0, 0, x)))
                    .find(|a| used.get(a).is_none_or(|&n| n == 0))
            })
            .ok_or(Error::InsufficientResources {
                resource: rdapl_core::error::Subtype::ResourceDevice,
                what: "loopback: every default address 127.0.0.1-254 is in use",
            })?;
        *used.entry(addr).or_insert(0) += 1;
        drop(used);
        Ok(addr)
    }

    /// An IA at `addr` closed.
    pub(crate) fn release_address(&self, addr: IpAddr) {
        let mut a = self.addresses.lock();
        if let Some(n) = a.get_mut(&addr) {
            *n = n.saturating_sub(1);
        }
    }

    /// True if an IA of this fabric is at `addr`.
    pub(crate) fn reachable(&self, addr: IpAddr) -> bool {
        self.addresses.lock().get(&addr).is_some_and(|n| *n > 0)
    }

    /// The live service point listening on `qual` at `addr`.
    pub(crate) fn listener(&self, addr: IpAddr, qual: u64) -> Option<Arc<SpInner>> {
        self.listeners
            .lock()
            .get(&(addr, qual))
            .and_then(Weak::upgrade)
            .filter(|s| !s.freed())
    }

    /// Starts listening on `sp`'s qualifier at `addr`.
    pub(crate) fn listen(&self, addr: IpAddr, sp: &Arc<SpInner>) -> Result<()> {
        let mut l = self.listeners.lock();
        let key = (addr, sp.conn_qual());
        if l.get(&key)
            .and_then(Weak::upgrade)
            .is_some_and(|s| !s.freed())
        {
            return Err(Error::ConnQualInUse(sp.conn_qual()));
        }
        l.insert(key, Arc::downgrade(sp));
        Ok(())
    }

    /// Stops listening (if `sp` is the one listening).
    pub(crate) fn unlisten(&self, addr: IpAddr, sp: &SpInner) {
        let mut l = self.listeners.lock();
        let key = (addr, sp.conn_qual());
        if l.get(&key).is_some_and(|w| std::ptr::eq(w.as_ptr(), sp)) {
            l.remove(&key);
        }
    }
}
