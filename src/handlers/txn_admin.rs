//! DescribeTransactions, ListTransactions, DescribeProducers and
//! WriteTxnMarkers.
//!
//! Each shard is a node: ListTransactions and DescribeTransactions answer
//! for the transactional ids this shard coordinates (admin clients ask every
//! node), DescribeProducers for the partitions it leads. WriteTxnMarkers is
//! how another node's coordinator would deliver markers; on one node the
//! coordinator reaches partition owners over the router instead, and a
//! client's WriteTxnMarkers is refused (CLUSTER_AUTHORIZATION_FAILED) until
//! brokers can authenticate each other.

use super::{decode, led_partition, respond, str_bytes, Outcome};
use crate::auth::acl::{AclOperation, ResourceType};
use crate::handlers::authz::Authz;
use crate::metadata::internal::TRANSACTION_STATE;
use crate::protocol::hand_versions::{
    WriteTxnMarkersRequestV2, WriteTxnMarkersResponseV2, WRITE_TXN_MARKERS_TV_VERSION,
};
use crate::protocol::RequestHeader;
use crate::shard::ShardCtx;
use bytes::BytesMut;
use kafka_protocol::messages::describe_producers_response::{
    PartitionResponse, ProducerState, TopicResponse,
};
use kafka_protocol::messages::describe_transactions_response::{self, TopicData};
use kafka_protocol::messages::list_transactions_response;
use kafka_protocol::messages::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
};
use kafka_protocol::messages::{
    DescribeProducersRequest, DescribeProducersResponse, DescribeTransactionsRequest,
    DescribeTransactionsResponse, ListTransactionsRequest, ListTransactionsResponse, ProducerId,
    TopicName, TransactionalId, WriteTxnMarkersRequest, WriteTxnMarkersResponse,
};
use kafka_protocol::ResponseError;
use std::collections::BTreeMap;
use std::rc::Rc;

const TXN_STATE_NAMES: &[&str] = &[
    "Empty",
    "Ongoing",
    "PrepareCommit",
    "PrepareAbort",
    "CompleteCommit",
    "CompleteAbort",
    "Dead",
    "PrepareEpochFence",
];

pub fn describe_transactions(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<DescribeTransactionsRequest>(header, body) else {
        return Outcome::Close;
    };
    let image = ctx.image();
    let states = req
        .transactional_ids
        .iter()
        .map(|id| {
            let base = describe_transactions_response::TransactionState::default()
                .with_transactional_id(id.clone())
                .with_transaction_state(str_bytes(""))
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1);
            // Kafka: DESCRIBE on the transactional id.
            if !authz.transactional_id(AclOperation::Describe, id.0.as_str()) {
                return base
                    .with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code());
            }
            let owner = image.coordinator(TRANSACTION_STATE, id.0.as_str(), ctx.cores());
            if owner.map(|c| c.shard) != Some(ctx.shard) {
                return base.with_error_code(ResponseError::NotCoordinator.code());
            }
            match ctx.txn.get(id.0.as_str()) {
                None => base.with_error_code(ResponseError::TransactionalIdNotFound.code()),
                Some(m) => {
                    let mut topics: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
                    // Only the topics the principal may DESCRIBE are shown.
                    for tp in m
                        .partitions
                        .iter()
                        .filter(|tp| authz.topic(AclOperation::Describe, &tp.topic))
                    {
                        topics.entry(&tp.topic).or_default().push(tp.partition.0);
                    }
                    base.with_transaction_state(str_bytes(m.state.name()))
                        .with_transaction_timeout_ms(m.timeout_ms)
                        .with_transaction_start_time_ms(m.start_ms)
                        .with_producer_id(ProducerId(m.producer_id))
                        .with_producer_epoch(m.producer_epoch)
                        .with_topics(
                            topics
                                .into_iter()
                                .map(|(t, ps)| {
                                    TopicData::default()
                                        .with_topic(TopicName(str_bytes(t)))
                                        .with_partitions(ps)
                                })
                                .collect(),
                        )
                }
            }
        })
        .collect();
    respond(
        header,
        &DescribeTransactionsResponse::default().with_transaction_states(states),
    )
}

pub fn list_transactions(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<ListTransactionsRequest>(header, body) else {
        return Outcome::Close;
    };
    let unknown: Vec<_> = req
        .state_filters
        .iter()
        .filter(|f| !TXN_STATE_NAMES.contains(&f.as_str()))
        .cloned()
        .collect();
    // v2 (KIP-1152): only ids the pattern matches whole (RE2 syntax, as
    // Kafka's RE2/J `matches()`); null or empty matches everything.
    let pattern = match req
        .transactional_id_pattern
        .as_ref()
        .filter(|p| !p.is_empty())
        .map(|p| regex::Regex::new(&format!("^(?:{})$", p.as_str())))
    {
        None => None,
        Some(Ok(re)) => Some(re),
        Some(Err(_)) => {
            return respond(
                header,
                &ListTransactionsResponse::default().with_error_code(
                    kafka_protocol::ResponseError::InvalidRegularExpression.code(),
                ),
            );
        }
    };
    let now = crate::clock::now_ms();
    let mut states: Vec<_> = ctx
        .txn
        .all()
        .into_iter()
        .filter(|m| {
            pattern
                .as_ref()
                .is_none_or(|re| re.is_match(&m.transactional_id))
        })
        // Kafka lists only the ids the principal may DESCRIBE.
        .filter(|m| {
            authz.filter(
                AclOperation::Describe,
                ResourceType::TransactionalId,
                &m.transactional_id,
            )
        })
        .filter(|m| {
            req.state_filters.is_empty()
                || req
                    .state_filters
                    .iter()
                    .any(|f| f.as_str() == m.state.name())
        })
        .filter(|m| {
            req.producer_id_filters.is_empty()
                || req.producer_id_filters.iter().any(|p| p.0 == m.producer_id)
        })
        .filter(|m| {
            req.duration_filter < 0 || (m.start_ms >= 0 && now - m.start_ms >= req.duration_filter)
        })
        .map(|m| {
            list_transactions_response::TransactionState::default()
                .with_transactional_id(TransactionalId(str_bytes(m.transactional_id)))
                .with_producer_id(ProducerId(m.producer_id))
                .with_transaction_state(str_bytes(m.state.name()))
        })
        .collect();
    states.sort_by(|a, b| a.transactional_id.0.cmp(&b.transactional_id.0));
    respond(
        header,
        &ListTransactionsResponse::default()
            .with_unknown_state_filters(unknown)
            .with_transaction_states(states),
    )
}

pub fn describe_producers(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<DescribeProducersRequest>(header, body) else {
        return Outcome::Close;
    };
    let image = ctx.image();
    let topics = req
        .topics
        .iter()
        .map(|t| {
            // Kafka: READ on the topic.
            let authorized = authz.topic(AclOperation::Read, t.name.0.as_str());
            let partitions = t
                .partition_indexes
                .iter()
                .map(|&p| {
                    let r = PartitionResponse::default().with_partition_index(p);
                    if !authorized {
                        return r
                            .with_error_code(ResponseError::TopicAuthorizationFailed.code())
                            .with_error_message(Some(str_bytes("Topic authorization failed.")));
                    }
                    match led_partition(ctx, &image, t.name.0.as_str(), p) {
                        Err((e, _)) => r.with_error_code(e.code()),
                        Ok(state) => {
                            let producers = state.producers();
                            let mut active: Vec<ProducerState> = producers
                                .entries()
                                .map(|(&pid, e)| {
                                    let last = e.batches.back();
                                    ProducerState::default()
                                        .with_producer_id(ProducerId(pid))
                                        .with_producer_epoch(e.epoch as i32)
                                        .with_last_sequence(last.map_or(-1, |b| b.last_seq))
                                        .with_last_timestamp(last.map_or(-1, |b| b.max_timestamp))
                                        .with_coordinator_epoch(-1)
                                        .with_current_txn_start_offset(
                                            e.current_txn_first_offset.unwrap_or(-1),
                                        )
                                })
                                .collect();
                            active.sort_by_key(|p| p.producer_id.0);
                            r.with_active_producers(active)
                        }
                    }
                })
                .collect();
            TopicResponse::default()
                .with_name(t.name.clone())
                .with_partitions(partitions)
        })
        .collect();
    respond(
        header,
        &DescribeProducersResponse::default().with_topics(topics),
    )
}

/// WriteTxnMarkers is an inter-broker API (Kafka authorizes it as
/// CLUSTER_ACTION). A single fjord node delivers its markers over the
/// router, never through this API, and until authentication exists no
/// caller can be told apart from a client forging COMMIT or ABORT markers
/// for other producers' transactions: every marker is refused with
/// CLUSTER_AUTHORIZATION_FAILED, which is what Kafka answers a client that
/// lacks CLUSTER_ACTION. v2 adds each marker's transaction version
/// (KIP-890), which changes nothing about that refusal.
pub fn write_txn_markers(header: &RequestHeader, body: &mut BytesMut) -> Outcome {
    let req = if header.api_version >= WRITE_TXN_MARKERS_TV_VERSION {
        decode::<WriteTxnMarkersRequestV2>(header, body).map(|r| r.request)
    } else {
        decode::<WriteTxnMarkersRequest>(header, body)
    };
    let Some(req) = req else {
        return Outcome::Close;
    };
    let refused = ResponseError::ClusterAuthorizationFailed.code();
    let results = req
        .markers
        .iter()
        .map(|m| {
            WritableTxnMarkerResult::default()
                .with_producer_id(m.producer_id)
                .with_topics(
                    m.topics
                        .iter()
                        .map(|t| {
                            WritableTxnMarkerTopicResult::default()
                                .with_name(t.name.clone())
                                .with_partitions(
                                    t.partition_indexes
                                        .iter()
                                        .map(|&p| {
                                            WritableTxnMarkerPartitionResult::default()
                                                .with_partition_index(p)
                                                .with_error_code(refused)
                                        })
                                        .collect(),
                                )
                        })
                        .collect(),
                )
        })
        .collect();
    let resp = WriteTxnMarkersResponse::default().with_markers(results);
    if header.api_version >= WRITE_TXN_MARKERS_TV_VERSION {
        respond(header, &WriteTxnMarkersResponseV2(resp))
    } else {
        respond(header, &resp)
    }
}
