//! The library half of the `rdapl` command-line tool.
//!
//! The binary (`src/main.rs`) is a thin `clap` front end; the work lives
//! here so that tests can drive it directly:
//!
//! * [`stress`]: the `evd-stress` harness. Producer threads feed EVDs
//!   through the provider-facing API while a consumer follows the seed's
//!   flow (upcall, disable, poll in a thread, re-enable) in each re-enable
//!   mode, the `Many` policy and the [`rdapl::Poller`]; a checker proves
//!   that every event was seen exactly once, in order, and that nothing hung.
//! * [`demo`]: the main job on the loopback provider: a server and a client
//!   in one process, connection with private data, send/receive, RDMA write
//!   and read, consumed by upcall, poller and wait, every byte checked.
//! * [`info`]: the providers and their attributes (like `fi_info`).
//! * [`perf`]: `pingpong` and `bw` between two endpoints of any provider,
//!   reported as `fi_pingpong` does.
//! * [`rping`]: a peer of rdma-core's `rping`, for interoperability tests
//!   against another RDMA stack (kernel soft-iWARP in `lab/vm/`).
#![deny(unsafe_code)]
#![warn(missing_docs)]

/// Adds the providers this tool is built with beyond the core's (the TCP
/// provider) to the registry `rdapl::Ia::open` uses, once.
pub fn register_providers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rdapl::builtin().register(rdapl_tcp::Tcp::new());
    });
}

/// A client's own IA address when the user names none: the loopback
/// address of the server's family for a server on this host (`127.0.0.1`
/// with no server named, as a server's default is), else any address of
/// its family (`0.0.0.0` or `::`), from which the kernel picks the one
/// that reaches it. A loopback address reaches this host only, and an
/// address of the other family nothing.
pub fn client_addr(server: Option<std::net::IpAddr>) -> std::net::IpAddr {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    match server {
        None => IpAddr::V4(Ipv4Addr::LOCALHOST),
        Some(s) if s.is_loopback() => match s {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        },
        Some(IpAddr::V4(_)) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        Some(IpAddr::V6(_)) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

/// The environment variable that sets how much of the providers' logs
/// the tool prints.
pub const LOG_ENV: &str = "RDAPL_LOG";

/// Sends the providers' logs (the [`tracing`] events of, say, the TCP
/// provider: connections established and ended, Terminates sent and
/// received and why, timeouts, socket errors) to stderr, at the level
/// [`LOG_ENV`] names: `off`, `error`, `warn` (the default), `info`,
/// `debug` or `trace`. An unknown value is said once, and the default
/// kept. Does nothing if the process already has a subscriber.
///
/// [`tracing`]: https://docs.rs/tracing
pub fn init_logs() {
    use tracing_subscriber::filter::LevelFilter;
    let (level, bad) = match std::env::var(LOG_ENV) {
        Err(_) => (LevelFilter::WARN, None),
        Ok(v) => match v.trim().parse::<LevelFilter>() {
            Ok(l) => (l, None),
            Err(_) => (LevelFilter::WARN, Some(v)),
        },
    };
    let _ = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
    if let Some(v) = bad {
        eprintln!(
            "rdapl: {LOG_ENV}={v:?} is not a level (off, error, warn, info, debug, trace): \
             using warn"
        );
    }
}

/// `now` plus `after`, or a time far beyond any run (decades) where the
/// sum is past what an [`std::time::Instant`] holds: an options struct
/// filled by code may give a timeout up to `Duration::MAX`, which is as
/// good as none, never a panic.
pub(crate) fn later(now: std::time::Instant, after: std::time::Duration) -> std::time::Instant {
    const FAR: std::time::Duration = std::time::Duration::from_secs(1 << 30);
    now.checked_add(after)
        .or_else(|| now.checked_add(FAR))
        .unwrap_or(now)
}

/// [`later`] than now.
pub(crate) fn deadline_in(after: std::time::Duration) -> std::time::Instant {
    later(std::time::Instant::now(), after)
}

pub mod demo;
pub mod info;
pub mod perf;
pub mod rping;
pub mod stress;

#[cfg(test)]
mod tests {
    use super::client_addr;

    #[test]
    fn later_never_overflows() {
        use std::time::{Duration, Instant};
        let now = Instant::now();
        assert_eq!(
            super::later(now, Duration::from_secs(5)),
            now + Duration::from_secs(5)
        );
        assert!(super::later(now, Duration::MAX) > now + Duration::from_secs(1 << 29));
    }

    #[test]
    fn a_clients_address_follows_its_servers() {
        let a = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        assert_eq!(client_addr(None), a("127.0.0.1"));
        assert_eq!(client_addr(Some(a("127.0.0.1"))), a("127.0.0.1"));
        assert_eq!(client_addr(Some(a("127.0.9.9"))), a("127.0.0.1"));
        assert_eq!(client_addr(Some(a("::1"))), a("::1"));
        assert_eq!(client_addr(Some(a("192.0.2.7"))), a("0.0.0.0"));
        assert_eq!(client_addr(Some(a("2001:db8::7"))), a("::"));
    }
}
