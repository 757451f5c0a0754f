//! The conformance suite of rdapl providers, on this provider (both ends
//! of every connection in this process).

#[cfg(not(rdapl_loom))]
fn main() {
    rdapl_conformance::Suite::new(rdapl_loopback::Loopback::new())
        .in_process(true)
        .run()
}

#[cfg(rdapl_loom)]
fn main() {}
