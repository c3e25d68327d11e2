//! The orchestrator's own requests to the broker, each with a fresh
//! librdkafka client and a bounded timeout: topic creation, watermarks and
//! last stable offsets (ListOffsets with either isolation level), the
//! group's committed offsets (OffsetFetch), DeleteRecords, and the final
//! read-back of every partition from its log start.
//!
//! Runs on the orchestrator's thread only.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

use super::history::{ChaosTopic, Tp};
use super::value::{self, DecodeError, ValueMeta};
use super::ChaosError;

/// Timeout of one admin, metadata, ListOffsets or OffsetFetch request.
pub const REQUEST_TIMEOUT_MS: u64 = 10_000;
/// How long topics may take to have a leader for every partition.
pub const TOPIC_READY_TIMEOUT_MS: u64 = 30_000;
/// The read-back gives up on a partition that made no progress this long.
pub const READBACK_STALL_TIMEOUT_MS: u64 = 30_000;
/// The read-back of one topic takes at most this long in all.
pub const READBACK_TIMEOUT_MS: u64 = 30 * 60 * 1000;
/// Consumer poll timeout during the read-back.
pub const READBACK_POLL_MS: u64 = 100;
/// Pause between attempts of a request that failed while the broker loads.
pub const ATTEMPT_PAUSE_MS: u64 = 250;
/// Consumer errors kept per partition read (the rest are only counted).
pub const READ_ERRORS_KEPT_MAX: usize = 20;

/// Which records a consumer sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Isolation {
    ReadUncommitted,
    ReadCommitted,
}

impl Isolation {
    fn config(self) -> &'static str {
        match self {
            Isolation::ReadUncommitted => "read_uncommitted",
            Isolation::ReadCommitted => "read_committed",
        }
    }
}

/// One record read back.
#[derive(Clone, Debug)]
pub struct ReadRecord {
    pub offset: i64,
    pub value: Result<ValueMeta, DecodeError>,
}

/// One partition read from its log start to its end.
#[derive(Clone, Debug)]
pub struct PartitionRead {
    pub tp: Tp,
    pub isolation: Isolation,
    /// Log start and end (HW, or LSO for read_committed) before the read.
    pub log_start: i64,
    pub end: i64,
    /// In offset order, as the consumer delivered them.
    pub records: Vec<ReadRecord>,
    /// False when the read stalled before the end.
    pub complete: bool,
    pub errors: Vec<String>,
}

/// A partition's read_committed end (LSO) against its high watermark at
/// the end of the run.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct LsoState {
    pub tp: Tp,
    pub high_watermark: i64,
    pub last_stable: i64,
    /// How long it took LSO to reach the high watermark (the whole wait if
    /// it never did).
    pub waited_ms: u64,
}

fn config(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("socket.timeout.ms", REQUEST_TIMEOUT_MS.to_string())
        .set("reconnect.backoff.max.ms", "1000")
        .set_log_level(RDKafkaLogLevel::Error);
    c
}

fn kafka(what: impl Into<String>) -> impl FnOnce(KafkaError) -> ChaosError {
    let what = what.into();
    move |source| ChaosError::Kafka { what, source }
}

fn consumer(
    bootstrap: &str,
    group: &str,
    isolation: Isolation,
) -> Result<BaseConsumer, ChaosError> {
    let mut c = config(bootstrap);
    c.set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "100")
        .set("check.crcs", "true")
        .set("isolation.level", isolation.config());
    c.create().map_err(kafka("creating a read-back consumer"))
}

fn admin(bootstrap: &str) -> Result<AdminClient<DefaultClientContext>, ChaosError> {
    config(bootstrap)
        .create()
        .map_err(kafka("creating an admin client"))
}

fn admin_opts() -> AdminOptions {
    let t = Some(Duration::from_millis(REQUEST_TIMEOUT_MS));
    AdminOptions::new().request_timeout(t).operation_timeout(t)
}

/// A topic to create: name, partitions and configs.
pub struct TopicSpec {
    pub topic: ChaosTopic,
    pub partitions: i32,
    pub configs: Vec<(&'static str, String)>,
}

/// Creates the topics with `replication_factor` replicas per partition
/// and waits until every partition has a leader.
pub fn create_topics(
    bootstrap: &str,
    specs: &[TopicSpec],
    replication_factor: i32,
) -> Result<(), ChaosError> {
    let admin = admin(bootstrap)?;
    let new: Vec<NewTopic<'_>> = specs
        .iter()
        .map(|s| {
            s.configs.iter().fold(
                NewTopic::new(
                    s.topic.name(),
                    s.partitions,
                    TopicReplication::Fixed(replication_factor),
                ),
                |t, (k, v)| t.set(k, v),
            )
        })
        .collect();
    let deadline = Instant::now() + Duration::from_millis(TOPIC_READY_TIMEOUT_MS);
    // INVALID_REPLICATION_FACTOR while a node's registration or unfencing
    // is not yet in the controller's image: retried until the deadline.
    loop {
        let results = futures::executor::block_on(admin.create_topics(&new, &admin_opts()))
            .map_err(kafka("CreateTopics"))?;
        let mut retry = false;
        for r in results {
            if let Err((t, code)) = r {
                match code {
                    RDKafkaErrorCode::TopicAlreadyExists => {}
                    RDKafkaErrorCode::InvalidReplicationFactor if Instant::now() < deadline => {
                        retry = true
                    }
                    _ => return Err(ChaosError::Broker(format!("creating topic {t}: {code}"))),
                }
            }
        }
        if !retry {
            break;
        }
        std::thread::sleep(Duration::from_millis(ATTEMPT_PAUSE_MS));
    }
    let c = consumer(bootstrap, "chaos-setup", Isolation::ReadUncommitted)?;
    for s in specs {
        loop {
            let md = c
                .fetch_metadata(
                    Some(s.topic.name()),
                    Duration::from_millis(REQUEST_TIMEOUT_MS),
                )
                .map_err(kafka("Metadata"))?;
            let led = md
                .topics()
                .iter()
                .find(|t| t.name() == s.topic.name() && t.error().is_none())
                .map(|t| t.partitions().iter().filter(|p| p.leader() >= 0).count())
                .unwrap_or(0);
            if led >= s.partitions as usize {
                break;
            }
            if Instant::now() > deadline {
                return Err(ChaosError::Broker(format!(
                    "topic {} has {led} of {} partitions with a leader after {TOPIC_READY_TIMEOUT_MS} ms",
                    s.topic.name(),
                    s.partitions
                )));
            }
            std::thread::sleep(Duration::from_millis(ATTEMPT_PAUSE_MS));
        }
    }
    Ok(())
}

/// Retries `f` until it succeeds or `timeout` passes (a restarted broker
/// answers some requests with "loading" for a moment).
fn with_retries<T>(
    timeout: Duration,
    mut f: impl FnMut() -> Result<T, ChaosError>,
) -> Result<T, ChaosError> {
    let deadline = Instant::now() + timeout;
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(ATTEMPT_PAUSE_MS)),
        }
    }
}

/// (log start, end) of each partition, the end being the high watermark
/// (read_uncommitted) or the last stable offset (read_committed).
pub fn watermarks(
    bootstrap: &str,
    isolation: Isolation,
    tps: &[Tp],
    timeout: Duration,
) -> Result<BTreeMap<Tp, (i64, i64)>, ChaosError> {
    let c = consumer(bootstrap, "chaos-watermarks", isolation)?;
    let mut out = BTreeMap::new();
    for &tp in tps {
        let w = with_retries(timeout, || {
            c.fetch_watermarks(
                tp.topic.name(),
                tp.partition,
                Duration::from_millis(REQUEST_TIMEOUT_MS),
            )
            .map_err(kafka(format!("ListOffsets {tp}")))
        })?;
        out.insert(tp, w);
    }
    Ok(out)
}

/// Waits (at most `timeout`) until every partition's last stable offset
/// equals its high watermark, and returns where each ended.
pub fn wait_lso(
    bootstrap: &str,
    tps: &[Tp],
    timeout: Duration,
) -> Result<Vec<LsoState>, ChaosError> {
    let start = Instant::now();
    let deadline = start + timeout;
    let mut reached: BTreeMap<Tp, u64> = BTreeMap::new();
    loop {
        let hw = watermarks(bootstrap, Isolation::ReadUncommitted, tps, timeout)?;
        let lso = watermarks(bootstrap, Isolation::ReadCommitted, tps, timeout)?;
        for &tp in tps {
            if lso[&tp].1 >= hw[&tp].1 {
                reached
                    .entry(tp)
                    .or_insert(start.elapsed().as_millis() as u64);
            }
        }
        if reached.len() == tps.len() || Instant::now() >= deadline {
            return Ok(tps
                .iter()
                .map(|&tp| LsoState {
                    tp,
                    high_watermark: hw[&tp].1,
                    last_stable: lso[&tp].1,
                    waited_ms: reached
                        .get(&tp)
                        .copied()
                        .unwrap_or(start.elapsed().as_millis() as u64),
                })
                .collect());
        }
        std::thread::sleep(Duration::from_millis(ATTEMPT_PAUSE_MS));
    }
}

/// The group's committed offsets for `partitions` of the idempotent topic
/// (OffsetFetch); None for a partition with no committed offset.
pub fn committed_offsets(
    bootstrap: &str,
    group: &str,
    partitions: i32,
    timeout: Duration,
) -> Result<BTreeMap<i32, Option<i64>>, ChaosError> {
    // A client that never subscribes: it fetches the group's offsets
    // without joining it.
    let c = consumer(bootstrap, group, Isolation::ReadUncommitted)?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(ChaosTopic::Idem.name(), p);
    }
    let got = with_retries(timeout, || {
        let got = c
            .committed_offsets(tpl.clone(), Duration::from_millis(REQUEST_TIMEOUT_MS))
            .map_err(kafka("OffsetFetch"))?;
        // A partition answered with an error (e.g. the coordinator still
        // loading) is retried rather than read as "no offset".
        if let Some(e) = got.elements().iter().find_map(|e| e.error().err()) {
            return Err(ChaosError::Kafka {
                what: "OffsetFetch partition".to_string(),
                source: e,
            });
        }
        Ok(got)
    })?;
    Ok(got
        .elements()
        .iter()
        .map(|e| {
            let o = match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            };
            (e.partition(), o)
        })
        .collect())
}

/// Deletes the records of `tp` below `offset`; returns the new log start.
pub fn delete_records(bootstrap: &str, tp: Tp, offset: i64) -> Result<i64, ChaosError> {
    let admin = admin(bootstrap)?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(tp.topic.name(), tp.partition, Offset::Offset(offset))
        .map_err(kafka("DeleteRecords offsets"))?;
    let got = futures::executor::block_on(admin.delete_records(&tpl, &admin_opts()))
        .map_err(kafka(format!("DeleteRecords {tp}")))?;
    let e = got
        .find_partition(tp.topic.name(), tp.partition)
        .ok_or_else(|| ChaosError::Broker(format!("DeleteRecords answered without {tp}")))?;
    e.error().map_err(kafka(format!("DeleteRecords {tp}")))?;
    match e.offset() {
        Offset::Offset(o) => Ok(o),
        other => Err(ChaosError::Broker(format!(
            "DeleteRecords {tp} answered log start {other:?}"
        ))),
    }
}

/// Reads every partition of `topic` from its log start to its end (the
/// end-of-partition event), decoding every value.
pub fn read_topic(
    bootstrap: &str,
    topic: ChaosTopic,
    partitions: i32,
    isolation: Isolation,
) -> Result<Vec<PartitionRead>, ChaosError> {
    let tps: Vec<Tp> = (0..partitions)
        .map(|partition| Tp { topic, partition })
        .collect();
    let timeout = Duration::from_millis(TOPIC_READY_TIMEOUT_MS);
    let marks = watermarks(bootstrap, isolation, &tps, timeout)?;
    let c = consumer(bootstrap, "chaos-readback", isolation)?;
    let mut tpl = TopicPartitionList::new();
    for tp in &tps {
        tpl.add_partition_offset(topic.name(), tp.partition, Offset::Beginning)
            .map_err(kafka("read-back assignment"))?;
    }
    c.assign(&tpl).map_err(kafka("read-back assign"))?;
    let mut reads: BTreeMap<i32, PartitionRead> = tps
        .iter()
        .map(|&tp| {
            let (log_start, end) = marks[&tp];
            (
                tp.partition,
                PartitionRead {
                    tp,
                    isolation,
                    log_start,
                    end,
                    records: Vec::new(),
                    complete: false,
                    errors: Vec::new(),
                },
            )
        })
        .collect();
    let mut done: BTreeSet<i32> = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_millis(READBACK_TIMEOUT_MS);
    let mut progress = Instant::now();
    while done.len() < tps.len() {
        let now = Instant::now();
        if now >= deadline
            || now.duration_since(progress) > Duration::from_millis(READBACK_STALL_TIMEOUT_MS)
        {
            break;
        }
        match c.poll(Duration::from_millis(READBACK_POLL_MS)) {
            None => {}
            Some(Ok(m)) => {
                progress = Instant::now();
                let value = match m.payload() {
                    Some(p) => value::decode(p),
                    None => Err(DecodeError::Missing),
                };
                if let Some(r) = reads.get_mut(&m.partition()) {
                    r.records.push(ReadRecord {
                        offset: m.offset(),
                        value,
                    });
                }
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                progress = Instant::now();
                done.insert(p);
            }
            Some(Err(e)) => {
                // Not progress: a partition that only yields errors stalls.
                let s = e.to_string();
                for r in reads.values_mut() {
                    if !done.contains(&r.tp.partition) && r.errors.len() < READ_ERRORS_KEPT_MAX {
                        r.errors.push(s.clone());
                    }
                }
            }
        }
    }
    for (p, r) in reads.iter_mut() {
        r.complete = done.contains(p);
    }
    Ok(reads.into_values().collect())
}

/// What Metadata says of one partition: its leader's broker id (-1 for
/// none), its replicas and in-sync replicas (broker ids).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PartitionState {
    pub leader: i32,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
}

/// Metadata of the workload topics through `consumer` (one request).
pub fn partition_states_with(
    consumer: &BaseConsumer,
    timeout: Duration,
) -> Result<BTreeMap<Tp, PartitionState>, ChaosError> {
    let md = consumer
        .fetch_metadata(None, timeout)
        .map_err(kafka("Metadata"))?;
    let mut out = BTreeMap::new();
    for t in md.topics() {
        let Some(topic) = ChaosTopic::ALL.into_iter().find(|c| c.name() == t.name()) else {
            continue;
        };
        if t.error().is_some() {
            continue;
        }
        for p in t.partitions() {
            out.insert(
                Tp {
                    topic,
                    partition: p.id(),
                },
                PartitionState {
                    leader: p.leader(),
                    replicas: p.replicas().to_vec(),
                    isr: p.isr().to_vec(),
                },
            );
        }
    }
    Ok(out)
}

/// A client for [`partition_states_with`].
pub fn metadata_client(bootstrap: &str) -> Result<BaseConsumer, ChaosError> {
    consumer(bootstrap, "chaos-metadata", Isolation::ReadUncommitted)
}

/// Metadata of the workload topics, with a fresh client.
pub fn partition_states(
    bootstrap: &str,
    timeout: Duration,
) -> Result<BTreeMap<Tp, PartitionState>, ChaosError> {
    partition_states_with(&metadata_client(bootstrap)?, timeout)
}

/// The broker ids Metadata lists (the live, unfenced shards of every node).
pub fn broker_ids(bootstrap: &str, timeout: Duration) -> Result<Vec<i32>, ChaosError> {
    let c = metadata_client(bootstrap)?;
    let md = c
        .fetch_metadata(Some(ChaosTopic::Idem.name()), timeout)
        .map_err(kafka("Metadata"))?;
    Ok(md.brokers().iter().map(|b| b.id()).collect())
}
