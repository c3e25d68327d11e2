//! The metrics endpoint (`--metrics-listen`) against a real broker driven
//! by librdkafka: the counters move by what the workload did, committed-
//! offset lag is end − committed, the Prometheus text format passes
//! `promtool check metrics`, and a real Prometheus server scrapes the
//! endpoint (negotiating OpenMetrics, as Prometheus 2.x does).
//!
//! `promtool` and `prometheus` come from Debian's `prometheus` package,
//! which `.ci/run` installs.

mod common;

use common::client::{self, await_deliveries, base_config, create_topic, send, TestMessage};
use common::raw::{only_partition, produce_request, RawClient};
use common::{free_port_base, wait_for, Broker, BrokerOpts};
use fjord::record::{BatchBuilder, Compression};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{FetchRequest, MetadataRequest, ProduceRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
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
    for part in ["queue", "local", "remote", "send"] {
        let name = format!("fjord_request_{part}_seconds_count");
        assert_eq!(sum(&s, &name, &produce), MESSAGES as f64, "{name}");
    }
    // Every Produce answered with NONE for its one partition.
    assert_eq!(
        sum(
            &s,
            "fjord_request_errors_total",
            &["api=\"Produce\"", "error=\"NONE\""]
        ),
        MESSAGES as f64
    );
    // The topic's segment files were opened through glommio, and
    // glommio's counters are kept across scrapes (glommio resets its own
    // on every read).
    let opened = sum(&s, "fjord_shard_files_opened_total", &[]);
    assert!(opened > 0.0, "files opened {opened}");
    let tasks = sum(&s, "fjord_shard_tasks_executed_total", &[]);
    let again = samples(&http_get(&addr, "/metrics", None).2);
    assert!(
        sum(&again, "fjord_shard_tasks_executed_total", &[]) > tasks,
        "glommio's task counter did not grow between scrapes"
    );
    assert!(sum(&again, "fjord_shard_files_opened_total", &[]) >= opened);
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

/// Produce v9 of one record to `topic`-`partition` at `port`: its error code.
fn raw_produce(port: u16, topic: &str, partition: i32) -> i16 {
    let batch = BatchBuilder::new(Compression::None)
        .record(None, Some(b"counted"), &[], 1_700_000_000_000)
        .build()
        .freeze();
    let mut c = RawClient::connect(port);
    let resp = c.request::<ProduceRequest>(9, &produce_request(topic, partition, -1, batch));
    only_partition(&resp).error_code
}

/// A sample's value with exactly these labels (0 if absent).
fn value(s: &HashMap<String, f64>, name: &str, labels: &str) -> f64 {
    s.get(&format!("{name}{{{labels}}}"))
        .copied()
        .unwrap_or(0.0)
}

/// Kafka's ErrorsPerSec counts each response's `errorCounts()`: one count
/// per partition (and, for Metadata, per topic) error code, NONE included.
/// A Produce to a partition another shard leads, one to a topic that does
/// not exist and one that succeeds are counted on the shard that answered,
/// each under its code; a Metadata of a two-partition topic counts three
/// NONEs (two partitions, one topic).
#[test]
fn error_codes_are_counted_per_api_and_code_as_kafka_counts_them() {
    let (broker, addr) = start();
    let bootstrap = broker.bootstrap();
    create_topic(&bootstrap, "errs", 2, &[]);
    let leaders = client::partition_leaders(&bootstrap, "errs");
    let (&on_0, _) = leaders
        .iter()
        .find(|(_, &l)| l == 0)
        .expect("a partition on shard 0");
    let (&on_1, _) = leaders
        .iter()
        .find(|(_, &l)| l == 1)
        .expect("a partition on shard 1");
    let before = samples(&http_get(&addr, "/metrics", None).2);

    let port0 = broker.port_of(0);
    assert_eq!(
        raw_produce(port0, "errs", on_1),
        ResponseError::NotLeaderOrFollower.code()
    );
    assert_eq!(
        raw_produce(port0, "no-such-topic", 0),
        ResponseError::UnknownTopicOrPartition.code()
    );
    assert_eq!(raw_produce(port0, "errs", on_0), 0);
    let mut c = RawClient::connect(port0);
    let meta = c.request::<MetadataRequest>(
        9,
        &MetadataRequest::default()
            .with_topics(Some(vec![
                kafka_protocol::messages::metadata_request::MetadataRequestTopic::default()
                    .with_name(Some(TopicName(StrBytes::from_static_str("errs")))),
            ]))
            .with_allow_auto_topic_creation(false),
    );
    assert_eq!(meta.topics[0].partitions.len(), 2);

    let after = samples(&http_get(&addr, "/metrics", None).2);
    let moved = |api: &str, error: &str| {
        let labels = format!("shard=\"0\",api=\"{api}\",error=\"{error}\"");
        value(&after, "fjord_request_errors_total", &labels)
            - value(&before, "fjord_request_errors_total", &labels)
    };
    assert_eq!(moved("Produce", "NOT_LEADER_OR_FOLLOWER"), 1.0);
    assert_eq!(moved("Produce", "UNKNOWN_TOPIC_OR_PARTITION"), 1.0);
    assert_eq!(moved("Produce", "NONE"), 1.0);
    assert_eq!(moved("Metadata", "NONE"), 3.0);
    promtool_check(&http_get(&addr, "/metrics", None).2);
}

/// A Fetch that parks for its whole `max_wait_ms` spends that wait as
/// remote time (Kafka's RemoteTimeMs: the DelayedFetch purgatory), not as
/// local time; a Produce with acks=-1 records a remote time too (its wait
/// for the write), and every request records both parts.
#[test]
fn a_parked_fetch_waits_in_remote_time() {
    const MAX_WAIT_MS: i32 = 300;
    let (broker, addr) = start();
    let bootstrap = broker.bootstrap();
    create_topic(&bootstrap, "parked", 1, &[]);
    let port = client::leader_port(&broker, "parked", 0);
    assert_eq!(raw_produce(port, "parked", 0), 0);
    let before = samples(&http_get(&addr, "/metrics", None).2);

    // At the end of the log: nothing to return, so it parks until max_wait.
    let mut c = RawClient::connect(port);
    let fetch = FetchRequest::default()
        .with_max_wait_ms(MAX_WAIT_MS)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_static_str("parked")))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(1)
                .with_partition_max_bytes(1 << 20)])]);
    let resp = c.request::<FetchRequest>(12, &fetch);
    assert_eq!(resp.responses[0].partitions[0].error_code, 0);
    assert!(resp.responses[0].partitions[0]
        .records
        .as_ref()
        .is_none_or(|r| r.is_empty()));

    let after = samples(&http_get(&addr, "/metrics", None).2);
    let fetch_api = ["api=\"Fetch\""];
    let delta = |name: &str| sum(&after, name, &fetch_api) - sum(&before, name, &fetch_api);
    assert_eq!(delta("fjord_request_remote_seconds_count"), 1.0);
    assert_eq!(delta("fjord_request_local_seconds_count"), 1.0);
    // The broker waits at least max_wait (its timer fires at or after the
    // deadline); 10 % slack for the clock reads around the wait.
    let remote = delta("fjord_request_remote_seconds_sum");
    assert!(
        remote >= 0.9 * MAX_WAIT_MS as f64 / 1000.0,
        "remote time {remote} s for a fetch parked {MAX_WAIT_MS} ms"
    );
    let produce = ["api=\"Produce\""];
    assert_eq!(
        sum(&after, "fjord_request_remote_seconds_count", &produce),
        1.0
    );
    assert_eq!(
        sum(&after, "fjord_request_local_seconds_count", &produce),
        1.0
    );
}

/// One committed and one aborted transaction of librdkafka: each is
/// counted in the duration histogram under its outcome once its markers
/// are written (after EndTxn is answered, so the scrape is retried), the
/// markers are counted, and the shard that handed out the producer id
/// counts the producer-id block it was given.
#[test]
fn transactions_are_counted_by_outcome_with_their_markers() {
    let (broker, addr) = start();
    let bootstrap = broker.bootstrap();
    create_topic(&bootstrap, "txns", 1, &[]);
    let p: BaseProducer = base_config(&bootstrap)
        .set("transactional.id", "metered-txn")
        .set("linger.ms", "0")
        .create()
        .expect("transactional producer");
    p.init_transactions(TIMEOUT).expect("init_transactions");
    for commit in [true, false] {
        p.begin_transaction().unwrap();
        p.send(BaseRecord::<(), str>::to("txns").payload("v").partition(0))
            .map_err(|(e, _)| e)
            .expect("enqueue");
        p.flush(TIMEOUT).expect("flush");
        if commit {
            p.commit_transaction(TIMEOUT).expect("commit");
        } else {
            p.abort_transaction(TIMEOUT).expect("abort");
        }
    }
    let s = wait_for(TIMEOUT, "both transactions' markers written", || {
        let s = samples(&http_get(&addr, "/metrics", None).2);
        let n = sum(&s, "fjord_transaction_seconds_count", &[]);
        (n >= 2.0).then_some(s)
    });
    let count = |outcome: &str| {
        let label = format!("outcome=\"{outcome}\"");
        sum(&s, "fjord_transaction_seconds_count", &[label.as_str()])
    };
    assert_eq!(count("commit"), 1.0);
    assert_eq!(count("abort"), 1.0);
    assert_eq!(sum(&s, "fjord_txn_markers_total", &[]), 2.0);
    assert!(sum(&s, "fjord_producer_id_blocks_total", &[]) >= 1.0);
    promtool_check(&http_get(&addr, "/metrics", None).2);
}

/// An HTTP request with a body: (status line, body).
fn http_put(addr: &str, path: &str, body: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the endpoint");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "PUT {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read the answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head.split("\r\n").next().unwrap_or(head);
    (status.to_string(), body.to_string())
}

/// A Metadata request at a version fjord does not serve: the broker closes
/// the connection and logs it at debug level.
fn provoke_debug_line(port: u16) {
    let mut frame = Vec::new();
    frame.extend_from_slice(&3i16.to_be_bytes()); // Metadata
    frame.extend_from_slice(&99i16.to_be_bytes()); // an unknown version
    frame.extend_from_slice(&1i32.to_be_bytes()); // correlation id
    frame.extend_from_slice(&(-1i16).to_be_bytes()); // null client id
    frame.push(0); // no tagged fields (header v2)
    let mut c = RawClient::connect(port);
    c.send_frame(&frame);
    c.assert_closed(TIMEOUT, "Metadata v99");
}

/// The log filter changes at run time through `PUT /loglevel`, on the
/// shard that serves the endpoint and on the others: a debug line the
/// broker does not print at `info` appears after the change to `debug`
/// (from both shards) and no longer after the change back. A filter that
/// does not parse, or a body over the limit, changes nothing.
#[test]
fn the_log_level_changes_at_run_time_through_the_endpoint() {
    const DEBUG_LINE: &str = "unsupported request version; closing";
    let (broker, addr) = start();
    let (status, body) = {
        let (status, _, body) = http_get(&addr, "/loglevel", None);
        (status, body)
    };
    assert!(status.contains("200"), "{status}");
    assert_eq!(body.trim(), "info", "the tests' RUST_LOG");

    let from = broker.stderr_len();
    provoke_debug_line(broker.port_of(1));
    assert!(!broker.stderr_since(from).contains(DEBUG_LINE));

    let (status, body) = http_put(&addr, "/loglevel", "debug");
    assert!(status.contains("200"), "{status} {body}");
    assert_eq!(body.trim(), "debug");
    assert_eq!(http_get(&addr, "/loglevel", None).2.trim(), "debug");
    for shard in 0..2 {
        let from = broker.stderr_len();
        provoke_debug_line(broker.port_of(shard));
        wait_for(TIMEOUT, "the debug line", || {
            broker.stderr_since(from).contains(DEBUG_LINE).then_some(())
        });
    }

    let (status, _) = http_put(&addr, "/loglevel", "info,fjord=nonsense");
    assert!(status.contains("400"), "{status}");
    let (status, _) = http_put(&addr, "/loglevel", &"x".repeat(5000));
    assert!(status.contains("413"), "{status}");
    assert_eq!(http_get(&addr, "/loglevel", None).2.trim(), "debug");

    let (status, _) = http_put(&addr, "/loglevel", "info");
    assert!(status.contains("200"), "{status}");
    let from = broker.stderr_len();
    provoke_debug_line(broker.port_of(0));
    // The close was logged (or not) before the connection closed.
    assert!(
        !broker.stderr_since(from).contains(DEBUG_LINE),
        "{}",
        broker.stderr_since(from)
    );
    assert!(broker.stderr_since(0).contains("log filter changed"));
}

/// A JoinGroup that waits for the rebalance to complete spends that wait
/// as remote time (Kafka's join purgatory): member B joins a group whose
/// member A rejoins only 300 ms later, so B's JoinGroup waits that long.
#[test]
fn a_join_waiting_for_the_rebalance_is_remote_time() {
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    use kafka_protocol::messages::{GroupId, JoinGroupRequest};
    const REJOIN_AFTER_MS: u64 = 300;
    let (broker, addr) = start();
    let group = "remote-join";
    let port = common::raw::group_coordinator_port(broker.port_of(0), group);
    let join = |member: &str| {
        JoinGroupRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str(group)))
            .with_session_timeout_ms(10_000)
            .with_rebalance_timeout_ms(10_000)
            .with_member_id(StrBytes::from_string(member.to_string()))
            .with_protocol_type(StrBytes::from_static_str("consumer"))
            .with_protocols(vec![JoinGroupRequestProtocol::default()
                .with_name(StrBytes::from_static_str("range"))
                .with_metadata(bytes::Bytes::from_static(&[0, 0, 0, 0, 0, 0, 0, 0]))])
    };
    // A joins alone (JoinGroup v3: no MEMBER_ID_REQUIRED round trip).
    let mut a = RawClient::connect(port);
    let ra = a.request(3, &join(""));
    assert_eq!(ra.error_code, 0);
    let a_id = ra.member_id.to_string();
    let before = samples(&http_get(&addr, "/metrics", None).2);

    // B joins: the rebalance waits for A, which rejoins 300 ms later.
    let b = std::thread::spawn(move || {
        let mut b = RawClient::connect(port);
        b.request(3, &join("")).error_code
    });
    std::thread::sleep(Duration::from_millis(REJOIN_AFTER_MS));
    let ra = a.request(3, &join(&a_id));
    assert_eq!(ra.error_code, 0);
    assert_eq!(b.join().expect("member B"), 0);

    let after = samples(&http_get(&addr, "/metrics", None).2);
    let api = ["api=\"JoinGroup\""];
    let delta = |name: &str| sum(&after, name, &api) - sum(&before, name, &api);
    assert_eq!(delta("fjord_request_remote_seconds_count"), 2.0);
    let remote = delta("fjord_request_remote_seconds_sum");
    assert!(
        remote >= 0.9 * REJOIN_AFTER_MS as f64 / 1000.0,
        "remote time {remote} s for a join that waited {REJOIN_AFTER_MS} ms"
    );
}

#[test]
fn a_log_cleaning_is_counted_with_what_it_read_and_wrote() {
    let port = free_port_base(1);
    let addr = format!("127.0.0.1:{port}");
    let broker = Broker::start(
        BrokerOpts::default()
            .cores(1)
            .arg("--metrics-listen")
            .arg(&addr)
            .arg("--log-cleaner-backoff-ms")
            .arg("100"),
    );
    let topic = "cleaned-metrics";
    create_topic(
        &broker.bootstrap(),
        topic,
        1,
        &[
            ("cleanup.policy", "compact"),
            ("segment.ms", "100"),
            ("min.cleanable.dirty.ratio", "0.01"),
        ],
    );
    let p = client::producer(&broker.bootstrap(), &[("linger.ms", "0")]);
    let mut sent = 0;
    // Rounds of the same ten keys, each in a segment of its own.
    for round in 0..3 {
        for k in 0..10 {
            let msg = TestMessage {
                id: sent,
                key: format!("k{k}").into_bytes(),
                value: format!("v{round}").into_bytes(),
                headers: Vec::new(),
            };
            send(&p, topic, &msg);
            sent += 1;
        }
        await_deliveries(&p, sent, Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(250));
    }
    // Superseded records are not written again: a cleaning that found
    // some writes less than it read.
    let s = wait_for(
        Duration::from_secs(60),
        "a cleaning that removed records",
        || {
            let s = samples(&http_get(&addr, "/metrics", None).2);
            let read = sum(&s, "fjord_log_cleaner_read_bytes_total", &[]);
            let written = sum(&s, "fjord_log_cleaner_written_bytes_total", &[]);
            (sum(&s, "fjord_log_cleaner_cleanings_total", &[]) >= 1.0
                && written < read
                && read > 0.0)
                .then_some(s)
        },
    );
    assert!(sum(&s, "fjord_log_cleaner_seconds_total", &[]) > 0.0);
    let ratio = sum(&s, "fjord_log_cleaner_last_dirty_ratio", &[]);
    assert!(ratio > 0.0 && ratio <= 1.0, "dirty ratio {ratio}");
}
