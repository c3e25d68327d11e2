//! Recovery of a partition's producer state when its log is opened: the
//! newest producer snapshot at or below the log end, then every batch
//! written after it, replayed through the same table the appends use.
//! Aborted transactions come from the `.txnindex` files, and every ABORT
//! marker the replay meets re-derives its entry, in case a crash left it
//! unwritten (the index is only an index); entries found missing are
//! written back before the partition is served, because the next snapshot
//! starts past their markers and a replay from there would not find them
//! again.
//!
//! The same code serves a follower: `Partition::append_replica` records each
//! batch of the leader's with the replay's step (`record_replayed`), and
//! `Partition::truncate_to` rebuilds the state of the kept prefix with
//! `recover` (snapshots past the new log end are deleted by the load,
//! `.txnindex` entries past it dropped).
//!
//! A damaged snapshot is skipped for an older one or the log start. A
//! replay that fails (the log cannot be read) is an error: a partial table
//! would forget producers (their retried batches appended twice) and open
//! transactions (read_committed readers shown uncommitted data), so the
//! partition is not served, as Kafka takes a log it cannot load offline.

use super::Partition;
use crate::clock::now_ms;
use crate::log::{LogError, PartitionLog};
use crate::metadata::TopicConfig;
use crate::producer::txn_index::{self, AbortedTxn, AbortedTxns};
use crate::producer::{snapshot, ProducerStateTable};
use crate::record::records::{parse_control_key, parse_marker_value, ControlType};
use crate::types::{Offset, TopicPartition};
use std::rc::Rc;

/// The producer state recovery rebuilt.
pub(super) struct Recovered {
    pub producers: ProducerStateTable,
    /// Offset of the snapshot it started from (-1 = none).
    pub snapshot_offset: i64,
    pub aborted: AbortedTxns,
}

impl Partition {
    /// The partition over a freshly opened `log`, its producer state
    /// recovered (at most `producers_max` producers are tracked).
    pub async fn open(
        tp: TopicPartition,
        topic_id: [u8; 16],
        log: Rc<PartitionLog>,
        config: TopicConfig,
        producers_max: usize,
    ) -> Result<Rc<Partition>, LogError> {
        let recovered = recover(&log, producers_max).await?;
        Ok(Rc::new(Partition::new(
            tp,
            topic_id,
            log,
            config,
            recovered,
            producers_max,
        )))
    }
}

/// Records one batch of the log in `table` as the replay does (and a
/// follower's `append_replica`): a transaction marker (`marker`, see
/// [`marker_of`]) sets its producer's coordinator epoch, and an ABORT
/// marker first takes its producer's open transaction, which it returns
/// as the aborted transaction to index.
pub(super) fn record_replayed(
    table: &mut ProducerStateTable,
    h: &crate::record::BatchHeader,
    marker: Option<Marker>,
    now: i64,
) -> Option<AbortedTxn> {
    let abort = marker.is_some_and(|m| m.abort);
    let aborted_first = (h.is_control() && abort)
        .then(|| table.open_transaction(h.producer_id))
        .flatten();
    table.record(h, h.base_offset, now);
    if let Some(m) = marker.filter(|_| h.is_control() && h.producer_id >= 0) {
        table.set_coordinator_epoch(h.producer_id, m.coordinator_epoch);
    }
    aborted_first.map(|first| AbortedTxn {
        producer_id: h.producer_id,
        first_offset: first,
        last_offset: h.base_offset,
        last_stable_offset: table.first_unstable_offset().unwrap_or(h.base_offset + 1),
    })
}

/// A transaction marker, as a control batch's record holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Marker {
    pub abort: bool,
    /// The coordinator epoch it was written in (-1 when its value does not
    /// parse).
    pub coordinator_epoch: i32,
}

/// The transaction marker a control batch's (single) record is: whether
/// it is an ABORT, and its coordinator epoch; `None` if the batch is not
/// a control batch with a readable key.
pub(super) fn marker_of(batch: &[u8]) -> Option<Marker> {
    let record = crate::record::decode_batch(batch)
        .ok()
        .filter(|(h, _)| h.is_control())
        .and_then(|(_, records)| records.into_iter().next())?;
    let (_, kind) = parse_control_key(record.key.as_deref()?).ok()?;
    let coordinator_epoch = record
        .value
        .as_deref()
        .and_then(|v| parse_marker_value(v).ok())
        .map_or(crate::producer::NO_COORDINATOR_EPOCH, |(_, e)| e);
    Some(Marker {
        abort: kind == ControlType::Abort,
        coordinator_epoch,
    })
}

pub(super) async fn recover(
    log: &Rc<PartitionLog>,
    producers_max: usize,
) -> Result<Recovered, LogError> {
    let mut table = ProducerStateTable::new(producers_max);
    let dir = log.dir().to_path_buf();
    let log_end = log.log_end_offset().0;
    let (loaded, indexed) = glommio::executor()
        .spawn_blocking(move || {
            (
                snapshot::load_newest(&dir, log_end),
                txn_index::load_dir(&dir),
            )
        })
        .await;
    let mut aborted = AbortedTxns::default();
    let stale = indexed.iter().filter(|e| e.last_offset >= log_end).count();
    for e in indexed.into_iter().filter(|e| e.last_offset < log_end) {
        aborted.add(e);
    }
    if stale > 0 {
        drop_stale_entries(log, &aborted, stale).await?;
    }
    let (from, snapshot_offset) = match loaded {
        Some((offset, entries)) => {
            for (pid, e) in entries {
                table.insert(pid, e);
            }
            (offset, offset)
        }
        None => (log.log_start_offset().0, -1),
    };
    let (derived, replayed) = replay(log, from, &mut table).await?;
    write_back_derived(log, &mut aborted, derived).await?;
    aborted.truncate_before(log.log_start_offset().0);
    if replayed > 0 || snapshot_offset >= 0 {
        tracing::info!(
            tp = %log.topic_partition(),
            snapshot_offset,
            replayed_batches = replayed,
            producers = table.len(),
            "producer state rebuilt"
        );
    }
    Ok(Recovered {
        producers: table,
        snapshot_offset,
        aborted,
    })
}

/// Replays every batch from `from` into `table`; returns the aborted
/// transactions its ABORT markers end and the number of batches replayed.
async fn replay(
    log: &PartitionLog,
    from: i64,
    table: &mut ProducerStateTable,
) -> Result<(Vec<AbortedTxn>, u64), LogError> {
    let now = now_ms();
    let mut derived = Vec::new();
    let mut replayed = 0u64;
    let scan = log
        .scan(Offset(from), &mut |h, bytes| {
            let marker = h.is_control().then(|| marker_of(bytes)).flatten();
            derived.extend(record_replayed(table, h, marker, now));
            replayed += 1;
        })
        .await;
    if let Err(e) = scan {
        tracing::error!(tp = %log.topic_partition(), error = %e, "replaying producer state failed; the partition is not served");
        return Err(e);
    }
    Ok((derived, replayed))
}

/// Rewrites the `.txnindex` files without the `stale` entries whose ABORT
/// markers lie at or past the log end: the markers were lost with the tail
/// recovery truncated (a crash or power loss before they were written), so
/// those transactions are still open. Kept, such an entry would tell
/// read_committed readers to drop the transaction's records even after it
/// commits later at a new marker; and the log end may grow past it again,
/// so it must go from the file too, not just from memory. Kafka truncates
/// the transaction index with the log for the same reason. (Found by the
/// simulation (`partition::simulation`): an ABORT marker not yet
/// acknowledged, its `.txnindex` entry written, the marker torn off by a
/// power loss.)
async fn drop_stale_entries(
    log: &PartitionLog,
    kept: &AbortedTxns,
    stale: usize,
) -> Result<(), LogError> {
    let dir = log.dir().to_path_buf();
    let bases = log.segment_base_offsets();
    let all = kept.entries().to_vec();
    glommio::executor()
        .spawn_blocking(move || txn_index::rewrite_all(&dir, &bases, &all))
        .await
        .map_err(|e| {
            tracing::error!(tp = %log.topic_partition(), error = %e, "removing .txnindex entries past the log end failed; the partition is not served");
            LogError::Io(e)
        })?;
    tracing::warn!(tp = %log.topic_partition(), entries = stale,
        "removed aborted-transaction entries whose markers are past the recovered log end");
    Ok(())
}

/// Adds the re-derived aborted transactions to `aborted`, and writes the
/// `.txnindex` of every segment that missed one.
async fn write_back_derived(
    log: &PartitionLog,
    aborted: &mut AbortedTxns,
    derived: Vec<AbortedTxn>,
) -> Result<(), LogError> {
    let bases = log.segment_base_offsets();
    let mut unindexed = std::collections::BTreeSet::new();
    for e in derived {
        if aborted.add(e) {
            unindexed.insert(txn_index::segment_of(&bases, e.last_offset));
        }
    }
    if unindexed.is_empty() {
        return Ok(());
    }
    let dir = log.dir().to_path_buf();
    let all = aborted.entries().to_vec();
    let segments = unindexed.len();
    glommio::executor()
        .spawn_blocking(move || {
            unindexed.into_iter().try_for_each(|base| {
                txn_index::rewrite(&dir, base, &txn_index::of_segment(&all, &bases, base))
            })
        })
        .await
        .map_err(|e| {
            tracing::error!(tp = %log.topic_partition(), error = %e, "writing re-derived .txnindex entries failed; the partition is not served");
            LogError::Io(e)
        })?;
    tracing::info!(tp = %log.topic_partition(), segments, "re-derived aborted transactions written to .txnindex");
    Ok(())
}
