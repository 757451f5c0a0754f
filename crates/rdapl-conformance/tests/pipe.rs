//! The conformance suite on "pipe", this crate's asynchronous test
//! provider (both ends of a connection in this process).

fn main() {
    rdapl_conformance::Suite::new(rdapl_conformance::pipe::Pipe::new())
        .in_process(true)
        .run()
}
