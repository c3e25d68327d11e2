//! What replication promises when replicas fail (`docs/replication.md`
//! §4.1, §4.4), three nodes in network namespaces (`common::netns`), one
//! shard each, a quorum of all three:
//! - a follower counts for acks=all only once it has written what it
//!   fetched: with both followers' segment writes slowed down
//!   (`--direct-writes --debug-write-delay-ms`), an acks=all produce is answered only
//!   when both followers' segment files hold the batch (so a kill -9 of a
//!   follower loses nothing the leader counted);
//! - `unclean.leader.election.enable`: with `min.insync.replicas=1`, a
//!   leader alone in the ISR acknowledges writes its follower never got;
//!   that leader lost and the follower back, a topic with unclean
//!   elections allowed is led by the follower, without those writes (what
//!   Kafka documents), while the same topic without it stays offline
//!   until the old leader returns, and then leads with every write;
//! - a leader killed -9 and started again (before or after it is fenced)
//!   comes back out of the ISR (an unclean shutdown: its machine may have
//!   lost its page cache, KIP-966): another ISR member leads, with every
//!   acknowledged write, and the old leader rejoins as a follower.

mod common;

use common::cluster::{addr, create_assigned};
use common::netns::Net;
use common::raw::{only_partition, produce_request, RawClient};
use common::Broker;
use std::time::Duration;

const NODES: usize = 3;
/// `--broker-session-timeout-ms`, shortened from Kafka's 9 s.
const SESSION_TIMEOUT_MS: u64 = 3000;
const SETTLE: Duration = Duration::from_secs(60);

/// The [`NODES`] nodes of `net`, node `i` with `extra(i)` arguments, once
/// every one is registered.
fn start_all<'a>(net: &Net, extra: impl Fn(usize) -> &'a [String]) -> Vec<Broker> {
    common::cluster::start_all(net, NODES, SESSION_TIMEOUT_MS, SETTLE, extra)
}

/// Partition 0 of `topic` as `broker`'s Metadata lists it: (leader, ISR
/// sorted); None if not listed.
fn partition0(broker: &Broker, topic: &str) -> Option<(i32, Vec<i32>)> {
    let p = common::cluster::partition(broker, topic, 0)?.sorted();
    Some((p.leader, p.isr))
}

/// Waits until `broker` lists partition 0 of `topic` as `want`.
fn wait_listed(broker: &Broker, topic: &str, want: (i32, &[i32])) {
    common::wait_for(SETTLE, &format!("{topic} listed as {want:?}"), || {
        let (leader, isr) = partition0(broker, topic)?;
        (leader == want.0 && isr == want.1).then_some(())
    });
}

/// One batch of one record `value`.
fn batch(value: &str) -> bytes::Bytes {
    fjord::record::BatchBuilder::new(fjord::record::Compression::None)
        .record(None, Some(value.as_bytes()), &[], 1_700_000_000_000)
        .build()
        .freeze()
}

/// Produces `value` to partition 0 of `topic` at `broker` with acks=all;
/// the partition's error code.
fn produce_all(broker: &Broker, topic: &str, value: &str) -> i16 {
    let resp = RawClient::connect_to(addr(broker))
        .request(9, &produce_request(topic, 0, -1, batch(value)));
    only_partition(&resp).error_code
}

/// Partition 0's ListOffsets LATEST at `broker`, its leader: the HW.
fn latest(broker: &Broker, topic: &str) -> i64 {
    common::cluster::latest(broker, topic, 0, SETTLE)
}

/// Waits until `broker`, leading partition 0 of `topic`, answers
/// ListOffsets LATEST with `hw` (a new leader's HW reaches its log end
/// once its ISR, here itself, is counted), and checks it stays there.
fn wait_latest(broker: &Broker, topic: &str, hw: i64) {
    common::wait_for(SETTLE, &format!("{topic}'s HW at {hw}"), || {
        let now = latest(broker, topic);
        assert!(now <= hw, "{topic}'s HW {now} is past {hw}");
        (now == hw).then_some(())
    });
}

/// Records in `broker`'s replica of partition 0 of `topic`.
fn stored_records(broker: &Broker, topic: &str) -> usize {
    common::disk::batches(&broker.first_segment(topic, 0))
        .iter()
        .map(|b| b.header.records_count.max(0) as usize)
        .sum()
}

#[test]
fn a_follower_counts_for_acks_all_only_once_it_has_written() {
    let net = Net::new(NODES);
    // Node 0 leads; the followers' segment writes (direct writes: the
    // path the delay applies to) each wait 1.5 s.
    let slow = [
        "--direct-writes".to_string(),
        format!("--debug-write-delay-ms={}", 1500),
    ];
    let brokers = start_all(&net, |i| if i == 0 { &[] } else { &slow });
    let topic = "written";
    create_assigned(&brokers, topic, &[0, 1000, 2000], &[]);
    wait_listed(&brokers[0], topic, (0, &[0, 1000, 2000]));
    for n in 1..=3 {
        assert_eq!(produce_all(&brokers[0], topic, &format!("v{n}")), 0);
        // Answered: every ISR member counted, so each has written it.
        for (i, b) in brokers.iter().enumerate() {
            assert_eq!(
                stored_records(b, topic),
                n,
                "node {i} holds every acknowledged record in its segment file"
            );
        }
    }
}

#[test]
fn an_unclean_election_loses_what_the_new_leader_lacks_and_a_clean_topic_waits() {
    let net = Net::new(NODES);
    let mut brokers = start_all(&net, |_| &[]);
    // Two replicas, on nodes 0 (leading) and 1; node 2 holds none.
    let (unclean, clean) = ("unclean", "clean");
    let min1 = ("min.insync.replicas", "1");
    create_assigned(
        &brokers,
        unclean,
        &[0, 1000],
        &[min1, ("unclean.leader.election.enable", "true")],
    );
    create_assigned(&brokers, clean, &[0, 1000], &[min1]);
    for topic in [unclean, clean] {
        wait_listed(&brokers[0], topic, (0, &[0, 1000]));
        for v in ["a", "b", "c"] {
            assert_eq!(produce_all(&brokers[0], topic, v), 0);
        }
    }
    // The follower dies: fenced, out of both ISRs; the leader alone
    // acknowledges two more writes (min.insync.replicas=1).
    brokers[1].kill9();
    for topic in [unclean, clean] {
        wait_listed(&brokers[0], topic, (0, &[0]));
        for v in ["d", "e"] {
            assert_eq!(produce_all(&brokers[0], topic, v), 0);
        }
        assert_eq!(latest(&brokers[0], topic), 5);
    }
    // The leader stops too (cleanly: an unclean restart would take it out
    // of the ELR, see the next test), and the follower returns.
    brokers[0].stop();
    brokers[1].restart();
    // Allowed: the follower leads, uncleanly, with the three records it
    // had: the two acknowledged while it was down are lost.
    wait_listed(&brokers[2], unclean, (1000, &[1000]));
    wait_listed(&brokers[1], unclean, (1000, &[1000]));
    wait_latest(&brokers[1], unclean, 3);
    // Not allowed: offline while only the follower is live.
    wait_listed(&brokers[2], clean, (-1, &[]));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(partition0(&brokers[2], clean), Some((-1, vec![])));
    // The old leader returns: it leads the clean topic again with all five
    // (an eligible leader replica, KIP-966, kept by its clean shutdown),
    // and follows the unclean one, cut back to the new leader's three.
    brokers[0].restart();
    common::wait_for(SETTLE, "the clean topic led by its old leader", || {
        (partition0(&brokers[0], clean)?.0 == 0).then_some(())
    });
    wait_latest(&brokers[0], clean, 5);
    wait_listed(&brokers[1], unclean, (1000, &[0, 1000]));
    common::wait_for(
        SETTLE,
        "the old leader cut back to the new one's log",
        || (stored_records(&brokers[0], unclean) == 3).then_some(()),
    );
}

#[test]
fn a_leader_back_from_an_unclean_shutdown_leads_no_more() {
    let net = Net::new(NODES);
    let mut brokers = start_all(&net, |_| &[]);
    let topic = "restarted";
    create_assigned(&brokers, topic, &[0, 1000, 2000], &[]);
    wait_listed(&brokers[0], topic, (0, &[0, 1000, 2000]));
    for v in ["a", "b", "c"] {
        assert_eq!(produce_all(&brokers[0], topic, v), 0);
    }
    // Killed and started again at once, usually before it is fenced.
    brokers[0].kill9();
    brokers[0].restart();
    // (It may be back in the ISR by the time this looks: it catches up
    // fast.)
    let leader = common::wait_for(SETTLE, "a new leader", || {
        let (leader, _) = partition0(&brokers[1], topic)?;
        (leader > 0).then_some(leader)
    });
    let new_leader = &brokers[usize::try_from(leader / 1000).expect("a node")];
    wait_latest(new_leader, topic, 3);
    assert_eq!(produce_all(new_leader, topic, "d"), 0);
    // The old leader catches up and is back in the ISR, as a follower.
    wait_listed(&brokers[1], topic, (leader, &[0, 1000, 2000]));
    common::wait_for(SETTLE, "the old leader's copy of all four", || {
        (stored_records(&brokers[0], topic) == 4).then_some(())
    });
}
