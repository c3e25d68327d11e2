//! KIP-848 consumer groups end to end: librdkafka consumers with
//! `group.protocol=consumer` (ConsumerGroupHeartbeat, server-side
//! assignment) sharing a 12-partition topic while members join and leave,
//! a regex subscription that picks up a topic created later, a broker
//! restart the group resumes from, and raw-protocol checks of the errors
//! Kafka answers (fenced and stale epochs, unknown members, invalid
//! requests, a classic group that cannot be upgraded), and KIP-1251's
//! assignment epochs (a commit built before the member read its new epoch;
//! `FJORD_TEST_BROKER=kafka:HOST:PORT` runs that one against stock Kafka).

mod common;

use common::client::{create_topic, produce_numbered};
use common::groups::{assigned, classic_join, consumer_heartbeat, poll_until, Member, Seen};
use common::raw::{group_coordinator_port, RawClient};
use common::target::Target;
use common::{Broker, BrokerOpts};
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestGroup;
use kafka_protocol::messages::{
    ConsumerGroupDescribeRequest, ConsumerGroupHeartbeatRequest, GroupId, JoinGroupRequest,
    ListGroupsRequest, OffsetCommitRequest, OffsetFetchRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::consumer::{CommitMode, Consumer};
use std::collections::HashSet;
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 12;
const TIMEOUT: Duration = Duration::from_secs(120);

fn broker() -> Broker {
    Broker::start(
        BrokerOpts::default()
            .cores(2)
            .arg("--group-consumer-heartbeat-interval-ms")
            .arg("300"),
    )
}

/// A `group.protocol=consumer` member of `group`, not yet subscribed.
fn member(bootstrap: &str, group: &str, extra: &[(&str, &str)]) -> Member {
    common::groups::member(bootstrap, group, "consumer", extra)
}

/// Asserts the members' assignments are disjoint and cover `total`
/// partitions once they settle.
fn settle_disjoint(members: &[&Member], seen: &mut Seen, total: usize, what: &str) {
    poll_until(members, seen, what, |_| {
        let sets: Vec<_> = members.iter().map(|m| assigned(m)).collect();
        sets.iter().all(|s| !s.is_empty()) && sets.iter().map(HashSet::len).sum::<usize>() == total
    });
    let sets: Vec<_> = members.iter().map(|m| assigned(m)).collect();
    let mut all = HashSet::new();
    for s in &sets {
        for tp in s {
            assert!(all.insert(tp.clone()), "{tp:?} assigned twice: {sets:?}");
        }
    }
    assert_eq!(all.len(), total);
}

#[test]
fn members_share_a_topic_disjointly_while_joining_and_leaving() {
    let broker = broker();
    let bs = broker.bootstrap();
    create_topic(&bs, "shared", PARTITIONS, &[]);
    let group = "kip848-shared";
    let a = member(&bs, group, &[]);
    let b = member(&bs, group, &[]);
    a.subscribe(&["shared"]).expect("subscribe a");
    b.subscribe(&["shared"]).expect("subscribe b");
    let mut seen = Seen::default();
    settle_disjoint(
        &[&a, &b],
        &mut seen,
        PARTITIONS as usize,
        "two members assigned",
    );

    produce_numbered(&bs, "shared", 0..3_000, TIMEOUT);
    poll_until(&[&a, &b], &mut seen, "the first 3000", |s| {
        s.by_id.len() >= 3_000
    });

    // A third member joins while messages flow.
    let c = member(&bs, group, &[("group.remote.assignor", "uniform")]);
    c.subscribe(&["shared"]).expect("subscribe c");
    let producing = std::thread::spawn({
        let bs = bs.clone();
        move || produce_numbered(&bs, "shared", 3_000..6_000, TIMEOUT)
    });
    settle_disjoint(
        &[&a, &b, &c],
        &mut seen,
        PARTITIONS as usize,
        "three members assigned",
    );
    producing.join().expect("producer thread");
    poll_until(&[&a, &b, &c], &mut seen, "6000 messages", |s| {
        s.by_id.len() >= 6_000
    });
    for m in [&a, &b, &c] {
        m.commit_consumer_state(CommitMode::Sync).expect("commit");
    }

    // b leaves (a leave heartbeat on close); a and c take its partitions.
    drop(b);
    produce_numbered(&bs, "shared", 6_000..9_000, TIMEOUT);
    settle_disjoint(
        &[&a, &c],
        &mut seen,
        PARTITIONS as usize,
        "two members after a leave",
    );
    poll_until(&[&a, &c], &mut seen, "9000 messages", |s| {
        s.by_id.len() >= 9_000
    });
    seen.assert_each_read_once(9_000);
}

#[test]
fn a_regex_subscription_picks_up_a_topic_created_later() {
    let broker = broker();
    let bs = broker.bootstrap();
    create_topic(&bs, "rx-first", 3, &[]);
    create_topic(&bs, "other", 3, &[]);
    let a = member(&bs, "kip848-regex", &[]);
    a.subscribe(&["^rx-.*"]).expect("subscribe to a regex");
    let mut seen = Seen::default();
    poll_until(&[&a], &mut seen, "rx-first assigned", |_| {
        assigned(&a).len() == 3
    });
    assert!(assigned(&a).iter().all(|(t, _)| t == "rx-first"));

    create_topic(&bs, "rx-later", 4, &[]);
    poll_until(&[&a], &mut seen, "rx-later assigned too", |_| {
        assigned(&a).len() == 7
    });
    produce_numbered(&bs, "rx-later", 0..500, TIMEOUT);
    poll_until(&[&a], &mut seen, "messages of rx-later", |s| {
        s.by_id.len() >= 500
    });
    assert!(seen.duplicates.is_empty());
}

#[test]
fn the_group_resumes_after_a_broker_restart() {
    let mut broker = broker();
    let bs = broker.bootstrap();
    create_topic(&bs, "durable", PARTITIONS, &[]);
    let group = "kip848-restart";
    let mut seen = Seen::default();
    {
        let a = member(&bs, group, &[]);
        a.subscribe(&["durable"]).expect("subscribe");
        produce_numbered(&bs, "durable", 0..1_000, TIMEOUT);
        poll_until(&[&a], &mut seen, "the first 1000", |s| {
            s.by_id.len() >= 1_000
        });
        a.commit_consumer_state(CommitMode::Sync).expect("commit");
        // a leaves on drop; the group and its offsets stay.
    }
    broker.restart();
    let bs = broker.bootstrap();
    produce_numbered(&bs, "durable", 1_000..2_000, TIMEOUT);
    let a = member(&bs, group, &[]);
    a.subscribe(&["durable"]).expect("subscribe again");
    poll_until(&[&a], &mut seen, "the next 1000", |s| {
        s.by_id.len() >= 2_000
    });
    assert!(
        seen.duplicates.is_empty(),
        "committed messages read again after the restart: {:?}",
        &seen.duplicates[..seen.duplicates.len().min(20)]
    );

    // A member that stays through a restart keeps its membership: its
    // next heartbeats carry its epoch and are accepted.
    broker.restart();
    let bs = broker.bootstrap();
    produce_numbered(&bs, "durable", 2_000..2_500, TIMEOUT);
    poll_until(&[&a], &mut seen, "messages after the second restart", |s| {
        s.by_id.len() >= 2_500
    });
    assert_eq!(assigned(&a).len(), PARTITIONS as usize);
}

// ---- raw protocol ----

fn coordinator(broker: &Broker, group: &str) -> RawClient {
    RawClient::connect(group_coordinator_port(broker.port_of(0), group))
}

#[test]
fn heartbeat_errors_are_kafkas() {
    let broker = broker();
    create_topic(&broker.bootstrap(), "raw", 4, &[]);
    let group = "kip848-raw";
    let mut raw = coordinator(&broker, group);

    // A first heartbeat without subscription: INVALID_REQUEST (42).
    let r = raw.request(1, &consumer_heartbeat(group, "m1", 0, None));
    assert_eq!(r.error_code, 42);
    // v1 requires a member id.
    let r = raw.request(1, &consumer_heartbeat(group, "", 0, Some(vec!["raw"])));
    assert_eq!(r.error_code, 42);
    // An unknown assignor: UNSUPPORTED_ASSIGNOR (112).
    let r = raw.request(
        1,
        &consumer_heartbeat(group, "m1", 0, Some(vec!["raw"]))
            .with_server_assignor(Some(StrBytes::from_static_str("sticky"))),
    );
    assert_eq!(r.error_code, 112);
    // An invalid regex: INVALID_REGULAR_EXPRESSION (128).
    let r = raw.request(
        1,
        &consumer_heartbeat(group, "m1", 0, None)
            .with_subscribed_topic_regex(Some(StrBytes::from_static_str("(unclosed"))),
    );
    assert_eq!(r.error_code, 128);
    // A heartbeat with an epoch to a group that does not exist: GROUP_ID_NOT_FOUND (69).
    let mut other = coordinator(&broker, "kip848-none");
    let r = other.request(1, &consumer_heartbeat("kip848-none", "m1", 3, None));
    assert_eq!(r.error_code, 69);

    // Join: the member gets the whole topic at once (nobody else holds it).
    let r = raw.request(1, &consumer_heartbeat(group, "m1", 0, Some(vec!["raw"])));
    assert_eq!(r.error_code, 0);
    let epoch = r.member_epoch;
    assert!(epoch > 0);
    assert_eq!(r.heartbeat_interval_ms, 300);
    let owned = r
        .assignment
        .expect("an assignment on join")
        .topic_partitions;
    assert_eq!(owned[0].partitions.len(), 4);

    // An epoch from the future: FENCED_MEMBER_EPOCH (110).
    let r = raw.request(1, &consumer_heartbeat(group, "m1", epoch + 5, None));
    assert_eq!(r.error_code, 110);
    // An unknown member: UNKNOWN_MEMBER_ID (25).
    let r = raw.request(1, &consumer_heartbeat(group, "nobody", epoch, None));
    assert_eq!(r.error_code, 25);

    // OffsetCommit with a stale epoch: STALE_MEMBER_EPOCH (113); with the
    // current one: accepted.
    let commit = |epoch: i32| {
        OffsetCommitRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(group.into())))
            .with_member_id(StrBytes::from_static_str("m1"))
            .with_generation_id_or_member_epoch(epoch)
            .with_topics(vec![OffsetCommitRequestTopic::default()
                .with_name(TopicName(StrBytes::from_static_str("raw")))
                .with_partitions(vec![OffsetCommitRequestPartition::default()
                    .with_partition_index(0)
                    .with_committed_offset(0)])])
    };
    let r = raw.request(9, &commit(epoch - 1));
    assert_eq!(r.topics[0].partitions[0].error_code, 113);
    let r = raw.request(9, &commit(epoch));
    assert_eq!(r.topics[0].partitions[0].error_code, 0);

    // OffsetFetch v9 by the member: its current epoch is accepted, an old
    // one is STALE_MEMBER_EPOCH (113), an unknown member UNKNOWN_MEMBER_ID.
    let fetch = |member: &str, epoch: i32| {
        OffsetFetchRequest::default().with_groups(vec![OffsetFetchRequestGroup::default()
            .with_group_id(GroupId(StrBytes::from_string(group.into())))
            .with_member_id(Some(StrBytes::from_string(member.into())))
            .with_member_epoch(epoch)
            .with_topics(None)])
    };
    let r = raw.request(9, &fetch("m1", epoch));
    assert_eq!(r.groups[0].error_code, 0);
    let committed = &r.groups[0].topics[0].partitions[0];
    assert_eq!(committed.committed_offset, 0);
    let r = raw.request(9, &fetch("m1", epoch - 1));
    assert_eq!(r.groups[0].error_code, 113);
    let r = raw.request(9, &fetch("nobody", epoch));
    assert_eq!(r.groups[0].error_code, 25);

    // A classic member without a member id joining the consumer group is
    // first sent its id (MEMBER_ID_REQUIRED, 79), as Kafka does; the group
    // does not change until it rejoins with it (mixed groups are tested in
    // server_group_upgrade).
    let r = raw.request(
        9,
        &classic_join(group, "", bytes::Bytes::from_static(&[0; 10]))
            .with_session_timeout_ms(10_000)
            .with_rebalance_timeout_ms(10_000),
    );
    assert_eq!(r.error_code, 79);
    assert!(!r.member_id.is_empty());

    // ListGroups shows the group as a consumer group; ConsumerGroupDescribe
    // describes it.
    let r = raw.request(5, &ListGroupsRequest::default());
    let listed = r
        .groups
        .iter()
        .find(|g| g.group_id.as_str() == group)
        .expect("the group is listed");
    assert_eq!(listed.group_type.as_str(), "consumer");
    assert_eq!(listed.protocol_type.as_str(), "consumer");
    assert_eq!(listed.group_state.as_str(), "Stable");
    let r = raw.request(
        1,
        &ConsumerGroupDescribeRequest::default()
            .with_group_ids(vec![GroupId(StrBytes::from_string(group.into()))]),
    );
    let d = &r.groups[0];
    assert_eq!(d.error_code, 0);
    assert_eq!(d.group_state.as_str(), "Stable");
    assert_eq!(d.assignor_name.as_str(), "uniform");
    assert_eq!(d.members.len(), 1);
    assert_eq!(d.members[0].member_epoch, epoch);
    assert_eq!(
        d.members[0].assignment.topic_partitions[0].partitions.len(),
        4
    );

    // A group that is not there: GROUP_ID_NOT_FOUND (69).
    let r = other.request(
        1,
        &ConsumerGroupDescribeRequest::default()
            .with_group_ids(vec![GroupId(StrBytes::from_static_str("kip848-none"))]),
    );
    assert_eq!(r.groups[0].error_code, 69);

    // Leaving: epoch -1 answered with -1; the member is gone.
    let r = raw.request(1, &consumer_heartbeat(group, "m1", -1, None));
    assert_eq!((r.error_code, r.member_epoch), (0, -1));
    let r = raw.request(1, &consumer_heartbeat(group, "m1", epoch, None));
    assert_eq!(r.error_code, 25);
}

#[test]
fn a_consumer_member_cannot_take_over_a_classic_group_of_another_protocol() {
    let broker = broker();
    let group = "kip848-classic";
    let mut raw = coordinator(&broker, group);
    // A classic group of protocol type `connect` (not the consumer
    // embedded protocol) with a member: it cannot be upgraded online.
    let join = |member_id: &str| {
        JoinGroupRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(group.into())))
            .with_session_timeout_ms(30_000)
            .with_rebalance_timeout_ms(30_000)
            .with_member_id(StrBytes::from_string(member_id.into()))
            .with_protocol_type(StrBytes::from_static_str("connect"))
            .with_protocols(vec![
                kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol::default()
                    .with_name(StrBytes::from_static_str("sessioned"))
                    .with_metadata(bytes::Bytes::from_static(&[0, 1])),
            ])
    };
    let r = raw.request(9, &join(""));
    assert_eq!(r.error_code, 79, "MEMBER_ID_REQUIRED");
    let r = raw.request(9, &join(r.member_id.as_str()));
    assert_eq!(r.error_code, 0, "joined the classic group");
    let r = raw.request(
        1,
        &consumer_heartbeat(group, "m1", 0, Some(vec!["classic"])),
    );
    assert_eq!(r.error_code, 69, "GROUP_ID_NOT_FOUND: not upgradable");
}

type Owned = Vec<(uuid::Uuid, Vec<i32>)>;

/// A heartbeat's answer: (error, member epoch, assignment if sent).
fn beat_owned(
    raw: &mut RawClient,
    req: ConsumerGroupHeartbeatRequest,
    owned: Option<&Owned>,
) -> (i16, i32, Option<Owned>) {
    use kafka_protocol::messages::consumer_group_heartbeat_request::TopicPartitions;
    let req = match owned {
        Some(o) => req.with_topic_partitions(Some(
            o.iter()
                .map(|(id, ps)| {
                    TopicPartitions::default()
                        .with_topic_id(*id)
                        .with_partitions(ps.clone())
                })
                .collect(),
        )),
        None => req,
    };
    let r = raw.request(1, &req);
    let assignment = r.assignment.map(|a| {
        a.topic_partitions
            .into_iter()
            .map(|tp| (tp.topic_id, tp.partitions))
            .collect()
    });
    (r.error_code, r.member_epoch, assignment)
}

/// KIP-1251 (Kafka 4.3+): a member that acknowledged a revocation is moved
/// to a new epoch in that heartbeat's answer; an OffsetCommit it built
/// before reading the answer carries the old epoch. The coordinator
/// accepts it when the member has held every partition of it since that
/// epoch, and refuses it whole with STALE_MEMBER_EPOCH (113) when one of
/// them was given up; an epoch above the member's is stale. Stock Kafka
/// 4.4.0 answers the same (`FJORD_TEST_BROKER=kafka:HOST:PORT`).
#[test]
fn a_commit_with_the_epoch_before_a_revocation_commits_the_kept_partitions() {
    let target = Target::start(BrokerOpts::default().cores(2));
    let topic = target.name("kip1251");
    let group = target.name("kip1251-g");
    create_topic(&target.bootstrap(), &topic, 4, &[]);
    let mut raw = RawClient::connect(group_coordinator_port(target.port(), &group));
    let join = |member: &str| consumer_heartbeat(&group, member, 0, Some(vec![topic.as_str()]));
    let beat = |member: &str, epoch: i32| consumer_heartbeat(&group, member, epoch, None);

    // m1 joins and, alone, gets the four partitions.
    let (code, mut e1, first) = beat_owned(&mut raw, join("m1"), None);
    assert_eq!(code, 0);
    let mut all: Owned = first.unwrap_or_default();
    let deadline = Instant::now() + TIMEOUT;
    while all.iter().map(|(_, ps)| ps.len()).sum::<usize>() < 4 {
        assert!(Instant::now() < deadline, "m1 never got the 4 partitions");
        std::thread::sleep(Duration::from_millis(100));
        let (code, e, a) = beat_owned(&mut raw, beat("m1", e1), Some(&all));
        assert_eq!(code, 0);
        e1 = e;
        if let Some(a) = a {
            all = a;
        }
    }
    let topic_id = all[0].0;

    // m2 joins; m1's next heartbeat tells it to give two up, at its epoch.
    let (code, _, _) = beat_owned(&mut raw, join("m2"), None);
    assert_eq!(code, 0);
    // (Kafka 4.4 may compute the new target assignment a little later:
    // heartbeat until it arrives.)
    let kept: Vec<i32> = loop {
        assert!(Instant::now() < deadline, "m1 was never told to revoke");
        let (code, epoch, a) = beat_owned(&mut raw, beat("m1", e1), Some(&all));
        assert_eq!(
            (code, epoch),
            (0, e1),
            "m1 keeps its epoch until it revokes"
        );
        match a {
            Some(a) if a[0].1.len() < 4 => break a[0].1.clone(),
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    assert_eq!(kept.len(), 2);
    let revoked: Vec<i32> = (0..4).filter(|p| !kept.contains(p)).collect();

    // m1 revokes and says so: its epoch moves on.
    let (code, e1_new, _) = beat_owned(
        &mut raw,
        beat("m1", e1),
        Some(&vec![(topic_id, kept.clone())]),
    );
    assert_eq!(code, 0);
    assert!(
        e1_new > e1,
        "acknowledging the revocation moves m1 to a new epoch"
    );

    let commit = |epoch: i32, partitions: &[i32]| {
        OffsetCommitRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(group.clone())))
            .with_member_id(StrBytes::from_static_str("m1"))
            .with_generation_id_or_member_epoch(epoch)
            .with_topics(vec![OffsetCommitRequestTopic::default()
                .with_name(TopicName(StrBytes::from_string(topic.clone())))
                .with_partitions(
                    partitions
                        .iter()
                        .map(|p| {
                            OffsetCommitRequestPartition::default()
                                .with_partition_index(*p)
                                .with_committed_offset(0)
                        })
                        .collect(),
                )])
    };
    let codes = |r: kafka_protocol::messages::OffsetCommitResponse| -> Vec<(i32, i16)> {
        r.topics[0]
            .partitions
            .iter()
            .map(|p| (p.partition_index, p.error_code))
            .collect()
    };
    // With the old epoch, a commit that includes a partition m1 gave up is
    // refused whole: STALE_MEMBER_EPOCH for every partition.
    let r = raw.request(9, &commit(e1, &[kept[0], revoked[0]]));
    assert_eq!(codes(r), vec![(kept[0], 113), (revoked[0], 113)]);
    // With the old epoch, a commit of a kept partition is accepted.
    let r = raw.request(9, &commit(e1, &[kept[0]]));
    assert_eq!(codes(r), vec![(kept[0], 0)]);
    // The current epoch commits; one above it is stale.
    let r = raw.request(9, &commit(e1_new, &[kept[1]]));
    assert_eq!(codes(r), vec![(kept[1], 0)]);
    let r = raw.request(9, &commit(e1_new + 1, &[kept[1]]));
    assert_eq!(codes(r), vec![(kept[1], 113)]);

    // What was committed is there: the kept partitions, not the revoked one.
    let r = raw.request(
        9,
        &OffsetFetchRequest::default().with_groups(vec![OffsetFetchRequestGroup::default()
            .with_group_id(GroupId(StrBytes::from_string(group.clone())))
            .with_member_id(Some(StrBytes::from_static_str("m1")))
            .with_member_epoch(e1_new)
            .with_topics(None)]),
    );
    assert_eq!(r.groups[0].error_code, 0);
    let mut committed: Vec<i32> = r.groups[0]
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| p.partition_index))
        .collect();
    committed.sort();
    let mut expected = kept.clone();
    expected.sort();
    assert_eq!(
        committed, expected,
        "the revoked partition was not committed"
    );
    for m in ["m1", "m2"] {
        raw.request(1, &consumer_heartbeat(&group, m, -1, None));
    }
}
