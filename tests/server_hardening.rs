//! Hostile or misconfigured clients cannot crash a shard or touch the
//! broker's internal state: a Fetch naming one partition 40,000 times (it
//! used to overflow glommio's waker count and kill shard 0), and the
//! internal topics' protection (no config changes, no new partitions, no
//! produce from clients).
//!
//! After each, the broker is checked to be alive and serving on every shard.

mod common;

use common::client::{self, await_deliveries, create_topic, send, TestMessage};
use common::raw::{only_partition, produce_request, RawClient};
use common::{wait_for, Broker, BrokerOpts};
use fjord::record::{BatchBuilder, Compression};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{BrokerId, FetchRequest, MetadataRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use std::time::Duration;

const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

/// The broker answers Metadata on every shard, and a fresh librdkafka
/// producer and consumer round-trip a message through `topic`.
fn assert_serving(broker: &mut Broker, topic: &str, partitions: i32, produced: &mut usize) {
    broker.assert_alive();
    for shard in 0..broker.cores() {
        let mut c = RawClient::connect(broker.port_of(shard));
        let md = c.request::<MetadataRequest>(9, &MetadataRequest::default().with_topics(None));
        assert_eq!(
            md.brokers.len(),
            broker.cores(),
            "shard {shard} answers Metadata"
        );
    }
    let producer = client::producer(&broker.bootstrap(), &[("acks", "all")]);
    let m = TestMessage {
        id: *produced,
        key: format!("k{produced}").into_bytes(),
        value: format!("still-serving-{produced}").into_bytes(),
        headers: vec![],
    };
    send(&producer, topic, &m);
    let d = await_deliveries(&producer, 1, CLIENT_TIMEOUT);
    assert!(d[0].error.is_none(), "produce: {:?}", d[0].error);
    *produced += 1;
    let consumed = client::consume(
        &broker.bootstrap(),
        topic,
        partitions,
        *produced,
        Duration::from_millis(200),
        CLIENT_TIMEOUT,
    );
    assert_eq!(
        consumed.len(),
        *produced,
        "every message so far is consumed"
    );
    broker.assert_alive();
}

fn fetch_v4(topic: &str, partition: i32, times: usize, max_wait_ms: i32) -> FetchRequest {
    let p = FetchPartition::default()
        .with_partition(partition)
        .with_current_leader_epoch(-1)
        .with_fetch_offset(0)
        .with_last_fetched_epoch(-1)
        .with_log_start_offset(-1)
        .with_partition_max_bytes(1 << 20);
    let t = FetchTopic::default()
        .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
        .with_partitions(vec![p; times]);
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(50 << 20)
        .with_isolation_level(0)
        .with_topics(vec![t])
}

/// The reproduced remote crash: one Fetch v4 naming one empty partition
/// 40,000 times at its high watermark parked 40,000 clones of the request
/// task's waker, past glommio's `i16` count, and shard 0 panicked. Kafka
/// answers each topic-partition once.
#[test]
fn fetch_naming_one_partition_40000_times_is_answered_once() {
    let mut broker = Broker::start(BrokerOpts::default().cores(2));
    let topic = "hardening-dup-fetch";
    create_topic(&broker.bootstrap(), topic, 2, &[]);
    let leader = client::leader_port(&broker, topic, 0);
    let mut c = RawClient::connect(leader);
    for round in 0..3 {
        let resp = c.request::<FetchRequest>(4, &fetch_v4(topic, 0, 40_000, 300));
        assert_eq!(resp.responses.len(), 1, "round {round}: one topic");
        let parts = &resp.responses[0].partitions;
        assert_eq!(parts.len(), 1, "round {round}: the partition once");
        assert_eq!(parts[0].partition_index, 0);
        assert_eq!(parts[0].error_code, 0);
        assert_eq!(parts[0].high_watermark, 0);
    }
    let mut produced = 0;
    assert_serving(&mut broker, topic, 2, &mut produced);
}

/// A Fetch over the per-request partition limit closes its connection and
/// no other.
#[test]
fn fetch_over_the_partition_limit_closes_only_its_connection() {
    let mut broker = Broker::start(BrokerOpts::default().cores(2));
    let topic = "hardening-fetch-limit";
    create_topic(&broker.bootstrap(), topic, 2, &[]);
    let mut bystander = RawClient::connect(broker.port);
    let mut c = RawClient::connect(broker.port);
    c.send(
        4,
        &fetch_v4(
            topic,
            0,
            fjord::handlers::fetch::FETCH_PARTITIONS_MAX + 1,
            100,
        ),
    );
    c.assert_closed(Duration::from_secs(10), "a Fetch over the partition limit");
    let md = bystander.request::<MetadataRequest>(9, &MetadataRequest::default().with_topics(None));
    assert_eq!(md.brokers.len(), 2, "the bystander still answers");
    let mut produced = 0;
    assert_serving(&mut broker, topic, 2, &mut produced);
}

/// Creates `__consumer_offsets` and `__transaction_state` the way clients
/// do (FindCoordinator for a group and for a transactional id), and returns
/// the connection that asked.
fn internal_topics_ready(broker: &Broker) -> RawClient {
    use kafka_protocol::messages::FindCoordinatorRequest;
    let mut c = RawClient::connect(broker.port);
    for key_type in [0i8, 1] {
        let req = FindCoordinatorRequest::default()
            .with_key_type(key_type)
            .with_coordinator_keys(vec![StrBytes::from_static_str("hardening")]);
        wait_for(CLIENT_TIMEOUT, "the coordinator is ready", || {
            let resp = c.request::<FindCoordinatorRequest>(4, &req);
            (resp.coordinators[0].error_code == 0).then_some(())
        });
    }
    c
}

/// Config changes, new partitions and client produce on the internal
/// topics are refused, and the refused changes leave nothing behind; a
/// client's WriteTxnMarkers is answered as Kafka answers it without an
/// authorizer.
#[test]
fn internal_topics_are_protected() {
    use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
    use kafka_protocol::messages::incremental_alter_configs_request::{
        AlterConfigsResource, AlterableConfig,
    };
    use kafka_protocol::messages::{CreatePartitionsRequest, IncrementalAlterConfigsRequest};
    use kafka_protocol::ResponseError;

    let mut broker = Broker::start(BrokerOpts::default().cores(2));
    let topic = "hardening-user";
    create_topic(&broker.bootstrap(), topic, 2, &[]);
    let mut c = internal_topics_ready(&broker);

    for internal in ["__consumer_offsets", "__transaction_state"] {
        // IncrementalAlterConfigs: retention.ms=1 would delete the state.
        let req = IncrementalAlterConfigsRequest::default().with_resources(vec![
            AlterConfigsResource::default()
                .with_resource_type(2)
                .with_resource_name(StrBytes::from_static_str(internal))
                .with_configs(vec![AlterableConfig::default()
                    .with_name(StrBytes::from_static_str("retention.ms"))
                    .with_config_operation(0)
                    .with_value(Some(StrBytes::from_static_str("1")))]),
        ]);
        let resp = c.request::<IncrementalAlterConfigsRequest>(1, &req);
        assert_eq!(
            resp.responses[0].error_code,
            ResponseError::InvalidRequest.code(),
            "{internal}: IncrementalAlterConfigs is refused"
        );

        // CreatePartitions would move ids to other coordinators.
        let req = CreatePartitionsRequest::default()
            .with_timeout_ms(10_000)
            .with_topics(vec![CreatePartitionsTopic::default()
                .with_name(TopicName(StrBytes::from_static_str(internal)))
                .with_count(60)]);
        let resp = c.request::<CreatePartitionsRequest>(3, &req);
        assert_eq!(
            resp.results[0].error_code,
            ResponseError::InvalidRequest.code(),
            "{internal}: CreatePartitions is refused"
        );

        // Produce from a client, to the shard that leads partition 0.
        let port = client::leader_port(&broker, internal, 0);
        let mut p = RawClient::connect(port);
        let mut b = BatchBuilder::new(Compression::None);
        b = b.record(Some(b"forged"), Some(b"state"), &[], 1_700_000_000_000);
        let req = produce_request(internal, 0, -1, b.build().freeze());
        let resp = p.request::<kafka_protocol::messages::ProduceRequest>(9, &req);
        assert_eq!(
            only_partition(&resp).error_code,
            ResponseError::InvalidTopicException.code(),
            "{internal}: produce from a client is refused"
        );
    }

    // Nothing changed: still 50 partitions each, nothing written by the
    // forged produce.
    let md = c.request::<MetadataRequest>(
        9,
        &MetadataRequest::default().with_topics(Some(vec![
            kafka_protocol::messages::metadata_request::MetadataRequestTopic::default().with_name(
                Some(TopicName(StrBytes::from_static_str("__consumer_offsets"))),
            ),
            kafka_protocol::messages::metadata_request::MetadataRequestTopic::default().with_name(
                Some(TopicName(StrBytes::from_static_str("__transaction_state"))),
            ),
        ])),
    );
    for t in &md.topics {
        assert_eq!(t.partitions.len(), 50, "{:?} keeps its partitions", t.name);
    }

    // WriteTxnMarkers from a client: with no authorizer every caller has
    // CLUSTER_ACTION, as on Kafka, so the markers are written (with ACLs
    // it takes CLUSTER_ACTION: `server_acls.rs`); a partition that does
    // not exist is UNKNOWN_TOPIC_OR_PARTITION.
    let codes = common::raw::commit_markers_v1(&mut c, topic, &[0, 1, 2]);
    assert_eq!(
        codes,
        vec![0, 0, ResponseError::UnknownTopicOrPartition.code()],
        "WriteTxnMarkers from a client without an authorizer is written"
    );

    let mut produced = 0;
    assert_serving(&mut broker, topic, 2, &mut produced);
}

/// A panic in one shard ends the whole process (it aborts), instead of
/// leaving a broker that advertises a dead node.
#[test]
fn a_panicking_shard_aborts_the_process() {
    let mut broker = Broker::start(
        BrokerOpts::default()
            .cores(2)
            .arg("--debug-panic-shard")
            .arg("1"),
    );
    let wait_ms = fjord::server::DEBUG_PANIC_DELAY_MS + 20_000;
    let status = wait_for(
        Duration::from_millis(wait_ms),
        "the broker exits after its shard panicked",
        || broker.try_exit_status(),
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(libc::SIGABRT),
        "the process aborted: {status}"
    );
}

/// Pseudo-random bytes (xorshift), incompressible enough that a batch of
/// them stays large when compressed.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn produce_one(port: u16, topic: &str, batch: bytes::Bytes) -> i16 {
    let mut c = RawClient::connect(port);
    let resp = c.request::<kafka_protocol::messages::ProduceRequest>(
        9,
        &produce_request(topic, 0, -1, batch),
    );
    only_partition(&resp).error_code
}

/// Large batches that the topic recompresses go through the blocking
/// thread and land recompressed with the same records; batches that would
/// decompress past `--batch-decompressed-bytes-max` are refused whether
/// small (recompressed inline) or large (off the reactor).
#[test]
fn recompression_is_bounded_and_large_batches_keep_their_records() {
    use kafka_protocol::ResponseError;
    let mut broker = Broker::start(
        BrokerOpts::default()
            .cores(1)
            .arg("--batch-decompressed-bytes-max")
            .arg((2 << 20).to_string()),
    );
    let topic = "hardening-recompress";
    create_topic(
        &broker.bootstrap(),
        topic,
        1,
        &[("compression.type", "lz4")],
    );

    // 1. A ~200 KiB gzip batch: recompressed to lz4 off the reactor.
    let values: Vec<Vec<u8>> = (0..100).map(|i| noise(i + 1, 2048)).collect();
    let mut b = BatchBuilder::new(Compression::Gzip);
    for v in &values {
        b = b.record(None, Some(v), &[], 1_700_000_000_000);
    }
    let big = b.build().freeze();
    assert!(big.len() >= fjord::handlers::produce::RECOMPRESS_OFF_REACTOR_MIN_BYTES);
    assert_eq!(produce_one(broker.port, topic, big), 0);
    let stored = common::disk::batches(&broker.first_segment(topic, 0));
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].header.compression().ok(), Some(Compression::Lz4));
    let got: Vec<Vec<u8>> = stored[0]
        .records()
        .into_iter()
        .map(|r| r.value.map(|v| v.to_vec()).unwrap_or_default())
        .collect();
    assert_eq!(got, values, "the same records after recompression");

    // 2. Small and large batches that decompress to 4 MiB: refused.
    let bomb = vec![0u8; 4 << 20];
    let mut small = BatchBuilder::new(Compression::Gzip);
    small = small.record(None, Some(&bomb), &[], 1_700_000_000_000);
    let small = small.build().freeze();
    assert!(small.len() < fjord::handlers::produce::RECOMPRESS_OFF_REACTOR_MIN_BYTES);
    let mut large = BatchBuilder::new(Compression::Gzip);
    large = large
        .record(None, Some(&noise(99, 100 << 10)), &[], 1_700_000_000_000)
        .record(None, Some(&bomb), &[], 1_700_000_000_000);
    let large = large.build().freeze();
    assert!(large.len() >= fjord::handlers::produce::RECOMPRESS_OFF_REACTOR_MIN_BYTES);
    for (what, batch) in [("small", small), ("large", large)] {
        assert_eq!(
            produce_one(broker.port, topic, batch),
            ResponseError::InvalidRecord.code(),
            "a {what} batch over the decompression limit"
        );
    }
    let stored = common::disk::batches(&broker.first_segment(topic, 0));
    assert_eq!(stored.len(), 1, "nothing more was written");
    let check = "hardening-recompress-check";
    create_topic(&broker.bootstrap(), check, 1, &[]);
    let mut produced = 0;
    assert_serving(&mut broker, check, 1, &mut produced);
}

/// A tail-cached batch must not keep alive the request frame it arrived
/// in. Each Produce here carries a tiny batch for a partition that takes it
/// and 8 MiB of records for a partition that does not exist (refused): the
/// tiny batches go into the tail cache and must not pin their frames, so
/// the broker's resident memory stays flat instead of growing by 8 MiB a
/// request (the cache copies a batch that is a small part of its frame).
#[test]
fn cached_batches_do_not_pin_the_frames_they_arrived_in() {
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::ProduceRequest;
    use kafka_protocol::ResponseError;
    const PADDING_BYTES: usize = 8 << 20;
    const WARM_UP_FRAMES: i64 = 4;
    const FRAMES: i64 = 24;
    /// Far below FRAMES x PADDING_BYTES (192 MiB), far above what the
    /// broker needs to receive one frame at a time.
    const RSS_GROWTH_MAX: u64 = 64 << 20;

    let mut broker = Broker::start(
        BrokerOpts::default()
            .cores(1)
            .arg("--tail-cache-bytes")
            .arg((8 << 20).to_string()),
    );
    let topic = "hardening-pinned-frames";
    create_topic(&broker.bootstrap(), topic, 1, &[]);
    let padding = bytes::Bytes::from(vec![0u8; PADDING_BYTES]);
    let mut c = RawClient::connect(broker.port);
    let mut send = |i: i64| {
        let tiny = BatchBuilder::new(Compression::None)
            .record(None, Some(b"tiny"), &[], 1_700_000_000_000)
            .build()
            .freeze();
        let partition = |index: i32, records: bytes::Bytes| {
            PartitionProduceData::default()
                .with_index(index)
                .with_records(Some(records))
        };
        let req = ProduceRequest::default()
            .with_acks(1)
            .with_timeout_ms(30_000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_static_str(topic)))
                .with_partition_data(vec![
                    partition(0, tiny),
                    partition(1, padding.clone()),
                ])]);
        let resp = c.request::<ProduceRequest>(9, &req);
        let parts = &resp.responses[0].partition_responses;
        let by_index = |i: i32| parts.iter().find(|p| p.index == i).expect("answered");
        assert_eq!(by_index(0).error_code, 0, "the tiny batch is appended");
        assert_eq!(by_index(0).base_offset, i);
        assert_eq!(
            by_index(1).error_code,
            ResponseError::UnknownTopicOrPartition.code()
        );
    };
    for i in 0..WARM_UP_FRAMES {
        send(i);
    }
    let pid = broker.pid().expect("a running broker");
    let before = common::rss_bytes(pid);
    for i in WARM_UP_FRAMES..WARM_UP_FRAMES + FRAMES {
        send(i);
    }
    let after = common::rss_bytes(pid);
    let growth = after.saturating_sub(before);
    assert!(
        growth < RSS_GROWTH_MAX,
        "{FRAMES} frames of {PADDING_BYTES} bytes grew the broker's resident memory by {growth} bytes ({before} -> {after}): cached batches pin their frames"
    );
    eprintln!("resident memory grew by {growth} bytes over {FRAMES} frames");
    // The tiny batches are all there, and the broker serves.
    let mut produced = (WARM_UP_FRAMES + FRAMES) as usize;
    assert_serving(&mut broker, topic, 1, &mut produced);
}

/// A Produce whose records end in a partial second batch: Kafka's batch
/// iterator stops before an incomplete batch (`ByteBufferLogInputStream`),
/// so the request holds exactly one batch, and the log trims the trailing
/// bytes (`trimInvalidBytes`): the first batch is appended, the rest is
/// dropped, and nothing waits for the missing bytes. Runs against stock
/// Kafka with `FJORD_TEST_BROKER=kafka:HOST:PORT`.
#[test]
fn a_produce_with_a_trailing_partial_batch_appends_the_whole_batch_only() {
    let target = common::target::Target::start(BrokerOpts::default().cores(1));
    let topic = target.name("hardening-partial-tail");
    create_topic(&target.bootstrap(), &topic, 1, &[]);
    let batch = |first: usize| {
        let mut b = BatchBuilder::new(Compression::None);
        for i in first..first + 3 {
            b = b.record(
                None,
                Some(format!("v{i}").as_bytes()),
                &[],
                1_700_000_000_000,
            );
        }
        b.build().freeze()
    };
    let mut c = RawClient::connect(target.port());
    let tails: [(&str, usize); 2] = [
        ("part of a batch header", 30),
        ("a whole header, part of the records", 70),
    ];
    let mut expected_offset = 0i64;
    for (i, (what, tail_len)) in tails.iter().enumerate() {
        let whole = batch(i * 3);
        let next = batch(100 + i * 3);
        let mut records = whole.to_vec();
        records.extend_from_slice(&next[..*tail_len]);
        let resp = c.request::<kafka_protocol::messages::ProduceRequest>(
            9,
            &produce_request(&topic, 0, -1, bytes::Bytes::from(records)),
        );
        let p = only_partition(&resp);
        assert_eq!(p.error_code, 0, "{what}: {:?}", p.error_message);
        assert_eq!(p.base_offset, expected_offset, "{what}");
        expected_offset += 3;
    }
    let got: Vec<String> = client::consume(
        &target.bootstrap(),
        &topic,
        1,
        6,
        Duration::from_millis(500),
        CLIENT_TIMEOUT,
    )
    .into_iter()
    .map(|m| String::from_utf8_lossy(&m.value.unwrap_or_default()).into_owned())
    .collect();
    assert_eq!(got, ["v0", "v1", "v2", "v3", "v4", "v5"]);
}
