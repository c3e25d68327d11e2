//! Transactions driven with raw requests, reproducing stock Kafka's outputs
//! in KAFKA_BEHAVIOUR.md §5 exactly: offsets, marker epochs (transaction
//! version 2: EndTxn v5 bumps the epoch), HW vs LSO while a transaction is
//! open, the `.txnindex` entry, read_committed fetches, and fencing.
//!
//! Most tests here use a transaction-version-2 client that also sends
//! AddPartitionsToTxn with Produce v9, so epochs follow version 2;
//! `transaction_version_2_adds_partitions_on_produce` sends Produce v12 and
//! lets the partition leader add the partition.

mod common;

use common::raw::{only_partition, produce_request, RawClient};
use common::target::Target;
use common::{Broker, BrokerOpts};
use fjord::producer::txn_index::{AbortedTxn, ENTRY_BYTES};
use fjord::record::{BatchBuilder, Compression, ControlType};
use kafka_protocol::messages::describe_producers_request::TopicRequest;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::txn_offset_commit_request::{
    TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
};
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, DescribeProducersRequest, DescribeTransactionsRequest, FetchRequest,
    FetchResponse, FindCoordinatorRequest, GroupId, ListOffsetsRequest, ListTransactionsRequest,
    ProducerId, TopicName, TransactionalId, TxnOffsetCommitRequest,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use std::time::{Duration, Instant};

const TOPIC: &str = "txn";

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn init(raw: &mut RawClient, id: &str) -> Result<(i64, i16), i16> {
    common::raw::init_transactional(raw, id)
}

/// AddPartitionsToTxn of partition 0 of [`TOPIC`], retried while the
/// previous transaction's markers are still being completed.
fn add_partition(raw: &mut RawClient, id: &str, pid: i64, epoch: i16) -> i16 {
    common::raw::add_partition_to_txn_retrying(raw, id, pid, epoch, TOPIC, 0)
}

/// AddPartitionsToTxn v3 of partition 0 of [`TOPIC`]: its error code.
fn add_partition_once(raw: &mut RawClient, id: &str, pid: i64, epoch: i16) -> i16 {
    common::raw::add_partition_to_txn_v3(raw, id, pid, epoch, TOPIC, 0)
}

/// A transactional batch of `values` from `pid`/`epoch` starting at `seq`.
fn txn_batch(pid: i64, epoch: i16, seq: i32, values: &[&str]) -> bytes::Bytes {
    let mut b = BatchBuilder::new(Compression::None)
        .producer(pid, epoch, seq)
        .transactional(true);
    for v in values {
        b = b.record(None, Some(v.as_bytes()), &[], 1_700_000_000_000);
    }
    b.build().freeze()
}

/// Produces a transactional batch of `values`; returns (error, base offset).
fn produce(
    raw: &mut RawClient,
    id: &str,
    pid: i64,
    epoch: i16,
    seq: i32,
    values: &[&str],
) -> (i16, i64) {
    let req = produce_request(TOPIC, 0, -1, txn_batch(pid, epoch, seq, values))
        .with_transactional_id(Some(TransactionalId(s(id))));
    let resp = raw.request(9, &req);
    let p = only_partition(&resp);
    (p.error_code, p.base_offset)
}

fn end(raw: &mut RawClient, id: &str, pid: i64, epoch: i16, commit: bool) -> (i16, i16) {
    common::raw::end_txn_v5(raw, id, pid, epoch, commit)
}

/// ListOffsets latest under an isolation level.
fn latest(raw: &mut RawClient, read_committed: bool) -> i64 {
    let req = ListOffsetsRequest::default()
        .with_isolation_level(read_committed as i8)
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(TopicName(s(TOPIC)))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(0)
                .with_timestamp(-1)])]);
    raw.request(7, &req).topics[0].partitions[0].offset
}

fn fetch(raw: &mut RawClient, read_committed: bool) -> FetchResponse {
    let req = FetchRequest::default()
        .with_max_wait_ms(0)
        .with_min_bytes(0)
        .with_max_bytes(1 << 20)
        .with_isolation_level(read_committed as i8)
        .with_session_epoch(-1)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(s(TOPIC)))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(0)
                .with_partition_max_bytes(1 << 20)])]);
    raw.request(11, &req)
}

/// (base offset, producer epoch, marker kind) of every stored batch.
fn stored(broker: &Broker) -> Vec<(i64, i16, Option<ControlType>)> {
    common::disk::batches(&broker.first_segment(TOPIC, 0))
        .into_iter()
        .map(|b| {
            let kind = b.header.is_control().then(|| {
                let key = b.records()[0].key.clone().expect("marker key");
                fjord::record::records::parse_control_key(&key)
                    .expect("control key")
                    .1
            });
            (b.header.base_offset, b.header.producer_epoch, kind)
        })
        .collect()
}

/// KAFKA_BEHAVIOUR.md §5's batches for transactions A (commit), B (abort),
/// C (commit) under transaction version 2: (base offset, epoch, marker).
fn commit_abort_commit_layout() -> Vec<(i64, i16, Option<ControlType>)> {
    vec![
        (0, 0, None),
        (3, 1, Some(ControlType::Commit)),
        (4, 1, None),
        (7, 2, Some(ControlType::Abort)),
        (8, 2, None),
        (10, 3, Some(ControlType::Commit)),
    ]
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn commit_abort_commit_reproduces_stock_kafka() {
    let broker = Broker::start(BrokerOpts::default().cores(1));
    common::client::create_topic(&broker.bootstrap(), TOPIC, 1, &[]);
    let mut raw = RawClient::connect(broker.port);
    let id = "txn-abc";
    let (pid, e0) = init(&mut raw, id).expect("InitProducerId");
    assert_eq!(e0, 0);

    // A: c1..c3, commit.
    assert_eq!(add_partition(&mut raw, id, pid, 0), 0);
    assert_eq!(
        produce(&mut raw, id, pid, 0, 0, &["c1", "c2", "c3"]),
        (0, 0)
    );
    assert_eq!(
        end(&mut raw, id, pid, 0, true),
        (0, 1),
        "EndTxn v5 bumps the epoch"
    );
    wait_until("the COMMIT marker", || latest(&mut raw, false) == 4);

    // B: a1..a3 under epoch 1, left open.
    assert_eq!(add_partition(&mut raw, id, pid, 1), 0);
    assert_eq!(
        produce(&mut raw, id, pid, 1, 0, &["a1", "a2", "a3"]),
        (0, 4)
    );
    assert_eq!(latest(&mut raw, false), 7, "read_uncommitted end = HW");
    assert_eq!(latest(&mut raw, true), 4, "read_committed end = LSO");
    assert_eq!(end(&mut raw, id, pid, 1, false), (0, 2));
    wait_until("the ABORT marker", || latest(&mut raw, true) == 8);

    // C: c4, c5 under epoch 2, commit.
    assert_eq!(add_partition(&mut raw, id, pid, 2), 0);
    assert_eq!(produce(&mut raw, id, pid, 2, 0, &["c4", "c5"]), (0, 8));
    assert_eq!(end(&mut raw, id, pid, 2, true), (0, 3));
    wait_until("the last COMMIT marker", || latest(&mut raw, true) == 11);

    // On disk: data e0 @0-2, COMMIT e1 @3, data e1 @4-6, ABORT e2 @7,
    // data e2 @8-9, COMMIT e3 @10.
    assert_eq!(stored(&broker), commit_abort_commit_layout());
    // .txnindex: producerId, firstOffset 4, lastOffset 7, lastStableOffset 8.
    // The broker writes it in the background after the ABORT marker.
    let txnindex_path = broker
        .data_dir()
        .join("txn-0/00000000000000000000.txnindex");
    wait_until("the .txnindex entry", || {
        std::fs::metadata(&txnindex_path).is_ok_and(|m| m.len() >= ENTRY_BYTES as u64)
    });
    let txnindex = std::fs::read(&txnindex_path).expect(".txnindex written");
    assert_eq!(txnindex.len(), ENTRY_BYTES);
    assert_eq!(
        AbortedTxn::decode(&txnindex),
        Some(AbortedTxn {
            producer_id: pid,
            first_offset: 4,
            last_offset: 7,
            last_stable_offset: 8
        })
    );
    // read_committed fetches carry the aborted transaction; both read to 11.
    let committed = fetch(&mut raw, true);
    let p = &committed.responses[0].partitions[0];
    assert_eq!(p.last_stable_offset, 11);
    let aborted: Vec<(i64, i64)> = p
        .aborted_transactions
        .as_ref()
        .expect("aborted transactions")
        .iter()
        .map(|a| (a.producer_id.0, a.first_offset))
        .collect();
    assert_eq!(aborted, vec![(pid, 4)]);
    let uncommitted = fetch(&mut raw, false);
    assert!(uncommitted.responses[0].partitions[0]
        .aborted_transactions
        .is_none());
}

#[test]
fn a_second_producer_fences_the_first() {
    let broker = Broker::start(BrokerOpts::default().cores(1));
    common::client::create_topic(&broker.bootstrap(), TOPIC, 1, &[]);
    let mut p1 = RawClient::connect(broker.port);
    let mut p2 = RawClient::connect(broker.port);
    let id = "txn-fence";
    let (pid, e) = init(&mut p1, id).unwrap();
    assert_eq!(e, 0);
    assert_eq!(add_partition(&mut p1, id, pid, 0), 0);
    assert_eq!(produce(&mut p1, id, pid, 0, 0, &["z1"]), (0, 0));

    // Producer 2: the first attempt fences the open transaction
    // (CONCURRENT_TRANSACTIONS); the retry gets epoch 2.
    assert_eq!(
        init(&mut p2, id),
        Err(ResponseError::ConcurrentTransactions.code())
    );
    let mut got = Err(0);
    wait_until("producer 2's epoch", || {
        got = init(&mut p2, id);
        got.is_ok()
    });
    assert_eq!(got, Ok((pid, 2)));

    // Producer 1's commit fails with INVALID_PRODUCER_EPOCH.
    assert_eq!(
        end(&mut p1, id, pid, 0, true).0,
        ResponseError::InvalidProducerEpoch.code()
    );

    assert_eq!(add_partition(&mut p2, id, pid, 2), 0);
    assert_eq!(produce(&mut p2, id, pid, 2, 0, &["y1"]), (0, 2));
    assert_eq!(end(&mut p2, id, pid, 2, true), (0, 3));
    wait_until("the COMMIT marker", || latest(&mut p2, true) == 4);

    // On disk: z1 e0 @0, ABORT e1 @1, y1 e2 @2, COMMIT e3 @3.
    assert_eq!(
        stored(&broker),
        vec![
            (0, 0, None),
            (1, 1, Some(ControlType::Abort)),
            (2, 2, None),
            (3, 3, Some(ControlType::Commit)),
        ]
    );
    // The admin view: the id, its producer on the partition.
    let desc = p2.request(
        0,
        &DescribeTransactionsRequest::default()
            .with_transactional_ids(vec![TransactionalId(s(id))]),
    );
    let st = &desc.transaction_states[0];
    assert_eq!(
        (st.error_code, st.transaction_state.as_str()),
        (0, "CompleteCommit")
    );
    assert_eq!((st.producer_id.0, st.producer_epoch), (pid, 3));
    let listed = p2.request(
        1,
        &ListTransactionsRequest::default().with_duration_filter(-1),
    );
    assert_eq!(listed.transaction_states.len(), 1);
    assert_eq!(listed.transaction_states[0].transactional_id.0.as_str(), id);
    let producers = p2.request(
        0,
        &DescribeProducersRequest::default().with_topics(vec![TopicRequest::default()
            .with_name(TopicName(s(TOPIC)))
            .with_partition_indexes(vec![0])]),
    );
    let active = &producers.topics[0].partitions[0].active_producers;
    assert_eq!(active.len(), 1);
    assert_eq!(
        (active[0].producer_id.0, active[0].producer_epoch),
        (pid, 3)
    );
    assert_eq!(
        active[0].current_txn_start_offset, -1,
        "no open transaction"
    );

    let committed = fetch(&mut p2, true);
    let aborted = committed.responses[0].partitions[0]
        .aborted_transactions
        .clone()
        .unwrap();
    assert_eq!(aborted.len(), 1);
    assert_eq!(
        (aborted[0].producer_id.0, aborted[0].first_offset),
        (pid, 0)
    );
}

/// Produce v12 (transaction version 2): no AddPartitionsToTxn, the
/// partition leader adds the partition; retried while the coordinator is
/// still completing the previous transaction (NOT_ENOUGH_REPLICAS).
fn produce_v12(
    raw: &mut RawClient,
    id: &str,
    pid: i64,
    epoch: i16,
    seq: i32,
    values: &[&str],
) -> (i16, i64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let req = produce_request(TOPIC, 0, -1, txn_batch(pid, epoch, seq, values))
            .with_transactional_id(Some(TransactionalId(s(id))));
        let resp = raw.request(12, &req);
        let p = only_partition(&resp);
        if p.error_code == ResponseError::NotEnoughReplicas.code() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        return (p.error_code, p.base_offset);
    }
}

#[test]
fn transaction_version_2_adds_partitions_on_produce() {
    let broker = Broker::start(BrokerOpts::default().cores(2));
    common::client::create_topic(&broker.bootstrap(), TOPIC, 1, &[]);
    // The coordinator may be on the other shard than the partition leader.
    let leader = common::client::leader_port(&broker, TOPIC, 0);
    let mut raw = RawClient::connect(leader);
    let id = "txn-tv2";
    // InitProducerId must reach the coordinator; try both shards.
    let mut pid_epoch = None;
    for shard in 0..2 {
        let mut c = RawClient::connect(broker.port_of(shard));
        if let Ok(pe) = init(&mut c, id) {
            pid_epoch = Some((pe, shard));
            break;
        }
    }
    let ((pid, epoch), coordinator_shard) = pid_epoch.expect("a coordinator answered");
    assert_eq!(epoch, 0);
    let mut coord = RawClient::connect(broker.port_of(coordinator_shard));

    assert_eq!(
        produce_v12(&mut raw, id, pid, 0, 0, &["c1", "c2", "c3"]),
        (0, 0)
    );
    assert_eq!(end(&mut coord, id, pid, 0, true), (0, 1));
    assert_eq!(
        produce_v12(&mut raw, id, pid, 1, 0, &["a1", "a2", "a3"]),
        (0, 4)
    );
    assert_eq!(
        latest(&mut raw, true),
        4,
        "LSO while the second transaction is open"
    );
    assert_eq!(end(&mut coord, id, pid, 1, false), (0, 2));
    assert_eq!(produce_v12(&mut raw, id, pid, 2, 0, &["c4", "c5"]), (0, 8));
    assert_eq!(end(&mut coord, id, pid, 2, true), (0, 3));
    wait_until("the last COMMIT marker", || latest(&mut raw, true) == 11);
    assert_eq!(stored(&broker), commit_abort_commit_layout());
    // A producer with the old epoch is fenced on the partition.
    assert_eq!(
        produce_v12(&mut raw, id, pid, 2, 2, &["late"]).0,
        ResponseError::InvalidProducerEpoch.code()
    );
}

/// A producer that begins its next transaction as soon as EndTxn is
/// answered meets the coordinator still writing markers. Whenever its
/// AddPartitionsToTxn is accepted (at once, after waiting at the
/// coordinator, or on a retry), the new transaction starts after the
/// previous one's marker: every batch lands after the COMMIT before it.
#[test]
fn back_to_back_transactions_start_after_the_markers() {
    let broker = Broker::start(BrokerOpts::default().cores(1));
    common::client::create_topic(&broker.bootstrap(), TOPIC, 1, &[]);
    let mut raw = RawClient::connect(broker.port);
    let id = "txn-back-to-back";
    let (pid, mut epoch) = init(&mut raw, id).expect("InitProducerId");
    const TRANSACTIONS: i64 = 20;
    let mut want = Vec::new();
    for n in 0..TRANSACTIONS {
        assert_eq!(
            add_partition(&mut raw, id, pid, epoch),
            0,
            "transaction {n}"
        );
        assert_eq!(
            produce(&mut raw, id, pid, epoch, 0, &["v"]),
            (0, 2 * n),
            "transaction {n} starts after the previous marker"
        );
        let (code, next) = end(&mut raw, id, pid, epoch, true);
        assert_eq!((code, next), (0, epoch + 1), "transaction {n}");
        want.push((2 * n, epoch, None));
        want.push((2 * n + 1, next, Some(ControlType::Commit)));
        epoch = next;
    }
    wait_until("the last COMMIT marker", || {
        latest(&mut raw, true) == 2 * TRANSACTIONS
    });
    assert_eq!(stored(&broker), want);
}

/// The coordinator waits only a bounded time for a transaction to finish:
/// with its markers held back (test hook), AddPartitionsToTxn still gets
/// CONCURRENT_TRANSACTIONS, and succeeds once the markers are written.
#[test]
fn a_request_meeting_slow_markers_still_gets_concurrent_transactions() {
    let broker = Broker::start(
        BrokerOpts::default()
            .cores(1)
            .arg("--debug-delay-txn-markers-ms")
            .arg("3000"),
    );
    common::client::create_topic(&broker.bootstrap(), TOPIC, 1, &[]);
    let mut raw = RawClient::connect(broker.port);
    let id = "txn-slow-markers";
    let (pid, epoch) = init(&mut raw, id).expect("InitProducerId");
    assert_eq!(add_partition(&mut raw, id, pid, epoch), 0);
    assert_eq!(produce(&mut raw, id, pid, epoch, 0, &["v"]), (0, 0));
    assert_eq!(end(&mut raw, id, pid, epoch, true), (0, epoch + 1));
    assert_eq!(
        add_partition_once(&mut raw, id, pid, epoch + 1),
        ResponseError::ConcurrentTransactions.code(),
        "markers are held for 3 s, far past the coordinator's wait"
    );
    assert_eq!(add_partition(&mut raw, id, pid, epoch + 1), 0);
    assert_eq!(latest(&mut raw, true), 2, "the COMMIT marker is written");
    assert_eq!(produce(&mut raw, id, pid, epoch + 1, 0, &["w"]), (0, 2));
}

/// AddOffsetsToTxn v3 for `group`, retried while the coordinator answers
/// CONCURRENT_TRANSACTIONS.
fn add_offsets(raw: &mut RawClient, id: &str, pid: i64, epoch: i16, group: &str) -> i16 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let req = AddOffsetsToTxnRequest::default()
            .with_transactional_id(TransactionalId(s(id)))
            .with_producer_id(ProducerId(pid))
            .with_producer_epoch(epoch)
            .with_group_id(GroupId(s(group)));
        let code = raw.request(3, &req).error_code;
        if code != ResponseError::ConcurrentTransactions.code() || Instant::now() >= deadline {
            return code;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// FindCoordinator v3 for `key` (`key_type` 0 = group, 1 = transaction),
/// until the coordinator is known: stock Kafka creates its internal topic
/// at the first one and answers COORDINATOR_NOT_AVAILABLE meanwhile.
fn find_coordinator(raw: &mut RawClient, key: &str, key_type: i8) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let req = FindCoordinatorRequest::default()
            .with_key(s(key))
            .with_key_type(key_type);
        let code = raw.request(3, &req).error_code;
        if code == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "FindCoordinator {key}: {code}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Where a transactional offset commit goes: the group, and the topic whose
/// partition 0 it commits.
struct OffsetsTarget<'a> {
    group: &'a str,
    topic: &'a str,
}

/// TxnOffsetCommit v3 (transaction version 1: nothing verified at the
/// transaction coordinator) of `offset` for partition 0 of the topic, as a
/// simple consumer of the group; its error code.
fn txn_offset_commit(
    raw: &mut RawClient,
    to: &OffsetsTarget,
    id: &str,
    pid: i64,
    epoch: i16,
    offset: i64,
) -> i16 {
    let req = TxnOffsetCommitRequest::default()
        .with_transactional_id(TransactionalId(s(id)))
        .with_group_id(GroupId(s(to.group)))
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(epoch)
        .with_generation_id(-1)
        .with_member_id(s(""))
        .with_topics(vec![TxnOffsetCommitRequestTopic::default()
            .with_name(TopicName(s(to.topic)))
            .with_partitions(vec![TxnOffsetCommitRequestPartition::default()
                .with_partition_index(0)
                .with_committed_offset(offset)
                .with_committed_leader_epoch(-1)])]);
    raw.request(3, &req).topics[0].partitions[0].error_code
}

/// DescribeProducers of the group's `__consumer_offsets` partition (of 50,
/// fjord's and Kafka's default): (producer id, epoch, current transaction
/// start offset) of each, or the partition's error code.
fn offsets_producers(raw: &mut RawClient, group: &str) -> Result<Vec<(i64, i32, i64)>, i16> {
    let p = fjord::metadata::internal::coordinator_partition(
        group,
        fjord::metadata::internal::INTERNAL_TOPIC_PARTITIONS,
    );
    let resp = raw.request(
        0,
        &DescribeProducersRequest::default().with_topics(vec![TopicRequest::default()
            .with_name(TopicName(s("__consumer_offsets")))
            .with_partition_indexes(vec![p])]),
    );
    let partition = &resp.topics[0].partitions[0];
    if partition.error_code != 0 {
        return Err(partition.error_code);
    }
    Ok(partition
        .active_producers
        .iter()
        .map(|a| {
            (
                a.producer_id.0,
                a.producer_epoch,
                a.current_txn_start_offset,
            )
        })
        .collect())
}

/// A transactional offset commit is appended to `__consumer_offsets` as any
/// transactional batch is: the partition's producer state records it (its
/// transaction open) while the broker runs, exactly as the replay after a
/// restart rebuilds it; and a zombie's commit under an older epoch than the
/// partition has seen is refused with INVALID_PRODUCER_EPOCH, as a Produce
/// would be. (Both were not so while the group coordinator appended to the
/// log directly: the live table missed the batch, and nothing fenced it.)
/// Runs against stock Kafka with `FJORD_TEST_BROKER=kafka:HOST:PORT` (then
/// without the restart).
#[test]
fn transactional_offset_commits_are_recorded_and_fenced_by_the_offsets_partition() {
    let mut target = Target::start(BrokerOpts::default().cores(1));
    let (topic, group) = (target.name("txn-offsets"), target.name("txn-offsets-group"));
    let to = OffsetsTarget {
        group: &group,
        topic: &topic,
    };
    common::client::create_topic(&target.bootstrap(), &topic, 1, &[]);
    let mut raw = RawClient::connect(target.port());
    let id = target.name("txn-offsets");
    find_coordinator(&mut raw, &id, 1);
    find_coordinator(&mut raw, &group, 0);
    let (pid, e0) = init(&mut raw, &id).expect("InitProducerId");
    assert_eq!(add_offsets(&mut raw, &id, pid, e0, &group), 0);
    assert_eq!(txn_offset_commit(&mut raw, &to, &id, pid, e0, 5), 0);
    let live = offsets_producers(&mut raw, &group).expect("DescribeProducers");
    assert_eq!(live.len(), 1, "the live table holds the producer: {live:?}");
    assert_eq!((live[0].0, live[0].1), (pid, e0 as i32));
    assert!(live[0].2 >= 0, "its transaction is open: {live:?}");

    if let Target::Fjord(broker) = &mut target {
        broker.restart();
        raw = RawClient::connect(broker.port);
        let mut replayed = offsets_producers(&mut raw, &group);
        wait_until("the offsets partition to load", || {
            replayed = offsets_producers(&mut raw, &group);
            replayed.is_ok()
        });
        assert_eq!(replayed, Ok(live), "the replay rebuilds the same table");
    }

    // A new instance fences the first: its InitProducerId aborts the open
    // transaction under a bumped epoch, whose ABORT marker reaches the
    // offsets partition.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (pid1, e1) = loop {
        match init(&mut raw, &id) {
            Err(code)
                if code == ResponseError::ConcurrentTransactions.code()
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20))
            }
            other => break other.expect("InitProducerId of the second instance"),
        }
    };
    assert_eq!(pid1, pid);
    assert!(e1 > e0);
    wait_until("the ABORT marker on the offsets partition", || {
        offsets_producers(&mut raw, &group)
            .is_ok_and(|p| p.len() == 1 && p[0].1 > e0 as i32 && p[0].2 == -1)
    });
    assert_eq!(
        txn_offset_commit(&mut raw, &to, &id, pid, e0, 6),
        ResponseError::InvalidProducerEpoch.code(),
        "the zombie's commit is fenced"
    );
}
