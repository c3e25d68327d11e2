//! Producer snapshots of a partition (`<offset>.snapshot`, see
//! `producer::snapshot`): taken at every roll, as Kafka does, so recovery
//! replays at most one segment, and periodically by
//! [`Partition::maintain_producer_state`] (and at a clean stop).
//!
//! A snapshot never describes batches the log could lose: one taken at a
//! roll is written once every batch below the roll is written, a periodic
//! one only of a quiescent partition (every appended batch written). None is
//! taken while the partition truncates (`Partition::truncate_to`), nor of an empty table (except at a clean stop:
//! [`Partition::snapshot_at_stop`]), nor while a `.txnindex` append is in
//! flight or after one failed (see `Partition::txn_index`).

use super::Partition;
use crate::clock::now_ms;
use crate::log::PartitionLog;
use crate::producer::snapshot;
use crate::types::{Offset, TopicPartition};
use std::cell::Cell;

impl Partition {
    /// No producer snapshot now (see the module docs).
    fn snapshot_skipped(&self) -> bool {
        self.producers.borrow().is_empty() || self.txn_index_unsettled() || self.truncating.get()
    }

    /// A `.txnindex` append is in flight or one failed: a snapshot now
    /// could start past a marker whose entry is not on disk.
    fn txn_index_unsettled(&self) -> bool {
        self.txn_index.pending.get() > 0 || self.txn_index.failed.get()
    }

    /// The producer state encoded as a snapshot at `offset`.
    fn encode_snapshot(&self, offset: i64) -> Option<Vec<u8>> {
        match snapshot::encode(offset, self.producers.borrow().entries()) {
            Ok(b) => Some(b),
            Err(e) => {
                tracing::error!(tp = %self.tp, error = %e, "encoding producer snapshot failed");
                None
            }
        }
    }

    /// Snapshot at a roll to `base`: the state is captured now (the batch
    /// at `base` is not recorded yet); the file is written once every batch
    /// below `base` is written. Skipped when [`Self::snapshot_skipped`] (the
    /// periodic snapshot catches up).
    pub(super) fn snapshot_at_roll(&self, base: i64) {
        if self.snapshot_skipped() || base <= self.snapshot_offset.get() {
            return;
        }
        let Some(bytes) = self.encode_snapshot(base) else {
            return;
        };
        let log = self.log.clone();
        let snapshot_offset = self.snapshot_offset.clone();
        let tp = self.tp.clone();
        let writes = self.snapshot_writes.clone();
        writes.set(writes.get() + 1);
        glommio::spawn_local(async move {
            // The log failed, or a truncation cut the batches below `base`
            // away: no snapshot past what it holds.
            if base == 0 || log.wait_written(Offset(base - 1)).await.is_ok() {
                write_snapshot(&log, &tp, &snapshot_offset, base, bytes).await;
            }
            writes.set(writes.get() - 1);
        })
        .detach();
    }

    /// Expires producers idle for `expiration_ms`, then writes a snapshot if
    /// the state changed since the last one and the partition is quiescent.
    /// Run periodically (a clean stop runs [`Self::snapshot_at_stop`]).
    pub async fn maintain_producer_state(&self, expiration_ms: i64) {
        self.maintain(expiration_ms, false).await;
    }

    /// [`Self::maintain_producer_state`] at a clean stop: a partition with
    /// data and no producers is snapshotted too (an empty snapshot), so
    /// that the next start, finding the snapshot at the log end, replays
    /// no batch (as Kafka writes a snapshot whenever it closes a log).
    pub async fn snapshot_at_stop(&self, expiration_ms: i64) {
        self.maintain(expiration_ms, true).await;
    }

    async fn maintain(&self, expiration_ms: i64, empty_too: bool) {
        self.producers.borrow_mut().expire(now_ms(), expiration_ms);
        let log_end = self.log.log_end_offset().0;
        if log_end == self.snapshot_offset.get() || log_end == 0 {
            return;
        }
        let empty = self.producers.borrow().is_empty();
        if (empty && !empty_too) || self.txn_index_unsettled() || self.truncating.get() {
            return;
        }
        if self.log.written_offset().0 != log_end {
            return; // appends in flight: try again next time
        }
        let Some(bytes) = self.encode_snapshot(log_end) else {
            return;
        };
        let writes = &self.snapshot_writes;
        writes.set(writes.get() + 1);
        write_snapshot(&self.log, &self.tp, &self.snapshot_offset, log_end, bytes).await;
        writes.set(writes.get() - 1);
    }
}

/// Writes a producer snapshot file off the reactor and records its offset.
async fn write_snapshot(
    log: &PartitionLog,
    tp: &TopicPartition,
    snapshot_offset: &Cell<i64>,
    offset: i64,
    bytes: Vec<u8>,
) {
    let dir = log.dir().to_path_buf();
    let written = glommio::executor()
        .spawn_blocking(move || snapshot::write(&dir, offset, &bytes))
        .await;
    match written {
        Ok(()) => snapshot_offset.set(snapshot_offset.get().max(offset)),
        Err(e) => tracing::error!(%tp, error = %e, "writing producer snapshot failed"),
    }
}
