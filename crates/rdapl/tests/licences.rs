//! Every crate rdapl builds with is under a licence that lets rdapl stay
//! MIT OR Apache-2.0: the workspace's own crates say exactly that, and
//! each dependency (for this host, dev and build dependencies included)
//! offers at least one choice made only of permissive licences.
//!
//! Reads `cargo metadata` (offline first: a built workspace has every
//! crate it needs; then with the registry). Where neither works it skips
//! with the reason, unless `RDAPL_REQUIRE_EXTERNAL=1`.

use std::process::Command;

/// Licences a dependency may use (SPDX identifiers; `WITH` exceptions
/// listed whole).
const ALLOWED: &[&str] = &[
    "MIT",
    "Apache-2.0",
    "Apache-2.0 WITH LLVM-exception",
    "BSD-2-Clause",
    "BSD-3-Clause",
    "ISC",
    "Zlib",
    "Unlicense",
    "0BSD",
    "CC0-1.0",
    "BSL-1.0",
    "Unicode-3.0",
    "Unicode-DFS-2016",
];

/// Whether the SPDX expression `e` can be taken under allowed licences
/// only: some `OR` alternative whose `AND` parts are all allowed (the
/// `spdx` crate parses and evaluates it; its lax mode reads old crates'
/// `MIT/Apache-2.0` as `MIT OR Apache-2.0`).
fn permissive(e: &str) -> bool {
    spdx::Expression::parse_mode(e, spdx::ParseMode::LAX)
        .is_ok_and(|x| x.evaluate(|req| ALLOWED.contains(&req.to_string().as_str())))
}

fn host() -> Option<String> {
    let out = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .arg("-vV")
        .output()
        .ok()?;
    String::from_utf8(out.stdout)
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
}

fn metadata() -> Result<serde_json::Value, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let host = host().ok_or("rustc -vV named no host")?;
    let mut why = String::new();
    for offline in [true, false] {
        let mut c = Command::new(&cargo);
        c.args(["metadata", "--format-version", "1", "--locked"])
            .args(["--filter-platform", &host])
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if offline {
            c.arg("--offline");
        }
        match c.output() {
            Ok(o) if o.status.success() => {
                return serde_json::from_slice(&o.stdout).map_err(|e| e.to_string());
            }
            Ok(o) => why = String::from_utf8_lossy(&o.stderr).into_owned(),
            Err(e) => why = e.to_string(),
        }
    }
    Err(why)
}

#[test]
fn every_crate_is_under_a_licence_rdapl_may_use() {
    let m = match metadata() {
        Ok(m) => m,
        Err(why) => {
            assert!(
                std::env::var("RDAPL_REQUIRE_EXTERNAL").as_deref() != Ok("1"),
                "cargo metadata failed: {why}"
            );
            eprintln!("skipped: cargo metadata failed: {why}");
            return;
        }
    };
    let members: Vec<&str> = m["workspace_members"]
        .as_array()
        .expect("workspace_members")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    let packages = m["packages"].as_array().expect("packages");
    assert!(packages.len() > members.len(), "no dependency listed");
    let mut bad = Vec::new();
    for p in packages {
        let name = p["name"].as_str().unwrap_or("?");
        let version = p["version"].as_str().unwrap_or("?");
        let licence = p["license"].as_str();
        let ours = members.contains(&p["id"].as_str().unwrap_or(""));
        let ok = match (ours, licence) {
            (true, Some(l)) => l == "MIT OR Apache-2.0",
            (false, Some(l)) => permissive(l),
            (_, None) => false,
        };
        if !ok {
            bad.push(format!("{name} {version}: {licence:?}"));
        }
    }
    assert!(
        bad.is_empty(),
        "crates under a licence rdapl may not use:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_expressions_are_read_right() {
    for ok in [
        "MIT",
        "MIT OR Apache-2.0",
        "MIT/Apache-2.0",
        "Apache-2.0 / MIT",
        "(MIT OR Apache-2.0) AND Unicode-3.0",
        "Apache-2.0 WITH LLVM-exception OR Apache-2.0 OR MIT",
        "MIT OR Apache-2.0 OR LGPL-2.1-or-later",
        "Unlicense OR MIT",
    ] {
        assert!(permissive(ok), "{ok}");
    }
    for no in [
        "GPL-3.0",
        "LGPL-2.1-or-later",
        "MIT AND GPL-2.0",
        "(MIT OR Apache-2.0) AND MPL-2.0",
        "MPL-2.0",
        "",
        "Apache-2.0 WITH Classpath-exception-2.0",
    ] {
        assert!(!permissive(no), "{no}");
    }
}
