//! The log cleaner (issue 26) with real clients: a compacted topic written
//! by librdkafka (plain, idempotent and transactional producers, with
//! tombstones) is cleaned to exactly each key's latest record at its
//! original offset; read_committed readers see the same committed data
//! before and after; an idempotent producer keeps producing after its old
//! batches were cleaned; tombstones go once `delete.retention.ms` has
//! passed since the cleaning that first kept them; the HW never moves back;
//! and a kill -9 at each point of the swap recovers to either the old or
//! the cleaned log, never a mix.
//!
//! The broker runs with one shard, a cleaner backoff of 100 ms and topics
//! whose segments roll every 100 ms (`segment.ms`), so that each round of
//! writes, followed by a pause, lands in a segment of its own and is
//! sealed by the next round. Every wait is for a condition, with a bound.

mod common;

use common::client::{self, block_on};
use common::{wait_for, Broker, BrokerOpts};
use rdkafka::consumer::Consumer;
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a cleaning may take to show (backoff 100 ms; a busy machine).
const CLEANED_TIMEOUT: Duration = Duration::from_secs(60);
/// Longer than `segment.ms`: the next write rolls the segment.
const ROUND_PAUSE: Duration = Duration::from_millis(250);

/// (offset, key, value) of a record as a consumer reads it.
type Rec = (i64, String, Option<String>);

fn broker(extra: &[&str]) -> Broker {
    let mut opts = BrokerOpts::default()
        .cores(1)
        .arg("--log-cleaner-backoff-ms")
        .arg("100");
    for a in extra {
        opts = opts.arg(*a);
    }
    Broker::start(opts)
}

fn compacted_topic(b: &Broker, topic: &str, extra: &[(&str, &str)]) {
    let mut config = vec![
        ("cleanup.policy", "compact"),
        ("segment.ms", "100"),
        ("min.cleanable.dirty.ratio", "0.01"),
    ];
    config.extend_from_slice(extra);
    client::create_topic(&b.bootstrap(), topic, 1, &config);
}

fn producer(bootstrap: &str, extra: &[(&str, &str)]) -> FutureProducer {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("linger.ms", "0")
        .set("message.timeout.ms", "30000");
    for (k, v) in extra {
        c.set(*k, *v);
    }
    c.create().expect("producer")
}

/// Produces one record and returns its offset.
fn put(p: &FutureProducer, topic: &str, key: &str, value: Option<&str>) -> i64 {
    let mut r = FutureRecord::<str, str>::to(topic).key(key).partition(0);
    if let Some(v) = value {
        r = r.payload(v);
    }
    let d = block_on(p.send(r, TIMEOUT)).expect("delivered");
    d.offset
}

/// Sends without waiting (inside a transaction).
fn put_async(p: &FutureProducer, topic: &str, key: &str, value: &str) {
    let r = FutureRecord::<str, str>::to(topic)
        .key(key)
        .payload(value)
        .partition(0);
    std::mem::drop(p.send_result(r).expect("enqueued"));
}

/// Every record of partition 0 up to its end (HW, or LSO for
/// read_committed), read from the beginning, and that end.
fn read_all(bootstrap: &str, topic: &str, isolation: &str) -> (Vec<Rec>, i64) {
    let c = client::consumer(bootstrap, &[("isolation.level", isolation)]);
    let (_, end) = c.fetch_watermarks(topic, 0, TIMEOUT).expect("watermarks");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .expect("partition");
    c.assign(&tpl).expect("assign");
    let deadline = Instant::now() + TIMEOUT;
    let mut out = Vec::new();
    loop {
        let pos = c
            .position()
            .ok()
            .and_then(|t| t.find_partition(topic, 0).and_then(|e| e.offset().to_raw()));
        if pos.is_some_and(|o| o >= end) || end == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "did not read {topic} to {end}");
        if let Some(m) = c.poll(Duration::from_millis(100)) {
            let m = m.expect("consume");
            out.push((
                m.offset(),
                String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
                m.payload().map(|v| String::from_utf8_lossy(v).into_owned()),
            ));
        }
    }
    (out, end)
}

/// Each key's latest record of `records`, in offset order.
fn latest_per_key(records: &[Rec]) -> Vec<Rec> {
    let mut by_key: BTreeMap<&str, &Rec> = BTreeMap::new();
    for r in records {
        by_key.insert(&r.1, r);
    }
    let mut out: Vec<Rec> = by_key.into_values().cloned().collect();
    out.sort();
    out
}

/// Waits until a read_uncommitted reader sees exactly `expected`.
fn wait_cleaned_to(bootstrap: &str, topic: &str, expected: &[Rec]) {
    let deadline = Instant::now() + CLEANED_TIMEOUT;
    loop {
        let (got, _) = read_all(bootstrap, topic, "read_uncommitted");
        if got == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{topic} was not cleaned to {expected:?}; last read {got:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Sends one round of records at once (librdkafka batches them: one
/// batch of several records) and returns them with their offsets.
fn put_round(p: &FutureProducer, topic: &str, round: &[(String, Option<String>)]) -> Vec<Rec> {
    let futures: Vec<_> = round
        .iter()
        .map(|(k, v)| {
            let mut r = FutureRecord::<str, str>::to(topic).key(k).partition(0);
            if let Some(v) = v {
                r = r.payload(v);
            }
            p.send_result(r).expect("enqueued")
        })
        .collect();
    futures
        .into_iter()
        .zip(round)
        .map(|(f, (k, v))| {
            let d = block_on(f).expect("not cancelled").expect("delivered");
            (d.offset, k.clone(), v.clone())
        })
        .collect()
}

/// A compressible value of round `round`.
fn value_of(round: usize) -> String {
    format!("r{round}-{}", "x".repeat(200))
}

/// Writes the scenario of the first test: rounds 0-2 over keys k0..k9 and
/// round 3 over the even keys (k4 a tombstone), each round one lz4 batch,
/// so that cleaning rewrites round 2's batch keeping only its odd keys; a
/// committed and an aborted transaction; then one more record ("tail", in
/// the active segment). Returns every committed record as written, in
/// offset order, and the tail's offset.
fn write_scenario(b: &Broker, topic: &str) -> (Vec<Rec>, i64) {
    let boot = b.bootstrap();
    let p = producer(&boot, &[("compression.codec", "lz4")]);
    let mut written: Vec<Rec> = Vec::new();
    for round in 0..4 {
        let records: Vec<(String, Option<String>)> = (0..10)
            .filter(|k| round < 3 || k % 2 == 0)
            .map(|k| {
                let value = (round != 3 || k != 4).then(|| value_of(round));
                (format!("k{k}"), value)
            })
            .collect();
        written.extend(put_round(&p, topic, &records));
        std::thread::sleep(ROUND_PAUSE);
    }
    let t = producer(&boot, &[("transactional.id", "cleaner-txn")]);
    t.init_transactions(TIMEOUT).expect("init_transactions");
    t.begin_transaction().expect("begin");
    for key in ["k1", "k2"] {
        put_async(&t, topic, key, "committed");
    }
    t.commit_transaction(TIMEOUT).expect("commit");
    t.begin_transaction().expect("begin");
    for key in ["k3", "k20"] {
        put_async(&t, topic, key, "aborted");
    }
    t.abort_transaction(TIMEOUT).expect("abort");
    // The committed transaction's records, at their offsets.
    let (all, _) = read_all(&boot, topic, "read_committed");
    for r in all.iter().filter(|r| r.2.as_deref() == Some("committed")) {
        written.push(r.clone());
    }
    std::thread::sleep(ROUND_PAUSE);
    let tail = put(&p, topic, "tail", Some("last"));
    written.push((tail, "tail".into(), Some("last".into())));
    written.sort();
    (written, tail)
}

#[test]
fn a_compacted_log_is_cleaned_to_each_keys_latest_record_at_its_original_offset() {
    let b = broker(&[]);
    let topic = "cleaned";
    compacted_topic(&b, topic, &[]);
    let (written, _) = write_scenario(&b, topic);
    let expected = latest_per_key(&written);
    assert!(expected.len() < written.len());
    // The k4 tombstone is kept: delete.retention.ms is a day.
    assert!(expected.iter().any(|r| r.1 == "k4" && r.2.is_none()));
    let (committed_before, hw_before) = read_all(&b.bootstrap(), topic, "read_committed");

    wait_cleaned_to(&b.bootstrap(), topic, &expected);

    let (committed_after, hw_after) = read_all(&b.bootstrap(), topic, "read_committed");
    assert_eq!(committed_after, expected, "read_committed after cleaning");
    assert_eq!(
        latest_per_key(&committed_before),
        latest_per_key(&committed_after),
        "read_committed sees the same latest committed value per key"
    );
    assert!(
        hw_after >= hw_before,
        "the HW moved back: {hw_before} → {hw_after}"
    );
    let (_, hw) = client::consumer(&b.bootstrap(), &[])
        .fetch_watermarks(topic, 0, TIMEOUT)
        .expect("watermarks");
    assert_eq!(hw, hw_before, "cleaning changed the log end");
    assert_compressed_rewrites(&b, topic);
}

/// Every batch of the lz4 producer in `topic`'s partition 0 is still lz4,
/// and at least one of them was rewritten with fewer records than its
/// offsets span (round 2's, which keeps only its odd keys).
fn assert_compressed_rewrites(b: &Broker, topic: &str) {
    let dir = b.data_dir().join(format!("{topic}-0"));
    let mut rewritten = 0;
    for ent in std::fs::read_dir(&dir).expect("partition dir").flatten() {
        if !ent.file_name().to_string_lossy().ends_with(".log") {
            continue;
        }
        let bytes = std::fs::read(ent.path()).expect("segment");
        for batch in common::disk::batches(&bytes) {
            let records = batch.records();
            let from_lz4_producer = records
                .iter()
                .any(|r| r.value.as_ref().is_some_and(|v| v.starts_with(b"r")));
            if !from_lz4_producer {
                continue;
            }
            assert_eq!(
                batch.header.compression_id(),
                3,
                "batch at {} of {} is not lz4",
                batch.position,
                ent.path().display()
            );
            if (records.len() as i64) < i64::from(batch.header.last_offset_delta) + 1 {
                rewritten += 1;
            }
        }
    }
    assert!(rewritten > 0, "no compressed batch was rewritten");
}

#[test]
fn an_idempotent_producer_keeps_producing_after_its_batches_were_cleaned() {
    let mut b = broker(&[]);
    let topic = "idem";
    compacted_topic(&b, topic, &[]);
    let boot = b.bootstrap();
    let p = producer(&boot, &[("enable.idempotence", "true")]);
    let mut written = Vec::new();
    for round in 0..4 {
        let o = put(&p, topic, "a", Some(&format!("v{round}")));
        written.push((o, "a".to_string(), Some(format!("v{round}"))));
        std::thread::sleep(ROUND_PAUSE);
    }
    let o = put(&p, topic, "b", Some("x"));
    written.push((o, "b".to_string(), Some("x".to_string())));
    wait_cleaned_to(&boot, topic, &latest_per_key(&written));

    // The same producer (same id, epoch and sequence) goes on, before and
    // after a restart rebuilt the producer state from the cleaned log.
    for v in ["w0", "w1"] {
        let o = put(&p, topic, "c", Some(v));
        written.push((o, "c".to_string(), Some(v.to_string())));
    }
    b.kill9();
    b.restart();
    for v in ["w2", "w3"] {
        let o = put(&p, topic, "c", Some(v));
        written.push((o, "c".to_string(), Some(v.to_string())));
    }
    let (got, _) = read_all(&boot, topic, "read_uncommitted");
    let c_values: Vec<_> = got
        .iter()
        .filter(|r| r.1 == "c")
        .map(|r| r.2.clone().unwrap_or_default())
        .collect();
    // Each value exactly once (no duplicate from a refused sequence), in
    // order; older "c" values may already be cleaned away.
    assert!(
        c_values.ends_with(&["w3".to_string()]) && {
            let mut d = c_values.clone();
            d.dedup();
            d == c_values
        },
        "c values {c_values:?}"
    );
}

#[test]
fn a_tombstone_goes_once_delete_retention_has_passed_since_it_was_first_cleaned() {
    let b = broker(&[]);
    let topic = "tombstones";
    compacted_topic(&b, topic, &[("delete.retention.ms", "0")]);
    let boot = b.bootstrap();
    let p = producer(&boot, &[]);
    put(&p, topic, "gone", Some("v"));
    put(&p, topic, "gone", None);
    put(&p, topic, "stays", Some("v"));
    std::thread::sleep(ROUND_PAUSE);
    // A second round makes the log dirty again after the first cleaning,
    // whose horizon (now + 0 ms) the second cleaning has passed.
    let mut tail = Vec::new();
    for i in 0..3 {
        let o = put(&p, topic, &format!("t{i}"), Some("v"));
        tail.push((o, format!("t{i}"), Some("v".to_string())));
        std::thread::sleep(ROUND_PAUSE);
    }
    let deadline = Instant::now() + CLEANED_TIMEOUT;
    loop {
        let (got, _) = read_all(&boot, topic, "read_uncommitted");
        if got.iter().all(|r| r.1 != "gone") {
            assert!(got.iter().any(|r| r.1 == "stays"), "{got:?}");
            break;
        }
        assert!(Instant::now() < deadline, "the tombstone stayed: {got:?}");
        // Keep rolling segments so the cleaner has dirt to clean again.
        put(&p, topic, "churn", Some("v"));
        std::thread::sleep(ROUND_PAUSE);
    }
}

/// A kill -9 at `point` of the swap (the broker exits there on its own,
/// `FJORD_TEST_CLEANER_CRASH`), then a start with the cleaner off: the log
/// is the old one (`cleaned` false) or the cleaned one, whole either way.
/// The scenario is written with the cleaner off, so the first cleaning
/// (one group: every sealed segment) is the one that crashes.
fn crash_during_swap(point: &str, cleaned: bool) {
    let mut b = Broker::start(
        BrokerOpts::default()
            .cores(1)
            .arg("--log-cleaner-backoff-ms")
            .arg("100")
            .arg("--log-cleaner-enable")
            .arg("false"),
    );
    let topic = "crash";
    compacted_topic(&b, topic, &[]);
    let (written, _) = write_scenario(&b, topic);
    let (before, _) = read_all(&b.bootstrap(), topic, "read_uncommitted");
    assert!(before.len() > latest_per_key(&written).len());
    b.stop();
    set_cleaner(&mut b, true, Some(point));
    b.restart();
    wait_for(
        CLEANED_TIMEOUT,
        "the broker to stop at the crash point",
        || b.try_exit_status(),
    );
    set_cleaner(&mut b, false, None);
    b.restart();
    let (after, _) = read_all(&b.bootstrap(), topic, "read_uncommitted");
    let expected = if cleaned {
        latest_per_key(&written)
    } else {
        before
    };
    assert_eq!(after, expected, "log after a crash at {point}");
    // And the cleaner, on again, cleans what is left to the same result.
    set_cleaner(&mut b, true, None);
    b.restart();
    wait_cleaned_to(&b.bootstrap(), topic, &latest_per_key(&written));
}

/// The next start's `--log-cleaner-enable` and crash point.
fn set_cleaner(b: &mut Broker, on: bool, crash_at: Option<&str>) {
    let opts = b.opts_mut();
    let at = opts
        .extra_args
        .iter()
        .position(|a| a == "--log-cleaner-enable")
        .expect("the flag is set");
    opts.extra_args[at + 1] = on.to_string();
    opts.env.clear();
    if let Some(point) = crash_at {
        opts.env
            .push(("FJORD_TEST_CLEANER_CRASH".into(), point.to_string()));
    }
}

#[test]
fn a_crash_before_the_swap_commits_leaves_the_old_segments() {
    crash_during_swap("before-commit", false);
}

#[test]
fn a_crash_after_the_swap_commits_recovers_the_cleaned_segments() {
    crash_during_swap("after-commit", true);
}

#[test]
fn a_crash_while_old_segments_are_deleted_recovers_the_cleaned_segments() {
    crash_during_swap("mid-finish", true);
}

/// Bytes of the `.log` files of `topic`'s partition `partition`.
fn log_bytes(data_dir: &std::path::Path, topic: &str, partition: i32) -> u64 {
    let dir = data_dir.join(format!("{topic}-{partition}"));
    std::fs::read_dir(&dir)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// The partition of an internal topic a key (group id, transactional id)
/// maps to: `abs(javaStringHashCode(key)) % 50`.
fn internal_partition(key: &str) -> i32 {
    let h = fjord::metadata::internal::java_string_hash(key);
    (if h == i32::MIN { 0 } else { h.abs() }) % 50
}

/// Internal topics' segments of 1 MiB, the smallest segment.bytes.
const INTERNAL_SEGMENT_BYTES: u64 = 1 << 20;
/// Bytes written to each internal partition: several segments.
const INTERNAL_WRITTEN_MIN_BYTES: u64 = 4 * INTERNAL_SEGMENT_BYTES;
/// What an internal partition may hold once cleaned: its active segment
/// (at most one segment) and the cleaned live state (a few KiB here).
const INTERNAL_CLEANED_MAX_BYTES: u64 = INTERNAL_SEGMENT_BYTES + (256 << 10);
/// Rounds measured before the load, to learn the bytes a round writes (the
/// active segment, never cleaned, holds them all).
const MEASURED_ROUNDS: u64 = 20;

/// Runs `round` until it has written `INTERNAL_WRITTEN_MIN_BYTES` to
/// `partition` of `internal`: the first `MEASURED_ROUNDS` rounds measure
/// the bytes a round writes. Returns how many rounds ran.
fn write_internal(
    data: &std::path::Path,
    internal: &str,
    partition: i32,
    mut round: impl FnMut(u64),
) -> u64 {
    let before = log_bytes(data, internal, partition);
    for r in 0..MEASURED_ROUNDS {
        round(r);
    }
    let per_round = (log_bytes(data, internal, partition) - before).div_ceil(MEASURED_ROUNDS);
    assert!(
        per_round > 0,
        "rounds write nothing to {internal}-{partition}"
    );
    let rounds = INTERNAL_WRITTEN_MIN_BYTES
        .div_ceil(per_round)
        .max(MEASURED_ROUNDS);
    for r in MEASURED_ROUNDS..rounds {
        round(r);
    }
    rounds
}

#[test]
fn internal_topics_stay_bounded_under_steady_commits_and_transactions() {
    use common::raw::{self, RawClient};
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::{GroupId, OffsetCommitRequest, TopicName};
    use kafka_protocol::protocol::StrBytes;
    let segment = INTERNAL_SEGMENT_BYTES.to_string();
    let mut b = broker(&[
        "--offsets-topic-segment-bytes",
        &segment,
        "--transaction-state-log-segment-bytes",
        &segment,
    ]);
    let data = b.data_dir();
    let topic = "bounded";
    let partitions = 50;
    client::create_topic(&b.bootstrap(), topic, partitions, &[]);

    // Offsets: one group commits every partition, round after round.
    let group = "bounded-group";
    let offsets_partition = internal_partition(group);
    // FindCoordinator creates `__consumer_offsets` (one shard: this port).
    let mut c = RawClient::connect(raw::group_coordinator_port(b.port, group));
    let retry_deadline = Instant::now() + TIMEOUT;
    let commit = |c: &mut RawClient, round: u64| loop {
        let req = OffsetCommitRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(group.into())))
            .with_generation_id_or_member_epoch(-1)
            .with_member_id(StrBytes::from_string(String::new()))
            .with_topics(vec![OffsetCommitRequestTopic::default()
                .with_name(TopicName(StrBytes::from_string(topic.into())))
                .with_partitions(
                    (0..partitions)
                        .map(|p| {
                            OffsetCommitRequestPartition::default()
                                .with_partition_index(p)
                                .with_committed_offset(round as i64)
                        })
                        .collect(),
                )]);
        let resp = c.request::<OffsetCommitRequest>(8, &req);
        let errors: Vec<i16> = resp.topics[0]
            .partitions
            .iter()
            .map(|p| p.error_code)
            .filter(|&e| e != 0)
            .collect();
        // The coordinator loading: retry.
        if !errors.is_empty() && errors.iter().all(|e| [14, 15, 16].contains(e)) {
            assert!(Instant::now() < retry_deadline, "no coordinator");
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        assert!(errors.is_empty(), "commit errors {errors:?}");
        return;
    };
    commit(&mut c, 0);
    let rounds = write_internal(&data, "__consumer_offsets", offsets_partition, |r| {
        commit(&mut c, r)
    });

    // Transactions: empty ones (AddPartitionsToTxn then EndTxn, which
    // still writes a marker) from one transactional id.
    let id = "bounded-txn";
    let txn_partition = internal_partition(id);
    let mut t = RawClient::connect(b.port);
    let (pid, mut epoch) = raw::init_transactional(&mut t, id).expect("init");
    write_internal(&data, "__transaction_state", txn_partition, |_| {
        assert_eq!(
            raw::add_partition_to_txn_retrying(&mut t, id, pid, epoch, topic, 0),
            0
        );
        let (code, next) = raw::end_txn_v5(&mut t, id, pid, epoch, true);
        assert_eq!(code, 0, "EndTxn");
        epoch = next;
    });

    for (internal, p) in [
        ("__consumer_offsets", offsets_partition),
        ("__transaction_state", txn_partition),
    ] {
        wait_for(
            CLEANED_TIMEOUT,
            "the internal partition to be cleaned",
            || (log_bytes(&data, internal, p) <= INTERNAL_CLEANED_MAX_BYTES).then_some(()),
        );
    }

    // The state replayed from the cleaned logs is the live state.
    b.kill9();
    b.restart();
    let consumer = client::consumer(&b.bootstrap(), &[("group.id", group)]);
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let committed = consumer.committed_offsets(tpl, TIMEOUT).expect("committed");
    for e in committed.elements() {
        assert_eq!(e.offset(), Offset::Offset(rounds as i64 - 1), "{e:?}");
    }
    let mut t = RawClient::connect(b.port);
    let (pid_after, epoch_after) = raw::init_transactional(&mut t, id).expect("init after replay");
    assert_eq!(pid_after, pid, "the transactional id keeps its producer id");
    assert!(epoch_after > epoch, "epoch {epoch_after} after {epoch}");
}
