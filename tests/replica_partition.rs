//! The replica fetcher (`fjord::replication::fetcher`) driving a real
//! follower `Partition` (`append_replica`, `truncate_to`,
//! `truncate_fully_and_start_at`, the HW set from outside;
//! docs/replication.md §4.2) against a real fjord broker as the leader:
//! the follower's log ends byte for byte equal to the leader's segment,
//! with the producer state and aborted transactions the batches imply; a
//! follower that led an epoch of its own truncates to where it agrees with
//! the leader; one below the leader's log start starts again there.
//!
//! The `FollowerLog` is the shard's own (`replication::manager`: its
//! `Followers` and the view of one leader), over one partition here.

mod common;
mod log_util;

use bytes::{Bytes, BytesMut};
use common::client::create_topic;
use common::leader::{one_batch, produce_idempotent_and_transactions, produce_plain, topic_id};
use common::raw::RawClient;
use common::{Broker, BrokerOpts};
use fjord::log::{LogConfig, LogManager, TailCache};
use fjord::metadata::{PartitionState, TopicConfig};
use fjord::partition::Partition;
use fjord::record::{batch, BatchBuilder, BatchHeader, Compression};
use fjord::replication::fetcher::{FetcherConfig, ReplicaFetcher};
use fjord::replication::manager::{Follower, FollowerView, Followers};
use fjord::shard::replica_log_epoch;
use fjord::types::{Offset, TopicPartition};
use kafka_protocol::messages::TopicName;
use kafka_protocol::protocol::StrBytes;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

const CATCH_UP: Duration = Duration::from_secs(60);
const REPLICA_ID: i32 = 1000;
/// The leader's broker id (a single node's shard 0).
const LEADER_ID: i32 = 0;

/// A follower partition behind the fetcher's seam: the shard's own mapping
/// (`replication::manager`), one partition followed from [`LEADER_ID`].
struct PartitionFollower {
    p: Rc<Partition>,
    _mgr: Rc<LogManager>,
    followers: Rc<Followers>,
    tp: TopicPartition,
}

impl PartitionFollower {
    /// Partition errors the leader answered.
    fn errors(&self) -> u64 {
        self.followers
            .get(&self.tp)
            .map_or(0, |f| f.fetch_errors.get())
    }
}

/// Runs `f` on a glommio executor of its own, after the DMA probe of `dir`.
fn on_executor<F, Fut>(dir: std::path::PathBuf, f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    log_util::run(dir, f);
}

/// A follower partition in `dir`, as a fresh broker would open it.
async fn follower_partition(
    dir: std::path::PathBuf,
    tp: &TopicPartition,
) -> (Rc<LogManager>, Rc<Partition>) {
    follower_partition_in_epoch(dir, tp, LogConfig::default().leader_epoch).await
}

/// A follower partition in `dir` whose log opens in `epoch`.
async fn follower_partition_in_epoch(
    dir: std::path::PathBuf,
    tp: &TopicPartition,
    epoch: i32,
) -> (Rc<LogManager>, Rc<Partition>) {
    let mgr = LogManager::new_for_shard(dir, TailCache::new(1 << 20), 0);
    let config = LogConfig {
        leader_epoch: epoch,
        ..LogConfig::default()
    };
    let log = mgr.open(tp, config).await.unwrap();
    let config = TopicConfig::resolve(
        &BTreeMap::new(),
        &fjord::config::ServeArgs::default().resolve().unwrap(),
    );
    let p = Partition::open(tp.clone(), [0; 16], log, config, 1_000)
        .await
        .unwrap();
    (mgr, p)
}

async fn follower(dir: std::path::PathBuf, tp: &TopicPartition) -> Rc<PartitionFollower> {
    let (mgr, p) = follower_partition(dir, tp).await;
    Rc::new(PartitionFollower {
        p,
        _mgr: mgr,
        followers: Rc::default(),
        tp: tp.clone(),
    })
}

/// The follower's log, every batch, as bytes.
async fn follower_bytes(p: &Partition) -> Vec<u8> {
    try_follower_bytes(p).await.unwrap()
}

/// The follower's log as bytes, or the error of a read that a truncation
/// by the running fetcher overtook.
async fn try_follower_bytes(p: &Partition) -> Result<Vec<u8>, fjord::log::LogError> {
    let (start, end) = (p.log.log_start_offset().0, p.log.log_end_offset().0);
    let r = p.log.read(Offset(start), 64 << 20, Offset(end)).await?;
    Ok(log_util::chunk_bytes(&r))
}

fn leader_bytes(broker: &Broker, topic: &str) -> (Vec<u8>, i64) {
    let stored = common::disk::batches(&broker.first_segment(topic, 0));
    let end = stored.last().map_or(0, |b| b.header.last_offset() + 1);
    (stored.iter().flat_map(|b| b.bytes.clone()).collect(), end)
}

/// Waits (yielding to the fetcher) until the follower holds `bytes`.
async fn holds(p: &Partition, bytes: &[u8]) {
    let deadline = std::time::Instant::now() + CATCH_UP;
    loop {
        if p.log.written_offset() == Offset(p.log.log_end_offset().0)
            && try_follower_bytes(p).await.is_ok_and(|b| b == bytes)
        {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "the follower's bytes");
        glommio::timer::sleep(Duration::from_millis(20)).await;
    }
}

/// A fetcher from `broker` into `f`, through the shard's `FollowerLog`
/// ([`Followers`], the view of [`LEADER_ID`]).
fn fetcher(
    broker: &Broker,
    topic: &str,
    f: &Rc<PartitionFollower>,
) -> Rc<ReplicaFetcher<FollowerView>> {
    let mut config = FetcherConfig::new(REPLICA_ID, broker.bootstrap());
    config.backoff = Duration::from_millis(200);
    let id = topic_id(broker, topic);
    f.followers
        .insert(f.tp.clone(), Follower::new(f.p.clone(), id, LEADER_ID, -1));
    let fetcher = ReplicaFetcher::new(config, Rc::new(f.followers.view(LEADER_ID)));
    fetcher.add(TopicPartition::new(topic, 0), id);
    fetcher
}

/// Plain, idempotent and transactional batches (one transaction committed,
/// one aborted) reach the follower partition byte for byte; it knows the
/// idempotent and transactional producers, the aborted transaction, and
/// the leader's HW; a restart of the follower recovers the same.
#[test]
fn a_follower_partition_copies_the_leader_and_knows_its_producers() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    on_executor(data.clone(), move || async move {
        let broker = Broker::start(BrokerOpts::default().cores(1));
        let topic = "replica-partition";
        let tp = TopicPartition::new(topic, 0);
        create_topic(&broker.bootstrap(), topic, 1, &[]);
        produce_plain(&broker, topic, 2);
        produce_idempotent_and_transactions(&broker, topic, 4, 1, "replica-partition");
        let (bytes, end) = leader_bytes(&broker, topic);

        let f = follower(data.clone(), &tp).await;
        // Replicated HW mode from the start, as the shard's replica
        // manager runs a follower: only the leader's answers raise it.
        f.p.log.set_high_watermark(Offset(0));
        let fetcher = fetcher(&broker, topic, &f);
        let task = glommio::spawn_local(fetcher.clone().run());
        holds(&f.p, &bytes).await;
        let deadline = std::time::Instant::now() + CATCH_UP;
        while f.p.log.high_watermark().0 != end {
            assert!(std::time::Instant::now() < deadline, "follower HW");
            glommio::timer::sleep(Duration::from_millis(20)).await;
        }
        fetcher.stop();
        task.await;
        assert_eq!(f.errors(), 0);
        let producers = f.p.producers().len();
        assert_eq!(
            producers, 2,
            "the idempotent and the transactional producer"
        );
        let aborted = f.p.aborted_overlapping(0, i64::MAX);
        assert_eq!(aborted.len(), 1, "{aborted:?}");
        assert_eq!(f.p.last_stable_offset(), end, "no transaction open");
        drop(fetcher);
        drop(f);
        // A restart of the follower (no close: as after kill -9) recovers
        // the same log and state.
        let (_mgr, p) = follower_partition(data.clone(), &tp).await;
        assert_eq!(follower_bytes(&p).await, bytes);
        assert_eq!(p.producers().len(), 2);
        assert_eq!(p.aborted_overlapping(0, i64::MAX), aborted);
    });
}

/// A follower partition that led epoch 1 and wrote batches of its own
/// (an idempotent producer's) while the leader went from epoch 0 to 2:
/// the fetcher truncates it where the logs agree (`Partition::truncate_to`)
/// and it copies the leader's batches; the producer it alone knew is gone.
#[test]
fn a_diverged_follower_partition_truncates_and_matches_the_leader() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    on_executor(data.clone(), move || async move {
        let mut broker = Broker::start(BrokerOpts::default().cores(1));
        let topic = "replica-partition-diverged";
        let tp = TopicPartition::new(topic, 0);
        create_topic(&broker.bootstrap(), topic, 1, &[]);
        produce_plain(&broker, topic, 3);
        for _ in 0..2 {
            broker.stop();
            broker.restart();
        }
        produce_plain(&broker, topic, 2);
        let stored = common::disk::batches(&broker.first_segment(topic, 0));
        let epochs: Vec<i32> = stored
            .iter()
            .map(|b| b.header.partition_leader_epoch)
            .collect();
        assert_eq!(epochs, vec![0, 0, 0, 2, 2]);

        let f = follower(data.clone(), &tp).await;
        for b in &stored[..3] {
            let b = Bytes::from(b.bytes.clone());
            let len = b.len();
            f.p.append_replica(b, len).unwrap();
        }
        // Its own epoch 1: an idempotent producer's batches, as a leader.
        f.p.log.become_leader(1).unwrap();
        for seq in 0..3 {
            let b: BytesMut = BatchBuilder::new(Compression::None)
                .producer(77, 0, seq)
                .record(None, Some(b"mine"), &[], 1_700_000_000_000)
                .build();
            let h = BatchHeader::parse(&b).unwrap();
            let cap = b.capacity();
            f.p.append_data(&h, b, cap, None, 1 << 20).unwrap();
        }
        assert_eq!(f.p.log.log_end_offset().0, 6);
        assert!(f.p.producers().get(77).is_some());
        let (bytes, _) = leader_bytes(&broker, topic);
        let fetcher = fetcher(&broker, topic, &f);
        let task = glommio::spawn_local(fetcher.clone().run());
        holds(&f.p, &bytes).await;
        assert_eq!(fetcher.stats().truncations, 1, "{:?}", fetcher.stats());
        fetcher.stop();
        task.await;
        assert!(
            f.p.producers().get(77).is_none(),
            "the diverged producer is gone"
        );
        assert_eq!(f.p.log.epoch_entries(), vec![(0, 0), (2, 3)]);
        let mut b = BytesMut::from(&one_batch("x")[..]);
        batch::set_base_offset(&mut b, 5);
        batch::set_partition_leader_epoch(&mut b, 1);
        let len = b.len();
        assert!(
            f.p.append_replica(b.freeze(), len).is_err(),
            "an epoch older than the latest is refused"
        );
    });
}

/// A follower restarted after its leader moved to a newer epoch (here the
/// leader went from epoch 0 to 2 while the follower held only part of
/// epoch 0): its log opens in the epoch the shard gives a follower
/// (`shard::replica_log_epoch`: none of its own), so it still takes the
/// epoch-0 batches it lacks, then epoch 2's, and its epochs are the
/// leader's. Opened in the leader's epoch instead, it would start epoch 2
/// at its own log end and refuse the older batches as stale.
#[test]
fn a_follower_restarted_behind_a_newer_epoch_fetches_the_older_one_first() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    on_executor(data.clone(), move || async move {
        let mut broker = Broker::start(BrokerOpts::default().cores(1));
        let topic = "replica-partition-restarted";
        let tp = TopicPartition::new(topic, 0);
        create_topic(&broker.bootstrap(), topic, 1, &[]);
        produce_plain(&broker, topic, 3);
        for _ in 0..2 {
            broker.stop();
            broker.restart();
        }
        produce_plain(&broker, topic, 2);
        let stored = common::disk::batches(&broker.first_segment(topic, 0));
        let epochs: Vec<i32> = stored
            .iter()
            .map(|b| b.header.partition_leader_epoch)
            .collect();
        assert_eq!(epochs, vec![0, 0, 0, 2, 2]);
        {
            let (_mgr, p) = follower_partition(data.clone(), &tp).await;
            for b in &stored[..2] {
                let b = Bytes::from(b.bytes.clone());
                let len = b.len();
                p.append_replica(b, len).unwrap();
            }
        }
        // Restarted: the image says another broker leads, in epoch 2.
        let mut state = PartitionState::new(vec![LEADER_ID, REPLICA_ID]);
        state.leader_epoch = 2;
        let epoch = replica_log_epoch(&state, REPLICA_ID);
        let (mgr, p) = follower_partition_in_epoch(data.clone(), &tp, epoch).await;
        assert_eq!(p.log.log_end_offset().0, 2);
        assert_eq!(p.log.epoch_entries(), vec![(0, 0)]);
        let f = Rc::new(PartitionFollower {
            p,
            _mgr: mgr,
            followers: Rc::default(),
            tp: tp.clone(),
        });
        let (bytes, _) = leader_bytes(&broker, topic);
        let fetcher = fetcher(&broker, topic, &f);
        let task = glommio::spawn_local(fetcher.clone().run());
        holds(&f.p, &bytes).await;
        fetcher.stop();
        task.await;
        assert_eq!(f.p.log.epoch_entries(), vec![(0, 0), (2, 3)]);
        assert_eq!(f.errors(), 0);
    });
}

/// The leader deleted records the empty follower partition still needs:
/// the fetcher restarts it at the leader's log start
/// (`Partition::truncate_fully_and_start_at`) and it copies the rest.
#[test]
fn a_follower_partition_below_the_leaders_log_start_starts_again_there() {
    use kafka_protocol::messages::delete_records_request::{
        DeleteRecordsPartition, DeleteRecordsTopic,
    };
    use kafka_protocol::messages::DeleteRecordsRequest;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    on_executor(data.clone(), move || async move {
        let broker = Broker::start(BrokerOpts::default().cores(1));
        let topic = "replica-partition-log-start";
        let tp = TopicPartition::new(topic, 0);
        create_topic(&broker.bootstrap(), topic, 1, &[]);
        produce_plain(&broker, topic, 5);
        let mut raw = RawClient::connect(broker.port_of(0));
        let resp = raw.request(
            2,
            &DeleteRecordsRequest::default()
                .with_topics(vec![DeleteRecordsTopic::default()
                    .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                    .with_partitions(vec![DeleteRecordsPartition::default()
                        .with_partition_index(0)
                        .with_offset(3)])])
                .with_timeout_ms(10_000),
        );
        assert_eq!(resp.topics[0].partitions[0].error_code, 0);
        let stored = common::disk::batches(&broker.first_segment(topic, 0));
        let rest: Vec<u8> = stored[3..].iter().flat_map(|b| b.bytes.clone()).collect();

        let f = follower(data.clone(), &tp).await;
        let fetcher = fetcher(&broker, topic, &f);
        let task = glommio::spawn_local(fetcher.clone().run());
        holds(&f.p, &rest).await;
        assert_eq!(f.p.log.log_start_offset().0, 3);
        assert_eq!(f.p.log.segment_base_offsets(), vec![3]);
        assert_eq!(fetcher.stats().restarts, 1);
        fetcher.stop();
        task.await;
    });
}

/// The leader deleted records the follower partition holds: the next
/// fetch answer moves the follower's log start up to the leader's
/// (`PartitionLog::follow_leader_log_start`), the follower's segments
/// wholly below it are deleted, and its shard's
/// `log-start-offset-checkpoint` names it once the fetcher is done with
/// that answer (before it fetches again).
#[test]
fn a_follower_partition_takes_the_leaders_log_start() {
    use kafka_protocol::messages::delete_records_request::{
        DeleteRecordsPartition, DeleteRecordsTopic,
    };
    use kafka_protocol::messages::DeleteRecordsRequest;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    on_executor(data.clone(), move || async move {
        let broker = Broker::start(BrokerOpts::default().cores(1));
        let topic = "replica-partition-follows-log-start";
        let tp = TopicPartition::new(topic, 0);
        // 1 MiB segments (the smallest), four 250 kB batches to each.
        let segment = ("segment.bytes", "1048576");
        create_topic(&broker.bootstrap(), topic, 1, &[segment]);
        let mut raw = RawClient::connect(broker.port_of(0));
        for i in 0..12u8 {
            let value = vec![b'a' + i; 250_000];
            let batch = BatchBuilder::new(Compression::None)
                .record(None, Some(&value), &[], 1_700_000_000_000)
                .build()
                .freeze();
            let resp = raw.request(9, &common::raw::produce_request(topic, 0, 1, batch));
            assert_eq!(common::raw::only_partition(&resp).error_code, 0);
        }

        let mgr = LogManager::new_for_shard(data.clone(), TailCache::new(1 << 20), 0);
        let config = LogConfig {
            segment_bytes: 1 << 20,
            ..LogConfig::default()
        };
        let log = mgr.open(&tp, config).await.unwrap();
        let topic_config = TopicConfig::resolve(
            &BTreeMap::new(),
            &fjord::config::ServeArgs::default().resolve().unwrap(),
        );
        let p = Partition::open(tp.clone(), [0; 16], log, topic_config, 1_000)
            .await
            .unwrap();
        p.log.set_high_watermark(Offset(0));
        let f = Rc::new(PartitionFollower {
            p,
            _mgr: mgr,
            followers: Rc::default(),
            tp: tp.clone(),
        });
        let fetcher = fetcher(&broker, topic, &f);
        let task = glommio::spawn_local(fetcher.clone().run());
        let deadline = std::time::Instant::now() + CATCH_UP;
        while f.p.log.high_watermark().0 != 12 {
            assert!(std::time::Instant::now() < deadline, "the follower's HW");
            glommio::timer::sleep(Duration::from_millis(20)).await;
        }
        let bases = f.p.log.segment_base_offsets();
        assert!(bases.len() >= 3, "several segments: {bases:?}");
        let offset = bases[2] + 1;
        let resp = raw.request(
            2,
            &DeleteRecordsRequest::default()
                .with_topics(vec![DeleteRecordsTopic::default()
                    .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                    .with_partitions(vec![DeleteRecordsPartition::default()
                        .with_partition_index(0)
                        .with_offset(offset)])])
                .with_timeout_ms(10_000),
        );
        assert_eq!(resp.topics[0].partitions[0].error_code, 0);
        let deadline = std::time::Instant::now() + CATCH_UP;
        while f.p.log.log_start_offset().0 != offset || f.p.log.segment_base_offsets() != bases[2..]
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the follower's log start {} (segments {:?}) never reached the leader's {offset}",
                f.p.log.log_start_offset().0,
                f.p.log.segment_base_offsets()
            );
            glommio::timer::sleep(Duration::from_millis(20)).await;
        }
        // Stopped: the answer being handled is done with.
        fetcher.stop();
        task.await;
        let file = fjord::log::checkpoint::shard_file(
            &data,
            fjord::log::checkpoint::LOG_START_CHECKPOINT,
            0,
        );
        let checkpointed = fjord::log::checkpoint::decode(&std::fs::read_to_string(file).unwrap())
            .unwrap()
            .into_iter()
            .find(|(t, _)| *t == tp)
            .map(|(_, o)| o);
        assert_eq!(checkpointed, Some(offset), "the log start checkpointed");
        assert_eq!(f.errors(), 0);
    });
}
