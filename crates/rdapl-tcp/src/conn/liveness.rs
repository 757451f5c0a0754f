//! The watchdog of a silent peer: a connection whose peer answers nothing
//! for the IA's `timeout_ms` while it is asked breaks then, not when the
//! kernel's own timers come round to it.
//!
//! `TCP_USER_TIMEOUT` and keepalive (set in `cm.rs`) find a dead peer,
//! but on the kernel's schedule: a window probe's timer counts from the
//! first probe of the episode, so a side that was probing a closed window
//! at a link cut broke up to 1.25 s after the timeout, and an idle side's
//! keepalive (whole seconds at least) could not keep a timeout under
//! two seconds. So the connection looks at the kernel's state itself
//! (`sockinfo`), when the peer's silence would reach the bound, and asks
//! an idle peer itself:
//!
//! * The peer is **silent** when nothing came from it (no acknowledgement,
//!   no data) for `timeout_ms` **and** it was asked: a retransmission, a
//!   window probe or a keepalive probe is unanswered, or bytes of ours
//!   went out half a timeout ago and are still unacknowledged. Silence
//!   alone is no evidence: an idle peer that nobody asked owes nothing.
//! * An **idle** connection (nothing waits for the peer) whose peer was
//!   silent for half the timeout is asked with a **heartbeat**, a
//!   zero-length RDMA Read ([`Verdict::Ask`]): a live peer's kernel
//!   acknowledges it within a round trip and its provider answers it, a
//!   dead one leaves it unacknowledged, and the look at the full timeout
//!   finds that. So an idle connection breaks within `timeout_ms` too.
//! * Where the connection may not ask (a read of the consumer's or a
//!   heartbeat outstanding, requests not yet complete, an ORD of 0), only
//!   keepalive asks an idle peer, every `keepalive_ms`, and a live peer
//!   answers within a round trip: the bound is then at least one and a
//!   half keepalive periods. (An outstanding read has a bound of its own:
//!   its answer is overdue `timeout_ms` after the last byte, `conn/mod.rs`.)
//! * A live peer acknowledges bytes within a round trip (and a delayed
//!   acknowledgement, 200 ms at most), so below 400 ms a timeout asks a
//!   peer to answer within half of it.
//! * A look costs one system call, about once per half timeout; a
//!   heartbeat goes out only after half a timeout of the peer's silence.

use crate::sockinfo::TcpSnapshot;

/// What a look at the kernel's state found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The peer fell silent: the connection breaks.
    Silent,
    /// Look again in this many milliseconds.
    Again(u64),
    /// Send the peer a heartbeat now, and look again in this many
    /// milliseconds.
    Ask(u64),
}

/// Judges a snapshot against the IA's timeout and the keepalive period
/// set on the socket (ms); `can_ask`: the connection may send a
/// heartbeat; `asked_ms`: how long ago the one it sent went out, if it
/// is not answered yet (see the module docs).
pub(crate) fn judge(
    s: &TcpSnapshot,
    timeout_ms: u64,
    keepalive_ms: u64,
    can_ask: bool,
    asked_ms: Option<u64>,
) -> Verdict {
    let half = (timeout_ms / 2).max(1);
    let waiting = s.unacked > 0 || s.notsent > 0;
    // Bytes of ours the peer did not acknowledge within half a timeout: a
    // heartbeat, or data last sent (or sent again) that long ago.
    let asked_by_us =
        s.unacked > 0 && (u64::from(s.sent_ms) >= half || asked_ms.is_some_and(|a| a >= half));
    let asking = s.probes > 0 || s.retransmits > 0 || asked_by_us;
    let heartbeat = can_ask && !waiting;
    let bound = if waiting || can_ask {
        timeout_ms
    } else {
        timeout_ms.max(keepalive_ms.saturating_mul(3) / 2)
    };
    let silent = u64::from(s.silent_ms);
    if silent >= bound && asking {
        Verdict::Silent
    } else if heartbeat && silent >= half {
        // Asked now, the peer's answer is due within half a timeout.
        Verdict::Ask(bound.saturating_sub(silent).max(half))
    } else if silent < half {
        // Half a timeout of silence is when an idle peer is asked; a busy
        // connection that turns idle heard from its peer (the
        // acknowledgement of what waited), so its silence began again.
        Verdict::Again(half - silent)
    } else if silent < bound {
        Verdict::Again(bound - silent)
    } else {
        // Silent that long, but nothing asked yet (the kernel's next
        // retransmission or probe is due): soon again.
        Verdict::Again((bound / 8).clamp(10, 250))
    }
}

/// Whether bytes of ours are still leaving for the peer, by the kernel's
/// state, and if so how long ago (ms) the last of them went out: an
/// answer (to a read or fence) comes behind them, so it is overdue only
/// a timeout after that.
///
/// * Some in flight and the peer acknowledging within the timeout: they
///   are leaving now.
/// * Nothing in flight, and data of ours gone out within the timeout
///   (with nothing in flight, no retransmission: new data): the answer
///   is due a timeout after that. Behind a peer that takes bytes slowly,
///   the window closes between two of its reads with everything sent
///   acknowledged and the rest waiting, which a look could take for a
///   stopped peer; and the last bytes may have left only just before
///   the look.
/// * A stopped peer whose buffer filled opens its window no more (probes
///   carry no new data): its last byte went out a timeout ago and more,
///   and it does not pass for one still taking bytes.
pub(crate) fn still_sending(s: &TcpSnapshot, timeout_ms: u64) -> Option<u64> {
    let flowing = s.unacked > 0 && u64::from(s.silent_ms) < timeout_ms;
    let trickling = s.unacked == 0 && u64::from(s.sent_ms) < timeout_ms;
    if flowing {
        Some(0)
    } else if trickling {
        Some(u64::from(s.sent_ms))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 2_000;
    const KA: u64 = 1_000;

    /// A snapshot; `sent`: ms since our last data went out.
    fn snap(unacked: u32, notsent: u32, probes: u8, retransmits: u8, since: u32) -> TcpSnapshot {
        TcpSnapshot {
            unacked,
            notsent,
            probes,
            retransmits,
            silent_ms: since,
            sent_ms: 0,
        }
    }

    fn sent(mut s: TcpSnapshot, ms: u32) -> TcpSnapshot {
        s.sent_ms = ms;
        s
    }

    #[test]
    fn a_busy_peer_is_looked_at_at_half_and_at_the_whole_timeout() {
        for ask in [false, true] {
            assert_eq!(
                judge(&snap(10, 0, 0, 0, 0), T, KA, ask, None),
                Verdict::Again(T / 2)
            );
            assert_eq!(
                judge(&snap(10, 0, 0, 0, 300), T, KA, ask, None),
                Verdict::Again(T / 2 - 300)
            );
            assert_eq!(
                judge(&snap(10, 0, 0, 0, 1_200), T, KA, ask, None),
                Verdict::Again(T - 1_200)
            );
        }
    }

    #[test]
    fn unanswered_retransmissions_or_window_probes_break_at_the_timeout() {
        for ask in [false, true] {
            // Retransmitting.
            assert_eq!(
                judge(&snap(4, 0, 0, 3, 1_999), T, KA, ask, None),
                Verdict::Again(1)
            );
            assert_eq!(
                judge(&snap(4, 0, 0, 3, 2_000), T, KA, ask, None),
                Verdict::Silent
            );
            // Probing a closed window: nothing in flight, bytes unsent.
            assert_eq!(
                judge(&snap(0, 70_000, 2, 0, 2_400), T, KA, ask, None),
                Verdict::Silent
            );
        }
    }

    #[test]
    fn bytes_of_ours_unacknowledged_for_half_a_timeout_are_a_question() {
        // Sent 1.2 s ago, nothing back for 2 s: the kernel has not
        // retransmitted yet, but the peer had a whole half timeout.
        let s = sent(snap(1, 0, 0, 0, 2_000), 1_200);
        assert_eq!(judge(&s, T, KA, false, None), Verdict::Silent);
        // Sent only 100 ms ago: not yet.
        let s = sent(snap(1, 0, 0, 0, 2_000), 100);
        assert_eq!(judge(&s, T, KA, false, None), Verdict::Again(250));
    }

    #[test]
    fn silence_without_a_question_is_no_evidence() {
        // Data waits, the kernel has not retransmitted yet: soon again.
        assert_eq!(
            judge(&snap(1, 0, 0, 0, 5_000), T, KA, false, None),
            Verdict::Again(250)
        );
        // Idle and nothing asked (keepalive's probe not sent yet), and the
        // connection may not ask.
        assert_eq!(
            judge(&snap(0, 0, 0, 0, 9_000), T, KA, false, None),
            Verdict::Again(250)
        );
        // A small timeout: the step never falls under 10 ms.
        assert_eq!(
            judge(&snap(1, 0, 0, 0, 500), 40, KA, false, None),
            Verdict::Again(10)
        );
    }

    #[test]
    fn an_idle_peer_that_cannot_be_asked_is_bounded_by_keepalive() {
        // Keepalive asked and nothing came for the timeout: silent.
        assert_eq!(
            judge(&snap(0, 0, 1, 0, 2_000), T, KA, false, None),
            Verdict::Silent
        );
        // A timeout under keepalive's period: an idle peer answering every
        // probe is silent up to a period between answers, and its probe is
        // out for a round trip; one and a half periods are needed.
        assert_eq!(
            judge(&snap(0, 0, 1, 0, 1_000), 100, KA, false, None),
            Verdict::Again(500)
        );
        assert_eq!(
            judge(&snap(0, 0, 1, 0, 1_500), 100, KA, false, None),
            Verdict::Silent
        );
        // The same timeout while data waits: the timeout itself.
        assert_eq!(
            judge(&snap(2, 0, 0, 1, 100), 100, KA, false, None),
            Verdict::Silent
        );
    }

    #[test]
    fn bytes_in_flight_and_acknowledged_are_still_leaving() {
        // A slow path draining a large message: in flight, acknowledged
        // 30 ms ago.
        assert_eq!(still_sending(&snap(40, 900_000, 0, 0, 30), T), Some(0));
        // A closed window, the probes answered, the last data gone out
        // 1,500 ms ago: a peer taking bytes slowly (its window opened
        // then), the answer not due before 500 ms more.
        let slow = sent(snap(0, 900_000, 1, 0, 30), 1_500);
        assert_eq!(still_sending(&slow, T), Some(1_500));
        // The same a timeout after the last data went out: a stopped
        // peer whose buffer filled.
        assert_eq!(still_sending(&sent(slow, 2_000), T), None);
        // All delivered, the last byte 300 ms ago: the answer is due in
        // 1,700 ms; a timeout after it, overdue.
        let delivered = sent(snap(0, 0, 0, 0, 30), 300);
        assert_eq!(still_sending(&delivered, T), Some(300));
        assert_eq!(still_sending(&sent(delivered, 2_000), T), None);
        // In flight, nothing acknowledged for the timeout: not leaving,
        // though retransmissions went out just now.
        assert_eq!(still_sending(&snap(40, 0, 0, 2, 2_000), T), None);
        assert_eq!(still_sending(&snap(40, 9_000, 0, 2, 2_000), T), None);
    }

    proptest::proptest! {
        /// Whatever the snapshot: a peer is silent only after the timeout
        /// and only if it was asked; a heartbeat is asked for only where
        /// the connection may ask and nothing waits; every look comes
        /// again after a while, and none later than the bound.
        #[test]
        fn the_rule_never_breaks_early_or_unasked(
            unacked in 0u32..3,
            notsent in 0u32..3,
            probes in 0u8..3,
            retransmits in 0u8..3,
            silent_ms in 0u32..20_000,
            sent_ms in 0u32..20_000,
            timeout_ms in 100u64..10_000,
            can_ask: bool,
            asked_ms in proptest::option::of(0u64..20_000),
        ) {
            let s = TcpSnapshot { unacked, notsent, probes, retransmits, silent_ms, sent_ms };
            let keepalive = crate::cm::keepalive_ms(timeout_ms);
            let bound = timeout_ms.max(keepalive * 3 / 2);
            match judge(&s, timeout_ms, keepalive, can_ask, asked_ms) {
                Verdict::Silent => {
                    proptest::prop_assert!(u64::from(silent_ms) >= timeout_ms);
                    let ours = unacked > 0
                        && (u64::from(sent_ms) >= timeout_ms / 2
                            || asked_ms.is_some_and(|a| a >= timeout_ms / 2));
                    proptest::prop_assert!(probes > 0 || retransmits > 0 || ours);
                }
                Verdict::Ask(ms) => {
                    proptest::prop_assert!(can_ask && unacked == 0 && notsent == 0);
                    proptest::prop_assert!(u64::from(silent_ms) >= timeout_ms / 2);
                    proptest::prop_assert!(ms >= timeout_ms / 2 && ms <= timeout_ms);
                }
                Verdict::Again(ms) => {
                    proptest::prop_assert!(ms >= 1 && ms <= bound);
                }
            }
        }
    }

    #[test]
    fn an_idle_peer_is_asked_at_half_the_timeout_and_broken_at_the_timeout() {
        const S: u64 = 500;
        // Heard from just now: look again at half the timeout.
        assert_eq!(
            judge(&snap(0, 0, 0, 0, 0), S, KA, true, None),
            Verdict::Again(250)
        );
        assert_eq!(
            judge(&snap(0, 0, 0, 0, 100), S, KA, true, None),
            Verdict::Again(150)
        );
        // Half a timeout of silence: ask, and look when the answer is due.
        assert_eq!(
            judge(&snap(0, 0, 0, 0, 250), S, KA, true, None),
            Verdict::Ask(250)
        );
        // A late look still leaves the peer half a timeout to answer.
        assert_eq!(
            judge(&snap(0, 0, 0, 0, 480), S, KA, true, None),
            Verdict::Ask(250)
        );
        // The heartbeat unacknowledged since it went out (the connection
        // may not ask again while it is): silent at the timeout, not
        // keepalive's one and a half seconds.
        let s = sent(snap(1, 0, 0, 0, 500), 250);
        assert_eq!(judge(&s, S, KA, false, Some(250)), Verdict::Silent);
        // Sent again by the kernel's tail loss probe 10 ms later, before
        // any retransmission it counts: the heartbeat's own age decides.
        let s = sent(snap(1, 0, 0, 0, 500), 240);
        assert_eq!(judge(&s, S, KA, false, Some(250)), Verdict::Silent);
        assert_eq!(judge(&s, S, KA, false, None), Verdict::Again(62));
        // Acknowledged but not answered yet: the peer is heard from (its
        // provider's answer has a timer of its own).
        let s = sent(snap(0, 0, 0, 0, 20), 250);
        assert_eq!(judge(&s, S, KA, false, Some(250)), Verdict::Again(230));
        // A live peer acknowledged it: its silence began again.
        assert_eq!(
            judge(&snap(0, 0, 0, 0, 3), S, KA, true, None),
            Verdict::Again(247)
        );
        // Not while something waits for the peer: that asks already.
        assert_eq!(
            judge(&snap(3, 0, 0, 0, 300), S, KA, true, None),
            Verdict::Again(200)
        );
        assert_eq!(
            judge(&snap(0, 9, 0, 0, 300), S, KA, true, None),
            Verdict::Again(200)
        );
    }
}
