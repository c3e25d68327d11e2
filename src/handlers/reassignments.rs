//! AlterPartitionReassignments and ListPartitionReassignments (KIP-455):
//! what `kafka-reassign-partitions.sh` and `Admin.alterPartitionReassignments`
//! / `listPartitionReassignments` send (`docs/replication.md` §4.5).
//!
//! As Kafka:
//! - AlterPartitionReassignments needs ALTER on the cluster, else
//!   CLUSTER_AUTHORIZATION_FAILED at the top level and for every partition
//!   named; ListPartitionReassignments needs DESCRIBE on the cluster, else
//!   CLUSTER_AUTHORIZATION_FAILED at the top level;
//! - each partition's target replicas (or null: cancel) go to the
//!   controller, which answers per partition (`shard::controller`'s
//!   `plan_reassignment`): UNKNOWN_TOPIC_OR_PARTITION,
//!   INVALID_REPLICA_ASSIGNMENT, INVALID_REPLICATION_FACTOR (v1's
//!   `allowReplicationFactorChange` false and a target of another length),
//!   NO_REASSIGNMENT_IN_PROGRESS (a cancellation with none);
//! - v1's response echoes `allowReplicationFactorChange`;
//! - ListPartitionReassignments lists the partitions being reassigned
//!   (every one, or those named; unknown topics and partitions and those
//!   not being reassigned are left out), with their replicas, adding and
//!   removing replicas, from this node's image (every change is applied
//!   here before the request that made it is answered).

use super::errors::{self, CLUSTER_AUTHORIZATION_FAILED_MESSAGE};
use super::forward::forward;
use super::{decode, respond, str_bytes, Outcome};
use crate::auth::acl::AclOperation;
use crate::handlers::authz::Authz;
use crate::metadata::MetadataImage;
use crate::protocol::RequestHeader;
use crate::shard::messages::{ControllerReply, ControllerRequest, ReassignTopic};
use crate::shard::ShardCtx;
use bytes::BytesMut;
use kafka_protocol::messages::alter_partition_reassignments_response::{
    ReassignablePartitionResponse, ReassignableTopicResponse,
};
use kafka_protocol::messages::list_partition_reassignments_response::{
    OngoingPartitionReassignment, OngoingTopicReassignment,
};
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, BrokerId,
    ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse, TopicName,
};
use kafka_protocol::ResponseError;
use std::rc::Rc;

pub async fn alter(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<AlterPartitionReassignmentsRequest>(header, body) else {
        return Outcome::Close;
    };
    // v0 has no such field: a change of replication factor is allowed.
    let allow_rf_change = header.api_version < 1 || req.allow_replication_factor_change;
    let topics: Vec<ReassignTopic> = req
        .topics
        .iter()
        .map(|t| {
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    let replicas = p
                        .replicas
                        .as_ref()
                        .map(|r| r.iter().map(|b| b.0).collect::<Vec<i32>>());
                    (p.partition_index, replicas)
                })
                .collect();
            (t.name.0.to_string(), partitions)
        })
        .collect();
    let base = AlterPartitionReassignmentsResponse::default()
        .with_allow_replication_factor_change(allow_rf_change);
    let refuse = |code: i16, message: Option<&str>| {
        let responses = topics
            .iter()
            .map(|(topic, partitions)| {
                topic_response(
                    topic,
                    partitions
                        .iter()
                        .map(|(p, _)| partition_response(*p, code, message.map(str::to_string)))
                        .collect(),
                )
            })
            .collect();
        base.clone()
            .with_error_code(code)
            .with_error_message(message.map(str_bytes))
            .with_responses(responses)
    };
    if !authz.cluster(AclOperation::Alter) {
        let code = ResponseError::ClusterAuthorizationFailed.code();
        return respond(
            header,
            &refuse(code, Some(CLUSTER_AUTHORIZATION_FAILED_MESSAGE)),
        );
    }
    let request = ControllerRequest::AlterPartitionReassignments {
        allow_rf_change,
        topics: topics.clone(),
    };
    let reply = forward(ctx, request, |reply| match reply {
        ControllerReply::Reassignments(outcomes) => Some(outcomes),
        _ => None,
    });
    let outcomes = match reply.await {
        Ok(outcomes) => outcomes,
        Err(e) => {
            let (code, message) = e.code_and_message();
            return respond(header, &refuse(code, message.as_deref()));
        }
    };
    let responses = outcomes
        .into_iter()
        .map(|(topic, partitions)| {
            let partitions = partitions
                .into_iter()
                .map(|(p, r)| match r {
                    Ok(()) => partition_response(p, errors::NONE, None),
                    Err(e) => partition_response(p, errors::controller(&e), Some(e.to_string())),
                })
                .collect();
            topic_response(&topic, partitions)
        })
        .collect();
    respond(header, &base.with_responses(responses))
}

pub fn list(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<ListPartitionReassignmentsRequest>(header, body) else {
        return Outcome::Close;
    };
    if !authz.cluster(AclOperation::Describe) {
        return respond(
            header,
            &ListPartitionReassignmentsResponse::default()
                .with_error_code(ResponseError::ClusterAuthorizationFailed.code())
                .with_error_message(Some(str_bytes(CLUSTER_AUTHORIZATION_FAILED_MESSAGE))),
        );
    }
    let named: Option<Vec<(String, Vec<i32>)>> = req.topics.as_ref().map(|topics| {
        topics
            .iter()
            .map(|t| (t.name.0.to_string(), t.partition_indexes.clone()))
            .collect()
    });
    let topics = ongoing(&ctx.image(), named);
    respond(
        header,
        &ListPartitionReassignmentsResponse::default().with_topics(topics),
    )
}

/// The reassignments in progress in `image`: of every partition, or of
/// those `named` (Kafka's `listPartitionReassignments`).
fn ongoing(
    image: &MetadataImage,
    named: Option<Vec<(String, Vec<i32>)>>,
) -> Vec<OngoingTopicReassignment> {
    let wanted: Vec<(String, Vec<i32>)> = match named {
        Some(named) => named,
        None => image
            .topics
            .values()
            .filter(|t| t.replicated.iter().any(|p| p.is_reassigning()))
            .map(|t| (t.name.clone(), (0..t.partition_count()).collect()))
            .collect(),
    };
    let ids = |v: &[i32]| v.iter().map(|&b| BrokerId(b)).collect::<Vec<_>>();
    let mut out = Vec::new();
    for (name, partitions) in wanted {
        let Some(t) = image.topic(&name) else {
            continue;
        };
        let partitions: Vec<OngoingPartitionReassignment> = partitions
            .into_iter()
            .filter_map(|i| {
                let p = t.replica_state(i).filter(|p| p.is_reassigning())?;
                Some(
                    OngoingPartitionReassignment::default()
                        .with_partition_index(i)
                        .with_replicas(ids(&p.replicas))
                        .with_adding_replicas(ids(&p.adding))
                        .with_removing_replicas(ids(&p.removing)),
                )
            })
            .collect();
        if !partitions.is_empty() {
            out.push(
                OngoingTopicReassignment::default()
                    .with_name(TopicName(str_bytes(&name)))
                    .with_partitions(partitions),
            );
        }
    }
    out
}

fn topic_response(
    topic: &str,
    partitions: Vec<ReassignablePartitionResponse>,
) -> ReassignableTopicResponse {
    ReassignableTopicResponse::default()
        .with_name(TopicName(str_bytes(topic)))
        .with_partitions(partitions)
}

fn partition_response(
    id: i32,
    code: i16,
    message: Option<String>,
) -> ReassignablePartitionResponse {
    ReassignablePartitionResponse::default()
        .with_partition_index(id)
        .with_error_code(code)
        .with_error_message(message.map(str_bytes))
}
