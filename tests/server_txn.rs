//! Transactions with librdkafka (a transaction-version-1 client: it sends
//! AddPartitionsToTxn and EndTxn v0–1, so its epoch moves only on
//! InitProducerId and fencing). Offsets, visibility and positions are those
//! of KAFKA_BEHAVIOUR.md §5; the exact per-transaction epochs of version 2
//! are checked with raw requests in `server_txn_raw.rs`.

mod common;

use common::client::{self, base_config};
use common::{Broker, BrokerOpts};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(30);

fn txn_producer(bootstrap: &str, id: &str, extra: &[(&str, &str)]) -> BaseProducer {
    let mut c = base_config(bootstrap);
    c.set("transactional.id", id)
        .set("transaction.timeout.ms", "60000")
        .set("linger.ms", "0");
    for (k, v) in extra {
        c.set(*k, *v);
    }
    c.create().expect("transactional producer")
}

fn send(p: &BaseProducer, topic: &str, value: &str) {
    p.send(BaseRecord::<(), str>::to(topic).payload(value).partition(0))
        .map_err(|(e, _)| e)
        .expect("enqueue");
    p.flush(TIMEOUT).expect("flush");
}

/// Every (value, offset) of partition 0 from the beginning, under
/// `isolation`, and the consumer's position at the end.
fn read_all(
    bootstrap: &str,
    topic: &str,
    isolation: &str,
    end_offset: i64,
) -> (Vec<(String, i64)>, i64) {
    let consumer: BaseConsumer = {
        let mut c = base_config(bootstrap);
        c.set("group.id", format!("reader-{isolation}"))
            .set("enable.auto.commit", "false")
            .set("isolation.level", isolation)
            .set("enable.partition.eof", "false");
        c.create().expect("consumer")
    };
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let deadline = Instant::now() + TIMEOUT;
    let mut out = Vec::new();
    loop {
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.expect("consume");
            out.push((
                String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
                m.offset(),
            ));
        }
        let position = consumer
            .position()
            .ok()
            .and_then(|tpl| tpl.find_partition(topic, 0).map(|p| p.offset()));
        if let Some(Offset::Offset(pos)) = position {
            if pos >= end_offset {
                // Drain anything polled in the same round.
                while let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
                    out.push((
                        String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
                        m.offset(),
                    ));
                }
                return (out, pos);
            }
        }
        assert!(
            Instant::now() < deadline,
            "{isolation} consumer stuck at {position:?}, got {out:?}"
        );
    }
}

fn pairs(v: &[(&str, i64)]) -> Vec<(String, i64)> {
    v.iter().map(|(s, o)| (s.to_string(), *o)).collect()
}

#[test]
fn commit_abort_commit_with_librdkafka() {
    let broker = Broker::start(BrokerOpts::default().cores(2));
    let topic = "tx-abc";
    client::create_topic(&broker.bootstrap(), topic, 1, &[]);
    let p = txn_producer(&broker.bootstrap(), "tx-abc-id", &[]);
    p.init_transactions(TIMEOUT).expect("init_transactions");

    p.begin_transaction().unwrap();
    for v in ["c1", "c2", "c3"] {
        send(&p, topic, v);
    }
    p.commit_transaction(TIMEOUT).expect("commit A");

    p.begin_transaction().unwrap();
    for v in ["a1", "a2", "a3"] {
        send(&p, topic, v);
    }
    // While B is open: HW 7, LSO 4.
    let (_, hw) = client::consumer(
        &broker.bootstrap(),
        &[("isolation.level", "read_uncommitted")],
    )
    .fetch_watermarks(topic, 0, TIMEOUT)
    .expect("watermarks");
    assert_eq!(hw, 7, "read_uncommitted end (HW) while B is open");
    let (_, lso) = client::consumer(
        &broker.bootstrap(),
        &[("isolation.level", "read_committed")],
    )
    .fetch_watermarks(topic, 0, TIMEOUT)
    .expect("watermarks");
    assert_eq!(lso, 4, "read_committed end (LSO) while B is open");
    p.abort_transaction(TIMEOUT).expect("abort B");

    p.begin_transaction().unwrap();
    for v in ["c4", "c5"] {
        send(&p, topic, v);
    }
    p.commit_transaction(TIMEOUT).expect("commit C");

    let (uncommitted, pos) = read_all(&broker.bootstrap(), topic, "read_uncommitted", 11);
    assert_eq!(
        uncommitted,
        pairs(&[
            ("c1", 0),
            ("c2", 1),
            ("c3", 2),
            ("a1", 4),
            ("a2", 5),
            ("a3", 6),
            ("c4", 8),
            ("c5", 9)
        ])
    );
    assert_eq!(pos, 11);
    let (committed, pos) = read_all(&broker.bootstrap(), topic, "read_committed", 11);
    assert_eq!(
        committed,
        pairs(&[("c1", 0), ("c2", 1), ("c3", 2), ("c4", 8), ("c5", 9)])
    );
    assert_eq!(pos, 11);

    // Markers at 3 (COMMIT), 7 (ABORT), 10 (COMMIT); the .txnindex entry.
    let stored = common::disk::batches(&broker.first_segment(topic, 0));
    let markers: Vec<i64> = stored
        .iter()
        .filter(|b| b.header.is_control())
        .map(|b| b.header.base_offset)
        .collect();
    assert_eq!(markers, vec![3, 7, 10]);
    let index = std::fs::read(
        broker
            .data_dir()
            .join(format!("{topic}-0/00000000000000000000.txnindex")),
    )
    .unwrap();
    let e = fjord::producer::txn_index::AbortedTxn::decode(&index).expect("one entry");
    assert_eq!(
        (e.first_offset, e.last_offset, e.last_stable_offset),
        (4, 7, 8)
    );
}

#[test]
fn a_second_producer_fences_the_first_with_librdkafka() {
    let broker = Broker::start(BrokerOpts::default().cores(2));
    let topic = "tx-fence";
    client::create_topic(&broker.bootstrap(), topic, 1, &[]);
    let p1 = txn_producer(&broker.bootstrap(), "tx-fence-id", &[]);
    p1.init_transactions(TIMEOUT).unwrap();
    p1.begin_transaction().unwrap();
    send(&p1, topic, "z1");

    let p2 = txn_producer(&broker.bootstrap(), "tx-fence-id", &[]);
    p2.init_transactions(TIMEOUT)
        .expect("producer 2 fences producer 1");
    let err = p1
        .commit_transaction(TIMEOUT)
        .expect_err("producer 1 is fenced");
    let text = err.to_string().to_lowercase();
    assert!(
        text.contains("fenc") || text.contains("epoch"),
        "unexpected error: {err}"
    );

    p2.begin_transaction().unwrap();
    send(&p2, topic, "y1");
    p2.commit_transaction(TIMEOUT).unwrap();

    let (uncommitted, _) = read_all(&broker.bootstrap(), topic, "read_uncommitted", 4);
    assert_eq!(uncommitted, pairs(&[("z1", 0), ("y1", 2)]));
    let (committed, _) = read_all(&broker.bootstrap(), topic, "read_committed", 4);
    assert_eq!(committed, pairs(&[("y1", 2)]));
    let epochs: Vec<(i64, i16, bool)> = common::disk::batches(&broker.first_segment(topic, 0))
        .iter()
        .map(|b| {
            (
                b.header.base_offset,
                b.header.producer_epoch,
                b.header.is_control(),
            )
        })
        .collect();
    // z1 e0 @0, ABORT e1 @1, y1 e2 @2, COMMIT @3 (epoch 2 for this
    // version-1 client; a version-2 client's marker has epoch 3).
    assert_eq!(
        epochs,
        vec![(0, 0, false), (1, 1, true), (2, 2, false), (3, 2, true)]
    );
}

/// Reads `count` messages from a subscribed consumer.
fn poll_n(consumer: &BaseConsumer, count: usize) -> Vec<(String, i64)> {
    let deadline = Instant::now() + TIMEOUT;
    let mut out = Vec::new();
    while out.len() < count {
        assert!(Instant::now() < deadline, "got only {out:?}");
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.expect("consume");
            out.push((
                String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
                m.offset(),
            ));
        }
    }
    out
}

#[test]
fn consume_transform_produce_exactly_once() {
    const INPUT: usize = 30;
    const BATCH: usize = 10;
    let broker = Broker::start(BrokerOpts::default().cores(2));
    let bootstrap = broker.bootstrap();
    client::create_topic(&bootstrap, "ctp-in", 1, &[]);
    client::create_topic(&bootstrap, "ctp-out", 1, &[]);
    let plain = client::producer(&bootstrap, &[("acks", "all")]);
    for i in 0..INPUT {
        let msg = client::TestMessage {
            id: i,
            key: Vec::new(),
            value: format!("v{i}").into_bytes(),
            headers: Vec::new(),
        };
        client::send(&plain, "ctp-in", &msg);
    }
    client::await_deliveries(&plain, INPUT, TIMEOUT);

    let consumer: BaseConsumer = {
        let mut c = base_config(&bootstrap);
        c.set("group.id", "ctp-group")
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("isolation.level", "read_committed");
        c.create().expect("consumer")
    };
    consumer.subscribe(&["ctp-in"]).unwrap();
    let p = txn_producer(&bootstrap, "ctp-tx", &[]);
    p.init_transactions(TIMEOUT).unwrap();

    let mut round = 0;
    let mut done = 0;
    while done < INPUT {
        let batch = poll_n(&consumer, BATCH);
        let first = batch[0].1;
        p.begin_transaction().unwrap();
        for (v, _) in &batch {
            send(&p, "ctp-out", &format!("out-{v}"));
        }
        let next = batch.last().unwrap().1 + 1;
        let mut offsets = TopicPartitionList::new();
        offsets
            .add_partition_offset("ctp-in", 0, Offset::Offset(next))
            .unwrap();
        let meta = consumer.group_metadata().expect("group metadata");
        p.send_offsets_to_transaction(&offsets, &meta, TIMEOUT)
            .expect("send offsets");
        round += 1;
        if round == 2 {
            // Abort the second batch: its output and its offsets vanish, and
            // the consumer goes back to re-process it.
            p.abort_transaction(TIMEOUT).unwrap();
            consumer
                .seek("ctp-in", 0, Offset::Offset(first), TIMEOUT)
                .expect("seek back");
        } else {
            p.commit_transaction(TIMEOUT).unwrap();
            done += batch.len();
        }
    }

    // Every input exactly once in the committed output, in order.
    let reader: BaseConsumer = {
        let mut c = base_config(&bootstrap);
        c.set("group.id", "ctp-reader")
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed");
        c.create().unwrap()
    };
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("ctp-out", 0, Offset::Beginning)
        .unwrap();
    reader.assign(&tpl).unwrap();
    let values: Vec<String> = poll_n(&reader, INPUT).into_iter().map(|(v, _)| v).collect();
    let expected: Vec<String> = (0..INPUT).map(|i| format!("out-v{i}")).collect();
    assert_eq!(values, expected);
    assert!(
        reader.poll(Duration::from_millis(1500)).is_none(),
        "no more committed output (the aborted batch stays invisible)"
    );
    // The group's committed offset is the end of the input.
    let mut want = TopicPartitionList::new();
    want.add_partition("ctp-in", 0);
    let committed = consumer
        .committed_offsets(want, TIMEOUT)
        .expect("committed offsets");
    assert_eq!(
        committed.find_partition("ctp-in", 0).map(|p| p.offset()),
        Some(Offset::Offset(INPUT as i64))
    );
}

/// The read_committed end (LSO) of partition 0.
fn lso(bootstrap: &str, topic: &str) -> i64 {
    client::consumer(bootstrap, &[("isolation.level", "read_committed")])
        .fetch_watermarks(topic, 0, TIMEOUT)
        .expect("watermarks")
        .1
}

fn wait_for_lso(bootstrap: &str, topic: &str, want: i64, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let now = lso(bootstrap, topic);
        if now == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "LSO stayed at {now}, wanted {want}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn markers_are_finished_after_a_crash_between_end_txn_and_markers() {
    // The test-only hook holds markers back for 3 s after EndTxn is answered.
    let mut broker = Broker::start(
        BrokerOpts::default()
            .cores(2)
            .arg("--debug-delay-txn-markers-ms")
            .arg("3000"),
    );
    let topic = "tx-crash";
    client::create_topic(&broker.bootstrap(), topic, 1, &[]);
    let p = txn_producer(&broker.bootstrap(), "tx-crash-id", &[]);
    p.init_transactions(TIMEOUT).unwrap();
    p.begin_transaction().unwrap();
    for v in ["k1", "k2"] {
        send(&p, topic, v);
    }
    p.commit_transaction(TIMEOUT).expect("EndTxn answered");
    assert_eq!(lso(&broker.bootstrap(), topic), 0, "no marker yet");
    broker.kill9();
    drop(p);
    broker.restart();
    // The coordinator replays PrepareCommit and writes the marker.
    wait_for_lso(&broker.bootstrap(), topic, 3, Duration::from_secs(30));
    let (committed, _) = read_all(&broker.bootstrap(), topic, "read_committed", 3);
    assert_eq!(committed, pairs(&[("k1", 0), ("k2", 1)]));
}

#[test]
fn an_open_transaction_is_aborted_after_a_crash_and_its_timeout() {
    let mut broker = Broker::start(BrokerOpts::default().cores(2));
    let topic = "tx-timeout";
    client::create_topic(&broker.bootstrap(), topic, 1, &[]);
    let p = txn_producer(
        &broker.bootstrap(),
        "tx-timeout-id",
        &[
            ("transaction.timeout.ms", "3000"),
            ("socket.timeout.ms", "3000"),
        ],
    );
    p.init_transactions(TIMEOUT).unwrap();
    p.begin_transaction().unwrap();
    send(&p, topic, "kept");
    p.commit_transaction(TIMEOUT).unwrap();
    p.begin_transaction().unwrap();
    send(&p, topic, "lost");
    wait_for_lso(&broker.bootstrap(), topic, 2, Duration::from_secs(10));
    broker.kill9();
    drop(p);
    broker.restart();
    // Aborted by the coordinator once the timeout passed (checked every 10 s).
    wait_for_lso(&broker.bootstrap(), topic, 4, Duration::from_secs(40));
    let (committed, pos) = read_all(&broker.bootstrap(), topic, "read_committed", 4);
    assert_eq!(
        committed,
        pairs(&[("kept", 0)]),
        "nothing aborted is visible, nothing committed lost"
    );
    assert_eq!(pos, 4);
    let markers: Vec<(i64, i16)> = common::disk::batches(&broker.first_segment(topic, 0))
        .iter()
        .filter(|b| b.header.is_control())
        .map(|b| (b.header.base_offset, b.header.producer_epoch))
        .collect();
    assert_eq!(
        markers,
        vec![(1, 0), (3, 1)],
        "the timeout abort bumps the epoch"
    );
}

/// Deletes the partition's files with `ext` (`txnindex`, `snapshot`).
fn remove_files(dir: &std::path::Path, ext: &str) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(dir)
        .expect("partition directory")
        .flatten()
    {
        if e.path().extension().is_some_and(|x| x == ext) {
            std::fs::remove_file(e.path()).expect("remove");
            n += 1;
        }
    }
    n
}

/// An ABORT whose `.txnindex` entry a crash left unwritten (the entry is
/// appended after the marker, off the reactor) is re-derived by the next
/// start's replay, and must be written back then: the clean stop after it
/// takes a producer snapshot past the marker, so the start after that
/// replays nothing before it and has only the files. Found by `fjord chaos`
/// (G1a: aborted transactions visible to read_committed).
#[test]
fn an_abort_whose_index_entry_was_lost_stays_hidden_after_two_restarts() {
    let mut broker = Broker::start(BrokerOpts::default().cores(1));
    let topic = "tx-reindex";
    client::create_topic(&broker.bootstrap(), topic, 1, &[]);
    let p = txn_producer(&broker.bootstrap(), "tx-reindex-id", &[]);
    p.init_transactions(TIMEOUT).unwrap();
    for (values, commit) in [
        (&["c1", "c2"][..], true),
        (&["a1", "a2", "a3"], false),
        (&["c3"], true),
    ] {
        p.begin_transaction().unwrap();
        for v in values {
            send(&p, topic, v);
        }
        if commit {
            p.commit_transaction(TIMEOUT).expect("commit");
        } else {
            p.abort_transaction(TIMEOUT).expect("abort");
        }
    }
    drop(p);
    let expected = pairs(&[("c1", 0), ("c2", 1), ("c3", 7)]);
    // c1 c2 COMMIT(2) a1 a2 a3 ABORT(6) c3 COMMIT(8): log end 9.
    wait_for_lso(&broker.bootstrap(), topic, 9, TIMEOUT);
    broker.stop();
    // What a kill -9 right after the abort leaves: the marker in the log,
    // no index entry, and no producer snapshot past the marker.
    let dir = broker.data_dir().join(format!("{topic}-0"));
    assert_eq!(remove_files(&dir, "txnindex"), 1, "the abort's index file");
    remove_files(&dir, "snapshot");
    broker.restart();
    let (committed, _) = read_all(&broker.bootstrap(), topic, "read_committed", 9);
    assert_eq!(
        committed, expected,
        "after the first restart (replay from the log start)"
    );
    broker.stop();
    broker.restart();
    let (committed, _) = read_all(&broker.bootstrap(), topic, "read_committed", 9);
    assert_eq!(
        committed, expected,
        "after the second restart (from the snapshot at the log end)"
    );
}
