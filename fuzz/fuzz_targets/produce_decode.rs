//! fjord's Produce decoder and record-batch validation, decompression and
//! record decoding: `fjord::fuzzing::produce_decode`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fjord::fuzzing::produce_decode(data));
