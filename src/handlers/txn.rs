//! AddPartitionsToTxn, AddOffsetsToTxn and EndTxn: requests a producer
//! sends to its transaction coordinator (the shard leading its
//! `__transaction_state` partition; see `txn::coordinator`).

use super::{decode, errors, respond, Outcome};
use crate::auth::acl::AclOperation;
use crate::handlers::authz::Authz;
use crate::metadata::internal::CONSUMER_OFFSETS;
use crate::protocol::RequestHeader;
use crate::shard::ShardCtx;
use crate::types::TopicPartition;
use bytes::BytesMut;
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse, EndTxnRequest, EndTxnResponse, ProducerId,
};
use kafka_protocol::ResponseError;
use std::rc::Rc;

/// First versions that answer PRODUCER_FENCED rather than INVALID_PRODUCER_EPOCH.
const ADD_PARTITIONS_FENCED_VERSION: i16 = 2;
const ADD_OFFSETS_FENCED_VERSION: i16 = 2;
/// First AddPartitionsToTxn version with batched transactions (KIP-890).
const ADD_PARTITIONS_BATCHED_VERSION: i16 = 4;
/// First EndTxn version of transaction version 2 (epoch bump per transaction).
pub const END_TXN_TV2_VERSION: i16 = 5;

/// Adds (or, with `verify_only`, checks) the topics' partitions; the result
/// per partition. Unknown partitions get UNKNOWN_TOPIC_OR_PARTITION and the
/// others OPERATION_NOT_ATTEMPTED, as Kafka does.
#[allow(clippy::too_many_arguments)]
async fn add_topics(
    ctx: &Rc<ShardCtx>,
    id: &str,
    pid: i64,
    epoch: i16,
    verify_only: bool,
    topics: &[AddPartitionsToTxnTopic],
    fenced_known: bool,
    authz: &Authz,
    denied: Option<ResponseError>,
) -> Vec<AddPartitionsToTxnTopicResult> {
    let image = ctx.image();
    let mut wanted = Vec::new();
    let mut unknown = false;
    let mut unauthorized = false;
    for t in topics {
        // Kafka (client versions): WRITE on every topic, internal ones too.
        let authorized = authz.topic(AclOperation::Write, t.name.0.as_str());
        unauthorized |= !authorized;
        for &p in &t.partitions {
            let known = image
                .leader_shard(t.name.0.as_str(), p, ctx.cores())
                .is_some();
            unknown |= !known;
            wanted.push((t.name.clone(), p, (known, authorized)));
        }
    }
    let tps: Vec<TopicPartition> = wanted
        .iter()
        .map(|(n, p, _)| TopicPartition::new(n.0.to_string(), *p))
        .collect();
    let outcome: Vec<i16> = if let Some(e) = denied {
        vec![e.code(); wanted.len()]
    } else if unknown || unauthorized {
        wanted
            .iter()
            .map(|(_, _, (known, authorized))| {
                if !*authorized {
                    ResponseError::TopicAuthorizationFailed.code()
                } else if *known {
                    ResponseError::OperationNotAttempted.code()
                } else {
                    ResponseError::UnknownTopicOrPartition.code()
                }
            })
            .collect()
    } else if verify_only {
        tps.iter()
            .map(
                |tp| match ctx.txn.verify_partition(ctx, id, pid, epoch, tp) {
                    Ok(()) => errors::NONE,
                    Err(e) => errors::txn(e, fenced_known),
                },
            )
            .collect()
    } else {
        let code = match ctx.txn.add_partitions(ctx, id, pid, epoch, &tps).await {
            Ok(()) => errors::NONE,
            Err(e) => errors::txn(e, fenced_known),
        };
        vec![code; tps.len()]
    };
    let mut results: Vec<AddPartitionsToTxnTopicResult> = Vec::new();
    for ((name, p, _), code) in wanted.into_iter().zip(outcome) {
        let r = AddPartitionsToTxnPartitionResult::default()
            .with_partition_index(p)
            .with_partition_error_code(code);
        match results.iter_mut().find(|t| t.name == name) {
            Some(t) => t.results_by_partition.push(r),
            None => results.push(
                AddPartitionsToTxnTopicResult::default()
                    .with_name(name)
                    .with_results_by_partition(vec![r]),
            ),
        }
    }
    results
}

pub async fn add_partitions(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<AddPartitionsToTxnRequest>(header, body) else {
        return Outcome::Close;
    };
    let v = header.api_version;
    let fenced_known = v >= ADD_PARTITIONS_FENCED_VERSION;
    let resp = if v >= ADD_PARTITIONS_BATCHED_VERSION {
        // Kafka: the batched versions come from brokers, CLUSTER_ACTION.
        if !authz.cluster(AclOperation::ClusterAction) {
            return respond(
                header,
                &AddPartitionsToTxnResponse::default()
                    .with_error_code(ResponseError::ClusterAuthorizationFailed.code()),
            );
        }
        let mut out = Vec::with_capacity(req.transactions.len());
        for t in &req.transactions {
            let topics = add_topics(
                ctx,
                t.transactional_id.0.as_str(),
                t.producer_id.0,
                t.producer_epoch,
                t.verify_only,
                &t.topics,
                fenced_known,
                &Authz::allow_all(),
                None,
            )
            .await;
            out.push(
                AddPartitionsToTxnResult::default()
                    .with_transactional_id(t.transactional_id.clone())
                    .with_topic_results(topics),
            );
        }
        AddPartitionsToTxnResponse::default().with_results_by_transaction(out)
    } else {
        let id = req.v3_and_below_transactional_id.0.as_str();
        let denied = (!authz.transactional_id(AclOperation::Write, id))
            .then_some(ResponseError::TransactionalIdAuthorizationFailed);
        let topics = add_topics(
            ctx,
            id,
            req.v3_and_below_producer_id.0,
            req.v3_and_below_producer_epoch,
            false,
            &req.v3_and_below_topics,
            fenced_known,
            authz,
            denied,
        )
        .await;
        AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(topics)
    };
    respond(header, &resp)
}

pub async fn add_offsets(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<AddOffsetsToTxnRequest>(header, body) else {
        return Outcome::Close;
    };
    let fenced_known = header.api_version >= ADD_OFFSETS_FENCED_VERSION;
    // Kafka: WRITE on the transactional id, then READ on the group.
    let refused = if !authz.transactional_id(AclOperation::Write, req.transactional_id.0.as_str()) {
        Some(ResponseError::TransactionalIdAuthorizationFailed)
    } else if !authz.group(AclOperation::Read, req.group_id.0.as_str()) {
        Some(ResponseError::GroupAuthorizationFailed)
    } else {
        None
    };
    if let Some(e) = refused {
        return respond(
            header,
            &AddOffsetsToTxnResponse::default().with_error_code(e.code()),
        );
    }
    let code = match ctx.ensure_internal_topic(CONSUMER_OFFSETS).await {
        Err(e) => {
            tracing::warn!(error = %e, "creating __consumer_offsets failed");
            ResponseError::CoordinatorNotAvailable.code()
        }
        Ok(topic) => match topic.coordinator(req.group_id.0.as_str(), ctx.cores()) {
            None => ResponseError::CoordinatorNotAvailable.code(),
            Some(coordinator) => {
                let tp = TopicPartition::new(CONSUMER_OFFSETS, coordinator.partition);
                match ctx
                    .txn
                    .add_partitions(
                        ctx,
                        req.transactional_id.0.as_str(),
                        req.producer_id.0,
                        req.producer_epoch,
                        &[tp],
                    )
                    .await
                {
                    Ok(()) => errors::NONE,
                    Err(e) => errors::txn(e, fenced_known),
                }
            }
        },
    };
    respond(
        header,
        &AddOffsetsToTxnResponse::default().with_error_code(code),
    )
}

pub async fn end_txn(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<EndTxnRequest>(header, body) else {
        return Outcome::Close;
    };
    let tv2 = header.api_version >= END_TXN_TV2_VERSION;
    // Kafka: WRITE on the transactional id.
    if !authz.transactional_id(AclOperation::Write, req.transactional_id.0.as_str()) {
        let resp = EndTxnResponse::default()
            .with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code());
        let resp = if tv2 {
            resp.with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1)
        } else {
            resp
        };
        return respond(header, &resp);
    }
    let result = ctx
        .txn
        .end_txn(
            ctx,
            req.transactional_id.0.as_str(),
            req.producer_id.0,
            req.producer_epoch,
            req.committed,
            tv2,
        )
        .await;
    let resp = match result {
        Ok((pid, epoch)) if tv2 => EndTxnResponse::default()
            .with_producer_id(ProducerId(pid))
            .with_producer_epoch(epoch),
        Ok(_) => EndTxnResponse::default(),
        // A stale epoch at EndTxn is INVALID_PRODUCER_EPOCH, as stock Kafka
        // answered the fenced producer's commit (KAFKA_BEHAVIOUR.md §5).
        Err(e) => {
            let resp = EndTxnResponse::default().with_error_code(errors::txn(e, false));
            if tv2 {
                resp.with_producer_id(ProducerId(-1))
                    .with_producer_epoch(-1)
            } else {
                resp
            }
        }
    };
    respond(header, &resp)
}
