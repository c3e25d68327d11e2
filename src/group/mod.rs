//! The group coordinator of one shard: the consumer groups whose
//! `__consumer_offsets` partition this shard leads (a group lives in
//! partition `abs(javaHash(group.id)) % 50`, like Kafka), their committed
//! offsets, and the parked JoinGroup / SyncGroup requests waiting on them.
//!
//! Ownership: everything here belongs to the shard that leads the offsets
//! partition; requests for other groups are refused with NOT_COORDINATOR
//! (the client then asks FindCoordinator). Nothing is shared across shards.
//!
//! The log is the state. Every membership change that Kafka persists (a
//! generation's assignment, a group becoming empty, a static member's new
//! id, a deletion) and every offset commit is appended to the partition as
//! records in Kafka's formats ([`records`]) before it is answered; opening
//! the partition replays it ([`GroupCoordinator::load_partition`]), and
//! until the replay finishes the partition's groups answer
//! COORDINATOR_LOAD_IN_PROGRESS. A replay that fails (the log cannot be
//! read, or a record of a known type does not decode) installs nothing: the
//! groups keep answering COORDINATOR_LOAD_IN_PROGRESS and the load is tried
//! again after a backoff ([`LOAD_RETRY_BACKOFF_MS_MIN`] doubling up to
//! [`LOAD_RETRY_BACKOFF_MS_MAX`]). Serving what was replayed before the
//! failure would hand out stale offsets and memberships, and the next write
//! would make them permanent. Records of an unknown type are skipped, as
//! Kafka skips them. Transactional offset commits are written
//! as transactional batches of the producer and stay pending until a
//! COMMIT/ABORT marker for that producer ([`GroupCoordinator::complete_transaction`],
//! and control batches during replay).
//!
//! Two kinds of group share this coordinator, as in Kafka 4.x: classic
//! groups ([`state`]: JoinGroup/SyncGroup) and KIP-848 consumer groups
//! ([`consumer`]: ConsumerGroupHeartbeat, the assignment computed here).
//! A consumer group is a [`state::Group`] whose `consumer` part is set; its
//! offsets live where a classic group's do, so commits, retention,
//! OffsetDelete, DeleteGroups and compaction serve both. Its membership is
//! persisted as Kafka's consumer-group records ([`consumer_records`]),
//! written before the heartbeat that changed it is answered, and replayed
//! with the rest. An empty group of one kind becomes the other kind when a
//! member of the other protocol arrives. A classic group with members is
//! upgraded online by a ConsumerGroupHeartbeat (its members stay, served
//! through the consumer group: a mixed group), and a consumer group whose
//! last consumer-protocol member leaves is downgraded back: see
//! `docs/consumer-groups.md`.
//!
//! Limits: a group has at most `group.max.size` members ([`state`]); ids
//! and names that the records hold as i16-length strings (group id, member
//! and instance ids, client id, protocol type and names) are refused when
//! longer than [`records::RECORD_STRING_BYTES_MAX`]: INVALID_GROUP_ID for a
//! group id, INVALID_REQUEST for the others.
//!
//! Time: the pure machine ([`state`]) takes the time as an argument; a
//! glommio timer task ticks every [`GROUP_TICK_MS`] and calls
//! [`state::Group::poll`], which expires sessions and ends join phases.
//!
//! Boundedness: `__consumer_offsets` is a compacted topic, cleaned by the
//! log cleaner like any other (`partition::compaction`): every record has
//! a key (group metadata, offset commit, consumer-group records), a group
//! or offset that goes is tombstoned, and the replay creates a group or
//! member on the first record it finds of it, in whatever order cleaning
//! left them, so the log holds O(live state) plus tombstones younger than
//! `delete.retention.ms`.

pub mod consumer;
pub mod consumer_protocol;
pub mod consumer_records;
mod cursor;
pub mod error;
pub mod records;
pub mod state;

use crate::clock::now_ms;
use crate::log::{LogError, PartitionLog};
use crate::metadata::{internal, MetadataImage};
use crate::metrics;
use crate::partition::coordinator_log::{CoordinatorLog, CoordinatorWriteError};
use crate::partition::{AppendError, Partition};
use crate::record::batch::{BatchHeader, Compression};
use crate::record::builder::{BatchBuilder, NewRecord};
use crate::record::records::{decode_batch, parse_control_key, ControlType};
use crate::types::{Offset, TopicPartition};
use bytes::Bytes;
use consumer::{
    ClassicJoin, ConsumerGroup, ConsumerGroupConfig, HeartbeatAnswer, HeartbeatRequest,
};
use error::GroupError;
use futures::channel::oneshot;
use records::{GroupMetadataValue, RecordFormatError, RecordKey};
use state::{
    CommittedOffset, Completion, Group, GroupConfig, GroupState, JoinReply, JoinRequest,
    JoinResult, SyncReply,
};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::Duration;

/// How often the timer task polls every group (session expiry, join
/// deadlines). Kafka's timers fire exactly; 100 ms of slack is far below
/// any session timeout (6 s minimum).
pub const GROUP_TICK_MS: u64 = 100;
/// How often expired offsets are looked for (Kafka's
/// `offsets.retention.check.interval.ms` default is 10 minutes; fjord
/// checks every minute, the check is cheap).
pub const OFFSETS_RETENTION_CHECK_INTERVAL_MS: i64 = 60_000;
/// First pause before a failed load of an offsets partition is retried (an
/// I/O error may pass; a corrupt record does not, and is logged again each
/// time).
pub const LOAD_RETRY_BACKOFF_MS_MIN: u64 = 1_000;
/// Longest pause between two load attempts of one partition.
pub const LOAD_RETRY_BACKOFF_MS_MAX: u64 = 60_000;

/// Why replaying an offsets partition failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("reading the log failed: {0}")]
    Log(#[from] LogError),
    #[error("batch at offset {offset}: {reason}")]
    Record { offset: i64, reason: String },
}

impl From<RecordFormatError> for GroupError {
    /// Only reached when an id got past the checks at the door: the
    /// record is not written.
    fn from(e: RecordFormatError) -> GroupError {
        GroupError::InvalidRequest(e.0)
    }
}

/// The refusal for a string that a record cannot hold.
const ID_TOO_LONG: GroupError =
    GroupError::InvalidRequest("an id or name is longer than a group record can hold");

/// A SyncGroup answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncAnswer {
    pub assignment: Bytes,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
}

/// DescribeGroups' view of a group.
#[derive(Debug, Clone)]
pub struct GroupDescription {
    pub state: GroupState,
    pub protocol_type: String,
    pub protocol_name: String,
    /// (member, metadata, assignment)
    pub members: Vec<(state::Member, Bytes, Bytes)>,
}

/// A committed offset to write: topic, partition, value.
pub type OffsetToCommit = (String, i32, CommittedOffset);

/// A consumer-group commit with an older member epoch (`older`, from
/// `Group::validate_offset_commit`) is accepted only if the member has
/// held every partition of it since that epoch (KIP-1251); otherwise the
/// whole request is refused, as Kafka 4.4 refuses it (its per-partition
/// check throws out of the whole commit).
fn check_held_since(
    g: &Group,
    member_id: &str,
    older: Option<i32>,
    offsets: &[OffsetToCommit],
    transactional: bool,
) -> Result<(), GroupError> {
    let Some(epoch) = older else {
        return Ok(());
    };
    match offsets
        .iter()
        .find(|(t, p, _)| !g.committable(member_id, epoch, t, *p))
    {
        None => Ok(()),
        Some((t, p, _)) => {
            tracing::debug!(
                member_id,
                epoch,
                topic = %t,
                partition = p,
                "commit with an older member epoch for a partition not held since"
            );
            Err(consumer::stale_commit_error(transactional))
        }
    }
}

/// The groups of one `__consumer_offsets` partition.
struct OffsetsPartition {
    partition: Rc<Partition>,
    /// The leader epoch this shard took the partition over in (-1 for a
    /// partition of one replica, which never moves).
    epoch: i32,
    loaded: bool,
    groups: HashMap<String, Group>,
}

type JoinWaiter = oneshot::Sender<Result<JoinResult, GroupError>>;
type SyncWaiter = oneshot::Sender<Result<SyncAnswer, GroupError>>;

/// What an operation on a consumer group gave: the offsets partition, the
/// answer, and the records to write before answering.
type ConsumerOp<T> = (i32, Result<T, GroupError>, Vec<(Bytes, Option<Bytes>)>);

/// The shard's group coordinator.
pub struct GroupCoordinator {
    config: GroupConfig,
    consumer_config: ConsumerGroupConfig,
    /// The shard's metadata image, for consumer groups' subscriptions
    /// (set by the shard whenever it swaps its image).
    image: RefCell<Arc<MetadataImage>>,
    /// What appends go through: only the leader writes, and a write is
    /// answered once acknowledged as an acks=all produce is.
    shard: Weak<dyn CoordinatorLog>,
    partitions: RefCell<HashMap<i32, OffsetsPartition>>,
    join_waiters: RefCell<HashMap<(String, String), JoinWaiter>>,
    sync_waiters: RefCell<HashMap<(String, String), SyncWaiter>>,
    ticking: Cell<bool>,
    last_retention_check_ms: Cell<i64>,
    /// Partitions of `__consumer_offsets` (as of the last partition loaded).
    offsets_partitions: Cell<i32>,
}

impl GroupCoordinator {
    pub fn new(
        config: GroupConfig,
        consumer_config: ConsumerGroupConfig,
        shard: Weak<dyn CoordinatorLog>,
    ) -> Rc<GroupCoordinator> {
        Rc::new(GroupCoordinator {
            config,
            consumer_config,
            image: RefCell::new(Arc::new(MetadataImage::default())),
            shard,
            partitions: RefCell::new(HashMap::new()),
            join_waiters: RefCell::new(HashMap::new()),
            sync_waiters: RefCell::new(HashMap::new()),
            ticking: Cell::new(false),
            last_retention_check_ms: Cell::new(0),
            offsets_partitions: Cell::new(internal::INTERNAL_TOPIC_PARTITIONS),
        })
    }

    pub fn config(&self) -> &GroupConfig {
        &self.config
    }

    pub fn consumer_config(&self) -> &ConsumerGroupConfig {
        &self.consumer_config
    }

    /// The shard swapped its metadata image: consumer groups re-resolve
    /// their subscriptions at the next tick.
    pub fn set_image(&self, image: Arc<MetadataImage>) {
        *self.image.borrow_mut() = image;
    }

    /// The offsets partition of `group_id`: the same function of the
    /// topic's partition count as FindCoordinator's
    /// (`metadata::TopicMeta::coordinator`).
    pub fn partition_for(&self, group_id: &str) -> i32 {
        internal::coordinator_partition(group_id, self.offsets_partitions.get())
    }

    /// Whether this shard coordinates `group_id` right now: it holds the
    /// group's offsets partition, has loaded it, and may act as its leader
    /// (`CoordinatorLog::leads`: a node cut off from the metadata quorum
    /// stops before another node takes the partition over).
    pub fn check(&self, group_id: &str) -> Result<i32, GroupError> {
        let p = self.partition_for(group_id);
        match self.partitions.borrow().get(&p) {
            None => return Err(GroupError::NotCoordinator),
            Some(op) if !op.loaded => return Err(GroupError::LoadInProgress),
            Some(_) => {}
        }
        let tp = TopicPartition::new(internal::CONSUMER_OFFSETS, p);
        match self.shard() {
            Ok(shard) if shard.leads(&tp) => Ok(p),
            _ => Err(GroupError::NotCoordinator),
        }
    }

    /// Whether any partition of this shard is still loading.
    pub fn any_loading(&self) -> bool {
        self.partitions.borrow().values().any(|p| !p.loaded)
    }

    /// Takes over an offsets partition this shard now leads, of
    /// `__consumer_offsets` with `partition_count` partitions: its groups
    /// answer COORDINATOR_LOAD_IN_PROGRESS until the replay (run in the
    /// background) has rebuilt them.
    pub fn load_partition(
        self: &Rc<Self>,
        partition: i32,
        partition_count: i32,
        state: Rc<Partition>,
        epoch: i32,
    ) {
        self.offsets_partitions.set(partition_count);
        let log = state.log.clone();
        self.partitions.borrow_mut().insert(
            partition,
            OffsetsPartition {
                partition: state,
                epoch,
                loaded: false,
                groups: HashMap::new(),
            },
        );
        self.start_ticker();
        let me = self.clone();
        glommio::spawn_local(async move {
            let mut backoff_ms = LOAD_RETRY_BACKOFF_MS_MIN;
            loop {
                let now = now_ms();
                let image = me.image.borrow().clone();
                match replay_partition(&log, now, image).await {
                    Ok(groups) => {
                        me.install(partition, &log, epoch, groups, now);
                        return;
                    }
                    Err(e) => tracing::error!(
                        partition,
                        error = %e,
                        retry_in_ms = backoff_ms,
                        "loading a __consumer_offsets partition failed; its groups stay loading"
                    ),
                }
                glommio::timer::sleep(Duration::from_millis(backoff_ms)).await;
                backoff_ms = (backoff_ms * 2).min(LOAD_RETRY_BACKOFF_MS_MAX);
                if !me.is_loading(partition, &log, epoch) {
                    return; // the partition went away or was loaded again
                }
            }
        })
        .detach();
    }

    /// The leader epoch `partition` was taken over in, if this shard
    /// holds it (loaded or loading).
    pub fn held_epoch(&self, partition: i32) -> Option<i32> {
        self.partitions.borrow().get(&partition).map(|op| op.epoch)
    }

    /// Gives up an offsets partition this shard no longer leads (its
    /// leadership moved, `docs/replication.md` §4.6): its groups go, and
    /// the JoinGroup / SyncGroup requests parked on them are answered
    /// NOT_COORDINATOR (the clients look the coordinator up again; the
    /// new leader replays the log). A replay still running for it
    /// installs nothing.
    pub fn unload_partition(&self, partition: i32) {
        let Some(op) = self.partitions.borrow_mut().remove(&partition) else {
            return;
        };
        tracing::info!(
            partition,
            groups = op.groups.len(),
            "offsets partition unloaded"
        );
        let of_partition = |group: &String| self.partition_for(group) == partition;
        for w in drain_where(&self.join_waiters, |(g, _)| of_partition(g)) {
            let _ = w.send(Err(GroupError::NotCoordinator));
        }
        for w in drain_where(&self.sync_waiters, |(g, _)| of_partition(g)) {
            let _ = w.send(Err(GroupError::NotCoordinator));
        }
    }

    /// Whether `partition` still waits for a load of `log` taken over in
    /// `epoch` (a replay begun before the partition was given up and taken
    /// again is stale).
    fn is_loading(&self, partition: i32, log: &Rc<PartitionLog>, epoch: i32) -> bool {
        self.partitions
            .borrow()
            .get(&partition)
            .is_some_and(|op| !op.loaded && op.epoch == epoch && Rc::ptr_eq(&op.partition.log, log))
    }

    /// Serves the groups a replay of `log` rebuilt, if the partition still
    /// waits for them. Groups over `group.max.size` start a rebalance.
    fn install(
        &self,
        partition: i32,
        log: &Rc<PartitionLog>,
        epoch: i32,
        mut groups: HashMap<String, Group>,
        now: i64,
    ) {
        if !self.is_loading(partition, log, epoch) {
            return;
        }
        let mut completions = Vec::new();
        for g in groups.values_mut() {
            if g.rebalance_if_over_capacity(&self.config, now, &mut completions) {
                tracing::info!(
                    group = %g.group_id,
                    members = g.members.len(),
                    max_size = self.config.max_size,
                    "loaded group is over group.max.size; rebalancing"
                );
            }
        }
        // Nothing is parked on a group that was not served yet.
        debug_assert!(completions.is_empty());
        tracing::info!(partition, groups = groups.len(), "offsets partition loaded");
        if let Some(op) = self.partitions.borrow_mut().get_mut(&partition) {
            op.groups = groups;
            op.loaded = true;
        }
    }

    fn start_ticker(self: &Rc<Self>) {
        if self.ticking.replace(true) {
            return;
        }
        let weak: Weak<Self> = Rc::downgrade(self);
        glommio::spawn_local(async move {
            loop {
                glommio::timer::sleep(Duration::from_millis(GROUP_TICK_MS)).await;
                let Some(me) = weak.upgrade() else {
                    return;
                };
                me.tick(now_ms()).await;
            }
        })
        .detach();
    }

    /// One timer tick: polls every group, persists what changed, expires
    /// old offsets, compacts partitions that grew.
    pub async fn tick(self: &Rc<Self>, now: i64) {
        let partitions: Vec<i32> = self.partitions.borrow().keys().copied().collect();
        for p in partitions {
            let mut out = Vec::new();
            let mut writes = Vec::new();
            {
                let mut parts = self.partitions.borrow_mut();
                let Some(op) = parts.get_mut(&p) else {
                    continue;
                };
                if !op.loaded {
                    continue;
                }
                let image = self.image.borrow().clone();
                for g in op.groups.values_mut() {
                    if let Some(c) = g.consumer.as_mut() {
                        let epoch_before = c.group_epoch;
                        for gone in c.poll(&self.consumer_config, &*image, now) {
                            tracing::info!(group = %g.group_id, member = %gone, "consumer group member expired or fenced");
                        }
                        let mut completions = Vec::new();
                        if let Some(ids) = g.maybe_become_classic_group(
                            &self.config,
                            epoch_before,
                            now,
                            &mut completions,
                        ) {
                            tracing::info!(group = %g.group_id, members = g.members.len(), "consumer group downgraded online to a classic group");
                            match downgrade_records(g, &ids) {
                                Ok(recs) => writes.extend(recs),
                                Err(e) => {
                                    tracing::error!(group = %g.group_id, error = %e, "downgrade records not written")
                                }
                            }
                            out.push((g.group_id.clone(), completions, sync_meta(g)));
                            continue;
                        }
                        let c = g.consumer.as_mut().expect("still a consumer group");
                        if c.needs_write() {
                            match consumer_records::take_dirty_records(&g.group_id, c, &image) {
                                Ok(recs) => writes.extend(recs),
                                Err(e) => {
                                    tracing::error!(group = %g.group_id, error = %e, "consumer group records not written")
                                }
                            }
                        }
                        continue;
                    }
                    let mut completions = Vec::new();
                    g.poll(&self.config, now, &mut completions);
                    if g.metadata_dirty {
                        g.metadata_dirty = false;
                        match group_record(g) {
                            Ok(w) => writes.push(w),
                            Err(e) => {
                                tracing::error!(group = %g.group_id, error = %e, "group metadata not written")
                            }
                        }
                    }
                    out.push((g.group_id.clone(), completions, sync_meta(g)));
                }
            }
            for (group, completions, meta) in out {
                self.deliver(&group, completions, &meta);
            }
            if !writes.is_empty() {
                if let Err(e) = self.append(p, writes, None) {
                    tracing::error!(partition = p, error = %e, "writing group metadata failed");
                }
            }
        }
        if now - self.last_retention_check_ms.get() >= OFFSETS_RETENTION_CHECK_INTERVAL_MS {
            self.last_retention_check_ms.set(now);
            self.expire_offsets(now);
        }
    }

    fn expire_offsets(&self, now: i64) {
        let partitions: Vec<i32> = self.partitions.borrow().keys().copied().collect();
        for p in partitions {
            let mut writes = Vec::new();
            {
                let mut parts = self.partitions.borrow_mut();
                let Some(op) = parts.get_mut(&p) else {
                    continue;
                };
                if !op.loaded {
                    continue;
                }
                let mut dead = Vec::new();
                for g in op.groups.values_mut() {
                    // Groups here were let in by the id checks, so their
                    // keys encode; one that did not would stay as it is.
                    for (topic, partition) in g.expired_offsets(&self.config, now) {
                        if let Ok(key) = records::offset_commit_key(&g.group_id, &topic, partition)
                        {
                            g.offsets.remove(&(topic.clone(), partition));
                            writes.push((key, None));
                        }
                    }
                    if g.is(GroupState::Empty)
                        && g.has_no_members()
                        && g.offsets.is_empty()
                        && g.pending_txn_offsets.is_empty()
                        && now - g.state_timestamp_ms >= self.config.offsets_retention_ms
                    {
                        if let Ok(key) = records::group_metadata_key(&g.group_id) {
                            if g.consumer.is_some() {
                                if let Ok(recs) = consumer_records::group_tombstones(&g.group_id) {
                                    writes.extend(recs);
                                }
                            }
                            writes.push((key, None));
                            dead.push(g.group_id.clone());
                        }
                    }
                }
                for id in dead {
                    op.groups.remove(&id);
                }
            }
            if !writes.is_empty() {
                tracing::info!(partition = p, records = writes.len(), "expired offsets");
                if let Err(e) = self.append(p, writes, None) {
                    tracing::error!(partition = p, error = %e, "writing offset tombstones failed");
                }
            }
        }
    }

    /// Routes completions to the parked requests.
    fn deliver(
        &self,
        group: &str,
        completions: Vec<Completion>,
        meta: &(Option<String>, Option<String>),
    ) {
        for c in completions {
            match c {
                Completion::Join { member_id, result } => {
                    if let Some(tx) = self
                        .join_waiters
                        .borrow_mut()
                        .remove(&(group.to_string(), member_id))
                    {
                        let _ = tx.send(result);
                    }
                }
                Completion::Sync { member_id, result } => {
                    if let Some(tx) = self
                        .sync_waiters
                        .borrow_mut()
                        .remove(&(group.to_string(), member_id))
                    {
                        let _ = tx.send(result.map(|assignment| SyncAnswer {
                            assignment,
                            protocol_type: meta.0.clone(),
                            protocol_name: meta.1.clone(),
                        }));
                    }
                }
            }
        }
    }

    /// Appends `recs` (key, value-or-tombstone) as one batch to the offsets
    /// partition; transactional when `txn` = (producer id, epoch). Returns
    /// the log and the batch's last offset to wait on.
    fn append(
        &self,
        partition: i32,
        recs: Vec<(Bytes, Option<Bytes>)>,
        txn: Option<(i64, i16)>,
    ) -> Result<(Rc<PartitionLog>, Offset), GroupError> {
        let state = self
            .partitions
            .borrow()
            .get(&partition)
            .map(|p| p.partition.clone())
            .ok_or(GroupError::NotCoordinator)?;
        // Only the partition's leader appends (a replicated one: with its
        // ISR at `min.insync.replicas`), checked with no await before the
        // append.
        let shard = self.shard()?;
        shard
            .writable(&state.tp)
            .map_err(|e| write_error(&state.tp, e))?;
        let now = now_ms();
        let mut builder = BatchBuilder::new(Compression::None);
        if let Some((pid, epoch)) = txn {
            builder = builder.producer(pid, epoch, -1).transactional(true);
        }
        for (key, value) in recs {
            builder.push(NewRecord {
                key: Some(key),
                value,
                headers: Vec::new(),
                timestamp_ms: now,
            });
        }
        let info = state
            .append_internal(builder.build())
            .map_err(|e| match e {
                AppendError::Producer(_) => GroupError::InvalidProducerEpoch,
                e => GroupError::Storage(e.to_string()),
            })?;
        Ok((state.log.clone(), info.last_offset))
    }

    /// Waits until an appended batch is acknowledged as an acks=all
    /// produce is (written, durable with `--fsync-acks`, below the HW when
    /// replicated: `partition::coordinator_log`); counted as the
    /// request's remote time.
    async fn wait(
        &self,
        partition: i32,
        log: Rc<PartitionLog>,
        last: Offset,
    ) -> Result<(), GroupError> {
        let tp = TopicPartition::new(internal::CONSUMER_OFFSETS, partition);
        let shard = self.shard()?;
        shard
            .acked(&tp, &log, last)
            .await
            .map_err(|e| write_error(&tp, e))
    }

    /// The shard the coordinator writes through (gone only while the
    /// shard shuts down).
    fn shard(&self) -> Result<Rc<dyn CoordinatorLog>, GroupError> {
        self.shard
            .upgrade()
            .ok_or(GroupError::CoordinatorNotAvailable)
    }

    async fn write(
        &self,
        partition: i32,
        recs: Vec<(Bytes, Option<Bytes>)>,
        txn: Option<(i64, i16)>,
    ) -> Result<(), GroupError> {
        let (log, last) = self.append(partition, recs, txn)?;
        self.wait(partition, log, last).await
    }

    /// Runs `f` on the group (created if `create`), then delivers its
    /// completions and persists its membership if it changed.
    fn with_group<T>(
        &self,
        group_id: &str,
        create: bool,
        f: impl FnOnce(&mut Group, &mut Vec<Completion>) -> Result<T, GroupError>,
    ) -> Result<T, GroupError> {
        let p = self.check(group_id)?;
        let mut completions = Vec::new();
        let (result, write, meta) = {
            let mut parts = self.partitions.borrow_mut();
            let op = parts.get_mut(&p).ok_or(GroupError::NotCoordinator)?;
            if !op.groups.contains_key(group_id) {
                if !create {
                    return Err(GroupError::GroupIdNotFound);
                }
                op.groups
                    .insert(group_id.to_string(), Group::new(group_id, now_ms()));
            }
            let Some(g) = op.groups.get_mut(group_id) else {
                return Err(GroupError::GroupIdNotFound);
            };
            let result = f(g, &mut completions);
            if g.is(GroupState::Dead) {
                op.groups.remove(group_id);
                return result;
            }
            let write = if g.metadata_dirty {
                g.metadata_dirty = false;
                match group_record(g) {
                    Ok(w) => Some(w),
                    Err(e) => {
                        tracing::error!(group = group_id, error = %e, "group metadata not written");
                        None
                    }
                }
            } else {
                None
            };
            (result, write, sync_meta(g))
        };
        self.deliver(group_id, completions, &meta);
        if let Some(w) = write {
            if let Err(e) = self.append(p, vec![w], None) {
                tracing::error!(group = group_id, error = %e, "writing group metadata failed");
            }
        }
        result
    }

    /// Runs `f` on the group's consumer part if the group is a consumer
    /// group (with members, when `with_members`), and takes the records
    /// of what changed, also when `f` refused (a refusal may still have
    /// changed the group). None: the group is not such a consumer group.
    fn with_consumer_group<T>(
        &self,
        group_id: &str,
        with_members: bool,
        f: impl FnOnce(&mut ConsumerGroup, &MetadataImage) -> Result<T, GroupError>,
    ) -> Option<ConsumerOp<T>> {
        let p = self.check(group_id).ok()?;
        let image = self.image.borrow().clone();
        let mut parts = self.partitions.borrow_mut();
        let g = parts.get_mut(&p)?.groups.get_mut(group_id)?;
        let c = g.consumer.as_mut()?;
        if with_members && c.is_empty() {
            return None;
        }
        let result = f(c, &image);
        let recs = if c.needs_write() {
            match consumer_records::take_dirty_records(group_id, c, &image) {
                Ok(recs) => recs,
                Err(e) => return Some((p, Err(e.into()), Vec::new())),
            }
        } else {
            Vec::new()
        };
        Some((p, result, recs))
    }

    /// Writes what [`Self::with_consumer_group`] returned, then answers.
    async fn finish_consumer_op<T>(
        &self,
        (p, result, recs): ConsumerOp<T>,
    ) -> Result<T, GroupError> {
        if !recs.is_empty() {
            self.write(p, recs, None).await?;
        }
        result
    }

    /// JoinGroup: answers at once, or parks until the join phase ends.
    pub async fn join(
        &self,
        group_id: &str,
        mut req: JoinRequest,
    ) -> Result<JoinResult, GroupError> {
        check_group_id(group_id)?;
        let too_long = |s: &str| !records::fits(s);
        if req.group_instance_id.as_deref().is_some_and(too_long)
            || too_long(&req.client_id)
            || too_long(&req.client_host)
            || too_long(&req.protocol_type)
            || req.protocols.iter().any(|(name, _)| too_long(name))
        {
            return Err(ID_TOO_LONG);
        }
        let prefix = req
            .group_instance_id
            .clone()
            .unwrap_or_else(|| req.client_id.clone());
        req.new_member_id = format!(
            "{prefix}-{}",
            uuid::Builder::from_random_bytes(rand::random()).into_uuid()
        );
        // A member id is the client id (or instance id) and a UUID: a client
        // id close to the limit would make one too long to write.
        if too_long(&req.new_member_id) {
            return Err(ID_TOO_LONG);
        }
        let now = now_ms();
        let cfg = self.config;
        let mut member_id = req.member_id.clone();
        if member_id.is_empty() {
            member_id = req.new_member_id.clone();
        }
        // A classic member joining a consumer group with members: a mixed
        // group, served by the consumer group's assignor.
        let unknown_member = req.member_id.is_empty();
        let classic = ClassicJoin {
            member_id: member_id.clone(),
            unknown_member,
            require_known_member_id: req.require_known_member_id,
            instance_id: req.group_instance_id.clone(),
            client_id: req.client_id.clone(),
            client_host: req.client_host.clone(),
            session_timeout_ms: req.session_timeout_ms,
            rebalance_timeout_ms: req.rebalance_timeout_ms,
            protocol_type: req.protocol_type.clone(),
            protocols: req.protocols.clone(),
        };
        let consumer_cfg = self.consumer_config;
        if let Some(op) = self.with_consumer_group(group_id, true, |c, image| {
            if classic.session_timeout_ms < cfg.min_session_timeout_ms
                || classic.session_timeout_ms > cfg.max_session_timeout_ms
            {
                return Err(GroupError::InvalidSessionTimeout);
            }
            c.classic_join(classic, &consumer_cfg, image, now)
        }) {
            let a = self.finish_consumer_op(op).await?;
            return Ok(JoinResult {
                generation_id: a.generation_id,
                protocol_type: Some("consumer".to_string()),
                protocol_name: Some(a.protocol_name),
                leader: String::new(),
                member_id: a.member_id,
                skip_assignment: false,
                members: Vec::new(),
            });
        }
        let converted = RefCell::new(None);
        let rx = self.with_group(group_id, true, |g, out| {
            if let Some(c) = &g.consumer {
                if !c.is_empty() {
                    // Mixed groups (a classic member in a consumer group)
                    // are not served: Kafka's answer to a classic member
                    // its consumer group cannot take.
                    return Err(GroupError::InconsistentGroupProtocol);
                }
                // An empty consumer group becomes a classic group (its
                // offsets stay), as in Kafka.
                g.consumer = None;
                *converted.borrow_mut() = Some(consumer_records::group_tombstones(group_id));
            }
            let reply = g.join(req, &cfg, now, out);
            if reply.is_err() {
                self.forget_if_unused(g);
            }
            let reply = reply?;
            match reply {
                JoinReply::Now(r) => Ok(Err(r)),
                JoinReply::Pending => {
                    let (tx, rx) = oneshot::channel();
                    self.join_waiters
                        .borrow_mut()
                        .insert((group_id.to_string(), member_id.clone()), tx);
                    // The join may already be complete (everyone is in).
                    g.poll(&cfg, now, out);
                    Ok(Ok(rx))
                }
            }
        })?;
        if let Some(Ok(tombstones)) = converted.into_inner() {
            let p = self.check(group_id)?;
            self.write(p, tombstones, None).await?;
        }
        match rx {
            Err(now_result) => Ok(now_result),
            // Waiting for the rebalance is remote time (Kafka's join purgatory).
            Ok(rx) => metrics::remote_wait(rx)
                .await
                .unwrap_or(Err(GroupError::RebalanceInProgress)),
        }
    }

    /// A group created by a JoinGroup that failed leaves no trace (Kafka
    /// removes a group it created for a request that then failed). The
    /// group is marked; [`GroupCoordinator::with_group`] drops it.
    fn forget_if_unused(&self, g: &mut Group) {
        if g.is(GroupState::Empty)
            && g.generation_id == 0
            && g.members.is_empty()
            && g.pending_members.is_empty()
            && g.offsets.is_empty()
            && g.pending_txn_offsets.is_empty()
        {
            g.state = GroupState::Dead;
        }
    }

    /// SyncGroup: the leader's assignment is written before anyone gets it.
    #[allow(clippy::too_many_arguments)]
    pub async fn sync(
        &self,
        group_id: &str,
        member_id: &str,
        instance_id: Option<&str>,
        generation_id: i32,
        protocol_type: Option<&str>,
        protocol_name: Option<&str>,
        assignments: Vec<(String, Bytes)>,
    ) -> Result<SyncAnswer, GroupError> {
        let now = now_ms();
        if let Some(op) = self.with_consumer_group(group_id, false, |c, _| {
            c.classic_sync(
                member_id,
                instance_id,
                generation_id,
                protocol_type,
                protocol_name,
                now,
            )
            .map(|assignment| SyncAnswer {
                assignment,
                protocol_type: protocol_type.map(str::to_string),
                protocol_name: protocol_name.map(str::to_string),
            })
        }) {
            return self.finish_consumer_op(op).await;
        }
        let (tx, rx) = oneshot::channel();
        let key = (group_id.to_string(), member_id.to_string());
        let reply = self.with_group(group_id, false, |g, _| {
            let r = g.sync(
                member_id,
                instance_id,
                generation_id,
                protocol_type,
                protocol_name,
                assignments,
                now,
            )?;
            let persist = match &r {
                SyncReply::Persist { .. } => Some(group_record(g).map_err(GroupError::from)),
                _ => None,
            };
            Ok((r, sync_meta(g), persist))
        });
        let (reply, meta, persist) = match reply {
            Err(GroupError::GroupIdNotFound) => return Err(GroupError::UnknownMemberId),
            other => other?,
        };
        match reply {
            SyncReply::Now(assignment) => Ok(SyncAnswer {
                assignment,
                protocol_type: meta.0,
                protocol_name: meta.1,
            }),
            SyncReply::Pending => {
                self.sync_waiters.borrow_mut().insert(key, tx);
                metrics::remote_wait(rx)
                    .await
                    .unwrap_or(Err(GroupError::RebalanceInProgress))
            }
            SyncReply::Persist { generation } => {
                self.sync_waiters.borrow_mut().insert(key, tx);
                let p = self.check(group_id)?;
                let written = match persist {
                    Some(Ok(rec)) => self.write(p, vec![rec], None).await,
                    Some(Err(e)) => Err(e),
                    None => Ok(()),
                };
                let cfg = self.config;
                let now = now_ms();
                let _ = self.with_group(group_id, false, |g, out| {
                    g.assignment_persisted(generation, written, &cfg, now, out);
                    Ok(())
                });
                metrics::remote_wait(rx)
                    .await
                    .unwrap_or(Err(GroupError::RebalanceInProgress))
            }
        }
    }

    pub fn heartbeat(
        &self,
        group_id: &str,
        member_id: &str,
        instance_id: Option<&str>,
        generation_id: i32,
    ) -> Result<(), GroupError> {
        let now = now_ms();
        if let Some((_, result, recs)) = self.with_consumer_group(group_id, false, |c, _| {
            c.classic_heartbeat(member_id, instance_id, generation_id, now)
        }) {
            // A heartbeat changes nothing that is persisted.
            debug_assert!(recs.is_empty());
            return result;
        }
        match self.with_group(group_id, false, |g, _| {
            g.heartbeat(member_id, instance_id, generation_id, now)
        }) {
            Err(GroupError::GroupIdNotFound) => Err(GroupError::UnknownMemberId),
            other => other,
        }
    }

    /// LeaveGroup: one result per (member id, instance id).
    pub async fn leave(
        &self,
        group_id: &str,
        members: &[(String, Option<String>)],
    ) -> Result<Vec<Result<(), GroupError>>, GroupError> {
        let now = now_ms();
        let cfg = self.config;
        if let Some(op) = self.consumer_group_leave(group_id, members, now) {
            return self.finish_consumer_op(op).await;
        }
        match self.with_group(group_id, false, |g, out| g.leave(members, &cfg, now, out)) {
            Err(GroupError::GroupIdNotFound) => Ok(members
                .iter()
                .map(|_| Err(GroupError::UnknownMemberId))
                .collect()),
            other => other,
        }
    }

    /// The records to write after a request changed consumer group `g`
    /// (whose group epoch was `epoch_before`): when only classic members
    /// are left, the group is downgraded online to a classic group (the
    /// answers this releases go to `out`) and these are
    /// [`downgrade_records`]; otherwise the consumer group's changed
    /// records, if any.
    fn records_after_consumer_op(
        &self,
        g: &mut Group,
        epoch_before: i32,
        now: i64,
        out: &mut Vec<Completion>,
    ) -> Result<Vec<(Bytes, Option<Bytes>)>, RecordFormatError> {
        if let Some(ids) = g.maybe_become_classic_group(&self.config, epoch_before, now, out) {
            tracing::info!(
                group = g.group_id.as_str(),
                members = g.members.len(),
                "consumer group downgraded online to a classic group"
            );
            return downgrade_records(g, &ids);
        }
        let c = g.consumer.as_mut().expect("still a consumer group");
        if c.needs_write() {
            let image = self.image.borrow().clone();
            consumer_records::take_dirty_records(&g.group_id, c, &image)
        } else {
            Ok(Vec::new())
        }
    }

    /// LeaveGroup to a consumer group (Kafka 4.4 removes members of either
    /// protocol this way); when only classic members remain, the group is
    /// downgraded to a classic group. None: not a consumer group.
    fn consumer_group_leave(
        &self,
        group_id: &str,
        members: &[(String, Option<String>)],
        now: i64,
    ) -> Option<ConsumerOp<Vec<Result<(), GroupError>>>> {
        let p = self.check(group_id).ok()?;
        let mut completions = Vec::new();
        let op = {
            let mut parts = self.partitions.borrow_mut();
            let g = parts.get_mut(&p)?.groups.get_mut(group_id)?;
            let c = g.consumer.as_mut()?;
            let epoch_before = c.group_epoch;
            let results: Vec<Result<(), GroupError>> = members
                .iter()
                .map(|(id, instance)| c.classic_leave(id, instance.as_deref()).map(|_| ()))
                .collect();
            match self.records_after_consumer_op(g, epoch_before, now, &mut completions) {
                Ok(recs) => (p, Ok(results), recs),
                Err(e) => (p, Err(e.into()), Vec::new()),
            }
        };
        self.deliver(group_id, completions, &(None, None));
        Some(op)
    }

    /// OffsetCommit: validated against the group, written, then applied.
    /// `create_if_missing` lets a simple consumer (generation < 0) commit to
    /// a group that does not exist yet.
    pub async fn commit_offsets(
        &self,
        group_id: &str,
        member_id: &str,
        instance_id: Option<&str>,
        generation_id: i32,
        offsets: Vec<OffsetToCommit>,
        unknown_group_error: GroupError,
    ) -> Result<(), GroupError> {
        check_group_id(group_id)?;
        let p = self.check(group_id)?;
        let create = generation_id < 0;
        let now = now_ms();
        match self.with_group(group_id, create, |g, _| {
            let older = g.validate_offset_commit(member_id, instance_id, generation_id, false)?;
            check_held_since(g, member_id, older, &offsets, false)?;
            // A commit keeps the member's session alive, as in Kafka.
            g.touch_if_active(member_id, now);
            Ok(())
        }) {
            Err(GroupError::GroupIdNotFound) => return Err(unknown_group_error),
            other => other?,
        }
        if offsets.is_empty() {
            return Ok(());
        }
        let recs = offset_records(group_id, &offsets)?;
        self.write(p, recs, None).await?;
        self.with_group(group_id, true, |g, _| {
            for (t, part, o) in offsets {
                g.commit_offset(&t, part, o);
            }
            Ok(())
        })
    }

    /// TxnOffsetCommit: written as a transactional batch of the producer,
    /// pending until the transaction's marker.
    #[allow(clippy::too_many_arguments)]
    pub async fn txn_commit_offsets(
        &self,
        group_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        member_id: &str,
        instance_id: Option<&str>,
        generation_id: i32,
        offsets: Vec<OffsetToCommit>,
        kip1319_errors: bool,
    ) -> Result<(), GroupError> {
        check_group_id(group_id)?;
        let p = self.check(group_id)?;
        // Only a simple consumer (generation < 0) may create the group.
        // Before TxnOffsetCommit v6 (KIP-1319: `kip1319_errors` false) a
        // missing group and a consumer-group member's stale epoch are both
        // ILLEGAL_GENERATION; from v6 they are GROUP_ID_NOT_FOUND and
        // STALE_MEMBER_EPOCH, as Kafka's `validateTransactionalOffsetCommit`.
        match self.with_group(group_id, generation_id < 0, |g, _| {
            let older = match g.validate_offset_commit(member_id, instance_id, generation_id, true)
            {
                Err(GroupError::IllegalGeneration) if kip1319_errors => match &g.consumer {
                    // The transactional check answers a stale epoch as
                    // ILLEGAL_GENERATION; the plain one tells it apart.
                    Some(c) => c.validate_offset_commit(member_id, generation_id, false)?,
                    None => return Err(GroupError::IllegalGeneration),
                },
                other => other?,
            };
            check_held_since(g, member_id, older, &offsets, !kip1319_errors)
        }) {
            Err(GroupError::GroupIdNotFound) if !kip1319_errors => {
                return Err(GroupError::IllegalGeneration)
            }
            other => other?,
        }
        if offsets.is_empty() {
            return Ok(());
        }
        let recs = offset_records(group_id, &offsets)?;
        self.write(p, recs, Some((producer_id, producer_epoch)))
            .await?;
        self.with_group(group_id, true, |g, _| {
            for (t, part, o) in offsets {
                g.add_pending_txn_offset(producer_id, &t, part, o);
            }
            Ok(())
        })
    }

    /// Called by the transaction code after it wrote a COMMIT (`commit`) or
    /// ABORT marker for `producer_id` to offsets partition
    /// `offsets_partition`: the producer's pending offsets in every group of
    /// that partition become committed, or are dropped.
    pub fn complete_transaction(&self, offsets_partition: i32, producer_id: i64, commit: bool) {
        if let Some(op) = self.partitions.borrow_mut().get_mut(&offsets_partition) {
            for g in op.groups.values_mut() {
                g.complete_transaction(producer_id, commit);
            }
        }
    }

    /// OffsetFetch for one group: `partitions` None = every committed
    /// offset. Each entry: topic, partition, offset (None = no commit) or
    /// UNSTABLE_OFFSET_COMMIT when `require_stable` and a transactional
    /// commit is pending.
    #[allow(clippy::type_complexity)]
    pub fn fetch_offsets(
        &self,
        group_id: &str,
        partitions: Option<Vec<(String, i32)>>,
        require_stable: bool,
    ) -> Result<Vec<(String, i32, Result<Option<CommittedOffset>, GroupError>)>, GroupError> {
        let p = self.check(group_id)?;
        let parts = self.partitions.borrow();
        let group = parts.get(&p).and_then(|op| op.groups.get(group_id));
        let Some(g) = group else {
            return Ok(partitions
                .unwrap_or_default()
                .into_iter()
                .map(|(t, part)| (t, part, Ok(None)))
                .collect());
        };
        let wanted = partitions.unwrap_or_else(|| g.offsets.keys().cloned().collect());
        Ok(wanted
            .into_iter()
            .map(|(t, part)| {
                if require_stable && g.has_pending_txn_offset(&t, part) {
                    return (t, part, Err(GroupError::UnstableOffsetCommit));
                }
                let o = g.offsets.get(&(t.clone(), part)).cloned();
                (t, part, Ok(o))
            })
            .collect())
    }

    /// ConsumerGroupHeartbeat (KIP-848). A heartbeat with epoch 0 creates
    /// the group, turns an empty classic group (offsets only) into a
    /// consumer group, or upgrades a classic group with members online
    /// ([`Group::upgradable`]; else GROUP_ID_NOT_FOUND, as Kafka). A
    /// leave that leaves only classic members downgrades the group. What
    /// changed is written before the member is answered.
    pub async fn consumer_heartbeat(
        &self,
        group_id: &str,
        req: HeartbeatRequest,
    ) -> Result<HeartbeatAnswer, GroupError> {
        if group_id.is_empty() {
            return Err(GroupError::InvalidRequest("GroupId can't be empty."));
        }
        check_group_id(group_id)?;
        let too_long = |s: &str| !records::fits(s);
        if too_long(&req.member_id)
            || req.instance_id.as_deref().is_some_and(too_long)
            || req.rack_id.as_deref().is_some_and(too_long)
            || too_long(&req.client_id)
            || req
                .subscribed_topic_names
                .as_ref()
                .is_some_and(|n| n.iter().any(|t| too_long(t)))
        {
            return Err(ID_TOO_LONG);
        }
        let p = self.check(group_id)?;
        let now = now_ms();
        let image = self.image.borrow().clone();
        let (answer, recs, parked) = 'op: {
            let mut parts = self.partitions.borrow_mut();
            let op = parts.get_mut(&p).ok_or(GroupError::NotCoordinator)?;
            let existed = op.groups.contains_key(group_id);
            if !existed {
                if req.member_epoch != 0 {
                    return Err(GroupError::GroupIdNotFound);
                }
                op.groups
                    .insert(group_id.to_string(), Group::new(group_id, now));
            }
            let g = op.groups.get_mut(group_id).expect("inserted above");
            let mut converted = false;
            if g.consumer.is_none()
                && !(g.has_no_members() && g.is(GroupState::Empty))
                && req.member_epoch == 0
                && g.upgradable(self.consumer_config.max_size)
            {
                // An online upgrade (KIP-848's mixed groups): the classic
                // members stay, served through the consumer group. Built
                // aside, so that a refused heartbeat leaves the classic
                // group as it was.
                let mut c =
                    ConsumerGroup::from_classic(g.generation_id, g.classic_snapshots(), &*image, now)
                        .inspect_err(|_| {
                            tracing::info!(group = group_id, "online upgrade refused: the members' embedded consumer protocol does not decode");
                        })?;
                let answer = c.heartbeat(req, &self.consumer_config, &*image, now)?;
                let mut recs = vec![(records::group_metadata_key(group_id)?, None)];
                recs.extend(consumer_records::take_dirty_records(
                    group_id, &mut c, &image,
                )?);
                let mut completions = Vec::new();
                tracing::info!(
                    group = group_id,
                    members = g.members.len(),
                    generation = g.generation_id,
                    "classic group upgraded online to a consumer group"
                );
                g.become_consumer_group(c, now, &mut completions);
                break 'op (answer, recs, completions);
            }
            if g.consumer.is_none() {
                if !g.has_no_members() || !g.is(GroupState::Empty) || req.member_epoch != 0 {
                    return Err(GroupError::GroupIdNotFound);
                }
                g.consumer = Some(Box::new(ConsumerGroup::new()));
                converted = true;
            }
            let c = g.consumer.as_mut().expect("set above");
            let epoch_before = c.group_epoch;
            let result = c.heartbeat(req, &self.consumer_config, &*image, now);
            if result.is_err() && converted {
                // A request that failed leaves no trace.
                if existed {
                    g.consumer = None;
                } else {
                    op.groups.remove(group_id);
                }
                return result;
            }
            let answer = result?;
            let mut completions = Vec::new();
            let recs = self.records_after_consumer_op(g, epoch_before, now, &mut completions)?;
            (answer, recs, completions)
        };
        // Parked classic requests of an upgraded group, or none.
        self.deliver(group_id, parked, &(None, None));
        if !recs.is_empty() {
            self.write(p, recs, None).await?;
        }
        Ok(answer)
    }

    /// ConsumerGroupDescribe for one group: a copy of its state, or
    /// GROUP_ID_NOT_FOUND when there is no such consumer group.
    pub fn consumer_describe(&self, group_id: &str) -> Result<ConsumerGroup, GroupError> {
        let p = self.check(group_id)?;
        let parts = self.partitions.borrow();
        parts
            .get(&p)
            .and_then(|op| op.groups.get(group_id))
            .filter(|g| !g.is(GroupState::Dead))
            .and_then(|g| g.consumer.as_deref().cloned())
            .ok_or(GroupError::GroupIdNotFound)
    }

    /// The metadata image the coordinator last got (topic ids for answers).
    pub fn image(&self) -> Arc<MetadataImage> {
        self.image.borrow().clone()
    }

    /// OffsetFetch v9+ by a member of a consumer group: STALE_MEMBER_EPOCH
    /// or UNKNOWN_MEMBER_ID as Kafka's `ConsumerGroup.validateOffsetFetch`
    /// (an admin fetch, without member id, is always allowed).
    pub fn validate_offset_fetch(
        &self,
        group_id: &str,
        member_id: Option<&str>,
        member_epoch: i32,
    ) -> Result<(), GroupError> {
        let p = self.check(group_id)?;
        let parts = self.partitions.borrow();
        let Some(c) = parts
            .get(&p)
            .and_then(|op| op.groups.get(group_id))
            .and_then(|g| g.consumer.as_deref())
        else {
            return Ok(());
        };
        match member_id {
            None => Ok(()),
            Some(m) => c.validate_offset_fetch(m, member_epoch),
        }
    }

    /// ListGroups: (group id, protocol type, state, group type) of every
    /// group here.
    pub fn list_groups(&self) -> Vec<(String, String, &'static str, &'static str)> {
        let parts = self.partitions.borrow();
        let mut out: Vec<_> = parts
            .values()
            .filter(|op| op.loaded)
            .flat_map(|op| op.groups.values())
            .filter(|g| !g.is(GroupState::Dead))
            .map(|g| {
                let (protocol_type, state, kind) = g.listing();
                (g.group_id.clone(), protocol_type, state, kind)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// For metrics: the number of loaded groups by state (Dead ones
    /// left out), their members, and every committed offset as
    /// (group, topic, partition, offset).
    #[allow(clippy::type_complexity)]
    pub fn metrics_view(&self) -> (Vec<(GroupState, u64)>, u64, Vec<(String, String, i32, i64)>) {
        let parts = self.partitions.borrow();
        let mut by_state: Vec<(GroupState, u64)> = Vec::new();
        let mut members = 0u64;
        let mut committed = Vec::new();
        for g in parts
            .values()
            .filter(|op| op.loaded)
            .flat_map(|op| op.groups.values())
        {
            if g.is(GroupState::Dead) {
                continue;
            }
            match by_state.iter_mut().find(|(s, _)| *s == g.state) {
                Some((_, n)) => *n += 1,
                None => by_state.push((g.state, 1)),
            }
            members += g.members.len() as u64;
            members += g.consumer.as_ref().map_or(0, |c| c.members.len() as u64);
            for ((topic, partition), o) in &g.offsets {
                committed.push((g.group_id.clone(), topic.clone(), *partition, o.offset));
            }
        }
        (by_state, members, committed)
    }

    /// DescribeGroups for one group (None = no such group).
    pub fn describe(&self, group_id: &str) -> Result<Option<GroupDescription>, GroupError> {
        let p = self.check(group_id)?;
        let parts = self.partitions.borrow();
        let Some(g) = parts.get(&p).and_then(|op| op.groups.get(group_id)) else {
            return Ok(None);
        };
        // A consumer group is not a classic group: DescribeGroups reports
        // it as Kafka does, like a missing group.
        if g.is(GroupState::Dead) || g.consumer.is_some() {
            return Ok(None);
        }
        Ok(Some(GroupDescription {
            state: g.state,
            protocol_type: g.protocol_type.clone().unwrap_or_default(),
            protocol_name: g.protocol_name.clone().unwrap_or_default(),
            members: g.describe_members(),
        }))
    }

    /// DeleteGroups for one group: only an empty group; its offsets and
    /// membership are tombstoned.
    pub async fn delete_group(&self, group_id: &str) -> Result<(), GroupError> {
        let p = self.check(group_id)?;
        let recs = {
            let parts = self.partitions.borrow();
            let g = parts
                .get(&p)
                .and_then(|op| op.groups.get(group_id))
                .ok_or(GroupError::GroupIdNotFound)?;
            g.validate_delete()?;
            let consumer_tombstones = if g.consumer.is_some() {
                consumer_records::group_tombstones(group_id)?
            } else {
                Vec::new()
            };
            let mut recs = g
                .offsets
                .keys()
                .map(|(t, part)| Ok((records::offset_commit_key(group_id, t, *part)?, None)))
                .collect::<Result<Vec<(Bytes, Option<Bytes>)>, GroupError>>()?;
            recs.extend(consumer_tombstones);
            recs.push((records::group_metadata_key(group_id)?, None));
            recs
        };
        let (log, last) = self.append(p, recs, None)?;
        if let Some(op) = self.partitions.borrow_mut().get_mut(&p) {
            if let Some(mut g) = op.groups.remove(group_id) {
                g.mark_dead(now_ms());
            }
        }
        self.wait(p, log, last).await
    }

    /// OffsetDelete: removes committed offsets of partitions the group is
    /// not subscribed to. Per partition: Ok or GROUP_SUBSCRIBED_TO_TOPIC.
    pub async fn delete_offsets(
        &self,
        group_id: &str,
        partitions: Vec<(String, i32)>,
    ) -> Result<Vec<(String, i32, Result<(), GroupError>)>, GroupError> {
        let p = self.check(group_id)?;
        let (results, recs) = {
            let mut parts = self.partitions.borrow_mut();
            let g = parts
                .get_mut(&p)
                .and_then(|op| op.groups.get_mut(group_id))
                .ok_or(GroupError::GroupIdNotFound)?;
            if g.is(GroupState::Dead) {
                return Err(GroupError::GroupIdNotFound);
            }
            if !g.is(GroupState::Empty) && g.protocol_type.as_deref() != Some("consumer") {
                return Err(GroupError::NonEmptyGroup);
            }
            let subscribed = g.subscribed_topics().unwrap_or_default();
            // Every tombstone is encoded before any offset is forgotten.
            let keys = partitions
                .iter()
                .map(|(t, part)| records::offset_commit_key(group_id, t, *part))
                .collect::<Result<Vec<Bytes>, RecordFormatError>>()?;
            let mut recs = Vec::new();
            let mut results = Vec::new();
            for ((t, part), key) in partitions.into_iter().zip(keys) {
                if subscribed.contains(&t) {
                    results.push((t, part, Err(GroupError::GroupSubscribedToTopic)));
                    continue;
                }
                if g.offsets.remove(&(t.clone(), part)).is_some() {
                    recs.push((key, None));
                }
                results.push((t, part, Ok(())));
            }
            (results, recs)
        };
        if !recs.is_empty() {
            self.write(p, recs, None).await?;
        }
        Ok(results)
    }
}

/// INVALID_GROUP_ID for an empty group id (as Kafka) and for one longer
/// than a record can hold.
fn check_group_id(group_id: &str) -> Result<(), GroupError> {
    if group_id.is_empty() || !records::fits(group_id) {
        return Err(GroupError::InvalidGroupId);
    }
    Ok(())
}

/// The OffsetCommit records of `offsets` for `group_id`.
fn offset_records(
    group_id: &str,
    offsets: &[OffsetToCommit],
) -> Result<Vec<(Bytes, Option<Bytes>)>, GroupError> {
    offsets
        .iter()
        .map(|(t, part, o)| {
            Ok((
                records::offset_commit_key(group_id, t, *part)?,
                Some(records::offset_commit_value(o)?),
            ))
        })
        .collect()
}

/// The group's membership record (key, GroupMetadataValue).
fn group_record(g: &Group) -> Result<(Bytes, Option<Bytes>), RecordFormatError> {
    let value = GroupMetadataValue {
        protocol_type: g.protocol_type.clone().unwrap_or_default(),
        generation_id: g.generation_id,
        protocol_name: g.protocol_name.clone(),
        leader: g.leader.clone(),
        current_state_timestamp_ms: g.state_timestamp_ms,
        members: g.members.values().cloned().collect(),
    };
    Ok((
        records::group_metadata_key(&g.group_id)?,
        Some(records::group_metadata_value(&value)?),
    ))
}

/// The records of an online downgrade: tombstones of the consumer
/// group's member records and group records, then the classic group's
/// GroupMetadata (Kafka's order).
fn downgrade_records(
    g: &Group,
    member_ids: &[String],
) -> Result<Vec<(Bytes, Option<Bytes>)>, RecordFormatError> {
    let mut recs = Vec::new();
    for id in member_ids {
        recs.extend(consumer_records::member_tombstones(&g.group_id, id)?);
    }
    recs.extend(consumer_records::group_tombstones(&g.group_id)?);
    recs.push(group_record(g)?);
    Ok(recs)
}

fn sync_meta(g: &Group) -> (Option<String>, Option<String>) {
    (g.protocol_type.clone(), g.protocol_name.clone())
}

/// Removes and returns the values of `map` whose keys `select` picks.
fn drain_where<K: Clone + Eq + std::hash::Hash, V>(
    map: &RefCell<HashMap<K, V>>,
    select: impl Fn(&K) -> bool,
) -> Vec<V> {
    let mut map = map.borrow_mut();
    let keys: Vec<K> = map.keys().filter(|k| select(k)).cloned().collect();
    keys.iter().filter_map(|k| map.remove(k)).collect()
}

/// A coordinator write's error as the group coordinator answers it, as
/// Kafka's maps its append errors: NOT_COORDINATOR when leadership moved,
/// COORDINATOR_NOT_AVAILABLE when the write could not be replicated.
fn write_error(tp: &TopicPartition, e: CoordinatorWriteError) -> GroupError {
    match e {
        CoordinatorWriteError::NotLeader => GroupError::NotCoordinator,
        CoordinatorWriteError::NotEnoughReplicas | CoordinatorWriteError::TimedOut => {
            tracing::warn!(%tp, error = %e, "a group coordinator write was not acknowledged");
            GroupError::CoordinatorNotAvailable
        }
        CoordinatorWriteError::Storage(e) => GroupError::Storage(e),
    }
}

/// Replays `log` from its start: the groups it holds, or why not.
async fn replay_partition(
    log: &PartitionLog,
    now_ms: i64,
    image: Arc<MetadataImage>,
) -> Result<HashMap<String, Group>, LoadError> {
    let mut replay = Replay::new(now_ms, image);
    log.scan(Offset(log.log_start_offset().0), &mut |h, bytes| {
        replay.batch(h, bytes)
    })
    .await?;
    replay.finish()
}

/// Rebuilds the groups of a partition from its batches, in log order. The
/// first batch that cannot be replayed stops it: [`Replay::finish`] then
/// gives that error instead of the groups.
struct Replay {
    now_ms: i64,
    /// Maps the topic ids of consumer-group assignments to names.
    image: Arc<MetadataImage>,
    groups: HashMap<String, Group>,
    failed: Option<LoadError>,
}

impl Replay {
    fn new(now_ms: i64, image: Arc<MetadataImage>) -> Replay {
        Replay {
            now_ms,
            image,
            groups: HashMap::new(),
            failed: None,
        }
    }

    /// One consumer-group record.
    fn apply_consumer(&mut self, key: &[u8], value: Option<&[u8]>) -> Result<(), String> {
        let key = consumer_records::parse_key(key).map_err(|e| e.to_string())?;
        if value.is_none() && !self.groups.contains_key(key.group()) {
            return Ok(());
        }
        let (now, image) = (self.now_ms, self.image.clone());
        let g = self.group(key.group());
        let c = g
            .consumer
            .get_or_insert_with(|| Box::new(ConsumerGroup::new()));
        let keep =
            consumer_records::apply(c, &key, value, &image, now).map_err(|e| e.to_string())?;
        if !keep {
            g.consumer = None;
        }
        Ok(())
    }

    fn group(&mut self, id: &str) -> &mut Group {
        let now = self.now_ms;
        self.groups
            .entry(id.to_string())
            .or_insert_with(|| Group::new(id, now))
    }

    /// One batch (ignored once the replay failed).
    fn batch(&mut self, h: &BatchHeader, bytes: &[u8]) {
        if self.failed.is_some() {
            return;
        }
        if let Err(reason) = self.apply(h, bytes) {
            self.failed = Some(LoadError::Record {
                offset: h.base_offset,
                reason,
            });
        }
    }

    fn apply(&mut self, h: &BatchHeader, bytes: &[u8]) -> Result<(), String> {
        let (_, recs) = decode_batch(bytes).map_err(|e| format!("undecodable batch: {e}"))?;
        if h.is_control() {
            for r in &recs {
                let key = r.key.as_deref().ok_or("a control record without a key")?;
                let (_, kind) =
                    parse_control_key(key).map_err(|e| format!("bad control key: {e}"))?;
                let commit = match kind {
                    ControlType::Commit => true,
                    ControlType::Abort => false,
                    _ => continue,
                };
                for g in self.groups.values_mut() {
                    g.complete_transaction(h.producer_id, commit);
                }
            }
            return Ok(());
        }
        for r in recs {
            let key = r.key.as_deref().ok_or("a record without a key")?;
            let version = key
                .get(..2)
                .map(|v| i16::from_be_bytes([v[0], v[1]]))
                .ok_or("a key shorter than its version")?;
            if consumer_records::is_consumer_key_version(version) {
                self.apply_consumer(key, r.value.as_deref())?;
                continue;
            }
            if !records::is_known_key_version(version) {
                tracing::warn!(
                    version,
                    offset = h.base_offset,
                    "unknown __consumer_offsets record type skipped"
                );
                continue;
            }
            let key = records::parse_key(key).map_err(|e| e.to_string())?;
            match key {
                RecordKey::OffsetCommit {
                    group,
                    topic,
                    partition,
                } => match r.value.as_deref().map(records::parse_offset_commit_value) {
                    None => {
                        if let Some(g) = self.groups.get_mut(&group) {
                            g.offsets.remove(&(topic, partition));
                        }
                    }
                    Some(Ok(o)) if h.is_transactional() => self
                        .group(&group)
                        .add_pending_txn_offset(h.producer_id, &topic, partition, o),
                    Some(Ok(o)) => self.group(&group).commit_offset(&topic, partition, o),
                    Some(Err(e)) => return Err(e.to_string()),
                },
                RecordKey::GroupMetadata { group } => {
                    match r.value.as_deref().map(records::parse_group_metadata_value) {
                        // The classic group is gone: deleted (its offsets
                        // were tombstoned before), or upgraded to a
                        // consumer group (its offsets stay, as in Kafka,
                        // where offsets are not part of the group).
                        None => {
                            let now = self.now_ms;
                            if let Some(g) = self.groups.get_mut(&group) {
                                if g.offsets.is_empty()
                                    && g.pending_txn_offsets.is_empty()
                                    && g.consumer.is_none()
                                {
                                    self.groups.remove(&group);
                                } else {
                                    g.restore(String::new(), 0, None, None, -1, Vec::new(), now);
                                }
                            }
                        }
                        Some(Ok(v)) => {
                            let now = self.now_ms;
                            self.group(&group).restore(
                                v.protocol_type,
                                v.generation_id,
                                v.protocol_name,
                                v.leader,
                                v.current_state_timestamp_ms,
                                v.members,
                                now,
                            );
                        }
                        Some(Err(e)) => return Err(e.to_string()),
                    }
                }
            }
        }
        Ok(())
    }

    fn finish(mut self) -> Result<HashMap<String, Group>, LoadError> {
        match self.failed {
            Some(e) => Err(e),
            None => {
                for g in self.groups.values_mut() {
                    if let Some(c) = g.consumer.as_mut() {
                        consumer_records::finish_replay(c, self.now_ms);
                    }
                }
                Ok(self.groups)
            }
        }
    }
}
