//! Fetch: long poll, byte limits, isolation, zero-copy responses.
//!
//! Reads come from the partition log as whole batches — tail-cache `Bytes`
//! or segment-file ranges that the connection reads and sends — and
//! are placed in the response untouched (`protocol::fetch`).
//!
//! Limits follow Kafka (KIP-74): partitions are read in request order, each
//! up to its `partition_max_bytes` and what is left of the response's
//! `max_bytes`; the first partition that returns data may exceed both by one
//! batch so a consumer never stalls on a large batch, later ones may not.
//!
//! Long poll: while fewer than `min_bytes` are available the request parks
//! until some requested partition's high watermark (LSO for read_committed)
//! moves past its fetch offset, or `max_wait_ms` passes; appends on this
//! shard wake it.
//!
//! Fetch sessions (KIP-227, `shard::fetch_sessions`): a full fetch with
//! session epoch 0 opens a session; an incremental fetch names only the
//! partitions whose position changed (and those it forgets), reads every
//! partition of its session, and answers only those with news: records, an
//! error, or a high watermark, last stable offset or log start other than
//! the session last told the client. Session errors are answered at the top
//! level with no partitions, as Kafka does.
//!
//! read_committed reads stop at the last stable offset and carry the aborted
//! transactions overlapping the range (clients drop those batches).
//!
//! A partition named twice in one request is answered once (Kafka keeps a
//! request's partitions in an insertion-ordered map); a request may name at
//! most [`FETCH_PARTITIONS_MAX`] partitions.
//!
//! A partition led by another shard gets NOT_LEADER_OR_FOLLOWER with the
//! current leader (v12+) and, on v16, that node's endpoint.

use super::error_counts::ResponseErrors;
use super::list_offsets::{check_leader_epoch, READ_COMMITTED};
use super::{decode, errors, led_partition, Outcome};
use crate::partition::Partition;
use crate::protocol::fetch::{
    encode_fetch_response, FetchPartitionResponse, FetchResponse, FetchTopicResponse, NodeEndpoint,
};
use crate::protocol::header::write_response_header;
use crate::protocol::RequestHeader;
use crate::record::RecordsChunk;
use crate::runtime::OneWaker;
use crate::shard::fetch_sessions::{
    SessionError, SessionKey, SessionPartition, FINAL_EPOCH, INITIAL_EPOCH,
};
use crate::shard::ShardCtx;
use crate::types::Offset;
use bytes::BytesMut;
use futures::future::{self, LocalBoxFuture};
use futures::FutureExt;
use kafka_protocol::messages::FetchRequest;
use kafka_protocol::ResponseError;
use std::collections::hash_map::{Entry, HashMap};
use std::collections::HashSet;
use std::rc::Rc;
use std::time::Duration;

/// Longest a fetch may park, whatever the client asks (Kafka has no cap;
/// this bounds how long a shutting-down broker waits for parked fetches).
pub const MAX_WAIT_MS_CAP: i32 = 30_000;

/// Most partitions one Fetch may name (duplicates counted): a request over
/// it closes its connection. Kafka has no such cap, but its consumers send
/// only the partitions they are assigned, and every named partition costs a
/// response entry; this bounds what one request can make a shard allocate
/// and wait on.
pub const FETCH_PARTITIONS_MAX: usize = 100_000;

/// One partition a fetch reads, as the request names it or as its session
/// remembers it.
struct Asked {
    key: SessionKey,
    fetch_offset: i64,
    partition_max_bytes: i32,
    current_leader_epoch: i32,
}

/// What a request does with fetch sessions (see `shard::fetch_sessions`).
enum SessionMode {
    /// A full fetch, no session.
    Sessionless,
    /// A full fetch that opens a session.
    Open,
    /// An incremental fetch of this session.
    Incremental(i32),
}

/// One requested partition, resolved.
struct Wanted {
    key: SessionKey,
    topic_index: usize,
    partition: i32,
    fetch_offset: i64,
    partition_max_bytes: i32,
    current_leader_epoch: i32,
    /// The partition if this shard leads it, else the error to answer and
    /// the leader (node id, leader epoch) to name with it.
    target: Result<Rc<Partition>, (ResponseError, Option<LeaderHint>)>,
}

/// A partition's leader as a response names it: (node id, leader epoch).
type LeaderHint = (i32, i32);

pub async fn handle(ctx: &Rc<ShardCtx>, header: &RequestHeader, body: &mut BytesMut) -> Outcome {
    let Some(req) = decode::<FetchRequest>(header, body) else {
        return Outcome::Close;
    };
    let version = header.api_version;
    let read_committed = req.isolation_level == READ_COMMITTED;
    let image = ctx.image();

    // Resolve topics and partitions once. A partition named twice is
    // answered once, at its first place, with the last entry's position and
    // limits (Kafka collects a request's partitions in an insertion-ordered
    // map the same way).
    let requested: usize = req.topics.iter().map(|t| t.partitions.len()).sum();
    if requested > FETCH_PARTITIONS_MAX {
        tracing::warn!(
            requested,
            limit = FETCH_PARTITIONS_MAX,
            "a Fetch names more partitions than fjord serves in one request: closing its connection"
        );
        return Outcome::Close;
    }
    let uses_topic_ids = version >= 13;
    let key_of = |topic: &kafka_protocol::messages::TopicName, id: &uuid::Uuid, partition: i32| {
        if uses_topic_ids {
            SessionKey {
                topic_id: *id.as_bytes(),
                topic: String::new(),
                partition,
            }
        } else {
            SessionKey {
                topic_id: [0; 16],
                topic: topic.0.to_string(),
                partition,
            }
        }
    };
    let mode = match (req.session_id, req.session_epoch) {
        (0, FINAL_EPOCH) => SessionMode::Sessionless,
        (id, FINAL_EPOCH) => {
            ctx.fetch_sessions.borrow_mut().remove(id);
            SessionMode::Sessionless
        }
        (id, INITIAL_EPOCH) => {
            if id != 0 {
                ctx.fetch_sessions.borrow_mut().remove(id);
            }
            SessionMode::Open
        }
        (id, _) => SessionMode::Incremental(id),
    };
    let asked: Vec<Asked> = match mode {
        SessionMode::Sessionless | SessionMode::Open => req
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions.iter().map(move |p| Asked {
                    key: key_of(&t.topic, &t.topic_id, p.partition),
                    fetch_offset: p.fetch_offset,
                    partition_max_bytes: p.partition_max_bytes,
                    current_leader_epoch: p.current_leader_epoch,
                })
            })
            .collect(),
        SessionMode::Incremental(id) => {
            let mut cache = ctx.fetch_sessions.borrow_mut();
            let now_ms = crate::clock::now_ms();
            if let Err(e) = cache.begin_incremental(id, req.session_epoch, uses_topic_ids, now_ms) {
                return session_error_response(header, version, e);
            }
            let changed = cache.update(id, |s| {
                for t in &req.topics {
                    for p in &t.partitions {
                        s.upsert(
                            key_of(&t.topic, &t.topic_id, p.partition),
                            p.fetch_offset,
                            p.partition_max_bytes,
                            p.current_leader_epoch,
                        );
                    }
                }
                for f in &req.forgotten_topics_data {
                    for &partition in &f.partitions {
                        s.forget(&key_of(&f.topic, &f.topic_id, partition));
                    }
                }
            });
            if let Err(e) = changed {
                return session_error_response(header, version, e);
            }
            let Some(session) = cache.get_mut(id) else {
                return session_error_response(header, version, SessionError::NotFound);
            };
            if session.len() > FETCH_PARTITIONS_MAX {
                tracing::warn!(
                    partitions = session.len(),
                    limit = FETCH_PARTITIONS_MAX,
                    "a fetch session holds more partitions than fjord serves in one request: closing it and the connection"
                );
                cache.remove(id);
                return Outcome::Close;
            }
            session
                .partitions()
                .map(|(k, p)| Asked {
                    key: k.clone(),
                    fetch_offset: p.fetch_offset,
                    partition_max_bytes: p.partition_max_bytes,
                    current_leader_epoch: p.current_leader_epoch,
                })
                .collect()
        }
    };

    let mut topics: Vec<FetchTopicResponse> = Vec::new();
    let mut wanted: Vec<Wanted> = Vec::with_capacity(asked.len());
    let mut topic_at: HashMap<(String, [u8; 16]), usize> = HashMap::new();
    let mut wanted_at: HashMap<(usize, i32), usize> = HashMap::new();
    for a in asked {
        let meta = if uses_topic_ids {
            image.topic_by_id(&a.key.topic_id)
        } else {
            image.topic(&a.key.topic)
        };
        let unknown = if uses_topic_ids {
            ResponseError::UnknownTopicId
        } else {
            ResponseError::UnknownTopicOrPartition
        };
        let name = meta
            .map(|m| m.name.clone())
            .unwrap_or_else(|| a.key.topic.clone());
        let topic_index = *topic_at
            .entry((a.key.topic.clone(), a.key.topic_id))
            .or_insert_with(|| {
                topics.push(FetchTopicResponse {
                    name: name.clone(),
                    topic_id: a.key.topic_id,
                    partitions: Vec::new(),
                });
                topics.len() - 1
            });
        let partition = a.key.partition;
        let target = match meta {
            None => Err((unknown, None)),
            Some(_) => match led_partition(ctx, &image, &name, partition) {
                Err((e, leader)) => Err((
                    e,
                    leader.map(|s| (ctx.config.node_id_of(s), image.leader_epoch())),
                )),
                Ok(state) => {
                    match check_leader_epoch(a.current_leader_epoch, state.log.leader_epoch()) {
                        Some(e) => Err((e, None)),
                        None => Ok(state),
                    }
                }
            },
        };
        let entry = Wanted {
            key: a.key,
            topic_index,
            partition,
            fetch_offset: a.fetch_offset,
            partition_max_bytes: a.partition_max_bytes,
            current_leader_epoch: a.current_leader_epoch,
            target,
        };
        match wanted_at.entry((topic_index, partition)) {
            Entry::Occupied(at) => wanted[*at.get()] = entry,
            Entry::Vacant(at) => {
                at.insert(wanted.len());
                wanted.push(entry);
            }
        }
    }

    let max_wait = Duration::from_millis(req.max_wait_ms.clamp(0, MAX_WAIT_MS_CAP) as u64);
    let deadline = crate::clock::monotonic() + max_wait;
    let max_bytes = if version >= 3 {
        req.max_bytes.max(0) as usize
    } else {
        usize::MAX
    };
    let min_bytes = req.min_bytes.max(0) as usize;

    let partitions = loop {
        let (partitions, bytes, any_error) = read_all(&wanted, read_committed, max_bytes).await;
        let now = crate::clock::monotonic();
        if any_error || bytes >= min_bytes || now >= deadline {
            break partitions;
        }
        // Park until a partition has something new: its high watermark
        // moves past both the fetch offset and the HW this read saw (the HW
        // is the next offset, so waiting for "above HW - 1" would be ready at
        // once and spin). Under read_committed the HW may be past the fetch
        // offset while the LSO is not: the marker that moves the LSO moves
        // the HW too. Using the HW read above loses no wake-up.
        let mut waits: Vec<LocalBoxFuture<'_, ()>> = wanted
            .iter()
            .zip(&partitions)
            .filter_map(|(w, p)| {
                w.target
                    .as_ref()
                    .ok()
                    .map(|state| (&state.log, w.fetch_offset.max(p.high_watermark)))
            })
            .map(|(log, seen)| log.wait_for_hw_above(Offset(seen)).boxed_local())
            .collect();
        if waits.is_empty() {
            break partitions;
        }
        let timer = glommio::timer::sleep(deadline - now).boxed_local();
        waits.push(timer);
        // Every partition's watch holds a waker: through `OneWaker` they are
        // clones of one, not of the task's (see `runtime::OneWaker`).
        // Parked as in Kafka's DelayedFetch purgatory: remote time.
        let _ = crate::metrics::remote_wait(OneWaker::new(future::select_all(waits))).await;
        if crate::clock::monotonic() >= deadline {
            // One last read below catches data that arrived with the deadline.
            let (partitions, _, _) = read_all(&wanted, read_committed, max_bytes).await;
            break partitions;
        }
    };

    let session_id = match mode {
        SessionMode::Sessionless => 0,
        SessionMode::Open => {
            let cached = wanted
                .iter()
                .zip(&partitions)
                .map(|(w, p)| {
                    let mut s = SessionPartition::new(
                        w.fetch_offset,
                        w.partition_max_bytes,
                        w.current_leader_epoch,
                    );
                    s.remember(p.high_watermark, p.last_stable_offset, p.log_start_offset);
                    (w.key.clone(), s)
                })
                .collect();
            let partitions = wanted.len();
            let opened = ctx.fetch_sessions.borrow_mut().create(
                cached,
                uses_topic_ids,
                crate::clock::now_ms(),
            );
            tracing::debug!(
                session = opened,
                partitions,
                "full fetch with epoch 0: fetch session opened (None: no slot)"
            );
            opened.unwrap_or(0)
        }
        SessionMode::Incremental(id) => id,
    };
    match mode {
        SessionMode::Incremental(id) => {
            // Only the partitions with news, as Kafka's
            // IncrementalFetchContext answers; those that returned records
            // are read last next time.
            let mut cache = ctx.fetch_sessions.borrow_mut();
            let mut session = cache.get_mut(id);
            let mut with_records = HashSet::new();
            for (w, p) in wanted.iter().zip(partitions) {
                let cached = session.as_mut().and_then(|s| s.get_mut(&w.key));
                let news = match cached {
                    None => true,
                    Some(c) => {
                        let news = !p.records.is_empty()
                            || p.error_code != errors::NONE
                            || c.high_watermark != p.high_watermark
                            || c.last_stable_offset != p.last_stable_offset
                            || c.log_start_offset != p.log_start_offset;
                        c.remember(p.high_watermark, p.last_stable_offset, p.log_start_offset);
                        news
                    }
                };
                if !p.records.is_empty() {
                    with_records.insert(w.key.clone());
                }
                if news {
                    topics[w.topic_index].partitions.push(p);
                }
            }
            if let Some(s) = session {
                s.reorder(&with_records);
            }
            topics.retain(|t| !t.partitions.is_empty());
        }
        SessionMode::Sessionless | SessionMode::Open => {
            for (w, p) in wanted.iter().zip(partitions) {
                topics[w.topic_index].partitions.push(p);
            }
        }
    }
    let mut node_endpoints = Vec::new();
    if version >= 16 {
        let mut leaders: Vec<i32> = topics
            .iter()
            .flat_map(|t| &t.partitions)
            .filter_map(|p| p.current_leader.map(|(id, _)| id))
            .collect();
        leaders.sort_unstable();
        leaders.dedup();
        for node in leaders {
            if let Some(shard) = ctx.config.shard_of_node(node) {
                node_endpoints.push(NodeEndpoint {
                    node_id: node,
                    host: ctx.config.advertised_host.clone(),
                    port: ctx.config.port_of(shard) as i32,
                    rack: None,
                });
            }
        }
    }
    let resp = FetchResponse {
        throttle_time_ms: 0,
        error_code: errors::NONE,
        session_id,
        topics,
        node_endpoints,
    };
    encode(header, version, resp)
}

/// Kafka's answer to a fetch whose session cannot be used: the error at
/// the top level, session 0, no partitions.
fn session_error_response(header: &RequestHeader, version: i16, e: SessionError) -> Outcome {
    let error = match e {
        SessionError::NotFound => ResponseError::FetchSessionIdNotFound,
        SessionError::InvalidEpoch => ResponseError::InvalidFetchSessionEpoch,
        SessionError::TopicIdMismatch => ResponseError::FetchSessionTopicIdError,
    };
    let resp = FetchResponse {
        throttle_time_ms: 0,
        error_code: error.code(),
        session_id: 0,
        topics: Vec::new(),
        node_endpoints: Vec::new(),
    };
    encode(header, version, resp)
}

/// Frames a fetch response: length, response header, then the body's parts.
fn encode(header: &RequestHeader, version: i16, resp: FetchResponse) -> Outcome {
    crate::metrics::record_errors(header.api_key, |counts| {
        resp.error_codes(version, &mut |code| counts.count(code))
    });
    let (parts, body_len) = encode_fetch_response(resp, version);
    let mut head = BytesMut::with_capacity(16);
    head.extend_from_slice(&[0; 4]);
    write_response_header(&mut head, header.api_key, version, header.correlation_id);
    let len = (head.len() - 4 + body_len) as i32;
    head[..4].copy_from_slice(&len.to_be_bytes());
    let mut out = Vec::with_capacity(parts.len() + 1);
    out.push(RecordsChunk::Memory(head.freeze()));
    out.extend(parts);
    Outcome::Reply(out)
}

/// Reads every wanted partition once; returns the partition responses in
/// request order, the record bytes gathered, and whether any partition failed.
async fn read_all(
    wanted: &[Wanted],
    read_committed: bool,
    max_bytes: usize,
) -> (Vec<FetchPartitionResponse>, usize, bool) {
    let mut out = Vec::with_capacity(wanted.len());
    let mut total = 0usize;
    let mut any_error = false;
    for w in wanted {
        let mut p = FetchPartitionResponse {
            index: w.partition,
            error_code: errors::NONE,
            high_watermark: -1,
            last_stable_offset: -1,
            log_start_offset: -1,
            aborted_transactions: None,
            preferred_read_replica: -1,
            records: Vec::new(),
            current_leader: None,
        };
        let state = match &w.target {
            Ok(state) => state,
            Err((e, leader)) => {
                p.error_code = e.code();
                p.current_leader = *leader;
                any_error = true;
                out.push(p);
                continue;
            }
        };
        let log = &state.log;
        p.high_watermark = log.high_watermark().0;
        p.last_stable_offset = state.last_stable_offset();
        p.log_start_offset = log.log_start_offset().0;
        let upper = if read_committed {
            Offset(p.last_stable_offset)
        } else {
            Offset(p.high_watermark)
        };
        if read_committed {
            p.aborted_transactions = Some(state.aborted_overlapping(w.fetch_offset, upper.0));
        }
        let limit = (w.partition_max_bytes.max(0) as usize).min(max_bytes.saturating_sub(total));
        if limit == 0 && total > 0 {
            out.push(p);
            continue;
        }
        match log.read(Offset(w.fetch_offset), limit, upper).await {
            // After the first partition with data, a batch over the limit waits
            // for a later fetch (only the first may exceed, KIP-74).
            Ok(r) if total > 0 && r.bytes > limit => {}
            Ok(r) => {
                total += r.bytes;
                p.records = r.chunks;
            }
            Err(e) => {
                p.error_code = errors::log(&e);
                any_error = true;
            }
        }
        out.push(p);
    }
    (out, total, any_error)
}
