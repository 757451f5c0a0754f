//! The conformance suite of rdapl providers on this provider with
//! `complete=sent` (Sends and Writes complete once TCP has them): the cases
//! that assume placement skip, every other one runs as on the default.

fn main() {
    let tcp = rdapl_tcp::Tcp::with_config(rdapl_tcp::TcpConfig {
        complete: rdapl_tcp::Completion::Sent,
        ..Default::default()
    });
    rdapl_conformance::Suite::new(tcp)
        .in_process(false)
        .ia_params("port_base=20000")
        .quick_rnr("recv_wait_ms=20")
        .run()
}
