//! Offset checkpoint files: the parser on arbitrary text, and
//! decode(encode(x)) == x for structured entries (`fjord::fuzzing::checkpoint`,
//! `checkpoint_round_trip`).
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use fjord::types::TopicPartition;
use libfuzzer_sys::fuzz_target;

/// The characters of a legal Kafka topic name.
const TOPIC_CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-";

#[derive(Arbitrary, Debug)]
struct Entry {
    topic: Vec<u8>,
    partition: i32,
    offset: i64,
}

fuzz_target!(|data: &[u8]| {
    fjord::fuzzing::checkpoint(data);
    let mut u = Unstructured::new(data);
    if let Ok(entries) = Vec::<Entry>::arbitrary(&mut u) {
        let entries: Vec<(TopicPartition, i64)> = entries
            .into_iter()
            .map(|e| {
                let topic: String = e
                    .topic
                    .iter()
                    .map(|&b| TOPIC_CHARS[b as usize % TOPIC_CHARS.len()] as char)
                    .collect();
                (TopicPartition::new(topic, e.partition), e.offset)
            })
            .collect();
        fjord::fuzzing::checkpoint_round_trip(&entries);
    }
});
