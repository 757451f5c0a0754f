//! The conformance suite of rdapl providers, on this provider: every
//! connection over TCP on 127.0.0.0/8 (the two ends in this process, but
//! knowing of each other only what crosses the wire).

fn main() {
    rdapl_conformance::Suite::new(rdapl_tcp::Tcp::new())
        .in_process(false)
        .run()
}
