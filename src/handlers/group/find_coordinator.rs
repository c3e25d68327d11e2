//! FindCoordinator v0-6: the node that coordinates a group (key type 0,
//! on `__consumer_offsets`) or a transactional id (key type 1, on
//! `__transaction_state`): the shard leading partition
//! `abs(javaHash(key)) % 50` of that topic, created on first use (with
//! several nodes, a shard of the node holding the topic, as Metadata names
//! it). v4+ answers a batch of keys.

use crate::auth::acl::AclOperation;
use crate::handlers::authz::Authz;
use crate::handlers::errors;
use crate::handlers::metadata::{brokers, partition_view};
use crate::handlers::{decode, respond, str_bytes, Outcome};
use crate::metadata::internal;
use crate::protocol::RequestHeader;
use crate::shard::ShardCtx;
use bytes::BytesMut;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};
use kafka_protocol::ResponseError;
use std::rc::Rc;

/// Key types of FindCoordinator.
pub const KEY_TYPE_GROUP: i8 = 0;
pub const KEY_TYPE_TRANSACTION: i8 = 1;

/// `listener`: the connection's listener, whose endpoint is answered.
pub async fn handle(
    ctx: &Rc<ShardCtx>,
    listener: usize,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<FindCoordinatorRequest>(header, body) else {
        return Outcome::Close;
    };
    let batched = header.api_version >= 4;
    let keys: Vec<String> = if batched {
        req.coordinator_keys.iter().map(|k| k.to_string()).collect()
    } else {
        vec![req.key.to_string()]
    };
    let topic = match req.key_type {
        KEY_TYPE_GROUP => Some(internal::CONSUMER_OFFSETS),
        KEY_TYPE_TRANSACTION => Some(internal::TRANSACTION_STATE),
        _ => None,
    };
    let meta = match topic {
        Some(t) => ctx
            .ensure_internal_topic(t)
            .await
            .map_err(|_| ResponseError::CoordinatorNotAvailable.code()),
        None => Err(ResponseError::InvalidRequest.code()),
    };
    let image = ctx.image();
    let coordinators: Vec<Coordinator> = keys
        .iter()
        .map(|key| {
            let base = Coordinator::default()
                .with_key(str_bytes(key.clone()))
                .with_node_id(BrokerId(-1))
                .with_host(str_bytes(""))
                .with_port(-1);
            // Kafka: DESCRIBE on the group or transactional id.
            let refused = match req.key_type {
                KEY_TYPE_GROUP if !authz.group(AclOperation::Describe, key) => {
                    Some(ResponseError::GroupAuthorizationFailed)
                }
                KEY_TYPE_TRANSACTION if !authz.transactional_id(AclOperation::Describe, key) => {
                    Some(ResponseError::TransactionalIdAuthorizationFailed)
                }
                _ => None,
            };
            if let Some(e) = refused {
                return base
                    .with_error_code(e.code())
                    .with_error_message(Some(str_bytes(e.to_string())));
            }
            let meta = match &meta {
                Ok(m) => m,
                Err(code) => return base.with_error_code(*code),
            };
            if key.is_empty() {
                return base.with_error_code(ResponseError::InvalidRequest.code());
            }
            let Some(coordinator) = meta.coordinator(key, ctx.cores()) else {
                return base.with_error_code(ResponseError::CoordinatorNotAvailable.code());
            };
            // The broker leading that partition: a shard of this node, or
            // (several nodes) of the node holding the topic; none while
            // that node is fenced or unregistered.
            let view = partition_view(ctx, &image, listener, meta, coordinator.partition);
            let endpoint = (view.leader >= 0)
                .then(|| {
                    brokers(ctx, &image, listener)
                        .into_iter()
                        .find(|(b, _, _)| *b == view.leader)
                })
                .flatten();
            let Some((id, host, port)) = endpoint else {
                return base.with_error_code(ResponseError::CoordinatorNotAvailable.code());
            };
            base.with_error_code(errors::NONE)
                .with_node_id(BrokerId(id))
                .with_host(str_bytes(host))
                .with_port(port)
        })
        .collect();
    let resp = if batched {
        FindCoordinatorResponse::default().with_coordinators(coordinators)
    } else {
        let c = coordinators.into_iter().next().unwrap_or_default();
        let message = match c.error_message {
            Some(m) => Some(m),
            None => (c.error_code != 0).then(|| str_bytes("coordinator not available")),
        };
        FindCoordinatorResponse::default()
            .with_error_code(c.error_code)
            .with_error_message(message)
            .with_node_id(c.node_id)
            .with_host(c.host)
            .with_port(c.port)
    };
    respond(header, &resp)
}
