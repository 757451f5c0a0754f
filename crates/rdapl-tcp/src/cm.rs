//! Connection management over TCP: listening sockets, non-blocking
//! connects, and what a failed connect means in DAT terms.
//!
//! * `listen` binds one listening socket per service point, at the IA's
//!   address and the qualifier's port (`SO_REUSEADDR`, so a port in
//!   TIME_WAIT is reusable, but never two listeners on one port:
//!   `ConnQualInUse`).
//! * `connect` binds the IA's address (so the passive side sees it as the
//!   request's remote address), starts a non-blocking connect, and MPA
//!   follows once TCP is up. The MPA Request carries the DAT private data;
//!   the Reply or the reject carries the passive side's.
//! * A TCP connect that fails maps to: `ECONNREFUSED` (nobody listens):
//!   `NonPeerRejected`; no route, unreachable host or network, an address
//!   that cannot be used: `Unreachable`; `ETIMEDOUT` or the consumer's
//!   timeout: `TimedOut`. A connect that fails before it began is logged
//!   (a warning) with its cause: the IA's address of another family than
//!   the peer's, or a loopback one, which reaches this host only; one
//!   that fails later, at `info`, with the socket's error.
//! * A connection whose peer falls silent (the link cut, the host gone)
//!   breaks within the IA's `timeout_ms`: `TCP_USER_TIMEOUT` bounds how
//!   long sent data may stay unacknowledged, and keepalive probes, sent
//!   after half that time of silence, find a dead peer while nothing is
//!   being sent; the connection's watchdog (`conn/liveness.rs`) breaks it
//!   on time where the kernel's timers come round late, and asks an idle
//!   peer itself where keepalive's whole seconds are too coarse. A
//!   process killed on a live host is seen at once (its kernel resets the
//!   connection).

use rdapl::error::Subtype;
use rdapl::{ConnectionEventKind, Error, Result};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};

/// Refuses an IA address that is not this host's (nothing could listen
/// there or connect from it): a socket bound to it says so at once, where
/// a connect would only fail later as `Unreachable`. The unspecified
/// address (any) is this host's. A want of descriptors or memory is the
/// open's error; any other failure is left to `listen` and `connect`.
pub(crate) fn check_local(addr: IpAddr) -> Result<()> {
    let at = SocketAddr::new(addr, 0);
    let not_here = || Error::param(1, "tcp: addr= is not an address of this host");
    let Some(s) = connect_socket(at)? else {
        return Err(not_here());
    };
    match s.bind(&SockAddr::from(at)) {
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::ADDRNOTAVAIL.raw_os_error()) => {
            Err(not_here())
        }
        _ => Ok(()),
    }
}

/// Binds a non-blocking listening socket at `addr:port`.
pub(crate) fn listen(addr: IpAddr, port: u16, qual: u64) -> Result<TcpListener> {
    let sa = SocketAddr::new(addr, port);
    let s = Socket::new(Domain::for_address(sa), Type::STREAM, Some(Protocol::TCP))
        .map_err(|e| Error::Internal(format!("tcp: socket: {e}")))?;
    let _ = s.set_reuse_address(true);
    s.bind(&SockAddr::from(sa)).map_err(|e| match e.kind() {
        io::ErrorKind::AddrInUse => Error::ConnQualInUse(qual),
        io::ErrorKind::AddrNotAvailable => {
            Error::InvalidAddress(rdapl::error::Subtype::InvalidAddressUnreachable)
        }
        _ => Error::Internal(format!("tcp: bind {sa}: {e}")),
    })?;
    s.listen(1024)
        .map_err(|e| Error::Internal(format!("tcp: listen {sa}: {e}")))?;
    s.set_nonblocking(true)
        .map_err(|e| Error::Internal(format!("tcp: nonblocking: {e}")))?;
    Ok(s.into())
}

/// What a failed connect means.
pub(crate) fn connect_error_kind(e: &io::Error) -> ConnectionEventKind {
    match e.kind() {
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset => {
            ConnectionEventKind::NonPeerRejected
        }
        io::ErrorKind::TimedOut => ConnectionEventKind::TimedOut,
        _ => ConnectionEventKind::Unreachable,
    }
}

/// A TCP socket for a connection to `remote`, made in the caller's
/// thread (`dat_ep_connect`): a want of descriptors or memory is then
/// that call's error (`InsufficientResources`), not a connection event.
/// `Ok(None)`: no socket of that family here (the connection is then
/// `Unreachable`, as any other failure before the connect).
pub(crate) fn connect_socket(remote: SocketAddr) -> Result<Option<Socket>> {
    match Socket::new(
        Domain::for_address(remote),
        Type::STREAM,
        Some(Protocol::TCP),
    ) {
        Ok(s) => Ok(Some(s)),
        Err(e) => {
            use rustix::io::Errno;
            let code = e.raw_os_error();
            let is = |x: Errno| code == Some(x.raw_os_error());
            if is(Errno::MFILE) || is(Errno::NFILE) {
                Err(Error::InsufficientResources {
                    resource: Subtype::ResourceTep,
                    what: "tcp: no file descriptor for a socket",
                })
            } else if is(Errno::NOMEM) || is(Errno::NOBUFS) {
                Err(Error::InsufficientResources {
                    resource: Subtype::ResourceMemory,
                    what: "tcp: no memory for a socket",
                })
            } else {
                Ok(None)
            }
        }
    }
}

/// A connect that failed: what the consumer is told, and why, for the
/// log.
#[derive(Debug)]
pub(crate) struct ConnectFailure {
    pub kind: ConnectionEventKind,
    pub why: String,
}

/// Starts a non-blocking connect of `s` from `local` to `remote`.
/// `Ok(stream)` while in progress (or done); `Err` if it failed at once.
pub(crate) fn start_connect(
    s: Option<Socket>,
    local: IpAddr,
    remote: SocketAddr,
    timeout_ms: u64,
) -> std::result::Result<TcpStream, ConnectFailure> {
    let unreachable = |why: String| ConnectFailure {
        kind: ConnectionEventKind::Unreachable,
        why,
    };
    if local.is_ipv4() != remote.is_ipv4() {
        return Err(unreachable(format!(
            "the IA's address {local} and the peer's {} are of different families: \
             open the IA at an address of the peer's family",
            remote.ip()
        )));
    }
    let s = s.ok_or_else(|| unreachable("no socket of the peer's address family here".into()))?;
    s.set_nonblocking(true)
        .map_err(|e| unreachable(format!("a non-blocking socket: {e}")))?;
    let _ = s.set_tcp_nodelay(true);
    set_liveness(&s, timeout_ms).map_err(|e| unreachable(format!("the socket's timeouts: {e}")))?;
    defer_port(&s);
    s.bind(&SockAddr::from(SocketAddr::new(local, 0)))
        .map_err(|e| unreachable(format!("binding the IA's address {local}: {e}")))?;
    match s.connect(&SockAddr::from(remote)) {
        Ok(()) => {}
        Err(e)
            if e.raw_os_error() == Some(rustix::io::Errno::INPROGRESS.raw_os_error())
                || e.kind() == io::ErrorKind::WouldBlock => {}
        Err(e) => {
            return Err(ConnectFailure {
                kind: connect_error_kind(&e),
                why: connect_why(local, remote.ip(), &e),
            });
        }
    }
    Ok(s.into())
}

/// Why a connect from `local` to `remote` failed with `e`. A socket bound
/// to a loopback address reaches this host only (Linux refuses the
/// connect to another with `EINVAL`): said so, with what to do.
fn connect_why(local: IpAddr, remote: IpAddr, e: &io::Error) -> String {
    if local.is_loopback() && !remote.is_loopback() {
        format!(
            "{e}: the IA's address {local} is a loopback address, which reaches this \
             host only; open the IA at an address of this host's that reaches {remote}, \
             or at 0.0.0.0 or :: (any)"
        )
    } else {
        e.to_string()
    }
}

/// Leaves the choice of `s`'s port to its connect (Linux's
/// `IP_BIND_ADDRESS_NO_PORT`): bound to the IA's address with port 0, a
/// socket otherwise takes a port at the bind, which must then differ from
/// every port that address holds, closed connections waiting out TIME_WAIT
/// included. A process that makes many short connections from one address
/// then pays a kernel search that grows with them, and finally finds no
/// port at all; chosen at the connect, a port need only make the
/// four-tuple unique. Where the option is missing, the bind takes the port
/// as before.
fn defer_port(s: &Socket) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        use nix::sys::socket::{setsockopt, sockopt::IpBindAddressNoPort};
        let _ = setsockopt(s, IpBindAddressNoPort, &true);
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = s;
}

/// The outcome of a connect in progress, once the socket is writable:
/// `Ok(true)` connected, `Ok(false)` still going, `Err` failed (with the
/// socket's error).
pub(crate) fn connect_result(s: &TcpStream) -> std::result::Result<bool, ConnectFailure> {
    let failed = |e: io::Error| ConnectFailure {
        kind: connect_error_kind(&e),
        why: e.to_string(),
    };
    match s.take_error() {
        Ok(Some(e)) | Err(e) => Err(failed(e)),
        Ok(None) => match s.peer_addr() {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
            Err(e) => Err(failed(e)),
        },
    }
}

/// Prepares an accepted socket.
pub(crate) fn prepare_accepted(s: &TcpStream, timeout_ms: u64) -> io::Result<()> {
    s.set_nonblocking(true)?;
    s.set_nodelay(true)?;
    set_liveness(&socket2::SockRef::from(s), timeout_ms)
}

/// Bounds how long a silent peer goes unnoticed: `TCP_USER_TIMEOUT` (sent
/// data unacknowledged for `timeout_ms` breaks the connection; with
/// keepalive on, it also bounds the probes) and keepalive probes after
/// half of it idle, one per second or per half of it, whichever is
/// longer ([`keepalive_ms`]). Keepalive counts in whole seconds. The
/// kernel acts on these on its own timers' schedule, late by up to a
/// window probe's period; the connection's watchdog of a silent peer
/// (`conn/liveness.rs`) keeps the bound.
fn set_liveness(s: &Socket, timeout_ms: u64) -> io::Result<()> {
    use std::time::Duration;
    let period = Duration::from_millis(keepalive_ms(timeout_ms));
    s.set_tcp_user_timeout(Some(Duration::from_millis(timeout_ms)))?;
    s.set_tcp_keepalive(
        &socket2::TcpKeepalive::new()
            .with_time(period)
            .with_interval(period)
            .with_retries(2),
    )
}

/// The keepalive period (ms) of a connection whose IA has `timeout_ms`:
/// half of it in whole seconds, at least one.
pub(crate) fn keepalive_ms(timeout_ms: u64) -> u64 {
    (timeout_ms / 2 / 1_000).max(1) * 1_000
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connect that fails at once says why; from a loopback address to
    /// another host's, what to do about it.
    #[test]
    fn an_immediate_failure_says_why() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let einval = || io::Error::from_raw_os_error(rustix::io::Errno::INVAL.raw_os_error());
        let why = connect_why(ip("127.0.0.1"), ip("192.0.2.7"), &einval());
        assert!(
            why.contains("127.0.0.1 is a loopback address") && why.contains("0.0.0.0"),
            "{why}"
        );
        // Between loopback addresses, or from any: the OS's word alone.
        let why = connect_why(ip("127.0.0.1"), ip("127.0.0.2"), &einval());
        assert!(!why.contains("loopback address"), "{why}");
        let why = connect_why(ip("0.0.0.0"), ip("192.0.2.7"), &einval());
        assert!(!why.contains("loopback address"), "{why}");
        // Families that differ: refused before any socket call.
        let remote = SocketAddr::new(ip("::1"), 9);
        let f = start_connect(
            connect_socket(remote).unwrap(),
            ip("127.0.0.1"),
            remote,
            1000,
        )
        .unwrap_err();
        assert_eq!(f.kind, ConnectionEventKind::Unreachable);
        assert!(f.why.contains("different families"), "{}", f.why);
    }
}
