//! Idempotent producers against a real broker (issue "Idempotent producer"):
//! the raw sequence of KAFKA_BEHAVIOUR.md §4, epochs, duplicates recognised
//! after a restart, and librdkafka's idempotent producer delivering exactly
//! once through lost responses and a SIGKILL.

mod common;

use common::client::{self, TestMessage};
use common::raw::RawClient;
use common::{Broker, BrokerOpts};
use fjord::record::{BatchBuilder, Compression};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    InitProducerIdRequest, ProduceRequest, ProduceResponse, ProducerId, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use std::collections::HashMap;
use std::time::{Duration, Instant};

const PRODUCE_VERSION: i16 = 9;
const INIT_PRODUCER_ID_VERSION: i16 = 4;

/// InitProducerId, retried while the shard has no producer-id block yet.
fn init_producer_id(raw: &mut RawClient, current: Option<(i64, i16)>) -> (i64, i16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (pid, epoch) = current.unwrap_or((-1, -1));
        let req = InitProducerIdRequest::default()
            .with_transactional_id(None)
            .with_transaction_timeout_ms(60_000)
            .with_producer_id(ProducerId(pid))
            .with_producer_epoch(epoch);
        let resp = raw.request(INIT_PRODUCER_ID_VERSION, &req);
        if resp.error_code == ResponseError::CoordinatorLoadInProgress.code() {
            assert!(Instant::now() < deadline, "no producer id block in time");
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        assert_eq!(resp.error_code, 0, "InitProducerId failed");
        return (resp.producer_id.0, resp.producer_epoch);
    }
}

/// A batch of `count` records from producer `pid`/`epoch` starting at `seq`.
fn batch(pid: i64, epoch: i16, seq: i32, count: i32) -> bytes::Bytes {
    let mut b = BatchBuilder::new(Compression::None).producer(pid, epoch, seq);
    for i in 0..count {
        let v = format!("seq-{}", seq + i);
        b = b.record(None, Some(v.as_bytes()), &[], 1_700_000_000_000);
    }
    b.build().freeze()
}

/// Produces one batch (acks=-1) to partition 0; returns (error code, base offset).
fn produce(raw: &mut RawClient, topic: &str, records: bytes::Bytes) -> (i16, i64) {
    let req = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(10_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(records))])]);
    let resp: ProduceResponse = raw.request(PRODUCE_VERSION, &req);
    let p = &resp.responses[0].partition_responses[0];
    (p.error_code, p.base_offset)
}

const NONE: i16 = 0;
fn out_of_order() -> i16 {
    ResponseError::OutOfOrderSequenceNumber.code()
}

#[test]
fn raw_sequences_reproduce_stock_kafka() {
    let broker = Broker::start(BrokerOpts::default().cores(1));
    client::create_topic(&broker.bootstrap(), "seq", 1, &[]);
    let mut raw = RawClient::connect(broker.port);
    let (pid, epoch) = init_producer_id(&mut raw, None);
    assert!(pid >= 0);
    assert_eq!(epoch, 0, "a new idempotent producer starts at epoch 0");

    // KAFKA_BEHAVIOUR.md §4, line by line.
    assert_eq!(
        produce(&mut raw, "seq", batch(pid, 0, 0, 3)),
        (NONE, 0),
        "seq 0..2"
    );
    assert_eq!(
        produce(&mut raw, "seq", batch(pid, 0, 0, 3)),
        (NONE, 0),
        "seq 0..2 again"
    );
    assert_eq!(
        produce(&mut raw, "seq", batch(pid, 0, 5, 1)),
        (out_of_order(), -1),
        "seq 5"
    );
    assert_eq!(
        produce(&mut raw, "seq", batch(pid, 0, 3, 3)),
        (NONE, 3),
        "seq 3..5"
    );
    for seq in [6, 9, 12, 15] {
        assert_eq!(
            produce(&mut raw, "seq", batch(pid, 0, seq, 3)),
            (NONE, seq as i64)
        );
    }
    assert_eq!(
        produce(&mut raw, "seq", batch(pid, 0, 0, 3)),
        (out_of_order(), -1),
        "the oldest of six batches is no longer remembered"
    );

    // On disk: six batches, offsets 0-17, this producer, epoch 0.
    let stored = common::disk::batches(&broker.first_segment("seq", 0));
    assert_eq!(stored.len(), 6);
    for (i, b) in stored.iter().enumerate() {
        assert_eq!(b.header.base_offset, 3 * i as i64);
        assert_eq!(b.header.producer_id, pid);
        assert_eq!(b.header.producer_epoch, 0);
    }
    assert_eq!(stored.last().map(|b| b.header.last_offset()), Some(17));

    // A bumped epoch must start at sequence 0; the old epoch is then fenced.
    let (pid2, epoch2) = init_producer_id(&mut raw, Some((pid, 0)));
    assert_eq!((pid2, epoch2), (pid, 1), "KIP-360 bump keeps the id");
    assert_eq!(
        produce(&mut raw, "seq", batch(pid, 1, 1, 1)),
        (out_of_order(), -1)
    );
    assert_eq!(produce(&mut raw, "seq", batch(pid, 1, 0, 1)), (NONE, 18));
    assert_eq!(
        produce(&mut raw, "seq", batch(pid, 0, 18, 1)),
        (ResponseError::InvalidProducerEpoch.code(), -1)
    );
}

#[test]
fn duplicates_are_recognised_after_restarts() {
    let mut broker = Broker::start(BrokerOpts::default().cores(1));
    client::create_topic(&broker.bootstrap(), "dup", 1, &[]);
    let mut raw = RawClient::connect(broker.port);
    let (pid, _) = init_producer_id(&mut raw, None);
    for seq in [0, 2, 4] {
        assert_eq!(
            produce(&mut raw, "dup", batch(pid, 0, seq, 2)),
            (NONE, seq as i64)
        );
    }
    drop(raw);

    // Clean stop: the state comes back from the producer snapshot.
    broker.stop();
    broker.restart();
    let mut raw = RawClient::connect(broker.port);
    assert_eq!(
        produce(&mut raw, "dup", batch(pid, 0, 4, 2)),
        (NONE, 4),
        "retry after restart"
    );
    assert_eq!(produce(&mut raw, "dup", batch(pid, 0, 6, 2)), (NONE, 6));
    drop(raw);

    // SIGKILL: the state comes back from replaying the log.
    broker.kill9();
    broker.restart();
    let mut raw = RawClient::connect(broker.port);
    assert_eq!(
        produce(&mut raw, "dup", batch(pid, 0, 6, 2)),
        (NONE, 6),
        "retry after kill -9"
    );
    assert_eq!(
        produce(&mut raw, "dup", batch(pid, 0, 2, 2)),
        (NONE, 2),
        "an older remembered batch"
    );
    assert_eq!(
        produce(&mut raw, "dup", batch(pid, 0, 9, 1)),
        (out_of_order(), -1)
    );
    let ids = common::disk::batches(&broker.first_segment("dup", 0)).len();
    assert_eq!(ids, 4, "no duplicate was written");
}

/// Sends `count` messages (value = message number) through an idempotent
/// producer, running `during` once after `count / 2` deliveries, and checks
/// that the partitions hold every message exactly once, in send order per
/// partition.
fn exactly_once_in_order(
    broker: &mut Broker,
    topic: &str,
    count: usize,
    during: impl FnOnce(&mut Broker),
) {
    const PARTITIONS: i32 = 4;
    client::create_topic(&broker.bootstrap(), topic, PARTITIONS, &[]);
    let producer = client::producer(
        &broker.bootstrap(),
        &[
            ("enable.idempotence", "true"),
            ("acks", "all"),
            ("linger.ms", "2"),
            ("retry.backoff.ms", "20"),
            ("request.timeout.ms", "5000"),
        ],
    );
    let mut during = Some(during);
    for id in 0..count {
        let msg = TestMessage {
            id,
            key: format!("k{}", id % 16).into_bytes(),
            value: id.to_string().into_bytes(),
            headers: Vec::new(),
        };
        client::send(&producer, topic, &msg);
        if id == count / 2 {
            // Wait until half is acknowledged, then disturb the broker.
            client::await_deliveries(&producer, count / 2, Duration::from_secs(120));
            if let Some(f) = during.take() {
                f(broker);
            }
        }
        if id % 1000 == 0 {
            producer.poll(Duration::ZERO);
        }
    }
    let deliveries = client::await_deliveries(&producer, count, Duration::from_secs(180));
    let failed: Vec<_> = deliveries
        .iter()
        .filter(|d| d.error.is_some())
        .take(3)
        .collect();
    assert!(failed.is_empty(), "deliveries failed: {failed:?}");

    let consumed = client::consume(
        &broker.bootstrap(),
        topic,
        PARTITIONS,
        count,
        Duration::from_millis(1500),
        Duration::from_secs(180),
    );
    assert_eq!(
        consumed.len(),
        count,
        "every message exactly once (no duplicates)"
    );
    let mut last_per_partition: HashMap<i32, usize> = HashMap::new();
    let mut seen = vec![false; count];
    for m in &consumed {
        let n: usize = String::from_utf8_lossy(m.value.as_deref().unwrap_or_default())
            .parse()
            .expect("numeric value");
        assert!(!seen[n], "message {n} consumed twice");
        seen[n] = true;
        if let Some(prev) = last_per_partition.insert(m.partition, n) {
            assert!(
                prev < n,
                "partition {} out of order: {prev} then {n}",
                m.partition
            );
        }
    }
    assert!(seen.iter().all(|s| *s));
}

#[test]
fn librdkafka_idempotent_survives_lost_responses() {
    let mut broker = Broker::start(
        BrokerOpts::default()
            .cores(2)
            .arg("--debug-drop-produce-response-every")
            .arg("50"),
    );
    exactly_once_in_order(&mut broker, "lossy", 100_000, |_| {});
}

#[test]
fn librdkafka_idempotent_survives_sigkill() {
    let mut broker = Broker::start(
        BrokerOpts::default()
            .cores(2)
            .arg("--debug-drop-produce-response-every")
            .arg("50"),
    );
    exactly_once_in_order(&mut broker, "killed", 100_000, |b| {
        b.kill9();
        b.restart();
    });
}

/// Producer snapshots are written at every segment roll (as Kafka does), at
/// the new segment's base offset, so a restart replays at most one segment;
/// duplicates are still recognised after a SIGKILL.
#[test]
fn snapshots_are_written_at_segment_roll() {
    let mut broker = Broker::start(BrokerOpts::default().cores(1));
    client::create_topic(
        &broker.bootstrap(),
        "rolls",
        1,
        &[("segment.bytes", "1048576")],
    );
    let mut raw = RawClient::connect(broker.port);
    let (pid, _) = init_producer_id(&mut raw, None);
    // 30 batches of 10 records of 10 KiB: about 3 MiB, so 2 rolls.
    let value = vec![b'v'; 10 * 1024];
    let big_batch = |seq: i32| {
        let mut b = BatchBuilder::new(Compression::None).producer(pid, 0, seq);
        for _ in 0..10 {
            b = b.record(None, Some(&value), &[], 1_700_000_000_000);
        }
        b.build().freeze()
    };
    for i in 0..30 {
        assert_eq!(
            produce(&mut raw, "rolls", big_batch(i * 10)),
            (NONE, i as i64 * 10)
        );
    }
    let dir = broker.data_dir().join("rolls-0");
    let bases = |ext: &str| -> Vec<i64> {
        let mut v: Vec<i64> = std::fs::read_dir(&dir)
            .expect("partition dir")
            .filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                name.strip_suffix(ext)?.parse().ok()
            })
            .collect();
        v.sort();
        v
    };
    let segments = bases(".log");
    assert!(segments.len() >= 3, "segments rolled: {segments:?}");
    let rolled: Vec<i64> = segments[1..].to_vec();
    let snapshots = common::wait_for(Duration::from_secs(10), "roll snapshots", || {
        let s = bases(".snapshot");
        rolled.iter().all(|b| s.contains(b)).then_some(s)
    });
    assert!(
        rolled.iter().all(|b| snapshots.contains(b)),
        "a snapshot at every rolled segment's base: {snapshots:?} for {segments:?}"
    );
    drop(raw);

    broker.kill9();
    broker.restart();
    let last_base = *segments.last().expect("a segment");
    let rebuilt = format!("tp=rolls-0 snapshot_offset={last_base} ");
    common::wait_for(
        Duration::from_secs(10),
        "recovery from the last roll snapshot",
        || {
            without_ansi(&broker.stderr_tail())
                .contains(&rebuilt)
                .then_some(())
        },
    );
    let mut raw = RawClient::connect(broker.port);
    assert_eq!(
        produce(&mut raw, "rolls", big_batch(290)),
        (NONE, 290),
        "the last batch retried after kill -9 is a duplicate"
    );
    assert_eq!(produce(&mut raw, "rolls", big_batch(300)), (NONE, 300));
}

/// `text` without ANSI escape sequences (the broker's log is coloured).
fn without_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ ... final byte in @..~
            for d in chars.by_ref() {
                if ('@'..='~').contains(&d) && d != '[' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
