//! The seed's flow, written by hand: a consumer that switches between
//! upcalls and polling under load with the `Strict` re-enable, as the
//! discussion the project grew from describes it.

use super::*;

pub(super) const PHASE_UPCALL: u8 = 0;

pub(super) const PHASE_POLL: u8 = 1;

/// One EVD's consumer: the upcall and its polling thread.
pub(super) struct Flow {
    pub(super) policy: UpcallPolicy,
    pub(super) re_enables: &'static [ReEnable],
    pub(super) switch_every: u64,
    /// Most events one "until empty" drain takes.
    pub(super) qlen: u64,
    /// Who drives the flow: the upcall (`PHASE_UPCALL`) or the polling
    /// thread (`PHASE_POLL`). Taken by compare-and-swap.
    pub(super) phase: AtomicU8,
    /// Events the upcall consumed in the current upcall phase.
    pub(super) in_phase: AtomicU64,
    pub(super) upcalls: AtomicU64,
    pub(super) handoffs: AtomicU64,
    pub(super) repolls: AtomicU64,
    /// Upcalls that ran while the polling thread drove the flow.
    pub(super) overlaps: AtomicU64,
    pub(super) shard: Arc<Shard>,
    pub(super) tx: mpsc::Sender<()>,
    pub(super) errors: Arc<Errors>,
    /// `Fault::SkipReEnable` not yet injected.
    pub(super) skip_re_enable: AtomicBool,
}

impl Flow {
    /// The upcall: consume the event; after `switch_every` of them, disable
    /// upcalls and hand the EVD to the polling thread.
    pub(super) fn upcall(&self, evd: &Evd, event: Option<Event>) {
        self.upcalls.fetch_add(1, Ordering::Relaxed);
        match event {
            Some(ev) => {
                self.shard.record(std::slice::from_ref(&ev));
                if decode(&ev).is_some_and(|(_, _, seq)| seq % 32 == 7) {
                    // Now and then a slow upcall: concurrent Many upcalls and
                    // the hand-off then overlap more often.
                    thread::yield_now();
                }
            }
            None => self
                .errors
                .push(format!("{:?} upcall without an event", self.policy)),
        }
        if self.phase.load(Ordering::SeqCst) != PHASE_UPCALL {
            // The polling thread drives the flow (an OnNew re-poll, or a
            // concurrent Many upcall): consuming the event was all to do.
            self.overlaps.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let n = self.in_phase.fetch_add(1, Ordering::SeqCst) + 1;
        if n >= self.switch_every
            && self
                .phase
                .compare_exchange(PHASE_UPCALL, PHASE_POLL, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            self.handoffs.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = evd.modify_upcall(UpcallPolicy::Disable, None, ReEnable::Strict) {
                self.errors
                    .push(format!("upcall: modify_upcall(Disable): {e}"));
            }
            // The run is ending when the polling thread has gone: ignore.
            let _ = self.tx.send(());
        }
    }

    /// The polling thread gives up the phase just before re-enabling; this
    /// takes it back. False: an upcall took it first and has queued a
    /// hand-off, which will start the next poll phase.
    fn take_back(&self) -> bool {
        self.phase
            .compare_exchange(PHASE_UPCALL, PHASE_POLL, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// Dequeues until a dequeue form reports empty or `budget` events were
    /// taken. False: stop.
    pub(super) fn drain(
        &self,
        evd: &Evd,
        budget: u64,
        rng: &mut Rng,
        batch: &mut Vec<Event>,
        stop: &Stop,
    ) -> bool {
        let mut iter = 0u32;
        let mut taken = 0u64;
        while taken < budget {
            iter = iter.wrapping_add(1);
            if iter.is_multiple_of(64) && stop.stopped() {
                return false;
            }
            let got = match rng.below(10) {
                0..=4 => match evd.dequeue() {
                    Ok(Some(ev)) => {
                        self.shard.record(std::slice::from_ref(&ev));
                        1
                    }
                    Ok(None) => 0,
                    Err(e) => {
                        self.errors.push(format!("poll: dequeue: {e}"));
                        return false;
                    }
                },
                5..=8 => {
                    batch.clear();
                    let max = (1 + rng.below(32)).min(budget - taken) as usize;
                    match evd.dequeue_batch(batch, max) {
                        Ok(n) => {
                            self.shard.record(batch);
                            n
                        }
                        Err(e) => {
                            self.errors.push(format!("poll: dequeue_batch: {e}"));
                            return false;
                        }
                    }
                }
                _ => match evd.wait(Some(Duration::from_micros(200)), 1) {
                    Ok((ev, _nmore)) => {
                        self.shard.record(std::slice::from_ref(&ev));
                        1
                    }
                    Err(Error::TimeoutExpired { .. }) => 0,
                    Err(e) => {
                        self.errors.push(format!("poll: wait: {e}"));
                        return false;
                    }
                },
            };
            if got == 0 {
                return true;
            }
            taken += got as u64;
        }
        true
    }

    /// One poll phase: drain, re-enable in `mode`, and go on polling while
    /// the re-enable says events are pending (`Busy`, or `OnNew`'s count).
    fn poll_phase(
        &self,
        evd: &Evd,
        mode: ReEnable,
        rng: &mut Rng,
        batch: &mut Vec<Event>,
        stop: &Stop,
    ) {
        loop {
            // A quarter of the time drain until empty (the seed's "dequeue
            // all", capped at one queue's worth so a steady stream cannot
            // keep the consumer polling forever); otherwise try to re-enable
            // after a few events, so that re-enables meet queued events and
            // arrivals as often as possible.
            let budget = if rng.below(4) == 0 {
                self.qlen
            } else {
                self.switch_every
            };
            if !self.drain(evd, budget, rng, batch, stop) {
                return;
            }
            if self.skip_re_enable.swap(false, Ordering::SeqCst) {
                return; // injected fault: upcalls stay off, nobody polls
            }
            // Give the flow back to the upcall, then re-enable: an upcall
            // that runs as soon as upcalls are on must find its phase.
            self.in_phase.store(0, Ordering::SeqCst);
            self.phase.store(PHASE_UPCALL, Ordering::SeqCst);
            match evd.modify_upcall(self.policy, None, mode) {
                Ok(0) => return,
                Ok(pending) if mode == ReEnable::Strict => {
                    self.errors.push(format!(
                        "Strict re-enable returned Ok({pending}) instead of Busy"
                    ));
                    return;
                }
                // OnAny: the queued events are delivered by upcall.
                Ok(_) if mode == ReEnable::OnAny => return,
                Ok(_) => {
                    // OnNew with events pending: poll again. Upcalls are on
                    // meanwhile; take the flow back and quiesce them first so
                    // no upcall races this thread (Many may race: several
                    // consumers at once is what that policy means).
                    self.repolls.fetch_add(1, Ordering::Relaxed);
                    if !self.take_back() {
                        return;
                    }
                    if rng.below(4) == 0 {
                        // Widen the window in which a new arrival's upcall
                        // overlaps this thread, so the quiesce is exercised.
                        thread::yield_now();
                    }
                    let quiesce = if self.policy == UpcallPolicy::Many {
                        UpcallPolicy::Disable
                    } else {
                        UpcallPolicy::Teardown
                    };
                    if let Err(e) = evd.modify_upcall(quiesce, None, mode) {
                        self.errors
                            .push(format!("poll: modify_upcall({quiesce:?}) after OnNew: {e}"));
                        return;
                    }
                }
                Err(Error::Busy { .. }) => {
                    // Strict refusal: upcalls stayed off; keep polling here.
                    self.repolls.fetch_add(1, Ordering::Relaxed);
                    if !self.take_back() {
                        return;
                    }
                }
                Err(e) => {
                    self.errors.push(format!(
                        "poll: modify_upcall({:?}, {mode:?}): {e}",
                        self.policy
                    ));
                    return;
                }
            }
        }
    }
}

pub(super) fn poll_thread(
    flow: Arc<Flow>,
    evd: Evd,
    rx: mpsc::Receiver<()>,
    stop: Stop,
    seed: u64,
) {
    let mut rng = Rng::new(seed);
    let mut batch = Vec::with_capacity(32);
    let mut phases = 0usize;
    while !stop.stopped() {
        match rx.recv_timeout(Duration::from_millis(2)) {
            Ok(()) => {
                let mode = flow.re_enables[phases % flow.re_enables.len()];
                phases += 1;
                flow.poll_phase(&evd, mode, &mut rng, &mut batch, &stop);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
}
