//! Runs `rdapl-bench --smoke` into a temporary directory and checks that it
//! wrote the markdown report, the JSON results and the SVG plots, and that
//! the JSON parses and holds every expected row and target.

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
    let json = std::fs::read_to_string(dir.join("results.json")).expect("results.json");
    for svg in [
        "throughput.svg",
        "latency.svg",
        "flow_throughput.svg",
        "flow_latency.svg",
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
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    expect_all(&v, "targets", &targets);
    expect_all(&v, "pending", &["loopback".to_string()]);

    // Every throughput ratio against crossbeam is a number, and crossbeam's
    // own ratio is exactly 1.
    for r in v["throughput"].as_array().into_iter().flatten() {
        let m = r["ratio_vs_peer"]["median"].as_f64();
        assert!(m.is_some_and(|x| x > 0.0), "{}: ratio {m:?}", r["id"]);
        if r["queue"] == "crossbeam" {
            assert_eq!(m, Some(1.0));
        }
    }

    let _ = std::fs::remove_dir_all(&dir);
}
