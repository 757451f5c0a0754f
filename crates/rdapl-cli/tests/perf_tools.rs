//! `rdapl pingpong` and `rdapl bw` as a user runs them: the binary, on the
//! loopback provider in one process, and on the TCP provider with the
//! server in another process (127.0.0.1 and ::1, a port of this test's
//! own; one test between two network namespaces it makes).

use rdapl_conformance::hosts::Hosts;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The binary, with the tcp provider's defaults (the user's
/// `RDAPL_TCP_PARAMS` dropped: a test says `--params` where it means it).
fn rdapl() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rdapl"));
    c.env_remove(rdapl_tcp::PARAMS_ENV);
    c
}

/// Runs the client with `args`, bounded in time; its stdout.
fn client(args: &[&str]) -> String {
    let out = rdapl()
        .args(args)
        .args(["--timeout", "20"])
        .output()
        .expect("running rdapl");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "rdapl {args:?}: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The first row's (bytes, #sent) of a run that must have succeeded.
fn first_row(out: &std::process::Output) -> (String, u64) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = rows(&String::from_utf8_lossy(&out.stdout));
    (r[0].0.clone(), r[0].1)
}

/// Runs a TCP client `rdapl TEST` of the server at 127.0.0.1 on `port`
/// with `more` arguments (the server must listen already).
fn tcp_client(test: &str, port: &str, more: &[&str]) -> std::process::Output {
    rdapl()
        .args([test, "-p", "tcp", "-a", "127.0.0.1", "-q", port])
        .args(more)
        .arg("127.0.0.1")
        .output()
        .expect("running the client")
}

/// The rows of a run that must have succeeded.
fn rows_of(out: &std::process::Output) -> Vec<(String, u64, f64, f64)> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    rows(&String::from_utf8_lossy(&out.stdout))
}

/// The table's rows: (bytes, #sent, MB/sec, usec/xfer).
fn rows(table: &str) -> Vec<(String, u64, f64, f64)> {
    let mut lines = table.lines();
    let header = lines.next().unwrap_or("");
    assert!(
        header.starts_with("bytes") && header.contains("usec/xfer"),
        "{table}"
    );
    lines
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 8, "{l}");
            (
                f[0].to_string(),
                f[1].parse().unwrap(),
                f[5].parse().unwrap(),
                f[6].parse().unwrap(),
            )
        })
        .collect()
}

/// A server process, killed when dropped (a failed assertion leaves no
/// server behind).
struct Server(Option<std::process::Child>);

impl Server {
    /// Panics with the server's stderr if it has ended.
    fn assert_running(&mut self) {
        let c = self.0.as_mut().unwrap();
        if c.try_wait().unwrap().is_some() {
            let out = self.0.take().unwrap().wait_with_output().unwrap();
            panic!("the server ended: {}", String::from_utf8_lossy(&out.stderr));
        }
    }

    /// Kills the server; what it wrote to stderr.
    fn stop(mut self) -> String {
        let mut c = self.0.take().unwrap();
        let _ = c.kill();
        let out = c.wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// Waits for the server to end by itself.
    fn wait(mut self) -> std::process::ExitStatus {
        self.0.take().unwrap().wait().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A port of this process's own for a test's server (`salt` tells a
/// test's from another's, so parallel runs do not collide), below Linux's
/// ephemeral range (32768 and up): a connection's local port there, any
/// test's client, would keep the server from binding it.
fn test_port(salt: u32) -> String {
    (20_000 + ((std::process::id() + salt) % 12_000) as u16).to_string()
}

/// Starts a TCP server `rdapl TEST -s` on 127.0.0.1 with `more`
/// arguments, on a port of this process's own ([`test_port`]): the server
/// and its port.
fn server(test: &str, more: &[&str], salt: u32) -> (Server, String) {
    let port_s = test_port(salt);
    let child = rdapl()
        .args([test, "-s", "-p", "tcp", "-a", "127.0.0.1", "-q", &port_s])
        .args(more)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the server");
    (Server(Some(child)), port_s)
}

/// Runs a TCP client `rdapl TEST` of the server at 127.0.0.1 on `port`
/// with `more` arguments until that server listens: attempts that find
/// nobody (`NonPeerRejected`) are repeated for up to 20 s; the first
/// other outcome is returned.
fn once_listening(test: &str, port: &str, more: &[&str]) -> std::process::Output {
    once_listening_at("127.0.0.1", test, port, more)
}

/// `once_listening` with `host` for both sides' addresses.
fn once_listening_at(host: &str, test: &str, port: &str, more: &[&str]) -> std::process::Output {
    let mut args = vec![test, "-p", "tcp", "-a", host, "-q", port];
    args.extend_from_slice(more);
    until_listening(&args, host)
}

/// Runs the client `rdapl ARGS --timeout 10 SERVER` until its server
/// listens (as `once_listening`).
fn until_listening(args: &[&str], server: &str) -> std::process::Output {
    until_listening_by(rdapl, args, server)
}

/// `until_listening` with the command `rdapl` makes (say, in a network
/// namespace).
fn until_listening_by(
    rdapl: impl Fn() -> Command,
    args: &[&str],
    server: &str,
) -> std::process::Output {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let out = rdapl()
            .args(args)
            .args(["--timeout", "10", server])
            .output()
            .expect("running the client");
        let err = String::from_utf8_lossy(&out.stderr);
        if out.status.success() || !err.contains("NonPeerRejected") {
            return out;
        }
        assert!(Instant::now() < end, "the server never listened: {err}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn pingpong_and_bw_on_loopback_in_one_process() {
    let t = client(&["pingpong", "-S", "all", "-I", "50", "-q", "47801"]);
    let r = rows(&t);
    assert_eq!(r.len(), 21, "1 B to 1 MiB:\n{t}");
    assert_eq!(r[0].0, "1");
    assert_eq!(r[20].0, "1m");
    assert!(
        r.iter().all(|x| x.1 == 50 && x.2 >= 0.0 && x.3 > 0.0),
        "{t}"
    );
    let t = client(&["bw", "-S", "64k", "-I", "500", "-w", "-q", "47802"]);
    let r = rows(&t);
    assert_eq!((r.len(), r[0].0.as_str(), r[0].1), (1, "64k", 500), "{t}");
}

#[test]
fn pingpong_and_bw_over_tcp_between_processes() {
    let (server, port_s) = server("pingpong", &[], 0);
    // The client retries until the server listens (bounded).
    let out = once_listening("pingpong", &port_s, &["-S", "64", "-I", "200"]);
    assert!(
        out.status.success(),
        "the client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    let r = rows(&table);
    assert_eq!(
        (r.len(), r[0].0.as_str(), r[0].1),
        (1, "64", 200),
        "{table}"
    );
    // The same server serves the next clients: bandwidth and latency at
    // three sizes, waiting on the EVD.
    for (test, size) in [("bw", "4k"), ("pingpong", "64k"), ("bw", "1m")] {
        let out = tcp_client(
            test,
            &port_s,
            &["-S", size, "-I", "20", "-w", "--timeout", "10"],
        );
        let r = rows_of(&out);
        assert_eq!((r[0].0.as_str(), r[0].1), (size, 20), "{test}");
    }
    server.stop();
}

/// Clients that come at once are served in turn: the requests that come
/// while one is served wait, and each client gets its whole run. (The
/// server used to take a second request in the middle of a session for
/// an error: it ended, and the client it was serving failed with it.)
#[test]
fn a_server_serves_clients_that_come_at_once_in_turn() {
    let (mut server, port_s) = server("bw", &[], 7_919);
    // Listening once a client gets through.
    let out = once_listening("pingpong", &port_s, &["-I", "10", "-w"]);
    assert!(
        out.status.success(),
        "the client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let clients: Vec<_> = [
        ("bw", "4k", "3000"),
        ("pingpong", "64", "500"),
        ("bw", "64k", "300"),
    ]
    .into_iter()
    .map(|(test, size, iters)| {
        let child = rdapl()
            .args([test, "-p", "tcp", "-a", "127.0.0.1", "-q", &port_s])
            .args([
                "-S",
                size,
                "-I",
                iters,
                "-w",
                "--timeout",
                "10",
                "127.0.0.1",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting a client");
        (test, size, iters, child)
    })
    .collect();
    for (test, size, iters, child) in clients {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{test} {size}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r = rows(&String::from_utf8_lossy(&out.stdout));
        assert_eq!((r[0].0.as_str(), r[0].1.to_string()), (size, iters.into()));
    }
    server.assert_running();
    server.stop();
}

/// A client that asks for more than the server takes is told so, and the
/// server goes on serving the next one.
#[test]
fn a_run_the_server_refuses_is_reported_and_the_server_goes_on() {
    let (server, port_s) = server("bw", &["--max-size", "4k"], 13_007);
    let run = |size: &str| {
        once_listening(
            "bw",
            &port_s,
            &["-S", size, "--max-size", "64k", "-I", "10", "-w"],
        )
    };
    let refused = run("64k");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "a 64 KiB run against a 4 KiB server succeeded"
    );
    assert!(err.contains("--max-size"), "{err}");
    let out = run("4k");
    assert_eq!(first_row(&out), ("4k".to_string(), 10));
    let err = server.stop();
    assert!(err.contains("65536-byte messages"), "{err}");
}

/// A client that waits its turn longer than MPA's timers is served when
/// the server gets to it (no timer refuses a request the server has not
/// answered yet), and one whose own timeout ran out while it waited is
/// skipped with a word: the server goes on.
#[test]
fn a_client_waits_its_turn_past_mpa_timers_and_one_that_gave_up_is_skipped() {
    use rdapl::{EvdFlags, Ia, IaOptions};
    let (mut server, port_s) = server("pingpong", &["--params", "mpa_timeout_ms=200"], 20_011);
    let out = once_listening("pingpong", &port_s, &["-I", "10"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A holds the server, saying nothing, for 1.5 s (7× the timer).
    let ia = Ia::open_provider(
        rdapl_tcp::Tcp::new(),
        IaOptions {
            params: "addr=127.0.0.1".into(),
            ..Default::default()
        },
    )
    .unwrap();
    let pz = ia.pz_create().unwrap();
    let dto = ia.evd_create(16, EvdFlags::DTO).unwrap();
    let conn = ia.evd_create(16, EvdFlags::CONNECTION).unwrap();
    let ep = ia
        .ep_create(&pz, Some(&dto), Some(&dto), Some(&conn), None)
        .unwrap();
    let port: u64 = port_s.parse().unwrap();
    let server_addr = "127.0.0.1".parse().unwrap();
    ep.connect(server_addr, port, Some(Duration::from_secs(10)), b"")
        .unwrap();
    match conn.wait(Some(Duration::from_secs(10)), 1) {
        Ok((rdapl::Event::Connection(c), _)) => {
            assert_eq!(c.kind, rdapl::ConnectionEventKind::Established)
        }
        other => panic!("client A: {other:?}"),
    }
    // B gives up after 1 s; C waits up to 20 s. They queue in that order.
    let queued = |timeout: &str| {
        rdapl()
            .args(["pingpong", "-p", "tcp", "-a", "127.0.0.1", "-q", &port_s])
            .args(["-I", "10", "--timeout", timeout, "127.0.0.1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting a client")
    };
    let b = queued("1");
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    let c = queued("20");
    std::thread::sleep(Duration::from_millis(1300));
    ep.disconnect(true).unwrap();
    let b = b.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&b.stderr);
    assert!(!b.status.success(), "B was served: {err}");
    assert!(err.contains("TimedOut"), "{err}");
    let c = c.wait_with_output().unwrap();
    assert!(
        c.status.success(),
        "C, after {:?}: {}",
        t0.elapsed(),
        String::from_utf8_lossy(&c.stderr)
    );
    assert!(t0.elapsed() >= Duration::from_millis(1000));
    let r = rows(&String::from_utf8_lossy(&c.stdout));
    assert_eq!((r[0].0.as_str(), r[0].1), ("64", 10));
    server.assert_running();
    let err = server.stop();
    assert!(
        err.contains("a client gave up waiting before it was served"),
        "{err}"
    );
}

/// Addresses may be host names, as rping's and fi_pingpong's may: an
/// unknown one is refused with a clear word before anything starts.
#[test]
fn host_names_resolve_to_addresses() {
    let (server, port_s) = server("pingpong", &["--once"], 30_011);
    let out = once_listening_at("localhost", "pingpong", &port_s, &["-I", "10"]);
    assert_eq!(first_row(&out), ("64".to_string(), 10));
    assert!(server.wait().success());
    // (An empty name: refused without asking a DNS server.)
    let bad = rdapl()
        .args(["pingpong", "-p", "tcp", ""])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("nor a host name that resolves"), "{err}");
}

/// A client that names no address of its own takes the loopback address
/// of its server's family for a server on this host (any address for one
/// elsewhere: `rdapl_cli::client_addr`). Over IPv6 it used to open its IA
/// at 127.0.0.1 and fail `Unreachable` without a word of why; told to use
/// an address of the other family, it still fails, and the provider's
/// log (a warning, printed by default) says why.
#[test]
fn a_clients_own_address_follows_its_servers() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("skipped: this host has no IPv6 loopback (::1)");
        return;
    }
    let port = test_port(30_017);
    let server = Server(Some(
        rdapl()
            .args(["pingpong", "-s", "-p", "tcp", "-a", "::1", "-q", &port])
            .arg("--once")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting the server"),
    ));
    // (No -a: the client's own address is left to the tool.)
    let out = until_listening(&["pingpong", "-p", "tcp", "-q", &port, "-I", "10"], "::1");
    assert_eq!(first_row(&out), ("64".to_string(), 10));
    assert!(server.wait().success());
    let err = from_loopback(rdapl(), &port, "::1");
    assert!(
        err.contains("Unreachable")
            && err.contains("connect failed before it began")
            && err.contains("of different families"),
        "{err}"
    );
}

/// Runs `rdapl` (the command `c`) as a pingpong client from 127.0.0.1 of
/// the server at `server` on `port`, which must fail, with the providers'
/// logs at their default level: its stderr.
fn from_loopback(mut c: Command, port: &str, server: &str) -> String {
    let out = c
        .args(["pingpong", "-p", "tcp", "-a", "127.0.0.1", "-q", port])
        .args(["-I", "10", "--timeout", "10", server])
        .env_remove("RDAPL_LOG")
        .output()
        .expect("running the client");
    assert!(
        !out.status.success(),
        "a client from 127.0.0.1 reached {server}"
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Two hosts, as a user first runs the tools across machines: network
/// namespaces of this test's own (10.202.x.1 and .2, joined by a veth
/// pair; root and iproute2, else skipped with the reason unless
/// `RDAPL_REQUIRE_EXTERNAL=1`). A server at any address serves a client
/// on the other host that names no address of its own; the same client
/// told to start from 127.0.0.1 fails, and both the provider's warning
/// and the tool say why; a server left at its default (127.0.0.1) is
/// not reached from the other host, and the tool says what to do.
#[test]
fn a_client_on_another_host_reaches_a_server_and_is_told_what_went_wrong() {
    let h = match Hosts::new("th", 202) {
        Ok(h) => h,
        Err(e) => {
            let why = format!("cannot make two network namespaces: {e}");
            rdapl_conformance::support::skip_or_fail("two-host test", &why);
            return;
        }
    };
    let port = test_port(30_023);
    let in_ns = |ns: &str| Hosts::command(ns, env!("CARGO_BIN_EXE_rdapl"));
    let (a, b) = (|| in_ns(&h.a), || in_ns(&h.b));
    let server = Server(Some(
        b().args(["pingpong", "-s", "-p", "tcp", "-a", "0.0.0.0", "-q", &port])
            .arg("--once")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting the server"),
    ));
    let peer = h.addr(2);
    let args = ["pingpong", "-p", "tcp", "-q", &port, "-I", "10"];
    let out = until_listening_by(a, &args, &peer);
    assert_eq!(first_row(&out), ("64".to_string(), 10));
    assert!(server.wait().success());
    // From a loopback address: refused at once, and said why.
    let err = from_loopback(a(), &port, &peer);
    assert!(
        err.contains("Unreachable")
            && err.contains("127.0.0.1 is a loopback address")
            && err.contains("(this side's address is a loopback one"),
        "{err}"
    );
    // A server at its default address: its host's clients only.
    let server = Server(Some(
        b().args(["pingpong", "-s", "-p", "tcp", "-q", &port])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting the server"),
    ));
    let local = until_listening_by(b, &args, "127.0.0.1");
    assert_eq!(first_row(&local), ("64".to_string(), 10));
    let out = a()
        .args(args)
        .args(["--timeout", "10", &peer])
        .output()
        .expect("running the client");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("NonPeerRejected") && err.contains("serves this host only"),
        "{err}"
    );
    server.stop();
}

/// RDMA Writes and Reads between processes, as perftest's `ib_write_bw`,
/// `ib_read_bw`, `ib_write_lat` and `ib_read_lat` measure them: the server offers a
/// region; every Read is checked where it has a buffer of its own, and the
/// server checks the last Write to each piece of its region. Its region
/// here (4 × 1 MiB) is smaller than some clients' windows (pieces then
/// take several Writes at once), and a window of 32 Reads is twice what
/// the connection lets out at once (the rest wait their turn).
#[test]
fn rdma_writes_and_reads_over_tcp_between_processes() {
    let (mut server, port_s) = server("bw", &["--window", "4"], 40_009);
    let out = once_listening("bw", &port_s, &["--op", "write", "-S", "4k", "-I", "3000"]);
    assert_eq!(first_row(&out), ("4k".to_string(), 3000));
    let runs: [(&str, &[&str], &str, u64); 4] = [
        (
            "bw",
            &["--op", "write", "-S", "1m", "--window", "8"],
            "1m",
            40,
        ),
        (
            "bw",
            &["--op", "read", "-S", "64k", "--window", "32"],
            "64k",
            500,
        ),
        (
            "bw",
            &["--op", "read", "-S", "1m", "--buffers", "1", "-w"],
            "1m",
            20,
        ),
        ("pingpong", &["--op", "read", "-S", "all"], "1", 5),
    ];
    for (test, more, first, iters) in runs {
        let iters_s = iters.to_string();
        let more = [more, &["-I", &iters_s, "--timeout", "20"]].concat();
        let out = tcp_client(test, &port_s, &more);
        assert_eq!(
            first_row(&out),
            (first.to_string(), iters),
            "{test} {more:?}"
        );
        let r = rows(&String::from_utf8_lossy(&out.stdout));
        if test == "pingpong" {
            // 1 B to 1 MiB, each a Read's round trip.
            assert_eq!(r.len(), 21);
            assert!(r.iter().all(|x| x.1 == iters && x.3 > 0.0));
        }
    }
    // A pingpong of Writes polls memory: both sides write, 1 B to 1 MiB
    // and many 1-byte messages; waiting is refused before anything starts.
    for (size, iters, rows_n) in [("all", "5", 21), ("1", "500", 1)] {
        let more = ["--op", "write", "-S", size, "-I", iters, "--timeout", "20"];
        let r = rows_of(&tcp_client("pingpong", &port_s, &more));
        assert_eq!(r.len(), rows_n, "pingpong --op write -S {size}");
    }
    let bad = tcp_client("pingpong", &port_s, &["--op", "write", "-w"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("cannot wait"));
    server.assert_running();
    server.stop();
}

/// `RDAPL_LOG` sets how much of the providers' logs reach stderr: a
/// connect that nobody takes is logged at `info` with the socket's error
/// (`ECONNREFUSED`, 111 on Linux), which the default
/// (`warn`) leaves out; a value that is no level is said.
#[test]
fn rdapl_log_sets_the_level_of_the_providers_logs() {
    // A port of 127.0.0.1 where nobody listens.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let run = |log: Option<&str>| {
        let mut c = rdapl();
        c.args(["pingpong", "-p", "tcp", "-a", "127.0.0.1", "-q", &port])
            .args(["--timeout", "10", "127.0.0.1"]);
        match log {
            Some(v) => c.env("RDAPL_LOG", v),
            None => c.env_remove("RDAPL_LOG"),
        };
        let out = c.output().expect("running rdapl");
        assert!(
            !out.status.success(),
            "a connect to a closed port succeeded"
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(Some("info"));
    assert!(
        err.contains(" INFO ")
            && err.contains("connect failed")
            && err.contains("end=NonPeerRejected")
            && err.contains("os error 111"),
        "{err}"
    );
    let err = run(None);
    assert!(err.contains("NonPeerRejected"), "{err}");
    assert!(!err.contains("connect failed"), "{err}");
    let err = run(Some("loud"));
    assert!(err.contains("RDAPL_LOG=\"loud\" is not a level"), "{err}");
    assert!(!err.contains("connect failed"), "{err}");
}

/// A client that sends a message longer than the server's buffers breaks
/// its connection (the receive fails `LocalLength`); the server, which
/// serves on, must not hand what that connection left on its EVD (the
/// flushed receives, its `Broken`) to the next client, which must be
/// served as if nothing had happened.
#[test]
fn a_client_that_overruns_the_servers_buffers_leaves_nothing_for_the_next() {
    use rdapl::{CompletionFlags, EvdFlags, Ia, IaOptions, MemPriv, Region};
    let port_s = "19010";
    let child = rdapl()
        .args(["bw", "-s", "-p", "tcp", "-a", "127.0.252.6", "-q", port_s])
        .args(["--max-size", "64", "--timeout", "10"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the server");
    let mut server = Server(Some(child));
    let out = until_listening(
        &[
            "bw",
            "-p",
            "tcp",
            "-a",
            "127.0.252.7",
            "-q",
            port_s,
            "-S",
            "64",
            "-I",
            "10",
        ],
        "127.0.252.6",
    );
    assert_eq!(first_row(&out), ("64".to_string(), 10));
    // The bad client: a control message, its echo, then 200 bytes.
    let ia = Ia::open_provider(
        rdapl_tcp::Tcp::new(),
        IaOptions {
            params: "addr=127.0.252.8".into(),
            ..Default::default()
        },
    )
    .unwrap();
    let pz = ia.pz_create().unwrap();
    let evd = ia
        .evd_create(64, EvdFlags::DTO | EvdFlags::CONNECTION)
        .unwrap();
    let ep = ia
        .ep_create(&pz, Some(&evd), Some(&evd), Some(&evd), None)
        .unwrap();
    let buf = pz.lmr_create(Region::zeroed(256), MemPriv::ALL).unwrap();
    ep.post_recv(&[buf.triplet(0, 16).unwrap()], 1, CompletionFlags::DEFAULT)
        .unwrap();
    ep.connect(
        "127.0.252.6".parse().unwrap(),
        port_s.parse().unwrap(),
        Some(Duration::from_secs(10)),
        b"",
    )
    .unwrap();
    let next = || match evd.wait(Some(Duration::from_secs(10)), 1) {
        Ok((ev, _)) => ev,
        Err(e) => panic!("the bad client: {e}"),
    };
    match next() {
        rdapl::Event::Connection(c) => {
            assert_eq!(c.kind, rdapl::ConnectionEventKind::Established)
        }
        other => panic!("the bad client: {other:?}"),
    }
    // bw (1), stamped, Sends, 64 bytes, 1 message.
    let mut ctl = Vec::new();
    for w in [0x7061_6472u32, 1, 64, 1] {
        ctl.extend_from_slice(&w.to_le_bytes());
    }
    buf.write_at(16, &ctl).unwrap();
    ep.post_send(&[buf.triplet(16, 16).unwrap()], 2, CompletionFlags::DEFAULT)
        .unwrap();
    let mut echoed = false;
    while !echoed {
        if let rdapl::Event::Dto(d) = next() {
            assert_eq!(d.status, rdapl::DtoStatus::Success, "{d:?}");
            echoed = d.operation == rdapl::DtoOp::Receive;
        }
    }
    ep.post_send(&[buf.triplet(0, 200).unwrap()], 3, CompletionFlags::DEFAULT)
        .unwrap();
    // The server breaks the connection.
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(
            Instant::now() < end,
            "the server did not break the connection"
        );
        if let rdapl::Event::Connection(_) = next() {
            break;
        }
    }
    drop(ep);
    // The next client is served.
    let out = tcp_client_at("127.0.252.9", "127.0.252.6", port_s);
    server.assert_running();
    let err = server.stop();
    assert!(
        out.status.success(),
        "the next client: {}\nthe server: {err}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(err.contains("LocalLength"), "{err}");
}

/// A TCP client `rdapl bw` from `local` of the server at `server`.
fn tcp_client_at(local: &str, server: &str, port: &str) -> std::process::Output {
    rdapl()
        .args(["bw", "-p", "tcp", "-a", local, "-q", port])
        .args(["-S", "64", "-I", "10", "--timeout", "10", server])
        .output()
        .expect("running the client")
}
