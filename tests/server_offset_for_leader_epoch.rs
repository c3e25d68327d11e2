//! OffsetForLeaderEpoch (API key 23) against a real broker: every answer
//! of Kafka's (raw protocol), the `leader-epoch-checkpoint` file through
//! recovery's truncation, DeleteRecords and a rebuild, and librdkafka
//! validating its position with it — finding a truncated tail instead of
//! logging "validation skipped".

mod common;

use bytes::Bytes;
use common::client::{create_topic, leader_port, producer, CLIENT_REQUEST_TIMEOUT_MS};
use common::raw::{only_partition, produce_request, RawClient};
use common::{segment_path, Broker, BrokerOpts};
use fjord::record::{BatchBuilder, Compression};
use kafka_protocol::messages::delete_records_request::{
    DeleteRecordsPartition, DeleteRecordsTopic,
};
use kafka_protocol::messages::offset_for_leader_epoch_request::{
    OffsetForLeaderPartition, OffsetForLeaderTopic,
};
use kafka_protocol::messages::offset_for_leader_epoch_response::EpochEndOffset;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, DeleteRecordsRequest, MetadataRequest, OffsetForLeaderEpochRequest,
    TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The version the raw tests ask at (flexible); v2 and v3 are checked too.
const OFLE_VERSION: i16 = 4;
/// Bound on waiting for librdkafka to log or report something.
const CLIENT_WAIT: Duration = Duration::from_secs(30);
/// Records produced, one batch each.
const RECORDS: i64 = 5;
/// Kafka's error code NONE.
const NONE: i16 = 0;

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

fn one_record(value: &str) -> Bytes {
    BatchBuilder::new(Compression::None)
        .record(None, Some(value.as_bytes()), &[], 1_700_000_000_000)
        .build()
        .freeze()
}

/// One partition's OffsetForLeaderEpoch answer at `version`.
fn ask(
    raw: &mut RawClient,
    version: i16,
    topic: &str,
    partition: i32,
    current_leader_epoch: i32,
    leader_epoch: i32,
) -> EpochEndOffset {
    let req = OffsetForLeaderEpochRequest::default()
        .with_replica_id((-1).into())
        .with_topics(vec![OffsetForLeaderTopic::default()
            .with_topic(name(topic))
            .with_partitions(vec![OffsetForLeaderPartition::default()
                .with_partition(partition)
                .with_current_leader_epoch(current_leader_epoch)
                .with_leader_epoch(leader_epoch)])]);
    let resp = raw.request(version, &req);
    assert_eq!(resp.topics.len(), 1);
    assert_eq!(&*resp.topics[0].topic.0, topic);
    assert_eq!(resp.topics[0].partitions.len(), 1);
    let p = resp.topics[0].partitions[0].clone();
    assert_eq!(p.partition, partition);
    p
}

/// (error, leader epoch, end offset) of an answer.
fn triple(p: &EpochEndOffset) -> (i16, i32, i64) {
    (p.error_code, p.leader_epoch, p.end_offset)
}

fn produce_records(raw: &mut RawClient, topic: &str, partition: i32, n: i64) {
    for i in 0..n {
        let resp = raw.request(
            9,
            &produce_request(topic, partition, 1, one_record(&format!("r{i}"))),
        );
        assert_eq!(only_partition(&resp).error_code, 0);
    }
}

#[test]
fn answers_every_case_as_kafka_does() {
    let broker = Broker::start(BrokerOpts::default().cores(2));
    let topic = "ofle";
    create_topic(&broker.bootstrap(), topic, 2, &[]);
    let port0 = leader_port(&broker, topic, 0);
    let port1 = leader_port(&broker, topic, 1);
    assert_ne!(
        port0, port1,
        "the two partitions are led by different shards"
    );
    let mut raw = RawClient::connect(port0);

    // Advertised as Kafka 4.x serves it.
    let av = raw.request(3, &ApiVersionsRequest::default());
    let k = av
        .api_keys
        .iter()
        .find(|k| k.api_key == ApiKey::OffsetForLeaderEpoch as i16)
        .expect("OffsetForLeaderEpoch is advertised");
    assert_eq!((k.min_version, k.max_version), (2, 4));

    // Metadata reports epoch 0, the epoch stamped in the batches.
    let md = raw.request(
        12,
        &MetadataRequest::default().with_topics(Some(vec![
            kafka_protocol::messages::metadata_request::MetadataRequestTopic::default()
                .with_name(Some(name(topic))),
        ])),
    );
    assert_eq!(md.topics[0].partitions[0].leader_epoch, 0);

    produce_records(&mut raw, topic, 0, RECORDS);
    let none = NONE;

    // The current epoch ends at the log end, at every version.
    for version in 2..=OFLE_VERSION {
        let p = ask(&mut raw, version, topic, 0, -1, 0);
        assert_eq!(triple(&p), (none, 0, RECORDS), "v{version}");
    }
    // current_leader_epoch equal to the partition's: checked and fine.
    assert_eq!(
        triple(&ask(&mut raw, OFLE_VERSION, topic, 0, 0, 0)),
        (none, 0, RECORDS)
    );
    // An epoch above the current one: UNDEFINED, no error.
    assert_eq!(
        triple(&ask(&mut raw, OFLE_VERSION, topic, 0, 0, 1)),
        (none, -1, -1)
    );
    // The undefined epoch itself: UNDEFINED.
    assert_eq!(
        triple(&ask(&mut raw, OFLE_VERSION, topic, 0, -1, -1)),
        (none, -1, -1)
    );
    // An epoch older than the first known one: itself, and the start of
    // the first known epoch (stock Kafka 4.4 answers (-3, 0) here too).
    assert_eq!(
        triple(&ask(&mut raw, OFLE_VERSION, topic, 0, -1, -3)),
        (none, -3, 0)
    );
    // current_leader_epoch ahead of the partition's: UNKNOWN_LEADER_EPOCH;
    // behind it (any value but -1, "not given"): FENCED_LEADER_EPOCH, as
    // stock Kafka 4.4 answers for -2 and -5.
    assert_eq!(
        triple(&ask(&mut raw, OFLE_VERSION, topic, 0, 1, 0)),
        (ResponseError::UnknownLeaderEpoch.code(), -1, -1)
    );
    for behind in [-2, -5] {
        assert_eq!(
            triple(&ask(&mut raw, OFLE_VERSION, topic, 0, behind, 0)),
            (ResponseError::FencedLeaderEpoch.code(), -1, -1)
        );
    }
    // A partition another shard leads, whatever the epochs.
    assert_eq!(
        triple(&ask(&mut raw, OFLE_VERSION, topic, 1, -1, 0)),
        (ResponseError::NotLeaderOrFollower.code(), -1, -1)
    );
    assert_eq!(
        triple(&ask(&mut raw, OFLE_VERSION, topic, 1, 1, 0)),
        (ResponseError::NotLeaderOrFollower.code(), -1, -1)
    );
    // ... which its leader answers.
    let mut raw1 = RawClient::connect(port1);
    assert_eq!(
        triple(&ask(&mut raw1, OFLE_VERSION, topic, 1, 0, 0)),
        (none, 0, 0)
    );
    // Unknown partitions and topics.
    assert_eq!(
        triple(&ask(&mut raw, OFLE_VERSION, topic, 7, -1, 0)),
        (ResponseError::UnknownTopicOrPartition.code(), -1, -1)
    );
    assert_eq!(
        triple(&ask(&mut raw, OFLE_VERSION, "no-such-topic", 0, -1, 0)),
        (ResponseError::UnknownTopicOrPartition.code(), -1, -1)
    );

    // Several partitions and topics in one request, answered in order.
    let req = OffsetForLeaderEpochRequest::default().with_topics(vec![
        OffsetForLeaderTopic::default()
            .with_topic(name(topic))
            .with_partitions(vec![
                OffsetForLeaderPartition::default()
                    .with_partition(0)
                    .with_current_leader_epoch(0)
                    .with_leader_epoch(0),
                OffsetForLeaderPartition::default()
                    .with_partition(1)
                    .with_current_leader_epoch(0)
                    .with_leader_epoch(0),
            ]),
        OffsetForLeaderTopic::default()
            .with_topic(name("no-such-topic"))
            .with_partitions(vec![OffsetForLeaderPartition::default()
                .with_partition(0)
                .with_current_leader_epoch(-1)
                .with_leader_epoch(0)]),
    ]);
    let resp = raw.request(OFLE_VERSION, &req);
    let got: Vec<(String, i32, (i16, i32, i64))> = resp
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| (t.topic.0.to_string(), p.partition, triple(p)))
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (topic.to_string(), 0, (none, 0, RECORDS)),
            (
                topic.to_string(),
                1,
                (ResponseError::NotLeaderOrFollower.code(), -1, -1)
            ),
            (
                "no-such-topic".to_string(),
                0,
                (ResponseError::UnknownTopicOrPartition.code(), -1, -1)
            ),
        ]
    );

    // Every stored batch carries the epoch the answers speak of.
    let stored = common::disk::batches(&broker.first_segment(topic, 0));
    assert_eq!(stored.len() as i64, RECORDS);
    assert!(stored.iter().all(|b| b.header.partition_leader_epoch == 0));
}

fn checkpoint_path(data_dir: &Path, topic: &str) -> std::path::PathBuf {
    data_dir
        .join(format!("{topic}-0"))
        .join("leader-epoch-checkpoint")
}

fn read_checkpoint(data_dir: &Path, topic: &str) -> String {
    let path = checkpoint_path(data_dir, topic);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Cuts `bytes` off the end of `topic`-0's first segment (the broker is
/// stopped): the last batch becomes a torn tail that recovery truncates.
fn tear_tail(data_dir: &Path, topic: &str, bytes: u64) {
    let path = segment_path(data_dir, topic, 0);
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len(len - bytes).unwrap();
}

#[test]
fn checkpoint_follows_truncation_and_delete_records_and_is_rebuilt() {
    let mut broker = Broker::start(BrokerOpts::default().cores(1));
    let topic = "ofle-ckpt";
    create_topic(&broker.bootstrap(), topic, 1, &[]);
    let port = broker.port_of(0);
    let data = broker.data_dir();
    let mut raw = RawClient::connect(port);
    produce_records(&mut raw, topic, 0, RECORDS);
    // Epoch 0 started at offset 0, in Kafka's text format.
    assert_eq!(read_checkpoint(&data, topic), "0\n1\n0 0\n");

    // DeleteRecords moves the log start to 2: epoch 0 now starts there.
    let req = DeleteRecordsRequest::default()
        .with_timeout_ms(30_000)
        .with_topics(vec![DeleteRecordsTopic::default()
            .with_name(name(topic))
            .with_partitions(vec![DeleteRecordsPartition::default()
                .with_partition_index(0)
                .with_offset(2)])]);
    let resp = raw.request(2, &req);
    assert_eq!(resp.topics[0].partitions[0].error_code, 0);
    drop(raw);

    // A torn last batch, and a checkpoint naming an epoch 3 that began at
    // offset 5, whose data is in that torn tail: recovery truncates both.
    broker.stop();
    tear_tail(&data, topic, 10);
    std::fs::write(checkpoint_path(&data, topic), "0\n2\n0 0\n3 5\n").unwrap();
    broker.restart();
    // The restart leads the partition in epoch 1, from the log end on.
    assert_eq!(read_checkpoint(&data, topic), "0\n2\n0 2\n1 4\n");
    let mut raw = RawClient::connect(port);
    assert_eq!(
        triple(&ask(&mut raw, OFLE_VERSION, topic, 0, 1, 0)),
        (0, 0, RECORDS - 1),
        "epoch 0 ends at the log end recovery left"
    );
    assert_eq!(
        triple(&ask(&mut raw, OFLE_VERSION, topic, 0, 1, 3)),
        (0, -1, -1),
        "epoch 3 is gone with the torn tail"
    );
    drop(raw);

    // A missing checkpoint is rebuilt from the batches' epochs (and the
    // log start); so is a malformed one. Each restart starts a new epoch
    // (2, then 3) at the log end.
    for (damage, epoch) in [(None, 2), (Some("0\n7\n"), 3)] {
        broker.stop();
        match damage {
            None => std::fs::remove_file(checkpoint_path(&data, topic)).unwrap(),
            Some(text) => std::fs::write(checkpoint_path(&data, topic), text).unwrap(),
        }
        broker.restart();
        assert_eq!(
            read_checkpoint(&data, topic),
            format!("0\n2\n0 2\n{epoch} 4\n"),
            "rebuilt after {damage:?}"
        );
        let mut raw = RawClient::connect(port);
        assert_eq!(
            triple(&ask(&mut raw, OFLE_VERSION, topic, 0, -1, 0)),
            (0, 0, RECORDS - 1)
        );
    }
}

/// Captures librdkafka's log lines.
#[derive(Clone, Default)]
struct LogCapture {
    lines: Arc<Mutex<Vec<String>>>,
}

impl ClientContext for LogCapture {
    fn log(&self, _level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.lines
            .lock()
            .expect("log lock")
            .push(format!("{fac}: {log_message}"));
    }
}

impl ConsumerContext for LogCapture {}

impl LogCapture {
    fn any(&self, needle: &str) -> Option<String> {
        self.lines
            .lock()
            .expect("log lock")
            .iter()
            .find(|l| l.contains(needle))
            .cloned()
    }
}

/// Seeks `topic`-0 of `consumer` to `offset` as consumed in leader epoch
/// `epoch`: librdkafka then validates the position with
/// OffsetForLeaderEpoch (the rdkafka crate has no setter for the epoch).
fn seek_with_epoch(consumer: &BaseConsumer<LogCapture>, topic: &str, offset: i64, epoch: i32) {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(offset))
        .expect("add partition");
    // SAFETY: `tpl` owns a list of one element, alive for this call.
    unsafe {
        let list = tpl.ptr();
        rdkafka::bindings::rd_kafka_topic_partition_set_leader_epoch((*list).elems, epoch);
    }
    consumer
        .seek_partitions(tpl, Duration::from_millis(CLIENT_REQUEST_TIMEOUT_MS))
        .expect("seek");
}

/// Polls `consumer` until `done` holds, failing after [`CLIENT_WAIT`];
/// returns the consumer errors seen.
fn poll_until(
    consumer: &BaseConsumer<LogCapture>,
    what: &str,
    mut done: impl FnMut(&[String]) -> bool,
) -> Vec<String> {
    let deadline = Instant::now() + CLIENT_WAIT;
    let mut errors = Vec::new();
    while !done(&errors) {
        assert!(
            Instant::now() < deadline,
            "{what}; librdkafka logged:\n{}",
            consumer.context().lines.lock().unwrap().join("\n")
        );
        if let Some(Err(e)) = consumer.poll(Duration::from_millis(100)) {
            errors.push(e.to_string());
        }
    }
    errors
}

/// Produces `n` records to partition 0 of `topic`, one batch each, so that
/// tearing the log's tail takes exactly one record.
fn send_one_batch_each(broker: &Broker, topic: &str, n: usize) {
    let p = producer(&broker.bootstrap(), &[("linger.ms", "0")]);
    for i in 0..n {
        p.send(BaseRecord::<(), str, _>::with_opaque_to(topic, i).payload("value"))
            .expect("enqueue");
        p.flush(Duration::from_millis(CLIENT_REQUEST_TIMEOUT_MS))
            .expect("flush");
    }
}

/// A librdkafka consumer (group `group`, `auto.offset.reset=error`, its
/// debug log captured, `extra` settings on top) assigned partition 0 of
/// `topic` from the beginning, returned once it has read offsets 0 to 9.
fn consumer_through_9(
    broker: &Broker,
    topic: &str,
    group: &str,
    extra: &[(&str, &str)],
) -> (BaseConsumer<LogCapture>, LogCapture) {
    let capture = LogCapture::default();
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", broker.bootstrap())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "error")
        .set("fetch.wait.max.ms", "100");
    for (k, v) in extra {
        config.set(*k, *v);
    }
    let consumer: BaseConsumer<LogCapture> = config
        .set_log_level(RDKafkaLogLevel::Debug)
        .create_with_context(capture.clone())
        .expect("create consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .expect("add partition");
    consumer.assign(&tpl).expect("assign");
    let mut last = -1;
    let deadline = Instant::now() + CLIENT_WAIT;
    while last < 9 {
        assert!(Instant::now() < deadline, "consumed up to {last}");
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            last = m.expect("consume").offset();
        }
    }
    (consumer, capture)
}

#[test]
fn librdkafka_validates_its_position_and_finds_a_truncated_tail() {
    let mut broker = Broker::start(BrokerOpts::default().cores(1));
    let topic = "ofle-rdkafka";
    create_topic(&broker.bootstrap(), topic, 1, &[]);
    send_one_batch_each(&broker, topic, 10);
    let (consumer, capture) =
        consumer_through_9(&broker, topic, "ofle-validate", &[("debug", "fetch,topic")]);

    // The position after offset 9, read in epoch 0: validated, not skipped.
    seek_with_epoch(&consumer, topic, 10, 0);
    poll_until(&consumer, "librdkafka validated its position", |_| {
        capture.any("validation succeeded").is_some()
    });
    let ok = capture.any("validation succeeded").unwrap();
    assert!(
        ok.contains("broker end offset 10 (offset leader epoch 0)"),
        "{ok}"
    );
    assert_eq!(capture.any("validation skipped"), None);

    // The broker restarts and recovery truncates a torn last batch: the
    // consumer, still at 10 in epoch 0, learns that epoch 0 ends at 9 and
    // reports the truncation (auto.offset.reset=error) instead of waiting
    // at an offset the log no longer reaches.
    broker.stop();
    tear_tail(&broker.data_dir(), topic, 10);
    broker.restart();
    seek_with_epoch(&consumer, topic, 10, 0);
    let errors = poll_until(&consumer, "librdkafka detected the truncation", |_| {
        capture.any("truncation detected").is_some()
    });
    let detected = capture.any("truncation detected").unwrap();
    assert!(detected.contains("broker end offset is 9"), "{detected}");
    // ... and the application hears of it as a consumer error.
    poll_until(&consumer, "the consumer error reached poll", |more| {
        !errors.is_empty() || !more.is_empty()
    });
    assert_eq!(capture.any("validation skipped"), None);
}

/// The leader epoch of `topic`-`partition` as Metadata reports it.
fn metadata_epoch(raw: &mut RawClient, topic: &str, partition: i32) -> i32 {
    let md = raw.request(
        12,
        &MetadataRequest::default().with_topics(Some(vec![
            kafka_protocol::messages::metadata_request::MetadataRequestTopic::default()
                .with_name(Some(name(topic))),
        ])),
    );
    md.topics[0].partitions[partition as usize].leader_epoch
}

/// One partition's ListOffsets (latest) answer with `current_leader_epoch`:
/// (error, leader epoch).
fn list_latest(raw: &mut RawClient, topic: &str, current_leader_epoch: i32) -> (i16, i32) {
    list_at(raw, topic, current_leader_epoch, -1)
}

/// One partition's ListOffsets answer for `timestamp` (-1 latest, -2
/// earliest) with `current_leader_epoch`: (error, leader epoch).
fn list_at(
    raw: &mut RawClient,
    topic: &str,
    current_leader_epoch: i32,
    timestamp: i64,
) -> (i16, i32) {
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    let req = kafka_protocol::messages::ListOffsetsRequest::default()
        .with_replica_id((-1).into())
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(name(topic))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(0)
                .with_current_leader_epoch(current_leader_epoch)
                .with_timestamp(timestamp)])]);
    let resp = raw.request(7, &req);
    let p = &resp.topics[0].partitions[0];
    (p.error_code, p.leader_epoch)
}

/// One partition's Fetch v12 answer: `partition` of `topic` from
/// `fetch_offset`, with the client's `current_leader_epoch` and the
/// fetcher's `last_fetched_epoch` (-1: not sent).
fn fetch_v12(
    raw: &mut RawClient,
    topic: &str,
    partition: i32,
    fetch_offset: i64,
    current_leader_epoch: i32,
    last_fetched_epoch: i32,
) -> kafka_protocol::messages::fetch_response::PartitionData {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    let req = kafka_protocol::messages::FetchRequest::default()
        .with_replica_id((-1).into())
        .with_max_wait_ms(0)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_session_epoch(-1)
        .with_topics(vec![FetchTopic::default()
            .with_topic(name(topic))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(partition)
                .with_current_leader_epoch(current_leader_epoch)
                .with_fetch_offset(fetch_offset)
                .with_last_fetched_epoch(last_fetched_epoch)
                .with_log_start_offset(-1)
                .with_partition_max_bytes(1 << 20)])]);
    let mut resp = raw.request(12, &req);
    resp.responses.remove(0).partitions.remove(0)
}

/// One partition's Fetch v12 answer from offset 0 with
/// `current_leader_epoch`: (error, records returned, the leader named with
/// an error).
fn fetch_at(
    raw: &mut RawClient,
    topic: &str,
    partition: i32,
    current_leader_epoch: i32,
) -> (i16, usize, (i32, i32)) {
    let p = fetch_v12(raw, topic, partition, 0, current_leader_epoch, -1);
    let records = p.records.as_ref().map_or(0, |r| r.len());
    (
        p.error_code,
        records,
        (p.current_leader.leader_id.0, p.current_leader.leader_epoch),
    )
}

/// One partition's Fetch v12 answer at `fetch_offset` with the fetcher's
/// `last_fetched_epoch`: (error, record bytes returned, diverging epoch as
/// (epoch, end offset), (-1, -1) when unset).
fn fetch_diverging(
    raw: &mut RawClient,
    topic: &str,
    fetch_offset: i64,
    last_fetched_epoch: i32,
) -> (i16, usize, (i32, i64)) {
    let p = fetch_v12(raw, topic, 0, fetch_offset, -1, last_fetched_epoch);
    (
        p.error_code,
        p.records.as_ref().map_or(0, |r| r.len()),
        (p.diverging_epoch.epoch, p.diverging_epoch.end_offset),
    )
}

/// KIP-320 in Fetch (v12+): a fetcher that names the epoch of its last
/// batch is told where its log diverges from the leader's — the largest
/// epoch at or below it and where that ends — instead of records, when
/// that end is below its fetch offset; an epoch the log does not know is
/// OFFSET_OUT_OF_RANGE. Checked against stock Kafka 4.4 with one epoch:
/// `FJORD_TEST_BROKER=kafka:127.0.0.1:19092`.
#[test]
fn fetch_with_last_fetched_epoch_answers_the_diverging_epoch() {
    let target = common::target::Target::start(BrokerOpts::default().cores(1));
    let topic = target.name("ofle-diverging");
    create_topic(&target.bootstrap(), &topic, 1, &[]);
    let mut raw = RawClient::connect(target.port());
    let epoch = metadata_epoch(&mut raw, &topic, 0);
    produce_records(&mut raw, &topic, 0, 3);
    let oor = ResponseError::OffsetOutOfRange.code();
    // In step with the log: records, no divergence.
    let (error, records, diverging) = fetch_diverging(&mut raw, &topic, 1, epoch);
    assert_eq!((error, diverging), (NONE, (-1, -1)));
    assert!(records > 0);
    assert_eq!(
        fetch_diverging(&mut raw, &topic, 3, epoch),
        (NONE, 0, (-1, -1))
    );
    // Past the end in the current epoch: the epoch ends at the log end.
    assert_eq!(
        fetch_diverging(&mut raw, &topic, 7, epoch),
        (NONE, 0, (epoch, 3))
    );
    // An epoch newer than any the log knows.
    assert_eq!(fetch_diverging(&mut raw, &topic, 1, epoch + 3).0, oor);
    // No epoch sent: the plain offset check.
    assert_eq!(fetch_diverging(&mut raw, &topic, 7, -1).0, oor);
}

/// The same over several epochs (each restart of fjord starts one):
/// offsets 0-2 in epoch 0, 3 in epoch 1, 4 in epoch 2.
#[test]
fn fetch_names_the_epoch_where_a_fetcher_diverges_across_epochs() {
    let mut broker = Broker::start(BrokerOpts::default().cores(1));
    let topic = "ofle-diverging-epochs";
    create_topic(&broker.bootstrap(), topic, 1, &[]);
    let port = leader_port(&broker, topic, 0);
    produce_records(&mut RawClient::connect(port), topic, 0, 3);
    for _ in 0..2 {
        broker.stop();
        broker.restart();
        produce_records(&mut RawClient::connect(port), topic, 0, 1);
    }
    let mut raw = RawClient::connect(port);
    assert_eq!(metadata_epoch(&mut raw, topic, 0), 2);
    // A follower that holds epoch 0 up to offset 5 diverged at 3.
    assert_eq!(fetch_diverging(&mut raw, topic, 5, 0), (NONE, 0, (0, 3)));
    assert_eq!(fetch_diverging(&mut raw, topic, 4, 0), (NONE, 0, (0, 3)));
    // Epoch 0 up to 3, epoch 1 up to 4: in step, the next records come.
    let (error, records, diverging) = fetch_diverging(&mut raw, topic, 3, 0);
    assert_eq!((error, diverging), (NONE, (-1, -1)));
    assert!(records > 0);
    let (error, records, diverging) = fetch_diverging(&mut raw, topic, 4, 1);
    assert_eq!((error, diverging), (NONE, (-1, -1)));
    assert!(records > 0);
    assert_eq!(fetch_diverging(&mut raw, topic, 5, 1), (NONE, 0, (1, 4)));
    assert_eq!(fetch_diverging(&mut raw, topic, 5, 2), (NONE, 0, (-1, -1)));
    assert_eq!(fetch_diverging(&mut raw, topic, 6, 2), (NONE, 0, (2, 5)));
    assert_eq!(
        fetch_diverging(&mut raw, topic, 0, 3).0,
        ResponseError::OffsetOutOfRange.code()
    );
}

/// Every start of the broker leads its partitions in a new leader epoch
/// (Kafka's leader epoch grows each time leadership is established): the
/// epoch is reported by Metadata and with NOT_LEADER_OR_FOLLOWER, stamped
/// in the batches appended after the restart, recorded in the checkpoint,
/// and a client's `current_leader_epoch` from before the restart is fenced
/// in Fetch, ListOffsets and OffsetForLeaderEpoch, one from the future is
/// unknown.
#[test]
fn every_restart_starts_a_new_leader_epoch() {
    let mut broker = Broker::start(BrokerOpts::default().cores(2));
    let topic = "ofle-restart";
    create_topic(&broker.bootstrap(), topic, 2, &[]);
    let port0 = leader_port(&broker, topic, 0);
    let port1 = leader_port(&broker, topic, 1);
    assert_ne!(port0, port1);
    let mut raw = RawClient::connect(port0);
    assert_eq!(metadata_epoch(&mut raw, topic, 0), 0, "a fresh broker");
    produce_records(&mut raw, topic, 0, 3);
    drop(raw);

    for epoch in [1, 2] {
        broker.stop();
        broker.restart();
        let mut raw = RawClient::connect(port0);
        assert_eq!(metadata_epoch(&mut raw, topic, 0), epoch);
        assert_eq!(metadata_epoch(&mut raw, topic, 1), epoch);
        let stale = epoch - 1;
        let fenced = ResponseError::FencedLeaderEpoch.code();
        let unknown = ResponseError::UnknownLeaderEpoch.code();
        // ListOffsets.
        assert_eq!(list_latest(&mut raw, topic, stale).0, fenced);
        assert_eq!(list_latest(&mut raw, topic, epoch + 1).0, unknown);
        assert_eq!(list_latest(&mut raw, topic, epoch), (NONE, epoch));
        assert_eq!(list_latest(&mut raw, topic, -1), (NONE, epoch));
        // The earliest offset was appended in epoch 0: its epoch, as Kafka
        // reports the epoch of the offset answered.
        assert_eq!(list_at(&mut raw, topic, -1, -2), (NONE, 0));
        // Fetch.
        assert_eq!(fetch_at(&mut raw, topic, 0, stale).0, fenced);
        assert_eq!(fetch_at(&mut raw, topic, 0, epoch + 1).0, unknown);
        let (error, records, _) = fetch_at(&mut raw, topic, 0, epoch);
        assert_eq!(error, NONE);
        assert!(records > 0);
        // A partition of the other shard: NOT_LEADER_OR_FOLLOWER naming the
        // leader and its epoch.
        let (error, _, leader) = fetch_at(&mut raw, topic, 1, -1);
        assert_eq!(error, ResponseError::NotLeaderOrFollower.code());
        assert_eq!(leader.1, epoch);
        let resp = raw.request(10, &produce_request(topic, 1, 1, one_record("x")));
        let p = only_partition(&resp);
        assert_eq!(p.error_code, ResponseError::NotLeaderOrFollower.code());
        assert_eq!(p.current_leader.leader_epoch, epoch);
        // OffsetForLeaderEpoch.
        assert_eq!(
            ask(&mut raw, OFLE_VERSION, topic, 0, stale, 0).error_code,
            fenced
        );
        assert_eq!(
            ask(&mut raw, OFLE_VERSION, topic, 0, epoch + 1, 0).error_code,
            unknown
        );
        produce_records(&mut raw, topic, 0, 1);
    }
    // Offsets 0-2 in epoch 0, 3 in epoch 1, 4 in epoch 2.
    let mut raw = RawClient::connect(port0);
    assert_eq!(
        triple(&ask(&mut raw, OFLE_VERSION, topic, 0, 2, 0)),
        (NONE, 0, 3)
    );
    assert_eq!(
        triple(&ask(&mut raw, OFLE_VERSION, topic, 0, 2, 1)),
        (NONE, 1, 4)
    );
    assert_eq!(
        triple(&ask(&mut raw, OFLE_VERSION, topic, 0, 2, 2)),
        (NONE, 2, 5)
    );
    let stored = common::disk::batches(&broker.first_segment(topic, 0));
    let epochs: Vec<i32> = stored
        .iter()
        .map(|b| b.header.partition_leader_epoch)
        .collect();
    assert_eq!(epochs, vec![0, 0, 0, 1, 2]);
    assert_eq!(
        read_checkpoint(&broker.data_dir(), topic),
        "0\n3\n0 0\n1 3\n2 4\n"
    );
}

/// The case the epoch bump exists for: a consumer read up to offset 10 in
/// epoch 0; the broker restarts, recovery truncates a torn tail (the log
/// ends at 9) and producers append past the consumer's position again in
/// the new epoch. Without a new epoch, epoch 0 would end at the new log end
/// and the consumer would carry on from 10, never seeing the records that
/// replaced 9. librdkafka sees the new epoch in Metadata, validates its
/// position (OffsetForLeaderEpoch says epoch 0 ends at 9) and reports the
/// truncation — with no seek from the application.
#[test]
fn librdkafka_detects_a_truncation_after_a_restart_with_new_appends() {
    let mut broker = Broker::start(BrokerOpts::default().cores(1));
    let topic = "ofle-rdkafka-restart";
    create_topic(&broker.bootstrap(), topic, 1, &[]);
    send_one_batch_each(&broker, topic, 10);
    let (consumer, capture) = consumer_through_9(
        &broker,
        topic,
        "ofle-validate-restart",
        &[
            ("topic.metadata.refresh.interval.ms", "1000"),
            ("debug", "fetch,topic,metadata"),
        ],
    );

    broker.stop();
    tear_tail(&broker.data_dir(), topic, 10);
    broker.restart();
    // Offsets 9, 10 and 11 again, in epoch 1.
    send_one_batch_each(&broker, topic, 3);
    let errors = poll_until(&consumer, "librdkafka detected the truncation", |_| {
        capture.any("truncation detected").is_some()
    });
    let detected = capture.any("truncation detected").unwrap();
    assert!(detected.contains("broker end offset is 9"), "{detected}");
    poll_until(&consumer, "the consumer error reached poll", |more| {
        !errors.is_empty() || !more.is_empty()
    });
    assert_eq!(capture.any("validation skipped"), None);
}
