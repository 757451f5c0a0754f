//! The consumers of each mode (upcalls, polling, waiting, the poller, the
//! seed's flow), their counters, and the cleanup at a mode's end.

use super::*;

pub(super) enum Consumers {
    Flows {
        flows: Vec<Arc<Flow>>,
        threads: Vec<JoinHandle<()>>,
    },
    Pollers {
        pollers: Vec<Poller>,
        entries: Vec<(usize, PollerEntry)>,
    },
}

/// Copies the consumers' counters into the report.
pub(super) fn consumer_stats(c: &Consumers, r: &mut ModeReport) {
    match c {
        Consumers::Flows { flows, .. } => {
            for f in flows {
                r.upcalls += f.upcalls.load(Ordering::Relaxed);
                r.poll_phases += f.handoffs.load(Ordering::Relaxed);
                r.repolls += f.repolls.load(Ordering::Relaxed);
                r.overlaps += f.overlaps.load(Ordering::Relaxed);
            }
        }
        Consumers::Pollers { entries, .. } => {
            for (_, e) in entries {
                let s = e.stats();
                r.upcalls += s.upcalls;
                r.poll_phases += s.runs;
                r.repolls += s.rearm_pending;
            }
        }
    }
}

pub(super) fn build_consumers(
    mode: Mode,
    cfg: &StressConfig,
    evd_count: usize,
    shards: &[Arc<Shard>],
    errors: &Arc<Errors>,
    stop: &Stop,
) -> Result<(Vec<Evd>, Consumers), String> {
    let flags = EvdFlags::DTO | EvdFlags::SOFTWARE;
    let dispatcher: Arc<dyn Dispatch> = Dispatcher::new(2);
    match mode.policy() {
        Some(policy) => {
            let mut evds = Vec::new();
            let mut flows = Vec::new();
            let mut threads = Vec::new();
            for (i, shard) in shards.iter().enumerate().take(evd_count) {
                let (tx, rx) = mpsc::channel();
                let flow = Arc::new(Flow {
                    policy,
                    re_enables: mode.re_enables(),
                    switch_every: cfg.switch_every,
                    qlen: cfg.qlen as u64,
                    phase: AtomicU8::new(PHASE_UPCALL),
                    in_phase: AtomicU64::new(0),
                    upcalls: AtomicU64::new(0),
                    handoffs: AtomicU64::new(0),
                    repolls: AtomicU64::new(0),
                    overlaps: AtomicU64::new(0),
                    shard: shard.clone(),
                    tx,
                    errors: errors.clone(),
                    skip_re_enable: AtomicBool::new(cfg.fault == Some(Fault::SkipReEnable)),
                });
                let up = flow.clone();
                let evd = Evd::builder(cfg.qlen, flags)
                    .dispatch(dispatcher.clone())
                    .upcall(
                        policy,
                        Arc::new(move |evd: &Evd, ev: Option<Event>, _more: bool| {
                            up.upcall(evd, ev)
                        }),
                    )
                    .build()
                    .map_err(|e| format!("creating EVD {i}: {e}"))?;
                let (f, e, s) = (flow.clone(), evd.clone(), stop.clone());
                let seed = cfg.seed ^ (0xC0FFEE + i as u64);
                let t = thread::Builder::new()
                    .name(format!("stress-poll-{i}"))
                    .spawn(move || poll_thread(f, e, rx, s, seed))
                    .map_err(|e| format!("starting a polling thread: {e}"))?;
                evds.push(evd);
                flows.push(flow);
                threads.push(t);
            }
            Ok((evds, Consumers::Flows { flows, threads }))
        }
        None => {
            let configs = [
                PollerConfig {
                    threads: 1,
                    budget: 64,
                    mode: ReEnable::OnNew,
                },
                PollerConfig {
                    threads: 1,
                    budget: 16,
                    mode: ReEnable::Strict,
                },
            ];
            let pollers = configs
                .iter()
                .map(|c| Poller::new(*c).map_err(|e| format!("starting a poller: {e}")))
                .collect::<Result<Vec<_>, _>>()?;
            let mut evds = Vec::new();
            let mut entries = Vec::new();
            for (i, shard) in shards.iter().enumerate().take(evd_count) {
                let evd = Evd::builder(cfg.qlen, flags)
                    .dispatch(dispatcher.clone())
                    .build()
                    .map_err(|e| format!("creating EVD {i}: {e}"))?;
                let s = shard.clone();
                let entry = pollers[i % pollers.len()]
                    .add(&evd, move |ev: Event| s.record(std::slice::from_ref(&ev)))
                    .map_err(|e| format!("attaching EVD {i} to a poller: {e}"))?;
                evds.push(evd);
                entries.push((i % pollers.len(), entry));
            }
            Ok((evds, Consumers::Pollers { pollers, entries }))
        }
    }
}

/// What the bounded clean-up found.
pub(super) struct Cleanup {
    pub(super) stranded: u64,
}

/// Stops the consumers, tears the EVDs down, records what was left queued,
/// frees the EVDs. Runs on its own thread so that a stuck core call cannot
/// make the harness hang.
pub(super) fn cleanup(
    consumers: Consumers,
    evds: Vec<Evd>,
    shards: Vec<Arc<Shard>>,
    errors: Arc<Errors>,
) -> Cleanup {
    match consumers {
        Consumers::Flows { threads, .. } => {
            for t in threads {
                if t.join().is_err() {
                    errors.push("a polling thread panicked".into());
                }
            }
            for evd in &evds {
                if let Err(e) = evd.modify_upcall(UpcallPolicy::Teardown, None, ReEnable::OnNew) {
                    errors.push(format!("cleanup: modify_upcall(Teardown): {e}"));
                }
            }
        }
        Consumers::Pollers { pollers, entries } => {
            for (p, entry) in entries {
                if let Err(e) = entry.remove(&pollers[p]) {
                    errors.push(format!("cleanup: removing a poller entry: {e}"));
                }
            }
            drop(pollers);
        }
    }
    let mut stranded = 0u64;
    let mut batch = Vec::new();
    for (evd, shard) in evds.iter().zip(&shards) {
        // Bounded: an EVD holds at most qlen events and nobody posts now.
        for _ in 0..=rdapl::evd::MAX_QLEN {
            batch.clear();
            match evd.dequeue_batch(&mut batch, 256) {
                Ok(0) => break,
                Ok(n) => {
                    stranded += n as u64;
                    shard.record(&batch);
                }
                Err(e) => {
                    errors.push(format!("cleanup: dequeue_batch: {e}"));
                    break;
                }
            }
        }
        if let Err(e) = evd.free() {
            errors.push(format!("cleanup: free: {e}"));
        }
    }
    Cleanup { stranded }
}
