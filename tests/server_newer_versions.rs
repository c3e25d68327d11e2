//! The newest versions of existing APIs that Kafka 4.4's clients send:
//! ListOffsets v9–10 (LATEST_TIERED_TIMESTAMP, the timeout field), Metadata
//! v13 (the top-level error code), DescribeCluster v2 (fenced brokers),
//! ListTransactions v2 (the transactional-id pattern) and DescribeGroups v6
//! (GROUP_ID_NOT_FOUND with a message), through the raw protocol. Runs against fjord, or against stock Kafka with
//! `FJORD_TEST_BROKER=kafka:HOST:PORT` (the differential run these
//! expectations were checked with).

mod common;

use common::client::create_topic;
use common::raw::{group_coordinator_port, produce_values, RawClient};
use common::target::Target;
use common::BrokerOpts;
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
    produce_values(&mut raw, &topic, 0, 3);

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

/// Every broker's port, from Metadata (fjord advertises each shard as a
/// broker; an admin client asks each for its transactions).
fn broker_ports(raw: &mut RawClient) -> Vec<u16> {
    let resp = raw.request(12, &MetadataRequest::default().with_topics(Some(vec![])));
    resp.brokers.iter().map(|b| b.port as u16).collect()
}

/// The transactional ids every broker lists with `pattern` (v2), or the
/// first error code.
fn list_ids(ports: &[u16], pattern: Option<&str>) -> Result<Vec<String>, i16> {
    use kafka_protocol::messages::ListTransactionsRequest;
    let mut ids = Vec::new();
    for &port in ports {
        let mut raw = RawClient::connect(port);
        let req = ListTransactionsRequest::default()
            .with_transactional_id_pattern(pattern.map(|p| StrBytes::from_string(p.to_string())));
        let resp = raw.request(2, &req);
        if resp.error_code != 0 {
            return Err(resp.error_code);
        }
        ids.extend(
            resp.transaction_states
                .iter()
                .map(|t| t.transactional_id.0.to_string()),
        );
    }
    ids.sort();
    Ok(ids)
}

/// ListTransactions v2 keeps the ids its pattern matches whole (RE2
/// syntax, as Kafka's `matches()`): a prefix alone matches nothing, null or
/// empty matches everything, and an invalid pattern is
/// INVALID_REGULAR_EXPRESSION (128). DescribeGroups v6 answers
/// GROUP_ID_NOT_FOUND (69) with Kafka's message for a missing group and
/// for a consumer (KIP-848) group, where v5 answered a Dead group with no
/// error.
#[test]
fn list_transactions_v2_pattern_and_describe_groups_v6_answer_as_kafka_does() {
    use kafka_protocol::messages::{ConsumerGroupHeartbeatRequest, DescribeGroupsRequest, GroupId};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use std::time::Duration;
    let target = Target::start(BrokerOpts::default().cores(2));
    let topic = target.name("txn-pattern");
    create_topic(&target.bootstrap(), &topic, 1, &[]);
    // Two open transactions.
    let ids: Vec<String> = ["txpat-alpha", "txpat-beta"]
        .iter()
        .map(|b| target.name(b))
        .collect();
    let producers: Vec<BaseProducer> = ids
        .iter()
        .map(|id| {
            let p: BaseProducer = common::client::base_config(&target.bootstrap())
                .set("transactional.id", id)
                .create()
                .expect("transactional producer");
            p.init_transactions(Duration::from_secs(30)).expect("init");
            p.begin_transaction().expect("begin");
            p.send(BaseRecord::<(), str>::to(&topic).payload("x"))
                .expect("send");
            p.flush(Duration::from_secs(30)).expect("flush");
            p
        })
        .collect();
    let mut raw = RawClient::connect(target.port());
    let ports = broker_ports(&mut raw);
    // Only this run's ids (an external broker keeps earlier runs').
    let ours = |r: Result<Vec<String>, i16>| {
        r.map(|all| {
            all.into_iter()
                .filter(|i| ids.contains(i))
                .collect::<Vec<_>>()
        })
    };
    let alpha_pattern = ids[0].replacen("alpha", "al.*", 1);
    assert_eq!(
        ours(list_ids(&ports, Some(&alpha_pattern))),
        Ok(vec![ids[0].clone()])
    );
    assert_eq!(
        ours(list_ids(&ports, Some("txpat-al"))),
        Ok(vec![]),
        "a prefix is not a match"
    );
    assert_eq!(ours(list_ids(&ports, Some(""))), Ok(ids.clone()));
    assert_eq!(ours(list_ids(&ports, None)), Ok(ids.clone()));
    assert_eq!(list_ids(&ports, Some("(unclosed")), Err(128));

    // DescribeGroups, at each group's coordinator.
    let describe = |group: &str, version: i16| {
        let mut coordinator = RawClient::connect(group_coordinator_port(target.port(), group));
        let resp = coordinator.request(
            version,
            &DescribeGroupsRequest::default()
                .with_groups(vec![GroupId(StrBytes::from_string(group.to_string()))]),
        );
        let g = &resp.groups[0];
        (
            g.error_code,
            g.error_message.as_ref().map(|m| m.to_string()),
            g.group_state.to_string(),
        )
    };
    let missing = target.name("dg-missing");
    assert_eq!(describe(&missing, 5), (0, None, "Dead".to_string()));
    assert_eq!(
        describe(&missing, 6),
        (
            69,
            Some(format!("Group {missing} not found.")),
            "Dead".to_string()
        )
    );
    // A consumer group, made by one ConsumerGroupHeartbeat.
    let consumer = target.name("dg-consumer");
    let mut coordinator = RawClient::connect(group_coordinator_port(target.port(), &consumer));
    let hb = coordinator.request(
        1,
        &ConsumerGroupHeartbeatRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(consumer.clone())))
            .with_member_id(StrBytes::from_static_str("m1"))
            .with_member_epoch(0)
            .with_rebalance_timeout_ms(30_000)
            .with_subscribed_topic_names(Some(vec![name(&topic)]))
            .with_topic_partitions(Some(vec![])),
    );
    assert_eq!(hb.error_code, 0);
    assert_eq!(describe(&consumer, 5), (0, None, "Dead".to_string()));
    assert_eq!(
        describe(&consumer, 6),
        (
            69,
            Some(format!("Group {consumer} is not a classic group.")),
            "Dead".to_string()
        )
    );
    for p in producers {
        p.abort_transaction(Duration::from_secs(30)).expect("abort");
    }
}
