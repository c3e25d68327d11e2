//! A shard: one glommio executor pinned to one core, advertised to clients as
//! its own Kafka node (`node_id * 1000 + shard`, port `port + shard`).
//!
//! [`ShardCtx`] is the shard's state, owned by that shard alone (`Rc`,
//! `RefCell`; nothing here is shared with other threads): the current
//! metadata image, the partitions this shard leads ([`Partition`]: log,
//! producer state, aborted transactions), its producer-id block, its group
//! and transaction coordinators, and the router to the other shards. Shard 0
//! also runs the controller ([`controller`]).
//!
//! Markers reach a partition through [`ShardCtx::write_txn_markers`]
//! (called locally or through the router by a coordinator), which appends
//! them with `Partition::append_control` and hands those on
//! `__consumer_offsets` to the group coordinator.
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

#[cfg(test)]
mod cluster_sim;
pub mod controller;
mod coordinator_log;
pub mod fetch_sessions;
pub mod messages;
pub mod metrics;
pub mod router;
pub mod txn_env;

use crate::auth::acl::AuthorizerSettings;
use crate::config::{AuthorizerKind, BrokerConfig};
use crate::group::consumer::ConsumerGroupConfig;
use crate::group::state::GroupConfig;
use crate::group::GroupCoordinator;
use crate::log::{LogConfig, LogManager};
use crate::metadata::{internal, MetadataImage, Placement, TopicConfig};
use crate::partition::{MarkerError, Partition, TxnMarker};
use crate::producer::ids::ProducerIdBlocks;
use crate::replication::manager::{Follow, ReplicaManager};
use crate::txn::coordinator::TxnCoordinator;
use crate::types::{PartitionId, TopicPartition, TopicPartitionKey};
use futures::channel::oneshot;
use messages::{ControllerError, ControllerReply, ControllerRequest, ShardMessage};
use router::Router;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

/// File growth step of internal-topic partitions (see [`ShardCtx::log_config`]).
pub const INTERNAL_PREALLOCATE_BYTES: u64 = 1024 * 1024;

/// How long a partition that becomes leader waits for a follower's
/// truncation in flight before `become_leader` (which a truncation refuses).
const BECOME_LEADER_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// How long a leader waits before asking again for an ISR change whose
/// AlterPartition got no clear answer (`ShardCtx::alter_isr`).
const ALTER_PARTITION_RETRY: std::time::Duration = std::time::Duration::from_millis(250);

/// What an AlterPartition's outcome says about its proposal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum AlterFate {
    /// Committed: the image brings the new ISR and settles the proposal.
    Changed,
    /// Refused because the partition's leader or epochs moved on: its new
    /// state, already committed, reaches the image and replaces the
    /// proposal there (dropping it here first would let the HW pass a
    /// follower the committed state may hold).
    Moved,
    /// Refused with the partition as it was, or nothing to change: the
    /// proposal is dropped.
    Refused,
    /// No clear answer: the change may still commit.
    Unknown,
}

/// The fate of an AlterPartition proposed at `partition_epoch`.
pub(super) fn alter_partition_fate(
    outcome: &Result<ControllerReply, ControllerError>,
    partition_epoch: i32,
) -> AlterFate {
    use ControllerError as E;
    let open = |e: &ControllerError| match e {
        E::NotController(_) | E::TimedOut(_) | E::Unavailable | E::Storage(_) => {
            Some(AlterFate::Unknown)
        }
        E::NotLeader(_) | E::FencedLeaderEpoch(_) | E::InvalidUpdateVersion(_) => {
            Some(AlterFate::Moved)
        }
        _ => None,
    };
    match outcome {
        Ok(ControllerReply::Partition(Ok(state))) if state.partition_epoch != partition_epoch => {
            AlterFate::Changed
        }
        Ok(ControllerReply::Partition(Ok(_))) => AlterFate::Refused,
        Ok(ControllerReply::Partition(Err(e))) | Err(e) => open(e).unwrap_or(AlterFate::Refused),
        Ok(_) => AlterFate::Refused,
    }
}

/// The leader epoch a replicated partition's log is opened with: the
/// partition's when `broker` (this shard's broker id) leads it, so that
/// recovery starts that epoch at the log end as a leader's start does;
/// none (-1) for a follower, whose epochs come only from its leader's
/// batches. A follower restarted after its leader moved to a newer epoch
/// must not start that epoch at its own log end: the older epoch's
/// batches it still has to fetch would then be refused as stale.
pub fn replica_log_epoch(state: &crate::metadata::PartitionState, broker: i32) -> i32 {
    if state.leader == broker {
        state.leader_epoch
    } else {
        crate::log::leader_epoch::UNDEFINED_EPOCH
    }
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
    /// The replica fetchers of the replicated partitions this shard
    /// follows (`replication::manager`), driven by [`Self::apply_image`].
    pub replicas: ReplicaManager,
    partitions: RefCell<HashMap<TopicPartition, Rc<Partition>>>,
    /// Bumped whenever `partitions` gains or loses one: a partition handle
    /// cached under the same version and image version is still the one
    /// [`Self::partition`] finds (fetch sessions keep such handles).
    partitions_version: Cell<u64>,
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
    /// Incremental fetch sessions opened with this shard (KIP-227).
    pub fetch_sessions: RefCell<fetch_sessions::FetchSessionCache>,
    /// The replicated partitions this shard leads: what their followers
    /// fetched, and their high watermarks (`replication::leading`).
    pub leading: crate::replication::leading::Leading,
    /// Connections to other nodes' brokers for transaction markers and
    /// AddPartitionsToTxn (`replication::peers`).
    pub peers: crate::replication::peers::PeerClients,
    /// The authorizer's settings (`--super-users`,
    /// `--allow-everyone-if-no-acl-found`); None with `--authorizer none`,
    /// when nothing is checked. The ACLs themselves are in the image.
    pub authorizer: Option<Rc<AuthorizerSettings>>,
    /// The node's lease, shared by its shards: it acts as a partition
    /// leader or coordinator only while the lease holds
    /// (`metadata::lease`, [`Self::acts_in`]).
    pub lease: Arc<crate::metadata::lease::NodeLease>,
}

impl ShardCtx {
    /// Builds the context; `first_image` fires once the first metadata image
    /// has been applied (the shard must not serve before that).
    pub fn new(
        shard: usize,
        config: Arc<BrokerConfig>,
        logs: Rc<LogManager>,
        router: Router,
        lease: Arc<crate::metadata::lease::NodeLease>,
        first_image: oneshot::Sender<()>,
    ) -> Rc<ShardCtx> {
        let controller = (shard == 0).then(|| controller::Controller::new(config.clone()));
        let group_config = GroupConfig {
            initial_rebalance_delay_ms: config.group_initial_rebalance_delay_ms,
            offsets_retention_ms: config.offsets_retention_minutes * 60_000,
            max_size: config.group_max_size,
            ..GroupConfig::default()
        };
        let consumer_config = ConsumerGroupConfig {
            session_timeout_ms: config.group_consumer_session_timeout_ms,
            heartbeat_interval_ms: config.group_consumer_heartbeat_interval_ms,
            max_size: config.group_max_size,
        };
        let fetch_sessions = fetch_sessions::FetchSessionCache::new(
            config.fetch_session_cache_slots,
            fetch_sessions::FETCH_SESSION_PARTITIONS_MAX,
        );
        let authorizer = (config.authorizer == AuthorizerKind::Standard).then(|| {
            Rc::new(AuthorizerSettings {
                super_users: config.super_users.iter().cloned().collect(),
                allow_everyone_if_no_acl_found: config.allow_everyone_if_no_acl_found,
            })
        });
        let replicas = ReplicaManager::new(config.node_id_of(shard));
        let config_broker_id = config.node_id_of(shard);
        Rc::new_cyclic(|me: &std::rc::Weak<ShardCtx>| ShardCtx {
            // The group coordinator writes through its shard.
            groups: GroupCoordinator::new(group_config, consumer_config, me.clone()),
            authorizer,
            lease,
            shard,
            config,
            image: RefCell::new(Arc::new(MetadataImage::default())),
            logs,
            router,
            controller,
            replicas,
            partitions: RefCell::new(HashMap::new()),
            partitions_version: Cell::new(0),
            first_image: RefCell::new(Some(first_image)),
            inflight_requests: Cell::new(0),
            apply_lock: glommio::sync::Semaphore::new(1),
            producer_ids: ProducerIdBlocks::default(),
            produce_count: Cell::new(0),
            txn: TxnCoordinator::default(),
            fetch_sessions: RefCell::new(fetch_sessions),
            leading: Default::default(),
            peers: crate::replication::peers::PeerClients::new(config_broker_id),
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
    pub fn partition(&self, tp: &TopicPartition) -> Option<Rc<Partition>> {
        self.partitions.borrow().get(tp).cloned()
    }

    /// [`Self::partition`] without building a [`TopicPartition`] (no
    /// allocation: the fetch path looks up every partition it reads).
    pub fn partition_of(&self, topic: &str, partition: i32) -> Option<Rc<Partition>> {
        let key = (topic, PartitionId(partition));
        self.partitions
            .borrow()
            .get(&key as &dyn TopicPartitionKey)
            .cloned()
    }

    /// The image version and the partition-set version: while both are
    /// unchanged, a partition handle found by [`Self::partition`] is still
    /// the one it would find.
    pub fn partitions_stamp(&self) -> (u64, u64) {
        (self.image.borrow().version, self.partitions_version.get())
    }

    fn partition_set_changed(&self) {
        self.partitions_version
            .set(self.partitions_version.get().wrapping_add(1));
    }

    /// Every partition this shard leads.
    pub fn partitions(&self) -> Vec<Rc<Partition>> {
        self.partitions.borrow().values().cloned().collect()
    }

    /// The log config a partition of a topic with `tc` runs with, led in
    /// `leader_epoch`. Internal topics have 50 partitions each and little
    /// traffic, so their files grow in small steps instead of the default
    /// preallocation.
    pub fn log_config(&self, tc: &TopicConfig, internal: bool, leader_epoch: i32) -> LogConfig {
        let preallocate_bytes = if internal {
            INTERNAL_PREALLOCATE_BYTES
        } else {
            LogConfig::default().preallocate_bytes
        };
        LogConfig {
            preallocate_bytes,
            segment_bytes: tc.segment_bytes,
            segment_ms: tc.segment_ms,
            retention_ms: tc.effective_retention_ms(),
            retention_bytes: tc.effective_retention_bytes(),
            index_interval_bytes: tc.index_interval_bytes,
            segment_index_bytes: tc.segment_index_bytes,
            flush_messages: tc.flush_messages,
            flush_ms: tc.flush_ms,
            fsync_acks: self.config.fsync_acks,
            direct_writes: self.config.direct_writes,
            catch_up_reads: self.config.catch_up_reads,
            leader_epoch,
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
        // The cluster's recorded id replaces this node's own in its
        // meta.properties (`metadata::meta_properties`), once.
        if let Some(id) = image.cluster_id.clone() {
            if self.shard == 0 && old.cluster_id.is_none() && id != self.config.cluster_id {
                let dir = self.config.data_dir.clone();
                let node = self.config.node_id;
                let written = glommio::executor()
                    .spawn_blocking(move || {
                        crate::metadata::meta_properties::write(&dir, &id, node)
                    })
                    .await;
                if let Err(e) = written {
                    tracing::warn!(error = %e, "could not write the cluster's id to meta.properties");
                }
            }
        }
        // Before any offsets partition is loaded: its replay maps the
        // consumer groups' topic ids to names with this image.
        self.groups.set_image(image.clone());
        let cores = self.cores();
        // Topics deleted (or re-created under a new id), and replicas a
        // reassignment removed from this shard (`docs/replication.md`
        // §4.5): their logs are deleted, as Kafka's StopReplica with
        // deletion does.
        let node = self.config.node_id;
        let gone: Vec<TopicPartition> = self
            .partitions
            .borrow()
            .values()
            .filter(|p| match image.topic(&p.tp.topic) {
                None => true,
                Some(t) if t.id != p.topic_id => true,
                Some(t) => {
                    t.is_replicated()
                        && t.placement(p.tp.partition.0, node, cores)
                            != crate::metadata::Placement::Local(self.shard)
                }
            })
            .map(|p| p.tp.clone())
            .collect();
        let any_gone = !gone.is_empty();
        for tp in gone {
            // No fetcher appends to it while its log is deleted.
            self.replicas.unfollow(&tp);
            self.partitions.borrow_mut().remove(&tp);
            self.partition_set_changed();
            if let Err(e) = self.logs.delete(&tp).await {
                tracing::error!(%tp, error = %e, "deleting partition log failed");
            }
        }
        if any_gone {
            // After every removal: a fetch during the deletes above may
            // have cached a handle of one removed later.
            self.fetch_sessions.borrow_mut().drop_partition_handles();
        }
        if self.shard == 0 && self.first_image.borrow().is_some() {
            self.delete_unassigned_replicas(&image).await;
        }
        // New partitions and config changes.
        for topic in image.topics.values() {
            // Another node's topic: no log here (`docs/replication.md` §3.2).
            if !topic.hosted_by(self.config.node_id) {
                continue;
            }
            let tc = TopicConfig::resolve(&topic.configs, &self.config);
            for index in 0..topic.partition_count() {
                let here = topic.placement(index, self.config.node_id, cores);
                if here != crate::metadata::Placement::Local(self.shard) {
                    continue;
                }
                // A replicated partition's epoch is its own (§4.3); a
                // follower's log stamps none (`replica_log_epoch`).
                let epoch = match topic.replica_state(index) {
                    Some(s) => replica_log_epoch(s, self.node_id()),
                    None => image.leader_epoch(),
                };
                let tp = TopicPartition::new(topic.name.clone(), index);
                let existing = self.partition(&tp);
                match existing {
                    Some(p) if *p.config() == tc => {}
                    Some(p) => {
                        p.set_config(tc.clone(), self.log_config(&tc, topic.is_internal(), epoch))
                    }
                    None => match self
                        .logs
                        .open_topic(
                            &tp,
                            Some(topic.id),
                            self.log_config(&tc, topic.is_internal(), epoch),
                        )
                        .await
                    {
                        Ok(log) => {
                            // A producer state that cannot be recovered is
                            // not served (see `partition::recovery`); the next
                            // image applied tries again.
                            let producers_max = self.config.producers_per_partition_max;
                            let Ok(state) = Partition::open(
                                tp.clone(),
                                topic.id,
                                log,
                                tc.clone(),
                                producers_max,
                            )
                            .await
                            else {
                                continue;
                            };
                            self.partitions.borrow_mut().insert(tp.clone(), state);
                            self.partition_set_changed();
                        }
                        Err(e) => {
                            tracing::error!(%tp, error = %e, "opening partition log failed");
                        }
                    },
                }
            }
        }
        // Role changes of replicated partitions, before any request sees
        // the image that makes them.
        self.apply_replica_roles(&image).await;
        // Leader states of partitions this shard no longer leads go.
        let me = self.config.node_id_of(self.shard);
        self.leading.retain(|tp| {
            image
                .topic(&tp.topic)
                .and_then(|t| t.replica_state(tp.partition.0))
                .is_some_and(|s| s.leader == me)
        });
        *self.image.borrow_mut() = image.clone();
        if let Some(tx) = self.first_image.borrow_mut().take() {
            let _ = tx.send(());
        }
        // The coordinators follow their partitions' leaders.
        self.sync_coordinators(&image).await;
    }

    /// The group and transaction coordinators take over the internal
    /// partitions this shard now leads and give up those it no longer
    /// does (`docs/replication.md` §4.6), as Kafka's coordinators load on
    /// becoming a partition's leader and unload on becoming a follower:
    /// a partition of one replica is taken over once, when it opens; a
    /// replicated one whenever this shard leads it in a new leader epoch
    /// (its log may have changed while another shard led it), replaying
    /// its log anew. Groups first, with no await between the image being
    /// stored and them; the transaction state loads are awaited in turn.
    async fn sync_coordinators(self: &Rc<Self>, image: &MetadataImage) {
        let me = self.node_id();
        let registered = self.registered_in(image);
        let (node, cores) = (self.config.node_id, self.cores());
        let mut txn_loads = Vec::new();
        for name in [internal::CONSUMER_OFFSETS, internal::TRANSACTION_STATE] {
            let Some(topic) = image.topic(name) else {
                continue;
            };
            let count = topic.partition_count();
            for index in 0..count {
                let tp = TopicPartition::new(name, index);
                let open = self
                    .partition(&tp)
                    .filter(|_| topic.placement(index, node, cores) == Placement::Local(self.shard))
                    .filter(|p| p.topic_id == topic.id);
                // The epoch this shard leads it in; None: it does not.
                let led = open.and_then(|p| match topic.replica_state(index) {
                    None => Some((p, -1)),
                    Some(s) if s.leader == me && registered => Some((p, s.leader_epoch)),
                    Some(_) => None,
                });
                let held = match name {
                    internal::CONSUMER_OFFSETS => self.groups.held_epoch(index),
                    _ => self.txn.held_epoch(index),
                };
                if held.is_some() && held != led.as_ref().map(|(_, e)| *e) {
                    match name {
                        internal::CONSUMER_OFFSETS => self.groups.unload_partition(index),
                        _ => self.txn.unload_partition(index),
                    }
                }
                match led {
                    Some((p, epoch)) if held != Some(epoch) => match name {
                        internal::CONSUMER_OFFSETS => {
                            self.groups.load_partition(index, count, p, epoch)
                        }
                        _ => txn_loads.push((p, count, epoch)),
                    },
                    _ => {}
                }
            }
        }
        for (p, count, epoch) in txn_loads {
            self.txn.load_partition(self, &p, count, epoch).await;
        }
    }

    /// At a start (the first image, on shard 0): the directories of
    /// replicated partitions that no shard of this node holds any more
    /// (a reassignment removed the replica while the node was down,
    /// `docs/replication.md` §4.5) are deleted, as Kafka deletes a stray
    /// log at start-up. Only a directory whose `partition.metadata` names
    /// the topic's id goes; no shard opens these (the image places them
    /// on other nodes).
    async fn delete_unassigned_replicas(&self, image: &MetadataImage) {
        let node = self.config.node_id;
        let cores = self.cores();
        let data_dir = self.logs.data_dir().to_path_buf();
        let mut stale = Vec::new();
        for t in image.topics.values().filter(|t| t.is_replicated()) {
            for i in 0..t.partition_count() {
                if t.placement(i, node, cores) == crate::metadata::Placement::Elsewhere {
                    let tp = TopicPartition::new(t.name.clone(), i);
                    stale.push((data_dir.join(tp.dir_name()), t.id));
                }
            }
        }
        if stale.is_empty() {
            return;
        }
        let removed = glommio::executor()
            .spawn_blocking(move || {
                let mut removed = Vec::new();
                for (dir, id) in stale {
                    if crate::log::partition_meta::read(&dir).ok().flatten() != Some(id) {
                        continue;
                    }
                    match crate::log::partition_meta::delete_dir(&data_dir, &dir) {
                        Ok(()) => removed.push(dir),
                        Err(e) => tracing::warn!(dir = %dir.display(), error = %e,
                            "cannot delete the directory of a replica no longer assigned here"),
                    }
                }
                removed
            })
            .await;
        for dir in removed {
            tracing::info!(dir = %dir.display(), "deleted a replica no longer assigned to this node");
        }
    }

    /// The replicated partitions open on this shard take the roles `image`
    /// gives them (`docs/replication.md` §4.1; `replication::manager`),
    /// each log switched to replicated HW mode at the HW checkpointed before
    /// a restart (`LogManager::checkpointed_high_watermark`) on its first
    /// image:
    /// - this broker leads: out of every fetcher; `become_leader` in the
    ///   partition's epoch if its log's newest epoch is older (after a
    ///   truncation in flight ends); its HW set from outside from now on
    ///   (replicated mode: it no longer runs ahead of the followers; the
    ///   leader's Fetch path raises it);
    /// - another broker leads: in that leader's fetcher, in replicated HW
    ///   mode (the leader's answers raise it); it takes no local appends
    ///   (requests are routed to the leader only, [`Self::led_partition`]);
    /// - no leader (-1): in no fetcher.
    ///
    /// Partitions of deleted topics left every fetcher before their logs
    /// were deleted.
    async fn apply_replica_roles(&self, image: &MetadataImage) {
        let me = self.node_id();
        let registered = self.registered_in(image);
        let mut follow = Vec::new();
        let mut lead = Vec::new();
        for topic in image.topics.values().filter(|t| t.is_replicated()) {
            for index in 0..topic.partition_count() {
                let here = topic.placement(index, self.config.node_id, self.cores());
                if here != crate::metadata::Placement::Local(self.shard) {
                    continue;
                }
                let Some(state) = topic.replica_state(index) else {
                    continue;
                };
                let tp = TopicPartition::new(topic.name.clone(), index);
                let Some(p) = self.partition(&tp) else {
                    continue;
                };
                if p.topic_id != topic.id {
                    continue;
                }
                // Every replica's HW is set from outside from its first
                // image on (replicated mode; `log::replica`), starting at
                // the HW checkpointed before a restart (0 if none), not at
                // its log end, which may hold batches the ISR never had.
                if !p.log.is_replicated() {
                    let hw = self.logs.checkpointed_high_watermark(&tp);
                    p.log
                        .start_replicated_at(hw.unwrap_or(crate::types::Offset(0)));
                }
                if state.leader == me {
                    // Not before this start is registered (`registered_in`):
                    // it neither leads nor follows until then.
                    if registered {
                        lead.push((p, state.clone()));
                    }
                    continue;
                }
                if state.leader >= 0
                    && crate::metadata::node_of(state.leader) != self.config.node_id
                {
                    follow.push(Follow {
                        tp,
                        topic_id: topic.id,
                        partition: p,
                        leader: state.leader,
                        leader_epoch: state.leader_epoch,
                    });
                }
            }
        }
        // The fetchers send this process's broker epoch from now on: -1
        // until the image has its registration, then that registration's.
        self.replicas.set_broker_epoch(self.broker_epoch_in(image));
        // Out of the fetchers first: no fetcher appends to a led log.
        self.replicas.follow_only(image, follow);
        for (p, state) in lead {
            let epoch = state.leader_epoch;
            let deadline = crate::clock::monotonic() + BECOME_LEADER_WAIT;
            while p.is_truncating() && crate::clock::monotonic() < deadline {
                glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
            }
            if p.log.latest_epoch().is_none_or(|latest| latest < epoch) {
                if let Err(e) = p.log.become_leader(epoch) {
                    tracing::error!(tp = %p.tp, epoch, error = %e, "becoming the partition's leader failed");
                    continue;
                }
            }
            // Its leader state follows the new ISR and its HW moves now.
            self.leading.refresh(&p, &state, me);
        }
    }

    /// Appends COMMIT/ABORT markers to partitions this shard leads and
    /// waits until they are written (durable under `--fsync-acks`), as the
    /// coordinator's acks=-1 write. Returns the outcome of each marker.
    /// As Kafka's `Partition.appendRecordsToLeader` with `requiredAcks=-1`,
    /// a replicated partition whose ISR is below `min.insync.replicas`
    /// takes no marker (NOT_ENOUGH_REPLICAS, which the coordinator retries),
    /// and one whose ISR shrank below it by the time the HW passed the
    /// marker answers NOT_ENOUGH_REPLICAS_AFTER_APPEND.
    pub async fn write_txn_markers(
        self: &Rc<Self>,
        markers: Vec<TxnMarker>,
    ) -> Vec<(TxnMarker, Result<(), MarkerError>)> {
        let mut waits = Vec::with_capacity(markers.len());
        let mut out = Vec::with_capacity(markers.len());
        let me = self.config.node_id_of(self.shard);
        // The image the appends are made under: a replicated partition's
        // leader epoch is the one its marker must be replicated in.
        let image = self.image();
        for m in markers {
            let state = image
                .topic(&m.tp.topic)
                .and_then(|t| t.replica_state(m.tp.partition.0));
            // Appended now, synchronously, so it orders with produce appends.
            let appended = match self.led_partition(&m.tp) {
                Some(p) => match state {
                    Some(ps) if !self.leading.enough_replicas(&p, ps, me) => {
                        Err(MarkerError::NotEnoughReplicas)
                    }
                    _ => p.append_control(&m).map(|offset| (p.log.clone(), offset)),
                },
                None => Err(self.missing_partition(&m.tp)),
            };
            match appended {
                Ok((log, offset)) => waits.push((m, log, offset, state.map(|s| s.leader_epoch))),
                Err(e) => out.push((m, Err(e))),
            }
        }
        // Answered as Kafka's marker append (acks=-1): once written, and on
        // a replicated partition once the HW passed it while this shard
        // still leads it in the epoch it appended in (every ISR member
        // holds it; `Leading::wait_marker`), within the cross-shard
        // timeout (else TimedOut, and the coordinator sends it again).
        let deadline = self.router.deadline();
        for (m, log, offset, epoch) in waits {
            let outcome = self
                .leading
                .wait_marker(&m.tp, &log, epoch, offset, self.config.fsync_acks, deadline)
                .await;
            if outcome.is_ok() && m.tp.topic == internal::CONSUMER_OFFSETS {
                // The producer's pending transactional offset commits
                // become visible (COMMIT) or are dropped.
                self.groups
                    .complete_transaction(m.tp.partition.0, m.producer_id, m.commit);
            }
            out.push((m, outcome));
        }
        out
    }

    /// Why a marker for `tp`, which this shard does not hold, is not
    /// written: another shard leads it (or this one has not opened it yet),
    /// or the image has no such partition.
    /// Whether this node acts on the leadership `image` gives it over
    /// replicated partitions: always on one node; on several, once the
    /// image holds this process's registration (this start's incarnation,
    /// `metadata::process_incarnation`). Before that the image is a past
    /// life's (replayed from the local metadata log, not caught up with
    /// the quorum), whose leaderships the quorum may have moved since:
    /// leading on it could acknowledge writes the real leader never sees,
    /// or answer OffsetFetch from a stale coordinator. Kafka's broker
    /// likewise leads nothing until it has registered and caught up.
    pub fn registered_in(&self, image: &MetadataImage) -> bool {
        !self.config.several_nodes() || self.own_registration(image).is_some()
    }

    /// Whether this shard, holding `image`, may act as the leader of the
    /// partitions `image` gives it and as their coordinator now: this
    /// start is registered ([`Self::registered_in`]) and the node's lease
    /// holds (`metadata::lease`: a node cut off from the quorum stops
    /// acting before the quorum fences it and moves its leaderships).
    pub fn acts_in(&self, image: &MetadataImage) -> bool {
        self.registered_in(image) && self.lease.holds(image)
    }

    /// The registration this process made (this start's incarnation,
    /// `metadata::process_incarnation`), if `image` holds it.
    fn own_registration<'a>(
        &self,
        image: &'a MetadataImage,
    ) -> Option<&'a crate::metadata::BrokerRegistration> {
        image
            .brokers
            .get(&self.config.node_id)
            .map(|b| &b.registration)
            .filter(|r| r.incarnation == crate::metadata::process_incarnation())
    }

    /// This process's broker epoch in `image` (KIP-903,
    /// `BrokerRegistration::broker_epoch`): its node's registration's when
    /// the image holds the registration this process made (this start's
    /// incarnation), else -1 (not registered yet, or only a past life's
    /// registration is known). Sent in every replica fetch; the leader
    /// proposes a follower for the ISR only with its current epoch (or
    /// none, -1, as Kafka takes it).
    pub fn broker_epoch_in(&self, image: &MetadataImage) -> i64 {
        self.own_registration(image)
            .map_or(-1, crate::metadata::BrokerRegistration::broker_epoch)
    }

    /// The partition if it is open on this shard and this shard leads it:
    /// a replicated partition's follower takes no appends of its own
    /// (`docs/replication.md` §4.3).
    pub fn led_partition(&self, tp: &TopicPartition) -> Option<Rc<Partition>> {
        let image = self.image();
        let state = image
            .topic(&tp.topic)
            .and_then(|t| t.replica_state(tp.partition.0));
        match state {
            Some(s) if s.leader != self.config.node_id_of(self.shard) => return None,
            Some(_) if !self.acts_in(&image) => return None,
            _ => {}
        }
        self.partition(tp)
    }

    /// Asks the controller for an ISR change of a partition this shard
    /// leads (AlterPartition, in the background). The committed change
    /// comes back in the image; a refusal drops the proposal. An answer
    /// that leaves its fate open (no answer in time, the controller
    /// unreachable or no longer leading the quorum: the change may still
    /// commit, as a Raft entry a deposed leader appended can) keeps it in
    /// flight, so the followers it adds keep holding the HW, and asks
    /// again until an answer or the image settles it, as Kafka's
    /// AlterPartitionManager retries. Dropped there, the HW could pass a
    /// follower the change then put in the ISR without the data below
    /// the HW: elected, it lost acknowledged writes (chaos seed
    /// 2707876069, docs/replication.md §8.1).
    pub fn alter_isr(self: &Rc<Self>, p: crate::replication::leading::IsrProposal) {
        let ctx = self.clone();
        glommio::spawn_local(async move {
            let request = || ControllerRequest::AlterPartition {
                broker: ctx.config.node_id_of(ctx.shard),
                topic_id: p.topic_id,
                partition: p.tp.partition.0,
                leader_epoch: p.leader_epoch,
                partition_epoch: p.partition_epoch,
                isr: p.isr.clone(),
                broker_epochs: p.broker_epochs.clone(),
            };
            loop {
                let outcome = ctx.invoke_controller(request()).await;
                match alter_partition_fate(&outcome, p.partition_epoch) {
                    AlterFate::Changed => {
                        if let Ok(ControllerReply::Partition(Ok(state))) = &outcome {
                            tracing::info!(tp = %p.tp, isr = ?state.isr, "the ISR changed");
                        }
                    }
                    AlterFate::Moved => {
                        tracing::info!(tp = %p.tp, isr = ?p.isr, ?outcome,
                            "AlterPartition not made: the partition changed meanwhile");
                    }
                    AlterFate::Refused => {
                        tracing::warn!(tp = %p.tp, isr = ?p.isr, ?outcome, "AlterPartition was not made");
                        ctx.leading.proposal_failed(&p);
                    }
                    AlterFate::Unknown => {
                        tracing::warn!(tp = %p.tp, isr = ?p.isr, ?outcome,
                            "AlterPartition unanswered; it stays in flight and is asked again");
                        glommio::timer::sleep(ALTER_PARTITION_RETRY).await;
                        if ctx.leading.still_proposed(&p) {
                            continue;
                        }
                    }
                }
                break;
            }
        })
        .detach();
    }

    fn missing_partition(&self, tp: &TopicPartition) -> MarkerError {
        if self.image().has_partition(&tp.topic, tp.partition.0) {
            MarkerError::NotLeader
        } else {
            MarkerError::UnknownPartition
        }
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
            if block.is_some() {
                crate::metrics::record_producer_id_block();
            }
            ctx.producer_ids.add(block);
        })
        .detach();
    }

    /// Expires idle producers and writes a producer snapshot for every
    /// partition whose state changed, if it is quiescent. Run periodically
    /// and at shutdown.
    pub async fn maintain_producer_state(&self) {
        for p in self.partitions() {
            p.maintain_producer_state(self.config.producer_id_expiration_ms)
                .await;
        }
    }

    /// Producer snapshots of every partition at a clean stop, empty tables
    /// included (`Partition::snapshot_at_stop`).
    pub async fn snapshot_producers_at_stop(&self) {
        for p in self.partitions() {
            p.snapshot_at_stop(self.config.producer_id_expiration_ms)
                .await;
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
        // Several nodes: replicated as Kafka replicates them, so their
        // coordinators fail over with their partitions' leaders
        // (`docs/replication.md` §4.6); one node keeps one replica.
        let replication_factor = match self.config.several_nodes() {
            false => -1,
            true if name == internal::CONSUMER_OFFSETS => {
                self.config.offsets_topic_replication_factor
            }
            true => self.config.transaction_state_log_replication_factor,
        };
        let request = ControllerRequest::CreateTopics {
            topics: vec![messages::NewTopic {
                name: name.to_string(),
                num_partitions: internal::INTERNAL_TOPIC_PARTITIONS,
                replication_factor,
                assignments: Vec::new(),
                configs: internal::internal_topic_configs(if name == internal::CONSUMER_OFFSETS {
                    self.config.offsets_topic_segment_bytes
                } else {
                    self.config.transaction_state_log_segment_bytes
                }),
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
            ControllerReply::ProducerIds(_)
            | ControllerReply::Acls(_)
            | ControllerReply::Broker(_)
            | ControllerReply::Partition(_)
            | ControllerReply::Elections(_)
            | ControllerReply::Reassignments(_) => Err(ControllerError::Unavailable),
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
        // On shard 0 not cut short from here: the controller bounds its own
        // waits by the deadline and must not be cancelled half-way.
        let call = self.router.invoke(
            0,
            deadline,
            request,
            |request| async move {
                match &self.controller {
                    Some(controller) => controller.handle(self, request, deadline).await,
                    None => Err(ControllerError::Unavailable),
                }
            },
            |request, reply| ShardMessage::Controller {
                request,
                deadline,
                reply,
            },
        );
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
            ShardMessage::Sample { reply } => {
                let _ = reply.send(self.metrics_sample());
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An AlterPartition is dropped only when the controller refused it
    /// with the partition as it was; an answer that leaves its fate open
    /// keeps it in flight (its entry may still commit), and one refused
    /// because the partition moved on waits for the image.
    #[test]
    fn an_alter_partition_without_a_clear_answer_stays_in_flight() {
        use ControllerError as E;
        let mut state = crate::metadata::PartitionState::new(vec![1, 2, 3]);
        state.partition_epoch = 5;
        let fate = |r: Result<ControllerReply, ControllerError>| alter_partition_fate(&r, 4);
        assert_eq!(
            fate(Ok(ControllerReply::Partition(Ok(state.clone())))),
            AlterFate::Changed
        );
        state.partition_epoch = 4;
        assert_eq!(
            fate(Ok(ControllerReply::Partition(Ok(state)))),
            AlterFate::Refused,
            "nothing to change"
        );
        for e in [
            E::NotController("n".into()),
            E::TimedOut("t".into()),
            E::Unavailable,
            E::Storage("s".into()),
        ] {
            assert_eq!(fate(Err(e.clone())), AlterFate::Unknown, "{e:?}");
            assert_eq!(
                fate(Ok(ControllerReply::Partition(Err(e.clone())))),
                AlterFate::Unknown,
                "{e:?}"
            );
        }
        for e in [
            E::NotLeader("l".into()),
            E::FencedLeaderEpoch("f".into()),
            E::InvalidUpdateVersion("v".into()),
        ] {
            assert_eq!(
                fate(Ok(ControllerReply::Partition(Err(e.clone())))),
                AlterFate::Moved,
                "{e:?}"
            );
        }
        for e in [
            E::IneligibleReplica("i".into()),
            E::InvalidRequest("r".into()),
            E::UnknownTopicId("u".into()),
        ] {
            assert_eq!(
                fate(Ok(ControllerReply::Partition(Err(e.clone())))),
                AlterFate::Refused,
                "{e:?}"
            );
        }
    }
}
