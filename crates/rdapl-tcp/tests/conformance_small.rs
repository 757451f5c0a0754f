//! The conformance suite of rdapl providers on this provider with FPDUs of
//! at most 100 bytes and no CRC: every message of more than a few dozen
//! bytes crosses in many DDP segments (a Send's MSN and MO, a Write's and
//! a Read Response's TOs, pads), framed as a path of tiny MSS would frame
//! them, and read back with no CRC to catch a misplaced byte.

fn main() {
    rdapl_conformance::Suite::new(rdapl_tcp::Tcp::new())
        .in_process(false)
        .ia_params("port_base=20000 mss=100 crc=0")
        .quick_rnr("recv_wait_ms=20")
        .run()
}
