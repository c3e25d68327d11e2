//! Request handlers, one file per Kafka API (as Redpanda's
//! `kafka/server/handlers/`), and [`dispatch`], which routes a parsed request
//! to its handler.
//!
//! `dispatch` is a plain function returning a future: whatever a handler
//! must do in arrival order (assigning produce offsets) it does before
//! returning, so pipelined requests on a connection take effect in order even
//! though their remaining work runs concurrently.
//!
//! Every handler answers what Kafka answers; the mapping from fjord's domain
//! errors to Kafka error codes lives in [`errors`] and nowhere else.

pub mod acls;
pub mod api_versions;
pub mod authz;
pub mod cluster;
pub mod configs;
pub mod delete_records;
pub mod describe_topic_partitions;
pub mod elect_leaders;
pub mod error_counts;
pub mod errors;
pub mod fetch;
pub mod forward;
pub mod group;
pub mod init_producer_id;
pub mod list_offsets;
pub mod metadata;
pub mod offset_for_leader_epoch;
pub mod produce;
pub mod reassignments;
pub mod sasl;
pub mod scram_credentials;
pub mod topics;
pub mod txn;
pub mod txn_admin;

use crate::auth::Session;
use crate::metadata::MetadataImage;
use crate::partition::Partition;
use crate::protocol::header::write_response_header;
use crate::protocol::{supported, RequestHeader};
use crate::record::RecordsChunk;
use crate::shard::ShardCtx;
use crate::types::TopicPartition;
use bytes::BytesMut;
use error_counts::ResponseErrors;
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use kafka_protocol::messages::ApiKey;
use kafka_protocol::protocol::{Decodable, Encodable};
use kafka_protocol::ResponseError;
use std::rc::Rc;

/// An error code and its message, for responses that carry both.
pub type ErrorAnswer = (i16, String);

/// What the connection does after a request.
pub enum Outcome {
    /// Send these bytes (length prefix and response header included).
    Reply(Vec<RecordsChunk>),
    /// Send nothing (acks=0 produce).
    NoReply,
    /// Close the connection after the responses before this one.
    Close,
}

/// A dispatched request.
pub enum Dispatched {
    /// Everything that had to happen in arrival order has happened; the
    /// future answers.
    Ready(LocalBoxFuture<'static, Outcome>),
    /// The connection must await this first stage before reading the next
    /// request (it ends with what must happen in order, e.g. an append after
    /// a coordinator round trip); it yields the future that answers.
    Ordered(LocalBoxFuture<'static, LocalBoxFuture<'static, Outcome>>),
}

impl Dispatched {
    /// Runs the ordered first stage, if any, and yields the future that
    /// answers.
    pub async fn into_answer(self) -> LocalBoxFuture<'static, Outcome> {
        match self {
            Dispatched::Ready(answer) => answer,
            Dispatched::Ordered(first_stage) => first_stage.await,
        }
    }
}

/// Routes one request to its handler. `buffer_bytes`: the size of the
/// receive-buffer allocation `body` was cut from (what a zero-copy slice of
/// it keeps alive; Produce uses it, see `log::cache`). `session`: the
/// connection's identity (`crate::auth`), the same for all its requests;
/// its listener decides which endpoints are advertised, and every handler
/// asks [`authz::Authz`] what its principal may do. (SASL requests on a
/// SASL listener never come here: the connection answers them through
/// [`sasl::handle`] in order.)
pub fn dispatch(
    ctx: &Rc<ShardCtx>,
    session: &Rc<Session>,
    header: RequestHeader,
    body: BytesMut,
    buffer_bytes: usize,
) -> Dispatched {
    match header.api_key {
        k if k == ApiKey::Produce as i16 && supported(k, header.api_version) => {
            let authz = authz::Authz::new(ctx, session, header.api_key);
            produce::handle(ctx, session.listener, &authz, header, body, buffer_bytes)
        }
        _ => Dispatched::Ready(dispatch_other(ctx, session, header, body)),
    }
}

/// Routes every request but Produce.
fn dispatch_other(
    ctx: &Rc<ShardCtx>,
    session: &Rc<Session>,
    header: RequestHeader,
    mut body: BytesMut,
) -> LocalBoxFuture<'static, Outcome> {
    let ctx = ctx.clone();
    let session = session.clone();
    let listener = session.listener;
    let Ok(key) = ApiKey::try_from(header.api_key) else {
        return async { Outcome::Close }.boxed_local();
    };
    if key == ApiKey::ApiVersions {
        return async move { api_versions::handle(&ctx, &header, &mut body) }.boxed_local();
    }
    if !supported(header.api_key, header.api_version) {
        // Kafka closes the connection for an unsupported version of any
        // api other than ApiVersions (Produce v0-2 too, although
        // ApiVersions advertises them: see PRODUCE_ADVERTISED_MIN_VERSION).
        tracing::debug!(
            api_key = header.api_key,
            version = header.api_version,
            "unsupported request version; closing"
        );
        return async { Outcome::Close }.boxed_local();
    }
    let authz = authz::Authz::new(&ctx, &session, header.api_key);
    match key {
        ApiKey::Fetch => {
            async move { fetch::handle(&ctx, listener, &authz, &header, &mut body).await }
                .boxed_local()
        }
        ApiKey::Metadata => {
            async move { metadata::handle(&ctx, listener, &authz, &header, &mut body).await }
                .boxed_local()
        }
        ApiKey::SaslHandshake | ApiKey::SaslAuthenticate => {
            async move { sasl::handle(&ctx, &session, &header, &mut body).await.0 }.boxed_local()
        }
        ApiKey::DescribeUserScramCredentials => {
            async move { scram_credentials::describe(&ctx, &session, &authz, &header, &mut body) }
                .boxed_local()
        }
        ApiKey::DescribeClientQuotas => {
            async move { scram_credentials::describe_client_quotas(&authz, &header, &mut body) }
                .boxed_local()
        }
        ApiKey::AlterUserScramCredentials => async move {
            scram_credentials::alter(&ctx, &session, &authz, &header, &mut body).await
        }
        .boxed_local(),
        ApiKey::ListOffsets => {
            async move { list_offsets::handle(&ctx, &authz, &header, &mut body).await }
                .boxed_local()
        }
        ApiKey::OffsetForLeaderEpoch => {
            async move { offset_for_leader_epoch::handle(&ctx, &authz, &header, &mut body) }
                .boxed_local()
        }
        ApiKey::CreateTopics => {
            async move { topics::create_topics(&ctx, &authz, &header, &mut body).await }
                .boxed_local()
        }
        ApiKey::DeleteTopics => {
            async move { topics::delete_topics(&ctx, &authz, &header, &mut body).await }
                .boxed_local()
        }
        ApiKey::CreatePartitions => {
            async move { topics::create_partitions(&ctx, &authz, &header, &mut body).await }
                .boxed_local()
        }
        ApiKey::ElectLeaders => {
            async move { elect_leaders::handle(&ctx, &authz, &header, &mut body).await }
                .boxed_local()
        }
        ApiKey::AlterPartitionReassignments => {
            async move { reassignments::alter(&ctx, &authz, &header, &mut body).await }
                .boxed_local()
        }
        ApiKey::ListPartitionReassignments => {
            async move { reassignments::list(&ctx, &authz, &header, &mut body) }.boxed_local()
        }
        ApiKey::DescribeTopicPartitions => async move {
            describe_topic_partitions::handle(&ctx, listener, &authz, &header, &mut body)
        }
        .boxed_local(),
        ApiKey::DescribeConfigs => {
            async move { configs::describe(&ctx, &authz, &header, &mut body) }.boxed_local()
        }
        ApiKey::AlterConfigs => {
            async move { configs::alter(&ctx, &authz, &header, &mut body).await }.boxed_local()
        }
        ApiKey::IncrementalAlterConfigs => {
            async move { configs::incremental_alter(&ctx, &authz, &header, &mut body).await }
                .boxed_local()
        }
        ApiKey::InitProducerId => {
            async move { init_producer_id::handle(&ctx, &authz, &header, &mut body).await }
                .boxed_local()
        }
        ApiKey::AddPartitionsToTxn => {
            async move { txn::add_partitions(&ctx, &authz, &header, &mut body).await }.boxed_local()
        }
        ApiKey::AddOffsetsToTxn => {
            async move { txn::add_offsets(&ctx, &authz, &header, &mut body).await }.boxed_local()
        }
        ApiKey::EndTxn => {
            async move { txn::end_txn(&ctx, &authz, &header, &mut body).await }.boxed_local()
        }
        ApiKey::WriteTxnMarkers => {
            async move { txn_admin::write_txn_markers(&ctx, &authz, &header, &mut body).await }
                .boxed_local()
        }
        ApiKey::DescribeTransactions => {
            async move { txn_admin::describe_transactions(&ctx, &authz, &header, &mut body) }
                .boxed_local()
        }
        ApiKey::ListTransactions => {
            async move { txn_admin::list_transactions(&ctx, &authz, &header, &mut body) }
                .boxed_local()
        }
        ApiKey::DescribeProducers => {
            async move { txn_admin::describe_producers(&ctx, &authz, &header, &mut body) }
                .boxed_local()
        }
        ApiKey::DeleteRecords => {
            async move { delete_records::handle(&ctx, &authz, &header, &mut body).await }
                .boxed_local()
        }
        ApiKey::DescribeCluster => {
            async move { cluster::describe_cluster(&ctx, listener, &authz, &header, &mut body) }
                .boxed_local()
        }
        ApiKey::UnregisterBroker => {
            async move { cluster::unregister_broker(&ctx, &authz, &header, &mut body).await }
                .boxed_local()
        }
        ApiKey::DescribeLogDirs => {
            async move { cluster::describe_log_dirs(&ctx, &authz, &header, &mut body) }
                .boxed_local()
        }
        ApiKey::FindCoordinator => async move {
            group::find_coordinator::handle(&ctx, listener, &authz, &header, &mut body).await
        }
        .boxed_local(),
        ApiKey::JoinGroup => {
            async move { group::membership::join_group(&ctx, &authz, &header, &mut body).await }
                .boxed_local()
        }
        ApiKey::SyncGroup => {
            async move { group::membership::sync_group(&ctx, &authz, &header, &mut body).await }
                .boxed_local()
        }
        ApiKey::Heartbeat => {
            async move { group::membership::heartbeat(&ctx, &authz, &header, &mut body) }
                .boxed_local()
        }
        ApiKey::LeaveGroup => {
            async move { group::membership::leave_group(&ctx, &authz, &header, &mut body).await }
                .boxed_local()
        }
        ApiKey::OffsetCommit => {
            async move { group::offsets::offset_commit(&ctx, &authz, &header, &mut body).await }
                .boxed_local()
        }
        ApiKey::OffsetFetch => {
            async move { group::offsets::offset_fetch(&ctx, &authz, &header, &mut body) }
                .boxed_local()
        }
        ApiKey::OffsetDelete => {
            async move { group::offsets::offset_delete(&ctx, &authz, &header, &mut body).await }
                .boxed_local()
        }
        ApiKey::TxnOffsetCommit => {
            async move { group::offsets::txn_offset_commit(&ctx, &authz, &header, &mut body).await }
                .boxed_local()
        }
        ApiKey::ListGroups => {
            async move { group::admin::list_groups(&ctx, &authz, &header, &mut body) }.boxed_local()
        }
        ApiKey::DescribeGroups => {
            async move { group::admin::describe_groups(&ctx, &authz, &header, &mut body) }
                .boxed_local()
        }
        ApiKey::ConsumerGroupHeartbeat => {
            async move { group::consumer::heartbeat(&ctx, &authz, &header, &mut body).await }
                .boxed_local()
        }
        ApiKey::ConsumerGroupDescribe => {
            async move { group::consumer::describe(&ctx, &authz, &header, &mut body) }.boxed_local()
        }
        ApiKey::DeleteGroups => {
            async move { group::admin::delete_groups(&ctx, &authz, &header, &mut body).await }
                .boxed_local()
        }
        ApiKey::CreateAcls => {
            async move { acls::create_acls(&ctx, &authz, &header, &mut body).await }.boxed_local()
        }
        ApiKey::DescribeAcls => {
            async move { acls::describe_acls(&ctx, &authz, &header, &mut body) }.boxed_local()
        }
        ApiKey::DeleteAcls => {
            async move { acls::delete_acls(&ctx, &authz, &header, &mut body).await }.boxed_local()
        }
        _ => async { Outcome::Close }.boxed_local(),
    }
}

/// Decodes a control-plane request body; a body that does not decode closes
/// the connection, as Kafka does for an unparsable request.
pub fn decode<T: Decodable>(header: &RequestHeader, body: &mut BytesMut) -> Option<T> {
    match T::decode(body, header.api_version) {
        Ok(req) => Some(req),
        Err(e) => {
            tracing::debug!(
                api_key = header.api_key,
                version = header.api_version,
                error = %e,
                "malformed request body; closing"
            );
            None
        }
    }
}

/// Frames `response` for the client: length, response header, body; and
/// counts its error codes (`error_counts`).
pub fn respond<T: Encodable + ResponseErrors>(header: &RequestHeader, response: &T) -> Outcome {
    crate::metrics::record_errors(header.api_key, |counts| {
        response.error_codes(header.api_version, &mut |code| counts.count(code))
    });
    let mut out = BytesMut::with_capacity(256);
    out.extend_from_slice(&[0; 4]);
    write_response_header(
        &mut out,
        header.api_key,
        header.api_version,
        header.correlation_id,
    );
    if let Err(e) = response.encode(&mut out, header.api_version) {
        // A response we cannot encode is a bug in fjord, not in the client;
        // closing is the only answer the client will understand.
        tracing::error!(api_key = header.api_key, version = header.api_version, error = %e, "response encoding failed");
        return Outcome::Close;
    }
    let len = (out.len() - 4) as i32;
    out[..4].copy_from_slice(&len.to_be_bytes());
    Outcome::Reply(vec![RecordsChunk::Memory(out.freeze())])
}

/// Which shard of this node leads `topic`-`index`, for a client's
/// produce or fetch: `Err(UNKNOWN_TOPIC_OR_PARTITION)` when the image has
/// no such partition; `Err(NOT_LEADER_OR_FOLLOWER)` when another node
/// holds it (`docs/replication.md` §3.2) or, replicated, this node's
/// replica does not lead it (§4.3: clients produce to and fetch from the
/// leader only).
pub fn leading_shard(
    ctx: &ShardCtx,
    image: &MetadataImage,
    topic: &str,
    index: i32,
) -> Result<usize, ResponseError> {
    use crate::metadata::Placement;
    match image.placement(topic, index, ctx.config.node_id, ctx.cores()) {
        Placement::Unknown => Err(ResponseError::UnknownTopicOrPartition),
        Placement::Elsewhere => Err(ResponseError::NotLeaderOrFollower),
        Placement::Local(shard) => {
            let state = image.topic(topic).and_then(|t| t.replica_state(index));
            match state {
                Some(s) if s.leader != ctx.config.node_id_of(shard) => {
                    Err(ResponseError::NotLeaderOrFollower)
                }
                // Not before this start is registered, nor without the
                // node's lease (`ShardCtx::acts_in`).
                Some(_) if !ctx.acts_in(image) => Err(ResponseError::NotLeaderOrFollower),
                _ => Ok(shard),
            }
        }
    }
}

/// The partition `topic`-`index` if this shard leads it; else Kafka's answer
/// to a request for it ([`leading_shard`]'s), with the leading shard when
/// another shard of this node leads it (the client sends it there), and
/// without one when this shard leads it but has not opened it yet.
pub fn led_partition(
    ctx: &ShardCtx,
    image: &MetadataImage,
    topic: &str,
    index: i32,
) -> Result<Rc<Partition>, (ResponseError, Option<usize>)> {
    match leading_shard(ctx, image, topic, index) {
        Err(e) => Err((e, None)),
        Ok(leader) if leader != ctx.shard => {
            Err((ResponseError::NotLeaderOrFollower, Some(leader)))
        }
        Ok(_) => ctx
            .partition(&TopicPartition::new(topic, index))
            .ok_or((ResponseError::NotLeaderOrFollower, None)),
    }
}

/// Shorthand for a kafka-protocol string.
pub fn str_bytes(s: impl Into<String>) -> kafka_protocol::protocol::StrBytes {
    kafka_protocol::protocol::StrBytes::from_string(s.into())
}
