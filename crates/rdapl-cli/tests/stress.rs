//! The `evd-stress` harness in every mode, its checker, and the `rdapl`
//! binary.
//!
//! Sizes are chosen so the whole file takes a few seconds in a debug build on
//! a two-core machine; `rdapl evd-stress` runs the millions-of-events version.

use rdapl::Event;
use rdapl_cli::stress::{
    self, Checker, Fault, Mode, ModeReport, OrderScope, StreamKind, StressConfig,
};
use std::process::Command;
use std::time::Duration;

/// Events per mode in these tests.
const EVENTS: u64 = 200_000;

fn config() -> StressConfig {
    StressConfig {
        producers: 4,
        events: EVENTS,
        qlen: 128,
        evds: 2,
        switch_every: 5,
        max_time: Duration::from_secs(40),
        seed: 0x7e57,
        fault: None,
    }
}

fn describe(r: &ModeReport) -> String {
    format!("{}{:#?}", stress::format_table(std::slice::from_ref(r)), r)
}

fn assert_clean(r: &ModeReport) {
    assert!(!r.hang, "hang:\n{}", describe(r));
    assert_eq!(
        r.produced,
        r.expected,
        "producers fell short:\n{}",
        describe(r)
    );
    assert_eq!(
        r.tally.seen,
        r.expected,
        "not every event seen:\n{}",
        describe(r)
    );
    assert_eq!(r.tally.lost, 0, "lost events:\n{}", describe(r));
    assert_eq!(r.tally.duplicated, 0, "duplicated events:\n{}", describe(r));
    assert_eq!(
        r.tally.out_of_order,
        0,
        "out-of-order events:\n{}",
        describe(r)
    );
    assert_eq!(r.tally.invalid, 0, "invalid events:\n{}", describe(r));
    assert_eq!(r.stranded, 0, "events left queued:\n{}", describe(r));
    assert!(r.notes.is_empty(), "errors:\n{}", describe(r));
    assert!(r.passed(), "{}", describe(r));
}

fn run_clean(mode: Mode) -> ModeReport {
    let r = stress::run_mode(mode, &config());
    assert_clean(&r);
    r
}

#[test]
fn strict_mode_is_exact() {
    let r = run_clean(Mode::Strict);
    assert!(r.upcalls > 0 && r.poll_phases > 0, "{}", describe(&r));
}

#[test]
fn on_any_mode_is_exact() {
    let r = run_clean(Mode::OnAny);
    assert!(r.upcalls > 0 && r.poll_phases > 0, "{}", describe(&r));
}

#[test]
fn on_new_mode_is_exact() {
    let r = run_clean(Mode::OnNew);
    assert!(r.upcalls > 0 && r.poll_phases > 0, "{}", describe(&r));
}

#[test]
fn poller_mode_is_exact() {
    let r = run_clean(Mode::Poller);
    assert!(r.upcalls > 0, "{}", describe(&r));
}

#[test]
fn many_mode_is_exact() {
    let r = run_clean(Mode::Many);
    assert!(r.upcalls > 0 && r.poll_phases > 0, "{}", describe(&r));
}

#[test]
fn one_evd_many_producers_switching_every_event() {
    // Everything on one EVD, hand-off after every upcall event: the most
    // switches per event.
    let cfg = StressConfig {
        producers: 6,
        events: 60_000,
        evds: 1,
        qlen: 16,
        switch_every: 1,
        ..config()
    };
    for mode in Mode::ALL {
        assert_clean(&stress::run_mode(mode, &cfg));
    }
}

// ----- the checks can fail -----------------------------------------------

fn faulty(mode: Mode, fault: Fault, max_time: Duration) -> ModeReport {
    let cfg = StressConfig {
        events: 20_000,
        max_time,
        fault: Some(fault),
        ..config()
    };
    stress::run_mode(mode, &cfg)
}

#[test]
fn a_dropped_event_is_reported_lost() {
    let r = faulty(Mode::OnAny, Fault::Drop(1000), Duration::from_secs(30));
    assert!(!r.passed(), "{}", describe(&r));
    assert!(!r.hang, "{}", describe(&r));
    // One forgotten event per EVD.
    assert_eq!(r.tally.lost, 2, "{}", describe(&r));
    assert_eq!(
        r.tally.duplicated + r.tally.out_of_order,
        0,
        "{}",
        describe(&r)
    );
}

#[test]
fn a_duplicated_event_is_reported() {
    let r = faulty(
        Mode::Strict,
        Fault::Duplicate(1000),
        Duration::from_secs(30),
    );
    assert!(!r.passed(), "{}", describe(&r));
    assert_eq!(r.tally.duplicated, 2, "{}", describe(&r));
    assert_eq!(r.tally.lost + r.tally.out_of_order, 0, "{}", describe(&r));
}

#[test]
fn a_delayed_event_is_reported_out_of_order() {
    let r = faulty(Mode::Poller, Fault::Delay(1000), Duration::from_secs(30));
    assert!(!r.passed(), "{}", describe(&r));
    assert_eq!(r.tally.out_of_order, 2, "{}", describe(&r));
    assert_eq!(r.tally.lost + r.tally.duplicated, 0, "{}", describe(&r));
}

#[test]
fn a_delayed_event_is_reported_out_of_order_per_thread() {
    let r = faulty(Mode::Many, Fault::Delay(1000), Duration::from_secs(30));
    assert!(!r.passed(), "{}", describe(&r));
    // Under Many, order is judged per consuming thread: the delayed event is
    // recorded by the thread that sees the next one of its stream, which has
    // moved past it.
    assert_eq!(r.tally.out_of_order, 2, "{}", describe(&r));
}

#[test]
fn a_lost_wakeup_is_reported_as_a_hang() {
    let r = faulty(
        Mode::OnNew,
        Fault::SkipReEnable,
        Duration::from_millis(1500),
    );
    assert!(r.hang, "{}", describe(&r));
    assert!(!r.passed(), "{}", describe(&r));
    assert!(r.stranded > 0, "{}", describe(&r));
    assert!(r.elapsed < Duration::from_secs(5), "{}", describe(&r));
}

#[test]
fn checker_counts_loss_duplicates_and_reordering() {
    let mut c = Checker::new(2, OrderScope::Global);
    // Producer 0 DTO: 0..10 in order except 5 missing and 7 twice.
    for s in (0..10).filter(|s| *s != 5) {
        c.record(&stress::dto_event(0, s));
    }
    c.record(&stress::dto_event(0, 7));
    // Producer 1 software: 0, 2, 1, 3 (1 is late).
    for s in [0, 2, 1, 3] {
        c.record(&Event::Software(stress::software_value(1, s)));
    }
    // An event nobody produced and a foreign event.
    c.record_seq(1, StreamKind::Dto, 0);
    c.record(&Event::evd_overflow(rdapl::EvdHandle(1), 0));
    let t = c.tally(&[[10, 0], [0, 4]]);
    assert_eq!(t.lost, 1);
    assert_eq!(t.duplicated, 1);
    assert_eq!(t.out_of_order, 1);
    assert_eq!(t.invalid, 2);
    assert_eq!(t.seen, 9 + 4);
    assert!(!t.clean());

    // A clean stream, far longer than the window, stays clean and small.
    let mut c = Checker::new(1, OrderScope::Global);
    for s in 0..1_000_000 {
        c.record_seq(0, StreamKind::Dto, s);
    }
    let t = c.tally(&[[1_000_000, 0]]);
    assert!(t.clean(), "{t:?}");
    assert_eq!(t.seen, 1_000_000);
}

#[test]
fn per_thread_order_allows_interleaving_threads_but_not_reordering_within_one() {
    let c = std::sync::Mutex::new(Checker::new(1, OrderScope::PerThread));
    // Another thread takes 0 and 2 while this one takes 1 and 4: fine.
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut c = c.lock().unwrap();
            c.record_seq(0, StreamKind::Dto, 0);
            c.record_seq(0, StreamKind::Dto, 2);
        });
    });
    let mut c = c.into_inner().unwrap();
    c.record_seq(0, StreamKind::Dto, 1);
    c.record_seq(0, StreamKind::Dto, 4);
    c.record_seq(0, StreamKind::Dto, 3); // this thread already saw 4
    let t = c.tally(&[[5, 0]]);
    assert_eq!(t.out_of_order, 1, "{t:?}");
    assert_eq!((t.seen, t.lost, t.duplicated), (5, 0, 0), "{t:?}");
}

// ----- the binary --------------------------------------------------------

fn rdapl(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rdapl"))
        .args(args)
        .output()
        .expect("running the rdapl binary")
}

#[test]
fn binary_runs_every_mode_and_prints_the_table() {
    let out = rdapl(&["evd-stress", "--events", "20000", "--max-seconds", "30"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "exit {:?}\n{stdout}\n{stderr}",
        out.status
    );
    let mut lines = stdout.lines();
    let header = lines.next().unwrap_or_default();
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        stress::COLUMNS,
        "{stdout}"
    );
    for mode in Mode::ALL {
        let row = lines.next().unwrap_or_default();
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells.first(), Some(&mode.name()), "{stdout}");
        assert_eq!(cells[1], "20000", "{stdout}");
        assert_eq!(cells.len(), stress::COLUMNS.len(), "{stdout}");
        let col = |name: &str| cells[stress::COLUMNS.iter().position(|c| *c == name).unwrap()];
        for name in ["lost", "duplicated", "out-of-order"] {
            assert_eq!(col(name), "0", "{name}: {stdout}");
        }
        assert_eq!(col("hang"), "no", "{stdout}");
        // Every column lines up with the header's right edge.
        assert_eq!(row.len(), header.len(), "{stdout}");
    }
}

#[test]
fn binary_reports_a_run_that_outlives_its_limit_as_a_hang_and_fails() {
    // Far more events than 0.3 s allows: the limit is hit, which is a hang.
    let out = rdapl(&[
        "evd-stress",
        "--events",
        "1000000000",
        "--max-seconds",
        "0.3",
        "--modes",
        "on-new",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let row = stdout.lines().nth(1).unwrap_or_default();
    assert!(
        row.starts_with("on-new") && row.ends_with("HANG"),
        "{stdout}"
    );
    assert!(stdout.contains("FAILED"), "{stdout}");
}

#[test]
fn binary_selects_modes_and_rejects_bad_arguments() {
    let out = rdapl(&[
        "evd-stress",
        "--events",
        "5000",
        "--modes",
        "on-new,poller",
        "--producers",
        "5",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let modes: Vec<&str> = stdout
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .filter(|m| Mode::ALL.iter().any(|x| x.name() == *m))
        .collect();
    assert_eq!(modes, ["on-new", "poller"], "{stdout}");

    for bad in [
        &["evd-stress", "--events", "0"][..],
        &["evd-stress", "--modes", "sometimes"],
        &["evd-stress", "--switch-every", "0"],
        &["evd-stress", "--max-seconds", "-1"],
        &["no-such-command"],
    ] {
        let out = rdapl(bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?} was accepted");
    }
}

#[test]
fn help_lists_only_working_commands() {
    let out = rdapl(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    let commands: Vec<String> = help
        .split("Commands:")
        .nth(1)
        .unwrap_or_default()
        .split("Options:")
        .next()
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    assert!(commands.iter().any(|c| c == "evd-stress"), "{help}");
    // No placeholders: every command listed has its own help and options.
    for c in commands.iter().filter(|c| *c != "help") {
        let out = rdapl(&[c, "--help"]);
        assert!(out.status.success(), "rdapl {c} --help failed");
        assert!(!out.stdout.is_empty(), "rdapl {c} --help printed nothing");
    }
    let sub = rdapl(&["evd-stress", "--help"]);
    let sub = String::from_utf8_lossy(&sub.stdout);
    for opt in [
        "--producers",
        "--events",
        "--qlen",
        "--modes",
        "--switch-every",
        "--max-seconds",
    ] {
        assert!(sub.contains(opt), "{opt} missing:\n{sub}");
    }
}
