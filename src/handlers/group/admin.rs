//! ListGroups v0-5 (state filter v4+, type filter v5+), DescribeGroups
//! v0-6 and DeleteGroups v0-3 (v3 adds a message per result, always null
//! here: see `delete_groups`). ListGroups answers the groups of this
//! shard only: admin clients ask every node and merge, as with Kafka. It
//! lists classic and KIP-848 consumer groups with their type; DescribeGroups
//! describes classic groups only (a consumer group answers as a missing
//! group does, as in Kafka: ConsumerGroupDescribe describes it).

use crate::auth::acl::{AclOperation, ResourceType};
use crate::group::error::GroupError;
use crate::group::state::GroupState;
use crate::handlers::authz::{Authz, GROUP_AUTHORIZATION_FAILED};
use crate::handlers::errors;
use crate::handlers::{decode, respond, str_bytes, Outcome};
use crate::protocol::hand_versions_more::{
    DeleteGroupsRequestV3, DeleteGroupsResponseV3, DELETE_GROUPS_MESSAGE_VERSION,
};
use crate::protocol::RequestHeader;
use crate::shard::ShardCtx;
use bytes::BytesMut;
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::{
    DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest, DescribeGroupsResponse,
    GroupId, ListGroupsRequest, ListGroupsResponse,
};
use std::rc::Rc;

/// `authorized_operations` when the client did not ask for them, or for a
/// group answered with an error (the schema's default).
pub const AUTHORIZED_OPERATIONS_OMITTED: i32 = i32::MIN;

pub fn list_groups(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<ListGroupsRequest>(header, body) else {
        return Outcome::Close;
    };
    let states: Vec<String> = req.states_filter.iter().map(|s| s.to_lowercase()).collect();
    let types: Vec<String> = req.types_filter.iter().map(|s| s.to_lowercase()).collect();
    let code = if ctx.groups.any_loading() {
        errors::group(&GroupError::LoadInProgress)
    } else {
        errors::NONE
    };
    // Kafka: DESCRIBE on the cluster lists every group; without it, only
    // the groups the principal may DESCRIBE.
    let all = authz.cluster_quiet(AclOperation::Describe);
    let groups = ctx
        .groups
        .list_groups()
        .into_iter()
        .filter(|(id, _, _, _)| {
            all || authz.filter(AclOperation::Describe, ResourceType::Group, id)
        })
        .filter(|(_, _, s, _)| states.is_empty() || states.contains(&s.to_lowercase()))
        .filter(|(_, _, _, kind)| types.is_empty() || types.iter().any(|t| t == kind))
        .map(|(id, protocol_type, state, kind)| {
            ListedGroup::default()
                .with_group_id(GroupId(str_bytes(id)))
                .with_protocol_type(str_bytes(protocol_type))
                .with_group_state(str_bytes(state))
                .with_group_type(str_bytes(kind))
        })
        .collect();
    respond(
        header,
        &ListGroupsResponse::default()
            .with_error_code(code)
            .with_groups(groups),
    )
}

pub fn describe_groups(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<DescribeGroupsRequest>(header, body) else {
        return Outcome::Close;
    };
    let v = header.api_version;
    let groups = req
        .groups
        .iter()
        .map(|id| {
            let base = DescribedGroup::default()
                .with_group_id(id.clone())
                .with_authorized_operations(AUTHORIZED_OPERATIONS_OMITTED);
            // Kafka: DESCRIBE on each group.
            if !authz.group(AclOperation::Describe, id.as_str()) {
                return base
                    .with_error_code(GROUP_AUTHORIZATION_FAILED)
                    .with_group_state(str_bytes(""));
            }
            match ctx.groups.describe(id) {
                Err(e) => base
                    .with_error_code(errors::group(&e))
                    .with_group_state(str_bytes("")),
                // v6+ (KIP-1043) names a missing group, and a consumer
                // group, which DescribeGroups does not describe.
                Ok(None) if v >= 6 => {
                    let message = if ctx.groups.consumer_describe(id).is_ok() {
                        format!("Group {} is not a classic group.", id.as_str())
                    } else {
                        format!("Group {} not found.", id.as_str())
                    };
                    base.with_error_code(errors::group(&GroupError::GroupIdNotFound))
                        .with_error_message(Some(str_bytes(message)))
                        .with_group_state(str_bytes(GroupState::Dead.name()))
                }
                Ok(None) => base
                    .with_error_code(errors::NONE)
                    .with_group_state(str_bytes(GroupState::Dead.name())),
                Ok(Some(d)) => base
                    .with_error_code(errors::NONE)
                    .with_group_state(str_bytes(d.state.name()))
                    .with_protocol_type(str_bytes(d.protocol_type))
                    .with_protocol_data(str_bytes(d.protocol_name))
                    .with_members(
                        d.members
                            .into_iter()
                            .map(|(m, metadata, assignment)| {
                                DescribedGroupMember::default()
                                    .with_member_id(str_bytes(m.member_id))
                                    .with_group_instance_id(m.group_instance_id.map(str_bytes))
                                    .with_client_id(str_bytes(m.client_id))
                                    .with_client_host(str_bytes(m.client_host))
                                    .with_member_metadata(metadata)
                                    .with_member_assignment(assignment)
                            })
                            .collect(),
                    ),
            }
        })
        .collect();
    let mut groups: Vec<DescribedGroup> = groups;
    // Kafka lists the groups refused by the ACLs first, then the others in
    // the order asked.
    groups.sort_by_key(|g| g.error_code != GROUP_AUTHORIZATION_FAILED);
    // Kafka (v3+): the operations the principal may do on each group
    // described without an error; the others keep the field's default.
    if v >= 3 && req.include_authorized_operations {
        for g in groups.iter_mut().filter(|g| g.error_code == errors::NONE) {
            g.authorized_operations = authz.authorized_operations(ResourceType::Group, &g.group_id);
        }
    }
    respond(
        header,
        &DescribeGroupsResponse::default().with_groups(groups),
    )
}

pub async fn delete_groups(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let v3 = header.api_version >= DELETE_GROUPS_MESSAGE_VERSION;
    let req = if v3 {
        decode::<DeleteGroupsRequestV3>(header, body).map(|r| r.0)
    } else {
        decode::<DeleteGroupsRequest>(header, body)
    };
    let Some(req) = req else {
        return Outcome::Close;
    };
    let mut results = Vec::with_capacity(req.groups_names.len());
    for id in &req.groups_names {
        // Kafka: DELETE on each group.
        if !authz.group(AclOperation::Delete, id.as_str()) {
            results.push(
                DeletableGroupResult::default()
                    .with_group_id(id.clone())
                    .with_error_code(GROUP_AUTHORIZATION_FAILED),
            );
            continue;
        }
        let r = match ctx.groups.check(id) {
            Ok(_) => ctx.groups.delete_group(id).await,
            Err(e) => Err(e),
        };
        results.push(
            DeletableGroupResult::default()
                .with_group_id(id.clone())
                .with_error_code(match r {
                    Ok(()) => errors::NONE,
                    Err(e) => errors::group(&e),
                }),
        );
    }
    let response = DeleteGroupsResponse::default().with_results(results);
    if v3 {
        // Kafka 4.4 sets a result's message only for a streams group whose
        // topology refuses the deletion; fjord has no streams groups, so
        // every message is null, as Kafka's for the groups fjord has.
        return respond(
            header,
            &DeleteGroupsResponseV3 {
                response,
                error_messages: Vec::new(),
            },
        );
    }
    respond(header, &response)
}
