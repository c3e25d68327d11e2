//! The last versions Kafka 4.4 added to APIs fjord serves, on the wire:
//! Produce v13 (topics by id, KIP-516), Fetch v17-18 (a follower's
//! directory id and high watermark, tagged), ListOffsets v11 (timestamp -6,
//! KIP-1023), ApiVersions v5 (the cluster and node the client means to
//! reach, KIP-1242), TxnOffsetCommit v6 (topics by id and new errors,
//! KIP-1319) and DeleteGroups v3 (a message per result). Produce and Fetch
//! are in `kafka-protocol`'s schemas and are sent with it; the others the
//! test encodes and decodes itself from Kafka 4.4's field lists, so it
//! does not reuse fjord's codecs (`src/protocol/hand_versions_more.rs`).
//!
//! Runs against fjord, or against stock Kafka with
//! `FJORD_TEST_BROKER=kafka:HOST:PORT` (the differential run these
//! expectations were checked with: Kafka 4.4.0, one combined node).

mod common;

use bytes::{BufMut, Bytes, BytesMut};
use common::client::create_topic;
use common::groups::consumer_heartbeat;
use common::raw::call_flexible as call;
use common::raw::{
    end_txn_v5, init_transactional, produce_values, wait_group_coordinator_port, RawClient,
};
use common::target::Target;
use common::BrokerOpts;
use fjord::protocol::wire::{
    put_array_len, put_empty_tagged_fields, put_nullable_string, put_string, Reader,
};
use fjord::record::{BatchBuilder, Compression};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, FetchRequest, FindCoordinatorRequest, GroupId,
    ListOffsetsResponse, MetadataRequest, OffsetFetchRequest, ProduceRequest, TopicName,
};
use kafka_protocol::protocol::{Decodable, StrBytes};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Kafka's error codes the tests name.
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const ILLEGAL_GENERATION: i16 = 22;
const INVALID_REQUEST: i16 = 42;
const GROUP_ID_NOT_FOUND: i16 = 69;
const UNKNOWN_TOPIC_ID: i16 = 100;
const STALE_MEMBER_EPOCH: i16 = 113;
const REBOOTSTRAP_REQUIRED: i16 = 129;
/// A topic id no broker has: Kafka's ids are random v4 UUIDs, so this
/// fixed, non-random one is never handed out.
const UNKNOWN_ID: [u8; 16] = [0x0f; 16];
/// How long a test waits for a coordinator or a committed transaction.
const WAIT: Duration = Duration::from_secs(30);

type TopicId = [u8; 16];

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

/// The topic id of `topic`, from Metadata v12 (asked again until the
/// broker's metadata has the topic: stock Kafka's lags its creation).
fn topic_id(raw: &mut RawClient, topic: &str) -> TopicId {
    let deadline = Instant::now() + WAIT;
    loop {
        let md = raw.request(
            12,
            &MetadataRequest::default().with_topics(Some(vec![
                MetadataRequestTopic::default().with_name(Some(TopicName(s(topic))))
            ])),
        );
        if md.topics[0].error_code == 0 {
            return *md.topics[0].topic_id.as_bytes();
        }
        assert!(Instant::now() < deadline, "{topic} has no metadata");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A transactional producer for `txn_id` at the broker at `port` (a
/// one-node target: the transaction coordinator is there), once the
/// coordinator answers; (producer id, epoch).
fn transactional(port: u16, txn_id: &str) -> (i64, i16) {
    let deadline = Instant::now() + WAIT * 4;
    // FindCoordinator first, as clients do: on stock Kafka it is what
    // creates `__transaction_state`.
    let mut raw = RawClient::connect(port);
    loop {
        let found = raw.request(
            4,
            &FindCoordinatorRequest::default()
                .with_key_type(1)
                .with_coordinator_keys(vec![s(txn_id)]),
        );
        if found.coordinators[0].error_code == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "no coordinator for {txn_id}");
        std::thread::sleep(Duration::from_millis(200));
    }
    loop {
        match init_transactional(&mut RawClient::connect(port), txn_id) {
            Ok(producer) => return producer,
            // Stock Kafka creates `__transaction_state` (50 partitions) on
            // the first look-up, which can take longer than one try.
            Err(e) if Instant::now() < deadline => {
                eprintln!("InitProducerId: error {e}; asking again");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("no transactional producer for {txn_id}: error {e}"),
        }
    }
}

/// One record batch of value `value`.
fn batch(value: &str) -> Bytes {
    BatchBuilder::new(Compression::None)
        .record(None, Some(value.as_bytes()), &[], 1_700_000_000_000)
        .build()
        .freeze()
}

/// Produce v13 names topics by id: a known id is appended to and answered
/// by that id, an id no topic has is UNKNOWN_TOPIC_ID on each of its
/// partitions, and a partition the topic does not have is
/// UNKNOWN_TOPIC_OR_PARTITION. Fetch v18, with the follower-only tagged
/// fields of v17 (directory id) and v18 (high watermark) set, reads what
/// was written, by topic id.
#[test]
fn produce_v13_and_fetch_v18_by_topic_id() {
    let target = Target::start(BrokerOpts::default().cores(1));
    let topic = target.name("kafka44-produce");
    create_topic(&target.bootstrap(), &topic, 1, &[]);
    let mut raw = RawClient::connect(target.port());
    let id = topic_id(&mut raw, &topic);
    produce_values(&mut raw, &topic, 0, 2);

    let part = |index: i32, value: &str| {
        PartitionProduceData::default()
            .with_index(index)
            .with_records(Some(batch(value)))
    };
    let req = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_topic_id(Uuid::from_bytes(id))
                .with_partition_data(vec![part(0, "by-id"), part(5, "nowhere")]),
            TopicProduceData::default()
                .with_topic_id(Uuid::from_bytes(UNKNOWN_ID))
                .with_partition_data(vec![part(0, "unknown")]),
        ]);
    let resp = raw.request(13, &req);
    let mut answers: Vec<(TopicId, i32, i16, i64)> = resp
        .responses
        .iter()
        .flat_map(|t| {
            assert_eq!(t.name.0.as_str(), "", "v13 names no topic");
            t.partition_responses
                .iter()
                .map(|p| (*t.topic_id.as_bytes(), p.index, p.error_code, p.base_offset))
        })
        .collect();
    answers.sort();
    let mut expected = vec![
        (id, 0, 0, 2),
        (id, 5, UNKNOWN_TOPIC_OR_PARTITION, -1),
        (UNKNOWN_ID, 0, UNKNOWN_TOPIC_ID, -1),
    ];
    expected.sort();
    assert_eq!(answers, expected);

    for version in [17, 18] {
        let fetch = FetchRequest::default()
            .with_max_wait_ms(0)
            .with_min_bytes(1)
            .with_max_bytes(1 << 20)
            .with_session_epoch(-1)
            .with_topics(vec![FetchTopic::default()
                .with_topic_id(Uuid::from_bytes(id))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(0)
                    .with_fetch_offset(2)
                    .with_partition_max_bytes(1 << 20)
                    .with_replica_directory_id(Uuid::from_bytes([7; 16]))
                    .with_high_watermark(if version >= 18 { 1 } else { i64::MAX })])]);
        let resp = raw.request(version, &fetch);
        assert_eq!(resp.error_code, 0, "v{version}");
        assert_eq!(resp.responses.len(), 1);
        assert_eq!(resp.responses[0].topic_id.as_bytes(), &id);
        let p = &resp.responses[0].partitions[0];
        assert_eq!((p.error_code, p.high_watermark), (0, 3), "v{version}");
        let records = p.records.clone().expect("records");
        let needle = b"by-id";
        assert!(
            records.windows(needle.len()).any(|w| w == needle),
            "v{version}: the batch produced by id is read back"
        );
    }
}

/// ListOffsets v11 (`bytes` of the request body, v10's layout) for one
/// partition: (error, timestamp, offset, leader epoch).
fn list_offsets_v11(raw: &mut RawClient, topic: &str, timestamp: i64) -> (i16, i64, i64, i32) {
    let mut b = BytesMut::new();
    b.put_i32(-1); // replica id
    b.put_i8(0); // read_uncommitted
    put_array_len(&mut b, 1, true);
    put_string(&mut b, topic, true);
    put_array_len(&mut b, 1, true);
    b.put_i32(0); // partition
    b.put_i32(-1); // current leader epoch
    b.put_i64(timestamp);
    put_empty_tagged_fields(&mut b);
    put_empty_tagged_fields(&mut b);
    b.put_i32(30_000); // timeout
    put_empty_tagged_fields(&mut b);
    let mut body = call(raw, ApiKey::ListOffsets, 11, &b);
    // v11's response is v10's field for field.
    let resp = ListOffsetsResponse::decode(&mut body, 10).unwrap();
    let p = &resp.topics[0].partitions[0];
    (p.error_code, p.timestamp, p.offset, p.leader_epoch)
}

/// ListOffsets v11 asks for the earliest offset not yet uploaded to tiered
/// storage (-6); without tiered storage Kafka answers -1 for offset,
/// timestamp and leader epoch, as it does for the latest tiered offset
/// (-5). The other special timestamps answer at v11 as before.
#[test]
fn list_offsets_v11_pending_upload_without_tiered_storage() {
    let target = Target::start(BrokerOpts::default().cores(1));
    let topic = target.name("kafka44-list-offsets");
    create_topic(&target.bootstrap(), &topic, 1, &[]);
    let mut raw = RawClient::connect(target.port());
    produce_values(&mut raw, &topic, 0, 3);
    assert_eq!(list_offsets_v11(&mut raw, &topic, -6), (0, -1, -1, -1));
    assert_eq!(list_offsets_v11(&mut raw, &topic, -5), (0, -1, -1, -1));
    let (error, ts, offset, _) = list_offsets_v11(&mut raw, &topic, -1);
    assert_eq!((error, ts, offset), (0, -1, 3));
    let (error, ts, offset, _) = list_offsets_v11(&mut raw, &topic, -2);
    assert_eq!((error, ts, offset), (0, -1, 0));
}

/// ApiVersions v5 of the broker at `port` with this cluster and node:
/// (error, ApiVersions' advertised maximum, number of api keys).
fn api_versions_v5(
    port: u16,
    name: &str,
    cluster: Option<&str>,
    node: i32,
) -> (i16, Option<i16>, usize) {
    let mut raw = RawClient::connect(port);
    let mut b = BytesMut::new();
    put_string(&mut b, name, true);
    put_string(&mut b, "4.4.0", true);
    put_nullable_string(&mut b, cluster, true);
    b.put_i32(node);
    put_empty_tagged_fields(&mut b);
    let mut body = call(&mut raw, ApiKey::ApiVersions, 5, &b);
    // v5's response is v4's field for field.
    let resp = ApiVersionsResponse::decode(&mut body, 4).unwrap();
    let own = resp
        .api_keys
        .iter()
        .find(|k| k.api_key == ApiKey::ApiVersions as i16)
        .map(|k| k.max_version);
    (resp.error_code, own, resp.api_keys.len())
}

/// ApiVersions v5 (KIP-1242): without a cluster and node, or with this
/// broker's, the full answer (ApiVersions up to v5); another node id or
/// another cluster id is REBOOTSTRAP_REQUIRED with no api keys; a cluster
/// id without a node id, or a node id without a cluster id, or a client
/// software name outside Kafka's pattern, is INVALID_REQUEST. On fjord,
/// each shard is its own node: the other shard's id at this shard's port
/// is a stale node.
#[test]
fn api_versions_v5_checks_the_cluster_and_node() {
    let target = Target::start(BrokerOpts::default().cores(2));
    let port = target.port();
    let mut raw = RawClient::connect(port);
    let md = raw.request(12, &MetadataRequest::default().with_topics(Some(vec![])));
    let cluster = md.cluster_id.expect("a cluster id").to_string();
    let node = md
        .brokers
        .iter()
        .find(|b| b.port as u16 == port)
        .expect("the broker at the bootstrap port")
        .node_id
        .0;
    let other = md
        .brokers
        .iter()
        .map(|b| b.node_id.0)
        .find(|&n| n != node)
        .unwrap_or(node + 1);

    let java = "apache-kafka-java";
    let (error, own, keys) = api_versions_v5(port, java, None, -1);
    assert_eq!((error, own), (0, Some(5)));
    assert!(keys > 30);
    let (error, own, _) = api_versions_v5(port, java, Some(&cluster), node);
    assert_eq!((error, own), (0, Some(5)));
    assert_eq!(
        api_versions_v5(port, java, Some(&cluster), other),
        (REBOOTSTRAP_REQUIRED, None, 0)
    );
    assert_eq!(
        api_versions_v5(port, java, Some("not-this-cluster"), node),
        (REBOOTSTRAP_REQUIRED, None, 0)
    );
    assert_eq!(
        api_versions_v5(port, java, Some(&cluster), -1),
        (INVALID_REQUEST, None, 0)
    );
    assert_eq!(
        api_versions_v5(port, java, None, node),
        (INVALID_REQUEST, None, 0)
    );
    assert_eq!(
        api_versions_v5(port, "bad name", None, -1),
        (INVALID_REQUEST, None, 0)
    );
}

/// A topic to commit: its id (v6), its name (v5) and (partition, offset)s.
type CommitTopic<'a> = (TopicId, &'a str, Vec<(i32, i64)>);

/// TxnOffsetCommit at `version` (5: topics by name, 6: by id) of `topics`
/// for `group`: the answer as (topic id, [(partition, error)]), sorted.
#[allow(clippy::too_many_arguments)]
fn txn_commit_v6(
    raw: &mut RawClient,
    version: i16,
    txn_id: &str,
    group: &str,
    producer: (i64, i16),
    member: (i32, &str),
    topics: &[CommitTopic],
) -> Vec<(TopicId, Vec<(i32, i16)>)> {
    let mut b = BytesMut::new();
    put_string(&mut b, txn_id, true);
    put_string(&mut b, group, true);
    b.put_i64(producer.0);
    b.put_i16(producer.1);
    b.put_i32(member.0);
    put_string(&mut b, member.1, true);
    put_nullable_string(&mut b, None, true);
    put_array_len(&mut b, topics.len(), true);
    for (id, name, partitions) in topics {
        if version >= 6 {
            b.put_slice(id);
        } else {
            put_string(&mut b, name, true);
        }
        put_array_len(&mut b, partitions.len(), true);
        for (p, offset) in partitions {
            b.put_i32(*p);
            b.put_i64(*offset);
            b.put_i32(-1); // leader epoch
            put_nullable_string(&mut b, None, true);
            put_empty_tagged_fields(&mut b);
        }
        put_empty_tagged_fields(&mut b);
    }
    put_empty_tagged_fields(&mut b);
    let body = call(raw, ApiKey::TxnOffsetCommit, version, &b);
    let mut r = Reader::new(&body);
    r.i32("throttle").unwrap();
    let n = count(&mut r, "topics");
    let mut out = Vec::new();
    for _ in 0..n {
        let id = if version >= 6 {
            uuid(&mut r)
        } else {
            let name = r.string(true, "name").unwrap();
            topics
                .iter()
                .find(|(_, n, _)| *n == name)
                .map(|(id, _, _)| *id)
                .expect("a topic of the request")
        };
        let np = count(&mut r, "partitions");
        let mut parts = Vec::new();
        for _ in 0..np {
            let p = r.i32("partition").unwrap();
            let e = r.i16("error").unwrap();
            r.skip_tagged_fields("partition").unwrap();
            parts.push((p, e));
        }
        r.skip_tagged_fields("topic").unwrap();
        parts.sort();
        out.push((id, parts));
    }
    out.sort();
    out
}

/// The committed offset of `topic` partition 0 for `group` (OffsetFetch
/// v9), -1 when none.
fn committed(raw: &mut RawClient, group: &str, topic: &str) -> i64 {
    let resp = raw.request(
        9,
        &OffsetFetchRequest::default().with_groups(vec![OffsetFetchRequestGroup::default()
            .with_group_id(GroupId(s(group)))
            .with_topics(Some(vec![OffsetFetchRequestTopics::default()
                .with_name(TopicName(s(topic)))
                .with_partition_indexes(vec![0])]))]),
    );
    resp.groups[0].topics[0].partitions[0].committed_offset
}

/// TxnOffsetCommit v6 (KIP-1319) names topics by id: a known id commits
/// (visible once the transaction commits), an id no topic has is
/// UNKNOWN_TOPIC_ID. A commit with a generation for a group that does not
/// exist is GROUP_ID_NOT_FOUND at v6 and, as before, ILLEGAL_GENERATION at
/// v5; one with a consumer-group member epoch above the member's is
/// STALE_MEMBER_EPOCH at v6 and ILLEGAL_GENERATION at v5.
#[test]
fn txn_offset_commit_v6_uses_topic_ids_and_v6_errors() {
    let target = Target::start(BrokerOpts::default().cores(1));
    let topic = target.name("kafka44-txn-commit");
    let group = target.name("kafka44-txn-group");
    let txn_id = target.name("kafka44-txn");
    create_topic(&target.bootstrap(), &topic, 1, &[]);
    let port = wait_group_coordinator_port(target.port(), &group, WAIT);
    let mut raw = RawClient::connect(port);
    let id = topic_id(&mut raw, &topic);
    let (pid, epoch) = transactional(port, &txn_id);

    let answer = txn_commit_v6(
        &mut raw,
        6,
        &txn_id,
        &group,
        (pid, epoch),
        (-1, ""),
        &[
            (id, &topic, vec![(0, 7)]),
            (UNKNOWN_ID, "", vec![(0, 1), (1, 1)]),
        ],
    );
    let mut expected = vec![
        (id, vec![(0, 0)]),
        (
            UNKNOWN_ID,
            vec![(0, UNKNOWN_TOPIC_ID), (1, UNKNOWN_TOPIC_ID)],
        ),
    ];
    expected.sort();
    assert_eq!(answer, expected);
    let (error, epoch) = end_txn_v5(&mut raw, &txn_id, pid, epoch, true);
    assert_eq!(error, 0);
    let deadline = Instant::now() + WAIT;
    while committed(&mut raw, &group, &topic) != 7 {
        assert!(Instant::now() < deadline, "the commit never became visible");
        std::thread::sleep(Duration::from_millis(50));
    }

    let missing = target.name("kafka44-no-such-group");
    for (version, error) in [(6, GROUP_ID_NOT_FOUND), (5, ILLEGAL_GENERATION)] {
        let answer = txn_commit_v6(
            &mut RawClient::connect(wait_group_coordinator_port(target.port(), &missing, WAIT)),
            version,
            &txn_id,
            &missing,
            (pid, epoch),
            (3, "member"),
            &[(id, &topic, vec![(0, 9)])],
        );
        assert_eq!(answer, vec![(id, vec![(0, error)])], "v{version}");
    }

    // A KIP-848 consumer-group member committing with an epoch above its
    // own: STALE_MEMBER_EPOCH at v6, ILLEGAL_GENERATION at v5.
    let consumers = target.name("kafka44-consumer-group");
    let mut coord =
        RawClient::connect(wait_group_coordinator_port(target.port(), &consumers, WAIT));
    let joined = coord.request(
        1,
        &consumer_heartbeat(&consumers, "kafka44-member", 0, Some(vec![&topic])),
    );
    assert_eq!(joined.error_code, 0);
    let member_epoch = joined.member_epoch;
    for (version, error) in [(6, STALE_MEMBER_EPOCH), (5, ILLEGAL_GENERATION)] {
        let answer = txn_commit_v6(
            &mut coord,
            version,
            &txn_id,
            &consumers,
            (pid, epoch),
            (member_epoch + 1, "kafka44-member"),
            &[(id, &topic, vec![(0, 9)])],
        );
        assert_eq!(answer, vec![(id, vec![(0, error)])], "v{version}");
    }
}

/// DeleteGroups v3 of `groups`: (group, error, message) per result.
fn delete_groups_v3(raw: &mut RawClient, groups: &[&str]) -> Vec<(String, i16, Option<String>)> {
    let mut b = BytesMut::new();
    put_array_len(&mut b, groups.len(), true);
    for g in groups {
        put_string(&mut b, g, true);
    }
    put_empty_tagged_fields(&mut b);
    let body = call(raw, ApiKey::DeleteGroups, 3, &b);
    let mut r = Reader::new(&body);
    r.i32("throttle").unwrap();
    let n = count(&mut r, "results");
    let mut out = Vec::new();
    for _ in 0..n {
        let g = r.string(true, "group").unwrap().to_string();
        let e = r.i16("error").unwrap();
        let m = r
            .nullable_string(true, "message")
            .unwrap()
            .map(String::from);
        r.skip_tagged_fields("result").unwrap();
        out.push((g, e, m));
    }
    r.skip_tagged_fields("response").unwrap();
    assert_eq!(r.remaining(), 0);
    out
}

/// DeleteGroups v3 answers each group with its error and a null message
/// (Kafka 4.4 fills the message only for streams groups): an empty group
/// is deleted, a missing one is GROUP_ID_NOT_FOUND.
#[test]
fn delete_groups_v3_answers_a_message_per_group() {
    let target = Target::start(BrokerOpts::default().cores(1));
    let topic = target.name("kafka44-delete");
    let group = target.name("kafka44-delete-group");
    let missing = target.name("kafka44-delete-missing");
    create_topic(&target.bootstrap(), &topic, 1, &[]);
    let port = wait_group_coordinator_port(target.port(), &group, WAIT);
    let mut raw = RawClient::connect(port);
    // A simple commit creates the (empty) group.
    let txn_id = target.name("kafka44-delete-txn");
    let (pid, epoch) = transactional(port, &txn_id);
    let id = topic_id(&mut raw, &topic);
    let answer = txn_commit_v6(
        &mut raw,
        6,
        &txn_id,
        &group,
        (pid, epoch),
        (-1, ""),
        &[(id, &topic, vec![(0, 1)])],
    );
    assert_eq!(answer, vec![(id, vec![(0, 0)])]);
    assert_eq!(end_txn_v5(&mut raw, &txn_id, pid, epoch, true).0, 0);
    let deadline = Instant::now() + WAIT;
    while committed(&mut raw, &group, &topic) != 1 {
        assert!(Instant::now() < deadline, "the commit never became visible");
        std::thread::sleep(Duration::from_millis(50));
    }

    let missing_port = wait_group_coordinator_port(target.port(), &missing, WAIT);
    assert_eq!(
        delete_groups_v3(&mut RawClient::connect(missing_port), &[&missing]),
        vec![(missing.clone(), GROUP_ID_NOT_FOUND, None)]
    );
    assert_eq!(
        delete_groups_v3(&mut raw, &[&group]),
        vec![(group.clone(), 0, None)]
    );
    assert_eq!(committed(&mut raw, &group, &topic), -1);
}
