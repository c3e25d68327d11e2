//! Catch-up reads in both `--catch-up-reads` modes: with a 4 KiB tail cache
//! nearly every fetch reads the segment files, with direct reads
//! (`net::file_range`, the default) or with sendfile from the page cache
//! (`net::sendfile`). A consumer reading the topic from the beginning gets
//! every record byte-exact at the offset its delivery report gave, once
//! with librdkafka's default fetch sizes and once with fetches of several
//! MiB (ranges longer than one sendfile piece and than the read-ahead), over
//! several segments per partition. The broker's `rchar` (`/proc/PID/io`)
//! shows which path served them: sendfile counts there, io_uring's direct
//! reads do not.

mod common;

use common::client::{self, await_deliveries, create_topic, send, TestMessage};
use common::{Broker, BrokerOpts};
use rdkafka::consumer::Consumer;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::HashMap;
use std::time::{Duration, Instant};

const MESSAGES: usize = 20_000;
const PARTITIONS: i32 = 2;
/// Values are 16..VALUE_MAX_BYTES bytes: ~30 MB in all.
const VALUE_MAX_BYTES: usize = 3_000;
/// Small segments, so that the reads cross segment boundaries.
const SEGMENT_BYTES: &str = "4194304";
/// Smaller than any batch: the tail cache holds next to nothing.
const TAIL_CACHE_BYTES: &str = "4096";
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(180);
const CONSUME_TIMEOUT: Duration = Duration::from_secs(180);
/// How long the consumer keeps polling after the last expected record.
const SETTLE: Duration = Duration::from_millis(500);

/// Message `id`: a value whose length and bytes follow from the id, so
/// that a byte out of place anywhere in a range shows.
fn message(id: usize) -> TestMessage {
    let mut x = (id as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let len = 16 + (x % (VALUE_MAX_BYTES as u64 - 16)) as usize;
    let mut value = format!("{id:08}").into_bytes();
    while value.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        value.push(x as u8);
    }
    TestMessage {
        id,
        key: format!("key-{}", id % 97).into_bytes(),
        value,
        headers: vec![("id".to_string(), id.to_string().into_bytes())],
    }
}

/// Reads both partitions from the beginning with `extra` consumer settings
/// and checks every record against what was sent and where it was
/// delivered; no record may come twice.
fn consume_and_check(
    broker: &Broker,
    topic: &str,
    sent: &[TestMessage],
    delivered: &HashMap<usize, (i32, i64)>,
    extra: &[(&str, &str)],
) {
    let consumer = client::consumer(&broker.bootstrap(), extra);
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("add partition");
    }
    consumer.assign(&tpl).expect("assign");
    let mut seen = vec![false; sent.len()];
    let mut count = 0usize;
    let deadline = Instant::now() + CONSUME_TIMEOUT;
    let mut settle_until: Option<Instant> = None;
    loop {
        let now = Instant::now();
        match settle_until {
            Some(t) if now >= t => break,
            None if count >= sent.len() => settle_until = Some(now + SETTLE),
            _ => {}
        }
        assert!(
            now < deadline || settle_until.is_some(),
            "{extra:?}: consumed only {count} of {} records in {CONSUME_TIMEOUT:?}",
            sent.len()
        );
        let m = match consumer.poll(Duration::from_millis(100)) {
            None => continue,
            Some(Err(e)) => panic!("{extra:?}: consumer error: {e}"),
            Some(Ok(m)) => m,
        };
        let headers = m.headers().expect("headers");
        let id: usize = std::str::from_utf8(headers.get(0).value.expect("id header"))
            .expect("utf-8 id")
            .parse()
            .expect("numeric id");
        assert!(!seen[id], "{extra:?}: record {id} consumed twice");
        seen[id] = true;
        count += 1;
        let want = &sent[id];
        assert_eq!(m.key(), Some(&want.key[..]), "{extra:?}: key of {id}");
        assert!(
            m.payload() == Some(&want.value[..]),
            "{extra:?}: value of {id} ({} bytes) differs",
            want.value.len()
        );
        assert_eq!(
            (m.partition(), m.offset()),
            delivered[&id],
            "{extra:?}: record {id} where its delivery report said"
        );
    }
    assert_eq!(count, sent.len(), "{extra:?}: every record once");
}

fn catch_up_from_disk(mode: &str) {
    let opts = BrokerOpts::default()
        .cores(1)
        .arg("--tail-cache-bytes")
        .arg(TAIL_CACHE_BYTES)
        .arg("--catch-up-reads")
        .arg(mode);
    let broker = Broker::start(opts);
    let topic = format!("catch-up-{mode}");
    create_topic(
        &broker.bootstrap(),
        &topic,
        PARTITIONS,
        &[("segment.bytes", SEGMENT_BYTES)],
    );
    let producer = client::producer(
        &broker.bootstrap(),
        &[
            ("linger.ms", "5"),
            ("batch.size", "262144"),
            ("acks", "all"),
            ("compression.codec", "none"),
        ],
    );
    let sent: Vec<TestMessage> = (0..MESSAGES).map(message).collect();
    for m in &sent {
        send(&producer, &topic, m);
    }
    let deliveries = await_deliveries(&producer, MESSAGES, DELIVERY_TIMEOUT);
    let mut delivered = HashMap::with_capacity(MESSAGES);
    for d in &deliveries {
        assert!(d.error.is_none(), "record {} failed: {:?}", d.id, d.error);
        assert!(delivered.insert(d.id, (d.partition, d.offset)).is_none());
    }
    for p in 0..PARTITIONS {
        let dir = broker.data_dir().join(format!("{topic}-{p}"));
        let segments = std::fs::read_dir(&dir)
            .expect("partition directory")
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".log"))
            })
            .count();
        assert!(
            segments >= 2,
            "{topic}-{p}: {segments} segment(s), want several"
        );
    }
    // librdkafka's defaults (1 MiB per partition), then fetches of 4 MiB
    // per partition: ranges of several sendfile pieces and direct reads.
    let pid = broker.pid().expect("a running broker");
    let read_before = read_syscall_bytes(pid);
    consume_and_check(&broker, &topic, &sent, &delivered, &[]);
    consume_and_check(
        &broker,
        &topic,
        &sent,
        &delivered,
        &[
            ("max.partition.fetch.bytes", "4194304"),
            ("fetch.max.bytes", "8388608"),
        ],
    );
    // Which path served the reads shows in the broker's read syscalls:
    // each of the two passes sent the whole log (more than all values)
    // with sendfile, or none of it (direct reads go through io_uring).
    let read = read_syscall_bytes(pid) - read_before;
    let values: u64 = sent.iter().map(|m| m.value.len() as u64).sum();
    match mode {
        "sendfile" => assert!(
            read >= 2 * values,
            "sendfile: the broker read only {read} bytes with read-like system calls, \
             want the log twice (values alone: {values} bytes)"
        ),
        _ => assert!(
            read < values / 2,
            "{mode}: the broker read {read} bytes with read-like system calls, \
             want next to none (values: {values} bytes)"
        ),
    }
}

/// `rchar` of `/proc/PID/io`: bytes the process read with read(2)-like
/// system calls, sendfile(2) included, io_uring reads not.
fn read_syscall_bytes(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).expect("/proc/PID/io");
    io.lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .expect("an rchar line")
        .trim()
        .parse()
        .expect("a number")
}

#[test]
fn catch_up_from_disk_with_direct_reads() {
    catch_up_from_disk("direct");
}

#[test]
fn catch_up_from_disk_with_sendfile() {
    catch_up_from_disk("sendfile");
}
