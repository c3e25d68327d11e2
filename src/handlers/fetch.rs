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
//! partitions whose position changed (and those it forgets), and answers
//! only those with news: records, an error, or a high watermark, last
//! stable offset or log start other than the session last told the client.
//! It reads only the partitions that can have news — those its logs
//! flagged since the last response, those it names, and those left active
//! (data still to read, an error) — not the whole session, and a parked
//! incremental fetch waits on the session's one change signal instead of
//! one wait per partition (`log::changes`). Session errors are answered at
//! the top level with no partitions, as Kafka does.
//!
//! read_committed reads stop at the last stable offset and carry the aborted
//! transactions overlapping the range (clients drop those batches).
//!
//! A partition named twice in one request is answered once (Kafka keeps a
//! request's partitions in an insertion-ordered map); a request may name at
//! most [`FETCH_PARTITIONS_MAX`] partitions.
//!
//! A fetcher that sends `last_fetched_epoch` (v12+; followers do, KIP-320)
//! is checked against the log's leader epochs first: where its log
//! diverges from this one, it gets `diverging_epoch` (the epoch and its end
//! offset, to truncate to) and no records; an epoch this log does not know
//! is OFFSET_OUT_OF_RANGE. Kafka runs the same check for any fetcher.
//!
//! A partition led by another shard gets NOT_LEADER_OR_FOLLOWER with the
//! current leader (v12+) and, on v16, that node's endpoint.

use super::error_counts::ResponseErrors;
use super::list_offsets::{check_leader_epoch, READ_COMMITTED};
use super::{decode, errors, Outcome};
use crate::auth::acl::AclOperation;
use crate::handlers::authz::Authz;
use crate::log::changes::ChangeSignal;
use crate::log::PartitionLog;
use crate::metadata::{MetadataImage, TopicMeta};
use crate::partition::Partition;
use crate::protocol::fetch::{
    encode_fetch_response, FetchPartitionResponse, FetchResponse, FetchTopicResponse, NodeEndpoint,
};
use crate::protocol::header::write_response_header;
use crate::protocol::RequestHeader;
use crate::record::RecordsChunk;
use crate::replication::leading::FollowerFetch;
use crate::runtime::OneWaker;
use crate::shard::fetch_sessions::{
    FetchPosition, FetchSession, Resolved, SessionError, SessionPartition, SessionTopic,
    FINAL_EPOCH, INITIAL_EPOCH,
};
use crate::shard::ShardCtx;
use crate::types::Offset;
use bytes::BytesMut;
use futures::future::{self, LocalBoxFuture};
use futures::FutureExt;
use kafka_protocol::messages::fetch_request::FetchPartition;
use kafka_protocol::messages::FetchRequest;
use kafka_protocol::ResponseError;
use std::collections::hash_map::{Entry, HashMap};
use std::rc::Rc;
use std::sync::Arc;
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

/// What a request does with fetch sessions (see `shard::fetch_sessions`).
enum SessionMode {
    /// A full fetch, no session.
    Sessionless,
    /// A full fetch that opens a session.
    Open,
    /// An incremental fetch of this session, which had this generation
    /// when the request read it.
    Incremental(i32, u64),
}

/// One requested partition, resolved.
struct Wanted {
    /// Its topic's place in the response (and, for a full fetch, in the
    /// request's topics).
    topic_index: usize,
    partition: i32,
    pos: FetchPosition,
    /// Its slot in the session and its reading rank there (incremental
    /// fetches).
    slot: u32,
    rank: u64,
    /// The partition if this shard leads it, else the error to answer and
    /// the leader (node id, leader epoch) to name with it.
    target: Target,
}

/// A partition's leader as a response names it: (node id, leader epoch).
type LeaderHint = (i32, i32);

type Target = Result<Rc<Partition>, (ResponseError, Option<LeaderHint>)>;

/// A topic as the request's image knows it (None: no such topic).
type MetaRef<'a> = Option<&'a Arc<TopicMeta>>;

/// `listener`: the connection's listener, whose endpoints leader hints name.
pub async fn handle(
    ctx: &Rc<ShardCtx>,
    listener: usize,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<FetchRequest>(header, body) else {
        return Outcome::Close;
    };
    let version = header.api_version;
    let read_committed = req.isolation_level == READ_COMMITTED;
    let image = ctx.image();
    let replica = Replica::of(&req, version);

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
        (id, _) => SessionMode::Incremental(id, 0),
    };

    // Resolve topics and partitions once, in reading order; `topics` gets
    // one (still empty) answer per topic, in the order topics first appear.
    let mut topics: Vec<FetchTopicResponse> = Vec::new();
    let mut wanted: Vec<Wanted> = Vec::with_capacity(requested);
    // The topics of a session this request opens.
    let mut session_topics: Vec<SessionTopic> = Vec::new();
    // What the partitions resolved under; see `ShardCtx::partitions_stamp`.
    let stamp = ctx.partitions_stamp();
    // Incremental fetches: per session topic, its place in the response
    // and its metadata, set at its first partition read; and the session's
    // change signal, which a parked fetch waits on.
    let mut topic_at: Vec<Option<(usize, MetaRef<'_>)>> = Vec::new();
    let mut signal: Option<Rc<ChangeSignal>> = None;
    let mode = match mode {
        SessionMode::Sessionless | SessionMode::Open => {
            // A topic named twice is one topic; a partition named twice is
            // answered once, at its first place, with the last entry's
            // position and limits (Kafka collects a request's partitions in
            // an insertion-ordered map the same way).
            let mut topic_by_name: HashMap<&str, usize> = HashMap::new();
            let mut topic_by_id: HashMap<[u8; 16], usize> = HashMap::new();
            let mut metas: Vec<MetaRef<'_>> = Vec::new();
            let mut wanted_at: HashMap<(usize, i32), usize> = HashMap::new();
            for t in &req.topics {
                let name: &str = &t.topic.0;
                let id = if uses_topic_ids {
                    *t.topic_id.as_bytes()
                } else {
                    [0; 16]
                };
                let known = if uses_topic_ids {
                    topic_by_id.get(&id)
                } else {
                    topic_by_name.get(name)
                };
                let topic_index = match known {
                    Some(&i) => i,
                    None => {
                        let i = topics.len();
                        if uses_topic_ids {
                            topic_by_id.insert(id, i);
                        } else {
                            topic_by_name.insert(name, i);
                        }
                        let meta = if uses_topic_ids {
                            image.topic_by_id(&id)
                        } else {
                            image.topic(name)
                        };
                        // Topics by id have no name in the request.
                        let key_name = if uses_topic_ids { "" } else { name };
                        topics.push(FetchTopicResponse {
                            name: meta.map_or(key_name, |m| m.name.as_str()).to_string(),
                            topic_id: id,
                            partitions: Vec::new(),
                        });
                        metas.push(meta);
                        if matches!(mode, SessionMode::Open) {
                            session_topics.push(SessionTopic {
                                name: key_name.to_string(),
                                id,
                            });
                        }
                        i
                    }
                };
                let meta = metas[topic_index];
                for p in &t.partitions {
                    let target = resolve(ctx, &image, meta, uses_topic_ids, p.partition);
                    let entry = Wanted {
                        topic_index,
                        partition: p.partition,
                        pos: position(p),
                        slot: 0,
                        rank: 0,
                        target: check_epoch(target, p.current_leader_epoch),
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
            mode
        }
        SessionMode::Incremental(id, _) => {
            let mut cache = ctx.fetch_sessions.borrow_mut();
            let now_ms = crate::clock::now_ms();
            if let Err(e) = cache.begin_incremental(id, req.session_epoch, uses_topic_ids, now_ms) {
                return session_error_response(header, version, e);
            }
            let changed = cache.update(id, |s| {
                for t in &req.topics {
                    for p in &t.partitions {
                        s.upsert(&t.topic.0, t.topic_id.as_bytes(), p.partition, position(p));
                    }
                }
                for f in &req.forgotten_topics_data {
                    for &partition in &f.partitions {
                        s.forget(&f.topic.0, f.topic_id.as_bytes(), partition);
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
            // Only the partitions that can have news (module doc).
            let mut slots = Vec::new();
            session.slots_to_read(stamp, read_committed, &mut slots);
            topic_at.resize(session.topic_slots(), None);
            wanted.reserve(slots.len());
            for slot in slots {
                wanted.push(session_wanted(
                    ctx,
                    &image,
                    session,
                    slot,
                    stamp,
                    uses_topic_ids,
                    &mut topic_at,
                    &mut topics,
                ));
            }
            signal = Some(session.signal.clone());
            SessionMode::Incremental(id, session.generation)
        }
    };

    // Kafka's Fetch check: READ on each topic, once topic ids are resolved
    // (an unknown id stays UNKNOWN_TOPIC_ID; a topic named but unknown is
    // refused before its absence shows).
    // A follower's fetch needs CLUSTER_ACTION instead, and without it
    // every partition is TOPIC_AUTHORIZATION_FAILED (Kafka's
    // `handleFetchRequest`).
    if authz.enabled() && replica.is_some() {
        if !authz.cluster(AclOperation::ClusterAction) {
            for w in &mut wanted {
                w.target = Err((ResponseError::TopicAuthorizationFailed, None));
            }
        }
    } else if authz.enabled() {
        let allowed: Vec<bool> = topics
            .iter()
            .map(|t| t.name.is_empty() || authz.topic(AclOperation::Read, &t.name))
            .collect();
        for w in &mut wanted {
            if !allowed[w.topic_index] {
                w.target = Err((ResponseError::TopicAuthorizationFailed, None));
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
        let (partitions, bytes, any_error) =
            read_all(ctx, &image, replica, &wanted, read_committed, max_bytes).await;
        let now = crate::clock::monotonic();
        if any_error || bytes >= min_bytes || now >= deadline {
            break partitions;
        }
        if let (Some(signal), SessionMode::Incremental(id, generation)) = (&signal, &mode) {
            // One wait for the whole session: any of its partitions changing
            // (or a new request of the session superseding this one) ends it.
            if !signal.any() {
                let timer = std::pin::pin!(glommio::timer::sleep(deadline - now));
                let changed = signal.changed();
                let _ = crate::metrics::remote_wait(future::select(changed, timer)).await;
            }
            // The partitions flagged meanwhile join the read; a session
            // closed or used by a newer request meanwhile ends the wait
            // with what is here.
            let current = {
                let mut cache = ctx.fetch_sessions.borrow_mut();
                match cache.get_mut(*id).filter(|s| s.generation == *generation) {
                    Some(session) => {
                        let mut fresh = Vec::new();
                        session.take_flagged(&mut fresh);
                        if !fresh.is_empty() {
                            for slot in fresh {
                                wanted.push(session_wanted(
                                    ctx,
                                    &image,
                                    session,
                                    slot,
                                    stamp,
                                    uses_topic_ids,
                                    &mut topic_at,
                                    &mut topics,
                                ));
                            }
                            wanted.sort_by_key(|w| w.rank);
                        }
                        true
                    }
                    None => false,
                }
            };
            if !current || crate::clock::monotonic() >= deadline {
                let (partitions, _, _) =
                    read_all(ctx, &image, replica, &wanted, read_committed, max_bytes).await;
                break partitions;
            }
            continue;
        }
        // Park until a partition has something new: its high watermark
        // moves past both the fetch offset and the HW this read saw (the HW
        // is the next offset, so waiting for "above HW - 1" would be ready at
        // once and spin). Under read_committed the HW may be past the fetch
        // offset while the LSO is not: the marker that moves the LSO moves
        // the HW too. Using the HW read above loses no wake-up.
        // A follower's read waits for the log end instead (it reads up to
        // it, not the HW).
        let mut waits: Vec<LocalBoxFuture<'_, ()>> = wanted
            .iter()
            .zip(&partitions)
            .filter_map(|(w, p)| {
                let state = w.target.as_ref().ok()?;
                let log = &state.log;
                Some(match follower_of(&image, replica, state) {
                    Some(_) => log
                        .wait_written(Offset(w.pos.fetch_offset))
                        .map(|_| ())
                        .boxed_local(),
                    None => log
                        .wait_for_hw_above(Offset(w.pos.fetch_offset.max(p.high_watermark)))
                        .boxed_local(),
                })
            })
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
            let (partitions, _, _) =
                read_all(ctx, &image, replica, &wanted, read_committed, max_bytes).await;
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
                    let mut s = SessionPartition::new(w.topic_index as u32, w.partition, w.pos);
                    s.remember(p.high_watermark, p.last_stable_offset, p.log_start_offset);
                    s.resolved = w.target.as_ref().ok().map(|state| Resolved {
                        partition: Rc::downgrade(state),
                        stamp,
                    });
                    // The session subscribes from now on: a partition whose
                    // offsets moved since it was read is read next time.
                    s.quiet = quiet(w, p, read_committed)
                        && w.target.as_ref().is_ok_and(|state| {
                            state.log.high_watermark().0 == p.high_watermark
                                && state.last_stable_offset() == p.last_stable_offset
                                && state.log.log_start_offset().0 == p.log_start_offset
                        });
                    s
                })
                .collect();
            let partitions = wanted.len();
            let opened = ctx.fetch_sessions.borrow_mut().create(
                session_topics,
                cached,
                uses_topic_ids,
                crate::clock::now_ms(),
                Some((stamp, read_committed)),
            );
            tracing::debug!(
                session = opened,
                partitions,
                "full fetch with epoch 0: fetch session opened (None: no slot)"
            );
            opened.unwrap_or(0)
        }
        SessionMode::Incremental(id, _) => id,
    };
    match mode {
        SessionMode::Incremental(id, generation) => {
            // Only the partitions with news, as Kafka's
            // IncrementalFetchContext answers; those that returned records
            // are read last next time, those with nothing left to read and
            // nothing new are not read again until their log flags them. A
            // session closed or used by another request while this one
            // waited is left alone (what this one took from its signal is
            // flagged again), and everything read is answered.
            let mut cache = ctx.fetch_sessions.borrow_mut();
            let mut session = cache.get_mut(id).filter(|s| s.generation == generation);
            for (w, p) in wanted.iter().zip(partitions) {
                let cached = session.as_mut().and_then(|s| s.slot_mut(w.slot));
                let news = match cached {
                    None => true,
                    Some(c) => {
                        let news = !p.records.is_empty()
                            || p.error_code != errors::NONE
                            || c.high_watermark != p.high_watermark
                            || c.last_stable_offset != p.last_stable_offset
                            || c.log_start_offset != p.log_start_offset;
                        c.remember(p.high_watermark, p.last_stable_offset, p.log_start_offset);
                        c.had_records = !p.records.is_empty();
                        c.quiet = quiet(w, &p, read_committed);
                        news
                    }
                };
                if news {
                    topics[w.topic_index].partitions.push(p);
                }
            }
            match session {
                Some(s) => s.settle_read(wanted.iter().map(|w| w.slot), stamp, read_committed),
                None => {
                    if let Some(s) = cache.get_mut(id) {
                        for w in &wanted {
                            s.signal.flag(w.slot);
                        }
                    }
                }
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
                let (host, port) = ctx.config.endpoint(listener, shard);
                node_endpoints.push(NodeEndpoint {
                    node_id: node,
                    host,
                    port,
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

/// Whether a session partition needs no read until its log flags it: no
/// error, no records returned, nothing left below the offset a read stops
/// at (the HW, or the LSO under read_committed).
fn quiet(w: &Wanted, p: &FetchPartitionResponse, read_committed: bool) -> bool {
    let upper = if read_committed {
        p.last_stable_offset
    } else {
        p.high_watermark
    };
    w.target.is_ok()
        && p.error_code == errors::NONE
        && p.records.is_empty()
        && p.diverging_epoch.is_none()
        && w.pos.fetch_offset >= upper
}

/// The [`Wanted`] of session slot `slot`: its handle as the last fetch
/// resolved it while the shard's partitions are unchanged, else a look-up
/// by name, which (re)subscribes the session to the partition's changes.
/// `topic_at` gives each session topic its place in `topics` (the
/// response) at its first partition.
#[allow(clippy::too_many_arguments)]
fn session_wanted<'a>(
    ctx: &ShardCtx,
    image: &'a MetadataImage,
    session: &mut FetchSession,
    slot: u32,
    stamp: (u64, u64),
    uses_topic_ids: bool,
    topic_at: &mut [Option<(usize, MetaRef<'a>)>],
    topics: &mut Vec<FetchTopicResponse>,
) -> Wanted {
    let rank = session.rank_of(slot);
    let signal = session.signal.clone();
    let p = session.slot_mut(slot).expect("a chosen slot is live");
    let topic_index = p.topic;
    let (response_index, meta) = match topic_at[topic_index as usize] {
        Some(at) => at,
        None => {
            let topic = session.topic(topic_index);
            let meta = if uses_topic_ids {
                image.topic_by_id(&topic.id)
            } else {
                image.topic(&topic.name)
            };
            topics.push(FetchTopicResponse {
                name: meta
                    .map_or(topic.name.as_str(), |m| m.name.as_str())
                    .to_string(),
                topic_id: topic.id,
                partitions: Vec::new(),
            });
            let at = (topics.len() - 1, meta);
            topic_at[topic_index as usize] = Some(at);
            at
        }
    };
    let p = session.slot_mut(slot).expect("a chosen slot is live");
    let cached = p
        .resolved
        .as_ref()
        .filter(|r| r.stamp == stamp)
        .and_then(|r| r.partition.upgrade());
    let target = match cached {
        Some(state) => Ok(state),
        None => {
            let target = resolve(ctx, image, meta, uses_topic_ids, p.partition);
            let old = p.handle();
            if let Ok(state) = &target {
                // Subscribing scans the log's list: skipped when the
                // partition is the one this slot already follows.
                match old {
                    Some(old) if Rc::ptr_eq(&old, state) => {}
                    Some(old) => {
                        old.log.unsubscribe(&signal, slot);
                        state.log.subscribe(&signal, slot);
                    }
                    None => state.log.subscribe(&signal, slot),
                }
            }
            p.resolved = target.as_ref().ok().map(|state| Resolved {
                partition: Rc::downgrade(state),
                stamp,
            });
            target
        }
    };
    Wanted {
        topic_index: response_index,
        partition: p.partition,
        pos: p.pos,
        slot,
        rank,
        target: check_epoch(target, p.pos.current_leader_epoch),
    }
}

/// `handlers::led_partition` with the topic already found (`meta`, None
/// when the image has no such topic): the partition if this shard leads
/// it, without allocating.
fn resolve(
    ctx: &ShardCtx,
    image: &MetadataImage,
    meta: MetaRef<'_>,
    uses_topic_ids: bool,
    partition: i32,
) -> Target {
    let Some(meta) = meta else {
        let unknown = if uses_topic_ids {
            ResponseError::UnknownTopicId
        } else {
            ResponseError::UnknownTopicOrPartition
        };
        return Err((unknown, None));
    };
    let leader = super::leading_shard(ctx, image, &meta.name, partition).map_err(|e| (e, None))?;
    if leader != ctx.shard {
        let epoch = meta
            .replica_state(partition)
            .map_or(image.leader_epoch(), |s| s.leader_epoch);
        let hint = (ctx.config.node_id_of(leader), epoch);
        return Err((ResponseError::NotLeaderOrFollower, Some(hint)));
    }
    ctx.partition_of(&meta.name, partition)
        .ok_or((ResponseError::NotLeaderOrFollower, None))
}

/// The request's position for one partition.
fn position(p: &FetchPartition) -> FetchPosition {
    FetchPosition {
        fetch_offset: p.fetch_offset,
        partition_max_bytes: p.partition_max_bytes,
        current_leader_epoch: p.current_leader_epoch,
        last_fetched_epoch: p.last_fetched_epoch,
        log_start_offset: p.log_start_offset,
    }
}

/// KIP-320's check of a fetcher's `last_fetched_epoch`
/// (`replication::leading::diverging`).
fn diverging(pos: &FetchPosition, log: &PartitionLog) -> Result<Option<(i32, i64)>, ResponseError> {
    crate::replication::leading::diverging(pos.last_fetched_epoch, pos.fetch_offset, log)
}

/// FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH for a client whose
/// `current_leader_epoch` is not the partition's.
fn check_epoch(target: Target, current_leader_epoch: i32) -> Target {
    let state = target?;
    match check_leader_epoch(current_leader_epoch, state.log.leader_epoch()) {
        Some(e) => Err((e, None)),
        None => Ok(state),
    }
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

/// The fetching replica (v15+ `ReplicaState`, earlier `replica_id`), when
/// a broker fetches as a follower: its broker id and broker epoch.
#[derive(Clone, Copy, Debug)]
struct Replica {
    id: i32,
    broker_epoch: i64,
}

impl Replica {
    fn of(req: &FetchRequest, version: i16) -> Option<Replica> {
        let (id, broker_epoch) = if version >= 15 {
            (
                req.replica_state.replica_id.0,
                req.replica_state.replica_epoch,
            )
        } else {
            (req.replica_id.0, -1)
        };
        (id >= 0).then_some(Replica { id, broker_epoch })
    }
}

/// The replicated state of `state` when `replica` fetches it as a
/// follower of this leader (`docs/replication.md` §4.3). A replica's fetch
/// of a partition that is not replicated (a single node's) is read as a
/// consumer's: there is no follower to record.
fn follower_of<'a>(
    image: &'a MetadataImage,
    replica: Option<Replica>,
    state: &Partition,
) -> Option<(Replica, &'a crate::metadata::PartitionState)> {
    let replica = replica?;
    let ps = image
        .topic(&state.tp.topic)?
        .replica_state(state.tp.partition.0)?;
    Some((replica, ps))
}

/// Reads every wanted partition once; returns the partition responses in
/// request order, the record bytes gathered, and whether any partition failed.
/// A follower's read (`replica`, of a replicated partition this shard
/// leads) is first recorded in the partition's leader state, which may
/// move the HW; it reads up to the log end.
async fn read_all(
    ctx: &Rc<ShardCtx>,
    image: &MetadataImage,
    replica: Option<Replica>,
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
            diverging_epoch: None,
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
        match diverging(&w.pos, log) {
            Ok(None) => {}
            Ok(Some(epoch_end)) => {
                // No records: the fetcher truncates to the end first.
                p.diverging_epoch = Some(epoch_end);
                any_error = true;
                out.push(p);
                continue;
            }
            Err(e) => {
                p.error_code = e.code();
                any_error = true;
                out.push(p);
                continue;
            }
        }
        // A follower ahead of this log is not recorded: its read below is
        // OFFSET_OUT_OF_RANGE (Kafka reads before it records).
        let follower = follower_of(image, replica, state)
            .filter(|_| w.pos.fetch_offset <= log.log_end_offset().0);
        if let Some((r, ps)) = follower {
            let fetch = FollowerFetch {
                replica: r.id,
                broker_epoch: r.broker_epoch,
                fetch_offset: w.pos.fetch_offset,
                log_start: w.pos.log_start_offset,
            };
            let me = ctx.config.node_id_of(ctx.shard);
            let recorded = ctx
                .leading
                .record_fetch(state, ps, me, fetch, |b| image.live_broker_epoch(b));
            if let Ok(Some(expand)) = &recorded {
                ctx.alter_isr(expand.clone());
            }
            if recorded.is_err() {
                p.error_code = if w.pos.current_leader_epoch >= 0 {
                    ResponseError::UnknownLeaderEpoch.code()
                } else {
                    ResponseError::NotLeaderOrFollower.code()
                };
                any_error = true;
                out.push(p);
                continue;
            }
            p.high_watermark = log.high_watermark().0;
            p.last_stable_offset = state.last_stable_offset();
        }
        let upper = if follower.is_some() {
            log.written_offset()
        } else if read_committed {
            Offset(p.last_stable_offset)
        } else {
            Offset(p.high_watermark)
        };
        if read_committed && follower.is_none() {
            p.aborted_transactions = Some(state.aborted_overlapping(w.pos.fetch_offset, upper.0));
        }
        let limit =
            (w.pos.partition_max_bytes.max(0) as usize).min(max_bytes.saturating_sub(total));
        if limit == 0 && total > 0 {
            out.push(p);
            continue;
        }
        match log.read(Offset(w.pos.fetch_offset), limit, upper).await {
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
