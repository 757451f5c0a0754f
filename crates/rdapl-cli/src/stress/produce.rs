//! The producers: threads that reserve and complete DTO events and post
//! software events at their own pace, counting what they posted.

use super::*;

/// A producer's progress: events posted per stream (readable at any time).
#[derive(Default)]
pub(super) struct Posted(pub(super) [AtomicU64; 2]);

impl Posted {
    pub(super) fn get(&self) -> [u64; 2] {
        [
            self.0[0].load(Ordering::SeqCst),
            self.0[1].load(Ordering::SeqCst),
        ]
    }
}

pub(super) fn produce(
    id: usize,
    evd: &Evd,
    quota: u64,
    seed: u64,
    stop: &Stop,
    posted: &Posted,
    errors: &Errors,
) {
    let _feeder = evd.feeder();
    let mut rng = Rng::new(seed ^ ((id as u64 + 1) << 32));
    let mut seq = [0u64; 2];
    let mut sent = 0u64;
    let mut until_yield = 1 + rng.below(64);
    let mut held = Vec::with_capacity(4);
    let mut iter = 0u32;
    'work: while sent < quota {
        iter = iter.wrapping_add(1);
        if stop.flag.load(Ordering::Relaxed) || (iter.is_multiple_of(128) && stop.stopped()) {
            break;
        }
        if rng.below(8) == 0 {
            // A software event; QueueFull means "full right now": retry.
            let value = software_value(id, seq[1]);
            loop {
                match evd.post_se(value) {
                    Ok(()) => break,
                    Err(Error::QueueFull) => {
                        if stop.stopped() {
                            break 'work;
                        }
                        thread::yield_now();
                    }
                    Err(e) => {
                        errors.push(format!("producer {id}: post_se: {e}"));
                        break 'work;
                    }
                }
            }
            seq[1] += 1;
            sent += 1;
            posted.0[1].store(seq[1], Ordering::SeqCst);
        } else {
            // A few DTOs "posted" (slots reserved), then completed in order.
            let want = (1 + rng.below(4)).min(quota - sent) as usize;
            let mut failed = false;
            while held.len() < want {
                match evd.reserve() {
                    Ok(r) => held.push(r),
                    Err(Error::InsufficientResources { .. }) => {
                        // Full: complete what is held first (holding slots
                        // while waiting for more could starve everyone).
                        if !held.is_empty() {
                            break;
                        }
                        if stop.stopped() {
                            break 'work;
                        }
                        thread::yield_now();
                    }
                    Err(e) => {
                        errors.push(format!("producer {id}: reserve: {e}"));
                        failed = true;
                        break;
                    }
                }
            }
            for r in held.drain(..) {
                evd.complete(r, dto_event(id, seq[0]))
                    .expect("reserved on this EVD");
                seq[0] += 1;
                sent += 1;
            }
            posted.0[0].store(seq[0], Ordering::SeqCst);
            if failed {
                break;
            }
        }
        until_yield -= 1;
        if until_yield == 0 {
            // Let the queue drain now and then, so the consumer goes back to
            // upcalls instead of polling forever.
            thread::yield_now();
            until_yield = 1 + rng.below(64);
        }
    }
}
