//! The consuming side: `dequeue`, `dequeue_batch`, `wait`, and the
//! progress hooks a consumer drives when it finds the EVD empty.
//!
//! * Each event is taken by exactly one consumer, in FIFO order.
//! * A waiter arms, fences, then looks at the queue (the Dekker pattern
//!   of `state.rs`): it never sleeps on an event that has arrived.

use super::*;

impl Evd {
    /// Removes the oldest event (`dat_evd_dequeue`). `Ok(None)` when empty.
    /// Refused with `InvalidState` while a waiter owns the EVD.
    #[inline]
    pub fn dequeue(&self) -> Result<Option<Event>> {
        let inner = &self.inner;
        inner.check_consumer()?;
        // Found empty: the progress hooks' pass, if any, then one more look.
        let mut looked = false;
        Ok(inner
            .storage
            .pop_again(|| !std::mem::replace(&mut looked, true) && inner.on_empty()))
    }

    /// Moves up to `max` events (oldest first) to the end of `out`, with
    /// one atomic claim. Returns how many were moved (0 when empty).
    #[inline]
    pub fn dequeue_batch(&self, out: &mut Vec<Event>, max: usize) -> Result<usize> {
        let inner = &self.inner;
        inner.check_consumer()?;
        let n = inner.storage.pop_batch(max, |e| out.push(e));
        if n == 0 && max > 0 && inner.progress.any() {
            return Ok(inner.progress_then_pop_batch(out, max));
        }
        Ok(n)
    }

    /// Fills `buf` from the front with up to `buf.len()` events. Returns how
    /// many slots were filled.
    pub fn dequeue_into(&self, buf: &mut [Option<Event>]) -> Result<usize> {
        let inner = &self.inner;
        inner.check_consumer()?;
        if !buf.is_empty() && inner.storage.is_empty() && inner.progress.any() {
            inner.run_progress();
        }
        let mut slots = buf.iter_mut();
        Ok(inner.storage.pop_batch(slots.len(), |e| {
            if let Some(slot) = slots.next() {
                *slot = Some(e);
            }
        }))
    }

    /// Blocks until at least `threshold` events are queued or `timeout`
    /// passes (`None`: infinite), then returns the oldest event and the
    /// number still queued (`dat_evd_wait`).
    ///
    /// Errors: `InvalidParameter` for threshold 0 or above the queue length;
    /// `InvalidState` if the EVD is unwaitable, another waiter owns it, or
    /// it becomes unwaitable while waiting; `TimeoutExpired { nmore }`;
    /// `Abort` if the EVD is freed while waiting.
    pub fn wait(&self, timeout: Option<Duration>, threshold: usize) -> Result<(Event, usize)> {
        let inner = &self.inner;
        // Liveness first: a freed EVD has queue length 0.
        inner.check_live()?;
        // (The queue length is at least 1 while the EVD lives: threshold 1
        // needs no read of the producers' line.)
        if threshold == 0 || (threshold > 1 && threshold > inner.qlen()) {
            return Err(Error::param(
                3,
                "threshold must be between 1 and the queue length",
            ));
        }
        // Spin briefly before taking ownership and arming (as crossbeam's
        // channels do): a ping-pong partner often answers within
        // microseconds. A wait that finds its events this way never blocked,
        // so it takes them as a dequeue would, without writing the state
        // word (which every producer reads). Ownership, and with it the
        // refusal of other waiters and of dequeue, starts when it blocks.
        #[cfg(not(rdapl_loom))]
        let mut spun = None;
        #[cfg(not(rdapl_loom))]
        if inner.progress.any() {
            // A provider that progresses in software: drive it from this
            // thread for as long as its hooks say (each pass is a few
            // system calls), then hand progress back to its thread and
            // block.
            let start = std::time::Instant::now();
            // Never past the caller's timeout.
            let spin = inner.progress.wait_spin();
            let spin = timeout.map_or(spin, |t| t.min(spin));
            let mut passes = 0u32;
            loop {
                let s = inner.load();
                if s.has(FREED) {
                    return Err(Error::Abort("the EVD was freed while waiting"));
                }
                if s.0 & (UNWAITABLE | WAITER) != 0 {
                    break; // the checks below say why
                }
                if let Some(got) = inner.take_for_waiter(threshold) {
                    if passes > 0 {
                        inner.progress.spin_caught();
                    }
                    return Ok(got);
                }
                if start.elapsed() >= spin {
                    break;
                }
                inner.progress.run();
                passes = passes.saturating_add(1);
            }
            inner.progress.park();
            spun = Some(start);
        } else {
            // Checks at a fixed, fine grain (one pause apart) rather than
            // with exponential back-off: the waiter only reads lines the
            // producer writes once per event, so polling them costs the
            // producer nothing, while a coarse grain adds up to the longest
            // pause to the wake-up. Then a few yields, then block.
            for i in 0..WAIT_SPINS + WAIT_YIELDS {
                let s = inner.load();
                if s.has(FREED) {
                    return Err(Error::Abort("the EVD was freed while waiting"));
                }
                if s.0 & (UNWAITABLE | WAITER) != 0 {
                    break; // the checks below say why
                }
                if let Some(got) = inner.take_for_waiter(threshold) {
                    return Ok(got);
                }
                if i < WAIT_SPINS {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
        // Take ownership.
        inner.update(|s| {
            if s.has(FREED) {
                return Err(Error::InvalidHandle(Subtype::NoSubtype));
            }
            if s.has(UNWAITABLE) {
                return Err(Error::state(
                    Subtype::InvalidStateEvdUnwaitable,
                    "the EVD is unwaitable",
                ));
            }
            if s.has(WAITER) {
                return Err(Error::state(
                    Subtype::InvalidStateEvdWaiter,
                    "another thread already waits on this EVD",
                ));
            }
            Ok((s.set(WAITER), ()))
        })?;
        let out = self.wait_owned(threshold, sync::deadline(timeout));
        // Give ownership back (on a freed EVD this is harmless).
        let _ = inner.update::<_, ()>(|s| Ok((s.clear(WAITER | WAIT_ARMED), ())));
        // The spin's length follows how soon blocked waits end.
        #[cfg(not(rdapl_loom))]
        if let Some(start) = spun {
            inner.progress.blocked(start.elapsed(), out.is_ok());
        }
        out
    }

    pub(super) fn wait_owned(
        &self,
        threshold: usize,
        deadline: Option<std::time::Instant>,
    ) -> Result<(Event, usize)> {
        let inner = &self.inner;
        let gone = |s: State| -> Result<()> {
            if s.has(FREED) {
                return Err(Error::Abort("the EVD was freed while waiting"));
            }
            if s.has(UNWAITABLE) {
                return Err(Error::state(
                    Subtype::InvalidStateEvdUnwaitable,
                    "the EVD was made unwaitable",
                ));
            }
            Ok(())
        };
        let mut spins = 0;
        loop {
            gone(inner.load())?;
            if let Some(got) = inner.take_for_waiter(threshold) {
                return Ok(got);
            }
            // Arm, then look again: the consumer half of the Dekker pattern.
            inner.update::<_, Error>(|s| {
                gone(s)?;
                Ok((s.set(WAIT_ARMED).with_threshold(threshold), ()))
            })?;
            fence(Ordering::SeqCst);
            if inner.storage.any_claimed() && inner.storage.len() >= threshold {
                // Met, or about to be (pushes in progress count): no sleep.
                inner
                    .update::<_, ()>(|s| Ok((s.clear(WAIT_ARMED), ())))
                    .ok();
                sync::spin_wait(&mut spins);
                continue;
            }
            // A raise left over from an earlier arm only costs one more
            // round of this loop.
            if !inner.waiter.wait_until(deadline) {
                // Timed out: disarm; take an event if the threshold was met
                // meanwhile, or say why the wait ended.
                inner
                    .update::<_, ()>(|s| Ok((s.clear(WAIT_ARMED), ())))
                    .ok();
                gone(inner.load())?;
                if let Some(got) = inner.take_for_waiter(threshold) {
                    return Ok(got);
                }
                return Err(Error::TimeoutExpired {
                    nmore: inner.storage.len(),
                });
            }
        }
    }

    /// Claim-and-arm step for the async stream: claims one event, or arms
    /// the stream waker if none is queued (one CAS).
    #[cfg(feature = "stream")]
    pub(crate) fn claim_or_arm_stream(&self) -> Result<Option<Event>> {
        let inner = &self.inner;
        let mut spins = 0;
        loop {
            inner.check_consumer()?;
            if let Some(ev) = inner.storage.pop() {
                return Ok(Some(ev));
            }
            inner.update(|s| {
                if s.has(FREED) {
                    return Err(Error::InvalidHandle(Subtype::NoSubtype));
                }
                Ok((s.set(STREAM_ARMED), ()))
            })?;
            // Arm, then look again (the Dekker pattern of `state.rs`).
            fence(Ordering::SeqCst);
            if !inner.storage.any_claimed() {
                // The task sleeps until woken: a provider's input held
                // for a polling consumer goes back to the provider.
                inner.park_progress();
                return Ok(None);
            }
            // Something arrived: take it. The flag stays armed: other
            // streams may be parked on it, and a clear here would leave
            // them asleep with events queued. A producer that finds it
            // set wakes every stream (a spurious poll at worst).
            sync::spin_wait(&mut spins);
        }
    }
}

impl EvdInner {
    /// Takes one event for a waiter if at least `threshold` are queued.
    pub(super) fn take_for_waiter(&self, threshold: usize) -> Option<(Event, usize)> {
        // One event: the pop itself is the check.
        if threshold > 1 && !self.storage.ready_at_least(threshold) {
            return None;
        }
        let ev = self.storage.pop()?;
        // The depth reads the producers' tail line: only when something is
        // left (a ping-pong partner's line stays where it is).
        let left = if self.storage.is_empty() {
            0
        } else {
            self.storage.len()
        };
        Some((ev, left))
    }

    /// `dequeue` found the EVD empty: runs its progress hooks, if it has
    /// any; true if it did (look again). Out of line: the hot path keeps
    /// its one inlined pop.
    #[cold]
    #[inline(never)]
    pub(super) fn on_empty(&self) -> bool {
        if !self.progress.any() {
            return false;
        }
        self.run_progress();
        true
    }

    /// [`EvdInner::on_empty`] for `dequeue_batch`: runs the progress
    /// hooks, then takes up to `max` events.
    #[cold]
    #[inline(never)]
    pub(super) fn progress_then_pop_batch(&self, out: &mut Vec<Event>, max: usize) -> usize {
        self.run_progress();
        self.storage.pop_batch(max, |e| out.push(e))
    }

    /// One progress pass of the hooks for a consumer that found the EVD
    /// empty. If the EVD would notify someone of its next event (upcalls
    /// enabled, an enabled CNO, an armed stream), that consumer is about to
    /// rely on the notification rather than poll again (it drains, then
    /// sleeps): the hooks are parked after the pass.
    pub(super) fn run_progress(&self) {
        self.progress.run();
        let s = self.load();
        if s.has(CNO_ENABLED)
            || s.has(STREAM_ARMED)
            || matches!(s.policy(), Policy::Single | Policy::Many | Policy::Notify)
        {
            self.park_progress();
        }
    }

    /// Tells the progress hooks that the consumer will now be notified
    /// rather than poll: whatever input a hook held back for a polling
    /// consumer goes back to the provider's own progress at once.
    pub(super) fn park_progress(&self) {
        #[cfg(not(rdapl_loom))]
        if self.progress.any() {
            self.progress.park();
        }
    }
}
