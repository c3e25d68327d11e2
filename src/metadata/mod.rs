//! Cluster metadata: topics, their partitions and which shard leads each, topic
//! configs, producer-id blocks, SCRAM credentials (salted, as Kafka's
//! `UserScramCredentialRecord`: never a password) and ACLs.
//!
//! The controller (shard 0) is the only writer. It validates a change, turns
//! it into a [`MetadataRecord`], proposes that record to the metadata log
//! ([`store`]: the Raft log of a quorum of one, [`quorum`]) and only once it
//! comes back committed (fdatasync'ed) applies it to a new
//! [`MetadataImage`]. Every shard
//! holds an immutable `Arc<MetadataImage>` that is swapped whole when the
//! controller broadcasts a new one; nothing in an image is ever mutated in
//! place, so a handler can hold one across awaits and see a consistent view.
//!
//! Partitions are assigned to shards round-robin when a topic is created,
//! starting after the shard that got the last partition of the previous topic
//! so that many 1-partition topics still spread over all shards. The
//! assignment is persisted: restarting with a different `--cores` keeps each
//! partition on `shard % cores`.
//!
//! Topics are known by id as well as by name: a partition directory records
//! its topic's id (`log::partition_meta`), and at start-up the controller
//! removes every directory whose id the replayed image no longer has (a
//! DeleteTopic durable in the log whose directory removal a crash cut
//! short), so a topic created again under the same name starts empty. A
//! corrupt record in the middle of the metadata log stops the start-up
//! ([`store`]).

pub mod credentials;
pub mod internal;
pub mod lease;
pub mod meta_properties;
pub mod quorum;
pub mod store;
pub mod topic_config;

use crate::auth::acl::{AclBinding, AclSnapshot};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

pub use topic_config::{ConfigError, TopicConfig};

/// Kafka's limit on topic name length.
pub const TOPIC_NAME_LENGTH_MAX: usize = 249;
/// Producer ids are handed to shards in blocks of this many.
pub const PRODUCER_ID_BLOCK_SIZE: i64 = 1000;

/// One change to the cluster metadata, as written to the metadata log.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type")]
pub enum MetadataRecord {
    CreateTopic {
        name: String,
        id: [u8; 16],
        /// The owning shard of each partition, by partition index.
        shards: Vec<usize>,
        configs: BTreeMap<String, String>,
        /// The node whose shards hold every partition (a quorum of several
        /// nodes, until partitions are replicated: `docs/replication.md`
        /// §3.2); absent for a single node's topics.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<i32>,
        /// A replicated topic (several nodes, replication factor above 1;
        /// `docs/replication.md` §4.3): each partition's replicas, ISR,
        /// leader and epochs, by partition index, as Kafka's
        /// `PartitionRecord`. Empty for a topic of one replica.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        replicated: Vec<PartitionState>,
    },
    DeleteTopic {
        name: String,
    },
    /// New partitions appended to a topic, with their owning shards.
    AddPartitions {
        name: String,
        shards: Vec<usize>,
        /// The new partitions' states when the topic is replicated.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        replicated: Vec<PartitionState>,
    },
    /// Kafka's `PartitionChangeRecord`, as a whole new state: a replicated
    /// partition's leader, ISR or ELR changed (its epochs with them).
    PartitionChange {
        topic_id: [u8; 16],
        partition: i32,
        state: PartitionState,
    },
    /// Replaces the whole set of a topic's config overrides.
    SetTopicConfigs {
        name: String,
        configs: BTreeMap<String, String>,
    },
    /// Producer ids below `next` have been handed out.
    ProducerIdBlock {
        next: i64,
    },
    /// The broker started, and leads every partition in leader epoch
    /// `epoch` from now on (one more than at its previous start; see
    /// [`next_leader_epoch`]).
    LeaderEpoch {
        epoch: i32,
    },
    /// Kafka's `UserScramCredentialRecord`: sets `name`'s credential for
    /// one SCRAM mechanism (Kafka's type id: 1 SCRAM-SHA-256, 2 SCRAM-SHA-512).
    UserScramCredential {
        name: String,
        mechanism: i8,
        credential: ScramCredential,
    },
    /// Kafka's `RemoveUserScramCredentialRecord`.
    RemoveUserScramCredential {
        name: String,
        mechanism: i8,
    },
    /// ACL bindings added (CreateAcls); one already present is kept once.
    CreateAcls {
        acls: Vec<AclBinding>,
    },
    /// ACL bindings removed (DeleteAcls: the bindings its filters matched).
    DeleteAcls {
        acls: Vec<AclBinding>,
    },
    /// Kafka's `RegisterBrokerRecord` (several nodes): a node's brokers
    /// and where clients reach them, registered unfenced; a registration
    /// with a new incarnation replaces the node's previous one.
    RegisterBroker {
        registration: BrokerRegistration,
    },
    /// Kafka's `FenceBrokerRecord`: the node's heartbeats stopped; its
    /// brokers are not listed and its partitions are offline.
    FenceBroker {
        node: i32,
    },
    /// Kafka's `UnfenceBrokerRecord`: a fenced node heartbeats again.
    UnfenceBroker {
        node: i32,
    },
    /// Kafka's `UnregisterBrokerRecord` (UnregisterBroker, `kafka-cluster
    /// unregister`; `docs/replication.md` §3.2): the node's registration
    /// is gone, so no node lists its brokers; its leader epoch is kept
    /// ([`MetadataImage::retired_epochs`]) so that its next start leads
    /// in a later one. A node still running registers again with its next
    /// heartbeat, as Kafka's broker does.
    UnregisterBroker {
        node: i32,
    },
    /// Several nodes: a new Raft leader's first entry, which commits every
    /// entry before it (Raft's no-op). Changes nothing else: the leader
    /// epoch of a node's partitions moves when that node restarts
    /// ([`BrokerRegistration::leader_epoch`]), not when the quorum's
    /// leader changes.
    TermStart {
        term: u64,
    },
    /// Several nodes: the cluster's id, written once by the quorum's first
    /// leader (its own first id, from its `meta.properties`). Every node
    /// answers clients with it and keeps it in its `meta.properties`, so
    /// all nodes of a cluster name the same cluster (Kafka formats every
    /// node with one id; KIP-1102 clients rebootstrap on a mismatch).
    ClusterId {
        id: String,
    },
}

/// A replicated partition's state (Kafka's `PartitionRecord`; several
/// nodes, `docs/replication.md` §4.3). Replicas are broker ids
/// (`node * 1000 + shard`), on distinct nodes, the preferred leader first.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PartitionState {
    pub replicas: Vec<i32>,
    /// The in-sync replicas: the HW is the least log end among them.
    pub isr: Vec<i32>,
    /// Eligible leader replicas (KIP-966): left the ISR only because it
    /// shrank below `min.insync.replicas`, so they hold everything
    /// committed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub elr: Vec<i32>,
    /// The leading broker, -1 for none.
    pub leader: i32,
    /// Bumped by every leader change (and a leader's restart).
    pub leader_epoch: i32,
    /// Bumped by every change of this state (AlterPartition's fence).
    pub partition_epoch: i32,
    /// A reassignment in progress (KIP-455, `docs/replication.md` §4.5):
    /// the replicas being added (target minus original). `replicas` is
    /// then the target followed by the original replicas not in it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adding: Vec<i32>,
    /// The replicas being removed (original minus target).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removing: Vec<i32>,
}

impl PartitionState {
    /// A new partition: every replica in sync, the first one leading, in
    /// the first epoch.
    pub fn new(replicas: Vec<i32>) -> PartitionState {
        PartitionState {
            leader: replicas.first().copied().unwrap_or(-1),
            isr: replicas.clone(),
            replicas,
            elr: Vec::new(),
            leader_epoch: crate::types::FIRST_LEADER_EPOCH,
            partition_epoch: 0,
            adding: Vec::new(),
            removing: Vec::new(),
        }
    }

    /// Whether a reassignment is in progress (KIP-455).
    pub fn is_reassigning(&self) -> bool {
        !self.adding.is_empty() || !self.removing.is_empty()
    }

    /// The replicas before the reassignment in progress: all but the ones
    /// being added, in order.
    pub fn original_replicas(&self) -> Vec<i32> {
        self.replicas
            .iter()
            .copied()
            .filter(|b| !self.adding.contains(b))
            .collect()
    }

    /// This node's replica: its broker id.
    pub fn replica_on(&self, node: i32) -> Option<i32> {
        self.replicas.iter().copied().find(|&b| node_of(b) == node)
    }
}

/// The node of broker `broker` (`node * 1000 + shard`).
pub fn node_of(broker: i32) -> i32 {
    broker.div_euclid(1000)
}

/// The shard of broker `broker` on its node.
pub fn shard_of(broker: i32) -> usize {
    broker.rem_euclid(1000) as usize
}

/// Where a partition lives, seen from one node ([`MetadataImage::placement`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// No such topic or partition.
    Unknown,
    /// Only other nodes hold it.
    Elsewhere,
    /// This node holds it (a replica, leading or following) on this shard
    /// (already `% cores`).
    Local(usize),
}

/// A node's brokers as it registers them (several nodes,
/// `docs/replication.md` §3.2): broker `node * 1000 + k` for each shard k.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct BrokerRegistration {
    pub node: i32,
    pub shards: usize,
    /// One per listener, its advertised address.
    pub endpoints: Vec<BrokerEndpoint>,
    /// Fresh at every start of the node's process (Kafka's incarnation
    /// id): a new one means the node restarted.
    pub incarnation: [u8; 16],
    /// The leader epoch the node leads its partitions in since this start:
    /// one more than its previous registration's (every start begins a new
    /// epoch, as a single node's does), at least the image's.
    pub leader_epoch: i32,
    /// Whether the node's previous process stopped cleanly (its logs were
    /// closed whole), as Kafka's registration tells the controller: one
    /// that did not may have lost what its page cache held (a machine
    /// crash), so its replicas leave every ISR and ELR
    /// (`docs/replication.md` §4.4). Absent in older logs: clean.
    #[serde(default = "clean_default")]
    pub clean_shutdown: bool,
}

fn clean_default() -> bool {
    true
}

/// Where clients of one listener reach a node's brokers.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct BrokerEndpoint {
    /// The listener's security protocol (`PLAINTEXT`, `SASL_SSL`, ...): a
    /// node has at most one listener of each, and a client is told the
    /// endpoints of the listener it came in on, as Kafka matches listener
    /// names.
    pub protocol: String,
    pub host: String,
    /// Shard 0's port; shard k listens on `port + k`.
    pub port: u16,
}

impl BrokerRegistration {
    /// The node's broker epoch (Kafka's, KIP-903): its registration's
    /// leader epoch, one more at every start of the node, so it names the
    /// process that registered; fjord has no separate broker epoch. A
    /// follower sends it in every fetch, the leader passes it on in
    /// AlterPartition, and the controller refuses an ISR member whose
    /// epoch is not its current registration's (`docs/replication.md`
    /// §4.3).
    pub fn broker_epoch(&self) -> i64 {
        i64::from(self.leader_epoch)
    }

    /// The endpoint for clients of `protocol`'s listener, if it has one.
    pub fn endpoint(&self, protocol: &str) -> Option<&BrokerEndpoint> {
        self.endpoints.iter().find(|e| e.protocol == protocol)
    }
}

/// A registered node as the image holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisteredBroker {
    pub registration: BrokerRegistration,
    pub fenced: bool,
}

pub use crate::auth::scram::ScramCredential;

/// One topic as the image sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct TopicMeta {
    pub name: String,
    pub id: [u8; 16],
    /// The owning shard of each partition (as persisted; take `% cores`).
    pub shards: Vec<usize>,
    /// Overrides set on the topic; everything else is the broker default.
    pub configs: BTreeMap<String, String>,
    /// The node holding its partitions (None: this one; see
    /// `MetadataRecord::CreateTopic`). Unused when replicated.
    pub node: Option<i32>,
    /// Replicated: each partition's state, by index (then `shards` holds
    /// each partition's preferred leader's shard, for counting and
    /// round-robin only). Empty: one replica, placed by `shards`/`node`.
    pub replicated: Vec<PartitionState>,
}

impl TopicMeta {
    pub fn partition_count(&self) -> i32 {
        self.shards.len() as i32
    }

    pub fn is_internal(&self) -> bool {
        internal::is_internal(&self.name)
    }

    /// Whether node `node_id` holds this topic's partitions: only that node
    /// opens their logs and serves them, so a partition never has two logs
    /// (`docs/replication.md` §3.2).
    pub fn hosted_by(&self, node_id: i32) -> bool {
        if self.is_replicated() {
            return self
                .replicated
                .iter()
                .any(|p| p.replica_on(node_id).is_some());
        }
        self.node.is_none_or(|n| n == node_id)
    }

    /// Whether its partitions have replicas (`docs/replication.md` §4.3).
    pub fn is_replicated(&self) -> bool {
        !self.replicated.is_empty()
    }

    /// Partition `partition`'s replicated state.
    pub fn replica_state(&self, partition: i32) -> Option<&PartitionState> {
        self.replicated.get(usize::try_from(partition).ok()?)
    }

    /// Where partition `partition` lives, seen from node `node_id` with
    /// `cores` shards.
    pub fn placement(&self, partition: i32, node_id: i32, cores: usize) -> Placement {
        let Some(&shard) = usize::try_from(partition)
            .ok()
            .and_then(|i| self.shards.get(i))
        else {
            return Placement::Unknown;
        };
        if let Some(state) = self.replica_state(partition) {
            return match state.replica_on(node_id) {
                Some(b) => Placement::Local(shard_of(b) % cores),
                None => Placement::Elsewhere,
            };
        }
        if self.hosted_by(node_id) {
            Placement::Local(shard % cores)
        } else {
            Placement::Elsewhere
        }
    }

    /// The partition of this (internal) topic that coordinates `key`, a
    /// group id or transactional id (Kafka's `abs(hash(key)) % partitions`),
    /// and the shard that leads it on a server with `cores` shards.
    pub fn coordinator(&self, key: &str, cores: usize) -> Option<Coordinator> {
        let partition = internal::coordinator_partition(key, self.partition_count());
        let shard = *self.shards.get(usize::try_from(partition).ok()?)?;
        Some(Coordinator {
            partition,
            shard: shard % cores,
        })
    }
}

/// Where a partition's leader is, seen from one node
/// ([`MetadataImage::leader_at`]): where a write that only the leader may
/// take (a transaction marker, an AddPartitionsToTxn at the coordinator)
/// must be sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaderAt {
    /// No such topic or partition.
    Unknown,
    /// The partition exists but has no reachable leader now (a replicated
    /// partition without a leader, or a node not registered yet): try
    /// again after the next metadata change.
    NoLeader,
    /// A shard of this node leads it (already `% cores`).
    Local(usize),
    /// Broker `node * 1000 + shard` of another node leads it.
    Remote(i32),
}

/// Where a group or transactional id is coordinated ([`TopicMeta::coordinator`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Coordinator {
    /// The partition of `__consumer_offsets` or `__transaction_state`.
    pub partition: i32,
    /// The shard that leads it.
    pub shard: usize,
}

/// An immutable snapshot of the cluster metadata. Shared read-only by all
/// shards; replaced whole on every change.
#[derive(Clone, Debug, Default)]
pub struct MetadataImage {
    /// Bumped by every applied record; lets a shard skip stale broadcasts.
    pub version: u64,
    pub topics: BTreeMap<String, Arc<TopicMeta>>,
    pub topic_ids: HashMap<[u8; 16], String>,
    /// The first producer id not yet handed out.
    pub next_producer_id: i64,
    /// The shard that receives the next new partition.
    pub next_shard: usize,
    /// The leader epoch of every partition (`types::FIRST_LEADER_EPOCH`):
    /// the last [`MetadataRecord::LeaderEpoch`] replayed, None before any.
    pub leader_epoch: Option<i32>,
    /// SCRAM credentials by user name, then mechanism type id.
    pub scram_credentials: BTreeMap<String, BTreeMap<i8, Arc<ScramCredential>>>,
    /// Every ACL, indexed for the authorizer (`auth::acl`); replaced only
    /// by ACL records, so other changes share it.
    pub acls: Arc<AclSnapshot>,
    /// The nodes registered with the metadata quorum (several nodes), by
    /// node id; empty for a single node.
    pub brokers: BTreeMap<i32, Arc<RegisteredBroker>>,
    /// The cluster's id once the metadata quorum recorded it (several
    /// nodes; [`MetadataRecord::ClusterId`]): the first one recorded stays.
    pub cluster_id: Option<String>,
    /// The leader epoch of each unregistered node's last registration
    /// ([`MetadataRecord::UnregisterBroker`]), until it registers again:
    /// its next start leads its partitions in a later epoch. At most one
    /// entry per node that ever registered (only the quorum's members
    /// register, `shard::controller`).
    pub retired_epochs: BTreeMap<i32, i32>,
}

impl MetadataImage {
    /// The id clients see for the cluster: the recorded one, else this
    /// node's own (`fallback`, from its `meta.properties`).
    pub fn cluster_id_or<'a>(&'a self, fallback: &'a str) -> &'a str {
        self.cluster_id.as_deref().unwrap_or(fallback)
    }

    /// The leader epoch this node leads every partition in
    /// (`types::FIRST_LEADER_EPOCH` until the start-up record is applied).
    pub fn leader_epoch(&self) -> i32 {
        self.leader_epoch
            .unwrap_or(crate::types::FIRST_LEADER_EPOCH)
    }

    /// `user`'s credential for SCRAM mechanism `mechanism` (type id).
    pub fn scram_credential(&self, user: &str, mechanism: i8) -> Option<&Arc<ScramCredential>> {
        self.scram_credentials.get(user)?.get(&mechanism)
    }

    /// Node `node`'s registration if it is registered and not fenced.
    pub fn live_broker(&self, node: i32) -> Option<&BrokerRegistration> {
        self.brokers
            .get(&node)
            .filter(|b| !b.fenced)
            .map(|b| &b.registration)
    }

    pub fn topic(&self, name: &str) -> Option<&Arc<TopicMeta>> {
        self.topics.get(name)
    }

    pub fn topic_by_id(&self, id: &[u8; 16]) -> Option<&Arc<TopicMeta>> {
        self.topic_ids.get(id).and_then(|n| self.topics.get(n))
    }

    /// Where `key` is coordinated by internal topic `topic`; None while the
    /// topic does not exist (see [`TopicMeta::coordinator`]).
    pub fn coordinator(&self, topic: &str, key: &str, cores: usize) -> Option<Coordinator> {
        self.topics.get(topic)?.coordinator(key, cores)
    }

    /// The shard that leads `topic`/`partition` on a server with `cores` shards.
    /// The image has partition `partition` of `topic`.
    pub fn has_partition(&self, topic: &str, partition: i32) -> bool {
        self.topic(topic)
            .is_some_and(|t| (0..t.partition_count()).contains(&partition))
    }

    pub fn leader_shard(&self, topic: &str, partition: i32, cores: usize) -> Option<usize> {
        let t = self.topics.get(topic)?;
        let shard = *t.shards.get(usize::try_from(partition).ok()?)?;
        Some(shard % cores)
    }

    /// Where `topic`/`partition`'s leader is, seen from node `node_id` with
    /// `cores` shards. A replicated partition's leader is its
    /// `PartitionState::leader` (never a follower replica of this node); a
    /// topic of one replica is led by the shard `shards` names on its node.
    pub fn leader_at(&self, topic: &str, partition: i32, node_id: i32, cores: usize) -> LeaderAt {
        let Some(t) = self.topics.get(topic) else {
            return LeaderAt::Unknown;
        };
        let Some(&shard) = usize::try_from(partition)
            .ok()
            .and_then(|i| t.shards.get(i))
        else {
            return LeaderAt::Unknown;
        };
        let leader = match t.replica_state(partition) {
            Some(state) if state.leader < 0 => return LeaderAt::NoLeader,
            Some(state) => state.leader,
            None => match t.node {
                None => return LeaderAt::Local(shard % cores.max(1)),
                Some(n) if n == node_id => return LeaderAt::Local(shard % cores.max(1)),
                Some(n) => match self.brokers.get(&n) {
                    Some(b) if b.registration.shards > 0 => n
                        .saturating_mul(1000)
                        .saturating_add((shard % b.registration.shards) as i32),
                    _ => return LeaderAt::NoLeader,
                },
            },
        };
        if node_of(leader) == node_id {
            LeaderAt::Local(shard_of(leader) % cores.max(1))
        } else {
            LeaderAt::Remote(leader)
        }
    }

    /// Where `topic`/`partition` lives, seen from node `node_id`
    /// ([`TopicMeta::placement`]).
    pub fn placement(&self, topic: &str, partition: i32, node_id: i32, cores: usize) -> Placement {
        match self.topics.get(topic) {
            Some(t) => t.placement(partition, node_id, cores),
            None => Placement::Unknown,
        }
    }

    /// Replicas for `count` new partitions, `factor` each, on distinct
    /// live (registered, unfenced) nodes (`docs/replication.md` §4.1):
    /// partition i's preferred leader is on the (`next_shard` + i)-th live
    /// node, the others on the nodes after it, each on that node's shard
    /// `(next_shard + i) % shards`, so leaders spread over nodes and
    /// shards. None when fewer than `factor` nodes are live.
    pub fn place_replicas(&self, count: usize, factor: usize) -> Option<Vec<Vec<i32>>> {
        let live: Vec<&BrokerRegistration> = self
            .brokers
            .values()
            .filter(|b| !b.fenced)
            .map(|b| &b.registration)
            .collect();
        if factor == 0 || live.len() < factor {
            return None;
        }
        Some(
            (0..count)
                .map(|i| {
                    let turn = self.next_shard + i;
                    (0..factor)
                        .map(|j| {
                            let b = live[(turn + j) % live.len()];
                            let shard = turn % b.shards.max(1);
                            b.node.saturating_mul(1000).saturating_add(shard as i32)
                        })
                        .collect()
                })
                .collect(),
        )
    }

    /// How many nodes are registered and not fenced.
    pub fn live_node_count(&self) -> usize {
        self.brokers.values().filter(|b| !b.fenced).count()
    }

    /// Whether broker `broker` is a shard of a live (registered, unfenced)
    /// node.
    pub fn is_live_broker(&self, broker: i32) -> bool {
        self.live_broker_epoch(broker).is_some()
    }

    /// The broker epoch ([`BrokerRegistration::broker_epoch`]) of broker
    /// `broker`'s node when `broker` is a shard of a live (registered,
    /// unfenced) node; None otherwise. What a replica may join the ISR
    /// with (Kafka's `isReplicaIsrEligible`).
    pub fn live_broker_epoch(&self, broker: i32) -> Option<i64> {
        self.live_broker(node_of(broker))
            .filter(|b| broker >= 0 && shard_of(broker) < b.shards)
            .map(BrokerRegistration::broker_epoch)
    }

    /// Picks `count` shards round-robin, starting at `next_shard`.
    pub fn assign_shards(&self, count: usize, cores: usize) -> Vec<usize> {
        (0..count).map(|i| (self.next_shard + i) % cores).collect()
    }

    /// Returns the image with `record` applied. Records come from the
    /// controller (already validated) or from the log at start-up; one that
    /// does not apply (e.g. deleting a missing topic) leaves the image as is.
    pub fn apply(&self, record: &MetadataRecord) -> MetadataImage {
        let mut next = self.clone();
        next.version += 1;
        match record {
            MetadataRecord::CreateTopic {
                name,
                id,
                shards,
                configs,
                node,
                replicated,
            } => {
                if let Some(last) = shards.last() {
                    next.next_shard = last + 1;
                }
                next.topic_ids.insert(*id, name.clone());
                next.topics.insert(
                    name.clone(),
                    Arc::new(TopicMeta {
                        name: name.clone(),
                        id: *id,
                        shards: shards.clone(),
                        configs: configs.clone(),
                        node: *node,
                        replicated: replicated.clone(),
                    }),
                );
            }
            MetadataRecord::DeleteTopic { name } => {
                if let Some(t) = next.topics.remove(name) {
                    next.topic_ids.remove(&t.id);
                }
            }
            MetadataRecord::AddPartitions {
                name,
                shards,
                replicated,
            } => {
                if let Some(t) = next.topics.get(name) {
                    let mut t = (**t).clone();
                    t.shards.extend_from_slice(shards);
                    t.replicated.extend_from_slice(replicated);
                    if let Some(last) = shards.last() {
                        next.next_shard = last + 1;
                    }
                    next.topics.insert(name.clone(), Arc::new(t));
                }
            }
            MetadataRecord::PartitionChange {
                topic_id,
                partition,
                state,
            } => {
                let t = next
                    .topic_ids
                    .get(topic_id)
                    .and_then(|name| next.topics.get(name));
                if let Some(t) = t {
                    let mut t = (**t).clone();
                    if let Some(slot) = usize::try_from(*partition)
                        .ok()
                        .and_then(|i| t.replicated.get_mut(i))
                    {
                        *slot = state.clone();
                        next.topics.insert(t.name.clone(), Arc::new(t));
                    }
                }
            }
            MetadataRecord::SetTopicConfigs { name, configs } => {
                if let Some(t) = next.topics.get(name) {
                    let mut t = (**t).clone();
                    t.configs = configs.clone();
                    next.topics.insert(name.clone(), Arc::new(t));
                }
            }
            MetadataRecord::ProducerIdBlock { next: n } => {
                next.next_producer_id = next.next_producer_id.max(*n);
            }
            MetadataRecord::LeaderEpoch { epoch } => {
                next.leader_epoch = Some(next.leader_epoch.map_or(*epoch, |e| e.max(*epoch)));
            }
            MetadataRecord::UserScramCredential {
                name,
                mechanism,
                credential,
            } => {
                next.scram_credentials
                    .entry(name.clone())
                    .or_default()
                    .insert(*mechanism, Arc::new(credential.clone()));
            }
            MetadataRecord::RemoveUserScramCredential { name, mechanism } => {
                if let Some(by_mechanism) = next.scram_credentials.get_mut(name) {
                    by_mechanism.remove(mechanism);
                    if by_mechanism.is_empty() {
                        next.scram_credentials.remove(name);
                    }
                }
            }
            MetadataRecord::CreateAcls { acls } => {
                next.acls = next.acls.with_changes(acls, &[]);
            }
            MetadataRecord::DeleteAcls { acls } => {
                next.acls = next.acls.with_changes(&[], acls);
            }
            MetadataRecord::RegisterBroker { registration } => {
                next.retired_epochs.remove(&registration.node);
                next.brokers.insert(
                    registration.node,
                    Arc::new(RegisteredBroker {
                        registration: registration.clone(),
                        fenced: false,
                    }),
                );
            }
            MetadataRecord::UnregisterBroker { node } => {
                if let Some(b) = next.brokers.remove(node) {
                    next.retired_epochs
                        .insert(*node, b.registration.leader_epoch);
                }
            }
            MetadataRecord::TermStart { .. } => {}
            MetadataRecord::ClusterId { id } => {
                if next.cluster_id.is_none() {
                    next.cluster_id = Some(id.clone());
                }
            }
            MetadataRecord::FenceBroker { node } | MetadataRecord::UnfenceBroker { node } => {
                let fenced = matches!(record, MetadataRecord::FenceBroker { .. });
                if let Some(b) = next.brokers.get(node) {
                    next.brokers.insert(
                        *node,
                        Arc::new(RegisteredBroker {
                            registration: b.registration.clone(),
                            fenced,
                        }),
                    );
                }
            }
        }
        next
    }
}

/// The leader epoch a broker starts in, given the image its metadata log
/// replays to (`had_records`: the log was not empty). Every start begins a
/// new epoch, so that data appended after a restart (which may have
/// truncated a torn tail) is told apart from what a consumer read before it
/// (OffsetForLeaderEpoch, KIP-320). A broker's very first start leads in
/// epoch 0, as a new Kafka partition does; a data dir written before the
/// epoch was recorded has batches of epoch 0 and starts in epoch 1. Epochs
/// stop growing at `i32::MAX` (two billion restarts).
pub fn next_leader_epoch(image: &MetadataImage, had_records: bool) -> i32 {
    match image.leader_epoch {
        Some(epoch) => epoch.saturating_add(1),
        None if had_records => crate::types::FIRST_LEADER_EPOCH + 1,
        None => crate::types::FIRST_LEADER_EPOCH,
    }
}

/// Why a topic name is not acceptable (Kafka's `Topic.validate`).
pub fn validate_topic_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("Topic name is illegal, it can't be empty".into());
    }
    if name == "." || name == ".." {
        return Err("Topic name cannot be \".\" or \"..\"".into());
    }
    if name.len() > TOPIC_NAME_LENGTH_MAX {
        return Err(format!(
            "Topic name is illegal, it can't be longer than {TOPIC_NAME_LENGTH_MAX} characters"
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return Err(format!(
            "Topic name \"{name}\" is illegal, it contains a character other than ASCII alphanumerics, '.', '_' and '-'"
        ));
    }
    Ok(())
}

/// A fresh random topic id (never all zeros, which Kafka reserves).
/// This process's incarnation id (Kafka's): fresh at every start, the
/// same on every shard; a node registers with it (several nodes,
/// [`BrokerRegistration::incarnation`]).
pub fn process_incarnation() -> [u8; 16] {
    static INCARNATION: std::sync::OnceLock<[u8; 16]> = std::sync::OnceLock::new();
    *INCARNATION.get_or_init(new_topic_id)
}

pub fn new_topic_id() -> [u8; 16] {
    loop {
        let id: [u8; 16] = rand::random();
        if id != [0; 16] {
            return id;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create(name: &str, shards: Vec<usize>) -> MetadataRecord {
        MetadataRecord::CreateTopic {
            name: name.into(),
            id: new_topic_id(),
            shards,
            configs: BTreeMap::new(),
            node: None,
            replicated: Vec::new(),
        }
    }

    /// Broker records: registered unfenced, fenced and unfenced in place,
    /// a new incarnation replaces the registration; a TermStart changes
    /// nothing but the version; each record survives its JSON.
    #[test]
    fn broker_records_apply_and_round_trip() {
        let reg = |incarnation: u8| BrokerRegistration {
            node: 2,
            shards: 3,
            endpoints: vec![BrokerEndpoint {
                protocol: "PLAINTEXT".into(),
                host: "10.0.0.2".into(),
                port: 9092,
            }],
            incarnation: [incarnation; 16],
            leader_epoch: 4,
            clean_shutdown: true,
        };
        let records = [
            MetadataRecord::RegisterBroker {
                registration: reg(1),
            },
            MetadataRecord::FenceBroker { node: 2 },
            MetadataRecord::UnfenceBroker { node: 2 },
            MetadataRecord::FenceBroker { node: 2 },
            MetadataRecord::RegisterBroker {
                registration: reg(7),
            },
            MetadataRecord::TermStart { term: 5 },
            MetadataRecord::FenceBroker { node: 9 },
        ];
        let mut image = MetadataImage::default();
        let mut fenced = Vec::new();
        for r in &records {
            let json = serde_json::to_vec(r).unwrap();
            assert_eq!(&serde_json::from_slice::<MetadataRecord>(&json).unwrap(), r);
            image = image.apply(r);
            fenced.push(image.brokers.get(&2).map(|b| b.fenced));
        }
        assert_eq!(
            fenced,
            [false, true, false, true, false, false, false].map(Some)
        );
        assert_eq!(
            image.brokers.len(),
            1,
            "an unknown node is not fenced into being"
        );
        assert_eq!(image.live_broker(2), Some(&reg(7)));
        assert_eq!(image.version, records.len() as u64);
        assert_eq!(image.leader_epoch, None);
        assert_eq!(
            image
                .live_broker(2)
                .unwrap()
                .endpoint("PLAINTEXT")
                .unwrap()
                .port,
            9092
        );
        assert!(image.live_broker(2).unwrap().endpoint("SSL").is_none());
    }

    /// UnregisterBroker: the registration goes (a fenced or a live one),
    /// its leader epoch is kept until the node registers again, an
    /// unknown node changes nothing; the record survives its JSON and a
    /// log of the older records still loads beside it.
    #[test]
    fn unregister_broker_removes_the_registration_and_keeps_its_epoch() {
        let reg = |node: i32, leader_epoch: i32| BrokerRegistration {
            node,
            shards: 2,
            endpoints: Vec::new(),
            incarnation: [node as u8; 16],
            leader_epoch,
            clean_shutdown: true,
        };
        let image = MetadataImage::default()
            .apply(&MetadataRecord::RegisterBroker {
                registration: reg(1, 3),
            })
            .apply(&MetadataRecord::RegisterBroker {
                registration: reg(2, 5),
            })
            .apply(&MetadataRecord::FenceBroker { node: 2 });
        let record = MetadataRecord::UnregisterBroker { node: 2 };
        let json = serde_json::to_string(&record).unwrap();
        assert_eq!(json, r#"{"type":"UnregisterBroker","node":2}"#);
        assert_eq!(
            serde_json::from_str::<MetadataRecord>(&json).unwrap(),
            record
        );
        let gone = image.apply(&record);
        assert!(!gone.brokers.contains_key(&2));
        assert_eq!(gone.live_broker(1), Some(&reg(1, 3)));
        assert_eq!(gone.retired_epochs.get(&2), Some(&5));
        assert!(!gone.is_live_broker(2000));
        // Unknown now: nothing changes but the version.
        let again = gone.apply(&record);
        assert_eq!(again.brokers.len(), 1);
        assert_eq!(again.retired_epochs.get(&2), Some(&5));
        // A live node goes as well; registered again, its retired epoch
        // is dropped.
        let live = gone.apply(&MetadataRecord::UnregisterBroker { node: 1 });
        assert!(live.brokers.is_empty());
        let back = live.apply(&MetadataRecord::RegisterBroker {
            registration: reg(2, 6),
        });
        assert_eq!(back.live_broker(2), Some(&reg(2, 6)));
        assert!(!back.retired_epochs.contains_key(&2));
        assert_eq!(back.retired_epochs.get(&1), Some(&3));
        // Records written before UnregisterBroker existed load unchanged.
        let old = r#"{"type":"FenceBroker","node":2}"#;
        assert_eq!(
            serde_json::from_str::<MetadataRecord>(old).unwrap(),
            MetadataRecord::FenceBroker { node: 2 }
        );
    }

    fn registered(nodes: &[(i32, usize)]) -> MetadataImage {
        let mut image = MetadataImage::default();
        for &(node, shards) in nodes {
            image = image.apply(&MetadataRecord::RegisterBroker {
                registration: BrokerRegistration {
                    node,
                    shards,
                    endpoints: Vec::new(),
                    incarnation: [node as u8; 16],
                    leader_epoch: 0,
                    clean_shutdown: true,
                },
            });
        }
        image
    }

    /// The leader of a replicated partition is its state's leader: a local
    /// follower replica is not it; a one-replica topic is led on its node,
    /// at the shard `shards` names (modulo that node's shards).
    #[test]
    fn leaders_are_found_on_this_node_or_another() {
        let image = registered(&[(1, 2), (2, 4), (3, 1)]);
        let mut lost = PartitionState::new(vec![3000, 1000]);
        lost.leader = -1;
        let image = image
            .apply(&MetadataRecord::CreateTopic {
                name: "r".into(),
                id: new_topic_id(),
                shards: vec![1, 0, 0],
                configs: BTreeMap::new(),
                node: None,
                replicated: vec![
                    PartitionState::new(vec![1001, 2001]),
                    PartitionState::new(vec![2000, 1000]),
                    lost,
                ],
            })
            .apply(&MetadataRecord::CreateTopic {
                name: "one".into(),
                id: new_topic_id(),
                shards: vec![5, 2],
                configs: BTreeMap::new(),
                node: Some(2),
                replicated: Vec::new(),
            })
            .apply(&MetadataRecord::CreateTopic {
                name: "away".into(),
                id: new_topic_id(),
                shards: vec![0],
                configs: BTreeMap::new(),
                node: Some(9),
                replicated: Vec::new(),
            })
            .apply(&create("single", vec![3]));
        assert_eq!(image.leader_at("r", 0, 1, 2), LeaderAt::Local(1));
        assert_eq!(image.leader_at("r", 0, 2, 4), LeaderAt::Remote(1001));
        // Node 1 holds a follower of partition 1 on shard 0: not the leader.
        assert_eq!(image.leader_at("r", 1, 1, 2), LeaderAt::Remote(2000));
        assert_eq!(image.leader_at("r", 1, 2, 4), LeaderAt::Local(0));
        assert_eq!(image.leader_at("r", 2, 1, 2), LeaderAt::NoLeader);
        assert_eq!(image.leader_at("r", 3, 1, 2), LeaderAt::Unknown);
        assert_eq!(image.leader_at("r", -1, 1, 2), LeaderAt::Unknown);
        assert_eq!(image.leader_at("one", 0, 2, 4), LeaderAt::Local(1));
        assert_eq!(image.leader_at("one", 0, 1, 2), LeaderAt::Remote(2001));
        assert_eq!(image.leader_at("one", 1, 3, 1), LeaderAt::Remote(2002));
        assert_eq!(image.leader_at("away", 0, 1, 2), LeaderAt::NoLeader);
        assert_eq!(image.leader_at("single", 0, 1, 2), LeaderAt::Local(1));
        assert_eq!(image.leader_at("nope", 0, 1, 2), LeaderAt::Unknown);
    }

    /// Replicas go to distinct live nodes, leaders rotate over nodes and
    /// shards, a fenced node gets none, and too few live nodes place
    /// nothing.
    #[test]
    fn replicas_are_placed_on_distinct_live_nodes() {
        let image = registered(&[(1, 2), (2, 2), (3, 1)]);
        let placed = image.place_replicas(4, 3).unwrap();
        assert_eq!(
            placed,
            vec![
                vec![1000, 2000, 3000],
                vec![2001, 3000, 1001],
                vec![3000, 1000, 2000],
                vec![1001, 2001, 3000],
            ]
        );
        for replicas in &placed {
            let mut nodes: Vec<i32> = replicas.iter().map(|&b| node_of(b)).collect();
            nodes.sort();
            nodes.dedup();
            assert_eq!(nodes.len(), 3);
        }
        assert_eq!(image.place_replicas(1, 4), None);
        let fenced = image.apply(&MetadataRecord::FenceBroker { node: 2 });
        assert_eq!(fenced.place_replicas(1, 3), None);
        assert!(fenced
            .place_replicas(3, 2)
            .unwrap()
            .iter()
            .flatten()
            .all(|&b| node_of(b) != 2));
        assert!(image.is_live_broker(2001) && !image.is_live_broker(2002));
        assert!(!fenced.is_live_broker(2000) && !image.is_live_broker(-1));
    }

    /// A replicated topic: each node sees its own replica's shard; a node
    /// without a replica sees it elsewhere; a PartitionChange replaces one
    /// partition's state; the records survive their JSON, and a record
    /// without the field reads as a topic of one replica.
    #[test]
    fn replicated_partitions_are_placed_per_node_and_changed_whole() {
        let id = new_topic_id();
        let create = MetadataRecord::CreateTopic {
            name: "r".into(),
            id,
            shards: vec![0, 1],
            configs: BTreeMap::new(),
            node: None,
            replicated: vec![
                PartitionState::new(vec![1000, 2001]),
                PartitionState::new(vec![2001, 3000]),
            ],
        };
        let mut change = PartitionState::new(vec![2001, 3000]);
        change.leader = 3000;
        change.isr = vec![3000];
        change.leader_epoch = 1;
        change.partition_epoch = 1;
        let change = MetadataRecord::PartitionChange {
            topic_id: id,
            partition: 1,
            state: change,
        };
        for r in [&create, &change] {
            let json = serde_json::to_vec(r).unwrap();
            assert_eq!(&serde_json::from_slice::<MetadataRecord>(&json).unwrap(), r);
        }
        let image = MetadataImage::default().apply(&create);
        assert_eq!(image.placement("r", 0, 1, 4), Placement::Local(0));
        assert_eq!(image.placement("r", 0, 2, 4), Placement::Local(1));
        assert_eq!(image.placement("r", 0, 2, 1), Placement::Local(0));
        assert_eq!(image.placement("r", 0, 3, 4), Placement::Elsewhere);
        assert_eq!(image.placement("r", 2, 1, 4), Placement::Unknown);
        assert_eq!(image.placement("x", 0, 1, 4), Placement::Unknown);
        assert!(image.topic("r").unwrap().hosted_by(3));
        assert!(!image.topic("r").unwrap().hosted_by(4));
        let p = image.topic("r").unwrap().replica_state(0).unwrap();
        assert_eq!(
            (p.leader, p.isr.clone(), p.leader_epoch),
            (1000, vec![1000, 2001], 0)
        );
        let changed = image.apply(&change);
        let p = changed.topic("r").unwrap().replica_state(1).unwrap();
        assert_eq!(
            (p.leader, p.isr.clone(), p.leader_epoch),
            (3000, vec![3000], 1)
        );
        assert_eq!(
            changed.topic("r").unwrap().replica_state(0),
            image.topic("r").unwrap().replica_state(0)
        );
        let old = br#"{"type":"CreateTopic","name":"o","id":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"shards":[0],"configs":{}}"#;
        let old: MetadataRecord = serde_json::from_slice(old).unwrap();
        let image = MetadataImage::default().apply(&old);
        assert!(!image.topic("o").unwrap().is_replicated());
        assert_eq!(image.placement("o", 0, 7, 2), Placement::Local(0));
    }

    #[test]
    fn round_robin_continues_across_topics() {
        let img = MetadataImage::default();
        let s = img.assign_shards(3, 2);
        assert_eq!(s, vec![0, 1, 0]);
        let img = img.apply(&create("a", s));
        assert_eq!(img.assign_shards(1, 2), vec![1]);
        assert_eq!(img.leader_shard("a", 2, 2), Some(0));
        assert_eq!(img.leader_shard("a", 3, 2), None);
        assert_eq!(img.leader_shard("a", -1, 2), None);
    }

    #[test]
    fn delete_and_add_partitions() {
        let img = MetadataImage::default().apply(&create("a", vec![0]));
        let img = img.apply(&MetadataRecord::AddPartitions {
            name: "a".into(),
            shards: vec![1, 0],
            replicated: Vec::new(),
        });
        assert_eq!(img.topic("a").unwrap().partition_count(), 3);
        let id = img.topic("a").unwrap().id;
        assert!(img.topic_by_id(&id).is_some());
        let img = img.apply(&MetadataRecord::DeleteTopic { name: "a".into() });
        assert!(img.topic("a").is_none() && img.topic_by_id(&id).is_none());
    }

    #[test]
    fn every_start_begins_a_new_leader_epoch() {
        let img = MetadataImage::default();
        assert_eq!(img.leader_epoch(), 0);
        assert_eq!(next_leader_epoch(&img, false), 0, "a fresh broker");
        assert_eq!(next_leader_epoch(&img, true), 1, "data of epoch 0 exists");
        let img = img.apply(&MetadataRecord::LeaderEpoch { epoch: 0 });
        assert_eq!(next_leader_epoch(&img, true), 1);
        let img = img.apply(&MetadataRecord::LeaderEpoch { epoch: 1 });
        assert_eq!(img.leader_epoch(), 1);
        // Replayed out of order (never written so), an epoch does not go back.
        let img = img.apply(&MetadataRecord::LeaderEpoch { epoch: 0 });
        assert_eq!(img.leader_epoch(), 1);
        let img = img.apply(&MetadataRecord::LeaderEpoch { epoch: i32::MAX });
        assert_eq!(next_leader_epoch(&img, true), i32::MAX);
    }

    #[test]
    fn scram_credentials_are_set_replaced_and_removed_per_mechanism() {
        let cred = |i| ScramCredential {
            salt: vec![1],
            stored_key: vec![2],
            server_key: vec![3],
            iterations: i,
        };
        let set = |m, i| MetadataRecord::UserScramCredential {
            name: "alice".into(),
            mechanism: m,
            credential: cred(i),
        };
        let img = MetadataImage::default()
            .apply(&set(1, 4096))
            .apply(&set(2, 8192));
        let img = img.apply(&set(1, 5000));
        assert_eq!(img.scram_credential("alice", 1).unwrap().iterations, 5000);
        assert_eq!(img.scram_credential("alice", 2).unwrap().iterations, 8192);
        let img = img.apply(&MetadataRecord::RemoveUserScramCredential {
            name: "alice".into(),
            mechanism: 1,
        });
        assert!(img.scram_credential("alice", 1).is_none());
        let img = img.apply(&MetadataRecord::RemoveUserScramCredential {
            name: "alice".into(),
            mechanism: 2,
        });
        assert!(img.scram_credentials.is_empty());
        // The record survives the metadata log's encoding (and the old
        // log's, which a migration reads).
        let data = store::encode_record(&set(1, 4096)).unwrap();
        assert_eq!(store::decode_record(&data).unwrap(), set(1, 4096));
        let line = store::encode_line(&set(1, 4096)).unwrap();
        assert_eq!(
            store::decode_line(line.trim_end().as_bytes()).unwrap(),
            set(1, 4096)
        );
    }

    #[test]
    fn acl_records_add_and_remove_bindings_and_survive_a_replay() {
        use crate::auth::acl::*;
        let b = AclBinding {
            resource_type: ResourceType::Topic,
            resource_name: "t".into(),
            pattern_type: PatternType::Literal,
            principal: "User:alice".into(),
            host: "*".into(),
            operation: AclOperation::Read,
            permission: AclPermission::Allow,
        };
        let add = MetadataRecord::CreateAcls {
            acls: vec![b.clone(), b.clone()],
        };
        // The record goes through the log's JSON form and back unchanged.
        let data = store::encode_record(&add).unwrap();
        assert_eq!(store::decode_record(&data).unwrap(), add);
        let line = store::encode_line(&add).unwrap();
        assert_eq!(store::decode_line(line.trim_end().as_bytes()).unwrap(), add);
        let img = MetadataImage::default().apply(&add);
        assert_eq!(img.acls.len(), 1);
        let unrelated = img.apply(&MetadataRecord::ProducerIdBlock { next: 5 });
        assert!(Arc::ptr_eq(&img.acls, &unrelated.acls));
        let img = img.apply(&MetadataRecord::DeleteAcls { acls: vec![b] });
        assert!(img.acls.is_empty());
    }

    #[test]
    fn topic_names_follow_kafka_rules() {
        assert!(validate_topic_name("orders.v1_x-2").is_ok());
        assert!(validate_topic_name("").is_err());
        assert!(validate_topic_name("..").is_err());
        assert!(validate_topic_name("a b").is_err());
        assert!(validate_topic_name(&"x".repeat(250)).is_err());
    }
}
