//! Benchmark 4 (issue 4, part 4): the loopback provider — **not measured
//! yet**.
//!
//! Part 4 of the benchmark issue compares a full DTO round trip through
//! rdapl's loopback provider (post a send/receive pair on two connected
//! endpoints, completion through the EVD) against a peer transport measured
//! in the same run. The suite was written before the loopback provider
//! existed, so this module measures nothing yet: the suite reports the part
//! as pending (in `results.md` and in the `pending` array of
//! `results.json`) instead of printing numbers that would look like a
//! measurement.
//!
//! To add it: write the benchmark here (`pub fn run(..) -> Output`, rows
//! with ids `loopback/...`, a ratio against a peer run in the same
//! process), call it from `main.rs`, add its plot and targets, expect its
//! rows in `tests/smoke.rs`, and remove the pending entry.

use serde::{Deserialize, Serialize};

/// A part of the suite that is known and deliberately not run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    /// Row id prefix the part will use.
    pub id: String,
    /// Why it is not measured.
    pub status: String,
}

/// The pending entry for part 4.
pub fn pending() -> Pending {
    Pending {
        id: "loopback".into(),
        status: "not measured: issue 4 part 4 (DTO round trips through the loopback provider) \
                 is not implemented in this suite yet; no stand-in numbers are reported"
            .into(),
    }
}
