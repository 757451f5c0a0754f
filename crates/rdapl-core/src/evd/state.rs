//! The EVD state word: upcall policy, waiter threshold and notification
//! flags in one `u64`, so that every notification decision is a single
//! compare-and-swap.
//!
//! The queue depth is *not* in this word: it is the length of the event
//! storage, which producers and consumers change on their own cache lines.
//! A producer pushes, issues a `SeqCst` fence and then reads this word; a
//! consumer that arms a notification changes this word, issues a `SeqCst`
//! fence and then reads the storage's length. By the fence rules one of the
//! two sees the other (the Dekker pattern), so an event is never stranded
//! behind an armed-but-unwoken listener, while a producer whose word says
//! "nobody listens" does no read-modify-write on a line the consumer uses.
//!
//! Layout (bit 0 is the least significant):
//!
//! | bits  | field          | meaning |
//! |-------|----------------|---------|
//! | 0-19  | (unused)       | |
//! | 20-39 | `threshold`    | the armed waiter's threshold (valid while `WAIT_ARMED`) |
//! | 40-42 | `policy`       | the upcall policy ([`Policy`]) |
//! | 43    | `NOTIFY_ARMED` | notify-only policy is armed (one shot) |
//! | 44-47 | `runs`         | dispatch runs scheduled or running for this EVD |
//! | 48-51 | `inup`         | runs that hold the right to call the consumer's upcall |
//! | 52    | `WAITER`       | a `wait` call owns the EVD |
//! | 53    | `WAIT_ARMED`   | that waiter sleeps until the depth reaches `threshold` |
//! | 54    | `STREAM_ARMED` | an async stream sleeps until an event arrives |
//! | 55    | `UNWAITABLE`   | `wait` is refused |
//! | 56    | `CNO_ENABLED`  | arrivals trigger the attached CNO |
//! | 57    | `FREED`        | the EVD was freed |
//! | 58    | `TD_WAITING`   | a `Teardown` caller waits for running upcalls to return |
//! | 59    | `NOTIFY_DUE`   | notify-only fired while a run was in progress: that run notifies again |
//! | 60    | `ENABLING`     | a `Strict` re-enable is checking that nothing is queued: no runs start (the re-enable schedules what the queue needs when it ends) |
//!
//! The functions here are pure: they take a state (and the storage depth the
//! caller read after its fence) and return the next state plus what the
//! caller must do once its CAS has succeeded. `evd/mod.rs` and the files
//! beside it (`consume.rs`, `publish.rs`, `upcall.rs`) run them in CAS
//! loops; the unit tests below and the loom models check them.

/// Largest queue length an EVD supports.
pub const MAX_QLEN: usize = (1 << 20) - 1;

/// Largest number of concurrent dispatch runs for one EVD (`Many` policy).
pub const MAX_RUNS: u64 = 15;

const THRESH_MASK: u64 = (1 << 20) - 1;
const THRESH_SHIFT: u32 = 20;
const POLICY_SHIFT: u32 = 40;
const POLICY_MASK: u64 = 0b111 << POLICY_SHIFT;
pub(crate) const NOTIFY_ARMED: u64 = 1 << 43;
const RUNS_SHIFT: u32 = 44;
const RUNS_MASK: u64 = 0xF << RUNS_SHIFT;
const INUP_SHIFT: u32 = 48;
const INUP_MASK: u64 = 0xF << INUP_SHIFT;
pub(crate) const WAITER: u64 = 1 << 52;
pub(crate) const WAIT_ARMED: u64 = 1 << 53;
pub(crate) const STREAM_ARMED: u64 = 1 << 54;
pub(crate) const UNWAITABLE: u64 = 1 << 55;
pub(crate) const CNO_ENABLED: u64 = 1 << 56;
pub(crate) const FREED: u64 = 1 << 57;
pub(crate) const TD_WAITING: u64 = 1 << 58;
pub(crate) const NOTIFY_DUE: u64 = 1 << 59;
pub(crate) const ENABLING: u64 = 1 << 60;

/// Upcall policy as stored in the state word. `UpcallPolicy` in the public
/// API maps onto it one to one.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Policy {
    Disabled = 0,
    Single = 1,
    Many = 2,
    Notify = 3,
    Teardown = 4,
}

/// A decoded view of the state word (cheap: it is the word itself).
#[derive(Copy, Clone, PartialEq, Eq)]
pub(crate) struct State(pub u64);

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("threshold", &self.threshold())
            .field("policy", &self.policy())
            .field("notify_armed", &self.has(NOTIFY_ARMED))
            .field("runs", &self.runs())
            .field("inup", &self.inup())
            .field("waiter", &self.has(WAITER))
            .field("wait_armed", &self.has(WAIT_ARMED))
            .field("stream_armed", &self.has(STREAM_ARMED))
            .field("unwaitable", &self.has(UNWAITABLE))
            .field("cno_enabled", &self.has(CNO_ENABLED))
            .field("freed", &self.has(FREED))
            .field("enabling", &self.has(ENABLING))
            .finish()
    }
}

impl State {
    pub(crate) fn threshold(self) -> usize {
        ((self.0 >> THRESH_SHIFT) & THRESH_MASK) as usize
    }
    pub(crate) fn policy(self) -> Policy {
        match (self.0 & POLICY_MASK) >> POLICY_SHIFT {
            1 => Policy::Single,
            2 => Policy::Many,
            3 => Policy::Notify,
            4 => Policy::Teardown,
            _ => Policy::Disabled,
        }
    }
    pub(crate) fn runs(self) -> u64 {
        (self.0 & RUNS_MASK) >> RUNS_SHIFT
    }
    pub(crate) fn inup(self) -> u64 {
        (self.0 & INUP_MASK) >> INUP_SHIFT
    }
    pub(crate) fn has(self, flag: u64) -> bool {
        self.0 & flag != 0
    }

    pub(crate) fn with_threshold(self, t: usize) -> State {
        State(
            (self.0 & !(THRESH_MASK << THRESH_SHIFT)) | ((t as u64 & THRESH_MASK) << THRESH_SHIFT),
        )
    }
    pub(crate) fn with_policy(self, p: Policy) -> State {
        State((self.0 & !POLICY_MASK) | ((p as u64) << POLICY_SHIFT))
    }
    pub(crate) fn with_runs(self, r: u64) -> State {
        debug_assert!(r <= MAX_RUNS);
        State((self.0 & !RUNS_MASK) | (r << RUNS_SHIFT))
    }
    pub(crate) fn with_inup(self, r: u64) -> State {
        debug_assert!(r <= MAX_RUNS);
        State((self.0 & !INUP_MASK) | (r << INUP_SHIFT))
    }
    pub(crate) fn set(self, flag: u64) -> State {
        State(self.0 | flag)
    }
    pub(crate) fn clear(self, flag: u64) -> State {
        State(self.0 & !flag)
    }

    /// Upcalls that deliver events (`Single`, `Many`) are on, and no
    /// `Strict` re-enable is still deciding.
    pub(crate) fn delivers(self) -> bool {
        matches!(self.policy(), Policy::Single | Policy::Many) && !self.has(ENABLING)
    }
}

/// What a producer must do after publishing an event.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Wake {
    /// Schedule this many dispatch runs.
    pub runs: u64,
    /// Wake the armed waiter.
    pub waiter: bool,
    /// Wake the armed async stream.
    pub stream: bool,
    /// Trigger the CNO.
    pub cno: bool,
}

impl Wake {
    pub(crate) fn any(self) -> bool {
        self.runs > 0 || self.waiter || self.stream || self.cno
    }
}

/// How many new runs an EVD in state `s` with `count` queued events needs so
/// that they are delivered, and the state with those runs recorded. Used by
/// producers (on arrival), by runs that exit, and by re-enables.
pub(crate) fn schedule_runs(s: State, count: usize, max_runs: u64) -> (State, u64) {
    let count = count as u64;
    if count == 0 || s.has(FREED) || s.has(ENABLING) {
        return (s, 0);
    }
    match s.policy() {
        Policy::Single if s.runs() == 0 => (s.with_runs(1), 1),
        Policy::Many => {
            // Runs inside their delivery loop pop on their own; the others
            // (scheduled, not yet started) will each take at least one.
            let starting = s.runs() - s.inup().min(s.runs());
            let room = max_runs.min(MAX_RUNS).saturating_sub(s.runs());
            let new = (count.saturating_sub(starting)).min(room);
            (s.with_runs(s.runs() + new), new)
        }
        Policy::Notify if s.has(NOTIFY_ARMED) => {
            if s.runs() == 0 {
                (s.clear(NOTIFY_ARMED).with_runs(1), 1)
            } else {
                // A run is in (or just past) its notify upcall and will not
                // look at NOTIFY_ARMED again: it must notify once more.
                (s.clear(NOTIFY_ARMED).set(NOTIFY_DUE), 0)
            }
        }
        _ => (s, 0),
    }
}

/// True if a producer that just published into state `s` may have someone
/// to tell: upcalls on, an armed waiter or stream, or a CNO. When false, the
/// push alone was the whole publish.
#[inline]
pub(crate) fn needs_attention(s: State) -> bool {
    // The common case first: no policy, nothing armed.
    if s.0 & (POLICY_MASK | WAIT_ARMED | STREAM_ARMED | CNO_ENABLED | ENABLING) == 0 {
        return false;
    }
    s.delivers()
        || (s.policy() == Policy::Notify && s.has(NOTIFY_ARMED))
        || s.0 & (WAIT_ARMED | STREAM_ARMED | CNO_ENABLED | ENABLING) != 0
}

/// A producer published; `count` is the storage depth it read after its
/// fence (at least 1 unless a consumer already took the event).
pub(crate) fn publish(s: State, count: usize, max_runs: u64) -> (State, Wake) {
    // While `ENABLING`, the runs this arrival may need are decided when the
    // re-enable ends.
    let (mut s, runs) = schedule_runs(s, count, max_runs);
    let mut wake = Wake {
        runs,
        ..Wake::default()
    };
    if s.has(WAIT_ARMED) && count >= s.threshold() {
        s = s.clear(WAIT_ARMED);
        wake.waiter = true;
    }
    if s.has(STREAM_ARMED) {
        s = s.clear(STREAM_ARMED);
        wake.stream = true;
    }
    // A blocked waiter owns the EVD: the CNO is not triggered (uDAT 1.2).
    wake.cno = s.has(CNO_ENABLED) && !s.has(WAITER) && !s.has(FREED);
    (s, wake)
}

/// Outcome of one step of a dispatch run.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum RunStep {
    /// The run holds an upcall slot (`inup`) and may pop and deliver events
    /// while the policy keeps delivering.
    Deliver,
    /// Notify-only: call the upcall once with no event.
    Notify,
    /// The run ends. `wake_teardown`: no upcall of this EVD is running any
    /// more and a `Teardown` caller waits for exactly that.
    Exit { wake_teardown: bool },
}

/// One step of a dispatch run. `in_upcall`: this run gives back its upcall
/// slot in the same step. `nonempty`: the storage held an event when the
/// run last looked. `first`: the run has not done anything yet (a
/// notify-only run fires only then).
pub(crate) fn run_step(s: State, in_upcall: bool, nonempty: bool, first: bool) -> (State, RunStep) {
    let mut s = s;
    if in_upcall {
        s = s.with_inup(s.inup() - 1);
    }
    let live = !s.has(FREED);
    if live && s.delivers() && nonempty {
        return (s.with_inup(s.inup() + 1), RunStep::Deliver);
    }
    if live && s.policy() == Policy::Notify && (first || s.has(NOTIFY_DUE)) {
        return (s.clear(NOTIFY_DUE).with_inup(s.inup() + 1), RunStep::Notify);
    }
    let s = s.with_runs(s.runs() - 1);
    let wake_teardown = s.inup() == 0 && s.has(TD_WAITING);
    (s, RunStep::Exit { wake_teardown })
}

/// Re-enable semantics of `modify_upcall` (see the crate docs).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ReEnable {
    /// Refuse with `Busy(pending)` while events are queued; the policy stays
    /// as it was (the kDAPL 2005 patch).
    Strict,
    /// Enable, and deliver what is already queued by upcall (DAT 2.0
    /// `DAT_UPCALL_INVOC_ANY`).
    OnAny,
    /// Enable for new arrivals only and report the pending count (DAT 2.0
    /// `DAT_UPCALL_INVOC_NEW`, Linux `IB_CQ_REPORT_MISSED_EVENTS`).
    OnNew,
}

/// The enabling part of `modify_upcall`: policy `p` is one of `Single`,
/// `Many`, `Notify`. With `enabling` the policy is recorded but held back by
/// `ENABLING` (a `Strict` re-enable checks the queue next); otherwise it
/// takes effect now.
pub(crate) fn enable(s: State, p: Policy, enabling: bool) -> State {
    let n = s
        .with_policy(p)
        .clear(TD_WAITING | NOTIFY_DUE | NOTIFY_ARMED);
    if enabling {
        n.set(ENABLING)
    } else if p == Policy::Notify {
        n.set(NOTIFY_ARMED)
    } else {
        n
    }
}

/// Ends a `Strict` re-enable that found the queue empty: the policy set by
/// [`enable`] takes effect.
pub(crate) fn finish_enabling(s: State) -> State {
    let n = s.clear(ENABLING);
    if n.policy() == Policy::Notify {
        n.set(NOTIFY_ARMED)
    } else {
        n
    }
}

/// Ends a `Strict` re-enable that found events queued: the policy (and a
/// notify-only arm) of `prev`, the state before [`enable`], come back.
pub(crate) fn abort_enabling(s: State, prev: State) -> State {
    let n = s.clear(ENABLING | NOTIFY_ARMED).with_policy(prev.policy());
    let n = if prev.has(NOTIFY_ARMED) {
        n.set(NOTIFY_ARMED)
    } else {
        n
    };
    if prev.has(TD_WAITING) {
        n.set(TD_WAITING)
    } else {
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st() -> State {
        State(0)
    }

    #[test]
    fn fields_round_trip() {
        let s = st()
            .with_threshold(MAX_QLEN)
            .with_policy(Policy::Teardown)
            .with_runs(15)
            .with_inup(9)
            .set(WAITER | FREED);
        assert_eq!(s.threshold(), MAX_QLEN);
        assert_eq!(s.policy(), Policy::Teardown);
        assert_eq!(s.runs(), 15);
        assert_eq!(s.inup(), 9);
        assert!(s.has(WAITER) && s.has(FREED) && !s.has(WAIT_ARMED));
        assert_eq!(s.with_threshold(0).threshold(), 0);
        assert_eq!(s.with_threshold(0).runs(), 15);
    }

    #[test]
    fn publish_schedules_single_once() {
        let s = st().with_policy(Policy::Single);
        let (s, w) = publish(s, 1, 4);
        assert_eq!(w.runs, 1);
        assert_eq!(s.runs(), 1);
        let (s, w) = publish(s, 2, 4);
        assert_eq!(w.runs, 0, "a running single-instance run picks it up");
        assert_eq!(s.runs(), 1);
    }

    #[test]
    fn publish_into_empty_schedules_nothing() {
        // A consumer took the event before the producer looked.
        let (s, w) = publish(st().with_policy(Policy::Single), 0, 4);
        assert!(!w.any());
        assert_eq!(s.runs(), 0);
    }

    #[test]
    fn attention_only_when_someone_listens() {
        assert!(!needs_attention(st()));
        assert!(!needs_attention(st().with_policy(Policy::Teardown)));
        assert!(!needs_attention(st().with_policy(Policy::Notify)));
        assert!(needs_attention(
            st().with_policy(Policy::Notify).set(NOTIFY_ARMED)
        ));
        assert!(needs_attention(st().with_policy(Policy::Single)));
        assert!(needs_attention(st().with_policy(Policy::Many)));
        assert!(needs_attention(
            st().with_policy(Policy::Single).set(ENABLING)
        ));
        assert!(needs_attention(st().set(WAIT_ARMED)));
        assert!(needs_attention(st().set(STREAM_ARMED)));
        assert!(needs_attention(st().set(CNO_ENABLED)));
        assert!(!needs_attention(st().set(WAITER | UNWAITABLE)));
    }

    #[test]
    fn publish_disabled_schedules_nothing() {
        let (s, w) = publish(st(), 1, 4);
        assert!(!w.any());
        assert_eq!(s, st());
    }

    #[test]
    fn many_scales_runs_with_queue() {
        let s = st().with_policy(Policy::Many);
        let (s, w) = publish(s, 1, 3);
        assert_eq!(w.runs, 1);
        let (s, w) = publish(s, 6, 3);
        assert_eq!(w.runs, 2);
        assert_eq!(s.runs(), 3);
        let (_, w) = publish(s, 7, 3);
        assert_eq!(w.runs, 0);
    }

    #[test]
    fn notify_is_one_shot() {
        let s = st().with_policy(Policy::Notify).set(NOTIFY_ARMED);
        let (s, w) = publish(s, 1, 4);
        assert_eq!(w.runs, 1);
        assert!(!s.has(NOTIFY_ARMED));
        let (s, step) = run_step(s, false, true, true);
        assert_eq!(step, RunStep::Notify);
        let (s, step) = run_step(s, true, true, false);
        assert_eq!(
            step,
            RunStep::Exit {
                wake_teardown: false
            }
        );
        let (_, w) = publish(s, 2, 4);
        assert_eq!(w.runs, 0, "not re-armed");
    }

    #[test]
    fn notify_due_when_rearmed_during_run() {
        let s = st().with_policy(Policy::Notify).with_runs(1).with_inup(1);
        let s = enable(s, Policy::Notify, false);
        let (s, w) = publish(s, 1, 4);
        assert_eq!(w.runs, 0);
        assert!(s.has(NOTIFY_DUE));
        let (_, step) = run_step(s, true, true, false);
        assert_eq!(step, RunStep::Notify);
    }

    #[test]
    fn waiter_threshold() {
        let s = st().set(WAITER | WAIT_ARMED).with_threshold(3);
        let (s, w) = publish(s, 1, 4);
        assert!(!w.waiter);
        let (s, w) = publish(s, 2, 4);
        assert!(!w.waiter);
        let (s, w) = publish(s, 3, 4);
        assert!(w.waiter);
        assert!(!s.has(WAIT_ARMED));
    }

    #[test]
    fn cno_not_triggered_while_waiter_owns() {
        let s = st().set(CNO_ENABLED);
        assert!(publish(s, 1, 1).1.cno);
        assert!(!publish(s.set(WAITER), 1, 1).1.cno);
        assert!(!publish(st(), 1, 1).1.cno);
    }

    #[test]
    fn run_delivers_then_exits() {
        let s = st().with_policy(Policy::Single).with_runs(1);
        let (s, step) = run_step(s, false, true, true);
        assert_eq!(step, RunStep::Deliver);
        assert_eq!(s.inup(), 1);
        let (s, step) = run_step(s, true, false, false);
        assert_eq!(
            step,
            RunStep::Exit {
                wake_teardown: false
            }
        );
        assert_eq!(s.runs(), 0);
        assert_eq!(s.inup(), 0);
    }

    #[test]
    fn run_does_not_deliver_while_enabling() {
        let s = st().with_policy(Policy::Single).with_runs(1).set(ENABLING);
        let (s, step) = run_step(s, false, true, true);
        assert!(matches!(step, RunStep::Exit { .. }));
        assert_eq!(schedule_runs(s, 5, 4).1, 0);
    }

    #[test]
    fn teardown_quiesces_on_last_upcall() {
        let s = st()
            .with_policy(Policy::Teardown)
            .set(TD_WAITING)
            .with_runs(2)
            .with_inup(2);
        let (s, step) = run_step(s, true, true, false);
        assert_eq!(
            step,
            RunStep::Exit {
                wake_teardown: false
            },
            "another upcall still runs"
        );
        let (s, step) = run_step(s, true, true, false);
        assert_eq!(
            step,
            RunStep::Exit {
                wake_teardown: true
            }
        );
        let n = enable(s, Policy::Single, false);
        assert!(!n.has(TD_WAITING), "re-enabling ends the teardown wait");
    }

    #[test]
    fn strict_enabling_holds_runs_back_then_finishes_or_aborts() {
        let prev = st().with_policy(Policy::Notify).set(NOTIFY_ARMED);
        let e = enable(prev, Policy::Single, true);
        assert!(e.has(ENABLING) && !e.delivers());
        assert_eq!(schedule_runs(e, 3, 1).1, 0);
        let (e, w) = publish(e, 1, 1);
        assert_eq!(w.runs, 0, "the re-enable schedules runs when it ends");
        let f = finish_enabling(e);
        assert!(f.delivers() && !f.has(ENABLING));
        assert_eq!(schedule_runs(f, 1, 1).1, 1);
        let a = abort_enabling(e, prev);
        assert_eq!(a.policy(), Policy::Notify);
        assert!(a.has(NOTIFY_ARMED) && !a.has(ENABLING));
        let n = finish_enabling(enable(st(), Policy::Notify, true));
        assert!(n.has(NOTIFY_ARMED));
    }
}
