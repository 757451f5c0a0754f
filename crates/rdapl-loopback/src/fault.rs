//! Fault injection (`Ep::inject_failure`, `Ep::inject_delay`,
//! `Ep::inject_break`, used by the tests): the core records a delay on
//! the requests posted after it (`Wr::not_before`) and a failure for the
//! next executed request (`EpCore::fail_next`); the loopback carries them
//! out here, on the path with both endpoints locked.

use crate::dto::{Step, progress};
use crate::fabric::Fabric;
use rdapl_core::event::DtoStatus;
use rdapl_core::provider::{EpCore, EpInner};
use std::sync::Arc;
use std::time::Instant;

/// The head request of `a` may not start before `not_before`: if that is
/// still to come, progress `a` again then (on the fabric's timer) and say
/// so (the caller stops).
pub(crate) fn delayed(lb: &Arc<Fabric>, a: &Arc<EpInner>, not_before: Instant) -> bool {
    if not_before <= Instant::now() {
        return false;
    }
    let (lb2, a2) = (lb.clone(), Arc::downgrade(a));
    lb.timer.at(
        not_before,
        Box::new(move || {
            if let Some(a) = a2.upgrade() {
                progress(&lb2, &a);
            }
        }),
    );
    true
}

/// An injected failure: the head request of `a` (locked: `ca`) completes
/// with `status`, which breaks the connection as any DTO error does.
pub(crate) fn fail_head(a: &EpInner, ca: &mut EpCore, status: DtoStatus) -> Step {
    let wr = ca.sends.pop_front().expect("head");
    a.complete(wr, status, 0);
    Step::Broken
}
