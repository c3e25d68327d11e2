//! Adding a node to a running cluster (`docs/replication.md` §3.2): three
//! voters, each in its own network namespace (`common::netns`) with one
//! shard, run a topic of three replicas with records in it; node 3 starts
//! with the three voters listed and `--controller-listen` its own address
//! (a learner, Kafka's observer):
//! - joins the quorum must refuse are refused (a voter's id, a voter's or
//!   another learner's address, a second address for a learner), and an
//!   undecodable one closes its connection, with every node alive;
//! - it joins the metadata quorum (the leader adds it) and never leads it;
//!   it registers, so DescribeCluster and Metadata on every node list four
//!   brokers;
//! - a new topic may have a replica on it, led by it, and Kafka 4.4's
//!   `kafka-reassign-partitions` (`scripts/kafka-cli`) moves that topic's
//!   other replica, the tool run against node 3;
//! - the partition is reassigned to include it (AlterPartitionReassignments,
//!   node 0 out): it copies the log and joins the ISR, and after a
//!   preferred election it leads the partition and every record is read
//!   back from it;
//! - killed and restarted, it comes back with its log: a topic created while it was
//!   down is known to it, and it is back in the partition's ISR;
//! - unregistered with Kafka's `kafka-cluster unregister`, it leaves the
//!   quorum's membership too (every voter logs it, and DescribeCluster
//!   lists the voters only): while paused (SIGSTOP), then resumed, it
//!   notices that no leader talks to it any more, joins the quorum again
//!   and registers; stopped, then started again, it joins again at its
//!   start, registers and is listed, and is back in the ISR.

mod common;

use common::cluster::{addr, kafka_tool, CONTROLLER_PORT};
use common::netns::Net;
use common::raw::RawClient;
use common::{Broker, BrokerOpts};
use kafka_protocol::messages::alter_partition_reassignments_request::{
    ReassignablePartition, ReassignableTopic,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use std::time::Duration;

const SETTLE: Duration = Duration::from_secs(60);
const SESSION_TIMEOUT_MS: u64 = 3000;
const VOTERS: usize = 3;
const TOPIC: &str = "growing";

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn lag() -> Vec<String> {
    vec![format!("--replica-lag-time-max-ms={}", 2000)]
}

/// Node 3, outside the voters: the three voters listed, its own
/// controller address given.
fn start_learner(net: &Net) -> Broker {
    let i = VOTERS;
    let mut opts = BrokerOpts::default()
        .cores(1)
        .in_host(net.host(i))
        .arg(format!("--node-id={i}"))
        .arg(format!(
            "--controller-quorum={}",
            common::cluster::voters(net, VOTERS)
        ))
        .arg(format!(
            "--controller-listen={}:{CONTROLLER_PORT}",
            net.host(i).addr
        ))
        .arg(format!("--broker-session-timeout-ms={SESSION_TIMEOUT_MS}"));
    for a in lag() {
        opts = opts.arg(a);
    }
    Broker::start(opts)
}

/// `broker`'s DescribeCluster broker ids, sorted.
fn cluster(broker: &Broker) -> Vec<i32> {
    let resp = RawClient::connect_to(addr(broker)).request(1, &DescribeClusterRequest::default());
    assert_eq!(resp.error_code, 0);
    let mut ids: Vec<i32> = resp.brokers.iter().map(|b| b.broker_id.0).collect();
    ids.sort();
    ids
}

/// Partition 0 of `topic` as `broker` lists it, the ISR sorted.
fn listed(broker: &Broker, topic: &str) -> Option<common::cluster::PartitionView> {
    let mut p = common::cluster::partition(broker, topic, 0)?;
    p.isr.sort();
    Some(p)
}

fn wait_listed(
    broker: &Broker,
    what: &str,
    ok: impl Fn(&common::cluster::PartitionView) -> bool,
) -> common::cluster::PartitionView {
    common::wait_for(SETTLE, what, || {
        let l = listed(broker, TOPIC)?;
        ok(&l).then_some(l)
    })
}

/// `count` records `{prefix}{i}` to partition 0 of [`TOPIC`] at `broker`
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

/// AlterPartitionReassignments of partition 0 of [`TOPIC`] to `target`
/// through `broker` (NOT_CONTROLLER retried): the partition's error code.
fn reassign(broker: &Broker, target: &[i32]) -> i16 {
    let req = AlterPartitionReassignmentsRequest::default()
        .with_timeout_ms(10_000)
        .with_topics(vec![ReassignableTopic::default()
            .with_name(TopicName(s(TOPIC)))
            .with_partitions(vec![ReassignablePartition::default()
                .with_partition_index(0)
                .with_replicas(Some(
                    target.iter().map(|&b| BrokerId(b)).collect(),
                ))])]);
    let resp = common::wait_for(SETTLE, "a quorum leader", || {
        let resp = RawClient::connect_to(addr(broker)).request(0, &req);
        if resp.error_code == ResponseError::NotController.code() {
            std::thread::sleep(Duration::from_millis(200));
            return None;
        }
        Some(resp)
    });
    assert_eq!(resp.error_code, 0, "{:?}", resp.error_message);
    resp.responses[0].partitions[0].error_code
}

/// ElectLeaders (preferred) of partition 0 of [`TOPIC`] through `broker`:
/// its error code.
fn elect_preferred(broker: &Broker) -> i16 {
    use kafka_protocol::messages::elect_leaders_request::TopicPartitions;
    let resp = RawClient::connect_to(addr(broker)).request(
        2,
        &ElectLeadersRequest::default()
            .with_election_type(0)
            .with_topic_partitions(Some(vec![TopicPartitions::default()
                .with_topic(TopicName(s(TOPIC)))
                .with_partitions(vec![0])]))
            .with_timeout_ms(10_000),
    );
    assert_eq!(resp.error_code, 0);
    resp.replica_election_results[0].partition_result[0].error_code
}

/// A join request (`FJJ0` handshake from Raft id `from`, then a JSON frame
/// naming `address`) to the controller of host `to`, written from the
/// test: the answer frame as text, or None when the connection closed
/// without one.
fn join_as(net: &Net, to: usize, from: u64, address: &str) -> Option<String> {
    use std::io::{Read, Write};
    let target = std::net::SocketAddr::from((net.host(to).addr, CONTROLLER_PORT));
    let mut stream = std::net::TcpStream::connect_timeout(&target, Duration::from_secs(5))
        .expect("the controller listener");
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .expect("a timeout");
    let frame = |b: &[u8]| [(b.len() as u32).to_be_bytes().to_vec(), b.to_vec()].concat();
    let mut hello = b"FJJ0".to_vec();
    hello.extend_from_slice(&from.to_be_bytes());
    hello.extend_from_slice(&(to as u64 + 1).to_be_bytes());
    let body = format!(r#"{{"address":"{address}"}}"#);
    stream
        .write_all(&[frame(&hello), frame(body.as_bytes())].concat())
        .expect("the join written");
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).ok()?;
    let mut answer = vec![0u8; u32::from_be_bytes(len) as usize];
    stream.read_exact(&mut answer).ok()?;
    Some(String::from_utf8_lossy(&answer).into_owned())
}

/// Asks every voter in turn (a voter that does not lead names the leader)
/// until one answers other than with the leader's id: that answer.
fn join_answer(net: &Net, from: u64, address: &str) -> String {
    common::wait_for(SETTLE, "a join answer from the leader", || {
        (0..VOTERS)
            .filter_map(|to| join_as(net, to, from, address))
            .find(|a| !a.contains("Leader"))
    })
}

/// Kafka's `kafka-cluster unregister --id 3000`, then every voter applies
/// the removal of node 3's learner (its `times`th) and DescribeCluster
/// lists the voters only.
fn unregister_node3(brokers: &[Broker], times: usize) {
    let bootstrap = brokers[0].bootstrap();
    let run = kafka_tool(
        "kafka-cluster",
        &[
            "unregister",
            "--bootstrap-server",
            &bootstrap,
            "--id",
            "3000",
        ],
    );
    assert!(run.success(), "kafka-cluster unregister failed");
    for b in &brokers[..VOTERS] {
        common::wait_for(SETTLE, "every voter to apply the learner's removal", || {
            (count_lines(b, "metadata quorum: a learner left") == times).then_some(())
        });
        assert_eq!(cluster(b), vec![0, 1000, 2000], "DescribeCluster");
    }
}

/// Node 3 listed by DescribeCluster on every node again, after its
/// `additions`th addition to the quorum on every voter.
fn wait_node3_listed(brokers: &[Broker], additions: usize) {
    for b in brokers {
        common::wait_for(SETTLE, "DescribeCluster to list node 3 again", || {
            (cluster(b) == [0, 1000, 2000, 3000]).then_some(())
        });
    }
    for b in &brokers[..VOTERS] {
        assert_eq!(
            count_lines(b, "metadata quorum: a learner joined"),
            additions
        );
    }
}

fn count_lines(broker: &Broker, needle: &str) -> usize {
    broker
        .stderr_since(0)
        .lines()
        .filter(|l| l.contains(needle))
        .count()
}

#[test]
fn a_node_joins_a_running_cluster_as_a_learner_and_takes_a_replica() {
    let net = Net::new(VOTERS + 1);
    let lag = lag();
    let mut brokers =
        common::cluster::start_all(&net, VOTERS, SESSION_TIMEOUT_MS, SETTLE, |_| &lag);
    common::cluster::create_assigned(
        &brokers,
        TOPIC,
        &[0, 1000, 2000],
        &[("min.insync.replicas", "1")],
    );
    wait_listed(&brokers[0], "the topic on the three voters", |l| {
        l.leader == 0 && l.isr == [0, 1000, 2000]
    });
    let mut written = produce(&brokers[0], "a", 20);

    // Joins the quorum refuses, never crashing: a voter's id, a voter's
    // address, an address that is not HOST:PORT; an undecodable request
    // closes its connection unanswered.
    let node3 = format!("{}:{CONTROLLER_PORT}", net.host(VOTERS).addr);
    let voter0 = format!("{}:{CONTROLLER_PORT}", net.host(0).addr);
    assert!(join_answer(&net, 2, &node3).contains("Refused"));
    assert!(join_answer(&net, 4, &voter0).contains("Refused"));
    assert!(join_answer(&net, 4, "no port").contains("Refused"));
    assert_eq!(join_as(&net, 0, 4, "\"}"), None);

    // Node 3 joins.
    brokers.push(start_learner(&net));
    for b in &brokers {
        common::cluster::wait_brokers(b, VOTERS + 1, SETTLE);
        assert_eq!(cluster(b), vec![0, 1000, 2000, 3000], "DescribeCluster");
    }
    common::wait_for(SETTLE, "node 3 to say it joined", || {
        (count_lines(&brokers[3], "joined the metadata quorum as a learner") == 1).then_some(())
    });
    // The learner knows the topic from the replicated log.
    wait_listed(&brokers[3], "node 3 to know the topic", |l| l.leader == 0);
    // Its address is its own: another node may not take it, nor it another.
    assert!(join_answer(&net, 6, &node3).contains("Refused"));
    assert!(join_answer(&net, 4, "10.77.99.1:9093").contains("Refused"));
    assert_eq!(join_answer(&net, 4, &node3), r#""Joined""#, "idempotent");

    // A new topic may place a replica on it (and have it lead).
    common::cluster::create_assigned(&brokers, "placed", &[3000, 0], &[]);
    for b in &brokers {
        common::wait_for(SETTLE, "the placed topic led by node 3, in sync", || {
            listed(b, "placed")
                .filter(|l| l.leader == 3000 && l.isr == [0, 3000])
                .map(|_| ())
        });
    }

    // Kafka's `kafka-reassign-partitions` moves the placed topic's
    // replica on node 0 to node 1: --execute, then --verify until complete.
    {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let plan = dir.path().join("reassignment.json");
        std::fs::write(
            &plan,
            r#"{"version":1,"partitions":[{"topic":"placed","partition":0,"replicas":[3000,1000],"log_dirs":["any","any"]}]}"#,
        )
        .expect("the plan written");
        let bootstrap = brokers[3].bootstrap();
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
        let run = kafka_tool("kafka-reassign-partitions", &args("--execute"));
        assert!(run.success(), "--execute failed");
        common::wait_for(SETTLE, "--verify to report it complete", || {
            let run = kafka_tool("kafka-reassign-partitions", &args("--verify"));
            assert!(run.success(), "--verify failed");
            run.stdout
                .contains("Reassignment of partition placed-0 is completed.")
                .then_some(())
        });
        for b in &brokers {
            common::wait_for(SETTLE, "every node to list the placed topic moved", || {
                listed(b, "placed")
                    .filter(|l| l.replicas == [3000, 1000] && l.isr == [1000, 3000])
                    .map(|_| ())
            });
        }
    }

    // A replica on node 3, node 0 out: it copies the log, joins the ISR.
    assert_eq!(reassign(&brokers[1], &[3000, 1000, 2000]), 0);
    let mut moved = None;
    for b in &brokers {
        moved = Some(wait_listed(
            b,
            "the partition on nodes 3, 1 and 2, all in sync",
            |l| l.replicas == [3000, 1000, 2000] && l.isr == [1000, 2000, 3000] && l.leader >= 0,
        ));
    }
    let leader = moved.expect("four nodes").leader as usize / 1000;
    written.extend(produce(&brokers[leader], "b", 5));
    // Node 3 leads it after a preferred election (it is the first replica).
    let code = elect_preferred(&brokers[1]);
    assert!(
        code == 0 || code == ResponseError::ElectionNotNeeded.code(),
        "ElectLeaders: {code}"
    );
    for b in &brokers {
        wait_listed(b, "node 3 to lead the partition", |l| l.leader == 3000);
    }
    written.extend(produce(&brokers[3], "c", 5));
    written.sort();
    assert_eq!(
        common::cluster::sorted_values(&brokers[3], TOPIC, written.len(), SETTLE),
        written
    );

    // Node 3 is killed (SIGKILL) and restarts; a topic is created while
    // it is down.
    brokers[3].kill9();
    common::cluster::create_assigned(&brokers[..VOTERS], "later", &[1000, 2000], &[]);
    brokers[3].restart();
    common::wait_for(SETTLE, "node 3 to know the later topic", || {
        listed(&brokers[3], "later").map(|_| ())
    });
    common::cluster::wait_brokers(&brokers[3], VOTERS + 1, SETTLE);
    wait_listed(&brokers[1], "node 3 back in the ISR", |l| {
        l.isr == [1000, 2000, 3000]
    });
    assert_eq!(
        common::cluster::sorted_values(&brokers[3], TOPIC, written.len(), SETTLE),
        written
    );

    // Node 3 is paused (SIGSTOP) and unregistered with Kafka's tool: the
    // quorum's leader removes its learner, which every voter applies.
    // Resumed, it hears nothing from a leader any more, asks to join again,
    // is added again and registers.
    brokers[3].signal("-STOP");
    unregister_node3(&brokers, 1);
    brokers[3].signal("-CONT");
    wait_node3_listed(&brokers, 2);
    assert!(
        count_lines(
            &brokers[3],
            "hears nothing from a leader; asking to join again"
        ) >= 1,
        "the running learner noticed its removal"
    );
    // Stopped and unregistered, then started again: it joins again at its
    // start, registers, and is listed and in sync again.
    brokers[3].stop();
    unregister_node3(&brokers, 2);
    brokers[3].restart();
    wait_node3_listed(&brokers, 3);
    wait_listed(
        &brokers[1],
        "node 3 back in the ISR after it rejoined",
        |l| l.isr == [1000, 2000, 3000],
    );

    for (i, b) in brokers.iter_mut().enumerate() {
        if i == VOTERS {
            assert_eq!(
                count_lines(b, "this node leads the metadata quorum"),
                0,
                "a learner never leads the quorum"
            );
        }
        b.assert_alive();
        b.stop();
    }
}
