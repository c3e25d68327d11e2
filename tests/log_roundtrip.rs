//! Append/read round trips, offsets, index and time-index lookups, reopen.

mod log_util;

use fjord::log::{LogConfig, LogError, LogManager, TailCache};
use fjord::types::{Offset, TopicPartition};
use log_util::*;

#[test]
fn append_assigns_offsets_and_reads_back_from_cache_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    run(data.clone(), move || async move {
        // Tiny cache: most reads must come from the file.
        let mgr = LogManager::new_for_shard(data.clone(), TailCache::new(10_000), 0);
        let tp = TopicPartition::new("t", 0);
        let log = mgr.open(&tp, LogConfig::default()).await.unwrap();
        let mut last = Offset(0);
        for i in 0..200 {
            let info = log
                .append(sized_batch(3, 100 + i, 1000 + i as i64))
                .unwrap();
            assert_eq!(info.base_offset, Offset(3 * i as i64));
            assert_eq!(info.last_offset, Offset(3 * i as i64 + 2));
            last = info.last_offset;
        }
        assert_eq!(log.log_end_offset().0, 600);
        log.wait_written(last).await.unwrap();
        assert_eq!(log.high_watermark().0, 600);
        // Every offset reads back as the batch containing it, whole.
        for off in 0..600i64 {
            let r = log.read(Offset(off), 1, Offset(600)).await.unwrap();
            let b = batch_offsets(&chunk_bytes(&r));
            assert_eq!(b.len(), 1, "offset {off}");
            assert!(b[0].0 <= off && off <= b[0].1, "offset {off} in {:?}", b[0]);
        }
        // max_bytes limits but never splits.
        let r = log.read(Offset(0), 2000, Offset(600)).await.unwrap();
        let b = batch_offsets(&chunk_bytes(&r));
        assert!(b.len() > 1 && r.bytes <= 2000);
        // upper is exclusive.
        let r = log.read(Offset(0), 1 << 20, Offset(6)).await.unwrap();
        assert_eq!(batch_offsets(&chunk_bytes(&r)), vec![(0, 2), (3, 5)]);
        let r = log.read(Offset(600), 1 << 20, Offset(600)).await.unwrap();
        assert!(r.chunks.is_empty());
        assert!(matches!(
            log.read(Offset(601), 100, Offset(600)).await,
            Err(LogError::OffsetOutOfRange { .. })
        ));
        // Time lookup: record timestamps are 1000+i .. 1000+i+2 for batch i.
        let (o, ts) = log.offset_for_timestamp(1050).await.unwrap().unwrap();
        assert_eq!(ts, 1050);
        assert!(o.0 >= 3 * 48 && o.0 <= 3 * 50, "{o:?}");
        assert!(log.offset_for_timestamp(5000).await.unwrap().is_none());
        assert_eq!(log.max_timestamp(), Some((1000 + 199 + 2, Offset(599))));
        mgr.shutdown().await.unwrap();

        // Reopen: same offsets, same bytes.
        let mgr = LogManager::new_for_shard(data.clone(), TailCache::new(10_000), 0);
        let log = mgr.open(&tp, LogConfig::default()).await.unwrap();
        assert_eq!(log.log_end_offset().0, 600);
        let r = log.read(Offset(300), 1, Offset(600)).await.unwrap();
        assert_eq!(batch_offsets(&chunk_bytes(&r)), vec![(300, 302)]);
        let info = log.append(sized_batch(1, 10, 5000)).unwrap();
        assert_eq!(info.base_offset, Offset(600));
        log.wait_written(info.last_offset).await.unwrap();
        let mut seen = 0;
        log.scan(Offset(0), &mut |h, bytes| {
            assert_eq!(bytes.len(), h.total_size());
            seen += 1;
        })
        .await
        .unwrap();
        assert_eq!(seen, 201);
        mgr.shutdown().await.unwrap();
    });
    // The file on disk is exactly the batches (ftruncate restored the length).
    let seg = dir.path().join("t-0/00000000000000000000.log");
    let bytes = std::fs::read(seg).unwrap();
    let offs = batch_offsets(&bytes);
    assert_eq!(offs.len(), 201);
    assert_eq!(offs.last(), Some(&(600, 600)));
    let idx = std::fs::read(dir.path().join("t-0/00000000000000000000.index")).unwrap();
    assert!(!idx.is_empty() && idx.len() % 8 == 0);
}
