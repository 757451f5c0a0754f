//! `rdapl demo` and `rdapl info`, driven as library calls.
//!

use rdapl::IaOpen;
use rdapl_cli::{demo, info};

use demo::{DemoOptions, DemoSummary};
use std::time::Duration;

/// A hang guard, far above what a run takes (milliseconds).
const LIMIT: Duration = Duration::from_secs(30);

fn quiet(messages: Option<usize>, message_size: Option<usize>, rdma: Option<usize>) -> DemoOptions {
    DemoOptions {
        messages,
        message_size,
        rdma_size: rdma,
        quiet: true,
    }
}

/// Everything a clean run must show, for the sizes `opts` asked for.
fn assert_clean(s: &DemoSummary, opts: &DemoOptions) {
    let report = s.to_string();
    assert!(s.ok(), "errors:\n{report}");
    assert!(report.contains("0 errors"), "{report}");
    let (n, size, rdma) = (
        opts.messages() as u64,
        opts.message_size() as u64,
        opts.rdma_size() as u64,
    );
    assert!(s.established, "{report}");
    assert!(
        s.client_private_data
            .starts_with(demo::CLIENT_GREETING.as_bytes()),
        "{report}"
    );
    assert!(
        s.server_private_data
            .starts_with(demo::SERVER_GREETING.as_bytes()),
        "{report}"
    );
    assert_eq!(s.remote_buffer.map(|t| t.segment_length), Some(rdma));
    // What was sent is what was verified.
    assert_eq!((s.messages_sent, s.messages_received), (n, n), "{report}");
    assert_eq!(s.message_bytes_verified, n * size, "{report}");
    assert_eq!(
        (s.rdma_write_bytes, s.rdma_read_bytes),
        (rdma, rdma),
        "{report}"
    );
    assert_eq!(
        (s.rdma_write_verified, s.rdma_read_verified),
        (rdma, rdma),
        "{report}"
    );
    assert_eq!(s.bytes_verified(), n * size + 2 * rdma);
    // Every consumption path was used, for exactly what it was given.
    assert_eq!(s.consumed_by_upcall, n, "{report}");
    assert_eq!(s.consumed_by_poller, n, "{report}");
    // CR, Established x2, RDMA write, RDMA read, Disconnected x2.
    assert_eq!(s.consumed_by_wait, 7, "{report}");
    assert_eq!(s.waited.len(), 7);
    assert!(s.client_disconnected && s.server_disconnected, "{report}");
    assert!(s.elapsed < LIMIT, "took {:?}", s.elapsed);
    assert!(s.rdma_write_mbps() > 0.0 && s.rdma_read_mbps() > 0.0);
}

#[test]
fn demo_with_defaults_reports_no_error() {
    // Not quiet: the progress lines go to stderr (captured by the harness;
    // `--nocapture` shows them with the report).
    let opts = DemoOptions::default();
    let s = demo::run(&opts).expect("demo run");
    println!("{s}");
    assert_clean(&s, &opts);
    assert_eq!(s.rdma_write_bytes, 1 << 20);
    let report = s.to_string();
    for needle in ["established", "by upcall", "by poller", "by wait", "MB/s"] {
        assert!(report.contains(needle), "missing {needle:?} in\n{report}");
    }
}

#[test]
fn demo_with_odd_sizes_and_more_messages_than_the_default_queue() {
    // 300 messages: above the default endpoint queue depth (256); sizes
    // that are not multiples of 8 (the pattern generator's word).
    let opts = quiet(Some(300), Some(1001), Some(12_345));
    let s = demo::run(&opts).expect("demo run");
    assert_clean(&s, &opts);
}

#[test]
fn one_message_and_one_byte() {
    let opts = quiet(Some(1), Some(1), Some(1));
    let s = demo::run(&opts).expect("demo run");
    assert_clean(&s, &opts);
}

/// Concurrent demos in one process each find a qualifier nobody holds.
/// Two are held here for the whole test, so every run must skip them.
/// (That the runs pick distinct qualifiers among themselves holds only
/// while they overlap; one that ends first frees its qualifier for the
/// next, so that is not asserted.)
#[test]
fn concurrent_demos_skip_qualifiers_in_use() {
    let ia = rdapl::Ia::open_with(
        "loopback",
        rdapl::IaOptions {
            params: format!("addr={}", demo::SERVER_ADDR),
            ..Default::default()
        },
    )
    .expect("open");
    let cr = ia.evd_create(4, rdapl::EvdFlags::CR).expect("evd");
    // The other tests of this file run demos too, beside this one: a
    // qualifier one of them holds is taken once it lets go.
    let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let held: Vec<_> = (0..2)
        .map(|k| {
            loop {
                match ia.psp_create(demo::BASE_CONN_QUAL + k, &cr) {
                    Ok(p) => break p,
                    Err(rdapl::Error::ConnQualInUse(_)) if std::time::Instant::now() < end => {
                        std::thread::sleep(std::time::Duration::from_millis(1))
                    }
                    Err(e) => panic!("psp: {e:?}"),
                }
            }
        })
        .collect();
    let opts = quiet(Some(32), Some(64), Some(64 << 10));
    let runs: Vec<_> = (0..3)
        .map(|_| {
            let o = opts.clone();
            std::thread::spawn(move || demo::run(&o))
        })
        .collect();
    for r in runs {
        let s = r.join().expect("demo thread").expect("demo run");
        assert_clean(&s, &opts);
        assert!(
            (demo::BASE_CONN_QUAL + 2..demo::BASE_CONN_QUAL + demo::CONN_QUAL_TRIES)
                .contains(&s.conn_qual),
            "qualifier {} is held or out of range",
            s.conn_qual
        );
    }
    drop(held);
}

#[test]
fn bad_options_are_refused_before_anything_runs() {
    for opts in [
        quiet(Some(0), None, None),
        quiet(None, Some(0), None),
        quiet(None, Some(demo::MAX_MESSAGE_SIZE + 1), None),
        quiet(Some(1 << 20), Some(1 << 10), None),
        quiet(None, None, Some(0)),
        quiet(None, None, Some(demo::MAX_RDMA_SIZE + 1)),
    ] {
        assert!(opts.validate().is_err(), "{opts:?}");
        assert!(demo::run(&opts).is_err(), "{opts:?}");
    }
    // Above the IA's max_dto_per_ep, caught once the IA is open.
    let too_many = quiet(Some(100_000), Some(1), Some(1));
    assert!(too_many.validate().is_ok());
    let e = demo::run(&too_many).expect_err("above max_dto_per_ep");
    assert!(e.contains("max_dto_per_ep"), "{e}");
    assert_eq!(DemoOptions::default().messages(), demo::DEFAULT_MESSAGES);
}

/// `rdapl info` shows the tcp provider's defaults, which the user's
/// `RDAPL_TCP_PARAMS` would change: with it set, this test runs again in
/// a child of this binary without it.
#[test]
fn info_lists_loopback_with_its_attributes() {
    let name = "info_lists_loopback_with_its_attributes";
    if std::env::var_os(rdapl_tcp::PARAMS_ENV).is_some() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--nocapture", "--test-threads=1"])
            .env_remove(rdapl_tcp::PARAMS_ENV)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("provider: tcp"), "{text}");
        return;
    }
    let out = info::run();
    assert!(out.contains("provider: loopback"), "{out}");
    let ia = rdapl::Ia::open("loopback").expect("open");
    let (attr, pattr) = ia.query().expect("query");
    ia.close(rdapl::CloseFlags::Graceful).expect("close");
    assert!(
        out.contains(&format!("max_evd_qlen: {}\n", attr.max_evd_qlen)),
        "{out}"
    );
    assert!(out.contains(&format!("max_dto_per_ep: {}\n", attr.max_dto_per_ep)));
    assert!(out.contains(&format!("adapter_name: {}\n", attr.adapter_name)));
    assert!(out.contains(&format!("description: {}\n", pattr.description)));
    for key in [
        "provider_attr:",
        "ia_attr:",
        "upcall_policies: ",
        "completion_flags: ",
        "evd_stream_merging_supported:",
        "max_rdma_size: ",
        "max_private_data_size: ",
    ] {
        assert!(out.contains(key), "missing {key:?} in\n{out}");
    }
    assert!(!out.contains("failed"), "{out}");
    // The tcp provider's settings in force, under its parameters' names;
    // the loopback has none.
    let tcp = out.split("provider: tcp").nth(1).expect("tcp listed");
    let loopback = out.split("provider: loopback").nth(1).expect("loopback");
    let loopback = loopback.split("provider: tcp").next().unwrap_or(loopback);
    assert!(!loopback.contains("provider_specific_attr:"), "{out}");
    assert!(tcp.contains("        provider_specific_attr:\n"), "{out}");
    for key in [
        "crc: 1\n",
        "complete: placed\n",
        "mss: auto\n",
        "poll_yield: ",
    ] {
        assert!(
            tcp.contains(&format!("            {key}")),
            "{key:?} in\n{out}"
        );
    }
    println!("{out}");
}
