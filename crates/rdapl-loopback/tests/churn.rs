//! The churn check (`rdapl_conformance::churn`) on the loopback provider:
//! objects and connections made and ended hundreds of times leave no heap,
//! descriptor or thread behind. One test: the heap is the process's.

use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};
use std::alloc::System;

#[global_allocator]
static HEAP: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[test]
fn churn_leaves_nothing_behind() {
    let open = rdapl_conformance::support::open;
    rdapl_conformance::churn::run(open("127.0.220.1"), open("127.0.220.2"), || {
        let s = HEAP.stats();
        s.bytes_allocated as i64 - s.bytes_deallocated as i64
    });
}
