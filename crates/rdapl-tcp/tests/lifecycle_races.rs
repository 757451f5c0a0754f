//! The TCP provider's side of lifecycle races: an application's free,
//! disconnect or close on one thread, a connect, accept or post on
//! another, and the provider's progress thread acting on both. Each case
//! runs its race many times on two threads started together.

mod common;
use common::*;
use rdapl::*;
use rdapl_tcp::Tcp;
use std::sync::{Arc, Barrier};
use std::time::Duration;

/// One test at a time: they count the process's descriptors.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Open descriptors of this process.
fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Raises this process's soft limit of open descriptors toward `want`
/// (no higher than the hard limit); returns the limit then in force.
fn descriptors_for(want: usize) -> usize {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let now = getrlimit(Resource::Nofile);
    let current = now.current.unwrap_or(u64::MAX);
    let maximum = now.maximum.unwrap_or(u64::MAX);
    let target = (want as u64).clamp(current, maximum);
    if target > current {
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(target),
                maximum: now.maximum,
            },
        );
    }
    let got = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
    usize::try_from(got).unwrap_or(usize::MAX)
}

/// Runs `a` here and `b` on another thread at once on `s`.
fn at_once<S: Send + Sync + 'static, A, B: Send + 'static>(
    s: &Arc<S>,
    a: impl FnOnce(&S) -> A,
    b: impl FnOnce(&S) -> B + Send + 'static,
) -> (A, B) {
    let go = Arc::new(Barrier::new(2));
    let t = {
        let (s, go) = (s.clone(), go.clone());
        std::thread::spawn(move || {
            go.wait();
            b(&s)
        })
    };
    go.wait();
    let ra = a(s);
    (ra, t.join().unwrap())
}

/// The connection requests that came to `n`'s CR EVD so far.
fn take_crs(n: &Node, into: &mut Vec<Cr>) {
    while let Some(ev) = n.cr.dequeue().unwrap() {
        match ev {
            // (One cancelled already has no handle.)
            Event::ConnectionRequest(a) => into.extend(n.ia.cr(a.cr).ok()),
            e => panic!("expected a connection request, got {e:?}"),
        }
    }
}

/// How a round withdraws the connect it races.
#[derive(Clone, Copy, Debug)]
enum Withdraw {
    Free,
    Disconnect,
    /// A disconnect, then at once a reset and a connect elsewhere (to a
    /// second service point of the passive side).
    Redirect,
}

/// A connect (no timeout) on one thread, its endpoint's free or
/// disconnect on another, `rounds` times, toward a service point whose
/// consumer never answers. Whenever both succeed, the withdrawal came
/// after the connect and must cancel it (when the withdrawal came first
/// and failed, it is made again after the connect): a while after every
/// withdrawal returned, no request of the active side may still be
/// pending at the passive side, and no socket may be left.
/// Returns (requests still pending a while after every withdrawal,
/// descriptors left, rounds in which both succeeded).
fn connect_withdrawn(base: u8, rounds: usize, how: Withdraw) -> (usize, isize, usize) {
    // `Redirect` holds a round's second connect until the end (its
    // request is refused when it comes, usually a round later): up to
    // four descriptors a round. Taken up to the hard limit (a user's soft
    // limit is often 1,024), or the rounds cut to what fits.
    let rounds = match how {
        Withdraw::Redirect => rounds.min(descriptors_for(4 * rounds + 256).saturating_sub(256) / 4),
        _ => rounds,
    };
    let tcp = Tcp::new();
    let c = Node::new(&tcp, &format!("127.0.254.{base}"), "");
    let s = Node::with(ia(&tcp, &format!("127.0.254.{}", base + 1), ""), 8192);
    let (_psp, qual) = listen(&s.ia, &s.cr);
    let remote = s.ia.address();
    // Where `Redirect` connects once it disconnected.
    let other = ia(&tcp, &format!("127.0.254.{}", base + 1), "");
    let other_cr = other.evd_create(8192, EvdFlags::CR).unwrap();
    let (_psp_b, qual_b) = listen(&other, &other_cr);
    // A first connection and its end, so the thread and its maps exist
    // before the count.
    let warm = c.ep2();
    warm.connect(remote, qual, Some(T), b"").unwrap();
    next_cr(&s.ia, &s.cr).reject(b"").unwrap();
    let _ = conn_ev(&c.conn);
    warm.free().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let before = fds();
    let mut crs = Vec::new();
    let mut kept = Vec::new();
    let mut both = 0;
    let mut events = Vec::new();
    for _ in 0..rounds {
        let ep = Arc::new(c.ep2());
        let (connected, withdrawn) = at_once(
            &ep,
            move |ep| ep.connect(remote, qual, None, b"").is_ok(),
            move |ep| match how {
                Withdraw::Free => ep.free().is_ok(),
                Withdraw::Disconnect => ep.disconnect(false).is_ok(),
                Withdraw::Redirect => {
                    let ok = ep.disconnect(false).is_ok();
                    if ok {
                        ep.reset().unwrap();
                        ep.connect(remote, qual_b, None, b"").unwrap();
                    }
                    ok
                }
            },
        );
        if connected && withdrawn {
            both += 1;
        }
        if connected && !withdrawn {
            // The withdrawal came first (nothing to withdraw yet): it is
            // made now, once the connect returned.
            match how {
                Withdraw::Free => ep.free().unwrap(),
                Withdraw::Disconnect | Withdraw::Redirect => ep.disconnect(false).unwrap(),
            }
        }
        take_crs(&s, &mut crs);
        // The second connects of `Redirect` are refused (their sockets
        // would pile up).
        while let Some(Event::ConnectionRequest(a)) = other_cr.dequeue().unwrap() {
            if let Ok(cr) = other.cr(a.cr) {
                let _ = cr.reject(b"");
            }
        }
        while let Some(e) = c.conn.dequeue().unwrap() {
            events.push(e);
        }
        kept.push(ep);
    }
    // Time for the cancellations to reach the passive side.
    std::thread::sleep(Duration::from_millis(1500));
    take_crs(&s, &mut crs);
    while let Some(e) = c.conn.dequeue().unwrap() {
        events.push(e);
    }
    // One event per withdrawn connect (`Disconnected`); none once freed.
    // (`Redirect`: the second connects end as they may.)
    let expected = match how {
        Withdraw::Free => Some(0),
        Withdraw::Disconnect => Some(rounds),
        Withdraw::Redirect => None,
    };
    if let Some(expected) = expected {
        let odd: Vec<_> = events
            .iter()
            .filter(|e| !matches!(e, Event::Connection(c) if c.kind == ConnectionEventKind::Disconnected))
            .take(3)
            .collect();
        assert!(
            events.len() == expected && odd.is_empty(),
            "{} connection events for {expected} withdrawn connects; others: {odd:?}",
            events.len()
        );
    }
    // A request still pending can be rejected: its connect was never
    // withdrawn.
    let pending = crs.iter().filter(|cr| cr.reject(b"").is_ok()).count();
    std::thread::sleep(Duration::from_millis(500));
    let left = fds() as isize - before as isize;
    if let Withdraw::Disconnect | Withdraw::Redirect = how {
        for ep in kept {
            let _ = ep.free();
        }
    }
    (pending, left, both)
}

/// `Ep::free` racing `Ep::connect`: a connect that the free withdraws
/// leaves no request at the passive side and no socket behind.
#[test]
fn free_racing_connect_withdraws_it() {
    let _serial = serial();
    let (pending, left, both) = connect_withdrawn(1, 2000, Withdraw::Free);
    eprintln!("free/connect: both {both}, pending {pending}, descriptors left {left}");
    assert_eq!(
        pending, 0,
        "requests of freed endpoints still pending ({left} descriptors left)"
    );
    assert!(left <= 2, "{left} descriptors left");
}

/// `Ep::disconnect` racing `Ep::connect`: the same.
#[test]
fn disconnect_racing_connect_withdraws_it() {
    let _serial = serial();
    let (pending, left, both) = connect_withdrawn(3, 2000, Withdraw::Disconnect);
    eprintln!("disconnect/connect: both {both}, pending {pending}, descriptors left {left}");
    assert_eq!(
        pending, 0,
        "requests of disconnected endpoints still pending ({left} descriptors left)"
    );
    assert!(left <= 2, "{left} descriptors left");
}

/// `Ep::disconnect` racing `Ep::connect`, the disconnecting thread then
/// resetting the endpoint and connecting it elsewhere at once: the first
/// connect, withdrawn, is never started on behalf of the second (its
/// request would stay pending at the first service point, or the
/// endpoint be connected where it no longer asked to be).
#[test]
fn connect_withdrawn_then_redirected_is_not_started() {
    let _serial = serial();
    let (pending, left, both) = connect_withdrawn(5, 2000, Withdraw::Redirect);
    eprintln!("redirect/connect: both {both}, pending {pending}, descriptors left {left}");
    assert_eq!(
        pending, 0,
        "requests of withdrawn connects still pending ({left} descriptors left)"
    );
}

/// The same, in order: the disconnect, the reset and the connect
/// elsewhere run in the window after the core let go of the endpoint and
/// before the provider heard of the first connect (the core's test hook).
/// Only the second reaches the passive side, and its outcome is the
/// endpoint's.
#[test]
fn a_withdrawn_connect_is_not_started_after_the_next_one() {
    let _serial = serial();
    let tcp = Tcp::new();
    let c = Node::new(&tcp, "127.0.254.30", "");
    let s = Node::new(&tcp, "127.0.254.31", "");
    let (_psp, qual) = listen(&s.ia, &s.cr);
    let (_psp_b, qual_b) = listen(&s.ia, &s.cr);
    let remote = s.ia.address();
    let ep = c.ep2();
    let again = ep.clone();
    rdapl::ep::test_hooks::CONNECT_GAP.with(|h| {
        *h.borrow_mut() = Some(Box::new(move || {
            again.disconnect(false).unwrap();
            again.reset().unwrap();
            again.connect(remote, qual_b, Some(T), b"second").unwrap();
        }))
    });
    ep.connect(remote, qual, Some(T), b"first").unwrap();
    assert!(
        rdapl::ep::test_hooks::CONNECT_GAP.with(|h| h.borrow().is_none()),
        "the hook ran"
    );
    assert_eq!(conn_kind(&c.conn), ConnectionEventKind::Disconnected);
    let cr = next_cr(&s.ia, &s.cr);
    assert_eq!(
        (cr.conn_qual(), cr.private_data()),
        (qual_b, &b"second"[..]),
        "the first request to come is the second connect's"
    );
    // Time for a late start of the first to reach the passive side.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        s.cr.dequeue().unwrap().is_none(),
        "the withdrawn connect reached the passive side"
    );
    cr.reject(b"no").unwrap();
    let ev = conn_ev(&c.conn);
    assert_eq!(ev.kind, ConnectionEventKind::PeerRejected);
    assert_eq!(ev.private_data.as_deref(), Some(&b"no"[..]));
    assert_eq!(ep.state(), EpState::Disconnected);
    ep.free().unwrap();
}

/// `Cr::accept` racing `Ia::close(Abrupt)` of the passive side: when both
/// succeed, the close came after the accept and ends what the accept
/// began, as a disconnect: the active side sees its request rejected, or
/// `Established` then `Disconnected`, never a connection accepted for an
/// endpoint that was aborted before the provider answered (the active
/// side then sees `Established`, and `Broken` once the aborted endpoint
/// refuses the connection). Returns the active sides' event sequences
/// when both succeeded, counted.
#[test]
fn accept_racing_abrupt_close_of_its_ia() {
    let _serial = serial();
    let tcp = Tcp::new();
    let c = Node::new(&tcp, "127.0.254.7", "");
    let mut seen: std::collections::BTreeMap<String, usize> = Default::default();
    let before = fds();
    for _ in 0..400 {
        let s = Arc::new(Node::new(&tcp, "127.0.254.8", ""));
        let (psp, qual) = listen(&s.ia, &s.cr);
        let ep = c.ep2();
        ep.connect(s.ia.address(), qual, Some(T), b"").unwrap();
        let cr = next_cr(&s.ia, &s.cr);
        let (accepted, closed) = at_once(
            &s,
            move |s| cr.accept(&s.ep, b"").is_ok(),
            |s| s.ia.close(CloseFlags::Abrupt).is_ok(),
        );
        let mut kinds = Vec::new();
        loop {
            let k = conn_kind(&c.conn);
            kinds.push(format!("{k:?}"));
            if k != ConnectionEventKind::Established {
                break;
            }
        }
        if accepted && closed {
            *seen.entry(kinds.join(">")).or_default() += 1;
        }
        ep.free().unwrap();
        drop(psp);
    }
    std::thread::sleep(Duration::from_millis(1500));
    let left = fds() as isize - before as isize;
    eprintln!("accept/close: both succeeded: {seen:?}; descriptors left {left}");
    assert_eq!(
        seen.get("Established>Broken"),
        None,
        "connections accepted for an aborted endpoint"
    );
}

/// `Ia::close(Abrupt)` of the active side racing `Ep::connect`: as a free,
/// the close withdraws the connect; no request stays pending at the
/// passive side, no socket is left.
#[test]
fn abrupt_close_racing_connect_withdraws_it() {
    let _serial = serial();
    let tcp = Tcp::new();
    let s = Node::with(ia(&tcp, "127.0.254.12", ""), 8192);
    let (_psp, qual) = listen(&s.ia, &s.cr);
    let remote = s.ia.address();
    let before = fds();
    let mut crs = Vec::new();
    let mut both = 0;
    for _ in 0..600 {
        let c = Arc::new(Node::new(&tcp, "127.0.254.11", ""));
        let (connected, closed) = at_once(
            &c,
            move |c| c.ep.connect(remote, qual, None, b"").is_ok(),
            |c| c.ia.close(CloseFlags::Abrupt).is_ok(),
        );
        both += usize::from(connected && closed);
        assert!(closed);
        take_crs(&s, &mut crs);
    }
    std::thread::sleep(Duration::from_millis(1500));
    take_crs(&s, &mut crs);
    let pending = crs.iter().filter(|cr| cr.reject(b"").is_ok()).count();
    std::thread::sleep(Duration::from_millis(500));
    let left = fds() as isize - before as isize;
    eprintln!("close/connect: both {both}, pending {pending}, descriptors left {left}");
    assert_eq!(pending, 0, "requests of closed IAs still pending");
    assert!(left <= 2, "{left} descriptors left");
}

/// A connect withdrawn (disconnect or free) while TCP still connects (the
/// peer's accept queue is full, so its SYN waits for a retry), to a peer
/// that then accepts it and says nothing, nor closes: the withdrawn
/// side's socket must close within the linger time, not stay open for as
/// long as the peer stays silent. Returns how many of the `n` withdrawn
/// connects still have their socket open 4 s after the peer accepted.
fn withdrawn_while_connecting(port: u16, n: usize, free: bool) -> usize {
    use std::net::{TcpListener, TcpStream};
    let tcp = Tcp::new();
    let c = Node::new(&tcp, "127.0.254.21", "");
    let peer = "127.0.254.22";
    // A listener with a backlog of one, filled by plain connections.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_reuse_address(true).unwrap();
    sock.bind(
        &format!("{peer}:{port}")
            .parse::<std::net::SocketAddr>()
            .unwrap()
            .into(),
    )
    .unwrap();
    sock.listen(1).unwrap();
    let l: TcpListener = sock.into();
    let fill: Vec<TcpStream> = (0..4)
        .filter_map(|_| {
            let s =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).ok()?;
            s.set_nonblocking(true).ok()?;
            let _ = s.connect(
                &format!("{peer}:{port}")
                    .parse::<std::net::SocketAddr>()
                    .unwrap()
                    .into(),
            );
            Some(s.into())
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let remote: std::net::IpAddr = peer.parse().unwrap();
    let eps: Vec<Ep> = (0..n).map(|_| c.ep2()).collect();
    for ep in &eps {
        ep.connect(remote, u64::from(port), None, b"").unwrap();
    }
    std::thread::sleep(Duration::from_millis(100));
    for ep in &eps {
        if free {
            ep.free().unwrap();
        } else {
            ep.disconnect(false).unwrap();
        }
    }
    // The peer takes everything now (the SYNs' retries get in) and says
    // nothing.
    l.set_nonblocking(true).unwrap();
    let mut held = Vec::new();
    let end = std::time::Instant::now() + Duration::from_secs(4);
    while std::time::Instant::now() < end {
        match l.accept() {
            Ok((s, _)) => held.push(s),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    drop(fill);
    // Accepted sockets whose other end is still open (a read finds
    // neither data nor the end), the filling ones aside.
    let local = c.ia.address();
    let open = held
        .iter()
        .filter(|s| s.peer_addr().is_ok_and(|a| a.ip() == local))
        .filter(|s| {
            s.set_nonblocking(true).unwrap();
            let mut b = [0u8; 4096];
            loop {
                match std::io::Read::read(&mut &**s, &mut b) {
                    Ok(0) => return false,
                    Ok(_) => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
                    Err(_) => return false,
                }
            }
        })
        .count();
    eprintln!(
        "withdrawn while connecting (free {free}): the peer accepted {} of ours, {open} still open",
        held.iter()
            .filter(|s| s.peer_addr().is_ok_and(|a| a.ip() == local))
            .count()
    );
    if !free {
        for ep in eps {
            let _ = ep.free();
        }
    }
    open
}

#[test]
fn connect_withdrawn_while_connecting_closes_its_socket() {
    let _serial = serial();
    let a = withdrawn_while_connecting(19150, 8, false);
    let b = withdrawn_while_connecting(19151, 8, true);
    assert_eq!(
        (a, b),
        (0, 0),
        "withdrawn connects whose socket stays open (disconnect, free)"
    );
}
