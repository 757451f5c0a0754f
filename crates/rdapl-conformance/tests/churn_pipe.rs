//! The churn check ([`rdapl_conformance::churn`]) on "pipe", this crate's
//! asynchronous test provider (every request completed on its own
//! thread): objects and connections made and ended hundreds of times
//! leave no heap, descriptor or thread behind. One test: the heap is the
//! process's.

use rdapl::{Ia, IaOptions};
use rdapl_conformance::pipe::Pipe;
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};
use std::alloc::System;

#[global_allocator]
static HEAP: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[test]
fn churn_leaves_nothing_behind() {
    let pipe = Pipe::new();
    let open = |addr: &str| {
        let opts = IaOptions {
            params: format!("addr={addr}"),
            ..Default::default()
        };
        Ia::open_provider(pipe.clone(), opts).unwrap()
    };
    rdapl_conformance::churn::run(open("127.0.230.1"), open("127.0.230.2"), || {
        let s = HEAP.stats();
        s.bytes_allocated as i64 - s.bytes_deallocated as i64
    });
}
