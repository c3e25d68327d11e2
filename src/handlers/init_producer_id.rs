//! InitProducerId, for idempotent and transactional producers.
//!
//! A new producer gets a fresh id from this shard's producer-id block, with
//! epoch 0. A producer that sends its current id and epoch (KIP-360, after an
//! unresolved sequence) gets the same id with the epoch bumped, or a new id
//! when the epoch would overflow. Until this shard holds a block — right
//! after start-up — the answer is COORDINATOR_LOAD_IN_PROGRESS, which clients
//! retry, as with Kafka.
//!
//! With a transactional id the request goes to the transaction coordinator
//! (`txn::coordinator`): epoch bump, fencing of an open transaction. An
//! empty id, or one longer than the transaction log's key can hold
//! ([`TRANSACTIONAL_ID_BYTES_MAX`]), gets INVALID_REQUEST.
//!
//! Authorization comes first (Kafka's `handleInitProducerIdRequest`):
//! WRITE on the transactional id, else TRANSACTIONAL_ID_AUTHORIZATION_FAILED;
//! without one, IDEMPOTENT_WRITE on the cluster or WRITE on some topic
//! (KIP-679), else CLUSTER_AUTHORIZATION_FAILED.

use super::{decode, errors, respond, Outcome};
use crate::auth::acl::{AclOperation, ResourceType};
use crate::handlers::authz::Authz;
use crate::protocol::RequestHeader;
use crate::shard::ShardCtx;
use crate::txn::log::TRANSACTIONAL_ID_BYTES_MAX;
use bytes::BytesMut;
use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};
use kafka_protocol::ResponseError;
use std::rc::Rc;

pub async fn handle(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<InitProducerIdRequest>(header, body) else {
        return Outcome::Close;
    };
    let resp = InitProducerIdResponse::default()
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    // Kafka: WRITE on the transactional id; without one (idempotence),
    // IDEMPOTENT_WRITE on the cluster or WRITE on any topic (KIP-679).
    let refused = match &req.transactional_id {
        Some(id) => (!authz.transactional_id(AclOperation::Write, id.0.as_str()))
            .then_some(ResponseError::TransactionalIdAuthorizationFailed),
        None => (!authz.cluster_quiet(AclOperation::IdempotentWrite)
            && !authz.any_of_type(AclOperation::Write, ResourceType::Topic))
        .then_some(ResponseError::ClusterAuthorizationFailed),
    };
    if let Some(e) = refused {
        return respond(header, &resp.with_error_code(e.code()));
    }
    if let Some(id) = &req.transactional_id {
        // Empty ids are Kafka's INVALID_REQUEST; ids too long for the
        // transaction log's key (an i16 length) are refused the same way,
        // before anything is written.
        if id.0.is_empty() || id.0.len() > TRANSACTIONAL_ID_BYTES_MAX {
            return respond(
                header,
                &resp.with_error_code(ResponseError::InvalidRequest.code()),
            );
        }
        let expected = (header.api_version >= 3 && req.producer_id.0 >= 0)
            .then_some((req.producer_id.0, req.producer_epoch));
        let result = ctx
            .txn
            .init_producer_id(ctx, id.0.as_str(), req.transaction_timeout_ms, expected)
            .await;
        let resp = match result {
            Ok((pid, epoch)) => resp
                .with_producer_id(ProducerId(pid))
                .with_producer_epoch(epoch),
            Err(e) => resp.with_error_code(errors::txn(e, header.api_version >= 3)),
        };
        return respond(header, &resp);
    }
    let (pid, epoch) = (req.producer_id.0, req.producer_epoch);
    let resp = if pid >= 0 && (0..i16::MAX - 1).contains(&epoch) {
        resp.with_producer_id(ProducerId(pid))
            .with_producer_epoch(epoch + 1)
    } else {
        ctx.maybe_request_producer_ids();
        match ctx.producer_ids.take() {
            Some(id) => resp.with_producer_id(ProducerId(id)).with_producer_epoch(0),
            None => resp.with_error_code(ResponseError::CoordinatorLoadInProgress.code()),
        }
    };
    ctx.maybe_request_producer_ids();
    respond(header, &resp)
}
