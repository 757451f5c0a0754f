#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rdapl_iwarp::fuzzing::fuzz_rdmap_bodies(data));
