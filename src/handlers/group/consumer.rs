//! ConsumerGroupHeartbeat v0-1 and ConsumerGroupDescribe v0-1 (KIP-848),
//! the versions Kafka 4.4 advertises. The group logic lives in
//! `group::consumer`; this file maps topic ids to names and back (the
//! protocol carries ids, the coordinator works with names) and turns
//! refusals into error codes and messages.
//!
//! ConsumerGroupHeartbeat v1 (KIP-1082) requires the client to generate
//! its member id; for v0 a member joining without one gets a fresh one.

use crate::auth::acl::{AclOperation, ResourceType};
use crate::group::consumer::{Assignment, HeartbeatRequest};
use crate::group::error::GroupError;
use crate::handlers::authz::Authz;
use crate::handlers::errors;
use crate::handlers::group::admin::AUTHORIZED_OPERATIONS_OMITTED;
use crate::handlers::{decode, respond, str_bytes, Outcome};
use crate::metadata::MetadataImage;
use crate::protocol::RequestHeader;
use crate::shard::ShardCtx;
use bytes::BytesMut;
use kafka_protocol::messages::consumer_group_describe_response as describe;
use kafka_protocol::messages::consumer_group_heartbeat_response as heartbeat;
use kafka_protocol::messages::{
    ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse, ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse, TopicName,
};
use kafka_protocol::ResponseError;
use std::collections::BTreeSet;
use std::rc::Rc;
use uuid::Uuid;

/// ConsumerGroupDescribe's `member_type` of a consumer-protocol member.
const MEMBER_TYPE_CONSUMER: i8 = 1;
/// ConsumerGroupDescribe's `member_type` of a classic member of a mixed
/// group.
const MEMBER_TYPE_CLASSIC: i8 = 0;

/// The partitions a client reports by topic id, by name; ids the image
/// does not know are dropped (a deleted topic is not owned any more).
fn owned_by_name(
    image: &MetadataImage,
    tps: &[kafka_protocol::messages::consumer_group_heartbeat_request::TopicPartitions],
) -> Assignment {
    let mut out = Assignment::new();
    for tp in tps {
        if let Some(t) = image.topic_by_id(tp.topic_id.as_bytes()) {
            out.entry(t.name.clone())
                .or_default()
                .extend(tp.partitions.iter().copied());
        }
    }
    out
}

/// An assignment by topic id (and name), for answers.
fn by_id<'a>(
    image: &'a MetadataImage,
    a: &'a Assignment,
) -> impl Iterator<Item = (Uuid, &'a String, &'a BTreeSet<i32>)> + 'a {
    a.iter()
        .filter(|(_, ps)| !ps.is_empty())
        .filter_map(|(t, ps)| image.topic(t).map(|m| (Uuid::from_bytes(m.id), t, ps)))
}

/// The message Kafka puts next to an error code, where there is one.
fn message(e: &GroupError) -> Option<String> {
    match e {
        GroupError::InvalidRequest(m) => Some((*m).to_string()),
        GroupError::UnsupportedAssignor(a) => Some(format!("Assignor {a} is not supported.")),
        GroupError::InvalidRegularExpression(m) => Some(m.clone()),
        _ => Some(e.to_string()),
    }
}

pub async fn heartbeat(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<ConsumerGroupHeartbeatRequest>(header, body) else {
        return Outcome::Close;
    };
    let v = header.api_version;
    // Kafka: READ on the group; and (Kafka 4) DESCRIBE on every topic it
    // subscribes to by name. Kafka 4.4 answers either refusal with the code
    // alone, no message (checked against the peer:
    // tests/server_acls.rs), and the member does not join.
    let refused = if !authz.group(AclOperation::Read, req.group_id.as_str()) {
        Some(ResponseError::GroupAuthorizationFailed)
    } else {
        req.subscribed_topic_names
            .iter()
            .flatten()
            .any(|n| !authz.topic(AclOperation::Describe, n.as_str()))
            .then_some(ResponseError::TopicAuthorizationFailed)
    };
    if let Some(e) = refused {
        return respond(
            header,
            &ConsumerGroupHeartbeatResponse::default().with_error_code(e.code()),
        );
    }
    let image = ctx.groups.image();
    let mut hb = HeartbeatRequest {
        member_id: req.member_id.to_string(),
        member_epoch: req.member_epoch,
        instance_id: req.instance_id.as_ref().map(|s| s.to_string()),
        rack_id: req.rack_id.as_ref().map(|s| s.to_string()),
        rebalance_timeout_ms: req.rebalance_timeout_ms,
        subscribed_topic_names: req
            .subscribed_topic_names
            .as_ref()
            .map(|ns| ns.iter().map(|n| n.to_string()).collect()),
        subscribed_topic_regex: req.subscribed_topic_regex.as_ref().map(|s| s.to_string()),
        server_assignor: req.server_assignor.as_ref().map(|s| s.to_string()),
        owned: req
            .topic_partitions
            .as_ref()
            .map(|tps| owned_by_name(&image, tps)),
        client_id: header.client_id.clone().unwrap_or_default(),
        client_host: String::new(),
    };
    let result = match crate::group::consumer::validate_heartbeat(&hb, v) {
        Err(e) => Err(e),
        Ok(()) => {
            if hb.member_id.is_empty() {
                // v0: the coordinator names a joining member.
                hb.member_id = uuid::Builder::from_random_bytes(rand::random())
                    .into_uuid()
                    .to_string();
            }
            let group_id = req.group_id.to_string();
            ctx.groups.consumer_heartbeat(&group_id, hb).await
        }
    };
    // The image the coordinator assigned with may be newer than the one
    // the request was read with (a topic created meanwhile): map the
    // answer with the current one, or a new topic's partitions would be
    // left out of the answer while the coordinator counts them as sent.
    let image = ctx.groups.image();
    let resp = match result {
        Ok(a) => {
            let assignment = a.assignment.map(|asg| {
                heartbeat::Assignment::default().with_topic_partitions(
                    by_id(&image, &asg)
                        .map(|(id, _, ps)| {
                            heartbeat::TopicPartitions::default()
                                .with_topic_id(id)
                                .with_partitions(ps.iter().copied().collect())
                        })
                        .collect(),
                )
            });
            ConsumerGroupHeartbeatResponse::default()
                .with_error_code(errors::NONE)
                .with_member_id(Some(str_bytes(a.member_id)))
                .with_member_epoch(a.member_epoch)
                .with_heartbeat_interval_ms(a.heartbeat_interval_ms)
                .with_assignment(assignment)
        }
        Err(e) => ConsumerGroupHeartbeatResponse::default()
            .with_error_code(errors::group(&e))
            .with_error_message(message(&e).map(str_bytes)),
    };
    respond(header, &resp)
}

pub fn describe(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<ConsumerGroupDescribeRequest>(header, body) else {
        return Outcome::Close;
    };
    let image = ctx.groups.image();
    let assignment = |a: &Assignment| {
        describe::Assignment::default().with_topic_partitions(
            by_id(&image, a)
                .map(|(id, name, ps)| {
                    describe::TopicPartitions::default()
                        .with_topic_id(id)
                        .with_topic_name(TopicName(str_bytes(name.clone())))
                        .with_partitions(ps.iter().copied().collect())
                })
                .collect(),
        )
    };
    let empty = Assignment::new();
    let groups = req
        .group_ids
        .iter()
        .map(|id| {
            let base = describe::DescribedGroup::default()
                .with_group_id(id.clone())
                .with_authorized_operations(AUTHORIZED_OPERATIONS_OMITTED);
            // Kafka: DESCRIBE on each group.
            if !authz.group(AclOperation::Describe, id.as_str()) {
                return base.with_error_code(ResponseError::GroupAuthorizationFailed.code());
            }
            let result = if id.is_empty() {
                Err(GroupError::InvalidGroupId)
            } else {
                ctx.groups.consumer_describe(id)
            };
            match result {
                Err(e) => {
                    let msg = match e {
                        GroupError::GroupIdNotFound => {
                            let name: &str = id;
                            format!("Group {name} not found.")
                        }
                        _ => e.to_string(),
                    };
                    base.with_error_code(errors::group(&e))
                        .with_error_message(Some(str_bytes(msg)))
                }
                // Kafka 4: a group whose members subscribe to or are
                // assigned a topic the principal may not DESCRIBE is not
                // described.
                Ok(c)
                    if authz.enabled()
                        && c.members.values().any(|m| {
                            let assigned = by_id(&image, &m.assigned).map(|(_, n, _)| n.as_str());
                            let target = by_id(&image, c.target.get(&m.member_id).unwrap_or(&empty))
                                .map(|(_, n, _)| n.as_str());
                            m.subscribed_topic_names
                                .iter()
                                .map(String::as_str)
                                .chain(assigned)
                                .chain(target)
                                .any(|t| !authz.topic(AclOperation::Describe, t))
                        }) =>
                {
                    base.with_error_code(ResponseError::TopicAuthorizationFailed.code())
                        .with_error_message(Some(str_bytes(
                            "The group has described topic(s) that the client is not authorized to describe.",
                        )))
                }
                Ok(c) => base
                    .with_error_code(errors::NONE)
                    .with_group_state(str_bytes(c.state().name()))
                    .with_group_epoch(c.group_epoch)
                    .with_assignment_epoch(c.assignment_epoch)
                    .with_assignor_name(str_bytes(c.assignor.clone()))
                    .with_members(
                        c.members
                            .values()
                            .map(|m| {
                                describe::Member::default()
                                    .with_member_id(str_bytes(m.member_id.clone()))
                                    .with_instance_id(m.instance_id.clone().map(str_bytes))
                                    .with_rack_id(m.rack_id.clone().map(str_bytes))
                                    .with_member_epoch(m.member_epoch)
                                    .with_client_id(str_bytes(m.client_id.clone()))
                                    .with_client_host(str_bytes(m.client_host.clone()))
                                    .with_subscribed_topic_names(
                                        m.subscribed_topic_names
                                            .iter()
                                            .map(|t| TopicName(str_bytes(t.clone())))
                                            .collect(),
                                    )
                                    .with_subscribed_topic_regex(
                                        m.subscribed_topic_regex.clone().map(str_bytes),
                                    )
                                    .with_assignment(assignment(&m.assigned))
                                    .with_target_assignment(assignment(
                                        c.target.get(&m.member_id).unwrap_or(&empty),
                                    ))
                                    .with_member_type(if m.classic.is_some() {
                                        MEMBER_TYPE_CLASSIC
                                    } else {
                                        MEMBER_TYPE_CONSUMER
                                    })
                            })
                            .collect(),
                    ),
            }
        })
        .collect();
    let mut groups: Vec<describe::DescribedGroup> = groups;
    // Kafka lists the groups refused by the ACLs first, then the others in
    // the order asked.
    groups.sort_by_key(|g| g.error_code != ResponseError::GroupAuthorizationFailed.code());
    // Kafka: the operations the principal may do on each group described
    // without an error; the others keep the field's default.
    if req.include_authorized_operations {
        for g in groups.iter_mut().filter(|g| g.error_code == errors::NONE) {
            g.authorized_operations = authz.authorized_operations(ResourceType::Group, &g.group_id);
        }
    }
    respond(
        header,
        &ConsumerGroupDescribeResponse::default().with_groups(groups),
    )
}
