//! CreateAcls, DescribeAcls and DeleteAcls (Kafka's `AclApis`).
//!
//! Each first checks the principal's right to manage ACLs (DESCRIBE on the
//! cluster to list, ALTER to create or delete: CLUSTER_AUTHORIZATION_FAILED
//! otherwise), then, with no authorizer configured, answers
//! SECURITY_DISABLED as Kafka does. Bindings and filters with an UNKNOWN
//! element, a CLUSTER resource not named `kafka-cluster`, an empty name or
//! a principal without `type:` are INVALID_REQUEST. Changes go through the
//! controller into the metadata log (`MetadataRecord::CreateAcls` /
//! `DeleteAcls`) and reach every shard's image before the answer; a list
//! reads this shard's image.

use super::authz::Authz;
use super::forward::forward;
use super::{decode, errors, respond, str_bytes, Outcome};
use crate::auth::acl::{
    AclBinding, AclBindingFilter, AclOperation, AclPermission, PatternType, ResourceType,
};
use crate::protocol::RequestHeader;
use crate::shard::messages::{ControllerError, ControllerReply, ControllerRequest};
use crate::shard::ShardCtx;
use bytes::BytesMut;
use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::delete_acls_response::{
    DeleteAclsFilterResult, DeleteAclsMatchingAcl,
};
use kafka_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
use kafka_protocol::messages::{
    CreateAclsRequest, CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse,
    DescribeAclsRequest, DescribeAclsResponse,
};
use kafka_protocol::ResponseError;
use std::rc::Rc;

const SECURITY_DISABLED_MESSAGE: &str = "No Authorizer is configured.";

#[allow(clippy::too_many_arguments)]
fn filter_of(
    resource_type: i8,
    name: Option<String>,
    pattern_type: i8,
    principal: Option<String>,
    host: Option<String>,
    operation: i8,
    permission: i8,
) -> AclBindingFilter {
    AclBindingFilter {
        resource_type: ResourceType::from_code(resource_type).unwrap_or(ResourceType::Unknown),
        resource_name: name,
        pattern_type: PatternType::from_code(pattern_type).unwrap_or(PatternType::Unknown),
        principal,
        host,
        operation: AclOperation::from_code(operation).unwrap_or(AclOperation::Unknown),
        permission: AclPermission::from_code(permission).unwrap_or(AclPermission::Unknown),
    }
}

pub async fn create_acls(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<CreateAclsRequest>(header, body) else {
        return Outcome::Close;
    };
    let all = |code: i16, message: &str| {
        let results = req
            .creations
            .iter()
            .map(|_| {
                AclCreationResult::default()
                    .with_error_code(code)
                    .with_error_message(Some(str_bytes(message)))
            })
            .collect();
        CreateAclsResponse::default().with_results(results)
    };
    if !authz.cluster(AclOperation::Alter) {
        let code = ResponseError::ClusterAuthorizationFailed.code();
        return respond(
            header,
            &all(code, errors::CLUSTER_AUTHORIZATION_FAILED_MESSAGE),
        );
    }
    if !authz.enabled() {
        let code = ResponseError::SecurityDisabled.code();
        return respond(header, &all(code, SECURITY_DISABLED_MESSAGE));
    }
    // Per creation: Err(message) if invalid, else its index among the valid.
    let mut valid = Vec::new();
    let mut slots = Vec::with_capacity(req.creations.len());
    for c in &req.creations {
        let binding = AclBinding {
            resource_type: ResourceType::from_code(c.resource_type)
                .unwrap_or(ResourceType::Unknown),
            resource_name: c.resource_name.to_string(),
            pattern_type: PatternType::from_code(c.resource_pattern_type)
                .unwrap_or(PatternType::Unknown),
            principal: c.principal.to_string(),
            host: c.host.to_string(),
            operation: AclOperation::from_code(c.operation).unwrap_or(AclOperation::Unknown),
            permission: AclPermission::from_code(c.permission_type)
                .unwrap_or(AclPermission::Unknown),
        };
        match binding.validate() {
            Ok(()) => {
                slots.push(Ok(valid.len()));
                valid.push(binding);
            }
            Err(message) => slots.push(Err(message)),
        }
    }
    let outcomes: Vec<Result<(), ControllerError>> = if valid.is_empty() {
        Vec::new()
    } else {
        let n = valid.len();
        let request = ControllerRequest::CreateAcls { acls: valid };
        match forward(ctx, request, |reply| acls_reply(reply, n)).await {
            Ok(rs) => rs.into_iter().map(|r| r.map(|_| ())).collect(),
            Err(e) => vec![Err(e.item_error()); n],
        }
    };
    let results = slots
        .into_iter()
        .map(|slot| match slot {
            Err(message) => AclCreationResult::default()
                .with_error_code(ResponseError::InvalidRequest.code())
                .with_error_message(Some(str_bytes(message))),
            Ok(i) => match &outcomes[i] {
                Ok(()) => AclCreationResult::default(),
                Err(e) => AclCreationResult::default()
                    .with_error_code(errors::controller(e))
                    .with_error_message(Some(str_bytes(e.to_string()))),
            },
        })
        .collect();
    respond(header, &CreateAclsResponse::default().with_results(results))
}

pub fn describe_acls(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<DescribeAclsRequest>(header, body) else {
        return Outcome::Close;
    };
    let error = |code: i16, message: &str| {
        DescribeAclsResponse::default()
            .with_error_code(code)
            .with_error_message(Some(str_bytes(message)))
    };
    if !authz.cluster(AclOperation::Describe) {
        let code = ResponseError::ClusterAuthorizationFailed.code();
        return respond(
            header,
            &error(code, errors::CLUSTER_AUTHORIZATION_FAILED_MESSAGE),
        );
    }
    if !authz.enabled() {
        let code = ResponseError::SecurityDisabled.code();
        return respond(
            header,
            &error(code, "No Authorizer is configured on the broker"),
        );
    }
    let filter = filter_of(
        req.resource_type_filter,
        req.resource_name_filter.map(|s| s.to_string()),
        req.pattern_type_filter,
        req.principal_filter.map(|s| s.to_string()),
        req.host_filter.map(|s| s.to_string()),
        req.operation,
        req.permission_type,
    );
    if let Err(message) = filter.validate() {
        return respond(
            header,
            &error(ResponseError::InvalidRequest.code(), &message),
        );
    }
    let image = ctx.image();
    // Bindings come sorted by resource pattern first, so each resource's
    // entries are adjacent.
    let mut resources: Vec<DescribeAclsResource> = Vec::new();
    let mut last: Option<(ResourceType, &str, PatternType)> = None;
    for b in image.acls.matching(&filter) {
        let key = (b.resource_type, b.resource_name.as_str(), b.pattern_type);
        if last != Some(key) {
            resources.push(
                DescribeAclsResource::default()
                    .with_resource_type(b.resource_type.code())
                    .with_resource_name(str_bytes(b.resource_name.clone()))
                    .with_pattern_type(b.pattern_type.code()),
            );
            last = Some(key);
        }
        if let Some(r) = resources.last_mut() {
            r.acls.push(
                AclDescription::default()
                    .with_principal(str_bytes(b.principal.clone()))
                    .with_host(str_bytes(b.host.clone()))
                    .with_operation(b.operation.code())
                    .with_permission_type(b.permission.code()),
            );
        }
    }
    respond(
        header,
        &DescribeAclsResponse::default().with_resources(resources),
    )
}

pub async fn delete_acls(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<DeleteAclsRequest>(header, body) else {
        return Outcome::Close;
    };
    let all = |code: i16, message: &str| {
        let results = req
            .filters
            .iter()
            .map(|_| {
                DeleteAclsFilterResult::default()
                    .with_error_code(code)
                    .with_error_message(Some(str_bytes(message)))
            })
            .collect();
        DeleteAclsResponse::default().with_filter_results(results)
    };
    if !authz.cluster(AclOperation::Alter) {
        let code = ResponseError::ClusterAuthorizationFailed.code();
        return respond(
            header,
            &all(code, errors::CLUSTER_AUTHORIZATION_FAILED_MESSAGE),
        );
    }
    if !authz.enabled() {
        let code = ResponseError::SecurityDisabled.code();
        return respond(header, &all(code, SECURITY_DISABLED_MESSAGE));
    }
    let filters: Vec<AclBindingFilter> = req
        .filters
        .iter()
        .map(|f| {
            filter_of(
                f.resource_type_filter,
                f.resource_name_filter.as_ref().map(|s| s.to_string()),
                f.pattern_type_filter,
                f.principal_filter.as_ref().map(|s| s.to_string()),
                f.host_filter.as_ref().map(|s| s.to_string()),
                f.operation,
                f.permission_type,
            )
        })
        .collect();
    let n = filters.len();
    let outcomes = if n == 0 {
        Vec::new()
    } else {
        let request = ControllerRequest::DeleteAcls { filters };
        match forward(ctx, request, |reply| acls_reply(reply, n)).await {
            Ok(rs) => rs,
            Err(e) => vec![Err(e.item_error()); n],
        }
    };
    let results = outcomes
        .into_iter()
        .map(|r| match r {
            Ok(bindings) => DeleteAclsFilterResult::default().with_matching_acls(
                bindings
                    .into_iter()
                    .map(|b| {
                        DeleteAclsMatchingAcl::default()
                            .with_resource_type(b.resource_type.code())
                            .with_resource_name(str_bytes(b.resource_name))
                            .with_pattern_type(b.pattern_type.code())
                            .with_principal(str_bytes(b.principal))
                            .with_host(str_bytes(b.host))
                            .with_operation(b.operation.code())
                            .with_permission_type(b.permission.code())
                    })
                    .collect(),
            ),
            Err(e) => DeleteAclsFilterResult::default()
                .with_error_code(errors::controller(&e))
                .with_error_message(Some(str_bytes(e.to_string()))),
        })
        .collect();
    respond(
        header,
        &DeleteAclsResponse::default().with_filter_results(results),
    )
}

/// The per-binding (CreateAcls) or per-filter (DeleteAcls) results of a
/// reply, if it has one for each of the `n` sent.
fn acls_reply(
    reply: ControllerReply,
    n: usize,
) -> Option<Vec<Result<Vec<AclBinding>, ControllerError>>> {
    match reply {
        ControllerReply::Acls(rs) if rs.len() == n => Some(rs),
        _ => None,
    }
}
