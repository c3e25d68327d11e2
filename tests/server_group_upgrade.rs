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
use common::client::{self, await_deliveries, create_topic, send, TestMessage};
use common::raw::{group_coordinator_port, RawClient};
use common::target::Target;
use common::BrokerOpts;
use fjord::group::consumer_protocol;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    ConsumerGroupDescribeRequest, ConsumerGroupHeartbeatRequest, GroupId, HeartbeatRequest,
    JoinGroupRequest, LeaveGroupRequest, ListGroupsRequest, SyncGroupRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::message::Message;
use rdkafka::ClientContext;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 12;
const TIMEOUT: Duration = Duration::from_secs(120);

/// Commits what the application consumed before giving partitions up, as
/// an application using the rebalance callback does.
#[derive(Default, Clone)]
struct CommitOnRevoke;

impl ClientContext for CommitOnRevoke {}
impl ConsumerContext for CommitOnRevoke {
    fn pre_rebalance(&self, c: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(_) = rebalance {
            if let Err(e) = c.commit_consumer_state(CommitMode::Sync) {
                eprintln!("commit on revoke: {e}");
            }
        }
    }
}

type Member = BaseConsumer<CommitOnRevoke>;

/// A member speaking `protocol` (`classic` or `consumer`).
/// A member speaking `protocol`, subscribed to `topic`.
fn member_of(bootstrap: &str, group: &str, protocol: &str, topic: &str) -> Member {
    let mut c = client::base_config(bootstrap);
    c.set("group.id", group)
        .set("group.protocol", protocol)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "100")
        .set("enable.partition.eof", "false");
    if protocol == "classic" {
        c.set("session.timeout.ms", "10000")
            .set("heartbeat.interval.ms", "300");
    }
    let m: Member = c
        .create_with_context(CommitOnRevoke)
        .expect("create a consumer");
    m.subscribe(&[topic]).expect("subscribe");
    m
}

fn assigned(c: &Member) -> HashSet<i32> {
    c.assignment()
        .map(|tpl| tpl.elements().iter().map(|e| e.partition()).collect())
        .unwrap_or_default()
}

/// Every message consumed, by id.
#[derive(Default)]
struct Seen {
    by_id: HashMap<usize, usize>,
    duplicates: Vec<usize>,
}

/// Polls every member until `done` holds.
fn poll_until(
    members: &[&Member],
    seen: &mut Seen,
    what: &str,
    mut done: impl FnMut(&Seen) -> bool,
) {
    let deadline = Instant::now() + TIMEOUT;
    while !done(seen) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        for (i, c) in members.iter().enumerate() {
            match c.poll(Duration::from_millis(20)) {
                None => {}
                Some(Err(e)) => eprintln!("member {i} error: {e}"),
                Some(Ok(m)) => {
                    let id: usize = std::str::from_utf8(m.payload().unwrap_or_default())
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .expect("numeric payload");
                    if seen.by_id.insert(id, i).is_some() {
                        seen.duplicates.push(id);
                    }
                }
            }
        }
    }
}

fn produce_to(bootstrap: &str, topic: &str, ids: std::ops::Range<usize>) {
    let producer = client::producer(bootstrap, &[("acks", "all"), ("linger.ms", "2")]);
    let n = ids.len();
    for id in ids {
        send(
            &producer,
            topic,
            &TestMessage {
                id,
                key: format!("k{id}").into_bytes(),
                value: id.to_string().into_bytes(),
                headers: vec![],
            },
        );
    }
    for d in await_deliveries(&producer, n, TIMEOUT) {
        assert!(d.error.is_none(), "delivery failed: {:?}", d.error);
    }
}

/// Polls until the members' assignments are non-empty, disjoint and cover
/// every partition, and asserts that they are disjoint.
fn settle_disjoint(members: &[&Member], seen: &mut Seen, what: &str) {
    poll_until(members, seen, what, |_| {
        let sets: Vec<_> = members.iter().map(|m| assigned(m)).collect();
        let all: HashSet<i32> = sets.iter().flatten().copied().collect();
        sets.iter().all(|s| !s.is_empty())
            && sets.iter().map(HashSet::len).sum::<usize>() == PARTITIONS as usize
            && all.len() == PARTITIONS as usize
    });
    let sets: Vec<_> = members.iter().map(|m| assigned(m)).collect();
    let mut all = HashSet::new();
    for s in &sets {
        for p in s {
            assert!(all.insert(*p), "partition {p} assigned twice: {sets:?}");
        }
    }
    eprintln!("{what}: {sets:?}");
}

/// Produces `ids` on a thread while the members settle, then reads them all.
/// Produces `ids` to `topic` on a thread while the members settle, then
/// reads them all and commits.
fn step_on(
    bs: &str,
    topic: &str,
    members: &[&Member],
    seen: &mut Seen,
    ids: std::ops::Range<usize>,
    what: &str,
) {
    let end = ids.end;
    let producing = std::thread::spawn({
        let bs = bs.to_string();
        let topic = topic.to_string();
        move || produce_to(&bs, &topic, ids)
    });
    settle_disjoint(members, seen, what);
    producing.join().expect("producer thread");
    poll_until(members, seen, what, |s| s.by_id.len() >= end);
    for m in members {
        m.commit_consumer_state(CommitMode::Sync).expect("commit");
    }
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
    let mut target = Target::start(
        BrokerOpts::default()
            .cores(2)
            .arg("--group-consumer-heartbeat-interval-ms")
            .arg("300"),
    );
    eprintln!("target: {}", target.label());
    let bs = target.bootstrap();
    let port = target.port();
    let run = std::process::id();
    let group = format!("upgrade-{run}");
    let topic = format!("upgrade-{run}");
    create_topic(&bs, &topic, PARTITIONS, &[]);
    let member = |protocol: &str| member_of(&bs, &group, protocol, &topic);
    let step = |members: &[&Member], seen: &mut Seen, ids: std::ops::Range<usize>, what: &str| {
        step_on(&bs, &topic, members, seen, ids, what)
    };
    let mut seen = Seen::default();

    // Two classic members.
    let c1 = member("classic");
    let c2 = member("classic");
    step(&[&c1, &c2], &mut seen, 0..2_000, "two classic members");
    assert_eq!(listed(port, &group).0, "classic");

    // A consumer-protocol member joins: the group is upgraded, and the
    // classic members stay in it.
    let k1 = member("consumer");
    step(
        &[&c1, &c2, &k1],
        &mut seen,
        2_000..4_000,
        "upgraded: c1, c2, k1",
    );
    assert_eq!(listed(port, &group).0, "consumer");
    let (error, _, types) = described(port, &group);
    assert_eq!(
        (error, types),
        (0, vec![0, 0, 1]),
        "two classic members, one consumer member"
    );

    // c1 leaves (LeaveGroup to the consumer group).
    drop(c1);
    step(&[&c2, &k1], &mut seen, 4_000..6_000, "c1 replaced: c2, k1");

    // The mixed group survives a broker restart (fjord only): the classic
    // member keeps its generation (its member epoch), the consumer member
    // its epoch, and nothing committed is read again.
    if let Target::Fjord(broker) = &mut target {
        broker.restart();
        assert_eq!(listed(port, &group).0, "consumer");
    }
    step(
        &[&c2, &k1],
        &mut seen,
        6_000..7_000,
        "mixed, after a restart",
    );

    // c2 is replaced too.
    let k2 = member("consumer");
    step(&[&c2, &k1, &k2], &mut seen, 7_000..8_000, "c2, k1, k2");
    drop(c2);
    step(&[&k1, &k2], &mut seen, 8_000..10_000, "k1, k2");

    assert!(
        seen.duplicates.is_empty(),
        "read twice after a commit: {:?}",
        &seen.duplicates[..seen.duplicates.len().min(20)]
    );
    assert_eq!(seen.by_id.len(), 10_000, "nothing lost");
    let (group_type, state) = listed(port, &group);
    assert_eq!(group_type, "consumer");
    assert_eq!(state, "Stable");
    let (error, mut counts, types) = described(port, &group);
    assert_eq!(types, vec![1, 1]);
    assert_eq!(error, 0);
    counts.sort();
    assert_eq!(counts, vec![6, 6]);
}

#[test]
fn a_consumer_group_is_downgraded_online_when_its_last_consumer_member_leaves() {
    let target = Target::start(
        BrokerOpts::default()
            .cores(2)
            .arg("--group-consumer-heartbeat-interval-ms")
            .arg("300"),
    );
    eprintln!("target: {}", target.label());
    let bs = target.bootstrap();
    let port = target.port();
    let group = format!("downgrade-{}", std::process::id());
    let topic = format!("downgrade-{}", std::process::id());
    create_topic(&bs, &topic, PARTITIONS, &[]);
    let mut seen = Seen::default();
    let member = |protocol: &str| member_of(&bs, &group, protocol, &topic);
    let step = |members: &[&Member], seen: &mut Seen, ids: std::ops::Range<usize>, what: &str| {
        step_on(&bs, &topic, members, seen, ids, what)
    };

    let c1 = member("classic");
    let c2 = member("classic");
    step(&[&c1, &c2], &mut seen, 0..2_000, "two classic members");
    let k1 = member("consumer");
    step(
        &[&c1, &c2, &k1],
        &mut seen,
        2_000..4_000,
        "upgraded: c1, c2, k1",
    );
    assert_eq!(listed(port, &group).0, "consumer");

    // The only consumer-protocol member leaves: the group goes back to the
    // classic protocol; its members rebalance and share the partitions.
    drop(k1);
    step(&[&c1, &c2], &mut seen, 4_000..6_000, "downgraded: c1, c2");
    assert_eq!(
        listed(port, &group),
        ("classic".to_string(), "Stable".to_string())
    );
    assert!(
        seen.duplicates.is_empty(),
        "read twice after a commit: {:?}",
        &seen.duplicates[..seen.duplicates.len().min(20)]
    );
    assert_eq!(seen.by_id.len(), 6_000, "nothing lost");
}

// ---- raw protocol: the classic requests of a mixed group ----

/// The group's coordinator port, waiting while a fresh broker creates
/// `__consumer_offsets` (COORDINATOR_NOT_AVAILABLE meanwhile).
fn coordinator_port(port: u16, group: &str) -> u16 {
    use kafka_protocol::messages::FindCoordinatorRequest;
    common::wait_for(TIMEOUT, "a group coordinator", || {
        let found = RawClient::connect(port).request(
            4,
            &FindCoordinatorRequest::default()
                .with_key_type(0)
                .with_coordinator_keys(vec![str(group)]),
        );
        let c = &found.coordinators[0];
        if c.error_code == 0 {
            return Some(c.port as u16);
        }
        std::thread::sleep(Duration::from_millis(200));
        None
    })
}

fn str(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// A classic JoinGroup v9 with one `range` protocol whose metadata is
/// `metadata`.
fn classic_join(group: &str, member_id: &str, metadata: Bytes) -> JoinGroupRequest {
    JoinGroupRequest::default()
        .with_group_id(GroupId(str(group)))
        .with_session_timeout_ms(30_000)
        .with_rebalance_timeout_ms(30_000)
        .with_member_id(str(member_id))
        .with_protocol_type(str("consumer"))
        .with_protocols(vec![JoinGroupRequestProtocol::default()
            .with_name(str("range"))
            .with_metadata(metadata)])
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

fn consumer_join(group: &str, member_id: &str, topic: &str) -> ConsumerGroupHeartbeatRequest {
    ConsumerGroupHeartbeatRequest::default()
        .with_group_id(GroupId(str(group)))
        .with_member_id(str(member_id))
        .with_member_epoch(0)
        .with_rebalance_timeout_ms(30_000)
        .with_subscribed_topic_names(Some(vec![TopicName(str(topic))]))
        .with_topic_partitions(Some(vec![]))
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
    let mut raw = RawClient::connect(coordinator_port(target.port(), &group));

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
    let r = raw.request(1, &consumer_join(&group, &k, &topic));
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
    let mut raw = RawClient::connect(coordinator_port(target.port(), &bad));
    let junk = Bytes::from_static(&[0, 0, 0x7f, 0xff, 0xff, 0xff]);
    let r = raw.request(9, &classic_join(&bad, "", junk.clone()));
    let r = raw.request(9, &classic_join(&bad, r.member_id.as_str(), junk));
    assert_eq!(r.error_code, 0);
    let r = raw.request(1, &consumer_join(&bad, &k, &topic));
    assert_eq!(r.error_code, 69, "GROUP_ID_NOT_FOUND");
}
