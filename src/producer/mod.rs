//! Idempotent producers: per-partition producer state (KAFKA_BEHAVIOUR.md §4).
//!
//! For each producer id that wrote to a partition, the partition keeps the
//! producer's epoch and the metadata of its last [`BATCHES_PER_PRODUCER`]
//! batches. A new batch is checked in Kafka's order
//! (`UnifiedLog.analyzeAndValidateProducerState`, `ProducerAppendInfo`):
//! 1. a remembered batch with the same epoch and the same first and last
//!    sequence is a duplicate: it is not written, and the producer is told the
//!    original offsets;
//! 2. a lower epoch than remembered → INVALID_PRODUCER_EPOCH;
//! 3. a higher epoch must start at sequence 0, unless the producer is unknown;
//! 4. the same epoch must continue at `lastSeq + 1` (`i32::MAX` wraps to 0);
//!
//! else OUT_OF_ORDER_SEQUENCE_NUMBER. An unknown producer (never seen, or
//! expired) may start at any sequence.
//!
//! Ownership: a [`ProducerStateTable`] belongs to one partition and so to the
//! shard that owns the partition; it is checked and updated synchronously in
//! the produce path, in the same step that assigns offsets, so no two batches
//! of one producer can interleave between check and update.
//!
//! Durability: the table is rebuilt on start from the newest snapshot
//! ([`snapshot`]) plus a replay of the batches written after it. Snapshots are
//! only taken of a quiescent partition (every appended batch written), so a
//! snapshot never describes data a crash could take back; one whose offset
//! lies beyond the recovered log end is ignored.
//!
//! Limits: idle producers expire after `producer.id.expiration.ms`; a
//! partition tracks at most `producers_max` producers and evicts the least
//! recently used beyond that, so a flood of producer ids cannot exhaust
//! memory (an evicted producer is "unknown" again: its next batch is accepted
//! at any sequence).

pub mod ids;
pub mod snapshot;
pub mod txn_index;

use crate::record::BatchHeader;
use std::collections::{HashMap, VecDeque};

/// A producer's coordinator epoch before any marker (Kafka's
/// `RecordBatch.NO_PARTITION_LEADER_EPOCH`, which it starts entries with).
pub const NO_COORDINATOR_EPOCH: i32 = -1;

/// Batches remembered per producer (Kafka's `NUM_BATCHES_TO_RETAIN`).
pub const BATCHES_PER_PRODUCER: usize = 5;
pub use crate::config::{PRODUCERS_PER_PARTITION_MAX_DEFAULT, PRODUCER_ID_EXPIRATION_MS_DEFAULT};

/// What a producer wrote in one batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchMeta {
    pub first_seq: i32,
    pub last_seq: i32,
    pub first_offset: i64,
    pub last_offset: i64,
    pub max_timestamp: i64,
}

/// One producer's state in one partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProducerEntry {
    pub epoch: i16,
    /// Oldest first, at most [`BATCHES_PER_PRODUCER`], all of `epoch`.
    pub batches: VecDeque<BatchMeta>,
    /// Wall-clock time of the last append (expiry and LRU eviction).
    pub last_update_ms: i64,
    /// First offset of this producer's open transaction on this partition
    /// (a transactional batch was written and no marker yet), if any.
    pub current_txn_first_offset: Option<i64>,
    /// The coordinator epoch of the last transaction marker written for
    /// this producer here (Kafka's `coordinatorEpoch`), -1 before any: a
    /// leader refuses a marker of an older one
    /// ([`ProducerStateTable::coordinator_fenced`]). In producer snapshots
    /// from format version 3 (`snapshot`).
    pub coordinator_epoch: i32,
}

impl ProducerEntry {
    pub fn last_seq(&self) -> Option<i32> {
        self.batches.back().map(|b| b.last_seq)
    }
}

/// Why a batch was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProducerError {
    #[error("producer {producer_id} has epoch {current}, batch has older epoch {batch}")]
    InvalidProducerEpoch {
        producer_id: i64,
        current: i16,
        batch: i16,
    },
    #[error("out of order sequence for producer {producer_id}: expected {expected}, got {got} (epoch {epoch})")]
    OutOfOrderSequence {
        producer_id: i64,
        epoch: i16,
        expected: i32,
        got: i32,
    },
}

/// The verdict on a batch that passed the checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not idempotent, or a valid next batch: append it, then [`ProducerStateTable::record`].
    Append,
    /// Already written: answer with these offsets, write nothing.
    Duplicate(BatchMeta),
}

fn in_sequence(last: i32, next: i32) -> bool {
    next == last.wrapping_add(1) || (last == i32::MAX && next == 0)
}

/// INVALID_PRODUCER_EPOCH for a batch under an older epoch than `entry`'s.
fn epoch_fence(entry: &ProducerEntry, h: &BatchHeader) -> Result<(), ProducerError> {
    if h.producer_epoch < entry.epoch {
        crate::metrics::record_fenced_producer();
        return Err(ProducerError::InvalidProducerEpoch {
            producer_id: h.producer_id,
            current: entry.epoch,
            batch: h.producer_epoch,
        });
    }
    Ok(())
}

/// The producer state of one partition.
#[derive(Debug, Default, Clone)]
pub struct ProducerStateTable {
    producers: HashMap<i64, ProducerEntry>,
    producers_max: usize,
}

impl ProducerStateTable {
    pub fn new(producers_max: usize) -> Self {
        ProducerStateTable {
            producers: HashMap::new(),
            producers_max: producers_max.max(1),
        }
    }

    pub fn len(&self) -> usize {
        self.producers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }

    pub fn get(&self, producer_id: i64) -> Option<&ProducerEntry> {
        self.producers.get(&producer_id)
    }

    pub fn entries(&self) -> impl Iterator<Item = (&i64, &ProducerEntry)> {
        self.producers.iter()
    }

    /// Checks a client batch; nothing changes until [`Self::record`].
    pub fn check(&self, h: &BatchHeader) -> Result<Verdict, ProducerError> {
        if h.producer_id < 0 {
            return Ok(Verdict::Append);
        }
        let Some(entry) = self.producers.get(&h.producer_id) else {
            return Ok(Verdict::Append);
        };
        let (first, last) = (h.base_sequence, h.last_sequence());
        if h.producer_epoch == entry.epoch {
            if let Some(dup) = entry
                .batches
                .iter()
                .find(|b| b.first_seq == first && b.last_seq == last)
            {
                return Ok(Verdict::Duplicate(*dup));
            }
        }
        epoch_fence(entry, h)?;
        if h.producer_epoch > entry.epoch {
            if first != 0 {
                return Err(ProducerError::OutOfOrderSequence {
                    producer_id: h.producer_id,
                    epoch: h.producer_epoch,
                    expected: 0,
                    got: first,
                });
            }
            return Ok(Verdict::Append);
        }
        match entry.last_seq() {
            // Same epoch, no batch remembered (e.g. only markers so far): accept.
            None => Ok(Verdict::Append),
            Some(last_seq) if in_sequence(last_seq, first) => Ok(Verdict::Append),
            Some(last_seq) => Err(ProducerError::OutOfOrderSequence {
                producer_id: h.producer_id,
                epoch: h.producer_epoch,
                expected: last_seq.wrapping_add(1),
                got: first,
            }),
        }
    }

    /// The epoch fence alone (Kafka's `checkProducerEpoch`), for batches
    /// whose sequences are not checked (a coordinator's): a known producer's
    /// batch under an older epoch is refused. Client batches get it as part
    /// of [`Self::check`].
    pub fn check_epoch(&self, h: &BatchHeader) -> Result<(), ProducerError> {
        match self.producers.get(&h.producer_id) {
            Some(entry) if h.producer_id >= 0 => epoch_fence(entry, h),
            _ => Ok(()),
        }
    }

    /// Records an appended batch (also used when replaying the log).
    pub fn record(&mut self, h: &BatchHeader, first_offset: i64, now_ms: i64) {
        if h.producer_id < 0 {
            return;
        }
        let meta = BatchMeta {
            first_seq: h.base_sequence,
            last_seq: h.last_sequence(),
            first_offset,
            last_offset: first_offset + h.last_offset_delta as i64,
            max_timestamp: h.max_timestamp,
        };
        if !self.producers.contains_key(&h.producer_id)
            && self.producers.len() >= self.producers_max
        {
            self.evict_least_recently_used();
        }
        let entry = self
            .producers
            .entry(h.producer_id)
            .or_insert_with(|| ProducerEntry {
                epoch: h.producer_epoch,
                batches: VecDeque::with_capacity(BATCHES_PER_PRODUCER),
                last_update_ms: now_ms,
                current_txn_first_offset: None,
                coordinator_epoch: NO_COORDINATOR_EPOCH,
            });
        if h.producer_epoch != entry.epoch {
            entry.epoch = h.producer_epoch;
            entry.batches.clear();
        }
        if h.is_control() {
            // Markers carry no sequence; they move the epoch and end the
            // producer's open transaction.
            entry.last_update_ms = now_ms;
            entry.current_txn_first_offset = None;
            return;
        }
        if h.is_transactional() && entry.current_txn_first_offset.is_none() {
            entry.current_txn_first_offset = Some(first_offset);
        }
        if entry.batches.len() == BATCHES_PER_PRODUCER {
            entry.batches.pop_front();
        }
        entry.batches.push_back(meta);
        entry.last_update_ms = now_ms;
    }

    /// After [`Self::record`] of a transaction marker written by a
    /// coordinator in `coordinator_epoch`: the producer's coordinator epoch
    /// is the marker's, as Kafka's `ProducerAppendInfo.appendEndTxnMarker`
    /// sets it (also when a replica or a replay records an older one,
    /// which Kafka only logs).
    pub fn set_coordinator_epoch(&mut self, producer_id: i64, coordinator_epoch: i32) {
        if let Some(e) = self.producers.get_mut(&producer_id) {
            e.coordinator_epoch = coordinator_epoch;
        }
    }

    /// Whether a marker for `producer_id` from a coordinator in
    /// `coordinator_epoch` is a zombie's: this partition already took a
    /// marker of a newer coordinator epoch for the producer (Kafka's
    /// `checkCoordinatorEpoch`: TRANSACTION_COORDINATOR_FENCED).
    pub fn coordinator_fenced(&self, producer_id: i64, coordinator_epoch: i32) -> bool {
        self.producers
            .get(&producer_id)
            .is_some_and(|e| e.coordinator_epoch > coordinator_epoch)
    }

    /// The first offset of `producer_id`'s open transaction, if it has one.
    pub fn open_transaction(&self, producer_id: i64) -> Option<i64> {
        self.producers
            .get(&producer_id)
            .and_then(|e| e.current_txn_first_offset)
    }

    /// The first offset of the oldest open transaction on this partition:
    /// the last stable offset, when below the high watermark.
    pub fn first_unstable_offset(&self) -> Option<i64> {
        self.producers
            .values()
            .filter_map(|e| e.current_txn_first_offset)
            .min()
    }

    /// Inserts a whole entry (snapshot loading).
    pub fn insert(&mut self, producer_id: i64, entry: ProducerEntry) {
        self.producers.insert(producer_id, entry);
    }

    /// Drops producers idle for longer than `expiration_ms`; returns how many.
    pub fn expire(&mut self, now_ms: i64, expiration_ms: i64) -> usize {
        let before = self.producers.len();
        // A producer with an open transaction is never expired: its first
        // offset holds the last stable offset back until a marker arrives.
        self.producers.retain(|_, e| {
            e.current_txn_first_offset.is_some()
                || now_ms.saturating_sub(e.last_update_ms) < expiration_ms
        });
        before - self.producers.len()
    }

    fn evict_least_recently_used(&mut self) {
        if let Some((&pid, _)) = self
            .producers
            .iter()
            .filter(|(_, e)| e.current_txn_first_offset.is_none())
            .min_by_key(|(_, e)| e.last_update_ms)
        {
            self.producers.remove(&pid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(pid: i64, epoch: i16, first: i32, count: i32) -> BatchHeader {
        BatchHeader {
            base_offset: 0,
            batch_length: 100,
            partition_leader_epoch: -1,
            magic: 2,
            crc: 0,
            attributes: 0,
            last_offset_delta: count - 1,
            base_timestamp: 0,
            max_timestamp: 0,
            producer_id: pid,
            producer_epoch: epoch,
            base_sequence: first,
            records_count: count,
        }
    }

    /// Appends `h` at `*next` if accepted; returns the answer as Kafka gives it.
    fn produce(
        t: &mut ProducerStateTable,
        next: &mut i64,
        h: BatchHeader,
    ) -> Result<i64, ProducerError> {
        match t.check(&h)? {
            Verdict::Duplicate(b) => Ok(b.first_offset),
            Verdict::Append => {
                let base = *next;
                t.record(&h, base, 0);
                *next += h.offset_count();
                Ok(base)
            }
        }
    }

    #[test]
    fn reproduces_stock_kafka_sequence_output() {
        // KAFKA_BEHAVIOUR.md §4, line by line.
        let mut t = ProducerStateTable::new(10);
        let mut next = 0;
        assert_eq!(produce(&mut t, &mut next, batch(0, 0, 0, 3)), Ok(0));
        assert_eq!(produce(&mut t, &mut next, batch(0, 0, 0, 3)), Ok(0));
        assert!(matches!(
            produce(&mut t, &mut next, batch(0, 0, 5, 1)),
            Err(ProducerError::OutOfOrderSequence {
                expected: 3,
                got: 5,
                ..
            })
        ));
        assert_eq!(produce(&mut t, &mut next, batch(0, 0, 3, 3)), Ok(3));
        for (seq, off) in [(6, 6), (9, 9), (12, 12), (15, 15)] {
            assert_eq!(produce(&mut t, &mut next, batch(0, 0, seq, 3)), Ok(off));
        }
        // Six batches written; the oldest is no longer remembered.
        assert!(matches!(
            produce(&mut t, &mut next, batch(0, 0, 0, 3)),
            Err(ProducerError::OutOfOrderSequence { .. })
        ));
        assert_eq!(next, 18);
    }

    #[test]
    fn epochs() {
        let mut t = ProducerStateTable::new(10);
        let mut next = 0;
        produce(&mut t, &mut next, batch(7, 3, 0, 1)).unwrap();
        assert!(matches!(
            produce(&mut t, &mut next, batch(7, 2, 1, 1)),
            Err(ProducerError::InvalidProducerEpoch {
                current: 3,
                batch: 2,
                ..
            })
        ));
        assert!(matches!(
            produce(&mut t, &mut next, batch(7, 4, 1, 1)),
            Err(ProducerError::OutOfOrderSequence {
                expected: 0,
                got: 1,
                ..
            })
        ));
        assert_eq!(produce(&mut t, &mut next, batch(7, 4, 0, 1)), Ok(1));
        assert_eq!(t.get(7).unwrap().epoch, 4);
    }

    #[test]
    fn unknown_producer_accepts_any_sequence_and_plain_batches_pass() {
        let mut t = ProducerStateTable::new(10);
        let mut next = 0;
        assert_eq!(produce(&mut t, &mut next, batch(9, 0, 42, 2)), Ok(0));
        assert_eq!(produce(&mut t, &mut next, batch(9, 0, 44, 1)), Ok(2));
        assert_eq!(produce(&mut t, &mut next, batch(-1, -1, -1, 5)), Ok(3));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn sequence_wraps_at_i32_max() {
        let mut t = ProducerStateTable::new(10);
        let mut next = 0;
        produce(&mut t, &mut next, batch(1, 0, i32::MAX - 1, 2)).unwrap();
        assert_eq!(t.get(1).unwrap().last_seq(), Some(i32::MAX));
        assert_eq!(produce(&mut t, &mut next, batch(1, 0, 0, 1)), Ok(2));
    }

    #[test]
    fn open_transactions_hold_the_first_unstable_offset() {
        let mut t = ProducerStateTable::new(10);
        let mut txn = batch(5, 0, 0, 3);
        txn.attributes |= 0x10; // transactional
        t.record(&txn, 10, 0);
        let mut more = batch(5, 0, 3, 2);
        more.attributes |= 0x10;
        t.record(&more, 13, 0);
        let mut other = batch(6, 0, 0, 1);
        other.attributes |= 0x10;
        t.record(&other, 15, 0);
        assert_eq!(t.open_transaction(5), Some(10));
        assert_eq!(t.first_unstable_offset(), Some(10));
        let mut marker = batch(5, 1, -1, 1);
        marker.attributes |= 0x30; // transactional + control
        t.record(&marker, 16, 0);
        assert_eq!(t.open_transaction(5), None);
        assert_eq!(t.get(5).unwrap().epoch, 1);
        assert_eq!(t.first_unstable_offset(), Some(15));
        // Open transactions are neither expired nor evicted.
        assert_eq!(t.expire(i64::MAX, 1), 1);
        assert_eq!(t.open_transaction(6), Some(15));
    }

    /// A marker's coordinator epoch is remembered for its producer; one of
    /// an older epoch is fenced, the same or a newer one is not; a producer
    /// without a marker yet fences nothing.
    #[test]
    fn markers_of_an_older_coordinator_epoch_are_fenced() {
        let mut t = ProducerStateTable::new(10);
        assert!(!t.coordinator_fenced(5, 0), "unknown producer");
        let mut txn = batch(5, 0, 0, 1);
        txn.attributes |= 0x10;
        t.record(&txn, 0, 0);
        assert_eq!(t.get(5).unwrap().coordinator_epoch, NO_COORDINATOR_EPOCH);
        assert!(!t.coordinator_fenced(5, 0), "no marker yet");
        let mut marker = batch(5, 0, -1, 1);
        marker.attributes |= 0x30;
        t.record(&marker, 1, 0);
        t.set_coordinator_epoch(5, 3);
        assert_eq!(t.get(5).unwrap().coordinator_epoch, 3);
        assert!(t.coordinator_fenced(5, 2));
        assert!(!t.coordinator_fenced(5, 3));
        assert!(!t.coordinator_fenced(5, 4));
        assert!(!t.coordinator_fenced(6, 0), "another producer");
        // A later data batch, even of a new producer epoch, keeps it.
        let mut next = batch(5, 1, 0, 1);
        next.attributes |= 0x10;
        t.record(&next, 2, 0);
        assert!(t.coordinator_fenced(5, 2));
    }

    #[test]
    fn expiry_and_lru_cap() {
        let mut t = ProducerStateTable::new(2);
        t.record(&batch(1, 0, 0, 1), 0, 100);
        t.record(&batch(2, 0, 0, 1), 1, 200);
        t.record(&batch(3, 0, 0, 1), 2, 300); // evicts producer 1, the least recent
        assert!(t.get(1).is_none() && t.get(2).is_some() && t.get(3).is_some());
        assert_eq!(t.expire(1_250, 1_000), 1); // producer 2 idle for 1050 ms
        assert!(t.get(2).is_none() && t.get(3).is_some());
    }
}
