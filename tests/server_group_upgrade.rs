//! Online upgrade of a classic group to the KIP-848 consumer protocol
//! (Kafka 4.x's mixed groups), end to end with librdkafka: two classic
//! members (`group.protocol=classic`, eager `range`) share a 12-partition
//! topic; they are replaced one by one by `group.protocol=consumer`
//! members while messages flow. The first consumer-protocol member's
//! ConsumerGroupHeartbeat converts the group; the classic members stay,
//! served by the consumer group through JoinGroup/SyncGroup/Heartbeat.
//! Checked at every step: assignments disjoint and complete, nothing lost,
//! nothing read twice after a commit; at the end the group is a
//! `consumer` group (ListGroups, ConsumerGroupDescribe). On fjord the
//! broker is also restarted while the group is mixed. A second scenario
//! downgrades: the only consumer-protocol member leaves and the group is
//! a classic group again, its classic members sharing the partitions.
//!
//! `FJORD_TEST_BROKER=kafka:HOST:PORT` runs both scenarios (without the
//! restart) against stock Kafka (`scripts/kafka-peer.sh start`).

mod common;

use bytes::Bytes;
use common::client::{create_topic, produce_numbered};
use common::groups::{self, assigned, classic_join, consumer_heartbeat, poll_until, Member, Seen};
use common::raw::{group_coordinator_port, wait_group_coordinator_port, RawClient};
use common::target::Target;
use common::BrokerOpts;
use fjord::group::consumer_protocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    ConsumerGroupDescribeRequest, GroupId, HeartbeatRequest, LeaveGroupRequest, ListGroupsRequest,
    SyncGroupRequest,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::consumer::{CommitMode, Consumer};
use std::collections::HashSet;
use std::time::Duration;

const PARTITIONS: i32 = 12;
const TIMEOUT: Duration = Duration::from_secs(120);

/// One scenario: a broker (or stock Kafka) with a [`PARTITIONS`]-partition
/// topic and the group its members join, both named `{name}-{pid}`.
struct Scenario {
    target: Target,
    bootstrap: String,
    group: String,
    topic: String,
}

impl Scenario {
    fn start(name: &str) -> Scenario {
        let target = Target::start(
            BrokerOpts::default()
                .cores(2)
                .arg("--group-consumer-heartbeat-interval-ms")
                .arg("300"),
        );
        eprintln!("target: {}", target.label());
        let bootstrap = target.bootstrap();
        let group = format!("{name}-{}", std::process::id());
        let topic = group.clone();
        create_topic(&bootstrap, &topic, PARTITIONS, &[]);
        Scenario {
            target,
            bootstrap,
            group,
            topic,
        }
    }

    /// A member speaking `protocol` (`classic` or `consumer`), subscribed
    /// to the topic.
    fn member(&self, protocol: &str) -> Member {
        let classic: &[(&str, &str)] = &[
            ("session.timeout.ms", "10000"),
            ("heartbeat.interval.ms", "300"),
        ];
        let extra: &[(&str, &str)] = if protocol == "classic" { classic } else { &[] };
        let m = groups::member(&self.bootstrap, &self.group, protocol, extra);
        m.subscribe(&[self.topic.as_str()]).expect("subscribe");
        m
    }

    /// Produces `ids` on a thread while the members settle, then reads
    /// them all and commits.
    fn step(&self, members: &[&Member], seen: &mut Seen, ids: std::ops::Range<usize>, what: &str) {
        let end = ids.end;
        let producing = std::thread::spawn({
            let bootstrap = self.bootstrap.clone();
            let topic = self.topic.clone();
            move || produce_numbered(&bootstrap, &topic, ids, TIMEOUT)
        });
        settle_disjoint(members, seen, what);
        producing.join().expect("producer thread");
        poll_until(members, seen, what, |s| s.by_id.len() >= end);
        for m in members {
            m.commit_consumer_state(CommitMode::Sync).expect("commit");
        }
    }

    /// Two classic members share the topic (ids 0..2000); then a
    /// consumer-protocol member joins and the group is upgraded, the
    /// classic members staying in it (ids 2000..4000): (c1, c2, k1).
    fn upgrade(&self, seen: &mut Seen) -> (Member, Member, Member) {
        let port = self.target.port();
        let c1 = self.member("classic");
        let c2 = self.member("classic");
        self.step(&[&c1, &c2], seen, 0..2_000, "two classic members");
        assert_eq!(listed(port, &self.group).0, "classic");
        let k1 = self.member("consumer");
        self.step(&[&c1, &c2, &k1], seen, 2_000..4_000, "upgraded: c1, c2, k1");
        assert_eq!(listed(port, &self.group).0, "consumer");
        (c1, c2, k1)
    }
}

/// Polls until the members' assignments are non-empty, disjoint and cover
/// every partition, and asserts that they are disjoint.
fn settle_disjoint(members: &[&Member], seen: &mut Seen, what: &str) {
    poll_until(members, seen, what, |_| {
        let sets: Vec<_> = members.iter().map(|m| assigned(m)).collect();
        let all: HashSet<_> = sets.iter().flatten().collect();
        sets.iter().all(|s| !s.is_empty())
            && sets.iter().map(HashSet::len).sum::<usize>() == PARTITIONS as usize
            && all.len() == PARTITIONS as usize
    });
    let sets: Vec<_> = members.iter().map(|m| assigned(m)).collect();
    let mut all = HashSet::new();
    for s in &sets {
        for tp in s {
            assert!(all.insert(tp), "{tp:?} assigned twice: {sets:?}");
        }
    }
    eprintln!("{what}: {sets:?}");
}

/// (type, state) of the group in ListGroups v5.
fn listed(port: u16, group: &str) -> (String, String) {
    let mut raw = RawClient::connect(group_coordinator_port(port, group));
    let r = raw.request(5, &ListGroupsRequest::default());
    let g = r
        .groups
        .iter()
        .find(|g| g.group_id.as_str() == group)
        .expect("the group is listed");
    (g.group_type.to_string(), g.group_state.to_string())
}

/// ConsumerGroupDescribe v1: (error, members' assigned partition counts,
/// members' types sorted: 0 classic, 1 consumer).
fn described(port: u16, group: &str) -> (i16, Vec<usize>, Vec<i8>) {
    let mut raw = RawClient::connect(group_coordinator_port(port, group));
    let r = raw.request(
        1,
        &ConsumerGroupDescribeRequest::default()
            .with_group_ids(vec![GroupId(StrBytes::from_string(group.into()))]),
    );
    let d = &r.groups[0];
    let counts = d
        .members
        .iter()
        .map(|m| {
            m.assignment
                .topic_partitions
                .iter()
                .map(|t| t.partitions.len())
                .sum()
        })
        .collect();
    let mut types: Vec<i8> = d.members.iter().map(|m| m.member_type).collect();
    types.sort();
    (d.error_code, counts, types)
}

#[test]
fn a_classic_group_is_upgraded_online_to_the_consumer_protocol() {
    let mut sc = Scenario::start("upgrade");
    let port = sc.target.port();
    let mut seen = Seen::default();
    let (c1, c2, k1) = sc.upgrade(&mut seen);
    let (error, _, types) = described(port, &sc.group);
    assert_eq!(
        (error, types),
        (0, vec![0, 0, 1]),
        "two classic members, one consumer member"
    );

    // c1 leaves (LeaveGroup to the consumer group).
    drop(c1);
    sc.step(&[&c2, &k1], &mut seen, 4_000..6_000, "c1 replaced: c2, k1");

    // The mixed group survives a broker restart (fjord only): the classic
    // member keeps its generation (its member epoch), the consumer member
    // its epoch, and nothing committed is read again.
    if let Target::Fjord(broker) = &mut sc.target {
        broker.restart();
        assert_eq!(listed(port, &sc.group).0, "consumer");
    }
    sc.step(
        &[&c2, &k1],
        &mut seen,
        6_000..7_000,
        "mixed, after a restart",
    );

    // c2 is replaced too.
    let k2 = sc.member("consumer");
    sc.step(&[&c2, &k1, &k2], &mut seen, 7_000..8_000, "c2, k1, k2");
    drop(c2);
    sc.step(&[&k1, &k2], &mut seen, 8_000..10_000, "k1, k2");

    seen.assert_each_read_once(10_000);
    let (group_type, state) = listed(port, &sc.group);
    assert_eq!(group_type, "consumer");
    assert_eq!(state, "Stable");
    let (error, mut counts, types) = described(port, &sc.group);
    assert_eq!(types, vec![1, 1]);
    assert_eq!(error, 0);
    counts.sort();
    assert_eq!(counts, vec![6, 6]);
}

#[test]
fn a_consumer_group_is_downgraded_online_when_its_last_consumer_member_leaves() {
    let sc = Scenario::start("downgrade");
    let port = sc.target.port();
    let mut seen = Seen::default();
    let (c1, c2, k1) = sc.upgrade(&mut seen);

    // The only consumer-protocol member leaves: the group goes back to the
    // classic protocol; its members rebalance and share the partitions.
    drop(k1);
    sc.step(&[&c1, &c2], &mut seen, 4_000..6_000, "downgraded: c1, c2");
    assert_eq!(
        listed(port, &sc.group),
        ("classic".to_string(), "Stable".to_string())
    );
    seen.assert_each_read_once(6_000);
}

// ---- raw protocol: the classic requests of a mixed group ----

fn str(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// A ConsumerProtocolSubscription v1 to `topic`, owning nothing.
fn subscription(topic: &str) -> Bytes {
    consumer_protocol::encode_subscription(&consumer_protocol::Subscription {
        version: 1,
        topics: vec![topic.to_string()],
        owned: Some(Default::default()),
        rack_id: None,
    })
}

fn classic_sync(
    group: &str,
    member_id: &str,
    generation: i32,
    protocol_name: &str,
    assignment: Option<Bytes>,
) -> SyncGroupRequest {
    SyncGroupRequest::default()
        .with_group_id(GroupId(str(group)))
        .with_member_id(str(member_id))
        .with_generation_id(generation)
        .with_protocol_type(Some(str("consumer")))
        .with_protocol_name(Some(str(protocol_name)))
        .with_assignments(
            assignment
                .map(|a| {
                    vec![SyncGroupRequestAssignment::default()
                        .with_member_id(str(member_id))
                        .with_assignment(a)]
                })
                .unwrap_or_default(),
        )
}

fn classic_heartbeat(group: &str, member_id: &str, generation: i32) -> HeartbeatRequest {
    HeartbeatRequest::default()
        .with_group_id(GroupId(str(group)))
        .with_member_id(str(member_id))
        .with_generation_id(generation)
}

/// The error codes Kafka answers classic requests of a mixed group with,
/// and an upgrade refused for an undecodable embedded protocol.
#[test]
fn classic_requests_to_a_mixed_group_get_kafkas_errors() {
    let target = Target::start(BrokerOpts::default().cores(2));
    eprintln!("target: {}", target.label());
    let run = std::process::id();
    let topic = format!("raw-mixed-{run}");
    create_topic(&target.bootstrap(), &topic, 4, &[]);
    let group = format!("raw-mixed-{run}");
    let mut raw = RawClient::connect(wait_group_coordinator_port(target.port(), &group, TIMEOUT));

    // A classic group of one member holding the 4 partitions.
    let r = raw.request(9, &classic_join(&group, "", subscription(&topic)));
    assert_eq!(r.error_code, 79, "MEMBER_ID_REQUIRED");
    let m = r.member_id.to_string();
    let r = raw.request(9, &classic_join(&group, &m, subscription(&topic)));
    assert_eq!((r.error_code, r.leader.as_str()), (0, m.as_str()));
    let generation = r.generation_id;
    let mut all = fjord::group::consumer::Assignment::new();
    all.insert(topic.clone(), (0..4).collect());
    let assignment = consumer_protocol::encode_assignment(&all, 1);
    let r = raw.request(
        5,
        &classic_sync(&group, &m, generation, "range", Some(assignment)),
    );
    assert_eq!(r.error_code, 0);

    // A consumer-protocol member upgrades the group; it waits for the
    // partitions the classic member still holds.
    let k = format!("k-{run}-0123456789abcdef");
    let r = raw.request(
        1,
        &consumer_heartbeat(&group, &k, 0, Some(vec![topic.as_str()])),
    );
    assert_eq!(r.error_code, 0, "the upgrade is accepted");
    assert_eq!(r.member_epoch, generation + 1);

    // The classic member must rejoin; a wrong generation is ILLEGAL_GENERATION;
    // the consumer member cannot use the classic Heartbeat.
    let r = raw.request(4, &classic_heartbeat(&group, &m, generation));
    assert_eq!(r.error_code, 27, "REBALANCE_IN_PROGRESS");
    let r = raw.request(4, &classic_heartbeat(&group, &m, generation + 7));
    assert_eq!(r.error_code, 22, "ILLEGAL_GENERATION");
    let r = raw.request(4, &classic_heartbeat(&group, &k, generation + 1));
    assert_eq!(r.error_code, 25, "UNKNOWN_MEMBER_ID");

    // It rejoins owning nothing: the new generation, no leader, no members.
    let r = raw.request(9, &classic_join(&group, &m, subscription(&topic)));
    assert_eq!(r.error_code, 0);
    assert_eq!(r.generation_id, generation + 1);
    assert_eq!(r.protocol_name.as_ref().map(|p| p.as_str()), Some("range"));
    assert!(r.members.is_empty());
    assert_ne!(r.leader.as_str(), m.as_str());
    let generation = r.generation_id;
    let r = raw.request(5, &classic_sync(&group, &m, generation, "roundrobin", None));
    assert_eq!(r.error_code, 23, "INCONSISTENT_GROUP_PROTOCOL");
    let r = raw.request(5, &classic_sync(&group, &m, generation, "range", None));
    assert_eq!(r.error_code, 0);
    let mine = consumer_protocol::decode_assignment(&r.assignment).expect("an assignment");
    assert_eq!(mine.values().map(|ps| ps.len()).sum::<usize>(), 2);
    let r = raw.request(4, &classic_heartbeat(&group, &m, generation));
    assert_eq!(r.error_code, 0);

    // LeaveGroup removes members of either protocol (Kafka 4.4): the
    // consumer-protocol member leaving this way downgrades the group, and
    // the classic member is told to rejoin the classic group.
    let leave = |ids: &[&str]| {
        LeaveGroupRequest::default()
            .with_group_id(GroupId(str(&group)))
            .with_members(
                ids.iter()
                    .map(|id| MemberIdentity::default().with_member_id(str(id)))
                    .collect(),
            )
    };
    let r = raw.request(5, &leave(&[&k, "nobody"]));
    assert_eq!(r.error_code, 0);
    let codes: Vec<i16> = r.members.iter().map(|x| x.error_code).collect();
    assert_eq!(codes, vec![0, 25]);
    assert_eq!(
        listed(target.port(), &group),
        ("classic".to_string(), "PreparingRebalance".to_string())
    );
    let r = raw.request(4, &classic_heartbeat(&group, &m, generation));
    assert_eq!(
        r.error_code, 27,
        "REBALANCE_IN_PROGRESS in the classic group"
    );
    let r = raw.request(5, &leave(&[&m]));
    assert_eq!(r.members[0].error_code, 0);
    assert_eq!(listed(target.port(), &group).1, "Empty");

    // A classic group whose members' metadata does not decode is not
    // upgraded: GROUP_ID_NOT_FOUND.
    let bad = format!("raw-bad-{run}");
    let mut raw = RawClient::connect(wait_group_coordinator_port(target.port(), &bad, TIMEOUT));
    let junk = Bytes::from_static(&[0, 0, 0x7f, 0xff, 0xff, 0xff]);
    let r = raw.request(9, &classic_join(&bad, "", junk.clone()));
    let r = raw.request(9, &classic_join(&bad, r.member_id.as_str(), junk));
    assert_eq!(r.error_code, 0);
    let r = raw.request(
        1,
        &consumer_heartbeat(&bad, &k, 0, Some(vec![topic.as_str()])),
    );
    assert_eq!(r.error_code, 69, "GROUP_ID_NOT_FOUND");
}
