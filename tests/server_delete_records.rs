//! DeleteRecords: through librdkafka's `Admin.deleteRecords` on a 2-shard
//! broker (each partition's request goes to its own shard), the log start
//! it moves (ListOffsets, consumers, segment files, a kill -9 and restart),
//! and Kafka's per-partition errors through a raw client.

mod common;

use common::client::{
    admin, admin_opts, block_on, consumer, create_topic, leader_port, producer,
    CLIENT_REQUEST_TIMEOUT_MS,
};
use common::raw::RawClient;
use common::{Broker, BrokerOpts};
use kafka_protocol::messages::delete_records_request::{
    DeleteRecordsPartition, DeleteRecordsTopic,
};
use kafka_protocol::messages::{DeleteRecordsRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use rdkafka::consumer::Consumer;
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::{Message, Offset, TopicPartitionList};
use std::path::Path;
use std::time::{Duration, Instant};

const TOPIC: &str = "delrec";
const MESSAGES_PER_PARTITION: i64 = 100;
/// Large enough that the 100 messages of a partition fill about three
/// segments of Kafka's smallest `segment.bytes` (1 MiB).
const VALUE_BYTES: usize = 32 * 1024;
/// Where partition 0's log start is moved to: past the first segment.
const DELETE_BEFORE: i64 = 70;

fn timeout() -> Duration {
    Duration::from_millis(CLIENT_REQUEST_TIMEOUT_MS)
}

/// Produces `MESSAGES_PER_PARTITION` messages of `VALUE_BYTES` to each of
/// partitions 0 and 1.
fn produce(bootstrap: &str) {
    let p = producer(bootstrap, &[("linger.ms", "0"), ("acks", "all")]);
    for i in 0..MESSAGES_PER_PARTITION {
        for partition in 0..2 {
            let value = vec![b'a' + (i % 26) as u8; VALUE_BYTES];
            p.send(
                BaseRecord::<(), [u8], _>::with_opaque_to(TOPIC, 0)
                    .partition(partition)
                    .payload(&value[..]),
            )
            .expect("enqueue");
        }
        if i % 10 == 9 {
            p.flush(timeout()).expect("flush");
        }
    }
    p.flush(timeout()).expect("flush");
    let failed: Vec<_> = p
        .context()
        .deliveries
        .lock()
        .expect("lock")
        .iter()
        .filter(|d| d.error.is_some())
        .cloned()
        .collect();
    assert!(failed.is_empty(), "failed deliveries: {failed:?}");
}

/// Base offsets of a partition's segment files, ascending.
fn segment_bases(data_dir: &Path, partition: i32) -> Vec<i64> {
    let dir = data_dir.join(format!("{TOPIC}-{partition}"));
    let mut bases: Vec<i64> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".log")?.parse().ok()
        })
        .collect();
    bases.sort_unstable();
    bases
}

/// (low, high) watermarks of partitions 0 and 1 from ListOffsets.
fn watermarks(bootstrap: &str) -> [(i64, i64); 2] {
    let c = consumer(bootstrap, &[]);
    [0, 1].map(|p| c.fetch_watermarks(TOPIC, p, timeout()).expect("watermarks"))
}

/// Offset of the first message a consumer starting from the beginning of
/// `partition` receives.
fn first_consumed_offset(bootstrap: &str, partition: i32) -> i64 {
    let c = consumer(bootstrap, &[("auto.offset.reset", "earliest")]);
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(TOPIC, partition, Offset::Beginning)
        .expect("add partition");
    c.assign(&tpl).expect("assign");
    let deadline = Instant::now() + timeout();
    while Instant::now() < deadline {
        if let Some(m) = c.poll(Duration::from_millis(100)) {
            return m.expect("consume").offset();
        }
    }
    panic!("nothing consumed from {TOPIC}-{partition}");
}

#[test]
fn delete_records_moves_the_log_start_and_survives_a_restart() {
    let mut broker = Broker::start(BrokerOpts::default().cores(2));
    let bootstrap = broker.bootstrap();
    create_topic(&bootstrap, TOPIC, 2, &[("segment.bytes", "1048576")]);
    produce(&bootstrap);
    assert_eq!(watermarks(&bootstrap), [(0, MESSAGES_PER_PARTITION); 2]);
    let before = segment_bases(&broker.data_dir(), 0);
    assert!(
        before
            .iter()
            .skip(1)
            .filter(|&&b| b <= DELETE_BEFORE)
            .count()
            >= 1,
        "the test needs whole segments below offset {DELETE_BEFORE}: {before:?}"
    );

    // Partition 0 up to DELETE_BEFORE, partition 1 up to its high watermark
    // (-1, librdkafka's Offset::End); each goes to its own shard.
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(TOPIC, 0, Offset::Offset(DELETE_BEFORE))
        .expect("add");
    tpl.add_partition_offset(TOPIC, 1, Offset::End)
        .expect("add");
    let result =
        block_on(admin(&bootstrap).delete_records(&tpl, &admin_opts())).expect("delete_records");
    let answers: Vec<(i32, Offset, bool)> = result
        .elements()
        .iter()
        .map(|e| (e.partition(), e.offset(), e.error().is_ok()))
        .collect();
    assert_eq!(
        answers,
        vec![
            (0, Offset::Offset(DELETE_BEFORE), true),
            (1, Offset::Offset(MESSAGES_PER_PARTITION), true)
        ]
    );

    let expected = [
        (DELETE_BEFORE, MESSAGES_PER_PARTITION),
        (MESSAGES_PER_PARTITION, MESSAGES_PER_PARTITION),
    ];
    assert_eq!(watermarks(&bootstrap), expected);
    assert_eq!(first_consumed_offset(&bootstrap, 0), DELETE_BEFORE);
    // Every segment whose offsets all lie below the new log start is gone;
    // the one holding it stays.
    let after = segment_bases(&broker.data_dir(), 0);
    assert!(after[0] <= DELETE_BEFORE, "{after:?}");
    assert!(
        after.iter().skip(1).all(|&b| b > DELETE_BEFORE),
        "{after:?}"
    );

    // Acknowledged, so it stays done after a kill -9.
    broker.kill9();
    broker.restart();
    assert_eq!(watermarks(&broker.bootstrap()), expected);
    assert_eq!(first_consumed_offset(&broker.bootstrap(), 0), DELETE_BEFORE);
}

#[test]
fn delete_records_answers_kafkas_errors() {
    let broker = Broker::start(BrokerOpts::default().cores(2));
    let bootstrap = broker.bootstrap();
    create_topic(&bootstrap, TOPIC, 2, &[]);
    produce(&bootstrap);
    let port0 = leader_port(&broker, TOPIC, 0);
    let port1 = leader_port(&broker, TOPIC, 1);
    assert_ne!(port0, port1, "the partitions are led by different shards");

    let partition = |index: i32, offset: i64| {
        DeleteRecordsPartition::default()
            .with_partition_index(index)
            .with_offset(offset)
    };
    let topic = |name: &str, partitions: Vec<DeleteRecordsPartition>| {
        DeleteRecordsTopic::default()
            .with_name(TopicName(StrBytes::from_string(name.to_string())))
            .with_partitions(partitions)
    };
    let request = |topics| {
        DeleteRecordsRequest::default()
            .with_topics(topics)
            .with_timeout_ms(30_000)
    };
    let answers = |port: u16, version: i16, req: &DeleteRecordsRequest| {
        let resp = RawClient::connect(port).request(version, req);
        resp.topics
            .iter()
            .flat_map(|t| {
                t.partitions.iter().map(|p| {
                    (
                        t.name.0.to_string(),
                        p.partition_index,
                        p.error_code,
                        p.low_watermark,
                    )
                })
            })
            .collect::<Vec<_>>()
    };
    let code = |e: ResponseError| e.code();

    // In order: move to 40; back to 10 (no effect); past the high
    // watermark; below 0 other than -1; a partition of the other shard; a
    // partition that does not exist; then an internal topic and an unknown
    // topic.
    let req = request(vec![
        topic(
            TOPIC,
            vec![
                partition(0, 40),
                partition(0, 10),
                partition(0, MESSAGES_PER_PARTITION + 1),
                partition(0, -2),
                partition(1, 5),
                partition(7, 0),
            ],
        ),
        topic("__consumer_offsets", vec![partition(0, 0)]),
        topic("no-such-topic", vec![partition(0, 0)]),
    ]);
    for version in [0, 2] {
        let got = answers(port0, version, &req);
        let t = TOPIC.to_string();
        assert_eq!(
            got,
            vec![
                (t.clone(), 0, 0, 40),
                (t.clone(), 0, 0, 40),
                (t.clone(), 0, code(ResponseError::OffsetOutOfRange), -1),
                (t.clone(), 0, code(ResponseError::OffsetOutOfRange), -1),
                (t.clone(), 1, code(ResponseError::NotLeaderOrFollower), -1),
                (
                    t.clone(),
                    7,
                    code(ResponseError::UnknownTopicOrPartition),
                    -1
                ),
                (
                    "__consumer_offsets".to_string(),
                    0,
                    code(ResponseError::InvalidTopicException),
                    -1
                ),
                (
                    "no-such-topic".to_string(),
                    0,
                    code(ResponseError::UnknownTopicOrPartition),
                    -1
                ),
            ],
            "DeleteRecords v{version}"
        );
    }
    // The high watermark (-1) at the right shard; nothing was deleted from
    // partition 1 by the refusal above.
    let req = request(vec![topic(TOPIC, vec![partition(1, -1)])]);
    assert_eq!(
        answers(port1, 1, &req),
        vec![(TOPIC.to_string(), 1, 0, MESSAGES_PER_PARTITION)]
    );
}
