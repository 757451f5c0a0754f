//! The churn check (`rdapl_conformance::churn`) on the TCP provider over
//! 127.0.220.1–2: connections and objects made and ended hundreds of
//! times leave no heap, socket or thread behind. One test: the heap is
//! the process's.

mod common;

use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};
use std::alloc::System;

#[global_allocator]
static HEAP: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[test]
fn churn_leaves_nothing_behind() {
    let tcp = rdapl_tcp::Tcp::new();
    let (c, s) = (
        common::ia(&tcp, "127.0.220.1", ""),
        common::ia(&tcp, "127.0.220.2", ""),
    );
    rdapl_conformance::churn::run(c, s, || {
        let s = HEAP.stats();
        s.bytes_allocated as i64 - s.bytes_deallocated as i64
    });
}
