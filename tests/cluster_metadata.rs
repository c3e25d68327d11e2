//! The metadata quorum on three nodes (`docs/replication.md` §3.2), each in
//! its own network namespace (`common::netns`) with one shard: a topic and
//! its config created through the node that leads the quorum are seen
//! through every node's Metadata and DescribeConfigs;
//! a node that does not lead answers NOT_CONTROLLER (metadata writes are
//! not forwarded yet); after the leader is SIGKILLed the survivors elect
//! one that accepts a new topic, and the killed node catches up when it
//! restarts; a node cut off the network catches up after it is healed.

mod common;

use common::netns::Net;
use common::raw::RawClient;
use common::{Broker, BrokerOpts};
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use std::net::SocketAddr;
use std::time::Duration;

/// The controller port on every host (each has its own address).
const CONTROLLER_PORT: u16 = 9093;
/// How long the quorum gets to elect a leader or catch a node up.
const SETTLE: Duration = Duration::from_secs(30);

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn addr(broker: &Broker) -> SocketAddr {
    broker.bootstrap().parse().expect("an address")
}

fn start(net: &Net, i: usize) -> Broker {
    let quorum: Vec<String> = (0..3)
        .map(|n| format!("{n}@{}:{CONTROLLER_PORT}", net.host(n).addr))
        .collect();
    Broker::start(
        BrokerOpts::default()
            .cores(1)
            .in_host(net.host(i))
            .arg(format!("--node-id={i}"))
            .arg(format!("--controller-quorum={}", quorum.join(","))),
    )
}

/// CreateTopics of `name` (one partition, `retention.ms`) through `broker`:
/// its error code.
fn create_topic(broker: &Broker, name: &str) -> i16 {
    let topic = CreatableTopic::default()
        .with_name(TopicName(s(name)))
        .with_num_partitions(1)
        .with_replication_factor(1)
        .with_configs(vec![CreatableTopicConfig::default()
            .with_name(s("retention.ms"))
            .with_value(Some(s("4242000")))]);
    let resp = RawClient::connect_to(addr(broker)).request(
        5,
        &CreateTopicsRequest::default()
            .with_topics(vec![topic])
            .with_timeout_ms(10_000),
    );
    resp.topics[0].error_code
}

/// CreateTopics through whichever node accepts it, retrying until one
/// does; returns that node (it leads the quorum). Every other answer seen
/// is NOT_CONTROLLER (or REQUEST_TIMED_OUT while a new leader settles).
fn create_anywhere(brokers: &[Option<&Broker>], name: &str) -> usize {
    common::wait_for(SETTLE, "a node that accepts CreateTopics", || {
        for (i, b) in brokers.iter().enumerate() {
            let Some(b) = b else { continue };
            let code = create_topic(b, name);
            if code == 0 {
                return Some(i);
            }
            assert!(
                code == ResponseError::NotController.code()
                    || code == ResponseError::RequestTimedOut.code(),
                "node {i} answered {code} to CreateTopics {name}"
            );
        }
        std::thread::sleep(Duration::from_millis(200));
        None
    })
}

/// The topics `broker`'s Metadata lists.
fn topics(broker: &Broker) -> Vec<String> {
    let resp = RawClient::connect_to(addr(broker)).request(
        9,
        &MetadataRequest::default()
            .with_topics(None)
            .with_allow_auto_topic_creation(false),
    );
    resp.topics
        .iter()
        .filter_map(|t| t.name.as_ref().map(|n| n.0.to_string()))
        .collect()
}

/// The leader id and error of partition 0 of `name` in `broker`'s Metadata.
fn leader_of(broker: &Broker, name: &str) -> (i32, i16) {
    let resp = RawClient::connect_to(addr(broker)).request(
        9,
        &MetadataRequest::default()
            .with_topics(None)
            .with_allow_auto_topic_creation(false),
    );
    let t = resp
        .topics
        .iter()
        .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == name))
        .expect("the topic is listed");
    let p = &t.partitions[0];
    (p.leader_id.0, p.error_code)
}

fn wait_lists(broker: &Broker, node: usize, name: &str) {
    common::wait_for(SETTLE, &format!("node {node} to list {name}"), || {
        topics(broker).iter().any(|t| t == name).then_some(())
    });
}

/// `name`'s `retention.ms` in `broker`'s DescribeConfigs.
fn retention(broker: &Broker, name: &str) -> Option<String> {
    let resp = RawClient::connect_to(addr(broker)).request(
        4,
        &DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
            .with_resource_type(2)
            .with_resource_name(s(name))
            .with_configuration_keys(Some(vec![s("retention.ms")]))]),
    );
    let r = &resp.results[0];
    assert_eq!(
        r.error_code, 0,
        "DescribeConfigs {name}: {:?}",
        r.error_message
    );
    r.configs
        .iter()
        .find(|c| c.name.as_str() == "retention.ms")
        .and_then(|c| c.value.as_ref().map(|v| v.to_string()))
}

#[test]
fn three_nodes_share_metadata_through_a_leader_failure_and_a_partition() {
    let net = Net::new(3);
    let mut brokers: Vec<Broker> = (0..3).map(|i| start(&net, i)).collect();

    // A topic with a config, through whichever node leads.
    let leader = create_anywhere(&brokers.iter().map(Some).collect::<Vec<_>>(), "first");
    for (i, b) in brokers.iter().enumerate() {
        if i != leader {
            assert_eq!(
                create_topic(b, "refused"),
                ResponseError::NotController.code(),
                "node {i} does not lead: NOT_CONTROLLER"
            );
        }
    }
    for (i, b) in brokers.iter().enumerate() {
        wait_lists(b, i, "first");
        assert_eq!(
            retention(b, "first").as_deref(),
            Some("4242000"),
            "node {i}"
        );
        assert!(!topics(b).iter().any(|t| t == "refused"), "node {i}");
        // Until partitions are replicated only the leader's node holds the
        // topic's partition (one log); the others name no leader.
        let expected = if i == leader {
            (leader as i32 * 1000, 0)
        } else {
            (-1, ResponseError::LeaderNotAvailable.code())
        };
        assert_eq!(leader_of(b, "first"), expected, "node {i}");
        let holds_log = b.data_dir().join("first-0").exists();
        assert_eq!(holds_log, i == leader, "node {i} holds a log of first-0");
    }

    // The leader dies: the survivors elect one that accepts a topic.
    brokers[leader].kill9();
    let alive: Vec<Option<&Broker>> = brokers
        .iter()
        .enumerate()
        .map(|(i, b)| (i != leader).then_some(b))
        .collect();
    let second_leader = create_anywhere(&alive, "second");
    assert_ne!(second_leader, leader);
    for (i, b) in brokers.iter().enumerate().filter(|(i, _)| *i != leader) {
        wait_lists(b, i, "second");
    }
    // It restarts and catches up.
    brokers[leader].restart();
    wait_lists(&brokers[leader], leader, "second");
    wait_lists(&brokers[leader], leader, "first");

    // A node cut off misses a change made meanwhile, and catches up when
    // healed. The cut node is the leader: the other two elect another.
    let leader = create_anywhere(&brokers.iter().map(Some).collect::<Vec<_>>(), "third");
    net.cut(leader);
    let alive: Vec<Option<&Broker>> = brokers
        .iter()
        .enumerate()
        .map(|(i, b)| (i != leader).then_some(b))
        .collect();
    let during = create_anywhere(&alive, "during-cut");
    assert_ne!(during, leader);
    net.heal(leader);
    wait_lists(&brokers[leader], leader, "during-cut");
    assert_eq!(
        retention(&brokers[leader], "during-cut").as_deref(),
        Some("4242000")
    );
    for b in &mut brokers {
        b.assert_alive();
        b.stop();
    }
}
