//! Append throughput of the partition log against a raw sequential O_DIRECT
//! write of the same bytes (the physical limit), for 1 KiB and 16 KiB
//! batches, with direct writes without fsync and with group-commit fsync
//! (16 batches per fdatasync); and the page-cache writes of a log that never
//! syncs (`_pagecache`, no raw counterpart: the device writes come later
//! from the kernel). Run: `cargo bench --bench log_append`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fjord::log::{LogConfig, LogManager, TailCache};
use fjord::types::{Offset, TopicPartition};
use glommio::io::OpenOptions;
use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Bytes appended per criterion iteration: 8 MiB.
const ITERATION_BYTES: usize = 8 << 20;
/// Batches per fdatasync in the group-commit variants.
const GROUP_COMMIT_BATCHES: usize = 16;
/// The raw writer wraps around after this many bytes to bound disk use: 256 MiB.
const RAW_FILE_BYTES: u64 = 256 << 20;
/// Raw writes of `RAW_WRITE_BYTES` in flight at once.
const RAW_WRITES_IN_FLIGHT: usize = 8;
/// Raw write size: the log's default staging chunk, 16 KiB.
const RAW_WRITE_BYTES: usize = 16 << 10;

fn varint(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    loop {
        if z < 0x80 {
            out.push(z as u8);
            return;
        }
        out.push((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
}

/// A valid one-record v2 batch of exactly `total_bytes`.
fn make_batch(total_bytes: usize) -> bytes::BytesMut {
    let build = |value_len: usize| {
        let mut rec = vec![0u8, 0, 0, 1];
        varint(&mut rec, value_len as i64);
        rec.extend(std::iter::repeat_n(0xabu8, value_len));
        rec.push(0);
        let mut b = Vec::with_capacity(total_bytes);
        b.extend_from_slice(&0i64.to_be_bytes());
        b.extend_from_slice(&0i32.to_be_bytes());
        b.extend_from_slice(&(-1i32).to_be_bytes());
        b.push(2);
        b.extend_from_slice(&0u32.to_be_bytes());
        b.extend_from_slice(&0i16.to_be_bytes());
        b.extend_from_slice(&0i32.to_be_bytes());
        b.extend_from_slice(&0i64.to_be_bytes());
        b.extend_from_slice(&0i64.to_be_bytes());
        b.extend_from_slice(&(-1i64).to_be_bytes());
        b.extend_from_slice(&(-1i16).to_be_bytes());
        b.extend_from_slice(&(-1i32).to_be_bytes());
        b.extend_from_slice(&1i32.to_be_bytes());
        varint(&mut b, rec.len() as i64);
        b.extend_from_slice(&rec);
        b
    };
    let mut value_len = total_bytes - 61 - 8;
    let mut b = build(value_len);
    while b.len() > total_bytes {
        value_len -= 1;
        b = build(value_len);
    }
    let len = (b.len() - 12) as i32;
    b[8..12].copy_from_slice(&len.to_be_bytes());
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    bytes::BytesMut::from(&b[..])
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir_in(std::env::var("FJORD_BENCH_DIR").unwrap_or_else(|_| ".".into()))
        .expect("bench tempdir");
    let data = dir.path().to_path_buf();
    let io_memory = fjord::runtime::io_memory_for_budget(1, 4 << 20);
    let ex = fjord::runtime::executor_builder(0, None, io_memory)
        .make()
        .expect("executor");
    let (mgr, raw) = ex.run({
        let data = data.clone();
        async move {
            fjord::runtime::probe_dma(&data).await.expect("probe");
            let mgr = LogManager::new_for_shard(data.clone(), TailCache::new(64 << 20), 0);
            let raw = Rc::new(
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .dma_open(data.join("raw.bin"))
                    .await
                    .expect("raw file"),
            );
            raw.pre_allocate(RAW_FILE_BYTES, false)
                .await
                .expect("fallocate");
            (mgr, raw)
        }
    });
    let raw_pos = Rc::new(Cell::new(0u64));
    let mut group = c.benchmark_group("log_append");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(6));
    group.throughput(Throughput::Bytes(ITERATION_BYTES as u64));
    for &batch_bytes in &[1024usize, 16 * 1024] {
        // (fsync, direct): direct writes without fsync, group commit (always
        // direct), and page-cache writes (no raw counterpart).
        for &(fsync, direct) in &[(false, true), (true, false), (false, false)] {
            let label = format!(
                "{}KiB{}",
                batch_bytes / 1024,
                match (fsync, direct) {
                    (true, _) => "_fsync16",
                    (false, true) => "",
                    (false, false) => "_pagecache",
                }
            );
            let tp = TopicPartition::new(format!("b{batch_bytes}{fsync}{direct}"), 0);
            let config = LogConfig {
                fsync_acks: fsync,
                direct_writes: direct,
                segment_bytes: 64 << 20,
                retention_bytes: 128 << 20,
                retention_ms: -1,
                ..LogConfig::default()
            };
            let log = ex.run(mgr.open(&tp, config)).expect("open");
            let template = make_batch(batch_bytes);
            assert_eq!(template.len(), batch_bytes);
            let batches = ITERATION_BYTES / batch_bytes;
            group.bench_function(BenchmarkId::new("fjord", &label), |b| {
                b.iter_custom(|iters| {
                    let (log, template, mgr) = (log.clone(), template.clone(), mgr.clone());
                    ex.run(async move {
                        let mut total = Duration::ZERO;
                        for _ in 0..iters {
                            let t = Instant::now();
                            let mut last = Offset(0);
                            for i in 0..batches {
                                last = log.append(template.clone()).expect("append").last_offset;
                                if fsync && (i + 1) % GROUP_COMMIT_BATCHES == 0 {
                                    log.wait_durable(last).await.expect("durable");
                                }
                            }
                            if fsync {
                                log.wait_durable(last).await.expect("durable");
                            } else {
                                log.wait_written(last).await.expect("written");
                            }
                            total += t.elapsed();
                            mgr.run_retention_once().await.expect("retention");
                        }
                        total
                    })
                })
            });
            if !fsync && !direct {
                continue;
            }
            group.bench_function(BenchmarkId::new("raw_odirect", &label), |b| {
                b.iter_custom(|iters| {
                    let (raw, raw_pos) = (raw.clone(), raw_pos.clone());
                    ex.run(async move {
                        let mut total = Duration::ZERO;
                        for _ in 0..iters {
                            let t = Instant::now();
                            let mut done = 0usize;
                            let mut since_sync = 0usize;
                            // With fsync, never more bytes in flight than one group commit covers.
                            let in_flight = if fsync {
                                (GROUP_COMMIT_BATCHES * batch_bytes / RAW_WRITE_BYTES)
                                    .clamp(1, RAW_WRITES_IN_FLIGHT)
                            } else {
                                RAW_WRITES_IN_FLIGHT
                            };
                            while done < ITERATION_BYTES {
                                let mut writes = Vec::with_capacity(RAW_WRITES_IN_FLIGHT);
                                while writes.len() < in_flight && done < ITERATION_BYTES {
                                    let mut buf = raw.alloc_dma_buffer(RAW_WRITE_BYTES);
                                    buf.as_bytes_mut().fill(0xab);
                                    let mut pos = raw_pos.get();
                                    if pos + RAW_WRITE_BYTES as u64 > RAW_FILE_BYTES {
                                        pos = 0;
                                    }
                                    raw_pos.set(pos + RAW_WRITE_BYTES as u64);
                                    writes.push(raw.write_at(buf, pos));
                                    done += RAW_WRITE_BYTES;
                                    since_sync += RAW_WRITE_BYTES;
                                }
                                for w in futures::future::join_all(writes).await {
                                    w.expect("raw write");
                                }
                                // Same fsync cadence as fjord: one per 16 batches' bytes.
                                if fsync && since_sync >= GROUP_COMMIT_BATCHES * batch_bytes {
                                    raw.fdatasync().await.expect("fdatasync");
                                    since_sync = 0;
                                }
                            }
                            if fsync {
                                raw.fdatasync().await.expect("fdatasync");
                            }
                            total += t.elapsed();
                        }
                        total
                    })
                })
            });
        }
    }
    group.finish();
    ex.run(async move {
        mgr.shutdown().await.expect("shutdown");
    });
    drop(raw);
}

criterion_group!(benches, bench);
criterion_main!(benches);
