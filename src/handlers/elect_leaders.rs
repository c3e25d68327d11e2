//! ElectLeaders: what `kafka-leader-election.sh` and
//! `Admin.electLeaders` send (`docs/replication.md` §4.4).
//!
//! As Kafka's controller (`ReplicationControlManager.electLeaders`):
//! - ALTER on the cluster is required, else CLUSTER_AUTHORIZATION_FAILED at
//!   the top level (v1+) and for every partition named;
//! - election type 0 (preferred; v0 has no type) makes the partition's
//!   first replica its leader when it is live and in the ISR, else
//!   PREFERRED_LEADER_NOT_AVAILABLE; type 1 (unclean) makes the first live
//!   replica of a partition without a leader its leader, alone in the ISR
//!   (it may lack acknowledged writes: what the user asked for), else
//!   ELIGIBLE_LEADERS_NOT_AVAILABLE; a partition that already has that
//!   leader gets ELECTION_NOT_NEEDED; another type is INVALID_REQUEST;
//! - unknown topics and partitions are UNKNOWN_TOPIC_OR_PARTITION with
//!   Kafka's messages ("No such topic as t", "No such partition as t-9");
//! - with no partitions named (null) every partition is tried and only
//!   those whose election was needed are answered, under an entry for
//!   every topic.
//!
//! A topic of one replica (a single node's, or one-replica topics of
//! several nodes) has nothing to elect: ELECTION_NOT_NEEDED while its node
//! is live, else the "not available" error.

use super::errors::{self, CLUSTER_AUTHORIZATION_FAILED_MESSAGE};
use super::forward::forward;
use super::{decode, respond, str_bytes, Outcome};
use crate::auth::acl::AclOperation;
use crate::handlers::authz::Authz;
use crate::protocol::RequestHeader;
use crate::shard::messages::{ControllerError, ControllerReply, ControllerRequest};
use crate::shard::ShardCtx;
use bytes::BytesMut;
use kafka_protocol::messages::elect_leaders_response::{PartitionResult, ReplicaElectionResult};
use kafka_protocol::messages::{ElectLeadersRequest, ElectLeadersResponse, TopicName};
use kafka_protocol::ResponseError;
use std::rc::Rc;

/// Kafka's election types.
const PREFERRED: i8 = 0;
const UNCLEAN: i8 = 1;

pub async fn handle(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<ElectLeadersRequest>(header, body) else {
        return Outcome::Close;
    };
    let election_type = if header.api_version >= 1 {
        req.election_type
    } else {
        PREFERRED
    };
    let named: Option<Vec<(String, Vec<i32>)>> = req.topic_partitions.as_ref().map(|topics| {
        topics
            .iter()
            .map(|t| (t.topic.0.to_string(), t.partitions.clone()))
            .collect()
    });
    let refuse = |code: i16, message: Option<&str>| {
        let results = named
            .iter()
            .flatten()
            .map(|(topic, partitions)| {
                result(
                    topic,
                    partitions
                        .iter()
                        .map(|&p| partition(p, code, message.map(str::to_string)))
                        .collect(),
                )
            })
            .collect();
        ElectLeadersResponse::default()
            .with_error_code(code)
            .with_replica_election_results(results)
    };
    if !authz.cluster(AclOperation::Alter) {
        let code = ResponseError::ClusterAuthorizationFailed.code();
        return respond(
            header,
            &refuse(code, Some(CLUSTER_AUTHORIZATION_FAILED_MESSAGE)),
        );
    }
    let unclean = match election_type {
        PREFERRED => false,
        UNCLEAN => true,
        other => {
            let message = format!("Unknown election type {other}");
            let code = ResponseError::InvalidRequest.code();
            return respond(header, &refuse(code, Some(&message)));
        }
    };
    let all = named.is_none();
    let request = ControllerRequest::ElectLeaders {
        unclean,
        topics: named.clone(),
    };
    let reply = forward(ctx, request, |reply| match reply {
        ControllerReply::Elections(outcomes) => Some(outcomes),
        _ => None,
    });
    let outcomes = match reply.await {
        Ok(outcomes) => outcomes,
        Err(e) => {
            let (code, message) = e.code_and_message();
            return respond(header, &refuse(code, message.as_deref()));
        }
    };
    let results = outcomes
        .into_iter()
        .map(|(topic, partitions)| {
            let partitions = partitions
                .into_iter()
                // Every partition tried: only those whose election was
                // needed are answered (Kafka's).
                .filter(|(_, r)| !(all && r == &Err(ControllerError::ElectionNotNeeded)))
                .map(|(p, r)| match r {
                    Ok(()) => partition(p, errors::NONE, None),
                    Err(e) => partition(p, errors::controller(&e), Some(e.to_string())),
                })
                .collect();
            result(&topic, partitions)
        })
        .collect();
    respond(
        header,
        &ElectLeadersResponse::default().with_replica_election_results(results),
    )
}

fn result(topic: &str, partitions: Vec<PartitionResult>) -> ReplicaElectionResult {
    ReplicaElectionResult::default()
        .with_topic(TopicName(str_bytes(topic)))
        .with_partition_result(partitions)
}

fn partition(id: i32, code: i16, message: Option<String>) -> PartitionResult {
    PartitionResult::default()
        .with_partition_id(id)
        .with_error_code(code)
        .with_error_message(message.map(str_bytes))
}
