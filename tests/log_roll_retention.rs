//! Segment roll (bytes, ms), retention (bytes, ms), group-commit fsync.

mod log_util;

use fjord::log::{LogConfig, LogError, LogManager, TailCache};
use fjord::types::{Offset, TopicPartition};
use log_util::*;

#[test]
fn rolls_on_bytes_and_retention_moves_log_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    run(data.clone(), move || async move {
        let mgr = LogManager::new_for_shard(data.clone(), TailCache::new(4096), 0);
        let tp = TopicPartition::new("ret", 0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let config = LogConfig {
            segment_bytes: 5000,
            retention_ms: -1,
            ..LogConfig::default()
        };
        let log = mgr.open(&tp, config.clone()).await.unwrap();
        let mut last = Offset(0);
        for i in 0..60 {
            last = log
                .append(sized_batch(1, 900, now - 10_000 + i))
                .unwrap()
                .last_offset;
        }
        log.wait_written(last).await.unwrap();
        let segs = log.segment_count();
        assert!(segs >= 10, "rolled into {segs} segments");
        for w in log.segment_base_offsets().windows(2) {
            assert!(w[1] > w[0]);
        }
        // Reads across segments (cache is tiny: file reads).
        for off in 0..60 {
            let r = log.read(Offset(off), 1, Offset(60)).await.unwrap();
            assert_eq!(batch_offsets(&chunk_bytes(&r)), vec![(off, off)]);
        }
        // Nothing to delete with retention off.
        assert_eq!(mgr.run_retention_once().await.unwrap(), 0);
        // retention.bytes: keep at most ~2 segments' worth.
        log.set_config(LogConfig {
            retention_bytes: 10_000,
            ..config.clone()
        });
        let deleted = mgr.run_retention_once().await.unwrap();
        assert!(deleted > 0);
        assert!(log.size_bytes() <= 10_000 + 5000);
        let start = log.log_start_offset().0;
        assert_eq!(start, log.segment_base_offsets()[0]);
        assert!(matches!(
            log.read(Offset(start - 1), 1, Offset(60)).await,
            Err(LogError::OffsetOutOfRange { .. })
        ));
        let text =
            std::fs::read_to_string(data.join("log-start-offset-checkpoint.shard-0")).unwrap();
        assert!(text.contains(&format!("ret 0 {start}")), "{text}");
        // retention.ms: every record is ~10 s old, so a 1 ms limit deletes
        // all but the active segment.
        log.set_config(LogConfig {
            retention_ms: 1,
            ..config.clone()
        });
        glommio::timer::sleep(std::time::Duration::from_millis(5)).await;
        mgr.run_retention_once().await.unwrap();
        assert_eq!(log.segment_count(), 1, "only the active segment is left");
        let start = log.log_start_offset().0;
        mgr.shutdown().await.unwrap();
        // The log start survives a restart.
        let mgr = LogManager::new_for_shard(data.clone(), TailCache::new(4096), 0);
        let log = mgr.open(&tp, config).await.unwrap();
        assert_eq!(log.log_start_offset().0, start);
        assert_eq!(log.log_end_offset().0, 60);
        mgr.shutdown().await.unwrap();
    });
}

#[test]
fn rolls_on_segment_ms() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    run(data.clone(), move || async move {
        let mgr = LogManager::new_for_shard(data, TailCache::new(1 << 20), 0);
        let config = LogConfig {
            segment_ms: 0,
            ..LogConfig::default()
        };
        let log = mgr
            .open(&TopicPartition::new("ms", 0), config)
            .await
            .unwrap();
        for i in 0..3 {
            log.append(sized_batch(1, 10, i)).unwrap();
            glommio::timer::sleep(std::time::Duration::from_millis(3)).await;
        }
        assert_eq!(log.segment_base_offsets(), vec![0, 1, 2]);
        mgr.shutdown().await.unwrap();
    });
}

#[test]
fn fsync_acks_group_commit_shares_fdatasync() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    run(data.clone(), move || async move {
        let mgr = LogManager::new_for_shard(data, TailCache::new(1 << 20), 0);
        let config = LogConfig {
            fsync_acks: true,
            ..LogConfig::default()
        };
        let log = mgr
            .open(&TopicPartition::new("g", 0), config)
            .await
            .unwrap();
        // 64 appends staged in one tick, then all wait for durability.
        let infos: Vec<_> = (0..64)
            .map(|i| log.append(sized_batch(2, 500, i)).unwrap())
            .collect();
        assert_eq!(log.high_watermark().0, 0, "nothing durable yet");
        let waits = infos.iter().map(|i| log.wait_durable(i.last_offset));
        for r in futures::future::join_all(waits).await {
            r.unwrap();
        }
        assert!(
            log.fsync_count() <= 2,
            "{} fdatasyncs for one tick",
            log.fsync_count()
        );
        assert_eq!(log.durable_offset().0, 128);
        assert_eq!(log.high_watermark().0, 128, "HW follows the durable offset");
        mgr.shutdown().await.unwrap();
    });
}

/// An append that arrives while the group-commit syncer's fdatasync runs
/// gets a second fdatasync at once (on a file description of its own)
/// instead of waiting for the first to end; never more than two run at once.
/// Four tasks append and wait for durability one batch after another: the
/// first append starts an fdatasync, and the others, appended before it
/// ends, start a second.
#[test]
fn fsync_acks_runs_a_second_fdatasync_while_one_runs() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    run(data.clone(), move || async move {
        let mgr = LogManager::new_for_shard(data.clone(), TailCache::new(1 << 20), 0);
        let config = LogConfig {
            fsync_acks: true,
            ..LogConfig::default()
        };
        let tp = TopicPartition::new("p", 0);
        let log = mgr.open(&tp, config.clone()).await.unwrap();
        let mut tasks = Vec::new();
        for t in 0..4 {
            let log = log.clone();
            tasks.push(glommio::spawn_local(async move {
                for i in 0..100 {
                    let info = log.append(sized_batch(1, 200, t * 1000 + i)).unwrap();
                    log.wait_durable(info.last_offset).await.unwrap();
                    assert!(log.durable_offset() > info.last_offset);
                }
            }));
        }
        for t in tasks {
            t.await;
        }
        assert_eq!(log.durable_offset().0, 400);
        assert_eq!(
            log.fsyncs_in_flight_peak(),
            2,
            "{} fdatasyncs, at most {} at once",
            log.fsync_count(),
            log.fsyncs_in_flight_peak()
        );
        mgr.shutdown().await.unwrap();
        // Everything acknowledged is there after a reopen.
        let mgr = LogManager::new_for_shard(data.clone(), TailCache::new(1 << 20), 0);
        let log = mgr.open(&tp, config).await.unwrap();
        assert_eq!(log.log_end_offset().0, 400);
        mgr.shutdown().await.unwrap();
    });
}

/// Under `--fsync-acks`, small writes go through the page cache and a
/// sealed segment is fdatasynced in the background. The durable offset (the
/// HW) must never pass a sealed segment whose fdatasync has not finished:
/// it may reach into the first such segment (the syncer's own fdatasync of
/// it, before it was sealed, covers that), never past its end. Writers that
/// only wait for the write keep filling tiny segments while others wait for
/// durability, so segments are sealed while earlier seals still sync.
///
/// The check here sees the violation only when the fdatasyncs also complete
/// out of order; the syncer's debug assertion (every seal started is synced
/// when it reads `written`) fails this test whenever the syncer would go on
/// with a seal still syncing, which a build without the fix did at once.
#[test]
fn durable_offset_never_passes_a_segment_still_syncing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    run(data.clone(), move || async move {
        let mgr = LogManager::new_for_shard(data, TailCache::new(1 << 20), 0);
        let config = LogConfig {
            fsync_acks: true,
            segment_bytes: 6000,
            ..LogConfig::default()
        };
        let log = mgr
            .open(&TopicPartition::new("s", 0), config)
            .await
            .unwrap();
        let done = std::rc::Rc::new(std::cell::Cell::new(0));
        let mut tasks = Vec::new();
        for t in 0..4 {
            let (log, done) = (log.clone(), done.clone());
            tasks.push(glommio::spawn_local(async move {
                for i in 0..200 {
                    // About 5 KB: nearly every batch starts a new segment.
                    let info = log.append(sized_batch(1, 5000, i)).unwrap();
                    if t < 2 {
                        log.wait_written(info.last_offset).await.unwrap();
                    } else {
                        log.wait_durable(info.last_offset).await.unwrap();
                    }
                }
                done.set(done.get() + 1);
            }));
        }
        // Check at every move of the durable offset (woken with the
        // appenders), and every millisecond.
        let mut checks = 0u64;
        loop {
            let rp = log.recovery_point();
            let next = log
                .segment_base_offsets()
                .into_iter()
                .find(|&b| b > rp)
                .unwrap_or(i64::MAX);
            let durable = log.durable_offset().0;
            assert!(
                durable <= next,
                "durable {durable} is past segment {next}, and the one at {rp} is not synced"
            );
            checks += 1;
            if done.get() == 4 {
                break;
            }
            let moved = log.wait_for_hw_above(Offset(durable));
            let _ = glommio::timer::timeout(std::time::Duration::from_millis(1), async {
                moved.await;
                Ok(())
            })
            .await;
        }
        for t in tasks {
            t.await;
        }
        assert!(checks > 100, "{checks} checks");
        assert!(
            log.segment_count() > 400,
            "{} segments",
            log.segment_count()
        );
        mgr.shutdown().await.unwrap();
    });
}

#[test]
fn flush_messages_syncs_without_waiters() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    run(data.clone(), move || async move {
        let mgr = LogManager::new_for_shard(data, TailCache::new(1 << 20), 0);
        let config = LogConfig {
            flush_messages: 10,
            ..LogConfig::default()
        };
        let log = mgr
            .open(&TopicPartition::new("f", 0), config)
            .await
            .unwrap();
        for i in 0..4 {
            log.append(sized_batch(3, 10, i)).unwrap();
        }
        log.wait_written(Offset(11)).await.unwrap();
        // Nobody waits on durability here, so poll; the bound is generous
        // because a loaded CI machine can delay the background fdatasync
        // far beyond its usual few milliseconds.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while log.durable_offset().0 < 10 && std::time::Instant::now() < deadline {
            glommio::timer::sleep(std::time::Duration::from_millis(2)).await;
        }
        assert!(
            log.durable_offset().0 >= 10,
            "flush.messages=10 triggered an fsync"
        );
        mgr.shutdown().await.unwrap();
    });
}

fn spare_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".spare"))
        .count()
}

/// Segments deleted by retention are kept as spare files and reused by the
/// next rolls; a log whose active segment reuses one (old bytes after the
/// logical end) recovers exactly its batches after an unclean stop.
#[test]
fn retention_recycles_segment_files_and_recovery_ignores_their_old_bytes() {
    recycles_segment_files(false, false);
}

#[test]
fn retention_recycles_segment_files_with_direct_writes() {
    recycles_segment_files(true, false);
}

/// A log that fdatasyncs pre-zeroes the space after its data, in a reused
/// spare too, whose size is rarely page aligned: the zeroing must start at
/// a page boundary (a direct write anywhere else fails with EINVAL).
#[test]
fn retention_recycles_segment_files_with_fsync_acks() {
    recycles_segment_files(false, true);
}

fn recycles_segment_files(direct_writes: bool, fsync_acks: bool) {
    use std::sync::atomic::{AtomicI64, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    let tp = TopicPartition::new("spare", 0);
    // Segments of three pages and more: a log that fdatasyncs pre-zeroes a
    // reused spare from its last whole page on, so the old bytes of the
    // pages between the new batches and that one stay for recovery to
    // ignore.
    let config = LogConfig {
        segment_bytes: 12288,
        retention_bytes: 24576,
        retention_ms: -1,
        write_chunk_bytes: 4096,
        direct_writes,
        fsync_acks,
        ..LogConfig::default()
    };
    let part_dir = data.join("spare-0");
    let end = std::sync::Arc::new(AtomicI64::new(0));
    run(data.clone(), {
        let (data, config, tp, part_dir, end) = (
            data.clone(),
            config.clone(),
            tp.clone(),
            part_dir.clone(),
            end.clone(),
        );
        move || async move {
            let mgr = LogManager::new_for_shard(data.clone(), TailCache::new(0), 0);
            let log = mgr.open(&tp, config).await.unwrap();
            let mut appended = 0i64;
            for _ in 0..2 {
                for _ in 0..45 {
                    let last = log
                        .append(sized_batch(1, 900, appended))
                        .unwrap()
                        .last_offset;
                    appended += 1;
                    if appended % 4 == 0 {
                        log.wait_written(last).await.unwrap();
                    }
                }
                log.wait_written(Offset(appended - 1)).await.unwrap();
                assert!(mgr.run_retention_once().await.unwrap() > 0);
                let spares = spare_files(&part_dir);
                assert!((1..=2).contains(&spares), "{spares} spare files");
            }
            // Roll once more (into a spare) and put two batches there.
            let segs = log.segment_count();
            let mut after_roll = 0;
            while after_roll < 2 {
                log.append(sized_batch(1, 900, appended)).unwrap();
                appended += 1;
                if log.segment_count() > segs {
                    after_roll += 1;
                }
            }
            log.wait_written(Offset(appended - 1)).await.unwrap();
            let start = log.log_start_offset().0;
            for off in start..appended {
                let r = log.read(Offset(off), 1, Offset(appended)).await.unwrap();
                assert_eq!(batch_offsets(&chunk_bytes(&r)), vec![(off, off)]);
            }
            // The active segment reuses a spare: after its two batches (and
            // the zero padding of their last page) come another segment's bytes.
            let base = *log.segment_base_offsets().last().unwrap();
            let bytes = std::fs::read(part_dir.join(format!("{base:020}.log"))).unwrap();
            let valid: usize = fjord::record::BatchIter::new(&bytes)
                .map(|(_, h)| h.total_size())
                .sum();
            assert!(
                bytes[valid..].iter().any(|&b| b != 0),
                "the active segment reuses a spare file ({} bytes, {valid} valid)",
                bytes.len()
            );
            // Stop without closing the log (no truncate to the logical
            // length), as a killed broker would.
            mgr.checkpoint().await.unwrap();
            end.store(appended, Ordering::SeqCst);
        }
    });
    let end = end.load(Ordering::SeqCst);
    run(data.clone(), move || async move {
        let mgr = LogManager::new_for_shard(data.clone(), TailCache::new(0), 0);
        let log = mgr.open(&tp, config).await.unwrap();
        assert_eq!(log.log_end_offset().0, end);
        let start = log.log_start_offset().0;
        for off in start..end {
            let r = log.read(Offset(off), 1, Offset(end)).await.unwrap();
            assert_eq!(batch_offsets(&chunk_bytes(&r)), vec![(off, off)]);
        }
        mgr.shutdown().await.unwrap();
    });
}

/// A log written through the page cache (no fsync settings) rolls over
/// several segments: more than `WRITEBACK_KICK_BYTES` is written (the writer
/// starts write-back), each sealed segment is fdatasynced in the background,
/// and a flush covers them all: `durable` reaches the log end and the
/// recovery point the active segment. Reopened, every batch reads back.
#[test]
fn page_cache_log_syncs_sealed_segments_and_reopens_whole() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    let tp = TopicPartition::new("pc", 0);
    // Segments of 1.25 × WRITEBACK_KICK_BYTES: each one kicks write-back once.
    let kick = fjord::log::WRITEBACK_KICK_BYTES;
    let config = LogConfig {
        segment_bytes: kick + kick / 4,
        ..LogConfig::default()
    };
    assert!(config.page_cache_writes());
    let total_bytes = 3 * config.segment_bytes as usize;
    run(data.clone(), move || async move {
        let mgr = LogManager::new_for_shard(data.clone(), TailCache::new(0), 0);
        let log = mgr.open(&tp, config.clone()).await.unwrap();
        let mut written = 0usize;
        let mut i = 0i64;
        let mut last = Offset(0);
        while written < total_bytes {
            let b = sized_batch(4, 3000, i);
            written += b.len();
            last = log.append(b).unwrap().last_offset;
            // Waits now and then: tail writes of partly filled chunks.
            if i % 5 == 0 {
                log.wait_written(last).await.unwrap();
            }
            i += 1;
        }
        log.wait_written(last).await.unwrap();
        let bases = log.segment_base_offsets();
        assert!(bases.len() >= 3, "segments {bases:?}");
        log.flush().await.unwrap();
        assert_eq!(log.durable_offset().0, last.0 + 1);
        assert_eq!(log.recovery_point(), *bases.last().unwrap());
        mgr.shutdown().await.unwrap();

        let mgr = LogManager::new_for_shard(data, TailCache::new(0), 0);
        let log = mgr.open(&tp, config).await.unwrap();
        assert_eq!(log.log_end_offset().0, last.0 + 1);
        for off in (0..=last.0).step_by(37) {
            let r = log.read(Offset(off), 1, Offset(last.0 + 1)).await.unwrap();
            let b = batch_offsets(&chunk_bytes(&r));
            assert_eq!(b.len(), 1, "offset {off}");
            assert!(b[0].0 <= off && off <= b[0].1, "offset {off} in {:?}", b[0]);
        }
        mgr.shutdown().await.unwrap();
    });
}

/// A page-cache log rolls (its sealed segment fdatasyncs in the
/// background), then starts syncing (`--fsync-acks`) and rolls again (a
/// direct seal): group commit still completes, and `durable` covers both.
#[test]
fn a_log_that_starts_syncing_waits_for_its_background_seals() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    run(data.clone(), move || async move {
        let mgr = LogManager::new_for_shard(data, TailCache::new(0), 0);
        let tp = TopicPartition::new("switch", 0);
        let config = LogConfig {
            segment_bytes: 16 << 10,
            ..LogConfig::default()
        };
        let log = mgr.open(&tp, config.clone()).await.unwrap();
        let mut last = Offset(0);
        for round in 0..6 {
            if round == 3 {
                log.set_config(LogConfig {
                    fsync_acks: true,
                    ..config.clone()
                });
            }
            for i in 0..40 {
                last = log.append(sized_batch(1, 900, i)).unwrap().last_offset;
            }
            log.roll();
        }
        log.wait_durable(last).await.unwrap();
        assert!(log.durable_offset().0 > last.0);
        assert!(log.segment_base_offsets().len() >= 6);
        mgr.shutdown().await.unwrap();
    });
}

/// A partition deleted and created again under the same name in one run of
/// the broker starts empty at offset 0, although the checkpoint read at
/// start-up still named the old log's start.
#[test]
fn a_partition_deleted_and_created_again_starts_at_zero() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    run(data.clone(), move || async move {
        let tp = TopicPartition::new("again", 0);
        let config = LogConfig {
            segment_bytes: 3000,
            ..LogConfig::default()
        };
        let mgr = LogManager::new_for_shard(data.clone(), TailCache::new(1 << 20), 0);
        let log = mgr.open(&tp, config.clone()).await.unwrap();
        let mut last = Offset(0);
        for i in 0..20 {
            last = log.append(sized_batch(1, 900, i)).unwrap().last_offset;
        }
        log.wait_written(last).await.unwrap();
        assert!(log.delete_segments_below(Offset(10)).unwrap() > 0);
        let start = log.log_start_offset().0;
        assert!(start > 0);
        mgr.shutdown().await.unwrap();

        let mgr = LogManager::new_for_shard(data.clone(), TailCache::new(1 << 20), 0);
        let log = mgr.open(&tp, config.clone()).await.unwrap();
        assert_eq!(log.log_start_offset().0, start, "the checkpoint is read");
        mgr.delete(&tp).await.unwrap();
        assert!(!data.join("again-0").exists());
        let log = mgr.open(&tp, config).await.unwrap();
        assert_eq!(log.log_start_offset().0, 0);
        assert_eq!(log.log_end_offset().0, 0);
        let info = log.append(sized_batch(1, 10, 0)).unwrap();
        assert_eq!(info.base_offset.0, 0);
        mgr.shutdown().await.unwrap();
    });
}

/// Under `--fsync-acks` a new segment's directory entry is made durable
/// before anything of that segment can be acknowledged: an fdatasync of the
/// file does not cover its name, and without the directory fsync a power
/// loss could take back a whole acknowledged segment. Observed through the
/// log's directory-sync seam (`dir_sync_count`, `last_dir_sync`): the
/// count rises by one at the roll, and `durable` had not reached into the
/// new segment when that fsync completed.
#[test]
fn a_roll_under_fsync_acks_syncs_the_directory_before_the_ack() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    run(data.clone(), move || async move {
        let mgr = LogManager::new_for_shard(data.clone(), TailCache::new(1 << 20), 0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let config = LogConfig {
            segment_bytes: 5000,
            fsync_acks: true,
            ..LogConfig::default()
        };
        // A new partition: its directory (and the data dir's entry for it)
        // and its first segment file are synced before `open` returns.
        let log = mgr
            .open(&TopicPartition::new("dirsync", 0), config.clone())
            .await
            .unwrap();
        assert_eq!(log.dir_sync_count(), 2, "the new directory and its parent");
        let first = log.append(sized_batch(1, 3000, now)).unwrap().last_offset;
        log.wait_durable(first).await.unwrap();
        assert_eq!(log.dir_sync_count(), 2, "no roll, no directory fsync");

        for round in 1..=3 {
            // This append rolls: a new segment starts at its base offset.
            let base = log.log_end_offset().0;
            let info = log.append(sized_batch(1, 3000, now)).unwrap();
            assert_eq!(info.base_offset.0, base);
            assert_eq!(log.segment_count(), round + 1);
            log.wait_durable(info.last_offset).await.unwrap();
            assert_eq!(log.dir_sync_count(), 2 + round as u64, "round {round}");
            let sync = log.last_dir_sync().expect("a directory fsync at the roll");
            assert_eq!(sync.segment_base, base, "round {round}");
            assert!(
                sync.durable_at <= base,
                "round {round}: the directory was synced only after offset {} of the \
                 new segment (base {base}) was durable: {sync:?}",
                sync.durable_at - 1
            );
        }

        // A log that never fdatasyncs (Kafka's default durability) skips it.
        let plain = mgr
            .open(
                &TopicPartition::new("dirsync-plain", 0),
                LogConfig {
                    segment_bytes: 5000,
                    ..LogConfig::default()
                },
            )
            .await
            .unwrap();
        for _ in 0..3 {
            let last = plain.append(sized_batch(1, 3000, now)).unwrap().last_offset;
            plain.wait_written(last).await.unwrap();
        }
        assert_eq!(plain.segment_count(), 3);
        assert_eq!(plain.dir_sync_count(), 0);
        mgr.shutdown().await.unwrap();
    });
}
