//! DescribeTopicPartitions (API key 75, v0): topics and their partitions,
//! a page at a time. The Java admin client (3.8+) describes topics with it
//! (`kafka-topics --describe`), because a Metadata response for a topic of
//! many thousands of partitions is one huge frame; this API pages through
//! them with a cursor instead.
//!
//! Answered from the shard's metadata image alone (every shard holds all
//! of it), in Kafka's order (`DescribeTopicPartitionsRequestHandler`,
//! `KRaftMetadataCache.describeTopicResponse`):
//! - The topics are the ones named (each once), or every topic when none
//!   is named, keeping only names not below the cursor's topic, sorted by
//!   name. A cursor whose topic is not among the named ones is
//!   INVALID_REQUEST for every named topic.
//! - Partitions are listed from the cursor's partition in the cursor's
//!   topic (from 0 in the others) until `response_partition_limit`, capped
//!   at [`PARTITIONS_PER_RESPONSE_MAX`] (Kafka's
//!   `max.request.partition.size.limit`), is used up. A topic cut short
//!   sets `next_cursor` to its first partition left out; a topic reached
//!   with nothing left sets it to that topic's partition 0. Either way the
//!   response ends there.
//! - A named topic that does not exist is UNKNOWN_TOPIC_OR_PARTITION (or
//!   INVALID_TOPIC_EXCEPTION for a name Kafka would never accept) with the
//!   zero topic id, taking no partition from the limit; when listing every
//!   topic there is no such entry.
//!
//! Each partition is led by the shard that owns it, in the broker's leader
//! epoch, with that shard as its only replica and in-sync replica (as
//! Metadata reports it), no eligible leader replicas and none offline.
//! `topic_authorized_operations` is the topic operations the principal may
//! do (every one without an authorizer), on every entry but the refused
//! ones, which Kafka lists last with the field's default.

use super::{decode, respond, str_bytes, Outcome};
use crate::auth::acl::{AclOperation, ResourceType};
use crate::handlers::authz::Authz;
use crate::metadata::{validate_topic_name, MetadataImage, TopicMeta};
use crate::protocol::RequestHeader;
use crate::shard::ShardCtx;
use bytes::BytesMut;
use kafka_protocol::messages::describe_topic_partitions_response::{
    Cursor, DescribeTopicPartitionsResponsePartition, DescribeTopicPartitionsResponseTopic,
};
use kafka_protocol::messages::{
    BrokerId, DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse, TopicName,
};
use kafka_protocol::ResponseError;
use std::collections::BTreeSet;
use std::rc::Rc;
use uuid::Uuid;

/// Most partitions one response lists, whatever the client asks (Kafka's
/// `max.request.partition.size.limit`, default 2000).
pub const PARTITIONS_PER_RESPONSE_MAX: i32 = 2000;

pub fn handle(
    ctx: &Rc<ShardCtx>,
    listener: usize,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<DescribeTopicPartitionsRequest>(header, body) else {
        return Outcome::Close;
    };
    let image = ctx.image();
    let response = match describe(ctx, listener, authz, &image, &req) {
        Ok(response) => response,
        // Kafka's error response: every named topic with the error.
        Err(e) => DescribeTopicPartitionsResponse::default().with_topics(
            req.topics
                .iter()
                .map(|t| {
                    DescribeTopicPartitionsResponseTopic::default()
                        .with_error_code(e.code())
                        .with_name(Some(t.name.clone()))
                })
                .collect(),
        ),
    };
    respond(header, &response)
}

/// The answer to `req` from `image`; Err: the error for the whole request.
fn describe(
    ctx: &ShardCtx,
    listener: usize,
    authz: &Authz,
    image: &MetadataImage,
    req: &DescribeTopicPartitionsRequest,
) -> Result<DescribeTopicPartitionsResponse, ResponseError> {
    let list_all = req.topics.is_empty();
    let (cursor_topic, cursor_partition) = match &req.cursor {
        Some(c) => (c.topic_name.0.as_str(), c.partition_index),
        None => ("", 0),
    };
    let names: BTreeSet<&str> = if list_all {
        image
            .topics
            .keys()
            .map(String::as_str)
            .filter(|n| *n >= cursor_topic)
            .collect()
    } else {
        let named: BTreeSet<&str> = req
            .topics
            .iter()
            .map(|t| t.name.0.as_str())
            .filter(|n| *n >= cursor_topic)
            .collect();
        if req.cursor.is_some() && !named.contains(cursor_topic) {
            return Err(ResponseError::InvalidRequest);
        }
        named
    };
    let mut remaining = req
        .response_partition_limit
        .min(PARTITIONS_PER_RESPONSE_MAX);
    // Kafka: DESCRIBE on each topic. A listing leaves the others out; a
    // named one answers TOPIC_AUTHORIZATION_FAILED without its id, after
    // all the others and whatever the partition limit left out.
    let mut denied = Vec::new();
    let names = names.into_iter().filter(|name| {
        if list_all {
            return authz.filter(AclOperation::Describe, ResourceType::Topic, name);
        }
        let allowed = authz.topic(AclOperation::Describe, name);
        if !allowed {
            denied.push(
                DescribeTopicPartitionsResponseTopic::default()
                    .with_error_code(ResponseError::TopicAuthorizationFailed.code())
                    .with_name(Some(topic_name(name))),
            );
        }
        allowed
    });
    let names: Vec<&str> = names.collect();
    let mut response = DescribeTopicPartitionsResponse::default();
    for name in names {
        if remaining <= 0 {
            // Kafka sets the cursor only when the limit is used up exactly
            // (a limit asked below 1 lists nothing and no cursor).
            if remaining == 0 {
                response.next_cursor = Some(
                    Cursor::default()
                        .with_topic_name(topic_name(name))
                        .with_partition_index(0),
                );
            }
            break;
        }
        let Some(topic) = image.topic(name) else {
            if !list_all {
                let error = match validate_topic_name(name) {
                    Ok(()) => ResponseError::UnknownTopicOrPartition,
                    Err(_) => ResponseError::InvalidTopicException,
                };
                response.topics.push(
                    DescribeTopicPartitionsResponseTopic::default()
                        .with_error_code(error.code())
                        .with_name(Some(topic_name(name)))
                        .with_is_internal(crate::metadata::internal::is_internal(name))
                        .with_topic_authorized_operations(
                            authz.authorized_operations(ResourceType::Topic, name),
                        ),
                );
            }
            continue;
        };
        let start = if name == cursor_topic {
            cursor_partition
        } else {
            0
        };
        let (partitions, next) = partitions_from(ctx, listener, image, topic, start, remaining);
        remaining -= partitions.len() as i32;
        response.topics.push(
            DescribeTopicPartitionsResponseTopic::default()
                .with_name(Some(topic_name(name)))
                .with_topic_id(Uuid::from_bytes(topic.id))
                .with_is_internal(topic.is_internal())
                .with_partitions(partitions)
                .with_topic_authorized_operations(
                    authz.authorized_operations(ResourceType::Topic, name),
                ),
        );
        if let Some(next) = next {
            response.next_cursor = Some(
                Cursor::default()
                    .with_topic_name(topic_name(name))
                    .with_partition_index(next),
            );
            break;
        }
    }
    response.topics.extend(denied);
    Ok(response)
}

/// The partitions of `topic` from index `start` on, at most `max` of them,
/// and the first index left out if any (Kafka's
/// `getPartitionMetadataForDescribeTopicResponse`: indexes below 0 are
/// skipped, yet count against `max`).
fn partitions_from(
    ctx: &ShardCtx,
    listener: usize,
    image: &MetadataImage,
    topic: &TopicMeta,
    start: i32,
    max: i32,
) -> (Vec<DescribeTopicPartitionsResponsePartition>, Option<i32>) {
    use super::metadata::partition_view;
    let ids = |b: &[i32]| b.iter().map(|&b| BrokerId(b)).collect::<Vec<_>>();
    let count = topic.partition_count();
    let upper = count.min(start.saturating_add(max));
    // As Metadata answers (`metadata::partition_view`).
    let partitions = (start.max(0)..upper)
        .map(|index| {
            let v = partition_view(ctx, image, listener, topic, index);
            DescribeTopicPartitionsResponsePartition::default()
                .with_partition_index(index)
                .with_error_code(v.error.map_or(0, |e| e.code()))
                .with_leader_id(BrokerId(v.leader))
                .with_leader_epoch(v.leader_epoch)
                .with_replica_nodes(ids(&v.replicas))
                .with_isr_nodes(ids(&v.isr))
                .with_eligible_leader_replicas(Some(ids(&v.elr)))
                .with_last_known_elr(Some(ids(&v.last_known_elr)))
                .with_offline_replicas(ids(&v.offline))
        })
        .collect();
    (partitions, (upper < count).then_some(upper))
}

fn topic_name(name: &str) -> TopicName {
    TopicName(str_bytes(name))
}
