//! Local ports: an IA's connections take their source port at connect
//! time, so one address can hold more connections than it has ephemeral
//! ports, as long as each goes to a different peer address and port.
//!
//! A port taken at the bind (the IA's address, port 0) must differ from
//! every port that address holds, whatever the peer: an address runs out
//! after as many connections as it has ports (TIME_WAIT ones included),
//! and long before that the kernel's search for a free one costs
//! milliseconds a connect. Here, in a network namespace of its own with 64
//! ephemeral ports, one client IA opens 100 connections at once to two
//! service points: all must be established, and carry a message each.
//!
//! Making the namespace needs root (or CAP_SYS_ADMIN) and `unshare` and `ip`;
//! without them the test is skipped with a message, unless
//! `RDAPL_REQUIRE_EXTERNAL=1` (CI), where that fails.

mod common;

use common::*;
use rdapl::*;
use rdapl_tcp::Tcp;
use std::process::{Command, Stdio};
use std::time::Duration;

const ENV: &str = "RDAPL_TCP_PORTS_CHILD";
/// The ephemeral ports the namespace has.
const PORTS: (u16, u16) = (40_000, 40_063);
/// Connections open at once, half to each service point.
const CONNECTIONS: usize = 100;

fn skip_or_fail(why: &str) {
    rdapl_conformance::support::skip_or_fail("ports test", why);
}

#[test]
fn one_address_holds_more_connections_than_it_has_ports() {
    if std::env::var(ENV).is_ok() {
        return;
    }
    let probe = Command::new("unshare")
        .args(["-n", "true"])
        .stdin(Stdio::null())
        .output();
    match probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            return skip_or_fail(&format!(
                "cannot make a network namespace (unshare -n: {})",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Err(e) => return skip_or_fail(&format!("cannot run unshare: {e}")),
    }
    let mut cmd = Command::new("unshare");
    cmd.arg("-n")
        .arg(std::env::current_exe().unwrap())
        .args(["child", "--exact", "--nocapture", "--test-threads=1"])
        .env(ENV, "1");
    let (child, lines) = spawn_lines(cmd);
    let said = expect_line(&lines, "PORTS ", Duration::from_secs(60));
    let mut child = child;
    let status = child.0.wait().unwrap();
    assert!(
        status.success(),
        "the child failed ({status}); it said {said:?}"
    );
    assert_eq!(said, format!("{CONNECTIONS} established"));
}

#[test]
fn child() {
    if std::env::var(ENV).is_err() {
        return;
    }
    // This namespace's own loopback and ephemeral ports.
    let up = Command::new("ip")
        .args(["link", "set", "lo", "up"])
        .status()
        .expect("run ip");
    assert!(up.success(), "ip link set lo up");
    std::fs::write(
        "/proc/sys/net/ipv4/ip_local_port_range",
        format!("{} {}", PORTS.0, PORTS.1),
    )
    .expect("set the ephemeral ports");

    let tcp = Tcp::new();
    let c = Node::new(&tcp, "127.0.0.1", "");
    let s = Node::with(ia(&tcp, "127.0.0.2", ""), 4 * CONNECTIONS);
    let lmr = s.buf(64);
    let cbuf = c.buf(64);
    let (psp1, q1) = listen(&s.ia, &s.cr);
    let (psp2, q2) = listen(&s.ia, &s.cr);
    let mut pairs = Vec::new();
    for i in 0..CONNECTIONS {
        let (ce, se) = (c.ep2(), s.ep2());
        let q = if i % 2 == 0 { q1 } else { q2 };
        ce.connect(s.ia.address(), q, Some(T), b"")
            .unwrap_or_else(|e| panic!("connect {i}: {e:?}"));
        // The request, or the client's failure (no port: `Unreachable`).
        let end = std::time::Instant::now() + T;
        let cr = loop {
            if let Some(ev) = c.conn.dequeue().unwrap() {
                panic!(
                    "connection {i} of one address with {} ephemeral ports: {ev:?}",
                    PORTS.1 - PORTS.0 + 1
                );
            }
            if let Some(Event::ConnectionRequest(r)) = s.cr.dequeue().unwrap() {
                break s.ia.cr(r.cr).unwrap();
            }
            assert!(std::time::Instant::now() < end, "connection {i}: nothing");
            std::thread::sleep(Duration::from_micros(100));
        };
        cr.accept(&se, b"").unwrap();
        assert_eq!(conn_kind(&c.conn), ConnectionEventKind::Established);
        assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Established);
        se.post_recv(&[lmr.triplet(0, 64).unwrap()], i as u64, D)
            .unwrap();
        pairs.push((ce, se));
    }
    for (i, (ce, _)) in pairs.iter().enumerate() {
        ce.post_send(&[cbuf.triplet(0, 64).unwrap()], i as u64, D)
            .unwrap();
    }
    for _ in 0..CONNECTIONS {
        assert_eq!(next_dto(&s.rcv).status, DtoStatus::Success);
        assert_eq!(next_dto(&c.req).status, DtoStatus::Success);
    }
    println!("PORTS {CONNECTIONS} established");
    for (ce, se) in pairs {
        ce.free().unwrap();
        se.free().unwrap();
    }
    drop((psp1, psp2));
}
