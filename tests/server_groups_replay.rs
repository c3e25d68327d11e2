//! The group coordinator over a real `__consumer_offsets` partition log,
//! without a network: committed offsets and transactional offsets are
//! rebuilt by replaying the log (honouring COMMIT/ABORT markers). The log
//! cleaner bounds the topic: `server_log_cleaner.rs`.

mod log_util;

use fjord::config::ServeArgs;
use fjord::group::error::GroupError;
use fjord::group::state::{CommittedOffset, GroupConfig};
use fjord::group::GroupCoordinator;
use fjord::log::{LogConfig, LogManager, PartitionLog, TailCache};
use fjord::metadata::internal::INTERNAL_TOPIC_PARTITIONS;
use fjord::metadata::TopicConfig;
use fjord::partition::coordinator_log::{CoordinatorLog, CoordinatorWriteError};
use fjord::partition::Partition;
use fjord::record::builder::control_batch;
use fjord::record::records::ControlType;
use fjord::types::{Offset, TopicPartition};
use futures::future::{FutureExt, LocalBoxFuture};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

const GROUP: &str = "replay-group";

fn offset(o: i64) -> CommittedOffset {
    CommittedOffset {
        offset: o,
        leader_epoch: -1,
        metadata: format!("m{o}"),
        // Now: a fixed date in the past would be older than the offsets'
        // retention, and the coordinator's expiry task (which may run while
        // a test runs) would drop the commits.
        commit_timestamp_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_millis() as i64,
        expire_timestamp_ms: None,
    }
}

/// The partition of `GROUP` over `log`, its producer state recovered.
async fn partition(log: Rc<fjord::log::PartitionLog>) -> Rc<Partition> {
    let tp = log.topic_partition().clone();
    let config = TopicConfig::resolve(
        &BTreeMap::new(),
        &ServeArgs::default().resolve().expect("default settings"),
    );
    Partition::open(tp, [0; 16], log, config, 1_000)
        .await
        .expect("recovered")
}

/// The offsets partition of `GROUP` (of 50).
fn group_partition() -> i32 {
    fjord::metadata::internal::coordinator_partition(GROUP, INTERNAL_TOPIC_PARTITIONS)
}

/// The coordinator's shard in these tests: the one offsets partition, of
/// one replica; a write is acknowledged once it is written.
struct OneReplica(Rc<Partition>);

impl CoordinatorLog for OneReplica {
    fn leads(&self, _: &TopicPartition) -> bool {
        true
    }

    fn writable(&self, _: &TopicPartition) -> Result<Rc<Partition>, CoordinatorWriteError> {
        Ok(self.0.clone())
    }

    fn acked<'a>(
        &'a self,
        _: &'a TopicPartition,
        log: &'a Rc<PartitionLog>,
        last: Offset,
    ) -> LocalBoxFuture<'a, Result<(), CoordinatorWriteError>> {
        async move {
            log.wait_written(last)
                .await
                .map_err(|e| CoordinatorWriteError::Storage(e.to_string()))
        }
        .boxed_local()
    }
}

async fn loaded(log: Rc<PartitionLog>) -> Rc<GroupCoordinator> {
    let state = partition(log).await;
    // The coordinator holds its shard weakly; the shard lives as long as
    // the test's process.
    let shard: Rc<dyn CoordinatorLog> = Rc::new(OneReplica(state.clone()));
    let coord = GroupCoordinator::new(
        GroupConfig::default(),
        fjord::group::consumer::ConsumerGroupConfig::default(),
        Rc::downgrade(&shard),
    );
    std::mem::forget(shard);
    coord.load_partition(group_partition(), INTERNAL_TOPIC_PARTITIONS, state, -1);
    for _ in 0..500 {
        match coord.check(GROUP) {
            Err(GroupError::LoadInProgress) => {
                glommio::timer::sleep(Duration::from_millis(10)).await
            }
            other => {
                other.expect("loaded");
                return coord;
            }
        }
    }
    panic!("partition never loaded");
}

/// (topic, partition) → offset, or "unstable".
fn fetch(coord: &GroupCoordinator, require_stable: bool) -> Vec<(String, i32, Option<i64>)> {
    let wanted = (0..4).map(|p| ("t".to_string(), p)).collect();
    coord
        .fetch_offsets(GROUP, Some(wanted), require_stable)
        .expect("fetch")
        .into_iter()
        .map(|(t, p, r)| (t, p, r.map(|o| o.map(|o| o.offset)).unwrap_or(Some(-99))))
        .collect()
}

#[test]
fn replay_rebuilds_offsets_and_honours_transaction_markers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_path_buf();
    log_util::run(data.clone(), move || async move {
        let mgr = LogManager::new_for_shard(data, TailCache::new(1 << 20), 0);
        let p = group_partition();
        let tp = TopicPartition::new("__consumer_offsets", p);
        let log = mgr.open(&tp, LogConfig::default()).await.expect("open");
        let coord = loaded(log.clone()).await;
        // A plain commit (simple consumer: generation -1), two transactional
        // ones (producers 7 and 8) and one left open (producer 9).
        coord
            .commit_offsets(
                GROUP,
                "",
                None,
                -1,
                vec![("t".into(), 0, offset(10))],
                GroupError::IllegalGeneration,
            )
            .await
            .expect("commit");
        for (pid, part, o) in [(7, 1, 11), (8, 2, 12), (9, 3, 13)] {
            coord
                .txn_commit_offsets(
                    GROUP,
                    pid,
                    0,
                    "",
                    None,
                    -1,
                    vec![("t".into(), part, offset(o))],
                    false,
                )
                .await
                .expect("txn commit");
        }
        assert_eq!(
            fetch(&coord, true),
            vec![
                ("t".into(), 0, Some(10)),
                ("t".into(), 1, Some(-99)),
                ("t".into(), 2, Some(-99)),
                ("t".into(), 3, Some(-99)),
            ],
            "pending transactional offsets are unstable"
        );
        // The transaction code writes markers, then tells the coordinator.
        for (pid, kind) in [(7, ControlType::Commit), (8, ControlType::Abort)] {
            let info = log
                .append(control_batch(kind, pid, 1, 0, 1_700_000_000_100))
                .expect("marker");
            log.wait_written(info.last_offset).await.expect("written");
            coord.complete_transaction(p, pid, kind == ControlType::Commit);
        }
        let expected = vec![
            ("t".into(), 0, Some(10)),
            ("t".into(), 1, Some(11)),
            ("t".into(), 2, None),
            ("t".into(), 3, None),
        ];
        assert_eq!(fetch(&coord, false), expected);

        // A fresh coordinator replaying the same log sees the same state,
        // with producer 9's offsets still pending.
        let again = loaded(log.clone()).await;
        assert_eq!(fetch(&again, false), expected);
        assert_eq!(fetch(&again, true)[3], ("t".into(), 3, Some(-99)));
        again.complete_transaction(p, 9, true);
        assert_eq!(fetch(&again, false)[3], ("t".into(), 3, Some(13)));
        mgr.shutdown().await.expect("shutdown");
    });
}
