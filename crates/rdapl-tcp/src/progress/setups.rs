//! A listener's accepted connections that may still wait for their MPA
//! request, kept to its IA's `setups`.
//!
//! * Past `setups` waiting, the oldest that waited [`SETUP_GRACE_MS`] or
//!   more are closed (the consumer never saw them): a flood of idle
//!   connections holds at most that many sockets, plus what arrives
//!   within the grace, and a real client still gets in.
//! * The list's size follows the connections still in set-up, not the
//!   accept rate: a walk drops the entries of those that moved on, grace
//!   or not. A listener accepting many clients a second that all send
//!   their request at once holds a few entries, not a second's worth.
//! * Past `setups`, a walk comes once the list holds twice what the last
//!   walk left, or once the oldest waited the grace and the last walk is
//!   [`GRACE_WALK_GAP_MS`] old: however fast accepts come, within the
//!   grace or past it, each walks the list amortised O(1) times. An idle
//!   connection past the cap is closed within the grace and that gap.

use super::SETUP_GRACE_MS;
use std::collections::VecDeque;

/// The least time between two walks that the grace alone makes due: under
/// a steady flood of idle connections past the cap the oldest has always
/// just waited the grace, and a walk at every accept would cost the whole
/// list each time.
pub(crate) const GRACE_WALK_GAP_MS: u64 = SETUP_GRACE_MS / 8;

/// The list of one listener (see the module docs).
#[derive(Default)]
pub(crate) struct Setups {
    /// (connection token, accepted at, ms), oldest first. Some may have
    /// moved on since the last walk.
    list: VecDeque<(u64, u64)>,
    /// The length past which the next accept walks the list.
    walk_at: usize,
    /// When the last walk was (ms), if there was one.
    walked_at: Option<u64>,
}

impl Setups {
    /// Adds the connections accepted at `now`; returns the list if a walk
    /// is due ([`walk`] it, then [`Setups::put_back`]).
    pub fn add(&mut self, accepted: &[u64], now: u64, cap: usize) -> Option<VecDeque<(u64, u64)>> {
        self.list.extend(accepted.iter().map(|&t| (t, now)));
        // Past the cap: walked once the list doubled since the last walk
        // (connections that moved on leave it), or once the oldest waited
        // the grace (it may have to be closed) and the last walk is not
        // recent.
        let grace_due = || {
            self.walked_at
                .is_none_or(|w| w.saturating_add(GRACE_WALK_GAP_MS) <= now)
                && self
                    .list
                    .front()
                    .is_some_and(|&(_, at)| at.saturating_add(SETUP_GRACE_MS) <= now)
        };
        let due = self.list.len() > cap && (self.list.len() > self.walk_at || grace_due());
        due.then(|| std::mem::take(&mut self.list))
    }

    /// Puts back a list walked at `now`; the next walk comes at twice its
    /// length, or once the grace and the gap allow. Room a past burst
    /// needed is given back.
    pub fn put_back(&mut self, mut list: VecDeque<(u64, u64)>, cap: usize, now: u64) {
        self.walked_at = Some(now);
        let keep = list.len().max(cap).saturating_mul(2);
        if list.capacity() > keep.saturating_mul(2) {
            list.shrink_to(keep);
        }
        self.walk_at = list.len().saturating_mul(2);
        self.list = list;
    }

    /// Entries held (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.list.len()
    }
}

/// Walks a listener's list at `now`: drops the entries of connections no
/// longer in set-up (`in_setup` false), then, while more than `cap`
/// remain, the oldest that waited the grace or more, each closed by
/// `close`.
pub(crate) fn walk(
    list: &mut VecDeque<(u64, u64)>,
    cap: usize,
    now: u64,
    mut in_setup: impl FnMut(u64) -> bool,
    mut close: impl FnMut(u64),
) {
    list.retain(|&(t, _)| in_setup(t));
    while list.len() > cap
        && let Some(&(t, at)) = list.front()
        && at.saturating_add(SETUP_GRACE_MS) <= now
    {
        list.pop_front();
        close(t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: usize = 64;

    /// Accepts connections `ts`, `batch` at a time, at `now`; `in_setup`
    /// says which still wait. Returns the walks made, the closed, and the
    /// most entries held.
    fn accept(
        s: &mut Setups,
        ts: std::ops::Range<u64>,
        batch: usize,
        now: u64,
        in_setup: impl Fn(u64) -> bool,
    ) -> (usize, Vec<u64>, usize) {
        let (mut walks, mut closed, mut most) = (0, Vec::new(), 0);
        let ts: Vec<u64> = ts.collect();
        for b in ts.chunks(batch) {
            if let Some(mut l) = s.add(b, now, CAP) {
                walks += 1;
                walk(&mut l, CAP, now, &in_setup, |c| closed.push(c));
                s.put_back(l, CAP, now);
            }
            most = most.max(s.len());
        }
        (walks, closed, most)
    }

    /// Clients that send their request at once, far more than `setups`
    /// within the grace: the list stays small (before, it held every one
    /// accepted in the last second) and is walked rarely.
    #[test]
    fn connections_that_moved_on_leave_the_list_within_the_grace() {
        let mut s = Setups::default();
        let (walks, closed, most) = accept(&mut s, 0..100_000, 3, 5, |_| false);
        assert!(closed.is_empty());
        assert!(most <= CAP + 3, "{most} entries held");
        assert!(walks <= 100_000 / CAP, "{walks} walks");
        assert!(
            s.list.capacity() <= 8 * CAP,
            "room for {}",
            s.list.capacity()
        );
    }

    /// A steady flood of idle connections past the cap, ten a
    /// millisecond for three seconds: each accept walks the list amortised
    /// O(1) times (before, once the first grace was over, every accept
    /// walked all ten thousand entries), and an idle one past the cap is
    /// still closed within the grace and the gap.
    #[test]
    fn a_steady_idle_flood_walks_the_list_amortised_o1_times_an_accept() {
        let mut s = Setups::default();
        let looks = std::cell::Cell::new(0u64);
        let mut closed = 0u64;
        for now in 0..3_000u64 {
            let ts: Vec<u64> = (now * 10..now * 10 + 10).collect();
            if let Some(mut l) = s.add(&ts, now, CAP) {
                let in_setup = |_| {
                    looks.set(looks.get() + 1);
                    true
                };
                walk(&mut l, CAP, now, in_setup, |_| closed += 1);
                s.put_back(l, CAP, now);
            }
            if s.len() > CAP {
                let (_, oldest) = s.list.front().copied().unwrap();
                assert!(
                    now - oldest <= SETUP_GRACE_MS + GRACE_WALK_GAP_MS,
                    "at {now} ms an entry of {oldest} ms is still held"
                );
            }
        }
        let accepts = 30_000;
        assert!(closed >= 18_000, "{closed} closed");
        assert!(
            looks.get() <= 20 * accepts,
            "{} looks for {accepts} accepts",
            looks.get()
        );
    }

    /// A flood of idle connections: none is closed within the grace, and
    /// the walks stay amortised; past it, the oldest go first and none
    /// still within its grace does.
    #[test]
    fn idle_connections_beyond_the_cap_go_oldest_first_after_the_grace() {
        let mut s = Setups::default();
        let (walks, closed, most) = accept(&mut s, 0..1_000, 1, 0, |_| true);
        assert!(closed.is_empty(), "closed within the grace: {closed:?}");
        assert_eq!(most, 1_000);
        assert!(walks <= 12, "{walks} walks for 1,000 accepts");
        // A grace later: the next walk closes the 1,000 (oldest first)
        // and keeps the newer ones, still within theirs.
        let later = SETUP_GRACE_MS;
        let (_, mut closed, _) = accept(&mut s, 1_000..1_200, 1, later, |_| true);
        let mut l = std::mem::take(&mut s.list);
        walk(&mut l, CAP, later, |_| true, |c| closed.push(c));
        assert_eq!(closed, (0..1_000).collect::<Vec<_>>());
        assert_eq!(l.len(), 200);
        assert!(l.iter().all(|&(t, at)| t >= 1_000 && at == later));
        // Once they too waited the grace: down to the cap, newest kept.
        let mut closed = Vec::new();
        walk(
            &mut l,
            CAP,
            later + SETUP_GRACE_MS,
            |_| true,
            |c| closed.push(c),
        );
        assert_eq!(closed, (1_000..1_136).collect::<Vec<_>>());
        assert_eq!(l.len(), CAP);
    }
}
