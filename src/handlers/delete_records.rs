//! DeleteRecords: moves partitions' log start offsets up. This is what
//! `kafka-delete-records.sh` and `Admin.deleteRecords` send, and what Kafka
//! Streams sends to purge its repartition topics as it commits.
//!
//! Per partition, as Kafka's `ReplicaManager.deleteRecordsOnLocalLog` and
//! `Partition.deleteRecordsOnLeader`:
//! - an internal topic is refused with INVALID_TOPIC_EXCEPTION (its
//!   coordinator bounds it itself);
//! - an unknown topic or partition gets UNKNOWN_TOPIC_OR_PARTITION, a
//!   partition of another shard NOT_LEADER_OR_FOLLOWER (the client sends
//!   each partition to its leader);
//! - a topic whose `cleanup.policy` lacks `delete` (compact only) gets
//!   POLICY_VIOLATION, as Kafka's "can not be deleted due to the
//!   configured policy";
//! - offset -1 stands for the high watermark; an offset below 0 or above
//!   the HW gets OFFSET_OUT_OF_RANGE;
//! - the answer is the low watermark, the log start after the call (-1
//!   with an error).
//!
//! Kafka writes the new log start to its checkpoint file later, in its
//! periodic checkpoint, so a crash in between brings the deleted records
//! back. fjord writes the checkpoint before it answers: a deletion the
//! client saw succeed stays done after a restart. If that write fails, the
//! partitions it moved answer KAFKA_STORAGE_ERROR.
//!
//! The request's `timeout_ms` bounds Kafka's wait for followers to move
//! their log starts too; with one replica there is nothing to wait for.

use super::{decode, led_partition, respond, Outcome};
use crate::auth::acl::AclOperation;
use crate::handlers::authz::Authz;
use crate::metadata::internal::is_internal;
use crate::protocol::RequestHeader;
use crate::shard::ShardCtx;
use crate::types::Offset;
use bytes::BytesMut;
use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::{DeleteRecordsRequest, DeleteRecordsResponse};
use kafka_protocol::ResponseError;
use std::rc::Rc;

/// The offset that stands for the partition's high watermark.
pub const HIGH_WATERMARK: i64 = -1;

pub async fn handle(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<DeleteRecordsRequest>(header, body) else {
        return Outcome::Close;
    };
    let image = ctx.image();
    let mut topics = Vec::with_capacity(req.topics.len());
    // (topic index, partition index) of each answer whose log start moved.
    let mut moved = Vec::new();
    for t in &req.topics {
        let name = t.name.0.to_string();
        // Kafka: DELETE on the topic, before anything else.
        let authorized = authz.topic(AclOperation::Delete, &name);
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for p in &t.partitions {
            let base = DeleteRecordsPartitionResult::default()
                .with_partition_index(p.partition_index)
                .with_low_watermark(-1);
            let fail = |e: ResponseError| base.clone().with_error_code(e.code());
            if !authorized {
                partitions.push(fail(ResponseError::TopicAuthorizationFailed));
                continue;
            }
            if is_internal(&name) {
                partitions.push(fail(ResponseError::InvalidTopicException));
                continue;
            }
            let state = match led_partition(ctx, &image, &name, p.partition_index) {
                Ok(state) => state,
                Err((e, _)) => {
                    partitions.push(fail(e));
                    continue;
                }
            };
            if !state.config().cleanup_delete {
                partitions.push(fail(ResponseError::PolicyViolation));
                continue;
            }
            let log = &state.log;
            let offset = match p.offset {
                HIGH_WATERMARK => log.high_watermark().0,
                o => o,
            };
            let before = log.log_start_offset();
            match log.delete_records_before(Offset(offset)) {
                Ok(start) => {
                    if start != before {
                        moved.push((topics.len(), partitions.len()));
                    }
                    partitions.push(base.with_low_watermark(start.0));
                }
                Err(e) => partitions.push(base.with_error_code(super::errors::log(&e))),
            }
        }
        topics.push(
            DeleteRecordsTopicResult::default()
                .with_name(t.name.clone())
                .with_partitions(partitions),
        );
    }
    if !moved.is_empty() {
        if let Err(e) = ctx.logs.checkpoint().await {
            tracing::error!(error = %e, "checkpoint after DeleteRecords failed");
            for (t, p) in moved {
                let answer = &mut topics[t].partitions[p];
                answer.low_watermark = -1;
                answer.error_code = ResponseError::KafkaStorageError.code();
            }
        }
    }
    respond(
        header,
        &DeleteRecordsResponse::default().with_topics(topics),
    )
}
