//! The transaction coordinator's upkeep of `__transaction_state`, driven
//! with raw requests against a real broker: an idle transactional id
//! expires after `transactional.id.expiration.ms` (a tombstone is written,
//! the id is forgotten, a restart does not bring it back, a new
//! InitProducerId starts afresh) while an id in an open transaction stays;
//! and a partition whose replay fails keeps its ids loading instead of
//! serving what was replayed before the bad record. The same for the
//! producer state of a partition: a damaged producer snapshot falls back to
//! replaying the log, and a log that cannot be replayed is not served with
//! a partial producer table (which would append retried batches twice).

mod common;

use common::raw::{only_partition, produce_request, RawClient};
use common::{Broker, BrokerOpts};
use fjord::metadata::internal::{coordinator_partition, TRANSACTION_STATE};
use fjord::record::{BatchBuilder, Compression};
use fjord::txn::log::encode_key;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{
    DescribeTransactionsRequest, EndTxnRequest, InitProducerIdRequest, ListOffsetsRequest,
    ListTransactionsRequest, ProducerId, TopicName, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use std::time::{Duration, Instant};

const TOPIC: &str = "txn-expiry";
/// The broker's `--transactional-id-expiration-ms` in the expiry test.
const EXPIRATION_MS: u64 = 2_000;
/// Bound on every wait of these tests.
const WAIT_TIMEOUT: Duration = Duration::from_secs(30);
/// Partitions of `__transaction_state`.
const TXN_STATE_PARTITIONS: i32 = 50;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn code(e: ResponseError) -> i16 {
    e.code()
}

/// One InitProducerId v4 for `id`: (producer id, epoch) or the error.
fn init_once(raw: &mut RawClient, id: &str) -> Result<(i64, i16), i16> {
    let req = InitProducerIdRequest::default()
        .with_transactional_id(Some(TransactionalId(s(id))))
        .with_transaction_timeout_ms(60_000)
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    let r = raw.request(4, &req);
    if r.error_code == 0 {
        Ok((r.producer_id.0, r.producer_epoch))
    } else {
        Err(r.error_code)
    }
}

/// InitProducerId, retried while the coordinator loads or is busy.
fn init(raw: &mut RawClient, id: &str) -> (i64, i16) {
    let deadline = Instant::now() + WAIT_TIMEOUT;
    loop {
        match init_once(raw, id) {
            Ok(answer) => return answer,
            Err(c)
                if (c == code(ResponseError::CoordinatorLoadInProgress)
                    || c == code(ResponseError::ConcurrentTransactions))
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(c) => panic!("InitProducerId({id}) failed with {c}"),
        }
    }
}

/// AddPartitionsToTxn v3 of partition 0 of [`TOPIC`]: its error code.
fn add_partition_once(raw: &mut RawClient, id: &str, pid: i64, epoch: i16) -> i16 {
    common::raw::add_partition_to_txn_v3(raw, id, pid, epoch, TOPIC, 0)
}

/// A transactional batch of one record at sequence 0.
fn txn_batch(pid: i64, epoch: i16) -> bytes::Bytes {
    BatchBuilder::new(Compression::None)
        .producer(pid, epoch, 0)
        .transactional(true)
        .record(None, Some(b"v"), &[], 1_700_000_000_000)
        .build()
        .freeze()
}

/// Opens a transaction of `id` on partition 0 of [`TOPIC`] with one record.
fn open_transaction(raw: &mut RawClient, id: &str, pid: i64, epoch: i16) {
    assert_eq!(
        add_partition_once(raw, id, pid, epoch),
        0,
        "AddPartitionsToTxn"
    );
    let req = produce_request(TOPIC, 0, -1, txn_batch(pid, epoch))
        .with_transactional_id(Some(TransactionalId(s(id))));
    let resp = raw.request(9, &req);
    assert_eq!(only_partition(&resp).error_code, 0, "transactional produce");
}

/// EndTxn v5 (transaction version 2): (error, new epoch).
fn end(raw: &mut RawClient, id: &str, pid: i64, epoch: i16, commit: bool) -> (i16, i16) {
    let req = EndTxnRequest::default()
        .with_transactional_id(TransactionalId(s(id)))
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(epoch)
        .with_committed(commit);
    let r = raw.request(5, &req);
    (r.error_code, r.producer_epoch)
}

/// DescribeTransactions of `id`: (error, state name).
fn describe(raw: &mut RawClient, id: &str) -> (i16, String) {
    let r = raw.request(
        0,
        &DescribeTransactionsRequest::default()
            .with_transactional_ids(vec![TransactionalId(s(id))]),
    );
    let st = &r.transaction_states[0];
    (st.error_code, st.transaction_state.to_string())
}

fn listed(raw: &mut RawClient) -> Vec<String> {
    let r = raw.request(
        1,
        &ListTransactionsRequest::default().with_duration_filter(-1),
    );
    let mut ids: Vec<String> = r
        .transaction_states
        .iter()
        .map(|t| t.transactional_id.0.to_string())
        .collect();
    ids.sort();
    ids
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT_TIMEOUT;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The value of the last record with `key` in the first segment of
/// `__transaction_state`-`partition`: `Some(None)` for a tombstone.
fn last_value_of(broker: &Broker, partition: i32, key: &[u8]) -> Option<Option<bytes::Bytes>> {
    let segment = broker.first_segment(TRANSACTION_STATE, partition);
    common::disk::batches(&segment)
        .iter()
        .flat_map(|b| b.records())
        .filter(|r| r.key.as_deref() == Some(key))
        .map(|r| r.value)
        .last()
}

#[test]
fn an_idle_transactional_id_expires_and_an_open_one_stays() {
    let mut broker = Broker::start(
        BrokerOpts::default()
            .cores(1)
            .arg("--transactional-id-expiration-ms")
            .arg(EXPIRATION_MS.to_string()),
    );
    common::client::create_topic(&broker.bootstrap(), TOPIC, 1, &[]);
    let mut raw = RawClient::connect(broker.port);
    let idle = "idle-id";
    let open = "open-id";

    // `idle` commits a transaction, then does nothing.
    let (idle_pid, epoch) = init(&mut raw, idle);
    open_transaction(&mut raw, idle, idle_pid, epoch);
    assert_eq!(end(&mut raw, idle, idle_pid, epoch, true), (0, epoch + 1));
    wait_until("CompleteCommit", || {
        describe(&mut raw, idle) == (0, "CompleteCommit".to_string())
    });
    let committed_at = Instant::now();
    // `open` keeps a transaction open (timeout 60 s) the whole test.
    let (open_pid, open_epoch) = init(&mut raw, open);
    open_transaction(&mut raw, open, open_pid, open_epoch);
    let opened_at = Instant::now();

    let not_found = (code(ResponseError::TransactionalIdNotFound), String::new());
    wait_until("the idle id to expire", || {
        describe(&mut raw, idle) == not_found
    });
    assert!(
        committed_at.elapsed() >= Duration::from_millis(EXPIRATION_MS / 2),
        "not removed long before its expiration"
    );
    assert_eq!(listed(&mut raw), vec![open.to_string()]);
    // The open transaction outlives the expiration.
    let past = Duration::from_millis(EXPIRATION_MS * 2);
    if let Some(left) = past.checked_sub(opened_at.elapsed()) {
        std::thread::sleep(left);
    }
    assert_eq!(describe(&mut raw, open), (0, "Ongoing".to_string()));

    // A tombstone for the id ends its records in its partition.
    let key = encode_key(idle);
    let partition = coordinator_partition(idle, TXN_STATE_PARTITIONS);
    assert_eq!(
        last_value_of(&broker, partition, &key),
        Some(None),
        "a tombstone is written for the expired id"
    );

    // After a restart the replay drops the id at its tombstone: an
    // AddPartitionsToTxn with its old producer finds no such id.
    drop(raw);
    broker.restart();
    let mut raw = RawClient::connect(broker.port);
    let loading = code(ResponseError::CoordinatorLoadInProgress);
    let mut add = loading;
    wait_until("the coordinator to load", || {
        add = add_partition_once(&mut raw, idle, idle_pid, epoch + 1);
        add != loading
    });
    assert_eq!(add, code(ResponseError::InvalidProducerIdMapping));
    assert_eq!(describe(&mut raw, idle), not_found);
    wait_until("the open id's partition to load", || {
        describe(&mut raw, open).1 == "Ongoing"
    });
    // The id starts afresh: a new producer id at epoch 0, as Kafka does.
    let (pid, epoch) = init(&mut raw, idle);
    assert_ne!(pid, idle_pid, "a new producer id");
    assert_eq!(epoch, 0);
}

/// Appends, to the stopped broker's `topic`-`partition` log, one batch with
/// a valid CRC at the next offset holding `(key, value)`: log recovery keeps
/// it; only the coordinator that replays it can judge it.
fn append_record(broker: &Broker, topic: &str, partition: i32, key: &[u8], value: &[u8]) {
    let path = common::segment_path(&broker.data_dir(), topic, partition);
    let bytes = std::fs::read(&path).expect("read the segment");
    let (end, next_offset) = common::disk::batches(&bytes).last().map_or((0, 0), |b| {
        (
            b.position + b.header.total_size(),
            b.header.last_offset() + 1,
        )
    });
    let mut batch = BatchBuilder::new(Compression::None)
        .record(Some(key), Some(value), &[], 1_700_000_000_000)
        .build();
    // The base offset lies outside the CRC.
    batch[..8].copy_from_slice(&next_offset.to_be_bytes());
    let mut out = bytes[..end].to_vec();
    out.extend_from_slice(&batch);
    std::fs::write(&path, out).expect("write the segment");
}

#[test]
fn a_transaction_state_partition_whose_replay_fails_stays_loading() {
    let mut broker = Broker::start(BrokerOpts::default().cores(1));
    common::client::create_topic(&broker.bootstrap(), TOPIC, 1, &[]);
    let mut raw = RawClient::connect(broker.port);
    let id = "corrupt-id";
    let partition = coordinator_partition(id, TXN_STATE_PARTITIONS);
    let healthy = (0..1000)
        .map(|n| format!("healthy-id-{n}"))
        .find(|h| coordinator_partition(h, TXN_STATE_PARTITIONS) != partition)
        .expect("an id in another partition");
    let (pid, _) = init(&mut raw, id);
    init(&mut raw, &healthy);
    drop(raw);
    broker.stop();

    // A later record of the id whose value is cut short: a transaction
    // record that does not decode. (Taken as a tombstone, it would make
    // the id start afresh with a new producer id.)
    let truncated_value = [0u8, 1, 0, 0, 0];
    append_record(
        &broker,
        TRANSACTION_STATE,
        partition,
        &encode_key(id),
        &truncated_value,
    );
    broker.restart();

    let mut raw = RawClient::connect(broker.port);
    let loading = code(ResponseError::CoordinatorLoadInProgress);
    // The healthy partition loads: its id is bumped to epoch 1.
    assert_eq!(init(&mut raw, &healthy).1, 1);
    // The other keeps answering "loading" through several load retries.
    let held_until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < held_until {
        assert_eq!(init_once(&mut raw, id), Err(loading), "InitProducerId");
        assert_eq!(add_partition_once(&mut raw, id, pid, 0), loading);
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        broker
            .stderr_tail()
            .contains("loading transaction state failed"),
        "the failed load is logged"
    );
}

const PRODUCER_TOPIC: &str = "producer-state";
/// Byte of a batch header holding its magic (KAFKA_BEHAVIOUR.md §1).
const MAGIC_AT: usize = 16;

/// An idempotent (non-transactional) producer id at epoch 0.
fn idempotent_producer(raw: &mut RawClient) -> i64 {
    let req = InitProducerIdRequest::default()
        .with_transactional_id(None)
        .with_transaction_timeout_ms(60_000)
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    let deadline = Instant::now() + WAIT_TIMEOUT;
    loop {
        let r = raw.request(4, &req);
        if r.error_code == 0 {
            assert_eq!(r.producer_epoch, 0);
            return r.producer_id.0;
        }
        assert!(
            Instant::now() < deadline,
            "InitProducerId failed: {}",
            r.error_code
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Produces records `seq..seq + 3` of `pid` (epoch 0): (error, base offset).
fn produce_idempotent(raw: &mut RawClient, pid: i64, seq: i32) -> (i16, i64) {
    let mut b = BatchBuilder::new(Compression::None).producer(pid, 0, seq);
    for _ in 0..3 {
        b = b.record(None, Some(b"v"), &[], 1_700_000_000_000);
    }
    let req = produce_request(PRODUCER_TOPIC, 0, -1, b.build().freeze());
    let resp = raw.request(9, &req);
    let p = only_partition(&resp);
    (p.error_code, p.base_offset)
}

/// ListOffsets latest of the partition: (error, offset).
fn log_end_offset(raw: &mut RawClient) -> (i16, i64) {
    let req = ListOffsetsRequest::default().with_topics(vec![ListOffsetsTopic::default()
        .with_name(TopicName(s(PRODUCER_TOPIC)))
        .with_partitions(vec![ListOffsetsPartition::default()
            .with_partition_index(0)
            .with_timestamp(-1)])]);
    let p = &raw.request(7, &req).topics[0].partitions[0];
    (p.error_code, p.offset)
}

/// Damages every producer snapshot of the stopped broker's partition (one
/// flipped payload byte: the checksum no longer matches). Returns how many.
fn damage_snapshots(broker: &Broker) -> usize {
    let dir = broker.data_dir().join(format!("{PRODUCER_TOPIC}-0"));
    let mut damaged = 0;
    for entry in std::fs::read_dir(&dir).expect("partition dir") {
        let path = entry.expect("dir entry").path();
        if path.extension().is_some_and(|e| e == "snapshot") {
            let mut bytes = std::fs::read(&path).expect("read snapshot");
            let last = bytes.len() - 1;
            bytes[last] ^= 0xff;
            std::fs::write(&path, bytes).expect("write snapshot");
            damaged += 1;
        }
    }
    damaged
}

#[test]
fn producer_state_is_rebuilt_from_the_log_or_the_partition_is_not_served() {
    let mut broker = Broker::start(BrokerOpts::default().cores(1));
    // segment.ms = 1: every batch after a pause opens a new segment, so
    // the first batches lie in sealed segments the log trusts at start-up.
    common::client::create_topic(
        &broker.bootstrap(),
        PRODUCER_TOPIC,
        1,
        &[("segment.ms", "1")],
    );
    let mut raw = RawClient::connect(broker.port);
    let pid = idempotent_producer(&mut raw);
    for (seq, offset) in [(0, 0), (3, 3), (6, 6)] {
        assert_eq!(produce_idempotent(&mut raw, pid, seq), (0, offset));
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(raw);
    broker.stop();
    let segments = std::fs::read_dir(broker.data_dir().join(format!("{PRODUCER_TOPIC}-0")))
        .expect("partition dir")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "log"))
        })
        .count();
    assert!(segments >= 3, "{segments} segments");

    // Damaged snapshots: the producer state is replayed from the log, so
    // the last batch sent again is a duplicate (answered with its offset,
    // not written twice).
    assert!(
        damage_snapshots(&broker) > 0,
        "the clean stop wrote a snapshot"
    );
    broker.restart();
    let mut raw = RawClient::connect(broker.port);
    assert_eq!(produce_idempotent(&mut raw, pid, 6), (0, 6), "a duplicate");
    assert_eq!(log_end_offset(&mut raw), (0, 9), "nothing appended");
    drop(raw);
    broker.stop();

    // Damaged snapshots and a first batch that cannot be read (its magic):
    // the producer state cannot be rebuilt, so the partition is not served
    // (retriable NOT_LEADER_OR_FOLLOWER) rather than served without it.
    assert!(damage_snapshots(&broker) > 0);
    let first = common::segment_path(&broker.data_dir(), PRODUCER_TOPIC, 0);
    let mut bytes = std::fs::read(&first).expect("first segment");
    bytes[MAGIC_AT] = 0x7f;
    std::fs::write(&first, bytes).expect("write the first segment");
    broker.restart();
    let mut raw = RawClient::connect(broker.port);
    let not_leader = code(ResponseError::NotLeaderOrFollower);
    assert_eq!(produce_idempotent(&mut raw, pid, 6).0, not_leader);
    assert_eq!(log_end_offset(&mut raw).0, not_leader);
    assert!(
        broker
            .stderr_tail()
            .contains("replaying producer state failed"),
        "the failed replay is logged"
    );
    drop(raw);
    broker.stop();
    let last = common::disk::batches(
        &std::fs::read(
            broker
                .data_dir()
                .join(format!("{PRODUCER_TOPIC}-0/{:020}.log", 6)),
        )
        .expect("last segment"),
    );
    assert_eq!(
        last.last().map(|b| b.header.last_offset()),
        Some(8),
        "the retried batch was not appended"
    );
}
