//! The conformance suite of rdapl providers, on this provider: every
//! connection over TCP on 127.0.0.0/8 (the two ends in this process, but
//! knowing of each other only what crosses the wire).

fn main() {
    rdapl_conformance::Suite::new(rdapl_tcp::Tcp::new())
        .in_process(false)
        // The cases' qualifiers (some below 1024) as ports anyone may bind.
        .ia_params("port_base=20000")
        .quick_rnr("recv_wait_ms=20")
        .run()
}
