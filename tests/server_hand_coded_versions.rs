//! The newest versions Kafka 4.4 serves of four APIs that the
//! `kafka-protocol` crate has no schema for, so fjord codes them by hand
//! (`src/protocol/newer.rs`): OffsetCommit v10 and OffsetFetch v10 (topic
//! ids instead of names), WriteTxnMarkers v2 (the transaction version of
//! each marker) and DescribeLogDirs v5 (`is_cordoned`). The test encodes
//! those requests and decodes the responses itself, from the field lists
//! Kafka 4.4's `kafka-clients` prints for these schemas, so it does not
//! reuse the codec under test.
//!
//! Runs against fjord, or against stock Kafka with
//! `FJORD_TEST_BROKER=kafka:HOST:PORT` (the differential run these
//! expectations were checked with).

mod common;

use bytes::{BufMut, BytesMut};
use common::client::create_topic;
use common::raw::call_flexible as call;
use common::raw::{produce_values, wait_group_coordinator_port, RawClient};
use common::target::Target;
use common::BrokerOpts;
use fjord::protocol::wire::{
    put_array_len, put_empty_tagged_fields, put_null_array, put_nullable_string, put_string, Reader,
};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, GroupId, MetadataRequest, OffsetCommitRequest, OffsetFetchRequest,
    TopicName,
};
use kafka_protocol::protocol::StrBytes;
use std::time::Duration;

/// Kafka's UNKNOWN_TOPIC_OR_PARTITION.
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
/// Kafka's GROUP_ID_NOT_FOUND.
const GROUP_ID_NOT_FOUND: i16 = 69;
/// Kafka's UNKNOWN_TOPIC_ID.
const UNKNOWN_TOPIC_ID: i16 = 100;
/// A topic id no broker has: Kafka's ids are random v4 UUIDs, so this
/// fixed, non-random one is never handed out.
const UNKNOWN_ID: [u8; 16] = [0x0f; 16];

/// How long a test waits for a group coordinator.
const COORDINATOR_TIMEOUT: Duration = Duration::from_secs(30);

type TopicId = [u8; 16];

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// Reads a compact array's element count (non-null).
fn count(r: &mut Reader, field: &'static str) -> usize {
    r.array_len(true, 1, field)
        .unwrap()
        .expect("a non-null array")
}

fn uuid(r: &mut Reader) -> TopicId {
    r.take(16, "topic id").unwrap().try_into().unwrap()
}

/// The topic id of `topic`, from Metadata v12.
fn topic_id(raw: &mut RawClient, topic: &str) -> TopicId {
    let md = raw.request(
        12,
        &MetadataRequest::default().with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(name(topic)))
        ])),
    );
    assert_eq!(md.topics[0].error_code, 0);
    *md.topics[0].topic_id.as_bytes()
}

/// One partition of an OffsetCommit: index, offset, metadata.
type Commit<'a> = (i32, i64, Option<&'a str>);

/// OffsetCommit v10 of `topics` for `group` as a simple (memberless)
/// committer; the answer as (topic id, [(partition, error)]), sorted.
fn commit_v10(
    raw: &mut RawClient,
    group: &str,
    topics: &[(TopicId, Vec<Commit>)],
) -> Vec<(TopicId, Vec<(i32, i16)>)> {
    commit_v10_as(raw, group, (-1, ""), topics)
}

/// [`commit_v10`] as member `member.1` at generation (or member epoch)
/// `member.0`.
fn commit_v10_as(
    raw: &mut RawClient,
    group: &str,
    member: (i32, &str),
    topics: &[(TopicId, Vec<Commit>)],
) -> Vec<(TopicId, Vec<(i32, i16)>)> {
    let mut b = BytesMut::new();
    put_string(&mut b, group, true);
    b.put_i32(member.0); // generation id or member epoch
    put_string(&mut b, member.1, true); // member id
    put_nullable_string(&mut b, None, true); // group instance id
    put_array_len(&mut b, topics.len(), true);
    for (id, partitions) in topics {
        b.put_slice(id);
        put_array_len(&mut b, partitions.len(), true);
        for &(p, offset, metadata) in partitions {
            b.put_i32(p);
            b.put_i64(offset);
            b.put_i32(-1); // committed leader epoch
            put_nullable_string(&mut b, metadata, true);
            put_empty_tagged_fields(&mut b);
        }
        put_empty_tagged_fields(&mut b);
    }
    put_empty_tagged_fields(&mut b);
    let resp = call(raw, ApiKey::OffsetCommit, 10, &b);
    let mut r = Reader::new(&resp);
    r.i32("throttle time").unwrap();
    let mut out = Vec::new();
    for _ in 0..count(&mut r, "topics") {
        let id = uuid(&mut r);
        let mut parts = Vec::new();
        for _ in 0..count(&mut r, "partitions") {
            parts.push((r.i32("partition").unwrap(), r.i16("error").unwrap()));
            r.skip_tagged_fields("partition").unwrap();
        }
        // Kafka lists the partitions it refused before the others.
        parts.sort();
        r.skip_tagged_fields("topic").unwrap();
        out.push((id, parts));
    }
    r.skip_tagged_fields("response").unwrap();
    assert_eq!(r.remaining(), 0, "OffsetCommit v10 has trailing bytes");
    // Kafka lists the topics it refused first when the group refuses the
    // rest, last when not; the order carries no meaning.
    out.sort();
    out
}

/// `v` sorted, to compare with [`commit_v10`]'s answers.
fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
    v.sort();
    v
}

/// One fetched partition: index, committed offset, metadata, error.
type Fetched = (i32, i64, Option<String>, i16);

/// OffsetFetch v10 of one group (`topics` None: all of them); the group's
/// error and its topics, in the broker's order.
fn fetch_v10(
    raw: &mut RawClient,
    group: &str,
    topics: Option<&[(TopicId, Vec<i32>)]>,
) -> (i16, Vec<(TopicId, Vec<Fetched>)>) {
    let mut b = BytesMut::new();
    put_array_len(&mut b, 1, true);
    put_string(&mut b, group, true);
    put_nullable_string(&mut b, None, true); // member id
    b.put_i32(-1); // member epoch
    match topics {
        None => put_null_array(&mut b, true),
        Some(ts) => {
            put_array_len(&mut b, ts.len(), true);
            for (id, partitions) in ts {
                b.put_slice(id);
                put_array_len(&mut b, partitions.len(), true);
                for &p in partitions {
                    b.put_i32(p);
                }
                put_empty_tagged_fields(&mut b);
            }
        }
    }
    put_empty_tagged_fields(&mut b); // group
    b.put_i8(0); // require stable
    put_empty_tagged_fields(&mut b);
    let resp = call(raw, ApiKey::OffsetFetch, 10, &b);
    let mut r = Reader::new(&resp);
    r.i32("throttle time").unwrap();
    assert_eq!(count(&mut r, "groups"), 1);
    assert_eq!(r.string(true, "group id").unwrap(), group);
    let mut out = Vec::new();
    for _ in 0..count(&mut r, "topics") {
        let id = uuid(&mut r);
        let mut parts = Vec::new();
        for _ in 0..count(&mut r, "partitions") {
            let p = r.i32("partition").unwrap();
            let offset = r.i64("offset").unwrap();
            r.i32("leader epoch").unwrap();
            let metadata = r
                .nullable_string(true, "metadata")
                .unwrap()
                .map(String::from);
            let error = r.i16("error").unwrap();
            r.skip_tagged_fields("partition").unwrap();
            parts.push((p, offset, metadata, error));
        }
        r.skip_tagged_fields("topic").unwrap();
        out.push((id, parts));
    }
    let error = r.i16("group error").unwrap();
    r.skip_tagged_fields("group").unwrap();
    r.skip_tagged_fields("response").unwrap();
    assert_eq!(r.remaining(), 0, "OffsetFetch v10 has trailing bytes");
    (error, out)
}

/// The highest version of `key` the broker advertises.
fn advertised_max(raw: &mut RawClient, key: ApiKey) -> i16 {
    let av = raw.request(
        3,
        &ApiVersionsRequest::default()
            .with_client_software_name(s("fjord-test"))
            .with_client_software_version(s("1")),
    );
    av.api_keys
        .iter()
        .find(|k| k.api_key == key as i16)
        .map(|k| k.max_version)
        .unwrap_or(-1)
}

/// OffsetCommit v10 and OffsetFetch v10 name topics by id. An id the
/// broker does not know is UNKNOWN_TOPIC_ID (100) on each of its
/// partitions, a known id with a partition it does not have is
/// UNKNOWN_TOPIC_OR_PARTITION (3), an unknown id stays UNKNOWN_TOPIC_ID
/// when the group refuses the commit (GROUP_ID_NOT_FOUND, 69, on the known
/// topic), and what v10 commits is what v9 fetches and the reverse: one
/// group's offsets, whichever version wrote them.
#[test]
fn offset_commit_and_fetch_v10_use_topic_ids_and_share_offsets_with_v9() {
    let target = Target::start(BrokerOpts::default().cores(2));
    let topic = target.name("offsets-by-id");
    let group = target.name("offsets-by-id-group");
    create_topic(&target.bootstrap(), &topic, 2, &[]);
    let mut raw = RawClient::connect(target.port());
    assert_eq!(advertised_max(&mut raw, ApiKey::OffsetCommit), 10);
    assert_eq!(advertised_max(&mut raw, ApiKey::OffsetFetch), 10);
    let id = topic_id(&mut raw, &topic);
    let mut coord = RawClient::connect(wait_group_coordinator_port(
        target.port(),
        &group,
        COORDINATOR_TIMEOUT,
    ));

    // v10 commit: partition 0 of the topic, a partition it does not have,
    // and an unknown topic id.
    let answer = commit_v10(
        &mut coord,
        &group,
        &[
            (id, vec![(0, 5, Some("m10")), (2, 9, None)]),
            (UNKNOWN_ID, vec![(0, 1, None)]),
        ],
    );
    assert_eq!(
        answer,
        sorted(vec![
            (id, vec![(0, 0), (2, UNKNOWN_TOPIC_OR_PARTITION)]),
            (UNKNOWN_ID, vec![(0, UNKNOWN_TOPIC_ID)]),
        ])
    );

    // v9 sees it by name, and commits partition 1.
    let fetch_v9 = |coord: &mut RawClient| {
        let resp = coord.request(
            9,
            &OffsetFetchRequest::default().with_groups(vec![OffsetFetchRequestGroup::default()
                .with_group_id(GroupId(s(&group)))
                .with_topics(Some(vec![OffsetFetchRequestTopics::default()
                    .with_name(name(&topic))
                    .with_partition_indexes(vec![0, 1])]))]),
        );
        assert_eq!(resp.groups[0].error_code, 0);
        resp.groups[0].topics[0]
            .partitions
            .iter()
            .map(|p| {
                (
                    p.partition_index,
                    p.committed_offset,
                    p.metadata.as_ref().map(|m| m.to_string()),
                    p.error_code,
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        fetch_v9(&mut coord),
        vec![
            (0, 5, Some("m10".into()), 0),
            (1, -1, Some(String::new()), 0)
        ]
    );
    let v9 = coord.request(
        9,
        &OffsetCommitRequest::default()
            .with_group_id(GroupId(s(&group)))
            .with_generation_id_or_member_epoch(-1)
            .with_topics(vec![OffsetCommitRequestTopic::default()
                .with_name(name(&topic))
                .with_partitions(vec![OffsetCommitRequestPartition::default()
                    .with_partition_index(1)
                    .with_committed_offset(7)
                    .with_committed_metadata(Some(s("m9")))])]),
    );
    assert_eq!(v9.topics[0].partitions[0].error_code, 0);

    // v10 fetches both by id; an unknown id is UNKNOWN_TOPIC_ID.
    let (error, topics) = fetch_v10(
        &mut coord,
        &group,
        Some(&[(id, vec![0, 1]), (UNKNOWN_ID, vec![0])]),
    );
    assert_eq!(error, 0);
    assert_eq!(
        topics,
        vec![
            (
                id,
                vec![(0, 5, Some("m10".into()), 0), (1, 7, Some("m9".into()), 0)]
            ),
            (
                UNKNOWN_ID,
                vec![(0, -1, Some(String::new()), UNKNOWN_TOPIC_ID)]
            ),
        ]
    );
    // All of the group's topics, by id.
    let (error, topics) = fetch_v10(&mut coord, &group, None);
    assert_eq!(error, 0);
    assert_eq!(
        topics,
        vec![(
            id,
            vec![(0, 5, Some("m10".into()), 0), (1, 7, Some("m9".into()), 0)]
        )]
    );
    // A member of a group that does not exist: the group's error on the
    // known topic, UNKNOWN_TOPIC_ID still on the unknown one.
    let answer = commit_v10_as(
        &mut coord,
        &target.name("offsets-by-id-no-such-group"),
        (3, "no-such-member"),
        &[(id, vec![(0, 1, None)]), (UNKNOWN_ID, vec![(0, 1, None)])],
    );
    assert_eq!(
        answer,
        sorted(vec![
            (id, vec![(0, GROUP_ID_NOT_FOUND)]),
            (UNKNOWN_ID, vec![(0, UNKNOWN_TOPIC_ID)]),
        ])
    );
    // A v10 commit overwrites what v9 committed.
    let answer = commit_v10(&mut coord, &group, &[(id, vec![(1, 8, None)])]);
    assert_eq!(answer, vec![(id, vec![(1, 0)])]);
    assert_eq!(
        fetch_v9(&mut coord),
        vec![
            (0, 5, Some("m10".into()), 0),
            (1, 8, Some(String::new()), 0)
        ]
    );
}

/// A compact array of one topic entry, up to its partition indexes:
/// the topic's name, then `partitions` (INT32 each). The caller writes the
/// entry's tagged fields.
fn put_one_topic(b: &mut BytesMut, topic: &str, partitions: &[i32]) {
    put_array_len(b, 1, true);
    put_string(b, topic, true);
    put_array_len(b, partitions.len(), true);
    for &p in partitions {
        b.put_i32(p);
    }
}

/// WriteTxnMarkers v2 for `partitions` of `topic` (producer 7, epoch 0,
/// COMMIT, transaction version 2); the (partition, error) answers. A
/// `truncate` of n bytes cuts the request body short by that much.
fn write_txn_markers_v2(
    raw: &mut RawClient,
    topic: &str,
    partitions: &[i32],
    truncate: usize,
) -> Option<Vec<(i32, i16)>> {
    let mut b = BytesMut::new();
    put_array_len(&mut b, 1, true);
    b.put_i64(7); // producer id
    b.put_i16(0); // producer epoch
    b.put_i8(1); // transaction result: COMMIT
    put_one_topic(&mut b, topic, partitions);
    put_empty_tagged_fields(&mut b); // topic
    b.put_i32(0); // coordinator epoch
    b.put_i8(2); // transaction version
    put_empty_tagged_fields(&mut b); // marker
    put_empty_tagged_fields(&mut b);
    if truncate > 0 {
        b.truncate(b.len() - truncate);
        let mut frame = BytesMut::new();
        frame.put_i16(ApiKey::WriteTxnMarkers as i16);
        frame.put_i16(2);
        frame.put_i32(1);
        put_nullable_string(&mut frame, Some("fjord-itest-hand"), false);
        put_empty_tagged_fields(&mut frame);
        frame.put_slice(&b);
        raw.send_frame(&frame);
        raw.assert_closed(Duration::from_secs(15), "a truncated WriteTxnMarkers v2");
        return None;
    }
    let resp = call(raw, ApiKey::WriteTxnMarkers, 2, &b);
    let mut r = Reader::new(&resp);
    assert_eq!(count(&mut r, "markers"), 1);
    assert_eq!(r.i64("producer id").unwrap(), 7);
    assert_eq!(count(&mut r, "topics"), 1);
    assert_eq!(r.string(true, "topic").unwrap(), topic);
    let mut out = Vec::new();
    for _ in 0..count(&mut r, "partitions") {
        out.push((r.i32("partition").unwrap(), r.i16("error").unwrap()));
        r.skip_tagged_fields("partition").unwrap();
    }
    r.skip_tagged_fields("topic").unwrap();
    r.skip_tagged_fields("marker").unwrap();
    r.skip_tagged_fields("response").unwrap();
    assert_eq!(r.remaining(), 0, "WriteTxnMarkers v2 has trailing bytes");
    out.sort();
    Some(out)
}

/// One DescribeLogDirs v5 result: error, total bytes, usable bytes,
/// is_cordoned, and (topic, partition, size) of every partition in it.
type LogDir = (i16, i64, i64, bool, Vec<(String, i32, i64)>);

/// DescribeLogDirs v5 of partitions `partitions` of `topic`: the top-level
/// error and every log directory.
fn describe_log_dirs_v5(
    raw: &mut RawClient,
    topic: &str,
    partitions: &[i32],
) -> (i16, Vec<LogDir>) {
    let mut b = BytesMut::new();
    put_one_topic(&mut b, topic, partitions);
    put_empty_tagged_fields(&mut b); // topic
    put_empty_tagged_fields(&mut b);
    let resp = call(raw, ApiKey::DescribeLogDirs, 5, &b);
    let mut r = Reader::new(&resp);
    r.i32("throttle time").unwrap();
    let error = r.i16("error").unwrap();
    let mut dirs = Vec::new();
    for _ in 0..count(&mut r, "results") {
        let dir_error = r.i16("dir error").unwrap();
        r.string(true, "log dir").unwrap();
        let mut parts = Vec::new();
        for _ in 0..count(&mut r, "topics") {
            let name = r.string(true, "topic").unwrap().to_string();
            for _ in 0..count(&mut r, "partitions") {
                let p = r.i32("partition").unwrap();
                let size = r.i64("size").unwrap();
                r.i64("offset lag").unwrap();
                r.i8("is future").unwrap();
                r.skip_tagged_fields("partition").unwrap();
                parts.push((name.clone(), p, size));
            }
            r.skip_tagged_fields("topic").unwrap();
        }
        let total = r.i64("total bytes").unwrap();
        let usable = r.i64("usable bytes").unwrap();
        let cordoned = match r.i8("is cordoned").unwrap() {
            0 => false,
            1 => true,
            other => panic!("is_cordoned is a boolean, not {other}"),
        };
        r.skip_tagged_fields("result").unwrap();
        dirs.push((dir_error, total, usable, cordoned, parts));
    }
    r.skip_tagged_fields("response").unwrap();
    assert_eq!(r.remaining(), 0, "DescribeLogDirs v5 has trailing bytes");
    (error, dirs)
}

/// DescribeLogDirs v5 answers v4's fields and `is_cordoned` per log
/// directory (KIP-1066), false here: a single log directory that takes new
/// partitions. WriteTxnMarkers v2 reads the transaction version of each
/// marker (a v1 body sent as v2 lacks it and closes the connection, as an
/// unparsable request does on Kafka), and, with no authorizer, writes the
/// markers as stock Kafka does (every caller has CLUSTER_ACTION).
#[test]
fn describe_log_dirs_v5_and_write_txn_markers_v2() {
    let target = Target::start(BrokerOpts::default().cores(1));
    let topic = target.name("log-dirs-v5");
    create_topic(&target.bootstrap(), &topic, 2, &[]);
    let mut raw = RawClient::connect(target.port());
    assert_eq!(advertised_max(&mut raw, ApiKey::DescribeLogDirs), 5);
    assert_eq!(advertised_max(&mut raw, ApiKey::WriteTxnMarkers), 2);
    produce_values(&mut raw, &topic, 0, 3);

    let (error, dirs) = describe_log_dirs_v5(&mut raw, &topic, &[0]);
    assert_eq!(error, 0);
    assert_eq!(dirs.len(), 1, "one log directory: {dirs:?}");
    let (dir_error, total, usable, cordoned, parts) = &dirs[0];
    assert_eq!(*dir_error, 0);
    assert!(
        *total > 0 && (0..=*total).contains(usable),
        "{total} {usable}"
    );
    assert!(!cordoned);
    assert_eq!(parts.len(), 1, "only the partition asked for: {parts:?}");
    assert_eq!((parts[0].0.as_str(), parts[0].1), (topic.as_str(), 0));
    assert!(parts[0].2 > 0, "partition 0 holds three records");

    let answer = write_txn_markers_v2(&mut raw, &topic, &[0, 1], 0).expect("an answer");
    assert_eq!(
        answer.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
        vec![0, 1]
    );
    eprintln!(
        "WriteTxnMarkers v2 answered {answer:?} ({})",
        target.label()
    );
    // Without an authorizer every caller has CLUSTER_ACTION: written.
    assert_eq!(answer, vec![(0, 0), (1, 0)]);
    // The same body without its transaction version and tagged fields.
    write_txn_markers_v2(&mut raw, &topic, &[0, 1], 3);
}

/// Sends `body` as `api_key` v`version` and asserts the broker closes the
/// connection, as Kafka does for a request it cannot parse.
fn assert_refused(port: u16, api_key: ApiKey, version: i16, body: &[u8], what: &str) {
    let mut raw = RawClient::connect(port);
    let mut frame = BytesMut::new();
    frame.put_i16(api_key as i16);
    frame.put_i16(version);
    frame.put_i32(1);
    put_nullable_string(&mut frame, Some("fjord-itest-hand"), false);
    put_empty_tagged_fields(&mut frame);
    frame.put_slice(body);
    raw.send_frame(&frame);
    raw.assert_closed(Duration::from_secs(15), what);
}

/// Truncated and hostile OffsetCommit v10 / OffsetFetch v10 bodies close
/// the connection (and only it: the broker answers the next one).
#[test]
fn malformed_v10_offset_requests_close_the_connection() {
    let target = Target::start(BrokerOpts::default().cores(1));
    let group = target.name("malformed-v10");
    let port = wait_group_coordinator_port(target.port(), &group, COORDINATOR_TIMEOUT);
    // OffsetCommit v10 cut inside its topic id.
    let mut commit = BytesMut::new();
    put_string(&mut commit, &group, true);
    commit.put_i32(-1);
    put_string(&mut commit, "", true);
    put_nullable_string(&mut commit, None, true);
    put_array_len(&mut commit, 1, true);
    commit.put_slice(&UNKNOWN_ID[..8]);
    assert_refused(
        port,
        ApiKey::OffsetCommit,
        10,
        &commit,
        "a truncated OffsetCommit v10",
    );
    // OffsetFetch v10 claiming 2^31 - 1 groups in a few bytes.
    let fetch = [0x80, 0x80, 0x80, 0x80, 0x08, 0x00];
    assert_refused(
        port,
        ApiKey::OffsetFetch,
        10,
        &fetch,
        "OffsetFetch v10 with a huge count",
    );
    // The broker still answers.
    let mut raw = RawClient::connect(port);
    let (error, topics) = fetch_v10(&mut raw, &group, None);
    assert_eq!((error, topics), (0, vec![]));
}
