//! Shards as nodes: a 2-shard broker is a 2-node cluster to clients, and a
//! topic's partitions are led by both shards.

mod common;

use common::client::{self, create_topic};
use common::{Broker, BrokerOpts};
use rdkafka::consumer::Consumer;
use std::collections::BTreeSet;
use std::time::Duration;

#[test]
fn two_shard_broker_shows_two_nodes_leading_partitions() {
    let broker = Broker::start(BrokerOpts::default().cores(2));
    let topic = "cluster-two-nodes";
    create_topic(&broker.bootstrap(), topic, 4, &[]);

    let c = client::consumer(&broker.bootstrap(), &[]);
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    let mut brokers: Vec<(i32, String, i32)> = md
        .brokers()
        .iter()
        .map(|b| (b.id(), b.host().to_string(), b.port()))
        .collect();
    brokers.sort();
    assert_eq!(
        brokers,
        vec![
            (0, "127.0.0.1".to_string(), broker.port_of(0) as i32),
            (1, "127.0.0.1".to_string(), broker.port_of(1) as i32),
        ],
        "one node per shard, node k on port + k"
    );

    let t = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .expect("topic listed");
    assert_eq!(t.partitions().len(), 4);
    let leaders: BTreeSet<i32> = t.partitions().iter().map(|p| p.leader()).collect();
    assert_eq!(
        leaders,
        BTreeSet::from([0, 1]),
        "partitions are led by both shards"
    );
    for p in t.partitions() {
        assert_eq!(
            p.replicas(),
            &[p.leader()],
            "replication factor 1, the leader"
        );
        assert_eq!(p.isr(), &[p.leader()]);
    }
}
