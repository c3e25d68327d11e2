//! The metrics endpoint (`--metrics-listen`) against a real broker driven
//! by librdkafka: the counters move by what the workload did, committed-
//! offset lag is end − committed, the Prometheus text format passes
//! `promtool check metrics`, and a real Prometheus server scrapes the
//! endpoint (negotiating OpenMetrics, as Prometheus 2.x does).
//!
//! `promtool` and `prometheus` come from Debian's `prometheus` package,
//! which `.ci/run` installs.

mod common;

use common::client::{self, await_deliveries, create_topic, send, TestMessage};
use common::{free_port_base, wait_for, Broker, BrokerOpts};
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Produce requests the workload sends, one message each.
const MESSAGES: usize = 40;
/// Value bytes of each message.
const VALUE_BYTES: usize = 1000;
/// Per-request bytes beyond the value: request header, topic name,
/// batch and record headers. A produce request of one 1000-byte record is
/// ~1100 bytes; this bounds it from above.
const REQUEST_OVERHEAD_BYTES_MAX: usize = 200;
/// The offset the group commits, so lag = MESSAGES − COMMITTED.
const COMMITTED: i64 = 15;
const TIMEOUT: Duration = Duration::from_secs(60);

/// GET `path` from `addr`: (status line, headers, body).
fn http_get(addr: &str, path: &str, accept: Option<&str>) -> (String, String, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the endpoint");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let accept = accept
        .map(|a| format!("Accept: {a}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read the answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (status.to_string(), headers.to_string(), body.to_string())
}

/// Every sample of the exposition: (name with labels as written, value).
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// The sum of the samples named `name` whose labels contain every one of `labels`.
fn sum(s: &HashMap<String, f64>, name: &str, labels: &[&str]) -> f64 {
    s.iter()
        .filter(|(k, _)| k.split('{').next() == Some(name))
        .filter(|(k, _)| labels.iter().all(|l| k.contains(l)))
        .map(|(_, v)| v)
        .sum()
}

fn promtool_check(text: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package `prometheus`, installed by .ci/run)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn start() -> (Broker, String) {
    let port = free_port_base(1);
    let addr = format!("127.0.0.1:{port}");
    let broker = Broker::start(
        BrokerOpts::default()
            .cores(2)
            .arg("--metrics-listen")
            .arg(&addr)
            .arg("--metrics-partition-labels")
            .arg("--group-initial-rebalance-delay-ms")
            .arg("0"),
    );
    (broker, addr)
}

#[test]
fn counters_move_by_what_the_workload_did_and_lag_is_end_minus_committed() {
    let (broker, addr) = start();
    let bootstrap = broker.bootstrap();
    create_topic(&bootstrap, "metered", 1, &[]);

    let (status, _, body) = http_get(&addr, "/readyz", None);
    assert!(status.contains("200"), "{status} {body}");
    let (status, _, _) = http_get(&addr, "/healthz", None);
    assert!(status.contains("200"), "{status}");
    let (status, _, _) = http_get(&addr, "/nothing", None);
    assert!(status.contains("404"), "{status}");
    let before = samples(&http_get(&addr, "/metrics", None).2);
    assert_eq!(
        sum(&before, "fjord_requests_total", &["api=\"Produce\""]),
        0.0
    );

    // One message per Produce request: each is sent after the previous
    // one's delivery report, with no linger.
    let producer = client::producer(&bootstrap, &[("linger.ms", "0"), ("acks", "all")]);
    for id in 0..MESSAGES {
        let msg = TestMessage {
            id,
            key: Vec::new(),
            value: vec![b'x'; VALUE_BYTES],
            headers: Vec::new(),
        };
        send(&producer, "metered", &msg);
        await_deliveries(&producer, id + 1, TIMEOUT);
    }
    let deliveries = await_deliveries(&producer, MESSAGES, TIMEOUT);
    assert!(
        deliveries.iter().all(|d| d.error.is_none()),
        "{deliveries:?}"
    );

    // A group commits offset COMMITTED of the partition.
    let consumer = client::consumer(&bootstrap, &[("group.id", "metered-group")]);
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("metered", 0, Offset::Offset(COMMITTED))
        .unwrap();
    consumer.commit(&tpl, CommitMode::Sync).expect("commit");

    let (status, headers, text) = http_get(&addr, "/metrics", None);
    assert!(status.contains("200"), "{status}");
    assert!(headers.contains("text/plain; version=0.0.4"), "{headers}");
    let s = samples(&text);
    let produce = ["api=\"Produce\""];
    assert_eq!(
        sum(&s, "fjord_requests_total", &produce),
        MESSAGES as f64,
        "one Produce request per message"
    );
    assert_eq!(
        sum(&s, "fjord_request_total_seconds_count", &produce),
        MESSAGES as f64
    );
    for part in ["queue", "handle", "send"] {
        let name = format!("fjord_request_{part}_seconds_count");
        assert_eq!(sum(&s, &name, &produce), MESSAGES as f64, "{name}");
    }
    let bytes_in = sum(&s, "fjord_request_bytes_total", &produce);
    let (low, high) = (
        (MESSAGES * VALUE_BYTES) as f64,
        (MESSAGES * (VALUE_BYTES + REQUEST_OVERHEAD_BYTES_MAX)) as f64,
    );
    assert!(
        bytes_in >= low && bytes_in <= high,
        "Produce bytes in {bytes_in} not in {low}..{high}"
    );
    assert!(sum(&s, "fjord_response_bytes_total", &produce) > 0.0);
    // Appends: the topic's MESSAGES batches, plus the group's commit on
    // __consumer_offsets.
    let appends = sum(&s, "fjord_log_appends_total", &[]);
    assert!(
        appends >= MESSAGES as f64 && appends <= MESSAGES as f64 + 5.0,
        "appends {appends}"
    );
    let append_bytes = sum(&s, "fjord_log_append_bytes_total", &[]);
    assert!(
        append_bytes >= low && append_bytes <= high,
        "append bytes {append_bytes}"
    );
    let tp = ["topic=\"metered\"", "partition=\"0\""];
    assert_eq!(
        sum(&s, "fjord_partition_log_end_offset", &tp),
        MESSAGES as f64
    );
    assert_eq!(
        sum(&s, "fjord_partition_high_watermark", &tp),
        MESSAGES as f64
    );
    let group = ["group=\"metered-group\""];
    assert_eq!(
        sum(&s, "fjord_consumer_group_committed_offset", &group),
        COMMITTED as f64
    );
    let lag = MESSAGES as f64 - COMMITTED as f64;
    assert_eq!(sum(&s, "fjord_consumer_group_partition_lag", &group), lag);
    assert_eq!(sum(&s, "fjord_consumer_group_lag", &group), lag);
    assert!(sum(&s, "fjord_connections_accepted_total", &[]) >= 2.0);
    assert!(sum(&s, "fjord_shard_cpu_seconds_total", &[]) > 0.0);
    assert_eq!(sum(&s, "fjord_shard_up", &[]), 2.0);
    assert_eq!(sum(&s, "fjord_scrape_shards_missing", &[]), 0.0);
    assert!(sum(&s, "process_resident_memory_bytes", &[]) > 0.0);
    assert!(sum(&s, "process_open_fds", &[]) > 0.0);

    promtool_check(&text);
    let (_, headers, om) = http_get(
        &addr,
        "/metrics",
        Some("application/openmetrics-text;version=1.0.0,text/plain;q=0.5"),
    );
    assert!(
        headers.contains("application/openmetrics-text"),
        "{headers}"
    );
    assert!(om.ends_with("# EOF\n"));
    // OpenMetrics names a counter's family without `_total`; promtool's
    // linter reads only the Prometheus text format, so this format is
    // checked by the Prometheus server of the next test, whose scrapes
    // ask for OpenMetrics first.
    assert!(om.contains("# TYPE fjord_requests counter\n"));
    assert!(om.contains("fjord_requests_total{shard="));
}

#[test]
fn a_real_prometheus_server_scrapes_the_endpoint() {
    let (broker, addr) = start();
    create_topic(&broker.bootstrap(), "scraped", 1, &[]);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: fjord\n    static_configs:\n      - targets: ['{addr}']\n"
        ),
    )
    .unwrap();
    let web = format!("127.0.0.1:{}", free_port_base(1));
    let mut server = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address={web}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus (Debian package `prometheus`, installed by .ci/run)");
    let scraped = std::panic::catch_unwind(|| {
        wait_for(TIMEOUT, "Prometheus to scrape fjord", || {
            let query = "/api/v1/query?query=fjord_shard_up";
            let body = TcpStream::connect(&web)
                .ok()
                .map(|_| http_get(&web, query, None).2)?;
            // Both shards' series, each 1.
            (body.contains("\"shard\":\"0\"") && body.contains("\"shard\":\"1\"")).then_some(body)
        })
    });
    let targets = TcpStream::connect(&web)
        .ok()
        .map(|_| http_get(&web, "/api/v1/targets", None).2);
    let _ = server.kill();
    let _ = server.wait();
    let body = scraped.unwrap_or_else(|_| panic!("no scrape; targets: {targets:?}"));
    assert!(body.contains("\"1\"]"), "{body}");
    let targets = targets.unwrap_or_default();
    assert!(targets.contains("\"health\":\"up\""), "{targets}");
}

#[test]
fn a_metrics_address_given_that_is_in_use_fails_the_start() {
    let (mut broker, addr) = start();
    broker.stop();
    let _held = std::net::TcpListener::bind(&addr).expect("hold the metrics address");
    let (status, output) = broker.start_expecting_exit(Duration::from_secs(30));
    assert!(!status.success(), "{output}");
    assert!(
        output.contains(&format!("cannot listen on {addr} for metrics")),
        "{output}"
    );
}
