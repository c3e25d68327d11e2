//! ElectLeaders (`kafka-leader-election.sh`, `Admin.electLeaders`) on one
//! broker, where every partition has one replica and so its leader: each
//! named partition is ELECTION_NOT_NEEDED, preferred or unclean, with
//! Kafka's message; unknown topics and partitions are
//! UNKNOWN_TOPIC_OR_PARTITION with Kafka's messages; with no partitions
//! named every topic is answered with no partition (none needed an
//! election); an unknown election type is INVALID_REQUEST. Checked against
//! stock Kafka 4.4 (`FJORD_TEST_BROKER=kafka:127.0.0.1:19092`). Elections
//! that move leaders are in the several-node tests.

mod common;

use common::client::create_topic;
use common::raw::RawClient;
use common::BrokerOpts;
use kafka_protocol::messages::elect_leaders_request::TopicPartitions;
use kafka_protocol::messages::{ElectLeadersRequest, ElectLeadersResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use std::collections::BTreeMap;

fn elect(
    raw: &mut RawClient,
    version: i16,
    election_type: i8,
    partitions: Option<&[(&str, &[i32])]>,
) -> ElectLeadersResponse {
    let topics = partitions.map(|ps| {
        ps.iter()
            .map(|(t, p)| {
                TopicPartitions::default()
                    .with_topic(TopicName(StrBytes::from_string(t.to_string())))
                    .with_partitions(p.to_vec())
            })
            .collect()
    });
    raw.request(
        version,
        &ElectLeadersRequest::default()
            .with_election_type(election_type)
            .with_topic_partitions(topics)
            .with_timeout_ms(10_000),
    )
}

/// (topic, partition) -> (error code, message), for the topics in `of`.
fn outcomes(resp: &ElectLeadersResponse, of: &[&str]) -> BTreeMap<(String, i32), (i16, String)> {
    resp.replica_election_results
        .iter()
        .filter(|t| of.contains(&t.topic.0.as_str()))
        .flat_map(|t| {
            t.partition_result.iter().map(|p| {
                (
                    (t.topic.0.to_string(), p.partition_id),
                    (
                        p.error_code,
                        p.error_message
                            .as_ref()
                            .map_or(String::new(), |m| m.to_string()),
                    ),
                )
            })
        })
        .collect()
}

#[test]
fn elections_on_one_broker_are_not_needed_and_unknowns_are_named() {
    let target = common::target::Target::start(BrokerOpts::default().cores(2));
    let topic = target.name("elect");
    let missing = target.name("elect-missing");
    create_topic(&target.bootstrap(), &topic, 2, &[]);
    let mut raw = RawClient::connect(target.port());
    let not_needed = (
        ResponseError::ElectionNotNeeded.code(),
        "Leader election not needed for topic partition.".to_string(),
    );
    let unknown = ResponseError::UnknownTopicOrPartition.code();
    for (version, election_type) in [(0, 0), (1, 0), (2, 0), (2, 1)] {
        let resp = elect(
            &mut raw,
            version,
            election_type,
            Some(&[(&topic, &[0, 1, 9]), (&missing, &[0])]),
        );
        assert_eq!(resp.error_code, 0, "v{version} type {election_type}");
        let got = outcomes(&resp, &[&topic, &missing]);
        let want: BTreeMap<(String, i32), (i16, String)> = [
            ((topic.clone(), 0), not_needed.clone()),
            ((topic.clone(), 1), not_needed.clone()),
            (
                (topic.clone(), 9),
                (unknown, format!("No such partition as {topic}-9")),
            ),
            (
                (missing.clone(), 0),
                (unknown, format!("No such topic as {missing}")),
            ),
        ]
        .into();
        assert_eq!(got, want, "v{version} type {election_type}");
    }
    // Every partition: none needed an election, so none is answered, but
    // the topic is.
    let resp = elect(&mut raw, 2, 0, None);
    assert_eq!(resp.error_code, 0);
    let entry = resp
        .replica_election_results
        .iter()
        .find(|t| t.topic.0.as_str() == topic)
        .expect("the topic is answered");
    assert!(entry.partition_result.is_empty(), "{entry:?}");
    // An election type Kafka does not know.
    let resp = elect(&mut raw, 2, 7, Some(&[(&topic, &[0])]));
    let invalid = ResponseError::InvalidRequest.code();
    assert_eq!(resp.error_code, invalid);
    assert_eq!(
        outcomes(&resp, &[&topic])
            .get(&(topic.clone(), 0))
            .map(|o| o.0),
        Some(invalid)
    );
}
