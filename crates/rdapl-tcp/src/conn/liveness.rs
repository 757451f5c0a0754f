//! The watchdog of a silent peer: a connection whose peer answers nothing
//! for the IA's `timeout_ms` while the kernel asks it breaks then, not
//! when the kernel's own timers come round to it.
//!
//! `TCP_USER_TIMEOUT` and keepalive (set in `cm.rs`) find a dead peer,
//! but on the kernel's schedule: a window probe's timer counts from the
//! first probe of the episode, so a side that was probing a closed window
//! at a link cut broke up to 1.25 s after the timeout, and an idle side's
//! keepalive half a second after it. So the connection looks at the
//! kernel's state itself (`sockinfo`), when the peer's silence would
//! reach the bound:
//!
//! * The peer is **silent** when nothing came from it (no acknowledgement,
//!   no data) for the bound **and** the kernel is asking it: a retransmission, a window probe or a keepalive probe is
//!   unanswered. Silence alone is no evidence: an idle peer that nobody
//!   asked owes nothing.
//! * The bound is `timeout_ms` while bytes wait for the peer. With none,
//!   keepalive asks (every `keepalive_ms`) and a live peer answers within
//!   a round trip, so the bound is at least one and a half keepalive
//!   periods: a timeout shorter than keepalive's whole second does not
//!   break an idle peer that answers every probe.
//! * A live peer answers a retransmission or a probe within a round trip
//!   and a keepalive within its period, so a peer found silent is one
//!   the kernel breaks too, only later (it gives up `timeout_ms` after
//!   the oldest unacknowledged send, on a closed window `timeout_ms`
//!   after its first probe, answered or not).
//! * The look costs one system call; it comes again when the silence
//!   would reach the bound, so about once per `timeout_ms` on a busy
//!   connection and per half of it on an idle one.

use crate::sockinfo::TcpSnapshot;

/// What a look at the kernel's state found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The peer fell silent: the connection breaks.
    Silent,
    /// Look again in this many milliseconds.
    Again(u64),
}

/// Judges a snapshot against the IA's timeout and the keepalive period
/// set on the socket (ms).
pub(crate) fn judge(s: &TcpSnapshot, timeout_ms: u64, keepalive_ms: u64) -> Verdict {
    let waiting = s.unacked > 0 || s.notsent > 0;
    let asking = s.probes > 0 || s.retransmits > 0;
    let bound = if waiting {
        timeout_ms
    } else {
        timeout_ms.max(keepalive_ms.saturating_mul(3) / 2)
    };
    let silent = u64::from(s.silent_ms);
    if silent < bound {
        Verdict::Again(bound - silent)
    } else if asking {
        Verdict::Silent
    } else {
        // Silent that long, but nothing asked yet (the kernel's next
        // retransmission or probe is due): soon again.
        Verdict::Again((bound / 8).clamp(10, 250))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 2_000;
    const KA: u64 = 1_000;

    fn snap(unacked: u32, notsent: u32, probes: u8, retransmits: u8, since: u32) -> TcpSnapshot {
        TcpSnapshot {
            unacked,
            notsent,
            probes,
            retransmits,
            silent_ms: since,
        }
    }

    #[test]
    fn a_busy_peer_is_looked_at_once_a_timeout() {
        assert_eq!(judge(&snap(10, 0, 0, 0, 0), T, KA), Verdict::Again(T));
        assert_eq!(
            judge(&snap(10, 0, 0, 0, 300), T, KA),
            Verdict::Again(T - 300)
        );
    }

    #[test]
    fn unanswered_retransmissions_or_window_probes_break_at_the_timeout() {
        // Retransmitting.
        assert_eq!(judge(&snap(4, 0, 0, 3, 1_999), T, KA), Verdict::Again(1));
        assert_eq!(judge(&snap(4, 0, 0, 3, 2_000), T, KA), Verdict::Silent);
        // Probing a closed window: nothing in flight, bytes unsent.
        assert_eq!(judge(&snap(0, 70_000, 2, 0, 2_400), T, KA), Verdict::Silent);
    }

    #[test]
    fn silence_without_a_question_is_no_evidence() {
        // Data waits, the kernel has not retransmitted yet: soon again.
        assert_eq!(judge(&snap(1, 0, 0, 0, 5_000), T, KA), Verdict::Again(250));
        // Idle and nothing asked (keepalive's probe not sent yet).
        assert_eq!(judge(&snap(0, 0, 0, 0, 9_000), T, KA), Verdict::Again(250));
        // A small timeout: the step never falls under 10 ms.
        assert_eq!(judge(&snap(1, 0, 0, 0, 500), 40, KA), Verdict::Again(10));
    }

    #[test]
    fn an_idle_peer_is_bounded_by_keepalive_as_well() {
        // Keepalive asked and nothing came for the timeout: silent.
        assert_eq!(judge(&snap(0, 0, 1, 0, 2_000), T, KA), Verdict::Silent);
        // A timeout under keepalive's period: an idle peer answering every
        // probe is silent up to a period between answers, and its probe is
        // out for a round trip; one and a half periods are needed.
        assert_eq!(
            judge(&snap(0, 0, 1, 0, 1_000), 100, KA),
            Verdict::Again(500)
        );
        assert_eq!(judge(&snap(0, 0, 1, 0, 1_500), 100, KA), Verdict::Silent);
        // The same timeout while data waits: the timeout itself.
        assert_eq!(judge(&snap(2, 0, 0, 1, 100), 100, KA), Verdict::Silent);
    }
}
