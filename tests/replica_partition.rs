//! The replica fetcher (`fjord::replication::fetcher`) driving a real
//! follower `Partition` (`append_replica`, `truncate_to`,
//! `truncate_fully_and_start_at`, the HW set from outside;
//! docs/replication.md §4.2) against a real fjord broker as the leader:
//! the follower's log ends byte for byte equal to the leader's segment,
//! with the producer state and aborted transactions the batches imply; a
//! follower that led an epoch of its own truncates to where it agrees with
//! the leader; one below the leader's log start starts again there.
//!
//! The `FollowerLog` here maps the fetcher's seam onto one partition, as
//! the shard's replica manager (not built yet) will over its partitions.

mod common;
mod log_util;

use bytes::{Bytes, BytesMut};
use common::client::create_topic;
use common::leader::{one_batch, produce_idempotent_and_transactions, produce_plain, topic_id};
use common::raw::RawClient;
use common::{Broker, BrokerOpts};
use fjord::log::{LogConfig, LogManager, TailCache};
use fjord::metadata::TopicConfig;
use fjord::partition::Partition;
use fjord::record::{batch, BatchBuilder, BatchHeader, Compression};
use fjord::replication::fetcher::{
    FetcherConfig, FollowerLog, FollowerLogError, FollowerPosition, ReplicaFetcher,
};
use fjord::types::{Offset, TopicPartition};
use kafka_protocol::messages::TopicName;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

const CATCH_UP: Duration = Duration::from_secs(60);
const REPLICA_ID: i32 = 1000;

/// One follower partition behind the fetcher's seam.
struct PartitionFollower {
    p: Rc<Partition>,
    _mgr: Rc<LogManager>,
    errors: RefCell<Vec<ResponseError>>,
}

fn log_err(e: impl std::fmt::Display) -> FollowerLogError {
    FollowerLogError(e.to_string())
}

impl FollowerLog for PartitionFollower {
    fn position(&self, _: &TopicPartition) -> Option<FollowerPosition> {
        let log = &self.p.log;
        let (start, end) = (log.log_start_offset().0, log.log_end_offset().0);
        let last_epoch = if end > start {
            log.epoch_for_offset(Offset(end - 1))
        } else {
            -1
        };
        Some(FollowerPosition {
            log_end: end,
            last_epoch,
            log_start: start,
            current_leader_epoch: -1,
        })
    }

    fn end_offset_for_epoch(&self, _: &TopicPartition, epoch: i32) -> Option<(i32, i64)> {
        let (e, end) = self.p.log.end_offset_for_epoch(epoch);
        (e >= 0 && end >= 0).then_some((e, end))
    }

    async fn append(
        &self,
        _: &TopicPartition,
        batches: Bytes,
        last_offset: i64,
    ) -> Result<(), FollowerLogError> {
        // Each batch a slice of the answer: no copy on the way in.
        let mut at = 0;
        while at < batches.len() {
            let h = BatchHeader::parse(&batches[at..]).map_err(log_err)?;
            let b = batches.slice(at..at + h.total_size());
            self.p.append_replica(b, batches.len()).map_err(log_err)?;
            at += h.total_size();
        }
        assert_eq!(self.p.log.log_end_offset().0, last_offset + 1);
        Ok(())
    }

    async fn truncate_to(&self, _: &TopicPartition, offset: i64) -> Result<(), FollowerLogError> {
        let end = self.p.truncate_to(Offset(offset)).await.map_err(log_err)?;
        assert_eq!(end.0, offset, "truncated at a batch boundary");
        Ok(())
    }

    async fn restart_at(&self, _: &TopicPartition, offset: i64) -> Result<(), FollowerLogError> {
        self.p
            .truncate_fully_and_start_at(Offset(offset))
            .await
            .map_err(log_err)?;
        Ok(())
    }

    fn leader_offsets(&self, _: &TopicPartition, high_watermark: i64, _log_start: i64) {
        self.p.log.set_high_watermark(Offset(high_watermark));
    }

    fn fetch_error(&self, _: &TopicPartition, error: ResponseError) {
        self.errors.borrow_mut().push(error);
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
    let mgr = LogManager::new_for_shard(dir, TailCache::new(1 << 20), 0);
    let log = mgr.open(tp, LogConfig::default()).await.unwrap();
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
        errors: RefCell::default(),
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

fn fetcher(
    broker: &Broker,
    topic: &str,
    f: &Rc<PartitionFollower>,
) -> Rc<ReplicaFetcher<PartitionFollower>> {
    let mut config = FetcherConfig::new(REPLICA_ID, broker.bootstrap());
    config.backoff = Duration::from_millis(200);
    let fetcher = ReplicaFetcher::new(config, f.clone());
    fetcher.add(TopicPartition::new(topic, 0), topic_id(broker, topic));
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
        assert!(f.errors.borrow().is_empty());
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
