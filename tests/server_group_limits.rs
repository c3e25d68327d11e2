//! The group coordinator's limits, driven with raw requests against a real
//! broker: `group.max.size` (GROUP_MAX_SIZE_REACHED for a member beyond it,
//! never for a member rejoining), ids longer than the `__consumer_offsets`
//! records can hold (refused at the door, nothing written, the partitions
//! still load after a restart), and a `__consumer_offsets` partition whose
//! replay fails (its groups stay COORDINATOR_LOAD_IN_PROGRESS instead of
//! serving what was replayed before the bad record).

mod common;

use bytes::Bytes;
use common::groups::{classic_join, simple_commit};
use common::raw::RawClient;
use common::{Broker, BrokerOpts};
use fjord::metadata::internal::{coordinator_partition, CONSUMER_OFFSETS};
use fjord::record::{BatchBuilder, Compression};
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::txn_offset_commit_request::{
    TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
};
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, ApiKey, DescribeGroupsRequest, FindCoordinatorRequest, GroupId,
    InitProducerIdRequest, JoinGroupRequest, ListGroupsRequest, OffsetFetchRequest, ProducerId,
    RequestHeader, SyncGroupRequest, TopicName, TransactionalId, TxnOffsetCommitRequest,
};
use kafka_protocol::protocol::{Encodable, StrBytes};
use kafka_protocol::ResponseError;
use std::time::{Duration, Instant};

const TOPIC: &str = "limits";
/// How long a test waits for the coordinator's partitions to load.
const LOAD_TIMEOUT: Duration = Duration::from_secs(30);
/// One byte more than an i16-length string holds.
const TOO_LONG_BYTES: usize = i16::MAX as usize + 1;
/// JoinGroup v3: no member id round trip, answers parked until the join
/// phase ends. v6: the first flexible version (strings of any length).
const JOIN_V3: i16 = 3;
const JOIN_V5: i16 = 5;
const JOIN_FLEXIBLE_V6: i16 = 6;
const SYNC_FLEXIBLE_V4: i16 = 4;
const OFFSET_COMMIT_FLEXIBLE_V8: i16 = 8;
const OFFSET_FETCH_V5: i16 = 5;
const TXN_OFFSET_COMMIT_FLEXIBLE_V3: i16 = 3;
const ADD_OFFSETS_FLEXIBLE_V3: i16 = 3;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn code(e: ResponseError) -> i16 {
    e.code()
}

/// A one-core broker (every coordinator on port `broker.port`) with a
/// group.max.size of 2 and a 1 s initial rebalance delay.
fn limited_broker() -> Broker {
    Broker::start(
        BrokerOpts::default()
            .cores(1)
            .arg("--group-max-size")
            .arg("2")
            .arg("--group-initial-rebalance-delay-ms")
            .arg("1000"),
    )
}

/// Creates `__consumer_offsets` (FindCoordinator) and waits until every
/// partition of it is loaded (ListGroups answers NONE).
fn wait_loaded(raw: &mut RawClient) {
    let find = FindCoordinatorRequest::default().with_key(s("any"));
    let deadline = Instant::now() + LOAD_TIMEOUT;
    while raw.request(1, &find).error_code != 0 {
        assert!(Instant::now() < deadline, "FindCoordinator never answered");
        std::thread::sleep(Duration::from_millis(50));
    }
    while list_groups_error(raw) != 0 {
        assert!(
            Instant::now() < deadline,
            "the offsets partitions never loaded"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn list_groups_error(raw: &mut RawClient) -> i16 {
    raw.request(3, &ListGroupsRequest::default()).error_code
}

fn join_request(group: &str, member_id: &str) -> JoinGroupRequest {
    classic_join(group, member_id, Bytes::from_static(b"subscription"))
        .with_session_timeout_ms(10_000)
}

fn described_members(raw: &mut RawClient, group: &str) -> usize {
    let r = raw.request(
        1,
        &DescribeGroupsRequest::default().with_groups(vec![GroupId(s(group))]),
    );
    r.groups[0].members.len()
}

/// OffsetCommit v8 of `offset` for partition 0 of [`TOPIC`] by a simple
/// consumer (generation -1): the partition's error code.
fn commit(raw: &mut RawClient, group: &str, offset: i64) -> i16 {
    let req = simple_commit(group, TOPIC, 0, offset);
    raw.request(OFFSET_COMMIT_FLEXIBLE_V8, &req).topics[0].partitions[0].error_code
}

/// OffsetFetch v5 of partition 0 of [`TOPIC`]: (group error, offset).
fn fetch(raw: &mut RawClient, group: &str) -> (i16, i64) {
    let req = OffsetFetchRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_topics(Some(vec![OffsetFetchRequestTopic::default()
            .with_name(TopicName(s(TOPIC)))
            .with_partition_indexes(vec![0])]));
    let r = raw.request(OFFSET_FETCH_V5, &req);
    let offset = r
        .topics
        .first()
        .and_then(|t| t.partitions.first())
        .map_or(-1, |p| p.committed_offset);
    (r.error_code, offset)
}

#[test]
fn a_member_beyond_group_max_size_is_refused_and_members_may_rejoin() {
    let broker = limited_broker();
    let mut admin = RawClient::connect(broker.port);
    wait_loaded(&mut admin);
    let group = "full-group";
    let mut c1 = RawClient::connect(broker.port);
    let mut c2 = RawClient::connect(broker.port);
    let mut c3 = RawClient::connect(broker.port);
    // Two members join; their answers wait for the end of the join phase.
    let id1 = c1.send(JOIN_V3, &join_request(group, ""));
    let id2 = c2.send(JOIN_V3, &join_request(group, ""));
    let deadline = Instant::now() + LOAD_TIMEOUT;
    while described_members(&mut admin, group) < 2 {
        assert!(Instant::now() < deadline, "the two members never joined");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A third one is refused at once, with the unknown member id.
    let third = c3.request(JOIN_V3, &join_request(group, ""));
    assert_eq!(
        third.error_code,
        code(ResponseError::GroupMaxSizeReached),
        "a join beyond group.max.size"
    );
    assert_eq!(third.member_id.as_str(), "");
    let r1 = c1.receive::<JoinGroupRequest>(JOIN_V3, id1);
    let r2 = c2.receive::<JoinGroupRequest>(JOIN_V3, id2);
    assert_eq!((r1.error_code, r2.error_code), (0, 0));
    assert_eq!((r1.generation_id, r2.generation_id), (1, 1));
    assert_eq!(described_members(&mut admin, group), 2);
    // The group is full: a new member is refused before it would be handed
    // a member id (JoinGroup v4+ answers MEMBER_ID_REQUIRED otherwise).
    let fourth = c3.request(JOIN_V5, &join_request(group, ""));
    assert_eq!(fourth.error_code, code(ResponseError::GroupMaxSizeReached));
    // A member rejoining is not refused: same protocols, same generation.
    let again = c2.request(JOIN_V3, &join_request(group, r2.member_id.as_str()));
    assert_eq!(again.error_code, 0, "a member rejoining a full group");
    assert_eq!(again.generation_id, 1);
    assert_eq!(described_members(&mut admin, group), 2);
}

/// Sends `req` as JoinGroup `version` with `client_id` in the request
/// header (the raw client's own header has a short fixed one).
fn join_with_client_id(
    raw: &mut RawClient,
    version: i16,
    client_id: &str,
    req: &JoinGroupRequest,
) -> kafka_protocol::messages::JoinGroupResponse {
    const CORRELATION_ID: i32 = 7_000;
    let header = RequestHeader::default()
        .with_request_api_key(ApiKey::JoinGroup as i16)
        .with_request_api_version(version)
        .with_correlation_id(CORRELATION_ID)
        .with_client_id(Some(s(client_id)));
    let mut body = bytes::BytesMut::new();
    header
        .encode(&mut body, ApiKey::JoinGroup.request_header_version(version))
        .expect("encode header");
    req.encode(&mut body, version).expect("encode JoinGroup");
    raw.send_frame(&body);
    raw.receive::<JoinGroupRequest>(version, CORRELATION_ID)
}

#[test]
fn ids_longer_than_the_records_hold_are_refused_and_nothing_is_written() {
    let mut broker = limited_broker();
    common::client::create_topic(&broker.bootstrap(), TOPIC, 1, &[]);
    let mut raw = RawClient::connect(broker.port);
    wait_loaded(&mut raw);
    let long = "x".repeat(TOO_LONG_BYTES);
    let invalid_group = code(ResponseError::InvalidGroupId);
    let invalid_request = code(ResponseError::InvalidRequest);

    // JoinGroup: the group id, the instance id, the protocol type and name.
    let join =
        |raw: &mut RawClient, req: JoinGroupRequest| raw.request(JOIN_FLEXIBLE_V6, &req).error_code;
    assert_eq!(join(&mut raw, join_request(&long, "")), invalid_group);
    let with_instance = join_request("ids", "").with_group_instance_id(Some(s(&long)));
    assert_eq!(join(&mut raw, with_instance), invalid_request);
    let with_type = join_request("ids", "").with_protocol_type(s(&long));
    assert_eq!(join(&mut raw, with_type), invalid_request);
    let with_name =
        join_request("ids", "").with_protocols(vec![JoinGroupRequestProtocol::default()
            .with_name(s(&long))
            .with_metadata(Bytes::new())]);
    assert_eq!(join(&mut raw, with_name), invalid_request);
    // A member id nobody was given is unknown (and never written).
    assert_eq!(
        join(&mut raw, join_request("ids", &long)),
        code(ResponseError::UnknownMemberId)
    );
    // The member id a new member gets is its client id and a UUID: a
    // client id near the limit would make it too long.
    let near_limit = "c".repeat(i16::MAX as usize - 10);
    let r = join_with_client_id(
        &mut raw,
        JOIN_FLEXIBLE_V6,
        &near_limit,
        &join_request("ids", ""),
    );
    assert_eq!(r.error_code, invalid_request, "client id + UUID too long");

    // SyncGroup for such a group or member: no such member.
    let sync = SyncGroupRequest::default()
        .with_group_id(GroupId(s(&long)))
        .with_generation_id(1)
        .with_member_id(s(&long));
    assert_eq!(
        raw.request(SYNC_FLEXIBLE_V4, &sync).error_code,
        code(ResponseError::UnknownMemberId)
    );

    // OffsetCommit and TxnOffsetCommit with the group id.
    assert_eq!(commit(&mut raw, &long, 5), invalid_group);
    let txn_commit = TxnOffsetCommitRequest::default()
        .with_transactional_id(TransactionalId(s("ids-txn")))
        .with_group_id(GroupId(s(&long)))
        .with_producer_id(ProducerId(1))
        .with_producer_epoch(0)
        .with_generation_id(-1)
        .with_member_id(s(""))
        .with_topics(vec![TxnOffsetCommitRequestTopic::default()
            .with_name(TopicName(s(TOPIC)))
            .with_partitions(vec![TxnOffsetCommitRequestPartition::default()
                .with_partition_index(0)
                .with_committed_offset(5)
                .with_committed_leader_epoch(-1)])]);
    let r = raw.request(TXN_OFFSET_COMMIT_FLEXIBLE_V3, &txn_commit);
    assert_eq!(r.topics[0].partitions[0].error_code, invalid_group);

    // InitProducerId with a transactional id too long for its key.
    let init = InitProducerIdRequest::default()
        .with_transactional_id(Some(TransactionalId(s(&long))))
        .with_transaction_timeout_ms(60_000)
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    assert_eq!(raw.request(4, &init).error_code, invalid_request);
    // AddOffsetsToTxn writes neither id: an id no InitProducerId accepted
    // is unknown. (A valid InitProducerId first creates the transaction
    // state topic; its partitions then load.)
    let valid_init = init
        .clone()
        .with_transactional_id(Some(TransactionalId(s("ids-txn"))));
    let deadline = Instant::now() + LOAD_TIMEOUT;
    while raw.request(4, &valid_init).error_code != 0 {
        assert!(Instant::now() < deadline, "InitProducerId never succeeded");
        std::thread::sleep(Duration::from_millis(50));
    }
    let add_offsets = AddOffsetsToTxnRequest::default()
        .with_transactional_id(TransactionalId(s(&long)))
        .with_producer_id(ProducerId(1))
        .with_producer_epoch(0)
        .with_group_id(GroupId(s(&long)));
    let loading = code(ResponseError::CoordinatorLoadInProgress);
    let mut add_offsets_code = loading;
    while add_offsets_code == loading {
        assert!(
            Instant::now() < deadline,
            "the transaction state never loaded"
        );
        std::thread::sleep(Duration::from_millis(20));
        add_offsets_code = raw
            .request(ADD_OFFSETS_FLEXIBLE_V3, &add_offsets)
            .error_code;
    }
    assert_eq!(
        add_offsets_code,
        code(ResponseError::InvalidProducerIdMapping)
    );

    // A group within the limits works, and after a restart every offsets
    // partition replays: nothing unreadable was written.
    assert_eq!(commit(&mut raw, "ids", 9), 0);
    drop(raw);
    broker.restart();
    let mut raw = RawClient::connect(broker.port);
    wait_loaded(&mut raw);
    assert_eq!(fetch(&mut raw, "ids"), (0, 9));
}

/// The position where the last complete batch of `segment` ends, and the
/// offset the next batch takes.
fn log_end(segment: &[u8]) -> (usize, i64) {
    common::disk::batches(segment).last().map_or((0, 0), |b| {
        (
            b.position + b.header.total_size(),
            b.header.last_offset() + 1,
        )
    })
}

/// Appends, to the stopped broker's `topic`-`partition` log, one batch with
/// a valid CRC at the next offset holding `(key, value)`: log recovery keeps
/// it; only the coordinator that replays it can judge it.
pub fn append_record(broker: &Broker, topic: &str, partition: i32, key: &[u8], value: &[u8]) {
    let path = common::segment_path(&broker.data_dir(), topic, partition);
    let bytes = std::fs::read(&path).expect("read the segment");
    let (end, next_offset) = log_end(&bytes);
    let mut batch = BatchBuilder::new(Compression::None)
        .record(Some(key), Some(value), &[], 1_700_000_000_000)
        .build();
    // The base offset lies outside the CRC.
    batch[..8].copy_from_slice(&next_offset.to_be_bytes());
    let mut out = bytes[..end].to_vec();
    out.extend_from_slice(&batch);
    std::fs::write(&path, out).expect("write the segment");
}

/// A group id of `prefix-<n>` whose offsets partition differs from `other`'s.
fn group_in_another_partition(prefix: &str, other: &str) -> String {
    let p = coordinator_partition(other, 50);
    (0..1000)
        .map(|n| format!("{prefix}-{n}"))
        .find(|g| coordinator_partition(g, 50) != p)
        .expect("some group lands elsewhere")
}

#[test]
fn a_partition_whose_replay_fails_keeps_its_groups_loading() {
    let mut broker = limited_broker();
    common::client::create_topic(&broker.bootstrap(), TOPIC, 1, &[]);
    let mut raw = RawClient::connect(broker.port);
    wait_loaded(&mut raw);
    let group = "corrupt-group";
    let other = group_in_another_partition("healthy-group", group);
    assert_eq!(commit(&mut raw, group, 7), 0);
    assert_eq!(commit(&mut raw, &other, 3), 0);
    assert_eq!(fetch(&mut raw, group), (0, 7));
    drop(raw);
    broker.stop();

    // An OffsetCommit record for the group whose value is cut short: a
    // known record type that does not decode. (Replaying past it would
    // serve offset 7 as if nothing had been committed after it.)
    let key = fjord::group::records::offset_commit_key(group, TOPIC, 0).expect("key");
    let truncated_value = [0u8, 3, 0, 0, 0];
    append_record(
        &broker,
        CONSUMER_OFFSETS,
        coordinator_partition(group, 50),
        &key,
        &truncated_value,
    );
    broker.restart();

    let mut raw = RawClient::connect(broker.port);
    let loading = code(ResponseError::CoordinatorLoadInProgress);
    // The healthy partition loads; the other keeps answering "loading"
    // through several retries of its load.
    let deadline = Instant::now() + LOAD_TIMEOUT;
    while fetch(&mut raw, &other).0 != 0 {
        assert!(
            Instant::now() < deadline,
            "the healthy partition never loaded"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(fetch(&mut raw, &other), (0, 3));
    let held_until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < held_until {
        assert_eq!(fetch(&mut raw, group).0, loading, "OffsetFetch");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(list_groups_error(&mut raw), loading, "ListGroups");
    assert_eq!(
        raw.request(JOIN_V5, &join_request(group, "")).error_code,
        loading,
        "JoinGroup"
    );
    assert_eq!(
        commit(&mut raw, group, 8),
        loading,
        "OffsetCommit writes nothing"
    );
    // FindCoordinator names the coordinator, as Kafka's does whatever the
    // load state: the group APIs tell the client to wait.
    let find = raw.request(1, &FindCoordinatorRequest::default().with_key(s(group)));
    assert_eq!(find.error_code, 0);
    assert!(
        broker
            .stderr_tail()
            .contains("loading a __consumer_offsets partition failed"),
        "the failed load is logged"
    );
}
