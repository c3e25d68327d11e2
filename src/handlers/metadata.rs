//! Metadata: every shard as a broker, each partition led by its shard.
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

/// The brokers clients of `listener` see: one per shard, at that
/// listener's endpoints (Kafka answers with the listener the request came
/// in on).
pub fn brokers(ctx: &ShardCtx, listener: usize) -> Vec<MetadataResponseBroker> {
    (0..ctx.cores())
        .map(|shard| {
            let (host, port) = ctx.config.endpoint(listener, shard);
            MetadataResponseBroker::default()
                .with_node_id(BrokerId(ctx.config.node_id_of(shard)))
                .with_host(str_bytes(host))
                .with_port(port)
        })
        .collect()
}

fn topic_entry(ctx: &ShardCtx, t: &TopicMeta, leader_epoch: i32) -> MetadataResponseTopic {
    let partitions = t
        .shards
        .iter()
        .enumerate()
        .map(|(i, &shard)| {
            if !t.hosted_by(ctx.config.node_id) {
                // Another node holds it; its brokers are not known here
                // until broker registration (`docs/replication.md` §3.2).
                return MetadataResponsePartition::default()
                    .with_error_code(ResponseError::LeaderNotAvailable.code())
                    .with_partition_index(i as i32)
                    .with_leader_id(BrokerId(-1))
                    .with_leader_epoch(leader_epoch);
            }
            let leader = BrokerId(ctx.config.node_id_of(shard % ctx.cores()));
            MetadataResponsePartition::default()
                .with_partition_index(i as i32)
                .with_leader_id(leader)
                .with_leader_epoch(leader_epoch)
                .with_replica_nodes(vec![leader])
                .with_isr_nodes(vec![leader])
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
        None => all_topics(ctx, authz, &image),
        Some(list) if list.is_empty() && v == 0 => all_topics(ctx, authz, &image),
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
                        Some(meta) => topic_entry(ctx, meta, image.leader_epoch()),
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
                        Some(meta) => topic_entry(ctx, meta, image.leader_epoch()),
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
        .with_brokers(brokers(ctx, listener))
        .with_cluster_id(Some(str_bytes(ctx.config.cluster_id.clone())))
        .with_controller_id(BrokerId(ctx.config.node_id_of(0)))
        .with_topics(topics);
    respond(header, &resp)
}

/// Every topic the principal may DESCRIBE (the others are left out, as
/// Kafka leaves them out, without an audit line).
fn all_topics(ctx: &ShardCtx, authz: &Authz, image: &MetadataImage) -> Vec<MetadataResponseTopic> {
    image
        .topics
        .values()
        .filter(|t| authz.filter(AclOperation::Describe, ResourceType::Topic, &t.name))
        .map(|t| topic_entry(ctx, t, image.leader_epoch()))
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
