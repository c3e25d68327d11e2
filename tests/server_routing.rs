//! Partition requests go straight to the owning shard: a Produce or Fetch
//! that reaches another shard gets NOT_LEADER_OR_FOLLOWER naming the right
//! leader (and its endpoint where the version has the field), and nothing is
//! written. Plus long poll: a parked Fetch returns once a produce arrives.

mod common;

use bytes::Bytes;
use common::client::{create_topic, partition_leaders};
use common::disk::batches;
use common::raw::{only_partition, produce_request, RawClient};
use common::{Broker, BrokerOpts};
use fjord::record::{decode_batch, BatchBuilder, Compression};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    FetchRequest, FetchResponse, MetadataRequest, ProduceRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use std::time::{Duration, Instant};

const TOPIC: &str = "routing";

fn batch(value: &str) -> Bytes {
    BatchBuilder::new(Compression::None)
        .record(Some(b"k"), Some(value.as_bytes()), &[], 1_700_000_000_000)
        .build()
        .freeze()
}

/// A 2-shard broker with a 2-partition topic; returns the broker and, for
/// partition 0, (leader node, the other node).
fn setup() -> (Broker, i32, i32) {
    let broker = Broker::start(BrokerOpts::default().cores(2));
    create_topic(&broker.bootstrap(), TOPIC, 2, &[]);
    let leaders = partition_leaders(&broker.bootstrap(), TOPIC);
    let leader = leaders[&0];
    assert!(leader == 0 || leader == 1);
    (broker, leader, 1 - leader)
}

/// The topic id, from a Metadata v12 request.
fn topic_id(client: &mut RawClient) -> uuid::Uuid {
    let req = MetadataRequest::default().with_topics(Some(vec![MetadataRequestTopic::default()
        .with_name(Some(TopicName(StrBytes::from_static_str(TOPIC))))]));
    let resp = client.request(12, &req);
    assert_eq!(resp.topics.len(), 1);
    assert_eq!(resp.topics[0].error_code, 0);
    assert!(!resp.topics[0].topic_id.is_nil());
    resp.topics[0].topic_id
}

fn fetch_request(version: i16, id: uuid::Uuid, partition: i32, max_wait_ms: i32) -> FetchRequest {
    let mut topic = FetchTopic::default().with_partitions(vec![FetchPartition::default()
        .with_partition(partition)
        .with_current_leader_epoch(-1)
        .with_fetch_offset(0)
        .with_last_fetched_epoch(-1)
        .with_log_start_offset(-1)
        .with_partition_max_bytes(1 << 20)]);
    if version >= 13 {
        topic = topic.with_topic_id(id);
    } else {
        topic = topic.with_topic(TopicName(StrBytes::from_static_str(TOPIC)));
    }
    let mut req = FetchRequest::default()
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(50 << 20)
        .with_isolation_level(0)
        .with_session_id(0)
        .with_session_epoch(-1)
        .with_topics(vec![topic]);
    if version < 15 {
        req = req.with_replica_id(kafka_protocol::messages::BrokerId(-1));
    }
    req
}

#[test]
fn produce_at_the_wrong_shard_is_not_leader_with_the_right_leader() {
    let (broker, leader, other) = setup();
    let mut wrong = RawClient::connect(broker.port_of(other as usize));
    for version in [3i16, 9, 10, 11] {
        let req = produce_request(TOPIC, 0, 1, batch("misrouted"));
        let resp = wrong.request::<ProduceRequest>(version, &req);
        let p = only_partition(&resp);
        assert_eq!(
            p.error_code,
            ResponseError::NotLeaderOrFollower.code(),
            "v{version}"
        );
        assert_eq!(p.base_offset, -1);
        if version >= 10 {
            assert_eq!(
                p.current_leader.leader_id.0, leader,
                "v{version} names the leader"
            );
            assert!(p.current_leader.leader_epoch >= 0);
            let ep: Vec<(i32, String, i32)> = resp
                .node_endpoints
                .iter()
                .map(|e| (e.node_id.0, e.host.to_string(), e.port))
                .collect();
            assert_eq!(
                ep,
                vec![(
                    leader,
                    "127.0.0.1".to_string(),
                    broker.port_of(leader as usize) as i32
                )],
                "v{version} carries the leader's endpoint"
            );
        }
    }
    assert!(
        batches(&broker.first_segment(TOPIC, 0)).is_empty(),
        "nothing written"
    );

    // The owner accepts the same batch.
    let mut right = RawClient::connect(broker.port_of(leader as usize));
    let resp = right.request::<ProduceRequest>(11, &produce_request(TOPIC, 0, 1, batch("routed")));
    let p = only_partition(&resp);
    assert_eq!((p.error_code, p.base_offset), (0, 0));
}

#[test]
fn fetch_at_the_wrong_shard_is_not_leader_with_the_right_leader() {
    let (broker, leader, other) = setup();
    let mut wrong = RawClient::connect(broker.port_of(other as usize));
    let id = topic_id(&mut wrong);
    for version in [4i16, 11, 12, 13, 15, 16] {
        let resp: FetchResponse = wrong.request(version, &fetch_request(version, id, 0, 0));
        assert_eq!(resp.responses.len(), 1);
        let p = &resp.responses[0].partitions[0];
        assert_eq!(p.partition_index, 0);
        assert_eq!(
            p.error_code,
            ResponseError::NotLeaderOrFollower.code(),
            "v{version}"
        );
        assert!(
            p.records.as_ref().is_none_or(|r| r.is_empty()),
            "no records"
        );
        if version >= 12 {
            assert_eq!(
                p.current_leader.leader_id.0, leader,
                "v{version} names the leader"
            );
        }
        if version >= 16 {
            let ep: Vec<(i32, i32)> = resp
                .node_endpoints
                .iter()
                .map(|e| (e.node_id.0, e.port))
                .collect();
            assert_eq!(
                ep,
                vec![(leader, broker.port_of(leader as usize) as i32)],
                "v16 endpoint"
            );
        }
    }
    // The owner answers the same fetch.
    let mut right = RawClient::connect(broker.port_of(leader as usize));
    let resp: FetchResponse = right.request(16, &fetch_request(16, id, 0, 0));
    assert_eq!(resp.responses[0].partitions[0].error_code, 0);
}

#[test]
fn long_poll_returns_when_a_produce_arrives() {
    let (broker, leader, _) = setup();
    let port = broker.port_of(leader as usize);
    let mut fetcher = RawClient::connect(port);
    let id = topic_id(&mut fetcher);
    // Long enough that a loaded CI machine still delivers the produce first.
    const MAX_WAIT_MS: i32 = 10_000;

    // Parked fetch, then a produce on another connection wakes it.
    let started = Instant::now();
    let correlation = fetcher.send(12, &fetch_request(12, id, 0, MAX_WAIT_MS));
    std::thread::sleep(Duration::from_millis(200));
    let mut producer = RawClient::connect(port);
    let resp =
        producer.request::<ProduceRequest>(9, &produce_request(TOPIC, 0, 1, batch("wake-up")));
    assert_eq!(only_partition(&resp).error_code, 0);
    let resp: FetchResponse = fetcher.receive::<FetchRequest>(12, correlation);
    let p = &resp.responses[0].partitions[0];
    assert_eq!(p.error_code, 0);
    assert_eq!(p.high_watermark, 1);
    let records = p.records.clone().expect("records in the response");
    let (header, recs) = decode_batch(&records).expect("a whole batch");
    assert_eq!(header.base_offset, 0);
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].value.as_deref(), Some(&b"wake-up"[..]));
    // Loose bound only: the fetch did not need to wait out much longer than max_wait.
    assert!(started.elapsed() < Duration::from_secs(20));

    // Nothing new: the fetch waits and returns empty, with no error.
    let resp: FetchResponse = {
        let mut req = fetch_request(12, id, 0, 300);
        req.topics[0].partitions[0].fetch_offset = 1;
        fetcher.request(12, &req)
    };
    let p = &resp.responses[0].partitions[0];
    assert_eq!(p.error_code, 0);
    assert!(
        p.records.as_ref().is_none_or(|r| r.is_empty()),
        "no data past the end"
    );
}
