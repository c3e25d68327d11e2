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
//! shard wake it. Fetch sessions (KIP-227) are not kept: every response says
//! session 0, which clients treat as "full fetch each time".
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
use crate::shard::ShardCtx;
use crate::types::Offset;
use bytes::BytesMut;
use futures::future::{self, LocalBoxFuture};
use futures::FutureExt;
use kafka_protocol::messages::FetchRequest;
use kafka_protocol::ResponseError;
use std::collections::hash_map::{Entry, HashMap};
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

/// One requested partition, resolved.
struct Wanted {
    topic_index: usize,
    partition: i32,
    fetch_offset: i64,
    partition_max_bytes: i32,
    /// The partition if this shard leads it, else the error to answer and
    /// the leader (node id, leader epoch) to name with it.
    target: Result<Rc<Partition>, (ResponseError, Option<(i32, i32)>)>,
}

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
    let mut topics: Vec<FetchTopicResponse> = Vec::with_capacity(req.topics.len());
    let mut wanted: Vec<Wanted> = Vec::new();
    let mut topic_at: HashMap<String, usize> = HashMap::new();
    let mut wanted_at: HashMap<(usize, i32), usize> = HashMap::new();
    for t in &req.topics {
        let meta = if version >= 13 {
            image.topic_by_id(t.topic_id.as_bytes())
        } else {
            image.topic(t.topic.0.as_str())
        };
        let unknown = if version >= 13 {
            ResponseError::UnknownTopicId
        } else {
            ResponseError::UnknownTopicOrPartition
        };
        let name = meta
            .map(|m| m.name.clone())
            .unwrap_or_else(|| t.topic.0.to_string());
        let key = if version >= 13 {
            uuid::Uuid::from_bytes(*t.topic_id.as_bytes()).to_string()
        } else {
            name.clone()
        };
        let topic_index = *topic_at.entry(key).or_insert_with(|| {
            topics.push(FetchTopicResponse {
                name: name.clone(),
                topic_id: *t.topic_id.as_bytes(),
                partitions: Vec::with_capacity(t.partitions.len()),
            });
            topics.len() - 1
        });
        for p in &t.partitions {
            let target = match meta {
                None => Err((unknown, None)),
                Some(_) => match led_partition(ctx, &image, &name, p.partition) {
                    Err((e, leader)) => Err((
                        e,
                        leader.map(|s| (ctx.config.node_id_of(s), image.leader_epoch())),
                    )),
                    Ok(state) => {
                        match check_leader_epoch(p.current_leader_epoch, state.log.leader_epoch()) {
                            Some(e) => Err((e, None)),
                            None => Ok(state),
                        }
                    }
                },
            };
            let entry = Wanted {
                topic_index,
                partition: p.partition,
                fetch_offset: p.fetch_offset,
                partition_max_bytes: p.partition_max_bytes,
                target,
            };
            match wanted_at.entry((topic_index, p.partition)) {
                Entry::Occupied(at) => wanted[*at.get()] = entry,
                Entry::Vacant(at) => {
                    at.insert(wanted.len());
                    wanted.push(entry);
                }
            }
        }
    }

    let session_error = req.session_id != 0;
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
        if session_error || any_error || bytes >= min_bytes || now >= deadline {
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

    for (w, p) in wanted.iter().zip(partitions) {
        topics[w.topic_index].partitions.push(p);
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
        error_code: if session_error {
            ResponseError::FetchSessionIdNotFound.code()
        } else {
            errors::NONE
        },
        session_id: 0,
        topics: if session_error { Vec::new() } else { topics },
        node_endpoints,
    };
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
