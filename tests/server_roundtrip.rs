//! rdkafka round trip through a real 2-shard broker: 100,000 keyed messages
//! with headers over 8 partitions, for each codec librdkafka produces, must
//! all be consumed back exactly — key, value, headers, the partition and
//! offset of their delivery report, and per key the order they were sent in.
//! One case turns the tail cache off, so every fetch reads the segment files.

mod common;

use common::client::{self, await_deliveries, create_topic, send, TestMessage};
use common::disk::batches;
use common::{Broker, BrokerOpts};
use fjord::record::Compression;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

const MESSAGES: usize = 100_000;
const PARTITIONS: i32 = 8;
const KEYS: usize = 1_000;
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(180);
const CONSUME_TIMEOUT: Duration = Duration::from_secs(180);
/// How long the consumer keeps polling after the last expected message, to
/// catch duplicates.
const SETTLE: Duration = Duration::from_millis(500);

fn message(id: usize) -> TestMessage {
    let key = format!("key-{:04}", id % KEYS).into_bytes();
    // Compressible but not constant: id, then a repeated pattern.
    let value = format!("value-{id:08}-{}", "abcdefghij".repeat(1 + id % 7)).into_bytes();
    let headers = vec![
        ("id".to_string(), id.to_string().into_bytes()),
        (
            "kind".to_string(),
            if id % 2 == 0 {
                b"even".to_vec()
            } else {
                b"odd".to_vec()
            },
        ),
    ];
    TestMessage {
        id,
        key,
        value,
        headers,
    }
}

/// The batches stored for `topic` hold `MESSAGES` records and use `codec`.
/// librdkafka sends a batch uncompressed when compressing does not shrink
/// it (small batches), so unless `strict` (the broker compressed them all)
/// uncompressed batches are allowed, as long as most records are `codec`.
fn assert_stored_with(broker: &Broker, topic: &str, codec: Compression, strict: bool) {
    let (mut records, mut with_codec) = (0usize, 0usize);
    for p in 0..PARTITIONS {
        for b in batches(&broker.first_segment(topic, p)) {
            let stored = b.header.compression().ok();
            let allowed = stored == Some(codec) || (!strict && stored == Some(Compression::None));
            assert!(
                allowed,
                "{topic}-{p} batch at {}: {stored:?}, {:?}",
                b.position, b.header
            );
            records += b.header.records_count as usize;
            if stored == Some(codec) {
                with_codec += b.header.records_count as usize;
            }
        }
    }
    assert_eq!(
        records, MESSAGES,
        "every acknowledged record is in the segments"
    );
    assert!(
        with_codec * 2 > MESSAGES,
        "only {with_codec} records stored as {codec:?}"
    );
}

/// Produces with the client codec `codec` to a topic with `topic_config`,
/// expects the stored batches to use `stored`, then consumes everything.
fn roundtrip(codec: &str, topic_config: &[(&str, &str)], stored: Compression, strict: bool) {
    roundtrip_on(
        BrokerOpts::default().cores(2),
        codec,
        topic_config,
        stored,
        strict,
    );
}

fn roundtrip_on(
    opts: BrokerOpts,
    codec: &str,
    topic_config: &[(&str, &str)],
    stored: Compression,
    strict: bool,
) {
    let broker = Broker::start(opts);
    let topic = format!("roundtrip-{codec}");
    create_topic(&broker.bootstrap(), &topic, PARTITIONS, topic_config);

    let producer = client::producer(
        &broker.bootstrap(),
        &[
            ("compression.codec", codec),
            ("linger.ms", "5"),
            ("batch.num.messages", "2000"),
            ("acks", "all"),
        ],
    );
    let sent: Vec<TestMessage> = (0..MESSAGES).map(message).collect();
    for m in &sent {
        send(&producer, &topic, m);
    }
    let deliveries = await_deliveries(&producer, MESSAGES, DELIVERY_TIMEOUT);
    assert_eq!(deliveries.len(), MESSAGES);
    let mut delivered: HashMap<usize, (i32, i64)> = HashMap::with_capacity(MESSAGES);
    for d in &deliveries {
        assert!(d.error.is_none(), "message {} failed: {:?}", d.id, d.error);
        assert!(
            delivered.insert(d.id, (d.partition, d.offset)).is_none(),
            "two reports for {}",
            d.id
        );
    }
    let partitions_used: HashSet<i32> = delivered.values().map(|(p, _)| *p).collect();
    assert_eq!(
        partitions_used.len(),
        PARTITIONS as usize,
        "keys spread over every partition"
    );

    assert_stored_with(&broker, &topic, stored, strict);

    let consumed = client::consume(
        &broker.bootstrap(),
        &topic,
        PARTITIONS,
        MESSAGES,
        SETTLE,
        CONSUME_TIMEOUT,
    );
    assert_eq!(
        consumed.len(),
        MESSAGES,
        "exactly the produced messages, no duplicates"
    );
    let mut seen = HashSet::with_capacity(MESSAGES);
    // Per key: (partition, offset, id) in consumption order.
    let mut per_key: HashMap<Vec<u8>, Vec<(i32, i64, usize)>> = HashMap::new();
    for c in &consumed {
        let id_header = c
            .headers
            .iter()
            .find(|(k, _)| k == "id")
            .map(|(_, v)| String::from_utf8_lossy(v).to_string())
            .expect("an id header");
        let id: usize = id_header.parse().expect("numeric id");
        assert!(seen.insert(id), "message {id} consumed twice");
        let m = &sent[id];
        assert_eq!(c.key.as_deref(), Some(&m.key[..]), "key of {id}");
        assert_eq!(c.value.as_deref(), Some(&m.value[..]), "value of {id}");
        assert_eq!(c.headers, m.headers, "headers of {id}");
        assert_eq!(
            (c.partition, c.offset),
            delivered[&id],
            "message {id} where its delivery report said"
        );
        per_key
            .entry(m.key.clone())
            .or_default()
            .push((c.partition, c.offset, id));
    }
    for (key, msgs) in per_key {
        let partition = msgs[0].0;
        assert!(
            msgs.iter().all(|m| m.0 == partition),
            "key {key:?} on one partition"
        );
        let ids: Vec<usize> = msgs.iter().map(|m| m.2).collect();
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        assert_eq!(ids, sorted, "key {key:?} consumed in the order it was sent");
        assert!(
            msgs.windows(2).all(|w| w[0].1 < w[1].1),
            "offsets grow per key"
        );
    }
}

#[test]
fn roundtrip_100k_uncompressed() {
    roundtrip("none", &[], Compression::None, true);
}

/// With no tail cache every fetch is served from the segment files, with
/// the direct reads of `net::file_range`: the batches, of every size
/// librdkafka made, arrive byte-exact wherever they sit in the file.
#[test]
fn roundtrip_100k_uncompressed_from_segment_files() {
    let opts = BrokerOpts::default()
        .cores(2)
        .arg("--tail-cache-bytes")
        .arg("0");
    roundtrip_on(opts, "none", &[], Compression::None, true);
}

#[test]
fn roundtrip_100k_gzip() {
    roundtrip("gzip", &[], Compression::Gzip, false);
}

#[test]
fn roundtrip_100k_snappy() {
    roundtrip("snappy", &[], Compression::Snappy, false);
}

/// librdkafka compresses with lz4 only when the broker advertises
/// FindCoordinator (its `RD_KAFKA_FEATURE_LZ4` depends on it, see
/// `rdkafka_feature.c`), which fjord does not until groups exist; it then
/// sends lz4-configured batches uncompressed. The topic is therefore
/// `compression.type=lz4`, so the broker writes lz4 whatever arrives and the
/// consumer decodes lz4 batches the broker wrote.
#[test]
fn roundtrip_100k_lz4() {
    roundtrip(
        "lz4",
        &[("compression.type", "lz4")],
        Compression::Lz4,
        true,
    );
}

/// The strict form of the lz4 case: lz4 batches from librdkafka itself,
/// stored as sent (librdkafka uses lz4 only with brokers that advertise
/// FindCoordinator).
#[test]
fn roundtrip_100k_lz4_from_client() {
    roundtrip("lz4", &[], Compression::Lz4, false);
}

#[test]
fn roundtrip_100k_zstd() {
    roundtrip("zstd", &[], Compression::Zstd, false);
}
