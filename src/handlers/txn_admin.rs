//! DescribeTransactions, ListTransactions, DescribeProducers and
//! WriteTxnMarkers.
//!
//! Each shard is a node: ListTransactions and DescribeTransactions answer
//! for the transactional ids this shard coordinates (admin clients ask every
//! node), DescribeProducers for the partitions it leads. WriteTxnMarkers is
//! how another node's coordinator delivers markers to the partitions this
//! node leads (on one node the coordinator reaches partition owners over
//! the router instead); Kafka authorizes it as CLUSTER_ACTION.

use super::{decode, led_partition, respond, str_bytes, Outcome};
use crate::auth::acl::{AclOperation, ResourceType};
use crate::handlers::authz::Authz;
use crate::metadata::internal::TRANSACTION_STATE;
use crate::metadata::Placement;
use crate::partition::{MarkerError, TxnMarker};
use crate::protocol::hand_versions::{
    WriteTxnMarkersRequestV2, WriteTxnMarkersResponseV2, WRITE_TXN_MARKERS_TV_VERSION,
};
use crate::protocol::RequestHeader;
use crate::shard::ShardCtx;
use crate::types::TopicPartition;
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
use std::collections::{BTreeMap, HashMap};
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

/// WriteTxnMarkers: how another node's transaction coordinator writes
/// COMMIT/ABORT markers into the partitions this node leads (Kafka's
/// `handleWriteTxnMarkersRequest`). An inter-broker API: the caller needs
/// CLUSTER_ACTION on the cluster (with no authorizer, everyone has it),
/// else every partition is CLUSTER_AUTHORIZATION_FAILED. Each marker is
/// written by the shard of this node holding its partition's replica
/// (over the router), which checks that it leads it; per partition the
/// answer is Kafka's: UNKNOWN_TOPIC_OR_PARTITION when this node holds no
/// replica, NOT_LEADER_OR_FOLLOWER from a follower, INVALID_PRODUCER_EPOCH
/// for a stale marker. v2 carries each marker's transaction version
/// (KIP-890); v1's markers are of version 1.
pub async fn write_txn_markers(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let (req, versions) = if header.api_version >= WRITE_TXN_MARKERS_TV_VERSION {
        match decode::<WriteTxnMarkersRequestV2>(header, body) {
            Some(r) => (r.request, r.transaction_versions),
            None => return Outcome::Close,
        }
    } else {
        match decode::<WriteTxnMarkersRequest>(header, body) {
            Some(r) => (r, Vec::new()),
            None => return Outcome::Close,
        }
    };
    let authorized = authz.cluster(AclOperation::ClusterAction);
    // (marker index, topic, partition) → error code.
    let mut codes: HashMap<(usize, String, i32), i16> = HashMap::new();
    if authorized {
        let image = ctx.image();
        let mut by_shard: BTreeMap<usize, Vec<TxnMarker>> = BTreeMap::new();
        let mut index_of: HashMap<(i64, String, i32), Vec<usize>> = HashMap::new();
        for (i, m) in req.markers.iter().enumerate() {
            let tv2 = versions.get(i).is_some_and(|&v| v >= 2);
            for t in &m.topics {
                for &p in &t.partition_indexes {
                    let topic = t.name.0.to_string();
                    let placement = image.placement(&topic, p, ctx.config.node_id, ctx.cores());
                    let Placement::Local(shard) = placement else {
                        codes.insert((i, topic, p), ResponseError::UnknownTopicOrPartition.code());
                        continue;
                    };
                    index_of
                        .entry((m.producer_id.0, topic.clone(), p))
                        .or_default()
                        .push(i);
                    by_shard.entry(shard).or_default().push(TxnMarker {
                        tp: TopicPartition::new(topic, p),
                        producer_id: m.producer_id.0,
                        producer_epoch: m.producer_epoch,
                        coordinator_epoch: m.coordinator_epoch,
                        commit: m.transaction_result,
                        tv2,
                    });
                }
            }
        }
        let written = ctx
            .write_markers_on_shards(by_shard, ctx.router.deadline())
            .await;
        for (m, outcome) in written {
            let code = match outcome {
                Ok(()) => 0,
                Err(e) => marker_error_code(e),
            };
            let key = (m.producer_id, m.tp.topic, m.tp.partition.0);
            // One answer per listed (marker, partition): a partition named
            // twice for the same producer gets the first outcome per entry.
            if let Some(list) = index_of.get_mut(&key) {
                if !list.is_empty() {
                    let i = list.remove(0);
                    codes.insert((i, key.1, key.2), code);
                }
            }
        }
    }
    let refused = ResponseError::ClusterAuthorizationFailed.code();
    let results = req
        .markers
        .iter()
        .enumerate()
        .map(|(i, m)| {
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
                                            let code = if authorized {
                                                codes
                                                    .get(&(i, t.name.0.to_string(), p))
                                                    .copied()
                                                    .unwrap_or(
                                                        ResponseError::RequestTimedOut.code(),
                                                    )
                                            } else {
                                                refused
                                            };
                                            WritableTxnMarkerPartitionResult::default()
                                                .with_partition_index(p)
                                                .with_error_code(code)
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

/// A marker write's failure as Kafka's WriteTxnMarkers answers it.
pub fn marker_error_code(e: MarkerError) -> i16 {
    match e {
        MarkerError::UnknownPartition => ResponseError::UnknownTopicOrPartition,
        MarkerError::NotLeader | MarkerError::Unreachable => ResponseError::NotLeaderOrFollower,
        MarkerError::StaleEpoch => ResponseError::InvalidProducerEpoch,
        MarkerError::CoordinatorFenced => ResponseError::TransactionCoordinatorFenced,
        MarkerError::NotEnoughReplicas => ResponseError::NotEnoughReplicas,
        MarkerError::NotEnoughReplicasAfterAppend => ResponseError::NotEnoughReplicasAfterAppend,
        MarkerError::Storage => ResponseError::KafkaStorageError,
        MarkerError::TimedOut => ResponseError::RequestTimedOut,
    }
    .code()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::txn_env::marker_outcome;

    /// What this node answers, the coordinator's side reads back as the
    /// same outcome (retried or not alike).
    #[test]
    fn marker_errors_survive_the_network() {
        for e in [
            MarkerError::UnknownPartition,
            MarkerError::NotLeader,
            MarkerError::StaleEpoch,
            MarkerError::CoordinatorFenced,
            MarkerError::NotEnoughReplicas,
            MarkerError::NotEnoughReplicasAfterAppend,
            MarkerError::Storage,
            MarkerError::TimedOut,
        ] {
            assert_eq!(marker_outcome(marker_error_code(e)), Err(e));
        }
        assert_eq!(
            marker_outcome(marker_error_code(MarkerError::Unreachable)),
            Err(MarkerError::NotLeader)
        );
    }
}
