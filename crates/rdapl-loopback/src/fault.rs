//! The loopback's part in fault injection
//! ([`rdapl_core::provider::fault`], a wrapper around any provider): a
//! link that fails breaks both ends at once.

use rdapl_core::provider::EpInner;
use std::sync::Arc;

/// The link between `ep` and its peer fails: both ends are broken at
/// once, everything outstanding on both flushed
/// ([`rdapl_core::provider::EpOps::break_connection`]).
pub(crate) fn break_link(ep: &Arc<EpInner>) {
    crate::link::break_link(ep, None);
}
