//! Which `Teardown` calls made from inside upcalls wait for which EVDs, so
//! that a call that would close a cycle of such waits is refused instead
//! of deadlocking.
//!
//! A thread inside an upcall of EVD `x` that tears EVD `y` down waits for
//! `y`'s running upcalls; if one of those is itself waiting, directly or
//! through others, for `x`'s upcalls, nobody can return. Each such wait is
//! recorded as an edge `x -> y` under one process-wide lock, and an edge
//! is refused when `x` is already reachable from `y`. The edge of the
//! first call of a cycle is in place before the last one checks, so
//! exactly the call that would close the cycle is refused. Teardown is
//! rare, so the lock costs nothing on any hot path. (Loom builds check
//! only the shortest cycle, an EVD's own upcall.)
//!
//! The poller records here too, under ids of its own
//! ([`crate::poller`]): a handler that detaches another entry waits for
//! that entry's handler run.

#[cfg(not(rdapl_loom))]
use std::sync::Mutex;

#[cfg(not(rdapl_loom))]
static WAITS: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());

/// A recorded wait `from -> to`, removed when dropped.
pub(crate) struct Waiting {
    #[cfg(not(rdapl_loom))]
    edge: Option<(u64, u64)>,
}

/// Records that a thread inside an upcall of EVD `from` (0: not inside an
/// upcall) waits for the upcalls of EVD `to`. `None` if that would close
/// a cycle of waits.
pub(crate) fn enter(from: u64, to: u64) -> Option<Waiting> {
    #[cfg(rdapl_loom)]
    {
        (from == 0 || from != to).then_some(Waiting {})
    }
    #[cfg(not(rdapl_loom))]
    {
        if from == 0 {
            return Some(Waiting { edge: None });
        }
        let mut waits = WAITS.lock().unwrap_or_else(|e| e.into_inner());
        // Is `from` reachable from `to`? (The graph is a handful of edges.)
        let mut seen = vec![to];
        let mut next = 0;
        while let Some(&at) = seen.get(next) {
            next += 1;
            if at == from {
                return None;
            }
            for &(a, b) in waits.iter() {
                if a == at && !seen.contains(&b) {
                    seen.push(b);
                }
            }
        }
        waits.push((from, to));
        Some(Waiting {
            edge: Some((from, to)),
        })
    }
}

#[cfg(not(rdapl_loom))]
impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(edge) = self.edge {
            let mut waits = WAITS.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = waits.iter().position(|&e| e == edge) {
                waits.swap_remove(i);
            }
        }
    }
}

#[cfg(all(test, not(rdapl_loom)))]
mod tests {
    use super::enter;

    #[test]
    fn refuses_exactly_the_wait_that_closes_a_cycle() {
        // Ids far from real EVDs' so that parallel tests do not interfere.
        let (a, b, c) = (u64::MAX - 1, u64::MAX - 2, u64::MAX - 3);
        let ab = enter(a, b).expect("a -> b");
        let bc = enter(b, c).expect("b -> c");
        assert!(enter(c, a).is_none(), "c -> a closes a -> b -> c -> a");
        assert!(enter(b, a).is_none(), "b -> a closes a -> b -> a");
        let outside = enter(0, a).expect("a thread outside upcalls never closes a cycle");
        drop(ab);
        let ca = enter(c, a).expect("no cycle once a -> b is gone");
        drop((bc, ca, outside));
    }
}
