//! The recovery scan of a segment file, its replay and dump-log:
//! `fjord::fuzzing::segment_recovery`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fjord::fuzzing::segment_recovery(data));
