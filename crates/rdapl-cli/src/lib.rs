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

pub mod demo;
pub mod info;
pub mod perf;
pub mod rping;
pub mod stress;
