//! Durability corners on a real broker: a segment roll that finds no free
//! file descriptor, a topic re-created after a crash in the middle of its
//! deletion, and damage to the metadata log.

mod common;

use bytes::Bytes;
use common::client::{
    admin, admin_opts, block_on, consume, consumer, create_topic, CLIENT_REQUEST_TIMEOUT_MS,
};
use common::raw::{only_partition, produce_request, RawClient};
use common::{wait_for, Broker, BrokerOpts};
use fjord::record::{BatchBuilder, Compression};
use kafka_protocol::messages::ProduceRequest;
use kafka_protocol::ResponseError;
use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeSet;
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

const PRODUCE_VERSION: i16 = 9;

fn timeout() -> Duration {
    Duration::from_millis(CLIENT_REQUEST_TIMEOUT_MS)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// `records` uncompressed records of `value_bytes`, each value filled with
/// `fill`.
fn batch(records: usize, value_bytes: usize, fill: u8) -> Bytes {
    let value = vec![fill; value_bytes];
    let mut b = BatchBuilder::new(Compression::None);
    for _ in 0..records {
        b = b.record(None, Some(&value), &[], now_ms());
    }
    b.build().freeze()
}

/// Produces `records` (acks=all) on `client`; the partition's error code
/// and base offset.
fn produce(client: &mut RawClient, topic: &str, records: Bytes) -> (i16, i64) {
    let resp =
        client.request::<ProduceRequest>(PRODUCE_VERSION, &produce_request(topic, 0, -1, records));
    let p = only_partition(&resp);
    (p.error_code, p.base_offset)
}

/// (low, high) watermarks of partition 0 of `topic`.
fn watermarks(bootstrap: &str, topic: &str) -> (i64, i64) {
    consumer(bootstrap, &[])
        .fetch_watermarks(topic, 0, timeout())
        .expect("watermarks")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for ent in std::fs::read_dir(from).unwrap() {
        let ent = ent.unwrap();
        let target = to.join(ent.file_name());
        if ent.file_type().unwrap().is_dir() {
            copy_dir(&ent.path(), &target);
        } else {
            std::fs::copy(ent.path(), &target).unwrap();
        }
    }
}

/// The broker's limit on open files in the test below: room for a 1-shard
/// broker with one partition (about 15) and the 50 partitions of
/// `__consumer_offsets` the consumer at the end has it create (4 each);
/// client connections use up the rest.
const FD_LIMIT: usize = 512;

/// Waits until the broker's descriptor count has not changed for a while
/// (connections of earlier clients closed); returns it.
fn settled_fds(broker: &Broker) -> usize {
    let deadline = Instant::now() + Duration::from_secs(15);
    let (mut last, mut since) = (broker.open_fds(), Instant::now());
    while since.elapsed() < Duration::from_millis(1000) {
        assert!(
            Instant::now() < deadline,
            "the descriptor count never settled"
        );
        std::thread::sleep(Duration::from_millis(20));
        let n = broker.open_fds();
        if n != last {
            (last, since) = (n, Instant::now());
        }
    }
    last
}

/// Opens connections the broker accepts (one descriptor each) until it
/// holds `FD_LIMIT` descriptors, and keeps it there for a moment (topping
/// up if one is closed meanwhile).
fn use_up_descriptors(broker: &Broker, fillers: &mut Vec<TcpStream>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut full_since: Option<Instant> = None;
    while full_since.is_none_or(|t| t.elapsed() < Duration::from_millis(500)) {
        assert!(
            Instant::now() < deadline,
            "could not use up the descriptors"
        );
        let before = broker.open_fds();
        if before >= FD_LIMIT {
            full_since.get_or_insert_with(Instant::now);
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        full_since = None;
        fillers.push(TcpStream::connect(("127.0.0.1", broker.port)).expect("connect"));
        let accepted = Instant::now() + Duration::from_millis(500);
        while broker.open_fds() == before && Instant::now() < accepted {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// A segment roll that finds no free file descriptor (EMFILE) does not
/// take the log offline for good: the produce that needed the new segment
/// and those after it are answered KAFKA_STORAGE_ERROR (retriable) while
/// the shortage lasts, the log's writer retries, and once descriptors are
/// free again the same partition takes produces again, without a restart,
/// with nothing staged lost. Descriptors are used up by idle client
/// connections (one each) under a lowered RLIMIT_NOFILE.
#[test]
fn a_roll_out_of_file_descriptors_is_retried_and_the_log_recovers() {
    let broker = Broker::start(BrokerOpts::default().cores(1).nofile(FD_LIMIT as u64));
    let topic = "dur-fds";
    // Kafka's smallest segment.bytes (1 MiB): two ~700 KB batches roll.
    create_topic(
        &broker.bootstrap(),
        topic,
        1,
        &[("segment.bytes", "1048576")],
    );
    let mut client = RawClient::connect(broker.port);
    let (code, base) = produce(&mut client, topic, batch(35, 20_000, b'a'));
    assert_eq!((code, base), (0, 0), "the first batch");

    // Use up every descriptor with connections the broker accepts, once
    // the admin client's are closed (nothing else frees one meanwhile).
    settled_fds(&broker);
    let mut fillers: Vec<TcpStream> = Vec::new();
    use_up_descriptors(&broker, &mut fillers);

    // This batch rolls the segment: sealing the old one (its index files)
    // and opening the new one need descriptors the broker cannot get.
    let (code, _) = produce(&mut client, topic, batch(35, 20_000, b'b'));
    assert_eq!(
        code,
        ResponseError::KafkaStorageError.code(),
        "the produce that rolls without descriptors"
    );
    // While the shortage lasts, appends are refused (nothing written).
    let (code, _) = produce(&mut client, topic, batch(1, 100, b'x'));
    assert_eq!(code, ResponseError::KafkaStorageError.code());

    // Descriptors free again: the writer's retry succeeds and the same
    // partition takes produces.
    drop(fillers);
    wait_for(
        Duration::from_secs(10),
        "the broker to close the connections",
        || (broker.open_fds() < FD_LIMIT / 2).then_some(()),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let base = loop {
        let (code, base) = produce(&mut client, topic, batch(1, 100, b'c'));
        if code == 0 {
            break base;
        }
        assert!(
            Instant::now() < deadline,
            "the partition never took a produce again: last error {code}\n{}",
            broker.stderr_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // The rolling batch was staged before the shortage showed: it was
    // written once the new segment opened (its producer was told a
    // retriable error, as after a timeout); the refused one was not.
    assert_eq!(base, 70, "offsets after the two 35-record batches");
    let got = consume(
        &broker.bootstrap(),
        topic,
        1,
        71,
        Duration::from_millis(500),
        timeout(),
    );
    let offsets: Vec<i64> = got.iter().map(|m| m.offset).collect();
    assert_eq!(offsets, (0..71).collect::<Vec<i64>>());
    let fills: Vec<u8> = got.iter().map(|m| m.value.as_ref().unwrap()[0]).collect();
    assert!(fills[..35].iter().all(|&f| f == b'a'));
    assert!(fills[35..70].iter().all(|&f| f == b'b'));
    assert_eq!(fills[70], b'c');
    let log = broker.stderr_tail();
    assert!(log.contains("out of file descriptors"), "{log}");
}

/// A crash after DeleteTopics is durable in the metadata log but before the
/// partition directory is removed must not hand the old records to a topic
/// created again under the same name. The crash is modelled by putting the
/// directory (and the checkpoint files, which still named its log start)
/// back after a clean deletion, while the broker is stopped: exactly what
/// the disk holds if the broker died between the two steps. A second round
/// puts the directory back while the broker runs (as if the start-up sweep
/// had failed to remove it) to check the re-created partition's own guard.
#[test]
fn a_topic_recreated_after_a_crash_during_its_deletion_starts_empty() {
    let mut broker = Broker::start(BrokerOpts::default().cores(1));
    let bootstrap = broker.bootstrap();
    let topic = "dur-recreate";
    let data = broker.data_dir();
    let dir = data.join(format!("{topic}-0"));
    let saved = tempfile::tempdir().unwrap();

    create_topic(&bootstrap, topic, 1, &[]);
    let mut client = RawClient::connect(broker.port);
    assert_eq!(produce(&mut client, topic, batch(10, 100, b'o')), (0, 0));
    // Move the log start: it is checkpointed before the answer.
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(4))
        .unwrap();
    block_on(admin(&bootstrap).delete_records(&tpl, &admin_opts())).expect("delete_records");
    assert_eq!(watermarks(&bootstrap, topic), (4, 10));

    // What the disk holds right before the deletion.
    copy_dir(&dir, &saved.path().join("partition"));
    let checkpoints: Vec<String> = std::fs::read_dir(&data)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.contains("offset-checkpoint"))
        .collect();
    assert!(!checkpoints.is_empty());
    for name in &checkpoints {
        std::fs::copy(data.join(name), saved.path().join(name)).unwrap();
    }
    let deleted =
        block_on(admin(&bootstrap).delete_topics(&[topic], &admin_opts())).expect("delete_topics");
    assert!(deleted.iter().all(|r| r.is_ok()), "{deleted:?}");
    wait_for(Duration::from_secs(10), "the directory to go", || {
        (!dir.exists()).then_some(())
    });
    broker.stop();
    copy_dir(&saved.path().join("partition"), &dir);
    for name in &checkpoints {
        std::fs::copy(saved.path().join(name), data.join(name)).unwrap();
    }

    broker.restart();
    // Start-up removed the directory: its topic id is not in the metadata.
    assert!(
        !dir.exists(),
        "the deleted topic's directory is still there"
    );
    let bootstrap = broker.bootstrap();
    create_topic(&bootstrap, topic, 1, &[]);
    assert_eq!(
        watermarks(&bootstrap, topic),
        (0, 0),
        "the new topic is empty"
    );
    let mut client = RawClient::connect(broker.port);
    assert_eq!(produce(&mut client, topic, batch(1, 100, b'n')), (0, 0));
    let got = consume(
        &bootstrap,
        topic,
        1,
        1,
        Duration::from_millis(500),
        timeout(),
    );
    assert_eq!(got.len(), 1, "only the new record: {got:?}");
    assert_eq!(
        (got[0].offset, got[0].value.as_deref()),
        (0, Some(&[b'n'; 100][..]))
    );
    // The old log start is not applied to the new topic after a crash.
    broker.kill9();
    broker.restart();
    let bootstrap = broker.bootstrap();
    assert_eq!(watermarks(&bootstrap, topic), (0, 1));

    // Round two: delete again, and the old directory reappears while the
    // broker runs; re-creating the topic must not adopt it.
    let deleted =
        block_on(admin(&bootstrap).delete_topics(&[topic], &admin_opts())).expect("delete_topics");
    assert!(deleted.iter().all(|r| r.is_ok()), "{deleted:?}");
    wait_for(Duration::from_secs(10), "the directory to go", || {
        (!dir.exists()).then_some(())
    });
    copy_dir(&saved.path().join("partition"), &dir);
    create_topic(&bootstrap, topic, 1, &[]);
    assert_eq!(
        watermarks(&bootstrap, topic),
        (0, 0),
        "the new topic is empty"
    );
    let mut client = RawClient::connect(broker.port);
    assert_eq!(produce(&mut client, topic, batch(2, 100, b'm')), (0, 0));
    let got = consume(
        &bootstrap,
        topic,
        1,
        2,
        Duration::from_millis(500),
        timeout(),
    );
    let values: Vec<u8> = got.iter().map(|m| m.value.as_ref().unwrap()[0]).collect();
    assert_eq!(values, vec![b'm', b'm'], "{got:?}");
}

/// Topic names in the broker's metadata, internal topics left out.
fn topic_names(bootstrap: &str) -> BTreeSet<String> {
    consumer(bootstrap, &[])
        .fetch_metadata(None, timeout())
        .expect("metadata")
        .topics()
        .iter()
        .map(|t| t.name().to_string())
        .filter(|n| !n.starts_with("__"))
        .collect()
}

/// The frames of the metadata Raft log (`metadata::quorum::store`: each
/// `[length u32][crc32c u32][kind and body]`), as (start, end) byte ranges;
/// panics unless the file is whole frames with valid CRCs.
fn raft_frames(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let len = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        let crc = u32::from_be_bytes(bytes[at + 4..at + 8].try_into().unwrap());
        let end = at + 8 + len;
        assert_eq!(crc32c::crc32c(&bytes[at + 8..end]), crc, "frame at {at}");
        out.push((at, end));
        at = end;
    }
    out
}

/// The first frame of `frames` whose bytes contain `needle`.
fn frame_with(bytes: &[u8], frames: &[(usize, usize)], needle: &str) -> (usize, usize) {
    *frames
        .iter()
        .find(|(s, e)| {
            bytes[*s..*e]
                .windows(needle.len())
                .any(|w| w == needle.as_bytes())
        })
        .unwrap_or_else(|| panic!("no frame holds {needle}"))
}

/// A corrupt record in the middle of the metadata log (the Raft log,
/// `__cluster_metadata/raft.log`) stops the broker at start-up with an
/// error naming the file and the record's byte offset, instead of
/// replaying the records before it and silently dropping every later one;
/// a torn last record (a crash mid-append) is still cut off and the broker
/// starts with everything before it.
#[test]
fn a_corrupt_metadata_record_before_others_stops_the_broker_naming_its_offset() {
    let mut broker = Broker::start(BrokerOpts::default().cores(1));
    let topics = ["dur-meta-a", "dur-meta-b", "dur-meta-c"];
    for t in topics {
        create_topic(&broker.bootstrap(), t, 1, &[]);
    }
    assert_eq!(
        topic_names(&broker.bootstrap()),
        topics.iter().map(|t| t.to_string()).collect()
    );
    broker.stop();
    let path = broker.data_dir().join("__cluster_metadata/raft.log");
    assert!(
        !broker
            .data_dir()
            .join("__cluster_metadata/metadata.log")
            .exists(),
        "no old-format log is written"
    );
    let good = std::fs::read(&path).unwrap();
    let frames = raft_frames(&good);

    // One flipped bit inside the record of topic b, which c's follows.
    let (b_start, b_end) = frame_with(&good, &frames, "\"dur-meta-b\"");
    let at = b_start
        + good[b_start..b_end]
            .windows(10)
            .position(|w| w == b"dur-meta-b")
            .unwrap();
    let mut bad = good.clone();
    bad[at + 9] ^= 0x20;
    std::fs::write(&path, &bad).unwrap();
    let (status, output) = broker.start_expecting_exit(Duration::from_secs(30));
    assert!(!status.success(), "exit status {status}\n{output}");
    assert!(
        output.contains(&format!("the record at byte {b_start} is corrupt")),
        "{output}"
    );
    assert!(output.contains(&path.display().to_string()), "{output}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bad,
        "the file is left for repair"
    );

    // A torn record: the log cut in the middle of topic c's record. The
    // broker starts, with the topics of the records before it.
    let (c_start, c_end) = frame_with(&good, &frames, "\"dur-meta-c\"");
    let torn = &good[..c_start + (c_end - c_start) / 2];
    std::fs::write(&path, torn).unwrap();
    broker.restart();
    assert_eq!(
        topic_names(&broker.bootstrap()),
        ["dur-meta-a", "dur-meta-b"]
            .iter()
            .map(|t| t.to_string())
            .collect()
    );
    // The torn record was cut off: what the broker appended since follows
    // the intact records, each whole and with its CRC.
    broker.stop();
    let now = std::fs::read(&path).unwrap();
    assert_eq!(&now[..c_start], &good[..c_start]);
    let frames = raft_frames(&now);
    assert!(frames.iter().any(|&(s, _)| s == c_start), "{frames:?}");
}
