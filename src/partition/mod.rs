//! One partition as the shard that leads it holds it: its log, the
//! producer-state table, the aborted-transaction index and the last stable
//! offset, and the one check → append → record step that every writer
//! takes (Redpanda's `cluster::partition` with its `rm_stm`; Kafka's
//! `UnifiedLog.append` with `analyzeAndValidateProducerState`).
//!
//! Three writers, one step each, all synchronous (no await between the
//! producer-state check, the append that assigns offsets and the record of
//! the batch in the table, so two batches of one producer cannot
//! interleave):
//! - [`Partition::append_data`]: a client's batch (Produce): the full
//!   idempotence check (epoch and sequence; a duplicate is answered with the
//!   original's offsets and not written), recompression to the topic's
//!   `compression.type`, broker timestamps for LogAppendTime topics;
//! - [`Partition::append_control`]: a COMMIT or ABORT marker, refused when
//!   its epoch is stale, ending the producer's open transaction here and
//!   adding an aborted one to the index (and `.txnindex`);
//! - [`Partition::append_internal`]: a coordinator's batch
//!   (`__consumer_offsets`, `__transaction_state`). A batch that carries a
//!   producer (a transactional offset commit) is fenced by its epoch and
//!   recorded like any other, so the table a live broker holds is the one a
//!   replay rebuilds; sequences are not checked, as Kafka skips them for
//!   its coordinators' appends (`AppendOrigin.COORDINATOR`).
//!
//! A fourth step is a follower's, for a replicated partition
//! (docs/replication.md §4.1):
//! - [`Partition::append_replica`]: a batch of the leader's log, appended at
//!   the leader's offsets unchanged (`PartitionLog::append_replica`) and
//!   recorded in the producer-state table exactly as recovery's replay
//!   records a batch (`recovery::record_replayed`): no idempotence or epoch
//!   check (the leader decided), a control batch ends its producer's
//!   transaction, and an ABORT marker adds the aborted transaction to the
//!   index and `.txnindex`. A follower that becomes leader so already holds
//!   every producer's sequences and open transactions.
//! - [`Partition::truncate_to`]: the log truncated (`PartitionLog::
//!   truncate_to`), then the producer state and aborted index rebuilt for
//!   the kept prefix by the recovery code (the newest snapshot at or below
//!   the new end, snapshots past it deleted, the batches after it replayed,
//!   `.txnindex` entries past it dropped).
//!
//! Producer snapshots (see [`snapshots`]) are taken at every roll and
//! periodically; recovery ([`recovery`]) loads the newest snapshot and
//! replays the batches after it.

pub mod compaction;
pub mod coordinator_log;
pub mod recovery;
#[cfg(test)]
mod replication_sim;
#[cfg(test)]
pub(crate) mod simulation;
pub mod snapshots;

use crate::clock::now_ms;
use crate::log::{AppendInfo, LogConfig, LogError, PartitionLog};
use crate::metadata::TopicConfig;
use crate::producer::txn_index::{self, AbortedTxn, AbortedTxns};
use crate::producer::{ProducerError, ProducerStateTable, Verdict};
use crate::record::records::ControlType;
use crate::record::{batch, control_batch, BatchHeader, RecordsError};
use crate::types::{LogEndOffset, Offset, TopicPartition};
use bytes::BytesMut;
use std::cell::{Cell, Ref, RefCell};
use std::rc::Rc;

/// Tries to append one `.txnindex` entry before giving up.
const TXN_INDEX_WRITE_ATTEMPTS: u32 = 3;

/// One marker to write: the end of `producer_id`'s transaction on `tp`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnMarker {
    pub tp: TopicPartition,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub coordinator_epoch: i32,
    pub commit: bool,
    /// Written for a transaction-version-2 client: its marker carries a
    /// bumped epoch, so one whose epoch is not above the producer's current
    /// epoch on the partition is stale (a duplicate) and is refused.
    pub tv2: bool,
}

/// Why an append was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    /// The producer-state check refused the batch.
    #[error(transparent)]
    Producer(#[from] ProducerError),
    /// Recompressing the batch to the topic's codec failed.
    #[error(transparent)]
    Records(#[from] RecordsError),
    /// The log refused or failed the write.
    #[error(transparent)]
    Log(#[from] LogError),
}

/// Why a marker was not written. All but the last two come from the
/// partition's leader, those from the way to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MarkerError {
    #[error("the partition is not in the metadata")]
    UnknownPartition,
    #[error("the shard does not lead the partition (yet)")]
    NotLeader,
    #[error("the marker's producer epoch is stale")]
    StaleEpoch,
    /// Kafka's TRANSACTION_COORDINATOR_FENCED: the partition took a marker
    /// of a newer coordinator epoch for the producer (a zombie coordinator).
    #[error("the marker's coordinator epoch is older than the partition's")]
    CoordinatorFenced,
    /// Kafka's NOT_ENOUGH_REPLICAS: the ISR is below `min.insync.replicas`,
    /// so the marker (an acks=-1 write) was not appended.
    #[error("the partition's ISR is below min.insync.replicas")]
    NotEnoughReplicas,
    /// Kafka's NOT_ENOUGH_REPLICAS_AFTER_APPEND: appended and below the HW,
    /// but the ISR shrank below `min.insync.replicas` meanwhile.
    #[error("the ISR shrank below min.insync.replicas after the marker was appended")]
    NotEnoughReplicasAfterAppend,
    #[error("the marker could not be written")]
    Storage,
    #[error("the partition's shard did not answer in time")]
    TimedOut,
    #[error("the partition's shard is gone")]
    Unreachable,
}

impl MarkerError {
    /// Whether the coordinator should send the marker again: not for a
    /// stale one (the transaction was ended already), nor for a partition
    /// whose topic is gone (the caller checks its own image for that).
    pub fn retriable(self) -> bool {
        !matches!(
            self,
            MarkerError::StaleEpoch | MarkerError::CoordinatorFenced
        )
    }
}

/// What a client batch came to.
#[derive(Debug, Clone, Copy)]
pub enum DataAppend {
    /// Appended; `log_append_time_ms` is the broker timestamp written into
    /// it for LogAppendTime topics (-1 otherwise).
    Appended {
        info: AppendInfo,
        log_append_time_ms: i64,
    },
    /// A retry of a batch already written: not written again; answer with
    /// the original's offsets once they are written.
    Duplicate(AppendInfo),
}

/// A partition this shard leads.
pub struct Partition {
    pub tp: TopicPartition,
    pub topic_id: [u8; 16],
    pub log: Rc<PartitionLog>,
    config: RefCell<TopicConfig>,
    producers: RefCell<ProducerStateTable>,
    /// The log end offset of the last producer snapshot written (-1 = none).
    snapshot_offset: Rc<Cell<i64>>,
    /// Aborted transactions (for read_committed fetches).
    aborted: RefCell<AbortedTxns>,
    txn_index: Rc<TxnIndexWrites>,
    /// The cleaner's first dirty offset (`compaction`).
    first_dirty: Cell<i64>,
    /// Producers the table tracks at most (for the rebuild of a truncation).
    producers_max: usize,
    /// Producer snapshot files being written (`snapshots`): a truncation
    /// waits for them, so none lands past the new log end afterwards.
    snapshot_writes: Rc<Cell<usize>>,
    /// A truncation runs (`truncate_to`): no producer snapshot is taken
    /// until the state is rebuilt (the table describes the cut batches).
    truncating: Cell<bool>,
}

/// `.txnindex` appends in flight. No producer snapshot is taken while any
/// is, nor after one failed: a snapshot past an ABORT marker whose entry is
/// not on disk would stop the replay that re-derives it, and read_committed
/// readers would see aborted data.
#[derive(Default)]
struct TxnIndexWrites {
    pending: Cell<usize>,
    failed: Cell<bool>,
}

impl Partition {
    /// The partition over `log` with the producer state `recovery` rebuilt.
    fn new(
        tp: TopicPartition,
        topic_id: [u8; 16],
        log: Rc<PartitionLog>,
        config: TopicConfig,
        recovered: recovery::Recovered,
        producers_max: usize,
    ) -> Partition {
        Partition {
            tp,
            topic_id,
            log,
            config: RefCell::new(config),
            producers: RefCell::new(recovered.producers),
            snapshot_offset: Rc::new(Cell::new(recovered.snapshot_offset)),
            aborted: RefCell::new(recovered.aborted),
            txn_index: Rc::default(),
            first_dirty: Cell::new(0),
            producers_max,
            snapshot_writes: Rc::default(),
            truncating: Cell::new(false),
        }
    }

    /// A truncation ([`Self::truncate_to`], [`Self::truncate_fully_and_start_at`])
    /// runs: the log refuses appends and `become_leader` until it ends.
    pub fn is_truncating(&self) -> bool {
        self.truncating.get()
    }

    /// The topic configs the partition runs with.
    pub fn config(&self) -> Ref<'_, TopicConfig> {
        self.config.borrow()
    }

    /// Takes new topic configs (and the log config derived from them).
    pub fn set_config(&self, config: TopicConfig, log_config: LogConfig) {
        self.log.set_config(log_config);
        *self.config.borrow_mut() = config;
    }

    /// The producer-state table, to read (DescribeProducers, transaction
    /// bookkeeping). Appends change it only through the writers here.
    pub fn producers(&self) -> Ref<'_, ProducerStateTable> {
        self.producers.borrow()
    }

    /// The last stable offset: the first offset of the oldest open
    /// transaction, or the high watermark if that is lower or none is open.
    pub fn last_stable_offset(&self) -> i64 {
        let hw = self.log.high_watermark().0;
        match self.producers.borrow().first_unstable_offset() {
            Some(first) => first.min(hw),
            None => hw,
        }
    }

    /// The aborted transactions overlapping `[from, to)`: (producer id,
    /// first offset), for a read_committed fetch.
    pub fn aborted_overlapping(&self, from: i64, to: i64) -> Vec<(i64, i64)> {
        self.aborted.borrow().overlapping(from, to)
    }

    /// Drops the aborted transactions wholly below the log start.
    pub fn truncate_aborted_before(&self, log_start: i64) {
        self.aborted.borrow_mut().truncate_before(log_start);
    }

    /// A client's batch (Produce), validated by the caller as a whole
    /// (size, CRC, offsets). `allocation_bytes` is the size of the
    /// allocation `batch` is a slice of (see `PartitionLog::append_from`).
    /// When the topic's codec differs from the batch's, `recompressed` is
    /// the batch already recompressed off the reactor, if it was; else it
    /// is recompressed here, bounded by `decompressed_limit`.
    pub fn append_data(
        &self,
        header: &BatchHeader,
        mut batch: BytesMut,
        mut allocation_bytes: usize,
        recompressed: Option<Result<BytesMut, RecordsError>>,
        decompressed_limit: usize,
    ) -> Result<DataAppend, AppendError> {
        if let Verdict::Duplicate(original) = self.producers.borrow().check(header)? {
            return Ok(DataAppend::Duplicate(AppendInfo {
                base_offset: Offset(original.first_offset),
                last_offset: Offset(original.last_offset),
                log_start_offset: self.log.log_start_offset(),
            }));
        }
        let (codec, log_append_time) = {
            let config = self.config.borrow();
            (config.compression, config.log_append_time)
        };
        if let Some(codec) = codec {
            if header.compression_id() != codec as i16 {
                batch = recompressed.unwrap_or_else(|| {
                    crate::record::recompress_bounded(&batch, codec, decompressed_limit)
                })?;
                allocation_bytes = batch.capacity();
            }
        }
        let mut log_append_time_ms = -1;
        if log_append_time {
            log_append_time_ms = now_ms();
            batch::set_log_append_time(&mut batch, log_append_time_ms);
        }
        let info = self.append_recorded(header, batch, allocation_bytes)?;
        Ok(DataAppend::Appended {
            info,
            log_append_time_ms,
        })
    }

    /// A COMMIT or ABORT marker. Returns the offset to wait on.
    pub fn append_control(&self, m: &TxnMarker) -> Result<Offset, MarkerError> {
        // Version 1 markers carry the producer's epoch; version 2 markers a
        // bumped one, so there an epoch not above the current is stale.
        let current_epoch = self.producers.borrow().get(m.producer_id).map(|e| e.epoch);
        let stale = current_epoch.is_some_and(|e| {
            if m.tv2 {
                m.producer_epoch <= e
            } else {
                m.producer_epoch < e
            }
        });
        if stale {
            return Err(MarkerError::StaleEpoch);
        }
        // Then the coordinator epoch (Kafka's `checkCoordinatorEpoch`): a
        // marker of a coordinator older than one whose marker this
        // partition already took for the producer is a zombie's.
        if self
            .producers
            .borrow()
            .coordinator_fenced(m.producer_id, m.coordinator_epoch)
        {
            return Err(MarkerError::CoordinatorFenced);
        }
        let kind = if m.commit {
            ControlType::Commit
        } else {
            ControlType::Abort
        };
        let batch = control_batch(
            kind,
            m.producer_id,
            m.producer_epoch,
            m.coordinator_epoch,
            now_ms(),
        );
        let header = BatchHeader::parse(&batch).map_err(|_| MarkerError::Storage)?;
        let first = self.producers.borrow().open_transaction(m.producer_id);
        let allocation_bytes = batch.capacity();
        let info = self
            .append_recorded(&header, batch, allocation_bytes)
            .map_err(|e| {
                tracing::error!(tp = %m.tp, error = %e, "appending a transaction marker failed");
                MarkerError::Storage
            })?;
        self.producers
            .borrow_mut()
            .set_coordinator_epoch(m.producer_id, m.coordinator_epoch);
        // Ending the transaction moves the last stable offset now, before
        // the marker is written: read_committed fetch sessions must see it.
        self.log.notify_changed();
        if let (false, Some(first)) = (m.commit, first) {
            // Kafka's lastStableOffset of an aborted transaction: the first
            // unstable offset once it is complete.
            let lso = self
                .producers
                .borrow()
                .first_unstable_offset()
                .unwrap_or(info.last_offset.0 + 1);
            self.index_aborted(AbortedTxn {
                producer_id: m.producer_id,
                first_offset: first,
                last_offset: info.base_offset.0,
                last_stable_offset: lso,
            });
        }
        crate::metrics::record_marker();
        Ok(info.last_offset)
    }

    /// A coordinator's batch on an internal topic. One with a producer id is
    /// fenced by its epoch (INVALID_PRODUCER_EPOCH for a stale one) and
    /// recorded in the table; its sequence is not checked.
    pub fn append_internal(&self, batch: BytesMut) -> Result<AppendInfo, AppendError> {
        let header = BatchHeader::parse(&batch)
            .map_err(|e| AppendError::Log(LogError::Corrupt(e.to_string())))?;
        self.producers.borrow().check_epoch(&header)?;
        let allocation_bytes = batch.capacity();
        Ok(self.append_recorded(&header, batch, allocation_bytes)?)
    }

    /// A batch of the leader's log, as the leader wrote it (see the module
    /// doc): appended at its own offsets, then recorded as recovery's
    /// replay records it. The caller (the replica fetcher) appends the
    /// batches of a fetch answer in order.
    pub fn append_replica(
        &self,
        batch: bytes::Bytes,
        allocation_bytes: usize,
    ) -> Result<AppendInfo, AppendError> {
        let header = BatchHeader::parse(&batch).map_err(LogError::InvalidBatch)?;
        let marker = header
            .is_control()
            .then(|| recovery::marker_of(&batch))
            .flatten();
        let segments_before = self.log.segment_count();
        let info = self.log.append_replica(batch, allocation_bytes)?;
        if self.log.segment_count() > segments_before {
            self.snapshot_at_roll(info.base_offset.0);
        }
        let aborted =
            recovery::record_replayed(&mut self.producers.borrow_mut(), &header, marker, now_ms());
        if header.is_control() {
            // The marker ended a transaction: the LSO may move.
            self.log.notify_changed();
        }
        if let Some(entry) = aborted {
            self.index_aborted(entry);
        }
        Ok(info)
    }

    /// Truncates the log to end at the start of the batch holding `offset`
    /// (`PartitionLog::truncate_to`) and rebuilds the producer state and
    /// the aborted index for what is kept (see the module doc). Returns the
    /// new log end. The caller appends nothing to the partition meanwhile
    /// (the log refuses appends while it truncates; the rebuild replays
    /// whatever the log holds when it runs).
    pub async fn truncate_to(&self, offset: Offset) -> Result<LogEndOffset, LogError> {
        self.truncating.set(true);
        let r = async {
            let before = self.log.log_end_offset();
            if offset.0 >= before.0 {
                // No batch to cut; an empty epoch at the log end may go.
                return self.log.truncate_to(offset).await;
            }
            self.settle_state_files().await;
            let end = self.log.truncate_to(offset).await?;
            self.rebuild_state().await?;
            Ok(end)
        }
        .await;
        self.truncating.set(false);
        r
    }

    /// Kafka's `truncateFullyAndStartAt` for the partition: the log emptied
    /// to start at `offset` (`PartitionLog::truncate_fully_and_start_at`),
    /// the producer state and aborted index emptied with it (recovery of an
    /// empty log).
    pub async fn truncate_fully_and_start_at(
        &self,
        offset: Offset,
    ) -> Result<LogEndOffset, LogError> {
        self.truncating.set(true);
        let r = async {
            self.settle_state_files().await;
            let end = self.log.truncate_fully_and_start_at(offset).await?;
            self.rebuild_state().await?;
            Ok(end)
        }
        .await;
        self.truncating.set(false);
        r
    }

    /// Waits for the `.txnindex` appends and producer snapshot writes in
    /// flight: none may land after a truncation past the new log end (a
    /// stale entry or snapshot would be read as the kept log's later).
    async fn settle_state_files(&self) {
        while self.txn_index.pending.get() > 0 || self.snapshot_writes.get() > 0 {
            glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    /// The producer state and aborted index rebuilt from the log as it is
    /// now, by recovery (snapshots past the log end deleted, `.txnindex`
    /// entries past it dropped).
    async fn rebuild_state(&self) -> Result<(), LogError> {
        self.settle_state_files().await;
        let r = recovery::recover(&self.log, self.producers_max).await?;
        *self.producers.borrow_mut() = r.producers;
        *self.aborted.borrow_mut() = r.aborted;
        self.snapshot_offset.set(r.snapshot_offset);
        let end = self.log.log_end_offset().0;
        if self.first_dirty.get() > end {
            self.first_dirty.set(end);
        }
        self.log.notify_changed();
        Ok(())
    }

    /// The append every writer ends with: the batch goes to the log (with a
    /// producer snapshot when it opens a new segment), then into the table.
    fn append_recorded(
        &self,
        header: &BatchHeader,
        batch: BytesMut,
        allocation_bytes: usize,
    ) -> Result<AppendInfo, LogError> {
        let segments_before = self.log.segment_count();
        let info = self.log.append_from(batch, allocation_bytes)?;
        if self.log.segment_count() > segments_before {
            self.snapshot_at_roll(info.base_offset.0);
        }
        self.producers
            .borrow_mut()
            .record(header, info.base_offset.0, now_ms());
        Ok(info)
    }

    /// Adds an aborted transaction to the index and, in the background, to
    /// its segment's `.txnindex` (retried a few times; on failure producer
    /// snapshots stop, so the replay from the last one re-derives it).
    fn index_aborted(&self, entry: AbortedTxn) {
        if !self.aborted.borrow_mut().add(entry) {
            return;
        }
        let dir = self.log.dir().to_path_buf();
        let segment = txn_index::segment_of(&self.log.segment_base_offsets(), entry.last_offset);
        let tp = self.tp.clone();
        let writes = self.txn_index.clone();
        writes.pending.set(writes.pending.get() + 1);
        glommio::spawn_local(async move {
            let mut result = Ok(());
            for attempt in 0..TXN_INDEX_WRITE_ATTEMPTS {
                if attempt > 0 {
                    glommio::timer::sleep(std::time::Duration::from_millis(100)).await;
                }
                let dir = dir.clone();
                result = glommio::executor()
                    .spawn_blocking(move || txn_index::append(&dir, segment, &entry))
                    .await;
                if result.is_ok() {
                    break;
                }
            }
            if let Err(e) = result {
                tracing::error!(%tp, error = %e, "writing the .txnindex failed; producer snapshots stop for this partition");
                writes.failed.set(true);
            }
            writes.pending.set(writes.pending.get() - 1);
        })
        .detach();
    }
}
