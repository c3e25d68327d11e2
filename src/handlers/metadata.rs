//! Metadata: every shard as a broker, each partition led by its shard;
//! several nodes: the brokers of every live registered node too, and a
//! topic held by another node led by that node's broker (offline while
//! the node is fenced).
//!
//! Topics that do not exist are created on request when
//! `auto.create.topics.enable` is on and the client allows it (v4+ flag;
//! always for v0–3). Creation goes through the controller and completes on
//! every shard before the answer, so the created topic is returned ready to
//! use instead of LEADER_NOT_AVAILABLE.
//!
//! Authorization (Kafka's `handleTopicMetadataRequest`): a listing of all
//! topics leaves out those the principal may not DESCRIBE; a named one it
//! may not DESCRIBE answers TOPIC_AUTHORIZATION_FAILED whether it exists or
//! not; a missing one is auto-created only with CREATE on the cluster or
//! the topic, else TOPIC_AUTHORIZATION_FAILED.

use super::{decode, errors, respond, str_bytes, Outcome};
use crate::auth::acl::{AclOperation, ResourceType, CLUSTER_NAME};
use crate::handlers::authz::Authz;
use crate::metadata::{internal, validate_topic_name, MetadataImage, TopicMeta};
use crate::protocol::RequestHeader;
use crate::shard::messages::{ControllerRequest, NewTopic};
use crate::shard::ShardCtx;
use bytes::BytesMut;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::ResponseError;
use std::collections::{BTreeMap, HashSet};
use std::rc::Rc;
use uuid::Uuid;

/// The brokers clients of `listener` see: one per shard of this node, at
/// that listener's endpoints (Kafka answers with the listener the request
/// came in on), and, several nodes, one per shard of every other
/// registered node that is not fenced and has a listener of the same
/// security protocol (`docs/replication.md` §3.2), by broker id.
pub fn brokers(ctx: &ShardCtx, image: &MetadataImage, listener: usize) -> Vec<(i32, String, i32)> {
    let mut out: Vec<(i32, String, i32)> = (0..ctx.cores())
        .map(|shard| {
            let (host, port) = ctx.config.endpoint(listener, shard);
            (ctx.config.node_id_of(shard), host, port)
        })
        .collect();
    out.extend(other_brokers(ctx, image, listener, false));
    out.sort_by_key(|(id, _, _)| *id);
    out
}

/// The brokers of the other registered nodes that are fenced (`fenced`)
/// or not, with a listener of `listener`'s security protocol, by node.
/// DescribeCluster v2 lists the fenced ones when asked (KIP-1073); an
/// unregistered node is in neither list.
pub fn other_brokers(
    ctx: &ShardCtx,
    image: &MetadataImage,
    listener: usize,
    fenced: bool,
) -> Vec<(i32, String, i32)> {
    let mut out = Vec::new();
    let protocol = ctx.config.listener(listener).protocol.name();
    for (&node, b) in &image.brokers {
        if node == ctx.config.node_id || b.fenced != fenced {
            continue;
        }
        let Some(e) = b.registration.endpoint(protocol) else {
            continue;
        };
        for shard in 0..b.registration.shards {
            out.push((
                broker_id(node, shard),
                e.host.clone(),
                e.port as i32 + shard as i32,
            ));
        }
    }
    out.sort_by_key(|(id, _, _)| *id);
    out
}

/// The broker id of shard `shard` of node `node`.
fn broker_id(node: i32, shard: usize) -> i32 {
    node.saturating_mul(1000).saturating_add(shard as i32)
}

/// Who leads a partition, as clients are told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Leader {
    /// A live broker, and the leader epoch it leads in: a shard of this
    /// node, or of another registered node that is not fenced.
    Live(i32, i32),
    /// The node holding it is fenced (or has no listener of the client's
    /// protocol): offline, its only replica on that broker, its last epoch.
    Offline(i32, i32),
    /// The node holding it has not registered yet: no broker to name.
    Unknown,
}

/// The leader of the partition of `t` whose owning shard (as persisted)
/// is `shard`, for clients of `listener`. Until partitions are replicated
/// a topic's partitions live on one node (`TopicMeta::node`).
fn partition_leader(
    ctx: &ShardCtx,
    image: &MetadataImage,
    listener: usize,
    t: &TopicMeta,
    shard: usize,
) -> Leader {
    if t.hosted_by(ctx.config.node_id) {
        return Leader::Live(
            ctx.config.node_id_of(shard % ctx.cores()),
            image.leader_epoch(),
        );
    }
    let node = t.node.expect("hosted by another node");
    let Some(b) = image.brokers.get(&node) else {
        return Leader::Unknown;
    };
    let id = broker_id(node, shard % b.registration.shards.max(1));
    let protocol = ctx.config.listener(listener).protocol.name();
    let epoch = b.registration.leader_epoch;
    if b.fenced || b.registration.endpoint(protocol).is_none() {
        Leader::Offline(id, epoch)
    } else {
        Leader::Live(id, epoch)
    }
}

/// One partition as Metadata and DescribeTopicPartitions list it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionView {
    /// LEADER_NOT_AVAILABLE when no live broker leads it.
    pub error: Option<ResponseError>,
    /// The leading broker, -1 for none.
    pub leader: i32,
    pub leader_epoch: i32,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
    /// Eligible leader replicas (KIP-966), and the last known ones.
    pub elr: Vec<i32>,
    pub last_known_elr: Vec<i32>,
    /// Replicas on fenced or unregistered nodes.
    pub offline: Vec<i32>,
}

/// Partition `index` of `t` (which exists) for clients of `listener`.
pub fn partition_view(
    ctx: &ShardCtx,
    image: &MetadataImage,
    listener: usize,
    t: &TopicMeta,
    index: i32,
) -> PartitionView {
    if let Some(state) = t.replica_state(index) {
        return replicated_view(ctx, image, listener, state);
    }
    let shard = t.shards[index as usize];
    let none = PartitionView {
        error: None,
        leader: -1,
        leader_epoch: image.leader_epoch(),
        replicas: Vec::new(),
        isr: Vec::new(),
        elr: Vec::new(),
        last_known_elr: Vec::new(),
        offline: Vec::new(),
    };
    match partition_leader(ctx, image, listener, t, shard) {
        Leader::Live(id, epoch) => PartitionView {
            leader: id,
            leader_epoch: epoch,
            replicas: vec![id],
            isr: vec![id],
            ..none
        },
        // Kafka 4.4 lists a partition whose only replica's broker is fenced
        // with no leader, LEADER_NOT_AVAILABLE, the replica, an empty ISR
        // (it moved to the ELR: `kafka-topics --describe` shows Leader:
        // none, Isr empty, Elr and LastKnownElr the replica) and the
        // replica offline.
        Leader::Offline(id, epoch) => PartitionView {
            error: Some(ResponseError::LeaderNotAvailable),
            leader_epoch: epoch,
            replicas: vec![id],
            elr: vec![id],
            last_known_elr: vec![id],
            offline: vec![id],
            ..none
        },
        Leader::Unknown => PartitionView {
            error: Some(ResponseError::LeaderNotAvailable),
            ..none
        },
    }
}

/// A replicated partition as its state says (`docs/replication.md` §4.3):
/// its leader unless that broker's node is fenced, unregistered or has no
/// listener of the client's protocol (then none, LEADER_NOT_AVAILABLE).
fn replicated_view(
    ctx: &ShardCtx,
    image: &MetadataImage,
    listener: usize,
    state: &crate::metadata::PartitionState,
) -> PartitionView {
    let protocol = ctx.config.listener(listener).protocol.name();
    let reachable = |broker: i32| {
        let node = crate::metadata::node_of(broker);
        if node == ctx.config.node_id {
            return true;
        }
        image
            .live_broker(node)
            .is_some_and(|b| b.endpoint(protocol).is_some())
    };
    let live = |broker: i32| {
        crate::metadata::node_of(broker) == ctx.config.node_id
            || image
                .live_broker(crate::metadata::node_of(broker))
                .is_some()
    };
    let leads = state.leader >= 0 && reachable(state.leader);
    PartitionView {
        error: (!leads).then_some(ResponseError::LeaderNotAvailable),
        leader: if leads { state.leader } else { -1 },
        leader_epoch: state.leader_epoch,
        replicas: state.replicas.clone(),
        isr: state.isr.clone(),
        elr: state.elr.clone(),
        last_known_elr: Vec::new(),
        offline: state
            .replicas
            .iter()
            .copied()
            .filter(|&b| !live(b))
            .collect(),
    }
}

fn ids(brokers: &[i32]) -> Vec<BrokerId> {
    brokers.iter().map(|&b| BrokerId(b)).collect()
}

fn topic_entry(
    ctx: &ShardCtx,
    image: &MetadataImage,
    listener: usize,
    t: &TopicMeta,
) -> MetadataResponseTopic {
    let partitions = (0..t.partition_count())
        .map(|i| {
            let v = partition_view(ctx, image, listener, t, i);
            MetadataResponsePartition::default()
                .with_partition_index(i)
                .with_error_code(v.error.map_or(errors::NONE, |e| e.code()))
                .with_leader_id(BrokerId(v.leader))
                .with_leader_epoch(v.leader_epoch)
                .with_replica_nodes(ids(&v.replicas))
                .with_isr_nodes(ids(&v.isr))
                .with_offline_replicas(ids(&v.offline))
        })
        .collect();
    MetadataResponseTopic::default()
        .with_name(Some(TopicName(str_bytes(t.name.clone()))))
        .with_topic_id(Uuid::from_bytes(t.id))
        .with_is_internal(t.is_internal())
        .with_partitions(partitions)
}

fn error_entry(name: Option<String>, id: Uuid, error: ResponseError) -> MetadataResponseTopic {
    MetadataResponseTopic::default()
        .with_error_code(error.code())
        .with_name(name.map(|n| TopicName(str_bytes(n))))
        .with_topic_id(id)
}

pub async fn handle(
    ctx: &Rc<ShardCtx>,
    listener: usize,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<MetadataRequest>(header, body) else {
        return Outcome::Close;
    };
    let v = header.api_version;
    let mut image = ctx.image();
    let topics: Vec<MetadataResponseTopic> = match req.topics {
        None => all_topics(ctx, authz, &image, listener),
        Some(list) if list.is_empty() && v == 0 => all_topics(ctx, authz, &image, listener),
        Some(list) => {
            // Kafka: DESCRIBE on each named topic, checked before its
            // existence is (TOPIC_AUTHORIZATION_FAILED, no id, either way).
            let described: Vec<bool> = list
                .iter()
                .map(|t| match &t.name {
                    Some(name) => authz.topic(AclOperation::Describe, name.0.as_str()),
                    None => image
                        .topic_by_id(t.topic_id.as_bytes())
                        .is_none_or(|m| authz.topic(AclOperation::Describe, &m.name)),
                })
                .collect();
            // Auto-creation needs CREATE on the cluster or on the topic.
            let mut create_refused: HashSet<String> = HashSet::new();
            let allow_auto = v < 4 || req.allow_auto_topic_creation;
            if allow_auto && ctx.config.auto_create_topics_enable {
                let missing: Vec<String> = list
                    .iter()
                    .zip(&described)
                    .filter(|(_, &ok)| ok)
                    .filter_map(|(t, _)| t.name.as_ref().map(|n| n.0.to_string()))
                    .filter(|n| {
                        image.topic(n).is_none()
                            && validate_topic_name(n).is_ok()
                            && !internal::is_internal(n)
                    })
                    .collect();
                let cluster_create =
                    missing.is_empty() || authz.cluster_quiet(AclOperation::Create);
                let (missing, refused): (Vec<String>, Vec<String>) = missing
                    .into_iter()
                    .partition(|n| cluster_create || authz.topic(AclOperation::Create, n));
                create_refused.extend(refused);
                if !missing.is_empty() {
                    auto_create(ctx, missing).await;
                    image = ctx.image();
                }
            }
            list.iter()
                .zip(&described)
                .map(|(t, &ok)| match &t.name {
                    Some(name) if !ok => error_entry(
                        Some(name.0.to_string()),
                        Uuid::nil(),
                        ResponseError::TopicAuthorizationFailed,
                    ),
                    Some(name) if create_refused.contains(name.0.as_str()) => error_entry(
                        Some(name.0.to_string()),
                        Uuid::nil(),
                        ResponseError::TopicAuthorizationFailed,
                    ),
                    Some(name) => match image.topic(name.0.as_str()) {
                        Some(meta) => topic_entry(ctx, &image, listener, meta),
                        None if validate_topic_name(name.0.as_str()).is_err() => error_entry(
                            Some(name.0.to_string()),
                            Uuid::nil(),
                            ResponseError::InvalidTopicException,
                        ),
                        None => error_entry(
                            Some(name.0.to_string()),
                            Uuid::nil(),
                            ResponseError::UnknownTopicOrPartition,
                        ),
                    },
                    // Topic ids are not secret: Kafka answers the id.
                    None if !ok => {
                        error_entry(None, t.topic_id, ResponseError::TopicAuthorizationFailed)
                    }
                    None => match image.topic_by_id(t.topic_id.as_bytes()) {
                        Some(meta) => topic_entry(ctx, &image, listener, meta),
                        None => error_entry(None, t.topic_id, ResponseError::UnknownTopicId),
                    },
                })
                .collect()
        }
    };
    let mut topics = topics;
    let mut cluster_authorized_operations = i32::MIN; // the schema's default
    if v >= 8 {
        // Kafka: the operations on each topic described (not on the refused
        // ones nor on unknown ids), and, v8–10, on the cluster if the
        // principal may DESCRIBE it (0 if not).
        if req.include_topic_authorized_operations {
            let refused = ResponseError::TopicAuthorizationFailed.code();
            for t in topics.iter_mut().filter(|t| t.error_code != refused) {
                if let Some(name) = &t.name {
                    t.topic_authorized_operations =
                        authz.authorized_operations(ResourceType::Topic, name.0.as_str());
                }
            }
        }
        if v <= 10 && req.include_cluster_authorized_operations {
            cluster_authorized_operations = if authz.cluster(AclOperation::Describe) {
                authz.authorized_operations(ResourceType::Cluster, CLUSTER_NAME)
            } else {
                0
            };
        }
    }
    let resp = MetadataResponse::default()
        .with_cluster_authorized_operations(cluster_authorized_operations)
        .with_brokers(
            brokers(ctx, &image, listener)
                .into_iter()
                .map(|(id, host, port)| {
                    MetadataResponseBroker::default()
                        .with_node_id(BrokerId(id))
                        .with_host(str_bytes(host))
                        .with_port(port)
                })
                .collect(),
        )
        .with_cluster_id(Some(str_bytes(image.cluster_id_or(&ctx.config.cluster_id))))
        .with_controller_id(BrokerId(ctx.config.node_id_of(0)))
        .with_topics(topics);
    respond(header, &resp)
}

/// Every topic the principal may DESCRIBE (the others are left out, as
/// Kafka leaves them out, without an audit line).
fn all_topics(
    ctx: &ShardCtx,
    authz: &Authz,
    image: &MetadataImage,
    listener: usize,
) -> Vec<MetadataResponseTopic> {
    image
        .topics
        .values()
        .filter(|t| authz.filter(AclOperation::Describe, ResourceType::Topic, &t.name))
        .map(|t| topic_entry(ctx, image, listener, t))
        .collect()
}

/// Creates `names` with the broker's defaults. Failures (a concurrent
/// creation, say) are left for the caller's lookup to report.
pub async fn auto_create(ctx: &Rc<ShardCtx>, names: Vec<String>) {
    let topics = names
        .into_iter()
        .map(|name| NewTopic {
            name,
            num_partitions: -1,
            replication_factor: -1,
            assignments: Vec::new(),
            configs: BTreeMap::new(),
        })
        .collect();
    let request = ControllerRequest::CreateTopics {
        topics,
        validate_only: false,
    };
    if let Err(e) = ctx.invoke_controller(request).await {
        tracing::warn!(error = %e, code = errors::controller(&e), "auto-creating topics failed");
    }
}
