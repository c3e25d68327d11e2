//! What the chaos clients did and what the broker answered: one record per
//! message, per transaction, per group offset commit, per DeleteRecords and
//! per check the orchestrator made between kills.
//!
//! Each producer thread owns its records (behind a mutex only because
//! librdkafka's delivery callback needs a `Sync` context; the callback runs
//! on the same thread, inside `poll`). The group history is shared by the
//! consumer thread (writer) and the orchestrator (reader, at restarts).
//! Everything is plain data, handed to the checker once all threads ended.

use std::collections::BTreeMap;

use serde::Serialize;

use super::value::MsgId;

/// The topics of the workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum ChaosTopic {
    /// Idempotent producers' main topic; the group consumer reads it.
    Idem,
    /// Idempotent producers' second topic, with `retention.bytes` and log
    /// starts moved by DeleteRecords.
    Retained,
    /// The transactional producers' two topics.
    TxnA,
    TxnB,
}

impl ChaosTopic {
    pub const ALL: [ChaosTopic; 4] = [
        ChaosTopic::Idem,
        ChaosTopic::Retained,
        ChaosTopic::TxnA,
        ChaosTopic::TxnB,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ChaosTopic::Idem => "chaos-idem",
            ChaosTopic::Retained => "chaos-retained",
            ChaosTopic::TxnA => "chaos-txn-a",
            ChaosTopic::TxnB => "chaos-txn-b",
        }
    }

    pub fn from_name(name: &str) -> Option<ChaosTopic> {
        ChaosTopic::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// A topic-partition of the workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Tp {
    pub topic: ChaosTopic,
    pub partition: i32,
}

impl std::fmt::Display for Tp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.topic.name(), self.partition)
    }
}

/// What the client learned about one message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum MsgOutcome {
    /// Handed to librdkafka; no delivery report yet.
    Pending,
    /// Delivery report OK: the broker acknowledged it at this offset.
    Acked { offset: i64 },
    /// Failed, and librdkafka says it was never sent (`NOT_PERSISTED`).
    Failed { error: String },
    /// Failed after it may have reached the broker (`POSSIBLY_PERSISTED`,
    /// e.g. timed out or purged while in flight), or no report ever came.
    Indeterminate { error: String },
}

/// One message the workload handed to librdkafka.
#[derive(Clone, Debug, Serialize)]
pub struct MsgRecord {
    pub id: MsgId,
    pub tp: Tp,
    pub bytes: u32,
    pub session: u32,
    /// The producer's transaction number for transactional messages.
    pub txn: Option<u64>,
    /// How many times the broker had been started when it was sent (1 =
    /// before the first kill).
    pub sent_generation: u32,
    pub outcome: MsgOutcome,
    /// Milliseconds since the run started when the acknowledgement
    /// arrived (None unless acknowledged).
    pub acked_at_ms: Option<u64>,
}

/// What a transaction's end call returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum TxnOutcome {
    /// Still open (the thread ended before finishing it).
    Pending,
    /// `commit_transaction` returned OK.
    Committed,
    /// `abort_transaction` returned OK; `on_purpose` when the workload had
    /// planned the abort, false when it followed a failed commit or send.
    Aborted { on_purpose: bool },
    /// Neither: the end call failed fatally, timed out for good, or the
    /// client was recreated. It may have committed or aborted.
    Indeterminate,
}

/// One transaction of one transactional producer.
#[derive(Clone, Debug, Serialize)]
pub struct TxnRecord {
    pub producer: u16,
    pub transactional_id: String,
    pub session: u32,
    pub txn: u64,
    pub planned_abort: bool,
    /// The partitions the transaction wrote to.
    pub partitions: Vec<Tp>,
    /// Sequence numbers of the messages handed to librdkafka in it.
    pub seqs: Vec<u64>,
    pub outcome: TxnOutcome,
    pub begin_generation: u32,
    pub end_generation: u32,
    /// The errors met on the way (empty for a clean commit or abort).
    pub errors: Vec<String>,
}

/// One partition of one acknowledged OffsetCommit.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct CommitAck {
    /// Position of the acknowledgement among all acknowledgements.
    pub order: u64,
    pub partition: i32,
    pub offset: i64,
    pub generation: u32,
}

/// The group consumer's offset commits.
#[derive(Clone, Debug, Default, Serialize)]
pub struct GroupHistory {
    /// Commit requests made (each for every partition with new progress).
    pub attempts: u64,
    /// Per partition, the highest offset ever sent in a commit.
    pub attempted_max: BTreeMap<i32, i64>,
    /// Every acknowledged partition offset, in the order of the acknowledgements.
    pub acked: Vec<CommitAck>,
    /// Partition offsets whose commit failed or was never answered.
    pub failed: u64,
    /// Messages the group consumer received.
    pub consumed: u64,
    /// Received values that did not decode (not counted as an anomaly
    /// here: the read-back at the end checks every stored value).
    pub consumed_undecodable: u64,
}

impl GroupHistory {
    /// Per partition, the highest acknowledged committed offset so far.
    pub fn acked_max(&self) -> BTreeMap<i32, i64> {
        let mut m = BTreeMap::new();
        for a in &self.acked {
            let e = m.entry(a.partition).or_insert(a.offset);
            *e = (*e).max(a.offset);
        }
        m
    }
}

/// The group's committed offsets as OffsetFetch gave them after a restart,
/// next to the highest acknowledged commits made before the fetch.
#[derive(Clone, Debug, Serialize)]
pub struct OffsetCheck {
    /// The broker start it was made after (2 = after the first kill).
    pub generation: u32,
    pub partition: i32,
    /// None when no committed offset was returned.
    pub fetched: Option<i64>,
    pub acked_max_before: i64,
}

/// One acknowledged DeleteRecords on the retained topic.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct DeleteAck {
    pub partition: i32,
    /// The log start the broker answered with.
    pub log_start: i64,
    pub generation: u32,
}

/// A partition's log start as ListOffsets gave it after a restart, next to
/// the highest acknowledged DeleteRecords log start before it.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct LogStartCheck {
    pub generation: u32,
    pub partition: i32,
    pub log_start: i64,
    pub acked_max_before: i64,
}

/// Client errors that are not anomalies by themselves but explain the
/// indeterminate operations (fatal producer errors, recreated clients).
#[derive(Clone, Debug, Serialize)]
pub struct ClientEvent {
    pub client: String,
    pub generation: u32,
    pub what: String,
}

/// Everything the workload recorded.
#[derive(Clone, Debug, Default)]
pub struct History {
    pub messages: Vec<MsgRecord>,
    pub txns: Vec<TxnRecord>,
    pub group: GroupHistory,
    pub offset_checks: Vec<OffsetCheck>,
    pub deletes: Vec<DeleteAck>,
    pub log_start_checks: Vec<LogStartCheck>,
    pub events: Vec<ClientEvent>,
    /// Cluster runs: what the ISR monitor saw of each partition.
    pub isr: BTreeMap<Tp, Vec<IsrSpan>>,
    /// The topics' `min.insync.replicas` is 1: an acknowledged write the
    /// ISR monitor saw acknowledged by a leader alone in the ISR may be
    /// lost as Kafka documents (see `check`).
    pub min_insync_one: bool,
}

/// A stretch of time over which every Metadata poll of the ISR monitor saw
/// a partition with the same leader and ISR.
#[derive(Clone, Debug, Serialize)]
pub struct IsrSpan {
    /// Milliseconds since the run started of the first and last poll.
    pub first_ms: u64,
    pub last_ms: u64,
    /// Broker ids (`node * 1000 + shard`).
    pub leader: i32,
    pub isr: Vec<i32>,
}

impl History {
    /// The ISR span that shows `tp` led by a leader alone in its ISR over
    /// a stretch of polls around `at_ms` (within `slack_ms` of a poll on
    /// either side), if any.
    pub fn isr_alone_at(&self, tp: Tp, at_ms: u64, slack_ms: u64) -> Option<&IsrSpan> {
        self.isr.get(&tp)?.iter().find(|s| {
            s.isr.len() == 1
                && s.isr[0] == s.leader
                && s.first_ms <= at_ms
                && at_ms <= s.last_ms.saturating_add(slack_ms)
        })
    }
}
