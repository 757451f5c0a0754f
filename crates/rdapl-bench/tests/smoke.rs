//! Runs `rdapl-bench --smoke` into a temporary directory and checks that it
//! wrote the markdown report, the JSON results and the SVG plots, and that
//! the JSON parses and holds every expected row and target.
//!
//! Part 5 runs the `rdapl` CLI (built by the benchmark through cargo) and
//! the peers `fi_pingpong` and `qperf`; a peer that is not installed leaves
//! its rows pending, which passes unless `RDAPL_REQUIRE_EXTERNAL=1`.

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

fn temp_dir() -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    std::env::temp_dir().join(format!("rdapl-bench-smoke-{}-{nanos}", std::process::id()))
}

fn ids(v: &Value, section: &str) -> Vec<String> {
    v[section]
        .as_array()
        .unwrap_or_else(|| panic!("`{section}` is not an array"))
        .iter()
        .map(|r| {
            r["id"]
                .as_str()
                .unwrap_or_else(|| panic!("a `{section}` row has no id"))
                .to_string()
        })
        .collect()
}

fn expect_all(v: &Value, section: &str, expected: &[String]) {
    let got = ids(v, section);
    for id in expected {
        assert!(
            got.contains(id),
            "`{section}` lacks row `{id}`; rows: {got:?}"
        );
    }
}

#[test]
fn smoke_run_writes_every_output() {
    let dir = temp_dir();
    let out = Command::new(env!("CARGO_BIN_EXE_rdapl-bench"))
        .arg("--smoke")
        .arg("--out")
        .arg(&dir)
        .output()
        .expect("running rdapl-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "rdapl-bench --smoke failed: {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("core(s)"), "the core count is not printed");

    // The three kinds of files.
    let md = std::fs::read_to_string(dir.join("results.md")).expect("results.md");
    assert!(
        md.contains("| config | queue |"),
        "results.md has no throughput table"
    );
    assert!(
        md.contains("## 4. Loopback provider") && md.contains("| size | transfer |"),
        "results.md has no loopback section"
    );
    let json = std::fs::read_to_string(dir.join("results.json")).expect("results.json");
    for svg in [
        "throughput.svg",
        "latency.svg",
        "flow_throughput.svg",
        "flow_latency.svg",
        "loopback_bandwidth.svg",
        "loopback_latency.svg",
        "tcp_latency.svg",
        "tcp_bandwidth.svg",
    ] {
        let body = std::fs::read_to_string(dir.join(svg)).unwrap_or_else(|e| panic!("{svg}: {e}"));
        assert!(body.starts_with("<svg"), "{svg} is not an SVG");
    }

    // The JSON parses and has every row.
    let v: Value = serde_json::from_str(&json).expect("results.json parses");
    assert!(v["meta"]["cores"].as_u64().unwrap_or(0) >= 1);
    assert!(
        v["meta"]["date_utc"]
            .as_str()
            .is_some_and(|d| d.ends_with("UTC"))
    );
    assert_eq!(v["meta"]["smoke"], Value::Bool(true));

    let mut tp = Vec::new();
    for cfg in ["1p-unbatched", "2p-unbatched", "1p-batched", "2p-batched"] {
        for q in [
            "evd-reserve-complete",
            "evd-post-se",
            "crossbeam",
            "std-sync-channel",
            "flume",
        ] {
            tp.push(format!("throughput/{cfg}/{q}"));
        }
    }
    expect_all(&v, "throughput", &tp);
    let lat: Vec<String> = [
        "evd-upcall",
        "evd-wait",
        "evd-poll",
        "crossbeam-blocking",
        "crossbeam-poll",
    ]
    .iter()
    .map(|m| format!("latency/{m}"))
    .collect();
    expect_all(&v, "latency", &lat);
    let mut fl = Vec::new();
    for load in ["low", "medium", "saturating"] {
        for c in ["poller", "pure-upcall", "pure-polling"] {
            fl.push(format!("flow/{load}/{c}"));
        }
    }
    expect_all(&v, "flow", &fl);
    let half: Vec<String> = [
        "rdapl-buf-poll",
        "rdapl-buf-wait",
        "rdapl-poll",
        "rdapl-wait",
        "crossbeam-poll",
        "crossbeam-blocking",
    ]
    .iter()
    .map(|m| format!("loopback/half-rtt/{m}"))
    .collect();
    expect_all(&v, "loopback_half_rtt", &half);
    let serial: Vec<String> = ["rdapl-buf-poll", "rdapl-poll", "crossbeam-poll"]
        .iter()
        .map(|m| format!("loopback/half-rtt-serial/{m}"))
        .collect();
    expect_all(&v, "loopback_serial", &serial);
    let mut bw = Vec::new();
    for size in ["4KiB", "64KiB", "1MiB", "16MiB"] {
        for t in ["rdma-write", "rdma-read", "memcpy-write", "memcpy-read"] {
            bw.push(format!("loopback/bandwidth/{size}/{t}"));
        }
    }
    expect_all(&v, "loopback_bandwidth", &bw);
    let targets: Vec<String> = [
        "target/throughput/1p-unbatched",
        "target/throughput/2p-unbatched",
        "target/throughput/1p-batched",
        "target/throughput/2p-batched",
        "target/latency/evd-wait-median",
        "target/flow/saturating-upcalls-per-event",
        "target/flow/low-load-latency",
        "check/flow/no-lost-events",
        "check/latency/no-stuck-runs",
        "target/loopback/half-rtt-poll-median",
        "target/loopback/half-rtt-wait-median",
        "target/loopback/rdma-write-64KiB",
        "target/loopback/rdma-read-64KiB",
        "target/loopback/rdma-write-1MiB",
        "target/loopback/rdma-read-1MiB",
        "target/loopback/rdma-write-16MiB",
        "target/loopback/rdma-read-16MiB",
        "check/loopback/no-failed-runs",
        "target/tcp/latency-64B",
        "target/tcp/pingpong-bw-64KiB",
        "target/tcp/pingpong-bw-1MiB",
        "target/tcp/stream-bw-64KiB",
        "target/tcp/stream-bw-1MiB",
        "check/tcp/no-failed-runs",
        "check/shared/no-failed-rows",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    expect_all(&v, "targets", &targets);
    // Part 6: a row per count of idle connections, measured.
    expect_all(&v, "shared", &["tcp-shared/10".to_string()]);
    for r in v["shared"].as_array().into_iter().flatten() {
        assert!(r["error"].is_null(), "{}: {}", r["id"], r["error"]);
        assert!(
            r["ratio"]["median"].as_f64().is_some_and(|x| x > 0.0),
            "{}: no ratio",
            r["id"]
        );
    }
    assert!(
        md.contains("## 6. Many connections on one EVD"),
        "results.md has no part 6"
    );
    // Only a missing TCP peer may leave rows pending, with its reason, and
    // not when external programs are required.
    let pending = v["pending"].as_array().expect("`pending` is an array");
    for p in pending {
        let id = p["id"].as_str().unwrap_or_default();
        assert!(
            id.starts_with("tcp/"),
            "only tcp peers can be pending: {id}"
        );
        assert!(
            p["status"].as_str().is_some_and(|s| !s.is_empty()),
            "{id}: pending without a reason"
        );
    }
    if std::env::var("RDAPL_REQUIRE_EXTERNAL").as_deref() == Ok("1") {
        assert!(pending.is_empty(), "RDAPL_REQUIRE_EXTERNAL=1: {pending:?}");
    }
    for t in [
        "target/loopback/rdma-write-4KiB",
        "target/tcp/pingpong-bw-4KiB",
        "target/tcp/stream-bw-4KiB",
    ] {
        assert!(
            !ids(&v, "targets").iter().any(|x| x == t),
            "4 KiB has no bandwidth target ({t})"
        );
    }
    // The half round trip targets judge the owned-buffer rows.
    for (t, row) in [
        (
            "target/loopback/half-rtt-poll-median",
            "loopback/half-rtt/rdapl-buf-poll",
        ),
        (
            "target/loopback/half-rtt-wait-median",
            "loopback/half-rtt/rdapl-buf-wait",
        ),
    ] {
        let target = v["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|x| x["id"] == t);
        assert_eq!(target.map(|x| &x["row"]), Some(&Value::from(row)), "{t}");
    }

    // Every throughput ratio against crossbeam is a number, and crossbeam's
    // own ratio is exactly 1, unless every trial was discarded as starved
    // (a loaded machine), which the row must then say, with a reason for
    // each trial.
    for r in v["throughput"].as_array().into_iter().flatten() {
        let m = r["ratio_vs_peer"]["median"].as_f64();
        let trials = r["ratio_vs_peer"]["reps"].as_array().map_or(0, Vec::len);
        let discarded = r["discarded"].as_array().expect("discarded trials listed");
        assert!(trials > 0, "{}: no trials", r["id"]);
        for d in discarded {
            assert!(
                d["reason"].as_str().is_some_and(|s| !s.is_empty()),
                "{}: discarded without a reason",
                r["id"]
            );
        }
        if discarded.len() == trials {
            assert_eq!(m, None, "{}: a median from discarded trials", r["id"]);
            continue;
        }
        assert!(m.is_some_and(|x| x > 0.0), "{}: ratio {m:?}", r["id"]);
        if r["queue"] == "crossbeam" {
            assert_eq!(m, Some(1.0));
        }
    }

    // Every loopback run completed and checked its data (the numbers of a
    // smoke run mean nothing, but they exist); memcpy's own ratio is 1.
    for r in v["loopback_bandwidth"].as_array().into_iter().flatten() {
        assert_eq!(r["failed_reps"], 0, "{}: failed", r["id"]);
        let m = r["ratio_vs_memcpy"]["median"].as_f64();
        assert!(m.is_some_and(|x| x > 0.0), "{}: ratio {m:?}", r["id"]);
        if r["transfer"] == "memcpy-write" || r["transfer"] == "memcpy-read" {
            assert_eq!(m, Some(1.0));
        }
    }
    for r in v["loopback_half_rtt"]
        .as_array()
        .into_iter()
        .chain(v["loopback_serial"].as_array())
        .flatten()
    {
        assert_eq!(r["failed_reps"], 0, "{}: failed", r["id"]);
        assert!(
            r["half_rtt_median_ns"]["median"]
                .as_f64()
                .is_some_and(|x| x > 0.0),
            "{}: no half round trip",
            r["id"]
        );
    }

    // Part 5: every case has its row; every run of a program that is
    // installed passed its checks; the CRC-on rows are the judged ones.
    assert!(
        md.contains("## 5. TCP provider"),
        "results.md has no tcp section"
    );
    assert!(
        v["tcp_setup"]["rdapl_bin"].as_str().is_some(),
        "no rdapl binary recorded"
    );
    assert!(v["tcp_setup"]["error"].is_null(), "{}", v["tcp_setup"]);
    let mut tcp = Vec::new();
    for p in [
        "rdapl-poll",
        "rdapl-poll-nocrc",
        "rdapl-poll-sent",
        "fi_pingpong",
        "rdapl-wait",
        "rdapl-wait-nocrc",
        "rdapl-wait-sent",
        "qperf",
    ] {
        tcp.push(format!("tcp/latency/64B/{p}"));
    }
    for size in ["4KiB", "64KiB", "1MiB"] {
        for p in [
            "rdapl-poll",
            "rdapl-poll-nocrc",
            "rdapl-poll-sent",
            "fi_pingpong",
        ] {
            tcp.push(format!("tcp/pingpong-bw/{size}/{p}"));
        }
        for p in ["rdapl-wait", "rdapl-wait-nocrc", "rdapl-wait-sent", "qperf"] {
            tcp.push(format!("tcp/stream-bw/{size}/{p}"));
        }
    }
    expect_all(&v, "tcp", &tcp);
    let pending_ids: Vec<&str> = pending.iter().filter_map(|p| p["id"].as_str()).collect();
    for r in v["tcp"].as_array().into_iter().flatten() {
        let id = r["id"].as_str().unwrap_or_default();
        if pending_ids.contains(&id) {
            assert!(r["pending"].is_string(), "{id}: pending but not marked");
            continue;
        }
        assert_eq!(r["failed_reps"], 0, "{id}: failed: {}", r["runs"]);
        let runs = r["runs"].as_array().expect("runs kept");
        assert_eq!(runs.len(), 1, "{id}: one run per repetition");
        assert!(
            r["value"]["median"].as_f64().is_some_and(|x| x > 0.0),
            "{id}: no value"
        );
        let peer_pending = r["pending"].is_string();
        if r["peer"].is_string() && !peer_pending {
            assert!(
                r["ratio_vs_peer"]["median"]
                    .as_f64()
                    .is_some_and(|x| x > 0.0),
                "{id}: no ratio"
            );
        }
    }
    for t in v["targets"].as_array().into_iter().flatten() {
        if t["id"]
            .as_str()
            .is_some_and(|s| s.starts_with("target/tcp/"))
        {
            let row = t["row"].as_str().unwrap_or_default();
            assert!(
                row.ends_with("/rdapl-poll") || row.ends_with("/rdapl-wait"),
                "{}: judged on {row}",
                t["id"]
            );
        }
    }

    let _ = std::fs::remove_dir_all(&dir);
}
