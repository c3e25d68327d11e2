//! A shard: one glommio executor pinned to one core, advertised to clients as
//! its own Kafka node (`node_id * 1000 + shard`, port `port + shard`).
//!
//! [`ShardCtx`] is the shard's state, owned by that shard alone (`Rc`,
//! `RefCell`; nothing here is shared with other threads): the current
//! metadata image, the partitions this shard leads ([`PartitionState`]: log,
//! producer state, aborted transactions), its producer-id block, its group
//! and transaction coordinators, and the router to the other shards. Shard 0
//! also runs the controller ([`controller`]).
//!
//! The partition side of transactions lives here too: markers are appended
//! by [`ShardCtx::write_txn_markers`] (called locally or through the router by
//! a coordinator), which ends the producer's open transaction, records an
//! aborted one in `.txnindex`, and so moves the last stable offset
//! ([`PartitionState::last_stable_offset`]).
//!
//! Metadata flows one way: the controller persists a change, builds a new
//! image and sends it to every shard; each shard opens the logs of partitions
//! it newly owns, deletes those of deleted topics, pushes new configs to its
//! logs, then swaps the image and acks. A controller request therefore
//! completes only when every shard can serve the change, or answers a
//! timeout after `--cross-shard-timeout-ms` when one shard is too slow (the
//! change then reaches that shard later; see `controller`).
//!
//! Every wait for another shard is bounded; [`router`] lists them and what
//! each answers on a timeout.

pub mod controller;
pub mod messages;
pub mod router;

use crate::config::BrokerConfig;
use crate::group::state::GroupConfig;
use crate::group::GroupCoordinator;
use crate::log::{AppendInfo, LogConfig, LogError, LogManager, PartitionLog};
use crate::metadata::{internal, MetadataImage, TopicConfig};
use crate::producer::ids::ProducerIdBlocks;
use crate::producer::txn_index::{self, AbortedTxn, AbortedTxns};
use crate::producer::{snapshot, ProducerStateTable};
use crate::record::records::{parse_control_key, ControlType};
use crate::record::{control_batch, BatchHeader};
use crate::txn::coordinator::TxnCoordinator;
use crate::txn::TxnMarker;
use crate::types::Offset;
use crate::types::TopicPartition;
use bytes::BytesMut;
use futures::channel::oneshot;
use messages::{ControllerError, ControllerReply, ControllerRequest, ShardMessage};
use router::Router;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

/// A partition this shard leads: its log, its producer state and the configs
/// it runs with.
pub struct PartitionState {
    pub tp: TopicPartition,
    pub topic_id: [u8; 16],
    pub log: Rc<PartitionLog>,
    pub config: TopicConfig,
    /// Checked and updated in the same synchronous step as the append.
    pub producers: Rc<RefCell<ProducerStateTable>>,
    /// The log end offset of the last producer snapshot written (-1 = none).
    pub snapshot_offset: Rc<Cell<i64>>,
    /// Aborted transactions (for read_committed fetches).
    pub aborted: Rc<RefCell<AbortedTxns>>,
    /// `.txnindex` appends in flight. No producer snapshot is taken while
    /// any is, nor after one failed (`txn_index_failed`): a snapshot past an
    /// ABORT marker whose entry is not on disk would stop the replay that
    /// re-derives it, and read_committed readers would see aborted data.
    pub txn_index_pending: Rc<Cell<usize>>,
    pub txn_index_failed: Rc<Cell<bool>>,
}

impl PartitionState {
    /// The last stable offset: the first offset of the oldest open
    /// transaction, or the high watermark if that is lower or none is open.
    pub fn last_stable_offset(&self) -> i64 {
        let hw = self.log.high_watermark().0;
        match self.producers.borrow().first_unstable_offset() {
            Some(first) => first.min(hw),
            None => hw,
        }
    }

    /// Appends one validated batch (data or marker) to the log, before the
    /// caller records it in the producer state. If the batch opens a new
    /// segment, the producer state as of its first offset is snapshotted,
    /// as Kafka does at every roll, so recovery replays at most one segment.
    pub fn append(&self, batch: BytesMut) -> Result<AppendInfo, LogError> {
        let allocation_bytes = batch.capacity();
        self.append_from(batch, allocation_bytes)
    }

    /// [`Self::append`] for a batch that is a slice of an allocation of
    /// `allocation_bytes` (a request frame's receive buffer; see
    /// `PartitionLog::append_from`).
    pub fn append_from(
        &self,
        batch: BytesMut,
        allocation_bytes: usize,
    ) -> Result<AppendInfo, LogError> {
        let segments_before = self.log.segment_count();
        let info = self.log.append_from(batch, allocation_bytes)?;
        if self.log.segment_count() > segments_before {
            self.snapshot_at_roll(info.base_offset.0);
        }
        Ok(info)
    }

    /// No producer snapshot while a `.txnindex` append is in flight or after
    /// one failed (see `txn_index_pending`), nor of an empty table.
    fn snapshot_skipped(&self) -> bool {
        self.producers.borrow().is_empty()
            || self.txn_index_pending.get() > 0
            || self.txn_index_failed.get()
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
    /// below `base` is written, so a snapshot never describes batches the
    /// log could lose. Skipped when [`Self::snapshot_skipped`] (the periodic
    /// snapshot catches up).
    fn snapshot_at_roll(&self, base: i64) {
        if self.snapshot_skipped() || base <= self.snapshot_offset.get() {
            return;
        }
        let Some(bytes) = self.encode_snapshot(base) else {
            return;
        };
        let log = self.log.clone();
        let snapshot_offset = self.snapshot_offset.clone();
        let tp = self.tp.clone();
        glommio::spawn_local(async move {
            if base > 0 && log.wait_written(Offset(base - 1)).await.is_err() {
                return; // the log failed: no snapshot past what it holds
            }
            write_snapshot(&log, &tp, &snapshot_offset, base, bytes).await;
        })
        .detach();
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

/// Whether a control batch's (single) record is an ABORT marker.
fn is_abort_marker(batch: &[u8]) -> bool {
    crate::record::decode_batch(batch)
        .ok()
        .and_then(|(_, records)| records.into_iter().next())
        .and_then(|r| r.key)
        .and_then(|k| parse_control_key(&k).ok())
        .is_some_and(|(_, kind)| kind == ControlType::Abort)
}

/// Tries to append one `.txnindex` entry before giving up.
const TXN_INDEX_WRITE_ATTEMPTS: u32 = 3;

/// File growth step of internal-topic partitions (see [`ShardCtx::log_config`]).
pub const INTERNAL_PREALLOCATE_BYTES: u64 = 1024 * 1024;

/// Milliseconds since the Unix epoch, by the wall clock.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The state of one shard. Lives on that shard only.
pub struct ShardCtx {
    pub shard: usize,
    pub config: Arc<BrokerConfig>,
    image: RefCell<Arc<MetadataImage>>,
    pub logs: Rc<LogManager>,
    pub router: Router,
    /// Present on shard 0 only.
    pub controller: Option<controller::Controller>,
    partitions: RefCell<HashMap<TopicPartition, Rc<PartitionState>>>,
    first_image: RefCell<Option<oneshot::Sender<()>>>,
    /// Requests read but not yet answered, on all connections of this shard.
    inflight_requests: Cell<usize>,
    /// Serializes [`ShardCtx::apply_image`].
    apply_lock: glommio::sync::Semaphore,
    /// Producer ids this shard hands out (InitProducerId).
    pub producer_ids: ProducerIdBlocks,
    /// Produce requests appended so far (for the debug fault hook).
    pub produce_count: Cell<u64>,
    /// The transaction coordinator for the `__transaction_state` partitions
    /// this shard leads. (A coordinator above the shard layer held here, so
    /// handlers reach it through the one per-shard context.)
    pub txn: TxnCoordinator,
    /// The groups whose `__consumer_offsets` partition this shard leads.
    pub groups: Rc<GroupCoordinator>,
}

impl ShardCtx {
    /// Builds the context; `first_image` fires once the first metadata image
    /// has been applied (the shard must not serve before that).
    pub fn new(
        shard: usize,
        config: Arc<BrokerConfig>,
        logs: Rc<LogManager>,
        router: Router,
        first_image: oneshot::Sender<()>,
    ) -> Rc<ShardCtx> {
        let controller = (shard == 0).then(|| controller::Controller::new(config.clone()));
        let group_config = GroupConfig {
            initial_rebalance_delay_ms: config.group_initial_rebalance_delay_ms,
            offsets_retention_ms: config.offsets_retention_minutes * 60_000,
            max_size: config.group_max_size,
            ..GroupConfig::default()
        };
        let groups = GroupCoordinator::new(group_config, config.fsync_acks);
        Rc::new(ShardCtx {
            shard,
            config,
            image: RefCell::new(Arc::new(MetadataImage::default())),
            logs,
            router,
            controller,
            partitions: RefCell::new(HashMap::new()),
            first_image: RefCell::new(Some(first_image)),
            inflight_requests: Cell::new(0),
            apply_lock: glommio::sync::Semaphore::new(1),
            producer_ids: ProducerIdBlocks::default(),
            produce_count: Cell::new(0),
            txn: TxnCoordinator::default(),
            groups,
        })
    }

    pub fn cores(&self) -> usize {
        self.config.cores
    }

    pub fn node_id(&self) -> i32 {
        self.config.node_id_of(self.shard)
    }

    pub fn inflight_requests(&self) -> usize {
        self.inflight_requests.get()
    }

    pub fn request_started(&self) {
        self.inflight_requests.set(self.inflight_requests.get() + 1);
    }

    pub fn request_finished(&self) {
        self.inflight_requests
            .set(self.inflight_requests.get().saturating_sub(1));
    }

    /// The current metadata image (cheap to clone, immutable).
    pub fn image(&self) -> Arc<MetadataImage> {
        self.image.borrow().clone()
    }

    /// The partition if this shard leads it.
    pub fn partition(&self, tp: &TopicPartition) -> Option<Rc<PartitionState>> {
        self.partitions.borrow().get(tp).cloned()
    }

    /// Every partition this shard leads.
    pub fn partitions(&self) -> Vec<Rc<PartitionState>> {
        self.partitions.borrow().values().cloned().collect()
    }

    /// The log config a partition of a topic with `tc` runs with. Internal
    /// topics have 50 partitions each and little traffic, so their files
    /// grow in small steps instead of the default preallocation.
    pub fn log_config(&self, tc: &TopicConfig, internal: bool) -> LogConfig {
        let preallocate_bytes = if internal {
            INTERNAL_PREALLOCATE_BYTES
        } else {
            LogConfig::default().preallocate_bytes
        };
        LogConfig {
            preallocate_bytes,
            segment_bytes: tc.segment_bytes,
            segment_ms: tc.segment_ms,
            retention_ms: tc.retention_ms,
            retention_bytes: tc.retention_bytes,
            index_interval_bytes: tc.index_interval_bytes,
            segment_index_bytes: tc.segment_index_bytes,
            flush_messages: tc.flush_messages,
            flush_ms: tc.flush_ms,
            fsync_acks: self.config.fsync_acks,
            direct_writes: self.config.direct_writes,
            catch_up_reads: self.config.catch_up_reads,
            ..LogConfig::default()
        }
    }

    /// Applies a new image: opens logs of partitions this shard now leads,
    /// deletes logs of topics that are gone, updates configs, swaps the image.
    /// Applications are serialized: one that waits on a log open must not
    /// interleave with another, or the second would judge the partitions the
    /// first is opening against a different image.
    pub async fn apply_image(self: &Rc<Self>, image: Arc<MetadataImage>) {
        let Ok(_permit) = self.apply_lock.acquire_permit(1).await else {
            return;
        };
        let old = self.image();
        if image.version < old.version {
            return;
        }
        let cores = self.cores();
        // Topics deleted (or re-created under a new id).
        let gone: Vec<TopicPartition> = self
            .partitions
            .borrow()
            .values()
            .filter(|p| image.topic(&p.tp.topic).is_none_or(|t| t.id != p.topic_id))
            .map(|p| p.tp.clone())
            .collect();
        for tp in gone {
            self.partitions.borrow_mut().remove(&tp);
            if let Err(e) = self.logs.delete(&tp).await {
                tracing::error!(%tp, error = %e, "deleting partition log failed");
            }
        }
        // New partitions and config changes.
        let mut opened_txn_partitions = Vec::new();
        for topic in image.topics.values() {
            let tc = TopicConfig::resolve(&topic.configs, &self.config);
            for (index, &owner) in topic.shards.iter().enumerate() {
                if owner % cores != self.shard {
                    continue;
                }
                let tp = TopicPartition::new(topic.name.clone(), index as i32);
                let existing = self.partition(&tp);
                match existing {
                    Some(p) if p.config == tc => {}
                    Some(p) => {
                        p.log.set_config(self.log_config(&tc, topic.is_internal()));
                        let updated = PartitionState {
                            tp: tp.clone(),
                            topic_id: p.topic_id,
                            log: p.log.clone(),
                            config: tc.clone(),
                            producers: p.producers.clone(),
                            snapshot_offset: p.snapshot_offset.clone(),
                            aborted: p.aborted.clone(),
                            txn_index_pending: p.txn_index_pending.clone(),
                            txn_index_failed: p.txn_index_failed.clone(),
                        };
                        self.partitions.borrow_mut().insert(tp, Rc::new(updated));
                    }
                    None => match self
                        .logs
                        .open_topic(
                            &tp,
                            Some(topic.id),
                            self.log_config(&tc, topic.is_internal()),
                        )
                        .await
                    {
                        Ok(log) => {
                            // A producer state that cannot be rebuilt is not
                            // served (see `rebuild_producers`); the next image
                            // applied tries again.
                            let Ok((producers, snapshot_offset, aborted)) =
                                self.rebuild_producers(&log).await
                            else {
                                continue;
                            };
                            let state = Rc::new(PartitionState {
                                tp: tp.clone(),
                                topic_id: topic.id,
                                log,
                                config: tc.clone(),
                                producers: Rc::new(RefCell::new(producers)),
                                snapshot_offset: Rc::new(Cell::new(snapshot_offset)),
                                aborted: Rc::new(RefCell::new(aborted)),
                                txn_index_pending: Rc::new(Cell::new(0)),
                                txn_index_failed: Rc::new(Cell::new(false)),
                            });
                            self.partitions
                                .borrow_mut()
                                .insert(tp.clone(), state.clone());
                            if tp.topic == internal::TRANSACTION_STATE {
                                opened_txn_partitions.push(state);
                            } else if tp.topic == internal::CONSUMER_OFFSETS {
                                self.groups
                                    .load_partition(tp.partition.0, state.log.clone());
                            }
                        }
                        Err(e) => {
                            tracing::error!(%tp, error = %e, "opening partition log failed");
                        }
                    },
                }
            }
        }
        *self.image.borrow_mut() = image;
        if let Some(tx) = self.first_image.borrow_mut().take() {
            let _ = tx.send(());
        }
        for state in opened_txn_partitions {
            self.txn.load_partition(self, &state).await;
        }
    }

    /// Producer state of a freshly opened log: the newest snapshot at or
    /// below the log end, then every batch written after it. A damaged
    /// snapshot is skipped for an older one or the log start. A replay that
    /// fails (the log cannot be read) is an error: a partial table would
    /// forget producers (their retried batches appended twice) and open
    /// transactions (read_committed readers shown uncommitted data), so the
    /// partition is not served, as Kafka takes a log it cannot load offline.
    async fn rebuild_producers(
        &self,
        log: &Rc<PartitionLog>,
    ) -> Result<(ProducerStateTable, i64, AbortedTxns), LogError> {
        let mut table = ProducerStateTable::new(self.config.producers_per_partition_max);
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
        for e in indexed {
            aborted.add(e);
        }
        let mut derived = Vec::new();
        let (from, snapshot_offset) = match loaded {
            Some((offset, entries)) => {
                for (pid, e) in entries {
                    table.insert(pid, e);
                }
                (offset, offset)
            }
            None => (log.log_start_offset().0, -1),
        };
        let now = now_ms();
        let mut replayed = 0u64;
        let scan = log
            .scan(Offset(from), &mut |h, bytes| {
                // An ABORT marker: re-derive its index entry in case a crash
                // left it unwritten (the index is only an index).
                let aborted_first = (h.is_control() && is_abort_marker(bytes))
                    .then(|| table.open_transaction(h.producer_id))
                    .flatten();
                table.record(h, h.base_offset, now);
                if let Some(first) = aborted_first {
                    derived.push(AbortedTxn {
                        producer_id: h.producer_id,
                        first_offset: first,
                        last_offset: h.base_offset,
                        last_stable_offset: table
                            .first_unstable_offset()
                            .unwrap_or(h.base_offset + 1),
                    });
                }
                replayed += 1;
            })
            .await;
        if let Err(e) = scan {
            tracing::error!(tp = %log.topic_partition(), error = %e, "replaying producer state failed; the partition is not served");
            return Err(e);
        }
        // Entries the replay found missing from the files are written back
        // now: the next snapshot (at a roll or a clean stop) starts past
        // their markers, and a replay from there would not find them again.
        let bases = log.segment_base_offsets();
        let mut unindexed = std::collections::BTreeSet::new();
        for e in derived {
            if aborted.add(e) {
                unindexed.insert(txn_index::segment_of(&bases, e.last_offset));
            }
        }
        if !unindexed.is_empty() {
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
        }
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
        Ok((table, snapshot_offset, aborted))
    }

    /// Appends COMMIT/ABORT markers to partitions this shard leads and
    /// waits until they are written (durable under `--fsync-acks`), as the
    /// coordinator's acks=-1 write. Returns an error code per marker.
    pub async fn write_txn_markers(
        self: &Rc<Self>,
        markers: Vec<TxnMarker>,
    ) -> Vec<(TxnMarker, i16)> {
        let mut waits = Vec::with_capacity(markers.len());
        let mut out = Vec::with_capacity(markers.len());
        for m in markers {
            match self.append_marker(&m) {
                Ok((log, offset)) => waits.push((m, log, offset)),
                Err(code) => out.push((m, code)),
            }
        }
        for (m, log, offset) in waits {
            let written = log.wait_acked(offset, self.config.fsync_acks).await;
            let code = match written {
                Ok(()) => 0,
                Err(e) => {
                    tracing::error!(tp = %m.tp, error = %e, "writing a transaction marker failed");
                    kafka_protocol::ResponseError::KafkaStorageError.code()
                }
            };
            if code == 0 && m.tp.topic == internal::CONSUMER_OFFSETS {
                self.on_offsets_marker(&m);
            }
            out.push((m, code));
        }
        out
    }

    /// Hook for the group coordinator: a marker landed on a
    /// `__consumer_offsets` partition, so the producer's pending
    /// transactional offset commits become visible (COMMIT) or are dropped.
    fn on_offsets_marker(&self, m: &TxnMarker) {
        self.groups
            .complete_transaction(m.tp.partition.0, m.producer_id, m.commit);
    }

    /// Appends one marker now (synchronously, so it orders with produce
    /// appends); returns the log and the marker's offset to wait on.
    fn append_marker(&self, m: &TxnMarker) -> Result<(Rc<PartitionLog>, Offset), i16> {
        use kafka_protocol::ResponseError as E;
        let Some(state) = self.partition(&m.tp) else {
            let known = self
                .image()
                .leader_shard(&m.tp.topic, m.tp.partition.0, self.cores())
                .is_some();
            return Err(if known {
                E::NotLeaderOrFollower
            } else {
                E::UnknownTopicOrPartition
            }
            .code());
        };
        // Version 1 markers carry the producer's epoch; version 2 markers a
        // bumped one, so there an epoch not above the current is stale.
        let current_epoch = state.producers.borrow().get(m.producer_id).map(|e| e.epoch);
        let stale = current_epoch.is_some_and(|e| {
            if m.tv2 {
                m.producer_epoch <= e
            } else {
                m.producer_epoch < e
            }
        });
        if stale {
            return Err(E::InvalidProducerEpoch.code());
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
        let header = BatchHeader::parse(&batch).map_err(|_| E::UnknownServerError.code())?;
        let first = state.producers.borrow().open_transaction(m.producer_id);
        let info = state.append(batch).map_err(|e| {
            tracing::error!(tp = %m.tp, error = %e, "appending a transaction marker failed");
            E::KafkaStorageError.code()
        })?;
        state
            .producers
            .borrow_mut()
            .record(&header, info.base_offset.0, now_ms());
        // Kafka's lastStableOffset of an aborted transaction: the first
        // unstable offset once it is complete.
        let lso = state
            .producers
            .borrow()
            .first_unstable_offset()
            .unwrap_or(info.last_offset.0 + 1);
        if let (false, Some(first)) = (m.commit, first) {
            let entry = AbortedTxn {
                producer_id: m.producer_id,
                first_offset: first,
                last_offset: info.base_offset.0,
                last_stable_offset: lso,
            };
            if state.aborted.borrow_mut().add(entry) {
                let dir = state.log.dir().to_path_buf();
                let segment =
                    txn_index::segment_of(&state.log.segment_base_offsets(), info.base_offset.0);
                let tp = m.tp.clone();
                let (pending, failed) = (
                    state.txn_index_pending.clone(),
                    state.txn_index_failed.clone(),
                );
                pending.set(pending.get() + 1);
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
                        // The replay from the last snapshot still re-derives
                        // the entry; no snapshot is taken from now on.
                        tracing::error!(%tp, error = %e, "writing the .txnindex failed; producer snapshots stop for this partition");
                        failed.set(true);
                    }
                    pending.set(pending.get() - 1);
                })
                .detach();
            }
        }
        Ok((state.log.clone(), info.last_offset))
    }

    /// Asks the controller for a new producer-id block when this shard runs
    /// low; the request runs in the background.
    pub fn maybe_request_producer_ids(self: &Rc<Self>) {
        if !self.producer_ids.should_request() {
            return;
        }
        let ctx = self.clone();
        glommio::spawn_local(async move {
            let block = match ctx
                .invoke_controller(ControllerRequest::AllocateProducerIds)
                .await
            {
                Ok(ControllerReply::ProducerIds(Ok(range))) => Some(range),
                Ok(other) => {
                    tracing::warn!(?other, "no producer id block");
                    None
                }
                Err(e) => {
                    tracing::warn!(error = %e, "no producer id block");
                    None
                }
            };
            ctx.producer_ids.add(block);
        })
        .detach();
    }

    /// Writes a producer snapshot for every partition whose state changed,
    /// if the partition is quiescent (every appended batch written), and
    /// expires idle producers. Run periodically and at shutdown.
    pub async fn maintain_producer_state(&self) {
        let now = now_ms();
        for p in self.partitions() {
            p.producers
                .borrow_mut()
                .expire(now, self.config.producer_id_expiration_ms);
            let log_end = p.log.log_end_offset().0;
            if log_end == p.snapshot_offset.get() || p.snapshot_skipped() {
                continue;
            }
            if p.log.written_offset().0 != log_end {
                continue; // appends in flight: try again next time
            }
            let Some(bytes) = p.encode_snapshot(log_end) else {
                continue;
            };
            write_snapshot(&p.log, &p.tp, &p.snapshot_offset, log_end, bytes).await;
        }
    }

    /// The internal topic `name` (`__consumer_offsets`,
    /// `__transaction_state`), created with its 50 partitions on first use.
    pub async fn ensure_internal_topic(
        self: &Rc<Self>,
        name: &str,
    ) -> Result<Arc<crate::metadata::TopicMeta>, ControllerError> {
        if let Some(t) = self.image().topic(name) {
            return Ok(t.clone());
        }
        let request = ControllerRequest::CreateTopics {
            topics: vec![messages::NewTopic {
                name: name.to_string(),
                num_partitions: internal::INTERNAL_TOPIC_PARTITIONS,
                replication_factor: -1,
                assignments: Vec::new(),
                configs: internal::internal_topic_configs(),
            }],
            validate_only: false,
        };
        let outcome = self.invoke_controller(request).await;
        // A concurrent creation answers TOPIC_ALREADY_EXISTS, and one whose
        // broadcast timed out after this shard applied it TimedOut: either
        // way this shard serves the topic.
        if let Some(t) = self.image().topic(name) {
            return Ok(t.clone());
        }
        match outcome? {
            ControllerReply::Items(items) => match items.into_iter().next() {
                Some((_, Err(e))) => Err(e),
                _ => Err(ControllerError::Unavailable),
            },
            ControllerReply::ProducerIds(_) => Err(ControllerError::Unavailable),
        }
    }

    /// Runs a controller request on shard 0, from any shard, waiting at
    /// most `--cross-shard-timeout-ms` for the answer (see `router`): a
    /// request the controller had not started by then is never applied.
    pub async fn invoke_controller(
        self: &Rc<Self>,
        request: ControllerRequest,
    ) -> Result<ControllerReply, ControllerError> {
        let deadline = self.router.deadline();
        if let Some(controller) = &self.controller {
            // Not cut short from here: the controller bounds its own waits
            // by the deadline and must not be cancelled half-way.
            return controller.handle(self, request, deadline).await;
        }
        let call = self
            .router
            .call(0, deadline, |reply| ShardMessage::Controller {
                request,
                deadline,
                reply,
            });
        match call.await {
            Ok(outcome) => outcome,
            Err(router::CallError::TimedOut(_)) => Err(ControllerError::TimedOut(format!(
                "The controller did not answer within {} ms (--cross-shard-timeout-ms).",
                self.router.timeout().as_millis()
            ))),
            Err(router::CallError::Unreachable(_)) => Err(ControllerError::Unavailable),
        }
    }

    /// Handles one message from another shard. Metadata images are applied
    /// in arrival order before the next message is taken; everything else
    /// runs in its own task, so a slow request (a controller request
    /// waiting for the acks of a slow shard) does not hold up the messages
    /// behind it.
    pub async fn on_message(self: &Rc<Self>, message: ShardMessage) {
        match message {
            ShardMessage::Controller {
                request,
                deadline,
                reply,
            } => {
                if self.controller.is_none() {
                    tracing::error!(
                        shard = self.shard,
                        "controller request at a non-controller shard"
                    );
                    return;
                }
                let ctx = self.clone();
                glommio::spawn_local(async move {
                    if let Some(controller) = &ctx.controller {
                        let outcome = controller.handle(&ctx, request, deadline).await;
                        let _ = reply.send(outcome);
                    }
                })
                .detach();
            }
            ShardMessage::ApplyMetadata { image, reply } => {
                self.apply_image(image).await;
                let _ = reply.send(());
            }
            ShardMessage::AddPartitionsToTxn {
                transactional_id,
                producer_id,
                producer_epoch,
                partitions,
                verify_only,
                reply,
            } => {
                let ctx = self.clone();
                glommio::spawn_local(async move {
                    let r = ctx
                        .txn
                        .add_or_verify(
                            &ctx,
                            &transactional_id,
                            producer_id,
                            producer_epoch,
                            &partitions,
                            verify_only,
                        )
                        .await;
                    let _ = reply.send(r);
                })
                .detach();
            }
            ShardMessage::WriteTxnMarkers { markers, reply } => {
                let ctx = self.clone();
                glommio::spawn_local(async move {
                    let _ = reply.send(ctx.write_txn_markers(markers).await);
                })
                .detach();
            }
        }
    }
}
