//! Producer-state snapshots: the loader on arbitrary bytes, and
//! encode → view → entries on structured producer tables
//! (`fjord::fuzzing::producer_snapshot`, `snapshot_round_trip`).
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use fjord::producer::{BatchMeta, ProducerEntry};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Batch {
    first_seq: i32,
    last_seq: i32,
    first_offset: i64,
    last_offset: i64,
    max_timestamp: i64,
}

#[derive(Arbitrary, Debug)]
struct Producer {
    producer_id: i64,
    epoch: i16,
    batches: Vec<Batch>,
    last_update_ms: i64,
    current_txn_first_offset: Option<i64>,
    coordinator_epoch: i32,
}

#[derive(Arbitrary, Debug)]
struct Snapshot {
    offset: i64,
    producers: Vec<Producer>,
}

fuzz_target!(|data: &[u8]| {
    fjord::fuzzing::producer_snapshot(data);
    let mut u = Unstructured::new(data);
    if let Ok(s) = Snapshot::arbitrary(&mut u) {
        let entries: Vec<(i64, ProducerEntry)> = s
            .producers
            .into_iter()
            .map(|p| {
                (
                    p.producer_id,
                    ProducerEntry {
                        epoch: p.epoch,
                        batches: p
                            .batches
                            .into_iter()
                            .map(|b| BatchMeta {
                                first_seq: b.first_seq,
                                last_seq: b.last_seq,
                                first_offset: b.first_offset,
                                last_offset: b.last_offset,
                                max_timestamp: b.max_timestamp,
                            })
                            .collect(),
                        last_update_ms: p.last_update_ms,
                        current_txn_first_offset: p.current_txn_first_offset,
                        coordinator_epoch: p.coordinator_epoch,
                    },
                )
            })
            .collect();
        fjord::fuzzing::snapshot_round_trip(s.offset, &entries);
    }
});
