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
//! - the answer is the low watermark (-1 with an error): for a partition of
//!   one replica the log start after the call; for a replicated partition
//!   Kafka's `lowWatermarkIfLeader`, the smallest log start of the leader
//!   and of every replica on a live broker, as its fetches report it
//!   (`replication::leader`). Followers move their log starts up to the
//!   leader's from its fetch answers (`replication::manager`), so the low
//!   watermark follows within a fetch or two.
//!
//! A replicated partition whose low watermark is still below the offset
//! is answered once it has reached it, as Kafka's DelayedDeleteRecords
//! purgatory answers (every live replica then holds no record below the
//! offset, so a new leader elected from them cannot serve them again):
//! the request waits, up to its `timeout_ms`, until every such partition
//! has, looking again whenever a follower reports another log start or an
//! image is applied (`Leading::low_watermark_moved`). Partitions still
//! short at the timeout get REQUEST_TIMED_OUT (with the low watermark of
//! the first look, as Kafka's); one whose leadership moved meanwhile gets
//! NOT_LEADER_OR_FOLLOWER (UNKNOWN_TOPIC_OR_PARTITION if it is gone), with
//! low watermark -1. The records stay deleted on the leader either way.
//!
//! Kafka writes the new log start to its checkpoint file later, in its
//! periodic checkpoint, so a crash in between brings the deleted records
//! back. fjord writes the checkpoint before it answers: a deletion the
//! client saw succeed stays done after a restart. If that write fails, the
//! partitions it moved answer KAFKA_STORAGE_ERROR.

use super::{decode, led_partition, respond, Outcome};
use crate::auth::acl::AclOperation;
use crate::handlers::authz::Authz;
use crate::metadata::internal::is_internal;
use crate::metadata::MetadataImage;
use crate::protocol::RequestHeader;
use crate::shard::ShardCtx;
use crate::types::Offset;
use bytes::BytesMut;
use futures::future;
use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::{DeleteRecordsRequest, DeleteRecordsResponse};
use kafka_protocol::ResponseError;
use std::rc::Rc;
use std::time::Duration;

/// The offset that stands for the partition's high watermark.
pub const HIGH_WATERMARK: i64 = -1;

/// A replicated partition's answer that waits for its low watermark to
/// reach `offset`.
struct Waiting {
    /// Where its answer is: topic index, partition index.
    at: (usize, usize),
    topic: String,
    partition: i32,
    offset: i64,
}

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
    let mut waiting = Vec::new();
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
                    let at = (topics.len(), partitions.len());
                    if start != before {
                        moved.push(at);
                    }
                    let low = match low_watermark(ctx, &image, &name, p.partition_index) {
                        Ok(Some(low)) => low,
                        _ => start.0,
                    };
                    if low < offset {
                        waiting.push(Waiting {
                            at,
                            topic: name.clone(),
                            partition: p.partition_index,
                            offset,
                        });
                    }
                    partitions.push(base.with_low_watermark(low));
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
            for (t, p) in &moved {
                let answer = &mut topics[*t].partitions[*p];
                answer.low_watermark = -1;
                answer.error_code = ResponseError::KafkaStorageError.code();
            }
            waiting.retain(|w| !moved.contains(&w.at));
        }
    }
    if !waiting.is_empty() {
        let timeout = Duration::from_millis(req.timeout_ms.max(0) as u64);
        wait_for_low_watermarks(ctx, &mut topics, waiting, timeout).await;
    }
    respond(
        header,
        &DeleteRecordsResponse::default().with_topics(topics),
    )
}

/// The low watermark of `topic`-`partition` if it is a replicated partition
/// this shard leads under `image` (`Leading::low_watermark`, live brokers
/// as `image` has them); `None` for a partition of one replica; the
/// request's error when this shard does not lead it (any more).
fn low_watermark(
    ctx: &ShardCtx,
    image: &MetadataImage,
    topic: &str,
    partition: i32,
) -> Result<Option<i64>, ResponseError> {
    let p = led_partition(ctx, image, topic, partition).map_err(|(e, _)| e)?;
    let Some(ps) = image.topic(topic).and_then(|t| t.replica_state(partition)) else {
        return Ok(None);
    };
    let me = ctx.config.node_id_of(ctx.shard);
    Ok(Some(
        ctx.leading
            .low_watermark(&p, ps, me, |r| image.is_live_broker(r)),
    ))
}

/// Kafka's DelayedDeleteRecords: waits until every partition of `waiting`
/// has its low watermark at its offset (answered with it), lost its
/// leadership (its error, low watermark -1), or `timeout` passed
/// (REQUEST_TIMED_OUT, the first low watermark kept). Looks again at every
/// possible move (`Leading::low_watermark_moved`), under the image of
/// that moment.
async fn wait_for_low_watermarks(
    ctx: &Rc<ShardCtx>,
    topics: &mut [DeleteRecordsTopicResult],
    mut waiting: Vec<Waiting>,
    timeout: Duration,
) {
    let deadline = crate::clock::monotonic() + timeout;
    loop {
        let seen = ctx.leading.low_watermark_moves();
        let image = ctx.image();
        waiting.retain(|w| {
            let answer = &mut topics[w.at.0].partitions[w.at.1];
            match low_watermark(ctx, &image, &w.topic, w.partition) {
                Err(e) => {
                    answer.error_code = e.code();
                    answer.low_watermark = -1;
                    false
                }
                // No longer replicated (cannot happen while it is led):
                // nothing left to wait for.
                Ok(None) => false,
                Ok(Some(low)) if low >= w.offset => {
                    answer.low_watermark = low;
                    false
                }
                Ok(Some(_)) => true,
            }
        });
        if waiting.is_empty() {
            return;
        }
        let now = crate::clock::monotonic();
        if now >= deadline {
            for w in &waiting {
                topics[w.at.0].partitions[w.at.1].error_code =
                    ResponseError::RequestTimedOut.code();
            }
            return;
        }
        let moved = std::pin::pin!(ctx.leading.low_watermark_moved(seen));
        let timer = std::pin::pin!(glommio::timer::sleep(deadline - now));
        let _ = crate::metrics::remote_wait(future::select(moved, timer)).await;
    }
}
