//! The follower's log primitives (`log::replica`, `log::truncate`):
//! appends of the leader's batches unchanged at the leader's offsets,
//! leader epochs started at run time, truncation, and the high watermark
//! set from outside (docs/replication.md §4.1).

mod log_util;

use bytes::BytesMut;
use fjord::log::{LogConfig, LogError, LogManager, PartitionLog, TailCache};
use fjord::record::batch::{set_base_offset, set_partition_leader_epoch};
use fjord::record::BatchIter;
use fjord::types::{Offset, TopicPartition};
use log_util::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::rc::Rc;

fn tp() -> TopicPartition {
    TopicPartition::new("r", 0)
}

/// Small segments, so that a few dozen batches span several.
fn small_segments(fsync_acks: bool, direct_writes: bool) -> LogConfig {
    LogConfig {
        segment_bytes: 4096,
        preallocate_bytes: 64 * 1024,
        index_interval_bytes: 512,
        fsync_acks,
        direct_writes,
        ..LogConfig::default()
    }
}

/// Every batch of `log` from `from` to its end, as the bytes a fetch
/// returns (one `BytesMut` per batch).
async fn read_batches(log: &PartitionLog, from: i64) -> Vec<BytesMut> {
    let end = log.log_end_offset().0;
    let mut out = Vec::new();
    let mut next = from;
    while next < end {
        let r = log.read(Offset(next), 1 << 20, Offset(end)).await.unwrap();
        let bytes = chunk_bytes(&r);
        let mut it = BatchIter::new(&bytes);
        let mut pos = 0usize;
        for (_, h) in it.by_ref() {
            out.push(BytesMut::from(&bytes[pos..pos + h.total_size()]));
            pos += h.total_size();
            next = h.last_offset() + 1;
        }
        assert!(it.error().is_none());
    }
    out
}

/// The `.log` files of a partition directory: name → bytes.
fn segment_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

/// The header fields of the batch at the start of `b`.
fn header(b: &[u8]) -> fjord::record::BatchHeader {
    fjord::record::BatchHeader::parse(b).unwrap()
}

/// Leader appends in epochs 0, 3 and 7 across several segments; the
/// follower appends the batches read back from the leader's log. Both
/// logs then hold byte-identical segment files (offsets, epochs, CRCs and
/// timestamps untouched), the same epoch cache, and the same checkpoint;
/// and that holds after a reopen. Run with the page cache and with
/// direct writes under `--fsync-acks`.
#[test]
fn a_replica_holds_the_leaders_bytes_at_the_leaders_offsets() {
    for (fsync, direct) in [(false, false), (true, true)] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().to_path_buf();
        run(data.clone(), move || async move {
            let cfg = small_segments(fsync, direct);
            let lm = LogManager::new_for_shard(data.join("leader"), TailCache::new(1 << 20), 0);
            let fm = LogManager::new_for_shard(data.join("follower"), TailCache::new(1 << 20), 0);
            let leader = lm.open(&tp(), cfg.clone()).await.unwrap();
            let follower = fm.open(&tp(), cfg.clone()).await.unwrap();
            for (epoch, n) in [(0, 10), (3, 15), (7, 12)] {
                if epoch > 0 {
                    leader.become_leader(epoch).unwrap();
                }
                for i in 0..n {
                    leader
                        .append(sized_batch(1 + i % 3, 100 + 7 * i, 1_000 + i as i64))
                        .unwrap();
                }
            }
            let end = leader.log_end_offset();
            leader.wait_acked(Offset(end.0 - 1), fsync).await.unwrap();
            assert!(leader.segment_count() > 2, "several segments");
            let batches = read_batches(&leader, 0).await;
            for b in batches {
                let (base, epoch) = (header(&b).base_offset, header(&b).partition_leader_epoch);
                let cap = b.len();
                let info = follower.append_replica(b.freeze(), cap).unwrap();
                assert_eq!(info.base_offset.0, base);
                assert_eq!(follower.epoch_for_offset(Offset(base)), epoch);
            }
            assert_eq!(follower.log_end_offset(), end);
            follower.wait_acked(Offset(end.0 - 1), fsync).await.unwrap();
            assert_eq!(follower.high_watermark().0, end.0);
            assert_eq!(follower.epoch_entries(), leader.epoch_entries());
            assert_eq!(follower.epoch_entries().len(), 3);
            assert_eq!(
                follower.segment_base_offsets(),
                leader.segment_base_offsets()
            );
            // Fetches from the follower return the leader's bytes.
            let from_leader = read_batches(&leader, 0).await;
            let from_follower = read_batches(&follower, 0).await;
            assert_eq!(from_leader, from_follower);
            lm.shutdown().await.unwrap();
            fm.shutdown().await.unwrap();
            let (l, f) = (data.join("leader/r-0"), data.join("follower/r-0"));
            assert_eq!(segment_files(&l), segment_files(&f));
            assert_eq!(
                std::fs::read(l.join("leader-epoch-checkpoint")).unwrap(),
                std::fs::read(f.join("leader-epoch-checkpoint")).unwrap()
            );
            // Reopened (with the broker's first epoch in its config), the
            // follower keeps the newer epochs its batches carry.
            let fm = LogManager::new_for_shard(data.join("follower"), TailCache::new(1 << 20), 0);
            let follower = fm.open(&tp(), cfg).await.unwrap();
            assert_eq!(follower.log_end_offset(), end);
            assert_eq!(follower.epoch_entries().len(), 3);
            assert_eq!(follower.leader_epoch(), 7);
            fm.shutdown().await.unwrap();
        });
    }
}

/// A batch below the log end, in an older epoch, or with a bad CRC is
/// refused with a typed error and nothing is written; a gap (a compacted
/// leader's) is accepted.
#[test]
fn a_replica_append_refuses_what_does_not_continue_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    run(data.clone(), move || async move {
        let m = LogManager::new_for_shard(data, TailCache::new(1 << 20), 0);
        let log = m.open(&tp(), small_segments(false, false)).await.unwrap();
        let leader_batch = |base: i64, epoch: i32, n: usize| {
            let mut b = sized_batch(n, 50, 1_000);
            set_base_offset(&mut b, base);
            set_partition_leader_epoch(&mut b, epoch);
            b
        };
        let replica = |b: BytesMut| {
            let cap = b.len();
            log.append_replica(b.freeze(), cap)
        };
        replica(leader_batch(0, 2, 3)).unwrap();
        assert_eq!(log.epoch_entries(), vec![(2, 0)]);
        // Below the log end: refused, nothing written.
        let e = replica(leader_batch(2, 2, 3)).unwrap_err();
        assert!(
            matches!(
                e,
                LogError::OffsetBelowLogEnd {
                    base: 2,
                    log_end: 3
                }
            ),
            "{e}"
        );
        assert_eq!(log.log_end_offset().0, 3);
        // An older epoch than the latest: refused.
        let e = replica(leader_batch(3, 1, 1)).unwrap_err();
        assert!(
            matches!(
                e,
                LogError::StaleLeaderEpoch {
                    epoch: 1,
                    latest: 2
                }
            ),
            "{e}"
        );
        // A corrupt batch (CRC): refused.
        let mut bad = leader_batch(3, 2, 1);
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        assert!(matches!(replica(bad), Err(LogError::InvalidBatch(_))));
        assert_eq!(log.log_end_offset().0, 3);
        // A gap, as a compacted leader log has: accepted at its offsets.
        let info = replica(leader_batch(10, 4, 2)).unwrap();
        assert_eq!((info.base_offset.0, info.last_offset.0), (10, 11));
        assert_eq!(log.log_end_offset().0, 12);
        assert_eq!(log.epoch_entries(), vec![(2, 0), (4, 10)]);
        // A leader append of this log now would stamp an epoch older than
        // its batches': refused until it becomes leader again.
        assert!(matches!(
            log.append(sized_batch(1, 10, 1)),
            Err(LogError::StaleLeaderEpoch { .. })
        ));
        log.become_leader(5).unwrap();
        let info = log.append(sized_batch(1, 10, 1)).unwrap();
        assert_eq!(info.base_offset.0, 12);
        log.wait_written(info.last_offset).await.unwrap();
        let b = read_batches(&log, 12).await;
        assert_eq!(header(&b[0]).partition_leader_epoch, 5);
        m.shutdown().await.unwrap();
    });
}

/// `become_leader(E)` starts E at the log end, in the cache and the
/// checkpoint, and later appends stamp it; an E not above the latest is
/// refused; the epoch survives a reopen whose config names an older one.
#[test]
fn becoming_leader_starts_the_epoch_at_the_log_end() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    run(data.clone(), move || async move {
        let m = LogManager::new_for_shard(data.clone(), TailCache::new(1 << 20), 0);
        let log = m.open(&tp(), small_segments(false, false)).await.unwrap();
        let info = log.append(sized_batch(4, 10, 1)).unwrap();
        assert_eq!(log.leader_epoch(), 0);
        log.become_leader(6).unwrap();
        assert_eq!(log.leader_epoch(), 6);
        assert_eq!(log.epoch_entries(), vec![(0, 0), (6, 4)]);
        let on_disk = std::fs::read_to_string(data.join("r-0/leader-epoch-checkpoint")).unwrap();
        assert_eq!(on_disk, "0\n2\n0 0\n6 4\n");
        for e in [6, 5, -1] {
            assert!(
                matches!(log.become_leader(e), Err(LogError::StaleLeaderEpoch { .. })),
                "epoch {e}"
            );
        }
        let second = log.append(sized_batch(2, 10, 1)).unwrap();
        log.wait_written(second.last_offset).await.unwrap();
        let b = read_batches(&log, 0).await;
        assert_eq!(header(&b[0]).partition_leader_epoch, 0);
        assert_eq!(header(&b[1]).partition_leader_epoch, 6);
        assert_eq!(log.end_offset_for_epoch(0), (0, 4));
        assert_eq!(info.base_offset.0, 0);
        m.shutdown().await.unwrap();
        let m = LogManager::new_for_shard(data.clone(), TailCache::new(1 << 20), 0);
        let log = m.open(&tp(), small_segments(false, false)).await.unwrap();
        assert_eq!(log.leader_epoch(), 6);
        assert_eq!(log.epoch_entries(), vec![(0, 0), (6, 4)]);
        m.shutdown().await.unwrap();
    });
}

/// Appends `n` batches of 1-3 records in `epoch` (becoming its leader
/// first unless it is the log's epoch), waiting for them to be written.
async fn fill(log: &Rc<PartitionLog>, epoch: i32, n: usize, tag: usize) {
    if log.leader_epoch() != epoch {
        log.become_leader(epoch).unwrap();
    }
    let mut last = None;
    for i in 0..n {
        let info = log
            .append(sized_batch(1 + i % 3, 60 + tag + i, 10_000 + i as i64))
            .unwrap();
        last = Some(info.last_offset);
    }
    if let Some(last) = last {
        log.wait_written(last).await.unwrap();
    }
}

/// Truncation cuts at the start of the batch holding the offset: later
/// segments deleted, the cut segment and its indexes cut, the epochs from
/// the cut dropped (cache and checkpoint), HW and max timestamp lowered,
/// the tail cache dropping what was cut (a read after new appends at the
/// same offsets returns the new batches); the same log reopens.
/// Run with the page cache and with direct writes under `--fsync-acks`.
#[test]
fn truncation_cuts_at_a_batch_and_the_log_continues_from_there() {
    for (fsync, direct) in [(false, false), (true, true)] {
        truncation_case(small_segments(fsync, direct));
    }
}

fn truncation_case(cfg: LogConfig) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    run(data.clone(), move || async move {
        let m = LogManager::new_for_shard(data.clone(), TailCache::new(1 << 20), 0);
        let log = m.open(&tp(), cfg.clone()).await.unwrap();
        fill(&log, 0, 20, 0).await;
        fill(&log, 2, 20, 1).await;
        fill(&log, 4, 20, 2).await;
        let before = read_batches(&log, 0).await;
        let segments_before = log.segment_base_offsets();
        assert!(segments_before.len() >= 4);
        // A cut inside a batch of epoch 2, in an earlier segment.
        let epoch2_start = log.epoch_entries()[1].1;
        let target_batch = before
            .iter()
            .map(|b| header(b))
            .find(|h| h.base_offset > epoch2_start + 5 && h.last_offset() > h.base_offset)
            .unwrap();
        let end = log
            .truncate_to(Offset(target_batch.base_offset + 1))
            .await
            .unwrap();
        assert_eq!(end.0, target_batch.base_offset);
        assert_eq!(log.log_end_offset(), end);
        assert_eq!(log.high_watermark().0, end.0);
        assert_eq!(log.written_offset().0, end.0);
        assert!(log.durable_offset().0 <= end.0);
        assert_eq!(log.epoch_entries(), vec![(0, 0), (2, epoch2_start)]);
        let on_disk = std::fs::read_to_string(data.join("r-0/leader-epoch-checkpoint")).unwrap();
        assert_eq!(on_disk, format!("0\n2\n0 0\n2 {epoch2_start}\n"));
        // The shard's recovery point was checkpointed at or below the cut.
        let rp =
            std::fs::read_to_string(data.join("recovery-point-offset-checkpoint.shard-0")).unwrap();
        let rp: i64 = rp
            .lines()
            .find_map(|l| l.strip_prefix("r 0 "))
            .unwrap()
            .parse()
            .unwrap();
        assert!(rp <= end.0, "recovery point {rp} past the new end {end:?}");
        let kept: Vec<BytesMut> = before
            .iter()
            .filter(|b| header(b).base_offset < end.0)
            .cloned()
            .collect();
        assert_eq!(read_batches(&log, 0).await, kept);
        assert!(log.segment_count() < segments_before.len());
        assert!(*log.segment_base_offsets().last().unwrap() <= end.0);
        let max_ts = log.max_timestamp().unwrap();
        assert!(max_ts.1 .0 < end.0);
        // Truncating at or past the end changes nothing.
        assert_eq!(log.truncate_to(Offset(end.0 + 100)).await.unwrap(), end);
        // The log goes on from the cut, in the leader's epoch (4 again,
        // started at the new end), and reads return the new batches.
        fill(&log, 4, 12, 9).await;
        assert_eq!(log.epoch_entries()[2], (4, end.0));
        let after = read_batches(&log, 0).await;
        assert_eq!(&after[..kept.len()], &kept[..]);
        for b in &after[kept.len()..] {
            assert_eq!(header(b).partition_leader_epoch, 4);
        }
        assert_ne!(after, before);
        let end_after = log.log_end_offset();
        m.shutdown().await.unwrap();
        let m = LogManager::new_for_shard(data.clone(), TailCache::new(1 << 20), 0);
        let log = m.open(&tp(), cfg).await.unwrap();
        assert_eq!(log.log_end_offset(), end_after);
        assert_eq!(read_batches(&log, 0).await, after);
        m.shutdown().await.unwrap();
    });
}

/// A truncation at the log end cuts no batch but drops an epoch the node
/// began as leader and appended nothing in (Kafka's `truncateTo`), in the
/// cache and in its checkpoint, so a follower can take its new leader's
/// batches of the older epoch there; an epoch with batches stays.
#[test]
fn truncation_at_the_log_end_drops_an_empty_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    run(data.clone(), move || async move {
        let m = LogManager::new_for_shard(data.clone(), TailCache::new(1 << 20), 0);
        let log = m.open(&tp(), small_segments(true, true)).await.unwrap();
        fill(&log, 1, 5, 0).await;
        let end = log.log_end_offset();
        log.become_leader(2).unwrap();
        assert_eq!(log.epoch_entries(), vec![(1, 0), (2, end.0)]);
        assert_eq!(log.latest_epoch(), Some(2));
        assert_eq!(log.truncate_to(Offset(end.0)).await.unwrap(), end);
        assert_eq!(log.epoch_entries(), vec![(1, 0)]);
        assert_eq!(log.latest_epoch(), Some(1));
        let on_disk = std::fs::read_to_string(data.join("r-0/leader-epoch-checkpoint")).unwrap();
        assert_eq!(on_disk, "0\n1\n1 0\n");
        // Past the end: the same; the epoch with batches stays.
        assert_eq!(log.truncate_to(Offset(end.0 + 10)).await.unwrap(), end);
        assert_eq!(log.epoch_entries(), vec![(1, 0)]);
        // The new leader's batches of epoch 1 continue the log.
        let mut b = sized_batch(2, 70, 20_000);
        set_base_offset(&mut b, end.0);
        set_partition_leader_epoch(&mut b, 1);
        let cap = b.len();
        log.append_replica(b.freeze(), cap).unwrap();
        log.wait_written(Offset(end.0 + 1)).await.unwrap();
        assert_eq!(log.log_end_offset().0, end.0 + 2);
        m.shutdown().await.unwrap();
    });
}

/// A waiter for an offset a truncation cut away is never told it is
/// written, even once new batches fill that offset again.
#[test]
fn a_waiter_for_a_truncated_offset_is_not_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    run(data.clone(), move || async move {
        let m = LogManager::new_for_shard(data, TailCache::new(1 << 20), 0);
        let log = m.open(&tp(), small_segments(false, false)).await.unwrap();
        fill(&log, 0, 5, 0).await;
        let end = log.log_end_offset().0;
        // Waits for offset end + 2 (not appended yet), and for one kept.
        let l = log.clone();
        let cut = glommio::spawn_local(async move { l.wait_written(Offset(end + 2)).await });
        let l = log.clone();
        let kept = glommio::spawn_local(async move { l.wait_durable(Offset(0)).await });
        glommio::timer::sleep(std::time::Duration::from_millis(5)).await;
        let new_end = log.truncate_to(Offset(end - 3)).await.unwrap();
        fill(&log, 0, 10, 1).await;
        assert!(log.written_offset().0 > end + 2 && new_end.0 < end);
        assert!(matches!(
            cut.await,
            Err(LogError::Truncated { offset, .. }) if offset == end + 2
        ));
        kept.await.unwrap();
        m.shutdown().await.unwrap();
    });
}

/// The HW set from outside: never above what is written (durable under
/// `--fsync-acks`), never backwards, `wait_for_hw_above` follows it, and
/// a truncation lowers it.
#[test]
fn a_replicated_high_watermark_is_set_from_outside() {
    for fsync in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().to_path_buf();
        run(data.clone(), move || async move {
            let m = LogManager::new_for_shard(data, TailCache::new(1 << 20), 0);
            let log = m.open(&tp(), small_segments(fsync, false)).await.unwrap();
            assert!(!log.is_replicated());
            assert_eq!(log.set_high_watermark(Offset(0)).0, 0);
            assert!(log.is_replicated());
            fill(&log, 0, 10, 0).await;
            let end = log.log_end_offset().0;
            log.wait_acked(Offset(end - 1), fsync).await.unwrap();
            // Written, but the leader said nothing: the HW stays.
            assert_eq!(log.high_watermark().0, 0);
            assert_eq!(log.set_high_watermark(Offset(5)).0, 5);
            // Never above what is acknowledged here, never backwards.
            assert_eq!(log.set_high_watermark(Offset(end + 50)).0, end);
            assert_eq!(log.set_high_watermark(Offset(3)).0, end);
            // A fetch waiting above the HW resolves when new batches are
            // acknowledged up to the bound set before.
            let l = log.clone();
            let waiter = glommio::spawn_local(async move {
                l.wait_for_hw_above(Offset(end)).await;
                l.high_watermark().0
            });
            fill(&log, 0, 3, 1).await;
            let end2 = log.log_end_offset().0;
            log.wait_acked(Offset(end2 - 1), fsync).await.unwrap();
            let hw = waiter.await;
            assert!(hw > end && hw <= end + 50, "{hw}");
            // The LSO follows the HW.
            assert_eq!(log.last_stable_offset().0, log.high_watermark().0);
            // Truncation lowers it with the log end.
            let cut = log.truncate_to(Offset(end - 4)).await.unwrap();
            assert_eq!(log.high_watermark().0, cut.0);
            assert_eq!(log.high_watermark_bound(), Some(Offset(cut.0)));
            m.shutdown().await.unwrap();
        });
    }
}

/// `truncate_fully_and_start_at`: the log empty from the new offset, no
/// epoch; replica appends go on there; the same log reopens.
#[test]
fn truncating_fully_restarts_the_log_at_an_offset() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    run(data.clone(), move || async move {
        let m = LogManager::new_for_shard(data.clone(), TailCache::new(1 << 20), 0);
        let log = m.open(&tp(), small_segments(false, false)).await.unwrap();
        fill(&log, 0, 30, 0).await;
        // A reader polling meanwhile never sees the start past the end.
        let watching = Rc::new(std::cell::Cell::new(true));
        let watcher = glommio::spawn_local({
            let (log, watching) = (log.clone(), watching.clone());
            async move {
                let mut seen = 0;
                while watching.get() {
                    assert!(log.log_start_offset().0 <= log.log_end_offset().0);
                    seen += 1;
                    glommio::executor().yield_task_queue_now().await;
                }
                seen
            }
        });
        let end = log.truncate_fully_and_start_at(Offset(500)).await.unwrap();
        watching.set(false);
        assert!(watcher.await > 1, "the reader ran during the truncation");
        assert_eq!(end.0, 500);
        assert_eq!(log.log_start_offset().0, 500);
        assert_eq!(log.segment_base_offsets(), vec![500]);
        assert!(log.epoch_entries().is_empty());
        assert_eq!(log.high_watermark().0, 500);
        let mut b = sized_batch(2, 10, 1);
        set_base_offset(&mut b, 500);
        set_partition_leader_epoch(&mut b, 9);
        let cap = b.len();
        let info = log.append_replica(b.freeze(), cap).unwrap();
        log.wait_written(info.last_offset).await.unwrap();
        assert_eq!(log.epoch_entries(), vec![(9, 500)]);
        m.shutdown().await.unwrap();
        let m = LogManager::new_for_shard(data.clone(), TailCache::new(1 << 20), 0);
        let log = m.open(&tp(), small_segments(false, false)).await.unwrap();
        assert_eq!(log.log_start_offset().0, 500);
        assert_eq!(log.log_end_offset().0, 502);
        assert_eq!(log.epoch_entries(), vec![(9, 500)]);
        m.shutdown().await.unwrap();
    });
}

/// Copies a partition directory (a state a crash could leave).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// The states a kill -9 in the middle of a truncation can leave recover
/// to a consistent log, a prefix of the old one at least as long as the
/// target: later segments partly deleted (newest first); segments deleted
/// and the cut done but the epoch checkpoint not yet rewritten. Also a
/// crash (no close) right after a truncation.
#[test]
fn a_crash_in_a_truncation_leaves_a_log_that_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    let d = data.clone();
    run(data.clone(), move || async move {
        let data = d;
        let src = data.join("src");
        let m = LogManager::new_for_shard(src.clone(), TailCache::new(1 << 20), 0);
        let log = m.open(&tp(), small_segments(false, false)).await.unwrap();
        fill(&log, 0, 60, 0).await;
        fill(&log, 3, 30, 1).await;
        let all = read_batches(&log, 0).await;
        let bases = log.segment_base_offsets();
        let old_epochs = std::fs::read(src.join("r-0/leader-epoch-checkpoint")).unwrap();
        let target = bases[1] + 1;
        let epoch3_start = log.epoch_entries()[1].1;
        assert!(epoch3_start > target + 3, "epoch 3 starts after the cut");
        m.shutdown().await.unwrap();

        // 1. Only the newest segment deleted so far.
        let s1 = data.join("s1");
        copy_dir(&src.join("r-0"), &s1.join("r-0"));
        let newest = *bases.last().unwrap();
        for ext in ["log", "index", "timeindex"] {
            let _ = std::fs::remove_file(s1.join(format!("r-0/{newest:020}.{ext}")));
        }
        let m = LogManager::new_for_shard(s1.clone(), TailCache::new(1 << 20), 0);
        let log = m.open(&tp(), small_segments(false, false)).await.unwrap();
        assert_eq!(log.log_end_offset().0, newest);
        let got = read_batches(&log, 0).await;
        assert_eq!(&all[..got.len()], &got[..]);
        assert_eq!(log.end_offset_for_epoch(3).1, newest);
        // ... and the next truncation finishes the job.
        let end = log.truncate_to(Offset(target)).await.unwrap();
        assert!(end.0 <= target);
        m.shutdown().await.unwrap();

        // 2. Truncated, but the old checkpoint (epoch 3 past the end).
        let s2 = data.join("s2");
        copy_dir(&src.join("r-0"), &s2.join("r-0"));
        let m = LogManager::new_for_shard(s2.clone(), TailCache::new(1 << 20), 0);
        let log = m.open(&tp(), small_segments(false, false)).await.unwrap();
        let end = log.truncate_to(Offset(target)).await.unwrap();
        assert_eq!(log.epoch_entries(), vec![(0, 0)]);
        m.shutdown().await.unwrap();
        std::fs::write(s2.join("r-0/leader-epoch-checkpoint"), &old_epochs).unwrap();
        let m = LogManager::new_for_shard(s2.clone(), TailCache::new(1 << 20), 0);
        let log = m.open(&tp(), small_segments(false, false)).await.unwrap();
        assert_eq!(log.log_end_offset(), end);
        assert_eq!(log.epoch_entries(), vec![(0, 0)]);
        let got = read_batches(&log, 0).await;
        assert_eq!(&all[..got.len()], &got[..]);
        m.shutdown().await.unwrap();
    });

    // 3. A crash (the executor ends without closing) right after a
    // truncation and new appends.
    let s3 = data.join("s3");
    copy_dir(&data.join("src/r-0"), &s3.join("r-0"));
    let d = s3.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    run(d.clone(), move || async move {
        let m = LogManager::new_for_shard(d, TailCache::new(1 << 20), 0);
        let log = m.open(&tp(), small_segments(false, false)).await.unwrap();
        let end = log.truncate_to(Offset(30)).await.unwrap();
        fill(&log, 5, 4, 3).await;
        tx.send((
            end.0,
            log.log_end_offset().0,
            read_batches(&log, 0).await.len(),
        ))
        .unwrap();
        // No shutdown: the files stay as they are, as after kill -9.
        drop(log);
        drop(m);
    });
    let (cut, end, batches) = rx.recv().unwrap();
    let d = s3.clone();
    run(d.clone(), move || async move {
        let m = LogManager::new_for_shard(d, TailCache::new(1 << 20), 0);
        let log = m.open(&tp(), small_segments(false, false)).await.unwrap();
        assert_eq!(log.log_end_offset().0, end);
        assert_eq!(read_batches(&log, 0).await.len(), batches);
        assert_eq!(log.epoch_entries().last(), Some(&(5, cut)));
        m.shutdown().await.unwrap();
    });
}

/// (base, last offset) of every batch a read bounded by the HW returns,
/// from the log start on: what a consumer can see.
async fn visible_batches(log: &PartitionLog) -> Vec<(i64, i64)> {
    let hw = log.high_watermark().0;
    let mut out = Vec::new();
    let mut next = log.log_start_offset().0;
    while next < hw {
        let r = log.read(Offset(next), 1 << 20, Offset(hw)).await.unwrap();
        let got = batch_offsets(&chunk_bytes(&r));
        let Some(&(_, last)) = got.last() else { break };
        out.extend(got);
        next = last + 1;
    }
    out
}

/// This shard's `replication-offset-checkpoint` as (topic, partition,
/// offset) lines.
fn hw_checkpoint_text(data: &Path) -> String {
    std::fs::read_to_string(data.join("replication-offset-checkpoint.shard-0")).unwrap()
}

/// A replicated log's high watermark survives a restart through
/// `replication-offset-checkpoint` (issue 30): with the HW at N below the
/// log end, checkpointed, and the process killed (no close), the reopened
/// log switched with the checkpointed HW has HW N, not its log end, and
/// reads bounded by it stop at N. A checkpoint written before the switch
/// keeps N; an unchanged HW is not written again. A truncation below the
/// checkpointed HW lowers it, on disk too. A log never switched (one
/// replica) has no entry and its HW stays its log end. A checkpointed HW
/// past the log end (an unsynced tail lost) is capped by it; a corrupt
/// file is ignored (HW 0).
#[test]
fn a_replicated_high_watermark_survives_a_restart_through_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    let single = TopicPartition::new("single", 0);
    let (tx, rx) = std::sync::mpsc::channel();
    let (d, s) = (data.clone(), single.clone());
    run(data.clone(), move || async move {
        let m = LogManager::new_for_shard(d.clone(), TailCache::new(1 << 20), 0);
        let log = m.open(&tp(), small_segments(false, false)).await.unwrap();
        let one = m.open(&s, small_segments(false, false)).await.unwrap();
        fill(&one, 0, 5, 0).await;
        assert_eq!(m.checkpointed_high_watermark(&tp()), None);
        assert_eq!(log.start_replicated_at(Offset(0)).0, 0);
        fill(&log, 0, 12, 0).await;
        let n = log.log_end_offset().0;
        fill(&log, 0, 12, 1).await;
        let end = log.log_end_offset().0;
        assert!(n > 0 && n < end);
        assert_eq!(log.set_high_watermark(Offset(n)).0, n);
        assert!(m.checkpoint_high_watermarks().await.unwrap());
        assert!(!m.checkpoint_high_watermarks().await.unwrap(), "unchanged");
        assert_eq!(hw_checkpoint_text(&d), format!("0\n1\nr 0 {n}\n"));
        tx.send((n, end, one.log_end_offset().0)).unwrap();
        // No shutdown: the files stay as they are, as after kill -9.
        drop((log, one));
        drop(m);
    });
    let (n, end, single_end) = rx.recv().unwrap();

    let (d, s) = (data.clone(), single.clone());
    let (tx, rx) = std::sync::mpsc::channel();
    run(data.clone(), move || async move {
        let m = LogManager::new_for_shard(d.clone(), TailCache::new(1 << 20), 0);
        let log = m.open(&tp(), small_segments(false, false)).await.unwrap();
        let one = m.open(&s, small_segments(false, false)).await.unwrap();
        assert_eq!(log.log_end_offset().0, end);
        // Before the switch the HW is derived locally: everything written.
        assert_eq!(log.high_watermark().0, end);
        // A checkpoint between the open and the switch keeps N.
        m.checkpoint().await.unwrap();
        assert_eq!(hw_checkpoint_text(&d), format!("0\n1\nr 0 {n}\n"));
        let cp = m.checkpointed_high_watermark(&tp());
        assert_eq!(cp, Some(Offset(n)));
        assert_eq!(log.start_replicated_at(cp.unwrap()).0, n);
        assert_eq!(log.high_watermark().0, n);
        // A second switch changes nothing.
        assert_eq!(log.start_replicated_at(Offset(end)).0, n);
        let seen = visible_batches(&log).await;
        assert_eq!(seen.first().map(|b| b.0), Some(0));
        assert_eq!(seen.last().map(|b| b.1), Some(n - 1));
        // The one-replica log: no entry, HW its log end as before.
        assert_eq!(m.checkpointed_high_watermark(&s), None);
        assert!(!one.is_replicated());
        assert_eq!(one.high_watermark().0, single_end);
        // A truncation below the checkpointed HW lowers it, on disk too
        // (a truncation checkpoints before it returns).
        let cut = log.truncate_to(Offset(n - 3)).await.unwrap().0;
        assert!(cut < n);
        assert_eq!(log.high_watermark().0, cut);
        assert_eq!(hw_checkpoint_text(&d), format!("0\n1\nr 0 {cut}\n"));
        // The leader raises it again.
        assert_eq!(log.set_high_watermark(Offset(cut + 100)).0, cut);
        m.shutdown().await.unwrap();
        tx.send(cut).unwrap();
    });
    let cut = rx.recv().unwrap();

    let d = data.clone();
    run(data.clone(), move || async move {
        let m = LogManager::new_for_shard(d.clone(), TailCache::new(1 << 20), 0);
        let log = m.open(&tp(), small_segments(false, false)).await.unwrap();
        assert_eq!(log.log_end_offset().0, cut);
        assert_eq!(m.checkpointed_high_watermark(&tp()), Some(Offset(cut)));
        m.shutdown().await.unwrap();
        // A checkpointed HW past the log end is capped by it.
        let f = d.join("replication-offset-checkpoint.shard-0");
        std::fs::write(&f, format!("0\n1\nr 0 {}\n", cut + 1000)).unwrap();
        let m = LogManager::new_for_shard(d.clone(), TailCache::new(1 << 20), 0);
        let log = m.open(&tp(), small_segments(false, false)).await.unwrap();
        let cp = m.checkpointed_high_watermark(&tp()).unwrap();
        assert_eq!(log.start_replicated_at(cp).0, cut);
        m.shutdown().await.unwrap();
        // A corrupt file is ignored: no HW, the log starts at 0.
        std::fs::write(&f, "0\n5\nr 0 x\n").unwrap();
        let m = LogManager::new_for_shard(d.clone(), TailCache::new(1 << 20), 0);
        let log = m.open(&tp(), small_segments(false, false)).await.unwrap();
        let cp = m.checkpointed_high_watermark(&tp());
        assert_eq!(cp, None);
        assert_eq!(log.start_replicated_at(cp.unwrap_or(Offset(0))).0, 0);
        assert!(visible_batches(&log).await.is_empty());
        m.shutdown().await.unwrap();
    });
}
