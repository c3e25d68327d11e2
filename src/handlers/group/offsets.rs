//! OffsetCommit v2-10, OffsetFetch v1-10 (several groups from v8, topics
//! by id at v10, resolved to names here so that the group layer sees only
//! names), OffsetDelete v0 and TxnOffsetCommit v0-6 (topics by id at v6,
//! KIP-1319, resolved the same way). Partitions of unknown topics get
//! UNKNOWN_TOPIC_OR_PARTITION on commit (UNKNOWN_TOPIC_ID for an unknown
//! topic id at OffsetCommit v10 and TxnOffsetCommit v6); a group-level refusal
//! (NOT_COORDINATOR, ILLEGAL_GENERATION, ...) is reported on every
//! partition of a commit, as Kafka does. (v0/v1 of OffsetCommit and v0 of
//! OffsetFetch are not in kafka-protocol 0.18's schemas, so not served.)

use crate::auth::acl::{AclOperation, ResourceType};
use crate::clock::now_ms;
use crate::group::error::GroupError;
use crate::group::state::{CommittedOffset, OFFSET_METADATA_MAX_BYTES};
use crate::group::OffsetToCommit;
use crate::handlers::authz::{
    Authz, GROUP_AUTHORIZATION_FAILED, TOPIC_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
};
use crate::handlers::errors;
use crate::handlers::{decode, respond, str_bytes, Outcome};
use crate::protocol::hand_versions::{
    OffsetCommitRequestV10, OffsetCommitResponseV10, OffsetFetchGroupResponseV10,
    OffsetFetchRequestV10, OffsetFetchResponseV10, TopicId, OFFSET_COMMIT_TOPIC_ID_VERSION,
    OFFSET_FETCH_TOPIC_ID_VERSION,
};
use crate::protocol::hand_versions_more::{
    TxnOffsetCommitRequestV6, TxnOffsetCommitResponseV6, TXN_OFFSET_COMMIT_TOPIC_ID_VERSION,
};
use crate::protocol::RequestHeader;
use crate::shard::ShardCtx;
use bytes::BytesMut;
use kafka_protocol::messages::offset_commit_request::OffsetCommitRequestTopic;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::txn_offset_commit_request::TxnOffsetCommitRequestTopic;
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::{
    GroupId, OffsetCommitRequest, OffsetCommitResponse, OffsetDeleteRequest, OffsetDeleteResponse,
    OffsetFetchRequest, OffsetFetchResponse, TopicName, TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

/// OffsetCommit v2-v4's `retention_time_ms` meaning "the broker's".
pub const DEFAULT_RETENTION_TIME_MS: i64 = -1;

/// Per (topic, partition) of a request: the offset to write, or the error
/// that partition already has.
type Checked = Vec<(String, i32, Result<CommittedOffset, GroupError>)>;

/// One row of [`Checked`]: the partition and the offset to write, or the
/// error the partition already has.
fn checked_row(
    ctx: &ShardCtx,
    topic: &str,
    partition: i32,
    offset: CommittedOffset,
) -> (String, i32, Result<CommittedOffset, GroupError>) {
    let result = if !ctx.image().has_partition(topic, partition) {
        Err(GroupError::UnknownTopicOrPartition)
    } else if offset.metadata.len() > OFFSET_METADATA_MAX_BYTES {
        Err(GroupError::OffsetMetadataTooLarge)
    } else {
        Ok(offset)
    };
    (topic.to_string(), partition, result)
}

/// The offset an OffsetCommit or TxnOffsetCommit partition asks to commit.
fn committed(
    offset: i64,
    leader_epoch: i32,
    metadata: Option<&StrBytes>,
    now_ms: i64,
    expire_timestamp_ms: Option<i64>,
) -> CommittedOffset {
    CommittedOffset {
        offset,
        leader_epoch,
        metadata: metadata.map(|m| m.to_string()).unwrap_or_default(),
        commit_timestamp_ms: now_ms,
        expire_timestamp_ms,
    }
}

/// Writes the valid partitions of `checked` through `commit`; returns the
/// error of every partition.
async fn commit_checked<F, Fut>(checked: Checked, commit: F) -> Vec<(String, i32, i16)>
where
    F: FnOnce(Vec<OffsetToCommit>) -> Fut,
    Fut: std::future::Future<Output = Result<(), GroupError>>,
{
    let valid: Vec<OffsetToCommit> = checked
        .iter()
        .filter_map(|(t, p, r)| r.as_ref().ok().map(|o| (t.clone(), *p, o.clone())))
        .collect();
    let group_result = commit(valid).await;
    checked
        .into_iter()
        .map(|(t, p, r)| {
            let code = match (r, &group_result) {
                (Err(e), _) => errors::group(&e),
                (Ok(_), Err(e)) => errors::group(e),
                (Ok(_), Ok(())) => errors::NONE,
            };
            (t, p, code)
        })
        .collect()
}

/// [`commit_checked`] for the rows whose topic the principal may READ
/// (Kafka's OffsetCommit and TxnOffsetCommit check); the others answer
/// TOPIC_AUTHORIZATION_FAILED and are not written. Rows stay in order.
async fn commit_authorized<F, Fut>(
    authz: &Authz,
    checked: Checked,
    commit: F,
) -> Vec<(String, i32, i16)>
where
    F: FnOnce(Vec<OffsetToCommit>) -> Fut,
    Fut: std::future::Future<Output = Result<(), GroupError>>,
{
    if !authz.enabled() {
        return commit_checked(checked, commit).await;
    }
    let mut allowed: HashMap<String, bool> = HashMap::new();
    let mut order = Vec::with_capacity(checked.len());
    let mut keep = Vec::new();
    for row in checked {
        let ok = *allowed
            .entry(row.0.clone())
            .or_insert_with(|| authz.topic(AclOperation::Read, &row.0));
        if ok {
            order.push(None);
            keep.push(row);
        } else {
            order.push(Some((row.0, row.1, TOPIC_AUTHORIZATION_FAILED)));
        }
    }
    let mut done = if keep.is_empty() {
        Vec::new().into_iter()
    } else {
        commit_checked(keep, commit).await.into_iter()
    };
    order
        .into_iter()
        .filter_map(|refused| refused.or_else(|| done.next()))
        .collect()
}

/// Every row of `checked` with `code` (a refusal of the whole request).
fn refuse_all(checked: Checked, code: i16) -> Vec<(String, i32, i16)> {
    checked.into_iter().map(|(t, p, _)| (t, p, code)).collect()
}

/// Groups (topic, partition, code) rows by topic, in request order.
fn by_topic(rows: Vec<(String, i32, i16)>) -> Vec<(String, Vec<(i32, i16)>)> {
    let mut out: Vec<(String, Vec<(i32, i16)>)> = Vec::new();
    for (t, p, c) in rows {
        match out.last_mut() {
            Some((last, parts)) if *last == t => parts.push((p, c)),
            _ => out.push((t, vec![(p, c)])),
        }
    }
    out
}

pub async fn offset_commit(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    if header.api_version >= OFFSET_COMMIT_TOPIC_ID_VERSION {
        return offset_commit_by_id(ctx, authz, header, body).await;
    }
    let Some(req) = decode::<OffsetCommitRequest>(header, body) else {
        return Outcome::Close;
    };
    let rows = commit_rows(ctx, authz, header.api_version, &req).await;
    let topics = by_topic(rows)
        .into_iter()
        .map(|(t, parts)| {
            OffsetCommitResponseTopic::default()
                .with_name(TopicName(str_bytes(t)))
                .with_partitions(commit_partitions(parts))
        })
        .collect();
    respond(header, &OffsetCommitResponse::default().with_topics(topics))
}

/// An id no topic has, with its partitions and their error code.
type UnknownTopic = (TopicId, Vec<(i32, i16)>);

/// Resolves the topic ids of a request naming topics by id (OffsetCommit
/// v10, TxnOffsetCommit v6): `named(name, partitions)` receives each
/// topic the image knows; the answer is each name's id (to answer by id)
/// and, for every id no topic has, its partitions with UNKNOWN_TOPIC_ID.
fn resolve_topic_ids<P>(
    ctx: &ShardCtx,
    topics: Vec<(TopicId, Vec<P>)>,
    index: impl Fn(&P) -> i32,
    mut named: impl FnMut(String, Vec<P>),
) -> (HashMap<String, TopicId>, Vec<UnknownTopic>) {
    let image = ctx.image();
    let mut ids = HashMap::new();
    let mut unknown = Vec::new();
    for (id, partitions) in topics {
        match image.topic_by_id(&id) {
            Some(topic) => {
                ids.insert(topic.name.clone(), id);
                named(topic.name.clone(), partitions);
            }
            None => unknown.push((
                id,
                partitions
                    .iter()
                    .map(|p| (index(p), ResponseError::UnknownTopicId.code()))
                    .collect(),
            )),
        }
    }
    (ids, unknown)
}

/// OffsetCommit v10, whose topics are named by id. The ids are resolved to
/// names here, and the commit goes on as at v9; the answer names the
/// topics by the ids asked for. An id no topic has is UNKNOWN_TOPIC_ID on
/// each of its partitions, whatever the group's answer, as Kafka does.
async fn offset_commit_by_id(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<OffsetCommitRequestV10>(header, body) else {
        return Outcome::Close;
    };
    let mut named = req.request;
    let (ids, unknown) = resolve_topic_ids(
        ctx,
        req.topics,
        |p| p.partition_index,
        |name, partitions| {
            named.topics.push(
                OffsetCommitRequestTopic::default()
                    .with_name(TopicName(str_bytes(name)))
                    .with_partitions(partitions),
            )
        },
    );
    let unknown: Vec<_> = unknown
        .into_iter()
        .map(|(id, parts)| (id, commit_partitions(parts)))
        .collect();
    let rows = commit_rows(ctx, authz, header.api_version, &named).await;
    let mut topics: Vec<_> = by_topic(rows)
        .into_iter()
        .map(|(t, parts)| {
            let id = *ids
                .get(&t)
                .expect("every committed topic was resolved from an id");
            (id, commit_partitions(parts))
        })
        .collect();
    topics.extend(unknown);
    respond(
        header,
        &OffsetCommitResponseV10 {
            throttle_time_ms: 0,
            topics,
        },
    )
}

/// The response partitions of (partition, error) rows.
fn commit_partitions(parts: Vec<(i32, i16)>) -> Vec<OffsetCommitResponsePartition> {
    parts
        .into_iter()
        .map(|(p, c)| {
            OffsetCommitResponsePartition::default()
                .with_partition_index(p)
                .with_error_code(c)
        })
        .collect()
}

/// Commits what `req` (OffsetCommit at `v`, topics by name) asks; the
/// error of every partition, in request order.
async fn commit_rows(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    v: i16,
    req: &OffsetCommitRequest,
) -> Vec<(String, i32, i16)> {
    let now = now_ms();
    // v2-v4 may override the retention; -1 means the broker's.
    let expire = (v <= 4 && req.retention_time_ms != DEFAULT_RETENTION_TIME_MS)
        .then(|| now + req.retention_time_ms);
    let checked: Checked = req
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| {
                let offset = committed(
                    p.committed_offset,
                    if v >= 6 { p.committed_leader_epoch } else { -1 },
                    p.committed_metadata.as_ref(),
                    now,
                    expire,
                );
                checked_row(ctx, &t.name, p.partition_index, offset)
            })
        })
        .collect();
    let group_id = req.group_id.to_string();
    // Kafka: READ on the group, else every partition answers
    // GROUP_AUTHORIZATION_FAILED; then READ on each topic.
    if !authz.group(AclOperation::Read, &group_id) {
        return refuse_all(checked, GROUP_AUTHORIZATION_FAILED);
    }
    let instance = req.group_instance_id.as_ref().map(|s| s.to_string());
    let unknown_group = if v >= 9 {
        GroupError::GroupIdNotFound
    } else {
        GroupError::IllegalGeneration
    };
    commit_authorized(authz, checked, |valid| async {
        ctx.groups.check(&group_id)?;
        ctx.groups
            .commit_offsets(
                &group_id,
                &req.member_id,
                instance.as_deref(),
                req.generation_id_or_member_epoch,
                valid,
                unknown_group,
            )
            .await
    })
    .await
}

pub async fn txn_offset_commit(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    if header.api_version >= TXN_OFFSET_COMMIT_TOPIC_ID_VERSION {
        return txn_offset_commit_by_id(ctx, authz, header, body).await;
    }
    let Some(req) = decode::<TxnOffsetCommitRequest>(header, body) else {
        return Outcome::Close;
    };
    let rows = txn_commit_rows(ctx, authz, header.api_version, &req).await;
    txn_offset_commit_response(header, rows)
}

/// TxnOffsetCommit v6 (KIP-1319), whose topics are named by id: resolved
/// to names here, committed as at v5 (with v6's errors), answered by the
/// ids asked for. An id no topic has is UNKNOWN_TOPIC_ID on each of its
/// partitions; when no id resolves, the group is not asked at all, as
/// Kafka's `handleTxnOffsetCommitRequest` answers without the coordinator.
async fn txn_offset_commit_by_id(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<TxnOffsetCommitRequestV6>(header, body) else {
        return Outcome::Close;
    };
    let mut named = req.request;
    let (ids, unknown) = resolve_topic_ids(
        ctx,
        req.topics,
        |p| p.partition_index,
        |name, partitions| {
            named.topics.push(
                TxnOffsetCommitRequestTopic::default()
                    .with_name(TopicName(str_bytes(name)))
                    .with_partitions(partitions),
            )
        },
    );
    let unknown: Vec<_> = unknown
        .into_iter()
        .map(|(id, parts)| (id, txn_commit_partitions(parts)))
        .collect();
    let rows = if named.topics.is_empty() {
        Vec::new()
    } else {
        txn_commit_rows(ctx, authz, header.api_version, &named).await
    };
    let mut topics: Vec<_> = by_topic(rows)
        .into_iter()
        .map(|(t, parts)| {
            let id = *ids
                .get(&t)
                .expect("every committed topic was resolved from an id");
            (id, txn_commit_partitions(parts))
        })
        .collect();
    topics.extend(unknown);
    respond(
        header,
        &TxnOffsetCommitResponseV6 {
            throttle_time_ms: 0,
            topics,
        },
    )
}

/// The response partitions of (partition, error) rows.
fn txn_commit_partitions(parts: Vec<(i32, i16)>) -> Vec<TxnOffsetCommitResponsePartition> {
    parts
        .into_iter()
        .map(|(p, c)| {
            TxnOffsetCommitResponsePartition::default()
                .with_partition_index(p)
                .with_error_code(c)
        })
        .collect()
}

/// Commits what `req` (TxnOffsetCommit at `v`, topics by name) asks; the
/// error of every partition, in request order.
async fn txn_commit_rows(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    v: i16,
    req: &TxnOffsetCommitRequest,
) -> Vec<(String, i32, i16)> {
    let now = now_ms();
    let checked: Checked = req
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| {
                let offset = committed(
                    p.committed_offset,
                    if v >= 2 { p.committed_leader_epoch } else { -1 },
                    p.committed_metadata.as_ref(),
                    now,
                    None,
                );
                checked_row(ctx, &t.name, p.partition_index, offset)
            })
        })
        .collect();
    let group_id = req.group_id.to_string();
    // Kafka: WRITE on the transactional id, READ on the group (each
    // refusing the whole request), then READ on each topic.
    if !authz.transactional_id(AclOperation::Write, req.transactional_id.as_str()) {
        return refuse_all(checked, TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
    }
    if !authz.group(AclOperation::Read, &group_id) {
        return refuse_all(checked, GROUP_AUTHORIZATION_FAILED);
    }
    let instance = req.group_instance_id.as_ref().map(|s| s.to_string());
    let (member_id, generation) = if v >= 3 {
        (req.member_id.to_string(), req.generation_id)
    } else {
        (String::new(), -1)
    };
    // Transaction version 2 (TxnOffsetCommit v5+): the client sends no
    // AddOffsetsToTxn, so the group coordinator adds the group's
    // `__consumer_offsets` partition to the transaction itself, as Kafka's
    // `GroupCoordinatorService.commitTransactionalOffsets` does. Without it
    // no marker ever reaches that partition and the offsets stay pending
    // (OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT).
    if v >= TXN_OFFSET_COMMIT_TV2_VERSION {
        if let Err(code) = add_offsets_partition(ctx, req, &group_id).await {
            return checked
                .into_iter()
                .map(|(t, p, r)| (t, p, r.err().map_or(code, |e| errors::group(&e))))
                .collect();
        }
    }
    commit_authorized(authz, checked, |valid| async {
        ctx.groups.check(&group_id)?;
        ctx.groups
            .txn_commit_offsets(
                &group_id,
                req.producer_id.0,
                req.producer_epoch,
                &member_id,
                instance.as_deref(),
                generation,
                valid,
                v >= TXN_OFFSET_COMMIT_TOPIC_ID_VERSION,
            )
            .await
    })
    .await
}

/// First TxnOffsetCommit version of transaction version 2.
pub const TXN_OFFSET_COMMIT_TV2_VERSION: i16 = 5;

/// Adds the group's `__consumer_offsets` partition to the request's
/// transaction at its coordinator; the error code for every row if that
/// failed.
async fn add_offsets_partition(
    ctx: &Rc<ShardCtx>,
    req: &TxnOffsetCommitRequest,
    group_id: &str,
) -> Result<(), i16> {
    use crate::metadata::internal::CONSUMER_OFFSETS;
    let Some(coordinator) = ctx
        .image()
        .coordinator(CONSUMER_OFFSETS, group_id, ctx.cores())
    else {
        return Err(kafka_protocol::ResponseError::CoordinatorNotAvailable.code());
    };
    let tp = crate::types::TopicPartition::new(CONSUMER_OFFSETS, coordinator.partition);
    let outcome = crate::handlers::produce::add_partitions_to_txn(
        ctx,
        req.transactional_id.as_str(),
        req.producer_id.0,
        req.producer_epoch,
        vec![tp],
        false,
    )
    .await;
    outcome.map_err(errors::txn_on_offset_commit)
}

fn txn_offset_commit_response(header: &RequestHeader, rows: Vec<(String, i32, i16)>) -> Outcome {
    let topics = by_topic(rows)
        .into_iter()
        .map(|(t, parts)| {
            TxnOffsetCommitResponseTopic::default()
                .with_name(TopicName(str_bytes(t)))
                .with_partitions(txn_commit_partitions(parts))
        })
        .collect();
    respond(
        header,
        &TxnOffsetCommitResponse::default().with_topics(topics),
    )
}

/// One OffsetFetch partition row: partition, offset, leader epoch,
/// metadata, error code.
type FetchRow = (i32, i64, i32, String, i16);
/// Rows by topic.
type FetchTopics = BTreeMap<String, Vec<FetchRow>>;
/// One group's OffsetFetch rows or its group error.
type FetchRows = Result<FetchTopics, GroupError>;

/// Kafka's OffsetFetch checks: DESCRIBE on the group (else the group's
/// error is GROUP_AUTHORIZATION_FAILED), DESCRIBE on each topic asked for
/// (else its partitions answer TOPIC_AUTHORIZATION_FAILED); asked for all
/// topics, those the principal may not DESCRIBE are left out.
fn fetch_group(
    ctx: &ShardCtx,
    authz: &Authz,
    group_id: &str,
    topics: Option<Vec<(String, Vec<i32>)>>,
    require_stable: bool,
) -> FetchRows {
    if !authz.group(AclOperation::Describe, group_id) {
        return Err(GroupError::GroupAuthorizationFailed);
    }
    let all_topics = topics.is_none();
    let mut refused: Vec<(String, Vec<i32>)> = Vec::new();
    let topics = topics.map(|ts| {
        ts.into_iter()
            .filter_map(|(t, ps)| {
                if authz.topic(AclOperation::Describe, &t) {
                    Some((t, ps))
                } else {
                    refused.push((t, ps));
                    None
                }
            })
            .collect::<Vec<_>>()
    });
    let wanted = topics.map(|ts| {
        ts.into_iter()
            .flat_map(|(t, ps)| ps.into_iter().map(move |p| (t.clone(), p)))
            .collect::<Vec<_>>()
    });
    let rows = ctx.groups.fetch_offsets(group_id, wanted, require_stable)?;
    let mut out: FetchTopics = BTreeMap::new();
    for (t, ps) in refused {
        out.entry(t).or_default().extend(
            ps.into_iter()
                .map(|p| (p, -1, -1, String::new(), TOPIC_AUTHORIZATION_FAILED)),
        );
    }
    for (t, p, r) in rows {
        if all_topics && !authz.filter(AclOperation::Describe, ResourceType::Topic, &t) {
            continue;
        }
        let row = match r {
            Ok(Some(o)) => (p, o.offset, o.leader_epoch, o.metadata, errors::NONE),
            Ok(None) => (p, -1, -1, String::new(), errors::NONE),
            Err(e) => (p, -1, -1, String::new(), errors::group(&e)),
        };
        out.entry(t).or_default().push(row);
    }
    Ok(out)
}

/// One group of an OffsetFetch v9+ (the member is checked first; KIP-848
/// consumer groups) or v8.
fn fetch_member_group(
    ctx: &ShardCtx,
    authz: &Authz,
    v: i16,
    group_id: &str,
    member: (Option<&str>, i32),
    topics: Option<Vec<(String, Vec<i32>)>>,
    require_stable: bool,
) -> FetchRows {
    if !authz.group(AclOperation::Describe, group_id) {
        return Err(GroupError::GroupAuthorizationFailed);
    }
    if v >= 9 {
        ctx.groups
            .validate_offset_fetch(group_id, member.0, member.1)?;
    }
    fetch_group(ctx, authz, group_id, topics, require_stable)
}

/// The v8+ response partitions of fetched rows.
fn fetch_partitions(parts: Vec<FetchRow>) -> Vec<OffsetFetchResponsePartitions> {
    parts
        .into_iter()
        .map(|(p, o, e, m, c)| {
            OffsetFetchResponsePartitions::default()
                .with_partition_index(p)
                .with_committed_offset(o)
                .with_committed_leader_epoch(e)
                .with_metadata(Some(str_bytes(m)))
                .with_error_code(c)
        })
        .collect()
}

/// OffsetFetch v10, whose topics are named by id. The ids asked for are
/// resolved to names here and fetched as at v9; an id no topic has is
/// UNKNOWN_TOPIC_ID on each of its partitions (offset -1, as Kafka
/// answers), after the known ones. Asked for all topics, the group's
/// topics are named by their current ids; offsets left of a deleted topic,
/// which has none, are not listed.
fn offset_fetch_by_id(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<OffsetFetchRequestV10>(header, body) else {
        return Outcome::Close;
    };
    let v = header.api_version;
    let image = ctx.image();
    let groups = req
        .groups
        .iter()
        .map(|g| {
            let mut ids: HashMap<String, TopicId> = HashMap::new();
            let mut unknown = Vec::new();
            let topics = g.topics.as_ref().map(|ts| {
                let mut named = Vec::new();
                for (id, partitions) in ts {
                    match image.topic_by_id(id) {
                        Some(topic) => {
                            ids.insert(topic.name.clone(), *id);
                            named.push((topic.name.clone(), partitions.clone()));
                        }
                        None => unknown.push((
                            *id,
                            fetch_partitions(
                                partitions
                                    .iter()
                                    .map(|&p| {
                                        (
                                            p,
                                            -1,
                                            -1,
                                            String::new(),
                                            ResponseError::UnknownTopicId.code(),
                                        )
                                    })
                                    .collect(),
                            ),
                        )),
                    }
                }
                named
            });
            let fetched = fetch_member_group(
                ctx,
                authz,
                v,
                &g.group_id,
                (g.member_id.as_deref(), g.member_epoch),
                topics,
                req.require_stable,
            );
            let mut group = OffsetFetchGroupResponseV10 {
                group_id: g.group_id.clone(),
                ..Default::default()
            };
            match fetched {
                Err(e) => group.error_code = errors::group(&e),
                Ok(rows) => {
                    group.topics = rows
                        .into_iter()
                        .filter_map(|(t, parts)| {
                            let id = ids
                                .get(&t)
                                .copied()
                                .or_else(|| image.topic(&t).map(|m| m.id))?;
                            Some((id, fetch_partitions(parts)))
                        })
                        .collect();
                    group.topics.extend(unknown);
                }
            }
            group
        })
        .collect();
    respond(
        header,
        &OffsetFetchResponseV10 {
            throttle_time_ms: 0,
            groups,
        },
    )
}

pub fn offset_fetch(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    if header.api_version >= OFFSET_FETCH_TOPIC_ID_VERSION {
        return offset_fetch_by_id(ctx, authz, header, body);
    }
    let Some(req) = decode::<OffsetFetchRequest>(header, body) else {
        return Outcome::Close;
    };
    let v = header.api_version;
    let require_stable = v >= 7 && req.require_stable;
    if v >= 8 {
        let groups = req
            .groups
            .iter()
            .map(|g| {
                let topics = g.topics.as_ref().map(|ts| {
                    ts.iter()
                        .map(|t| (t.name.to_string(), t.partition_indexes.clone()))
                        .collect()
                });
                let base = OffsetFetchResponseGroup::default().with_group_id(g.group_id.clone());
                let fetched = fetch_member_group(
                    ctx,
                    authz,
                    v,
                    &g.group_id,
                    (g.member_id.as_deref(), g.member_epoch),
                    topics,
                    require_stable,
                );
                match fetched {
                    Err(e) => base.with_error_code(errors::group(&e)),
                    Ok(rows) => base.with_topics(
                        rows.into_iter()
                            .map(|(t, parts)| {
                                OffsetFetchResponseTopics::default()
                                    .with_name(TopicName(str_bytes(t)))
                                    .with_partitions(fetch_partitions(parts))
                            })
                            .collect(),
                    ),
                }
            })
            .collect();
        return respond(header, &OffsetFetchResponse::default().with_groups(groups));
    }
    let topics: Option<Vec<(String, Vec<i32>)>> = req.topics.as_ref().map(|ts| {
        ts.iter()
            .map(|t| (t.name.to_string(), t.partition_indexes.clone()))
            .collect()
    });
    let to_response = |rows: FetchTopics| {
        rows.into_iter()
            .map(|(t, parts)| {
                OffsetFetchResponseTopic::default()
                    .with_name(TopicName(str_bytes(t)))
                    .with_partitions(
                        parts
                            .into_iter()
                            .map(|(p, o, e, m, c)| {
                                OffsetFetchResponsePartition::default()
                                    .with_partition_index(p)
                                    .with_committed_offset(o)
                                    .with_committed_leader_epoch(e)
                                    .with_metadata(Some(str_bytes(m)))
                                    .with_error_code(c)
                            })
                            .collect(),
                    )
            })
            .collect::<Vec<_>>()
    };
    let resp = match fetch_group(ctx, authz, &req.group_id, topics.clone(), require_stable) {
        Ok(rows) => OffsetFetchResponse::default().with_topics(to_response(rows)),
        Err(e) if v >= 2 => OffsetFetchResponse::default().with_error_code(errors::group(&e)),
        Err(e) => {
            // v1 has no top-level error: every partition carries it.
            let code = errors::group(&e);
            let mut rows: FetchTopics = BTreeMap::new();
            for (t, ps) in topics.unwrap_or_default() {
                rows.insert(
                    t,
                    ps.into_iter()
                        .map(|p| (p, -1, -1, String::new(), code))
                        .collect(),
                );
            }
            OffsetFetchResponse::default().with_topics(to_response(rows))
        }
    };
    respond(header, &resp)
}

pub async fn offset_delete(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<OffsetDeleteRequest>(header, body) else {
        return Outcome::Close;
    };
    let group_id: &GroupId = &req.group_id;
    // Kafka: DELETE on the group, then READ on each topic.
    if !authz.group(AclOperation::Delete, group_id.as_str()) {
        return respond(
            header,
            &OffsetDeleteResponse::default().with_error_code(GROUP_AUTHORIZATION_FAILED),
        );
    }
    let mut rows: Vec<(String, i32, i16)> = Vec::new();
    let mut wanted = Vec::new();
    for t in &req.topics {
        let authorized = authz.topic(AclOperation::Read, t.name.as_str());
        for p in &t.partitions {
            if !authorized {
                rows.push((
                    t.name.to_string(),
                    p.partition_index,
                    TOPIC_AUTHORIZATION_FAILED,
                ));
            } else if ctx.image().has_partition(&t.name, p.partition_index) {
                wanted.push((t.name.to_string(), p.partition_index));
            } else {
                rows.push((
                    t.name.to_string(),
                    p.partition_index,
                    errors::group(&GroupError::UnknownTopicOrPartition),
                ));
            }
        }
    }
    let result = match ctx.groups.check(group_id) {
        Ok(_) => ctx.groups.delete_offsets(group_id, wanted).await,
        Err(e) => Err(e),
    };
    let resp = match result {
        Err(e) => OffsetDeleteResponse::default().with_error_code(errors::group(&e)),
        Ok(results) => {
            rows.extend(results.into_iter().map(|(t, p, r)| {
                (
                    t,
                    p,
                    match r {
                        Ok(()) => errors::NONE,
                        Err(e) => errors::group(&e),
                    },
                )
            }));
            rows.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
            OffsetDeleteResponse::default().with_topics(
                by_topic(rows)
                    .into_iter()
                    .map(|(t, parts)| {
                        OffsetDeleteResponseTopic::default()
                            .with_name(TopicName(str_bytes(t)))
                            .with_partitions(
                                parts
                                    .into_iter()
                                    .map(|(p, c)| {
                                        OffsetDeleteResponsePartition::default()
                                            .with_partition_index(p)
                                            .with_error_code(c)
                                    })
                                    .collect(),
                            )
                    })
                    .collect(),
            )
        }
    };
    respond(header, &resp)
}
