//! Messages that cross shards. Everything here is `Send` and owns its data.

use crate::auth::acl::{AclBinding, AclBindingFilter};
use crate::metadata::MetadataImage;
use crate::partition::{MarkerError, TxnMarker};
use futures::channel::oneshot;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A topic to create, as CreateTopics or auto-creation asks for it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NewTopic {
    pub name: String,
    /// -1 = the broker's `num.partitions`.
    pub num_partitions: i32,
    /// -1 = default; fjord keeps one replica, so only 1 is accepted otherwise.
    pub replication_factor: i16,
    /// Manual assignment: per partition, the replica node ids (first = leader).
    pub assignments: Vec<(i32, Vec<i32>)>,
    pub configs: BTreeMap<String, String>,
}

/// How one config key changes (IncrementalAlterConfigs ops; AlterConfigs is
/// a full replacement).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ConfigChange {
    /// Replace all overrides with these.
    ReplaceAll(BTreeMap<String, String>),
    /// Incremental: `Some(v)` sets, `None` deletes (reverts to the default).
    Incremental(Vec<(String, Option<String>)>),
}

/// Work only the controller (shard 0) does. Serializable: a node that
/// does not lead the metadata quorum forwards it to the node that does
/// (`shard::controller`, `docs/replication.md` §3.2).
#[derive(Debug, Serialize, Deserialize)]
pub enum ControllerRequest {
    CreateTopics {
        topics: Vec<NewTopic>,
        validate_only: bool,
    },
    DeleteTopics {
        names: Vec<String>,
    },
    CreatePartitions {
        /// Topic and its new total partition count.
        topics: Vec<(String, i32)>,
        validate_only: bool,
        /// The manual assignments of the new partitions (per new partition,
        /// its replicas' broker ids, the first the preferred leader) of the
        /// topics that came with one; absent in requests forwarded by
        /// older nodes.
        #[serde(default)]
        assignments: Vec<(String, Vec<Vec<i32>>)>,
    },
    AlterConfigs {
        changes: Vec<(String, ConfigChange)>,
        validate_only: bool,
    },
    /// A block of producer ids for a shard.
    AllocateProducerIds,
    /// SCRAM credentials set or removed (AlterUserScramCredentials, already
    /// validated but for what needs the image); one item per user.
    AlterScramCredentials {
        changes: Vec<(String, ScramChange)>,
    },
    /// ACL bindings to add (already validated by the handler).
    CreateAcls {
        acls: Vec<AclBinding>,
    },
    /// ACL filters whose matching bindings are removed.
    DeleteAcls {
        filters: Vec<AclBindingFilter>,
    },
    /// Several nodes: a node's heartbeat to the quorum's leader, carrying
    /// its registration (`docs/replication.md` §3.2). Not logged, unless
    /// the node is not registered with this incarnation (RegisterBroker)
    /// or is fenced (UnfenceBroker).
    BrokerHeartbeat {
        registration: crate::metadata::BrokerRegistration,
    },
    /// Several nodes: the leader fences nodes whose heartbeats stopped.
    /// Never forwarded (only the leader keeps heartbeat times).
    FenceBrokers {
        nodes: Vec<i32>,
    },
    /// Kafka's UnregisterBroker (`kafka-cluster unregister --id`): the
    /// node of broker `broker` (any of its shards' ids) is unregistered
    /// (`docs/replication.md` §3.2); BROKER_ID_NOT_REGISTERED for a
    /// broker of no registered node.
    UnregisterBroker {
        broker: i32,
    },
    /// Kafka's ElectLeaders: the preferred replica (or, `unclean`, any
    /// live one of a partition without a leader) made leader of the named
    /// partitions, or of every partition when None.
    ElectLeaders {
        unclean: bool,
        topics: Option<Vec<(String, Vec<i32>)>>,
    },
    /// Kafka's AlterPartitionReassignments (KIP-455): per topic, each
    /// partition's target replicas, or None to cancel its reassignment.
    /// `allow_rf_change` false (v1, KIP-860) refuses a target whose length
    /// is not the original replica count.
    AlterPartitionReassignments {
        allow_rf_change: bool,
        topics: Vec<ReassignTopic>,
    },
    /// Kafka's AlterPartition: the leader `broker` of a replicated
    /// partition asks for a new ISR, fenced by the epochs it leads in
    /// (`docs/replication.md` §4.3).
    AlterPartition {
        broker: i32,
        topic_id: [u8; 16],
        partition: i32,
        leader_epoch: i32,
        partition_epoch: i32,
        isr: Vec<i32>,
        /// The broker epoch of each member of `isr` as the leader saw it
        /// (AlterPartition v3's `NewIsrWithEpochs`, KIP-903): a new member
        /// whose epoch is not its node's current registration's is
        /// refused. A member not named, as in requests forwarded by older
        /// nodes, counts as -1: not checked, as Kafka's controller skips -1.
        #[serde(default)]
        broker_epochs: Vec<(i32, i64)>,
    },
}

/// One topic of an AlterPartitionReassignments: its name and, per
/// partition, the target replicas (None: cancel).
pub type ReassignTopic = (String, Vec<(i32, Option<Vec<i32>>)>);

/// One change of a user's SCRAM credentials.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ScramChange {
    Upsert {
        mechanism: i8,
        credential: crate::metadata::ScramCredential,
    },
    Delete {
        mechanism: i8,
    },
}

/// Why the controller refused one item of a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum ControllerError {
    #[error("Topic '{0}' already exists.")]
    TopicAlreadyExists(String),
    #[error("{0}")]
    InvalidTopic(String),
    #[error("This server does not host this topic-partition.")]
    UnknownTopic(String),
    #[error("{0}")]
    InvalidPartitions(String),
    #[error("{0}")]
    InvalidReplicationFactor(String),
    #[error("{0}")]
    InvalidReplicaAssignment(String),
    #[error("{0}")]
    InvalidConfig(String),
    #[error("metadata log write failed: {0}")]
    Storage(String),
    /// Kafka's RESOURCE_NOT_FOUND (e.g. deleting a SCRAM credential that
    /// does not exist).
    #[error("{0}")]
    ResourceNotFound(String),
    #[error("{0}")]
    InvalidRequest(String),
    #[error("the controller is unreachable")]
    Unavailable,
    /// Kafka's NOT_CONTROLLER: this node does not lead the metadata quorum
    /// (or lost the lead before the change committed, which was then not
    /// made); the client retries.
    #[error("{0}")]
    NotController(String),
    /// A cross-shard wait passed its deadline (`--cross-shard-timeout-ms`):
    /// the controller did not answer, or not every shard applied the change
    /// in time (it is persisted and converges; see `router`).
    #[error("{0}")]
    TimedOut(String),
    /// AlterPartition's refusals, with Kafka's codes: a stale leader
    /// epoch (FENCED_LEADER_EPOCH), a stale partition epoch
    /// (INVALID_UPDATE_VERSION), a requester that does not lead
    /// (NOT_LEADER_OR_FOLLOWER), a fenced or unassigned ISR member
    /// (INELIGIBLE_REPLICA), an unknown topic id (UNKNOWN_TOPIC_ID).
    #[error("{0}")]
    FencedLeaderEpoch(String),
    #[error("{0}")]
    InvalidUpdateVersion(String),
    #[error("{0}")]
    NotLeader(String),
    #[error("{0}")]
    IneligibleReplica(String),
    #[error("{0}")]
    UnknownTopicId(String),
    /// UNKNOWN_TOPIC_OR_PARTITION with Kafka's message for one partition.
    #[error("{0}")]
    UnknownPartition(String),
    /// ElectLeaders: the partition already has the leader asked for.
    #[error("Leader election not needed for topic partition.")]
    ElectionNotNeeded,
    #[error("The preferred leader was not available.")]
    PreferredLeaderNotAvailable,
    #[error("Eligible topic partition leaders are not available.")]
    EligibleLeadersNotAvailable,
    /// AlterPartitionReassignments: a cancellation of a partition that is
    /// not being reassigned (Kafka's message).
    #[error("No partition reassignment is in progress.")]
    NoReassignmentInProgress,
    /// UnregisterBroker of a broker id no registered node has (Kafka's
    /// BROKER_ID_NOT_REGISTERED).
    #[error("{0}")]
    BrokerIdNotRegistered(String),
}

/// Per-item outcomes, in the order of the request's items.
#[derive(Debug, Serialize, Deserialize)]
pub enum ControllerReply {
    /// One result per item (topic); Ok carries the partition count created.
    Items(Vec<(String, Result<i32, ControllerError>)>),
    /// A block of producer ids, persisted as handed out.
    ProducerIds(Result<std::ops::Range<i64>, ControllerError>),
    /// Per CreateAcls binding or DeleteAcls filter, in request order: the
    /// bindings deleted (empty for a creation), or why not.
    Acls(Vec<Result<Vec<AclBinding>, ControllerError>>),
    /// BrokerHeartbeat, FenceBrokers and UnregisterBroker: done (and any
    /// change committed), or why not.
    Broker(Result<(), ControllerError>),
    /// AlterPartition: the partition's state now, or why not.
    Partition(Result<crate::metadata::PartitionState, ControllerError>),
    /// ElectLeaders: per topic (in request order, or every topic), each
    /// partition's outcome.
    Elections(Vec<TopicElections>),
    /// AlterPartitionReassignments: per topic (in request order), each
    /// partition's outcome.
    Reassignments(Vec<TopicElections>),
}

/// One topic's ElectLeaders outcomes: each partition's.
pub type TopicElections = (String, Vec<(i32, Result<(), ControllerError>)>);

/// Everything that travels over the channel mesh.
pub enum ShardMessage {
    /// For shard 0's controller. A request still queued at `deadline`
    /// (when its requester stops waiting) is dropped unapplied.
    Controller {
        request: ControllerRequest,
        deadline: std::time::Instant,
        reply: oneshot::Sender<Result<ControllerReply, ControllerError>>,
    },
    /// A new metadata image from the controller; acked once this shard has
    /// opened or dropped the partition logs the change concerns.
    ApplyMetadata {
        image: Arc<MetadataImage>,
        reply: oneshot::Sender<()>,
    },
    /// Transaction markers for partitions the receiving shard leads; the
    /// reply carries the outcome of each once all are written.
    WriteTxnMarkers {
        markers: Vec<TxnMarker>,
        reply: oneshot::Sender<Vec<(TxnMarker, Result<(), MarkerError>)>>,
    },
    /// For the transaction coordinator of `transactional_id`: a partition
    /// leader adds partitions to the transaction (transaction version 2).
    AddPartitionsToTxn {
        transactional_id: String,
        producer_id: i64,
        producer_epoch: i16,
        partitions: Vec<crate::types::TopicPartition>,
        /// Only check that they are in the transaction (KIP-890 part 1).
        verify_only: bool,
        reply: oneshot::Sender<Result<(), crate::txn::coordinator::TxnError>>,
    },
    /// A scrape of the metrics endpoint: the shard answers with its values.
    Sample {
        reply: oneshot::Sender<crate::metrics::ShardSample>,
    },
}
