//! The result of a chaos run: the summary table on stdout and the JSON
//! document (`--out`). Plain formatting of data the run already holds.

use serde_json::{json, Value};

use super::check::{Analysis, Anomaly, MessageCounts};
use super::cluster::NodeStats;
use super::history::History;
use super::readback::{LsoState, TopicSpec};
use super::{ChaosArgs, CycleRecord, EVENTS_KEPT_MAX};

/// Evidence lines printed per anomaly (the JSON keeps more).
pub const EVIDENCE_PRINTED_MAX: usize = 5;

/// Everything a report is made of.
pub struct Report<'a> {
    pub args: &'a ChaosArgs,
    pub seed: u64,
    pub duration_s: f64,
    pub cycles: &'a [CycleRecord],
    pub analysis: &'a Analysis,
    pub lso: &'a [LsoState],
    pub history: &'a History,
    pub run_errors: &'a [String],
    pub topics: &'a [TopicSpec],
    pub nodes: &'a [NodeStats],
}

fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

impl Report<'_> {
    fn mode(&self) -> &'static str {
        if self.args.fsync_acks {
            "--fsync-acks"
        } else {
            "default durability"
        }
    }

    fn ready_ms(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.cycles.iter().map(|c| c.restart_ready_ms).collect();
        v.sort_unstable();
        v
    }

    /// The summary table.
    pub fn print(&self) {
        let a = self.analysis;
        let o = &a.ops;
        println!();
        println!(
            "fjord chaos: seed {}, {} {} cycles, {}, {:.0} s",
            self.seed,
            self.cycles.len(),
            if self.args.nodes > 1 {
                "fault"
            } else {
                "kill -9"
            },
            self.mode(),
            self.duration_s
        );
        if self.args.nodes > 1 {
            println!(
                "{} nodes{}, replication factor {}, min.insync.replicas {}",
                self.args.nodes,
                if self.args.netns {
                    " in network namespaces"
                } else {
                    " on loopback"
                },
                self.args.replication_factor(),
                self.args.min_insync_replicas
            );
            println!(
                "{:<6} {:>15} {:>17} {:>12} {:>5} {:>9}",
                "node", "kills (leader)", "kills (follower)", "kills (other)", "cuts", "restarts"
            );
            for n in self.nodes {
                println!(
                    "{:<6} {:>15} {:>17} {:>12} {:>5} {:>9}",
                    n.node,
                    n.kills_as_leader,
                    n.kills_as_follower,
                    n.kills_other,
                    n.cuts,
                    n.restarts
                );
            }
        }
        let ready = self.ready_ms();
        println!(
            "restart to ready: min {} ms, median {} ms, max {} ms",
            percentile(&ready, 0.0),
            percentile(&ready, 0.5),
            percentile(&ready, 1.0)
        );
        println!();
        println!(
            "{:<22} {:>9} {:>9} {:>7} {:>14} {:>10}",
            "messages", "sent", "acked", "failed", "indeterminate", "(in log)"
        );
        let row = |name: &str, m: &MessageCounts| {
            println!(
                "{:<22} {:>9} {:>9} {:>7} {:>14} {:>10}",
                name, m.sent, m.acked, m.failed, m.indeterminate, m.indeterminate_present
            );
        };
        row("idempotent", &o.idempotent);
        row("transactional", &o.transactional);
        for (kind, m) in [
            ("idempotent", &o.idempotent),
            ("transactional", &o.transactional),
        ] {
            for (e, n) in &m.errors {
                println!("  {kind} {e}: {n}");
            }
        }
        let t = &o.transactions;
        println!(
            "transactions: {} (committed {}, aborted on purpose {}, aborted after an error {}, indeterminate {}: {} visible whole, {} invisible)",
            t.total,
            t.committed,
            t.aborted_on_purpose,
            t.aborted_after_error,
            t.indeterminate,
            t.indeterminate_visible,
            t.indeterminate_invisible
        );
        for (e, n) in &t.errors {
            println!("  transaction errors {e}: {n}");
        }
        println!(
            "group offset commits: {} requests, {} partition offsets acknowledged, {} failed; {} checks after restarts",
            o.offset_commits,
            o.offset_commit_partitions_acked,
            o.offset_commit_partitions_failed,
            o.offset_checks
        );
        println!(
            "DeleteRecords acknowledged: {}; log start checks: {}; acknowledged messages below the retained log start: {}",
            o.deletes_acked,
            o.log_start_checks,
            o.idempotent.acked_below_log_start
        );
        println!(
            "read back: {} records read_uncommitted, {} read_committed; acknowledged {:.1} MB",
            o.records_read_uncommitted,
            o.records_read_committed,
            (o.idempotent.acked_bytes + o.transactional.acked_bytes) as f64 / 1e6
        );
        println!();
        println!("{:<22} {:>7}  meaning", "anomaly", "count");
        for k in Anomaly::ALL {
            println!("{:<22} {:>7}  {}", k.name(), a.count(k), k.meaning());
        }
        println!("{:<22} {:>7}", "total", a.total());
        if self.history.min_insync_one {
            println!(
                "acknowledged writes lost while the ISR was the leader alone (allowed by min.insync.replicas=1, not counted above): {}",
                o.lost_writes_allowed_min_insync_1
            );
            for l in a.allowed_evidence.iter().take(EVIDENCE_PRINTED_MAX) {
                println!("  {l}");
            }
        }
        for (k, lines) in &a.evidence {
            println!();
            println!("{} ({}):", k.name(), a.count(*k));
            for l in lines.iter().take(EVIDENCE_PRINTED_MAX) {
                println!("  {l}");
            }
        }
        for e in self.run_errors {
            println!("run error: {e}");
        }
    }

    /// The JSON document.
    pub fn json(&self) -> Value {
        let a = self.analysis;
        let anomalies: serde_json::Map<String, Value> = Anomaly::ALL
            .iter()
            .map(|k| (k.name().to_string(), json!(a.count(*k))))
            .collect();
        let evidence: serde_json::Map<String, Value> = a
            .evidence
            .iter()
            .map(|(k, v)| (k.name().to_string(), json!(v)))
            .collect();
        let ready = self.ready_ms();
        let args = self.args;
        let events: Vec<_> = self.history.events.iter().take(EVENTS_KEPT_MAX).collect();
        json!({
            "fjordChaos": 1,
            "seed": self.seed,
            "command": std::env::args().collect::<Vec<_>>().join(" "),
            "environment": crate::bench::env::Environment::detect(),
            "config": {
                "cycles": args.cycles,
                "cycleMs": args.cycle_ms,
                "fsyncAcks": args.fsync_acks,
                "brokerCores": args.broker_cores,
                "idempotentProducers": args.idempotent_producers,
                "transactionalProducers": args.transactional_producers,
                "groupConsumers": args.group_consumers,
                "ratePerIdempotentProducer": args.rate,
                "abortFraction": args.abort_fraction,
                "valueMaxBytes": args.value_max_bytes,
                "restartPauseMsMax": args.restart_pause_ms_max,
                "longOutageEvery": args.long_outage_every,
                "longOutageMs": super::LONG_OUTAGE_MS,
                "transactionTimeoutMs": super::clients::TXN_TIMEOUT_MS,
                "idempotentMessageTimeoutMs": args.idempotent_message_timeout_ms,
                "idempotentMaxInFlight": args.idempotent_max_in_flight,
                "deleteRecordsShare": args.delete_records_share,
                "nodes": args.nodes,
                "netns": args.netns,
                "replicationFactor": if args.nodes > 1 { args.replication_factor() } else { 1 },
                "minInsyncReplicas": (args.nodes > 1).then_some(args.min_insync_replicas),
                "brokerSessionTimeoutMs": (args.nodes > 1).then_some(args.broker_session_timeout_ms),
                "replicaLagTimeMaxMs": (args.nodes > 1).then_some(args.replica_lag_time_max_ms),
                "transactionalMessageTimeoutMs": super::clients::TXN_MESSAGE_TIMEOUT_MS,
                "topics": self.topics.iter().map(|t| json!({
                    "name": t.topic.name(),
                    "partitions": t.partitions,
                    "configs": t.configs.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
                })).collect::<Vec<_>>(),
            },
            "durationS": self.duration_s,
            "restartReadyMs": {
                "min": percentile(&ready, 0.0),
                "median": percentile(&ready, 0.5),
                "max": percentile(&ready, 1.0),
            },
            "cycles": self.cycles,
            "operations": a.ops,
            "anomalies": anomalies,
            "anomalyTotal": a.total(),
            "nodes": self.nodes,
            "lostWritesAllowedByMinInsync1": self.history.min_insync_one.then_some(a.ops.lost_writes_allowed_min_insync_1),
            "lostWritesAllowedEvidence": a.allowed_evidence,
            "isrSpans": self.history.isr.iter().map(|(tp, v)| (tp.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "evidence": evidence,
            "lso": self.lso,
            "clientEvents": events,
            "clientEventsTotal": self.history.events.len(),
            "runErrors": self.run_errors,
            "ok": a.total() == 0 && self.run_errors.is_empty(),
        })
    }
}
