//! The text exposition: every shard's [`ShardSample`] merged into metric
//! families, written in the Prometheus text format 0.0.4 or, when the
//! scraper asks for it, OpenMetrics 1.0.0.
//!
//! Per-shard values keep a `shard` label (a shard is a Kafka node here, and
//! a hot shard is what an operator looks for); partition- and
//! group-partition-level series are written only with
//! `--metrics-partition-labels`, since a broker may hold 100000 partitions.
//! Committed-offset lag is a join done here, at scrape time: a group's
//! committed offsets live on its coordinator's shard, the partition's high
//! watermark on its leader's, and only the merged samples hold both.

use super::{HistogramSample, ProcessSample, ShardSample};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;

/// Content type of the Prometheus text format.
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Content type of OpenMetrics.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How to write the exposition.
#[derive(Debug, Clone, Copy, Default)]
pub struct EncodeOptions {
    pub openmetrics: bool,
    /// Per-partition and per-group-partition series.
    pub partition_labels: bool,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

struct Writer {
    out: String,
    openmetrics: bool,
}

type Labels<'a> = &'a [(&'a str, &'a str)];
/// Which of an API's histograms a family writes.
type ApiHistogram = fn(&super::ApiSample) -> &HistogramSample;
/// Which value of a partition a family writes.
type PartitionGauge = fn(&super::PartitionSample) -> f64;

impl Writer {
    /// Starts a family. `name` is without `_total` for counters.
    fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let (type_name, family) = match kind {
            Kind::Counter if !self.openmetrics => ("counter", format!("{name}_total")),
            Kind::Counter => ("counter", name.to_string()),
            Kind::Gauge => ("gauge", name.to_string()),
            Kind::Histogram => ("histogram", name.to_string()),
        };
        let _ = writeln!(self.out, "# HELP {family} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {family} {type_name}");
    }

    fn line(&mut self, name: &str, labels: Labels, extra: Option<(&str, &str)>, value: f64) {
        self.out.push_str(name);
        let mut first = true;
        for (k, v) in labels.iter().copied().chain(extra) {
            self.out.push(if first { '{' } else { ',' });
            first = false;
            let _ = write!(self.out, "{k}=\"{}\"", escape_label(v));
        }
        if !first {
            self.out.push('}');
        }
        self.out.push(' ');
        write_value(&mut self.out, value);
        self.out.push('\n');
    }

    fn counter(&mut self, name: &str, labels: Labels, value: f64) {
        self.line(&format!("{name}_total"), labels, None, value);
    }

    fn gauge(&mut self, name: &str, labels: Labels, value: f64) {
        self.line(name, labels, None, value);
    }

    fn histogram(&mut self, name: &str, labels: Labels, h: &HistogramSample) {
        let mut cumulative = 0u64;
        let bucket = format!("{name}_bucket");
        for (i, count) in h.counts.iter().enumerate() {
            cumulative += count;
            let le = match h.bounds.get(i) {
                Some(b) => format_float(*b),
                None => "+Inf".to_string(),
            };
            self.line(&bucket, labels, Some(("le", &le)), cumulative as f64);
        }
        self.line(&format!("{name}_sum"), labels, None, h.sum);
        self.line(&format!("{name}_count"), labels, None, cumulative as f64);
    }
}

fn write_value(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else {
        out.push_str(&format_float(v));
    }
}

fn format_float(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Kafka's name of an error code (`Errors` enum: `NONE`,
/// `UNKNOWN_TOPIC_OR_PARTITION`, ...), the `error` label of Kafka's
/// ErrorsPerSec; `OTHER` for codes outside the counted range.
fn error_name(code: Option<i16>) -> String {
    let Some(code) = code else {
        return "OTHER".to_string();
    };
    match kafka_protocol::ResponseError::try_from_code(code) {
        None => "NONE".to_string(),
        Some(kafka_protocol::ResponseError::Unknown(c)) => format!("CODE_{c}"),
        Some(e) => {
            // The crate's variants are Kafka's names in CamelCase.
            let camel = format!("{e:?}");
            let mut out = String::with_capacity(camel.len() + 8);
            for (i, ch) in camel.chars().enumerate() {
                if ch.is_ascii_uppercase() && i > 0 {
                    out.push('_');
                }
                out.push(ch.to_ascii_uppercase());
            }
            out
        }
    }
}

fn api_name(key: i16) -> String {
    match kafka_protocol::messages::ApiKey::try_from(key) {
        Ok(k) => format!("{k:?}"),
        Err(_) => format!("ApiKey{key}"),
    }
}

/// Writes the exposition of `shards` (in any order) and `process`.
pub fn encode(shards: &[ShardSample], process: &ProcessSample, opts: EncodeOptions) -> String {
    let mut w = Writer {
        out: String::with_capacity(64 * 1024),
        openmetrics: opts.openmetrics,
    };
    let mut shards: Vec<&ShardSample> = shards.iter().collect();
    shards.sort_by_key(|s| s.shard);
    let ids: Vec<String> = shards.iter().map(|s| s.shard.to_string()).collect();
    let per_shard =
        |w: &mut Writer, name: &str, kind: Kind, help: &str, f: &dyn Fn(&ShardSample) -> f64| {
            w.family(name, kind, help);
            for (s, id) in shards.iter().zip(&ids) {
                let labels = [("shard", id.as_str())];
                match kind {
                    Kind::Counter => w.counter(name, &labels, f(s)),
                    _ => w.gauge(name, &labels, f(s)),
                }
            }
        };

    // Requests.
    let apis = |w: &mut Writer, name: &str, help: &str, f: &dyn Fn(&super::ApiSample) -> u64| {
        w.family(name, Kind::Counter, help);
        for (s, id) in shards.iter().zip(&ids) {
            for a in &s.apis {
                let api = api_name(a.api_key);
                w.counter(name, &[("shard", id), ("api", &api)], f(a) as f64);
            }
        }
    };
    apis(
        &mut w,
        "fjord_requests",
        "Requests answered (or closed), by API (Kafka RequestsPerSec).",
        &|a| a.requests,
    );
    apis(&mut w, "fjord_requests_closed", "Requests that closed their connection instead of an answer (unsupported version, undecodable body).", &|a| a.closed);
    apis(
        &mut w,
        "fjord_request_bytes",
        "Request frame bytes read, by API (Kafka BytesInPerSec counts produce record bytes only).",
        &|a| a.bytes_in,
    );
    apis(&mut w, "fjord_response_bytes", "Response bytes handed to the socket, by API (Kafka BytesOutPerSec counts fetch record bytes only).", &|a| a.bytes_out);
    w.family(
        "fjord_request_errors",
        Kind::Counter,
        "Error codes in responses, by API and code, NONE included, each partition's and topic's as Kafka counts them (Kafka ErrorsPerSec).",
    );
    for (s, id) in shards.iter().zip(&ids) {
        for e in &s.errors {
            let api = api_name(e.api_key);
            let error = error_name(e.code);
            w.counter(
                "fjord_request_errors",
                &[("shard", id), ("api", &api), ("error", &error)],
                e.count as f64,
            );
        }
    }
    let hists: [(&str, &str, ApiHistogram); 5] = [
        ("fjord_request_total_seconds", "Frame read to response handed to the socket (Kafka TotalTimeMs).", |a| &a.total),
        ("fjord_request_queue_seconds", "Frame read to handler start (Kafka RequestQueueTimeMs).", |a| &a.queue),
        ("fjord_request_local_seconds", "Handler start to answer ready, less the remote time (Kafka LocalTimeMs).", |a| &a.local),
        ("fjord_request_remote_seconds", "Time the handler waited for the log (acks=-1 write and fdatasync) or a long poll (Kafka RemoteTimeMs).", |a| &a.remote),
        ("fjord_request_send_seconds", "Answer ready to its bytes handed to the socket, behind earlier answers of the connection (Kafka ResponseQueueTimeMs + ResponseSendTimeMs).", |a| &a.send),
    ];
    for (name, help, get) in hists {
        w.family(name, Kind::Histogram, help);
        for (s, id) in shards.iter().zip(&ids) {
            for a in &s.apis {
                let api = api_name(a.api_key);
                w.histogram(name, &[("shard", id), ("api", &api)], get(a));
            }
        }
    }
    per_shard(
        &mut w,
        "fjord_requests_in_flight",
        Kind::Gauge,
        "Requests read and not yet answered.",
        &|s| s.inflight_requests as f64,
    );
    per_shard(
        &mut w,
        "fjord_connections",
        Kind::Gauge,
        "Connections open (Kafka connection-count).",
        &|s| s.connections_open as f64,
    );
    per_shard(
        &mut w,
        "fjord_connections_accepted",
        Kind::Counter,
        "Connections accepted (Kafka connection-creation-total).",
        &|s| s.connections_accepted as f64,
    );
    per_shard(
        &mut w,
        "fjord_connections_closed",
        Kind::Counter,
        "Connections closed (Kafka connection-close-total).",
        &|s| s.connections_closed as f64,
    );
    per_shard(
        &mut w,
        "fjord_connections_refused",
        Kind::Counter,
        "Connections refused at --max-connections-per-shard.",
        &|s| s.connections_refused as f64,
    );

    // Log.
    per_shard(
        &mut w,
        "fjord_log_appends",
        Kind::Counter,
        "Batches appended to partition logs (Kafka MessagesInPerSec counts records).",
        &|s| s.log.appends as f64,
    );
    per_shard(
        &mut w,
        "fjord_log_append_bytes",
        Kind::Counter,
        "Batch bytes appended to partition logs (Kafka BytesInPerSec).",
        &|s| s.log.append_bytes as f64,
    );
    per_shard(&mut w, "fjord_log_fsyncs", Kind::Counter, "fdatasyncs of segment files by the group-commit syncer (Kafka LogFlushRateAndTimeMs count).", &|s| s.log.fsyncs as f64);
    w.family(
        "fjord_log_fsync_seconds",
        Kind::Histogram,
        "fdatasync latency (Kafka LogFlushRateAndTimeMs).",
    );
    for (s, id) in shards.iter().zip(&ids) {
        w.histogram("fjord_log_fsync_seconds", &[("shard", id)], &s.log.fsync);
    }
    w.family(
        "fjord_log_fsync_batch_offsets",
        Kind::Histogram,
        "Offsets one fdatasync made durable (group-commit batch size).",
    );
    for (s, id) in shards.iter().zip(&ids) {
        w.histogram(
            "fjord_log_fsync_batch_offsets",
            &[("shard", id)],
            &s.log.fsync_batch_appends,
        );
    }
    per_shard(
        &mut w,
        "fjord_tail_cache_hits",
        Kind::Counter,
        "Fetch reads answered from the tail cache.",
        &|s| s.log.cache_hits as f64,
    );
    per_shard(
        &mut w,
        "fjord_tail_cache_hit_bytes",
        Kind::Counter,
        "Bytes answered from the tail cache.",
        &|s| s.log.cache_hit_bytes as f64,
    );
    per_shard(
        &mut w,
        "fjord_tail_cache_misses",
        Kind::Counter,
        "Fetch reads the tail cache could not answer.",
        &|s| s.log.cache_misses as f64,
    );
    per_shard(
        &mut w,
        "fjord_tail_cache_bytes",
        Kind::Gauge,
        "Memory the tail cache holds.",
        &|s| s.log.cache_used_bytes as f64,
    );
    per_shard(
        &mut w,
        "fjord_tail_cache_capacity_bytes",
        Kind::Gauge,
        "--tail-cache-bytes.",
        &|s| s.log.cache_capacity_bytes as f64,
    );
    per_shard(
        &mut w,
        "fjord_log_catch_up_read_bytes",
        Kind::Counter,
        "Bytes fetches read from segment files (direct reads or sendfile).",
        &|s| s.log.catch_up_read_bytes as f64,
    );
    per_shard(
        &mut w,
        "fjord_log_cleaner_cleanings",
        Kind::Counter,
        "Cleanings of compacted logs (Kafka's log cleaner runs).",
        &|s| s.log.cleanings as f64,
    );
    per_shard(
        &mut w,
        "fjord_log_cleaner_read_bytes",
        Kind::Counter,
        "Bytes of log the cleanings' cleaning passes read.",
        &|s| s.log.cleaner_read_bytes as f64,
    );
    per_shard(
        &mut w,
        "fjord_log_cleaner_written_bytes",
        Kind::Counter,
        "Bytes of cleaned log the cleanings wrote.",
        &|s| s.log.cleaner_written_bytes as f64,
    );
    per_shard(
        &mut w,
        "fjord_log_cleaner_seconds",
        Kind::Counter,
        "Time spent cleaning, from the job's hand-off to the last swap.",
        &|s| s.log.cleaner_seconds,
    );
    per_shard(
        &mut w,
        "fjord_log_cleaner_last_dirty_ratio",
        Kind::Gauge,
        "Dirty ratio of the log the last cleaning took (Kafka max-dirty-percent / 100, for the last one).",
        &|s| s.log.cleaner_last_dirty_ratio,
    );
    per_shard(
        &mut w,
        "fjord_log_unwritten_bytes",
        Kind::Gauge,
        "Bytes appended and not yet written to segment files (bounded by --staged-bytes-max).",
        &|s| s.log.unwritten_bytes as f64,
    );
    per_shard(
        &mut w,
        "fjord_log_recovery_seconds",
        Kind::Gauge,
        "Start of the shard to its partitions opened and recovered.",
        &|s| s.log.recovery_seconds,
    );
    per_shard(
        &mut w,
        "fjord_partitions",
        Kind::Gauge,
        "Partitions this shard leads, internal ones included (Kafka PartitionCount).",
        &|s| s.partitions.len() as f64,
    );
    per_shard(
        &mut w,
        "fjord_log_segments",
        Kind::Gauge,
        "Segments of the partitions this shard leads (Kafka NumLogSegments, summed).",
        &|s| s.partitions.iter().map(|p| p.segments).sum::<u64>() as f64,
    );
    per_shard(
        &mut w,
        "fjord_log_size_bytes",
        Kind::Gauge,
        "Bytes of the partitions this shard leads (Kafka Size, summed).",
        &|s| s.partitions.iter().map(|p| p.size_bytes).sum::<u64>() as f64,
    );
    per_shard(&mut w, "fjord_under_replicated_partitions", Kind::Gauge, "Partitions with fewer in-sync replicas than replicas (Kafka UnderReplicatedPartitions): 0, fjord keeps one replica.", &|_| 0.0);
    per_shard(&mut w, "fjord_offline_partitions", Kind::Gauge, "Partitions without a leader (Kafka OfflinePartitionsCount): 0, every partition is led by its shard.", &|_| 0.0);
    if opts.partition_labels {
        let parts: [(&str, &str, PartitionGauge); 6] = [
            (
                "fjord_partition_log_start_offset",
                "Log start offset (Kafka LogStartOffset).",
                |p| p.log_start as f64,
            ),
            (
                "fjord_partition_high_watermark",
                "High watermark (Kafka's partition HW).",
                |p| p.high_watermark as f64,
            ),
            (
                "fjord_partition_last_stable_offset",
                "Last stable offset.",
                |p| p.last_stable as f64,
            ),
            (
                "fjord_partition_log_end_offset",
                "Log end offset (Kafka LogEndOffset).",
                |p| p.log_end as f64,
            ),
            (
                "fjord_partition_size_bytes",
                "Partition log size (Kafka Size).",
                |p| p.size_bytes as f64,
            ),
            (
                "fjord_partition_segments",
                "Partition segments (Kafka NumLogSegments).",
                |p| p.segments as f64,
            ),
        ];
        for (name, help, get) in parts {
            w.family(name, Kind::Gauge, help);
            for (s, id) in shards.iter().zip(&ids) {
                for p in &s.partitions {
                    let part = p.partition.to_string();
                    w.gauge(
                        name,
                        &[("shard", id), ("topic", &p.topic), ("partition", &part)],
                        get(p),
                    );
                }
            }
        }
    }

    // Groups and transactions.
    w.family(
        "fjord_groups",
        Kind::Gauge,
        "Consumer groups by state (Kafka NumGroupsStable, NumGroupsEmpty, ...).",
    );
    for (s, id) in shards.iter().zip(&ids) {
        for (state, n) in &s.groups_by_state {
            w.gauge(
                "fjord_groups",
                &[("shard", id), ("state", state)],
                *n as f64,
            );
        }
    }
    per_shard(
        &mut w,
        "fjord_group_members",
        Kind::Gauge,
        "Members of the groups this shard coordinates.",
        &|s| s.group_members as f64,
    );
    per_shard(
        &mut w,
        "fjord_group_rebalances",
        Kind::Counter,
        "Generations started by a rebalance (Kafka group-completed-rebalance-count).",
        &|s| s.rebalances as f64,
    );
    let ends: HashMap<(&str, i32), i64> = shards
        .iter()
        .flat_map(|s| s.partitions.iter())
        .map(|p| ((p.topic.as_str(), p.partition), p.high_watermark))
        .collect();
    let mut group_lag: BTreeMap<&str, i64> = BTreeMap::new();
    for c in shards.iter().flat_map(|s| s.committed.iter()) {
        if let Some(end) = ends.get(&(c.topic.as_str(), c.partition)) {
            *group_lag.entry(c.group.as_str()).or_default() += (end - c.offset).max(0);
        }
    }
    w.family("fjord_consumer_group_lag", Kind::Gauge, "Sum over a group's committed partitions of high watermark minus committed offset (Kafka's consumer-group lag).");
    for (group, lag) in &group_lag {
        w.gauge("fjord_consumer_group_lag", &[("group", group)], *lag as f64);
    }
    if opts.partition_labels {
        w.family(
            "fjord_consumer_group_committed_offset",
            Kind::Gauge,
            "A group's committed offset of a partition.",
        );
        for c in shards.iter().flat_map(|s| s.committed.iter()) {
            let part = c.partition.to_string();
            w.gauge(
                "fjord_consumer_group_committed_offset",
                &[
                    ("group", &c.group),
                    ("topic", &c.topic),
                    ("partition", &part),
                ],
                c.offset as f64,
            );
        }
        w.family(
            "fjord_consumer_group_partition_lag",
            Kind::Gauge,
            "High watermark minus the group's committed offset of a partition.",
        );
        for c in shards.iter().flat_map(|s| s.committed.iter()) {
            if let Some(end) = ends.get(&(c.topic.as_str(), c.partition)) {
                let part = c.partition.to_string();
                w.gauge(
                    "fjord_consumer_group_partition_lag",
                    &[
                        ("group", &c.group),
                        ("topic", &c.topic),
                        ("partition", &part),
                    ],
                    (end - c.offset) as f64,
                );
            }
        }
    }
    per_shard(
        &mut w,
        "fjord_transactions_open",
        Kind::Gauge,
        "Transactions ongoing or preparing at this shard's coordinator.",
        &|s| s.open_transactions as f64,
    );
    per_shard(
        &mut w,
        "fjord_transactional_ids",
        Kind::Gauge,
        "Transactional ids this shard's coordinator holds.",
        &|s| s.transactional_ids as f64,
    );
    per_shard(
        &mut w,
        "fjord_txn_markers",
        Kind::Counter,
        "COMMIT/ABORT markers appended to partitions this shard leads.",
        &|s| s.markers as f64,
    );
    per_shard(
        &mut w,
        "fjord_fenced_producers",
        Kind::Counter,
        "Requests refused for a stale producer epoch (INVALID_PRODUCER_EPOCH).",
        &|s| s.fenced_producers as f64,
    );
    w.family(
        "fjord_transaction_seconds",
        Kind::Histogram,
        "Transactions completed at this shard's coordinator: first partition or offsets added to every COMMIT/ABORT marker written, by outcome.",
    );
    for (s, id) in shards.iter().zip(&ids) {
        for (outcome, h) in [("commit", &s.txn_committed), ("abort", &s.txn_aborted)] {
            w.histogram(
                "fjord_transaction_seconds",
                &[("shard", id), ("outcome", outcome)],
                h,
            );
        }
    }
    per_shard(
        &mut w,
        "fjord_producer_id_blocks",
        Kind::Counter,
        "Producer-id blocks this shard was handed (Kafka AllocateProducerIds requests).",
        &|s| s.producer_id_blocks as f64,
    );
    per_shard(
        &mut w,
        "fjord_producer_ids_available",
        Kind::Gauge,
        "Producer ids left in this shard's block.",
        &|s| s.producer_ids_left as f64,
    );

    // Process and runtime.
    per_shard(
        &mut w,
        "fjord_shard_cpu_seconds",
        Kind::Counter,
        "CPU time of the shard's thread.",
        &|s| s.cpu_seconds,
    );
    per_shard(
        &mut w,
        "fjord_shard_tasks_executed",
        Kind::Counter,
        "Tasks glommio ran on the shard.",
        &|s| s.executor_tasks as f64,
    );
    per_shard(
        &mut w,
        "fjord_shard_scheduler_runs",
        Kind::Counter,
        "Times glommio's scheduler ran on the shard.",
        &|s| s.executor_scheduler_runs as f64,
    );
    w.family(
        "fjord_shard_task_queue_runtime_seconds",
        Kind::Counter,
        "Time a glommio task queue ran on the shard.",
    );
    for (s, id) in shards.iter().zip(&ids) {
        for (queue, secs) in &s.task_queue_runtime_seconds {
            w.line(
                "fjord_shard_task_queue_runtime_seconds_total",
                &[("shard", id), ("queue", queue)],
                None,
                *secs,
            );
        }
    }
    per_shard(
        &mut w,
        "fjord_shard_files_opened",
        Kind::Counter,
        "Files glommio opened on the shard.",
        &|s| s.io.files_opened as f64,
    );
    per_shard(
        &mut w,
        "fjord_shard_files_closed",
        Kind::Counter,
        "Files glommio closed on the shard.",
        &|s| s.io.files_closed as f64,
    );
    type IoKinds = fn(&super::IoSample) -> Vec<(&'static str, (u64, u64))>;
    let io_families: [(&str, &str, &str, IoKinds); 2] = [
        (
            "fjord_shard_file_reads",
            "fjord_shard_file_read_bytes",
            "File reads glommio completed on the shard, by kind (direct: O_DIRECT through io_uring; buffered: through the page cache; deduped: answered by a read already in flight).",
            |io| vec![("direct", io.direct_reads), ("buffered", io.buffered_reads), ("deduped", io.deduped_reads)],
        ),
        (
            "fjord_shard_file_writes",
            "fjord_shard_file_write_bytes",
            "File writes glommio completed on the shard, by kind (direct: O_DIRECT; buffered: through the page cache).",
            |io| vec![("direct", io.direct_writes), ("buffered", io.buffered_writes)],
        ),
    ];
    for (ops_name, bytes_name, help, kinds) in io_families {
        for (name, bytes) in [(ops_name, false), (bytes_name, true)] {
            let help = if bytes {
                format!("Bytes of the {}", help.to_lowercase())
            } else {
                help.to_string()
            };
            w.family(name, Kind::Counter, &help);
            for (s, id) in shards.iter().zip(&ids) {
                for (kind, (n, b)) in kinds(&s.io) {
                    let v = if bytes { b } else { n };
                    w.counter(name, &[("shard", id), ("kind", kind)], v as f64);
                }
            }
        }
    }
    per_shard(
        &mut w,
        "fjord_shard_io_memory_bytes",
        Kind::Gauge,
        "Registered I/O memory glommio was given (--io-memory-bytes or the default budget).",
        &|s| s.io_memory_bytes as f64,
    );
    per_shard(
        &mut w,
        "fjord_shard_up",
        Kind::Gauge,
        "1: the shard answered this scrape and serves.",
        &|s| if s.ready { 1.0 } else { 0.0 },
    );
    w.family(
        "process_resident_memory_bytes",
        Kind::Gauge,
        "Resident memory of the broker process.",
    );
    w.gauge(
        "process_resident_memory_bytes",
        &[],
        process.resident_bytes as f64,
    );
    w.family(
        "process_open_fds",
        Kind::Gauge,
        "Open file descriptors of the broker process.",
    );
    w.gauge("process_open_fds", &[], process.open_fds as f64);
    w.family(
        "process_start_time_seconds",
        Kind::Gauge,
        "Start of the broker process, seconds since the Unix epoch.",
    );
    w.gauge(
        "process_start_time_seconds",
        &[],
        process.start_time_seconds,
    );
    w.family(
        "fjord_scrape_shards_missing",
        Kind::Gauge,
        "Shards that did not answer this scrape within its timeout (their series are missing).",
    );
    w.gauge(
        "fjord_scrape_shards_missing",
        &[],
        process.shards_missing as f64,
    );
    if opts.openmetrics {
        w.out.push_str("# EOF\n");
    }
    w.out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{ApiSample, CommittedSample, PartitionSample};

    fn sample() -> Vec<ShardSample> {
        let h = crate::metrics::Histogram::new();
        h.record(std::time::Duration::from_micros(30));
        let api = ApiSample {
            api_key: 0,
            requests: 3,
            total: h.sample(),
            queue: h.sample(),
            local: h.sample(),
            remote: h.sample(),
            send: h.sample(),
            ..ApiSample::default()
        };
        vec![
            ShardSample {
                shard: 1,
                committed: vec![CommittedSample {
                    group: "g\"1".into(),
                    topic: "t".into(),
                    partition: 0,
                    offset: 4,
                }],
                ..ShardSample::default()
            },
            ShardSample {
                shard: 0,
                apis: vec![api],
                partitions: vec![PartitionSample {
                    topic: "t".into(),
                    partition: 0,
                    high_watermark: 10,
                    ..PartitionSample::default()
                }],
                ..ShardSample::default()
            },
        ]
    }

    #[test]
    fn lag_joins_the_coordinators_commit_with_the_leaders_high_watermark() {
        let text = encode(
            &sample(),
            &ProcessSample::default(),
            EncodeOptions {
                openmetrics: false,
                partition_labels: true,
            },
        );
        assert!(
            text.contains("fjord_consumer_group_lag{group=\"g\\\"1\"} 6\n"),
            "{text}"
        );
        assert!(text.contains(
            "fjord_consumer_group_partition_lag{group=\"g\\\"1\",topic=\"t\",partition=\"0\"} 6\n"
        ));
        assert!(text.contains("fjord_requests_total{shard=\"0\",api=\"Produce\"} 3\n"));
        assert!(text.contains("# TYPE fjord_requests_total counter\n"));
        assert!(text.contains(
            "fjord_request_total_seconds_bucket{shard=\"0\",api=\"Produce\",le=\"+Inf\"} 1\n"
        ));
        assert!(!text.contains("# EOF"));
    }

    #[test]
    fn openmetrics_names_counter_families_without_total_and_ends_with_eof() {
        let text = encode(
            &sample(),
            &ProcessSample::default(),
            EncodeOptions {
                openmetrics: true,
                partition_labels: false,
            },
        );
        assert!(text.contains("# TYPE fjord_requests counter\n"));
        assert!(text.contains("fjord_requests_total{shard=\"0\",api=\"Produce\"} 3\n"));
        assert!(text.ends_with("# EOF\n"));
        assert!(!text.contains("fjord_partition_high_watermark"));
    }

    #[test]
    fn error_labels_are_kafkas_error_names() {
        assert_eq!(error_name(Some(0)), "NONE");
        assert_eq!(error_name(Some(3)), "UNKNOWN_TOPIC_OR_PARTITION");
        assert_eq!(error_name(Some(6)), "NOT_LEADER_OR_FOLLOWER");
        assert_eq!(error_name(Some(-1)), "UNKNOWN_SERVER_ERROR");
        assert_eq!(error_name(Some(47)), "INVALID_PRODUCER_EPOCH");
        assert_eq!(error_name(Some(134)), "CODE_134");
        assert_eq!(error_name(None), "OTHER");
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_count_matches_the_last() {
        let h = HistogramSample {
            bounds: vec![1.0, 2.0],
            counts: vec![1, 2, 3],
            sum: 9.5,
        };
        let mut w = Writer {
            out: String::new(),
            openmetrics: false,
        };
        w.histogram("x", &[], &h);
        assert_eq!(w.out, "x_bucket{le=\"1\"} 1\nx_bucket{le=\"2\"} 3\nx_bucket{le=\"+Inf\"} 6\nx_sum 9.5\nx_count 6\n");
    }
}
