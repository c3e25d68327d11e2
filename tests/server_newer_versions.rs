//! The newest versions of existing APIs that Kafka 4.4's clients send:
//! ListOffsets v9–10 (LATEST_TIERED_TIMESTAMP, the timeout field), Metadata
//! v13 (the top-level error code) and DescribeCluster v2 (fenced brokers),
//! through the raw protocol. Runs against fjord, or against stock Kafka with
//! `FJORD_TEST_BROKER=kafka:HOST:PORT` (the differential run these
//! expectations were checked with).

mod common;

use common::client::create_topic;
use common::raw::{only_partition, produce_request, RawClient};
use common::target::Target;
use common::BrokerOpts;
use fjord::record::{BatchBuilder, Compression};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, DescribeClusterRequest, ListOffsetsRequest, MetadataRequest,
    TopicName,
};
use kafka_protocol::protocol::StrBytes;

/// Kafka's LATEST_TIERED_TIMESTAMP (KIP-1005, ListOffsets v9).
const LATEST_TIERED_TIMESTAMP: i64 = -5;

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

/// (error, offset, timestamp, leader epoch) of a one-partition ListOffsets.
fn list(raw: &mut RawClient, version: i16, topic: &str, timestamp: i64) -> (i16, i64, i64, i32) {
    let req = ListOffsetsRequest::default()
        .with_replica_id((-1).into())
        .with_timeout_ms(30_000)
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(name(topic))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(0)
                .with_current_leader_epoch(-1)
                .with_timestamp(timestamp)])]);
    let resp = raw.request(version, &req);
    let p = &resp.topics[0].partitions[0];
    (p.error_code, p.offset, p.timestamp, p.leader_epoch)
}

#[test]
fn newest_versions_answer_as_kafka_does() {
    let target = Target::start(BrokerOpts::default().cores(1));
    let topic = target.name("newer-versions");
    create_topic(&target.bootstrap(), &topic, 1, &[]);
    let mut raw = RawClient::connect(target.port());
    for i in 0..3 {
        let batch = BatchBuilder::new(Compression::None)
            .record(
                None,
                Some(format!("v{i}").as_bytes()),
                &[],
                1_700_000_000_000,
            )
            .build()
            .freeze();
        let resp = raw.request(9, &produce_request(&topic, 0, 1, batch));
        assert_eq!(only_partition(&resp).error_code, 0);
    }

    let av = raw.request(
        3,
        &ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("fjord-test"))
            .with_client_software_version(StrBytes::from_static_str("1")),
    );
    let max = |key: ApiKey| {
        av.api_keys
            .iter()
            .find(|k| k.api_key == key as i16)
            .map(|k| k.max_version)
            .unwrap_or(-1)
    };
    assert!(max(ApiKey::ListOffsets) >= 10);
    assert!(max(ApiKey::Metadata) >= 13);
    assert!(max(ApiKey::DescribeCluster) >= 2);

    // The leader epoch the partition is in, from Metadata v13 (whose
    // top-level error code is NONE).
    let md = raw.request(
        13,
        &MetadataRequest::default().with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(name(&topic)))
        ])),
    );
    assert_eq!(md.error_code, 0);
    assert_eq!(md.topics.len(), 1);
    assert_eq!(md.topics[0].error_code, 0);
    let epoch = md.topics[0].partitions[0].leader_epoch;
    assert!(epoch >= 0);

    for version in [8, 9, 10] {
        assert_eq!(
            list(&mut raw, version, &topic, -1),
            (0, 3, -1, epoch),
            "latest, v{version}"
        );
        assert_eq!(
            list(&mut raw, version, &topic, -2),
            (0, 0, -1, epoch),
            "earliest, v{version}"
        );
    }
    // Without tiered storage nothing is tiered: offset and timestamp -1,
    // no epoch.
    for version in [9, 10] {
        assert_eq!(
            list(&mut raw, version, &topic, LATEST_TIERED_TIMESTAMP),
            (0, -1, -1, -1),
            "latest tiered, v{version}"
        );
    }

    // DescribeCluster v2: no broker is fenced, asked with or without them.
    for include_fenced in [false, true] {
        let resp = raw.request(
            2,
            &DescribeClusterRequest::default().with_include_fenced_brokers(include_fenced),
        );
        assert_eq!(resp.error_code, 0);
        assert!(!resp.brokers.is_empty());
        assert!(resp.brokers.iter().all(|b| !b.is_fenced));
    }
}
