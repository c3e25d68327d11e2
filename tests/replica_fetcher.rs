//! The replica fetcher (`fjord::replication::fetcher`, `docs/replication.md`
//! §4.1) against a real fjord broker as the leader: a follower log in
//! memory copies the leader's partition byte for byte (idempotent and
//! transactional batches, control markers, two leader epochs, a leader
//! restart in the middle), truncates where it diverged from the leader
//! (KIP-320's `diverging_epoch`), and starts again at the leader's log
//! start when the leader deleted what it still needed.
//!
//! The follower log here is a list of batches with fjord's leader-epoch
//! cache; the fetcher is the code under test, the leader is the broker.

mod common;

use bytes::{Bytes, BytesMut};
use common::client::create_topic;
use common::leader::{one_batch, produce_idempotent_and_transactions, produce_plain, topic_id};
use common::raw::RawClient;
use common::{Broker, BrokerOpts};
use fjord::log::leader_epoch::LeaderEpochCache;
use fjord::record::{batch, BatchHeader};
use fjord::replication::fetcher::{
    FetcherConfig, FollowerLog, FollowerLogError, FollowerPosition, ReplicaFetcher,
};
use fjord::types::TopicPartition;
use kafka_protocol::messages::TopicName;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

/// How long a follower gets to catch up with the leader.
const CATCH_UP: Duration = Duration::from_secs(60);
/// The follower's replica id (a broker id the leader does not know).
const REPLICA_ID: i32 = 1000;

/// A follower's log in memory: whole batches as the fetcher handed them.
#[derive(Default)]
struct MemoryLog {
    batches: RefCell<Vec<Bytes>>,
    log_start: RefCell<i64>,
    epochs: RefCell<LeaderEpochCache>,
    high_watermark: RefCell<i64>,
    errors: RefCell<Vec<ResponseError>>,
}

impl MemoryLog {
    fn log_end(&self) -> i64 {
        self.batches
            .borrow()
            .last()
            .map_or(*self.log_start.borrow(), |b| {
                BatchHeader::parse(b).unwrap().last_offset() + 1
            })
    }

    /// Adds `bytes` (whole batches) as they are.
    fn push(&self, bytes: &[u8]) {
        let mut at = 0;
        while at < bytes.len() {
            let h = BatchHeader::parse(&bytes[at..]).unwrap();
            let b = Bytes::copy_from_slice(&bytes[at..at + h.total_size()]);
            self.epochs
                .borrow_mut()
                .assign(h.partition_leader_epoch, h.base_offset);
            self.batches.borrow_mut().push(b);
            at += h.total_size();
        }
    }

    fn bytes(&self) -> Vec<u8> {
        self.batches
            .borrow()
            .iter()
            .flat_map(|b| b.to_vec())
            .collect()
    }
}

impl FollowerLog for MemoryLog {
    fn position(&self, _: &TopicPartition) -> Option<FollowerPosition> {
        let last_epoch = self.batches.borrow().last().map_or(-1, |b| {
            BatchHeader::parse(b).unwrap().partition_leader_epoch
        });
        Some(FollowerPosition {
            log_end: self.log_end(),
            last_epoch,
            log_start: *self.log_start.borrow(),
            current_leader_epoch: -1,
        })
    }

    fn end_offset_for_epoch(&self, _: &TopicPartition, epoch: i32) -> Option<(i32, i64)> {
        let (e, end) = self.epochs.borrow().end_offset_for(epoch, self.log_end());
        (e >= 0 && end >= 0).then_some((e, end))
    }

    async fn append(
        &self,
        _: &TopicPartition,
        batches: Bytes,
        last_offset: i64,
    ) -> Result<(), FollowerLogError> {
        let first = BatchHeader::parse(&batches).unwrap().base_offset;
        if first != self.log_end() {
            return Err(FollowerLogError(format!(
                "batch at {first}, log end {}",
                self.log_end()
            )));
        }
        self.push(&batches);
        assert_eq!(self.log_end(), last_offset + 1);
        Ok(())
    }

    async fn truncate_to(&self, _: &TopicPartition, offset: i64) -> Result<(), FollowerLogError> {
        self.batches
            .borrow_mut()
            .retain(|b| BatchHeader::parse(b).unwrap().base_offset < offset);
        assert_eq!(self.log_end(), offset, "truncated at a batch boundary");
        self.epochs.borrow_mut().truncate_from_end(offset);
        Ok(())
    }

    async fn restart_at(&self, _: &TopicPartition, offset: i64) -> Result<(), FollowerLogError> {
        self.batches.borrow_mut().clear();
        *self.log_start.borrow_mut() = offset;
        *self.epochs.borrow_mut() = LeaderEpochCache::default();
        Ok(())
    }

    async fn leader_offsets(
        &self,
        _: &TopicPartition,
        high_watermark: i64,
        _log_start: i64,
    ) -> Result<(), FollowerLogError> {
        *self.high_watermark.borrow_mut() = high_watermark.min(self.log_end());
        Ok(())
    }

    fn fetch_error(&self, _: &TopicPartition, error: ResponseError) {
        self.errors.borrow_mut().push(error);
    }
}

/// Runs `f` on a glommio executor of its own (the fetcher needs one).
fn on_executor<F, Fut>(f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    // One executor at a time: each locks memory, and RLIMIT_MEMLOCK may be
    // as small as 8 MiB.
    static ONE_EXECUTOR: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = ONE_EXECUTOR.lock().unwrap_or_else(|e| e.into_inner());
    fjord::runtime::executor_builder(0, None, fjord::runtime::IO_MEMORY_TEST_BYTES)
        .spawn(f)
        .expect("an executor")
        .join()
        .expect("the executor's thread");
}

/// Waits (yielding to the fetcher) until the follower's log ends at `end`.
async fn caught_up(log: &MemoryLog, end: i64) {
    let deadline = std::time::Instant::now() + CATCH_UP;
    while log.log_end() != end {
        assert!(
            std::time::Instant::now() < deadline,
            "the follower reached {} of {end}",
            log.log_end()
        );
        glommio::timer::sleep(Duration::from_millis(20)).await;
    }
}

/// The leader's log end, from its first segment.
fn leader_batches(broker: &Broker, topic: &str) -> Vec<common::disk::StoredBatch> {
    common::disk::batches(&broker.first_segment(topic, 0))
}

fn concat(batches: &[common::disk::StoredBatch]) -> Vec<u8> {
    batches.iter().flat_map(|b| b.bytes.clone()).collect()
}

fn follower(broker: &Broker, topic: &str, log: &Rc<MemoryLog>) -> Rc<ReplicaFetcher<MemoryLog>> {
    let mut config = FetcherConfig::new(REPLICA_ID, broker.bootstrap());
    config.backoff = Duration::from_millis(200);
    let fetcher = ReplicaFetcher::new(config, log.clone());
    fetcher.add(TopicPartition::new(topic, 0), topic_id(broker, topic));
    fetcher
}

/// Everything the leader wrote — plain, idempotent and transactional
/// batches with their markers, in two leader epochs — reaches the follower
/// as the same bytes, including across a restart of the leader while the
/// fetcher runs (it reconnects), and the follower's high watermark is the
/// leader's.
#[test]
fn a_follower_copies_the_leaders_log_byte_for_byte() {
    on_executor(|| async {
        let mut broker = Broker::start(BrokerOpts::default().cores(1));
        let topic = "replica-copy";
        create_topic(&broker.bootstrap(), topic, 1, &[]);
        produce_plain(&broker, topic, 3);
        produce_idempotent_and_transactions(&broker, topic, 5, 3, "replica-fetcher-txn");
        let log = Rc::new(MemoryLog::default());
        let fetcher = follower(&broker, topic, &log);
        let task = glommio::spawn_local(fetcher.clone().run());
        let end = leader_batches(&broker, topic)
            .last()
            .unwrap()
            .header
            .last_offset()
            + 1;
        caught_up(&log, end).await;

        // The leader restarts (a new leader epoch) under the fetcher.
        broker.stop();
        broker.restart();
        produce_plain(&broker, topic, 2);
        let stored = leader_batches(&broker, topic);
        let end = stored.last().unwrap().header.last_offset() + 1;
        caught_up(&log, end).await;
        let epochs: std::collections::BTreeSet<i32> = stored
            .iter()
            .map(|b| b.header.partition_leader_epoch)
            .collect();
        assert_eq!(epochs.len(), 2, "two leader epochs: {epochs:?}");
        assert!(
            stored.iter().any(|b| b.header.is_control()),
            "markers are copied too"
        );
        assert_eq!(log.bytes(), concat(&stored), "byte for byte");
        // The high watermark reaches the leader's with the next answer.
        let deadline = std::time::Instant::now() + CATCH_UP;
        while *log.high_watermark.borrow() != end {
            assert!(std::time::Instant::now() < deadline, "follower HW");
            glommio::timer::sleep(Duration::from_millis(20)).await;
        }
        let stats = fetcher.stats();
        assert!(stats.reconnects >= 1, "{stats:?}");
        assert_eq!((stats.truncations, stats.restarts), (0, 0), "{stats:?}");
        assert!(log.errors.borrow().is_empty());
        fetcher.stop();
        task.await;
    });
}

/// A follower that led epoch 1 and wrote three batches no one else has,
/// while the leader went from epoch 0 to epoch 2: the leader answers that
/// epoch 0 ends at offset 3, the follower truncates its own batches there
/// and copies the leader's, ending byte for byte equal.
#[test]
fn a_diverged_follower_truncates_to_where_it_agrees_with_the_leader() {
    on_executor(|| async {
        let mut broker = Broker::start(BrokerOpts::default().cores(1));
        let topic = "replica-diverged";
        create_topic(&broker.bootstrap(), topic, 1, &[]);
        produce_plain(&broker, topic, 3);
        // Two restarts with nothing between them: epoch 1 holds no data.
        for _ in 0..2 {
            broker.stop();
            broker.restart();
        }
        produce_plain(&broker, topic, 2);
        let stored = leader_batches(&broker, topic);
        assert_eq!(
            stored
                .iter()
                .map(|b| b.header.partition_leader_epoch)
                .collect::<Vec<_>>(),
            vec![0, 0, 0, 2, 2]
        );

        let log = Rc::new(MemoryLog::default());
        log.push(&concat(&stored[..3]));
        for offset in 3..6 {
            let mut b = BytesMut::from(&one_batch(&format!("mine{offset}"))[..]);
            batch::set_base_offset(&mut b, offset);
            batch::set_partition_leader_epoch(&mut b, 1);
            log.push(&b);
        }
        assert_eq!(log.log_end(), 6);
        let fetcher = follower(&broker, topic, &log);
        let task = glommio::spawn_local(fetcher.clone().run());
        caught_up(&log, 5).await;
        let deadline = std::time::Instant::now() + CATCH_UP;
        while log.bytes() != concat(&stored) {
            assert!(std::time::Instant::now() < deadline, "the follower's bytes");
            glommio::timer::sleep(Duration::from_millis(20)).await;
        }
        let stats = fetcher.stats();
        assert_eq!(stats.truncations, 1, "{stats:?}");
        assert_eq!(
            log.epochs
                .borrow()
                .entries()
                .iter()
                .map(|e| (e.epoch, e.start_offset))
                .collect::<Vec<_>>(),
            vec![(0, 0), (2, 3)]
        );
        fetcher.stop();
        task.await;
    });
}

/// The leader deleted records the empty follower still needs
/// (DeleteRecords up to offset 3): the fetch is out of range, the fetcher
/// asks the leader where its log starts, and the follower starts again
/// there and copies the rest.
#[test]
fn a_follower_below_the_leaders_log_start_starts_again_there() {
    use kafka_protocol::messages::delete_records_request::{
        DeleteRecordsPartition, DeleteRecordsTopic,
    };
    use kafka_protocol::messages::DeleteRecordsRequest;
    on_executor(|| async {
        let broker = Broker::start(BrokerOpts::default().cores(1));
        let topic = "replica-log-start";
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

        let log = Rc::new(MemoryLog::default());
        let fetcher = follower(&broker, topic, &log);
        let task = glommio::spawn_local(fetcher.clone().run());
        caught_up(&log, 5).await;
        assert_eq!(*log.log_start.borrow(), 3);
        let stored = leader_batches(&broker, topic);
        assert_eq!(log.bytes(), concat(&stored[3..]));
        assert_eq!(fetcher.stats().restarts, 1);
        fetcher.stop();
        task.await;
    });
}
