//! Pieces the producers and consumers share: a small random generator,
//! the stop flag, the error log and the per-thread recorders of what was
//! delivered.

use super::*;

/// A small, fast PRNG (xorshift64*), one per thread.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        // splitmix64 of the seed, never zero.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Unexpected errors of one mode (the first few kept verbatim).
#[derive(Default)]
pub(super) struct Errors {
    pub(super) list: Mutex<Vec<String>>,
    pub(super) count: AtomicU64,
}

impl Errors {
    const KEEP: usize = 16;

    pub(super) fn push(&self, msg: String) {
        self.count.fetch_add(1, Ordering::SeqCst);
        let mut l = lock(&self.list);
        if l.len() < Self::KEEP {
            l.push(msg);
        }
    }

    pub(super) fn take(&self) -> Vec<String> {
        let mut l = std::mem::take(&mut *lock(&self.list));
        let n = self.count.load(Ordering::SeqCst) as usize;
        if n > l.len() {
            l.push(format!("... and {} more error(s)", n - l.len()));
        }
        l
    }
}

/// Stop flag plus deadline: every loop of the harness checks this.
#[derive(Clone)]
pub(super) struct Stop {
    pub(super) flag: Arc<AtomicBool>,
    pub(super) deadline: Instant,
}

impl Stop {
    pub(super) fn stopped(&self) -> bool {
        self.flag.load(Ordering::Relaxed) || Instant::now() >= self.deadline
    }
}

/// The consumer-side record of one EVD: its checker and progress counter.
pub(super) struct Shard {
    pub(super) checker: Mutex<Recorder>,
    pub(super) unique: AtomicU64,
    pub(super) fault: Option<Fault>,
}

pub(super) struct Recorder {
    pub(super) checker: Checker,
    /// Events handed to `record` so far.
    pub(super) received: u64,
    /// An event a `Fault::Delay` holds back.
    pub(super) held: Option<Event>,
}

fn same_stream(a: &Event, b: &Event) -> bool {
    match (decode(a), decode(b)) {
        (Some((p, s, _)), Some((q, t, _))) => p == q && s == t,
        _ => false,
    }
}

impl Shard {
    pub(super) fn new(producers: usize, scope: OrderScope, fault: Option<Fault>) -> Shard {
        Shard {
            checker: Mutex::new(Recorder {
                checker: Checker::new(producers, scope),
                received: 0,
                held: None,
            }),
            unique: AtomicU64::new(0),
            fault,
        }
    }

    pub(super) fn record(&self, events: &[Event]) {
        let mut r = lock(&self.checker);
        for ev in events {
            r.received += 1;
            match self.fault {
                None | Some(Fault::SkipReEnable) => r.checker.record(ev),
                Some(Fault::Drop(n)) => {
                    if r.received != n {
                        r.checker.record(ev);
                    }
                }
                Some(Fault::Duplicate(n)) => {
                    r.checker.record(ev);
                    if r.received == n {
                        r.checker.record(ev);
                    }
                }
                Some(Fault::Delay(n)) => {
                    if r.received == n {
                        r.held = Some(ev.clone());
                        continue;
                    }
                    r.checker.record(ev);
                    if r.held.as_ref().is_some_and(|h| same_stream(h, ev))
                        && let Some(h) = r.held.take()
                    {
                        r.checker.record(&h);
                    }
                }
            }
        }
        let unique = r.checker.unique();
        self.unique.store(unique, Ordering::SeqCst);
    }
}
