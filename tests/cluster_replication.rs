//! Replicated partitions on three nodes (`docs/replication.md` §4, §9 step
//! 3), each node in its own network namespace (`common::netns`) with one
//! shard, a quorum of all three:
//! - CreateTopics with replication factor 3: every node's Metadata lists
//!   three replicas, all in the ISR, and one leader;
//! - what librdkafka produces to the leaders (acks=1, and an idempotent
//!   producer) reaches every replica: each partition's segment on all
//!   three nodes holds the same batches, byte for byte, and consumers read
//!   every message back;
//! - a follower SIGKILLed while more is produced catches up after its
//!   restart, byte for byte;
//! - killed again, it misses more of the current epoch while a leader's
//!   node restarts, after which its partitions are led in the next leader
//!   epoch (a PartitionChange: its restart's, or an election if it was
//!   fenced first) and more is produced in it: restarted, the follower
//!   fetches both epochs' batches (its log, opened without an epoch of
//!   its own, takes the older epoch's), byte for byte, and every replica's
//!   `leader-epoch-checkpoint` is the leader's and names both epochs;
//! - with both other nodes killed, acks=1 writes to partition 0's leader
//!   leave its HW (ListOffsets LATEST) where it was, and so does a clean
//!   restart of the leader: the HW comes from its
//!   `replication-offset-checkpoint`, not from its log end (issue 30).

mod common;

use common::cluster::{addr, PartitionView};

use common::client;
use common::netns::Net;
use common::raw::RawClient;
use common::Broker;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use std::time::Duration;

/// How long the quorum gets to elect, and followers to catch up.
const SETTLE: Duration = Duration::from_secs(60);
/// `--broker-session-timeout-ms`, shortened from Kafka's 9 s.
const SESSION_TIMEOUT_MS: u64 = 3000;
const TOPIC: &str = "replicated";
const PARTITIONS: i32 = 2;
const NODES: usize = 3;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn start(net: &Net, i: usize) -> Broker {
    start_with(net, i, &[])
}

/// Node `i` with `extra` arguments.
fn start_with(net: &Net, i: usize, extra: &[String]) -> Broker {
    common::cluster::start_node(net, i, NODES, SESSION_TIMEOUT_MS, extra)
}

/// CreateTopics of [`TOPIC`] with replication factor 3 through the first
/// node that takes it (any node forwards once a quorum leader is known).
fn create_replicated(brokers: &[Broker]) {
    create_topic(brokers, TOPIC, PARTITIONS, &[]);
}

/// CreateTopics of `name` (`partitions`, replication factor 3, `configs`)
/// through the first node that takes it.
fn create_topic(brokers: &[Broker], name: &str, partitions: i32, configs: &[(&str, &str)]) {
    common::cluster::create_topic(brokers, name, partitions, NODES as i16, configs);
}

/// One partition as a node's Metadata (v12) lists it, broker ids sorted.
type Listed = PartitionView;

/// [`TOPIC`]'s partitions in `broker`'s Metadata, by index; None if it is
/// not listed.
fn listed(broker: &Broker) -> Option<Vec<Listed>> {
    listed_topic(broker, TOPIC)
}

/// `topic`'s partitions in `broker`'s Metadata, by index, broker ids
/// sorted; None if it is not listed.
fn listed_topic(broker: &Broker, topic: &str) -> Option<Vec<Listed>> {
    let views = common::cluster::partitions(broker, topic)?;
    Some(views.into_iter().map(PartitionView::sorted).collect())
}

/// Waits until every node lists every partition of [`TOPIC`] alike, led,
/// with three replicas (one per node) all in the ISR, each leader's epoch
/// at least `min_epochs[p]`; returns that listing.
fn wait_listed_everywhere(brokers: &[Broker], min_epochs: &[i32]) -> Vec<Listed> {
    let all: Vec<i32> = (0..NODES as i32).map(|n| n * 1000).collect();
    common::wait_for(SETTLE, "every node to list the replicated topic", || {
        let first = listed(&brokers[0])?;
        if first.len() != PARTITIONS as usize {
            return None;
        }
        for (p, l) in first.iter().enumerate() {
            if l.error != 0
                || l.leader < 0
                || l.replicas != all
                || l.isr != all
                || l.leader_epoch < min_epochs[p]
            {
                return None;
            }
        }
        brokers[1..]
            .iter()
            .all(|b| listed(b).as_ref() == Some(&first))
            .then_some(first)
    })
}

/// The node index of broker `id` (one shard per node).
fn node(id: i32) -> usize {
    usize::try_from(id / 1000).expect("a node id")
}

/// The batches of `broker`'s replica of partition `p`, as bytes, and the
/// records they hold.
fn stored(broker: &Broker, p: i32) -> (Vec<u8>, usize) {
    let batches = common::disk::batches(&broker.first_segment(TOPIC, p));
    let records = batches
        .iter()
        .map(|b| b.header.records_count.max(0) as usize)
        .sum();
    (batches.into_iter().flat_map(|b| b.bytes).collect(), records)
}

/// Waits until each partition's segment is byte for byte the same on
/// every node, and the partitions hold `records` records together.
fn wait_identical(brokers: &[Broker], records: usize, what: &str) {
    let all: Vec<&Broker> = brokers.iter().collect();
    wait_identical_among(&all, records, what);
}

/// [`wait_identical`] among `brokers` only.
fn wait_identical_among(brokers: &[&Broker], records: usize, what: &str) {
    common::wait_for(SETTLE, what, || {
        let mut total = 0;
        for p in 0..PARTITIONS {
            let (bytes, n) = stored(brokers[0], p);
            for b in &brokers[1..] {
                if stored(b, p).0 != bytes {
                    return None;
                }
            }
            total += n;
        }
        (total == records).then_some(())
    });
}

/// Produces the numbered messages `ids` with librdkafka, bootstrapped at
/// `broker`, with `extra` settings; every one must be delivered.
fn produce(broker: &Broker, ids: std::ops::Range<usize>, extra: &[(&str, &str)]) {
    let producer = client::producer(&broker.bootstrap(), extra);
    let n = ids.len();
    for id in ids {
        client::send(
            &producer,
            TOPIC,
            &client::TestMessage {
                id,
                key: format!("k{id}").into_bytes(),
                value: id.to_string().into_bytes(),
                headers: vec![],
            },
        );
    }
    for d in client::await_deliveries(&producer, n, SETTLE) {
        assert!(d.error.is_none(), "delivery failed: {:?}", d.error);
    }
}

/// Reads every message of [`TOPIC`] back, bootstrapped at `broker`: the
/// ids `0..count`, once each.
fn read_back(broker: &Broker, count: usize) {
    let got = client::consume(
        &broker.bootstrap(),
        TOPIC,
        PARTITIONS,
        count,
        Duration::from_millis(500),
        SETTLE,
    );
    let mut ids: Vec<usize> = got
        .iter()
        .map(|m| {
            std::str::from_utf8(m.value.as_deref().unwrap_or_default())
                .expect("utf-8")
                .parse()
                .expect("a number")
        })
        .collect();
    ids.sort();
    assert_eq!(ids, (0..count).collect::<Vec<_>>());
}

/// The (epoch, start offset) entries of `broker`'s `leader-epoch-checkpoint`
/// of partition `p`.
fn epoch_checkpoint(broker: &Broker, p: i32) -> Vec<(i32, i64)> {
    let path = broker
        .data_dir()
        .join(format!("{TOPIC}-{p}"))
        .join("leader-epoch-checkpoint");
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    text.lines()
        .skip(2)
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
        })
        .collect()
}

#[test]
fn three_replicas_copy_the_leader_through_kills_and_restarts() {
    let net = Net::new(NODES);
    let mut brokers: Vec<Broker> = (0..NODES).map(|i| start(&net, i)).collect();
    create_replicated(&brokers);
    let first = wait_listed_everywhere(&brokers, &[0; PARTITIONS as usize]);
    for b in &brokers {
        for p in 0..PARTITIONS {
            assert!(
                b.data_dir().join(format!("{TOPIC}-{p}")).exists(),
                "every node holds a replica of partition {p}"
            );
        }
    }

    // acks=1, then an idempotent producer (acks=all, as librdkafka
    // requires for idempotence), both bootstrapped at one node: each
    // follows Metadata to the leaders.
    let mut sent = 0;
    produce(
        &brokers[0],
        sent..sent + 40,
        &[("acks", "1"), ("linger.ms", "5")],
    );
    sent += 40;
    produce(
        &brokers[1],
        sent..sent + 40,
        &[("enable.idempotence", "true"), ("linger.ms", "5")],
    );
    sent += 40;
    wait_identical(&brokers, sent, "three identical replicas");
    read_back(&brokers[2], sent);

    // A node that leads no partition (so every partition stays writable)
    // dies; more is produced; restarted, it catches up byte for byte.
    let leader0 = node(first[0].leader);
    let follower = (0..NODES)
        .find(|&i| first.iter().all(|l| node(l.leader) != i))
        .expect("a node leading nothing");
    brokers[follower].kill9();
    let alive = (follower + 1) % NODES;
    produce(
        &brokers[alive],
        sent..sent + 30,
        &[("acks", "1"), ("linger.ms", "5")],
    );
    sent += 30;
    brokers[follower].restart();
    wait_identical(&brokers, sent, "the restarted follower to catch up");

    // The follower dies again and misses more of the current epoch. The
    // node leading partition 0 restarts meanwhile (once the third node
    // holds what it led, so no acknowledged write is lost whoever leads
    // next): its partitions go to the next leader epoch, by its restart
    // (PartitionChange) or, if it was fenced first, by the election of the
    // third node; more is produced in it. The follower, restarted, fetches
    // the older epoch's batches it lacks (its log, opened without an epoch
    // of its own, takes them), then the new epoch's.
    brokers[follower].kill9();
    produce(
        &brokers[alive],
        sent..sent + 20,
        &[("acks", "1"), ("linger.ms", "5")],
    );
    sent += 20;
    let third = (0..NODES)
        .find(|&i| i != follower && i != leader0)
        .expect("a third node");
    wait_identical_among(
        &[&brokers[leader0], &brokers[third]],
        sent,
        "the third node to hold what the leader holds",
    );
    let before: Vec<i32> = first.iter().map(|l| l.leader_epoch).collect();
    brokers[leader0].restart();
    let mut want: Vec<i32> = before.clone();
    for (p, l) in first.iter().enumerate() {
        if node(l.leader) == leader0 {
            want[p] = before[p] + 1;
        }
    }
    let up = [&brokers[leader0], &brokers[third]];
    common::wait_for(SETTLE, "partition 0's next leader epoch", || {
        up.iter()
            .all(|b| {
                listed(b).is_some_and(|l| {
                    l.iter()
                        .zip(&want)
                        .all(|(l, &w)| l.leader_epoch >= w && l.leader >= 0 && l.error == 0)
                })
            })
            .then_some(())
    });
    produce(
        &brokers[third],
        sent..sent + 30,
        &[("acks", "1"), ("linger.ms", "5")],
    );
    sent += 30;
    brokers[follower].restart();
    let after = wait_listed_everywhere(&brokers, &want);
    produce(
        &brokers[follower],
        sent..sent + 30,
        &[("acks", "1"), ("linger.ms", "5")],
    );
    sent += 30;
    wait_identical(
        &brokers,
        sent,
        "three identical replicas after the leader restarted",
    );
    for p in 0..PARTITIONS {
        let at_leader = epoch_checkpoint(&brokers[node(after[p as usize].leader)], p);
        for (i, b) in brokers.iter().enumerate() {
            assert_eq!(
                epoch_checkpoint(b, p),
                at_leader,
                "node {i}'s leader-epoch-checkpoint of partition {p}"
            );
        }
        let named: Vec<i32> = at_leader.iter().map(|e| e.0).collect();
        let (old, new) = (before[p as usize], after[p as usize].leader_epoch);
        if new != old {
            assert!(
                named.contains(&old) && named.contains(&new),
                "partition {p}'s epochs {at_leader:?} name {old} and {new}"
            );
        }
    }
    read_back(&brokers[follower], sent);
    for b in &mut brokers {
        b.assert_alive();
    }

    // Issue 30: the HW survives a restart (`replication-offset-checkpoint`).
    // Both other nodes die: no follower fetches, and no metadata change can
    // be committed (no quorum), so partition 0's ISR stays whole and its
    // leader's HW stays where it is while acks=1 writes go past it. The
    // leader restarts cleanly, alone: its HW checkpoint holds the HW, not
    // its log end; and with no quorum to register with it leads nothing
    // (`ShardCtx::registered_in`), whatever its own image says.
    let lead = node(after[0].leader);
    let hw = latest(&brokers[lead], 0);
    for (i, b) in brokers.iter_mut().enumerate() {
        if i != lead {
            b.kill9();
        }
    }
    let mut raw = RawClient::connect_to(addr(&brokers[lead]));
    common::raw::produce_values(&mut raw, TOPIC, 0, 5);
    assert_eq!(latest(&brokers[lead], 0), hw, "no follower fetched them");
    brokers[lead].restart();
    let refused = {
        use kafka_protocol::messages::list_offsets_request::{
            ListOffsetsPartition, ListOffsetsTopic,
        };
        let partition = ListOffsetsPartition::default()
            .with_partition_index(0)
            .with_current_leader_epoch(-1)
            .with_timestamp(-1);
        let topic = ListOffsetsTopic::default()
            .with_name(TopicName(s(TOPIC)))
            .with_partitions(vec![partition]);
        RawClient::connect_to(addr(&brokers[lead])).request(
            7,
            &ListOffsetsRequest::default()
                .with_replica_id((-1).into())
                .with_topics(vec![topic]),
        )
    };
    assert_eq!(
        refused.topics[0].partitions[0].error_code,
        ResponseError::NotLeaderOrFollower.code(),
        "a node not registered with the quorum leads nothing"
    );
    let checkpoint = std::fs::read_to_string(
        brokers[lead]
            .data_dir()
            .join("replication-offset-checkpoint.shard-0"),
    )
    .unwrap_or_default();
    assert!(
        checkpoint.lines().any(|l| l == format!("{TOPIC} 0 {hw}")),
        "{checkpoint:?}"
    );
    brokers[lead].stop();
}

/// Partition `p`'s ListOffsets LATEST at `broker`, its leader: the HW.
fn latest(broker: &Broker, p: i32) -> i64 {
    common::cluster::latest(broker, TOPIC, p, SETTLE)
}

/// `--replica-lag-time-max-ms` of the ISR test, shortened from Kafka's
/// 30 s.
const LAG_MS: u64 = 2000;

/// Partition 0 of `topic` as `broker` lists it, once it satisfies `ok`.
fn wait_partition0(
    broker: &Broker,
    topic: &str,
    what: &str,
    ok: impl Fn(&Listed) -> bool,
) -> Listed {
    common::wait_for(SETTLE, what, || {
        let l = listed_topic(broker, topic)?.into_iter().next()?;
        ok(&l).then_some(l)
    })
}

/// One record of value `value` to partition 0 of `topic` at `broker`,
/// with `acks`: the partition's error code.
fn produce_one(broker: &Broker, topic: &str, acks: i16, value: &str) -> i16 {
    let batch = common::leader::one_batch(value);
    let resp = RawClient::connect_to(addr(broker))
        .request(9, &common::raw::produce_request(topic, 0, acks, batch));
    common::raw::only_partition(&resp).error_code
}

/// The eligible leader replicas of partition 0 of `topic` in `broker`'s
/// DescribeTopicPartitions.
fn elr(broker: &Broker, topic: &str) -> Vec<i32> {
    use kafka_protocol::messages::describe_topic_partitions_request::TopicRequest;
    let resp = RawClient::connect_to(addr(broker)).request(
        0,
        &DescribeTopicPartitionsRequest::default()
            .with_topics(vec![TopicRequest::default().with_name(TopicName(s(topic)))])
            .with_response_partition_limit(10),
    );
    let p = &resp.topics[0].partitions[0];
    let mut v: Vec<i32> = p
        .eligible_leader_replicas
        .iter()
        .flatten()
        .map(|b| b.0)
        .collect();
    v.sort();
    v
}

/// ElectLeaders (preferred) of partition 0 of `topic` through `broker`:
/// its error code.
fn elect_preferred(broker: &Broker, topic: &str) -> i16 {
    use kafka_protocol::messages::elect_leaders_request::TopicPartitions;
    let resp = RawClient::connect_to(addr(broker)).request(
        2,
        &ElectLeadersRequest::default()
            .with_election_type(0)
            .with_topic_partitions(Some(vec![TopicPartitions::default()
                .with_topic(TopicName(s(topic)))
                .with_partitions(vec![0])]))
            .with_timeout_ms(10_000),
    );
    assert_eq!(resp.error_code, 0);
    resp.replica_election_results[0].partition_result[0].error_code
}

/// The values of `topic` (one partition) read back with librdkafka
/// bootstrapped at `broker`, `count` of them at least.
fn values(broker: &Broker, topic: &str, count: usize) -> Vec<String> {
    let got = client::consume(
        &broker.bootstrap(),
        topic,
        1,
        count,
        Duration::from_millis(500),
        SETTLE,
    );
    got.iter()
        .map(|m| String::from_utf8_lossy(m.value.as_deref().unwrap_or_default()).into_owned())
        .collect()
}

fn sorted(mut v: Vec<i32>) -> Vec<i32> {
    v.sort();
    v
}

/// acks=all and the ISR (`docs/replication.md` §4.1, §4.3, §4.4), three
/// nodes, two topics of three replicas, `failover` with
/// `min.insync.replicas=2` and `strict` with 3:
/// - all in sync, acks=all is answered on both;
/// - a node leading neither dies: both ISRs shrink to the two live
///   replicas; `failover` still takes acks=all, `strict` (now below its
///   minimum) refuses it with NOT_ENOUGH_REPLICAS and lists the dead
///   replica as eligible (KIP-966 ELR), and still takes acks=1; back, the
///   node rejoins both ISRs and `strict` takes acks=all again;
/// - `failover`'s leader dies: a live ISR member leads in the next epoch,
///   holds every acks=all record ever acknowledged, and takes more; the
///   old leader restarts as a follower and every replica ends identical;
/// - a preferred-leader election gives the partition back to its first
///   replica in a new epoch; a second one is ELECTION_NOT_NEEDED;
/// - every acknowledged acks=all record is read back exactly once.
#[test]
fn acks_all_follows_the_isr_and_leaders_fail_over_within_it() {
    let net = Net::new(NODES);
    let lag = [format!("--replica-lag-time-max-ms={LAG_MS}")];
    let mut brokers: Vec<Broker> = (0..NODES).map(|i| start_with(&net, i, &lag)).collect();
    create_topic(&brokers, "failover", 1, &[("min.insync.replicas", "2")]);
    create_topic(&brokers, "strict", 1, &[("min.insync.replicas", "3")]);
    let everyone: Vec<i32> = (0..NODES as i32).map(|n| n * 1000).collect();
    let in_sync = |l: &Listed| l.leader >= 0 && l.isr == everyone;
    let f = wait_partition0(&brokers[0], "failover", "failover in sync", in_sync);
    let st = wait_partition0(&brokers[0], "strict", "strict in sync", in_sync);
    let not_enough = ResponseError::NotEnoughReplicas.code();
    // A new partition's ISR is all its replicas from the start, so node 0
    // can list it before its leader's node has applied the creation: wait
    // until each leader's own node lists itself as leader.
    for (l, topic) in [(&f, "failover"), (&st, "strict")] {
        wait_partition0(&brokers[node(l.leader)], topic, "the leader to know", |m| {
            m.leader == l.leader
        });
    }

    // All in sync: acks=all is answered.
    let mut acked: Vec<String> = Vec::new();
    for i in 0..10 {
        let v = format!("a{i}");
        assert_eq!(produce_one(&brokers[node(f.leader)], "failover", -1, &v), 0);
        acked.push(v);
        assert_eq!(produce_one(&brokers[node(st.leader)], "strict", -1, "s"), 0);
    }

    // A node leading neither topic dies.
    let dead = (0..NODES)
        .find(|&n| n != node(f.leader) && n != node(st.leader))
        .expect("a node leading neither");
    let dead_id = dead as i32 * 1000;
    brokers[dead].kill9();
    let alive: Vec<i32> = everyone.iter().copied().filter(|&b| b != dead_id).collect();
    let shrunk = |l: &Listed| l.isr == alive;
    wait_partition0(
        &brokers[node(f.leader)],
        "failover",
        "failover's ISR without it",
        shrunk,
    );
    for i in 10..20 {
        let v = format!("a{i}");
        assert_eq!(produce_one(&brokers[node(f.leader)], "failover", -1, &v), 0);
        acked.push(v);
    }
    let strict_leader = &brokers[node(st.leader)];
    wait_partition0(strict_leader, "strict", "strict's ISR without it", shrunk);
    assert_eq!(produce_one(strict_leader, "strict", -1, "s"), not_enough);
    assert_eq!(elr(strict_leader, "strict"), vec![dead_id]);
    assert_eq!(produce_one(strict_leader, "strict", 1, "one"), 0);
    brokers[dead].restart();
    wait_partition0(
        &brokers[dead],
        "strict",
        "strict's ISR with it again",
        in_sync,
    );
    wait_partition0(
        &brokers[dead],
        "failover",
        "failover's ISR with it",
        in_sync,
    );
    // Back at the minimum, the ELR empties (as seen by the leader's node
    // once it has applied the change).
    let strict_leader = &brokers[node(st.leader)];
    common::wait_for(SETTLE, "strict's ELR to empty", || {
        elr(strict_leader, "strict").is_empty().then_some(())
    });
    common::wait_for(SETTLE, "strict to take acks=all again", || {
        (produce_one(strict_leader, "strict", -1, "s") == 0).then_some(())
    });

    // Failover's leader dies: another ISR member leads, in the next epoch,
    // with everything acknowledged.
    let old = node(f.leader);
    let before = wait_partition0(&brokers[dead], "failover", "failover", in_sync);
    brokers[old].kill9();
    let survivor = (0..NODES).find(|&n| n != old).expect("a survivor");
    let after = wait_partition0(&brokers[survivor], "failover", "a new leader", |l| {
        l.leader >= 0 && node(l.leader) != old && l.error == 0
    });
    assert!(
        after.leader_epoch > before.leader_epoch,
        "{before:?} then {after:?}"
    );
    assert!(!after.isr.contains(&f.leader), "{after:?}");
    let leader = &brokers[node(after.leader)];
    for i in 20..30 {
        let v = format!("a{i}");
        common::wait_for(SETTLE, "the new leader to take acks=all", || {
            (produce_one(leader, "failover", -1, &v) == 0).then_some(())
        });
        acked.push(v);
    }
    let mut got = values(leader, "failover", acked.len());
    got.sort();
    let mut want = acked.clone();
    want.sort();
    assert_eq!(got, want, "the new leader holds every acknowledged record");

    // The old leader comes back as a follower; all three end identical.
    brokers[old].restart();
    wait_partition0(&brokers[old], "failover", "failover in sync again", |l| {
        in_sync(l) && l.leader == after.leader
    });
    common::wait_for(SETTLE, "identical replicas of failover", || {
        let copies: Vec<Vec<u8>> = brokers
            .iter()
            .map(|b| {
                common::disk::batches(&b.first_segment("failover", 0))
                    .into_iter()
                    .flat_map(|b| b.bytes)
                    .collect()
            })
            .collect();
        copies.iter().all(|c| *c == copies[0]).then_some(())
    });

    // A preferred-leader election gives it back to its first replica.
    assert_eq!(sorted(after.replicas.clone()), everyone);
    assert_eq!(elect_preferred(&brokers[old], "failover"), 0);
    let back = wait_partition0(&brokers[old], "failover", "the preferred leader", |l| {
        l.leader == f.leader && in_sync(l)
    });
    assert!(back.leader_epoch > after.leader_epoch);
    assert_eq!(
        elect_preferred(&brokers[old], "failover"),
        ResponseError::ElectionNotNeeded.code()
    );
    for v in ["b0", "b1"] {
        common::wait_for(SETTLE, "the preferred leader to take acks=all", || {
            (produce_one(&brokers[old], "failover", -1, v) == 0).then_some(())
        });
        acked.push(v.to_string());
    }
    let mut got = values(&brokers[dead], "failover", acked.len());
    got.sort();
    let mut want = acked;
    want.sort();
    assert_eq!(got, want, "every acknowledged record, once");
    for b in &mut brokers {
        b.assert_alive();
        b.stop();
    }
}
