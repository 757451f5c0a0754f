//! The checker: every event delivered exactly once, and in order where
//! the mode promises order, tracked per stream in a bounded window.

use super::*;

/// How the [`Checker`] judges order.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum OrderScope {
    /// All events of a (producer, stream) must be recorded in increasing
    /// order, whichever thread records them (one consumer at a time).
    Global,
    /// Each recording thread must see each (producer, stream) in increasing
    /// order (concurrent consumers, `Many` policy).
    PerThread,
}

/// Words of the sliding bitmap at most (4 Mi sequence numbers ahead of the
/// lowest unseen one); an event further ahead is counted as invalid.
pub(super) const MAX_WINDOW_WORDS: usize = 1 << 16;

#[derive(Clone, Debug, Default)]
pub(super) struct StreamCheck {
    /// Every sequence below `base` was seen.
    pub(super) base: u64,
    /// Bit `i` of word `w`: sequence `base + 64 * w + i` was seen.
    pub(super) window: VecDeque<u64>,
    /// One past the highest sequence seen.
    pub(super) high: u64,
    pub(super) unique: u64,
    pub(super) duplicated: u64,
    pub(super) out_of_order: u64,
}

pub(super) enum Seen {
    New { late: bool },
    Duplicate,
    TooFar,
}

impl StreamCheck {
    pub(super) fn insert(&mut self, seq: u64) -> Seen {
        if seq < self.base {
            self.duplicated += 1;
            return Seen::Duplicate;
        }
        let off = seq - self.base;
        let word = (off / 64) as usize;
        let bit = 1u64 << (off % 64);
        if word >= MAX_WINDOW_WORDS {
            return Seen::TooFar;
        }
        if word >= self.window.len() {
            self.window.resize(word + 1, 0);
        }
        if self.window[word] & bit != 0 {
            self.duplicated += 1;
            return Seen::Duplicate;
        }
        self.window[word] |= bit;
        self.unique += 1;
        let late = seq < self.high;
        if !late {
            self.high = seq + 1;
        }
        while self.window.front() == Some(&u64::MAX) {
            self.window.pop_front();
            self.base += 64;
        }
        Seen::New { late }
    }

    /// How many distinct sequences `>= n` were seen.
    pub(super) fn seen_at_or_above(&self, n: u64) -> u64 {
        let in_window = |from_off: u64| -> u64 {
            self.window
                .iter()
                .enumerate()
                .map(|(w, bits)| {
                    let lo = w as u64 * 64;
                    if lo + 64 <= from_off {
                        0
                    } else if lo >= from_off {
                        u64::from(bits.count_ones())
                    } else {
                        u64::from((bits >> (from_off - lo)).count_ones())
                    }
                })
                .sum()
        };
        if n <= self.base {
            (self.base - n) + in_window(0)
        } else {
            in_window(n - self.base)
        }
    }
}

/// What a [`Checker`] concluded, given what was produced.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Distinct produced events seen.
    pub seen: u64,
    /// Produced, never seen.
    pub lost: u64,
    /// Extra deliveries of an event already seen.
    pub duplicated: u64,
    /// Events seen after a later event of their (producer, stream).
    pub out_of_order: u64,
    /// Events that were never produced (unknown producer, a sequence beyond
    /// what was produced, a foreign event type).
    pub invalid: u64,
}

impl Tally {
    /// Adds another tally.
    pub fn add(&mut self, o: &Tally) {
        self.seen += o.seen;
        self.lost += o.lost;
        self.duplicated += o.duplicated;
        self.out_of_order += o.out_of_order;
        self.invalid += o.invalid;
    }

    /// True if nothing was lost, duplicated, reordered or invented.
    pub fn clean(&self) -> bool {
        self.lost == 0 && self.duplicated == 0 && self.out_of_order == 0 && self.invalid == 0
    }
}

/// Exactly-once and order checker with memory bounded by the reorder
/// distance, not by the number of events.
#[derive(Clone, Debug)]
pub struct Checker {
    producers: usize,
    scope: OrderScope,
    /// Index `producer * 2 + stream`.
    streams: Vec<StreamCheck>,
    /// Per-thread "one past the last sequence seen", for `PerThread`.
    per_thread: HashMap<ThreadId, Vec<u64>>,
    per_thread_ooo: u64,
    invalid: u64,
    unique: u64,
}

impl Checker {
    /// A checker for events of `producers` producers.
    pub fn new(producers: usize, scope: OrderScope) -> Checker {
        Checker {
            producers,
            scope,
            streams: vec![StreamCheck::default(); producers * 2],
            per_thread: HashMap::new(),
            per_thread_ooo: 0,
            invalid: 0,
            unique: 0,
        }
    }

    /// Records one delivered event.
    pub fn record(&mut self, ev: &Event) {
        match decode(ev) {
            Some((p, stream, seq)) => self.record_seq(p, stream, seq),
            None => self.invalid += 1,
        }
    }

    /// Records the delivery of (producer, stream, seq).
    pub fn record_seq(&mut self, producer: usize, stream: StreamKind, seq: u64) {
        if producer >= self.producers {
            self.invalid += 1;
            return;
        }
        let key = producer * 2 + stream as usize;
        match self.streams[key].insert(seq) {
            Seen::Duplicate => {}
            Seen::TooFar => self.invalid += 1,
            Seen::New { late } => {
                self.unique += 1;
                match self.scope {
                    OrderScope::Global => {
                        if late {
                            self.streams[key].out_of_order += 1;
                        }
                    }
                    OrderScope::PerThread => {
                        let keys = self.streams.len();
                        let next = &mut self
                            .per_thread
                            .entry(thread::current().id())
                            .or_insert_with(|| vec![0; keys])[key];
                        if seq < *next {
                            self.per_thread_ooo += 1;
                        } else {
                            *next = seq + 1;
                        }
                    }
                }
            }
        }
    }

    /// Distinct events recorded so far (produced or not).
    pub fn unique(&self) -> u64 {
        self.unique
    }

    /// The verdict, given how many events each producer produced on each
    /// stream (`produced[p][stream]`; producers beyond the slice produced
    /// nothing).
    pub fn tally(&self, produced: &[[u64; 2]]) -> Tally {
        let mut t = Tally {
            invalid: self.invalid,
            out_of_order: self.per_thread_ooo,
            ..Tally::default()
        };
        for (key, s) in self.streams.iter().enumerate() {
            let made = produced.get(key / 2).map_or(0, |p| p[key % 2]);
            let phantom = s.seen_at_or_above(made);
            let real = s.unique - phantom;
            t.seen += real;
            t.lost += made - real;
            t.invalid += phantom;
            t.duplicated += s.duplicated;
            t.out_of_order += s.out_of_order;
        }
        t
    }
}
