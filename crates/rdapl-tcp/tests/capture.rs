//! A live rdapl-tcp session, captured on the loopback interface with
//! `dumpcap` and decoded by `tshark`'s iWARP dissectors: the MPA Request
//! and Reply with CRC negotiated, then every FPDU (Sends, an RDMA Write, a
//! Read Request and its Responses) as MPA/DDP/RDMAP, every CRC good, no
//! frame malformed.
//!
//! Capturing needs the Wireshark tools and the right to capture (root, or
//! a user allowed to run dumpcap). Without them the test is skipped with a
//! message, unless `RDAPL_REQUIRE_EXTERNAL=1` (CI), where that fails.

mod common;

use common::{D, Pair, T, next_dto, pattern};
use rdapl::*;
use rdapl_tcp::Tcp;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn skip_or_fail(why: &str) {
    rdapl_conformance::support::skip_or_fail("live capture check", why);
}

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("-v")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The conversation: sends of 64 B, 4 KiB and 100 KiB (many FPDUs), an
/// RDMA Write and an RDMA Read of 10 KiB each, every byte checked.
fn converse(p: &Pair) {
    let rbuf = p.s.buf(128 << 10);
    let msgs = [64usize, 4096, 100 << 10];
    let mut off = 0;
    for (k, &len) in msgs.iter().enumerate() {
        p.s.recv(&rbuf, off, len as u64, k as u64);
        off += len as u64;
    }
    let src = p.c.lmr(pattern(128 << 10, 3));
    let mut off = 0;
    for (k, &len) in msgs.iter().enumerate() {
        p.c.send(&src, off, len as u64, 10 + k as u64);
        off += len as u64;
    }
    for k in 0..msgs.len() as u64 {
        assert_eq!(next_dto(&p.s.rcv).cookie, k);
        assert_eq!(next_dto(&p.c.req).status, DtoStatus::Success);
    }
    let total: usize = msgs.iter().sum();
    assert_eq!(
        rbuf.to_vec().unwrap()[..total],
        src.to_vec().unwrap()[..total]
    );
    let target = p.s.lmr(vec![0; 10 << 10]);
    let wsrc = p.c.lmr(pattern(10 << 10, 9));
    p.c.ep
        .post_rdma_write(
            &[wsrc.triplet(0, 10 << 10).unwrap()],
            target.rmr_triplet(0, 10 << 10).unwrap(),
            20,
            D,
        )
        .unwrap();
    assert_eq!(next_dto(&p.c.req).status, DtoStatus::Success);
    let sink = p.c.buf(10 << 10);
    p.c.ep
        .post_rdma_read(
            &[sink.triplet(0, 10 << 10).unwrap()],
            target.rmr_triplet(0, 10 << 10).unwrap(),
            21,
            D,
        )
        .unwrap();
    assert_eq!(next_dto(&p.c.req).status, DtoStatus::Success);
    assert_eq!(sink.to_vec().unwrap(), pattern(10 << 10, 9));
    p.c.ep.disconnect(true).unwrap();
    p.expect_end(ConnectionEventKind::Disconnected);
}

#[test]
fn a_live_session_decodes_in_tshark_with_good_crcs() {
    if !have("tshark") || !have("dumpcap") {
        return skip_or_fail("tshark/dumpcap not installed (apt-get install tshark)");
    }
    let tcp = Tcp::new();
    let p = Pair::new(
        common::Node::new(&tcp, "127.0.73.1", "crc=1"),
        common::Node::new(&tcp, "127.0.73.2", "crc=1"),
    );
    let file: PathBuf = std::env::temp_dir().join(format!(
        "rdapl-tcp-live-{}-{}.pcapng",
        std::process::id(),
        p.qual
    ));
    let _ = std::fs::remove_file(&file);
    let filter = format!("host 127.0.73.2 and tcp port {}", p.qual);
    let mut cap = match Command::new("dumpcap")
        .args(["-q", "-i", "lo", "-f", &filter, "-a", "duration:60", "-w"])
        .arg(&file)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return skip_or_fail(&format!("dumpcap did not start: {e}")),
    };
    // The file appears once the capture runs.
    let end = Instant::now() + T;
    while !file.exists() {
        if let Ok(Some(st)) = cap.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = cap.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            return skip_or_fail(&format!("dumpcap could not capture ({st}): {err}"));
        }
        assert!(Instant::now() < end, "dumpcap never started its capture");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    // Connect with private data both ways, then the conversation.
    p.c.ep
        .connect(p.s.ia.address(), p.qual, Some(T), b"rdapl-hello")
        .unwrap();
    common::next_cr(&p.s.ia, &p.s.cr)
        .accept(&p.s.ep, b"rdapl-welcome")
        .unwrap();
    assert_eq!(
        common::conn_kind(&p.s.conn),
        ConnectionEventKind::Established
    );
    assert_eq!(
        common::conn_kind(&p.c.conn),
        ConnectionEventKind::Established
    );
    converse(&p);
    std::thread::sleep(Duration::from_millis(300));
    let _ = Command::new("kill")
        .args(["-INT", &cap.id().to_string()])
        .status();
    let _ = cap.wait();

    let base: Vec<String> = [
        "-r",
        file.to_str().unwrap(),
        "-o",
        "tcp.try_heuristic_first:TRUE",
        "--disable-heuristic",
        "rpcrdma_iwarp",
        "--disable-heuristic",
        "smb_direct_iwarp",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let run = |extra: &[&str]| -> String {
        let o = Command::new("tshark")
            .args(&base)
            .args(extra)
            .output()
            .expect("run tshark");
        assert!(
            o.status.success(),
            "tshark failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let mpa = run(&[
        "-Y",
        "iwarp_mpa.req || iwarp_mpa.rep",
        "-T",
        "fields",
        "-e",
        "iwarp_mpa.crc_flag",
        "-e",
        "iwarp_mpa.rev",
    ]);
    println!("MPA frames (crc flag, revision):\n{mpa}");
    let mpa: Vec<&str> = mpa.lines().collect();
    assert_eq!(mpa.len(), 2, "one MPA Request and one Reply");
    assert!(
        mpa.iter()
            .all(|l| l.starts_with("1") || l.starts_with("True")),
        "{mpa:?}"
    );
    let fields = run(&[
        "-Y",
        "iwarp_ddp_rdmap",
        "-T",
        "fields",
        "-E",
        "separator=;",
        "-e",
        "iwarp_rdma.opcode",
        "-e",
        "iwarp_mpa.crc_check",
    ]);
    // A frame may carry several FPDUs: its fields then list one value each.
    let per_fpdu: Vec<u8> = fields
        .lines()
        .flat_map(|l| l.split(';').next().unwrap_or("").split(','))
        .filter_map(|op| u8::from_str_radix(op.trim().trim_start_matches("0x"), 16).ok())
        .collect();
    let ops: std::collections::BTreeSet<u8> = per_fpdu.iter().copied().collect();
    println!("{} FPDUs decoded, RDMAP opcodes {ops:?}", per_fpdu.len());
    // Write (0), Read Request (1), Read Response (2), Send (3).
    for op in [0u8, 1, 2, 3] {
        assert!(ops.contains(&op), "opcode {op} decoded: {ops:?}\n{fields}");
    }
    let verbose = run(&["-V"]);
    assert!(!verbose.contains("Bad CRC32"), "tshark found a bad CRC");
    assert!(
        !verbose.contains("Malformed"),
        "tshark found a malformed frame"
    );
    let good = verbose.matches("Good CRC32").count();
    assert!(per_fpdu.len() >= 10, "{fields}");
    assert_eq!(good, per_fpdu.len(), "every FPDU's CRC checked and good");
    let bad = run(&["-Y", "_ws.malformed || _ws.expert.severity == error"]);
    assert!(bad.trim().is_empty(), "malformed or error frames:\n{bad}");
    println!("tshark: {good} good CRCs, 0 bad, 0 malformed");
    let _ = std::fs::remove_file(&file);
}
