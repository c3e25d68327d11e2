//! Property test: append/read round trips of random batch sizes read back
//! every offset, through the tail cache and through the file.

mod log_util;

use fjord::log::{LogConfig, LogManager, TailCache, PREALLOCATE_DEFAULT_BYTES};
use fjord::types::{Offset, TopicPartition};
use log_util::*;
use proptest::prelude::*;

/// Random batch sizes as (records, value bytes).
type Sizes = Vec<(usize, usize)>;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn every_offset_reads_back_its_batch(
        sizes in prop::collection::vec((1usize..8, 0usize..3000), 1..60),
        chunk_pages in 1usize..6,
        cache_bytes in prop::sample::select(vec![0usize, 3000, 1 << 20]),
        segment_bytes in prop::sample::select(vec![6000u64, 1 << 30]),
        // fsync-acks logs also pre-zero the space ahead of their data;
        // small writes go through the page cache unless direct_writes.
        fsync_acks in any::<bool>(),
        direct_writes in any::<bool>(),
        // Switch to the other sync mode after this many batches, and with
        // `switch_direct` to the other write mode too: direct and page-cache
        // writes of one file must agree.
        switch_after in prop::option::of(0usize..60),
        switch_direct in any::<bool>(),
    ) {
        let switch = switch_after.map(|at| (at, switch_direct));
        let modes = Modes { fsync_acks, direct_writes, preallocate_bytes: PREALLOCATE_DEFAULT_BYTES };
        round_trip(sizes, chunk_pages, cache_bytes, segment_bytes, modes, switch);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]
    /// Batches many staging chunks long, mixed with small ones: a large
    /// batch is staged in larger chunks (several sizes), a small one in
    /// `write_chunk_bytes` chunks, and every byte must land where it belongs.
    /// Batches of 270-360 KB are staged with non-temporal stores
    /// (`STREAM_COPY_MIN_BYTES`, 256 KiB).
    #[test]
    fn large_batches_read_back(
        sizes in prop::collection::vec(
            prop_oneof![
                (1usize..4, 3000usize..60_000),
                (3usize..4, 90_000usize..120_000),
                (1usize..8, 0usize..3000),
            ],
            1..30,
        ),
        chunk_pages in 1usize..6,
        segment_bytes in prop::sample::select(vec![300_000u64, 1 << 30]),
        fsync_acks in any::<bool>(),
        direct_writes in any::<bool>(),
        // Small preallocation steps (as internal topics use): the file
        // grows by many fallocates, between data and pre-zeroing writes.
        preallocate_bytes in prop::sample::select(vec![64u64 << 10, PREALLOCATE_DEFAULT_BYTES]),
    ) {
        let modes = Modes { fsync_acks, direct_writes, preallocate_bytes };
        round_trip(sizes, chunk_pages, 0, segment_bytes, modes, None);
    }
}

/// How the log under test writes.
struct Modes {
    fsync_acks: bool,
    direct_writes: bool,
    preallocate_bytes: u64,
}

/// Appends `sizes` batches (waiting for some of them), reads every offset
/// back, then reopens the log and reads every offset again.
fn round_trip(
    sizes: Sizes,
    chunk_pages: usize,
    cache_bytes: usize,
    segment_bytes: u64,
    modes: Modes,
    switch: Option<(usize, bool)>,
) {
    let Modes {
        fsync_acks,
        direct_writes,
        preallocate_bytes,
    } = modes;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    run(data.clone(), move || async move {
        let mgr = LogManager::new_for_shard(data.clone(), TailCache::new(cache_bytes), 0);
        let config = LogConfig {
            write_chunk_bytes: chunk_pages * 4096,
            segment_bytes,
            index_interval_bytes: 1000,
            fsync_acks,
            direct_writes,
            preallocate_bytes,
            ..LogConfig::default()
        };
        let tp = TopicPartition::new("p", 0);
        let log = mgr.open(&tp, config.clone()).await.unwrap();
        let mut expect = Vec::new(); // (base, last, bytes as stored)
        for (i, (n, v)) in sizes.iter().enumerate() {
            if let Some((_, switch_direct)) = switch.filter(|&(at, _)| at == i) {
                log.set_config(LogConfig {
                    fsync_acks: !fsync_acks,
                    direct_writes: direct_writes != switch_direct,
                    ..config.clone()
                });
            }
            let b = sized_batch(*n, *v, i as i64);
            let info = log.append(b.clone()).unwrap();
            let mut stored = b.to_vec();
            fjord::record::batch::set_base_offset(&mut stored, info.base_offset.0);
            fjord::record::batch::set_partition_leader_epoch(&mut stored, 0);
            expect.push((info.base_offset.0, info.last_offset.0, stored));
            // Interleave waits so some writes rewrite partial pages.
            if i % 7 == 3 {
                log.wait_written(info.last_offset).await.unwrap();
            }
        }
        let end = log.log_end_offset();
        log.wait_written(Offset(end.0 - 1)).await.unwrap();
        let one_segment = segment_bytes >= 1 << 30;
        let check = |log: std::rc::Rc<fjord::log::PartitionLog>,
                     expect: Vec<(i64, i64, Vec<u8>)>| async move {
            for (base, last, bytes) in &expect {
                for off in *base..=*last {
                    let r = log.read(Offset(off), 1, Offset(end.0)).await.unwrap();
                    assert_eq!(&chunk_bytes(&r), bytes, "offset {off}");
                }
            }
            // Longer reads, some below the log end: whole batches from the
            // one holding the offset, all below `upper`, within `max_bytes`
            // (at least one). In one segment that is exactly what the model
            // takes; across segments a read may stop at a segment's end.
            for (base, _, _) in &expect {
                for max_bytes in [5_000usize, 40_000, 1 << 20] {
                    for upper in [end.0, (base + end.0) / 2 + 1] {
                        let mut model = Vec::new();
                        for (_, l, b) in expect.iter().filter(|(_, l, _)| l >= base) {
                            if *l >= upper
                                || (!model.is_empty() && model.len() + b.len() > max_bytes)
                            {
                                break;
                            }
                            model.extend_from_slice(b);
                        }
                        let r = log
                            .read(Offset(*base), max_bytes, Offset(upper))
                            .await
                            .unwrap();
                        let got = chunk_bytes(&r);
                        let what = format!("from {base}, max {max_bytes}, upper {upper}");
                        if one_segment {
                            assert!(
                                got == model,
                                "{what}: {} bytes, model {}",
                                got.len(),
                                model.len()
                            );
                        } else {
                            assert!(model.starts_with(&got), "{what}: not a prefix of the model");
                            assert_eq!(got.is_empty(), model.is_empty(), "{what}");
                            // Whole batches only (batch_offsets asserts it).
                            batch_offsets(&got);
                        }
                    }
                }
            }
            // A consumer reading on from where each read ended: after the
            // first read, the reads are sequential and come partly from the
            // read-ahead. Every batch arrives once, in order.
            for max_bytes in [5_000usize, 40_000] {
                let mut got = Vec::new();
                let mut from = expect.first().map_or(0, |e| e.0);
                while from < end.0 {
                    let r = log
                        .read(Offset(from), max_bytes, Offset(end.0))
                        .await
                        .unwrap();
                    let bytes = chunk_bytes(&r);
                    let offsets = batch_offsets(&bytes);
                    let Some(last) = offsets.last() else {
                        panic!("no batch at {from} below {}", end.0)
                    };
                    from = last.1 + 1;
                    got.extend_from_slice(&bytes);
                }
                let all: Vec<u8> = expect.iter().flat_map(|e| e.2.clone()).collect();
                assert!(got == all, "sequential reads of {max_bytes} bytes");
            }
        };
        check(log.clone(), expect.clone()).await;
        mgr.shutdown().await.unwrap();
        let mgr = LogManager::new_for_shard(data, TailCache::new(cache_bytes), 0);
        let log = mgr.open(&tp, config).await.unwrap();
        assert_eq!(log.log_end_offset(), end);
        check(log, expect).await;
        mgr.shutdown().await.unwrap();
    });
}
