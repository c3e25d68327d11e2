//! ListOffsets (v1-11): earliest, latest (HW or LSO by isolation),
//! max-timestamp, earliest-local, and lookup by timestamp through the time
//! index. Latest-tiered (-5, v9+) and earliest-pending-upload (-6, v11+,
//! KIP-1023) are answered as Kafka's `UnifiedLog.fetchOffsetByTimestamp`
//! answers them for a log without tiered storage: offset, timestamp and
//! leader epoch -1. v10 only adds a timeout for remote-storage lookups,
//! which fjord has none of; v11 (hand-coded, `protocol::hand_versions_more`)
//! is v10 on the wire. The
//! leader epoch answered is the current one for the latest offset, else
//! the epoch the offset was appended in (Kafka's `epochForOffset`).

use super::{decode, errors, led_partition, respond, Outcome};
use crate::auth::acl::AclOperation;
use crate::handlers::authz::Authz;
use crate::protocol::hand_versions_more::{
    ListOffsetsRequestV11, ListOffsetsResponseV11, LIST_OFFSETS_PENDING_UPLOAD_VERSION,
};
use crate::protocol::RequestHeader;
use crate::shard::ShardCtx;
use crate::types::Offset;
use bytes::BytesMut;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};
use kafka_protocol::ResponseError;
use std::rc::Rc;

/// Special timestamps of ListOffsets.
pub const LATEST_TIMESTAMP: i64 = -1;
pub const EARLIEST_TIMESTAMP: i64 = -2;
pub const MAX_TIMESTAMP: i64 = -3;
pub const EARLIEST_LOCAL_TIMESTAMP: i64 = -4;
/// Latest tiered (v9+) and earliest pending upload (v11+) offsets: -1 in
/// every field without tiered storage (the `_` arm of `handle`).
pub const LATEST_TIERED_TIMESTAMP: i64 = -5;
pub const EARLIEST_PENDING_UPLOAD_TIMESTAMP: i64 = -6;
/// Isolation level read_committed.
pub const READ_COMMITTED: i8 = 1;

/// Checks a client's leader epoch against the partition's, `leader_epoch`
/// (Kafka's `Partition.checkCurrentLeaderEpoch`): a negative one is "not
/// given"; an older one is FENCED_LEADER_EPOCH (the client's metadata is
/// stale: it refreshes it), a newer one UNKNOWN_LEADER_EPOCH (the broker's
/// is: the client retries).
pub use crate::replication::leading::check_leader_epoch;

pub async fn handle(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let req = if header.api_version >= LIST_OFFSETS_PENDING_UPLOAD_VERSION {
        decode::<ListOffsetsRequestV11>(header, body).map(|r| r.0)
    } else {
        decode::<ListOffsetsRequest>(header, body)
    };
    let Some(req) = req else {
        return Outcome::Close;
    };
    let image = ctx.image();
    let mut topics = Vec::with_capacity(req.topics.len());
    for t in &req.topics {
        let name = t.name.0.to_string();
        // Kafka: DESCRIBE on the topic, else TOPIC_AUTHORIZATION_FAILED.
        let authorized = authz.topic(AclOperation::Describe, &name);
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for p in &t.partitions {
            let base = ListOffsetsPartitionResponse::default()
                .with_partition_index(p.partition_index)
                .with_timestamp(-1)
                .with_offset(-1)
                .with_leader_epoch(-1);
            let fail = |e: ResponseError| base.clone().with_error_code(e.code());
            if !authorized {
                partitions.push(fail(ResponseError::TopicAuthorizationFailed));
                continue;
            }
            let state = match led_partition(ctx, &image, &name, p.partition_index) {
                Ok(state) => state,
                Err((e, _)) => {
                    partitions.push(fail(e));
                    continue;
                }
            };
            if let Some(e) = check_leader_epoch(p.current_leader_epoch, state.log.leader_epoch()) {
                partitions.push(fail(e));
                continue;
            }
            let log = &state.log;
            let found: Result<Option<(i64, i64)>, i16> = match p.timestamp {
                LATEST_TIMESTAMP if req.isolation_level == READ_COMMITTED => {
                    Ok(Some((state.last_stable_offset(), -1)))
                }
                LATEST_TIMESTAMP => Ok(Some((log.high_watermark().0, -1))),
                EARLIEST_TIMESTAMP | EARLIEST_LOCAL_TIMESTAMP => {
                    Ok(Some((log.log_start_offset().0, -1)))
                }
                MAX_TIMESTAMP => Ok(log.max_timestamp().map(|(ts, off)| (off.0, ts))),
                ts if ts >= 0 => match log.offset_for_timestamp(ts).await {
                    Ok(found) => Ok(found.map(|(off, ts)| (off.0, ts))),
                    Err(e) => Err(errors::log(&e)),
                },
                _ => Ok(None),
            };
            // The epoch of the answer, as Kafka's fetchOffsetByTimestamp
            // gives it: the current one for the latest offset, else the
            // epoch the offset was appended in (after a restart the log
            // start's epoch is an older one).
            let epoch_of = |offset: i64| match p.timestamp {
                LATEST_TIMESTAMP => log.leader_epoch(),
                _ => log.epoch_for_offset(Offset(offset)),
            };
            partitions.push(match found {
                Ok(Some((offset, ts))) if header.api_version >= 4 => base
                    .with_offset(offset)
                    .with_timestamp(ts)
                    .with_leader_epoch(epoch_of(offset)),
                Ok(Some((offset, ts))) => base.with_offset(offset).with_timestamp(ts),
                Ok(None) => base,
                Err(code) => base.with_error_code(code),
            });
        }
        topics.push(
            ListOffsetsTopicResponse::default()
                .with_name(t.name.clone())
                .with_partitions(partitions),
        );
    }
    let resp = ListOffsetsResponse::default().with_topics(topics);
    if header.api_version >= LIST_OFFSETS_PENDING_UPLOAD_VERSION {
        respond(header, &ListOffsetsResponseV11(resp))
    } else {
        respond(header, &resp)
    }
}
