//! Partition reassignment (KIP-455, `docs/replication.md` §4.5) on three
//! nodes, each in its own network namespace (`common::netns`) with one
//! shard, a quorum of all three. A topic of two replicas on nodes 0 and 1
//! (node 0 leading) moves to nodes 1 and 2:
//! - Kafka's errors first: unknown topic or partition, an empty target, a
//!   broker twice or not registered, a change of replication factor with
//!   v1's `allowReplicationFactorChange` false, a cancellation with none
//!   in progress;
//! - with node 2 down (registered, fenced), the reassignment starts and
//!   cannot finish: ListPartitionReassignments lists it (replicas 2000,
//!   1000, 0; adding 2000; removing 0), Metadata and
//!   DescribeTopicPartitions list all three replicas;
//!   cancelled, the partition is back on nodes 0 and 1 and nothing is
//!   listed;
//! - with node 2 back, the reassignment completes: replicas and ISR
//!   {1000, 2000}, the leader (node 0, removed) replaced by node 1 in a
//!   new leader epoch, node 2's segment byte for byte node 1's, node 0's
//!   copy deleted, and every record written before and after read back;
//! - with node 2 down, the partition moves back to nodes 1 and 0 (node 0
//!   copies the log anew); node 2, restarted, deletes its stale copy.
//!
//! And Kafka's own `kafka-reassign-partitions` (4.4.0, through
//! `scripts/kafka-cli`, jars from `scripts/kafka-peer.sh resolve`) moves
//! a partition the same way: with the target node frozen `--execute` starts
//! it, `--verify` reports it in progress and `--cancel` reverts it; with
//! the node back `--execute` starts it again, `--verify` reports it
//! complete, and every node lists the new replicas.
//!
//! And Kafka's `kafka-leader-election --election-type preferred` moves a
//! partition's leadership back to its preferred replica once that replica
//! is in the ISR again (ElectLeaders on several nodes).

mod common;

use common::cluster::{addr, PartitionView};
use common::netns::Net;
use common::raw::RawClient;
use common::Broker;
use kafka_protocol::messages::alter_partition_reassignments_request::{
    ReassignablePartition, ReassignableTopic,
};
use kafka_protocol::messages::list_partition_reassignments_request::ListPartitionReassignmentsTopics;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use std::time::Duration;

const SETTLE: Duration = Duration::from_secs(60);
const SESSION_TIMEOUT_MS: u64 = 3000;
const NODES: usize = 3;
const TOPIC: &str = "moving";

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn start(net: &Net, i: usize) -> Broker {
    let lag = [format!("--replica-lag-time-max-ms={}", 2000)];
    common::cluster::start_node(net, i, NODES, SESSION_TIMEOUT_MS, &lag)
}

/// CreateTopics of [`TOPIC`], one partition on `replicas`, through the
/// first node that takes it.
fn create(brokers: &[Broker], replicas: &[i32]) {
    create_named(brokers, TOPIC, replicas);
}

/// CreateTopics of `name`, one partition on `replicas`, `min.insync.replicas`
/// 1.
fn create_named(brokers: &[Broker], name: &str, replicas: &[i32]) {
    common::cluster::create_assigned(brokers, name, replicas, &[("min.insync.replicas", "1")]);
}

/// Partition 0 of a topic as a node's Metadata (v12) lists it: replicas
/// as listed (their order is the reassignment's), the ISR sorted.
type Listed = PartitionView;

fn listed(broker: &Broker) -> Option<Listed> {
    listed_topic(broker, TOPIC)
}

fn listed_topic(broker: &Broker, topic: &str) -> Option<Listed> {
    let mut p = common::cluster::partition(broker, topic, 0)?;
    p.isr.sort();
    Some(p)
}

fn wait_listed(broker: &Broker, what: &str, ok: impl Fn(&Listed) -> bool) -> Listed {
    common::wait_for(SETTLE, what, || {
        let l = listed(broker)?;
        ok(&l).then_some(l)
    })
}

/// AlterPartitionReassignments of partition `partition` of `topic` to
/// `target` (None: cancel) at `version`, `allow` its
/// allowReplicationFactorChange: the partition's (error code, message),
/// after checking the top level.
fn reassign(
    broker: &Broker,
    version: i16,
    topic: &str,
    partition: i32,
    target: Option<&[i32]>,
    allow: bool,
) -> (i16, Option<String>) {
    let req = AlterPartitionReassignmentsRequest::default()
        .with_timeout_ms(10_000)
        .with_allow_replication_factor_change(allow)
        .with_topics(vec![ReassignableTopic::default()
            .with_name(TopicName(s(topic)))
            .with_partitions(vec![ReassignablePartition::default()
                .with_partition_index(partition)
                .with_replicas(
                    target.map(|t| t.iter().map(|&b| BrokerId(b)).collect()),
                )])]);
    // NOT_CONTROLLER (nothing changed) while a quorum leader killed by
    // the test is replaced: retried, as clients do.
    let resp = common::wait_for(SETTLE, "a quorum leader", || {
        let resp = RawClient::connect_to(addr(broker)).request(version, &req);
        if resp.error_code == ResponseError::NotController.code() {
            std::thread::sleep(Duration::from_millis(200));
            return None;
        }
        Some(resp)
    });
    assert_eq!(resp.error_code, 0, "{:?}", resp.error_message);
    if version >= 1 {
        assert_eq!(resp.allow_replication_factor_change, allow);
    }
    assert_eq!(resp.responses.len(), 1);
    assert_eq!(resp.responses[0].name.0.as_str(), topic);
    let p = &resp.responses[0].partitions[0];
    assert_eq!(p.partition_index, partition);
    (
        p.error_code,
        p.error_message.as_ref().map(|m| m.to_string()),
    )
}

/// ListPartitionReassignments (all, or partition 0 of [`TOPIC`] when
/// `named`): each listed partition's (topic, index, replicas, adding,
/// removing).
type Ongoing = (String, i32, Vec<i32>, Vec<i32>, Vec<i32>);

fn list(broker: &Broker, named: bool) -> Vec<Ongoing> {
    let topics = named.then(|| {
        vec![
            ListPartitionReassignmentsTopics::default()
                .with_name(TopicName(s(TOPIC)))
                .with_partition_indexes(vec![0, 7]),
            ListPartitionReassignmentsTopics::default()
                .with_name(TopicName(s("nosuch")))
                .with_partition_indexes(vec![0]),
        ]
    });
    let resp = RawClient::connect_to(addr(broker)).request(
        0,
        &ListPartitionReassignmentsRequest::default()
            .with_timeout_ms(10_000)
            .with_topics(topics),
    );
    assert_eq!(resp.error_code, 0);
    let ids = |v: &[BrokerId]| v.iter().map(|b| b.0).collect::<Vec<i32>>();
    resp.topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| {
                (
                    t.name.0.to_string(),
                    p.partition_index,
                    ids(&p.replicas),
                    ids(&p.adding_replicas),
                    ids(&p.removing_replicas),
                )
            })
        })
        .collect()
}

/// `count` records of values `{prefix}{i}` to partition 0 at `broker`
/// with acks=all, each retried until answered without error.
fn produce(broker: &Broker, prefix: &str, count: usize) -> Vec<String> {
    (0..count)
        .map(|i| {
            let v = format!("{prefix}{i}");
            common::wait_for(SETTLE, "acks=all to be answered", || {
                let batch = common::leader::one_batch(&v);
                let resp = RawClient::connect_to(addr(broker))
                    .request(9, &common::raw::produce_request(TOPIC, 0, -1, batch));
                (common::raw::only_partition(&resp).error_code == 0).then_some(())
            });
            v
        })
        .collect()
}

fn segment(broker: &Broker) -> Vec<u8> {
    common::disk::batches(&broker.first_segment(TOPIC, 0))
        .into_iter()
        .flat_map(|b| b.bytes)
        .collect()
}

#[test]
fn a_partition_moves_to_another_node_and_back_on_cancel() {
    let net = Net::new(NODES);
    let mut brokers: Vec<Broker> = (0..NODES).map(|i| start(&net, i)).collect();
    common::cluster::wait_brokers(&brokers[0], NODES, SETTLE);
    create(&brokers, &[0, 1000]);
    let first = wait_listed(&brokers[0], "the topic on nodes 0 and 1", |l| {
        l.leader == 0 && l.isr == [0, 1000]
    });
    assert_eq!(first.replicas, vec![0, 1000]);
    wait_listed(&brokers[1], "node 1 to know the topic", |l| l.leader == 0);
    let mut written = produce(&brokers[0], "a", 20);

    // Kafka's errors.
    let b = &brokers[1];
    let unknown = ResponseError::UnknownTopicOrPartition.code();
    let invalid = ResponseError::InvalidReplicaAssignment.code();
    assert_eq!(reassign(b, 1, "nosuch", 0, Some(&[0]), true).0, unknown);
    assert_eq!(reassign(b, 1, TOPIC, 3, Some(&[0]), true).0, unknown);
    assert_eq!(reassign(b, 1, TOPIC, 0, Some(&[]), true).0, invalid);
    assert_eq!(
        reassign(b, 1, TOPIC, 0, Some(&[1000, 1000]), true).0,
        invalid
    );
    let (code, message) = reassign(b, 0, TOPIC, 0, Some(&[1000, 7000]), true);
    assert_eq!(code, invalid);
    assert!(message.unwrap().contains("7000"));
    // Kafka's message, as its ReassignPartitionsCommand test expects it.
    assert_eq!(
        reassign(b, 1, TOPIC, 0, Some(&[1000]), false),
        (
            ResponseError::InvalidReplicationFactor.code(),
            Some("The replication factor is changed from 2 to 1".to_string())
        )
    );
    assert_eq!(
        reassign(b, 1, TOPIC, 0, None, true),
        (
            ResponseError::NoReassignmentInProgress.code(),
            Some("No partition reassignment is in progress.".to_string())
        )
    );
    assert!(list(b, false).is_empty());

    // Node 2 down: the reassignment starts and waits for it.
    brokers[2].kill9();
    let b = &brokers[1];
    assert_eq!(reassign(b, 1, TOPIC, 0, Some(&[1000, 2000]), true).0, 0);
    let ongoing = (
        TOPIC.to_string(),
        0,
        vec![1000, 2000, 0],
        vec![2000],
        vec![0],
    );
    assert_eq!(list(b, false), vec![ongoing.clone()]);
    // Node 0 lists it once it has applied the change.
    common::wait_for(SETTLE, "node 0 to list the reassignment", || {
        (list(&brokers[0], true) == vec![ongoing.clone()]).then_some(())
    });
    let during = wait_listed(&brokers[0], "the full replica set", |l| {
        l.replicas == [1000, 2000, 0]
    });
    assert_eq!((during.leader, during.isr.clone()), (0, vec![0, 1000]));
    {
        use kafka_protocol::messages::describe_topic_partitions_request::TopicRequest;
        let resp = RawClient::connect_to(addr(&brokers[0])).request(
            0,
            &DescribeTopicPartitionsRequest::default()
                .with_topics(vec![TopicRequest::default().with_name(TopicName(s(TOPIC)))])
                .with_response_partition_limit(10),
        );
        let p = &resp.topics[0].partitions[0];
        let ids: Vec<i32> = p.replica_nodes.iter().map(|b| b.0).collect();
        assert_eq!(ids, vec![1000, 2000, 0], "DescribeTopicPartitions");
    }
    // Writes go on meanwhile.
    written.extend(produce(&brokers[0], "b", 5));
    // Cancelled: back on nodes 0 and 1.
    assert_eq!(reassign(b, 0, TOPIC, 0, None, true).0, 0);
    assert!(list(b, false).is_empty());
    let back = wait_listed(&brokers[0], "the original replicas", |l| {
        l.replicas.len() == 2
    });
    let mut replicas = back.replicas.clone();
    replicas.sort();
    assert_eq!(replicas, vec![0, 1000]);
    assert_eq!((back.leader, back.isr.clone()), (0, vec![0, 1000]));

    // Node 2 back: the reassignment completes.
    brokers[2].restart();
    common::cluster::wait_brokers(&brokers[0], NODES, SETTLE);
    let b = &brokers[1];
    assert_eq!(reassign(b, 1, TOPIC, 0, Some(&[1000, 2000]), true).0, 0);
    let done = wait_listed(&brokers[1], "the partition on nodes 1 and 2", |l| {
        l.replicas == [1000, 2000] && l.isr == [1000, 2000]
    });
    assert_eq!(done.leader, 1000, "the removed leader is replaced");
    assert!(done.leader_epoch > back.leader_epoch);
    assert!(list(b, false).is_empty());
    common::wait_for(SETTLE, "node 2 to hold node 1's copy", || {
        let copy = segment(&brokers[2]);
        (!copy.is_empty() && copy == segment(&brokers[1])).then_some(())
    });
    common::wait_for(SETTLE, "node 0 to delete its copy", || {
        (!brokers[0].data_dir().join(format!("{TOPIC}-0")).exists()).then_some(())
    });
    wait_listed(&brokers[2], "node 2 to know it leads nothing", |l| {
        l.leader == 1000 && l.replicas == [1000, 2000]
    });
    written.extend(produce(&brokers[1], "c", 10));
    common::wait_for(SETTLE, "node 2 to copy the new leader's epoch", || {
        (segment(&brokers[2]) == segment(&brokers[1])).then_some(())
    });
    written.sort();
    assert_eq!(
        common::cluster::sorted_values(&brokers[2], TOPIC, written.len(), SETTLE),
        written
    );

    // Node 2 down while its replica is removed: the partition moves back
    // to node 0, which copies node 1's log again; node 2, restarted,
    // deletes its stale copy.
    brokers[2].kill9();
    assert_eq!(
        reassign(&brokers[1], 1, TOPIC, 0, Some(&[1000, 0]), true).0,
        0
    );
    wait_listed(&brokers[1], "the partition on nodes 1 and 0", |l| {
        l.replicas == [1000, 0] && l.isr == [0, 1000]
    });
    common::wait_for(SETTLE, "node 0 to hold node 1's copy again", || {
        let copy = segment(&brokers[0]);
        (!copy.is_empty() && copy == segment(&brokers[1])).then_some(())
    });
    let stale = brokers[2].data_dir().join(format!("{TOPIC}-0"));
    assert!(stale.exists(), "node 2 was down: its copy is still there");
    brokers[2].restart();
    common::wait_for(SETTLE, "node 2 to delete its stale copy", || {
        (!stale.exists()).then_some(())
    });
    for b in &mut brokers {
        b.assert_alive();
        b.stop();
    }
}

#[test]
fn kafka_reassign_partitions_moves_a_partition() {
    const CLI: &str = "cli";
    let net = Net::new(NODES);
    // A session long enough that a node frozen for the tools' runs is
    // not fenced.
    let mut brokers: Vec<Broker> = (0..NODES)
        .map(|i| common::cluster::start_node(&net, i, NODES, 120_000, &[]))
        .collect();
    common::cluster::wait_brokers(&brokers[0], NODES, SETTLE);
    // The partition moves from nodes a and b to b and f; f is frozen
    // below, so it must not lead the metadata quorum (the tools' changes
    // go through that leader).
    let quorum =
        common::cluster::quorum_leader(&brokers.iter().map(Some).collect::<Vec<_>>(), SETTLE);
    let (a, b, f) = if quorum == 2 { (2, 0, 1) } else { (0, 1, 2) };
    let id = |n: usize| n as i32 * 1000;
    // An ISR as listed (sorted).
    let isr = |x: usize, y: usize| {
        let mut v = vec![id(x), id(y)];
        v.sort();
        v
    };
    create_named(&brokers, CLI, &[id(a), id(b)]);
    common::wait_for(SETTLE, "the topic on nodes a and b", || {
        listed_topic(&brokers[0], CLI)
            .filter(|l| l.leader == id(a) && l.isr == isr(a, b))
            .map(|_| ())
    });
    let dir = tempfile::tempdir().expect("a temporary directory");
    let plan = dir.path().join("reassignment.json");
    std::fs::write(
        &plan,
        format!(
            r#"{{"version":1,"partitions":[{{"topic":"{CLI}","partition":0,"replicas":[{},{}],"log_dirs":["any","any"]}}]}}"#,
            id(b),
            id(f)
        ),
    )
    .expect("the plan written");
    let bootstrap = brokers[a].bootstrap();
    let plan = plan.to_str().expect("a UTF-8 path");
    let args = |action: &'static str| {
        vec![
            "--bootstrap-server",
            bootstrap.as_str(),
            "--reassignment-json-file",
            plan,
            action,
        ]
    };
    // Node f frozen (SIGSTOP; still registered and unfenced, as the
    // tool checks the target brokers against DescribeCluster): the
    // reassignment starts and cannot finish, `--verify` says it is in
    // progress, `--cancel` reverts it.
    brokers[f].signal("-STOP");
    let run = common::cluster::kafka_tool("kafka-reassign-partitions", &args("--execute"));
    assert!(run.success(), "--execute failed");
    let run = common::cluster::kafka_tool("kafka-reassign-partitions", &args("--verify"));
    assert!(run.success(), "--verify failed");
    assert!(
        run.stdout.contains(&format!(
            "Reassignment of partition {CLI}-0 is still in progress."
        )),
        "{}",
        run.stdout
    );
    // (`--preserve-throttles`: clearing them asks every broker, the
    // frozen one too.)
    let mut cancel = args("--cancel");
    cancel.push("--preserve-throttles");
    let run = common::cluster::kafka_tool("kafka-reassign-partitions", &cancel);
    assert!(run.success(), "--cancel failed");
    assert!(
        run.stdout.contains(&format!(
            "Successfully cancelled partition reassignment for: {CLI}-0"
        )),
        "{}",
        run.stdout
    );
    common::wait_for(SETTLE, "the original replicas back", || {
        listed_topic(&brokers[0], CLI)
            .filter(|l| l.replicas.len() == 2 && l.leader == id(a))
            .map(|_| ())
    });
    brokers[f].signal("-CONT");

    let run = common::cluster::kafka_tool("kafka-reassign-partitions", &args("--execute"));
    assert!(run.success(), "--execute failed");
    assert!(
        run.stdout.contains(&format!(
            "Successfully started partition reassignment for {CLI}-0"
        )),
        "{}",
        run.stdout
    );
    common::wait_for(SETTLE, "--verify to report it complete", || {
        let run = common::cluster::kafka_tool("kafka-reassign-partitions", &args("--verify"));
        assert!(run.success(), "--verify failed");
        run.stdout
            .contains(&format!("Reassignment of partition {CLI}-0 is completed."))
            .then_some(())
    });
    for node in &brokers {
        common::wait_for(SETTLE, "every node to list the new replicas", || {
            listed_topic(node, CLI)
                .filter(|l| l.replicas == [id(b), id(f)] && l.isr == isr(b, f) && l.leader == id(b))
                .map(|_| ())
        });
    }
    for b in &mut brokers {
        b.assert_alive();
        b.stop();
    }
}

/// On one node every topic has one replica: a reassignment is
/// INVALID_REPLICA_ASSIGNMENT with a message that says why, unknown topics
/// UNKNOWN_TOPIC_OR_PARTITION, and nothing is listed. With
/// `--authorizer standard` and no ACLs, both APIs are
/// CLUSTER_AUTHORIZATION_FAILED (ALTER / DESCRIBE on the cluster), at the
/// top level and, for Alter, per partition, as Kafka answers. Deleting a
/// dynamic broker config succeeds (none is set), setting one does not.
#[test]
fn one_node_refuses_reassignments_and_authorizes_on_the_cluster() {
    let broker = Broker::start(common::BrokerOpts::default().cores(1));
    create_named(std::slice::from_ref(&broker), "single", &[0]);
    let (code, message) = reassign(&broker, 1, "single", 0, Some(&[0]), true);
    assert_eq!(code, ResponseError::InvalidReplicaAssignment.code());
    assert!(message.unwrap().contains("one replica"));
    assert_eq!(
        reassign(&broker, 0, "nosuch", 0, None, true).0,
        ResponseError::UnknownTopicOrPartition.code()
    );
    assert!(list(&broker, false).is_empty());
    // Broker configs: deleting (what `kafka-reassign-partitions --verify`
    // does to clear throttles) succeeds, none being set; setting one is
    // refused (fjord's broker configs are static).
    {
        use kafka_protocol::messages::incremental_alter_configs_request::{
            AlterConfigsResource, AlterableConfig,
        };
        let alter = |op: i8, value: Option<&str>| {
            let req = IncrementalAlterConfigsRequest::default().with_resources(vec![
                AlterConfigsResource::default()
                    .with_resource_type(4)
                    .with_resource_name(s("0"))
                    .with_configs(vec![AlterableConfig::default()
                        .with_name(s("leader.replication.throttled.rate"))
                        .with_config_operation(op)
                        .with_value(value.map(s))]),
            ]);
            RawClient::connect_to(addr(&broker))
                .request(1, &req)
                .responses[0]
                .error_code
        };
        assert_eq!(alter(1, None), 0, "DELETE");
        assert_eq!(
            alter(0, Some("1000")),
            ResponseError::InvalidRequest.code(),
            "SET"
        );
    }
    drop(broker);

    let secured = Broker::start(
        common::BrokerOpts::default()
            .cores(1)
            .arg("--authorizer=standard"),
    );
    let denied = ResponseError::ClusterAuthorizationFailed.code();
    let mut raw = RawClient::connect_to(addr(&secured));
    let resp = raw.request(
        1,
        &AlterPartitionReassignmentsRequest::default().with_topics(vec![
            ReassignableTopic::default()
                .with_name(TopicName(s("t")))
                .with_partitions(vec![ReassignablePartition::default()
                    .with_partition_index(0)
                    .with_replicas(Some(vec![BrokerId(0)]))]),
        ]),
    );
    assert_eq!(resp.error_code, denied);
    assert_eq!(resp.responses[0].partitions[0].error_code, denied);
    let resp = raw.request(0, &ListPartitionReassignmentsRequest::default());
    assert_eq!(resp.error_code, denied);
    assert!(resp.topics.is_empty());
}

/// Kafka 4.4's `kafka-leader-election --election-type preferred`: a
/// partition of three replicas led by another than its preferred replica
/// (node 0, stopped and back as a follower) is led by node 0 again, on
/// every node, and the tool says so; run again, it has nothing to do.
#[test]
fn kafka_leader_election_moves_leadership_to_the_preferred_replica() {
    const ELECT: &str = "elect";
    let net = Net::new(NODES);
    let mut brokers: Vec<Broker> = (0..NODES).map(|i| start(&net, i)).collect();
    common::cluster::wait_brokers(&brokers[0], NODES, SETTLE);
    create_named(&brokers, ELECT, &[0, 1000, 2000]);
    let all = [0, 1000, 2000];
    let led_by = |b: &Broker, leader: i32| {
        common::wait_for(
            SETTLE,
            &format!("{ELECT} led by {leader}, all in sync"),
            || {
                listed_topic(b, ELECT)
                    .filter(|l| l.leader == leader && l.isr == all)
                    .map(|_| ())
            },
        )
    };
    led_by(&brokers[0], 0);
    // Node 0 stops (fenced: node 1 leads) and comes back as a follower.
    brokers[0].stop();
    common::wait_for(SETTLE, "another leader", || {
        listed_topic(&brokers[1], ELECT)
            .filter(|l| l.leader == 1000)
            .map(|_| ())
    });
    brokers[0].restart();
    led_by(&brokers[1], 1000);
    let bootstrap = brokers[1].bootstrap();
    let args = [
        "--bootstrap-server",
        bootstrap.as_str(),
        "--election-type",
        "preferred",
        "--topic",
        ELECT,
        "--partition",
        "0",
    ];
    let run = common::cluster::kafka_tool("kafka-leader-election", &args);
    assert!(run.success(), "kafka-leader-election failed");
    assert!(
        run.stdout.contains(&format!(
            "Successfully completed leader election (PREFERRED) for partitions {ELECT}-0"
        )),
        "{}",
        run.stdout
    );
    for b in &brokers {
        led_by(b, 0);
    }
    // Nothing left to elect: Kafka's tool reports ELECTION_NOT_NEEDED as
    // a success with nothing done.
    let run = common::cluster::kafka_tool("kafka-leader-election", &args);
    assert!(
        run.success(),
        "kafka-leader-election failed the second time"
    );
    assert!(
        run.stdout
            .contains("Valid replica already elected for partitions"),
        "{}",
        run.stdout
    );
}
