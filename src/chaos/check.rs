//! The checker: a pure function from what the clients recorded
//! ([`History`]) and what was read back at the end ([`Reads`]) to anomaly
//! counts with evidence. No I/O, no clock: it is unit-tested on hand-made
//! histories below, one anomaly at a time.
//!
//! The anomalies, with the names Jepsen's Kafka test uses where it has one
//! (see the module doc of [`super`] for what each promise is):
//!
//! | name | what was found |
//! |---|---|
//! | `lost-write` | an acknowledged message is not in the log (read_uncommitted), or an acknowledged non-transactional one is not visible to read_committed |
//! | `inconsistent-offsets` | an acknowledged message is in the log, but not at the offset its acknowledgement gave |
//! | `duplicate` | a value is in the log more than once |
//! | `nonmonotonic-send` | one producer session's messages on one partition are not in the order it sent them |
//! | `G1a` | a read_committed consumer sees a message of an aborted transaction |
//! | `non-atomic-txn` | read_committed sees some but not all messages of a transaction (committed, aborted or indeterminate) |
//! | `lost-txn` | a transaction whose commit returned OK has no visible message |
//! | `stuck-lso` | after every transaction ended and their timeouts passed, a partition's last stable offset is below its high watermark |
//! | `offset-regression` | the group's committed offset went below an acknowledged commit (after a restart, or in the sequence of acknowledged commits) |
//! | `log-start-regression` | a log start went below what an acknowledged DeleteRecords set |
//! | `corrupt-value` | a stored value fails its checksum, or does not match what was sent under its id |
//! | `unexpected-value` | a stored value was never sent |
//! | `read-stalled` | a partition could not be read to its end |

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

use super::history::{ChaosTopic, History, MsgOutcome, MsgRecord, Tp, TxnOutcome};
use super::readback::{Isolation, LsoState, PartitionRead};
use super::value::MsgId;

/// Evidence lines kept per anomaly (the count is always complete).
pub const EVIDENCE_PER_ANOMALY_MAX: usize = 25;
/// An acknowledgement counts as made while the ISR was the leader alone
/// when it arrived between the first poll that saw that ISR and this long
/// after the last one (the ISR monitor polls every
/// [`super::cluster::ISR_POLL_MS`]; the leader decided before the client
/// heard).
pub const ISR_POLL_SLACK_MS: u64 = 100;

/// What was read back at the end.
#[derive(Clone, Debug, Default)]
pub struct Reads {
    pub uncommitted: Vec<PartitionRead>,
    pub committed: Vec<PartitionRead>,
    pub lso: Vec<LsoState>,
}

/// The anomaly kinds, in report order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Anomaly {
    LostWrite,
    InconsistentOffsets,
    Duplicate,
    NonmonotonicSend,
    G1a,
    NonAtomicTxn,
    LostTxn,
    StuckLso,
    OffsetRegression,
    LogStartRegression,
    CorruptValue,
    UnexpectedValue,
    ReadStalled,
}

impl Anomaly {
    pub const ALL: [Anomaly; 13] = [
        Anomaly::LostWrite,
        Anomaly::InconsistentOffsets,
        Anomaly::Duplicate,
        Anomaly::NonmonotonicSend,
        Anomaly::G1a,
        Anomaly::NonAtomicTxn,
        Anomaly::LostTxn,
        Anomaly::StuckLso,
        Anomaly::OffsetRegression,
        Anomaly::LogStartRegression,
        Anomaly::CorruptValue,
        Anomaly::UnexpectedValue,
        Anomaly::ReadStalled,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Anomaly::LostWrite => "lost-write",
            Anomaly::InconsistentOffsets => "inconsistent-offsets",
            Anomaly::Duplicate => "duplicate",
            Anomaly::NonmonotonicSend => "nonmonotonic-send",
            Anomaly::G1a => "G1a",
            Anomaly::NonAtomicTxn => "non-atomic-txn",
            Anomaly::LostTxn => "lost-txn",
            Anomaly::StuckLso => "stuck-lso",
            Anomaly::OffsetRegression => "offset-regression",
            Anomaly::LogStartRegression => "log-start-regression",
            Anomaly::CorruptValue => "corrupt-value",
            Anomaly::UnexpectedValue => "unexpected-value",
            Anomaly::ReadStalled => "read-stalled",
        }
    }

    pub fn meaning(self) -> &'static str {
        match self {
            Anomaly::LostWrite => "acknowledged writes lost",
            Anomaly::InconsistentOffsets => "acknowledged writes found at another offset",
            Anomaly::Duplicate => "values present more than once",
            Anomaly::NonmonotonicSend => "reordering within one producer on one partition",
            Anomaly::G1a => "aborted transactions visible to read_committed",
            Anomaly::NonAtomicTxn => "transactions visible only in part",
            Anomaly::LostTxn => "committed transactions missing",
            Anomaly::StuckLso => "partitions with LSO below HW after all transactions ended",
            Anomaly::OffsetRegression => "committed group offsets moved backwards",
            Anomaly::LogStartRegression => "log starts below an acknowledged DeleteRecords",
            Anomaly::CorruptValue => "stored values damaged or not what was sent",
            Anomaly::UnexpectedValue => "stored values never sent",
            Anomaly::ReadStalled => "partitions that could not be read to their end",
        }
    }
}

/// How many operations of each kind there were, and how they ended.
#[derive(Clone, Debug, Default, Serialize)]
pub struct MessageCounts {
    pub sent: u64,
    pub acked: u64,
    pub failed: u64,
    pub indeterminate: u64,
    pub acked_bytes: u64,
    /// Indeterminate messages found in the log (read_uncommitted).
    pub indeterminate_present: u64,
    /// Failed (`NOT_PERSISTED`) messages found in the log anyway (a client
    /// judgement, not counted as an anomaly).
    pub failed_present: u64,
    /// Acknowledged messages below the retained topic's final log start
    /// (removed by DeleteRecords or retention, not checked).
    pub acked_below_log_start: u64,
    /// Failed and indeterminate messages by error.
    pub errors: BTreeMap<String, u64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct TxnCounts {
    pub total: u64,
    pub committed: u64,
    pub aborted_on_purpose: u64,
    pub aborted_after_error: u64,
    pub indeterminate: u64,
    /// Indeterminate transactions read_committed shows whole (they committed).
    pub indeterminate_visible: u64,
    /// Indeterminate transactions read_committed does not show (aborted).
    pub indeterminate_invisible: u64,
    pub messages: u64,
    /// Transactions that met an error on the way (and were retried,
    /// aborted or left indeterminate).
    pub with_errors: u64,
    /// The errors met, by kind (`commit: _TIMED_OUT`, ...).
    pub errors: BTreeMap<String, u64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct OperationCounts {
    pub idempotent: MessageCounts,
    pub transactional: MessageCounts,
    pub transactions: TxnCounts,
    pub offset_commits: u64,
    pub offset_commit_partitions_acked: u64,
    pub offset_commit_partitions_failed: u64,
    pub offset_checks: u64,
    pub deletes_acked: u64,
    pub log_start_checks: u64,
    pub records_read_uncommitted: u64,
    pub records_read_committed: u64,
    /// `--min-insync-replicas 1` runs: acknowledged writes lost that the
    /// ISR monitor saw acknowledged by a leader alone in the ISR (Kafka's
    /// documented loss; not an anomaly).
    pub lost_writes_allowed_min_insync_1: u64,
}

/// The checker's result.
#[derive(Clone, Debug, Default)]
pub struct Analysis {
    pub counts: BTreeMap<Anomaly, u64>,
    pub evidence: BTreeMap<Anomaly, Vec<String>>,
    pub ops: OperationCounts,
    /// Evidence of the losses `--min-insync-replicas 1` allows.
    pub allowed_evidence: Vec<String>,
}

impl Analysis {
    pub fn count(&self, a: Anomaly) -> u64 {
        self.counts.get(&a).copied().unwrap_or(0)
    }

    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }

    fn add(&mut self, a: Anomaly, evidence: impl FnOnce() -> String) {
        *self.counts.entry(a).or_insert(0) += 1;
        let e = self.evidence.entry(a).or_default();
        if e.len() < EVIDENCE_PER_ANOMALY_MAX {
            e.push(evidence());
        }
    }
}

/// Where a value was found: partition and offset.
type Place = (Tp, i64);

/// The stored values of one isolation level, indexed.
struct Index {
    /// Every place each decodable value was found at.
    places: HashMap<MsgId, Vec<Place>>,
    /// What each offset holds, per partition (for evidence).
    at: HashMap<Tp, BTreeMap<i64, MsgId>>,
    /// Log start and end per partition, and whether it was read whole.
    bounds: HashMap<Tp, (i64, i64, bool)>,
}

fn index(reads: &[PartitionRead]) -> Index {
    let mut ix = Index {
        places: HashMap::new(),
        at: HashMap::new(),
        bounds: HashMap::new(),
    };
    for r in reads {
        ix.bounds.insert(r.tp, (r.log_start, r.end, r.complete));
        let at = ix.at.entry(r.tp).or_default();
        for rec in &r.records {
            if let Ok(meta) = &rec.value {
                ix.places
                    .entry(meta.id)
                    .or_default()
                    .push((r.tp, rec.offset));
                at.insert(rec.offset, meta.id);
            }
        }
    }
    ix
}

/// Names producers in evidence.
struct Names<'a>(&'a [String]);

impl Names<'_> {
    fn of(&self, id: MsgId) -> String {
        let p = self
            .0
            .get(id.producer as usize)
            .cloned()
            .unwrap_or_else(|| format!("producer-{}", id.producer));
        format!("{p} seq {}", id.seq)
    }
}

fn describe_msg(names: &Names<'_>, m: &MsgRecord) -> String {
    let txn = m.txn.map(|t| format!(", txn {t}")).unwrap_or_default();
    format!(
        "{} (session {}{txn}, {} B, sent to {} in broker generation {})",
        names.of(m.id),
        m.session,
        m.bytes,
        m.tp,
        m.sent_generation
    )
}

fn describe_offset(ix: &Index, names: &Names<'_>, tp: Tp, offset: i64) -> String {
    let (start, end, complete) = ix.bounds.get(&tp).copied().unwrap_or((-1, -1, false));
    let holder = match ix.at.get(&tp).and_then(|m| m.get(&offset)) {
        Some(id) => format!("holds {}", names.of(*id)),
        None => "holds no value of the workload".to_string(),
    };
    let near = ix
        .at
        .get(&tp)
        .map(|m| {
            let before = m
                .range(..offset)
                .next_back()
                .map(|(o, id)| format!("{o}: {}", names.of(*id)));
            let after = m
                .range(offset + 1..)
                .next()
                .map(|(o, id)| format!("{o}: {}", names.of(*id)));
            format!(
                "previous {}, next {}",
                before.unwrap_or_else(|| "none".into()),
                after.unwrap_or_else(|| "none".into())
            )
        })
        .unwrap_or_default();
    format!(
        "{tp}@{offset} {holder} ({near}; read {start}..{end}{})",
        if complete { "" } else { ", incomplete" }
    )
}

fn places(ps: &[Place]) -> String {
    ps.iter()
        .map(|(tp, o)| format!("{tp}@{o}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs every check; see the module doc.
pub fn analyze(h: &History, producer_names: &[String], reads: &Reads) -> Analysis {
    let names = Names(producer_names);
    let mut a = Analysis::default();
    let by_id: HashMap<MsgId, &MsgRecord> = h.messages.iter().map(|m| (m.id, m)).collect();
    let ru = index(&reads.uncommitted);
    let rc = index(&reads.committed);
    let log_start: HashMap<Tp, i64> = reads
        .uncommitted
        .iter()
        .map(|r| (r.tp, r.log_start))
        .collect();

    // Stored values: damaged, never sent, or not what was sent.
    for r in reads.uncommitted.iter().chain(&reads.committed) {
        let is_ru = r.isolation == Isolation::ReadUncommitted;
        if is_ru {
            a.ops.records_read_uncommitted += r.records.len() as u64;
        } else {
            a.ops.records_read_committed += r.records.len() as u64;
        }
        if !r.complete {
            a.add(Anomaly::ReadStalled, || {
                format!(
                    "{} ({:?}) read {} records of {}..{} and stalled; consumer errors: {:?}",
                    r.tp,
                    r.isolation,
                    r.records.len(),
                    r.log_start,
                    r.end,
                    r.errors
                )
            });
        }
        // Damage is counted once, from the read_uncommitted view (which
        // holds every stored value).
        if !is_ru {
            continue;
        }
        for rec in &r.records {
            match &rec.value {
                Err(e) => a.add(Anomaly::CorruptValue, || {
                    format!("{}@{}: {e}", r.tp, rec.offset)
                }),
                Ok(meta) => match by_id.get(&meta.id) {
                    None => a.add(Anomaly::UnexpectedValue, || {
                        format!(
                            "{}@{}: {} was never sent",
                            r.tp,
                            rec.offset,
                            names.of(meta.id)
                        )
                    }),
                    Some(m) => {
                        if m.tp != r.tp
                            || m.session != meta.session
                            || m.txn.unwrap_or(0) != meta.txn
                            || m.txn.is_some() != meta.transactional
                            || m.bytes != meta.len
                        {
                            a.add(Anomaly::CorruptValue, || {
                                format!(
                                    "{}@{}: value {meta:?} does not match what was sent: {}",
                                    r.tp,
                                    rec.offset,
                                    describe_msg(&names, m)
                                )
                            });
                        }
                    }
                },
            }
        }
    }

    // Duplicates, in either view (a value counted once).
    let mut dup_ids: BTreeSet<MsgId> = BTreeSet::new();
    for ix in [&ru, &rc] {
        for (id, ps) in &ix.places {
            if ps.len() > 1 && dup_ids.insert(*id) {
                a.add(Anomaly::Duplicate, || {
                    let sent = by_id
                        .get(id)
                        .map(|m| format!("{}, {:?}", describe_msg(&names, m), m.outcome))
                        .unwrap_or_else(|| names.of(*id));
                    format!("{sent} found {} times: {}", ps.len(), places(ps))
                });
            }
        }
    }

    // Per message: outcome counts, lost writes, wrong offsets.
    for m in &h.messages {
        let counts = if m.txn.is_some() {
            &mut a.ops.transactional
        } else {
            &mut a.ops.idempotent
        };
        counts.sent += 1;
        let present = ru.places.contains_key(&m.id);
        match &m.outcome {
            MsgOutcome::Acked { .. } => {
                counts.acked += 1;
                counts.acked_bytes += u64::from(m.bytes);
            }
            MsgOutcome::Failed { error } => {
                counts.failed += 1;
                counts.failed_present += u64::from(present);
                *counts.errors.entry(format!("failed: {error}")).or_insert(0) += 1;
            }
            MsgOutcome::Indeterminate { error } => {
                counts.indeterminate += 1;
                counts.indeterminate_present += u64::from(present);
                *counts
                    .errors
                    .entry(format!("indeterminate: {error}"))
                    .or_insert(0) += 1;
            }
            MsgOutcome::Pending => {
                counts.indeterminate += 1;
                counts.indeterminate_present += u64::from(present);
            }
        }
        let MsgOutcome::Acked { offset } = m.outcome else {
            continue;
        };
        if m.tp.topic == ChaosTopic::Retained && offset < log_start.get(&m.tp).copied().unwrap_or(0)
        {
            counts.acked_below_log_start += 1;
            continue;
        }
        match ru.places.get(&m.id) {
            None if h.min_insync_one => {
                // Kafka documents this loss with min.insync.replicas=1:
                // acks=all acknowledged by a leader alone in the ISR, then
                // that leader's data lost. Allowed only where the ISR
                // monitor saw the ISR at the leader alone around the
                // acknowledgement; otherwise an anomaly as any other.
                let alone = m
                    .acked_at_ms
                    .and_then(|t| h.isr_alone_at(m.tp, t, ISR_POLL_SLACK_MS));
                match alone {
                    Some(span) => {
                        a.ops.lost_writes_allowed_min_insync_1 += 1;
                        if a.allowed_evidence.len() < EVIDENCE_PER_ANOMALY_MAX {
                            a.allowed_evidence.push(format!(
                                "{} acknowledged at {}@{offset} at {} ms while the ISR was [{}] alone ({}..{} ms), not in the log; {}",
                                describe_msg(&names, m),
                                m.tp,
                                m.acked_at_ms.unwrap_or(0),
                                span.leader,
                                span.first_ms,
                                span.last_ms,
                                describe_offset(&ru, &names, m.tp, offset)
                            ));
                        }
                    }
                    None => a.add(Anomaly::LostWrite, || {
                        format!(
                            "{} acknowledged at {}@{offset} (at {:?} ms, ISR not seen at the leader alone then), not in the log; {}",
                            describe_msg(&names, m),
                            m.tp,
                            m.acked_at_ms,
                            describe_offset(&ru, &names, m.tp, offset)
                        )
                    }),
                }
            }
            None => a.add(Anomaly::LostWrite, || {
                format!(
                    "{} acknowledged at {}@{offset}, not in the log; {}",
                    describe_msg(&names, m),
                    m.tp,
                    describe_offset(&ru, &names, m.tp, offset)
                )
            }),
            Some(ps) => {
                if !ps.contains(&(m.tp, offset)) {
                    a.add(Anomaly::InconsistentOffsets, || {
                        format!(
                            "{} acknowledged at {}@{offset}, found at {}; {}",
                            describe_msg(&names, m),
                            m.tp,
                            places(ps),
                            describe_offset(&ru, &names, m.tp, offset)
                        )
                    });
                } else if m.txn.is_none() && !rc.places.contains_key(&m.id) {
                    a.add(Anomaly::LostWrite, || {
                        format!(
                            "{} acknowledged at {}@{offset} and in the log, but not visible to read_committed; read_committed {}",
                            describe_msg(&names, m),
                            m.tp,
                            describe_offset(&rc, &names, m.tp, offset)
                        )
                    });
                }
            }
        }
    }

    // Order: per producer session and partition, offsets follow sequence
    // numbers.
    for r in &reads.uncommitted {
        let mut last: HashMap<(u16, u32), (u64, i64)> = HashMap::new();
        for rec in &r.records {
            let Ok(meta) = &rec.value else { continue };
            let key = (meta.id.producer, meta.session);
            if let Some(&(seq, off)) = last.get(&key) {
                if meta.id.seq < seq {
                    a.add(Anomaly::NonmonotonicSend, || {
                        format!(
                            "{}: {} at offset {} follows {} at offset {off} (session {})",
                            r.tp,
                            names.of(meta.id),
                            rec.offset,
                            names.of(MsgId {
                                producer: meta.id.producer,
                                seq
                            }),
                            meta.session
                        )
                    });
                }
            }
            let e = last.entry(key).or_insert((meta.id.seq, rec.offset));
            if meta.id.seq >= e.0 {
                *e = (meta.id.seq, rec.offset);
            }
        }
    }

    // Transactions, from what read_committed shows.
    for t in &h.txns {
        let c = &mut a.ops.transactions;
        c.total += 1;
        c.messages += t.seqs.len() as u64;
        c.with_errors += u64::from(!t.errors.is_empty());
        for e in &t.errors {
            let kind = e.split(" (").next().unwrap_or(e).to_string();
            *c.errors.entry(kind).or_insert(0) += 1;
        }
        let ids: Vec<MsgId> = t
            .seqs
            .iter()
            .map(|&seq| MsgId {
                producer: t.producer,
                seq,
            })
            .collect();
        let visible: Vec<&MsgId> = ids.iter().filter(|id| rc.places.contains_key(id)).collect();
        let visible_tps: BTreeSet<Tp> = visible
            .iter()
            .flat_map(|id| rc.places[id].iter().map(|(tp, _)| *tp))
            .collect();
        let sent = ids.len();
        let what = || {
            format!(
                "{} txn {} (session {}, {:?}, planned {}, broker generations {}..{}, errors {:?}): {} of {} messages visible to read_committed, on {:?} of {:?}",
                t.transactional_id,
                t.txn,
                t.session,
                t.outcome,
                if t.planned_abort { "abort" } else { "commit" },
                t.begin_generation,
                t.end_generation,
                t.errors,
                visible.len(),
                sent,
                visible_tps.iter().map(|tp| tp.to_string()).collect::<Vec<_>>(),
                t.partitions.iter().map(|tp| tp.to_string()).collect::<Vec<_>>(),
            )
        };
        match t.outcome {
            TxnOutcome::Committed => {
                c.committed += 1;
                if sent > 0 && visible.is_empty() {
                    a.add(Anomaly::LostTxn, what);
                    continue;
                }
            }
            TxnOutcome::Aborted { on_purpose } => {
                if on_purpose {
                    c.aborted_on_purpose += 1;
                } else {
                    c.aborted_after_error += 1;
                }
                if !visible.is_empty() {
                    a.add(Anomaly::G1a, what);
                    continue;
                }
            }
            TxnOutcome::Indeterminate | TxnOutcome::Pending => {
                c.indeterminate += 1;
                if visible.is_empty() {
                    c.indeterminate_invisible += 1;
                } else if visible.len() == sent {
                    c.indeterminate_visible += 1;
                }
            }
        }
        if !visible.is_empty() && visible.len() < sent {
            a.add(Anomaly::NonAtomicTxn, what);
        }
    }

    // Last stable offsets at the end.
    for l in &reads.lso {
        if l.last_stable < l.high_watermark {
            a.add(Anomaly::StuckLso, || {
                format!(
                    "{}: LSO {} below HW {} after {} ms",
                    l.tp, l.last_stable, l.high_watermark, l.waited_ms
                )
            });
        }
    }

    // Group offsets: after restarts, and in the acknowledged sequence.
    a.ops.offset_commits = h.group.attempts;
    a.ops.offset_commit_partitions_acked = h.group.acked.len() as u64;
    a.ops.offset_commit_partitions_failed = h.group.failed;
    a.ops.offset_checks = h.offset_checks.len() as u64;
    for c in &h.offset_checks {
        if c.acked_max_before >= 0 && c.fetched.is_none_or(|f| f < c.acked_max_before) {
            a.add(Anomaly::OffsetRegression, || {
                format!(
                    "after broker start {}: partition {} committed offset {:?}, but {} was acknowledged before",
                    c.generation, c.partition, c.fetched, c.acked_max_before
                )
            });
        }
    }
    let mut acked = h.group.acked.clone();
    acked.sort_by_key(|c| c.order);
    let mut high: HashMap<i32, (i64, u32)> = HashMap::new();
    for c in &acked {
        if let Some(&(o, generation)) = high.get(&c.partition) {
            if c.offset < o {
                a.add(Anomaly::OffsetRegression, || {
                    format!(
                        "partition {}: commit of {} acknowledged (broker generation {}) after a commit of {o} was (generation {generation})",
                        c.partition, c.offset, c.generation
                    )
                });
                continue;
            }
        }
        high.insert(c.partition, (c.offset, c.generation));
    }

    // Log starts against acknowledged DeleteRecords.
    a.ops.deletes_acked = h.deletes.len() as u64;
    a.ops.log_start_checks = h.log_start_checks.len() as u64;
    for c in &h.log_start_checks {
        if c.log_start < c.acked_max_before {
            a.add(Anomaly::LogStartRegression, || {
                format!(
                    "after broker start {}: {}-{} log start {} below the acknowledged DeleteRecords {}",
                    c.generation,
                    ChaosTopic::Retained.name(),
                    c.partition,
                    c.log_start,
                    c.acked_max_before
                )
            });
        }
    }
    debug_assert!(a.counts.values().all(|&n| n > 0));
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chaos::history::{CommitAck, DeleteAck, LogStartCheck, OffsetCheck, TxnRecord};
    use crate::chaos::readback::ReadRecord;
    use crate::chaos::value::ValueMeta;

    const IDEM: Tp = Tp {
        topic: ChaosTopic::Idem,
        partition: 0,
    };
    const TA: Tp = Tp {
        topic: ChaosTopic::TxnA,
        partition: 0,
    };
    const TB: Tp = Tp {
        topic: ChaosTopic::TxnB,
        partition: 1,
    };

    fn names() -> Vec<String> {
        vec!["idem-0".into(), "txn-0".into()]
    }

    fn msg(producer: u16, seq: u64, tp: Tp, txn: Option<u64>, outcome: MsgOutcome) -> MsgRecord {
        MsgRecord {
            id: MsgId { producer, seq },
            tp,
            bytes: 100,
            session: 1,
            txn,
            sent_generation: 1,
            outcome,
            acked_at_ms: None,
        }
    }

    fn acked(offset: i64) -> MsgOutcome {
        MsgOutcome::Acked { offset }
    }

    fn stored(m: &MsgRecord, offset: i64) -> ReadRecord {
        ReadRecord {
            offset,
            value: Ok(ValueMeta {
                id: m.id,
                transactional: m.txn.is_some(),
                session: m.session,
                txn: m.txn.unwrap_or(0),
                len: m.bytes,
            }),
        }
    }

    fn read(tp: Tp, isolation: Isolation, records: Vec<ReadRecord>) -> PartitionRead {
        let end = records.last().map(|r| r.offset + 1).unwrap_or(0);
        PartitionRead {
            tp,
            isolation,
            log_start: 0,
            end,
            records,
            complete: true,
            errors: Vec::new(),
        }
    }

    /// Both views hold the same records.
    fn both(tp: Tp, records: Vec<ReadRecord>) -> (PartitionRead, PartitionRead) {
        (
            read(tp, Isolation::ReadUncommitted, records.clone()),
            read(tp, Isolation::ReadCommitted, records),
        )
    }

    /// `analyze` of reads without last-stable-offset checks.
    fn analyze_reads(
        h: &History,
        uncommitted: Vec<PartitionRead>,
        committed: Vec<PartitionRead>,
    ) -> Analysis {
        let reads = Reads {
            uncommitted,
            committed,
            lso: Vec::new(),
        };
        analyze(h, &names(), &reads)
    }

    fn only(a: &Analysis) -> Vec<(Anomaly, u64)> {
        a.counts.iter().map(|(k, v)| (*k, *v)).collect()
    }

    #[test]
    fn a_clean_history_has_no_anomaly() {
        let m: Vec<MsgRecord> = (0..3)
            .map(|s| msg(0, s, IDEM, None, acked(s as i64)))
            .collect();
        let (ru, rc) = both(
            IDEM,
            m.iter()
                .enumerate()
                .map(|(i, m)| stored(m, i as i64))
                .collect(),
        );
        let h = History {
            messages: m,
            ..History::default()
        };
        let a = analyze_reads(&h, vec![ru], vec![rc]);
        assert_eq!(only(&a), vec![]);
        assert_eq!(a.ops.idempotent.acked, 3);
    }

    #[test]
    fn lost_moved_duplicated_and_reordered_writes() {
        let m = vec![
            msg(0, 0, IDEM, None, acked(0)),
            msg(0, 1, IDEM, None, acked(1)),
            msg(0, 2, IDEM, None, acked(2)),
            msg(0, 3, IDEM, None, acked(3)),
        ];
        // seq 1 lost, seq 3 at offset 2 and again at 4, seq 2 after seq 3.
        let recs = vec![
            stored(&m[0], 0),
            stored(&m[3], 2),
            stored(&m[2], 3),
            stored(&m[3], 4),
        ];
        let (ru, rc) = both(IDEM, recs);
        let h = History {
            messages: m,
            ..History::default()
        };
        let a = analyze_reads(&h, vec![ru], vec![rc]);
        assert_eq!(a.count(Anomaly::LostWrite), 1, "{:?}", a.evidence);
        // seq 2 at 3 instead of 2; seq 3 at 2 and 4, neither its offset 3.
        assert_eq!(a.count(Anomaly::InconsistentOffsets), 2, "{:?}", a.evidence);
        assert_eq!(a.count(Anomaly::Duplicate), 1);
        assert_eq!(a.count(Anomaly::NonmonotonicSend), 1, "{:?}", a.evidence);
    }

    #[test]
    fn indeterminate_and_failed_writes_may_go_either_way() {
        let m = vec![
            msg(
                0,
                0,
                IDEM,
                None,
                MsgOutcome::Indeterminate { error: "t".into() },
            ),
            msg(
                0,
                1,
                IDEM,
                None,
                MsgOutcome::Indeterminate { error: "t".into() },
            ),
            msg(0, 2, IDEM, None, MsgOutcome::Failed { error: "f".into() }),
        ];
        let (ru, rc) = both(IDEM, vec![stored(&m[0], 0)]);
        let h = History {
            messages: m,
            ..History::default()
        };
        let a = analyze_reads(&h, vec![ru], vec![rc]);
        assert_eq!(only(&a), vec![]);
        assert_eq!(a.ops.idempotent.indeterminate, 2);
        assert_eq!(a.ops.idempotent.indeterminate_present, 1);
        assert_eq!(a.ops.idempotent.failed, 1);
    }

    #[test]
    fn an_acked_write_invisible_to_read_committed_is_lost() {
        let m = vec![msg(0, 0, IDEM, None, acked(0))];
        let ru = read(IDEM, Isolation::ReadUncommitted, vec![stored(&m[0], 0)]);
        let rc = read(IDEM, Isolation::ReadCommitted, vec![]);
        let h = History {
            messages: m,
            ..History::default()
        };
        let a = analyze_reads(&h, vec![ru], vec![rc]);
        assert_eq!(only(&a), vec![(Anomaly::LostWrite, 1)]);
    }

    #[test]
    fn corrupt_and_unexpected_values() {
        let m = vec![msg(0, 0, IDEM, None, acked(0))];
        let mut wrong = stored(&m[0], 0);
        if let Ok(v) = &mut wrong.value {
            v.session = 9;
        }
        let ghost = ReadRecord {
            offset: 1,
            value: Ok(ValueMeta {
                id: MsgId {
                    producer: 0,
                    seq: 50,
                },
                transactional: false,
                session: 1,
                txn: 0,
                len: 100,
            }),
        };
        let bad = ReadRecord {
            offset: 2,
            value: Err(crate::chaos::value::DecodeError::BadMagic),
        };
        let (ru, rc) = both(IDEM, vec![wrong, ghost, bad]);
        let h = History {
            messages: m,
            ..History::default()
        };
        let a = analyze_reads(&h, vec![ru], vec![rc]);
        assert_eq!(
            only(&a),
            vec![(Anomaly::CorruptValue, 2), (Anomaly::UnexpectedValue, 1)]
        );
    }

    fn txn(t: u64, seqs: Vec<u64>, outcome: TxnOutcome) -> TxnRecord {
        TxnRecord {
            producer: 1,
            transactional_id: "chaos-txn-0".into(),
            session: 1,
            txn: t,
            planned_abort: matches!(outcome, TxnOutcome::Aborted { on_purpose: true }),
            partitions: vec![TA, TB],
            seqs,
            outcome,
            begin_generation: 1,
            end_generation: 1,
            errors: Vec::new(),
        }
    }

    #[test]
    fn transaction_anomalies() {
        // Txn 1 committed, fully visible; txn 2 aborted but visible (G1a);
        // txn 3 committed and half visible (non-atomic); txn 4 committed
        // and invisible (lost); txn 5 indeterminate, half visible
        // (non-atomic); txn 6 indeterminate, invisible (fine).
        let mut msgs = Vec::new();
        let mut txns = Vec::new();
        let mut ru_a = Vec::new();
        let mut rc_a = Vec::new();
        let mut ru_b = Vec::new();
        let mut rc_b = Vec::new();
        let mut off = 0;
        let plan: [(TxnOutcome, [bool; 2]); 6] = [
            (TxnOutcome::Committed, [true, true]),
            (TxnOutcome::Aborted { on_purpose: true }, [true, false]),
            (TxnOutcome::Committed, [true, false]),
            (TxnOutcome::Committed, [false, false]),
            (TxnOutcome::Indeterminate, [false, true]),
            (TxnOutcome::Indeterminate, [false, false]),
        ];
        for (t, (outcome, vis)) in plan.iter().enumerate() {
            let t = t as u64 + 1;
            let seqs = vec![2 * t, 2 * t + 1];
            for (k, &seq) in seqs.iter().enumerate() {
                let tp = if k == 0 { TA } else { TB };
                let m = msg(1, seq, tp, Some(t), acked(off));
                let (ru, rc) = if k == 0 {
                    (&mut ru_a, &mut rc_a)
                } else {
                    (&mut ru_b, &mut rc_b)
                };
                ru.push(stored(&m, off));
                if vis[k] {
                    rc.push(stored(&m, off));
                }
                msgs.push(m);
                off += 1;
            }
            txns.push(txn(t, seqs, *outcome));
        }
        let h = History {
            messages: msgs,
            txns,
            ..History::default()
        };
        let reads = Reads {
            uncommitted: vec![
                read(TA, Isolation::ReadUncommitted, ru_a),
                read(TB, Isolation::ReadUncommitted, ru_b),
            ],
            committed: vec![
                read(TA, Isolation::ReadCommitted, rc_a),
                read(TB, Isolation::ReadCommitted, rc_b),
            ],
            lso: Vec::new(),
        };
        let a = analyze(&h, &names(), &reads);
        assert_eq!(
            only(&a),
            vec![
                (Anomaly::G1a, 1),
                (Anomaly::NonAtomicTxn, 2),
                (Anomaly::LostTxn, 1)
            ],
            "{:?}",
            a.evidence
        );
        assert_eq!(a.ops.transactions.indeterminate_invisible, 1);
        assert_eq!(a.ops.transactions.committed, 3);
    }

    #[test]
    fn offsets_lso_and_log_starts() {
        let mut h = History::default();
        h.offset_checks.push(OffsetCheck {
            generation: 2,
            partition: 0,
            fetched: Some(10),
            acked_max_before: 12,
        });
        h.offset_checks.push(OffsetCheck {
            generation: 2,
            partition: 1,
            fetched: Some(12),
            acked_max_before: 12,
        });
        for (order, offset) in [(0, 5), (1, 7), (2, 6), (3, 8)] {
            h.group.acked.push(CommitAck {
                order,
                partition: 3,
                offset,
                generation: 1,
            });
        }
        h.deletes.push(DeleteAck {
            partition: 0,
            log_start: 40,
            generation: 1,
        });
        h.log_start_checks.push(LogStartCheck {
            generation: 2,
            partition: 0,
            log_start: 0,
            acked_max_before: 40,
        });
        let reads = Reads {
            lso: vec![LsoState {
                tp: TA,
                high_watermark: 10,
                last_stable: 7,
                waited_ms: 30_000,
            }],
            ..Reads::default()
        };
        let a = analyze(&h, &names(), &reads);
        assert_eq!(
            only(&a),
            vec![
                (Anomaly::StuckLso, 1),
                (Anomaly::OffsetRegression, 2),
                (Anomaly::LogStartRegression, 1)
            ]
        );
    }

    #[test]
    fn acked_writes_below_the_retained_log_start_are_not_lost() {
        let tp = Tp {
            topic: ChaosTopic::Retained,
            partition: 0,
        };
        let m = vec![msg(0, 0, tp, None, acked(0)), msg(0, 1, tp, None, acked(1))];
        let mut ru = read(tp, Isolation::ReadUncommitted, vec![stored(&m[1], 1)]);
        let mut rc = read(tp, Isolation::ReadCommitted, vec![stored(&m[1], 1)]);
        ru.log_start = 1;
        rc.log_start = 1;
        let h = History {
            messages: m,
            ..History::default()
        };
        let a = analyze_reads(&h, vec![ru], vec![rc]);
        assert_eq!(only(&a), vec![]);
        assert_eq!(a.ops.idempotent.acked_below_log_start, 1);
    }
}
