//! A child process appending is killed with SIGKILL; after recovery every
//! batch whose append had completed (been acknowledged on the child's
//! stdout) is present and intact. Three modes: `--fsync-acks` (acknowledged
//! after an fdatasync; small writes through the page cache), the same with
//! `--direct-writes` (every write O_DIRECT), and Kafka's default
//! (acknowledged once written, here through the page cache, which outlives
//! the process).
//!
//! The test binary re-executes itself: with `FJORD_LOG_SIGKILL_CHILD=<dir>`
//! the `child_appender` test becomes the child; without it, it does nothing.

mod log_util;

use fjord::log::{LogConfig, LogManager, TailCache};
use fjord::types::{Offset, TopicPartition};
use log_util::*;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

const CHILD_ENV: &str = "FJORD_LOG_SIGKILL_CHILD";
/// `fsync`, `fsync-direct` or `page-cache`: what the child's appends wait
/// for, and how they are written.
const MODE_ENV: &str = "FJORD_LOG_SIGKILL_MODE";
const PRODUCERS: usize = 4;
const ACKS_BEFORE_KILL: usize = 400;

/// Batch `i`: 1-3 records whose values encode `i`, so content is checkable.
fn nth_batch(i: u64) -> bytes::BytesMut {
    let n = 1 + (i % 3) as usize;
    let values: Vec<Vec<u8>> = (0..n)
        .map(|r| format!("batch-{i}-rec-{r}-{}", "x".repeat((i % 700) as usize)).into_bytes())
        .collect();
    batch(&values, i as i64)
}

#[test]
fn child_appender() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let data = std::path::PathBuf::from(dir);
    let mode = std::env::var(MODE_ENV).unwrap_or_default();
    let fsync = mode.starts_with("fsync");
    let direct = mode == "fsync-direct";
    run(data.clone(), move || async move {
        let mgr = LogManager::new_for_shard(data, TailCache::new(1 << 20), 0);
        let config = LogConfig {
            fsync_acks: fsync,
            direct_writes: direct,
            segment_bytes: 256 << 10,
            ..LogConfig::default()
        };
        assert_eq!(config.page_cache_writes(), !direct);
        let log = mgr
            .open(&TopicPartition::new("k", 0), config)
            .await
            .unwrap();
        let next = std::rc::Rc::new(std::cell::Cell::new(0u64));
        let tasks: Vec<_> = (0..PRODUCERS)
            .map(|_| {
                let (log, next) = (log.clone(), next.clone());
                glommio::spawn_local(async move {
                    loop {
                        let i = next.get();
                        next.set(i + 1);
                        let info = log.append(nth_batch(i)).unwrap();
                        if fsync {
                            log.wait_durable(info.last_offset).await.unwrap();
                        } else {
                            log.wait_written(info.last_offset).await.unwrap();
                        }
                        let mut out = std::io::stdout().lock();
                        writeln!(out, "ACK {i} {} {}", info.base_offset.0, info.last_offset.0)
                            .unwrap();
                        out.flush().unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await;
        }
    });
}

#[test]
fn sigkill_during_fsync_acked_appends_loses_no_acknowledged_batch() {
    sigkill_during_appends_loses_no_acknowledged_batch("fsync");
}

#[test]
fn sigkill_during_fsync_acked_direct_appends_loses_no_acknowledged_batch() {
    sigkill_during_appends_loses_no_acknowledged_batch("fsync-direct");
}

#[test]
fn sigkill_during_page_cache_appends_loses_no_acknowledged_batch() {
    sigkill_during_appends_loses_no_acknowledged_batch("page-cache");
}

fn sigkill_during_appends_loses_no_acknowledged_batch(mode: &str) {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            "child_appender",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, dir.path())
        .env(MODE_ENV, mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut acked: Vec<(u64, i64, i64)> = Vec::new();
    let mut lines = BufReader::new(stdout).lines();
    while acked.len() < ACKS_BEFORE_KILL {
        let Some(Ok(line)) = lines.next() else { break };
        if let Some(rest) = line.strip_prefix("ACK ") {
            let v: Vec<i64> = rest.split(' ').map(|x| x.parse().unwrap()).collect();
            acked.push((v[0] as u64, v[1], v[2]));
        }
    }
    // SIGKILL while the producers are still appending.
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    for line in lines.map_while(Result::ok) {
        if let Some(rest) = line.strip_prefix("ACK ") {
            let v: Vec<i64> = rest.split(' ').map(|x| x.parse().unwrap()).collect();
            acked.push((v[0] as u64, v[1], v[2]));
        }
    }
    child.wait().unwrap();
    assert!(
        acked.len() >= ACKS_BEFORE_KILL,
        "child acknowledged {} batches",
        acked.len()
    );

    let data = dir.path().to_path_buf();
    run(data.clone(), move || async move {
        let mgr = LogManager::new_for_shard(data, TailCache::new(1 << 20), 0);
        let log = mgr
            .open(&TopicPartition::new("k", 0), LogConfig::default())
            .await
            .unwrap();
        let max_acked = acked.iter().map(|a| a.2).max().unwrap();
        assert!(log.log_end_offset().0 > max_acked);
        for (i, base, last) in &acked {
            let r = log
                .read(Offset(*base), 1, Offset(log.high_watermark().0))
                .await
                .unwrap();
            let got = chunk_bytes(&r);
            let h = fjord::record::batch::validate(&got).unwrap();
            assert_eq!(
                (h.base_offset, h.last_offset()),
                (*base, *last),
                "batch {i}"
            );
            let mut want = nth_batch(*i).to_vec();
            fjord::record::batch::set_base_offset(&mut want, *base);
            fjord::record::batch::set_partition_leader_epoch(&mut want, 0);
            assert_eq!(got, want, "batch {i} content");
        }
        mgr.shutdown().await.unwrap();
    });
}
