//! The result of a bench run, and its JSON form shaped like the OpenMessaging
//! Benchmark's `TestResult`: per-interval series (`publishRate`,
//! `publishLatency99pct`, ...) and aggregates (`aggregatedPublishLatency99pct`,
//! `aggregatedPublishLatencyQuantiles`, ...), with OMB's units: latencies in
//! milliseconds, publish delay in microseconds. fjord adds `config`,
//! `environment`, `totals`, `broker`, `rateSearch` and, for transactional
//! runs, `transactions`.
//!
//! Plain data built by the main thread after a run; `fjord report` reads the
//! same keys back.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::config::BenchConfig;
use super::env::Environment;
use super::recorder::{curve, Counters, Quantiles};

/// One status interval.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IntervalPoint {
    pub elapsed_s: f64,
    pub publish_rate: f64,
    pub publish_mb_s: f64,
    pub consume_rate: f64,
    pub error_rate: f64,
    pub backlog: u64,
    pub publish_latency_ms: Quantiles,
    pub publish_delay_us: Quantiles,
    pub end_to_end_ms: Quantiles,
}

/// One probe of the max-rate search.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RateProbe {
    pub rate: f64,
    pub acked_rate: f64,
    pub delay_p99_us: f64,
    pub backlog_at_stop: u64,
    pub sustainable: bool,
}

/// Everything one phase measured.
pub struct PhaseOutcome {
    pub rate: f64,
    pub measured_s: f64,
    pub counters: Counters,
    pub backlog_at_stop: u64,
    /// Consumers received everything sent before they were stopped.
    pub drained: bool,
    pub series: Vec<IntervalPoint>,
    pub publish_latency: Histogram<u64>,
    pub publish_delay: Histogram<u64>,
    pub end_to_end: Histogram<u64>,
    /// Transactional runs: see [`super::recorder::Recorder::txn_flush`] and
    /// the two after it.
    pub txn_flush: Histogram<u64>,
    pub txn_end: Histogram<u64>,
    pub txn_first_ack: Histogram<u64>,
    pub broker_cpu_s: Option<f64>,
    pub broker_peak_rss_bytes: Option<u64>,
}

/// OMB's suffixes for the quantiles of one metric.
const SUFFIXES: &[&str] = &[
    "Avg", "50pct", "75pct", "95pct", "99pct", "999pct", "9999pct", "Max",
];

fn values(q: &Quantiles) -> [f64; 8] {
    [q.avg, q.p50, q.p75, q.p95, q.p99, q.p999, q.p9999, q.max]
}

fn put_series(m: &mut Map<String, Value>, prefix: &str, qs: &[Quantiles]) {
    for (i, suffix) in SUFFIXES.iter().enumerate() {
        let v: Vec<f64> = qs.iter().map(|q| values(q)[i]).collect();
        m.insert(format!("{prefix}{suffix}"), json!(v));
    }
}

fn put_aggregate(m: &mut Map<String, Value>, prefix: &str, h: &Histogram<u64>, unit_us: f64) {
    let q = Quantiles::of(h, unit_us);
    for (i, suffix) in SUFFIXES.iter().enumerate() {
        m.insert(format!("aggregated{prefix}{suffix}"), json!(values(&q)[i]));
    }
    let mut curve_map = Map::new();
    for (p, v) in curve(h, unit_us) {
        curve_map.insert(format!("{p}"), json!(v));
    }
    m.insert(
        format!("aggregated{prefix}Quantiles"),
        Value::Object(curve_map),
    );
    m.insert(format!("aggregated{prefix}Count"), json!(q.count));
}

/// Builds the JSON result.
pub fn build(
    cfg: &BenchConfig,
    env: &Environment,
    o: &PhaseOutcome,
    probes: &[RateProbe],
    broker_pid: Option<u32>,
) -> Value {
    let mut m = Map::new();
    m.insert("workload".into(), json!(cfg.name));
    m.insert("driver".into(), json!(cfg.label));
    m.insert("topics".into(), json!(1));
    m.insert("partitions".into(), json!(cfg.partitions));
    m.insert("messageSize".into(), json!(cfg.message_size));
    m.insert("producersPerTopic".into(), json!(cfg.producers));
    m.insert("consumersPerTopic".into(), json!(cfg.consumers));
    m.insert(
        "intervalSeconds".into(),
        json!(cfg.status_interval.as_secs_f64()),
    );
    let s = &o.series;
    m.insert(
        "elapsedSeconds".into(),
        json!(s.iter().map(|p| p.elapsed_s).collect::<Vec<_>>()),
    );
    m.insert(
        "publishRate".into(),
        json!(s.iter().map(|p| p.publish_rate).collect::<Vec<_>>()),
    );
    m.insert(
        "publishErrorRate".into(),
        json!(s.iter().map(|p| p.error_rate).collect::<Vec<_>>()),
    );
    m.insert(
        "consumeRate".into(),
        json!(s.iter().map(|p| p.consume_rate).collect::<Vec<_>>()),
    );
    m.insert(
        "backlog".into(),
        json!(s.iter().map(|p| p.backlog).collect::<Vec<_>>()),
    );
    let pl: Vec<Quantiles> = s.iter().map(|p| p.publish_latency_ms).collect();
    let pd: Vec<Quantiles> = s.iter().map(|p| p.publish_delay_us).collect();
    let e2e: Vec<Quantiles> = s.iter().map(|p| p.end_to_end_ms).collect();
    put_series(&mut m, "publishLatency", &pl);
    put_series(&mut m, "publishDelayLatency", &pd);
    put_series(&mut m, "endToEndLatency", &e2e);
    put_aggregate(&mut m, "PublishLatency", &o.publish_latency, 1000.0);
    put_aggregate(&mut m, "PublishDelayLatency", &o.publish_delay, 1.0);
    put_aggregate(&mut m, "EndToEndLatency", &o.end_to_end, 1000.0);
    let c = &o.counters;
    let secs = o.measured_s.max(1e-9);
    let bytes = c.acked_in_window as f64 * cfg.message_size as f64;
    m.insert(
        "totals".into(),
        json!({
            "offeredRate": o.rate,
            "measuredSeconds": o.measured_s,
            "sent": c.sent,
            "acked": c.acked,
            "errors": c.errors,
            "refusedQueueFull": c.refused_all,
            "consumed": c.consumed,
            "ackedInWindow": c.acked_in_window,
            "publishRateAvg": c.acked_in_window as f64 / secs,
            "publishMBps": bytes / secs / (1024.0 * 1024.0),
            "consumeRateAvg": c.consumed as f64 / secs,
            "backlogAtStop": o.backlog_at_stop,
            "drained": o.drained,
        }),
    );
    if cfg.transaction_duration_ms > 0 {
        // Milliseconds per transaction begun inside the window: the flush of
        // what was queued, EndTxn (the rest of commit_transaction), and
        // begin → first acknowledgement.
        m.insert(
            "transactions".into(),
            json!({
                "committed": o.txn_end.len(),
                "flushMs": Quantiles::of(&o.txn_flush, 1000.0),
                "endTxnMs": Quantiles::of(&o.txn_end, 1000.0),
                "firstAckMs": Quantiles::of(&o.txn_first_ack, 1000.0),
            }),
        );
    }
    if broker_pid.is_some() || o.broker_cpu_s.is_some() {
        let gb = bytes / 1e9;
        m.insert(
            "broker".into(),
            json!({
                "pid": broker_pid,
                "cpuSeconds": o.broker_cpu_s,
                "cpuSecondsPerGB": o.broker_cpu_s.map(|cpu| if gb > 0.0 { cpu / gb } else { 0.0 }),
                "peakRssBytes": o.broker_peak_rss_bytes,
            }),
        );
    }
    m.insert("rateSearch".into(), json!(probes));
    m.insert("config".into(), json!(cfg));
    m.insert("environment".into(), json!(env));
    Value::Object(m)
}
