//! The connection limits of `fjord serve` hold and answer as documented:
//! connections per shard (closed at accept over the limit), the idle
//! timeout (a silent connection is closed, a busy one is not), and the
//! bytes of requests read but unanswered per connection (the broker stops
//! reading instead of buffering), the partitions one request and the broker
//! may create, and the bytes staged for a slow disk (acks=0 producers are
//! held back, the broker's memory stays flat).

mod common;

use common::client::create_topic;
use common::raw::{produce_request, RawClient, ReadOutcome};
use common::{Broker, BrokerOpts};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{
    ApiVersionsRequest, BrokerId, FetchRequest, MetadataRequest, ProduceRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use std::time::{Duration, Instant};

const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

fn api_versions_ok(c: &mut RawClient) {
    let resp = c.request::<ApiVersionsRequest>(0, &ApiVersionsRequest::default());
    assert_eq!(resp.error_code, 0);
}

#[test]
fn connections_over_the_shard_limit_are_closed_at_accept() {
    let broker = Broker::start(
        BrokerOpts::default()
            .cores(1)
            .arg("--max-connections-per-shard")
            .arg("4"),
    );
    let mut open: Vec<RawClient> = (0..4).map(|_| RawClient::connect(broker.port)).collect();
    for c in &mut open {
        api_versions_ok(c);
    }
    let mut over = RawClient::connect(broker.port);
    over.send(0, &ApiVersionsRequest::default());
    over.assert_closed(CLOSE_TIMEOUT, "a fifth connection over a limit of 4");
    // The four still answer; once one closes there is room again.
    for c in &mut open {
        api_versions_ok(c);
    }
    drop(open.pop());
    let deadline = Instant::now() + CLOSE_TIMEOUT;
    loop {
        let mut again = RawClient::connect(broker.port);
        let id = again.send(0, &ApiVersionsRequest::default());
        match again.read_frame(Duration::from_secs(2)) {
            ReadOutcome::Frame(_) => break,
            other => {
                let _ = id;
                assert!(
                    Instant::now() < deadline,
                    "a connection is accepted again once one closed: {other:?}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

#[test]
fn an_idle_connection_is_closed_and_a_busy_one_is_not() {
    let broker = Broker::start(
        BrokerOpts::default()
            .cores(1)
            .arg("--connections-max-idle-ms")
            .arg("700"),
    );
    let mut idle = RawClient::connect(broker.port);
    api_versions_ok(&mut idle);
    let mut busy = RawClient::connect(broker.port);
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(2_100) {
        api_versions_ok(&mut busy);
        std::thread::sleep(Duration::from_millis(200));
    }
    api_versions_ok(&mut busy);
    idle.assert_closed(
        CLOSE_TIMEOUT,
        "a connection idle past connections.max.idle.ms",
    );
}

fn long_poll(topic: &str, max_wait_ms: i32) -> FetchRequest {
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_current_leader_epoch(-1)
                .with_fetch_offset(0)
                .with_last_fetched_epoch(-1)
                .with_log_start_offset(-1)
                .with_partition_max_bytes(1 << 20)])])
}

/// With a long poll in flight on a connection at its byte limit, the broker
/// stops reading that connection: 64 pipelined 1 MiB requests do not all
/// get in (without the limit the 64 would, `inflight_requests_max` being
/// 64). Once the poll ends every request is read and answered in order.
#[test]
fn a_connection_at_its_byte_limit_is_not_read_until_answers_go_out() {
    const FRAMES: usize = 64;
    const FRAME_BYTES: usize = 1 << 20;
    let broker = Broker::start(
        BrokerOpts::default()
            .cores(1)
            .arg("--connection-queued-max-request-bytes")
            .arg("1"),
    );
    let topic = "limits-bytes";
    create_topic(&broker.bootstrap(), topic, 1, &[]);
    let mut c = RawClient::connect(broker.port);
    let poll_id = c.send(4, &long_poll(topic, 6_000));
    // Produce requests to an unknown topic: each is answered with an error,
    // so nothing is written and only the request bytes matter.
    let records = bytes::Bytes::from(vec![0u8; FRAME_BYTES]);
    let mut pipelined = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..FRAMES {
        let (frame, id) =
            c.encode_frame(9, &produce_request("limits-nowhere", 0, 1, records.clone()));
        pipelined.extend_from_slice(&frame);
        ids.push(id);
    }
    let sent = c.send_bytes_within(&pipelined, Duration::from_secs(2));
    assert!(
        sent < pipelined.len() / 2,
        "the broker stopped reading the connection at its limit: {sent} of {} bytes went in",
        pipelined.len()
    );
    // The poll ends (6 s); the rest then goes in and everything is answered.
    let rest = c.send_bytes_within(&pipelined[sent..], Duration::from_secs(60));
    assert_eq!(
        sent + rest,
        pipelined.len(),
        "everything is read once the poll ended"
    );
    let _ = c.receive::<FetchRequest>(4, poll_id);
    for id in ids {
        let resp = c.receive::<ProduceRequest>(9, id);
        assert_eq!(resp.responses.len(), 1);
    }
    // And the broker still serves.
    let md = c.request::<MetadataRequest>(9, &MetadataRequest::default().with_topics(None));
    assert_eq!(md.brokers.len(), 1);
}

/// CreateTopics and CreatePartitions respect the partitions one request may
/// create and the broker's total, with INVALID_PARTITIONS for the topics
/// over either, explicit replica assignments included.
#[test]
fn topic_creation_is_bounded_per_request_and_in_total() {
    use common::client::{admin, admin_opts, block_on};
    use rdkafka::admin::{NewPartitions, NewTopic, TopicReplication};
    use rdkafka::types::RDKafkaErrorCode;

    let broker = Broker::start(
        BrokerOpts::default()
            .cores(2)
            .arg("--create-topics-partitions-max")
            .arg("10")
            .arg("--partitions-max")
            .arg("25"),
    );
    let admin = admin(&broker.bootstrap());
    let create = |topics: &[NewTopic<'_>]| -> Vec<Result<String, RDKafkaErrorCode>> {
        block_on(admin.create_topics(topics, &admin_opts()))
            .expect("create_topics")
            .into_iter()
            .map(|r| r.map_err(|(_, code)| code))
            .collect()
    };
    let new = |name: &'static str, n: i32| NewTopic::new(name, n, TopicReplication::Fixed(1));

    // One request: 6 fit, the next 6 do not (4 left), 3 still do.
    let got = create(&[new("lim-a", 6), new("lim-b", 6), new("lim-c", 3)]);
    assert_eq!(got[0], Ok("lim-a".into()));
    assert_eq!(got[1], Err(RDKafkaErrorCode::InvalidPartitions));
    assert_eq!(got[2], Ok("lim-c".into()));
    // Explicit assignments count the same: 11 partitions on node 0.
    let assigned: Vec<Vec<i32>> = (0..11).map(|_| vec![0]).collect();
    let refs: Vec<&[i32]> = assigned.iter().map(|v| v.as_slice()).collect();
    let explicit = NewTopic::new("lim-explicit", 11, TopicReplication::Variable(&refs));
    assert_eq!(
        create(&[explicit])[0],
        Err(RDKafkaErrorCode::InvalidPartitions)
    );
    // In total: 9 exist; 10 more make 19; 7 more would make 26 > 25.
    assert_eq!(create(&[new("lim-d", 10)])[0], Ok("lim-d".into()));
    assert_eq!(
        create(&[new("lim-e", 7)])[0],
        Err(RDKafkaErrorCode::InvalidPartitions)
    );
    assert_eq!(create(&[new("lim-f", 6)])[0], Ok("lim-f".into()));
    // CreatePartitions: the broker is full (25).
    let grown = block_on(admin.create_partitions(&[NewPartitions::new("lim-c", 4)], &admin_opts()))
        .expect("create_partitions");
    assert_eq!(
        grown[0].as_ref().map_err(|(_, c)| *c),
        Err(RDKafkaErrorCode::InvalidPartitions)
    );
}

/// acks=0 producers faster than the disk are held back at
/// `--staged-bytes-max`: with every segment write delayed (a slow disk), a
/// client pushing 128 MiB of acks=0 Produce as fast as its socket takes
/// them leaves the broker's resident memory bounded by the limits it was
/// given (staged, queued and cached bytes), not by what the client sent.
/// With the staged limit out of the way (`--staged-bytes-max` 1 GiB) the
/// broker reads everything and stages it, and this test fails.
#[test]
fn acks0_producers_faster_than_a_slow_disk_are_held_back() {
    const BATCH_BYTES: usize = 256 << 10;
    const TOTAL_BYTES: usize = 128 << 20;
    const LIMIT_BYTES: usize = 4 << 20;
    /// Staged + queued + cached limits (16 MiB) plus allocator slack.
    const RSS_GROWTH_MAX: u64 = 48 << 20;
    const SEND_FOR: Duration = Duration::from_secs(20);
    let limit = LIMIT_BYTES.to_string();
    let mut broker = Broker::start(
        BrokerOpts::default()
            .cores(1)
            .arg("--debug-write-delay-ms")
            .arg("100")
            .arg("--staged-bytes-max")
            .arg(limit.clone())
            .arg("--queued-max-request-bytes")
            .arg(limit.clone())
            .arg("--connection-queued-max-request-bytes")
            .arg(limit.clone())
            .arg("--tail-cache-bytes")
            .arg(limit),
    );
    let topic = "limits-acks0-slow-disk";
    create_topic(&broker.bootstrap(), topic, 1, &[]);
    let pid = broker.pid().expect("broker pid");
    let mut value = vec![0u8; BATCH_BYTES - 100];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for b in value.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let batch = fjord::record::BatchBuilder::new(fjord::record::Compression::None)
        .record(None, Some(&value), &[], 1_700_000_000_000)
        .build()
        .freeze();
    // One acknowledged write first: the partition is open and warm.
    let mut c = RawClient::connect(broker.port);
    let resp = c.request::<ProduceRequest>(9, &produce_request(topic, 0, 1, batch.clone()));
    assert_eq!(resp.responses[0].partition_responses[0].error_code, 0);
    let baseline = common::rss_bytes(pid);
    let (frame, _) = c.encode_frame(9, &produce_request(topic, 0, 0, batch));
    let sender = std::thread::spawn(move || {
        let deadline = Instant::now() + SEND_FOR;
        let mut sent = 0usize;
        while sent < TOTAL_BYTES && Instant::now() < deadline {
            let n = c.send_bytes_within(&frame, deadline.saturating_duration_since(Instant::now()));
            sent += n;
            if n < frame.len() {
                break;
            }
        }
        sent
    });
    let mut peak = baseline;
    while !sender.is_finished() {
        peak = peak.max(common::rss_bytes(pid));
        std::thread::sleep(Duration::from_millis(50));
    }
    let sent = sender.join().expect("sender");
    let growth = peak.saturating_sub(baseline);
    eprintln!(
        "sent {sent} bytes of acks=0 Produce; broker RSS {baseline} -> peak {peak} (+{growth})"
    );
    assert!(
        growth < RSS_GROWTH_MAX,
        "the broker's memory grew by {growth} bytes while a client sent {sent} bytes of acks=0 Produce to a slow disk"
    );
    broker.assert_alive();
}

/// Many idle connections cost the broker a bounded amount of memory each
/// and the limit answers past them: 300 connections that each sent one
/// ApiVersions and then stay silent grow the broker's resident memory by
/// less than 64 KiB apiece, and the 301st is closed at accept.
#[test]
fn many_idle_connections_hold_bounded_memory_and_the_limit_answers() {
    const CONNECTIONS: usize = 300;
    const PER_CONNECTION_BYTES_MAX: u64 = 64 << 10;
    let mut broker = Broker::start(
        BrokerOpts::default()
            .cores(1)
            .arg("--max-connections-per-shard")
            .arg(CONNECTIONS.to_string()),
    );
    let pid = broker.pid().expect("broker pid");
    let mut first = RawClient::connect(broker.port);
    api_versions_ok(&mut first);
    let baseline = common::rss_bytes(pid);
    let mut open = vec![first];
    while open.len() < CONNECTIONS {
        let mut c = RawClient::connect(broker.port);
        api_versions_ok(&mut c);
        open.push(c);
    }
    let grown = common::rss_bytes(pid).saturating_sub(baseline);
    eprintln!("{CONNECTIONS} idle connections: broker RSS +{grown} bytes");
    assert!(
        grown < PER_CONNECTION_BYTES_MAX * CONNECTIONS as u64,
        "{CONNECTIONS} idle connections grew the broker's memory by {grown} bytes"
    );
    let mut over = RawClient::connect(broker.port);
    over.send(0, &ApiVersionsRequest::default());
    over.assert_closed(CLOSE_TIMEOUT, "a connection over the limit");
    api_versions_ok(&mut open[0]);
    broker.assert_alive();
}
