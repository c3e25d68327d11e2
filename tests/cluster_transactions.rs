//! Transactions across nodes (`docs/replication.md` §4.7): three nodes in
//! network namespaces (`common::netns`), one shard each, a quorum of all
//! three, and a topic of replication factor 3 whose three partitions are
//! led by the three nodes:
//! - a transactional librdkafka producer bootstrapped on one node (a
//!   transaction-version-1 client: the leaders verify each partition at
//!   the coordinator, AddPartitionsToTxn v4 `verifyOnly` when it is on
//!   another node) writes to all three partitions in committed and aborted
//!   transactions; the coordinator writes each transaction's markers on
//!   the partitions' leaders, two of them on other nodes (WriteTxnMarkers);
//! - a read_committed consumer on another node reads exactly the committed
//!   records, in order, none of the aborted ones, and reaches the end of
//!   each partition (every marker was written: an open transaction would
//!   hold the last stable offset back);
//! - every replica's log is byte-identical to its leader's and holds the
//!   markers, COMMIT and ABORT in the transactions' order;
//! - the same with raw requests of transaction version 2 (Produce v12 to
//!   each partition's leader, which adds the partition at the coordinator
//!   on another node with AddPartitionsToTxn v5; EndTxn v5 bumping the
//!   epoch; markers in the bumped epochs).

mod common;

use common::client::{self, base_config};
use common::cluster::{addr, partitions, PartitionView};
use common::netns::Net;
use common::raw::{only_partition, produce_request, RawClient};
use common::Broker;
use fjord::record::{BatchBuilder, Compression};
use kafka_protocol::messages::{FindCoordinatorRequest, TransactionalId};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use std::time::{Duration, Instant};

const SESSION_TIMEOUT_MS: u64 = 3000;
const NODES: usize = 3;
const TOPIC: &str = "txn-across";
const PARTITIONS: i32 = 3;
/// Transactions, committed when even, aborted when odd (the last one is
/// committed: its records are readable only once the abort before it was
/// marked everywhere).
const ROUNDS: usize = 5;
/// Records per partition per transaction.
const PER_PARTITION: usize = 3;
const TIMEOUT: Duration = Duration::from_secs(60);
/// How long the quorum gets to elect, and followers to catch up.
const SETTLE: Duration = Duration::from_secs(60);

fn start(net: &Net, i: usize) -> Broker {
    common::cluster::start_node(net, i, NODES, SESSION_TIMEOUT_MS, &[])
}

/// Waits until every node lists `topic` alike: each partition led, with
/// three replicas all in the ISR.
fn wait_led_by_every_node(brokers: &[Broker], topic: &str) -> Vec<PartitionView> {
    let all: Vec<i32> = (0..NODES as i32).map(|n| n * 1000).collect();
    common::wait_for(SETTLE, "every node to list the topic", || {
        let first: Vec<PartitionView> = partitions(&brokers[0], topic)?
            .into_iter()
            .map(PartitionView::sorted)
            .collect();
        if first.len() != PARTITIONS as usize
            || first
                .iter()
                .any(|l| l.error != 0 || l.leader < 0 || l.replicas != all || l.isr != all)
        {
            return None;
        }
        brokers[1..]
            .iter()
            .all(|b| {
                partitions(b, topic)
                    .map(|v| v.into_iter().map(PartitionView::sorted).collect::<Vec<_>>())
                    .as_ref()
                    == Some(&first)
            })
            .then_some(first)
    })
}

fn value(round: usize, p: i32, i: usize) -> String {
    format!("r{round}-p{p}-{i}")
}

/// The stored batches of `broker`'s replica of partition `p`: the bytes of
/// all of them, and the control type (0 ABORT, 1 COMMIT) of each control
/// batch in log order.
fn stored(broker: &Broker, p: i32) -> (Vec<u8>, Vec<i16>) {
    stored_of(broker, TOPIC, p)
}

/// [`stored`] of `topic`.
fn stored_of(broker: &Broker, topic: &str, p: i32) -> (Vec<u8>, Vec<i16>) {
    let batches = common::disk::batches(&broker.first_segment(topic, p));
    let markers = batches
        .iter()
        .filter(|b| b.header.is_control())
        .map(|b| {
            let records = b.records();
            assert_eq!(records.len(), 1, "a control batch holds one record");
            let key = records[0].key.as_deref().expect("a control key");
            assert!(key.len() >= 4, "control key {key:?}");
            i16::from_be_bytes([key[2], key[3]])
        })
        .collect();
    (batches.into_iter().flat_map(|b| b.bytes).collect(), markers)
}

/// Every record of the topic under `isolation`, bootstrapped at `broker`,
/// per partition in offset order, read until each partition's position is
/// its end (`ends`), then a moment more for any extra.
fn read_all(broker: &Broker, isolation: &str, ends: &[i64]) -> Vec<Vec<String>> {
    let consumer: BaseConsumer =
        client::consumer(&broker.bootstrap(), &[("isolation.level", isolation)]);
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(TOPIC, p, Offset::Beginning)
            .expect("add partition");
    }
    consumer.assign(&tpl).expect("assign");
    let mut out = vec![Vec::new(); PARTITIONS as usize];
    let deadline = Instant::now() + TIMEOUT;
    let mut settle_until: Option<Instant> = None;
    loop {
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.expect("consume");
            out[m.partition() as usize]
                .push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned());
        }
        let now = Instant::now();
        if let Some(t) = settle_until {
            if now >= t {
                return out;
            }
            continue;
        }
        let positions = consumer.position().expect("position");
        let at_end = (0..PARTITIONS).all(|p| {
            matches!(
                positions.find_partition(TOPIC, p).map(|e| e.offset()),
                Some(Offset::Offset(o)) if o >= ends[p as usize]
            )
        });
        if at_end {
            settle_until = Some(now + Duration::from_secs(2));
        }
        assert!(
            now < deadline,
            "{isolation} consumer stuck at {positions:?} (ends {ends:?}), got {out:?}"
        );
    }
}

#[test]
fn transactions_commit_and_abort_on_leaders_of_every_node() {
    let net = Net::new(NODES);
    let brokers: Vec<Broker> = (0..NODES).map(|i| start(&net, i)).collect();
    common::cluster::create_topic(&brokers, TOPIC, PARTITIONS, NODES as i16, &[]);
    let listed = wait_led_by_every_node(&brokers, TOPIC);
    let mut leader_nodes: Vec<i32> = listed.iter().map(|l| l.leader / 1000).collect();
    leader_nodes.sort();
    assert_eq!(
        leader_nodes,
        vec![0, 1, 2],
        "one partition led by each node: {listed:?}"
    );

    let producer: BaseProducer = {
        let mut c = base_config(&brokers[0].bootstrap());
        c.set("transactional.id", "across-nodes")
            .set("transaction.timeout.ms", "60000")
            .set("linger.ms", "0");
        c.create().expect("transactional producer")
    };
    producer
        .init_transactions(TIMEOUT)
        .expect("init_transactions");
    let mut committed = vec![Vec::new(); PARTITIONS as usize];
    for round in 0..ROUNDS {
        producer.begin_transaction().expect("begin_transaction");
        for p in 0..PARTITIONS {
            for i in 0..PER_PARTITION {
                let v = value(round, p, i);
                producer
                    .send(BaseRecord::<(), str>::to(TOPIC).payload(&v).partition(p))
                    .map_err(|(e, _)| e)
                    .expect("enqueue");
                if round % 2 == 0 {
                    committed[p as usize].push(v);
                }
            }
        }
        producer.flush(TIMEOUT).expect("flush");
        if round % 2 == 0 {
            producer
                .commit_transaction(TIMEOUT)
                .unwrap_or_else(|e| panic!("commit of round {round}: {e}"));
        } else {
            producer
                .abort_transaction(TIMEOUT)
                .unwrap_or_else(|e| panic!("abort of round {round}: {e}"));
        }
    }

    // Every replica byte-identical to the others, each partition holding
    // every record and one marker per transaction, in order.
    let markers: Vec<i16> = (0..ROUNDS).map(|r| i16::from(r % 2 == 0)).collect();
    let mut ends = Vec::new();
    for p in 0..PARTITIONS {
        let what = format!("partition {p}'s replicas byte-identical with every marker");
        let end = common::wait_for(SETTLE, &what, || {
            let (bytes, found) = stored(&brokers[0], p);
            if found != markers {
                return None;
            }
            let same = brokers[1..].iter().all(|b| stored(b, p).0 == bytes);
            let batches = common::disk::batches(&brokers[0].first_segment(TOPIC, p));
            let end = batches.last().map(|b| b.header.last_offset() + 1)?;
            same.then_some(end)
        });
        assert_eq!(
            end,
            (ROUNDS * (PER_PARTITION + 1)) as i64,
            "partition {p}: the records and markers of every transaction"
        );
        ends.push(end);
    }

    // Read on another node than the producer's: committed only, in order.
    let got = read_all(&brokers[1], "read_committed", &ends);
    assert_eq!(
        got, committed,
        "read_committed sees the committed records only"
    );
    // read_uncommitted sees every record, the aborted ones too.
    let every: Vec<Vec<String>> = (0..PARTITIONS)
        .map(|p| {
            (0..ROUNDS)
                .flat_map(|r| (0..PER_PARTITION).map(move |i| value(r, p, i)))
                .collect()
        })
        .collect();
    let got = read_all(&brokers[2], "read_uncommitted", &ends);
    assert_eq!(got, every, "read_uncommitted sees every record");
}

/// The node index of the coordinator of transactional id `id`, asked of
/// `broker` (FindCoordinator v3), retried while it is not available yet.
fn find_coordinator(broker: &Broker, id: &str) -> usize {
    common::wait_for(SETTLE, "the transaction coordinator", || {
        let req = FindCoordinatorRequest::default()
            .with_key(StrBytes::from_string(id.to_string()))
            .with_key_type(1);
        let resp = RawClient::connect_to(addr(broker)).request(3, &req);
        if resp.error_code != 0 {
            std::thread::sleep(Duration::from_millis(100));
            return None;
        }
        usize::try_from(resp.node_id.0 / 1000).ok()
    })
}

/// Produce v12 (transaction version 2) of `values` to partition `p` of
/// `topic` at its leader: the leader adds the partition to the transaction
/// at the coordinator; retried while that answers NOT_ENOUGH_REPLICAS
/// (retriable coordinator trouble, as while the previous transaction's
/// markers are written). The error code.
#[allow(clippy::too_many_arguments)]
fn produce_v12(
    leader: &mut RawClient,
    topic: &str,
    p: i32,
    id: &str,
    pid: i64,
    epoch: i16,
    values: &[String],
) -> i16 {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let mut b = BatchBuilder::new(Compression::None)
            .producer(pid, epoch, 0)
            .transactional(true);
        for v in values {
            b = b.record(None, Some(v.as_bytes()), &[], 1_700_000_000_000);
        }
        let req = produce_request(topic, p, -1, b.build().freeze())
            .with_transactional_id(Some(TransactionalId(StrBytes::from_string(id.into()))));
        let code = only_partition(&leader.request(12, &req)).error_code;
        if code == ResponseError::NotEnoughReplicas.code() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        return code;
    }
}

#[test]
fn transaction_version_2_adds_partitions_at_a_coordinator_on_another_node() {
    const V2_TOPIC: &str = "txn-v2-across";
    let net = Net::new(NODES);
    let brokers: Vec<Broker> = (0..NODES).map(|i| start(&net, i)).collect();
    common::cluster::create_topic(&brokers, V2_TOPIC, PARTITIONS, NODES as i16, &[]);
    let listed = wait_led_by_every_node(&brokers, V2_TOPIC);
    let id = "across-nodes-v2";
    let coordinator = find_coordinator(&brokers[0], id);
    let mut coord = RawClient::connect_to(addr(&brokers[coordinator]));
    let (pid, mut epoch) = common::raw::init_transactional(&mut coord, id).expect("InitProducerId");
    let mut leaders: Vec<RawClient> = listed
        .iter()
        .map(|l| RawClient::connect_to(addr(&brokers[(l.leader / 1000) as usize])))
        .collect();
    assert!(
        listed
            .iter()
            .any(|l| (l.leader / 1000) as usize != coordinator),
        "a partition led away from the coordinator's node: {listed:?}"
    );
    // Commit, abort, commit: each EndTxn v5 bumps the epoch.
    let commits = [true, false, true];
    for (round, &commit) in commits.iter().enumerate() {
        for (p, leader) in leaders.iter_mut().enumerate() {
            let values: Vec<String> = (0..PER_PARTITION)
                .map(|i| value(round, p as i32, i))
                .collect();
            assert_eq!(
                produce_v12(leader, V2_TOPIC, p as i32, id, pid, epoch, &values),
                0,
                "round {round}, partition {p}"
            );
        }
        let (code, next) = common::raw::end_txn_v5(&mut coord, id, pid, epoch, commit);
        assert_eq!((code, next), (0, epoch + 1), "EndTxn of round {round}");
        epoch = next;
    }
    let markers: Vec<i16> = commits.iter().map(|&c| i16::from(c)).collect();
    for p in 0..PARTITIONS {
        let what = format!("{V2_TOPIC}-{p}'s replicas byte-identical with every marker");
        common::wait_for(SETTLE, &what, || {
            let (bytes, found) = stored_of(&brokers[0], V2_TOPIC, p);
            (found == markers
                && brokers[1..]
                    .iter()
                    .all(|b| stored_of(b, V2_TOPIC, p).0 == bytes))
            .then_some(())
        });
        // The markers carry the bumped epochs: 1, 2, 3.
        let epochs: Vec<i16> = common::disk::batches(&brokers[0].first_segment(V2_TOPIC, p))
            .iter()
            .filter(|b| b.header.is_control())
            .map(|b| b.header.producer_epoch)
            .collect();
        assert_eq!(epochs, vec![1, 2, 3], "partition {p}'s marker epochs");
    }
    // A fenced epoch is refused at a leader on another node too.
    let stale = produce_v12(
        &mut leaders[0],
        V2_TOPIC,
        0,
        id,
        pid,
        epoch - 1,
        &["late".to_string()],
    );
    assert_eq!(stale, ResponseError::InvalidProducerEpoch.code());
}
