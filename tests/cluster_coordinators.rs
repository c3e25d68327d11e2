//! Coordinator failover on three nodes (`docs/replication.md` §4.6), each
//! node in its own network namespace (`common::netns`) with one shard, a
//! quorum of all three:
//! - the first FindCoordinator creates `__consumer_offsets` and
//!   `__transaction_state` with replication factor 3 (Kafka's
//!   `offsets.topic.replication.factor` / `transaction.state.log.
//!   replication.factor` defaults), listed with three replicas in the ISR;
//! - a consumer group's committed offset, committed by librdkafka, is
//!   served by the next leader of the group's `__consumer_offsets`
//!   partition after the coordinator's node is SIGKILLed, and an offset
//!   committed there survives the SIGKILL of that node too;
//! - a transactional id's state survives the SIGKILL of its
//!   coordinator's node: InitProducerId at the new coordinator gives the
//!   same producer id with the next epoch (a lost state would give a new
//!   producer id at epoch 0), so the old producer is fenced.

mod common;

use common::client;
use common::cluster::{agreed_coordinator, start_node, wait_brokers};
use common::netns::Net;
use common::raw::{init_transactional, RawClient};
use common::Broker;
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use std::time::Duration;

const NODES: usize = 3;
/// `--broker-session-timeout-ms`, shortened from Kafka's 9 s so a killed
/// node is fenced (and its partitions led elsewhere) quickly.
const SESSION_TIMEOUT_MS: u64 = 3000;
/// How long the quorum gets to elect, and a coordinator to move.
const SETTLE: Duration = Duration::from_secs(60);
const TOPIC: &str = "data";
const GROUP: &str = "failover-group";
const TXN_ID: &str = "failover-txn";

fn start(net: &Net, i: usize) -> Broker {
    start_node(net, i, NODES, SESSION_TIMEOUT_MS, &[])
}

/// The bootstrap list of the nodes still running.
fn bootstrap(brokers: &mut [Broker]) -> String {
    brokers
        .iter_mut()
        .filter_map(|b| b.is_running().then(|| b.bootstrap()))
        .collect::<Vec<_>>()
        .join(",")
}

/// Waits until every running node names the same coordinator of `key`,
/// a running node other than `not`; returns its node index and address.
fn wait_coordinator(
    brokers: &mut [Broker],
    key_type: i8,
    key: &str,
    not: Option<usize>,
) -> (usize, std::net::SocketAddr) {
    common::wait_for(SETTLE, &format!("a coordinator of {key}"), || {
        let running: Vec<usize> = (0..NODES).filter(|&i| brokers[i].is_running()).collect();
        let asked: Vec<&Broker> = running.iter().map(|&i| &brokers[i]).collect();
        let first = agreed_coordinator(&asked, key_type, key)?;
        (Some(first.0) != not && running.contains(&first.0)).then_some(first)
    })
}

/// Replicas and ISR (sorted broker ids) of every partition of `topic` as
/// `broker`'s Metadata lists them (none if it is not listed).
fn replicas_and_isr(broker: &Broker, topic: &str) -> Vec<(Vec<i32>, Vec<i32>)> {
    common::cluster::partitions(broker, topic)
        .unwrap_or_default()
        .into_iter()
        .map(|p| {
            let p = p.sorted();
            (p.replicas, p.isr)
        })
        .collect()
}

/// Commits `offset` for partition 0 of [`TOPIC`] as a member of
/// [`GROUP`] would (librdkafka, synchronously), retried until the
/// coordinator takes it.
fn commit(brokers: &mut [Broker], offset: i64) {
    let consumer = client::consumer(&bootstrap(brokers), &[("group.id", GROUP)]);
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(TOPIC, 0, Offset::Offset(offset))
        .expect("offset");
    common::wait_for(
        SETTLE,
        &format!("a commit of offset {offset}"),
        || match consumer.commit(&tpl, CommitMode::Sync) {
            Ok(()) => Some(()),
            Err(e) => {
                eprintln!("commit of {offset}: {e}; retrying");
                std::thread::sleep(Duration::from_millis(200));
                None
            }
        },
    );
}

/// [`GROUP`]'s committed offset of partition 0 of [`TOPIC`], read by a
/// new librdkafka consumer (retried until the coordinator answers).
fn committed(brokers: &mut [Broker]) -> i64 {
    let consumer = client::consumer(&bootstrap(brokers), &[("group.id", GROUP)]);
    let mut want = TopicPartitionList::new();
    want.add_partition(TOPIC, 0);
    common::wait_for(SETTLE, "the committed offset", || {
        match consumer.committed_offsets(want.clone(), Duration::from_secs(10)) {
            Ok(got) => match got.find_partition(TOPIC, 0)?.offset() {
                Offset::Offset(o) => Some(o),
                other => panic!("no committed offset: {other:?}"),
            },
            Err(e) => {
                eprintln!("committed offsets: {e}; retrying");
                std::thread::sleep(Duration::from_millis(200));
                None
            }
        }
    })
}

#[test]
fn coordinators_fail_over_with_their_partitions_leaders() {
    let net = Net::new(NODES);
    let mut brokers: Vec<Broker> = (0..NODES).map(|i| start(&net, i)).collect();
    for b in &brokers {
        wait_brokers(b, NODES, SETTLE);
    }
    client::create_topic(&bootstrap(&mut brokers), TOPIC, 1, &[]);

    // The group's coordinator, on a replicated __consumer_offsets.
    commit(&mut brokers, 42);
    assert_eq!(committed(&mut brokers), 42);
    for name in ["__consumer_offsets"] {
        let listed = replicas_and_isr(&brokers[0], name);
        assert_eq!(listed.len(), 50, "{name} has Kafka's 50 partitions");
        for (replicas, _) in &listed {
            assert_eq!(replicas.len(), 3, "{name}: three replicas each: {listed:?}");
        }
    }
    let (first, _) = wait_coordinator(&mut brokers, 0, GROUP, None);

    // Its node killed: the next leader of the partition serves the offset.
    brokers[first].kill9();
    let (second, _) = wait_coordinator(&mut brokers, 0, GROUP, Some(first));
    assert_eq!(
        committed(&mut brokers),
        42,
        "the offset committed at node {first} is served by node {second}"
    );
    commit(&mut brokers, 43);
    brokers[first].restart();
    for b in &brokers {
        wait_brokers(b, NODES, SETTLE);
    }
    // The second coordinator killed: the offset it took survives.
    brokers[second].kill9();
    let (third, _) = wait_coordinator(&mut brokers, 0, GROUP, Some(second));
    assert_eq!(
        committed(&mut brokers),
        43,
        "the offset committed at node {second} is served by node {third}"
    );
    brokers[second].restart();
    for b in &brokers {
        wait_brokers(b, NODES, SETTLE);
    }

    // A transactional id's state, on a replicated __transaction_state.
    let (txn_node, txn_addr) = wait_coordinator(&mut brokers, 1, TXN_ID, None);
    let (pid, epoch) =
        init_transactional(&mut RawClient::connect_to(txn_addr), TXN_ID).expect("init");
    let listed = replicas_and_isr(&brokers[0], "__transaction_state");
    assert_eq!(listed.len(), 50);
    assert!(listed.iter().all(|(r, _)| r.len() == 3), "{listed:?}");
    brokers[txn_node].kill9();
    let (_, moved_to) = wait_coordinator(&mut brokers, 1, TXN_ID, Some(txn_node));
    let again = init_transactional(&mut RawClient::connect_to(moved_to), TXN_ID)
        .expect("init at the new coordinator");
    assert_eq!(
        again,
        (pid, epoch + 1),
        "the new coordinator knows the id: same producer id, next epoch"
    );
}
