//! A node cut off from its peers but not from its clients stops acting as
//! a partition leader and group coordinator once the metadata quorum has
//! fenced it (the lease: `metadata::lease`, `docs/replication.md` §3.3):
//! three nodes, one shard each, each in its own network namespace
//! (`common::netns`), a quorum of all three and a 3 s broker session
//! timeout.
//!
//! Why: a node isolated from the other nodes keeps its last metadata image.
//! Without a lease it goes on leading the partitions and coordinating the
//! groups of that image after the quorum fenced it and moved them away, and
//! a client that still reaches it (here the test, from the bridge's
//! gateway, which [`Net::isolate`] leaves connected) gets stale answers:
//! OffsetFetch answers the group's old committed offset (the committed
//! offset moves back) and an `acks=1` Produce is accepted (a write that is
//! truncated away later). With the lease a node acts as leader or
//! coordinator only while its last heartbeat answered by the quorum's
//! leader was sent less than the session timeout ago.
//!
//! The steps, run twice: once with C a node that does not lead the
//! metadata quorum (the cut moves leaderships without an election in the
//! way), once with C the quorum's leader (the others elect another first,
//! and C must not count its own answers to its heartbeats, as a leader
//! that has not yet noticed it lost its quorum, as a lease). The two run
//! one at a time ([`SERIAL`]): six nodes with 3 s sessions on a busy
//! two-core machine would miss heartbeats.
//! 1. node C coordinates group G (FindCoordinator; groups are tried until
//!    one's coordinator is, or is not, the quorum's leader) and leads the
//!    one partition P of a topic of replication factor 3
//!    (`min.insync.replicas=2`, created with C first in its assignment);
//!    G commits offset [`OFFSET_BEFORE`] on P at C;
//! 2. C is isolated; once both other nodes list P led elsewhere and name
//!    another coordinator of G, G commits [`OFFSET_AFTER`] there;
//! 3. asked directly, C answers OffsetFetch (v8) for G with the group error
//!    NOT_COORDINATOR, never [`OFFSET_BEFORE`], and an `acks=1` Produce to
//!    P with NOT_LEADER_OR_FOLLOWER, checked [`FENCED_CHECKS`] times;
//! 4. C rejoins; for [`REJOIN_WATCH`] every OffsetFetch it answers is a
//!    coordinator error (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS,
//!    COORDINATOR_NOT_AVAILABLE) or [`OFFSET_AFTER`], never less; in the
//!    end C is back in P's ISR and G's coordinator answers
//!    [`OFFSET_AFTER`];
//! 5. the nodes stop cleanly and no namespace is left behind.

mod common;

use common::cluster::{addr, agreed_coordinator, create_assigned, partition, quorum_leader};
use common::groups::simple_commit;
use common::netns::Net;
use common::raw::{only_partition, produce_request, RawClient};
use common::{wait_for, Broker};
use fjord::record::{BatchBuilder, Compression};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::{GroupId, OffsetFetchRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const NODES: usize = 3;
/// `--broker-session-timeout-ms`, shortened from Kafka's 9 s so the
/// isolated node is fenced (and its leaderships moved) quickly.
const SESSION_TIMEOUT_MS: u64 = 3000;
/// How long the quorum gets to elect, fence, and move a leadership or a
/// coordinator.
const SETTLE: Duration = Duration::from_secs(60);
const TOPIC: &str = "leased";
/// P: the topic's only partition.
const PARTITION: i32 = 0;
/// Groups `lease-group-<k>` are tried in turn for one whose coordinator
/// does not lead the metadata quorum; with three nodes the first few do.
const CANDIDATE_GROUPS_MAX: usize = 30;
/// The offset G commits at C before the cut.
const OFFSET_BEFORE: i64 = 10;
/// The offset G commits at the new coordinator while C is cut off.
const OFFSET_AFTER: i64 = 20;
/// OffsetCommit and OffsetFetch v8: the first OffsetFetch with groups,
/// each with its own error code (NOT_COORDINATOR is a group-level error).
const OFFSETS_VERSION: i16 = 8;
/// Produce v9, as `common::raw::produce_values` sends.
const PRODUCE_VERSION: i16 = 9;
/// How often, and how far apart, the isolated node is asked (~2 s).
const FENCED_CHECKS: usize = 10;
const FENCED_CHECK_INTERVAL_MS: u64 = 200;
/// How long the rejoined node's OffsetFetch answers are watched, and how
/// far apart.
const REJOIN_WATCH: Duration = Duration::from_secs(10);
const REJOIN_POLL_MS: u64 = 50;

/// Node `node`'s broker id (one shard each: node × 1000).
fn broker_id(node: usize) -> i32 {
    i32::try_from(node * 1000).expect("a broker id")
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// What an OffsetFetch of P for a group answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fetched {
    /// A group-level error code.
    Refused(i16),
    /// P's row: its error code and committed offset (-1: none).
    Committed { error: i16, offset: i64 },
}

/// OffsetFetch ([`OFFSETS_VERSION`]) of P for `group` through `raw`.
fn fetch(raw: &mut RawClient, group: &str) -> Fetched {
    let req = OffsetFetchRequest::default().with_groups(vec![OffsetFetchRequestGroup::default()
        .with_group_id(GroupId(s(group)))
        .with_topics(Some(vec![OffsetFetchRequestTopics::default()
            .with_name(TopicName(s(TOPIC)))
            .with_partition_indexes(vec![PARTITION])]))]);
    let resp = raw.request(OFFSETS_VERSION, &req);
    let g = &resp.groups[0];
    if g.error_code != 0 {
        return Fetched::Refused(g.error_code);
    }
    let p = &g.topics[0].partitions[0];
    Fetched::Committed {
        error: p.error_code,
        offset: p.committed_offset,
    }
}

/// OffsetCommit ([`OFFSETS_VERSION`]) of `offset` on P for `group` at
/// `at`, as a client outside the group's membership commits (generation
/// -1, no member id): P's error code.
fn commit(at: SocketAddr, group: &str, offset: i64) -> i16 {
    let req = simple_commit(group, TOPIC, PARTITION, offset);
    let resp = RawClient::connect_to(at).request(OFFSETS_VERSION, &req);
    resp.topics[0].partitions[0].error_code
}

/// The codes a coordinator answers while it is not (yet) one: asked again.
fn coordinator_busy(code: i16) -> bool {
    [
        ResponseError::NotCoordinator,
        ResponseError::CoordinatorLoadInProgress,
        ResponseError::CoordinatorNotAvailable,
    ]
    .iter()
    .any(|e| e.code() == code)
}

/// [`commit`], asked again while the coordinator at `at` is loading or not
/// yet one; then reads the offset back there.
fn commit_acknowledged(at: SocketAddr, group: &str, offset: i64) {
    wait_for(
        SETTLE,
        &format!("{group} committing {offset} at {at}"),
        || {
            let code = commit(at, group, offset);
            if coordinator_busy(code) {
                std::thread::sleep(Duration::from_millis(100));
                return None;
            }
            assert_eq!(code, 0, "OffsetCommit of {offset} for {group} at {at}");
            Some(())
        },
    );
    assert_eq!(
        fetch(&mut RawClient::connect_to(at), group),
        Fetched::Committed { error: 0, offset },
        "{group}'s offset read back at {at}"
    );
}

/// One `acks=1` Produce of one record to P through `raw`: its error code.
fn produce(raw: &mut RawClient) -> i16 {
    let batch = BatchBuilder::new(Compression::None)
        .record(None, Some(b"lease".as_slice()), &[], 1_700_000_000_000)
        .build()
        .freeze();
    let resp = raw.request(
        PRODUCE_VERSION,
        &produce_request(TOPIC, PARTITION, 1, batch),
    );
    only_partition(&resp).error_code
}

/// A group (and its coordinator's node and address, named alike by every
/// node of `all`) whose coordinator's node `wanted` accepts.
fn group_coordinated_by(
    all: &[&Broker],
    wanted: impl Fn(usize) -> bool,
) -> (String, usize, SocketAddr) {
    for k in 0..CANDIDATE_GROUPS_MAX {
        let group = format!("lease-group-{k}");
        // The first FindCoordinator creates `__consumer_offsets`.
        let (node, at) = wait_for(SETTLE, &format!("a coordinator of {group}"), || {
            agreed_coordinator(all, 0, &group)
        });
        if wanted(node) {
            return (group, node, at);
        }
    }
    panic!("none of {CANDIDATE_GROUPS_MAX} groups has a coordinator of the node wanted");
}

/// Whether every one of `asked` lists P led by a broker that `leader`
/// accepts, with an ISR that `isr` accepts.
fn listed_everywhere(
    asked: &[&Broker],
    leader: impl Fn(i32) -> bool,
    isr: impl Fn(&[i32]) -> bool,
) -> bool {
    asked
        .iter()
        .all(|b| partition(b, TOPIC, PARTITION).is_some_and(|p| leader(p.leader) && isr(&p.isr)))
}

/// Keeps the tests of this file from running at the same time.
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn a_node_cut_off_from_its_peers_stops_leading_and_coordinating() {
    cut_off_coordinator_stops(false);
}

#[test]
fn a_quorum_leader_cut_off_from_its_peers_stops_leading_and_coordinating() {
    cut_off_coordinator_stops(true);
}

/// The steps of the module doc, C the quorum's leader if `c_leads_quorum`.
fn cut_off_coordinator_stops(c_leads_quorum: bool) {
    // A test that failed holding the lock poisoned it: the next one runs.
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let net = Net::new(NODES);
    let namespaces: Vec<String> = net.hosts().iter().map(|h| h.ns.clone()).collect();
    let mut brokers = common::cluster::start_all(&net, NODES, SESSION_TIMEOUT_MS, SETTLE, |_| &[]);
    let all: Vec<&Broker> = brokers.iter().collect();

    // 1. C coordinates G and leads P, and G has committed OFFSET_BEFORE.
    let quorum = quorum_leader(&brokers.iter().map(Some).collect::<Vec<_>>(), SETTLE);
    let (group, c, c_addr) = group_coordinated_by(&all, |n| (n == quorum) == c_leads_quorum);
    println!("node {quorum} leads the metadata quorum; node {c} coordinates {group}");
    assert_eq!(c_addr, addr(&brokers[c]), "one shard per node");
    let others: Vec<usize> = (0..NODES).filter(|&i| i != c).collect();
    let replicas: Vec<i32> = std::iter::once(c)
        .chain(others.iter().copied())
        .map(broker_id)
        .collect();
    create_assigned(&brokers, TOPIC, &replicas, &[("min.insync.replicas", "2")]);
    wait_for(SETTLE, "P led by C, all three in its ISR", || {
        listed_everywhere(&all, |l| l == broker_id(c), |isr| isr.len() == NODES).then_some(())
    });
    let mut at_c = RawClient::connect_to(c_addr);
    wait_for(SETTLE, "an acks=1 Produce to P taken by C", || {
        let code = produce(&mut at_c);
        if code == ResponseError::NotLeaderOrFollower.code() {
            std::thread::sleep(Duration::from_millis(100));
            return None;
        }
        assert_eq!(code, 0, "Produce to P at node {c} before the cut");
        Some(())
    });
    commit_acknowledged(c_addr, &group, OFFSET_BEFORE);

    // 2. C cut off from its peers; the others move P and G away from it.
    net.isolate(c);
    let isolated_at = Instant::now();
    let asked: Vec<&Broker> = others.iter().map(|&i| &brokers[i]).collect();
    let (moved_to, moved_addr) = wait_for(
        SETTLE,
        &format!("nodes {others:?} to move P's leadership and {group}'s coordinator off node {c}"),
        || {
            let led_elsewhere =
                listed_everywhere(&asked, |l| l >= 0 && l != broker_id(c), |_| true);
            led_elsewhere
                .then(|| agreed_coordinator(&asked, 0, &group))
                .flatten()
                .filter(|(node, _)| *node != c)
        },
    );
    println!(
        "{:?} after the cut, nodes {others:?} list P led elsewhere and node {moved_to} coordinating {group}",
        isolated_at.elapsed()
    );
    commit_acknowledged(moved_addr, &group, OFFSET_AFTER);

    // 3. C, asked directly, neither answers the old offset nor takes a write.
    for check in 0..FENCED_CHECKS {
        let fetched = fetch(&mut at_c, &group);
        if let Fetched::Committed { offset, .. } = fetched {
            assert!(
                offset < 0,
                "node {c}, cut off from its peers {:?} ago and no longer {group}'s coordinator \
                 (node {moved_to} is, and took offset {OFFSET_AFTER}), answered OffsetFetch \
                 v{OFFSETS_VERSION} (check {check}) with the committed offset {offset} \
                 ({fetched:?}): a stale coordinator; it must answer NOT_COORDINATOR",
                isolated_at.elapsed()
            );
        }
        assert_eq!(
            fetched,
            Fetched::Refused(ResponseError::NotCoordinator.code()),
            "node {c}'s OffsetFetch v{OFFSETS_VERSION} of {group} while cut off (check {check})"
        );
        let produced = produce(&mut at_c);
        assert_eq!(
            produced,
            ResponseError::NotLeaderOrFollower.code(),
            "node {c}, cut off from its peers {:?} ago and no longer P's leader, answered an \
             acks=1 Produce to P with {produced} (check {check}); it must answer \
             NOT_LEADER_OR_FOLLOWER",
            isolated_at.elapsed()
        );
        std::thread::sleep(Duration::from_millis(FENCED_CHECK_INTERVAL_MS));
    }

    // 4. C rejoins: it answers a coordinator error or the new offset, never
    // an older one, and the cluster ends whole.
    net.rejoin(c);
    let rejoined_at = Instant::now();
    let mut answers: BTreeMap<String, usize> = BTreeMap::new();
    while rejoined_at.elapsed() < REJOIN_WATCH {
        let fetched = fetch(&mut at_c, &group);
        match fetched {
            Fetched::Refused(code) if coordinator_busy(code) => {}
            Fetched::Committed {
                error: 0,
                offset: OFFSET_AFTER,
            } => {}
            other => panic!(
                "node {c}, {:?} after it rejoined its peers, answered OffsetFetch v{OFFSETS_VERSION} \
                 of {group} with {other:?}: neither a coordinator error nor offset {OFFSET_AFTER} \
                 (answers so far: {answers:?})",
                rejoined_at.elapsed()
            ),
        }
        *answers.entry(format!("{fetched:?}")).or_default() += 1;
        std::thread::sleep(Duration::from_millis(REJOIN_POLL_MS));
    }
    println!("node {c}'s answers in the {REJOIN_WATCH:?} after it rejoined: {answers:?}");
    wait_for(SETTLE, "node C back in P's ISR at every node", || {
        listed_everywhere(
            &all,
            |l| l >= 0,
            |isr| isr.len() == NODES && isr.contains(&broker_id(c)),
        )
        .then_some(())
    });
    let (last, last_addr) = wait_for(SETTLE, &format!("one coordinator of {group}"), || {
        agreed_coordinator(&all, 0, &group)
    });
    wait_for(
        SETTLE,
        &format!("{group}'s offset at node {last}"),
        || match fetch(&mut RawClient::connect_to(last_addr), &group) {
            Fetched::Refused(code) if coordinator_busy(code) => None,
            fetched => {
                assert_eq!(
                    fetched,
                    Fetched::Committed {
                        error: 0,
                        offset: OFFSET_AFTER
                    },
                    "{group}'s offset at node {last}, its coordinator once whole"
                );
                Some(())
            }
        },
    );

    // 5. A clean stop, and no namespace left behind.
    drop(at_c);
    for b in &mut brokers {
        b.stop();
    }
    drop(brokers);
    drop(net);
    let out = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    let listed = String::from_utf8_lossy(&out.stdout);
    let left: Vec<&String> = namespaces
        .iter()
        .filter(|ns| {
            listed
                .lines()
                .any(|l| l.split_whitespace().next() == Some(ns))
        })
        .collect();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
}
