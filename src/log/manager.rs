//! The per-shard log manager: every partition log of one shard and their
//! background work.
//!
//! Owns `<data_dir>/<topic>-<partition>/` for the partitions the shard owns,
//! the shard's checkpoint files (`<name>.shard-<k>`, see `checkpoint.rs`),
//! and a background loop (retention every `retention_check_interval_ms`,
//! flush.ms and segment.ms every `BACKGROUND_TICK_MS`, checkpoints every
//! `CHECKPOINT_INTERVAL_MS`) that runs in a task queue with fewer shares
//! than request handling. Shard-local; !Send.
//!
//! Shutdown stops that loop and waits for it to leave before it closes any
//! log: a pass it is in the middle of (a segment.ms roll, a flush.ms
//! fdatasync, retention, a checkpoint) ends first, so none of them runs on
//! a log being closed, and no checkpoint of the loop's can be written after
//! the final one.
//!
//! Partition directories belong to topic ids, not names
//! (`partition_meta`): [`LogManager::open_topic`] claims the directory for
//! the topic's id, replacing one a deleted topic of the same name left
//! behind, and dropping that topic's checkpointed offsets; a deletion
//! renames the directory to a `-delete` name before it removes it.
//!
//! Checkpoint files are written on glommio's blocking thread (creating,
//! fdatasyncing and renaming them takes milliseconds, which the shard would
//! otherwise spend serving no request), one checkpoint at a time
//! (`checkpoint_lock`): two writes of one file share its temporary name, and
//! an older checkpoint must never replace a newer one (a log start moved by
//! DeleteRecords would move back). Besides the loop's, a log that was
//! truncated (`PartitionLog::truncate_to`, a follower) checkpoints through
//! its manager before appends resume (`log::truncate` says why).
//!
//! High watermarks of replicated partitions (docs/replication.md §4.3):
//! Kafka's `replication-offset-checkpoint` (`<name>.shard-<k>` here too)
//! holds the HW of each log of the shard in replicated mode
//! (`log::replica`), written by the loop every `HW_CHECKPOINT_INTERVAL_MS`
//! when it differs from the last one written, with every other checkpoint
//! (a truncation's, a deletion's) and at shutdown. A log opened but not yet
//! switched keeps the HW read at start-up, capped by its log end, so a
//! checkpoint between the open and the switch loses nothing. At start-up
//! the files are read once ([`LogManager::checkpointed_high_watermark`]);
//! the shard switches each replicated log it reopens with that HW
//! (`PartitionLog::start_replicated_at`) rather than with its log end,
//! which may hold batches never replicated. A missing or malformed file
//! (skipped with a warning) leaves the HW at 0 until the leader raises it.

use super::checkpoint::{
    self, LOG_START_CHECKPOINT, RECOVERY_POINT_CHECKPOINT, REPLICATION_OFFSET_CHECKPOINT,
};
use super::iobuf::IoArena;
use super::partition_meta;
use super::recovery::Recovery;
use super::{now_ms, LogConfig, LogError, PartitionLog, TailCache};
use crate::types::{Offset, TopicPartition};
use glommio::sync::Semaphore;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::rc::Rc;

/// Kafka's `log.retention.check.interval.ms`: 5 minutes.
pub const RETENTION_CHECK_INTERVAL_DEFAULT_MS: u64 = 5 * 60 * 1000;
/// Period of the flush.ms / segment.ms checks: 1 s.
pub const BACKGROUND_TICK_MS: u64 = 1000;
/// Kafka's `log.flush.offset.checkpoint.interval.ms`: 60 s.
pub const CHECKPOINT_INTERVAL_MS: u64 = 60_000;
/// Kafka's `replica.high.watermark.checkpoint.interval.ms`: 5 s.
pub const HW_CHECKPOINT_INTERVAL_MS: u64 = 5_000;

/// Owns every partition log of one shard; see the module doc.
pub struct LogManager {
    data_dir: PathBuf,
    shard: usize,
    cache: Rc<TailCache>,
    /// Staging and write buffers of every log of the shard.
    arena: Rc<IoArena>,
    logs: RefCell<HashMap<TopicPartition, Rc<PartitionLog>>>,
    /// The checkpoints read at start-up, for the logs opened after it; a
    /// deleted partition's entries go, so that one re-created under the same
    /// name starts empty.
    recovery_points: RefCell<HashMap<TopicPartition, i64>>,
    log_starts: RefCell<HashMap<TopicPartition, i64>>,
    /// The high watermarks of `replication-offset-checkpoint` read at
    /// start-up (see the module doc).
    high_watermarks: RefCell<HashMap<TopicPartition, i64>>,
    /// What this shard's `replication-offset-checkpoint` was last written
    /// with (`None` before the first write): an unchanged one is not
    /// written again.
    hw_written: RefCell<Option<Vec<(TopicPartition, i64)>>>,
    /// Partitions whose entries in the checkpoint files on disk belong to a
    /// deleted topic of the same name (`open_topic`), until a checkpoint of
    /// this shard holds their open log's offsets.
    stale_checkpoints: RefCell<HashSet<TopicPartition>>,
    retention_check_interval_ms: Cell<u64>,
    stopped: Cell<bool>,
    /// Closed by `shutdown`: cuts the background loop's wait for its next
    /// tick short.
    stop_signal: Semaphore,
    /// The background loop, once started; `shutdown` waits for it.
    background: RefCell<Option<glommio::task::JoinHandle<()>>>,
    /// Set while the background loop runs.
    background_running: Cell<bool>,
    /// See [`LogManager::set_clean_shutdown`].
    clean_shutdown: Cell<bool>,
    /// See [`LogManager::segments_scanned`].
    segments_scanned: Cell<u64>,
    /// Held while checkpoint files are written (see the module doc).
    checkpoint_lock: Semaphore,
    /// Given to each log, which checkpoints through it after a truncation.
    self_weak: std::rc::Weak<LogManager>,
}

impl LogManager {
    /// A manager for the current glommio executor's shard (its id - 1, as
    /// executors are numbered from 1 in creation order); prefer
    /// [`LogManager::new_for_shard`] when the shard index is known.
    pub fn new(data_dir: PathBuf, cache: Rc<TailCache>) -> Rc<LogManager> {
        let shard = glommio::executor().id().saturating_sub(1);
        Self::new_for_shard(data_dir, cache, shard)
    }

    pub fn new_for_shard(data_dir: PathBuf, cache: Rc<TailCache>, shard: usize) -> Rc<LogManager> {
        let recovery_points = checkpoint::read_all(&data_dir, RECOVERY_POINT_CHECKPOINT);
        let log_starts = checkpoint::read_all(&data_dir, LOG_START_CHECKPOINT);
        let high_watermarks = checkpoint::read_all(&data_dir, REPLICATION_OFFSET_CHECKPOINT);
        Rc::new_cyclic(|self_weak| LogManager {
            self_weak: self_weak.clone(),
            data_dir,
            shard,
            cache,
            arena: IoArena::new(),
            logs: RefCell::new(HashMap::new()),
            recovery_points: RefCell::new(recovery_points),
            log_starts: RefCell::new(log_starts),
            high_watermarks: RefCell::new(high_watermarks),
            hw_written: RefCell::new(None),
            stale_checkpoints: RefCell::new(HashSet::new()),
            retention_check_interval_ms: Cell::new(RETENTION_CHECK_INTERVAL_DEFAULT_MS),
            checkpoint_lock: Semaphore::new(1),
            stopped: Cell::new(false),
            stop_signal: Semaphore::new(0),
            background: RefCell::new(None),
            background_running: Cell::new(false),
            clean_shutdown: Cell::new(false),
            segments_scanned: Cell::new(0),
        })
    }

    /// The broker stopped cleanly last time (`server`'s clean-shutdown
    /// marker was found at start): every checkpointed recovery point is its
    /// log's end, so recovery trusts the active segments too. Set before the
    /// first log is opened.
    pub fn set_clean_shutdown(&self, clean: bool) {
        self.clean_shutdown.set(clean);
    }

    /// Segments the logs opened so far had to scan at recovery.
    pub fn segments_scanned(&self) -> u64 {
        self.segments_scanned.get()
    }

    pub fn data_dir(&self) -> &std::path::Path {
        &self.data_dir
    }

    pub fn cache(&self) -> &Rc<TailCache> {
        &self.cache
    }

    /// Bytes this shard's logs have staged and not yet written to their
    /// files (the produce path's `staged_bytes_max` bounds it).
    pub fn unwritten_bytes(&self) -> u64 {
        self.arena.unwritten_bytes()
    }

    /// Resolves once this shard's logs hold fewer than `max_bytes` staged
    /// and unwritten.
    pub async fn wait_unwritten_below(&self, max_bytes: u64) {
        self.arena.wait_unwritten_below(max_bytes).await
    }

    pub fn set_retention_check_interval_ms(&self, ms: u64) {
        self.retention_check_interval_ms.set(ms);
    }

    /// Opens (creating if missing) and recovers `<data_dir>/<topic>-<partition>/`,
    /// whatever topic the directory belongs to (tools and tests; the broker
    /// opens its partitions with [`LogManager::open_topic`]).
    pub async fn open(
        &self,
        tp: &TopicPartition,
        config: LogConfig,
    ) -> Result<Rc<PartitionLog>, LogError> {
        self.open_topic(tp, None, config).await
    }

    /// Opens (creating if missing) and recovers `<data_dir>/<topic>-<partition>/`
    /// as a partition of the topic with id `topic_id` (`partition_meta`): a
    /// directory left by a deleted topic of the same name is removed and the
    /// log starts empty, its checkpointed offsets dropped. When such stale
    /// checkpoint entries existed, this shard's checkpoint files are
    /// rewritten with the new log's offsets before the log is returned (an
    /// error if that fails; the next open tries again): `checkpoint::read_all`
    /// keeps the smallest offset of all shards' files, so after a crash no
    /// old log start can apply to the new topic.
    pub async fn open_topic(
        &self,
        tp: &TopicPartition,
        topic_id: Option<[u8; 16]>,
        config: LogConfig,
    ) -> Result<Rc<PartitionLog>, LogError> {
        if let Some(l) = self.get(tp) {
            l.set_config(config);
            self.checkpoint_if_stale(tp).await?;
            return Ok(l);
        }
        let dir = self.data_dir.join(tp.dir_name());
        if let Some(id) = topic_id {
            let (data_dir, d, sync) = (self.data_dir.clone(), dir.clone(), config.syncs());
            let fresh = glommio::executor()
                .spawn_blocking(move || partition_meta::claim(&data_dir, &d, &id, sync))
                .await
                .map_err(LogError::from_io)?;
            if fresh {
                let rp = self.recovery_points.borrow_mut().remove(tp).is_some();
                let ls = self.log_starts.borrow_mut().remove(tp).is_some();
                let hw = self.high_watermarks.borrow_mut().remove(tp).is_some();
                if rp || ls || hw {
                    tracing::info!(partition = %tp,
                        "dropping checkpointed offsets of a deleted topic of the same name");
                    self.stale_checkpoints.borrow_mut().insert(tp.clone());
                }
            }
        }
        let recovery_point = self.recovery_points.borrow().get(tp).copied();
        let log_start = self.log_starts.borrow().get(tp).copied();
        let log = PartitionLog::open(
            dir,
            tp.clone(),
            config,
            self.cache.clone(),
            self.arena.clone(),
            Recovery {
                point: recovery_point,
                clean_shutdown: self.clean_shutdown.get(),
            },
            log_start,
        )
        .await?;
        self.segments_scanned
            .set(self.segments_scanned.get() + u64::from(log.segments_scanned()));
        self.logs.borrow_mut().insert(tp.clone(), log.clone());
        *log.checkpointer.borrow_mut() = Some(self.self_weak.clone());
        self.checkpoint_if_stale(tp).await?;
        Ok(log)
    }

    /// Writes the checkpoints if this shard's files on disk may still hold
    /// offsets of a deleted topic named like open log `tp`'s.
    async fn checkpoint_if_stale(&self, tp: &TopicPartition) -> Result<(), LogError> {
        if self.stale_checkpoints.borrow().contains(tp) {
            self.checkpoint().await?;
        }
        Ok(())
    }

    /// The high watermark `tp` had in the `replication-offset-checkpoint`
    /// files at start-up (the smallest of all shards' files), if any and if
    /// the partition was not deleted since: where a replicated log
    /// reopened starts its HW (`PartitionLog::start_replicated_at`).
    pub fn checkpointed_high_watermark(&self, tp: &TopicPartition) -> Option<Offset> {
        self.high_watermarks.borrow().get(tp).copied().map(Offset)
    }

    pub fn get(&self, tp: &TopicPartition) -> Option<Rc<PartitionLog>> {
        self.logs.borrow().get(tp).cloned()
    }

    pub fn logs(&self) -> Vec<Rc<PartitionLog>> {
        self.logs.borrow().values().cloned().collect()
    }

    /// Closes and deletes the partition's directory (DeleteTopics).
    pub async fn delete(&self, tp: &TopicPartition) -> Result<(), LogError> {
        let log = self.logs.borrow_mut().remove(tp);
        self.recovery_points.borrow_mut().remove(tp);
        self.log_starts.borrow_mut().remove(tp);
        self.high_watermarks.borrow_mut().remove(tp);
        if let Some(l) = log {
            l.mark_closed();
            // Its writer may be sealing a segment (index files written on the
            // blocking thread): let it finish before the directory goes.
            l.wait_idle().await;
        }
        // Renamed to a `-delete` name first, then removed: a crash never
        // leaves part of it under the live name (`partition_meta`).
        let (data_dir, dir) = (self.data_dir.clone(), self.data_dir.join(tp.dir_name()));
        glommio::executor()
            .spawn_blocking(move || partition_meta::delete_dir(&data_dir, &dir))
            .await?;
        self.checkpoint().await?;
        Ok(())
    }

    /// Writes this shard's recovery-point and log-start checkpoint files,
    /// and its `replication-offset-checkpoint` if it changed.
    pub async fn checkpoint(&self) -> Result<(), LogError> {
        self.write_checkpoints(|l| l.recovery_point()).await
    }

    /// Writes this shard's `replication-offset-checkpoint` if its high
    /// watermarks changed since the last write (the loop's, every
    /// `HW_CHECKPOINT_INTERVAL_MS`). Whether it was written.
    pub async fn checkpoint_high_watermarks(&self) -> Result<bool, LogError> {
        let Ok(_permit) = self.checkpoint_lock.acquire_permit(1).await else {
            return Ok(false);
        };
        let Some(hw) = self.changed_high_watermarks() else {
            return Ok(false);
        };
        let file =
            checkpoint::shard_file(&self.data_dir, REPLICATION_OFFSET_CHECKPOINT, self.shard);
        let entries = hw.clone();
        glommio::executor()
            .spawn_blocking(move || checkpoint::write(&file, &entries))
            .await?;
        *self.hw_written.borrow_mut() = Some(hw);
        Ok(true)
    }

    /// The high watermarks to checkpoint, sorted, if they differ from the
    /// last ones written: each log's in replicated mode; for a log not
    /// switched yet, the one read at start-up (capped by its log end), so
    /// that a checkpoint before the switch keeps it. Logs of neither kind
    /// (single-replica topics) have no entry. Bounded by the open logs.
    fn changed_high_watermarks(&self) -> Option<Vec<(TopicPartition, i64)>> {
        let checkpointed = self.high_watermarks.borrow();
        let mut hw: Vec<(TopicPartition, i64)> = self
            .logs
            .borrow()
            .iter()
            .filter_map(|(tp, l)| {
                if l.is_replicated() {
                    Some((tp.clone(), l.high_watermark().0))
                } else {
                    let at_start = *checkpointed.get(tp)?;
                    Some((tp.clone(), at_start.min(l.log_end_offset().0)))
                }
            })
            .collect();
        hw.sort_by(|a, b| a.0.cmp(&b.0));
        if self.hw_written.borrow().as_ref() == Some(&hw) {
            return None;
        }
        Some(hw)
    }

    /// Writes both checkpoint files, each log's recovery point given by
    /// `recovery_point`, on the blocking thread, one checkpoint at a time;
    /// the offsets are read once the lock is held, so a later checkpoint
    /// never holds older ones.
    async fn write_checkpoints(
        &self,
        recovery_point: impl Fn(&PartitionLog) -> i64,
    ) -> Result<(), LogError> {
        let Ok(_permit) = self.checkpoint_lock.acquire_permit(1).await else {
            // Closed by `shutdown` after its final checkpoint, which nothing
            // may replace.
            return Ok(());
        };
        let mut rp = Vec::new();
        let mut ls = Vec::new();
        for (tp, l) in self.logs.borrow().iter() {
            rp.push((tp.clone(), recovery_point(l)));
            ls.push((tp.clone(), l.log_start_offset().0));
        }
        rp.sort_by(|a, b| a.0.cmp(&b.0));
        ls.sort_by(|a, b| a.0.cmp(&b.0));
        let rp_file = checkpoint::shard_file(&self.data_dir, RECOVERY_POINT_CHECKPOINT, self.shard);
        let ls_file = checkpoint::shard_file(&self.data_dir, LOG_START_CHECKPOINT, self.shard);
        let hw = self.changed_high_watermarks();
        let hw_file =
            checkpoint::shard_file(&self.data_dir, REPLICATION_OFFSET_CHECKPOINT, self.shard);
        let hw_entries = hw.clone();
        // Stale entries these files replace with their open log's offsets.
        let covered: Vec<TopicPartition> = self
            .stale_checkpoints
            .borrow()
            .iter()
            .filter(|tp| rp.iter().any(|(t, _)| t == *tp))
            .cloned()
            .collect();
        glommio::executor()
            .spawn_blocking(move || {
                checkpoint::write(&rp_file, &rp)?;
                checkpoint::write(&ls_file, &ls)?;
                match hw_entries {
                    Some(hw) => checkpoint::write(&hw_file, &hw),
                    None => Ok(()),
                }
            })
            .await?;
        if hw.is_some() {
            *self.hw_written.borrow_mut() = hw;
        }
        let mut stale = self.stale_checkpoints.borrow_mut();
        for tp in &covered {
            stale.remove(tp);
        }
        Ok(())
    }

    /// One retention pass over every log; checkpoints if anything moved.
    pub async fn run_retention_once(&self) -> Result<usize, LogError> {
        let now = now_ms();
        let mut n = 0;
        for l in self.logs() {
            n += l.apply_retention(now)?;
        }
        if n > 0 {
            self.checkpoint().await?;
        }
        Ok(n)
    }

    /// Spawns the background loop into `tq`.
    pub fn start_background(self: &Rc<Self>, tq: glommio::TaskQueueHandle) {
        let me = self.clone();
        let spawned = glommio::spawn_local_into(
            async move {
                let tick = std::time::Duration::from_millis(BACKGROUND_TICK_MS);
                let mut since_retention_ms = 0u64;
                let mut since_checkpoint_ms = 0u64;
                let mut since_hw_checkpoint_ms = 0u64;
                while !me.stopped.get() {
                    // No permit is ever given: this ends when the tick passes
                    // or `shutdown` closes the signal.
                    futures_lite::future::or(glommio::timer::sleep(tick), async {
                        let _ = me.stop_signal.acquire(1).await;
                    })
                    .await;
                    if me.stopped.get() {
                        break;
                    }
                    since_retention_ms += BACKGROUND_TICK_MS;
                    since_checkpoint_ms += BACKGROUND_TICK_MS;
                    since_hw_checkpoint_ms += BACKGROUND_TICK_MS;
                    let now = now_ms();
                    for l in me.logs() {
                        l.maybe_roll_by_time(now);
                        if let Err(e) = l.maybe_flush_by_time(now).await {
                            tracing::error!(partition = %l.topic_partition(), error = %e, "flush.ms flush failed");
                        }
                    }
                    if since_retention_ms >= me.retention_check_interval_ms.get() {
                        since_retention_ms = 0;
                        if let Err(e) = me.run_retention_once().await {
                            tracing::error!(error = %e, "retention pass failed");
                        }
                    }
                    if since_checkpoint_ms >= CHECKPOINT_INTERVAL_MS {
                        since_checkpoint_ms = 0;
                        if let Err(e) = me.checkpoint().await {
                            tracing::error!(error = %e, "checkpoint failed");
                        }
                    }
                    if since_hw_checkpoint_ms >= HW_CHECKPOINT_INTERVAL_MS {
                        since_hw_checkpoint_ms = 0;
                        if let Err(e) = me.checkpoint_high_watermarks().await {
                            tracing::error!(error = %e, "high watermark checkpoint failed");
                        }
                    }
                }
                me.background_running.set(false);
            },
            tq,
        );
        match spawned {
            Ok(t) => {
                self.background_running.set(true);
                *self.background.borrow_mut() = Some(t.detach());
            }
            Err(e) => tracing::error!(error = %e, "could not spawn the log background loop"),
        };
    }

    /// The background loop was started and has not ended yet.
    pub fn background_running(&self) -> bool {
        self.background_running.get()
    }

    /// Flush + checkpoint (high watermarks too) + close every log (clean
    /// shutdown).
    pub async fn shutdown(&self) -> Result<(), LogError> {
        self.stopped.set(true);
        self.stop_signal.close();
        let background = self.background.borrow_mut().take();
        if let Some(loop_task) = background {
            loop_task.await;
        }
        let mut first_err = None;
        let mut unclosed = std::collections::HashSet::new();
        for l in self.logs() {
            if let Err(e) = l.close().await {
                tracing::error!(partition = %l.topic_partition(), error = %e, "close failed");
                unclosed.insert(l.topic_partition().clone());
                first_err.get_or_insert(e);
            }
        }
        // Every log that closed is sealed now: its recovery point is its log
        // end. One that did not keeps its own, so that what it may not have
        // synced is scanned again at the next start.
        let written = self
            .write_checkpoints(|l| {
                if unclosed.contains(l.topic_partition()) {
                    l.recovery_point()
                } else {
                    l.log_end_offset().0
                }
            })
            .await;
        // No checkpoint may follow the final one, written or not: one queued
        // behind it (DeleteTopics') would hold offsets of logs now closed,
        // and after a failed write the files on disk are the older ones,
        // which recovery can trust.
        self.checkpoint_lock.close();
        written?;
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
