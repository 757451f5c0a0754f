//! The helpers of the core's tests: those of the conformance suite
//! (`rdapl_conformance::support`), under the name the tests use.
#![allow(unused_imports)]

pub use rdapl_conformance::support::*;
