//! DescribeTopicPartitions (API key 75) through the raw protocol: paging
//! with `response_partition_limit` and the cursor, unknown and invalid
//! topics, a cursor outside the named topics, listing every topic, and the
//! partition fields against what Metadata reports. Runs against fjord, or
//! against stock Kafka with `FJORD_TEST_BROKER=kafka:HOST:PORT` (the
//! differential run these expectations were checked with, Kafka 4.4.0).
//!
//! Also: what ApiVersions advertises for the client-telemetry APIs (71, 72),
//! which stock Kafka 4.4 leaves out without a metrics plugin.

mod common;

use common::client::create_topic;
use common::raw::RawClient;
use common::target::Target;
use common::BrokerOpts;
use kafka_protocol::messages::describe_topic_partitions_request::{Cursor, TopicRequest};
use kafka_protocol::messages::describe_topic_partitions_response::DescribeTopicPartitionsResponseTopic;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse,
    MetadataRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

fn describe(
    raw: &mut RawClient,
    topics: &[&str],
    limit: i32,
    cursor: Option<(&str, i32)>,
) -> DescribeTopicPartitionsResponse {
    let req = DescribeTopicPartitionsRequest::default()
        .with_topics(
            topics
                .iter()
                .map(|t| TopicRequest::default().with_name(name(t)))
                .collect(),
        )
        .with_response_partition_limit(limit)
        .with_cursor(cursor.map(|(t, p)| {
            Cursor::default()
                .with_topic_name(name(t))
                .with_partition_index(p)
        }));
    raw.request(0, &req)
}

/// (topic, error, partition indexes) of each topic answered, in order.
fn listing(resp: &DescribeTopicPartitionsResponse) -> Vec<(String, i16, Vec<i32>)> {
    resp.topics
        .iter()
        .map(|t| {
            (
                t.name.as_ref().map(|n| n.0.to_string()).unwrap_or_default(),
                t.error_code,
                t.partitions.iter().map(|p| p.partition_index).collect(),
            )
        })
        .collect()
}

fn cursor(resp: &DescribeTopicPartitionsResponse) -> Option<(String, i32)> {
    resp.next_cursor
        .as_ref()
        .map(|c| (c.topic_name.0.to_string(), c.partition_index))
}

fn ok(topic: &str, partitions: &[i32]) -> (String, i16, Vec<i32>) {
    (topic.to_string(), 0, partitions.to_vec())
}

/// Checks a described topic's fields against Metadata v12's answer.
fn check_against_metadata(raw: &mut RawClient, t: &DescribeTopicPartitionsResponseTopic) {
    let topic = t.name.as_ref().expect("a name").0.to_string();
    let md = raw.request(
        12,
        &MetadataRequest::default().with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(name(&topic)))
        ])),
    );
    let m = &md.topics[0];
    assert_eq!(t.topic_id, m.topic_id, "{topic}: the topic id");
    assert!(!t.topic_id.is_nil());
    assert!(!t.is_internal);
    for p in &t.partitions {
        let mp = &m.partitions[p.partition_index as usize];
        assert_eq!(p.error_code, 0);
        assert_eq!(p.leader_id, mp.leader_id, "{topic}-{}", p.partition_index);
        assert_eq!(p.leader_epoch, mp.leader_epoch);
        assert_eq!(p.replica_nodes, vec![p.leader_id]);
        assert_eq!(p.isr_nodes, vec![p.leader_id]);
        assert_eq!(p.eligible_leader_replicas.as_deref(), Some(&[][..]));
        assert_eq!(p.last_known_elr.as_deref(), Some(&[][..]));
        assert!(p.offline_replicas.is_empty());
    }
    // Every topic operation, as Kafka allows them without an authorizer:
    // READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, DESCRIBE_CONFIGS,
    // ALTER_CONFIGS.
    assert_eq!(t.topic_authorized_operations, 3576, "{topic}");
}

#[test]
fn pages_through_topics_and_partitions_as_kafka_does() {
    let target = Target::start(BrokerOpts::default().cores(2));
    let prefix = target.name("dtp");
    let (a, b, c) = (
        format!("{prefix}-a"),
        format!("{prefix}-b"),
        format!("{prefix}-c"),
    );
    let (a, b, c) = (a.as_str(), b.as_str(), c.as_str());
    create_topic(&target.bootstrap(), a, 3, &[]);
    create_topic(&target.bootstrap(), b, 2, &[]);
    create_topic(&target.bootstrap(), c, 1, &[]);
    let mut raw = RawClient::connect(target.port());

    // (Kafka answers INVALID_REQUEST to an empty client software name.)
    let av = raw.request(
        3,
        &ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("fjord-test"))
            .with_client_software_version(StrBytes::from_static_str("1")),
    );
    assert_eq!(av.error_code, 0);
    let range = |key: ApiKey| {
        av.api_keys
            .iter()
            .find(|k| k.api_key == key as i16)
            .map(|k| (k.min_version, k.max_version))
    };
    assert_eq!(range(ApiKey::DescribeTopicPartitions), Some((0, 0)));
    // Stock Kafka 4.4 advertises neither telemetry API unless a metrics
    // plugin (a ClientTelemetry reporter) is configured; fjord has none.
    assert_eq!(range(ApiKey::GetTelemetrySubscriptions), None);
    assert_eq!(range(ApiKey::PushTelemetry), None);

    // Named out of order and twice: answered once each, sorted by name.
    // Everything fits.
    let resp = describe(&mut raw, &[c, a, b, a], 100, None);
    assert_eq!(
        listing(&resp),
        vec![ok(a, &[0, 1, 2]), ok(b, &[0, 1]), ok(c, &[0])]
    );
    assert_eq!(cursor(&resp), None);
    for t in &resp.topics {
        check_against_metadata(&mut raw, t);
    }

    // A limit of 4 ends inside b: the cursor names b's first partition
    // left out; the next page starts there.
    let resp = describe(&mut raw, &[a, b, c], 4, None);
    assert_eq!(listing(&resp), vec![ok(a, &[0, 1, 2]), ok(b, &[0])]);
    assert_eq!(cursor(&resp), Some((b.to_string(), 1)));
    let resp = describe(&mut raw, &[a, b, c], 4, Some((b, 1)));
    assert_eq!(listing(&resp), vec![ok(b, &[1]), ok(c, &[0])]);
    assert_eq!(cursor(&resp), None);

    // A limit used up exactly at the end of a: the cursor is b's
    // partition 0, and b is not listed.
    let resp = describe(&mut raw, &[a, b], 3, None);
    assert_eq!(listing(&resp), vec![ok(a, &[0, 1, 2])]);
    assert_eq!(cursor(&resp), Some((b.to_string(), 0)));

    // A cursor past a topic's last partition lists the topic empty.
    let resp = describe(&mut raw, &[b, c], 10, Some((b, 5)));
    assert_eq!(listing(&resp), vec![ok(b, &[]), ok(c, &[0])]);
    assert_eq!(cursor(&resp), None);

    // Unknown and invalid names, in name order, cost no partition.
    let missing = format!("{prefix}-bb");
    let resp = describe(&mut raw, &["bad name!", &missing, a], 4, None);
    assert_eq!(
        listing(&resp),
        vec![
            (
                "bad name!".to_string(),
                ResponseError::InvalidTopicException.code(),
                vec![]
            ),
            ok(a, &[0, 1, 2]),
            (
                missing.clone(),
                ResponseError::UnknownTopicOrPartition.code(),
                vec![]
            ),
        ]
    );
    assert!(resp.topics[2].topic_id.is_nil());
    assert_eq!(cursor(&resp), None);
    // With the limit used up, even an unknown topic is where the next page
    // starts.
    let resp = describe(&mut raw, &["bad name!", &missing, a], 3, None);
    assert_eq!(resp.topics.len(), 2);
    assert_eq!(cursor(&resp), Some((missing.clone(), 0)));

    // A cursor whose topic is not among the named ones: INVALID_REQUEST
    // for every named topic.
    let resp = describe(&mut raw, &[a, c], 10, Some((b, 0)));
    let mut errors: Vec<(String, i16)> = resp
        .topics
        .iter()
        .map(|t| (t.name.as_ref().unwrap().0.to_string(), t.error_code))
        .collect();
    errors.sort();
    let invalid = ResponseError::InvalidRequest.code();
    assert_eq!(
        errors,
        vec![(a.to_string(), invalid), (c.to_string(), invalid)]
    );
    assert!(resp.topics.iter().all(|t| t.partitions.is_empty()));

    // No topic named: every topic from the cursor on (here a's partition
    // 1), as far as the limit goes.
    let resp = describe(&mut raw, &[], 2, Some((a, 1)));
    assert_eq!(listing(&resp), vec![ok(a, &[1, 2])]);
    assert_eq!(cursor(&resp), Some((b.to_string(), 0)));
    let resp = describe(&mut raw, &[], 3, Some((b, 0)));
    assert_eq!(listing(&resp), vec![ok(b, &[0, 1]), ok(c, &[0])]);
}
