//! A request frame (length prefix optional) through header parsing and the
//! body decoder of its api key and version: `fjord::fuzzing::request_frame`.
#![no_main]

use libfuzzer_sys::fuzz_target;

// The `fjord` binary's allocator: kafka-protocol sizes a `Vec` from an array
// count read off the wire, and the broker relies on large allocations being
// `MAP_NORESERVE` mappings (src/alloc.rs). Fuzzing with the plain allocator
// would report that known, handled case on the first such input.
#[global_allocator]
static ALLOC: fjord::alloc::BrokerAlloc = fjord::alloc::BrokerAlloc;

fuzz_target!(|data: &[u8]| fjord::fuzzing::request_frame(data));
