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

pub mod demo;
pub mod info;
pub mod perf;
pub mod rping;
pub mod stress;
