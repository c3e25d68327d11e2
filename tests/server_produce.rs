//! Hand-built Produce requests against a real broker, reproducing each
//! stock-Kafka output quoted in KAFKA_BEHAVIOUR.md §2: the error codes, what
//! is (not) written, the offsets assigned and the bytes on disk.

mod common;

use bytes::Bytes;
use common::client::{create_topic, leader_port};
use common::disk::batches;
use common::raw::{only_partition, produce_request, RawClient};
use common::{wait_for, Broker, BrokerOpts};
use fjord::record::batch::compute_crc;
use fjord::record::{BatchBuilder, Compression};
use kafka_protocol::messages::{MetadataRequest, ProduceRequest};
use kafka_protocol::ResponseError;
use std::time::Duration;

/// Produce version used by these tests (flexible, topic names).
const PRODUCE_VERSION: i16 = 9;
/// How long an acks=0 request must stay unanswered (as the Kafka run checked).
const NO_RESPONSE_WINDOW: Duration = Duration::from_secs(3);
const DISK_TIMEOUT: Duration = Duration::from_secs(10);

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// One record with value `value`.
fn one_record(codec: Compression, value: &str) -> Bytes {
    BatchBuilder::new(codec)
        .record(None, Some(value.as_bytes()), &[], now_ms())
        .build()
        .freeze()
}

/// Three uncompressed records making a batch of exactly 120 bytes, the
/// size of the batches in the Kafka run (61-byte header + 3 × (7 + value)).
fn three_records(codec: Compression, tag: &str) -> Bytes {
    let ts = now_ms();
    let values = [
        format!("hello-kafka-{tag}"),
        format!("hello-kafka-{tag}"),
        format!("hello-kafka{tag}"),
    ];
    let mut b = BatchBuilder::new(codec);
    for v in &values {
        b = b.record(None, Some(v.as_bytes()), &[], ts);
    }
    b.build().freeze()
}

struct Fixture {
    broker: Broker,
    topic: String,
    client: RawClient,
}

/// A 1-shard broker with a 1-partition topic and a raw connection to its leader.
fn fixture(topic: &str, config: &[(&str, &str)]) -> Fixture {
    let broker = Broker::start(BrokerOpts::default().cores(1));
    create_topic(&broker.bootstrap(), topic, 1, config);
    let client = RawClient::connect(leader_port(&broker, topic, 0));
    Fixture {
        broker,
        topic: topic.to_string(),
        client,
    }
}

impl Fixture {
    fn produce(&mut self, acks: i16, records: Bytes) -> (i16, i64) {
        let req = produce_request(&self.topic, 0, acks, records);
        let resp = self.client.request::<ProduceRequest>(PRODUCE_VERSION, &req);
        let p = only_partition(&resp);
        (p.error_code, p.base_offset)
    }

    /// Nothing was written: the segment holds no batch and the next good
    /// batch gets offset 0.
    fn assert_nothing_written(&mut self) {
        assert!(
            batches(&self.broker.first_segment(&self.topic, 0)).is_empty(),
            "a rejected batch reached the log"
        );
        let (err, base) = self.produce(1, one_record(Compression::None, "after"));
        assert_eq!(
            (err, base),
            (0, 0),
            "the next good batch starts the log at offset 0"
        );
        let stored = batches(&self.broker.first_segment(&self.topic, 0));
        assert_eq!(stored.len(), 1);
        assert_eq!(stored[0].header.base_offset, 0);
    }
}

#[test]
fn acks_2_is_invalid_required_acks_and_nothing_written() {
    let mut f = fixture("produce-acks-2", &[]);
    let (err, base) = f.produce(2, one_record(Compression::None, "x"));
    assert_eq!(err, ResponseError::InvalidRequiredAcks.code());
    assert_eq!(base, -1);
    f.assert_nothing_written();
}

#[test]
fn base_offset_5_is_invalid_record_and_nothing_written() {
    let mut f = fixture("produce-base-offset", &[]);
    let batch = BatchBuilder::new(Compression::None)
        .base_offset(5)
        .record(None, Some(b"x"), &[], now_ms())
        .build()
        .freeze();
    let (err, base) = f.produce(1, batch);
    assert_eq!(err, ResponseError::InvalidRecord.code());
    assert_eq!(base, -1);
    f.assert_nothing_written();
}

#[test]
fn two_batches_is_invalid_record_and_nothing_written() {
    let mut f = fixture("produce-two-batches", &[]);
    let mut both = one_record(Compression::None, "x").to_vec();
    both.extend_from_slice(&one_record(Compression::None, "y"));
    let (err, base) = f.produce(1, Bytes::from(both));
    assert_eq!(err, ResponseError::InvalidRecord.code());
    assert_eq!(base, -1);
    f.assert_nothing_written();
}

#[test]
fn bad_crc_is_corrupt_message_and_nothing_written() {
    let mut f = fixture("produce-bad-crc", &[]);
    let mut batch = one_record(Compression::None, "x").to_vec();
    // Flip a bit inside the CRC-covered region (the last value byte).
    let last = batch.len() - 2;
    batch[last] ^= 0x01;
    let (err, base) = f.produce(1, Bytes::from(batch));
    assert_eq!(err, ResponseError::CorruptMessage.code());
    assert_eq!(base, -1);
    f.assert_nothing_written();
}

/// Kafka's `ProduceRequest.validateRecords` rejects any batch whose magic is
/// not 2 with an InvalidRecordException: INVALID_RECORD (87).
#[test]
fn magic_1_is_invalid_record_and_nothing_written() {
    let mut f = fixture("produce-magic-1", &[]);
    let mut batch = one_record(Compression::None, "x").to_vec();
    batch[16] = 1;
    let (err, base) = f.produce(1, Bytes::from(batch));
    assert_eq!(err, ResponseError::InvalidRecord.code());
    assert_eq!(base, -1);
    f.assert_nothing_written();
}

#[test]
fn acks_0_gets_no_response_but_is_written_at_offset_0() {
    let mut f = fixture("produce-acks-0", &[]);
    let batch = one_record(Compression::None, "fire-and-forget");
    let req = produce_request(&f.topic, 0, 0, batch.clone());
    f.client.send(PRODUCE_VERSION, &req);
    match f.client.read_frame(NO_RESPONSE_WINDOW) {
        common::raw::ReadOutcome::TimedOut => {}
        other => panic!("acks=0 must get no response, got {other:?}"),
    }
    let stored = wait_for(DISK_TIMEOUT, "the acks=0 batch on disk", || {
        let b = batches(&f.broker.first_segment(&f.topic, 0));
        (!b.is_empty()).then_some(b)
    });
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].header.base_offset, 0);
    assert_eq!(
        stored[0].bytes[21..],
        batch[21..],
        "stored as sent (CRC-covered bytes)"
    );
    // The connection still works, and the next response is the next request's.
    let md = f
        .client
        .request::<MetadataRequest>(9, &MetadataRequest::default().with_topics(Some(vec![])));
    assert!(!md.brokers.is_empty());
}

/// acks=0 with an error: no response, the connection is closed (Kafka
/// closes it so that the client notices), and nothing is written.
#[test]
fn acks_0_with_an_error_closes_the_connection() {
    let mut f = fixture("produce-acks-0-error", &[]);
    let mut batch = one_record(Compression::None, "x").to_vec();
    let last = batch.len() - 2;
    batch[last] ^= 0x01;
    let req = produce_request(&f.topic, 0, 0, Bytes::from(batch));
    f.client.send(PRODUCE_VERSION, &req);
    f.client
        .assert_closed(Duration::from_secs(10), "acks=0 with a bad CRC");
    f.client = RawClient::connect(f.broker.port);
    f.assert_nothing_written();
}

#[test]
fn two_three_record_batches_get_offsets_0_and_3_with_client_crc_on_disk() {
    let mut f = fixture("produce-two-three", &[]);
    let first = three_records(Compression::None, "0");
    let second = three_records(Compression::None, "1");
    assert_eq!(first.len(), 120, "test batches have the Kafka run's size");
    assert_eq!(second.len(), 120);
    let client_crc = u32::from_be_bytes([second[17], second[18], second[19], second[20]]);
    assert_eq!(client_crc, compute_crc(&second));
    assert_eq!(
        i32::from_be_bytes([second[12], second[13], second[14], second[15]]),
        -1
    );

    assert_eq!(f.produce(1, first), (0, 0));
    assert_eq!(f.produce(1, second.clone()), (0, 3));

    let stored = batches(&f.broker.first_segment(&f.topic, 0));
    assert_eq!(stored.len(), 2);
    let s = &stored[1];
    assert_eq!(s.position, 120);
    assert_eq!(s.header.base_offset, 3);
    assert_eq!(s.header.last_offset(), 5);
    assert_eq!(s.header.partition_leader_epoch, 0);
    assert_eq!(s.header.total_size(), 120);
    assert_eq!(s.header.crc, client_crc, "the client's CRC is kept");
    assert_eq!(compute_crc(&s.bytes), client_crc, "and still valid");
    assert_eq!(
        s.bytes[16..],
        second[16..],
        "only baseOffset and partitionLeaderEpoch change"
    );
}

#[test]
fn gzip_batch_to_producer_topic_is_stored_as_sent() {
    let mut f = fixture("produce-gzip-producer", &[("compression.type", "producer")]);
    let batch = three_records(Compression::Gzip, "0");
    let client_crc = u32::from_be_bytes([batch[17], batch[18], batch[19], batch[20]]);
    assert_eq!(f.produce(1, batch.clone()), (0, 0));
    let stored = batches(&f.broker.first_segment(&f.topic, 0));
    assert_eq!(stored.len(), 1);
    let s = &stored[0];
    assert_eq!(s.header.compression().ok(), Some(Compression::Gzip));
    assert_eq!(s.header.crc, client_crc, "same CRC");
    assert_eq!(s.bytes.len(), batch.len(), "same size");
    assert_eq!(s.bytes[16..], batch[16..]);
}

#[test]
fn gzip_batch_to_lz4_topic_is_recompressed() {
    let mut f = fixture("produce-gzip-to-lz4", &[("compression.type", "lz4")]);
    let batch = three_records(Compression::Gzip, "0");
    let client_crc = u32::from_be_bytes([batch[17], batch[18], batch[19], batch[20]]);
    assert_eq!(f.produce(1, batch.clone()), (0, 0));
    let stored = batches(&f.broker.first_segment(&f.topic, 0));
    assert_eq!(stored.len(), 1);
    let s = &stored[0];
    assert_eq!(s.header.compression().ok(), Some(Compression::Lz4));
    assert_ne!(s.header.crc, client_crc, "a new CRC");
    assert_eq!(compute_crc(&s.bytes), s.header.crc, "which is valid");
    assert_ne!(s.bytes.len(), batch.len(), "a new size");
    assert_eq!(s.header.base_offset, 0);
    assert_eq!(s.header.last_offset(), 2);
    assert_eq!(s.header.partition_leader_epoch, 0);
    let values: Vec<Vec<u8>> = s
        .records()
        .into_iter()
        .map(|r| r.value.map(|v| v.to_vec()).unwrap_or_default())
        .collect();
    assert_eq!(
        values,
        vec![
            b"hello-kafka-0".to_vec(),
            b"hello-kafka-0".to_vec(),
            b"hello-kafka0".to_vec()
        ],
        "the same records"
    );
}

/// A batch of `records` uncompressed records of `value_bytes` each, filled
/// with a pattern that differs per `seed` and per byte.
fn patterned_batch(seed: u64, records: usize, value_bytes: usize) -> Bytes {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    let mut b = BatchBuilder::new(Compression::None);
    for _ in 0..records {
        let value: Vec<u8> = (0..value_bytes)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 56) as u8
            })
            .collect();
        b = b.record(None, Some(&value), &[], now_ms());
    }
    b.build().freeze()
}

#[test]
fn large_produces_pipelined_or_in_pieces_are_stored_byte_for_byte() {
    // Batches of ~800 KiB: each spans many staging chunks and many socket
    // reads; two arrive in one write, one in uneven pieces, one alone.
    let mut f = fixture("produce-large", &[]);
    let sent: Vec<Bytes> = (0..4).map(|i| patterned_batch(i, 40, 20_000)).collect();
    let mut frames = Vec::new();
    for b in &sent {
        let req = produce_request(&f.topic, 0, 1, b.clone());
        frames.push(f.client.encode_frame(PRODUCE_VERSION, &req));
    }
    let mut first_two = frames[0].0.clone();
    first_two.extend_from_slice(&frames[1].0);
    f.client.send_bytes(&first_two);
    let third = &frames[2].0;
    for piece in [
        &third[..7],
        &third[7..5007],
        &third[5007..300_007],
        &third[300_007..],
    ] {
        std::thread::sleep(Duration::from_millis(20));
        f.client.send_bytes(piece);
    }
    f.client.send_bytes(&frames[3].0);
    for (i, (_, id)) in frames.iter().enumerate() {
        let resp = f.client.receive::<ProduceRequest>(PRODUCE_VERSION, *id);
        let p = only_partition(&resp);
        assert_eq!(
            (p.error_code, p.base_offset),
            (0, 40 * i as i64),
            "produce {i}"
        );
    }
    let stored = batches(&f.broker.first_segment(&f.topic, 0));
    assert_eq!(stored.len(), sent.len(), "every batch on disk");
    let mut position = 0;
    for (i, (s, b)) in stored.iter().zip(&sent).enumerate() {
        assert_eq!(s.position, position, "batch {i} follows the one before");
        assert_eq!(s.header.base_offset, 40 * i as i64);
        assert_eq!(s.bytes.len(), b.len(), "batch {i} size");
        assert!(s.bytes[16..] == b[16..], "batch {i} stored as sent");
        position += b.len();
    }
}
