//! `LogManager::shutdown`: it stops the background loop before it closes any
//! log, and no checkpoint is written after its final one, even when that one
//! failed.

mod log_util;

use fjord::log::{LogConfig, LogManager, TailCache};
use fjord::types::TopicPartition;
use log_util::*;
use std::time::Duration;

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[test]
fn shutdown_waits_for_the_background_loop() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    run(data.clone(), move || async move {
        let mgr = LogManager::new_for_shard(data.clone(), TailCache::new(1 << 20), 0);
        let tp = TopicPartition::new("bg", 0);
        // segment.ms of 1 ms: every tick of the loop rolls a non-empty
        // active segment, so the loop is seen working before the shutdown.
        let config = LogConfig {
            segment_ms: 1,
            ..LogConfig::default()
        };
        let log = mgr.open(&tp, config).await.unwrap();
        let last = log
            .append(sized_batch(3, 100, now_ms()))
            .unwrap()
            .last_offset;
        log.wait_written(last).await.unwrap();
        let tq = glommio::executor().create_task_queue(
            glommio::Shares::Static(100),
            glommio::Latency::NotImportant,
            "background",
        );
        mgr.start_background(tq);
        assert!(mgr.background_running());
        // Generous: the loop ticks every second.
        for _ in 0..100 {
            if log.segment_count() > 1 {
                break;
            }
            glommio::timer::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            log.segment_count() > 1,
            "the background loop rolled nothing"
        );
        mgr.shutdown().await.unwrap();
        assert!(
            !mgr.background_running(),
            "shutdown returned while the background loop still ran"
        );
    });
}

#[test]
fn no_checkpoint_after_a_failed_final_one() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    run(data.clone(), move || async move {
        let mgr = LogManager::new_for_shard(data.clone(), TailCache::new(1 << 20), 0);
        let tp = TopicPartition::new("ckpt", 0);
        let log = mgr.open(&tp, LogConfig::default()).await.unwrap();
        let last = log
            .append(sized_batch(3, 100, now_ms()))
            .unwrap()
            .last_offset;
        log.wait_written(last).await.unwrap();
        let file = data.join("recovery-point-offset-checkpoint.shard-0");
        assert!(!file.exists());
        // A directory where the checkpoint's temporary file goes: creating
        // the file fails, so the final checkpoint does.
        let tmp = data.join("recovery-point-offset-checkpoint.shard-0.tmp");
        std::fs::create_dir(&tmp).unwrap();
        assert!(mgr.shutdown().await.is_err());
        std::fs::remove_dir(&tmp).unwrap();
        // A later checkpoint (DeleteTopics', the loop's) writes nothing now.
        mgr.checkpoint().await.unwrap();
        assert!(
            !file.exists(),
            "a checkpoint was written after the final one"
        );
    });
}
