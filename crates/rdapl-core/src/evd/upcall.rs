//! Upcalls: the consumer's callback, its policies, and the switches
//! between them.
//!
//! * An upcall runs in a dispatch context, never on a consumer call's
//!   stack nor under an internal lock.
//! * Once `Disable` (or `free`) returns, no upcall begins; `Teardown`
//!   returns only after the running ones have returned, and fails rather
//!   than deadlock when called from inside one.
//! * A re-enable is race-free in the three forms of [`ReEnable`].

use super::*;

/// A consumer's upcall (`DAT_UPCALL_OBJECT`).
///
/// `event` is `None` for a notify-only upcall; `more_events` says whether
/// more events were queued after the one delivered.
pub trait Upcall: Send + Sync + 'static {
    /// Called in a dispatch context with one event (or none, notify-only).
    fn upcall(&self, evd: &Evd, event: Option<Event>, more_events: bool);
}

impl<F> Upcall for F
where
    F: Fn(&Evd, Option<Event>, bool) + Send + Sync + 'static,
{
    fn upcall(&self, evd: &Evd, event: Option<Event>, more_events: bool) {
        self(evd, event, more_events)
    }
}

/// `DAT_UPCALL_POLICY` (kDAT names and values).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum UpcallPolicy {
    /// `DAT_UPCALL_DISABLE`: no upcalls; events wait for `dequeue`/`wait`.
    /// No upcall begins once `modify_upcall` returns; one that had begun
    /// may still be running (`Teardown` waits for those).
    Disable,
    /// `DAT_UPCALL_SINGLE_INSTANCE`: at most one upcall at a time.
    SingleInstance,
    /// `DAT_UPCALL_MANY`: several upcalls may run at once.
    Many,
    /// `DAT_UPCALL_NORIFY` (sic): one upcall with no event, then off until
    /// re-enabled.
    NotifyOnly,
    /// `DAT_UPCALL_TEARDOWN`: no new upcalls, and return only after every
    /// running upcall has returned.
    Teardown,
}

impl UpcallPolicy {
    /// The DAT value (`DAT_UPCALL_*`).
    pub fn to_dat(self) -> i32 {
        match self {
            UpcallPolicy::Disable => 0,
            UpcallPolicy::SingleInstance => 1,
            UpcallPolicy::NotifyOnly => 2,
            UpcallPolicy::Many => 100,
            UpcallPolicy::Teardown => -1,
        }
    }

    /// The policy for a DAT value.
    pub fn from_dat(v: i32) -> Option<UpcallPolicy> {
        Some(match v {
            0 => UpcallPolicy::Disable,
            1 => UpcallPolicy::SingleInstance,
            2 => UpcallPolicy::NotifyOnly,
            100 => UpcallPolicy::Many,
            -1 => UpcallPolicy::Teardown,
            _ => return None,
        })
    }

    pub(super) fn from_state(p: Policy) -> UpcallPolicy {
        match p {
            Policy::Disabled => UpcallPolicy::Disable,
            Policy::Single => UpcallPolicy::SingleInstance,
            Policy::Many => UpcallPolicy::Many,
            Policy::Notify => UpcallPolicy::NotifyOnly,
            Policy::Teardown => UpcallPolicy::Teardown,
        }
    }
}

/// What [`Evd::enable_upcalls`] did with the events already queued.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Enabled {
    /// Upcalls are on and nothing was queued at the switch.
    Armed,
    /// `OnNew`: upcalls are on for new arrivals; `pending` events queued
    /// at the switch are the caller's to poll (and re-arm again after).
    PollFirst {
        /// Events queued at the switch.
        pending: usize,
    },
    /// `OnAny`: upcalls are on and deliver the `pending` events queued at
    /// the switch.
    Delivering {
        /// Events queued at the switch.
        pending: usize,
    },
    /// `Strict`: refused because `pending` events were queued; the policy
    /// is unchanged. Poll them, then try again.
    Refused {
        /// Events queued at the check.
        pending: usize,
    },
}

pub(super) fn enabling_policy(p: UpcallPolicy) -> Option<Policy> {
    match p {
        UpcallPolicy::SingleInstance => Some(Policy::Single),
        UpcallPolicy::Many => Some(Policy::Many),
        UpcallPolicy::NotifyOnly => Some(Policy::Notify),
        UpcallPolicy::Disable | UpcallPolicy::Teardown => None,
    }
}

/// The right to make one upcall, taken only while the policy allows it.
///
/// Entering counts the run in `starting` before it reads the state word;
/// `Disable` and `free` write the state word and then wait for `starting`
/// to drain (the Dekker pattern): either the run sees the switch and gives
/// up, or the switch waits until the run has entered its upcall. Nothing
/// inside the gate blocks or runs consumer code, so that wait is short.
pub(super) struct UpcallGate<'a>(&'a EvdInner);

impl<'a> UpcallGate<'a> {
    fn enter(evd: &'a EvdInner, allowed: impl Fn(State) -> bool) -> Option<UpcallGate<'a>> {
        evd.starting.fetch_add(1, Ordering::SeqCst);
        // Loom models a `SeqCst` read-modify-write followed by a `SeqCst`
        // load more weakly than C++ does (as acquire/release): the fence
        // stands for that order there, as in `loom_storage::push_then`.
        #[cfg(rdapl_loom)]
        fence(Ordering::SeqCst);
        let gate = UpcallGate(evd);
        allowed(evd.load()).then_some(gate)
    }
}

impl Drop for UpcallGate<'_> {
    fn drop(&mut self) {
        self.0.starting.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Calls the consumer's upcall; `gate` is given up just before it is
/// entered.
pub(super) fn call_upcall(
    evd: &Arc<EvdInner>,
    handle: &Evd,
    event: Option<Event>,
    more: bool,
    gate: UpcallGate<'_>,
) {
    let upcall = evd.upcall.lock().clone();
    drop(gate);
    if let Some(u) = upcall {
        let prev = IN_UPCALL.with(|c| c.replace(evd.id.0));
        // A panicking upcall must not wedge the EVD (its run and in-upcall
        // counts would never drop): catch, count, go on.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            u.upcall(handle, event, more)
        }));
        IN_UPCALL.with(|c| c.set(prev));
        if r.is_err() {
            evd.upcall_panics.fetch_add(1, Ordering::SeqCst);
        }
    }
    // No upcall object: the event is dropped only if the consumer enabled
    // upcalls without one, which `modify_upcall` refuses.
}

impl Evd {
    /// Turns upcalls off (`modify_upcall(Disable)`): no upcall begins once
    /// this returns. Returns the events queued at the switch, for the
    /// caller to poll.
    pub fn disable_upcalls(&self) -> Result<usize> {
        self.modify_upcall(UpcallPolicy::Disable, None, ReEnable::OnNew)
    }

    /// Turns upcalls off and waits for running ones to return
    /// (`modify_upcall(Teardown)`). Returns the events queued at the switch.
    pub fn teardown_upcalls(&self) -> Result<usize> {
        self.modify_upcall(UpcallPolicy::Teardown, None, ReEnable::OnNew)
    }

    /// Turns upcalls on under `policy` (`SingleInstance`, `Many` or
    /// `NotifyOnly`) with the registered upcall object, and says what became
    /// of the events already queued ([`Enabled`]): a `Strict` refusal is an
    /// outcome here, not an error. `InvalidParameter` for `Disable` or
    /// `Teardown` (use [`Evd::disable_upcalls`], [`Evd::teardown_upcalls`])
    /// and when no upcall object is registered.
    pub fn enable_upcalls(&self, policy: UpcallPolicy, mode: ReEnable) -> Result<Enabled> {
        if enabling_policy(policy).is_none() {
            return Err(Error::param(2, "enable_upcalls takes an enabling policy"));
        }
        match (self.modify_upcall(policy, None, mode), mode) {
            (Ok(0), _) => Ok(Enabled::Armed),
            (Ok(n), ReEnable::OnNew) => Ok(Enabled::PollFirst { pending: n }),
            (Ok(n), _) => Ok(Enabled::Delivering { pending: n }),
            (Err(Error::Busy { pending }), _) => Ok(Enabled::Refused { pending }),
            (Err(e), _) => Err(e),
        }
    }

    /// Changes the upcall policy (`dat_evd_modify_upcall`).
    ///
    /// `upcall: None` keeps the current upcall object (`DAT_UPCALL_SAME`).
    /// For the enabling policies, `mode` says what happens to events already
    /// queued ([`ReEnable`]). Returns the number of events queued at the
    /// atomic switch: with `OnNew` the caller must poll again if it is not
    /// zero; with `OnAny` they are being delivered by upcall; with `Strict` it
    /// is always 0 (non-zero is refused as `Busy`).
    pub fn modify_upcall(
        &self,
        policy: UpcallPolicy,
        upcall: Option<Arc<dyn Upcall>>,
        mode: ReEnable,
    ) -> Result<usize> {
        let inner = &self.inner;
        inner.check_live()?;
        match policy {
            UpcallPolicy::Disable => {
                let _g = inner.modify.lock();
                if let Some(u) = upcall {
                    // Under the slot's lock, which `free` clears it under
                    // after it set `FREED`: a freed EVD keeps no upcall.
                    let mut slot = inner.upcall.lock();
                    inner.check_live()?;
                    *slot = Some(u);
                }
                inner.update::<_, Error>(|s| {
                    Ok((
                        s.with_policy(Policy::Disabled).clear(state::NOTIFY_ARMED),
                        (),
                    ))
                })?;
                // No upcall begins after this returns: a run that looked at
                // the policy before the switch has entered its upcall (or
                // given up) once this wait ends.
                inner.wait_for_starting();
                Ok(inner.storage.claimed())
            }
            UpcallPolicy::Teardown => {
                // Called from inside an upcall, the wait below must not close
                // a cycle: this EVD's own upcall, or an upcall of an EVD that
                // (through others) waits for the caller's.
                let from = IN_UPCALL.with(|c| c.get());
                let Some(_waiting) = teardown_waits::enter(from, inner.id.0) else {
                    return Err(Error::state(
                        Subtype::InvalidStateEvdInUse,
                        "Teardown from inside an upcall would deadlock: it is this EVD's own \
                         upcall, or one that an upcall of this EVD waits for",
                    ));
                };
                {
                    let _g = inner.modify.lock();
                    inner.update::<_, Error>(|s| {
                        let n = s.with_policy(Policy::Teardown).clear(state::NOTIFY_ARMED);
                        let n = if s.inup() > 0 { n.set(TD_WAITING) } else { n };
                        Ok((n, ()))
                    })?;
                }
                fence(Ordering::SeqCst);
                let pending = inner.storage.claimed();
                {
                    let mut g = inner.teardown_lock.lock();
                    loop {
                        let s = inner.load();
                        if s.inup() == 0 || s.has(FREED) || s.policy() != Policy::Teardown {
                            break;
                        }
                        g = inner.teardown_cv.wait(g);
                    }
                }
                let _ = inner.update::<_, ()>(|s| Ok((s.clear(TD_WAITING), ())));
                if let Some(u) = upcall {
                    let mut slot = inner.upcall.lock();
                    inner.check_live()?;
                    *slot = Some(u);
                }
                Ok(pending)
            }
            p => {
                let p = enabling_policy(p).unwrap_or(Policy::Disabled);
                inner.dispatch.prepare()?;
                {
                    let mut slot = inner.upcall.lock();
                    // (See `Disable` above.)
                    inner.check_live()?;
                    if let Some(u) = upcall {
                        *slot = Some(u);
                    } else if slot.is_none() {
                        return Err(Error::param(3, "no upcall object registered"));
                    }
                }
                let g = inner.modify.lock();
                let strict = mode == ReEnable::Strict;
                // Never a policy switched on for a freed EVD.
                let prev = inner.update::<_, Error>(|s| {
                    if s.has(FREED) {
                        return Err(Error::InvalidHandle(Subtype::NoSubtype));
                    }
                    Ok((state::enable(s, p, strict), s))
                })?;
                // The enabler's half of the Dekker pattern: after the fence,
                // storage shows every event whose producer read the state
                // word before the switch.
                fence(Ordering::SeqCst);
                let pending = inner.storage.claimed();
                // A Strict re-enable always schedules what the queue needs
                // once it ends: while the policy was held back, a run of the
                // policy in force may have seen "not delivering" and ended
                // with events queued, and producers left their runs to us.
                let kick = mode == ReEnable::OnAny || strict;
                let result = if strict {
                    // The policy was held back (`ENABLING`): restore the old
                    // one or let the new one take effect.
                    let refuse = pending > 0;
                    let _ = inner.update::<_, Infallible>(|s| {
                        let n = if refuse {
                            state::abort_enabling(s, prev)
                        } else {
                            state::finish_enabling(s)
                        };
                        Ok((n, ()))
                    });
                    if refuse {
                        Err(Error::Busy { pending })
                    } else {
                        Ok(0)
                    }
                } else {
                    Ok(pending)
                };
                drop(g);
                if prev.has(TD_WAITING) && result.is_ok() {
                    // A Teardown caller waits for a policy that just changed:
                    // let it see that and return.
                    let _g = inner.teardown_lock.lock();
                    inner.teardown_cv.notify_all();
                }
                if kick {
                    let runs = inner.kick_runs();
                    for _ in 0..runs {
                        inner.dispatch.schedule(DispatchRun(inner.clone()));
                    }
                }
                // The consumer now waits for upcalls: a provider's input
                // held for its polling goes back to the provider.
                inner.park_progress();
                result
            }
        }
    }
}

impl EvdInner {
    /// Waits until no run is between its look at the policy and the entry
    /// of its upcall ([`UpcallGate`]): called after a switch that stops
    /// upcalls, so that none begins once the caller returns.
    pub(super) fn wait_for_starting(&self) {
        fence(Ordering::SeqCst);
        let mut spins = 0;
        while self.starting.load(Ordering::SeqCst) != 0 {
            sync::spin_wait(&mut spins);
        }
    }

    /// Schedules the runs that queued events need under the current policy
    /// (after a re-enable, or when a run ends with events left).
    pub(super) fn kick_runs(&self) -> u64 {
        fence(Ordering::SeqCst);
        let max_runs = self.max_runs;
        self.update::<_, ()>(|s| Ok(state::schedule_runs(s, self.storage.len(), max_runs)))
            .unwrap_or(0)
    }
}

/// Executes one dispatch run of `evd` (see [`DispatchRun`]).
pub(crate) fn run(evd: &Arc<EvdInner>) {
    let handle = Evd { inner: evd.clone() };
    let mut in_upcall = false;
    let mut first = true;
    let mut spins = 0;
    loop {
        let nonempty = evd.storage.any_claimed();
        let step = evd
            .update::<_, ()>(|s| Ok(state::run_step(s, in_upcall, nonempty, first)))
            .unwrap_or(RunStep::Exit {
                wake_teardown: false,
            });
        first = false;
        in_upcall = false;
        match step {
            RunStep::Exit { wake_teardown } => {
                if wake_teardown {
                    // Taking the lock orders this notify after the waiter's
                    // check of `inup` (it checks under the same lock).
                    let _g = evd.teardown_lock.lock();
                    evd.teardown_cv.notify_all();
                }
                // The run's half of the Dekker pattern: a producer that
                // pushed after our look at storage may have seen this run
                // still counted and left the event to it.
                fence(Ordering::SeqCst);
                if !evd.storage.any_claimed() || !State(evd.state.load(Ordering::SeqCst)).delivers()
                {
                    return;
                }
                let runs = evd.kick_runs();
                if runs == 0 {
                    return;
                }
                // This thread carries on as one of the new runs.
                for _ in 1..runs {
                    evd.dispatch.schedule(DispatchRun(evd.clone()));
                }
                first = true;
            }
            RunStep::Notify => {
                in_upcall = true;
                let notifies = |s: State| s.policy() == Policy::Notify && !s.has(FREED);
                if let Some(gate) = UpcallGate::enter(evd, notifies) {
                    call_upcall(evd, &handle, None, false, gate);
                }
            }
            RunStep::Deliver => {
                in_upcall = true;
                // Deliver while the policy keeps delivering; the upcall slot
                // (`inup`) is held throughout, so `Teardown` waits for it.
                // The policy is looked at before each event is taken (in the
                // gate), so none is taken for an upcall once `Disable`
                // returned.
                let mut delivered = false;
                let delivers = |s: State| s.delivers() && !s.has(FREED);
                while let Some(gate) = UpcallGate::enter(evd, delivers) {
                    let Some(ev) = evd.storage.pop() else { break };
                    delivered = true;
                    let more = !evd.storage.is_empty();
                    call_upcall(evd, &handle, Some(ev), more, gate);
                }
                if !delivered {
                    // Claimed by a producer and not yet written: it is
                    // about to be; wait for it rather than spin hot.
                    sync::spin_wait(&mut spins);
                }
            }
        }
    }
}
