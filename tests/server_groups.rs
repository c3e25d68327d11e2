//! Consumer groups end to end: librdkafka consumers subscribing through
//! fjord's group coordinator (FindCoordinator, JoinGroup, SyncGroup,
//! Heartbeat, LeaveGroup, OffsetCommit/Fetch), a raw-protocol member that
//! stops heartbeating, the admin API, and committed offsets across a
//! SIGKILL.

mod common;

use common::client::{self, block_on, create_topic, numbered_id, produce_numbered};
use common::groups::{classic_join, member_config};
use common::raw::RawClient;
use common::{Broker, BrokerOpts};
use kafka_protocol::messages::{
    FindCoordinatorRequest, GroupId, HeartbeatRequest, JoinGroupRequest, SyncGroupRequest,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::message::Message;
use rdkafka::ClientContext;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 6;
const MESSAGES: usize = 6_000;
const TIMEOUT: Duration = Duration::from_secs(90);
const SESSION_TIMEOUT_MS: &str = "6000";

fn broker() -> Broker {
    Broker::start(
        BrokerOpts::default()
            .cores(2)
            .arg("--group-initial-rebalance-delay-ms")
            .arg("0"),
    )
}

/// Counts the assignments librdkafka hands the application.
#[derive(Default, Clone)]
struct Counting {
    assigns: Arc<AtomicUsize>,
}

impl ClientContext for Counting {}
impl ConsumerContext for Counting {
    fn post_rebalance(&self, _c: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(_) = rebalance {
            self.assigns.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn group_consumer(bootstrap: &str, group: &str, extra: &[(&str, &str)]) -> BaseConsumer<Counting> {
    let settings: Vec<(&str, &str)> = [
        ("session.timeout.ms", SESSION_TIMEOUT_MS),
        ("heartbeat.interval.ms", "500"),
    ]
    .into_iter()
    .chain(extra.iter().copied())
    .collect();
    member_config(bootstrap, group, &settings)
        .create_with_context(Counting::default())
        .expect("create group consumer")
}

fn assigned(c: &BaseConsumer<Counting>) -> HashSet<i32> {
    c.assignment()
        .map(|tpl| tpl.elements().iter().map(|e| e.partition()).collect())
        .unwrap_or_default()
}

/// Polls every consumer until `done` holds; returns what each consumed as
/// (partition, id).
fn poll_until(
    consumers: &[&BaseConsumer<Counting>],
    what: &str,
    mut done: impl FnMut(&[Vec<(i32, usize)>]) -> bool,
) -> Vec<Vec<(i32, usize)>> {
    let deadline = Instant::now() + TIMEOUT;
    let mut got: Vec<Vec<(i32, usize)>> = vec![Vec::new(); consumers.len()];
    while !done(&got) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        for (i, c) in consumers.iter().enumerate() {
            match c.poll(Duration::from_millis(50)) {
                None => {}
                Some(Err(e)) => eprintln!("consumer {i} error: {e}"),
                Some(Ok(m)) => got[i].push((m.partition(), numbered_id(&m))),
            }
        }
    }
    got
}

#[test]
fn two_consumers_split_a_topic_then_one_leaves() {
    let broker = broker();
    let bs = broker.bootstrap();
    create_topic(&bs, "split", PARTITIONS, &[]);
    let a = group_consumer(&bs, "g-split", &[]);
    let b = group_consumer(&bs, "g-split", &[]);
    a.subscribe(&["split"]).expect("subscribe a");
    b.subscribe(&["split"]).expect("subscribe b");
    poll_until(&[&a, &b], "both consumers assigned", |_| {
        let (pa, pb) = (assigned(&a), assigned(&b));
        !pa.is_empty() && !pb.is_empty() && pa.len() + pb.len() == PARTITIONS as usize
    });
    let (pa, pb) = (assigned(&a), assigned(&b));
    assert!(pa.is_disjoint(&pb), "assignments overlap: {pa:?} {pb:?}");
    assert_eq!(pa.union(&pb).count(), PARTITIONS as usize);

    produce_numbered(&broker.bootstrap(), "split", 0..MESSAGES, TIMEOUT);
    let got = poll_until(&[&a, &b], "6000 messages", |g| {
        g[0].len() + g[1].len() >= MESSAGES
    });
    // Settle: nothing more (no duplicates) arrives.
    let extra = poll_until(&[&a, &b], "settle", {
        let start = Instant::now();
        move |_| start.elapsed() > Duration::from_secs(1)
    });
    assert!(extra.iter().all(Vec::is_empty), "duplicates: {extra:?}");
    let mut ids = HashSet::new();
    for (i, per) in got.iter().enumerate() {
        let mine = if i == 0 { &pa } else { &pb };
        for (p, id) in per {
            assert!(
                mine.contains(p),
                "consumer {i} read partition {p} it does not own"
            );
            assert!(ids.insert(*id), "message {id} consumed twice");
        }
    }
    assert_eq!(ids.len(), MESSAGES);

    // b leaves (LeaveGroup on close); a takes every partition.
    drop(b);
    poll_until(&[&a], "a owning all partitions", |_| {
        assigned(&a).len() == PARTITIONS as usize
    });
}

/// ConsumerProtocolSubscription v0 for one topic.
fn subscription(topic: &str) -> bytes::Bytes {
    let mut v = vec![0u8, 0, 0, 0, 0, 1];
    v.extend_from_slice(&(topic.len() as i16).to_be_bytes());
    v.extend_from_slice(topic.as_bytes());
    v.extend_from_slice(&(-1i32).to_be_bytes());
    bytes::Bytes::from(v)
}

fn coordinator_port(broker: &Broker, group: &str) -> u16 {
    let mut raw = RawClient::connect(broker.port_of(0));
    let resp = raw.request(
        3,
        &FindCoordinatorRequest::default()
            .with_key(StrBytes::from_string(group.into()))
            .with_key_type(0),
    );
    assert_eq!(resp.error_code, 0, "FindCoordinator failed");
    resp.port as u16
}

#[test]
fn a_member_that_stops_heartbeating_is_expired_and_its_partitions_move() {
    let broker = broker();
    let bs = broker.bootstrap();
    create_topic(&bs, "expiry", PARTITIONS, &[]);
    let c = group_consumer(
        &bs,
        "g-expiry",
        &[("partition.assignment.strategy", "range")],
    );
    c.subscribe(&["expiry"]).expect("subscribe");
    poll_until(&[&c], "c owning all partitions", |_| {
        assigned(&c).len() == PARTITIONS as usize
    });

    // A raw member joins; c's heartbeats see the rebalance and rejoin.
    let port = coordinator_port(&broker, "g-expiry");
    let join = |raw: &mut RawClient, member: &str| {
        raw.send(
            5,
            &classic_join("g-expiry", member, subscription("expiry"))
                .with_session_timeout_ms(6000)
                .with_rebalance_timeout_ms(10_000),
        )
    };
    let mut raw = RawClient::connect(port);
    let id = join(&mut raw, "");
    let first = raw.receive::<JoinGroupRequest>(5, id);
    assert_eq!(first.error_code, 79, "MEMBER_ID_REQUIRED first");
    let member = first.member_id.to_string();
    let id = join(&mut raw, &member);
    // The join completes once c rejoins: keep c polling meanwhile.
    let joined = std::thread::scope(|s| {
        let h = s.spawn(|| raw.receive::<JoinGroupRequest>(5, id));
        poll_until(&[&c], "raw member joined", |_| h.is_finished());
        h.join().expect("join thread")
    });
    assert_eq!(joined.error_code, 0);
    let generation = joined.generation_id;
    let id = raw.send(
        3,
        &SyncGroupRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str("g-expiry")))
            .with_generation_id(generation)
            .with_member_id(StrBytes::from_string(member.clone())),
    );
    let synced = std::thread::scope(|s| {
        let h = s.spawn(|| raw.receive::<SyncGroupRequest>(3, id));
        poll_until(&[&c], "raw member synced", |_| h.is_finished());
        h.join().expect("sync thread")
    });
    assert_eq!(synced.error_code, 0);
    poll_until(&[&c], "c owning half", |_| {
        assigned(&c).len() == PARTITIONS as usize / 2
    });
    let hb = raw.request(
        2,
        &HeartbeatRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str("g-expiry")))
            .with_generation_id(generation)
            .with_member_id(StrBytes::from_string(member.clone())),
    );
    assert_eq!(hb.error_code, 0, "a live member's heartbeat is accepted");

    // The raw member goes silent: after its 6 s session it is expired.
    let silent_since = Instant::now();
    poll_until(&[&c], "c owning all partitions again", |_| {
        assigned(&c).len() == PARTITIONS as usize
    });
    assert!(
        silent_since.elapsed() >= Duration::from_secs(5),
        "partitions moved before the session timeout"
    );
    let hb = raw.request(
        2,
        &HeartbeatRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str("g-expiry")))
            .with_generation_id(generation)
            .with_member_id(StrBytes::from_string(member)),
    );
    assert_eq!(hb.error_code, 25, "the expired member is UNKNOWN_MEMBER_ID");
}

#[test]
fn a_static_member_restarts_without_a_rebalance() {
    let broker = broker();
    let bs = broker.bootstrap();
    create_topic(&bs, "static", PARTITIONS, &[]);
    let a = group_consumer(&bs, "g-static", &[("group.instance.id", "static-a")]);
    let b = group_consumer(&bs, "g-static", &[]);
    a.subscribe(&["static"]).expect("subscribe a");
    b.subscribe(&["static"]).expect("subscribe b");
    poll_until(&[&a, &b], "both assigned", |_| {
        let (pa, pb) = (assigned(&a), assigned(&b));
        !pa.is_empty() && !pb.is_empty() && pa.len() + pb.len() == PARTITIONS as usize
    });
    let a_parts = assigned(&a);
    // Let heartbeats settle, then note b's assignment count.
    poll_until(&[&a, &b], "settle", {
        let start = Instant::now();
        move |_| start.elapsed() > Duration::from_secs(2)
    });
    let b_assigns = b.context().assigns.load(Ordering::SeqCst);
    // A static member does not send LeaveGroup on close.
    drop(a);
    let a2 = group_consumer(&bs, "g-static", &[("group.instance.id", "static-a")]);
    a2.subscribe(&["static"]).expect("subscribe a2");
    poll_until(&[&a2, &b], "a2 assigned", |_| !assigned(&a2).is_empty());
    assert_eq!(assigned(&a2), a_parts, "a2 gets a's partitions back");
    poll_until(&[&a2, &b], "settle", {
        let start = Instant::now();
        move |_| start.elapsed() > Duration::from_secs(3)
    });
    assert_eq!(
        b.context().assigns.load(Ordering::SeqCst),
        b_assigns,
        "b saw no rebalance"
    );
}

#[test]
fn committed_offsets_survive_sigkill_and_a_new_consumer_resumes() {
    let mut broker = broker();
    let bs = broker.bootstrap();
    create_topic(&bs, "resume", PARTITIONS, &[]);
    produce_numbered(&broker.bootstrap(), "resume", 0..600, TIMEOUT);
    {
        let c = group_consumer(&bs, "g-resume", &[]);
        c.subscribe(&["resume"]).expect("subscribe");
        poll_until(&[&c], "600 messages", |g| g[0].len() >= 600);
        c.commit_consumer_state(CommitMode::Sync).expect("commit");
        let committed = c
            .committed(Duration::from_secs(10))
            .expect("committed offsets");
        let total: i64 = committed
            .elements()
            .iter()
            .map(|e| e.offset().to_raw().unwrap_or(0))
            .sum();
        assert_eq!(total, 600, "committed offsets cover every message");
    }
    broker.kill9();
    broker.restart();
    let bs = broker.bootstrap();
    produce_numbered(&broker.bootstrap(), "resume", 600..900, TIMEOUT);
    let c = group_consumer(&bs, "g-resume", &[]);
    c.subscribe(&["resume"]).expect("subscribe");
    let got = poll_until(&[&c], "300 new messages", |g| g[0].len() >= 300);
    let extra = poll_until(&[&c], "settle", {
        let start = Instant::now();
        move |_| start.elapsed() > Duration::from_secs(1)
    });
    let ids: Vec<usize> = got[0]
        .iter()
        .chain(extra[0].iter())
        .map(|(_, id)| *id)
        .collect();
    assert_eq!(ids.len(), 300, "no message re-read");
    assert!(
        ids.iter().all(|id| (600..900).contains(id)),
        "re-read old: {ids:?}"
    );
}

#[test]
fn admin_lists_describes_and_deletes_groups() {
    let broker = broker();
    let bs = broker.bootstrap();
    create_topic(&bs, "admin", PARTITIONS, &[]);
    let a = group_consumer(&bs, "g-admin", &[("client.id", "admin-a")]);
    a.subscribe(&["admin"]).expect("subscribe");
    poll_until(&[&a], "assigned", |_| {
        assigned(&a).len() == PARTITIONS as usize
    });
    // librdkafka's group list: ListGroups on every node + DescribeGroups.
    let list = a
        .fetch_group_list(Some("g-admin"), Duration::from_secs(10))
        .expect("group list");
    let g = list
        .groups()
        .iter()
        .find(|g| g.name() == "g-admin")
        .expect("g-admin listed");
    assert_eq!(g.state(), "Stable");
    assert_eq!(g.protocol_type(), "consumer");
    assert_eq!(g.members().len(), 1);
    assert_eq!(g.members()[0].client_id(), "admin-a");
    assert!(
        g.members()[0].assignment().is_some_and(|b| !b.is_empty()),
        "the member's assignment is described"
    );
    let all = a
        .fetch_group_list(None, Duration::from_secs(10))
        .expect("all groups");
    assert!(all.groups().iter().any(|g| g.name() == "g-admin"));

    let admin = client::admin(&bs);
    // A live group cannot be deleted.
    let r = block_on(admin.delete_groups(&["g-admin"], &client::admin_opts())).expect("delete");
    assert!(r[0].is_err(), "NON_EMPTY_GROUP expected: {r:?}");
    a.commit_consumer_state(CommitMode::Sync).ok();
    drop(a);
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let r = block_on(admin.delete_groups(&["g-admin"], &client::admin_opts())).expect("delete");
        if r[0].is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "empty group not deleted: {r:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let r = block_on(admin.delete_groups(&["g-admin"], &client::admin_opts())).expect("delete");
    assert!(
        r[0].is_err(),
        "GROUP_ID_NOT_FOUND on the second delete: {r:?}"
    );
    let _ = HashMap::<i32, i32>::new();
}

#[test]
fn find_coordinator_places_keys_like_kafka_and_other_shards_refuse() {
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestGroup;
    use kafka_protocol::messages::{
        ListGroupsRequest, OffsetCommitRequest, OffsetFetchRequest, TopicName,
    };
    let broker = broker();
    let bs = broker.bootstrap();
    create_topic(&bs, "raw", 2, &[]);
    let mut raw = RawClient::connect(broker.port_of(0));
    // Batched (v4+): groups and transactional ids, each on its partition's shard.
    let keys = ["g-a", "g-b", "g-c", "g-d"];
    for key_type in [0i8, 1] {
        let resp = raw.request(
            4,
            &FindCoordinatorRequest::default()
                .with_key_type(key_type)
                .with_coordinator_keys(keys.iter().map(|k| StrBytes::from_static_str(k)).collect()),
        );
        assert_eq!(resp.coordinators.len(), keys.len());
        for c in &resp.coordinators {
            assert_eq!(c.error_code, 0, "{:?}", c);
            let node = c.node_id.0;
            assert!((0..2).contains(&node));
            assert_eq!(c.port as u16, broker.port_of(node as usize));
        }
    }
    let bad = raw.request(
        3,
        &FindCoordinatorRequest::default()
            .with_key(StrBytes::from_static_str("g-a"))
            .with_key_type(5),
    );
    assert_eq!(
        bad.error_code, 42,
        "INVALID_REQUEST for an unknown key type"
    );

    // The coordinator's shard serves the group; the other refuses it.
    let group = "g-a";
    let port = coordinator_port(&broker, group);
    let other = if port == broker.port_of(0) {
        broker.port_of(1)
    } else {
        broker.port_of(0)
    };
    let heartbeat = HeartbeatRequest::default()
        .with_group_id(GroupId(StrBytes::from_static_str(group)))
        .with_generation_id(1)
        .with_member_id(StrBytes::from_static_str("nobody"));
    let resp = RawClient::connect(other).request(2, &heartbeat);
    assert_eq!(resp.error_code, 16, "NOT_COORDINATOR on the wrong shard");
    let mut coord = RawClient::connect(port);
    // Right after the topic's creation the partition may still be loading
    // (COORDINATOR_LOAD_IN_PROGRESS, retriable).
    let resp = common::wait_for(TIMEOUT, "offsets partition loaded", || {
        let r = coord.request(2, &heartbeat);
        (r.error_code != 14).then_some(r)
    });
    assert_eq!(resp.error_code, 25, "UNKNOWN_MEMBER_ID on the right one");

    // A simple-consumer commit: known partitions succeed, unknown topics
    // fail, and so does metadata that is too large (OFFSET_METADATA_TOO_LARGE).
    let commit = OffsetCommitRequest::default()
        .with_group_id(GroupId(StrBytes::from_static_str(group)))
        .with_generation_id_or_member_epoch(-1)
        .with_topics(vec![
            OffsetCommitRequestTopic::default()
                .with_name(TopicName(StrBytes::from_static_str("raw")))
                .with_partitions(vec![
                    OffsetCommitRequestPartition::default()
                        .with_partition_index(0)
                        .with_committed_offset(42),
                    OffsetCommitRequestPartition::default()
                        .with_partition_index(7)
                        .with_committed_offset(1),
                    // Metadata over offset.metadata.max.bytes (4096).
                    OffsetCommitRequestPartition::default()
                        .with_partition_index(1)
                        .with_committed_offset(5)
                        .with_committed_metadata(Some(StrBytes::from_string("m".repeat(4097)))),
                ]),
            OffsetCommitRequestTopic::default()
                .with_name(TopicName(StrBytes::from_static_str("nope")))
                .with_partitions(vec![OffsetCommitRequestPartition::default()
                    .with_partition_index(0)
                    .with_committed_offset(1)]),
        ]);
    let resp = coord.request(8, &commit);
    let codes: Vec<(String, i32, i16)> = resp
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(move |p| (t.name.to_string(), p.partition_index, p.error_code))
        })
        .collect();
    assert_eq!(
        codes,
        vec![
            ("raw".into(), 0, 0),
            ("raw".into(), 7, 3),
            ("raw".into(), 1, 12),
            ("nope".into(), 0, 3)
        ]
    );
    // OffsetFetch v8: several groups at once (one unknown: offsets -1).
    let fetch = OffsetFetchRequest::default().with_groups(vec![OffsetFetchRequestGroup::default()
        .with_group_id(GroupId(StrBytes::from_static_str(group)))
        .with_topics(None)]);
    let resp = coord.request(8, &fetch);
    assert_eq!(resp.groups.len(), 1);
    assert_eq!(resp.groups[0].error_code, 0);
    let parts = &resp.groups[0].topics[0].partitions;
    assert_eq!(parts.len(), 1);
    assert_eq!(
        (parts[0].partition_index, parts[0].committed_offset),
        (0, 42)
    );
    // ListGroups with a state filter: the simple group is Empty.
    let list = coord.request(
        4,
        &ListGroupsRequest::default().with_states_filter(vec![StrBytes::from_static_str("Empty")]),
    );
    assert!(list.groups.iter().any(|g| g.group_id.0.as_str() == group));
    let list = coord.request(
        4,
        &ListGroupsRequest::default().with_states_filter(vec![StrBytes::from_static_str("Stable")]),
    );
    assert!(list.groups.is_empty());

    // A JoinGroup refused (session timeout below the broker's minimum)
    // leaves no group behind.
    let bad = "g-b";
    let mut c2 = RawClient::connect(coordinator_port(&broker, bad));
    let join = classic_join(bad, "", subscription("raw"))
        .with_session_timeout_ms(1000)
        .with_rebalance_timeout_ms(1000);
    let resp = common::wait_for(TIMEOUT, "offsets partition loaded", || {
        let r = c2.request(5, &join);
        (r.error_code != 14).then_some(r)
    });
    assert_eq!(resp.error_code, 26, "INVALID_SESSION_TIMEOUT");
    let list = c2.request(4, &ListGroupsRequest::default());
    assert!(
        list.groups.iter().all(|g| g.group_id.0.as_str() != bad),
        "refused join left a group: {list:?}"
    );
}
