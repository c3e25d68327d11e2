//! OffsetForLeaderEpoch (API key 23, v2-4): where a leader epoch ends.
//!
//! Consumers ask it after a leader change or a reset (KIP-320), with the
//! epoch of the last record they consumed: if the end offset answered is
//! below their position, the log was truncated under them and they reset
//! instead of reading past the gap ("validation skipped" in librdkafka's
//! log when the broker lacks this API). Per partition, in Kafka's order
//! (`ReplicaManager.lastOffsetForLeaderEpoch`, `Partition.getLocalLog`):
//! UNKNOWN_TOPIC_OR_PARTITION for a partition the metadata lacks;
//! NOT_LEADER_OR_FOLLOWER where this shard does not lead it (a shard that
//! does not host a partition answers so whatever the epochs); then
//! FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH when `current_leader_epoch`
//! (-1: not checked) is below / above the partition's epoch; else the
//! largest epoch ≤ `leader_epoch` with its end offset, from the log's
//! leader-epoch cache (`log::leader_epoch`), or (-1, -1) with no error
//! for an epoch the log knows no end of.
//!
//! `replica_id` (v3+) is not checked: fjord has no followers, so every
//! caller is answered as a consumer is, from the leader.

use super::{decode, led_partition, respond, Outcome};
use crate::auth::acl::AclOperation;
use crate::handlers::authz::Authz;
use crate::protocol::RequestHeader;
use crate::shard::ShardCtx;
use bytes::BytesMut;
use kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use kafka_protocol::messages::{OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse};
use kafka_protocol::ResponseError;
use std::rc::Rc;

/// The `current_leader_epoch` of a request that does not give one
/// (Kafka's `RecordBatch.NO_PARTITION_LEADER_EPOCH`).
const NO_CURRENT_LEADER_EPOCH: i32 = -1;

/// Kafka's `Partition.checkCurrentLeaderEpoch` as this API reaches it:
/// only -1 means "not given" (`ReplicaManager.lastOffsetForLeaderEpoch`
/// maps exactly that value to an empty epoch), so any other value below the
/// partition's epoch (`leader_epoch`), negative ones too, is fenced.
fn check_current_leader_epoch(current: i32, leader_epoch: i32) -> Option<ResponseError> {
    match current {
        NO_CURRENT_LEADER_EPOCH => None,
        e if e < leader_epoch => Some(ResponseError::FencedLeaderEpoch),
        e if e > leader_epoch => Some(ResponseError::UnknownLeaderEpoch),
        _ => None,
    }
}

pub fn handle(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<OffsetForLeaderEpochRequest>(header, body) else {
        return Outcome::Close;
    };
    let image = ctx.image();
    // Kafka: CLUSTER_ACTION on the cluster (brokers) covers every topic;
    // else DESCRIBE on each (consumers, KIP-320).
    let cluster_action = authz.cluster_quiet(AclOperation::ClusterAction);
    let topics = req
        .topics
        .iter()
        .map(|t| {
            let name = t.topic.0.to_string();
            let authorized = cluster_action || authz.topic(AclOperation::Describe, &name);
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    let base = EpochEndOffset::default().with_partition(p.partition);
                    if !authorized {
                        return base
                            .with_error_code(ResponseError::TopicAuthorizationFailed.code());
                    }
                    let state = match led_partition(ctx, &image, &name, p.partition) {
                        Ok(state) => state,
                        Err((e, _)) => return base.with_error_code(e.code()),
                    };
                    if let Some(e) =
                        check_current_leader_epoch(p.current_leader_epoch, state.log.leader_epoch())
                    {
                        return base.with_error_code(e.code());
                    }
                    let (epoch, end_offset) = state.log.end_offset_for_epoch(p.leader_epoch);
                    base.with_leader_epoch(epoch).with_end_offset(end_offset)
                })
                .collect();
            OffsetForLeaderTopicResult::default()
                .with_topic(t.topic.clone())
                .with_partitions(partitions)
        })
        .collect();
    respond(
        header,
        &OffsetForLeaderEpochResponse::default().with_topics(topics),
    )
}
