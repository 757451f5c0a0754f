//! The connections that feed one EVD, as one progress hook of that EVD.
//!
//! A consumer that finds an EVD empty, or is about to wait on it, runs
//! its hooks ([`rdapl::provider::Progress`]). The provider attaches one
//! [`Group`] per EVD (whatever number of its connections feed it), so a
//! pass costs what moves, not what is attached:
//!
//! * **A pass** asks once which sockets have input (a zero-timeout wait on
//!   the provider's pollset, which holds every connection's socket) and
//!   pumps only the members it names, and those whose last pump left work
//!   (the `busy` list: every member that stops being `quiet` is put there,
//!   see `ConnCell::unquiet`). A group of one pumps its member without
//!   asking.
//! * **Freshness.** A pass records itself (a sequence number of the
//!   provider, and the time); a member is polled while the newest pass of
//!   one of its groups is younger than `poll_fresh_ms` and newer than
//!   every park of its groups (`ConnCell::polling`): the progress thread
//!   then leaves its input to the consumer.
//! * **A park** records itself, then hands back what the consumer held:
//!   the members whose input the thread left to it, and those whose pass
//!   held output back (the `claimed` list). The thread, when it leaves a
//!   member's input, puts it on that list and looks at the freshness
//!   again (a Dekker pair with the park's record and its drain of the
//!   list): a park is never missed.
//!
//! Members join when their connection is established and leave when it
//! is dropped; the group goes with its last member (the EVD holds it
//! weakly).

use crate::params::IaParams;
use crate::progress::{ConnCell, Shared};
use parking_lot::Mutex;
use rustc_hash::FxHashMap as HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// The connections of one provider instance that feed one EVD.
pub(crate) struct Group {
    sh: Arc<Shared>,
    members: Mutex<HashMap<u64, Weak<ConnCell>>>,
    /// Members to pump whatever their socket says (each once: see
    /// `progress::cell::Membership`).
    busy: Mutex<Vec<u64>>,
    /// Members whose input the thread left to the consumer, or whose
    /// pass held output back: a park hands them back.
    claimed: Mutex<Vec<u64>>,
    /// The newest pass's sequence number (0: none) and 1 + its time (ms).
    last_pass: AtomicU64,
    last_pass_ms: AtomicU64,
    /// The newest park's sequence number.
    last_park: AtomicU64,
    /// The longest `wait_spin_us` of the members' IAs.
    wait_spin_us: AtomicU64,
    /// The largest `poll_yield` of the members' IAs (0: passes never
    /// yield), and the passes counted towards the next yield.
    poll_yield: AtomicU32,
    passes: AtomicU32,
}

impl Group {
    pub fn new(sh: Arc<Shared>) -> Group {
        Group {
            sh,
            members: Mutex::new(HashMap::default()),
            busy: Mutex::new(Vec::new()),
            claimed: Mutex::new(Vec::new()),
            last_pass: AtomicU64::new(0),
            last_pass_ms: AtomicU64::new(0),
            last_park: AtomicU64::new(0),
            wait_spin_us: AtomicU64::new(0),
            poll_yield: AtomicU32::new(0),
            passes: AtomicU32::new(0),
        }
    }

    /// `cell` joins (its connection was just established): busy until
    /// its first pass. `ia` is its IA's settings.
    pub fn join(&self, cell: &Arc<ConnCell>, ia: &IaParams) {
        self.wait_spin_us
            .fetch_max(ia.wait_spin_us, Ordering::Relaxed);
        self.poll_yield.fetch_max(ia.poll_yield, Ordering::Relaxed);
        self.members.lock().insert(cell.token, Arc::downgrade(cell));
        self.busy.lock().push(cell.token);
    }

    /// Connection `token` is gone.
    pub fn leave(&self, token: u64) {
        self.members.lock().remove(&token);
    }

    /// Member `token` has work whatever its socket says.
    pub fn mark_busy(&self, token: u64) {
        self.busy.lock().push(token);
    }

    /// Member `token` holds something a park must hand back.
    pub fn claim(&self, token: u64) {
        self.claimed.lock().push(token);
    }

    /// The newest pass (sequence number, 1 + its time in ms) and park.
    pub fn freshness(&self) -> (u64, u64, u64) {
        let park = self.last_park.load(Ordering::SeqCst);
        let pass = self.last_pass.load(Ordering::Acquire);
        let ms = self.last_pass_ms.load(Ordering::Relaxed);
        (pass, ms, park)
    }

    /// The live members named by `tokens` (deduplicated), and how many
    /// members there are.
    fn cells(&self, tokens: &mut Vec<u64>, all: bool) -> (Vec<Arc<ConnCell>>, usize) {
        let m = self.members.lock();
        let cells = if all {
            m.values().filter_map(Weak::upgrade).collect()
        } else {
            tokens.sort_unstable();
            tokens.dedup();
            tokens
                .iter()
                .filter_map(|t| m.get(t).and_then(Weak::upgrade))
                .collect()
        };
        (cells, m.len())
    }
}

impl rdapl::provider::Progress for Group {
    fn wait_spin(&self) -> std::time::Duration {
        std::time::Duration::from_micros(self.wait_spin_us.load(Ordering::Relaxed))
    }

    fn progress(&self) {
        let sh = &self.sh;
        // Numbered in the sequence's order whatever the memory order; a
        // stale view of it only makes the thread take the input back.
        let seq = sh.pass_seq.fetch_add(1, Ordering::Relaxed) + 1;
        let now = sh.now();
        self.last_pass_ms.store(now + 1, Ordering::Release);
        self.last_pass.store(seq, Ordering::Release);
        let st = &sh.stats;
        st.passes.fetch_add(1, Ordering::Relaxed);
        // A poll loop on a CPU it shares with its peer would keep the peer
        // off it for a time slice: every `poll_yield` passes, it yields.
        let every = self.poll_yield.load(Ordering::Relaxed);
        if every > 0 && self.passes.fetch_add(1, Ordering::Relaxed) % every == every - 1 {
            st.poll_yields.fetch_add(1, Ordering::Relaxed);
            std::thread::yield_now();
        }
        // One member (an endpoint with EVDs of its own): pumped without a
        // readiness check. Its busy flag stays set, so its list holds it
        // once and is not needed.
        let one = {
            let m = self.members.lock();
            match m.len() {
                0 => return,
                1 => m.values().next().and_then(Weak::upgrade),
                _ => None,
            }
        };
        if let Some(c) = one {
            st.pass_pumps.fetch_add(1, Ordering::Relaxed);
            return c.pass(now);
        }
        let mut tokens = std::mem::take(&mut *self.busy.lock());
        // Which sockets have input: one system call for the pass.
        let all = sh.with_ready(|ready, all| {
            if !all {
                tokens.extend_from_slice(ready);
            }
            all
        });
        let (cells, members) = self.cells(&mut tokens, all);
        for c in &cells {
            c.taken(self, true);
        }
        st.pass_pumps
            .fetch_add(cells.len() as u64, Ordering::Relaxed);
        st.pass_skips.fetch_add(
            members.saturating_sub(cells.len()) as u64,
            Ordering::Relaxed,
        );
        for c in cells {
            c.pass(now);
        }
    }

    fn progress_pass(&self, _pass: u64) {
        // Hooks of several providers (or instances) on one EVD: each asks
        // its own pollset.
        self.progress();
    }

    fn park(&self) {
        let seq = self.sh.pass_seq.fetch_add(1, Ordering::SeqCst) + 1;
        self.last_park.store(seq, Ordering::SeqCst);
        let mut tokens = std::mem::take(&mut *self.claimed.lock());
        if tokens.is_empty() {
            return;
        }
        let (cells, _) = self.cells(&mut tokens, false);
        for c in cells {
            c.taken(self, false);
            c.park();
        }
    }
}
