//! Durability across restarts: every message acknowledged with acks=all
//! survives a SIGKILL (and a clean SIGTERM stop), and none is duplicated.

mod common;

use common::client::{self, await_deliveries, create_topic, send, TestMessage};
use common::{Broker, BrokerOpts};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

const MESSAGES: usize = 20_000;
const PARTITIONS: i32 = 4;
const TIMEOUT: Duration = Duration::from_secs(120);
const SETTLE: Duration = Duration::from_millis(1_000);

fn message(id: usize) -> TestMessage {
    TestMessage {
        id,
        key: format!("k{}", id % 97).into_bytes(),
        value: format!("restart-value-{id}").into_bytes(),
        headers: vec![("id".into(), id.to_string().into_bytes())],
    }
}

/// Produces `MESSAGES` with acks=all and returns id → (partition, offset)
/// from the delivery reports, all of which must be successes.
fn produce_acked(broker: &Broker, topic: &str) -> HashMap<usize, (i32, i64)> {
    let producer = client::producer(&broker.bootstrap(), &[("acks", "all"), ("linger.ms", "2")]);
    for id in 0..MESSAGES {
        send(&producer, topic, &message(id));
    }
    let deliveries = await_deliveries(&producer, MESSAGES, TIMEOUT);
    let mut acked = HashMap::new();
    for d in deliveries {
        assert!(
            d.error.is_none(),
            "message {} not acknowledged: {:?}",
            d.id,
            d.error
        );
        acked.insert(d.id, (d.partition, d.offset));
    }
    assert_eq!(acked.len(), MESSAGES);
    acked
}

/// Consumes the topic and asserts it holds exactly the acknowledged
/// messages, each once, at the offset its delivery report gave.
fn assert_exactly(broker: &Broker, topic: &str, acked: &HashMap<usize, (i32, i64)>) {
    let consumed = client::consume(
        &broker.bootstrap(),
        topic,
        PARTITIONS,
        acked.len(),
        SETTLE,
        TIMEOUT,
    );
    let mut seen = HashSet::new();
    for c in &consumed {
        let id: usize = String::from_utf8_lossy(c.value.as_deref().unwrap_or_default())
            .strip_prefix("restart-value-")
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("unexpected message {c:?}"));
        assert!(seen.insert(id), "message {id} duplicated");
        assert_eq!(
            Some((c.partition, c.offset)),
            acked.get(&id).copied(),
            "message {id} moved"
        );
        assert_eq!(c.key.as_deref(), Some(message(id).key.as_slice()));
    }
    assert_eq!(
        consumed.len(),
        acked.len(),
        "exactly the acknowledged messages"
    );
}

/// Produces message `MESSAGES` (one past `acked`) and asserts it lands at
/// the end of its partition, after every acknowledged message; returns
/// where it landed.
fn produce_one_more(
    broker: &Broker,
    topic: &str,
    acked: &HashMap<usize, (i32, i64)>,
) -> (i32, i64) {
    let more = client::producer(&broker.bootstrap(), &[("acks", "all")]);
    send(&more, topic, &message(MESSAGES));
    let d = await_deliveries(&more, 1, TIMEOUT);
    assert!(
        d[0].error.is_none(),
        "produce after a restart: {:?}",
        d[0].error
    );
    let next_offset = acked
        .values()
        .filter(|(p, _)| *p == d[0].partition)
        .map(|(_, o)| o + 1)
        .max()
        .unwrap_or(0);
    assert_eq!(
        d[0].offset, next_offset,
        "appends continue at the recovered log end"
    );
    (d[0].partition, d[0].offset)
}

fn survives_kill9(opts: BrokerOpts, topic: &str) {
    let mut broker = Broker::start(opts);
    create_topic(&broker.bootstrap(), topic, PARTITIONS, &[]);
    let acked = produce_acked(&broker, topic);
    broker.kill9();
    broker.restart();
    assert_exactly(&broker, topic, &acked);
    // The recovered log keeps accepting appends after what was recovered.
    produce_one_more(&broker, topic, &acked);
    broker.stop();
}

#[test]
fn acks_all_messages_survive_kill9() {
    survives_kill9(BrokerOpts::default(), "restart-kill9");
}

#[test]
fn acks_all_messages_survive_kill9_with_fsync_acks() {
    survives_kill9(
        BrokerOpts::default().arg("--fsync-acks"),
        "restart-kill9-fsync",
    );
}

#[test]
fn messages_and_topics_survive_clean_restart() {
    let mut broker = Broker::start(BrokerOpts::default());
    let topic = "restart-clean";
    create_topic(
        &broker.bootstrap(),
        topic,
        PARTITIONS,
        &[("compression.type", "gzip")],
    );
    let acked = produce_acked(&broker, topic);
    broker.stop();
    broker.restart();
    assert_exactly(&broker, topic, &acked);
    let leaders = client::partition_leaders(&broker.bootstrap(), topic);
    assert_eq!(
        leaders.len(),
        PARTITIONS as usize,
        "the topic's partitions survive"
    );
    broker.stop();
}

/// The `logs recovered` lines (one per shard) and the producer-state
/// replays of one start, from its stderr: (segments scanned, clean
/// shutdown) per shard, and the batches each partition replayed.
fn recovery_of(stderr: &str) -> (Vec<(u64, bool)>, Vec<u64>) {
    let field = |line: &str, name: &str| -> Option<String> {
        let at = line.find(&format!("{name}="))? + name.len() + 1;
        Some(line[at..].split_whitespace().next()?.to_string())
    };
    let mut shards = Vec::new();
    let mut replays = Vec::new();
    for line in common::strip_ansi(stderr).lines() {
        if line.contains("logs recovered") {
            let scanned = field(line, "segments_scanned").and_then(|v| v.parse().ok());
            let clean = field(line, "clean_shutdown").and_then(|v| v.parse().ok());
            shards.push((
                scanned.expect("segments_scanned"),
                clean.expect("clean_shutdown"),
            ));
        }
        if line.contains("producer state rebuilt") {
            replays.push(
                field(line, "replayed_batches")
                    .and_then(|v| v.parse().ok())
                    .expect("replayed_batches"),
            );
        }
    }
    (shards, replays)
}

/// A start after a clean stop trusts every segment (Kafka's clean-shutdown
/// skip of recovery): no segment is scanned and no batch replayed, the
/// data is all there and appends continue at its end. After a kill -9 the
/// marker is gone, and the next start scans the active segments again.
#[test]
fn a_start_after_a_clean_stop_scans_no_segment_and_replays_no_batch() {
    let mut broker = Broker::start(BrokerOpts::default());
    let topic = "restart-no-scan";
    create_topic(&broker.bootstrap(), topic, PARTITIONS, &[]);
    let mut acked = produce_acked(&broker, topic);
    // A partition with less than one index interval of data: its offset
    // index has no entry, and it is trusted all the same.
    let small = "restart-no-scan-small";
    create_topic(&broker.bootstrap(), small, 1, &[]);
    let p = client::producer(&broker.bootstrap(), &[("acks", "all")]);
    for id in 0..3 {
        send(&p, small, &message(id));
    }
    let d = await_deliveries(&p, 3, TIMEOUT);
    assert!(d.iter().all(|d| d.error.is_none()), "small topic: {d:?}");
    let (first, _) = recovery_of(&broker.stderr_since(0));
    assert!(
        first.iter().all(|&(_, clean)| !clean),
        "a first start is not after a clean stop: {first:?}"
    );
    broker.stop();
    let before = broker.stderr_len();
    broker.restart();
    let (shards, replays) = recovery_of(&broker.stderr_since(before));
    assert_eq!(shards.len(), broker.cores(), "one line per shard");
    assert!(
        shards.iter().all(|&(scanned, clean)| scanned == 0 && clean),
        "after a clean stop no segment is scanned: {shards:?}\n{}",
        broker.stderr_tail()
    );
    assert!(
        replays.iter().all(|&n| n == 0),
        "after a clean stop no batch is replayed: {replays:?}"
    );
    assert_exactly(&broker, topic, &acked);
    // The trusted active segments take appends at their ends.
    let at = produce_one_more(&broker, topic, &acked);
    acked.insert(MESSAGES, at);
    broker.kill9();
    let before = broker.stderr_len();
    broker.restart();
    let (shards, _) = recovery_of(&broker.stderr_since(before));
    assert!(
        shards.iter().all(|&(_, clean)| !clean)
            && shards.iter().map(|&(scanned, _)| scanned).sum::<u64>() > 0,
        "after a kill -9 the active segments are scanned: {shards:?}"
    );
    assert_exactly(&broker, topic, &acked);
    broker.stop();
}

/// A broker restarted while its port is still held (as right after a
/// SIGKILL, when the kernel releases the dead process's io_uring and its
/// listening sockets a moment later) waits for the port instead of failing,
/// and comes back on the same ports, so its clients find it again.
#[test]
fn a_restart_waits_for_its_port_to_be_released() {
    let mut broker = Broker::start(BrokerOpts::default());
    let topic = "restart-port";
    create_topic(&broker.bootstrap(), topic, 2, &[]);
    let port = broker.port;
    broker.kill9();
    // Hold shard 1's port as soon as the dead broker lets go of it.
    let port_1 = broker.port_of(1);
    let holder = common::wait_for(TIMEOUT, "shard 1's port to be released", || {
        std::net::TcpListener::bind(("127.0.0.1", port_1)).ok()
    });
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        drop(holder);
    });
    broker.restart();
    release.join().expect("releasing thread");
    assert_eq!(broker.port, port, "the restarted broker keeps its ports");
    assert!(
        broker
            .stderr_tail()
            .contains("address in use; waiting for it to be released"),
        "the broker said it waited for its port"
    );
    // Both shards serve: a message to each partition is acknowledged.
    let p = client::producer(&broker.bootstrap(), &[("acks", "all")]);
    for partition in 0..2 {
        let record = rdkafka::producer::BaseRecord::<(), [u8], usize>::with_opaque_to(topic, 0)
            .partition(partition)
            .payload(&b"v"[..]);
        p.send(record).expect("enqueue");
    }
    let d = await_deliveries(&p, 2, TIMEOUT);
    assert!(d.iter().all(|d| d.error.is_none()), "{d:?}");
    broker.stop();
}
