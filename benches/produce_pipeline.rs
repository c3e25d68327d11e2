//! Produce throughput of a real `fjord serve` over TCP, from a pipelining
//! raw client: plain, idempotent and transactional produce in one run.
//!
//! Why not `fjord bench`: librdkafka 2.12 keeps one request in flight per
//! partition for an idempotent producer with large batches (its in-flight
//! limit counts messages, see `tuning/results/idempotence-cost.md`), and
//! flushes before every commit, so through it the comparison measures the
//! client. This client keeps `IN_FLIGHT` requests in flight on every side,
//! as Kafka's Java producer does (max.in.flight.requests.per.connection = 5,
//! the idempotent limit), so the difference between the sides is what the
//! broker does differently for them:
//! - plain: batches with producerId -1;
//! - idempotent: one producer id, sequences continuing across requests
//!   (the broker checks and records each batch's producer state);
//! - transactional: transactions of `TRANSACTION_MS`, like Kafka's
//!   `--transaction-duration-ms`: AddPartitionsToTxn (v3) before the first
//!   batch, and at the end the in-flight batches' acknowledgements, then
//!   EndTxn (v5, transaction version 2: the epoch is bumped and sequences
//!   start again at 0), COMMIT markers and the coordinator's CompleteCommit
//!   before the next AddPartitionsToTxn is accepted.
//!
//! Every request: one partition, one batch of `RECORDS_PER_BATCH` records of
//! `RECORD_BYTES` (uncompressed), acks=-1. Each side has `PRODUCERS`
//! producers (one connection and one partition each, driven by one thread
//! each); the broker runs with one shard pinned to CPU 0 (`--cores 1`), the
//! client threads on CPU 1. Each side has its own topic with 64 MiB
//! segments and 256 MiB retention per partition, so disk use stays
//! bounded.
//!
//! Measurement: rounds. Each round runs every side once for
//! `REQUESTS_PER_ROUND` requests (512 MiB), in an order rotated by one each
//! round; round 0 warms up and is not counted. Per side it prints MiB/s, the
//! ratio to plain in the same round (drift and order effects cancel in it)
//! and the broker's CPU seconds per GiB (from /proc, user + system, its
//! io_uring workers included), each as min / median / max over the rounds.
//! A benchmark, not a test: `cargo test` does not run it.
//!
//! Run: `cargo bench --bench produce_pipeline` (data in `FJORD_BENCH_DIR`,
//! default the system temp dir — put it on the disk under test, not tmpfs,
//! where the kernel's copy into shmem pages dominates; rounds in
//! `FJORD_BENCH_ROUNDS`, default 10; the broker is this build's `fjord`,
//! or the binary `FJORD_BENCH_BROKER` names (to compare two builds), with
//! `FJORD_BENCH_BROKER_ARGS` added to its flags, e.g. `--direct-writes`).

#[path = "../tests/common/raw.rs"]
#[allow(dead_code)]
mod raw;

use bytes::Bytes;
use fjord::record::{BatchBuilder, Compression};
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, CreateTopicsRequest, EndTxnRequest, InitProducerIdRequest,
    ProduceRequest, ProducerId, TopicName, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use raw::{only_partition, produce_request, RawClient};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Record value size.
const RECORD_BYTES: usize = 1024;
/// Records per batch (one batch per request): 64 KiB batches.
const RECORDS_PER_BATCH: usize = 64;
/// Requests in flight at once (the idempotent producer's limit in Kafka).
const IN_FLIGHT: usize = 5;
/// Producers per side, each with its own connection and partition.
const PRODUCERS: usize = 4;
/// Requests per side and round (all producers): 512 MiB of records.
const REQUESTS_PER_ROUND: usize = 8192;
/// Counted rounds (FJORD_BENCH_ROUNDS overrides).
const DEFAULT_ROUNDS: usize = 10;
/// Transaction length on the transactional side.
const TRANSACTION_MS: u64 = 100;
/// Produce version of every request (v9, as librdkafka 2.12 sends).
const PRODUCE_VERSION: i16 = 9;
/// Segment size and retention of the bench topics.
const SEGMENT_BYTES: &str = "67108864";
const RETENTION_BYTES: &str = "268435456";
/// Broker port (shard 0); override with FJORD_BENCH_PORT.
const DEFAULT_PORT: u16 = 19_392;
/// Longest the broker may take to print `fjord: ready`.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// The broker under test; killed and its data removed on drop.
struct Broker {
    child: Child,
    /// The data directory, removed when the broker is dropped.
    _dir: tempfile::TempDir,
    port: u16,
}

impl Broker {
    fn start() -> Broker {
        let base = std::env::var_os("FJORD_BENCH_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let dir = tempfile::Builder::new()
            .prefix("fjord-produce-bench-")
            .tempdir_in(base)
            .expect("bench data directory");
        let port = std::env::var("FJORD_BENCH_PORT")
            .ok()
            .and_then(|p| p.parse().ok())
            .unwrap_or(DEFAULT_PORT);
        let broker = std::env::var_os("FJORD_BENCH_BROKER")
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_fjord").into());
        let mut child = Command::new(broker)
            .arg("serve")
            .arg("--data-dir")
            .arg(dir.path())
            .args(["--port", &port.to_string(), "--listen", "127.0.0.1"])
            .args(["--cores", "1"])
            .args(
                std::env::var("FJORD_BENCH_BROKER_ARGS")
                    .unwrap_or_default()
                    .split_whitespace(),
            )
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start fjord serve");
        let out = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.trim() == "fjord: ready" => break,
                Ok(_) => {}
                Err(e) => panic!("fjord serve did not get ready: {e}"),
            }
        }
        Broker {
            child,
            _dir: dir,
            port,
        }
    }

    fn create_topic(&self, name: &str) {
        let mut raw = RawClient::connect(self.port);
        let config = |k: &str, v: &str| {
            CreatableTopicConfig::default()
                .with_name(s(k))
                .with_value(Some(s(v)))
        };
        let req = CreateTopicsRequest::default()
            .with_timeout_ms(30_000)
            .with_topics(vec![CreatableTopic::default()
                .with_name(TopicName(s(name)))
                .with_num_partitions(PRODUCERS as i32)
                .with_replication_factor(1)
                .with_configs(vec![
                    config("segment.bytes", SEGMENT_BYTES),
                    config("retention.bytes", RETENTION_BYTES),
                ])]);
        let resp = raw.request(5, &req);
        assert_eq!(resp.topics[0].error_code, 0, "CreateTopics {name}");
    }

    /// CPU seconds (user + system) the broker process has used so far.
    fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))
            .expect("read the broker's /proc stat");
        // Fields after the command (which ends with ')'): state is field 3,
        // utime and stime are fields 14 and 15.
        let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: f64 =
            fields[11].parse::<f64>().expect("utime") + fields[12].parse::<f64>().expect("stime");
        // SAFETY: sysconf has no preconditions.
        ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Side {
    Plain,
    Idempotent,
    Transactional,
}

/// One producer: its connection, its partition and producer state across
/// iterations. Requests are one pre-encoded frame patched per send
/// (correlation id, epoch, base sequence, CRC), so the client spends little
/// CPU per byte and the broker, not the client, sets the pace.
struct Producer {
    side: Side,
    topic: String,
    partition: i32,
    raw: RawClient,
    transactional_id: String,
    pid: i64,
    epoch: i16,
    next_seq: i32,
    /// Correlation ids of the requests sent and not yet answered.
    in_flight: VecDeque<i32>,
    next_correlation_id: i32,
    /// When the open transaction began (transactional side).
    txn_began: Option<Instant>,
    transactions: u64,
    /// Record value bytes acknowledged so far.
    bytes_acked: u64,
    /// A whole Produce request frame (length prefix included).
    frame: Vec<u8>,
    /// Where the record batch starts in `frame`.
    batch_at: usize,
}

/// Offsets in a v2 record batch header.
const BATCH_CRC_AT: usize = 17;
const BATCH_CRC_FROM: usize = 21;
const BATCH_EPOCH_AT: usize = 51;
const BATCH_SEQUENCE_AT: usize = 53;
/// Offset of the correlation id in a request frame (after the length
/// prefix, api key and api version).
const FRAME_CORRELATION_AT: usize = 8;
/// Correlation ids of produce requests start here (below: setup requests).
const FIRST_PRODUCE_CORRELATION_ID: i32 = 1 << 20;

impl Producer {
    fn new(broker: &Broker, side: Side, topic: &str, partition: i32) -> Producer {
        let mut p = Producer {
            side,
            topic: topic.to_string(),
            partition,
            raw: RawClient::connect(broker.port),
            transactional_id: format!("{topic}-{partition}-txn"),
            pid: -1,
            epoch: -1,
            next_seq: 0,
            in_flight: VecDeque::new(),
            next_correlation_id: FIRST_PRODUCE_CORRELATION_ID,
            txn_began: None,
            transactions: 0,
            bytes_acked: 0,
            frame: Vec::new(),
            batch_at: 0,
        };
        if side != Side::Plain {
            p.init_producer_id();
        }
        p.encode_template();
        p
    }

    fn init_producer_id(&mut self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let mut req = InitProducerIdRequest::default()
                .with_transactional_id(None)
                .with_transaction_timeout_ms(60_000)
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1);
            if self.side == Side::Transactional {
                req = req.with_transactional_id(Some(TransactionalId(s(&self.transactional_id))));
            }
            let r = self.raw.request(4, &req);
            if r.error_code == ResponseError::CoordinatorLoadInProgress.code()
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            assert_eq!(r.error_code, 0, "InitProducerId");
            self.pid = r.producer_id.0;
            self.epoch = r.producer_epoch;
            return;
        }
    }

    /// Encodes the request every send reuses, and finds its batch.
    fn encode_template(&mut self) {
        let value = vec![0x5a; RECORD_BYTES];
        let mut b = BatchBuilder::new(Compression::None);
        if self.side != Side::Plain {
            b = b
                .producer(self.pid, self.epoch, 0)
                .transactional(self.side == Side::Transactional);
        }
        for _ in 0..RECORDS_PER_BATCH {
            b = b.record(None, Some(&value), &[], 1_700_000_000_000);
        }
        let batch: Bytes = b.build().freeze();
        let mut req: ProduceRequest =
            produce_request(&self.topic, self.partition, -1, batch.clone());
        if self.side == Side::Transactional {
            req = req.with_transactional_id(Some(TransactionalId(s(&self.transactional_id))));
        }
        let (frame, _) = self.raw.encode_frame(PRODUCE_VERSION, &req);
        let head = &batch[..BATCH_SEQUENCE_AT];
        self.batch_at = frame
            .windows(head.len())
            .position(|w| w == head)
            .expect("the batch is in the request frame");
        self.frame = frame;
    }

    /// Sends the next batch: this request's correlation id, the producer's
    /// epoch and sequence, and the batch CRC patched into the template.
    fn send_one(&mut self) {
        if self.side == Side::Transactional && self.txn_began.is_none() {
            self.begin_transaction();
        }
        let id = self.next_correlation_id;
        self.next_correlation_id += 1;
        self.frame[FRAME_CORRELATION_AT..FRAME_CORRELATION_AT + 4]
            .copy_from_slice(&id.to_be_bytes());
        let at = self.batch_at;
        let batch_end = self.frame.len();
        let batch = &mut self.frame[at..batch_end];
        if self.side != Side::Plain {
            batch[BATCH_EPOCH_AT..BATCH_EPOCH_AT + 2].copy_from_slice(&self.epoch.to_be_bytes());
            batch[BATCH_SEQUENCE_AT..BATCH_SEQUENCE_AT + 4]
                .copy_from_slice(&self.next_seq.to_be_bytes());
            self.next_seq = self.next_seq.wrapping_add(RECORDS_PER_BATCH as i32) & i32::MAX;
        }
        let length = i32::from_be_bytes(batch[8..12].try_into().expect("4 bytes")) as usize;
        let crc = crc32c::crc32c(&batch[BATCH_CRC_FROM..12 + length]);
        batch[BATCH_CRC_AT..BATCH_CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
        self.raw.send_bytes(&self.frame);
        self.in_flight.push_back(id);
    }

    /// Reads the oldest answer; panics on any error (nothing here should
    /// fail, and a silent error would fake throughput).
    fn receive_one(&mut self) {
        let Some(id) = self.in_flight.pop_front() else {
            return;
        };
        let resp = self.raw.receive::<ProduceRequest>(PRODUCE_VERSION, id);
        let p = only_partition(&resp);
        assert_eq!(p.error_code, 0, "produce error {}", p.error_code);
        self.bytes_acked += (RECORDS_PER_BATCH * RECORD_BYTES) as u64;
    }

    fn drain(&mut self) {
        while !self.in_flight.is_empty() {
            self.receive_one();
        }
    }

    /// AddPartitionsToTxn, retried while the previous transaction is still
    /// being completed (CONCURRENT_TRANSACTIONS), as clients do.
    fn begin_transaction(&mut self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let req = AddPartitionsToTxnRequest::default()
                .with_v3_and_below_transactional_id(TransactionalId(s(&self.transactional_id)))
                .with_v3_and_below_producer_id(ProducerId(self.pid))
                .with_v3_and_below_producer_epoch(self.epoch)
                .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default()
                    .with_name(TopicName(s(&self.topic)))
                    .with_partitions(vec![self.partition])]);
            let r = self.raw.request(3, &req);
            let code =
                r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code;
            if code == ResponseError::ConcurrentTransactions.code() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            assert_eq!(code, 0, "AddPartitionsToTxn");
            self.txn_began = Some(Instant::now());
            return;
        }
    }

    fn commit(&mut self) {
        self.drain();
        let req = EndTxnRequest::default()
            .with_transactional_id(TransactionalId(s(&self.transactional_id)))
            .with_producer_id(ProducerId(self.pid))
            .with_producer_epoch(self.epoch)
            .with_committed(true);
        let r = self.raw.request(5, &req);
        assert_eq!(r.error_code, 0, "EndTxn");
        // Transaction version 2: the epoch is bumped, sequences restart.
        self.epoch = r.producer_epoch;
        self.next_seq = 0;
        self.txn_began = None;
        self.transactions += 1;
    }

    /// Sends `requests` batches, keeping `IN_FLIGHT` in flight, and waits
    /// for all their answers.
    fn run(&mut self, requests: usize) {
        for _ in 0..requests {
            if self.in_flight.len() == IN_FLIGHT {
                self.receive_one();
            }
            if self
                .txn_began
                .is_some_and(|t| t.elapsed() >= Duration::from_millis(TRANSACTION_MS))
            {
                self.commit();
            }
            self.send_one();
        }
        self.drain();
    }
}

/// Runs the client's threads on CPU 1 (the broker's shard is pinned to
/// CPU 0); threads spawned later inherit it.
fn pin_client() {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes in it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(1, &mut set);
        let _ = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// One side's measurements over the rounds.
#[derive(Default)]
struct Readings {
    mib_per_s: Vec<f64>,
    cpu_s_per_gib: Vec<f64>,
    /// This side's throughput over plain's in the same round.
    vs_plain: Vec<f64>,
    transactions: u64,
}

fn min_median_max(v: &[f64]) -> (f64, f64, f64) {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not run us.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let rounds: usize = std::env::var("FJORD_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(DEFAULT_ROUNDS);
    pin_client();
    let broker = Broker::start();
    let sides = [
        ("plain", Side::Plain),
        ("idempotent", Side::Idempotent),
        ("transactional_100ms", Side::Transactional),
    ];
    let mut producers: Vec<Vec<Producer>> = sides
        .iter()
        .map(|&(name, side)| {
            broker.create_topic(name);
            (0..PRODUCERS)
                .map(|k| Producer::new(&broker, side, name, k as i32))
                .collect()
        })
        .collect();
    let mut readings: Vec<Readings> = sides.iter().map(|_| Readings::default()).collect();
    // Round 0 warms up (files, caches) and is not counted. Each round runs
    // every side once, in an order rotated by one each round, so drift and
    // order effects fall on every side alike.
    for round in 0..=rounds {
        let mut round_mib_s = [0f64; 3];
        for k in 0..sides.len() {
            let i = (k + round) % sides.len();
            let group = &mut producers[i];
            let bytes_before: u64 = group.iter().map(|p| p.bytes_acked).sum();
            let cpu_before = broker.cpu_seconds();
            let start = Instant::now();
            std::thread::scope(|scope| {
                for p in group.iter_mut() {
                    scope.spawn(move || {
                        p.run(REQUESTS_PER_ROUND / PRODUCERS);
                        if p.txn_began.is_some() {
                            p.commit();
                        }
                    });
                }
            });
            let secs = start.elapsed().as_secs_f64();
            let cpu = broker.cpu_seconds() - cpu_before;
            let bytes = group.iter().map(|p| p.bytes_acked).sum::<u64>() - bytes_before;
            let mib = bytes as f64 / (1 << 20) as f64;
            round_mib_s[i] = mib / secs;
            if round > 0 {
                readings[i].mib_per_s.push(mib / secs);
                readings[i].cpu_s_per_gib.push(cpu / (mib / 1024.0));
            }
        }
        if round > 0 {
            for (i, r) in readings.iter_mut().enumerate() {
                r.vs_plain.push(round_mib_s[i] / round_mib_s[0]);
            }
        }
        eprintln!(
            "round {round}{}: {}",
            if round == 0 { " (warm-up)" } else { "" },
            sides
                .iter()
                .zip(round_mib_s)
                .map(|((name, _), v)| format!("{name} {v:.1} MiB/s"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for (i, r) in readings.iter_mut().enumerate() {
        r.transactions = producers[i].iter().map(|p| p.transactions).sum();
    }
    println!(
        "\n{PRODUCERS} producers x {IN_FLIGHT} requests in flight, {RECORDS_PER_BATCH} x {RECORD_BYTES} B \
         records per request, acks=-1, {rounds} rounds of {} MiB per side",
        (REQUESTS_PER_ROUND * RECORDS_PER_BATCH * RECORD_BYTES) >> 20
    );
    println!("\n| side | MiB/s min / median / max | vs plain (same round) min / median / max | broker CPU s/GiB min / median / max | transactions |");
    println!("|---|---|---|---|---|");
    for ((name, _), r) in sides.iter().zip(&readings) {
        let (a, b, c) = min_median_max(&r.mib_per_s);
        let (d, e, f) = min_median_max(&r.vs_plain);
        let (g, h, k) = min_median_max(&r.cpu_s_per_gib);
        println!(
            "| {name} | {a:.1} / {b:.1} / {c:.1} | {d:.3} / {e:.3} / {f:.3} | {g:.2} / {h:.2} / {k:.2} | {} |",
            r.transactions
        );
    }
}
