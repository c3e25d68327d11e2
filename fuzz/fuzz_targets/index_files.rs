//! `.index`, `.timeindex` and `.txnindex` parsing and lookups:
//! `fjord::fuzzing::index_files`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fjord::fuzzing::index_files(data));
