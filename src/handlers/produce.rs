//! Produce, with Kafka's checks in Kafka's order (KAFKA_BEHAVIOUR.md §2).
//!
//! Per partition, writing nothing when a check fails:
//! 1. the topic and partition exist (UNKNOWN_TOPIC_OR_PARTITION; on v13,
//!    which names topics by id, an id no topic has is UNKNOWN_TOPIC_ID, as
//!    Kafka's `handleProduceRequest` answers, and the response names each
//!    topic by the id the request gave);
//! 2. exactly one v2 batch (`ProduceRequest.validateRecords`: INVALID_RECORD,
//!    CORRUPT_MESSAGE — see `record::error` for the table);
//! 3. acks is -1, 0 or 1, else every partition still standing gets
//!    INVALID_REQUIRED_ACKS; then the topic is not internal
//!    (`__consumer_offsets`, `__transaction_state`), else
//!    INVALID_TOPIC_EXCEPTION, as Kafka's `appendToLocalLog` answers clients;
//! 4. this shard leads the partition, else NOT_LEADER_OR_FOLLOWER with the
//!    current leader (v10+), so the client goes straight to the owner — no
//!    cross-core hop on this path;
//! 5. baseOffset 0, size within `max.message.bytes`, CRC
//!    (`protocol::produce::validate_for_append`); on a topic whose
//!    `cleanup.policy` has `compact`, every record has a key, else
//!    INVALID_RECORD with one record error per keyless record, as Kafka's
//!    `LogValidator.validateKey` (checked against stock Kafka 4.4:
//!    "Compacted topic cannot accept message without key in topic
//!    partition t-0", no final period);
//! 6. the producer-state check (duplicates answered with the original's
//!    offsets, INVALID_PRODUCER_EPOCH, OUT_OF_ORDER_SEQUENCE_NUMBER),
//!    recompression when the topic's `compression.type` names another
//!    codec, broker timestamps for LogAppendTime topics, then the append,
//!    which assigns offsets in place: one synchronous step,
//!    `partition::Partition::append_data`. The batch is a slice of the connection's
//!    receive buffer; the append is told that buffer's size, and the tail
//!    cache copies a batch that is a small part of it rather than keep the
//!    whole buffer alive (`log::cache`).
//!
//! Transactions: a transactional batch needs the request's transactional id.
//! On Produce v12+ (transaction version 2) the first batch of a transaction
//! on a partition first adds the partition to the transaction at the
//! coordinator (possibly another shard); the connection waits for that
//! round trip before reading its next request, so appends stay in order.
//! On older versions a version-1 client adds its partitions itself with
//! AddPartitionsToTxn, and the leader verifies with the coordinator that it
//! did (KIP-890 part 1) before the first batch; a batch for a partition that
//! is not in the transaction gets INVALID_TXN_STATE and is not written.
//!
//! Steps 1–6 run synchronously when the request is dispatched, so pipelined
//! produce requests on one connection append in arrival order. The returned
//! future only waits: acks=1 and acks=-1 for the write to reach the file
//! (acks=-1 under `--fsync-acks` for the group-commit fdatasync — with one
//! replica the high watermark is exactly that point), bounded by the
//! request's `timeout_ms`. acks=0 gets no response; if any partition failed,
//! the connection is closed instead, as Kafka does.
//!
//! min.insync.replicas: the effective value is min(config, replicas) = 1, so
//! acks=all is always accepted on a single node, as stock Kafka accepts it for
//! a 1-replica topic with min.insync.replicas=2.

use super::{errors, respond, Dispatched, Outcome};
use crate::auth::acl::AclOperation;
use crate::handlers::authz::Authz;
use crate::log::{AppendInfo, PartitionLog};
use crate::metadata::internal::{coordinator_partition, is_internal, TRANSACTION_STATE};
use crate::metadata::{LeaderAt, MetadataImage};
use crate::metrics;
use crate::partition::{AppendError, DataAppend};
use crate::protocol::produce::{
    decode_produce_request, single_batch_for_version, validate_for_append,
    PRODUCE_FIRST_TOPIC_ID_VERSION,
};
use crate::protocol::RequestHeader;
use crate::record::records::keyless_records;
use crate::record::RecordsError;
use crate::replication::client::ClientError;
use crate::replication::leader::AcksAll;
use crate::replication::peers::PeerError;
use crate::shard::messages::ShardMessage;
use crate::shard::ShardCtx;
use crate::txn::coordinator::TxnError;
use crate::types::{Offset, TopicPartition};
use bytes::BytesMut;
use futures::future::{self, Either, LocalBoxFuture};
use futures::FutureExt;
use kafka_protocol::messages::add_partitions_to_txn_request::{
    AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction,
};
use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, LeaderIdAndEpoch, NodeEndpoint, PartitionProduceResponse,
    TopicProduceResponse,
};
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, ApiKey, ProducerId, TopicName,
    TransactionalId,
};
use kafka_protocol::messages::{BrokerId, ProduceResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;
use uuid::Uuid;

/// First Produce version with `current_leader` / `node_endpoints`.
const FIRST_LEADER_HINT_VERSION: i16 = 10;

struct PartitionResult {
    index: i32,
    error: i16,
    message: Option<String>,
    /// Leader hint for NOT_LEADER_OR_FOLLOWER.
    leader: Option<i32>,
    appended: Option<AppendInfo>,
    log_append_time_ms: i64,
    /// The log to wait on for acks.
    log: Option<Rc<PartitionLog>>,
    /// A replicated partition's acks=all append, with the leader epoch it
    /// was appended in: answered once the HW passes it while this shard
    /// still leads the partition in that epoch (`docs/replication.md`
    /// §4.1; `Leading::acks_all_in`).
    replicated: Option<(TopicPartition, i32)>,
    /// Kafka's per-record errors (Produce v8+): (index in the batch, message).
    record_errors: Vec<(i32, String)>,
    /// The log start offset a refused append still reports (Kafka's
    /// `RecordValidationException` answer); -1 otherwise.
    refused_log_start: i64,
}

impl PartitionResult {
    fn error(index: i32, code: i16, message: Option<String>) -> Self {
        PartitionResult {
            index,
            error: code,
            message,
            leader: None,
            appended: None,
            log_append_time_ms: -1,
            log: None,
            replicated: None,
            record_errors: Vec::new(),
            refused_log_start: -1,
        }
    }
}

/// Kafka's `LogValidator` answer to records without a key on a compacted
/// topic: INVALID_RECORD with one record error per keyless record (its
/// index in the batch) and `processRecordErrors`' summary message, which
/// names at most the first three.
fn keyless_refusal(
    index: i32,
    tp: &TopicPartition,
    keyless: &[i32],
    log_start: i64,
) -> PartitionResult {
    let record_errors: Vec<(i32, String)> = keyless
        .iter()
        .map(|&i| {
            (
                i,
                format!(
                    "Compacted topic cannot accept message without key in topic partition {tp}"
                ),
            )
        })
        .collect();
    let shown: Vec<String> = record_errors
        .iter()
        .take(3)
        .map(|(i, m)| format!("RecordError(batchIndex={i}, message='{m}')"))
        .collect();
    let message = format!(
        "One or more records have been rejected due to {} record errors in total, and only showing the first three errors at most: [{}]",
        record_errors.len(),
        shown.join(", ")
    );
    PartitionResult {
        record_errors,
        refused_log_start: log_start,
        ..PartitionResult::error(index, ResponseError::InvalidRecord.code(), Some(message))
    }
}

/// Validates and appends now; returns the future that waits and answers.
// The ordered first stage yields the answering future by design.
#[allow(clippy::async_yields_async)]
pub fn handle(
    ctx: &Rc<ShardCtx>,
    listener: usize,
    authz: &Authz,
    header: RequestHeader,
    body: BytesMut,
    buffer_bytes: usize,
) -> Dispatched {
    let version = header.api_version;
    let mut req = match decode_produce_request(body, version) {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(error = %e, "malformed produce request; closing");
            return Dispatched::Ready(future::ready(Outcome::Close).boxed_local());
        }
    };
    if version >= PRODUCE_FIRST_TOPIC_ID_VERSION {
        // v13 names topics by id: resolve each once; an unknown id keeps
        // the empty name, which no topic has (step 1 answers it).
        let image = ctx.image();
        for t in &mut req.topics {
            if let Some(meta) = image.topic_by_id(&t.topic_id) {
                t.name.clone_from(&meta.name);
            }
        }
    }
    let denied =
        unauthorized_partitions(authz, &mut req, version >= PRODUCE_FIRST_TOPIC_ID_VERSION);
    // Large batches that the topic recompresses are recompressed on the
    // shard's blocking thread first (a 1 MiB gzip batch is milliseconds of
    // CPU that would stall every other request of the shard); the
    // connection waits for them before reading on, so appends stay in order.
    let heavy = heavy_recompressions(ctx, &req);
    if !heavy.is_empty() {
        let ctx = ctx.clone();
        return Dispatched::Ordered(
            async move {
                let limit = ctx.config.batch_decompressed_bytes_max;
                let mut done = HashMap::with_capacity(heavy.len());
                for (key, codec, records) in heavy {
                    let result = glommio::executor()
                        .spawn_blocking(move || {
                            crate::record::recompress_bounded(&records, codec, limit)
                        })
                        .await;
                    done.insert(key, result);
                }
                dispatch_staged(&ctx, listener, header, req, buffer_bytes, done, denied)
                    .into_answer()
                    .await
            }
            .boxed_local(),
        );
    }
    dispatch_staged(
        ctx,
        listener,
        header,
        req,
        buffer_bytes,
        HashMap::new(),
        denied,
    )
}

/// Kafka's Produce checks (topics named by id resolved first): WRITE on the transactional id, if any (else
/// every partition answers TRANSACTIONAL_ID_AUTHORIZATION_FAILED), and
/// WRITE on each topic (else its partitions answer
/// TOPIC_AUTHORIZATION_FAILED), before anything else is looked at. The
/// records of refused partitions are dropped here, so nothing later
/// recompresses, adds to a transaction or appends them.
fn unauthorized_partitions(
    authz: &Authz,
    req: &mut crate::protocol::produce::ProduceRequest,
    by_id: bool,
) -> Denied {
    let mut denied = Denied::new();
    if !authz.enabled() {
        return denied;
    }
    let txn_ok = req
        .transactional_id
        .as_deref()
        .is_none_or(|id| authz.transactional_id(AclOperation::Write, id));
    for t in &mut req.topics {
        // A topic id no topic has (v13+) stays UNKNOWN_TOPIC_ID, as in
        // Kafka, which resolves ids before it authorizes names.
        if by_id && t.name.is_empty() {
            continue;
        }
        let code = if !txn_ok {
            ResponseError::TransactionalIdAuthorizationFailed.code()
        } else if !authz.topic(AclOperation::Write, &t.name) {
            ResponseError::TopicAuthorizationFailed.code()
        } else {
            continue;
        };
        for p in &mut t.partitions {
            p.records = None;
            denied.insert((t.name.clone(), p.index), code);
        }
    }
    denied
}

/// Partitions refused by authorization, with their error code.
type Denied = HashMap<(String, i32), i16>;

/// Batches at least this large that the topic recompresses are recompressed
/// off the reactor (`handle`).
pub const RECOMPRESS_OFF_REACTOR_MIN_BYTES: usize = 64 * 1024;

/// Recompressions already made, by (topic, partition).
type Recompressed = HashMap<(String, i32), Result<BytesMut, RecordsError>>;

/// The batches of `req` on partitions this shard leads whose topic names a
/// codec other than the batch's, of `RECOMPRESS_OFF_REACTOR_MIN_BYTES` or
/// more: (topic and partition, target codec, a copy of the records).
fn heavy_recompressions(
    ctx: &ShardCtx,
    req: &crate::protocol::produce::ProduceRequest,
) -> Vec<((String, i32), crate::record::Compression, bytes::Bytes)> {
    let mut out = Vec::new();
    // A partition named twice in one request is recompressed where it is
    // appended: the results are kept by partition.
    let mut named: HashMap<(&str, i32), usize> = HashMap::new();
    for t in &req.topics {
        for p in &t.partitions {
            *named.entry((t.name.as_str(), p.index)).or_default() += 1;
        }
    }
    for t in &req.topics {
        for p in &t.partitions {
            let Some(records) = p.records.as_ref() else {
                continue;
            };
            if records.len() < RECOMPRESS_OFF_REACTOR_MIN_BYTES
                || named.get(&(t.name.as_str(), p.index)) != Some(&1)
            {
                continue;
            }
            let Ok(h) = crate::record::BatchHeader::parse(records) else {
                continue;
            };
            let tp = TopicPartition::new(t.name.clone(), p.index);
            let Some(state) = ctx.partition(&tp) else {
                continue;
            };
            let compression = state.config().compression;
            match compression {
                Some(codec) if h.compression_id() != codec as i16 && !h.is_control() => {
                    let batch = &records[..h.total_size().min(records.len())];
                    out.push((
                        (t.name.clone(), p.index),
                        codec,
                        bytes::Bytes::copy_from_slice(batch),
                    ));
                }
                _ => {}
            }
        }
    }
    out
}

/// `handle` once large recompressions are done: at the shard's limit of
/// staged, unwritten bytes the request waits for the writers before it is
/// appended, and the connection is not read meanwhile, so producers faster
/// than the disk are slowed, whatever their acks, instead of staged until
/// memory runs out.
#[allow(clippy::async_yields_async)]
fn dispatch_staged(
    ctx: &Rc<ShardCtx>,
    listener: usize,
    header: RequestHeader,
    req: crate::protocol::produce::ProduceRequest,
    buffer_bytes: usize,
    recompressed: Recompressed,
    denied: Denied,
) -> Dispatched {
    let staged_max = ctx.config.staged_bytes_max as u64;
    if ctx.logs.unwritten_bytes() >= staged_max {
        let ctx = ctx.clone();
        return Dispatched::Ordered(
            async move {
                ctx.logs.wait_unwritten_below(staged_max).await;
                dispatch_decoded(
                    &ctx,
                    listener,
                    header,
                    req,
                    buffer_bytes,
                    recompressed,
                    denied,
                )
                .into_answer()
                .await
            }
            .boxed_local(),
        );
    }
    dispatch_decoded(
        ctx,
        listener,
        header,
        req,
        buffer_bytes,
        recompressed,
        denied,
    )
}

/// `handle` once the request is decoded and the shard has room to stage it.
#[allow(clippy::async_yields_async)]
fn dispatch_decoded(
    ctx: &Rc<ShardCtx>,
    listener: usize,
    header: RequestHeader,
    req: crate::protocol::produce::ProduceRequest,
    buffer_bytes: usize,
    recompressed: Recompressed,
    denied: Denied,
) -> Dispatched {
    let version = header.api_version;
    let to_add = partitions_to_add(ctx, &req);
    if to_add.is_empty() {
        return Dispatched::Ready(append_and_answer(
            ctx,
            listener,
            header,
            req,
            buffer_bytes,
            Refusals {
                denied,
                txn: HashMap::new(),
            },
            recompressed,
        ));
    }
    // The first transactional batch of a transaction on a partition goes
    // through the coordinator (maybe on another shard) before it is
    // appended: transaction version 2 (Produce v12+) adds the partition to
    // the transaction, older versions verify that the client added it
    // (KIP-890 part 1). The connection waits for this stage before reading
    // on, so appends still happen in request order.
    let ctx = ctx.clone();
    Dispatched::Ordered(
        async move {
            let mut refused = HashMap::new();
            if let Some(id) = req.transactional_id.clone() {
                let verify_only = version < PRODUCE_TV2_VERSION;
                let mut by_producer: HashMap<(i64, i16), Vec<TopicPartition>> = HashMap::new();
                for (tp, producer) in to_add {
                    by_producer.entry(producer).or_default().push(tp);
                }
                for ((pid, epoch), tps) in by_producer {
                    let outcome =
                        add_partitions_to_txn(&ctx, &id, pid, epoch, tps.clone(), verify_only)
                            .await;
                    if let Err(e) = outcome {
                        for tp in tps {
                            refused.insert((tp.topic, tp.partition.0), errors::txn_on_produce(e));
                        }
                    }
                }
            }
            append_and_answer(
                &ctx,
                listener,
                header,
                req,
                buffer_bytes,
                Refusals {
                    denied,
                    txn: refused,
                },
                recompressed,
            )
        }
        .boxed_local(),
    )
}

/// First Produce version of transaction version 2 (partitions are added to
/// the transaction by the partition leader).
pub const PRODUCE_TV2_VERSION: i16 = 12;

/// The partitions of a transactional request that this shard leads and
/// whose producer has no open transaction on them yet, with the producer.
fn partitions_to_add(
    ctx: &ShardCtx,
    req: &crate::protocol::produce::ProduceRequest,
) -> Vec<(TopicPartition, (i64, i16))> {
    if req.transactional_id.is_none() {
        return Vec::new();
    }
    let mut out = Vec::new();
    // An internal topic's partitions are refused below, never added.
    for t in req.topics.iter().filter(|t| !is_internal(&t.name)) {
        for p in &t.partitions {
            let Some(records) = &p.records else { continue };
            let Ok(h) = crate::record::BatchHeader::parse(records) else {
                continue;
            };
            if !h.is_transactional() || h.producer_id < 0 {
                continue;
            }
            let tp = TopicPartition::new(t.name.clone(), p.index);
            if let Some(state) = ctx.partition(&tp) {
                let producers = state.producers();
                // A new transaction on this partition: none open, or the open
                // one belongs to an older epoch (transaction version 2 bumps
                // the epoch at EndTxn; until its marker is written the
                // coordinator answers CONCURRENT_TRANSACTIONS and the client
                // retries, so the new batch never joins the old transaction).
                let new_txn = producers.open_transaction(h.producer_id).is_none()
                    || producers
                        .get(h.producer_id)
                        .is_some_and(|e| e.epoch < h.producer_epoch);
                if new_txn {
                    out.push((tp, (h.producer_id, h.producer_epoch)));
                }
            }
        }
    }
    out
}

/// Adds partitions to `id`'s transaction at its coordinator, local or not
/// (`verify_only`: checks that they are already part of it). The
/// coordinator is the leader of the id's `__transaction_state` partition:
/// a shard of this node (over the router), or another node's broker, asked
/// with AddPartitionsToTxn v4+ as Kafka's AddPartitionsToTxnManager does.
pub(crate) async fn add_partitions_to_txn(
    ctx: &Rc<ShardCtx>,
    id: &str,
    pid: i64,
    epoch: i16,
    tps: Vec<TopicPartition>,
    verify_only: bool,
) -> Result<(), TxnError> {
    let image = ctx.image();
    let Some(topic) = image.topic(TRANSACTION_STATE) else {
        return Err(TxnError::CoordinatorNotAvailable);
    };
    let partition = coordinator_partition(id, topic.partition_count());
    let shard = match image.leader_at(
        TRANSACTION_STATE,
        partition,
        ctx.config.node_id,
        ctx.cores(),
    ) {
        LeaderAt::Local(shard) => shard,
        LeaderAt::Remote(broker) => {
            return add_partitions_remotely(ctx, &image, broker, id, pid, epoch, tps, verify_only)
                .await;
        }
        LeaderAt::NoLeader | LeaderAt::Unknown => return Err(TxnError::CoordinatorNotAvailable),
    };
    // Bounded (see `router`): a coordinator that does not answer in time
    // is retriable coordinator trouble, NOT_ENOUGH_REPLICAS to the producer.
    let call = ctx.router.invoke(
        shard,
        ctx.router.deadline(),
        tps,
        |tps| async move {
            ctx.txn
                .add_or_verify(ctx, id, pid, epoch, &tps, verify_only)
                .await
        },
        |partitions, reply| ShardMessage::AddPartitionsToTxn {
            transactional_id: id.to_owned(),
            producer_id: pid,
            producer_epoch: epoch,
            partitions,
            verify_only,
            reply,
        },
    );
    match call.await {
        Ok(answer) => answer,
        Err(e) => {
            tracing::warn!(transactional_id = id, error = %e, "adding partitions to the transaction failed");
            Err(TxnError::CoordinatorNotAvailable)
        }
    }
}

/// First AddPartitionsToTxn version a broker sends (batched, `verifyOnly`).
pub const ADD_PARTITIONS_BROKER_VERSION_MIN: i16 = 4;
/// Newest AddPartitionsToTxn version a broker sends.
pub const ADD_PARTITIONS_BROKER_VERSION_MAX: i16 = 5;

/// [`add_partitions_to_txn`] at another node's coordinator (broker
/// `broker`): one AddPartitionsToTxn v4/v5 with this one transaction. A
/// top-level CLUSTER_AUTHORIZATION_FAILED is INVALID_TXN_STATE (Kafka keeps
/// it from the producer), no answer is retriable coordinator trouble, a
/// coordinator too old for v4 skips verification (Kafka's
/// AddPartitionsToTxnManager) but cannot add partitions.
#[allow(clippy::too_many_arguments)]
async fn add_partitions_remotely(
    ctx: &Rc<ShardCtx>,
    image: &MetadataImage,
    broker: i32,
    id: &str,
    pid: i64,
    epoch: i16,
    tps: Vec<TopicPartition>,
    verify_only: bool,
) -> Result<(), TxnError> {
    let deadline = ctx.router.deadline();
    let asked = async {
        let mut conn = ctx.peers.checkout(image, broker, deadline).await?;
        let version = conn.version(
            ApiKey::AddPartitionsToTxn,
            ADD_PARTITIONS_BROKER_VERSION_MIN,
            ADD_PARTITIONS_BROKER_VERSION_MAX,
        );
        let version = match version {
            Ok(v) => v,
            Err(e) => {
                conn.release();
                return Err(e);
            }
        };
        let req = add_partitions_request(id, pid, epoch, &tps, verify_only);
        let resp = conn.request(version, &req, deadline).await?;
        conn.release();
        Ok(resp)
    };
    match asked.await {
        Ok(resp) => add_partitions_outcome(&resp, id),
        Err(PeerError::Client(ClientError::Version { .. })) if verify_only => Ok(()),
        Err(e) => {
            tracing::warn!(transactional_id = id, broker, error = %e, "adding partitions to the transaction at another node failed");
            Err(TxnError::CoordinatorNotAvailable)
        }
    }
}

/// The broker-to-broker AddPartitionsToTxn (v4+) for one transaction.
pub fn add_partitions_request(
    id: &str,
    pid: i64,
    epoch: i16,
    tps: &[TopicPartition],
    verify_only: bool,
) -> AddPartitionsToTxnRequest {
    let mut topics: Vec<AddPartitionsToTxnTopic> = Vec::new();
    for tp in tps {
        match topics.iter_mut().find(|t| t.name.0.as_str() == tp.topic) {
            Some(t) => t.partitions.push(tp.partition.0),
            None => topics.push(
                AddPartitionsToTxnTopic::default()
                    .with_name(TopicName(StrBytes::from_string(tp.topic.clone())))
                    .with_partitions(vec![tp.partition.0]),
            ),
        }
    }
    AddPartitionsToTxnRequest::default().with_transactions(vec![
        AddPartitionsToTxnTransaction::default()
            .with_transactional_id(TransactionalId(StrBytes::from_string(id.to_owned())))
            .with_producer_id(ProducerId(pid))
            .with_producer_epoch(epoch)
            .with_verify_only(verify_only)
            .with_topics(topics),
    ])
}

/// A coordinator's batched answer for transaction `id` as the local path's
/// result: the first partition that failed decides (the local path fails
/// all partitions alike, or the first unverified one).
pub fn add_partitions_outcome(resp: &AddPartitionsToTxnResponse, id: &str) -> Result<(), TxnError> {
    if resp.error_code != errors::NONE {
        if resp.error_code == ResponseError::ClusterAuthorizationFailed.code() {
            return Err(TxnError::InvalidTxnState);
        }
        return errors::txn_from_code(resp.error_code);
    }
    let Some(result) = resp
        .results_by_transaction
        .iter()
        .find(|r| r.transactional_id.0.as_str() == id)
    else {
        return Err(TxnError::CoordinatorNotAvailable);
    };
    result
        .topic_results
        .iter()
        .flat_map(|t| &t.results_by_partition)
        .try_for_each(|p| errors::txn_from_code(p.partition_error_code))
}

/// Partitions refused before their append, with the code each answers:
/// by authorization (step 0, before anything else is checked) and by the
/// transaction coordinator (AddPartitionsToTxn, checked after validation).
struct Refusals {
    denied: Denied,
    txn: Denied,
}

/// Steps 1–6, synchronously; returns the future that waits and answers.
fn append_and_answer(
    ctx: &Rc<ShardCtx>,
    listener: usize,
    header: RequestHeader,
    req: crate::protocol::produce::ProduceRequest,
    buffer_bytes: usize,
    refusals: Refusals,
    mut recompressed: Recompressed,
) -> LocalBoxFuture<'static, Outcome> {
    let Refusals {
        denied,
        txn: refused,
    } = refusals;
    let version = header.api_version;
    let acks = req.acks;
    let req_transactional_id = req.transactional_id.clone();
    let timeout_ms = req.timeout_ms;
    let acks_valid = matches!(acks, -1..=1);
    let image = ctx.image();
    let mut topics: Vec<TopicResults> = Vec::with_capacity(req.topics.len());
    for topic in req.topics {
        let mut results = Vec::with_capacity(topic.partitions.len());
        // v13: an id that named no topic (its name stayed empty).
        let unknown_id = version >= PRODUCE_FIRST_TOPIC_ID_VERSION && topic.name.is_empty();
        for p in topic.partitions {
            let index = p.index;
            // 0. Authorized (checked before existence, so that a refused
            //    principal learns nothing of which topics exist).
            if !denied.is_empty() {
                if let Some(&code) = denied.get(&(topic.name.clone(), index)) {
                    results.push(PartitionResult::error(index, code, None));
                    continue;
                }
            }
            // 1. The topic and partition exist.
            if unknown_id {
                results.push(PartitionResult::error(
                    index,
                    ResponseError::UnknownTopicId.code(),
                    None,
                ));
                continue;
            }
            let leader = match super::leading_shard(ctx, &image, &topic.name, index) {
                Ok(shard) => shard,
                Err(e) => {
                    results.push(PartitionResult::error(index, e.code(), None));
                    continue;
                }
            };
            // 2. Exactly one v2 batch.
            let mut records = p.records.unwrap_or_default();
            let header = match single_batch_for_version(&records, version) {
                Ok(h) => h,
                Err(e) => {
                    results.push(PartitionResult::error(
                        index,
                        errors::records(&e),
                        Some(e.to_string()),
                    ));
                    continue;
                }
            };
            // 3. acks.
            if !acks_valid {
                results.push(PartitionResult::error(
                    index,
                    ResponseError::InvalidRequiredAcks.code(),
                    None,
                ));
                continue;
            }
            // Clients never write internal topics: their records are the
            // coordinators' state, replayed on load (Kafka's
            // `appendToLocalLog` answers INVALID_TOPIC_EXCEPTION too).
            if is_internal(&topic.name) {
                results.push(PartitionResult::error(
                    index,
                    ResponseError::InvalidTopicException.code(),
                    Some(format!("Cannot append to internal topic {}", topic.name)),
                ));
                continue;
            }
            // 4. Leadership.
            let tp = TopicPartition::new(topic.name.clone(), index);
            let state = match ctx.partition(&tp) {
                Some(s) if leader == ctx.shard => s,
                _ => {
                    let mut r = PartitionResult::error(
                        index,
                        ResponseError::NotLeaderOrFollower.code(),
                        None,
                    );
                    r.leader = Some(ctx.config.node_id_of(leader));
                    results.push(r);
                    continue;
                }
            };
            if let Some(&code) = refused.get(&(topic.name.clone(), index)) {
                results.push(PartitionResult::error(index, code, None));
                continue;
            }
            // A replicated partition takes acks=all only while its ISR has
            // `min.insync.replicas` (Kafka's `appendRecordsToLeader`).
            let replicated = image
                .topic(&topic.name)
                .and_then(|t| t.replica_state(index))
                .filter(|_| acks == -1);
            if let Some(ps) = replicated {
                let me = ctx.config.node_id_of(ctx.shard);
                let min_isr = state.config().min_insync_replicas;
                if !ctx.leading.enough_replicas(&state, ps, me) {
                    results.push(PartitionResult::error(
                        index,
                        ResponseError::NotEnoughReplicas.code(),
                        Some(format!(
                            "The size of the current ISR {:?} is insufficient to satisfy the min.isr requirement of {min_isr} for partition {tp}",
                            ps.isr
                        )),
                    ));
                    continue;
                }
            }
            // 5. baseOffset, size, CRC.
            records.truncate(header.total_size());
            let max_bytes = state.config().max_message_bytes.max(0) as usize;
            if let Err(e) = validate_for_append(&records, &header, max_bytes) {
                results.push(PartitionResult::error(
                    index,
                    errors::records(&e),
                    Some(e.to_string()),
                ));
                continue;
            }
            if header.is_transactional() && req_transactional_id.is_none() {
                results.push(PartitionResult::error(
                    index,
                    ResponseError::InvalidRecord.code(),
                    Some("transactional records need a transactional id".into()),
                ));
                continue;
            }
            // Kafka's `LogValidator.validateKey`: every record of a batch
            // for a compacted topic needs a key (control batches come only
            // from the broker). This opens the batch, decompressing it if
            // need be, so only compacted topics pay for it.
            if state.config().cleanup_compact {
                match keyless_records(&records, ctx.config.batch_decompressed_bytes_max) {
                    Ok(keyless) if keyless.is_empty() => {}
                    Ok(keyless) => {
                        let log_start = state.log.log_start_offset().0;
                        results.push(keyless_refusal(index, &tp, &keyless, log_start));
                        continue;
                    }
                    Err(e) => {
                        results.push(PartitionResult::error(
                            index,
                            errors::records(&e),
                            Some(e.to_string()),
                        ));
                        continue;
                    }
                }
            }
            // 6. Producer state, then recompress, stamp and append — one
            //    synchronous step in the partition, so check and update
            //    cannot interleave.
            let appended = state.append_data(
                &header,
                records,
                buffer_bytes,
                recompressed.remove(&(topic.name.clone(), index)),
                ctx.config.batch_decompressed_bytes_max,
            );
            let (info, log_append_time_ms) = match appended {
                Ok(DataAppend::Appended {
                    info,
                    log_append_time_ms,
                }) => (info, log_append_time_ms),
                // Answered as the original was, once its write is done.
                Ok(DataAppend::Duplicate(info)) => (info, -1),
                Err(e) => {
                    if let AppendError::Log(e) = &e {
                        // A writer out of file descriptors said so once already.
                        if e.is_temporary() {
                            tracing::debug!(%tp, error = %e, "append refused");
                        } else {
                            tracing::error!(%tp, error = %e, "append failed");
                        }
                    }
                    results.push(PartitionResult::error(
                        index,
                        errors::append(&e),
                        Some(e.to_string()),
                    ));
                    continue;
                }
            };
            results.push(PartitionResult {
                index,
                error: errors::NONE,
                message: None,
                leader: None,
                appended: Some(info),
                log_append_time_ms,
                log: Some(state.log.clone()),
                replicated: replicated.map(|ps| (tp.clone(), ps.leader_epoch)),
                record_errors: Vec::new(),
                refused_log_start: -1,
            });
        }
        topics.push((topic.name, topic.topic_id, results));
    }

    // TESTING ONLY (--debug-drop-produce-response-every): lose this response.
    let every = ctx.config.debug_drop_produce_response_every;
    let drop_response = every > 0 && {
        let n = ctx.produce_count.get() + 1;
        ctx.produce_count.set(n);
        n % every == 0
    };
    let ctx = ctx.clone();
    async move {
        if drop_response {
            return Outcome::Close;
        }
        let any_error = topics
            .iter()
            .flat_map(|(_, _, ps)| ps)
            .any(|p| p.error != errors::NONE);
        if acks == 0 {
            return if any_error {
                // Kafka counts the would-be response's error codes when it
                // closes an acks=0 connection (RequestChannel.closeConnection).
                metrics::record_errors(header.api_key, |counts| {
                    for p in topics.iter().flat_map(|(_, _, ps)| ps) {
                        counts.count(p.error);
                    }
                });
                Outcome::Close
            } else {
                Outcome::NoReply
            };
        }
        let durable = acks == -1 && ctx.config.fsync_acks;
        // One deadline for the whole request, and only for acks=-1 (Kafka's
        // timeout bounds the wait for replication; an acks=1 append that was
        // made is answered as made).
        let deadline = (acks == -1)
            .then(|| crate::clock::monotonic() + Duration::from_millis(timeout_ms.max(0) as u64));
        for (_, _, results) in topics.iter_mut() {
            for r in results.iter_mut() {
                let (Some(log), Some(info)) = (&r.log, &r.appended) else {
                    continue;
                };
                let last: Offset = info.last_offset;
                // A replicated one: the HW passes it once enough followers
                // hold it.
                let mut wait = Box::pin(ctx.wait_acks_all(
                    log,
                    last,
                    durable,
                    r.replicated.as_ref().map(|(tp, _)| tp),
                ));
                // Often written already (page-cache writes): then no timer
                // is armed, which costs the reactor a timeout and a cancel.
                let outcome = match ((&mut wait).now_or_never(), deadline) {
                    (Some(written), _) => Some(written),
                    (None, None) => Some(wait.await),
                    // acks=-1 waits as Kafka's DelayedProduce does in its
                    // purgatory: remote time in the request metrics.
                    (None, Some(d)) => {
                        let left = d.saturating_duration_since(crate::clock::monotonic());
                        let timer = glommio::timer::sleep(left);
                        match metrics::remote_wait(future::select(wait, Box::pin(timer))).await {
                            Either::Left((written, _)) => Some(written),
                            Either::Right(_) => None,
                        }
                    }
                };
                let after = r
                    .replicated
                    .as_ref()
                    .filter(|_| matches!(outcome, Some(Ok(()))))
                    // In the epoch it was appended in: a leader deposed
                    // before its followers fetched the batch truncates it
                    // away as the new leader's follower, whose HW then
                    // passes the offset (and it may lead again since).
                    .map(|(tp, epoch)| ctx.leading.acks_all_in(tp, log, *epoch, last.0));
                if r.replicated.is_some() {
                    tracing::trace!(
                        offset = last.0,
                        ?outcome,
                        ?after,
                        hw = log.high_watermark().0,
                        "acks=all answered"
                    );
                }
                match outcome {
                    // Leadership lost meanwhile, or the ISR shrank below
                    // the minimum (Kafka's `checkEnoughReplicasReachOffset`).
                    Some(Ok(())) if after == Some(None) => {
                        r.error = ResponseError::NotLeaderOrFollower.code();
                        r.appended = None;
                    }
                    Some(Ok(())) if after == Some(Some(AcksAll::DoneUnderMinIsr)) => {
                        r.error = ResponseError::NotEnoughReplicasAfterAppend.code();
                        r.appended = None;
                    }
                    Some(Ok(())) => {}
                    Some(Err(e)) => {
                        r.error = errors::log(&e);
                        r.message = Some(e.to_string());
                        r.appended = None;
                    }
                    None => {
                        tracing::warn!(offset = last.0, state = %log.writer_state(),
                            "produce timed out waiting for its write");
                        r.error = ResponseError::RequestTimedOut.code();
                        r.appended = None;
                    }
                }
            }
        }
        respond(&header, &response(&ctx, listener, version, topics))
    }
    .boxed_local()
}

/// A topic's answers: its name, its id (v13) and its partitions' results.
type TopicResults = (String, [u8; 16], Vec<PartitionResult>);

fn response(
    ctx: &ShardCtx,
    listener: usize,
    version: i16,
    topics: Vec<TopicResults>,
) -> ProduceResponse {
    let mut leaders_named = Vec::new();
    let responses = topics
        .into_iter()
        .map(|(name, topic_id, results)| {
            let partitions = results
                .into_iter()
                .map(|r| {
                    let mut p = PartitionProduceResponse::default()
                        .with_index(r.index)
                        .with_error_code(r.error)
                        .with_base_offset(-1)
                        .with_log_append_time_ms(r.log_append_time_ms)
                        .with_log_start_offset(r.refused_log_start);
                    if let Some(info) = &r.appended {
                        p = p
                            .with_base_offset(info.base_offset.0)
                            .with_log_start_offset(info.log_start_offset.0);
                    } else {
                        p = p.with_log_append_time_ms(-1);
                    }
                    if version >= 8 {
                        p = p.with_error_message(r.message.map(super::str_bytes));
                        let record_errors = r
                            .record_errors
                            .into_iter()
                            .map(|(i, m)| {
                                BatchIndexAndErrorMessage::default()
                                    .with_batch_index(i)
                                    .with_batch_index_error_message(Some(super::str_bytes(m)))
                            })
                            .collect();
                        p = p.with_record_errors(record_errors);
                    }
                    if let (Some(leader), true) = (r.leader, version >= FIRST_LEADER_HINT_VERSION) {
                        leaders_named.push(leader);
                        p = p.with_current_leader(
                            LeaderIdAndEpoch::default()
                                .with_leader_id(BrokerId(leader))
                                .with_leader_epoch(ctx.image().leader_epoch()),
                        );
                    }
                    p
                })
                .collect();
            let topic = TopicProduceResponse::default().with_partition_responses(partitions);
            if version >= PRODUCE_FIRST_TOPIC_ID_VERSION {
                topic.with_topic_id(Uuid::from_bytes(topic_id))
            } else {
                topic.with_name(TopicName(super::str_bytes(name)))
            }
        })
        .collect();
    let mut resp = ProduceResponse::default().with_responses(responses);
    if version >= FIRST_LEADER_HINT_VERSION && !leaders_named.is_empty() {
        leaders_named.sort_unstable();
        leaders_named.dedup();
        let endpoints = leaders_named
            .into_iter()
            .filter_map(|node| {
                let shard = ctx.config.shard_of_node(node)?;
                let (host, port) = ctx.config.endpoint(listener, shard);
                Some(
                    NodeEndpoint::default()
                        .with_node_id(BrokerId(node))
                        .with_host(super::str_bytes(host))
                        .with_port(port),
                )
            })
            .collect();
        resp = resp.with_node_endpoints(endpoints);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::add_partitions_to_txn_response::{
        AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResult, AddPartitionsToTxnTopicResult,
    };

    fn answer(id: &str, codes: &[(&str, i32, i16)]) -> AddPartitionsToTxnResponse {
        let mut topics: Vec<AddPartitionsToTxnTopicResult> = Vec::new();
        for &(t, p, code) in codes {
            let r = AddPartitionsToTxnPartitionResult::default()
                .with_partition_index(p)
                .with_partition_error_code(code);
            match topics.iter_mut().find(|x| x.name.0.as_str() == t) {
                Some(x) => x.results_by_partition.push(r),
                None => topics.push(
                    AddPartitionsToTxnTopicResult::default()
                        .with_name(TopicName(StrBytes::from_string(t.into())))
                        .with_results_by_partition(vec![r]),
                ),
            }
        }
        AddPartitionsToTxnResponse::default().with_results_by_transaction(vec![
            AddPartitionsToTxnResult::default()
                .with_transactional_id(TransactionalId(StrBytes::from_string(id.into())))
                .with_topic_results(topics),
        ])
    }

    /// One transaction, its partitions grouped by topic, `verifyOnly` as
    /// asked.
    #[test]
    fn the_broker_request_names_one_transaction_by_topic() {
        let tps = [
            TopicPartition::new("a", 0),
            TopicPartition::new("b", 3),
            TopicPartition::new("a", 2),
        ];
        let req = add_partitions_request("tx", 9, 4, &tps, true);
        assert_eq!(req.transactions.len(), 1);
        let t = &req.transactions[0];
        assert_eq!(t.transactional_id.0.as_str(), "tx");
        assert_eq!(
            (t.producer_id.0, t.producer_epoch, t.verify_only),
            (9, 4, true)
        );
        let topics: Vec<(&str, Vec<i32>)> = t
            .topics
            .iter()
            .map(|t| (t.name.0.as_str(), t.partitions.clone()))
            .collect();
        assert_eq!(topics, vec![("a", vec![0, 2]), ("b", vec![3])]);
    }

    /// The batched answer maps back as the local path's result: all good,
    /// the first failure, a fenced producer, Kafka's top-level rule.
    #[test]
    fn the_batched_answer_maps_back_to_the_local_result() {
        assert_eq!(
            add_partitions_outcome(&answer("tx", &[("a", 0, 0), ("a", 1, 0)]), "tx"),
            Ok(())
        );
        let invalid = ResponseError::InvalidTxnState.code();
        assert_eq!(
            add_partitions_outcome(&answer("tx", &[("a", 0, 0), ("b", 1, invalid)]), "tx"),
            Err(TxnError::InvalidTxnState)
        );
        let fenced = ResponseError::ProducerFenced.code();
        assert_eq!(
            add_partitions_outcome(&answer("tx", &[("a", 0, fenced)]), "tx"),
            Err(TxnError::ProducerFenced)
        );
        let concurrent = ResponseError::ConcurrentTransactions.code();
        let e = add_partitions_outcome(&answer("tx", &[("a", 0, concurrent)]), "tx").unwrap_err();
        assert_eq!(
            errors::txn_on_produce(e),
            ResponseError::NotEnoughReplicas.code()
        );
        // An answer for another id only: no answer, retriable.
        assert_eq!(
            add_partitions_outcome(&answer("other", &[("a", 0, 0)]), "tx"),
            Err(TxnError::CoordinatorNotAvailable)
        );
        let refused = AddPartitionsToTxnResponse::default()
            .with_error_code(ResponseError::ClusterAuthorizationFailed.code());
        assert_eq!(
            add_partitions_outcome(&refused, "tx"),
            Err(TxnError::InvalidTxnState)
        );
    }
}
