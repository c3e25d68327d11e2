//! The chaos workload's Kafka clients (librdkafka through `rdkafka`), one OS
//! thread each: idempotent producers, transactional producers and a group
//! consumer. They run until the orchestrator sets the stop flag, through
//! every kill and restart of the broker, and record what they did in their
//! [`History`](super::history) records.
//!
//! Surviving restarts: librdkafka reconnects by itself (the reconnect
//! backoff is capped at [`RECONNECT_BACKOFF_MAX_MS`] so that a restarted
//! broker is found within a second) and retries produce requests until
//! `message.timeout.ms`. A producer whose client reports a fatal error
//! (e.g. an idempotence sequence error) is dropped and recreated: a new
//! *session*. A transactional producer recreates its client with the same
//! `transactional.id` whenever a transaction call fails in a way that leaves
//! its outcome unknown; the new client's InitProducerId fences the old one
//! and finishes or aborts whatever the old one left open.
//!
//! Every wait is bounded: sends by the message timeout, transaction calls
//! by [`TXN_CALL_TIMEOUT_MS`] (with at most [`TXN_END_ATTEMPTS_MAX`]
//! attempts), the final flush by [`FLUSH_AT_END_TIMEOUT_MS`].

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use super::history::{
    ChaosTopic, ClientEvent, CommitAck, GroupHistory, MsgOutcome, MsgRecord, Tp, TxnOutcome,
    TxnRecord,
};
use super::value::{self, MsgId, ValueMeta};
use super::ChaosError;

/// Default `message.timeout.ms` of idempotent producers
/// (`--idempotent-message-timeout-ms`): longer than any outage the
/// orchestrator makes (`LONG_OUTAGE_MS` plus the restart), so that no
/// idempotent message ever times out.
///
/// That is deliberate. When messages time out, librdkafka's idempotent
/// producer bumps its epoch locally and re-sends the messages still queued
/// from sequence 0 of the new epoch, including messages of a request whose
/// answer it gave up on but which the broker had stored: every broker must
/// accept them (a new epoch starting at sequence 0), so they are stored
/// twice. librdkafka documents this (confluentinc/librdkafka#4953: only
/// transactions avoid it), and an earlier version of this checker, with a
/// 12 s timeout and 17 s outages, found exactly that; see
/// `tuning/results/chaos.md`. With the timeout above every outage, and
/// one request in flight ([`IDEM_MAX_IN_FLIGHT`]: librdkafka bumps its
/// epoch on another error too), a duplicate is the broker's.
pub const IDEM_MESSAGE_TIMEOUT_MS: u64 = 60_000;
/// `max.in.flight.requests.per.connection` of idempotent producers
/// (`--idempotent-max-in-flight`): one, for the same reason as
/// [`IDEM_MESSAGE_TIMEOUT_MS`]. With more, a request R1 that a broker
/// refuses without writing it (NOT_LEADER_OR_FOLLOWER from a new leader
/// that has not applied its leadership yet, NOT_ENOUGH_REPLICAS) makes the
/// requests behind it for that partition fail with
/// OUT_OF_ORDER_SEQUENCE_NUMBER, as every broker must answer them; on those
/// librdkafka ("skipped sequence numbers") bumps its epoch for the whole
/// producer and re-sends every queued message from sequence 0, on every
/// partition, including messages of requests whose answers were lost with
/// a killed leader and which the new leader holds: stored twice
/// (confluentinc/librdkafka#4953, open; Kafka's Java client retries those
/// requests without a bump). Seed 45114587 found one such duplicate
/// (docs/replication.md §8.1). With one request in flight per connection
/// there is no request behind R1 to be refused.
pub const IDEM_MAX_IN_FLIGHT: u32 = 1;
/// `message.timeout.ms` of transactional producers (librdkafka wants it no
/// larger than the transaction timeout).
pub const TXN_MESSAGE_TIMEOUT_MS: u64 = 15_000;
/// `transaction.timeout.ms`: the broker aborts a transaction left open this
/// long (checked every `txn::ABORT_TIMED_OUT_CHECK_INTERVAL_MS`).
pub const TXN_TIMEOUT_MS: u64 = 20_000;
/// Timeout of one init/commit/abort call.
pub const TXN_CALL_TIMEOUT_MS: u64 = 5_000;
/// Attempts at ending one transaction (retriable errors) before its
/// outcome counts as indeterminate and the client is recreated: together
/// 15 s, more than an ordinary restart takes and less than a long outage
/// (`LONG_OUTAGE_MS`), so that long outages leave transactions whose
/// commit was in flight to be settled by the next client's InitProducerId.
pub const TXN_END_ATTEMPTS_MAX: usize = 3;
/// Pause between InitProducerId attempts and client re-creations.
pub const RETRY_PAUSE_MS: u64 = 200;
/// `socket.timeout.ms`: bounds each request to a broker that died.
pub const SOCKET_TIMEOUT_MS: u64 = 10_000;
/// `reconnect.backoff.max.ms` / `retry.backoff.max.ms`.
pub const RECONNECT_BACKOFF_MAX_MS: u64 = 1_000;
/// Unreported messages one idempotent producer holds at most before it
/// waits (bounds memory and the backlog a restart must absorb).
pub const OUTSTANDING_MESSAGES_MAX: u64 = 2_000;
/// Unreported bytes one producer holds at most.
pub const OUTSTANDING_BYTES_MAX: u64 = 32 << 20;
/// Longest single wait of a producer thread for delivery reports.
pub const POLL_MS: u64 = 5;
/// An idempotent producer that fell behind its schedule by more than this
/// (the broker was down) restarts its schedule instead of bursting.
pub const SCHEDULE_SLACK_MAX_MS: u64 = 1_000;
/// How long producers wait at the end for their last delivery reports.
pub const FLUSH_AT_END_TIMEOUT_MS: u64 = 45_000;
/// Messages of one transaction at most (at least one per partition).
pub const TXN_MESSAGES_MAX: usize = 12;
/// Pause between transactions of one producer, at most.
pub const TXN_PAUSE_MS_MAX: u64 = 50;
/// The group consumer commits its positions this often.
pub const COMMIT_INTERVAL_MS: u64 = 250;
/// A commit without an answer after this long counts as failed, and the
/// next one may go out.
pub const COMMIT_CALLBACK_TIMEOUT_MS: u64 = 30_000;
/// Consumer poll timeout: bounds how long a stop request waits.
pub const CONSUMER_POLL_MS: u64 = 100;
/// Smallest value the workload writes.
pub const VALUE_SMALL_MIN_BYTES: u32 = 100;
/// Upper end of small values.
pub const VALUE_SMALL_MAX_BYTES: u32 = 2_000;
/// Upper end of medium values.
pub const VALUE_MEDIUM_MAX_BYTES: u32 = 64_000;
/// Share of medium values (2 KB-64 KB).
pub const VALUE_MEDIUM_SHARE: f64 = 0.13;
/// Share of large values (64 KB up to the maximum).
pub const VALUE_LARGE_SHARE: f64 = 0.02;
/// Largest value: under librdkafka's and fjord's 1 MiB message limits with
/// room for the key, headers and batch overhead.
pub const VALUE_MAX_BYTES: u32 = 1_000_000;
/// Share of idempotent messages sent to the retained topic.
pub const RETAINED_SHARE: f64 = 0.25;
/// Consumer group of the group consumer.
pub const GROUP_ID: &str = "chaos-group";

/// Settings every client thread reads.
#[derive(Clone, Debug)]
pub struct ClientSettings {
    pub bootstrap: String,
    pub idem_partitions: i32,
    pub retained_partitions: i32,
    pub txn_partitions: i32,
    /// Messages per second per idempotent producer.
    pub idem_rate: f64,
    pub value_max_bytes: u32,
    pub abort_fraction: f64,
    /// `message.timeout.ms` of the idempotent producers.
    pub idem_message_timeout_ms: u64,
    /// `max.in.flight.requests.per.connection` of the idempotent producers.
    pub idem_max_in_flight: u32,
    /// librdkafka `debug` contexts, if any.
    pub debug: Option<String>,
}

/// State shared by every client thread and the orchestrator.
pub struct Shared {
    pub stop: AtomicBool,
    /// How many times the broker has been started (1 before the first kill).
    pub generation: AtomicU32,
    pub log: ClientLog,
    pub group: Mutex<GroupHistory>,
    pub events: Mutex<Vec<ClientEvent>>,
}

impl Shared {
    pub fn generation(&self) -> u32 {
        self.generation.load(Ordering::Relaxed)
    }

    fn event(&self, client: &str, what: String) {
        self.log.line(client, &what);
        lock(&self.events).push(ClientEvent {
            client: client.to_string(),
            generation: self.generation(),
            what,
        });
    }
}

/// Locks `m`, also when a thread panicked while holding it (the records
/// are plain data and still worth reporting).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The clients' log: librdkafka's own lines (warnings and up, or the
/// `--client-debug` contexts) and the workload's events, with milliseconds
/// since the run started.
pub struct ClientLog {
    file: Mutex<Option<File>>,
    start: Instant,
}

impl ClientLog {
    pub fn open(path: &std::path::Path, start: Instant) -> Result<ClientLog, ChaosError> {
        let f = File::create(path).map_err(|source| ChaosError::Io {
            what: format!("creating {}", path.display()),
            source,
        })?;
        Ok(ClientLog {
            file: Mutex::new(Some(f)),
            start,
        })
    }

    /// Milliseconds since the run started.
    pub fn elapsed_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    pub fn line(&self, who: &str, what: &str) {
        let ms = self.start.elapsed().as_secs_f64() * 1e3;
        if let Some(f) = lock(&self.file).as_mut() {
            let _ = writeln!(f, "{ms:>10.1} {who}: {what}");
        }
    }
}

fn base_config(s: &ClientSettings) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &s.bootstrap)
        .set("socket.timeout.ms", SOCKET_TIMEOUT_MS.to_string())
        .set("reconnect.backoff.ms", "50")
        .set(
            "reconnect.backoff.max.ms",
            RECONNECT_BACKOFF_MAX_MS.to_string(),
        )
        .set("retry.backoff.ms", "50")
        .set("retry.backoff.max.ms", RECONNECT_BACKOFF_MAX_MS.to_string())
        .set("topic.metadata.refresh.interval.ms", "5000");
    match &s.debug {
        Some(d) => {
            c.set("debug", d).set_log_level(RDKafkaLogLevel::Debug);
        }
        None => {
            c.set_log_level(RDKafkaLogLevel::Warning);
        }
    }
    c
}

/// A librdkafka context writing its log lines and error events to the
/// client log.
fn log_line(shared: &Shared, who: &str, level: RDKafkaLogLevel, fac: &str, msg: &str) {
    shared
        .log
        .line(who, &format!("librdkafka {level:?} {fac}: {msg}"));
}

/// Delivery reports of one producer, into its records (indexed by
/// sequence number).
struct ProducerCtx {
    name: String,
    shared: Arc<Shared>,
    records: Arc<Mutex<Vec<MsgRecord>>>,
    outstanding: AtomicU64,
    outstanding_bytes: AtomicU64,
}

impl ClientContext for ProducerCtx {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, msg: &str) {
        log_line(&self.shared, &self.name, level, fac, msg);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.shared
            .log
            .line(&self.name, &format!("librdkafka error: {error}: {reason}"));
    }
}

impl ProducerContext for ProducerCtx {
    /// The message's sequence number.
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, seq: usize) {
        let mut recs = lock(&self.records);
        let Some(rec) = recs.get_mut(seq) else {
            self.shared.log.line(
                &self.name,
                &format!("delivery report for unknown sequence {seq}"),
            );
            return;
        };
        self.outstanding.fetch_sub(1, Ordering::Relaxed);
        self.outstanding_bytes
            .fetch_sub(u64::from(rec.bytes), Ordering::Relaxed);
        if rec.outcome != MsgOutcome::Pending {
            // librdkafka reports each message once; a second report would
            // make the history ambiguous, so it is logged and the first kept.
            self.shared.log.line(
                &self.name,
                &format!("second delivery report for seq {seq}: {result:?}"),
            );
            return;
        }
        rec.outcome = match result {
            Ok(m) => {
                if m.partition() != rec.tp.partition {
                    self.shared.log.line(
                        &self.name,
                        &format!(
                            "seq {seq} sent to partition {} acknowledged on {}",
                            rec.tp.partition,
                            m.partition()
                        ),
                    );
                }
                rec.acked_at_ms = Some(self.shared.log.elapsed_ms());
                MsgOutcome::Acked { offset: m.offset() }
            }
            Err((e, m)) => {
                // SAFETY: the message pointer is live for the duration of
                // the delivery callback.
                let status = unsafe { rdkafka::bindings::rd_kafka_message_status(m.ptr()) };
                let error = e.to_string();
                if status
                    == rdkafka::bindings::rd_kafka_msg_status_t::RD_KAFKA_MSG_STATUS_NOT_PERSISTED
                {
                    MsgOutcome::Failed { error }
                } else {
                    MsgOutcome::Indeterminate { error }
                }
            }
        };
    }
}

type ChaosProducer = BaseProducer<ProducerCtx>;

/// Picks a value length: mostly small, some medium, a few large.
pub fn value_len(rng: &mut impl Rng, max: u32) -> u32 {
    let x: f64 = rng.random();
    let (lo, hi) = if x < VALUE_LARGE_SHARE {
        (VALUE_MEDIUM_MAX_BYTES, max)
    } else if x < VALUE_LARGE_SHARE + VALUE_MEDIUM_SHARE {
        (VALUE_SMALL_MAX_BYTES, VALUE_MEDIUM_MAX_BYTES)
    } else {
        (VALUE_SMALL_MIN_BYTES, VALUE_SMALL_MAX_BYTES)
    };
    let hi = hi.min(max).max(VALUE_SMALL_MIN_BYTES);
    let lo = lo.min(hi);
    rng.random_range(lo..=hi)
}

/// Hands one record to librdkafka, waiting (bounded) while its queue is full.
fn send_one(
    p: &ChaosProducer,
    tp: Tp,
    key: &[u8],
    payload: &[u8],
    seq: usize,
    wait_full_ms: u64,
) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_millis(wait_full_ms);
    let mut record = BaseRecord::with_opaque_to(tp.topic.name(), seq)
        .partition(tp.partition)
        .key(key)
        .payload(payload);
    loop {
        match p.send(record) {
            Ok(()) => {
                // Counted after the send: its report can only be served by
                // a later poll on this thread.
                let ctx = p.context();
                ctx.outstanding.fetch_add(1, Ordering::Relaxed);
                ctx.outstanding_bytes
                    .fetch_add(payload.len() as u64, Ordering::Relaxed);
                return Ok(());
            }
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                if Instant::now() >= deadline {
                    return Err(format!("queue stayed full for {wait_full_ms} ms"));
                }
                record = r;
                p.poll(Duration::from_millis(POLL_MS));
            }
            Err((e, _)) => return Err(e.to_string()),
        }
    }
}

/// Records a message about to be sent and returns its sequence number.
fn push_record(
    records: &Mutex<Vec<MsgRecord>>,
    id_producer: u16,
    tp: Tp,
    bytes: u32,
    session: u32,
    txn: Option<u64>,
    generation: u32,
) -> u64 {
    let mut recs = lock(records);
    let seq = recs.len() as u64;
    recs.push(MsgRecord {
        id: MsgId {
            producer: id_producer,
            seq,
        },
        tp,
        bytes,
        session,
        txn,
        sent_generation: generation,
        outcome: MsgOutcome::Pending,
        acked_at_ms: None,
    });
    seq
}

/// Marks every still-pending message from `from_seq` on indeterminate: its
/// client is gone and no report will come.
fn settle_pending(records: &Mutex<Vec<MsgRecord>>, from_seq: usize, why: &str) {
    for r in lock(records).iter_mut().skip(from_seq) {
        if r.outcome == MsgOutcome::Pending {
            r.outcome = MsgOutcome::Indeterminate {
                error: why.to_string(),
            };
        }
    }
}

/// What one producer thread needs.
pub struct ProducerJob {
    /// Index of the producer among its kind.
    pub index: usize,
    /// Producer index written in values (unique over both kinds).
    pub id: u16,
    pub seed: u64,
    pub settings: Arc<ClientSettings>,
    pub shared: Arc<Shared>,
}

/// What one producer thread leaves behind.
#[derive(Default)]
pub struct ProducerOutput {
    pub messages: Vec<MsgRecord>,
    pub txns: Vec<TxnRecord>,
    pub sessions: u32,
}

fn new_producer(
    c: &ClientConfig,
    name: &str,
    shared: &Arc<Shared>,
    records: &Arc<Mutex<Vec<MsgRecord>>>,
) -> Result<ChaosProducer, ChaosError> {
    c.create_with_context(ProducerCtx {
        name: name.to_string(),
        shared: shared.clone(),
        records: records.clone(),
        outstanding: AtomicU64::new(0),
        outstanding_bytes: AtomicU64::new(0),
    })
    .map_err(|source| ChaosError::Kafka {
        what: format!("creating producer {name}"),
        source,
    })
}

/// The librdkafka settings of an idempotent producer: acks=all,
/// idempotence, a message timeout above every outage
/// ([`IDEM_MESSAGE_TIMEOUT_MS`]) and [`IDEM_MAX_IN_FLIGHT`] requests in
/// flight, unless the run chose otherwise.
fn idempotent_config(s: &ClientSettings) -> ClientConfig {
    let mut c = base_config(s);
    c.set("acks", "all")
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("message.timeout.ms", s.idem_message_timeout_ms.to_string())
        .set(
            "max.in.flight.requests.per.connection",
            s.idem_max_in_flight.to_string(),
        )
        .set("message.max.bytes", (1u32 << 20).to_string());
    c
}

/// An idempotent producer: acks=all, enable.idempotence, messages at
/// `idem_rate` per second to random partitions of the idempotent and the
/// retained topic, until stop.
pub fn run_idempotent(job: ProducerJob) -> Result<ProducerOutput, ChaosError> {
    let name = format!("idem-{}", job.index);
    let s = &job.settings;
    let shared = &job.shared;
    let mut rng = StdRng::seed_from_u64(job.seed);
    let records = Arc::new(Mutex::new(Vec::new()));
    let c = idempotent_config(s);
    let interval = Duration::from_secs_f64(1.0 / s.idem_rate.max(0.001));
    let mut session = 0u32;
    let mut next_send = Instant::now();
    while !shared.stop.load(Ordering::Relaxed) {
        session += 1;
        let session_first = lock(&records).len();
        let producer = new_producer(&c, &name, shared, &records)?;
        let fatal = loop {
            if shared.stop.load(Ordering::Relaxed) {
                break None;
            }
            if let Some((code, reason)) = producer.client().fatal_error() {
                break Some(format!("fatal error {code:?}: {reason}"));
            }
            producer.poll(Duration::ZERO);
            let ctx = producer.context();
            if ctx.outstanding.load(Ordering::Relaxed) >= OUTSTANDING_MESSAGES_MAX
                || ctx.outstanding_bytes.load(Ordering::Relaxed) >= OUTSTANDING_BYTES_MAX
            {
                producer.poll(Duration::from_millis(POLL_MS));
                continue;
            }
            let now = Instant::now();
            if now < next_send {
                producer.poll((next_send - now).min(Duration::from_millis(POLL_MS)));
                continue;
            }
            next_send += interval;
            if now.saturating_duration_since(next_send)
                > Duration::from_millis(SCHEDULE_SLACK_MAX_MS)
            {
                next_send = now + interval;
            }
            let tp = if rng.random_bool(RETAINED_SHARE) {
                Tp {
                    topic: ChaosTopic::Retained,
                    partition: rng.random_range(0..s.retained_partitions),
                }
            } else {
                Tp {
                    topic: ChaosTopic::Idem,
                    partition: rng.random_range(0..s.idem_partitions),
                }
            };
            let len = value_len(&mut rng, s.value_max_bytes);
            let seq = push_record(
                &records,
                job.id,
                tp,
                len,
                session,
                None,
                shared.generation(),
            );
            let payload = value::encode(&ValueMeta {
                id: MsgId {
                    producer: job.id,
                    seq,
                },
                transactional: false,
                session,
                txn: 0,
                len,
            });
            if let Err(error) = send_one(
                &producer,
                tp,
                name.as_bytes(),
                &payload,
                seq as usize,
                s.idem_message_timeout_ms,
            ) {
                lock(&records)[seq as usize].outcome = MsgOutcome::Failed {
                    error: format!("send refused: {error}"),
                };
            }
        };
        match fatal {
            Some(what) => {
                shared.event(&name, format!("session {session}: {what}; recreating"));
                drop(producer);
                settle_pending(
                    &records,
                    session_first,
                    "client recreated after a fatal error",
                );
                std::thread::sleep(Duration::from_millis(RETRY_PAUSE_MS));
            }
            None => {
                if let Err(e) = producer.flush(Duration::from_millis(FLUSH_AT_END_TIMEOUT_MS)) {
                    shared.event(
                        &name,
                        format!(
                            "{} messages unreported {FLUSH_AT_END_TIMEOUT_MS} ms after the stop: {e}",
                            producer.in_flight_count()
                        ),
                    );
                }
                drop(producer);
                settle_pending(&records, session_first, "no delivery report by the end");
            }
        }
    }
    let messages = std::mem::take(&mut *lock(&records));
    Ok(ProducerOutput {
        messages,
        txns: Vec::new(),
        sessions: session,
    })
}

/// The partitions a transaction writes to: one of each transactional
/// topic, and a third one half of the time.
fn pick_txn_partitions(rng: &mut StdRng, partitions: i32) -> Vec<Tp> {
    let a = Tp {
        topic: ChaosTopic::TxnA,
        partition: rng.random_range(0..partitions),
    };
    let b = Tp {
        topic: ChaosTopic::TxnB,
        partition: rng.random_range(0..partitions),
    };
    let mut tps = vec![a, b];
    if rng.random_bool(0.5) {
        let all: Vec<Tp> = [ChaosTopic::TxnA, ChaosTopic::TxnB]
            .into_iter()
            .flat_map(|topic| (0..partitions).map(move |partition| Tp { topic, partition }))
            .filter(|tp| !tps.contains(tp))
            .collect();
        if !all.is_empty() {
            tps.push(all[rng.random_range(0..all.len())]);
        }
    }
    tps
}

/// How a transactional session ended.
enum SessionEnd {
    Stopped,
    Recreate(String),
}

/// Classifies a failed transactional call.
fn describe(e: &KafkaError) -> (String, bool, bool, bool) {
    match e {
        KafkaError::Transaction(t) => (
            format!("{} ({})", t.name(), t.string()),
            t.is_retriable(),
            t.txn_requires_abort(),
            t.is_fatal(),
        ),
        // commit_transaction flushes first; a flush that timed out (the
        // broker was down) is worth retrying.
        KafkaError::Flush(code) => (format!("flush: {code:?}"), true, false, false),
        other => (other.to_string(), false, false, false),
    }
}

/// A transactional producer: transactions of 2-12 messages over 2-3
/// partitions of the two transactional topics, a fraction aborted on
/// purpose, until stop.
pub fn run_transactional(job: ProducerJob) -> Result<ProducerOutput, ChaosError> {
    let name = format!("txn-{}", job.index);
    let transactional_id = format!("chaos-txn-{}", job.index);
    let s = &job.settings;
    let shared = &job.shared;
    let mut rng = StdRng::seed_from_u64(job.seed);
    let records = Arc::new(Mutex::new(Vec::new()));
    let mut txns: Vec<TxnRecord> = Vec::new();
    let mut c = base_config(s);
    c.set("transactional.id", &transactional_id)
        .set("transaction.timeout.ms", TXN_TIMEOUT_MS.to_string())
        .set("message.timeout.ms", TXN_MESSAGE_TIMEOUT_MS.to_string())
        .set("linger.ms", "2")
        .set("message.max.bytes", (1u32 << 20).to_string());
    let call_timeout = Duration::from_millis(TXN_CALL_TIMEOUT_MS);
    let mut session = 0u32;
    let mut txn_no = 0u64;
    while !shared.stop.load(Ordering::Relaxed) {
        session += 1;
        let session_first = lock(&records).len();
        let producer = new_producer(&c, &name, shared, &records)?;
        let end = 'session: {
            // InitProducerId: retried while the broker is down or loading.
            loop {
                if shared.stop.load(Ordering::Relaxed) {
                    break 'session SessionEnd::Stopped;
                }
                match producer.init_transactions(call_timeout) {
                    Ok(()) => break,
                    Err(e) => {
                        let (what, retriable, _, fatal) = describe(&e);
                        if fatal || !retriable {
                            break 'session SessionEnd::Recreate(format!(
                                "init_transactions: {what}"
                            ));
                        }
                        shared
                            .log
                            .line(&name, &format!("init_transactions: {what}; retrying"));
                        std::thread::sleep(Duration::from_millis(RETRY_PAUSE_MS));
                    }
                }
            }
            loop {
                if shared.stop.load(Ordering::Relaxed) {
                    break 'session SessionEnd::Stopped;
                }
                if let Err(e) = producer.begin_transaction() {
                    break 'session SessionEnd::Recreate(format!(
                        "begin_transaction: {}",
                        describe(&e).0
                    ));
                }
                txn_no += 1;
                let tps = pick_txn_partitions(&mut rng, s.txn_partitions);
                let n = rng.random_range(tps.len()..=TXN_MESSAGES_MAX);
                let planned_abort = rng.random_bool(s.abort_fraction.clamp(0.0, 1.0));
                let t = txns.len();
                txns.push(TxnRecord {
                    producer: job.id,
                    transactional_id: transactional_id.clone(),
                    session,
                    txn: txn_no,
                    planned_abort,
                    partitions: tps.clone(),
                    seqs: Vec::with_capacity(n),
                    outcome: TxnOutcome::Pending,
                    begin_generation: shared.generation(),
                    end_generation: 0,
                    errors: Vec::new(),
                });
                let mut send_error = None;
                for i in 0..n {
                    let tp = if i < tps.len() {
                        tps[i]
                    } else {
                        tps[rng.random_range(0..tps.len())]
                    };
                    let len = value_len(&mut rng, s.value_max_bytes);
                    let seq = push_record(
                        &records,
                        job.id,
                        tp,
                        len,
                        session,
                        Some(txn_no),
                        shared.generation(),
                    );
                    let payload = value::encode(&ValueMeta {
                        id: MsgId {
                            producer: job.id,
                            seq,
                        },
                        transactional: true,
                        session,
                        txn: txn_no,
                        len,
                    });
                    match send_one(
                        &producer,
                        tp,
                        name.as_bytes(),
                        &payload,
                        seq as usize,
                        TXN_MESSAGE_TIMEOUT_MS,
                    ) {
                        Ok(()) => txns[t].seqs.push(seq),
                        Err(error) => {
                            lock(&records)[seq as usize].outcome = MsgOutcome::Failed {
                                error: format!("send refused: {error}"),
                            };
                            send_error = Some(error);
                            break;
                        }
                    }
                    producer.poll(Duration::ZERO);
                }
                if let Some(e) = &send_error {
                    txns[t].errors.push(format!("send: {e}"));
                }
                let outcome = if planned_abort || send_error.is_some() {
                    abort(&producer, &mut txns[t], call_timeout).map(|()| TxnOutcome::Aborted {
                        on_purpose: planned_abort && send_error.is_none(),
                    })
                } else {
                    commit(&producer, &mut txns[t], call_timeout)
                };
                txns[t].end_generation = shared.generation();
                match outcome {
                    Ok(o) => txns[t].outcome = o,
                    Err(why) => {
                        txns[t].outcome = TxnOutcome::Indeterminate;
                        break 'session SessionEnd::Recreate(format!(
                            "txn {txn_no}: {why} (errors: {})",
                            txns[t].errors.join("; ")
                        ));
                    }
                }
                let pause = Duration::from_millis(rng.random_range(0..=TXN_PAUSE_MS_MAX));
                let until = Instant::now() + pause;
                while Instant::now() < until {
                    producer.poll(Duration::from_millis(POLL_MS));
                }
            }
        };
        match end {
            SessionEnd::Stopped => {
                let _ = producer.flush(Duration::from_millis(FLUSH_AT_END_TIMEOUT_MS));
                drop(producer);
                settle_pending(&records, session_first, "no delivery report by the end");
            }
            SessionEnd::Recreate(why) => {
                shared.event(&name, format!("session {session}: {why}; recreating"));
                drop(producer);
                settle_pending(&records, session_first, "client recreated");
                std::thread::sleep(Duration::from_millis(RETRY_PAUSE_MS));
            }
        }
    }
    // A transaction whose thread stopped between begin and end never had
    // an end call: nothing of it can be committed (the client is gone).
    for t in &mut txns {
        if t.outcome == TxnOutcome::Pending {
            t.outcome = TxnOutcome::Indeterminate;
            t.errors.push("stopped before its end call".to_string());
        }
    }
    let messages = std::mem::take(&mut *lock(&records));
    Ok(ProducerOutput {
        messages,
        txns,
        sessions: session,
    })
}

/// Commits, retrying retriable errors; an abortable error is followed by an
/// abort. Err means the outcome is unknown and the client must go.
fn commit(p: &ChaosProducer, t: &mut TxnRecord, timeout: Duration) -> Result<TxnOutcome, String> {
    for _ in 0..TXN_END_ATTEMPTS_MAX {
        match p.commit_transaction(timeout) {
            Ok(()) => return Ok(TxnOutcome::Committed),
            Err(e) => {
                let (what, retriable, requires_abort, fatal) = describe(&e);
                t.errors.push(format!("commit: {what}"));
                if fatal {
                    return Err(format!("commit: {what}"));
                }
                if requires_abort {
                    return abort(p, t, timeout)
                        .map(|()| TxnOutcome::Aborted { on_purpose: false });
                }
                if !retriable {
                    return Err(format!("commit: {what}"));
                }
            }
        }
    }
    Err(format!(
        "commit not answered after {TXN_END_ATTEMPTS_MAX} attempts"
    ))
}

/// Aborts, retrying retriable errors. Err means the outcome is unknown.
///
/// librdkafka's abort waits until every message of the transaction has
/// its delivery report served, and a `BaseProducer` serves them only in
/// `poll`/`flush` on this thread: flush first (the transaction's messages
/// are then in the log, so the abort is what read_committed must hide).
fn abort(p: &ChaosProducer, t: &mut TxnRecord, timeout: Duration) -> Result<(), String> {
    for _ in 0..TXN_END_ATTEMPTS_MAX {
        if let Err(e) = p.flush(timeout) {
            t.errors.push(format!("flush before abort: {e}"));
            continue;
        }
        match p.abort_transaction(timeout) {
            Ok(()) => return Ok(()),
            Err(e) => {
                let (what, retriable, _, _) = describe(&e);
                t.errors.push(format!("abort: {what}"));
                if !retriable {
                    return Err(format!("abort: {what}"));
                }
            }
        }
    }
    Err(format!(
        "abort not answered after {TXN_END_ATTEMPTS_MAX} attempts"
    ))
}

/// The group consumer's context: positions and rebalances.
struct GroupCtx {
    shared: Arc<Shared>,
    /// Next offset to consume per assigned partition (what gets committed).
    positions: Mutex<BTreeMap<i32, i64>>,
}

impl ClientContext for GroupCtx {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, msg: &str) {
        log_line(&self.shared, "group", level, fac, msg);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.shared
            .log
            .line("group", &format!("librdkafka error: {error}: {reason}"));
    }
}

impl ConsumerContext for GroupCtx {
    /// A revoked partition's position is forgotten (it is not ours to
    /// commit any more); a newly assigned one starts from its committed
    /// offset, which librdkafka fetches.
    fn pre_rebalance(&self, _c: &BaseConsumer<Self>, r: &Rebalance<'_>) {
        match r {
            Rebalance::Revoke(tpl) | Rebalance::Assign(tpl) => {
                let mut pos = lock(&self.positions);
                for e in tpl.elements() {
                    pos.remove(&e.partition());
                }
                self.shared.log.line("group", &format!("rebalance: {r:?}"));
            }
            Rebalance::Error(e) => self
                .shared
                .log
                .line("group", &format!("rebalance error: {e}")),
        }
    }
}

/// The answer to one offset commit: the request's error, and per
/// partition (of the idempotent topic) the offset and its own error.
struct CommitAnswer {
    error: RDKafkaErrorCode,
    partitions: Vec<(i32, i64, RDKafkaErrorCode)>,
}

/// A librdkafka queue of the group consumer's own, on which the answers to
/// its offset commits arrive.
///
/// rdkafka's consumer hands manual asynchronous commits to librdkafka
/// without a reply queue, and librdkafka then reports their result only to
/// an `offset_commit_cb`, which rdkafka does not install (it uses the event
/// API): the result would be lost. `rd_kafka_commit_queue` with a queue of
/// our own gets every answer as an OFFSET_COMMIT event, polled with a
/// timeout, so the consumer thread never blocks on a dead coordinator.
struct CommitQueue(*mut rdkafka::bindings::rd_kafka_queue_t);

impl CommitQueue {
    fn new(c: &BaseConsumer<GroupCtx>) -> CommitQueue {
        // SAFETY: the client is live; the queue is destroyed by Drop, before
        // the client (the consumer outlives it in `run_group_consumer`).
        CommitQueue(unsafe { rdkafka::bindings::rd_kafka_queue_new(c.client().native_ptr()) })
    }

    fn commit(
        &self,
        c: &BaseConsumer<GroupCtx>,
        tpl: &TopicPartitionList,
    ) -> Result<(), RDKafkaErrorCode> {
        // SAFETY: client, list and queue are live for the call; librdkafka
        // copies the list; no callback or opaque is given.
        let err = unsafe {
            rdkafka::bindings::rd_kafka_commit_queue(
                c.client().native_ptr(),
                tpl.ptr(),
                self.0,
                None,
                std::ptr::null_mut(),
            )
        };
        if err == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            Ok(())
        } else {
            Err(err.into())
        }
    }

    /// The next commit answer, waiting at most `timeout`.
    fn poll(&self, timeout: Duration) -> Option<CommitAnswer> {
        use rdkafka::bindings as rd;
        // SAFETY: the queue is live; every event returned is read, then
        // destroyed once, and nothing read from it outlives it (topic names
        // are compared, offsets copied).
        unsafe {
            let ev = rd::rd_kafka_queue_poll(self.0, timeout.as_millis() as libc::c_int);
            if ev.is_null() {
                return None;
            }
            if rd::rd_kafka_event_type(ev) != rd::RD_KAFKA_EVENT_OFFSET_COMMIT {
                rd::rd_kafka_event_destroy(ev);
                return None;
            }
            let error: RDKafkaErrorCode = rd::rd_kafka_event_error(ev).into();
            let mut partitions = Vec::new();
            let list = rd::rd_kafka_event_topic_partition_list(ev);
            if !list.is_null() && !(*list).elems.is_null() {
                let elems = std::slice::from_raw_parts((*list).elems, (*list).cnt.max(0) as usize);
                for e in elems {
                    let topic = std::ffi::CStr::from_ptr(e.topic).to_string_lossy();
                    if topic == ChaosTopic::Idem.name() {
                        partitions.push((e.partition, e.offset, e.err.into()));
                    }
                }
            }
            rd::rd_kafka_event_destroy(ev);
            Some(CommitAnswer { error, partitions })
        }
    }
}

impl Drop for CommitQueue {
    fn drop(&mut self) {
        // SAFETY: created by rd_kafka_queue_new, destroyed once, here.
        unsafe { rdkafka::bindings::rd_kafka_queue_destroy(self.0) };
    }
}

/// What the group consumer thread needs.
pub struct GroupJob {
    pub settings: Arc<ClientSettings>,
    pub shared: Arc<Shared>,
}

/// Records one commit answer in the group history.
fn record_answer(shared: &Shared, order: &mut u64, a: CommitAnswer) {
    let generation = shared.generation();
    let mut h = lock(&shared.group);
    for (partition, offset, error) in a.partitions {
        if a.error == RDKafkaErrorCode::NoError && error == RDKafkaErrorCode::NoError {
            h.acked.push(CommitAck {
                order: *order,
                partition,
                offset,
                generation,
            });
            *order += 1;
        } else {
            h.failed += 1;
        }
    }
    if a.error != RDKafkaErrorCode::NoError {
        drop(h);
        shared
            .log
            .line("group", &format!("commit failed: {:?}", a.error));
    }
}

/// A group member subscribed to the idempotent topic, committing its
/// positions (asynchronously, one commit at a time) every
/// [`COMMIT_INTERVAL_MS`], until stop.
pub fn run_group_consumer(job: GroupJob) -> Result<(), ChaosError> {
    let shared = &job.shared;
    let mut c = base_config(&job.settings);
    c.set("group.id", GROUP_ID)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "10000")
        .set("heartbeat.interval.ms", "1000")
        .set("fetch.wait.max.ms", "100")
        .set("check.crcs", "true");
    let consumer: BaseConsumer<GroupCtx> = c
        .create_with_context(GroupCtx {
            shared: shared.clone(),
            positions: Mutex::new(BTreeMap::new()),
        })
        .map_err(|source| ChaosError::Kafka {
            what: "creating the group consumer".to_string(),
            source,
        })?;
    consumer
        .subscribe(&[ChaosTopic::Idem.name()])
        .map_err(|source| ChaosError::Kafka {
            what: "subscribing the group consumer".to_string(),
            source,
        })?;
    let queue = CommitQueue::new(&consumer);
    let ctx = consumer.context();
    let mut order = 0u64;
    let mut in_flight: Option<Instant> = None;
    let mut last_commit = Instant::now();
    let commit_timeout = Duration::from_millis(COMMIT_CALLBACK_TIMEOUT_MS);
    // Sends a commit of every position; true when one went out.
    let send_commit = || -> bool {
        let positions = lock(&ctx.positions).clone();
        if positions.is_empty() {
            return false;
        }
        let mut tpl = TopicPartitionList::new();
        for (&p, &o) in &positions {
            let _ = tpl.add_partition_offset(ChaosTopic::Idem.name(), p, Offset::Offset(o));
        }
        {
            let mut h = lock(&shared.group);
            h.attempts += 1;
            for (&p, &o) in &positions {
                let e = h.attempted_max.entry(p).or_insert(o);
                *e = (*e).max(o);
            }
        }
        match queue.commit(&consumer, &tpl) {
            Ok(()) => true,
            Err(e) => {
                lock(&shared.group).failed += positions.len() as u64;
                shared.log.line("group", &format!("commit refused: {e:?}"));
                false
            }
        }
    };
    while !shared.stop.load(Ordering::Relaxed) {
        match consumer.poll(Duration::from_millis(CONSUMER_POLL_MS)) {
            None => {}
            Some(Ok(m)) => {
                let decodable = m.payload().map(value::decode).is_some_and(|r| r.is_ok());
                {
                    let mut h = lock(&shared.group);
                    h.consumed += 1;
                    if !decodable {
                        h.consumed_undecodable += 1;
                    }
                }
                lock(&ctx.positions).insert(m.partition(), m.offset() + 1);
            }
            Some(Err(e)) => shared.log.line("group", &format!("consumer error: {e}")),
        }
        if let Some(a) = queue.poll(Duration::ZERO) {
            record_answer(shared, &mut order, a);
            in_flight = None;
        }
        match in_flight {
            Some(sent) if sent.elapsed() > commit_timeout => {
                // The answer may still come and is then recorded; the next
                // commit may go out meanwhile.
                in_flight = None;
                shared
                    .log
                    .line("group", "commit unanswered; sending the next one");
            }
            Some(_) => {}
            None if last_commit.elapsed() >= Duration::from_millis(COMMIT_INTERVAL_MS) => {
                if send_commit() {
                    in_flight = Some(Instant::now());
                }
                last_commit = Instant::now();
            }
            None => {}
        }
    }
    // The answer to the commit in flight, then a last commit of everything
    // consumed and its answer.
    let deadline = Instant::now() + commit_timeout;
    let mut wait = |in_flight: &mut Option<Instant>| {
        while in_flight.is_some() && Instant::now() < deadline {
            consumer.poll(Duration::ZERO);
            if let Some(a) = queue.poll(Duration::from_millis(CONSUMER_POLL_MS)) {
                record_answer(shared, &mut order, a);
                *in_flight = None;
            }
        }
    };
    wait(&mut in_flight);
    if send_commit() {
        in_flight = Some(Instant::now());
    }
    wait(&mut in_flight);
    drop(queue);
    drop(consumer);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The idempotent producers' librdkafka settings carry the run's
    /// in-flight limit and message timeout (one request, 60 s, unless the
    /// run chose otherwise: `IDEM_MAX_IN_FLIGHT`).
    #[test]
    fn idempotent_producers_send_one_request_at_a_time() {
        let mut s = ClientSettings {
            bootstrap: "127.0.0.1:9092".into(),
            idem_partitions: 4,
            retained_partitions: 2,
            txn_partitions: 2,
            idem_rate: 40.0,
            value_max_bytes: VALUE_MAX_BYTES,
            abort_fraction: 0.2,
            idem_message_timeout_ms: IDEM_MESSAGE_TIMEOUT_MS,
            idem_max_in_flight: IDEM_MAX_IN_FLIGHT,
            debug: None,
        };
        let c = idempotent_config(&s);
        assert_eq!(c.get("enable.idempotence"), Some("true"));
        assert_eq!(c.get("acks"), Some("all"));
        assert_eq!(c.get("max.in.flight.requests.per.connection"), Some("1"));
        assert_eq!(c.get("message.timeout.ms"), Some("60000"));
        s.idem_max_in_flight = 5;
        let c = idempotent_config(&s);
        assert_eq!(c.get("max.in.flight.requests.per.connection"), Some("5"));
    }

    #[test]
    fn value_lengths_stay_in_bounds_and_cover_all_classes() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut classes = [0usize; 3];
        for _ in 0..20_000 {
            let l = value_len(&mut rng, VALUE_MAX_BYTES);
            assert!((VALUE_SMALL_MIN_BYTES..=VALUE_MAX_BYTES).contains(&l));
            let class = if l > VALUE_MEDIUM_MAX_BYTES {
                2
            } else if l > VALUE_SMALL_MAX_BYTES {
                1
            } else {
                0
            };
            classes[class] += 1;
        }
        assert!(classes.iter().all(|&n| n > 0), "{classes:?}");
        // A small maximum caps every class.
        for _ in 0..1000 {
            assert!(value_len(&mut rng, 500) <= 500);
        }
    }

    #[test]
    fn transactions_span_both_topics() {
        let mut rng = StdRng::seed_from_u64(3);
        for _ in 0..1000 {
            let tps = pick_txn_partitions(&mut rng, 2);
            assert!((2..=3).contains(&tps.len()));
            assert!(tps.iter().any(|t| t.topic == ChaosTopic::TxnA));
            assert!(tps.iter().any(|t| t.topic == ChaosTopic::TxnB));
            let mut d = tps.clone();
            d.sort();
            d.dedup();
            assert_eq!(d.len(), tps.len(), "distinct partitions");
        }
    }
}
