//! DeleteRecords on a replicated partition (`docs/replication.md` §4.3),
//! three nodes in network namespaces (`common::netns`), one shard each, a
//! quorum of all three, a topic of three replicas:
//! - the leader answers with the low watermark (Kafka's
//!   `lowWatermarkIfLeader`: the least log start of the live replicas, as
//!   their fetches report it) and only once it has reached the offset: with
//!   a follower frozen (SIGSTOP; still registered, unfenced and in the ISR
//!   for the request's timeout) the request times out
//!   (REQUEST_TIMED_OUT) although the leader moved its own log start;
//!   thawed, the follower takes the leader's log start from its next fetch
//!   answer and the same request is answered with the offset;
//! - every replica then starts there: its `log-start-offset-checkpoint`
//!   names the offset, and the segments wholly below it are deleted on
//!   every node, followers included;
//! - the leader SIGKILLed, the follower elected in its place answers
//!   ListOffsets EARLIEST with the offset: the deleted records do not come
//!   back (the chaos checker's `log-start-regression`, §8.1).

mod common;

use common::cluster::{addr, create_assigned};
use common::netns::Net;
use common::raw::{only_partition, produce_request, RawClient};
use common::Broker;
use kafka_protocol::messages::delete_records_request::{
    DeleteRecordsPartition, DeleteRecordsTopic,
};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{DeleteRecordsRequest, ListOffsetsRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use std::time::Duration;

const NODES: usize = 3;
/// `--broker-session-timeout-ms`: long enough for a frozen follower to stay
/// live (unfenced) through a DeleteRecords' [`SHORT_TIMEOUT_MS`].
const SESSION_TIMEOUT_MS: u64 = 8000;
/// The timeout of the DeleteRecords that must time out.
const SHORT_TIMEOUT_MS: i32 = 2000;
const SETTLE: Duration = Duration::from_secs(60);
const TOPIC: &str = "deleted";
/// Batches produced, each one record of [`VALUE_BYTES`]: with 1 MiB
/// segments (the smallest `segment.bytes`), four batches to a segment.
const BATCHES: usize = 16;
const VALUE_BYTES: usize = 250_000;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// One batch of one record of [`VALUE_BYTES`] bytes.
fn big_batch(i: usize) -> bytes::Bytes {
    let value = vec![b'a' + (i % 26) as u8; VALUE_BYTES];
    fjord::record::BatchBuilder::new(fjord::record::Compression::None)
        .record(None, Some(&value), &[], 1_700_000_000_000)
        .build()
        .freeze()
}

/// DeleteRecords of partition 0 of [`TOPIC`] below `offset` at `broker`,
/// waiting up to `timeout_ms`: (error code, low watermark).
fn delete_records(broker: &Broker, offset: i64, timeout_ms: i32) -> (i16, i64) {
    let resp = RawClient::connect_to(addr(broker)).request(
        2,
        &DeleteRecordsRequest::default()
            .with_topics(vec![DeleteRecordsTopic::default()
                .with_name(TopicName(s(TOPIC)))
                .with_partitions(vec![DeleteRecordsPartition::default()
                    .with_partition_index(0)
                    .with_offset(offset)])])
            .with_timeout_ms(timeout_ms),
    );
    let p = &resp.topics[0].partitions[0];
    (p.error_code, p.low_watermark)
}

/// Partition 0's ListOffsets EARLIEST at `broker`, its leader: the log
/// start. Asked again while it answers NOT_LEADER_OR_FOLLOWER.
fn earliest(broker: &Broker) -> i64 {
    let req = ListOffsetsRequest::default()
        .with_replica_id((-1).into())
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(TopicName(s(TOPIC)))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(0)
                .with_current_leader_epoch(-1)
                .with_timestamp(-2)])]);
    common::wait_for(SETTLE, "ListOffsets EARLIEST at the leader", || {
        let resp = RawClient::connect_to(addr(broker)).request(7, &req);
        let answer = &resp.topics[0].partitions[0];
        if answer.error_code == ResponseError::NotLeaderOrFollower.code() {
            std::thread::sleep(Duration::from_millis(100));
            return None;
        }
        assert_eq!(answer.error_code, 0, "ListOffsets EARLIEST");
        Some(answer.offset)
    })
}

/// The base offsets of `broker`'s segments of partition 0, ascending.
fn segment_bases(broker: &Broker) -> Vec<i64> {
    let dir = broker.data_dir().join(format!("{TOPIC}-0"));
    let mut bases: Vec<i64> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .filter_map(|e| {
                    let name = e.ok()?.file_name().into_string().ok()?;
                    name.strip_suffix(".log")?.parse().ok()
                })
                .collect()
        })
        .unwrap_or_default();
    bases.sort();
    bases
}

/// Partition 0's entry in `broker`'s `log-start-offset-checkpoint`.
fn checkpointed_log_start(broker: &Broker) -> Option<i64> {
    let file = fjord::log::checkpoint::shard_file(
        &broker.data_dir(),
        fjord::log::checkpoint::LOG_START_CHECKPOINT,
        0,
    );
    let text = std::fs::read_to_string(file).ok()?;
    fjord::log::checkpoint::decode(&text)?
        .into_iter()
        .find(|(tp, _)| tp.topic == TOPIC && tp.partition.0 == 0)
        .map(|(_, offset)| offset)
}

/// Partition 0 of [`TOPIC`] in `broker`'s Metadata: (leader, ISR sorted).
fn listed(broker: &Broker) -> Option<(i32, Vec<i32>)> {
    let p = common::cluster::partition(broker, TOPIC, 0)?.sorted();
    Some((p.leader, p.isr))
}

#[test]
fn delete_records_waits_for_every_replica_and_survives_a_failover() {
    let net = Net::new(NODES);
    let mut brokers = common::cluster::start_all(&net, NODES, SESSION_TIMEOUT_MS, SETTLE, |_| &[]);
    create_assigned(
        &brokers,
        TOPIC,
        &[0, 1000, 2000],
        &[("min.insync.replicas", "2"), ("segment.bytes", "1048576")],
    );
    common::wait_for(SETTLE, "node 0 leading with the whole ISR", || {
        (listed(&brokers[0])? == (0, vec![0, 1000, 2000])).then_some(())
    });
    for i in 0..BATCHES {
        let resp = RawClient::connect_to(addr(&brokers[0]))
            .request(9, &produce_request(TOPIC, 0, -1, big_batch(i)));
        assert_eq!(only_partition(&resp).error_code, 0, "batch {i}");
    }
    // Every follower holds the leader's segments.
    let bases = segment_bases(&brokers[0]);
    assert!(bases.len() >= 3, "several segments: {bases:?}");
    for (i, b) in brokers.iter().enumerate() {
        common::wait_for(SETTLE, &format!("node {i}'s segments"), || {
            (segment_bases(b) == bases).then_some(())
        });
    }
    // Inside the third segment: the first two are wholly below it.
    let offset = bases[2] + 1;

    // A follower frozen: still live and in the ISR, it cannot fetch, so
    // the low watermark stays below the offset and the request times out,
    // though the leader moved its own log start.
    brokers[2].signal("-STOP");
    let (error, _) = delete_records(&brokers[0], offset, SHORT_TIMEOUT_MS);
    assert_eq!(
        error,
        ResponseError::RequestTimedOut.code(),
        "answered before every live replica deleted the records"
    );
    assert_eq!(earliest(&brokers[0]), offset, "the leader's log start");
    brokers[2].signal("-CONT");

    // Thawed, it follows the leader's log start: answered, with the low
    // watermark at the offset.
    assert_eq!(
        delete_records(&brokers[0], offset, 30_000),
        (0, offset),
        "answered with the low watermark"
    );
    // Every replica starts there, on disk: the checkpoint names it (a
    // follower writes it before its fetch reports it) and the segments
    // wholly below it are gone.
    for (i, b) in brokers.iter().enumerate() {
        assert_eq!(
            checkpointed_log_start(b),
            Some(offset),
            "node {i}'s checkpointed log start"
        );
        assert_eq!(
            segment_bases(b),
            bases[2..].to_vec(),
            "node {i}'s segments below the log start deleted"
        );
    }

    // The leader dies: the follower elected answers EARLIEST with the
    // offset, not below it.
    brokers[0].kill9();
    let leader = common::wait_for(SETTLE, "a new leader", || {
        let (leader, _) = listed(&brokers[1])?;
        (leader > 0).then_some(leader)
    });
    let new_leader = &brokers[usize::try_from(leader / 1000).expect("a node")];
    assert_eq!(
        earliest(new_leader),
        offset,
        "the new leader's log start is the deleted offset"
    );
    // A DeleteRecords there at the same offset is answered with it once
    // the other live follower has fetched from the new leader (its log
    // start counts as unknown until then, as Kafka's new leader's does).
    assert_eq!(delete_records(new_leader, offset, 30_000), (0, offset));
    brokers[0].restart();
    common::wait_for(SETTLE, "the old leader back in the ISR", || {
        (listed(&brokers[1])? == (leader, vec![0, 1000, 2000])).then_some(())
    });
    assert_eq!(
        checkpointed_log_start(&brokers[0]),
        Some(offset),
        "the old leader's log start after its restart"
    );
}
