//! `__transaction_state` keys and values: the parsers on arbitrary bytes,
//! and decode(encode(x)) == x for structured transaction metadata
//! (`fjord::fuzzing::txn_records`, `txn_key_round_trip`,
//! `txn_metadata_round_trip`).
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use fjord::txn::{TxnMetadata, TxnState};
use fjord::types::TopicPartition;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Txn {
    transactional_id: String,
    /// Repeats the id this many times, so that ids past a classic string's
    /// 32767 bytes (which the key encoder must refuse) are reached.
    repeat: u8,
    producer_id: i64,
    producer_epoch: i16,
    timeout_ms: i32,
    state: u8,
    partitions: Vec<(String, i32)>,
    start_ms: i64,
    last_update_ms: i64,
    client_txn_version: i16,
    next_producer_id: Option<i64>,
    pending: bool,
}

/// The eight states, by id.
const STATE_COUNT: u8 = 8;

fuzz_target!(|data: &[u8]| {
    fjord::fuzzing::txn_records(data);
    let mut u = Unstructured::new(data);
    if let Ok(t) = Txn::arbitrary(&mut u) {
        let long_id = t.transactional_id.repeat(usize::from(t.repeat).max(1));
        fjord::fuzzing::txn_key_round_trip(&long_id);
        let state = TxnState::from_id((t.state % STATE_COUNT) as i8).expect("ids 0-7 exist");
        fjord::fuzzing::txn_metadata_round_trip(&TxnMetadata {
            transactional_id: t.transactional_id,
            producer_id: t.producer_id,
            producer_epoch: t.producer_epoch,
            timeout_ms: t.timeout_ms,
            state,
            partitions: t
                .partitions
                .into_iter()
                .map(|(topic, p)| TopicPartition::new(topic, p))
                .collect(),
            start_ms: t.start_ms,
            last_update_ms: t.last_update_ms,
            client_txn_version: t.client_txn_version,
            next_producer_id: t.next_producer_id,
            pending: t.pending,
        });
    }
});
