//! JoinGroup v0-9, SyncGroup v0-5, Heartbeat v0-4, LeaveGroup v0-5 (the
//! classic rebalance protocol). JoinGroup and a follower's SyncGroup park
//! until the coordinator completes them; the connection keeps answering
//! in order meanwhile (later requests wait behind them, as with Kafka).

use crate::auth::acl::AclOperation;
use crate::group::error::GroupError;
use crate::group::state::JoinRequest;
use crate::handlers::authz::{Authz, GROUP_AUTHORIZATION_FAILED};
use crate::handlers::errors;
use crate::handlers::{decode, respond, str_bytes, Outcome};
use crate::protocol::RequestHeader;
use crate::shard::ShardCtx;
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::{
    HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest,
    LeaveGroupResponse, SyncGroupRequest, SyncGroupResponse,
};
use kafka_protocol::ResponseError;
use std::rc::Rc;

fn opt_str(s: &Option<kafka_protocol::protocol::StrBytes>) -> Option<String> {
    s.as_ref().map(|s| s.to_string())
}

pub async fn join_group(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<JoinGroupRequest>(header, body) else {
        return Outcome::Close;
    };
    let v = header.api_version;
    let group_id = req.group_id.to_string();
    // Kafka: READ on the group (Join, Sync, Heartbeat and Leave alike).
    if !authz.group(AclOperation::Read, &group_id) {
        return respond(
            header,
            &JoinGroupResponse::default()
                .with_error_code(GROUP_AUTHORIZATION_FAILED)
                .with_generation_id(-1)
                .with_protocol_name(if v >= 7 { None } else { Some(str_bytes("")) })
                .with_leader(str_bytes(""))
                .with_member_id(str_bytes("")),
        );
    }
    let rebalance_timeout_ms = if v == 0 {
        req.session_timeout_ms
    } else {
        req.rebalance_timeout_ms
    };
    let join = JoinRequest {
        member_id: req.member_id.to_string(),
        group_instance_id: opt_str(&req.group_instance_id),
        client_id: header.client_id.clone().unwrap_or_default(),
        client_host: String::new(),
        session_timeout_ms: req.session_timeout_ms,
        rebalance_timeout_ms,
        protocol_type: req.protocol_type.to_string(),
        protocols: req
            .protocols
            .iter()
            .map(|p| (p.name.to_string(), p.metadata.clone()))
            .collect(),
        require_known_member_id: v >= 4,
        new_member_id: String::new(),
    };
    let result = match ctx.groups.check(&group_id) {
        Ok(_) => ctx.groups.join(&group_id, join).await,
        Err(e) => Err(e),
    };
    let resp = match result {
        Ok(r) => JoinGroupResponse::default()
            .with_error_code(errors::NONE)
            .with_generation_id(r.generation_id)
            .with_protocol_type(r.protocol_type.map(str_bytes))
            .with_protocol_name(Some(str_bytes(r.protocol_name.unwrap_or_default())))
            .with_leader(str_bytes(r.leader))
            .with_skip_assignment(r.skip_assignment && v >= 9)
            .with_member_id(str_bytes(r.member_id))
            .with_members(
                r.members
                    .into_iter()
                    .map(|(id, instance, metadata)| {
                        JoinGroupResponseMember::default()
                            .with_member_id(str_bytes(id))
                            .with_group_instance_id(instance.map(str_bytes))
                            .with_metadata(metadata)
                    })
                    .collect(),
            ),
        Err(e) => {
            let member_id = match &e {
                GroupError::MemberIdRequired(id) => id.clone(),
                // Kafka answers a refused member with the unknown member id.
                GroupError::GroupMaxSizeReached => String::new(),
                _ => req.member_id.to_string(),
            };
            JoinGroupResponse::default()
                .with_error_code(errors::group(&e))
                .with_generation_id(-1)
                .with_protocol_name(if v >= 7 { None } else { Some(str_bytes("")) })
                .with_leader(str_bytes(""))
                .with_member_id(str_bytes(member_id))
        }
    };
    respond(header, &resp)
}

pub async fn sync_group(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<SyncGroupRequest>(header, body) else {
        return Outcome::Close;
    };
    let group_id = req.group_id.to_string();
    // Kafka: from v5 the protocol type and name are mandatory, checked
    // before the group's ACL.
    if header.api_version >= 5 && (req.protocol_type.is_none() || req.protocol_name.is_none()) {
        return respond(
            header,
            &SyncGroupResponse::default()
                .with_error_code(ResponseError::InconsistentGroupProtocol.code()),
        );
    }
    if !authz.group(AclOperation::Read, &group_id) {
        return respond(
            header,
            &SyncGroupResponse::default().with_error_code(GROUP_AUTHORIZATION_FAILED),
        );
    }
    let assignments: Vec<(String, Bytes)> = req
        .assignments
        .iter()
        .map(|a| (a.member_id.to_string(), a.assignment.clone()))
        .collect();
    let protocol_type = opt_str(&req.protocol_type);
    let protocol_name = opt_str(&req.protocol_name);
    let instance = opt_str(&req.group_instance_id);
    let result = match ctx.groups.check(&group_id) {
        Ok(_) => {
            ctx.groups
                .sync(
                    &group_id,
                    &req.member_id,
                    instance.as_deref(),
                    req.generation_id,
                    protocol_type.as_deref(),
                    protocol_name.as_deref(),
                    assignments,
                )
                .await
        }
        Err(e) => Err(e),
    };
    let resp = match result {
        Ok(a) => SyncGroupResponse::default()
            .with_error_code(errors::NONE)
            .with_protocol_type(a.protocol_type.map(str_bytes))
            .with_protocol_name(a.protocol_name.map(str_bytes))
            .with_assignment(a.assignment),
        Err(e) => SyncGroupResponse::default().with_error_code(errors::group(&e)),
    };
    respond(header, &resp)
}

pub fn heartbeat(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<HeartbeatRequest>(header, body) else {
        return Outcome::Close;
    };
    if !authz.group(AclOperation::Read, req.group_id.as_str()) {
        return respond(
            header,
            &HeartbeatResponse::default().with_error_code(GROUP_AUTHORIZATION_FAILED),
        );
    }
    let instance = opt_str(&req.group_instance_id);
    let result = ctx.groups.check(&req.group_id).and_then(|_| {
        ctx.groups.heartbeat(
            &req.group_id,
            &req.member_id,
            instance.as_deref(),
            req.generation_id,
        )
    });
    let code = match result {
        Ok(()) => errors::NONE,
        Err(e) => errors::group(&e),
    };
    respond(header, &HeartbeatResponse::default().with_error_code(code))
}

pub async fn leave_group(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<LeaveGroupRequest>(header, body) else {
        return Outcome::Close;
    };
    if !authz.group(AclOperation::Read, req.group_id.as_str()) {
        return respond(
            header,
            &LeaveGroupResponse::default().with_error_code(GROUP_AUTHORIZATION_FAILED),
        );
    }
    let batched = header.api_version >= 3;
    let members: Vec<(String, Option<String>)> = if batched {
        req.members
            .iter()
            .map(|m| (m.member_id.to_string(), opt_str(&m.group_instance_id)))
            .collect()
    } else {
        vec![(req.member_id.to_string(), None)]
    };
    let result = match ctx.groups.check(&req.group_id) {
        Ok(_) => ctx.groups.leave(&req.group_id, &members).await,
        Err(e) => Err(e),
    };
    let resp = match result {
        Err(e) => LeaveGroupResponse::default().with_error_code(errors::group(&e)),
        Ok(results) if !batched => {
            let code = match results.first() {
                Some(Err(e)) => errors::group(e),
                _ => errors::NONE,
            };
            LeaveGroupResponse::default().with_error_code(code)
        }
        Ok(results) => LeaveGroupResponse::default()
            .with_error_code(errors::NONE)
            .with_members(
                members
                    .into_iter()
                    .zip(results)
                    .map(|((id, instance), r)| {
                        MemberResponse::default()
                            .with_member_id(str_bytes(id))
                            .with_group_instance_id(instance.map(str_bytes))
                            .with_error_code(match r {
                                Ok(()) => errors::NONE,
                                Err(e) => errors::group(&e),
                            })
                    })
                    .collect(),
            ),
    };
    respond(header, &resp)
}
