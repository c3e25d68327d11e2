//! Removing a node (Kafka's UnregisterBroker, `kafka-cluster unregister`;
//! `docs/replication.md` §3.2) on three nodes, each in its own network
//! namespace (`common::netns`) with one shard, a quorum of all three:
//! - node 2 stops and is fenced: DescribeCluster lists it only when asked
//!   for fenced brokers (v2, KIP-1073), and Kafka's `kafka-cluster
//!   list-endpoints --include-fenced-brokers` shows it; a topic of three
//!   replicas and `min.insync.replicas` 3 keeps its replica on node 2 in
//!   the ELR;
//! - Kafka's `kafka-cluster unregister --id 2000` (4.4.0, through
//!   `scripts/kafka-cli`) says the broker is no longer registered; then
//!   no node lists broker 2000 (DescribeCluster with fenced brokers,
//!   Metadata, `list-endpoints --include-fenced-brokers`), the partition
//!   still names it as a replica but no longer in its ELR;
//! - unregistering it again, or an id no node has, is
//!   BROKER_ID_NOT_REGISTERED with Kafka's message (the tool fails);
//! - node 2 restarted registers again: every node lists three nodes, and
//!   its replica rejoins the ISR; node 1 unregistered while running does
//!   the same with its next heartbeat.
//!
//! And on a single node: UnregisterBroker is advertised, its own broker
//! id is answered done, another id BROKER_ID_NOT_REGISTERED; with ACLs on
//! and no ALTER on the cluster, CLUSTER_AUTHORIZATION_FAILED.

mod common;

use common::cluster::addr;
use common::netns::Net;
use common::raw::RawClient;
use common::Broker;
use kafka_protocol::messages::describe_topic_partitions_request::TopicRequest;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use std::time::Duration;

const SETTLE: Duration = Duration::from_secs(60);
const SESSION_TIMEOUT_MS: u64 = 3000;
const NODES: usize = 3;
const TOPIC: &str = "leaving";

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// DescribeCluster v2 at `broker` (`fenced`: IncludeFencedBrokers): each
/// broker listed, with whether it is fenced.
fn described(broker: &Broker, fenced: bool) -> Vec<(i32, bool)> {
    let resp = RawClient::connect_to(addr(broker)).request(
        2,
        &DescribeClusterRequest::default().with_include_fenced_brokers(fenced),
    );
    assert_eq!(resp.error_code, 0);
    resp.brokers
        .iter()
        .map(|b| (b.broker_id.0, b.is_fenced))
        .collect()
}

/// The brokers `broker`'s Metadata lists.
fn metadata_brokers(broker: &Broker) -> Vec<i32> {
    let resp = RawClient::connect_to(addr(broker)).request(
        12,
        &MetadataRequest::default()
            .with_topics(Some(Vec::new()))
            .with_allow_auto_topic_creation(false),
    );
    let mut ids: Vec<i32> = resp.brokers.iter().map(|b| b.node_id.0).collect();
    ids.sort();
    ids
}

/// A partition as DescribeTopicPartitions lists it.
struct Described {
    leader: i32,
    replicas: Vec<i32>,
    /// Sorted.
    isr: Vec<i32>,
    /// Sorted.
    elr: Vec<i32>,
}

/// Partition 0 of [`TOPIC`] as `broker`'s DescribeTopicPartitions lists
/// it.
fn described_partition(broker: &Broker) -> Option<Described> {
    let resp = RawClient::connect_to(addr(broker)).request(
        0,
        &DescribeTopicPartitionsRequest::default()
            .with_topics(vec![TopicRequest::default().with_name(TopicName(s(TOPIC)))])
            .with_response_partition_limit(10),
    );
    let t = resp.topics.first()?;
    if t.error_code != 0 {
        return None;
    }
    let p = t.partitions.first()?;
    let ids = |v: &[BrokerId]| {
        let mut v: Vec<i32> = v.iter().map(|b| b.0).collect();
        v.sort();
        v
    };
    Some(Described {
        leader: p.leader_id.0,
        replicas: p.replica_nodes.iter().map(|b| b.0).collect(),
        isr: ids(&p.isr_nodes),
        elr: ids(p.eligible_leader_replicas.as_deref().unwrap_or(&[])),
    })
}

/// UnregisterBroker v0 of `id` at `broker`: (error code, message), asked
/// again while the quorum has no leader (NOT_CONTROLLER: nothing changed).
fn unregister(broker: &Broker, id: i32) -> (i16, Option<String>) {
    let req = UnregisterBrokerRequest::default().with_broker_id(BrokerId(id));
    common::wait_for(SETTLE, "a quorum leader", || {
        let resp = RawClient::connect_to(addr(broker)).request(0, &req);
        if resp.error_code == ResponseError::NotController.code() {
            std::thread::sleep(Duration::from_millis(200));
            return None;
        }
        Some((
            resp.error_code,
            resp.error_message.as_ref().map(|m| m.to_string()),
        ))
    })
}

/// The broker ids in the first column of `kafka-cluster list-endpoints`
/// output (a header line, then one line per broker).
fn listed_endpoints(stdout: &str) -> Vec<i32> {
    let mut ids: Vec<i32> = stdout
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    ids.sort();
    ids
}

#[test]
fn kafka_cluster_unregister_removes_a_stopped_node() {
    let net = Net::new(NODES);
    let mut brokers = common::cluster::start_all(&net, NODES, SESSION_TIMEOUT_MS, SETTLE, |_| &[]);
    common::cluster::create_assigned(
        &brokers,
        TOPIC,
        &[0, 1000, 2000],
        &[("min.insync.replicas", "3")],
    );
    for b in &brokers {
        common::wait_for(SETTLE, "the topic in sync on three nodes", || {
            described_partition(b)
                .filter(|p| p.isr == [0, 1000, 2000])
                .map(|_| ())
        });
    }

    // Node 2 stops and is fenced: listed only with the fenced brokers;
    // its replica leaves the ISR for the ELR (below min.insync.replicas).
    brokers[2].stop();
    for b in &brokers[..2] {
        common::wait_for(SETTLE, "node 2 fenced", || {
            (described(b, true) == [(0, false), (1000, false), (2000, true)]).then_some(())
        });
        assert_eq!(described(b, false), [(0, false), (1000, false)]);
        assert_eq!(metadata_brokers(b), [0, 1000]);
        common::wait_for(SETTLE, "2000 in the ELR", || {
            described_partition(b)
                .filter(|p| p.isr == [0, 1000] && p.elr == [2000])
                .map(|_| ())
        });
    }
    let bootstrap = brokers[0].bootstrap();
    let list = [
        "list-endpoints",
        "--bootstrap-server",
        bootstrap.as_str(),
        "--include-fenced-brokers",
    ];
    let run = common::cluster::kafka_tool("kafka-cluster", &list);
    assert!(run.success(), "kafka-cluster list-endpoints failed");
    assert_eq!(listed_endpoints(&run.stdout), [0, 1000, 2000]);

    // Kafka's tool unregisters it.
    let run = common::cluster::kafka_tool(
        "kafka-cluster",
        &[
            "unregister",
            "--bootstrap-server",
            &bootstrap,
            "--id",
            "2000",
        ],
    );
    assert!(run.success(), "kafka-cluster unregister failed");
    assert!(
        run.stdout.contains("Broker 2000 is no longer registered."),
        "{}",
        run.stdout
    );
    for b in &brokers[..2] {
        common::wait_for(SETTLE, "node 2 unregistered", || {
            (described(b, true) == [(0, false), (1000, false)]).then_some(())
        });
        assert_eq!(metadata_brokers(b), [0, 1000]);
        // Still a replica until reassigned, but no longer eligible.
        let p = described_partition(b).expect("the topic");
        assert_eq!(p.leader, 0);
        assert_eq!(p.replicas, [0, 1000, 2000]);
        assert_eq!((p.isr, p.elr), (vec![0, 1000], vec![]));
    }
    let run = common::cluster::kafka_tool("kafka-cluster", &list);
    assert!(run.success(), "kafka-cluster list-endpoints failed");
    assert_eq!(listed_endpoints(&run.stdout), [0, 1000]);

    // Gone: BROKER_ID_NOT_REGISTERED, as an id no node has, through
    // either node (one of them forwards to the quorum's leader).
    let not_registered = ResponseError::BrokerIdNotRegistered.code();
    for (b, id) in [(0, 2000), (1, 2000), (0, 5000), (1, 1001), (0, -1)] {
        assert_eq!(
            unregister(&brokers[b], id),
            (
                not_registered,
                Some(format!("Broker ID {id} is not currently registered"))
            ),
            "node {b}, broker {id}"
        );
    }
    let run = common::cluster::kafka_tool(
        "kafka-cluster",
        &[
            "unregister",
            "--bootstrap-server",
            &bootstrap,
            "--id",
            "5000",
        ],
    );
    assert!(!run.success(), "unregistering an unknown id succeeded");
    assert!(
        run.stderr.contains("BrokerIdNotRegisteredException"),
        "{}",
        run.stderr
    );

    // Restarted, node 2 registers again, and its replica catches up.
    brokers[2].restart();
    for b in &brokers {
        common::wait_for(SETTLE, "node 2 registered again", || {
            (described(b, true) == [(0, false), (1000, false), (2000, false)]).then_some(())
        });
        common::wait_for(SETTLE, "2000 back in the ISR", || {
            described_partition(b)
                .filter(|p| p.isr == [0, 1000, 2000] && p.elr.is_empty())
                .map(|_| ())
        });
    }
    // A live node unregistered (Kafka allows it) registers again with its
    // next heartbeat, and its replica rejoins the ISR.
    assert_eq!(unregister(&brokers[2], 1000), (0, None));
    for b in &brokers {
        common::wait_for(SETTLE, "node 1 registered again", || {
            (described(b, true) == [(0, false), (1000, false), (2000, false)]).then_some(())
        });
        common::wait_for(SETTLE, "1000 back in the ISR", || {
            described_partition(b)
                .filter(|p| p.isr == [0, 1000, 2000])
                .map(|_| ())
        });
    }
    let leader_logs: String = brokers.iter().map(|b| b.stderr_since(0)).collect();
    assert!(
        leader_logs.contains("unregistering a node"),
        "the quorum's leader logged the unregistrations"
    );
    for b in &mut brokers {
        b.assert_alive();
        b.stop();
    }
}

/// A single node keeps no registrations: it advertises UnregisterBroker
/// (as Kafka's brokers do), answers its own broker id done (Kafka's
/// combined node would register again at once) and any other with
/// BROKER_ID_NOT_REGISTERED; with ACLs on, ALTER on the cluster is needed.
#[test]
fn a_single_node_answers_unregister_broker_as_kafka() {
    let broker = Broker::start(common::BrokerOpts::default().cores(2));
    let versions = RawClient::connect_to(addr(&broker)).request(3, &ApiVersionsRequest::default());
    let range = versions
        .api_keys
        .iter()
        .find(|k| k.api_key == ApiKey::UnregisterBroker as i16)
        .map(|k| (k.min_version, k.max_version));
    assert_eq!(range, Some((0, 0)));
    let answer = |b: &Broker, id: i32| {
        let resp = RawClient::connect_to(addr(b)).request(
            0,
            &UnregisterBrokerRequest::default().with_broker_id(BrokerId(id)),
        );
        (resp.error_code, resp.error_message.map(|m| m.to_string()))
    };
    assert_eq!(answer(&broker, 0), (0, None));
    assert_eq!(answer(&broker, 1), (0, None));
    for id in [2, 1000, -1] {
        assert_eq!(
            answer(&broker, id),
            (
                ResponseError::BrokerIdNotRegistered.code(),
                Some(format!("Broker ID {id} is not currently registered"))
            )
        );
    }
    drop(broker);

    let secured = Broker::start(
        common::BrokerOpts::default()
            .cores(1)
            .arg("--authorizer=standard"),
    );
    assert_eq!(
        answer(&secured, 0),
        (
            ResponseError::ClusterAuthorizationFailed.code(),
            Some("Cluster authorization failed.".into())
        )
    );
}
