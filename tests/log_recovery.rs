//! Recovery keeps exactly the valid prefix: (a) a file truncated mid-batch,
//! (b) a flipped byte inside the CRC-covered area of the last batch, (c)
//! zeros after the last batch, (d) a deleted `.index`.

mod log_util;

use fjord::log::{LogConfig, LogManager, TailCache};
use fjord::types::{Offset, TopicPartition};
use log_util::*;
use std::path::PathBuf;

const BATCHES: usize = 40;

/// Writes BATCHES 2-record batches, shuts down cleanly; returns the segment
/// path and the byte position where the last batch starts.
fn write_log(data: PathBuf, config: LogConfig) -> (PathBuf, u64) {
    let d = data.clone();
    run(data.clone(), move || async move {
        let mgr = LogManager::new_for_shard(d, TailCache::new(1 << 20), 0);
        let log = mgr
            .open(&TopicPartition::new("r", 0), config)
            .await
            .unwrap();
        let mut last = Offset(0);
        for i in 0..BATCHES {
            last = log
                .append(sized_batch(2, 300 + i, 1_000 + i as i64))
                .unwrap()
                .last_offset;
        }
        log.wait_written(last).await.unwrap();
        mgr.shutdown().await.unwrap();
    });
    let seg = data.join("r-0/00000000000000000000.log");
    let bytes = std::fs::read(&seg).unwrap();
    let positions: Vec<usize> = fjord::record::BatchIter::new(&bytes)
        .map(|(p, _)| p)
        .collect();
    (seg, *positions.last().unwrap() as u64)
}

/// Reopens and returns (log end, batches read by scan, segment file length).
fn reopen(data: PathBuf, config: LogConfig) -> (i64, Vec<(i64, i64)>) {
    let (tx, rx) = std::sync::mpsc::channel();
    run(data.clone(), move || async move {
        let mgr = LogManager::new_for_shard(data, TailCache::new(1 << 20), 0);
        let log = mgr
            .open(&TopicPartition::new("r", 0), config)
            .await
            .unwrap();
        let mut v = Vec::new();
        log.scan(Offset(0), &mut |h, _| {
            v.push((h.base_offset, h.last_offset()))
        })
        .await
        .unwrap();
        // Every offset is readable through the index after recovery.
        for off in 0..log.log_end_offset().0 {
            let r = log
                .read(Offset(off), 1, Offset(log.high_watermark().0))
                .await
                .unwrap();
            let b = batch_offsets(&chunk_bytes(&r));
            assert!(b[0].0 <= off && off <= b[0].1);
        }
        // The log accepts appends at the recovered end.
        let end = log.log_end_offset().0;
        let info = log.append(sized_batch(1, 10, 9_999)).unwrap();
        assert_eq!(info.base_offset.0, end);
        log.wait_written(info.last_offset).await.unwrap();
        mgr.shutdown().await.unwrap();
        tx.send((end, v)).unwrap();
    });
    rx.recv().unwrap()
}

fn expected_prefix(n: usize) -> Vec<(i64, i64)> {
    (0..n as i64).map(|i| (2 * i, 2 * i + 1)).collect()
}

#[test]
fn a_truncated_mid_batch_keeps_valid_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let (seg, last_pos) = write_log(dir.path().into(), LogConfig::default());
    let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
    f.set_len(last_pos + 100).unwrap();
    drop(f);
    let (end, batches) = reopen(dir.path().into(), LogConfig::default());
    assert_eq!(end, 2 * (BATCHES as i64 - 1));
    assert_eq!(batches, expected_prefix(BATCHES - 1));
}

#[test]
fn b_flipped_byte_in_last_batch_keeps_valid_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let (seg, last_pos) = write_log(dir.path().into(), LogConfig::default());
    let mut bytes = std::fs::read(&seg).unwrap();
    let at = last_pos as usize + 70; // inside the records, CRC-covered
    bytes[at] ^= 0x5a;
    std::fs::write(&seg, &bytes).unwrap();
    let (end, batches) = reopen(dir.path().into(), LogConfig::default());
    assert_eq!(end, 2 * (BATCHES as i64 - 1));
    assert_eq!(batches, expected_prefix(BATCHES - 1));
    assert!(
        std::fs::metadata(&seg).unwrap().len() > last_pos,
        "new batch appended"
    );
}

#[test]
fn c_zeros_after_last_batch_are_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let (seg, _) = write_log(dir.path().into(), LogConfig::default());
    let len = std::fs::metadata(&seg).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
    f.set_len(len + 10_000).unwrap();
    drop(f);
    let (end, batches) = reopen(dir.path().into(), LogConfig::default());
    assert_eq!(end, 2 * BATCHES as i64);
    assert_eq!(batches, expected_prefix(BATCHES));
}

#[test]
fn d_deleted_index_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    // Small segments so the first ones are trusted (below the recovery point).
    let config = LogConfig {
        segment_bytes: 4000,
        index_interval_bytes: 500,
        ..LogConfig::default()
    };
    write_log(dir.path().into(), config.clone());
    let idx = dir.path().join("r-0/00000000000000000000.index");
    let before = std::fs::read(&idx).unwrap();
    assert!(!before.is_empty(), "the first segment has index entries");
    std::fs::remove_file(&idx).unwrap();
    // Also corrupt another segment's index: garbage is never trusted.
    let segs: Vec<_> = std::fs::read_dir(dir.path().join("r-0"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "index"))
        .collect();
    assert!(segs.len() >= 3);
    std::fs::write(&segs[1], b"garbage!").unwrap();
    let (end, batches) = reopen(dir.path().into(), config);
    assert_eq!(end, 2 * BATCHES as i64);
    assert_eq!(batches, expected_prefix(BATCHES));
    assert_eq!(std::fs::read(&idx).unwrap(), before, "rebuilt identically");
}
